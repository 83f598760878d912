"""Drafters: whatever proposes the tokens the target then verifies.

p is always the target's distribution, q the draft's.  A drafter returns, with every drafted
token x_i, the full distribution q_i it was drawn from: speculative sampling is exact for any
q as long as x_i ~ q_i given the context (Leviathan et al. 2023, Appendix A.1), so a drafter
is free to be good or bad, but must never lie about q.

The `Drafter` base class: `propose(context_ids, n_max, rng) -> Draft` with 0 <= n <= n_max
tokens, then `accept(n_accepted, next_token)` once the target has verified them, and
`reset()` between requests.  `propose` receives the whole accepted context, so a drafter can
always re-derive its state from it; the hooks let it keep that cheap.  `key(context_ids)`
names the kind of draft the next `propose` on that context will make (a function of the
context alone, None by default), so that a draft-length policy can keep statistics per kind
and pick the length before drafting (policies.AdaptiveLength); prompt lookup's keys are its
match lengths.  `prefill(context_ids)` does a drafter's share of the prompt phase (the model
drafter evaluates the prompt there, timed with the target's prefill as llama.cpp's
speculative example times its encode phase, not as drafting).

Drafters here, one module each: draft_model.ModelDrafter (a small model), lookup.PromptLookupDrafter
(copies what followed an earlier occurrence of the context's last n-gram; q is one-hot),
hybrid.HybridDrafter (lookup when it matches, the model otherwise), retok.RetokenizingDrafter (a
draft model of another vocabulary, drafting greedily through text), suffix.SuffixDrafter (the
most frequent continuation of the longest matching suffix, in the context and a
suffix.SuffixStore of earlier requests; q one-hot), prediction.PredictionDrafter (the user's
own prediction of the answer, with the request's other drafting behind it; q one-hot),
forced.ForcedDrafter (under a constraint, the tokens its grammar forces, then the wrapped
drafter; q one-hot), mtp.MTPDrafter (the target's own multi-token-prediction block, fed its
hidden states: `attach(target)` hands it the target session); base.py the interface.  `make_drafter`
builds one from a name, a Model or a Drafter.
Each Draft names its `source`, so statistics can be kept per drafter.
Under a constraint (a grammar, a JSON schema) the loop calls `constrain(constraint)` first: a
drafter that samples masks its q with it (ModelDrafter); one-hot drafts are cut at their first
forbidden token by the loop (speculation/constrained.py).
"""
from __future__ import annotations

from ...errors import ConfigError
from ...generation.sampling import SamplerParams
from ..compat import check_compatible
from .base import Draft, Drafter
from .forced import ForcedDrafter
from .hybrid import HybridDrafter
from .lookup import Match, NgramIndex, PromptLookupDrafter, check_lookup_options
from .draft_model import ModelDrafter
from .mtp import MTPDrafter
from .prediction import PredictionDrafter
from .retok import RetokenizingDrafter
from .suffix import SuffixDrafter, SuffixStore

__all__ = ["DRAFTER_NAMES", "Draft", "Drafter", "ForcedDrafter", "HybridDrafter", "MTPDrafter", "Match", "ModelDrafter",
           "NgramIndex", "PredictionDrafter", "PromptLookupDrafter", "RetokenizingDrafter", "SuffixDrafter",
           "SuffixStore",
           "check_lookup_options", "has_mtp",
           "make_drafter"]


DRAFTER_NAMES = ("model", "prompt-lookup", "hybrid", "suffix", "forced", "mtp")


