"""Plain autoregressive generation.

The prompt is evaluated in one batch, then one token at a time: sample from the last row of
logits, append, evaluate that token.  Generation stops at an end-of-generation id (which is
not included in the output), after n_predict tokens, when the context window is full, or
when `on_token` returns True (a front-end's stop string; the token is kept).

Written once, as a coroutine over target passes (`plain_steps` yields interfaces.Eval and is
sent the logits); `generate_plain` drives it alone, the server batches it with others.

Timing convention (shared with specdec.speculation.speculative): prompt_s is the batched prompt
evaluation; decode_s is everything after it, sampling included; tokens_per_s is the number of
generated tokens over decode_s.

Naming, as in every module: p is the target's distribution (here the only model's), q the
draft's (none here).
"""
from __future__ import annotations

import time
from typing import Collection, Sequence

from ..errors import ConfigError, ContextOverflowError
from .constraint import Constraint, masked
from .interfaces import Eval, GenerationResult, OnToken, Session, Steps, drive, make_timings
from .sampling import Rng, SamplerParams, sample


def check_request(session: Session, prompt_ids: Sequence[int], n_predict: int) -> None:
    """One-line errors for requests that cannot start."""
    if len(prompt_ids) == 0:
        raise ConfigError("the prompt is empty: at least one token is needed")
    if n_predict < 0:
        raise ConfigError(f"--n-predict must be >= 0, got {n_predict}")
    if len(prompt_ids) > session.n_ctx:
        raise ContextOverflowError(
            f"prompt of {len(prompt_ids)} tokens does not fit --ctx-size {session.n_ctx}")


def kept_prefix(session: Session, prompt_ids: Sequence[int], n_keep: int) -> int:
    """How many cached prompt rows a request reuses: the session is trusted to hold the KV rows
    of prompt_ids[:n_keep] from an earlier request (a conversation's previous turns); at least
    the last prompt id is always evaluated again, since its logits start the generation."""
    if not 0 <= n_keep <= session.n_past:
        raise ValueError(f"n_keep={n_keep}, but the session holds {session.n_past} tokens")
    return min(int(n_keep), len(prompt_ids) - 1)


def plain_steps(session: Session, prompt_ids: Sequence[int], n_predict: int,
                params: SamplerParams, rng: Rng, eog_ids: Collection[int],
                on_token: OnToken | None = None, *, n_keep: int = 0,
                constraint: Constraint | None = None) -> Steps:
    """The coroutine behind `generate_plain`: yields one Eval per target pass.  constraint:
    the output must fit it (constraint.py): each row's forbidden ids go to -inf before the
    sampler's filters, and generation ends ('eog') where the grammar allows nothing more."""
    check_request(session, prompt_ids, n_predict)
    keep = kept_prefix(session, prompt_ids, n_keep)
    session.truncate(keep)
    ids: list[int] = []
    if n_predict == 0:
        return GenerationResult(ids, len(prompt_ids), make_timings(0.0, 0.0, 0), "n_predict")
    t0 = time.perf_counter()
    logits = (yield Eval(session, list(prompt_ids[keep:]), True))[-1]      # (V,)
    t1 = time.perf_counter()
    stop = "n_predict"
    ends = frozenset(eog_ids) | (constraint.eos_ids if constraint is not None else frozenset())
    while True:
        if constraint is not None:
            logits = masked(logits, constraint.mask())                      # (V,)
        token = sample(logits, params, rng)
        if token in ends:
            stop = "eog"
            break
        ids.append(token)
        if constraint is not None:
            constraint.advance(token)
        if on_token is not None and on_token(token, "sampled"):
            stop = "stop"
            break
        if constraint is not None and constraint.done:
            stop = "eog"                                                    # nothing but its end may follow
            break
        if len(ids) >= n_predict:
            break
        if session.n_past >= session.n_ctx:
            stop = "ctx_full"
            break
        logits = (yield Eval(session, [token]))[-1]                         # (V,)
    t2 = time.perf_counter()
    return GenerationResult(ids, len(prompt_ids), make_timings(t1 - t0, t2 - t1, len(ids)), stop)


def generate_plain(session: Session, prompt_ids: Sequence[int], n_predict: int,
                   params: SamplerParams, rng: Rng, eog_ids: Collection[int],
                   on_token: OnToken | None = None, *, n_keep: int = 0,
                   constraint: Constraint | None = None) -> GenerationResult:
    """Sample up to n_predict tokens from the session's model, one forward pass per token.

    n_keep > 0 resumes: the session's first n_keep rows are prompt_ids[:n_keep] (see
    `kept_prefix`) and only the rest of the prompt is evaluated; the output is unchanged."""
    return drive(plain_steps(session, prompt_ids, n_predict, params, rng, eog_ids, on_token,
                             n_keep=n_keep, constraint=constraint))
