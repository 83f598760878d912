"""Preallocated key/value cache with O(1) rollback.

float32, chosen over float16: Numba has no fast half-precision loads, and float32 keeps the
cache exact with respect to the k/v rows the model computed (so a rolled-back and re-filled
cache holds the same bits).  Cost: 4 bytes x 2 x n_layer x n_head_kv x d_head per token
(Qwen2.5-1.5B: 57 KiB per token, 235 MiB for a 4k context).
"""
from __future__ import annotations

import numpy as np

from ..kernels.attention import KV_BLOCK

from ..errors import ConfigError, ContextOverflowError
from .resources import check_fits


class KVCache:
    """k: (n_layer, n_head_kv, n_blocks, d_head, KV_BLOCK) float32, keys in blocks of
    KV_BLOCK positions, each block transposed (the attention kernel's layout: position t is
    k[..., t // KV_BLOCK, :, t % KV_BLOCK]); v: (n_layer, n_head_kv, n_ctx, d_head) float32.
    Positions 0..n_past-1 are valid."""

    def __init__(self, n_layer: int, n_head_kv: int, n_ctx: int, d_head: int):
        if n_ctx < 1:
            raise ConfigError(f"--ctx-size must be >= 1, got {n_ctx}")
        check_fits(self.bytes_for(n_layer, n_head_kv, n_ctx, d_head), f"a KV cache for --ctx-size {n_ctx}",
                   "use a smaller --ctx-size")
        n_blocks = -(-n_ctx // KV_BLOCK)
        self.k = np.zeros((n_layer, n_head_kv, n_blocks, d_head, KV_BLOCK), dtype=np.float32)
        self.v = np.zeros((n_layer, n_head_kv, n_ctx, d_head), dtype=np.float32)
        self.n_ctx = n_ctx
        self.n_past = 0

    @staticmethod
    def bytes_for(n_layer: int, n_head_kv: int, n_ctx: int, d_head: int) -> int:
        """Bytes of k and v for this shape (keys padded to whole KV_BLOCKs), before allocating."""
        return 4 * n_layer * n_head_kv * d_head * (-(-n_ctx // KV_BLOCK) * KV_BLOCK + n_ctx)

    @property
    def nbytes(self) -> int:
        return self.k.nbytes + self.v.nbytes

    def check_room(self, n_new: int) -> None:
        if self.n_past + n_new > self.n_ctx:
            raise ContextOverflowError(
                f"context overflow: {self.n_past} cached + {n_new} new tokens > --ctx-size {self.n_ctx}")

    def store(self, il: int, start: int, k, v) -> None:
        """Write rows for positions start..start+M-1.   k, v: (M, n_head_kv, d_head)."""
        m = k.shape[0]
        pos = np.arange(start, start + m)
        self.k[il][:, pos // KV_BLOCK, :, pos % KV_BLOCK] = k     # (m, n_head_kv, d_head)
        self.v[il, :, start:start + m, :] = v.transpose(1, 0, 2)

    def move(self, src, dst: int) -> None:
        """Copy the rows at slots src (ascending, src[j] >= dst + j) to dst, dst+1, ... and set
        n_past = dst + len(src): a tree's accepted path put in place (model.commit_path)."""
        src = np.asarray(src, dtype=np.int64)
        dest = np.arange(dst, dst + len(src))
        if len(src) and (src.max() >= self.n_ctx or np.any(src < dest)):
            raise ValueError(f"cannot move cache rows {src.tolist()} to {dst}..")
        if not np.array_equal(src, dest):
            for il in range(self.k.shape[0]):
                k = self.k[il][:, src // KV_BLOCK, :, src % KV_BLOCK]     # (m, Hkv, Dh) copies
                self.k[il][:, dest // KV_BLOCK, :, dest % KV_BLOCK] = k
                self.v[il][:, dest] = self.v[il][:, src]
        self.n_past = dst + len(src)

    def keys(self) -> np.ndarray:
        """A copy of the keys as (n_layer, n_head_kv, n_ctx, d_head)."""
        nl, hkv, nb, dh, kb = self.k.shape
        return self.k.transpose(0, 1, 2, 4, 3).reshape(nl, hkv, nb * kb, dh)[:, :, :self.n_ctx].copy()

    def truncate(self, n: int) -> None:
        """Forget every position >= n.  O(1): stale rows are overwritten before being read."""
        if not 0 <= n <= self.n_past:
            raise ValueError(f"cannot truncate a cache of {self.n_past} tokens to {n}")
        self.n_past = n
