"""The GGML tensor formats the kernels read: one record of facts per type, derived from gguf.

``FORMATS[qtype]`` -> Format.  Sizes come from ``gguf.GGML_QUANT_SIZES`` (values and bytes
per block, as ggml's ``ggml_blck_size`` / ``ggml_type_size`` give them); nothing else in
kernels/ defines them.  The legacy quants also carry where the fields of a 32-value block
sit, as the ``block_q4_0`` … ``block_q8_0`` structs of ggml-common.h lay them out:

    Q4_0  fp16 d | qs[16]                      Q4_1  fp16 d | fp16 m | qs[16]
    Q5_0  fp16 d | u32 qh | qs[16]             Q5_1  fp16 d | fp16 m | u32 qh | qs[16]
    Q8_0  fp16 d | int8 qs[32]

and the offset of the unsigned code u the SIMD kernels decode to (w = u − code_offset:
Q4_0 stores u, Q5_0 u | fifth bit, Q8_0 is read as u = w xor 0x80).
"""
from __future__ import annotations

from dataclasses import dataclass

import gguf

_T = gguf.GGMLQuantizationType

F32, F16, BF16 = int(_T.F32), int(_T.F16), int(_T.BF16)
Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 = (int(t) for t in (_T.Q4_0, _T.Q4_1, _T.Q5_0, _T.Q5_1, _T.Q8_0))
Q2_K, Q3_K, Q4_K, Q5_K, Q6_K = (int(t) for t in (_T.Q2_K, _T.Q3_K, _T.Q4_K, _T.Q5_K, _T.Q6_K))
IQ4_NL, IQ4_XS, MXFP4 = (int(t) for t in (_T.IQ4_NL, _T.IQ4_XS, _T.MXFP4))

FLOATS = (F32, F16, BF16)                   # one value per "block"
LEGACY = (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0)     # blocks of 32 values
KQUANTS = (Q2_K, Q3_K, Q4_K, Q5_K, Q6_K)    # super-blocks of QK_K values
CODEBOOK = (IQ4_NL, IQ4_XS, MXFP4)          # 4-bit codes into a table of 16 values (iquants.py)


@dataclass(frozen=True)
class Format:
    """One GGML type.  Byte offsets are within one block (legacy quants only)."""
    qtype: int                    # ggml type id
    block_size: int               # values per block
    type_size: int                # bytes per block
    qh_offset: int | None = None  # the u32 of fifth bits (Q5_0, Q5_1)
    qs_offset: int | None = None  # the codes
    has_min: bool = False         # an fp16 m follows the fp16 d (Q4_1, Q5_1)
    code_offset: int = 0          # w = u − code_offset for the decoded unsigned codes u

    @property
    def name(self) -> str:
        return _T(self.qtype).name

    @property
    def key(self) -> str:
        """The name in lower case, as kernel names carry it (q4_k)."""
        return self.name.lower()

    def row_bytes(self, k: int) -> int:
        """Bytes of a row of k values (k a multiple of block_size)."""
        return k // self.block_size * self.type_size


def _format(qtype: int, **layout) -> Format:
    block_size, type_size = gguf.GGML_QUANT_SIZES[_T(qtype)]
    return Format(qtype, block_size, type_size, **layout)


FORMATS: dict[int, Format] = {
    **{qt: _format(qt) for qt in FLOATS},
    Q4_0: _format(Q4_0, qs_offset=2, code_offset=8),
    Q4_1: _format(Q4_1, qs_offset=4, has_min=True),
    Q5_0: _format(Q5_0, qh_offset=2, qs_offset=6, code_offset=16),
    Q5_1: _format(Q5_1, qh_offset=4, qs_offset=8, has_min=True),
    Q8_0: _format(Q8_0, qs_offset=2, code_offset=128),
    **{qt: _format(qt) for qt in KQUANTS},
    **{qt: _format(qt) for qt in CODEBOOK},
}

QK8 = FORMATS[Q8_0].block_size    # 32: values per legacy block (and per Q8_0 / Q8_1 activation block)
QK_K = FORMATS[Q4_K].block_size   # 256: values per K-quant super-block (and per Q8_K block)
