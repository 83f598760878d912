"""Tokenizer fuzzing on the four real vocabularies: random Unicode of every plane, lone
surrogates, NULs, 100k-character strings and special-token look-alikes through encode/decode.

Properties:
- encode (special on or off) and decode never raise, and every id is in the vocabulary;
- the round trip decode(encode(text, special=False, bos=False, eos=False)) == text is exact
  whenever the vocabulary allows it, which is precisely when
    * text is valid Unicode (no lone surrogates: encode replaces them by U+FFFD, which is
      what llama.cpp sees for bytes that are not UTF-8),
    * every UTF-8 byte of text has a token (SmolLM2 lacks 21 byte tokens, e.g. 0xF1;
      llama.cpp drops such bytes),
    * for SentencePiece vocabularies, text has no U+2581 (the whitespace escape that decode
      turns back into a space), and decode's output starts with the one space
      add_space_prefix inserts when the vocabulary sets it.
  Special-token texts need no exclusion: with special=False, CONTROL tokens are not parsed,
  and USER_DEFINED ones (always parsed) decode to their own text;
- with llama-cpp-python installed, the ids equal llama.cpp's on a random sample (skipped
  otherwise: no local llama.cpp build).
"""
from __future__ import annotations

import os
from functools import lru_cache
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from specdec.engine.gguf_file import GGUFFile
from specdec.text.tokenizer import Tokenizer

pytestmark = pytest.mark.real
MODELS = ("smollm2-135m-instruct-q4_1", "qwen2.5-coder-0.5b-instruct",
          "qwen2.5-coder-1.5b-instruct-q4_k_m", "gemma-3-270m-q4_k_m")


def _path(model_id: str) -> Path:
    path = Path(os.environ.get("SPECDEC_HOME", "~/.cache/specdec")).expanduser() / f"{model_id}.gguf"
    if not path.is_file():
        pytest.skip(f"{path} is missing")
    return path


@lru_cache(maxsize=None)
def _tokenizer(model_id: str) -> Tokenizer:
    return Tokenizer.from_metadata(GGUFFile(_path(model_id)).metadata, f"{model_id}.gguf")


def _byte_ok(tok: Tokenizer) -> np.ndarray:
    """(256,) bool: byte b has a token of its own."""
    if tok.vocab_type == "spm":
        return np.array([f"<0x{b:02X}>" in tok.token_to_id for b in range(256)])
    return np.array([_bpe_byte_token(tok, b) for b in range(256)])


def _bpe_byte_token(tok: Tokenizer, b: int) -> bool:
    """Has the byte-level vocabulary the one-character token of byte b (GPT-2's alphabet)?"""
    keep = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    rest = [c for c in range(256) if c not in keep]
    ch = chr(b) if b in keep else chr(0x100 + rest.index(b))
    return ch in tok.token_to_id


def round_trip_allowed(tok: Tokenizer, byte_ok: np.ndarray, text: str) -> bool:
    """The module docstring's condition for an exact round trip."""
    try:
        raw = text.encode("utf-8")
    except UnicodeEncodeError:          # lone surrogates
        return False
    if not byte_ok[np.frombuffer(raw, np.uint8)].all():
        return False
    return not (tok.vocab_type == "spm" and "\u2581" in text)


def expected_decode(tok: Tokenizer, text: str) -> str:
    return (" " + text) if tok.vocab_type == "spm" and tok.add_space_prefix and text else text


def _look_alikes(tok: Tokenizer):
    """Special-token texts, exact and slightly wrong (a character dropped, doubled, cased)."""
    texts = sorted({s[0] for s in tok.specials if len(s[0]) > 1})[:400]

    def bend(t, how, i):
        i %= len(t)
        return {0: t, 1: t[:i] + t[i + 1:], 2: t[:i] + t[i] + t[i:], 3: t.swapcase(), 4: t[:-1]}[how]
    return st.builds(bend, st.sampled_from(texts), st.integers(0, 4), st.integers(0, 100))


ANY_CHAR = st.one_of(st.characters(min_codepoint=0, max_codepoint=0x10FFFF),   # every plane
                     st.integers(0xD800, 0xDFFF).map(chr),                      # lone surrogates
                     st.just("\0"), st.sampled_from(" \t\n\r\u2581\ufffd\u200d\ufeff"))


def _texts(tok: Tokenizer):
    piece = st.one_of(st.text(ANY_CHAR, max_size=12), _look_alikes(tok))
    return st.lists(piece, max_size=8).map("".join)


def _check(tok: Tokenizer, byte_ok: np.ndarray, text: str) -> None:
    for special in (True, False):
        ids = tok.encode(text, special=special)
        assert all(0 <= i < tok.n_vocab for i in ids)
        tok.decode(ids)
    if round_trip_allowed(tok, byte_ok, text):
        assert tok.decode(tok.encode(text, special=False, bos=False, eos=False)) == expected_decode(tok, text)


@pytest.mark.parametrize("model_id", MODELS)
def test_random_unicode(model_id):
    tok = _tokenizer(model_id)
    byte_ok = _byte_ok(tok)

    @settings(max_examples=120, deadline=None, derandomize=True)
    @given(_texts(tok))
    def check(text):
        _check(tok, byte_ok, text)
    check()


@pytest.mark.parametrize("model_id", MODELS)
def test_long_strings(model_id):
    """100k characters: random code points of planes 0-2 (no surrogates), then a run of one
    special-token look-alike, then NULs."""
    tok = _tokenizer(model_id)
    byte_ok = _byte_ok(tok)
    rng = np.random.default_rng(0)
    cps = rng.integers(0, 0x30000, 100_000)
    cps = np.where((cps >= 0xD800) & (cps <= 0xDFFF), 0x41, cps)
    spec = next(s[0] for s in tok.specials if len(s[0]) > 3)
    for text in ("".join(map(chr, cps)), (spec[:-1] + "x") * (100_000 // len(spec)), "\0" * 100_000):
        _check(tok, byte_ok, text)


def test_round_trip_condition_is_not_vacuous():
    """The condition admits ordinary text on every vocabulary (so the round trip is tested)."""
    for model_id in MODELS:
        tok = _tokenizer(model_id)
        assert round_trip_allowed(tok, _byte_ok(tok), "Hello, wörld! 日本語 😀 <|im_end|>\0\n")


@pytest.mark.parametrize("model_id", MODELS)
def test_agrees_with_llamacpp(model_id):
    from specdec.models import llamacpp
    if not llamacpp.available():
        pytest.skip("llama-cpp-python is not installed: no local llama.cpp build to compare ids with")
    from llama_cpp import Llama
    tok = _tokenizer(model_id)
    llm = Llama(str(_path(model_id)), vocab_only=True, verbose=False)
    byte_ok = _byte_ok(tok)

    @settings(max_examples=60, deadline=None, derandomize=True)
    @given(_texts(tok))
    def check(text):
        if not round_trip_allowed(tok, byte_ok, text):
            return
        want = llm.tokenize(text.encode("utf-8"), add_bos=False, special=False)
        assert tok.encode(text, special=False, bos=False, eos=False) == want
    check()
