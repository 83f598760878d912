"""A cheaper draft model: the Qwen draft requantized at load and/or with a trimmed head, against
the draft as stored; cost per draft token, acceptance and end-to-end speedup in one run.

Target qwen2.5-coder-1.5b-instruct-q4_k_m, draft qwen2.5-coder-0.5b-instruct (its layers
mostly Q5_0 with Q4_K / Q6_K ffn_down, its output head Q8_0: 146 MB of the ~390 MB a decode
step reads).  Draft variants (engine/requant.py, load(requant=, requant_head=)):

    stored      the file as it is
    head-q4_0   the output head requantized Q8_0 -> Q4_0
    head-q5_0   the output head requantized Q8_0 -> Q5_0
    layers-q4_0 every layer matmul wider than Q4_0 (Q5_0, Q6_K, Q8_0) -> Q4_0, the head as stored
    q4_0        both: the head and every layer matmul wider than Q4_0 -> Q4_0

each with --draft-vocab None (all 151,936 ids), 32768 and 16384.  Every model is read into
memory (mmap=False, specdec --no-mmap) so that all variants are laid out alike (8-row records).

Measured, all in this one process, after warm_up of every kernel path:
  cost       the draft's one-row decode (last_only, as drafting runs it) after 128 cached tokens,
             median over rounds (5 decodes each) that alternate the variants; as a fraction of the target's
             one-row decode (logits for the row, as verification computes them) measured in
             the same rounds
  per draft  draft seconds / drafted tokens of the speculative runs (sampling overhead included)
  acceptance greedy, threshold policy (--draft-n, --draft-p), accepted / drafted, pooled over
             the prompts; tok/s = generated tokens / decode seconds, speedup over plain decoding
             run prompt by prompt beside it.  Greedy outputs are checked identical to plain.

    flock /tmp/specdec-bench.lock python benchmarks/cheap_draft.py            # the real run
    python benchmarks/cheap_draft.py --prompts 1 --n-predict 8 --variants stored q4_0 \\
        --vocabs 0 --out /tmp/x                                               # smoke
"""
from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np

import specdec
from common import (QWEN_DRAFT, QWEN_TARGET, aggregate, completion_row, forward_ms, load_prompts,
                    machine_info, warm_up, write_json)

VARIANTS = {"stored": (None, None), "head-q4_0": (None, "q4_0"), "head-q5_0": (None, "q5_0"),
            "layers-q4_0": ("q4_0", None), "q4_0": ("q4_0", "q4_0")}  # name -> (requant, requant_head)


