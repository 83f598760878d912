"""The `specdec` extension of a response: how speculation produced each token.

Opt-in per request with `"specdec": {"tokens": true}` (clients that do not ask never see it).
A stream then carries, in the chunk of the text they spell, a top-level field

    "specdec": {"tokens": [{"id", "text", "kind", "step", "pos", "p", "q"}, ...],
                "steps":  [<trace record>, ...]}

and its last chunk adds `"summary"` (`specdec trace-report`'s numbers over the request's
records, by drafter, and the drafting used).  The step records are the request's `--trace`
records, field for field (docs/trace-format.md): the scheduler hands `Runner.steps` a
`TokenLog` as its trace sink.  A non-streamed response carries the whole field once.
docs/serve.md ("Watching speculation") documents every field.
"""
from __future__ import annotations

from dataclasses import asdict
from typing import Any

from ...speculation.trace import StepRecord

from ..report import summarize

KINDS = ("accepted", "predicted", "correction", "bonus", "sampled")


class TokenLog:
    """One request's tokens (`token(id, kind, start)` from on_token, start: the token's first
    character in the answer text) and verification steps (`write(record)`: a TraceSink),
    handed out by `take` as their text is released.  `text`: the request's text tracker
    (job._TextTracker: `.text` so far, `.sent` characters released to the client)."""

    def __init__(self, text, drafting: str = ""):
        self.text, self.drafting = text, drafting
        self.tokens: list[dict[str, Any]] = []
        self.starts: list[int] = []
        self.records: list[StepRecord] = []
        self._open = 0                      # first token of the step being verified
        self._sent_tokens = self._sent_steps = 0

    def token(self, token_id: int, kind: str, start: int) -> None:
        plain = kind == "sampled"
        self.tokens.append({"id": int(token_id), "text": "", "kind": kind,
                            "step": None if plain else len(self.records), "pos": None,
                            "p": None, "q": None})
        self.starts.append(int(start))
        if plain:
            self._open = len(self.tokens)

    def write(self, record: StepRecord) -> None:
        """The step's record: its tokens get their draft position and, accepted drafts, p(x)
        and q(x) (the record's p_x, q_x; a correction's or bonus token's are not recorded)."""
        self.records.append(record)
        for j, t in enumerate(self.tokens[self._open:]):
            t["pos"] = j + 1
            if j < record.n_accepted:
                t["p"], t["q"] = record.p_x[j], record.q_x[j]
        self._open = len(self.tokens)

    def take(self, final: bool = False) -> dict | None:
        """What the client has not had: the tokens whose text is all released (final: every
        token, cut to the final text) and the new step records; final adds the summary."""
        text, n = self.text.text, len(self.tokens)
        released = len(text) if final else self.text.sent
        i = self._sent_tokens
        while i < n and (final or self._end(i, text) <= released):
            start = min(self.starts[i], len(text))
            self.tokens[i]["text"] = text[start: max(start, min(self._end(i, text), len(text)))]
            i += 1
        out: dict[str, Any] = {}
        if i > self._sent_tokens:
            out["tokens"] = self.tokens[self._sent_tokens: i]
        if len(self.records) > self._sent_steps:
            out["steps"] = [asdict(r) for r in self.records[self._sent_steps:]]
        self._sent_tokens, self._sent_steps = i, len(self.records)
        if final:
            out["summary"] = self.summary()
        return out or None

    def _end(self, i: int, text: str) -> int:
        return self.starts[i + 1] if i + 1 < len(self.starts) else len(text)

    def summary(self) -> dict:
        """trace-report's numbers over the records (report.summarize), the drafters' shares
        and the drafting the request used (DraftOptions.describe)."""
        s = summarize(self.records)
        by: dict[str, dict[str, int]] = {}
        for r in self.records:
            d = by.setdefault(r.source, {"steps": 0, "drafted": 0, "accepted": 0})
            d["steps"] += 1
            d["drafted"] += r.n_nodes or len(r.drafted)
            d["accepted"] += r.n_accepted
        kinds = {k: sum(t["kind"] == k for t in self.tokens) for k in KINDS}
        return {**s, "by_source": by, "kinds": kinds, "drafting": self.drafting}


class ExtBuffer:
    """The stream side: extension data gathered between text chunks, attached to the next
    one; the summary waits for the last chunk."""

    def __init__(self):
        self.tokens: list = []
        self.steps: list = []
        self.summary: dict | None = None

    def add(self, value: dict) -> None:
        self.tokens += value.get("tokens", ())
        self.steps += value.get("steps", ())
        self.summary = value.get("summary", self.summary)

    def attach(self, chunk: dict, last: bool = False) -> dict:
        ext: dict[str, Any] = {}
        if self.tokens:
            ext["tokens"] = self.tokens
        if self.steps:
            ext["steps"] = self.steps
        if last and self.summary is not None:
            ext["summary"] = self.summary
        if ext:
            chunk["specdec"] = ext
            self.tokens, self.steps = [], []
        return chunk


def whole(job, response: dict) -> dict:
    """A non-streamed response with the request's whole extension field (if asked for)."""
    log = getattr(job, "tokenlog", None)
    if log is not None:
        response["specdec"] = log.take(final=True)
    return response
