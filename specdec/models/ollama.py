"""The GGUF files an Ollama install already holds: `-m ollama:NAME[:TAG]` and
`specdec.load("ollama:NAME[:TAG]")`.

Ollama keeps a manifest per tag, `<root>/manifests/registry.ollama.ai/library/NAME/TAG`
(`NAMESPACE/NAME` for a user's model, `HOST/NAMESPACE/NAME` for another registry), whose layer
of media type `application/vnd.ollama.image.model` names the weights' blob by digest:
`<root>/blobs/sha256-<hex>`, a GGUF file.  root is OLLAMA_MODELS, else ~/.ollama/models.
The blob is returned as it is, mapped in place by the engine: nothing is copied.  TAG defaults
to `latest`, as in Ollama.  Errors are one line (`OllamaError`) listing what is there.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

from ..errors import SpecdecError

PREFIX = "ollama:"
REGISTRY = "registry.ollama.ai"
MODEL_LAYER = "application/vnd.ollama.image.model"


class OllamaError(SpecdecError):
    """A model or tag that the Ollama store does not hold."""


def root() -> Path:
    return Path(os.environ.get("OLLAMA_MODELS") or Path.home() / ".ollama" / "models").expanduser()


def parse(spec: str) -> tuple[tuple[str, ...], str]:
    """'ollama:NAME[:TAG]' -> (the manifest folder's parts under manifests/, tag)."""
    s = spec[len(PREFIX):] if spec.startswith(PREFIX) else spec
    name, _, tag = s.rpartition(":") if ":" in s.split("/")[-1] else (s, "", "latest")
    parts = tuple(p for p in name.split("/") if p)
    if not parts or any(p in (".", "..") for p in parts) or not tag or "/" in tag:
        raise OllamaError(f"-m {spec!r}: expected ollama:NAME[:TAG]")
    if len(parts) == 1:
        parts = (REGISTRY, "library") + parts
    elif len(parts) == 2:
        parts = (REGISTRY,) + parts
    return parts, tag


def resolve(spec: str) -> Path:
    """The model blob of NAME:TAG in the Ollama store (module docstring)."""
    parts, tag = parse(spec)
    base = root()
    folder = base.joinpath("manifests", *parts)
    if not folder.is_dir():
        have = sorted(_names(base))
        raise OllamaError(f"-m {spec}: no such model in the Ollama store {base}"
                          + (f"; it has {', '.join(have)}" if have else " (empty: `ollama pull` one first)"))
    manifest = folder / tag
    if not manifest.is_file():
        tags = sorted(p.name for p in folder.iterdir() if p.is_file())
        raise OllamaError(f"-m {spec}: no tag {tag!r}; the store has {', '.join(tags) or 'none'}")
    try:
        layers = json.loads(manifest.read_text(encoding="utf-8")).get("layers", [])
        digest = next(x["digest"] for x in layers if x.get("mediaType") == MODEL_LAYER)
    except (ValueError, StopIteration, KeyError, TypeError, AttributeError):
        raise OllamaError(f"-m {spec}: manifest {manifest} names no model layer") from None
    if not isinstance(digest, str) or not digest.startswith("sha256:") or not digest[7:].isalnum():
        raise OllamaError(f"-m {spec}: manifest {manifest} has a bad digest {digest!r:.80}")
    blob = base / "blobs" / digest.replace(":", "-")
    if not blob.is_file():
        raise OllamaError(f"-m {spec}: blob {blob} is missing (the download did not finish?)")
    return blob


def _names(base: Path) -> list[str]:
    """NAME:TAG of every manifest in the store, library models by their short name."""
    out = []
    top = base / "manifests"
    if not top.is_dir():
        return out
    for m in top.rglob("*"):
        if m.is_file():
            rel = m.relative_to(top).parts
            name = "/".join(rel[2:-1]) if rel[:2] == (REGISTRY, "library") else "/".join(
                rel[1:-1] if rel[0] == REGISTRY else rel[:-1])
            out.append(f"{name}:{rel[-1]}")
    return out
