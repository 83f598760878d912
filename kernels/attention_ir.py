"""The two dot-product phases of attention as register-blocked SIMD code (Numba intrinsics).

attention.py drives them per work item (a query row and a group of g ≤ G_MAX heads that share
one KV head); the softmax between them stays plain Numba.  Both phases keep a block of results
in vector registers for the whole reduction and read each key / value vector once for all g
heads, which the compiler does not do by itself from loops over arrays:

    scores  s[r, t] = Σ_i q[r, i] · K[i, t]      32 positions × g heads in registers, loop over i
    values  o[r, d] = Σ_t s[r, t] · V[t, d]      32 dimensions × g heads in registers, loop over t

Every sum is one fused multiply-add after another in a fixed order (i = 0, 1, … for scores,
t = 0, 1, … for values) starting from 0.  A position or dimension outside the full blocks of
16 takes the same sequence in scalar code, and llvm.fma rounds once whatever the width, so
each result has the same bits wherever it falls in a block — the result of (row, head) does not
depend on M, on the grouping of heads, or on the row's position within a block.

Arrays (C-contiguous float32):  q (M, H, Dh);  k_cache (Hkv, n_ctx / KV_BLOCK, Dh, KV_BLOCK)
keys in blocks of KV_BLOCK positions, each block transposed (a block of scores reads one
contiguous 8-16 KiB run, which the hardware prefetcher follows; keys transposed over the whole
context would make every dimension its own stream, n_ctx · 4 bytes apart);
v_cache (Hkv, n_ctx, Dh);  s (≥ g, ≥ n) scores;  out (M, H, Dh).
"""
from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from .ir import F32, I64, V16F32, fma_f32, fma_v16f32, splat_v16f32, switch_static

KV_BLOCK = 32        # positions per transposed block of the key cache (a multiple of W)
G_MAX = 8            # heads per work item: 2 · G_MAX accumulators (of 32) stay in registers
W = 16               # floats per vector


def _at(builder, base, idx):
    return builder.gep(base, [idx], source_etype=F32)


def _vload(builder, base, idx):
    return builder.load(_at(builder, base, idx), typ=V16F32, align=4)


def _vstore(builder, value, base, idx):
    builder.store(value, builder.bitcast(_at(builder, base, idx), V16F32.as_pointer()), align=4)


def _sload(builder, base, idx):
    return builder.load(_at(builder, base, idx), typ=F32)


def _mul_add(builder, *terms):
    """Σ of the products of pairs (a, b): a·b + c + …, as i64 index arithmetic."""
    acc = None
    for a, b in terms:
        t = builder.mul(a, b) if b is not None else a
        acc = t if acc is None else builder.add(acc, t)
    return acc


def _zeroed(builder, ty, rows: int, cols: int) -> list:
    """rows × cols stack slots of type ty, set to 0 (registers once optimized)."""
    slots = [[cgutils.alloca_once(builder, ty) for _ in range(cols)] for _ in range(rows)]
    for row in slots:
        for a in row:
            builder.store(ir.Constant(ty, 0.0), a)
    return slots


def _blocked(builder, lo, hi, body_vec, body_scalar, room=None) -> None:
    """Cover lo … hi−1: single indices (body_scalar(i)) up to a multiple of W, blocks of 2W
    (body_vec(start, 2)) and of W (body_vec(start, 1)) while they fit before hi — or, given
    room ≥ hi, while a W block fits before room (its lanes from hi on are computed from
    whatever is there and must not be used) — then single indices again."""
    a = builder.and_(builder.add(lo, I64(W - 1)), I64(-W))
    a = builder.select(builder.icmp_signed("<", a, hi), a, hi)
    with cgutils.for_range_slice(builder, lo, a, I64(1)) as (t, _):
        body_scalar(t)
    n2 = builder.add(a, builder.and_(builder.sub(hi, a), I64(-2 * W)))
    with cgutils.for_range_slice(builder, a, n2, I64(2 * W)) as (t0, _):
        body_vec(t0, 2)
    n1 = builder.add(a, builder.and_(builder.sub(hi, a), I64(-W)))
    if room is not None:
        ceil = builder.add(a, builder.and_(builder.add(builder.sub(hi, a), I64(W - 1)), I64(-W)))
        n1 = builder.select(builder.icmp_signed("<=", ceil, room), ceil, n1)
    with cgutils.for_range_slice(builder, n2, n1, I64(W)) as (t0, _):
        body_vec(t0, 1)
    with cgutils.for_range_slice(builder, n1, hi, I64(1)) as (t, _):
        body_scalar(t)


