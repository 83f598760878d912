"""K-quant × Q8_K matmul on the 16-row interleaved layout (kquants_x16.py): lane = weight row.

A tile's record (16 weight rows, one super-block) holds code vectors whose byte 4r + i is
value 4t + i of row r, so ``vpdpbusd`` of a vector with one activation word broadcast to
every lane (``{1to16}``) adds into lane r the dot of row r's 4 values: no gather, no
horizontal sum, and the 16 lanes at the end ARE 16 outputs.  Per (tile, super-block,
activation row m), with the Q8_K codes of q8k.py (value 16L + 4k + i at byte 64k + 4L + i,
so the word of values 4w … 4w+3 is dword 16 (w mod 4) + w div 4 of the block):

    dot_j  = Σ_{words of unit j} vpdpbusd(codes, word)   int32 per row; unit j = a sub-block
                                                         of 32 (Q4_K, Q5_K) or a group of 16 (Q6_K)
    isum   = Σ_j dot_j · sc_j                            vpmulld by the unit's 16 scales
    imin   = Σ_j mn_j · bs32_j                           vpmaddwd: (mn_2k, mn_2k+1) · (bs32_2k, bs32_2k+1),
                                                         bs32_j = bsum_2j + bsum_2j+1 (made once per call)
    Q6_K:  dot_g starts at −32·bsum_g (broadcast)        so that isum = Σ_g sc_g·(dot_g − 32·bsum_g)
    acc    = fma(float(isum), d·dx, acc)                 d: the 16 rows' d, dx broadcast
    acc    = fma(float(imin), −(dmin·dx), acc)           (Q4_K, Q5_K)

which is reference.kquant_dot's sequence for every (m, n): integer sums in any order are the
same integers, and the float operations per (m, n) are that fixed pair per super-block,
whatever M, the other rows or the thread count.  The integers stay in int32: |dot_j| ≤
32·31·127 (Q5_K), |isum| ≤ 256·63·127·63 < 2^31 as in ggml.

The one-row pass is bound by port 0 (vpdpbusd, vpmulld and 512-bit shifts share it), so the
decode keeps shifts off it where it can, exactly: with VNNI, Q4_K's high nibbles enter
``vpdpbusd`` in place as 16·u (u8 ≤ 240, no saturation there), the low nibbles' units
scaled by 16·sc, and 16·isum (|16·isum| ≤ 8·63·16·60960 < 2^31) shifted back; Q6_K's
high bits of chunks 0 and 1 are looked up from the qh nibble by ``vpshufb`` (port 5).  Each
unit's codes are decoded beside their products (ir.fence), not all 64 first and spilled.

M ≤ MAX_STATIC_M: one code path per M (``switch_static``), each code vector decoded once
and used by all M rows.  Larger M: passes of PASS_M activation rows over the same
PASS_TILES tiles (they stay in L2), each a static path — the same float sequence per (m, n).
Arrays: w uint8 (N/16, nb · RECORD) records; xq int8 (nb, M, 256), xd float32 (nb, M),
xbs int16 (nb, M, 16) (q8k.quantize_q8_k); out float32 (M, N), N = 16 · w.shape[0].
"""
from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic

from . import drivers, kquants_x16_avx2
from .formats import FORMATS, Q4_K, Q5_K, Q6_K, QK_K
from .ir import (F32, I8, I16, I32, I64, V16F32, V16I32, V64I8, dpbusd_bytes, dpbusd_chain, fence, fma_v16f32,
                 have_avx2, have_f16c, have_vnni512, join, load_bytes, prefetch, shuffle,
                 splat, splat_v16f32, rows_by_m, vec_i32, vector_type, Q8K)

ROWS = 16
RECORD = {Q4_K: 2368, Q5_K: 2880, Q6_K: 3392}      # as kquants_x16.RECORD
QS_AT = {Q4_K: 320, Q5_K: 832, Q6_K: 1344}         # the low-nibble code vectors
MAX_STATIC_M = 17      # one register-resident path per M up to this (draft-n 16 + 1)
PASS_M = 8             # M > MAX_STATIC_M: activation rows per pass ...
PASS_TILES = 4         # ... over this many tiles (Q4_K at K = 8960: 330 KB, in L2)
PREFETCH_RECORDS = 2   # records ahead the tile prefetches, every cache line (0: none) ...
PREFETCH_SPREAD = True  # ... a few lines before each unit (not all 37-53 at once: the fill buffers) ...
PREFETCH_LOCALITY = 1   # ... into L2 (prefetcht2; into L1, the output head streamed 1.5x slower)
SIXTEEN_HIGH = True     # VNNI, Q4_K: the high nibbles as 16·u (no shift; module docstring)
Q6_LOOKUP = True        # VNNI, Q6_K: chunks 0, 1's high bits by vpshufb (port 5), not shifts (port 0)
AVX2_PATH = not have_vnni512() and have_avx2()      # no AVX-512: kquants_x16_avx2's 256-bit code instead

