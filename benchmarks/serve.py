"""Serving benchmark: specdec serve against llama-server, side by side in one run on the same
files, at 1, 2, 4 and 8 concurrent clients.

Target qwen2.5-coder-1.5b-instruct-q4_k_m, draft qwen2.5-coder-0.5b-instruct.  Configurations:
  specdec-plain          specdec serve -m T
  specdec-model          specdec serve -m T -md D            (draft model)
  specdec-prompt-lookup  specdec serve -m T --draft prompt-lookup
  llama-plain            llama-server -m T
  llama-model            llama-server -m T -md D --draft-max N --draft-min 0 --draft-p-min P
llama-server is the llama.cpp that benchmarks/build_llamacpp.sh builds natively from
llama-cpp-python's sources (its build.json, with the cmake options, goes into the JSON).

For each configuration one server is started with -np = the largest concurrency (-c = -np x
--slot-ctx) and 2 threads, /health is awaited, and a warm-up round (one request of up to 32
tokens, then one 8-token request per client at the largest concurrency at once, so every kernel
path and the batched steps are compiled or loaded before timing) runs and is excluded.
Then for each concurrency C, C client threads each send the same list of chat prompts through
/v1/chat/completions (temperature 0, max_tokens --max-tokens, non-streaming), client k starting
k prompts into the list so the requests in flight differ.  Per request: wall-clock latency
(send to full response, prefill included) and completion tokens from `usage`; per level:
aggregate tok/s = all completion tokens / wall time of the level, and p50/p95 latency.
llama-server requests carry "cache_prompt": false so that neither server reuses a previous
request's KV cache for the repeated prompts (specdec serve keeps none).

`specdec run` at one client: before any server, the same prompts go through the Python API
(Model.generate, the code path of `specdec run`) for plain, draft model and prompt lookup, in
this process, timed the same way (wall time of the call, prefill included): the speed a
single-client speculative server should match.

Greedy answers: every specdec configuration at every concurrency must give the answer of
Model.generate, text for text; for llama-server the JSON says where an answer at C > 1 (or
with -md) differs from its own plain answer at C = 1.

    python benchmarks/serve.py                                   # the full run, ~20 min on 2 cores
    python benchmarks/serve.py --quick --out /tmp/serve-quick    # smoke: 2 prompts, 32 tokens, C 1/2/4
    python benchmarks/serve.py --configs llama-plain llama-model # one engine only
"""
from __future__ import annotations

import argparse
import json
import os
import re
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))   # this checkout's specdec
sys.path.insert(0, str(Path(__file__).parent))
from common import QWEN_DRAFT, QWEN_TARGET, load_prompts, machine_info, write_json  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
CONFIGS = ("specdec-plain", "specdec-model", "specdec-prompt-lookup", "llama-plain", "llama-model")
RUN_CONFIGS = {"specdec-plain": "plain", "specdec-model": "model", "specdec-prompt-lookup": "prompt-lookup"}
CACHE = Path(os.environ.get("SPECDEC_CACHE", Path.home() / ".cache" / "specdec"))


# ---- prompts -------------------------------------------------------------------------------

def chat_messages(prompt: str) -> list[dict]:
    """The ChatML text of benchmarks/prompts back into messages (system, user)."""
    msgs = [{"role": r, "content": c} for r, c in
            re.findall(r"<\|im_start\|>(\w+)\n(.*?)<\|im_end\|>", prompt, re.S)]
    if not msgs or msgs[-1]["role"] != "user":
        raise ValueError("prompt is not a ChatML system/user exchange")
    return msgs


