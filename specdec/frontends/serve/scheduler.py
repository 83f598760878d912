"""Continuous batching for `specdec serve`: slots, a bounded queue and one background thread
that runs every active request's pending target pass in one batched forward pass.

Each request is the one request path, `request.Runner.steps`: a coroutine over target
passes (interfaces.Eval).  The scheduler holds each active request's coroutine and the Eval
it is waiting on.  One step:

  1. drop cancelled requests (coroutine.close(), slot freed) and admit queued ones into free
     slots (a Runner over the slot's own target session; its first Eval is the prompt);
  2. run all pending Evals — prompts, single decode rows and verification rows of drafted
     tokens alike — as one `transformer.eval_batch` call: the weights are read once for all;
  3. send each coroutine its logits; it samples / verifies, drafts its next tokens (a draft
     model runs inside the coroutine, per request) and yields its next Eval, or finishes.

A request is a `Job` (job.py: its events, how it ends); this module admits, steps and ends them.

Every row's logits are the same bits whichever batch it is in (the kernels are row
independent; transformer.eval_batch is bitwise each session's own eval), so a request's tokens
never depend on the load, with one lever left: how much a request drafts.  Greedy output is
the same for any draft length, so greedy requests draft at most `DraftCaps.cap(batch size)`
tokens (draft_caps.py: a table chosen from measured step costs, docs/serve.md).  A sampled
request's random draws depend on its draft lengths, so its drafting is never touched by load: a seeded
sampled request gives the same tokens alone and under load.
"""
from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Sequence

from ...engine.transformer import eval_batch
from ...errors import ConfigError, SpecdecError
from ...generation.interfaces import Eval, EvalTree, GenerationResult, run_eval
from ...api.drafting import Load
from ...api.request import DraftOptions, Runner

from .draft_caps import DraftCaps
from .job import Cancelled, Job, JobResult, _TextTracker
from .logprobs import RowCursor
from .metrics import Metrics
from .tokenlog import TokenLog


class QueueFull(SpecdecError):
    """Every slot is busy and the queue holds --queue-size requests (HTTP 503)."""


class ShuttingDown(SpecdecError):
    """The server is draining: no new requests (HTTP 503)."""


DEFAULT_PREFILL_CHUNK = 256     # prompt rows per step while other requests decode (0: whole)


@dataclass
class _Active:
    job: Job
    slot: int
    steps: object                           # the request's coroutine (interfaces.Steps)
    pending: Eval
    text: _TextTracker
    runner: Runner | None = None
    rows: RowCursor | None = None           # the logits the next tokens came from (logprobs)
    prefilled: int = 0                      # prompt rows of `pending` evaluated in earlier steps


def run_evals(evals: Sequence[Eval]) -> list:
    """Every Eval's logits, or the exception its own eval raised (one failing request fails
    alone); the Evals over one model's weights (and n_logits) run as one transformer.eval_batch
    pass.  eval_batch changes no cache unless it succeeds, so a refused batch is rerun eval
    by eval to find who fails; an eval that succeeded is never run twice."""
    out: list = [None] * len(evals)
    groups: dict[tuple, list[int]] = {}
    for i, ev in enumerate(evals):
        if isinstance(ev, EvalTree):                    # a token tree: its own pass
            groups[("tree", i)] = [i]
            continue
        groups.setdefault((id(ev.session.weights), ev.session.n_logits), []).append(i)
    for idx in groups.values():
        if len(idx) > 1:
            try:
                got = eval_batch([evals[i].session for i in idx], [evals[i].tokens for i in idx],
                                 [evals[i].last_only for i in idx])
                for i, lg in zip(idx, got):
                    out[i] = lg
                continue
            except Exception:                           # noqa: BLE001 - find who fails, alone
                pass
        for i in idx:
            try:
                out[i] = run_eval(evals[i])
            except Exception as e:                      # noqa: BLE001
                out[i] = e
    return out


