"""Speculative decoding: the acceptance rule, exactness of the output law, and bookkeeping.

p is always the target's distribution, q the draft's.  Sessions come from the pair factories
of fakes.PAIR_FACTORIES: every test parametrized with `factory` runs on each of them.
"""
from __future__ import annotations

import math
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import specdec.speculation.speculative as speculative
from fakes import PAIR_FACTORIES, RELATIONS, FakeSession, PathRng, enumerate_outcomes
from helpers import ListTrace, factories, sampling_params, target_law
from specdec.speculation.drafters import ModelDrafter
from specdec.errors import SpecdecError
from specdec.generation.plain import generate_plain
from specdec.generation.sampling import GREEDY, NumpyRandom, SamplerParams
from specdec.speculation.speculative import generate_speculative
from specdec.frontends.report import load_trace
from specdec.speculation.trace import JsonlTrace, StepRecord
from specdec.speculation.verify import DraftProbabilityError, VerifyResult, alphas, overlap, residual, verify

# the same, with every factory but the first marked slow (sampling-heavy tests)
factories_slow_tail = pytest.mark.parametrize("factory", [
    pytest.param(f, id=name, marks=[pytest.mark.slow] if i else [])
    for i, (name, f) in enumerate(PAIR_FACTORIES.items())])


class AlwaysReject:
    def bernoulli(self, prob):
        return False

    def categorical(self, probs):
        return int(np.argmax(probs))


def dist(v):
    v = np.asarray(v, dtype=np.float64)
    return v / v.sum()


# ---- verify(): the rule itself -------------------------------------------------------------

prob_rows = st.integers(2, 6).flatmap(lambda n: st.tuples(
    *[st.lists(st.one_of(st.just(0.0), st.floats(0.01, 1.0)), min_size=n, max_size=n)
      .filter(lambda r: sum(r) > 0) for _ in range(3)]))


@settings(max_examples=150, deadline=None)
@given(prob_rows)
def test_verify_emits_exactly_p_whatever_q(rows):
    """x ~ q, then verify: the emitted token has law p, acceptance has probability 1 - TV(p, q)."""
    p0, q0, p1 = (dist(r) for r in rows)

    def run(rng):
        x = rng.categorical(q0)
        res = verify([x], q0[None], np.stack([p0, p1]), rng)
        return (x if res.n_accepted else res.next_token, res.n_accepted)

    law = enumerate_outcomes(run)
    first = Counter()
    for (tok, _acc), pr in law.items():
        first[tok] += pr
    for y in range(len(p0)):
        assert abs(first[y] - p0[y]) < 1e-12
    p_acc = sum(pr for (_, acc), pr in law.items() if acc)
    assert abs(p_acc - overlap(p0, q0)) < 1e-12


def test_verify_greedy_is_argmax_matching_without_randomness():
    V = 5
    one_hot = lambda ids: np.eye(V)[ids]
    p = one_hot([2, 4, 1, 3])                                 # (n+1, V) target argmaxes
    for drafted, n_acc, nxt, kind in [([2, 4, 1], 3, 3, "bonus"), ([2, 0, 1], 1, 4, "correction"),
                                      ([0, 4, 1], 0, 2, "correction"), ([], 0, 2, "bonus")]:
        rng = PathRng([])
        q = one_hot(drafted).reshape(len(drafted), V)
        res = verify(drafted, q, p[: len(drafted) + 1], rng)
        assert (res.n_accepted, res.next_token, res.kind) == (n_acc, nxt, kind)
        assert rng.taken == []                                # no decision was random


