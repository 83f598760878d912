"""Requantization at load: any supported weight tensor -> Q4_0, Q5_0 or Q8_0 rows.

    quantize(x, qtype)               float32 (N, K) -> uint8 (N, K / 32 * type_size)
    requantize(w, src, dst, k)       raw rows of type src (N, ·) -> raw rows of type dst

The rounding rules are those of ggml's reference quantizers in ggml-quants.c, in float32
arithmetic step for step, so the bytes are those gguf-py's ``gguf.quants.quantize`` writes
(tests/engine/test_requant.py checks it bit for bit):

    Q4_0  quantize_row_q4_0_ref   m = the value of largest |x| in the block (the first one),
                                  d = m / -8, u = min(15, trunc(x / d + 8.5))      w = u - 8
    Q5_0  quantize_row_q5_0_ref   d = m / -16, u = min(31, trunc(x / d + 16.5))    w = u - 16
    Q8_0  quantize_row_q8_0_ref   d = max|x| / 127, w = round-half-away(x / d)

(x / d is computed as x · (1 / d), d is rounded to fp16 only when stored, and 1 / 0 is 0.)
A source tensor goes through float32 first: its rows are dequantized with the GET_ROWS
kernels, a chunk of rows at a time, so a Q8_0 / Q5_0 / K-quant / F16 tensor of any size
needs only CHUNK_ROWS rows of float32 on the side.
"""
from __future__ import annotations

import numpy as np
from numba import njit, prange

from . import kquants, legacy
from .formats import FORMATS, Q4_0, Q5_0, Q8_0, QK8

TARGETS = (Q4_0, Q5_0, Q8_0)       # the types quantize() writes
CHUNK_ROWS = 4096                  # rows dequantized to float32 at a time by requantize()
_GET_ROWS = {**legacy.GET_ROWS, **kquants.GET_ROWS}


@njit(cache=True, nogil=True)
def _round_away(v):
    """roundf: float32 v to the nearest integer, halves away from zero (as np_roundf)."""
    a = abs(v)
    f = np.floor(a)
    r = f + np.floor(np.float32(2.0) * (a - f))
    return -r if v < 0 else r


@njit(cache=True, nogil=True, parallel=True)
def _quantize_rows(x, codes, d, qtype):
    """x (N, K) float32 -> d (N, K/32) float32 scales and codes (N, K/32, code bytes).

    Q4_0: codes[..., 0:16] the nibbles; Q5_0: codes[..., 0:4] qh (little endian), [4:20]
    the nibbles; Q8_0: codes[..., 0:32] the int8 values as bytes."""
    n, k = x.shape
    nb = k // 32
    for r in prange(n):
        for b in range(nb):
            o = b * 32
            if qtype == Q8_0:                                   # Q8_0
                amax = np.float32(0.0)
                for j in range(32):
                    a = abs(x[r, o + j])
                    if a > amax:
                        amax = a
                dd = amax / np.float32(127.0)
                inv = np.float32(1.0) / dd if dd != 0 else np.float32(0.0)
                d[r, b] = dd
                for j in range(32):
                    q = int(_round_away(x[r, o + j] * inv))
                    codes[r, b, j] = np.uint8(q & 0xFF)
                continue
            amax = np.float32(0.0)
            mx = np.float32(0.0)
            for j in range(32):
                v = x[r, o + j]
                if amax < abs(v):
                    amax = abs(v)
                    mx = v
            if qtype == Q4_0:                                   # Q4_0
                dd = mx / np.float32(-8.0)
                inv = np.float32(1.0) / dd if dd != 0 else np.float32(0.0)
                d[r, b] = dd
                for j in range(16):
                    u0 = min(15, int(x[r, o + j] * inv + np.float32(8.5)))
                    u1 = min(15, int(x[r, o + 16 + j] * inv + np.float32(8.5)))
                    codes[r, b, j] = np.uint8(u0 | (u1 << 4))
            else:                                              # Q5_0
                dd = mx / np.float32(-16.0)
                inv = np.float32(1.0) / dd if dd != 0 else np.float32(0.0)
                d[r, b] = dd
                qh = 0
                for j in range(16):
                    u0 = min(31, int(x[r, o + j] * inv + np.float32(16.5)))
                    u1 = min(31, int(x[r, o + 16 + j] * inv + np.float32(16.5)))
                    codes[r, b, 4 + j] = np.uint8((u0 & 15) | ((u1 & 15) << 4))
                    qh |= ((u0 >> 4) & 1) << j
                    qh |= ((u1 >> 4) & 1) << (j + 16)
                for i in range(4):
                    codes[r, b, i] = np.uint8((qh >> (8 * i)) & 0xFF)


def quantize(x: np.ndarray, qtype: int) -> np.ndarray:
    """float32 (N, K), K a multiple of 32 -> uint8 (N, K / 32 * type_size) rows of qtype
    (Q4_0, Q5_0 or Q8_0), laid out as the GGUF file stores them (formats.py)."""
    if qtype not in TARGETS:
        raise ValueError(f"cannot quantize to ggml type {qtype}")
    x = np.ascontiguousarray(x, dtype=np.float32)
    if x.ndim != 2 or x.shape[1] % QK8:
        raise ValueError(f"quantize needs (N, K) rows with K a multiple of {QK8}, got {x.shape}")
    fmt = FORMATS[qtype]
    n, nb = x.shape[0], x.shape[1] // QK8
    codes = np.empty((n, nb, fmt.type_size - 2), dtype=np.uint8)     # what follows fp16 d
    d = np.empty((n, nb), dtype=np.float32)                          # (N, nb)
    _quantize_rows(x, codes, d, qtype)
    out = np.empty((n, nb, fmt.type_size), dtype=np.uint8)           # (N, nb, block bytes)
    out[:, :, :2] = d.astype(np.float16).view(np.uint8).reshape(n, nb, 2)
    out[:, :, 2:] = codes
    return out.reshape(n, nb * fmt.type_size)


def requantize(w: np.ndarray, src: int, dst: int, k: int) -> np.ndarray:
    """Raw rows w of ggml type src (N, ·), k values each -> a new uint8 (N, ·) array of the
    same rows in type dst: dequantized to float32 CHUNK_ROWS rows at a time, then quantize()."""
    fmt = FORMATS[dst]
    n = w.shape[0]
    out = np.empty((n, fmt.row_bytes(k)), dtype=np.uint8)
    for r0 in range(0, n, CHUNK_ROWS):
        r1 = min(n, r0 + CHUNK_ROWS)
        x = np.empty((r1 - r0, k), dtype=np.float32)                 # (rows, K)
        _GET_ROWS[src](w, np.arange(r0, r1, dtype=np.int64), x)
        out[r0:r1] = quantize(x, dst)
    return out
