"""Predicted outputs (drafters/prediction.py): the cursor rule, greedy identity over right,
wrong, partial and shuffled predictions (hypothesis), the exact output law by enumeration,
and the API / CLI / server faces (`prediction=`, `--predict`, OpenAI's `prediction`)."""
from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fakes import RELATIONS, enumerate_outcomes
from helpers import ListTrace, factories, sampling_params, target_law
from specdec.errors import ConfigError
from specdec.generation.plain import generate_plain
from specdec.generation.sampling import GREEDY, NumpyRandom
from specdec.speculation.drafters import ModelDrafter, PredictionDrafter, PromptLookupDrafter
from specdec.speculation.policies import AdaptiveLength, Threshold
from specdec.speculation.speculative import generate_speculative

V = 200


# ---- the cursor rule ---------------------------------------------------------------------------

def test_cursor_follows_the_output_and_realigns_after_edits():
    pred = list(range(1, 21))                           # 1 … 20
    d = PredictionDrafter(pred, V)
    ctx = [100, 101]                                    # the prompt
    assert d.tokens(ctx, 4) == [1, 2, 3, 4]             # the answer starts as predicted
    ctx += [1, 2, 3]
    assert d.tokens(ctx, 4) == [4, 5, 6, 7]             # followed: the cursor moved on
    assert d.key(ctx) == "prediction/3-7"               # the evidence: 3 tokens in a row
    ctx += [150]                                        # an insertion: nothing to align on
    assert d.tokens(ctx, 4) == [] and d.cursor(ctx) is None
    ctx += [4]                                          # one token near the cursor re-aligns
    assert d.tokens(ctx, 3) == [5, 6, 7]
    assert d.key(ctx) == "prediction/1-2"
    ctx += [7]                                          # a deletion of 5, 6
    assert d.tokens(ctx, 2) == [8, 9]
    ctx += [2, 3, 4]                                    # back before the cursor: 3 tokens
    assert d.tokens(ctx, 2) == [5, 6]
    ctx += [19, 20]
    assert d.tokens(ctx, 4) == []                       # the prediction is used up


def test_one_token_far_ahead_and_short_matches_behind_do_not_align():
    pred = [5, 6, 7, 8] + [9] * 20 + [1, 2]
    for out in ([5, 6, 7, 8, 50, 1],             # "1" only far after the cursor (23 > NEAR)
                [5, 6, 7, 8, 9, 9, 50, 6, 7]):   # "6 7" before the cursor: shorter than ANYWHERE_MIN
        d = PredictionDrafter(pred, V)
        assert d.tokens([100], 1) == [5]         # the prompt: the output starts after it
        for i in range(1, len(out)):             # the answer grows token by token
            d.tokens([100, *out[:i]], 1)
        assert d.tokens([100, *out], 2) == []


def test_fallback_drafts_where_the_prediction_has_nothing():
    lookup = PromptLookupDrafter(V, ngram_max=2, ngram_min=1)
    d = PredictionDrafter([1, 2, 3], V, fallback=lookup)
    rng = NumpyRandom(0)
    ctx = [40, 41, 42, 40, 41]
    assert d.key(ctx) == "prediction/start" and d.propose(ctx, 2, rng).source == "prediction"
    ctx += [60]                                         # off the prediction
    assert d.key(ctx).startswith("prompt-lookup")
    ctx += [40, 41]
    draft = d.propose(ctx, 2, rng)
    assert draft.source == "prompt-lookup" and draft.tokens == (60, 40)   # the latest copy
    assert np.array_equal(draft.q.argmax(axis=1), [60, 40])


# ---- exactness ---------------------------------------------------------------------------------

def _variants(want: list[int], data, n_vocab: int) -> dict[str, list[int]]:
    """Right, wrong, partial, edited and shuffled predictions of the answer `want`."""
    edited = list(want)
    for _ in range(data.draw(st.integers(1, 4))):
        i = data.draw(st.integers(0, len(edited)))
        if data.draw(st.booleans()) and i < len(edited):
            del edited[i]
        else:
            edited.insert(i, data.draw(st.integers(0, n_vocab - 1)))
    shuffled = data.draw(st.permutations(want))
    return {"right": want, "partial": want[: len(want) // 2], "edited": edited,
            "shuffled": list(shuffled), "empty": [],
            "wrong": data.draw(st.lists(st.integers(0, n_vocab - 1), max_size=30))}


@factories
@settings(max_examples=6, deadline=None)
@given(seed=st.integers(0, 2**20), prompt=st.lists(st.integers(0, 7), min_size=1, max_size=8),
       relation=st.sampled_from(RELATIONS), use_eog=st.booleans(), data=st.data())
def test_greedy_identity_over_right_wrong_partial_and_shuffled_predictions(
        factory, seed, prompt, relation, use_eog, data):
    target, draft = factory(8, seed, relation)
    eog = {7} if use_eog else set()
    want = generate_plain(target, prompt, 24, GREEDY, NumpyRandom(0), eog)
    for name, pred in _variants(want.ids, data, 8).items():
        for fallback in (None, "lookup", "model"):
            fb = {None: None, "lookup": PromptLookupDrafter(8, ngram_max=2, ngram_min=1),
                  "model": ModelDrafter(draft, GREEDY)}[fallback]
            for policy in (Threshold(16, 0.0), AdaptiveLength(8, n_init=2, stop_after=4)):
                got = generate_speculative(target, PredictionDrafter(pred, 8, fallback=fb), prompt, 24,
                                           GREEDY, NumpyRandom(1), eog, policy=policy)
                assert got.ids == want.ids and got.stop_reason == want.stop_reason, (name, fallback)
                if name == "right" and fallback is None and isinstance(policy, Threshold) and want.ids:
                    s = got.stats                         # a right prediction: 17 tokens a pass
                    found = len(want.ids) + (want.stop_reason == "eog")    # the end token takes its place
                    assert s.n_steps == -(-found // 17) and s.n_accepted == s.n_drafted


@factories
@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**20), n_vocab=st.integers(3, 4), data=st.data(),
       n_predict=st.integers(2, 3), draft_n=st.integers(1, 3), relation=st.sampled_from(RELATIONS),
       params=sampling_params, use_eog=st.booleans(), with_model=st.booleans())