V16I8, V16I16, V32I16 = vector_type(I8, 16), vector_type(I16, 16), vector_type(I16, 32)
U_MAX = {Q4_K: 15, Q5_K: 31, Q6_K: 63}


def _f16x16_to_f32(builder, h, f16c: bool):
    """<16 x i16> IEEE halves -> <16 x float>, exact (vcvtph2ps, or the integer conversion
    of ir.f16_to_f32 lane-wise)."""
    if f16c:
        return builder.fpext(builder.bitcast(h, vector_type(ir.HalfType(), 16)), V16F32)
    h = builder.zext(h, V16I32)
    em = builder.shl(builder.and_(h, vec_i32(0x7FFF)), vec_i32(13))
    scaled = builder.bitcast(builder.fmul(builder.bitcast(em, V16F32), ir.Constant(V16F32, 2.0 ** 112)), V16I32)
    special = builder.icmp_unsigned("==", builder.and_(h, vec_i32(0x7C00)), vec_i32(0x7C00))
    bits = builder.select(special, builder.or_(em, vec_i32(0x7F800000)), scaled)
    return builder.bitcast(builder.or_(bits, builder.shl(builder.and_(h, vec_i32(0x8000)), vec_i32(16))), V16F32)


def _madd_words(builder, a, b):
    """<32 x i16> a, b -> <16 x i32>, lane l = a[2l]·b[2l] + a[2l+1]·b[2l+1] (vpmaddwd; AVX2:
    two 256-bit halves; otherwise widened), exact."""
    if have_vnni512():
        fn = builder.module.declare_intrinsic(
            "llvm.x86.avx512.pmaddw.d.512", fnty=ir.FunctionType(V16I32, [V32I16, V32I16]))
        return builder.call(fn, [a, b])
    if have_avx2():
        fn = builder.module.declare_intrinsic(
            "llvm.x86.avx2.pmadd.wd", fnty=ir.FunctionType(vector_type(I32, 8), [V16I16, V16I16]))
        halves = [builder.call(fn, [shuffle(builder, a, range(16 * h, 16 * h + 16)),
                                    shuffle(builder, b, range(16 * h, 16 * h + 16))]) for h in range(2)]
        return join(builder, *halves)
    p = builder.mul(builder.sext(a, vector_type(I32, 32)), builder.sext(b, vector_type(I32, 32)))
    return builder.add(shuffle(builder, p, range(0, 32, 2)), shuffle(builder, p, range(1, 32, 2)))


_SHIFT_LUT = [ir.Constant(V64I8, [((n >> 2 * c) & 3) << 4 for n in range(16)] * 4) for c in range(2)]


def _pshufb(builder, table, idx):
    """vpshufb: byte k = table[idx byte k] (idx bytes < 16, tables repeated per 16 bytes)."""
    fn = builder.module.declare_intrinsic("llvm.x86.avx512.pshuf.b.512",
                                          fnty=ir.FunctionType(V64I8, [V64I8, V64I8]))
    return builder.bitcast(builder.call(fn, [table, builder.bitcast(idx, V64I8)]), V16I32)


def _pairs(builder, lo, hi):
    """Two <16 x i32> (values fitting i16) -> <32 x i16>: (lo[l], hi[l]) in word pair l."""
    return builder.bitcast(builder.or_(builder.and_(lo, vec_i32(0xFFFF)), builder.shl(hi, vec_i32(16))), V32I16)


# ------------------------------------------------------------------------- the record

