"""What a model's passes cost on this host, measured once and kept next to the model cache.

The drafting plan (plan.py) predicts tokens per second from three things per model: the
seconds of a one-row pass (a decode step), a table of what a pass of M rows costs relative to
it, t(M) / t(1) for every verification size the plan may ask for (M = 1..TABLE_ROWS: not a
slope, since on some hosts the curve is convex), and the seconds per token of a prompt pass.
They are measured by `measure` (passes of the sizes in MEASURED_ROWS over a fresh session,
after a warm-up so that no compilation is timed; the sizes between them interpolated) and
cached as JSON:

    <cache>/calibration/<file stem>-<key>.json

key = SHA-256 of the model file's path, size and mtime, how it was loaded (requantized layers,
the logits a session computes), the host's CPU (model name and SIMD flags), the kernels' path
(SPECDEC_KERNELS), the kernels' code (kernels/cache.py's stamp of their files: a table measured
on other kernels is stale) and CALIBRATION_VERSION.  A file whose key, version
or fields do not check out is measured again and rewritten (written under a temporary name and
renamed: atomic).  `Drift` watches the verification passes a request really makes: when they
drift from the table by more than DRIFT_MARGIN for DRIFT_STEPS steps in a row (either way),
the calibration is dropped and measured again at the next request.

Until a model is calibrated — and when SPECDEC_CALIBRATE=0 — `prior` gives a stand-in: this
host's kernel path's table (PRIORS) and a prompt pass at 0.2 of a row per token.
SPECDEC_PASS_COSTS=NAME|t2,t3,... (a debug override, docs/speculative.md) replaces every
model's table by a profile of PRIORS or by the given t(M)/t(1) for M = 2, 3, ...: it simulates
another host's costs (the tests pin it), and it turns calibration off.
"""
from __future__ import annotations

import hashlib
import json
import os
import tempfile
import time
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, Callable

import numpy as np

from ..errors import ConfigError
from ..kernels import cache as kernel_code, cpu

CALIBRATION_VERSION = 4    # 4: passes of 2+ rows timed with their rollback (3: without; 2: one slope)
ENV = "SPECDEC_CALIBRATE"       # "0" / "off" / "false": never measure, use the prior
OVERRIDE = "SPECDEC_PASS_COSTS"  # debug: a profile name or t(2),t(3),... in place of every table
TABLE_ROWS = 17                 # the table covers passes of 1..17 rows (a draft of up to 16)
MEASURED_ROWS = (*range(1, 10), 12, 17)   # every size of the defaults (n <= 8) timed; 10..16 interpolated
PROMPT_ROWS = 64                # the prompt pass measured
PREFILL_PRIOR = 0.2             # a prompt token's cost, in one-row passes, until measured
REPEATS = 2                     # timed rounds after the untimed one; the fastest of each size kept
DRIFT_MARGIN = 0.5              # a verification pass off its table entry by over x1.5 or under /1.5 ...
DRIFT_STEPS = 32                # ... in this many steps in a row: measure again


def _linear(g: float) -> tuple[float, ...]:
    return tuple(1.0 + g * m for m in range(TABLE_ROWS))


def _points(points: dict[int, float]) -> tuple[float, ...]:
    """A table over 1..TABLE_ROWS from measured sizes, linear between them and past the last
    one by its last step."""
    ms = sorted(points)
    vs = [points[m] for m in ms]
    at = np.arange(1, TABLE_ROWS + 1)
    out = np.interp(at, ms, vs)
    if len(ms) > 1:
        slope = max((vs[-1] - vs[-2]) / (ms[-1] - ms[-2]), 0.0)
        out = np.where(at > ms[-1], vs[-1] + slope * (at - ms[-1]), out)
    return tuple(round(float(v), 4) for v in out)


# t(M) / t(1) of a few hosts: the priors and the override's names.  zen3 is Qwen2.5-Coder-1.5B
# Q4_K_M on a 2-core AMD EPYC Zen 3 (AVX2 only), the mean of two rounds (../shared/data/zen3 of
# the release measured there; docs/speculative.md, "What a pass costs").
PROFILES = {
    "cheap": _linear(0.05),           # many rows on matrix tiles (AMX)
    "vnni": _linear(0.09),            # AVX-512 VNNI, Intel Xeon
    "zen3": _points({1: 1.0, 2: 1.61, 3: 2.02, 4: 3.58, 6: 5.80, 8: 6.69, 9: 7.69, 12: 9.94,
                     16: 12.99, 17: 11.97}),
    "portable": _linear(1.0),         # no SIMD kernel: every row pays in full
}
HOST_PRIOR = {"vnni512": "vnni", "avx2": "zen3", "portable": "portable"}


