"""Multi-candidate (tree) verification: its acceptance rule (`verify_tree`) and its step
(`tree_step`, the tree counterpart of speculative.linear_step).

Miao et al. 2024, "SpecInfer: Accelerating Large Language Model Serving with Tree-based
Speculative Inference and Verification", multi-step speculative sampling (their Algorithm 2,
for children drawn independently).  p is the target's distribution, q the draft's.

At a node with target distribution r = p and children x_1..x_k (x_j ~ q_j independently, each
q_j fixed before the draws): for j = 1..k accept x_j with probability min(1, r(x_j)/q_j(x_j))
and descend into its subtree; on rejection r <- normalize(max(0, r - q_j)) and try the next
child; when all are rejected, emit a token drawn from r (a correction); at a leaf, from p (a
bonus).

Why the emitted token has law p (induction on k): k = 0 is a draw from p.  For k >= 1, x_1 is
accepted as y with probability min(p(y), q_1(y)) (Leviathan et al. 2023, A.1), and rejected
with probability 1 - sum_y min(p, q_1), after which r_1 = normalize(max(0, p - q_1)) is the
target of the same rule on x_2..x_k; those are independent of x_1 and its coin, so by
induction that rest emits y with law r_1, and P(y) = min(p, q_1)(y) + (1 - sum min(p, q_1))
r_1(y) = p(y).  Given the accepted x_j, its subtree was drawn given x_j alone, so the next
node's verification is the same rule again with p(. | path): the emitted sequence has the
target's law.  Children drawn i.i.d. from one q *with replacement* fit (q_j = q); a repeat
of a rejected token is rejected surely (r(x) = 0 after max(0, r - q) at x), but its q_j is
still subtracted.  Deterministic children (prompt lookup, the draft's top-k at temperature 0)
are x_j ~ one-hot q_j.  Greedy needs no special case: with p and q one-hot the rule accepts
the child equal to argmax p and otherwise emits argmax p, without randomness.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Generator, Sequence

import numpy as np

from ..generation.interfaces import EvalTree, Session
from ..generation.sampling import Rng, SamplerParams, probs_rows
from .bookkeeping import StepResult, StepTimer
from .constrained import Unconstrained
from .drafters.base import Draft, DraftTree, Drafter
from .verify import PositionRecord, VerifyResult, alphas, residual, try_token


@dataclass(frozen=True)
class TreeVerifyResult:
    path: tuple[int, ...]           # accepted nodes, root to deepest
    next_token: int                 # the token sampled after them
    kind: str                       # 'correction' | 'bonus'
    tried: tuple[tuple[int, PositionRecord], ...]   # (node, record) per child tried, in order
    branch: int                     # the verified branch: first leaf whose path extends `path`
    n_branches: int                 # leaves of the tree
    linear: VerifyResult            # that branch as a linear draft's result (stats, trace)

    @property
    def n_accepted(self) -> int:
        return len(self.path)


def verify_tree(tree: DraftTree, p: np.ndarray, rng: Rng) -> TreeVerifyResult:
    """tree (n nodes); p (n+1, V): p[0] the target after the context, p[i+1] after node i.
    Random decisions: one rng.bernoulli per child tried, one rng.categorical at the end."""
    n = len(tree.tokens)
    if p.shape[0] != n + 1 or tree.q.shape[0] != n or len(tree.parents) != n:
        raise ValueError(f"verify_tree: shapes q {tree.q.shape}, p {p.shape} do not fit {n} nodes")
    path: list[int] = []
    tried: list[tuple[int, PositionRecord]] = []
    node, r, kind = -1, p[0], "bonus"
    while True:
        for c in tree.children(node):                     # the children, in order (SpecInfer)
            tried.append((c, try_token(tree.tokens[c], tree.q[c], r, rng, f"tree node {c}")))
            if tried[-1][1].accepted:
                break
            r, kind = residual(r, tree.q[c]), "correction"
        else:
            token = int(rng.categorical(r))
            break
        path.append(c)
        node, r, kind = c, p[c + 1], "bonus"
    return _result(tree, p, path, token, kind, tried)


def _result(tree, p, path, token, kind, tried) -> TreeVerifyResult:
    """The verified branch and its linear view: records per depth reached."""
    leaves = tree.leaves()
    b = next((i for i, leaf in enumerate(leaves) if tree.path(leaf)[: len(path)] == path), 0)
    nodes = tree.path(leaves[b]) if leaves else []
    by_node = dict(tried)
    records = [by_node[c] for c in path]
    if kind == "correction":                       # every child of the last node was rejected
        records.append(by_node[nodes[len(path)]])
    rows = [0] + [c + 1 for c in nodes]
    tokens = [tree.tokens[c] for c in nodes]
    alpha = alphas(p[rows], tree.q[nodes], tokens) if nodes else ()
    linear = VerifyResult(len(path), token, kind, tuple(records), alpha)
    return TreeVerifyResult(tuple(path), token, kind, tuple(tried), b, len(leaves), linear)



def tree_step(target: Session, drafter: Drafter, ctx: Sequence[int], n_max: int, k: int,
              params: SamplerParams, rng: Rng, timer: StepTimer,
              guard: Unconstrained) -> Generator[EvalTree, np.ndarray, StepResult]:
    """One multi-candidate step: draft up to k branches of at most n_max tokens, one target
    pass over the tree rooted at the last token (target.eval_tree), walk it (verify_tree),
    keep the accepted path in the target cache (target.commit_path).  The result is the
    verified branch's: its tokens, q rows and p rows (n+1, V)."""
    tree = drafter.propose_tree(ctx, n_max, k, rng) if n_max > 0 else DraftTree.of(Draft.empty(target.n_vocab))
    depth = max((len(tree.path(i)) for i in range(len(tree.tokens))), default=0)
    if depth > n_max or len(tree.leaves()) > k:
        raise ValueError(f"drafter proposed a tree of depth {depth} with {len(tree.leaves())} "
                         f"branches, at most {n_max} and {k} were asked for")
    tree = guard.cut_tree(tree)                               # a grammar: forbidden one-hot nodes pruned
    timer.lap("draft")
    logits = yield EvalTree(target, [ctx[-1], *tree.tokens], [-1, *(a + 1 for a in tree.parents)])
    p = probs_rows(guard.masked(logits), params)              # (n+1, V) row 0: after ctx
    res = verify_tree(tree, p, rng)
    target.commit_path([0, *(c + 1 for c in res.path)])      # ctx + the accepted path
    guard.settle_path([tree.tokens[c] for c in res.path], res.next_token)
    timer.lap("verify")
    nodes = tree.path(tree.leaves()[res.branch]) if tree.tokens else []
    return StepResult(res.linear, tuple(tree.tokens[c] for c in nodes), tree.q[nodes],
                      p[[0, *(c + 1 for c in nodes)]], tree.source, len(tree.tokens), target.routing(),
                      res.branch, res.n_branches)
