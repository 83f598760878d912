"""K-quant × Q8_K matmul kernels: SIMD super-block code as Numba intrinsics, prange drivers.

Plain Numba cannot keep a decoded weight block in vector registers across a loop over the
activation rows, so the work of one thread is written in portable LLVM vector IR:
``make_chunk_kernel(qtype)`` -> ``kernel(w, xq, xd, xbs, out, c, n_chunks)`` computes the
output rows of chunk c; each weight super-block is decoded into registers once
(kquants_decode.py) and used for up to 17 activation rows (more in passes of PASS_M rows
over PASS_ROWS weight rows that stay in L2).  The ``matmul_<fmt>`` drivers run the chunks
under prange.

The contract (reference.kquant_dot, ggml_vec_dot_qX_K_q8_K's integer order).  Lane L of the
16 int32 lanes is scale group L (values 16L … 16L+15); the four code vectors V_k hold in
lane L the values 16L+4k … 16L+4k+3, as the Q8_K codes do (q8k.py), so four chained
``vpdpbusd`` (u8 × s8 -> int32) leave in lane L the exact dot of group L.  Then, per weight
row n, activation row m and super-block, in exact int32 lanes (``vpmulld``):

    isum[L] = sc[L] · (dot[L] − off · bsum[L])      off = 32 (Q6_K), 4 (Q3_K), else 0
    imin[L] = mn[L] · bsum[L]                       (Q2_K, Q4_K, Q5_K)

bsum = the exact per-16 code sums of q8k.py (int16).  The 16 lanes are summed horizontally
in integers, exact in any order: a path of ms activation rows takes R = 16 // ms weight rows
at a time and sums the R·ms vectors together by a transpose-and-add (_LaneSums; lane
r·ms + m of the result is the pair (n + r, m)), so the float step of the contract runs on up
to 16 pairs in one vector operation, per super-block in order:

    acc = fma(float(isum), d·dx, acc);   acc = fma(float(imin), −(dmin·dx), acc)

d·dx and dmin·dx are float32 products of the same operands as the reference's, so every
(n, m) sees the same float operations whatever M, R and the other rows are; out[m, n] = acc.
|isum| < 2^31 (bounds in kquants_decode), float(isum) rounds as cvtdq2ps.

Arrays (C-contiguous):  w uint8 (N, row_bytes) GGUF rows;  the Q8_K
activations in the block-major layout of q8k.py: xq int8 (K/256, M, 256) lane-major codes in
[-127, 127], xd float32 (K/256, M), xbs int16 (K/256, M, 16) per-16 code sums;  out float32 (M, N).
"""
from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from .formats import FORMATS, KQUANTS, Q4_K, Q5_K, Q6_K, QK_K
from .ir import (F32, I8, I16, I32, I64, V16F32, V16I32, V64I8, Q8K, dpbusd_chain, f16_to_f32,
                 fma_v16f32, have_avx2, have_f16c, have_vnni512, prefetch, shuffle2, rows_by_m)
from . import drivers
from .kquants_decode import DECODERS, Decoded, k4_scales  # noqa: F401 (their home before)

PREFETCH_BLOCKS = 8  # a path of one weight row at a time prefetches this many super-blocks ahead
PASS_ROWS = 64  # M > MAX_STATIC_M: weight rows per pass (~55-320 KB of them stay in L2 while ...
PASS_M = 8      # ... each group of PASS_M activation rows runs the static path over them)
MAX_STATIC_M = 17  # up to this many activation rows (draft-n 16 + 1), one kernel path per M keeps them in registers

# --------------------------------------------------------------------------- intrinsics

def _x_block(builder, x: Q8K, m, b):
    """Activation row m of super-block b: its four code vectors, bsum lanes (<16 x i32>), dx."""
    row = builder.add(builder.mul(b, x.M), m)                   # (b, m) in the block-major x
    xv = [builder.load(builder.gep(x.q, [builder.add(builder.mul(row, I64(QK_K)), I64(64 * k))],
                                   source_etype=I8), typ=V64I8, align=1) for k in range(4)]
    bs = builder.load(builder.gep(x.bs, [builder.mul(row, I64(16))], source_etype=I16),
                      typ=ir.VectorType(I16, 16), align=2)
    return xv, builder.sext(bs, V16I32), builder.load(builder.gep(x.d, [row], source_etype=F32))


