"""Speculation under a constraint changes nothing: proofs on a tiny vocabulary with real token
bytes in which one text has several tokenizations ("ab" is [ab] or [a, b], "12" is [12] or
[1, 2]).

- greedy speculative == greedy plain constrained, for every drafter (hypothesis);
- the output law, enumerated exactly, equals plain constrained sampling's for every drafter;
- two wrong variants (q masked but not renormalised; the grammar's canonical forced tokens
  emitted without verification) are shown to change that law: the same test detects them.

p is always the target's distribution, q the draft's.
"""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

pytest.importorskip("llguidance")

from fakes import enumerate_outcomes, fake_pair  # noqa: E402
from specdec.generation.constraint import ConstraintSpec, compile_constraint, masked  # noqa: E402
from specdec.generation.interfaces import drive  # noqa: E402
from specdec.generation.plain import plain_steps  # noqa: E402
from specdec.generation.sampling import GREEDY, SamplerParams, probs  # noqa: E402
from specdec.speculation.drafters import (ForcedDrafter, HybridDrafter, ModelDrafter, PredictionDrafter,  # noqa: E402
                                          PromptLookupDrafter, RetokenizingDrafter, SuffixDrafter)
from specdec.speculation.drafters.base import Draft, Drafter  # noqa: E402
from specdec.speculation.policies import FixedLength  # noqa: E402
from specdec.speculation.speculative import speculative_steps  # noqa: E402
from specdec.testing.synth import TinySpec, tokenizer_metadata  # noqa: E402
from specdec.text.tokenizer import Tokenizer  # noqa: E402

TOKENS = ("<s>", "a", "b", "ab", "ba", "{", "}", '"', ":", '{"', '"}', "1", "2", "12", "x", "</s>")
V = len(TOKENS)
EOS = V - 1
GBNF = 'root ::= "ab" ("ab" | "ba" | "x")* "12"'
SCHEMA = '{"type": "object", "properties": {"ab": {"type": "integer"}}, "required": ["ab"]}'
SPECS = {"gbnf": ConstraintSpec("gbnf", GBNF), "json": ConstraintSpec("json_schema", SCHEMA),
         "regex": ConstraintSpec("regex", "(ab|ba|x)+1?2")}
PROMPT = [1, 2]
LAW_TOL = 1e-9


def _tokenizer() -> Tokenizer:
    spec = TinySpec(n_vocab=V, tokens=TOKENS, token_types=(3,) + (1,) * (V - 2) + (3,))
    return Tokenizer.from_metadata(tokenizer_metadata(spec), "tiny-constrained")


TOK = _tokenizer()


def constraint(name: str):
    return compile_constraint(SPECS[name], TOK, V)


def _allowed(c) -> set[str]:
    return {TOKENS[t] for t in np.flatnonzero(c.mask())}


def test_tiny_vocabulary_has_several_tokenizations_of_one_text():
    """Where the text is open, every tokenization is allowed ("ab" or "a" then "b"); where
    the grammar forces it, llguidance's mask admits its canonical tokenization only (the
    engine's own encoder: single characters here), the one `forced()` drafts."""
    assert _allowed(constraint("regex")) == {"a", "b", "ab", "ba", "x"}
    c = constraint("gbnf")
    assert _allowed(c) == {"a"} and [TOKENS[t] for t in c.forced()] == ["a"]
    for t in ("a", "b", "ab", "1"):
        c.advance(TOKENS.index(t))
    assert _allowed(c) == {"2"}
    c.advance(TOKENS.index("2"))
    assert c.done and _allowed(c) == {"</s>"}
    c.rollback(2)
    assert not c.done and c.n_consumed == 3 and {"1", "12", "x", "a", "ab"} <= _allowed(c)


# ---- drafters, each a function of (target session, draft session, sampler params) -------------
DRAFTERS = {
    "model": lambda t, d, p: ModelDrafter(d, p),
    "forced": lambda t, d, p: ForcedDrafter(None, V),
    "forced+model": lambda t, d, p: ForcedDrafter(ModelDrafter(d, p)),
    "prompt-lookup": lambda t, d, p: PromptLookupDrafter(V, ngram_max=3, ngram_min=1),
    "suffix": lambda t, d, p: SuffixDrafter(V, None, ngram_max=3, ngram_min=1),
    "hybrid": lambda t, d, p: HybridDrafter(PromptLookupDrafter(V, ngram_max=3, ngram_min=1), ModelDrafter(d, p)),
    "prediction": lambda t, d, p: PredictionDrafter([3, 14, 3, 13, 4, 11], V, fallback=ModelDrafter(d, p)),
    "retokenized": lambda t, d, p: RetokenizingDrafter(d, TOK, TOK, V),
}
PARAMS = [SamplerParams(temperature=1.0, top_k=2, top_p=1.0, min_p=0.0)]   # top-2 of the masked logits: small trees


