"""Spec-Bench on the CPU: every drafter on the field's standard question set, beside llama.cpp.

Spec-Bench (Xia et al., ACL 2024 Findings; ../shared/data/spec-bench, Apache-2.0): 480
questions in six groups — mt_bench (MT-bench's 80, two turns), translation, summarization, qa,
math_reasoning, rag.  --per-category N takes a fixed seeded subset of each group.  Every
question goes through the target's chat template, greedy, at most --max-tokens new tokens per
turn; MT-bench's second turn follows the first answer in the same conversation (KV cache kept).

Methods (--methods, comma-separated), all in the same run on the same prompts:
  plain            the target alone (the baseline of every speedup)
  model            the draft model, threshold policy with the seed's flags (n 5, p 0.9)
  prompt-lookup    n-grams of the context
  suffix           the suffix store, warmed only by the run's earlier questions, in order
  hybrid           lookup where it matches, the model elsewhere
  defaults         draft= the draft model, no flags (specdec's defaults)
  tree             the draft model with token trees, K = 2
  llama-plain      llama-server -m T (llama.cpp's own baseline)
  llama-speculative  llama-server -m T -md D, draft 5, p-min 0.9
  llama-lookup     llama-server -m T --spec-type ngram-cache
The llama-* methods need the native build of benchmarks/build_llamacpp.sh (skipped otherwise).

Metrics per group and overall: speedup over plain (the same engine's plain: specdec's for
specdec, llama-plain for llama.cpp) on the wall time of whole requests (prefill included) and
on decoding alone; tau = tokens per target pass; acceptance; tokens/s; whether every output
equals plain's.  JSON (with the machine record) and a PNG in Spec-Bench's style into --out.

    python benchmarks/specbench.py [--per-category 2] [--max-tokens 128] [--methods ...] [--out DIR]
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from collections import defaultdict
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import QWEN_DRAFT, QWEN_TARGET, machine_info, write_json  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT.parent / "shared" / "data" / "spec-bench" / "question.jsonl"
GROUPS = ("mt_bench", "translation", "summarization", "qa", "math_reasoning", "rag")
MT_BENCH = {"writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem", "humanities"}
SPECDEC = ("plain", "model", "prompt-lookup", "suffix", "hybrid", "defaults", "tree")
LLAMA = ("llama-plain", "llama-speculative", "llama-lookup")


def group_of(category: str) -> str:
    return "mt_bench" if category in MT_BENCH else category


def questions(path: Path, per_category: int, seed: int) -> list[dict]:
    """A fixed seeded subset of per_category questions per group, in question_id order."""
    by_group = defaultdict(list)
    for line in path.read_text().splitlines():
        q = json.loads(line)
        by_group[group_of(q["category"])].append(q)
    rng = np.random.default_rng(seed)
    out = []
    for g in GROUPS:
        qs = sorted(by_group[g], key=lambda q: q["question_id"])
        pick = sorted(rng.choice(len(qs), size=min(per_category, len(qs)), replace=False))
        out += [{**qs[i], "group": g} for i in pick]
    return out


# ---- specdec ----------------------------------------------------------------------------------

def specdec_options(method: str, draft, store):
    from specdec import DraftOptions
    return {"plain": None,
            "model": DraftOptions(kind="model", model=draft, n=5, p=0.9, policy="threshold"),
            "prompt-lookup": DraftOptions(kind="prompt-lookup"),
            "suffix": DraftOptions(kind="suffix", suffix_store=store),
            "hybrid": DraftOptions(kind="hybrid", model=draft),
            "defaults": draft,
            "tree": DraftOptions(kind="model", model=draft, n=5, p=0.9, policy="threshold", tree=2)}[method]


def run_specdec(method: str, target, draft, qs: list[dict], max_tokens: int) -> list[dict]:
    import specdec
    store = specdec.SuffixStore() if method == "suffix" else None
    # untimed: the method's passes once (the draft's kernels, the verification paths: their
    # first calls compile or load machine code), with a store of its own
    warm = specdec.SuffixStore() if method == "suffix" else None
    specdec.Conversation(target, draft=specdec_options(method, draft, warm), temperature=0.0).say(
        "Repeat: one two three, one two three, one two three.", 24)
    rows = []
    for q in qs:
        conv = specdec.Conversation(target, draft=specdec_options(method, draft, store), temperature=0.0)
        for turn, text in enumerate(q["turns"] if q["group"] == "mt_bench" else q["turns"][:1]):
            t = time.perf_counter()
            out = conv.say(text, max_tokens)
            wall = time.perf_counter() - t
            s = out.stats
            rows.append({"question_id": q["question_id"], "group": q["group"], "turn": turn,
                         "wall_s": wall, "decode_s": out.timings.decode_s, "prompt_s": out.timings.prompt_s,
                         "n_tokens": len(out.ids), "n_prompt": len(out.prompt_ids),
                         "passes": s.n_steps if s else len(out.ids), "accepted": s.n_accepted if s else 0,
                         "drafted": s.n_drafted if s else 0, "text": out.text})
    return rows


# ---- llama.cpp --------------------------------------------------------------------------------

def llama_command(method: str, exe: Path, target: str, draft: str, port: int, ctx: int) -> list[str]:
    cmd = [str(exe), "-m", target, "--host", "127.0.0.1", "--port", str(port), "-np", "1", "-c", str(ctx),
           "-t", "2", "-tb", "2"]
    if method == "llama-speculative":
        # this llama.cpp drafts with -md only when told to (--spec-type defaults to none)
        cmd += ["-md", draft, "--spec-type", "draft-simple", "--spec-draft-n-max", "5", "--spec-draft-n-min", "0",
                "--spec-draft-p-min", "0.9", "-td", "2"]
    elif method == "llama-lookup":
        cmd += ["--spec-type", "ngram-cache"]
    return cmd


def run_llama(method: str, exe: Path, qs: list[dict], max_tokens: int, log_dir: Path) -> list[dict]:
    import httpx
    from serve import Server, free_port
    from specdec.models import hub
    target, draft = (str(hub.resolve(m, download=True, progress=False)) for m in (QWEN_TARGET, QWEN_DRAFT))
    port = free_port()
    server = Server(llama_command(method, exe, target, draft, port, 8192), log_dir / f"{method}.log", port)
    rows = []
    try:
        server.wait_healthy(600)
        with httpx.Client(timeout=3600) as client:
            for q in qs:
                messages = []
                for turn, text in enumerate(q["turns"] if q["group"] == "mt_bench" else q["turns"][:1]):
                    messages.append({"role": "user", "content": text})
                    body = {"messages": messages, "max_tokens": max_tokens, "temperature": 0.0, "seed": 0,
                            "cache_prompt": turn > 0}
                    t = time.perf_counter()
                    r = client.post(server.url + "/v1/chat/completions", json=body)
                    wall = time.perf_counter() - t
                    r.raise_for_status()
                    res = r.json()
                    text_out = res["choices"][0]["message"]["content"]
                    messages.append({"role": "assistant", "content": text_out})
                    tm = res.get("timings", {})
                    n = int(tm.get("predicted_n", res["usage"]["completion_tokens"]))
                    drafted, accepted = int(tm.get("draft_n", 0)), int(tm.get("draft_n_accepted", 0))
                    rows.append({"question_id": q["question_id"], "group": q["group"], "turn": turn,
                                 "wall_s": wall, "decode_s": tm.get("predicted_ms", 0) / 1e3,
                                 "prompt_s": tm.get("prompt_ms", 0) / 1e3, "n_tokens": n,
                                 "n_prompt": int(tm.get("prompt_n", 0)),
                                 "passes": max(1, n - accepted), "accepted": accepted, "drafted": drafted,
                                 "text": text_out})
    finally:
        server.stop()
    return rows


# ---- summary ----------------------------------------------------------------------------------

def summarize(rows: dict[str, list[dict]]) -> dict:
    """Per method, per group and overall: speedups over the same engine's plain, tau,
    acceptance, tokens/s and identity with plain."""
    out = {}
    for method, rs in rows.items():
        base = rows.get("llama-plain" if method.startswith("llama") else "plain")
        per = {}
        for g in (*GROUPS, "overall"):
            mine = [r for r in rs if g == "overall" or r["group"] == g]
            ref = [r for r in (base or []) if g == "overall" or r["group"] == g]
            if not mine:
                continue
            wall, dec = sum(r["wall_s"] for r in mine), sum(r["decode_s"] for r in mine)
            toks, passes = sum(r["n_tokens"] for r in mine), sum(r["passes"] for r in mine)
            drafted, acc = sum(r["drafted"] for r in mine), sum(r["accepted"] for r in mine)
            per[g] = {"speedup": round(sum(r["wall_s"] for r in ref) / wall, 3) if ref else None,
                      "speedup_decode": round(sum(r["decode_s"] for r in ref) / dec, 3) if ref and dec else None,
                      "tau": round(toks / max(passes, 1), 3),
                      "acceptance": round(acc / drafted, 3) if drafted else None,
                      "tok_s": round(toks / dec, 2) if dec else None,
                      "identical": (all(a["text"] == b["text"] for a, b in zip(mine, ref)) if ref else None)}
        out[method] = per
    return out


SINGLE = ("model", "prompt-lookup", "suffix")     # the single drafters the defaults must match


def against_best_single(summary: dict) -> dict:
    """Per group: the defaults' speedup over plain, the best single drafter's (which one), and
    the defaults over it (the goal: >= 1.0x plain and >= 0.95x the best single drafter)."""
    out = {}
    d = summary.get("defaults", {})
    for g, cell in d.items():
        singles = {m: summary[m][g]["speedup"] for m in SINGLE if m in summary and g in summary[m]
                   and summary[m][g]["speedup"]}
        if not singles or not cell.get("speedup"):
            continue
        best = max(singles, key=singles.get)
        out[g] = {"defaults": cell["speedup"], "best_single": best, "best_single_speedup": singles[best],
                  "defaults_over_best": round(cell["speedup"] / singles[best], 3)}
    return out


def markdown(summary: dict) -> str:
    """The README's table: speedup over plain (whole request) per group, tau overall."""
    cols = [g for g in (*GROUPS, "overall")]
    lines = ["| method | " + " | ".join(cols) + " | tau | identical |",
             "| --- |" + " --- |" * (len(cols) + 2)]
    for m, per in summary.items():
        cells = [f"{per[g]['speedup']:.2f}x" if g in per and per[g]["speedup"] else "-" for g in cols]
        o = per.get("overall", {})
        lines.append(f"| {m} | " + " | ".join(cells) + f" | {o.get('tau', 0):.2f} | {o.get('identical')} |")
    return "\n".join(lines)


