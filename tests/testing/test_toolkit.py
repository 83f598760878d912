"""specdec.testing catches real mistakes and passes what is exact: drafters whose q rows lie
(sampled at one temperature, reported at another; rows shifted by a position), a verification
rule whose correction comes from p instead of the residual — and a deterministic draft with
one-hot q rows, exact whatever chose its tokens."""
from __future__ import annotations

import numpy as np
import pytest

import specdec
from specdec.speculation.drafters import Draft, Drafter, PromptLookupDrafter
from specdec.testing import (assert_greedy_identical, assert_same_law, check_drafter, output_law,
                             tiny_model)


def _law(n_vocab: int, position: int, temperature: float = 1.0) -> np.ndarray:
    """A fixed draft distribution per position: peaked on id (position mod V − 1)."""
    logits = -np.abs(np.arange(n_vocab) - position % (n_vocab - 1)).astype(np.float64)
    e = np.exp(logits / temperature)
    return e / e.sum()


class FixedLaws(Drafter):
    """Draws x_i ~ law_i (at temperature `drawn`) and reports rows `reported` (a bug switch)."""
    source = "fixed-laws"

    def __init__(self, n_vocab: int, drawn: float = 1.0, shift: int = 0):
        self.n_vocab, self.drawn, self.shift = n_vocab, drawn, shift

    def propose(self, context_ids, n_max, rng):
        tokens, q = [], np.zeros((n_max, self.n_vocab))
        for i in range(n_max):
            tokens.append(rng.categorical(_law(self.n_vocab, i, self.drawn)))
            q[i] = _law(self.n_vocab, i + self.shift)              # the rows it claims
        return Draft(tuple(tokens), q, self.source)


class Whatever(Drafter):
    """A deterministic draft (one-hot q rows) chosen any way at all: exact."""
    source = "whatever"

    def __init__(self, n_vocab: int):
        self.n_vocab = n_vocab

    def propose(self, context_ids, n_max, rng):
        tokens = [(sum(context_ids) * 7 + i) % self.n_vocab for i in range(n_max)]
        return Draft.one_hot(tokens, self.n_vocab, self.source)


@pytest.fixture(scope="module")
def tiny5(tmp_path_factory):
    return specdec.load(tiny_model(tmp_path_factory.mktemp("tk") / "t.gguf", n_vocab=5, d_model=16,
                                   d_ff=24, seed=1), n_ctx=64)


def test_exact_drafters_pass(tmp_path):
    check_drafter(lambda t: FixedLaws(t.config.n_vocab), workdir=tmp_path, seeds=(0,), n_tokens=2)
    check_drafter(lambda t: Whatever(t.config.n_vocab), workdir=tmp_path, seeds=(0,), n_tokens=2)
    check_drafter(lambda t: PromptLookupDrafter(t.config.n_vocab, ngram_min=1, ngram_max=2),
                  workdir=tmp_path, seeds=(0,), n_tokens=2)


@pytest.mark.parametrize("bug", [dict(drawn=2.0), dict(shift=1)], ids=["wrong-temperature", "shifted-rows"])
def test_lying_q_rows_are_caught_with_a_small_counterexample(tmp_path, bug):
    with pytest.raises(AssertionError, match="speculative law != plain law") as e:
        check_drafter(lambda t: FixedLaws(t.config.n_vocab, **bug), workdir=tmp_path, seeds=(0,))
    assert "draft_n 1" in str(e.value) or "draft_n 2" in str(e.value)   # found among the smallest


def test_a_correction_from_p_instead_of_the_residual_is_caught(tiny5, tmp_path, monkeypatch):
    other = specdec.load(tiny_model(tmp_path / "q.gguf", n_vocab=5, d_model=16, d_ff=24, seed=2), n_ctx=64)
    kw = dict(temperature=1.0, ignore_eos=True, draft=other, draft_n=2, draft_policy="fixed")
    assert_same_law(tiny5, [1, 2], 2, **kw)
    import specdec.speculation.verify as verify
    monkeypatch.setattr(verify, "residual", lambda p_i, q_i: p_i)
    with pytest.raises(AssertionError, match="outcome"):
        assert_same_law(tiny5, [1, 2], 2, **kw)


def test_output_law_is_a_distribution_and_greedy_identity(tiny5):
    law = output_law(tiny5, [1], 2, temperature=0.9, ignore_eos=True)
    assert abs(sum(law.values()) - 1.0) < 1e-12 and all(len(k[0]) == 2 for k in law)
    assert_greedy_identical(tiny5, [[1], [2, 3]], 10, draft="prompt-lookup", draft_n=3, ignore_eos=True)
    assert_greedy_identical(tiny5, [[1]], 6, draft=Whatever(5), draft_n=2, draft_policy="fixed", ignore_eos=True)


def test_the_example_runs():
    import subprocess
    import sys
    from pathlib import Path
    root = Path(__file__).resolve().parents[2]
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                        str(root / "examples" / "test_my_drafter.py")], cwd=root, capture_output=True,
                       text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:]
