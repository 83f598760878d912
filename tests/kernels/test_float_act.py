"""Quantized weights × float32 activations (kernels/float_act.py), every block format.

Reference: gguf.quants.dequantize(W) @ x in float64.  The kernel dequantizes bit-exactly
(kernels/dequant_ir.py; bit for bit against an emulation below) and sums K float32 products in 32 lanes, so its
error is float32 rounding only: at most γ_K·Σ|w·x| with γ_K = K·2⁻²⁴/(1 − K·2⁻²⁴), the
textbook bound for a float32 sum of K rounded products (Higham, Accuracy and Stability,
§3.1) — the bound asserted here, with no slack for any decoding mistake, which would be
orders of magnitude larger.
"""
from __future__ import annotations

import gguf
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from specdec import kernels
from fakes import one_thread
from helpers import emulate_float, make_weights, random_weights

T = gguf.GGMLQuantizationType
LEGACY = [T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0]
KQUANTS = [T.Q2_K, T.Q3_K, T.Q4_K, T.Q5_K, T.Q6_K]
SETTINGS = settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def weights(rng, qtype, n: int, k: int) -> np.ndarray:
    if qtype in LEGACY:   # gguf-py quantizes the legacy formats
        return gguf.quants.quantize(rng.standard_normal((n, k)).astype(np.float32), qtype)
    return random_weights(rng, qtype, n, k // 256)


def run(qtype, w, x) -> np.ndarray:
    out = np.full((x.shape[0], w.shape[0]), np.nan, np.float32)
    return kernels.matmul(w, int(qtype), x, out, float_act=True)


@pytest.mark.parametrize("qtype", LEGACY + KQUANTS, ids=lambda t: t.name)
@SETTINGS
@given(seed=st.integers(0, 2**32 - 1), m=st.integers(1, 9), n=st.integers(1, 40),
       nb=st.integers(1, 3))
def test_matches_dequantized_within_float32_bound(qtype, seed, m, n, nb):
    rng = np.random.default_rng(seed)
    k = 256 * nb
    w = weights(rng, qtype, n, k)
    x = rng.standard_normal((m, k)).astype(np.float32)
    deq = gguf.quants.dequantize(w, qtype).astype(np.float64)          # (N, K)
    ref = x.astype(np.float64) @ deq.T                                  # (M, N)
    g = k * 2.0**-24 / (1 - k * 2.0**-24)
    bound = g * (np.abs(x).astype(np.float64) @ np.abs(deq).T)
    err = np.abs(run(qtype, w, x) - ref)
    assert np.all(err <= bound), float((err - bound).max())


@pytest.mark.parametrize("qtype", [T.Q5_0, T.Q8_0, T.Q4_K, T.Q6_K, T.Q3_K], ids=lambda t: t.name)
@SETTINGS
@given(seed=st.integers(0, 2**32 - 1), m=st.integers(2, 40), n=st.integers(1, 40))
def test_rows_are_independent(qtype, seed, m, n):
    """out[m] is bitwise the same whatever M, the other rows and the thread count are (fused
    passes of up to 8 rows, dequant_ir.MATMUL_DOT; Q3_K through a dequantized row buffer)."""
    rng = np.random.default_rng(seed)
    w = weights(rng, qtype, n, 512)
    x = rng.standard_normal((m, 512)).astype(np.float32)
    full = run(qtype, w, x)
    for i in range(m):
        np.testing.assert_array_equal(run(qtype, w, x[i:i + 1])[0], full[i])
    with one_thread():
        np.testing.assert_array_equal(run(qtype, w, x), full)


def test_bad_shapes_are_rejected():
    w = np.zeros((4, 22), np.uint8)                     # one Q5_0 block per row: K = 32
    with pytest.raises(ValueError, match="Q5_0"):
        run(T.Q5_0, w, np.zeros((1, 64), np.float32))




@pytest.mark.parametrize("qtype", LEGACY + KQUANTS, ids=lambda t: t.name)
@SETTINGS
@given(seed=st.integers(0, 2**32 - 1), m=st.integers(1, 20), n=st.integers(1, 12),
       nb=st.integers(1, 3))
def test_matches_documented_float_sequence_bitwise(qtype, seed, m, n, nb):
    """Raw bytes (every code, random finite scales) give bit for bit gguf's dequantized row
    dotted with x in legacy_ir.dot32_lanes' 32 float32 lanes and fold: the SIMD decoders of
    dequant_ir are exact and the fused dot keeps that order, across passes of 8 rows."""
    rng = np.random.default_rng(seed)
    k = 256 * nb
    w = make_weights(qtype, n, k, rng, raw=True) if qtype in LEGACY else random_weights(rng, qtype, n, nb)
    x = rng.standard_normal((m, k)).astype(np.float32)
    want = emulate_float(gguf.quants.dequantize(w, qtype).astype(np.float32), T.F32, x)
    assert np.array_equal(run(qtype, w, x).view(np.uint32), want.view(np.uint32))
