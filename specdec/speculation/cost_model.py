"""The drafting plan's cost model: predicted tokens per second of a whole request, per way of
drafting it, and the per-step length policy that keeps predicting as acceptance is counted.

p is always the target's distribution, q the draft's.  With a the target's one-row pass, v(n) =
a·t(n+1)/t(1) a verification pass over n drafted tokens (calibration.PassCosts's table, this
host's, measured per pass size), d the drafter's step, and the prompt passes pp_t (target) and
pp_d (draft) per token, a request of P prompt tokens and N new ones takes

    plain     P·pp_t + N·a
    drafting  P·pp_t + W·pp_d + N / R       R = max_n E(n) / (n·d + v(n)),  n = 0 (plain: a) included

with E(n) = (1 - alpha^(n+1)) / (1 - alpha) (Leviathan et al. 2023) at the draft model's
acceptance — measured so far in this process on unseeded requests (`Ledger`), the prior
MODEL_ALPHA for seeded ones and until measured — and W the draft's prompt window: the draft
model sees the last W prompt tokens only, W the largest that costs at most WINDOW_SHARE of
what drafting is predicted to save (WINDOW_MIN..WINDOW_MAX; no model at all when even
WINDOW_MIN does not pay: then the free drafters alone).  The free drafters (prompt lookup,
the suffix store, a prediction) cost nothing when they do not match, so they are always on
offer; what they draft is priced like the model's, by the verification rows it costs, so a
step drafts only where E(n) / T(n) beats a plain step, and they alone draft the first tokens
of an answer: at least WAIT_TOKENS, and as many as it takes for the saving forgone to equal
the window's prompt pass (ski rental: never worse than twice the best wait in hindsight), so
the draft's prompt pass never delays the first token and a short answer (a RAG reply of a few
words) never pays it.  `choose` returns the Choice and why.

Per step, `PlannedLength` (an AdaptiveLength) picks n in 0..n_max for the coming step's key
by the same E(n) / T(n) from the acceptance counted so far per key and position, starting
from the calibrated costs rather than from a fixed n; n = 0 (a plain step) whenever no length
pays, from the first step on.  Its verify line is fitted over the table's shape (v(n) = a +
b·(t(n+1)/t(1) - 1), prior b = a), so that a convex host stays convex as it learns.  counts=True (a seeded request): the
costs it learns are the calibrated model's, not the clock's, so its choices — and with them a
sampled request's tokens — are a function of the counts alone; counts=False (unseeded): the
measured draft and verify times replace them as they come (timing-driven adaptation).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace

from . import calibration
from .calibration import PassCosts, prior
from .policies import AdaptiveLength, StepFeedback, expected_tokens

FREE = ("prediction", "suffix", "prompt-lookup")    # drafters that cost ~nothing per step
FREE_DRAFT = 0.01         # a free drafter's step, in target one-row passes
MODEL_KINDS = ("model", "retok")     # drafters that run the draft model (retok: through text)
MODEL_ALPHA = {True: 0.75, False: 0.6}   # the draft model's prior acceptance, greedy / sampled
FREE_ALPHA = {"prediction": 0.9, "forced": 0.99}   # a free drafter's prior acceptance (else AdaptiveLength's)
WINDOW_MIN, WINDOW_MAX = 32, 512         # the draft model's prompt window, tokens
WINDOW_SHARE = 0.3        # at most this share of the predicted saving goes to the draft's prompt pass
WAIT_TOKENS = 16          # the draft model drafts once the answer has at least this many tokens (free drafters before)
N_UNBOUNDED = 256         # new tokens assumed when a request sets no bound
LEDGER_PRIOR = 32.0       # pseudo-positions of the prior acceptance in a Ledger
LEDGER_DECAY = 0.998      # weight kept per verified position: the Ledger remembers ~500 of them
LEDGER_FADE = 0.7         # weight kept per request that left the kind out


class Ledger:
    """Acceptance measured so far per drafter kind ('model', 'prompt-lookup', ...), over the
    requests of one target/draft pair in this process: decayed counts of verified and accepted
    positions.  Unseeded requests read and feed it; seeded ones never do (their tokens must not
    depend on what ran before them)."""

    def __init__(self):
        self.verified: dict[str, float] = {}
        self.accepted: dict[str, float] = {}

    def record(self, kind: str, n_verified: int, n_accepted: int) -> None:
        keep = LEDGER_DECAY ** n_verified
        self.verified[kind] = self.verified.get(kind, 0.0) * keep + n_verified
        self.accepted[kind] = self.accepted.get(kind, 0.0) * keep + n_accepted

    def fade(self, kind: str, keep: float = LEDGER_FADE) -> None:
        """A request that did not try this kind: its counts weigh less, so that the prior
        comes back and the kind is tried again after a few such requests."""
        for d in (self.verified, self.accepted):
            if kind in d:
                d[kind] *= keep

    def alpha(self, kind: str, prior: float) -> float:
        """The kind's acceptance, shrunk towards prior where few positions were verified."""
        v = self.verified.get(kind, 0.0)
        return (self.accepted.get(kind, 0.0) + LEDGER_PRIOR * prior) / (v + LEDGER_PRIOR)


