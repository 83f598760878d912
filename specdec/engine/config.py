"""Model hyper-parameters: one frozen dataclass read from a GGUF file's metadata."""
from __future__ import annotations

import math
from dataclasses import dataclass

from ..errors import GGUFError, UnsupportedModelError
from .gguf_file import GGUFFile

SUPPORTED_ARCHS = ("llama", "mistral3", "qwen2", "qwen3", "phi3", "smollm3", "gemma3", "qwen3moe", "qwen35",
                   "qwen35moe")
HYBRID_ARCHS = ("qwen35", "qwen35moe")          # Gated DeltaNet layers beside gated attention (engine/qwen35.py)
MOE_ARCHS = ("llama", "qwen3moe", "qwen35moe")   # a router and experts where the file names an expert_count
MAX_EXPERTS = 512                    # llama.cpp's LLAMA_MAX_EXPERTS
MAX_COUNT = 1 << 24      # bound on every integer hyper-parameter (layers, widths, context)

# RoPE variants, as llama.cpp's llama_model_rope_type assigns them:
# NORM rotates adjacent pairs (x[2i], x[2i+1]); NEOX rotates halves (x[i], x[i + d/2]).
ROPE_NORM, ROPE_NEOX = 0, 2
_ROPE_TYPE = {"llama": ROPE_NORM, "mistral3": ROPE_NORM, "qwen2": ROPE_NEOX, "qwen3": ROPE_NEOX, "phi3": ROPE_NEOX,
              "smollm3": ROPE_NORM, "gemma3": ROPE_NEOX, "qwen3moe": ROPE_NEOX,
              "qwen35": ROPE_NEOX, "qwen35moe": ROPE_NEOX}   # qwen35*: interleaved M-RoPE, NEOX pairs on text