def test_verify_records_and_alpha():
    p = np.array([[0.5, 0.5, 0.0], [0.2, 0.3, 0.5], [1.0, 0.0, 0.0]])
    q = np.array([[0.25, 0.75, 0.0], [0.2, 0.3, 0.5]])
    res = verify([1, 2], q, p, AlwaysReject())
    assert (res.n_accepted, res.kind, res.next_token) == (0, "correction", 0)   # residual: [1, 0, 0]
    r = res.records[0]
    assert (r.token, r.q_x, r.p_x, r.accepted) == (1, 0.75, 0.5, False)
    assert r.ratio == pytest.approx(2 / 3) and r.accept_prob == pytest.approx(2 / 3)
    assert len(res.records) == 1 and res.alpha == pytest.approx((0.75, 1.0))


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), n=st.integers(1, 5), v=st.integers(2, 12))
def test_alphas_shortcut_equals_overlap(seed, n, v):
    """One-hot q rows take the min(1, p(x)) shortcut; it must equal the full overlap."""
    rng = np.random.default_rng(seed)
    p = rng.dirichlet(np.ones(v), n + 1)
    q = rng.dirichlet(np.ones(v), n)
    tokens = rng.integers(0, v, n)
    one_hot = rng.random(n) < 0.5
    q[one_hot] = 0.0
    q[np.flatnonzero(one_hot), tokens[one_hot]] = 1.0
    p[0] = 0.0
    p[0, tokens[0]] = 1.0                                     # p one-hot on x as well
    assert alphas(p, q, tokens) == pytest.approx(tuple(overlap(p[:n], q)), abs=1e-12)


def test_verify_degenerate_residual_and_bad_inputs():
    p = dist([1, 2, 3])
    np.testing.assert_array_equal(residual(p, p), p)                # max(0, p - q) == 0
    res = verify([1], p[None], np.stack([p, p]), AlwaysReject())    # only a broken rng rejects here
    assert res.kind == "correction" and res.next_token == 2
    with pytest.raises(DraftProbabilityError):
        verify([0], np.array([[0.0, 1.0, 0.0]]), np.stack([p, p]), AlwaysReject())
    with pytest.raises(ValueError):
        verify([0, 1], p[None], np.stack([p, p]), AlwaysReject())
    res = verify([], np.zeros((0, 3)), p[None], PathRng([2]))       # empty draft: bonus from p_0
    assert (res.n_accepted, res.kind, res.next_token, res.records) == (0, "bonus", 2, ())


# ---- (a) greedy speculative == greedy plain --------------------------------------------------

@factories
@settings(max_examples=12, deadline=None)
@given(seed=st.integers(0, 2**20), prompt=st.lists(st.integers(0, 23), min_size=1, max_size=8),
       relation=st.sampled_from(RELATIONS), draft_p=st.sampled_from([0.0, 0.3, 0.9]),
       use_eog=st.booleans())
def test_greedy_speculative_equals_greedy_plain(factory, seed, prompt, relation, draft_p, use_eog):
    target, draft = factory(24, seed, relation)
    eog = {23} if use_eog else set()
    want = generate_plain(target, prompt, 20, GREEDY, NumpyRandom(0), eog)
    drafter = ModelDrafter(draft, GREEDY, draft_p)
    for draft_n in range(1, 17):
        got = generate_speculative(target, drafter, prompt, 20, GREEDY, NumpyRandom(draft_n), eog,
                                   draft_n=draft_n)
        assert got.ids == want.ids and got.stop_reason == want.stop_reason
        if relation == "identical" and draft_p == 0.0:
            assert got.stats.n_accepted == got.stats.n_drafted


@factories
def test_greedy_equal_when_context_fills(factory):
    for n_ctx in (6, 9, 13):
        target, draft = factory(24, 5, "good", n_ctx=n_ctx)
        want = generate_plain(target, [1, 2, 3, 4], 50, GREEDY, NumpyRandom(0), set())
        for draft_n in (1, 4, 16):
            got = generate_speculative(target, ModelDrafter(draft, GREEDY), [1, 2, 3, 4], 50,
                                       GREEDY, NumpyRandom(0), set(), draft_n=draft_n)
            assert got.ids == want.ids and got.stop_reason == want.stop_reason == "ctx_full"


# ---- (c) the exact output law -----------------------------------------------------------------

