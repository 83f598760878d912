"""The drafting plan: the one object that decides how each request drafts.

`DraftPlan(options, target)` reads a request's DraftOptions once; the CLI, `Model.generate`,
`Conversation` and `specdec serve` all go through it (request.Runner holds one):

  build(params, n_ctx)   the drafter and length policy the options name (built once per Runner:
                         a conversation's drafter keeps its caches across turns)
  request(...)           per request: the prediction in front (drafters.PredictionDrafter), the
                         defaults' choice among no drafting, the free drafters, the draft model
                         and their hybrid with its prompt window (speculation/cost_model.py's cost
                         model, `choose`), the length policy (PlannedLength: per step, n in
                         0..n_max by predicted tokens per second), and under a batch the load
                         caps and the lazy prompt pass (speculation/underload.py), and under
                         a constraint the grammar's forced tokens first (drafters.ForcedDrafter)
  for_request(...)       the server's per-request fields (`draft`, `draft_n`) over its options

Explicit settings (a drafter kind with a length flag, a Drafter object, a policy) are kept as
given: llama.cpp's meaning.  p is always the target's distribution, q the draft's.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, replace
from typing import Any, Callable, Sequence

from ..speculation import calibration
from ..speculation.drafters import (Drafter, ForcedDrafter, HybridDrafter, ModelDrafter, PredictionDrafter,
                                    has_mtp, make_drafter)
from ..speculation.drafters.mtp import SOURCE as MTP_SOURCE
from ..speculation.drafters.prediction import SOURCE as PREDICTED
from ..speculation.cost_model import FREE, MODEL_ALPHA, Choice, Costs, Ledger, PlanInput, PlannedLength, choose
from ..speculation.policies import DRAFT_N_MAX, DraftPolicy, make_policy
from ..speculation.underload import LazyPrefill, LoadCappedPolicy

AUTO_N_MAX = 8          # the default draft length bound: n in 0..8 per step
AUTO_VOCAB = 32768      # the default draft head: ids below this, when the vocabulary is > 2x larger
AUTO_DRAFT_QUANT = "q4_0"   # the CLI's defaults load the draft's layers requantized (cli._quant)
AUTO_STOP_AFTER = 24    # the defaults stop drafting from a source once this many positions show it cannot pay
SEED_N, SEED_P = 5, 0.9  # --draft-n / --draft-p when only the other one (or --draft-policy) is given

_LEDGERS: dict[tuple, Ledger] = {}     # (target, draft, greedy) -> acceptance so far, this process


@dataclass(frozen=True)
class Load:
    """A batch's say in a request's drafting (the server's scheduler): cap(free) the most
    tokens a greedy step drafts now (None: uncapped), free telling a free drafter's step from
    a draft model's; on_capped counts the capped steps."""
    cap: Callable[[bool], int | None]
    on_capped: Callable[[], None]


def _nearly_free(key: str | None) -> bool:
    """A step whose draft costs next to nothing under load, capped by the free drafters'
    table: a prediction's, and the target's own MTP head's (its step a small fraction of a
    draft model's: docs/serve.md, "Drafting under load")."""
    return str(key).startswith(PREDICTED) or key == MTP_SOURCE


class DraftPlan:
    """How requests on `target` with these options draft (module docstring)."""

    def __init__(self, options: Any, target: Any):      # options: a request.DraftOptions
        self.options, self.target = options, target
        self._costs: Costs | None = None
        self.choice: Choice | None = None           # the last request's (None: not the defaults)

    # -- built once per Runner ---------------------------------------------------------------
    def length_policy(self) -> DraftPolicy:
        """The draft-length policy the options name (DraftOptions.length_policy)."""
        o = self.options
        if o.auto and o.tree > 1:
            return make_policy("threshold", SEED_N, SEED_P)
        growth = calibration.prior().growth
        if o.auto:
            return make_policy("adaptive", AUTO_N_MAX, growth_prior=growth, stop_after=AUTO_STOP_AFTER)
        return make_policy(o.policy or "threshold", SEED_N if o.n is None else o.n,
                           SEED_P if o.p is None else o.p, growth_prior=growth)

    def build(self, params, n_ctx: int) -> tuple[Drafter | None, DraftPolicy | None]:
        """(drafter, policy) for requests on the target; (None, None) for plain decoding."""
        o = self.options
        if not o.enabled:
            return None, None
        policy = self.length_policy()
        drafter = o.drafter or make_drafter(
            o.drafter_kind, self.target, params, draft_model=o.model, draft_p=policy.p_min, n_ctx=n_ctx,
            lookup_ngram_min=o.lookup_ngram_min, lookup_ngram_max=o.lookup_ngram_max,
            draft_vocab=o.draft_vocab(o.model if o.model is not None else self.target),
            lookup_copy_ratio=o.lookup_copy_ratio,
            retokenize=o.retokenize, suffix_store=o.suffix_store)
        return drafter, policy

    @property
    def planned(self) -> bool:
        """The defaults decide (no length setting, one linear draft): the cost model's case."""
        return self.options.auto and self.options.tree == 1

    def costs(self) -> Costs:
        """The target's and the draft model's pass costs (calibration.py; cached per process)."""
        if self._costs is None or calibration.stale(self._costs.target) or (
                self._costs.draft is not None and calibration.stale(self._costs.draft)):
            t, d = self.target, self.options.model
            if d is None and self._mtp:                    # the target's MTP head drafts
                self._costs = _mtp_costs(t, self.options.draft_vocab(t))
            elif calibration.enabled():
                self._costs = Costs(calibration.costs(t), None if d is None else calibration.costs(
                    d, n_logits=self.options.draft_vocab(d)))
            else:
                self._costs = Costs.prior(_bytes(t), _bytes(d) if d is not None else None)
        return self._costs

    # -- per request ---------------------------------------------------------------------------
    def request(self, base: tuple[Drafter | None, DraftPolicy | None], *, prompt_len: int, n_predict: int,
                greedy: bool, seeded: bool, n_vocab: int, tree_k: int = 1,
                prediction: Sequence[int] | None = None, load: Load | None = None,
                constrained: bool = False) -> tuple[Drafter | None, DraftPolicy | None]:
        """The drafter and policy of one request (module docstring); `self.choice` says what
        the defaults chose and why.  Never changes the drafter in `base` (a conversation's
        turns and the requests on one DraftOptions share it): what differs per request is a
        wrapper or a copy."""
        drafter, policy = base
        self.choice = None
        if self.planned and drafter is not None:
            drafter, policy = self._planned(drafter, prompt_len, n_predict, greedy, seeded,
                                            prediction is not None)
        elif seeded and self.options.policy == "adaptive" and policy is not None:   # counts, not the clock
            policy = PlannedLength(self.costs(), policy.n_max, counts=True, p_min=policy.p_min)
        if prediction is not None:
            drafter = PredictionDrafter(prediction, n_vocab, fallback=drafter)
            if tree_k > 1:
                policy = policy or make_policy("threshold", SEED_N, SEED_P)
            elif policy is None or self.options.auto:     # predictions hold for long runs
                policy = self._planned_policy(seeded, greedy, DRAFT_N_MAX)
        if load is not None and drafter is not None:
            free = self.choice.free_only if self.choice is not None else self.free
            if not free and self.choice is None:           # the plan's draft model prefills lazily already
                drafter = LazyPrefill(drafter)
            if policy is not None and greedy:
                policy = LoadCappedPolicy(policy, lambda key: load.cap(free or _nearly_free(key)), load.on_capped)
        if constrained and drafter is not None and not isinstance(drafter, ForcedDrafter):
            drafter = ForcedDrafter(drafter)            # the grammar's forced tokens drafted first
        return drafter, policy

    def _planned(self, drafter: Drafter, prompt_len: int, n_predict: int, greedy: bool, seeded: bool,
                 predicted: bool) -> tuple[Drafter, DraftPolicy]:
        """The defaults: the cost model's choice applied to the (hybrid or free) drafter."""
        policy = self._planned_policy(seeded, greedy, AUTO_N_MAX)
        if (self.options.kind is not None or not isinstance(drafter, HybridDrafter)
                or not isinstance(drafter.model, ModelDrafter)):
            return drafter, policy                         # a drafter asked for by name: as asked
        free = ("suffix",) if drafter.store is not None else ("prompt-lookup",)
        inp = PlanInput(prompt_len, n_predict, greedy, seeded, model=True,
                        free=free + (("prediction",) if predicted else ()),
                        alpha_model=None if seeded else self.ledger(greedy).alpha("model", MODEL_ALPHA[greedy]),
                        model_name="MTP head" if self._mtp else "draft model")
        self.choice = c = choose(inp, self.costs(), AUTO_N_MAX)
        if not c.model and not seeded:
            self.ledger(greedy).fade("model")
        policy.preamble = c.describe()
        return drafter.planned(c.model, c.wait, c.window), policy      # a copy: `drafter` stays as is

    def _planned_policy(self, seeded: bool, greedy: bool, n_max: int) -> DraftPolicy:
        ledger = None if seeded else self.ledger(greedy)
        alpha = MODEL_ALPHA[greedy] if ledger is None else ledger.alpha("model", MODEL_ALPHA[greedy])
        return PlannedLength(self.costs(), n_max, counts=seeded, alpha_model=alpha, ledger=ledger,
                             stop_after=AUTO_STOP_AFTER, n_init=min(4, n_max))

    @property
    def _mtp(self) -> bool:
        """The target's MTP head is the draft (DraftOptions.mtp, or --draft mtp)."""
        o = self.options
        return o.model is None and (o.mtp or o.kind == "mtp") and has_mtp(self.target)

    def ledger(self, greedy: bool) -> Ledger:
        """The acceptance measured so far on this target/draft pair in this process (unseeded
        requests only; speculation/cost_model.py)."""
        key = (getattr(self.target, "path", id(self.target)),
               "mtp" if self._mtp else getattr(self.options.model, "path", id(self.options.model)), bool(greedy))
        return _LEDGERS.setdefault(key, Ledger())

    @property
    def free(self) -> bool:
        """The options draft with free drafters only (prompt lookup, the suffix store, the
        grammar's forced tokens, or none but a prediction): their steps cost ~nothing."""
        o = self.options
        if o.drafter is not None:
            return o.drafter.source in FREE + ("forced",)
        return o.drafter_kind in (None, "prompt-lookup", "suffix", "forced")

    def describe(self) -> str:
        """The last request's choice and why (-v, the server's token log), or ''."""
        return self.choice.describe() if self.choice is not None else ""

    @staticmethod
    def for_request(base: Any, draft: str | None, draft_n: int | None, draft_model: Any) -> Any:
        """The server's options for a request's `draft` ('none', a drafter name) and `draft_n`
        fields over its own (None: not given)."""
        options = base
        if draft is not None:
            kind = None if draft == "none" else draft
            # "none": plain decoding (kind None with a draft model would mean the defaults)
            options = (replace(options, kind=None, model=None, drafter=None, suffix_store=None, mtp=False)
                       if kind is None else replace(options, kind=kind, model=draft_model, drafter=None))
        if draft_n is not None:
            options = replace(options, n=draft_n)
        return options


def _mtp_costs(target: Any, n_logits: int | None) -> Costs:
    """The target's costs and its MTP block's step (engine/mtp_session.py): calibrated on this host
    (calibration.costs, variant 'mtp'), else priced by the bytes a step reads."""
    from ..engine.mtp_session import MTPModel, mtp_bytes
    if calibration.enabled():
        return Costs(calibration.costs(target), calibration.costs(MTPModel(target), n_logits=n_logits, variant="mtp"))
    return Costs.prior(_bytes(target), float(mtp_bytes(target.weights, n_logits)))


def _bytes(model: Any) -> float:
    """A model's weight bytes (its file's size; 1.0 when it has none): the uncalibrated prior."""
    path = getattr(model, "path", None)
    return float(os.path.getsize(path)) if path and os.path.exists(path) else 1.0
