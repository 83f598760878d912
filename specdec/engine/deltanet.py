"""A Gated DeltaNet layer (Qwen3.5's linear attention; llama.cpp's src/models/qwen35.cpp
build_layer_attn_linear and delta-net-base.cpp): its weights and its forward over one
pass's rows of several sequences, each with its own recurrent state (engine/recurrent.py).

    qkv = h·attn_qkv (C = 2 Hk S + Hv S channels);  z = h·attn_gate (Hv S)
    c = silu(causal conv1d(qkv) over the conv state, K taps)        kernels/delta_rule.py
    q, k, v = c split (Hk S | Hk S | Hv S);  q, k L2-normed per head
    g = softplus(h·ssm_alpha + ssm_dt.bias) · ssm_a;  beta = sigmoid(h·ssm_beta)
    o = the gated delta rule over the rows (value head j reads key head j % Hk)
    y = rms(o)·ssm_norm · silu(z) per value head (the gated RMSNorm);  out = y·ssm_out
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..kernels.delta_rule import causal_conv_silu, decay_and_beta, gated_delta_rule, l2_norm_heads, mul_silu
from ..kernels.ops import rms_norm_heads
from .recurrent import RecurrentShape


@dataclass(frozen=True)
class DeltaNet:
    """One recurrent layer's weights (Linear: weights.py's matmul weight)."""
    wqkv: object              # Linear (D) -> (C)          attn_qkv
    wz: object                # Linear (D) -> (Hv S)       attn_gate
    conv: np.ndarray          # (C, K) float32             ssm_conv1d
    dt_bias: np.ndarray       # (Hv,)                      ssm_dt.bias
    a: np.ndarray             # (Hv,)  -exp(A_log)         ssm_a
    w_alpha: object           # Linear (D) -> (Hv)         ssm_alpha
    w_beta: object            # Linear (D) -> (Hv)         ssm_beta
    norm: np.ndarray          # (S,)                       ssm_norm
    w_out: object             # Linear (Hv S) -> (D)       ssm_out


def load_deltanet(gf, shape: RecurrentShape, d_model: int, p: str, lin, vec, f32) -> DeltaNet:
    """Layer p's ('blk.<i>.') recurrent weights; lin, vec: weights.py's loaders; f32(name,
    dims): a float32 tensor of those GGUF dims, as an array."""
    D, C, Hv, S, K = d_model, shape.channels, shape.n_v_heads, shape.d_state, shape.conv_kernel
    return DeltaNet(
        wqkv=lin(p + "attn_qkv.weight", D, C),
        wz=lin(p + "attn_gate.weight", D, Hv * S),
        conv=f32(p + "ssm_conv1d.weight", (K, C)).reshape(C, K),
        dt_bias=vec(p + "ssm_dt.bias", Hv),
        a=vec(p + "ssm_a", Hv),
        w_alpha=lin(p + "ssm_alpha.weight", D, Hv),
        w_beta=lin(p + "ssm_beta.weight", D, Hv),
        norm=vec(p + "ssm_norm.weight", S),
        w_out=lin(p + "ssm_out.weight", Hv * S, D),
    )


def deltanet(L: DeltaNet, shape: RecurrentShape, ir: int, h: np.ndarray, states, rows, eps: float) -> np.ndarray:
    """Recurrent layer ir on the normed input h (M, D) -> (M, D); item i's rows h[rows[i]]
    advance states[i] (a RecurrentState whose pass has begun) and are logged there, from its
    log row row0 on."""
    M = h.shape[0]
    Hk, Hv, S = shape.n_k_heads, shape.n_v_heads, shape.d_state
    qkv = L.wqkv(h)                                                              # (M, C)
    z = L.wz(h)                                                                  # (M, Hv S)
    g = L.w_alpha(h)                                                             # (M, Hv)
    beta = L.w_beta(h)                                                           # (M, Hv)
    decay_and_beta(g, beta, L.dt_bias, L.a)
    conv = np.empty_like(qkv)                                                    # (M, C)
    o = np.empty((M, Hv, S), np.float32)                                         # (M, Hv, S)
    for st, r in zip(states, rows):
        log, at = st.log, slice(st.row0, st.row0 + r.stop - r.start)        # its rows in the log
        causal_conv_silu(st.conv[ir], qkv[r], L.conv, conv[r])
        K = shape.conv_kernel
        st.conv[ir] = np.concatenate([st.conv[ir], qkv[r]])[-(K - 1):]          # (K-1, C)
        c = conv[r]
        q = np.ascontiguousarray(c[:, :Hk * S]).reshape(-1, Hk, S)
        k = np.ascontiguousarray(c[:, Hk * S:2 * Hk * S]).reshape(-1, Hk, S)
        v = np.ascontiguousarray(c[:, 2 * Hk * S:]).reshape(-1, Hv, S)
        l2_norm_heads(q, eps)
        l2_norm_heads(k, eps)
        log.conv_in[ir, at], log.q[ir, at], log.k[ir, at], log.v[ir, at] = qkv[r], q, k, v
        log.g[ir, at], log.beta[ir, at] = g[r], beta[r]
        gated_delta_rule(st.cur[ir], st.cur[ir], q, k, v, g[r], beta[r], o[r])          # in place
    rms_norm_heads(o, L.norm, eps)
    y = o.reshape(M, Hv * S)
    mul_silu(y, z)
    return L.w_out(y)
