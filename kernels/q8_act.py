"""Activation quantization to Q8_0 / Q8_1 blocks, plus exact fp16 <-> fp32 scalars.

Before a legacy-quant matmul each row of x is quantized in blocks of 32, the way
ggml does before ``ggml_vec_dot_q*_q8_*``:

    d  = amax / 127            (float32)       # matches quantize_row_q8_0_ref
    id = 1 / d  (0 when d == 0)
    q  = roundf(x * id)        (int8, half away from zero)
    d is stored as fp16; the dot products use that fp16 value
    s  = fp16(float(sum(q)) * d)                # matches quantize_row_q8_1_ref

The result is kept unpacked (``Q8Act``): int8 (M, K) quants, float32 (M, K/32)
scales that already went through fp16, the exact int32 block sums of q (the
kernels use them to undo the +8 / +16 / +128 weight offsets) and the Q8_1
``s`` as float32.  ``q8_0_bytes`` packs the same numbers into GGUF's block_q8_0
byte layout; it is byte-identical to ``gguf.quants.quantize(x, Q8_0)``.  (ggml's x86
SIMD quantize_row_q8_0 rounds half to even with id = 127/amax; the reference rules above
differ from it only on exact ties and in the last bit of id.)
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.extending import intrinsic

from .formats import QK8   # values per Q8_0 / Q8_1 block


# --------------------------------------------------------------------------
# exact scalar conversions (LLVM fpext / fptrunc on the IEEE half type)
# --------------------------------------------------------------------------

@intrinsic
def half_bits_to_f32(typingctx, bits):
    """uint16 fp16 bit pattern -> float32, exact (matches GGML_FP16_TO_FP32)."""
    if not isinstance(bits, types.Integer):
        return None
    sig = types.float32(bits)

    def codegen(context, builder, sig, args):
        h = context.cast(builder, args[0], sig.args[0], types.uint16)
        return builder.fpext(builder.bitcast(h, ir.HalfType()), ir.FloatType())

    return sig, codegen


@intrinsic
def f32_to_half_bits(typingctx, value):
    """float32 -> uint16 fp16 bits, round to nearest even (matches GGML_FP32_TO_FP16)."""
    if value != types.float32:
        return None
    sig = types.uint16(value)

    def codegen(context, builder, sig, args):
        h = builder.fptrunc(args[0], ir.HalfType())
        return builder.bitcast(h, ir.IntType(16))

    return sig, codegen


@intrinsic
def bits_to_f32(typingctx, bits):
    """int32 / uint32 bit pattern -> float32 (a bitcast)."""
    if not isinstance(bits, types.Integer) or bits.bitwidth != 32:
        return None
    sig = types.float32(bits)

    def codegen(context, builder, sig, args):
        return builder.bitcast(args[0], ir.FloatType())

    return sig, codegen


@njit(cache=True, nogil=True)
def round_f16(v):
    """float32 -> nearest fp16 value, as float32."""
    return half_bits_to_f32(f32_to_half_bits(v))


@njit(cache=True, nogil=True)
def _roundf(v):
    """C roundf on float32 (ties away from zero) -> int32, exact for |v| < 2^31.

    Adding the largest float below 1/2 (with v's sign) and truncating is how LLVM lowers
    llvm.round: the sum rounds to nearest, so 0.49999997 + 0.49999997 stays below 1 while
    0.5 + 0.49999997 rounds up to 1.  Branch-free, so the block loop vectorizes.
    """
    half_minus = np.float32(0.49999997)
    return np.int32(v + (half_minus if v >= np.float32(0.0) else -half_minus))


@njit(cache=True, nogil=True)
def quantize_q8_rows(x, xq, xd, xsum, xs):
    """Quantize x row by row into Q8_0/Q8_1 blocks of 32.

    x    float32 (M, K), K % 32 == 0
    xq   int8    (M, K)      quants, |q| <= 127
    xd   float32 (M, K/32)   block scale d, rounded through fp16
    xsum int32   (M, K/32)   sum of the 32 quants of the block
    xs   float32 (M, K/32)   fp16(sum * d) as float32 (Q8_1's s)
    Rows are independent: row m only reads x[m].
    """
    m_rows, k = x.shape
    nb = k // QK8
    bits = x.view(np.int32)  # |x| ordered as the int32 of its bits (NaN aside)
    for m in range(m_rows):
        for b in range(nb):
            base = b * QK8
            amax_bits = np.int32(0)
            for j in range(QK8):  # matches quantize_row_q8_0_ref: MAX(amax, fabsf(v))
                amax_bits = max(amax_bits, np.int32(bits[m, base + j] & 0x7FFFFFFF))
            d = bits_to_f32(amax_bits) / np.float32(127.0)
            inv = np.float32(1.0) / d if d != np.float32(0.0) else np.float32(0.0)
            total = np.int32(0)
            for j in range(QK8):
                q = _roundf(x[m, base + j] * inv)
                xq[m, base + j] = np.int8(q)
                total += q
            xd[m, b] = round_f16(d)
            xsum[m, b] = total
            xs[m, b] = round_f16(np.float32(total) * d)  # matches quantize_row_q8_1_ref


@njit(cache=True, nogil=True)
def q8_rows(x):
    """float32 (M, K) -> (xq, xd, xsum, xs) of quantize_q8_rows, in new arrays."""
    m_rows, k = x.shape
    nb = k // QK8
    xq = np.empty((m_rows, k), np.int8)
    xd = np.empty((m_rows, nb), np.float32)
    xsum = np.empty((m_rows, nb), np.int32)
    xs = np.empty((m_rows, nb), np.float32)
    quantize_q8_rows(x, xq, xd, xsum, xs)
    return xq, xd, xsum, xs


class Q8Act(NamedTuple):
    """Unpacked Q8_0/Q8_1 activations; see the module docstring."""

    q: np.ndarray     # int8    (M, K)
    d: np.ndarray     # float32 (M, K/32)
    qsum: np.ndarray  # int32   (M, K/32)
    s: np.ndarray     # float32 (M, K/32)


def quantize_q8(x: np.ndarray) -> Q8Act:
    """float32 (M, K) -> Q8Act.  K must be a multiple of 32."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    if x.shape[1] % QK8:
        raise ValueError(f"row length {x.shape[1]} is not a multiple of {QK8}")
    return Q8Act(*q8_rows(x))


def q8_0_bytes(act: Q8Act) -> np.ndarray:
    """Pack to GGUF block_q8_0 bytes: uint8 (M, K/32 * 34) = [fp16 d][32 x int8]."""
    m_rows, k = act.q.shape
    nb = k // QK8
    blocks = np.empty((m_rows, nb, 2 + QK8), np.uint8)
    blocks[:, :, :2] = act.d.astype(np.float16).view(np.uint8).reshape(m_rows, nb, 2)
    blocks[:, :, 2:] = act.q.view(np.uint8).reshape(m_rows, nb, QK8)
    return blocks.reshape(m_rows, nb * (2 + QK8))
