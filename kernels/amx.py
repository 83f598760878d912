"""Intel AMX for the kernels: is it usable here, the tile permission, and the tile instructions.

AMX (Advanced Matrix Extensions, Xeon 4th generation on) adds eight tile registers of up to
16 rows x 64 bytes and ``tdpbsud``: C (16 x 16 int32) += A (16 x 64 int8) · B, where B holds
16 columns of 64 unsigned bytes in the VNNI order (row kk of B = bytes 4kk … 4kk+3 of each
of the 16 columns).  One instruction does 16 x 16 x 64 exact multiply-adds: the integer dot
products of many activation rows at once, without the per-row ``vpdpbusd`` chains.

Using it takes three things, each checked here (``available()``):

1. the CPU has it: /proc/cpuinfo lists ``amx_tile`` and ``amx_int8``, and the features Numba
   compiles for include them (``SPECDEC_KERNELS=vnni|avx2`` turns them off);
2. the OS saves the tile state: XCR0 bits 17 (XTILECFG) and 18 (XTILEDATA), read with
   ``xgetbv``;
3. the process may use the tile data: Linux grants it on request,
   ``arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)``, once for the whole process (the
   Numba workers included: the permission is per process, and a thread that touches the
   tiles without it dies with SIGILL).  ``ARCH_GET_XCOMP_PERM`` confirms it.

Each kernel loads its tile configuration (``tile_config``) in the thread that runs it, at the
start of its work (a prange body), and releases the tiles at the end: the configuration is
per thread and a fresh worker has none.

The instructions are emitted as inline assembly in Numba intrinsics, which needs LLVM's
native assembly parser (``llvmlite.binding.initialize_native_asmparser``, called here).
Tile registers are invisible to LLVM, so every asm statement is a side effect touching memory:
LLVM keeps their order.
"""
from __future__ import annotations

import ctypes
import functools

import numpy as np
from llvmlite import binding as llb
from llvmlite import ir
from numba import njit, types
from numba.extending import intrinsic

from .ir import I32, I64, byte_ptr, cpu_features

SYS_ARCH_PRCTL = 158                      # x86-64
ARCH_GET_XCOMP_PERM, ARCH_REQ_XCOMP_PERM = 0x1022, 0x1023
XFEATURE_XTILEDATA = 18
XCR0_TILE = (1 << 17) | (1 << 18)         # XTILECFG | XTILEDATA

I8P = ir.IntType(8).as_pointer()
llb.initialize_native_asmparser()         # before any kernel with inline assembly compiles


def _cpuinfo_flags(path: str = "/proc/cpuinfo") -> set[str]:
    """The flags of the first CPU in /proc/cpuinfo (empty off Linux)."""
    try:
        with open(path) as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.partition(":")[2].split())
    except OSError:
        pass
    return set()


def _request_permission() -> bool:
    """arch_prctl(ARCH_REQ_XCOMP_PERM, XTILEDATA), then check it with ARCH_GET_XCOMP_PERM."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.syscall(SYS_ARCH_PRCTL, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) != 0:
            return False
        mask = ctypes.c_uint64(0)
        if libc.syscall(SYS_ARCH_PRCTL, ARCH_GET_XCOMP_PERM, ctypes.byref(mask)) != 0:
            return False
        return bool(mask.value & (1 << XFEATURE_XTILEDATA))
    except (OSError, AttributeError):
        return False


@functools.lru_cache(maxsize=None)
def status() -> str:
    """'' when AMX int8 is usable by this process, else why not (one short phrase)."""
    flags = _cpuinfo_flags()
    if not {"amx_tile", "amx_int8"} <= flags:
        return "the CPU has no AMX int8 (amx_tile, amx_int8)"
    if not {"+amx-tile", "+amx-int8"} <= cpu_features():
        return "the kernels are compiled without AMX (SPECDEC_KERNELS or NUMBA_CPU_FEATURES)"
    if _xcr0() & XCR0_TILE != XCR0_TILE:
        return "the OS does not save the tile state (XCR0 bits 17, 18)"
    if not _request_permission():
        return "arch_prctl(ARCH_REQ_XCOMP_PERM, XTILEDATA) was refused"
    return ""


def available() -> bool:
    """AMX int8 usable here: CPU, compile target, XCR0 and the process's permission."""
    return status() == ""


# ------------------------------------------------------------------- tile configuration

def tile_config(shapes: dict[int, tuple[int, int]]) -> np.ndarray:
    """The 64-byte ldtilecfg operand, palette 1: {tile: (rows, bytes per row)}."""
    cfg = np.zeros(64, np.uint8)
    cfg[0] = 1
    for t, (rows, colsb) in shapes.items():
        cfg[16 + 2 * t: 18 + 2 * t] = np.frombuffer(np.uint16(colsb).tobytes(), np.uint8)
        cfg[48 + t] = rows
    return cfg