def test_exact_output_law_with_a_prediction(factory, seed, n_vocab, data, n_predict, draft_n,
                                            relation, params, use_eog, with_model):
    prompt = data.draw(st.lists(st.integers(0, n_vocab - 1), min_size=1, max_size=3))
    pred = data.draw(st.lists(st.integers(0, n_vocab - 1), max_size=5))
    target, draft = factory(n_vocab, seed, relation)
    eog = {0} if use_eog else set()

    def run(rng):
        fb = ModelDrafter(draft, params) if with_model else None
        res = generate_speculative(target, PredictionDrafter(pred, n_vocab, fallback=fb), prompt,
                                   n_predict, params, rng, eog, policy=Threshold(draft_n, 0.0))
        return tuple(res.ids), res.stop_reason

    got, want = enumerate_outcomes(run), target_law(target, prompt, n_predict, params, eog)
    assert abs(sum(got.values()) - 1.0) < 1e-12
    for key in set(got) | set(want):
        assert abs(got.get(key, 0.0) - want.get(key, 0.0)) < 1e-9, key


# ---- the faces: API, Conversation, CLI, trace --------------------------------------------------

@pytest.fixture(scope="module")
def tiny(tiny_model):
    from synth import TinySpec
    return tiny_model(TinySpec(n_vocab=24, d_model=16, n_head=2, n_head_kv=1, d_ff=24, seed=3,
                               logit_scale=4.0))


def test_generate_with_a_prediction(tiny):
    prompt = "abcab"
    want = tiny.generate(prompt, n_predict=20, ignore_eos=True)
    kinds: list[str] = []
    trace = ListTrace()
    got = tiny.generate(prompt, n_predict=20, ignore_eos=True, prediction=want.text,
                        on_token=lambda t, k: kinds.append(k), trace=trace)
    assert got.ids == want.ids
    st = got.stats.by_drafter["prediction"]      # the plan's lengths follow the host's costs:
    assert st.n_drafted > 0 and st.n_accepted == st.n_verified == st.n_drafted and "predicted" in kinds
    assert {r.source for r in trace.records} == {"prediction"}
    for pred in ("", "zzzz", want.text[::-1], list(reversed(want.ids))):    # wrong ones: same ids
        for draft in (None, "prompt-lookup", tiny):
            out = tiny.generate(prompt, n_predict=20, ignore_eos=True, prediction=pred, draft=draft)
            assert out.ids == want.ids, (pred, draft)
    with pytest.raises(ConfigError):
        tiny.generate(prompt, n_predict=4, prediction=[10**6])


def test_conversation_say_with_a_prediction(tiny):
    from specdec import Conversation
    plain = Conversation(tiny, ignore_eos=True)
    a1, a2 = plain.say("ab", 12).ids, plain.say("cd", 12)
    conv = Conversation(tiny, ignore_eos=True, draft="prompt-lookup")
    assert conv.say("ab", 12, prediction=tiny.detokenize(a1)).ids == a1
    out = conv.say("cd", 12)                                 # the next turn: no prediction left
    assert out.ids == a2.ids and "prediction" not in (out.stats.by_drafter or {})


def test_cli_predict_flags(tiny, tmp_path, capsys):
    from specdec.frontends import cli
    want = tiny.generate("abcab", n_predict=12, ignore_eos=True)
    f = tmp_path / "pred.txt"
    f.write_text(want.text, encoding="utf-8")
    trace = tmp_path / "t.jsonl"
    base = ["run", "-m", tiny.path, "-p", "abcab", "--raw", "-n", "12", "--ignore-eos",
            "--no-display-prompt"]
    assert cli.main(base + ["--predict", str(f), "--trace", str(trace)]) == 0
    out = capsys.readouterr()
    assert out.out.rstrip("\n") == want.text and "the prediction" in out.err
    assert json.loads(trace.read_text().splitlines()[0])["source"] == "prediction"
    assert cli.main(base + ["--prediction", want.text]) == 0
    assert capsys.readouterr().out.rstrip("\n") == want.text
    for bad in (["--predict", str(tmp_path / "missing.txt")],
                ["--predict", str(f), "--prediction", "x"], ["--prediction", "x", "-cnv"]):
        assert cli.main(base + bad) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert err[-1].startswith("specdec: error:") and "predict" in err[-1]