def _emit_scores(builder, qp, kp, sp, Dh, H, NB, KB, ns, m, h0, g, kvh, j0, n):
    """s[r, t − j0] = Σ_i q[m, h0 + r, i] · K[kvh, t // KB, i, t % KB] for r < g and the
    positions t = j0 … j0 + n − 1.  The last block of positions is a full vector when the
    cache and s have room for it (s[r, n:] then holds scores of cache slots past the visible
    ones: never to be used)."""
    hi = builder.add(j0, n)
    cap = builder.mul(NB, KB)
    room = builder.select(builder.icmp_signed("<", cap, builder.add(ns, j0)), cap,
                          builder.add(ns, j0))                              # slots < room
    qrow = _mul_add(builder, (builder.add(builder.mul(m, H), h0), Dh))     # q[m, h0, 0]

    def kpos(t):                                    # K[kvh, t // KB, 0, t % KB]
        blk = builder.add(builder.mul(kvh, NB), builder.sdiv(t, KB))
        return _mul_add(builder, (builder.mul(blk, Dh), KB), (builder.srem(t, KB), None))

    def for_g(gs):
        def vec(t0, nb):
            accs = _zeroed(builder, V16F32, gs, nb)
            kb = [kpos(builder.add(t0, I64(W * b))) for b in range(nb)]   # W | KB: no block split
            with cgutils.for_range(builder, Dh) as i:
                iKB = builder.mul(i.index, KB)
                kv = [_vload(builder, kp, builder.add(kb[b], iKB)) for b in range(nb)]
                for r, row in enumerate(accs):
                    qi = splat_v16f32(builder, _sload(builder, qp, _mul_add(
                        builder, (qrow, None), (I64(r), Dh), (i.index, None))))
                    for b, a in enumerate(row):
                        builder.store(fma_v16f32(builder, qi, kv[b], builder.load(a)), a)
            for r, row in enumerate(accs):
                for b, a in enumerate(row):
                    _vstore(builder, builder.load(a), sp, _mul_add(
                        builder, (I64(r), ns), (builder.sub(t0, j0), None), (I64(W * b), None)))

        def scalar(t):
            accs = [row[0] for row in _zeroed(builder, F32, gs, 1)]
            kt = kpos(t)
            with cgutils.for_range(builder, Dh) as i:
                kv = _sload(builder, kp, builder.add(kt, builder.mul(i.index, KB)))
                for r, a in enumerate(accs):
                    qi = _sload(builder, qp, _mul_add(builder, (qrow, None), (I64(r), Dh),
                                                      (i.index, None)))
                    builder.store(fma_f32(builder, qi, kv, builder.load(a)), a)
            for r, a in enumerate(accs):
                builder.store(builder.load(a), _at(builder, sp, _mul_add(
                    builder, (I64(r), ns), (builder.sub(t, j0), None))))
        _blocked(builder, j0, hi, vec, scalar, room)
    switch_static(builder, g, G_MAX, for_g, "g")        # one code path per head count


