"""Drafting under a batch, without changing a token: a greedy request's policy capped by the
batch size (`LoadCappedPolicy`; greedy output does not depend on the draft length) and a
drafter whose prompt pass waits for its first proposal (`LazyPrefill`).  The drafting plan
(api/drafting.py, `DraftPlan.request`) decides when each applies; the server's caps table is
frontends/serve/draft_caps.py's DraftCaps.

p is always the target's distribution, q the draft's.
"""
from __future__ import annotations

from typing import Callable

from .drafters import Draft, Drafter
from .policies import DraftPolicy, StepFeedback


class LoadCappedPolicy(DraftPolicy):
    """A greedy request's own policy, its next_n capped by the scheduler's current batch size
    (greedy output does not depend on the draft length, so the tokens are unchanged)."""

    def __init__(self, inner: DraftPolicy, cap: Callable[[str | None], int | None],
                 on_capped: Callable[[], None]):
        self.inner, self.cap, self.on_capped = inner, cap, on_capped    # cap(the step's key)
        self.n_max, self.p_min = inner.n_max, inner.p_min
        self.key: str | None = None

    @property
    def reason(self) -> str:
        return self.inner.reason

    def next_n(self) -> int:
        n, c = self.inner.next_n(), self.cap(self.key)
        if c is not None and n > c:
            self.on_capped()
            return c
        return n

    def reset(self) -> None:
        self.inner.reset()

    def prepare(self, key: str | None) -> None:
        self.key = key
        self.inner.prepare(key)

    def observe(self, fb: StepFeedback) -> None:
        self.inner.observe(fb)


class LazyPrefill(Drafter):
    """A drafter whose prompt phase is left to its first proposal.  A draft model's prefill
    would run inside the request's step, unbatched, while the whole batch waits, and under
    load a capped greedy request may never draft at all; its first `propose` catches the draft
    cache up on the whole context in one pass instead (ModelDrafter's lazy catch-up), which
    gives the same draft logits bit for bit (row independence) and draws nothing at random,
    so every request's tokens are unchanged."""

    def __init__(self, inner: Drafter):
        self.inner, self.n_vocab, self.source = inner, inner.n_vocab, inner.source

    def propose(self, context_ids, n_max: int, rng) -> Draft:
        return self.inner.propose(context_ids, n_max, rng)

    def propose_tree(self, context_ids, n_max: int, k: int, rng):
        return self.inner.propose_tree(context_ids, n_max, k, rng)

    def accept(self, n_accepted: int, next_token: int) -> None:
        self.inner.accept(n_accepted, next_token)

    def reset(self) -> None:
        self.inner.reset()

    def constrain(self, constraint) -> None:
        self.constraint = constraint
        self.inner.constrain(constraint)

    def key(self, context_ids):
        return self.inner.key(context_ids)
