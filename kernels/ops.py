"""Element-wise and per-row kernels of the transformer: RMSNorm, RoPE, gated activations.

Every kernel works row by row with a fixed loop order, so a row's result never depends on
how many rows were passed together (the row-independence that exact speculation needs).
"""
from __future__ import annotations

import math

import numpy as np
from numba import njit, prange


@njit(cache=True, nogil=True)
def rms_norm(x, w, eps, out):
    """out[m] = x[m] / sqrt(mean(x[m]^2) + eps) * w.   x, out: (M, D); w: (D,)
    Sum of squares in float64, like ggml_compute_forward_rms_norm_f32 (ggml_float sum)."""
    M, D = x.shape
    for m in range(M):
        s = 0.0
        for i in range(D):
            s += np.float64(x[m, i]) * np.float64(x[m, i])
        scale = np.float32(1.0 / math.sqrt(s / D + eps))
        for i in range(D):
            out[m, i] = x[m, i] * scale * w[i]


@njit(cache=True, nogil=True)
def rms_norm_heads(x, w, eps):
    """In-place RMSNorm of every head vector.   x: (M, H, Dh); w: (Dh,)  (gemma3 q/k norms)."""
    M, H, Dh = x.shape
    for m in range(M):
        for h in range(H):
            s = 0.0
            for i in range(Dh):
                s += np.float64(x[m, h, i]) * np.float64(x[m, h, i])
            scale = np.float32(1.0 / math.sqrt(s / Dh + eps))
            for i in range(Dh):
                x[m, h, i] = x[m, h, i] * scale * w[i]


@njit(cache=True, nogil=True)
def rope(x, positions, n_rot, base, neox):
    """In-place rotary embedding.   x: (M, H, Dh); positions: (M,) int64.

    theta_i = pos * base^(-2i / n_rot) for i < n_rot/2, as in ggml_rope (rope_yarn without
    scaling).  neox=False rotates pairs (x[2i], x[2i+1]) (LLAMA_ROPE_TYPE_NORM);
    neox=True rotates (x[i], x[i + n_rot/2]) (LLAMA_ROPE_TYPE_NEOX)."""
    M, H, Dh = x.shape
    half = n_rot // 2
    for m in range(M):
        pos = np.float64(positions[m])
        for i in range(half):
            theta = pos * base ** (-2.0 * i / n_rot)
            c = np.float32(math.cos(theta))
            s = np.float32(math.sin(theta))
            for h in range(H):
                if neox:
                    a, b = i, i + half
                else:
                    a, b = 2 * i, 2 * i + 1
                x0 = x[m, h, a]
                x1 = x[m, h, b]
                x[m, h, a] = x0 * c - x1 * s
                x[m, h, b] = x0 * s + x1 * c


@njit(cache=True, nogil=True)
def swiglu(gate, up, out):
    """out = silu(gate) * up.   all (M, F).  silu(g) = g / (1 + exp(-g))  (ggml_vec_swiglu_f32)."""
    M, F = gate.shape
    for m in range(M):
        for i in range(F):
            g = gate[m, i]
            out[m, i] = g / (np.float32(1.0) + np.exp(-g)) * up[m, i]


@njit(cache=True, nogil=True)
def geglu(gate, up, out):
    """out = gelu_tanh(gate) * up.   all (M, F)   (ggml_gelu, tanh approximation; gemma3)."""
    M, F = gate.shape
    c = np.float32(math.sqrt(2.0 / math.pi))
    for m in range(M):
        for i in range(F):
            g = gate[m, i]
            out[m, i] = np.float32(0.5) * g * (np.float32(1.0) + np.tanh(c * g * (np.float32(1.0) + np.float32(0.044715) * g * g))) * up[m, i]
