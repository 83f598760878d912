"""IQ4_NL, IQ4_XS and MXFP4: 4-bit codes into a 16-entry table of int8 values, as ggml-common.h
lays the blocks out:

    IQ4_NL  fp16 d | qs[16]                                  32 values, w = d · KV_IQ4NL[u]
    MXFP4   u8 e (E8M0) | qs[16]                             32 values, w = e8m0_half(e) · KV_MXFP4[u]
    IQ4_XS  fp16 d | u16 scales_h | u8 scales_l[4] | qs[128]  256 values in 8 groups of 32,
            6-bit group scale ls = scales_l nibble | 2 bits of scales_h << 4, w = d · (ls − 32) · KV_IQ4NL[u]

In each 32-value group, byte j holds value j in its low nibble and value j + 16 in its high one.
The activations are quantized as llama.cpp pairs these types (Q8_0 for IQ4_NL and MXFP4, Q8_K
for IQ4_XS), and each output follows ggml-cpu's `ggml_vec_dot_*_generic` integer order: per
group the int32 sums of the low and the high half, then `acc += d · float(sum1 + sum2)` in
float32, d the float32 product of the two scales (IQ4_XS: d4d8 · (ls − 32)).

    matmul(qtype, w, x, out)   w uint8 (N, row bytes), x float32 (M, K) -> out (M, N)
    GET_ROWS[qtype](w, ids, out)   rows dequantized as ggml's dequantize_row_*

Each output row is computed by the same instructions whatever M is (its own accumulator, the
groups in order), so a row's logits never depend on the rows beside it.  The plain NumPy
statement of both is reference.iquant_dot / reference.iquant_rows.
"""
from __future__ import annotations

import numpy as np
from numba import njit, prange

from .formats import IQ4_NL, IQ4_XS, MXFP4
from .q8_act import half_bits_to_f32, q8_rows
from .q8k import natural_order, quantize_q8_k

KV_IQ4NL = np.array([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113], np.int32)
KV_MXFP4 = np.array([0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12], np.int32)
BLOCK = {IQ4_NL: 18, MXFP4: 17}             # bytes per 32-value block (IQ4_XS: 136 per 256)


def e8m0_half(e: int) -> np.float32:
    """GGML_E8M0_TO_FP32_HALF: 2^(e − 128) as float32, exact (subnormal for e < 2)."""
    bits = (0x00200000 << e) if e < 2 else ((e - 1) << 23)
    return np.array([bits], np.uint32).view(np.float32)[0]


E8M0_HALF = np.array([e8m0_half(e) for e in range(256)], np.float32)    # (256,) by the byte e


@njit(cache=True, nogil=True)
def _half(w, n, at):
    """The fp16 field at bytes at, at + 1 of row n, as float32 (exact)."""
    return half_bits_to_f32(np.uint16(w[n, at]) | (np.uint16(w[n, at + 1]) << np.uint16(8)))


@njit(cache=True, nogil=True)
def _scale32(w, n, b, mx, e8):
    """The weight scale of 32-value block b of row n (IQ4_NL: fp16 d; MXFP4: E8M0 half)."""
    if mx:
        return e8[w[n, b * 17]]
    return _half(w, n, b * 18)


@njit(cache=True, nogil=True, parallel=True)
def _matmul_32(w, kv, mx, e8, xq, xd, out):
    """IQ4_NL (mx False) / MXFP4 (mx True) rows w (N, nb·size) by Q8_0 x (xq (M, K), xd (M, nb))."""
    n_rows, m_rows, nb = w.shape[0], xq.shape[0], xq.shape[1] // 32
    size, at = (17, 1) if mx else (18, 2)
    for n in prange(n_rows):
        for m in range(m_rows):
            out[m, n] = np.float32(0.0)
        lo = np.empty(16, np.int32)
        hi = np.empty(16, np.int32)
        for b in range(nb):
            dw = _scale32(w, n, b, mx, e8)
            for j in range(16):
                byte = w[n, b * size + at + j]
                lo[j] = kv[byte & 15]
                hi[j] = kv[byte >> 4]
            for m in range(m_rows):
                s1 = np.int32(0)
                s2 = np.int32(0)
                for j in range(16):
                    s1 += np.int32(xq[m, b * 32 + j]) * lo[j]
                    s2 += np.int32(xq[m, b * 32 + 16 + j]) * hi[j]
                d = np.float32(xd[m, b] * dw)
                out[m, n] = out[m, n] + d * np.float32(s1 + s2)


