"""Model hyper-parameters: one frozen dataclass read from a GGUF file's metadata."""
from __future__ import annotations

import math
from dataclasses import dataclass

from .errors import UnsupportedModelError
from .gguf_file import GGUFFile

SUPPORTED_ARCHS = ("llama", "qwen2", "gemma3")

# RoPE variants, as llama.cpp's llama_model_rope_type assigns them:
# NORM rotates adjacent pairs (x[2i], x[2i+1]); NEOX rotates halves (x[i], x[i + d/2]).
ROPE_NORM, ROPE_NEOX = 0, 2
_ROPE_TYPE = {"llama": ROPE_NORM, "qwen2": ROPE_NEOX, "gemma3": ROPE_NEOX}


@dataclass(frozen=True)
class ModelConfig:
    arch: str
    n_layer: int
    d_model: int            # embedding length
    n_head: int
    n_head_kv: int
    d_head: int             # key/value head size
    d_ff: int
    n_vocab: int
    n_ctx_train: int
    norm_eps: float
    rope_base: float
    rope_dim: int           # rotated dims per head (<= d_head)
    rope_type: int          # ROPE_NORM | ROPE_NEOX
    attn_scale: float       # multiplies q·k
    # gemma3 only: sliding-window (local) layers use their own RoPE base
    sliding_window: int = 0          # 0 = every layer global
    swa_period: int = 0              # layer il is global iff (il + 1) % swa_period == 0
    rope_base_local: float = 10000.0
    embed_scale: float = 1.0         # token embeddings are multiplied by this (gemma: sqrt(d_model))
    final_logit_softcap: float = 0.0  # gemma3: logits = c * tanh(logits / c) when c > 0

    @property
    def n_rep(self) -> int:
        """Query heads per key/value head (grouped-query attention)."""
        return self.n_head // self.n_head_kv

    def is_local_layer(self, il: int) -> bool:
        return self.sliding_window > 0 and (il + 1) % self.swa_period != 0

    @classmethod
    def from_gguf(cls, gf: GGUFFile) -> "ModelConfig":
        arch = gf.require("general.architecture")
        if arch not in SUPPORTED_ARCHS:
            raise UnsupportedModelError(
                f"{gf.path}: unknown architecture {arch!r} (specdec runs {', '.join(SUPPORTED_ARCHS)})")

        def key(name, default=None):
            full = f"{arch}.{name}"
            return gf.require(full) if default is None else gf.get(full, default)

        d_model, n_head = int(key("embedding_length")), int(key("attention.head_count"))
        n_head_kv = int(key("attention.head_count_kv", n_head))
        d_head = int(key("attention.key_length", d_model // n_head))
        emb = gf.tensors.get("token_embd.weight")
        n_vocab = emb.dims[1] if emb is not None else len(gf.require("tokenizer.ggml.tokens"))
        n_layer = int(key("block_count"))
        attn_scale = 1.0 / math.sqrt(d_head)
        sliding, softcap = 0, 0.0
        if arch == "gemma3":
            # llama.cpp (llama_model::load_hparams, LLM_ARCH_GEMMA3): SWA only when the file
            # gives a window; 1/sqrt(n_embd / n_head) for the 62-layer 27B, else
            # 1/sqrt(head size); a final logit softcap only when the file sets one.
            sliding = int(key("attention.sliding_window", 0))
            softcap = float(key("final_logit_softcapping", 0.0))
            if n_layer == 62:
                attn_scale = 1.0 / math.sqrt(d_model // n_head)
            factor = float(key("rope.scaling.factor", 0.0))
            if factor not in (0.0, 1.0):
                raise UnsupportedModelError(
                    f"{gf.path}: RoPE scaling (factor {factor:g}) is not supported")
        return cls(
            arch=arch,
            n_layer=n_layer,
            d_model=d_model, n_head=n_head, n_head_kv=n_head_kv, d_head=d_head,
            d_ff=int(key("feed_forward_length")),
            n_vocab=int(n_vocab),
            n_ctx_train=int(key("context_length", 2048)),
            norm_eps=float(key("attention.layer_norm_rms_epsilon", 1e-5)),
            rope_base=float(key("rope.freq_base", 10000.0)),
            rope_dim=int(key("rope.dimension_count", d_head)),
            rope_type=_ROPE_TYPE[arch],
            attn_scale=attn_scale,
            sliding_window=sliding,
            swa_period=6 if sliding else 0,
            embed_scale=math.sqrt(d_model) if arch == "gemma3" else 1.0,
            final_logit_softcap=softcap,
        )
