"""Causal grouped-query attention over a preallocated KV cache.

Each (query row, head) pair is computed with a fixed sequence of float operations over cache
positions 0..pos, so its result is the same bit pattern whether the row came alone (M=1) or
inside a verification batch — the causal mask inside the batch is just "keys up to my own
position", and the cache rows at those positions are already written.

Keys are cached transposed, (Hkv, Dh, n_ctx): the scores of all visible keys are built
dimension after dimension, scores[t] += q[i] · K[i, t], a loop over independent keys that the
compiler vectorizes without reassociating anything (fastmath stays off) — each score is
still the plain in-order sum over i, the same bits as a key-by-key dot product.

Speed: one work item is a query row and a group of heads sharing a KV head (GQA), so each
key and value row is read from L2 once per group and reused from L1 by every head of it;
how heads are grouped into items changes no operation of any (row, head).  The softmax
evaluates exp with the vectorizable polynomial of ops.py (as ggml_vec_soft_max_f32 uses its
own vector expf), sums in float64 over 8 interleaved partial sums folded in a fixed order.
"""
from __future__ import annotations

import numpy as np
from numba import get_num_threads, njit, prange

from .ops import exp_parts

_LANES = 8   # float64 partial sums of the softmax denominator


def attention(q, k_cache, v_cache, positions, scale, window, out) -> None:
    """out[m, h] = softmax(scale * q[m, h] · K[:p+1]) · V[:p+1],   p = positions[m].

    q:        (M, H, Dh)         float32 queries (RoPE applied)
    k_cache:  (Hkv, Dh, n_ctx)   float32 keys of one layer, transposed
    v_cache:  (Hkv, n_ctx, Dh)   float32 values of one layer
    positions:(M,) int64         absolute position of each query row
    window:   0, or the sliding-window size: key j is visible iff p - j < window
                                 (llama.cpp's LLAMA_SWA_TYPE_STANDARD)
    out:      (M, H, Dh)         float32
    """
    M, H, _ = q.shape
    n_rep = H // k_cache.shape[0]
    g = next((c for c in range(n_rep, 0, -1)               # heads per work item: the largest divisor
              if n_rep % c == 0 and M * H // c >= 2 * get_num_threads()), 1)   # of n_rep leaving
    _attention(q, k_cache, v_cache, positions, scale, window, g, out)          # 2 items per thread


@njit(cache=True, nogil=True, parallel=True)
def _attention(q, k_cache, v_cache, positions, scale, window, g, out):
    """attention() for work items of g heads that share a KV head (g divides H / Hkv)."""
    M, H, Dh = q.shape
    n_rep = H // k_cache.shape[0]
    for item in prange(M * H // g):
        m = item // (H // g)
        h0 = (item % (H // g)) * g                         # heads h0 .. h0+g-1 share kvh
        kvh = h0 // n_rep
        p = positions[m]
        j0 = 0
        if window > 0 and p - window + 1 > 0:
            j0 = p - window + 1
        n = p + 1 - j0
        scores = np.zeros((g, n), dtype=np.float32)        # (g, n)
        bits = np.empty(n, dtype=np.int32)                 # (n,) float32 bits of 2^k
        two_k = bits.view(np.float32)
        d4 = Dh - Dh % 4
        for i in range(0, d4, 4):                          # 4 dimensions per pass over the scores:
            k0 = k_cache[kvh, i, j0:j0 + n]                # (n,) dimension i of the visible keys
            k1 = k_cache[kvh, i + 1, j0:j0 + n]            # the same adds in the same order as
            k2 = k_cache[kvh, i + 2, j0:j0 + n]            # one pass per dimension, a quarter of
            k3 = k_cache[kvh, i + 3, j0:j0 + n]            # the loads and stores of the scores
            for r in range(g):
                q0, q1, q2, q3 = q[m, h0 + r, i], q[m, h0 + r, i + 1], q[m, h0 + r, i + 2], q[m, h0 + r, i + 3]
                s = scores[r]
                for t in range(n):
                    s[t] = (((s[t] + q0 * k0[t]) + q1 * k1[t]) + q2 * k2[t]) + q3 * k3[t]
        for i in range(d4, Dh):
            kr = k_cache[kvh, i, j0:j0 + n]
            for r in range(g):
                qi = q[m, h0 + r, i]
                s = scores[r]
                for t in range(n):
                    s[t] += qi * kr[t]
        for r in range(g):
            s = scores[r]                                  # (n,)
            smax = np.float32(-np.inf)
            for t in range(n):
                s[t] = s[t] * scale
                smax = max(smax, s[t])
            for t in range(n):                             # e^(s - max) = e^r' · 2^k
                e, k = exp_parts(s[t] - smax)
                s[t] = e
                bits[t] = (k + 127) << 23
            part = np.zeros(_LANES, dtype=np.float64)
            for t in range(n):
                s[t] = s[t] * two_k[t]
            n8 = n - n % _LANES
            for t0 in range(0, n8, _LANES):
                for j in range(_LANES):
                    part[j] += s[t0 + j]
            for t in range(n8, n):
                part[t - n8] += s[t]
            total = ((part[0] + part[4]) + (part[2] + part[6])) + ((part[1] + part[5]) + (part[3] + part[7]))
            inv = np.float32(1.0 / total)
            for t in range(n):
                s[t] = s[t] * inv
            o = out[m, h0 + r]
            for i in range(Dh):
                o[i] = 0.0
        n4 = n - n % 4
        for t in range(0, n4, 4):                          # 4 positions per pass over the output,
            v0 = v_cache[kvh, j0 + t]                      # (Dh,) each read once for the g heads
            v1 = v_cache[kvh, j0 + t + 1]
            v2 = v_cache[kvh, j0 + t + 2]
            v3 = v_cache[kvh, j0 + t + 3]
            for r in range(g):
                w0, w1, w2, w3 = scores[r, t], scores[r, t + 1], scores[r, t + 2], scores[r, t + 3]
                o = out[m, h0 + r]
                for i in range(Dh):
                    o[i] = (((o[i] + w0 * v0[i]) + w1 * v1[i]) + w2 * v2[i]) + w3 * v3[i]
        for t in range(n4, n):
            vr = v_cache[kvh, j0 + t]
            for r in range(g):
                wt = scores[r, t]
                o = out[m, h0 + r]
                for i in range(Dh):
                    o[i] += wt * vr[i]
