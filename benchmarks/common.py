"""Shared bits of the benchmark scripts: machine facts, JSON output, weight bytes per token."""
from __future__ import annotations

import datetime
import json
import os
import platform
from pathlib import Path

# llama.cpp on this machine kind (2 cores, AVX-512), llama-bench -t 2 -p 64 -n 64, tokens/s
LLAMACPP = {
    "qwen2.5-coder-1.5b-instruct-q4_k_m": {"pp64": 110.0, "tg64": 15.4},
    "qwen2.5-coder-0.5b-instruct": {"pp64": 237.0, "tg64": 27.7},
    "smollm2-135m-instruct-q4_1": {"pp64": 377.0, "tg64": 112.0},
    "gemma-3-270m-q4_k_m": {"pp64": 653.0, "tg64": 49.9},
}


def machine_info() -> dict:
    cpu = "?"
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    import numba
    return {"cpu": cpu, "cores": os.cpu_count(), "numba_threads": numba.get_num_threads(),
            "python": platform.python_version(), "numba": numba.__version__,
            "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")}


def write_json(path: Path, obj) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".json.partial")
    tmp.write_text(json.dumps(obj, indent=1))
    os.replace(tmp, path)


def weight_bytes_per_token(model) -> int:
    """Bytes of weights a decode step reads: every tensor but the embedding table, which is
    read one row per token — unless the output head is tied to it (then it is read whole)."""
    gf = model.gguf
    total = sum(t.n_bytes for t in gf.tensors.values())
    tied = "output.weight" not in gf.tensors
    return total if tied else total - gf.tensors["token_embd.weight"].n_bytes


def roofline(out_dir: Path) -> dict | None:
    p = Path(out_dir) / "bandwidth.json"
    return json.loads(p.read_text()) if p.exists() else None
