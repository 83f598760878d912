"""How many threads each forward pass runs on, chosen by measuring the passes themselves.

On an idle machine every core helps a pass.  Beside a program that holds a core, the threads
of one parallel region wait for a share whose thread is not running, and fewer threads can
be faster than all of them (docs/robustness.md, "Sharing the machine").  No setting is right
for both, and the neighbour comes and goes, so the count is measured: each kind of pass (one
model's weights, a bucket of row counts) keeps a running mean of its time per thread count,
runs on the fastest, and now and then re-times another count — often after a change, seldom
while the choice holds (the interval doubles up to MAX_INTERVAL passes); a model's busiest
kind of pass decides for all its passes.  A prompt's passes
(more than BIG_PASS rows) are too long to re-time on a slower count: they run on the count
chosen for the same model's small passes.

    GOVERNOR.run(key, fn)   fn() on the chosen thread count, timed and recorded
    set_threads(n)          -t N: a fixed count, the governor off (0: back to the default);
                            this_thread=True: the calling thread's passes only
    describe() -> dict      the mode and, per kind of pass, the times and the choice

The thread count changes scheduling only: every row of every kernel is computed by one
iteration of one thread, so a pass gives the same bits on any count (the kernels' threads.py;
tests/engine/test_threads.py), and the choice, though it reads the clock, never changes a
token.  Numba's thread count belongs to the calling thread, so it is set before every pass.
"""
from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass, field

ADAPTIVE_ENV = "SPECDEC_ADAPTIVE_THREADS"   # 0: always every thread (the count -t or Numba gives)
MAX_INTERVAL = 64                           # passes between re-timings while a choice holds
MIN_INTERVAL = 4                            # ... right after the choice changed
BIG_PASS = 16                               # passes of more rows follow the model's small passes
ALPHA = 0.3                                 # weight of the newest time in the running mean


def row_bucket(n_rows: int) -> int:
    """Passes of similar cost share their measurements: 1, 2-4, 5-16, 17-64, 65+ rows."""
    return next(b for b in (1, 4, 16, 64, 1 << 62) if n_rows <= b)


@dataclass
class PassKind:
    """What the governor knows of one kind of pass: its time per thread count."""
    counts: tuple[int, ...]                     # thread counts to choose from, most first
    mean: dict[int, float] = field(default_factory=dict)   # count -> seconds (running mean)
    seen: dict[int, int] = field(default_factory=dict)     # count -> passes timed
    choice: int = 0                             # the count passes run on (0: counts[0])
    interval: int = MIN_INTERVAL                # passes between re-timings of another count
    since: int = 0                              # passes on `choice` since the last re-timing
    probe: int = 0                              # which other count is re-timed next

    def pick(self) -> int:
        """Each count twice first (a first pass may fault pages in), then the choice, and
        another count once every `interval` passes."""
        untimed = [c for c in self.counts if self.seen.get(c, 0) < 2]
        if untimed:
            return untimed[0]
        if self.since >= self.interval:
            others = [c for c in self.counts if c != self.current]
            return others[self.probe % len(others)]
        return self.current

    current = property(lambda self: self.choice or self.counts[0])

    def n_timed(self) -> int:
        return sum(self.seen.values())

    def record(self, n: int, seconds: float) -> None:
        """One pass on n threads took `seconds`: the choice's mean moves by ALPHA, another
        count's time is replaced (what it cost a while ago says little now)."""
        k = self.seen.get(n, 0)
        self.seen[n] = k + 1
        steady = n == self.current and k >= 1
        self.mean[n] = (1 - ALPHA) * self.mean[n] + ALPHA * seconds if steady else seconds
        if n == self.current:
            self.since += 1
            if len(self.seen) < len(self.counts) or min(self.seen.values()) < 2:
                return
        else:
            self.since, self.probe = 0, self.probe + 1
        best = min(self.mean, key=lambda c: (self.mean[c], -c))
        if best != self.current:
            self.choice, self.interval, self.since = best, MIN_INTERVAL, 0
        elif n != self.current:
            self.interval = min(2 * self.interval, MAX_INTERVAL)