@factories
@settings(max_examples=150, deadline=None)
@given(seed=st.integers(0, 2**20), n_vocab=st.integers(3, 5), data=st.data(),
       n_predict=st.integers(2, 3), draft_n=st.integers(1, 3), relation=st.sampled_from(RELATIONS),
       params=sampling_params, draft_p=st.sampled_from([0.0, 0.0, 0.5]), use_eog=st.booleans())
def test_exact_output_law(factory, seed, n_vocab, data, n_predict, draft_n, relation, params,
                          draft_p, use_eog):
    prompt = data.draw(st.lists(st.integers(0, n_vocab - 1), min_size=1, max_size=3))
    target, draft = factory(n_vocab, seed, relation)
    eog = {0} if use_eog else set()
    drafter = ModelDrafter(draft, params, draft_p)

    def run(rng):
        res = generate_speculative(target, drafter, prompt, n_predict, params, rng, eog, draft_n)
        return tuple(res.ids), res.stop_reason

    got, want = enumerate_outcomes(run), target_law(target, prompt, n_predict, params, eog)
    assert abs(sum(got.values()) - 1.0) < 1e-12
    for key in set(got) | set(want):
        assert abs(got.get(key, 0.0) - want.get(key, 0.0)) < 1e-9, key


@factories
def test_exact_output_law_longer(factory):
    """One deeper case: 4 tokens, drafts of up to 3, a bad drafter, all filters on."""
    params = SamplerParams(temperature=1.1, top_k=3, top_p=0.95, min_p=0.05)
    target, draft = factory(3, 11, "bad")
    drafter = ModelDrafter(draft, params)

    def run(rng):
        return tuple(generate_speculative(target, drafter, [1], 4, params, rng, set(), 3).ids)

    got = enumerate_outcomes(run)
    want = {k[0]: v for k, v in target_law(target, [1], 4, params, set()).items()}
    assert set(got) == set(want)
    assert max(abs(got[k] - want[k]) for k in want) < 1e-9


# ---- (d) chi-square: sampled speculative vs sampled plain --------------------------------------

def chi2_sf(x: float, df: int) -> float:
    """P(X >= x) for X ~ chi2(df): the regularized upper incomplete gamma Q(df/2, x/2)."""
    a, x = df / 2.0, x / 2.0
    if x <= 0:
        return 1.0
    log_front = -x + a * math.log(x) - math.lgamma(a)
    if x < a + 1:                                    # series for P(a, x)
        term = total = 1.0 / a
        for n in range(1, 1000):
            term *= x / (a + n)
            total += term
            if term < total * 1e-15:
                break
        return max(0.0, 1.0 - total * math.exp(log_front))
    b, c, d = x + 1 - a, 1e300, 1.0 / (x + 1 - a)    # Lentz continued fraction for Q(a, x)
    h = d
    for i in range(1, 1000):
        an = -i * (i - a)
        b += 2
        d = an * d + b
        d = 1.0 / (d if abs(d) > 1e-300 else 1e-300)
        c = b + an / c
        c = c if abs(c) > 1e-300 else 1e-300
        h *= d * c
        if abs(d * c - 1) < 1e-15:
            break
    return math.exp(log_front) * h


def test_chi2_sf_known_values():
    assert chi2_sf(5.0, 2) == pytest.approx(math.exp(-2.5), rel=1e-12)
    assert chi2_sf(3.841458820694124, 1) == pytest.approx(0.05, rel=1e-9)
    assert chi2_sf(23.209251158954356, 10) == pytest.approx(0.01, rel=1e-9)
    assert chi2_sf(1.0, 30) == pytest.approx(1.0, abs=1e-12)


