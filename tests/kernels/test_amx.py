"""AMX tiles (kernels/legacy_amx.py): every legacy format gives the VNNI tile's numbers bit for
bit, for any M (tails of 16 activation rows and of 16 weight rows included), each row
independent of the others; AMX is used only where CPU, OS and the process's permission
allow it.  Skipped, with the reason, on hosts without AMX."""
from __future__ import annotations

import gguf
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from specdec.kernels import amx, cpu, legacy, legacy_amx, registry, repack
from helpers import assert_rows_independent, make_weights

T = gguf.GGMLQuantizationType
QUANTS = [T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0]
needs_amx = pytest.mark.skipif(not amx.available(), reason=f"no AMX here: {amx.status()}")


def _vnni(qt, w, x, out):
    legacy._matmul_quant(int(qt), w, x, out)


def _bits(a: np.ndarray) -> np.ndarray:
    return a.view(np.uint32)


@needs_amx
@settings(max_examples=25, deadline=None)
@given(qt=st.sampled_from(QUANTS), n=st.integers(1, 70), nb=st.integers(1, 9), raw=st.booleans(),
       m=st.integers(1, 70), seed=st.integers(0, 2**32 - 1))
def test_amx_is_bitwise_the_vnni_tile(qt, n, nb, raw, m, seed):
    rng = np.random.default_rng(seed)
    w = make_weights(qt, n, 32 * nb, rng, raw=raw)
    x = rng.standard_normal((m, 32 * nb)).astype(np.float32) * rng.uniform(0.01, 10)
    ref, got = np.empty((m, n), np.float32), np.full((m, n), np.nan, np.float32)
    _vnni(qt, w, x, ref)
    legacy_amx.matmul(int(qt), w, x, got, _vnni)
    assert np.array_equal(_bits(ref), _bits(got))


@needs_amx
@settings(max_examples=15, deadline=None)
@given(qt=st.sampled_from([T.Q4_0, T.Q5_0, T.Q8_0]), streams=st.integers(1, 7), nb=st.integers(1, 5),
       m=st.integers(1, 40), seed=st.integers(0, 2**32 - 1))
def test_amx_on_repacked_records_is_bitwise_the_gguf_layout(qt, streams, nb, m, seed):
    """The draft's requantized weights (and a --no-mmap file's) sit in repack.py's 8-row
    records: the tiles read them too, with the GGUF layout's numbers (odd stream counts
    leave 8 rows to the VNNI records path)."""
    rng = np.random.default_rng(seed)
    w = make_weights(qt, 8 * streams, 32 * nb, rng, raw=False)
    x = rng.standard_normal((m, 32 * nb)).astype(np.float32)
    ref, got = np.empty((m, w.shape[0]), np.float32), np.full((m, w.shape[0]), np.nan, np.float32)
    _vnni(qt, w, x, ref)
    legacy_amx.matmul(int(qt), repack.repack(w, int(qt)), x, got, lambda q, *a: repack.MATMUL[q](*a), repacked=True)
    assert np.array_equal(_bits(ref), _bits(got))


@needs_amx
@pytest.mark.parametrize("qt", [qt for qt in QUANTS if int(qt) in legacy_amx.MIN_M])
def test_passes_that_take_the_tiles_keep_rows_independent(qt):
    """With the tiles on (registry.with_tiles), a kernel sends M >= MIN_M through them, in
    either layout: each row equals the row alone (M = 1, the VNNI tile), whatever the other
    rows hold."""
    rng = np.random.default_rng(int(qt))
    w = make_weights(qt, 48, 256, rng, raw=False)
    x = rng.standard_normal((legacy_amx.MIN_M[int(qt)] + 5, 256)).astype(np.float32)
    for tid, wt in ((int(qt), w), (registry.REPACKED[int(qt)], repack.repack(w, int(qt)))):
        kernel = registry.with_tiles(tid)
        assert_rows_independent(lambda a, b, c: kernel.matmul(a, b, c), wt, x, rng)


@needs_amx
def test_the_host_path_is_recorded():
    """Unforced, the tiles run the interleaved K-quants only (the other tiles are not faster)
    and machine_info says so; forced to another path, none; the XCR0 tile bits are set
    wherever available() holds."""
    info = cpu.kernel_paths()
    assert amx._xcr0() & amx.XCR0_TILE == amx.XCR0_TILE
    forced = cpu._forced.get("path")
    if forced == "amx":
        assert cpu.path() == info["path"] == "amx" and "tdpbsud" in info["amx"] and cpu.tiles_x16()
    elif forced is None:
        assert not cpu.tiles() and cpu.tiles_x16() and "interleaved K-quants from 16" in info["amx"]
    else:
        assert not cpu.tiles() and not cpu.tiles_x16() and "available" in info["amx"]


def test_amx_is_refused_with_a_reason_where_it_cannot_run(monkeypatch):
    """Without the CPU flags, status() names what is missing and available() is False;
    SPECDEC_KERNELS=amx on such a host is a one-line error."""
    monkeypatch.setattr(amx, "_cpuinfo_flags", lambda: {"avx2"})
    amx.status.cache_clear()
    try:
        assert not amx.available() and "amx_tile" in amx.status()
    finally:
        monkeypatch.undo()
        amx.status.cache_clear()
    saved = dict(cpu._forced)
    try:
        cpu._forced.clear()
        monkeypatch.setattr(cpu, "host", lambda: cpu.CpuInfo("AuthenticAMD", "a Zen 4", 25, 17, 1,
                                                             ("avx2", "avx512f", "avx512bw", "avx512_vnni")))
        assert cpu.force_path({cpu.KERNELS_ENV: "amx"}) is None
        with pytest.raises(ValueError, match="lacks amx_tile, amx_int8") as e:
            cpu.check_path()
        assert "\n" not in str(e.value)
    finally:
        cpu._forced.clear()
        cpu._forced.update(saved)


def test_the_tile_configuration_bytes():
    cfg = amx.tile_config({0: (16, 64), 2: (8, 64)})
    assert cfg[0] == 1 and cfg[16] == 64 and cfg[20] == 64 and cfg[48] == 16 and cfg[50] == 8
    assert cfg.sum() == 1 + 64 + 64 + 16 + 8
