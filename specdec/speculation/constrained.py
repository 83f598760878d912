"""Speculative decoding under a constraint (a grammar, a JSON schema): the one place where a
verification pass meets the grammar.  p is always the target's distribution, q the draft's.

The law to keep is plain constrained sampling's: at every position, the target's logits with
the forbidden ids at -inf, then the sampler's filters and temperature (generation/plain.py;
llama.cpp applies its grammar sampler first too), i.e. the masked, renormalised p.  So:

1. Drafts are masked where they are proposed.  A drafter that samples masks and renormalises
   its q itself (Drafter.constrain: ModelDrafter), so it never drafts a forbidden token.  A
   one-hot draft (lookup, suffix, prediction, forced tokens, retokenized, greedy trees) is a
   function of the context: `draft_under` cuts it at its first forbidden token, still a
   function of the context, still exact.  A sampled token that is forbidden all the same (a
   drafter that ignores the constraint) is kept as the last drafted position: p(x) = 0
   rejects it surely and the residual norm(max(0, p - q)) is taken with the q it was really
   drawn from; cutting it away instead would condition x on being allowed, a law other than
   q, and break exactness.
2. The matcher is advanced along the drafted tokens to give the mask of every row of the
   pass (row i: after the first i drafted tokens), each row's logits masked before warping.
3. After verification it is rolled back to the accepted tokens and advanced by the token
   sampled after them (`settle`).

Tree drafts are handled node by node the same way (`tree_under`): the mask of node i's row is
the state after its root-to-i path; forbidden one-hot nodes are pruned with their subtrees.

The steps (speculative.linear_step, tree_verify.tree_step) see all of this as one object,
`Constrained` (cut, masked, settle), or without a constraint its null counterpart
`Unconstrained`, which changes nothing (`step_constraint` picks).
"""
from __future__ import annotations

import numpy as np

from ..generation.constraint import Constraint, masked
from .drafters.base import Draft, DraftTree


def _one_hot_at(q_row: np.ndarray, x: int) -> bool:
    return float(q_row[x]) == 1.0


def draft_under(draft: Draft, c: Constraint) -> tuple[Draft, np.ndarray, int]:
    """(the draft as verified, masks (n+1, V) bool for the pass's rows, tokens pushed).

    The constraint is left advanced by `pushed` tokens (the allowed drafted ones): `settle`
    rolls it back.  Row n's mask follows a forbidden last token only when that token is
    rejected surely; it is then never used, and repeats the row before it."""
    masks = [c.mask()]                                         # row 0: after the context
    pushed, keep = 0, len(draft.tokens)
    for i, x in enumerate(draft.tokens):
        if masks[-1][x] and x not in c.eos_ids:
            c.advance(x)
            pushed += 1
            masks.append(c.mask())
            continue
        if masks[-1][x]:                                       # an end token: nothing follows it
            keep = i + 1
        elif _one_hot_at(draft.q[i], x):                       # a function of the context: cut
            keep = i
        else:                                                  # drawn from q: verified, rejected surely
            keep = i + 1
        if keep == i + 1:
            masks.append(masks[-1])
        break
    if keep < len(draft.tokens):
        draft = Draft(draft.tokens[:keep], draft.q[:keep], draft.source, draft.catchup_s)
    return draft, np.stack(masks[: keep + 1]), pushed


def settle(c: Constraint, tokens: tuple[int, ...], pushed: int, accepted: int, next_token: int) -> None:
    """After verification of the drafted `tokens`: keep the first `accepted` of the `pushed`
    ones, then the sampled one (an accepted end token ends it all: generation stops there)."""
    if accepted > pushed:
        c.advance(tokens[pushed])
        return
    c.rollback(pushed - accepted)
    c.advance(next_token)


