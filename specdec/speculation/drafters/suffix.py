"""Suffix drafting: copy what most often followed the context's longest matching suffix, in the
current context and in a store of earlier requests (q one-hot).

p is always the target's distribution, q the draft's.

`SuffixStore` keeps the token sequences of finished requests (prompt + answer, one *document*
each) under a size limit in tokens, evicting whole documents least recently used first.  It
indexes every n-gram of its anchor lengths (2, 4, 8 by default) by where it ends (a sorted
array of 64-bit n-gram hashes, about 50 bytes per stored token), so the occurrences of the
context's suffix are found by binary search; the frequency of a
continuation is the number of those occurrences that go on with it.  `SuffixDrafter` drafts
from the current context (prompt lookup's n-gram index) and the store together.
"""
from __future__ import annotations

import json
import os
import threading
from array import array
from collections import OrderedDict
from typing import Hashable, NamedTuple, Sequence

import numpy as np

from ...errors import CacheFileError, ConfigError
from ...generation.sampling import Rng
from .base import Draft, Drafter
from .lookup import NgramIndex, PromptLookupDrafter, check_lookup_options

FORMAT = "specdec-suffix-store/1"
DEFAULT_STORE_TOKENS = 1 << 18   # --lookup-cache-size: about 14 MB of documents and index
_STRIDE = 1 << 32                # index entry = doc_id * _STRIDE + end


