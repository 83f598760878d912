"""Q8_K activation quantization (the ``vec_dot_type`` of every K-quant in ggml).

Each row of x is cut into super-blocks of 256 values; each block becomes a float32 scale
``d``, 256 int8 codes in [-127, 127] and the sums of the codes per 16 (``bsums``, int16 as
in ggml: exact, |bsum| ≤ 2032; the kernels reduce the mins with them in integers):

    max    = the value of largest magnitude (the first one on ties; inputs are finite)
    iscale = -127 / max            (float32; note the sign: max itself maps to -127)
    q[j]   = min(127, nearest_int(iscale · x[j]))      round half to even
    d      = 1 / iscale

This is quantize_row_q8_K_ref of ggml-quants.c (an all-zero block gives d = 0, q = 0).
Rows are quantized independently of each other.

Storage, for the SIMD kernels (kquants_ir):
    qs    int8    (K/256, M, 256)   block-major: the M rows' codes of block b are adjacent,
                                    so the kernels read x as one sequential stream;
                                    inside a block *lane-major*: byte 64k + 4L + i holds
                                    the code of value 16L + 4k + i (k < 4, L < 16, i < 4)
    d     float32 (K/256, M)
    bsum  int16   (K/256, M, 16)    bsum L = the sum of the codes of values 16L … 16L+15
``natural_order`` turns qs back into (M, K) codes in value order.
"""
from __future__ import annotations

import numpy as np
from numba import njit, prange

from .formats import QK_K


@njit(cache=True, nogil=True)
def quantize_row_q8_k(x, m, xq, xd, xbs, tmp):
    """Quantize row m.  x float32 (K,) -> xq[:, m] int8 (K/256, ·, 256) lane-major,
    xd[:, m] float32, xbs[:, m] int16 (K/256, ·, 16) code sums per 16, in place; tmp: int8 (256,) scratch.
    quantize_row_q8_K_ref."""
    xi = x.view(np.int32)                           # (K,) float bits
    tmp32 = tmp.view(np.int32)                      # (64,)
    xq32 = xq.reshape(-1).view(np.int32)            # (K/256 · M · 64,)
    n_rows = xq.shape[1]
    for b in range(x.shape[0] // QK_K):
        o = b * QK_K
        # first value of largest |x|: an integer max (vectorized) of the key
        # |x| bits << 8 | (255 − j), whose order is that of |x| for every non-NaN value
        key = np.int64(0)
        for j in range(QK_K):
            key = max(key, (np.int64(xi[o + j] & 0x7FFFFFFF) << 8) | (QK_K - 1 - j))
        if key >> 8 == 0:
            xd[b, m] = 0.0
            for j in range(QK_K):
                tmp[j] = 0
        else:
            iscale = np.float32(-127.0) / x[o + QK_K - 1 - (key & 0xFF)]   # float32, as in C
            for i in range(QK_K):
                v = np.rint(iscale * x[o + i])     # nearest_int: round half to even
                tmp[i] = np.int8(min(v, np.float32(127.0)))
            xd[b, m] = np.float32(1.0) / iscale
        base = (b * n_rows + m) * 64
        for lane in range(16):                     # dword 4L + k -> 16k + L
            for k in range(4):
                xq32[base + 16 * k + lane] = tmp32[4 * lane + k]
        for g in range(16):
            s = np.int32(0)
            for i in range(16 * g, 16 * g + 16):
                s += np.int32(tmp[i])
            xbs[b, m, g] = np.int16(s)


@njit(cache=True, nogil=True)
def _quantize_rows(x, xq, xd, xbs):
    tmp = np.empty(QK_K, np.int8)
    for m in range(x.shape[0]):
        quantize_row_q8_k(x[m], m, xq, xd, xbs, tmp)


@njit(cache=True, nogil=True, parallel=True)
def _quantize_rows_parallel(x, xq, xd, xbs):
    for m in prange(x.shape[0]):
        quantize_row_q8_k(x[m], m, xq, xd, xbs, np.empty(QK_K, np.int8))


def quantize_q8_k(x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """x: float32 (M, K), K % 256 == 0 -> (qs int8 (K/256, M, 256), d float32 (K/256, M),
    bsums int16 (K/256, M, 16)), laid out as in the module docstring."""
    if x.ndim != 2 or x.shape[1] % QK_K:
        raise ValueError(f"Q8_K needs a (M, K) array with K a multiple of {QK_K}, got {x.shape}")
    x = np.ascontiguousarray(x, dtype=np.float32)
    m, k = x.shape
    xq = np.empty((k // QK_K, m, QK_K), np.int8)
    xd = np.empty((k // QK_K, m), np.float32)
    xbs = np.empty((k // QK_K, m, 16), np.int16)
    (_quantize_rows_parallel if m > 1 and m * k >= 16384 else _quantize_rows)(x, xq, xd, xbs)
    return xq, xd, xbs


def natural_order(xq: np.ndarray) -> np.ndarray:
    """qs (K/256, M, 256) as stored -> codes (M, K) in value order (a copy)."""
    nb, m, _ = xq.shape
    d = xq.reshape(nb, m, 4, 16, 4)                   # (blocks, M, k, L, i)
    return np.ascontiguousarray(d.transpose(1, 0, 3, 2, 4)).reshape(m, nb * QK_K)
