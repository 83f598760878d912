"""Token sampling: the warped next-token distribution and the two random primitives.

`probs(logits, params)` turns one row of logits into the distribution a token is drawn from,
with llama.cpp's common sampler chain and order:

    top-k  ->  top-p  ->  min-p  ->  temperature  ->  softmax

Exact rules (llama.cpp src/llama-sampling.cpp), V = vocabulary size:
  top-k   k <= 0 or k >= V: off.  Keep the k highest logits; ties at the k-th value go to
          the lowest token ids (llama.cpp leaves tie order to std::partial_sort).
  top-p   p >= 1: off.  Softmax at temperature 1 over the top-k survivors, sorted by
          descending logit (ties: lowest id first); keep the shortest prefix whose cumulative
          probability is >= p (the token that crosses p is kept; at least one token is kept).
  min-p   m <= 0: off.  Keep the tokens with logit >= max_logit + log(m), i.e. prob >= m *
          max_prob at temperature 1.  The maximum always survives top-k and top-p, so min-p
          may be computed before or after top-p: both keep a prefix of the same sorted order.
  temp    T <= 0: greedy, a one-hot on the argmax (lowest id wins ties); the filters above
          never remove the argmax, so they do not matter then.  T > 0: softmax(logit / T)
          over the survivors; every other token gets probability exactly 0.
Thresholds are computed in float64 (llama.cpp uses float32), so a token sitting exactly on a
top-p / min-p boundary may be decided differently; nothing else differs.

Randomness: every random decision in specdec goes through an injected object with exactly two
methods, `bernoulli(prob) -> bool` and `categorical(probs) -> int` (the `Rng` protocol).
`NumpyRandom` is the production implementation; tests substitute an enumerating one that
explores every branch.  Both primitives are deterministic when there is nothing to decide:
bernoulli(0) / bernoulli(1) and a categorical with a single non-zero entry consume nothing.

Naming, kept throughout specdec: p is always the target model's distribution, q the draft's.
This module only builds distributions; which model a row came from is the caller's business.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from ..errors import ConfigError


class SamplingConfigError(ConfigError):
    """A sampling parameter is out of range."""


@dataclass(frozen=True)
class SamplerParams:
    """temperature 0 = greedy.  Defaults are llama.cpp's; 0 / 1.0 / 0 disable top_k / top_p / min_p."""
    temperature: float = 0.8
    top_k: int = 40
    top_p: float = 0.95
    min_p: float = 0.05

    def __post_init__(self) -> None:
        if not (math.isfinite(self.temperature) and self.temperature >= 0):
            raise SamplingConfigError(f"--temp must be >= 0, got {self.temperature}")
        if int(self.top_k) != self.top_k or self.top_k < 0:
            raise SamplingConfigError(f"--top-k must be an integer >= 0, got {self.top_k}")
        if not 0.0 <= self.top_p <= 1.0:
            raise SamplingConfigError(f"--top-p must be in [0, 1], got {self.top_p}")
        if not 0.0 <= self.min_p <= 1.0:
            raise SamplingConfigError(f"--min-p must be in [0, 1], got {self.min_p}")

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0


GREEDY = SamplerParams(temperature=0.0)


def softmax(logits: np.ndarray) -> np.ndarray:
    """Plain softmax at temperature 1, no filters.  (V,) -> (V,) float64."""
    x = np.asarray(logits, dtype=np.float64)          # (V,)
    e = np.exp(x - x.max())
    return e / e.sum()


def top_prob(logits: np.ndarray) -> float:
    """softmax(logits).max() without building the distribution: 1 / Σ exp(x − max x), the
    exponentials in float32 (the logits' precision), summed in float64.  (V,) -> float."""
    x = np.asarray(logits)
    return 1.0 / float(np.exp(x - x.max()).sum(dtype=np.float64))


def probs(logits: np.ndarray, params: SamplerParams) -> np.ndarray:
    """The warped distribution a token is sampled from.  logits (V,) -> (V,) float64, sums to 1."""
    x = np.asarray(logits, dtype=np.float64)          # (V,)
    if x.ndim != 1 or x.size == 0:
        raise ValueError(f"probs expects one row of logits, got shape {x.shape}")
    x_max = x.max()
    if not math.isfinite(x_max):
        raise ValueError("logits contain NaN or have no finite maximum")
    out = np.zeros(x.size, dtype=np.float64)          # (V,)
    if params.greedy:
        out[int(np.argmax(x))] = 1.0                  # np.argmax: first (lowest) index on ties
        return out
    keep = _survivors(x, params)                      # (m,) token ids, m >= 1
    z = x[keep] / params.temperature                  # (m,)
    e = np.exp(z - z.max())
    out[keep] = e / e.sum()
    return out