def bench_prompts(n: int) -> list[dict]:
    """n prompts alternating fresh code and code editing (fresh_code first)."""
    sets = [load_prompts("fresh_code"), load_prompts("code_editing")]
    out = []
    for i in range(n):
        s = sets[i % 2]
        if i // 2 < len(s):
            rec = s[i // 2]
            out.append({"id": rec["id"], "kind": rec["kind"], "messages": chat_messages(rec["prompt"])})
    return out


# ---- servers -------------------------------------------------------------------------------

def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def model_path(model_id: str) -> str:
    from specdec.models import hub
    return str(hub.resolve(model_id, download=True, progress=False))


def llama_dir(a) -> Path:
    if a.llama_dir:
        return Path(a.llama_dir)
    script = Path(__file__).parent / "build_llamacpp.sh"
    out = subprocess.run(["bash", str(script), a.llama_version], check=True, capture_output=True,
                         text=True)
    return Path(out.stdout.strip().splitlines()[-1])


def help_text(cmd: list[str], env: dict | None = None, cwd: str | Path = ROOT) -> str:
    try:
        r = subprocess.run(cmd + ["--help"], capture_output=True, text=True, timeout=120, cwd=cwd,
                           env=env)
        return r.stdout + r.stderr
    except (OSError, subprocess.TimeoutExpired):
        return ""


def server_command(config: str, a, port: int, paths: dict) -> list[str]:
    np_ = max(a.concurrency)
    ctx = np_ * a.slot_ctx
    if config.startswith("specdec-"):
        cmd = [sys.executable, "-m", "specdec.frontends.cli", "serve", "-m", paths["target"],
               "--host", "127.0.0.1", "--port", str(port), "-np", str(np_), "-c", str(ctx)]
        if config == "specdec-model":
            cmd += ["-md", paths["draft"], "--draft-n", str(a.draft_n), "--draft-p", str(a.draft_p)]
        elif config == "specdec-prompt-lookup":
            cmd += ["--draft", "prompt-lookup", "--draft-n", str(a.draft_n)]
        if "--threads" in paths["specdec_help"]:
            cmd += ["-t", str(a.threads)]
        if a.no_mmap and "--no-mmap" in paths["specdec_help"]:
            cmd.append("--no-mmap")
        return cmd
    h = paths["llama_help"]
    cmd = [str(paths["llama_dir"] / "bin" / "llama-server"), "-m", paths["target"],
           "--host", "127.0.0.1", "--port", str(port), "-np", str(np_), "-c", str(ctx),
           "-t", str(a.threads), "-tb", str(a.threads)]
    if config == "llama-model":
        cmd += ["-md", paths["draft"]]
        if "--spec-draft-n-max" in h:     # newer llama.cpp: --draft-max/--draft-min removed
            cmd += ["--spec-draft-n-max", str(a.draft_n), "--spec-draft-n-min", "0",
                    "--spec-draft-p-min", str(a.draft_p)]
        if "draft-simple" in h:           # and -md drafts only with --spec-type (default none)
            cmd += ["--spec-type", "draft-simple"]
        else:
            cmd += ["--draft-max", str(a.draft_n), "--draft-min", "0", "--draft-p-min", str(a.draft_p)]
        if "-td" in h or "--threads-draft" in h:
            cmd += ["-td", str(a.threads)]
    if a.no_mmap:
        cmd += ["--load-mode", "none"] if "--load-mode" in h else ["--no-mmap"]
    return cmd


class Server:
    def __init__(self, cmd: list[str], log_path: Path, port: int, env: dict | None = None,
                 cwd: str | Path = ROOT):
        self.cmd, self.log_path, self.port = cmd, log_path, port
        self.url = f"http://127.0.0.1:{port}"
        self.log = open(log_path, "w")
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT, cwd=cwd, env=env)

    def wait_healthy(self, timeout: float) -> float:
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < timeout:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited ({self.proc.returncode}):\n{self.tail()}")
            try:
                r = httpx.get(self.url + "/health", timeout=5)
                if r.status_code == 200:
                    return time.perf_counter() - t0
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        raise RuntimeError(f"server not healthy after {timeout:.0f} s:\n{self.tail()}")

    def tail(self, n: int = 30) -> str:
        self.log.flush()
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


# ---- clients -------------------------------------------------------------------------------

MODEL_ID = {}   # server url -> the model id its /v1/models names


def chat_request(client: httpx.Client, url: str, messages: list[dict], max_tokens: int,
                 llama: bool) -> dict:
    body = {"model": MODEL_ID.get(url, "target"), "messages": messages, "max_tokens": max_tokens, "temperature": 0.0,
            "seed": 0, "stream": False}
    if llama:
        body["cache_prompt"] = False
    t = time.perf_counter()
    r = client.post(url + "/v1/chat/completions", json=body)
    latency = time.perf_counter() - t
    r.raise_for_status()
    data = r.json()
    choice = data["choices"][0]
    usage = data.get("usage") or {}
    out = {"latency_s": round(latency, 4), "completion_tokens": int(usage.get("completion_tokens", 0)),
           "prompt_tokens": int(usage.get("prompt_tokens", 0)),
           "finish_reason": choice.get("finish_reason"), "text": choice["message"].get("content") or ""}
    tm = data.get("timings")
    if isinstance(tm, dict):
        out["timings"] = {k: (round(v, 3) if isinstance(v, float) else v) for k, v in tm.items()
                          if isinstance(v, (int, float))}
    return out


