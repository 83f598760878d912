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


def _vectors(u: np.ndarray) -> np.ndarray:
    """u (T, 16, nb, 256) codes (any bits) -> (T, nb, 32, 64) bytes: vector 8c + t, byte 4r + i
    = low nibble of value 64c + 4t + i, high nibble of value 64c + 32 + 4t + i."""
    t_, _, nb, _ = u.shape
    v = (u & 15).astype(np.uint8).reshape(t_, ROWS, nb, 4, 2, 8, 4)   # (T, r, b, c, h, t, i)
    v = v[..., 0, :, :] | (v[..., 1, :, :] << 4)                      # (T, r, b, c, t, i)
    return v.transpose(0, 2, 3, 4, 1, 5).reshape(t_, nb, 32, 64)


def _codes(vec: np.ndarray) -> np.ndarray:
    """The inverse of _vectors: (T, nb, 32, 64) -> the low 4 bits (T, 16, nb, 256)."""
    t_, nb = vec.shape[:2]
    v = vec.reshape(t_, nb, 4, 8, ROWS, 4)                            # (T, b, c, t, r, i)
    both = np.stack([v & 15, v >> 4], axis=3)                         # (T, b, c, h, t, r, i)
    return both.transpose(0, 5, 1, 2, 3, 4, 6).reshape(t_, ROWS, nb, QK_K)


def _high(u: np.ndarray, qtype: int) -> np.ndarray:
    """The bits above the low 4 -> Q5_K (T, nb, 8, 64) or Q6_K (T, nb, 16, 64) bytes."""
    t_, _, nb, _ = u.shape
    hi = (u >> 4).astype(np.uint8).reshape(t_, ROWS, nb, 4, 2, 8, 4)  # (T, r, b, c, h, t, i)
    if qtype == Q5_K:                                                  # bit 2c + h
        shift = (2 * np.arange(4)[:, None] + np.arange(2)).astype(np.uint8)[:, :, None, None]
        out = (hi << shift).sum(axis=(3, 4), dtype=np.uint8)          # (T, r, b, t, i)
        return out.transpose(0, 2, 3, 1, 4).reshape(t_, nb, 8, 64)
    shift = (2 * np.arange(4)).astype(np.uint8)[:, None, None, None]  # bits 2c, 2c + 1
    out = (hi << shift).sum(axis=3, dtype=np.uint8)                    # (T, r, b, h, t, i)
    return out.transpose(0, 2, 3, 4, 1, 5).reshape(t_, nb, 16, 64)


def _unhigh(hv: np.ndarray, qtype: int) -> np.ndarray:
    """The inverse of _high -> the bits above the low 4, (T, 16, nb, 256)."""
    t_, nb = hv.shape[:2]
    if qtype == Q5_K:
        v = hv.reshape(t_, nb, 1, 1, 8, ROWS, 4).astype(np.int32)     # (T, b, ·, ·, t, r, i)
        bits = (v >> (2 * np.arange(4)[:, None, None, None, None] + np.arange(2)[:, None, None, None])) & 1
    else:
        v = hv.reshape(t_, nb, 1, 2, 8, ROWS, 4).astype(np.int32)     # (T, b, ·, h, t, r, i)
        bits = (v >> (2 * np.arange(4))[:, None, None, None, None]) & 3
    return bits.transpose(0, 5, 1, 2, 3, 4, 6).reshape(t_, ROWS, nb, QK_K)   # (T, r, b, c, h, t, i)


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


