"""Drafters other than a model (prompt lookup, hybrid), alone and under the draft-length
policies: matching rules, exactness of the output law for each, per-drafter statistics, API
and CLI wiring (the policies' own tests: test_policies.py).

p is always the target's distribution, q the draft's.  Exactness is checked as in
test_speculative: greedy output identical to plain greedy, and the exact law of the output
enumerated over every random decision.  Timing-driven policies get a deterministic clock that
advances with the rows the sessions evaluated (`work_clock`), so enumeration stays possible.
"""
from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fakes import PAIR_FACTORIES, RELATIONS, enumerate_outcomes
from specdec.speculation.drafters import (HybridDrafter, Match, ModelDrafter, NgramIndex, PromptLookupDrafter,
                              make_drafter)
from specdec.errors import ConfigError, SpecdecError
from specdec.generation.plain import generate_plain
from specdec.speculation.policies import AdaptiveLength, FixedLength, Threshold
from specdec.generation.sampling import GREEDY, NumpyRandom, SamplerParams
from specdec.speculation.speculative import generate_speculative
from helpers import ListTrace, factories, sampling_params, target_law

KINDS = ("lookup", "lookup-full", "hybrid", "adaptive-model", "adaptive-lookup", "adaptive-hybrid",
         "adaptive-resume")


def work_clock(target, draft=None, c: float = 0.3, growth: float = 0.1):
    """Seconds = work done: 1 per target pass, `growth` per target row, `c` per draft row."""
    return lambda: (target.n_evals + growth * target.n_rows
                    + c * (draft.n_rows if draft is not None else 0))


def build(kind: str, target, draft, params, draft_n: int, draft_p: float = 0.0, ngram_max=2):
    """(drafter, policy) for one of KINDS."""
    resume = kind == "adaptive-resume"                 # resume needs ngram_max >= 4
    lookup = PromptLookupDrafter(target.n_vocab, ngram_max=5 if resume else ngram_max, ngram_min=1,
                                 resume=resume)
    full = PromptLookupDrafter(target.n_vocab, ngram_max=ngram_max, ngram_min=1, copy_ratio=0)
    model = ModelDrafter(draft, params, draft_p)
    drafter = {"lookup": lookup, "lookup-full": full, "hybrid": HybridDrafter(lookup, model),
               "adaptive-model": model, "adaptive-lookup": lookup,
               "adaptive-hybrid": HybridDrafter(lookup, model), "adaptive-resume": lookup}[kind]
    if kind.startswith("adaptive"):
        policy = AdaptiveLength(n_max=draft_n, n_init=min(2, draft_n), alpha_decay=0.3)
    else:
        policy = Threshold(draft_n, draft_p)
    return drafter, policy


# ---- prompt lookup: the matching rule ---------------------------------------------------------

def lookup_reference(ctx, n_max, ngram_min, ngram_max, copy_ratio=0.0):
    """Brute force: longest suffix n-gram with an earlier occurrence, its latest occurrence,
    overlapping copy of n_max tokens, at most copy_ratio per matched token (0: no cap)."""
    L = len(ctx)
    for n in range(min(ngram_max, L - 1), ngram_min - 1, -1):
        ends = [e for e in range(n, L) if ctx[e - n: e] == ctx[L - n:]]
        if ends:
            ext = list(ctx)
            if copy_ratio:
                n_max = min(n_max, max(1, int(copy_ratio * n)))
            for k in range(n_max):
                ext.append(ext[ends[-1] + k])
            return ext[L:]
    return []


def test_lookup_longest_ngram_then_most_recent_occurrence():
    d = PromptLookupDrafter(10, ngram_max=3, ngram_min=1, copy_ratio=0)
    rng = NumpyRandom(0)
    #        (2,3) ends at 3 and 7; the suffix (1,2,3) has no earlier occurrence
    ctx = [5, 2, 3, 4, 6, 2, 3, 7, 1, 2, 3]
    assert d.match(ctx) == Match(2, 7)
    assert d.propose(ctx, 3, rng).tokens == (7, 1, 2)
    ctx = [1, 2, 3, 4, 9, 2, 3, 7, 1, 2, 3]           # now (1,2,3) occurs: longer beats more recent
    assert d.match(ctx) == Match(3, 3)
    assert d.propose(ctx, 2, rng).tokens == (4, 9)


