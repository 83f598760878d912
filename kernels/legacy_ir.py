"""SIMD tile kernel for the legacy quants (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0) as Numba intrinsics.

``TILE[qtype](w, row0, rs, b, xq, xsum, xd, xs, k, nb, m0, m1, acc, acc0, acc_ms)``
handles one 32-element block ``b`` of R = TILE_ROWS[qtype] (16; 8 for Q5_0 at M = 1) consecutive weight
rows (byte offsets ``row0 + r*rs``, r < R) against activation rows m0 <= m < m1:

1. decode the R blocks ONCE into unsigned codes u (uint8, 32 per row) plus the fp16
   scales d (and mins m for the _1 formats):
       Q4_0  w = u - 8     Q5_0  w = u - 16     Q8_0  w = u - 128 (u = w xor 0x80)
       Q4_1  w = d*u + m   Q5_1  w = d*u + m
2. transpose each 8x8 matrix of 4-byte groups so that vector c holds codes 4c..4c+3
   of every row (the 4/5-bit formats transpose the packed 8x4 nibble bytes instead,
   split the nibbles afterwards and add the fifth bits column by column: half the
   shuffles);
3. for each m: ``vpdpbusd`` with the broadcast 4-byte group c of xq[m] gives, in lane r,
   the exact integer dot product of row r's block with the activation block; the
   offset is removed exactly with the block sum of xq:
       isum[r] = sum_j u[r, j] * xq[m, j]  -  off * xsum[m, b]
   and the block's float contribution is added to acc[acc0 + m*acc_ms + r]:
       _0 formats:  acc += float(isum) * (d_w * d_x)
       _1 formats:  acc += ((d_w * d_x) * float(isum) + m_w * s_x)
   which is the per-block update of ggml_vec_dot_q8_0_q8_0 / q5_0_q8_0 /
   q4_1_q8_1 / q5_1_q8_1 (generic versions) with d_w, d_x, m_w, s_x from fp16.

All integer arithmetic is exact (|isum| <= 32*255*127 < 2^31), so how the products
are grouped cannot change a result; each float operation is a plain IEEE fmul/fadd
in a fixed order per (row, m) and lanes never interact: out[m] is bitwise the same
whatever M is, whatever the other rows of x hold and whichever ISA path ran.

Arrays (flat, C-contiguous): w uint8 raw GGUF bytes; xq int8 (M*K); xsum int32,
xd float32, xs float32 (M*K/32); acc float32.
"""
from __future__ import annotations

from typing import Callable, NamedTuple

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from .formats import FORMATS, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0
from .ir import (F16, F32, I16, I32, I64, V8F32, V8I16, V8I32, V32I8, V64I8, arg_readers, dpbusd_chain,
                 dpbusd_words, have_avx2, have_vnni256, join, load_at, prefetch, shuffle2, splat, store_at,
                 vector_type)

# ------------------------------------------------------------------------------ IR helpers

def _transpose8(builder, rows: list) -> list:
    """8 x <8 x i32> -> 8 x <8 x i32>, out[c][r] = rows[r][c] (unpack/unpack/permute)."""
    lo32, hi32 = [0, 8, 1, 9, 4, 12, 5, 13], [2, 10, 3, 11, 6, 14, 7, 15]
    lo64, hi64 = [0, 1, 8, 9, 4, 5, 12, 13], [2, 3, 10, 11, 6, 7, 14, 15]
    lo128, hi128 = [0, 1, 2, 3, 8, 9, 10, 11], [4, 5, 6, 7, 12, 13, 14, 15]
    a = []
    for i in range(0, 8, 2):
        a += [shuffle2(builder, rows[i], rows[i + 1], idx) for idx in (lo32, hi32)]
    # a[2i] = cols (0,1 | 4,5) of rows 2i, 2i+1; a[2i+1] = cols (2,3 | 6,7)
    b = []
    for base in (0, 4):
        p, q = a[base:base + 2], a[base + 2:base + 4]
        b += [shuffle2(builder, p[0], q[0], lo64), shuffle2(builder, p[0], q[0], hi64),
              shuffle2(builder, p[1], q[1], lo64), shuffle2(builder, p[1], q[1], hi64)]
    # b[c'] (c' < 4) = column c' | c'+4 of rows 0-3; b[4 + c'] the same for rows 4-7
    out = [None] * 8
    for c in range(4):
        out[c] = shuffle2(builder, b[c], b[4 + c], lo128)
        out[c + 4] = shuffle2(builder, b[c], b[4 + c], hi128)
    return out


