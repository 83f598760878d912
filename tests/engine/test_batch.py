"""Batched forward passes over several sequences (transformer.forward_batch / eval_batch): each
sequence's logits and KV cache are bitwise those its own Session.eval gives, whatever the
other sequences in the batch, their cached prefixes and their numbers of new rows."""
from __future__ import annotations

from functools import lru_cache

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import specdec
from specdec.errors import ContextOverflowError
from specdec.engine.transformer import eval_batch
from synth import TinySpec

N_CTX = 64
# (spec, activations, mmap): quant types of both families, q8 and float activations, the
# repacked in-memory weights, and gemma3 with sliding-window layers (window 3 or 8, prefixes
# up to 30 positions: queries far past the window)
CASES = [
    (TinySpec(arch="llama", qtype=int(T.F32)), "auto", True),
    (TinySpec(arch="qwen2", qtype=int(T.Q8_0), seed=1), "q8", True),
    (TinySpec(arch="qwen2", qtype=int(T.Q8_0), seed=1), "float", False),
    (TinySpec(arch="llama", qtype=int(T.Q4_1), seed=2, n_vocab=40), "q8", False),
    (TinySpec(arch="llama", qtype=int(T.Q4_0), seed=6), "float", True),
    (TinySpec(arch="qwen2", qtype=int(T.Q4_K), d_model=256, d_ff=256, n_head=4, n_head_kv=2, seed=3), "q8", True),
    (TinySpec(arch="llama", qtype=int(T.Q6_K), d_model=256, d_ff=256, n_head=2, n_head_kv=1, seed=4, tied=True),
     "float", True),
    (TinySpec(arch="gemma3", qtype=int(T.Q5_0), seed=5, sliding_window=3, n_layer=6), "auto", True),
    (TinySpec(arch="gemma3", qtype=int(T.Q8_0), seed=7, sliding_window=8, n_layer=6, tied=True), "q8", True),
    # mixture of experts: each pass groups its rows by expert (kernels/experts.py)
    (TinySpec(arch="qwen3moe", qtype=int(T.Q8_0), n_expert=8, n_expert_used=3, d_ff_exp=64, seed=8), "q8", True),
    (TinySpec(arch="llama", qtype=int(T.Q4_K), d_model=256, d_ff=256, n_expert=4, n_expert_used=2, seed=9),
     "q8", False),
]

def case_id(case) -> str:
    spec, activations, mmap = case
    return f"{spec.arch}-{T(spec.qtype).name}-{activations}" + ("" if mmap else "-no_mmap")


SETTINGS = settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@pytest.fixture(scope="module")
def load(tiny_model):
    """load(spec, activations, mmap) -> specdec.Model over the tiny file of spec."""
    @lru_cache(maxsize=None)
    def make(spec, activations, mmap):
        return specdec.load(tiny_model(spec).path, n_ctx=N_CTX, activations=activations, mmap=mmap)
    return make


@st.composite
def batches(draw, n_vocab, last_only=None):
    """[(prefix ids, new ids, last_only)] for 1-8 sequences: 0-30 cached, 1-20 new rows each."""
    ids = st.integers(0, n_vocab - 1)
    lo = st.booleans() if last_only is None else st.just(last_only)
    return draw(st.lists(st.tuples(st.lists(ids, max_size=30), st.lists(ids, min_size=1, max_size=20), lo),
                         min_size=1, max_size=8))


def check_batch_equals_alone(m, batch, n_logits=None):
    """eval_batch over the sessions == each session's own eval, logits and caches bitwise."""
    pairs = []
    for prefix, _, _ in batch:
        a, b = m.session(N_CTX, n_logits), m.session(N_CTX, n_logits)
        if prefix:                                   # the same cached prefix in both
            a.eval(prefix)
            b.eval(prefix)
        pairs.append((a, b))
    got = eval_batch([a for a, _ in pairs], [new for _, new, _ in batch], [lo for _, _, lo in batch])
    assert len(got) == len(batch)
    for (a, b), (prefix, new, lo), g in zip(pairs, batch, got):
        want = b.eval(new, last_only=lo)
        assert g.dtype == np.float32 and want.dtype == np.float32
        assert g.shape == want.shape == (1 if lo else len(new), b.n_logits)
        assert np.array_equal(g, want)
        assert np.isfinite(g).all()
        assert a.n_past == b.n_past == len(prefix) + len(new)
        assert np.array_equal(a.cache.k, b.cache.k) and np.array_equal(a.cache.v, b.cache.v)


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_batched_logits_equal_each_sequence_alone(load, case):
    spec = case[0]
    m = load(*case)

    @SETTINGS
    @given(batches(spec.n_vocab, last_only=False))
    def check(batch):
        check_batch_equals_alone(m, batch)
    check()


@pytest.mark.parametrize("case", [CASES[1], CASES[5], CASES[7]], ids=case_id)
def test_last_only_mixed_in_one_batch(load, case):
    """Sequences wanting every row's logits (verification) next to ones wanting the last only
    (prefill, a draft model's catch-up) in the same pass."""
    spec = case[0]
    m = load(*case)

    @SETTINGS
    @given(batches(spec.n_vocab))
    def check(batch):
        check_batch_equals_alone(m, batch)
    check()


