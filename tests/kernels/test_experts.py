"""The mixture-of-experts kernels (kernels/experts.py) against their NumPy statements
(reference.moe_route, reference.moe_ffn) bit for bit, and row independence: a row's output is
the same bits whichever rows share its pass, although each pass groups its rows by expert
differently."""
from __future__ import annotations

import gguf
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from specdec import kernels
from specdec.kernels import experts, reference
from specdec.kernels.ops import swiglu
from helpers import F16_FIELDS, assert_rows_independent, make_weights, random_weights

T = gguf.GGMLQuantizationType
QTYPES = (T.F32, T.Q8_0, T.Q4_K, T.Q5_K, T.Q6_K, T.MXFP4)     # MXFP4: gpt-oss's experts
D, F = 256, 256


def _stack(qt, n_expert: int, n: int, k: int, rng) -> np.ndarray:
    """(E, n, ·) stacked expert weights of type qt, as the file's 3-D tensor reads."""
    if qt in F16_FIELDS:
        return random_weights(rng, qt, n_expert * n, k // 256).reshape(n_expert, n, -1)
    return make_weights(qt, n_expert * n, k, rng, raw=False).reshape(n_expert, n, -1)


def _layer(qt, n_expert: int, rng):
    return (_stack(qt, n_expert, F, D, rng), _stack(qt, n_expert, F, D, rng),
            _stack(qt, n_expert, D, F, rng), (int(qt),) * 3)


@settings(max_examples=40, deadline=None)
@given(m=st.integers(1, 9), e=st.integers(2, 16), data=st.data(), norm=st.booleans(),
       scale=st.sampled_from([1.0, 2.5]), seed=st.integers(0, 2**16))
def test_route_is_its_numpy_statement(m, e, data, norm, scale, seed):
    k = data.draw(st.integers(1, e))
    rng = np.random.default_rng(seed)
    logits = (rng.standard_normal((m, e)) * 3).astype(np.float32)
    logits[:, -1] = logits[:, 0]                                  # a tie: the lower id first
    ids, w = experts.route(logits, k, norm, scale)
    rid, rw = reference.moe_route(logits, k, norm, scale)
    assert np.array_equal(ids, rid) and np.array_equal(w.view(np.uint32), rw.view(np.uint32))
    if norm and scale == 1.0:
        assert np.allclose(w.sum(1), 1.0, atol=1e-6)


@pytest.mark.parametrize("qt", QTYPES, ids=lambda q: q.name)
def test_grouped_experts_equal_one_row_at_a_time(qt):
    rng = np.random.default_rng(int(qt))
    gate, up, down, qts = _layer(qt, 6, rng)
    x = rng.standard_normal((13, D)).astype(np.float32)
    ids, w = experts.route(rng.standard_normal((13, 6)).astype(np.float32), 2, True, 1.0)
    got = experts.expert_ffn(gate, up, down, qts, x, ids, w)
    want = reference.moe_ffn(kernels.matmul, swiglu, gate, up, down, qts, x, ids, w)
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))


def test_groups_cover_every_row_and_slot_once():
    ids = np.array([[3, 1], [1, 0], [3, 2], [0, 3]])
    ex, starts, pairs = experts.groups(ids, 5)
    assert ex.tolist() == [0, 1, 2, 3]
    assert sorted(pairs.tolist()) == list(range(8))
    for g, e in enumerate(ex):
        assert (ids.ravel()[pairs[starts[g]:starts[g + 1]]] == e).all()


@pytest.mark.parametrize("qt", (T.Q8_0, T.Q4_K), ids=lambda q: q.name)
def test_moe_rows_are_independent(qt):
    """The router, the grouping and the experts together: helpers.assert_rows_independent."""
    rng = np.random.default_rng(7)
    gate, up, down, qts = _layer(qt, 8, rng)
    router = (rng.standard_normal((8, D)) / 16).astype(np.float32)

    def moe(_w, x, out):
        ids, w = experts.route(kernels.matmul(router, int(T.F32), x), 3, True, 1.0)
        out[:] = experts.expert_ffn(gate, up, down, qts, x, ids, w)

    x = rng.standard_normal((24, D)).astype(np.float32)
    assert_rows_independent(moe, np.empty((D, 1)), x, rng)


@pytest.mark.parametrize("qt", (T.Q4_K, T.Q5_K, T.Q6_K), ids=lambda q: q.name)
def test_one_row_in_one_region_equals_one_row_at_a_time(qt):
    """Decoding's path (experts.ONE_ROW: the k experts of a row in one parallel region):
    the same bits as the kernels called one expert at a time, and as that row in a pass."""
    rng = np.random.default_rng(int(qt) + 100)
    gate, up, down, qts = _layer(qt, 8, rng)
    x = rng.standard_normal((5, D)).astype(np.float32)
    ids, w = experts.route(rng.standard_normal((5, 8)).astype(np.float32), 3, True, 1.0)
    batch = experts.expert_ffn(gate, up, down, qts, x, ids, w)
    for m in range(5):
        one = experts.expert_ffn(gate, up, down, qts, x[m:m + 1], ids[m:m + 1], w[m:m + 1])
        want = reference.moe_ffn(kernels.matmul, swiglu, gate, up, down, qts, x[m:m + 1], ids[m:m + 1], w[m:m + 1])
        assert np.array_equal(one.view(np.uint32), want.view(np.uint32))
        assert np.array_equal(one[0].view(np.uint32), batch[m].view(np.uint32))
