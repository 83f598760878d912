"""The forward pass on tiny synthetic models: row independence (bitwise), KV-cache rollback,
zero-copy weights, and the config read from metadata."""
from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from specdec.engine.config import ROPE_NEOX, ROPE_NORM
from specdec.errors import GGUFError
from synth import TinySpec

SPECS = [
    TinySpec(arch="llama", qtype=int(T.F32)),
    TinySpec(arch="qwen2", qtype=int(T.Q8_0), seed=1),
    TinySpec(arch="llama", qtype=int(T.Q4_1), seed=2, n_vocab=40),
    TinySpec(arch="qwen2", qtype=int(T.Q4_K), d_model=256, d_ff=256, n_head=4, n_head_kv=2, seed=3),
    TinySpec(arch="llama", qtype=int(T.Q6_K), d_model=256, d_ff=256, n_head=2, n_head_kv=1, seed=4, tied=True),
    TinySpec(arch="gemma3", qtype=int(T.Q5_0), seed=5, sliding_window=3, n_layer=6),
]
SETTINGS = settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@st.composite
def token_splits(draw, n_vocab):
    toks = draw(st.lists(st.integers(0, n_vocab - 1), min_size=1, max_size=20))
    cuts = sorted(draw(st.sets(st.integers(1, max(1, len(toks) - 1)), max_size=5)))
    parts, prev = [], 0
    for c in cuts + [len(toks)]:
        if c > prev:
            parts.append(toks[prev:c])
            prev = c
    return toks, parts


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: f"{s.arch}-{T(s.qtype).name}")
def test_row_independence_bitwise(tiny_model, spec):
    """Logits of a position are the same bits whether it came alone, in one batch, or after
    the cache was filled by any other split of the same tokens."""
    m = tiny_model(spec)

    @SETTINGS
    @given(token_splits(spec.n_vocab))
    def check(data):
        toks, parts = data
        s = m.session(64)
        whole = s.eval(toks)                                   # (M, V) one batch
        s.reset()
        split = np.concatenate([s.eval(p) for p in parts])     # same tokens, other batches
        s.reset()
        single = np.concatenate([s.eval([t]) for t in toks])   # one at a time (M = 1)
        assert whole.tobytes() == split.tobytes()
        assert whole.tobytes() == single.tobytes()
        assert np.isfinite(whole).all()
    check()


@pytest.mark.parametrize("spec", SPECS[:2], ids=lambda s: s.arch)
def test_truncate_rolls_back_exactly(tiny_model, spec):
    """Rolling back and feeding different tokens gives the same bits as a fresh cache."""
    m = tiny_model(spec)
    rng = np.random.default_rng(0)
    a, b, c = (rng.integers(0, spec.n_vocab, n).tolist() for n in (7, 5, 4))
    s = m.session(64)
    s.eval(a + b)
    s.truncate(len(a))
    assert s.n_past == len(a)
    rolled = s.eval(c)
    fresh = m.session(64)
    fresh.eval(a)
    assert rolled.tobytes() == fresh.eval(c).tobytes()


def test_logits_equal_session_eval(tiny_model):
    m = tiny_model(SPECS[1])
    ids = [3, 1, 4, 1, 5, 9, 2, 6]
    s = m.session(32)
    assert m.logits(ids).tobytes() == s.eval(ids).tobytes()
    assert m.logits(ids).shape == (len(ids), SPECS[1].n_vocab)


def test_last_only_matches_last_row(tiny_model):
    m = tiny_model(SPECS[0])
    s = m.session(32)
    full = s.eval([1, 2, 3, 4])
    s.reset()
    assert s.eval([1, 2, 3, 4], last_only=True).tobytes() == full[-1:].tobytes()


def test_weights_are_zero_copy_views(tiny_model):
    """Mapped: the weights are views of the memory map; read (the default when the file
    fits): views of the one in-memory copy of the file."""
    import specdec
    mapped = specdec.load(tiny_model(SPECS[1]).path, mmap=True)
    wq = mapped.weights.layers[0].wq.w
    base = wq
    while base.base is not None and not isinstance(base, np.memmap):
        base = base.base
    assert isinstance(base, np.memmap), type(base)
    assert not wq.flags.owndata
    m = tiny_model(SPECS[1])
    assert m.gguf.in_memory
    wq = m.weights.layers[0].wq.w
    assert not wq.flags.owndata and np.shares_memory(wq, m.gguf._mm)


def test_config_from_metadata(tiny_model):
    c = tiny_model(SPECS[1]).config
    assert (c.arch, c.n_layer, c.d_model, c.n_head, c.n_head_kv, c.d_head, c.n_vocab) == \
        ("qwen2", 2, 64, 4, 2, 16, 48)
    assert c.rope_type == ROPE_NEOX and c.rope_base == 10000.0
    assert tiny_model(SPECS[0]).config.rope_type == ROPE_NORM
    g = tiny_model(SPECS[5]).config
    assert g.sliding_window == 3 and [g.is_local_layer(i) for i in range(6)] == [True] * 5 + [False]


@pytest.mark.parametrize("spec", [SPECS[1], SPECS[2], SPECS[3], SPECS[4]], ids=lambda s: T(s.qtype).name)
def test_no_mmap_reads_one_copy_with_the_same_logits(tiny_model, spec):
    """mmap=False (--no-mmap): the file is read once into memory, read-only, the layer
    weights are rewritten in place (legacy quants: kernels/repack.py's 8-row records) or, K-quants
    of 16k rows, made into new arrays of 16-row interleaved records (kquants_x16), the
    embedding table too (its rows read back through its registry kernel, a tied head included),
    and the logits are bitwise those of the mapped file."""
    import specdec
    from specdec.kernels import registry
    m = specdec.load(tiny_model(spec).path, n_ctx=tiny_model(spec).n_ctx, mmap=True)
    c = specdec.load(m.path, n_ctx=m.n_ctx, mmap=False)
    wq = c.weights.layers[0].wq
    assert c.gguf.in_memory and not m.gguf.in_memory
    assert c.gguf._mm.size == c.gguf.file_size and not c.gguf._mm.flags.writeable
    new = registry.layout_for(spec.qtype, wq.n_out)
    assert wq.qtype == new and c.weights.tok_embd_type == registry.layout_for(spec.qtype, m.config.n_vocab)
    if new == registry.INTERLEAVED.get(spec.qtype):
        assert wq.w.shape[0] * 16 == m.weights.layers[0].wq.w.shape[0] and not np.shares_memory(wq.w, c.gguf._mm)
        info = c.gguf.tensors[wq.name]                   # its file bytes given back: whole pages read as 0
        page = -(-info.offset // 4096) * 4096
        if page + 4096 <= info.offset + info.n_bytes:
            assert not c.gguf._mm[page:page + 4096].any()
        with pytest.raises(GGUFError, match="released"):
            c.gguf.tensor(wq.name)
    else:
        assert np.shares_memory(wq.w, c.gguf._mm) and not wq.w.flags.writeable
        assert wq.w.shape == m.weights.layers[0].wq.w.shape
        assert c.gguf.tensor("token_embd.weight").tobytes() != m.gguf.tensor("token_embd.weight").tobytes()
    ids = [1, 2, 3, 4, 5]
    assert c.session(16).eval(ids).tobytes() == m.session(16).eval(ids).tobytes()
    s = c.session(16)
    assert np.concatenate([s.eval(ids[:2]), s.eval(ids[2:3]), s.eval(ids[3:])]).tobytes() == \
        m.session(16).eval(ids).tobytes()
