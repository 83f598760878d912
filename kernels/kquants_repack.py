"""K-quant super-blocks repacked in the kernels' lane order: the same bytes, decoded without gathers.

kquants_ir decodes a super-block into four vectors V_k (k < 4) of 16 int32 lanes, lane L
holding the unsigned codes u of the values 16L+4k … 16L+4k+3 (one byte each).  In the GGUF
layout those bytes sit 32 or 64 bytes apart, so every V_k is a dword gather: one
``vpermt2d`` with AVX-512, about three instructions per half with AVX2.  When the weights
sit in process memory a tensor can be rewritten once at load, block by block, so that the
codes lie in the V_k order (``repack``); the header fields (d, dmin, the scales) stay
where ggml's structs put them, so a block keeps its size and a row its bytes:

    value v = 16L + 4k + i   (L < 16, k < 4, i < 4),  L' = L mod 8,  h = L div 8
    Q4_K  qs  (bytes 16 … 143):  nibble h of byte 16 + 32k + 4L' + i
    Q5_K  qs  (bytes 48 … 175):  nibble h of byte 48 + 32k + 4L' + i   (the low 4 bits)
          qh  (bytes 16 … 47):   bit 2k + h of byte 16 + 4L' + i       (the fifth bit)
    Q6_K  ql  (bytes 0 … 127):   nibble h of byte 32k + 4L' + i        (the low 4 bits)
          qh  (bytes 128 … 191): bits 2k, 2k+1 of byte 128 + 32h + 4L' + i  (the high 2)

So V_k is the 32 bytes of chunk k masked (lanes 0-7) and shifted (lanes 8-15), or-ed with
the high bits shifted into place (kquants_ir ``REPACKED_DECODERS``): the codes, scales and
float operations are exactly those of the GGUF layout, hence the same bits.  Rows stay
independent (the blocks of a row are its own), so a head can still be cut at any row.
Repacked types are numbered ``0x100 | qtype``, as kernels/repack.py's legacy records.
kernels/repack.py's ``GET_ROWS`` reads rows of a repacked table by undoing the move (``unpack``).
"""
from __future__ import annotations

import numpy as np
from numba import njit, prange

from . import kquants
from .formats import FORMATS, Q4_K, Q5_K, Q6_K, QK_K
from .kquants_ir import MATMUL_Q8K_REPACKED
from .q8k import quantize_q8_k

REPACKABLE = (Q4_K, Q5_K, Q6_K)
REPACKED = {qt: 0x100 | qt for qt in REPACKABLE}


