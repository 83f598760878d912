"""Tokenizer: exact agreement with llama.cpp on the real models, and its invariants.

Real-model tests read llama.cpp's outputs from tests/data/reference/llamacpp.jsonl:
`tokenize` records (plain text, no specials, no BOS) and `greedy` records (prompt tokenized
with specials and BOS as the model says; continuation ids detokenized).  Models are looked up
as <model-id>.gguf in $SPECDEC_HOME (default ~/.cache/specdec); absent ones are skipped unless
SPECDEC_REQUIRE_MODELS=1.  The synthetic-vocabulary tests need no file.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from specdec.errors import TokenizerError
from specdec.engine.gguf_file import GGUFFile
from specdec.text.tokenizer import StreamDecoder, Tokenizer

RECORDS = [json.loads(line) for line in (Path(__file__).parents[1] / "data" / "reference" / "llamacpp.jsonl")
           .read_text(encoding="utf-8").splitlines()]
MODEL_IDS = list(dict.fromkeys(r["model"] for r in RECORDS))
BPE_MODEL_IDS = [m for m in MODEL_IDS if not m.startswith("gemma")]
EXPECTED = {   # vocab type, n_vocab, BOS, EOS, add BOS, ids that must end generation
    "smollm2-135m-instruct-q4_1": ("bpe", 49152, 1, 2, False, {0, 2}),
    "qwen2.5-coder-0.5b-instruct": ("bpe", 151936, 151643, 151645, False, {151643, 151645, 151662, 151663, 151664}),
    "qwen2.5-coder-1.5b-instruct-q4_k_m": ("bpe", 151936, 151643, 151645, False,
                                           {151643, 151645, 151662, 151663, 151664}),
    "gemma-3-270m-q4_k_m": ("spm", 262144, 2, 1, True, {1, 106}),
}
TEXT = st.one_of(st.text(max_size=80),
                 st.text(alphabet=" \t\n\r'sStdlmvreAZ019_.,!é日😀ÿ\u00a0\u3000", max_size=60))


@pytest.fixture(scope="session")
def model_file():
    """model_file(model_id) -> Path of <model-id>.gguf in $SPECDEC_HOME, or skip (fail when
    SPECDEC_REQUIRE_MODELS=1)."""
    home = Path(os.environ.get("SPECDEC_HOME", "~/.cache/specdec")).expanduser()

    def find(model_id: str) -> Path:
        path = home / f"{model_id}.gguf"
        if path.is_file():
            return path
        if os.environ.get("SPECDEC_REQUIRE_MODELS") == "1":
            pytest.fail(f"{path} is missing and SPECDEC_REQUIRE_MODELS=1")
        pytest.skip(f"{path} is missing")
    return find


@pytest.fixture(scope="session")
def real_metadata(model_file):
    """real_metadata(model_id) -> the file's metadata (key -> value), read once per session."""
    cache: dict[str, dict] = {}

    def get(model_id: str) -> dict:
        if model_id not in cache:
            cache[model_id] = GGUFFile(model_file(model_id)).metadata
        return cache[model_id]
    return get


@pytest.fixture(scope="session")
def real_tokenizer(real_metadata):
    """real_tokenizer(model_id) -> Tokenizer, built once per test session."""
    cache: dict[str, Tokenizer] = {}

    def get(model_id: str) -> Tokenizer:
        if model_id not in cache:
            cache[model_id] = Tokenizer.from_metadata(real_metadata(model_id), f"{model_id}.gguf")
        return cache[model_id]
    return get


def _records(kind: str, model_id: str) -> list[dict]:
    return [r for r in RECORDS if r["kind"] == kind and r["model"] == model_id]


def _stream(tok: Tokenizer, ids) -> tuple[list[str], str]:
    dec = StreamDecoder(tok)
    return [dec.push(i) for i in ids], dec.flush()