NO_ROPE_PERIOD = {"smollm3": 4}   # layer il skips RoPE iff (il + 1) % period == 0 (hparams.n_no_rope_layer_step)


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
    rope_freq_scale: float = 1.0     # linear RoPE scaling: every angle times this (1 / factor)
    no_rope_period: int = 0          # smollm3: every 4th layer has no RoPE (0: every layer rotates)
    # mixture of experts (engine/moe.py): 0 experts = a dense FFN of d_ff
    n_expert: int = 0                # E experts per layer
    n_expert_used: int = 0           # k of them per token (top-k of the router's softmax)
    d_ff_exp: int = 0                # each expert's FFN width
    expert_norm: bool = True         # renormalise the k weights to sum 1
    expert_scale: float = 1.0        # then multiply them by this
    d_ff_shexp: int = 0              # qwen35moe: the shared expert's width (0: none)
    # qwen35 (engine/qwen35.py, engine/deltanet.py): which layers are Gated DeltaNet layers
    recurrent: tuple[bool, ...] = ()  # per layer (empty: none)
    ssm_conv_kernel: int = 0         # K taps of the causal conv1d (ssm.conv_kernel)
    ssm_d_state: int = 0             # S: key and value head size (ssm.state_size)
    ssm_n_k_heads: int = 0           # Hk (ssm.group_count)
    ssm_n_v_heads: int = 0           # Hv (ssm.time_step_rank); ssm.inner_size = Hv S
    rope_sections: tuple[int, ...] = ()   # rope.dimension_sections (interleaved M-RoPE)
    n_nextn: int = 0                 # nextn_predict_layers: MTP blocks after the n_layer layers

    @property
    def is_hybrid(self) -> bool:
        return any(self.recurrent)

    @property
    def is_moe(self) -> bool:
        return self.n_expert > 0

    @property
    def n_rep(self) -> int:
        """Query heads per key/value head (grouped-query attention)."""
        return self.n_head // self.n_head_kv

    def uses_rope(self, il: int) -> bool:
        return self.no_rope_period == 0 or (il + 1) % self.no_rope_period != 0

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

        def count(name, default=None, lo=1, hi=MAX_COUNT) -> int:
            """An integer hyper-parameter in lo..hi (a lying file gets a one-line error)."""
            v = key(name, default)
            if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
                raise GGUFError(f"{gf.path}: {arch}.{name} is {v!r:.40}, expected an integer in {lo}..{hi}")
            return v

        def real(name, default, lo=0.0) -> float:
            """A finite float hyper-parameter >= lo."""
            v = key(name, default)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < lo:
                raise GGUFError(f"{gf.path}: {arch}.{name} is {v!r:.40}, expected a finite number >= {lo:g}")
            return float(v)

        d_model, n_head = count("embedding_length"), count("attention.head_count")
        n_head_kv = count("attention.head_count_kv", n_head)
        if n_head % n_head_kv:
            raise GGUFError(f"{gf.path}: {n_head} attention heads do not divide into {n_head_kv} key/value heads")
        d_head = count("attention.key_length", max(d_model // n_head, 1))
        emb = gf.tensors.get("token_embd.weight")
        if emb is None:
            raise GGUFError(f"{gf.path}: missing tensor 'token_embd.weight'")
        if len(emb.dims) != 2:
            raise GGUFError(f"{gf.path}: tensor 'token_embd.weight' has shape {list(emb.dims)}, expected 2-D")
        n_vocab = emb.dims[1]
        n_layer = count("block_count")
        hybrid = _hybrid(gf, arch, key, count, n_layer, d_head) if arch in HYBRID_ARCHS else {}
        n_layer -= hybrid.get("n_nextn", 0)
        rope_dim = count("rope.dimension_count", d_head, lo=2, hi=d_head)
        if rope_dim % 2:
            raise GGUFError(f"{gf.path}: {arch}.rope.dimension_count {rope_dim} is odd")
        attn_scale = 1.0 / math.sqrt(d_head)
        sliding, softcap = 0, 0.0
        if arch == "gemma3":
            # llama.cpp (llama_model::load_hparams, LLM_ARCH_GEMMA3): SWA only when the file
            # gives a window; 1/sqrt(n_embd / n_head) for the 62-layer 27B, else
            # 1/sqrt(head size); a final logit softcap only when the file sets one.
            sliding = count("attention.sliding_window", 0, lo=0)
            softcap = real("final_logit_softcapping", 0.0)
            if n_layer == 62:
                attn_scale = 1.0 / math.sqrt(max(d_model // n_head, 1))
            factor = real("rope.scaling.factor", 0.0)
            if factor not in (0.0, 1.0):
                raise UnsupportedModelError(
                    f"{gf.path}: RoPE scaling (factor {factor:g}) is not supported")
        _refuse_unimplemented(gf, arch, key)
        moe = _experts(gf, arch, key, count, real)
        return cls(
            arch=arch,
            n_layer=n_layer,
            d_model=d_model, n_head=n_head, n_head_kv=n_head_kv, d_head=d_head,
            d_ff=count("feed_forward_length", 0 if moe else None),
            n_vocab=int(n_vocab),
            n_ctx_train=count("context_length", 2048),
            norm_eps=real("attention.layer_norm_rms_epsilon", 1e-5),
            rope_base=real("rope.freq_base", 10000.0, lo=1e-6),
            rope_dim=rope_dim,
            rope_type=_ROPE_TYPE[arch],
            attn_scale=attn_scale,
            sliding_window=sliding,
            swa_period=6 if sliding else 0,
            embed_scale=math.sqrt(d_model) if arch == "gemma3" else 1.0,
            final_logit_softcap=softcap,
            rope_freq_scale=1.0 if arch == "gemma3" else _linear_rope_scale(gf, arch, key),
            no_rope_period=NO_ROPE_PERIOD.get(arch, 0),
            **moe, **hybrid,
        )


def _linear_rope_scale(gf: GGUFFile, arch: str, key) -> float:
    """llama.cpp's freq_scale: 1 / rope.scaling.factor (or the older rope.scale_linear), 1
    without one; the scaling type defaults to linear as there.  Any other type (yarn,
    longrope, ...) with a factor other than 1 is refused: it changes more than the scale."""
    kind = str(key("rope.scaling.type", "linear")).lower()
    factor = key("rope.scaling.factor", 0.0) or key("rope.scale_linear", 0.0)
    if isinstance(factor, bool) or not isinstance(factor, (int, float)) or not math.isfinite(factor) or factor < 0:
        raise GGUFError(f"{gf.path}: {arch}.rope.scaling.factor is {factor!r:.40}, expected a finite number >= 0")
    if factor in (0.0, 1.0):
        return 1.0
    if kind in ("linear", "none"):
        return 1.0 / float(factor)
    raise UnsupportedModelError(f"{gf.path}: {arch}.rope.scaling.type {kind!r} (factor {factor:g}) "
                                "is not implemented by specdec (linear is)")


def _refuse_unimplemented(gf: GGUFFile, arch: str, key) -> None:
    """Metadata that changes the computation in ways this engine does not implement: an
    UnsupportedModelError naming the key, never a silently different model."""
    for name in ("attn_logit_softcapping", "final_logit_softcapping",
                 "attention.temperature_scale"):
        if name == "final_logit_softcapping" and arch == "gemma3":
            continue
        v = key(name, 0)
        if v not in (0, 0.0, None):
            raise UnsupportedModelError(f"{gf.path}: {arch}.{name} = {v!r:.40} is not implemented by specdec")


def _experts(gf: GGUFFile, arch: str, key, count, real) -> dict:
    """The mixture-of-experts fields of ModelConfig (empty for a dense file), as llama.cpp
    reads them: qwen3moe's experts are expert_feed_forward_length wide (else feed_forward_length
    / k), a llama file's (Mixtral) feed_forward_length; both renormalise the top-k weights
    (llama.cpp hard-codes it for the two; expert_weights_norm false is honoured here) and scale
    them by expert_weights_scale when set.  Routing specdec does not implement (expert groups,
    a gating function other than softmax, shared experts) is refused by key."""
    n_expert = count("expert_count", 0, lo=0, hi=MAX_EXPERTS)
    if arch in ("qwen3moe", "qwen35moe") and n_expert == 0:
        raise GGUFError(f"{gf.path}: {arch}.expert_count is missing (a {arch} file has experts)")
    if n_expert == 0:
        return {}
    if arch not in MOE_ARCHS:
        raise UnsupportedModelError(f"{gf.path}: {arch}.expert_count = {n_expert} is not implemented by "
                                    f"specdec (experts: {', '.join(MOE_ARCHS)})")
    used = count("expert_used_count", None, lo=1, hi=n_expert)
    for name, ok in (("expert_group_count", (0, 1)), ("expert_gating_func", (0, 1)),
                     ("expert_shared_count", (0,)), ("expert_shared_feed_forward_length", (0,))):
        v = key(name, 0)
        if arch == "qwen35moe" and name.startswith("expert_shared"):
            continue                         # its one gated shared expert (engine/qwen35.py)
        if v not in ok:
            raise UnsupportedModelError(f"{gf.path}: {arch}.{name} = {v!r:.40} is not implemented by specdec")
    norm = key("expert_weights_norm", True)
    if not isinstance(norm, bool):
        raise GGUFError(f"{gf.path}: {arch}.expert_weights_norm is {norm!r:.40}, expected a bool")
    scale = real("expert_weights_scale", 0.0)
    shared = {}
    if arch == "qwen35moe":       # llama.cpp: n_ff_shexp, else n_ff
        shared = dict(d_ff_shexp=count("expert_shared_feed_forward_length", 0, lo=0) or count("feed_forward_length"))
    if arch in ("qwen3moe", "qwen35moe"):
        width = count("expert_feed_forward_length", 0, lo=0)
        if width == 0:
            width = count("feed_forward_length") // used
    else:
        width = count("feed_forward_length")
    return dict(n_expert=n_expert, n_expert_used=used, d_ff_exp=width, expert_norm=norm,
                expert_scale=scale if scale not in (0.0, 1.0) else 1.0, **shared)


def _hybrid(gf: GGUFFile, arch: str, key, count, n_all: int, d_head: int) -> dict:
    """qwen35's fields of ModelConfig, as llama_model_qwen35::load_arch_hparams reads them:
    nextn_predict_layers MTP blocks follow the block_count - nextn trunk layers; a layer is
    recurrent by the file's per-layer flags (key recurrent_layers), else unless (il + 1) % full_attention_interval
    (default 4) == 0.  llama.cpp's graph needs d_inner = Hv S, Hv a multiple of Hk, and
    value and key heads of one size."""
    n_nextn = count("nextn_predict_layers", 0, lo=0, hi=1)
    n_layer = n_all - n_nextn
    if n_layer < 1:
        raise GGUFError(f"{gf.path}: {arch}.block_count {n_all} leaves no layer beside {n_nextn} nextn blocks")
    flags = key("attention.recurrent_layers", [])
    if flags:
        if len(flags) < n_layer or any(not isinstance(f, (bool, int)) for f in flags):
            raise GGUFError(f"{gf.path}: {arch}.attention.recurrent_layers is {flags!r:.60}, expected {n_all} flags")
        recurrent = tuple(bool(f) for f in flags[:n_layer])
    else:
        interval = count("full_attention_interval", 4)
        recurrent = tuple((il + 1) % interval != 0 for il in range(n_layer))
    S, Hk, Hv = count("ssm.state_size"), count("ssm.group_count"), count("ssm.time_step_rank")
    if Hv % Hk or count("ssm.inner_size") != Hv * S:
        raise GGUFError(f"{gf.path}: {arch}.ssm: {Hv} value heads of {S} do not fit {Hk} key heads and "
                        f"inner_size {key('ssm.inner_size')}")
    if count("attention.value_length", d_head) != d_head:
        raise UnsupportedModelError(f"{gf.path}: {arch}.attention.value_length differs from key_length")
    sections = key("rope.dimension_sections", [0, 0, 0, 0])
    if len(sections) != 4 or any(isinstance(v, bool) or not isinstance(v, int) or v < 0 for v in sections) \
            or not any(sections[:3]):
        raise GGUFError(f"{gf.path}: {arch}.rope.dimension_sections is {sections!r:.60}, expected 4 counts")
    return dict(recurrent=recurrent, ssm_conv_kernel=count("ssm.conv_kernel", lo=2, hi=64), ssm_d_state=S,
                ssm_n_k_heads=Hk, ssm_n_v_heads=Hv, rope_sections=tuple(sections), n_nextn=n_nextn)
