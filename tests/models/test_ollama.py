"""`-m ollama:NAME[:TAG]` (specdec/models/ollama.py) on a store laid out as Ollama lays it:
manifests/registry.ollama.ai/library/NAME/TAG naming a sha256 blob, mapped in place."""
from __future__ import annotations

import hashlib
import json

import pytest

import specdec
from helpers import cli, one_line_error
from specdec.models import ollama
from synth import TinySpec, write_tiny_model


def _put(root, parts, tag, blob: bytes | None, digest: str | None = None, model_layer: bool = True):
    digest = digest or "sha256:" + hashlib.sha256(blob or b"").hexdigest()
    if blob is not None:
        (root / "blobs").mkdir(parents=True, exist_ok=True)
        (root / "blobs" / digest.replace(":", "-")).write_bytes(blob)
    layers = [{"mediaType": "application/vnd.ollama.image.template", "digest": "sha256:" + "0" * 64, "size": 1}]
    if model_layer:
        layers.insert(0, {"mediaType": ollama.MODEL_LAYER, "digest": digest, "size": len(blob or b"")})
    folder = root.joinpath("manifests", *parts)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / tag).write_text(json.dumps({"schemaVersion": 2, "layers": layers,
                                          "config": {"digest": "sha256:" + "1" * 64}}))
    return digest


@pytest.fixture
def store(tmp_path, monkeypatch):
    root = tmp_path / "ollama"
    blob = write_tiny_model(tmp_path / "t.gguf", TinySpec(qtype=8, seed=9)).read_bytes()
    _put(root, ("registry.ollama.ai", "library", "tiny"), "latest", blob)
    _put(root, ("registry.ollama.ai", "library", "tiny"), "q8", blob)
    _put(root, ("registry.ollama.ai", "someone", "mine"), "v1", blob)
    _put(root, ("registry.ollama.ai", "library", "broken"), "latest", None, model_layer=False)
    _put(root, ("registry.ollama.ai", "library", "gone"), "latest", None, digest="sha256:" + "a" * 64)
    monkeypatch.setenv("OLLAMA_MODELS", str(root))
    return root, blob


def test_a_tag_resolves_to_its_blob_in_place(store):
    root, blob = store
    path = ollama.resolve("ollama:tiny")                                   # :latest
    assert path.parent == root / "blobs" and path.read_bytes() == blob
    assert ollama.resolve("ollama:tiny:q8") == path == ollama.resolve("ollama:someone/mine:v1")
    m = specdec.load("ollama:tiny:q8")
    assert str(m.path) == str(path)                                        # mapped there, no copy
    assert len(m.generate("ab", n_predict=3, ignore_eos=True).ids) == 3


@pytest.mark.parametrize("spec, error", [
    ("ollama:tiny:q4", r"no tag 'q4'; the store has latest, q8"),
    ("ollama:llama3", r"no such model in the Ollama store .*; it has .*tiny:latest, tiny:q8"),
    ("ollama:broken", r"names no model layer"),
    ("ollama:gone", r"blob .*sha256-a{64} is missing"),
    ("ollama:", r"expected ollama:NAME\[:TAG\]"),
    ("ollama:../x", r"expected ollama:NAME\[:TAG\]"),
])
def test_what_is_not_there_is_one_line(store, spec, error):
    with pytest.raises(ollama.OllamaError, match=error) as e:
        ollama.resolve(spec)
    assert "\n" not in str(e.value)


def test_an_empty_store_says_so(tmp_path, monkeypatch):
    monkeypatch.setenv("OLLAMA_MODELS", str(tmp_path / "none"))
    with pytest.raises(ollama.OllamaError, match="empty: `ollama pull` one first"):
        ollama.resolve("ollama:tiny")


def test_cli_takes_ollama_names(store):
    r = cli("run", "-m", "ollama:tiny:q8", "-p", "ab", "-n", "3", "--ignore-eos", "--raw")
    assert r.returncode == 0, r.stderr
    one_line_error(cli("run", "-m", "ollama:tiny:q4", "-p", "ab", "-n", "2"), "no tag 'q4'", "latest, q8")