def run_level(url: str, prompts: list[dict], c: int, a, llama: bool, send=None) -> dict:
    """C client threads, each sending every prompt once (client k starting at prompt k);
    send(client, prompt) -> the request's row (default: chat_request)."""
    send = send or (lambda cl, p: chat_request(cl, url, p["messages"], a.max_tokens, llama))
    results: list[list[dict]] = [[] for _ in range(c)]
    errors: list[str] = []
    barrier = threading.Barrier(c + 1)

    def client(k: int) -> None:
        with httpx.Client(timeout=a.request_timeout) as cl:
            barrier.wait()
            for j in range(len(prompts)):
                p = prompts[(k + j) % len(prompts)]
                try:
                    row = send(cl, p)
                except Exception as e:  # noqa: BLE001 - a failed request is recorded, not fatal
                    errors.append(f"client {k} {p['id']}: {e!r}")
                    continue
                row.update(client=k, prompt_id=p["id"])
                results[k].append(row)

    threads = [threading.Thread(target=client, args=(k,), daemon=True) for k in range(c)]
    for t in threads:
        t.start()
    barrier.wait()
    t0 = time.perf_counter()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    rows = [r for rs in results for r in rs]
    lat = np.array([r["latency_s"] for r in rows]) if rows else np.zeros(1)
    n_tok = sum(r["completion_tokens"] for r in rows)
    per_req_tok_s = [r["completion_tokens"] / r["latency_s"] for r in rows if r["latency_s"] > 0]
    return {"concurrency": c, "n_requests": len(rows), "n_errors": len(errors), "errors": errors[:5],
            "wall_s": round(wall, 3), "completion_tokens": n_tok,
            "aggregate_tok_s": round(n_tok / wall, 3) if wall else 0.0,
            "p50_latency_s": round(float(np.percentile(lat, 50)), 3),
            "p95_latency_s": round(float(np.percentile(lat, 95)), 3),
            "mean_request_tok_s": round(float(np.mean(per_req_tok_s)), 3) if per_req_tok_s else 0.0,
            "requests": rows}


