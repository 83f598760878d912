"""Legacy-quant weights repacked into 8-row records: the same bytes, read as one stream.

``legacy.py`` reads a tile of 8 or 16 weight rows block by block, each row ``row_bytes``
apart: R interleaved streams, which the hardware prefetchers follow poorly, and a transpose
of every block before the dot products.  When the weights sit in process memory
(``--no-mmap``) a tensor can be rewritten once at load into records that hold exactly
the same bytes in the order the tile consumes them:

    record (t, b), at byte (t * nb + b) * REC[qtype], for rows 8t .. 8t+7 and block b:
        d      8 x fp16            the rows' scales                        16 B
        m      8 x fp16            the rows' mins (Q4_1 / Q5_1 only)        16 B
        masks  8 x u32             Q5 formats: bit 4r+i of mask c = the     32 B
                                   fifth bit of element 4c+i of row r
        codes  4 x (8 x 4 B)       4/5-bit: vector j, lane r = qs bytes     128 B
                                   4j..4j+3 of row r (low nibbles: elements 4j+i,
                                   high: 16+4j+i)
               8 x (8 x 4 B)       Q8_0: vector c, lane r = bytes 4c..4c+3  256 B
                                   of row r, xor 0x80 (the unsigned code u)

REC = 8 x the block size (144 / 160 / 176 / 192 / 272 B), so the records of 8 rows fill
exactly the bytes of those rows: a repacked tensor keeps its shape (N, nb * block) and
byte count (rows 8t .. 8t+7 hold the records of stream t) and is rewritten in place.
The tile decodes a record with aligned loads, no transpose and, for the fifth bits, one
masked byte add per column; the integer dot products and the float updates are those of
legacy_ir.emit_tile, in the same order, so results are the same bits as the GGUF layout's.
Repacked types are numbered ``REPACKED[qtype] = 0x100 | qtype`` (never a ggml type).

The tiles (legacy_amx) read the same records; kernels/registry.py binds both to the
``REPACKED`` ids.
"""
from __future__ import annotations

import numpy as np
from numba import njit, prange, types
from numba.extending import intrinsic

from . import drivers, legacy
from .checks import frozen
from .formats import FORMATS, LEGACY, Q8_0
from .ir import arg_readers, I64, have_vnni256, join, prefetch
from .legacy_ir import Decoded, emit_tile
from .q8_act import QK8, q8_rows
from .records import REC, decode_record

REPACKED = {qt: 0x100 | qt for qt in LEGACY}
M_CHUNK = 32                     # activation rows per pass over a record (as legacy.M_CHUNK)