def test_lookup_overlapping_copy_no_match_and_caps():
    d = PromptLookupDrafter(6, ngram_max=3, ngram_min=1, copy_ratio=0)
    rng = NumpyRandom(0)
    draft = d.propose([1, 2, 1, 2], 5, rng)            # a period continues as far as asked
    assert draft.tokens == (1, 2, 1, 2, 1) and draft.source == "prompt-lookup"
    np.testing.assert_array_equal(draft.q, np.eye(6)[[1, 2, 1, 2, 1]])   # (n, V) one-hot
    assert d.propose([0, 0], 3, rng).tokens == (0, 0, 0)
    assert d.propose([1, 2, 3, 4], 4, rng).tokens == ()   # nothing repeats
    assert d.propose([3], 4, rng).tokens == ()
    assert d.propose([1, 2, 1, 2], 0, rng).tokens == ()
    d2 = PromptLookupDrafter(6, ngram_max=3, ngram_min=2, copy_ratio=0)
    assert d2.propose([1, 2, 3, 1], 2, rng).tokens == ()  # a 1-gram match is not enough
    assert d2.propose([1, 2, 3, 1, 2], 2, rng).tokens == (3, 1)
    for bad in ((0, 2), (3, 2)):
        with pytest.raises(ConfigError):
            PromptLookupDrafter(6, ngram_min=bad[0], ngram_max=bad[1])
    for bad in (-1.0, 0.1, float("nan")):
        with pytest.raises(ConfigError):
            PromptLookupDrafter(6, ngram_max=3, copy_ratio=bad)


def test_lookup_copies_at_most_copy_ratio_tokens_per_matched_token():
    rng = NumpyRandom(0)
    ctx = [1, 2, 3, 4, 5, 6, 7, 8, 9, 1, 2, 3]          # (1, 2, 3) matched: copy 4 5 6 7 8 ...
    assert PromptLookupDrafter(10, ngram_max=4).propose(ctx, 8, rng).tokens == (4, 5, 6)
    assert PromptLookupDrafter(10, ngram_max=4, copy_ratio=2).propose(ctx, 8, rng).tokens == (4, 5, 6, 7, 8, 9)
    assert PromptLookupDrafter(10, ngram_max=4, copy_ratio=0).propose(ctx, 8, rng).tokens == (
        4, 5, 6, 7, 8, 9, 1, 2)
    assert PromptLookupDrafter(10, ngram_max=4).propose(ctx, 2, rng).tokens == (4, 5)   # n_max still caps


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["extend", "extend", "extend", "edit", "shrink"]),
                          st.lists(st.integers(0, 3), min_size=1, max_size=4)), min_size=1, max_size=12),
       st.integers(1, 3), st.integers(0, 2), st.integers(0, 6), st.sampled_from([0.0, 1.0, 1.5, 2.0]))
def test_lookup_incremental_index_equals_brute_force(ops, ngram_max, extra, n_max, copy_ratio):
    """However the context evolves (grows, is edited, shrinks: a new request), the index
    answers like a search over the whole context."""
    ngram_min = max(1, ngram_max - extra)
    d = PromptLookupDrafter(4, ngram_max=ngram_max, ngram_min=ngram_min, copy_ratio=copy_ratio)
    ctx: list[int] = []
    for op, toks in ops:
        if op == "extend":
            ctx = ctx + toks
        elif op == "edit" and ctx:
            ctx = ctx[:-1] + toks
        else:
            ctx = ctx[: len(ctx) // 2] + toks
        got = d.propose(ctx, n_max, NumpyRandom(0)).tokens
        assert list(got) == lookup_reference(ctx, n_max, ngram_min, ngram_max, copy_ratio), ctx
        assert d.tokens(ctx, n_max) == list(got)       # what benchmarks/replay.py replays


def resume_reference(ctx, n_max, ngram_min, ngram_max, anchor=4, edit_max=4):
    """Brute force of prompt lookup with resume: the suffix rule, unless a copy resumed after
    the last e <= edit_max tokens anchors on a longer n-gram (>= anchor)."""
    L = len(ctx)

    def latest(gram, limit):                           # latest end <= limit of an earlier gram
        ends = [e for e in range(len(gram), limit + 1) if ctx[e - len(gram): e] == gram]
        return ends[-1] if ends else None

    hit = next(((n, e) for n in range(min(ngram_max, L - 1), ngram_min - 1, -1)
                if (e := latest(ctx[L - n:], L - 1)) is not None), None)
    if hit is None or hit[0] < ngram_max:
        for e in range(1, min(edit_max, L - anchor - 1) + 1):
            cut = L - e
            r = next(((n, j + 1) for n in range(min(ngram_max, cut - 1), anchor - 1, -1)
                      if (j := latest(ctx[cut - n: cut], cut - 1)) is not None), None)
            if r is not None:
                if r[1] < L and (hit is None or r[0] > hit[0]):
                    hit = r
                break
    if hit is None:
        return []
    ext = list(ctx)
    for k in range(n_max):
        ext.append(ext[hit[1] + k])
    return ext[L:]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["extend", "extend", "extend", "edit", "shrink"]),
                          st.lists(st.integers(0, 2), min_size=1, max_size=5)), min_size=1, max_size=14),
       st.integers(4, 6), st.integers(1, 4), st.integers(0, 6))
