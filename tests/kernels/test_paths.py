"""SPECDEC_KERNELS: every instruction path this host can run gives the default path's numbers
bit for bit (every weight format, GGUF and repacked layouts, q8 and float activations,
M = 1, 2, 5, 9, 17, 20, 33, 64), and a path the host lacks, or no path at all, is a one-line error."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from specdec.kernels import cpu

ROOT = Path(__file__).resolve().parents[2]

# One process per path: the kernels compile for the path chosen at import.  It writes every
# product of random weights (fixed seeds) to an .npz.
SCRIPT = r"""
import sys
sys.path.insert(0, "tests")
import gguf
import numpy as np
import specdec
from specdec import kernels
from specdec.kernels import cpu, registry
from helpers import F16_FIELDS, make_weights, random_weights
rng = np.random.default_rng(7)
out = {"path": np.array(cpu.path())}
for qt in sorted(kernels.SUPPORTED_TYPES):
    if qt in (0, 1, 30):
        continue                                      # F32, F16, BF16: no integer path
    T = gguf.GGMLQuantizationType(qt)
    w = random_weights(rng, T, 48, 2) if T in F16_FIELDS else make_weights(T, 48, 512, rng, raw=False)
    for m in (1, 2, 5, 9, 17, 20, 33, 64):
        x = rng.standard_normal((m, 512)).astype(np.float32)
        for fa in (False, True):
            out[f"{qt}-{m}-{int(fa)}"] = kernels.matmul(w, qt, x, float_act=fa)
        if registry.layout_for(qt, w.shape[0]) is not None:
            rw, rid = registry.prepare(w.copy(), qt)
            out[f"{qt}-{m}-r"] = kernels.matmul(rw, rid, x)
np.savez(sys.argv[1], **out)
"""


def _run(path: str | None, dest: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_CPU_FEATURES"}
    env.pop(cpu.KERNELS_ENV, None)
    if path:
        env[cpu.KERNELS_ENV] = path
    r = subprocess.run([sys.executable, "-c", SCRIPT, str(dest)], env=env, cwd=ROOT,
                       capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-2000:]
    with np.load(dest) as z:
        return {k: z[k] for k in z.files}


def _runnable(path: str) -> bool:
    flags = cpu.host().flags
    return all(f in flags for f in cpu._NEEDS[path])


@pytest.mark.slow
def test_every_path_this_host_runs_is_bitwise_the_default(tmp_path):
    default = _run(None, tmp_path / "default.npz")
    paths = [p for p in cpu.PATHS if _runnable(p)]
    if paths == [str(default["path"])]:
        pytest.skip(f"this host runs one path only ({paths[0]})")
    for p in paths:
        got = _run(p, tmp_path / f"{p}.npz")
        assert str(got["path"]) == p
        assert set(got) == set(default)
        for key in default:
            if key != "path":
                assert np.array_equal(got[key].view(np.uint32), default[key].view(np.uint32)), (p, key)


def test_a_forced_path_compiles_into_a_cache_of_its_own(tmp_path):
    """The cache index does not key code by the features a path turns off: a forced process
    reading the default path's cache would run the default path's instructions."""
    probe = ("import specdec.kernels\nfrom specdec.kernels import q8k\n"
             "print(q8k.quantize_row_q8_k._cache._cache_path)")
    paths = [p for p in cpu.PATHS if _runnable(p) and p != "amx"]
    seen = set()
    for p in paths:
        env = {k: v for k, v in os.environ.items() if k not in ("NUMBA_CPU_FEATURES", "NUMBA_CACHE_DIR")}
        env.update({cpu.KERNELS_ENV: p, "NUMBA_CACHE_DIR": str(tmp_path)})
        r = subprocess.run([sys.executable, "-c", probe], env=env, cwd=ROOT, capture_output=True,
                           text=True, timeout=300)
        assert r.returncode == 0, r.stderr[-2000:]
        where = r.stdout.strip().splitlines()[-1]
        assert where.startswith(str(tmp_path / f"path-{p}")), where
        seen.add(where)
    assert len(seen) == len(paths)


def test_unknown_or_missing_paths_are_one_line_errors(monkeypatch, tmp_path):
    saved = dict(cpu._forced)
    try:
        cpu._forced.clear()
        assert cpu.force_path({cpu.KERNELS_ENV: "telepathy"}) is None
        with pytest.raises(ValueError, match="the paths are amx, vnni, avx2"):
            cpu.check_path()
        cpu._forced.clear()
        monkeypatch.setattr(cpu, "host", lambda: cpu.CpuInfo("AuthenticAMD", "a Zen 3", 25, 1, 1, ("avx2",)))
        assert cpu.force_path({cpu.KERNELS_ENV: "vnni"}) is None
        with pytest.raises(ValueError, match="lacks avx512f, avx512bw, avx512_vnni") as e:
            cpu.check_path()
        assert "\n" not in str(e.value)
    finally:
        cpu._forced.clear()
        cpu._forced.update(saved)
    env = {**os.environ, cpu.KERNELS_ENV: "telepathy"}
    r = subprocess.run([sys.executable, "-m", "specdec.frontends.cli", "info", str(tmp_path / "x.gguf")],
                       env=env, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 2 and r.stderr.strip().count("\n") == 0, r.stderr
    assert "SPECDEC_KERNELS=telepathy" in r.stderr


def test_machine_info_records_the_path():
    info = cpu.describe()["kernel_paths"]
    assert info["path"] == cpu.path() and info["path"] in ("amx", "vnni", "avx2", "portable")
    json.dumps(info)
