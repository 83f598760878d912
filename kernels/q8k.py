"""Q8_K activation quantization (the ``vec_dot_type`` of every K-quant in ggml).

Each row of x is cut into super-blocks of 256 values; each block becomes a float32 scale
``d``, 256 int8 codes in [-127, 127] and the int32 sums of the codes per 16 (``bsums``,
int16 in ggml; int32 here so the SIMD kernels load them directly):

    max    = the value of largest magnitude (the first one on ties; inputs are finite)
    iscale = -127 / max            (float32; note the sign: max itself maps to -127)
    q[j]   = min(127, nearest_int(iscale · x[j]))      round half to even
    d      = 1 / iscale

This is quantize_row_q8_K_ref of ggml-quants.c (an all-zero block gives d = 0, q = 0).
Rows are quantized independently of each other.

Code order: the codes of each block are stored *lane-major* for the SIMD kernels
(kquants_ir): byte 64k + 4L + i of a block holds the code of value 16L + 4k + i
(k < 4, L < 16, i < 4), i.e. the block's 64 dwords transposed as a 16 × 4 matrix.
``natural_order`` undoes it.  bsums stay in natural order (bsum L = values 16L … 16L+15).
"""
from __future__ import annotations

import numpy as np
from numba import njit, prange

QK_K = 256


@njit(cache=True, nogil=True)
def quantize_row_q8_k(x, xq, xd, xbs, tmp):
    """Quantize one row.  x float32 (K,) -> xq int8 (K,) lane-major, xd float32 (K/256,),
    xbs int32 (K/16,), in place; tmp: int8 (256,) scratch.  quantize_row_q8_K_ref."""
    xi = x.view(np.int32)                           # (K,) float bits
    tmp32 = tmp.view(np.int32)                      # (64,)
    xq32 = xq.view(np.int32)                        # (K/4,)
    for b in range(x.shape[0] // QK_K):
        o = b * QK_K
        # first value of largest |x|: an integer max (vectorized) of the key
        # |x| bits << 8 | (255 − j), whose order is that of |x| for every non-NaN value
        key = np.int64(0)
        for j in range(QK_K):
            key = max(key, (np.int64(xi[o + j] & 0x7FFFFFFF) << 8) | (QK_K - 1 - j))
        if key >> 8 == 0:
            xd[b] = 0.0
            for j in range(QK_K):
                tmp[j] = 0
        else:
            iscale = np.float32(-127.0) / x[o + QK_K - 1 - (key & 0xFF)]   # float32, as in C
            for i in range(QK_K):
                v = np.rint(iscale * x[o + i])     # nearest_int: round half to even
                tmp[i] = np.int8(min(v, np.float32(127.0)))
            xd[b] = np.float32(1.0) / iscale
        for lane in range(16):                     # dword 4L + k -> 16k + L
            for k in range(4):
                xq32[b * 64 + 16 * k + lane] = tmp32[4 * lane + k]
        for g in range(16):
            s = np.int32(0)
            for i in range(16 * g, 16 * g + 16):
                s += np.int32(tmp[i])
            xbs[b * 16 + g] = s


@njit(cache=True, nogil=True)
def _quantize_rows(x, xq, xd, xbs):
    tmp = np.empty(QK_K, np.int8)
    for m in range(x.shape[0]):
        quantize_row_q8_k(x[m], xq[m], xd[m], xbs[m], tmp)


@njit(cache=True, nogil=True, parallel=True)
def _quantize_rows_parallel(x, xq, xd, xbs):
    for m in prange(x.shape[0]):
        quantize_row_q8_k(x[m], xq[m], xd[m], xbs[m], np.empty(QK_K, np.int8))


def quantize_q8_k(x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """x: float32 (M, K), K % 256 == 0 -> (codes int8 (M, K) lane-major, d float32
    (M, K/256), bsums int32 (M, K/16))."""
    if x.ndim != 2 or x.shape[1] % QK_K:
        raise ValueError(f"Q8_K needs a (M, K) array with K a multiple of {QK_K}, got {x.shape}")
    x = np.ascontiguousarray(x, dtype=np.float32)
    m, k = x.shape
    xq = np.empty((m, k), np.int8)
    xd = np.empty((m, k // QK_K), np.float32)
    xbs = np.empty((m, k // 16), np.int32)
    (_quantize_rows_parallel if m > 1 and m * k >= 16384 else _quantize_rows)(x, xq, xd, xbs)
    return xq, xd, xbs


def natural_order(xq: np.ndarray) -> np.ndarray:
    """Lane-major codes (M, K) -> codes in value order (M, K) (a copy)."""
    m, k = xq.shape
    d = xq.reshape(m, k // QK_K, 4, 16, 4)           # (M, blocks, k, L, i)
    return np.ascontiguousarray(d.transpose(0, 1, 3, 2, 4)).reshape(m, k)
