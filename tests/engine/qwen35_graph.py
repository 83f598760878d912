"""A float64 restatement of llama.cpp's qwen35 graph (src/models/qwen35.cpp,
delta-net-base.cpp) read straight from a GGUF file: the oracle of test_qwen35.py and of the
broken-rule checks.  Every rule can be broken by name (`broken=`):

    x = token_embd[ids]; per layer il: h = rms(x)·attn_norm;
    recurrent layers ((il + 1) % interval != 0), per row t in order:
        qkv = h·attn_qkv; z = h·attn_gate; c = silu(causal conv1d over [conv state; qkv])
        q, k, v = c split (Hk·S | Hk·S | Hv·S); q, k L2-normed per head
        g = softplus(h·ssm_alpha + ssm_dt.bias) · ssm_a;  beta = sigmoid(h·ssm_beta)
        per value head j (key head j % Hk): S = e^g S; S += beta (v - S k) kᵀ; o = S q / sqrt(S)
        y = rms(o)·ssm_norm · silu(z);  x += y·ssm_out
    attention layers: q | gate = h·attn_q per head; q, k rms-normed (q/k norms); interleaved
        M-RoPE on the first rope_dim dims (NEOX pairs; a pair rotates iff its section is
        t, h or w: text positions); causal softmax(q·k / sqrt(Dh))·v; · sigmoid(gate); ·Wo
    then h' = rms(x)·post_attention_norm; x += (silu(h'·Wg) * h'·Wu)·Wd
    hidden = rms(x)·output_norm; logits = hidden·outputᵀ
"""
from __future__ import annotations

import math

import numpy as np
from gguf import GGMLQuantizationType as T
from gguf.quants import dequantize

RULES = ("z_gate", "attn_gate", "l2_norm", "conv", "decay", "beta", "rope_sections")


