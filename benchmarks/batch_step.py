"""What one batched step costs: B sequences x r new rows each in one forward pass.

For B = 1, 2, 4, 8 sequences, each with --n-past cached positions (default 200), and r = 1, 2,
4, 6, 9 new rows per sequence (r = 1: plain decode; r > 1: a verification of r - 1 drafted
tokens plus the bonus row), the median wall time of one transformer.eval_batch step (logits for
every row, as verification needs), and the derived aggregate rows/s = B·r / step time and
the gain over running the B sequences' steps one after another (B · t(1, r) / t(B, r)).
This is what a continuous-batching server's scheduler needs to know: how much drafting
pays at each batch size once the weights are already read for B sequences.

Before any timing each model is warmed up (kernel compilation or the Numba cache load, and
one untimed step of the largest shape); that warm-up is excluded from the figures and
reported apart as warm_s.  After each timed step the caches are truncated back to n_past;
the repeats go round-robin over all (B, r) cells, and min_step_ms (the fastest repeat) is
kept beside the median, for machines shared with other work.

On a machine shared with other work, NUMBA_NUM_THREADS=1 gives stable figures: the parallel
kernels wait at every join for a worker thread that another process has taken the core from
(machine.numba_threads records the setting; loadavg_before / loadavg_after the other load).

Writes batch_step.json into --out.

    python benchmarks/batch_step.py [--models id ...] [--repeats 5] [--no-mmap] [--out bench-results]
"""
from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np

import specdec
from specdec.engine.transformer import eval_batch
from common import QWEN_DRAFT, QWEN_TARGET, machine_info, warm_up, write_json

BS = (1, 2, 4, 8)
RS = (1, 2, 4, 6, 9)


def _loadavg() -> str:
    """/proc/loadavg: other work on the machine during the run shows here."""
    try:
        return open("/proc/loadavg").read().strip()
    except OSError:
        return "?"


def tokens(n: int, seed: int) -> list[int]:
    return [(17 * i + 101 * seed) % 1000 + 100 for i in range(n)]


def measure(model, n_past: int, repeats: int) -> dict:
    sessions = [model.session(n_past + max(RS) + 1) for _ in range(max(BS))]
    for b, s in enumerate(sessions):                        # each sequence its own prefix
        s.eval(tokens(n_past, b), last_only=True)
    t0 = time.perf_counter()
    warm_up(model)
    eval_batch(sessions, [tokens(max(RS), 50 + b) for b in range(max(BS))])   # largest shape, untimed
    for s in sessions:
        s.truncate(n_past)
    warm_s = time.perf_counter() - t0
    cells = [(B, r) for r in RS for B in BS]
    times: dict[tuple[int, int], list[float]] = {c: [] for c in cells}
    for rep in range(repeats):          # round-robin over the cells: a burst of other load on
        for B, r in cells:              # the machine hits one repeat of many cells, not one cell
            new = [tokens(r, 50 + b + rep) for b in range(B)]
            t = time.perf_counter()
            eval_batch(sessions[:B], new)
            times[B, r].append(time.perf_counter() - t)
            for s in sessions[:B]:
                s.truncate(n_past)
    ms = {c: float(np.median(v) * 1e3) for c, v in times.items()}
    best = {c: float(np.min(v) * 1e3) for c, v in times.items()}
    table = {f"B{B}_r{r}": {"B": B, "r": r, "rows": B * r, "step_ms": round(ms[B, r], 3),
                            "min_step_ms": round(best[B, r], 3),
                            "rows_per_s": round(B * r / ms[B, r] * 1e3, 2),
                            "ms_per_row": round(ms[B, r] / (B * r), 3),
                            "gain_vs_sequential": round(B * ms[1, r] / ms[B, r], 3)}
             for B in BS for r in RS}
    return {"warm_s": round(warm_s, 2), "steps": table}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=[QWEN_TARGET, QWEN_DRAFT])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--n-past", type=int, default=200)
    ap.add_argument("--out", default="bench-results")
    ap.add_argument("--no-mmap", action="store_true", help="read the model files into memory")
    a = ap.parse_args(argv)
    result = {"machine": machine_info(), "B": list(BS), "r": list(RS),
              "n_past": a.n_past, "repeats": a.repeats, "mmap": not a.no_mmap,
              "timing": "step_ms: median wall time of one eval_batch step (logits for every row), "
                        "min_step_ms the fastest of the repeats; kernel compilation / warm-up "
                        "excluded (warm_s)",
              "loadavg_before": _loadavg(),
              "models": []}
    for mid in a.models:
        m = specdec.load(mid, n_ctx=a.n_past + max(RS) + 1, mmap=False if a.no_mmap else None)
        r = {"model": mid, **measure(m, a.n_past, a.repeats)}
        result["models"].append(r)
        print(f"{mid} (warm-up {r['warm_s']:.1f} s, excluded)\n  ms per step / rows/s")
        print("  " + " " * 5 + "".join(f"{'r=' + str(x):>18s}" for x in RS))
        for B in BS:
            cells = [r["steps"][f"B{B}_r{x}"] for x in RS]
            print(f"  B={B:<3d}" + "".join(f"{c['step_ms']:9.1f} {c['rows_per_s']:7.1f} " for c in cells))
    result["loadavg_after"] = _loadavg()
    write_json(Path(a.out) / "batch_step.json", result)
    print(f"wrote {Path(a.out) / 'batch_step.json'}")


if __name__ == "__main__":
    main()