@dataclass(frozen=True)
class Costs:
    """The target's and the draft model's pass costs on this host (calibration.py)."""
    target: PassCosts
    draft: PassCosts | None = None

    @property
    def c(self) -> float:
        """The draft's step over the target's one-row pass."""
        return self.draft.row_s / self.target.row_s if self.draft is not None else 0.0

    def draft_s(self, kind: str) -> float:
        """Seconds of one drafted token of this kind (a model's, MODEL_KINDS, or a free drafter's)."""
        return self.draft.row_s if kind in MODEL_KINDS and self.draft else FREE_DRAFT * self.target.row_s

    @staticmethod
    def prior(target_bytes: float, draft_bytes: float | None) -> "Costs":
        """Uncalibrated: decode is memory bound, so a step costs what its weights weigh."""
        t = prior(1.0)
        return Costs(t, None if draft_bytes is None else prior(draft_bytes / max(target_bytes, 1.0)))


@dataclass(frozen=True)
class PlanInput:
    """What a request brings to the plan (counts only: no clock)."""
    prompt_len: int
    n_predict: int                        # -1: no bound
    greedy: bool
    seeded: bool                          # a seed was set: choices from counts alone
    model: bool                           # a draft model is on offer
    free: tuple[str, ...] = ()            # free drafters on offer (FREE names)
    alpha_model: float | None = None      # the draft model's acceptance so far (None: MODEL_ALPHA)
    model_name: str = "draft model"       # what the reasons call it ("MTP head": the target's own)


@dataclass(frozen=True)
class Choice:
    """What the plan chose for a request, and why."""
    drafters: tuple[str, ...]             # () plain; in order of preference, 'model' last
    window: int | None                    # the draft model's prompt window (None: no model)
    counts: bool                          # the length policy learns from counts alone
    tps: tuple[tuple[str, float], ...]    # predicted tokens per second of each option
    reason: str
    wait_tokens: int = WAIT_TOKENS        # answer tokens before the model drafts (the ski-rental wait)

    @property
    def model(self) -> bool:
        return "model" in self.drafters

    @property
    def wait(self) -> int:
        """Answer tokens the free drafters alone draft before the model may."""
        return self.wait_tokens if self.model else 0

    @property
    def free_only(self) -> bool:
        return bool(self.drafters) and not self.model

    def describe(self) -> str:
        who = "+".join(self.drafters) or "none"
        return (f"plan: {who}" + (f", draft window {self.window} after {self.wait} tokens" if self.window else "")
                + (", lengths from counts (seed)" if self.counts else ", lengths from timings")
                + f"; {self.reason}")


def model_rate(costs: Costs, alpha: float, n_max: int) -> tuple[float, int]:
    """(R, n): tokens per target one-row pass the model's drafting predicts at acceptance alpha,
    and the draft length that gets it (R < 1: drafting loses to plain)."""
    t = costs.target
    n, r = _best(alpha, costs.c * t.row_s, t, 1, n_max)
    r *= t.row_s
    return (r, n) if r > 1.0 else (1.0, 0)


def choose(inp: PlanInput, costs: Costs, n_max: int = 8) -> Choice:
    """The way of drafting a request that predicts the most tokens per second (module
    docstring), with the figures behind it."""
    t = costs.target
    n_new = inp.n_predict if inp.n_predict >= 0 else N_UNBOUNDED
    fixed = inp.prompt_len * t.prefill_tok_s
    plain_tps = n_new / max(fixed + n_new * t.row_s, 1e-12)
    tps = [("plain", plain_tps)]
    free = tuple(f for f in FREE if f in inp.free)
    if free:
        tps.append(("+".join(free), plain_tps))           # never slower: nothing spent on a miss
    window, why = None, f"no {inp.model_name}"
    if inp.model and costs.draft is not None:
        alpha = MODEL_ALPHA[inp.greedy] if inp.alpha_model is None else inp.alpha_model
        r, n = model_rate(costs, alpha, n_max)
        per_saved = t.row_s * (1.0 - 1.0 / r)                # seconds the model saves per answer token
        saved = max(n_new - WAIT_TOKENS, 0) * per_saved
        per_tok = max(costs.draft.prefill_tok_s, 1e-12)
        w = int(min(WINDOW_SHARE * saved / per_tok, WINDOW_MAX, max(inp.prompt_len, 1)))
        how = (f"{inp.model_name} {r:.2f}x per step at n {n}, alpha {alpha:.2f}"
               f"{' prior' if inp.alpha_model is None else ' so far'} "
               f"(c {costs.c:.2f}, 9 rows {t.rel(9):.2f}x one, {'measured' if t.measured else 'prior'})")
        # ski rental: the model waits until the saving forgone equals its window's prompt pass,
        # so an answer that ends sooner (a short RAG or translation reply) never pays for it
        wait = max(WAIT_TOKENS, math.ceil(min(max(w, 1) * per_tok / max(per_saved, 1e-12), 1e9)))
        pays = r > 1.0 and (w >= WINDOW_MIN or w >= inp.prompt_len)    # the window is worth its pass
        if pays and wait < n_new:
            window = max(1, w)
            tps.append(("model", n_new / (fixed + window * per_tok + wait * t.row_s
                                          + (n_new - wait) * t.row_s / r)))
            why = (f"{how}: its {window}-token window costs {_time(window * per_tok, t)} of {_time(saved, t)}"
                   f" saved, paid after {wait} tokens")
        elif pays:
            why = f"{how}: its window would pay only after {wait} tokens, more than the {n_new} asked"
        else:
            why = f"{how}: saves {_time(saved, t)}, less than its prompt pass of {WINDOW_MIN} tokens"
    drafters = free + (("model",) if window is not None else ())
    best = max(tps, key=lambda kv: kv[1])
    reason = f"{why}; predicted {best[1] / plain_tps:.2f}x plain" + (
        f" ({best[1]:.1f} tok/s)" if t.measured else "")
    return Choice(drafters, window, inp.seeded, tuple((k, round(v, 3)) for k, v in tps), reason,
                  wait if window is not None else WAIT_TOKENS)


