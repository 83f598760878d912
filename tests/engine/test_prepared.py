"""Prepared weights on disk (engine/prepared.py): the second load reads what the first one
prepared, with the same logits bit for bit; a stale, truncated, corrupted or foreign folder is
never trusted but rebuilt; SPECDEC_PREPARED=0 writes nothing."""
from __future__ import annotations

import json
import os

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T

import specdec
from specdec.engine import prepared
from synth import TinySpec, write_tiny_model

TOKENS = [3, 17, 4, 40, 22, 9, 9, 31]


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECDEC_HOME", str(tmp_path / "home"))
    monkeypatch.setenv(prepared.ENV, "1")
    return tmp_path / "home"


def _model_file(tmp_path, qtype=T.Q4_K, seed=1):
    return write_tiny_model(tmp_path / f"m-{int(qtype)}-{seed}.gguf",
                            TinySpec(arch="qwen2", qtype=int(qtype), d_model=256, d_ff=256, seed=seed))


def _logits(path, **kw):
    m = specdec.load(path, mmap=False, **kw)
    return m, m.session(32).eval(TOKENS)


def test_second_load_reads_the_prepared_weights_bitwise(home, tmp_path, monkeypatch):
    path = _model_file(tmp_path)
    first, want = _logits(path)
    assert len(prepared.listing()) == 1
    rewrites = []
    monkeypatch.setattr("specdec.engine.gguf_file.GGUFFile.rewrite",
                        lambda self, *a, **k: rewrites.append(a) or pytest.fail("prepared again"))
    second, got = _logits(path)
    assert np.array_equal(want, got) and not rewrites
    assert [L.wq.qtype for L in second.weights.layers] == [L.wq.qtype for L in first.weights.layers]


def test_requantized_layers_are_kept_too(home, tmp_path):
    path = _model_file(tmp_path, T.Q8_0, seed=2)
    _, want = _logits(path, requant="q4_0")
    (entry,) = prepared.listing()
    index = json.loads((prepared.root() / entry[0] / "index.json").read_text())
    assert index["extra"] and "requant" in index["params"]
    _, got = _logits(path, requant="q4_0")
    assert np.array_equal(want, got)
    _, plain = _logits(path)                          # other parameters: a folder of their own
    assert len(prepared.listing()) == 2 and not np.array_equal(plain, got)


@pytest.mark.parametrize("damage", ["truncate", "flip", "index", "foreign", "stale"])
def test_a_damaged_folder_is_rebuilt_not_trusted(home, tmp_path, damage):
    path = _model_file(tmp_path, seed=3)
    _, want = _logits(path)
    (d,) = [prepared.root() / name for name, _ in prepared.listing()]
    image = d / "image.bin"
    if not image.exists():                            # K-quants of 16k rows: new arrays only
        image = d / "extra.bin"
    if damage == "truncate":
        os.truncate(image, image.stat().st_size // 2)
    elif damage == "flip":
        raw = bytearray(image.read_bytes())
        raw[len(raw) // 2] ^= 0xFF
        image.write_bytes(bytes(raw))
    elif damage == "index":
        (d / "index.json").write_text("{not json")
    elif damage == "foreign":
        index = json.loads((d / "index.json").read_text())
        index["key"] = "0" * 64
        (d / "index.json").write_text(json.dumps(index))
    else:                                             # the model file changed since
        os.utime(path, ns=(1, 1))
    assert prepared.load(str(path), "activations=auto|requant=None") is None
    _, got = _logits(path)
    assert np.array_equal(want, got)
    assert prepared.load(str(path), "activations=auto|requant=None") is not None   # rebuilt


def test_off_writes_nothing(home, tmp_path, monkeypatch):
    monkeypatch.setenv(prepared.ENV, "0")
    _logits(_model_file(tmp_path, seed=4))
    assert prepared.listing() == [] and not prepared.root().exists()


def test_a_mapped_load_uses_no_image(home, tmp_path):
    path = _model_file(tmp_path, seed=5)
    _, want = _logits(path)
    m = specdec.load(path, mmap=True)
    assert not m.gguf.in_memory
    assert np.array_equal(m.session(32).eval(TOKENS), want)
