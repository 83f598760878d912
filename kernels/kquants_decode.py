"""K-quant super-blocks decoded into registers, lane-major (LLVM IR for kquants_ir's kernels).

A decoder ``decode(builder, p, f16c) -> Decoded`` reads one super-block at the i8* p and
returns its unsigned codes as four vectors V_k (k = 0…3) of 16 int32 lanes, lane L holding
the values 16L+4k … 16L+4k+3 of scale group L (one byte each: Q8_K's lane-major order, see
q8k.py), the integer scales sc (and mins mn) of the 16 groups as <16 x i32> lanes and the
float super-block scales d (and dmin): the parts of reference.kquant_parts, in registers.
``DECODERS``: the GGUF blocks (ggml's dequantize_row_qX_K).
"""
from __future__ import annotations

from typing import Callable, NamedTuple

from llvmlite import ir

from .formats import Q2_K, Q3_K, Q4_K, Q5_K, Q6_K
from .ir import I8, I16, I32, V16I32, const_vector, vec_i32, f16_to_f32, load_bytes, shuffle

LANES = range(16)


# ---------------------------------------------------------------------------- IR helpers

def _lanes(builder, words, index, shift, mask: int):
    """(words[index[L]] >> shift[L]) & mask for the 16 lanes: a dword gather (vpermd /
    vpermt2d), a per-lane shift (vpsrlvd) and a byte-wise mask."""
    v = shuffle(builder, words, index)
    if any(shift):
        v = builder.lshr(v, const_vector(I32, shift))
    return builder.and_(v, vec_i32(mask))


# ------------------------------------------------------------------------ block decoders

class Decoded(NamedTuple):
    """One super-block in registers (lane-major, see the module docstring)."""
    u: list            # 4 × <16 x i32> (= <64 x u8>): V_k, unsigned codes
    sc: ir.Value       # <16 x i32>: the integer scale of group L
    mn: ir.Value       # <16 x i32>: the integer min of group L (Q2_K, Q4_K, Q5_K), else None
    d: ir.Value        # float: the super-block scale
    dmin: ir.Value     # float: the super-block min scale, or None
    off: int           # q = u − off (32 Q6_K, 4 Q3_K, else 0)
    u_max: int         # the largest code: 2^bits − 1 (bounds the AVX2 path's i16 sums)
    d16: ir.Value = None      # i16: the fp16 bits of d (converted many rows at once)
    dmin16: ir.Value = None   # i16: those of dmin, or None


def _half(builder, p, at: int, f16c: bool):
    """(float, i16 bits) of the fp16 at byte ``at`` of p."""
    bits = load_bytes(builder, p, at, I16)
    return f16_to_f32(builder, bits, f16c), bits


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
    (d, d16), (dmin, dmin16) = (_half(builder, p, at, f16c) for at in (0, 2))
    return Decoded(u, sc, mn, d, dmin, 0, 15, d16, dmin16)


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
        u.append(builder.or_(lo, builder.shl(hi, vec_i32(4))))
    sc, mn = k4_scales(builder, p, 4)
    (d, d16), (dmin, dmin16) = (_half(builder, p, at, f16c) for at in (0, 2))
    return Decoded(u, sc, mn, d, dmin, 0, 31, d16, dmin16)


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
        u.append(builder.or_(lo, builder.shl(hi, vec_i32(4))))
    sc = builder.sext(load_bytes(builder, p, 192, ir.VectorType(I8, 16)), V16I32)
    d, d16 = _half(builder, p, 208, f16c)
    return Decoded(u, sc, None, d, None, 32, 63, d16)


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
        u.append(builder.or_(_crumbs(builder, qs, k), builder.shl(hb, vec_i32(2))))
    # scale L: low nibble of byte L%8 (shifted by 4·(L//8)) | 2 bits of byte 8 + L%4 << 4
    V16 = ir.VectorType(I8, 16)
    lo8 = load_bytes(builder, p, 96, ir.VectorType(I8, 8))
    lo = builder.and_(builder.lshr(shuffle(builder, lo8, [L % 8 for L in LANES]),
                                   const_vector(I8, [4 * (L // 8) for L in LANES])), ir.Constant(V16, 15))
    hi4 = load_bytes(builder, p, 104, ir.VectorType(I8, 4))
    hi = builder.and_(builder.lshr(shuffle(builder, hi4, [L % 4 for L in LANES]),
                                   const_vector(I8, [2 * (L // 4) for L in LANES])), ir.Constant(V16, 3))
    sc6 = builder.or_(lo, builder.shl(hi, ir.Constant(V16, 4)))
    sc = builder.sub(builder.zext(sc6, V16I32), vec_i32(32))
    d, d16 = _half(builder, p, 108, f16c)
    return Decoded(u, sc, None, d, None, 4, 7, d16)


def _decode_q2_k(builder, p, f16c):
    """block_q2_K (84 B): scales[16] (scale | min << 4), qs[64], d, dmin (dequantize_row_q2_K).
    u ≤ 3, sc, mn ≤ 15: |dot| ≤ 16·3·127 < 2^13."""
    qs = load_bytes(builder, p, 16, V16I32)
    u = [_crumbs(builder, qs, k) for k in range(4)]
    sm = load_bytes(builder, p, 0, ir.VectorType(I8, 16))
    sc = builder.zext(builder.and_(sm, ir.Constant(sm.type, 15)), V16I32)
    mn = builder.zext(builder.lshr(sm, ir.Constant(sm.type, 4)), V16I32)
    (d, d16), (dmin, dmin16) = (_half(builder, p, at, f16c) for at in (80, 82))
    return Decoded(u, sc, mn, d, dmin, 0, 3, d16, dmin16)


DECODERS: dict[int, Callable] = {           # qtype -> super-block decoder
    Q2_K: _decode_q2_k, Q3_K: _decode_q3_k, Q4_K: _decode_q4_k, Q5_K: _decode_q5_k,
    Q6_K: _decode_q6_k,
}
