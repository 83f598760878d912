"""AMX tiles on the 16-row interleaved K-quants (Q4_K, Q5_K, Q6_K; kquants_x16's records).

The contract is reference.kquant_dot's, bit for bit: per (activation row m, weight row n,
super-block b) one exact integer isum = Σ_g sc[g]·(dot[g] − off·bsum[g]) (and, Q4_K / Q5_K,
imin = Σ_g mn[g]·bsum[g]), then acc = fma(float(isum), d·dx, acc) and
acc = fma(float(imin), −(dmin·dx), acc), b ascending.

The scales are folded into the weights, so each tile product runs over the whole 64-byte
depth and C holds isum itself: per tile of 16 weight rows and super-block, every code
becomes w = sc[g]·(u − off) (|w| ≤ 4096, exact in 16 bits) and is split into two bytes,
w = 256·hi + lo with lo unsigned and hi signed ([−16, 16]).  These are AMX's B operands
(_make_prep, into a per-thread buffer of 8 KB): the record's code vectors already hold
byte 4r + i = value 4t + i of weight row r (one row of B); the prep masks or shifts the
nibble, adds the high bits (Q5_K, Q6_K), multiplies by the group's 16 row scales
(``vpmullw``, lane = weight row), and writes the low and the high bytes as row L of B tile k,
where A tile k is bytes 64k … 64k+63 of each Q8_K block as q8k.py stores it (lane-major:
word L = values 16L + 4k … 16L + 4k + 3), so A is the activations as they are, 16 rows of
256 bytes apart.  Then, per pair of 16-row activation tiles (_tdp):

    C_lo += A_k · B_lo_k (``tdpbsud``),  C_hi += A_k · B_hi_k (``tdpbssd``),   k = 0 … 3
    isum  = (C_hi << 8) + C_lo                                              (exact int32)

and per activation row (_update, lane = weight row): ``vcvtdq2ps``, d·dx (``vmulps``) and
an FMA; the mins by four ``vpdpwssd`` of the 16 rows' (mn[2p], mn[2p+1]) word pairs with
the row's (bsum32[2p], bsum32[2p+1]), then the second FMA.  The next pair's tile products
are issued before this pair's update reads its C (two C slots).

Integers are exact and each (m, n) sees the contract's two FMAs per super-block in order, so
every output row is bitwise reference.kquant_dot's and independent of the others
(tests/kernels/test_kquants_x16_amx.py).  Loop order per thread (a run of weight tiles):
activation rows in blocks of at most A_BYTES of codes (about L2), each weight tile, each
super-block (its B prepared once, L1), each pair of activation tiles.

    wi           uint8 (N/16, nb · RECORD): kquants_x16.interleave's records
    xq, xd, xbs  the Q8_K activations of q8k.quantize_q8_k;  out float32 (M, N)
"""
from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import get_num_threads, njit, prange, types
from numba.extending import intrinsic

from . import amx, drivers
from .formats import Q4_K, Q5_K, Q6_K, QK_K
from .ir import F32, I8, I16, I32, I64, V16F32, V16I32, byte_ptr, fma_v16f32, load_bytes, shuffle, splat, vector_type
from .kquants_x16 import RECORD, ROWS

MIN_M = 16                      # the recommended smallest pass for the tiles (docs/architecture.md)
M_TILE = 16                     # activation rows per A tile
A_BYTES = 1 << 21               # activation codes per row block (about L2: fewer B preps for long rows, measured)
QS_AT = {Q4_K: 320, Q5_K: 832, Q6_K: 1344}      # the low-nibble code vectors in a record
QH_AT = 320                                     # Q5_K / Q6_K high bits
LO, HI, DV, NDM, MNP, BBUF = 0, 4096, 8192, 8256, 8320, 8576   # the B buffer's parts (bytes)
CONFIG = amx.tile_config({t: (16, 64) for t in range(8)})
# tmm0, tmm1: C_lo, C_hi of activation tile 0;  tmm2, tmm3: of tile 1;  tmm4, tmm5: A;  tmm6, tmm7: B

V64I8, V32I16, V16I8, V16I16 = (vector_type(t, n) for t, n in ((I8, 64), (I16, 32), (I8, 16), (I16, 16)))


def _store(builder, val, p, byte_off: int) -> None:
    builder.store(val, builder.bitcast(builder.gep(p, [I64(byte_off)]), val.type.as_pointer()), align=1)