def tree_under(tree: DraftTree, c: Constraint) -> tuple[DraftTree, np.ndarray]:
    """(the tree as verified, masks (n+1, V) bool: row 0 after the context, row i+1 after node
    i's path).  The constraint is left as it was."""
    m0 = c.mask()
    keep: list[int] = []                                       # old node ids kept, in order
    row: dict[int, np.ndarray] = {-1: m0}                      # old node -> mask after its path
    open_: set[int] = {-1}                                     # nodes whose children may be drafted on
    path: list[int] = []                                       # old nodes the constraint is advanced along
    for i, (x, a) in enumerate(zip(tree.tokens, tree.parents)):
        if a not in open_:
            continue
        target = tree.path(a) if a >= 0 else []
        n_common = 0
        while n_common < min(len(path), len(target)) and path[n_common] == target[n_common]:
            n_common += 1
        c.rollback(len(path) - n_common)
        for node in target[n_common:]:
            c.advance(tree.tokens[node])
        path = target
        if row[a][x]:
            keep.append(i)
            if x in c.eos_ids:
                row[i] = row[a]
            else:
                c.advance(x)
                row[i] = c.mask()
                c.rollback(1)
                open_.add(i)
        elif not _one_hot_at(tree.q[i], x):                    # sampled: verified, rejected surely
            keep.append(i)
            row[i] = row[a]
    c.rollback(len(path))
    new = {old: j for j, old in enumerate(keep)}
    pruned = DraftTree(tuple(tree.tokens[i] for i in keep),
                       tuple(new[tree.parents[i]] if tree.parents[i] >= 0 else -1 for i in keep),
                       tree.q[keep] if keep else tree.q[:0], tree.source)
    return pruned, np.stack([m0, *(row[i] for i in keep)])


def settle_path(c: Constraint, tokens: list[int], next_token: int) -> None:
    """After tree verification: the accepted path's tokens, then the sampled one."""
    for x in [*tokens, next_token]:
        c.advance(x)
        if x in c.eos_ids:
            return


class Unconstrained:
    """The null constraint of a speculative step: every token allowed, nothing to cut, mask or
    settle.  `Constrained` is the same steps under a grammar."""
    constraint = None               # what drafters are told (Drafter.constrain)
    eos_ids: frozenset[int] = frozenset()
    done = False                    # only the end of generation may follow

    def cut(self, draft: Draft) -> Draft:
        return draft

    def cut_tree(self, tree: DraftTree) -> DraftTree:
        return tree

    def masked(self, logits: np.ndarray) -> np.ndarray:
        return logits

    def settle(self, n_accepted: int, next_token: int) -> None:
        pass

    def settle_path(self, tokens: list[int], next_token: int) -> None:
        pass


class Constrained(Unconstrained):
    """One request's Constraint through its steps: `cut` a draft (draft_under) or `cut_tree`
    a tree (tree_under), keeping the masks of the pass's rows; `masked` the pass's logits with
    them; `settle` / `settle_path` the matcher after verification."""

    def __init__(self, constraint: Constraint):
        self.constraint, self.eos_ids = constraint, constraint.eos_ids
        self._masks: np.ndarray | None = None       # (n+1, V) bool, the current step's rows
        self._tokens: tuple[int, ...] = ()          # the current step's drafted tokens
        self._pushed = 0                            # of which the matcher was advanced along

    @property
    def done(self) -> bool:
        return self.constraint.done

    def cut(self, draft: Draft) -> Draft:
        draft, self._masks, self._pushed = draft_under(draft, self.constraint)
        self._tokens = draft.tokens
        return draft

    def cut_tree(self, tree: DraftTree) -> DraftTree:
        tree, self._masks = tree_under(tree, self.constraint)
        return tree

    def masked(self, logits: np.ndarray) -> np.ndarray:
        return masked(logits, self._masks)

    def settle(self, n_accepted: int, next_token: int) -> None:
        settle(self.constraint, self._tokens, self._pushed, n_accepted, next_token)

    def settle_path(self, tokens: list[int], next_token: int) -> None:
        settle_path(self.constraint, tokens, next_token)


def step_constraint(constraint: Constraint | None) -> Unconstrained:
    """The steps' view of a request's constraint (None: the null one)."""
    return Unconstrained() if constraint is None else Constrained(constraint)
