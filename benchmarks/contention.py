"""Speed beside a busy neighbour: Qwen-1.5B decode and a speculative request (the defaults),
idle and beside 1 and 2 busy processes, for each parallel runtime, with llama.cpp in the run.

A busy process is `python -c "while True: pass"`, started after the kernels are warm and
killed after the timings of its level.  Each runtime runs in its own process (Numba's
threading layer is chosen once per process, kernels/threading_layer.py):

    default        the default: oneTBB on every thread
    tbb adaptive   oneTBB with the thread count chosen per pass (engine/thread_count.py)
    omp            OpenMP static shares on every thread (the default before)
    omp passive    the same with OMP_WAIT_POLICY=passive (idle threads sleep, do not spin)
    tbb            oneTBB on every thread, no governor
    workqueue      Numba's own pool on every thread
    omp adaptive   OpenMP with the governor
    omp dynamic    OpenMP, prange in chunks of 16 iterations handed out as threads free up
                   (numba.set_parallel_chunksize) instead of one static share per thread
    tbb dynamic    the same on oneTBB
    -t 1           one thread

Decode: `generate(ids, n)` greedy, tokens per decode second.  Speculative: the defaults (the
draft requantized as `specdec run -md` loads it), the same prompt, tokens per wall second
against the target alone's wall time at the same level.  llama.cpp: llama-bench -t <cores>
-p 0 -n N of the native build (benchmarks/build_llamacpp.sh) at each level.

    python benchmarks/contention.py --out benchmarks/results/intel
    python benchmarks/contention.py --configs default omp --busy 0 1 --n-predict 16 --out /tmp/x   # smoke
    python benchmarks/contention.py --idle qwen2.5-coder-0.5b-instruct smollm2-135m-instruct-q4_1 \
        --configs default omp --rounds 3 --out benchmarks/results/intel     # idle only, per model
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from common import QWEN_DRAFT, QWEN_TARGET, load_prompts, machine_info, write_json

CONFIGS = {                     # name -> (environment, speculative request measured too)
    "default": ({}, True),
    "omp": ({"SPECDEC_THREADING": "omp", "SPECDEC_ADAPTIVE_THREADS": "0"}, True),
    "omp passive": ({"SPECDEC_THREADING": "omp", "SPECDEC_ADAPTIVE_THREADS": "0", "OMP_WAIT_POLICY": "passive"}, False),
    "tbb adaptive": ({"SPECDEC_THREADING": "tbb", "SPECDEC_ADAPTIVE_THREADS": "1"}, False),
    "workqueue": ({"SPECDEC_THREADING": "workqueue", "SPECDEC_ADAPTIVE_THREADS": "0"}, False),
    "omp adaptive": ({"SPECDEC_THREADING": "omp", "SPECDEC_ADAPTIVE_THREADS": "1"}, False),
    "omp dynamic": ({"SPECDEC_THREADING": "omp", "SPECDEC_ADAPTIVE_THREADS": "0", "BENCH_CHUNKSIZE": "16"}, False),
    "tbb dynamic": ({"SPECDEC_THREADING": "tbb", "SPECDEC_ADAPTIVE_THREADS": "0", "BENCH_CHUNKSIZE": "16"}, False),
    "-t 1": ({"SPECDEC_THREADS_FIXED": "1"}, False),
}
BUSY = "while True: pass"


def busy(n: int) -> list[subprocess.Popen]:
    procs = [subprocess.Popen([sys.executable, "-c", BUSY]) for _ in range(n)]
    time.sleep(1.0)                         # let the scheduler see them
    return procs


def stop(procs) -> None:
    for p in procs:
        p.kill()
        p.wait()


def worker(levels: list[int], n_predict: int, speculative: bool) -> None:
    """One runtime (set by the environment): a JSON line per busy level."""
    import specdec
    from specdec.api.request import AUTO_DRAFT_QUANT
    from specdec.engine import thread_count as threads
    from common import warm_up
    if os.environ.get("BENCH_CHUNKSIZE"):
        import numba
        numba.set_parallel_chunksize(int(os.environ["BENCH_CHUNKSIZE"]))
    if os.environ.get("SPECDEC_THREADS_FIXED"):
        threads.set_threads(int(os.environ["SPECDEC_THREADS_FIXED"]))
    target = specdec.load(QWEN_TARGET, n_ctx=1024)
    draft = specdec.load(QWEN_DRAFT, n_ctx=1024, requant=AUTO_DRAFT_QUANT) if speculative else None
    warm_up(*[m for m in (target, draft) if m is not None])
    ids = target.tokenize(load_prompts("code_editing", 1)[0]["prompt"])
    target.generate(ids, 4)                                       # untimed: the first pass faults pages in
    for level in levels:
        procs = busy(level)
        try:
            t = time.perf_counter()
            plain = target.generate(ids, n_predict)
            plain_wall = time.perf_counter() - t
            row = {"busy": level, "decode_tok_s": round(plain.timings.tokens_per_s, 3),
                   "plain_wall_s": round(plain_wall, 3)}
            if draft is not None:
                t = time.perf_counter()
                spec = target.generate(ids, n_predict, draft=draft)
                wall = time.perf_counter() - t
                row.update(spec_wall_s=round(wall, 3), spec_speedup=round(plain_wall / wall, 3),
                           same_ids=spec.ids == plain.ids, acceptance=round(spec.stats.acceptance_rate, 3))
            row["governor"] = threads.describe()
        finally:
            stop(procs)
        print(json.dumps(row), flush=True)


def idle_worker(models: list[str], n_predict: int) -> None:
    """Idle decode of each model on this runtime: one-row passes after a 32-token prompt,
    the best of 3 runs of n_predict steps; a JSON line per model."""
    import specdec
    for mid in models:
        m = specdec.load(mid, n_ctx=256)
        s = m.session(256)
        s.eval(list(range(100, 132)), last_only=True)
        for t in range(8):                          # kernels compiled, pages touched
            s.eval([200 + t])
        best = 0.0
        for _ in range(3):
            s.truncate(40)
            t = time.perf_counter()
            for i in range(n_predict):
                s.eval([300 + i])
            best = max(best, n_predict / (time.perf_counter() - t))
        print(json.dumps({"model": mid, "decode_tok_s": round(best, 2)}), flush=True)


def idle(configs: list[str], models: list[str], rounds: int, n_predict: int) -> dict:
    """--idle: each runtime's idle decode of each model, runtimes alternated `rounds` times."""
    runs: dict = {name: {m: [] for m in models} for name in configs}
    for _ in range(rounds):
        for name in configs:
            cmd = [sys.executable, __file__, "--idle-worker", "--idle", *models, "--n-predict", str(n_predict)]
            r = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, **CONFIGS[name][0]},
                               timeout=1800, cwd=Path(__file__).parent)
            for line in r.stdout.splitlines():
                if line.startswith("{"):
                    rec = json.loads(line)
                    runs[name][rec["model"]].append(rec["decode_tok_s"])
    return {name: {m: {"best_tok_s": max(v, default=0.0), "rounds_tok_s": v} for m, v in by.items()}
            for name, by in runs.items()}