def _f16x8(builder, wp, offs: list):
    """Eight fp16 loaded from byte offsets -> <8 x float> (exact, GGML_FP16_TO_FP32)."""
    v = ir.Constant(V8I16, None)
    for r, off in enumerate(offs):
        v = builder.insert_element(v, load_at(builder, wp, off, I16), I32(r))
    return builder.fpext(builder.bitcast(v, vector_type(F16, 8)), V8F32)


def _f16_pairs_x8(builder, wp, offs: list):
    """fp16 d and m stored together (block_q4_1 / q5_1 head) -> (<8 x float> d, m)."""
    v = ir.Constant(V8I32, None)
    for r, off in enumerate(offs):
        v = builder.insert_element(v, load_at(builder, wp, off, I32), I32(r))
    high = builder.lshr(v, ir.Constant(V8I32, [16] * 8))
    halves = [builder.trunc(v, V8I16), builder.trunc(high, V8I16)]
    return [builder.fpext(builder.bitcast(h, vector_type(F16, 8)), V8F32) for h in halves]


def _nibble_cols(builder, wp, offs: list):
    """8 rows x 16 packed bytes -> the 8 transposed code vectors, without unpacking first.

    Byte i of qs holds element i (low nibble) and element 16+i (high nibble), so dword c
    (c < 4) of qs carries elements 4c..4c+3 low and 16+4c.. high: transposing the 8x4
    dword matrix and splitting nibbles gives columns c and 4+c directly.
    """
    qs = [load_at(builder, wp, off, vector_type(I32, 4)) for off in offs]
    y = [shuffle2(builder, qs[r], qs[r + 4], list(range(8))) for r in range(4)]  # rows r | r+4
    lo32, hi32 = [0, 8, 1, 9, 4, 12, 5, 13], [2, 10, 3, 11, 6, 14, 7, 15]
    lo64, hi64 = [0, 1, 8, 9, 4, 5, 12, 13], [2, 3, 10, 11, 6, 7, 14, 15]
    a01 = [shuffle2(builder, y[0], y[1], lo32), shuffle2(builder, y[0], y[1], hi32)]
    a23 = [shuffle2(builder, y[2], y[3], lo32), shuffle2(builder, y[2], y[3], hi32)]
    t = []
    for i in range(2):
        t += [shuffle2(builder, a01[i], a23[i], lo64), shuffle2(builder, a01[i], a23[i], hi64)]
    mask = ir.Constant(V8I32, [0x0F0F0F0F] * 8)
    four = ir.Constant(V8I32, [4] * 8)
    lows = [builder.and_(c, mask) for c in t]
    return lows + [builder.and_(builder.lshr(c, four), mask) for c in t]


def _row_cols(builder, codes: list) -> list:
    """8 rows of 32 codes (<32 x i8>) -> 8 column vectors (4-byte group c of every row)."""
    return _transpose8(builder, [builder.bitcast(c, V8I32) for c in codes])


class Decoded(NamedTuple):
    cols: list        # 8 x <8 x i32>: lane r of cols[c] = codes 4c..4c+3 of row r (uint8 u)
    off: int          # w = u - off (0 for the _1 formats)
    d: object         # <8 x float> weight scales
    m: object | None  # <8 x float> weight mins (_1 formats) or None


# ----------------------------------------------------- per-format block decoders (8 rows;
# a 16-row tile decodes twice and joins the halves)
# ``o[r]`` is the byte offset of the block in row r; layouts from ggml-common.h.

def _plus(builder, offs: list, k: int) -> list:
    return [builder.add(o, I64(k)) for o in offs]


def _dec_q4_0(builder, wp, o) -> Decoded:
    """block_q4_0: fp16 d | 16 B qs.  matches dequantize_row_q4_0."""
    cols = _nibble_cols(builder, wp, _plus(builder, o, 2))
    return Decoded(cols, 8, _f16x8(builder, wp, o), None)


def _dec_q4_1(builder, wp, o) -> Decoded:
    """block_q4_1: fp16 d | fp16 m | 16 B qs.  matches dequantize_row_q4_1."""
    d, m = _f16_pairs_x8(builder, wp, o)
    return Decoded(_nibble_cols(builder, wp, _plus(builder, o, 4)), 0, d, m)


