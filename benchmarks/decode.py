"""Prompt-processing and decode speed per model, beside llama.cpp's figures on this machine kind.

For each model: load (timed), compile/warm the kernels once (timed, reported apart), then
pp64 = one batched forward over 64 prompt tokens, tg64 = 64 greedy decode steps one token at
a time; each the best of --repeats runs.  Reports tokens/s, weight bytes read per decoded
token, achieved GB/s and its fraction of the measured memory bandwidth (bandwidth.json from
benchmarks/bandwidth.py in the same --out folder, when present).

    python benchmarks/decode.py [--models id ...] [--out bench-results]
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

import specdec
from common import LLAMACPP, machine_info, roofline, weight_bytes_per_token, write_json

DEFAULT_MODELS = ["smollm2-135m-instruct-q4_1", "qwen2.5-coder-0.5b-instruct",
                  "qwen2.5-coder-1.5b-instruct-q4_k_m", "gemma-3-270m-q4_k_m"]


def bench_model(model_id: str, n_pp: int = 64, n_tg: int = 64, repeats: int = 3) -> dict:
    t = time.perf_counter()
    m = specdec.load(model_id, n_ctx=n_pp + n_tg + 8)
    load_s = time.perf_counter() - t
    t = time.perf_counter()
    m.session(4).eval([1, 2])                              # JIT compile or load from cache
    m.session(4).eval([1])
    warm_s = time.perf_counter() - t
    rng = np.random.default_rng(0)
    prompt = rng.integers(100, min(m.config.n_vocab, 30000), n_pp).tolist()
    pp_best, tg_best = 0.0, 0.0
    for _ in range(repeats):
        s = m.session()
        t = time.perf_counter()
        logits = s.eval(prompt, last_only=True)[-1]
        pp_best = max(pp_best, n_pp / (time.perf_counter() - t))
        tok = int(np.argmax(logits))
        t = time.perf_counter()
        for _ in range(n_tg):
            tok = int(np.argmax(s.eval([tok])[-1]))
        tg_best = max(tg_best, n_tg / (time.perf_counter() - t))
    wb = weight_bytes_per_token(m)
    ref = LLAMACPP.get(model_id, {})
    return {"model": model_id, "load_s": round(load_s, 2), "compile_or_warm_s": round(warm_s, 2),
            "pp64_tok_s": round(pp_best, 2), "tg64_tok_s": round(tg_best, 2),
            "weight_bytes_per_token": wb, "tg_gb_s": round(wb * tg_best / 1e9, 2),
            "llamacpp_pp64_tok_s": ref.get("pp64"), "llamacpp_tg64_tok_s": ref.get("tg64"),
            "tg_vs_llamacpp": round(tg_best / ref["tg64"], 3) if ref else None,
            "pp_vs_llamacpp": round(pp_best / ref["pp64"], 3) if ref else None}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=DEFAULT_MODELS)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", default="bench-results")
    a = ap.parse_args()
    bw = roofline(Path(a.out))
    rows = []
    for mid in a.models:
        r = bench_model(mid, repeats=a.repeats)
        if bw:
            r["roofline_fraction"] = round(r["tg_gb_s"] / bw["all_threads_gbs"], 3)
        rows.append(r)
        print(json.dumps(r), flush=True)
    write_json(Path(a.out) / "decode.json", {"machine": machine_info(), "bandwidth": bw, "results": rows})
    print(f"{'model':38s} {'pp64':>8s} {'(llama)':>8s} {'tg64':>8s} {'(llama)':>8s} {'GB/s':>6s}")
    for r in rows:
        print(f"{r['model']:38s} {r['pp64_tok_s']:8.1f} {r['llamacpp_pp64_tok_s'] or 0:8.1f} "
              f"{r['tg64_tok_s']:8.1f} {r['llamacpp_tg64_tok_s'] or 0:8.1f} {r['tg_gb_s']:6.2f}")


if __name__ == "__main__":
    main()
