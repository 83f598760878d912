"""What a model's passes cost on this host, measured once and kept next to the model cache.

The drafting plan (plan.py) predicts tokens per second from three figures per model: the
seconds of a one-row pass (a decode step), what each extra row of a pass adds as a fraction of
it (the verification rows: `growth`), and the seconds per token of a prompt pass.  They are
measured by `measure` (a few passes over a fresh session, after a warm-up so that no
compilation is timed) and cached as JSON:

    <cache>/calibration/<file stem>-<key>.json

key = SHA-256 of the model file's path, size and mtime, how it was loaded (requantized layers,
the logits a session computes), the host's CPU (model name and SIMD flags), the kernels' path
(SPECDEC_KERNELS) and CALIBRATION_VERSION.  A file whose key, version
or fields do not check out is measured again and rewritten (written under a temporary name and
renamed: atomic).  Until a model is calibrated — and when SPECDEC_CALIBRATE=0 — `prior` gives
a sane stand-in: this host's kernel path's verify growth (kernels.cpu.verify_growth) and a
prompt pass at 0.2 of a row per token.
"""
from __future__ import annotations

import hashlib
import json
import os
import tempfile
import time
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any, Callable

from ..kernels import cpu

CALIBRATION_VERSION = 2    # 2: the interleaved K-quants and their tiles (costs measured before are stale)
ENV = "SPECDEC_CALIBRATE"       # "0" / "off" / "false": never measure, use the prior
ROWS = 8                        # the widest verification pass measured
PROMPT_ROWS = 64                # the prompt pass measured
PREFILL_PRIOR = 0.2             # a prompt token's cost, in one-row passes, until measured
REPEATS = 3


@dataclass(frozen=True)
class PassCosts:
    """One model's pass costs on this host (seconds; growth a fraction of row_s per extra row)."""
    row_s: float                # one-row pass (decode step)
    growth: float               # (t(M) - t(1)) / ((M - 1) t(1)), over M = 1..ROWS
    prefill_tok_s: float        # seconds per token of a PROMPT_ROWS-token prompt pass
    measured: bool = False      # False: the prior

    def verify_s(self, n: int) -> float:
        """Seconds of a verification pass over n drafted tokens (n + 1 rows)."""
        return self.row_s * (1.0 + self.growth * n)

    def to_json(self, key: str) -> str:
        return json.dumps({"version": CALIBRATION_VERSION, "key": key, **asdict(self)})

    @classmethod
    def from_json(cls, text: str, key: str) -> "PassCosts | None":
        """The costs a cache file holds, None if it is not a valid one for key."""
        try:
            d = json.loads(text)
            if d.get("version") != CALIBRATION_VERSION or d.get("key") != key:
                return None
            got = cls(**{f.name: d[f.name] for f in fields(cls)})
        except (ValueError, KeyError, TypeError, AttributeError):
            return None
        ok = all(isinstance(v, (int, float)) and v == v and v >= 0 for v in
                 (got.row_s, got.growth, got.prefill_tok_s)) and got.row_s > 0
        return got if ok else None


def prior(row_s: float = 1.0) -> PassCosts:
    """The stand-in before a model is calibrated (module docstring); row_s in any unit: only
    ratios between two models' priors matter, see plan.Costs.of."""
    return PassCosts(row_s, cpu.verify_growth(), PREFILL_PRIOR * row_s, measured=False)


def enabled() -> bool:
    return os.environ.get(ENV, "1").strip().lower() not in ("0", "off", "false", "no")


def root() -> Path:
    from ..models.hub import cache_dir
    return cache_dir() / "calibration"


def cache_key(path: str, variant: str = "") -> str:
    """The identity a calibration holds for: the file, how it was loaded (variant), the host's
    CPU, the kernels' path."""
    st = os.stat(path)
    h = cpu.host()
    simd = sorted(f for f in h.flags if f.startswith(cpu.SIMD_PREFIXES))
    parts = [str(CALIBRATION_VERSION), os.path.abspath(path), str(st.st_size), str(st.st_mtime_ns),
             variant, h.model_name, ",".join(simd), os.environ.get(cpu.KERNELS_ENV, ""), str(os.cpu_count())]
    return hashlib.sha256("|".join(parts).encode()).hexdigest()[:20]


def cache_path(path: str, key: str) -> Path:
    return root() / f"{Path(path).stem}-{key}.json"


_MEMO: dict[str, PassCosts] = {}        # key -> costs read or measured in this process


def costs(model: Any, measure_fn: "Callable[[Any], PassCosts] | None" = None,
          n_logits: int | None = None) -> PassCosts:
    """The model's pass costs on this host (sessions computing n_logits logits; None: all):
    from the cache (this process's, then the file), else measured now and written; the prior
    when calibration is off or the model has no file."""
    path = getattr(model, "path", None)
    if not enabled() or not path or not os.path.exists(path):
        return prior()
    key = cache_key(path, f"{getattr(model, 'requant', None)}|{n_logits}")
    if key in _MEMO:
        return _MEMO[key]
    file = cache_path(path, key)
    got = PassCosts.from_json(file.read_text(encoding="utf-8"), key) if file.exists() else None
    if got is None:
        got = measure_fn(model) if measure_fn is not None else measure(model, n_logits=n_logits)
        _write(file, got.to_json(key))
    _MEMO[key] = got
    return got


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
    """Time passes of 1 and ROWS rows after a PROMPT_ROWS-token context, and that prompt pass
    (the median of REPEATS each, after one untimed round: compilation is never timed)."""
    n_vocab = int(model.config.n_vocab)
    ids = [(7 + 31 * i) % n_vocab for i in range(PROMPT_ROWS + ROWS)]
    s = model.session(PROMPT_ROWS + ROWS + 1, n_logits=n_logits)

    def timed(tokens: list[int], at: int) -> float:
        s.truncate(at)
        t0 = clock()
        s.eval(tokens, last_only=len(tokens) > ROWS)
        return clock() - t0

    s.reset()
    rounds = []
    for _ in range(REPEATS + 1):
        pp = timed(ids[:PROMPT_ROWS], 0)
        one = timed(ids[PROMPT_ROWS:PROMPT_ROWS + 1], PROMPT_ROWS)
        wide = timed(ids[PROMPT_ROWS:], PROMPT_ROWS)
        rounds.append((pp, one, wide))
    pp, one, wide = (sorted(r[i] for r in rounds[1:])[REPEATS // 2] for i in range(3))
    one = max(one, 1e-9)
    growth = max(0.0, (wide / one - 1.0) / (ROWS - 1))
    return PassCosts(one, growth, pp / PROMPT_ROWS, measured=True)
