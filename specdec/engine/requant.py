"""Requantizing a model's matmul weights at load into a narrower format (e.g. a cheaper draft).

    spec = Requant.of("q4_0", "q4_0")      # layer matmuls, output head; None: as stored
    spec.target_for(name)                  # the ggml type tensor `name` becomes, or None
    convert(w, src, dst, k)                # kernels.quantize.requantize when dst is narrower

What it converts: the matmul weights of the layers (attention q/k/v/o, FFN gate/up/down)
with `layers`, the output head (output.weight, or the embedding table when the model ties
them) with `head`.  The embedding table as a lookup table is never converted (one row is read
per token).  A tensor is converted only when the new format has fewer bits per weight than
the stored one (Q8_0 8.5, Q6_K 6.56, Q5_0 5.5, Q4_K / Q4_0 4.5): requantizing never widens,
and never re-rounds a tensor into a format of its own width.  Requantizing goes through
float32 (kernels/quantize.py, ggml's reference rounding rules), in process memory; the file
is not written.

Exactness: a requantized draft model is another draft model; the draft's q is whatever its
session computes, so the speculative output law is untouched (only acceptance and cost
change).  A requantized target is a different model.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import ConfigError
from ..kernels import quantize as kq
from ..kernels.formats import FORMATS, Q4_0, Q5_0, Q8_0

TYPES = {"q4_0": Q4_0, "q5_0": Q5_0, "q8_0": Q8_0}      # name -> ggml type id
LAYER_MATRICES = ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")


def parse_type(name: str | None, flag: str) -> int | None:
    """'q4_0' / 'Q4_0' ... -> the ggml type id (None stays None); ConfigError naming flag."""
    if name is None:
        return None
    qt = TYPES.get(str(name).lower())
    if qt is None:
        raise ConfigError(f"{flag} must be one of {', '.join(TYPES)}, got {name!r}")
    return qt


def bits_per_weight(qtype: int) -> float:
    f = FORMATS[qtype]
    return 8.0 * f.type_size / f.block_size


@dataclass(frozen=True)
class Requant:
    """Target ggml types: `layers` for the layers' matmul weights, `head` for the output
    head (None: keep as stored)."""
    layers: int | None = None
    head: int | None = None

    @classmethod
    def of(cls, layers: str | None = None, head: str | None = None,
           flags: tuple[str, str] = ("requant", "requant_head")) -> "Requant | None":
        """From type names (validated, errors naming flags); None when both are None."""
        spec = cls(parse_type(layers, flags[0]), parse_type(head, flags[1]))
        return None if spec.layers is None and spec.head is None else spec

    def target_for(self, name: str) -> int | None:
        """The type tensor `name` is to become ('output.weight' or 'token_embd.weight' as
        the head; 'blk.<i>.<matrix>.weight' as a layer matmul), None for the rest."""
        if name in ("output.weight", "token_embd.weight"):
            return self.head
        parts = name.split(".")
        if len(parts) == 4 and parts[0] == "blk" and parts[2] in LAYER_MATRICES and parts[3] == "weight":
            return self.layers
        return None

    def describe(self) -> str:
        names = {v: k for k, v in TYPES.items()}
        return f"layers {names.get(self.layers, 'as stored')}, head {names.get(self.head, 'as stored')}"


def narrows(src: int, dst: int | None) -> bool:
    """True when rows of type src would be converted to dst (dst has fewer bits per weight)."""
    return dst is not None and src in FORMATS and bits_per_weight(dst) < bits_per_weight(src)


def convert(w: np.ndarray, src: int, dst: int, k: int) -> np.ndarray:
    """Raw rows (N, ·) of type src, k values each -> a new uint8 (N, ·) array in type dst."""
    return kq.requantize(w, src, dst, k)
