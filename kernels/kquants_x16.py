"""K-quant weights interleaved 16 rows at a time: the layout of the one-row and many-row kernels.

A tile is 16 consecutive weight rows; its super-blocks are stored one record each, tile after
tile, so that one 64-byte vector holds the same 4 consecutive values of all 16 rows:

    byte 4r + i of a code vector  =  value 4t + i of weight row r   (r < 16, i < 4)

``vpdpbusd`` of such a vector with one activation word (4 codes) broadcast to every lane leaves
in lane r the dot of weight row r: no gather, no horizontal sum, and the same 64 bytes are a
row of AMX's B operand (16 columns of 4 bytes).  The scales and mins are stored decoded, one
byte per (group, row), so a group's 16 scales are one ``vpmovzxbd`` away from a ``vpmulld``.

Records (one per tile and super-block; ``u`` the unsigned codes, value v = 64c + 32h + 4t + i
with c < 4 the 64-value chunk, h < 2 its half (sub-block 2c + h), t < 8 the word, i < 4):

    Q4_K  2368 B  d f16[16] | dmin f16[16] | sc u8[8][16] | mn u8[8][16] | qs[32][64]
    Q5_K  2880 B  d f16[16] | dmin f16[16] | sc u8[8][16] | mn u8[8][16] | qh[8][64] | qs[32][64]
    Q6_K  3392 B  d f32[16] | sc i8[16][16] | qh[16][64] | ql[32][64]

    qs / ql vector 8c + t, byte 4r + i:  low nibble  = u[r, 64c + 4t + i] & 15
                                          high nibble = u[r, 64c + 32 + 4t + i] & 15
    Q5_K qh vector t, byte 4r + i:        bit 2c + h  = u[r, 64c + 32h + 4t + i] >> 4
    Q6_K qh vector 8h + t, byte 4r + i:   bits 2c, 2c + 1 = u[r, 64c + 32h + 4t + i] >> 4

sc, mn: one per sub-block of 32 (Q4_K, Q5_K; get_scale_min_k4 decoded) or group of 16 (Q6_K,
signed); d, dmin exactly the file's (Q6_K's f16 d widened to f32: its record then fills 53 cache
lines).  Every record is a multiple of 64 bytes.  The array is uint8 (N/16, nb · record):
N % 16 == 0 (other tensors keep the row layouts).  ``interleave`` and ``deinterleave`` are exact
inverses (the GGUF bytes come back bit for bit); both are plain NumPy, run once at load.

The SIMD matmul (kquants_x16_ir) and row lookup on it; the layout's type id is
``INTERLEAVED[qtype] = 0x200 | qtype`` (never a ggml type; kernels/registry.py binds these and
kquants_x16_amx's tiles to it):

    matmul_q8k(qtype, wi, xq, xd, xbs, out)   out (M, N) from q8k.quantize_q8_k's activations
    MATMUL[qtype](wi, x, out)                 the same from float32 x (M, K)
    GET_ROWS[qtype](wi, ids, out)             rows ids dequantized, bit for bit ggml's get_rows
"""
from __future__ import annotations

import mmap

import numpy as np


from numba import get_num_threads

from . import kquants
from .checks import frozen
from .formats import FORMATS, Q5_K, Q6_K, QK_K
from . import kquants_x16_ir
from .kquants_x16_ir import MATMUL_Q8K, ROWS
from .q8k import quantize_q8_k

RECORD = kquants_x16_ir.RECORD                    # bytes per (tile, super-block)
INTERLEAVABLE = tuple(RECORD)
INTERLEAVED = {qt: 0x200 | qt for qt in INTERLEAVABLE}
CHUNK_TILES = 64                                  # tiles interleaved per step at load


def can_interleave(qtype: int, n_rows: int) -> bool:
    return qtype in RECORD and n_rows % ROWS == 0