def plot(summary: dict, path: Path, cpu: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    methods = [m for m in summary if m not in ("plain", "llama-plain")]
    groups = [g for g in (*GROUPS, "overall") if any(g in summary[m] for m in methods)]
    fig, ax = plt.subplots(figsize=(11, 4.5))
    w = 0.8 / max(len(methods), 1)
    for i, m in enumerate(methods):
        ys = [summary[m].get(g, {}).get("speedup") or 0 for g in groups]
        ax.bar(np.arange(len(groups)) + i * w, ys, w, label=m)
    ax.axhline(1.0, color="k", lw=0.8)
    ax.set_xticks(np.arange(len(groups)) + w * (len(methods) - 1) / 2, groups)
    ax.set_ylabel("speedup over plain (whole request)")
    ax.set_title(f"Spec-Bench on the CPU: Qwen2.5-Coder-1.5B (draft 0.5B), {cpu}")
    ax.legend(ncol=4, fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--questions", type=Path, default=DATA)
    ap.add_argument("--per-category", type=int, default=2)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--methods", default=",".join(SPECDEC + LLAMA))
    ap.add_argument("--target", default=QWEN_TARGET)
    ap.add_argument("--draft", default=QWEN_DRAFT)
    ap.add_argument("--out", type=Path, default=Path("bench-results"))
    a = ap.parse_args(argv)
    methods = [m.strip() for m in a.methods.split(",") if m.strip()]
    unknown = [m for m in methods if m not in SPECDEC + LLAMA]
    if unknown:
        raise SystemExit(f"--methods: unknown {unknown} (known: {', '.join(SPECDEC + LLAMA)})")
    qs = questions(a.questions, a.per_category, a.seed)
    a.out.mkdir(parents=True, exist_ok=True)
    import specdec
    from dataclasses import asdict
    from specdec.api.drafting import DraftPlan
    from specdec.frontends.bench import llamacpp_build, llamacpp_dir
    target = specdec.load(a.target)
    draft = specdec.load(a.draft, requant="q4_0") if any(m in methods for m in SPECDEC[1:] if m not in
                                                          ("prompt-lookup", "suffix")) else None
    specdec.Conversation(target, temperature=0.0).say("Hello", 2)          # kernels compiled
    costs = DraftPlan(specdec.DraftOptions(model=draft), target).costs() if draft is not None else None
    print(f"pass costs (calibrated before any timing): {costs}", flush=True)
    rows: dict[str, list[dict]] = {}
    for m in methods:
        t = time.perf_counter()
        if m in SPECDEC:
            rows[m] = run_specdec(m, target, draft, qs, a.max_tokens)
        else:
            exe = llamacpp_dir() / "bin" / "llama-server"
            if not exe.exists():
                print(f"{m}: skipped (no native llama.cpp build: benchmarks/build_llamacpp.sh)", flush=True)
                continue
            rows[m] = run_llama(m, exe, qs, a.max_tokens, a.out)
        print(f"{m}: {len(rows[m])} answers in {time.perf_counter() - t:.0f} s", flush=True)
    summary = summarize(rows)
    for m, per in summary.items():
        print(m, json.dumps(per.get("overall")), flush=True)
    result = {"machine": machine_info(), "llamacpp_build": llamacpp_build(), "questions": str(a.questions),
              "per_category": a.per_category, "max_tokens": a.max_tokens, "seed": a.seed,
              "question_ids": [q["question_id"] for q in qs], "summary": summary,
              "defaults_vs_best_single": against_best_single(summary),
              "pass_costs": None if costs is None else {"target": asdict(costs.target),
                                                        "draft": asdict(costs.draft)},
              "rows": {m: [{k: v for k, v in r.items() if k != "text"} for r in rs] for m, rs in rows.items()}}
    write_json(a.out / "specbench.json", result)
    print(markdown(summary))
    for g, v in result["defaults_vs_best_single"].items():
        print(f"{g:15s} defaults {v['defaults']:.2f}x plain, best single {v['best_single']} "
              f"{v['best_single_speedup']:.2f}x: {v['defaults_over_best']:.2f} of it", flush=True)
    plot(summary, a.out / "specbench.png", result["machine"].get("cpu", "?"))


if __name__ == "__main__":
    main()
