"""AMX matmul for the K-quants (Q2_K … Q6_K): the integer sums of 16 x 16 (weight row,
activation row) pairs per super-block on the tile unit, bitwise the VNNI path's numbers.

The K-quant contract (kquants_ir) needs, per super-block b and pair (n, m), two exact
integers, isum = Σ_v sc[g]·(u_v − off)·xq_v and imin = Σ_v mn[g]·xq_v, then the same float
operations.  Here, for 16 weight rows n0 … n0+15 and each super-block:

1. decode the 16 rows once (kquants_ir's decoders) and fold each group's scale into the
   codes, w = sc·(u − off) (|w| ≤ 4096: int16), split into two signed bytes
   hi = w >> 6 and lo = w & 63 (w = 64·hi + lo), as the A operands: four K-steps of 64
   bytes (the lane-major V_k order of the Q8_K codes) for hi and lo; the mins as pairs of
   int16 per weight row;
2. for two tiles of 16 activation rows at a time, ``tdpbssd`` against B = the Q8_K codes in
   the VNNI order (row r of K-step k = bytes 4r … 4r+3 of each of the 16 rows,
   ``vnni_activations``): C_hi, C_lo (16 x 16 int32) per tile, so isum = 64·C_hi + C_lo
   exactly; imin by ``vpmaddwd`` of the mins' pairs against the activations' code sums;
3. per weight row, kquants_ir.float_update over 16 activation-row lanes.

Tile registers: tmm0, tmm1 C_hi, C_lo of the first tile, tmm2, tmm3 of the second; tmm4,
tmm5 A_hi, A_lo; tmm6, tmm7 the two B.

    w    uint8 (N, row_bytes): GGUF rows or kquants_repack's (the decoder of the layout)
    x    Q8_K activations (q8k.py), re-laid by vnni_activations;  out float32 (M, N)
"""
from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import get_num_threads, njit, prange, types
from numba.core import cgutils
from numba.extending import intrinsic
from typing import NamedTuple

from . import amx
from .formats import FORMATS, KQUANTS, Q2_K, Q4_K, Q5_K, QK_K
from .ir import (F32, I8, I16, I32, I64, V16F32, V16I32, V64I8, prefetch, shuffle, shuffle2, splat,
                 splat_v16f32)
from .q8k import natural_order
from .kquants_ir import (DECODERS, PREFETCH_BLOCKS, REPACKED_DECODERS, ROWS, float_update,
                         have_f16c)

M_TILE = 16                     # activation rows per B tile (its 16 int32 columns of C)
MIN_M = 16                      # passes of this many rows and more take the tiles (docs/architecture.md, AMX)
CONFIG = amx.tile_config({t: (16, 64) for t in range(8)})
_STEP = 1024                    # bytes of one 16 x 64 tile


N_MINS = {Q2_K: 16, Q4_K: 8, Q5_K: 8}   # mins per super-block (Q2_K one per 16 values, Q4_K / Q5_K per 32)


