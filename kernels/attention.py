"""Causal grouped-query attention over a preallocated KV cache.

Each (query row, head) pair is computed on its own with a fixed loop order over cache
positions 0..pos, so its result is the same bit pattern whether the row came alone (M=1) or
inside a verification batch — the causal mask inside the batch is just "keys up to my own
position", and the cache rows at those positions are already written.

Keys are cached transposed, (Hkv, Dh, n_ctx): the scores of all visible keys are built
dimension after dimension, scores[t] += q[i] · K[i, t], a loop over independent keys that the
compiler vectorizes without reassociating anything (fastmath stays off) — each score is
still the plain in-order sum over i, the same bits as a key-by-key dot product.
"""
from __future__ import annotations

import math

import numpy as np
from numba import njit, prange


@njit(cache=True, nogil=True, parallel=True)
def attention(q, k_cache, v_cache, positions, scale, window, out):
    """out[m, h] = softmax(scale * q[m, h] · K[:p+1]) · V[:p+1],   p = positions[m].

    q:        (M, H, Dh)         float32 queries (RoPE applied)
    k_cache:  (Hkv, Dh, n_ctx)   float32 keys of one layer, transposed
    v_cache:  (Hkv, n_ctx, Dh)   float32 values of one layer
    positions:(M,) int64         absolute position of each query row
    window:   0, or the sliding-window size: key j is visible iff p - j < window
                                 (llama.cpp's LLAMA_SWA_TYPE_STANDARD)
    out:      (M, H, Dh)         float32
    """
    M, H, Dh = q.shape
    Hkv = k_cache.shape[0]                                 # k_cache: (Hkv, Dh, n_ctx)
    n_rep = H // Hkv
    for mh in prange(M * H):
        m = mh // H
        h = mh % H
        kvh = h // n_rep
        p = positions[m]
        j0 = 0
        if window > 0 and p - window + 1 > 0:
            j0 = p - window + 1
        n = p + 1 - j0
        scores = np.zeros(n, dtype=np.float32)             # (n,)
        qv = q[m, h]                                       # (Dh,)
        for i in range(Dh):
            qi = qv[i]
            kr = k_cache[kvh, i, j0:j0 + n]                # (n,) dimension i of the visible keys
            for t in range(n):
                scores[t] += qi * kr[t]
        smax = np.float32(-np.inf)
        for t in range(n):
            acc = scores[t] * scale
            scores[t] = acc
            if acc > smax:
                smax = acc
        total = 0.0
        for t in range(n):
            e = np.float32(math.exp(scores[t] - smax))
            scores[t] = e
            total += e
        inv = np.float32(1.0 / total)
        o = out[m, h]                                      # (Dh,)
        for i in range(Dh):
            o[i] = 0.0
        for t in range(n):
            wt = scores[t] * inv
            vr = v_cache[kvh, j0 + t]                      # (Dh,)
            for i in range(Dh):
                o[i] += wt * vr[i]
