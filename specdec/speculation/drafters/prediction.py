"""Predicted outputs: the user's own draft of the answer (OpenAI's `prediction`, an editor's
copy of the file it asks to edit), proposed run by run while the output follows it.

p is always the target's distribution, q the draft's.
"""
from __future__ import annotations

import bisect
from typing import Sequence

from ...generation.sampling import Rng
from .base import Draft, DraftTree, Drafter

SOURCE = "prediction"


def accepted_kind(source: str) -> str:
    """How on_token names an accepted draft token of this Draft.source (interfaces.OnToken):
    'predicted' when it came from the user's prediction, else 'accepted'."""
    return "predicted" if source == SOURCE else "accepted"


class PredictionIndex:
    """Where each n-gram (1 <= n <= n_max) of the predicted ids ends, ascending: the lookup
    behind re-alignment.  Built once per request: O(len(ids) · n_max) tuples."""

    def __init__(self, ids: Sequence[int], n_max: int):
        self.ids, self.n_max = [int(t) for t in ids], int(n_max)
        self._ends: dict[tuple[int, ...], list[int]] = {}
        for e in range(1, len(self.ids) + 1):
            for n in range(1, min(self.n_max, e) + 1):
                self._ends.setdefault(tuple(self.ids[e - n: e]), []).append(e)

    def ends(self, gram: tuple[int, ...]) -> list[int]:
        """Every end (exclusive) of gram in the prediction, ascending (do not modify)."""
        return self._ends.get(gram, [])