def run_config(name: str, levels: list[int], n_predict: int) -> list[dict]:
    env, speculative = CONFIGS[name]
    cmd = [sys.executable, __file__, "--worker", "--busy", *map(str, levels), "--n-predict", str(n_predict)]
    if speculative:
        cmd.append("--speculative")
    r = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, **env}, timeout=1800,
                       cwd=Path(__file__).parent)
    rows = [json.loads(line) for line in r.stdout.splitlines() if line.startswith("{")]
    if r.returncode or not rows:
        print(f"{name}: failed\n{r.stderr[-2000:]}", file=sys.stderr)
    return rows


def llamacpp(levels: list[int], n_predict: int) -> list[dict]:
    from specdec.frontends.bench import llamacpp_dir
    from specdec.models import hub
    exe = llamacpp_dir() / "bin" / "llama-bench"
    if not exe.exists():
        return []
    rows = []
    for level in levels:
        procs = busy(level)
        try:
            cmd = [str(exe), "-m", str(hub.resolve(QWEN_TARGET)), "-t", str(os.cpu_count()), "-p", "0",
                   "-n", str(n_predict), "-r", "2", "-o", "json"]
            out = json.loads(subprocess.run(cmd, capture_output=True, text=True, timeout=1200).stdout)
            rows.append({"busy": level, "decode_tok_s": round(out[0]["avg_ts"], 3)})
        except (OSError, ValueError, IndexError, subprocess.TimeoutExpired):
            pass
        finally:
            stop(procs)
    return rows


