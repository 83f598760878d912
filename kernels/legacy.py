"""Matmul and row lookup for the non-K formats: F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0.

``MATMUL[qtype](w, x, out)``: out[m, n] = dot(W[n, :], x[m, :]) without ever building a
dequantized copy of W.  The plain NumPy statement of each: kernels/reference.legacy_dot
(quantized formats) and reference.float_dot (F32, F16, BF16).

* Q4_0 / Q5_0 / Q8_0: x is quantized to Q8_0 blocks and Q4_1 / Q5_1 to Q8_1 blocks
  (q8_act.py), then each 32-block contributes an exact int32 dot product scaled in
  float32, blocks added in order (legacy_ir.py documents the exact update, which is
  that of ggml's generic ``ggml_vec_dot_*_q8_*``).  The weights are walked in tiles of
  8 or 16 rows; a tile's blocks are decoded once per chunk of up to ``M_CHUNK``
  activation rows, so verifying M drafted tokens reads the weights once.
* F32 / F16 / BF16: the weight row is widened to float32 once (exact) and dotted with the
  float32 x using 32 interleaved float32 partial sums combined in a fixed tree
  (legacy_ir.dot32_lanes), then the K mod 32 tail in order.  ggml instead rounds x to
  fp16 / bf16 first; keeping x in float32 is more accurate.

Row independence: every float operation that produces out[m, n] depends only on x[m]
and W[n] and happens in the same order for any M, any tiling and any thread count, so
matmul(w, x)[m] == matmul(w, x[m:m+1])[0] bitwise.

``GET_ROWS[qtype](w, ids, out)``: rows ``ids`` dequantized exactly as
``gguf.quants.dequantize`` does (same float32 operations; NaN payloads aside).

Weight arrays, as ``gguf.GGUFReader(...).tensors[i].data`` holds them (zero-copy):
    F32 float32 (N, K) · F16 float16 (N, K) · BF16 and the quants uint8 (N, row_bytes)
"""
from __future__ import annotations

import numpy as np
from numba import njit, prange

from . import drivers
from .checks import check_activations, frozen
from .dequant_ir import GET_ROWS_DEQUANT
from .formats import F16, F32, FLOATS, FORMATS, LEGACY, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0
from .legacy_ir import DECODE_ROWS, TILE, TILE_Q5_0_DECODE, TILE_ROWS, dot32_lanes
from .q8_act import QK8, half_bits_to_f32, q8_rows

M_CHUNK = 32    # activation rows per pass over a decoded tile

_ROWS_Q4_0, _ROWS_Q4_1, _ROWS_Q5_0, _ROWS_Q5_1, _ROWS_Q8_0 = (
    TILE_ROWS[qt] for qt in (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0))
_DECODE = 0x100 | Q5_0          # the case of Q5_0's one-token tile (legacy_ir.DECODE_ROWS rows)


# ---------------------------------------------------------------- quantized matmul driver

@njit(cache=True, nogil=True)
def _tile_rows(qtype, m_rows):
    """Weight rows per tile of ``qtype`` for m_rows activation rows (legacy_ir.TILE_ROWS;
    Q5_0 decodes one token with legacy_ir.DECODE_ROWS)."""
    if qtype == Q4_0:
        return _ROWS_Q4_0
    if qtype == Q4_1:
        return _ROWS_Q4_1
    if qtype == Q5_0:
        return DECODE_ROWS if m_rows == 1 else _ROWS_Q5_0
    if qtype == Q5_1:
        return _ROWS_Q5_1
    return _ROWS_Q8_0


# _tile_blocks(case, nb, w, row0, rs, xq, xsum, xd, xs, k, m0, m1, acc, acc0, acc_ms): all nb
# blocks, in order, of the tile at byte row0 (row stride rs) of the format `case` (its qtype, or
# _DECODE); adds into acc[acc0 + m*acc_ms + r] for m0 <= m < m1, r < the tile's rows (flat arrays).
_tile_blocks = drivers.loops(globals(), "_tile_blocks", {**TILE, _DECODE: TILE_Q5_0_DECODE},
                             "w, row0, rs, xq, xsum, xd, xs, k, m0, m1, acc, acc0, acc_ms",
                             "w, row0, rs, i, xq, xsum, xd, xs, k, n, m0, m1, acc, acc0, acc_ms")


