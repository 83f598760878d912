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
from typing import Iterable, Mapping, Sequence

from tokenizers import Regex
from tokenizers import Tokenizer as HFTokenizer
from tokenizers import models, pre_tokenizers

from ..errors import TokenizerError
from .spm import SpmModel, escape_whitespace

# llama_token_attr bits (llama.h); tokenizer.ggml.token_type values map onto them (llama_token_type)
ATTR_UNKNOWN, ATTR_UNUSED, ATTR_NORMAL = 1 << 0, 1 << 1, 1 << 2
ATTR_CONTROL, ATTR_USER_DEFINED, ATTR_BYTE = 1 << 3, 1 << 4, 1 << 5
TYPE_TO_ATTR = (0, ATTR_NORMAL, ATTR_UNKNOWN, ATTR_CONTROL, ATTR_USER_DEFINED, ATTR_UNUSED, ATTR_BYTE)
SPECIAL_ATTRS = ATTR_UNKNOWN | ATTR_CONTROL     # token_to_piece(special=false) prints nothing for these

# llm_tokenizer_bpe regexes (llama-vocab.cpp), one per LLAMA_VOCAB_PRE_TYPE used here
RE_GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
RE_LLAMA3 = (r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+"
             r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
RE_QWEN2 = (r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+"
            r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")

RE_QWEN35 = (r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+"
             r"|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")


@dataclass(frozen=True)
class PreType:
    """What a ``tokenizer.ggml.pre`` name selects in llama_vocab::impl::load."""
    name: str                   # llama.cpp's LLAMA_VOCAB_PRE_TYPE_* (lower case)
    regexes: tuple[str, ...]    # applied in sequence, each splitting the previous pieces
    ignore_merges: bool = False  # a whole pre-token found in the vocabulary is one token
    add_bos: bool = False       # default of add_bos before tokenizer.ggml.add_bos_token


PRE_DEFAULT = PreType("default", (r"[\p{P}\$\+<=>\^~\|]+", RE_GPT2, r"\p{N}+", r"[0-9][0-9][0-9]"))
PRE_GPT2 = PreType("gpt2", (RE_GPT2,))
PRE_STARCODER = PreType("starcoder", (r"\p{N}", RE_GPT2))
PRE_QWEN2 = PreType("qwen2", (RE_QWEN2,))
PRE_LLAMA3 = PreType("llama3", (RE_LLAMA3,), ignore_merges=True, add_bos=True)
PRE_DBRX = PreType("dbrx", (RE_LLAMA3,))
PRE_QWEN35 = PreType("qwen35", (RE_QWEN35,))
PRE_FALCON = PreType("falcon", (r"[\p{P}\$\+<=>\^~\|`]+", RE_GPT2, r"[0-9][0-9][0-9]"))
PRE_DEEPSEEK_CODER = PreType("deepseek-coder", (r"[\r\n]", r"\s?\p{L}+", r"\s?\p{P}+",
                                                 r"[一-龥ࠀ-一가-퟿]+", r"\p{N}"))

PRE_TYPES: Mapping[str, PreType] = MappingProxyType({
    "": PRE_DEFAULT, "default": PRE_DEFAULT,
    **dict.fromkeys(("llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral",
                     "midm-2.0", "lfm2", "jina-v5-nano"), PRE_LLAMA3),
    **dict.fromkeys(("dbrx", "smaug-bpe"), PRE_DBRX),
    "qwen35": PRE_QWEN35, "falcon": PRE_FALCON, "deepseek-coder": PRE_DEEPSEEK_CODER,
    **dict.fromkeys(("qwen2", "deepseek-r1-qwen", "kormo", "f2llmv2", "megrez", "stablelm2"), PRE_QWEN2),
    **dict.fromkeys(("smollm", "starcoder", "refact", "command-r", "codeshell", "exaone",
                     "minerva-7b", "mellum2"), PRE_STARCODER),
    **dict.fromkeys(("gpt-2", "phi-2", "jina-es", "jina-de", "gigachat", "jina-v2-es", "jina-v2-de",
                     "a.x-4.0", "mellum", "modern-bert", "mpt", "olmo", "jais", "trillion",
                     "granite-docling", "exaone4"), PRE_GPT2),
})

# Token texts llama.cpp recognises at load time (llama_vocab::impl::load, "auto-detect special
# tokens by text"); the first present one fills an id the metadata left unset.
EOT_TEXTS = ("<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<|end_of_text|>",
             "<EOT>", "_<EOT>", "[EOT]", "<｜end▁of▁sentence｜>", "<end_of_utterance>")
EOM_TEXTS = ("<|eom_id|>",)
FIM_TEXTS: Mapping[str, tuple[str, ...]] = MappingProxyType({
    "fim_pre": ("<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>", "<｜fim▁begin｜>", "<PRE>", "▁<PRE>",
                "<|code_prefix|>", "<|prefix|>"),
    "fim_suf": ("<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>", "<｜fim▁hole｜>", "<SUF>", "▁<SUF>",
                "<|code_suffix|>", "<|suffix|>"),
    "fim_mid": ("<|fim_middle|>", "<fim-middle>", "<fim_middle>", "<｜fim▁end｜>", "<MID>", "▁<MID>",
                "<|code_middle|>", "<|middle|>"),
    "fim_pad": ("<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"),
    "fim_rep": ("<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>"),
    "fim_sep": ("<|file_sep|>",),
})
# every token with one of these texts ends generation (special_eog_ids)
EOG_TEXTS = ("<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>", "<|calls|>",
             "<end_of_turn>", "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>", "_<EOT>", "[EOT]", "[EOS]",
             "<|end_of_text|>", "<end_of_utterance>", "<eos>", "<turn|>", "<|tool_response>",
             "<｜end▁of▁sentence｜>", "[e~[")
ALWAYS_RENDERED = ("<|channel|>", "<|message|>", "<|start|>", "<|constrain|>")   # gpt-oss: USER_DEFINED

_SURROGATE = re.compile("[\ud800-\udfff]")


def _byte_decoder() -> dict[int, int]:
    """Byte-level alphabet -> byte (unicode_utf8_to_byte_map): printable Latin-1 bytes stand for
    themselves, the other 68 bytes for U+0100.. in order."""
    keep = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    out = {b: b for b in keep}
    extra = 0
    for b in range(256):
        if b not in out:
            out[0x100 + extra] = b
            extra += 1
    return out


def _bpe_piece(text: str, table: Mapping[int, int], alphabet: frozenset[str]) -> bytes:
    """llama_decode_text: byte-level text -> raw bytes; characters outside the alphabet come
    out as "[UNK_BYTE_0x..<text>]" like llama.cpp prints them."""
    if alphabet.issuperset(text):
        return text.translate(table).encode("latin-1")
    out = bytearray()
    for ch in text:
        if ch in alphabet:
            out.append(table[ord(ch)])
        else:
            out += f"[UNK_BYTE_0x{ch.encode().hex()}{text}]".encode()
    return bytes(out)


def _int_or_none(meta: Mapping[str, object], key: str) -> int | None:
    v = meta.get(key)
    return None if v is None else int(v)


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
        ids = _special_ids(meta, n, is_spm)
        add_bos = bool(meta.get("tokenizer.ggml.add_bos_token", is_spm or pre_type.add_bos))
        add_eos = bool(meta.get("tokenizer.ggml.add_eos_token", False))
        add_space_prefix = bool(meta.get("tokenizer.ggml.add_space_prefix", is_spm))
        for flag, key in ((add_bos, "bos"), (add_eos, "eos")):
            if flag and ids[key] is None:
                raise TokenizerError(f"{source}: tokenizer.ggml.add_{key}_token is true but the "
                                     f"vocabulary has no {key.upper()} token")
        eog = _detect_eog(tokens, token_to_id, attrs, ids)

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
            backend = _build_bpe(meta, tokens, token_to_id, pre_type, source)
        template = meta.get("tokenizer.chat_template")
        return cls(source=source, vocab_type="spm" if is_spm else "bpe", pre=pre, tokens=tokens,
                   attrs=tuple(attrs), bos_id=ids["bos"], eos_id=ids["eos"], eot_id=ids["eot"],
                   eog_ids=eog, add_bos=add_bos, add_eos=add_eos, add_space_prefix=add_space_prefix,
                   chat_template=None if template is None else str(template), specials=specials,
                   special_heads=_heads(specials),
                   pieces=_pieces(tokens, attrs, is_spm), token_to_id=MappingProxyType(token_to_id),
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


# -- load-time rules (llama_vocab::impl::load) -------------------------------------------------
def _special_ids(meta: Mapping[str, object], n: int, is_spm: bool) -> dict[str, int | None]:
    """BOS/EOS/... ids: llama.cpp's per-type defaults (SPM bos 1, eos 2, unk 0; BPE bos = eos = 11),
    dropped when outside the vocabulary, replaced by the metadata ids that are inside it."""
    ids: dict[str, int | None] = dict.fromkeys(("bos", "eos", "eot", "eom", "unk", *FIM_TEXTS))
    ids.update({"bos": 1, "eos": 2, "unk": 0} if is_spm else {"bos": 11, "eos": 11})
    for key, value in ids.items():
        if value is not None and value >= n:
            ids[key] = None
    keys = {"bos": ("bos_token_id",), "eos": ("eos_token_id",), "eot": ("eot_token_id",),
            "eom": ("eom_token_id",), "unk": ("unknown_token_id",),
            "fim_pre": ("fim_pre_token_id", "prefix_token_id"), "fim_suf": ("fim_suf_token_id", "suffix_token_id"),
            "fim_mid": ("fim_mid_token_id", "middle_token_id"), "fim_pad": ("fim_pad_token_id",),
            "fim_rep": ("fim_rep_token_id",), "fim_sep": ("fim_sep_token_id",)}
    for name, suffixes in keys.items():
        for suffix in suffixes:
            value = _int_or_none(meta, "tokenizer.ggml." + suffix)
            if value is not None and 0 <= value < n:      # out of range: keep the default
                ids[name] = value
    return ids


def _detect_eog(tokens: Sequence[str], token_to_id: Mapping[str, int], attrs: list[int],
                ids: dict[str, int | None]) -> frozenset[int]:
    """Fill unset EOT/EOM/FIM ids from token texts, force those tokens to CONTROL, build the
    end-of-generation set and apply llama.cpp's per-model corrections (updates attrs, ids)."""
    def present(texts: Sequence[str]) -> list[int]:
        return sorted(token_to_id[t] for t in texts if t in token_to_id)

    for name, texts in (("eot", EOT_TEXTS), ("eom", EOM_TEXTS), *FIM_TEXTS.items()):
        if ids[name] is None:
            found = present(texts)
            if found:                      # llama.cpp takes the first one its hash map yields
                ids[name] = found[0]
                attrs[found[0]] |= ATTR_CONTROL
    for i, a in enumerate(attrs):          # CONTROL tokens named "unused..." are unused
        if a & ATTR_CONTROL and "unused" in tokens[i]:
            attrs[i] = a | ATTR_UNUSED
    eog = {ids[k] for k in ("fim_pad", "fim_rep", "fim_sep") if ids[k] is not None}
    for tid in present(EOG_TEXTS):
        eog.add(tid)
        attrs[tid] |= ATTR_CONTROL
    for tid in present(ALWAYS_RENDERED):
        attrs[tid] = ATTR_USER_DEFINED
    eog.update(ids[k] for k in ("eos", "eot", "eom") if ids[k] is not None)
    texts = {tokens[t]: t for t in eog}
    has_call = "<|call|>" in texts or "<|calls|>" in texts
    if "<|end|>" in texts and has_call and ("<|return|>" in texts or "<|flush|>" in texts):
        attrs[texts["<|end|>"]] = ATTR_USER_DEFINED           # o200k_harmony / solar-open
        eog.discard(texts["<|end|>"])
    if "<|tool_response>" in texts and "</s>" in texts:              # gemma4 / paddleocr
        eog.discard(texts["</s>"])
        attrs[texts["</s>"]] = ATTR_NORMAL
    return frozenset(eog)


def _heads(specials: Sequence[tuple[str, int, int]]) -> Mapping[str, tuple[int, ...]]:
    """First two characters (the whole text if shorter) -> indices of the specials starting so."""
    out: dict[str, list[int]] = {}
    for i, (text, _, _) in enumerate(specials):
        out.setdefault(text[:2], []).append(i)
    return MappingProxyType({k: tuple(v) for k, v in out.items()})


def _pieces(tokens: Sequence[str], attrs: Sequence[int], is_spm: bool) -> tuple[bytes, ...]:
    """token_to_piece(special=true) of every token (llama.cpp's cache_token_to_piece)."""
    out = [b""] * len(tokens)                              # UNUSED / UNDEFINED print nothing
    normal = []
    for i, (text, attr) in enumerate(zip(tokens, attrs)):
        if attr & (ATTR_UNKNOWN | ATTR_CONTROL | ATTR_USER_DEFINED):
            out[i] = text.encode()
        elif attr & ATTR_NORMAL:
            normal.append(i)
        elif attr & ATTR_BYTE:
            try:
                out[i] = bytes((int(text[3:5], 16),))      # token_to_byte: "<0xXX>"
            except ValueError:
                pass
    if is_spm:                                             # llama_unescape_whitespace
        for i in normal:
            out[i] = tokens[i].replace("\u2581", " ").encode()
        return tuple(out)
    table = _byte_decoder()
    alphabet = frozenset(map(chr, table))
    joined = "\uffff".join(tokens[i] for i in normal)      # one translate for the whole vocabulary
    if joined.count("\uffff") == len(normal) - 1 and alphabet.issuperset(joined.replace("\uffff", "")):
        for i, part in zip(normal, joined.translate(table).split("\uffff")):
            out[i] = part.encode("latin-1")
    else:
        for i in normal:
            out[i] = _bpe_piece(tokens[i], table, alphabet)
    return tuple(out)


def _merge_pairs(words: list[str], token_to_id: Mapping[str, int]) -> list[tuple[str, str]]:
    """"a b" merge strings -> (a, b) pairs in rank order, as llama.cpp fills bpe_ranks: split
    at the first space after the first character, a repeated pair keeps its first rank.  Pairs
    whose parts or result are not tokens are left out: the library requires that, and in
    llama.cpp they can only feed byte fallback, which byte-level vocabularies never reach."""
    out: list[tuple[str, str]] = []
    seen: set[tuple[str, str]] = set()
    for word in words:
        pos = word.find(" ", 1)
        pair = (word[:pos], word[pos + 1:])
        if pos > 0 and pair not in seen and pair[0] in token_to_id and pair[1] in token_to_id \
                and pair[0] + pair[1] in token_to_id:
            seen.add(pair)
            out.append(pair)
    return out


def _build_bpe(meta: Mapping[str, object], tokens: list[str], token_to_id: dict[str, int],
               pre_type: PreType, source: str) -> HFTokenizer:
    """models.BPE over the GGUF vocabulary and merges, behind the pre type's regex splits."""
    # llama.cpp refuses a file without tokenizer.ggml.merges; gguf's writer omits an empty list,
    # so a missing key is read as no merges (every byte its own token)
    merges = _merge_pairs([str(w) for w in meta.get("tokenizer.ggml.merges") or []], token_to_id)
    vocab, unk = token_to_id, None
    if not all(chr(c) in token_to_id for c in _byte_decoder()):
        # llm_tokenizer_bpe_session: a byte with no token stays a symbol that no merge joins, and
        # is dropped at the end; as the library's unknown token (id n_vocab, removed by encode)
        # it keeps that place instead of letting its neighbours merge across it
        unk = "[UNK_BYTE]"
        while unk in token_to_id:
            unk += "_"
        vocab = {**token_to_id, unk: len(tokens)}
    try:
        bpe = models.BPE(vocab, merges, unk_token=unk, ignore_merges=pre_type.ignore_merges)
    except Exception as e:   # the library's own message, made one line
        raise TokenizerError(f"{source}: cannot build the BPE vocabulary: {str(e).splitlines()[0]}") from None
    hf = HFTokenizer(bpe)
    hf.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Split(Regex(r), behavior="isolated", invert=False) for r in pre_type.regexes]
        + [pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)])
    return hf
