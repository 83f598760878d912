"""Prompt lookup: draft by copying what followed the context's last n-gram earlier in the
context (q one-hot), over an incremental n-gram index.

p is always the target's distribution, q the draft's.
"""
from __future__ import annotations

import bisect
from typing import NamedTuple, Sequence

from ...errors import ConfigError
from ...generation.sampling import Rng
from .base import Draft, DraftTree, Drafter, one_hot_rows


class NgramIndex:
    """Where each n-gram (n_min <= n <= n_max) of a growing token sequence last ended.

    `sync(ids, upto)` brings the index to `ids`, indexing the n-grams that end at or before
    position `upto` (exclusive end index); when `ids` does not extend what was indexed (a new
    request, a rolled-back context) it starts over.  Appending k tokens costs O(k * n_max)
    dict updates; the prefix check costs one list comparison.  `find(gram)` -> the end of its
    latest indexed occurrence, or None; `find_before(gram, limit)` -> the latest one ending at
    or before limit; `ends(gram)` -> all of them (every occurrence is kept, in order)."""

    def __init__(self, n_min: int, n_max: int):
        self.n_min, self.n_max = n_min, n_max
        self.ids: list[int] = []
        self._ends: dict[tuple[int, ...], list[int]] = {}   # n-gram -> exclusive ends, ascending
        self._upto = 0                                # n-grams ending at <= _upto are indexed

    def reset(self) -> None:
        self.ids, self._ends, self._upto = [], {}, 0

    def sync(self, ids: Sequence[int], upto: int) -> None:
        m = len(self.ids)
        if len(ids) < m or list(ids[:m]) != self.ids:
            self.reset()
            m = 0
        self.ids.extend(int(t) for t in ids[m:])
        if upto < self._upto:                         # never un-index: rebuild (rare)
            self._ends, self._upto = {}, 0
        seq, ends = self.ids, self._ends
        for e in range(self._upto + 1, upto + 1):
            for n in range(self.n_min, min(self.n_max, e) + 1):
                ends.setdefault(tuple(seq[e - n: e]), []).append(e)
        self._upto = max(self._upto, upto)

    def find(self, gram: tuple[int, ...]) -> int | None:
        e = self._ends.get(gram)
        return e[-1] if e else None

    def ends(self, gram: tuple[int, ...]) -> list[int]:
        """Every indexed end of gram, ascending (do not modify)."""
        return self._ends.get(gram, [])

    def find_before(self, gram: tuple[int, ...], limit: int) -> int | None:
        e = self._ends.get(gram)
        if not e:
            return None
        i = bisect.bisect_right(e, limit)
        return e[i - 1] if i else None


def check_lookup_options(ngram_min: int, ngram_max: int, copy_ratio: float) -> None:
    """ConfigError unless 1 <= ngram_min <= ngram_max and copy_ratio is 0 or >= 1/ngram_max."""
    if not 1 <= ngram_min <= ngram_max:
        raise ConfigError(f"--lookup-ngram-min/max: need 1 <= min <= max, got {ngram_min}, {ngram_max}")
    if not (copy_ratio == 0 or copy_ratio >= 1 / ngram_max):        # (NaN fails both)
        raise ConfigError(f"--lookup-copy-ratio must be 0 (no cap) or at least 1/ngram_max, got {copy_ratio}")


class Match(NamedTuple):
    """A prompt-lookup match: n tokens matched, the copy starts at src of the context."""
    n: int
    src: int
    resumed: bool = False


