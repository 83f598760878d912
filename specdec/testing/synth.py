"""Tiny synthetic GGUF models for tests, written with gguf.GGUFWriter.

Random weights, real file format, real tokenizer metadata: every test that uses one runs the
same reader, kernels and forward as a real model does.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import gguf
import numpy as np
from gguf import GGMLQuantizationType as T


@dataclass(frozen=True)
class TinySpec:
    arch: str = "llama"          # llama | qwen2 | qwen3 | phi3 | smollm3 | gemma3 | qwen3moe
    n_vocab: int = 48
    d_model: int = 64
    n_layer: int = 2
    n_head: int = 4
    n_head_kv: int = 2
    d_ff: int = 96
    qtype: int = int(T.F32)      # type of the 2-D weights (F32, F16, Q8_0, Q4_0, ... )
    seed: int = 0
    tied: bool = False
    logit_scale: float = 1.0     # sharpens (>1) or flattens (<1) the output distribution
    n_ctx: int = 512
    sliding_window: int = 0      # gemma3 only
    chat_template: str | None = None   # tokenizer.chat_template (Jinja2), none by default
    tokens: tuple[str, ...] = ()       # a byte-level BPE vocabulary of n_vocab texts (default: _tokens)
    token_types: tuple[int, ...] = ()  # their tokenizer.ggml.token_type (default: all 1, normal)
    merges: tuple[str, ...] = ()       # its tokenizer.ggml.merges, "a b" in rank order
    rope_freqs: bool = False           # llama: a Llama-3.1-style rope_freqs.weight (frequency divisors)
    rope_scale_linear: float = 0.0     # rope.scaling.type linear with this factor (0: none)
    extra_metadata: tuple = ()         # (key, value) pairs written as they are (int, float or str)
    extra_tensors: tuple = ()          # names of extra float32 vectors of d_model values
    n_expert: int = 0                  # llama / qwen3moe: experts per layer in place of the FFN
    n_expert_used: int = 2             # ... of which each token uses this many
    d_ff_exp: int = 0                  # qwen3moe: expert_feed_forward_length (0: d_ff)
    expert_qtype: int = -1             # the experts' type (-1: qtype); the router is F32
    d_head: int = 0                    # key_length / value_length (0: d_model / n_head, not written)
    centered: bool = False             # Q4_K / Q5_K codes of zero-mean values (each group's min = its
                                       # scale x the codes' mean): no direction shared by every row


def _tokens(n_vocab: int) -> list[str]:
    """Printable single-character tokens (byte-level BPE alphabet subset), then multi-char."""
    alphabet = [chr(c) for c in range(ord("a"), ord("z") + 1)] + [chr(c) for c in range(ord("A"), ord("Z") + 1)]
    toks = alphabet[:n_vocab]
    i = 0
    while len(toks) < n_vocab:
        if i < 26 * 26:                                   # two letters, then longer: all distinct
            toks.append(alphabet[i % 26] + alphabet[(i // 26) % 26])
        else:
            k, word = i - 26 * 26, ""
            while True:
                word, k = word + alphabet[k % 26], k // 26
                if k == 0:
                    break
            toks.append("~" + word)
        i += 1
    return toks


def tokenizer_metadata(spec: TinySpec = TinySpec()) -> dict:
    """The tokenizer.* metadata write_tiny_model writes for spec (for Tokenizer.from_metadata
    without a file): a 'gpt2' vocabulary, BOS 0 (not added), EOS n_vocab - 1."""
    toks = list(spec.tokens) or _tokens(spec.n_vocab)
    if len(toks) != spec.n_vocab:
        raise ValueError(f"TinySpec: {len(toks)} tokens for n_vocab {spec.n_vocab}")
    meta = {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "default",
            "tokenizer.ggml.tokens": toks,
            "tokenizer.ggml.token_type": list(spec.token_types) or [1] * spec.n_vocab,
            "tokenizer.ggml.merges": list(spec.merges),
            "tokenizer.ggml.bos_token_id": 0, "tokenizer.ggml.eos_token_id": spec.n_vocab - 1,
            "tokenizer.ggml.add_bos_token": False}
    if spec.chat_template is not None:
        meta["tokenizer.chat_template"] = spec.chat_template
    return meta


# byte offsets of the fp16 super-block scales (d, and dmin where there is one) per K-quant,
# which gguf.quants cannot quantize to: random blocks are drawn and these scales set instead.
_KQUANT_SCALES = {T.Q2_K: (80, 82), T.Q3_K: (108,), T.Q4_K: (0, 2), T.Q5_K: (0, 2), T.Q6_K: (208,)}


def _random_kquant(rng, n_out: int, n_in: int, qt: T, std: float, centered: bool = False) -> np.ndarray:
    """Random K-quant rows (n_out, row_bytes) whose dequantized values have about `std`;
    centered (Q4_K, Q5_K): each group's min equals its scale (get_scale_min_k4: bytes 4-7
    copy 0-3, bytes 8-11 two equal nibbles) and dmin = d x the codes' mean, so that a value
    d sc (q - mean) averages zero."""
    block, size = gguf.GGML_QUANT_SIZES[qt]
    raw = rng.integers(0, 256, (n_out * n_in // block, size), dtype=np.uint8)   # (blocks, size)
    offsets = _KQUANT_SCALES[qt]
    centered = centered and qt in (T.Q4_K, T.Q5_K)
    if centered:
        raw[:, 8:12] = raw[:, 4:8]                                    # (scale bytes start at 4)
        raw[:, 12:16] = (raw[:, 12:16] & 15) * 17
    val = 1e-3                                  # try 1e-3, then rescale to the std wanted
    for _ in range(2):
        for off in offsets:
            v = val * (7.5 if qt == T.Q4_K else 15.5) if centered and off == 2 else val
            raw[:, off:off + 2] = np.frombuffer(np.float16(v).tobytes(), np.uint8)
        rows = raw.reshape(n_out, -1)
        got = gguf.quants.dequantize(rows[:4096], qt).std()      # (a sample of a large tensor)
        val = np.float16(1e-3 * std / got)
    return raw.reshape(n_out, -1)


_KV_IQ4NL = np.array([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113], np.float32)


def _nearest(x: np.ndarray, scale: np.ndarray) -> np.ndarray:
    """The codes u (uint8) whose table values times scale are nearest x (scale 0: code of 1)."""
    safe = np.where(scale == 0, np.float32(1), scale)
    return np.abs(x[..., None] / safe[..., None] - _KV_IQ4NL).argmin(axis=-1).astype(np.uint8)


def _nibbles(u: np.ndarray) -> np.ndarray:
    """codes (..., 32) -> bytes (..., 16): value j in the low nibble, j + 16 in the high one."""
    return (u[..., :16] | (u[..., 16:] << 4)).astype(np.uint8)


def quantize_iq4(x: np.ndarray, qt: T, chunk: int = 1024) -> np.ndarray:
    """float32 (N, K) -> IQ4_NL or IQ4_XS rows (gguf.quants has no quantizer for them): each
    group of 32 scaled so that its value of largest |x| meets the table's end (-127), the
    codes nearest; IQ4_XS's group scales as 6-bit multiples of one fp16 d per 256 values.
    `chunk` rows at a time (the nearest-code search holds 16 floats per value)."""
    if x.shape[0] > chunk:
        return np.concatenate([quantize_iq4(x[i:i + chunk], qt, chunk) for i in range(0, x.shape[0], chunk)])
    n, k = x.shape
    g = x.reshape(n, -1, 32)                                               # (N, G, 32)
    big = np.take_along_axis(g, np.abs(g).argmax(axis=-1)[..., None], -1)[..., 0]
    s = (big / -127.0).astype(np.float32)                                  # (N, G) the group scales
    if qt == T.IQ4_NL:
        d = s.astype(np.float16)
        u = _nearest(g, d.astype(np.float32)[..., None])
        return np.concatenate([d[..., None].view(np.uint8), _nibbles(u)], axis=-1).reshape(n, -1)
    s8 = s.reshape(n, -1, 8)                                               # (N, nb, 8)
    top = np.take_along_axis(s8, np.abs(s8).argmax(axis=-1)[..., None], -1)[..., 0]
    d = (top / -32.0).astype(np.float16)                                   # (N, nb)
    df = d.astype(np.float32)[..., None]
    ls = np.clip(np.round(s8 / np.where(df == 0, 1, df)) + 32, 0, 63).astype(np.int32)
    u = _nearest(g.reshape(n, -1, 8, 32), (df * (ls - 32))[..., None].astype(np.float32))
    h = (((ls >> 4) & 3) << (2 * np.arange(8))).sum(axis=-1).astype(np.uint16)         # (N, nb)
    lo = (ls & 15).astype(np.uint8)
    out = np.concatenate([d[..., None].view(np.uint8), h[..., None].view(np.uint8),
                          (lo[..., 0::2] | (lo[..., 1::2] << 4)).astype(np.uint8),
                          _nibbles(u).reshape(n, -1, 128)], axis=-1)       # (N, nb, 136)
    return out.reshape(n, -1)


def llama3_rope_factors(d_head: int, factor: float = 8.0, low: float = 1.0, high: float = 4.0,
                        n_ctx_orig: int = 8192, base: float = 10000.0) -> np.ndarray:
    """(d_head/2,) float32 rope_freqs as the GGUF converter computes them for Llama 3.1
    (convert_hf_to_gguf.py, LlamaModel.generate_extra_tensors): 1 for high frequencies,
    `factor` for wavelengths beyond n_ctx_orig / low, smoothly in between.  The defaults
    make a tiny model's rotations differ from unscaled RoPE in most dimensions."""
    freqs = base ** (-np.arange(0, d_head, 2, dtype=np.float64) / d_head)
    wavelen = 2 * np.pi / freqs
    lo_wl, hi_wl = n_ctx_orig / low, n_ctx_orig / high
    smooth = (n_ctx_orig / wavelen - low) / (high - low)
    out = np.where(wavelen < hi_wl, 1.0, np.where(wavelen > lo_wl, factor, 1 / ((1 - smooth) / factor + smooth)))
    return out.astype(np.float32)


