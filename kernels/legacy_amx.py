"""AMX matmul for the legacy quants (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0): many activation rows per tile.

The same numbers as legacy_ir's tile, bit for bit, with the integer dot products done by the
tile unit.  For a tile of 16 weight rows (n0 … n0+15) and each 32-element block b, in order:

1. decode the 16 rows' block once (legacy_ir's decoders): the unsigned codes u in the VNNI
   order of AMX's B operand (row c of B = codes 4c … 4c+3 of each of the 16 weight rows:
   exactly legacy_ir's column vectors), the scales d (and mins m);
2. for 16 or 32 activation rows at a time, ``tdpbsud``: C[m][r] = Σ_j xq[m, 32b+j] · u[r, j]
   (A = the Q8 activation codes, read in place from xq with a stride of K bytes);
3. per activation row m, the float update of legacy_ir.emit_tile, lane r = weight row:
       isum = C[m][r] - off · xsum[m, b]
       _0 formats:  acc += (d_w · d_x) · float(isum)
       _1 formats:  acc += ((d_w · d_x) · float(isum) + m_w · s_x)

The integers are exact, so whether ``vpdpbusd`` or the tile unit summed them cannot change a
bit, and the float operations per (row, m) are the same sequence, in the same block order:
out[m] is bitwise the VNNI path's, whatever M is (tests/kernels/test_amx.py).

    w    uint8 (N, row_bytes) raw GGUF rows, or repack.py's 8-row records (the draft's
         requantized weights, a --no-mmap file's); N % 16 rows go through the VNNI tile
    x    float32 (M, K), K % 32 == 0;  out float32 (M, N)
"""
from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import get_num_threads, njit, prange, types
from numba.extending import intrinsic

from . import amx, drivers
from .formats import FORMATS, LEGACY, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0
from numba.core import cgutils

from .ir import arg_readers, F32, I32, I64, V16F32, V16I32, join, load_at, splat, store_at
from .legacy_ir import DECODERS, Decoded
from .q8_act import QK8, q8_rows
from .records import REC, decode_record

ROWS = 16                       # weight rows per tile (the 16 int32 columns of C)
M_TILE = 16                     # activation rows per A tile
# With SPECDEC_KERNELS=amx (cpu.tiles()), passes of at least MIN_M rows take the tiles
# (benchmarks/amx_rows.py: 0.85-1.5x the VNNI tile from 16 rows on, run to run; below, slower).
MIN_M = {Q4_0: 16, Q5_0: 16, Q8_0: 16}
M_CHUNK = 64                    # activation rows per pass over a tile's blocks (legacy.M_CHUNK is 32)
GROUP = 4                       # blocks whose dots are all issued before the first is read
CONFIG = amx.tile_config({0: (16, 64), 4: (16, 64),      # C: 16 rows x 16 int32
                          1: (16, 32), 5: (16, 32),      # A: 16 rows x one block of xq
                          2: (8, 64)})                   # B: 8 rows of 16 x 4 codes


