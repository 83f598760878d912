"""The Gated DeltaNet kernels (Qwen3.5's linear-attention layers): the short causal conv1d
and the gated delta rule over a recurrent state, row after row.

Both run the rows of a pass in order, each row with the same operations in the same order
as a pass of one row: the state after row m of an M-row pass is bitwise the state after
m + 1 one-row passes, which is what lets a verification pass be rolled back to any prefix by
replaying its first rows (engine/recurrent.py).  The heads are independent: `prange` over
them.  Plain NumPy statements of both are in reference.py (`causal_conv_silu`,
`gated_delta_rule`).
"""
from __future__ import annotations

import math

import numpy as np
from numba import njit, prange

@njit(cache=True, nogil=True, parallel=True)
def causal_conv_silu(state0, x, w, out):
    """out[m, c] = silu(sum_j w[c, j] xin[m + j, c]), xin = [state0; x] (ggml_ssm_conv then
    ggml_silu: the taps summed oldest first in float32, silu(y) = y / (1 + expf(-y))).
    state0: (K-1, C) the K-1 inputs before the pass; x: (M, C); w: (C, K); out: (M, C)."""
    M, C = x.shape
    K = w.shape[1]
    for c in prange(C):
        for m in range(M):
            s = np.float32(0.0)
            for j in range(K):
                t = m + j                                   # row of xin
                v = state0[t, c] if t < K - 1 else x[t - (K - 1), c]
                s += v * w[c, j]
            out[m, c] = s / (np.float32(1.0) + np.exp(-s))


@njit(cache=True, nogil=True)
def l2_norm_heads(x, eps):
    """In place x[m, h] / sqrt(sum x[m, h]^2 + eps), as llama.cpp's build_gdn_l2_norm states
    it: RMSNorm with eps / n (sum in float64), then a scale by 1 / sqrt(n).  x: (M, H, S)."""
    M, H, S = x.shape
    inv = np.float32(1.0 / math.sqrt(S))
    for m in range(M):
        for h in range(H):
            acc = 0.0
            for i in range(S):
                acc += np.float64(x[m, h, i]) * np.float64(x[m, h, i])
            scale = np.float32(1.0 / math.sqrt(np.float32(acc / S) + np.float32(eps / S)))
            for i in range(S):
                x[m, h, i] = x[m, h, i] * scale * inv


@njit(cache=True, nogil=True, parallel=True)
def gated_delta_rule(s0, s, q, k, v, g, beta, out):
    """The gated delta rule over M rows, per value head h (key head h % Hk, as ggml's
    gated_delta_net op reads a repeated q/k), on the state T = Sᵀ (T[i, j]: key component
    i, value component j):

        T <- exp(g) T;   d = beta (v - kᵀ T);   T <- T + k dᵀ;   out = (qᵀ T) / sqrt(Dk)

    s0: (Hv, Dk, Dv) the state before the pass; s: (Hv, Dk, Dv), written: the state after
    the last row (s may be s0: in place); q, k: (M, Hk, Dk) L2-normed; v: (M, Hv, Dv);
    g (log decay), beta: (M, Hv); out: (M, Hv, Dv).  float32; every sum over i runs in i
    order (the loops over j vectorize without reassociating anything), the state in two
    passes per row: decay and kᵀT, then the update and qᵀT."""
    M, Hk, Dk = q.shape
    Hv, Dv = s.shape[0], s.shape[2]
    scale = np.float32(1.0 / math.sqrt(Dk))
    for h in prange(Hv):
        T = s[h]
        T[:, :] = s0[h]
        kh = h % Hk
        acc = np.empty(Dv, np.float32)                       # (Dv,) kᵀT, then qᵀT
        d = np.empty(Dv, np.float32)                         # (Dv,) the delta
        for m in range(M):
            decay = np.exp(g[m, h])
            b = beta[m, h]
            km, qm = k[m, kh], q[m, kh]
            acc[:] = 0
            for i in range(Dk):
                row, ki = T[i], km[i]
                for j in range(Dv):
                    r = row[j] * decay
                    row[j] = r
                    acc[j] += r * ki
            for j in range(Dv):
                d[j] = (v[m, h, j] - acc[j]) * b
            acc[:] = 0
            for i in range(Dk):
                row, ki, qi = T[i], km[i], qm[i]
                for j in range(Dv):
                    r = row[j] + ki * d[j]
                    row[j] = r
                    acc[j] += r * qi
            for j in range(Dv):
                out[m, h, j] = acc[j] * scale


@njit(cache=True, nogil=True)
def decay_and_beta(alpha, beta, dt_bias, a):
    """In place, per row: alpha <- softplus(alpha + dt_bias) * a (the log decay g; a =
    -exp(A_log) as the file stores ssm_a), beta <- sigmoid(beta); softplus(y) = y for y > 20,
    else logf(1 + expf(y)) (ggml's op_softplus).   alpha, beta: (M, Hv); dt_bias, a: (Hv,)."""
    M, H = alpha.shape
    one = np.float32(1.0)
    for m in range(M):
        for h in range(H):
            y = alpha[m, h] + dt_bias[h]
            sp = y if y > np.float32(20.0) else np.log(one + np.exp(y))
            alpha[m, h] = sp * a[h]
            beta[m, h] = one / (one + np.exp(-beta[m, h]))


@njit(cache=True, nogil=True)
def mul_silu(x, z):
    """In place x *= silu(z) = z / (1 + expf(-z)) (the gated RMSNorm's gate).  x, z: (M, N)."""
    M, N = x.shape
    for m in range(M):
        for i in range(N):
            x[m, i] = x[m, i] * (z[m, i] / (np.float32(1.0) + np.exp(-z[m, i])))


@njit(cache=True, nogil=True)
def mul_sigmoid(x, z):
    """In place x *= sigmoid(z) = 1 / (1 + expf(-z)) (the gated attention's output gate).
    x, z: (M, N)."""
    M, N = x.shape
    for m in range(M):
        for i in range(N):
            x[m, i] = x[m, i] * (np.float32(1.0) / (np.float32(1.0) + np.exp(-z[m, i])))
