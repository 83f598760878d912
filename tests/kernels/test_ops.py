"""Element-wise kernels and attention against float64 NumPy references; row independence."""
from __future__ import annotations

import math

import numpy as np
from hypothesis import given, settings, strategies as st

from specdec.kernels import reference
from specdec.kernels.attention import attention, blocked_keys
from specdec.kernels.ops import swiglu


def test_swiglu_close_to_float64_and_in_place():
    rng = np.random.default_rng(0)
    g = (rng.standard_normal((5, 777)) * 8).astype(np.float32)
    g[0, :8] = [-100.0, 100.0, -87.5, 88.5, 0.0, -0.0, 1e-30, -1e-30]   # clamp edges, zeros
    u = rng.standard_normal((5, 777)).astype(np.float32)
    out = np.empty_like(g)
    swiglu(g, u, out)
    g64 = g.astype(np.float64)
    ref = g64 / (1.0 + np.exp(-g64)) * u
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
