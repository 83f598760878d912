"""AMX tiles on the 16-row interleaved K-quants (kernels/kquants_x16_amx.py): Q4_K, Q5_K and
Q6_K give reference.kquant_dot's numbers bit for bit (hypothesis: M with tails of 16 and 32
rows, several weight tiles and super-blocks, row blocks split), and each output row is
independent of the others.  Skipped, with the reason, without AMX."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from specdec.kernels import amx, cpu, kquants_x16, kquants_x16_amx, reference, registry
from specdec.kernels.formats import Q6_K
from specdec.kernels.q8k import quantize_q8_k
from helpers import random_weights

needs_amx = pytest.mark.skipif(not amx.available(), reason=f"no AMX here: {amx.status()}")


def _matmul(qt, wi, x):
    xq, xd, xbs = quantize_q8_k(x)
    out = np.full((x.shape[0], 16 * wi.shape[0]), np.nan, np.float32)
    kquants_x16_amx.matmul(qt, wi, xq, xd, xbs, out)
    return out


def _weights(rng, qt, n, nb, extreme: bool):
    """Random rows; extreme: every code byte 0x00 or 0xFF and (Q6_K) every scale -128 or 127,
    the largest |w| = |sc·(u − off)| the formats allow (the two-byte split's bounds)."""
    w = random_weights(rng, qt, n, nb)
    if extreme:
        w = w.reshape(n, nb, -1)
        body = slice(0, 192) if qt == Q6_K else slice(4, None)
        w[:, :, body] = rng.choice(np.array([0, 255], np.uint8), w[:, :, body].shape)
        if qt == Q6_K:
            w[:, :, 192:208] = rng.choice(np.array([0x80, 0x7F], np.uint8), (n, nb, 16))
        w = w.reshape(n, -1)
    return w


@needs_amx
@settings(max_examples=40, deadline=None)
@given(qt=st.sampled_from(kquants_x16.INTERLEAVABLE), tiles=st.integers(1, 4), nb=st.integers(1, 3),
       m=st.integers(16, 80), extreme=st.booleans(), seed=st.integers(0, 2**32 - 1))
def test_tiles_are_bitwise_the_contract(qt, tiles, nb, m, extreme, seed):
    rng = np.random.default_rng(seed)
    w = _weights(rng, qt, 16 * tiles, nb, extreme)
    x = (rng.standard_normal((m, 256 * nb)) * rng.uniform(0.01, 10)).astype(np.float32)
    if extreme:
        x = np.sign(x) + np.float32(0)              # every code ±127
    got = _matmul(qt, kquants_x16.interleave(qt, w), x)
    want = reference.kquant_dot(qt, kquants_x16.deinterleave(qt, kquants_x16.interleave(qt, w)), x)
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))


@needs_amx
@pytest.mark.parametrize("qt", kquants_x16.INTERLEAVABLE)
def test_row_blocks_and_small_passes(qt, monkeypatch):
    """Passes cut into several blocks of activation rows (A_BYTES small), and passes of 1 … 15
    rows (one padded tile), give the contract's bits too."""
    rng = np.random.default_rng(int(qt))
    w = random_weights(rng, qt, 32, 2)
    wi = kquants_x16.interleave(qt, w)
    for m, a_bytes in ((1, 1 << 20), (15, 1 << 20), (97, 1)):
        monkeypatch.setattr(kquants_x16_amx, "A_BYTES", a_bytes)
        x = rng.standard_normal((m, 512)).astype(np.float32)
        assert np.array_equal(_matmul(qt, wi, x).view(np.uint32), reference.kquant_dot(qt, w, x).view(np.uint32))


@needs_amx
@pytest.mark.parametrize("qt", kquants_x16.INTERLEAVABLE)
def test_rows_are_independent(qt):
    """Rows 0, 7 and the last of a pass equal the row alone (M = 1) bit for bit, and row 0 stays
    the same whatever the other rows hold."""
    rng = np.random.default_rng(7 + int(qt))
    wi = kquants_x16.interleave(qt, random_weights(rng, qt, 48, 2))
    x = rng.standard_normal((kquants_x16_amx.MIN_M + 37, 512)).astype(np.float32)
    out = _matmul(qt, wi, x)
    for i in (0, 7, x.shape[0] - 1):
        assert np.array_equal(out[i].view(np.uint32), _matmul(qt, wi, x[i:i + 1])[0].view(np.uint32)), i
    x[1:] = rng.standard_normal(x[1:].shape).astype(np.float32) * 100
    assert np.array_equal(out[0].view(np.uint32), _matmul(qt, wi, x)[0].view(np.uint32))


@needs_amx
@pytest.mark.parametrize("qt", kquants_x16.INTERLEAVABLE)
def test_the_registry_takes_the_tiles_from_min_m(qt, monkeypatch):
    """The interleaved layout's kernel runs passes of MIN_M rows or more on the tiles by default
    where the host has AMX (cpu.tiles_x16), fewer on the SIMD kernels, and both are the contract."""
    if not cpu.tiles_x16():
        pytest.skip(f"{cpu.KERNELS_ENV} forces a path without the tiles")
    kernel = registry.KERNELS[kquants_x16.INTERLEAVED[qt]]
    assert kernel.min_m == kquants_x16_amx.MIN_M and kernel.tiles is not None
    calls = []
    tiles = kquants_x16_amx.matmul
    monkeypatch.setattr(kquants_x16_amx, "matmul", lambda *a: calls.append(a[4].shape[1]) or tiles(*a))
    rng = np.random.default_rng(11 + int(qt))
    w = random_weights(rng, qt, 32, 2)
    wi = kquants_x16.interleave(qt, w)
    for m in (1, kquants_x16_amx.MIN_M - 1, kquants_x16_amx.MIN_M, 41):
        x = rng.standard_normal((m, 512)).astype(np.float32)
        out = kernel.matmul(wi, x)
        assert np.array_equal(out.view(np.uint32), reference.kquant_dot(qt, w, x).view(np.uint32)), m
    assert calls == [kquants_x16_amx.MIN_M, 41]
