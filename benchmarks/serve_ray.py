"""Serving on one machine as 2 Ray Serve replicas x 1 thread against 1 `specdec serve` x 2 threads.

Configurations (the same model, prompts and total slots):
  ray-2x1     specdec serve -m M --ray-replicas 2 -t 1 -np P      (a local Ray, 2 replicas)
  serve-1x2   specdec serve -m M -t 2 -np 2P
Each server is started as its own process tree, /health awaited, warmed up as in
benchmarks/serve.py (excluded); then for each concurrency C, C client threads each send every
prompt once through /v1/chat/completions (temperature 0, non-streamed), client k starting at
prompt k.  Per level: aggregate tokens/s (completion tokens / wall time), p50 / p95 latency
(send to full response), and for Ray the requests and tokens each replica served (header
X-Specdec-Replica).  Memory: a sampler reads RSS and PSS (/proc/PID/smaps_rollup) of every
process of the server's tree every 0.5 s; the JSON keeps the peaks of the replicas (each),
of the plain server, and of Ray's own processes (driver, GCS, raylet, agents, proxy,
controller).  Every answer of one configuration must equal the other's (the invariance
across replicas), and the JSON carries the per-replica figures and the N-machine projection
of docs/serve.md ("Measured: 2 replicas x 1 thread ...").

    python benchmarks/serve_ray.py                                  # the real run (Qwen 1.5B)
    python benchmarks/serve_ray.py --quick --model smollm2-135m-instruct-q4_1 --out /tmp/serve-ray
"""
from __future__ import annotations

import argparse
import os
import sys
import threading
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))   # this checkout's specdec
sys.path.insert(0, str(Path(__file__).parent))
from common import QWEN_TARGET, machine_info, write_json  # noqa: E402
from serve import Server, bench_prompts, free_port, model_path, run_level  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
CONFIGS = ("ray-2x1", "serve-1x2")
REPLICA_HEADER = "x-specdec-replica"


def command(config: str, a, port: int, path: str) -> list[str]:
    cmd = [sys.executable, "-m", "specdec.frontends.cli", "serve", "-m", path, "--host", "127.0.0.1",
           "--port", str(port), "-c", str(a.slot_ctx)]
    if config == "ray-2x1":
        return cmd + ["--ray-replicas", "2", "-t", "1", "-np", str(a.parallel)]
    return cmd + ["-t", "2", "-np", str(2 * a.parallel)]


# ---- memory --------------------------------------------------------------------------------

