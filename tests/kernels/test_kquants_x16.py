"""The 16-row interleaved K-quant layout (kernels/kquants_x16.py): interleave and deinterleave
are exact inverses, and every byte sits where the module docstring says; its kernels
(kquants_x16_ir) are reference.kquant_dot bit for bit on every path, rows independent, and its
row lookup is the GGUF one."""
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from fakes import one_thread
from helpers import random_weights
from specdec.kernels import cpu, kquants, matmul, reference, registry
from specdec.kernels import kquants_x16 as x16
from specdec.kernels.formats import FORMATS, Q4_K, Q5_K, Q6_K
from specdec.kernels.reference import kquant_parts

ROOT = Path(__file__).resolve().parents[2]

QS_AT = {Q4_K: 320, Q5_K: 832, Q6_K: 1344}      # offset of the low-nibble vectors in a record
QH_AT = {Q5_K: 320, Q6_K: 320}


@settings(max_examples=30, deadline=None)
@given(qt=st.sampled_from(x16.INTERLEAVABLE), tiles=st.integers(1, 3), nb=st.integers(1, 3),
       seed=st.integers(0, 2**32 - 1))
def test_roundtrip(qt, tiles, nb, seed):
    w = np.random.default_rng(seed).integers(0, 256, (16 * tiles, FORMATS[qt].row_bytes(256 * nb)), np.uint8)
    wi = x16.interleave(qt, w)
    assert wi.shape == (tiles, nb * x16.RECORD[qt]) and x16.RECORD[qt] % 64 == 0
    assert np.array_equal(x16.deinterleave(qt, wi), w)


@pytest.mark.parametrize("qt", x16.INTERLEAVABLE)
def test_documented_bytes(qt):
    w = np.random.default_rng(qt).integers(0, 256, (32, FORMATS[qt].row_bytes(512)), np.uint8)
    rec = x16.interleave(qt, w).reshape(2, 2, x16.RECORD[qt]).astype(np.int32)
    p = kquant_parts(qt, w)
    for T, b, r, c, h, t, i in np.ndindex(2, 2, 16, 4, 2, 8, 4):
        if (r + c + t + i) % 5:
            continue                                  # a fifth of the entries keeps it quick
        n, v = 16 * T + r, 64 * c + 32 * h + 4 * t + i
        byte = rec[T, b, QS_AT[qt] + (8 * c + t) * 64 + 4 * r + i]
        assert (byte >> (4 * h)) & 15 == p.u[n, b, v] & 15
        if qt == Q5_K:
            assert (rec[T, b, QH_AT[qt] + t * 64 + 4 * r + i] >> (2 * c + h)) & 1 == p.u[n, b, v] >> 4
        if qt == Q6_K:
            assert (rec[T, b, QH_AT[qt] + (8 * h + t) * 64 + 4 * r + i] >> (2 * c)) & 3 == p.u[n, b, v] >> 4
    if qt != Q6_K:
        sc = rec[:, :, 64:192].reshape(2, 2, 8, 16)
        assert np.array_equal(sc.transpose(0, 3, 1, 2).reshape(32, 2, 8), p.sc[..., ::2])


def test_refuses_odd_rows():
    with pytest.raises(ValueError, match="16"):
        x16.interleave(Q4_K, np.zeros((8, FORMATS[Q4_K].row_bytes(256)), np.uint8))


# ------------------------------------------------------------------- the kernels on it
# kquants_x16_ir: bit for bit reference.kquant_dot of the GGUF rows, for every M (the static
# paths up to 17, the passes above), rows independent of each other and of the thread count.

def _gguf(qt, rng, tiles, nb):
    return random_weights(rng, qt, 16 * tiles, nb)


def _x16(qt, w, x, tiles: bool = True):
    """The interleaved matmul of w's rows through its registry kernel (passes of 16 rows or
    more on the AMX tiles where the host has them); tiles=False: the SIMD kernels at every M."""
    out = np.full((x.shape[0], w.shape[0]), np.nan, np.float32)
    k = registry.KERNELS[x16.INTERLEAVED[qt]]
    (k.matmul if tiles else k.simd)(x16.interleave(qt, w), np.ascontiguousarray(x, np.float32), out)
    return out