def kept(rows: list[dict]) -> None:
    """Each level's fraction of the idle speed, in place."""
    idle = next((r["decode_tok_s"] for r in rows if r["busy"] == 0), None)
    for r in rows:
        if idle:
            r["decode_kept"] = round(r["decode_tok_s"] / idle, 3)


def plot(result: dict, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    runs = {**result["specdec"], **({"llama.cpp": result["llamacpp"]} if result["llamacpp"] else {})}
    levels = result["busy"]
    fig, ax = plt.subplots(figsize=(9, 4.5))
    width = 0.8 / max(len(runs), 1)
    for i, (name, rows) in enumerate(runs.items()):
        by = {r["busy"]: r["decode_tok_s"] for r in rows}
        ax.bar([lv + i * width for lv in range(len(levels))], [by.get(lv, 0) for lv in levels], width, label=name)
    ax.set_xticks([lv + 0.4 - width / 2 for lv in range(len(levels))])
    ax.set_xticklabels([f"{lv} busy" for lv in levels])
    ax.set_ylabel("decode tokens/s (Qwen2.5-Coder-1.5B Q4_K_M)")
    ax.set_title(f"Decode beside busy processes — {result['machine']['cpu']}, {result['machine']['cores']} cores",
                 fontsize=9)
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--configs", nargs="+", default=list(CONFIGS), choices=list(CONFIGS))
    ap.add_argument("--busy", nargs="+", type=int, default=[0, 1, 2])
    ap.add_argument("--n-predict", type=int, default=48)
    ap.add_argument("--rounds", type=int, default=1, help="run every config R times, alternating; "
                    "each level keeps its fastest round")
    ap.add_argument("--out", default="bench-results")
    ap.add_argument("--idle", nargs="+", metavar="MODEL", help="instead: idle decode of these models on "
                    "each --configs runtime, alternated --rounds times (contention_idle.json)")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--idle-worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--speculative", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.worker:
        return worker(a.busy, a.n_predict, a.speculative)
    if a.idle_worker:
        return idle_worker(a.idle, a.n_predict)
    if a.idle:
        res = {"machine": machine_info(), "rounds": a.rounds, "n_predict": a.n_predict,
               "idle": idle(a.configs, a.idle, a.rounds, a.n_predict)}
        for name, by in res["idle"].items():
            print(f"{name:14s} " + "  ".join(f"{m}: {v['best_tok_s']:.1f} {v['rounds_tok_s']}" for m, v in by.items()))
        return write_json(Path(a.out) / "contention_idle.json", res)
    result = {"machine": machine_info(), "busy": a.busy, "n_predict": a.n_predict, "rounds": a.rounds,
              "specdec": {}}
    rounds: dict[str, list[list[dict]]] = {name: [] for name in a.configs}
    for _ in range(a.rounds):
        for name in a.configs:
            rounds[name].append(run_config(name, a.busy, a.n_predict))
    for name in a.configs:
        rows = [max((r for rs in rounds[name] for r in rs if r["busy"] == lv), key=lambda r: r["decode_tok_s"])
                for lv in a.busy if any(r["busy"] == lv for rs in rounds[name] for r in rs)]
        for r in rows:
            r["rounds_tok_s"] = [x["decode_tok_s"] for rs in rounds[name] for x in rs if x["busy"] == r["busy"]]
        kept(rows)
        result["specdec"][name] = rows
        print(f"{name:14s} " + "  ".join(
            f"busy {r['busy']}: {r['decode_tok_s']:.1f} tok/s ({r.get('decode_kept', 0):.2f})"
            + (f" spec {r['spec_speedup']:.2f}x" if "spec_speedup" in r else "") for r in rows), flush=True)
    result["llamacpp"] = llamacpp(a.busy, a.n_predict)
    kept(result["llamacpp"])
    print("llama.cpp      " + "  ".join(f"busy {r['busy']}: {r['decode_tok_s']:.1f} ({r.get('decode_kept', 0):.2f})"
                                        for r in result["llamacpp"]))
    out = Path(a.out)
    write_json(out / "contention.json", result)
    plot(result, out / "contention.png")


if __name__ == "__main__":
    main()