def plain(target, name, n, params, rng):
    target.reset()
    return drive(plain_steps(target, PROMPT, n, params, rng, {EOS}, constraint=constraint(name)))


def spec(target, drafter, name, n, params, rng, draft_n=3, tree_k=1):
    target.reset()
    return drive(speculative_steps(target, drafter, PROMPT, n, params, rng, {EOS}, FixedLength(draft_n),
                                   constraint=constraint(name), tree_k=tree_k))


class _NoRng:
    def bernoulli(self, prob):
        assert prob in (0.0, 1.0), prob
        return prob >= 1.0

    def categorical(self, w):
        nz = np.flatnonzero(np.asarray(w) > 0)
        assert nz.size == 1, "greedy decoding drew at random"
        return int(nz[0])


@settings(max_examples=12, deadline=None)
@given(seed=st.integers(0, 10_000), relation=st.sampled_from(["identical", "good", "bad"]),
       name=st.sampled_from(sorted(SPECS)), draft_n=st.integers(1, 5))
@pytest.mark.parametrize("drafter", [*DRAFTERS, "tree"])
def test_greedy_speculative_equals_greedy_plain_constrained(drafter, seed, relation, name, draft_n):
    target, draft = fake_pair(V, seed, relation)
    want = plain(target, name, 12, GREEDY, _NoRng())
    if drafter == "tree":
        got = spec(target, ModelDrafter(draft, GREEDY), name, 12, GREEDY, _NoRng(), draft_n, tree_k=2)
    else:
        got = spec(target, DRAFTERS[drafter](target, draft, GREEDY), name, 12, GREEDY, _NoRng(), draft_n)
    assert (got.ids, got.stop_reason) == (want.ids, want.stop_reason)
    c = constraint(name)
    for t in got.ids:
        assert c.mask()[t]
        c.advance(t)


def law_gap(a: dict, b: dict) -> float:
    return max(abs(a.get(k, 0.0) - b.get(k, 0.0)) for k in set(a) | set(b))


def _outcome(res):
    return (tuple(res.ids), res.stop_reason)


def plain_law(target, name, n, params):
    return enumerate_outcomes(lambda rng: _outcome(plain(target, name, n, params, rng)))


def spec_law(target, make, name, n, params, draft_n=3, tree_k=1):
    return enumerate_outcomes(lambda rng: _outcome(spec(target, make(), name, n, params, rng, draft_n, tree_k)))


@pytest.mark.slow
@pytest.mark.parametrize("name", ["gbnf", "regex"])
@pytest.mark.parametrize("drafter", [*DRAFTERS, "tree-greedy-firsts", "tree-sampled"])
def test_exact_output_law_under_a_constraint(drafter, name):
    params = PARAMS[0]
    target, draft = fake_pair(V, 3, "good")
    want = plain_law(target, name, 4, params)
    assert len(want) > 5 and abs(sum(want.values()) - 1.0) < LAW_TOL
    if drafter.startswith("tree"):
        dp = GREEDY if drafter == "tree-greedy-firsts" else params
        got = spec_law(target, lambda: ModelDrafter(draft, dp), name, 4, params, 2, tree_k=2)
    else:
        got = spec_law(target, lambda: DRAFTERS[drafter](target, draft, params), name, 4, params)
    assert law_gap(got, want) < LAW_TOL


@pytest.mark.slow
def test_exact_output_law_with_filters_and_json():
    params = SamplerParams(temperature=0.7, top_k=3, top_p=0.9, min_p=0.0)
    target, draft = fake_pair(V, 11, "good")
    want = plain_law(target, "json", 3, params)
    got = spec_law(target, lambda: ForcedDrafter(ModelDrafter(draft, params)), "json", 3, params)
    assert law_gap(got, want) < LAW_TOL


