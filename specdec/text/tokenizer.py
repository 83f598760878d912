"""Text <-> token ids for a GGUF vocabulary, reproducing llama.cpp (llama-vocab.cpp) exactly.

Two vocabulary types, chosen by ``tokenizer.ggml.model``:

- "gpt2" (byte-level BPE): the text is split by the regex sequence of its
  ``tokenizer.ggml.pre`` type (llm_tokenizer_bpe), byte-level encoded, then merged by rank
  (llm_tokenizer_bpe_session).  Built on the ``tokenizers`` library: a ``models.BPE`` over the
  GGUF vocabulary and merges behind a ``Split(Regex, "isolated")`` per llama.cpp regex and a
  ``ByteLevel`` step.  Every regex used here is matched by llama.cpp either with a hand-written
  splitter (unicode_regex_split_custom_gpt2 / _llama3) or with std::regex over text whose
  non-ASCII characters are collapsed to one stand-in per Unicode category
  (unicode_regex_split); for these regexes both give what the Unicode categories of
  ``tokenizers``' Oniguruma engine give.
- "llama" (SentencePiece): score-driven bigram merges with byte fallback, see ``spm.py``.

Before either, special tokens are cut out of the text as tokenizer_st_partition does, and
llama.cpp's load-time rules (llama_vocab::impl::load) decide BOS/EOS, token attributes and
the end-of-generation set.
"""
from __future__ import annotations

import dataclasses
import hashlib
import threading

import codecs
import re
from dataclasses import dataclass
from types import MappingProxyType
from typing import Iterable, Mapping


from ..errors import TokenizerError
from .spm import SpmModel, escape_whitespace
from .vocab import (ATTR_CONTROL, ATTR_NORMAL, ATTR_UNKNOWN, ATTR_USER_DEFINED, PRE_DEFAULT, PRE_TYPES,
                    SPECIAL_ATTRS, TYPE_TO_ATTR, build_bpe, detect_eog, special_heads, token_pieces,
                    special_ids)


_SURROGATE = re.compile("[\ud800-\udfff]")


_BUILT: dict[bytes, "Tokenizer"] = {}      # vocabulary digest -> the Tokenizer built from it
_BUILDING = threading.Lock()


def _vocab_key(meta: Mapping[str, object]) -> bytes:
    """Digest of every tokenizer.* metadata value but the chat templates: equal digests build
    equal tokenizers up to the template (an instruct target and a base draft differ there)."""
    h = hashlib.sha256()
    for key in sorted(k for k in meta if k.startswith("tokenizer.") and not k.startswith("tokenizer.chat_template")):
        h.update(key.encode() + b"\x00" + repr(meta[key]).encode("utf-8", "surrogatepass") + b"\x01")
    return h.digest()


