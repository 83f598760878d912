"""The drafter interface: a `Draft` (tokens and the q rows they were drawn from) and the
`Drafter` base class every drafter derives from (see the package docstring).

p is always the target's distribution, q the draft's.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from ...sampling import Rng


@dataclass(frozen=True)
class Draft:
    tokens: tuple[int, ...]     # (n,) drafted ids
    q: np.ndarray               # (n, V) float64: q[i] is the distribution tokens[i] was drawn from
    source: str = "none"        # which drafter proposed: 'model' | 'prompt-lookup' | ...

    @staticmethod
    def empty(n_vocab: int, source: str = "none") -> "Draft":
        return Draft((), np.zeros((0, n_vocab), dtype=np.float64), source)


class Drafter:
    """Base of every drafter.  Subclasses implement `propose` and set `n_vocab` (V of the q
    rows: the target's vocabulary size); the hooks default to doing nothing."""
    n_vocab: int
    source = "none"             # Draft.source of what it proposes

    def propose(self, context_ids: Sequence[int], n_max: int, rng: Rng) -> Draft:
        """0 <= n <= n_max tokens after the context, each with the q row it was drawn from."""
        raise NotImplementedError

    def accept(self, n_accepted: int, next_token: int) -> None:
        """The target verified the last proposal: n_accepted of it stand, then next_token."""

    def reset(self) -> None:
        """Forget every request (a new one follows)."""

    def prefill(self, context_ids: Sequence[int]) -> None:
        """The drafter's share of the prompt phase (timed with the target's prefill)."""

    def key(self, context_ids: Sequence[int]) -> str | None:
        """The kind of draft the next `propose` on this context makes (a function of the
        context alone), for per-kind policy statistics; None: no kinds."""
        return None
