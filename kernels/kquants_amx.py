"""AMX matmul for the K-quants (Q2_K … Q6_K): the integer sums of 16 x 16 (weight row,
activation row) pairs per super-block on the tile unit, bitwise the VNNI path's numbers.

The K-quant contract (kquants_ir) needs, per super-block b and pair (n, m), two exact
integers, isum = Σ_v sc[g]·(u_v − off)·xq_v and imin = Σ_v mn[g]·xq_v, then the same float
operations.  Here, for 16 weight rows n0 … n0+15 and each super-block:

1. decode the 16 rows once (kquants_ir's decoders) and fold each group's scale into the
   codes, w = sc·(u − off) (|w| ≤ 4096: int16), split into two signed bytes
   hi = w >> 6 and lo = w & 63 (w = 64·hi + lo), as the A operands: four K-steps of 64
   bytes (the lane-major V_k order of the Q8_K codes) for hi and lo; the mins as a third A
   (mn[g] in every byte of group g, the same for the four K-steps);
2. for each 16 activation rows, ``tdpbssd`` against B = the Q8_K codes in the VNNI order
   (row r of K-step k = bytes 4r … 4r+3 of each of the 16 rows, ``vnni_activations``):
   C_hi, C_lo, C_min (16 x 16 int32), so isum = 64·C_hi + C_lo and imin = C_min exactly;
3. per weight row, kquants_ir.float_update over 16 activation-row lanes.

Tile registers: tmm0-2 C_hi, C_lo, C_min; tmm3-5 their A; tmm6 B.

    w    uint8 (N, row_bytes): GGUF rows or kquants_repack's (the decoder of the layout)
    x    Q8_K activations (q8k.py), re-laid by vnni_activations;  out float32 (M, N)
"""
from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import get_num_threads, njit, prange, types
from numba.core import cgutils
from numba.extending import intrinsic

from . import amx
from .formats import FORMATS, KQUANTS, QK_K
from .ir import F32, I8, I16, I64, V16F32, V16I32, V64I8, prefetch, shuffle, splat_v16f32
from .kquants_ir import (DECODERS, PREFETCH_BLOCKS, REPACKED_DECODERS, ROWS, float_update,
                         have_f16c)

M_TILE = 16                     # activation rows per B tile (its 16 int32 columns of C)
MIN_M = 16                      # passes of this many rows and more take the tiles (docs/architecture.md, AMX)
CONFIG = amx.tile_config({t: (16, 64) for t in range(7)})
V64I16 = ir.VectorType(I16, 64)
_STEP = 1024                    # bytes of one 16 x 64 tile


