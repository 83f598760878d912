"""K-quant × Q8_K matmul kernels: SIMD super-block code as Numba intrinsics, prange drivers.

Plain Numba cannot keep decoded weight blocks in vector registers across a loop over the
activation rows, so the work of one thread is written in portable LLVM vector IR:
``make_chunk_kernel(qtype)`` -> ``kernel(w, xq, xd, out, acc, c, n_chunks)`` computes the
output rows of chunk c, ROWS (16) weight rows at a time: each super-block of the 16 rows is
decoded once into a stack buffer and used for every activation row.  The ``matmul_<fmt>``
drivers below run the chunks under prange.  kquants_amx.py does the same sums on AMX tiles.

Lane-major layout.  Lane L (0…15) of the 16 int32 lanes is the scale group L, i.e. the
values 16L … 16L+15 of the super-block (every K-quant scale covers 16 or 32 values).  The
four 64-byte vectors V_k (k = 0…3) hold in lane L the values 16L+4k … 16L+4k+3; Q8_K codes
are stored in the same order (see q8k.py), so four chained ``vpdpbusd`` (u8 × s8 -> int32,
4 products per lane) leave in lane L the exact integer dot of group L.

The contract (every path: VNNI, AVX2, portable, AMX; kernels/reference.kquant_dot).  Per
super-block b of weight row n and activation row m, two exact integers (ggml's
ggml_vec_dot_qX_K_q8_K forms the same ones):

    isum = Σ_L sc[L] · (dot[L] − off · bs[L])     dot[L] = Σ_{i∈L} u_i · xq_i
    imin = Σ_L mn[L] · bs[L]                       bs[L]  = Σ_{i∈L} xq_i
    (u: unsigned codes; sc, mn: the integer group scales and mins; q = u − off, off = 32
    for Q6_K, 4 for Q3_K, else 0; |isum| < 2^27)

then, b ascending from acc = 0, in float32:

    acc = fma(d·dx, float(isum), acc)
    acc = fma((−dmin)·dx, float(imin), acc)        (Q2_K, Q4_K, Q5_K)
    out[m, n] = acc

Here the integer scale products are ``vpmulld`` per weight row and the 16 lanes of 16
weight rows are summed together (reduce16), so the float operations run with lane j =
weight row n0 + j.  Integer sums are exact in any order, and each (n, m) sees the same
float operations in the same order whatever M, the thread count or the path: rows are
independent, bit for bit.

Arrays (C-contiguous):  w uint8 (N, row_bytes) raw GGUF rows (or kquants_repack's);  the
Q8_K activations in the block-major layout of q8k.py: xq int8 (K/256, M, 256) lane-major
codes in [-127, 127], xd float32 (K/256, M);  out float32 (M, N).
"""
from __future__ import annotations

from typing import Callable, NamedTuple

import numpy as np
from llvmlite import ir
from numba import njit, prange, types
from numba.core import cgutils
from numba.extending import intrinsic

from .formats import FORMATS, KQUANTS, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, QK_K
from .ir import (F32, I8, I16, I32, I64, V16F32, V16I32, V64I8, const_vector, dpbusd_chain,
                 f16_to_f32, fma_v16f32, have_f16c, have_vnni512, load_bytes, prefetch, shuffle,
                 shuffle2, splat_v16f32)

PREFETCH_BLOCKS = 8  # rows of a static-M pass prefetch this many super-blocks ahead

LANES = range(16)


# ---------------------------------------------------------------------------- IR helpers

def _splat_i32(value: int) -> ir.Constant:
    return ir.Constant(V16I32, value)


def _lanes(builder, words, index, shift, mask: int):
    """(words[index[L]] >> shift[L]) & mask for the 16 lanes: a dword gather (vpermd /
    vpermt2d), a per-lane shift (vpsrlvd) and a byte-wise mask."""
    v = shuffle(builder, words, index)
    if any(shift):
        v = builder.lshr(v, const_vector(I32, shift))
    return builder.and_(v, _splat_i32(mask))


