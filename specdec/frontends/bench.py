"""Benchmarks behind `specdec bench` (and benchmarks/decode.py): decode speed per model, and
speculative against plain generation per target/draft pair; JSON plus PNG plots.

decode       for each model: load (timed), compile/warm the kernels once (timed apart), then
             pp64 = one batched forward over 64 prompt tokens, tg64 = 64 greedy decode steps
             one token at a time; each the best of `repeats` runs.  Tokens/s, weight bytes
             read per decoded token and the GB/s that makes, beside llama.cpp's figures.
speedup      for each pair and each prompt (in the target's chat template): plain greedy
             generation, then speculative greedy generation for each draft length (fixed
             policy); tokens/s (best of `repeats`), acceptance, tokens per step, predicted
             acceptance 1 - TV(p, q), speedup, and whether the tokens were identical (they
             must be).  A quick check; benchmarks/speculative.py and drafters.py (source
             checkout, `--scripts`) sweep draft-p, temperatures and drafters at length.

Files: decode.json / decode.png, speedup.json / speedup.png.

Numbers are end-to-end wall-clock on whatever else the machine is doing; machine_info()
goes into every JSON file so that a result says where it came from.
"""
from __future__ import annotations

import datetime
import json
import os
import platform
import time
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from ..models import llamacpp

# llama.cpp on this machine kind (2 cores, AVX-512), llama-bench -t 2 -p 64 -n 64, tokens/s
LLAMACPP = {
    "qwen2.5-coder-1.5b-instruct-q4_k_m": {"pp64": 110.0, "tg64": 15.4},
    "qwen2.5-coder-0.5b-instruct": {"pp64": 237.0, "tg64": 27.7},
    "smollm2-135m-instruct-q4_1": {"pp64": 377.0, "tg64": 112.0},
    "gemma-3-270m-q4_k_m": {"pp64": 653.0, "tg64": 49.9},
}
# "id:q8" / "id:float": the model with that activations= choice (gemma3 defaults to float)
DECODE_MODELS = ["smollm2-135m-instruct-q4_1", "qwen2.5-coder-0.5b-instruct",
                 "qwen2.5-coder-1.5b-instruct-q4_k_m", "gemma-3-270m-q4_k_m", "gemma-3-270m-q4_k_m:q8"]
PROMPTS = (
    "Write a Python function that returns the n-th Fibonacci number, with a docstring.",
    "Explain in three sentences what a hash table is and why lookups are fast.",
    "Rename the variable `x` to `count` in this code and return the whole code:\n"
    "def f(items):\n    x = 0\n    for item in items:\n        if item:\n            x += 1\n"
    "    return x\n",
)
Log = Callable[[str], None]


# ---- facts and files -------------------------------------------------------------------------

LLAMACPP_VERSION = "0.3.36"      # the llama-cpp-python sdist benchmarks/build_llamacpp.sh builds


def llamacpp_dir(version: str = LLAMACPP_VERSION) -> Path:
    """Where benchmarks/build_llamacpp.sh puts its native build (bin/, build.json)."""
    cache = os.environ.get("SPECDEC_CACHE") or os.environ.get("SPECDEC_HOME") or Path.home() / ".cache" / "specdec"
    return Path(cache) / f"llama.cpp-{version}"


def llamacpp_build(folder: Path | None = None) -> dict | None:
    """The native llama.cpp build's build.json (version, commit, cmake options; its CPU flags
    dropped: the machine section has them), or None when it was not built here."""
    try:
        build = json.loads(((folder or llamacpp_dir()) / "build.json").read_text())
    except (OSError, ValueError):
        return None
    build.pop("cpu_flags", None)
    return build