@dataclass(frozen=True)
class PassCosts:
    """One model's pass costs on this host (seconds; table and growth relative to row_s)."""
    row_s: float                # one-row pass (decode step)
    growth: float               # (t(9) / t(1) - 1) / 8: the table's mean slope, for reading; no table: a line
    prefill_tok_s: float        # seconds per token of a PROMPT_ROWS-token prompt pass
    measured: bool = False      # False: the prior
    table: tuple[float, ...] = ()   # t(M) / t(1) for M = 1..len(table); (): 1 + growth (M - 1)
    key: str = field(default="", compare=False)   # the cache key it was measured under ('': not cached)

    def rel(self, m: int) -> float:
        """t(m) / t(1): the table's entry, extended past its end by its last step."""
        t = self.table
        if m <= 1:
            return 1.0
        if len(t) < 2:
            return 1.0 + self.growth * (m - 1)
        if m <= len(t):
            return t[m - 1]
        return t[-1] + (m - len(t)) * max(t[-1] - t[-2], (t[-1] - 1.0) / (len(t) - 1), 0.0)

    def verify_s(self, n: int) -> float:
        """Seconds of a verification pass over n drafted tokens (n + 1 rows)."""
        return self.row_s * self.rel(n + 1)

    def to_json(self, key: str) -> str:
        return json.dumps({**asdict(self), "version": CALIBRATION_VERSION, "key": key})

    @classmethod
    def from_json(cls, text: str, key: str) -> "PassCosts | None":
        """The costs a cache file holds, None if it is not a valid one for key."""
        try:
            d = json.loads(text)
            if d.get("version") != CALIBRATION_VERSION or d.get("key") != key:
                return None
            got = cls(**{f.name: d[f.name] for f in fields(cls)})
            got = cls(**{**asdict(got), "table": tuple(float(v) for v in got.table)})
        except (ValueError, KeyError, TypeError, AttributeError):
            return None
        ok = all(isinstance(v, (int, float)) and v == v and v >= 0 for v in
                 (got.row_s, got.growth, got.prefill_tok_s, *got.table)) and got.row_s > 0
        return got if ok and len(got.table) != 1 else None

    @classmethod
    def of_table(cls, row_s: float, table: tuple[float, ...], prefill_tok_s: float,
                 measured: bool = False, key: str = "") -> "PassCosts":
        return cls(row_s, round((table[8] - 1.0) / 8, 4), prefill_tok_s, measured, tuple(table), key)


def override() -> tuple[float, ...] | None:
    """The table SPECDEC_PASS_COSTS names (module docstring), None when unset."""
    v = os.environ.get(OVERRIDE, "").strip().lower()
    if not v:
        return None
    if v in PROFILES:
        return PROFILES[v]
    try:
        rest = [float(x) for x in v.split(",")]
    except ValueError:
        rest = []
    if not rest or not all(x >= 1.0 and x == x and x < 1e6 for x in rest):
        raise ConfigError(f"{OVERRIDE}={v!r}: a profile ({', '.join(PROFILES)}) or t(2),t(3),... each >= 1")
    return _points({1: 1.0, **{m + 2: x for m, x in enumerate(rest)}}) if len(rest) > 1 else _linear(rest[0] - 1.0)


def host_table() -> tuple[float, ...]:
    """The table until measured: the override's, else this host's kernel path's prior."""
    pinned = override()
    if pinned is not None:
        return pinned
    kind = "vnni512" if cpu.have_vnni512() else "avx2" if cpu.have_avx2() else "portable"
    return PROFILES[HOST_PRIOR[kind]]


def prior(row_s: float = 1.0) -> PassCosts:
    """The stand-in before a model is calibrated (module docstring); row_s in any unit: only
    ratios between two models' priors matter, see cost_model.Costs.prior."""
    return PassCosts.of_table(row_s, host_table(), PREFILL_PRIOR * row_s)


def enabled() -> bool:
    return (os.environ.get(ENV, "1").strip().lower() not in ("0", "off", "false", "no")
            and override() is None)


def root() -> Path:
    from ..models.hub import cache_dir
    return cache_dir() / "calibration"


def cache_key(path: str, variant: str = "") -> str:
    """The identity a calibration holds for: the file, how it was loaded (variant), the host's
    CPU, the kernels' path and code."""
    st = os.stat(path)
    h = cpu.host()
    simd = sorted(f for f in h.flags if f.startswith(cpu.SIMD_PREFIXES))
    parts = [str(CALIBRATION_VERSION), os.path.abspath(path), str(st.st_size), str(st.st_mtime_ns),
             variant, h.model_name, ",".join(simd), os.environ.get(cpu.KERNELS_ENV, ""), str(os.cpu_count()),
             kernel_code.code_stamp()]
    return hashlib.sha256("|".join(parts).encode()).hexdigest()[:20]