def _byte_tokens(tok: Tokenizer) -> list[int | None]:
    """(256,) the token that is exactly byte b, None where the vocabulary has none (SmolLM2
    lacks 21 bytes, e.g. 0xF1; llama.cpp drops such bytes, so no round trip goes through them)."""
    texts = [f"<0x{b:02X}>" for b in range(256)] if tok.vocab_type == "spm" else _byte_alphabet()
    return [tok.token_to_id.get(t) for t in texts]


def _whole(byte_ids: list[int | None]):
    """Filter: s has no U+FFFD and every byte of it has a token."""
    return lambda s: "\ufffd" not in s and None not in map(byte_ids.__getitem__, s.encode())


# -- agreement with llama.cpp -------------------------------------------------------------------
@pytest.mark.parametrize("model_id", MODEL_IDS)
def test_tokenize_records_match_llamacpp(real_tokenizer, model_id):
    tok = real_tokenizer(model_id)
    recs = _records("tokenize", model_id)
    got = [tok.encode(r["text"], special=False, bos=False) for r in recs]
    bad = [(r["text"], ids, r["ids"]) for r, ids in zip(recs, got) if ids != r["ids"]]
    print(f"\n{model_id}: {len(recs) - len(bad)}/{len(recs)} tokenize records match llama.cpp")
    assert recs and not bad, bad


@pytest.mark.parametrize("model_id", MODEL_IDS)
def test_prompts_match_llamacpp(real_tokenizer, model_id):
    tok = real_tokenizer(model_id)
    recs = _records("greedy", model_id)
    got = [tok.encode(r["prompt"], special=True, bos=None) for r in recs]
    bad = [(r["prompt"], ids, r["prompt_ids"]) for r, ids in zip(recs, got) if ids != r["prompt_ids"]]
    print(f"\n{model_id}: {len(recs) - len(bad)}/{len(recs)} prompts match llama.cpp")
    assert recs and not bad, bad


@pytest.mark.parametrize("model_id", MODEL_IDS)
def test_decode_matches_llamacpp(real_tokenizer, model_id):
    tok = real_tokenizer(model_id)
    recs = _records("greedy", model_id)
    got = [tok.decode(r["ids"]) for r in recs]
    bad = [(text, r["text"]) for r, text in zip(recs, got) if text != r["text"]]
    print(f"\n{model_id}: {len(recs) - len(bad)}/{len(recs)} continuations detokenize as llama.cpp's")
    assert recs and not bad, bad
    for r in recs:
        parts, tail = _stream(tok, r["ids"])
        assert "".join(parts) + tail == r["text"]


@pytest.mark.parametrize("model_id", MODEL_IDS)
def test_vocabulary_facts(real_tokenizer, model_id):
    tok = real_tokenizer(model_id)
    vocab_type, n_vocab, bos, eos, add_bos, eog = EXPECTED[model_id]
    got = (tok.vocab_type, tok.n_vocab, tok.bos_id, tok.eos_id, tok.add_bos)
    assert got == (vocab_type, n_vocab, bos, eos, add_bos)
    assert len(tok.tokens) == n_vocab and eog <= tok.eog_ids
    assert all(tok.is_eog(i) for i in eog) and not tok.is_eog(tok.encode("a", bos=False)[0])
    assert (tok.chat_template is None) == (vocab_type == "spm")      # gemma-3-270m ships none
    im_end = tok.tokens[eos] if vocab_type == "bpe" else "<end_of_turn>"
    assert tok.encode(im_end, bos=False) == [tok.token_to_id[im_end]]
    assert tok.encode(im_end, special=False, bos=False) != [tok.token_to_id[im_end]]
    assert tok.decode([tok.token_to_id[im_end]]) == im_end
    assert tok.decode([tok.token_to_id[im_end]], special=False) == ""


# -- invariants on the real vocabularies ---------------------------------------------------------
@pytest.mark.parametrize("model_id", BPE_MODEL_IDS)
def test_bpe_round_trip(real_tokenizer, model_id):
    tok = real_tokenizer(model_id)

    @settings(max_examples=150, deadline=None)
    @given(TEXT.filter(_whole(_byte_tokens(tok))))
    def check(s):
        assert tok.decode(tok.encode(s, special=False, bos=False)) == s
        assert tok.decode(tok.encode(s)) == s      # no special-token text occurs in s by chance
    check()


