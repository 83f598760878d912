"""A GGUF vocabulary's load-time facts, as llama.cpp decides them (llama_vocab::impl::load):
token attributes, the special ids, the end-of-generation set, each token's bytes, the BPE
merges and the pre-tokenizer regexes of each ``tokenizer.ggml.pre`` type.  tokenizer.py builds
its `Tokenizer` from them."""
from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType
from typing import Mapping, Sequence

from tokenizers import Regex
from tokenizers import Tokenizer as HFTokenizer
from tokenizers import models, pre_tokenizers

from ..errors import TokenizerError


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


# Token texts llama.cpp recognises at load time (llama_vocab::impl::load, "auto-detect special
# tokens by text"); the first present one fills an id the metadata left unset.
EOT_TEXTS = ("<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<|end_of_text|>",
             "<EOT>", "_<EOT>", "[EOT]", "<｜end▁of▁sentence｜>", "<end_of_utterance>")


EOM_TEXTS = ("<|eom_id|>",)


# every token with one of these texts ends generation (special_eog_ids)
EOG_TEXTS = ("<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>", "<|calls|>",
             "<end_of_turn>", "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>", "_<EOT>", "[EOT]", "[EOS]",
             "<|end_of_text|>", "<end_of_utterance>", "<eos>", "<turn|>", "<|tool_response>",
             "<｜end▁of▁sentence｜>", "[e~[")


ALWAYS_RENDERED = ("<|channel|>", "<|message|>", "<|start|>", "<|constrain|>")   # gpt-oss: USER_DEFINED


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


# -- load-time rules (llama_vocab::impl::load) -------------------------------------------------
def special_ids(meta: Mapping[str, object], n: int, is_spm: bool) -> dict[str, int | None]:
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


def detect_eog(tokens: Sequence[str], token_to_id: Mapping[str, int], attrs: list[int],
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


def special_heads(specials: Sequence[tuple[str, int, int]]) -> Mapping[str, tuple[int, ...]]:
    """First two characters (the whole text if shorter) -> indices of the specials starting so."""
    out: dict[str, list[int]] = {}
    for i, (text, _, _) in enumerate(specials):
        out.setdefault(text[:2], []).append(i)
    return MappingProxyType({k: tuple(v) for k, v in out.items()})


def token_pieces(tokens: Sequence[str], attrs: Sequence[int], is_spm: bool) -> tuple[bytes, ...]:
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


def build_bpe(meta: Mapping[str, object], tokens: list[str], token_to_id: dict[str, int],
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