def _records(qtype: int, w: np.ndarray) -> np.ndarray:
    """The records of the tiles of w (16T rows) -> uint8 (T, nb · RECORD)."""
    from .reference import kquant_parts                # the parts as ggml's dequantize reads them
    p = kquant_parts(qtype, w)
    t_, nb = w.shape[0] // ROWS, p.u.shape[1]

    def by_tile(a, dt):                                 # (N, nb, ·) -> (T, nb, ·, 16) bytes
        a = a.reshape(t_, ROWS, nb, -1).transpose(0, 2, 3, 1)
        return np.ascontiguousarray(a.astype(dt)).view(np.uint8).reshape(t_, nb, -1)

    u = p.u.reshape(t_, ROWS, nb, QK_K)
    if qtype == Q6_K:
        parts = [by_tile(p.d[..., None], np.float32), by_tile(p.sc, np.int8), _high(u, qtype).reshape(t_, nb, -1)]
    else:
        parts = [by_tile(p.d[..., None], np.float16), by_tile(p.dmin[..., None], np.float16),
                 by_tile(p.sc[..., ::2], np.uint8), by_tile(p.mn[..., ::2], np.uint8)]
        if qtype == Q5_K:
            parts.append(_high(u, qtype).reshape(t_, nb, -1))
    parts.append(_vectors(u).reshape(t_, nb, -1))
    return np.concatenate(parts, axis=-1).reshape(t_, nb * RECORD[qtype])


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
    """uint8 (T, nb · RECORD) records -> the GGUF rows uint8 (16 T, row_bytes), bit for bit."""
    t_ = wi.shape[0]
    nb = wi.shape[1] // RECORD[qtype]
    rec = wi.reshape(t_, nb, RECORD[qtype])

    def field(at, count, dt):                           # -> (N, nb, count) of dtype dt
        size = np.dtype(dt).itemsize * count * ROWS
        a = np.ascontiguousarray(rec[..., at:at + size]).view(dt).reshape(t_, nb, count, ROWS)
        return a.transpose(0, 3, 1, 2).reshape(t_ * ROWS, nb, count), at + size

    if qtype == Q6_K:
        d, at = field(0, 1, np.float32)
        sc, at = field(at, 16, np.int8)
        hi = _unhigh(rec[..., at:at + 1024].reshape(t_, nb, 16, 64), qtype)
        at += 1024
    else:
        d, at = field(0, 1, np.float16)
        dmin, at = field(at, 1, np.float16)
        sc, at = field(at, 8, np.uint8)
        mn, at = field(at, 8, np.uint8)
        hi = 0
        if qtype == Q5_K:
            hi = _unhigh(rec[..., at:at + 512].reshape(t_, nb, 8, 64), qtype)
            at += 512
    u = _codes(rec[..., at:at + 2048].reshape(t_, nb, 32, 64)).astype(np.int32) | (np.asarray(hi) << 4)
    u = u.reshape(t_ * ROWS, nb, QK_K)
    return _gguf_rows(qtype, u, sc, d, *((mn, dmin) if qtype != Q6_K else ()))


def _pack_scale_min_k4(sc: np.ndarray, mn: np.ndarray) -> np.ndarray:
    """The inverse of get_scale_min_k4: sc, mn (…, 8) 6-bit -> the 12 bytes (…, 12)."""
    sc, mn = sc.astype(np.uint8), mn.astype(np.uint8)
    return np.concatenate([(sc[..., :4] & 63) | ((sc[..., 4:] >> 4) << 6),
                           (mn[..., :4] & 63) | ((mn[..., 4:] >> 4) << 6),
                           (sc[..., 4:] & 15) | ((mn[..., 4:] & 15) << 4)], axis=-1)


def _gguf_rows(qtype, u, sc, d, mn=None, dmin=None) -> np.ndarray:
    """Codes and scales (N, nb, ·) -> GGUF blocks (N, nb · type_size) (ggml's block structs)."""
    n, nb, _ = u.shape
    f16 = lambda a: a.astype(np.float16).view(np.uint8).reshape(n, nb, 2)   # noqa: E731
    if qtype == Q6_K:
        v = u.reshape(n, nb, 2, 4, 32)                                       # (h, s, l)
        lo = (v & 15).astype(np.uint8)
        ql = np.concatenate([lo[:, :, :, 0] | (lo[:, :, :, 2] << 4), lo[:, :, :, 1] | (lo[:, :, :, 3] << 4)], -1)
        hi = (v >> 4).astype(np.uint8)
        qh = (hi << (2 * np.arange(4, dtype=np.uint8))[:, None]).sum(axis=3, dtype=np.uint8)   # (h, l)
        blk = [ql.reshape(n, nb, 128), qh.reshape(n, nb, 64), sc.astype(np.int8).view(np.uint8), f16(d)]
    else:
        v = u.reshape(n, nb, 4, 2, 32)                                       # (c, h, l)
        qs = ((v[:, :, :, 0] & 15) | ((v[:, :, :, 1] & 15) << 4)).astype(np.uint8).reshape(n, nb, 128)
        blk = [f16(d), f16(dmin), _pack_scale_min_k4(sc, mn)]
        if qtype == Q5_K:
            hb = (u.reshape(n, nb, 8, 32) >> 4).astype(np.uint8)             # (j, l)
            blk.append((hb << np.arange(8, dtype=np.uint8)[:, None]).sum(axis=2, dtype=np.uint8))
        blk.append(qs)
    out = np.concatenate(blk, axis=-1)
    assert out.shape[-1] == FORMATS[qtype].type_size
    return np.ascontiguousarray(out.reshape(n, nb * FORMATS[qtype].type_size))


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
