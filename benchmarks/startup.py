"""Start-up: the wall time of a one-token answer, and where it goes, beside llama-cli.

Each run is a fresh process, as a user's:

  specdec-cold   `specdec run -m T -md D -p hi -n 1 -v` after deleting the pair's prepared
                 weights (engine/prepared.py): every load prepares (and writes) them
  specdec-warm   the same again: the prepared weights are read back
  specdec-target `specdec run -m T -p hi -n 1 -v` (warm)
  serve-ready    `specdec serve -m T -md D` until /health answers 200 (warm)
  llama-cli      llama.cpp's `llama-cli -m T -md D -p hi -n 1` (and `-m T` alone), the native
                 build of benchmarks/build_llamacpp.sh, when it is there

specdec's -v lines give the parts of each load (read or read prepared, tokenizer, weights,
write prepared) and the kernels' warm-up; the JSON keeps them with the wall times (median of
--repeats), the machine record and the llama.cpp build.

    python benchmarks/startup.py [--repeats 3] [--out bench-results]
"""
from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import QWEN_DRAFT, QWEN_TARGET, machine_info, write_json  # noqa: E402
from specdec.models import hub  # noqa: E402
from specdec.engine import prepared  # noqa: E402
from specdec.frontends.bench import llamacpp_build, llamacpp_dir  # noqa: E402

LOAD_LINE = re.compile(r"specdec: (target|draft) load: (.*)")
PART = re.compile(r"([a-z ()]+?) ([0-9.]+) s")


def run_specdec(args: list[str]) -> dict:
    t = time.perf_counter()
    r = subprocess.run([sys.executable, "-m", "specdec.frontends.cli", "run", *args, "-p", "hi", "-n", "1",
                        "-v", "--temp", "0"], capture_output=True, text=True, timeout=900)
    wall = time.perf_counter() - t
    if r.returncode:
        raise SystemExit(r.stderr[-2000:])
    parts = {}
    for role, rest in LOAD_LINE.findall(r.stderr):
        parts[role] = {k.strip(): float(v) for k, v in PART.findall(rest)}
    kernels = [float(x) for x in re.findall(r"kernels ready in ([0-9.]+) s", r.stderr)]
    return {"wall_s": round(wall, 3), "loads": parts, "kernels_s": kernels}


def clear_prepared(*model_ids: str) -> None:
    stems = {Path(hub.resolve(m, download=False)).stem for m in model_ids}
    for name, _ in prepared.listing():
        if name.rsplit("-", 1)[0] in stems:
            shutil.rmtree(prepared.root() / name, ignore_errors=True)


def serve_ready() -> float:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    import httpx
    t = time.perf_counter()
    p = subprocess.Popen([sys.executable, "-m", "specdec.frontends.cli", "serve", "-m", QWEN_TARGET,
                          "-md", QWEN_DRAFT, "--port", str(port)], stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL)
    try:
        while time.perf_counter() - t < 300:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                    return round(time.perf_counter() - t, 3)
            except httpx.HTTPError:
                pass
            time.sleep(0.05)
        raise SystemExit("serve-ready: no /health 200 within 300 s")
    finally:
        p.send_signal(signal.SIGTERM)
        p.wait(timeout=60)


def run_llama_cli(with_draft: bool) -> float | None:
    exe = llamacpp_dir() / "bin" / "llama-cli"
    if not exe.exists():
        return None
    cmd = [str(exe), "-m", hub.resolve(QWEN_TARGET, download=False), "-p", "hi", "-n", "1", "-t", "2",
           "--temp", "0", "-st", "--simple-io"]
    if with_draft:            # this llama.cpp drafts with -md only given --spec-type
        cmd += ["-md", hub.resolve(QWEN_DRAFT, download=False), "--spec-type", "draft-simple"]
    t = time.perf_counter()
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600, stdin=subprocess.DEVNULL)
    if r.returncode:
        print("llama-cli failed:", r.stderr[-800:], file=sys.stderr)
        return None
    return round(time.perf_counter() - t, 3)


def median(rows: list, key) -> float | None:
    vals = [key(r) for r in rows if r is not None and key(r) is not None]
    return round(float(np.median(vals)), 3) if vals else None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", type=Path, default=Path("bench-results"))
    a = ap.parse_args()
    os.environ.pop(prepared.ENV, None)
    pair = ["-m", QWEN_TARGET, "-md", QWEN_DRAFT]
    run_specdec(pair)                                   # models fetched, kernels compiled
    clear_prepared(QWEN_TARGET, QWEN_DRAFT)
    cold = run_specdec(pair)
    warm = [run_specdec(pair) for _ in range(a.repeats)]
    target = [run_specdec(["-m", QWEN_TARGET]) for _ in range(a.repeats)]
    ready = [serve_ready() for _ in range(a.repeats)]
    llama_pair = [run_llama_cli(True) for _ in range(a.repeats)]
    llama_target = [run_llama_cli(False) for _ in range(a.repeats)]
    result = {
        "machine": machine_info(), "llamacpp_build": llamacpp_build(), "repeats": a.repeats,
        "specdec_cold": cold, "specdec_warm": warm, "specdec_target": target,
        "summary": {"specdec_cold_s": cold["wall_s"], "specdec_warm_s": median(warm, lambda r: r["wall_s"]),
                    "specdec_target_s": median(target, lambda r: r["wall_s"]),
                    "serve_ready_s": median(ready, lambda r: r),
                    "llama_cli_pair_s": median(llama_pair, lambda r: r),
                    "llama_cli_target_s": median(llama_target, lambda r: r)},
    }
    print(result["summary"])
    write_json(a.out / "startup.json", result)


if __name__ == "__main__":
    main()
