"""Legacy-format kernels (F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0): exactness,
accuracy against gguf's dequantization, row independence, and the Q8 activation quantizer.
"""
from __future__ import annotations

import gguf
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from numba import njit

from specdec.kernels import registry, formats, legacy, legacy_ir, reference, repack
from specdec.kernels.q8_act import q8_0_bytes, quantize_q8
from helpers import FLOATS, LAYOUT, emulate_float, make_weights, real_model_path, widen

T = gguf.GGMLQuantizationType
QUANTS = [T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0]
ALL = QUANTS + FLOATS
U = 2.0 ** -24  # unit roundoff of float32
SETTINGS = settings(max_examples=30, deadline=None)


# ------------------------------------------------------------------------------ helpers

def dequant(w: np.ndarray, qt) -> np.ndarray:
    """gguf's reference dequantization -> float32 (n, k)."""
    return w.astype(np.float32) if qt == T.F16 else gguf.quants.dequantize(w, qt)


def matmul(w, qt, x) -> np.ndarray:
    out = np.full((x.shape[0], w.shape[0]), np.nan, np.float32)
    legacy.MATMUL[int(qt)](w, np.ascontiguousarray(x, np.float32), out)
    return out


def error_bound(w: np.ndarray, qt, x: np.ndarray) -> np.ndarray:
    """Bound on |matmul - dequant(w) @ x| (M, N), from the rounding rules alone.

    Activations (quantized formats): x_j/d rounds to q with |x_j/d - q| <= 1/2 (+ ~1e-5 from
    the float32 product x*(1/d)), and d is stored in fp16 (relative error <= 2^-11), so
    |x_j - q*d16| <= d*(1/2 + 127*2^-11 + 1e-5) <= 0.57*d with d = amax/127 of the block.
    Each weight multiplies one such error: E_b = 0.57*d_b * sum_j |w_j|, where for the _1
    formats w_j = d_w*u_j + m_w is split as (d_w*u_j) * x_j + m_w * sum_j x_j and the Q8_1
    sum s = fp16(d*sum q) adds |m_w| * (32*0.57*d + 32*127*d*2^-10).
    Float rounding: every block term has <= 3 roundings and the running sum over nb blocks
    <= nb more, each <= u * (running magnitude) <= u * sum of |terms|: bound
    (nb + 4) * u * sum_b mag_b, with mag_b >= |term_b| (x widened by d to cover q*d16).
    Float formats: K/32 sequential adds per lane + products + 5 tree levels + K mod 32
    tail -> (K/32 + 38) * u * sum |w||x|.
    """
    ax = np.abs(x).astype(np.float64)
    k = x.shape[1]
    if qt in FLOATS:
        return (k // 32 + 38) * U * (ax @ np.abs(widen(w, qt)).astype(np.float64).T)
    nb = k // 32
    d = ax.reshape(x.shape[0], nb, 32).max(-1) / 127                      # (M, nb)
    codes, dw, mw = reference.legacy_parts(int(qt), w)
    if mw is None:
        wabs = np.abs(codes * dw[..., None].astype(np.float64))            # (N, nb, 32)
        act = 0.57 * np.einsum("mb,nbj->mn", d, wabs)
    else:
        off = LAYOUT[qt][3]
        wabs = np.abs((codes + off) * dw[..., None].astype(np.float64)) + np.abs(mw[..., None])
        act = 0.57 * np.einsum("mb,nb->mn", d, np.abs(dw) * (codes + off).sum(-1)) \
            + np.einsum("mb,nb->mn", d, np.abs(mw)) * 32 * (0.57 + 127 * 2.0 ** -10)
    xw = (ax.reshape(x.shape[0], nb, 32) + d[..., None] * 1.01).reshape(x.shape[0], k)
    flt = (nb + 4) * U * (xw @ wabs.reshape(w.shape[0], k).T)
    return act + flt * 1.01


@st.composite
def problems(draw, types=ALL, max_m: int = 9):
    qt = draw(st.sampled_from(types))
    m = draw(st.integers(1, max_m))
    n = draw(st.integers(1, 21))          # covers 8-row tiles and the padded tail tile
    k = 32 * draw(st.integers(1, 6)) + (draw(st.integers(0, 31)) if qt in FLOATS else 0)
    rng = np.random.default_rng(draw(st.integers(0, 2 ** 32 - 1)))
    w = make_weights(qt, n, k, rng, raw=draw(st.booleans()))
    x = (rng.standard_normal((m, k)) * 10.0 ** rng.uniform(-1, 1, (m, 1))).astype(np.float32)
    return qt, w, x, rng


# -------------------------------------------------------------------- activation quantizer

@SETTINGS
@given(seed=st.integers(0, 2 ** 32 - 1), m=st.integers(1, 6), nb=st.integers(1, 8),
       log_scale=st.floats(-6, 3), ties=st.booleans())
def test_q8_0_activation_bytes_match_gguf(seed, m, nb, log_scale, ties):
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal((m, nb * 32)) * 10.0 ** log_scale).astype(np.float32)
    if ties:  # x/d lands exactly on k + 1/2: roundf must go away from zero
        x = (rng.integers(-254, 255, x.shape) / 2).astype(np.float32)
        x[:, ::32] = 127.0
    if nb > 1:
        x[0, 32:64] = 0.0  # an all-zero block: d = 0, q = 0
    act = quantize_q8(x)
    ref = gguf.quants.quantize(x, T.Q8_0)
    assert np.array_equal(q8_0_bytes(act), ref)
    # Q8_1 extras: exact sums of q, and s = fp16(float32(sum q) * (amax/127)) as in
    # quantize_row_q8_1_ref (the float32 d, not the fp16 one)
    q = act.q.reshape(m, nb, 32).astype(np.int64)
    assert np.array_equal(act.qsum, q.sum(-1))
    d32 = np.abs(x).reshape(m, nb, 32).max(-1) / np.float32(127)
    s_ref = (q.sum(-1).astype(np.float32) * d32).astype(np.float16).astype(np.float32)
    assert np.array_equal(act.s, s_ref)


