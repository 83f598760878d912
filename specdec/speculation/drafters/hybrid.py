"""HybridDrafter: prompt lookup (or the suffix drafter) where it matches, the draft model
otherwise.

p is always the target's distribution, q the draft's.
"""
from __future__ import annotations

from typing import Sequence

from ...generation.sampling import Rng
from .base import Draft, DraftTree, Drafter
from .lookup import PromptLookupDrafter
from .model import ModelDrafter
from .suffix import SuffixDrafter


class HybridDrafter(Drafter):
    """Prompt lookup when it has a match, the model drafter otherwise.  `lookup` may be a
    SuffixDrafter instead (same match / key_of / propose contract): then its store too.

    Which one drafts is a function of the context alone (never of the rng), so each draft is
    still x ~ q for the q it reports.  The model drafter's cache is not touched on lookup
    steps: its next `propose` rolls back to the common prefix with the context and evaluates
    everything it missed in one batch (ModelDrafter's lazy catch-up)."""

    def __init__(self, lookup: PromptLookupDrafter | SuffixDrafter, model: ModelDrafter):
        if lookup.n_vocab != model.n_vocab:
            raise ValueError(f"hybrid drafter: lookup over {lookup.n_vocab} ids, model over {model.n_vocab}")
        self.lookup, self.model, self.n_vocab = lookup, model, model.n_vocab
        self._by: Drafter | None = None               # who made the last proposal

    @property
    def store(self):
        """The lookup's SuffixStore, or None (plain prompt lookup)."""
        return getattr(self.lookup, "store", None)

    def reset(self) -> None:
        self.lookup.reset()
        self.model.reset()
        self._by = None

    def constrain(self, constraint) -> None:
        self.constraint = constraint
        self.lookup.constrain(constraint)
        self.model.constrain(constraint)

    def key(self, context_ids: Sequence[int]) -> str:
        """The lookup's key when it matches, else the model's."""
        hit = self.lookup.match(context_ids)
        return self.lookup.key_of(hit) if hit else self.model.source

    def propose(self, context_ids: Sequence[int], n_max: int, rng: Rng) -> Draft:
        draft = self.lookup.propose(context_ids, n_max, rng)
        self._by = self.lookup
        if not draft.tokens and n_max > 0:
            draft = self.model.propose(context_ids, n_max, rng)
            self._by = self.model
        return draft

    def propose_tree(self, context_ids: Sequence[int], n_max: int, k: int, rng: Rng) -> DraftTree:
        tree = self.lookup.propose_tree(context_ids, n_max, k, rng)
        self._by = self.lookup
        if not tree.tokens and n_max > 0:
            tree = self.model.propose_tree(context_ids, n_max, k, rng)
            self._by = self.model
        return tree

    def prefill(self, context_ids: Sequence[int]) -> None:
        self.model.prefill(context_ids)

    def accept(self, n_accepted: int, next_token: int) -> None:
        if self._by is not None:
            self._by.accept(n_accepted, next_token)
        self._by = None
