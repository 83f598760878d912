"""The 16-row interleaved K-quant layout (kernels/kquants_x16.py): interleave and deinterleave
are exact inverses, and every byte sits where the module docstring says."""
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from kernels import kquants_x16 as x16
from kernels.formats import FORMATS, Q4_K, Q5_K, Q6_K
from kernels.reference import kquant_parts

QS_AT = {Q4_K: 320, Q5_K: 832, Q6_K: 1344}      # offset of the low-nibble vectors in a record
QH_AT = {Q5_K: 320, Q6_K: 320}


@settings(max_examples=30, deadline=None)
@given(qt=st.sampled_from(x16.INTERLEAVABLE), tiles=st.integers(1, 3), nb=st.integers(1, 3),
       seed=st.integers(0, 2**32 - 1))
def test_roundtrip(qt, tiles, nb, seed):
    w = np.random.default_rng(seed).integers(0, 256, (16 * tiles, FORMATS[qt].row_bytes(256 * nb)), np.uint8)
    wi = x16.interleave(qt, w)
    assert wi.shape == (tiles, nb * x16.RECORD[qt]) and x16.RECORD[qt] % 64 == 0
    assert np.array_equal(x16.deinterleave(qt, wi), w)


@pytest.mark.parametrize("qt", x16.INTERLEAVABLE)
def test_documented_bytes(qt):
    w = np.random.default_rng(qt).integers(0, 256, (32, FORMATS[qt].row_bytes(512)), np.uint8)
    rec = x16.interleave(qt, w).reshape(2, 2, x16.RECORD[qt]).astype(np.int32)
    p = kquant_parts(qt, w)
    for T, b, r, c, h, t, i in np.ndindex(2, 2, 16, 4, 2, 8, 4):
        if (r + c + t + i) % 5:
            continue                                  # a fifth of the entries keeps it quick
        n, v = 16 * T + r, 64 * c + 32 * h + 4 * t + i
        byte = rec[T, b, QS_AT[qt] + (8 * c + t) * 64 + 4 * r + i]
        assert (byte >> (4 * h)) & 15 == p.u[n, b, v] & 15
        if qt == Q5_K:
            assert (rec[T, b, QH_AT[qt] + t * 64 + 4 * r + i] >> (2 * c + h)) & 1 == p.u[n, b, v] >> 4
        if qt == Q6_K:
            assert (rec[T, b, QH_AT[qt] + (8 * h + t) * 64 + 4 * r + i] >> (2 * c)) & 3 == p.u[n, b, v] >> 4
    if qt != Q6_K:
        sc = rec[:, :, 64:192].reshape(2, 2, 8, 16)
        assert np.array_equal(sc.transpose(0, 3, 1, 2).reshape(32, 2, 8), p.sc[..., ::2])


def test_refuses_odd_rows():
    with pytest.raises(ValueError, match="16"):
        x16.interleave(Q4_K, np.zeros((8, FORMATS[Q4_K].row_bytes(256)), np.uint8))