def two_sample_p_value(a: Counter, b: Counter) -> float:
    """Chi-square test of homogeneity, cells with fewer than 10 pooled counts merged."""
    keys = sorted(set(a) | set(b), key=lambda k: a[k] + b[k])
    table, pool = [], [0, 0]
    for k in keys:
        pool = [pool[0] + a[k], pool[1] + b[k]]
        if sum(pool) >= 10:
            table.append(pool)
            pool = [0, 0]
    if sum(pool):
        table[-1] = [table[-1][0] + pool[0], table[-1][1] + pool[1]]
    t = np.array(table, dtype=np.float64)                       # (cells, 2)
    expected = t.sum(1, keepdims=True) * t.sum(0, keepdims=True) / t.sum()
    stat = ((t - expected) ** 2 / expected).sum()
    return chi2_sf(stat, len(t) - 1)


def sample_runs(gen, n_runs, seed):
    rng = NumpyRandom(seed)
    return Counter(tuple(gen(rng).ids) for _ in range(n_runs))


def always_accept(draft_tokens, q, p, rng):
    n = len(draft_tokens)
    return VerifyResult(n, int(rng.categorical(p[n])), "bonus", (), tuple(overlap(p[:n], q)))


@factories_slow_tail
def test_chi_square_speculative_vs_plain(factory, monkeypatch):
    params = SamplerParams(temperature=1.3, top_k=0, top_p=1.0, min_p=0.0)
    target, draft = factory(3, 2024, "bad")
    drafter, prompt = ModelDrafter(draft, params), [0, 1]
    spec = lambda rng: generate_speculative(target, drafter, prompt, 3, params, rng, set(), 4)
    plain = sample_runs(lambda rng: generate_plain(target, prompt, 3, params, rng, set()), 3000, 1)
    assert two_sample_p_value(sample_runs(spec, 3000, 2), plain) > 1e-3
    monkeypatch.setattr(speculative, "verify", always_accept)
    assert two_sample_p_value(sample_runs(spec, 3000, 3), plain) < 1e-3


# ---- bookkeeping: stats, caps, eog, caches, trace ----------------------------------------------

@factories
@settings(max_examples=10, deadline=None)
@given(seed=st.integers(0, 2**20), relation=st.sampled_from(RELATIONS), draft_n=st.integers(1, 8),
       draft_p=st.sampled_from([0.0, 0.3]), prompt_len=st.integers(1, 6))
def test_stats_caches_and_trace_agree(factory, seed, relation, draft_n, draft_p, prompt_len):
    params = SamplerParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0)
    target, draft = factory(16, seed, relation)
    prompt = list(range(prompt_len))
    out: list[int] = []

    def check(rec: StepRecord):
        # target: accepted context minus its last token; draft: a prefix of the accepted context
        ctx = prompt + out + list(rec.drafted[: rec.n_accepted]) + [rec.next_token]
        assert rec.n_context == len(prompt) + len(out)
        assert target.tokens == ctx[:-1]
        assert draft.tokens == ctx[: len(draft.tokens)]
        out.extend(rec.emitted)

    sink = ListTrace(check)
    kinds = []
    res = generate_speculative(target, ModelDrafter(draft, params, draft_p), prompt, 40, params,
                               NumpyRandom(seed), set(), draft_n,
                               on_token=lambda t, k: kinds.append((t, k)), trace=sink)
    s, recs = res.stats, sink.records
    assert res.ids == out == [t for t, _ in kinds] and s.n_generated == len(res.ids) == 40
    assert s.n_steps == len(recs) == target.n_evals - (prompt_len > 1)
    assert s.n_drafted == sum(len(r.drafted) for r in recs)
    assert s.n_accepted == sum(r.n_accepted for r in recs)
    assert [k for _, k in kinds].count("accepted") == s.n_accepted
    assert s.n_generated == s.n_accepted + s.n_steps                      # no eog here
    assert s.tokens_per_step == pytest.approx(s.n_generated / s.n_steps)
    assert s.acceptance_rate == pytest.approx(s.n_accepted / s.n_drafted if s.n_drafted else 0.0)
    assert len(s.acceptance_by_position) == draft_n
    for j, rate in enumerate(s.acceptance_by_position):
        reached = [r.accepted[j] for r in recs if len(r.accepted) > j and r.accepted[j] is not None]
        assert rate == (pytest.approx(sum(reached) / len(reached)) if reached else None)
    assert s.measured_acceptance == pytest.approx(s.n_accepted / s.n_verified if s.n_verified else 0)
    if relation == "identical":
        assert s.n_accepted == s.n_drafted and s.predicted_acceptance in (0.0, pytest.approx(1.0))


