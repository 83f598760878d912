"""Shared bits of the benchmark scripts: machine facts, JSON output, prompts, warm-up, timing."""
from __future__ import annotations

import json
import time
from pathlib import Path

from specdec.frontends.bench import machine_info, write_json   # shared with `specdec bench`

__all__ = ["QWEN_TARGET", "QWEN_DRAFT", "PROMPTS_DIR", "machine_info", "write_json", "load_prompts",
           "warm_up", "forward_ms", "completion_row", "aggregate"]

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


def prompt_ids(n: int) -> list[int]:
    """n token ids of a synthetic prompt, the same in every benchmark's timed passes."""
    return [(31 * i) % 1000 + 100 for i in range(n)]


def forward_ms(model, n_rows: int, n_past: int = 128, repeats: int = 5,
               n_logits: int | None = None, last_only: bool = False) -> float:
    """Median milliseconds of one forward pass over n_rows tokens after n_past cached ones
    (logits for every row as verification needs them, or last_only as a draft model's
    catch-up; n_logits: the session computes logits for the first ids only, --draft-vocab)."""
    import time
    import numpy as np
    s = model.session(n_past + n_rows + 1, n_logits=n_logits)
    s.eval([(17 * i) % 1000 + 100 for i in range(n_past)], last_only=True)
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        s.eval(prompt_ids(n_rows), last_only=last_only)
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


def timed_configs(target, ids, n_predict: int, kws: dict) -> dict:
    """target.generate(ids, n_predict, **kw) for each named kw, timed from the call (prefill
    included): completion_row plus wall_s, wall_tok_s and the ids; every configuration but
    'plain' also gets its speedup over 'plain' and whether its ids are the same."""
    rows = {}
    for name, kw in kws.items():
        t = time.perf_counter()
        out = target.generate(ids, n_predict, **kw)
        wall = time.perf_counter() - t
        rows[name] = dict(completion_row(out), wall_s=round(wall, 3),
                          wall_tok_s=round(len(out.ids) / wall, 3), ids=out.ids)
    plain = rows.get("plain")
    for name, c in rows.items():
        if plain and name != "plain":
            c["speedup"] = round(plain["wall_s"] / c["wall_s"], 3)
            c["same_ids"] = c["ids"] == plain["ids"]
    return rows
