"""Speculative decoding on the Qwen pair: speedup over plain decoding per draft-n × draft-p,
greedy and sampled, and the measured costs that bound it.

Target qwen2.5-coder-1.5b-instruct-q4_k_m, draft qwen2.5-coder-0.5b-instruct (ModelDrafter,
threshold policy: up to draft-n tokens, stop once the draft's top probability is below
draft-p; draft-p 0 never stops early).  Code-writing chat prompts (prompts/fresh_code.jsonl).
For each temperature and prompt, plain target decoding runs first, then every setting, in the
same process: speedup = pooled speculative tok/s over pooled plain tok/s of the same prompts.
Kernels are compiled (or loaded from the Numba cache) before any timing (`warm_up`).

Costs, measured apart with single forward passes after 128 cached tokens (median of 5):
  draft cost ratio c = draft forward time / target forward time, one row each;
  verify growth g(n) = target forward time over n + 1 rows / over 1 row.
With acceptance alpha, Leviathan et al. 2023 (§3.3) give the expected speedup of drafting n
tokens as E(n) / (n*c + g(n)), E(n) = (1 - alpha^(n+1)) / (1 - alpha); the JSON records this
model beside each measured draft-p 0 speedup, so the report can say which of alpha, c and g(n)
(or per-step overheads the model leaves out) stands in the way.

    python benchmarks/speculative.py --out bench-results                                # real run
    python benchmarks/speculative.py --prompts 1 --n-predict 8 --draft-n 2 4 --draft-p 0 \\
        --temps 0 --out /tmp/x                                                           # smoke
"""
from __future__ import annotations

import argparse
import time
from pathlib import Path

import specdec
from common import (QWEN_DRAFT, QWEN_TARGET, aggregate, completion_row, forward_ms,
                    load_prompts, machine_info, warm_up, write_json)
from specdec.speculation.policies import expected_tokens

DRAFT_N = (1, 2, 3, 4, 5, 6, 8, 12, 16)
DRAFT_P = (0.0, 0.5, 0.9)


def measure_costs(target, draft, draft_ns) -> dict:
    t1 = forward_ms(target, 1)
    d1 = forward_ms(draft, 1)
    rows = {n: forward_ms(target, n + 1) for n in sorted(set(draft_ns))}
    return {"target_1row_ms": round(t1, 2), "draft_1row_ms": round(d1, 2),
            "draft_cost_ratio": round(d1 / t1, 4),
            "verify_ms": {str(n): round(v, 2) for n, v in rows.items()},
            "verify_growth": {str(n): round(v / t1, 4) for n, v in rows.items()},
            "verify_cost_per_extra_token": {str(n): round((v - t1) / n / t1, 4) for n, v in rows.items()}}


def model_speedup(alpha: float, n: int, costs: dict) -> float:
    """Leviathan et al. §3.3 with the measured c and g(n)."""
    g = costs["verify_growth"][str(n)]
    return expected_tokens(alpha, n) / (n * costs["draft_cost_ratio"] + g)


def run_temperature(target, draft, prompts, temp: float, a, costs: dict) -> dict:
    settings = [(n, p) for n in a.draft_n for p in a.draft_p]
    rows: dict[str, list[dict]] = {"plain": [], **{f"n{n}_p{p:g}": [] for n, p in settings}}
    identical = True
    for i, rec in enumerate(prompts):
        kw = dict(n_predict=a.n_predict, temperature=temp, seed=2000 + i, ignore_eos=a.ignore_eos)
        plain = target.generate(rec["prompt"], **kw)
        rows["plain"].append(completion_row(plain))
        print(f"T={temp:g} {rec['id']:16s} plain      {rows['plain'][-1]['tok_s']:7.2f} tok/s", flush=True)
        for n, p in settings:
            out = target.generate(rec["prompt"], draft=draft, draft_n=n, draft_p=p,
                                  draft_policy="threshold", **kw)
            row = completion_row(out)
            rows[f"n{n}_p{p:g}"].append(row)
            if temp == 0.0:
                identical &= out.ids == plain.ids
            print(f"T={temp:g} {rec['id']:16s} n={n:<2d} p={p:<3g} {row['tok_s']:7.2f} tok/s  "
                  f"acc {row['acceptance']:.2f}  {row['tokens_per_step']:.2f} tok/step", flush=True)
    summary = {k: aggregate(v) for k, v in rows.items()}
    base = summary["plain"]["tok_s"]
    table = []
    for n, p in settings:
        s = summary[f"n{n}_p{p:g}"]
        alpha = s["measured_acceptance"]
        table.append({"draft_n": n, "draft_p": p, "tok_s": s["tok_s"],
                      "speedup": round(s["tok_s"] / base, 3) if base else None,
                      "acceptance": s["acceptance"], "tokens_per_step": s["tokens_per_step"],
                      "predicted_acceptance": s["predicted_acceptance"], "measured_acceptance": alpha,
                      "model_speedup": round(model_speedup(alpha, n, costs), 3) if p == 0 else None})
    best = max(table, key=lambda r: r["speedup"] or 0.0)
    return {"plain_tok_s": base, "settings": table, "best": best, "summary": summary, "runs": rows,
            "greedy_outputs_identical": identical if temp == 0.0 else None}


