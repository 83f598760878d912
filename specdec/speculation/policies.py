"""Draft-length policies: how many tokens to draft at each speculative step.

p is always the target's distribution, q the draft's.  Before each step the speculative loop
(bookkeeping.Bookkeeper) asks the policy for n (`next_n()`, 0..policy.n_max, then capped by
the remaining budget and context); after verification it reports what happened
(`observe(StepFeedback)`).  Any policy keeps the output law exact: n is a function of the
past only, and each step of Leviathan et al. 2023, Algorithm 1 is exact given its past,
whatever n it drafts.

  FixedLength(n)            always n.
  Threshold(n, p_min)       up to n, and a model drafter stops early once its confidence (top
                            plain-softmax probability) falls below p_min: llama.cpp's
                            --draft-max / --draft-p-min, what a length flag asks for (the
                            defaults plan the length instead: api/drafting.py's DraftPlan,
                            cost_model.PlannedLength).  The stop happens inside the drafter;
                            make_drafter hands it `policy.p_min`.
  AdaptiveLength(n_max)     n maximising expected tokens per second from online estimates of
                            the acceptance rate and the costs (below).

AdaptiveLength, after Leviathan et al. 2023, §3.3 (Theorem 3.8, Corollary 3.9).  With
per-position acceptance alpha (i.i.d. model), a step that drafts n tokens emits on average

    E(n) = (1 - alpha^(n+1)) / (1 - alpha)                       (n + 1 when alpha = 1)

tokens and costs T(n) = n * d + v(n) seconds: d the draft time per drafted token, v(n) the
verify pass over n + 1 rows.  v is not flat on a CPU: it is fitted online as v(n) = a + b*n
by exponentially weighted least squares over every step, whoever drafted (the pass is the
target's: a lookup step's long drafts and a model step's short ones spread n), pulled
towards a prior slope b = growth_prior * a while the observed n do not spread enough.  The policy picks n in
n_min..n_max maximising E(n) / T(n).  alpha is an exponential moving average over verified positions
(each an accept / reject outcome), d one over steps that drafted.  In the paper's units,
c = d / a is the cost coefficient and b / a the verify cost growth per extra row
(`estimates()`).

Acceptance is not i.i.d. for copies: once a copied run has survived a few positions it
tends to go on (an edit ends it, not chance).  So E(n) uses an acceptance rate per position,
E(n) = 1 + sum_{j<=n} prod_{i<=j} alpha_i, each alpha_i counted (with decay) from the
outcomes at position i and shrunk towards the pooled alpha where positions were rarely
reached; with equal alpha_i this is the formula above.

A mixture-of-experts target (StepFeedback.routing = (E, k)) wakes k experts per row per
layer, and a verification row costs what its *new* experts cost to read: rows that share
experts share their bytes.  There v(n) = a + b * x(n) with x(n) = (D(n + 1) - k) / k, D(M) the
distinct experts a pass of M rows wakes per layer (the trace's count: an average per M over the
steps seen, else the uniform-routing prior E (1 - (1 - k/E)^M)), in units of one row's k
experts; b's prior is expert_growth_prior * a (docs/speculative.md, "Speculation over
experts").

Acceptance and draft cost are kept per key: the drafter's `key(context)` when it has one
(prompt lookup names the length of the n-gram it matched: long matches copy long runs), else
its Draft.source.  The loop tells the policy the key of the coming step with `prepare(key)`
before `next_n()`; without it, the next step is assumed to be of the same key as the last
one.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from ..errors import ConfigError

DRAFT_N_MAX = 16
POLICY_NAMES = ("fixed", "threshold", "adaptive")


@dataclass(frozen=True)
class StepFeedback:
    """What one verification step saw, reported to the policy."""
    source: str             # which drafter drafted (Draft.source)
    n_asked: int            # n_max the drafter was given (after caps)
    n_drafted: int          # tokens it proposed
    n_verified: int         # drafted positions verification reached
    n_accepted: int         # of which accepted
    draft_s: float          # drafter time (propose + accept)
    verify_s: float         # target pass over n_drafted + 1 rows, p, acceptance rule, rollback
    key: str | None = None  # the drafter's key(context) for the step, when it has one
    experts: float | None = None            # MoE target: distinct experts the pass woke, per layer (mean)
    routing: tuple[int, int] | None = None  # MoE target: (E experts, k per row)


class DraftPolicy:
    """Base of every draft-length policy: `next_n()` in 0..n_max before each step; the hooks
    default to doing nothing."""
    n_max: int              # the largest n next_n ever returns
    p_min: float = 0.0      # confidence floor for model drafters (0: never stop early)
    reason: str = ""        # why the last next_n chose what it did (the trace's `plan`)

    def next_n(self) -> int:
        raise NotImplementedError

    def reset(self) -> None:
        """A new request starts."""

    def prepare(self, key: str | None) -> None:
        """The drafter's key of the coming step (None: the drafter has no kinds)."""

    def observe(self, fb: StepFeedback) -> None:
        """What the step just verified saw."""


