"""The drafter interface: a `Draft` (tokens and the q rows they were drawn from) and the
`Drafter` base class every drafter derives from (see the package docstring).

p is always the target's distribution, q the draft's.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from ...generation.sampling import Rng


@dataclass(frozen=True)
class Draft:
    tokens: tuple[int, ...]     # (n,) drafted ids
    q: np.ndarray               # (n, V) float64: q[i] is the distribution tokens[i] was drawn from
    source: str = "none"        # which drafter proposed: 'model' | 'prompt-lookup' | ...
    catchup_s: float = 0.0      # seconds of it spent catching a draft cache up on the context (a
    #                             window's prompt pass, the tokens of other drafters' steps): not a
    #                             cost per drafted token, so the length policy leaves it out

    @staticmethod
    def empty(n_vocab: int, source: str = "none") -> "Draft":
        return Draft((), np.zeros((0, n_vocab), dtype=np.float64), source)

    @staticmethod
    def one_hot(tokens: Sequence[int], n_vocab: int, source: str = "none") -> "Draft":
        """A deterministic draft: each token drawn from the point mass on itself."""
        return Draft(tuple(int(t) for t in tokens), one_hot_rows(tokens, n_vocab), source)


def one_hot_rows(tokens: Sequence[int], n_vocab: int) -> np.ndarray:
    """(n, V) float64 rows, row i the point mass on tokens[i] (q of a deterministic drafter)."""
    q = np.zeros((len(tokens), n_vocab), dtype=np.float64)
    q[np.arange(len(tokens)), np.asarray(tokens, dtype=np.int64)] = 1.0
    return q


@dataclass(frozen=True)
class DraftTree:
    """k candidate continuations as one token tree (multi-candidate verification).

    Node i holds tokens[i], drawn from q[i] given the context and its ancestors' tokens;
    parents[i] = -1 (it follows the context's last token) or an earlier node.  The children
    of a node are drawn independently of each other (x_j ~ q_j, each q_j fixed before any of
    them is drawn: one-hot for deterministic drafts, or one shared q for i.i.d. draws), and
    each child's subtree given its token alone.  A linear Draft is the tree of one branch."""
    tokens: tuple[int, ...]     # (n,) drafted ids
    parents: tuple[int, ...]    # (n,) -1 or an earlier node
    q: np.ndarray               # (n, V) float64: q[i] is the distribution tokens[i] was drawn from
    source: str = "none"

    @staticmethod
    def of(draft: "Draft") -> "DraftTree":
        """A linear draft as a one-branch tree."""
        return DraftTree(draft.tokens, tuple(range(-1, len(draft.tokens) - 1)), draft.q, draft.source)

    def children(self, node: int) -> list[int]:
        """The children of node (-1: of the root), in node order."""
        return [i for i, a in enumerate(self.parents) if a == node]

    def path(self, node: int) -> list[int]:
        """The nodes from a root down to node."""
        out = []
        while node >= 0:
            out.append(node)
            node = self.parents[node]
        return out[::-1]

    def leaves(self) -> list[int]:
        """The branches: nodes without children, in node order."""
        inner = set(self.parents)
        return [i for i in range(len(self.tokens)) if i not in inner]


class Drafter:
    """Base of every drafter.  Subclasses implement `propose` and set `n_vocab` (V of the q
    rows: the target's vocabulary size); the hooks default to doing nothing."""
    n_vocab: int
    source = "none"             # Draft.source of what it proposes
    constraint = None           # generation.constraint.Constraint the drafts must fit (or None)

    def propose(self, context_ids: Sequence[int], n_max: int, rng: Rng) -> Draft:
        """0 <= n <= n_max tokens after the context, each with the q row it was drawn from."""
        raise NotImplementedError

    def propose_tree(self, context_ids: Sequence[int], n_max: int, k: int, rng: Rng) -> DraftTree:
        """Up to k branches of at most n_max tokens each, as a DraftTree (see its rules on
        how the children of a node are drawn).  Default: the linear `propose`, one branch."""
        return DraftTree.of(self.propose(context_ids, n_max, rng))

    def accept(self, n_accepted: int, next_token: int) -> None:
        """The target verified the last proposal: n_accepted of it stand, then next_token
        (after a tree: n_accepted tokens of the branch that won)."""

    def reset(self) -> None:
        """Forget every request (a new one follows)."""

    def constrain(self, constraint) -> None:
        """Draft under this constraint (generation.constraint.Constraint, at the state after
        the context each `propose` is given) until told otherwise; None: unconstrained.  A
        drafter that samples (q not one-hot) masks and renormalises its q with it, advancing
        the constraint along its own draft and rolling it back before returning; a drafter of
        one-hot drafts may ignore it (the loop cuts such a draft at its first forbidden token,
        speculation/constrained.py).  Wrappers pass it on to what they wrap."""
        self.constraint = constraint

    def attach(self, target) -> None:
        """The target session (interfaces.Session) this request runs on, told before its
        prompt pass: a drafter that reads the target's passes keeps it (mtp.MTPDrafter: the
        target's hidden states).  Default: the drafters this one wraps (its `inner`, `model`,
        `fallback` or `lookup`) are told; nothing else."""
        for name in ("inner", "model", "fallback", "lookup"):
            wrapped = getattr(self, name, None)
            if isinstance(wrapped, Drafter):
                wrapped.attach(target)

    def prefill(self, context_ids: Sequence[int]) -> None:
        """The drafter's share of the prompt phase (timed with the target's prefill)."""

    def key(self, context_ids: Sequence[int]) -> str | None:
        """The kind of draft the next `propose` on this context makes (a function of the
        context alone), for per-kind policy statistics; None: no kinds."""
        return None