def cache_path(path: str, key: str) -> Path:
    return root() / f"{Path(path).stem}-{key}.json"


_MEMO: dict[str, PassCosts] = {}        # key -> costs read or measured in this process
_DRIFT: dict[str, int] = {}             # key -> verification passes off the table in a row
_STALE: set[str] = set()                # keys dropped by drift (measured again when next asked)


def costs(model: Any, measure_fn: "Callable[[Any], PassCosts] | None" = None,
          n_logits: int | None = None, fresh: bool = False, variant: str = "") -> PassCosts:
    """The model's pass costs on this host (sessions computing n_logits logits; None: all):
    from the cache (this process's, then the file), else measured now and written; the prior
    when calibration is off or the model has no file.  fresh: measure again whatever is cached.
    variant: what of the file is measured, when not the model itself ('mtp': its MTP block,
    engine/mtp_session.py's MTPModel; a cache entry of its own)."""
    path = getattr(model, "path", None)
    if not enabled() or not path or not os.path.exists(path):
        return prior()
    key = cache_key(path, f"{getattr(model, 'requant', None)}|{n_logits}" + (f"|{variant}" if variant else ""))
    if key in _MEMO and not fresh:
        return _MEMO[key]
    file = cache_path(path, key)
    got = PassCosts.from_json(file.read_text(encoding="utf-8"), key) if file.exists() and not fresh else None
    if got is None:
        got = measure_fn(model) if measure_fn is not None else measure(model, n_logits=n_logits)
        got = PassCosts(**{**asdict(got), "key": key})
        _write(file, got.to_json(key))
    _MEMO[key] = got
    _STALE.discard(key)
    return got


def drifted(c: PassCosts, n_drafted: int, seconds: float) -> bool:
    """A verification pass over n_drafted tokens took `seconds`: True when this is the
    DRIFT_STEPS-th pass in a row off the table by more than DRIFT_MARGIN either way, and then
    the calibration is dropped (memo and file) so that the next request measures again."""
    if not c.measured or not c.key or seconds <= 0:
        return False
    r = seconds / max(c.verify_s(n_drafted), 1e-12)
    off = r > 1.0 + DRIFT_MARGIN or r < 1.0 / (1.0 + DRIFT_MARGIN)
    _DRIFT[c.key] = _DRIFT.get(c.key, 0) + 1 if off else 0
    if _DRIFT[c.key] < DRIFT_STEPS:
        return False
    _DRIFT[c.key] = 0
    _MEMO.pop(c.key, None)
    _STALE.add(c.key)
    for f in root().glob(f"*-{c.key}.json"):
        f.unlink(missing_ok=True)
    return True


def stale(c: PassCosts) -> bool:
    """Dropped by drift since it was read: ask `costs` again."""
    return c.key in _STALE


def _write(file: Path, text: str) -> None:
    try:
        file.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=file.parent, prefix=".tmp-", suffix=".json")
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, file)
    except OSError:                     # a read-only cache: measure again next process
        pass


def measure(model: Any, clock: Callable[[], float] = time.perf_counter, n_logits: int | None = None) -> PassCosts:
    """Time a pass of each of MEASURED_ROWS rows after a PROMPT_ROWS-token context (with its
    rollback from 2 rows on), and that prompt pass (the fastest of REPEATS rounds, after one
    untimed round: compilation is never timed); the table interpolates the sizes between."""
    n_vocab = int(model.config.n_vocab)
    top = max(MEASURED_ROWS)
    ids = [(7 + 31 * i) % n_vocab for i in range(PROMPT_ROWS + top)]
    s = model.session(PROMPT_ROWS + top + 1, n_logits=n_logits)

    def timed(tokens: list[int], at: int) -> float:
        """A pass over tokens after `at` cached ones; a verification pass (2..top rows) with
        its rollback to one kept row, as a rejected draft costs it (a recurrent state replays
        its log: engine/recurrent.py; a KV cache only moves its end)."""
        s.truncate(at)
        t0 = clock()
        s.eval(tokens, last_only=len(tokens) > top)
        if 1 < len(tokens) <= top:
            s.truncate(at + 1)
        return clock() - t0

    s.reset()
    best: dict[int, float] = {}
    for r in range(REPEATS + 1):
        got = {0: timed(ids[:PROMPT_ROWS], 0)}
        got.update({m: timed(ids[PROMPT_ROWS:PROMPT_ROWS + m], PROMPT_ROWS) for m in MEASURED_ROWS})
        if r > 0:
            best = {m: min(v, best.get(m, v)) for m, v in got.items()}
    one = max(best[1], 1e-9)
    table = _points({m: max(best[m] / one, 1.0) for m in MEASURED_ROWS})
    return PassCosts.of_table(one, table, best[0] / PROMPT_ROWS, measured=True)
