"""Attention of a token tree: T new rows that each see the cached context and their own
ancestors only (the tree mask of multi-candidate verification).

Tree node i is stored at cache slot base + i, at RoPE position base + depth[i]; its keys are
the context slots 0..base-1 and the slots base + a of its ancestors a (itself included),
anc[i, a] = 1.  Parents come before children (a <= i), so the visible slots in slot order are
the context and then the ancestors by depth: exactly the keys, in the same order, that the
node's root-to-node path sees when it is evaluated alone as a plain sequence.

Bits: per (row, head) the scores are the fused multiply-add chains of attention_ir.scores over
every slot lo..base+i (a score's bits do not depend on where it falls in a block), the visible
ones are gathered into one contiguous row and normalized by attention.softmax_row (the same
lanes, the same order as the plain kernel's), and scattered back with exact zeros at the
hidden slots; attention_ir.values then runs its chains over lo..base+i, where a hidden slot
adds fma(0, v, acc) = acc.  So each row's output is bitwise what `attention.attention` gives
for the path alone (up to the sign of an exact zero), at the cost of the hidden slots' dot
products (at most T per row).
"""
from __future__ import annotations

import numpy as np
from numba import get_num_threads, njit, prange

from . import attention_ir
from .attention import check_arrays, softmax_row


def tree_mask(parents: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """parents (T,) int64, -1 for a root, else an earlier node -> depth (T,) int64 and
    anc (T, T) uint8, anc[i, a] = 1 iff a is i or one of its ancestors."""
    T = len(parents)
    depth = np.zeros(T, dtype=np.int64)
    anc = np.zeros((T, T), dtype=np.uint8)
    for i, a in enumerate(parents):
        if not -1 <= a < i:
            raise ValueError(f"tree: node {i} has parent {a}; parents must be -1 or an earlier node")
        if a >= 0:
            depth[i] = depth[a] + 1
            anc[i] = anc[a]
        anc[i, i] = 1
    return depth, anc


def attention_tree(q, k_cache, v_cache, base, depth, anc, scale, window, out) -> None:
    """out[i, h] = softmax(scale * q[i, h] · K[vis_i]) · V[vis_i], vis_i = the context slots
    0..base-1 and base + a for anc[i, a], of which a sliding window keeps the keys at positions
    p - window < pos <= p, p = base + depth[i] (a context slot's position is its index, a
    tree slot's base + depth).

    q (T, H, Dh), out (T, H, Dh), k_cache / v_cache: one layer in attention.attention's layout,
    the tree's keys and values already stored at slots base..base+T-1; depth (T,) int64,
    anc (T, T) uint8 (tree_mask)."""
    M, H, _ = q.shape
    n_rep = H // k_cache.shape[0]
    check_arrays("attention_tree", q, k_cache, v_cache, out)
    if depth.shape != (M,) or anc.shape != (M, M):
        raise ValueError(f"attention_tree: depth {depth.shape} / anc {anc.shape} do not fit {M} rows")
    divisors = [c for c in range(min(n_rep, attention_ir.G_MAX), 0, -1) if n_rep % c == 0]
    g = next((c for c in divisors if M * H // c >= get_num_threads()), divisors[-1])
    _attention_tree(q, k_cache, v_cache, int(base), depth, anc, scale, window, g, out)


@njit(cache=True, nogil=True, parallel=True)
def _attention_tree(q, k_cache, v_cache, base, depth, anc, scale, window, g, out):
    """attention_tree() for work items of g heads that share a KV head (g divides H / Hkv)."""
    M, H, Dh = q.shape
    n_rep = H // k_cache.shape[0]
    for item in prange(M * H // g):
        m = item % M
        h0 = (item // M) * g
        kvh = h0 // n_rep
        p = base + depth[m]
        j0 = 0                                             # first position the window keeps
        if window > 0 and p - window + 1 > 0:
            j0 = p - window + 1
        lo = min(j0, base)                                 # slots lo .. base + m: the span
        n = base + m + 1 - lo
        vis = np.empty(n, dtype=np.int64)                  # (n_vis,) offsets into the span
        n_vis = 0
        for t in range(lo, base):
            vis[n_vis] = t - lo
            n_vis += 1
        for a in range(m + 1):
            if anc[m, a] != 0 and base + depth[a] >= j0:
                vis[n_vis] = base + a - lo
                n_vis += 1
        full = np.empty((g, (n + 15) // 16 * 16), dtype=np.float32)      # (g, n) and room
        packed = np.empty((g, (n_vis + 15) // 16 * 16), dtype=np.float32)  # (g, n_vis)
        bits = np.empty(n_vis, dtype=np.int32)
        two_k = bits.view(np.float32)
        attention_ir.scores(q, k_cache, full, m, h0, g, kvh, lo, n)
        for r in range(g):
            for t in range(n_vis):
                packed[r, t] = full[r, vis[t]]
            softmax_row(packed[r], n_vis, scale, bits, two_k)
            for t in range(n):
                full[r, t] = 0.0
            for t in range(n_vis):
                full[r, vis[t]] = packed[r, t]
        attention_ir.values(full, v_cache, out, m, h0, g, kvh, lo, n)