def llamacpp_bench(path: str, n_pp: int, n_tg: int, repeats: int, mmap: bool = True,
                   threads: int | None = None, folder: Path | None = None) -> dict | None:
    """llama-bench of the native build (benchmarks/build_llamacpp.sh) on one file:
    {'pp_tok_s', 'tg_tok_s'} (means over `repeats`), or None when it is not built here or fails.
    Same threads as the Numba kernels unless told; mmap False -> its --load-mode none."""
    import subprocess
    import numba
    exe = (folder or llamacpp_dir()) / "bin" / "llama-bench"
    if not exe.exists():
        return None
    cmd = [str(exe), "-m", path, "-t", str(threads or numba.get_num_threads()), "-p", str(n_pp),
           "-n", str(n_tg), "-r", str(max(repeats, 1)), "-o", "json"] + ([] if mmap else ["-lm", "none"])
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
        rows = json.loads(r.stdout)
    except (OSError, ValueError, subprocess.TimeoutExpired):
        return None
    pp = [x["avg_ts"] for x in rows if x.get("n_prompt") == n_pp and not x.get("n_gen")]
    tg = [x["avg_ts"] for x in rows if x.get("n_gen") == n_tg and not x.get("n_prompt")]
    if not pp or not tg:
        return None
    return {"pp_tok_s": round(pp[0], 2), "tg_tok_s": round(tg[0], 2), "command": cmd}


def llamacpp_forward_ms(path: str, ms: Sequence[int], depth: int = 128, repeats: int = 3,
                        mmap: bool = True, threads: int | None = None,
                        folder: Path | None = None) -> dict[int, float] | None:
    """Milliseconds of one forward pass over M tokens after `depth` cached ones, for each M,
    from llama-bench of the native build (`-p M -n 0 -d depth`; its prompt pass computes the
    last row's logits only, so for M > 1 this is a lower bound on what verification, which
    needs every row's, costs llama.cpp).  None when it is not built here or fails."""
    import subprocess
    import numba
    exe = (folder or llamacpp_dir()) / "bin" / "llama-bench"
    if not exe.exists():
        return None
    cmd = [str(exe), "-m", path, "-t", str(threads or numba.get_num_threads()),
           "-p", ",".join(str(m) for m in ms), "-n", "0", "-d", str(depth), "-r", str(max(repeats, 1)),
           "-o", "json"] + ([] if mmap else ["-lm", "none"])
    try:
        rows = json.loads(subprocess.run(cmd, capture_output=True, text=True, timeout=3600).stdout)
    except (OSError, ValueError, subprocess.TimeoutExpired):
        return None
    got = {int(x["n_prompt"]): 1e3 * int(x["n_prompt"]) / x["avg_ts"] for x in rows
           if x.get("n_prompt") and not x.get("n_gen") and x.get("avg_ts")}
    return got if set(got) >= set(ms) else None


def machine_info() -> dict:
    """Where a benchmark ran: the CPU (model, vendor, family, flags, the kernel paths chosen
    for it: specdec.kernels.cpu), cores and threads, memory bandwidth when
    benchmarks/bandwidth.py measured it, the native llama.cpp build when there is one, versions
    and the date.  Every benchmark JSON carries it."""
    import numba
    from ..kernels import cpu
    from ..engine.thread_count import describe as threads_mode
    info = {**cpu.describe(), "cores": os.cpu_count(), "numba_threads": numba.get_num_threads(),
            "threads_mode": threads_mode()["threads_mode"],
            "python": platform.python_version(), "numba": numba.__version__,
            "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")}
    for p in (Path("bench-results") / "bandwidth.json",
              Path(__file__).resolve().parents[2] / "benchmarks" / "results" / "bandwidth.json"):
        try:
            bw = json.loads(p.read_text())
            info["bandwidth_gbs"] = {k: bw[k] for k in ("single_thread_gbs", "all_threads_gbs") if k in bw}
            break
        except (OSError, ValueError, KeyError):
            pass
    info["llama_cpp_build"] = llamacpp_build()
    return info


def write_json(path: Path, obj) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".json.partial")
    tmp.write_text(json.dumps(obj, indent=1))
    os.replace(tmp, path)


def weight_bytes_per_token(model) -> int:
    """Bytes of weights a decode step reads: every tensor but the embedding table, which is
    read one row per token — unless the output head is tied to it (then it is read whole);
    of an MoE model's expert tensors, the k of E experts a token wakes."""
    gf = model.gguf
    cfg = model.config
    share = cfg.n_expert_used / cfg.n_expert if cfg.n_expert else 1.0
    total = sum(int(t.n_bytes * share) if "_exps." in n else t.n_bytes for n, t in gf.tensors.items())
    tied = "output.weight" not in gf.tensors
    return total if tied else total - gf.tensors["token_embd.weight"].n_bytes


