"""What verification costs, and where a decode step's time goes.

1. Verification cost curve: the median time of one target forward over M = 1, 2, 4, 6, 8, 12,
   17 new tokens (after 128 cached ones), relative to M = 1.  In the memory-bound regime the
   weights are read once for all M rows, so the curve stays flat; where it climbs, the kernels
   are compute bound and every drafted token costs verification time.
2. Profile of a decode step (M = 1): every kernel the forward pass calls is wrapped in a timer
   (matmuls, attention, norms + RoPE + activations, embedding lookup); "python glue" is the
   step time minus all kernel time, "thread dispatch" the cost of waking the worker threads
   (an empty prange kernel timed alone) times the number of parallel kernel calls per step.

3. With llama-cpp-python installed, llama.cpp's curve on the same file in the same run (all
   rows' logits computed, as verification needs): specdec.llamacpp.

Writes verify_curve.json and verify_curve.png into --out.

    python benchmarks/verify_curve.py [--models id ...] [--out bench-results]
"""
from __future__ import annotations

import argparse
import time
from collections import defaultdict
from pathlib import Path

import numpy as np
from numba import njit, prange

import specdec
import specdec.engine.model as model_mod
from specdec import llamacpp
from specdec.frontends.bench import llamacpp_forward_ms
from common import QWEN_DRAFT, QWEN_TARGET, forward_ms, machine_info, warm_up, write_json

MS = (1, 2, 4, 6, 8, 12, 17)
CATEGORY = {"matmul": "matmuls", "matmul_q8k": "matmuls", "attention": "attention",
            "rms_norm": "norms/rope/act", "rms_norm_heads": "norms/rope/act",
            "rope_apply": "norms/rope/act", "rope_cos_sin": "norms/rope/act", "swiglu": "norms/rope/act", "geglu": "norms/rope/act",
            "get_rows": "embedding", "store": "kv store"}


@njit(cache=True, nogil=True, parallel=True)
def _empty_prange(out):
    for i in prange(out.shape[0]):
        out[i] = i


def dispatch_us(repeats: int = 2000) -> float:
    """Microseconds one call of a trivial parallel kernel costs (thread wake-up and join)."""
    out = np.empty(64, np.float32)
    _empty_prange(out)
    t = time.perf_counter()
    for _ in range(repeats):
        _empty_prange(out)
    return (time.perf_counter() - t) / repeats * 1e6


def curve(model, repeats: int) -> dict:
    ms = {m: forward_ms(model, m, repeats=repeats) for m in MS}
    return {"forward_ms": {str(m): round(v, 3) for m, v in ms.items()},
            "relative": {str(m): round(v / ms[1], 3) for m, v in ms.items()}}


def profile_decode(model, n_steps: int = 48) -> dict:
    """Seconds per decode step by category, from timed wrappers around every kernel call."""
    spent: dict[str, float] = defaultdict(float)
    calls: dict[str, int] = defaultdict(int)

    def timed(name, fn):
        def wrapper(*a, **k):
            t = time.perf_counter()
            r = fn(*a, **k)
            spent[CATEGORY[name]] += time.perf_counter() - t
            calls[CATEGORY[name]] += 1
            return r
        return wrapper

    patched = []
    for obj, names in ((model_mod, ("attention", "rms_norm", "rms_norm_heads", "rope_apply", "rope_cos_sin", "swiglu", "geglu")),
                       (model_mod.kernels, ("matmul", "get_rows"))):
        for n in names:
            if hasattr(obj, n):
                patched.append((obj, n, getattr(obj, n)))
                setattr(obj, n, timed(n, getattr(obj, n)))
    kv = model_mod.KVCache
    patched.append((kv, "store", kv.store))
    kv.store = timed("store", kv.store)
    try:
        s = model.session(256)
        tok = int(np.argmax(s.eval(list(range(100, 132)), last_only=True)[-1]))
        spent.clear()
        calls.clear()
        t = time.perf_counter()
        for _ in range(n_steps):
            tok = int(np.argmax(s.eval([tok])[-1]))
        total = time.perf_counter() - t
    finally:
        for obj, n, fn in patched:
            setattr(obj, n, fn)
    per = {k: v / n_steps for k, v in spent.items()}
    parallel_calls = (calls["matmuls"] + calls["attention"]) / n_steps
    d_us = dispatch_us()
    step = total / n_steps
    kernel_s = sum(per.values())
    out = {"step_ms": round(step * 1e3, 3),
           "ms": {k: round(v * 1e3, 3) for k, v in sorted(per.items())},
           "python_glue_ms": round((step - kernel_s) * 1e3, 3),
           "kernel_calls_per_step": round(sum(calls.values()) / n_steps, 1),
           "thread_dispatch_us_per_call": round(d_us, 2),
           "thread_dispatch_ms": round(parallel_calls * d_us / 1e3, 3)}
    out["python_glue_pct"] = round(100 * out["python_glue_ms"] / out["step_ms"], 2)
    out["pct"] = {k: round(100 * v / step, 1) for k, v in per.items()}
    return out