class _Record:
    """The code vectors and scales of one record at the i8* p, loaded once and shared by
    every activation row of the pass."""

    def __init__(self, builder, p, qtype: int, f16c: bool, vnni: bool):
        self.b, self.p, self.qtype = builder, p, qtype
        self.sixteen = SIXTEEN_HIGH and vnni and qtype == Q4_K      # no u8 saturation with vpdpbusd
        self.lookup = Q6_LOOKUP and vnni and qtype == Q6_K
        self._vec = {}
        if qtype == Q6_K:
            self.d = load_bytes(builder, p, 0, V16F32)
        else:
            self.d = _f16x16_to_f32(builder, load_bytes(builder, p, 0, V16I16), f16c)
            self.dmin = _f16x16_to_f32(builder, load_bytes(builder, p, 32, V16I16), f16c)

    def vec(self, off: int):
        if off not in self._vec:
            self._vec[off] = load_bytes(self.b, self.p, off, V16I32)
        return self._vec[off]

    def bytes16(self, off: int, signed: bool):
        v = load_bytes(self.b, self.p, off, V16I8)
        return (self.b.sext if signed else self.b.zext)(v, V16I32)

    def codes(self, c: int, h: int, t: int):
        """<64 x i8> codes u of values 64c + 32h + 4t + i of the 16 rows (module docstring of
        kquants_x16: nibble h of qs vector 8c + t, the bits above from qh)."""
        b, q = self.b, self.qtype
        lo = self.vec(QS_AT[q] + 64 * (8 * c + t))
        if h and self.sixteen:                         # 16·u: the high nibble in place
            return b.bitcast(b.and_(lo, vec_i32(0xF0F0F0F0)), V64I8)
        if h:
            lo = b.lshr(lo, vec_i32(4))
        u = b.and_(lo, vec_i32(0x0F0F0F0F))
        if q == Q5_K:                                  # bit 2c + h of qh vector t -> bit 4
            qh, s = self.vec(320 + 64 * t), 2 * c + h
            hb = b.shl(qh, vec_i32(4 - s)) if s < 4 else b.lshr(qh, vec_i32(s - 4))
            u = b.or_(u, b.and_(hb, vec_i32(0x10101010)))
        elif q == Q6_K:                                # bits 2c, 2c + 1 of qh vector 8h + t -> 4, 5
            qh, s = self.vec(320 + 64 * (8 * h + t)), 2 * c
            if self.lookup and c < 2:                  # the low nibble's two fields, looked up
                hb = _pshufb(b, _SHIFT_LUT[c], b.and_(qh, vec_i32(0x0F0F0F0F)))
            else:
                hb = b.shl(qh, vec_i32(4 - s)) if s < 4 else b.lshr(qh, vec_i32(s - 4))
            u = b.or_(u, b.and_(hb, vec_i32(0x30303030)))
        return b.bitcast(u, V64I8)

    def units(self):
        """Yields (unit j, scale lanes <16 x i32>, [(codes, word index w)]): the 8 sub-blocks
        of 32 (Q4_K, Q5_K) or the 16 groups of 16 (Q6_K); each unit's codes are emitted when
        it is reached, beside their use (all 64 decoded first spill).  self.sixteen: the
        codes of high nibbles are 16·u and the other units' scales 16·sc (isum · 16)."""
        q6 = self.qtype == Q6_K
        for s in range(2) if q6 else (None,):          # Q6_K: the 8 qh vectors of words 4s … 4s+3
            for c in range(4):                          # live across c, the 4 qs ones across h
                for h in range(2):
                    ts = range(4 * s, 4 * s + 4) if q6 else range(8)
                    j = 4 * c + 2 * h + s if q6 else 2 * c + h
                    sc = self.bytes16(64 + 16 * j, q6)
                    if self.sixteen and not h:
                        sc = self.b.shl(sc, vec_i32(4))
                    yield j, sc, [(self.codes(c, h, t), 16 * c + 8 * h + t) for t in ts]

    def min_weights(self):
        """Q4_K, Q5_K: [<32 x i16>] × 4, (mn_2k, mn_2k+1) per row: vpmaddwd with the pair
        k of per-32 bsums (dword k of xb) -> imin."""
        mn = [self.bytes16(192 + 16 * j, False) for j in range(8)]
        return [_pairs(self.b, mn[2 * k], mn[2 * k + 1]) for k in range(4)]


# ----------------------------------------------------------------------- the update

