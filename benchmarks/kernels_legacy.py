"""Speed of the legacy-quant matmul kernels (Q4_0 … Q8_0, F16) on real model shapes.

Random weight blocks with finite fp16 scales, M = 1 (decoding) and M = 8 (verifying a
drafted block).  Prints µs per call (best of --reps after a warm-up call), GB/s of
weight bytes read, the cost relative to M = 1, the time of the first call (compile or
cache load) and the cost of quantizing x alone.

    python benchmarks/kernels_legacy.py [--reps 30] [--threads 2] [--json out.json]
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import gguf
import numba
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from specdec.kernels import formats, legacy  # noqa: E402
from specdec.kernels.q8_act import quantize_q8  # noqa: E402

T = gguf.GGMLQuantizationType
SHAPES = [  # (tensor, qtype, N, K)
    ("qwen0.5b ffn_up", T.Q5_0, 4864, 896),
    ("qwen0.5b output", T.Q8_0, 151936, 896),
    ("smollm2 ffn_up", T.Q4_1, 1536, 576),
    ("smollm2 ffn_down", T.Q4_1, 576, 1536),
    ("q4_0 probe", T.Q4_0, 4864, 896),
    ("q5_1 probe", T.Q5_1, 4864, 896),
    ("f16 probe", T.F16, 4864, 896),
]
SCALE_FIELDS = {T.Q4_0: (0,), T.Q4_1: (0, 2), T.Q5_0: (0,), T.Q5_1: (0, 2), T.Q8_0: (0,)}


def random_weights(qtype, n: int, k: int, rng: np.random.Generator) -> np.ndarray:
    """Raw GGUF layout: uint8 (n, row_bytes), fp16 scales in [1e-3, 1e-2]; F16: float16 (n, k)."""
    if qtype == T.F16:
        return rng.standard_normal((n, k)).astype(np.float16)
    bb = formats.FORMATS[int(qtype)].type_size
    w = rng.integers(0, 256, (n, k // 32, bb), dtype=np.uint8)
    for o in SCALE_FIELDS[qtype]:
        h = rng.uniform(1e-3, 1e-2, (n, k // 32)).astype(np.float16)
        w[:, :, o:o + 2] = h.view(np.uint8).reshape(n, k // 32, 2)
    return w.reshape(n, -1)


def time_call(fn, reps: int) -> tuple[float, float]:
    """-> (first call s, best of ``reps`` further calls; the machine may be shared)."""
    t0 = time.perf_counter()
    fn()
    first = time.perf_counter() - t0
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return first, float(np.min(ts))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    if args.threads:
        numba.set_num_threads(args.threads)
    rng = np.random.default_rng(0)
    rows = []
    print(f"threads={numba.get_num_threads()}")
    print(f"{'tensor':17s} {'type':5s} {'N':>7s} {'K':>5s} {'M':>2s} {'first s':>8s} "
          f"{'us/call':>9s} {'GB/s':>6s} {'xM=1':>5s} {'q8 us':>6s}")
    for name, qt, n, k in SHAPES:
        w = random_weights(qt, n, k, rng)
        fn = legacy.MATMUL[int(qt)]
        base = None
        for m in (1, 8):
            x = rng.standard_normal((m, k)).astype(np.float32)
            out = np.empty((m, n), np.float32)
            first, t = time_call(lambda: fn(w, x, out), args.reps)
            _, tq = time_call(lambda: quantize_q8(x), args.reps)
            base = t if m == 1 else base
            row = {"tensor": name, "type": qt.name, "N": n, "K": k, "M": m, "first_s": first,
                   "us": t * 1e6, "GBps": w.nbytes / t / 1e9, "vs_M1": t / base, "q8_us": tq * 1e6}
            rows.append(row)
            print(f"{name:17s} {qt.name:5s} {n:7d} {k:5d} {m:2d} {first:8.2f} {t * 1e6:9.0f} "
                  f"{row['GBps']:6.1f} {row['vs_M1']:5.2f} {tq * 1e6:6.1f}")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
