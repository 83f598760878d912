"""qwen3, phi3 and smollm3 (and llama, qwen2) against a float64 restatement of llama.cpp's
graphs (src/models/<arch>.cpp in the llama.cpp that llama-cpp-python 0.3.36 vendors), on
random-weight files written by specdec.testing.synth:

    every arch: x = token_embd[ids]; per layer h = rms(x)·attn_norm; q, k, v = h·Wq, h·Wk, h·Wv
      (phi3: one attn_qkv, split q | k | v; qwen2: + biases); qwen3: q, k rms-normed per head
      (attn_q_norm, attn_k_norm) before RoPE; RoPE NORM (llama, smollm3) or NEOX (qwen2,
      qwen3, phi3), none on smollm3's layers il with (il + 1) % 4 == 0;
      causal softmax(q·k / sqrt(head size))·v;  x += attn·Wo;
      h' = rms(x)·ffn_norm;  x += (silu(g) * u)·Wd with g, u = h'·Wg, h'·Wu (phi3: one ffn_up
      whose first half is g, ggml_swiglu); with experts (qwen3moe, llama/Mixtral; llama.cpp's
      build_moe_ffn, softmax gating) p = softmax(h'·Wrouter), the top k, their p renormalised
      to sum 1, x += sum_j p_j (silu(g_j) * u_j)·Wd_j over the k experts (test_moe.py);
    logits = rms(x)·output_norm · outputᵀ (token_embd when tied).
Each rule is also shown to matter: the reference with it broken is far from ours.
"""
from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T
from gguf.quants import dequantize
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from specdec.engine.config import ROPE_NEOX
from specdec.engine.gguf_file import GGUFFile
from specdec.kernels import reference
from specdec.testing import assert_greedy_identical
from synth import TinySpec

TOKENS = [3, 17, 4, 40, 22, 9, 9, 31, 0, 45, 12, 7, 30, 2]
NEW = ("qwen3", "phi3", "smollm3")


def reference_forward(gf, cfg, tokens, *, rope_every_layer=False, swap_ffn=False, qk_norm=True,
                      moe_norm=None, moe_k=None, softmax_after_topk=False):
    """float64 llama.cpp graph of cfg.arch (module docstring). -> (M, V)"""
    def t(name):                                                  # float64, dequantized
        raw, qt = gf.tensor(name), gf.tensors[name].ggml_type
        return (raw if qt in (T.F32, T.F16) else dequantize(raw, qt)).astype(np.float64)
    has = lambda name: name in gf.tensors                        # noqa: E731
    eps, H, Hkv, Dh = cfg.norm_eps, cfg.n_head, cfg.n_head_kv, cfg.d_head
    M = len(tokens)
    p = np.arange(M)

    def rms(x, w):
        return reference.rms_norm(x, w, eps)

    def rope(x):
        return reference.rope(x, p, cfg.rope_base, neox=cfg.rope_type == ROPE_NEOX)

    def lin(h, name):
        y = h @ t(name + ".weight").T
        return y + t(name + ".bias") if has(name + ".bias") else y

    x = t("token_embd.weight")[tokens]
    for il in range(cfg.n_layer):
        b = f"blk.{il}."
        h = rms(x, t(b + "attn_norm.weight"))
        if has(b + "attn_qkv.weight"):
            q, k, v = np.split(lin(h, b + "attn_qkv"), np.cumsum([H * Dh, Hkv * Dh]), axis=1)
        else:
            q, k, v = lin(h, b + "attn_q"), lin(h, b + "attn_k"), lin(h, b + "attn_v")
        q, k, v = q.reshape(M, H, Dh), k.reshape(M, Hkv, Dh), v.reshape(M, Hkv, Dh)
        if qk_norm and has(b + "attn_q_norm.weight"):
            q, k = rms(q, t(b + "attn_q_norm.weight")), rms(k, t(b + "attn_k_norm.weight"))
        if rope_every_layer or cfg.arch != "smollm3" or (il + 1) % 4:
            q, k = rope(q), rope(k)
        att = np.empty((M, H, Dh))
        for hh in range(H):
            kv = hh // (H // Hkv)
            s = np.where(p[None, :] <= p[:, None], q[:, hh] @ k[:, kv].T / math.sqrt(Dh), -np.inf)
            e = np.exp(s - s.max(-1, keepdims=True))
            att[:, hh] = (e / e.sum(-1, keepdims=True)) @ v[:, kv]
        x = x + lin(att.reshape(M, H * Dh), b + "attn_output")
        h = rms(x, t(b + "ffn_norm.weight"))
        if has(b + "ffn_gate_inp.weight"):
            norm = cfg.expert_norm if moe_norm is None else moe_norm
            x = x + _moe(t, b, cfg, h, moe_k or cfg.n_expert_used, norm, softmax_after_topk)
            continue
        if has(b + "ffn_gate.weight"):
            g, u = lin(h, b + "ffn_gate"), lin(h, b + "ffn_up")
        else:
            g, u = np.split(lin(h, b + "ffn_up"), 2, axis=1)
            if swap_ffn:
                g, u = u, g
        x = x + lin(reference.swiglu(g, u), b + "ffn_down")
    out = t("output.weight") if has("output.weight") else t("token_embd.weight")
    return rms(x, t("output_norm.weight")) @ out.T


