"""IQ4_NL, IQ4_XS and MXFP4 (kernels/iquants.py): rows dequantized as gguf-py dequantizes them,
the matmul bit for bit its NumPy statement (reference.iquant_dot: ggml's *_generic integer
order) at every M with tails, rows independent of each other (also tests/kernels/test_rows.py
and, per forced instruction path, test_paths.py), the formats in a model file end to end, and
the types we lack refused by name (tests/engine/test_bad_input.py)."""
from __future__ import annotations

import gguf
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import specdec
from specdec import kernels
from specdec.kernels import iquants, reference
from specdec.testing.synth import quantize_iq4
from synth import TinySpec, write_tiny_model

T = gguf.GGMLQuantizationType
TYPES = (T.IQ4_NL, T.IQ4_XS, T.MXFP4)


def _weights(qt, n: int, k: int, rng, raw: bool = True) -> np.ndarray:
    """raw: random bytes with finite scales (every code and group scale); else quantized normals."""
    if not raw:
        x = rng.standard_normal((n, k)).astype(np.float32)
        return gguf.quants.quantize(x, qt) if qt == T.MXFP4 else quantize_iq4(x, qt)
    block, size = gguf.GGML_QUANT_SIZES[qt]
    w = rng.integers(0, 256, (n, k // block, size), dtype=np.uint8)
    if qt == T.MXFP4:
        w[:, :, 0] = rng.integers(104, 144, w.shape[:2])                        # 2^-24 .. 2^15: fp16s
    else:
        h = rng.uniform(1e-3, 0.05, w.shape[:2]) * rng.choice([-1, 1], w.shape[:2])
        w[:, :, 0:2] = h.astype(np.float16).view(np.uint8).reshape(*w.shape[:2], 2)
    return w.reshape(n, -1)


@pytest.mark.parametrize("qt", TYPES, ids=lambda q: q.name)
def test_rows_are_gguf_py_dequantization(qt):
    rng = np.random.default_rng(int(qt))
    w = _weights(qt, 37, 512, rng)
    got = kernels.get_rows(w, int(qt), np.arange(37, dtype=np.int64), 512)
    assert np.array_equal(got, gguf.quants.dequantize(w, qt).astype(np.float32))
    if qt == T.MXFP4:                                                              # every exponent
        w.reshape(37, -1, 17)[:, :, 0] = np.arange(37 * 16).reshape(37, 16) % 256
        got = kernels.get_rows(w, int(qt), np.arange(37, dtype=np.int64), 512)
        want = gguf.quants.dequantize(w, qt).astype(np.float32)
        assert np.array_equal(got[np.isfinite(want)], want[np.isfinite(want)])


@settings(max_examples=30, deadline=None)
@given(qt=st.sampled_from(TYPES), m=st.integers(1, 17), n=st.integers(1, 40), nb=st.integers(1, 3),
       raw=st.booleans(), seed=st.integers(0, 2**16))
def test_matmul_is_its_numpy_statement_bit_for_bit(qt, m, n, nb, raw, seed):
    rng = np.random.default_rng(seed)
    k = nb * 256
    w = _weights(qt, n, k, rng, raw)
    x = (rng.standard_normal((m, k)) * rng.uniform(0.01, 10)).astype(np.float32)
    got = kernels.matmul(w, int(qt), x)
    assert np.array_equal(got.view(np.uint32), reference.iquant_dot(int(qt), w, x).view(np.uint32))


@pytest.mark.parametrize("qt", TYPES, ids=lambda q: q.name)
def test_each_row_is_independent_of_the_others(qt):
    rng = np.random.default_rng(3)
    w = _weights(qt, 48, 512, rng, raw=False)
    x = rng.standard_normal((17, 512)).astype(np.float32)
    full = kernels.matmul(w, int(qt), x).view(np.uint32)
    for m in range(1, 18):
        assert np.array_equal(kernels.matmul(w, int(qt), x[:m].copy()).view(np.uint32), full[:m])
        assert np.array_equal(kernels.matmul(w, int(qt), x[m - 1:m].copy()).view(np.uint32)[0], full[m - 1])


@pytest.mark.parametrize("qt", TYPES, ids=lambda q: q.name)
def test_the_matmul_approximates_the_float_product(qt):
    rng = np.random.default_rng(5)
    w = _weights(qt, 64, 768, rng, raw=False)
    x = rng.standard_normal((3, 768)).astype(np.float32)
    exact = x @ gguf.quants.dequantize(w, qt).T
    assert np.abs(kernels.matmul(w, int(qt), x) - exact).max() < 0.02 * np.abs(exact).max()


@settings(max_examples=20, deadline=None)
@given(qt=st.sampled_from(TYPES), n=st.sampled_from([8, 24, 37, 40]), m=st.integers(1, 17),
       raw=st.booleans(), seed=st.integers(0, 2**16))
def test_the_layouts_made_at_load_give_the_same_bits(qt, n, m, raw, seed):
    """IQ4_NL and MXFP4 as Q8_0 rows (8-row records where N allows), IQ4_XS with its values
    expanded: the matmul and the rows bit for bit the file rows' kernels."""
    from specdec.kernels import registry
    rng = np.random.default_rng(seed)
    w = _weights(qt, n, 512, rng, raw)
    lw, lid = registry.prepare(w.copy(), int(qt))
    assert lid != int(qt) and lid == registry.layout_for(int(qt), n)
    x = rng.standard_normal((m, 512)).astype(np.float32)
    want = kernels.matmul(w, int(qt), x).view(np.uint32)
    assert np.array_equal(kernels.matmul(lw, lid, x).view(np.uint32), want)
    ids = np.arange(n, dtype=np.int64)
    assert np.array_equal(kernels.get_rows(lw, lid, ids, 512), kernels.get_rows(w, int(qt), ids, 512))


def test_an_mxfp4_scale_no_fp16_holds_keeps_the_file_rows():
    from specdec.kernels import registry
    w = _weights(T.MXFP4, 8, 256, np.random.default_rng(1))
    w.reshape(8, -1, 17)[3, 2, 0] = 200                                            # 2^72
    lw, lid = registry.prepare(w.copy(), int(T.MXFP4))
    assert lid == int(T.MXFP4) and np.array_equal(lw, w)


@pytest.mark.parametrize("mmap", [True, False], ids=["mapped", "in memory"])
@pytest.mark.parametrize("qt", TYPES, ids=lambda q: q.name)
def test_a_model_in_the_format_runs_and_its_passes_agree(qt, mmap, tmp_path):
    spec = TinySpec(qtype=int(qt), d_model=256, d_ff=512, n_head=4, n_head_kv=2, n_vocab=64, seed=2)
    path = write_tiny_model(tmp_path / "m.gguf", spec)
    m = specdec.load(path, mmap=mmap)
    ids = [1, 5, 9, 13, 2, 7]
    s = m.session(16)
    whole = s.eval(ids)                                                            # one pass of 6 rows
    s.reset()
    step = np.stack([s.eval([t])[-1] for t in ids])                                # six one-row passes
    assert np.array_equal(whole.view(np.uint32), step.view(np.uint32))
    other = specdec.load(path, mmap=not mmap).session(16).eval(ids)                # file rows vs layouts
    assert np.array_equal(whole.view(np.uint32), other.view(np.uint32))
    assert len(m.generate([1, 2], n_predict=4, ignore_eos=True, draft="prompt-lookup").ids) == 4


def test_the_kernel_tables_cover_the_formats():
    for qt in TYPES:
        assert int(qt) in kernels.SUPPORTED_TYPES and int(qt) in iquants.MATMUL
