"""What verification costs, and where a decode step's time goes.

1. Verification cost curve: the median time of one target forward over M = 1, 2, 4, 6, 8, 12,
   17 new tokens (after 128 cached ones), relative to M = 1.  In the memory-bound regime the
   weights are read once for all M rows, so the curve stays flat; where it climbs, the kernels
   are compute bound and every drafted token costs verification time.
2. Profile of a decode step (M = 1): every kernel the forward pass calls is wrapped in a timer
   (matmuls, attention, norms + RoPE + activations, embedding lookup); "python glue" is the
   step time minus all kernel time, "thread dispatch" the cost of waking the worker threads
   (an empty prange kernel timed alone) times the number of parallel kernel calls per step.
   The same timers over one prompt pass of each --pp length: the share of prompt processing
   that attention takes beside the matmuls.

3. llama.cpp's curve on the same file in the same run: llama-bench of the native build
   (benchmarks/build_llamacpp.sh), else llama-cpp-python (all rows' logits).
4. Prompt processing: tokens per second of a fresh prompt of P = 512 and 2048 tokens
   (--pp), beside llama-bench's pp512 / pp2048 of the native build.
5. The fraction of the instruction path's peak each M reaches: multiply-adds of the pass
   (M × the weight matrices' values) per second over cores × clock × the path's int8
   multiply-adds per cycle and core (PEAK_MAC_PER_CYCLE; the clock is /proc/cpuinfo's).
6. Every kernel path the host has (--paths; default: the host's and, on an AMX host, vnni
   too): each path runs in a process of its own (SPECDEC_KERNELS) and the JSON holds a
   section per path, so a plot shows the curve with and without AMX from one run.
7. --baseline TREE: another checkout (e.g. the previous release) measured in the same run,
   in processes alternated with this tree's --rounds times; the fastest of each is kept
   ("best", "baseline" per model), so a kernel change is judged against the code it replaces
   on the same host in the same minutes.

Writes verify_curve.json and verify_curve.png into --out.

    python benchmarks/verify_curve.py [--models id ...] [--pp 512 2048] [--out bench-results]
                                      [--baseline ../specdec-main --rounds 3]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections import defaultdict
from contextlib import contextmanager
from pathlib import Path

import numpy as np
from numba import njit, prange

import specdec
import specdec.engine.transformer as model_mod
from specdec.kernels import cpu, registry
from specdec.models import llamacpp
from specdec.frontends.bench import llamacpp_forward_ms
from common import QWEN_DRAFT, QWEN_TARGET, forward_ms, machine_info, prompt_ids, warm_up, write_json

MS = (1, 2, 4, 6, 8, 9, 12, 16, 17, 32, 64)
# int8 multiply-adds per cycle and core: 512-bit vpdpbusd (64) once a cycle; AVX2's
# vpmaddubsw + vpmaddwd pair (32 per pair) on two ports; AMX tdpbssd, 16 x 16 x 64 in 16 cycles
PEAK_MAC_PER_CYCLE = {"amx": 1024, "vnni": 64, "avx2": 32, "portable": 8}
CATEGORY = {"matmul": "matmuls", "matmul_q8k": "matmuls", "attention": "attention",
            "rms_norm": "norms/rope/act", "rms_norm_heads": "norms/rope/act",
            "rope_apply": "norms/rope/act", "rope_cos_sin": "norms/rope/act", "swiglu": "norms/rope/act",
            "geglu": "norms/rope/act",
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


def matmul_values(model) -> int:
    """Weight values one row of a forward pass multiplies (every 2-D weight but the
    embedding table, which the output head reuses when the file ties them)."""
    total, tied = 0, "output.weight" not in model.gguf.tensors
    for name, info in model.gguf.tensors.items():
        if len(info.dims) == 2 and (not name.startswith("token_embd") or tied):
            total += info.dims[0] * info.dims[1]
    return total


def peak_fraction(model, curve_ms: dict, path: str) -> dict:
    """M -> the fraction of the path's int8 peak the pass of M rows reached."""
    import numba
    peak = numba.get_num_threads() * cpu.host().mhz * 1e6 * PEAK_MAC_PER_CYCLE.get(path, 8)
    macs = matmul_values(model)
    return {m: round(int(m) * macs / (v / 1e3) / peak, 4) if peak else None for m, v in curve_ms.items()}


def pp_tok_s(model, n: int, repeats: int) -> float:
    """Tokens per second of a fresh prompt of n tokens (the prompt pass, last row's logits)."""
    s = model.session(n + 1)
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        s.eval(prompt_ids(n), last_only=True)
        times.append(time.perf_counter() - t)
        s.truncate(0)
    return n / float(np.median(times))