def _vsplat(ty, value):
    return ir.Constant(ty, [value] * ty.count)


def _emit_prep(builder, qtype: int, rec, out) -> None:
    """The B buffer of one record (i8* rec) at i8* out: LO / HI + 1024 k + 64 L = the low / high
    bytes of w = sc·(u − off) for B tile k, row L (values 16L + 4k + i of the 16 rows);
    DV: d, NDM: −dmin (float32 [16]), MNP: the mins' word pairs (int32 [4][16])."""
    q6 = qtype == Q6_K

    def scale16(g):                                     # the 16 rows' scale of group g, per word
        raw = load_bytes(builder, rec, 64 + 16 * (g if q6 else g // 2), V16I8)
        s = (builder.sext if q6 else builder.zext)(raw, V16I16)
        return shuffle(builder, s, [i // 2 for i in range(32)])

    scales = [scale16(g) for g in range(16)]
    qh = {}
    for c in range(4):
        for t in range(8):
            v = load_bytes(builder, rec, QS_AT[qtype] + 64 * (8 * c + t), V64I8)
            for h in range(2):
                u = builder.and_(v, _vsplat(V64I8, 15)) if h == 0 else builder.lshr(v, _vsplat(V64I8, 4))
                if qtype != Q4_K:
                    j = t if qtype == Q5_K else 8 * h + t
                    if j not in qh:
                        qh[j] = load_bytes(builder, rec, QH_AT + 64 * j, V64I8)
                    bit, mask = (2 * c + h, 0x10) if qtype == Q5_K else (2 * c, 0x30)
                    hb = builder.lshr(qh[j], _vsplat(V64I8, bit - 4)) if bit > 4 else \
                        builder.shl(qh[j], _vsplat(V64I8, 4 - bit))
                    u = builder.or_(u, builder.and_(hb, _vsplat(V64I8, mask)))
                words = builder.bitcast(u, V32I16)
                e = builder.and_(words, _vsplat(V32I16, 0xFF))
                o = builder.lshr(words, _vsplat(V32I16, 8))
                if q6:
                    e, o = builder.sub(e, _vsplat(V32I16, 32)), builder.sub(o, _vsplat(V32I16, 32))
                g, k = 4 * c + 2 * h + t // 4, t % 4
                we, wo = builder.mul(e, scales[g]), builder.mul(o, scales[g])
                lo = builder.or_(builder.and_(we, _vsplat(V32I16, 0xFF)), builder.shl(wo, _vsplat(V32I16, 8)))
                hi = builder.or_(builder.lshr(we, _vsplat(V32I16, 8)), builder.and_(wo, _vsplat(V32I16, 0xFF00)))
                _store(builder, lo, out, LO + 1024 * k + 64 * g)
                _store(builder, hi, out, HI + 1024 * k + 64 * g)
    if q6:
        _store(builder, load_bytes(builder, rec, 0, V16F32), out, DV)
        return
    for at, dst, neg in ((0, DV, False), (32, NDM, True)):
        half = builder.bitcast(load_bytes(builder, rec, at, V16I16), ir.VectorType(ir.HalfType(), 16))
        f = builder.fpext(half, V16F32)                 # vcvtph2ps: exact
        _store(builder, builder.fneg(f) if neg else f, out, dst)
    for p in range(4):
        a, b = (builder.zext(load_bytes(builder, rec, 192 + 16 * j, V16I8), V16I32) for j in (2 * p, 2 * p + 1))
        _store(builder, builder.or_(a, builder.shl(b, _vsplat(V16I32, 16))), out, MNP + 64 * p)


def _make_prep(qtype: int):
    @intrinsic
    def prep(typingctx, w, w_off, bbuf, b_off):
        """The B buffer of the record at w + w_off (bytes) into bbuf + b_off (_emit_prep)."""
        def codegen(context, builder, sig, args):
            _emit_prep(builder, qtype, byte_ptr(context, builder, sig, args, 0, 1),
                       byte_ptr(context, builder, sig, args, 2, 3))
            return context.get_dummy_value()
        return types.void(w, w_off, bbuf, b_off), codegen
    return drivers.keyed(prep, f"kquants_x16_amx.prep.{qtype}")


def _tdp_text(pair: bool, k: int) -> str:
    """Step k of a super-block's tile products: $0 A of tile 0, $1 A of tile 1, $2 A's stride,
    $3 the B buffer, $4 the C slot, $5 = 64.  C is zeroed before step 0, stored after step 3."""
    c_tiles = range(4) if pair else range(2)
    lines = [f"tilezero %tmm{t}" for t in c_tiles] if k == 0 else []
    lines += [f"tileloadd {LO + 1024 * k}($3,$5,1), %tmm6", f"tileloadd {HI + 1024 * k}($3,$5,1), %tmm7",
              f"tileloadd {64 * k}($0,$2,1), %tmm4", "tdpbsud %tmm6, %tmm4, %tmm0", "tdpbssd %tmm7, %tmm4, %tmm1"]
    if pair:
        lines += [f"tileloadd {64 * k}($1,$2,1), %tmm5", "tdpbsud %tmm6, %tmm5, %tmm2", "tdpbssd %tmm7, %tmm5, %tmm3"]
    if k == 3:
        lines += [f"tilestored %tmm{t}, {1024 * t}($4,$5,1)" for t in c_tiles]
    return "\n\t".join(lines)


def _emit_update(builder, mins: bool, c, bb, dx, xb, accp, q0, a0, rows) -> None:
    """For the activation rows i in ``rows`` of the C slot at i8* c (lane = weight row):
        isum = (C_hi << 8) + C_lo;  a = fma(float(isum), d · dx[q0 + i], acc[a0 + 16 i …])
        imin = Σ_p vpdpwssd(mn pair p, xbp[q0 + i, p]);  a = fma(float(imin), −dmin · dx, a)
    and a back into acc."""
    dv = load_bytes(builder, bb, DV, V16F32)
    ndm = load_bytes(builder, bb, NDM, V16F32)
    mnp = [load_bytes(builder, bb, MNP + 64 * p, V16I32) for p in range(4)]
    dpw = builder.module.declare_intrinsic(
        "llvm.x86.avx512.vpdpwssd.512", fnty=ir.FunctionType(V16I32, [V16I32] * 3))
    for i in rows:
        base = 2048 * (i // M_TILE) + 64 * (i % M_TILE)
        isum = builder.add(builder.shl(load_bytes(builder, c, base + 1024, V16I32), _vsplat(V16I32, 8)),
                           load_bytes(builder, c, base, V16I32))
        dxs = splat(builder, builder.load(builder.gep(dx, [builder.add(q0, I64(i))])), 16)
        ap = builder.bitcast(builder.gep(accp, [builder.add(a0, I64(16 * i))]), V16F32.as_pointer())
        a = fma_v16f32(builder, builder.sitofp(isum, V16F32), builder.fmul(dv, dxs), builder.load(ap, align=4))
        if mins:
            imin = ir.Constant(V16I32, [0] * 16)
            row = builder.mul(builder.add(q0, I64(i)), I64(4))
            for p in range(4):
                xp = builder.load(builder.gep(xb, [builder.add(row, I64(p))]))
                imin = builder.call(dpw, [imin, mnp[p], splat(builder, xp, 16)])
            a = fma_v16f32(builder, builder.sitofp(imin, V16F32), builder.fmul(ndm, dxs), a)
        builder.store(a, ap, align=4)


def _make_step(mins: bool, nxt: int, prev: int, tiles: bool = True, update: bool = True, side: bool = True):
    """step(xa, a_off, scratch, b_off, c_next, c_prev, dxp, xbp, q0, acc, acc_off): the tile
    products of the next nxt (0, 16 or 32) activation rows at xa + a_off into the C slot at
    scratch + c_next, interleaved step by step with the update of the prev (0, 16, 32) rows
    whose C is at scratch + c_prev (_emit_update, rows q0 …; acc from acc_off): the tile unit
    and the vector units work side by side (side=False: all products first, then the
    update, for the comparison).  The B buffer is at scratch + b_off."""
    @intrinsic
    def step(typingctx, xa, a_off, scratch, b_off, c_next, c_prev, dxp, xbp, q0, acc, acc_off):
        def codegen(context, builder, sig, args):
            def arg(i):
                return context.cast(builder, args[i], sig.args[i], types.int64)
            a0 = byte_ptr(context, builder, sig, args, 0, 1)
            sp = byte_ptr(context, builder, sig, args, 2)
            bb = builder.gep(sp, [arg(3)])
            ops = [a0, builder.gep(a0, [I64(QK_K * M_TILE)]), I64(QK_K), bb, builder.gep(sp, [arg(4)]), I64(64)]
            dx = builder.bitcast(byte_ptr(context, builder, sig, args, 6), F32.as_pointer())
            xb = builder.bitcast(byte_ptr(context, builder, sig, args, 7), I32.as_pointer())
            accp = builder.bitcast(byte_ptr(context, builder, sig, args, 9), F32.as_pointer())
            parts = [(k, k * prev // 4, (k + 1) * prev // 4) for k in range(4)] if side else \
                [(0, 0, 0), (1, 0, 0), (2, 0, 0), (3, 0, prev)]
            for k, r0, r1 in parts:
                if nxt and tiles:
                    amx.asm(builder, _tdp_text(nxt == 2 * M_TILE, k), "r,r,r,r,r,r,~{memory}", ops)
                if r1 > r0 and update:
                    _emit_update(builder, mins, builder.gep(sp, [arg(5)]), bb, dx, xb, accp, arg(8), arg(10),
                                 range(r0, r1))
            return context.get_dummy_value()
        return types.void(xa, a_off, scratch, b_off, c_next, c_prev, dxp, xbp, q0, acc, acc_off), codegen
    return drivers.keyed(step, f"kquants_x16_amx.step.{mins}.{nxt}.{prev}.{tiles}.{update}.{side}")


def _make_driver(qtype: int, tiles: bool = True, update: bool = True, side: bool = True):
    """The driver of qtype; without ``tiles`` / ``update`` (benchmarks/x16_amx.py's bound:
    each part timed alone) the result is garbage; side: _make_step's."""
    prep, rec, mins, two = _make_prep(qtype), RECORD[qtype], qtype != Q6_K, 2 * M_TILE
    s20, s10, s22, s12, s02, s01 = (_make_step(mins, n, p, tiles, update, side) for n, p in
                                    ((two, 0), (M_TILE, 0), (two, two), (M_TILE, two), (0, two), (0, M_TILE)))

    @njit(cache=True, nogil=True, parallel=True)
    def driver(cfg, wi, xa, dxp, xbp, m_rows, mblk, out, n_chunks):
        """Runs of weight tiles under prange; per thread: row blocks of mblk activation rows,
        each tile, each super-block (B prepared once), the activation tiles by pairs, the
        products of the next pair issued beside the update of this one (two C slots)."""
        n_tiles, nb, mp = wi.shape[0], dxp.shape[0], dxp.shape[1]
        wf, xf, dxf, xbf = wi.reshape(-1), xa.reshape(-1), dxp.reshape(-1), xbp.reshape(-1)
        for ch in prange(n_chunks):
            amx.load_config(cfg)                  # per thread: a worker starts with none
            scratch = np.empty(BBUF + 2 * 4096 + 64, np.uint8)
            bo = (64 - scratch.ctypes.data % 64) % 64     # B buffer, then two C slots: 64-aligned
            co = bo + BBUF
            acc = np.empty(mblk * ROWS, np.float32)
            for m0 in range(0, mp, mblk):
                nmt = (min(mp, m0 + mblk) - m0) // M_TILE
                npair, odd = nmt // 2, nmt % 2
                for t in range(ch * n_tiles // n_chunks, (ch + 1) * n_tiles // n_chunks):
                    acc[:] = 0
                    for b in range(nb):
                        prep(wf, (t * nb + b) * rec, scratch, bo)
                        q0 = b * mp + m0
                        if npair:
                            s20(xf, q0 * QK_K, scratch, bo, co, co, dxf, xbf, q0, acc, 0)
                        else:
                            s10(xf, q0 * QK_K, scratch, bo, co, co, dxf, xbf, q0, acc, 0)
                        for p in range(npair):
                            nxt, cn, cp = (q0 + two * (p + 1)) * QK_K, co + ((p + 1) & 1) * 4096, co + (p & 1) * 4096
                            if p + 1 < npair:
                                s22(xf, nxt, scratch, bo, cn, cp, dxf, xbf, q0 + two * p, acc, two * ROWS * p)
                            elif odd:
                                s12(xf, nxt, scratch, bo, cn, cp, dxf, xbf, q0 + two * p, acc, two * ROWS * p)
                            else:
                                s02(xf, 0, scratch, bo, cn, cp, dxf, xbf, q0 + two * p, acc, two * ROWS * p)
                        if odd:
                            s01(xf, 0, scratch, bo, co, co + (npair & 1) * 4096, dxf, xbf, q0 + two * npair,
                                acc, two * ROWS * npair)
                    for i in range(min(nmt * M_TILE, m_rows - m0)):
                        out[m0 + i, t * ROWS:(t + 1) * ROWS] = acc[ROWS * i:ROWS * (i + 1)]
            amx.release()

    return driver


@njit(cache=True, nogil=True, parallel=True)
def _acts(xq, xd, xbs, xa, dxp, xbp):
    """The Q8_K activations padded to mp rows (zeros past M): xa int8 (nb, mp, 256) the codes as
    stored, dxp float32 (nb, mp), xbp int32 (nb, mp, 4) = the word pairs of the sums per 32
    (sub-blocks 2p, 2p + 1), as vpdpwssd reads them."""
    nb, m_rows = xd.shape
    for b in prange(nb):
        for m in range(dxp.shape[1]):
            if m < m_rows:
                xa[b, m, :] = xq[b, m, :]
                dxp[b, m] = xd[b, m]
                for p in range(4):
                    s0 = np.int32(xbs[b, m, 4 * p]) + np.int32(xbs[b, m, 4 * p + 1])
                    s1 = np.int32(xbs[b, m, 4 * p + 2]) + np.int32(xbs[b, m, 4 * p + 3])
                    xbp[b, m, p] = (s0 & 0xFFFF) | (s1 << 16)
            else:
                xa[b, m, :] = 0
                dxp[b, m] = 0
                xbp[b, m, :] = 0


def _aligned(shape: tuple, dtype) -> np.ndarray:
    """An uninitialized array whose data starts on a 64-byte boundary (a cache line)."""
    size = int(np.prod(shape)) * np.dtype(dtype).itemsize
    raw = np.empty(size + 64, np.uint8)
    at = -raw.ctypes.data % 64
    return raw[at:at + size].view(dtype).reshape(shape)


_DRIVERS = {qt: _make_driver(qt) for qt in RECORD}


def matmul(qtype: int, wi: np.ndarray, xq: np.ndarray, xd: np.ndarray, xbs: np.ndarray,
           out: np.ndarray) -> None:
    """out (M, N) float32 = x · Wᵀ on the tiles, W interleaved (kquants_x16) and x quantized by
    q8k.quantize_q8_k: reference.kquant_dot's numbers bit for bit, for any M (worth it from MIN_M)."""
    nb, m_rows = xd.shape
    if wi.dtype != np.uint8 or wi.ndim != 2 or wi.shape[1] != nb * RECORD[qtype] or not wi.flags.c_contiguous:
        raise ValueError(f"weights must be kquants_x16 records, uint8 (N/16, {nb} · {RECORD[qtype]})")
    if xq.shape != (nb, m_rows, QK_K) or xbs.shape != (nb, m_rows, 16):
        raise ValueError("activations must be as q8k.quantize_q8_k returns them")
    if out.shape != (m_rows, ROWS * wi.shape[0]) or out.dtype != np.float32 or not out.flags.c_contiguous:
        raise ValueError(f"out must be a C-contiguous float32 array of shape {(m_rows, ROWS * wi.shape[0])}")
    run(_DRIVERS[qtype], wi, xq, xd, xbs, out)


def run(driver, wi: np.ndarray, xq: np.ndarray, xd: np.ndarray, xbs: np.ndarray, out: np.ndarray) -> None:
    """matmul through ``driver`` (one of _DRIVERS, or a _make_driver variant)."""
    if not amx.available():                       # also asks Linux for the tile data, once
        raise RuntimeError(f"AMX is not usable here: {amx.status()}")
    nb, m_rows = xd.shape
    mp = -(-m_rows // M_TILE) * M_TILE
    xa, dxp, xbp = _aligned((nb, mp, QK_K), np.int8), _aligned((nb, mp), np.float32), _aligned((nb, mp, 4), np.int32)
    _acts(xq, xd, xbs, xa, dxp, xbp)
    mblk = max(2 * M_TILE, min(mp, A_BYTES // (nb * QK_K) // (2 * M_TILE) * 2 * M_TILE))
    n_chunks = max(1, min(get_num_threads(), wi.shape[0]))
    driver(CONFIG, wi, xa, dxp, xbp, m_rows, mblk, out, n_chunks)

