"""The weights: the GGUF file's tensors as the kernels read them, one frozen record per layer.

`Weights.from_gguf` reads every tensor the forward pass needs (and refuses, by name, any it does
not read); a matmul weight is a `Linear`, the raw quantized rows as the kernels read them
(repacked at load or requantized where asked, else the file's own bytes).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from gguf import GGMLQuantizationType

from ..kernels import registry
from ..kernels.registry import KERNELS, SUPPORTED_TYPES, Kernel
from .config import ModelConfig
from ..errors import ConfigError, GGUFError, UnsupportedModelError
from .gguf_file import GGUFFile
from .deltanet import DeltaNet, load_deltanet
from .moe import MoE, load_moe
from .qwen35 import MTPHead, SharedExpert, shape_of
from .prepared import Prepared
from .requant import Requant, convert, narrows


@dataclass(frozen=True)
class Linear:
    """y = x · Wᵀ (+ b).   w: raw rows (N, ·) of the file, or with the file in memory a layout
    of kernels/registry.py (legacy quants: 8-row records, the same bytes; K-quants of 16k rows:
    a new array (N/16, ·) of interleaved records); qtype: w's type id; n_in = K, n_out = N.
    kernel: w's matmul and row lookup, bound when the weight is made (registry.KERNELS)."""
    name: str
    w: np.ndarray
    qtype: int
    n_in: int
    n_out: int
    bias: np.ndarray | None = None     # (N,) float32
    float_act: bool = False            # keep activations in float32 (kernels/float_act.py)
    kernel: Kernel | None = None       # KERNELS[qtype] unless given

    def __post_init__(self):
        if self.kernel is None:
            object.__setattr__(self, "kernel", KERNELS[self.qtype])

    def __call__(self, x: np.ndarray) -> np.ndarray:
        y = self.kernel.matmul(self.w, x, float_act=self.float_act)   # (M, K) -> (M, N)
        if self.bias is not None:
            y += self.bias
        return y


@dataclass(frozen=True)
class Layer:
    attn_norm: np.ndarray            # (D,)
    wq: Linear | None                # (D) -> (H * Dh)     (None: fused in wqkv)
    wk: Linear | None                # (D) -> (Hkv * Dh)
    wv: Linear | None                # (D) -> (Hkv * Dh)
    wo: Linear                       # (H * Dh) -> (D)
    ffn_norm: np.ndarray             # (D,)
    w_gate: Linear | None            # (D) -> (F)          (None: phi3's w_up holds it, or moe)
    w_up: Linear | None              # (D) -> (F), phi3: (D) -> (2F) = [gate | up]  (None: moe)
    w_down: Linear | None            # (F) -> (D)                                    (None: moe)
    q_norm: np.ndarray | None = None          # (Dh,)  gemma3, qwen3
    k_norm: np.ndarray | None = None          # (Dh,)  gemma3, qwen3
    post_attn_norm: np.ndarray | None = None  # (D,)   gemma3
    post_ffn_norm: np.ndarray | None = None   # (D,)   gemma3
    wqkv: Linear | None = None                # (D) -> ((H + 2 Hkv) * Dh): attn_qkv (phi3)
    moe: MoE | None = None                    # router and experts in place of the dense FFN
    deltanet: DeltaNet | None = None          # qwen35: a Gated DeltaNet layer in place of attention
    shared: SharedExpert | None = None        # qwen35moe: the gated shared expert beside the experts


