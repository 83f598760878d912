"""The acceptance rule of speculative sampling.

Leviathan, Kalman, Matias 2023, "Fast Inference from Transformers via Speculative Decoding",
Algorithm 1; Chen et al. 2023, "Accelerating Large Language Model Decoding with Speculative
Sampling", Algorithm 2.  p is always the target's distribution, q the draft's.

Whatever q is, the token emitted at each position is distributed exactly as p (Leviathan et
al., Appendix A.1): accept x ~ q with probability min(1, p(x)/q(x)); on rejection draw from
the residual normalize(max(0, p - q)).  The probability of accepting at a position, given
that it is reached, is sum_x min(p(x), q(x)) = 1 - TV(p, q) ("alpha", Leviathan Def. 3.1).

Greedy decoding is the same code, not a special case: at temperature 0 both p and q are
one-hot (sampling.probs).  The drafted x is argmax q, so p(x)/q(x) = p(x) is 1 when x == argmax p
and 0 otherwise; bernoulli(1) / bernoulli(0) decide without randomness.  On rejection
max(0, p - q) is the one-hot of argmax p, and the bonus is drawn from the one-hot p: a
categorical with one non-zero entry, again without randomness.  So the rule reduces to
"accept while the draft equals the target's argmax, then emit the target's argmax".
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from ..errors import SpecdecError
from ..generation.sampling import Rng


class DraftProbabilityError(SpecdecError):
    """A drafted token has probability 0 under the distribution it was said to be drawn from."""


@dataclass(frozen=True)
class PositionRecord:
    """One verified draft position."""
    token: int            # x, the drafted token
    q_x: float            # q_i(x)
    p_x: float            # p_i(x)
    ratio: float          # p_i(x) / q_i(x)
    accept_prob: float    # min(1, ratio), the probability passed to rng.bernoulli
    accepted: bool


@dataclass(frozen=True)
class VerifyResult:
    n_accepted: int                       # drafted tokens kept, 0..n
    next_token: int                       # the token sampled after them
    kind: str                             # 'correction' (from the residual) | 'bonus' (from p_n)
    records: tuple[PositionRecord, ...]   # the positions actually verified, n_accepted (+1 if rejected)
    alpha: tuple[float, ...]              # (n,) predicted acceptance 1 - TV(p_i, q_i) per drafted position


def overlap(p: np.ndarray, q: np.ndarray) -> np.ndarray:
    """sum_x min(p(x), q(x)) = 1 - TV(p, q), over the last axis.  (..., V) -> (...)."""
    return np.minimum(p, q).sum(axis=-1)


def alphas(p: np.ndarray, q: np.ndarray, tokens: Sequence[int]) -> tuple[float, ...]:
    """overlap(p_i, q_i) for each drafted position i, p (n(+1), V), q (n, V).  Where q_i is
    one-hot on the drafted x_i (deterministic drafters, and every draft at temperature 0) it
    is min(1, p_i(x_i)) without a pass over the vocabulary."""
    return tuple(min(1.0, float(p[i, x])) if q[i, x] == 1.0 else float(overlap(p[i], q[i]))
                 for i, x in enumerate(tokens))


def residual(p_i: np.ndarray, q_i: np.ndarray) -> np.ndarray:
    """normalize(max(0, p_i - q_i)); p_i itself when that is all zero (only if p_i == q_i)."""
    r = np.maximum(p_i - q_i, 0.0)        # (V,)
    s = r.sum()
    return r / s if s > 0.0 else p_i


def try_token(x: int, q_i: np.ndarray, r: np.ndarray, rng: Rng, where: str) -> PositionRecord:
    """The acceptance step, shared by linear and tree verification: accept the drafted x
    (drawn from q_i) with probability min(1, r(x)/q_i(x)), r the target's distribution
    there (p_i, or a tree node's residual after rejected siblings).  One rng.bernoulli."""
    q_x, r_x = float(q_i[x]), float(r[x])
    if q_x <= 0.0:
        raise DraftProbabilityError(f"drafted token {x} at {where} has q(x) = 0")
    ratio = r_x / q_x
    accept_prob = min(1.0, ratio)
    return PositionRecord(int(x), q_x, r_x, ratio, accept_prob, bool(rng.bernoulli(accept_prob)))


def verify(draft_tokens: Sequence[int], q: np.ndarray, p: np.ndarray, rng: Rng) -> VerifyResult:
    """Verify n drafted tokens against the target (Leviathan et al. 2023, Algorithm 1).

    draft_tokens (n,); q (n, V): the draft's distribution each token was drawn from;
    p (n+1, V): the target's distribution at each drafted position plus one beyond.
    Random decisions: one rng.bernoulli per verified position, one rng.categorical at the end.
    """
    n = len(draft_tokens)
    if q.shape[0] != n or p.shape[0] != n + 1 or (n and q.shape[1] != p.shape[1]):
        raise ValueError(f"verify: shapes q {q.shape}, p {p.shape} do not fit {n} drafted tokens")
    alpha = alphas(p, q, draft_tokens)
    records: list[PositionRecord] = []
    for i, x in enumerate(draft_tokens):
        records.append(try_token(x, q[i], p[i], rng, f"position {i + 1}"))
        if not records[-1].accepted:                       # first rejection: resample, stop
            token = rng.categorical(residual(p[i], q[i]))
            return VerifyResult(i, int(token), "correction", tuple(records), alpha)
    return VerifyResult(n, int(rng.categorical(p[n])), "bonus", tuple(records), alpha)
