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


# ---- tree speculative decoding: drafters, the loop, exactness ---------------------------------

import specdec.speculation.speculative as speculative                      # noqa: E402
from fakes import PAIR_FACTORIES, RELATIONS                                 # noqa: E402
from helpers import ListTrace, factories, sampling_params, target_law      # noqa: E402
from specdec.errors import ConfigError                                      # noqa: E402
from specdec.generation.plain import generate_plain                                 # noqa: E402
from specdec.generation.sampling import GREEDY, NumpyRandom, SamplerParams             # noqa: E402
from specdec.speculation.drafters import HybridDrafter, ModelDrafter, PromptLookupDrafter  # noqa: E402
from specdec.speculation.policies import FixedLength                       # noqa: E402

DRAFTERS = ("model", "prompt-lookup", "hybrid")


def make(kind, draft, params, draft_p=0.0):
    lookup = PromptLookupDrafter(draft.n_vocab, ngram_max=4, ngram_min=1)
    model = ModelDrafter(draft, params, draft_p)
    return {"model": model, "prompt-lookup": lookup, "hybrid": HybridDrafter(lookup, model)}[kind]


def run_tree(target, drafter, prompt, n, params, rng, eog, draft_n, k, **kw):
    return speculative.generate_speculative(target, drafter, prompt, n, params, rng, eog,
                                            policy=FixedLength(draft_n), tree_k=k, **kw)


@factories
@settings(max_examples=8, deadline=None)
@given(seed=st.integers(0, 2**20), prompt=st.lists(st.integers(0, 5), min_size=1, max_size=10),
       relation=st.sampled_from(RELATIONS), kind=st.sampled_from(DRAFTERS),
       draft_p=st.sampled_from([0.0, 0.5]), use_eog=st.booleans())
def test_greedy_tree_speculative_equals_greedy_plain(factory, seed, prompt, relation, kind, draft_p,
                                                     use_eog):
    target, draft = factory(24, seed, relation)
    eog = {23} if use_eog else set()
    want = generate_plain(target, prompt, 16, GREEDY, NumpyRandom(0), eog)
    for k in (1, 2, 3):
        for draft_n in (1, 4):
            sink = ListTrace()
            got = run_tree(target, make(kind, draft, GREEDY, draft_p), prompt, 16, GREEDY,
                           NumpyRandom(k), eog, draft_n, k, trace=sink)
            assert got.ids == want.ids and got.stop_reason == want.stop_reason
            assert got.stats.n_drafted == sum(r.n_nodes for r in sink.records)
            assert all(r.n_branches <= k and 0 <= r.branch < max(1, r.n_branches) for r in sink.records)
            if relation == "identical" and kind == "model" and draft_p == 0.0:
                assert all(r.n_accepted == len(r.drafted) for r in sink.records)   # branch 0 wins


@pytest.mark.parametrize("factory", list(PAIR_FACTORIES.values())[:1], ids=["fake"])
@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**20), n_vocab=st.integers(2, 3), data=st.data(),
       n_predict=st.integers(2, 3), draft_n=st.integers(1, 2), k=st.integers(2, 3),
       relation=st.sampled_from(RELATIONS), params=sampling_params, kind=st.sampled_from(DRAFTERS),
       use_eog=st.booleans())
def test_tree_exact_output_law(factory, seed, n_vocab, data, n_predict, draft_n, k, relation, params,
                               kind, use_eog):
    """Every random branch (drafts, coins, corrections) weighted by its probability: the
    output law of tree speculative decoding is exactly the target's."""
    prompt = data.draw(st.lists(st.integers(0, n_vocab - 1), min_size=1, max_size=4))
    target, draft = factory(n_vocab, seed, relation)
    eog = {0} if use_eog else set()
    drafter = make(kind, draft, params)

    def run(rng):
        res = run_tree(target, drafter, prompt, n_predict, params, rng, eog, draft_n, k)
        return tuple(res.ids), res.stop_reason

    got, want = enumerate_outcomes(run), target_law(target, prompt, n_predict, params, eog)
    assert abs(sum(got.values()) - 1.0) < 1e-12
    for key in set(got) | set(want):
        assert abs(got.get(key, 0.0) - want.get(key, 0.0)) < 1e-12, key


def test_tree_exact_output_law_synth():
    """The same on a real forward pass (tiny GGUF transformers): the target verifies every
    tree with eval_tree / commit_path."""
    params = SamplerParams(temperature=1.2, top_k=0, top_p=1.0, min_p=0.0)
    target, draft = PAIR_FACTORIES["synth"](3, 11, "good")
    drafter = ModelDrafter(draft, params)

    def run(rng):
        return tuple(run_tree(target, drafter, [1, 2], 3, params, rng, set(), 2, 2).ids)

    got = enumerate_outcomes(run)
    want = {key[0]: v for key, v in target_law(target, [1, 2], 3, params, set()).items()}
    assert set(got) == set(want) and max(abs(got[x] - want[x]) for x in want) < 1e-12


