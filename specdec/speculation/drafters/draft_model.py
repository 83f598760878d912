"""ModelDrafter: a small model drafts token by token on its own KV cache.

p is always the target's distribution, q the draft's.
"""
from __future__ import annotations

import copy
import time
from typing import Sequence

import numpy as np

from ...generation.constraint import masked
from ...generation.interfaces import Session
from ...generation.sampling import Rng, SamplerParams, probs, top_prob
from ..policies import check_draft_p
from .base import Draft, DraftTree, Drafter
from .mirror import CacheMirror


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

    window: the draft sees the context from `origin` on only, origin = the first proposal's
    context length less window (None: the whole context): its prompt pass is at most window
    tokens, whatever the prompt's length; a function of counts alone.  lazy: `prefill` does
    nothing, the first `propose` catches the cache up instead (the same draft logits bit for
    bit: row independence).  Neither changes the output law: the draft only proposes.
    """

    source = "model"

    def __init__(self, session: Session, params: SamplerParams, draft_p: float = 0.0,
                 n_vocab: int | None = None, *, window: int | None = None, lazy: bool = False):
        check_draft_p(draft_p)
        if window is not None and int(window) < 1:
            raise ValueError(f"draft window must be >= 1 token, got {window}")
        self.window, self.lazy = (None if window is None else int(window)), bool(lazy)
        self.session, self.params, self.draft_p = session, params, float(draft_p)
        self.n_vocab = int(n_vocab if n_vocab is not None else session.n_vocab)
        self._shared = min(self.n_vocab, session.n_logits)   # ids it may propose
        self.cache = CacheMirror(session)                   # the draft cache's ids
        self._last: tuple[int, tuple[int, ...]] | None = None   # (context length, drafted) of the last proposal

    @property
    def origin(self) -> int | None:
        """Where the draft's view of the context starts (kept with its cache: views share it)."""
        return self.cache.origin

    @origin.setter
    def origin(self, at: int | None) -> None:
        self.cache.origin = at

    def windowed(self, window: int | None, lazy: bool) -> "ModelDrafter":
        """This drafter for one request with its own window and lazy: a copy on the same
        session, cache and view, so that what it evaluates serves later requests too; this
        one is left as it is (another request or turn may hold it)."""
        if window is not None and int(window) < 1:
            raise ValueError(f"draft window must be >= 1 token, got {window}")
        view = copy.copy(self)
        view.window, view.lazy = (None if window is None else int(window)), bool(lazy)
        return view

    def reset(self) -> None:
        self.cache.reset()
        self._last = None

    def view(self, context_ids: Sequence[int]) -> list[int]:
        """The part of the context the draft sees (class docstring: window)."""
        if self.origin is None:
            self.origin = 0 if self.window is None else max(0, len(context_ids) - self.window)
        if self.origin > len(context_ids):                 # a shorter context: start again
            self.origin = 0 if self.window is None else max(0, len(context_ids) - self.window)
        return list(context_ids[self.origin:])

    def propose(self, context_ids: Sequence[int], n_max: int, rng: Rng) -> Draft:
        ctx = self.view(context_ids)
        # room: the context plus every drafted token but the last must fit the draft cache
        n_max = min(n_max, self.session.n_ctx - len(ctx) + 1)
        self._last = (len(ctx), ())
        if n_max <= 0 or not ctx:
            return Draft.empty(self.n_vocab, self.source)
        keep = self.cache.keep(ctx, len(ctx) - 1)                  # the last id must be re-fed
        t0 = time.perf_counter()
        logits = self.cache.eval(ctx[keep:])                      # (V_draft,) catch-up, one batch
        catchup_s = time.perf_counter() - t0 if len(ctx) - keep > 1 else 0.0
        tokens: list[int] = []
        qs: list[np.ndarray] = []
        c, pushed = self.constraint, 0                             # c: advanced along the draft, then back
        try:
            while True:
                row = self._row(logits)                            # (V_shared,) masked, or None
                if row is None or (self.draft_p > 0.0 and top_prob(row) < self.draft_p):
                    break
                q = np.zeros(self.n_vocab, dtype=np.float64)       # (V,)
                q[: self._shared] = probs(row, self.params)
                x = int(rng.categorical(q))
                tokens.append(x)
                qs.append(q)
                if len(tokens) >= n_max or (c is not None and x in c.eos_ids):
                    break                                          # the last draft is not evaluated
                if c is not None:
                    c.advance(x)
                    pushed += 1
                logits = self.cache.eval([x])
        finally:
            if c is not None:
                c.rollback(pushed)
        self._last = (len(ctx), tuple(tokens))
        q_mat = np.stack(qs) if qs else np.zeros((0, self.n_vocab))   # (n, V)
        return Draft(tuple(tokens), q_mat, self.source, catchup_s)

    def propose_tree(self, context_ids: Sequence[int], n_max: int, k: int, rng: Rng) -> DraftTree:
        """k branches: the first tokens are the draft's k most likely ids at temperature 0
        (q one-hot on each, a function of the context) and k i.i.d. draws from q otherwise
        (a repeated token is left a leaf: it can never be accepted, see tree_verify); each
        is continued as `propose` continues, up to n_max tokens in all, one branch after
        the other on the draft cache.  The first tokens do not wait for confidence draft_p
        (covering the draft's doubt is what the branches are for); their continuations do."""
        ctx = self.view(context_ids)
        n_max = min(n_max, self.session.n_ctx - len(ctx) + 1)
        self._last = None                                          # accept: nothing to roll back
        if n_max <= 0 or not ctx or k <= 1:
            return DraftTree.of(self.propose(context_ids, n_max, rng))
        keep = self.cache.keep(ctx, len(ctx) - 1)
        row = self._row(self.cache.eval(ctx[keep:]))                    # (V_shared,) after the context, masked
        if row is None:
            return DraftTree.of(Draft.empty(self.n_vocab, self.source))
        q0 = np.zeros(self.n_vocab, dtype=np.float64)              # (V,)
        q0[: self._shared] = probs(row, self.params)
        if self.params.greedy:
            firsts = [int(x) for x in np.argsort(-row, kind="stable")[:k] if np.isfinite(row[x])]
            qs0 = [np.eye(1, self.n_vocab, x, dtype=np.float64)[0] for x in firsts]
        else:
            firsts = [int(rng.categorical(q0)) for _ in range(k)]
            qs0 = [q0] * k
        tokens: list[int] = []
        parents: list[int] = []
        qs: list[np.ndarray] = []
        c = self.constraint
        for j, (x, q) in enumerate(zip(firsts, qs0)):
            node = len(tokens)
            tokens.append(x)
            parents.append(-1)
            qs.append(q)
            if x in firsts[:j]:                                    # a repeat: never accepted
                continue
            self.cache.truncate(len(ctx))                            # the cache holds the context
            pushed = 0
            try:
                for _ in range(n_max - 1):                         # the last draft is not evaluated
                    if c is not None:
                        if tokens[node] in c.eos_ids:
                            break
                        c.advance(tokens[node])
                        pushed += 1
                    logits = self._row(self.cache.eval([tokens[node]]))
                    if logits is None or (self.draft_p > 0.0 and top_prob(logits) < self.draft_p):
                        break
                    qd = np.zeros(self.n_vocab, dtype=np.float64)  # (V,)
                    qd[: self._shared] = probs(logits, self.params)
                    tokens.append(int(rng.categorical(qd)))
                    parents.append(node)
                    qs.append(qd)
                    node = len(tokens) - 1
            finally:
                if c is not None:
                    c.rollback(pushed)
        return DraftTree(tuple(tokens), tuple(parents), np.stack(qs), self.source)

    def prefill(self, context_ids: Sequence[int]) -> None:
        """Evaluate the context but its last id, in the prompt phase (as the target does), so
        that the first `propose` only feeds that id (lazy: nothing, see the class docstring)."""
        if self.lazy:
            return
        ctx = self.view(context_ids)
        keep = self.cache.keep(ctx, len(ctx) - 1)
        if len(ctx) - 1 > keep:
            self.cache.eval(ctx[keep:-1])

    def accept(self, n_accepted: int, next_token: int) -> None:
        """Roll the cache back to the accepted part of the last proposal."""
        if self._last is None:
            return
        n_ctx, drafted = self._last
        if not 0 <= n_accepted <= len(drafted):
            raise ValueError(f"accept: {n_accepted} accepted out of {len(drafted)} drafted")
        self.cache.truncate(n_ctx + n_accepted)
        self._last = None

    def _row(self, logits: np.ndarray) -> np.ndarray | None:
        """The draft's logits over the ids it may propose (V_shared,), the forbidden ones at
        -inf under a constraint (masked before any warping, as the target's: q is then the
        masked, renormalised law); None when the constraint allows none of them."""
        row = logits[: self._shared]
        if self.constraint is None:
            return row
        m = self.constraint.mask()[: self._shared]
        return masked(row, m) if m.any() else None
