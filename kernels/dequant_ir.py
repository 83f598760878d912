"""The float-activation matmul's weight decoding as SIMD code (Numba intrinsics): sixteen
values per vector, in value order, straight into float32 dot products.

``MATMUL_DOT[qtype](w, x, out, n_chunks)``: out (M, N) = x · dequant(W)ᵀ for up to
MAX_FUSED_M activation rows x (float32 (M, K)); w uint8 (N, row_bytes), raw GGUF rows; prange
over n_chunks contiguous chunks of rows.  The weights are dequantized bit-exactly as
gguf.quants.dequantize does (the same float32 operations per value, in the same order, no
fused multiply-add) —

    Q4_0  float(q − 8) · d          Q4_1  d · float(q) + m
    Q5_0  float(q − 16) · d         Q5_1  d · float(q) + m          Q8_0  float(q) · d
    Q4_K, Q5_K  (d · sc) · float(q) − (dmin · mn)                   Q6_K  (d · sc) · float(q − 32)

— only sixteen values at a time (a 16-byte load widened to 16 int32 lanes, the nibble or bit
fields shifted and masked per lane, converted and scaled), and each chunk goes straight into
the 32 float32 lanes of every activation row (two vectors per row, in registers): lane l adds
w[i]·x[i] for i ≡ l (mod 32), fmul then fadd, and the lanes fold as legacy_ir.dot32_lanes folds
them.  So out[m, n] is bitwise the float32 dot of the dequantized row with x[m] in
dot32_lanes' order, whatever M is (float_act.py runs more rows in passes of MAX_FUSED_M, and
Q2_K / Q3_K, which have no decoder here, through a dequantized row buffer and dot32_lanes).
Each thread walks its contiguous rows front to back and prefetches PREFETCH_BYTES ahead: the
decode is compute-heavy enough that, without it, the weights' memory latency goes unhidden
(docs/architecture.md, "Tuned constants", has the measurements behind both constants).

``GET_ROWS_DEQUANT[qtype](w, ids, out)``: the same block decoders writing the values to out
(float32 (M, K)) instead: the row lookup (embeddings) of these formats, so that each format's
bits are decoded to floats in one place.
"""
from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from . import drivers
from .formats import FORMATS, Q4_0, Q4_1, Q4_K, Q5_0, Q5_1, Q5_K, Q6_K, Q8_0
from .ir import (F32, I8, I16, I32, I64, V16F32, V16I8, V16I32, f16_to_f32, have_f16c, prefetch,
                 splat, switch_static)
from .kquants_decode import k4_scales


