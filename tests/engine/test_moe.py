"""Mixture-of-experts files (qwen3moe; llama with experts, Mixtral-style): the forward against
the float64 restatement of llama.cpp's build_moe_ffn (test_architectures.reference_forward),
each routing rule shown to matter, a one-row pass reading only its k experts, the distinct
experts a pass wakes, what the engine refuses, and greedy speculative == plain."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import specdec
from specdec.engine.gguf_file import GGUFFile
from specdec.errors import UnsupportedModelError
from specdec.kernels import experts as experts_mod
from specdec.testing import assert_greedy_identical
from specdec.testing.synth import write_tiny_model
from synth import TinySpec
from test_architectures import TOKENS, _close, reference_forward

SPECS = {"qwen3moe": TinySpec(arch="qwen3moe", n_expert=8, n_expert_used=3, d_ff_exp=64, seed=3),
         "mixtral": TinySpec(arch="llama", n_expert=4, n_expert_used=2, seed=3)}


@pytest.mark.parametrize("name", SPECS)
def test_forward_follows_llamacpp_moe_graph(tiny_model, name):
    m = tiny_model(SPECS[name])
    ours = m.session(64).eval(TOKENS).astype(np.float64)
    assert _close(ours, reference_forward(m.gguf, m.config, TOKENS))
    # softmax over the top-k logits is the renormalised top-k softmax: the same law
    assert _close(ours, reference_forward(m.gguf, m.config, TOKENS, softmax_after_topk=True))


@pytest.mark.parametrize("name", SPECS)
@pytest.mark.parametrize("broken", [dict(moe_norm=False), dict(moe_k=1)], ids=["no-renorm", "top-1"])
def test_each_routing_rule_matters(tiny_model, name, broken):
    m = tiny_model(SPECS[name])
    ours = m.session(64).eval(TOKENS).astype(np.float64)
    assert not _close(ours, reference_forward(m.gguf, m.config, TOKENS, **broken))


def test_config_and_layers(tiny_model):
    q, x = (tiny_model(SPECS[n]) for n in ("qwen3moe", "mixtral"))
    assert (q.config.n_expert, q.config.n_expert_used, q.config.d_ff_exp) == (8, 3, 64)
    assert (x.config.n_expert, x.config.n_expert_used, x.config.d_ff_exp) == (4, 2, 96)
    assert q.config.expert_norm and x.config.expert_norm
    L = q.weights.layers[0]
    assert L.moe is not None and L.w_up is None and L.w_down is None and L.q_norm is not None
    assert L.moe.gate.w.shape[:2] == (8, 64) and L.moe.down.w.shape[:2] == (8, 64)


@pytest.mark.parametrize("qtype", [T.Q8_0, T.Q4_K, T.Q5_K, T.Q6_K], ids=lambda q: q.name)
def test_quantized_experts(tiny_model, qtype):
    """Every quant real MoE files use for their experts: rows independent, near the float64
    graph on the dequantized weights."""
    kq = qtype != T.Q8_0
    spec = dataclasses.replace(SPECS["qwen3moe"], qtype=int(qtype), d_model=256 if kq else 64,
                               d_ff_exp=256 if kq else 64, d_ff=256 if kq else 96)
    m = tiny_model(spec)
    batch = m.session(64).eval(TOKENS)
    s = m.session(64)
    assert np.array_equal(batch, np.concatenate([s.eval([t]) for t in TOKENS]))
    ref = reference_forward(GGUFFile(m.gguf.path, mmap=True), m.config, TOKENS)   # not a repacked copy
    assert np.abs(batch - ref).max() < 0.25 * max(1.0, np.abs(ref).max())


def test_one_row_reads_only_its_experts(tiny_model, monkeypatch):
    """A one-row pass runs the matmuls of its k experts per layer and touches no other
    expert's slice of the mapped file; a pass over M rows wakes each distinct expert once."""
    m = tiny_model(SPECS["qwen3moe"])
    touched = []
    real = experts_mod.matmul

    def spy(w, qtype, x, **kw):
        touched.append(w.ctypes.data)
        return real(w, qtype, x, **kw)
    monkeypatch.setattr(experts_mod, "matmul", spy)
    s = m.session(64)
    s.eval(TOKENS[:1])
    k = m.config.n_expert_used
    assert len(touched) == 3 * k * m.config.n_layer and len(set(touched)) == 3 * k * m.config.n_layer
    assert s.last_experts == (k,) * m.config.n_layer
    touched.clear()
    s.eval(TOKENS[1:9])
    assert len(touched) == 3 * sum(s.last_experts) and len(set(touched)) == len(touched)
    assert all(k <= n <= m.config.n_expert for n in s.last_experts)


