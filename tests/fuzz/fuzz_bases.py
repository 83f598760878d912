"""The files the GGUF fuzzer mutates: tiny synthetic models of each architecture and quant
family, and (when the model cache has it) SmolLM2's real header with its data cut short."""
from __future__ import annotations

from pathlib import Path

from gguf import GGMLQuantizationType as T

from gguf_mutants import HEADER_KINDS, KINDS, scan
from synth import TinySpec, write_tiny_model

SPECS = {
    "llama-f32": TinySpec(arch="llama", n_layer=1, n_vocab=40, d_model=32, n_head=2, n_head_kv=1, d_ff=48),
    "qwen2-q8_0": TinySpec(arch="qwen2", n_layer=1, n_vocab=40, d_model=64, n_head=4, n_head_kv=2, d_ff=64,
                           qtype=int(T.Q8_0), seed=1),
    "gemma3-q4_k": TinySpec(arch="gemma3", n_layer=2, n_vocab=40, d_model=256, n_head=2, n_head_kv=1, d_ff=256,
                            qtype=int(T.Q4_K), seed=2, tied=True, sliding_window=2,
                            chat_template="{% for m in messages %}{{ m.content }}{% endfor %}"),
}
REAL_HEADER_DATA = 1 << 16       # bytes of tensor data kept after a real file's header


def synthetic_bases(dirpath: Path) -> list[tuple[str, Path, tuple[str, ...]]]:
    return [(name, write_tiny_model(Path(dirpath) / f"{name}.gguf", spec), KINDS) for name, spec in SPECS.items()]


def real_header_base(src: Path, dirpath: Path, name: str) -> tuple[str, Path, tuple[str, ...]]:
    """The header, KV section and tensor infos of a real file, with 64 KiB of its data: every
    mutant that parses at all then fails as truncated (an expected error)."""
    with open(src, "rb") as f:
        head = f.read(64 << 20)
    lay = scan(head)
    out = Path(dirpath) / f"{name}-header.gguf"
    out.write_bytes(head[:lay.data_start + REAL_HEADER_DATA])
    return f"{name}-header", out, HEADER_KINDS
