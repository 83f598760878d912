"""Numba CPU kernels for specdec, installed as the subpackage ``specdec.kernels``.

Arrays in, arrays out: nothing here imports from ``specdec`` (only relative imports within
this folder).  Every kernel is ``@njit(cache=True, nogil=True)``; the matmul kernels run
``prange`` over output rows.

Modules: formats (the table of GGML format facts), ir (the LLVM IR helpers of the ``*_ir.py``
files), legacy / legacy_ir / repack (Q4_0 … Q8_0, F32, F16, BF16), kquants / kquants_ir /
kquants_dequant / kquants_repack / kquants_x16 / kquants_x16_ir / q8k (K-quants),
float_act / dequant_ir (float activations; dequant_ir's
block decoders also serve the row lookup), q8_act (Q8_0 /
Q8_1 activations), attention / attention_ir / attention_tree (the tree mask), ops (norms,
RoPE, activations), threads (Numba's threading layer), checks (argument checks).

Contract of the quantized matmul kernels (``matmul``):
    w    the raw tensor data exactly as stored in the GGUF file, zero-copy:
         uint8 (N, row_bytes) for block-quantized types and BF16,
         float16 (N, K) for F16, float32 (N, K) for F32;
         for the ``repack.REPACKED`` ids, a tensor rewritten in place (same shape and
         bytes): a legacy quant's 8-row records (repack.py), a K-quant's blocks in the
         kernels' lane order (kquants_repack.py); for the ``repack.INTERLEAVED`` ids, a new
         array (N/16, ·) of 16-row interleaved K-quant records (kquants_x16.py)
    x    float32 (M, K), C-contiguous activations
    out  float32 (M, N); out[m] depends on x[m] only and is *bitwise identical*
         whatever M is and whatever the other rows hold (row independence).
"""
from __future__ import annotations

import numpy as np

from . import cpu
cpu.force_path()            # SPECDEC_KERNELS, before anything below compiles (cpu.py)
from . import threads  # noqa: E402
threads.choose()            # SPECDEC_THREADING: the parallel runtime, before any region runs (threads.py)
from . import kquants, kquants_x16_amx, legacy, repack  # noqa: E402,F401  (x16_amx: kquants_x16.TILES)
from .float_act import MATMUL_FLOAT_ACT  # noqa: E402

MATMUL = {**legacy.MATMUL, **kquants.MATMUL,      # ggml type id -> fn(w, x, out)
          **repack.MATMUL}                    # repack.REPACKED ids (in-memory weights)
GET_ROWS = {**legacy.GET_ROWS, **kquants.GET_ROWS,  # ggml type id -> fn(w, ids, out)
            **repack.GET_ROWS}                      # repacked K-quant tables
SUPPORTED_TYPES = frozenset(MATMUL) & frozenset(GET_ROWS) - frozenset(repack.MATMUL)


def matmul(w: np.ndarray, qtype: int, x: np.ndarray, out: np.ndarray | None = None,
           float_act: bool = False) -> np.ndarray:
    """Y = X · Wᵀ.  w: (N, ·) raw rows, x: (M, K) float32 -> (M, N) float32.

    float_act: keep the activations in float32 instead of rounding them to 8 bits per block
    (float_act.py); block-quantized types only, the float types never round."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    if out is None:
        out = np.empty((x.shape[0], repack.n_rows(w, qtype)), dtype=np.float32)
    (MATMUL_FLOAT_ACT if float_act and qtype in MATMUL_FLOAT_ACT else MATMUL)[qtype](w, x, out)
    return out


def get_rows(w: np.ndarray, qtype: int, ids: np.ndarray, k: int) -> np.ndarray:
    """Dequantize rows ``ids`` of w.  ids: (M,) int64 -> (M, k) float32."""
    out = np.empty((len(ids), k), dtype=np.float32)
    GET_ROWS[qtype](w, np.asarray(ids, dtype=np.int64), out)
    return out
