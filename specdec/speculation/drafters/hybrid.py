"""HybridDrafter: prompt lookup (or the suffix drafter) where it matches, the draft model
otherwise.

p is always the target's distribution, q the draft's.
"""
from __future__ import annotations

import copy
from typing import Sequence

from ...generation.sampling import Rng
from .base import Draft, DraftTree, Drafter
from .lookup import PromptLookupDrafter
from .draft_model import ModelDrafter
from .suffix import SuffixDrafter


class HybridDrafter(Drafter):
    """Prompt lookup when it has a match, the model drafter otherwise.  `lookup` may be a
    SuffixDrafter instead (same match / key_of / propose contract): then its store too.

    Which one drafts is a function of the context alone (never of the rng), so each draft is
    still x ~ q for the q it reports.  The model drafter's cache is not touched on lookup
    steps: its next `propose` rolls back to the common prefix with the context and evaluates
    everything it missed in one batch (ModelDrafter's lazy catch-up).

    use_model: False drafts with the lookup alone (the drafting plan's choice for a request,
    api/drafting.py); wait: a request's first steps (after `prefill`), until its answer has this
    many tokens, draft with the lookup only (key 'wait' when it has no match), so that the
    draft model's prompt pass never delays the first token and a short answer never pays it
    (0: the model from the first step, its prompt pass in `prefill`)."""

    WAIT = "wait"

    def __init__(self, lookup: PromptLookupDrafter | SuffixDrafter, model: ModelDrafter, *,
                 use_model: bool = True, wait: int = 0):
        if lookup.n_vocab != model.n_vocab:
            raise ValueError(f"hybrid drafter: lookup over {lookup.n_vocab} ids, model over {model.n_vocab}")
        self.lookup, self.model, self.n_vocab = lookup, model, model.n_vocab
        self.use_model, self.wait = bool(use_model), int(wait)
        self._by: Drafter | None = None               # who made the last proposal
        self._emitted: int | None = None              # tokens of the request's answer so far

    def planned(self, use_model: bool, wait: int, window: int | None) -> "HybridDrafter":
        """This drafter for one request as the drafting plan chose (api/drafting.py): its own
        use_model and wait, the draft model windowed and lazy (ModelDrafter.windowed); the
        same lookup and caches.  This one is left as it is (another request or turn may hold it)."""
        view = copy.copy(self)
        view.use_model, view.wait = bool(use_model), int(wait)
        view.model = self.model.windowed(window, lazy=True)
        return view

    @property
    def store(self):
        """The lookup's SuffixStore, or None (plain prompt lookup)."""
        return getattr(self.lookup, "store", None)

    def reset(self) -> None:
        self.lookup.reset()
        self.model.reset()
        self._by = None
        self._emitted = None

    def constrain(self, constraint) -> None:
        self.constraint = constraint
        self.lookup.constrain(constraint)
        self.model.constrain(constraint)

    def key(self, context_ids: Sequence[int]) -> str:
        """The lookup's key when it matches, else the model's."""
        hit = self.lookup.match(context_ids)
        if hit:
            return self.lookup.key_of(hit)
        return self.model.source if self._model_now() else self.WAIT

    def _model_now(self) -> bool:
        return self.use_model and (self.wait <= 0 or (self._emitted or 0) >= self.wait)

    def propose(self, context_ids: Sequence[int], n_max: int, rng: Rng) -> Draft:
        draft = self.lookup.propose(context_ids, n_max, rng)
        self._by = self.lookup
        if not draft.tokens and n_max > 0 and self._model_now():
            draft = self.model.propose(context_ids, n_max, rng)
            self._by = self.model
        return draft

    def propose_tree(self, context_ids: Sequence[int], n_max: int, k: int, rng: Rng) -> DraftTree:
        tree = self.lookup.propose_tree(context_ids, n_max, k, rng)
        self._by = self.lookup
        if not tree.tokens and n_max > 0 and self._model_now():
            tree = self.model.propose_tree(context_ids, n_max, k, rng)
            self._by = self.model
        return tree

    def prefill(self, context_ids: Sequence[int]) -> None:
        self._emitted = 0
        if self.use_model and self.wait <= 0:
            self.model.prefill(context_ids)

    def accept(self, n_accepted: int, next_token: int) -> None:
        self._emitted = (self._emitted or 0) + n_accepted + 1
        if self._by is not None:
            self._by.accept(n_accepted, next_token)
        self._by = None
