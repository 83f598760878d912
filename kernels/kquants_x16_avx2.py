"""The interleaved K-quant × Q8_K matmul (kquants_x16's layout) in AVX2 code: 16 ymm registers.

kquants_x16_ir writes its IR in 512-bit vectors, one path per M holding every row's
accumulators; without AVX-512 each vector is a pair of ymm and the code of M ≥ 2 rows spills
most of its values to the stack (docs/architecture.md, "AVX2 on Zen 3").  Here everything is
256 bits wide: a record (16 weight rows, one super-block) is taken in two halves of 8 weight
rows (lanes), and the activation rows in register blocks of at most ROW_BLOCK rows, so a
block's int16 pair sums and int32 sums stay in registers beside the code vectors of one
word, its broadcast and the unit's scales (SHARED_WORDS: both halves per word, each word
broadcast once; or half by half); ``ir.fence`` after each word pins the sums so that LLVM
neither hoists the next word's loads nor sinks a row's products (both spilled).  The record
(2.3-3.3 KB) stays in L1 while every block of rows passes over it: the weights are read from
memory once per pass for any M ≤ MAX_STATIC_M, and above it once per chunk of rows whose
codes fit ROW_CHUNK_BYTES (they stay in L2).  Where more than one block passes over a record,
its code vectors are decoded once into a 4 KB stack scratch and each block loads them
(DECODE_ONCE: a Q6_K code vector is ~7 instructions to decode, one load to reuse).  Per
(half, block, unit j), Q8_K codes as in q8k.py:

    pairs_r = Σ_{g words} vpmaddubsw(codes, word_r)     int16: g · 2 · u_max · 127 < 2^15
    isum_r += vpmaddwd(pairs_r, (sc_j, sc_j))           the unit's scale rides in vpmaddwd
    Q6_K:  isum_r −= 32 · Σ_k vpmaddwd((sc_2k, sc_2k+1), (bsum_2k, bsum_2k+1)_r)
    Q4_K, Q5_K:  imin_r = Σ_k vpmaddwd((mn_2k, mn_2k+1), (bs32_2k, bs32_2k+1)_r)
    acc_r = fma(float(isum_r), d·dx_r, acc_r);  acc_r = fma(float(imin_r), −(dmin·dx_r), acc_r)

the same integers (sums of exact products in any order) and the same float pair per
super-block and (m, n) as kquants_x16_ir and reference.kquant_dot: the same bits, whatever M,
the blocks or the thread count.  acc_r lives in out (zeroed per tile), so M is not bounded by
the registers.  Arrays as kquants_x16_ir's, except Q6_K's xbs: the raw int16 (nb, M, 16)
per-16 sums (SETUP).

Its drivers are compiled as code of kquants_x16_ir.py (drivers.py); the cache is keyed on the
whole folder (cache.py), so an edit here recompiles them.
"""
from __future__ import annotations

from llvmlite import ir
from numba.core import cgutils

from .formats import Q4_K, Q5_K, Q6_K, QK_K
from .ir import (F32, I8, I16, I32, I64, V8F32, V8I32, escape, f16_to_f32, fence, load_bytes, prefetch, splat,
                 switch_static, vec_i32, vector_type)

ROWS = 16
RECORD = {Q4_K: 2368, Q5_K: 2880, Q6_K: 3392}      # as kquants_x16.RECORD
QS_AT = {Q4_K: 320, Q5_K: 832, Q6_K: 1344}
U_MAX = {Q4_K: 15, Q5_K: 31, Q6_K: 63}
MAX_STATIC_M = 17       # one path per M up to this, its row blocks unrolled
ROW_BLOCK = 6           # activation rows per register block (half by half: 2 · 6 + 4 of the 16 ymm)
ROW_CHUNK_BYTES = 192 << 10   # M > MAX_STATIC_M: rows per chunk so their Q8_K codes fit this (L2)
SHARED_WORDS = {Q4_K: True, Q5_K: True, Q6_K: False}   # both halves in one pass over the words (each
#                         broadcast once) or half by half: the fewer modelled cycles (llvm-mca, znver3)
FENCE_WORDS = True      # a fence after each word: its codes and broadcasts are not hoisted
DECODE_ONCE = {Q4_K: True, Q5_K: True, Q6_K: True}   # passes of several row blocks: a record's codes
#                         decoded once into a stack scratch, each block loading them (else: each block decodes)
PREFETCH_RECORDS = 2    # records ahead, a few lines before each unit of the first block (prefetcht2)
SETUP = {Q4_K: "xbs = _bsum_pairs(xbs)", Q5_K: "xbs = _bsum_pairs(xbs)", Q6_K: "pass"}

