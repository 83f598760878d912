"""Trace records: one JSON object per verification step, written as JSONL.

p is always the target's distribution, q the draft's.  Every field is documented in
docs/trace-format.md.  Records are built by a pure function from what a step saw (drafted
tokens, their q and p rows, the VerifyResult) and round-trip exactly through JSON.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import IO, Protocol, Sequence

import numpy as np

from .verify import VerifyResult


@dataclass(frozen=True)
class StepRecord:
    step: int                           # 0-based verification step
    n_context: int                      # prompt + emitted tokens before the step
    drafted: tuple[int, ...]            # (n,) x_i
    q_x: tuple[float, ...]              # (n,) q_i(x_i)
    p_x: tuple[float, ...]              # (n,) p_i(x_i)
    ratio: tuple[float, ...]            # (n,) p_i(x_i) / q_i(x_i)
    accept_prob: tuple[float, ...]      # (n,) min(1, ratio)
    accepted: tuple[bool | None, ...]   # (n,) None where not reached (an earlier one was rejected)
    alpha: tuple[float, ...]            # (n,) predicted acceptance 1 - TV(p_i, q_i)
    n_accepted: int
    next_token: int                     # the token sampled after the accepted drafts
    next_kind: str                      # 'correction' | 'bonus'
    emitted: tuple[int, ...]            # what the step added to the output
    eog: bool                           # an end-of-generation token cut the step short
    draft_s: float
    verify_s: float
    branch: int = 0                     # multi-candidate steps: the verified branch (the fields above
    n_branches: int = 1                 # are its path), of n_branches candidates (tree leaves)
    n_nodes: int = 0                    # tokens drafted over all branches (0 in old traces: len(drafted))
    source: str = ""                    # who drafted: Draft.source ('mtp': the target's MTP head; '' in old traces)
    experts: tuple[int, ...] = ()       # MoE target: distinct experts the verification pass woke,
                                        # per layer (() for a dense target and in old traces)
    plan: str = ""                      # why the policy drafted this length ('' in old traces and
                                        # for fixed policies; the first step: the request's plan too)

    OPTIONAL = ("branch", "n_branches", "n_nodes", "source", "experts", "plan")     # fields older traces lack

    def to_json(self) -> str:
        return json.dumps(asdict(self), allow_nan=False)

    @classmethod
    def from_json(cls, line: str) -> "StepRecord":
        d = json.loads(line)
        names = {f.name for f in fields(cls)}
        if not (names - set(cls.OPTIONAL)) <= set(d) <= names:
            raise ValueError(f"trace record has fields {sorted(d)}, expected {sorted(names)}")
        return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in d.items()})


def step_record(step: int, n_context: int, drafted: Sequence[int], q: np.ndarray, p: np.ndarray,
                result: VerifyResult, emitted: Sequence[int], eog: bool,
                draft_s: float, verify_s: float, *, branch: int = 0, n_branches: int = 1,
                n_nodes: int | None = None, source: str = "", experts=(), plan: str = "") -> StepRecord:
    """q (n, V) the draft's rows, p (n+1, V) the target's rows of one step (of a tree step:
    those of the verified branch, `branch` of n_branches, n_nodes tokens drafted in all)."""
    n = len(drafted)
    idx = np.arange(n)
    q_x = q[idx, list(drafted)] if n else np.zeros(0)    # (n,)
    p_x = p[idx, list(drafted)] if n else np.zeros(0)    # (n,)
    ratio = p_x / q_x                                    # q_x > 0: every x_i was drawn from q_i
    reached = [r.accepted for r in result.records]
    return StepRecord(
        step=step, n_context=n_context, drafted=tuple(int(x) for x in drafted),
        q_x=_floats(q_x), p_x=_floats(p_x), ratio=_floats(ratio),
        accept_prob=_floats(np.minimum(1.0, ratio)),
        accepted=tuple(reached) + (None,) * (n - len(reached)),
        alpha=tuple(float(a) for a in result.alpha), n_accepted=result.n_accepted,
        next_token=result.next_token, next_kind=result.kind,
        emitted=tuple(int(t) for t in emitted), eog=bool(eog),
        draft_s=float(draft_s), verify_s=float(verify_s), branch=int(branch),
        n_branches=int(n_branches), n_nodes=int(n if n_nodes is None else n_nodes),
        source=str(source), experts=tuple(int(e) for e in experts), plan=str(plan))


def _floats(a: np.ndarray) -> tuple[float, ...]:
    return tuple(float(v) for v in a)


class TraceSink(Protocol):
    def write(self, record: StepRecord) -> None: ...


class JsonlTrace:
    """Writes StepRecords, one JSON line each, to a path or an open text file."""

    def __init__(self, target: str | Path | IO[str]):
        self._own = isinstance(target, (str, Path))
        self._f: IO[str] = open(target, "w", encoding="utf-8") if self._own else target

    def write(self, record: StepRecord) -> None:
        self._f.write(record.to_json() + "\n")

    def close(self) -> None:
        if self._own:
            self._f.close()
        else:
            self._f.flush()

    def __enter__(self) -> "JsonlTrace":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

