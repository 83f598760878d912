"""The kernel registry: each weight array's matmul and row lookup, bound when weights are prepared.

A weight array is named by a type id: the ggml type of the file's own bytes, or the id of a
layout made at load from weights in process memory (never a ggml type):

    type id            bytes                              kernels (tiles: where the path has AMX)
    F32 F16 BF16       the file's rows                    legacy
    Q4_0 … Q8_0        the file's rows                    legacy          (tiles: legacy_amx)
    0x100 | Q4_0 …     8-row records, same bytes          repack          (tiles: legacy_amx)
    Q2_K … Q6_K        the file's rows                    kquants
    IQ4_NL IQ4_XS MXFP4  the file's rows                  iquants
    (IQ4_NL, MXFP4)    as Q8_0 rows / 8-row records       legacy / repack (the same bits: iquants.py)
    0x300 | IQ4_XS     values expanded to int8            iquants
    0x200 | Q4_K …     16-row interleaved records         kquants_x16     (tiles: kquants_x16_amx)

``KERNELS[id]`` is that id's `Kernel` on this process's instruction path (cpu.py, fixed at
import): the SIMD matmul, the AMX tile matmul and the pass size from which it takes over, the
float-activation matmul, the row lookup.  `Kernel.matmul` is the one place a pass chooses
between SIMD and tiles; the engine's weights hold their Kernel from load on (engine/weights.py).
``layout_for`` / ``prepare`` choose and make the layout a tensor gets in process memory.

A new weight format or layout touches two files: its kernel module (matmul fn(w, x, out),
row lookup fn(w, ids, out), and for a layout the function that makes it) and `_table` below.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable

import numpy as np

from . import cpu, iquants, kquants, kquants_x16, kquants_x16_amx, legacy, legacy_amx, repack
from .float_act import MATMUL_FLOAT_ACT
from .formats import CODEBOOK, FLOATS, IQ4_NL, IQ4_XS, KQUANTS, LEGACY, MXFP4, Q8_0
from .q8k import quantize_q8_k

REPACKED = repack.REPACKED               # legacy qtype -> its 8-row records' id
INTERLEAVED = kquants_x16.INTERLEAVED    # K-quant qtype -> its interleaved records' id
EXPANDED_XS = 0x300 | IQ4_XS             # IQ4_XS with its values expanded to int8 (iquants.expand_xs)


@dataclass(frozen=True)
class Kernel:
    """The kernels of one type id.  w is always the array as the layout holds it."""
    id: int
    qtype: int                                  # the ggml type of the values
    simd: Callable                              # fn(w, x, out): any pass
    get_rows: Callable                          # fn(w, ids, out): rows dequantized
    tiles: Callable | None = None               # fn(w, x, out): passes of min_m rows or more
    min_m: int = 0
    float_act: Callable | None = None           # fn(w, x, out), x kept in float32
    record_rows: int = 1                        # a head is cut at a whole record of these rows
    array_rows: int = 1                         # weight rows per row of the array
    in_place: bool = False                      # the layout keeps the file's shape and size

    def matmul(self, w: np.ndarray, x: np.ndarray, out: np.ndarray | None = None,
               float_act: bool = False) -> np.ndarray:
        """Y = X · Wᵀ: x float32 (M, K) -> (M, N) float32 (into out when given)."""
        x = np.ascontiguousarray(x, dtype=np.float32)
        if out is None:
            out = np.empty((x.shape[0], self.n_rows(w)), dtype=np.float32)
        if float_act and self.float_act is not None:
            self.float_act(w, x, out)
        elif self.tiles is not None and x.shape[0] >= self.min_m:
            self.tiles(w, x, out)
        else:
            self.simd(w, x, out)
        return out

    def rows(self, w: np.ndarray, ids: np.ndarray, k: int) -> np.ndarray:
        """Rows ids (M,) of W dequantized -> (M, k) float32."""
        out = np.empty((len(ids), k), dtype=np.float32)
        self.get_rows(w, np.asarray(ids, dtype=np.int64), out)
        return out

    def n_rows(self, w: np.ndarray) -> int:
        """The weight rows N the array holds."""
        return w.shape[0] * self.array_rows

    def cut_rows(self, w: np.ndarray, n: int) -> tuple[np.ndarray, int]:
        """The first n' >= n weight rows (whole records, at most all) as a view, and n'."""
        keep = min(-(-n // self.record_rows) * self.record_rows, self.n_rows(w))
        return w[:-(-keep // self.array_rows)], keep


def _x16_tiles(qtype: int) -> Callable:
    def tiles(w: np.ndarray, x: np.ndarray, out: np.ndarray) -> None:
        kquants_x16_amx.matmul(qtype, w, *quantize_q8_k(x), out)
    return tiles


def _legacy_tiles(qtype: int, simd: Callable, records: bool) -> Callable:
    def tiles(w: np.ndarray, x: np.ndarray, out: np.ndarray) -> None:
        legacy_amx.matmul(qtype, w, x, out, lambda q, wt, xt, ot: simd(wt, xt, ot), records)
    return tiles


def _table(legacy_tiles: bool, x16_tiles: bool) -> list[Kernel]:
    """Every type id's Kernel; legacy_tiles / x16_tiles: whether those passes take the tiles."""
    out = [Kernel(qt, qt, legacy.MATMUL[qt], legacy.GET_ROWS[qt]) for qt in FLOATS]
    for qt in LEGACY:
        amx_m = legacy_amx.MIN_M.get(qt) if legacy_tiles else None
        for rid, mm, rows, n in ((qt, legacy.MATMUL[qt], legacy.GET_ROWS[qt], 1),
                                 (REPACKED[qt], repack.MATMUL[qt], repack.GET_ROWS[qt], 8)):
            out.append(Kernel(rid, qt, mm, rows, _legacy_tiles(qt, mm, n > 1) if amx_m else None,
                              amx_m or 0, MATMUL_FLOAT_ACT[qt] if n == 1 else None, n, in_place=n > 1))
    out += [Kernel(qt, qt, kquants.MATMUL[qt], kquants.GET_ROWS[qt], float_act=MATMUL_FLOAT_ACT[qt])
            for qt in KQUANTS]
    out += [Kernel(INTERLEAVED[qt], qt, kquants_x16.MATMUL[qt], kquants_x16.GET_ROWS[qt],
                   _x16_tiles(qt) if x16_tiles else None, kquants_x16_amx.MIN_M,
                   record_rows=kquants_x16.ROWS, array_rows=kquants_x16.ROWS) for qt in INTERLEAVED]
    out += [Kernel(qt, qt, iquants.MATMUL[qt], iquants.GET_ROWS[qt]) for qt in CODEBOOK]
    out.append(Kernel(EXPANDED_XS, IQ4_XS, iquants.matmul_xs8, iquants.get_rows_xs8))
    return out


