"""Causal grouped-query attention over a preallocated KV cache.

Each (query row, head) pair is computed with a fixed sequence of float operations over cache
positions 0..pos, so its result is the same bit pattern whether the row came alone (M=1) or
inside a verification batch — the causal mask inside the batch is just "keys up to my own
position", and the cache rows at those positions are already written.

Keys are cached in blocks of KV_BLOCK positions, each block transposed, (Hkv, n_ctx /
KV_BLOCK, Dh, KV_BLOCK): the scores of consecutive keys are one vector, and a block of scores
reads one contiguous run of memory (`blocked_keys` builds the layout from (Hkv, n, Dh) keys).
The two dot-product phases (scores q·K, then the weighted sum of values) are the
register-blocked SIMD code of attention_ir.py: a sum of fused multiply-adds in a fixed order
per (row, head, position or dimension); the softmax between them is the code below.  The value
it approximates, in float64: kernels/reference.attention.

Speed: one work item is a query row and a group of up to G_MAX heads sharing a KV head (GQA),
so each key and value vector is read once for all heads of the group; items run rows-inner, so
a thread's consecutive items share their KV head's cache rows in L2.  How heads are grouped
into items changes no operation of any (row, head).  The softmax evaluates exp with the
vectorizable polynomial of ops.py (as ggml_vec_soft_max_f32 uses its own vector expf) and
sums in float64 over 8 interleaved partial sums folded in a fixed order.
"""
from __future__ import annotations

import numpy as np
from numba import get_num_threads, njit, prange

from . import attention_ir
from .ops import exp_parts

_LANES = 8   # float64 partial sums of the softmax denominator
KV_BLOCK = attention_ir.KV_BLOCK


def blocked_keys(k: np.ndarray) -> np.ndarray:
    """(Hkv, n, Dh) keys -> (Hkv, ceil(n / KV_BLOCK), Dh, KV_BLOCK), the cache layout
    (positions past n are zero)."""
    hkv, n, dh = k.shape
    nb = -(-n // KV_BLOCK)
    out = np.zeros((hkv, nb * KV_BLOCK, dh), dtype=np.float32)
    out[:, :n] = k
    return np.ascontiguousarray(out.reshape(hkv, nb, KV_BLOCK, dh).transpose(0, 1, 3, 2))


def check_arrays(name: str, q, k_cache, v_cache, out, hint: str = "") -> None:
    """ValueError unless q, the caches and out are C-contiguous float32 and k_cache is in
    blocks of KV_BLOCK positions (blocked_keys' layout)."""
    for a in (q, k_cache, v_cache, out):
        if a.dtype != np.float32 or not a.flags.c_contiguous:
            raise ValueError(f"{name} needs C-contiguous float32 arrays")
    if k_cache.ndim != 4 or k_cache.shape[3] != KV_BLOCK:
        raise ValueError(f"k_cache must be (Hkv, n_ctx / {KV_BLOCK}, Dh, {KV_BLOCK}){hint}")


def attention(q, k_cache, v_cache, positions, scale, window, out) -> None:
    """out[m, h] = softmax(scale * q[m, h] · K[:p+1]) · V[:p+1],   p = positions[m].

    q:        (M, H, Dh)         float32 queries (RoPE applied)
    k_cache:  (Hkv, n_ctx/KB, Dh, KB) float32 keys of one layer, blocks of KB = KV_BLOCK
                                 positions, each transposed
    v_cache:  (Hkv, n_ctx, Dh)   float32 values of one layer
    positions:(M,) int64         absolute position of each query row
    window:   0, or the sliding-window size: key j is visible iff p - j < window
                                 (llama.cpp's LLAMA_SWA_TYPE_STANDARD)
    out:      (M, H, Dh)         float32
    """
    M, H, _ = q.shape
    n_rep = H // k_cache.shape[0]
    check_arrays("attention", q, k_cache, v_cache, out, ": see blocked_keys")
    divisors = [c for c in range(min(n_rep, attention_ir.G_MAX), 0, -1) if n_rep % c == 0]
    g = next((c for c in divisors if M * H // c >= get_num_threads()),   # heads per item: the most
             divisors[-1])                                               # that give every thread one
    _attention(q, k_cache, v_cache, positions, scale, window, g, out)


@njit(cache=True, nogil=True, parallel=True)
def _attention(q, k_cache, v_cache, positions, scale, window, g, out):
    """attention() for work items of g heads that share a KV head (g divides H / Hkv)."""
    M, H, Dh = q.shape
    n_rep = H // k_cache.shape[0]
    for item in prange(M * H // g):
        m = item % M                                       # rows inner: a thread's items go through
        h0 = (item // M) * g                               # the same KV heads (L2); heads h0 .. h0+g-1
        kvh = h0 // n_rep
        p = positions[m]
        j0 = 0
        if window > 0 and p - window + 1 > 0:
            j0 = p - window + 1
        n = p + 1 - j0
        scores = np.empty((g, (n + 15) // 16 * 16), dtype=np.float32)   # (g, n) and room
        bits = np.empty(n, dtype=np.int32)                 # (n,) float32 bits of 2^k
        two_k = bits.view(np.float32)
        attention_ir.scores(q, k_cache, scores, m, h0, g, kvh, j0, n)
        for r in range(g):
            softmax_row(scores[r], n, scale, bits, two_k)
        attention_ir.values(scores, v_cache, out, m, h0, g, kvh, j0, n)


@njit(cache=True, nogil=True)
def softmax_row(s, n, scale, bits, two_k):
    """s[:n] <- softmax(scale * s[:n]) in place, with the fixed operation order of the module
    docstring (attention_tree.py runs the same code on its gathered scores).
    bits: (>= n,) int32 scratch, two_k its float32 view."""
    smax = np.float32(-np.inf)
    for t in range(n):
        s[t] = s[t] * scale
        smax = max(smax, s[t])
    for t in range(n):                                 # e^(s - max) = e^r' · 2^k
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