@contextmanager
def _timed_kernels():
    """Wrap every kernel call of the engine in a timer for the duration: yields the dicts
    (seconds, calls) by category, which the caller clears before what it measures."""
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
    for obj, names in ((model_mod, ("attention", "rms_norm", "rms_norm_heads", "rope_apply", "rope_cos_sin",
                                    "swiglu", "geglu", "get_rows")),
                       (registry.Kernel, ("matmul",))):        # every Linear's matmul
        for n in names:
            if hasattr(obj, n):
                patched.append((obj, n, getattr(obj, n)))
                setattr(obj, n, timed(n, getattr(obj, n)))
    kv = model_mod.KVCache
    patched.append((kv, "store", kv.store))
    kv.store = timed("store", kv.store)
    try:
        yield spent, calls
    finally:
        for obj, n, fn in patched:
            setattr(obj, n, fn)


def profile_prompt(model, n: int) -> dict:
    """Seconds of one n-token prompt pass (after an untimed one) by category: how much of
    prompt processing is attention, how much the matmuls."""
    s = model.session(n + 8)
    ids = prompt_ids(n)
    s.eval(ids, last_only=True)
    s.truncate(0)
    with _timed_kernels() as (spent, _):
        t = time.perf_counter()
        s.eval(ids, last_only=True)
        total = time.perf_counter() - t
    return {"n": n, "pass_ms": round(total * 1e3, 1), "ms": {k: round(v * 1e3, 1) for k, v in sorted(spent.items())},
            "pct": {k: round(100 * v / total, 1) for k, v in sorted(spent.items())}}


def profile_decode(model, n_steps: int = 48) -> dict:
    """Seconds per decode step by category, from timed wrappers around every kernel call."""
    with _timed_kernels() as (spent, calls):
        s = model.session(256)
        tok = int(np.argmax(s.eval(list(range(100, 132)), last_only=True)[-1]))
        spent.clear()
        calls.clear()
        t = time.perf_counter()
        for _ in range(n_steps):
            tok = int(np.argmax(s.eval([tok])[-1]))
        total = time.perf_counter() - t
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
        curves = [(sec["curve"], "o-" if p == r["path"] else "s:", f"{r['model']} [{p}]")
                  for p, sec in r.get("paths", {r.get("path", ""): r}).items()]
        if "llamacpp_curve" in r:
            curves.append((r["llamacpp_curve"], "x--", f"llama.cpp, {r['model']}"))
        for c, style, label in curves:
            ms = [m for m in MS if str(m) in c["relative"]]
            ax.plot(ms, [c["relative"][str(m)] for m in ms], style, color=f"C{i}", lw=1.2, label=label)
            ax_ms.plot(ms, [c["forward_ms"][str(m)] for m in ms], style, color=f"C{i}", lw=1.2, label=label)
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