KERNELS: dict[int, Kernel] = {k.id: k for k in _table(cpu.tiles(), cpu.tiles_x16())}
SUPPORTED_TYPES = frozenset(i for i in KERNELS if i < 0x100)     # the ggml types a file may hold


def with_tiles(type_id: int, min_m: int | None = None) -> Kernel:
    """KERNELS[type_id] with its tile matmul whatever the path (from min_m rows when given):
    for tests and benchmarks on a host with AMX; ValueError for an id without tiles."""
    k = next(k for k in _table(True, True) if k.id == type_id)
    if k.tiles is None:
        raise ValueError(f"type id {type_id:#x} has no tile kernel")
    return k if min_m is None else replace(k, min_m=min_m)


def layout_for(qtype: int, n_rows: int) -> int | None:
    """The type id a tensor of n_rows rows gets in process memory: K-quants of 16k rows the
    interleaved records, legacy quants of 8k rows the 8-row records, else None (its file rows)."""
    if kquants_x16.can_interleave(qtype, n_rows):
        return INTERLEAVED[qtype]
    if qtype in (IQ4_NL, MXFP4):                     # as Q8_0 (MXFP4: where its scales are fp16s)
        return REPACKED[Q8_0] if n_rows % 8 == 0 else Q8_0
    if qtype == IQ4_XS:
        return EXPANDED_XS
    return REPACKED[qtype] if qtype in LEGACY and n_rows % 8 == 0 else None


def prepare(w: np.ndarray, qtype: int) -> tuple[np.ndarray, int]:
    """(w in its layout_for layout, the type id): a new array (in_place layouts keep w's shape
    and size: engine/gguf_file.rewrite can put them back into the file's memory)."""
    new = layout_for(qtype, w.shape[0])
    if new is None:
        raise ValueError(f"{qtype} with {w.shape[0]} rows has no layout of its own")
    if qtype in (IQ4_NL, MXFP4):
        q8 = iquants.q8_0_rows(w, qtype)
        if q8 is None:                               # a scale no fp16 holds: the file's rows
            return w, qtype
        return (repack.repack(q8, Q8_0) if new == REPACKED[Q8_0] else q8), new
    if qtype == IQ4_XS:
        return iquants.expand_xs(w), new
    return (kquants_x16.interleave(qtype, w) if new == INTERLEAVED.get(qtype) else repack.repack(w, qtype)), new
