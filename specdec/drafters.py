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

Drafters here: ModelDrafter (a small model), PromptLookupDrafter (copies what followed an
earlier occurrence of the context's last n-gram; q is one-hot), HybridDrafter (lookup when it
matches, the model otherwise).  `make_drafter` builds one from a name, a Model or a Drafter.
Each Draft names its `source`, so statistics can be kept per drafter.
"""
from __future__ import annotations

import bisect
from dataclasses import dataclass
from typing import NamedTuple, Sequence

import numpy as np

from .compat import check_compatible
from .errors import ConfigError
from .interfaces import Session
from .policies import check_draft_p
from .sampling import Rng, SamplerParams, probs, top_prob


@dataclass(frozen=True)
class Draft:
    tokens: tuple[int, ...]     # (n,) drafted ids
    q: np.ndarray               # (n, V) float64: q[i] is the distribution tokens[i] was drawn from
    source: str = "none"        # which drafter proposed: 'model' | 'prompt-lookup' | ...

    @staticmethod
    def empty(n_vocab: int, source: str = "none") -> "Draft":
        return Draft((), np.zeros((0, n_vocab), dtype=np.float64), source)


class Drafter:
    """Base of every drafter.  Subclasses implement `propose` and set `n_vocab` (V of the q
    rows: the target's vocabulary size); the hooks default to doing nothing."""
    n_vocab: int
    source = "none"             # Draft.source of what it proposes

    def propose(self, context_ids: Sequence[int], n_max: int, rng: Rng) -> Draft:
        """0 <= n <= n_max tokens after the context, each with the q row it was drawn from."""
        raise NotImplementedError

    def accept(self, n_accepted: int, next_token: int) -> None:
        """The target verified the last proposal: n_accepted of it stand, then next_token."""

    def reset(self) -> None:
        """Forget every request (a new one follows)."""

    def prefill(self, context_ids: Sequence[int]) -> None:
        """The drafter's share of the prompt phase (timed with the target's prefill)."""

    def key(self, context_ids: Sequence[int]) -> str | None:
        """The kind of draft the next `propose` on this context makes (a function of the
        context alone), for per-kind policy statistics; None: no kinds."""
        return None


class ModelDrafter(Drafter):
    """Drafts with a small model running on its own session (own KV cache).

    Tokens are sampled one at a time from q = sampling.probs(draft logits, params), with the
    same SamplerParams as the target (at temperature 0 the draft is greedy too).  Drafting
    stops early when the draft's confidence, the largest probability of its plain softmax at
    temperature 1 (no filters), is below draft_p: like llama.cpp's --draft-p-min, and measured
    before warping because at temperature 0 q is one-hot and would always look certain.

    Cache discipline: after `accept`, the draft cache holds a prefix of the accepted context:
    everything up to the last drafted token that survived.  The tokens it lacks (the target's
    correction or bonus, and an accepted last draft token, which was never evaluated) are
    evaluated lazily in one batch at the start of the next `propose`.  `propose` also checks
    the cache against the context it is given and rolls back to their common prefix, so no
    state leaks between steps or requests even without the hooks.

    n_vocab: the target's vocabulary size, when it differs from the draft's (padded
    vocabularies): q is built on the ids both share and is zero elsewhere, so the draft never
    proposes an id the target lacks, and q stays the exact law of the drafted tokens.  The
    same holds when the draft session computes fewer logits (Session n_logits, --draft-vocab):
    q lives on ids 0..n_logits-1, a cheaper draft that can never propose the rarer ids.
    """

    source = "model"

    def __init__(self, session: Session, params: SamplerParams, draft_p: float = 0.0,
                 n_vocab: int | None = None):
        check_draft_p(draft_p)
        self.session, self.params, self.draft_p = session, params, float(draft_p)
        self.n_vocab = int(n_vocab if n_vocab is not None else session.n_vocab)
        self._shared = min(self.n_vocab, session.n_logits)   # ids it may propose
        self._cached: list[int] = []                        # ids in the draft cache, len == n_past
        self._last: tuple[int, tuple[int, ...]] | None = None   # (context length, drafted) of the last proposal
        session.reset()

    def reset(self) -> None:
        self.session.reset()
        self._cached, self._last = [], None

    def propose(self, context_ids: Sequence[int], n_max: int, rng: Rng) -> Draft:
        ctx = list(context_ids)
        # room: the context plus every drafted token but the last must fit the draft cache
        n_max = min(n_max, self.session.n_ctx - len(ctx) + 1)
        self._last = (len(ctx), ())
        if n_max <= 0 or not ctx:
            return Draft.empty(self.n_vocab, self.source)
        keep = _common_prefix(self._cached, ctx, len(ctx) - 1)    # the last id must be re-fed
        self._truncate(keep)
        logits = self._eval(ctx[keep:])                            # (V_draft,) catch-up, one batch
        tokens: list[int] = []
        qs: list[np.ndarray] = []
        while True:
            row = logits[: self._shared]                           # (V_shared,)
            if self.draft_p > 0.0 and top_prob(row) < self.draft_p:
                break
            q = np.zeros(self.n_vocab, dtype=np.float64)           # (V,)
            q[: self._shared] = probs(row, self.params)
            x = int(rng.categorical(q))
            tokens.append(x)
            qs.append(q)
            if len(tokens) >= n_max:
                break                                              # the last draft is not evaluated
            logits = self._eval([x])
        self._last = (len(ctx), tuple(tokens))
        q_mat = np.stack(qs) if qs else np.zeros((0, self.n_vocab))   # (n, V)
        return Draft(tuple(tokens), q_mat, self.source)

    def prefill(self, context_ids: Sequence[int]) -> None:
        """Evaluate the context but its last id, in the prompt phase (as the target does), so
        that the first `propose` only feeds that id."""
        ctx = list(context_ids)
        keep = _common_prefix(self._cached, ctx, len(ctx) - 1)
        self._truncate(keep)
        if len(ctx) - 1 > keep:
            self._eval(ctx[keep:-1])

    def accept(self, n_accepted: int, next_token: int) -> None:
        """Roll the cache back to the accepted part of the last proposal."""
        if self._last is None:
            return
        n_ctx, drafted = self._last
        if not 0 <= n_accepted <= len(drafted):
            raise ValueError(f"accept: {n_accepted} accepted out of {len(drafted)} drafted")
        self._truncate(min(len(self._cached), n_ctx + n_accepted))
        self._last = None

    def _eval(self, ids: list[int]) -> np.ndarray:
        logits = self.session.eval(ids, last_only=True)[-1]       # (V_draft,)
        self._cached.extend(ids)
        return logits

    def _truncate(self, n: int) -> None:
        if n < len(self._cached):
            self.session.truncate(n)
            del self._cached[n:]


def _common_prefix(a: list[int], b: list[int], limit: int) -> int:
    """Length of the longest common prefix of a and b, at most limit."""
    n = min(len(a), len(b), limit)
    if a[:n] == b[:n]:
        return n
    diff = np.flatnonzero(np.asarray(a[:n]) != np.asarray(b[:n]))
    return int(diff[0])


# ---- prompt lookup ---------------------------------------------------------------------------

class NgramIndex:
    """Where each n-gram (n_min <= n <= n_max) of a growing token sequence last ended.

    `sync(ids, upto)` brings the index to `ids`, indexing the n-grams that end at or before
    position `upto` (exclusive end index); when `ids` does not extend what was indexed (a new
    request, a rolled-back context) it starts over.  Appending k tokens costs O(k * n_max)
    dict updates; the prefix check costs one list comparison.  `find(gram)` -> the end of its
    latest indexed occurrence, or None; `find_before(gram, limit)` -> the latest one ending at
    or before limit (every occurrence is kept, in order)."""

    def __init__(self, n_min: int, n_max: int):
        self.n_min, self.n_max = n_min, n_max
        self.ids: list[int] = []
        self._ends: dict[tuple[int, ...], list[int]] = {}   # n-gram -> exclusive ends, ascending
        self._upto = 0                                # n-grams ending at <= _upto are indexed

    def reset(self) -> None:
        self.ids, self._ends, self._upto = [], {}, 0

    def sync(self, ids: Sequence[int], upto: int) -> None:
        m = len(self.ids)
        if len(ids) < m or list(ids[:m]) != self.ids:
            self.reset()
            m = 0
        self.ids.extend(int(t) for t in ids[m:])
        if upto < self._upto:                         # never un-index: rebuild (rare)
            self._ends, self._upto = {}, 0
        seq, ends = self.ids, self._ends
        for e in range(self._upto + 1, upto + 1):
            for n in range(self.n_min, min(self.n_max, e) + 1):
                ends.setdefault(tuple(seq[e - n: e]), []).append(e)
        self._upto = max(self._upto, upto)

    def find(self, gram: tuple[int, ...]) -> int | None:
        e = self._ends.get(gram)
        return e[-1] if e else None

    def find_before(self, gram: tuple[int, ...], limit: int) -> int | None:
        e = self._ends.get(gram)
        if not e:
            return None
        i = bisect.bisect_right(e, limit)
        return e[i - 1] if i else None


def check_lookup_options(ngram_min: int, ngram_max: int, copy_ratio: float) -> None:
    """ConfigError unless 1 <= ngram_min <= ngram_max and copy_ratio is 0 or >= 1/ngram_max."""
    if not 1 <= ngram_min <= ngram_max:
        raise ConfigError(f"--lookup-ngram-min/max: need 1 <= min <= max, got {ngram_min}, {ngram_max}")
    if not (copy_ratio == 0 or copy_ratio >= 1 / ngram_max):        # (NaN fails both)
        raise ConfigError(f"--lookup-copy-ratio must be 0 (no cap) or at least 1/ngram_max, got {copy_ratio}")


class Match(NamedTuple):
    """A prompt-lookup match: n tokens matched, the copy starts at src of the context."""
    n: int
    src: int
    resumed: bool = False


class PromptLookupDrafter(Drafter):
    """Drafts by copying: find the context's last n-gram earlier in the context (prompt or
    output), and propose the tokens that followed it.

    Rule: the longest suffix n-gram with an earlier occurrence, n from ngram_max down to
    ngram_min; of its occurrences, the most recent one (the copy nearest in the text; an O(1)
    incremental index).  The copy is LZ77-style and may overlap the tokens it is producing,
    so a periodic suffix (`a b a b`) continues its period.  No match: an empty draft.
    copy_ratio (default 1): a match of n tokens copies at most copy_ratio · n of the n_max
    tokens asked (0: always n_max) — the match length is the evidence of re-typing.

    resume=True (off by default): after an edit breaks a copy, for the smallest
    e <= RESUME_EDIT_MAX such that the context without its last e tokens ends with an n-gram
    of at least RESUME_ANCHOR tokens seen earlier (ending at j), draft what followed the
    source token at j; used when it anchors on a longer n-gram than the suffix rule's match,
    under its own key `prompt-lookup/resume`.

    q rows are one-hot on the copied tokens: the draft is a deterministic function of the
    context, so it is exactly "x ~ q", and verification keeps the target's law (Leviathan et
    al. 2023, Algorithm 1).  Why these rules and what they measured: docs/speculative.md
    ("How much prompt lookup copies", "Prompt lookup across an edit")."""

    source = "prompt-lookup"

    BUCKETS = ((16, "16+"), (8, "8-15"), (5, "5-7"), (3, "3-4"), (1, "1-2"))   # match n -> key
    RESUME_EDIT_MAX = 4       # tokens an edit may have added since the copy broke off
    RESUME_ANCHOR = 4         # shortest n-gram a resumed copy anchors on

    def __init__(self, n_vocab: int, ngram_max: int = 16, ngram_min: int = 2, resume: bool = False,
                 copy_ratio: float = 1.0):
        check_lookup_options(ngram_min, ngram_max, copy_ratio)
        self.n_vocab, self.ngram_min, self.ngram_max = int(n_vocab), int(ngram_min), int(ngram_max)
        self.copy_ratio = float(copy_ratio)
        self.resume = bool(resume) and self.ngram_max >= self.RESUME_ANCHOR
        self.index = NgramIndex(min(self.ngram_min, self.RESUME_ANCHOR) if self.resume else self.ngram_min,
                                self.ngram_max)

    def reset(self) -> None:
        self.index.reset()

    def key(self, context_ids: Sequence[int]) -> str:
        """'prompt-lookup/<n>': the length bucket of the n-gram the next draft copies after
        (longer matches copy longer runs), or 'prompt-lookup/none'."""
        return self.key_of(self.match(context_ids))

    def key_of(self, hit: "Match | None") -> str:
        """The key of a `match` result."""
        if hit is None:
            return f"{self.source}/none"
        if hit.resumed:
            return f"{self.source}/resume"
        return f"{self.source}/" + next(name for lo, name in self.BUCKETS if hit.n >= lo)

    def match(self, context_ids: Sequence[int]) -> "Match | None":
        """Match(n, src, resumed): the n-gram matched (the anchor when resumed) and where the
        copy starts, or None."""
        L = len(context_ids)
        self.index.sync(context_ids, L - 1)          # occurrences that end before the suffix does
        ids = self.index.ids
        hit = None
        for n in range(min(self.ngram_max, L - 1), self.ngram_min - 1, -1):
            end = self.index.find(tuple(ids[L - n:]))
            if end is not None:
                hit = Match(n, end)
                break
        if self.resume and (hit is None or hit.n < self.ngram_max):
            r = self._resumed(ids, L)
            if r is not None and (hit is None or r.n > hit.n):
                return r
        return hit

    def _resumed(self, ids: list[int], L: int) -> "Match | None":
        """The resumed copy (class docstring), or None."""
        for e in range(1, min(self.RESUME_EDIT_MAX, L - self.RESUME_ANCHOR - 1) + 1):
            cut = L - e                               # the context before the e new tokens
            for n in range(min(self.ngram_max, cut - 1), self.RESUME_ANCHOR - 1, -1):
                j = self.index.find_before(tuple(ids[cut - n: cut]), cut - 1)
                if j is not None:
                    return Match(n, j + 1, True) if j + 1 < L else None
        return None

    def copy_len(self, hit: Match, n_max: int) -> int:
        """Tokens to copy after a match: n_max, at most copy_ratio tokens per matched token."""
        return n_max if self.copy_ratio == 0 else min(n_max, max(1, int(self.copy_ratio * hit.n)))

    def tokens(self, context_ids: Sequence[int], n_max: int) -> list[int]:
        """The ids `propose` drafts after this context (empty without a match)."""
        hit = self.match(context_ids) if n_max > 0 else None
        if hit is None:
            return []
        n_max = self.copy_len(hit, n_max)
        ids, L, src = self.index.ids, len(context_ids), hit.src
        tokens: list[int] = []
        for k in range(n_max):                        # src + k < L + k: the copy reads ahead of itself
            i = src + k
            tokens.append(ids[i] if i < L else tokens[i - L])
        return tokens

    def propose(self, context_ids: Sequence[int], n_max: int, rng: Rng) -> Draft:
        tokens = self.tokens(context_ids, n_max)
        if not tokens:
            return Draft.empty(self.n_vocab, self.source)
        q = np.zeros((len(tokens), self.n_vocab), dtype=np.float64)   # (n, V) one-hot rows
        q[np.arange(len(tokens)), tokens] = 1.0
        return Draft(tuple(tokens), q, self.source)

    def accept(self, n_accepted: int, next_token: int) -> None:
        pass                                          # the next propose indexes the new tokens


class HybridDrafter(Drafter):
    """Prompt lookup when it has a match, the model drafter otherwise.

    Which one drafts is a function of the context alone (never of the rng), so each draft is
    still x ~ q for the q it reports.  The model drafter's cache is not touched on lookup
    steps: its next `propose` rolls back to the common prefix with the context and evaluates
    everything it missed in one batch (ModelDrafter's lazy catch-up)."""

    def __init__(self, lookup: PromptLookupDrafter, model: ModelDrafter):
        if lookup.n_vocab != model.n_vocab:
            raise ValueError(f"hybrid drafter: lookup over {lookup.n_vocab} ids, model over {model.n_vocab}")
        self.lookup, self.model, self.n_vocab = lookup, model, model.n_vocab
        self._by: Drafter | None = None               # who made the last proposal

    def reset(self) -> None:
        self.lookup.reset()
        self.model.reset()
        self._by = None

    def key(self, context_ids: Sequence[int]) -> str:
        """The lookup's key when it matches, else the model's."""
        hit = self.lookup.match(context_ids)
        return self.lookup.key_of(hit) if hit else self.model.source

    def propose(self, context_ids: Sequence[int], n_max: int, rng: Rng) -> Draft:
        draft = self.lookup.propose(context_ids, n_max, rng)
        self._by = self.lookup
        if not draft.tokens and n_max > 0:
            draft = self.model.propose(context_ids, n_max, rng)
            self._by = self.model
        return draft

    def prefill(self, context_ids: Sequence[int]) -> None:
        self.model.prefill(context_ids)

    def accept(self, n_accepted: int, next_token: int) -> None:
        if self._by is not None:
            self._by.accept(n_accepted, next_token)
        self._by = None


# ---- construction ----------------------------------------------------------------------------

DRAFTER_NAMES = ("model", "prompt-lookup", "hybrid")


def make_drafter(draft, target, params: SamplerParams, *, draft_model=None, draft_p: float = 0.0,
                 n_ctx: int | None = None, lookup_ngram_min: int = 2,
                 lookup_ngram_max: int = 16, draft_vocab: int | None = None,
                 lookup_copy_ratio: float = 1.0) -> Drafter:
    """A Drafter for `target` (a specdec Model) from what the caller passed as `draft`:

      a Drafter object (has `propose`)   used as is;
      a Model                            ModelDrafter over its own session;
      'model'                            ModelDrafter over `draft_model`;
      'prompt-lookup'                    PromptLookupDrafter(lookup_ngram_max, lookup_ngram_min,
                                         copy_ratio=lookup_copy_ratio);
      'hybrid'                           HybridDrafter(prompt lookup, ModelDrafter(draft_model)).

    draft_p: the model drafter's confidence floor (policy.p_min); draft_vocab: the draft model
    computes logits for ids below it only (None: all).  The draft model's
    vocabulary is checked against the target's (compat.check_compatible)."""
    n_vocab = int(target.config.n_vocab)
    n_ctx = int(n_ctx or target.n_ctx)

    def model_drafter(m) -> ModelDrafter:
        if m is None:
            raise ConfigError(f"--draft {draft} needs a draft model (-md / draft_model=)")
        check_compatible(target.tokenizer, m.tokenizer, target.name, m.name)
        return ModelDrafter(m.session(n_ctx, n_logits=draft_vocab), params, draft_p, n_vocab=n_vocab)

    def lookup() -> PromptLookupDrafter:
        return PromptLookupDrafter(n_vocab, ngram_max=lookup_ngram_max, ngram_min=lookup_ngram_min,
                                   copy_ratio=lookup_copy_ratio)

    if isinstance(draft, str):
        if draft == "model":
            return model_drafter(draft_model)
        if draft == "prompt-lookup":
            return lookup()
        if draft == "hybrid":
            return HybridDrafter(lookup(), model_drafter(draft_model))
        raise ConfigError(f"--draft must be one of {', '.join(DRAFTER_NAMES)}, got {draft!r}")
    if isinstance(draft, Drafter):
        return draft
    if hasattr(draft, "session"):                     # a Model (api.py imports this module)
        return model_drafter(draft)
    raise ConfigError(f"draft= takes a Model, a Drafter or one of {', '.join(DRAFTER_NAMES)}; "
                      f"got {type(draft).__name__}")
