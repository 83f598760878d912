"""Exact output laws by enumeration: every random decision of a generation, taken both ways.

`PathRng` is an `Rng` (sampling.Rng: bernoulli, categorical) that follows a prescribed path
through the tree of random decisions; `enumerate_outcomes(run)` re-runs `run(rng)` once per
path, depth first, and adds up each outcome's probability: the exact law of what `run`
returns, for any code that draws its randomness from the rng it is given — sampling,
drafting, the acceptance rule.  Feasible on tiny vocabularies and a few tokens.

p is always the target's distribution, q the draft's.
"""
from __future__ import annotations

from typing import Callable, Sequence

import numpy as np


class PathRng:
    """An Rng that follows a prescribed path through the tree of random decisions.

    At a decision with 2+ possible outcomes it takes choice `path[i]` (0 once the path is
    exhausted) and records the options; deterministic decisions (bernoulli(0), bernoulli(1),
    a categorical with one non-zero entry) are not decision points.  `prob` is the product
    of the probabilities of the choices taken."""

    def __init__(self, path: Sequence[int]):
        self.path = list(path)
        self.taken: list[int] = []
        self.n_options: list[int] = []
        self.prob = 1.0

    def _choose(self, options: list[tuple[object, float]]):
        i = len(self.taken)
        k = self.path[i] if i < len(self.path) else 0
        self.taken.append(k)
        self.n_options.append(len(options))
        value, pr = options[k]
        self.prob *= pr
        return value

    def bernoulli(self, prob: float) -> bool:
        if prob >= 1.0:
            return True
        if prob <= 0.0:
            return False
        return bool(self._choose([(True, prob), (False, 1.0 - prob)]))

    def categorical(self, probs: np.ndarray) -> int:
        w = np.asarray(probs, dtype=np.float64)
        w = w / w.sum()
        nz = np.flatnonzero(w > 0)
        if nz.size == 1:
            return int(nz[0])
        return int(self._choose([(int(i), float(w[i])) for i in nz]))


def enumerate_outcomes(run: Callable[[PathRng], object]) -> dict[object, float]:
    """Exact law of run(rng)'s result: depth-first over every decision path, re-running from
    scratch for each path.  Returns {outcome: total probability}."""
    law: dict[object, float] = {}
    path: list[int] = []
    while True:
        rng = PathRng(path)
        outcome = run(rng)
        law[outcome] = law.get(outcome, 0.0) + rng.prob
        # next path: bump the deepest decision that still has an untried option
        j = len(rng.taken) - 1
        while j >= 0 and rng.taken[j] + 1 >= rng.n_options[j]:
            j -= 1
        if j < 0:
            return law
        path = rng.taken[:j] + [rng.taken[j] + 1]
