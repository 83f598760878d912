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
def rope_cos_sin(positions, n_rot, base, freq_scale, factors):
    """(M, n_rot/2, 2) float32 cos and sin of
        theta_i = freq_scale * pos * base^(-2i / n_rot) / factors[i],   i < n_rot/2,
    as in ggml_rope_ext (rope_yarn with linear scaling only; factors: the rope_freqs tensor of
    Llama 3.1+, ones without one): computed once per forward and base, shared by the q and k
    of every layer.   positions: (M,) int64; factors: (n_rot/2,) float32."""
    M = positions.shape[0]
    half = n_rot // 2
    cs = np.empty((M, half, 2), dtype=np.float32)
    for m in range(M):
        pos = np.float64(positions[m])
        for i in range(half):
            theta = freq_scale * (pos * base ** (-2.0 * i / n_rot) / np.float64(factors[i]))
            cs[m, i, 0] = np.float32(math.cos(theta))
            cs[m, i, 1] = np.float32(math.sin(theta))
    return cs


@njit(cache=True, nogil=True)
def rope_apply(x, cs, neox):
    """In-place rotary embedding.   x: (M, H, Dh); cs: rope_cos_sin(positions, n_rot, base).

    neox=False rotates pairs (x[2i], x[2i+1]) (LLAMA_ROPE_TYPE_NORM);
    neox=True rotates (x[i], x[i + n_rot/2]) (LLAMA_ROPE_TYPE_NEOX)."""
    M, H, Dh = x.shape
    half = cs.shape[1]
    for m in range(M):
        for i in range(half):
            c = cs[m, i, 0]
            s = cs[m, i, 1]
            for h in range(H):
                if neox:
                    a, b = i, i + half
                else:
                    a, b = 2 * i, 2 * i + 1
                x0 = x[m, h, a]
                x1 = x[m, h, b]
                x[m, h, a] = x0 * c - x1 * s
                x[m, h, b] = x0 * s + x1 * c


# exp(x) for float32 in vectorizable arithmetic (the library expf is a call per element, which
# the compiler cannot vectorize): x = n·ln2 + r, |r| <= ln2/2, with ln2 split in two (Cody and
# Waite); e^r by a degree-7 Taylor-like polynomial (minimax coefficients of the Cephes expf);
# 2^n written as float32 bits.  Inputs are clamped to [-87, 88]: e^-87 and e^88 stand for 0
# and +inf where they are used (silu's denominator 1 + e^-g).  silu·up stays within a few
# float32 ulp of the float64 result (tests/kernels/test_ops.py).
_LOG2E = np.float32(1.44269504088896341)
_LN2_HI = np.float32(0.693359375)
_LN2_LO = np.float32(-2.12194440e-4)
_P0, _P1, _P2 = np.float32(1.9875691500e-4), np.float32(1.3981999507e-3), np.float32(8.3334519073e-3)
_P3, _P4, _P5 = np.float32(4.1665795894e-2), np.float32(1.6666665459e-1), np.float32(5.0000001201e-1)


@njit(cache=True, nogil=True, inline="always")
def exp_parts(x):
    """x float32 -> (e^r, n) with e^x = e^r · 2^n (see above)."""
    x = min(max(x, np.float32(-87.0)), np.float32(88.0))
    n = np.float32(np.rint(x * _LOG2E))
    r = x - n * _LN2_HI - n * _LN2_LO
    p = ((((_P0 * r + _P1) * r + _P2) * r + _P3) * r + _P4) * r + _P5
    return p * r * r + r + np.float32(1.0), np.int32(n)


@njit(cache=True, nogil=True, parallel=True)
def swiglu(gate, up, out):
    """out = silu(gate) * up.   all (M, F); out may be gate.  silu(g) = g / (1 + exp(-g))
    (ggml_vec_swiglu_f32, which also evaluates exp with a polynomial).  Per row, passes over
    (F,) scratch vectors that the compiler vectorizes (none of them may alias the inputs):
    e^r and the bits of 2^n, the quotient, then the copy into out."""
    M, F = gate.shape
    for m in prange(M):
        e = np.empty(F, dtype=np.float32)                 # (F,) e^r, then the result
        bits = np.empty(F, dtype=np.int32)                # (F,) float32 bits of 2^n
        scale = bits.view(np.float32)
        g = gate[m]
        for i in range(F):
            r, n = exp_parts(-g[i])
            e[i] = r
            bits[i] = (n + 127) << 23
        u = up[m]
        for i in range(F):
            e[i] = g[i] / (np.float32(1.0) + e[i] * scale[i]) * u[i]
        out[m] = e


@njit(cache=True, nogil=True, parallel=True)
def geglu(gate, up, out):
    """out = gelu_tanh(gate) * up.   all (M, F), C-contiguous   (ggml_gelu, tanh approximation;
    gemma3).  One libm tanhf per value, so prange over chunks of 1024 values (each value's
    operations are the same whichever thread runs them)."""
    c = np.float32(math.sqrt(2.0 / math.pi))
    g, u, o = gate.reshape(-1), up.reshape(-1), out.reshape(-1)
    n = g.size
    for k in prange((n + 1023) // 1024):
        for i in range(1024 * k, min(n, 1024 * k + 1024)):
            x = g[i]
            t = np.tanh(c * x * (np.float32(1.0) + np.float32(0.044715) * x * x))
            o[i] = np.float32(0.5) * x * (np.float32(1.0) + t) * u[i]
