"""Gemma-3: the forward pass checked against llama.cpp's rules, the end-of-turn token, the
chat format and draft compatibility (the real model against llama.cpp's outputs: with the
other models in agreement/test_reference.py).

llama.cpp's gemma3 graph (src/models/gemma3.cpp, hparams in llama-model.cpp), which
`reference_forward` below restates in float64:
    x = token_embd[ids] * sqrt(n_embd)
    per layer: h = rms(x)·attn_norm;  q, k, v = h·Wq, h·Wk, h·Wv;  q, k: rms per head · q_norm / k_norm;
      NEOX RoPE, base 10000 on sliding-window layers and rope.freq_base on the others;
      q *= f_attention_scale (1/sqrt(head size); 1/sqrt(n_embd/n_head) for the 62-layer 27B);
      causal softmax(q·k) with key j hidden from query p when p - j >= n_swa on sliding-window
      layers (LLAMA_SWA_TYPE_STANDARD); layer il slides iff il % 6 < 5 (set_swa_pattern(6));
      x += rms(attn·Wo)·post_attention_norm;  x += rms((gelu_tanh(h'·Wg) * h'·Wu)·Wd)·post_ffw_norm
      with h' = rms(x)·ffn_norm;
    logits = rms(x)·output_norm · token_embdᵀ (tied), then c·tanh(logits/c) only when the file
    sets gemma3.final_logit_softcapping (gemma-3-270m does not).
The norm weights are used as stored: the converter already folded Gemma's (1 + w) into them.

Agreement with llama.cpp on gemma-3-270m (tests/data/reference) is checked with the bounds
of agreement/test_reference.py (margin 0.5, mean 0.35 / max 1.0, 1%).  This model turns rounding
differences into large output differences: with every matmul input rounded to Q8_0 / Q8_K
as llama.cpp does, Gemma's post-norms rescale tiny branch outputs (RMS down to 1e-4) to
unit size and the roundings flip chaotically — scaling the embedding row by
(1 + 1e-6·N(0, 1)), 16 draws, moved the perplexity between 17.07 and 17.37 (sd 0.44%) and
the first-step logits between max 0.74 and 1.52.  With float32 activations in the layers
(kernels/float_act.py, the gemma3 default) the same nudge changes nothing visible, and the
figures are mean 0.18 / max 0.70, perplexity 17.26 vs 17.15 (0.66%).  For comparison, a
wrong rule is far outside: every layer on the global RoPE base gives mean 1.5 / max 4.4 and
perplexity +81%.
"""
from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T

from specdec.kernels import reference

from helpers import greedy_records
from synth import TinySpec

GEMMA = "gemma-3-270m-q4_k_m"
QWEN = "qwen2.5-coder-0.5b-instruct"
END_OF_TURN = 106


# 7 layers, window 3: layers 0-4 and 6 slide, layer 5 is global; 12 tokens > window
TINY = TinySpec(arch="gemma3", qtype=int(T.F32), n_layer=7, sliding_window=3, tied=True, seed=11)
TOKENS = [3, 17, 4, 40, 22, 9, 9, 31, 0, 45, 12, 7]


# ------------------------------------------------------------ the rules, on a tiny model