@pytest.mark.parametrize("model_id", MODEL_IDS)
def test_stream_decoder_equals_decode(real_tokenizer, model_id):
    tok = real_tokenizer(model_id)

    @settings(max_examples=100, deadline=None)
    @given(TEXT.filter(_whole(_byte_tokens(tok))))
    def check(s):
        ids = tok.encode(s, special=False, bos=False)
        parts, tail = _stream(tok, ids)
        assert "".join(parts) + tail == tok.decode(ids)
        assert not any("\ufffd" in p for p in parts) and tail == ""
    check()


@pytest.mark.parametrize("model_id", MODEL_IDS)
def test_stream_decoder_holds_split_characters(real_tokenizer, model_id):
    """One token per byte: every multi-byte character is split; none may come out as U+FFFD."""
    tok = real_tokenizer(model_id)
    byte_ids = _byte_tokens(tok)

    @settings(max_examples=100, deadline=None)
    @given(st.text(min_size=1, max_size=30).filter(_whole(byte_ids)))
    def check(s):
        ids = [byte_ids[b] for b in s.encode()]
        parts, tail = _stream(tok, ids)
        assert "".join(parts) == s and tail == "" and tok.decode(ids) == s
        assert not any("\ufffd" in p for p in parts)
    check()


@pytest.mark.parametrize("model_id", BPE_MODEL_IDS[:2])
def test_bpe_merges_equal_the_plain_rule(real_metadata, real_tokenizer, model_id):
    """llm_tokenizer_bpe_session stated plainly: within each pre-token, merge the adjacent pair
    of lowest merge rank (leftmost on ties) until none is left; symbols that are not tokens
    (bytes the vocabulary lacks) block merges and are dropped."""
    tok = real_tokenizer(model_id)
    ranks: dict[tuple[str, str], int] = {}
    for i, word in enumerate(real_metadata(model_id)["tokenizer.ggml.merges"]):
        cut = word.find(" ", 1)
        ranks.setdefault((word[:cut], word[cut + 1:]), i)

    def plain(text: str) -> list[int]:
        out = []
        for piece, _ in tok.backend.pre_tokenizer.pre_tokenize_str(text):
            syms = list(piece)
            while True:
                found = [(ranks[p], i) for i, p in enumerate(zip(syms, syms[1:])) if p in ranks]
                if not found:
                    break
                i = min(found)[1]
                syms[i:i + 2] = [syms[i] + syms[i + 1]]
            out += [tok.token_to_id[s] for s in syms if s in tok.token_to_id]
        return out

    @settings(max_examples=150, deadline=None)
    @given(TEXT)
    def check(s):
        assert tok.encode(s, special=False, bos=False) == plain(s)
    check()


def _naive_spm(tok: Tokenizer, text: str) -> list[int]:
    """The SPM rule stated plainly: merge the adjacent pair forming the best-scoring token
    (leftmost on ties) until none is left; leftover characters become byte tokens."""
    syms = list(text)
    scores = tok.backend.scores
    while True:
        best = None
        for i in range(len(syms) - 1):
            tid = tok.token_to_id.get(syms[i] + syms[i + 1])
            if tid is not None and (best is None or scores[tid] > best[0]):
                best = (scores[tid], i)
        if best is None:
            break
        i = best[1]
        syms[i:i + 2] = [syms[i] + syms[i + 1]]
    out = []
    for s in syms:
        if s in tok.token_to_id:
            out.append(tok.token_to_id[s])
        else:
            out += [tok.token_to_id[f"<0x{b:02X}>"] for b in s.encode()]
    return out


