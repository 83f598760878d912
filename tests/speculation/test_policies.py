"""Draft-length policies (speculation/policies.py): the expected-tokens rule and its argmax,
AdaptiveLength learning acceptance, draft cost and the verify line per key and per position,
stopping a key that cannot pay, construction and its errors, and a policy that asks for too
much or for nothing inside the speculative loop.

p is always the target's distribution, q the draft's.
"""
from __future__ import annotations

import numpy as np
import pytest

from fakes import PAIR_FACTORIES
from specdec.errors import ConfigError
from specdec.generation.plain import generate_plain
from specdec.generation.sampling import GREEDY, NumpyRandom
from specdec.speculation.drafters import ModelDrafter
from specdec.speculation.policies import (AdaptiveLength, DraftPolicy, FixedLength, StepFeedback, Threshold,
                                          best_n, best_n_by_position, expected_tokens, make_policy)
from specdec.speculation.speculative import generate_speculative
from specdec.speculation.underload import LoadCappedPolicy


def test_expected_tokens_and_best_n():
    assert expected_tokens(0.0, 5) == 1.0 and expected_tokens(1.0, 5) == 6.0
    assert expected_tokens(0.5, 2) == pytest.approx(1 + 0.5 + 0.25)
    for alpha in (0.1, 0.5, 0.8, 0.95, 1.0):
        for d, b in ((0.0, 0.0), (0.05, 0.02), (0.3, 0.1), (1.0, 0.0)):
            rates = [expected_tokens(alpha, n) / (n * d + 1.0 + b * n) for n in range(1, 17)]
            assert rates[best_n(alpha, d, 1.0, b, 1, 16) - 1] >= max(rates) * (1 - 1e-9)
    ns = [best_n(a, 0.1, 1.0, 0.05, 1, 16) for a in (0.2, 0.5, 0.7, 0.8, 0.9, 0.95)]
    assert ns == sorted(ns) and ns[0] == 1 and ns[-1] > 5          # better drafts, longer
    ns = [best_n(0.8, c, 1.0, 0.0, 1, 16) for c in (0.0, 0.05, 0.2, 0.5)]
    assert ns == sorted(ns, reverse=True) and ns[0] == 16          # dearer drafts, shorter


def feed(policy, source, alpha, c, growth, steps, rng):
    """Report `steps` synthetic steps: acceptance alpha, draft c per token, verify 1 + growth*n."""
    for _ in range(steps):
        n = policy.next_n()
        acc = 0
        while acc < n and rng.random() < alpha:
            acc += 1
        policy.observe(StepFeedback(source, n, n, min(n, acc + 1), acc, c * n, 1.0 + growth * n))


def test_adaptive_length_learns_alpha_costs_and_sources():
    rng = np.random.default_rng(0)
    pol = AdaptiveLength(n_max=16)
    assert pol.next_n() == 4                                      # n_init before any data
    feed(pol, "model", 0.3, 0.4, 0.05, 200, rng)
    assert pol.next_n() == 1
    feed(pol, "prompt-lookup", 0.97, 0.0, 0.05, 200, rng)
    assert pol.next_n() == 16                                     # the last source drove it
    est = pol.estimates()
    assert est["model"]["alpha"] < 0.5 < 0.9 < est["prompt-lookup"]["alpha"]
    assert est["model"]["c"] == pytest.approx(0.4, rel=0.1)
    # one verify line for every source (the pass is the target's); n = 16 throughout the
    # recent steps: the prior slope
    assert est["prompt-lookup"]["growth"] == est["model"]["growth"] == pytest.approx(pol.growth_prior, rel=0.1)
    pol.reset()
    assert pol.next_n() == 4 and pol.estimates() == {}


def test_adaptive_length_fits_verify_growth_when_n_varies():
    pol = AdaptiveLength(n_max=16)
    for i in range(60):
        n = i % 9
        pol.observe(StepFeedback("model", n, n, n, n, 0.25 * n, 0.5 * (1.0 + 0.2 * n)))
    est = pol.estimates()["model"]
    assert est["growth"] == pytest.approx(0.2, rel=0.1) and est["verify_a_s"] == pytest.approx(0.5, rel=0.05)
    assert est["c"] == pytest.approx(0.5, rel=0.05) and est["alpha"] > 0.99


def test_adaptive_length_stops_a_source_that_cannot_pay():
    """stop_after: once a key has that many verified positions, n = 0 when no length pays
    (here alpha 0.5 at a draft cost of 0.4 and a growth of 0.35 per row), and it stays 0;
    a source that pays keeps drafting; without stop_after n never goes below n_min."""
    rng = np.random.default_rng(1)
    for stop_after, want in ((24, 0), (None, 1)):
        pol = AdaptiveLength(n_max=8, growth_prior=0.35, stop_after=stop_after)
        feed(pol, "model", 0.5, 0.4, 0.35, 40, rng)
        assert pol.next_n() == want
    pol = AdaptiveLength(n_max=8, growth_prior=0.35, stop_after=24)
    feed(pol, "model", 0.95, 0.2, 0.35, 40, rng)
    assert pol.next_n() >= 2
    feed(pol, "prompt-lookup", 0.2, 0.0, 0.35, 40, rng)
    assert pol.next_n() == 0
    pol.prepare("model")
    assert pol.next_n() >= 2                                      # per key
    with pytest.raises(ConfigError):
        AdaptiveLength(stop_after=0)
    with pytest.raises(ConfigError):
        AdaptiveLength(p_min=1.5)
    assert AdaptiveLength(p_min=0.7).p_min == 0.7 and AdaptiveLength().p_min == 0.0


