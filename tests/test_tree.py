"""Multi-candidate (tree) verification: the rule's exact output law by enumeration on tiny
vocabularies, greedy argmax matching, and (below) tree speculative decoding against plain.

p is always the target's distribution, q the draft's.
"""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fakes import PathRng, enumerate_outcomes
from specdec.speculation.drafters.base import DraftTree
from specdec.speculation.tree_verify import verify_tree
from specdec.speculation.verify import DraftProbabilityError

def memo_dist(seed: int, n_vocab: int, zeros: bool):
    """path (tuple) -> a distribution over n_vocab ids, a fixed random function of the path."""
    memo: dict = {}

    def fn(key) -> np.ndarray:
        if key not in memo:
            g = np.random.default_rng([seed, len(key), *[t + 1 for t in key]])
            d = g.dirichlet(np.ones(n_vocab) * 0.7)
            if zeros and n_vocab > 2:
                d[g.integers(n_vocab)] = 0.0                    # supports differ
            memo[key] = d / d.sum()
        return memo[key]
    return fn

# shape: children per node, breadth first: root's k, then each child's count (leaves: 0)
shapes = st.sampled_from([(1,), (2,), (3,), (2, 1, 0), (2, 1, 1), (3, 0, 1, 0), (1, 2), (2, 0, 2),
                          (3, 1, 0, 0)])

@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**31), n_vocab=st.integers(2, 3), shape=shapes,
       mode=st.sampled_from(["iid", "independent", "one-hot", "mixed"]), zeros=st.booleans())
def test_tree_rule_emits_exactly_the_target_law(seed, n_vocab, shape, mode, zeros):
    """Draft a tree (its children drawn as DraftTree says), verify it, then sample on from p
    up to a fixed length: every random branch weighted by its probability gives exactly the
    target's law of that sequence."""
    p_of, q_of = memo_dist(seed, n_vocab, zeros), memo_dist(seed + 1, n_vocab, zeros)
    length = 4

    def q_row(path, j, kind):
        if kind == "iid":
            return q_of(path)
        if kind == "one-hot":                                   # a fixed choice of the context
            q = np.zeros(n_vocab)
            q[(sum(path) * 7 + j * 3 + len(path)) % n_vocab] = 1.0
            return q
        return q_of((*path, 100 + j))                           # its own q_j

    def draft(rng) -> DraftTree:
        tokens, parents, qs, paths = [], [], [], []
        frontier = [(-1, ())]
        counts = list(shape)
        while frontier and counts:
            node, path = frontier.pop(0)
            k = counts.pop(0)
            kind = mode if mode != "mixed" else ("one-hot", "iid", "independent")[len(path) % 3]
            for j in range(k):
                q = q_row(path, j, kind)
                x = int(rng.categorical(q))
                tokens.append(x)
                parents.append(node)
                qs.append(q)
                paths.append((*path, x))
                frontier.append((len(tokens) - 1, (*path, x)))
        return DraftTree(tuple(tokens), tuple(parents), np.array(qs), "test"), paths

    def run(rng):
        tree, paths = draft(rng)
        p = np.stack([p_of(())] + [p_of(path) for path in paths])       # (n+1, V)
        res = verify_tree(tree, p, rng)
        seq = [tree.tokens[c] for c in res.path] + [res.next_token]
        assert res.path == tuple(tree.path(res.path[-1])) if res.path else True
        while len(seq) < length:
            seq.append(int(rng.categorical(p_of(tuple(seq)))))
        return tuple(seq[:length]) if len(seq) >= length else tuple(seq)

    got = enumerate_outcomes(run)
    want: dict = {}

    def rec(prefix, pr):
        if len(prefix) == length:
            want[tuple(prefix)] = pr
            return
        for y, py in enumerate(p_of(tuple(prefix))):
            if py > 0:
                rec(prefix + [y], pr * py)
    rec([], 1.0)
    assert abs(sum(got.values()) - 1.0) < 1e-12
    for key in set(got) | set(want):
        assert abs(got.get(key, 0.0) - want.get(key, 0.0)) < 1e-12, key

def one_hot(ids, V=6):
    return np.eye(V)[list(ids)].reshape(len(ids), V)

def test_tree_rule_greedy_accepts_the_argmax_child_without_randomness():
    # root children 3, 1, 4; node 1 (token 1) has children 5, 2; node 4 (token 2) has child 0
    tree = DraftTree((3, 1, 4, 5, 2, 0), (-1, -1, -1, 1, 1, 4), one_hot([3, 1, 4, 5, 2, 0]))
    for argmax, want_path, want_next, kind in [
            ({(): 1, (1,): 2, (1, 2): 0, (1, 2, 0): 5}, (1, 4, 5), 5, "bonus"),
            ({(): 1, (1,): 2, (1, 2): 3}, (1, 4), 3, "correction"),
            ({(): 1, (1,): 3}, (1,), 3, "correction"),
            ({(): 0}, (), 0, "correction")]:
        rows = []
        for path in [()] + [tuple(tree.tokens[c] for c in tree.path(i)) for i in range(6)]:
            rows.append(np.eye(6)[argmax.get(path, 0)])
        rng = PathRng([])
        res = verify_tree(tree, np.stack(rows), rng)
        assert (res.path, res.next_token, res.kind) == (want_path, want_next, kind)
        assert rng.taken == []
        assert res.n_branches == 4 and res.linear.n_accepted == len(want_path)
    assert res.branch == 0 and len(res.linear.records) == 1 and not res.linear.records[0].accepted

def test_tree_result_branch_and_linear_view():
    tree = DraftTree((3, 1, 4, 5, 2, 0), (-1, -1, -1, 1, 1, 4), one_hot([3, 1, 4, 5, 2, 0]))
    rows = [np.eye(6)[t] for t in (1, 0, 2, 0, 0, 3, 0)]        # accept 1 then 2 then reject
    res = verify_tree(tree, np.stack(rows), PathRng([]))
    assert res.path == (1, 4) and res.branch == 3              # leaves 0, 2, 3, 5: node 5 is [3]
    assert [r.token for r in res.linear.records] == [1, 2, 0]
    assert [r.accepted for r in res.linear.records] == [True, True, False]
    assert len(res.linear.alpha) == 3
    assert [c for c, _ in res.tried] == [0, 1, 3, 4, 5]
    empty = verify_tree(DraftTree((), (), np.zeros((0, 6))), np.eye(6)[[2]], PathRng([]))
    assert (empty.path, empty.next_token, empty.kind, empty.n_branches) == ((), 2, "bonus", 0)
    with pytest.raises(DraftProbabilityError):
        verify_tree(DraftTree((1,), (-1,), one_hot([2])), np.stack(rows[:2]), PathRng([]))
    with pytest.raises(ValueError):
        verify_tree(tree, np.stack(rows[:3]), PathRng([]))

def test_linear_tree_is_the_linear_rule():
    """A one-branch tree verifies exactly as verify() does, decision by decision."""
    from specdec.speculation.verify import verify
    g = np.random.default_rng(3)
    for _ in range(30):
        n, V = int(g.integers(0, 4)), 4
        q, p = g.dirichlet(np.ones(V), n), g.dirichlet(np.ones(V), n + 1)
        toks = [int(g.choice(V, p=row)) for row in q]
        path = [int(c) for c in g.integers(0, 2, 8)]
        a = verify(toks, q, p, PathRng(path))
        b = verify_tree(DraftTree(tuple(toks), tuple(range(-1, n - 1)), q), p, PathRng(path))
        assert (a.n_accepted, a.next_token, a.kind, a.records) == \
               (b.n_accepted, b.next_token, b.kind, b.linear.records)
