"""ForcedDrafter: under a constraint, the text the grammar forces next is drafted for free.

p is always the target's distribution, q the draft's.

Where the grammar leaves one way on (`{"name": "` after an object opens, a closing `"}`), the
constraint's `forced()` gives that text's canonical tokenization.  Those tokens are proposed
first, each with a one-hot q (a function of the context: exact for any q, Leviathan et al.
2023, A.1), and verified like any draft: where the model would have chosen another
tokenization of the same text, the target rejects the forced token and samples its own, so
the output law stays the target's masked law.  After them the wrapped drafter drafts on,
from the context extended by the forced tokens (the constraint advanced along them), up to
n_max tokens in all.  Without a constraint, or where nothing is forced, the wrapped drafter
alone (or, wrapping nothing, an empty draft).
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from ...generation.sampling import Rng
from .base import Draft, DraftTree, Drafter, one_hot_rows

SOURCE = "forced"


class ForcedDrafter(Drafter):
    """The grammar's forced tokens first, then `inner` (None: forced tokens alone)."""

    source = SOURCE

    def __init__(self, inner: Drafter | None, n_vocab: int | None = None):
        if inner is None and n_vocab is None:
            raise ValueError("ForcedDrafter needs n_vocab when it wraps no drafter")
        self.inner = inner
        self.n_vocab = int(n_vocab if n_vocab is not None else inner.n_vocab)
        if inner is not None and inner.n_vocab != self.n_vocab:
            raise ValueError(f"forced drafter over {self.n_vocab} ids, the wrapped one over {inner.n_vocab}")
        self._n_forced = 0
        self._by_inner = False

    @property
    def store(self):
        """The wrapped drafter's SuffixStore, if it has one."""
        return getattr(self.inner, "store", None)

    def constrain(self, constraint) -> None:
        self.constraint = constraint
        if self.inner is not None:
            self.inner.constrain(constraint)

    def forced(self, n_max: int) -> list[int]:
        """Up to n_max tokens the constraint forces after the context, those it allows."""
        c = self.constraint
        if c is None or n_max <= 0 or c.done:
            return []
        ff = c.forced()[:n_max]
        return ff[: c.n_allowed(ff)]

    def key(self, context_ids: Sequence[int]) -> str | None:
        if self.forced(1):
            return SOURCE
        return self.inner.key(context_ids) if self.inner is not None else None

    def propose(self, context_ids: Sequence[int], n_max: int, rng: Rng) -> Draft:
        ff = self.forced(n_max)
        self._n_forced, self._by_inner = len(ff), False
        if self.inner is None or len(ff) >= n_max:
            return Draft.one_hot(ff, self.n_vocab, SOURCE)
        if not ff:
            self._by_inner = True
            return self.inner.propose(context_ids, n_max, rng)
        c = self.constraint
        for x in ff:
            c.advance(x)
        try:
            rest = self.inner.propose([*context_ids, *ff], n_max - len(ff), rng)
        finally:
            c.rollback(len(ff))
        self._by_inner = True
        q = np.concatenate([one_hot_rows(ff, self.n_vocab), rest.q])        # (n, V)
        return Draft((*ff, *rest.tokens), q, SOURCE, rest.catchup_s)

    def propose_tree(self, context_ids: Sequence[int], n_max: int, k: int, rng: Rng) -> DraftTree:
        """Forced tokens as one branch when there are any, else the wrapped drafter's tree."""
        ff = self.forced(n_max)
        self._n_forced, self._by_inner = len(ff), False
        if ff or self.inner is None:
            return DraftTree.of(Draft.one_hot(ff, self.n_vocab, SOURCE))
        self._by_inner = True
        return self.inner.propose_tree(context_ids, n_max, k, rng)

    def accept(self, n_accepted: int, next_token: int) -> None:
        if self._by_inner:             # the wrapped drafter's share: what followed the forced tokens
            self.inner.accept(max(0, n_accepted - self._n_forced), next_token)
        self._by_inner = False

    def reset(self) -> None:
        if self.inner is not None:
            self.inner.reset()

    def prefill(self, context_ids: Sequence[int]) -> None:
        if self.inner is not None:
            self.inner.prefill(context_ids)
