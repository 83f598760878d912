"""Quantized weights × float32 activations: the path that does not round activations.

``MATMUL_FLOAT_ACT[qtype](w, x, out)``: out[m, n] = dot(dequant(W[n, :]), x[m, :]) with x
kept in float32: each weight row dequantized bit-exactly as gguf.quants does (never a
dequantized copy of the matrix) and dotted with every activation row in 32 float32 lanes
folded in a fixed order (legacy_ir.dot32_lanes).  dequant_ir.MATMUL_DOT does it in registers,
sixteen values at a time, for up to MAX_FUSED_M activation rows per pass over the weights;
Q2_K and Q3_K go through a per-thread row buffer (kquants_dequant) and legacy.dot_f32, the
same operations.  Every (n, m) runs the same operations whatever M is: rows stay
independent, bitwise.

Why it exists: the default kernels round each activation row to 8 bits per block the way
llama.cpp does (Q8_0 / Q8_1 / Q8_K), which is faster and tracks llama.cpp closely on llama
and qwen2 models.  On gemma3 the post-attention and post-feed-forward norms rescale tiny
branch outputs to unit size, so those roundings become chaotic: a 1e-6 relative nudge of the
input moves the perplexity by 0.4% and the first-step logits by up to 1.5.  Float
activations are stable under the same nudge, so gemma3 layers use this path by default
(``specdec.load(..., activations="q8")`` picks the rounded path back).

    w    uint8 (N, row_bytes) raw GGUF rows of a block-quantized type
    x    float32 (M, K), C-contiguous
    out  float32 (M, N), filled in place
"""
from __future__ import annotations

import numpy as np
from numba import get_num_threads, njit, prange

from . import kquants_dequant as dq
from .checks import frozen
from .dequant_ir import MATMUL_DOT, MAX_FUSED_M
from .formats import FORMATS, KQUANTS, LEGACY
from .legacy import dot_f32


@njit(cache=True, nogil=True, parallel=True)
def _matmul_float_act(qtype, w, x, out, n_chunks):
    """out (M, N) = x · dequant(W)ᵀ; prange over n_chunks contiguous chunks of output rows
    (one per thread: each allocates its row buffer once)."""
    n = w.shape[0]
    m_rows, k = x.shape
    xf = x.reshape(-1)                                   # (M * K,)
    for c in prange(n_chunks):
        buf = np.empty((1, k), np.float32)               # one dequantized weight row
        ids = np.empty(1, np.int64)
        for row in range(c * n // n_chunks, (c + 1) * n // n_chunks):
            ids[0] = row
            dq.get_rows(qtype, w, ids, buf)   # (Q2_K, Q3_K) bit-exact with gguf
            for m in range(m_rows):
                out[m, row] = dot_f32(buf[0], xf, m, k)


def _fn(qtype: int):
    qk, nbytes = FORMATS[qtype].block_size, FORMATS[qtype].type_size

    def matmul(w: np.ndarray, x: np.ndarray, out: np.ndarray) -> None:
        """w uint8 (N, row_bytes), x float32 (M, K) -> out float32 (M, N), in place."""
        k = x.shape[1]
        if w.dtype != np.uint8 or w.ndim != 2 or k % qk or w.shape[1] != k // qk * nbytes:
            raise ValueError(f"{FORMATS[qtype].name}: weights of shape {w.shape} do not hold K={k} values")
        if out.shape != (x.shape[0], w.shape[0]) or out.dtype != np.float32 or not out.flags.c_contiguous:
            raise ValueError(f"out must be a C-contiguous float32 array of shape {(x.shape[0], w.shape[0])}")
        x = np.ascontiguousarray(x, np.float32)
        n_chunks = max(1, min(get_num_threads(), w.shape[0]))
        if qtype in MATMUL_DOT:         # no row buffer, same bits; rows in passes of MAX_FUSED_M
            for m0 in range(0, x.shape[0], MAX_FUSED_M):
                MATMUL_DOT[qtype](frozen(w), x[m0:m0 + MAX_FUSED_M], out[m0:m0 + MAX_FUSED_M], n_chunks)
        else:
            _matmul_float_act(qtype, frozen(w), x, out, n_chunks)
    matmul.__name__ = f"matmul_float_act_{FORMATS[qtype].name.lower()}"
    return matmul


MATMUL_FLOAT_ACT = {qt: _fn(qt) for qt in LEGACY + KQUANTS}