# ----------------------------------------------------------------------------- matmul

@SETTINGS
@given(problems())
def test_matmul_matches_documented_float_sequence_bitwise(problem):
    qt, w, x, _ = problem
    want = emulate_float(w, qt, x) if qt in FLOATS else reference.legacy_dot(int(qt), w, x)
    assert np.array_equal(matmul(w, qt, x).view(np.uint32), want.view(np.uint32))


@SETTINGS
@given(problems())
def test_matmul_within_derived_bound_of_dequantized_product(problem):
    qt, w, x, _ = problem
    ref = x.astype(np.float64) @ dequant(w, qt).astype(np.float64).T
    err = np.abs(matmul(w, qt, x) - ref)
    bound = error_bound(w, qt, x)
    assert np.all(err <= bound), float(np.max(err / bound))


@SETTINGS
@given(problems(max_m=17))
def test_rows_bitwise_independent_of_batch(problem):
    qt, w, x, rng = problem
    full = matmul(w, qt, x)
    m = int(rng.integers(0, x.shape[0]))
    alone = matmul(w, qt, x[m:m + 1])
    other = x.copy()
    other[np.arange(len(x)) != m] = rng.standard_normal((len(x) - 1, x.shape[1])) * 1e3
    mixed = matmul(w, qt, other)
    assert np.array_equal(full[m].view(np.uint32), alone[0].view(np.uint32))
    assert np.array_equal(full[m].view(np.uint32), mixed[m].view(np.uint32))


