"""The draft model's KV cache seen as the ids it holds: one mirror for the drafters that run a
model on their own session (model.py's ModelDrafter, retok.py's RetokenizingDrafter).

The session's cache rows are exactly ``ids`` (len(ids) == n_past): a drafter finds how much of
a new context the cache already holds (``keep``), rolls the rest back and feeds only the new ids.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from ...generation.interfaces import Session


class CacheMirror:
    """A session and the ids its KV cache holds, kept in step."""

    def __init__(self, session: Session):
        self.session = session
        self.ids: list[int] = []                     # ids in the cache, len == n_past
        self.origin: int | None = None               # where in the context ids[0] sits (a window's start)
        session.reset()

    def reset(self) -> None:
        self.session.reset()
        self.ids = []
        self.origin = None

    def eval(self, ids: list[int]) -> np.ndarray:
        """Feed ids after the cache; the logits after the last of them (n_logits,)."""
        logits = self.session.eval(ids, last_only=True)[-1]
        self.ids.extend(ids)
        return logits

    def truncate(self, n: int) -> None:
        """Keep the first n rows (no-op when the cache holds n or fewer)."""
        if n < len(self.ids):
            self.session.truncate(n)
            del self.ids[n:]

    def keep(self, ids: Sequence[int], limit: int) -> int:
        """Roll the cache back to its common prefix with ids (at most limit rows); its length."""
        n = common_prefix(self.ids, list(ids), limit)
        self.truncate(n)
        return n


def common_prefix(a: list[int], b: list[int], limit: int) -> int:
    """Length of the longest common prefix of a and b, at most limit."""
    n = min(len(a), len(b), limit)
    if a[:n] == b[:n]:
        return n
    diff = np.flatnonzero(np.asarray(a[:n]) != np.asarray(b[:n]))
    return int(diff[0])