V32I8, V16I16, V8I16 = vector_type(I8, 32), vector_type(I16, 16), vector_type(I16, 8)
V8I8 = vector_type(I8, 8)


def _v(value: int):
    return vec_i32(value, 8)


def _intr(builder, name: str, ret, args: list):
    fn = builder.module.declare_intrinsic(name, fnty=ir.FunctionType(ret, [a.type for a in args]))
    return builder.call(fn, args)


def _maddubs(builder, u, x):
    return _intr(builder, "llvm.x86.avx2.pmadd.ub.sw", V16I16,
                 [builder.bitcast(u, V32I8), builder.bitcast(x, V32I8)])


def _maddwd(builder, a, b):
    return _intr(builder, "llvm.x86.avx2.pmadd.wd", V8I32,
                 [builder.bitcast(a, V16I16), builder.bitcast(b, V16I16)])


def _pairs(builder, lo, hi):
    """Two <8 x i32> (values fitting i16) -> (lo[l], hi[l]) in word pair l, as <8 x i32>."""
    return builder.or_(builder.and_(lo, _v(0xFFFF)), builder.shl(hi, _v(16)))


class _Half:
    """Lanes 8h … 8h+7 (weight rows) of the record at the i8* p."""

    def __init__(self, builder, p, qtype: int, h: int, f16c: bool):
        self.b, self.p, self.qtype, self.h, self.scratch = builder, p, qtype, h, None
        if qtype == Q6_K:
            self.d = load_bytes(builder, p, 32 * h, V8F32)
        else:
            self.d, self.dmin = (self._f16(at + 16 * h, f16c) for at in (0, 32))

    def _f16(self, at: int, f16c: bool):
        h = load_bytes(self.b, self.p, at, V8I16)
        if f16c:
            return self.b.fpext(self.b.bitcast(h, vector_type(ir.HalfType(), 8)), V8F32)
        lanes = [f16_to_f32(self.b, self.b.extract_element(h, I32(i)), False) for i in range(8)]
        v = ir.Constant(V8F32, None)
        for i, f in enumerate(lanes):
            v = self.b.insert_element(v, f, I32(i))
        return v

    def vec(self, off: int):
        """The 32 bytes of this half of the 64-byte vector at byte off."""
        return load_bytes(self.b, self.p, off + 32 * self.h, V8I32)

    def bytes8(self, off: int, signed: bool):
        """The 8 bytes of this half of the 16-byte line at off, widened to <8 x i32>."""
        v = load_bytes(self.b, self.p, off + 8 * self.h, V8I8)
        return (self.b.sext if signed else self.b.zext)(v, V8I32)

    def codes(self, c: int, hn: int, t: int):
        """Codes u of values 64c + 32hn + 4t + i (kquants_x16's record), <8 x i32>: decoded,
        or loaded from the scratch decode_into filled."""
        if self.scratch is not None:
            return load_bytes(self.b, self.scratch, self._slot(c, hn, t), V8I32, 32)
        return self.decode(c, hn, t)

    def _slot(self, c: int, hn: int, t: int) -> int:
        """The byte offset of code vector (c, hn, t) of this half in the scratch."""
        return 32 * (64 * self.h + 16 * c + 8 * hn + t)

    def decode_into(self, scratch) -> None:
        """This half's 64 code vectors decoded once into scratch (i8*, 4 KB for both halves,
        32-byte aligned); codes() loads them from there from now on.  The scratch is passed to
        ir.escape, so LLVM keeps it in memory (promoted to registers, the codes would spill)."""
        for c in range(4):
            for hn in range(2):
                for t in range(8):
                    dst = self.b.gep(scratch, [I64(self._slot(c, hn, t))], source_etype=I8)
                    self.b.store(self.decode(c, hn, t), self.b.bitcast(dst, V8I32.as_pointer()), align=32)
        escape(self.b, scratch)
        self.scratch = scratch

    def decode(self, c: int, hn: int, t: int):
        """The code vector of codes(c, hn, t), decoded from the record."""
        b, q = self.b, self.qtype
        lo = self.vec(QS_AT[q] + 64 * (8 * c + t))
        if hn:
            lo = b.lshr(lo, _v(4))
        u = b.and_(lo, _v(0x0F0F0F0F))
        if q == Q5_K:
            qh, s = self.vec(320 + 64 * t), 2 * c + hn
            hb = b.shl(qh, _v(4 - s)) if s < 4 else b.lshr(qh, _v(s - 4))
            u = b.or_(u, b.and_(hb, _v(0x10101010)))
        elif q == Q6_K:
            qh, s = self.vec(320 + 64 * (8 * hn + t)), 2 * c
            hb = b.shl(qh, _v(4 - s)) if s < 4 else b.lshr(qh, _v(s - 4))
            u = b.or_(u, b.and_(hb, _v(0x30303030)))
        return u

    def units(self):
        """(unit j, its scale as (sc, sc) word pairs, [(c, hn, t, word w)]) in record order."""
        q6 = self.qtype == Q6_K
        for s in range(2) if q6 else (None,):
            for c in range(4):
                for hn in range(2):
                    ts = range(4 * s, 4 * s + 4) if q6 else range(8)
                    j = 4 * c + 2 * hn + s if q6 else 2 * c + hn
                    sc = self.bytes8(64 + 16 * j, q6)
                    yield j, (lambda sc=sc: _pairs(self.b, sc, sc)), [(c, hn, t, 16 * c + 8 * hn + t) for t in ts]

    def pair_lines(self, at: int, n: int, signed: bool) -> list:
        """(v_2k, v_2k+1) word pairs of the n byte lines at at, at + 16, … (k < n / 2)."""
        return [_pairs(self.b, self.bytes8(at + 32 * k, signed), self.bytes8(at + 32 * k + 16, signed))
                for k in range(n // 2)]


def _bcast(builder, p, at: int):
    """The dword at byte `at` of the i8* p in all 8 lanes (vpbroadcastd)."""
    v = builder.load(builder.gep(p, [I64(at)], source_etype=I8), typ=I32, align=4)
    return splat(builder, v, 8)


def emit_block(builder, halves: list, x, b, ms: list, out, col, ahead: list) -> None:
    """out[m, col : col + 16] += the record (both halves: lanes 8h … 8h+7 at col + 8h) against
    activation rows ms (i64 values) of block b: the module docstring's update, each word
    broadcast once for both halves, the rows' sums in registers."""
    qt, bb = halves[0].qtype, builder
    rows = [bb.add(bb.mul(b, x.M), m) for m in ms]
    xq = [bb.gep(x.q, [bb.mul(r, I64(QK_K))], source_etype=I8) for r in rows]
    bs = [bb.gep(x.bs, [bb.mul(r, I64(32 if qt == Q6_K else 16))], source_etype=I8) for r in rows]
    g = max(1, 32767 // (254 * U_MAX[qt]))
    isums = [[None] * len(halves) for _ in ms]
    n_units = 16 if qt == Q6_K else 8
    for i, units in enumerate(zip(*(h.units() for h in halves))):
        for at in ahead[len(ahead) * i // n_units:len(ahead) * (i + 1) // n_units]:
            prefetch(bb, bb.gep(halves[0].p, [I64(at)], source_etype=I8), 1)
        scs = [scale() for _, scale, _ in units]
        words = units[0][2]
        for k0 in range(0, len(words), g):
            pairs = [[None] * len(halves) for _ in ms]
            for c, hn, t, w in words[k0:k0 + g]:
                us = [h.codes(c, hn, t) for h in halves]
                for j in range(len(ms)):
                    xw = _bcast(bb, xq[j], 4 * (16 * (w % 4) + w // 4))
                    for h, u in enumerate(us):
                        pr = _maddubs(bb, u, xw)
                        pairs[j][h] = pr if pairs[j][h] is None else bb.add(pairs[j][h], pr)
                if FENCE_WORDS:
                    pinned = iter(fence(bb, [v for pr in pairs for v in pr]))
                    pairs = [[next(pinned) for _ in pr] for pr in pairs]
            for j in range(len(ms)):
                for h in range(len(halves)):
                    prod = _maddwd(bb, pairs[j][h], scs[h])
                    isums[j][h] = prod if isums[j][h] is None else bb.add(isums[j][h], prod)
        pinned = iter(fence(bb, [v for row in isums for v in row]))
        isums = [[next(pinned) for _ in row] for row in isums]
    for h, half in enumerate(halves):
        _finish(bb, half, x, [s[h] for s in isums], ms, rows, bs, out, bb.add(col, I64(8 * half.h)))


def _finish(bb, half, x, isums: list, ms: list, rows: list, bs: list, out, col) -> None:
    """The float update of one half's 8 lanes for each row (module docstring), Q6_K's bsum
    term and Q4_K / Q5_K's mins first."""
    qt = half.qtype
    if qt == Q6_K:                                      # −32 · Σ_g sc_g · bsum_g
        scp = half.pair_lines(64, 16, True)
        for j in range(len(ms)):
            off = None
            for k, v in enumerate(scp):
                t = _maddwd(bb, v, _bcast(bb, bs[j], 4 * k))
                off = t if off is None else bb.add(off, t)
            isums[j] = bb.sub(isums[j], bb.shl(off, _v(5)))
    mins = half.pair_lines(192, 8, False) if qt != Q6_K else []
    for j, (m, r) in enumerate(zip(ms, rows)):
        dx = splat(bb, bb.load(bb.gep(x.d, [r], source_etype=F32)), 8)
        dst = bb.bitcast(bb.gep(out, [bb.add(bb.mul(m, x.N), col)], source_etype=F32), V8F32.as_pointer())
        acc = _fma(bb, bb.sitofp(isums[j], V8F32), bb.fmul(half.d, dx), bb.load(dst, align=4))
        if mins:
            imin = None
            for k, v in enumerate(mins):
                t = _maddwd(bb, v, _bcast(bb, bs[j], 4 * k))
                imin = t if imin is None else bb.add(imin, t)
            acc = _fma(bb, bb.sitofp(imin, V8F32), bb.fneg(bb.fmul(half.dmin, dx)), acc)
        bb.store(acc, dst, align=4)


def _fma(builder, a, b, c):
    return _intr(builder, "llvm.fma.v8f32", V8F32, [a, b, c])


def blocks_of(k: int) -> list[int]:
    """k rows as register blocks of at most ROW_BLOCK, as even as can be (ROW_BLOCK 6: 9 -> 5, 4)."""
    n = -(-k // ROW_BLOCK)
    return [k // n + (i < k % n) for i in range(n)]


def _record_ptr(builder, qtype, wp, x, t, blk):
    off = builder.mul(builder.add(builder.mul(t, x.nblk), blk), I64(RECORD[qtype]))
    return builder.gep(wp, [off], source_etype=I8)


def _ahead(qtype: int) -> list[int]:
    """The byte offsets of the cache lines PREFETCH_RECORDS records ahead."""
    return [PREFETCH_RECORDS * RECORD[qtype] + line for line in range(0, RECORD[qtype], 64)]


def _halves(builder, qtype, f16c, p, scratch=None) -> list:
    """The two halves of the record at the i8* p; with a scratch, their codes decoded into it
    once (where DECODE_ONCE)."""
    halves = [_Half(builder, p, qtype, h, f16c) for h in range(2)]
    if scratch is not None and DECODE_ONCE[qtype]:
        for h in halves:
            h.decode_into(scratch)
    return halves


def _record(builder, qtype, f16c, wp, x, out, t, blk, row_blocks, fetch: bool = True,
            scratch=None, halves=None) -> None:
    """Every row block of row_blocks (lists of i64 rows) over record (t, blk); fetch: its
    first block prefetches the record PREFETCH_RECORDS ahead, a few lines per unit.  With
    more than one block (and a scratch), the record's codes are decoded once into the
    scratch and each block loads them (DECODE_ONCE); halves: the record's, already made."""
    ahead = _ahead(qtype) if fetch else []
    if halves is None:
        halves = _halves(builder, qtype, f16c, _record_ptr(builder, qtype, wp, x, t, blk),
                         scratch if len(row_blocks) > 1 else None)
    col = builder.mul(t, I64(ROWS))
    groups = [halves] if SHARED_WORDS[qtype] else [[h] for h in halves]
    for k, hs in enumerate(groups):
        for i, ms in enumerate(row_blocks):
            emit_block(builder, hs, x, blk, ms, out, col, ahead if i == 0 and k == 0 else [])


def _scratch(builder):
    """A 32-byte aligned 4 KB stack buffer (i8*) in the function's entry block, not zeroed:
    one record's decoded codes (_Half.decode_into)."""
    with builder.goto_entry_block():
        buf = builder.alloca(ir.ArrayType(I8, 64 * 32 * 2))
        buf.align = 32
    return builder.bitcast(buf, I8.as_pointer())


def _zero_rows(builder, out, x, t, m_lo, m_hi) -> None:
    zero = ir.Constant(vector_type(F32, ROWS), 0.0)
    with cgutils.for_range_slice(builder, m_lo, m_hi, I64(1)) as (m, _):
        dst = builder.gep(out, [builder.add(builder.mul(m, x.N), builder.mul(t, I64(ROWS)))], source_etype=F32)
        builder.store(zero, builder.bitcast(dst, zero.type.as_pointer()), align=4)


def emit_chunk(builder, qtype, vnni, f16c, wp, x, out, N, c, n_chunks) -> None:
    """out (f32* (M, N)) columns of the tiles of chunk c of n_chunks (module docstring);
    kquants_x16_ir._emit_chunk's signature (vnni: unused, this is the AVX2 path)."""
    x = x._replace(N=N)
    n_tiles = builder.sdiv(N, I64(ROWS))
    lo = builder.sdiv(builder.mul(c, n_tiles), n_chunks)
    hi = builder.sdiv(builder.mul(builder.add(c, I64(1)), n_tiles), n_chunks)

    scratch = _scratch(builder)

    def static(k: int):
        rows, at = [], 0
        for n in blocks_of(k):
            rows.append([I64(at + j) for j in range(n)])
            at += n
        with cgutils.for_range_slice(builder, lo, hi, I64(1)) as (t, _):
            _zero_rows(builder, out, x, t, I64(0), I64(k))
            with cgutils.for_range(builder, x.nblk) as blk:
                _record(builder, qtype, f16c, wp, x, out, t, blk.index, rows, scratch=scratch)

    with builder.if_else(builder.icmp_signed("<=", x.M, I64(MAX_STATIC_M))) as (few, many):
        with few:
            switch_static(builder, x.M, MAX_STATIC_M, static, "avx2_m")
        with many:
            _many_rows(builder, qtype, f16c, wp, x, out, lo, hi, scratch)


def _many_rows(builder, qtype, f16c, wp, x, out, lo, hi, scratch) -> None:
    """M > MAX_STATIC_M: chunks of rows whose codes fit ROW_CHUNK_BYTES; per chunk, every
    tile and record once, its codes decoded once into the scratch (DECODE_ONCE), with all
    the chunk's rows in blocks of ROW_BLOCK (the last block of k < ROW_BLOCK rows on a path
    of its own)."""
    bb = builder
    per = bb.udiv(I64(ROW_CHUNK_BYTES), bb.mul(x.nblk, I64(QK_K + 32)))
    per = bb.mul(bb.udiv(per, I64(ROW_BLOCK)), I64(ROW_BLOCK))
    per = bb.select(bb.icmp_signed("<", per, I64(4 * ROW_BLOCK)), I64(4 * ROW_BLOCK), per)
    with cgutils.for_range_slice(bb, I64(0), x.M, per) as (m0, _):
        m1 = bb.add(m0, per)
        m1 = bb.select(bb.icmp_signed("<", m1, x.M), m1, x.M)
        full = bb.sub(m1, bb.srem(bb.sub(m1, m0), I64(ROW_BLOCK)))
        with cgutils.for_range_slice(bb, lo, hi, I64(1)) as (t, _):
            _zero_rows(bb, out, x, t, m0, m1)
            with cgutils.for_range(bb, x.nblk) as blk:
                p = _record_ptr(bb, qtype, wp, x, t, blk.index)
                for at in _ahead(qtype):               # once per record, not per block of rows
                    prefetch(bb, bb.gep(p, [I64(at)], source_etype=I8), 1)
                halves = _halves(bb, qtype, f16c, p, scratch)

                def rows_of(g0, k):
                    _record(bb, qtype, f16c, wp, x, out, t, blk.index, [[bb.add(g0, I64(j)) for j in range(k)]],
                            fetch=False, halves=halves)
                with cgutils.for_range_slice(bb, m0, full, I64(ROW_BLOCK)) as (g0, _):
                    rows_of(g0, ROW_BLOCK)
                switch_static(bb, bb.sub(m1, full), ROW_BLOCK - 1, lambda k: rows_of(full, k), "avx2_tail")
