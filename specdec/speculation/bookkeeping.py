"""What each speculative step leaves behind, kept in one place: the request's statistics
(interfaces.SpecStats), the length policy's questions and feedback (policies.StepFeedback) and
the trace record (trace.step_record, docs/trace-format.md), all from one `StepResult`.

p is always the target's distribution, q the draft's.  The loop (speculative.py) asks the
`Bookkeeper` how many tokens to draft (`ask`), runs the step, and hands it what the step
verified and emitted (`record`); `stats` sums the request up.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable, Sequence

import numpy as np

from ..generation.interfaces import DrafterStats, Routing, SpecStats, Timings
from .drafters.prediction import accepted_kind
from .policies import DraftPolicy, StepFeedback
from .trace import TraceSink, step_record
from .verify import VerifyResult


@dataclass(frozen=True)
class StepResult:
    """What one verification step verified, linear or tree (tree_verify.tree_step): the
    verified branch as a linear draft's result, with the rows it was decided on."""
    result: VerifyResult            # n_accepted, next_token, its kind, the records, alpha
    drafted: tuple[int, ...]        # (n,) the verified branch's tokens x_1..x_n
    q: np.ndarray                   # (n, V) the draft's rows q_i
    p: np.ndarray                   # (n+1, V) the target's rows p_1..p_{n+1}
    source: str                     # who drafted (Draft.source)
    n_drafted: int                  # tokens drafted in all (a tree: its nodes)
    routing: Routing | None = None  # an MoE target's routing after the pass (Session.routing)
    branch: int = 0                 # a tree: the verified branch, of n_branches leaves
    n_branches: int = 1
    catchup_s: float = 0.0          # of the draft's seconds, its cache's catch-up (Draft.catchup_s)

    def tokens(self) -> list[tuple[int, str]]:
        """(token, OnToken kind) of the accepted drafts, then the sampled token."""
        res = self.result
        kind = accepted_kind(self.source)
        return [(x, kind) for x in self.drafted[: res.n_accepted]] + [(res.next_token, res.kind)]


class StepTimer:
    """Seconds per phase of one step: lap(phase) charges the time since the last lap."""

    def __init__(self, clock: Callable[[], float]):
        self.clock, self.t = clock, clock()
        self.spent = {"draft": 0.0, "verify": 0.0}

    def lap(self, phase: str) -> None:
        t = self.clock()
        self.spent[phase] += t - self.t
        self.t = t


@dataclass(frozen=True)
class _Step:
    n_drafted: int
    result: VerifyResult
    draft_s: float
    verify_s: float
    source: str = "none"                # Draft.source
    n_max: int = 0                      # tokens the drafter was allowed (after caps)
    asked: int = 0                      # tokens the policy asked for