def roofline(out_dir: Path) -> dict | None:
    p = Path(out_dir) / "bandwidth.json"
    return json.loads(p.read_text()) if p.exists() else None


def _warm(model) -> float:
    t = time.perf_counter()
    model.session(4).eval([1, 2])                          # JIT compile or load from cache
    model.session(4).eval([1])
    return time.perf_counter() - t


# ---- decode ----------------------------------------------------------------------------------

def bench_decode_model(model_id: str, n_pp: int = 64, n_tg: int = 64, repeats: int = 3,
                       llama: dict | None = None, mmap: bool | None = None) -> dict:
    """One model's row.  llama: llama.cpp's {'pp_tok_s', 'tg_tok_s'} measured earlier in the
    run for the same file (an ':q8' row after its base); else measured here when
    llama-cpp-python is installed (with the same mmap setting), else the recorded figures (LLAMACPP)."""
    import specdec
    base_id, _, activations = model_id.partition(":")
    t = time.perf_counter()
    m = specdec.load(base_id, n_ctx=n_pp + n_tg + 8, activations=activations or "auto", mmap=mmap)
    load_s = time.perf_counter() - t
    warm_s = _warm(m)
    rng = np.random.default_rng(0)
    n_vocab = m.config.n_vocab
    prompt = rng.integers(min(100, n_vocab // 2), min(n_vocab, 30000), n_pp).tolist()
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
    ref = LLAMACPP.get(base_id, {})
    source = "recorded figures (LLAMACPP)"
    mmap = not m.gguf.in_memory                # what the default chose; llama.cpp does the same
    live, how = llama, "earlier in this run"
    if live is None:
        live, how = llamacpp_bench(m.path, n_pp, n_tg, repeats, mmap=mmap), "llama-bench, native build"
    if live is None:
        live, how = (llamacpp.decode(m.path, prompt, n_tg, repeats, mmap=mmap),
                     f"llama-cpp-python {llamacpp.version()}")
    if live is not None:                  # llama.cpp in this run, same file, same threads
        ref = {"pp64": live["pp_tok_s"], "tg64": live["tg_tok_s"]}
        source = f"measured in this run ({live.get('how', how)})"
    return {"model": model_id, "mmap": mmap, "load_s": round(load_s, 2), "compile_or_warm_s": round(warm_s, 2),
            "pp64_tok_s": round(pp_best, 2), "tg64_tok_s": round(tg_best, 2),
            "weight_bytes_per_token": wb, "tg_gb_s": round(wb * tg_best / 1e9, 2),
            "llamacpp_source": source if ref else None,
            "llamacpp_pp64_tok_s": ref.get("pp64"), "llamacpp_tg64_tok_s": ref.get("tg64"),
            "tg_vs_llamacpp": round(tg_best / ref["tg64"], 3) if ref else None,
            "pp_vs_llamacpp": round(pp_best / ref["pp64"], 3) if ref else None}


def bench_decode(models: Sequence[str], out_dir: Path, repeats: int = 3, log: Log = print,
                 mmap: bool | None = None) -> dict:
    """decode.json (+ roofline fractions when out_dir holds bandwidth.json)."""
    bw = roofline(Path(out_dir))
    rows, live = [], {}
    for mid in models:
        base = mid.partition(":")[0]
        r = bench_decode_model(mid, repeats=repeats, llama=live.get(base), mmap=mmap)
        if r["llamacpp_source"] and r["llamacpp_source"].startswith("measured"):
            live[base] = {"pp_tok_s": r["llamacpp_pp64_tok_s"], "tg_tok_s": r["llamacpp_tg64_tok_s"],
                          "how": r["llamacpp_source"][len("measured in this run ("):-1]}
        if bw:
            r["roofline_fraction"] = round(r["tg_gb_s"] / bw["all_threads_gbs"], 3)
        rows.append(r)
        log(f"decode  {mid:38s} pp64 {r['pp64_tok_s']:7.1f} tok/s   tg64 {r['tg64_tok_s']:6.1f} tok/s"
            f"   (llama.cpp {r['llamacpp_tg64_tok_s'] or '-'})")
    result = {"machine": machine_info(), "bandwidth": bw, "results": rows}
    write_json(Path(out_dir) / "decode.json", result)
    return result


# ---- speculative -----------------------------------------------------------------------------

def bench_pair(target_id: str, draft_id: str, n_predict: int = 64,
               draft_ns: Sequence[int] = (2, 4, 6), repeats: int = 1,
               prompts: Sequence[str] = PROMPTS, log: Log = print, mmap: bool | None = None) -> dict:
    """Plain vs speculative greedy generation, per prompt and draft length."""
    import specdec
    target, draft = specdec.load(target_id, mmap=mmap), specdec.load(draft_id, mmap=mmap)
    _warm(target)
    _warm(draft)
    runs = []
    for i, text in enumerate(prompts):
        prompt = target.chat_prompt([{"role": "user", "content": text}])
        plain = _best(lambda: target.generate(prompt, n_predict), repeats)
        row = {"prompt": i, "n_prompt": len(plain.prompt_ids), "plain_tokens": len(plain.ids),
               "plain_tok_s": round(plain.timings.tokens_per_s, 3), "speculative": []}
        for n in draft_ns:
            spec = _best(lambda: target.generate(prompt, n_predict, draft=draft, draft_n=n,
                                                 draft_policy="fixed"), repeats)
            s = spec.stats
            row["speculative"].append({
                "draft_n": n, "tokens": len(spec.ids), "tok_s": round(spec.timings.tokens_per_s, 3),
                "speedup": round(spec.timings.tokens_per_s / plain.timings.tokens_per_s, 3),
                "identical": spec.ids == plain.ids, "acceptance": round(s.acceptance_rate, 4),
                "tokens_per_step": round(s.tokens_per_step, 3),
                "predicted_acceptance": round(s.predicted_acceptance, 4),
                "measured_acceptance": round(s.measured_acceptance, 4),
                "draft_s": round(s.draft_s, 3), "verify_s": round(s.verify_s, 3)})
            r = row["speculative"][-1]
            log(f"spec    {target_id} + {draft_id} prompt {i} draft_n {n}: {r['tok_s']:.2f} tok/s "
                f"vs {row['plain_tok_s']:.2f} plain = {r['speedup']:.2f}x, acceptance "
                f"{r['acceptance']:.0%}, identical {r['identical']}")
        runs.append(row)
    summary = []
    for j, n in enumerate(draft_ns):
        spec_time = sum(r["speculative"][j]["tokens"] / r["speculative"][j]["tok_s"] for r in runs)
        plain_time = sum(r["plain_tokens"] / r["plain_tok_s"] for r in runs)
        tokens = sum(r["speculative"][j]["tokens"] for r in runs)
        summary.append({"draft_n": n, "tok_s": round(tokens / spec_time, 3),
                        "plain_tok_s": round(sum(r["plain_tokens"] for r in runs) / plain_time, 3),
                        "speedup": round(plain_time / spec_time, 3),
                        "acceptance": round(float(np.mean([r["speculative"][j]["acceptance"] for r in runs])), 4),
                        "predicted_acceptance": round(float(np.mean(
                            [r["speculative"][j]["predicted_acceptance"] for r in runs])), 4),
                        "all_identical": all(r["speculative"][j]["identical"] for r in runs)})
    return {"target": target_id, "draft": draft_id, "n_predict": n_predict, "runs": runs,
            "summary": summary}


def _best(fn, repeats: int):
    best = None
    for _ in range(max(1, repeats)):
        out = fn()
        if best is None or out.timings.tokens_per_s > best.timings.tokens_per_s:
            best = out
    return best


def bench_speculative(pairs: Sequence[tuple[str, str]], out_dir: Path, n_predict: int = 64,
                      draft_ns: Sequence[int] = (2, 4, 6), repeats: int = 1,
                      log: Log = print, mmap: bool | None = None) -> dict:
    result = {"machine": machine_info(), "prompts": list(PROMPTS), "mmap": mmap,
              "pairs": [bench_pair(t, d, n_predict, draft_ns, repeats, log=log, mmap=mmap)
                        for t, d in pairs]}
    write_json(Path(out_dir) / "speedup.json", result)
    return result


# ---- plots -----------------------------------------------------------------------------------

def plot_decode(result: dict, path: Path) -> Path:
    from .report import pyplot
    plt = pyplot()
    rows = result["results"]
    x = np.arange(len(rows))
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for ax, key, ref, title in ((axes[0], "pp64_tok_s", "llamacpp_pp64_tok_s", "prompt processing (pp64)"),
                                (axes[1], "tg64_tok_s", "llamacpp_tg64_tok_s", "decode (tg64)")):
        ax.bar(x - 0.2, [r[key] for r in rows], 0.4, label="specdec")
        ax.bar(x + 0.2, [r[ref] or 0 for r in rows], 0.4, label="llama.cpp", color="0.7")
        ax.set_xticks(x, [r["model"].split("-instruct")[0] for r in rows], rotation=20, fontsize=8)
        ax.set_ylabel("tokens/s")
        ax.set_title(title)
        ax.legend()
    fig.suptitle(f"decode speed, {result['machine']['cores']} cores", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return Path(path)


def plot_speculative(result: dict, path: Path) -> Path:
    from .report import pyplot
    plt = pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for pair in result["pairs"]:
        ns = [s["draft_n"] for s in pair["summary"]]
        label = f"{pair['target'].split('-instruct')[0]} + {pair['draft'].split('-instruct')[0]}"
        axes[0].plot(ns, [s["speedup"] for s in pair["summary"]], "o-", label=label)
        axes[1].plot(ns, [s["acceptance"] for s in pair["summary"]], "o-", label=f"{label}: measured")
        axes[1].plot(ns, [s["predicted_acceptance"] for s in pair["summary"]], "x--",
                     label=f"{label}: 1 - TV(p, q)")
    axes[0].axhline(1.0, color="0.5", lw=0.8)
    axes[0].set_xlabel("draft length N")
    axes[0].set_ylabel("speedup over the target alone")
    axes[1].set_xlabel("draft length N")
    axes[1].set_ylabel("acceptance")
    axes[1].set_ylim(0, 1)
    for ax in axes:
        ax.legend(fontsize=7)
    fig.suptitle("speculative decoding, greedy", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return Path(path)


SCRIPTS = ("speculative", "drafters", "replay")   # replay reads the drafters.json of the same folder


def run_script(name: str, out_dir: Path, log: Log = print, mmap: bool | None = None) -> None:
    """benchmarks/NAME.py of a source checkout, with its own defaults, into out_dir."""
    import subprocess
    import sys
    from ..errors import ConfigError
    script = Path(__file__).resolve().parents[2] / "benchmarks" / f"{name}.py"
    if name not in SCRIPTS or not script.is_file():
        raise ConfigError(f"--scripts {name}: needs benchmarks/{name}.py of a source checkout")
    # the script runs in benchmarks/: a relative out_dir would land there, not where asked
    args = [str(script), "--out", str(Path(out_dir).resolve())] + ([] if mmap is not False else ["--no-mmap"])
    log(f"running {' '.join(args)}")
    r = subprocess.run([sys.executable, *args], cwd=script.parent)
    if r.returncode:
        raise ConfigError(f"benchmarks/{name}.py failed with exit code {r.returncode}")


def default_out_dir() -> Path:
    return Path(f"specdec-bench-{datetime.datetime.now().strftime('%Y%m%d-%H%M%S')}")


def run(out_dir: Path, models: Sequence[str] = (), pairs: Sequence[tuple[str, str]] = (),
        n_predict: int = 64, draft_ns: Sequence[int] = (2, 4, 6), repeats: int = 1,
        scripts: Sequence[str] = (), log: Log = print, mmap: bool | None = None) -> list[Path]:
    """Everything `specdec bench` does; returns the files written."""
    from .report import pyplot
    pyplot()                                               # fail before hours of benchmarking
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    if models:
        res = bench_decode(models, out_dir, repeats=repeats, log=log, mmap=mmap)
        written += [out_dir / "decode.json", plot_decode(res, out_dir / "decode.png")]
    if pairs:
        res = bench_speculative(pairs, out_dir, n_predict, draft_ns, repeats, log=log, mmap=mmap)
        written += [out_dir / "speedup.json", plot_speculative(res, out_dir / "speedup.png")]
    for name in scripts:
        before = set(out_dir.iterdir())
        run_script(name, out_dir, log, mmap=mmap)
        written += sorted(set(out_dir.iterdir()) - before)
    return written