def plot(results: dict, a, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    temps = list(results["by_temperature"])
    fig, axes = plt.subplots(1, len(temps), figsize=(5.5 * len(temps), 4), squeeze=False)
    for ax, t in zip(axes[0], temps):
        table = results["by_temperature"][t]["settings"]
        for p in a.draft_p:
            pts = [(r["draft_n"], r["speedup"]) for r in table if r["draft_p"] == p]
            ax.plot(*zip(*pts), marker="o", label=f"draft-p {p:g}")
        theory = [(r["draft_n"], r["model_speedup"]) for r in table if r["model_speedup"] is not None]
        if theory:
            ax.plot(*zip(*theory), ls="--", color="grey", label="model, draft-p 0")
        ax.axhline(1.0, color="black", lw=0.8)
        ax.set_xlabel("draft-n")
        ax.set_ylabel("speedup over plain")
        ax.set_title(f"temperature {t}")
        ax.legend()
    c = results["costs"]
    fig.suptitle(f"{QWEN_TARGET} / {QWEN_DRAFT}: c = {c['draft_cost_ratio']:.2f}")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", type=int, default=3, help="first k prompts of fresh_code.jsonl (default: 3)")
    ap.add_argument("--n-predict", type=int, default=256)
    ap.add_argument("--draft-n", type=int, nargs="+", default=list(DRAFT_N))
    ap.add_argument("--draft-p", type=float, nargs="+", default=list(DRAFT_P))
    ap.add_argument("--temps", type=float, nargs="+", default=[0.0, 0.7])
    ap.add_argument("--ignore-eos", action="store_true", help="always generate --n-predict tokens")
    ap.add_argument("--out", default="bench-results")
    ap.add_argument("--no-mmap", action="store_true", help="read the model files into memory (specdec --no-mmap)")
    a = ap.parse_args()
    prompts = load_prompts("fresh_code", a.prompts)
    n_runs = len(a.temps) * len(prompts) * (1 + len(a.draft_n) * len(a.draft_p))
    print(f"{n_runs} generations of up to {a.n_predict} tokens", flush=True)
    target = specdec.load(QWEN_TARGET, n_ctx=1024, mmap=False if a.no_mmap else None)
    draft = specdec.load(QWEN_DRAFT, n_ctx=1024, mmap=False if a.no_mmap else None)
    warm_s = warm_up(target, draft)
    print(f"warm-up (JIT compile or cache load, not timed below): {warm_s:.1f} s", flush=True)
    costs = measure_costs(target, draft, a.draft_n)
    print(f"costs: {costs}", flush=True)
    t0 = time.perf_counter()
    by_t = {f"{t:g}": run_temperature(target, draft, prompts, t, a, costs) for t in a.temps}
    results = {"machine": machine_info(), "target": QWEN_TARGET, "draft": QWEN_DRAFT,
               "settings": {k: v for k, v in vars(a).items() if k != "out"},
               "prompts": [p["id"] for p in prompts], "warmup_s": round(warm_s, 2),
               "warmup": "every kernel path compiled before timing", "costs": costs,
               "wall_s": round(time.perf_counter() - t0, 1), "by_temperature": by_t}
    out = Path(a.out)
    write_json(out / "speculative.json", results)
    plot(results, a, out / "speculative.png")
    for t, r in by_t.items():
        print(f"\nT={t}: plain {r['plain_tok_s']:.2f} tok/s")
        print(f"{'n':>3s} {'p':>4s} {'tok/s':>7s} {'speedup':>7s} {'acc':>5s} {'tok/step':>8s} {'model':>6s}")
        for s in r["settings"]:
            ms = f"{s['model_speedup']:6.2f}" if s["model_speedup"] is not None else "     -"
            print(f"{s['draft_n']:3d} {s['draft_p']:4g} {s['tok_s']:7.2f} {s['speedup'] or 0:7.2f} "
                  f"{s['acceptance']:5.2f} {s['tokens_per_step']:8.2f} {ms}")
        b = r["best"]
        print(f"best: draft-n {b['draft_n']}, draft-p {b['draft_p']:g}: {b['speedup']}x"
              + (f"; greedy outputs identical: {r['greedy_outputs_identical']}" if t == "0" else ""))
    print(f"draft cost ratio c = {costs['draft_cost_ratio']}, verify growth {costs['verify_growth']}")
    print(f"wrote {out / 'speculative.json'} and {out / 'speculative.png'}")


if __name__ == "__main__":
    main()