def check_draft_n(draft_n: int) -> None:
    if int(draft_n) != draft_n or not 1 <= draft_n <= DRAFT_N_MAX:
        raise ConfigError(f"--draft-n (--draft-max) must be in 1..{DRAFT_N_MAX}, got {draft_n}")


def check_draft_p(p_min: float) -> None:
    if not 0.0 <= p_min <= 1.0:                                      # (NaN fails)
        raise ConfigError(f"--draft-p (--draft-p-min) must be in [0, 1], got {p_min}")


class FixedLength(DraftPolicy):
    """Draft n tokens every step."""

    def __init__(self, n: int):
        check_draft_n(n)
        self.n_max, self.p_min = int(n), 0.0

    def next_n(self) -> int:
        return self.n_max


class Threshold(FixedLength):
    """Up to n tokens; model drafters stop once their confidence is below p_min."""

    def __init__(self, n: int, p_min: float):
        super().__init__(n)
        check_draft_p(p_min)
        self.p_min = float(p_min)


def expected_tokens(alpha: float, n: int) -> float:
    """E(n) = (1 - alpha^(n+1)) / (1 - alpha): tokens one step emits (Leviathan et al. Eq. 1)."""
    return n + 1.0 if alpha >= 1.0 else (1.0 - alpha ** (n + 1)) / (1.0 - alpha)


def best_n(alpha: float, draft_s: float, verify_a: float, verify_b: float,
           n_min: int, n_max: int) -> int:
    """argmax over n in n_min..n_max of E(n) / (n * draft_s + verify_a + verify_b * n);
    the smallest such n on ties."""
    return best_n_by_position([alpha] * n_max, draft_s, verify_a, verify_b, n_min, n_max)


def best_n_by_position(alphas: list[float], draft_s: float, verify_a: float, verify_b: float,
                       n_min: int, n_max: int, xs: list[float] | None = None) -> int:
    """As best_n with an acceptance rate per position: alphas[i-1] = P(accept i | i reached),
    E(n) = 1 + sum_{j<=n} prod_{i<=j} alphas[i-1]; xs[n]: the verify cost's regressor for n
    drafted tokens (v = verify_a + verify_b * xs[n]; default n)."""
    best, best_rate = n_min, -1.0
    e, survive = 1.0, 1.0
    for n in range(0, n_max + 1):
        if n > 0:
            survive *= alphas[n - 1]
            e += survive
        if n < n_min:
            continue
        x = n if xs is None else xs[n]
        rate = e / max(n * draft_s + verify_a + verify_b * x, 1e-12)
        if rate > best_rate * (1 + 1e-12):
            best, best_rate = n, rate
    return best


@dataclass
class _Estimates:
    """Online estimates for one draft source (acceptance, draft cost), or for all steps
    (the verify line, AdaptiveLength._verify): the mutable state of AdaptiveLength (not
    frozen on purpose; never leaves the policy, `estimates()` returns plain copies)."""
    alpha: float
    draft_s: float | None = None           # seconds per drafted token
    w: float = 0.0                         # exponentially weighted sums for v(n) = a + b*n
    sx: float = 0.0
    sy: float = 0.0
    sxx: float = 0.0
    sxy: float = 0.0
    n_verified: int = 0
    n_steps: int = 0
    reached: list[float] | None = None     # (n_max,) decayed counts of positions reached
    accepted: list[float] | None = None    # (n_max,) ... and accepted

    def verify_line(self, growth_prior: float, prior_weight: float) -> tuple[float, float] | None:
        """(a, b) of v(n) = a + b*n: least squares, with a ridge pull of b towards
        growth_prior * a; None before any step."""
        if self.w <= 0.0:
            return None
        mx, my = self.sx / self.w, self.sy / self.w
        var = self.sxx / self.w - mx * mx                 # spread of the observed n
        cov = self.sxy / self.w - mx * my
        a0 = max(my / (1.0 + growth_prior * mx), 1e-9)    # intercept if the prior slope held
        b = (cov + prior_weight * growth_prior * a0) / (var + prior_weight)
        b = max(b, 0.0)
        a = max(my - b * mx, 1e-9)
        return a, b


