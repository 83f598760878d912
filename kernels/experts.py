"""Mixture-of-experts kernels: the router's top-k, and the expert FFNs grouped by expert.

A MoE layer replaces the dense FFN by E experts, each an ordinary gate / up / down triple
stored as one slice of the 3-D tensors ffn_{gate,up,down}_exps (GGUF: [E, rows, cols], so
expert e's matrix is the e-th (N, row_bytes) block of the file, a zero-copy view).  A row
picks k experts; a pass over M rows:

    route(logits, k, norm, scale)   (M, E) router logits -> ids (M, k), weights (M, k):
                                    softmax, top-k, optional renormalisation, as llama.cpp's
                                    build_moe_ffn (gating softmax)
    groups(ids, n_expert)           the rows of each woken expert: (experts, starts, pairs)
    expert_ffn(...)                 every woken expert's three matmuls once over its own rows
                                    (the same multi-row kernels as the dense layers), the
                                    k outputs of each row weighted and summed in slot order

Row independence: route works row by row; each expert's matmul is row-independent (the
matmul contract in __init__); the sum runs over a row's own slots in a fixed order.  So a
row's output is the same bits whichever rows share its pass.  A one-row pass touches only its
k experts' bytes: the other E - k slices of the mapped file are never read.
The plain NumPy statement of all three is reference.moe_ffn.
"""
from __future__ import annotations

import math

import numpy as np
from numba import get_num_threads, njit

from . import matmul
from .kquants import matmul_q8k
from .kquants_ir import EXPERTS, MATMUL_Q8K
from .ops import swiglu
from .q8k import quantize_q8_k

F16_MIN = np.float32(6.103515625e-5)     # llama.cpp clamps the weight sum to the smallest fp16 normal


@njit(cache=True, nogil=True)
def route(logits, k, norm, scale):
    """logits (M, E) float32 -> ids (M, k) int64 (best first; the lower id on ties), weights
    (M, k) float32.  Softmax as ggml_soft_max (exp of the float32 difference to the row's max
    rounded to float32, their sum in float64, times its float32 reciprocal); the k largest
    probabilities; with norm each divided by their float64 sum clamped to F16_MIN; times scale
    when it is not 1."""
    M, E = logits.shape
    ids = np.empty((M, k), dtype=np.int64)
    w = np.empty((M, k), dtype=np.float32)
    p = np.empty(E, dtype=np.float32)
    taken = np.zeros(E, dtype=np.bool_)
    for m in range(M):
        mx = logits[m, 0]
        for e in range(1, E):
            mx = max(mx, logits[m, e])
        s = 0.0
        for e in range(E):
            p[e] = np.float32(math.exp(np.float64(logits[m, e] - mx)))
            s += np.float64(p[e])
        inv = np.float32(1.0 / s)
        for e in range(E):
            p[e] = p[e] * inv
            taken[e] = False
        for j in range(k):
            best = -1
            for e in range(E):
                if not taken[e] and (best < 0 or p[e] > p[best]):
                    best = e
            taken[best] = True
            ids[m, j] = best
            w[m, j] = p[best]
        if norm:
            t = 0.0
            for j in range(k):
                t += np.float64(w[m, j])
            tot = max(np.float32(t), F16_MIN)
            for j in range(k):
                w[m, j] = w[m, j] / tot
        if scale != 1.0:
            for j in range(k):
                w[m, j] = w[m, j] * np.float32(scale)
    return ids, w


# One row (decoding): the k experts' matmuls of one kind in one parallel region, a task per
# (expert, chunk of output rows), each the chunk kernel the dense driver runs (kquants_ir
# EXPERTS), so every value is the one matmul_q8k computes.   w3 (E, N, ·); ids (G,); xq3
# (G, K/256, 1, 256), xd3 (G, K/256, 1), xbs3 (G, K/256, 1, 16) each expert's Q8_K input;
# out3 (G, 1, N).
ONE_ROW = EXPERTS


def _per_expert(xq, xd, xbs, k: int):
    """Q8_K of k rows (quantize_q8_k's block-major layout) -> each row's own (K/256, 1, ·) arrays,
    stacked (k, ...), C-contiguous; k > 1 copies of one row when it has a single row."""
    if xd.shape[1] == 1:
        return tuple(np.ascontiguousarray(np.broadcast_to(a, (k, *a.shape))) for a in (xq, xd, xbs))
    return (np.ascontiguousarray(xq.transpose(1, 0, 2))[:, :, None, :],
            np.ascontiguousarray(xd.T)[:, :, None],
            np.ascontiguousarray(xbs.transpose(1, 0, 2))[:, :, None, :])