class PredictionDrafter(Drafter):
    """Drafts the predicted tokens that follow the output's position in the prediction.

    A cursor into the prediction is kept aligned with the output: it starts at 0 (the answer
    is expected to start as predicted) and advances while the output repeats the prediction.
    When the output leaves it (an edit), the drafter re-aligns on the longest suffix of the
    output (up to ALIGN_MAX tokens) found in the prediction: first at or after the cursor
    (the nearest occurrence; a one-token match only within NEAR tokens of it, as after a short
    deletion), then anywhere (the occurrence nearest the cursor, at least ANYWHERE_MIN tokens);
    without an alignment it drafts nothing.  Where it has nothing to offer, `fallback` (the
    request's other drafting: prompt lookup, the suffix store, the draft model) proposes.

    Keys: 'prediction/<run>', the bucket of the evidence behind the cursor — how many output
    tokens in a row agree with the prediction up to it (the match re-aligned on, grown by every
    token that followed it; 'start' before the first) — so the length policy learns per bucket
    how far a prediction holds: long runs of a right one, short spurious matches of a wrong one.

    q rows are one-hot on the predicted tokens: a draft is a deterministic function of the
    context seen so far, so it is exactly "x ~ q" and verification keeps the target's law
    (Leviathan et al. 2023, Algorithm 1), whatever the prediction says.  The output starts
    where the first context this drafter sees after `reset` ends (the prompt)."""

    source = SOURCE
    BUCKETS = ((16, "16+"), (8, "8-15"), (3, "3-7"), (1, "1-2"), (0, "start"))  # run -> key
    ALIGN_MAX = 12        # longest output suffix re-alignment looks up
    NEAR = 8              # a one-token re-alignment lands at most this far after the cursor
    ANYWHERE_MIN = 3      # shortest match re-aligning before the cursor

    def __init__(self, prediction_ids: Sequence[int], n_vocab: int, fallback: Drafter | None = None):
        if fallback is not None and fallback.n_vocab != n_vocab:
            raise ValueError(f"prediction drafter over {n_vocab} ids, its fallback over {fallback.n_vocab}")
        self.index = PredictionIndex(prediction_ids, self.ALIGN_MAX)
        self.pred = self.index.ids
        self.n_vocab, self.fallback = int(n_vocab), fallback
        self._clear()

    @property
    def store(self):
        """The fallback's SuffixStore, if it has one."""
        return getattr(self.fallback, "store", None)

    def reset(self) -> None:
        self._clear()
        if self.fallback is not None:
            self.fallback.reset()

    def _clear(self) -> None:
        self._start: int | None = None      # where the output starts in the context
        self._seen = 0                      # context length the cursor is aligned with
        self._cursor: int | None = 0        # next predicted index, None: not aligned
        self._last = 0                      # the latest cursor held (re-alignment looks after it)
        self._run = 0                       # output tokens in a row that agree up to the cursor
        self._by: Drafter | None = None     # who made the last proposal

    # -- alignment -----------------------------------------------------------------------
    def cursor(self, context_ids: Sequence[int]) -> int | None:
        """The prediction index aligned with the end of this context (None: no alignment)."""
        L = len(context_ids)
        if self._start is None or L < self._seen:
            self._start, self._seen, self._cursor, self._last, self._run = L, L, 0, 0, 0
        if L == self._seen:
            return self._cursor
        new = [int(t) for t in context_ids[self._seen: L]]
        c = self._cursor
        if c is not None and self.pred[c: c + len(new)] == new:
            self._cursor, self._run = c + len(new), self._run + len(new)
        else:
            self._cursor, self._run = self._realign(context_ids[self._start: L])
        self._seen = L
        if self._cursor is not None:
            self._last = self._cursor
        return self._cursor

    def _realign(self, out: Sequence[int]) -> tuple[int | None, int]:
        """(the cursor after the output `out`, the match length) by the class docstring's
        rule, or (None, 0)."""
        longest = min(self.ALIGN_MAX, len(out))
        tail = tuple(int(t) for t in out[len(out) - longest:])
        for n in range(longest, 0, -1):
            ends = self.index.ends(tail[longest - n:])
            i = bisect.bisect_left(ends, self._last)
            if i < len(ends) and (n > 1 or ends[i] - self._last <= self.NEAR):
                return ends[i], n
        for n in range(longest, self.ANYWHERE_MIN - 1, -1):
            ends = self.index.ends(tail[longest - n:])
            if ends:
                return ends[-1], n                  # all before the cursor: the nearest one
        return None, 0

    def tokens(self, context_ids: Sequence[int], n_max: int) -> list[int]:
        """The predicted ids `propose` drafts after this context (empty without alignment)."""
        c = self.cursor(context_ids)
        return [] if c is None or n_max <= 0 else self.pred[c: c + n_max]

    # -- the Drafter hooks ---------------------------------------------------------------
    def key(self, context_ids: Sequence[int]) -> str | None:
        """'prediction/<run bucket>' when the prediction drafts the next step (class
        docstring), else the fallback's key."""
        if self.tokens(context_ids, 1):
            return f"{SOURCE}/" + next(name for lo, name in self.BUCKETS if self._run >= lo)
        return self.fallback.key(context_ids) if self.fallback is not None else f"{SOURCE}/none"

    def propose(self, context_ids: Sequence[int], n_max: int, rng: Rng) -> Draft:
        tokens = self.tokens(context_ids, n_max)
        self._by = None
        if not tokens and self.fallback is not None and n_max > 0:
            self._by = self.fallback
            return self.fallback.propose(context_ids, n_max, rng)
        return Draft.one_hot(tokens, self.n_vocab, SOURCE)

    def propose_tree(self, context_ids: Sequence[int], n_max: int, k: int, rng: Rng) -> DraftTree:
        if self.tokens(context_ids, n_max) or self.fallback is None:
            self._by = None
            return DraftTree.of(self.propose(context_ids, n_max, rng))
        self._by = self.fallback
        return self.fallback.propose_tree(context_ids, n_max, k, rng)

    def constrain(self, constraint) -> None:
        self.constraint = constraint
        if self.fallback is not None:
            self.fallback.constrain(constraint)

    def prefill(self, context_ids: Sequence[int]) -> None:
        self.cursor(context_ids)                    # the output starts after the prompt
        if self.fallback is not None:
            self.fallback.prefill(context_ids)

    def accept(self, n_accepted: int, next_token: int) -> None:
        if self._by is not None:
            self._by.accept(n_accepted, next_token)
        self._by = None