def warm_server(url: str, prompts: list[dict], a, llama: bool) -> float:
    """Excluded from the figures: one request of up to 32 tokens, then one 8-token request per client
    at the largest concurrency at once (the batched steps)."""
    t0 = time.perf_counter()
    with httpx.Client(timeout=a.request_timeout) as cl:
        chat_request(cl, url, prompts[0]["messages"], min(a.max_tokens, 32), llama)
    c = max(a.concurrency)

    def one(k: int) -> None:
        with httpx.Client(timeout=a.request_timeout) as cl:
            chat_request(cl, url, prompts[k % len(prompts)]["messages"], 8, llama)
    ts = [threading.Thread(target=one, args=(k,)) for k in range(c)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    return time.perf_counter() - t0


# ---- `specdec run` at one client -----------------------------------------------------------

def run_api(prompts: list[dict], a, configs: list[str]) -> dict:
    """Model.generate (the path of `specdec run`) on the same prompts, one after another."""
    import specdec
    from common import warm_up
    mmap = not a.no_mmap
    target = specdec.load(QWEN_TARGET, n_ctx=a.slot_ctx, mmap=mmap)
    draft = specdec.load(QWEN_DRAFT, n_ctx=a.slot_ctx, mmap=mmap) if "model" in configs else None
    warm_s = warm_up(*[m for m in (target, draft) if m is not None])
    out: dict = {"warmup_s": round(warm_s, 2)}
    for c in configs:
        kw = {}
        if c == "model":
            kw = dict(draft=draft, draft_n=a.draft_n, draft_p=a.draft_p)
        elif c == "prompt-lookup":
            kw = dict(draft="prompt-lookup", draft_n=a.draft_n)
        # one untimed short call per configuration: its drafter's paths compiled too
        target.generate(target.chat_prompt(prompts[0]["messages"]), n_predict=8, temperature=0.0, **kw)
        rows, t_all, n_all = [], 0.0, 0
        for p in prompts:
            text = target.chat_prompt(p["messages"])
            t = time.perf_counter()
            res = target.generate(text, n_predict=a.max_tokens, temperature=0.0, **kw)
            wall = time.perf_counter() - t
            n = len(res.ids)
            t_all += wall
            n_all += n
            rows.append({"prompt_id": p["id"], "latency_s": round(wall, 4), "completion_tokens": n,
                         "decode_tok_s": round(res.timings.tokens_per_s, 3), "text": res.text})
            print(f"  run {c:14s} {p['id']:20s} {n:4d} tok {wall:6.2f} s", flush=True)
        out[c] = {"tok_s": round(n_all / t_all, 3) if t_all else 0.0, "completion_tokens": n_all,
                  "wall_s": round(t_all, 3), "requests": rows}
    del target, draft
    return out


# ---- comparisons ---------------------------------------------------------------------------

def answers_of(level: dict) -> dict[str, set[str]]:
    by: dict[str, set[str]] = {}
    for r in level["requests"]:
        by.setdefault(r["prompt_id"], set()).add(r["text"])
    return by


def greedy_checks(results: dict, run: dict | None) -> dict:
    out: dict = {}
    # specdec: every configuration, every concurrency, against Model.generate's plain answer
    ref = {r["prompt_id"]: r["text"] for r in run["plain"]["requests"]} if run and "plain" in run else None
    spec = {c: r for c, r in results.items() if c.startswith("specdec-") and "levels" in r}
    if spec:
        if ref is None:   # no API run: the first specdec configuration at C=1
            first = next(iter(spec.values()))["levels"][0]
            ref = {pid: sorted(t)[0] for pid, t in answers_of(first).items()}
        diffs = []
        for c, r in spec.items():
            for lv in r["levels"]:
                for pid, texts in answers_of(lv).items():
                    if texts != {ref.get(pid)}:
                        diffs.append({"config": c, "concurrency": lv["concurrency"], "prompt_id": pid,
                                      "n_distinct": len(texts)})
        if run:
            for c, r in run.items():
                if isinstance(r, dict) and "requests" in r:
                    for row in r["requests"]:
                        if row["text"] != ref.get(row["prompt_id"]):
                            diffs.append({"config": f"run-{c}", "concurrency": 1,
                                          "prompt_id": row["prompt_id"]})
        out["specdec"] = {"reference": "Model.generate plain" if run and "plain" in run
                          else "first specdec configuration at C=1",
                          "identical": not diffs, "differences": diffs}
    # llama-server: against its own plain answer at C=1
    ll = {c: r for c, r in results.items() if c.startswith("llama-") and "levels" in r}
    if ll:
        base_cfg = "llama-plain" if "llama-plain" in ll else next(iter(ll))
        base = {pid: sorted(t)[0] for pid, t in answers_of(ll[base_cfg]["levels"][0]).items()}
        diffs = []
        for c, r in ll.items():
            for lv in r["levels"]:
                for pid, texts in answers_of(lv).items():
                    if texts != {base.get(pid)}:
                        diffs.append({"config": c, "concurrency": lv["concurrency"], "prompt_id": pid,
                                      "n_distinct": len(texts),
                                      "first_difference_at_char": first_diff(base.get(pid) or "",
                                                                             sorted(texts - {base.get(pid)})[0])})
        out["llama"] = {"reference": f"{base_cfg} at C=1", "identical": not diffs, "differences": diffs}
        if ref is not None:
            out["llama_vs_specdec_at_c1"] = {
                pid: (t == ref.get(pid)) for pid, t in base.items()}
    return out


def first_diff(x: str, y: str) -> int:
    for i, (p, q) in enumerate(zip(x, y)):
        if p != q:
            return i
    return min(len(x), len(y))


def goals(results: dict, run: dict | None) -> dict:
    def agg(c: str, conc: int):
        for lv in results.get(c, {}).get("levels", []):
            if lv["concurrency"] == conc:
                return lv["aggregate_tok_s"]
        return None
    out: dict = {"scaling_4_over_1": {}, "serve_c1_over_run": {}, "specdec_over_llama": {}}
    for c in results:
        a1, a4 = agg(c, 1), agg(c, 4)
        if a1 and a4:
            out["scaling_4_over_1"][c] = round(a4 / a1, 3)
    if run:
        for c, rc in RUN_CONFIGS.items():
            a1 = agg(c, 1)
            if a1 and rc in run and run[rc]["tok_s"]:
                out["serve_c1_over_run"][c] = round(a1 / run[rc]["tok_s"], 3)
    levels = sorted({lv["concurrency"] for r in results.values() for lv in r.get("levels", [])})
    for conc in levels:
        spec = {c: agg(c, conc) for c in results if c.startswith("specdec-") and agg(c, conc)}
        ll = {c: agg(c, conc) for c in results if c.startswith("llama-") and agg(c, conc)}
        if spec and ll:
            bs, bl = max(spec, key=spec.get), max(ll, key=ll.get)
            out["specdec_over_llama"][str(conc)] = {"best_specdec": bs, "best_llama": bl,
                                                    "ratio": round(spec[bs] / ll[bl], 3)}
    return out


# ---- output --------------------------------------------------------------------------------

def plot(result: dict, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    for c, r in result["results"].items():
        lv = r.get("levels")
        if not lv:
            continue
        xs = [x["concurrency"] for x in lv]
        style = "-" if c.startswith("specdec-") else "--"
        axes[0].plot(xs, [x["aggregate_tok_s"] for x in lv], style, marker="o", label=c)
        axes[1].plot(xs, [x["p50_latency_s"] for x in lv], style, marker="o", label=c)
        axes[2].plot(xs, [x["p95_latency_s"] for x in lv], style, marker="o", label=c)
    run = result.get("specdec_run") or {}
    for rc, m in (("plain", "x"), ("model", "^"), ("prompt-lookup", "s")):
        if rc in run:
            axes[0].plot([1], [run[rc]["tok_s"]], m, color="black", label=f"specdec run {rc}")
    for ax, title in zip(axes, ("aggregate tokens/s", "p50 request latency (s)", "p95 request latency (s)")):
        ax.set_xscale("log", base=2)
        ax.set_xticks(result["settings"]["concurrency"])
        ax.set_xticklabels([str(c) for c in result["settings"]["concurrency"]])
        ax.set_xlabel("concurrent clients")
        ax.set_title(title)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7)
    s = result["settings"]
    fig.suptitle(f"serving {QWEN_TARGET} (draft {QWEN_DRAFT}), max_tokens {s['max_tokens']}, "
                 f"{result['machine']['cpu']}, {result['machine']['cores']} cores")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def print_table(result: dict) -> None:
    res = result["results"]
    concs = result["settings"]["concurrency"]
    print(f"\n{'config':24s} " + " ".join(f"{'C=' + str(c):>20s}" for c in concs))
    print(f"{'':24s} " + " ".join(f"{'tok/s p50/p95 s':>20s}" for _ in concs))
    for c, r in res.items():
        if "levels" not in r:
            print(f"{c:24s} {r.get('error', '')[:100]}")
            continue
        cells = {lv["concurrency"]:
                 f"{lv['aggregate_tok_s']:6.2f} {lv['p50_latency_s']:5.1f}/{lv['p95_latency_s']:5.1f}"
                 for lv in r["levels"]}
        print(f"{c:24s} " + " ".join(f"{cells.get(k, '-'):>20s}" for k in concs))
    for rc, m in (result.get("specdec_run") or {}).items():
        if isinstance(m, dict) and "tok_s" in m:
            print(f"{'run ' + rc:24s} {m['tok_s']:6.2f} tok/s (Model.generate, one client)")
    print(json.dumps(result["goals"], indent=1))
    print(json.dumps({k: {kk: vv for kk, vv in v.items() if kk != "differences"} | {
        "n_differences": len(v.get("differences", []))} if isinstance(v, dict) and "identical" in v else v
        for k, v in result["greedy"].items()}, indent=1))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--configs", nargs="+", default=list(CONFIGS), choices=CONFIGS)
    ap.add_argument("--concurrency", nargs="+", type=int, default=[1, 2, 4, 8])
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--prompts", type=int, default=4, help="prompts per client, alternating fresh "
                    "code and code editing (default 4)")
    ap.add_argument("--draft-n", type=int, default=8, help="longest draft (llama-server --draft-max)")
    ap.add_argument("--draft-p", type=float, default=0.9, help="draft-model confidence floor "
                    "(llama-server --draft-p-min)")
    ap.add_argument("--threads", type=int, default=2, help="llama-server -t/-tb (specdec: Numba threads)")
    ap.add_argument("--slot-ctx", type=int, default=1024, help="context per slot (-c = -np x this)")
    ap.add_argument("--no-mmap", action=argparse.BooleanOptionalAction, default=True,
                    help="read the weights into memory, both engines (default on, as the other benchmarks)")
    ap.add_argument("--no-run", action="store_true", help="skip the Model.generate (specdec run) baseline")
    ap.add_argument("--llama-dir", default=None, help="folder with bin/llama-server and build.json "
                    "(default: benchmarks/build_llamacpp.sh's, built on first use)")
    ap.add_argument("--llama-version", default="0.3.36", help="llama-cpp-python sdist to build from")
    ap.add_argument("--specdec-root", default=str(ROOT), help="source tree `specdec serve` runs from "
                    "(default: this checkout; e.g. an export of a branch not merged yet)")
    ap.add_argument("--specdec-commit", default=None, help="commit of --specdec-root, recorded "
                    "(default: git rev-parse HEAD there)")
    ap.add_argument("--startup-timeout", type=float, default=600)
    ap.add_argument("--request-timeout", type=float, default=900)
    ap.add_argument("--quick", action="store_true", help="2 prompts, 32 tokens, concurrency 1 2 4")
    ap.add_argument("--out", default=str(Path(__file__).parent / "results"))
    ap.add_argument("--merge", nargs="+", default=None, metavar="SERVE.json",
                    help="no measuring: combine the configurations of earlier runs' serve.json "
                         "(the first file's machine and settings; each part's date kept) into --out")
    a = ap.parse_args()
    if a.merge:
        return merge(a.merge, Path(a.out))
    if a.quick:
        a.prompts, a.max_tokens, a.concurrency = 2, 32, [c for c in a.concurrency if c <= 4]
    a.concurrency = sorted(set(a.concurrency))
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    logs = out / "serve-logs" if a.out != str(Path(__file__).parent / "results") else Path("/tmp/specdec-serve-logs")
    logs.mkdir(parents=True, exist_ok=True)
    prompts = bench_prompts(a.prompts)
    paths = {"target": model_path(QWEN_TARGET), "draft": model_path(QWEN_DRAFT)}
    env = dict(os.environ, PYTHONPATH=a.specdec_root + os.pathsep + os.environ.get("PYTHONPATH", ""))
    build = None
    if any(c.startswith("llama-") for c in a.configs):
        paths["llama_dir"] = llama_dir(a)
        paths["llama_help"] = help_text([str(paths["llama_dir"] / "bin" / "llama-server")])
        try:
            build = json.loads((paths["llama_dir"] / "build.json").read_text())
            build.pop("cpu_flags", None)   # the machine section has them
        except OSError:
            build = None
    if any(c.startswith("specdec-") for c in a.configs):
        paths["specdec_help"] = help_text([sys.executable, "-m", "specdec.frontends.cli", "serve"], env,
                                          a.specdec_root)
    t_start = time.perf_counter()
    load_start = os.getloadavg()

    run = None
    run_cfgs = [RUN_CONFIGS[c] for c in a.configs if c in RUN_CONFIGS]
    if run_cfgs and not a.no_run and 1 in a.concurrency:
        print("specdec run (Model.generate), one client:", flush=True)
        run = run_api(prompts, a, run_cfgs)

    results: dict = {}
    for c in a.configs:
        port = free_port()
        cmd = server_command(c, a, port, paths)
        print(f"\n== {c}: {' '.join(cmd)}", flush=True)
        srv = Server(cmd, logs / f"{c}.log", port, env=env,
                     cwd=a.specdec_root if c.startswith("specdec-") else ROOT)
        try:
            up = srv.wait_healthy(a.startup_timeout)
            MODEL_ID[srv.url] = httpx.get(srv.url + "/v1/models", timeout=30).json()["data"][0]["id"]
            w = warm_server(srv.url, prompts, a, c.startswith("llama-"))
            print(f"   healthy after {up:.1f} s, warm-up {w:.1f} s (excluded)", flush=True)
            levels = []
            for conc in a.concurrency:
                lv = run_level(srv.url, prompts, conc, a, c.startswith("llama-"))
                levels.append(lv)
                print(f"   C={conc}: {lv['aggregate_tok_s']:7.2f} tok/s  p50 {lv['p50_latency_s']:6.2f} s  "
                      f"p95 {lv['p95_latency_s']:6.2f} s  ({lv['completion_tokens']} tok in "
                      f"{lv['wall_s']:.1f} s, {lv['n_errors']} errors)", flush=True)
            results[c] = {"command": cmd, "startup_s": round(up, 2), "warmup_s": round(w, 2),
                          "levels": levels}
        except Exception as e:  # noqa: BLE001 - one configuration failing leaves the others
            print(f"   failed: {e}", flush=True)
            results[c] = {"command": cmd, "error": str(e)[-2000:]}
        finally:
            srv.stop()

    machine = machine_info()
    result = {
        "machine": machine, "target": QWEN_TARGET, "draft": QWEN_DRAFT,
        "llama_cpp_build": build,
        "specdec_source": {"root": a.specdec_root,
                           "commit": a.specdec_commit or git_commit(a.specdec_root)},
        "settings": {"quick": a.quick, "configs": a.configs, "concurrency": a.concurrency, "max_tokens": a.max_tokens,
                     "prompts": [p["id"] for p in prompts], "draft_n": a.draft_n, "draft_p": a.draft_p,
                     "threads": a.threads, "n_parallel": max(a.concurrency),
                     "ctx": max(a.concurrency) * a.slot_ctx, "no_mmap": a.no_mmap,
                     "temperature": 0.0, "stream": False, "endpoint": "/v1/chat/completions"},
        "method": ("one server per configuration with -np = the largest concurrency; warm-up (one "
                   "32-token request, then one 8-token request per client at the largest "
                   "concurrency) excluded; C client threads each send every prompt once, client k "
                   "starting at prompt k; aggregate tok/s = completion tokens (usage) / wall time "
                   "of the level; latency = send to full response, prefill included; llama-server "
                   "requests with cache_prompt false; specdec_run: Model.generate, one call per "
                   "prompt, wall time (prefill included)"),
        "specdec_run": run, "results": results,
        "wall_s": round(time.perf_counter() - t_start, 1),
        "load_avg_start": [round(x, 2) for x in load_start],
        "load_avg_end": [round(x, 2) for x in os.getloadavg()]}
    result["goals"] = goals(results, run)
    result["greedy"] = greedy_checks(results, run)
    write_json(out / "serve.json", result)
    plot(result, out / "serve.png")
    print_table(result)
    print(f"wrote {out / 'serve.json'} and {out / 'serve.png'}")


