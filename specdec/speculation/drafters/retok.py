"""RetokenizingDrafter: a draft model with another tokenizer drafts for the target through text.

p is always the target's distribution, q the draft's.

The draft model's ids name other strings than the target's, so it cannot propose target ids
directly.  It runs on its own tokenization of the same text, and the text it drafts is spelled
again in target ids:

  1. the target context (ids) -> the bytes B it spells, kept incrementally (`IdText`);
  2. B -> the draft vocabulary's ids for it, re-encoding only the tail that changed, from a
     safe point before the change (`TextTokens`); the draft model's session holds those
     ids and is rolled back to their common prefix with its cache after every step;
  3. the draft model drafts GREEDILY, token by token, until its text D spells n_max target
     ids by the rule of step 4 (at most DRAFT_FACTOR * n_max + 1 draft tokens);
  4. the tail of B from a safe point, then D, is encoded with the target's tokenizer, so
     that merges across the boundary come out as the target's tokenizer makes them; the
     target ids after the end of B are kept (one straddling B's end is spelled again from
     there); an incomplete UTF-8 character at the end of D is cut first, and the last id is
     dropped unless it cannot change (a special token): more text could still merge into it
     (`continuation`);
  5. up to n_max of those ids are proposed, each with a one-hot q row.

Why the output law is exact.  The proposal is a deterministic function of the context (and
of the drafter's state, itself a function of the earlier contexts): no random draw is made.
So q_i, one-hot on the proposed x_i, is exactly the law x_i was drawn from given everything
before the step: x_i ~ q_i holds.  Speculative sampling emits p's law for ANY q as long as
x ~ q (Leviathan et al. 2023, Appendix A.1; docs/speculative.md): a one-hot q is accepted
with probability p_i(x_i) and otherwise corrected from normalize(max(0, p_i - q_i)), p_i
without x_i.  This holds for greedy targets (p one-hot: "accept while it is the argmax") and
for sampling targets alike; a bad retokenization costs acceptance, never correctness.

Greedy drafts only.  A sampled draft token would make the proposal random, and its q over
TARGET ids would be the law of the target ids its random text re-encodes to: a sum over every
draft-token sequence spelling a text, which nothing here can compute.  So the draft model
drafts its argmax whatever the target's sampler is (the target's own sampling is untouched).

Safe points (`last_safe_point`): byte positions where every byte-level BPE pre-tokenizer in
specdec.text.tokenizer splits, seen from the three bytes around them: after a newline before a
non-space, or at a space between a non-space and an ASCII letter.  Nothing on either side of
one merges across it, so encoding a text piece by piece from safe points gives the ids of
encoding it whole (for BPE vocabularies whose special-token texts hold no such point; for
SentencePiece ones it is a close approximation), and the tail from one is all that has to be
encoded again when text is appended after it.  No safe point within SAFE_LOOKBACK bytes: the
re-encoding starts BACK tokens before the change instead.
"""
from __future__ import annotations

from bisect import bisect_right
from typing import Sequence

import numpy as np

from ...generation.interfaces import Session
from ...generation.sampling import Rng, top_prob
from ...text.vocab import ATTR_BYTE, ATTR_CONTROL, ATTR_NORMAL, ATTR_UNKNOWN, ATTR_USER_DEFINED
from ..policies import check_draft_p
from .base import Draft, Drafter
from .mirror import CacheMirror, common_prefix

DRAFT_FACTOR = 2        # at most DRAFT_FACTOR * n_max + 1 draft tokens per proposal
SAFE_LOOKBACK = 256     # bytes searched back for a safe point
BACK = 4                # tokens re-encoded before a change when there is no safe point

