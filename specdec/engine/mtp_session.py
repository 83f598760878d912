"""The multi-token-prediction (MTP, `nextn`) block of a qwen35 file run as a Session of its
own: one gated-attention layer on its own KV cache, fed by the target's hidden states.

llama.cpp's graph_mtp (src/models/qwen35.cpp) and its draft-mtp driver
(common/speculative.cpp), restated: the block's row at position t reads the token x_t and
a hidden state h,

    e = rms(embed[x_t])·enorm;  g = rms(h)·hnorm;  x = [e | g]·eh_proj        (e first)
    x += gated_attention(rms(x)·attn_norm)   (q/k norms, M-RoPE at t, its own KV cache)
    x += FFN(rms(x)·post_attention_norm)
    h' = rms(x)·head_norm  (nextn.shared_head_norm, else output_norm);  logits = h'·headᵀ

and its logits are the law of x_{t+1}.  Which h: the target's hidden state at t - 1
(H_{t-1} = rms(x)·output_norm of the target's row t - 1, the input of its head; zeros at
t = 0, llama.cpp's first pending_h) for every row of the accepted context, and for a
drafted row, whose t - 1 the target has not evaluated yet, the block's own h' of row
t - 1 (llama.cpp's one-head chaining: the next draft step pairs the drafted token with the
h' that drafted it).  The rule is per position: the target session keeps its hidden rows
by position (ModelSession.keep_hidden), and a row reads them where the target has
evaluated t - 1, its predecessor's h' otherwise.  A drafted row in the cache is therefore
not the row the accepted context gives (its h differs): the drafter rolls the cache back to
its settled rows before a draft's tokens join the context.
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np

from ..errors import ConfigError
from ..generation.interfaces import Session
from .kv_cache import KVCache
from .qwen35 import mtp_forward
from .thread_count import GOVERNOR


class MTPSession(Session):
    """The MTP block on its own KV cache, as a Session: eval(tokens) appends rows at n_past..,
    each fed the hidden state `h_in` gives.  n_logits < V trims its head to the first
    n_logits ids, as ModelSession's (--draft-vocab).

    The target's hidden states come from the target session `attach`ed (it keeps them by
    position: target.hidden_rows[t] for target.hidden_from <= t < target.n_past).  A row is settled
    when its h is final: the target's H_{t-1}, or zeros (t = 0, or a position the target
    computed before it kept its hidden rows); a row that read its predecessor's h' (a
    drafted position) is not.  `n_settled`: the cache's leading settled rows."""

    def __init__(self, cfg, weights, n_ctx: int, n_logits: int | None = None):
        if weights.mtp is None:
            raise ConfigError("--draft mtp: the model file has no nextn (MTP) tensors")
        self.cfg, self.mtp = cfg, weights.mtp
        self.cache = KVCache(1, cfg.n_head_kv, n_ctx, cfg.d_head)
        self.n_logits = cfg.n_vocab if n_logits is None else int(n_logits)
        if not 1 <= self.n_logits <= cfg.n_vocab:
            raise ConfigError(f"--draft-vocab must be in 1..{cfg.n_vocab}, got {n_logits}")
        head = self.mtp.head
        cut, n_rows = head.kernel.cut_rows(head.w, self.n_logits)
        self._head = head if self.n_logits == cfg.n_vocab else replace(
            head, w=cut, n_out=n_rows, bias=None if head.bias is None else head.bias[:n_rows])
        self.h_out = np.zeros((n_ctx, cfg.d_model), np.float32)      # (n_ctx, D) row t's h'
        self.target = None                            # the session whose hidden rows it reads
        self.n_settled = 0
        self._zeros = np.zeros(cfg.d_model, np.float32)
        self._key = ("mtp", id(weights))

    n_vocab = property(lambda self: self.cfg.n_vocab)
    n_ctx = property(lambda self: self.cache.n_ctx)
    n_past = property(lambda self: self.cache.n_past)

    def attach(self, target) -> None:
        """Read target's hidden rows (it keeps them from its next pass on: keep_hidden)."""
        target.keep_hidden = True
        self.target = target

    def h_in(self, t: int) -> tuple[np.ndarray, bool]:
        """(the hidden state row t reads (D,), settled): class docstring."""
        tg = self.target
        if t == 0:
            return self._zeros, True
        if tg is not None and t - 1 < tg.n_past:
            rows = getattr(tg, "hidden_rows", None)
            if rows is not None and t - 1 >= tg.hidden_from:
                return rows[t - 1], True
            return self._zeros, True
        return self.h_out[t - 1], False

    def eval(self, tokens, last_only: bool = False) -> np.ndarray:
        tokens = np.asarray(tokens, np.int64)
        if tokens.ndim != 1 or len(tokens) == 0:
            raise ValueError("eval needs a non-empty 1-D sequence of token ids")
        if tokens.min() < 0 or tokens.max() >= self.cfg.n_vocab:
            raise ValueError(f"token id out of range 0..{self.cfg.n_vocab - 1}")
        self.cache.check_room(len(tokens))
        start, M = self.cache.n_past, len(tokens)
        logits, lo = [], 0
        while lo < M:              # one pass over rows whose h is known before it starts
            hs, hi = [], lo
            while hi < M:
                h, settled = self.h_in(start + hi)
                if not settled and hi > lo:
                    break          # it reads h' of a row of this pass: next pass
                hs.append(h)
                if start + hi == self.n_settled and settled:
                    self.n_settled += 1
                hi += 1
            lg = self._pass(tokens[lo:hi], np.stack(hs), start + lo)
            logits.append(lg)
            lo = hi
        out = np.concatenate(logits) if len(logits) > 1 else logits[0]          # (M, n_rows)
        if last_only:
            out = out[-1:]
        return out if out.shape[1] == self.n_logits else np.ascontiguousarray(out[:, :self.n_logits])

    def _pass(self, tokens: np.ndarray, h: np.ndarray, start: int) -> np.ndarray:
        lg, out = GOVERNOR.run(self._key, len(tokens), lambda: mtp_forward(
            self.cfg, self.mtp, self.cache, tokens, h, start, self._head))
        self.h_out[start:start + len(tokens)] = out
        return lg

    def truncate(self, n: int) -> None:
        self.cache.truncate(n)
        self.n_settled = min(self.n_settled, n)

    def reset(self) -> None:
        self.truncate(0)


