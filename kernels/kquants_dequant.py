"""Row dequantization of Q2_K and Q3_K (embedding lookup, ``GET_ROWS``, and the float-activation
matmul's row buffer); the other formats' rows are decoded by dequant_ir's block decoders.

``get_rows(qtype, w, ids, out)``: w uint8 (N, row_bytes) raw rows, ids int64 (M,),
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
def _group(qtype, w, n, o, g):
    """(dl, ml) of scale group g (16 values) of the super-block at byte o of row n:
    Q3_K: block_q3_K, 110 B: hmask[32], qs[64], scales[12] 6-bit packed, d (ml = 0);
    Q2_K: block_q2_K, 84 B: scales[16] (scale | min << 4), qs[64], d, dmin."""
    if qtype == Q3_K:
        lo = (w[n, o + 96 + g % 8] >> (4 * (g // 8))) & 0xF
        hi = (w[n, o + 104 + g % 4] >> (2 * (g // 4))) & 3
        return load_f16(w, n, o + 108) * np.float32(np.int32(lo | (hi << 4)) - 32), np.float32(0.0)
    sm = w[n, o + g]
    return load_f16(w, n, o + 80) * np.float32(sm & 0xF), load_f16(w, n, o + 82) * np.float32(sm >> 4)


@njit(cache=True, nogil=True)
def get_rows(qtype, w, ids, out):
    """Rows ids of w (Q2_K or Q3_K) into out, as dequantize_row_q2_K / q3_K: Q3_K
    dl·(low | high bit) − 4 unless the hmask bit is set; Q2_K dl·q − ml."""
    nbytes = Q3_K_BYTES if qtype == Q3_K else Q2_K_BYTES
    for r in range(ids.shape[0]):
        n = ids[r]
        for b in range(out.shape[1] // QK_K):
            o, y = b * nbytes, b * QK_K
            for g in range(16):
                dl, ml = _group(qtype, w, n, o, g)
                h, s = g // 8, (g // 2) % 4
                for l in range(16 * (g % 2), 16 * (g % 2) + 16):
                    at = y + 16 * g + l - 16 * (g % 2)
                    if qtype == Q3_K:
                        low = (w[n, o + 32 + 32 * h + l] >> (2 * s)) & 3
                        hbit = (w[n, o + l] >> (4 * h + s)) & 1
                        out[r, at] = dl * np.float32(np.int32(low) - (0 if hbit else 4))
                    else:
                        out[r, at] = dl * np.float32((w[n, o + 16 + 32 * h + l] >> (2 * s)) & 3) - ml