@pytest.mark.parametrize("bad, match", [
    (dict(extra_metadata=(("qwen3moe.expert_gating_func", 2),)), "expert_gating_func"),
    (dict(extra_metadata=(("qwen3moe.expert_shared_count", 1),)), "expert_shared_count"),
    (dict(extra_tensors=("blk.0.ffn_gate_shexp.weight",)), "ffn_gate_shexp"),
])
def test_what_the_forward_does_not_read_is_refused(tmp_path, bad, match):
    spec = dataclasses.replace(SPECS["qwen3moe"], **bad)
    with pytest.raises(UnsupportedModelError, match=match):
        specdec.load(write_tiny_model(tmp_path / "m.gguf", spec))


def test_experts_in_a_dense_architecture_are_refused(tmp_path):
    spec = TinySpec(arch="qwen2", extra_metadata=(("qwen2.expert_count", 4),))
    with pytest.raises(UnsupportedModelError, match="expert_count"):
        specdec.load(write_tiny_model(tmp_path / "m.gguf", spec))


@pytest.mark.parametrize("name", SPECS)
@settings(max_examples=5, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(prompt=st.lists(st.integers(1, 46), min_size=1, max_size=10), draft_n=st.integers(1, 6))
def test_greedy_speculative_equals_plain(tiny_model, name, prompt, draft_n):
    """Each verification pass groups its rows by expert differently than the one-row passes
    of plain decoding: the tokens are the same (linear drafts and trees)."""
    target = tiny_model(SPECS[name])
    draft = tiny_model(dataclasses.replace(SPECS[name], seed=9))
    assert_greedy_identical(target, [prompt], 16, draft=draft, draft_n=draft_n, ignore_eos=True)
    assert_greedy_identical(target, [prompt], 16, draft=draft, draft_n=draft_n, draft_tree=3,
                            ignore_eos=True)


def test_trace_and_policy_count_experts(tiny_model, tmp_path):
    """Each trace record holds the distinct experts per layer its verification pass woke,
    and the adaptive policy's cost regressor is the new experts of a pass, not its rows."""
    from specdec.speculation.policies import AdaptiveLength, StepFeedback
    from specdec.frontends.report import load_trace
    from specdec.speculation.trace import JsonlTrace
    m = tiny_model(SPECS["qwen3moe"])
    draft = tiny_model(dataclasses.replace(SPECS["qwen3moe"], seed=9))
    path = tmp_path / "t.jsonl"
    with JsonlTrace(path) as sink:
        m.generate(TOKENS, n_predict=12, temperature=0.0, ignore_eos=True, draft=draft, draft_n=4,
                   trace=sink)
    recs = load_trace(path)
    k, E = m.config.n_expert_used, m.config.n_expert
    assert recs and all(len(r.experts) == m.config.n_layer for r in recs)
    for r in recs:
        assert all(k <= n <= min(E, k * (len(r.drafted) + 1)) for n in r.experts)
    pol = AdaptiveLength(n_max=8)
    assert pol.estimates() == {}
    for n, woken, s in ((1, 5.0, 0.011), (4, 7.0, 0.013), (8, 8.0, 0.014), (2, 6.0, 0.012)):
        pol.observe(StepFeedback("model", 8, n, n, n // 2, 0.001 * n, s, experts=woken, routing=(E, k)))
    assert pol.woken(5) == 7.0 and abs(pol.woken(4) - E * (1 - (1 - k / E) ** 4)) < 1e-12
    est = pol.estimates()["model"]
    assert est["growth_per"] == "k new experts" and est["growth"] > 0
    assert 1 <= pol.next_n() <= 8