@factories
def test_predicted_acceptance_matches_measured(factory):
    params = SamplerParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0)
    target, draft = factory(16, 3, "good", n_ctx=2048)
    s = generate_speculative(target, ModelDrafter(draft, params), [1], 1500, params,
                             NumpyRandom(9), set(), 4).stats
    se = math.sqrt(0.25 / s.n_verified)
    assert 0.1 < s.measured_acceptance < 0.95
    assert abs(s.predicted_acceptance - s.measured_acceptance) < 4 * se


@factories
def test_n_predict_is_never_exceeded(factory):
    target, draft = factory(16, 1, "identical")
    params = SamplerParams(temperature=1.0)

    class Spy(ModelDrafter):
        def propose(self, ctx, n_max, rng):
            assert 1 <= n_max <= min(draft_n, remaining[0] - 1)
            return super().propose(ctx, n_max, rng)

    for n_predict in range(0, 7):
        for draft_n in (1, 2, 5, 16):
            remaining = [n_predict]

            def on_token(t, k):
                remaining[0] -= 1
            res = generate_speculative(target, Spy(draft, params), [3], n_predict, params,
                                       NumpyRandom(n_predict), set(), draft_n, on_token=on_token)
            assert len(res.ids) == n_predict and remaining == [0] and res.stop_reason == "n_predict"


@factories
def test_eog_stops_and_nothing_after_it_is_emitted(factory):
    params = SamplerParams(temperature=1.5, top_k=0, top_p=1.0, min_p=0.0)
    target, draft = factory(6, 8, "identical")
    drafter = ModelDrafter(draft, params)
    seen_mid_step = False
    for seed in range(40):
        sink, kinds = ListTrace(), []
        res = generate_speculative(target, drafter, [1], 30, params, NumpyRandom(seed), {5}, 8,
                                   on_token=lambda t, k: kinds.append(t), trace=sink)
        assert 5 not in res.ids and kinds == res.ids
        if res.stop_reason == "eog":
            last = sink.records[-1]
            new = [*last.drafted[: last.n_accepted], last.next_token]
            assert last.eog and list(last.emitted) == new[: new.index(5)]
            seen_mid_step |= 5 in last.drafted[: last.n_accepted]
    assert seen_mid_step                              # some run met eog among accepted drafts


@factories
def test_plain_generation(factory):
    target, _ = factory(8, 3, "good")
    params = SamplerParams(temperature=1.2, top_k=0, top_p=1.0, min_p=0.0)
    assert generate_plain(target, [1, 2], 0, params, NumpyRandom(0), set()).ids == []
    for seed in range(20):
        kinds = []
        res = generate_plain(target, [1, 2, 3], 12, params, NumpyRandom(seed), {7},
                             on_token=lambda t, k: kinds.append((t, k)))
        assert 7 not in res.ids and kinds == [(t, "sampled") for t in res.ids]
        assert res.stop_reason == ("eog" if len(res.ids) < 12 else "n_predict")
        assert target.tokens[:3] == [1, 2, 3] and target.tokens[3:] == res.ids[: len(target.tokens) - 3]
        assert res.n_prompt == 3 and res.stats is None
        assert res.timings.tokens_per_s == pytest.approx(len(res.ids) / res.timings.decode_s)
    target.n_evals = 0
    res = generate_plain(target, [1, 2, 3], 12, params, NumpyRandom(1), set())
    assert target.n_evals == len(res.ids) == 12 and target.n_past == 3 + 11   # prompt in one batch


