"""The legacy quants' 8-row records (the layout repack.py writes; see its docstring): their
size and their decoder, in LLVM IR, for repack.py's tiles and legacy_amx.py's."""
from __future__ import annotations

from llvmlite import ir

from .formats import FORMATS, LEGACY, Q8_0
from .ir import F16, I1, I32, I64, V8F32, V8I32, V32I8, load_at, vector_type
from .legacy_ir import Decoded

REC = {qt: 8 * FORMATS[qt].type_size for qt in LEGACY}      # bytes per record


def _f16x8_at(builder, wp, off):
    """8 consecutive fp16 -> <8 x float> (exact)."""
    return builder.fpext(load_at(builder, wp, off, vector_type(F16, 8)), V8F32)


def decode_record(builder, wp, off, qtype: int) -> Decoded:
    """The record at byte ``off`` -> Decoded (legacy_ir: lane r of cols[c] = codes 4c..4c+3
    of row r), as legacy_ir's decoders give it from the GGUF layout."""
    fmt = FORMATS[qtype]
    qh_at, mins, code_off = fmt.qh_offset, fmt.has_min, fmt.code_offset
    at = lambda k: builder.add(off, I64(k))                        # noqa: E731
    d = _f16x8_at(builder, wp, off)
    m = _f16x8_at(builder, wp, at(16)) if mins else None
    pos = 32 if mins else 16
    if qtype == Q8_0:
        return Decoded([load_at(builder, wp, at(pos + 32 * c), V8I32) for c in range(8)], code_off, d, m)
    masks = None
    if qh_at is not None:
        masks = [builder.bitcast(load_at(builder, wp, at(pos + 4 * c), I32), vector_type(I1, 32)) for c in range(8)]
        pos += 32
    nib, four = ir.Constant(V8I32, [0x0F0F0F0F] * 8), ir.Constant(V8I32, [4] * 8)
    vs = [load_at(builder, wp, at(pos + 32 * j), V8I32) for j in range(4)]
    cols = [builder.and_(v, nib) for v in vs] + [builder.and_(builder.lshr(v, four), nib) for v in vs]
    if masks is not None:                                           # bit 4 is clear: +16 sets it
        sixteen = ir.Constant(V32I8, [16] * 32)
        c8 = [builder.bitcast(c, V32I8) for c in cols]
        cols = [builder.bitcast(builder.select(k, builder.add(c, sixteen), c), V8I32)
                for k, c in zip(masks, c8)]
    return Decoded(cols, code_off, d, m)
