"""llama.cpp's own tokenizer cases: every ggml-vocab-*.gguf of its source tree (models/, with
.inp / .out written by llama.cpp's tests/test-tokenizer-0) whose tokenizer type specdec
supports encodes every case to llama.cpp's ids (add_special and parse_special off, as
test-tokenizer-0 runs them); the others are refused with a one-line TokenizerError.

The source tree comes from llama-cpp-python's sdist: benchmarks/llamacpp_src.sh unpacks it and
prints the folder for SPECDEC_LLAMACPP_SRC (default: the unpacked 0.3.36 in the specdec
cache).  Without it the tests skip, saying so.
"""
from __future__ import annotations

import functools
import os
from pathlib import Path

import gguf
import pytest

from specdec.errors import TokenizerError
from specdec.text.tokenizer import Tokenizer

SEP = "\n__ggml_vocab_test__\n"
SUPPORTED = ("command-r", "deepseek-coder", "falcon", "gpt-2", "llama-bpe", "llama-spm", "mpt", "phi-3", "qwen2",
             "qwen35", "refact", "starcoder")


def _models_dir() -> Path | None:
    cache = Path(os.environ.get("SPECDEC_CACHE", Path.home() / ".cache" / "specdec"))
    root = Path(os.environ.get("SPECDEC_LLAMACPP_SRC", cache / "llama.cpp-src-0.3.36"))
    return root / "models" if (root / "models").is_dir() else None


MODELS = _models_dir()
needs_src = pytest.mark.skipif(MODELS is None, reason="llama.cpp's source tree is not here "
                               "(benchmarks/llamacpp_src.sh, then SPECDEC_LLAMACPP_SRC)")
VOCABS = sorted(p.name for p in MODELS.glob("ggml-vocab-*.gguf")) if MODELS else []


@functools.lru_cache(maxsize=None)
def _tokenizer(name: str) -> Tokenizer:
    r = gguf.GGUFReader(MODELS / name)
    return Tokenizer.from_metadata({k: f.contents() for k, f in r.fields.items()}, name)


def _cases(name: str) -> list[tuple[str, list[int]]]:
    inputs = (MODELS / f"{name}.inp").read_text(encoding="utf-8").split(SEP)
    outputs = (MODELS / f"{name}.out").read_text(encoding="utf-8").split("\n")
    outputs = outputs[:-1] if outputs and outputs[-1] == "" else outputs
    if len(inputs) == len(outputs) + 1 and inputs[-1] == "":   # the file ends with a separator
        inputs = inputs[:-1]
    assert len(inputs) == len(outputs), name
    return [(s, [int(t) for t in o.split()]) for s, o in zip(inputs, outputs)]


@needs_src
@pytest.mark.parametrize("vocab", SUPPORTED)
def test_supported_vocabularies_pass_llamacpp_cases(vocab):
    name = f"ggml-vocab-{vocab}.gguf"
    tok = _tokenizer(name)
    cases = _cases(name)
    assert len(cases) >= 30
    bad = [(s, want, got) for s, want in cases if (got := tok.encode(s, special=False, bos=False)) != want]
    assert not bad, f"{name}: {len(bad)} of {len(cases)} cases differ, first {bad[0]!r}"


@needs_src
def test_every_vocabulary_file_is_run_or_refused_in_one_line():
    with_cases = [n for n in VOCABS if (MODELS / f"{n}.inp").exists()]
    assert with_cases, "no vocabulary test files"
    for name in with_cases:
        vocab = name[len("ggml-vocab-"):-len(".gguf")]
        try:
            _tokenizer(name)
        except TokenizerError as e:
            assert vocab not in SUPPORTED and "\n" not in str(e) and name in str(e), (name, e)
        else:
            assert vocab in SUPPORTED, f"{name} loads: add it to SUPPORTED"