def step_bytes(model, n_logits: int | None) -> int:
    """Weight bytes one decode step of the model reads (the layers' matmuls and the head's
    first n_logits rows; embedding rows and norms left out)."""
    w = model.weights
    total = sum(lin.w.nbytes for L in w.layers
                for lin in (L.wq, L.wk, L.wv, L.wo, L.w_gate, L.w_up, L.w_down))
    head = w.output.w
    n = head.shape[0] if n_logits is None else n_logits
    return int(total + head.nbytes // head.shape[0] * n)


class OneRow:
    """A session with n_past cached tokens whose one-row decode is timed again and again
    (eval one token, roll back): the prefill is paid once, not per measurement."""

    def __init__(self, model, n_logits: int | None, last_only: bool, n_past: int = 128):
        self.s = model.session(n_past + 2, n_logits=n_logits)
        self.s.eval([(17 * i) % 1000 + 100 for i in range(n_past)], last_only=True)
        self.n_past, self.last_only = n_past, last_only

    def ms(self, repeats: int, cpu: list | None = None) -> float:
        """Median wall milliseconds of `repeats` decodes; cpu: appends each one's process CPU
        milliseconds (all threads: not counting the time the host keeps the process waiting)."""
        times = []
        for i in range(repeats):
            t, c = time.perf_counter(), time.process_time()
            self.s.eval([131 + i], last_only=self.last_only)
            times.append(time.perf_counter() - t)
            if cpu is not None:
                cpu.append(1e3 * (time.process_time() - c))
            self.s.truncate(self.n_past)
        return float(np.median(times) * 1e3)


def measure_costs(target, drafts, cells, rounds: int, threads_list):
    """One-row decode times, rounds x (each thread count x (target, every cell)), one decode
    each, interleaved so that the host's slow spells hit every cell alike.  Returns
    ({cell/threads: {median, min}}, {threads: [target ms]}, {threads: target median ms})."""
    import numba
    timers = {c: OneRow(drafts[c[0]], c[1], last_only=True) for c in cells}
    target_timer = OneRow(target, None, last_only=False)
    raw = {(c, t): [] for c in cells for t in threads_list}
    cpu = {(c, t): [] for c in cells for t in threads_list}
    tgt = {t: [] for t in threads_list}
    tgt_cpu = {t: [] for t in threads_list}
    for r in range(rounds):
        for t in threads_list:
            numba.set_num_threads(t)
            tgt[t].append(target_timer.ms(1, tgt_cpu[t]))
            for c in cells:
                raw[(c, t)].append(timers[c].ms(1, cpu[(c, t)]))
        if r % 10 == 9 or r == rounds - 1:
            print(f"cost round {r}: target " + ", ".join(f"{t} thr {np.median(v):.1f} ms"
                                                        for t, v in tgt.items()), flush=True)
    cost = {f"{n}/{v or 'all'}/{t}": {"median": round(float(np.median(x)), 2),
                                     "min": round(float(np.min(x)), 2),
                                     "cpu_median": round(float(np.median(cpu[((n, v), t)])), 2)}
            for ((n, v), t), x in raw.items()}
    cost.update({f"target/{t}": {"median": round(float(np.median(v)), 2),
                                 "min": round(float(np.min(v)), 2),
                                 "cpu_median": round(float(np.median(tgt_cpu[t])), 2)}
                 for t, v in tgt.items()})
    target_ms = {t: round(float(np.median(v)), 2) for t, v in tgt.items()}
    return cost, {t: [round(x, 2) for x in v] for t, v in tgt.items()}, target_ms


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    ap.add_argument("--vocabs", nargs="+", type=int, default=[0, 32768, 16384],
                    help="--draft-vocab values (0: all ids)")
    ap.add_argument("--set", default="fresh_code", choices=("fresh_code", "code_editing"))
    ap.add_argument("--prompts", type=int, default=3)
    ap.add_argument("--n-predict", type=int, default=128)
    ap.add_argument("--draft-n", type=int, default=5)
    ap.add_argument("--draft-p", type=float, default=0.9)
    ap.add_argument("--rounds", type=int, default=30, help="rounds of the cost measurement")
    ap.add_argument("--threads", nargs="+", type=int, default=[2, 1],
                    help="Numba thread counts the costs are measured at (the runs use the last)")
    ap.add_argument("--cost-only", action="store_true",
                    help="measure the one-row costs only (cheap_draft_cost.json)")
    ap.add_argument("--out", default=str(Path(__file__).parent / "results"))
    a = ap.parse_args()
    vocabs = [v or None for v in a.vocabs]

    t = time.perf_counter()
    target = specdec.load(QWEN_TARGET, n_ctx=1024, mmap=False)
    load_s = {"target": round(time.perf_counter() - t, 2)}
    drafts = {}
    for name in a.variants:
        t = time.perf_counter()
        rq, rh = VARIANTS[name]
        drafts[name] = specdec.load(QWEN_DRAFT, n_ctx=1024, mmap=False, requant=rq, requant_head=rh)
        load_s[name] = round(time.perf_counter() - t, 2)
    print(f"load s: {load_s}", flush=True)
    warm_s = warm_up(target, *drafts.values())
    for d in drafts.values():                      # the trimmed heads' kernel paths too
        for v in vocabs:
            forward_ms(d, 1, n_past=8, repeats=1, n_logits=v, last_only=True)
    print(f"warm-up: {warm_s:.1f} s", flush=True)

    cells = [(n, v) for n in a.variants for v in vocabs]
    cost, tgt, target_ms = measure_costs(target, drafts, cells, a.rounds, a.threads)
    if a.cost_only:
        write_json(Path(a.out) / "cheap_draft_cost.json", {
            "machine": machine_info(), "target": QWEN_TARGET, "draft": QWEN_DRAFT,
            "settings": vars(a), "load_s": load_s, "target_ms": target_ms, "cost_ms": cost,
            "target_cost_ms": tgt})
        for k, c in cost.items():
            t = k.rsplit("/", 1)[1]
            print(f"{k:24s} median {c['median']:6.2f} min {c['min']:6.2f} cpu {c['cpu_median']:6.2f} ms"
                  f"  frac {c['median'] / target_ms[int(t)]:.3f}"
                  f" (cpu {c['cpu_median'] / cost[f'target/{t}']['cpu_median']:.3f})")
        return
    threads0 = a.threads[-1]
    import numba
    numba.set_num_threads(threads0)
    prompts = load_prompts(a.set, a.prompts)
    runs: dict = {"plain": []}
    runs.update({f"{n}/{v or 'all'}": [] for n, v in cells})
    identical = True
    for rec in prompts:
        plain = target.generate(rec["prompt"], n_predict=a.n_predict)
        runs["plain"].append(completion_row(plain))
        print(f"{rec['id']:14s} plain {plain.timings.tokens_per_s:6.2f} tok/s", flush=True)
        for n, v in cells:
            out = target.generate(rec["prompt"], n_predict=a.n_predict, draft=drafts[n],
                                  draft_n=a.draft_n, draft_p=a.draft_p, draft_vocab=v)
            row = completion_row(out)
            runs[f"{n}/{v or 'all'}"].append(row)
            identical &= out.ids == plain.ids
            print(f"{rec['id']:14s} {n:10s} {str(v or 'all'):6s} {row['tok_s']:6.2f} tok/s "
                  f"acc {row['acceptance']:.3f}", flush=True)
    summary = {k: aggregate(r) for k, r in runs.items()}
    base = summary["plain"]["tok_s"]
    table = []
    for n, v in cells:
        s = summary[f"{n}/{v or 'all'}"]
        ms = {t: cost[f"{n}/{v or 'all'}/{t}"]["median"] for t in a.threads}
        table.append({"variant": n, "requant": VARIANTS[n][0], "requant_head": VARIANTS[n][1],
                      "draft_vocab": v, "load_s": load_s[n],
                      "step_mb": round(step_bytes(drafts[n], v) / 1e6, 1),
                      "draft_ms": ms, "draft_frac": {t: round(ms[t] / target_ms[t], 3) for t in ms},
                      "per_draft_ms": round(1e3 * s["draft_s"] / max(1, s["n_drafted"]), 2),
                      "acceptance": s["acceptance"], "tokens_per_step": s["tokens_per_step"],
                      "tok_s": s["tok_s"], "speedup": round(s["tok_s"] / base, 3) if base else None})
    write_json(Path(a.out) / "cheap_draft.json", {
        "machine": machine_info(), "target": QWEN_TARGET, "draft": QWEN_DRAFT,
        "settings": vars(a), "warmup_s": round(warm_s, 2), "load_s": load_s,
        "target_ms": target_ms, "plain_tok_s": base,
        "greedy_outputs_identical": identical, "prompts": [p["id"] for p in prompts],
        "table": table, "cost_ms": cost, "target_cost_ms": tgt, "summary": summary})
    print(f"\ntarget one-row decode {target_ms} ms, plain {base:.2f} tok/s; "
          f"greedy identical to plain: {identical}")
    print(f"{'variant':10s} {'vocab':>6s} {'MB/step':>7s} {'ms':>6s} {'frac':>5s} {'ms/drft':>7s} "
          f"{'acc':>5s} {'tok/stp':>7s} {'tok/s':>6s} {'speedup':>7s}")
    for r in table:
        print(f"{r['variant']:10s} {str(r['draft_vocab'] or 'all'):>6s} {r['step_mb']:7.1f} "
              f"{r['draft_ms'][threads0]:6.2f} {r['draft_frac'][threads0]:5.3f} {r['per_draft_ms']:7.2f} "
              f"{r['acceptance']:5.3f} {r['tokens_per_step']:7.2f} {r['tok_s']:6.2f} {r['speedup']:7.3f}")


if __name__ == "__main__":
    main()