def reference_forward(gf, cfg, tokens, *, window=None, global_base=None, softcap=0.0):
    """float64 restatement of llama.cpp's gemma3 graph (module docstring). -> (M, V)"""
    t = lambda name: gf.tensor(name).astype(np.float64)          # noqa: E731
    eps, D, H, Hkv = cfg.norm_eps, cfg.d_model, cfg.n_head, cfg.n_head_kv
    Dh = cfg.d_head
    window = cfg.sliding_window if window is None else window
    global_base = cfg.rope_base if global_base is None else global_base

    def rms(x, w):
        return reference.rms_norm(x, w, eps)

    def rope(x, base):                                            # (M, heads, Dh), NEOX
        return reference.rope(x, np.arange(len(tokens)), base, neox=True)

    M = len(tokens)
    emb = t("token_embd.weight")                                  # (V, D)
    x = emb[tokens] * math.sqrt(D)
    p = np.arange(M)
    for il in range(cfg.n_layer):
        b = f"blk.{il}."
        sliding = il % 6 < 5
        h = rms(x, t(b + "attn_norm.weight"))
        q = (h @ t(b + "attn_q.weight").T).reshape(M, H, Dh)
        k = (h @ t(b + "attn_k.weight").T).reshape(M, Hkv, Dh)
        v = (h @ t(b + "attn_v.weight").T).reshape(M, Hkv, Dh)
        base = 10000.0 if sliding else global_base
        q = rope(rms(q, t(b + "attn_q_norm.weight")), base) / math.sqrt(Dh)
        k = rope(rms(k, t(b + "attn_k_norm.weight")), base)
        visible = p[None, :] <= p[:, None]                        # (query, key)
        if sliding and window > 0:
            visible &= p[:, None] - p[None, :] < window
        att = np.empty((M, H, Dh))
        for hh in range(H):
            kv = hh // (H // Hkv)
            s = np.where(visible, q[:, hh] @ k[:, kv].T, -np.inf)
            e = np.exp(s - s.max(-1, keepdims=True))
            att[:, hh] = (e / e.sum(-1, keepdims=True)) @ v[:, kv]
        x = x + rms(att.reshape(M, H * Dh) @ t(b + "attn_output.weight").T, t(b + "post_attention_norm.weight"))
        h = rms(x, t(b + "ffn_norm.weight"))
        g, u = h @ t(b + "ffn_gate.weight").T, h @ t(b + "ffn_up.weight").T
        x = x + rms(reference.geglu(g, u) @ t(b + "ffn_down.weight").T, t(b + "post_ffw_norm.weight"))
    logits = rms(x, t("output_norm.weight")) @ emb.T
    return softcap * np.tanh(logits / softcap) if softcap else logits


def _ours(m, cfg, tokens):
    from specdec.engine.transformer import ModelSession
    return ModelSession(cfg, m.weights, 64).eval(tokens).astype(np.float64)


def _close(a, b) -> bool:
    return np.abs(a - b).max() <= 1e-4 * max(1.0, np.abs(b).max())


def test_tiny_config_follows_llamacpp(tiny_model):
    c = tiny_model(TINY).config
    assert (c.sliding_window, c.rope_base_local, c.final_logit_softcap) == (3, 10000.0, 0.0)
    assert [c.is_local_layer(i) for i in range(7)] == [i % 6 < 5 for i in range(7)]
    assert c.embed_scale == math.sqrt(c.d_model) and c.attn_scale == 1 / math.sqrt(c.d_head)


def test_forward_matches_llamacpp_rules(tiny_model):
    """Sliding window (3 < 12 tokens), per-layer RoPE bases (global base 1e6 here, as in the
    real model), q/k norms, post-norms, GeGLU, scaled and tied embeddings: to 1e-4."""
    m = tiny_model(TINY)
    cfg = dataclasses.replace(m.config, rope_base=1e6)
    ours = _ours(m, cfg, TOKENS)
    assert _close(ours, reference_forward(m.gguf, cfg, TOKENS))
    # each rule matters here: getting it wrong would be caught
    assert not _close(ours, reference_forward(m.gguf, cfg, TOKENS, window=0))
    assert not _close(ours, reference_forward(m.gguf, cfg, TOKENS, global_base=10000.0))


def test_final_logit_softcap(tiny_model):
    m = tiny_model(TINY)
    plain = _ours(m, m.config, TOKENS)
    cap = float(np.abs(plain).max()) / 2                          # bends the larger logits
    ours = _ours(m, dataclasses.replace(m.config, final_logit_softcap=cap), TOKENS)
    assert _close(ours, reference_forward(m.gguf, m.config, TOKENS, softcap=cap))
    assert np.abs(ours).max() <= cap and not _close(ours, plain)


def test_window_keeps_rollback_exact(tiny_model):
    """The cache keeps every position and the window is a mask, so rolling back past the
    window and refilling gives the bits of a fresh cache (llama.cpp needs --swa-full for
    this; here it is free)."""
    m = tiny_model(TINY)
    s = m.session(64)
    s.eval(TOKENS)
    s.truncate(4)
    rolled = s.eval(TOKENS[8:])
    fresh = m.session(64)
    fresh.eval(TOKENS[:4])
    assert rolled.tobytes() == fresh.eval(TOKENS[8:]).tobytes()


# ------------------------------------------------------------ the real model vs llama.cpp

# ------------------------------------------------------------ end of turn, chat format