def _dot(builder, vnni: bool, words, xs, u_max: int, start):
    """start (<16 x i32> or None) + Σ vpdpbusd(codes, word): one chain from start with VNNI,
    ir.dpbusd_chain (int16 pair sums) plus start otherwise."""
    if vnni and start is not None:
        acc = start
        for u, xw in zip(words, xs):
            acc = dpbusd_bytes(builder, True, acc, u, xw)
        return acc
    dot = dpbusd_chain(builder, vnni, words, xs, u_max)
    return dot if start is None else builder.add(dot, start)


def _emit_record(builder, rec: _Record, vnni: bool, x: Q8K, b, ms: list, accs: list,
                 ahead: list) -> None:
    """accs[j] (alloca'd <16 x float>) += record rec against activation rows ms[j] of block b.
    x.bs: Q4_K, Q5_K int16 (nb, M, 8) per-32 bsums; Q6_K int32 (nb, M, 16) −32·bsum, where
    each group's dot starts (so that sc·dot is sc·(dot − 32·bsum)).
    """
    qt = rec.qtype
    rows = [builder.add(builder.mul(b, x.M), m) for m in ms]            # (b, m) in x
    bases = [builder.gep(x.q, [builder.mul(r, I64(QK_K))], source_etype=I8) for r in rows]

    def bcast(p, at: int, ty):                           # the dword at byte `at` of p, in 16 lanes
        v = builder.load(builder.gep(p, [I64(at)], source_etype=I8), typ=I32, align=4)
        return builder.bitcast(splat(builder, v, 16), ty)

    bs = [builder.gep(x.bs, [builder.mul(r, I64(64 if qt == Q6_K else 16))], source_etype=I8) for r in rows]
    isums = [None] * len(ms)
    n_units = 16 if qt == Q6_K else 8
    for i, (g, sc, words) in enumerate(rec.units()):
        for at in ahead[len(ahead) * i // n_units:len(ahead) * (i + 1) // n_units]:
            prefetch(builder, builder.gep(rec.p, [I64(at)], source_etype=I8), PREFETCH_LOCALITY)
        for j in range(len(ms)):
            xs = [bcast(bases[j], 4 * (16 * (w % 4) + w // 4), V64I8) for _, w in words]
            start = bcast(bs[j], 4 * g, V16I32) if qt == Q6_K else None
            prod = builder.mul(_dot(builder, vnni, [u for u, _ in words], xs, U_MAX[qt], start), sc)
            isums[j] = prod if isums[j] is None else builder.add(isums[j], prod)
        fence(builder, memory=False)
    if rec.sixteen:                                     # 16·isum, exactly: back to isum
        isums = [builder.ashr(v, vec_i32(4)) for v in isums]
    wts = rec.min_weights() if qt != Q6_K else []
    for j, r in enumerate(rows):
        dx = splat_v16f32(builder, builder.load(builder.gep(x.d, [r], source_etype=F32)))
        acc = fma_v16f32(builder, builder.sitofp(isums[j], V16F32), builder.fmul(rec.d, dx),
                         builder.load(accs[j]))
        if wts:
            imin = None
            for k, wv in enumerate(wts):
                t = _madd_words(builder, wv, bcast(bs[j], 4 * k, V32I16))
                imin = t if imin is None else builder.add(imin, t)
            acc = fma_v16f32(builder, builder.sitofp(imin, V16F32), builder.fneg(builder.fmul(rec.dmin, dx)), acc)
        builder.store(acc, accs[j])


def _emit_chunk(builder, qtype, vnni, f16c, wp, x: Q8K, out, N, c, n_chunks):
    """out (f32* (M, N)) columns of the tiles lo … hi−1 of chunk c of n_chunks (module docstring)."""
    M, nblk = x.M, x.nblk
    n_tiles = builder.sdiv(N, I64(ROWS))
    lo = builder.sdiv(builder.mul(c, n_tiles), n_chunks)
    hi = builder.sdiv(builder.mul(builder.add(c, I64(1)), n_tiles), n_chunks)
    rec_bytes = RECORD[qtype]

    def rows_static(ms: int, m0=I64(0), t_lo=lo, t_hi=hi):
        accs = [cgutils.alloca_once(builder, V16F32) for _ in range(ms)]
        m_rows = [builder.add(m0, I64(j)) for j in range(ms)]
        with cgutils.for_range_slice(builder, t_lo, t_hi, I64(1)) as (t, _):
            for a in accs:
                builder.store(ir.Constant(V16F32, 0.0), a)
            with cgutils.for_range(builder, nblk) as blk:
                off = builder.mul(builder.add(builder.mul(t, nblk), blk.index), I64(rec_bytes))
                p = builder.gep(wp, [off], source_etype=I8)
                ahead = [PREFETCH_RECORDS * rec_bytes + line for line in range(0, rec_bytes, 64)]
                if not PREFETCH_RECORDS:
                    ahead = []
                elif not PREFETCH_SPREAD:
                    for at in ahead:
                        prefetch(builder, builder.gep(p, [I64(at)], source_etype=I8), PREFETCH_LOCALITY)
                    ahead = []
                _emit_record(builder, _Record(builder, p, qtype, f16c, vnni), vnni, x, blk.index, m_rows, accs, ahead)
            for m, a in zip(m_rows, accs):
                dst = builder.gep(out, [builder.add(builder.mul(m, N), builder.mul(t, I64(ROWS)))],
                                  source_etype=F32)
                builder.store(builder.load(a), builder.bitcast(dst, V16F32.as_pointer()), align=4)

    rows_by_m(builder, M, MAX_STATIC_M, lo, hi, PASS_TILES, PASS_M, rows_static)


def make_chunk_kernel(qtype: int, vnni: bool | None = None, f16c: bool | None = None):
    """-> intrinsic ``kernel(w, xq, xd, xbs, out, c, n_chunks)``: out[:, 16t : 16t+16] for the
    tiles t of chunk c (_emit_chunk); vnni / f16c: the instruction path (default: the target's)."""
    vnni = have_vnni512() if vnni is None else vnni
    f16c = have_f16c() if f16c is None else f16c
    emit = kquants_x16_avx2.emit_chunk if AVX2_PATH and not vnni else _emit_chunk

    def kernel(typingctx, w, xq, xd, xbs, out, c, n_chunks):
        sig = types.void(w, xq, xd, xbs, out, c, n_chunks)

        def codegen(context, builder, signature, args):
            wa, xqa, xda, xbsa, outa = (context.make_array(t)(context, builder, value=v)
                                        for t, v in zip(signature.args[:5], args[:5]))
            c_, nc = (context.cast(builder, v, t, types.int64) for v, t in zip(args[5:], signature.args[5:]))
            nblk, M = cgutils.unpack_tuple(builder, xda.shape, 2)
            x = Q8K(xqa.data, xda.data, builder.bitcast(xbsa.data, I8.as_pointer()), M, nblk)
            N = cgutils.unpack_tuple(builder, outa.shape, 2)[1]
            emit(builder, qtype, vnni, f16c, wa.data, x, outa.data, N, c_, nc)
            return context.get_dummy_value()
        return sig, codegen

    kernel.__name__ = f"chunk_x16_{FORMATS[qtype].name.lower()}"
    return intrinsic(kernel)


# ------------------------------------------------------------------------------ drivers
# MATMUL_Q8K[qtype](w, xq, xd, xbs, out, n_chunks): prange over n_chunks contiguous chunks of
# tiles (drivers.chunked: this file's code); the per-16 bsums rearranged once per call first.

@njit(cache=True, nogil=True)
def _bsum_pairs(xbs):
    """int16 (nb, M, 16) per-16 code sums -> int16 (nb, M, 8) per-32 sums (exact, |s| ≤ 4064)."""
    xb = np.empty((xbs.shape[0], xbs.shape[1], 8), np.int16)
    for b in range(xbs.shape[0]):
        for m in range(xbs.shape[1]):
            for j in range(8):
                xb[b, m, j] = xbs[b, m, 2 * j] + xbs[b, m, 2 * j + 1]
    return xb


@njit(cache=True, nogil=True)
def _bsum_offsets(xbs):
    """int16 (nb, M, 16) -> int32 (nb, M, 16) −32·bsum: Q6_K's offset, where each dot starts."""
    return xbs.astype(np.int32) * np.int32(-32)


_SETUP = kquants_x16_avx2.SETUP if AVX2_PATH else {
    Q4_K: "xbs = _bsum_pairs(xbs)", Q5_K: "xbs = _bsum_pairs(xbs)", Q6_K: "xbs = _bsum_offsets(xbs)"}
MATMUL_Q8K = {qt: drivers.chunked(globals(), f"matmul_{FORMATS[qt].key}", make_chunk_kernel(qt),
                                  "w, xq, xd, xbs, out", setup) for qt, setup in _SETUP.items()}
