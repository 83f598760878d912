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


# ---- speculative decoding benchmarks (drafters.py, speculative.py) ---------------------------

QWEN_TARGET = "qwen2.5-coder-1.5b-instruct-q4_k_m"
QWEN_DRAFT = "qwen2.5-coder-0.5b-instruct"
PROMPTS_DIR = Path(__file__).parent / "prompts"


def load_prompts(name: str, limit: int | None = None) -> list[dict]:
    """Records {id, kind, prompt} of benchmarks/prompts/<name>.jsonl, the first `limit` of them."""
    rows = [json.loads(line) for line in (PROMPTS_DIR / f"{name}.jsonl").read_text().splitlines()
            if line.strip()]
    return rows[:limit] if limit else rows


def warm_up(*models) -> float:
    """Compile (or load from the Numba cache) every kernel path a speculative run takes:
    batched prefill, one-row decode, and the few-row verify passes.  Returns seconds."""
    import time
    t = time.perf_counter()
    for m in models:
        s = m.session(32)
        s.eval([1, 2, 3, 4, 5, 6, 7, 8])
        s.eval([9])
        s.eval([10, 11, 12])
    return time.perf_counter() - t


def forward_ms(model, n_rows: int, n_past: int = 128, repeats: int = 5) -> float:
    """Median milliseconds of one forward pass over n_rows tokens after n_past cached ones."""
    import time
    import numpy as np
    s = model.session(n_past + n_rows + 1)
    s.eval([(17 * i) % 1000 + 100 for i in range(n_past)], last_only=True)
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        s.eval([(31 * i) % 1000 + 100 for i in range(n_rows)])
        times.append(time.perf_counter() - t)
        s.truncate(n_past)
    return float(np.median(times) * 1e3)


def completion_row(out) -> dict:
    """The numbers a benchmark keeps of one Completion (speculative stats when present)."""
    t = out.timings
    row = {"n_tokens": len(out.ids), "decode_s": round(t.decode_s, 4), "prompt_s": round(t.prompt_s, 4),
           "tok_s": round(t.tokens_per_s, 3), "n_prompt": len(out.prompt_ids), "stop": out.stop_reason}
    s = out.stats
    if s is not None:
        row.update(n_steps=s.n_steps, n_drafted=s.n_drafted, n_accepted=s.n_accepted,
                   n_verified=s.n_verified, acceptance=round(s.acceptance_rate, 4),
                   tokens_per_step=round(s.tokens_per_step, 3), mean_draft_n=round(s.mean_draft_n, 3),
                   predicted_acceptance=round(s.predicted_acceptance, 4),
                   measured_acceptance=round(s.measured_acceptance, 4),
                   draft_s=round(s.draft_s, 4), verify_s=round(s.verify_s, 4),
                   by_drafter={k: {f: (round(v, 4) if isinstance(v, float) else v)
                                   for f, v in vars(d).items()} for k, d in (s.by_drafter or {}).items()})
    return row


def _rate(a: float, b: float) -> float:
    return round(a / b, 4) if b else 0.0


def aggregate(rows: list[dict]) -> dict:
    """Pooled over runs: tokens / decode seconds, and count-weighted acceptance figures."""
    n_tok = sum(r["n_tokens"] for r in rows)
    dec = sum(r["decode_s"] for r in rows)
    out = {"n_runs": len(rows), "n_tokens": n_tok, "decode_s": round(dec, 3), "tok_s": _rate(n_tok, dec)}
    if not rows or "n_steps" not in rows[0]:
        return out
    tot = {k: sum(r[k] for r in rows) for k in ("n_steps", "n_drafted", "n_accepted", "n_verified")}
    pred = sum(r["predicted_acceptance"] * r["n_verified"] for r in rows)
    out.update(tot, acceptance=_rate(tot["n_accepted"], tot["n_drafted"]),
               tokens_per_step=_rate(n_tok, tot["n_steps"]),
               predicted_acceptance=_rate(pred, tot["n_verified"]),
               measured_acceptance=_rate(tot["n_accepted"], tot["n_verified"]),
               draft_s=round(sum(r["draft_s"] for r in rows), 3),
               verify_s=round(sum(r["verify_s"] for r in rows), 3))
    by: dict = {}
    for r in rows:
        for k, d in r["by_drafter"].items():
            b = by.setdefault(k, dict.fromkeys(("n_steps", "n_drafted", "n_verified", "n_accepted", "pred"), 0))
            for f in ("n_steps", "n_drafted", "n_verified", "n_accepted"):
                b[f] += d[f]
            b["pred"] += d["predicted_acceptance"] * d["n_verified"]
    out["by_drafter"] = {k: {"n_steps": b["n_steps"], "n_drafted": b["n_drafted"],
                             "n_accepted": b["n_accepted"],
                             "predicted_acceptance": _rate(b["pred"], b["n_verified"]),
                             "measured_acceptance": _rate(b["n_accepted"], b["n_verified"])}
                         for k, b in by.items()}
    return out
