"""MTPDrafter: the target drafts for itself with its multi-token-prediction (`nextn`) block.

p is always the target's distribution, q the draft's.
"""
from __future__ import annotations

from typing import Sequence

from ...generation.interfaces import Session
from ...generation.sampling import Rng
from .base import Draft, Drafter, DraftTree
from .draft_model import ModelDrafter

SOURCE = "mtp"


class MTPDrafter(ModelDrafter):
    """ModelDrafter over an engine.mtp_session.MTPSession: the MTP block's rows read the target's
    hidden states (llama.cpp's draft-mtp, one head chained for n > 1: engine/mtp_session.py).

    q is probs(the block's logits over ids 0..n_logits-1, params), zero elsewhere, and each
    drafted token is drawn from it (greedy at temperature 0, as llama.cpp's MTP drafter), so
    the output law is the target's whatever the block predicts.

    `attach(target)` (the speculative loop, at the start of each request) points the block
    at the target session, which keeps its hidden rows by position from then on; no other
    hook is needed, so wrappers (hybrid, forced, prediction) need not forward anything.
    Before each proposal the MTP cache is rolled back to its settled rows (those fed the
    target's h): a drafted row was fed the block's own h' and is recomputed with the
    target's once the target has evaluated its predecessor.  The whole context is seen
    (a plan's prompt window does not apply: positions must be the target's).

    Trees: one branch (Drafter.propose_tree)."""

    source = SOURCE

    def attach(self, target: Session) -> None:
        self.session.attach(target)

    def view(self, context_ids: Sequence[int]) -> list[int]:
        self.origin = 0
        return list(context_ids)

    def propose(self, context_ids: Sequence[int], n_max: int, rng: Rng) -> Draft:
        self.cache.truncate(self.session.n_settled)
        return super().propose(context_ids, n_max, rng)

    def prefill(self, context_ids: Sequence[int]) -> None:
        self.cache.truncate(self.session.n_settled)
        super().prefill(context_ids)

    def propose_tree(self, context_ids: Sequence[int], n_max: int, k: int, rng: Rng) -> DraftTree:
        return Drafter.propose_tree(self, context_ids, n_max, k, rng)