class Governor:
    """The thread count of every forward pass in this process (one instance: GOVERNOR)."""

    def __init__(self) -> None:
        self.fixed = 0                          # -t N; 0: adaptive
        self._local = threading.local()         # .fixed: one thread's own -t (a server's scheduler)
        env = os.environ.get(ADAPTIVE_ENV, "").strip().lower()
        self._adaptive = None if not env else env not in ("0", "false", "no")
        self.kinds: dict[tuple, dict[int, PassKind]] = {}      # model -> row bucket -> times
        self._lock = threading.Lock()

    @property
    def adaptive(self) -> bool:
        """SPECDEC_ADAPTIVE_THREADS if set, else on where the threading layer splits a region
        into static shares (omp, workqueue) and off on oneTBB, whose work stealing kept as
        much beside a busy process without it and lost nothing idle (docs/robustness.md)."""
        if self._adaptive is None:
            from ..kernels import threading_layer as layer
            self._adaptive = layer.describe()["threading_asked"] != "tbb"
        return self._adaptive

    @adaptive.setter
    def adaptive(self, on: bool) -> None:
        self._adaptive = bool(on)

    def counts(self) -> tuple[int, ...]:
        import numba
        n = numba.config.NUMBA_NUM_THREADS
        return tuple(sorted({n, max(1, n // 2), 1}, reverse=True))

    def run(self, key, n_rows: int, fn):
        """fn() on the thread count chosen for this model's passes, timed; returns fn's result.

        Every kind of pass (row bucket) of a model keeps its times, but the model's busiest
        kind (most passes timed) decides for all: it alone re-times other counts, so a kind
        that runs rarely neither decides on a few noisy first passes nor pays for probes.  A
        kind that becomes the busiest times every count twice first."""
        import numba
        fixed = getattr(self._local, "fixed", 0) or self.fixed
        if fixed or not self.adaptive:
            numba.set_num_threads(fixed or numba.config.NUMBA_NUM_THREADS)
            return fn()
        bucket = row_bucket(n_rows)
        with self._lock:
            kinds = self.kinds.setdefault(key, {})
            leader = max(kinds.values(), key=PassKind.n_timed, default=None)
            if bucket > BIG_PASS:           # a prompt's pass: too long to time on another count
                kind, n = None, leader.current if leader else numba.config.NUMBA_NUM_THREADS
            else:
                kind = kinds.setdefault(bucket, PassKind(self.counts()))
                n = kind.pick() if leader is None or kind is leader else leader.current
        numba.set_num_threads(n)
        t = time.perf_counter()
        out = fn()
        if kind is not None:
            with self._lock:
                kind.record(n, time.perf_counter() - t)
        return out

    def describe(self) -> dict:
        mode = f"fixed {self.fixed}" if self.fixed else ("adaptive" if self.adaptive else "all threads")
        with self._lock:
            kinds = {f"{k[0]}/{b} rows": {"choice": v.current, "passes": v.n_timed(),
                                          "ms": {c: round(s * 1e3, 2) for c, s in v.mean.items()}}
                     for k, by in self.kinds.items() for b, v in by.items()}
        return {"threads_mode": mode, "passes": kinds}


GOVERNOR = Governor()


def set_threads(n: int, this_thread: bool = False) -> None:
    """-t N: every pass on min(n, the cores Numba has) threads; 0 returns to the default.
    this_thread: only the passes the calling thread runs (Numba's count is per thread too)."""
    import numba
    n = min(int(n), numba.config.NUMBA_NUM_THREADS) if n else 0
    if this_thread:
        GOVERNOR._local.fixed = n
    else:
        GOVERNOR.fixed = n
    if n:
        numba.set_num_threads(n)


def describe() -> dict:
    return GOVERNOR.describe()