def test_lookup_with_resume_equals_brute_force(ops, ngram_max, ngram_min, n_max):
    d = PromptLookupDrafter(3, ngram_max=ngram_max, ngram_min=min(ngram_min, ngram_max), resume=True,
                            copy_ratio=0)
    assert d.resume
    ctx: list[int] = []
    for op, toks in ops:
        ctx = (ctx + toks if op == "extend" else ctx[:-1] + toks if op == "edit" and ctx
               else ctx[: len(ctx) // 2] + toks)
        got = d.propose(ctx, n_max, NumpyRandom(0)).tokens
        assert list(got) == resume_reference(ctx, n_max, d.ngram_min, ngram_max), ctx


def test_lookup_resumes_a_copy_after_a_renamed_token():
    """`a b c d OLD e f g h` re-typed with OLD -> NEW1 NEW2: after the new tokens the suffix
    rule has nothing, the resumed copy continues with `e f g h`."""
    src = [10, 11, 12, 13, 20, 14, 15, 16, 17, 18]
    d = PromptLookupDrafter(40, ngram_max=16, ngram_min=2, resume=True)
    ctx = src + [1] + [10, 11, 12, 13, 30, 31]
    hit = d.match(ctx)
    assert hit == Match(4, 5, True) and d.key(ctx) == "prompt-lookup/resume"
    assert d.propose(ctx, 4, NumpyRandom(0)).tokens == (14, 15, 16, 17)
    assert not PromptLookupDrafter(40, ngram_max=16, ngram_min=2).propose(
        ctx, 4, NumpyRandom(0)).tokens


def test_ngram_index_is_incremental():
    idx = NgramIndex(1, 2)
    idx.sync([1, 2, 3], 2)
    assert idx.find((1, 2)) == 2 and idx.find((3,)) is None
    idx.sync([1, 2, 3, 1, 2], 4)                        # extends: (1,) now last ends at 4
    assert idx.find((1,)) == 4 and idx.find((3, 1)) == 4 and idx.find((1, 2)) == 2
    idx.sync([7, 2], 1)                                 # not an extension: starts over
    assert idx.ids == [7, 2] and idx.find((1,)) is None and idx.find((7,)) == 1


# ---- exactness: greedy identity and the exact output law --------------------------------------

@factories
@settings(max_examples=6, deadline=None)
@given(seed=st.integers(0, 2**20), prompt=st.lists(st.integers(0, 7), min_size=1, max_size=10),
       relation=st.sampled_from(RELATIONS), use_eog=st.booleans())
def test_greedy_identity_every_drafter_and_policy(factory, seed, prompt, relation, use_eog):
    target, draft = factory(8, seed, relation)
    eog = {7} if use_eog else set()
    want = generate_plain(target, prompt, 24, GREEDY, NumpyRandom(0), eog)
    for kind in KINDS:
        for draft_n in (1, 3, 16):
            drafter, policy = build(kind, target, draft, GREEDY, draft_n, draft_p=0.3)
            got = generate_speculative(target, drafter, prompt, 24, GREEDY, NumpyRandom(1), eog,
                                       policy=policy)
            assert got.ids == want.ids and got.stop_reason == want.stop_reason, (kind, draft_n)
    for policy in (FixedLength(4), AdaptiveLength(8)):    # the real clock: any timing, same ids
        got = generate_speculative(target, ModelDrafter(draft, GREEDY), prompt, 24, GREEDY,
                                   NumpyRandom(2), eog, policy=policy)
        assert got.ids == want.ids


@factories
def test_lookup_accepts_on_repetitive_greedy_output(factory):
    """Greedy decoding of these models falls into a cycle, which lookup then copies."""
    target, _ = factory(8, 3, "good")
    drafter = PromptLookupDrafter(8, ngram_max=3, ngram_min=1)
    res = generate_speculative(target, drafter, [1, 2, 3], 60, GREEDY, NumpyRandom(0), set(), 8)
    assert res.ids == generate_plain(target, [1, 2, 3], 60, GREEDY, NumpyRandom(0), set()).ids
    s = res.stats
    assert s.n_accepted > 20 and s.tokens_per_step > 2.0
    assert set(s.by_drafter) == {"prompt-lookup"}


@factories
@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 2**20), n_vocab=st.integers(3, 4), data=st.data(),
       n_predict=st.integers(2, 3), draft_n=st.integers(1, 3), relation=st.sampled_from(RELATIONS),
       params=sampling_params, kind=st.sampled_from(KINDS), use_eog=st.booleans())
