"""Sustained memory-read bandwidth of this machine: the roofline for decoding.

A Numba streaming reduction over a buffer much larger than the caches, single-threaded and
with every thread; the best of a few repeats.  Writes JSON (default bench-results/bandwidth.json).

With --file (a model file, default the Qwen-1.5B target when cached) the same reduction also
reads that file three ways: mapped (np.memmap over the page cache, what `--mmap` decodes
from), read into ordinary process memory, and read into memory advised for transparent huge
pages (what specdec's default load does when the file fits): the figures behind the default.

    python benchmarks/bandwidth.py [--gb 2] [--file PATH] [--out bench-results]
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numba
import numpy as np
from numba import njit, prange

from common import machine_info, write_json


@njit(cache=True, nogil=True)
def _sum_serial(a):
    s = np.int64(0)
    for i in range(a.shape[0]):
        s += a[i]
    return s


@njit(cache=True, nogil=True, parallel=True)
def _sum_parallel(a):
    n_chunks = 64
    step = (a.shape[0] + n_chunks - 1) // n_chunks
    partial = np.zeros(n_chunks, dtype=np.int64)
    for c in prange(n_chunks):
        s = np.int64(0)
        for i in range(c * step, min(a.shape[0], (c + 1) * step)):
            s += a[i]
        partial[c] = s
    return partial.sum()


def measure(gb: float = 2.0, repeats: int = 3) -> dict:
    a = np.ones(int(gb * 1e9) // 8, dtype=np.int64)         # (n,) touched once to fault it in
    _sum_serial(a[:1024]); _sum_parallel(a[:1024])            # compile outside the timing
    out = {}
    for name, fn in (("single_thread_gbs", _sum_serial), ("all_threads_gbs", _sum_parallel)):
        best = 0.0
        for _ in range(repeats):
            t = time.perf_counter()
            fn(a)
            best = max(best, a.nbytes / (time.perf_counter() - t) / 1e9)
        out[name] = round(best, 2)
    out["threads"] = numba.get_num_threads()
    out["buffer_gb"] = gb
    return out


def _best_gbs(fn, a, repeats: int) -> float:
    best = 0.0
    for _ in range(repeats):
        t = time.perf_counter()
        fn(a)
        best = max(best, a.nbytes / (time.perf_counter() - t) / 1e9)
    return round(best, 2)


def measure_file(path: Path, repeats: int = 5) -> dict:
    """GB/s of the streaming sum over one file: mapped, in memory, in huge-page memory."""
    from specdec.engine.gguf_file import read_into_memory
    n8 = path.stat().st_size // 8 * 8
    mapped = np.memmap(path, dtype=np.uint8, mode="r")[:n8].view(np.int64)     # (n8 / 8,)
    _sum_parallel(mapped)                                        # fault the pages in
    plain = np.fromfile(path, dtype=np.uint8)[:n8].view(np.int64)
    huge = read_into_memory(str(path))[:n8].view(np.int64)
    out = {"file": path.name, "file_gb": round(path.stat().st_size / 1e9, 3)}
    for name, arr in (("mapped", mapped), ("in_memory", plain), ("in_memory_hugepages", huge)):
        out[name + "_gbs"] = _best_gbs(_sum_parallel, arr, repeats)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gb", type=float, default=2.0)
    ap.add_argument("--file", default=None, help="a model file to read mapped and in memory "
                    "(default: the cached Qwen-1.5B target, when there)")
    ap.add_argument("--out", default="bench-results")
    a = ap.parse_args()
    res = {"machine": machine_info(), **measure(a.gb)}
    f = Path(a.file) if a.file else Path.home() / ".cache/specdec/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"
    if f.exists():
        res["file_read"] = measure_file(f)
    print(json.dumps(res, indent=1))
    write_json(Path(a.out) / "bandwidth.json", res)


if __name__ == "__main__":
    main()