def vnni_activations(xq: np.ndarray, xd: np.ndarray, n_mins: int = 0):
    """Q8_K codes (K/256, M, 256) and scales (K/256, M) -> B tiles int8 (K/256, Mt, 4, 16,
    16, 4): K-step k, row r = the bytes 64k + 4r … 64k+4r+3 of the 16 activation rows of
    tile t; dx float32 (K/256, Mt, 16); and, for n_mins mins per super-block, the code sums
    of their values as int16 pairs, int32 (K/256, Mt, n_mins / 2, 16) (else (·, ·, 0, 16)).
    Rows past M are zero (scale 0)."""
    nb, m, _ = xq.shape
    mt = -(-m // M_TILE)
    q = np.zeros((nb, mt * M_TILE, QK_K), np.int8)
    q[:, :m] = xq
    d = np.zeros((nb, mt * M_TILE), np.float32)
    d[:, :m] = xd
    b = q.reshape(nb, mt, M_TILE, 4, 16, 4).transpose(0, 1, 3, 4, 2, 5)
    sums = np.zeros((nb, mt * M_TILE, n_mins), np.int16)
    if n_mins:
        codes = natural_order(q).reshape(mt * M_TILE, nb, n_mins, -1)         # (Mp, nb, j, ·)
        sums = codes.astype(np.int32).sum(-1).astype(np.int16).transpose(1, 0, 2)   # |Σ| < 2^15
    pairs = np.ascontiguousarray(sums.reshape(nb, mt, M_TILE, n_mins // 2, 2).transpose(0, 1, 3, 2, 4))
    return (np.ascontiguousarray(b), d.reshape(nb, mt, M_TILE),
            pairs.view(np.int32).reshape(nb, mt, n_mins // 2, M_TILE))


def _tile_step(pair: bool) -> str:
    """The asm of one super-block against one or two activation tiles: $0, $1 A_hi, A_lo,
    $2, $3 the B tiles, $4 the stride (64), $5 where the C tiles go (1 KB apart)."""
    cs = (0, 1, 2, 3) if pair else (0, 1)
    text = [f"tilezero %tmm{c}" for c in cs]
    for k in range(4):
        o = _STEP * k
        text += [f"tileloadd {o}($0,$4,1), %tmm4", f"tileloadd {o}($1,$4,1), %tmm5",
                 f"tileloadd {o}($2,$4,1), %tmm6"]
        if pair:
            text.append(f"tileloadd {o}($3,$4,1), %tmm7")
        text += ["tdpbssd %tmm6, %tmm4, %tmm0", "tdpbssd %tmm6, %tmm5, %tmm1"]
        if pair:
            text += ["tdpbssd %tmm7, %tmm4, %tmm2", "tdpbssd %tmm7, %tmm5, %tmm3"]
    text += [f"tilestored %tmm{c}, {_STEP * c}($5,$4,1)" for c in cs]
    return "\n\t".join(text)


def _emit_fold(builder, dec, j, a_hi, a_lo, mnp, n_mins):
    """Step 1 for weight row j of the tile: w = sc·(u − off) as hi, lo bytes; the mins as
    int16 pairs (mnp[j][p] = mins 2p and 2p+1; Q4_K / Q5_K hold min j in lanes 2j, 2j+1)."""
    v32i16 = ir.VectorType(I16, 32)
    sc16 = builder.trunc(dec.sc, ir.VectorType(I16, 16))
    sc = [shuffle(builder, sc16, [p // 4 for p in range(32 * h, 32 * h + 32)]) for h in range(2)]
    even = list(range(0, 128, 2))                    # the low bytes of 64 words (vpermt2b)
    for k, v in enumerate(dec.u):
        u8 = builder.bitcast(v, V64I8)
        w = []
        for h in range(2):                            # bytes 32h … 32h+31 as words
            u = builder.zext(shuffle(builder, u8, range(32 * h, 32 * h + 32)), v32i16)
            if dec.off:
                u = builder.sub(u, ir.Constant(v32i16, dec.off))
            w.append(builder.mul(u, sc[h]))
        hi = shuffle2(builder, *(builder.bitcast(builder.ashr(x, ir.Constant(v32i16, 6)), V64I8) for x in w), even)
        lo = builder.and_(shuffle2(builder, *(builder.bitcast(x, V64I8) for x in w), even),
                          ir.Constant(V64I8, 63))
        for base, val in ((a_hi, hi), (a_lo, lo)):
            p = builder.gep(base, [I64(_STEP * k + 64 * j)], source_etype=I8)
            builder.store(val, builder.bitcast(p, V64I8.as_pointer()), align=1)
    if n_mins:
        step = 16 // n_mins                                   # lanes per min
        mn16 = builder.trunc(dec.mn, ir.VectorType(I16, 16))
        pairs = shuffle(builder, mn16, [step * i for i in range(n_mins)])        # <n_mins x i16>
        p = builder.gep(mnp, [I64(j * n_mins // 2)])
        builder.store(pairs, builder.bitcast(p, pairs.type.as_pointer()), align=4)


def make_tile_kernel(qtype: int, repacked: bool = False):
    """-> intrinsic ``kernel(w, xb, dx, bsp, out, acc, n0, n_hi)``: out[:, n0 … n0+15] (the
    rows below n_hi), steps 1-3 over every super-block; acc: float32 (Mt·256,) scratch."""
    decoder = (REPACKED_DECODERS if repacked else DECODERS)[qtype]
    block_bytes, f16c, n_mins = FORMATS[qtype].type_size, have_f16c(), N_MINS.get(qtype, 0)

    def kernel(typingctx, w, xb, dx, bsp, out, acc, n0, n_hi):
        sig = types.void(w, xb, dx, bsp, out, acc, n0, n_hi)

        def codegen(context, builder, signature, args):
            wa, xba, dxa, bspa, outa, acca = (context.make_array(t)(context, builder, value=v)
                                              for t, v in zip(signature.args[:6], args[:6]))
            n0_, hi_ = (context.cast(builder, v, t, types.int64)
                        for v, t in zip(args[6:], signature.args[6:]))
            nblk, mt = cgutils.unpack_tuple(builder, dxa.shape, 3)[:2]
            M, N = cgutils.unpack_tuple(builder, outa.shape, 2)
            row_bytes = cgutils.unpack_tuple(builder, wa.shape, 2)[1]
            a_hi, a_lo = (cgutils.alloca_once(builder, I8, size=I64(4 * _STEP)) for _ in range(2))
            cbuf = cgutils.alloca_once(builder, I8, size=I64(4 * _STEP))
            d_buf, nd_buf = (cgutils.alloca_once(builder, F32, size=I64(ROWS)) for _ in range(2))
            mnp = cgutils.alloca_once(builder, I32, size=I64(ROWS * max(1, n_mins // 2)))
            ctx = _Ctx(decoder, f16c, block_bytes, n_mins, wa.data, row_bytes, xba.data, dxa.data,
                       bspa.data, builder.bitcast(acca.data, V16F32.as_pointer()), M, nblk, mt,
                       (a_hi, a_lo, cbuf, d_buf, nd_buf, mnp))
            _emit_tiles(builder, ctx, n0_, hi_)
            _emit_store(builder, ctx.acc, outa.data, M, N, mt, n0_, hi_)
            return context.get_dummy_value()
        return sig, codegen

    kernel.__name__ = f"tiles_{FORMATS[qtype].name.lower()}{'_r' if repacked else ''}"
    return intrinsic(kernel)


class _Ctx(NamedTuple):
    decoder: object
    f16c: bool
    block_bytes: int
    n_mins: int
    wp: ir.Value        # i8* weights
    row_bytes: ir.Value
    xb: ir.Value        # i8* B tiles
    dx: ir.Value        # f32* (nb, Mt, 16)
    bsp: ir.Value       # i32* (nb, Mt, n_mins/2, 16)
    acc: ir.Value       # <16 x float>* (Mt, 16)
    M: ir.Value
    nblk: ir.Value
    mt: ir.Value
    bufs: tuple         # a_hi, a_lo, cbuf, d_buf, nd_buf, mnp


def _emit_decode(builder, c: _Ctx, n0, n_hi, b) -> None:
    """Step 1 for super-block b of rows n0 … n0+15 (rows past n_hi − 1 repeat the last)."""
    a_hi, a_lo, _, d_buf, nd_buf, mnp = c.bufs
    last = builder.sub(n_hi, I64(1))
    for j in range(ROWS):
        n = builder.add(n0, I64(j))
        n = builder.select(builder.icmp_signed("<", n, last), n, last)
        p = builder.gep(c.wp, [builder.add(builder.mul(n, c.row_bytes), builder.mul(b, I64(c.block_bytes)))],
                        source_etype=I8)
        for line in range(0, c.block_bytes + 64, 64):
            prefetch(builder, builder.gep(p, [I64(PREFETCH_BLOCKS * c.block_bytes + line)], source_etype=I8))
        dec = c.decoder(builder, p, c.f16c)
        _emit_fold(builder, dec, j, a_hi, a_lo, mnp, c.n_mins)
        builder.store(dec.d, builder.gep(d_buf, [I64(j)]))
        if c.n_mins:
            builder.store(builder.fneg(dec.dmin), builder.gep(nd_buf, [I64(j)]))


def _emit_epilogue(builder, c: _Ctx, b, t, tt: int) -> None:
    """Step 3 for activation tile t, whose C tiles sit at C slot 2·tt."""
    _, _, cbuf, d_buf, nd_buf, mnp = c.bufs
    bt = builder.add(builder.mul(b, c.mt), t)
    dxv = builder.load(builder.bitcast(builder.gep(c.dx, [builder.mul(bt, I64(M_TILE))], source_etype=F32),
                                       V16F32.as_pointer()), align=4)
    n_pairs = c.n_mins // 2
    v32i16 = ir.VectorType(I16, 32)
    bs = [builder.bitcast(builder.load(builder.bitcast(builder.gep(
        c.bsp, [builder.mul(builder.add(builder.mul(bt, I64(n_pairs)), I64(p)), I64(M_TILE))],
        source_etype=I32), V16I32.as_pointer()), align=4), v32i16) for p in range(n_pairs)]
    madd = builder.module.declare_intrinsic(
        "llvm.x86.avx512.pmaddw.d.512", fnty=ir.FunctionType(V16I32, [v32i16, v32i16]))
    c32 = builder.bitcast(cbuf, V16I32.as_pointer())
    for j in range(ROWS):
        hi = builder.load(builder.gep(c32, [I64(32 * tt + j)]), align=4)
        lo = builder.load(builder.gep(c32, [I64(32 * tt + ROWS + j)]), align=4)
        isum = builder.add(builder.shl(hi, ir.Constant(V16I32, 6)), lo)
        imin = nd = None
        if n_pairs:
            for p in range(n_pairs):
                mn = builder.bitcast(splat(builder, builder.load(builder.gep(mnp, [I64(j * n_pairs + p)])), 16), v32i16)
                term = builder.call(madd, [bs[p], mn])
                imin = term if imin is None else builder.add(imin, term)
            nd = splat_v16f32(builder, builder.load(builder.gep(nd_buf, [I64(j)])))
        a = builder.gep(c.acc, [builder.add(builder.mul(t, I64(ROWS)), I64(j))])
        builder.store(float_update(builder, builder.load(a, align=4),
                                   splat_v16f32(builder, builder.load(builder.gep(d_buf, [I64(j)]))),
                                   dxv, isum, nd, imin), a, align=4)


def _emit_tiles(builder, c: _Ctx, n0, n_hi) -> None:
    """acc[t][j] over every super-block: decode once, then the activation tiles two by two."""
    a_hi, a_lo, cbuf = c.bufs[:3]
    with cgutils.for_range(builder, builder.mul(c.mt, I64(ROWS))) as z:
        builder.store(ir.Constant(V16F32, 0.0), builder.gep(c.acc, [z.index]), align=4)
    with cgutils.for_range(builder, c.nblk) as blk:
        b = blk.index
        _emit_decode(builder, c, n0, n_hi, b)

        def b_tile(t):
            return builder.gep(c.xb, [builder.mul(builder.add(builder.mul(b, c.mt), t), I64(4 * _STEP))],
                               source_etype=I8)
        with cgutils.for_range_slice(builder, I64(0), c.mt, I64(2)) as (t, _):
            t1 = builder.add(t, I64(1))
            with builder.if_else(builder.icmp_signed("<", t1, c.mt)) as (two, one):
                with two:
                    amx._asm(builder, _tile_step(True), "r,r,r,r,r,r,~{memory}",
                             [a_hi, a_lo, b_tile(t), b_tile(t1), I64(64), cbuf])
                    _emit_epilogue(builder, c, b, t, 0)
                    _emit_epilogue(builder, c, b, t1, 1)
                with one:
                    amx._asm(builder, _tile_step(False), "r,r,r,r,r,r,~{memory}",
                             [a_hi, a_lo, b_tile(t), b_tile(t), I64(64), cbuf])
                    _emit_epilogue(builder, c, b, t, 0)


def _emit_store(builder, acc_p, out, M, N, mt, n0, n_hi):
    """out[m, n0 + j] = lane m mod 16 of acc[m div 16, j], for m < M and n0 + j < n_hi."""
    accf = builder.bitcast(acc_p, F32.as_pointer())
    with cgutils.for_range(builder, M) as mm:
        m = mm.index
        t, lane = builder.sdiv(m, I64(M_TILE)), builder.srem(m, I64(M_TILE))
        for j in range(ROWS):
            n = builder.add(n0, I64(j))
            with builder.if_then(builder.icmp_signed("<", n, n_hi)):
                src = builder.add(builder.mul(builder.add(builder.mul(t, I64(ROWS)), I64(j)), I64(M_TILE)), lane)
                builder.store(builder.load(builder.gep(accf, [src])),
                              builder.gep(out, [builder.add(builder.mul(m, N), n)], source_etype=F32))


def _make_driver(qtype: int, repacked: bool):
    tiles = make_tile_kernel(qtype, repacked)

    @njit(cache=True, nogil=True, parallel=True)
    def driver(cfg, w, xb, dx, bsp, out, n_chunks):
        """Runs of 16 weight rows under prange, one contiguous run per thread."""
        n = w.shape[0]
        n_tiles = -(-n // ROWS)
        for c in prange(n_chunks):
            amx.load_config(cfg)                   # per thread: a worker starts with none
            acc = np.empty(dx.shape[1] * ROWS * M_TILE, np.float32)
            for t in range(c * n_tiles // n_chunks, (c + 1) * n_tiles // n_chunks):
                tiles(w, xb, dx, bsp, out, acc, t * ROWS, min(n, (t + 1) * ROWS))
            amx.release()

    return driver


_DRIVERS = {(qt, rp): _make_driver(qt, rp) for qt in KQUANTS for rp in (False, True)
            if not rp or qt in REPACKED_DECODERS}


def matmul_q8k(qtype: int, w: np.ndarray, xq: np.ndarray, xd: np.ndarray, out: np.ndarray,
               repacked: bool = False) -> None:
    """out = x · Wᵀ through the tiles from Q8_K activations (checked by the caller)."""
    if not amx.available():
        raise RuntimeError(f"AMX is not usable here: {amx.status()}")
    xb, dx, bsp = vnni_activations(xq, xd, N_MINS.get(qtype, 0))
    n_tiles = -(-w.shape[0] // ROWS)
    _DRIVERS[qtype, repacked](CONFIG, w, xb, dx, bsp, out, max(1, min(get_num_threads(), n_tiles)))