def _mul_short(builder, vnni: bool, a, b):
    """a·b per int32 lane, exact, for |a| < 2^15 and 0 <= b < 2^15: ``vpmaddwd`` on the lanes
    as int16 pairs (a's low half times b's, a's high half times b's zero high half), one
    uop where ``vpmulld`` takes two; AVX2: on 256-bit halves; otherwise a multiply."""
    if not (vnni or have_avx2()):
        return builder.mul(a, b)
    w = 16 if vnni else 8
    vi16, vi32 = ir.VectorType(I16, 2 * w), ir.VectorType(I32, w)
    name = "llvm.x86.avx512.pmaddw.d.512" if vnni else "llvm.x86.avx2.pmadd.wd"
    fn = builder.module.declare_intrinsic(name, fnty=ir.FunctionType(vi32, [vi16, vi16]))
    halves = [builder.call(fn, [builder.bitcast(shuffle2(builder, a, a, range(i, i + w)), vi16),
                                builder.bitcast(shuffle2(builder, b, b, range(i, i + w)), vi16)])
              for i in range(0, 16, w)]
    return halves[0] if vnni else shuffle2(builder, halves[0], halves[1], range(16))


def _int_lanes(builder, dec: Decoded, u8, vnni: bool, xv, bsum):
    """Lanes L of isum = sc·(dot − off·bsum) and of imin = mn·bsum (or None), exact int32.
    |bsum| ≤ 16·127 and 0 ≤ mn < 64: imin by _mul_short; so isum where |dot − off·bsum| < 2^15
    (Q2_K, Q3_K, Q4_K; Q3_K's signed sc times the difference with its high half cleared)."""
    dot = dpbusd_chain(builder, vnni, u8, xv, dec.u_max)
    if dec.off:
        dot = builder.sub(dot, builder.shl(bsum, ir.Constant(V16I32, dec.off.bit_length() - 1)))
    imin = None if dec.mn is None else _mul_short(builder, vnni, bsum, dec.mn)
    if 16 * 127 * max(dec.off, dec.u_max - dec.off) >= 2**15:
        return builder.mul(dec.sc, dot), imin                       # Q5_K, Q6_K: vpmulld
    if dec.off:
        return _mul_short(builder, vnni, dec.sc, builder.and_(dot, ir.Constant(V16I32, 0xFFFF))), imin
    return _mul_short(builder, vnni, dot, dec.sc), imin


