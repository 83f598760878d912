"""sampling.probs (top-k / top-p / min-p / temperature) and the two random primitives.

p is always the target's distribution, q the draft's; here only single rows are warped."""
from __future__ import annotations

import dataclasses

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from specdec.errors import SpecdecError
from specdec.generation.sampling import (GREEDY, NumpyRandom, SamplerParams, probs, probs_rows, sample, softmax,
                              top_prob)

OFF = dict(top_k=0, top_p=1.0, min_p=0.0)


def reference_probs(logits, params: SamplerParams) -> np.ndarray:
    """llama.cpp's chain applied literally, step by step, on a fully sorted candidate list."""
    x = np.asarray(logits, dtype=np.float64)
    out = np.zeros_like(x)
    if params.temperature <= 0:
        out[int(np.argmax(x))] = 1.0
        return out
    cand = sorted(range(len(x)), key=lambda i: (-x[i], i))            # descending, ids ascending
    if 0 < params.top_k < len(x):
        cand = cand[: params.top_k]
    if params.top_p < 1.0:
        e = np.exp(x[cand] - x[cand[0]])
        cum = np.cumsum(e / e.sum())
        m = next((i + 1 for i, c in enumerate(cum) if c >= params.top_p), len(cand))
        cand = cand[:m]
    if params.min_p > 0.0:
        thr = x[cand[0]] + math.log(params.min_p)
        cand = [i for i in cand if x[i] >= thr]
    z = x[cand] / params.temperature
    e = np.exp(z - z.max())
    out[cand] = e / e.sum()
    return out


logit_rows = st.integers(2, 40).flatmap(lambda n: st.lists(
    st.one_of(st.floats(-8, 8, allow_nan=False), st.sampled_from([0.0, 1.0, -1.0])),
    min_size=n, max_size=n)).map(lambda v: np.array(v, dtype=np.float32))

params_st = st.builds(
    SamplerParams,
    temperature=st.one_of(st.just(0.0), st.floats(0.05, 3.0)),
    top_k=st.one_of(st.just(0), st.integers(1, 45)),
    top_p=st.one_of(st.just(1.0), st.just(0.0), st.floats(0.05, 0.999)),
    min_p=st.one_of(st.just(0.0), st.just(1.0), st.floats(0.001, 0.9)))


@settings(max_examples=300, deadline=None)
@given(logit_rows, params_st)
def test_probs_matches_literal_chain(x, params):
    got, want = probs(x, params), reference_probs(x, params)
    assert got.dtype == np.float64 and got.shape == x.shape
    np.testing.assert_array_equal(got > 0, want > 0)
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-15)
    assert abs(got.sum() - 1.0) < 1e-12
    assert got[int(np.argmax(x))] > 0                # the argmax always survives


def test_greedy_is_one_hot_lowest_index_on_ties():
    x = np.array([1.0, 3.0, -2.0, 3.0], dtype=np.float32)
    np.testing.assert_array_equal(probs(x, GREEDY), [0, 1, 0, 0])
    assert sample(x, GREEDY, NumpyRandom(0)) == 1


def test_temperature_only_is_scaled_softmax():
    x = np.array([0.5, -1.0, 2.0, 0.0])
    for t in (0.3, 1.0, 2.5):
        np.testing.assert_allclose(probs(x, SamplerParams(temperature=t, **OFF)), softmax(x / t))


def test_top_k_keeps_k_and_breaks_ties_by_lowest_id():
    x = np.array([1.0, 2.0, 1.0, 1.0, 0.0])
    p = probs(x, SamplerParams(temperature=1.0, top_k=2, top_p=1.0, min_p=0.0))
    assert list(np.flatnonzero(p)) == [0, 1]
    p = probs(x, SamplerParams(temperature=1.0, top_k=3, top_p=1.0, min_p=0.0))
    assert list(np.flatnonzero(p)) == [0, 1, 2]
    for k in (0, 5, 99):                               # disabled / >= V
        assert np.count_nonzero(probs(x, SamplerParams(1.0, k, 1.0, 0.0))) == 5


def test_top_p_keeps_the_token_that_crosses_p():
    x = np.log(np.array([0.5, 0.3, 0.2]))
    support = lambda tp: list(np.flatnonzero(probs(x, SamplerParams(1.0, 0, tp, 0.0))))
    assert support(0.5) == [0]             # cum 0.5 >= 0.5 (approximately: float logs)
    assert support(0.55) == [0, 1]
    assert support(0.81) == [0, 1, 2]
    assert support(1.0) == [0, 1, 2]       # disabled
    assert support(0.0) == [0]             # at least one token


