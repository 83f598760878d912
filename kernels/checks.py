"""Argument checks and weight views shared by the matmul wrappers (legacy, repack, float_act)."""
from __future__ import annotations

import numpy as np


def frozen(w: np.ndarray) -> np.ndarray:
    """Read-only, C-contiguous plain-ndarray view of w (GGUF tensors are contiguous already;
    anything else is copied).

    GGUFReader's memmaps are read-only and Numba compiles read-only arrays separately, so
    every weight goes in read-only: one specialization per kernel, whoever calls.
    """
    v = np.ascontiguousarray(w).view(np.ndarray)
    v.flags.writeable = False
    return v


def check_activations(x: np.ndarray, out: np.ndarray, n: int) -> None:
    """x must be C-contiguous float32 (M, K) and out C-contiguous float32 (M, n)."""
    if x.dtype != np.float32 or x.ndim != 2 or not x.flags.c_contiguous:
        raise ValueError("x must be a C-contiguous float32 (M, K) array")
    if out.dtype != np.float32 or out.shape != (x.shape[0], n) or not out.flags.c_contiguous:
        raise ValueError(f"out must be a C-contiguous float32 array of shape {(x.shape[0], n)}")