def _same(a, b):
    return np.array_equal(a.view(np.uint32), b.view(np.uint32))


@settings(max_examples=25, deadline=None)
@given(qt=st.sampled_from(x16.INTERLEAVABLE), m=st.integers(1, 64), tiles=st.integers(1, 3),
       nb=st.integers(1, 4), seed=st.integers(0, 2**32 - 1))
def test_matmul_is_the_contract(qt, m, tiles, nb, seed):
    rng = np.random.default_rng(seed)
    w = _gguf(qt, rng, tiles, nb)
    x = (rng.standard_normal((m, 256 * nb)) * rng.uniform(0.01, 10)).astype(np.float32)
    want = reference.kquant_dot(qt, w, x)
    assert _same(_x16(qt, w, x, tiles=False), want)
    assert _same(_x16(qt, w, x), want)


@pytest.mark.parametrize("qt", x16.INTERLEAVABLE)
def test_extreme_codes_and_every_static_m(qt):
    """All-max codes and scales against ±127 activations (the int32 bounds), M = 1 … 20."""
    rng = np.random.default_rng(qt)
    w = _gguf(qt, rng, 2, 2)
    blk = w.reshape(32, 2, -1)
    blk[:, 0, :] = 255                                   # every code (and K4 scale / min) at its max
    if qt != Q6_K:
        blk[:, 0, 0:4] = np.frombuffer(np.float16([1.0, 0.5]).tobytes(), np.uint8)
    else:
        blk[:, 0, 192:208] = 0x80                        # scales −128
        blk[:, 0, 208:210] = np.frombuffer(np.float16([0.25]).tobytes(), np.uint8)
    for m in range(1, 21):
        x = np.where(rng.random((m, 512)) < 0.5, -1.0, 1.0).astype(np.float32)
        assert _same(_x16(qt, w, x, tiles=False), reference.kquant_dot(qt, w, x)), m


