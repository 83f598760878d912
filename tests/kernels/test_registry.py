"""kernels/registry.py and kernels/drivers.py: each type id's Kernel, the one place a pass
chooses SIMD or tiles, the layouts weights get in memory, the engine's weights holding their
kernel from load on, and drivers compiled from the factory found again in Numba's cache."""
from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from helpers import make_weights, random_weights
from synth import TinySpec
from specdec.kernels import registry
from specdec.kernels.formats import FORMATS, KQUANTS, LEGACY, Q4_0, Q4_K, Q6_K, Q8_0
from specdec.kernels.reference import kquant_dot

ROOT = Path(__file__).resolve().parents[2]


def test_every_type_id_has_one_kernel_of_its_format():
    for tid, k in registry.KERNELS.items():
        assert k.id == tid and (tid < 0x100) == (k.qtype == tid)
        assert k.qtype in FORMATS and k.simd is not None and k.get_rows is not None
    assert all(qt in registry.SUPPORTED_TYPES for qt in (*LEGACY, *KQUANTS))
    assert not any(tid >= 0x100 for tid in registry.SUPPORTED_TYPES)       # layouts are never a file's


def test_the_pass_size_alone_chooses_simd_or_tiles():
    """Kernel.matmul: tiles from min_m rows on, SIMD below, the float-activation kernel when
    asked (a fake tile kernel stands in: any host)."""
    calls = []
    base = registry.KERNELS[Q4_K]
    k = replace(base, tiles=lambda w, x, out: calls.append(x.shape[0]) or base.simd(w, x, out), min_m=5)
    rng = np.random.default_rng(0)
    w = random_weights(rng, Q4_K, 16, 1)
    for m in (1, 4, 5, 9):
        x = rng.standard_normal((m, 256)).astype(np.float32)
        assert np.array_equal(k.matmul(w, x).view(np.uint32), kquant_dot(Q4_K, w, x).view(np.uint32))
    assert calls == [5, 9]
    k.matmul(w, rng.standard_normal((7, 256)).astype(np.float32), float_act=True)
    assert calls == [5, 9]


def test_layouts_in_memory():
    assert registry.layout_for(Q4_K, 32) == registry.INTERLEAVED[Q4_K]
    assert registry.layout_for(Q6_K, 24) is None                # not 16k rows: the file's rows
    assert registry.layout_for(Q4_0, 24) == registry.REPACKED[Q4_0]
    assert registry.layout_for(Q8_0, 20) is None
    rng = np.random.default_rng(1)
    w = make_weights(Q4_0, 16, 64, rng, raw=False)
    r, tid = registry.prepare(w, Q4_0)
    kernel = registry.KERNELS[tid]
    assert kernel.in_place and r.shape == w.shape and kernel.n_rows(r) == 16
    x = rng.standard_normal((3, 64)).astype(np.float32)
    assert np.array_equal(kernel.matmul(r, x), registry.KERNELS[Q4_0].matmul(w, x))
    with pytest.raises(ValueError):
        registry.prepare(w[:4], Q4_0)


def test_loaded_weights_hold_their_kernel(tiny_model):
    import specdec
    spec = TinySpec(arch="qwen2", qtype=Q4_K, d_model=256, d_ff=256, n_head=4, n_head_kv=2, seed=3)
    m = specdec.load(tiny_model(spec).path, n_ctx=tiny_model(spec).n_ctx, mmap=False)
    layer = m.weights.layers[0]
    assert layer.wq.qtype == registry.INTERLEAVED[Q4_K]                   # 256 rows: interleaved
    for lin in (layer.wq, layer.wk, layer.w_down, m.weights.output):
        assert lin.kernel is registry.KERNELS[lin.qtype]


CACHE_SCRIPT = r"""
import sys
import numpy as np
from specdec.kernels import dequant_ir
from specdec.kernels.formats import Q8_0
fn = dequant_ir.GET_ROWS_DEQUANT[Q8_0]
w = np.zeros((2, 34), np.uint8)
fn(w, np.array([1]), np.empty((1, 32), np.float32))
print(sum(fn.stats.cache_hits.values()), sum(fn.stats.cache_misses.values()))
"""


def test_a_factory_made_function_is_found_in_the_cache_by_the_next_process(tmp_path):
    """drivers.py compiles its templates as the kernel module's code: the second process
    reads the first one's compiled function back (a closure over a kernel would not be)."""
    env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path)}
    runs = [subprocess.run([sys.executable, "-c", CACHE_SCRIPT], env=env, cwd=ROOT, capture_output=True,
                           text=True, timeout=600) for _ in range(2)]
    assert all(r.returncode == 0 for r in runs), runs[-1].stderr[-2000:]
    assert runs[0].stdout.split() == ["0", "1"] and runs[1].stdout.split() == ["1", "0"]