def _moe(t, b, cfg, h, k, norm, softmax_after_topk):
    """float64 build_moe_ffn (softmax gating) of layer b on h (M, D) -> (M, D)."""
    E = cfg.n_expert
    stack = {n: t(b + f"ffn_{n}_exps.weight").reshape(E, -1, t(b + f"ffn_{n}_exps.weight").shape[-1])
             for n in ("gate", "up", "down")}                     # (E, N, K) each
    logits = h @ t(b + "ffn_gate_inp.weight").T                   # (M, E)
    out = np.zeros_like(h)
    for m in range(len(h)):
        if softmax_after_topk:                                    # top-k logits, then softmax
            sel = np.argsort(-logits[m], kind="stable")[:k]
            w = np.exp(logits[m, sel] - logits[m, sel].max())
            w = w / w.sum()
        else:
            p = np.exp(logits[m] - logits[m].max())
            p = p / p.sum()
            sel = np.argsort(-p, kind="stable")[:k]
            w = p[sel] / p[sel].sum() if norm else p[sel]
        for e, we in zip(sel, w):
            g, u = stack["gate"][e] @ h[m], stack["up"][e] @ h[m]
            out[m] += we * (stack["down"][e] @ (g / (1 + np.exp(-g)) * u))
    return out * (cfg.expert_scale if cfg.expert_scale != 1.0 else 1.0)


def _close(a, b) -> bool:
    return np.abs(a - b).max() <= 1e-4 * max(1.0, np.abs(b).max())


def _spec(arch: str, **kw) -> TinySpec:
    return TinySpec(arch=arch, n_layer=4 if arch == "smollm3" else 2, **kw)


@pytest.mark.parametrize("arch", ("llama", "qwen2", "mistral3") + NEW)
def test_forward_follows_llamacpp_graph(tiny_model, arch):
    m = tiny_model(_spec(arch, seed=3))
    ours = m.session(64).eval(TOKENS).astype(np.float64)
    assert _close(ours, reference_forward(m.gguf, m.config, TOKENS))


def test_llama_biases_are_read(tiny_model):
    """llama / mistral3 files may carry attn_output and ffn biases (llama.cpp loads them)."""
    names = ("blk.0.attn_output.bias", "blk.1.ffn_down.bias")
    m = tiny_model(_spec("llama", seed=3, extra_tensors=names))
    ours = m.session(64).eval(TOKENS).astype(np.float64)
    assert _close(ours, reference_forward(m.gguf, m.config, TOKENS))
    assert m.weights.layers[0].wo.bias is not None


def test_each_new_rule_matters(tiny_model):
    """Broken on purpose, the reference is far from ours: the rules are really exercised."""
    for arch, broken in (("smollm3", dict(rope_every_layer=True)), ("phi3", dict(swap_ffn=True)),
                         ("qwen3", dict(qk_norm=False))):
        m = tiny_model(_spec(arch, seed=3))
        ours = m.session(64).eval(TOKENS).astype(np.float64)
        assert not _close(ours, reference_forward(m.gguf, m.config, TOKENS, **broken)), arch


def test_config_facts(tiny_model):
    c = {a: tiny_model(_spec(a, seed=3)).config for a in NEW}
    assert c["qwen3"].rope_type == ROPE_NEOX and c["phi3"].rope_type == ROPE_NEOX
    assert c["smollm3"].rope_type != ROPE_NEOX and c["smollm3"].no_rope_period == 4
    assert [c["smollm3"].uses_rope(i) for i in range(8)] == [True, True, True, False] * 2
    phi = tiny_model(_spec("phi3", seed=3)).weights.layers[0]
    assert phi.wqkv is not None and phi.wq is None and phi.w_gate is None


@pytest.mark.parametrize("arch", NEW)
@pytest.mark.parametrize("qtype", [T.Q8_0, T.Q4_K])
def test_quantized_files_run_every_pass_kind(tiny_model, arch, qtype):
    """Quantized weights (q8 activations): a batch of rows equals the rows one by one
    (row independence), and the quantized logits stay near the F32 file's."""
    spec = _spec(arch, seed=4, qtype=int(qtype), d_model=256 if qtype == T.Q4_K else 64,
                 d_ff=256 if qtype == T.Q4_K else 96)
    m = tiny_model(spec)
    batch = m.session(64).eval(TOKENS)
    s = m.session(64)
    one = np.concatenate([s.eval([tok]) for tok in TOKENS])
    assert np.array_equal(batch, one)
    # on the dequantized weights, read afresh (a loaded model may have repacked its copy)
    ref = reference_forward(GGUFFile(m.gguf.path, mmap=True), m.config, TOKENS)
    assert np.abs(batch - ref).max() < 0.25 * max(1.0, np.abs(ref).max())


@pytest.mark.parametrize("arch", NEW)
@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(prompt=st.lists(st.integers(1, 46), min_size=1, max_size=10), draft_n=st.integers(1, 6))
def test_greedy_speculative_equals_plain(tiny_model, arch, prompt, draft_n):
    """Linear drafts and token trees (K = 3): batch, tree and one-row passes all agree."""
    target, draft = tiny_model(_spec(arch, seed=5)), tiny_model(_spec(arch, seed=9))
    assert_greedy_identical(target, [prompt], 16, draft=draft, draft_n=draft_n, ignore_eos=True)
    assert_greedy_identical(target, [prompt], 16, draft=draft, draft_n=draft_n, draft_tree=3,
                            ignore_eos=True)


def test_a_phi3_file_with_longrope_factors_is_refused(tmp_path):
    import specdec
    from specdec.errors import UnsupportedModelError
    from specdec.testing.synth import write_tiny_model
    spec = dataclasses.replace(_spec("phi3"), extra_tensors=("rope_factors_long.weight",))
    with pytest.raises(UnsupportedModelError, match="rope_factors_long"):
        specdec.load(write_tiny_model(tmp_path / "p.gguf", spec))
