"""qwen35: Qwen3.5's hybrid layers (llama.cpp's src/models/qwen35.cpp) and its
multi-token-prediction block's weights.

Layer il is a Gated DeltaNet layer (engine/deltanet.py) unless (il + 1) % interval == 0
(or the file's per-layer flags say otherwise), then a gated full-attention layer:

    q | gate = h·attn_q (each head's query, then its gate);  k = h·attn_k;  v = h·attn_v
    q, k RMS-normed per head (attn_q_norm, attn_k_norm);  interleaved M-RoPE on the first
    rope_dim dims of each head, NEOX pairs (text positions: pair i rotates as usual when its
    section is t, h or w, not at all in section e);  causal attention (1/sqrt(Dh));
    o = att · sigmoid(gate);  out = o·attn_output

Both kinds: x += out;  x += FFN(rms(x)·post_attention_norm) (SwiGLU).  The hidden state
llama.cpp hands the MTP head (t_h_nextn) is rms(x)·output_norm of the last layer's rows: the
output head's own input (transformer.forward's `hidden`).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..kernels import get_rows
from ..kernels.attention import attention
from ..kernels.delta_rule import mul_sigmoid
from ..kernels.ops import rms_norm, rms_norm_heads, rope_apply, rope_cos_sin, swiglu
from .deltanet import deltanet
from .recurrent import HybridCache, RecurrentShape


def rope_pairs(n_rot: int, sections) -> np.ndarray:
    """(n_rot/2,) float32 frequency divisors for rope_cos_sin: 1 where pair i rotates with the
    text position under interleaved M-RoPE (ggml_mrope_cache_init, imrope, positions
    t = h = w = pos, e = 0), inf (angle 0: left as it is) where it does not."""
    s = [int(v) for v in sections]
    total = max(sum(s), 1)
    out = np.empty(n_rot // 2, np.float32)
    for i in range(n_rot // 2):
        sec = i % total
        turns = ((sec % 3 == 1 and sec < 3 * s[1]) or (sec % 3 == 2 and sec < 3 * s[2])
                 or (sec % 3 == 0 and sec < 3 * s[0]))
        out[i] = 1.0 if turns else np.inf
    return out


def shape_of(cfg) -> RecurrentShape:
    """The recurrent layers' sizes of a qwen35 ModelConfig."""
    Hk, Hv, S = cfg.ssm_n_k_heads, cfg.ssm_n_v_heads, cfg.ssm_d_state
    return RecurrentShape(n_layer=sum(cfg.recurrent), conv_kernel=cfg.ssm_conv_kernel,
                          channels=2 * Hk * S + Hv * S, n_k_heads=Hk, n_v_heads=Hv, d_state=S)


def gated_attention(cfg, L, h: np.ndarray, caches, kv: int, starts, rows, pos: np.ndarray, cs) -> np.ndarray:
    """A gated full-attention block on the normed input h (M, D) -> (M, D) (before the residual);
    item i's keys and values go to caches[i] at kv index kv from starts[i]; cs: rope_cos_sin
    of pos with rope_pairs.  Also the MTP block's attention."""
    H, Hkv, Dh = cfg.n_head, cfg.n_head_kv, cfg.d_head
    M = h.shape[0]
    qg = L.wq(h).reshape(M, H, 2 * Dh)                                           # (M, H, 2 Dh)
    q = np.ascontiguousarray(qg[:, :, :Dh])                                      # (M, H, Dh)
    gate = np.ascontiguousarray(qg[:, :, Dh:]).reshape(M, H * Dh)                # (M, H Dh)
    k = L.wk(h).reshape(M, Hkv, Dh)
    v = L.wv(h).reshape(M, Hkv, Dh)
    rms_norm_heads(q, L.q_norm, cfg.norm_eps)
    rms_norm_heads(k, L.k_norm, cfg.norm_eps)
    rope_apply(q, cs, True)
    rope_apply(k, cs, True)
    att = np.empty((M, H, Dh), dtype=np.float32)
    for cache, start, r in zip(caches, starts, rows):
        cache.store(kv, start, k[r], v[r])
        attention(q[r], cache.k[kv], cache.v[kv], pos[r], np.float32(cfg.attn_scale), 0, att[r])
    o = att.reshape(M, H * Dh)
    mul_sigmoid(o, gate)
    return L.wo(o)


@dataclass(frozen=True)
class SharedExpert:
    """qwen35moe's shared expert (llama.cpp's qwen35moe build_layer_ffn): a SwiGLU FFN beside
    the routed experts, its output times sigmoid(h·ffn_gate_inp_shexp)."""
    gate: object              # Linear (D) -> (Fs)
    up: object                # Linear (D) -> (Fs)
    down: object              # Linear (Fs) -> (D)
    gate_inp: object          # Linear (D) -> (1), the (D,) vector as one row

    def __call__(self, h: np.ndarray) -> np.ndarray:
        """h (M, D) normed -> (M, D)."""
        g, u = self.gate(h), self.up(h)                                          # (M, Fs) each
        swiglu(g, u, g)
        y = self.down(g)                                                         # (M, D)
        z = np.ascontiguousarray(np.broadcast_to(self.gate_inp(h), y.shape))     # (M, D) the row's logit
        mul_sigmoid(y, z)
        return y