def test_exact_output_law_every_drafter_and_policy(factory, seed, n_vocab, data, n_predict,
                                                   draft_n, relation, params, kind, use_eog):
    prompt = data.draw(st.lists(st.integers(0, n_vocab - 1), min_size=1, max_size=4))
    target, draft = factory(n_vocab, seed, relation)
    eog = {0} if use_eog else set()
    drafter, policy = build(kind, target, draft, params, draft_n)
    clock = work_clock(target, draft)

    def run(rng):
        res = generate_speculative(target, drafter, prompt, n_predict, params, rng, eog,
                                   policy=policy, clock=clock)
        return tuple(res.ids), res.stop_reason

    got, want = enumerate_outcomes(run), target_law(target, prompt, n_predict, params, eog)
    assert abs(sum(got.values()) - 1.0) < 1e-12
    for key in set(got) | set(want):
        assert abs(got.get(key, 0.0) - want.get(key, 0.0)) < 1e-9, key


@pytest.mark.parametrize("kind", ["lookup", "adaptive-hybrid", "adaptive-resume"])
def test_exact_output_law_longer(kind):
    """Deeper: 5 tokens from a repetitive prompt, so lookup drafts multi-token copies."""
    params = SamplerParams(temperature=0.9, top_k=0, top_p=1.0, min_p=0.0)
    target, draft = PAIR_FACTORIES["fake"](3, 5, "bad")
    drafter, policy = build(kind, target, draft, params, draft_n=4, ngram_max=3)
    clock = work_clock(target, draft)
    prompt = [1, 2, 1, 2, 1]

    def run(rng):
        return tuple(generate_speculative(target, drafter, prompt, 5, params, rng, set(),
                                          policy=policy, clock=clock).ids)

    got = enumerate_outcomes(run)
    want = {k[0]: v for k, v in target_law(target, prompt, 5, params, set()).items()}
    assert set(got) == set(want)
    assert max(abs(got[k] - want[k]) for k in want) < 1e-9


# ---- hybrid: the draft model's cache, statistics per drafter ---------------------------------

@factories
def test_hybrid_keeps_the_draft_cache_a_prefix_and_reports_per_drafter(factory):
    params = SamplerParams(temperature=0.8, top_k=0, top_p=1.0, min_p=0.0)
    target, draft = factory(6, 11, "good")
    prompt = [1, 2, 3, 4, 1, 2, 3]
    out: list[int] = []
    sizes: list[int] = []
    orig = draft.eval
    draft.eval = lambda toks, last_only=False: (sizes.append(len(toks)), orig(toks, last_only))[1]

    def check(rec):
        ctx = prompt + out + list(rec.drafted[: rec.n_accepted]) + [rec.next_token]
        assert target.tokens == ctx[:-1]
        assert draft.tokens == ctx[: len(draft.tokens)]
        out.extend(rec.emitted)

    drafter = HybridDrafter(PromptLookupDrafter(6, ngram_max=2, ngram_min=2),
                            ModelDrafter(draft, params))
    res = generate_speculative(target, drafter, prompt, 80, params, NumpyRandom(4), set(),
                               policy=FixedLength(4), trace=ListTrace(check))
    s = res.stats
    assert res.ids == out and set(s.by_drafter) == {"prompt-lookup", "model"}
    parts = s.by_drafter.values()
    assert sum(d.n_drafted for d in parts) == s.n_drafted
    assert sum(d.n_accepted for d in parts) == s.n_accepted
    assert sum(d.n_verified for d in parts) == s.n_verified
    assert s.n_steps - 1 <= sum(d.n_steps for d in parts) <= s.n_steps   # a last step may be capped to 0
    for d in parts:
        assert 0.0 <= d.predicted_acceptance <= 1.0
        assert d.measured_acceptance == pytest.approx(d.n_accepted / d.n_verified)
    # each catch-up after lookup steps is one batched eval, never token by token
    assert max(sizes) > 2
    assert draft.n_rows <= len(prompt) + len(res.ids) + s.n_drafted