class Bookkeeper:
    """One request's steps: the policy asked before each and told after it, the trace
    written, the statistics kept."""

    def __init__(self, policy: DraftPolicy, trace: TraceSink | None):
        self.policy, self.trace = policy, trace
        self.steps: list[_Step] = []
        self.why: list[str] = []          # the plan's reasons: first step's, last step's
        self.key: str | None = None
        self.asked = self.n_max = 0

    def ask(self, key: str | None, budget: int) -> int:
        """The policy's n for the coming step of this drafter key, at most budget."""
        self.key = key
        self.policy.prepare(key)                          # what kind of draft comes next
        asked = self.policy.next_n()
        self.why[1:] = [self.policy.reason]
        if int(asked) != asked or not 0 <= asked <= self.policy.n_max:
            raise ValueError(f"draft policy asked for {asked} tokens, outside 0..{self.policy.n_max}")
        self.asked, self.n_max = asked, min(asked, budget)
        return self.n_max

    def record(self, step: StepResult, n_context: int, emitted: Sequence[int], eog: bool,
               timer: StepTimer) -> None:
        """The step asked for last: its statistics, the policy's feedback, its trace record."""
        res, draft_s, verify_s = step.result, timer.spent["draft"], timer.spent["verify"]
        self.steps.append(_Step(step.n_drafted, res, draft_s, verify_s, step.source, self.n_max, self.asked))
        woken = step.routing.woken if step.routing is not None else ()
        self.policy.observe(StepFeedback(           # a catch-up is no cost per drafted token
            step.source, self.n_max, step.n_drafted, len(res.records), res.n_accepted,
            max(draft_s - step.catchup_s, 0.0), verify_s,
            self.key, float(np.mean(woken)) if woken else None,
            (step.routing.n_expert, step.routing.n_used) if step.routing is not None else None))
        if self.trace is not None:
            self.trace.write(step_record(
                len(self.steps) - 1, n_context, step.drafted, step.q, step.p, res, emitted, eog,
                draft_s, verify_s, branch=step.branch, n_branches=step.n_branches,
                n_nodes=step.n_drafted, source=step.source, experts=woken, plan=self.policy.reason))

    def stats(self, n_generated: int, timings: Timings) -> SpecStats:
        """The request's statistics, with the plan's reasons (first step's; last step's)."""
        stats = spec_stats(self.steps, self.policy.n_max, n_generated, timings.tokens_per_s)
        return replace(stats, plan=" ... last step: ".join(dict.fromkeys(w for w in self.why if w)))


def spec_stats(steps: Sequence[_Step], draft_n: int, n_generated: int,
               tokens_per_s: float) -> SpecStats:
    """Aggregate per-step verification results (pure)."""
    reached = np.zeros(draft_n, dtype=np.int64)           # (draft_n,) positions verified
    accepted = np.zeros(draft_n, dtype=np.int64)          # (draft_n,) positions accepted
    alpha_sum = 0.0
    for s in steps:
        for j, r in enumerate(s.result.records):
            reached[j] += 1
            accepted[j] += r.accepted
            alpha_sum += s.result.alpha[j]
    n_drafted = sum(s.n_drafted for s in steps)
    n_accepted = int(accepted.sum())
    n_verified = int(reached.sum())
    by_drafter = {src: _drafter_stats([s for s in steps if s.source == src and s.n_max > 0])
                  for src in dict.fromkeys(s.source for s in steps if s.n_max > 0)}
    return SpecStats(
        n_generated=n_generated, n_steps=len(steps), n_drafted=n_drafted, n_accepted=n_accepted,
        acceptance_rate=_ratio(n_accepted, n_drafted),
        tokens_per_step=_ratio(n_generated, len(steps)),
        acceptance_by_position=tuple(float(a / r) if r else None for a, r in zip(accepted, reached)),
        n_verified=n_verified,
        predicted_acceptance=_ratio(alpha_sum, n_verified),
        measured_acceptance=_ratio(n_accepted, n_verified),
        draft_s=sum(s.draft_s for s in steps), verify_s=sum(s.verify_s for s in steps),
        tokens_per_s=tokens_per_s, by_drafter=by_drafter,
        mean_draft_n=_ratio(sum(s.asked for s in steps), len(steps)))


def _drafter_stats(steps: Sequence[_Step]) -> DrafterStats:
    n_drafted = sum(s.n_drafted for s in steps)
    n_verified = sum(len(s.result.records) for s in steps)
    n_accepted = sum(s.result.n_accepted for s in steps)
    alpha_sum = sum(sum(s.result.alpha[: len(s.result.records)]) for s in steps)
    return DrafterStats(len(steps), n_drafted, n_verified, n_accepted,
                        acceptance_rate=_ratio(n_accepted, n_drafted),
                        predicted_acceptance=_ratio(alpha_sum, n_verified),
                        measured_acceptance=_ratio(n_accepted, n_verified),
                        draft_s=sum(s.draft_s for s in steps))


def _ratio(a: float, b: float) -> float:
    return float(a / b) if b else 0.0