@settings(max_examples=10, deadline=None)
@given(qt=st.sampled_from(x16.INTERLEAVABLE), m=st.integers(2, 40), seed=st.integers(0, 2**32 - 1))
def test_rows_are_independent_of_the_pass_and_the_threads(qt, m, seed):
    rng = np.random.default_rng(seed)
    w = _gguf(qt, rng, 3, 2)
    x = rng.standard_normal((m, 512)).astype(np.float32)
    full = _x16(qt, w, x, tiles=False)
    for i in sorted({0, m // 2, m - 1}):
        assert _same(_x16(qt, w, x[i:i + 1])[0], full[i])
    with one_thread():
        assert _same(_x16(qt, w, x, tiles=False), full)


@settings(max_examples=10, deadline=None)
@given(qt=st.sampled_from(x16.INTERLEAVABLE), ids=st.lists(st.integers(0, 47), min_size=1, max_size=9),
       seed=st.integers(0, 2**32 - 1))
def test_get_rows_is_the_gguf_lookup(qt, ids, seed):
    w = _gguf(qt, np.random.default_rng(seed), 3, 2)
    ids = np.array(ids, np.int64)
    got, want = np.empty((len(ids), 512), np.float32), np.empty((len(ids), 512), np.float32)
    x16.GET_ROWS[qt](x16.interleave(qt, w), ids, got)
    kquants.GET_ROWS[qt](w, ids, want)
    assert _same(got, want)
    with pytest.raises(IndexError):
        x16.GET_ROWS[qt](x16.interleave(qt, w), np.array([48]), got[:1])


def test_front_door_gives_16k_rows_the_interleaved_layout():
    rng = np.random.default_rng(1)
    w = _gguf(Q4_K, rng, 2, 1)
    wi, qtype = registry.prepare(w, Q4_K)
    kernel = registry.KERNELS[qtype]
    assert qtype == registry.layout_for(Q4_K, 32) == 0x200 | Q4_K and wi.shape == (2, x16.RECORD[Q4_K])
    assert kernel.n_rows(wi) == 32 and registry.layout_for(Q4_K, 40) is None
    cut, n = kernel.cut_rows(wi, 17)
    assert n == 32 and cut.shape[0] == 2
    cut, n = kernel.cut_rows(wi, 5)
    assert n == 16 and cut.shape[0] == 1
    x = rng.standard_normal((3, 256)).astype(np.float32)
    assert _same(matmul(wi, qtype, x), reference.kquant_dot(Q4_K, w, x))
    assert _same(matmul(cut, qtype, x), reference.kquant_dot(Q4_K, w[:16], x))


# SPECDEC_KERNELS=vnni / avx2: each path the host runs, in a process of its own, against the contract
PATH_SCRIPT = r"""
import sys
sys.path.insert(0, "tests")
import numpy as np
from specdec.kernels import cpu, kquants_x16 as x16, reference
from helpers import F16_FIELDS, random_weights
rng = np.random.default_rng(3)
for qt in x16.INTERLEAVABLE:
    for m in (1, 2, 7, 9, 17, 18, 33, 64, 3, 20):
        w = random_weights(rng, qt, 48, 3)
        x = rng.standard_normal((m, 768)).astype(np.float32)
        if m in (3, 20):                    # every code and scale at its extreme, |x| = 127: the int16 sums' bound
            w = random_weights(rng, qt, 48, 3, f16=0.5).reshape(48, 3, -1)
            keep = np.zeros(w.shape[-1], bool)
            for o in F16_FIELDS[qt]:
                keep[o:o + 2] = True
            w[:, :, ~keep] = 0x80 if m == 3 and qt == x16.Q6_K else 0xFF
            w = w.reshape(48, -1)
            x = np.where(np.arange(768) % 3 == 0, -1.0 if m == 20 else 1.0, 1.0)[None].repeat(m, 0).astype(np.float32)
        out = np.empty((m, 48), np.float32)
        x16.matmul(qt, x16.interleave(qt, w), x, out)
        ref = reference.kquant_dot(qt, w, x)
        assert np.array_equal(out.view(np.uint32), ref.view(np.uint32)), (qt, m)
from specdec.kernels import ir
print("vnni512" if ir.have_vnni512() else "avx2" if ir.have_avx2() else "portable", cpu.path())
"""


@pytest.mark.slow
@pytest.mark.parametrize("path", ["vnni", "avx2"])
def test_every_path_is_the_contract(path, tmp_path):
    """In a process of its own, whose forced path compiles into the path's own cache folder
    (cpu._cache_dir: Numba's cache key holds the codegen's CPU features, which a forced path
    does not change in the running process, so a shared folder could hand it another path's
    code); the folder test_paths.py's run of the same path fills, so one of them compiles."""
    if not all(f in cpu.host().flags for f in cpu._NEEDS[path]):
        pytest.skip(f"this host cannot run the {path} path")
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_CPU_FEATURES"}
    env[cpu.KERNELS_ENV] = path
    r = subprocess.run([sys.executable, "-c", PATH_SCRIPT], env=env, cwd=ROOT, capture_output=True,
                       text=True, timeout=1200)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.split()[-1] == path


@pytest.mark.parametrize("qt", x16.INTERLEAVABLE)
def test_many_rows_in_chunks_of_rows(qt):
    """K = 40 super-blocks, M = 37: the AVX2 code's passes of more than 17 rows run in chunks
    of rows (kquants_x16_avx2.ROW_CHUNK_BYTES: 16 rows here, then 16, then 5 = 4 + 1); every
    path gives the reference bit for bit."""
    rng = np.random.default_rng(int(qt))
    w = _gguf(qt, rng, 2, 40)
    x = (rng.standard_normal((37, 256 * 40)) * 3).astype(np.float32)
    assert _same(_x16(qt, w, x, tiles=False), reference.kquant_dot(qt, w, x))
