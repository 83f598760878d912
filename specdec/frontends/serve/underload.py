"""How `specdec serve` drafts under load, without changing a token: greedy requests draft at
most `DraftCaps.cap(batch size)` tokens per step (`LoadCappedPolicy`; greedy output does not
depend on the draft length), and a draft model's prompt pass waits for its first proposal
(`LazyPrefill`) instead of running unbatched while the whole batch waits."""
from __future__ import annotations

from typing import Callable

from ...errors import ConfigError
from ...speculation.drafters import Draft, Drafter
from ...speculation.policies import DraftPolicy, StepFeedback


# From the measured cost t(M) of a target pass over M rows and d of a draft token (run per
# request, unbatched; the figures: docs/serve.md, "Drafting under load"): a
# step of B sequences drafting n each costs about t(B·(n+1)) + B·n·d and emits
# B·(1 - a^(n+1)) / (1 - a); the caps maximise that for acceptance a = 0.6..0.8
# (docs/serve.md, "Drafting under load").  batch size from -> most drafted tokens per greedy
# step (None: the request's own policy, uncapped).
DEFAULT_CAPS: dict[int, int | None] = {1: None, 2: 0}                       # a draft model


DEFAULT_LOOKUP_CAPS: dict[int, int | None] = {1: None, 2: 4, 3: 3, 4: 2, 5: 1, 8: 0}   # free drafts


class DraftCaps:
    """batch size -> most tokens a greedy request drafts per step: the entry of the largest
    batch size <= B (None: the request's own policy, uncapped).  One table for requests that
    draft with a model (model, hybrid), one for prompt lookup, whose drafts cost ~nothing."""

    def __init__(self, table: dict[int, int | None] | None = None,
                 lookup: dict[int, int | None] | None = None):
        self.table = self._norm(DEFAULT_CAPS if table is None else table)
        self.lookup = self._norm(DEFAULT_LOOKUP_CAPS if lookup is None else lookup)

    @staticmethod
    def _norm(t: dict[int, int | None]) -> dict[int, int | None]:
        return dict(sorted({1: None, **t}.items()))

    @staticmethod
    def parse_table(text: str, flag: str = "--draft-caps") -> dict[int, int | None]:
        """'1:-,2:4,4:2,8:0' (B:cap pairs; '-' or -1: uncapped)."""
        table: dict[int, int | None] = {}
        for part in filter(None, (p.strip() for p in text.split(","))):
            b, sep, c = part.partition(":")
            try:
                bi = int(b)
                ci = None if c.strip() in ("-", "-1") else int(c)
            except ValueError:
                bi, ci, sep = 0, 0, ""
            if not sep or bi < 1 or (ci is not None and ci < 0):
                raise ConfigError(f"{flag} takes B:N pairs like 1:-,2:4,4:0; got {part!r}")
            table[bi] = ci
        return table

    @classmethod
    def parse(cls, text: str | None, lookup: str | None = None) -> "DraftCaps":
        return cls(None if text is None else cls.parse_table(text),
                   None if lookup is None else cls.parse_table(lookup, "--lookup-caps"))

    def cap(self, batch_size: int, lookup: bool = False) -> int | None:
        c = None
        for b, v in (self.lookup if lookup else self.table).items():
            if b <= batch_size:
                c = v
        return c


class LoadCappedPolicy(DraftPolicy):
    """A greedy request's own policy, its next_n capped by the scheduler's current batch size
    (greedy output does not depend on the draft length, so the tokens are unchanged)."""

    def __init__(self, inner: DraftPolicy, cap: Callable[[str | None], int | None],
                 on_capped: Callable[[], None]):
        self.inner, self.cap, self.on_capped = inner, cap, on_capped    # cap(the step's key)
        self.n_max, self.p_min = inner.n_max, inner.p_min
        self.key: str | None = None

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

    def key(self, context_ids):
        return self.inner.key(context_ids)