_SPACE = frozenset(b" \t\n\r\f\v")
_LETTER = frozenset(b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ")


def last_safe_point(data: bytes, end: int) -> int | None:
    """The largest safe point i of data[:end] (module docstring): i + 1 < end, within
    SAFE_LOOKBACK bytes of end; None if there is none."""
    for i in range(min(end, len(data)) - 2, max(0, end - SAFE_LOOKBACK), -1):
        prev, cur = data[i - 1], data[i]
        if prev == 0x0A and cur not in _SPACE:
            return i
        if cur == 0x20 and prev not in _SPACE and data[i + 1] in _LETTER:
            return i
    return None


def complete_utf8(data: bytes) -> int:
    """len(data) less a trailing incomplete UTF-8 character (a lead byte and fewer
    continuation bytes than it announces); invalid bytes elsewhere are left alone."""
    n = len(data)
    for back in range(1, min(4, n) + 1):
        b = data[n - back]
        if b & 0xC0 == 0x80:                      # a continuation byte: look further back
            continue
        need = 2 if b & 0xE0 == 0xC0 else 3 if b & 0xF0 == 0xE0 else 4 if b & 0xF8 == 0xF0 else 1
        return n - back if back < need else n
    return n


class Spelling:
    """A tokenizer seen as bytes: `encode(data)` -> (ids, ends) for any bytes (runs of valid
    UTF-8 as text, special tokens recognised, no BOS/EOS; any other byte as its single-byte
    token where the vocabulary has one, else skipped), `piece(id)` the bytes an id spells.

    ends[j] is the byte end of ids[j] in data; where a run's ids do not spell it exactly (a
    vocabulary that cannot spell every byte), all of that run's ids end at the run's end."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.pieces = tokenizer.pieces                               # (n,) bytes
        self.byte_ids: dict[int, int] = {}                           # byte -> its own token
        for i, (pc, attr) in enumerate(zip(self.pieces, tokenizer.attrs)):
            if len(pc) == 1 and attr & (ATTR_NORMAL | ATTR_BYTE):
                self.byte_ids.setdefault(pc[0], i)
        # ids that more text can never change: partition() cuts their texts out first
        self.fixed = frozenset(i for i, a in enumerate(tokenizer.attrs)
                               if a & (ATTR_CONTROL | ATTR_USER_DEFINED | ATTR_UNKNOWN))

    def piece(self, token_id: int) -> bytes:
        return self.pieces[token_id] if 0 <= token_id < len(self.pieces) else b""

    def encode(self, data: bytes) -> tuple[list[int], list[int]]:
        ids: list[int] = []
        ends: list[int] = []
        pos, n = 0, len(data)
        while pos < n:
            try:
                text, stop = data[pos:].decode("utf-8"), n
            except UnicodeDecodeError as e:
                stop = pos + e.start
                text = data[pos:stop].decode("utf-8")
            if not text:                                             # a byte that is not UTF-8
                tid = self.byte_ids.get(data[pos])
                if tid is not None:
                    ids.append(tid)
                    ends.append(pos + 1)
                pos += 1
                continue
            run = self.tokenizer.encode(text, special=True, bos=False, eos=False, continued=True)
            run_ends, p = [], pos
            for t in run:
                pc = self.piece(t)
                if data[p:p + len(pc)] != pc:
                    run_ends = [stop] * len(run)
                    break
                p += len(pc)
                run_ends.append(p)
            if run_ends and run_ends[-1] != stop:
                run_ends = [stop] * len(run)
            ids += run
            ends += run_ends
            pos = stop
        return ids, ends


class IdText:
    """The bytes a growing id sequence spells, kept incrementally: `sync(ids)` -> bytes.
    skip_first: an id that spells nothing at position 0 (the target's BOS)."""

    def __init__(self, spelling: Spelling, skip_first: int | None = None):
        self.spelling, self.skip_first = spelling, skip_first
        self.reset()

    def reset(self) -> None:
        self.ids: list[int] = []
        self.ends: list[int] = []                                    # byte end of each id
        self.data = bytearray()

    def sync(self, ids: Sequence[int]) -> bytes:
        m = common_prefix(self.ids, list(ids), len(ids))
        del self.ids[m:], self.ends[m:]
        del self.data[self.ends[-1] if self.ends else 0:]
        for t in ids[m:]:
            t = int(t)
            if self.ids or t != self.skip_first:
                self.data += self.spelling.piece(t)
            self.ids.append(t)
            self.ends.append(len(self.data))
        return bytes(self.data)

    def tail_start(self) -> int:
        """Where encoding the text again may start so that its end tokenizes as in the whole
        text: the last safe point, else the start of the id BACK from the end."""
        s = last_safe_point(self.data, len(self.data))
        if s is not None:
            return s
        return self.ends[-BACK - 1] if len(self.ends) > BACK else 0


class TextTokens:
    """One vocabulary's ids for a changing byte string, encoding again only the tail from a
    safe point before the first changed byte: `sync(data)` -> ids (module docstring)."""

    def __init__(self, spelling: Spelling):
        self.spelling = spelling
        self.reset()

    def reset(self) -> None:
        self.data = b""
        self.ids: list[int] = []
        self.ends: list[int] = []                                    # byte end of each id
        self.n_encoded = 0                                           # bytes encoded, all syncs

    def sync(self, data: bytes) -> list[int]:
        old = self.data
        c = len(old) if data.startswith(old) else _common_bytes(old, data)
        if c == len(data) == len(old):
            return self.ids
        s = last_safe_point(data, c)
        if s is None:                                 # a few tokens before the change
            j = max(0, bisect_right(self.ends, c) - BACK)
            s = self.ends[j - 1] if j else 0
        j = bisect_right(self.ends, s)                # ids that end at or before s stand
        start = self.ends[j - 1] if j else 0
        del self.ids[j:], self.ends[j:]
        ids, ends = self.spelling.encode(data[start:])
        self.ids += ids
        self.ends += [start + e for e in ends]
        self.data = data
        self.n_encoded += len(data) - start
        return self.ids


def _common_bytes(a: bytes, b: bytes) -> int:
    """Length of the longest common prefix of two byte strings (binary search on slices)."""
    lo, hi = 0, min(len(a), len(b))
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


def continuation(target: Spelling, tail: bytes, drafted: bytes) -> list[int]:
    """Target ids spelling a prefix of `drafted` after a context whose text ends with `tail`
    (from a safe point of it): tail + drafted is encoded as one text, the ids after the end
    of tail kept (one that straddles it is spelled again from tail's end on its own), an
    incomplete last character of drafted left out, and the last id dropped unless it is a
    special token (more text could merge into it)."""
    data = tail + drafted
    data = data[: complete_utf8(data)]
    b = len(tail)
    ids, ends = target.encode(data)
    out: list[int] = []
    start = 0
    for t, end in zip(ids, ends):
        if target.piece(t) != data[start:end]:       # the vocabulary could not spell it
            break
        if end > b:
            if start >= b:
                out.append(t)
            else:                                     # a merge across the context's end
                sub, _ = target.encode(data[b:end])
                if b"".join(map(target.piece, sub)) != data[b:end]:
                    break
                out += sub
        start = end
    if out and out[-1] not in target.fixed:
        out.pop()
    return out


class RetokenizingDrafter(Drafter):
    """A draft model of another vocabulary drafting greedily on its own session, its text
    re-encoded into target ids (module docstring: the steps and why the law is exact).

    session: the draft model's Session; draft_tokenizer / target_tokenizer: the two
    specdec.text.tokenizer.Tokenizer; n_vocab: the target's vocabulary size (V of the q rows);
    draft_p: stop drafting when the draft's top probability (plain softmax) is below it.

    Cache discipline: the draft session holds a prefix of the draft ids of the accepted
    text (+ the ids drafted last); after `accept` the text of the new context is encoded
    again from a safe point and the cache truncated to its common prefix with those ids,
    so drafted tokens the target accepted stay cached; `propose` checks the cache against
    the context it is given too, so no state leaks between steps or requests."""

    source = "retok"

    def __init__(self, session: Session, draft_tokenizer, target_tokenizer, n_vocab: int,
                 draft_p: float = 0.0):
        check_draft_p(draft_p)
        self.session, self.draft_p, self.n_vocab = session, float(draft_p), int(n_vocab)
        self.draft, self.target = Spelling(draft_tokenizer), Spelling(target_tokenizer)
        self._eog = draft_tokenizer.eog_ids
        self._bos = [draft_tokenizer.bos_id] if draft_tokenizer.add_bos else []
        self.text = IdText(self.target, target_tokenizer.bos_id if target_tokenizer.add_bos else None)
        self.tokens = TextTokens(self.draft)
        self.cache = CacheMirror(session)             # the draft ids in the draft cache
        self._last: tuple[list[int], tuple[int, ...]] | None = None   # (context, proposed)

    def reset(self) -> None:
        self.cache.reset()
        self.text.reset()
        self.tokens.reset()
        self._last = None

    def draft_ids(self, context_ids: Sequence[int]) -> list[int]:
        """The draft vocabulary's ids for the context's text (BOS first where it adds one)."""
        return self._bos + self.tokens.sync(self.text.sync(context_ids))

    def propose(self, context_ids: Sequence[int], n_max: int, rng: Rng) -> Draft:
        self._last = None
        if n_max <= 0:
            return Draft.empty(self.n_vocab, self.source)
        dctx = self.draft_ids(context_ids)
        # room: the draft context and every drafted token but the last must fit its cache
        k = min(DRAFT_FACTOR * n_max + 1, self.session.n_ctx - len(dctx) + 1)
        if k <= 0 or not dctx:
            return Draft.empty(self.n_vocab, self.source)
        keep = self.cache.keep(dctx, len(dctx) - 1)                  # the last id is re-fed
        logits = self.cache.eval(dctx[keep:])                       # (n_logits,)
        tail = bytes(self.text.data[self.text.tail_start():])
        n_drafted, text, ids = 0, b"", []
        while True:
            if self.draft_p > 0.0 and top_prob(logits) < self.draft_p:
                break
            x = int(np.argmax(logits))                               # greedy, lowest id on ties
            n_drafted += 1
            text += self.draft.piece(x)
            ids = continuation(self.target, tail, text)              # target ids it spells so far
            if len(ids) >= n_max or n_drafted >= k or x in self._eog:
                break                                                # the last one is not evaluated
            logits = self.cache.eval([x])
        ids = ids[:n_max]
        ids = ids[: next((j for j, t in enumerate(ids) if t >= self.n_vocab), len(ids))]
        self._last = ([int(t) for t in context_ids], tuple(ids))
        return Draft.one_hot(ids, self.n_vocab, self.source)

    def prefill(self, context_ids: Sequence[int]) -> None:
        """Evaluate the context's draft ids but the last, in the prompt phase."""
        dctx = self.draft_ids(context_ids)
        keep = self.cache.keep(dctx, len(dctx) - 1)
        if keep < len(dctx) - 1 <= self.session.n_ctx:
            self.cache.eval(dctx[keep:-1])

    def accept(self, n_accepted: int, next_token: int) -> None:
        """Encode the accepted text again and keep the cache's common prefix with it."""
        if self._last is None:
            return
        ctx, proposed = self._last
        if not 0 <= n_accepted <= len(proposed):
            raise ValueError(f"accept: {n_accepted} accepted out of {len(proposed)} drafted")
        dctx = self.draft_ids(ctx + list(proposed[:n_accepted]) + [int(next_token)])
        self.cache.keep(dctx, len(dctx))
        self._last = None
