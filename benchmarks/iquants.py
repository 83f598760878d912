"""IQ4_NL, IQ4_XS and MXFP4 beside the formats we already run fast, and beside llama.cpp.

1. matmul: time per call of one ffn-shaped weight (--n x --k, Qwen2.5-1.5B's ffn_up by
   default) in each format, M = 1, 9, 64 rows, as the engine holds it (Q4_0 / Q4_K in their
   prepared layouts), best of --repeats after a warm-up (no compilation timed).
2. decode: a synthetic file of Qwen2.5-1.5B's shape (qwen2, 28 layers, 1536 wide, ffn 8960,
   151936 ids) with every matrix in IQ4_XS, written by specdec.testing.synth: specdec's tokens
   per second over --n-gen one-row steps after a short prompt, and llama.cpp's on the same file
   in the same run (llama-cpp-python's native build, the same threads).

    python benchmarks/iquants.py --out benchmarks/results/intel
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import gguf
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import machine_info, write_json  # noqa: E402

T = gguf.GGMLQuantizationType
FORMATS = (T.Q4_0, T.Q4_K, T.IQ4_NL, T.IQ4_XS, T.MXFP4)


def weights(qt, n: int, k: int, rng) -> np.ndarray:
    from specdec.testing.synth import _random_kquant, quantize_iq4
    if qt == T.Q4_K:
        return _random_kquant(rng, n, k, qt, 0.02)
    x = (rng.standard_normal((n, k)) * 0.02).astype(np.float32)
    return quantize_iq4(x, qt) if qt in (T.IQ4_NL, T.IQ4_XS) else gguf.quants.quantize(x, qt)


def bench_matmul(n: int, k: int, ms, repeats: int) -> dict:
    from specdec.kernels import registry
    rng = np.random.default_rng(0)
    out = {}
    for qt in FORMATS:
        w, tid = weights(qt, n, k, rng), int(qt)
        if registry.layout_for(tid, n) is not None:
            w, tid = registry.prepare(w, tid)
        kern = registry.KERNELS[tid]
        row = {}
        for m in ms:
            x = rng.standard_normal((m, k)).astype(np.float32)
            kern.matmul(w, x)                                          # compile / warm
            best = min(_time(lambda: kern.matmul(w, x)) for _ in range(repeats))
            row[str(m)] = round(best * 1e6, 1)
        out[qt.name] = row
        print(qt.name, row, "us", flush=True)
    return out


def _time(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def synthetic_15b(path: Path, vocab: int) -> Path:
    from specdec.testing.synth import TinySpec, write_tiny_model
    spec = TinySpec(arch="qwen2", d_model=1536, n_layer=28, n_head=12, n_head_kv=2, d_ff=8960,
                    n_vocab=vocab, qtype=int(T.IQ4_XS), n_ctx=512, seed=1, merges=("a a",))
    return write_tiny_model(path, spec)


def bench_decode(path: Path, n_gen: int, threads: int) -> dict:
    import specdec
    prompt = [(31 * i) % 1000 + 100 for i in range(16)]
    m = specdec.load(str(path), n_ctx=256)
    s = m.session(256)
    s.eval(prompt)
    s.eval([5])                                                        # compile / warm
    s.truncate(len(prompt))
    t = time.perf_counter()
    tok = 5
    for _ in range(n_gen):
        tok = int(np.argmax(s.eval([tok])[-1]))
    ours = n_gen / (time.perf_counter() - t)
    ref = _llamacpp_decode(path, prompt, n_gen, threads)
    return {"specdec_tok_s": round(ours, 2), "llamacpp_tok_s": ref,
            "ratio": round(ours / ref, 3) if ref else None}


def _llamacpp_decode(path: Path, prompt, n_gen: int, threads: int) -> float | None:
    try:
        from llama_cpp import Llama
    except ImportError:
        return None
    llm = Llama(str(path), n_ctx=256, n_threads=threads, n_threads_batch=threads, verbose=False)
    llm.eval(prompt)
    llm.eval([5])
    t = time.perf_counter()
    tok = 5
    for _ in range(n_gen):
        llm.eval([tok])
        tok = int(np.argmax(llm.scores[llm.n_tokens - 1]))
    return round(n_gen / (time.perf_counter() - t), 2)


def main(argv=None) -> None:
    import numba
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=8960)
    ap.add_argument("--k", type=int, default=1536)
    ap.add_argument("--m", type=int, nargs="+", default=[1, 9, 64])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--n-gen", type=int, default=32)
    ap.add_argument("--vocab", type=int, default=151936)
    ap.add_argument("--no-decode", action="store_true")
    ap.add_argument("--out", type=Path, default=Path("bench-results"))
    a = ap.parse_args(argv)
    res = {"machine": machine_info(), "shape": [a.n, a.k], "matmul_us": bench_matmul(a.n, a.k, a.m, a.repeats)}
    if not a.no_decode:
        with tempfile.TemporaryDirectory() as tmp:
            t = time.perf_counter()
            path = synthetic_15b(Path(tmp) / "qwen2-1.5b-shape-iq4_xs.gguf", a.vocab)
            print(f"wrote {path.stat().st_size / 1e9:.2f} GB in {time.perf_counter() - t:.0f} s", flush=True)
            res["decode_iq4_xs"] = bench_decode(path, a.n_gen, numba.get_num_threads())
            print(res["decode_iq4_xs"], flush=True)
    write_json(a.out / "iquants.json", res)


if __name__ == "__main__":
    main()
