"""The server's table of draft caps under load: greedy requests draft at most
`DraftCaps.cap(batch size)` tokens per step (applied by speculation/underload.py's
`LoadCappedPolicy`; greedy output does not depend on the draft length)."""
from __future__ import annotations

from ...errors import ConfigError

__all__ = ["DEFAULT_CAPS", "DEFAULT_LOOKUP_CAPS", "DraftCaps"]


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