class _Row:
    """One weight row (its i8*) being decoded into the lanes of the activation rows: block
    decoders read it through the helpers below and hand each chunk of 16 dequantized values
    to ``emit(y, off, vals)`` (values y + off … y + off + 15 of the row), which multiplies
    them by the same 16 values of every activation row m and adds them to m's lanes — lane l
    of the 32 (two vectors of 16) takes the values i ≡ l (mod 32), fmul then fadd, as
    legacy_ir.dot32_lanes does."""

    def __init__(self, builder, f16c: bool, row, x, k, accs):
        self.b, self.f16c, self.row = builder, f16c, row
        self.x, self.k, self.accs = x, k, accs        # accs[m] = (lanes 0-15, lanes 16-31) allocas

    def ptr(self, off):
        """i8* at byte ``off`` (int or i64 value) of the row."""
        return self.b.gep(self.row, [off if isinstance(off, ir.Value) else I64(off)], source_etype=I8)

    def at(self, base, k: int):
        return self.b.add(base, I64(k))

    def byte16(self, off):
        """16 bytes at ``off`` as <16 x i32> lanes (zero-extended)."""
        return self.b.zext(self.b.load(self.ptr(off), typ=V16I8, align=1), V16I32)

    def i8x16(self, off):
        """16 signed bytes at ``off`` as <16 x i32> lanes."""
        return self.b.sext(self.b.load(self.ptr(off), typ=V16I8, align=1), V16I32)

    def half(self, off):
        """The fp16 at ``off`` -> float (exact)."""
        return f16_to_f32(self.b, self.b.load(self.ptr(off), typ=I16, align=1), self.f16c)

    def u8(self, off):
        return self.b.zext(self.b.load(self.ptr(off), typ=I8, align=1), I32)

    def s8(self, off):
        return self.b.sext(self.b.load(self.ptr(off), typ=I8, align=1), I32)

    def u32(self, off):
        return self.b.load(self.ptr(off), typ=I32, align=1)

    def splat(self, v, n: int = 16):
        return splat(self.b, v, n)

    def bits(self, v, shift: int, mask: int):
        """(v >> shift) & mask, lane by lane."""
        if shift:
            v = self.b.lshr(v, ir.Constant(V16I32, shift))
        return self.b.and_(v, ir.Constant(V16I32, mask))

    def tofloat(self, v):
        return self.b.sitofp(v, V16F32)

    def emit(self, y, off: int, vals):
        b = self.b
        for m, pair in enumerate(self.accs):
            i = b.add(b.mul(I64(m), self.k), self.at(y, off))
            xp = b.bitcast(b.gep(self.x, [i], source_etype=F32), V16F32.as_pointer())
            slot = pair[(off // 16) % 2]                # y is a multiple of 32
            b.store(b.fadd(b.load(slot), b.fmul(vals, b.load(xp, align=4))), slot)


class _Store(_Row):
    """A row decoded into memory: ``emit`` writes the 16 values to dst[y + off …]."""

    def __init__(self, builder, f16c: bool, row, dst):
        super().__init__(builder, f16c, row, None, None, ())
        self.dst = dst

    def emit(self, y, off: int, vals):
        p = self.b.gep(self.dst, [self.at(y, off)], source_etype=F32)
        self.b.store(vals, self.b.bitcast(p, V16F32.as_pointer()), align=4)


# ------------------------------------------------------------------------- legacy blocks
# One block of 32 at byte o of the row, its values y … y + 31; layouts in ggml-common.h.

def _qh_bits(r: _Row, qh, first: int):
    """16 lanes: bit (first + lane) of the block's u32 qh, moved to bit 4."""
    sh = ir.Constant(V16I32, [first + i for i in range(16)])
    return r.b.shl(r.b.and_(r.b.lshr(r.splat(qh), sh), ir.Constant(V16I32, 1)), ir.Constant(V16I32, 4))


def _legacy(kind: str):
    """Block decoder of a 4/5/8-bit legacy format: dequantize_row_q4_0 / q4_1 / q5_0 / q5_1 / q8_0."""
    def block(r: _Row, o, y):
        b = r.b
        d = r.splat(r.half(o))
        if kind == "q8_0":
            for h in range(2):
                v = r.tofloat(r.i8x16(r.at(o, 2 + 16 * h)))
                r.emit(y, 16 * h, b.fmul(v, d))
            return
        mn = r.splat(r.half(r.at(o, 2))) if kind in ("q4_1", "q5_1") else None
        qs_at = {"q4_0": 2, "q4_1": 4, "q5_0": 6, "q5_1": 8}[kind]
        qh = r.u32(r.at(o, {"q5_0": 2, "q5_1": 4}[kind])) if kind[1] == "5" else None
        raw = r.byte16(r.at(o, qs_at))
        for h in range(2):                       # values 16h + i: nibble h of qs[i]
            q = r.bits(raw, 4 * h, 0xF)
            if qh is not None:
                q = b.or_(q, _qh_bits(r, qh, 16 * h))
            if mn is not None:                   # d · float(q) + m
                val = b.fadd(b.fmul(d, r.tofloat(q)), mn)
            else:                                # float(q − off) · d
                off = 8 if kind == "q4_0" else 16
                val = b.fmul(r.tofloat(b.sub(q, ir.Constant(V16I32, off))), d)
            r.emit(y, 16 * h, val)
    return block


# ----------------------------------------------------------------------- K-quant blocks
# One super-block of 256 at byte o, values y … y + 255.

def _q45_k(five: bool):
    """block_q4_K (dequantize_row_q4_K) / block_q5_K (dequantize_row_q5_K)."""
    def block(r: _Row, o, y):
        b = r.b
        d, dmin = r.half(o), r.half(r.at(o, 2))
        qs = 48 if five else 16
        scs, mns = k4_scales(b, r.ptr(o), 4)    # get_scale_min_k4: sub-block j in lane 2j
        for j in range(8):
            sc, mn = (b.extract_element(v, I32(2 * j)) for v in (scs, mns))
            dl = r.splat(b.fmul(d, b.sitofp(sc, F32)))
            ml = r.splat(b.fmul(dmin, b.sitofp(mn, F32)))
            for h in range(2):                   # values 32j + 16h + i
                q = r.bits(r.byte16(r.at(o, qs + 32 * (j // 2) + 16 * h)), 4 * (j % 2), 0xF)
                if five:                         # | bit j of qh[16h + i] << 4
                    hb = r.bits(r.byte16(r.at(o, 16 + 16 * h)), j, 1)
                    q = b.or_(q, b.shl(hb, ir.Constant(V16I32, 4)))
                r.emit(y, 32 * j + 16 * h, b.fsub(b.fmul(dl, r.tofloat(q)), ml))
    return block


def _q6_k(r: _Row, o, y):
    """block_q6_K (dequantize_row_q6_K): ql[128], qh[64], scales[16] int8, d."""
    b = r.b
    d = r.half(r.at(o, 208))
    for g in range(16):                          # values 16g + i, one scale each
        dl = r.splat(b.fmul(d, b.sitofp(r.s8(r.at(o, 192 + g)), F32)))
        h, k, l0 = g // 8, (g // 2) % 4, 16 * (g % 2)
        lo = r.bits(r.byte16(r.at(o, 64 * h + 32 * (k % 2) + l0)), 4 * (k // 2), 0xF)
        hi = r.bits(r.byte16(r.at(o, 128 + 32 * h + l0)), 2 * k, 3)
        q = b.sub(b.or_(lo, b.shl(hi, ir.Constant(V16I32, 4))), ir.Constant(V16I32, 32))
        r.emit(y, 16 * g, b.fmul(dl, r.tofloat(q)))


def _fold32(builder, lo, hi):
    """The 32 lanes (lo: 0-15, hi: 16-31) summed as legacy_ir.dot32_lanes folds them:
    v[j] = (l[j] + l[j+8]) + (l[j+16] + l[j+24]), then ((v0+v1)+(v2+v3)) + ((v4+v5)+(v6+v7))."""
    def half(v, h):
        return builder.shuffle_vector(v, v, ir.Constant(ir.VectorType(I32, 8), list(range(8 * h, 8 * h + 8))))
    v = builder.fadd(builder.fadd(half(lo, 0), half(lo, 1)), builder.fadd(half(hi, 0), half(hi, 1)))
    e = [builder.extract_element(v, I32(i)) for i in range(8)]
    p = [builder.fadd(e[i], e[i + 1]) for i in range(0, 8, 2)]
    return builder.fadd(builder.fadd(p[0], p[1]), builder.fadd(p[2], p[3]))


DECODERS = {                 # qtype -> block decoder (sizes in formats.FORMATS)
    Q4_0: _legacy("q4_0"), Q4_1: _legacy("q4_1"), Q5_0: _legacy("q5_0"), Q5_1: _legacy("q5_1"),
    Q8_0: _legacy("q8_0"), Q4_K: _q45_k(False), Q5_K: _q45_k(True), Q6_K: _q6_k,
}


MAX_FUSED_M = 8         # activation rows per pass: their 32 lanes (2 vectors each) stay in registers
PREFETCH_BYTES = 2048   # how far ahead in its rows' byte stream each block prefetches


def make_rows_dot(qtype: int, f16c: bool | None = None):
    """-> intrinsic ``rows_dot(w, x, out, c, n_chunks)``: out[m, n] = the float32 dot of row n
    of w, dequantized, with x[m] (32 lanes, legacy_ir.dot32_lanes' order and fold: bitwise what
    dequant_row + dot32_lanes give), for the rows n of chunk c of n_chunks and all
    M <= MAX_FUSED_M rows of x (float32 (M, K)); nothing is written to memory but out."""
    qk, nbytes, block = FORMATS[qtype].block_size, FORMATS[qtype].type_size, DECODERS[qtype]
    f16c = have_f16c() if f16c is None else f16c

    def rows_dot(typingctx, w, x, out, c, n_chunks):
        sig = types.void(w, x, out, c, n_chunks)

        def codegen(context, builder, signature, args):
            wa, xa, oa = (context.make_array(t)(context, builder, value=v)
                          for t, v in zip(signature.args[:3], args[:3]))
            c_, nc = (context.cast(builder, v, t, types.int64) for v, t in zip(args[3:], signature.args[3:]))
            row_bytes = cgutils.unpack_tuple(builder, wa.shape, 2)[1]
            M, k = cgutils.unpack_tuple(builder, xa.shape, 2)
            N = cgutils.unpack_tuple(builder, oa.shape, 2)[1]
            lo = builder.sdiv(builder.mul(c_, N), nc)
            hi = builder.sdiv(builder.mul(builder.add(c_, I64(1)), N), nc)

            def body(ms: int):
                accs = [(cgutils.alloca_once(builder, V16F32), cgutils.alloca_once(builder, V16F32))
                        for _ in range(ms)]
                with cgutils.for_range_slice(builder, lo, hi, I64(1)) as (n, _):
                    row = builder.gep(wa.data, [builder.mul(n, row_bytes)], source_etype=I8)
                    for pair in accs:
                        for a in pair:
                            builder.store(ir.Constant(V16F32, 0.0), a)
                    r = _Row(builder, f16c, row, xa.data, k, accs)
                    with cgutils.for_range(builder, builder.sdiv(k, I64(qk))) as loop:
                        i = loop.index
                        o = builder.mul(i, I64(nbytes))
                        for line in range(0, nbytes, 64):    # the stream ahead (next rows too)
                            prefetch(builder, r.ptr(builder.add(o, I64(PREFETCH_BYTES + line))))
                        block(r, o, builder.mul(i, I64(qk)))
                    for m, (a0, a1) in enumerate(accs):
                        o = builder.gep(oa.data, [builder.add(builder.mul(I64(m), N), n)], source_etype=F32)
                        builder.store(_fold32(builder, builder.load(a0), builder.load(a1)), o)
            switch_static(builder, M, MAX_FUSED_M, body, "fused_m")
            return context.get_dummy_value()
        return sig, codegen

    rows_dot.__name__ = f"rows_dot_{FORMATS[qtype].name.lower()}"
    return intrinsic(rows_dot)


ROWS_DOT = {qt: make_rows_dot(qt) for qt in DECODERS}


# ------------------------------------------------------------------------------ drivers
# MATMUL_DOT[qtype](w, x, out, n_chunks): out (M, N) = x · dequant(W)ᵀ for M <= MAX_FUSED_M,
# prange over n_chunks contiguous chunks of rows (drivers.chunked: compiled as this file's code).

MATMUL_DOT = {qt: drivers.chunked(globals(), f"matmul_dot_{FORMATS[qt].key}", dot, "w, x, out")
              for qt, dot in ROWS_DOT.items()}


# ---------------------------------------------------------------------------- row lookup

def make_get_rows(qtype: int, f16c: bool | None = None):
    """-> intrinsic ``get_rows(w, ids, out)``: out[i] = row ids[i] of w dequantized (float32
    (M, K), C-contiguous; w uint8 (N, row_bytes) raw GGUF rows, ids int64 (M,) in range)."""
    qk, nbytes, block = FORMATS[qtype].block_size, FORMATS[qtype].type_size, DECODERS[qtype]
    f16c = have_f16c() if f16c is None else f16c

    def get_rows(typingctx, w, ids, out):
        sig = types.void(w, ids, out)

        def codegen(context, builder, signature, args):
            wa, ia, oa = (context.make_array(t)(context, builder, value=v) for t, v in zip(signature.args, args))
            row_bytes = cgutils.unpack_tuple(builder, wa.shape, 2)[1]
            M, k = cgutils.unpack_tuple(builder, oa.shape, 2)
            with cgutils.for_range(builder, M) as rows:
                i = rows.index
                n = builder.load(builder.gep(ia.data, [i], source_etype=I64))
                r = _Store(builder, f16c, builder.gep(wa.data, [builder.mul(n, row_bytes)], source_etype=I8),
                           builder.gep(oa.data, [builder.mul(i, k)], source_etype=F32))
                with cgutils.for_range(builder, builder.sdiv(k, I64(qk))) as blocks:
                    j = blocks.index
                    block(r, builder.mul(j, I64(nbytes)), builder.mul(j, I64(qk)))
            return context.get_dummy_value()
        return sig, codegen

    get_rows.__name__ = f"get_rows_{FORMATS[qtype].name.lower()}"
    return intrinsic(get_rows)


GET_ROWS_DEQUANT = {qt: drivers.wrapper(globals(), f"get_rows_{FORMATS[qt].key}", make_get_rows(qt), "w, ids, out")
                    for qt in DECODERS}