def plot(result: dict, path: Path) -> None:
    """Left: time relative to M = 1; right: milliseconds (llama.cpp dashed where measured)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, (ax, ax_ms) = plt.subplots(1, 2, figsize=(11, 4.2))
    top = 4.0
    for i, r in enumerate(result["models"]):
        curves = [(r["curve"], "o-", r["model"])]
        if "llamacpp_curve" in r:
            curves.append((r["llamacpp_curve"], "x--", f"llama.cpp, {r['model']}"))
        for c, style, label in curves:
            ax.plot(MS, [c["relative"][str(m)] for m in MS], style, color=f"C{i}", lw=1.2, label=label)
            ax_ms.plot(MS, [c["forward_ms"][str(m)] for m in MS], style, color=f"C{i}", lw=1.2, label=label)
            top = max(top, 1.1 * max(c["relative"].values()))
    ax.plot(MS, [1.0] * len(MS), "k:", lw=1, label="weights read once (ideal)")
    ax.plot(MS, MS, color="0.8", lw=1, label="M separate passes")
    ax.set_ylim(0, top)
    ax.axhline(1.3, color="tab:red", lw=0.8, ls="--")
    ax.text(MS[-1], 1.33, "1.3x", color="tab:red", ha="right", fontsize=8)
    ax.set_xlabel("tokens per forward pass (M)")
    ax.set_ylabel("time relative to M = 1")
    ax_ms.set_xlabel("tokens per forward pass (M)")
    ax_ms.set_ylabel("ms per forward pass")
    ax.set_title(f"Verification cost curve ({result['machine']['cores']} cores)", fontsize=10)
    ax_ms.set_title("absolute", fontsize=10)
    ax.legend(fontsize=7)
    ax_ms.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=[QWEN_TARGET, QWEN_DRAFT])
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--out", default="bench-results")
    ap.add_argument("--no-mmap", action="store_true", help="read the model files into memory (both engines)")
    a = ap.parse_args(argv)
    out = Path(a.out)
    result = {"machine": machine_info(), "ms": list(MS), "mmap": None if not a.no_mmap else False, "models": []}
    for mid in a.models:
        m = specdec.load(mid, n_ctx=512, mmap=False if a.no_mmap else None)
        w = warm_up(m)
        forward_ms(m, max(MS), repeats=1)                  # compile every M path before timing
        r = {"model": mid, "warm_s": round(w, 2), "curve": curve(m, a.repeats),
             "profile": profile_decode(m)}
        lc = llamacpp_forward_ms(m.path, MS, repeats=a.repeats, mmap=not m.gguf.in_memory)
        source = "llama-bench of the native build (-p M -n 0 -d 128), last row's logits only"
        if lc is None:                                      # no native build: llama-cpp-python
            lc = llamacpp.forward_ms(m.path, MS, repeats=a.repeats, mmap=not m.gguf.in_memory)
            source = f"llama-cpp-python {llamacpp.version()}, logits for every row"
        if lc is not None:
            r["llamacpp_curve"] = {"source": source,
                                   "forward_ms": {str(k): round(v, 3) for k, v in lc.items()},
                                   "relative": {str(k): round(v / lc[1], 3) for k, v in lc.items()}}
        result["models"].append(r)
        rel = r["curve"]["relative"]
        print(f"{mid}: " + "  ".join(f"M={k}:{v:.2f}x" for k, v in rel.items()))
        print("  ms: " + "  ".join(f"M={k}:{v:.1f}" for k, v in r["curve"]["forward_ms"].items()))
        if lc is not None:
            print("  llama.cpp ms: " + "  ".join(f"M={k}:{v:.1f}" for k, v in lc.items()))
        p = r["profile"]
        print(f"  decode step {p['step_ms']:.2f} ms: " + ", ".join(f"{k} {v:.2f}" for k, v in p["ms"].items())
              + f", glue {p['python_glue_ms']:.2f} ({p['python_glue_pct']:.1f}%), "
              f"dispatch ~{p['thread_dispatch_ms']:.2f}")
    write_json(out / "verify_curve.json", result)
    plot(result, out / "verify_curve.png")
    print(f"wrote {out / 'verify_curve.json'} and {out / 'verify_curve.png'}")


if __name__ == "__main__":
    main()