def tree(pid: int) -> list[int]:
    """pid and every process below it (from /proc)."""
    children: dict[int, list[int]] = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                ppid = int(Path(f"/proc/{d}/stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(d))
    out, todo = [pid], [pid]
    while todo:
        for c in children.get(todo.pop(), ()):
            out.append(c)
            todo.append(c)
    return out


def kind(pid: int, root: int) -> str | None:
    """'replica', 'server' (the command started: the plain server, or Ray's driver) or 'ray'
    (Ray's own processes)."""
    try:
        title = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].decode(errors="replace")
    except OSError:
        return None
    if title.startswith("ray::ServeReplica"):
        return "replica"
    return "server" if pid == root else "ray"


def mem_kb(pid: int) -> tuple[int, int]:
    """(RSS, PSS) in kB from /proc/PID/smaps_rollup (0, 0 when gone)."""
    rss = pss = 0
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Rss:"):
                rss = int(line.split()[1])
            elif line.startswith("Pss:"):
                pss = int(line.split()[1])
    except (OSError, ValueError):
        pass
    return rss, pss


class MemorySampler:
    """Peak RSS / PSS per process of a server's tree, by kind, sampled every `period` s."""

    def __init__(self, root: int, period: float = 0.5):
        self.root, self.period, self.stop = root, period, threading.Event()
        self.peak: dict[int, dict] = {}
        self.total_peak = {"rss_mb": 0.0, "pss_mb": 0.0}
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def run(self) -> None:
        while not self.stop.wait(self.period):
            rss_t = pss_t = 0
            for pid in tree(self.root):
                k = kind(pid, self.root)
                if k is None:
                    continue
                rss, pss = mem_kb(pid)
                rss_t, pss_t = rss_t + rss, pss_t + pss
                p = self.peak.setdefault(pid, {"kind": k, "rss_mb": 0.0, "pss_mb": 0.0})
                if k == "replica":          # a Ray worker takes its replica title once assigned
                    p["kind"] = k
                p["rss_mb"], p["pss_mb"] = max(p["rss_mb"], rss / 1024), max(p["pss_mb"], pss / 1024)
            self.total_peak["rss_mb"] = max(self.total_peak["rss_mb"], rss_t / 1024)
            self.total_peak["pss_mb"] = max(self.total_peak["pss_mb"], pss_t / 1024)

    def summary(self) -> dict:
        self.stop.set()
        self.thread.join()
        by: dict = {}
        for p in self.peak.values():
            b = by.setdefault(p["kind"], {"n_processes": 0, "rss_mb": 0.0, "pss_mb": 0.0, "each_pss_mb": []})
            b["n_processes"] += 1
            b["rss_mb"] += p["rss_mb"]
            b["pss_mb"] += p["pss_mb"]
            b["each_pss_mb"].append(round(p["pss_mb"], 1))
        for b in by.values():
            b["rss_mb"], b["pss_mb"] = round(b["rss_mb"], 1), round(b["pss_mb"], 1)
        return {"by_kind_peak_sum": by, "tree_peak": {k: round(v, 1) for k, v in self.total_peak.items()}}


# ---- clients -------------------------------------------------------------------------------

def request(cl: httpx.Client, url: str, messages: list[dict], max_tokens: int) -> dict:
    body = {"messages": messages, "max_tokens": max_tokens, "temperature": 0.0, "seed": 0}
    t = time.perf_counter()
    r = cl.post(url + "/v1/chat/completions", json=body)
    latency = time.perf_counter() - t
    r.raise_for_status()
    data = r.json()
    return {"latency_s": round(latency, 4), "completion_tokens": int(data["usage"]["completion_tokens"]),
            "replica": r.headers.get(REPLICA_HEADER), "text": data["choices"][0]["message"]["content"]}


def level(url: str, prompts: list[dict], c: int, a) -> dict:
    """benchmarks/serve.py's run_level (C clients, each sending every prompt once), plus the
    requests and tokens each replica served."""
    out = run_level(url, prompts, c, a, False, send=lambda cl, p: request(cl, url, p["messages"], a.max_tokens))
    by_replica: dict = {}
    for r in out["requests"]:
        b = by_replica.setdefault(r["replica"] or "-", {"requests": 0, "tokens": 0})
        b["requests"] += 1
        b["tokens"] += r["completion_tokens"]
    out["by_replica"] = by_replica
    return out


def measure(config: str, a, path: str, prompts: list[dict], logs: Path) -> dict:
    port = free_port()
    cmd = command(config, a, port, path)
    print(f"\n== {config}: {' '.join(cmd)}", flush=True)
    srv = Server(cmd, logs / f"{config}.log", port, env=dict(os.environ), cwd=ROOT)
    sampler = MemorySampler(srv.proc.pid)
    try:
        up = srv.wait_healthy(a.startup_timeout)
        with httpx.Client(timeout=a.request_timeout) as cl:          # warm-up, excluded
            request(cl, srv.url, prompts[0]["messages"], min(a.max_tokens, 32))
        def warm(k: int) -> None:
            with httpx.Client(timeout=a.request_timeout) as cl:
                request(cl, srv.url, prompts[k % len(prompts)]["messages"], 8)
        ws = [threading.Thread(target=warm, args=(k,)) for k in range(max(a.concurrency))]
        for t in ws:
            t.start()
        for t in ws:
            t.join()
        levels = []
        for c in a.concurrency:
            lv = level(srv.url, prompts, c, a)
            levels.append(lv)
            print(f"   C={c}: {lv['aggregate_tok_s']:7.2f} tok/s  p50 {lv['p50_latency_s']:6.2f} s  "
                  f"p95 {lv['p95_latency_s']:6.2f} s  ({lv['n_errors']} errors; by replica "
                  f"{ {k[:8]: v['requests'] for k, v in lv['by_replica'].items()} })", flush=True)
        return {"command": cmd, "startup_s": round(up, 2), "levels": levels, "memory": sampler.summary()}
    finally:
        srv.stop()
        if not sampler.stop.is_set():
            sampler.summary()
        deadline = time.monotonic() + 30
        while (left := [p for p in sampler.peak if Path(f"/proc/{p}").exists()]) and time.monotonic() < deadline:
            time.sleep(0.5)
        if left:
            print(f"   warning: processes left after the stop: {left}", flush=True)


def projection(results: dict, top: int) -> dict:
    """docs/serve.md's arithmetic: per-replica figures and T(N) = N * k * r for k = 2 replicas."""
    def agg(c):
        lv = [x for x in results.get(c, {}).get("levels", []) if x["concurrency"] == top]
        return lv[0]["aggregate_tok_s"] if lv else None
    r2, s = agg("ray-2x1"), agg("serve-1x2")
    if not r2:
        return {}
    rep = results["ray-2x1"]["memory"]["by_kind_peak_sum"]
    m = max(rep.get("replica", {}).get("each_pss_mb", [0]))
    m_ray = rep.get("ray", {}).get("pss_mb", 0.0) + rep.get("server", {}).get("pss_mb", 0.0)
    out = {"at_concurrency": top, "r_tok_s_per_replica": round(r2 / 2, 3), "s_tok_s_per_server": s,
           "m_replica_pss_mb": m, "m_ray_pss_mb": round(m_ray, 1),
           "T_N": {n: round(n * r2, 2) for n in (1, 2, 4, 8, 16)}}
    if s:
        out["plain_N"] = {n: round(n * s, 2) for n in (1, 2, 4, 8, 16)}
        out["ray_over_plain"] = round(r2 / s, 3)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=QWEN_TARGET)
    ap.add_argument("--configs", nargs="+", default=list(CONFIGS), choices=CONFIGS)
    ap.add_argument("--concurrency", nargs="+", type=int, default=[1, 2, 4, 8])
    ap.add_argument("--parallel", type=int, default=4, help="-np of each replica (the server: 2x)")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--prompts", type=int, default=2, help="prompts per client (benchmarks/serve.py's)")
    ap.add_argument("--slot-ctx", type=int, default=1024, help="-c: context per slot")
    ap.add_argument("--startup-timeout", type=float, default=600)
    ap.add_argument("--request-timeout", type=float, default=900)
    ap.add_argument("--quick", action="store_true", help="2 prompts, 16 tokens, concurrency 1 and 4")
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "intel"))
    a = ap.parse_args()
    if a.quick:
        a.prompts, a.max_tokens, a.concurrency = 2, 16, [1, 4]
    a.concurrency = sorted(set(a.concurrency))
    out = Path(a.out)
    logs = out / "serve-ray-logs"
    logs.mkdir(parents=True, exist_ok=True)
    prompts = bench_prompts(a.prompts)
    path = model_path(a.model)
    t0, load_start = time.perf_counter(), os.getloadavg()
    results: dict = {}
    for c in a.configs:
        try:
            results[c] = measure(c, a, path, prompts, logs)
        except Exception as e:  # noqa: BLE001 - one configuration failing leaves the other
            print(f"   failed: {e}", flush=True)
            results[c] = {"command": command(c, a, 0, path), "error": str(e)[-2000:]}
    answers = {c: {(r["prompt_id"], r["text"]) for lv in res.get("levels", []) for r in lv["requests"]}
               for c, res in results.items()}
    texts = {c: {} for c in answers}
    for c, pairs in answers.items():
        for pid, text in pairs:
            texts[c].setdefault(pid, set()).add(text)
    same = len({frozenset((k, frozenset(v)) for k, v in t.items()) for t in texts.values()}) == 1
    result = {"machine": machine_info(), "model": a.model,
              "settings": {"quick": a.quick, "configs": a.configs, "concurrency": a.concurrency,
                           "max_tokens": a.max_tokens, "prompts": [p["id"] for p in prompts],
                           "parallel_per_replica": a.parallel, "slot_ctx": a.slot_ctx,
                           "temperature": 0.0, "endpoint": "/v1/chat/completions"},
              "results": results,
              "identical_answers": same and all(len(v) == 1 for t in texts.values() for v in t.values()),
              "projection": projection(results, max(a.concurrency)),
              "wall_s": round(time.perf_counter() - t0, 1),
              "load_avg_start": [round(x, 2) for x in load_start],
              "load_avg_end": [round(x, 2) for x in os.getloadavg()]}
    write_json(out / "serve_ray.json", result)
    print(f"\nidentical answers: {result['identical_answers']}; projection: {result['projection']}")
    print(f"wrote {out / 'serve_ray.json'}")


if __name__ == "__main__":
    main()