@factories
def test_no_state_leaks_between_requests(factory):
    params = SamplerParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0)
    target, draft = factory(16, 4, "good")
    drafter = ModelDrafter(draft, params)
    run = lambda prompt, seed: generate_speculative(target, drafter, prompt, 20, params,
                                                    NumpyRandom(seed), set(), 5).ids
    first = run([1, 2, 3], 0)
    run([7, 7, 2, 9, 9, 1], 1)                              # a different request in between
    assert run([1, 2, 3], 0) == first
    fresh_target, fresh_draft = factory(16, 4, "good")
    assert generate_speculative(fresh_target, ModelDrafter(fresh_draft, params), [1, 2, 3], 20,
                                params, NumpyRandom(0), set(), 5).ids == first


def test_draft_catch_up_is_one_batched_eval():
    target, draft = PAIR_FACTORIES["fake"](16, 6, "good")
    sizes: list[int] = []
    orig = draft.eval
    draft.eval = lambda toks, last_only=False: (sizes.append(len(toks)), orig(toks, last_only))[1]
    params = SamplerParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0)
    res = generate_speculative(target, ModelDrafter(draft, params), [1, 2, 3, 4, 5], 60, params,
                               NumpyRandom(1), set(), 4)
    # the prompt but its last id in the prompt phase (prefill), that id at the first proposal,
    # then each catch-up (a correction or bonus, and an accepted last draft) in one eval
    assert sizes[:2] == [4, 1] and max(sizes[2:]) == 2 and res.stats.n_steps > 5
    s = res.stats                    # every context token once, plus rejected drafts at most once
    assert draft.n_rows <= 5 + len(res.ids) + s.n_drafted - s.n_accepted


def test_drafter_confidence_threshold():
    target, draft = PAIR_FACTORIES["fake"](16, 6, "good")
    params = SamplerParams(temperature=0.0)
    res = generate_speculative(target, ModelDrafter(draft, params, draft_p=1.0), [1], 10, params,
                               NumpyRandom(0), set(), 5)
    assert res.stats.n_drafted == 0 and res.stats.n_steps == 10     # never confident enough


def test_trace_round_trip(tmp_path):
    target, draft = PAIR_FACTORIES["fake"](8, 2, "good")
    params = SamplerParams(temperature=0.9, top_k=5, top_p=0.9, min_p=0.05)
    mem = ListTrace()
    generate_speculative(target, ModelDrafter(draft, params), [1, 2], 25, params, NumpyRandom(3),
                         {7}, 4, trace=mem)
    path = tmp_path / "trace.jsonl"
    with JsonlTrace(path) as sink:
        for r in mem.records:
            sink.write(r)
    assert load_trace(path) == mem.records and len(mem.records) > 1
    r = mem.records[0]
    assert len(r.q_x) == len(r.p_x) == len(r.ratio) == len(r.alpha) == len(r.drafted)
    assert r.step == 0 and r.n_context == 2
    doc = (Path(__file__).parents[2] / "docs" / "trace-format.md").read_text()
    for name in StepRecord.__dataclass_fields__:
        assert f"`{name}`" in doc, name


def test_one_line_config_errors():
    target, draft = PAIR_FACTORIES["fake"](8, 2, "good")
    drafter = ModelDrafter(draft, GREEDY)
    for draft_n in (0, 17, 2.5, -1):
        with pytest.raises(SpecdecError) as e:
            generate_speculative(target, drafter, [1], 5, GREEDY, NumpyRandom(0), set(), draft_n)
        assert "\n" not in str(e.value)
    for draft_p in (-0.1, 1.5):
        with pytest.raises(SpecdecError):
            ModelDrafter(draft, GREEDY, draft_p)
    with pytest.raises(SpecdecError):
        generate_speculative(target, drafter, [], 5, GREEDY, NumpyRandom(0), set())
    with pytest.raises(SpecdecError):
        generate_speculative(target, ModelDrafter(FakeSession(9, lambda c: np.zeros(9, np.float32)),
                                                  GREEDY), [1], 5, GREEDY, NumpyRandom(0), set())