# ---- wrong variants: the same comparison must catch them --------------------------------------
class MaskedDrafter(Drafter):
    """Draws each token from the draft's q (filters and temperature applied) times the mask:
    reports it renormalised (right) or, with renormalise=False, WRONG: masked but not
    renormalised."""

    def __init__(self, logit_fn, params, renormalise: bool):
        self.logit_fn, self.params, self.renormalise, self.n_vocab = logit_fn, params, renormalise, V

    def propose(self, context_ids, n_max, rng):
        c, tokens, qs, pushed = self.constraint, [], [], 0
        for _ in range(n_max):
            q = probs(self.logit_fn(tuple(context_ids) + tuple(tokens)), self.params) * c.mask()
            if q.sum() == 0:
                break
            x = int(rng.categorical(q))
            tokens.append(x)
            qs.append(q / q.sum() if self.renormalise else q)
            if x in c.eos_ids or len(tokens) == n_max:
                break
            c.advance(x)
            pushed += 1
        c.rollback(pushed)
        return Draft(tuple(tokens), np.array(qs).reshape(len(tokens), V), "model")


class CutSampledDrafter(ModelDrafter):
    """WRONG: samples from the unmasked q and cuts the draft at its first forbidden token, as
    one may a one-hot draft: the kept tokens are then conditioned on being allowed, a law
    other than the q reported (constrained.py keeps such a token, to be rejected surely)."""

    def propose(self, context_ids, n_max, rng):
        c, self.constraint = self.constraint, None
        try:
            d = super().propose(context_ids, n_max, rng)            # unmasked draws
        finally:
            self.constraint = c
        n = c.n_allowed(d.tokens)
        return Draft(d.tokens[:n], d.q[:n], d.source)

    def constrain(self, constraint):
        self.constraint = constraint


FULL = SamplerParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0)


@pytest.mark.slow
@pytest.mark.parametrize("name, relation, params", [("gbnf", "bad", FULL), ("regex", "good", PARAMS[0])])
def test_wrong_variants_are_detected(name, relation, params):
    """The comparison that passes every drafter above fails two plausible mistakes."""
    target, draft = fake_pair(V, 3, relation)
    want = plain_law(target, name, 3, params)
    for renormalise, right in ((True, True), (False, False)):   # q masked, renormalised or not
        law = spec_law(target, lambda: MaskedDrafter(draft.logit_fn, params, renormalise), name, 3, params)
        assert (law_gap(law, want) < LAW_TOL) == right, renormalise
    cut = spec_law(target, lambda: CutSampledDrafter(draft, params), name, 3, params)
    assert law_gap(cut, want) > 1e-3                                # unmasked draws cut where forbidden
    right = spec_law(target, lambda: ModelDrafter(draft, params), name, 3, params)
    assert law_gap(right, want) < LAW_TOL


def test_constraint_unfinished_within_n_predict_ends_with_n_predict():
    target, draft = fake_pair(V, 5, "good")
    loop = ConstraintSpec("gbnf", 'root ::= "ab" "x"+ "12"')
    for drafter in (None, ForcedDrafter(ModelDrafter(draft, GREEDY))):
        target.reset()
        c = compile_constraint(loop, TOK, V)
        steps = (plain_steps(target, PROMPT, 3, GREEDY, _NoRng(), {EOS}, constraint=c) if drafter is None else
                 speculative_steps(target, drafter, PROMPT, 3, GREEDY, _NoRng(), {EOS}, FixedLength(4),
                                   constraint=c))
        res = drive(steps)
        assert res.stop_reason == "n_predict" and len(res.ids) == 3


def test_forced_tokens_are_drafted_and_verified():
    """The forced text is proposed as a one-hot draft and verified: accepted many per pass,
    and the output is plain constrained decoding's."""
    target, _ = fake_pair(V, 8, "good")
    d = ForcedDrafter(None, V)
    d.constrain(constraint("gbnf"))
    draft = d.propose(PROMPT, 4, _NoRng())
    assert draft.source == "forced" and draft.tokens and np.all(draft.q.max(axis=1) == 1.0)
    c = constraint("json")
    res = drive(speculative_steps(target, ForcedDrafter(None, V), PROMPT, 12, GREEDY, _NoRng(), {EOS},
                                  FixedLength(4), constraint=c))
    want = plain(target, "json", 12, GREEDY, _NoRng())
    assert (res.ids, res.stop_reason) == (want.ids, want.stop_reason)
    assert res.stats.by_drafter["forced"].n_accepted >= 3 and res.stats.tokens_per_step > 1
    assert c.n_masks > 0 and c.mask_s > 0


def test_masked_keeps_shapes_and_forbids():
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    m = np.array([[True, False, True], [False, False, True]])
    out = masked(x, m)
    assert out.shape == x.shape and np.isneginf(out[0, 1]) and out[1, 2] == 5.0
    assert np.isneginf(masked(np.zeros(5, np.float32), np.ones(3, bool))[3:]).all()