def measure(mid: str, a) -> dict:
    """Everything of one model on the kernel path of this process."""
    from specdec.kernels import cpu
    m = specdec.load(mid, n_ctx=max([512] + a.pp) + 8, mmap=False if a.no_mmap else None)
    w = warm_up(m)
    forward_ms(m, max(MS), repeats=1)                  # compile every M path before timing
    for n in a.pp:
        pp_tok_s(m, n, 1)
    c = curve(m, a.repeats)
    r = {"model": mid, "file": m.path, "path": cpu.path(), "warm_s": round(w, 2), "curve": c,
         "peak_fraction": peak_fraction(m, c["forward_ms"], cpu.path()),
         "pp_tok_s": {str(n): round(pp_tok_s(m, n, max(1, a.repeats // 3)), 2) for n in a.pp}}
    if not a.no_profile:
        r["profile"] = profile_decode(m)
        r["profile_pp"] = [profile_prompt(m, n) for n in a.pp]
    return r


def llamacpp_section(path: str, a) -> dict | None:
    """llama.cpp's curve and pp on the same file (native build, else llama-cpp-python)."""
    lc = llamacpp_forward_ms(path, MS, repeats=a.repeats, mmap=not a.no_mmap)
    source = "llama-bench of the native build (-p M -n 0 -d 128), last row's logits only"
    if lc is None:
        lc = llamacpp.forward_ms(path, MS, repeats=a.repeats, mmap=not a.no_mmap)
        source = f"llama-cpp-python {llamacpp.version()}, logits for every row"
    if lc is None:
        return None
    out = {"source": source, "forward_ms": {str(k): round(v, 3) for k, v in lc.items()},
           "relative": {str(k): round(v / lc[1], 3) for k, v in lc.items()}}
    pp = llamacpp_forward_ms(path, a.pp, depth=0, repeats=max(1, a.repeats // 3), mmap=not a.no_mmap)
    if pp:
        out["pp_tok_s"] = {str(n): round(n / (v / 1e3), 2) for n, v in pp.items()}
    return out


# Runs a tree's script with that tree's specdec and kernels (specdec.kernels is the folder
# kernels/, which the installed package maps to this checkout's): argv tree, script, args.
_TREE_BOOT = """
import importlib.util, runpy, sys
from importlib.machinery import PathFinder
tree, script = sys.argv[1], sys.argv[2]
MAP = {"specdec": tree + "/specdec", "specdec.kernels": tree + "/kernels"}
class TreeFinder:
    @staticmethod
    def find_spec(name, path=None, target=None):
        if name in MAP:
            return importlib.util.spec_from_file_location(name, MAP[name] + "/__init__.py",
                                                          submodule_search_locations=[MAP[name]])
        parent = name.rpartition(".")[0]
        return PathFinder.find_spec(name, [MAP[parent]]) if parent in MAP else None
sys.meta_path.insert(0, TreeFinder)
sys.path[:0] = [tree, tree + "/benchmarks"]
sys.argv = [script] + sys.argv[3:]
runpy.run_path(script, run_name="__main__")
"""


def baseline_tree(rev: str) -> Path:
    """--baseline: a checkout's folder, or a commit of this repository checked out (once) in
    a worktree beside the results (bench-results/baseline-<rev>)."""
    if Path(rev).is_dir():
        return Path(rev).resolve()
    root = Path(__file__).resolve().parents[1]
    dest = root / "bench-results" / f"baseline-{rev}"
    if not dest.is_dir():
        subprocess.run(["git", "-C", str(root), "worktree", "add", "--detach", str(dest), rev], check=True,
                       capture_output=True)
    return dest


def _child(path: str | None, a, tree: Path | None = None) -> list[dict]:
    """measure() of every model in a process of its own on kernel path `path` (None: the
    default, SPECDEC_KERNELS unset); tree: another checkout's script and python (its .venv
    when it has one), for a same-run baseline."""
    script, python, boot = Path(__file__), sys.executable, []
    if tree is not None:
        script = tree / "benchmarks" / "verify_curve.py"
        venv = tree / ".venv" / "bin" / "python"
        python = str(venv) if venv.exists() else sys.executable
        if not venv.exists():                      # this interpreter, importing the tree's own specdec
            boot = ["-c", _TREE_BOOT, str(tree)]
    cmd = [python, *boot, str(script), "--single", "--models", *a.models, "--repeats", str(a.repeats),
           "--pp", *map(str, a.pp)] + (["--no-mmap"] if a.no_mmap else []) + \
          (["--no-profile"] if a.no_profile or tree is not None else [])
    env = {k: v for k, v in os.environ.items() if k != "SPECDEC_KERNELS"}
    if path is not None:
        env["SPECDEC_KERNELS"] = path
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True,
                          cwd=script.parent.parent)
    return json.loads(done.stdout.strip().splitlines()[-1])


def _best(runs: list[dict]) -> dict:
    """One model's runs -> the fastest forward per M and pp over them (the host is shared)."""
    fwd = {k: min(r["curve"]["forward_ms"][k] for r in runs) for k in runs[0]["curve"]["forward_ms"]}
    pp = {k: max(r["pp_tok_s"][k] for r in runs) for k in runs[0]["pp_tok_s"]}
    return {"curve": {"forward_ms": fwd, "relative": {k: round(v / fwd["1"], 3) for k, v in fwd.items()}},
            "pp_tok_s": pp, "runs": len(runs)}


def baseline_runs(a, path: str | None, first: list[dict]) -> tuple[list[dict], list[dict]]:
    """This tree's and a.baseline's measures on `path` (None: each tree's default path),
    alternated a.rounds times in fresh processes (this tree's first round is `first`) -> per
    model, the best of each."""
    tree = baseline_tree(a.baseline)
    ours, theirs = [first], []
    for i in range(a.rounds):
        theirs.append(_child(path, a, tree))
        if i + 1 < a.rounds:
            ours.append(_child(path, a))
    commit = subprocess.run(["git", "-C", str(tree), "rev-parse", "--short", "HEAD"],
                            capture_output=True, text=True).stdout.strip()
    best = [_best([r[i] for r in ours]) for i in range(len(a.models))]
    base = [dict(_best([r[i] for r in theirs]), tree=str(tree), commit=commit) for i in range(len(a.models))]
    return best, base


def main(argv=None) -> None:
    from specdec.kernels import amx, cpu
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=[QWEN_TARGET, QWEN_DRAFT])
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--pp", nargs="*", type=int, default=[512, 2048], help="prompt lengths to time")
    ap.add_argument("--paths", nargs="*", default=None,
                    help="kernel paths (SPECDEC_KERNELS) besides the host's default")
    ap.add_argument("--out", default="bench-results")
    ap.add_argument("--no-mmap", action="store_true", help="read the model files into memory (both engines)")
    ap.add_argument("--no-profile", action="store_true", help="skip the decode-step and prompt-pass profiles")
    ap.add_argument("--baseline", default=None, metavar="TREE",
                    help="another checkout of specdec (a folder, or a commit: checked out in a worktree) "
                         "measured in the same run, alternated with this one")
    ap.add_argument("--rounds", type=int, default=3, help="--baseline: alternations (the fastest is kept)")
    ap.add_argument("--kernels", default=None, metavar="PATH",
                    help="measure this kernel path (SPECDEC_KERNELS, e.g. avx2) in place of the host's default, "
                         "the --baseline too")
    ap.add_argument("--single", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.single:                                          # a child: one path, JSON on stdout
        print(json.dumps([measure(mid, a) for mid in a.models]))
        return
    out = Path(a.out)
    paths = a.paths if a.paths is not None else (["vnni"] if amx.available() else [])
    main_path = a.kernels or cpu.path()
    result = {"machine": machine_info(), "ms": list(MS), "pp": a.pp, "default_path": cpu.path(),
              "measured_path": main_path, "mmap": None if not a.no_mmap else False, "models": []}
    runs = {main_path: _child(a.kernels, a) if a.kernels else [measure(mid, a) for mid in a.models]}
    for p in (p for p in paths if p != main_path):
        runs[p] = _child(p, a)
    best = base = None
    if a.baseline:
        best, base = baseline_runs(a, a.kernels, runs[main_path])
    for i in range(len(a.models)):
        r = dict(runs[main_path][i])
        r["paths"] = {p: {k: runs[p][i][k] for k in ("curve", "peak_fraction", "pp_tok_s")} for p in runs}
        if base is not None:
            r["best"], r["baseline"] = best[i], base[i]
        lc = llamacpp_section(r["file"], a)
        if lc is not None:
            r["llamacpp_curve"] = lc
        result["models"].append(r)
        _print(r)
    write_json(out / "verify_curve.json", result)
    plot(result, out / "verify_curve.png")
    print(f"wrote {out / 'verify_curve.json'} and {out / 'verify_curve.png'}")


def _print(r: dict) -> None:
    for p, sec in r["paths"].items():
        print(f"{r['model']} [{p}]: " + "  ".join(f"M={k}:{v:.2f}x" for k, v in sec["curve"]["relative"].items()))
        print("  ms: " + "  ".join(f"M={k}:{v:.1f}" for k, v in sec["curve"]["forward_ms"].items()))
        print("  peak: " + "  ".join(f"M={k}:{v:.1%}" for k, v in sec["peak_fraction"].items() if v is not None))
        print("  pp tok/s: " + "  ".join(f"{k}:{v:.1f}" for k, v in sec["pp_tok_s"].items()))
    for name in ("best", "baseline"):
        if name in r:
            sec = r[name]
            print(f"  {name} of {sec['runs']} ({sec.get('commit', 'this tree')}) ms: "
                  + "  ".join(f"M={k}:{v:.1f}" for k, v in sec["curve"]["forward_ms"].items())
                  + "  pp: " + "  ".join(f"{k}:{v:.1f}" for k, v in sec["pp_tok_s"].items()))
    lc = r.get("llamacpp_curve")
    if lc is not None:
        print("  llama.cpp ms: " + "  ".join(f"M={k}:{v:.1f}" for k, v in lc["forward_ms"].items()))
        if "pp_tok_s" in lc:
            print("  llama.cpp pp tok/s: " + "  ".join(f"{k}:{v:.1f}" for k, v in lc["pp_tok_s"].items()))
    p = r.get("profile")
    if p:
        print(f"  decode step {p['step_ms']:.2f} ms: " + ", ".join(f"{k} {v:.2f}" for k, v in p["ms"].items())
              + f", glue {p['python_glue_ms']:.2f} ({p['python_glue_pct']:.1f}%)")
    for pp in r.get("profile_pp", []):
        print(f"  pp{pp['n']} pass {pp['pass_ms']:.0f} ms: " + ", ".join(f"{k} {v:.1f}%" for k, v in pp["pct"].items()))


if __name__ == "__main__":
    main()
