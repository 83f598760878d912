"""LLVM IR building blocks shared by the ``*_ir.py`` kernels (llvmlite code for Numba intrinsics).

Types, vector constants, loads and stores, shuffles and splats, the exact fp16 -> float32
conversion, prefetch, fused multiply-add, ``vpdpbusd`` (with a portable fallback),
``switch_static``, and what the target CPU offers.  Each helper emits exactly the
instructions its docstring names, in that order, so a kernel written with them is the code
its author wrote.  ``builder`` is always an ``llvmlite.ir.IRBuilder``.

Numba's on-disk cache is keyed on every file of this folder (cache.py): an edit here
recompiles the kernels that use it.
"""
from __future__ import annotations

from typing import NamedTuple

from llvmlite import ir
from numba.core import cgutils, config
from numba.core.codegen import get_host_cpu_features

# ------------------------------------------------------------------------------ types

I1, I8, I16, I32, I64 = (ir.IntType(bits) for bits in (1, 8, 16, 32, 64))
F16, F32 = ir.HalfType(), ir.FloatType()


def vector_type(ty: ir.Type, n: int) -> ir.VectorType:
    """<n x ty>."""
    return ir.VectorType(ty, n)


V8I16, V8I32, V8F32 = vector_type(I16, 8), vector_type(I32, 8), vector_type(F32, 8)
V16I8, V16I32, V16F32 = vector_type(I8, 16), vector_type(I32, 16), vector_type(F32, 16)
V32I8, V32I32, V64I8 = vector_type(I8, 32), vector_type(I32, 32), vector_type(I8, 64)


def const_vector(ty: ir.Type, values) -> ir.Constant:
    """Constant <len(values) x ty> holding values."""
    values = list(values)
    return ir.Constant(vector_type(ty, len(values)), values)


def vec_i32(value: int, n: int = 16) -> ir.Constant:
    """The constant <n x i32> with every lane ``value``."""
    return ir.Constant(vector_type(I32, n), value)


class Q8K(NamedTuple):
    """Data pointers of Q8_K activations (q8k.py's block-major layout) and their sizes, as a
    K-quant chunk kernel reads them; N: the output's row length, where the emitter needs it."""
    q: ir.Value      # i8*  codes (K/256, M, 256)
    d: ir.Value      # f32* scales (K/256, M)
    bs: ir.Value     # i8*  the code sums, as the kernel's setup arranged them (K/256, M, ·)
    M: ir.Value      # i64
    nblk: ir.Value   # i64  K/256
    N: ir.Value | None = None


# ------------------------------------------------------------- intrinsic arguments

def array_data(context, builder, sig, args, i: int):
    """The data pointer of the array argument i of an intrinsic's codegen (typed as Numba
    lays the array out: its dtype's pointer)."""
    return context.make_array(sig.args[i])(context, builder, value=args[i]).data


def array_shape(context, builder, sig, args, i: int) -> list:
    """The shape (i64 values) of the array argument i."""
    arr = context.make_array(sig.args[i])(context, builder, value=args[i])
    return cgutils.unpack_tuple(builder, arr.shape, sig.args[i].ndim)


def int_arg(context, builder, sig, args, i: int):
    """The integer argument i of an intrinsic's codegen as an i64."""
    from numba import types
    return context.cast(builder, args[i], sig.args[i], types.int64)


def arg_readers(context, builder, sig, args):
    """(data, as_i64): data(i) the data pointer of array argument i, as_i64(i) integer
    argument i as an i64, for an intrinsic's codegen."""
    return (lambda i: array_data(context, builder, sig, args, i),
            lambda i: int_arg(context, builder, sig, args, i))


def byte_ptr(context, builder, sig, args, i: int, offset: int | None = None):
    """An i8* to the array argument i, plus the byte offset held by argument ``offset``."""
    p = builder.bitcast(array_data(context, builder, sig, args, i), I8.as_pointer())
    if offset is not None:
        p = builder.gep(p, [int_arg(context, builder, sig, args, offset)])
    return p


# ------------------------------------------------------------------------ the target

def cpu_features() -> set[str]:
    """The target features Numba compiles for (as numba.core.codegen chooses them), "+avx2"…"""
    feats = config.CPU_FEATURES if config.CPU_FEATURES is not None else get_host_cpu_features()
    return set(feats.split(","))