def tensor_writers(w: gguf.GGUFWriter, rng: np.random.Generator, file_qtype: int, centered: bool = False,
                   draw_all: bool = True):
    """-> (mat, vec): the writers of random tensors into w, drawing from rng in call order.

    mat(name, n_out, n_in, std, qtype=None, n_stack=0): (N, K) weights of qtype (default: the
    file's), or n_stack of them as one (E, N, K) tensor; the K-quants as random codes and
    scales (_random_kquant), the rest drawn from N(0, std²) and quantized.  vec(name, n,
    around=1.0, std=0.1): a float32 vector.  draw_all: a single K-quant matrix first draws the
    float values it does not use, as the files recorded in tests/data/reference were written
    (their SHA-256 hold the writer to it); qwen35's files do not."""
    def mat(name, n_out, n_in, std, qtype=None, n_stack=0):
        lead = (n_stack,) if n_stack else ()
        qt = T(file_qtype if qtype is None else qtype)
        kquant = qt in _KQUANT_SCALES                   # random codes: no values to draw (but see draw_all)
        if not kquant or (draw_all and not n_stack):
            x = (rng.standard_normal((*lead, n_out, n_in)) * std).astype(np.float32)   # ([E,] N, K)
        if qt in (T.F32, T.F16):
            w.add_tensor(name, x if qt == T.F32 else x.astype(np.float16))
            return
        if kquant:
            raw = _random_kquant(rng, max(n_stack, 1) * n_out, n_in, qt, std, centered).reshape(*lead, n_out, -1)
        elif qt in (T.IQ4_NL, T.IQ4_XS):
            raw = quantize_iq4(x.reshape(-1, n_in), qt).reshape(*lead, n_out, -1)
        else:
            raw = gguf.quants.quantize(x, qt)
        w.add_tensor(name, raw, raw_shape=raw.shape, raw_dtype=qt)

    def vec(name, n, around=1.0, std=0.1):
        w.add_tensor(name, (around + rng.standard_normal(n) * std).astype(np.float32))
    return mat, vec