def _make_decode(qtype: int, repacked: bool = False):
    """decode(w, row0, rs, b, bbuf, dbuf, mbuf): block b of the 16 rows at row0 + r·rs into
    bbuf (uint8 512: B in the VNNI order), dbuf and mbuf (float32 16).  repacked: w holds
    repack.py's 8-row records, rows row0 … row0+15 being two record streams (the second
    8·rs bytes after the first)."""
    decoder, block_bytes = DECODERS[qtype], FORMATS[qtype].type_size
    if repacked:
        block_bytes = REC[qtype]

    @intrinsic
    def decode(typingctx, w, row0, rs, b, bbuf, dbuf, mbuf):
        sig = types.void(w, row0, rs, b, bbuf, dbuf, mbuf)

        def codegen(context, builder, signature, args):
            data, as_i64 = arg_readers(context, builder, signature, args)
            row0_, rs_, b_ = (as_i64(i) for i in (1, 2, 3))
            blk = builder.add(row0_, builder.mul(b_, I64(block_bytes)))
            if repacked:
                lo = decode_record(builder, data(0), blk, qtype)
                hi = decode_record(builder, data(0), builder.add(blk, builder.mul(rs_, I64(8))), qtype)
            else:
                offs = [builder.add(blk, builder.mul(rs_, I64(r))) for r in range(ROWS)]
                lo, hi = decoder(builder, data(0), offs[:8]), decoder(builder, data(0), offs[8:])
            dec = Decoded([join(builder, a, c) for a, c in zip(lo.cols, hi.cols)], lo.off,
                          join(builder, lo.d, hi.d), None if lo.m is None else join(builder, lo.m, hi.m))
            bp = data(4)
            for c, col in enumerate(dec.cols):
                store_at(builder, builder.bitcast(col, ir.VectorType(ir.IntType(8), 64)), bp, I64(64 * c))
            store_at(builder, dec.d, data(5), I64(0), 4)
            if dec.m is not None:
                store_at(builder, dec.m, data(6), I64(0), 4)
            return context.get_dummy_value()

        return sig, codegen

    return drivers.keyed(decode, f"legacy_amx.decode.{qtype}.{repacked}")


_OFF = {Q4_0: 8, Q4_1: 0, Q5_0: 16, Q5_1: 0, Q8_0: 128}     # w = u - off (legacy_ir's decoders)


def _make_update(off: int, has_min: bool):
    """update(out, n0, m0, m1, b, nb, cbuf, dbuf, mbuf, xsum, xd, xs): step 3 for activation
    rows m0 <= m < m1 (C row m - m0 at cbuf[16 (m - m0) …]), in <16 x float> lanes: the
    operations of legacy_ir.emit_tile, in its order.  out float32 (M, N) and the activation
    arrays flat."""
    @intrinsic
    def update(typingctx, out, n0, m0, m1, b, nb, cbuf, dbuf, mbuf, xsum, xd, xs):
        sig = types.void(out, n0, m0, m1, b, nb, cbuf, dbuf, mbuf, xsum, xd, xs)

        def codegen(context, builder, signature, args):
            data, as_i64 = arg_readers(context, builder, signature, args)
            n = builder.extract_value(context.make_array(signature.args[0])(
                context, builder, args[0]).shape, 1)
            n0_, m0_, m1_, b_, nb_ = (as_i64(i) for i in range(1, 6))
            d = load_at(builder, data(7), I64(0), V16F32, 4)
            mv = load_at(builder, data(8), I64(0), V16F32, 4) if has_min else None
            with cgutils.for_range(builder, m1_, start=m0_) as loop:
                m = loop.index
                isum = load_at(builder, data(6), builder.mul(builder.sub(m, m0_), I64(ROWS)), V16I32, 4)
                mb = builder.add(builder.mul(m, nb_), b_)
                if off:
                    corr = builder.mul(load_at(builder, data(9), mb, I32, 4), I32(off))
                    isum = builder.sub(isum, splat(builder, corr, ROWS))
                dd = builder.fmul(d, splat(builder, load_at(builder, data(10), mb, F32, 4), ROWS))
                t = builder.fmul(dd, builder.sitofp(isum, V16F32))
                if has_min:
                    t = builder.fadd(t, builder.fmul(mv, splat(builder, load_at(builder, data(11), mb, F32, 4), ROWS)))
                at = builder.add(builder.mul(m, n), n0_)
                store_at(builder, builder.fadd(load_at(builder, data(0), at, V16F32, 4), t), data(0), at, 4)
            return context.get_dummy_value()

        return sig, codegen

    return drivers.keyed(update, f"legacy_amx.update.{off}.{has_min}")


