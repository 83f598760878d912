"""Nightly GGUF fuzz run: mutants of synthetic files and of real files' headers, counted by
outcome (tests/fuzz/fuzz_harness.py), written as JSON with the CPU model.

    python benchmarks/fuzz.py [-n 2000] [--requests 2000] [--seed 0] [--out benchmarks/results/fuzz.json]

--requests N also fuzzes N request bodies against a `specdec serve` process on a tiny
synthetic model (tests/fuzz/request_fuzz.py) and checks it alive and right afterwards.

Real headers come from the model cache (those present); without any, synthetic files only.
Exit status 1 when any mutant crashed, hung, raised a traceback, gave non-finite logits or
ran out of memory.
"""
from __future__ import annotations

import argparse
import json
import platform
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "tests" / "fuzz"), str(ROOT / "tests"), str(ROOT)]

import numpy as np  # noqa: E402

import fuzz_harness  # noqa: E402
from fuzz_bases import real_header_base, synthetic_bases  # noqa: E402

REAL = ("smollm2-135m-instruct-q4_1", "qwen2.5-coder-0.5b-instruct", "gemma-3-270m-q4_k_m")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-n", type=int, default=2000, help="mutants in all")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--real-share", type=float, default=0.25, help="share of mutants on real headers")
    ap.add_argument("--requests", type=int, default=0, help="request bodies against specdec serve")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "fuzz.json"))
    a = ap.parse_args(argv)
    from specdec.models import hub
    rng = np.random.default_rng(a.seed)
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        real = []
        for mid in REAL:
            try:
                real.append(real_header_base(hub.resolve(mid, download=False), tmp, mid))
            except Exception:               # not in the cache
                pass
        n_real = int(a.n * a.real_share) if real else 0
        rep = fuzz_harness.run(synthetic_bases(tmp), a.n - n_real, rng, tmp / "work")
        if n_real:
            r2 = fuzz_harness.run(real, n_real, rng, tmp / "work-real")
            for k in ("n", "seconds", "restarts"):
                setattr(rep, k, getattr(rep, k) + getattr(r2, k))
            rep.counts.update(r2.counts)
            for kind, c in r2.by_kind.items():
                rep.by_kind.setdefault(kind, type(c)()).update(c)
            rep.failures += r2.failures
            rep.errors.update(r2.errors)
        out = {"date": time.strftime("%Y-%m-%d %H:%M"), "cpu": fuzz_harness.cpu_model(),
               "python": platform.python_version(), "seed": a.seed,
               "bases": [b[0] for b in synthetic_bases(tmp)] + [b[0] for b in real],
               "real_mutants": n_real, **rep.as_dict()}
        if a.requests:
            out["requests"] = fuzz_requests(a.requests, a.seed, tmp)
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(out, indent=1) + "\n")
    print(json.dumps({k: out[k] for k in ("n", "seconds", "counts", "worker_restarts")}))
    for f in rep.failures[:20]:
        print(f)
    bad = out.get("requests", {}).get("failures")
    return 1 if rep.failures or bad else 0


def fuzz_requests(n: int, seed: int, tmp: Path) -> dict:
    """n fuzzed bodies against a served tiny model: counts by outcome, the failures, and
    whether the server was alive and gave the same greedy answer afterwards."""
    import request_fuzz
    from servers import SPEC, Server
    from synth import write_tiny_model
    s = Server(["-m", str(write_tiny_model(tmp / "serve.gguf", SPEC)), "-np", "2", "-c", "256"],
               tmp / "serve.log")
    ask = {"prompt": "abcabc", "max_tokens": 12, "temperature": 0, "ignore_eos": True}
    try:
        before = s.post("/v1/completions", ask).json()["choices"][0]["text"]
        t0 = time.perf_counter()
        counts, failed = request_fuzz.run(s.url, n, np.random.default_rng(seed),
                                          alive=lambda: s.proc.poll() is None)
        seconds = time.perf_counter() - t0
        alive = s.proc.poll() is None
        same = alive and s.post("/v1/completions", ask).json()["choices"][0]["text"] == before
    finally:
        s.stop()
    return {"n": sum(counts.values()), "seconds": round(seconds, 1), "counts": dict(counts),
            "failures": failed[:20], "alive_after": alive, "same_answer_after": same}


if __name__ == "__main__":
    sys.exit(main())
