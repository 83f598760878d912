"""Mixture of experts on the CPU: decode speed and the cost of a verification pass of M rows on
a file with a real MoE's layer shapes, against llama.cpp's native build on the same file in
the same run, with the distinct experts each M wakes and the cost those experts' bytes
predict at this host's bandwidth.

The file (written once into the cache by specdec.testing.synth, random weights): Qwen3-30B-A3B's
layer shapes (hidden 2048, 32 query / 4 key-value heads of 128, 128 experts of width 768, 8
per token) with fewer layers, Q4_K weights of zero-mean values (TinySpec.centered: random
K-quant codes otherwise share one direction in every row, and every token woke the same 8
experts), a 32000-token vocabulary; the router is F32 as in real files.  Random routers
spread the tokens over the experts about uniformly (a real model's routing is more skewed,
so it shares more experts between rows than this does).

    python benchmarks/moe.py [--layers 8] [--write-only] [--out benchmarks/results/intel]

Measured (all in one process, after the kernels compiled and every page of the mapping was
touched once, `prefault`): specdec's decode (one-row passes
after a 64-token prompt), its pass over M = 1..17 rows after 64 cached tokens, and the
distinct experts per layer each pass woke (ModelSession.last_experts); llama-bench's tg and
its -p M -d 64 passes; the streaming-read bandwidth (benchmarks/bandwidth.py).  Predicted
pass cost: (the dense weights read once + distinct experts x one expert's bytes, every
layer) / bandwidth.
"""
from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType as T

import specdec
from specdec.frontends.bench import llamacpp_bench, llamacpp_forward_ms
from specdec.testing.synth import TinySpec, write_tiny_model
from bandwidth import measure as measure_bandwidth
from common import machine_info, write_json

MS = tuple(range(1, 18))
DEPTH = 64
SHAPE = dict(arch="qwen3moe", d_model=2048, n_head=32, n_head_kv=4, d_head=128, n_expert=128,
             n_expert_used=8, d_ff_exp=768, d_ff=6144, n_vocab=32000, n_ctx=4096, seed=30, centered=True)


def spec(layers: int, qtype: int) -> TinySpec:
    letters = tuple(chr(c) for c in range(ord("a"), ord("z") + 1)) + ("aa",)
    tokens = letters + tuple(f"<{i}>" for i in range(SHAPE["n_vocab"] - len(letters)))
    return TinySpec(**SHAPE, n_layer=layers, qtype=qtype, tokens=tokens, merges=("a a",))   # llama.cpp wants a merge


def bench_file(layers: int, qtype: int) -> Path:
    cache = Path(os.environ.get("SPECDEC_CACHE") or Path.home() / ".cache" / "specdec")
    path = cache / f"bench-qwen3moe-{layers}l-{T(qtype).name.lower()}-centered.gguf"
    if not path.exists():
        t = time.perf_counter()
        write_tiny_model(path.with_suffix(".partial"), spec(layers, qtype)).rename(path)
        print(f"wrote {path} ({path.stat().st_size / 1e9:.2f} GB) in {time.perf_counter() - t:.0f} s", flush=True)
    return path


def byte_budget(model) -> dict:
    """Bytes a pass reads: the dense part (every tensor but the experts and the embedding
    table) once, and one expert's three matrices per distinct expert per layer."""
    gf = model.gguf
    experts = [n for n in gf.tensors if "_exps." in n]
    dense = sum(t.n_bytes for n, t in gf.tensors.items() if n not in experts and n != "token_embd.weight")
    per_expert = model.weights.layers[0].moe.expert_bytes
    return {"dense_bytes": dense, "expert_bytes": per_expert, "file_bytes": sum(t.n_bytes for t in gf.tensors.values())}


def prefault(model) -> float:
    """Touch one byte of every 4 KB page of the mapped file, so that the timed passes do not
    pay the first touch of an expert (a minor page fault per page: an expert woken for the
    first time in this process costs ~650 of them).  Returns seconds."""
    t = time.perf_counter()
    image = model.gguf.image.reshape(-1)                                      # (n_bytes,) uint8
    for i in range(0, image.size, 1 << 28):
        int(np.bitwise_or.reduce(image[i:i + (1 << 28):4096]))
    return time.perf_counter() - t


def decode_tok_s(model, n_tg: int, rng) -> float:
    """One-row passes over random tokens, as llama-bench's tg feeds them (a random model's
    greedy output repeats one token, and so wakes the same 8 experts every step)."""
    s = model.session(DEPTH + n_tg + 8)
    s.eval([(17 * i) % 30000 + 100 for i in range(DEPTH)], last_only=True)
    toks = rng.integers(100, 30000, n_tg).tolist()
    t = time.perf_counter()
    for tok in toks:
        s.eval([tok])
    return n_tg / (time.perf_counter() - t)