class Scheduler:
    """Up to n_parallel requests at once over `model` (a specdec Model), each in a slot with
    its own target session of n_ctx rows, allocated once; up to max_queue more wait.
    `draft`: the server's default DraftOptions (a request may replace it).

    start: step the model in a background thread of its own (in process use, the tests);
    False: the caller runs `run()` in the thread that should do it.  `specdec serve` steps in
    the main thread, the one that loaded and warmed the model: numba's OpenMP layer gives each
    calling thread its own team of workers, and once two teams exist (more workers than cores)
    libgomp cuts the workers' spin-wait short, so every one of a step's ~300 parallel regions
    starts with a futex wake-up (measured: docs/serve.md, "One OpenMP team": the loading thread against a
    second one)."""

    def __init__(self, model, *, n_parallel: int = 4, n_ctx: int | None = None,
                 draft: DraftOptions = DraftOptions(), caps: DraftCaps | None = None,
                 max_queue: int = 64, metrics: Metrics | None = None,
                 prefill_chunk: int = DEFAULT_PREFILL_CHUNK, threads: int = 0,
                 start: bool = True):
        if n_parallel < 1:
            raise ConfigError(f"--parallel must be >= 1, got {n_parallel}")
        if max_queue < 0:
            raise ConfigError(f"--queue-size must be >= 0, got {max_queue}")
        if prefill_chunk < 0:
            raise ConfigError(f"--prefill-chunk must be >= 0 (0: whole prompts), got {prefill_chunk}")
        self.prefill_chunk, self.threads = int(prefill_chunk), int(threads)
        self.model, self.draft, self.caps = model, draft, caps or DraftCaps()
        self.n_ctx = int(n_ctx or model.n_ctx)
        self.n_parallel, self.max_queue = int(n_parallel), int(max_queue)
        self.metrics = metrics or Metrics()
        self.sessions = [model.session(self.n_ctx) for _ in range(self.n_parallel)]
        self.free = list(range(self.n_parallel))
        self.queue: deque[Job] = deque()
        self.active: list[_Active] = []
        self.batch_size = 0                 # sequences in the step being run (the caps read it)
        self._cv = threading.Condition()
        self._next_id = 0
        self._closing = False
        self._stopped = False
        self._thread = None
        if start:
            self._thread = threading.Thread(target=self.run, name="specdec-scheduler", daemon=True)
            self._thread.start()

    # -- the HTTP side ---------------------------------------------------------------------
    def submit(self, job: Job) -> Job:
        with self._cv:
            if self._closing:
                self.metrics.request_done("rejected")
                raise ShuttingDown("the server is shutting down")
            if len(self.queue) >= self.max_queue and not self.free:
                self.metrics.request_done("rejected")
                raise QueueFull(f"all {self.n_parallel} slots are busy and {len(self.queue)} "
                                f"requests are queued")
            self._next_id += 1
            job.id = self._next_id
            self.queue.append(job)
            self._cv.notify()
        return job

    def gauges(self) -> dict[str, tuple[str, float]]:
        with self._cv:
            return {"queue_length": ("requests waiting for a slot", len(self.queue)),
                    "slots_busy": ("slots running a request", len(self.active)),
                    "slots_total": ("slots (--parallel)", self.n_parallel)}

    def drain(self) -> None:
        """Refuse new requests and answer the queued ones at once with Cancelled (HTTP 503
        with Retry-After: another server can take them now); the active ones go on."""
        with self._cv:
            self._closing = True
            queued, self.queue = list(self.queue), deque()
            self._cv.notify()
        for job in queued:
            self.metrics.request_done("rejected")
            job.error = Cancelled("the server is shutting down: retry the request")
            job.emit("error", job.error)
            job.finished.set()

    def cancel_all(self, reason: str | None = None, stop: bool = False) -> None:
        """Cancel every queued and running request; each fails with Cancelled(reason) at the
        next step (a draining server's deadline: HTTP 503 with Retry-After, not a dropped
        connection).  stop: the scheduler's loop ends once they are gone (close)."""
        with self._cv:
            for j in [*self.queue, *(a.job for a in self.active)]:
                j.cancel(reason)
            self._stopped = self._stopped or stop
            self._cv.notify()

    def close(self, timeout: float = 60.0) -> None:
        """drain(), let the active requests finish (up to timeout seconds; the rest are
        cancelled), then stop the thread."""
        self.drain()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self._cv:
                if not self.queue and not self.active:
                    break
            time.sleep(0.01)
        self.cancel_all(stop=True)
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=10)

    # -- the scheduler thread --------------------------------------------------------------
    def run(self) -> None:
        """Admit and step requests until close(): the scheduler's loop, in the calling thread
        (start=False) or in its own (start=True)."""
        if self.threads:                    # the passes this thread runs (engine/thread_count.py)
            from ...engine.thread_count import set_threads
            set_threads(self.threads, this_thread=True)
        while True:
            with self._cv:
                while not self._stopped and not self.queue and not self.active:
                    self._cv.wait(0.5)
                if self._stopped and not self.active and not self.queue:
                    return
                admit = []
                while self.queue and self.free:
                    admit.append((self.queue.popleft(), self.free.pop(0)))
            for job, slot in admit:
                self._start(job, slot)
            for a in [a for a in self.active if a.job.cancelled.is_set()]:
                a.steps.close()
                self._finish(a, None, None, "cancelled")
            if self.active:
                self._step()

    def _start(self, job: Job, slot: int) -> None:
        job.started = time.perf_counter()
        if job.cancelled.is_set():
            return self._release(job, slot, None, None, "cancelled")
        try:
            runner = Runner(self.model, job.params, job.draft, seed=job.seed,
                            ignore_eos=job.ignore_eos, n_ctx=self.n_ctx, session=self.sessions[slot])
            runner.predict(job.prediction)
            runner.load = Load(lambda free: self.caps.cap(self.batch_size, free), self._count_capped)
            text = _TextTracker(self.model.tokenizer, job.stop)
            if job.logprobs is not None and runner.tree_k > 1:
                # a tree pass's logits rows are its nodes, not the emitted tokens in order
                raise ConfigError("logprobs / n_probs are not computed with --draft-tree > 1")
            rows = RowCursor() if job.logprobs is not None else None
            job.tokenlog = TokenLog(text, runner.options.describe()) if job.tokens else None
            n_predict = job.n_predict if job.n_predict >= 0 else self.n_ctx
            steps = runner.steps(job.prompt_ids, n_predict, on_token=job.on_token(text, rows),
                                 trace=job.tokenlog, constraint=job.constraint)
            a = _Active(job, slot, steps, None, text, runner=runner, rows=rows)
            try:
                a.pending = next(steps)
            except StopIteration as done:
                return self._finish(a, done.value, None, "ok", active=False)
        except Exception as e:                          # noqa: BLE001 - one request fails alone
            return self._release(job, slot, None, e, "error")
        self.active.append(a)

    def _step(self) -> None:
        """One batched pass over every active request's pending Eval.  A prompt longer than
        prefill_chunk, while others run too, goes in chunks of that many rows, one per step
        (their logits are not needed: only the last chunk's are sent), so the others' next
        tokens wait for one chunk, not the whole prompt; the rows are the same bits either
        way (the kernels are row independent)."""
        batch = list(self.active)
        self.batch_size = len(batch)
        t0 = time.perf_counter()
        evals, last = zip(*(self._chunk(a, len(batch)) for a in batch))
        logits = run_evals(evals)
        for a, ev, is_last, lg in zip(batch, evals, last, logits):
            if isinstance(lg, Exception):
                a.steps.close()
                self._finish(a, None, lg, "error")
                continue
            if not is_last:                             # a prompt chunk: the rest in later steps
                a.prefilled += len(ev.tokens)
                self.metrics.prefill_chunk_done()
                continue
            a.prefilled = 0
            if a.rows is not None:
                a.rows.feed(lg)
            try:
                a.pending = a.steps.send(lg)
            except StopIteration as done:
                self._finish(a, done.value, None, "ok")
                continue
            except Exception as e:                      # noqa: BLE001
                self._finish(a, None, e, "error")
                continue
            a.job.flush()
        self.metrics.step_done(len(batch), sum(len(ev.tokens) for ev in evals),
                               time.perf_counter() - t0)

    def _chunk(self, a: _Active, batch_size: int) -> tuple[Eval, bool]:
        """What of a's pending Eval runs this step, and whether it is the last of it: all of
        it, or (a last-row-only prompt pass of more than prefill_chunk rows, with others in
        the batch) its next prefill_chunk rows."""
        ev, c, done = a.pending, self.prefill_chunk, a.prefilled
        if c == 0 or not isinstance(ev, Eval) or not ev.last_only or (done == 0 and (batch_size == 1 or len(ev.tokens) <= c)):
            return ev, True
        rest = ev.tokens[done:]
        if batch_size == 1 or len(rest) <= c:
            return Eval(ev.session, rest, True), True
        return Eval(ev.session, rest[:c], True), False

    def _count_capped(self) -> None:
        with self.metrics.lock:
            self.metrics.capped_steps += 1

    def _finish(self, a: _Active, gen: GenerationResult | None, err: Exception | None,
                status: str, active: bool = True) -> None:
        if active:
            self.active.remove(a)
        if gen is not None:
            if a.runner is not None:
                a.runner.remember(a.job.prompt_ids, gen.ids)      # the shared suffix store
            a.job.add_text(a.text.ready(final=True))
            a.job.flush(final=True)
        self._release(a.job, a.slot, gen, err, status)

    def _release(self, job: Job, slot: int, gen: GenerationResult | None,
                 err: Exception | None, status: str) -> None:
        with self._cv:
            self.free.append(slot)
            self.free.sort()
        if gen is not None:
            s = gen.stats
            self.metrics.request_done(status, gen.n_prompt, len(gen.ids),
                                      s.n_drafted if s else 0, s.n_accepted if s else 0)
            lps = tuple(job.token_logprobs) if job.logprobs is not None else None
            job.result = JobResult(list(gen.ids), "".join(job.text_parts), gen,
                                   job.started - job.submitted, lps, tuple(job.text_offsets))
            job.emit("done", job.result)
        else:
            self.metrics.request_done(status)
            job.error = err if err is not None else Cancelled(job.cancel_reason or "the request was cancelled")
            job.emit("error", job.error)
        job.finished.set()