# ------------------------------------------------------------------------ block decoders

class Decoded(NamedTuple):
    """One super-block in registers (lane-major, see the module docstring)."""
    u: list            # 4 × <16 x i32> (= <64 x u8>): V_k, unsigned codes
    sc: ir.Value       # <16 x i32>: the integer scale of group L
    mn: object         # <16 x i32>: the integer min of group L (Q2_K, Q4_K, Q5_K), or None
    d: ir.Value        # float: the super-block scale
    dmin: object       # float: the scale of the mins, or None
    off: int           # q = u − off (Q3_K 4, Q6_K 32, else 0)
    u_max: int         # the largest code: 2^bits − 1 (bounds the AVX2 path's i16 sums)


def _decoded(builder, u, sc, d, mn=None, dmin=None, off: int = 0, u_max: int = 63) -> Decoded:
    """Decoded from the codes u, the integer scales sc (and mins mn) as <16 x i32> lanes and
    the float super-block scales d (and dmin)."""
    return Decoded(u, sc, mn, d, dmin, off, u_max)


def k4_scales(builder, p, off: int):
    """12-byte 6-bit scale / min packing of Q4_K and Q5_K (get_scale_min_k4) -> lanes
    (sc, mn) of <16 x i32>, sub-block j's values in lanes 2j and 2j+1."""
    V4 = ir.VectorType(I8, 4)
    a, b, c = (load_bytes(builder, p, off + 4 * i, V4) for i in range(3))
    cst = {v: ir.Constant(V4, v) for v in (2, 4, 15, 0x30, 63)}
    sc_lo, mn_lo = builder.and_(a, cst[63]), builder.and_(b, cst[63])
    sc_hi = builder.or_(builder.and_(c, cst[15]), builder.and_(builder.lshr(a, cst[2]), cst[0x30]))
    mn_hi = builder.or_(builder.lshr(c, cst[4]), builder.and_(builder.lshr(b, cst[2]), cst[0x30]))

    def lanes(lo, hi):
        both = builder.shuffle_vector(lo, hi, const_vector(I32, range(8)))    # sub-blocks 0 … 7
        return shuffle(builder, builder.zext(both, ir.VectorType(I32, 8)), [L // 2 for L in LANES])
    return lanes(sc_lo, sc_hi), lanes(mn_lo, mn_hi)


def _decode_q4_k(builder, p, f16c):
    """block_q4_K (144 B): d, dmin (f16), scales[12], qs[128] (dequantize_row_q4_K).
    Sub-block j = lanes 2j, 2j+1; its value l is nibble j%2 of qs[32(j//2) + l].
    u ≤ 15, sc, mn ≤ 63: |dot| ≤ 16·15·127 < 2^15."""
    qs = load_bytes(builder, p, 16, ir.VectorType(I32, 32))
    u = [_lanes(builder, qs, [8 * (L // 4) + 4 * (L % 2) + k for L in LANES],
                [4 * ((L // 2) % 2) for L in LANES], 0x0F0F0F0F) for k in range(4)]
    sc, mn = k4_scales(builder, p, 4)
    d = f16_to_f32(builder, load_bytes(builder, p, 0, I16), f16c)
    dmin = f16_to_f32(builder, load_bytes(builder, p, 2, I16), f16c)
    return _decoded(builder, u, sc, d, mn, dmin, u_max=15)


def _decode_q5_k(builder, p, f16c):
    """block_q5_K (176 B): d, dmin, scales[12], qh[32], qs[128] (dequantize_row_q5_K).
    As Q4_K plus 16 · bit j of qh[l].  u ≤ 31: |dot| ≤ 16·31·127 < 2^16."""
    qs = load_bytes(builder, p, 48, ir.VectorType(I32, 32))
    qh = load_bytes(builder, p, 16, ir.VectorType(I32, 8))
    u = []
    for k in range(4):
        lo = _lanes(builder, qs, [8 * (L // 4) + 4 * (L % 2) + k for L in LANES],
                    [4 * ((L // 2) % 2) for L in LANES], 0x0F0F0F0F)
        hi = _lanes(builder, qh, [4 * (L % 2) + k for L in LANES], [L // 2 for L in LANES],
                    0x01010101)
        u.append(builder.or_(lo, builder.shl(hi, _splat_i32(4))))
    sc, mn = k4_scales(builder, p, 4)
    d = f16_to_f32(builder, load_bytes(builder, p, 0, I16), f16c)
    dmin = f16_to_f32(builder, load_bytes(builder, p, 2, I16), f16c)
    return _decoded(builder, u, sc, d, mn, dmin, u_max=31)


def _hsl(L: int) -> tuple[int, int, int]:
    """Group L of the Q2_K / Q3_K / Q6_K layouts: values 128h + 32s + 16t + (0…15)."""
    return L // 8, (L % 8) // 2, L % 2


def _decode_q6_k(builder, p, f16c):
    """block_q6_K (210 B): ql[128], qh[64], scales[16] int8, d (dequantize_row_q6_K).
    Value 128h + 32s + l: nibble s//2 of ql[64h + 32(s%2) + l] | bits 2s of qh[32h + l] << 4,
    q = u − 32, u ≤ 63: |dot| ≤ 16·63·127 < 2^17."""
    ql = load_bytes(builder, p, 0, ir.VectorType(I32, 32))
    qh = load_bytes(builder, p, 128, V16I32)
    u = []
    for k in range(4):
        hsl = [_hsl(L) for L in LANES]
        lo = _lanes(builder, ql, [16 * h + 8 * (s % 2) + 4 * t + k for h, s, t in hsl],
                    [4 * (s // 2) for h, s, t in hsl], 0x0F0F0F0F)
        hi = _lanes(builder, qh, [8 * h + 4 * t + k for h, s, t in hsl], [2 * s for h, s, t in hsl],
                    0x03030303)
        u.append(builder.or_(lo, builder.shl(hi, _splat_i32(4))))
    sc = builder.sext(load_bytes(builder, p, 192, ir.VectorType(I8, 16)), V16I32)
    d = f16_to_f32(builder, load_bytes(builder, p, 208, I16), f16c)
    return _decoded(builder, u, sc, d, off=32, u_max=63)


def _crumbs(builder, qs, k: int):
    """Q2_K / Q3_K low bits: value 128h + 32s + l is (qs[32h + l] >> 2s) & 3."""
    hsl = [_hsl(L) for L in LANES]
    return _lanes(builder, qs, [8 * h + 4 * t + k for h, s, t in hsl], [2 * s for h, s, t in hsl],
                  0x03030303)


def _decode_q3_k(builder, p, f16c):
    """block_q3_K (110 B): hmask[32], qs[64], scales[12] (6-bit, −32), d (dequantize_row_q3_K).
    q = low − 4 unless bit 4h+s of hmask[l] is set: u = low | hbit << 2 = q + 4.
    u ≤ 7: |dot| ≤ 16·7·127 < 2^14."""
    qs = load_bytes(builder, p, 32, V16I32)
    hm = load_bytes(builder, p, 0, ir.VectorType(I32, 8))
    u = []
    for k in range(4):
        hsl = [_hsl(L) for L in LANES]
        hb = _lanes(builder, hm, [4 * t + k for h, s, t in hsl], [4 * h + s for h, s, t in hsl],
                    0x01010101)
        u.append(builder.or_(_crumbs(builder, qs, k), builder.shl(hb, _splat_i32(2))))
    # scale L: low nibble of byte L%8 (shifted by 4·(L//8)) | 2 bits of byte 8 + L%4 << 4
    V16 = ir.VectorType(I8, 16)
    lo8 = load_bytes(builder, p, 96, ir.VectorType(I8, 8))
    lo = builder.and_(builder.lshr(shuffle(builder, lo8, [L % 8 for L in LANES]),
                                   const_vector(I8, [4 * (L // 8) for L in LANES])), ir.Constant(V16, 15))
    hi4 = load_bytes(builder, p, 104, ir.VectorType(I8, 4))
    hi = builder.and_(builder.lshr(shuffle(builder, hi4, [L % 4 for L in LANES]),
                                   const_vector(I8, [2 * (L // 4) for L in LANES])), ir.Constant(V16, 3))
    sc6 = builder.or_(lo, builder.shl(hi, ir.Constant(V16, 4)))
    sc = builder.sub(builder.zext(sc6, V16I32), _splat_i32(32))
    d = f16_to_f32(builder, load_bytes(builder, p, 108, I16), f16c)
    return _decoded(builder, u, sc, d, off=4, u_max=7)


def _decode_q2_k(builder, p, f16c):
    """block_q2_K (84 B): scales[16] (scale | min << 4), qs[64], d, dmin (dequantize_row_q2_K).
    u ≤ 3, sc, mn ≤ 15: |dot| ≤ 16·3·127 < 2^13."""
    qs = load_bytes(builder, p, 16, V16I32)
    u = [_crumbs(builder, qs, k) for k in range(4)]
    sm = load_bytes(builder, p, 0, ir.VectorType(I8, 16))
    sc = builder.zext(builder.and_(sm, ir.Constant(sm.type, 15)), V16I32)
    mn = builder.zext(builder.lshr(sm, ir.Constant(sm.type, 4)), V16I32)
    d = f16_to_f32(builder, load_bytes(builder, p, 80, I16), f16c)
    dmin = f16_to_f32(builder, load_bytes(builder, p, 82, I16), f16c)
    return _decoded(builder, u, sc, d, mn, dmin, u_max=3)


DECODERS: dict[int, Callable] = {           # qtype -> super-block decoder
    Q2_K: _decode_q2_k, Q3_K: _decode_q3_k, Q4_K: _decode_q4_k, Q5_K: _decode_q5_k,
    Q6_K: _decode_q6_k,
}


# ------------------------------------------------- decoders of repacked blocks

V32I8 = ir.VectorType(I8, 32)


def _byte_shift(builder, v, by: int):
    """v << by (by > 0) or v >> −by, bytewise (<32 x i8>)."""
    if by > 0:
        return builder.shl(v, ir.Constant(V32I8, by))
    return builder.lshr(v, ir.Constant(V32I8, -by)) if by < 0 else v


def _nibbles(builder, p, off: int, k: int):
    """(low nibbles, high nibbles) of the 32 bytes at off + 32k: lanes 0-7 and 8-15 of V_k."""
    c = load_bytes(builder, p, off + 32 * k, V32I8)
    return (builder.and_(c, ir.Constant(V32I8, 15)),
            builder.and_(builder.lshr(c, ir.Constant(V32I8, 4)), ir.Constant(V32I8, 15)))


def _v16(builder, lo, hi):
    """Two <32 x i8> halves -> one <16 x i32> V_k (lanes 0-7, 8-15)."""
    return builder.bitcast(shuffle2(builder, lo, hi, list(range(64))), V16I32)


def _decode_q4_k_r(builder, p, f16c):
    """Repacked block_q4_K (kquants_repack.py): header as stored, qs in the V_k order."""
    u = [_v16(builder, *_nibbles(builder, p, 16, k)) for k in range(4)]
    sc, mn = k4_scales(builder, p, 4)
    d = f16_to_f32(builder, load_bytes(builder, p, 0, I16), f16c)
    dmin = f16_to_f32(builder, load_bytes(builder, p, 2, I16), f16c)
    return _decoded(builder, u, sc, d, mn, dmin, u_max=15)


def _decode_q5_k_r(builder, p, f16c):
    """Repacked block_q5_K: qs as Q4_K's, bit 2k + h of qh byte j = the fifth bit of
    byte j of half h of V_k."""
    qh = load_bytes(builder, p, 16, V32I8)
    u = []
    for k in range(4):
        halves = [builder.or_(nib, builder.and_(_byte_shift(builder, qh, 4 - (2 * k + h)),
                                                ir.Constant(V32I8, 0x10)))
                  for h, nib in enumerate(_nibbles(builder, p, 48, k))]
        u.append(_v16(builder, *halves))
    sc, mn = k4_scales(builder, p, 4)
    d = f16_to_f32(builder, load_bytes(builder, p, 0, I16), f16c)
    dmin = f16_to_f32(builder, load_bytes(builder, p, 2, I16), f16c)
    return _decoded(builder, u, sc, d, mn, dmin, u_max=31)


def _decode_q6_k_r(builder, p, f16c):
    """Repacked block_q6_K: ql in the V_k order (as Q4_K's qs), crumb k of qh byte
    32h + j = the two high bits of byte j of half h of V_k."""
    qh = [load_bytes(builder, p, 128 + 32 * h, V32I8) for h in range(2)]
    u = []
    for k in range(4):
        halves = [builder.or_(nib, builder.and_(_byte_shift(builder, qh[h], 4 - 2 * k),
                                                ir.Constant(V32I8, 0x30)))
                  for h, nib in enumerate(_nibbles(builder, p, 0, k))]
        u.append(_v16(builder, *halves))
    sc = builder.sext(load_bytes(builder, p, 192, ir.VectorType(I8, 16)), V16I32)
    d = f16_to_f32(builder, load_bytes(builder, p, 208, I16), f16c)
    return _decoded(builder, u, sc, d, off=32, u_max=63)


REPACKED_DECODERS: dict[int, Callable] = {  # qtype -> decoder of its repacked super-block
    Q4_K: _decode_q4_k_r, Q5_K: _decode_q5_k_r, Q6_K: _decode_q6_k_r,
}


# --------------------------------------------------------------------------- intrinsics

ROWS = 16          # weight rows decoded together: the lanes of every float operation


def reduce16(builder, vs):
    """[v_0 … v_15] (<16 x i32> each) -> <16 x i32> whose lane j is Σ of the lanes of v_j:
    a pairwise network (15 adds of two-source permutes); integer sums, so exact."""
    width = 16
    while len(vs) > 1:
        half, owners = width // 2, 16 // width
        lo = [t * width + i if t < owners else 16 + (t - owners) * width + i
              for t in range(2 * owners) for i in range(half)]
        hi = [j + half for j in lo]
        vs = [builder.add(shuffle2(builder, a, b, lo), shuffle2(builder, a, b, hi))
              for a, b in zip(vs[0::2], vs[1::2])]
        width = half
    return vs[0]


def float_update(builder, acc, d, dx, isum, neg_dmin=None, imin=None):
    """The float operations of the contract, lane by lane (module docstring):
    acc = fma(d·dx, float(isum), acc), then acc = fma((−dmin)·dx, float(imin), acc)."""
    acc = fma_v16f32(builder, builder.fmul(d, dx), builder.sitofp(isum, V16F32), acc)
    if imin is not None:
        acc = fma_v16f32(builder, builder.fmul(neg_dmin, dx), builder.sitofp(imin, V16F32), acc)
    return acc


class _Q8K(NamedTuple):
    """Data pointers of the Q8_K activations (block-major, see q8k.py) and their sizes."""
    q: ir.Value      # i8*  codes (K/256, M, 256)
    d: ir.Value      # f32* scales (K/256, M)
    M: ir.Value
    nblk: ir.Value   # K/256


class _Scratch(NamedTuple):
    """Stack buffers of one block of ROWS decoded weight rows (super-block b)."""
    u: ir.Value      # <16 x i32>* ROWS × 4: the codes V_k of row j at 4j + k
    sc: ir.Value     # <16 x i32>* ROWS: scales
    mn: ir.Value     # <16 x i32>* ROWS: mins


def _emit_decode_rows(builder, decode, block_bytes, wp, row_bytes, n0, last, b, buf: _Scratch):
    """Decode super-block b of rows n0 … n0+15 (rows past `last` read row `last` again)
    into buf; -> (d, −dmin) as <16 x float>, lane j = row n0 + j, and the format's Decoded
    of row n0 (for its static facts)."""
    d = neg_dmin = ir.Constant(V16F32, None)
    first = None
    for j in range(ROWS):
        n = builder.add(n0, I64(j))
        n = builder.select(builder.icmp_signed("<", n, last), n, last)
        p = builder.gep(wp, [builder.add(builder.mul(n, row_bytes), builder.mul(b, I64(block_bytes)))],
                        source_etype=I8)
        for line in range(0, block_bytes + 64, 64):
            prefetch(builder, builder.gep(p, [I64(PREFETCH_BLOCKS * block_bytes + line)], source_etype=I8))
        dec = decode(builder, p)
        first = first or dec
        for k, v in enumerate(dec.u):
            builder.store(v, builder.gep(buf.u, [I64(4 * j + k)]))
        builder.store(dec.sc, builder.gep(buf.sc, [I64(j)]))
        d = builder.insert_element(d, dec.d, I32(j))
        if dec.mn is not None:
            builder.store(dec.mn, builder.gep(buf.mn, [I64(j)]))
            neg_dmin = builder.insert_element(neg_dmin, builder.fneg(dec.dmin), I32(j))
    return d, neg_dmin, first


def _emit_row_update(builder, vnni, first: Decoded, buf: _Scratch, x: _Q8K, b, m, d, neg_dmin, acc_p):
    """acc[m] (<16 x float>, lane j = weight row n0 + j) += super-block b against activation
    row m: per weight row the four vpdpbusd of the groups, the scales applied in integers,
    the 16 rows' lanes summed by reduce16, then float_update."""
    row = builder.add(builder.mul(b, x.M), m)
    xv = [builder.load(builder.gep(x.q, [builder.add(builder.mul(row, I64(QK_K)), I64(64 * k))],
                                   source_etype=I8), typ=V64I8, align=1) for k in range(4)]
    ones = ir.Constant(V64I8, [1] * 64)
    bs = dpbusd_chain(builder, vnni, [ones] * 4, xv, 1)          # lane L: Σ codes of group L
    off_bs = builder.mul(bs, _splat_i32(first.off)) if first.off else None
    p, q = [], []
    for j in range(ROWS):
        u8 = [builder.bitcast(builder.load(builder.gep(buf.u, [I64(4 * j + k)])), V64I8) for k in range(4)]
        dot = dpbusd_chain(builder, vnni, u8, xv, first.u_max)
        if off_bs is not None:
            dot = builder.sub(dot, off_bs)
        p.append(builder.mul(dot, builder.load(builder.gep(buf.sc, [I64(j)]))))
        if first.mn is not None:
            q.append(builder.mul(builder.load(builder.gep(buf.mn, [I64(j)])), bs))
    dx = splat_v16f32(builder, builder.load(builder.gep(x.d, [row], source_etype=F32)))
    acc_m = builder.gep(acc_p, [m])
    imin = reduce16(builder, q) if q else None
    builder.store(float_update(builder, builder.load(acc_m, align=4), d, dx, reduce16(builder, p),
                               neg_dmin, imin), acc_m, align=4)


def _emit_chunk(builder, decode, block_bytes: int, vnni: bool, wp, row_bytes, x: _Q8K, out, N,
                c, n_chunks, acc_p):
    """out (f32* (M, N)) rows n = lo … hi−1 of chunk c of n_chunks, ROWS weight rows at a
    time: each super-block of the ROWS rows is decoded once into a stack buffer and used
    for all M activation rows; acc_p (<16 x float>* M) holds their accumulators."""
    M, nblk = x.M, x.nblk
    lo = builder.sdiv(builder.mul(c, N), n_chunks)
    hi = builder.sdiv(builder.mul(builder.add(c, I64(1)), N), n_chunks)
    buf = _Scratch(cgutils.alloca_once(builder, V16I32, size=4 * ROWS),
                   cgutils.alloca_once(builder, V16I32, size=ROWS),
                   cgutils.alloca_once(builder, V16I32, size=ROWS))
    last = builder.sub(hi, I64(1))
    with cgutils.for_range_slice(builder, lo, hi, I64(ROWS)) as (n0, _):
        with cgutils.for_range(builder, M) as mm:
            builder.store(ir.Constant(V16F32, 0.0), builder.gep(acc_p, [mm.index]), align=4)
        with cgutils.for_range(builder, nblk) as blk:
            d, neg_dmin, first = _emit_decode_rows(builder, decode, block_bytes, wp, row_bytes,
                                                   n0, last, blk.index, buf)
            with cgutils.for_range(builder, M) as mm:
                _emit_row_update(builder, vnni, first, buf, x, blk.index, mm.index, d, neg_dmin, acc_p)
        with cgutils.for_range(builder, M) as mm:
            acc = builder.load(builder.gep(acc_p, [mm.index]), align=4)
            for j in range(ROWS):
                n = builder.add(n0, I64(j))
                with builder.if_then(builder.icmp_signed("<", n, hi)):
                    builder.store(builder.extract_element(acc, I32(j)),
                                  builder.gep(out, [builder.add(builder.mul(mm.index, N), n)],
                                              source_etype=F32))


def make_chunk_kernel(qtype: int, vnni: bool | None = None, f16c: bool | None = None,
                      repacked: bool = False):
    """-> intrinsic ``kernel(w, xq, xd, out, acc, c, n_chunks)``: out[:, n] for the rows n
    of chunk c (see _emit_chunk); acc: float32 (16·M,) scratch of the calling thread;
    repacked: w holds kquants_repack.py's blocks.  ``vnni`` / ``f16c`` pick the instruction
    path (default: what the target has); every path computes the same values."""
    decoder = (REPACKED_DECODERS if repacked else DECODERS)[qtype]
    block_bytes = FORMATS[qtype].type_size
    vnni = have_vnni512() if vnni is None else vnni
    f16c = have_f16c() if f16c is None else f16c

    def decode(builder, p):
        return decoder(builder, p, f16c)

    def kernel(typingctx, w, xq, xd, out, acc, c, n_chunks):
        sig = types.void(w, xq, xd, out, acc, c, n_chunks)

        def codegen(context, builder, signature, args):
            wa, xqa, xda, outa, acca = (context.make_array(t)(context, builder, value=v)
                                        for t, v in zip(signature.args[:5], args[:5]))
            c_, nc = (context.cast(builder, v, t, types.int64)
                      for v, t in zip(args[5:], signature.args[5:]))
            nblk, M = cgutils.unpack_tuple(builder, xda.shape, 2)
            x = _Q8K(xqa.data, xda.data, M, nblk)
            N = cgutils.unpack_tuple(builder, outa.shape, 2)[1]
            row_bytes = cgutils.unpack_tuple(builder, wa.shape, 2)[1]
            acc_p = builder.bitcast(acca.data, V16F32.as_pointer())
            _emit_chunk(builder, decode, block_bytes, vnni, wa.data, row_bytes, x, outa.data, N,
                        c_, nc, acc_p)
            return context.get_dummy_value()
        return sig, codegen

    kernel.__name__ = f"chunk_{FORMATS[qtype].name.lower()}{'_r' if repacked else ''}"
    return intrinsic(kernel)


def make_load_f16(f16c: bool | None = None):
    """-> intrinsic ``load_f16(w, n, byte_off) -> float32``: the IEEE half at byte
    ``byte_off`` of row ``n`` of the uint8 matrix ``w`` (GGML_FP16_TO_FP32), exact."""
    f16c = have_f16c() if f16c is None else f16c

    def load_f16(typingctx, w, n, off):
        sig = types.float32(w, n, off)

        def codegen(context, builder, signature, args):
            wa = context.make_array(signature.args[0])(context, builder, value=args[0])
            n_, o_ = (context.cast(builder, v, t, types.int64)
                      for v, t in zip(args[1:], signature.args[1:]))
            row_bytes = cgutils.unpack_tuple(builder, wa.shape, 2)[1]
            p = builder.gep(wa.data, [builder.add(builder.mul(n_, row_bytes), o_)], source_etype=I8)
            return f16_to_f32(builder, builder.load(p, typ=I16, align=1), f16c)
        return sig, codegen

    return intrinsic(load_f16)


load_f16 = make_load_f16()
_chunk_q2_k, _chunk_q3_k, _chunk_q4_k, _chunk_q5_k, _chunk_q6_k = (
    make_chunk_kernel(qt) for qt in KQUANTS)
_chunk_q4_k_r, _chunk_q5_k_r, _chunk_q6_k_r = (
    make_chunk_kernel(qt, repacked=True) for qt in (Q4_K, Q5_K, Q6_K))


# ------------------------------------------------------------------------------ drivers
# matmul_<fmt>(w, xq, xd, xbs, out, n_chunks): out (M, N) = x · Wᵀ from Q8_K
# activations, prange over n_chunks contiguous chunks of output rows.  One driver per format: Numba caches a function per
# definition, so the kernel is a global constant, not an argument; the drivers live in
# this file so that an edit of the IR above invalidates their cache.

@njit(cache=True, nogil=True, parallel=True)
def matmul_q2_k(w, xq, xd, out, n_chunks):
    for c in prange(n_chunks):
        _chunk_q2_k(w, xq, xd, out, np.empty(16 * xd.shape[1], np.float32), c, n_chunks)


@njit(cache=True, nogil=True, parallel=True)
def matmul_q3_k(w, xq, xd, out, n_chunks):
    for c in prange(n_chunks):
        _chunk_q3_k(w, xq, xd, out, np.empty(16 * xd.shape[1], np.float32), c, n_chunks)


@njit(cache=True, nogil=True, parallel=True)
def matmul_q4_k(w, xq, xd, out, n_chunks):
    for c in prange(n_chunks):
        _chunk_q4_k(w, xq, xd, out, np.empty(16 * xd.shape[1], np.float32), c, n_chunks)


@njit(cache=True, nogil=True, parallel=True)
def matmul_q5_k(w, xq, xd, out, n_chunks):
    for c in prange(n_chunks):
        _chunk_q5_k(w, xq, xd, out, np.empty(16 * xd.shape[1], np.float32), c, n_chunks)


@njit(cache=True, nogil=True, parallel=True)
def matmul_q6_k(w, xq, xd, out, n_chunks):
    for c in prange(n_chunks):
        _chunk_q6_k(w, xq, xd, out, np.empty(16 * xd.shape[1], np.float32), c, n_chunks)


MATMUL_Q8K = {Q2_K: matmul_q2_k, Q3_K: matmul_q3_k, Q4_K: matmul_q4_k, Q5_K: matmul_q5_k,
              Q6_K: matmul_q6_k}


@njit(cache=True, nogil=True, parallel=True)
def matmul_q4_k_r(w, xq, xd, out, n_chunks):
    for c in prange(n_chunks):
        _chunk_q4_k_r(w, xq, xd, out, np.empty(16 * xd.shape[1], np.float32), c, n_chunks)


@njit(cache=True, nogil=True, parallel=True)
def matmul_q5_k_r(w, xq, xd, out, n_chunks):
    for c in prange(n_chunks):
        _chunk_q5_k_r(w, xq, xd, out, np.empty(16 * xd.shape[1], np.float32), c, n_chunks)


@njit(cache=True, nogil=True, parallel=True)
def matmul_q6_k_r(w, xq, xd, out, n_chunks):
    for c in prange(n_chunks):
        _chunk_q6_k_r(w, xq, xd, out, np.empty(16 * xd.shape[1], np.float32), c, n_chunks)


MATMUL_Q8K_REPACKED = {Q4_K: matmul_q4_k_r, Q5_K: matmul_q5_k_r, Q6_K: matmul_q6_k_r}