def interleave(qtype: int, w: np.ndarray) -> np.ndarray:
    """uint8 (N, row_bytes) GGUF rows -> uint8 (N/16, nb · RECORD) records (module docstring),
    CHUNK_TILES tiles at a time (the temporaries stay in cache)."""
    n = w.shape[0]
    if not can_interleave(qtype, n):
        raise ValueError(f"{FORMATS[qtype].name} with {n} rows cannot be interleaved by {ROWS}")
    nb = w.shape[1] // FORMATS[qtype].type_size
    out = huge_empty((n // ROWS, nb * RECORD[qtype]))
    for t0 in range(0, n // ROWS, CHUNK_TILES):
        t1 = min(n // ROWS, t0 + CHUNK_TILES)
        out[t0:t1] = _records(qtype, np.ascontiguousarray(w[ROWS * t0:ROWS * t1]))
    return out


def _to_tiles(a: np.ndarray, t_: int, size: int) -> np.ndarray:
    """(16 T, nb, n) bytes of each row -> (T, nb, 16 n): unit j (``size`` bytes) of row r at
    byte size · (16 j + r), the rows of a tile side by side per unit."""
    nb, n = a.shape[1:]
    return a.reshape(t_, ROWS, nb, n // size, size).transpose(0, 2, 3, 1, 4).reshape(t_, nb, ROWS * n)


def _from_tiles(a: np.ndarray, size: int) -> np.ndarray:
    """The inverse of _to_tiles: (T, nb, 16 n) -> (16 T, nb, n)."""
    t_, nb, n = a.shape[0], a.shape[1], a.shape[2] // ROWS
    return a.reshape(t_, nb, n // size, ROWS, size).transpose(0, 3, 1, 2, 4).reshape(t_ * ROWS, nb, n)


def _records(qtype: int, w: np.ndarray) -> np.ndarray:
    """The records of the tiles of w (16T rows of GGUF blocks) -> uint8 (T, nb · RECORD).
    The GGUF qs (and Q5_K's qh) words are already the record's words (value 4t + i of a
    sub-block is byte 4t + i): they only move; Q6_K's ql / qh fields are regrouped by chunk."""
    t_, ts = w.shape[0] // ROWS, FORMATS[qtype].type_size
    b = w.reshape(t_ * ROWS, -1, ts)                                          # (N, nb, block)
    if qtype == Q6_K:
        ql = []                                                               # chunk c = 2h + k
        for h in (0, 1):
            lo, hi = b[..., 64 * h:64 * h + 32], b[..., 64 * h + 32:64 * h + 64]
            ql += [(lo & 15) | (hi << 4), (lo >> 4) | (hi & 0xF0)]             # values 64c + 4t + i, + 32
        ql = np.concatenate(ql, axis=-1)
        q0, q1 = b[..., 128:160], b[..., 160:192]                            # qh of halves 0, 1
        qh = np.concatenate([((q0 >> s) & 3) | (((q0 >> (s + 4)) & 3) << 2) | (((q1 >> s) & 3) << 4)
                             | (((q1 >> (s + 4)) & 3) << 6) for s in (0, 2)], axis=-1)
        d = np.ascontiguousarray(b[..., 208:210]).view(np.float16).astype(np.float32).view(np.uint8)
        parts = [_to_tiles(d, t_, 4), _to_tiles(b[..., 192:208], t_, 1), _to_tiles(qh, t_, 4),
                 _to_tiles(ql, t_, 4)]
    else:
        q = b[..., 4:16]                                                      # get_scale_min_k4's bytes
        sc = np.concatenate([q[..., 0:4] & 63, (q[..., 8:12] & 15) | ((q[..., 0:4] >> 6) << 4)], axis=-1)
        mn = np.concatenate([q[..., 4:8] & 63, (q[..., 8:12] >> 4) | ((q[..., 4:8] >> 6) << 4)], axis=-1)
        parts = [_to_tiles(b[..., 0:2], t_, 2), _to_tiles(b[..., 2:4], t_, 2), _to_tiles(sc, t_, 1),
                 _to_tiles(mn, t_, 1)] + ([_to_tiles(b[..., 16:48], t_, 4)] if qtype == Q5_K else [])
        parts.append(_to_tiles(b[..., ts - 128:], t_, 4))
    return np.concatenate(parts, axis=-1).reshape(t_, -1)


def huge_empty(shape: tuple[int, int]) -> np.ndarray:
    """An uninitialized uint8 array in anonymous memory advised for transparent huge pages
    (MADV_HUGEPAGE, where the kernel has it), 2 MiB aligned: a one-row pass streams the
    weights, and with 4 KiB pages a page walk every 4 KiB cost Qwen-1.5B's decode ~15%
    (the in-memory file is advised the same way, engine/gguf_file.read_into_memory)."""
    n = int(np.prod(shape))
    buf = mmap.mmap(-1, n + (2 << 20), flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    if hasattr(buf, "madvise") and hasattr(mmap, "MADV_HUGEPAGE"):
        try:
            buf.madvise(mmap.MADV_HUGEPAGE)
        except OSError:
            pass                                        # no THP here: ordinary pages
    raw = np.frombuffer(buf, np.uint8)
    at = -raw.ctypes.data % (2 << 20)
    return raw[at:at + n].reshape(shape)


def deinterleave(qtype: int, wi: np.ndarray) -> np.ndarray:
    """uint8 (T, nb · RECORD) records -> the GGUF rows uint8 (16 T, row_bytes), bit for bit:
    _records undone field by field."""
    t_ = wi.shape[0]
    rec = wi.reshape(t_, -1, RECORD[qtype])
    qs = _from_tiles(rec[..., -2048:], 4)                                     # the codes: the last 2 KB
    if qtype == Q6_K:
        ql = []
        for h in (0, 1):
            even, odd = qs[..., 64 * h:64 * h + 32], qs[..., 64 * h + 32:64 * h + 64]
            ql += [(even & 15) | (odd << 4), (even >> 4) | (odd & 0xF0)]
        r0, r1 = np.split(_from_tiles(rec[..., 320:1344], 4), 2, axis=-1)
        q0 = (r0 & 3) | ((r1 & 3) << 2) | (((r0 >> 2) & 3) << 4) | (((r1 >> 2) & 3) << 6)
        q1 = ((r0 >> 4) & 3) | (((r1 >> 4) & 3) << 2) | (((r0 >> 6) & 3) << 4) | (((r1 >> 6) & 3) << 6)
        d = np.ascontiguousarray(_from_tiles(rec[..., 0:64], 4)).view(np.float32).astype(np.float16)
        blocks = ql + [q0, q1, _from_tiles(rec[..., 64:320], 1), d.view(np.uint8)]
    else:
        sc, mn = _from_tiles(rec[..., 64:192], 1), _from_tiles(rec[..., 192:320], 1)
        scales = [(sc[..., :4] & 63) | ((sc[..., 4:] >> 4) << 6), (mn[..., :4] & 63) | ((mn[..., 4:] >> 4) << 6),
                  (sc[..., 4:] & 15) | ((mn[..., 4:] & 15) << 4)]           # get_scale_min_k4 undone
        blocks = [_from_tiles(rec[..., 0:32], 2), _from_tiles(rec[..., 32:64], 2)] + scales
        blocks += ([_from_tiles(rec[..., 320:832], 4)] if qtype == Q5_K else []) + [qs]
    return np.concatenate(blocks, axis=-1).reshape(t_ * ROWS, -1)


# ---------------------------------------------------------------------------- front door

def _check(qtype: int, wi: np.ndarray, k: int, m: int, out: np.ndarray) -> None:
    if wi.dtype != np.uint8 or wi.ndim != 2 or not wi.flags.c_contiguous:
        raise ValueError("interleaved K-quant weights must be a C-contiguous uint8 (N/16, ·) array")
    if k % QK_K or wi.shape[1] != k // QK_K * RECORD[qtype]:
        raise ValueError(f"interleaved {FORMATS[qtype].name}: records of {wi.shape[1]} bytes do not hold K={k}")
    if out.shape != (m, ROWS * wi.shape[0]) or out.dtype != np.float32 or not out.flags.c_contiguous:
        raise ValueError(f"out must be a C-contiguous float32 array of shape {(m, ROWS * wi.shape[0])}")


def matmul_q8k(qtype: int, wi: np.ndarray, xq: np.ndarray, xd: np.ndarray, xbs: np.ndarray,
               out: np.ndarray) -> None:
    """out (M, N) = x · Wᵀ from activations already quantized by q8k.quantize_q8_k."""
    nb, m = xd.shape
    if xq.shape != (nb, m, QK_K) or xbs.shape != (nb, m, 16) or xbs.dtype != np.int16 or not all(
            a.flags.c_contiguous for a in (xq, xd, xbs)):
        raise ValueError("activations must be as quantize_q8_k returns them")
    _check(qtype, wi, nb * QK_K, m, out)
    MATMUL_Q8K[qtype](frozen(wi), xq, xd, xbs, out, max(1, min(get_num_threads(), wi.shape[0])))


def matmul(qtype: int, wi: np.ndarray, x: np.ndarray, out: np.ndarray) -> None:
    """out (M, N) = x · Wᵀ, x float32 (M, K): quantized to Q8_K, then matmul_q8k."""
    matmul_q8k(qtype, wi, *quantize_q8_k(x), out)


def get_rows(qtype: int, wi: np.ndarray, ids: np.ndarray, out: np.ndarray) -> None:
    """out (len(ids), K) float32 = rows ids of W dequantized, bit for bit the GGUF lookup:
    the tiles holding them deinterleaved back to their GGUF rows, then kquants.GET_ROWS."""
    ids = np.asarray(ids, dtype=np.int64)
    if ids.size and (ids.min() < 0 or ids.max() >= ROWS * wi.shape[0]):
        raise IndexError(f"row id out of range [0, {ROWS * wi.shape[0]})")
    tiles, where = np.unique(ids // ROWS, return_inverse=True)
    rows = deinterleave(qtype, wi[tiles])                       # (16 · len(tiles), row_bytes)
    kquants.GET_ROWS[qtype](rows, where.reshape(-1) * ROWS + ids % ROWS, out)


def _front(qtype: int):
    def mm(w: np.ndarray, x: np.ndarray, out: np.ndarray) -> None:
        matmul(qtype, w, x, out)

    def gr(w: np.ndarray, ids: np.ndarray, out: np.ndarray) -> None:
        get_rows(qtype, w, ids, out)
    mm.__name__ = gr.__name__ = f"{FORMATS[qtype].key}_x16"
    return mm, gr


MATMUL = {qt: _front(qt)[0] for qt in INTERLEAVABLE}     # qtype -> fn(wi, x, out)
GET_ROWS = {qt: _front(qt)[1] for qt in INTERLEAVABLE}   # qtype -> fn(wi, ids, out)
