"""The recurrent state of a hybrid model (qwen35's Gated DeltaNet layers) beside its KV cache,
and how it is rolled back.

A recurrent layer keeps two states per sequence: the conv state (the last K-1 inputs of its
causal conv1d) and the delta-rule state S (Hv, Dv, Dk).  Neither can be truncated like a KV
cache, so the state keeps what rolling it back needs, a few KB per row:

- `base`: the delta-rule and conv states at position `start`, a copy that passes do not touch;
- the log of the rows since: each row's conv inputs and its delta-rule inputs (q, k, v,
  decay, beta), over the last passes (at most WINDOW rows; past that, the base state moves
  forward by folding in the oldest rows, keeping the last KEEP rows before the new pass).
  A pass of more than one row (a verification pass, a prompt), and the first pass after a
  prompt's, first moves base to its own start (`settle`), so that rolling it back replays at
  most its own rows;
- `cur`: the state after the last row, which each pass advances in place.

Truncating to a position n >= start replays the log's first n - start rows from `base` with
the same kernels (kernels/delta_rule.py runs rows in order, the operations of one-row passes
whatever the split into passes): the state is bitwise the one that one-row steps up to that
position give.  Truncating to before `start` cannot be undone that way: `stale` is set and
the next pass first re-evaluates the kept positions' tokens (`ids`, recorded here) from
position 0 (transformer._rebuild): the same bits, at a prompt's cost.  A pass that did not
finish (an exception between its layers) leaves the state `dirty`: the next truncate or pass
first replays up to where it began.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..kernels.delta_rule import gated_delta_rule
from .kv_cache import KVCache
from .resources import check_fits

WINDOW = 48     # rows logged before the base state moves forward
KEEP = 16       # rows the log keeps behind a new pass when it does
REPLAY_MAX = 4  # settling more logged rows than this copies the state instead of replaying them


@dataclass(frozen=True)
class RecurrentShape:
    """The recurrent layers' sizes (config.ModelConfig's ssm_* fields)."""
    n_layer: int        # R recurrent layers
    conv_kernel: int    # K
    channels: int       # C = 2 Hk S + Hv S: the conv's q | k | v channels
    n_k_heads: int      # Hk
    n_v_heads: int      # Hv
    d_state: int        # S: key and value head size

    @property
    def state_bytes(self) -> int:
        """Bytes of the current and base states (one sequence), without the log."""
        return 4 * self.n_layer * 2 * (self.n_v_heads * self.d_state ** 2 + (self.conv_kernel - 1) * self.channels)


class RowLog:
    """Logged rows per recurrent layer: the conv inputs (R, cap, C) and the delta rule's
    inputs q, k (R, cap, Hk, S), v (R, cap, Hv, S), g, beta (R, cap, Hv); rows 0..m-1 hold."""

    def __init__(self, shape: RecurrentShape, cap: int):
        R, C, Hk, Hv, S = shape.n_layer, shape.channels, shape.n_k_heads, shape.n_v_heads, shape.d_state
        self.cap, self.m = cap, 0
        self.conv_in = np.empty((R, cap, C), np.float32)
        self.q = np.empty((R, cap, Hk, S), np.float32)
        self.k = np.empty((R, cap, Hk, S), np.float32)
        self.v = np.empty((R, cap, Hv, S), np.float32)
        self.g = np.empty((R, cap, Hv), np.float32)
        self.beta = np.empty((R, cap, Hv), np.float32)

    FIELDS = ("conv_in", "q", "k", "v", "g", "beta")

    def grown(self, shape: RecurrentShape, cap: int) -> "RowLog":
        """A log of capacity cap (>= m) holding this one's rows."""
        new = RowLog(shape, cap)
        for f in self.FIELDS:
            getattr(new, f)[:, :self.m] = getattr(self, f)[:, :self.m]
        new.m = self.m
        return new

    def drop(self, d: int) -> None:
        """Forget the first d rows (the rest move to the front)."""
        for f in self.FIELDS:
            a = getattr(self, f)
            a[:, :self.m - d] = a[:, d:self.m].copy()
        self.m -= d