def have_vnni256() -> bool:
    """256-bit ``vpdpbusd`` on ymm (AVX-512 VNNI + VL) available to the compiled code."""
    return {"+avx512vnni", "+avx512vl"} <= cpu_features()


def have_vnni512() -> bool:
    """512-bit ``vpdpbusd`` on zmm (AVX-512 F + BW + VNNI) available to the compiled code."""
    return {"+avx512f", "+avx512bw", "+avx512vnni"} <= cpu_features()


def have_f16c() -> bool:
    """Hardware fp16 -> float32 conversion (vcvtph2ps)."""
    return "+f16c" in cpu_features()


# ------------------------------------------------------------------- memory access

def load_at(builder, base, off, ty: ir.Type, align: int = 1):
    """Load ``ty`` at element offset ``off`` (an i64 value) of the typed pointer ``base``
    (gep, bitcast to ty*, load)."""
    ptr = builder.bitcast(builder.gep(base, [off]), ty.as_pointer())
    return builder.load(ptr, align=align)


def store_at(builder, val, base, off, align: int = 1) -> None:
    """Store ``val`` at element offset ``off`` of the typed pointer ``base``."""
    ptr = builder.bitcast(builder.gep(base, [off]), val.type.as_pointer())
    builder.store(val, ptr, align=align)


def load_bytes(builder, p, byte_off: int, ty: ir.Type, align: int = 1):
    """Load of ``ty`` at the constant byte offset ``byte_off`` of the i8* ``p`` (unaligned
    unless ``align`` says otherwise)."""
    return builder.load(builder.gep(p, [I64(byte_off)], source_etype=I8), typ=ty, align=align)


def prefetch(builder, p, locality: int = 3) -> None:
    """Read prefetch of the cache line at the i8* p: locality 3 into all cache levels
    (prefetcht0), 1 into L2 and beyond (prefetcht2, which leaves L1's fill buffers free)."""
    fn = builder.module.declare_intrinsic(
        "llvm.prefetch.p0", fnty=ir.FunctionType(ir.VoidType(), [p.type, I32, I32, I32]))
    builder.call(fn, [p, I32(0), I32(locality), I32(1)])


# ------------------------------------------------------------------- lanes

def shuffle(builder, v, mask):
    """Lanes ``mask`` of v (a constant permutation / gather within one vector)."""
    return builder.shuffle_vector(v, ir.Constant(v.type, None), const_vector(I32, mask))


def shuffle2(builder, a, b, idx: list[int]):
    """Lanes ``idx`` of the concatenation a ++ b."""
    return builder.shuffle_vector(a, b, const_vector(I32, idx))


def join(builder, a, b):
    """<n x T> ++ <n x T> -> <2n x T>."""
    n = a.type.count
    return shuffle2(builder, a, b, list(range(2 * n)))


def splat(builder, s, n: int):
    """The scalar s in all n lanes (insertelement into lane 0, shufflevector of v with v)."""
    v = builder.insert_element(ir.Constant(vector_type(s.type, n), None), s, I32(0))
    return shuffle2(builder, v, v, [0] * n)


def splat_v16f32(builder, f):
    """The float f in all 16 lanes (insertelement into lane 0, shufflevector with undef)."""
    v = builder.insert_element(ir.Constant(V16F32, None), f, I32(0))
    return shuffle(builder, v, [0] * 16)


# ------------------------------------------------------------------- arithmetic

def f16_to_f32(builder, h16, f16c: bool):
    """IEEE half bits (i16) -> float, exact (GGML_FP16_TO_FP32; numpy's float16 -> float32).
    f16c: fpext of the half (vcvtph2ps); otherwise integer code for any target."""
    if f16c:
        return builder.fpext(builder.bitcast(h16, ir.HalfType()), F32)
    h = builder.zext(h16, I32)
    em = builder.shl(builder.and_(h, I32(0x7FFF)), I32(13))
    # exponent/mantissa moved into a float32 and rescaled by 2^112: exact for normals and
    # subnormals; the all-ones exponent (inf / nan) is patched to 0xFF.
    scaled = builder.bitcast(builder.fmul(builder.bitcast(em, F32), F32(2.0 ** 112)), I32)
    is_special = builder.icmp_unsigned("==", builder.and_(h, I32(0x7C00)), I32(0x7C00))
    bits = builder.select(is_special, builder.or_(em, I32(0x7F800000)), scaled)
    sign = builder.shl(builder.and_(h, I32(0x8000)), I32(16))
    return builder.bitcast(builder.or_(bits, sign), F32)