def test_spm_merges_equal_the_plain_rule(real_tokenizer):
    tok = real_tokenizer("gemma-3-270m-q4_k_m")
    pieces = ["▁", "▁the", "ing", "a", "b", "an", "na", "ab", "▁▁", "<", ">", "eos", "/", "s", "日本",
              "語", "😀", "🏽", "é", "e", "\u0301", "0", "12", "<0x41>", "unused", "_"]

    @settings(max_examples=300, deadline=None)
    @given(st.lists(st.sampled_from(pieces), max_size=25).map("".join))
    def check(s):
        assert tok.backend.tokenize(s) == _naive_spm(tok, s)
    check()


# -- synthetic vocabularies (no model file needed) ----------------------------------------------
def _byte_alphabet() -> list[str]:
    """GPT-2's byte-level alphabet: byte b -> the character standing for it."""
    keep = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    extra = iter(range(0x100, 0x200))
    return [chr(b) if b in keep else chr(next(extra)) for b in range(256)]


def _bpe_meta(**over) -> dict:
    alphabet = _byte_alphabet()
    specials = [("<|endoftext|>", 3), ("<|im_start|>", 3), ("<|im_end|>", 3), ("<|im", 3), ("<tool>", 4),
                ("<|fim_pad|>", 3), ("[PAD0]", 5)]
    merges = ["h e", "l l", "he ll", "Ġ w", "o r"]
    tokens = alphabet + ["he", "ll", "hell", "Ġw", "or"] + [t for t, _ in specials]
    meta = {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "qwen2", "tokenizer.ggml.tokens": tokens,
            "tokenizer.ggml.token_type": [1] * 261 + [t for _, t in specials],
            "tokenizer.ggml.merges": merges, "tokenizer.ggml.eos_token_id": tokens.index("<|im_end|>")}
    meta.update(over)
    return meta


def _spm_meta(**over) -> dict:
    bytes_ = [f"<0x{b:02X}>" for b in range(256)]
    normal = [("▁", -1.0), ("a", -2.0), ("b", -3.0), ("c", -4.0), ("ab", -5.0), ("bc", -6.0),
              ("abc", -7.0), ("▁a", -8.0), ("▁ab", -9.0)]
    tokens = ["<unk>", "<s>", "</s>", "<start>", "\n"] + bytes_ + [t for t, _ in normal]
    meta = {"tokenizer.ggml.model": "llama", "tokenizer.ggml.pre": "default", "tokenizer.ggml.tokens": tokens,
            "tokenizer.ggml.scores": [0.0] * (5 + 256) + [s for _, s in normal],
            "tokenizer.ggml.token_type": [2, 3, 3, 3, 4] + [6] * 256 + [1] * len(normal)}
    meta.update(over)
    return meta


def test_partition_longest_first_and_user_defined_always():
    tok = Tokenizer.from_metadata(_bpe_meta(), "syn.gguf")
    tid = tok.token_to_id
    assert tok.encode("<|im_start|>hello<|im_end|>") == [tid["<|im_start|>"], tid["hell"], tid["o"], tid["<|im_end|>"]]
    assert tok.encode("<|im") == [tid["<|im"]]
    plain = tok.encode("<|im_end|><tool>", special=False)
    assert tid["<|im_end|>"] not in plain and plain[-1] == tid["<tool>"]     # USER_DEFINED: always
    assert tok.decode(plain) == "<|im_end|><tool>"
    assert tok.partition("a<tool>b<tool>", special=False) == ["a", tid["<tool>"], "b", tid["<tool>"]]
    assert tok.decode(tok.encode(" hello world\n\n  x")) == " hello world\n\n  x"
    assert tok.encode(" world") == [tid["Ġw"], tid["or"], tid["l"], tid["d"]]


def test_bpe_byte_without_token_blocks_merges():
    """llama.cpp keeps a byte that has no token as a symbol between its neighbours, then drops it."""
    alphabet = [c for c in _byte_alphabet() if c != _byte_alphabet()[4]]
    meta = {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "gpt-2", "tokenizer.ggml.tokens": alphabet + ["!!"],
            "tokenizer.ggml.merges": ["! !"]}
    tok = Tokenizer.from_metadata(meta, "syn.gguf")
    bang = tok.token_to_id["!"]
    assert tok.encode("!!") == [tok.token_to_id["!!"]]
    assert tok.encode("!\x04!") == [bang, bang] and tok.decode(tok.encode("!\x04!")) == "!!"


