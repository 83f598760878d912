"""One request as the scheduler runs it (`Job`) and what it gives back: its tokens turned into
events as they come (text held back while a stop string may still begin in it, the logprobs
of the tokens emitted, the `specdec` token log), and how it ends (`JobResult`, or an error
such as `Cancelled`).  jobs.py makes a Job from an HTTP request; scheduler.py runs it.
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from ...api.request import DraftOptions
from ...errors import SpecdecError
from ...generation.interfaces import GenerationResult, OnToken
from ...generation.sampling import SamplerParams
from ...text.tokenizer import StreamDecoder
from .logprobs import RowCursor, TokenLogprob, token_logprob
from .tokenlog import TokenLog


class Cancelled(SpecdecError):
    """The client went away or the server stopped before the request finished."""


@dataclass
class Job:
    """One request as the scheduler runs it.  `on_event(kind, value)` is called from the
    scheduler thread: ('text', str) deltas as they are final — at most one per step, the
    tokens of a speculative step together — then exactly one of ('done', JobResult) or
    ('error', Exception); with stream False only the last of these (the text is in the
    result: no event per step crosses threads).  With `logprobs` set (the number of
    alternatives per token, 0..logprobs.MAX_TOP; None: none computed), each text delta is
    preceded by ('logprobs', [TokenLogprob, ...]): the tokens emitted since the last one
    (logprobs.py; post_sampling: of the sampler's warped distribution)."""
    prompt_ids: list[int]
    n_predict: int                          # -1: until end of generation or a full context
    params: SamplerParams
    draft: DraftOptions = DraftOptions()
    prediction: str | list[int] | None = None   # the predicted output (Runner.predict)
    constraint: Any = None                  # a ConstraintSpec the output follows (structured.py)
    seed: int | None = None
    stop: tuple[str, ...] = ()
    ignore_eos: bool = False
    stream: bool = True                     # text (and logprobs) events per step
    logprobs: int | None = None
    post_sampling: bool = False
    tokens: bool = False                    # the `specdec` extension: ('specdec', dict) events
    on_event: Callable[[str, object], None] | None = None
    id: int = 0
    submitted: float = field(default_factory=time.perf_counter)
    started: float = 0.0                    # when it got a slot
    cancelled: threading.Event = field(default_factory=threading.Event)
    finished: threading.Event = field(default_factory=threading.Event)
    result: "JobResult | None" = None
    error: Exception | None = None
    text_parts: list[str] = field(default_factory=list)
    token_logprobs: list[TokenLogprob] = field(default_factory=list)   # one per emitted token
    text_offsets: list[int] = field(default_factory=list)              # its first character
    _lp_sent: int = 0                       # token_logprobs already sent as an event
    _delta: list[str] = field(default_factory=list)    # text of this step, not yet sent
    tokenlog: TokenLog | None = None        # with `tokens`: each token's kind, each step's record
    cancel_reason: str | None = None        # the Cancelled error's message (Job.cancel)

    def cancel(self, reason: str | None = None) -> None:
        """Ask the scheduler to stop this request and free its slot at its next step; it then
        fails with Cancelled(reason) (None: 'the request was cancelled')."""
        if reason is not None and not self.cancelled.is_set():
            self.cancel_reason = reason
        self.cancelled.set()

    def wait(self, timeout: float | None = None) -> "JobResult":
        """Block until done (in-process callers and tests); raises the request's error."""
        if not self.finished.wait(timeout):
            raise TimeoutError("request still running")
        if self.error is not None:
            raise self.error
        return self.result

    def on_token(self, text: "_TextTracker", rows: RowCursor | None) -> OnToken:
        """The request's interfaces.OnToken: each token into the text (True once a stop string
        appears), its logprobs (rows: the logits it came from) and the token log."""
        lp_params = self.params if self.post_sampling else None

        def on_token(token: int, kind: str) -> bool:
            if self.tokenlog is not None:
                self.tokenlog.token(token, kind, len(text.text))
            if rows is not None:
                self.text_offsets.append(len(text.text))
                self.token_logprobs.append(token_logprob(rows.take(), token, self.logprobs, lp_params))
            stopped = text.push(token)
            self.add_text(text.ready())
            return stopped
        return on_token

    def add_text(self, delta: str) -> None:
        """Text that is final: into the answer and this step's event."""
        if delta:
            self.text_parts.append(delta)
            self._delta.append(delta)

    def flush(self, final: bool = False) -> None:
        """A streamed job's text of this step as one event, after the logprobs of the tokens
        emitted since the last one (all of them at the end)."""
        if not self.stream or not (self._delta or final):
            return
        if self.logprobs is not None and self._lp_sent < len(self.token_logprobs):
            self.emit("logprobs", self.token_logprobs[self._lp_sent:])
            self._lp_sent = len(self.token_logprobs)
        ext = self.tokenlog.take(final) if self.tokenlog is not None else None
        if ext:
            self.emit("specdec", ext)
        if self._delta:
            delta, self._delta = "".join(self._delta), []
            self.emit("text", delta)

    def emit(self, kind: str, value) -> None:
        if self.on_event is not None:
            try:
                self.on_event(kind, value)
            except Exception:                           # noqa: BLE001 - a gone client is no fault
                self.cancel()


@dataclass(frozen=True)
class JobResult:
    ids: list[int]
    text: str
    gen: GenerationResult
    queue_s: float                          # time waiting for a slot
    logprobs: tuple[TokenLogprob, ...] | None = None    # one per id (Job.logprobs set)
    text_offsets: tuple[int, ...] = ()


class _TextTracker:
    """Detokenizes incrementally and finds stop strings: `push(id)` returns the text that is
    final (no stop string can still begin in it) and whether a stop string has appeared."""

    def __init__(self, tokenizer, stop: Sequence[str]):
        self.dec, self.stop = StreamDecoder(tokenizer), [s for s in stop if s]
        self.hold = max((len(s) for s in self.stop), default=1) - 1
        self.text, self.sent, self.stopped = "", 0, False

    def push(self, token: int) -> bool:
        start = max(0, len(self.text) - self.hold)
        self.text += self.dec.push(token)
        for s in self.stop:
            i = self.text.find(s, start)
            if i >= 0:
                self.text, self.stopped = self.text[:i], True
        return self.stopped

    def ready(self, final: bool = False) -> str:
        if final and not self.stopped:
            self.text += self.dec.flush()
        upto = len(self.text) if final or self.stopped else max(self.sent, len(self.text) - self.hold)
        out, self.sent = self.text[self.sent:upto], max(self.sent, upto)
        return out
