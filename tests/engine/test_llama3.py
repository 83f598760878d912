"""Llama 3.1+ RoPE (the rope_freqs tensor), linear RoPE scaling, and the rule that a file the
engine cannot compute faithfully is refused by name, never run silently wrong.

llama.cpp's llama graph (src/models/llama.cpp), restated in float64 by `reference_forward`:
    x = token_embd[ids];  per layer: h = rms(x)·attn_norm;  q, k, v = h·Wq, h·Wk, h·Wv;
      RoPE on adjacent pairs (LLAMA_ROPE_TYPE_NORM) through ggml_rope_ext with the layer's
      rope_freqs as freq_factors: theta_i = freq_scale · pos · base^(-2i/n_rot) / factors[i]
      (freq_scale = 1 / rope.scaling.factor for linear scaling, else 1);
      causal softmax(q·k / sqrt(head size))·v;  x += attn·Wo;
      x += (silu(h'·Wg) * h'·Wu)·Wd with h' = rms(x)·ffn_norm;
    logits = rms(x)·output_norm · outputᵀ.
"""
from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import specdec
from specdec.errors import UnsupportedModelError
from specdec.kernels import reference
from specdec.testing import assert_greedy_identical
from specdec.testing.synth import llama3_rope_factors, write_tiny_model
from synth import TinySpec

TOKENS = [3, 17, 4, 40, 22, 9, 9, 31, 0, 45, 12, 7, 30, 2, 44, 5]


def reference_forward(gf, cfg, tokens, factors=None, freq_scale=1.0):
    """float64 restatement of llama.cpp's llama graph (module docstring). -> (M, V)"""
    t = lambda name: gf.tensor(name).astype(np.float64)          # noqa: E731
    eps, H, Hkv, Dh = cfg.norm_eps, cfg.n_head, cfg.n_head_kv, cfg.d_head
    M = len(tokens)
    p = np.arange(M)

    def rms(x, w):
        return reference.rms_norm(x, w, eps)

    def rope(x):                                                  # (M, heads, Dh), adjacent pairs
        return reference.rope(x, p, cfg.rope_base, freq_scale=freq_scale, factors=factors)

    x = t("token_embd.weight")[tokens]
    for il in range(cfg.n_layer):
        b = f"blk.{il}."
        h = rms(x, t(b + "attn_norm.weight"))
        q = rope((h @ t(b + "attn_q.weight").T).reshape(M, H, Dh))
        k = rope((h @ t(b + "attn_k.weight").T).reshape(M, Hkv, Dh))
        v = (h @ t(b + "attn_v.weight").T).reshape(M, Hkv, Dh)
        att = np.empty((M, H, Dh))
        for hh in range(H):
            kv = hh // (H // Hkv)
            s = np.where(p[None, :] <= p[:, None], q[:, hh] @ k[:, kv].T / math.sqrt(Dh), -np.inf)
            e = np.exp(s - s.max(-1, keepdims=True))
            att[:, hh] = (e / e.sum(-1, keepdims=True)) @ v[:, kv]
        x = x + att.reshape(M, H * Dh) @ t(b + "attn_output.weight").T
        h = rms(x, t(b + "ffn_norm.weight"))
        g, u = h @ t(b + "ffn_gate.weight").T, h @ t(b + "ffn_up.weight").T
        x = x + reference.swiglu(g, u) @ t(b + "ffn_down.weight").T
    return rms(x, t("output_norm.weight")) @ t("output.weight").T


def _ours(m, tokens):
    return m.session(64).eval(tokens).astype(np.float64)


def _close(a, b) -> bool:
    return np.abs(a - b).max() <= 1e-4 * max(1.0, np.abs(b).max())


def test_rope_freqs_are_read_and_applied(tiny_model):
    """A Llama-3.1-style file: its logits follow the reference with the file's factors, and
    are far from it without them (what reading the file without rope_freqs gave)."""
    m = tiny_model(TinySpec(arch="llama", rope_freqs=True, seed=5))
    factors = m.gguf.tensor("rope_freqs.weight")
    assert np.array_equal(m.weights.rope_freqs, factors) and (factors != 1).sum() >= 4
    ours = _ours(m, TOKENS)
    assert _close(ours, reference_forward(m.gguf, m.config, TOKENS, factors))
    assert not _close(ours, reference_forward(m.gguf, m.config, TOKENS))


def test_a_file_without_rope_freqs_is_unchanged(tiny_model):
    m = tiny_model(TinySpec(arch="llama", seed=5))
    assert m.weights.rope_freqs is None and m.config.rope_freq_scale == 1.0
    assert _close(_ours(m, TOKENS), reference_forward(m.gguf, m.config, TOKENS))


def test_linear_rope_scaling(tiny_model):
    m = tiny_model(TinySpec(arch="llama", rope_scale_linear=4.0, seed=6))
    assert m.config.rope_freq_scale == 0.25
    ours = _ours(m, TOKENS)
    assert _close(ours, reference_forward(m.gguf, m.config, TOKENS, freq_scale=0.25))
    assert not _close(ours, reference_forward(m.gguf, m.config, TOKENS))


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(prompt=st.lists(st.integers(1, 46), min_size=1, max_size=12), draft_n=st.integers(1, 6))
def test_greedy_speculative_equals_plain_with_rope_freqs(tiny_model, prompt, draft_n):
    target = tiny_model(TinySpec(arch="llama", rope_freqs=True, seed=5))
    draft = tiny_model(TinySpec(arch="llama", rope_freqs=True, seed=8))
    assert_greedy_identical(target, [prompt], 20, draft=draft, draft_n=draft_n, ignore_eos=True)


def test_the_factors_follow_the_converter():
    f = llama3_rope_factors(128, n_ctx_orig=8192, base=500000.0)
    assert f[0] == 1.0 and f[-1] == 8.0 and np.all(np.diff(f) >= 0) and f.shape == (64,)


@pytest.mark.parametrize("spec, named", [
    (TinySpec(arch="qwen2", rope_freqs=True), "rope_freqs.weight"),               # not read by qwen2
    (TinySpec(arch="qwen3", extra_tensors=("blk.0.attn_output.bias",)), "blk.0.attn_output.bias"),
    (TinySpec(arch="llama", extra_tensors=("blk.1.attn_q_norm.weight",)), "blk.1.attn_q_norm.weight"),
    (TinySpec(arch="llama", extra_metadata=(("llama.rope.scaling.type", "yarn"),
                                            ("llama.rope.scaling.factor", 4.0))), "yarn"),
    # (llama files with experts run: engine/moe.py)
    (TinySpec(arch="mistral3", extra_metadata=(("mistral3.expert_count", 8),)), "mistral3.expert_count"),
    (TinySpec(arch="mistral3", extra_metadata=(("mistral3.attention.temperature_scale", 0.1),)),
     "temperature_scale"),
    (TinySpec(arch="llama", extra_metadata=(("llama.attn_logit_softcapping", 50.0),)), "attn_logit_softcapping"),
    (TinySpec(arch="qwen2", extra_metadata=(("qwen2.final_logit_softcapping", 30.0),)), "final_logit_softcapping"),
])
def test_what_changes_the_computation_unimplemented_is_refused_by_name(tmp_path, spec, named):
    path = write_tiny_model(tmp_path / "m.gguf", spec)
    with pytest.raises(UnsupportedModelError, match=named.replace(".", r"\.")) as e:
        specdec.load(path)
    assert "\n" not in str(e.value) and str(path) in str(e.value)