def ffn_block(cfg, L, x: np.ndarray, h: np.ndarray) -> None:
    """x += FFN(rms(x)·post_attention_norm), in place (h: (M, D) scratch): a SwiGLU FFN, or
    (qwen35moe) the routed experts plus the gated shared expert."""
    rms_norm(x, L.ffn_norm, cfg.norm_eps, h)
    if L.moe is not None:
        f = L.moe(h)                                                             # (M, D)
        f += L.shared(h)
        x += f
        return
    gate, up = L.w_gate(h), L.w_up(h)                                            # (M, F) each
    swiglu(gate, up, gate)
    x += L.w_down(gate)


def hybrid_layer(cfg, il: int, L, x: np.ndarray, items, rows, pos: np.ndarray, rope_cs: dict) -> None:
    """qwen35 layer il on the residual stream x (M, D), in place: items (transformer.Item)
    each with its own HybridCache, rows[i] its slice of x."""
    h = np.empty_like(x)
    rms_norm(x, L.attn_norm, cfg.norm_eps, h)
    caches = [it.cache for it in items]
    if L.deltanet is not None:
        ir = caches[0].rec_of[il]
        x += deltanet(L.deltanet, shape_of(cfg), ir, h, [c.rec for c in caches], rows, cfg.norm_eps)
    else:
        if "cs" not in rope_cs:
            rope_cs["cs"] = rope_cos_sin(pos, cfg.rope_dim, cfg.rope_base, cfg.rope_freq_scale,
                                         rope_pairs(cfg.rope_dim, cfg.rope_sections))
        x += gated_attention(cfg, L, h, caches, caches[0].kv_of[il], [it.start for it in items], rows, pos,
                             rope_cs["cs"])
    ffn_block(cfg, L, x, h)


@dataclass(frozen=True)
class MTPHead:
    """The multi-token-prediction block of a qwen35 file (blk.<n_layer>.*, llama.cpp's
    graph_mtp), frozen at load; the drafter that runs it lives in speculation/.

        e = rms(embed[token])·enorm;  hh = rms(h)·hnorm  (h: the target's hidden state,
            transformer.forward's `hidden`, i.e. rms(x)·output_norm)
        x = [e | hh]·eh_proj;  x = the gated attention block `layer` (its own KV cache)
        h' = rms(x)·head_norm (the next step's h);  logits = h'·headᵀ"""
    eh_proj: object             # Linear (2D) -> (D), input [enorm(embed) | hnorm(h)]
    enorm: np.ndarray           # (D,)
    hnorm: np.ndarray           # (D,)
    layer: object               # weights.Layer: attn_norm, wq (D -> 2 H Dh), wk, wv, wo, q/k norms,
                                # ffn_norm (post_attention_norm), w_gate, w_up, w_down
    head_norm: np.ndarray       # (D,) nextn.shared_head_norm, else output_norm
    head: object                # Linear (D) -> (V): nextn.shared_head_head, else the output
    embed: np.ndarray           # raw rows (V, ·): nextn.embed_tokens, else token_embd
    embed_type: int             # embed's type id (kernels.get_rows)


def new_hybrid_cache(cfg, n_ctx: int) -> HybridCache:
    """A session's cache: keys and values of the attention layers, the recurrent layers' states."""
    kv_of, rec_of, n_kv, n_rec = [], [], 0, 0
    for r in cfg.recurrent:
        kv_of.append(-1 if r else n_kv)
        rec_of.append(n_rec if r else -1)
        n_kv, n_rec = n_kv + (not r), n_rec + r
    return HybridCache(n_kv, cfg.n_head_kv, n_ctx, cfg.d_head, shape_of(cfg), tuple(kv_of), tuple(rec_of))


def mtp_forward(cfg, mtp: MTPHead, cache, tokens: np.ndarray, hidden: np.ndarray, start: int,
                head=None) -> tuple[np.ndarray, np.ndarray]:
    """The MTP block (llama.cpp's qwen35 graph_mtp) over M rows at positions start..: row m
    joins token tokens[m]'s embedding and the hidden state hidden[m] (M, D) -> (logits (M, V),
    or (M, head.n_out) with `head`, e.g. a trimmed copy of mtp.head; the block's own hidden
    state (M, D), rms(x)·head_norm, the next chained step's input).  cache: the block's own
    KVCache of one layer (kv_cache.KVCache(1, n_head_kv, n_ctx, d_head)); n_past becomes
    start + M (rows from start on are overwritten)."""
    tokens = np.asarray(tokens, np.int64)
    M, D = len(tokens), cfg.d_model
    if start < cache.n_past:
        cache.truncate(start)
    cache.check_room(start - cache.n_past + M)
    e = get_rows(mtp.embed, mtp.embed_type, tokens, D)                           # (M, D)
    eh = np.empty((M, 2 * D), np.float32)                                        # [enorm(e) | hnorm(h)]
    rms_norm(e, mtp.enorm, cfg.norm_eps, eh[:, :D])
    rms_norm(np.ascontiguousarray(hidden, np.float32), mtp.hnorm, cfg.norm_eps, eh[:, D:])
    x = mtp.eh_proj(eh)                                                          # (M, D)
    L = mtp.layer
    pos = np.arange(start, start + M, dtype=np.int64)
    h = np.empty_like(x)
    rms_norm(x, L.attn_norm, cfg.norm_eps, h)
    cs = rope_cos_sin(pos, cfg.rope_dim, cfg.rope_base, cfg.rope_freq_scale,
                      rope_pairs(cfg.rope_dim, cfg.rope_sections))
    x += gated_attention(cfg, L, h, [cache], 0, [start], [slice(0, M)], pos, cs)
    ffn_block(cfg, L, x, h)
    rms_norm(x, mtp.head_norm, cfg.norm_eps, x)
    cache.n_past = start + M
    return (head or mtp.head)(x), x