class PromptLookupDrafter(Drafter):
    """Drafts by copying: find the context's last n-gram earlier in the context (prompt or
    output), and propose the tokens that followed it.

    Rule: the longest suffix n-gram with an earlier occurrence, n from ngram_max down to
    ngram_min; of its occurrences, the most recent one (the copy nearest in the text; an O(1)
    incremental index).  The copy is LZ77-style and may overlap the tokens it is producing,
    so a periodic suffix (`a b a b`) continues its period.  No match: an empty draft.
    copy_ratio (default 1): a match of n tokens copies at most copy_ratio · n of the n_max
    tokens asked (0: always n_max) — the match length is the evidence of re-typing.

    resume=True (off by default): after an edit breaks a copy, for the smallest
    e <= RESUME_EDIT_MAX such that the context without its last e tokens ends with an n-gram
    of at least RESUME_ANCHOR tokens seen earlier (ending at j), draft what followed the
    source token at j; used when it anchors on a longer n-gram than the suffix rule's match,
    under its own key `prompt-lookup/resume`.

    q rows are one-hot on the copied tokens: the draft is a deterministic function of the
    context, so it is exactly "x ~ q", and verification keeps the target's law (Leviathan et
    al. 2023, Algorithm 1).  Why these rules and what they measured: docs/speculative.md
    ("How much prompt lookup copies", "Prompt lookup across an edit")."""

    source = "prompt-lookup"

    BUCKETS = ((16, "16+"), (8, "8-15"), (5, "5-7"), (3, "3-4"), (1, "1-2"))   # match n -> key
    RESUME_EDIT_MAX = 4       # tokens an edit may have added since the copy broke off
    RESUME_ANCHOR = 4         # shortest n-gram a resumed copy anchors on

    def __init__(self, n_vocab: int, ngram_max: int = 16, ngram_min: int = 2, resume: bool = False,
                 copy_ratio: float = 1.0):
        check_lookup_options(ngram_min, ngram_max, copy_ratio)
        self.n_vocab, self.ngram_min, self.ngram_max = int(n_vocab), int(ngram_min), int(ngram_max)
        self.copy_ratio = float(copy_ratio)
        self.resume = bool(resume) and self.ngram_max >= self.RESUME_ANCHOR
        self.index = NgramIndex(min(self.ngram_min, self.RESUME_ANCHOR) if self.resume else self.ngram_min,
                                self.ngram_max)

    def reset(self) -> None:
        self.index.reset()

    def key(self, context_ids: Sequence[int]) -> str:
        """'prompt-lookup/<n>': the length bucket of the n-gram the next draft copies after
        (longer matches copy longer runs), or 'prompt-lookup/none'."""
        return self.key_of(self.match(context_ids))

    def key_of(self, hit: "Match | None") -> str:
        """The key of a `match` result."""
        if hit is None:
            return f"{self.source}/none"
        if hit.resumed:
            return f"{self.source}/resume"
        return f"{self.source}/" + next(name for lo, name in self.BUCKETS if hit.n >= lo)

    def match(self, context_ids: Sequence[int]) -> "Match | None":
        """Match(n, src, resumed): the n-gram matched (the anchor when resumed) and where the
        copy starts, or None."""
        L = len(context_ids)
        self.index.sync(context_ids, L - 1)          # occurrences that end before the suffix does
        ids = self.index.ids
        hit = None
        for n in range(min(self.ngram_max, L - 1), self.ngram_min - 1, -1):
            end = self.index.find(tuple(ids[L - n:]))
            if end is not None:
                hit = Match(n, end)
                break
        if self.resume and (hit is None or hit.n < self.ngram_max):
            r = self._resumed(ids, L)
            if r is not None and (hit is None or r.n > hit.n):
                return r
        return hit

    def _resumed(self, ids: list[int], L: int) -> "Match | None":
        """The resumed copy (class docstring), or None."""
        for e in range(1, min(self.RESUME_EDIT_MAX, L - self.RESUME_ANCHOR - 1) + 1):
            cut = L - e                               # the context before the e new tokens
            for n in range(min(self.ngram_max, cut - 1), self.RESUME_ANCHOR - 1, -1):
                j = self.index.find_before(tuple(ids[cut - n: cut]), cut - 1)
                if j is not None:
                    return Match(n, j + 1, True) if j + 1 < L else None
        return None

    def copy_len(self, hit: Match, n_max: int) -> int:
        """Tokens to copy after a match: n_max, at most copy_ratio tokens per matched token."""
        return n_max if self.copy_ratio == 0 else min(n_max, max(1, int(self.copy_ratio * hit.n)))

    def tokens(self, context_ids: Sequence[int], n_max: int) -> list[int]:
        """The ids `propose` drafts after this context (empty without a match)."""
        hit = self.match(context_ids) if n_max > 0 else None
        if hit is None:
            return []
        n_max = self.copy_len(hit, n_max)
        ids, L, src = self.index.ids, len(context_ids), hit.src
        tokens: list[int] = []
        for k in range(n_max):                        # src + k < L + k: the copy reads ahead of itself
            i = src + k
            tokens.append(ids[i] if i < L else tokens[i - L])
        return tokens

    def propose_tree(self, context_ids: Sequence[int], n_max: int, k: int, rng: Rng) -> DraftTree:
        """Up to k different continuations as a trie (shared prefixes are one branch): the
        suffix n-gram's occurrences, most recent first (the first is `propose`'s draft), then
        those of shorter n-grams, each copied as `tokens` copies; q one-hot.  A function of
        the context alone, like `propose`."""
        hit = self.match(context_ids) if n_max > 0 else None
        if hit is None or hit.resumed or k <= 1:
            return DraftTree.of(self.propose(context_ids, n_max, rng))
        ids, L = self.index.ids, len(context_ids)
        tokens: list[int] = []
        parents: list[int] = []
        child: dict[tuple[int, int], int] = {}            # (parent, token) -> node
        n_branches = 0
        for n in range(hit.n, self.ngram_min - 1, -1):
            for src in reversed(self.index.ends(tuple(ids[L - n:]))):
                copy = self._copy(ids, L, src, self.copy_len(Match(n, src), n_max))
                node, grew = -1, False
                for t in copy:
                    if (node, t) not in child:
                        child[(node, t)] = len(tokens)
                        tokens.append(t)
                        parents.append(node)
                        grew = True
                    node = child[(node, t)]
                n_branches += grew
                if n_branches >= k:
                    break
            if n_branches >= k:
                break
        return DraftTree(tuple(tokens), tuple(parents), one_hot_rows(tokens, self.n_vocab), self.source)

    @staticmethod
    def _copy(ids: list[int], L: int, src: int, n: int) -> list[int]:
        """n tokens copied from ids[src:] of a context of L ids, reading ahead of itself."""
        out: list[int] = []
        for i in range(src, src + n):
            out.append(ids[i] if i < L else out[i - L])
        return out

    def propose(self, context_ids: Sequence[int], n_max: int, rng: Rng) -> Draft:
        return Draft.one_hot(self.tokens(context_ids, n_max), self.n_vocab, self.source)

    def accept(self, n_accepted: int, next_token: int) -> None:
        pass                                          # the next propose indexes the new tokens