def merge(files: list[str], out: Path) -> None:
    parts = [json.loads(Path(f).read_text()) for f in files]
    result = dict(parts[0])
    result["results"], result["specdec_run"], result["parts"] = {}, None, []
    for f, p in zip(files, parts):
        result["results"].update(p["results"])
        result["specdec_run"] = result["specdec_run"] or p.get("specdec_run")
        result["llama_cpp_build"] = result.get("llama_cpp_build") or p.get("llama_cpp_build")
        result["parts"].append({"file": Path(f).name, "date": p["machine"]["date"],
                                "configs": list(p["results"]), "wall_s": p.get("wall_s"),
                                "load_avg_start": p.get("load_avg_start")})
    for r in result["results"].values():   # the anchor's build.json as it is now (fields fixed since)
        if Path(r.get("command", [""])[0]).name == "llama-server":
            try:
                build = json.loads((Path(r["command"][0]).parent.parent / "build.json").read_text())
                build.pop("cpu_flags", None)
                result["llama_cpp_build"] = build
            except OSError:
                pass
    result["settings"] = dict(result["settings"], configs=list(result["results"]))
    result["goals"] = goals(result["results"], result["specdec_run"])
    result["greedy"] = greedy_checks(result["results"], result["specdec_run"])
    out.mkdir(parents=True, exist_ok=True)
    write_json(out / "serve.json", result)
    plot(result, out / "serve.png")
    print_table(result)
    print(f"wrote {out / 'serve.json'} and {out / 'serve.png'} (merged from {len(files)} runs)")


def git_commit(root: str) -> str | None:
    try:
        r = subprocess.run(["git", "-C", root, "rev-parse", "HEAD"], capture_output=True, text=True)
        return r.stdout.strip() or None
    except OSError:
        return None


if __name__ == "__main__":
    main()