@njit(cache=True, nogil=True, parallel=True)
def _matmul_q8act(qtype, w, xq, xsum, xd, xs, out):
    """out (M, N) = W · xᵀ from Q8 activations.

    w uint8 (N, row_bytes); xq int8 (M, K); xsum int32, xd, xs float32 (M, K/32).
    prange over tiles of 8 or 16 rows; the last N mod rows go through a zero-padded tile.
    """
    n, rs = w.shape
    m_rows, k = xq.shape
    wf, xqf, outf = w.reshape(-1), xq.reshape(-1), out.reshape(-1)
    xsumf, xdf, xsf = xsum.reshape(-1), xd.reshape(-1), xs.reshape(-1)
    rows = _tile_rows(qtype, m_rows)
    case = _DECODE if qtype == Q5_0 and rows == DECODE_ROWS else qtype
    nb = k // QK8
    n_tiles = n // rows
    for t in prange(n_tiles):
        n0 = t * rows
        for m0 in range(0, m_rows, M_CHUNK):
            m1 = min(m_rows, m0 + M_CHUNK)
            for m in range(m0, m1):
                for r in range(rows):
                    out[m, n0 + r] = np.float32(0.0)
            _tile_blocks(case, nb, wf, n0 * rs, rs, xqf, xsumf, xdf, xsf, k, m0, m1, outf, n0, n)
    tail = n - n_tiles * rows
    if tail:
        pad = np.zeros((rows, rs), np.uint8)  # zero bytes: d = 0, the lanes are dropped
        pad[:tail] = w[n_tiles * rows:]
        acc = np.zeros(m_rows * rows, np.float32)
        _tile_blocks(case, nb, pad.reshape(-1), 0, rs, xqf, xsumf, xdf, xsf, k, 0, m_rows, acc, 0, rows)
        for m in range(m_rows):
            for r in range(tail):
                out[m, n_tiles * rows + r] = acc[m * rows + r]


@njit(cache=True, nogil=True)
def _matmul_quant(qtype, w, x, out):
    """Quantize x (float32 (M, K)) to Q8_0/Q8_1 and run the tiled matmul into out (M, N)."""
    xq, xd, xsum, xs = q8_rows(x)
    _matmul_q8act(qtype, w, xq, xsum, xd, xs, out)


# ------------------------------------------------------------------- float formats matmul

@njit(cache=True, nogil=True)
def _widen_row(kind, w, n, buf, bits):
    """Row n of w (raw bits, see _bits_view) -> buf float32 (K,) exactly; bits = buf as uint32."""
    k = buf.shape[0]
    if kind == F32:
        for i in range(k):
            bits[i] = w[n, i]
    elif kind == F16:  # w: uint16 fp16 bits, matches GGML_FP16_TO_FP32
        for i in range(k):
            buf[i] = half_bits_to_f32(w[n, i])
    else:  # BF16, w: uint16 bf16 bits, matches GGML_BF16_TO_FP32
        for i in range(k):
            bits[i] = np.uint32(w[n, i]) << np.uint32(16)