def _q5_head(builder, wp, offs: list, qh_at: int):
    """First 8 bytes of each row's block -> (<8 x i64> heads, <32 x i8> qh bytes).

    Lane r of the qh vector holds row r's u32 qh (bytes qh_at..qh_at+3 of the block).
    """
    heads = ir.Constant(vector_type(I64, 8), None)
    for r, off in enumerate(offs):
        heads = builder.insert_element(heads, load_at(builder, wp, off, I64), I32(r))
    qh = builder.trunc(builder.lshr(heads, ir.Constant(vector_type(I64, 8), [8 * qh_at] * 8)), V8I32)
    return heads, builder.bitcast(qh, V32I8)


def _half_field(builder, heads, shift: int):
    """16-bit field at bit ``shift`` of each i64 lane, as fp16 -> <8 x float>."""
    v = builder.lshr(heads, ir.Constant(vector_type(I64, 8), [shift] * 8)) if shift else heads
    return builder.fpext(builder.bitcast(builder.trunc(v, V8I16), vector_type(F16, 8)), V8F32)


def _q5_cols(builder, wp, offs: list, qh_at: int, qh_bytes):
    """Q5 codes as transposed columns: packed nibble columns | 16 * (5th bit).

    Element e of a row takes bit e of its qh: byte e//8, bit e%8.  Column c holds
    elements 4c..4c+3 (c < 4) or 16+4(c-4).. (c >= 4), so byte i of lane r needs bit
    4*(c%2) + i of qh byte (c//2 or 2 + (c-4)//2): replicate that byte over the lane's
    4 bytes, test one bit per byte, and set 16 where it is on.
    """
    cols = _nibble_cols(builder, wp, _plus(builder, offs, qh_at + 4))
    sixteen, zero = ir.Constant(V32I8, [16] * 32), ir.Constant(V32I8, [0] * 32)
    out = []
    for c, col in enumerate(cols):
        byte = c // 2 if c < 4 else 2 + (c - 4) // 2
        spread = [4 * lane + byte for lane in range(8) for _ in range(4)]
        rep = shuffle2(builder, qh_bytes, qh_bytes, spread)
        bit = ir.Constant(V32I8, [1 << (4 * (c % 2) + i) for _ in range(8) for i in range(4)])
        on = builder.icmp_unsigned("!=", builder.and_(rep, bit), zero)
        c8 = builder.bitcast(col, V32I8)       # bit 4 is clear: adding 16 sets it (vpaddb {k})
        out.append(builder.bitcast(builder.select(on, builder.add(c8, sixteen), c8), V8I32))
    return out


def _dec_q5_0(builder, wp, o) -> Decoded:
    """block_q5_0: fp16 d | u32 qh | 16 B qs.  matches dequantize_row_q5_0."""
    heads, qh = _q5_head(builder, wp, o, 2)
    return Decoded(_q5_cols(builder, wp, o, 2, qh), 16, _half_field(builder, heads, 0), None)


def _dec_q5_1(builder, wp, o) -> Decoded:
    """block_q5_1: fp16 d | fp16 m | u32 qh | 16 B qs.  matches dequantize_row_q5_1."""
    heads, qh = _q5_head(builder, wp, o, 4)
    d, m = _half_field(builder, heads, 0), _half_field(builder, heads, 16)
    return Decoded(_q5_cols(builder, wp, o, 4, qh), 0, d, m)


def _dec_q8_0(builder, wp, o) -> Decoded:
    """block_q8_0: fp16 d | 32 x int8.  u = w xor 0x80 = w + 128 as uint8."""
    flip = ir.Constant(V32I8, [-128] * 32)
    codes = [builder.xor(load_at(builder, wp, x, V32I8), flip) for x in _plus(builder, o, 2)]
    return Decoded(_row_cols(builder, codes), 128, _f16x8(builder, wp, o), None)


DECODERS: dict[int, Callable] = {            # qtype -> 8-row block decoder
    Q4_0: _dec_q4_0, Q4_1: _dec_q4_1, Q5_0: _dec_q5_0, Q5_1: _dec_q5_1, Q8_0: _dec_q8_0,
}