@pytest.mark.parametrize("case", [CASES[1], CASES[5], CASES[7]], ids=case_id)
def test_long_prompts_in_passes_change_no_bit(load, case, monkeypatch):
    """A prompt of more than transformer.UBATCH rows goes through in passes (forward), and a batch
    item of more than UBATCH rows passes its leading rows first (forward_batch): the logits
    and the caches are bitwise those of one pass over all the rows."""
    from specdec.engine import transformer as model_mod
    spec = case[0]
    m = load(*case)
    rng = np.random.default_rng(0)
    short, long_, one = (rng.integers(0, spec.n_vocab, n).tolist() for n in (7, 20, 1))

    def run():
        out = []
        for lo in (False, True):
            s = m.session(N_CTX)
            out.append((s.eval(long_, last_only=lo), s.cache.k.copy(), s.cache.v.copy()))
        a, b, c = m.session(N_CTX), m.session(N_CTX), m.session(N_CTX)
        b.eval(short)
        got = eval_batch([a, b, c], [long_, one, long_], [False, True, True])
        return out + [(g, s.cache.k.copy(), s.cache.v.copy()) for g, s in zip(got, (a, b, c))]
    whole = run()
    monkeypatch.setattr(model_mod, "UBATCH", 3)
    passes = run()
    for (x, kx, vx), (y, ky, vy) in zip(whole, passes):
        assert x.shape == y.shape and np.array_equal(x.view(np.uint32), y.view(np.uint32))
        assert np.array_equal(kx, ky) and np.array_equal(vx, vy)


def test_n_logits_head_in_a_batch(load):
    """Sessions computing the logits of the first ids only (--draft-vocab) batch the same way."""
    m = load(*CASES[1])
    rng = np.random.default_rng(0)
    batch = [(rng.integers(0, 48, p).tolist(), rng.integers(0, 48, n).tolist(), lo)
             for p, n, lo in ((0, 5, False), (9, 1, False), (3, 7, True), (20, 2, False))]
    check_batch_equals_alone(m, batch, n_logits=30)


def test_scalar_last_only_and_one_session(load):
    m = load(*CASES[0])
    a, b = m.session(N_CTX), m.session(N_CTX)
    (only,) = eval_batch([a], [[1, 2, 3]], last_only=True)
    assert np.array_equal(only, b.eval([1, 2, 3], last_only=True))


def test_eval_batch_refuses_what_eval_refuses_and_changes_nothing(load):
    m = load(*CASES[1])
    other = load(*CASES[2])                          # the same file loaded again: other weights
    a, b = m.session(16), m.session(16)
    a.eval([1, 2, 3])
    bad = [
        ([a, b], [[1], [2]], [False]),               # one last_only per session
        ([a, b], [[1]], False),                      # one token list per session
        ([a, a], [[1], [2]], False),                 # the same session twice
        ([a, other.session(16)], [[1], [2]], False),
        ([a, m.session(16, n_logits=20)], [[1], [2]], False),
        ([a, b], [[1], []], False),
        ([a, b], [[1], [48]], False),                # id out of range
        ([a, b], [[1] * 14, [2]], False),            # a's context would overflow
        ([], [], False),
    ]
    for sessions, toks, lo in bad:
        with pytest.raises((ValueError, ContextOverflowError)):
            eval_batch(sessions, toks, lo)
        assert (a.n_past, b.n_past) == (3, 0)
    with pytest.raises(ContextOverflowError):
        eval_batch([a, b], [[1] * 14, [2]])


@pytest.mark.real
@pytest.mark.parametrize("model_id", ["qwen2.5-coder-0.5b-instruct", "smollm2-135m-instruct-q4_1"])
def test_real_model_four_sequences(real_model, model_id):
    """Four sequences of a real model, different prefixes and row counts (one of them a
    prefill wanting its last row only), against each one alone."""
    m = real_model(model_id)
    text = ["def fibonacci(n):\n    if n < 2:\n        return n\n",
            "The capital of France is",
            "import numpy as np\nx = np.arange(10)\nprint(x.",
            "Once upon a time, in a land far away, there lived a"]
    ids = [m.tokenize(t) for t in text]
    batch = [(ids[0][:-5], ids[0][-5:], False),      # verify 5 drafted rows
             (ids[1][:-1], ids[1][-1:], False),      # decode one token
             ([], ids[2], True),                     # prefill, last row only
             (ids[3][:-3], ids[3][-3:], False)]
    pairs = []
    for prefix, _, _ in batch:
        a, b = m.session(128), m.session(128)
        if prefix:
            a.eval(prefix, last_only=True)
            b.eval(prefix, last_only=True)
        pairs.append((a, b))
    got = eval_batch([a for a, _ in pairs], [n for _, n, _ in batch], [lo for _, _, lo in batch])
    for (a, b), (_, new, lo), g in zip(pairs, batch, got):
        assert np.array_equal(g, b.eval(new, last_only=lo))
        assert np.array_equal(a.cache.k, b.cache.k) and np.array_equal(a.cache.v, b.cache.v)