def _emit_values(builder, sp, vp, op, Dh, H, n_ctx, ns, m, h0, g, kvh, j0, n):
    """out[m, h0 + r, d] = Σ_t s[r, t] · V[kvh, j0 + t, d] for r < g, every d."""
    vrow = builder.mul(builder.add(builder.mul(kvh, n_ctx), j0), Dh)        # V[kvh, j0, 0]
    orow = builder.mul(builder.add(builder.mul(m, H), h0), Dh)              # out[m, h0, 0]

    def for_g(gs):
        def vec(d0, nb):
            accs = _zeroed(builder, V16F32, gs, nb)
            with cgutils.for_range(builder, n) as t:
                vbase = _mul_add(builder, (t.index, Dh), (vrow, None), (d0, None))
                vv = [_vload(builder, vp, builder.add(vbase, I64(W * b))) for b in range(nb)]
                for r, row in enumerate(accs):
                    w = splat_v16f32(builder, _sload(builder, sp, _mul_add(
                        builder, (I64(r), ns), (t.index, None))))
                    for b, a in enumerate(row):
                        builder.store(fma_v16f32(builder, w, vv[b], builder.load(a)), a)
            for r, row in enumerate(accs):
                for b, a in enumerate(row):
                    _vstore(builder, builder.load(a), op,
                            _mul_add(builder, (orow, None), (I64(r), Dh), (d0, None), (I64(W * b), None)))

        def scalar(d):
            accs = [row[0] for row in _zeroed(builder, F32, gs, 1)]
            with cgutils.for_range(builder, n) as t:
                vv = _sload(builder, vp, _mul_add(builder, (t.index, Dh), (vrow, None), (d, None)))
                for r, a in enumerate(accs):
                    w = _sload(builder, sp, _mul_add(builder, (I64(r), ns), (t.index, None)))
                    builder.store(fma_f32(builder, w, vv, builder.load(a)), a)
            for r, a in enumerate(accs):
                builder.store(builder.load(a), _at(builder, op, _mul_add(
                    builder, (orow, None), (I64(r), Dh), (d, None))))
        _blocked(builder, I64(0), Dh, vec, scalar)
    switch_static(builder, g, G_MAX, for_g, "g")        # one code path per head count


def _args(context, builder, signature, args, n_arrays):
    arrays = [context.make_array(t)(context, builder, value=v)
              for t, v in zip(signature.args[:n_arrays], args[:n_arrays])]
    ints = [context.cast(builder, v, t, types.int64)
            for v, t in zip(args[n_arrays:], signature.args[n_arrays:])]
    return arrays, ints


@intrinsic
def scores(typingctx, q, k_cache, s, m, h0, g, kvh, j0, n):
    """scores(q, k_cache, s, m, h0, g, kvh, j0, n): s[r, :n] = q[m, h0 + r] · (keys j0 … j0+n−1
    of KV head kvh) for r < g (1 ≤ g ≤ G_MAX), unscaled; k_cache (Hkv, n_blocks, Dh, KV_BLOCK)."""
    sig = types.void(q, k_cache, s, m, h0, g, kvh, j0, n)

    def codegen(context, builder, signature, args):
        (qa, ka, sa), (m_, h0_, g_, kvh_, j0_, n_) = _args(context, builder, signature, args, 3)
        _, H, Dh = cgutils.unpack_tuple(builder, qa.shape, 3)
        _, NB, _, KB = cgutils.unpack_tuple(builder, ka.shape, 4)
        ns = cgutils.unpack_tuple(builder, sa.shape, 2)[1]
        _emit_scores(builder, qa.data, ka.data, sa.data, Dh, H, NB, KB, ns, m_, h0_, g_, kvh_, j0_, n_)
        return context.get_dummy_value()
    return sig, codegen


@intrinsic
def values(typingctx, s, v_cache, out, m, h0, g, kvh, j0, n):
    """values(s, v_cache, out, m, h0, g, kvh, j0, n): out[m, h0 + r] = s[r, :n] · V[kvh, j0:j0 + n]
    for r < g (1 ≤ g ≤ G_MAX)."""
    sig = types.void(s, v_cache, out, m, h0, g, kvh, j0, n)

    def codegen(context, builder, signature, args):
        (sa, va, oa), (m_, h0_, g_, kvh_, j0_, n_) = _args(context, builder, signature, args, 3)
        _, H, Dh = cgutils.unpack_tuple(builder, oa.shape, 3)
        n_ctx = cgutils.unpack_tuple(builder, va.shape, 3)[1]
        ns = cgutils.unpack_tuple(builder, sa.shape, 2)[1]
        _emit_values(builder, sa.data, va.data, oa.data, Dh, H, n_ctx, ns, m_, h0_, g_, kvh_, j0_, n_)
        return context.get_dummy_value()
    return sig, codegen