@njit(cache=True, nogil=True)
def dot_f32(a, xf, m, k):
    """dot(a (K,), x[m]) in float32, x flat (M*K,): legacy_ir.dot32_lanes on the first
    32*(K//32) values, then the K mod 32 tail added in order."""
    k32 = k - k % 32
    total = dot32_lanes(a, 0, xf, m * k, k // 32)
    for i in range(k32, k):
        total += a[i] * xf[m * k + i]
    return total


@njit(cache=True, nogil=True, parallel=True)
def _matmul_float(kind, w, x, out):
    """out (M, N) = W · xᵀ; w raw bits (N, K): uint32 for F32, uint16 for F16 / BF16."""
    n = w.shape[0]
    m_rows, k = x.shape
    xf = x.reshape(-1)
    n_chunks = min(n, 64)
    for c in prange(n_chunks):
        bits = np.empty(k, np.uint32)
        buf = bits.view(np.float32)
        for row in range(c * n // n_chunks, (c + 1) * n // n_chunks):
            _widen_row(kind, w, row, buf, bits)
            for m in range(m_rows):
                out[m, row] = dot_f32(buf, xf, m, k)


# --------------------------------------------------------------------------- row lookup

@njit(cache=True, nogil=True)
def _get_rows_float(kind, w, ids, out):
    """out (M, K) float32 = rows ids of w (raw bits (N, K), see _bits_view)."""
    bits = out.view(np.uint32)
    for i in range(ids.shape[0]):
        r = ids[i]
        for j in range(out.shape[1]):
            if kind == F32:
                bits[i, j] = w[r, j]
            elif kind == F16:
                out[i, j] = half_bits_to_f32(w[r, j])
            else:
                bits[i, j] = np.uint32(w[r, j]) << np.uint32(16)


# ------------------------------------------------------------------------- public tables

def _row_ids(ids, n: int, out: np.ndarray, k: int) -> np.ndarray:
    """Validate a row lookup: ids within [0, n), out a C-contiguous float32 (len(ids), k)."""
    ids = np.asarray(ids, np.int64).reshape(-1)
    if ids.size and (ids.min() < 0 or ids.max() >= n):
        raise IndexError(f"row ids must lie in [0, {n})")
    if out.dtype != np.float32 or out.shape != (ids.size, k) or not out.flags.c_contiguous:
        raise ValueError(f"out must be a C-contiguous float32 array of shape {(ids.size, k)}")
    return ids


def _bits_view(kind: int, w: np.ndarray, k: int) -> np.ndarray:
    """Zero-copy raw bits (N, K): F32 -> uint32; F16 (float16), BF16 (uint8 (N, 2K)) -> uint16."""
    w = frozen(w)
    bits = w.view(np.uint32 if kind == F32 else np.uint16)
    if bits.shape != (w.shape[0], k):
        raise ValueError(f"{FORMATS[kind].name} weight {w.shape} does not have rows of {k} values")
    return bits


def check(qtype: int, w: np.ndarray, x: np.ndarray, out: np.ndarray, rows: int = 1) -> None:
    """ValueError (one line) unless w (N, row_bytes) of a legacy quant (in records of `rows`
    rows, N a multiple) fits x (M, K) and out (M, N)."""
    check_activations(x, out, w.shape[0])
    if w.shape[1] != x.shape[1] // QK8 * FORMATS[qtype].type_size or x.shape[1] % QK8 or w.shape[0] % rows:
        raise ValueError(f"{FORMATS[qtype].name} weight {w.shape} does not match x {x.shape}")


def _quant_matmul(qtype: int):
    def matmul(w: np.ndarray, x: np.ndarray, out: np.ndarray) -> None:
        check(qtype, w, x, out)
        _matmul_quant(qtype, frozen(w), x, out)
    return matmul


def _float_matmul(kind: int):
    def matmul(w: np.ndarray, x: np.ndarray, out: np.ndarray) -> None:
        check_activations(x, out, w.shape[0])
        _matmul_float(kind, _bits_view(kind, w, x.shape[1]), x, out)
    return matmul


def _quant_get_rows(qtype: int):
    block_bytes, kernel = FORMATS[qtype].type_size, GET_ROWS_DEQUANT[qtype]   # dequant_ir's decoder

    def get_rows(w: np.ndarray, ids: np.ndarray, out: np.ndarray) -> None:
        k = w.shape[1] // block_bytes * QK8
        ids = _row_ids(ids, w.shape[0], out, k)
        kernel(frozen(w), ids, out)
    return get_rows


def _float_get_rows(kind: int):
    def get_rows(w: np.ndarray, ids: np.ndarray, out: np.ndarray) -> None:
        bits = _bits_view(kind, w, out.shape[1])
        _get_rows_float(kind, bits, _row_ids(ids, w.shape[0], out, out.shape[1]), out)
    return get_rows


MATMUL = {**{qt: _quant_matmul(qt) for qt in LEGACY}, **{kind: _float_matmul(kind) for kind in FLOATS}}
GET_ROWS = {**{qt: _quant_get_rows(qt) for qt in LEGACY}, **{kind: _float_get_rows(kind) for kind in FLOATS}}