def repack(w: np.ndarray, qtype: int) -> np.ndarray:
    """GGUF rows (N, nb * block) uint8 -> a new array of the same shape holding the records
    (module docstring): stream t (records (t, 0 .. nb-1)) in rows 8t .. 8t+7."""
    fmt = FORMATS[qtype]
    bb, qh_at, qs_at, mins = fmt.type_size, fmt.qh_offset, fmt.qs_offset, fmt.has_min
    if w.dtype != np.uint8 or w.ndim != 2 or w.shape[0] % 8 or w.shape[1] % bb:
        raise ValueError(f"cannot repack a {w.dtype} {w.shape} array as {fmt.name}")
    out = np.empty_like(w)
    _repack(np.ascontiguousarray(w).reshape(-1), out.reshape(-1), w.shape[0] // 8,
            w.shape[1] // bb, bb, -1 if qh_at is None else qh_at, qs_at, mins, qtype == Q8_0)
    return out


@njit(cache=True, nogil=True, parallel=True)
def _repack(w, out, n_streams, nb, bb, qh_at, qs_at, mins, q8):
    """Byte moves of repack: w, out flat uint8; qh_at < 0 when the format has no fifth bits."""
    rec = 8 * bb
    for t in prange(n_streams):
        for b in range(nb):
            o = (t * nb + b) * rec                       # the record
            for r in range(8):
                i = ((8 * t + r) * nb + b) * bb          # block b of row 8t + r
                out[o + 2 * r] = w[i]                    # d
                out[o + 2 * r + 1] = w[i + 1]
                if mins:
                    out[o + 16 + 2 * r] = w[i + 2]       # m
                    out[o + 17 + 2 * r] = w[i + 3]
            pos = o + (32 if mins else 16)
            if qh_at >= 0:
                for c in range(8):                       # mask c, bits 4r .. 4r+3 from row r
                    mask = 0
                    for r in range(8):
                        i = ((8 * t + r) * nb + b) * bb + qh_at
                        qh = (np.int64(w[i]) | (np.int64(w[i + 1]) << 8) | (np.int64(w[i + 2]) << 16)
                              | (np.int64(w[i + 3]) << 24))
                        mask |= ((qh >> (4 * c)) & 15) << (4 * r)
                    for j in range(4):
                        out[pos + 4 * c + j] = np.uint8((mask >> (8 * j)) & 255)
                pos += 32
            n_vec = 8 if q8 else 4                       # code vectors of 8 rows x 4 bytes
            for v in range(n_vec):
                for r in range(8):
                    i = ((8 * t + r) * nb + b) * bb + qs_at + 4 * v
                    for j in range(4):
                        out[pos + 32 * v + 4 * r + j] = (w[i + j] ^ np.uint8(0x80)) if q8 else w[i + j]


@njit(cache=True, nogil=True, parallel=True)
def _unpack_rows(w, out, rows, nb, bb, qh_at, qs_at, mins, q8):
    """The inverse of _repack for some rows: w flat uint8 records -> out (len(rows), nb * bb)
    uint8, the GGUF bytes of row rows[k] in out[k]."""
    rec = 8 * bb
    for k in prange(rows.shape[0]):
        t, r = rows[k] // 8, rows[k] % 8
        for b in range(nb):
            o = (t * nb + b) * rec                       # the record
            i = b * bb                                   # block b of out[k]
            out[k, i] = w[o + 2 * r]                     # d
            out[k, i + 1] = w[o + 2 * r + 1]
            if mins:
                out[k, i + 2] = w[o + 16 + 2 * r]        # m
                out[k, i + 3] = w[o + 17 + 2 * r]
            pos = o + (32 if mins else 16)
            if qh_at >= 0:
                qh = np.int64(0)
                for c in range(8):                       # bits 4r .. 4r+3 of mask c
                    m = (np.int64(w[pos + 4 * c]) | (np.int64(w[pos + 4 * c + 1]) << 8)
                         | (np.int64(w[pos + 4 * c + 2]) << 16) | (np.int64(w[pos + 4 * c + 3]) << 24))
                    qh |= ((m >> (4 * r)) & 15) << (4 * c)
                for j in range(4):
                    out[k, i + qh_at + j] = np.uint8((qh >> (8 * j)) & 255)
                pos += 32
            for v in range(8 if q8 else 4):
                for j in range(4):
                    c = w[pos + 32 * v + 4 * r + j]
                    out[k, i + qs_at + 4 * v + j] = (c ^ np.uint8(0x80)) if q8 else c


def unpack_rows(w: np.ndarray, qtype: int, rows: np.ndarray) -> np.ndarray:
    """Rows ``rows`` (int64) of a repacked tensor w -> their GGUF bytes (len(rows), row_bytes)."""
    fmt = FORMATS[qtype]
    out = np.empty((len(rows), w.shape[1]), np.uint8)
    _unpack_rows(np.ascontiguousarray(w).reshape(-1), out, np.asarray(rows, np.int64),
                 w.shape[1] // fmt.type_size, fmt.type_size,
                 -1 if fmt.qh_offset is None else fmt.qh_offset, fmt.qs_offset, fmt.has_min,
                 qtype == Q8_0)
    return out


def _get_rows_fn(qtype: int):
    def get_rows(w: np.ndarray, ids: np.ndarray, out: np.ndarray) -> None:
        """w uint8 (N, row_bytes) repacked, ids int64 (M,) -> out float32 (M, K), in place:
        the distinct rows unpacked to the GGUF bytes, then the format's own row lookup."""
        ids = np.asarray(ids, dtype=np.int64)
        if ids.size and (ids.min() < 0 or ids.max() >= w.shape[0]):
            raise IndexError(f"row id out of range [0, {w.shape[0]})")
        uniq, where = np.unique(ids, return_inverse=True)
        tmp = np.empty((len(uniq), out.shape[1]), np.float32)
        legacy.GET_ROWS[qtype](unpack_rows(w, qtype, uniq), np.arange(len(uniq), dtype=np.int64), tmp)
        out[...] = tmp[where]
    get_rows.__name__ = f"get_rows_{FORMATS[qtype].name.lower()}_repacked"
    return get_rows


PREFETCH_BYTES = 1024   # how far ahead in each record stream the tile prefetches
# 16-row tiles for M > 1 only with 256-bit vpdpbusd (AVX2: docs/architecture.md, "Tuned constants")
WIDE_TILES = have_vnni256()


def make_tile(qtype: int, rows: int):
    """Tile intrinsic over ``rows`` (8 or 16) repacked rows: records at byte t0 + b*REC (and,
    for 16 rows, the next 8-row stream nb*REC further on); otherwise as legacy_ir's tile."""
    rec, vnni = REC[qtype], have_vnni256()

    @intrinsic
    def tile(typingctx, w, t0, b, xq, xsum, xd, xs, k, nb, m0, m1, acc, acc0, acc_ms):
        sig = types.void(w, t0, b, xq, xsum, xd, xs, k, nb, m0, m1, acc, acc0, acc_ms)

        def codegen(context, builder, signature, args):
            data, as_i64 = arg_readers(context, builder, signature, args)

            wp, nb_ = data(0), as_i64(8)
            offs = [builder.add(as_i64(1), builder.mul(as_i64(2), I64(rec)))]
            if rows == 16:
                offs.append(builder.add(offs[0], builder.mul(nb_, I64(rec))))
            for o in offs:
                for line in range((rec + 63) // 64):
                    prefetch(builder, builder.gep(wp, [builder.add(o, I64(PREFETCH_BYTES + 64 * line))]))
            decs = [decode_record(builder, wp, o, qtype) for o in offs]
            dec = decs[0]
            if rows == 16:
                hi = decs[1]
                dec = Decoded([join(builder, a, c) for a, c in zip(dec.cols, hi.cols)], dec.off,
                              join(builder, dec.d, hi.d),
                              None if dec.m is None else join(builder, dec.m, hi.m))
            ptrs = (data(3), data(4), data(5), data(6), data(11))
            ints = (as_i64(2), as_i64(7), nb_, as_i64(9), as_i64(10), as_i64(12), as_i64(13))
            emit_tile(builder, dec, vnni, ptrs, ints)
            return context.get_dummy_value()

        return sig, codegen

    return tile


# -------------------------------------------------------------------------------- driver
# _blocks(rows * 256 + qtype, nb, w, t0, xq, xsum, xd, xs, k, m0, m1, acc, acc0, acc_ms): all nb
# records, in order, of the tile of `rows` (8 or 16) rows whose stream starts at byte t0; adds
# into acc[acc0 + m*acc_ms + r] for m0 <= m < m1, r < rows (flat arrays).
_TILES = {rows * 256 + qt: make_tile(qt, rows) for rows in (8, 16) for qt in LEGACY}
_blocks = drivers.loops(globals(), "_blocks", _TILES, "w, t0, xq, xsum, xd, xs, k, m0, m1, acc, acc0, acc_ms",
                        "w, t0, i, xq, xsum, xd, xs, k, n, m0, m1, acc, acc0, acc_ms")


@njit(cache=True, nogil=True, parallel=True)
def _matmul_records(qtype, w, xq, xsum, xd, xs, out):
    """out (M, N) from Q8 activations and repacked w (N, row_bytes): prange over tiles of 8
    rows for one activation row, of 16 rows (two record streams) for more, the last 8 rows
    of an odd number of streams in an 8-row tile."""
    m_rows, k = xq.shape
    n = out.shape[1]
    stream = 8 * w.shape[1]                      # bytes of one 8-row record stream
    wf, xqf, outf = w.reshape(-1), xq.reshape(-1), out.reshape(-1)
    xsumf, xdf, xsf = xsum.reshape(-1), xd.reshape(-1), xs.reshape(-1)
    rows = 16 if m_rows > 1 and WIDE_TILES else 8
    n_tiles = n // rows
    n_all = (n + rows - 1) // rows               # + one 8-row tile when 16 does not divide N
    for t in prange(n_all):
        n0 = t * rows
        r_t = rows if t < n_tiles else 8
        for m0 in range(0, m_rows, M_CHUNK):
            m1 = min(m_rows, m0 + M_CHUNK)
            for m in range(m0, m1):
                for r in range(r_t):
                    out[m, n0 + r] = np.float32(0.0)
            _blocks(r_t * 256 + qtype, k // QK8, wf, (n0 // 8) * stream, xqf, xsumf, xdf, xsf, k, m0, m1,
                    outf, n0, n)


@njit(cache=True, nogil=True)
def _matmul_quant(qtype, w, x, out):
    """Quantize x (float32 (M, K)) to Q8_0/Q8_1 blocks and run the record matmul into out."""
    xq, xd, xsum, xs = q8_rows(x)
    _matmul_records(qtype, w, xq, xsum, xd, xs, out)


def _make(qtype: int):
    def matmul(w: np.ndarray, x: np.ndarray, out: np.ndarray) -> None:
        legacy.check(qtype, w, x, out, rows=8)
        _matmul_quant(qtype, frozen(w), x, out)
    return matmul


MATMUL = {qt: _make(qt) for qt in LEGACY}               # qtype -> fn(w, x, out) on its records
GET_ROWS = {qt: _get_rows_fn(qt) for qt in LEGACY}      # qtype -> fn(w, ids, out) on its records
