"""K-quant matmul and row lookup: Q2_K, Q3_K, Q4_K, Q5_K, Q6_K.

``MATMUL[qtype](w, x, out)``: out[m, n] = dot(W[n, :], x[m, :]) the way llama.cpp's CPU
backend computes it (ggml_vec_dot_qX_K_q8_K): each activation row is quantized to Q8_K
(q8k.py), every super-block of 256 reduces to exact integers (isum, and imin for the formats
with mins), applied by two FMAs with d·dx and −dmin·dx, super-block after super-block
(kquants_ir; the same in plain NumPy: kernels/reference.kquant_dot).

    w    uint8 (N, row_bytes) raw GGUF rows, zero-copy, C-contiguous
    x    float32 (M, K), K % 256 == 0
    out  float32 (M, N), filled in place

Each weight super-block is read and decoded once and used for all M rows (kquants_ir);
no dequantized copy of a weight matrix is ever built.  Row independence: out[m] depends on
x[m] only, bitwise, whatever M and the thread count are — whichever code path M selects
(one register-resident path per M <= MAX_STATIC_M, passes above), every (n, m) goes through
the same fixed sequence of float operations.

``GET_ROWS[qtype](w, ids, out)``: bit-exact dequantization of rows ``ids`` (dequant_ir's block
decoders, those of the float-activation matmul; Q2_K and Q3_K: kquants_dequant).
"""
from __future__ import annotations

import numpy as np
from numba import get_num_threads

from . import kquants_dequant as dq
from .dequant_ir import GET_ROWS_DEQUANT
from .formats import FORMATS, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, QK_K
from .kquants_ir import MATMUL_Q8K
from .q8k import quantize_q8_k



def _check_weights(qtype: int, w: np.ndarray, k: int) -> None:
    if w.dtype != np.uint8 or w.ndim != 2 or not w.flags.c_contiguous:
        raise ValueError("K-quant weights must be a C-contiguous uint8 (N, row_bytes) array")
    if k % QK_K or w.shape[1] != FORMATS[qtype].row_bytes(k):
        raise ValueError(f"{FORMATS[qtype].name}: rows of {w.shape[1]} bytes do not hold K={k} values")


def matmul_q8k(qtype: int, w: np.ndarray, xq: np.ndarray, xd: np.ndarray, xbs: np.ndarray,
               out: np.ndarray) -> None:
    """out = x · Wᵀ from activations already quantized by q8k.quantize_q8_k, so several
    weight matrices reading the same input (an expert's gate and up) share one quantization."""
    nb, m = xd.shape
    k = nb * QK_K
    if xq.shape != (nb, m, QK_K) or xbs.shape != (nb, m, 16) or not all(
            a.flags.c_contiguous for a in (xq, xd, xbs)):
        raise ValueError("activations must be as quantize_q8_k returns them")
    _check_weights(qtype, w, k)
    if out.shape != (m, w.shape[0]) or out.dtype != np.float32 or not out.flags.c_contiguous:
        raise ValueError(f"out must be a C-contiguous float32 array of shape {(m, w.shape[0])}")
    n_chunks = max(1, min(get_num_threads(), w.shape[0]))   # one contiguous chunk per thread
    MATMUL_Q8K[qtype](w, xq, xd, xbs, out, n_chunks)


def _matmul_fn(qtype: int):
    def matmul(w: np.ndarray, x: np.ndarray, out: np.ndarray) -> None:
        """w uint8 (N, row_bytes), x float32 (M, K) -> out float32 (M, N), in place."""
        xq, xd, xbs = quantize_q8_k(x)
        matmul_q8k(qtype, w, xq, xd, xbs, out)
    matmul.__name__ = f"matmul_{FORMATS[qtype].key}"
    return matmul


def _get_rows_fn(qtype: int, kernel):
    def get_rows(w: np.ndarray, ids: np.ndarray, out: np.ndarray) -> None:
        """w uint8 (N, row_bytes), ids int64 (M,) -> out float32 (M, K), in place."""
        _check_weights(qtype, w, out.shape[1])
        if out.dtype != np.float32 or not out.flags.c_contiguous or out.shape[0] != len(ids):
            raise ValueError("out must be a C-contiguous float32 array of shape (len(ids), K)")
        ids = np.asarray(ids, dtype=np.int64)
        if ids.size and (ids.min() < 0 or ids.max() >= w.shape[0]):
            raise IndexError(f"row id out of range [0, {w.shape[0]})")
        kernel(w, ids, out)
    get_rows.__name__ = f"get_rows_{FORMATS[qtype].key}"
    return get_rows


MATMUL = {qt: _matmul_fn(qt) for qt in MATMUL_Q8K}
GET_ROWS = {
    Q2_K: _get_rows_fn(Q2_K, lambda w, ids, out: dq.get_rows(Q2_K, w, ids, out)),
    Q3_K: _get_rows_fn(Q3_K, lambda w, ids, out: dq.get_rows(Q3_K, w, ids, out)),
    Q4_K: _get_rows_fn(Q4_K, GET_ROWS_DEQUANT[Q4_K]),      # dequant_ir's decoders, as float_act's
    Q5_K: _get_rows_fn(Q5_K, GET_ROWS_DEQUANT[Q5_K]),
    Q6_K: _get_rows_fn(Q6_K, GET_ROWS_DEQUANT[Q6_K]),
}