# ------------------------------------------------------------------------ intrinsics

def asm(builder, text: str, constraints: str, args: list) -> None:
    """Emit ``text`` as a side-effecting inline-assembly statement (operands args)."""
    fnty = ir.FunctionType(ir.VoidType(), [a.type for a in args])
    builder.call(ir.InlineAsm(fnty, text, constraints, side_effect=True), args)


@intrinsic
def _xgetbv0(typingctx):
    """XCR0 (xgetbv with ecx = 0) as uint64."""
    def codegen(context, builder, sig, args):
        pair = ir.LiteralStructType([I32, I32])
        fnty = ir.FunctionType(pair, [I32])
        res = builder.call(ir.InlineAsm(fnty, "xgetbv", "={eax},={edx},{ecx}", side_effect=True),
                           [I32(0)])
        lo = builder.zext(builder.extract_value(res, 0), I64)
        hi = builder.zext(builder.extract_value(res, 1), I64)
        return builder.or_(lo, builder.shl(hi, I64(32)))
    return types.uint64(), codegen


@njit(cache=True, nogil=True)
def _xcr0_njit():
    return _xgetbv0()


def _xcr0() -> int:
    return int(_xcr0_njit())


@intrinsic
def load_config(typingctx, cfg):
    """ldtilecfg from cfg (uint8[64], tile_config)."""
    def codegen(context, builder, sig, args):
        asm(builder, "ldtilecfg ($0)", "r,~{memory}", [byte_ptr(context, builder, sig, args, 0)])
        return context.get_dummy_value()
    return types.void(cfg), codegen


@intrinsic
def release(typingctx):
    """tilerelease: the tiles back to their initial state (the thread's work is done)."""
    def codegen(context, builder, sig, args):
        asm(builder, "tilerelease", "~{memory}", [])
        return context.get_dummy_value()
    return types.void(), codegen


def _tile_codegen(text: str, n_arrays: int):
    """Codegen running ``text`` with (array, byte offset, stride) triples as $0, $1, …"""
    def codegen(context, builder, sig, args):
        vals = []
        for j in range(n_arrays):
            vals += [byte_ptr(context, builder, sig, args, 3 * j, 3 * j + 1),
                     context.cast(builder, args[3 * j + 2], sig.args[3 * j + 2], types.int64)]
        asm(builder, text, ",".join(["r"] * len(vals) + ["~{memory}"]), vals)
        return context.get_dummy_value()
    return codegen


# tmm0, tmm4: C (16 x 16 int32);  tmm1, tmm5: A (activation rows);  tmm2: B (weight columns)
_LOAD_B = "tileloadd ($0,$1,1), %tmm2"
_DOT = ("tileloadd ($0,$1,1), %tmm1\n\ttilezero %tmm0\n\ttdpbsud %tmm2, %tmm1, %tmm0\n\t"
        "tilestored %tmm0, ($2,$3,1)")
_DOT2 = ("tileloadd ($0,$1,1), %tmm1\n\ttileloadd ($2,$3,1), %tmm5\n\ttilezero %tmm0\n\t"
         "tilezero %tmm4\n\ttdpbsud %tmm2, %tmm1, %tmm0\n\ttdpbsud %tmm2, %tmm5, %tmm4\n\t"
         "tilestored %tmm0, ($4,$5,1)\n\ttilestored %tmm4, ($6,$7,1)")


@intrinsic
def load_b(typingctx, buf, off, stride):
    """tmm2 <- B at buf + off (bytes), rows stride bytes apart."""
    return types.void(buf, off, stride), _tile_codegen(_LOAD_B, 1)


@intrinsic
def dot_store(typingctx, a, a_off, a_stride, c, c_off, c_stride):
    """tmm1 <- A at a + a_off; tmm0 = A · tmm2 (tdpbsud: signed A, unsigned B); store it at c + c_off."""
    return types.void(a, a_off, a_stride, c, c_off, c_stride), _tile_codegen(_DOT, 2)


@intrinsic
def dot_store2(typingctx, a, a_off, a_stride, a2, a2_off, a2_stride, c, c_off, c_stride,
               c2, c2_off, c2_stride):
    """dot_store for two A tiles (tmm1, tmm5 -> tmm0, tmm4) against the same B."""
    sig = types.void(a, a_off, a_stride, a2, a2_off, a2_stride, c, c_off, c_stride, c2, c2_off, c2_stride)
    return sig, _tile_codegen(_DOT2, 4)