def fma_v16f32(builder, a, b, c):
    """a·b + c on <16 x float>, rounded once (llvm.fma: vfmadd on x86, the same value on any
    target)."""
    fn = builder.module.declare_intrinsic("llvm.fma.v16f32",
                                          fnty=ir.FunctionType(V16F32, [V16F32] * 3))
    return builder.call(fn, [a, b, c])


def fma_f32(builder, a, b, c):
    """Scalar a·b + c rounded once (the lane operation of fma_v16f32)."""
    fn = builder.module.declare_intrinsic("llvm.fma.f32", fnty=ir.FunctionType(F32, [F32] * 3))
    return builder.call(fn, [a, b, c])


def have_avx2() -> bool:
    """256-bit integer SIMD (vpmaddubsw, vpmaddwd): every x86 core since Haswell / Zen."""
    return "+avx2" in cpu_features()


def _maddubs_quads(builder, u, x):
    """<32 x i8> u (unsigned), x (signed) -> <8 x i32>, lane i = Σ_{k<4} u[4i+k]·x[4i+k]:
    vpmaddubsw (u8 × s8 pairs -> i16, saturating) then vpmaddwd with ones (i16 pairs -> i32).
    Exact only while every pair sum fits in i16: u ≤ 128 and |x| ≤ 127 (2·128·127 < 2^15)."""
    v32i8, v16i16, v8i32 = vector_type(I8, 32), vector_type(I16, 16), V8I32
    madd_b = builder.module.declare_intrinsic(
        "llvm.x86.avx2.pmadd.ub.sw", fnty=ir.FunctionType(v16i16, [v32i8, v32i8]))
    madd_w = builder.module.declare_intrinsic(
        "llvm.x86.avx2.pmadd.wd", fnty=ir.FunctionType(v8i32, [v16i16, v16i16]))
    pairs = builder.call(madd_b, [u, x])
    return builder.call(madd_w, [pairs, ir.Constant(v16i16, [1] * 16)])


def _dot_quads_avx2(builder, u, x, u_max: int):
    """<32 x i8> -> <8 x i32> quad sums Σ u·x (u unsigned ≤ u_max, |x| ≤ 127), exact.
    u_max ≤ 128: one _maddubs_quads (ggml's mul_sum_us8_pairs).  Wider codes (Q8_0's
    u = w xor 0x80, up to 255) would saturate: the signed w = u - 128 goes through the sign
    trick, Σ w·x = Σ |w|·(x·sign w) (ggml's mul_sum_i8_pairs), and Σ u·x = Σ w·x + 128·Σ x."""
    if u_max <= 128:
        return _maddubs_quads(builder, u, x)
    v32i8 = vector_type(I8, 32)
    w = builder.xor(u, ir.Constant(v32i8, [0x80] * 32))
    absf = builder.module.declare_intrinsic("llvm.abs.v32i8", fnty=ir.FunctionType(v32i8, [v32i8, I1]))
    sign = builder.module.declare_intrinsic(
        "llvm.x86.avx2.psign.b", fnty=ir.FunctionType(v32i8, [v32i8, v32i8]))
    wx = _maddubs_quads(builder, builder.call(absf, [w, ir.Constant(I1, 0)]), builder.call(sign, [x, w]))
    xs = _maddubs_quads(builder, ir.Constant(v32i8, [1] * 32), x)
    return builder.add(wx, builder.shl(xs, ir.Constant(V8I32, [7] * 8)))


