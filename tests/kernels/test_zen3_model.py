"""The AVX2 kernels as a Zen 3 runs them, checked on any x86 host without timing anything.

benchmarks/kernels_zen3.py compiles the interleaved K-quants' AVX2 code (SPECDEC_KERNELS=avx2:
no AVX-512, 16 ymm registers) for ``-mcpu=znver3``, for passes of M = 1, 9 and 17 rows, and
models each record's hot loop with ``llvm-mca -mcpu=znver3``.  A pass of M rows against one
row (the rows' cycles beside the record's weight stream, kernels_zen3.kquant_model) must stay
within kernels_zen3.BOUNDS: 9 rows ≤ 2.0x, 17 rows ≤ 3.5x.  The 512-bit code these kernels
had before modelled 2.2-2.8x and 3.9-4.7x (docs/architecture.md, "AVX2 on Zen 3"), and
measured 7.7x for 9 rows on a Zen 3.  Every instruction must be VEX (no zmm, no ymm16-31, no
mask registers), and a one-row pass no slower than that older code's modelled cycles.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
import kernels_zen3  # noqa: E402

from specdec.kernels import cpu  # noqa: E402

ONE_ROW_BEFORE = {"Q4_K": 198.4, "Q5_K": 367.1, "Q6_K": 391.2}   # modelled cycles per record, M = 1


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    if kernels_zen3.llvm_mca() is None:
        pytest.skip("llvm-mca is not installed (apt-get install llvm-14-tools)")
    if "avx2" not in cpu.host().flags:
        pytest.skip("the host cannot compile the AVX2 path (not x86 with AVX2)")
    out = tmp_path_factory.mktemp("zen3") / "model.json"
    env = {**os.environ, "SPECDEC_KERNELS": "avx2"}
    subprocess.run([sys.executable, str(ROOT / "benchmarks" / "kernels_zen3.py"), "--m", "1", "9", "17",
                    "--json", str(out)], check=True, env=env, cwd=ROOT, timeout=600, capture_output=True)
    return json.loads(out.read_text())


def test_the_model_ran_the_avx2_path(model):
    assert model["path"] == "avx2"
    assert set(model["kquants"]) == {"Q4_K", "Q5_K", "Q6_K"}


@pytest.mark.parametrize("name", ["Q4_K", "Q5_K", "Q6_K"])
def test_extra_rows_stay_cheap_on_zen3(model, name):
    rows = {r["m"]: r for r in model["kquants"][name]}
    for m, bound in kernels_zen3.BOUNDS.items():
        assert rows[m]["ratio"] <= bound, (name, m, rows[m])


@pytest.mark.parametrize("name", ["Q4_K", "Q5_K", "Q6_K"])
def test_plain_avx2_and_one_row_no_dearer(model, name):
    rows = model["kquants"][name]
    assert all(r["evex"] == 0 for r in rows), rows
    assert rows[0]["m"] == 1 and rows[0]["cycles"] <= 1.02 * ONE_ROW_BEFORE[name], rows[0]


PROBE = r"""
import numpy as np
from specdec.kernels import cpu, legacy
from specdec.kernels.formats import Q4_0
w, x, out = np.zeros((16, 18), np.uint8), np.ones((3, 32), np.float32), np.zeros((3, 16), np.float32)
legacy.MATMUL[Q4_0](w, x, out)
asm = "".join(legacy._tile_blocks.inspect_asm().values())
print(cpu.path(), sum("zmm" in line or "%k" in line for line in asm.splitlines()))
"""


def test_forced_avx2_compiles_no_avx512(tmp_path):
    """SPECDEC_KERNELS=avx2 on a host with AVX-512 compiles true AVX2 code (Numba's code
    generator takes the path's features: cpu.force_path runs before the first @njit), so
    the forced path on any host is the code a Zen 3 runs."""
    if "avx2" not in cpu.host().flags:
        pytest.skip("the host cannot compile the AVX2 path (not x86 with AVX2)")
    env = {**os.environ, "SPECDEC_KERNELS": "avx2", "NUMBA_CACHE_DIR": str(tmp_path)}
    done = subprocess.run([sys.executable, "-c", PROBE], env=env, cwd=ROOT, capture_output=True, text=True,
                          timeout=600, check=True)
    assert done.stdout.split()[-2:] == ["avx2", "0"], done.stdout
