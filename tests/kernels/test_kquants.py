"""K-quant kernels (Q2_K … Q6_K): Q8_K activation quantizer, matmul, row lookup.

References: gguf.quants.dequantize (the ggml block layouts), a NumPy transcription of
quantize_row_q8_K_ref, and exact arithmetic on inputs every float operation represents
exactly.  Random weight blocks are random bytes with finite fp16 scale fields (gguf-py
cannot quantize to K-quants).
"""
from __future__ import annotations

import gguf
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from numba import njit

from specdec.kernels import formats, kquants, kquants_ir, reference
from specdec.kernels.q8k import natural_order, quantize_q8_k
from fakes import one_thread
from helpers import F16_FIELDS, random_weights, real_model_path

T = gguf.GGMLQuantizationType
FORMATS = [T.Q4_K, T.Q6_K, T.Q5_K, T.Q3_K, T.Q2_K]
HAS_DMIN = {T.Q2_K, T.Q4_K, T.Q5_K}
# max |sc·q| and max |mn| of one value, for the float-rounding part of the error bound
MAX_SCQ = {T.Q2_K: 15 * 3, T.Q3_K: 32 * 4, T.Q4_K: 63 * 15, T.Q5_K: 63 * 31, T.Q6_K: 128 * 32}
MAX_MN = {T.Q2_K: 15, T.Q3_K: 0, T.Q4_K: 63, T.Q5_K: 63, T.Q6_K: 0}

SETTINGS = settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def matmul(qtype, w, x) -> np.ndarray:
    out = np.full((x.shape[0], w.shape[0]), np.nan, np.float32)
    kquants.MATMUL[int(qtype)](w, np.ascontiguousarray(x, np.float32), out)
    return out


def dequant(w, qtype) -> np.ndarray:
    return gguf.quants.dequantize(w, qtype)            # (N, K) float32


# ------------------------------------------------------------------------------ Q8_K

