"""Decode speed and the cost of M-row passes of one worktree, to be run alternately with another.

For each model (read into memory, no prepared image: every load prepares its layout afresh):
tg = greedy decode steps one token at a time after a short prompt (tokens/s, the best of
--repeats runs of --steps steps) and the median forward time of an M-row pass after 128
cached tokens for each --m (what verifying M − 1 drafted tokens costs), its ratio to M = 1.
Run it from each worktree's venv in turn, under the exclusive CPU lock; --json appends one
record per run (the worktree's commit, the machine) so the runs can be set side by side.

    python benchmarks/decode_ab.py [--models id ...] [--m 1 2 5 9 17] [--json out.json]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import time
from pathlib import Path

import numpy as np

os.environ.setdefault("SPECDEC_PREPARED", "0")

import specdec  # noqa: E402
from specdec.kernels import cpu  # noqa: E402

MODELS = ["qwen2.5-coder-1.5b-instruct-q4_k_m", "qwen2.5-coder-0.5b-instruct", "gemma-3-270m-q4_k_m"]


def tg(model, steps: int, repeats: int) -> float:
    """Best tokens/s of `steps` greedy one-token steps after a 16-token prompt."""
    best = 0.0
    for _ in range(repeats):
        s = model.session(steps + 32)
        tok = int(np.argmax(s.eval([(31 * i) % 1000 + 100 for i in range(16)], last_only=True)[-1]))
        t = time.perf_counter()
        for _ in range(steps):
            tok = int(np.argmax(s.eval([tok])[-1]))
        best = max(best, steps / (time.perf_counter() - t))
    return best


def pass_ms(model, m: int, repeats: int) -> float:
    """Median ms of an m-row pass (logits for every row) after 128 cached tokens."""
    s = model.session(128 + m + 1)
    s.eval([(17 * i) % 1000 + 100 for i in range(128)], last_only=True)
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        s.eval([(31 * i) % 1000 + 100 for i in range(m)])
        times.append(time.perf_counter() - t)
        s.truncate(128)
    return float(np.median(times) * 1e3)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=MODELS)
    ap.add_argument("--m", type=int, nargs="+", default=[1, 2, 5, 9, 17])
    ap.add_argument("--steps", type=int, default=48)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--activations", default="auto")
    ap.add_argument("--json", type=Path, default=None)
    a = ap.parse_args()
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                            cwd=Path(specdec.__file__).parent).stdout.strip()
    rows = []
    for mid in a.models:
        t = time.perf_counter()
        model = specdec.load(mid, mmap=False, activations=a.activations)
        load_s = time.perf_counter() - t
        s = model.session(64)
        s.eval(list(range(100, 120)))
        s.eval([7])                                    # compile / load every path once
        passes = {m: pass_ms(model, m, 5) for m in a.m}
        row = {"model": mid, "load_s": round(load_s, 2), "tg_tok_s": round(tg(model, a.steps, a.repeats), 2),
               "pass_ms": passes, "pass_vs_1": {m: round(v / passes[a.m[0]], 3) for m, v in passes.items()}}
        rows.append(row)
        print(f"{commit} {mid:36s} load {load_s:5.1f}s  tg {row['tg_tok_s']:6.2f} tok/s  "
              + " ".join(f"M{m}={v:.1f}ms(x{row['pass_vs_1'][m]:.2f})" for m, v in passes.items()), flush=True)
        del model, s
    if a.json:
        old = json.loads(a.json.read_text()) if a.json.exists() else []
        old.append({"commit": commit, "activations": a.activations, "machine": cpu.describe(), "rows": rows})
        a.json.write_text(json.dumps(old, indent=1))


if __name__ == "__main__":
    main()
