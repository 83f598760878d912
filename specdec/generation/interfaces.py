"""What the layers hand each other: the Session they drive, the step requests they yield and
the results they return.  A leaf module: it imports nothing from specdec, so the engine,
the drafters, the loops and the front-ends can all depend on it without a cycle.

p is always the target's distribution, q the draft's.

Generation is written once, as a coroutine over target passes (`plain.plain_steps`,
`speculative.speculative_steps`): each yields an `Eval` — "evaluate these ids on this
session" — and is sent back its logits.  `drive` runs one request alone, eval by eval; the
server's scheduler runs the pending Evals of many requests as one batched forward pass
(transformer.eval_batch).  Each row's logits are the same bits either way (the kernels are row
independent), so a request's answer never depends on who it shares a batch with.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Generator, NamedTuple, Protocol, Sequence

import numpy as np

# (token_id, kind) -> True to stop generation after this token (a stop string), else None/False;
# kind: 'sampled' | 'accepted' | 'predicted' | 'correction' | 'bonus'
#   ('predicted': an accepted draft token that came from the user's prediction)
OnToken = Callable[[int, str], "bool | None"]


@dataclass(frozen=True)
class Routing:
    """A mixture-of-experts model's routing: E experts, k of them per row, and the distinct
    experts per layer its last pass woke."""
    n_expert: int             # E
    n_used: int               # k
    woken: tuple[int, ...]    # (n_layer,) distinct experts per layer, last pass (() before any)


class Session(Protocol):
    """One model plus its own KV cache, as generation drives it (transformer.ModelSession is the
    engine's; tests substitute fakes)."""
    n_vocab: int              # V of the model
    n_logits: int             # logits computed per row: ids 0..n_logits-1 (<= n_vocab)
    n_ctx: int                # rows the cache holds
    n_past: int               # rows it holds now

    def eval(self, tokens: Sequence[int], last_only: bool = False) -> np.ndarray:
        """Append tokens at n_past..; logits (M, n_logits) float32, or (1, n_logits) if last_only."""

    def truncate(self, n: int) -> None:
        """Forget every row >= n (O(1))."""

    def reset(self) -> None:
        """truncate(0)."""

    def routing(self) -> Routing | None:
        """An MoE model's routing after its last pass; None for a dense model (this default)."""
        return None

    # multi-candidate verification (--draft-tree) also needs, on the target:
    #   eval_tree(tokens, parents) -> (T, n_logits): row i the logits after i's root-to-i path
    #   commit_path(node_ids): keep that path's rows after the cache, drop the rest of the tree


class Eval(NamedTuple):
    """A target pass a generation coroutine asks for: tokens appended to session's cache."""
    session: Session
    tokens: list[int]         # (M,) ids
    last_only: bool = False   # logits of the last row only


class EvalTree(NamedTuple):
    """A target pass over a token tree after the session's cache (multi-candidate
    verification): session.eval_tree(tokens, parents), logits (T, n_logits); the coroutine
    then keeps one path with session.commit_path."""
    session: Session
    tokens: list[int]         # (T,) ids
    parents: list[int]        # (T,) -1 (follows the cache) or an earlier node


Steps = Generator["Eval | EvalTree", np.ndarray, "GenerationResult"]   # yields passes, is sent their logits


def run_eval(ev: "Eval | EvalTree") -> np.ndarray:
    """One pass on its own session."""
    if isinstance(ev, EvalTree):
        return ev.session.eval_tree(ev.tokens, ev.parents)
    return ev.session.eval(ev.tokens, last_only=ev.last_only)


def drive(steps: Steps) -> "GenerationResult":
    """Run one generation coroutine alone: every Eval on its own session, in order."""
    try:
        ev = next(steps)
        while True:
            ev = steps.send(run_eval(ev))
    except StopIteration as done:
        return done.value


@dataclass(frozen=True)
class Timings:
    prompt_s: float
    decode_s: float
    tokens_per_s: float


def make_timings(prompt_s: float, decode_s: float, n_generated: int) -> Timings:
    return Timings(prompt_s, decode_s, n_generated / decode_s if decode_s > 0 else 0.0)


@dataclass(frozen=True)
class DrafterStats:
    """The steps one draft source proposed for (Draft.source)."""
    n_steps: int
    n_drafted: int
    n_verified: int
    n_accepted: int
    acceptance_rate: float              # n_accepted / n_drafted
    predicted_acceptance: float         # mean over verified positions of 1 - TV(p_i, q_i)
    measured_acceptance: float          # n_accepted / n_verified
    draft_s: float


@dataclass(frozen=True)
class SpecStats:
    n_generated: int                    # tokens emitted
    n_steps: int                        # verification steps (target forward passes)
    n_drafted: int                      # tokens proposed
    n_accepted: int                     # drafted tokens accepted by verification
    acceptance_rate: float              # n_accepted / n_drafted
    tokens_per_step: float              # n_generated / n_steps
    acceptance_by_position: tuple[float | None, ...]   # [j-1]: P(accept at j | j verified), j = 1..draft_n
    n_verified: int                     # drafted positions actually verified (reached)
    predicted_acceptance: float         # mean over verified positions of 1 - TV(p_i, q_i)
    measured_acceptance: float          # n_accepted / n_verified
    draft_s: float
    verify_s: float
    tokens_per_s: float                 # n_generated / decode time
    by_drafter: dict[str, DrafterStats] | None = None   # per Draft.source, steps with n_max > 0
    mean_draft_n: float = 0.0           # mean n the policy asked for (before budget caps)
    plan: str = ""                      # the drafting plan's choice and why (first step; last step)


@dataclass(frozen=True)
class GenerationResult:
    ids: list[int]                  # generated token ids, end-of-generation id excluded
    n_prompt: int
    timings: Timings
    stop_reason: str                # 'eog' | 'n_predict' | 'ctx_full' | 'stop' (a stop string)
    stats: SpecStats | None = None