def curve(model, repeats: int, rng) -> dict:
    """ms of a pass over M rows after DEPTH cached ones (median), distinct experts per layer."""
    s = model.session(DEPTH + max(MS) + 1)
    s.eval([(17 * i) % 30000 + 100 for i in range(DEPTH)], last_only=True)
    ms, woken = {}, {}
    for m in MS:
        times, seen = [], []
        for _ in range(repeats):
            toks = rng.integers(100, 30000, m).tolist()
            t = time.perf_counter()
            s.eval(toks)
            times.append(time.perf_counter() - t)
            seen.append(float(np.mean(s.last_experts)))
            s.truncate(DEPTH)
        ms[m], woken[m] = float(np.median(times) * 1e3), float(np.mean(seen))
    return {"forward_ms": ms, "experts_per_layer": woken}


def plot(r: dict, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(10, 4))
    ms = [int(m) for m in r["specdec"]["forward_ms"]]
    ax.plot(ms, list(r["specdec"]["forward_ms"].values()), "o-", label="specdec")
    if r.get("llamacpp_forward_ms"):
        lc = r["llamacpp_forward_ms"]
        ax.plot([int(m) for m in lc], list(lc.values()), "x--", label="llama.cpp (native, last row's logits)")
    ax.plot(ms, list(r["predicted_ms"].values()), ":", color="0.4", label="bytes of distinct experts / bandwidth")
    ax.set_xlabel("rows per pass (M)")
    ax.set_ylabel("ms per pass")
    ax.set_title(f"{r['layers']}-layer Qwen3-30B-A3B shapes, {r['qtype']} ({r['machine']['cores']} cores)", fontsize=9)
    ax.legend(fontsize=7)
    ax2.plot(ms, list(r["specdec"]["experts_per_layer"].values()), "o-", label="measured")
    ax2.plot(ms, [r["uniform_prior"][str(m)] for m in ms], ":", label="uniform routing E(1-(1-k/E)^M)")
    ax2.set_xlabel("rows per pass (M)")
    ax2.set_ylabel("distinct experts woken per layer")
    ax2.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--qtype", default="Q4_K", choices=("Q4_K", "Q8_0"))
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--n-tg", type=int, default=32)
    ap.add_argument("--write-only", action="store_true", help="write the file into the cache and stop")
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results/intel"))
    a = ap.parse_args()
    qtype = int(T[a.qtype])
    path = bench_file(a.layers, qtype)
    if a.write_only:
        return
    m = specdec.load(path, n_ctx=DEPTH + 64, mmap=True)
    t = time.perf_counter()
    s = m.session(32)
    s.eval(list(range(100, 117)))
    s.eval([5])
    warm = time.perf_counter() - t
    rng = np.random.default_rng(0)
    bw = measure_bandwidth(gb=1.0, repeats=3)
    fault_s = prefault(m)
    ours = curve(m, a.repeats, rng)
    tg = decode_tok_s(m, a.n_tg, rng)
    lc_tg = llamacpp_bench(str(path), DEPTH, a.n_tg, a.repeats)
    lc_ms = llamacpp_forward_ms(str(path), MS, depth=DEPTH, repeats=a.repeats)
    cfg, budget = m.config, byte_budget(m)
    E, k = cfg.n_expert, cfg.n_expert_used
    gbs = bw["all_threads_gbs"]
    pred = {str(M): round((budget["dense_bytes"] + n * budget["expert_bytes"] * cfg.n_layer) / (gbs * 1e6), 3)
            for M, n in ours["experts_per_layer"].items()}
    r = {"machine": machine_info(), "file": str(path), "layers": a.layers, "qtype": a.qtype,
         "shape": {k_: v for k_, v in SHAPE.items() if k_ not in ("seed", "n_ctx")}, "warm_s": round(warm, 1),
         "prefault_s": round(fault_s, 2),
         "bandwidth": bw, **budget,
         "specdec": {"decode_tok_s": round(tg, 2),
                     "forward_ms": {str(M): round(v, 3) for M, v in ours["forward_ms"].items()},
                     "experts_per_layer": {str(M): round(v, 2) for M, v in ours["experts_per_layer"].items()}},
         "llamacpp": lc_tg and {kk: v for kk, v in lc_tg.items() if kk != "command"},
         "llamacpp_forward_ms": lc_ms and {str(M): round(v, 3) for M, v in lc_ms.items()},
         "predicted_ms": pred,
         "uniform_prior": {str(M): round(E * (1 - (1 - k / E) ** M), 2) for M in MS}}
    if lc_tg:
        r["decode_vs_llamacpp"] = round(tg / lc_tg["tg_tok_s"], 3)
    r["pass9_vs_predicted"] = round(ours["forward_ms"][9] / pred["9"], 3)
    # the adaptive policy's line for an MoE target: v = a + b x, x = (D(M) - k) / k
    x = np.array([(ours["experts_per_layer"][M] - k) / k for M in MS])
    v = np.array([ours["forward_ms"][M] for M in MS])
    b, a0 = np.polyfit(x, v, 1)
    r["expert_line"] = {"a_ms": round(float(a0), 3), "b_ms_per_k_new_experts": round(float(b), 3),
                        "expert_growth": round(float(b / a0), 3)}
    a.out.mkdir(parents=True, exist_ok=True)
    write_json(a.out / "moe.json", r)
    plot(r, a.out / "moe.png")
    print({kk: r[kk] for kk in ("specdec", "llamacpp", "llamacpp_forward_ms", "predicted_ms")}, flush=True)


if __name__ == "__main__":
    main()