def test_lookup_tree_copies_several_matches_as_a_trie():
    d = PromptLookupDrafter(20, ngram_max=3, ngram_min=1, copy_ratio=0)
    ctx = [1, 2, 5, 6, 9, 1, 2, 7, 8, 1, 2, 5, 6, 3, 1, 2]       # "1 2" was followed by 5 6, 7 8, 5 6
    tree = d.propose_tree(ctx, 3, 3, NumpyRandom(0))
    linear = d.propose(ctx, 3, NumpyRandom(0))
    first = [tree.tokens[c] for c in tree.path(tree.leaves()[0])]
    assert tuple(first) == linear.tokens == (5, 6, 3)
    branches = {tuple(tree.tokens[c] for c in tree.path(leaf)) for leaf in tree.leaves()}
    assert branches == {(5, 6, 3), (7, 8, 1), (5, 6, 9)}       # shared prefix 5 6: one trie path
    assert len(tree.tokens) == 3 + 3 + 1 and (tree.q.sum(1) == 1).all()
    assert d.propose_tree(ctx, 3, 1, NumpyRandom(0)).tokens == linear.tokens


def test_model_tree_greedy_top_k_first_tokens():
    target, draft = PAIR_FACTORIES["fake"](12, 3, "good")
    drafter = ModelDrafter(draft, GREEDY)
    tree = drafter.propose_tree([1, 2, 3], 3, 4, NumpyRandom(0))
    roots = tree.children(-1)
    row = draft.logit_fn((1, 2, 3))
    assert [tree.tokens[c] for c in roots] == list(np.argsort(-row, kind="stable")[:4])
    assert all(len(tree.path(leaf)) == 3 for leaf in tree.leaves()) and len(tree.leaves()) == 4
    assert tree.tokens[:3] == drafter.propose([1, 2, 3], 3, NumpyRandom(0)).tokens


def test_tree_options_and_errors():
    from specdec.api.request import DraftOptions
    assert DraftOptions(kind="prompt-lookup", tree=3).length_policy().n_max == 5    # threshold
    for bad in (dict(tree=0), dict(tree=9), dict(tree=2.5), dict(tree=2, policy="adaptive")):
        with pytest.raises(ConfigError) as e:
            DraftOptions(kind="prompt-lookup", **bad)
        assert "--draft-tree" in str(e.value) and "\n" not in str(e.value)
    target, draft = PAIR_FACTORIES["fake"](8, 2, "good")
    with pytest.raises(ConfigError):
        run_tree(target, ModelDrafter(draft, GREEDY), [1], 5, GREEDY, NumpyRandom(0), set(), 2, 0)


def test_trace_report_branches_line(tmp_path):
    from specdec.frontends.report import branches_line, summarize
    from specdec.frontends.report import load_trace
    from specdec.speculation.trace import JsonlTrace, StepRecord
    target, draft = PAIR_FACTORIES["fake"](16, 4, "bad")
    sink = ListTrace()
    params = SamplerParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0)
    run_tree(target, ModelDrafter(draft, params), [1, 2], 40, params, NumpyRandom(1), set(), 3, 3,
             trace=sink)
    with JsonlTrace(tmp_path / "t.jsonl") as f:
        for r in sink.records:
            f.write(r)
    assert load_trace(tmp_path / "t.jsonl") == sink.records
    s = summarize(sink.records)
    tree_steps = [r for r in sink.records if r.n_branches > 1]
    assert s["branches"]["n_tree_steps"] == len(tree_steps) > 10
    assert sum(s["branches"]["won_by_branch"]) == sum(r.n_accepted > 0 for r in tree_steps)
    assert branches_line(s).startswith("branches: ")
    old = sink.records[0].to_json().replace(', "branch": 0', "").replace(', "n_branches": 3', "")
    assert StepRecord.from_json(old.split(', "n_nodes"')[0] + "}").n_branches == 1   # older traces


@pytest.mark.parametrize("flags", [["--draft-tree", "0"], ["--draft-tree", "9"],
                                   ["--draft-tree", "2", "--draft-policy", "adaptive"]])
def test_cli_bad_draft_tree_exit_2(flags):
    import subprocess
    import sys
    r = subprocess.run([sys.executable, "-m", "specdec.frontends.cli", "run", "-p", "hi", *flags],
                       capture_output=True, text=True)
    assert r.returncode == 2, r.stderr
    assert "--draft-tree" in r.stderr and "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr
