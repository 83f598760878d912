"""AMX tiles for the K-quants (kernels/kquants_amx.py): every K-quant, in either weight layout,
gives kquants_ir's numbers bit for bit for any M (tails of 16 activation rows and of 16
weight rows included) and the NumPy contract's (reference.kquant_dot); a pass that takes the
tiles keeps each row independent of the others.  Skipped, with the reason, without AMX."""
from __future__ import annotations

import gguf
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from specdec.kernels import amx, cpu, kquants, kquants_amx, kquants_ir, kquants_repack, reference
from specdec.kernels.q8k import quantize_q8_k
from helpers import assert_rows_independent, random_weights

T = gguf.GGMLQuantizationType
KQUANTS = [T.Q2_K, T.Q3_K, T.Q4_K, T.Q5_K, T.Q6_K]
needs_amx = pytest.mark.skipif(not amx.available(), reason=f"no AMX here: {amx.status()}")


def _bits(a: np.ndarray) -> np.ndarray:
    return a.view(np.uint32)


def _layout(qt, w, repacked: bool):
    if repacked:
        return kquants_repack.repack(w, int(qt)), kquants_ir.MATMUL_Q8K_REPACKED
    return w, kquants_ir.MATMUL_Q8K


@needs_amx
@settings(max_examples=30, deadline=None)
@given(qt=st.sampled_from(KQUANTS), repacked=st.booleans(), n=st.integers(1, 50),
       nb=st.integers(1, 3), m=st.integers(1, 64), seed=st.integers(0, 2**32 - 1))
def test_tiles_are_bitwise_the_vnni_drivers(qt, repacked, n, nb, m, seed):
    repacked = repacked and kquants_repack.repackable(int(qt))
    rng = np.random.default_rng(seed)
    w0 = random_weights(rng, int(qt), n, nb)
    w, drivers = _layout(qt, w0, repacked)
    x = rng.standard_normal((m, 256 * nb)).astype(np.float32) * rng.uniform(0.01, 10)
    xq, xd, xbs = quantize_q8_k(x)
    ref, got = np.empty((m, n), np.float32), np.full((m, n), np.nan, np.float32)
    drivers[int(qt)](w, xq, xd, xbs, ref, 2)
    kquants_amx.matmul(int(qt), w, xq, xd, xbs, got, repacked, drivers)
    assert np.array_equal(_bits(ref), _bits(got))
    assert np.array_equal(_bits(got), _bits(reference.kquant_dot(int(qt), w0, x)))


@needs_amx
@pytest.mark.parametrize("qt", [T.Q4_K, T.Q6_K])
def test_passes_that_take_the_tiles_keep_rows_independent(qt, monkeypatch):
    """With the tiles on, the public matmul sends M >= MIN_M through them: each row equals the
    row alone (M = 1, the VNNI drivers), whatever the other rows hold."""
    monkeypatch.setattr(cpu, "tiles", lambda: True)
    rng = np.random.default_rng(int(qt))
    w = random_weights(rng, int(qt), 40, 2)
    x = rng.standard_normal((kquants_amx.MIN_M[int(qt)] + 19, 512)).astype(np.float32)
    assert_rows_independent(kquants.MATMUL[int(qt)], w, x, rng)