@dataclass(frozen=True, eq=False, repr=False)
class Tokenizer:
    """A GGUF vocabulary as llama.cpp loads it.

    vocab_type "bpe" | "spm"; pre: the tokenizer.ggml.pre name ("" when absent);
    tokens: (n_vocab,) token texts; attrs: (n_vocab,) llama_token_attr bits after llama.cpp's
    load-time overrides; bos_id/eos_id: None when the vocabulary has none; eog_ids: llama.cpp's
    special_eog_ids; add_bos/add_eos: what encode(bos=None, eos=None) adds.
    """
    source: str
    vocab_type: str
    pre: str
    tokens: list[str]
    attrs: tuple[int, ...]
    bos_id: int | None
    eos_id: int | None
    eot_id: int | None
    eog_ids: frozenset[int]
    add_bos: bool
    add_eos: bool
    add_space_prefix: bool
    chat_template: str | None
    specials: tuple[tuple[str, int, int], ...]   # (text, id, attr), longest text first
    special_heads: Mapping[str, tuple[int, ...]]  # first two characters -> indices into specials
    pieces: tuple[bytes, ...]                     # (n_vocab,) token_to_piece(special=true)
    token_to_id: Mapping[str, int]
    backend: object                               # tokenizers.Tokenizer (bpe) | SpmModel (spm)

    @property
    def n_vocab(self) -> int:
        return len(self.tokens)

    def __repr__(self) -> str:
        return (f"<Tokenizer {self.source}: {self.vocab_type} (pre {self.pre!r}), {self.n_vocab} tokens, "
                f"BOS {self.bos_id} (add: {self.add_bos}), EOS {self.eos_id}, EOG {sorted(self.eog_ids)}>")

    # -- construction --------------------------------------------------------------------
    @classmethod
    def from_metadata(cls, meta: Mapping[str, object], source: str) -> Tokenizer:
        """Build from GGUF metadata (key -> value) as llama_vocab::impl::load does;
        `source` names the file in errors.  Metadata of the wrong type (a string where ids
        are, a number where a list is) is a one-line TokenizerError too.  Built once per
        process per vocabulary: a draft of the target's family reuses the target's (its
        backend alone takes about a second for a 150k-token BPE vocabulary)."""
        key = _vocab_key(meta)
        with _BUILDING:                                 # two loads in threads build it once
            if key in _BUILT:
                template = meta.get("tokenizer.chat_template")
                return dataclasses.replace(_BUILT[key], source=source,
                                           chat_template=None if template is None else str(template))
            return cls._build(meta, source, key)

    @classmethod
    def _build(cls, meta: Mapping[str, object], source: str, key: bytes) -> Tokenizer:
        try:
            tok = cls._from_metadata(meta, source)
        except (TypeError, ValueError, KeyError, IndexError, AttributeError, OverflowError) as e:
            raise TokenizerError(f"{source}: malformed tokenizer metadata "
                                 f"({type(e).__name__}: {' '.join(str(e).split())[:120]})") from None
        _BUILT[key] = tok
        return tok

    @classmethod
    def _from_metadata(cls, meta: Mapping[str, object], source: str) -> Tokenizer:
        if "tokenizer.ggml.model" not in meta:
            raise TokenizerError(f"{source}: no tokenizer in the file (tokenizer.ggml.model is missing)")
        model = str(meta["tokenizer.ggml.model"])
        if model not in ("gpt2", "llama"):
            raise TokenizerError(f"{source}: unsupported tokenizer.ggml.model {model!r} "
                                 f"(supported: 'gpt2' byte-level BPE, 'llama' SentencePiece)")
        pre = str(meta.get("tokenizer.ggml.pre", "") or "")
        if model == "gpt2" and pre not in PRE_TYPES:
            raise TokenizerError(f"{source}: unsupported tokenizer.ggml.pre {pre!r} for a 'gpt2' "
                                 f"vocabulary (supported: {', '.join(sorted(k for k in PRE_TYPES if k))})")
        raw = meta.get("tokenizer.ggml.tokens")
        if not isinstance(raw, (list, tuple)) or not raw:
            raise TokenizerError(f"{source}: tokenizer.ggml.tokens is missing or empty")
        n = len(raw)
        # llama_vocab::impl::load: an empty token text becomes "[EMPTY_<id>]"
        tokens = [str(t) if t else f"[EMPTY_{i}]" for i, t in enumerate(raw)]
        token_to_id = dict(zip(tokens, range(n)))
        if len(token_to_id) != n:
            dup = next(t for i, t in enumerate(tokens) if token_to_id[t] != i)
            raise TokenizerError(f"{source}: duplicate token {dup!r} in tokenizer.ggml.tokens")
        types = meta.get("tokenizer.ggml.token_type")
        if types is None:
            attrs = [ATTR_NORMAL] * n
        else:
            if len(types) < n:
                raise TokenizerError(f"{source}: tokenizer.ggml.token_type has {len(types)} entries "
                                     f"for {n} tokens")
            attrs = [TYPE_TO_ATTR[t] if 0 <= t < len(TYPE_TO_ATTR) else 0 for t in map(int, types[:n])]

        is_spm = model == "llama"
        pre_type = PRE_DEFAULT if is_spm else PRE_TYPES[pre]
        ids = special_ids(meta, n, is_spm)
        add_bos = bool(meta.get("tokenizer.ggml.add_bos_token", is_spm or pre_type.add_bos))
        add_eos = bool(meta.get("tokenizer.ggml.add_eos_token", False))
        add_space_prefix = bool(meta.get("tokenizer.ggml.add_space_prefix", is_spm))
        for flag, key in ((add_bos, "bos"), (add_eos, "eos")):
            if flag and ids[key] is None:
                raise TokenizerError(f"{source}: tokenizer.ggml.add_{key}_token is true but the "
                                     f"vocabulary has no {key.upper()} token")
        eog = detect_eog(tokens, token_to_id, attrs, ids)

        # tokenizer_st_partition's cache: CONTROL, USER_DEFINED and UNKNOWN tokens, longest first
        specials = tuple(sorted(((tokens[i], i, a) for i, a in enumerate(attrs)
                                 if a & (ATTR_CONTROL | ATTR_USER_DEFINED | ATTR_UNKNOWN)),
                                key=lambda s: (-len(s[0]), s[1])))
        if is_spm:
            scores = meta.get("tokenizer.ggml.scores")
            scores = [0.0] * n if scores is None else [float(s) for s in scores[:n]]
            if len(scores) < n:
                raise TokenizerError(f"{source}: tokenizer.ggml.scores has {len(scores)} entries for {n} tokens")
            backend: object = SpmModel.build(token_to_id, scores, source)
        else:
            backend = build_bpe(meta, tokens, token_to_id, pre_type, source)
        template = meta.get("tokenizer.chat_template")
        return cls(source=source, vocab_type="spm" if is_spm else "bpe", pre=pre, tokens=tokens,
                   attrs=tuple(attrs), bos_id=ids["bos"], eos_id=ids["eos"], eot_id=ids["eot"],
                   eog_ids=eog, add_bos=add_bos, add_eos=add_eos, add_space_prefix=add_space_prefix,
                   chat_template=None if template is None else str(template), specials=specials,
                   special_heads=special_heads(specials),
                   pieces=token_pieces(tokens, attrs, is_spm), token_to_id=MappingProxyType(token_to_id),
                   backend=backend)

    # -- text -> ids ---------------------------------------------------------------------
    def encode(self, text: str, special: bool = True, bos: bool | None = None,
               eos: bool | None = None, continued: bool = False) -> list[int]:
        """llama_tokenize(text, add_special, parse_special=special).

        special: recognise CONTROL/UNKNOWN token texts (USER_DEFINED ones always are);
        bos/eos: add BOS/EOS; None = as the vocabulary says (add_bos / add_eos).
        continued: the text continues earlier text (a piece of a longer one): SentencePiece
        vocabularies add no space prefix at its start (BPE ones never do)."""
        add_bos = self.add_bos if bos is None else bos
        add_eos = self.add_eos if eos is None else eos
        for flag, tid, name in ((add_bos, self.bos_id, "BOS"), (add_eos, self.eos_id, "EOS")):
            if flag and tid is None:
                raise TokenizerError(f"{self.source}: cannot add {name}: the vocabulary has no {name} token")
        if _SURROGATE.search(text):
            text = _SURROGATE.sub("\ufffd", text)    # llama.cpp sees U+FFFD for what is not UTF-8
        out = [self.bos_id] if add_bos else []
        fragments = self.partition(text, special)
        if self.vocab_type == "spm":
            # llama_vocab::impl::tokenize, SPM: a space goes before text that starts the input or
            # follows a special token when add_space_prefix is set
            prev_special = not continued
            for frag in fragments:
                if isinstance(frag, int):
                    out.append(frag)
                    prev_special = True
                else:
                    if self.add_space_prefix and prev_special:
                        frag = " " + frag
                    out += self.backend.tokenize(escape_whitespace(frag))
                    prev_special = False
        else:
            for frag in fragments:
                if isinstance(frag, int):
                    out.append(frag)
                else:
                    ids = self.backend.encode(frag, add_special_tokens=False).ids
                    if len(self.tokens) in ids:                 # a byte the vocabulary lacks
                        ids = [i for i in ids if i != len(self.tokens)]
                    out += ids
        if add_eos:
            out.append(self.eos_id)
        return out

    def partition(self, text: str, special: bool = True) -> list[str | int]:
        """tokenizer_st_partition: for each special token, longest first, cut every occurrence
        out of the remaining text fragments.  Returns text fragments and token ids in order."""
        fragments: list[str | int] = [text] if text else []
        # only tokens whose first two characters occur in the text can occur in it
        heads = {text[i:i + 2] for i in range(len(text))}
        heads.update(text)
        candidates = sorted(i for h in heads & self.special_heads.keys() for i in self.special_heads[h])
        for tok_text, tid, attr in map(self.specials.__getitem__, candidates):
            if (not special and attr & SPECIAL_ATTRS) or tok_text not in text:
                continue
            split: list[str | int] = []
            for frag in fragments:
                if isinstance(frag, int) or tok_text not in frag:
                    split.append(frag)
                    continue
                for j, part in enumerate(frag.split(tok_text)):
                    if j:
                        split.append(tid)
                    if part:
                        split.append(part)
            fragments = split
        return fragments

    # -- ids -> text ---------------------------------------------------------------------
    def token_bytes(self, token_id: int, special: bool = True) -> bytes:
        """llama_token_to_piece: the bytes a token prints as (special=False: nothing for
        CONTROL and UNKNOWN tokens)."""
        if not 0 <= token_id < len(self.pieces):
            raise TokenizerError(f"{self.source}: token id {token_id} is outside the vocabulary "
                                 f"(0..{len(self.pieces) - 1})")
        if not special and self.attrs[token_id] & SPECIAL_ATTRS:
            return b""
        return self.pieces[token_id]

    def decode(self, ids: Iterable[int], special: bool = True) -> str:
        """The concatenated pieces as text; bytes that are not UTF-8 become U+FFFD."""
        return b"".join(self.token_bytes(int(i), special) for i in ids).decode("utf-8", errors="replace")

    def is_eog(self, token_id: int) -> bool:
        return token_id in self.eog_ids


class StreamDecoder:
    """Incremental decode: push(id) returns only whole UTF-8 characters; a character whose
    bytes are split across tokens is held back until its last byte arrives.  The outputs of
    push() and flush() concatenate to tokenizer.decode(ids)."""

    def __init__(self, tokenizer: Tokenizer, special: bool = True):
        self.tokenizer = tokenizer
        self.special = special
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def push(self, token_id: int) -> str:
        return self._utf8.decode(self.tokenizer.token_bytes(int(token_id), self.special))

    def flush(self) -> str:
        """Whatever is held back, an incomplete character as U+FFFD; then start afresh."""
        out = self._utf8.decode(b"", final=True)
        self._utf8.reset()
        return out