@factories
def test_the_draft_model_reads_the_prompt_in_the_prompt_phase(factory):
    """prefill: all prompt ids but the last go through the draft before the clock of the
    decode phase starts; the first proposal then feeds one id (not the whole prompt)."""
    target, draft = factory(6, 11, "good")
    prompt = [1, 2, 3, 4, 5, 0, 2]
    sizes: list[int] = []
    orig = draft.eval
    draft.eval = lambda toks, last_only=False: (sizes.append(len(toks)), orig(toks, last_only))[1]
    ticks: list[tuple[str, int]] = []
    clock = iter(range(10**6))

    def tick():
        ticks.append(("clock", len(sizes)))
        return float(next(clock))

    for drafter in (ModelDrafter(draft, GREEDY),
                    HybridDrafter(PromptLookupDrafter(6, ngram_max=2), ModelDrafter(draft, GREEDY))):
        sizes.clear()
        ticks.clear()
        plain = generate_plain(target, prompt, 10, GREEDY, NumpyRandom(0), set())
        res = generate_speculative(target, drafter, prompt, 10, GREEDY, NumpyRandom(0), set(),
                                   policy=FixedLength(3), clock=tick)
        assert res.ids == plain.ids
        assert sizes[:2] == [len(prompt) - 1, 1]
        assert ticks[1] == ("clock", 1)                   # t1, the decode clock: after the prefill


def test_predicted_acceptance_matches_measured_for_prompt_lookup():
    """q one-hot: the predicted acceptance 1 - TV(p, q) of a copied token is p(x)."""
    params = SamplerParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0)
    target, _ = PAIR_FACTORIES["fake"](4, 2, "good", n_ctx=2048)
    s = generate_speculative(target, PromptLookupDrafter(4, ngram_max=2, ngram_min=1), [0, 1, 2, 3], 1200,
                             params, NumpyRandom(5), set(), 3).stats
    lk = s.by_drafter["prompt-lookup"]
    se = math.sqrt(0.25 / lk.n_verified)
    assert lk.n_verified > 300 and abs(lk.predicted_acceptance - lk.measured_acceptance) < 4 * se
    assert lk.predicted_acceptance == pytest.approx(s.predicted_acceptance)


# ---- construction, API and CLI ------------------------------------------------------------------

@pytest.fixture(scope="module")
def tiny(tiny_model):
    from synth import TinySpec
    return tiny_model(TinySpec(n_vocab=24, d_model=16, n_head=2, n_head_kv=1, d_ff=24, seed=3,
                               logit_scale=4.0))


def test_make_drafter_from_names_models_and_objects(tiny):
    lk = make_drafter("prompt-lookup", tiny, GREEDY, lookup_ngram_min=2, lookup_ngram_max=4)
    assert isinstance(lk, PromptLookupDrafter) and (lk.ngram_min, lk.ngram_max) == (2, 4)
    assert lk.n_vocab == tiny.config.n_vocab
    hy = make_drafter("hybrid", tiny, GREEDY, draft_model=tiny, draft_p=0.5)
    assert isinstance(hy, HybridDrafter) and hy.model.draft_p == 0.5
    assert isinstance(make_drafter("model", tiny, GREEDY, draft_model=tiny), ModelDrafter)
    assert isinstance(make_drafter(tiny, tiny, GREEDY), ModelDrafter)
    assert make_drafter(lk, tiny, GREEDY) is lk
    for bad in (lambda: make_drafter("hybrid", tiny, GREEDY), lambda: make_drafter("ngram", tiny, GREEDY),
                lambda: make_drafter(3, tiny, GREEDY)):
        with pytest.raises(ConfigError) as e:
            bad()
        assert "\n" not in str(e.value)


