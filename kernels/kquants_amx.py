"""AMX matmul for the K-quants (Q2_K … Q6_K): many activation rows per tile.

The K-quant contract of reference.kquant_dot, bit for bit: the integer dot of every scale
group of 16 values is done by the tile unit, the scales are applied in exact integers, and
the float operations per (activation row m, weight row n, super-block b) are the contract's:

    isum = Σ_g sc[g]·(dot[g] − off·bsum[g]);   imin = Σ_g mn[g]·bsum[g]       (exact int32)
    acc  = fma(float(isum), d·dx, acc);        acc  = fma(float(imin), −(dmin·dx), acc)

A tile product runs over one group's 16 values (``tdpbusd`` with K = 16; A: 16 weight rows ×
16 unsigned codes, B: the group's 16 Q8_K codes of 16 activation rows in the VNNI order,
C[n][m] = dot[g]).  Per tile of 16 weight rows (under prange), in order:

1. every super-block b of the 16 rows decoded once by kquants_ir's decoders (either layout):
   the codes group by group (row r, group g at ubuf[b, r, 16g …], the 16 values in the
   lane-major order of q8k.py), the integer sc and mn per (r, g), d and −dmin per r;
2. per tile of 16 activation rows (_make_tile_rows), b ascending: group after group the dots
   on the tiles (C stored; the next group's issued before this one's is read), the integer
   update isum[r] += sc[r, g]·(C[r] − off·bsum[g]) with lane = activation row m, then
   imin[r] and the two FMAs per weight row r on 16 activation rows at once;
3. out[m, n] = the accumulator: nothing to fold.

Integer sums are exact in any order and each (m, n) sees the contract's float operations in
its order, so out[m] is bitwise reference.kquant_dot's (and kquants_ir's) for any M
(tests/kernels/test_kquants_amx.py).  Forced only (SPECDEC_KERNELS=amx, MIN_M rows), like
the legacy quants' tiles: a tile product is a quarter deep (K = 16 of 64 bytes).

    w    uint8 (N, row_bytes): GGUF or kquants_repack rows (N mod 16 rows: the VNNI drivers)
    xq, xd, xbs  the Q8_K activations of q8k.py;  out float32 (M, N)
"""
from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import get_num_threads, njit, prange, types
from numba.core import cgutils
from numba.extending import intrinsic

from . import amx
from .formats import FORMATS, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, QK_K
from .ir import F32, I32, I64, V16F32, V16I32, fma_v16f32, have_f16c, load_at, shuffle2, splat, store_at
from .kquants_decode import DECODERS, REPACKED_DECODERS

ROWS = 16                       # weight rows per tile (the 16 rows of A and C)
M_TILE = 16                     # activation rows per B tile (the 16 int32 columns of C)
# With SPECDEC_KERNELS=amx (cpu.tiles()), passes of at least MIN_M rows take the tiles: at
# 16 rows they were slower than the VNNI drivers on Q4_K, from 64 on not (benchmarks/amx_rows.py;
# docs/architecture.md, "AMX tiles"): prompt passes, not verification.
MIN_M = {qt: 64 for qt in (Q2_K, Q3_K, Q4_K, Q5_K, Q6_K)}
BLOCK_U = ROWS * QK_K           # bytes of one super-block's codes for a tile (4096)
BLOCK_S = 2 * ROWS * 16         # int32 of its sc and mn (512)
CONFIG = amx.tile_config({0: (16, 64),                  # C: 16 weight rows x 16 int32
                          1: (16, 16),                  # A: 16 weight rows x one group's codes
                          2: (4, 64)})                  # B: 4 rows of 16 activation rows x 4 codes