@njit(cache=True, nogil=True, parallel=True)
def _matmul_xs(w, kv, xq, xd, out):
    """IQ4_XS rows w (N, nb·136) by Q8_K x (xq (M, K) in value order, xd (nb, M))."""
    n_rows, m_rows, nb = w.shape[0], xq.shape[0], xq.shape[1] // 256
    for n in prange(n_rows):
        for m in range(m_rows):
            out[m, n] = np.float32(0.0)
        vals = np.empty(256, np.int32)
        ls = np.empty(8, np.int32)
        for b in range(nb):
            base = b * 136
            d = _half(w, n, base)
            h = np.int32(w[n, base + 2]) | (np.int32(w[n, base + 3]) << 8)
            for g in range(8):
                ls[g] = ((np.int32(w[n, base + 4 + g // 2]) >> (4 * (g % 2))) & 15) | (((h >> (2 * g)) & 3) << 4)
                for j in range(16):
                    byte = w[n, base + 8 + 16 * g + j]
                    vals[32 * g + j] = kv[byte & 15]
                    vals[32 * g + 16 + j] = kv[byte >> 4]
            for m in range(m_rows):
                d4d8 = np.float32(d * xd[b, m])
                acc = out[m, n]
                for g in range(8):
                    s1 = np.int32(0)
                    s2 = np.int32(0)
                    for j in range(16):
                        s1 += np.int32(xq[m, b * 256 + 32 * g + j]) * vals[32 * g + j]
                        s2 += np.int32(xq[m, b * 256 + 32 * g + 16 + j]) * vals[32 * g + 16 + j]
                    acc = acc + np.float32(d4d8 * np.float32(ls[g] - 32)) * np.float32(s1 + s2)
                out[m, n] = acc


def matmul(qtype: int, w: np.ndarray, x: np.ndarray, out: np.ndarray) -> None:
    """out (M, N) = x (M, K) · wᵀ for w's 4-bit codebook rows (module docstring)."""
    if qtype == IQ4_XS:
        xq, xd, _ = quantize_q8_k(x)
        _matmul_xs(w, KV_IQ4NL, natural_order(xq), xd, out)
    else:
        xq, xd, _, _ = q8_rows(np.ascontiguousarray(x, dtype=np.float32))
        _matmul_32(w, KV_MXFP4 if qtype == MXFP4 else KV_IQ4NL, qtype == MXFP4, E8M0_HALF, xq, xd, out)


@njit(cache=True, nogil=True, parallel=True)
def _rows_32(w, kv, mx, e8, ids, out):
    size, at = (17, 1) if mx else (18, 2)
    for i in prange(ids.shape[0]):
        n = ids[i]
        for b in range(out.shape[1] // 32):
            d = _scale32(w, n, b, mx, e8)
            for j in range(16):
                byte = w[n, b * size + at + j]
                out[i, b * 32 + j] = d * np.float32(kv[byte & 15])
                out[i, b * 32 + 16 + j] = d * np.float32(kv[byte >> 4])


@njit(cache=True, nogil=True, parallel=True)
def _rows_xs(w, kv, ids, out):
    for i in prange(ids.shape[0]):
        n = ids[i]
        for b in range(out.shape[1] // 256):
            base = b * 136
            d = _half(w, n, base)
            h = np.int32(w[n, base + 2]) | (np.int32(w[n, base + 3]) << 8)
            for g in range(8):
                ls = ((np.int32(w[n, base + 4 + g // 2]) >> (4 * (g % 2))) & 15) | (((h >> (2 * g)) & 3) << 4)
                dl = np.float32(d * np.float32(ls - 32))
                for j in range(16):
                    byte = w[n, base + 8 + 16 * g + j]
                    out[i, b * 256 + 32 * g + j] = dl * np.float32(kv[byte & 15])
                    out[i, b * 256 + 32 * g + 16 + j] = dl * np.float32(kv[byte >> 4])


def _get_rows(qtype: int):
    def get_rows(w: np.ndarray, ids: np.ndarray, out: np.ndarray) -> None:
        if qtype == IQ4_XS:
            _rows_xs(w, KV_IQ4NL, ids, out)
        else:
            _rows_32(w, KV_MXFP4 if qtype == MXFP4 else KV_IQ4NL, qtype == MXFP4, E8M0_HALF, ids, out)
    return get_rows


def _matmul(qtype: int):
    def mm(w: np.ndarray, x: np.ndarray, out: np.ndarray) -> None:
        matmul(qtype, w, x, out)
    return mm


IQUANTS = (IQ4_NL, IQ4_XS, MXFP4)
MATMUL = {qt: _matmul(qt) for qt in IQUANTS}
GET_ROWS = {qt: _get_rows(qt) for qt in IQUANTS}


# ---- layouts made at load (registry.layout_for / prepare): the table lookups done once ---------
#
# IQ4_NL and MXFP4 as Q8_0 rows.  A block's values are int8 (the table's) times one scale, and
# both dots are `acc += (d_w·d_x)·float(isum)` per block of 32 over Q8_0 activations, as
# Q8_0's: so the same block as Q8_0 (fp16 d, the 32 table values) gives the same bits through the
# Q8_0 kernels.  MXFP4's E8M0 scale 2^(e−128) is an fp16 exactly when 2^-24 <= it <= 2^15; a
# tensor with a scale outside keeps its file rows.
#
# IQ4_XS expanded: per super-block fp16 d (2 bytes) | ls − 32 (8 x int8) | the 256 values (int8),
# 266 bytes (XS_BYTES); the matmul is _matmul_xs's integer order with the values read directly.

XS_BYTES = 266
Q8_BYTES = 34


def q8_0_rows(w: np.ndarray, qtype: int) -> np.ndarray | None:
    """IQ4_NL / MXFP4 rows (N, nb·size) -> the same values as Q8_0 rows (N, nb·34), or None
    (MXFP4 with a scale that is no fp16)."""
    n = w.shape[0]
    size, at = (17, 1) if qtype == MXFP4 else (18, 2)
    blk = w.reshape(n, -1, size)
    kv = (KV_MXFP4 if qtype == MXFP4 else KV_IQ4NL).astype(np.int8)
    qs = blk[:, :, at:]
    out = np.empty((n, blk.shape[1], Q8_BYTES), np.uint8)
    out[:, :, 2:18] = kv[qs & 15].view(np.uint8)
    out[:, :, 18:] = kv[qs >> 4].view(np.uint8)
    if qtype == MXFP4:
        e = blk[:, :, 0].astype(np.int32)
        if e.size and (e.min() < 128 - 24 or e.max() > 128 + 15):
            return None
        out[:, :, 0:2] = (2.0 ** (e - 128)).astype(np.float16)[..., None].view(np.uint8)
    else:
        out[:, :, 0:2] = blk[:, :, 0:2]
    return out.reshape(n, -1)


def expand_xs(w: np.ndarray) -> np.ndarray:
    """IQ4_XS rows (N, nb·136) -> (N, nb·266): d | ls − 32 | values, per super-block."""
    n = w.shape[0]
    blk = w.reshape(n, -1, 136)
    out = np.empty((n, blk.shape[1], XS_BYTES), np.uint8)
    out[:, :, 0:2] = blk[:, :, 0:2]
    h = blk[:, :, 2].astype(np.int32) | (blk[:, :, 3].astype(np.int32) << 8)
    g = np.arange(8)
    ls = ((blk[:, :, 4 + g // 2].astype(np.int32) >> (4 * (g % 2))) & 15) | (((h[..., None] >> (2 * g)) & 3) << 4)
    out[:, :, 2:10] = (ls - 32).astype(np.int8).view(np.uint8)
    qs = blk[:, :, 8:].reshape(n, -1, 8, 16)
    kv = KV_IQ4NL.astype(np.int8)
    vals = np.concatenate([kv[qs & 15], kv[qs >> 4]], axis=-1)          # (N, nb, 8, 32)
    out[:, :, 10:] = vals.reshape(n, -1, 256).view(np.uint8)
    return out.reshape(n, -1)


@njit(cache=True, nogil=True, parallel=True)
def _matmul_xs8(w, xq, xd, out):
    """Expanded IQ4_XS rows w (N, nb·266) as int8 by Q8_K x: _matmul_xs's order."""
    n_rows, m_rows, nb = w.shape[0], xq.shape[0], xq.shape[1] // 256
    for n in prange(n_rows):
        for m in range(m_rows):
            out[m, n] = np.float32(0.0)
        for b in range(nb):
            base = b * 266
            d = _half(w, n, base)
            for m in range(m_rows):
                d4d8 = np.float32(d * xd[b, m])
                acc = out[m, n]
                for g in range(8):
                    s1 = np.int32(0)
                    s2 = np.int32(0)
                    v0 = base + 10 + 32 * g
                    x0 = b * 256 + 32 * g
                    for j in range(16):
                        s1 += np.int32(xq[m, x0 + j]) * np.int32(np.int8(w[n, v0 + j]))
                        s2 += np.int32(xq[m, x0 + 16 + j]) * np.int32(np.int8(w[n, v0 + 16 + j]))
                    ls = np.int32(np.int8(w[n, base + 2 + g]))
                    acc = acc + np.float32(d4d8 * np.float32(ls)) * np.float32(s1 + s2)
                out[m, n] = acc


@njit(cache=True, nogil=True, parallel=True)
def _rows_xs8(w, ids, out):
    for i in prange(ids.shape[0]):
        n = ids[i]
        for b in range(out.shape[1] // 256):
            base = b * 266
            d = _half(w, n, base)
            for g in range(8):
                dl = np.float32(d * np.float32(np.int8(w[n, base + 2 + g])))
                for j in range(32):
                    out[i, b * 256 + 32 * g + j] = dl * np.float32(np.int8(w[n, base + 10 + 32 * g + j]))


def matmul_xs8(w: np.ndarray, x: np.ndarray, out: np.ndarray) -> None:
    xq, xd, _ = quantize_q8_k(x)
    _matmul_xs8(w, natural_order(xq), xd, out)


def get_rows_xs8(w: np.ndarray, ids: np.ndarray, out: np.ndarray) -> None:
    _rows_xs8(w, ids, out)
