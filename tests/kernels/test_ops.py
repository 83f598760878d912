"""Element-wise kernels and attention against their float64 NumPy references (kernels/reference.py);
row independence."""
from __future__ import annotations

import math

import numpy as np
from hypothesis import given, settings, strategies as st

from specdec.kernels import reference
from specdec.kernels.attention import attention, blocked_keys
from specdec.kernels.attention_tree import attention_tree, tree_mask
from specdec.kernels.ops import geglu, rms_norm, rms_norm_heads, rope_apply, rope_cos_sin, swiglu


def _rows_alone(fn, *arrays):
    """fn over all rows, and over each row alone: the same bits."""
    full = fn(*arrays)
    for m in range(arrays[0].shape[0]):
        assert np.array_equal(fn(*(a[m:m + 1] for a in arrays)), full[m:m + 1])
    return full


def test_swiglu_close_to_float64_and_in_place():
    rng = np.random.default_rng(0)
    g = (rng.standard_normal((5, 777)) * 8).astype(np.float32)
    g[0, :8] = [-100.0, 100.0, -87.5, 88.5, 0.0, -0.0, 1e-30, -1e-30]   # clamp edges, zeros
    u = rng.standard_normal((5, 777)).astype(np.float32)
    out = np.empty_like(g)
    swiglu(g, u, out)
    ref = reference.swiglu(g, u)
    # a few float32 ulp; below e^-87 the clamp answers ~1e-36 for what is ~0
    assert np.all(np.abs(out - ref) <= 8 * 2.0 ** -24 * np.abs(ref) + 1e-35)
    assert np.all(np.isfinite(out))
    inplace = g.copy()
    swiglu(inplace, u, inplace)                             # the forward pass writes over gate
    assert np.array_equal(inplace, out)
    for m in range(5):                                      # a row alone: the same bits
        one = np.empty((1, 777), np.float32)
        swiglu(g[m:m + 1], u[m:m + 1], one)
        assert np.array_equal(one[0], out[m])


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), m=st.integers(1, 9), hkv=st.sampled_from([1, 2]),
       rep=st.sampled_from([1, 3, 6, 7, 9]), dh=st.sampled_from([8, 20, 64, 128]),
       start=st.integers(0, 80), window=st.sampled_from([0, 5, 40]), room=st.sampled_from([0, 3, 40]))
def test_attention_matches_reference_and_rows_are_independent(seed, m, hkv, rep, dh, start, window,
                                                               room):
    """Heads per work item (1 … 8, several items per KV head when H / Hkv = 9), positions and
    dimensions in full SIMD blocks, in a last block reaching past the visible keys (room in the
    cache: `room` slots) and in scalar tails: all agree with float64, each row alone is bitwise
    the row of the batch."""
    rng = np.random.default_rng(seed)
    n_ctx, H = start + m + room, hkv * rep
    q = rng.standard_normal((m, H, dh)).astype(np.float32)
    k = rng.standard_normal((hkv, n_ctx, dh)).astype(np.float32)
    v = rng.standard_normal((hkv, n_ctx, dh)).astype(np.float32)
    kt = blocked_keys(k)                                    # the cache's key layout
    pos = np.arange(start, start + m, dtype=np.int64)
    scale = np.float32(1.0 / math.sqrt(dh))
    out = np.empty_like(q)
    attention(q, kt, v, pos, scale, window, out)
    np.testing.assert_allclose(out, reference.attention(q, k, v, pos, scale, window), rtol=1e-4, atol=1e-5)
    for i in range(m):                                      # each row alone: bitwise the same
        one = np.empty((1, H, dh), np.float32)
        attention(q[i:i + 1], kt, v, pos[i:i + 1], scale, window, one)
        assert np.array_equal(one, out[i:i + 1])