@pytest.mark.parametrize("qt", [T.Q4_1, T.Q8_0])
def test_rows_independent_across_activation_chunks(qt):
    """M above legacy.M_CHUNK: the tile is decoded again per chunk of rows."""
    rng = np.random.default_rng(7)
    m = legacy.M_CHUNK + 9
    w, x = make_weights(qt, 19, 96, rng, raw=True), rng.standard_normal((m, 96)).astype(np.float32)
    full = matmul(w, qt, x)
    for i in (0, legacy.M_CHUNK - 1, legacy.M_CHUNK, m - 1):
        assert np.array_equal(full[i], matmul(w, qt, x[i:i + 1])[0])
    assert np.array_equal(full, reference.legacy_dot(int(qt), w, x))


@pytest.mark.parametrize("qt, rows", [(T.Q5_0, 16), (T.Q5_0, legacy_ir.DECODE_ROWS), (T.Q4_1, 16)])
def test_portable_ir_path_matches_default_path(qt, rows):
    """The generic-IR fallback (no VNNI) computes the same integers, hence the same bits;
    so does a tile of the other height (Q5_0 decodes M = 1 in 8-row tiles)."""
    tile = legacy_ir.make_tile(int(qt), vnni=False, rows=rows)

    @njit
    def run(w, xq, xsum, xd, xs, k, acc):
        nb, m_rows = k // 32, xq.shape[0] // k
        for b in range(nb):
            tile(w, 0, w.shape[0] // rows, b, xq, xsum, xd, xs, k, nb, 0, m_rows, acc, 0, rows)

    rng = np.random.default_rng(3)
    w = make_weights(qt, rows, 128, rng, raw=True)
    x = rng.standard_normal((3, 128)).astype(np.float32)
    act = quantize_q8(x)
    acc = np.zeros(3 * rows, np.float32)
    run(w.reshape(-1), act.q.reshape(-1), act.qsum.reshape(-1), act.d.reshape(-1),
        act.s.reshape(-1), 128, acc)
    assert np.array_equal(acc.reshape(3, rows), matmul(w, qt, x))


@SETTINGS
@given(qt=st.sampled_from(QUANTS), seed=st.integers(0, 2 ** 32 - 1), tiles=st.integers(1, 5),
       nb=st.integers(1, 6), m=st.sampled_from([1, 2, 3, 9, 17, legacy.M_CHUNK + 3]))
def test_repacked_records_give_the_same_bits(qt, seed, tiles, nb, m):
    """kernels.repack: the 8-row records fill the tensor's shape, give back the GGUF rows
    (nothing lost) and the record matmul is bitwise the GGUF-layout matmul on raw random
    codes, for
    8-row tiles (M = 1), 16-row tiles, the odd last 8 rows and more than M_CHUNK rows."""
    rng = np.random.default_rng(seed)
    n, k = 8 * tiles, 32 * nb
    w = make_weights(qt, n, k, rng, raw=True)
    x = (rng.standard_normal((m, k)) * 10.0 ** rng.uniform(-1, 1, (m, 1))).astype(np.float32)
    r = repack.repack(w, int(qt))
    assert r.shape == w.shape and r.dtype == np.uint8
    assert np.array_equal(_unrepack(r, qt), w)
    got = np.empty((m, n), np.float32)
    repack.MATMUL[int(qt)](r, x, got)
    assert np.array_equal(got.view(np.uint32), matmul(w, qt, x).view(np.uint32))
    assert registry.layout_for(int(qt), n) == registry.REPACKED[int(qt)] and registry.layout_for(int(qt), n + 4) is None


def _unrepack(r: np.ndarray, qt) -> np.ndarray:
    """The GGUF rows back from repack's records (module docstring of kernels/repack.py)."""
    fp16, qh_at, qs_at, _ = LAYOUT[qt]
    bb = formats.FORMATS[int(qt)].type_size
    n, row_bytes = r.shape
    t, nb = n // 8, row_bytes // bb
    rec = r.reshape(t, nb, 8 * bb)
    blk = np.empty((t, nb, 8, bb), np.uint8)                       # (t, b, r, bb)
    pos = 0
    for o in fp16:                                                 # d, then m
        blk[..., o:o + 2] = rec[..., pos:pos + 16].reshape(t, nb, 8, 2)
        pos += 16
    if qh_at is not None:
        masks = rec[..., pos:pos + 32].copy().view("<u4")          # (t, b, 8 columns)
        qh = np.zeros((t, nb, 8), np.uint32)
        for c in range(8):
            for row in range(8):
                qh[..., row] |= ((masks[..., c] >> np.uint32(4 * row)) & np.uint32(15)) << np.uint32(4 * c)
        blk[..., qh_at:qh_at + 4] = qh.astype("<u4").view(np.uint8).reshape(t, nb, 8, 4)
        pos += 32
    n_vec = 8 if qt == T.Q8_0 else 4
    codes = rec[..., pos:pos + 32 * n_vec].reshape(t, nb, n_vec, 8, 4).transpose(0, 1, 3, 2, 4)
    blk[..., qs_at:] = codes.reshape(t, nb, 8, 4 * n_vec) ^ np.uint8(0x80 if qt == T.Q8_0 else 0)
    return blk.transpose(0, 2, 1, 3).reshape(n, row_bytes)


def test_bad_shapes_and_ids_are_rejected():
    w = make_weights(T.Q8_0, 4, 64, np.random.default_rng(0), raw=True)
    mm, gr = legacy.MATMUL[int(T.Q8_0)], legacy.GET_ROWS[int(T.Q8_0)]
    with pytest.raises(ValueError):
        mm(w, np.zeros((1, 96), np.float32), np.zeros((1, 4), np.float32))
    with pytest.raises(ValueError):
        mm(w, np.zeros((1, 64), np.float32), np.zeros((1, 5), np.float32))
    with pytest.raises(IndexError):
        gr(w, np.array([4]), np.zeros((1, 64), np.float32))
    with pytest.raises(ValueError):
        gr(w, np.array([3]), np.zeros((1, 32), np.float32))


# ---------------------------------------------------------------------------- get_rows

@SETTINGS
@given(qt=st.sampled_from(ALL), seed=st.integers(0, 2 ** 32 - 1), raw=st.booleans())
def test_get_rows_bit_exact(qt, seed, raw):
    rng = np.random.default_rng(seed)
    n, k = int(rng.integers(1, 12)), 32 * int(rng.integers(1, 5))
    w = make_weights(qt, n, k, rng, raw)
    ids = rng.integers(0, n, int(rng.integers(1, 6))).astype(np.int64)
    out = np.full((len(ids), k), np.nan, np.float32)
    legacy.GET_ROWS[int(qt)](w, ids, out)
    assert np.array_equal(out.view(np.uint32), dequant(w, qt)[ids].view(np.uint32))


# ----------------------------------------------------------------------- real GGUF data

@pytest.mark.real
def test_real_smollm2_tensors():
    """The reader's zero-copy arrays (Q4_1 weight, Q8_0 embedding) go in as they are."""
    reader = gguf.GGUFReader(real_model_path("smollm2-135m-instruct-q4_1"))
    tensors = {t.name: t for t in reader.tensors}
    rng = np.random.default_rng(0)
    for name in ("blk.0.ffn_up.weight", "token_embd.weight"):
        t = tensors[name]
        w = t.data[:40]
        x = rng.standard_normal((3, int(t.shape[0]))).astype(np.float32)
        out = matmul(w, t.tensor_type, x)
        ref = x.astype(np.float64) @ dequant(w, t.tensor_type).astype(np.float64).T
        assert np.all(np.abs(out - ref) <= error_bound(w, t.tensor_type, x))
        rows = np.empty((2, x.shape[1]), np.float32)
        legacy.GET_ROWS[int(t.tensor_type)](t.data, np.array([5, 39]), rows)
        assert np.array_equal(rows, dequant(w, t.tensor_type)[[5, 39]])
