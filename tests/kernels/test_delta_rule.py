"""kernels/delta_rule.py: the Gated DeltaNet kernels against their float64 references, and the
property the recurrent state's rollback rests on: M rows in one call are bitwise M one-row
calls (the state after row m, and every row's output)."""
from __future__ import annotations

import numpy as np
import pytest

from specdec.kernels import reference
from specdec.kernels.delta_rule import (causal_conv_silu, decay_and_beta, gated_delta_rule, l2_norm_heads,
                                        mul_sigmoid, mul_silu)

HK, HV, S, M = 2, 4, 16, 7


def _inputs(rng, m=M, hk=HK, hv=HV, s=S):
    q = rng.standard_normal((m, hk, s)).astype(np.float32)
    k = rng.standard_normal((m, hk, s)).astype(np.float32)
    l2_norm_heads(q, 1e-6)
    l2_norm_heads(k, 1e-6)
    v = rng.standard_normal((m, hv, s)).astype(np.float32)
    g = -rng.uniform(0.01, 1.0, (m, hv)).astype(np.float32)
    beta = rng.uniform(0.1, 0.9, (m, hv)).astype(np.float32)
    s0 = (rng.standard_normal((hv, s, s)) * 0.3).astype(np.float32)
    return s0, q, k, v, g, beta


@pytest.mark.parametrize("s", [16, 13])          # a vector width and not
def test_delta_rule_matches_its_reference(s):
    rng = np.random.default_rng(0)
    s0, q, k, v, g, beta = _inputs(rng, s=s)
    st, out = np.empty_like(s0), np.empty((M, HV, s), np.float32)
    gated_delta_rule(s0, st, q, k, v, g, beta, out)
    want_out, want_s = reference.gated_delta_rule(s0, q, k, v, g, beta)
    assert np.abs(out - want_out).max() < 1e-5
    assert np.abs(st - want_s).max() < 1e-5


def test_delta_rule_rows_are_one_row_steps_bitwise():
    rng = np.random.default_rng(1)
    s0, q, k, v, g, beta = _inputs(rng)
    st, out = np.empty_like(s0), np.empty((M, HV, S), np.float32)
    gated_delta_rule(s0, st, q, k, v, g, beta, out)
    cur, one = s0.copy(), np.empty((1, HV, S), np.float32)
    for m in range(M):
        nxt = np.empty_like(cur)
        gated_delta_rule(cur, nxt, q[m:m + 1], k[m:m + 1], v[m:m + 1], g[m:m + 1], beta[m:m + 1], one)
        assert np.array_equal(one[0], out[m])
        part = np.empty_like(s0)
        gated_delta_rule(s0, part, q[:m + 1], k[:m + 1], v[:m + 1], g[:m + 1], beta[:m + 1],
                         np.empty((m + 1, HV, S), np.float32))
        assert np.array_equal(nxt, part)                  # the prefix replay: the same state
        cur = nxt
    assert np.array_equal(cur, st)


def test_conv_matches_its_reference_and_splits_bitwise():
    rng = np.random.default_rng(2)
    C, K = 24, 4
    state0 = rng.standard_normal((K - 1, C)).astype(np.float32)
    x = rng.standard_normal((M, C)).astype(np.float32)
    w = rng.standard_normal((C, K)).astype(np.float32)
    out = np.empty_like(x)
    causal_conv_silu(state0, x, w, out)
    assert np.abs(out - reference.causal_conv_silu(state0, x, w)).max() < 1e-5
    st, rows = state0.copy(), []
    for m in range(M):                                   # one row at a time, the state carried
        o = np.empty((1, C), np.float32)
        causal_conv_silu(st, x[m:m + 1], w, o)
        rows.append(o)
        st = np.concatenate([st, x[m:m + 1]])[1:]
    assert np.array_equal(np.concatenate(rows), out)


def test_gates_and_norms():
    rng = np.random.default_rng(3)
    alpha = rng.standard_normal((5, HV)).astype(np.float32) * 10
    beta = rng.standard_normal((5, HV)).astype(np.float32)
    dt, a = rng.standard_normal(HV).astype(np.float32), -rng.uniform(0.5, 2, HV).astype(np.float32)
    y = alpha.astype(np.float64) + dt
    want_g = np.where(y > 20, y, np.log1p(np.exp(np.minimum(y, 20)))) * a
    want_b = 1 / (1 + np.exp(-beta.astype(np.float64)))
    decay_and_beta(alpha, beta, dt, a)
    assert np.abs(alpha - want_g).max() < 1e-4 * np.abs(want_g).max() and np.abs(beta - want_b).max() < 1e-6
    x = rng.standard_normal((3, 2, 16)).astype(np.float32)
    want = x / np.sqrt((x.astype(np.float64) ** 2).sum(-1, keepdims=True) + 1e-6)
    l2_norm_heads(x, 1e-6)
    assert np.abs(x - want).max() < 1e-6
    x, z = rng.standard_normal((2, 8)).astype(np.float32), rng.standard_normal((2, 8)).astype(np.float32)
    sig = 1 / (1 + np.exp(-z.astype(np.float64)))
    for fn, gate in ((mul_silu, z * sig), (mul_sigmoid, sig)):
        y = x.copy()
        fn(y, z)
        assert np.abs(y - x * gate).max() < 1e-6