# ------------------------------------------------------------------------------ the tile

AVX2_PAIRS = True   # AVX2, 4/5-bit codes: pair sums in int16 (emit_tile); measured by benchmarks/kernels_zen3.py
PREFETCH_TILES = 1  # how many tiles ahead _prefetch_ahead requests (2 and 4 were slower)

def _prefetch_ahead(builder, wp, row0, rs, b, block_bytes: int, rows: int = 8) -> None:
    """Prefetch slice b of the tile ``PREFETCH_TILES`` ahead, in address order.

    The tile loop visits its rows interleaved (row stride apart), a pattern the hardware
    prefetchers follow poorly (about a third of the streaming bandwidth).  Call b of the
    tile touches bytes [b*R*bb, (b+1)*R*bb) of the region of a later tile, so over the K/32
    calls that region (R rows = R*nb*bb bytes) is requested line by line, in order.
    """
    span = rows * block_bytes
    start = builder.add(builder.add(row0, builder.mul(rs, I64(rows * PREFETCH_TILES))),
                        builder.mul(b, I64(span)))
    for line in range((span + 63) // 64):
        prefetch(builder, builder.gep(wp, [builder.add(start, I64(64 * line))]))


def emit_tile(builder, dec: Decoded, vnni: bool, ptrs, ints) -> None:
    """Step 3 of the module docstring: the loop over activation rows m0 <= m < m1."""
    xq_p, xsum_p, xd_p, xs_p, acc_p = ptrs
    b, k, nb, m0, m1, acc0, acc_ms = ints
    cols = dec.cols
    width = cols[0].type.count  # rows in the tile: lanes of every vector below
    vi, vf = vector_type(I32, width), vector_type(F32, width)
    xoff = builder.mul(b, I64(32))
    u_max = 255 if dec.off == 128 else 31   # Q8_0's u = w xor 0x80; the 4/5-bit codes
    zero = ir.Constant(vi, None)
    with cgutils.for_range(builder, m1, start=m0) as loop:
        m = loop.index
        xw = load_at(builder, xq_p, builder.add(builder.mul(m, k), xoff), vector_type(I32, 8))
        xcs = [splat(builder, builder.extract_element(xw, I32(c)), width) for c in range(8)]
        if AVX2_PAIRS and not vnni and have_avx2() and width == 16 and u_max <= 128:
            # AVX2: the vpmaddubsw pair sums of several columns added in int16 before one
            # vpmaddwd (ir.dpbusd_chain), half the vpmaddwd of a column at a time
            isum = dpbusd_chain(builder, False, [builder.bitcast(c, V64I8) for c in cols],
                                [builder.bitcast(x, V64I8) for x in xcs], u_max)
        else:
            # two independent accumulation chains (exact ints, so grouping is free)
            sums = [zero, zero]
            for c in range(8):
                sums[c % 2] = dpbusd_words(builder, vnni, sums[c % 2], cols[c], xcs[c], u_max)
            isum = builder.add(sums[0], sums[1])
        mb = builder.add(builder.mul(m, nb), b)
        if dec.off:
            corr = builder.mul(load_at(builder, xsum_p, mb, I32, 4), I32(dec.off))
            isum = builder.sub(isum, splat(builder, corr, width))
        dd = builder.fmul(dec.d, splat(builder, load_at(builder, xd_p, mb, F32, 4), width))
        t = builder.fmul(dd, builder.sitofp(isum, vf))
        if dec.m is not None:
            sx = splat(builder, load_at(builder, xs_p, mb, F32, 4), width)
            t = builder.fadd(t, builder.fmul(dec.m, sx))
        aoff = builder.add(acc0, builder.mul(m, acc_ms))
        store_at(builder, builder.fadd(load_at(builder, acc_p, aoff, vf, 4), t), acc_p, aoff, 4)


def make_tile(qtype: int, vnni: bool | None = None, rows: int = 8):
    """Build the tile intrinsic for ``qtype`` over ``rows`` (8 or 16) weight rows.

    ``vnni=None``: use vpdpbusd when the CPU has it, else portable IR (same integers).
    """
    decoder, block_bytes = DECODERS[qtype], FORMATS[qtype].type_size
    use_vnni = have_vnni256() if vnni is None else vnni

    @intrinsic
    def tile(typingctx, w, row0, rs, b, xq, xsum, xd, xs, k, nb, m0, m1, acc, acc0, acc_ms):
        sig = types.void(w, row0, rs, b, xq, xsum, xd, xs, k, nb, m0, m1, acc, acc0, acc_ms)

        def codegen(context, builder, signature, args):
            data, as_i64 = arg_readers(context, builder, signature, args)

            wp = data(0)
            row0_, rs_, b_ = as_i64(1), as_i64(2), as_i64(3)
            blk = builder.add(row0_, builder.mul(b_, I64(block_bytes)))
            offs = [builder.add(blk, builder.mul(rs_, I64(r))) for r in range(rows)]
            _prefetch_ahead(builder, wp, row0_, rs_, b_, block_bytes, rows)
            dec = decoder(builder, wp, offs[:8])
            if rows == 16:
                hi = decoder(builder, wp, offs[8:])
                dec = Decoded([join(builder, a, c) for a, c in zip(dec.cols, hi.cols)], dec.off,
                              join(builder, dec.d, hi.d),
                              None if dec.m is None else join(builder, dec.m, hi.m))
            ptrs = (data(4), data(5), data(6), data(7), data(12))
            ints = (b_, as_i64(8), as_i64(9), as_i64(10), as_i64(11), as_i64(13), as_i64(14))
            emit_tile(builder, dec, use_vnni, ptrs, ints)
            return context.get_dummy_value()

        return sig, codegen

    return tile


# Rows per tile: 16 (zmm) halves the per-activation-row work.  Decoding one token (M = 1)
# reads Q5_0 in 8-row tiles, where LLVM's lowering of the 16-row decode came out ~10% slower
# (interleaved A/B); from M = 2 on the 16-row tile wins (M = 2: ~25%, M = 8: 2x).  Lanes never
# interact, so both give the same bits.
TILE_ROWS = {qt: 16 for qt in DECODERS}
TILE = {qt: make_tile(qt, rows=TILE_ROWS[qt]) for qt in DECODERS}
DECODE_ROWS = 8                                  # Q5_0 tile rows when M == 1
TILE_Q5_0_DECODE = make_tile(Q5_0, rows=DECODE_ROWS)


# ------------------------------------------------------------- float32 dot (F32/F16/BF16)

@intrinsic
def dot32_lanes(typingctx, a, a0, x, x0, n32):
    """float32 dot of a[a0 : a0+32*n32] and x[x0 : ...] with 32 interleaved partial sums.

    Lane l (0..31) adds a[i]*x[i] for i = l mod 32, in order (fmul then fadd, as in
    ggml_vec_dot_f32's float32 accumulators).  The lanes are combined as
    v[j] = (l[j] + l[j+8]) + (l[j+16] + l[j+24]), then ((v0+v1)+(v2+v3))+((v4+v5)+(v6+v7)).
    a, x: flat float32 arrays; returns float32.
    """
    sig = types.float32(a, a0, x, x0, n32)

    def codegen(context, builder, signature, args):
        ap = context.make_array(signature.args[0])(context, builder, args[0]).data
        xp = context.make_array(signature.args[2])(context, builder, args[2]).data
        a0_, x0_, n_ = (context.cast(builder, args[i], signature.args[i], types.int64)
                        for i in (1, 3, 4))
        accs = [cgutils.alloca_once_value(builder, ir.Constant(V8F32, None)) for _ in range(4)]
        with cgutils.for_range(builder, n_) as loop:
            base = builder.mul(loop.index, I64(32))
            for j, slot in enumerate(accs):
                off = builder.add(base, I64(8 * j))
                prod = builder.fmul(load_at(builder, ap, builder.add(a0_, off), V8F32, 4),
                                    load_at(builder, xp, builder.add(x0_, off), V8F32, 4))
                builder.store(builder.fadd(builder.load(slot), prod), slot)
        lanes = [builder.load(s) for s in accs]
        v = builder.fadd(builder.fadd(lanes[0], lanes[1]), builder.fadd(lanes[2], lanes[3]))
        e = [builder.extract_element(v, I32(i)) for i in range(8)]
        pairs = [builder.fadd(e[i], e[i + 1]) for i in range(0, 8, 2)]
        return builder.fadd(builder.fadd(pairs[0], pairs[1]), builder.fadd(pairs[2], pairs[3]))

    return sig, codegen