class RecurrentState:
    """conv: (R, K-1, C) and cur: (R, Hv, S, S) float32, the states after the last row;
    conv0 and base: the states at position `start`; log: the rows since (RowLog)."""

    def __init__(self, shape: RecurrentShape, n_ctx: int):
        R, K, C, Hv, S = shape.n_layer, shape.conv_kernel, shape.channels, shape.n_v_heads, shape.d_state
        self.shape = shape
        self.conv = np.zeros((R, K - 1, C), np.float32)
        self.conv0 = np.zeros_like(self.conv)
        self.cur = np.zeros((R, Hv, S, S), np.float32)
        self.base = np.zeros_like(self.cur)
        self.start = 0                       # the position of base
        self.log = RowLog(shape, WINDOW)
        self.row0 = 0                        # the log row of the running pass's first row
        self.dirty = False                   # a pass began and did not end
        self.ids = np.zeros(n_ctx, np.int64)                      # the token at each position
        self.stale = 0        # > 0: positions 0..stale-1 must be re-evaluated before the next pass

    def begin(self, start: int, tokens: np.ndarray) -> None:
        """A pass of len(tokens) rows at positions start.. (= the rows folded in so far)."""
        if self.dirty:
            self.replay(start - self.start)
        m = len(tokens)
        self.ids[start:start + m] = tokens
        if (m > 1 and self.log.m) or self.log.m > WINDOW:   # a verification (or prompt) pass, or
            self.settle()           # the first after a prompt: base at its start, so rolling it
        elif self.log.m + m > WINDOW:       # back replays its own rows only (not a prompt's)
            self.advance(self.log.m - min(KEEP, self.log.m))
        need = max(WINDOW, self.log.m + m)
        if need > self.log.cap or self.log.cap > 2 * need:          # (a long prompt's pass: back to
            self.log = self.log.grown(self.shape, need)             # WINDOW rows after it)
        self.row0 = self.log.m
        self.log.m += m
        self.dirty = True

    def end(self) -> None:
        self.dirty = False

    def reset(self) -> None:
        for a in (self.conv, self.conv0, self.cur, self.base):
            a[...] = 0
        self.start, self.log.m, self.stale, self.dirty = 0, 0, 0, False

    def truncate(self, n: int, n_past: int) -> None:
        """Keep positions 0..n-1 (n <= n_past): replay the log's first rows, or mark stale."""
        if n == 0:
            self.reset()
        elif n < self.start:
            self.stale, self.dirty = n, False
        elif n < n_past or self.dirty:
            self.replay(n - self.start)

    def _run(self, s: np.ndarray, conv: np.ndarray, lo: int, hi: int) -> None:
        """Fold the log's rows lo..hi-1 into the states s (R, Hv, S, S) and conv, in place."""
        if hi <= lo:
            return
        log, K = self.log, self.shape.conv_kernel
        out = np.empty((hi - lo, self.shape.n_v_heads, self.shape.d_state), np.float32)
        for i in range(self.shape.n_layer):
            conv[i] = np.concatenate([conv[i], log.conv_in[i, lo:hi]])[-(K - 1):]
            gated_delta_rule(s[i], s[i], log.q[i, lo:hi], log.k[i, lo:hi], log.v[i, lo:hi], log.g[i, lo:hi],
                             log.beta[i, lo:hi], out)

    def replay(self, r: int) -> None:
        """cur and conv: the states after the log's first r rows, from base (see the module)."""
        self.cur[...] = self.base
        self.conv[...] = self.conv0
        self._run(self.cur, self.conv, 0, r)
        self.log.m, self.dirty = r, False

    def settle(self) -> None:
        """base and conv0 move to the last row: the log's few rows folded in, or (more than
        REPLAY_MAX of them) cur and conv copied, the same bits (the rows run in order in
        either case), for less than the replay costs."""
        if self.log.m <= REPLAY_MAX:
            self.advance(self.log.m)
            return
        self.base[...] = self.cur
        self.conv0[...] = self.conv
        self.start += self.log.m
        self.log.m = 0

    def advance(self, d: int) -> None:
        """base and conv0 move d rows forward (the log's first d rows folded in, then dropped)."""
        self._run(self.base, self.conv0, 0, d)
        self.log.drop(d)
        self.start += d


class HybridCache(KVCache):
    """A KV cache for the attention layers only (layer il's keys at kv index `kv_of[il]`) and
    the RecurrentState of the recurrent layers; truncate rolls both back."""

    def __init__(self, n_attn: int, n_head_kv: int, n_ctx: int, d_head: int, shape: RecurrentShape,
                 kv_of: tuple[int, ...], rec_of: tuple[int, ...]):
        check_fits(shape.state_bytes, "the recurrent state", "a smaller model")
        super().__init__(max(n_attn, 1), n_head_kv, n_ctx, d_head)
        self.rec = RecurrentState(shape, n_ctx)
        self.kv_of, self.rec_of = kv_of, rec_of      # layer il -> kv index / recurrent index (-1: none)

    @property
    def nbytes(self) -> int:
        return super().nbytes + self.rec.shape.state_bytes

    def truncate(self, n: int) -> None:
        if not 0 <= n <= self.n_past:
            raise ValueError(f"cannot truncate a cache of {self.n_past} tokens to {n}")
        self.rec.truncate(n, self.n_past)
        self.n_past = n

    def move(self, src, dst: int) -> None:
        raise ValueError("a recurrent state cannot keep one path of a token tree "
                         "(eval_tree is for attention-only models)")