def test_bpe_flags_and_end_of_generation():
    tok = Tokenizer.from_metadata(_bpe_meta(), "syn.gguf")
    tid = tok.token_to_id
    assert tok.vocab_type == "bpe" and tok.pre == "qwen2" and not tok.add_bos
    assert tok.eog_ids == {tid["<|im_end|>"], tid["<|endoftext|>"], tid["<|fim_pad|>"]}
    assert tok.bos_id == 11 and tok.encode("x", bos=True) == [11, tid["x"]]     # llama.cpp's BPE default
    assert tok.token_bytes(tid["[PAD0]"]) == b""                               # UNUSED prints nothing
    no_merges = Tokenizer.from_metadata({k: v for k, v in _bpe_meta().items() if k != "tokenizer.ggml.merges"},
                                        "syn.gguf")     # gguf's writer drops an empty merges list
    assert no_merges.encode("hello") == [tid[c] for c in "hello"]
    llama3 = Tokenizer.from_metadata(_bpe_meta(**{"tokenizer.ggml.pre": "llama-bpe"}), "syn.gguf")
    assert llama3.add_bos and llama3.encode("x")[0] == llama3.bos_id
    with pytest.raises(TokenizerError, match="outside the vocabulary"):
        tok.decode([len(tok.tokens)])


def test_spm_space_prefix_byte_fallback_and_bos():
    tok = Tokenizer.from_metadata(_spm_meta(), "syn.gguf")
    tid = tok.token_to_id
    assert tok.add_bos and tok.add_space_prefix and tok.bos_id == 1 and tok.eos_id == 2
    assert tok.encode("abc") == [1, tid["▁"], tid["abc"]]      # "ab" first, then "abc" beats "▁ab"
    assert tok.encode("abc", bos=False, special=False) == [tid["▁"], tid["abc"]]
    assert tok.encode("<start>a", bos=False) == [tid["<start>"], tid["▁a"]]    # space again after a special
    assert tok.encode("é\nb", bos=False) == [tid["▁"], tid["<0xC3>"], tid["<0xA9>"], tid["\n"], tid["▁"], tid["b"]]
    assert tok.decode(tok.encode("é\nb")) == "<s> é\n b"
    no_prefix = Tokenizer.from_metadata(_spm_meta(**{"tokenizer.ggml.add_space_prefix": False,
                                                     "tokenizer.ggml.add_bos_token": False}), "syn.gguf")
    assert no_prefix.encode("abc") == [tid["abc"]] and no_prefix.encode("bca") == [tid["bc"], tid["a"]]
    dec = StreamDecoder(tok)
    assert dec.push(tid["<0xC3>"]) == "" and dec.push(tid["<0xA9>"]) == "é" and dec.flush() == ""
    assert dec.push(tid["<0xC3>"]) == "" and dec.flush() == "\ufffd"


@pytest.mark.parametrize("over, message", [
    ({"tokenizer.ggml.model": "bert"}, "'bert'"),
    ({"tokenizer.ggml.pre": "tekken"}, "'tekken'"),
    ({"tokenizer.ggml.tokens": ["a", "b", "a"], "tokenizer.ggml.token_type": [1, 1, 1]}, "duplicate"),
    ({"tokenizer.ggml.tokens": []}, "tokens"),
])
def test_bad_vocabularies_are_one_line_errors(over, message):
    meta = {k: v for k, v in _bpe_meta(**over).items() if v is not None}
    with pytest.raises(TokenizerError, match=message) as info:
        Tokenizer.from_metadata(meta, "models/bad.gguf")
    assert "models/bad.gguf" in str(info.value) and "\n" not in str(info.value)
    missing = {k: v for k, v in _bpe_meta().items() if k != "tokenizer.ggml.model"}
    with pytest.raises(TokenizerError, match="tokenizer.ggml.model"):
        Tokenizer.from_metadata(missing, "models/bad.gguf")
