"""The recurrent state of a hybrid model (qwen35's Gated DeltaNet layers) beside its KV cache,
and how it is rolled back.

A recurrent layer keeps two states per sequence: the conv state (the last K-1 inputs of its
causal conv1d) and the delta-rule state S (Hv, Dv, Dk).  Neither can be truncated like a KV
cache, so each pass keeps what rolling it back needs, at a cost of a few rows:

- the delta-rule states live in two buffers: a pass reads the state before it from one
  (`base`) and writes the running state into the other (`cur`), so `base` is the state at the
  pass's start, untouched;
- the pass logs its rows' conv inputs and the delta rule's inputs (q, k, v, g, beta), and
  keeps the conv state before it.

Truncating to a position inside the last pass replays its first rows from `base` with the
same kernel (kernels/delta_rule.py runs rows in order, the same operations as one-row passes):
the state is bitwise the one that one-row steps up to that position give.  Truncating to
before the last pass cannot be undone that way: `stale` is set and the next pass first
re-evaluates the kept positions' tokens (`ids`, recorded here) from position 0 (forward's
`rebuild`), which gives the same bits, since every row's computation is independent of how
the positions were split into passes.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..kernels.delta_rule import gated_delta_rule
from .kv_cache import KVCache
from .resources import check_fits


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
        """Bytes of both delta-rule buffers and the conv state (one sequence)."""
        return 4 * self.n_layer * (2 * self.n_v_heads * self.d_state ** 2 + (self.conv_kernel - 1) * self.channels)


class PassLog:
    """The last pass's inputs per recurrent layer, enough to replay any prefix of its rows."""

    def __init__(self, shape: RecurrentShape, start: int, m: int):
        R, C, Hk, Hv, S = shape.n_layer, shape.channels, shape.n_k_heads, shape.n_v_heads, shape.d_state
        self.start, self.m = start, m              # positions start..start+m-1
        self.conv_in = np.empty((R, m, C), np.float32)           # the conv's inputs (qkv rows)
        self.q = np.empty((R, m, Hk, S), np.float32)
        self.k = np.empty((R, m, Hk, S), np.float32)
        self.v = np.empty((R, m, Hv, S), np.float32)
        self.g = np.empty((R, m, Hv), np.float32)
        self.beta = np.empty((R, m, Hv), np.float32)


class RecurrentState:
    """conv: (R, K-1, C) float32, the current conv states; ssm: (2, R, Hv, S, S) float32, the
    delta-rule buffers (`cur` indexes the current one).  Positions 0..n_past-1 are folded in."""

    def __init__(self, shape: RecurrentShape, n_ctx: int):
        R, K, C, Hv, S = shape.n_layer, shape.conv_kernel, shape.channels, shape.n_v_heads, shape.d_state
        self.shape = shape
        self.conv = np.zeros((R, K - 1, C), np.float32)
        self.conv0 = np.zeros_like(self.conv)                    # conv states before the last pass
        self.ssm = np.zeros((2, R, Hv, S, S), np.float32)
        self.cur = 0
        self.log: PassLog | None = None
        self.ids = np.zeros(n_ctx, np.int64)                      # the token at each position
        self.stale = 0        # > 0: positions 0..stale-1 must be re-evaluated before the next pass

    @property
    def base(self) -> np.ndarray:
        return self.ssm[1 - self.cur]

    def begin(self, start: int, tokens: np.ndarray) -> None:
        """A pass of len(tokens) rows at positions start..: the current state becomes `base`."""
        self.ids[start:start + len(tokens)] = tokens
        self.conv0[...] = self.conv
        self.cur = 1 - self.cur
        self.log = PassLog(self.shape, start, len(tokens))

    def reset(self) -> None:
        self.conv[...] = 0
        self.ssm[self.cur] = 0
        self.log = None
        self.stale = 0

    def truncate(self, n: int, n_past: int) -> None:
        """Keep positions 0..n-1 (n <= n_past): replay the last pass's first rows, or mark stale."""
        if n == n_past:
            return
        log = self.log
        if n == 0:
            self.reset()
        elif log is not None and log.start <= n < log.start + log.m:
            self.replay(n - log.start)
        else:
            self.stale = n

    def replay(self, r: int) -> None:
        """The state after the last pass's first r rows, from `base` (bitwise: see the module)."""
        log, K = self.log, self.shape.conv_kernel
        for i in range(self.shape.n_layer):
            xin = np.concatenate([self.conv0[i], log.conv_in[i, :r]])             # (K-1+r, C)
            self.conv[i] = xin[r:r + K - 1]
        if r == 0:
            self.ssm[self.cur] = self.base
        else:
            out = np.empty((r, self.shape.n_v_heads, self.shape.d_state), np.float32)
            for i in range(self.shape.n_layer):
                gated_delta_rule(self.base[i], self.ssm[self.cur, i], log.q[i, :r], log.k[i, :r],
                                 log.v[i, :r], log.g[i, :r], log.beta[i, :r], out)
        log.m = r


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
        return super().nbytes + self.rec.ssm.nbytes + self.rec.conv.nbytes

    def truncate(self, n: int) -> None:
        if not 0 <= n <= self.n_past:
            raise ValueError(f"cannot truncate a cache of {self.n_past} tokens to {n}")
        self.rec.truncate(n, self.n_past)
        self.n_past = n

    def move(self, src, dst: int) -> None:
        raise ValueError("a recurrent state cannot keep one path of a token tree "
                         "(eval_tree is for attention-only models)")
