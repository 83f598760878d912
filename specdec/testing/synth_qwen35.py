"""Tiny synthetic Qwen3.5 (`qwen35`) files: Gated DeltaNet layers, a gated full-attention
layer every `interval`-th, and optionally the multi-token-prediction block (`nextn`).

The names and shapes are llama.cpp's (llama_model_qwen35::load_arch_tensors): a recurrent
layer has attn_qkv (the conv's q | k | v channels), attn_gate (z), ssm_conv1d, ssm_dt.bias,
ssm_a (= -exp(A_log)), ssm_alpha, ssm_beta, ssm_norm and ssm_out; an attention layer has
attn_q of 2 x n_head x d_head rows (each head's query, then its gate), attn_k, attn_v,
attn_output and q/k norms; every layer has attn_norm, post_attention_norm (before the FFN)
and a SwiGLU FFN.  With nextn=True the block after the last layer (index n_layer; the file's
block_count is n_layer + 1 and nextn_predict_layers 1) is an attention layer plus
nextn.eh_proj, nextn.enorm, nextn.hnorm (and nextn.shared_head_norm where asked).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import gguf
import numpy as np
from gguf import GGMLQuantizationType as T

from .synth import TinySpec, add_tokenizer, tensor_writers, tokenizer_metadata


@dataclass(frozen=True)
class Qwen35Spec:
    n_vocab: int = 64
    d_model: int = 64
    n_layer: int = 4               # trunk layers (the nextn block not counted)
    n_head: int = 4
    n_head_kv: int = 2
    d_head: int = 32               # attention head size (key_length = value_length)
    d_ff: int = 96
    rope_dim: int = 16             # rotated dims per head (partial RoPE)
    rope_sections: tuple = (3, 3, 2, 0)   # rope.dimension_sections (interleaved M-RoPE)
    conv_kernel: int = 4           # ssm.conv_kernel
    n_k_heads: int = 2             # ssm.group_count
    n_v_heads: int = 4             # ssm.time_step_rank
    d_state: int = 16              # ssm.state_size: key and value head size
    interval: int = 4              # full_attention_interval (layer il attends iff (il + 1) % interval == 0)
    qtype: int = int(T.F32)        # type of the 2-D weights (ssm_conv1d stays F32, as in real files)
    seed: int = 0
    nextn: bool = False            # write the MTP block
    nextn_head_norm: bool = False  # ... with its own nextn.shared_head_norm
    tied: bool = False
    logit_scale: float = 1.0
    n_ctx: int = 512
    merges: tuple[str, ...] = ()
    chat_template: str | None = None   # tokenizer.chat_template (Jinja2), none by default
    n_expert: int = 0              # > 0: a qwen35moe file, each FFN E experts and a shared expert
    n_expert_used: int = 2
    d_ff_exp: int = 0              # expert_feed_forward_length (0: d_ff)
    d_ff_shexp: int = 0            # expert_shared_feed_forward_length (0: d_ff)
    extra_tensors: tuple = ()      # names of extra float32 vectors of d_model values


def write_qwen35_model(path: str | Path, spec: Qwen35Spec = Qwen35Spec()) -> Path:
    """Write a random-weight qwen35 file to `path` and return it."""
    rng = np.random.default_rng(spec.seed)
    path = Path(path)
    D, H, Hkv, Dh, F, V = spec.d_model, spec.n_head, spec.n_head_kv, spec.d_head, spec.d_ff, spec.n_vocab
    Hk, Hv, S = spec.n_k_heads, spec.n_v_heads, spec.d_state
    conv_dim = 2 * Hk * S + Hv * S
    a = "qwen35moe" if spec.n_expert else "qwen35"
    w = gguf.GGUFWriter(str(path), a)
    _write_metadata(w, spec, a)
    E, Fe, Fs = spec.n_expert, spec.d_ff_exp or F, spec.d_ff_shexp or F

    mat, vec = tensor_writers(w, rng, spec.qtype, draw_all=False)

    def attention(p):
        mat(p + "attn_q.weight", 2 * H * Dh, D, 1 / np.sqrt(D))
        mat(p + "attn_k.weight", Hkv * Dh, D, 1 / np.sqrt(D))
        mat(p + "attn_v.weight", Hkv * Dh, D, 1 / np.sqrt(D))
        mat(p + "attn_output.weight", D, H * Dh, 1 / np.sqrt(H * Dh))
        vec(p + "attn_q_norm.weight", Dh)
        vec(p + "attn_k_norm.weight", Dh)

    def block(p, recurrent):
        vec(p + "attn_norm.weight", D)
        if recurrent:
            mat(p + "attn_qkv.weight", conv_dim, D, 1 / np.sqrt(D))
            mat(p + "attn_gate.weight", Hv * S, D, 1 / np.sqrt(D))
            mat(p + "ssm_conv1d.weight", conv_dim, spec.conv_kernel, 0.5, qtype=T.F32)
            vec(p + "ssm_dt.bias", Hv, around=0.0, std=0.5)
            w.add_tensor(p + "ssm_a", (-np.exp(rng.uniform(-1.0, 1.0, Hv))).astype(np.float32))
            mat(p + "ssm_alpha.weight", Hv, D, 1 / np.sqrt(D))
            mat(p + "ssm_beta.weight", Hv, D, 1 / np.sqrt(D))
            vec(p + "ssm_norm.weight", S)
            mat(p + "ssm_out.weight", D, Hv * S, 1 / np.sqrt(Hv * S))
        else:
            attention(p)
        vec(p + "post_attention_norm.weight", D)
        if E:                                  # router (F32 as in real files), experts, shared expert
            mat(p + "ffn_gate_inp.weight", E, D, 1 / np.sqrt(D), qtype=T.F32)
            mat(p + "ffn_gate_exps.weight", Fe, D, 1 / np.sqrt(D), n_stack=E)
            mat(p + "ffn_up_exps.weight", Fe, D, 1 / np.sqrt(D), n_stack=E)
            mat(p + "ffn_down_exps.weight", D, Fe, 1 / np.sqrt(Fe), n_stack=E)
            vec(p + "ffn_gate_inp_shexp.weight", D, around=0.0, std=1 / np.sqrt(D))
            mat(p + "ffn_gate_shexp.weight", Fs, D, 1 / np.sqrt(D))
            mat(p + "ffn_up_shexp.weight", Fs, D, 1 / np.sqrt(D))
            mat(p + "ffn_down_shexp.weight", D, Fs, 1 / np.sqrt(Fs))
            return
        mat(p + "ffn_gate.weight", F, D, 1 / np.sqrt(D))
        mat(p + "ffn_up.weight", F, D, 1 / np.sqrt(D))
        mat(p + "ffn_down.weight", D, F, 1 / np.sqrt(F))

    mat("token_embd.weight", V, D, 1.0)
    if not spec.tied:
        mat("output.weight", V, D, spec.logit_scale / np.sqrt(D))
    vec("output_norm.weight", D)
    for i in range(spec.n_layer):
        block(f"blk.{i}.", (i + 1) % spec.interval != 0)
    if spec.nextn:
        p = f"blk.{spec.n_layer}."
        block(p, False)
        mat(p + "nextn.eh_proj.weight", D, 2 * D, 1 / np.sqrt(2 * D))
        vec(p + "nextn.enorm.weight", D)
        vec(p + "nextn.hnorm.weight", D)
        if spec.nextn_head_norm:
            vec(p + "nextn.shared_head_norm.weight", D)
    for name in spec.extra_tensors:
        vec(name, D)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def _write_metadata(w: gguf.GGUFWriter, spec: Qwen35Spec, a: str) -> None:
    """The file's keys: the hyper-parameters (`a`: the architecture's prefix), the recurrent
    layers' shape, the experts and the MTP block where the spec has them, the tokenizer."""
    D, H, Hkv, Dh, F, V = spec.d_model, spec.n_head, spec.n_head_kv, spec.d_head, spec.d_ff, spec.n_vocab
    Hk, Hv, S = spec.n_k_heads, spec.n_v_heads, spec.d_state
    w.add_block_count(spec.n_layer + (1 if spec.nextn else 0))
    w.add_context_length(spec.n_ctx)
    w.add_embedding_length(D)
    w.add_feed_forward_length(F)
    w.add_head_count(H)
    w.add_head_count_kv(Hkv)
    w.add_key_length(Dh)
    w.add_value_length(Dh)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_rope_freq_base(10000000.0)
    w.add_uint32(f"{a}.rope.dimension_count", spec.rope_dim)
    w.add_array(f"{a}.rope.dimension_sections", list(spec.rope_sections))
    w.add_uint32(f"{a}.ssm.conv_kernel", spec.conv_kernel)
    w.add_uint32(f"{a}.ssm.inner_size", Hv * S)
    w.add_uint32(f"{a}.ssm.state_size", S)
    w.add_uint32(f"{a}.ssm.time_step_rank", Hv)
    w.add_uint32(f"{a}.ssm.group_count", Hk)
    w.add_uint32(f"{a}.full_attention_interval", spec.interval)
    E, Fe, Fs = spec.n_expert, spec.d_ff_exp or F, spec.d_ff_shexp or F
    if E:
        w.add_expert_count(E)
        w.add_expert_used_count(spec.n_expert_used)
        w.add_expert_feed_forward_length(Fe)
        w.add_uint32(f"{a}.expert_shared_feed_forward_length", Fs)
    if spec.nextn:
        w.add_uint32(f"{a}.nextn_predict_layers", 1)
    meta = tokenizer_metadata(TinySpec(n_vocab=V, merges=spec.merges))
    add_tokenizer(w, meta, V, spec.chat_template)