class _ZeroHidden:
    """A stand-in target whose every position's hidden state is known (zeros): MTP rows
    then run in one pass each, as the real ones do."""

    def __init__(self, n_ctx: int, d_model: int):
        self.n_past = n_ctx
        self.hidden_rows = np.zeros((n_ctx, d_model), np.float32)
        self.hidden_from = 0


class MTPModel:
    """A target's MTP block as calibration.measure sees a model (path, requant, config,
    session): its passes cost what the block's do in drafting (speculation/calibration.py,
    variant 'mtp')."""

    def __init__(self, target):
        self.target, self.path, self.config = target, target.path, target.config
        self.name = f"{getattr(target, 'name', target.path)} (its MTP head)"
        self.requant = getattr(target, "requant", None)

    def session(self, n_ctx: int, n_logits: int | None = None) -> MTPSession:
        s = MTPSession(self.config, self.target.weights, n_ctx, n_logits)
        s.attach(_ZeroHidden(n_ctx, self.config.d_model))
        return s


def mtp_bytes(weights, n_logits: int | None = None) -> int:
    """Bytes one MTP step reads: the block's layer, eh_proj and its head (the first n_logits
    rows of it; None: all): the uncalibrated prior of its cost (cost_model.Costs.prior)."""
    mtp = weights.mtp
    L = mtp.layer
    mats = [mtp.eh_proj, L.wq, L.wk, L.wv, L.wo, L.w_gate, L.w_up, L.w_down]
    head = mtp.head.w.nbytes * (1.0 if n_logits is None else min(1.0, n_logits / mtp.head.n_out))
    return int(sum(m.w.nbytes for m in mats if m is not None) + head)
