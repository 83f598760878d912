"""Peak memory of the speculative pair: resident set size against what it has to hold.

Loads the Qwen target and draft with a --ctx-size context (default 4096), runs a short
speculative generation so that every kernel and buffer has been touched, and reports the
process's peak RSS beside the two GGUF files' sizes plus both KV caches.  The weights are
memory-mapped: their pages count in RSS once read, but they are the file's pages, never a
copy.  Writes memory.json into --out.

    python benchmarks/memory.py [--ctx-size 4096] [--out bench-results]
"""
from __future__ import annotations

import argparse
import os
import resource
from pathlib import Path

import specdec
from common import QWEN_DRAFT, QWEN_TARGET, machine_info, write_json


def peak_rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024      # Linux: KiB


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ctx-size", type=int, default=4096)
    ap.add_argument("--n-predict", type=int, default=64)
    ap.add_argument("--out", default="bench-results")
    a = ap.parse_args(argv)
    base = peak_rss_bytes()
    target = specdec.load(QWEN_TARGET, n_ctx=a.ctx_size)
    draft = specdec.load(QWEN_DRAFT, n_ctx=a.ctx_size)
    out = target.generate("Write a Python function that merges two sorted lists.",
                          n_predict=a.n_predict, draft=draft, draft_n=5, draft_p=0.9)
    files = sum(os.path.getsize(m.path) for m in (target, draft))
    kv = sum(2 * c.n_layer * c.n_head_kv * a.ctx_size * c.d_head * 4
             for c in (target.config, draft.config))                      # float32 K and V
    peak = peak_rss_bytes()
    r = {"machine": machine_info(), "ctx_size": a.ctx_size, "gguf_bytes": files, "kv_cache_bytes": kv,
         "peak_rss_bytes": peak, "rss_before_load_bytes": base, "n_tokens": len(out.ids),
         "ratio_to_files_plus_kv": round(peak / (files + kv), 3)}
    write_json(Path(a.out) / "memory.json", r)
    print(f"peak RSS {peak / 2**20:.0f} MiB = {r['ratio_to_files_plus_kv']:.3f} x (GGUF files "
          f"{files / 2**20:.0f} MiB + KV caches {kv / 2**20:.0f} MiB); before loading {base / 2**20:.0f} MiB")


if __name__ == "__main__":
    main()