def write_tiny_model(path: str | Path, spec: TinySpec = TinySpec()) -> Path:
    """Write a random-weight model to `path` and return it."""
    rng = np.random.default_rng(spec.seed)
    path = Path(path)
    D, H, Hkv, F, V = spec.d_model, spec.n_head, spec.n_head_kv, spec.d_ff, spec.n_vocab
    Dh = spec.d_head or D // H
    w = gguf.GGUFWriter(str(path), spec.arch)
    a = spec.arch
    w.add_block_count(spec.n_layer)
    w.add_context_length(spec.n_ctx)
    w.add_embedding_length(D)
    w.add_feed_forward_length(F)
    w.add_head_count(H)
    w.add_head_count_kv(Hkv)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_freq_base(10000.0)
    moe = spec.n_expert > 0 or a == "qwen3moe"
    F_exp = spec.d_ff_exp or F
    if moe:
        w.add_expert_count(spec.n_expert)
        w.add_expert_used_count(spec.n_expert_used)
        if a == "qwen3moe":
            w.add_expert_feed_forward_length(F_exp)
    if spec.d_head and a != "gemma3":
        w.add_key_length(Dh)
        w.add_value_length(Dh)
    if a == "gemma3":
        w.add_key_length(Dh)
        w.add_value_length(Dh)
        w.add_sliding_window(spec.sliding_window or 4)
    meta = tokenizer_metadata(spec)
    add_tokenizer(w, meta, V, spec.chat_template)

    mat, vec = tensor_writers(w, rng, spec.qtype, spec.centered)

    mat("token_embd.weight", V, D, 1.0)
    if not spec.tied:
        mat("output.weight", V, D, spec.logit_scale / np.sqrt(D))
    vec("output_norm.weight", D)
    for i in range(spec.n_layer):
        p = f"blk.{i}."
        vec(p + "attn_norm.weight", D)
        if a == "phi3":                               # fused q | k | v and gate | up
            mat(p + "attn_qkv.weight", (H + 2 * Hkv) * Dh, D, 1 / np.sqrt(D))
        else:
            mat(p + "attn_q.weight", H * Dh, D, 1 / np.sqrt(D))
            mat(p + "attn_k.weight", Hkv * Dh, D, 1 / np.sqrt(D))
            mat(p + "attn_v.weight", Hkv * Dh, D, 1 / np.sqrt(D))
        if a == "qwen2":
            for n, size in (("q", H * Dh), ("k", Hkv * Dh), ("v", Hkv * Dh)):
                vec(p + f"attn_{n}.bias", size, around=0.0, std=0.1)
        mat(p + "attn_output.weight", D, H * Dh, 1 / np.sqrt(H * Dh))
        vec(p + "ffn_norm.weight", D)
        if moe:                                       # router (F32 as in real files) and experts
            E, qe = spec.n_expert, spec.qtype if spec.expert_qtype < 0 else spec.expert_qtype
            mat(p + "ffn_gate_inp.weight", E, D, 1 / np.sqrt(D), qtype=T.F32)
            mat(p + "ffn_gate_exps.weight", F_exp, D, 1 / np.sqrt(D), qtype=qe, n_stack=E)
            mat(p + "ffn_up_exps.weight", F_exp, D, 1 / np.sqrt(D), qtype=qe, n_stack=E)
            mat(p + "ffn_down_exps.weight", D, F_exp, 1 / np.sqrt(F_exp), qtype=qe, n_stack=E)
        elif a == "phi3":
            mat(p + "ffn_up.weight", 2 * F, D, 1 / np.sqrt(D))
        else:
            mat(p + "ffn_gate.weight", F, D, 1 / np.sqrt(D))
            mat(p + "ffn_up.weight", F, D, 1 / np.sqrt(D))
        if not moe:
            mat(p + "ffn_down.weight", D, F, 1 / np.sqrt(F))
        if a in ("qwen3", "qwen3moe"):
            vec(p + "attn_q_norm.weight", Dh)
            vec(p + "attn_k_norm.weight", Dh)
        if a == "gemma3":
            vec(p + "attn_q_norm.weight", Dh)
            vec(p + "attn_k_norm.weight", Dh)
            vec(p + "post_attention_norm.weight", D)
            vec(p + "post_ffw_norm.weight", D)
    if spec.rope_freqs:
        w.add_tensor("rope_freqs.weight", llama3_rope_factors(Dh, n_ctx_orig=64))
    if spec.rope_scale_linear:
        w.add_string(f"{a}.rope.scaling.type", "linear")
        w.add_float32(f"{a}.rope.scaling.factor", spec.rope_scale_linear)
    for key, value in spec.extra_metadata:
        {int: w.add_uint32, float: w.add_float32, str: w.add_string}[type(value)](key, value)
    for name in spec.extra_tensors:
        vec(name, D)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def add_tokenizer(w: gguf.GGUFWriter, meta: dict, n_vocab: int, chat_template: str | None) -> None:
    """The tokenizer's keys (tokenizer_metadata's), bos 0 and eos the last id, no added bos."""
    w.add_tokenizer_model(meta["tokenizer.ggml.model"])
    w.add_tokenizer_pre(meta["tokenizer.ggml.pre"])
    w.add_token_list(meta["tokenizer.ggml.tokens"])
    w.add_token_types(meta["tokenizer.ggml.token_type"])
    w.add_token_merges(meta["tokenizer.ggml.merges"])
    w.add_bos_token_id(0)
    w.add_eos_token_id(n_vocab - 1)
    w.add_add_bos_token(False)
    if chat_template is not None:
        w.add_chat_template(chat_template)
