"""Hypothesis strategies for a user's own property tests (needs `hypothesis`).

    tiny_specs()          keyword dicts for specdec.testing.tiny_model (arch, vocabulary, format, seed)
    prompts(n_vocab)      prompts as id lists
    sampling()            temperature / top_k / top_p / min_p keyword dicts (temperature > 0)
    drafting()            Model.generate drafting keywords without a draft model
                          (prompt lookup, suffix; lengths and policies)

    from hypothesis import given
    from specdec.testing import strategies as sds

    @given(prompt=sds.prompts(16), kw=sds.drafting())
    def test_mine(model, prompt, kw):
        assert_greedy_identical(model, [prompt], 12, **kw)
"""
from __future__ import annotations

from hypothesis import strategies as st

from . import ARCHS, QUANTS


def tiny_specs(max_vocab: int = 24) -> st.SearchStrategy[dict]:
    return st.fixed_dictionaries({
        "arch": st.sampled_from(ARCHS), "n_vocab": st.integers(4, max_vocab),
        "quant": st.sampled_from(sorted(q for q in QUANTS if not q.endswith("_k")) + ["q4_k"]),
        "seed": st.integers(0, 2**16)})


def prompts(n_vocab: int, max_len: int = 8) -> st.SearchStrategy[list[int]]:
    """Id lists over 0 … n_vocab − 2 (the last id ends generation)."""
    return st.lists(st.integers(0, n_vocab - 2), min_size=1, max_size=max_len)


def sampling() -> st.SearchStrategy[dict]:
    return st.fixed_dictionaries({"temperature": st.floats(0.6, 1.5), "top_k": st.sampled_from([0, 0, 2, 3]),
                                  "top_p": st.sampled_from([1.0, 0.9, 0.7]),
                                  "min_p": st.sampled_from([0.0, 0.05, 0.2])})


def drafting() -> st.SearchStrategy[dict]:
    return st.fixed_dictionaries({"draft": st.sampled_from(["prompt-lookup", "suffix"]),
                                  "draft_n": st.integers(1, 8),
                                  "draft_policy": st.sampled_from(["fixed", "threshold", "adaptive"]),
                                  "lookup_ngram_min": st.integers(1, 2)})