def rope_mask(n_rot: int, sections) -> np.ndarray:
    """(n_rot/2,) True where pair i rotates with the text position (ggml_mrope_cache_init,
    imrope, positions t = h = w = pos, e = 0)."""
    s = list(sections)
    total = sum(s)
    out = np.zeros(n_rot // 2, bool)
    for i in range(n_rot // 2):
        sec = i % total
        out[i] = ((sec % 3 == 1 and sec < 3 * s[1]) or (sec % 3 == 2 and sec < 3 * s[2])
                  or (sec % 3 == 0 and sec < 3 * s[0]))
    return out


def qwen35_forward(gf, tokens, broken: tuple = ()) -> tuple[np.ndarray, np.ndarray]:
    """-> (logits (M, V), hidden (M, D)) in float64."""
    a = "qwen35"

    def t(name):
        raw, qt = gf.tensor(name), gf.tensors[name].ggml_type
        return (raw if qt in (T.F32, T.F16) else dequantize(raw, qt)).astype(np.float64)

    def key(k, default=None):
        return gf.get(f"{a}.{k}", default)
    eps = key("attention.layer_norm_rms_epsilon")
    H, Hkv, Dh = key("attention.head_count"), key("attention.head_count_kv"), key("attention.key_length")
    n_layer = key("block_count") - key("nextn_predict_layers", 0)
    interval = key("full_attention_interval", 4)
    K, S, Hv, Hk = key("ssm.conv_kernel"), key("ssm.state_size"), key("ssm.time_step_rank"), key("ssm.group_count")
    n_rot, base = key("rope.dimension_count"), key("rope.freq_base")
    mask = rope_mask(n_rot, key("rope.dimension_sections"))
    if "rope_sections" in broken:
        mask = np.ones_like(mask) if not mask.all() else np.arange(len(mask)) % 2 == 0
    M = len(tokens)
    pos = np.arange(M)

    def rms(x, w, e=eps):
        return x / np.sqrt((x * x).mean(-1, keepdims=True) + e) * w

    def silu(x):
        return x / (1 + np.exp(-x))

    def sigmoid(x):
        return 1 / (1 + np.exp(-x))

    x = t("token_embd.weight")[tokens]
    for il in range(n_layer):
        b = f"blk.{il}."
        h = rms(x, t(b + "attn_norm.weight"))
        if (il + 1) % interval:
            qkv = h @ t(b + "attn_qkv.weight").T                                     # (M, C)
            z = (h @ t(b + "attn_gate.weight").T).reshape(M, Hv, S)
            w = t(b + "ssm_conv1d.weight")                                          # (C, K)
            xin = np.concatenate([np.zeros((K - 1, qkv.shape[1])), qkv])
            c = np.stack([(xin[m:m + K] * w.T).sum(0) for m in range(M)])
            c = qkv if "conv" in broken else silu(c)
            q, k, v = np.split(c, [Hk * S, 2 * Hk * S], axis=1)
            q, k, v = q.reshape(M, Hk, S), k.reshape(M, Hk, S), v.reshape(M, Hv, S)
            if "l2_norm" not in broken:
                q = q / np.sqrt((q * q).sum(-1, keepdims=True) + eps)
                k = k / np.sqrt((k * k).sum(-1, keepdims=True) + eps)
            al = h @ t(b + "ssm_alpha.weight").T + t(b + "ssm_dt.bias")
            g = np.where(al > 20, al, np.log1p(np.exp(np.minimum(al, 20)))) * t(b + "ssm_a")
            if "decay" in broken:
                g = np.zeros_like(g)
            beta = sigmoid(h @ t(b + "ssm_beta.weight").T)
            if "beta" in broken:
                beta = np.ones_like(beta)
            st = np.zeros((Hv, S, S))                                                # (Hv, Dv, Dk)
            o = np.empty((M, Hv, S))
            for m in range(M):
                for j in range(Hv):
                    kk, qq = k[m, j % Hk], q[m, j % Hk]
                    st[j] *= math.exp(g[m, j])
                    d = beta[m, j] * (v[m, j] - st[j] @ kk)
                    st[j] += np.outer(d, kk)
                    o[m, j] = st[j] @ qq / math.sqrt(S)
            y = rms(o, t(b + "ssm_norm.weight"))
            if "z_gate" not in broken:
                y = y * silu(z)
            x = x + y.reshape(M, Hv * S) @ t(b + "ssm_out.weight").T
        else:
            x = x + _attention(t, b, h, pos, H, Hkv, Dh, n_rot, base, mask, eps, broken, rms, sigmoid)
        h2 = rms(x, t(b + "post_attention_norm.weight"))
        x = x + (silu(h2 @ t(b + "ffn_gate.weight").T) * (h2 @ t(b + "ffn_up.weight").T)) @ t(b + "ffn_down.weight").T
    hidden = rms(x, t("output_norm.weight"))
    out = t("output.weight") if "output.weight" in gf.tensors else t("token_embd.weight")
    return hidden @ out.T, hidden


def _attention(t, b, h, pos, H, Hkv, Dh, n_rot, base, mask, eps, broken, rms, sigmoid):
    """A gated attention layer's output (M, D) (before the residual add)."""
    M = h.shape[0]
    qg = (h @ t(b + "attn_q.weight").T).reshape(M, H, 2 * Dh)
    q, gate = qg[:, :, :Dh], qg[:, :, Dh:]
    k = (h @ t(b + "attn_k.weight").T).reshape(M, Hkv, Dh)
    v = (h @ t(b + "attn_v.weight").T).reshape(M, Hkv, Dh)
    q, k = rms(q, t(b + "attn_q_norm.weight")), rms(k, t(b + "attn_k_norm.weight"))
    half = n_rot // 2
    theta = pos[:, None] * base ** (-2.0 * np.arange(half) / n_rot) * mask               # (M, half)
    c, s = np.cos(theta)[:, None], np.sin(theta)[:, None]

    def rope(x):
        x = x.copy()
        x0, x1 = x[..., :half].copy(), x[..., half:n_rot].copy()
        x[..., :half], x[..., half:n_rot] = x0 * c - x1 * s, x0 * s + x1 * c
        return x
    q, k = rope(q), rope(k)
    att = np.empty((M, H, Dh))
    for hh in range(H):
        kv = hh // (H // Hkv)
        sc = np.where(pos[None, :] <= pos[:, None], q[:, hh] @ k[:, kv].T / math.sqrt(Dh), -np.inf)
        e = np.exp(sc - sc.max(-1, keepdims=True))
        att[:, hh] = (e / e.sum(-1, keepdims=True)) @ v[:, kv]
    if "attn_gate" not in broken:
        att = att * sigmoid(gate)
    return att.reshape(M, H * Dh) @ t(b + "attn_output.weight").T
