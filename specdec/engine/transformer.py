"""The transformer: one `forward` over the weights (weights.py), and a Session.

Architectures: llama and mistral3 (Llama 3.1's rope_freqs; optional output and FFN biases),
qwen2 (QKV biases, NEOX RoPE), qwen3 (q/k norms, NEOX), phi3 (fused attn_qkv and gate|up,
NEOX), smollm3 (no RoPE on every 4th layer), gemma3 (scaled embeddings, q/k norms,
post-attention / post-FFN norms, GeGLU, sliding-window local layers with their own RoPE base),
qwen3moe (qwen3's attention, a mixture of experts in place of the FFN) and llama files with
experts (Mixtral: top-2), whose router and experts are engine/moe.py.
A tensor the forward pass does not read is refused by name (never silently left out).
`forward` processes M new tokens at once and returns logits for every one of them; every
kernel it calls is row-independent, so a row's logits are the same bits for any M.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Sequence

import numpy as np

from ..kernels import get_rows
from ..kernels.attention import attention
from ..kernels.attention_tree import attention_tree, tree_mask
from ..kernels.ops import geglu, rms_norm, rms_norm_heads, rope_apply, rope_cos_sin, swiglu

from .config import ROPE_NEOX, ModelConfig
from ..errors import ConfigError, NumericalError, UnsupportedModelError
from ..generation.interfaces import Routing, Session
from .kv_cache import KVCache
from .qwen35 import hybrid_layer, new_hybrid_cache
from .recurrent import HybridCache
from .thread_count import GOVERNOR
from .weights import Layer, Linear, Weights

UBATCH = 128       # rows per pass of a long prompt (docs/architecture.md, "Tuned constants")


def _qkv(L: Layer, h: np.ndarray, H: int, Hkv: int, Dh: int):
    """q (M, H, Dh), k, v (M, Hkv, Dh) from the normed input h (M, D): three matmuls, or one
    fused attn_qkv split in that order (as llama.cpp's build_qkv)."""
    M = h.shape[0]
    if L.wqkv is None:
        return L.wq(h).reshape(M, H, Dh), L.wk(h).reshape(M, Hkv, Dh), L.wv(h).reshape(M, Hkv, Dh)
    qkv = L.wqkv(h)                                                              # (M, (H + 2 Hkv) Dh)
    ends = np.cumsum([H * Dh, Hkv * Dh])
    q, k, v = np.split(qkv, ends, axis=1)
    return (np.ascontiguousarray(q).reshape(M, H, Dh), np.ascontiguousarray(k).reshape(M, Hkv, Dh),
            np.ascontiguousarray(v).reshape(M, Hkv, Dh))


def _gate_up(L: Layer, h: np.ndarray):
    """gate, up (M, F) each: two matmuls, or phi3's one ffn_up whose first half is the gate
    (ggml_swiglu: silu of the first half times the second)."""
    if L.w_gate is not None:
        return L.w_gate(h), L.w_up(h)
    gu = L.w_up(h)                                                               # (M, 2F)
    F = gu.shape[1] // 2
    return np.ascontiguousarray(gu[:, :F]), np.ascontiguousarray(gu[:, F:])


def rope_factors(cfg: ModelConfig, w: Weights, local: bool) -> np.ndarray:
    """(rope_dim/2,) float32 divisors of the RoPE frequencies: the rope_freqs tensor of
    Llama 3.1+ (llama.cpp passes it to ggml_rope_ext on every layer), ones without it."""
    if w.rope_freqs is not None and not local:
        return w.rope_freqs
    return np.ones(cfg.rope_dim // 2, np.float32)


def forward(cfg: ModelConfig, w: Weights, cache: KVCache, tokens: np.ndarray, start_pos: int,
            last_only: bool = False, head: Linear | None = None, stats: list | None = None,
            hidden: dict | None = None) -> np.ndarray:
    """tokens (M,) at positions start_pos.. -> logits (M, V), or (1, V) for the last row only;
    head: an output layer to use instead of w.output (Session's n_logits: its first rows);
    stats: a MoE model appends, per layer and pass, the number of distinct experts woken;
    hidden: {cache: []} gets, per pass, the (M, D) hidden state of every row, the head's input
    rms(x)·output_norm (what llama.cpp hands an MTP head: t_h_nextn), whatever last_only says.

    Writes the new keys/values into `cache` at start_pos..start_pos+M-1 and sets n_past.
    A prompt of more than UBATCH rows goes through in passes of UBATCH rows (each row's
    logits are the same bits in any pass: only the activations' working set changes)."""
    if len(tokens) <= UBATCH:
        return _forward(cfg, w, [Item(cache, tokens, start_pos, last_only)], head, stats=stats, hidden=hidden)[0]
    parts = []
    for i in range(0, len(tokens), UBATCH):
        chunk = tokens[i:i + UBATCH]
        out = _forward(cfg, w, [Item(cache, chunk, start_pos + i, last_only)], head, stats=stats, hidden=hidden)[0]
        if not last_only or i + UBATCH >= len(tokens):
            parts.append(out)
    return parts[0] if len(parts) == 1 else np.concatenate(parts)


def forward_batch(cfg: ModelConfig, weights: Weights, items, head: Linear | None = None,
                  stats: list | None = None, hidden: dict | None = None) -> list[np.ndarray]:
    """One forward pass over the new rows of several sequences of one model: items is a
    sequence of (cache, tokens, last_only), each cache its own KVCache, its tokens (M_i,) at
    positions cache.n_past..; returns each item's logits, (M_i, V) or (1, V) for last_only.

    Every Linear runs once over all ΣM_i rows (the weights are read once per step), RoPE,
    the KV store and attention per item over its own cache; every kernel is row-independent,
    so each item's logits and cache contents are bitwise those of `forward` on it alone.  An
    item of more than UBATCH rows (a whole prompt) passes its leading rows alone first, in
    `forward`'s passes, and joins the batch with its last UBATCH."""
    items = [(c, np.asarray(t), lo) for c, t, lo in items]
    leads = [forward(cfg, weights, c, t[:len(t) - UBATCH], c.n_past, lo, head, hidden=hidden)
             if len(t) > UBATCH else None for c, t, lo in items]
    outs = _forward(cfg, weights, [Item(c, t[-UBATCH:], c.n_past, lo) for c, t, lo in items], head,
                    stats=stats, hidden=hidden)
    return [o if lead is None or lo else np.concatenate([lead, o])
            for (_, _, lo), lead, o in zip(items, leads, outs)]


def forward_tree(cfg: ModelConfig, w: Weights, cache: KVCache, tokens: np.ndarray,
                 parents: np.ndarray, head: Linear | None = None, stats: list | None = None) -> np.ndarray:
    """A token tree after the cache's n_past rows, in one pass: tokens (T,), parents (T,)
    (-1: a root, else an earlier node) -> logits (T, V), row i those of i's root-to-i path
    evaluated alone after the context (bitwise: kernels/attention_tree.py).

    Node i's keys/values go to slot n_past + i at RoPE position n_past + depth(i); n_past is
    left as it was (the tree rows are pending until KVCache.move puts a path in place)."""
    if cfg.is_hybrid:
        raise UnsupportedModelError(f"{cfg.arch}: a token tree needs an attention-only model (its recurrent "
                                    "state keeps one path)")
    start = cache.n_past
    depth, anc = tree_mask(np.asarray(parents, np.int64))
    out = _forward(cfg, w, [Item(cache, tokens, start, False)], head, tree=(depth, anc), stats=stats)[0]
    cache.n_past = start
    return out


@dataclass(frozen=True)
class Item:
    """One sequence's share of a forward pass."""
    cache: KVCache        # its own KV cache
    tokens: object        # (M_i,) new token ids
    start: int            # the position of tokens[0]
    last_only: bool       # logits of its last row only


@dataclass(frozen=True)
class RowLayout:
    """Where each item's rows sit in the pass."""
    toks: list            # (M_i,) int64 each
    rows: list            # item i: x[rows[i]] (slices of the M rows)
    pos: np.ndarray       # (M,) each row's RoPE position
    tree: tuple | None    # (depth (T,), anc (T, T)) of a single item's tree_mask


def _row_layout(items: list[Item], tree) -> RowLayout:
    """Check the items (rows, distinct caches, room) and lay their rows end to end."""
    toks = [np.asarray(it.tokens, np.int64) for it in items]                      # (M_i,) each
    if not items or min(len(t) for t in toks) == 0:
        raise ValueError("forward needs at least one item, each with at least one token")
    if len({id(it.cache) for it in items}) != len(items):
        raise ValueError("forward_batch: each item needs its own KV cache")
    for it, t in zip(items, toks):
        if it.start < it.cache.n_past:
            it.cache.truncate(it.start)         # (a recurrent state rolls back: engine/recurrent.py)
        it.cache.check_room(it.start - it.cache.n_past + len(t))
    ends = np.cumsum([len(t) for t in toks])                                      # (B,) row ends
    rows = [slice(e - len(t), e) for t, e in zip(toks, ends)]
    pos = np.concatenate([np.arange(it.start, it.start + len(t), dtype=np.int64)  # (M,) each row's
                          for it, t in zip(items, toks)])                         # own position
    if tree is not None:
        pos = items[0].start + tree[0]                                            # n_past + depth
    return RowLayout(toks, rows, pos, tree)


def _forward(cfg: ModelConfig, w: Weights, items: list[Item], head: Linear | None,
             tree: tuple[np.ndarray, np.ndarray] | None = None, stats: list | None = None,
             hidden: dict | None = None) -> list[np.ndarray]:
    """The body of forward, forward_batch and forward_tree: embed, the layers, the head."""
    layout = _row_layout(items, tree)
    if cfg.is_hybrid:
        for it, t in zip(items, layout.toks):
            _rebuild(cfg, w, it.cache)
            it.cache.rec.begin(it.start, t)
    x = get_rows(w.tok_embd, w.tok_embd_type, np.concatenate(layout.toks), cfg.d_model)  # (M, D)
    if cfg.embed_scale != 1.0:
        x *= np.float32(cfg.embed_scale)
    rope_cs: dict[tuple, np.ndarray] = {}                       # (base, local) -> cos, sin
    for il, L in enumerate(w.layers):
        if cfg.is_hybrid:
            hybrid_layer(cfg, il, L, x, items, layout.rows, layout.pos, rope_cs)
        else:
            _layer(cfg, w, il, L, x, items, layout, rope_cs, stats)
    for it, t in zip(items, layout.toks):
        it.cache.n_past = it.start + len(t)
        if cfg.is_hybrid:
            it.cache.rec.end()
    return _logits(cfg, w, x, items, layout, head, hidden)


def _rebuild(cfg: ModelConfig, w: Weights, cache: HybridCache) -> None:
    """A recurrent state truncated to before its last pass (recurrent.py, `stale`): the kept
    positions' tokens evaluated again from position 0 (the same bits as before)."""
    n = cache.rec.stale
    if n:
        ids = cache.rec.ids[:n].copy()
        cache.rec.reset()
        cache.n_past = 0
        forward(cfg, w, cache, ids, 0, last_only=True)


def _layer(cfg: ModelConfig, w: Weights, il: int, L: Layer, x: np.ndarray, items, layout: RowLayout,
           rope_cs: dict, stats: list | None = None) -> None:
    """Layer il on the residual stream x (M, D), in place; each item's keys and values
    stored in its cache, attention per item over its own cache; stats (MoE): gets the
    number of distinct experts the pass woke in this layer."""
    H, Hkv, Dh = cfg.n_head, cfg.n_head_kv, cfg.d_head
    M = x.shape[0]
    gemma = cfg.arch == "gemma3"
    h = np.empty_like(x)                                                         # (M, D)
    rms_norm(x, L.attn_norm, cfg.norm_eps, h)
    q, k, v = _qkv(L, h, H, Hkv, Dh)                    # (M, H, Dh), (M, Hkv, Dh), (M, Hkv, Dh)
    if L.q_norm is not None:
        rms_norm_heads(q, L.q_norm, cfg.norm_eps)
        rms_norm_heads(k, L.k_norm, cfg.norm_eps)
    local = cfg.is_local_layer(il)
    base = cfg.rope_base_local if local else cfg.rope_base
    if (base, local) not in rope_cs:
        rope_cs[base, local] = rope_cos_sin(layout.pos, cfg.rope_dim, base, 1.0 if local else cfg.rope_freq_scale,
                                            rope_factors(cfg, w, local))         # (M, rope_dim/2, 2)
    if cfg.uses_rope(il):                            # smollm3: every 4th layer has none
        rope_apply(q, rope_cs[base, local], cfg.rope_type == ROPE_NEOX)          # row m at pos[m]
        rope_apply(k, rope_cs[base, local], cfg.rope_type == ROPE_NEOX)
    if gemma:                        # llama.cpp scales Q, then attends with kq_scale 1
        q *= np.float32(cfg.attn_scale)
    att = np.empty((M, H, Dh), dtype=np.float32)                                 # (M, H, Dh)
    scale = np.float32(1.0 if gemma else cfg.attn_scale)
    window = cfg.sliding_window if local else 0
    for it, r in zip(items, layout.rows):
        it.cache.store(il, it.start, k[r], v[r])                                 # (M_i, Hkv, Dh)
        if layout.tree is None:
            attention(q[r], it.cache.k[il], it.cache.v[il], layout.pos[r], scale, window, att[r])
        else:
            attention_tree(q, it.cache.k[il], it.cache.v[il], it.start, layout.tree[0], layout.tree[1],
                           scale, window, att)
    o = L.wo(att.reshape(M, H * Dh))                                             # (M, D)
    if L.post_attn_norm is not None:
        rms_norm(o, L.post_attn_norm, cfg.norm_eps, o)
    x += o
    rms_norm(x, L.ffn_norm, cfg.norm_eps, h)
    if L.moe is not None:                            # router and experts (engine/moe.py)
        x += L.moe(h, stats)                                                     # (M, D)
        return
    gate, up = _gate_up(L, h)                                                    # (M, F) each
    (geglu if gemma else swiglu)(gate, up, gate)
    f = L.w_down(gate)                                                           # (M, D)
    if L.post_ffn_norm is not None:
        rms_norm(f, L.post_ffn_norm, cfg.norm_eps, f)
    x += f


def _logits(cfg: ModelConfig, w: Weights, x: np.ndarray, items, layout: RowLayout,
            head: Linear | None, hidden: dict | None = None) -> list[np.ndarray]:
    """The output norm and head over the rows that need logits (an item's last, or all of
    them) -> (M'_i, V) per item; hidden: gets every row's normed x per item's cache."""
    last = [it.last_only for it in items]
    if hidden is not None:
        rms_norm(x, w.out_norm, cfg.norm_eps, x)
        for it, r in zip(items, layout.rows):
            if it.cache in hidden:
                hidden[it.cache].append(x[r].copy())                             # (M_i, D)
    if any(last):
        x = x[np.concatenate([np.arange(r.stop - 1 if lo else r.start, r.stop)
                              for r, lo in zip(layout.rows, last)])]               # (ΣM'_i, D)
    if hidden is None:
        rms_norm(x, w.out_norm, cfg.norm_eps, x)
    logits = (head or w.output)(x)                                               # (ΣM'_i, V)
    if cfg.final_logit_softcap > 0:                  # gemma3 files that set one
        logits *= np.float32(1.0 / cfg.final_logit_softcap)
        np.tanh(logits, out=logits)
        logits *= np.float32(cfg.final_logit_softcap)
    n_kept = [1 if lo else len(t) for t, lo in zip(layout.toks, last)]              # M'_i: 1 or M_i
    return np.split(logits, np.cumsum(n_kept)[:-1])                              # (M'_i, V) each


class ModelSession(Session):
    """One model plus its own KV cache: the engine's interfaces.Session, the unit that
    generation and speculation drive.

    eval(tokens) appends tokens at positions n_past.. and returns their logits (M, n_logits);
    truncate(n) rolls the cache back to its first n tokens in O(1); eval_tree(tokens, parents)
    evaluates a token tree in one pass and commit_path(node_ids) keeps one of its paths.

    n_logits < V computes the logits of token ids 0..n_logits-1 only: the output layer is a
    zero-copy view of its first n_logits rows, so a draft model reads that much less of its
    head per token (BPE vocabularies are roughly ordered by merge frequency, so low ids are
    the common tokens).  Any id can still be fed in."""

    def __init__(self, cfg: ModelConfig, weights: Weights, n_ctx: int, n_logits: int | None = None,
                 source: str = "model"):
        self.cfg, self.weights, self.source = cfg, weights, source
        self.cache = (new_hybrid_cache(cfg, n_ctx) if cfg.is_hybrid
                      else KVCache(cfg.n_layer, cfg.n_head_kv, n_ctx, cfg.d_head))
        self._tree: tuple[int, tuple[int, ...]] | None = None   # (start, parents) of eval_tree
        self.last_experts: tuple[int, ...] = ()   # MoE: distinct experts per layer, last pass
        self.keep_hidden = False                  # set: eval keeps its rows' hidden states ...
        self.last_hidden: np.ndarray | None = None  # ... (M, D), rms(x)·output_norm (forward's hidden)
        self.hidden_rows: np.ndarray | None = None  # (n_ctx, D) them by position: valid for
        self.hidden_from = n_ctx                    # hidden_from <= t < n_past (engine/mtp_session.py reads them)
        self.n_logits = cfg.n_vocab if n_logits is None else int(n_logits)
        if not 1 <= self.n_logits <= cfg.n_vocab:
            raise ConfigError(f"--draft-vocab must be in 1..{cfg.n_vocab}, got {n_logits}")
        out = weights.output
        # a head in 8- or 16-row records (kernels/registry.py) is cut at a whole record: its
        # first n_rows >= n_logits rows are computed and the logits trimmed (row-independent:
        # the kept logits are the same bits)
        cut, n_rows = out.kernel.cut_rows(out.w, self.n_logits)
        self._head = None if self.n_logits == cfg.n_vocab else replace(
            out, w=cut, n_out=n_rows,
            bias=None if out.bias is None else out.bias[:n_rows])

    n_vocab = property(lambda self: self.cfg.n_vocab)
    _key = property(lambda self: (self.source, id(self.weights)))    # the governor's kind of pass
    n_ctx = property(lambda self: self.cache.n_ctx)
    n_past = property(lambda self: self.cache.n_past)

    def eval(self, tokens, last_only: bool = False) -> np.ndarray:
        tokens = self._checked(tokens)
        self._tree = None
        start = self.cache.n_past
        stats = self._stats()
        hidden = {self.cache: []} if self.keep_hidden else None
        logits = self._trim(GOVERNOR.run(self._key, len(tokens), lambda: forward(
            self.cfg, self.weights, self.cache, tokens, start, last_only, self._head, stats, hidden)))
        self._keep(stats)
        self.last_hidden = np.concatenate(hidden[self.cache]) if hidden else None
        self._keep_rows(start)
        _check_finite([self], [start], [logits])
        return logits

    def _keep_rows(self, start: int) -> None:
        """The last pass's hidden rows into hidden_rows at their positions (keep_hidden); a pass
        not kept forgets them all."""
        if self.last_hidden is None:
            self.hidden_from = self.n_ctx
            return
        if self.hidden_rows is None:
            self.hidden_rows = np.zeros((self.n_ctx, self.cfg.d_model), np.float32)
        self.hidden_rows[start:start + len(self.last_hidden)] = self.last_hidden
        self.hidden_from = min(self.hidden_from, start)

    def _stats(self) -> list | None:
        return [] if self.cfg.is_moe else None

    def _keep(self, stats: list | None) -> None:
        """last_experts: the last pass's distinct experts per layer (a long prompt's last chunk)."""
        if stats:
            self.last_experts = tuple(stats[-self.cfg.n_layer:])

    def routing(self) -> Routing | None:
        """interfaces.Session.routing: (E, k, last_experts) of an MoE model, None for a dense one."""
        c = self.cfg
        return Routing(c.n_expert, c.n_expert_used, self.last_experts) if c.is_moe else None

    def _trim(self, logits: np.ndarray) -> np.ndarray:
        """(M, n_rows) -> (M, n_logits): the head's rows past n_logits (a record's tail)."""
        return logits if logits.shape[1] == self.n_logits else np.ascontiguousarray(logits[:, :self.n_logits])

    def eval_tree(self, tokens, parents) -> np.ndarray:
        """Evaluate a token tree after the cached context in one pass: tokens (T,), parents
        (T,) with parents[i] = -1 (a root: it follows the context) or an earlier node.
        Returns logits (T, n_logits); row i is bitwise the last row of eval(path to i) on this
        cache (node i attends to the context and its ancestors only; RoPE position n_past +
        depth).  n_past does not change: `commit_path` keeps one root-to-node path."""
        tokens = self._checked(tokens)
        parents = np.asarray(parents, dtype=np.int64)
        if parents.shape != tokens.shape:
            raise ValueError(f"eval_tree: {len(parents)} parents for {len(tokens)} tokens")
        start = self.cache.n_past
        stats = self._stats()
        logits = self._trim(GOVERNOR.run(self._key, len(tokens), lambda: forward_tree(
            self.cfg, self.weights, self.cache, tokens, parents, self._head, stats)))
        self._keep(stats)
        self._tree = None
        _check_finite([self], [start], [logits])
        self._tree = (start, tuple(int(a) for a in parents))
        return logits

    def commit_path(self, node_ids) -> None:
        """Keep the path node_ids (a root of the last eval_tree, then each node a child of the
        one before) in the cache after the context: its rows move into place, the rest of the
        tree is dropped; the cache then equals eval(the path's tokens) on the context."""
        start, parents = self._tree or (None, ())
        path = [int(i) for i in node_ids]
        if start is None or self.cache.n_past != start:
            raise ValueError("commit_path: no tree is pending (eval_tree first, no eval in between)")
        for d, i in enumerate(path):
            if not 0 <= i < len(parents) or parents[i] != (path[d - 1] if d else -1):
                raise ValueError(f"commit_path: {path} is not a root-to-node path of the tree")
        self.cache.move([start + i for i in path], start)
        self._tree = None

    def _checked(self, tokens) -> np.ndarray:
        """tokens as (M,) int64 after the checks of eval: non-empty, ids in range, room left."""
        tokens = np.asarray(tokens, dtype=np.int64)
        if tokens.ndim != 1 or len(tokens) == 0:
            raise ValueError("eval needs a non-empty 1-D sequence of token ids")
        if tokens.min() < 0 or tokens.max() >= self.cfg.n_vocab:
            raise ValueError(f"token id out of range 0..{self.cfg.n_vocab - 1}")
        self.cache.check_room(len(tokens))
        return tokens

    def truncate(self, n: int) -> None:
        self.cache.truncate(n)
        self._tree = None

    def reset(self) -> None:
        self.truncate(0)


def eval_batch(sessions, token_lists, last_only: bool | Sequence[bool] = False) -> list[np.ndarray]:
    """Session.eval of each session on its own tokens, in one batched forward pass
    (forward_batch): the weights are read once for all of them, and each session's logits
    (M_i, n_logits) — or (1, n_logits) where its last_only is set — and cache are bitwise
    those its own eval gives.   The sessions must be distinct and share one model's weights
    and n_logits; every check is made before any cache changes."""
    sessions = list(sessions)
    token_lists = list(token_lists)
    last = [bool(last_only)] * len(sessions) if np.ndim(last_only) == 0 else [bool(b) for b in last_only]
    if not sessions or len(token_lists) != len(sessions) or len(last) != len(sessions):
        raise ValueError("eval_batch needs one token list (and last_only) per session, and a session")
    s0 = sessions[0]
    if len({id(s) for s in sessions}) != len(sessions):
        raise ValueError("eval_batch: a session appears twice")
    if any(s.weights is not s0.weights or s.cfg is not s0.cfg or s.n_logits != s0.n_logits
           for s in sessions):
        raise ValueError("eval_batch: the sessions must share one model's weights and n_logits")
    toks = [s._checked(t) for s, t in zip(sessions, token_lists)]
    starts = [s.n_past for s in sessions]
    stats = s0._stats()
    hidden = {s.cache: [] for s in sessions if s.keep_hidden} or None
    out = GOVERNOR.run(s0._key, sum(map(len, toks)), lambda: forward_batch(
        s0.cfg, s0.weights, [(s.cache, t, lo) for s, t, lo in zip(sessions, toks, last)], s0._head, stats,
        hidden))
    for s in sessions:
        s.last_hidden = np.concatenate(hidden[s.cache]) if hidden and s.cache in hidden else None
    for s, start in zip(sessions, starts):
        s._keep_rows(start)
    for s in sessions:                  # the batch's pass: the experts all its rows woke
        s._keep(stats)
    out = [s0._trim(lg) for lg in out]
    _check_finite(sessions, starts, out)
    return out


def _check_finite(sessions, starts, logits) -> None:
    """NumericalError, every cache rolled back to its start, if any logits are not finite
    (~50 us per row of 150k: cheap next to the pass)."""
    bad = [i for i, lg in enumerate(logits) if not np.isfinite(lg).all()]
    if not bad:
        return
    for s, start in zip(sessions, starts):
        s.cache.truncate(start)
    s, start = sessions[bad[0]], starts[bad[0]]
    raise NumericalError(f"{s.source}: non-finite logits for the rows from position {start} on "
                         f"(corrupt or out-of-range weights)")
