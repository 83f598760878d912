"""Mixture-of-experts FFN: a router and E experts per layer (qwen3moe; llama files with
experts, Mixtral), read from the file's 3-D expert tensors as zero-copy views.

    router   ffn_gate_inp.weight    (D) -> (E)             a Linear (often F32 in real files)
    gate     ffn_gate_exps.weight   E x (D) -> (F_exp)     [E, F_exp, D] in the file
    up       ffn_up_exps.weight     E x (D) -> (F_exp)
    down     ffn_down_exps.weight   E x (F_exp) -> (D)     [E, D, F_exp]

The forward (llama.cpp's build_moe_ffn with a softmax gate): probabilities = softmax(router
logits), the top k experts of each row, their probabilities renormalised to sum 1 where the
file says so (expert_weights_norm; llama.cpp's default for both architectures), each
expert's SwiGLU FFN, and the k outputs summed with those weights.  kernels/experts.py runs
each woken expert once over the rows that chose it; the experts stay as the file stores
them (never repacked or requantized: a one-row pass reads k of the E slices, and the page
cache holds only the experts that tokens wake).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from ..errors import GGUFError, UnsupportedModelError
from ..kernels import SUPPORTED_TYPES
from ..kernels.experts import expert_ffn, route
from .config import ModelConfig
from .gguf_file import GGUFFile


@dataclass(frozen=True)
class Experts:
    """E stacked matrices of one kind: w (E, N, ·) the raw rows of each, n_in = K, n_out = N."""
    name: str
    w: np.ndarray
    qtype: int
    n_in: int
    n_out: int

    @property
    def expert_bytes(self) -> int:
        return self.w[0].nbytes


@dataclass(frozen=True)
class MoE:
    router: object            # Linear (D) -> (E)
    gate: Experts             # E x (D) -> (F_exp)
    up: Experts               # E x (D) -> (F_exp)
    down: Experts             # E x (F_exp) -> (D)
    k: int                    # experts per row
    norm: bool                # renormalise the k weights
    scale: float              # then scale them
    float_act: bool = False   # keep the experts' activations in float32

    def __call__(self, h: np.ndarray, stats: list | None = None) -> np.ndarray:
        """h (M, D) normed -> (M, D); stats: gets the number of distinct experts woken."""
        logits = self.router(h)                                                  # (M, E)
        ids, weights = route(logits, self.k, self.norm, self.scale)              # (M, k) each
        if stats is not None:
            stats.append(int(np.unique(ids).size))
        return expert_ffn(self.gate.w, self.up.w, self.down.w,
                          (self.gate.qtype, self.up.qtype, self.down.qtype), h, ids, weights,
                          self.float_act)

    @property
    def expert_bytes(self) -> int:
        """Bytes of one expert's three matrices (what a newly woken expert costs to read)."""
        return self.gate.expert_bytes + self.up.expert_bytes + self.down.expert_bytes


def load_moe(gf: GGUFFile, cfg: ModelConfig, p: str, lin, seen: set[str], float_act: bool) -> MoE:
    """Layer p's router and experts ('blk.<i>.'); lin: weights.py's loader of a Linear."""
    D, E, F = cfg.d_model, cfg.n_expert, cfg.d_ff_exp

    def stack(kind: str, n_in: int, n_out: int) -> Experts:
        name = p + f"ffn_{kind}_exps.weight"
        seen.add(name)
        t = gf.tensors.get(name)
        if t is None:
            raise GGUFError(f"{gf.path}: missing tensor {name!r}")
        if t.dims != (n_in, n_out, E):
            raise GGUFError(f"{gf.path}: tensor {name!r} has shape {list(t.dims)}, expected {[n_in, n_out, E]}")
        if t.ggml_type not in SUPPORTED_TYPES:
            raise UnsupportedModelError(f"{gf.path}: tensor {name!r} has unsupported type {t.type_name}")
        raw = gf.tensor(name)
        return Experts(name, raw.reshape(E, n_out, -1), int(t.ggml_type), n_in, n_out)   # (E, N, ·)

    return MoE(router=lin(p + "ffn_gate_inp.weight", D, E),
               gate=stack("gate", D, F), up=stack("up", D, F), down=stack("down", F, D),
               k=cfg.n_expert_used, norm=cfg.expert_norm, scale=cfg.expert_scale, float_act=float_act)
