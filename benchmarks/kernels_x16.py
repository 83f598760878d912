"""One-row and many-row matmul time of the real K-quant tensors, in the layout weights get at load.

For each model and tensor kind (every layer's copy of it, used in turn, as a decoding step
reads them), the best sweep's mean time per call for each M, with the activations already in
Q8_K (the kernel alone).  The layout is whichever this tree prepares in-memory weights in:
the 16-row interleaved records (kernels/kquants_x16_ir) where the tree has them, else the
in-block lane order of earlier trees — so the same script, run from two worktrees
alternately, compares the two.

    python benchmarks/kernels_x16.py [--m 1 2 ... 17] [--sweeps 7] [--kinds ffn_down output ...] [--json out.json]
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import gguf
import numpy as np
from numba import get_num_threads

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from specdec.kernels import cpu  # noqa: E402
from specdec.kernels.q8k import quantize_q8_k  # noqa: E402

try:
    from specdec.kernels import kquants_x16 as x16
    from specdec.kernels.kquants_x16_ir import MATMUL_Q8K as X16_DRIVERS
    from specdec.kernels.kquants_ir import MATMUL_Q8K
    LAYOUT = "x16"
except ImportError:                       # a tree without the interleaved layout
    from specdec.kernels import kquants_repack
    from specdec.kernels.kquants_ir import MATMUL_Q8K_REPACKED
    LAYOUT = "lane"

CACHE = Path.home() / ".cache" / "specdec"
MODELS = {"qwen-1.5b": "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
          "qwen-0.5b": "qwen2.5-coder-0.5b-instruct.gguf", "gemma-270m": "gemma-3-270m-q4_k_m.gguf"}
KINDS = ("attn_q", "attn_output", "ffn_up", "ffn_down")      # also: output (the vocabulary projection)


def prepared(qt: int, w: np.ndarray):
    """(weights as loaded, driver, parallel chunks) in this tree's in-memory layout."""
    if LAYOUT == "x16" and x16.can_interleave(qt, w.shape[0]):
        return x16.interleave(qt, w), X16_DRIVERS[qt], max(1, min(get_num_threads(), w.shape[0] // 16))
    if LAYOUT == "x16":                       # not 16k rows: this tree reads the GGUF rows
        return w, MATMUL_Q8K[qt], max(1, min(get_num_threads(), w.shape[0]))
    return kquants_repack.repack(w, qt), MATMUL_Q8K_REPACKED[qt], max(1, min(get_num_threads(), w.shape[0]))


def groups(path: Path, kinds=KINDS):
    """{(kind, qtype name, N, K): [uint8 GGUF rows per layer]} of the K-quant tensors."""
    out: dict = {}
    for t in gguf.GGUFReader(path).tensors:
        kind = t.name.split(".")[2] if t.name.startswith("blk.") else t.name.split(".")[0]
        if kind in kinds and t.tensor_type.name in ("Q4_K", "Q5_K", "Q6_K"):
            k, n = (int(s) for s in t.shape)
            out.setdefault((kind, t.tensor_type.name, n, k), []).append(np.array(t.data).reshape(n, -1))
    return out


def sweep_time(fn, n: int, sweeps: int) -> float:
    """Best over sweeps of the mean time of fn(i) for i < n (one warm-up sweep first)."""
    best = float("inf")
    for s in range(sweeps + 1):
        t0 = time.perf_counter()
        for i in range(n):
            fn(i)
        if s:
            best = min(best, (time.perf_counter() - t0) / n)
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--m", type=int, nargs="+", default=[1, 9])
    ap.add_argument("--sweeps", type=int, default=7)
    ap.add_argument("--models", nargs="+", default=list(MODELS))
    ap.add_argument("--kinds", nargs="+", default=list(KINDS))
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    rows = []
    for model in args.models:
        for (kind, tname, n, k), ws in groups(CACHE / MODELS[model], args.kinds).items():
            qt = int(gguf.GGMLQuantizationType[tname])
            prep = [prepared(qt, w) for w in ws]
            one = None
            for m in args.m:
                xq, xd, xbs = quantize_q8_k(rng.standard_normal((m, k)).astype(np.float32))
                out = np.empty((m, n), np.float32)
                t = sweep_time(lambda i: prep[i][1](prep[i][0], xq, xd, xbs, out, prep[i][2]),
                               len(prep), args.sweeps)
                one = t if m == args.m[0] else one
                rows.append({"model": model, "tensor": kind, "type": tname, "N": n, "K": k, "M": m,
                             "layers": len(ws), "us": t * 1e6, "vs_first_m": t / one, "layout": LAYOUT})
                print(f"{LAYOUT:4s} {model:10s} {kind:11s} {tname:4s} {n:5d}x{k:<5d} M={m:2d} "
                      f"{t * 1e6:8.1f} us  x{t / one:5.2f}", flush=True)
    if args.json:
        args.json.write_text(json.dumps({"cpu": cpu.describe(), "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
