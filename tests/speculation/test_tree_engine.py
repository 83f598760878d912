"""Token trees in one pass (ModelSession.eval_tree / commit_path, kernels/attention_tree.py):
each node's logits are bitwise those of its root-to-node path evaluated alone, and the cache
after committing a path is bitwise the cache of evaluating that path."""
from __future__ import annotations

import math

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from specdec.kernels.attention import attention, blocked_keys
from specdec.kernels.attention_tree import attention_tree, tree_mask
from synth import TinySpec

SPECS = [
    TinySpec(arch="llama", qtype=int(T.F32)),
    TinySpec(arch="qwen2", qtype=int(T.Q8_0), seed=1),
    TinySpec(arch="gemma3", qtype=int(T.Q5_0), seed=5, sliding_window=3, n_layer=6),
]
SETTINGS = settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@st.composite
def trees(draw, n_vocab, max_nodes=9):
    """(context ids, tree tokens, parents): parents[i] in -1..i-1."""
    ctx = draw(st.lists(st.integers(0, n_vocab - 1), min_size=0, max_size=12))
    n = draw(st.integers(1, max_nodes))
    parents = [draw(st.integers(-1, i - 1)) for i in range(n)]
    tokens = draw(st.lists(st.integers(0, n_vocab - 1), min_size=n, max_size=n))
    return ctx, tokens, parents


def path_to(parents, i):
    path = []
    while i >= 0:
        path.append(i)
        i = parents[i]
    return path[::-1]


def test_tree_mask():
    depth, anc = tree_mask(np.array([-1, 0, 0, 1, -1]))
    assert depth.tolist() == [0, 1, 1, 2, 0]
    assert anc.tolist() == [[1, 0, 0, 0, 0], [1, 1, 0, 0, 0], [1, 0, 1, 0, 0], [1, 1, 0, 1, 0],
                            [0, 0, 0, 0, 1]]
    with pytest.raises(ValueError):
        tree_mask(np.array([-1, 1]))


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), base=st.integers(0, 70), data=st.data(),
       rep=st.sampled_from([1, 3]), dh=st.sampled_from([8, 20, 64]), window=st.sampled_from([0, 3, 40]))
def test_attention_tree_is_the_path_alone_bitwise(seed, base, data, rep, dh, window):
    """Each node's output equals attention.attention over its path stored contiguously."""
    rng = np.random.default_rng(seed)
    n = data.draw(st.integers(1, 10))
    parents = np.array([data.draw(st.integers(-1, i - 1)) for i in range(n)], np.int64)
    depth, anc = tree_mask(parents)
    hkv, H, n_ctx = 2, 2 * rep, base + n + 5
    q = rng.standard_normal((n, H, dh)).astype(np.float32)
    k = rng.standard_normal((hkv, n_ctx, dh)).astype(np.float32)
    v = rng.standard_normal((hkv, n_ctx, dh)).astype(np.float32)
    scale = np.float32(1 / math.sqrt(dh))
    out = np.empty_like(q)
    attention_tree(q, blocked_keys(k), v, base, depth, anc, scale, window, out)
    for i in range(n):
        path = path_to(parents.tolist(), i)
        kp, vp = k.copy(), v.copy()
        kp[:, base:base + len(path)] = k[:, [base + a for a in path]]
        vp[:, base:base + len(path)] = v[:, [base + a for a in path]]
        one = np.empty((1, H, dh), np.float32)
        attention(q[i:i + 1], blocked_keys(kp), vp, np.array([base + depth[i]]), scale, window, one)
        assert np.array_equal(one[0], out[i])


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: f"{s.arch}-{T(s.qtype).name}")
def test_eval_tree_rows_are_their_paths_and_commit_is_the_path(tiny_model, spec):
    m = tiny_model(spec)

    @SETTINGS
    @given(trees(spec.n_vocab))
    def check(data):
        ctx, tokens, parents = data
        s = m.session(64)
        if ctx:
            s.eval(ctx)
        got = s.eval_tree(tokens, parents)                     # (T, V)
        assert s.n_past == len(ctx) and got.shape == (len(tokens), spec.n_vocab)
        alone = m.session(64)
        for i in range(len(tokens)):
            path = path_to(parents, i)
            alone.reset()
            want = alone.eval(ctx + [tokens[a] for a in path])[-1]
            assert got[i].tobytes() == want.tobytes(), (i, path)
        leaf = max(range(len(tokens)), key=lambda i: (len(path_to(parents, i)), i))
        path = path_to(parents, leaf)
        s.commit_path(path)
        toks = ctx + [tokens[a] for a in path]
        alone.reset()
        alone.eval(toks)
        assert s.n_past == alone.n_past == len(toks)
        assert s.cache.keys()[:, :, :len(toks)].tobytes() == alone.cache.keys()[:, :, :len(toks)].tobytes()
        assert s.cache.v[:, :, :len(toks)].tobytes() == alone.cache.v[:, :, :len(toks)].tobytes()
        nxt = [1, 2]
        assert s.eval(nxt).tobytes() == alone.eval(nxt).tobytes()    # and it goes on the same
    check()


def test_commit_path_checks(tiny_model):
    s = tiny_model(SPECS[0]).session(32)
    s.eval([1, 2, 3])
    with pytest.raises(ValueError, match="no tree"):
        s.commit_path([0])
    s.eval_tree([4, 5, 6], [-1, 0, 0])
    for bad in ([1], [0, 0], [0, 1, 2], [3]):
        with pytest.raises(ValueError, match="not a root-to-node path"):
            s.commit_path(bad)
    with pytest.raises(ValueError):
        s.eval_tree([4, 5], [-1])
    s.eval_tree([4, 5, 6], [-1, 0, 0])
    s.commit_path([0, 2])
    assert s.n_past == 5
    s.eval_tree([7], [-1])
    s.commit_path([])                                         # nothing kept
    assert s.n_past == 5
