"""Row independence up to 64 rows, every weight format, both layouts, on this process's
instruction path: the first M rows of a pass over 64 activation rows are bitwise the pass
over those M rows alone, for every M = 1..64 (every static-M kernel, the passes of PASS_M
rows, their remainders), and each row is bitwise the row computed alone.  test_paths.py runs
the same shapes across the paths the host has."""
from __future__ import annotations

import gguf
import numpy as np
import pytest

from specdec import kernels
from specdec.kernels import registry
from helpers import F16_FIELDS, make_weights, random_weights

QUANTS = sorted(qt for qt in kernels.SUPPORTED_TYPES if qt not in (0, 1, 30))   # F32, F16, BF16: no rows kernel


def _weights(qt: int, rng) -> list[tuple[str, np.ndarray, int]]:
    T = gguf.GGMLQuantizationType(qt)
    w = random_weights(rng, T, 48, 2) if T in F16_FIELDS else make_weights(T, 48, 512, rng, raw=False)
    out = [("gguf", w, qt)]
    if registry.layout_for(qt, w.shape[0]) is not None:        # 8-row records / 16-row interleaved
        out.append(("prepared", *registry.prepare(w.copy(), qt)))
    return out


@pytest.mark.parametrize("qt", QUANTS, ids=lambda q: gguf.GGMLQuantizationType(q).name)
def test_rows_up_to_64_are_independent(qt):
    rng = np.random.default_rng(qt)
    x = rng.standard_normal((64, 512)).astype(np.float32)
    for layout, w, qtype in _weights(qt, rng):
        full = kernels.matmul(w, qtype, x).view(np.uint32)                   # (64, N)
        for m in range(1, 65):
            part = kernels.matmul(w, qtype, np.ascontiguousarray(x[:m])).view(np.uint32)
            assert np.array_equal(part, full[:m]), (layout, m)
        for i in (0, 17, 40, 63):
            alone = kernels.matmul(w, qtype, np.ascontiguousarray(x[i:i + 1])).view(np.uint32)
            assert np.array_equal(alone[0], full[i]), (layout, i)