def _pair_sum(builder, p, q, level: int):
    """p, q: 2^level sources each, source i in lanes i·w … i·w + w − 1 (w = 16 >> level) ->
    2^(level+1) sources in blocks of w/2 lanes, p's first: each block's two halves added."""
    w = 16 >> level
    first = [i * w + j for i in range(1 << level) for j in range(w // 2)]
    idx = first + [16 + i for i in first]
    return builder.add(shuffle2(builder, p, q, idx), shuffle2(builder, p, q, [i + w // 2 for i in idx]))


class _LaneSums:
    """Horizontal integer sums of up to 16 <16 x i32> vectors as one: push(v_j) in order, then
    result() has lane j = Σ_l v_j[l] (a transpose-and-add; pairs combine as soon as they exist,
    so at most four partial vectors are live)."""

    def __init__(self, builder):
        self.b, self.stack, self.n = builder, [], 0

    def push(self, v, level: int = 0):
        while self.stack and self.stack[-1][0] == level:
            v, level = _pair_sum(self.b, self.stack.pop()[1], v, level), level + 1
        self.stack.append((level, v))
        self.n += level == 0

    def result(self):
        while len(self.stack) > 1 or self.stack[0][0] < 4:
            self.push(ir.Constant(V16I32, 0))
        return self.stack[0][1]


def _lanes_of(builder, values, pattern):
    """<16 x T> with lane j = values[pattern[j]] (lanes past the pattern: values[0]): the
    distinct values inserted once, then one shuffle."""
    v = ir.Constant(ir.VectorType(values[0].type, len(values)), None)
    for i, s in enumerate(values):
        v = builder.insert_element(v, s, I32(i))
    return shuffle2(builder, v, v, list(pattern) + [0] * (16 - len(pattern)))


def _scales(builder, decs, field: str, pattern, f16c: bool):
    """<16 x float>: lane j = the scale ``field`` (d or dmin) of row pattern[j]; with F16C
    from the fp16 bits of all rows in one conversion (the same value, exactly)."""
    if f16c:
        bits = _lanes_of(builder, [getattr(dec, field + "16") for dec in decs], pattern)
        return builder.fpext(builder.bitcast(bits, ir.VectorType(ir.HalfType(), 16)), V16F32)
    return _lanes_of(builder, [getattr(dec, field) for dec in decs], pattern)


def _emit_chunk(builder, decode, block_bytes: int, vnni: bool, f16c: bool, wp, row_bytes, x: Q8K,
                out, N, c, n_chunks):
    """out (f32* (M, N)) rows n = lo … hi−1 of chunk c of n_chunks.

    M <= MAX_STATIC_M: one code path per M (a switch), the accumulators in registers, each
    super-block decoded once and used for the M rows of x (verification batches: the weights
    are read once, nothing goes through memory).  M > MAX_STATIC_M (prompt processing): for
    each slice of PASS_ROWS weight rows (they stay in L2), the static path of PASS_M
    activation rows at a time (the last group smaller); each super-block is decoded once per
    PASS_M rows instead of once per M (docs/architecture.md, "Tuned constants").
    A static path of ms rows takes R = 16 // ms weight rows at a time (one at the tail): the
    isum / imin lanes of its R·ms pairs (r, m) are summed horizontally together (_LaneSums,
    lane r·ms + m), and the two FMAs of the contract run on all of them in one vector op."""
    M, nblk = x.M, x.nblk
    lo = builder.sdiv(builder.mul(c, N), n_chunks)
    hi = builder.sdiv(builder.mul(builder.add(c, I64(1)), N), n_chunks)

    def decoded(n, b, ahead):
        """Block b of row n decoded; the block ``ahead`` bytes further on prefetched."""
        off = builder.add(builder.mul(n, row_bytes), builder.mul(b, I64(block_bytes)))
        p = builder.gep(wp, [off], source_etype=I8)
        for line in range(0, block_bytes + 64, 64):
            prefetch(builder, builder.gep(p, [builder.add(ahead, I64(line))], source_etype=I8))
        dec = decode(builder, p)
        return dec, [builder.bitcast(v, V64I8) for v in dec.u]

    def block(n, rr: int, ms: int, m0, b, accs):
        """Super-block b of weight rows n … n+rr−1 against activation rows m0 … m0+ms−1."""
        xs = [_x_block(builder, x, builder.add(m0, I64(j)), b) for j in range(ms)]
        pairs = [(r, j) for r in range(rr) for j in range(ms)]
        isums = [_LaneSums(builder) for _ in accs]
        imins = [_LaneSums(builder) for _ in accs]
        decs = []
        # one row: PREFETCH_BLOCKS ahead in the row; R rows: the same block of the next R rows
        # (a short row's blocks ahead would be the next rows', already being read)
        ahead = I64(PREFETCH_BLOCKS * block_bytes) if rr == 1 else builder.mul(row_bytes, I64(rr))
        for r in range(rr):
            dec, u8 = decoded(builder.add(n, I64(r)), b, ahead)
            decs.append(dec)
            for j, (xv, bsum, _) in enumerate(xs):
                isum, imin = _int_lanes(builder, dec, u8, vnni, xv, bsum)
                isums[(r * ms + j) // 16].push(isum)
                if imin is not None:
                    imins[(r * ms + j) // 16].push(imin)
        for a, acc in enumerate(accs):
            part = pairs[16 * a:16 * a + 16]
            dx = _lanes_of(builder, [x_[2] for x_ in xs], [j for r, j in part])
            ddx = builder.fmul(_scales(builder, decs, "d", [r for r, j in part], f16c), dx)
            v = fma_v16f32(builder, builder.sitofp(isums[a].result(), V16F32), ddx, builder.load(acc))
            if decs[0].mn is not None:
                mdx = builder.fmul(builder.fneg(_scales(builder, decs, "dmin", [r for r, j in part], f16c)), dx)
                v = fma_v16f32(builder, builder.sitofp(imins[a].result(), V16F32), mdx, v)
            builder.store(v, acc)

    def rows_group(n, rr: int, ms: int, m0):
        """Weight rows n … n+rr−1 against activation rows m0 … m0+ms−1 into out."""
        accs = [cgutils.alloca_once(builder, V16F32) for _ in range(-(-rr * ms // 16))]
        for a in accs:
            builder.store(ir.Constant(V16F32, 0.0), a)
        with cgutils.for_range(builder, nblk) as blk:
            block(n, rr, ms, m0, blk.index, accs)
        for i in range(rr * ms):
            r, j = divmod(i, ms)
            p = builder.gep(out, [builder.add(builder.mul(builder.add(m0, I64(j)), N),
                                              builder.add(n, I64(r)))], source_etype=F32)
            builder.store(builder.extract_element(builder.load(accs[i // 16]), I32(i % 16)), p)

    def rows_static(ms: int, m0=I64(0), n_lo=lo, n_hi=hi):
        """Rows n_lo … n_hi−1 against activation rows m0 … m0+ms−1, ms known here."""
        rr = max(1, 16 // ms)
        n_mid = builder.sub(n_hi, builder.srem(builder.sub(n_hi, n_lo), I64(rr)))
        with cgutils.for_range_slice(builder, n_lo, n_mid, I64(rr)) as (n, _):
            rows_group(n, rr, ms, m0)
        if rr > 1:
            with cgutils.for_range_slice(builder, n_mid, n_hi, I64(1)) as (n, _):
                rows_group(n, 1, ms, m0)

    rows_by_m(builder, M, MAX_STATIC_M, lo, hi, PASS_ROWS, PASS_M, rows_static)


def make_chunk_kernel(qtype: int, vnni: bool | None = None, f16c: bool | None = None):
    """-> intrinsic ``kernel(w, xq, xd, xbs, out, c, n_chunks)``: out[:, n] for the
    rows n of chunk c (see _emit_chunk).  ``vnni`` / ``f16c`` pick the instruction path
    (default: what the target has); every path computes the same values."""
    decoder = DECODERS[qtype]
    block_bytes = FORMATS[qtype].type_size
    vnni = have_vnni512() if vnni is None else vnni
    f16c = have_f16c() if f16c is None else f16c

    def decode(builder, p):
        return decoder(builder, p, f16c)

    def kernel(typingctx, w, xq, xd, xbs, out, c, n_chunks):
        sig = types.void(w, xq, xd, xbs, out, c, n_chunks)

        def codegen(context, builder, signature, args):
            wa, xqa, xda, xbsa, outa = (context.make_array(t)(context, builder, value=v)
                                        for t, v in zip(signature.args[:5], args[:5]))
            c_, nc = (context.cast(builder, v, t, types.int64)
                      for v, t in zip(args[5:], signature.args[5:]))
            nblk, M = cgutils.unpack_tuple(builder, xda.shape, 2)
            x = Q8K(xqa.data, xda.data, xbsa.data, M, nblk)
            N = cgutils.unpack_tuple(builder, outa.shape, 2)[1]
            row_bytes = cgutils.unpack_tuple(builder, wa.shape, 2)[1]
            _emit_chunk(builder, decode, block_bytes, vnni, f16c, wa.data, row_bytes, x, outa.data,
                        N, c_, nc)
            return context.get_dummy_value()
        return sig, codegen

    kernel.__name__ = f"chunk_{FORMATS[qtype].key}"
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
CHUNK = {qt: make_chunk_kernel(qt) for qt in KQUANTS}       # qtype -> chunk kernel (experts.py too)

# MATMUL_Q8K[qtype](w, xq, xd, xbs, out, n_chunks): out (M, N) = x · Wᵀ from Q8_K activations,
# prange over n_chunks contiguous chunks of output rows (drivers.chunked: this file's code).
MATMUL_Q8K = {qt: drivers.chunked(globals(), f"matmul_{FORMATS[qt].key}", CHUNK[qt], "w, xq, xd, xbs, out")
              for qt in KQUANTS}
# EXPERTS[qtype](w3, ids, xq3, xd3, xbs3, out3, n_chunks): one row through several experts
# (experts.py), a task per (expert, chunk), each the chunk kernel above (drivers.experts).
EXPERTS = {qt: drivers.experts(globals(), f"experts_{FORMATS[qt].key}", CHUNK[qt], "xq3, xd3, xbs3, out3")
           for qt in (Q4_K, Q5_K, Q6_K)}