def _one_row_ffn(gate, up, down, qtypes, x, ids, weights) -> np.ndarray:
    """expert_ffn of a single row of K-quant experts: three parallel regions in all."""
    k, F, D = ids.shape[1], gate.shape[1], down.shape[1]
    e = np.ascontiguousarray(ids[0])                                         # (k,) in slot order
    xin = _per_expert(*quantize_q8_k(x), k)
    g = np.empty((k, 1, F), np.float32)
    u = np.empty((k, 1, F), np.float32)
    ONE_ROW[qtypes[0]](gate, e, *xin, g, max(1, min(get_num_threads(), F)))
    ONE_ROW[qtypes[1]](up, e, *xin, u, max(1, min(get_num_threads(), F)))
    a = g.reshape(k, F)
    swiglu(a, u.reshape(k, F), a)                                            # (k, F)
    out = np.empty((k, 1, D), np.float32)
    ONE_ROW[qtypes[2]](down, e, *_per_expert(*quantize_q8_k(a), k), out, max(1, min(get_num_threads(), D)))
    y = out[0] * weights[:, :1]                                              # (1, D)
    for j in range(1, k):
        y += out[j] * weights[:, j:j + 1]
    return y


def groups(ids: np.ndarray, n_expert: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """ids (M, k) -> (experts (G,) the woken ids ascending, starts (G + 1,), pairs (M k,)):
    pairs[starts[g]:starts[g + 1]] are the flat (row * k + slot) entries that chose experts[g],
    rows ascending."""
    flat = ids.ravel()                                                       # (M k,)
    pairs = np.argsort(flat, kind="stable")                                  # grouped by expert
    counts = np.bincount(flat, minlength=n_expert)                           # (E,)
    experts = np.flatnonzero(counts)                                         # (G,)
    starts = np.concatenate([[0], np.cumsum(counts[experts])])               # (G + 1,)
    return experts, starts, pairs


def expert_ffn(gate: np.ndarray, up: np.ndarray, down: np.ndarray, qtypes: tuple[int, int, int],
               x: np.ndarray, ids: np.ndarray, weights: np.ndarray, float_act: bool = False) -> np.ndarray:
    """sum_j weights[m, j] * down_e(silu(gate_e(x[m])) * up_e(x[m])), e = ids[m, j], over
    slots j = 0..k-1 in that order -> (M, D) float32.

    gate, up: (E, F, ·) and down (E, D, ·) the raw 3-D tensors (each [e] a 2-D weight of the
    matmul contract); x (M, D) float32.  Each woken expert runs its three matmuls once over
    the rows that chose it; K-quant gate / up share one Q8_K rounding of x (rows are rounded
    independently, so a gathered subset is the rounding of those rows); one SwiGLU over
    every (row, slot)."""
    M, k = ids.shape
    F, D = gate.shape[1], down.shape[1]
    if M == 1 and not float_act and all(q in ONE_ROW for q in qtypes) and gate.flags.c_contiguous:
        return _one_row_ffn(gate, up, down, qtypes, x, ids, weights)
    experts, starts, pairs = groups(ids, gate.shape[0])
    shared = not float_act and qtypes[0] in MATMUL_Q8K and qtypes[1] in MATMUL_Q8K
    xq = quantize_q8_k(x) if shared else None                               # Q8_K of every row
    g = np.empty((M * k, F), dtype=np.float32)                               # by pair row*k + slot
    u = np.empty((M * k, F), dtype=np.float32)
    for i, e in enumerate(experts):
        sel = pairs[starts[i]:starts[i + 1]]                                 # (m_e,) row*k + slot
        rows = sel // k
        if shared:
            part = xq if len(rows) == M else tuple(np.ascontiguousarray(a[:, rows]) for a in xq)
            a, b = (np.empty((len(rows), F), np.float32) for _ in range(2))
            matmul_q8k(qtypes[0], gate[e], *part, a)
            matmul_q8k(qtypes[1], up[e], *part, b)
        else:
            xe = x[rows]                                                     # (m_e, D) a copy
            a = matmul(gate[e], qtypes[0], xe, float_act=float_act)          # (m_e, F)
            b = matmul(up[e], qtypes[1], xe, float_act=float_act)
        g[sel], u[sel] = a, b
    swiglu(g, u, g)                                                          # (M k, F)
    out = np.empty((M * k, D), dtype=np.float32)                             # each slot's output
    for i, e in enumerate(experts):
        sel = pairs[starts[i]:starts[i + 1]]
        out[sel] = matmul(down[e], qtypes[2], g[sel], float_act=float_act)   # (m_e, D)
    out = out.reshape(M, k, D)
    y = out[:, 0] * weights[:, :1]                                           # (M, D)
    for j in range(1, k):
        y += out[:, j] * weights[:, j:j + 1]
    return y