def test_top_p_normalises_over_top_k_survivors():
    # softmax over all: [0.4, 0.3, 0.3]; over the top-2: [4/7, 3/7]
    x = np.log(np.array([0.4, 0.3, 0.3]))
    assert np.count_nonzero(probs(x, SamplerParams(1.0, 0, 0.5, 0.0))) == 2    # 0.4 < 0.5
    assert np.count_nonzero(probs(x, SamplerParams(1.0, 2, 0.5, 0.0))) == 1    # 4/7 >= 0.5


def test_min_p_threshold_is_inclusive_and_relative_to_max():
    x = np.array([0.0, math.log(0.5), math.log(0.49), -np.inf])
    p = probs(x, SamplerParams(1.0, 0, 1.0, 0.5))
    assert list(np.flatnonzero(p)) == [0, 1]
    np.testing.assert_allclose(p[[0, 1]], [2 / 3, 1 / 3])
    assert np.count_nonzero(probs(x, SamplerParams(1.0, 0, 1.0, 1.0))) == 1      # only the max
    assert np.count_nonzero(probs(x, SamplerParams(1.0, 0, 1.0, 0.0))) == 3      # -inf gets 0


def test_temperature_applies_after_the_filters():
    # top-p at temperature 1 keeps two tokens; a huge temperature must not bring the third back
    x = np.log(np.array([0.6, 0.3, 0.1]))
    p = probs(x, SamplerParams(temperature=100.0, top_k=0, top_p=0.85, min_p=0.0))
    assert p[2] == 0.0 and abs(p[0] - p[1]) < 0.01


def test_bad_logits_and_params_are_rejected():
    with pytest.raises(ValueError):
        probs(np.array([0.0, np.nan]), SamplerParams())
    with pytest.raises(ValueError):
        probs(np.array([-np.inf, -np.inf]), SamplerParams())
    for bad in (dict(temperature=-1.0), dict(top_k=-1), dict(top_k=2.5), dict(top_p=1.5),
                dict(top_p=-0.1), dict(min_p=2.0), dict(temperature=float("nan"))):
        with pytest.raises(SpecdecError) as e:
            SamplerParams(**bad)
        assert "\n" not in str(e.value)


def test_sampler_params_frozen_and_defaults():
    p = SamplerParams()
    assert (p.top_k, p.top_p, p.min_p) == (40, 0.95, 0.05)
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.temperature = 1.0  # type: ignore[misc]
    assert SamplerParams(temperature=0.0).greedy and not p.greedy


def test_numpy_random_is_deterministic_and_skips_trivial_draws():
    a, b = NumpyRandom(123), NumpyRandom(123)
    w = np.array([0.2, 0.0, 0.5, 0.3])
    assert [a.categorical(w) for _ in range(50)] == [b.categorical(w) for _ in range(50)]
    state = a.gen.bit_generator.state
    assert a.bernoulli(1.0) is True and a.bernoulli(0.0) is False and a.bernoulli(1.5) is True
    assert a.categorical(np.array([0.0, 0.0, 1.0])) == 2
    assert a.gen.bit_generator.state == state          # nothing consumed
    a.bernoulli(0.5)
    assert a.gen.bit_generator.state != state


def test_numpy_random_frequencies():
    rng = NumpyRandom(np.random.default_rng(7))
    w = np.array([0.1, 0.0, 0.6, 0.3])
    draws = np.array([rng.categorical(w) for _ in range(20000)])
    freq = np.bincount(draws, minlength=4) / draws.size
    assert freq[1] == 0.0
    np.testing.assert_allclose(freq, w, atol=0.015)
    hits = np.mean([rng.bernoulli(0.3) for _ in range(20000)])
    assert abs(hits - 0.3) < 0.015
    with pytest.raises(ValueError):
        rng.categorical(np.zeros(3))


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), m=st.integers(1, 6), v=st.integers(1, 40),
       temperature=st.sampled_from([0.0, 0.7, 1.3]), ties=st.booleans())
def test_probs_rows_equals_probs_row_by_row(seed, m, v, temperature, ties):
    rng = np.random.default_rng(seed)
    logits = rng.standard_normal((m, v)).astype(np.float32)
    if ties:
        logits = np.round(logits)                       # repeated maxima: lowest id wins
    params = SamplerParams(temperature=temperature, top_k=5, top_p=0.9, min_p=0.05)
    rows = probs_rows(logits, params)
    assert np.array_equal(rows, np.stack([probs(r, params) for r in logits]))


def test_probs_rows_rejects_nan():
    with pytest.raises(ValueError):
        probs_rows(np.array([[0.0, np.nan]], np.float32), SamplerParams(temperature=0.0))


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), v=st.integers(1, 300), scale=st.floats(0.01, 30.0))
def test_top_prob_is_the_softmax_maximum(seed, v, scale):
    x = (np.random.default_rng(seed).standard_normal(v) * scale).astype(np.float32)
    assert top_prob(x) == pytest.approx(float(softmax(x).max()), rel=1e-6)