def q8k_reference(x: np.ndarray):
    """quantize_row_q8_K_ref in NumPy: (codes int8 (M, K) natural order, d, bsums)."""
    m, k = x.shape
    blocks = x.reshape(m, k // 256, 256).astype(np.float32)
    q = np.zeros(blocks.shape, np.int8)
    d = np.zeros(blocks.shape[:2], np.float32)
    for i in range(m):
        for b in range(k // 256):
            xb = blocks[i, b]
            j = int(np.argmax(np.abs(xb)))            # first index of the largest |x|
            if xb[j] == 0:
                continue
            iscale = np.float32(-127.0) / xb[j]
            q[i, b] = np.minimum(np.rint(iscale * xb), 127).astype(np.int8)
            d[i, b] = np.float32(1.0) / iscale
    bsums = q.reshape(m, k // 16, 16).astype(np.int32).sum(-1)
    return q.reshape(m, k), d, bsums


@SETTINGS
@given(seed=st.integers(0, 2**32 - 1), m=st.integers(1, 5), nb=st.integers(1, 4),
       log_scale=st.floats(-30, 30), pattern=st.sampled_from(["normal", "ties", "zeros", "halves"]))
def test_q8k_matches_ggml_rule(seed, m, nb, log_scale, pattern):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((m, 256 * nb)) * 10.0 ** log_scale
    if pattern == "ties":            # the extreme magnitude twice, opposite signs: first wins
        x[:, 7], x[:, 200] = 5 * 10.0 ** log_scale, -5 * 10.0 ** log_scale
        x[:, 3] = -x[:, 7] if rng.integers(2) else x[:, 3]
    elif pattern == "zeros":
        x[:, :256] = 0.0
    elif pattern == "halves":        # max 127 -> iscale -1, codes at exact .5: half to even
        x = rng.integers(-126, 126, x.shape) + 0.5
        x[:, ::256] = 127.0
    x = x.astype(np.float32)
    xq, xd, xbs = quantize_q8_k(x)               # block-major: (K/256, M, ·)
    q_ref, d_ref, bs_ref = q8k_reference(x)
    np.testing.assert_array_equal(natural_order(xq), q_ref)
    np.testing.assert_array_equal(xd.T.view(np.uint32), d_ref.view(np.uint32))
    assert xbs.dtype == np.int16                                         # exact code sums
    np.testing.assert_array_equal(xbs.transpose(1, 0, 2).reshape(m, -1), bs_ref)
    assert xq.min() >= -127


def test_q8k_layout():
    """Block b of row m is xq[b, m]; its byte 64k + 4L + i holds the code of value
    16L + 4k + i."""
    x = np.zeros((2, 512), np.float32)
    x[1, 256:256 + 127] = np.arange(1, 128)  # max 127 -> iscale -1: value v gets code -(v+1)
    xq, xd, xbs = quantize_q8_k(x)
    assert xq.shape == (2, 2, 256) and xd.shape == (2, 2) and xbs.shape == (2, 2, 16)
    assert xd[1, 1] == -1.0 and xd[0, 1] == xd[1, 0] == xd[0, 0] == 0.0
    assert not xq[0].any() and not xq[1, 0].any()
    for k in range(4):
        for lane in range(16):
            for i in range(4):
                v = 16 * lane + 4 * k + i
                assert xq[1, 1, 64 * k + 4 * lane + i] == (-(v + 1) if v < 127 else 0)
    assert xbs[1, 1, 0] == -sum(range(1, 17))        # the codes' exact sum, as block_q8_K's bsums


# ----------------------------------------------------------------------------- matmul

@pytest.mark.parametrize("qtype", FORMATS, ids=lambda t: t.name)
@SETTINGS
@given(seed=st.integers(0, 2**32 - 1), m=st.integers(1, 24), n=st.integers(1, 9),
       nb=st.integers(1, 2), e=st.integers(5, 12), f=st.integers(-4, 8))
def test_matmul_exact_on_representable_inputs(qtype, seed, m, n, nb, e, f):
    """Weights with d = dmin = 2^-e and activations s·k (s = 2^-f, |k| ≤ 7, one ±127 per
    block) are quantized exactly by Q8_K, and every product and sum of the kernel is exact
    (|Σ| < 2^24 units of 2^-(e+f)); the result must equal dequantize(W) @ x exactly."""
    rng = np.random.default_rng(seed)
    w = random_weights(rng, qtype, n, nb, f16=2.0 ** -e)
    k = rng.integers(-7, 8, (m, nb, 256))
    k[np.arange(m)[:, None], np.arange(nb), rng.integers(0, 256, (m, nb))] = \
        127 * rng.choice([-1, 1], (m, nb))
    x = (k.reshape(m, -1) * 2.0 ** -f).astype(np.float32)
    exact = x.astype(np.float64) @ dequant(w, qtype).astype(np.float64).T
    np.testing.assert_array_equal(matmul(qtype, w, x), exact.astype(np.float32))


@pytest.mark.parametrize("qtype", FORMATS, ids=lambda t: t.name)
@SETTINGS
@given(seed=st.integers(0, 2**32 - 1), m=st.integers(1, 64), n=st.integers(1, 40),
       nb=st.integers(1, 3), log_scale=st.floats(-4, 4))
def test_matmul_is_bitwise_the_reference_contract(qtype, seed, m, n, nb, log_scale):
    """The kernel computes kernels/reference.kquant_dot bit for bit (the contract every path
    keeps: exact int32 isum and imin per super-block, then fma(isum, d·dx) and
    fma(imin, −dmin·dx) in that order), for every M: the static paths and the passes."""
    rng = np.random.default_rng(seed)
    w = random_weights(rng, qtype, n, nb)
    x = (rng.standard_normal((m, 256 * nb)) * 10.0 ** log_scale).astype(np.float32)
    np.testing.assert_array_equal(matmul(qtype, w, x), reference.kquant_dot(int(qtype), w, x))


def test_fma32_rounds_once():
    """reference.fma32 is a single rounding, where rounding the product first would differ,
    and where a float64 sum would land on a float32 tie that the exact sum is above."""
    a = np.float32(1 + 2.0 ** -12)
    assert reference.fma32(a, a, np.float32(-1.0)) == np.float32(2.0 ** -11 + 2.0 ** -24)
    assert reference.fma32(np.float32(1.0), np.float32(1 + 2.0 ** -23),
                           np.float32(2.0 ** -24)) == np.float32(1 + 2.0 ** -22)


def error_bound(qtype, w, x):
    """|kernel − dequantize(W) @ x| bound, (M, N).

    Q8_K rounding: each x_i is replaced by dx·q_i with |x_i − dx·q_i| ≤ |dx|·(1/2 + 2^-12)
    (round to nearest of the float32 product iscale·x, and d = 1/iscale rounded), and the
    kernel computes the integer dot products exactly: Σ_i |w_i|·|dx_b(i)|/2·(1 + 2^-10).
    Float rounding: the kernel rounds float(isum), d·dx, dmin·dx and two FMAs per super-block,
    the reference rounds each weight (d·sc, ·q, − dmin·m) in float32:
    (nb + 16)·2^-23·Σ_i (|d|·max|sc·q| + |dmin|·max|mn|)·(|x_i| + |dx|)."""
    m, k = x.shape
    nb = k // 256
    _, xd, _ = quantize_q8_k(x)
    blk = w.reshape(w.shape[0], nb, -1)
    halves = [blk[:, :, o:o + 2].copy().view(np.float16)[..., 0].astype(np.float64)
              for o in F16_FIELDS[qtype]]
    d = np.abs(halves[0])
    dmin = np.abs(halves[1]) if qtype in HAS_DMIN else 0.0 * d
    amp = d * MAX_SCQ[qtype] + dmin * MAX_MN[qtype]                           # (N, nb)
    wabs = np.abs(dequant(w, qtype).astype(np.float64)).reshape(-1, nb, 256).sum(-1)   # (N, nb)
    dx = np.abs(xd.T.astype(np.float64))                                        # (M, nb)
    q8 = 0.5 * (1 + 2.0 ** -10) * dx @ wabs.T
    xabs = np.abs(x.astype(np.float64)).reshape(m, nb, 256).sum(-1) + 256 * dx    # (M, nb)
    return q8 + (nb + 16) * 2.0 ** -23 * xabs @ amp.T


@pytest.mark.parametrize("qtype", FORMATS, ids=lambda t: t.name)
@SETTINGS
@given(seed=st.integers(0, 2**32 - 1), m=st.integers(1, 9), n=st.integers(1, 9),
       nb=st.integers(1, 4), log_scale=st.floats(-6, 6))
def test_matmul_matches_dequantized_within_bound(qtype, seed, m, n, nb, log_scale):
    rng = np.random.default_rng(seed)
    w = random_weights(rng, qtype, n, nb)
    x = (rng.standard_normal((m, 256 * nb)) * 10.0 ** log_scale).astype(np.float32)
    if rng.integers(3) == 0:
        x[0, :256] = 0.0                               # an all-zero Q8_K block (d = 0)
    ref = x.astype(np.float64) @ dequant(w, qtype).astype(np.float64).T
    err = np.abs(matmul(qtype, w, x) - ref)
    assert np.all(err <= error_bound(qtype, w, x)), err.max()


@pytest.mark.parametrize("qtype", FORMATS, ids=lambda t: t.name)
@SETTINGS
@given(seed=st.integers(0, 2**32 - 1), m=st.integers(1, 24), n=st.integers(1, 40),
       nb=st.integers(1, 3))
def test_matmul_rows_are_independent(qtype, seed, m, n, nb):
    """out[m] is bitwise the same whatever M, the other rows and the thread count are
    (M up to 24 covers both kernel paths: one per M <= MAX_STATIC_M, and passes of PASS_M
    rows; test_matmul_rows_independent_across_passes covers several slices of weight rows)."""
    rng = np.random.default_rng(seed)
    w = random_weights(rng, qtype, n, nb)
    x = rng.standard_normal((m, 256 * nb)).astype(np.float32)
    full = matmul(qtype, w, x)
    other = rng.standard_normal((m, 256 * nb)).astype(np.float32) * 1e3
    r = int(rng.integers(m))
    other[r] = x[r]
    np.testing.assert_array_equal(matmul(qtype, w, other)[r], full[r])
    _assert_rows_alone_and_serial(qtype, w, x, full)


def _assert_rows_alone_and_serial(qtype, w, x, full):
    """Each row of x alone gives its row of full bitwise, and so does one thread."""
    for i in range(len(x)):
        np.testing.assert_array_equal(matmul(qtype, w, x[i:i + 1])[0], full[i])
    with one_thread():
        np.testing.assert_array_equal(matmul(qtype, w, x), full)


@pytest.mark.parametrize("qtype", FORMATS, ids=lambda t: t.name)
def test_matmul_rows_independent_across_passes(qtype):
    """M > MAX_STATIC_M with more weight rows than a pass holds (kquants_ir.PASS_ROWS):
    every row of out bitwise its one-row result, on one thread and on all of them."""
    rng = np.random.default_rng(int(qtype) + 100)
    n, m = 2 * kquants_ir.PASS_ROWS + 5, kquants_ir.MAX_STATIC_M + kquants_ir.PASS_M + 3
    w = random_weights(rng, qtype, n, 2)
    x = rng.standard_normal((m, 512)).astype(np.float32)
    _assert_rows_alone_and_serial(qtype, w, x, matmul(qtype, w, x))


def _portable_matmul(qtype):
    """The matmul over the portable code path (no VNNI, no F16C), 3 chunks, serial."""
    chunk = kquants_ir.make_chunk_kernel(int(qtype), vnni=False, f16c=False)

    @njit
    def matmul(w, xq, xd, xbs, out):
        for c in range(3):
            chunk(w, xq, xd, xbs, out, c, 3)
    return matmul


@pytest.mark.parametrize("qtype", FORMATS, ids=lambda t: t.name)
def test_portable_path_matches_native_bitwise(qtype):
    """No VNNI (the AVX2 vpmaddubsw / vpmaddwd dots), no F16C: the contract's bits for the
    static paths (16 // M weight rows at a time, with a tail) and the passes."""
    rng = np.random.default_rng(int(qtype))
    w = random_weights(rng, qtype, 37, 2)
    x = rng.standard_normal((33, 512)).astype(np.float32)
    portable = _portable_matmul(qtype)
    for m in (1, 3, 5, 9, 17, 33):
        xq, xd, xbs = quantize_q8_k(x[:m])
        out = np.empty((m, 37), np.float32)
        portable(w, xq, xd, xbs, out)
        np.testing.assert_array_equal(out, matmul(qtype, w, x[:m]))
        np.testing.assert_array_equal(out, reference.kquant_dot(int(qtype), w, x[:m]))


@pytest.mark.parametrize("f16c", [False, True])
def test_f16_conversion_exhaustive(f16c):
    if f16c and not kquants_ir.have_f16c():
        pytest.skip("no F16C on this machine")
    load = kquants_ir.make_load_f16(f16c)

    @njit
    def convert(w, out):
        for n in range(w.shape[0]):
            out[n] = load(w, n, 1)

    halves = np.arange(1 << 16, dtype=np.uint16)
    w = np.zeros((1 << 16, 3), np.uint8)
    w[:, 1:] = halves.view(np.uint8).reshape(-1, 2)   # at an odd byte offset
    out = np.empty(1 << 16, np.float32)
    convert(w, out)
    ref = halves.view(np.float16).astype(np.float32)
    nan = np.isnan(ref)
    np.testing.assert_array_equal(out[~nan].view(np.uint32), ref[~nan].view(np.uint32))
    assert np.isnan(out[nan]).all()


# ---------------------------------------------------------------------------- get_rows

@pytest.mark.parametrize("qtype", FORMATS, ids=lambda t: t.name)
@SETTINGS
@given(seed=st.integers(0, 2**32 - 1), n=st.integers(1, 20), nb=st.integers(1, 3),
       n_ids=st.integers(0, 12))
def test_get_rows_bit_exact(qtype, seed, n, nb, n_ids):
    rng = np.random.default_rng(seed)
    w = random_weights(rng, qtype, n, nb)
    ids = rng.integers(0, n, n_ids).astype(np.int64)
    out = np.full((n_ids, 256 * nb), np.nan, np.float32)
    kquants.GET_ROWS[int(qtype)](w, ids, out)
    np.testing.assert_array_equal(out.view(np.uint32), dequant(w, qtype)[ids].view(np.uint32))


# ------------------------------------------------------------------ real model tensors

@pytest.mark.real
def test_real_tensors_zero_copy():
    """qwen2.5-coder-1.5b Q4_K_M: matmul on read-only memmap rows within the bound,
    get_rows bit-exact, M=1 vs M=3 bitwise."""

    from specdec.engine.gguf_file import GGUFFile
    g = GGUFFile(real_model_path("qwen2.5-coder-1.5b-instruct-q4_k_m"))
    rng = np.random.default_rng(0)
    for name in ("blk.0.ffn_gate.weight", "blk.0.ffn_down.weight", "output.weight",
                 "token_embd.weight"):
        qtype = T(g.tensors[name].ggml_type)
        w = g.tensor(name)[:160]                           # (160, row_bytes) view of the file
        k = w.shape[1] // formats.FORMATS[int(qtype)].type_size * 256
        x = rng.standard_normal((3, k)).astype(np.float32)
        out = matmul(qtype, w, x)
        ref = x.astype(np.float64) @ dequant(np.asarray(w), qtype).astype(np.float64).T
        assert np.all(np.abs(out - ref) <= error_bound(qtype, np.asarray(w), x)), name
        np.testing.assert_array_equal(matmul(qtype, w, x[1:2])[0], out[1])
        ids = np.array([0, 159, 7, 7])
        rows = np.empty((4, k), np.float32)
        kquants.GET_ROWS[int(qtype)](w, ids, rows)
        np.testing.assert_array_equal(rows, dequant(np.asarray(w), qtype)[ids])


# -------------------------------------------------------------------------- validation

def test_bad_shapes_are_rejected():
    rng = np.random.default_rng(0)
    w = random_weights(rng, T.Q4_K, 4, 2)
    x = np.zeros((2, 512), np.float32)
    with pytest.raises(ValueError):                       # K does not match the rows
        kquants.MATMUL[int(T.Q4_K)](w, np.zeros((2, 256), np.float32), np.empty((2, 4), np.float32))
    with pytest.raises(ValueError):                       # wrong out shape
        kquants.MATMUL[int(T.Q4_K)](w, x, np.empty((4, 2), np.float32))
    with pytest.raises(ValueError):                       # K not a multiple of 256
        kquants.MATMUL[int(T.Q4_K)](w, np.zeros((2, 500), np.float32), np.empty((2, 4), np.float32))
    with pytest.raises(ValueError):                       # not raw uint8 rows
        kquants.MATMUL[int(T.Q6_K)](w, x, np.empty((2, 4), np.float32))
    with pytest.raises(IndexError):
        kquants.GET_ROWS[int(T.Q4_K)](w, np.array([4]), np.empty((1, 512), np.float32))