class _ForceAfter:
    """A Session whose logits are the real ones, except that after `n` generated tokens
    `token` gets the largest logit (this model practically never picks <end_of_turn> itself:
    its embedding row, tied to the output, is untrained in the base model)."""

    def __init__(self, session, n_prompt: int, n: int, token: int):
        self.s, self.at, self.token = session, n_prompt + n, token

    n_vocab = property(lambda self: self.s.n_vocab)
    n_ctx = property(lambda self: self.s.n_ctx)
    n_past = property(lambda self: self.s.n_past)
    n_logits = property(lambda self: self.s.n_logits)

    def eval(self, tokens, last_only=False):
        out = self.s.eval(tokens, last_only)
        if self.s.n_past == self.at:
            out[-1, self.token] = out[-1].max() + 10.0
        return out

    def truncate(self, n):
        self.s.truncate(n)

    def reset(self):
        self.s.reset()


@pytest.mark.real
def test_generation_stops_at_end_of_turn(real_model, monkeypatch):
    m = real_model(GEMMA)
    tok = m.tokenizer
    assert tok.tokens[END_OF_TURN] == "<end_of_turn>" and END_OF_TURN in tok.eog_ids
    assert tok.eos_id == 1 and 1 in tok.eog_ids
    prompt = m.tokenize("The capital of France is")
    plain = m.generate(prompt, n_predict=6)
    session = m.session
    monkeypatch.setattr(m, "session", lambda n_ctx=None: _ForceAfter(session(n_ctx), len(prompt), 3, END_OF_TURN))
    out = m.generate(prompt, n_predict=6)
    assert out.stop_reason == "eog" and out.ids == plain.ids[:3]          # not emitted itself
    past = m.generate(prompt, n_predict=6, ignore_eos=True)
    assert past.ids[:4] == plain.ids[:3] + [END_OF_TURN] and len(past.ids) == 6


# Gemma's turn format, as its instruction-tuned releases write it; this GGUF has no template
GEMMA_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}"
    "{{ '<start_of_turn>' + ('model' if m['role'] == 'assistant' else m['role']) + '\n' }}"
    "{{ (m['content'] | trim) + '<end_of_turn>\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<start_of_turn>model\n' }}{% endif %}")


@pytest.mark.real
def test_chat_template_gives_llamacpp_prompt_ids(real_model):
    """A Gemma turn template rendered by specdec.text.template (Jinja2) gives exactly the ids llama.cpp
    was fed for the reference chat prompts: one BOS, <start_of_turn> / <end_of_turn> as the
    single special tokens 105 / 106."""
    from specdec.api.conversation import chat_prompt
    m = real_model(GEMMA)
    assert m.tokenizer.chat_template is None
    tok = dataclasses.replace(m.tokenizer, chat_template=GEMMA_TEMPLATE)
    head, tail = "<start_of_turn>user\n", "<end_of_turn>\n<start_of_turn>model\n"
    chats = [r for r in greedy_records(GEMMA) if r["prompt"].startswith(head) and r["prompt"].endswith(tail)]
    assert len(chats) >= 3
    for r in chats:
        text = chat_prompt(tok, [{"role": "user", "content": r["prompt"][len(head):-len(tail)]}])
        ids = m.tokenize(text)
        assert ids == r["prompt_ids"]
        assert ids[:2] == [tok.bos_id, 105] and ids.count(tok.bos_id) == 1 and END_OF_TURN in ids


# ------------------------------------------------------------ draft compatibility

@pytest.mark.real
@pytest.mark.parametrize("target,draft", [(QWEN, GEMMA), (GEMMA, QWEN)], ids=["qwen<-gemma", "gemma<-qwen"])
def test_draft_of_another_vocabulary_is_refused(real_model, target, draft):
    import specdec
    t, d = real_model(target), real_model(draft)
    with pytest.raises(specdec.IncompatibleDraftError) as e:
        t.generate("hi", n_predict=2, draft=d)
    msg = str(e.value)
    spm_bpe = "'bpe' vs 'spm'" if target == QWEN else "'spm' vs 'bpe'"
    sizes = "151936 vs 262144" if target == QWEN else "262144 vs 151936"
    assert "\n" not in msg and d.name in msg and t.name in msg
    assert f"vocab type {spm_bpe}" in msg and f"vocab size {sizes}" in msg and "token texts differ" in msg