@dataclass(frozen=True)
class Weights:
    tok_embd: np.ndarray             # raw rows (V, ·), or as a Linear's w (in a registry layout)
    tok_embd_type: int
    layers: tuple[Layer, ...]
    out_norm: np.ndarray             # (D,)
    output: Linear                   # (D) -> (V); the embedding table when tied
    rope_freqs: np.ndarray | None = None   # (rope_dim/2,) Llama 3.1+ frequency divisors
    mtp: MTPHead | None = None             # qwen35 with nextn tensors: the MTP block (engine/qwen35.py)

    @classmethod
    def from_gguf(cls, gf: GGUFFile, cfg: ModelConfig, activations: str = "auto",
                  requant: Requant | None = None, prepared: Prepared | None = None,
                  record: Prepared | None = None) -> "Weights":
        """activations: "q8" rounds each matmul's input to 8 bits per block as llama.cpp does
        (faster); "float" keeps the layers' activations in float32 (the output head always
        rounds); "auto" is "float" for gemma3, whose post-norms make the rounding chaotic
        (kernels/float_act.py), and "q8" otherwise.
        requant: convert the layers' matmul weights and/or the output head into a narrower
        format in process memory (engine/requant.py); the embedding lookup table stays.
        prepared: what an earlier load prepared (engine/prepared.py; gf reads its image when
        it has one): used as it is; record: filled with what this load prepares."""
        if activations not in ("auto", "q8", "float"):
            raise ConfigError(f"activations must be 'auto', 'q8' or 'float', not {activations!r}")
        float_act = activations == "float" or (activations == "auto" and cfg.arch == "gemma3")
        D, V = cfg.d_model, cfg.n_vocab
        r = _Reader(gf, requant, prepared, record)
        layers = tuple(_qwen35_layer(r, cfg, f"blk.{i}.", cfg.recurrent[i], float_act) if cfg.is_hybrid
                       else _layer(r, cfg, f"blk.{i}.", float_act) for i in range(cfg.n_layer))
        emb = r.lin("token_embd.weight", D, V, table=True)             # also read by row lookup
        if "output.weight" in gf.tensors:
            output = r.lin("output.weight", D, V, head=True)
        elif requant is not None and narrows(gf.tensors["token_embd.weight"].ggml_type, requant.head):
            output = r.lin("token_embd.weight", D, V, table=True, head=True)  # its own copy
        else:
            output = emb
        out_norm = r.vec("output_norm.weight", D)
        rope_freqs = r.opt_vec("rope_freqs.weight", cfg.rope_dim // 2) if cfg.arch == "llama" else None
        mtp = _mtp_head(r, cfg, emb, output, out_norm, float_act) if cfg.n_nextn else None
        _refuse_unread(gf, r.seen)
        return cls(emb.w, emb.qtype, layers, out_norm, output, rope_freqs, mtp)


class _Reader:
    """Reads the file's tensors as the forward pass needs them, checking each one's shape and
    type, and remembers every name read (`seen`: the rest is refused by name)."""

    def __init__(self, gf: GGUFFile, requant: Requant | None, prepared: Prepared | None,
                 record: Prepared | None):
        self.gf, self.requant, self.prepared, self.record = gf, requant, prepared, record
        self.seen: set[str] = set()

    def vec(self, name: str, n: int) -> np.ndarray:                     # (n,) float32
        return self.f32(name, (n,))

    def opt_vec(self, name: str, n: int) -> np.ndarray | None:
        return self.vec(name, n) if name in self.gf.tensors else None

    def f32(self, name: str, dims: tuple[int, ...]) -> np.ndarray:     # dims reversed, row-major
        self.seen.add(name)
        t = _info(self.gf, name, dims)
        if t.ggml_type != GGMLQuantizationType.F32:
            raise UnsupportedModelError(f"{self.gf.path}: tensor {name!r} is {t.type_name}, expected F32")
        return self.gf.tensor(name).reshape(dims[::-1])

    def lin(self, name: str, n_in: int, n_out: int, bias: bool = False, float_act: bool = False,
            table: bool = False, head: bool = False) -> Linear:
        """A matmul weight (n_in) -> (n_out): an earlier load's prepared array, else the
        file's rows as _prepare lays them out (recorded for the next load)."""
        gf, prepared, record = self.gf, self.prepared, self.record
        self.seen.add(name)
        t = _info(gf, name, (n_in, n_out))
        if t.ggml_type not in SUPPORTED_TYPES:
            raise UnsupportedModelError(f"{gf.path}: tensor {name!r} has unsupported type {t.type_name}")
        b = self.opt_vec(name.replace(".weight", ".bias"), n_out) if bias else None
        key = name + ("#head" if table and head else "")     # a head of its own beside the table
        if prepared is not None and key in prepared.extra:
            qtype, w = prepared.extra[key]
            if key == name:
                gf.release(name)                            # the file's bytes are not read again
            return Linear(name, w, qtype, n_in, n_out, b, float_act)
        if prepared is not None and prepared.image is not None and name in prepared.rewritten:
            return Linear(name, gf.tensor(name), prepared.rewritten[name], n_in, n_out, b, float_act)
        w, qtype = _prepare(gf, name, t.ggml_type, n_in, n_out, self.requant, float_act, table, head)
        if qtype != t.ggml_type:
            if np.shares_memory(w, gf.tensor(name)):
                if record is not None:
                    record.rewritten[name] = qtype
            else:
                if record is not None:
                    record.extra[key] = (qtype, w)
                if key == name:
                    gf.release(name)
        return Linear(name, w, qtype, n_in, n_out, b, float_act)


def _layer(r: _Reader, cfg: ModelConfig, p: str, float_act: bool) -> Layer:
    """A transformer block ('blk.<i>.'): attention (separate or fused q/k/v), then a dense
    FFN (gate and up, or phi3's fused gate|up) or experts, with each architecture's norms."""
    D, H, Hkv, Dh, F = cfg.d_model, cfg.n_head, cfg.n_head_kv, cfg.d_head, cfg.d_ff
    gemma, qk_norm = cfg.arch == "gemma3", cfg.arch in ("gemma3", "qwen3", "qwen3moe")
    moe = load_moe(r.gf, cfg, p, r.lin, r.seen, float_act) if cfg.is_moe else None
    dense = moe is None
    fused_qkv, fused_ffn = p + "attn_qkv.weight" in r.gf.tensors, cfg.arch == "phi3"
    biases = cfg.arch in ("llama", "mistral3")   # optional wo / ffn biases (llama.cpp's llama)

    def mm(name, n_in, n_out, bias=biases):
        return r.lin(p + name + ".weight", n_in, n_out, bias=bias, float_act=float_act)
    qkv = ((None,) * 3 if fused_qkv else
           tuple(mm(f"attn_{n}", D, size, bias=True) for n, size in (("q", H * Dh), ("k", Hkv * Dh),
                                                                       ("v", Hkv * Dh))))
    return Layer(
        attn_norm=r.vec(p + "attn_norm.weight", D),
        wq=qkv[0], wk=qkv[1], wv=qkv[2],
        wo=mm("attn_output", H * Dh, D),
        ffn_norm=r.vec(p + "ffn_norm.weight", D),
        w_gate=mm("ffn_gate", D, F) if dense and not fused_ffn else None,
        w_up=mm("ffn_up", D, 2 * F if fused_ffn else F) if dense else None,
        w_down=mm("ffn_down", F, D) if dense else None,
        q_norm=r.vec(p + "attn_q_norm.weight", Dh) if qk_norm else None,
        k_norm=r.vec(p + "attn_k_norm.weight", Dh) if qk_norm else None,
        post_attn_norm=r.vec(p + "post_attention_norm.weight", D) if gemma else None,
        post_ffn_norm=r.vec(p + "post_ffw_norm.weight", D) if gemma else None,
        wqkv=mm("attn_qkv", D, (H + 2 * Hkv) * Dh, bias=True) if fused_qkv else None,
        moe=moe,
    )


def _mtp_head(r: _Reader, cfg: ModelConfig, emb: Linear, output: Linear, out_norm: np.ndarray,
              float_act: bool) -> MTPHead:
    """qwen35's nextn block ('blk.<n_layer>.nextn.*', engine/qwen35.py): its own embedding
    table, head norm and head where the file has them, else the target's."""
    D, V, p = cfg.d_model, cfg.n_vocab, f"blk.{cfg.n_layer}."
    has = r.gf.tensors.__contains__
    table = r.lin(p + "nextn.embed_tokens.weight", D, V, table=True) if has(p + "nextn.embed_tokens.weight") \
        else emb
    return MTPHead(eh_proj=r.lin(p + "nextn.eh_proj.weight", 2 * D, D, float_act=float_act),
                   enorm=r.vec(p + "nextn.enorm.weight", D), hnorm=r.vec(p + "nextn.hnorm.weight", D),
                   layer=_qwen35_layer(r, cfg, p, False, float_act),
                   head_norm=r.vec(p + "nextn.shared_head_norm.weight", D)
                   if has(p + "nextn.shared_head_norm.weight") else out_norm,
                   head=r.lin(p + "nextn.shared_head_head.weight", D, V, head=True)
                   if has(p + "nextn.shared_head_head.weight") else output,
                   embed=table.w, embed_type=table.qtype)


def _qwen35_layer(r: _Reader, cfg: ModelConfig, p: str, recurrent: bool, float_act: bool) -> Layer:
    """A qwen35 block (engine/qwen35.py): a Gated DeltaNet layer or gated attention (attn_q
    of 2 H Dh rows: each head's query, then its gate; q/k norms), then post_attention_norm
    (kept as ffn_norm: the FFN's input norm) and a SwiGLU FFN, or (qwen35moe) the experts and
    a shared expert gated by sigmoid(h·ffn_gate_inp_shexp)."""
    D, H, Hkv, Dh, F = cfg.d_model, cfg.n_head, cfg.n_head_kv, cfg.d_head, cfg.d_ff

    def mm(name, n_in, n_out):
        return r.lin(p + name + ".weight", n_in, n_out, float_act=float_act)
    attn, vec = not recurrent, r.vec
    moe, shared = None, None
    if cfg.is_moe:
        moe = load_moe(r.gf, cfg, p, r.lin, r.seen, float_act)
        Fs = cfg.d_ff_shexp
        gate_inp = vec(p + "ffn_gate_inp_shexp.weight", D)                   # (D,): one logit per row
        shared = SharedExpert(gate=mm("ffn_gate_shexp", D, Fs), up=mm("ffn_up_shexp", D, Fs),
                              down=mm("ffn_down_shexp", Fs, D),
                              gate_inp=Linear(p + "ffn_gate_inp_shexp.weight", gate_inp.reshape(1, D), 0, D, 1))
    return Layer(
        attn_norm=vec(p + "attn_norm.weight", D),
        wq=mm("attn_q", D, 2 * H * Dh) if attn else None,
        wk=mm("attn_k", D, Hkv * Dh) if attn else None,
        wv=mm("attn_v", D, Hkv * Dh) if attn else None,
        wo=mm("attn_output", H * Dh, D) if attn else None,
        ffn_norm=vec(p + "post_attention_norm.weight", D),
        w_gate=None if moe else mm("ffn_gate", D, F), w_up=None if moe else mm("ffn_up", D, F),
        w_down=None if moe else mm("ffn_down", F, D), moe=moe, shared=shared,
        q_norm=vec(p + "attn_q_norm.weight", Dh) if attn else None,
        k_norm=vec(p + "attn_k_norm.weight", Dh) if attn else None,
        deltanet=load_deltanet(r.gf, shape_of(cfg), D, p, lambda n, k, m: r.lin(n, k, m, float_act=float_act),
                               vec, r.f32) if recurrent else None)


def _prepare(gf: GGUFFile, name: str, stored: int, n_in: int, n_out: int, requant: Requant | None,
             float_act: bool, table: bool, head: bool):
    """(w, type id) of a matmul weight as the kernels read it: requantized into a new array,
    in its registry layout where the file is in memory, or the stored view as it is."""
    w, qtype = gf.tensor(name), stored
    dst = None if requant is None or (table and not head) else requant.target_for(name)
    if narrows(qtype, dst) and n_in % 32 == 0:     # (Q4_0 / Q5_0 / Q8_0 blocks of 32)
        # a new array in process memory: laid out below like an in-memory file's
        w, qtype = convert(w, qtype, dst, n_in), dst
        if not float_act and registry.layout_for(qtype, n_out) is not None:
            w, qtype = registry.prepare(w, qtype)
    elif (gf.in_memory and not float_act and (new := registry.layout_for(qtype, n_out)) is not None
          and not (table and narrows(qtype, requant and requant.head))):
        # weights in process memory: K-quants of 16k rows into new arrays of 16-row
        # interleaved records; legacy quants rewritten in place into 8-row records; a table
        # too unless a requantized head is to be made from its stored bytes
        if KERNELS[new].in_place and KERNELS[new].qtype == stored:      # (IQ4_NL as Q8_0: a new array)
            w, qtype = gf.rewrite(name, lambda v: registry.prepare(v, stored)[0]), new
        else:
            w, qtype = registry.prepare(w, stored)
    return w, qtype


def _refuse_unread(gf: GGUFFile, seen: set[str]) -> None:
    """A tensor the engine does not read changes the computation in a way it does not
    implement (a bias, a norm, rope factors of another architecture, experts): refused, by
    name, rather than silently left out."""
    unread = sorted(set(gf.tensors) - seen)
    if unread:
        more = f" (and {len(unread) - 1} more)" if len(unread) > 1 else ""
        raise UnsupportedModelError(f"{gf.path}: tensor {unread[0]!r}{more} is not used by specdec's "
                                    f"{gf.get('general.architecture')} forward pass")


def _info(gf: GGUFFile, name: str, dims: tuple[int, ...]):
    t = gf.tensors.get(name)
    if t is None:
        raise GGUFError(f"{gf.path}: missing tensor {name!r}")
    if t.dims != dims:
        raise GGUFError(f"{gf.path}: tensor {name!r} has shape {list(t.dims)}, expected {list(dims)}")
    return t
