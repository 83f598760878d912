"""The drafting plan replayed over recorded requests at injected pass costs: never slower than
plain as a property, on hosts we do not have.

A greedy answer is fixed whatever drafts it (speculation changes nothing), and a draft is
accepted up to its first token that differs from it.  So what one real request offers a
drafter is a trace (`Trace`, recorded by benchmarks/record_traces.py from the real pair): per
drafter kind and answer position i, the key the drafter names for that context, how many
tokens it would propose there (`offer`: 0 when a lookup has no match) and how many of them
match the answer (`run`).  `replay` then runs the defaults' decisions on it — speculation/
plan.py's `choose` for the request and its `PlannedLength` per step, as api/drafting.py builds
them — priced by what the plan reads (`Costs`, a calibration) and charged by what the host
really costs (`real`: a PassCosts table, optionally noisy): the predicted whole-request time
beside plain's.  p is always the target's distribution, q the draft's.

The hybrid's order is the engine's: a prediction where it has a proposal, else prompt lookup
where it matches, else the draft model once the plan admits it (after its wait); a step of n
drafted tokens costs n draft steps (the model's; a free drafter's FREE_DRAFT) and a
verification pass of n + 1 rows from the table.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from ..speculation.calibration import PassCosts
from ..speculation.cost_model import MODEL_ALPHA, Costs, PlanInput, PlannedLength, choose
from ..speculation.policies import DRAFT_N_MAX, StepFeedback

AUTO_N_MAX = 8          # api/drafting.py's: the defaults' bound (DRAFT_N_MAX with a prediction)


@dataclass(frozen=True)
class Offers:
    """One drafter kind along an answer: per position, its key, what it would propose, what
    of that matches the answer."""
    keys: tuple[str, ...]
    offer: tuple[int, ...]
    run: tuple[int, ...]


@dataclass(frozen=True)
class Trace:
    """What one greedy request offers each drafter kind ('model', 'prompt-lookup', 'prediction')."""
    name: str
    prompt_len: int
    n_new: int
    kinds: dict[str, Offers]

    @staticmethod
    def load(path: "str | Path") -> list["Trace"]:
        rows = json.loads(Path(path).read_text(encoding="utf-8"))
        return [Trace(r["name"], r["prompt_len"], r["n_new"],
                      {k: Offers(tuple(v["keys"]), tuple(v["offer"]), tuple(v["run"]))
                       for k, v in r["kinds"].items()}) for r in rows]

    def to_dict(self) -> dict:
        return {"name": self.name, "prompt_len": self.prompt_len, "n_new": self.n_new,
                "kinds": {k: {"keys": list(v.keys), "offer": list(v.offer), "run": list(v.run)}
                          for k, v in self.kinds.items()}}


@dataclass(frozen=True)
class Outcome:
    """A replayed request: seconds drafting as the plan chose, plain's, and the steps taken."""
    seconds: float
    plain_s: float
    steps: int
    drafted: int
    accepted: int
    drafters: tuple[str, ...]
    window_s: float = 0.0       # the draft model's prompt pass (the plan's one bet on its prior)

    @property
    def speedup(self) -> float:
        return self.plain_s / self.seconds


def replay(trace: Trace, plan: Costs, real: PassCosts | None = None, *, model: bool = True,
           noise: float = 0.0, rng: np.random.Generator | None = None) -> Outcome:
    """The defaults on `trace`: decided on `plan`'s costs, charged at `real`'s (the target's
    table and row; the draft's step and prompt pass scale with it).  noise: each charged pass
    multiplied by exp(N(0, noise)) (a busy host; rng required)."""
    real = real or plan.target
    scale = real.row_s / plan.target.row_s

    def jitter() -> float:
        return float(np.exp(rng.normal(0.0, noise))) if noise > 0 else 1.0

    free = tuple(k for k in ("prediction", "prompt-lookup") if k in trace.kinds)
    has_model = model and "model" in trace.kinds and plan.draft is not None
    choice = choose(PlanInput(trace.prompt_len, trace.n_new, greedy=True, seeded=True, model=has_model,
                              free=free), plan, AUTO_N_MAX)
    n_max = DRAFT_N_MAX if "prediction" in free else AUTO_N_MAX
    policy = PlannedLength(plan, n_max, counts=True, alpha_model=MODEL_ALPHA[True], n_init=4)
    prompt_s = trace.prompt_len * real.prefill_tok_s * jitter()
    window_s = (choice.window or 0) * plan.draft.prefill_tok_s * scale if choice.model else 0.0
    total = prompt_s + window_s
    i = steps = drafted = accepted = 0
    while i < trace.n_new:
        kind = _who(trace, i, choice)
        o = trace.kinds[kind] if kind else None
        key = o.keys[i] if o else None
        policy.prepare(key)
        n = min(policy.next_n(), trace.n_new - i - 1)
        d = min(n, o.offer[i]) if o else 0
        acc = min(d, o.run[i]) if o else 0
        per = plan.draft_s("model" if kind == "model" else "free") * scale
        draft_s, verify_s = d * per * jitter(), real.verify_s(d) * jitter()
        total += draft_s + verify_s
        if o and n > 0:
            policy.observe(StepFeedback(kind, n, d, min(d, acc + 1), acc, draft_s, verify_s, key=key))
        i, steps, drafted, accepted = i + acc + 1, steps + 1, drafted + d, accepted + acc
    plain_s = prompt_s + sum(real.row_s * jitter() for _ in range(trace.n_new))
    return Outcome(total, plain_s, steps, drafted, accepted, choice.drafters, window_s)


def _who(trace: Trace, i: int, choice) -> str | None:
    """The drafter of a step at answer position i: the engine's hybrid order (module docstring)."""
    for kind in ("prediction", "prompt-lookup"):
        if kind in trace.kinds and kind in choice.drafters and trace.kinds[kind].offer[i] > 0:
            return kind
    return "model" if choice.model and i >= choice.wait else None


def linear_costs(growth: float, row_s: float = 1.0, prefill: float = 0.2) -> PassCosts:
    """A host whose every extra row adds `growth` of a one-row pass (the old slope model)."""
    return PassCosts(row_s, growth, prefill * row_s, measured=True)


def table_costs(table, row_s: float = 1.0, prefill: float = 0.2) -> PassCosts:
    """A host with this t(M) / t(1) table (M = 1..len)."""
    return PassCosts.of_table(row_s, tuple(float(v) for v in table), prefill * row_s, measured=True)


def with_draft(target: PassCosts, c: float = 0.35, prefill: float = 0.05) -> Costs:
    """The plan's Costs with a draft model whose step costs c of the target's."""
    return Costs(target, replace(target, row_s=c * target.row_s, prefill_tok_s=prefill * target.row_s))


__all__ = ["Offers", "Trace", "Outcome", "replay", "linear_costs", "table_costs", "with_draft"]
