"""Prompt-processing and decode speed per model, beside llama.cpp's figures on this machine kind.

For each model: load (timed), compile/warm the kernels once (timed, reported apart), then
pp64 = one batched forward over 64 prompt tokens, tg64 = 64 greedy decode steps one token at
a time; each the best of --repeats runs.  Reports tokens/s, weight bytes read per decoded
token, achieved GB/s and its fraction of the measured memory bandwidth (bandwidth.json from
benchmarks/bandwidth.py in the same --out folder, when present); decode.png plots ours
beside llama.cpp's.  The measurement itself is
specdec.frontends.bench.bench_decode, which `specdec bench` runs too.

    python benchmarks/decode.py [--models id ...] [--out bench-results]
"""
from __future__ import annotations

import argparse
from pathlib import Path

from specdec.frontends.bench import DECODE_MODELS, bench_decode, plot_decode

DEFAULT_MODELS = DECODE_MODELS


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=DEFAULT_MODELS)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", default="bench-results")
    ap.add_argument("--no-mmap", action="store_true", help="read the model files into memory (both engines)")
    ap.add_argument("--mmap", action="store_true", help="map the model files (both engines; default: "
                    "specdec's default load, in memory where the file fits)")
    a = ap.parse_args(argv)
    result = bench_decode(a.models, Path(a.out), repeats=a.repeats,
                          mmap=False if a.no_mmap else (True if a.mmap else None))
    plot_decode(result, Path(a.out) / "decode.png")
    rows = result["results"]
    print(f"{'model':38s} {'pp64':>8s} {'(llama)':>8s} {'tg64':>8s} {'(llama)':>8s} {'GB/s':>6s}")
    for r in rows:
        print(f"{r['model']:38s} {r['pp64_tok_s']:8.1f} {r['llamacpp_pp64_tok_s'] or 0:8.1f} "
              f"{r['tg64_tok_s']:8.1f} {r['llamacpp_tg64_tok_s'] or 0:8.1f} {r['tg_gb_s']:6.2f}")


if __name__ == "__main__":
    main()