def _make_driver(qtype: int, repacked: bool = False):
    decode, update = _make_decode(qtype, repacked), _make_update(_OFF[qtype], qtype in (Q4_1, Q5_1))

    @njit(cache=True, nogil=True, parallel=True)
    def driver(cfg, w, xq, xsum, xd, xs, m_rows, out, n_chunks):
        """Tiles of 16 weight rows under prange, one contiguous run of tiles per thread;
        xq is padded to a multiple of 16 rows (the rows past m_rows are zero);
        n_chunks <= the tiles."""
        n, rs = w.shape
        mp, k = xq.shape
        nb = k // QK8
        n_tiles = n // ROWS
        wf, xqf = w.reshape(-1), xq.reshape(-1)
        xsumf, xdf, xsf = xsum.reshape(-1), xd.reshape(-1), xs.reshape(-1)
        for c in prange(n_chunks):
            amx.load_config(cfg)                   # per thread: a worker starts with none
            bbuf = np.empty(GROUP * 512, np.uint8)
            dbuf = np.zeros(GROUP * ROWS, np.float32)
            mbuf = np.zeros(GROUP * ROWS, np.float32)
            cbuf = np.empty(GROUP * 2 * M_TILE * ROWS, np.int32)
            for t in range(c * n_tiles // n_chunks, (c + 1) * n_tiles // n_chunks):
                n0 = t * ROWS
                for m in range(m_rows):
                    for r in range(ROWS):
                        out[m, n0 + r] = np.float32(0.0)
                for mc in range(0, mp, M_CHUNK):         # activation rows whose sums stay in L1
                    for b0 in range(0, nb, GROUP):
                        g = min(GROUP, nb - b0)
                        for j in range(g):
                            decode(wf, n0 * rs, rs, b0 + j, bbuf[j * 512:], dbuf[j * ROWS:], mbuf[j * ROWS:])
                        for m0 in range(mc, min(mp, mc + M_CHUNK), 2 * M_TILE):
                            for j in range(g):         # all the group's dots before reading any
                                amx.load_b(bbuf, j * 512, 64)
                                a0, c0 = m0 * k + (b0 + j) * QK8, j * 8 * M_TILE * ROWS
                                if m0 + 2 * M_TILE <= mp:
                                    amx.dot_store2(xqf, a0, k, xqf, a0 + M_TILE * k, k,
                                                   cbuf, c0, 64, cbuf, c0 + 4 * M_TILE * ROWS, 64)
                                else:
                                    amx.dot_store(xqf, a0, k, cbuf, c0, 64)
                            for j in range(g):
                                update(out, n0, m0, min(m_rows, m0 + 2 * M_TILE), b0 + j, nb,
                                       cbuf[j * 2 * M_TILE * ROWS:], dbuf[j * ROWS:], mbuf[j * ROWS:],
                                       xsumf, xdf, xsf)
            amx.release()

    return driver


_DRIVERS = {(qt, rep): _make_driver(qt, rep) for qt in LEGACY for rep in (False, True)}


def matmul(qtype: int, w: np.ndarray, x: np.ndarray, out: np.ndarray, vnni_matmul,
           repacked: bool = False) -> None:
    """out = x · Wᵀ through the tiles (w, x, out checked by the caller); the last N mod 16
    weight rows through ``vnni_matmul(qtype, w_tail, x, out_tail)``.  repacked: w holds
    repack.py's 8-row records (N % 8 == 0; a last 8 rows go to vnni_matmul as a record
    stream of their own)."""
    if not amx.available():
        raise RuntimeError(f"AMX is not usable here: {amx.status()}")
    m_rows = x.shape[0]
    xq, xd, xsum, xs = q8_rows(x)
    mp = -(-m_rows // M_TILE) * M_TILE
    if mp != m_rows:
        xq = np.concatenate([xq, np.zeros((mp - m_rows, xq.shape[1]), np.int8)])
    n_full = w.shape[0] // ROWS * ROWS
    if n_full:
        _DRIVERS[qtype, repacked](CONFIG, w, xq, xsum, xd, xs, m_rows, out,
                                  max(1, min(get_num_threads(), n_full // ROWS)))
    if n_full < w.shape[0]:
        tail = np.empty((m_rows, w.shape[0] - n_full), np.float32)
        vnni_matmul(qtype, w[n_full:], x, tail)
        out[:, n_full:] = tail
