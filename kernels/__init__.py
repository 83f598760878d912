"""Numba CPU kernels for specdec, installed as the subpackage ``specdec.kernels``.

Arrays in, arrays out: nothing here imports from ``specdec`` (only relative imports within
this folder).  Every kernel is ``@njit(cache=True, nogil=True)``; the matmul kernels run
``prange`` over output rows.

Modules (kernels/README.md maps format × layout × path × M to each function and its test):
registry (each weight array's kernels, bound at load), cpu (the CPU and the instruction path),
drivers (the one factory of prange drivers), cache (Numba's cache keyed on the whole folder),
formats (the table of GGML format facts), ir (the LLVM IR helpers of the ``*_ir.py`` files),
reference (the plain NumPy statement of every kernel), records (the legacy quants' 8-row record
fields), legacy / legacy_ir / repack / legacy_amx (Q4_0 … Q8_0, F32, F16, BF16), kquants /
kquants_ir / kquants_decode / kquants_dequant / kquants_x16 / kquants_x16_ir / kquants_x16_avx2
/ kquants_x16_amx / q8k (K-quants; kquants_x16_avx2 the interleaved layout's AVX2 code), amx
(AMX tiles: permission, tile configuration, inline assembly), experts (mixture-of-experts
passes), iquants (IQ4_NL, IQ4_XS, MXFP4: their own kernels, and the layouts made at load: Q8_0
rows, IQ4_XS expanded), quantize (requantization at load: any tensor to Q4_0, Q5_0 or Q8_0
rows), float_act / dequant_ir (float activations; dequant_ir's block decoders also serve the
row lookup), q8_act (Q8_0 / Q8_1 activations), attention / attention_ir / attention_tree (the
tree mask), delta_rule (Gated DeltaNet's conv and delta rule), ops (norms, RoPE, activations),
threading_layer (Numba's threading layer), checks (argument checks).

Contract of the quantized matmul kernels (``matmul``):
    w    the raw tensor data exactly as stored in the GGUF file, zero-copy:
         uint8 (N, row_bytes) for block-quantized types and BF16,
         float16 (N, K) for F16, float32 (N, K) for F32;
         for the ``registry.REPACKED`` ids, a legacy quant's 8-row records (repack.py, the
         same shape and bytes); for the ``registry.INTERLEAVED`` ids, an array (N/16, ·) of
         16-row interleaved K-quant records (kquants_x16.py); for ``registry.EXPANDED_XS``,
         IQ4_XS rows with their values expanded to int8 (iquants.py)
    x    float32 (M, K), C-contiguous activations
    out  float32 (M, N); out[m] depends on x[m] only and is *bitwise identical*
         whatever M is and whatever the other rows hold (row independence).
"""
from __future__ import annotations

import numpy as np

from . import cache
cache.install()            # Numba's cache keyed on this whole folder (cache.py), before any @njit
from . import cpu  # noqa: E402
cpu.force_path()            # SPECDEC_KERNELS, before anything below compiles (cpu.py)
from . import threading_layer  # noqa: E402
threading_layer.choose()    # SPECDEC_THREADING: the parallel runtime, before any region runs
from .registry import KERNELS, SUPPORTED_TYPES  # noqa: E402,F401


def matmul(w: np.ndarray, qtype: int, x: np.ndarray, out: np.ndarray | None = None,
           float_act: bool = False) -> np.ndarray:
    """Y = X · Wᵀ.  w: the array of type id qtype (registry.py), x: (M, K) float32 -> (M, N).

    float_act: keep the activations in float32 instead of rounding them to 8 bits per block
    (float_act.py); the file's block-quantized rows only, the float types never round."""
    return KERNELS[qtype].matmul(w, x, out, float_act)


def get_rows(w: np.ndarray, qtype: int, ids: np.ndarray, k: int) -> np.ndarray:
    """Dequantize rows ``ids`` of w.  ids: (M,) int64 -> (M, k) float32."""
    return KERNELS[qtype].rows(w, ids, k)