class SuffixStore:
    """Earlier requests' token sequences, bounded to max_tokens tokens (LRU over documents).

    `add(ids, key=None)` stores a document (keyed: it replaces the document of that key, as a
    conversation's growing transcript does); a document longer than max_tokens keeps its last
    max_tokens ids; older documents are evicted until it fits (least recently added or drafted
    from first).  `matches(ids, n_min, n_max)` -> (m, [(doc, end, doc_id), ...]): the longest
    n_min <= m <= n_max such that the last m ids of `ids` occur in a document (found through
    the longest anchor length <= m, so m >= the smallest anchor), and every occurrence of that
    length (the latest MAX_CANDIDATES among the latest MAX_SCAN of its anchor), oldest first;
    doc[end] is what followed.  Thread-safe (one lock); `version` changes with
    every add or eviction.  `save(path)` writes atomically (temp file + os.replace),
    `SuffixStore.load(path)` reads it back; a file that cannot be read is a CacheFileError."""

    MAX_CANDIDATES = 256      # occurrences of one match kept (the latest)
    MAX_SCAN = 4096           # index entries of one anchor n-gram examined (the latest)

    def __init__(self, max_tokens: int = DEFAULT_STORE_TOKENS, anchors: Sequence[int] = (2, 4, 8),
                 n_vocab: int | None = None, path: str | None = None):
        if int(max_tokens) != max_tokens or max_tokens < 0:
            raise ConfigError(f"--lookup-cache-size must be an integer >= 0, got {max_tokens}")
        if not anchors or min(anchors) < 1:
            raise ConfigError(f"suffix store anchors must be n-gram lengths >= 1, got {anchors}")
        self.max_tokens, self.anchors = int(max_tokens), tuple(sorted(set(int(a) for a in anchors)))
        self.n_vocab, self.path = n_vocab, path
        self.version = 0
        self._lock = threading.RLock()
        self._docs: OrderedDict[int, array] = OrderedDict()   # doc_id -> ids, least recent first
        self._keys: dict[Hashable, int] = {}
        self._key_of: dict[int, Hashable] = {}
        self._keys_sorted = np.zeros(0, np.uint64)            # (E,) n-gram keys, ascending
        self._codes = np.zeros(0, np.int64)                   # (E,) doc_id * _STRIDE + end
        self._n_tokens = self._live = self._dead = 0          # tokens; index entries live / dead
        self._next_id = 0

    # -- documents -------------------------------------------------------------------------
    @property
    def n_tokens(self) -> int:
        return self._n_tokens

    def __len__(self) -> int:
        return len(self._docs)

    def documents(self) -> list[list[int]]:
        """The stored documents, least recently used first."""
        with self._lock:
            return [list(d) for d in self._docs.values()]

    def bind(self, n_vocab: int) -> None:
        """Tie the store to a vocabulary size; CacheFileError if it was made for another."""
        with self._lock:
            if self.n_vocab is None:
                self.n_vocab = int(n_vocab)
            elif self.n_vocab != int(n_vocab):
                raise CacheFileError(f"lookup cache {self.path or '(in memory)'}: made for a vocabulary "
                                     f"of {self.n_vocab} ids, this model has {n_vocab}")

    def add(self, ids: Sequence[int], key: Hashable | None = None) -> None:
        doc = array("i", (int(t) for t in ids))
        if self.max_tokens == 0 or not doc:
            return
        if len(doc) > self.max_tokens:
            doc = doc[len(doc) - self.max_tokens:]
        with self._lock:
            if key is not None and key in self._keys:
                self._evict(self._keys[key])
            while self._docs and self._n_tokens + len(doc) > self.max_tokens:
                self._evict(next(iter(self._docs)))
            did = self._next_id
            self._next_id += 1
            self._docs[did] = doc
            self._n_tokens += len(doc)
            if key is not None:
                self._keys[key], self._key_of[did] = did, key
            self._index_doc(did, doc)
            self.version += 1

    def touch(self, doc_ids) -> None:
        """Mark documents as just used (drafted from): evicted last."""
        with self._lock:
            for did in doc_ids:
                if did in self._docs:
                    self._docs.move_to_end(did)

    def _evict(self, did: int) -> None:
        doc = self._docs.pop(did)
        self._n_tokens -= len(doc)
        n = self._entries(len(doc))
        self._live -= n
        self._dead += n                               # their index entries are skipped from now
        key = self._key_of.pop(did, None)
        if key is not None:
            del self._keys[key]
        self.version += 1
        if self._dead > max(self._live, 4096):
            self._rebuild()

    def _entries(self, n: int) -> int:
        return sum(max(0, n - a) for a in self.anchors)

    def _index_doc(self, did: int, doc: array) -> None:
        """Merge the doc's n-gram entries into the sorted index (equal keys: in add order)."""
        keys, codes = _gram_entries(np.frombuffer(doc, dtype=np.int32), self.anchors, did)
        order = np.argsort(keys, kind="stable")
        keys, codes = keys[order], codes[order]
        at = np.searchsorted(self._keys_sorted, keys, side="right")
        self._keys_sorted = np.insert(self._keys_sorted, at, keys)
        self._codes = np.insert(self._codes, at, codes)
        self._live += len(keys)

    def _rebuild(self) -> None:
        """Drop the entries of evicted documents."""
        live = np.fromiter(self._docs.keys(), dtype=np.int64, count=len(self._docs))
        keep = np.isin(self._codes // _STRIDE, live)
        self._keys_sorted, self._codes = self._keys_sorted[keep], self._codes[keep]
        self._live, self._dead = len(self._codes), 0

    # -- matching --------------------------------------------------------------------------
    def matches(self, ids: Sequence[int], n_min: int, n_max: int) -> tuple[int, list]:
        """(m, occurrences): see the class docstring; (0, []) when nothing matches."""
        L = len(ids)
        with self._lock:
            for a in reversed(self.anchors):
                if a > n_max or a > L:
                    continue
                h = np.uint64(_gram_key(ids[L - a:]))
                lo = int(np.searchsorted(self._keys_sorted, h, side="left"))
                hi = int(np.searchsorted(self._keys_sorted, h, side="right"))
                need, found = max(a, n_min), []
                for code in self._codes[max(lo, hi - self.MAX_SCAN):hi][::-1].tolist():   # latest first
                    did, e = divmod(code, _STRIDE)
                    doc = self._docs.get(did)
                    if doc is None:
                        continue
                    m, lim = 0, min(n_max, e, L)
                    while m < lim and doc[e - 1 - m] == ids[L - 1 - m]:
                        m += 1
                    if m >= need:                     # (m < a: a hash collision)
                        found.append((m, doc, e, did))
                        if len(found) >= self.MAX_CANDIDATES:
                            break
                if found:
                    best = max(f[0] for f in found)
                    return best, [(d, e, did) for m, d, e, did in reversed(found) if m == best]
                if a <= n_min:                        # shorter anchors hold no longer match
                    break
        return 0, []

    # -- files -----------------------------------------------------------------------------
    def save(self, path: str | os.PathLike) -> None:
        """Write the store to path atomically (a temp file beside it, then os.replace)."""
        path = os.fspath(path)
        with self._lock:
            docs = list(self._docs.values())
            meta = json.dumps({"format": FORMAT, "n_vocab": self.n_vocab, "anchors": list(self.anchors)})
        tokens = np.concatenate([np.frombuffer(d, dtype=np.int32) for d in docs]) if docs else np.zeros(0, np.int32)
        lengths = np.array([len(d) for d in docs], dtype=np.int64)
        tmp = f"{path}.tmp-{os.getpid()}"
        try:
            with open(tmp, "wb") as f:
                np.savez(f, meta=np.array(meta), tokens=tokens, lengths=lengths)
            os.replace(tmp, path)
        except OSError as e:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise CacheFileError(f"lookup cache {path}: cannot write it ({e.strerror or e})") from None

    @classmethod
    def load(cls, path: str | os.PathLike, max_tokens: int = DEFAULT_STORE_TOKENS) -> "SuffixStore":
        """The store saved at path, at most max_tokens of it (the most recently used)."""
        path = os.fspath(path)
        try:
            with np.load(path, allow_pickle=False) as z:
                meta = json.loads(str(z["meta"]))
                tokens, lengths = z["tokens"], z["lengths"]
            if not isinstance(meta, dict) or meta.get("format") != FORMAT:
                raise ValueError("not a specdec suffix store")
            n_vocab = meta.get("n_vocab")
            if (tokens.ndim != 1 or lengths.ndim != 1 or tokens.dtype != np.int32
                    or lengths.dtype.kind != "i" or (lengths < 0).any()
                    or int(lengths.sum()) != tokens.size or (tokens.size and tokens.min() < 0)
                    or (n_vocab is not None and tokens.size and tokens.max() >= n_vocab)):
                raise ValueError("its arrays are inconsistent")
            store = cls(max_tokens, anchors=tuple(int(a) for a in meta["anchors"]),
                        n_vocab=None if n_vocab is None else int(n_vocab), path=path)
        except CacheFileError:
            raise
        except ConfigError:
            raise
        except OSError as e:
            raise CacheFileError(f"lookup cache {path}: cannot read it ({e.strerror or e})") from None
        except Exception as e:                        # noqa: BLE001 - zip, JSON, key or value errors
            raise CacheFileError(f"lookup cache {path}: not a readable specdec suffix store "
                                 f"({str(e).splitlines()[0] if str(e) else type(e).__name__})") from None
        offsets = np.concatenate([[0], np.cumsum(lengths)])
        for i in range(len(lengths)):                 # least recently used first, as saved
            store.add(tokens[offsets[i]: offsets[i + 1]].tolist())
        return store


_MUL = np.uint64(0x9E3779B97F4A7C15)


def _gram_entries(seq: np.ndarray, anchors: Sequence[int], did: int) -> tuple[np.ndarray, np.ndarray]:
    """(keys, codes) of every n-gram of each anchor length a that ends at e, a <= e < len(seq)
    (it has a continuation seq[e]): key = _gram_key(seq[e - a: e]), code = did * _STRIDE + e."""
    keys, codes = [], []
    s = seq.astype(np.uint64) + np.uint64(1)      # (T,)
    T = len(seq)
    for a in anchors:
        n = T - a
        if n <= 0:
            continue
        h = np.full(n, a, dtype=np.uint64)         # (n,) polynomial hash mod 2**64
        for i in range(a):
            h = h * _MUL + s[i: i + n]
        keys.append(h)
        codes.append(did * _STRIDE + np.arange(a, T, dtype=np.int64))
    if not keys:
        return np.zeros(0, np.uint64), np.zeros(0, np.int64)
    return np.concatenate(keys), np.concatenate(codes)


def _gram_key(gram: Sequence[int]) -> int:
    """The index key of one n-gram, as _gram_entries computes it."""
    h, mul = len(gram), int(_MUL)
    for t in gram:
        h = (h * mul + int(t) + 1) & 0xFFFFFFFFFFFFFFFF
    return h


class SuffixMatch(NamedTuple):
    """A suffix-drafter match: n tokens matched; sources: (doc, end, doc_id) of each
    occurrence, oldest first (doc None: the current context, extended by the draft)."""
    n: int
    sources: tuple


class SuffixDrafter(Drafter):
    """Drafts by copying the most frequent continuation of the context's longest matching
    suffix, over the current context and a SuffixStore of earlier requests.

    Rule: m = the longest suffix of the context, ngram_min <= m <= ngram_max tokens, with an
    earlier occurrence in the context or in a stored document (the store finds suffixes of at
    least its smallest anchor length); the occurrences of that length are the candidates.  The
    draft is built token by token: each candidate still in the run votes for what followed it;
    the most voted token is drafted (ties: the latest occurrence) and the candidates that
    agree stay in the run.  The run stops where the votes branch — after the first token,
    before a token that no more than min_share of the remaining candidates continue with
    (default 0.5: it needs a strict majority) — or where no candidate goes on, and after
    copy_ratio · m tokens (lookup's cap, 0: n_max).  An
    occurrence in the context may overlap the draft (a period continues), as in lookup.

    q rows are one-hot on the drafted tokens, which are a deterministic function of the
    context and the store's content (never of the rng), so each is exactly "x ~ q" and
    verification keeps the target's law.  `key` is 'suffix/<bucket of m>' like lookup's.
    store None: a store of its own (the context only, until requests are added)."""

    source = "suffix"
    BUCKETS = PromptLookupDrafter.BUCKETS
    MAX_CONTEXT_CANDIDATES = 256

    def __init__(self, n_vocab: int, store: SuffixStore | None = None, ngram_max: int = 16,
                 ngram_min: int = 2, copy_ratio: float = 1.0, min_share: float = 0.5):
        check_lookup_options(ngram_min, ngram_max, copy_ratio)
        if not 0.0 <= min_share < 1.0:
            raise ConfigError(f"suffix drafter: min_share must be in [0, 1), got {min_share}")
        self.n_vocab, self.ngram_min, self.ngram_max = int(n_vocab), int(ngram_min), int(ngram_max)
        self.copy_ratio, self.min_share = float(copy_ratio), float(min_share)
        self.store = store if store is not None else SuffixStore()
        self.store.bind(self.n_vocab)
        self.index = NgramIndex(self.ngram_min, self.ngram_max)

    def reset(self) -> None:
        self.index.reset()

    def key(self, context_ids: Sequence[int]) -> str:
        return self.key_of(self.match(context_ids))

    def key_of(self, hit: SuffixMatch | None) -> str:
        if hit is None:
            return f"{self.source}/none"
        return f"{self.source}/" + next(name for lo, name in self.BUCKETS if hit.n >= lo)

    def match(self, context_ids: Sequence[int]) -> SuffixMatch | None:
        L = len(context_ids)
        self.index.sync(context_ids, L - 1)          # occurrences that end before the suffix does
        ids = self.index.ids
        n, found = 0, []
        for k in range(min(self.ngram_max, L - 1), self.ngram_min - 1, -1):
            ends = self.index.ends(tuple(ids[L - k:]))
            if ends:
                n, found = k, [(None, e, None) for e in ends[-self.MAX_CONTEXT_CANDIDATES:]]
                break
        m, stored = self.store.matches(ids, self.ngram_min, self.ngram_max)
        if m > n:
            n, found = m, stored
        elif m == n and m:
            found = stored + found                    # the context is the latest
        return SuffixMatch(n, tuple(found)) if n else None

    def copy_len(self, hit: SuffixMatch, n_max: int) -> int:
        return n_max if self.copy_ratio == 0 else min(n_max, max(1, int(self.copy_ratio * hit.n)))

    def tokens(self, context_ids: Sequence[int], n_max: int) -> list[int]:
        """The ids `propose` drafts after this context (empty without a match)."""
        hit = self.match(context_ids) if n_max > 0 else None
        if hit is None:
            return []
        ids, L = self.index.ids, len(context_ids)
        run, out = list(hit.sources), []
        for k in range(self.copy_len(hit, n_max)):
            votes: dict[int, int] = {}
            latest: dict[int, int] = {}
            nxt = []
            for i, (doc, e, did) in enumerate(run):
                j = e + k
                if doc is None:
                    t = ids[j] if j < L else out[j - L]      # j - L < k: the draft reads itself
                elif j < len(doc):
                    t = doc[j]
                else:
                    continue                                  # that document ends here
                nxt.append((t, doc, e, did))
                votes[t] = votes.get(t, 0) + 1
                latest[t] = i
            if not votes:
                break
            t = max(votes, key=lambda x: (votes[x], latest[x]))
            if (k and votes[t] <= self.min_share * len(nxt)) or not 0 <= t < self.n_vocab:
                break
            out.append(t)
            run = [(d, e, did) for x, d, e, did in nxt if x == t]
        if out:
            self.store.touch({did for _, _, did in run if did is not None})
        return out

    def propose(self, context_ids: Sequence[int], n_max: int, rng: Rng) -> Draft:
        return Draft.one_hot(self.tokens(context_ids, n_max), self.n_vocab, self.source)
