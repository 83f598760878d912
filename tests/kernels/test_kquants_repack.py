"""K-quant blocks repacked into the kernels' lane order (kernels/kquants_repack.py).

The repacked layout is a byte permutation inside each super-block: repack then unpack gives
the GGUF bytes back, and the matmul over repacked weights is bitwise the matmul over the
GGUF rows for every M (both kernel paths) — the same codes, scales and float operations.
The row lookup of a repacked embedding table (K-quant or legacy record) is bitwise the GGUF one.
"""
from __future__ import annotations

import gguf
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from specdec.kernels import kquants, kquants_ir, kquants_repack, reference, repack
from fakes import one_thread
from helpers import make_weights, random_weights

T = gguf.GGMLQuantizationType
FORMATS = [T.Q4_K, T.Q5_K, T.Q6_K]
SETTINGS = settings(max_examples=10, deadline=None)


def _matmul(table, qtype, w, x):
    out = np.full((x.shape[0], w.shape[0]), np.nan, np.float32)
    table[qtype](w, np.ascontiguousarray(x, np.float32), out)
    return out


@pytest.mark.parametrize("qtype", FORMATS, ids=lambda t: t.name)
def test_repack_is_a_permutation_within_each_block(qtype):
    rng = np.random.default_rng(int(qtype))
    w = random_weights(rng, qtype, 5, 3)
    r = repack.repack(w, int(qtype))
    assert r.shape == w.shape and r.dtype == np.uint8
    np.testing.assert_array_equal(r, kquants_repack.repack_by_table(w, int(qtype)))
    np.testing.assert_array_equal(kquants_repack.unpack(r, int(qtype)), w)
    same = w.copy()
    assert repack.repack(same, int(qtype), in_place=True) is same
    np.testing.assert_array_equal(same, r)
    bb = w.shape[1] // 3
    # the header bytes stay in place, the code bytes hold the same set bits
    codes = kquants_repack.CODES[int(qtype)]
    wb, rb = w.reshape(-1, bb), r.reshape(-1, bb)
    np.testing.assert_array_equal(wb[:, ~codes], rb[:, ~codes])
    popcount = lambda a: np.unpackbits(a[:, codes], axis=1).sum(1)
    np.testing.assert_array_equal(popcount(wb), popcount(rb))
    assert not np.array_equal(wb, rb)


@pytest.mark.parametrize("qtype", FORMATS, ids=lambda t: t.name)
@SETTINGS
@given(seed=st.integers(0, 2**32 - 1), m=st.integers(1, 64), n=st.integers(1, 40),
       nb=st.integers(1, 3))
def test_repacked_matmul_is_bitwise_the_gguf_one(qtype, seed, m, n, nb):
    """Both layouts compute reference.kquant_dot bit for bit, for every M."""
    rng = np.random.default_rng(seed)
    w = random_weights(rng, qtype, n, nb)
    x = rng.standard_normal((m, 256 * nb)).astype(np.float32)
    got = _matmul(repack.MATMUL, repack.REPACKED[int(qtype)], repack.repack(w, int(qtype)), x)
    np.testing.assert_array_equal(got.view(np.int32), _matmul(kquants.MATMUL, int(qtype), w, x).view(np.int32))
    np.testing.assert_array_equal(got.view(np.int32), reference.kquant_dot(int(qtype), w, x).view(np.int32))


@pytest.mark.parametrize("qtype", FORMATS, ids=lambda t: t.name)
def test_repacked_matmul_across_passes_and_threads(qtype):
    """M > MAX_STATIC_M over more weight rows than a pass: bitwise the GGUF path, on one
    thread and on all of them, and each row alone."""
    rng = np.random.default_rng(int(qtype) + 7)
    n, m = 2 * kquants_ir.PASS_ROWS + 3, kquants_ir.MAX_STATIC_M + kquants_ir.PASS_M + 2
    w = random_weights(rng, qtype, n, 2)
    x = rng.standard_normal((m, 512)).astype(np.float32)
    r, rq = repack.repack(w, int(qtype)), repack.REPACKED[int(qtype)]
    ref = _matmul(kquants.MATMUL, int(qtype), w, x)
    np.testing.assert_array_equal(_matmul(repack.MATMUL, rq, r, x), ref)
    with one_thread():
        np.testing.assert_array_equal(_matmul(repack.MATMUL, rq, r, x), ref)
    for i in (0, m - 1):
        np.testing.assert_array_equal(_matmul(repack.MATMUL, rq, r, x[i:i + 1])[0], ref[i])


@pytest.mark.parametrize("qtype", FORMATS, ids=lambda t: t.name)
def test_repacked_table_rows(qtype):
    rng = np.random.default_rng(int(qtype) + 11)
    w = random_weights(rng, qtype, 9, 2)
    ids = np.array([4, 0, 4, 8, 1])
    want = np.empty((5, 512), np.float32)
    kquants.GET_ROWS[int(qtype)](w, ids, want)
    got = np.empty_like(want)
    repack.GET_ROWS[repack.REPACKED[int(qtype)]](repack.repack(w, int(qtype)), ids, got)
    np.testing.assert_array_equal(got.view(np.int32), want.view(np.int32))
    with pytest.raises(IndexError):
        repack.GET_ROWS[repack.REPACKED[int(qtype)]](w, np.array([9]), got[:1])


@pytest.mark.parametrize("qtype", [T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0], ids=lambda t: t.name)
def test_legacy_record_table_rows(qtype):
    """A legacy table in 8-row records: any rows, repeated and unsorted, bitwise as stored."""
    from specdec.kernels import legacy
    rng = np.random.default_rng(int(qtype) + 13)
    w = make_weights(qtype, 24, 96, rng, raw=True)
    ids = np.array([23, 0, 9, 9, 16, 7])
    want = np.empty((6, 96), np.float32)
    legacy.GET_ROWS[int(qtype)](w, ids, want)
    r = repack.repack(w, int(qtype))
    np.testing.assert_array_equal(repack.unpack_rows(r, int(qtype), np.arange(24)), w)
    got = np.empty_like(want)
    repack.GET_ROWS[repack.REPACKED[int(qtype)]](r, ids, got)
    np.testing.assert_array_equal(got.view(np.int32), want.view(np.int32))


def test_only_the_gather_formats_are_repacked():
    assert repack.can_repack(int(T.Q4_K), 3) and not repack.can_repack(int(T.Q2_K), 8)
    assert repack.RECORD_ROWS[repack.REPACKED[int(T.Q6_K)]] == 1
    assert repack.RECORD_ROWS[repack.REPACKED[int(T.Q4_0)]] == 8
