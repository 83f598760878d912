"""Plain NumPy references of the fast kernels: what each computes, value by value, to test them by.

Slow and obvious on purpose: the integer parts of a quantized block as ggml's
``dequantize_row_*`` reads them, and the float operations in the order the kernels promise.
The tests compare the kernels with these bit for bit.

    kquant_parts(qtype, w)          K-quant rows -> codes u, group scales sc and mins mn, d, dmin, off
    kquant_dot(qtype, w, x)         out (M, N) of the K-quant × Q8_K contract (ggml's integer order)
    legacy_parts(qtype, w)          Q4_0 … Q8_0 rows -> signed codes, d, m per block of 32
    legacy_dot(qtype, w, x)         out (M, N) of the legacy × Q8_0/Q8_1 contract (legacy_ir)
    float_dot(w, x)                 out (M, N) of the float-weight contract (32 lanes, fixed tree)
    iquant_rows(qtype, w)           IQ4_NL / IQ4_XS / MXFP4 rows -> int8 values, scales per group of 32
    iquant_dot(qtype, w, x)         out (M, N) of their contract (ggml's *_generic order, iquants.py)
    attention(q, k, v, pos, …)      causal grouped-query attention in float64 (attention.py)
    attention_tree(q, k, v, …)      a token tree's attention in float64 (attention_tree.py)
    rms_norm(x, w, eps)             RMSNorm over the last axis in float64 (ops.rms_norm, rms_norm_heads)
    rope(x, positions, base, …)     rotary embedding in float64, NORM or NEOX pairs, rope_freqs
                                    factors, linear scaling (ops.rope_cos_sin + ops.rope_apply)
    swiglu(g, u), geglu(g, u)       silu(g)·u and gelu_tanh(g)·u in float64 (ops.swiglu, ops.geglu)
    fma32(a, b, c)                  a·b + c rounded once to float32 (llvm.fma), element-wise
    moe_route(logits, k, norm, s)   the router's softmax, top-k and renormalisation (experts.route)
    moe_ffn(...)                    the k experts of each row, one row at a time (experts.expert_ffn)
    causal_conv_silu(state0, x, w)  the short causal conv1d and silu in float64 (delta_rule.causal_conv_silu)
    gated_delta_rule(s0, q, k, v, g, beta)
                                    the gated delta rule row by row in float64 -> (out, state)
                                    (delta_rule.gated_delta_rule)
"""
from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from .formats import FORMATS, IQ4_XS, MXFP4, Q2_K, Q3_K, Q4_0, Q4_1, Q4_K, Q5_0, Q5_1, Q5_K, Q6_K, Q8_0, QK_K
from .q8_act import quantize_q8
from .q8k import natural_order, quantize_q8_k


class KParts(NamedTuple):
    """A K-quant matrix of N rows and nb super-blocks, value v of block b of row n being
    d·sc·(u − off) − dmin·mn with the group g = v // 16 (16 groups of 16 values)."""
    u: np.ndarray            # int32 (N, nb, 256): unsigned codes
    sc: np.ndarray           # int32 (N, nb, 16): the scale of each group
    mn: np.ndarray | None    # int32 (N, nb, 16): the min of each group (Q2_K, Q4_K, Q5_K)
    d: np.ndarray            # float32 (N, nb)
    dmin: np.ndarray | None  # float32 (N, nb)
    off: int                 # Q3_K 4, Q6_K 32, else 0


def _f16(blocks: np.ndarray, at: int) -> np.ndarray:
    return blocks[..., at:at + 2].copy().view(np.float16)[..., 0].astype(np.float32)