def probs_rows(logits: np.ndarray, params: SamplerParams) -> np.ndarray:
    """probs for every row.  logits (M, V) -> (M, V) float64.  Greedy rows are built in one
    pass over the float32 logits (the same argmax as probs: float32 -> float64 is exact and
    order-preserving); other settings go row by row through probs."""
    x = np.asarray(logits)
    if x.ndim != 2 or x.shape[1] == 0:
        raise ValueError(f"probs_rows expects (M, V) logits, got shape {x.shape}")
    if not params.greedy:
        return np.stack([probs(row, params) for row in x]) if len(x) else np.zeros(x.shape)
    if not np.all(np.isfinite(x.max(axis=1))):
        raise ValueError("logits contain NaN or have no finite maximum")
    out = np.zeros(x.shape, dtype=np.float64)         # (M, V)
    out[np.arange(len(x)), np.argmax(x, axis=1)] = 1.0
    return out


def _survivors(x: np.ndarray, params: SamplerParams) -> np.ndarray:
    """Token ids kept by top-k, top-p and min-p, in descending logit order.  (V,) -> (m,)."""
    cand = _top_k(x, params.top_k)                    # (k,) unsorted
    x_max = x.max()
    sel = cand
    if params.min_p > 0.0:
        sel = cand[x[cand] >= x_max + math.log(params.min_p)]
    sel = sel[np.lexsort((sel, -x[sel]))]             # descending logit, then ascending id
    if params.top_p < 1.0:
        xc = x[cand]                                  # top-p normalises over all top-k survivors
        log_z = x_max + math.log(np.exp(xc - x_max).sum())
        cum = np.cumsum(np.exp(x[sel] - log_z))       # (len(sel),)
        hit = np.flatnonzero(cum >= params.top_p)
        if hit.size:
            sel = sel[: hit[0] + 1]
    return sel


def _top_k(x: np.ndarray, k: int) -> np.ndarray:
    """Ids of the k largest logits, ties at the boundary to the lowest ids.  (V,) -> (k,)."""
    n = x.size
    if k <= 0 or k >= n:
        return np.arange(n)
    kth = x[np.argpartition(-x, k - 1)[k - 1]]        # the k-th largest value
    above = np.flatnonzero(x > kth)
    tied = np.flatnonzero(x == kth)                   # ascending ids
    return np.concatenate([above, tied[: k - above.size]])


class Rng(Protocol):
    """The only source of randomness in specdec."""

    def bernoulli(self, prob: float) -> bool: ...

    def categorical(self, probs: np.ndarray) -> int: ...


class NumpyRandom:
    """`Rng` backed by a numpy Generator; deterministic for a given seed."""

    def __init__(self, seed: int | np.random.Generator):
        self.gen = seed if isinstance(seed, np.random.Generator) else np.random.default_rng(seed)

    @classmethod
    def from_seed(cls, seed: int | None) -> "NumpyRandom":
        """A request's generator: seeded (an integer >= 0), or (None) from fresh OS entropy."""
        if seed is not None and (int(seed) != seed or seed < 0):
            raise SamplingConfigError(f"--seed must be an integer >= 0 (or -1 for a random one), got {seed}")
        return cls(np.random.SeedSequence(seed).generate_state(1)[0] if seed is None else seed)

    def bernoulli(self, prob: float) -> bool:
        if prob >= 1.0:
            return True
        if prob <= 0.0:
            return False
        return bool(self.gen.random() < prob)

    def categorical(self, probs: np.ndarray) -> int:
        """probs (V,) >= 0, any positive sum; never returns an id of probability 0."""
        w = np.asarray(probs, dtype=np.float64)       # (V,)
        nz = np.flatnonzero(w > 0)
        if nz.size == 0:
            raise ValueError("categorical: all probabilities are zero")
        if nz.size == 1:
            return int(nz[0])
        cum = np.cumsum(w[nz])                        # (nnz,)
        i = int(np.searchsorted(cum, self.gen.random() * cum[-1], side="right"))
        return int(nz[min(i, nz.size - 1)])


def sample(logits: np.ndarray, params: SamplerParams, rng: Rng) -> int:
    """One token from probs(logits, params).  logits (V,)."""
    return rng.categorical(probs(logits, params))
