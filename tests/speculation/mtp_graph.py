"""A float64 restatement of llama.cpp's MTP drafting on a qwen35 file (src/models/qwen35.cpp
graph_mtp, common/speculative.cpp draft-mtp, one head chained): the oracle of test_mtp.py
and of its broken-rule checks.  Every rule can be broken by name (`broken=`).

    target: H_t = rms(x_t)·output_norm of the target's row t (qwen35_graph.qwen35_forward)
    MTP row t (token x_t, hidden h_t):
        e = rms(token_embd[x_t])·enorm;  g = rms(h_t)·hnorm;  x = [e | g]·eh_proj
        x += gated attention(rms(x)·attn_norm) over the rows 0..t (q/k norms, M-RoPE at t)
        x += FFN(rms(x)·post_attention_norm)
        h'_t = rms(x)·(shared_head_norm, else output_norm);  logits_t = h'_t·outputᵀ
    pairing: h_t = H_{t-1} for every row of the context (h_0 = 0); a drafted row reads the
        h' of the row before it (the chained step's input);
    after a context of L tokens, draft i (i = 0..n-1) is drawn from logits_{L-1+i}.

RULES broken: concat_order ([g | e]), hnorm (g = h), enorm (e = embd), pairing (h_t = H_t:
the row's own position), chain (a drafted row reads the target's last H, not h'),
head_norm (output_norm in place of shared_head_norm).
"""
from __future__ import annotations

import math
import sys
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType as T
from gguf.quants import dequantize

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "engine"))
from qwen35_graph import qwen35_forward, rope_mask  # noqa: E402

RULES = ("concat_order", "hnorm", "enorm", "pairing", "chain", "head_norm")


def _tensors(gf):
    def t(name):
        raw, qt = gf.tensor(name), gf.tensors[name].ggml_type
        return (raw if qt in (T.F32, T.F16) else dequantize(raw, qt)).astype(np.float64)
    return t


def mtp_rows(gf, tokens, h, broken: tuple = ()) -> tuple[np.ndarray, np.ndarray]:
    """The MTP block over rows 0..M-1 (tokens (M,), their hidden states h (M, D)), causal
    -> (logits (M, V), h' (M, D)) in float64."""
    a, t = "qwen35", _tensors(gf)
    eps = gf.get(f"{a}.attention.layer_norm_rms_epsilon")
    H, Hkv, Dh = (gf.get(f"{a}.attention.{k}") for k in ("head_count", "head_count_kv", "key_length"))
    n_rot, base = gf.get(f"{a}.rope.dimension_count"), gf.get(f"{a}.rope.freq_base")
    mask = rope_mask(n_rot, gf.get(f"{a}.rope.dimension_sections"))
    b = f"blk.{gf.get(f'{a}.block_count') - 1}."
    M = len(tokens)
    pos = np.arange(M)

    def rms(x, w=None):
        y = x / np.sqrt((x * x).mean(-1, keepdims=True) + eps)
        return y if w is None else y * w

    e = t("token_embd.weight")[np.asarray(tokens)]
    e = e if "enorm" in broken else rms(e, t(b + "nextn.enorm.weight"))
    g = h if "hnorm" in broken else rms(h, t(b + "nextn.hnorm.weight"))
    x = np.concatenate([g, e] if "concat_order" in broken else [e, g], axis=1) @ t(b + "nextn.eh_proj.weight").T
    hn = rms(x, t(b + "attn_norm.weight"))
    qg = (hn @ t(b + "attn_q.weight").T).reshape(M, H, 2 * Dh)
    q, gate = rms(qg[:, :, :Dh], t(b + "attn_q_norm.weight")), qg[:, :, Dh:]
    k = rms((hn @ t(b + "attn_k.weight").T).reshape(M, Hkv, Dh), t(b + "attn_k_norm.weight"))
    v = (hn @ t(b + "attn_v.weight").T).reshape(M, Hkv, Dh)
    half = n_rot // 2
    theta = pos[:, None] * base ** (-2.0 * np.arange(half) / n_rot) * mask                # (M, half)
    c, s = np.cos(theta)[:, None], np.sin(theta)[:, None]

    def rope(z):
        z = z.copy()
        z0, z1 = z[..., :half].copy(), z[..., half:n_rot].copy()
        z[..., :half], z[..., half:n_rot] = z0 * c - z1 * s, z0 * s + z1 * c
        return z
    q, k = rope(q), rope(k)
    att = np.empty((M, H, Dh))
    for hh in range(H):
        kv = hh // (H // Hkv)
        sc = np.where(pos[None, :] <= pos[:, None], q[:, hh] @ k[:, kv].T / math.sqrt(Dh), -np.inf)
        w = np.exp(sc - sc.max(-1, keepdims=True))
        att[:, hh] = (w / w.sum(-1, keepdims=True)) @ v[:, kv]
    att = att / (1 + np.exp(-gate))
    x = x + att.reshape(M, H * Dh) @ t(b + "attn_output.weight").T
    h2 = rms(x, t(b + "post_attention_norm.weight"))
    gt = h2 @ t(b + "ffn_gate.weight").T
    x = x + (gt / (1 + np.exp(-gt)) * (h2 @ t(b + "ffn_up.weight").T)) @ t(b + "ffn_down.weight").T
    own = b + "nextn.shared_head_norm.weight"
    hw = t(own) if own in gf.tensors and "head_norm" not in broken else t("output_norm.weight")
    out = rms(x, hw)
    head = t("output.weight") if "output.weight" in gf.tensors else t("token_embd.weight")
    return out @ head.T, out


def mtp_draft_logits(gf, context, drafted, broken: tuple = ()) -> np.ndarray:
    """The MTP logits each draft token is drawn from (len(drafted) + 1 rows: the last one
    after the whole draft), after `context`, with the drafted tokens given."""
    L = len(context)
    _, hid = qwen35_forward(gf, list(context[:-1]))                                      # (L-1, D)
    D = hid.shape[1]
    zero = np.zeros((1, D))
    if "pairing" in broken:
        h = np.concatenate([hid, hid[-1:]])[:L]
    else:
        h = np.concatenate([zero, hid])[:L]                                              # h_t = H_{t-1}
    tokens, rows = list(context), []
    for i in range(len(drafted) + 1):
        logits, out = mtp_rows(gf, tokens, h, broken)
        rows.append(logits[-1])
        if i == len(drafted):
            break
        tokens.append(int(drafted[i]))
        h = np.concatenate([h, hid[-1:] if "chain" in broken else out[-1:]])
    return np.stack(rows)
