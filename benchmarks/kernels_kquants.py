"""Speed of the K-quant matmul kernels on the shapes of qwen2.5-coder-1.5b (Q4_K_M).

Random weight blocks (finite fp16 scales) of the real shapes; M = 1 (decoding) and
M = 2, 4, 8 (verifying a drafted block).  Small matrices are replicated to --pool MiB and used in turn,
so weights come from DRAM as in a real decoding step, not from the 32 MiB L3.  Prints µs per
call (best and median of --reps after a warm-up call; the best is the uncontended speed on a
shared machine), GB/s of weight bytes read at the best time, the time of the first call
(compile or cache load) and of quantizing x to Q8_K alone (best).

    python benchmarks/kernels_kquants.py [--reps 30] [--pool 256] [--m 1 2 4 8] [--json out.json]
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import gguf
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from specdec.kernels import formats, kquants  # noqa: E402
from specdec.kernels.q8k import quantize_q8_k  # noqa: E402

T = gguf.GGMLQuantizationType
SHAPES = [  # (name, qtype, N, K)
    ("ffn_gate/up", T.Q4_K, 8960, 1536),
    ("ffn_down", T.Q6_K, 1536, 8960),
    ("output", T.Q6_K, 151936, 1536),
]
F16_FIELDS = {T.Q2_K: (80, 82), T.Q3_K: (108,), T.Q4_K: (0, 2), T.Q5_K: (0, 2), T.Q6_K: (208,)}


def random_weights(qtype, n: int, k: int, rng: np.random.Generator) -> np.ndarray:
    """uint8 (n, row_bytes): random bytes with small positive fp16 scales."""
    bb = formats.FORMATS[int(qtype)].type_size
    w = rng.integers(0, 256, (n, k // 256, bb), dtype=np.uint8)
    for o in F16_FIELDS[qtype]:
        h = rng.uniform(1e-3, 1e-2, (n, k // 256)).astype(np.float16)
        w[:, :, o:o + 2] = h.view(np.uint8).reshape(n, k // 256, 2)
    return w.reshape(n, -1)


def time_call(fn, reps: int) -> tuple[float, float, float]:
    """fn(i) -> (first call s, best s and median s of reps further calls)."""
    t0 = time.perf_counter()
    fn(0)
    first = time.perf_counter() - t0
    ts = []
    for i in range(1, reps + 1):
        t0 = time.perf_counter()
        fn(i)
        ts.append(time.perf_counter() - t0)
    return first, min(ts), float(np.median(ts))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--pool", type=int, default=256, help="MiB of weight copies to cycle through")
    ap.add_argument("--m", type=int, nargs="+", default=[1, 2, 4, 8], help="activation rows")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    rows = []
    print(f"{'tensor':12s} {'type':5s} {'N':>7s} {'K':>5s} {'M':>2s} {'first s':>8s} "
          f"{'best us':>8s} {'median':>8s} {'GB/s':>6s} {'xM=1':>5s} {'q8k us':>7s}")
    for name, qt, n, k in SHAPES:
        w0 = random_weights(qt, n, k, rng)
        pool = [w0] + [w0.copy() for _ in range(args.pool * 2**20 // w0.nbytes)]
        base = 1.0
        for m in args.m:
            x = rng.standard_normal((m, k)).astype(np.float32)
            out = np.empty((m, n), np.float32)
            matmul = kquants.MATMUL[int(qt)]
            first, t, med = time_call(lambda i: matmul(pool[i % len(pool)], x, out), args.reps)
            _, tq, _ = time_call(lambda i: quantize_q8_k(x), args.reps)
            base = t if m == 1 else base
            row = {"tensor": name, "type": qt.name, "N": n, "K": k, "M": m, "first_s": first,
                   "us": t * 1e6, "median_us": med * 1e6, "GBps": w0.nbytes / t / 1e9,
                   "vs_M1": t / base, "q8k_us": tq * 1e6}
            rows.append(row)
            print(f"{name:12s} {qt.name:5s} {n:7d} {k:5d} {m:2d} {first:8.2f} {t * 1e6:8.0f} "
                  f"{med * 1e6:8.0f} {row['GBps']:6.1f} {row['vs_M1']:5.2f} {tq * 1e6:7.1f}")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
