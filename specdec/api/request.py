"""One request path under `Model.generate`, `Conversation` and `specdec serve`.

`DraftOptions` says how a request drafts (validated once, when it is made); a `Runner` holds
what requests run on — one target session, the drafter and draft-length policy built from
those options, one random generator, the end-of-generation ids — and dispatches each request
to plain or speculative decoding.  `Runner.steps` is the request as a coroutine over target
passes (interfaces.Eval); `Runner.run` drives it alone, the server's scheduler batches it.

p is always the target's distribution, q the draft's.  A new drafting option is one field
of DraftOptions (passed on in `build`) plus one flag in frontends/flags.py.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, replace
from typing import Any, Protocol, Sequence

from ..speculation.drafters import DRAFTER_NAMES, Drafter, SuffixStore, check_lookup_options, has_mtp
from ..errors import ConfigError, ContextOverflowError
from ..generation.constraint import Constraint, ConstraintSpec, compile_constraint
from ..generation.plain import plain_steps
from ..generation.interfaces import GenerationResult, OnToken, Session, SpecStats, Steps, Timings, drive
from ..speculation.policies import (POLICY_NAMES, AdaptiveLength, DraftPolicy, FixedLength,
                                   Threshold, check_draft_n, check_draft_p)
from ..generation.sampling import NumpyRandom, SamplerParams
from ..speculation.speculative import check_tree_k, speculative_steps
from ..speculation.trace import TraceSink
from .drafting import (AUTO_DRAFT_QUANT, AUTO_N_MAX, AUTO_STOP_AFTER, AUTO_VOCAB, SEED_N, SEED_P,  # noqa: F401
                   DraftPlan, Load)


class Target(Protocol):
    """What the request path needs of a loaded model: specdec.Model (model.py, above this
    module) is one."""
    tokenizer: Any          # text.tokenizer.Tokenizer
    config: Any             # engine.config.ModelConfig
    n_ctx: int

    def session(self, n_ctx: int | None = None) -> Session: ...

    def detokenize(self, ids: Sequence[int]) -> str: ...


@dataclass(frozen=True)
class DraftOptions:
    """How a request drafts.  kind None, no model and no drafter: plain decoding.

    kind: 'model' (the draft `model`), 'forced' (under a constraint, the tokens its grammar
    forces: drafters.ForcedDrafter, no model), 'prompt-lookup' (n-grams of lookup_ngram_min..max
    tokens; a match of n tokens copies at most lookup_copy_ratio · n of them, 0: n),
    'suffix' (the same n-grams, the most frequent continuation of the longest match in the
    context and in `suffix_store`, drafters/suffix.py) or 'hybrid' (lookup where it matches,
    else the model; with a suffix_store the suffix drafter in place of lookup); drafter: a
    ready Drafter object instead.  suffix_store: a SuffixStore shared by the requests that
    run with these options (each finished request's prompt and answer go into it, see
    `Runner.remember`); None: 'suffix' drafts over a store of its own.  n, p, policy: the
    draft-length policy (policies.make_policy: 'threshold' drafts up to n and a model draft
    stops below confidence p, 'fixed' n, 'adaptive' 1..n).  vocab: the draft model computes
    logits for ids below it only (0: all).  retokenize: the draft model drafts through text
    (drafters.RetokenizingDrafter: greedy drafts, any vocabulary; required when its
    vocabulary is not the target's).  tree: candidate continuations verified per step in one
    target pass (multi-candidate verification, speculation/tree_verify.py; 1: the linear
    draft), with the fixed or threshold policy.

    Defaults that pay (`auto`): with none of n, p, policy given, a draft model drafts as
    'hybrid' (prompt lookup where the context repeats itself, the model elsewhere), and per
    request the drafting plan (api/drafting.py, DraftPlan) decides whether the model drafts at
    all, the window of the prompt it sees and the length per step in 0..AUTO_N_MAX, by
    predicted tokens per second from this host's calibrated pass costs; with any of them
    given they mean what llama.cpp's flags mean (threshold policy, n 5, p 0.9 for the ones not
    given).  vocab None: AUTO_VOCAB for draft vocabularies more than twice as large, else
    all.  The measurements behind these choices: docs/speculative.md, "Defaults"."""
    kind: str | None = None
    model: Any = None                   # specdec.Model drafting for kind 'model' / 'hybrid'
    drafter: Drafter | None = None
    n: int | None = None
    p: float | None = None
    policy: str | DraftPolicy | None = None
    lookup_ngram_min: int = 2
    lookup_ngram_max: int = 16
    lookup_copy_ratio: float = 1.0
    vocab: int | None = None
    retokenize: bool = False
    tree: int = 1
    suffix_store: SuffixStore | None = None
    mtp: bool = False                   # the target's own MTP head drafts where a draft model would (with_target)

    def __post_init__(self) -> None:
        if self.kind is not None and self.kind not in DRAFTER_NAMES:
            raise ConfigError(f"--draft must be one of {', '.join(DRAFTER_NAMES)}, got {self.kind!r}")
        if self.drafter is not None and not isinstance(self.drafter, Drafter):
            raise ConfigError(f"a drafter must be a specdec Drafter, got {type(self.drafter).__name__}")
        if self.n is not None:
            check_draft_n(self.n)
        if self.p is not None:
            check_draft_p(self.p)
        if not (self.policy is None or isinstance(self.policy, DraftPolicy) or self.policy in POLICY_NAMES):
            raise ConfigError(f"--draft-policy must be one of {', '.join(POLICY_NAMES)} or a "
                              f"DraftPolicy, got {self.policy!r}")
        check_lookup_options(self.lookup_ngram_min, self.lookup_ngram_max, self.lookup_copy_ratio)
        if self.retokenize and self.kind == "prompt-lookup":
            raise ConfigError("--draft-retokenize is for a draft model (-md); prompt lookup copies target ids")
        if self.suffix_store is not None and not isinstance(self.suffix_store, SuffixStore):
            raise ConfigError(f"suffix_store must be a specdec SuffixStore, got {type(self.suffix_store).__name__}")
        if self.vocab is not None and (int(self.vocab) != self.vocab or self.vocab < 0):
            raise ConfigError(f"--draft-vocab must be an integer >= 1 (0: all ids), got {self.vocab}")
        check_tree_k(self.tree)
        if self.tree > 1 and not isinstance(self.length_policy(), FixedLength):
            raise ConfigError("--draft-tree works with --draft-policy fixed or threshold, not adaptive")

    @property
    def enabled(self) -> bool:
        return self.kind is not None or self.drafter is not None or self.model is not None or self.mtp

    @property
    def auto(self) -> bool:
        """No draft-length setting was given: the measured defaults apply (class docstring)."""
        return self.n is None and self.p is None and self.policy is None

    @property
    def drafter_kind(self) -> str | None:
        """The drafter `build` makes: kind, or with a draft model and no kind, 'hybrid' under
        the defaults and 'model' once a length setting is given."""
        if self.kind is not None or (self.model is None and not self.mtp):
            return self.kind
        return "hybrid" if self.auto else ("model" if self.model is not None else "mtp")

    def length_policy(self) -> DraftPolicy:
        """The draft-length policy these options name (class docstring); with tree > 1 and
        no length setting, llama.cpp's threshold (SEED_N, SEED_P).  Per request the drafting
        plan may replace it (api/drafting.py)."""
        return DraftPlan(self, None).length_policy()

    def draft_vocab(self, model) -> int | None:
        """Logits the draft `model` computes (None: all of them)."""
        if self.vocab == 0:
            return None
        if self.vocab is not None:
            return int(self.vocab)
        n_vocab = int(model.config.n_vocab) if model is not None else 0
        return AUTO_VOCAB if n_vocab > 2 * AUTO_VOCAB else None

    def with_target(self, target) -> "DraftOptions":
        """These options on this target Model: with no drafter, draft model or kind given, a
        target with a multi-token-prediction head (a Qwen3.5 MTP GGUF's nextn tensors) drafts
        with it (`mtp`: 'hybrid' under the defaults, lookup else the MTP head; 'mtp' once a
        length setting is given).  --draft mtp on a target without one: ConfigError."""
        if self.kind == "mtp" and not has_mtp(target):
            raise ConfigError(f"--draft mtp: {getattr(target, 'name', 'the model')} has no nextn (MTP) tensors "
                              f"(a Qwen3.5 MTP GGUF has them)")
        if self.kind is None and self.model is None and self.drafter is None and has_mtp(target):
            return replace(self, mtp=True)
        return self

    def with_model(self, model) -> "DraftOptions":
        """These options drafting with a loaded draft model (-md)."""
        return replace(self, model=model)

    def describe(self) -> str:
        """One line for progress output: who drafts and how long (what `build` makes)."""
        kind = self.drafter_kind or ("drafter" if self.drafter is not None else "none")
        if not self.enabled:
            return "none"
        pol = self.length_policy()
        if isinstance(pol, Threshold):
            how = f"up to {pol.n_max}, p >= {pol.p_min:g}"
        elif isinstance(pol, FixedLength):
            how = f"fixed {pol.n_max}"
        elif isinstance(pol, AdaptiveLength):
            how = f"adaptive {0 if pol.stop_after else pol.n_min}..{pol.n_max}"
        else:
            how = type(pol).__name__
        vocab = self.draft_vocab(self.model) if kind in ("model", "hybrid") and self.model is not None else None
        if self.mtp and self.model is None and kind == "hybrid":
            kind = "hybrid (lookup, else the target's MTP head)"
        return (f"{kind}, {how}" + (f", {self.tree} branches" if self.tree > 1 else "")
                + (f", draft vocab {vocab}" if vocab else "")
                + (", through text" if self.retokenize else "") + (" (defaults)" if self.auto else ""))

    @classmethod
    def of(cls, draft, draft_model=None, **fields) -> "DraftOptions":
        """From generate's `draft=`: None (plain), a DraftOptions (as is), a drafter name
        (with draft_model=), a Drafter object or a draft Model."""
        if draft is None or isinstance(draft, DraftOptions):
            return draft if draft is not None else cls(**fields)
        if isinstance(draft, str):
            return cls(kind=draft, model=draft_model, **fields)
        if isinstance(draft, Drafter):
            return cls(drafter=draft, **fields)
        if hasattr(draft, "session"):                   # a Model (api.py sits above this module)
            return cls(model=draft, **fields)
        raise ConfigError(f"draft= takes a Model, a Drafter, DraftOptions or one of "
                          f"{', '.join(DRAFTER_NAMES)}; got {type(draft).__name__}")

    def build(self, target: "Target", params: SamplerParams,
              n_ctx: int) -> tuple[Drafter | None, DraftPolicy | None]:
        """(drafter, policy) for requests on target; (None, None) for plain decoding
        (DraftPlan.build)."""
        return DraftPlan(self, target).build(params, n_ctx)


@dataclass(frozen=True)
class Completion:
    """What `generate` returns.  ids exclude the prompt and any end-of-generation token."""
    ids: list[int]
    text: str
    prompt_ids: list[int]
    timings: Timings
    stop_reason: str                  # 'eog' | 'n_predict' | 'ctx_full' | 'stop'
    stats: SpecStats | None = None    # speculative runs only


class Runner:
    """What requests run on: one target session (its own KV cache), the drafting plan of
    `draft` (api/drafting.py: the drafter and policy built from it, chosen per request), one random
    generator (`seed`; None: fresh entropy) and the end-of-generation ids.  A conversation
    keeps one Runner for all its turns; the server one per request.  `store`: the SuffixStore
    its requests draft from and are remembered in (or None)."""

    def __init__(self, model: "Target", params: SamplerParams, draft: DraftOptions = DraftOptions(),
                 *, seed: int | None = None, ignore_eos: bool = False, n_ctx: int | None = None,
                 session: Session | None = None):
        self.model, self.params, self.seeded = model, params, seed is not None
        self.rng = NumpyRandom.from_seed(seed)
        self.eog = frozenset() if ignore_eos else model.tokenizer.eog_ids
        self.n_ctx = int(n_ctx or model.n_ctx)
        self.target = session if session is not None else model.session(self.n_ctx)
        self.plan = DraftPlan(draft, model)
        self.drafter, self.policy = self.plan.build(params, self.n_ctx)
        self.options, self._base = draft, (self.drafter, self.policy)
        self.tree_k = draft.tree
        self.prediction: list[int] | None = None
        self.load: Load | None = None                  # the server's batch (DraftPlan.request)
        self.clock = time.perf_counter                 # the speculative loop's (tests inject one)
        self.constraint: Constraint | None = None      # the last request's matcher (its mask_s, n_masks)
        self.store = draft.suffix_store if draft.suffix_store is not None else getattr(self.drafter, "store", None)
        if self.store is not None:
            self.store.bind(int(model.config.n_vocab))

    def predict(self, prediction: "str | Sequence[int] | None") -> None:
        """The requests that follow draft from this prediction of their answer first (the
        user's own draft, OpenAI's `prediction`; text in the target's tokens, or ids), the
        options' drafting where it has nothing to offer (drafters.PredictionDrafter); None:
        back to the options' drafting alone.  With no length setting (or no other drafting)
        the length is the plan's in 0..DRAFT_N_MAX: predictions hold for long runs."""
        self.prediction = None
        if prediction is None:
            return
        ids = (self.model.tokenizer.encode(prediction, special=False, bos=False, eos=False, continued=True)
               if isinstance(prediction, str) else [int(t) for t in prediction])
        n_vocab = int(self.model.config.n_vocab)
        if any(not 0 <= t < n_vocab for t in ids):
            raise ConfigError(f"prediction: token ids must be in 0..{n_vocab - 1}")
        self.prediction = ids

    def plan_request(self, prompt_len: int, n_predict: int, constrained: bool = False) -> None:
        """The drafter and policy of the coming request (DraftPlan.request); `self.plan.choice`
        says what the defaults chose and why."""
        self.drafter, self.policy = self.plan.request(
            self._base, prompt_len=prompt_len, n_predict=n_predict, greedy=self.params.greedy,
            seeded=self.seeded, n_vocab=int(self.model.config.n_vocab), tree_k=self.tree_k,
            prediction=self.prediction, load=self.load, constrained=constrained)

    def remember(self, prompt_ids: Sequence[int], ids: Sequence[int], key=None) -> None:
        """A finished request's prompt and answer go into the suffix store, if there is one
        (key: the document it replaces, a conversation's transcript)."""
        if self.store is not None:
            self.store.add([*prompt_ids, *ids], key=key)

    def steps(self, prompt_ids: Sequence[int], n_predict: int, *, on_token: OnToken | None = None,
              trace: TraceSink | None = None, n_keep: int = 0,
              constraint: "ConstraintSpec | Constraint | None" = None) -> Steps:
        """The request as a coroutine over target passes (interfaces.Steps).  constraint: the
        output must fit it (a ConstraintSpec, compiled here for this request, or a fresh
        compiled Constraint of the caller's; `self.constraint` is the one in use)."""
        if len(prompt_ids) + 1 > self.n_ctx:
            raise ContextOverflowError(
                f"prompt of {len(prompt_ids)} tokens does not fit --ctx-size {self.n_ctx}")
        self.constraint = c = self.compile(constraint)
        self.plan_request(len(prompt_ids), n_predict, constrained=c is not None)
        if self.drafter is None:
            return plain_steps(self.target, prompt_ids, n_predict, self.params, self.rng,
                               self.eog, on_token, n_keep=n_keep, constraint=c)
        return speculative_steps(self.target, self.drafter, prompt_ids, n_predict, self.params,
                                 self.rng, self.eog, self.policy, on_token, trace, self.clock, n_keep=n_keep,
                                 tree_k=self.tree_k, constraint=c)

    def compile(self, constraint: "ConstraintSpec | Constraint | None") -> "Constraint | None":
        """A request's matcher: a spec compiled over the target's vocabulary, a Constraint as
        it is (None: none)."""
        if constraint is None or isinstance(constraint, Constraint):
            return constraint
        return compile_constraint(constraint, self.model.tokenizer, int(self.model.config.n_vocab))

    def run(self, prompt_ids: Sequence[int], n_predict: int, **kw) -> GenerationResult:
        """One request alone (keywords as `steps`)."""
        return drive(self.steps(prompt_ids, n_predict, **kw))

    def completion(self, prompt_ids: Sequence[int], res: GenerationResult) -> Completion:
        return Completion(list(res.ids), self.model.detokenize(res.ids), list(prompt_ids),
                          res.timings, res.stop_reason, res.stats)