def _dot_quads(builder, acc, u, x, u_max: int):
    """acc (<W x i32>, W = 8 or 16) + the quad sums of u, x (<4W x i8>) on AVX2, 32 bytes at a time."""
    width = acc.type.count
    parts = [_dot_quads_avx2(builder, shuffle(builder, u, range(32 * h, 32 * h + 32)),
                             shuffle(builder, x, range(32 * h, 32 * h + 32)), u_max)
             for h in range(width // 8)]
    return builder.add(acc, parts[0] if width == 8 else join(builder, parts[0], parts[1]))


def dpbusd_words(builder, vnni: bool, acc, u, x, u_max: int = 255):
    """acc + per-lane sum of 4 products zext(u byte) · sext(x byte), all three <W x i32>,
    W = 8 (ymm) or 16 (zmm); the x bytes are in [-127, 127], the u bytes at most u_max.
    vnni: one vpdpbusd; AVX2: vpmaddubsw + vpmaddwd (_dot_quads_avx2); otherwise widen,
    multiply and add the four products of each lane in order.  The same integers on every
    path (exact, no saturation)."""
    width = acc.type.count
    vt = vector_type(I32, width)
    if vnni:
        fn = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(vt, [vt] * 3),
            f"llvm.x86.avx512.vpdpbusd.{32 * width}")
        return builder.call(fn, [acc, u, x])
    bytes_ = vector_type(I8, 4 * width)
    if have_avx2():
        return _dot_quads(builder, acc, builder.bitcast(u, bytes_), builder.bitcast(x, bytes_), u_max)
    p = builder.mul(builder.zext(builder.bitcast(u, bytes_), vector_type(I32, 4 * width)),
                    builder.sext(builder.bitcast(x, bytes_), vector_type(I32, 4 * width)))
    s = shuffle2(builder, p, p, list(range(0, 4 * width, 4)))
    for i in (1, 2, 3):
        s = builder.add(s, shuffle2(builder, p, p, list(range(i, 4 * width, 4))))
    return builder.add(acc, s)


def dpbusd_bytes(builder, vnni: bool, acc, a_u8, b_i8, u_max: int = 255):
    """acc (<16 x i32>) + (<64 x u8> a · <64 x i8> b summed by 4 per lane), exact (no
    saturation; b in [-127, 127], a at most u_max).  ggml: _mm512_dpbusd_epi32 /
    mul_sum_us8_pairs.  AVX2 without VNNI: vpmaddubsw + vpmaddwd per 32 bytes; with
    neither, the four products of a lane are added as (p0 + p1) + (p2 + p3)."""
    if vnni:
        fn = builder.module.declare_intrinsic(
            "llvm.x86.avx512.vpdpbusd.512", fnty=ir.FunctionType(V16I32, [V16I32] * 3))
        return builder.call(fn, [acc, builder.bitcast(a_u8, V16I32), builder.bitcast(b_i8, V16I32)])
    if have_avx2():
        return _dot_quads(builder, acc, a_u8, b_i8, u_max)
    vt = vector_type(I32, 64)
    prod = builder.mul(builder.zext(a_u8, vt), builder.sext(b_i8, vt))
    parts = [shuffle(builder, prod, [4 * i + k for i in range(16)]) for k in range(4)]
    return builder.add(acc, builder.add(builder.add(parts[0], parts[1]),
                                        builder.add(parts[2], parts[3])))


def dpbusd_chain(builder, vnni: bool, us, xs, u_max: int, scale=None):
    """Σ_k dpbusd_bytes(u_k, x_k) as <16 x i32> (us, xs: lists of <64 x i8>), exact, times
    ``scale`` (<16 x i32>, |scale| < 2^15) per lane when given.  AVX2 without VNNI adds the
    vpmaddubsw pair sums of g vectors in i16 before one vpmaddwd (g · 2 · u_max · 127 < 2^15:
    g = 4 for 5-bit codes, 2 for 6-bit), as ggml's AVX2 K-quant dots do, and that vpmaddwd
    multiplies by the lane's scale as an i16 pair where the others multiply by ones (no
    vpmulld); the integers are the same on every path."""
    acc = ir.Constant(V16I32, None)
    if vnni or not have_avx2() or u_max > 128:
        for u, x in zip(us, xs):
            acc = dpbusd_bytes(builder, vnni, acc, u, x, u_max)
        return acc if scale is None else builder.mul(acc, scale)
    g = max(1, min(len(us), 32767 // (254 * u_max)))
    v32i8, v16i16 = vector_type(I8, 32), vector_type(I16, 16)
    madd_b = builder.module.declare_intrinsic(
        "llvm.x86.avx2.pmadd.ub.sw", fnty=ir.FunctionType(v16i16, [v32i8, v32i8]))
    madd_w = builder.module.declare_intrinsic(
        "llvm.x86.avx2.pmadd.wd", fnty=ir.FunctionType(V8I32, [v16i16, v16i16]))
    by = ir.Constant(vector_type(I16, 32), [1] * 32)
    if scale is not None:                                   # (scale, scale) in each lane's i16 pair
        by = builder.bitcast(builder.or_(builder.and_(scale, ir.Constant(V16I32, 0xFFFF)),
                                         builder.shl(scale, ir.Constant(V16I32, 16))), vector_type(I16, 32))
    halves = []
    for h in range(2):
        part = ir.Constant(V8I32, None)
        for k0 in range(0, len(us), g):
            pairs = None
            for u, x in zip(us[k0:k0 + g], xs[k0:k0 + g]):
                pr = builder.call(madd_b, [shuffle(builder, u, range(32 * h, 32 * h + 32)),
                                           shuffle(builder, x, range(32 * h, 32 * h + 32))])
                pairs = pr if pairs is None else builder.add(pairs, pr)
            part = builder.add(part, builder.call(madd_w, [pairs, shuffle(builder, by, range(16 * h, 16 * h + 16))]))
        halves.append(part)
    return join(builder, halves[0], halves[1])


def fence(builder, values=(), memory: bool = True):
    """An empty ``asm sideeffect`` (no instruction) that LLVM keeps in order with the others:
    memory is not read or written across it, and each of ``values`` (vectors) passes through
    it in a register and is returned, so their computation stays before it.  A kernel
    fences each unit of a record so that its codes are decoded beside their products (LLVM
    otherwise decodes a record's code vectors first, and schedules one activation row's
    products after the next: spilled both ways).  memory=False: without the memory clobber,
    an ordering hint the 512-bit kernels were tuned with (loads may still cross it)."""
    void = ir.FunctionType(ir.VoidType(), [])
    builder.call(ir.InlineAsm(void, "", "~{memory}" if memory else "", side_effect=True), [])
    return [builder.call(ir.InlineAsm(ir.FunctionType(v.type, [v.type]), "", "=x,0", side_effect=True), [v])
            for v in values]


def escape(builder, p) -> None:
    """An empty ``asm sideeffect`` that takes the pointer p and clobbers memory: LLVM must keep
    what p points to in memory (a stack buffer it would otherwise promote to registers)."""
    fn = ir.FunctionType(ir.VoidType(), [p.type])
    builder.call(ir.InlineAsm(fn, "", "r,~{memory}", side_effect=True), [p])


# ------------------------------------------------------------------- control flow

def switch_static(builder, value, n_max: int, body, name: str) -> None:
    """body(k) on a code path of its own for each value k = 1 … n_max of the i64 `value` (a
    switch; other values do nothing): k is a Python int there, so accumulators sized by it
    can live in registers."""
    end = builder.append_basic_block(f"{name}_end")
    sw = builder.switch(value, end)
    for k in range(1, n_max + 1):
        bb = builder.append_basic_block(f"{name}{k}")
        sw.add_case(I64(k), bb)
        builder.position_at_end(bb)
        body(k)
        builder.branch(end)
    builder.position_at_end(end)


def rows_by_m(builder, M, max_static: int, lo, hi, step: int, pass_m: int, rows_static) -> None:
    """The K-quant kernels' two regimes over the weight units lo … hi−1 (rows or tiles):
    M <= max_static, ``rows_static(M)`` on a code path of its own per M (switch_static);
    more, for each slice of ``step`` units (they stay in L2), groups of pass_m activation
    rows at a time, ``rows_static(k, m0, n0, n1)`` for a group of k rows from m0 over n0 … n1−1."""
    def smaller(a, b):
        return builder.select(builder.icmp_signed("<", a, b), a, b)

    with builder.if_else(builder.icmp_signed("<=", M, I64(max_static))) as (single, multi):
        with single:
            switch_static(builder, M, max_static, rows_static, "static_m")
        with multi, cgutils.for_range_slice(builder, lo, hi, I64(step)) as (n0, _):
            n1 = smaller(builder.add(n0, I64(step)), hi)
            with cgutils.for_range_slice(builder, I64(0), M, I64(pass_m)) as (m0, _):
                k = smaller(builder.sub(M, m0), I64(pass_m))
                switch_static(builder, k, pass_m, lambda n: rows_static(n, m0, n0, n1), "pass_m")