class AdaptiveLength(DraftPolicy):
    """n maximising expected tokens per second (module docstring); n in n_min..n_max.

    alpha_prior / alpha_decay: starting acceptance and its EMA weight per verified position;
    cost_decay: EMA weight per step of the costs; growth_prior: assumed verify growth per
    extra row (fraction of a single-row pass) until measured (kernels.cpu.verify_growth()
    gives this host's); n_init: n before any cost is known; stop_after: once a key has this
    many verified positions, n = 0 (no draft: a plain step) is allowed for it when no n
    pays, and then stays for that key (None: never below n_min); p_min: a model drafter's
    confidence floor inside each draft, as Threshold's (0: none); expert_growth_prior: an MoE
    target's assumed cost of k newly woken experts per layer (fraction of a one-row pass;
    docs/speculative.md, "Speculation over experts", measured it); shape: t(n+1) / t(1) for
    n = 0..n_max, a host's measured pass costs (calibration.PassCosts), fitted as v(n) = a +
    b·(shape[n] - 1) in place of the line a + b·n (growth_prior then in shape's units)."""

    def __init__(self, n_max: int = DRAFT_N_MAX, n_min: int = 1, n_init: int = 4,
                 alpha_prior: float = 0.6, alpha_decay: float = 0.05, cost_decay: float = 0.1,
                 growth_prior: float = 0.05, prior_weight: float = 0.5,
                 stop_after: int | None = None, p_min: float = 0.0,
                 expert_growth_prior: float = 0.95, shape: tuple[float, ...] | None = None):
        check_draft_n(n_max)
        check_draft_p(p_min)
        if not 0 <= n_min <= n_max:
            raise ConfigError(f"adaptive draft length: need 0 <= n_min <= n_max, got {n_min}, {n_max}")
        if stop_after is not None and stop_after < 1:
            raise ConfigError(f"adaptive draft length: stop_after must be >= 1, got {stop_after}")
        self.stop_after = stop_after
        for name, v in (("alpha_prior", alpha_prior), ("alpha_decay", alpha_decay),
                        ("cost_decay", cost_decay)):
            if not 0.0 <= v <= 1.0:
                raise ConfigError(f"adaptive draft length: {name} must be in [0, 1], got {v}")
        self.n_max, self.n_min, self.p_min = int(n_max), int(n_min), float(p_min)
        self.n_init = min(max(int(n_init), self.n_min), self.n_max)
        self.alpha_prior, self.alpha_decay, self.cost_decay = alpha_prior, alpha_decay, cost_decay
        self.growth_prior, self.prior_weight = float(growth_prior), float(prior_weight)
        self.expert_growth_prior = float(expert_growth_prior)
        self.shape = tuple(shape) if shape else None
        self.reset()

    def reset(self) -> None:
        self._est: dict[str, _Estimates] = {}
        self._verify = _Estimates(alpha=0.0)               # the verify line, over all keys
        self._last_key: str | None = None
        self._next_key: str | None = None
        self.history: list[int] = []                       # n returned by each next_n
        self._routing: tuple[int, int] | None = None       # MoE target: (E, k)
        self._woken: dict[int, float] = {}                 # MoE: rows M -> mean distinct experts

    def woken(self, m: int) -> float:
        """Distinct experts per layer a pass of m rows wakes: the average seen, else the
        uniform-routing prior E (1 - (1 - k/E)^m) (MoE targets only)."""
        E, k = self._routing
        return self._woken.get(m, E * (1.0 - (1.0 - k / E) ** m))

    def _x(self, n: int, woken: float | None = None) -> float:
        """The verify cost's regressor for n drafted tokens: n, or for an MoE target the new
        experts beyond one row's, in units of k."""
        if self._routing is None:
            return self.shape[n] - 1.0 if self.shape is not None and n < len(self.shape) else float(n)
        k = self._routing[1]
        return ((self.woken(n + 1) if woken is None else woken) - k) / k

    def _prior(self) -> float:
        return self.growth_prior if self._routing is None else self.expert_growth_prior

    def prepare(self, key: str | None) -> None:
        """The coming step's drafter key (see the module docstring; None: as the last step's)."""
        self._next_key = key

    def next_n(self) -> int:
        n = self._choose()
        self.history.append(n)
        return n

    def _choose(self) -> int:
        key = self._next_key if self._next_key is not None else self._last_key
        e = self._est.get(key) if key is not None else None
        if e is None or e.draft_s is None:
            return self.n_init
        line = self._verify.verify_line(self._prior(), self.prior_weight)
        if line is None:
            return self.n_init
        k = 2.0                                            # pseudo-counts of the pooled alpha
        alphas = [(e.accepted[i] + k * e.alpha) / (e.reached[i] + k) for i in range(self.n_max)]
        n_min = 0 if self.stop_after is not None and e.n_verified >= self.stop_after else self.n_min
        xs = [self._x(n) for n in range(self.n_max + 1)]
        return best_n_by_position(alphas, e.draft_s, line[0], line[1], n_min, self.n_max, xs)

    def observe(self, fb: StepFeedback) -> None:
        key = fb.key if fb.key is not None else fb.source
        e = self._est.setdefault(key, _Estimates(alpha=self.alpha_prior, reached=[0.0] * self.n_max,
                                                 accepted=[0.0] * self.n_max))
        self._last_key, self._next_key = key, None
        e.n_steps += 1
        lam = self.alpha_decay
        for j in range(self.n_max):                        # per position: decay, then count
            e.reached[j] *= 1.0 - lam
            e.accepted[j] *= 1.0 - lam
        for j in range(min(fb.n_verified, self.n_max)):    # accepted ones first, then a rejection
            ok = 1.0 if j < fb.n_accepted else 0.0
            e.alpha += lam * (ok - e.alpha)
            e.reached[j] += 1.0
            e.accepted[j] += ok
        e.n_verified += fb.n_verified
        mu = self.cost_decay
        if fb.n_drafted > 0:
            per = fb.draft_s / fb.n_drafted
            e.draft_s = per if e.draft_s is None else e.draft_s + mu * (per - e.draft_s)
        elif e.draft_s is None and fb.n_asked > 0:
            e.draft_s = fb.draft_s                         # asked, proposed nothing: a cost still
        if fb.routing is not None and fb.experts is not None:
            self._routing = (int(fb.routing[0]), int(fb.routing[1]))
            m = fb.n_drafted + 1
            seen = self._woken.get(m)
            self._woken[m] = fb.experts if seen is None else seen + mu * (fb.experts - seen)
        keep, y, v = 1.0 - mu, float(fb.verify_s), self._verify
        x = self._x(fb.n_drafted, fb.experts if self._routing is not None else None)
        v.w, v.sx, v.sy = keep * v.w + 1.0, keep * v.sx + x, keep * v.sy + y
        v.sxx, v.sxy = keep * v.sxx + x * x, keep * v.sxy + x * y

    def estimates(self) -> dict[str, dict[str, float | int | None]]:
        """Per source: alpha, c = d / a (draft cost per token over one verify row), growth =
        b / a (verify cost per extra row, the same line for all), a (seconds), and the
        counts behind them."""
        out = {}
        line = self._verify.verify_line(self._prior(), self.prior_weight)
        for src, e in self._est.items():
            a, b = line if line else (math.nan, math.nan)
            out[src] = {"alpha": e.alpha, "verify_a_s": a,
                        "c": (e.draft_s / a) if (e.draft_s is not None and line) else None,
                        "growth": b / a if line else None,
                        "growth_per": ("k new experts" if self._routing is not None
                                       else "row" if self.shape is None else "t(n+1)/t(1) - 1"),
                        "n_steps": e.n_steps, "n_verified": e.n_verified}
        return out


def make_policy(policy: "str | DraftPolicy", draft_n: int = 5, draft_p: float = 0.9,
                **adaptive) -> DraftPolicy:
    """A policy object from a name: 'fixed' (draft_n), 'threshold' (draft_n, draft_p) or
    'adaptive' (n in 1..draft_n; `adaptive`: more AdaptiveLength settings, e.g.
    growth_prior, stop_after); a policy object is returned unchanged."""
    if isinstance(policy, DraftPolicy):
        check_draft_n(policy.n_max)
        return policy
    if policy == "fixed":
        return FixedLength(draft_n)
    if policy == "threshold":
        return Threshold(draft_n, draft_p)
    if policy == "adaptive":
        return AdaptiveLength(n_max=draft_n, n_init=min(4, draft_n), **adaptive)
    raise ConfigError(f"--draft-policy must be one of {', '.join(POLICY_NAMES)} or a DraftPolicy, "
                      f"got {policy!r}")