def _groups_major(builder, u):
    """kquants_ir's V_k (lane g = values 16g+4k … 16g+4k+3) -> four vectors W_j holding the
    groups 4j … 4j+3, each group's four dwords k = 0 … 3 adjacent (lane 4q + k = V_k[4j + q])."""
    lo01 = shuffle2(builder, u[0], u[1], [i // 2 + 16 * (i % 2) for i in range(16)])
    hi01 = shuffle2(builder, u[0], u[1], [8 + i // 2 + 16 * (i % 2) for i in range(16)])
    lo23 = shuffle2(builder, u[2], u[3], [i // 2 + 16 * (i % 2) for i in range(16)])
    hi23 = shuffle2(builder, u[2], u[3], [8 + i // 2 + 16 * (i % 2) for i in range(16)])
    out = []
    for a, c in ((lo01, lo23), (hi01, hi23)):
        for half in (0, 8):                 # pairs (V0, V1)[q] sit at lanes 2q, 2q + 1
            idx = [2 * (half // 2 + i // 4) + i % 2 + (16 if i % 4 >= 2 else 0) for i in range(16)]
            out.append(shuffle2(builder, a, c, idx))
    return out


def _make_decode(qtype: int, repacked: bool):
    """decode(w, row0, rs, b, ubuf, u_off, sbuf, s_off, fbuf, f_off): super-block b of the 16
    rows at byte row0 + r·rs into ubuf[u_off + 256 r …] (groups major, see _groups_major),
    sbuf[s_off + 16 r + g] = sc, sbuf[s_off + 256 + 16 r + g] = mn (int32; 0 without mins),
    fbuf[f_off + r] = d, fbuf[f_off + 16 + r] = −dmin (0 without mins)."""
    decoder = (REPACKED_DECODERS if repacked else DECODERS)[qtype]
    block_bytes, f16c = FORMATS[qtype].type_size, have_f16c()

    @intrinsic
    def decode(typingctx, w, row0, rs, b, ubuf, u_off, sbuf, s_off, fbuf, f_off):
        sig = types.void(w, row0, rs, b, ubuf, u_off, sbuf, s_off, fbuf, f_off)

        def codegen(context, builder, signature, args):
            def data(i):
                return context.make_array(signature.args[i])(context, builder, args[i]).data
            row0_, rs_, b_, uo, so, fo = (context.cast(builder, args[i], signature.args[i], types.int64)
                                          for i in (1, 2, 3, 5, 7, 9))
            blk = builder.add(row0_, builder.mul(b_, I64(block_bytes)))
            ub = builder.bitcast(data(4), V16I32.element.as_pointer())
            for r in range(ROWS):
                p = builder.gep(data(0), [builder.add(blk, builder.mul(rs_, I64(r)))])
                dec = decoder(builder, p, f16c)
                for j, v in enumerate(_groups_major(builder, dec.u)):
                    store_at(builder, v, ub, builder.add(builder.sdiv(uo, I64(4)), I64(64 * r + 16 * j)))
                mn = ir.Constant(V16I32, 0) if dec.mn is None else dec.mn
                store_at(builder, dec.sc, data(6), builder.add(so, I64(16 * r)), 4)
                store_at(builder, mn, data(6), builder.add(so, I64(256 + 16 * r)), 4)
                store_at(builder, dec.d, data(8), builder.add(fo, I64(r)), 4)
                ndmin = F32(0.0) if dec.dmin is None else builder.fneg(dec.dmin)
                store_at(builder, ndmin, data(8), builder.add(fo, I64(16 + r)), 4)
            return context.get_dummy_value()

        return sig, codegen

    return decode


_DOT = ("tileloadd ($0,$1,1), %tmm1\n\ttileloadd ($2,$3,1), %tmm2\n\ttilezero %tmm0\n\t"
        "tdpbusd %tmm2, %tmm1, %tmm0\n\ttilestored %tmm0, ($4,$5,1)")


def _emit_dot(builder, a, b, c) -> None:
    """C (i8* c, 16 rows of 64 bytes) = A (i8* a: 16 weight rows of one group's 16 codes,
    256 bytes apart) · B (i8* b: 4 rows of 64 bytes), ``tdpbusd`` (unsigned A, signed B)."""
    amx.asm(builder, _DOT, "r,r,r,r,r,r,~{memory}", [a, I64(256), b, I64(64), c, I64(64)])


def _make_tile_rows(off: int, mins: bool):
    """-> intrinsic tile_rows(ubuf, xb, cbuf, sbuf, fbuf, dx, bsum, res, mt, nt, nb, mp): the 16
    weight rows of the decoded tile against activation tile mt, lane = activation row m.
    Per super-block b, group after group: C = the group's dots (into one of two C slots, the
    next group's issued before this one's C is read), then for the 16 weight rows r
        isum[r] += sc[r, g] · (C[r] − off · bsum[g])      (exact int32 lanes)
    and after the 16 groups  imin[r] = Σ_g mn[r, g] · bsum[g],
        a[r] = fma(float(isum[r]), d[r] · dx, a[r]);   a[r] = fma(float(imin[r]), −dmin[r] · dx, a[r])
    res[16 r + m] = a[r] at the end."""
    @intrinsic
    def tile_rows(typingctx, ubuf, xb, cbuf, sbuf, fbuf, dx, bsum, res, mt, nt, nb, mp):
        sig = types.void(ubuf, xb, cbuf, sbuf, fbuf, dx, bsum, res, mt, nt, nb, mp)

        def codegen(context, builder, signature, args):
            def data(i):
                return context.make_array(signature.args[i])(context, builder, args[i]).data
            mt_, nt_, nb_, mp_ = (context.cast(builder, args[i], signature.args[i], types.int64)
                                  for i in range(8, 12))
            ub, xbp, cb = (builder.bitcast(data(i), amx.I8P) for i in (0, 1, 2))

            def dot(b, g: int):
                a = builder.gep(ub, [builder.add(builder.mul(b, I64(BLOCK_U)), I64(16 * g))])
                bg = builder.add(builder.mul(b, I64(16)), I64(g))
                xo = builder.mul(builder.add(builder.mul(bg, nt_), mt_), I64(256))
                _emit_dot(builder, a, builder.gep(xbp, [xo]), builder.gep(cb, [I64(1024 * (g % 2))]))

            def lanes(i, base, at: int, ty):
                """data(i)[base + at] in all 16 lanes."""
                return splat(builder, load_at(builder, data(i), builder.add(base, I64(at)), ty, 4), 16)

            accs = [cgutils.alloca_once(builder, V16F32) for _ in range(ROWS)]
            isums = [cgutils.alloca_once(builder, V16I32) for _ in range(ROWS)]
            for slot in accs:
                builder.store(ir.Constant(V16F32, 0.0), slot)
            dot(I64(0), 0)
            with cgutils.for_range(builder, nb_) as loop:
                b = loop.index
                so, fo = builder.mul(b, I64(BLOCK_S)), builder.mul(b, I64(32))
                bo = builder.mul(builder.add(builder.mul(b, nt_), mt_), I64(256))
                bs = [load_at(builder, data(6), builder.add(bo, I64(16 * g)), V16I32, 4) for g in range(16)]
                for slot in isums:
                    builder.store(ir.Constant(V16I32, 0), slot)
                for g in range(16):
                    if g < 15:
                        dot(b, g + 1)
                    else:
                        with builder.if_then(builder.icmp_signed("<", builder.add(b, I64(1)), nb_)):
                            dot(builder.add(b, I64(1)), 0)
                    for r, slot in enumerate(isums):
                        c = load_at(builder, data(2), I64(256 * (g % 2) + 16 * r), V16I32, 4)
                        if off:
                            c = builder.sub(c, builder.mul(bs[g], ir.Constant(V16I32, off)))
                        sc = lanes(3, so, 16 * r + g, I32)
                        builder.store(builder.add(builder.load(slot), builder.mul(sc, c)), slot)
                dxv = load_at(builder, data(5), builder.add(builder.mul(b, mp_), builder.mul(mt_, I64(M_TILE))),
                              V16F32, 4)
                for r, (slot, isum) in enumerate(zip(accs, isums)):
                    d = lanes(4, fo, r, F32)
                    a = fma_v16f32(builder, builder.sitofp(builder.load(isum), V16F32), builder.fmul(d, dxv),
                                   builder.load(slot))
                    if mins:
                        imin = ir.Constant(V16I32, 0)
                        for g in range(16):
                            mn = lanes(3, so, 256 + 16 * r + g, I32)
                            imin = builder.add(imin, builder.mul(mn, bs[g]))
                        nd = lanes(4, fo, 16 + r, F32)
                        a = fma_v16f32(builder, builder.sitofp(imin, V16F32), builder.fmul(nd, dxv), a)
                    builder.store(a, slot)
            for r, slot in enumerate(accs):
                store_at(builder, builder.load(slot), data(7), I64(16 * r), 4)
            return context.get_dummy_value()

        return sig, codegen

    return tile_rows


@njit(cache=True, nogil=True)
def _x_tiles(xq, xd, xbs, mp):
    """The Q8_K activations as the tiles read them, mp (M rounded up to 16) rows, zero past M:
    xb int8 (nb, 16 g, mp/16, 4 k, 16 m, 4): B of group g for activation tile t at
    256 (16 (b·16 + g) … ) — row k of B = codes 4k … 4k+3 of group g of the 16 rows;
    dx float32 (nb, mp); bsum int32 (nb, mp/16, 16 g, 16 m)."""
    nb, m_rows = xd.shape
    nt = mp // M_TILE
    xb = np.zeros(nb * 16 * nt * 256, np.int8)
    dx = np.zeros((nb, mp), np.float32)
    bsum = np.zeros((nb, nt, 16, M_TILE), np.int32)
    xb32, xq32 = xb.view(np.int32), xq.reshape(-1).view(np.int32)
    for b in range(nb):
        for m in range(m_rows):
            dx[b, m] = xd[b, m]
            src = (b * m_rows + m) * 64
            for g in range(16):
                bsum[b, m // M_TILE, g, m % M_TILE] = xbs[b, m, g]
                dst = ((b * 16 + g) * nt + m // M_TILE) * 64 + m % M_TILE
                for k in range(4):                  # lane-major: dword 16k + g of the row
                    xb32[dst + 16 * k] = xq32[src + 16 * k + g]
    return xb, dx, bsum


def _make_driver(decode, tile_rows):
    @njit(cache=True, nogil=True, parallel=True)
    def driver(cfg, w, xb, dx, bsum, m_rows, out, n_chunks):
        """Tiles of 16 weight rows under prange, one contiguous run of tiles per thread."""
        n, rs = w.shape
        nb, mp = dx.shape
        nt = mp // M_TILE
        n_tiles = n // ROWS
        dxf, bsf = dx.reshape(-1), bsum.reshape(-1)
        for c in prange(n_chunks):
            amx.load_config(cfg)                    # per thread: a worker starts with none
            ubuf = np.empty(nb * BLOCK_U, np.uint8)
            sbuf = np.empty(nb * BLOCK_S, np.int32)
            fbuf = np.empty(nb * 32, np.float32)
            cbuf = np.empty(2 * 256, np.int32)         # two C slots
            res = np.empty(256, np.float32)
            for t in range(c * n_tiles // n_chunks, (c + 1) * n_tiles // n_chunks):
                n0 = t * ROWS
                for b in range(nb):
                    decode(w, n0 * rs, rs, b, ubuf, b * BLOCK_U, sbuf, b * BLOCK_S, fbuf, b * 32)
                for mt in range(nt):
                    tile_rows(ubuf, xb, cbuf, sbuf, fbuf, dxf, bsf, res, mt, nt, nb, mp)
                    m0 = mt * M_TILE
                    for r in range(ROWS):
                        for i in range(min(M_TILE, m_rows - m0)):
                            out[m0 + i, n0 + r] = res[16 * r + i]
            amx.release()

    return driver


_OFF = {Q2_K: 0, Q3_K: 4, Q4_K: 0, Q5_K: 0, Q6_K: 32}
_DRIVERS = {(qt, rep): _make_driver(_make_decode(qt, rep), _make_tile_rows(_OFF[qt], _OFF[qt] == 0))
            for qt in DECODERS for rep in (False, True) if not rep or qt in REPACKED_DECODERS}


def matmul(qtype: int, w: np.ndarray, xq: np.ndarray, xd: np.ndarray, xbs: np.ndarray,
           out: np.ndarray, repacked: bool, vnni_drivers) -> None:
    """out = x · Wᵀ through the tiles (arguments checked by kquants.matmul_q8k); the last
    N mod 16 weight rows through ``vnni_drivers[qtype]`` (kquants_ir's table for w's layout)."""
    if not amx.available():
        raise RuntimeError(f"AMX is not usable here: {amx.status()}")
    m_rows = xd.shape[1]
    xb, dx, bsum = _x_tiles(xq, xd, xbs, -(-m_rows // M_TILE) * M_TILE)
    n_full = w.shape[0] // ROWS * ROWS
    threads = get_num_threads()
    if n_full:
        _DRIVERS[qtype, repacked](CONFIG, w, xb, dx, bsum, m_rows, out,
                                  max(1, min(threads, n_full // ROWS)))
    if n_full < w.shape[0]:
        tail = np.empty((m_rows, w.shape[0] - n_full), np.float32)
        vnni_drivers[qtype](w[n_full:], xq, xd, xbs, tail, max(1, min(threads, w.shape[0] - n_full)))
        out[:, n_full:] = tail
