"""Row dequantization of the K-quants (embedding lookup, ``GET_ROWS``).

``get_rows_<fmt>(w, ids, out)``: w uint8 (N, row_bytes) raw rows, ids int64 (M,),
out float32 (M, K).  Bit-exact with gguf.quants.dequantize: the same float32 operations
in the same order (scale products first, then ``dl·q − ml``), no fused multiply-add.
Block layouts as in ggml-common.h; each decoder names the ggml function it follows.
"""
from __future__ import annotations

import numpy as np
from numba import njit

from .formats import FORMATS, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, QK_K
from .kquants_ir import load_f16

# bytes per super-block (compile-time constants of the kernels below)
Q2_K_BYTES, Q3_K_BYTES, Q4_K_BYTES, Q5_K_BYTES, Q6_K_BYTES = (
    FORMATS[qt].type_size for qt in (Q2_K, Q3_K, Q4_K, Q5_K, Q6_K))


@njit(cache=True, nogil=True, inline="always")
def _scale_min_k4(w, n, o, j):
    """6-bit scale and min of sub-block j from the 12 bytes at w[n, o:] (get_scale_min_k4)."""
    if j < 4:
        return np.int32(w[n, o + j] & 63), np.int32(w[n, o + j + 4] & 63)
    sc = (w[n, o + j + 4] & 0xF) | ((w[n, o + j - 4] >> 6) << 4)
    mn = (w[n, o + j + 4] >> 4) | ((w[n, o + j] >> 6) << 4)
    return np.int32(sc), np.int32(mn)


@njit(cache=True, nogil=True)
def get_rows_q4_k(w, ids, out):
    """block_q4_K, 144 B: d, dmin, scales[12], qs[128] (dequantize_row_q4_K)."""
    for r in range(ids.shape[0]):
        n = ids[r]
        for b in range(out.shape[1] // QK_K):
            o, y = b * Q4_K_BYTES, b * QK_K
            d, dmin = load_f16(w, n, o), load_f16(w, n, o + 2)
            for j in range(8):
                sc, mn = _scale_min_k4(w, n, o + 4, j)
                dl, ml = d * np.float32(sc), dmin * np.float32(mn)
                shift, q = 4 * (j % 2), o + 16 + 32 * (j // 2)
                for l in range(32):
                    v = (w[n, q + l] >> shift) & 0xF
                    out[r, y + 32 * j + l] = dl * np.float32(v) - ml


@njit(cache=True, nogil=True)
def get_rows_q5_k(w, ids, out):
    """block_q5_K, 176 B: d, dmin, scales[12], qh[32], qs[128] (dequantize_row_q5_K)."""
    for r in range(ids.shape[0]):
        n = ids[r]
        for b in range(out.shape[1] // QK_K):
            o, y = b * Q5_K_BYTES, b * QK_K
            d, dmin = load_f16(w, n, o), load_f16(w, n, o + 2)
            for j in range(8):
                sc, mn = _scale_min_k4(w, n, o + 4, j)
                dl, ml = d * np.float32(sc), dmin * np.float32(mn)
                shift, q = 4 * (j % 2), o + 48 + 32 * (j // 2)
                for l in range(32):
                    v = ((w[n, q + l] >> shift) & 0xF) | (((w[n, o + 16 + l] >> j) & 1) << 4)
                    out[r, y + 32 * j + l] = dl * np.float32(v) - ml


@njit(cache=True, nogil=True)
def get_rows_q6_k(w, ids, out):
    """block_q6_K, 210 B: ql[128], qh[64], scales[16] int8, d (dequantize_row_q6_K)."""
    for r in range(ids.shape[0]):
        n = ids[r]
        for b in range(out.shape[1] // QK_K):
            o, y = b * Q6_K_BYTES, b * QK_K
            d = load_f16(w, n, o + 208)
            for g in range(16):                     # group of 16 values, one scale each
                dl = d * np.float32(np.int8(w[n, o + 192 + g]))
                h, k = g // 8, (g // 2) % 4         # half, quarter of the half
                ql = o + 64 * h + 32 * (k % 2)
                qh = o + 128 + 32 * h
                for l in range(16 * (g % 2), 16 * (g % 2) + 16):
                    lo = (w[n, ql + l] >> (4 * (k // 2))) & 0xF
                    hi = (w[n, qh + l] >> (2 * k)) & 3
                    v = np.int32(lo | (hi << 4)) - 32
                    out[r, y + 16 * g + l - 16 * (g % 2)] = dl * np.float32(v)


@njit(cache=True, nogil=True)
def get_rows_q3_k(w, ids, out):
    """block_q3_K, 110 B: hmask[32], qs[64], scales[12] 6-bit packed, d
    (dequantize_row_q3_K)."""
    for r in range(ids.shape[0]):
        n = ids[r]
        for b in range(out.shape[1] // QK_K):
            o, y = b * Q3_K_BYTES, b * QK_K
            d = load_f16(w, n, o + 108)
            for g in range(16):
                lo = (w[n, o + 96 + g % 8] >> (4 * (g // 8))) & 0xF
                hi = (w[n, o + 104 + g % 4] >> (2 * (g // 4))) & 3
                dl = d * np.float32(np.int32(lo | (hi << 4)) - 32)
                h, s = g // 8, (g // 2) % 4
                for l in range(16 * (g % 2), 16 * (g % 2) + 16):
                    low = (w[n, o + 32 + 32 * h + l] >> (2 * s)) & 3
                    hbit = (w[n, o + l] >> (4 * h + s)) & 1
                    v = np.int32(low) - (0 if hbit else 4)
                    out[r, y + 16 * g + l - 16 * (g % 2)] = dl * np.float32(v)


@njit(cache=True, nogil=True)
def get_rows_q2_k(w, ids, out):
    """block_q2_K, 84 B: scales[16] (scale | min << 4), qs[64], d, dmin
    (dequantize_row_q2_K)."""
    for r in range(ids.shape[0]):
        n = ids[r]
        for b in range(out.shape[1] // QK_K):
            o, y = b * Q2_K_BYTES, b * QK_K
            d, dmin = load_f16(w, n, o + 80), load_f16(w, n, o + 82)
            for g in range(16):
                sm = w[n, o + g]
                dl, ml = d * np.float32(sm & 0xF), dmin * np.float32(sm >> 4)
                h, s = g // 8, (g // 2) % 4
                for l in range(16 * (g % 2), 16 * (g % 2) + 16):
                    v = (w[n, o + 16 + 32 * h + l] >> (2 * s)) & 3
                    out[r, y + 16 * g + l - 16 * (g % 2)] = dl * np.float32(v) - ml
