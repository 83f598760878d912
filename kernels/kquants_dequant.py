"""Row dequantization of Q2_K and Q3_K (embedding lookup, ``GET_ROWS``, and the float-activation
matmul's row buffer); the other formats' rows are decoded by dequant_ir's block decoders.

``get_rows_<fmt>(w, ids, out)``: w uint8 (N, row_bytes) raw rows, ids int64 (M,),
out float32 (M, K).  Bit-exact with gguf.quants.dequantize: the same float32 operations
in the same order (scale products first, then ``dl·q − ml``), no fused multiply-add.
Block layouts as in ggml-common.h; each decoder names the ggml function it follows.
"""
from __future__ import annotations

import numpy as np
from numba import njit

from .formats import FORMATS, Q2_K, Q3_K, QK_K
from .kquants_ir import load_f16

# bytes per super-block (compile-time constants of the kernels below)
Q2_K_BYTES, Q3_K_BYTES = (FORMATS[qt].type_size for qt in (Q2_K, Q3_K))


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