def test_geglu_close_to_float64_and_rows_alone():
    rng = np.random.default_rng(1)
    g = (rng.standard_normal((4, 2100)) * 4).astype(np.float32)
    u = rng.standard_normal((4, 2100)).astype(np.float32)

    def run(g, u):
        out = np.empty_like(g)
        geglu(g, u, out)
        return out
    out = _rows_alone(run, g, u)
    ref = reference.geglu(g, u)
    # 1 + tanh(·) cancels for g << 0: float32's ulp of 1, times |g·u|
    assert np.all(np.abs(out - ref) <= 2.0 ** -21 * np.abs(g.astype(np.float64) * u) + 1e-30)


def test_rms_norm_and_per_head_close_to_float64():
    rng = np.random.default_rng(2)
    x = (rng.standard_normal((5, 96)) * 3).astype(np.float32)
    w = rng.standard_normal(96).astype(np.float32)

    def run(x):
        out = np.empty_like(x)
        rms_norm(x, w, 1e-6, out)
        return out
    np.testing.assert_allclose(_rows_alone(run, x), reference.rms_norm(x, w, 1e-6), rtol=2e-6, atol=1e-7)
    heads = x.reshape(5, 4, 24).copy()
    rms_norm_heads(heads, w[:24], 1e-6)
    np.testing.assert_allclose(heads, reference.rms_norm(x.reshape(5, 4, 24), w[:24], 1e-6), rtol=2e-6, atol=1e-7)


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), neox=st.booleans(), dh=st.sampled_from([8, 64, 128]),
       partial=st.booleans(), freq_scale=st.sampled_from([1.0, 0.25]), factors=st.booleans(),
       start=st.integers(0, 5000))
def test_rope_close_to_float64(seed, neox, dh, partial, freq_scale, factors, start):
    """NORM and NEOX pairs, a partial rotation (n_rot < Dh), rope_freqs factors and linear
    scaling, positions up to a few thousand; each row alone rotates to the same bits."""
    rng = np.random.default_rng(seed)
    n_rot = dh // 2 if partial else dh
    f = (rng.uniform(1.0, 8.0, n_rot // 2) if factors else np.ones(n_rot // 2)).astype(np.float32)
    pos = np.arange(start, start + 6, dtype=np.int64)
    x = rng.standard_normal((6, 3, dh)).astype(np.float32)

    def run(x, pos):
        y = x.copy()
        rope_apply(y, rope_cos_sin(pos, n_rot, 10000.0, freq_scale, f), neox)
        return y
    ref = reference.rope(x, pos, 10000.0, neox=neox, n_rot=n_rot, freq_scale=freq_scale, factors=f)
    # theta rounds to float32 only in cos and sin: a few ulp of |x|
    np.testing.assert_allclose(_rows_alone(run, x, pos), ref, rtol=0, atol=4e-6 * np.abs(x).max())


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), base=st.integers(0, 70), data=st.data(),
       rep=st.sampled_from([1, 3]), dh=st.sampled_from([8, 20, 64]), window=st.sampled_from([0, 3, 40]))
def test_attention_tree_close_to_float64(seed, base, data, rep, dh, window):
    """Each node sees the context and its ancestors (tests/speculation/test_tree_engine.py has
    the bitwise agreement with the node's path evaluated alone)."""
    rng = np.random.default_rng(seed)
    n = data.draw(st.integers(1, 10))
    parents = np.array([data.draw(st.integers(-1, i - 1)) for i in range(n)], np.int64)
    depth, anc = tree_mask(parents)
    hkv, H = 2, 2 * rep
    q = rng.standard_normal((n, H, dh)).astype(np.float32)
    k = rng.standard_normal((hkv, base + n + 5, dh)).astype(np.float32)
    v = rng.standard_normal((hkv, base + n + 5, dh)).astype(np.float32)
    scale = np.float32(1 / math.sqrt(dh))
    out = np.empty_like(q)
    attention_tree(q, blocked_keys(k), v, base, depth, anc, scale, window, out)
    want = reference.attention_tree(q, k, v, base, parents.tolist(), scale, window)
    np.testing.assert_allclose(out, want, rtol=1e-4, atol=1e-5)