def test_api_generate_with_every_drafter_and_policy(tiny):
    prompt = "abcabcab"
    want = tiny.generate(prompt, n_predict=16, ignore_eos=True)
    for draft, policy in (("prompt-lookup", "threshold"), ("hybrid", "adaptive"),
                          ("model", "fixed"), (tiny, "adaptive"),
                          (PromptLookupDrafter(tiny.config.n_vocab), "fixed")):
        got = tiny.generate(prompt, n_predict=16, ignore_eos=True, draft=draft, draft_model=tiny,
                            draft_policy=policy, draft_n=6, lookup_ngram_max=2)
        assert got.ids == want.ids and got.stats is not None, (draft, policy)
        assert got.stats.by_drafter


def test_cli_draft_and_policy_flags(tiny, capsys):
    from specdec.frontends import cli
    rc = cli.main(["run", "-m", tiny.path, "-p", "abcabcab", "-n", "8", "--ignore-eos", "--raw", "-v",
                   "--draft", "prompt-lookup", "--lookup-ngram-max", "2", "--draft-policy", "adaptive"])
    err = capsys.readouterr().err
    assert rc == 0 and "accepted" in err and "prompt-lookup" in err
    assert cli.main(["run", "-m", tiny.path, "-p", "ab", "-n", "2", "--draft", "hybrid"]) == 2
    assert "draft model" in capsys.readouterr().err
    assert cli.main(["run", "-m", tiny.path, "-p", "ab", "-n", "2", "--draft", "prompt-lookup",
                     "--lookup-copy-ratio", "-1"]) == 2
    out = capsys.readouterr()                         # refused before loading: nothing printed
    assert out.out == "" and "--lookup-copy-ratio" in out.err and "loading" not in out.err
    with pytest.raises(SpecdecError):
        cli.build_parser().parse_args(["run", "--draft-policy", "sometimes"])


@pytest.mark.real
@pytest.mark.slow
def test_greedy_identity_on_qwen_pair_code_editing(real_model):
    """The real pair on one code-editing prompt (benchmarks/prompts): lookup and hybrid with the
    adaptive policy give plain greedy's ids, and lookup finds copies to accept."""
    import json
    from pathlib import Path
    path = Path(__file__).parents[2] / "benchmarks" / "prompts" / "code_editing.jsonl"
    prompt = json.loads(path.read_text().splitlines()[0])["prompt"]
    target = real_model("qwen2.5-coder-1.5b-instruct-q4_k_m")
    draft = real_model("qwen2.5-coder-0.5b-instruct")
    want = target.generate(prompt, n_predict=32, ignore_eos=True).ids
    lk = target.generate(prompt, n_predict=32, ignore_eos=True, draft="prompt-lookup", draft_n=8,
                         draft_policy="fixed")
    hy = target.generate(prompt, n_predict=32, ignore_eos=True, draft="hybrid", draft_model=draft,
                         draft_n=16, draft_policy="adaptive")
    assert lk.ids == want and hy.ids == want
    assert lk.stats.n_accepted > 0


def test_lookup_key_names_the_match_length():
    d = PromptLookupDrafter(10, ngram_max=16, ngram_min=2)
    assert d.key([1, 2, 3, 4]) == "prompt-lookup/none"
    run = [1, 2, 3, 4, 5, 6]
    assert d.key(run + [9] + run) == "prompt-lookup/5-7"          # suffix 1..6 seen: n = 6
    assert d.key(run + [9] + run[-2:]) == "prompt-lookup/1-2"
    long = list(range(20))
    assert d.key(long + [0, 0] + long) == "prompt-lookup/16+"
    assert d.propose(long + [0, 0] + long, 3, None).tokens == (0, 0, 0)   # what follows the match
    assert d.key([5, 5, 5, 5, 5]) == "prompt-lookup/3-4"           # overlapping occurrence


# ---- a draft that computes fewer logits (--draft-vocab) -----------------------------------------

