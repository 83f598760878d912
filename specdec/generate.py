"""Plain autoregressive generation, and the result type shared with speculative decoding.

The prompt is evaluated in one batch, then one token at a time: sample from the last row of
logits, append, evaluate that token.  Generation stops at an end-of-generation id (which is
not included in the output), after n_predict tokens, or when the context window is full.

Timing convention (shared with specdec.speculative): prompt_s is the batched prompt
evaluation; decode_s is everything after it, sampling included; tokens_per_s is the number of
generated tokens over decode_s.

Naming, as in every module: p is the target's distribution (here the only model's), q the
draft's (none here).
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Collection, Protocol, Sequence

import numpy as np

from .errors import ConfigError, ContextOverflowError
from .sampling import Rng, SamplerParams, sample

if TYPE_CHECKING:
    from .speculative import SpecStats

OnToken = Callable[[int, str], None]   # (token_id, kind); kind: 'sampled' | 'accepted' | 'correction' | 'bonus'


class Session(Protocol):
    """What generation needs from a model session (specdec.model.Session)."""
    n_vocab: int
    n_ctx: int
    n_past: int

    def eval(self, tokens: Sequence[int], last_only: bool = False) -> np.ndarray:
        """Append tokens at n_past..; logits (M, n_vocab) float32, or (1, n_vocab) if last_only."""

    def truncate(self, n: int) -> None: ...

    def reset(self) -> None: ...


@dataclass(frozen=True)
class Timings:
    prompt_s: float
    decode_s: float
    tokens_per_s: float


@dataclass(frozen=True)
class GenerationResult:
    ids: list[int]                  # generated token ids, end-of-generation id excluded
    n_prompt: int
    timings: Timings
    stop_reason: str                # 'eog' | 'n_predict' | 'ctx_full'
    stats: "SpecStats | None" = None


def check_request(session: Session, prompt_ids: Sequence[int], n_predict: int) -> None:
    """One-line errors for requests that cannot start."""
    if len(prompt_ids) == 0:
        raise ConfigError("the prompt is empty: at least one token is needed")
    if n_predict < 0:
        raise ConfigError(f"--n-predict must be >= 0, got {n_predict}")
    if len(prompt_ids) > session.n_ctx:
        raise ContextOverflowError(
            f"prompt of {len(prompt_ids)} tokens does not fit --ctx-size {session.n_ctx}")


def make_timings(prompt_s: float, decode_s: float, n_generated: int) -> Timings:
    return Timings(prompt_s, decode_s, n_generated / decode_s if decode_s > 0 else 0.0)


def kept_prefix(session: Session, prompt_ids: Sequence[int], n_keep: int) -> int:
    """How many cached prompt rows a request reuses: the session is trusted to hold the KV rows
    of prompt_ids[:n_keep] from an earlier request (a conversation's previous turns); at least
    the last prompt id is always evaluated again, since its logits start the generation."""
    if not 0 <= n_keep <= session.n_past:
        raise ValueError(f"n_keep={n_keep}, but the session holds {session.n_past} tokens")
    return min(int(n_keep), len(prompt_ids) - 1)


def generate_plain(session: Session, prompt_ids: Sequence[int], n_predict: int,
                   params: SamplerParams, rng: Rng, eog_ids: Collection[int],
                   on_token: OnToken | None = None, *, n_keep: int = 0) -> GenerationResult:
    """Sample up to n_predict tokens from the session's model, one forward pass per token.

    n_keep > 0 resumes: the session's first n_keep rows are prompt_ids[:n_keep] (see
    `kept_prefix`) and only the rest of the prompt is evaluated; the output is unchanged."""
    check_request(session, prompt_ids, n_predict)
    keep = kept_prefix(session, prompt_ids, n_keep)
    session.truncate(keep)
    ids: list[int] = []
    if n_predict == 0:
        return GenerationResult(ids, len(prompt_ids), make_timings(0.0, 0.0, 0), "n_predict")
    t0 = time.perf_counter()
    logits = session.eval(list(prompt_ids[keep:]), last_only=True)[-1]   # (V,)
    t1 = time.perf_counter()
    stop = "n_predict"
    while True:
        token = sample(logits, params, rng)
        if token in eog_ids:
            stop = "eog"
            break
        ids.append(token)
        if on_token is not None:
            on_token(token, "sampled")
        if len(ids) >= n_predict:
            break
        if session.n_past >= session.n_ctx:
            stop = "ctx_full"
            break
        logits = session.eval([token])[-1]                            # (V,)
    t2 = time.perf_counter()
    return GenerationResult(ids, len(prompt_ids), make_timings(t1 - t0, t2 - t1, len(ids)), stop)