def _moves(qtype: int) -> np.ndarray:
    """int64 (256 or 512, 5): one bit field per row, (source byte, source shift, mask,
    destination byte, destination shift): the low 4 bits of every value, then for Q5_K /
    Q6_K its high bits (GGUF layout as dequantize_row_q5_K / q6_K read it)."""
    rows = []
    for v in range(QK_K):
        L, k, i = v // 16, (v % 16) // 4, v % 4
        Lp, h = L % 8, L // 8
        if qtype == Q6_K:
            hh, s, l = v // 128, (v % 128) // 32, v % 32
            rows.append((64 * hh + 32 * (s % 2) + l, 4 * (s // 2), 15, 32 * k + 4 * Lp + i, 4 * h))
        else:
            j, l = v // 32, v % 32
            qs = 16 if qtype == Q4_K else 48
            rows.append((qs + 32 * (j // 2) + l, 4 * (j % 2), 15, qs + 32 * k + 4 * Lp + i, 4 * h))
    for v in range(QK_K):
        L, k, i = v // 16, (v % 16) // 4, v % 4
        Lp, h = L % 8, L // 8
        if qtype == Q5_K:
            rows.append((16 + v % 32, v // 32, 1, 16 + 4 * Lp + i, 2 * k + h))
        elif qtype == Q6_K:
            hh, s, l = v // 128, (v % 128) // 32, v % 32
            rows.append((128 + 32 * hh + l, 2 * s, 3, 128 + 32 * h + 4 * Lp + i, 2 * k))
    return np.array(rows, np.int64)


def _code_bytes(moves: np.ndarray, block_bytes: int) -> np.ndarray:
    """bool (block_bytes,): the bytes that hold codes (rewritten); the others are copied."""
    codes = np.zeros(block_bytes, np.bool_)
    codes[moves[:, 3]] = True
    return codes


MOVES = {qt: _moves(qt) for qt in REPACKABLE}
CODES = {qt: _code_bytes(MOVES[qt], FORMATS[qt].type_size) for qt in REPACKABLE}


@njit(cache=True, nogil=True, parallel=True)
def _move(src, dst, block_bytes, codes, moves, forward):
    """Every block of src (flat uint8) into dst: the code bytes (the same bytes in both
    layouts) rebuilt from `moves` (source -> destination fields when forward, destination
    -> source when not), the others copied."""
    n_blocks = src.shape[0] // block_bytes
    for b in prange(n_blocks):
        o = b * block_bytes
        for j in range(block_bytes):
            dst[o + j] = 0 if codes[j] else src[o + j]
        for r in range(moves.shape[0]):
            sb, ss, mask, db, ds = moves[r, 0], moves[r, 1], moves[r, 2], moves[r, 3], moves[r, 4]
            if not forward:
                sb, ss, db, ds = db, ds, sb, ss
            dst[o + db] |= ((src[o + sb] >> ss) & mask) << ds


@njit(cache=True, nogil=True)
def _pack_nibbles(s32, o32, at, ql: bool):
    """Dwords at + 8k + L' of o32 <- the low 4 bits of values 16L' + 4k + i (low nibbles)
    and 128 + 16L' + 4k + i (high nibbles), i < 4, from the dwords of s32 (one block, as
    uint32).  Their source: Q4_K / Q5_K qs (``ql`` False): byte 32(L' div 4) + 16(L' mod 2)
    + 4k + i, nibble (L' mod 4) div 2; Q6_K ql: byte 32((L' div 2) mod 2) + 16(L' mod 2)
    + 4k + i, nibble L' div 4; the value + 128 lies 64 bytes further."""
    for k in range(4):
        for lp in range(8):
            if ql:
                d, sh = 8 * ((lp // 2) % 2) + 4 * (lp % 2) + k, 4 * (lp // 4)
            else:
                d, sh = 8 * (lp // 4) + 4 * (lp % 2) + k, 4 * ((lp % 4) // 2)
            lo = (s32[at + d] >> sh) & 0x0F0F0F0F
            hi = (s32[at + d + 16] >> sh) & 0x0F0F0F0F
            o32[at + 8 * k + lp] = lo | (hi << 4)


@njit(cache=True, nogil=True, parallel=True)
def _repack_blocks(src, dst, bb, q5, q6, n_chunks):
    """repack's moves, format by format in 32-bit words (the same bytes as _move forward,
    in a few operations per dword): src, dst flat uint8; q5 / q6: the format is Q5_K /
    Q6_K (else Q4_K).  Each block is copied into an aligned buffer (Q6_K's 210 bytes
    leave its blocks unaligned) and the code dwords rebuilt there, so src may be dst."""
    n_blocks, padded = src.shape[0] // bb, (bb + 3) // 4 * 4
    for c in prange(n_chunks):
        sbuf, obuf = np.zeros(padded, np.uint8), np.zeros(padded, np.uint8)
        s32, o32 = sbuf.view(np.uint32), obuf.view(np.uint32)
        for b in range(c * n_blocks // n_chunks, (c + 1) * n_blocks // n_chunks):
            o = b * bb
            for j in range(bb):
                sbuf[j] = src[o + j]
                obuf[j] = src[o + j]                    # header; the codes are rewritten
            if q6:
                _pack_nibbles(s32, o32, 0, True)
                for h in range(2):                      # qh: dword 32 + 8h + L'
                    for lp in range(8):
                        w = np.uint32(0)
                        for k in range(4):
                            w |= ((s32[32 + 8 * h + 4 * (lp % 2) + k] >> (2 * (lp // 2)))
                                  & 0x03030303) << (2 * k)
                        o32[32 + 8 * h + lp] = w
            else:
                _pack_nibbles(s32, o32, 12 if q5 else 4, False)
                if q5:
                    for lp in range(8):                 # qh: dword 4 + L', bit 2k + h
                        w = np.uint32(0)
                        for k in range(4):
                            for h in range(2):
                                w |= ((s32[4 + 4 * (lp % 2) + k] >> (4 * h + lp // 2))
                                      & 0x01010101) << (2 * k + h)
                        o32[4 + lp] = w
            for j in range(bb):
                dst[o + j] = obuf[j]


def repackable(qtype: int) -> bool:
    return qtype in REPACKED


def _moved(w: np.ndarray, qtype: int, forward: bool) -> np.ndarray:
    bb = FORMATS[qtype].type_size
    if w.dtype != np.uint8 or w.ndim != 2 or w.shape[1] % bb or qtype not in MOVES:
        raise ValueError(f"cannot repack a {w.dtype} {w.shape} array as {FORMATS[qtype].name}")
    moves = MOVES[qtype]
    out = np.empty_like(w)
    _move(np.ascontiguousarray(w).reshape(-1), out.reshape(-1), bb, CODES[qtype], moves, forward)
    return out


def repack(w: np.ndarray, qtype: int, in_place: bool = False) -> np.ndarray:
    """GGUF rows (N, row_bytes) uint8 -> a new array of the same shape in the lane order
    (in_place: w itself, C-contiguous and writable, rewritten block by block)."""
    bb = FORMATS[qtype].type_size
    if w.dtype != np.uint8 or w.ndim != 2 or w.shape[1] % bb or qtype not in MOVES:
        raise ValueError(f"cannot repack a {w.dtype} {w.shape} array as {FORMATS[qtype].name}")
    if in_place and not (w.flags.c_contiguous and w.flags.writeable):
        raise ValueError("repack in place needs a C-contiguous writable array")
    out = w if in_place else np.empty_like(w)
    n_blocks = w.size // bb
    _repack_blocks(out.reshape(-1) if in_place else np.ascontiguousarray(w).reshape(-1),
                   out.reshape(-1), bb, qtype == Q5_K,
                   qtype == Q6_K, max(1, min(256, n_blocks // 64)))
    return out


def repack_by_table(w: np.ndarray, qtype: int) -> np.ndarray:
    """repack through the MOVES table, field by field (slower; the reference for repack)."""
    return _moved(w, qtype, True)


def unpack(w: np.ndarray, qtype: int) -> np.ndarray:
    """The inverse of repack: repacked rows -> the GGUF bytes."""
    return _moved(w, qtype, False)


def _matmul_fn(qtype: int):
    def matmul(w: np.ndarray, x: np.ndarray, out: np.ndarray) -> None:
        """w uint8 (N, row_bytes) repacked, x float32 (M, K) -> out float32 (M, N), in place."""
        xq, xd, xbs = quantize_q8_k(x)
        kquants.matmul_q8k(qtype, w, xq, xd, xbs, out, MATMUL_Q8K_REPACKED)
    matmul.__name__ = f"matmul_{FORMATS[qtype].name.lower()}_repacked"
    return matmul


MATMUL = {REPACKED[qt]: _matmul_fn(qt) for qt in REPACKABLE}      # repacked id -> fn(w, x, out)