class CutLogits:
    """A draft session that returns the logits of ids < k only (as Session(n_logits=k))."""

    def __init__(self, inner, k: int):
        self.inner, self.n_logits = inner, k

    n_vocab = property(lambda self: self.inner.n_vocab)
    n_ctx = property(lambda self: self.inner.n_ctx)
    n_past = property(lambda self: self.inner.n_past)

    def eval(self, tokens, last_only=False):
        return self.inner.eval(tokens, last_only)[:, : self.n_logits]

    def truncate(self, n):
        self.inner.truncate(n)

    def reset(self):
        self.inner.reset()


@factories
@settings(max_examples=20, deadline=None)
@given(seed=st.integers(0, 2**20), data=st.data(), params=sampling_params,
       relation=st.sampled_from(RELATIONS), k=st.integers(1, 3))
def test_exact_output_law_with_a_cut_draft_vocabulary(factory, seed, data, params, relation, k):
    """q lives on ids < k and is zero elsewhere: still exactly the target's law."""
    n_vocab = 4
    prompt = data.draw(st.lists(st.integers(0, n_vocab - 1), min_size=1, max_size=3))
    target, draft = factory(n_vocab, seed, relation)
    drafter = ModelDrafter(CutLogits(draft, k), params, n_vocab=n_vocab)

    def run(rng):
        res = generate_speculative(target, drafter, prompt, 3, params, rng, set(), draft_n=2)
        return tuple(res.ids), res.stop_reason

    got, want = enumerate_outcomes(run), target_law(target, prompt, 3, params, set())
    for key in set(got) | set(want):
        assert abs(got.get(key, 0.0) - want.get(key, 0.0)) < 1e-9, key


def test_session_n_logits_is_a_prefix_of_the_logits(tiny):
    ids = [1, 5, 23, 7, 2]                                    # ids above the cut still go in
    full = tiny.session().eval(ids)
    cut = tiny.session(n_logits=9).eval(ids)
    assert cut.shape == (5, 9) and np.array_equal(cut, full[:, :9])
    with pytest.raises(ConfigError):
        tiny.session(n_logits=0)
    want = tiny.generate("abcabcab", n_predict=12, ignore_eos=True)
    got = tiny.generate("abcabcab", n_predict=12, ignore_eos=True, draft=tiny, draft_vocab=9,
                        draft_policy="fixed", draft_n=4)
    assert got.ids == want.ids and got.stats.n_drafted > 0


def test_a_catch_up_is_reported_and_left_out_of_the_policys_draft_cost():
    """The first proposal of a draft model catches its cache up on the context (a window's
    prompt pass); later ones feed one row.  The draft reports the catch-up's seconds, and the
    length policy's feedback leaves them out: they are no cost per drafted token (charged to
    the first model step, they made a planned draft model look dear and stop after one step)."""
    from specdec.speculation.bookkeeping import Bookkeeper, StepTimer
    from specdec.speculation.policies import DraftPolicy
    _, draft = PAIR_FACTORIES["fake"](16, 3, "good")
    drafter = ModelDrafter(draft, GREEDY)
    ctx = list(range(1, 13))
    first = drafter.propose(ctx, 3, NumpyRandom(0))
    assert first.catchup_s > 0.0
    later = drafter.propose(ctx + [first.tokens[0]], 3, NumpyRandom(0))   # one new row: no catch-up
    assert len(first.tokens) == 3 and later.catchup_s == 0.0

    seen = []

    class Spy(DraftPolicy):
        n_max, p_min = 8, 0.0

        def next_n(self):
            return 1

        def observe(self, fb):
            seen.append(fb.draft_s)
    book = Bookkeeper(Spy(), None)
    book.ask("model", 8)
    clock = iter([0.0, 1.25, 2.0])
    timer = StepTimer(lambda: next(clock))
    timer.lap("draft")
    timer.lap("verify")
    from specdec.speculation.bookkeeping import StepResult
    from specdec.speculation.verify import verify
    p = np.full((2, 16), 1 / 16)
    res = verify((3,), np.eye(16)[[3]], p, NumpyRandom(0))
    book.record(StepResult(res, (3,), np.eye(16)[[3]], p, "model", 1, catchup_s=1.0), 12, [3], False, timer)
    assert seen == [0.25] and book.steps[0].draft_s == 1.25       # the trace and stats keep the whole