class PlannedLength(AdaptiveLength):
    """AdaptiveLength starting from the calibrated costs (module docstring); counts=True: the
    costs stay the calibrated ones (deterministic given the counts).  `reason`: why the last
    next_n chose what it did (the trace's `plan` field)."""

    def __init__(self, costs: Costs, n_max: int, *, counts: bool, alpha_model: float = 0.75,
                 ledger: Ledger | None = None, **adaptive):
        super().__init__(n_max=n_max, n_min=0, growth_prior=1.0,
                         shape=tuple(costs.target.rel(m) for m in range(1, n_max + 2)), **adaptive)
        self.costs, self.counts, self.alpha_model = costs, bool(counts), float(alpha_model)
        self.ledger = None if counts else ledger      # counts: what ran before never matters
        self.reason = ""
        self.preamble = ""                  # the request's Choice (DraftPlan), on its first step's reason

    def next_n(self) -> int:
        n = super().next_n()
        if len(self.history) == 1 and self.preamble:
            self.reason = f"{self.preamble} | {self.reason}"
        return n

    @staticmethod
    def kind(key: str | None) -> str:
        """The cost and acceptance kind of a step's key: 'model' for the model drafter's
        (None, 'model', and 'mtp': the target's MTP head is the draft model of its requests)."""
        return "model" if key in (None, "model", "mtp") else str(key).split("/")[0]

    def _choose(self) -> int:
        key = self._next_key if self._next_key is not None else self._last_key
        e = self._est.get(key) if key is not None else None
        a = self.costs.target.row_s
        if e is None or e.draft_s is None or self._verify.w <= 0.0:
            kind = self.kind(key)
            alpha = self.alpha_model if kind in MODEL_KINDS else FREE_ALPHA.get(kind, self.alpha_prior)
            n, rate = _best(alpha, self.costs.draft_s(kind), self.costs.target, 0, self.n_max)
            self.reason = f"{key}: n {n} from the prior (alpha {alpha:.2f}, {rate * a:.2f}x plain predicted)"
            return n
        n = super()._choose()
        self.reason = f"{key}: n {n} (alpha {e.alpha:.2f} over {e.n_verified} verified)"
        return n

    def observe(self, fb: StepFeedback) -> None:
        kind = self.kind(fb.key if fb.key is not None else fb.source)
        if self.ledger is not None and fb.n_verified > 0:
            self.ledger.record(kind, fb.n_verified, fb.n_accepted)
        if self.counts:                     # the calibrated costs, never the clock's
            fb = replace(fb, draft_s=fb.n_drafted * self.costs.draft_s(kind),
                         verify_s=self.costs.target.verify_s(fb.n_drafted))
        elif fb.routing is None:            # the clock: a table that no longer holds is measured again
            calibration.drifted(self.costs.target, fb.n_drafted, fb.verify_s)
        super().observe(fb)


def _time(seconds: float, t: PassCosts) -> str:
    """Seconds when measured, else in target steps (the prior's unit)."""
    return f"{seconds:.2f} s" if t.measured else f"{seconds / t.row_s:.1f} target steps"


def _best(alpha: float, d: float, t: PassCosts, n_min: int, n_max: int) -> tuple[int, float]:
    """(n, tokens per second) maximising E(n) / (n·d + v(n)) over n_min..n_max, v the target's
    verification pass from its table (n = 0: a plain step, 1 / a)."""
    best = (n_min, -1.0)
    for n in range(n_min, n_max + 1):
        rate = expected_tokens(alpha, n) / max(n * d + t.verify_s(n), 1e-12)
        if rate > best[1] * (1 + 1e-12):
            best = (n, rate)
    return best