def test_defaults_take_this_hosts_verify_growth():
    from specdec.speculation import calibration
    from specdec.api.request import AUTO_STOP_AFTER, DraftOptions
    pol = DraftOptions(kind="prompt-lookup").length_policy()
    assert pol.growth_prior == calibration.prior().growth          # this host's table (the tests pin it)
    assert pol.stop_after == AUTO_STOP_AFTER and pol.n_min == 1
    assert make_policy("adaptive", 8).stop_after is None
    lines = [DraftOptions(kind="prompt-lookup", **kw).describe() for kw in
             ({}, {"n": 5}, {"n": 3, "policy": "fixed"}, {"n": 6, "policy": "adaptive"})]
    assert lines == ["prompt-lookup, adaptive 0..8 (defaults)", "prompt-lookup, up to 5, p >= 0.9",
                     "prompt-lookup, fixed 3", "prompt-lookup, adaptive 1..6"]


def test_adaptive_length_pools_the_verify_line_over_sources():
    """Model steps of n = 1 and lookup steps of n = 8, each source alone with no spread in
    n: pooled, their passes fit the true growth (0.35 here) against a prior of 0.05."""
    pol = AdaptiveLength(n_max=8)
    for i in range(60):
        src, n = ("model", 1) if i % 2 else ("prompt-lookup", 8)
        pol.observe(StepFeedback(src, n, n, n, n, 0.1 * n if src == "model" else 0.0,
                                 0.04 * (1.0 + 0.35 * n)))
    est = pol.estimates()
    assert est["model"]["growth"] == est["prompt-lookup"]["growth"] == pytest.approx(0.35, rel=0.15)


def test_policy_construction_and_errors():
    assert isinstance(make_policy("fixed", 3), FixedLength) and make_policy("fixed", 3).p_min == 0
    t = make_policy("threshold", 6, 0.7)
    assert (t.n_max, t.p_min, t.next_n()) == (6, 0.7, 6)
    a = make_policy("adaptive", 12)
    assert isinstance(a, AdaptiveLength) and a.n_max == 12
    assert make_policy(a) is a
    for bad in (lambda: make_policy("greedy"), lambda: FixedLength(0), lambda: FixedLength(17),
                lambda: Threshold(4, 1.5), lambda: AdaptiveLength(n_max=4, n_min=5)):
        with pytest.raises(ConfigError) as e:
            bad()
        assert "\n" not in str(e.value)


def test_policy_asking_too_much_or_nothing():
    target, draft = PAIR_FACTORIES["fake"](8, 1, "good")

    class Rogue(FixedLength):
        def next_n(self):
            return 5

    with pytest.raises(ValueError):
        generate_speculative(target, ModelDrafter(draft, GREEDY), [1], 5, GREEDY, NumpyRandom(0),
                             set(), policy=Rogue(3))
    zero = AdaptiveLength(n_max=4, n_min=0, n_init=0)             # never drafts: plain decoding
    res = generate_speculative(target, ModelDrafter(draft, GREEDY), [1, 2], 10, GREEDY,
                               NumpyRandom(0), set(), policy=zero)
    assert res.ids == generate_plain(target, [1, 2], 10, GREEDY, NumpyRandom(0), set()).ids
    assert res.stats.n_drafted == 0 and res.stats.by_drafter == {}


def test_adaptive_length_by_key_and_by_position():
    """prepare(key) selects the key's estimates; per-position rates see bursty runs."""
    pol = AdaptiveLength(n_max=16)
    rng = np.random.default_rng(1)
    for _ in range(120):
        for key, alpha in (("prompt-lookup/16+", 0.98), ("prompt-lookup/1-2", 0.25)):
            pol.prepare(key)
            n = pol.next_n()
            acc = 0
            while acc < n and rng.random() < alpha:
                acc += 1
            pol.observe(StepFeedback("prompt-lookup", n, n, min(n, acc + 1), acc, 1e-4,
                                     1.0 + 0.15 * n, key))
    pol.prepare("prompt-lookup/16+")
    assert pol.next_n() >= 12
    pol.prepare("prompt-lookup/1-2")
    assert pol.next_n() <= 2
    # all-or-nothing runs: past the first position nothing fails, so draft all 16
    assert best_n_by_position([0.5] + [1.0] * 15, 0.0, 1.0, 0.1, 1, 16) == 16
    # runs that end after 3: stop there (an i.i.d. rate cannot say where)
    assert best_n_by_position([0.9] * 3 + [0.05] * 13, 0.0, 1.0, 0.1, 1, 16) == 3
    assert best_n_by_position([0.7] * 16, 0.02, 1.0, 0.1, 1, 16) == best_n(0.7, 0.02, 1.0, 0.1, 1, 16)


def test_every_policy_has_a_reason_and_a_capped_one_passes_its_own_on():
    """The trace's `plan` reads policy.reason: '' unless the policy says why."""
    assert DraftPolicy.reason == "" and FixedLength(3).reason == "" and AdaptiveLength().reason == ""
    inner = FixedLength(3)
    inner.reason = "because"
    assert LoadCappedPolicy(inner, lambda key: None, lambda: None).reason == "because"