def vnni_activations(xq: np.ndarray, xd: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q8_K codes (K/256, M, 256) and scales (K/256, M) -> B tiles int8 (K/256, Mt, 4, 16,
    16, 4): K-step k, row r = the bytes 64k + 4r … 64k+4r+3 of the 16 activation rows of
    tile t; and dx float32 (K/256, Mt, 16).  Rows past M are zero (scale 0)."""
    nb, m, _ = xq.shape
    mt = -(-m // M_TILE)
    q = np.zeros((nb, mt * M_TILE, QK_K), np.int8)
    q[:, :m] = xq
    d = np.zeros((nb, mt * M_TILE), np.float32)
    d[:, :m] = xd
    b = q.reshape(nb, mt, M_TILE, 4, 16, 4).transpose(0, 1, 3, 4, 2, 5)
    return np.ascontiguousarray(b), d.reshape(nb, mt, M_TILE)


def _tile_step(mins: bool) -> str:
    """The asm of one (super-block, activation tile): $0-$2 A_hi, A_lo, A_min, $3 B, $4 the
    stride (64), $5 where C_hi, C_lo, C_min go (1 KB apart)."""
    text = ["tilezero %tmm0", "tilezero %tmm1"]
    if mins:
        text += ["tilezero %tmm2", "tileloadd ($2,$4,1), %tmm5"]
    for k in range(4):
        o = _STEP * k
        text += [f"tileloadd {o}($0,$4,1), %tmm3", f"tileloadd {o}($1,$4,1), %tmm4",
                 f"tileloadd {o}($3,$4,1), %tmm6",
                 "tdpbssd %tmm6, %tmm3, %tmm0", "tdpbssd %tmm6, %tmm4, %tmm1"]
        if mins:
            text.append("tdpbssd %tmm6, %tmm5, %tmm2")
    text += ["tilestored %tmm0, ($5,$4,1)", f"tilestored %tmm1, {_STEP}($5,$4,1)"]
    if mins:
        text.append(f"tilestored %tmm2, {2 * _STEP}($5,$4,1)")
    return "\n\t".join(text)


def _emit_fold(builder, dec, j, a_hi, a_lo, a_min):
    """Step 1 for weight row j of the tile: w = sc·(u − off) as hi, lo bytes; the mins."""
    lane_of_byte = [p // 4 for p in range(64)]
    sc = shuffle(builder, builder.trunc(dec.sc, ir.VectorType(I16, 16)), lane_of_byte)
    for k, v in enumerate(dec.u):
        u = builder.zext(builder.bitcast(v, V64I8), V64I16)
        if dec.off:
            u = builder.sub(u, ir.Constant(V64I16, dec.off))
        w = builder.mul(u, sc)
        hi = builder.trunc(builder.ashr(w, ir.Constant(V64I16, 6)), V64I8)
        lo = builder.trunc(builder.and_(w, ir.Constant(V64I16, 63)), V64I8)
        for base, val in ((a_hi, hi), (a_lo, lo)):
            p = builder.gep(base, [I64(_STEP * k + 64 * j)], source_etype=I8)
            builder.store(val, builder.bitcast(p, V64I8.as_pointer()), align=1)
    if dec.mn is not None:
        mn = shuffle(builder, builder.trunc(dec.mn, ir.VectorType(I8, 16)), lane_of_byte)
        p = builder.gep(a_min, [I64(64 * j)], source_etype=I8)
        builder.store(mn, builder.bitcast(p, V64I8.as_pointer()), align=1)


def make_tile_kernel(qtype: int, repacked: bool = False):
    """-> intrinsic ``kernel(w, xb, dx, out, acc, n0, n_hi)``: out[:, n0 … n0+15] (the
    rows below n_hi), steps 1-3 over every super-block; acc: float32 (Mt·256,) scratch."""
    decoder = (REPACKED_DECODERS if repacked else DECODERS)[qtype]
    block_bytes, f16c = FORMATS[qtype].type_size, have_f16c()

    def kernel(typingctx, w, xb, dx, out, acc, n0, n_hi):
        sig = types.void(w, xb, dx, out, acc, n0, n_hi)

        def codegen(context, builder, signature, args):
            wa, xba, dxa, outa, acca = (context.make_array(t)(context, builder, value=v)
                                        for t, v in zip(signature.args[:5], args[:5]))
            n0_, hi_ = (context.cast(builder, v, t, types.int64)
                        for v, t in zip(args[5:], signature.args[5:]))
            nblk, mt = cgutils.unpack_tuple(builder, dxa.shape, 3)[:2]
            M, N = cgutils.unpack_tuple(builder, outa.shape, 2)
            row_bytes = cgutils.unpack_tuple(builder, wa.shape, 2)[1]
            bufs = [cgutils.alloca_once(builder, I8, size=I64(4 * _STEP)) for _ in range(2)]
            a_min, cbuf = (cgutils.alloca_once(builder, I8, size=I64(n * _STEP)) for n in (1, 3))
            d_buf, nd_buf = (cgutils.alloca_once(builder, F32, size=I64(ROWS)) for _ in range(2))
            acc_p = builder.bitcast(acca.data, V16F32.as_pointer())
            _emit_tiles(builder, decoder, f16c, block_bytes, wa.data, row_bytes, xba.data,
                        dxa.data, outa.data, acc_p, M, N, nblk, mt, n0_, hi_,
                        (bufs[0], bufs[1], a_min, cbuf, d_buf, nd_buf))
            return context.get_dummy_value()
        return sig, codegen

    kernel.__name__ = f"tiles_{FORMATS[qtype].name.lower()}{'_r' if repacked else ''}"
    return intrinsic(kernel)


def _emit_tiles(builder, decoder, f16c, block_bytes, wp, row_bytes, xb, dx, out, acc_p, M, N,
                nblk, mt, n0, n_hi, bufs):
    a_hi, a_lo, a_min, cbuf, d_buf, nd_buf = bufs
    with cgutils.for_range(builder, builder.mul(mt, I64(ROWS))) as z:
        builder.store(ir.Constant(V16F32, 0.0), builder.gep(acc_p, [z.index]), align=4)
    last = builder.sub(n_hi, I64(1))
    mins = None
    with cgutils.for_range(builder, nblk) as blk:
        b = blk.index
        for j in range(ROWS):
            n = builder.add(n0, I64(j))
            n = builder.select(builder.icmp_signed("<", n, last), n, last)
            p = builder.gep(wp, [builder.add(builder.mul(n, row_bytes), builder.mul(b, I64(block_bytes)))],
                            source_etype=I8)
            for line in range(0, block_bytes + 64, 64):
                prefetch(builder, builder.gep(p, [I64(PREFETCH_BLOCKS * block_bytes + line)], source_etype=I8))
            dec = decoder(builder, p, f16c)
            mins = dec.mn is not None
            _emit_fold(builder, dec, j, a_hi, a_lo, a_min)
            builder.store(dec.d, builder.gep(d_buf, [I64(j)]))
            if mins:
                builder.store(builder.fneg(dec.dmin), builder.gep(nd_buf, [I64(j)]))
        step = _tile_step(mins)
        with cgutils.for_range(builder, mt) as tl:
            t = tl.index
            tile = builder.mul(builder.add(builder.mul(b, mt), t), I64(4 * _STEP))
            amx._asm(builder, step, "r,r,r,r,r,r,~{memory}",
                     [a_hi, a_lo, a_min, builder.gep(xb, [tile], source_etype=I8), I64(64), cbuf])
            dxv = builder.load(builder.bitcast(builder.gep(dx, [builder.mul(builder.add(
                builder.mul(b, mt), t), I64(M_TILE))], source_etype=F32), V16F32.as_pointer()), align=4)
            c32 = builder.bitcast(cbuf, V16I32.as_pointer())
            for j in range(ROWS):
                hi = builder.load(builder.gep(c32, [I64(j)]), align=4)
                lo = builder.load(builder.gep(c32, [I64(ROWS + j)]), align=4)
                isum = builder.add(builder.shl(hi, ir.Constant(V16I32, 6)), lo)
                imin = builder.load(builder.gep(c32, [I64(2 * ROWS + j)]), align=4) if mins else None
                nd = splat_v16f32(builder, builder.load(builder.gep(nd_buf, [I64(j)]))) if mins else None
                a = builder.gep(acc_p, [builder.add(builder.mul(t, I64(ROWS)), I64(j))])
                builder.store(float_update(builder, builder.load(a, align=4),
                                           splat_v16f32(builder, builder.load(builder.gep(d_buf, [I64(j)]))),
                                           dxv, isum, nd, imin), a, align=4)
    _emit_store(builder, acc_p, out, M, N, mt, n0, n_hi)


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
    def driver(cfg, w, xb, dx, out, n_chunks):
        """Runs of 16 weight rows under prange, one contiguous run per thread."""
        n = w.shape[0]
        n_tiles = -(-n // ROWS)
        for c in prange(n_chunks):
            amx.load_config(cfg)                   # per thread: a worker starts with none
            acc = np.empty(dx.shape[1] * ROWS * M_TILE, np.float32)
            for t in range(c * n_tiles // n_chunks, (c + 1) * n_tiles // n_chunks):
                tiles(w, xb, dx, out, acc, t * ROWS, min(n, (t + 1) * ROWS))
            amx.release()

    return driver


_DRIVERS = {(qt, rp): _make_driver(qt, rp) for qt in KQUANTS for rp in (False, True)
            if not rp or qt in REPACKED_DECODERS}


def matmul_q8k(qtype: int, w: np.ndarray, xq: np.ndarray, xd: np.ndarray, out: np.ndarray,
               repacked: bool = False) -> None:
    """out = x · Wᵀ through the tiles from Q8_K activations (checked by the caller)."""
    if not amx.available():
        raise RuntimeError(f"AMX is not usable here: {amx.status()}")
    xb, dx = vnni_activations(xq, xd)
    n_tiles = -(-w.shape[0] // ROWS)
    _DRIVERS[qtype, repacked](CONFIG, w, xb, dx, out, max(1, min(get_num_threads(), n_tiles)))