def make_drafter(draft, target, params: SamplerParams, *, draft_model=None, draft_p: float = 0.0,
                 n_ctx: int | None = None, lookup_ngram_min: int = 2,
                 lookup_ngram_max: int = 16, draft_vocab: int | None = None,
                 lookup_copy_ratio: float = 1.0, retokenize: bool = False,
                 suffix_store: SuffixStore | None = None) -> Drafter:
    """A Drafter for `target` (a specdec Model) from what the caller passed as `draft`:

      a Drafter object (has `propose`)   used as is;
      a Model                            ModelDrafter over its own session;
      'model'                            ModelDrafter over `draft_model`;
      'prompt-lookup'                    PromptLookupDrafter(lookup_ngram_max, lookup_ngram_min,
                                         copy_ratio=lookup_copy_ratio);
      'suffix'                           SuffixDrafter over suffix_store (None: a store of its
                                         own), same n-gram and copy options as prompt lookup;
      'mtp'                              MTPDrafter: the target's own MTP (nextn) block;
      'hybrid'                           HybridDrafter(prompt lookup, ModelDrafter(draft_model)),
                                         the SuffixDrafter in place of lookup when suffix_store
                                         is given; without a draft model, the MTPDrafter in its
                                         place when the target has an MTP block;
      'forced'                           ForcedDrafter alone: under a constraint, the tokens
                                         its grammar forces (nothing without one).

    draft_p: the model drafter's confidence floor (policy.p_min); draft_vocab: the draft model
    (or the MTP block) computes logits for ids below it only (None: all).  The draft model's
    vocabulary is checked against the target's (compat.check_compatible).
    retokenize: the draft model drafts through text (RetokenizingDrafter, greedy drafts), with
    any vocabulary; with the target's own vocabulary too (then it is exact and slower than
    ModelDrafter, which drafts ids directly)."""
    n_vocab = int(target.config.n_vocab)
    n_ctx = int(n_ctx or target.n_ctx)

    def model_drafter(m) -> Drafter:
        if m is None:
            raise ConfigError(f"--draft {draft} needs a draft model (-md / draft_model=)")
        check_compatible(target.tokenizer, m.tokenizer, target.name, m.name, retokenize)
        session = m.session(n_ctx, n_logits=draft_vocab)
        if retokenize:
            return RetokenizingDrafter(session, m.tokenizer, target.tokenizer, n_vocab, draft_p)
        return ModelDrafter(session, params, draft_p, n_vocab=n_vocab)

    def mtp() -> MTPDrafter:
        from ...engine.mtp_session import MTPSession
        if not has_mtp(target):
            raise ConfigError(f"--draft mtp: {getattr(target, 'name', 'the model')} has no nextn (MTP) "
                              f"tensors (a Qwen3.5 MTP GGUF has them)")
        return MTPDrafter(MTPSession(target.config, target.weights, n_ctx, n_logits=draft_vocab), params,
                          draft_p, n_vocab=n_vocab)

    def lookup() -> PromptLookupDrafter:
        return PromptLookupDrafter(n_vocab, ngram_max=lookup_ngram_max, ngram_min=lookup_ngram_min,
                                   copy_ratio=lookup_copy_ratio)

    def suffix() -> SuffixDrafter:
        return SuffixDrafter(n_vocab, suffix_store, ngram_max=lookup_ngram_max,
                             ngram_min=lookup_ngram_min, copy_ratio=lookup_copy_ratio)

    if isinstance(draft, str):
        if draft == "model":
            return model_drafter(draft_model)
        if draft == "prompt-lookup":
            return lookup()
        if draft == "suffix":
            return suffix()
        if draft == "forced":
            return ForcedDrafter(None, n_vocab)
        if draft == "mtp":
            return mtp()
        if draft == "hybrid":
            return HybridDrafter(suffix() if suffix_store is not None else lookup(),
                                 mtp() if draft_model is None and has_mtp(target) else model_drafter(draft_model))
        raise ConfigError(f"--draft must be one of {', '.join(DRAFTER_NAMES)}, got {draft!r}")
    if isinstance(draft, Drafter):
        return draft
    if hasattr(draft, "session"):                     # a Model (api.py imports this module)
        return model_drafter(draft)
    raise ConfigError(f"draft= takes a Model, a Drafter or one of {', '.join(DRAFTER_NAMES)}; "
                      f"got {type(draft).__name__}")


def has_mtp(target) -> bool:
    """The target Model's file has a multi-token-prediction (nextn) block the engine loaded."""
    return getattr(getattr(target, "weights", None), "mtp", None) is not None