def _scale_min_k4(s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """get_scale_min_k4 for j = 0 … 7 of the 12 bytes s (…, 12) -> sc, mn (…, 8)."""
    s = s.astype(np.int32)
    sc = np.concatenate([s[..., 0:4] & 63, (s[..., 8:12] & 15) | ((s[..., 0:4] >> 6) << 4)], -1)
    mn = np.concatenate([s[..., 4:8] & 63, (s[..., 8:12] >> 4) | ((s[..., 4:8] >> 6) << 4)], -1)
    return sc, mn


def _per16(per32: np.ndarray) -> np.ndarray:
    return np.repeat(per32, 2, axis=-1)


def _crumbs(qs: np.ndarray) -> np.ndarray:
    """Value 128h + 32s + l: (qs[32h + l] >> 2s) & 3 -> (…, 256)."""
    q = qs.astype(np.int32).reshape(*qs.shape[:-1], 2, 1, 32)
    return ((q >> (2 * np.arange(4)[:, None])) & 3).reshape(*qs.shape[:-1], QK_K)


def kquant_parts(qtype: int, w: np.ndarray) -> KParts:
    """w uint8 (N, row_bytes), GGUF layout -> its KParts (dequantize_row_q{2..6}_K)."""
    n = w.shape[0]
    bb = FORMATS[qtype].type_size
    blk = w.reshape(n, -1, bb)
    if qtype in (Q4_K, Q5_K):
        sc, mn = _scale_min_k4(blk[..., 4:16])
        qs = blk[..., 16:144] if qtype == Q4_K else blk[..., 48:176]
        q = qs.astype(np.int32).reshape(n, -1, 4, 1, 32)
        u = ((q >> (4 * np.arange(2)[:, None])) & 15).reshape(n, -1, QK_K)
        if qtype == Q5_K:
            qh = blk[..., 16:48].astype(np.int32)[..., None, :]             # (…, 1, 32)
            u = u + 16 * ((qh >> np.arange(8)[:, None]) & 1).reshape(n, -1, QK_K)
        return KParts(u, _per16(sc), _per16(mn), _f16(blk, 0), _f16(blk, 2), 0)
    if qtype == Q6_K:
        ql = blk[..., 0:128].astype(np.int32).reshape(n, -1, 2, 2, 32)      # (h, half, l)
        qh = blk[..., 128:192].astype(np.int32).reshape(n, -1, 2, 1, 32)
        low = np.stack([ql & 15, ql >> 4], axis=3)                          # (h, nib, half, l)
        low = low.reshape(n, -1, 2, 4, 32)                                  # s = 2·nib + half
        high = (qh >> (2 * np.arange(4)[:, None])) & 3                      # (h, s, l)
        u = (low | (high << 4)).reshape(n, -1, QK_K)
        sc = blk[..., 192:208].copy().view(np.int8).astype(np.int32)
        return KParts(u, sc, None, _f16(blk, 208), None, 32)
    if qtype == Q3_K:
        hm = blk[..., 0:32].astype(np.int32).reshape(n, -1, 1, 1, 32)
        bit = (hm >> (4 * np.arange(2)[:, None, None] + np.arange(4)[:, None])) & 1   # (h, s, l)
        u = _crumbs(blk[..., 32:96]) | (bit.reshape(n, -1, QK_K) << 2)
        s = blk[..., 96:108].astype(np.int32)
        g = np.arange(16)
        sc = (((s[..., g % 8] >> (4 * (g // 8))) & 15) | (((s[..., 8 + g % 4] >> (2 * (g // 4))) & 3) << 4)) - 32
        return KParts(u, sc, None, _f16(blk, 108), None, 4)
    if qtype == Q2_K:
        s = blk[..., 0:16].astype(np.int32)
        return KParts(_crumbs(blk[..., 16:80]), s & 15, s >> 4, _f16(blk, 80), _f16(blk, 82), 0)
    raise ValueError(f"not a K-quant: {qtype}")


def fma32(a, b, c) -> np.ndarray:
    """a·b + c rounded once to float32 (what llvm.fma / vfmadd computes), element-wise: the
    product is exact in float64, the sum's error is kept (TwoSum), and a float64 result on
    a float32 tie is broken by that error's sign."""
    a, b, c = (np.asarray(v, np.float32).astype(np.float64) for v in (a, b, c))
    p = a * b
    s = p + c
    bv = s - p
    e = (p - (s - bv)) + (c - bv)                   # s + e == p + c exactly
    r = s.astype(np.float32)
    toward = np.where(s > r.astype(np.float64), np.float32(np.inf), np.float32(-np.inf))
    other = np.nextafter(r, toward.astype(np.float32))
    mid = (r.astype(np.float64) + other.astype(np.float64)) / 2
    tie = (s == mid) & (e != 0) & (s != r.astype(np.float64))
    pick_other = tie & (np.sign(e) == np.sign(other.astype(np.float64) - s))
    return np.where(pick_other, other, r).astype(np.float32)


def kquant_dot(qtype: int, w: np.ndarray, x: np.ndarray) -> np.ndarray:
    """out (M, N) float32 = x (M, K) · Wᵀ by the K-quant contract, ggml's integer order
    (ggml_vec_dot_qX_K_q8_K): x quantized to Q8_K (q8k.py: codes xq, scale dx); per (m, n)
    one float32 accumulator from 0, super-block b ascending, the 16 groups g of 16 values:
        dot[g]  = Σ_{v∈g} u_v·xq_v,   bsum[g] = Σ_{v∈g} xq_v                 (exact integers)
        isum    = Σ_g sc[g]·(dot[g] − off·bsum[g])                           (exact int32)
        imin    = Σ_g mn[g]·bsum[g]                                          (Q2_K, Q4_K, Q5_K)
        acc     = fma(float32(isum), d·dx, acc)
        acc     = fma(float32(imin), −(dmin·dx), acc)                        (Q2_K, Q4_K, Q5_K)
    d·dx and dmin·dx are float32 products (one rounding each); float32(i) rounds to nearest
    even (cvtdq2ps).  Every path, layout and M computes exactly this."""
    parts = kquant_parts(qtype, w)
    xq, xd, _ = quantize_q8_k(np.ascontiguousarray(x, np.float32))
    m, n, nb = x.shape[0], w.shape[0], xd.shape[0]
    codes = natural_order(xq).astype(np.int64).reshape(m, nb, 16, 16)      # (M, b, g, 16)
    u = parts.u.astype(np.int64).reshape(n, nb, 16, 16)                    # (N, b, g, 16)
    dots = np.einsum("mbgi,nbgi->mnbg", codes, u)                          # (M, N, b, g)
    bsum = codes.sum(axis=-1)                                              # (M, b, g)
    sc = parts.sc.astype(np.int64)                                         # (N, b, g)
    isum = (sc[None] * (dots - parts.off * bsum[:, None])).sum(-1)         # (M, N, b)
    assert np.abs(isum).max(initial=0) < 2**31
    acc = np.zeros((m, n), np.float32)
    for b in range(nb):
        ddx = parts.d[None, :, b] * xd[b][:, None]                          # (M, N) float32
        acc = fma32(isum[:, :, b].astype(np.float32), ddx, acc)
        if parts.mn is not None:
            imin = (parts.mn[None, :, b].astype(np.int64) * bsum[:, None, b]).sum(-1)   # (M, N)
            mdx = -(parts.dmin[None, :, b] * xd[b][:, None])                # (M, N) float32
            acc = fma32(imin.astype(np.float32), mdx, acc)
    return acc


# byte layout of a legacy block of 32: (fp16 fields d[, m], offset of qh or None, of qs, code offset)
LEGACY_LAYOUT = {Q4_0: ((0,), None, 2, 8), Q4_1: ((0, 2), None, 4, 0), Q5_0: ((0,), 2, 6, 16),
                 Q5_1: ((0, 2), 4, 8, 0), Q8_0: ((0,), None, 2, 0)}


def legacy_parts(qtype: int, w: np.ndarray):
    """uint8 (N, row_bytes) -> (codes int64 (N, nb, 32), d, m float32 (N, nb) or None):
    W = d·codes (+ m for Q4_1 / Q5_1), codes = u − offset (dequantize_row_q4_0 …)."""
    f16s, qh_at, qs_at, off = LEGACY_LAYOUT[qtype]
    n = w.shape[0]
    blk = w.reshape(n, -1, FORMATS[qtype].type_size)
    scales = [_f16(blk, o) for o in f16s]
    if qtype == Q8_0:
        codes = blk[:, :, 2:].copy().view(np.int8).astype(np.int64)
    else:
        qs = blk[:, :, qs_at:qs_at + 16].astype(np.int64)
        codes = np.concatenate([qs & 15, qs >> 4], axis=-1)
        if qh_at is not None:
            qh = blk[:, :, qh_at:qh_at + 4].copy().view(np.uint32).astype(np.int64)
            codes |= ((qh >> np.arange(32)) & 1) << 4
        codes -= off
    return codes, scales[0], (scales[1] if len(scales) > 1 else None)


def legacy_dot(qtype: int, w: np.ndarray, x: np.ndarray) -> np.ndarray:
    """out (M, N) float32 by the legacy contract (legacy_ir): x quantized to Q8_0 / Q8_1
    (q8_act.py); per block b in order, acc += (d_w·d_x)·float(isum) [+ m_w·s_x] with isum
    the exact integer dot product."""
    act = quantize_q8(np.ascontiguousarray(x, np.float32))
    codes, dw, mw = legacy_parts(qtype, w)
    q = act.q.reshape(x.shape[0], -1, 32).astype(np.int64)
    isum = np.einsum("nbj,mbj->mnb", codes, q)                     # exact, (M, N, nb)
    acc = np.zeros((x.shape[0], w.shape[0]), np.float32)
    for b in range(codes.shape[1]):
        t = (dw[None, :, b] * act.d[:, None, b]) * isum[:, :, b].astype(np.float32)
        if mw is not None:
            t = t + mw[None, :, b] * act.s[:, None, b]
        acc = acc + t
    return acc


_KV = {MXFP4: [0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12]}
_KV_NL = [-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113]


def iquant_rows(qtype: int, w: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """IQ4_NL / MXFP4 / IQ4_XS rows (N, bytes) -> (values int32 (N, G, 32) from the table, the
    block scale float32 (N, nb: fp16 d, or E8M0 2^(e-128)), IQ4_XS's ls − 32 int32 (N, nb, 8))."""
    n = w.shape[0]
    kv = np.array(_KV.get(qtype, _KV_NL), np.int32)
    if qtype == IQ4_XS:
        blk = w.reshape(n, -1, 136)
        d = _f16(blk, 0)                                                               # (N, nb)
        h = blk[:, :, 2].astype(np.int32) | (blk[:, :, 3].astype(np.int32) << 8)
        g = np.arange(8)
        lo = (blk[:, :, 4 + g // 2].astype(np.int32) >> (4 * (g % 2))) & 15            # (N, nb, 8)
        ls = lo | (((h[..., None] >> (2 * g)) & 3) << 4)
        qs = blk[:, :, 8:].reshape(n, -1, 8, 16)
        return kv[np.concatenate([qs & 15, qs >> 4], axis=-1)].reshape(n, -1, 32), d, ls - 32
    size, at = (17, 1) if qtype == MXFP4 else (18, 2)
    blk = w.reshape(n, -1, size)
    if qtype == MXFP4:
        d = (2.0 ** (blk[:, :, 0].astype(np.float64) - 128)).astype(np.float32)         # exact powers of 2
    else:
        d = _f16(blk, 0)
    qs = blk[:, :, at:]
    return kv[np.concatenate([qs & 15, qs >> 4], axis=-1)], d, None


def iquant_dot(qtype: int, w: np.ndarray, x: np.ndarray) -> np.ndarray:
    """out (M, N) float32 of IQ4_NL / MXFP4 (x as Q8_0) and IQ4_XS (x as Q8_K): per group of
    32 in order, acc += d·float(isum), d = d_w·d_x (IQ4_XS: (d_w·d_x)·float(ls − 32))."""
    vals, dw, ls = iquant_rows(qtype, w)                                  # (N, G, 32)
    x = np.ascontiguousarray(x, np.float32)
    if qtype == IQ4_XS:
        xq, xd, _ = quantize_q8_k(x)
        q = natural_order(xq).reshape(x.shape[0], -1, 32).astype(np.int64)            # (M, G, 32)
        xd = np.repeat(xd.T, 8, axis=1)                                                # (M, G)
    else:
        act = quantize_q8(x)
        q, xd = act.q.reshape(x.shape[0], -1, 32).astype(np.int64), act.d
    isum = np.einsum("ngj,mgj->mng", vals.astype(np.int64), q).astype(np.float32)     # exact, (M, N, G)
    acc = np.zeros((x.shape[0], w.shape[0]), np.float32)
    for g in range(vals.shape[1]):
        if qtype == IQ4_XS:
            d = (dw[None, :, g // 8] * xd[:, None, g]) * ls[None, :, g // 8, g % 8].astype(np.float32)
        else:
            d = xd[:, None, g] * dw[None, :, g]
        acc = acc + d * isum[:, :, g]
    return acc


def float_dot(w: np.ndarray, x: np.ndarray) -> np.ndarray:
    """out (M, N) float32 for float weights w (N, K) given as exact float32: 32 interleaved
    float32 partial sums l[0..31]; v[j] = (l[j]+l[j+8]) + (l[j+16]+l[j+24]);
    ((v0+v1)+(v2+v3))+((v4+v5)+(v6+v7)); then the K mod 32 tail in order (legacy_ir)."""
    a, k = np.asarray(w, np.float32), x.shape[1]
    k32 = k - k % 32
    lanes = np.zeros((x.shape[0], w.shape[0], 32), np.float32)
    for i in range(0, k32, 32):
        lanes = lanes + a[None, :, i:i + 32] * x[:, None, i:i + 32]
    v = (lanes[..., 0:8] + lanes[..., 8:16]) + (lanes[..., 16:24] + lanes[..., 24:32])
    total = ((v[..., 0] + v[..., 1]) + (v[..., 2] + v[..., 3])) \
        + ((v[..., 4] + v[..., 5]) + (v[..., 6] + v[..., 7]))
    for i in range(k32, k):
        total = total + a[None, :, i] * x[:, None, i]
    return total


def attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, positions, scale: float,
              window: int = 0) -> np.ndarray:
    """Causal grouped-query attention in float64, the value attention.py approximates in
    float32: q (M, H, Dh), k and v (Hkv, n_ctx, Dh) in position order (not the cache's blocked
    key layout), positions (M,): row m sees the keys at positions ≤ positions[m] (and, with a
    sliding window, > positions[m] − window) -> (M, H, Dh)."""
    M, H, Dh = q.shape
    n_rep = H // k.shape[0]
    out = np.zeros((M, H, Dh))
    for m in range(M):
        p = int(positions[m])
        j0 = max(0, p - window + 1) if window else 0
        for h in range(H):
            s = k[h // n_rep, j0:p + 1].astype(np.float64) @ q[m, h].astype(np.float64) * scale
            w = np.exp(s - s.max())
            out[m, h] = (w / w.sum()) @ v[h // n_rep, j0:p + 1]
    return out


def attention_tree(q: np.ndarray, k: np.ndarray, v: np.ndarray, base: int, parents, scale: float,
                   window: int = 0) -> np.ndarray:
    """A token tree's attention in float64 (attention_tree.py): q (T, H, Dh) the rows of tree
    nodes stored at slots base … base+T−1, k and v (Hkv, base+T, Dh) in slot order, parents (T,)
    (−1 for a root, else an earlier node).  Node i sees the context slots 0 … base−1 at their
    own positions and its ancestors a (itself included) at positions base + depth(a), within the
    sliding window p − window < pos ≤ p of its own position p = base + depth(i) -> (T, H, Dh)."""
    T, H, Dh = q.shape
    n_rep = H // k.shape[0]
    depth, chains = [], []
    for i, a in enumerate(parents):
        depth.append(0 if a < 0 else depth[a] + 1)
        chains.append(([] if a < 0 else chains[a]) + [i])
    out = np.zeros((T, H, Dh))
    for i in range(T):
        slots = np.array(list(range(base)) + [base + a for a in chains[i]], dtype=np.int64)
        pos = np.array(list(range(base)) + [base + depth[a] for a in chains[i]], dtype=np.int64)
        p = base + depth[i]
        seen = slots[pos > p - window] if window else slots
        for h in range(H):
            s = k[h // n_rep, seen].astype(np.float64) @ q[i, h].astype(np.float64) * scale
            w = np.exp(s - s.max())
            out[i, h] = (w / w.sum()) @ v[h // n_rep, seen]
    return out


def rms_norm(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    """x / sqrt(mean(x²) + eps) · w over the last axis, in float64.   x (…, D), w (D,)."""
    x = np.asarray(x, np.float64)
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * np.asarray(w, np.float64)


def rope(x: np.ndarray, positions, base: float, neox: bool = False, n_rot: int | None = None,
         freq_scale: float = 1.0, factors=None) -> np.ndarray:
    """Rotary embedding in float64 (ggml_rope_ext with linear scaling): x (M, H, Dh), positions
    (M,).  Pair i < n_rot/2 turns by theta = freq_scale · pos · base^(−2i/n_rot) / factors[i]
    (factors: the rope_freqs tensor of Llama 3.1+, ones without one); NORM (neox=False) pairs
    (x[2i], x[2i+1]), NEOX pairs (x[i], x[i + n_rot/2]); the dimensions past n_rot stay."""
    x = np.asarray(x, np.float64)
    n_rot = x.shape[-1] if n_rot is None else n_rot
    half = n_rot // 2
    factors = np.ones(half) if factors is None else np.asarray(factors, np.float64)
    theta = freq_scale * (np.asarray(positions, np.float64)[:, None]
                          * base ** (-2.0 * np.arange(half) / n_rot) / factors)        # (M, half)
    c, s = np.cos(theta)[:, None, :], np.sin(theta)[:, None, :]                       # (M, 1, half)
    a, b = (np.arange(half), np.arange(half) + half) if neox else (np.arange(0, n_rot, 2), np.arange(1, n_rot, 2))
    out = x.copy()
    out[..., a] = x[..., a] * c - x[..., b] * s
    out[..., b] = x[..., a] * s + x[..., b] * c
    return out


def swiglu(g: np.ndarray, u: np.ndarray) -> np.ndarray:
    """silu(g) · u = g / (1 + e^−g) · u, in float64."""
    g = np.asarray(g, np.float64)
    return g / (1.0 + np.exp(-g)) * u


def geglu(g: np.ndarray, u: np.ndarray) -> np.ndarray:
    """gelu_tanh(g) · u = 0.5 g (1 + tanh(sqrt(2/π) (g + 0.044715 g³))) · u, in float64."""
    g = np.asarray(g, np.float64)
    return 0.5 * g * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (g + 0.044715 * g ** 3))) * u


def moe_route(logits: np.ndarray, k: int, norm: bool, scale: float = 1.0):
    """(M, E) float32 -> ids (M, k) int64, weights (M, k) float32, as experts.route: per row
    p = float32(exp(l - max)) * float32(1 / float64 sum, in order); the k largest (lower id first
    on ties); with norm divided by max(float32(float64 sum), 6.103515625e-5); times scale."""
    M, E = logits.shape
    ids, w = np.empty((M, k), np.int64), np.empty((M, k), np.float32)
    for m in range(M):
        d = logits[m] - logits[m].max()                                           # (E,) float32
        e = np.array([math.exp(float(v)) for v in d], np.float32)                 # libm exp, rounded
        p = e * np.float32(1.0 / sum(float(v) for v in e))                        # float64 sum in order
        ids[m] = np.lexsort((np.arange(E), -p))[:k]
        w[m] = p[ids[m]]
        if norm:
            w[m] = w[m] / max(np.float32(sum(float(v) for v in w[m])), np.float32(6.103515625e-5))
        if scale != 1.0:
            w[m] *= np.float32(scale)
    return ids, w


def moe_ffn(matmul, swiglu, gate, up, down, qtypes, x: np.ndarray, ids: np.ndarray,
            weights: np.ndarray) -> np.ndarray:
    """experts.expert_ffn one row and one slot at a time, no grouping: matmul(w, qtype, x) and
    swiglu(g, u, out) the dense kernels (their own references are above and in the ops
    tests), each row's k expert outputs weighted and summed in slot order -> (M, D) float32."""
    M, k = ids.shape
    y = np.empty((M, down.shape[1]), np.float32)
    for m in range(M):
        xm = x[m:m + 1]
        for j in range(k):
            e = ids[m, j]
            g, u = matmul(gate[e], qtypes[0], xm), matmul(up[e], qtypes[1], xm)      # (1, F)
            swiglu(g, u, g)
            o = matmul(down[e], qtypes[2], g)[0] * weights[m, j]                     # (D,)
            y[m] = o if j == 0 else y[m] + o
    return y


def causal_conv_silu(state0: np.ndarray, x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """silu(sum_j w[:, j] xin[m + j]) over xin = [state0; x] in float64.   state0: (K-1, C),
    x: (M, C), w: (C, K) -> (M, C)."""
    K = w.shape[1]
    xin = np.concatenate([state0, x]).astype(np.float64)                      # (K-1+M, C)
    y = np.stack([(xin[m:m + K] * w.T.astype(np.float64)).sum(0) for m in range(len(x))])
    return y / (1 + np.exp(-y))


def gated_delta_rule(s0: np.ndarray, q: np.ndarray, k: np.ndarray, v: np.ndarray, g: np.ndarray,
                     beta: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """In float64, row by row, value head h with key head h % Hk, on T = Sᵀ (key x value):
    T = e^g T;  T += k (beta (v - kᵀ T))ᵀ;  out = qᵀ T / sqrt(Dk).   s0: (Hv, Dk, Dv); q, k:
    (M, Hk, Dk); v: (M, Hv, Dv); g, beta: (M, Hv) -> (out (M, Hv, Dv), the final state)."""
    T = s0.astype(np.float64).copy()
    M, Hk, Dk = q.shape
    Hv = T.shape[0]
    out = np.empty((M, Hv, T.shape[2]))
    for m in range(M):
        for h in range(Hv):
            kk, qq = k[m, h % Hk].astype(np.float64), q[m, h % Hk].astype(np.float64)
            T[h] *= math.exp(g[m, h])
            T[h] += np.outer(kk, beta[m, h] * (v[m, h] - kk @ T[h]))
            out[m, h] = qq @ T[h] / math.sqrt(Dk)
    return out, T
