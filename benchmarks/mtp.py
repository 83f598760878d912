"""The MTP drafter's step beside a target pass on a Qwen3.5-2B-shaped file (benchmarks/qwen35.py's,
random Q4_K weights with the nextn block), and the drafting plan's predicted speedup at
acceptance 0.6-0.9 from it.

Three figures, each as a fraction of the target's one-row pass:
- bytes: what one MTP step reads (its layer, eh_proj and its head's first --draft-vocab rows,
  engine/mtp_session.mtp_bytes) over what a target decode step reads (every layer and the head):
  deterministic, from the file's tensors alone (`--bytes-only`: nothing is timed);
- timed: MTPSession's one-row draft step (head trimmed to --draft-vocab, as the defaults run
  it, and the full head) over the target's one-row pass after --n-past tokens (medians);
- the plan's prediction: cost_model.model_rate (tokens per target one-row pass, i.e. the
  speedup over plain decoding, at the best draft length n <= 8) at acceptance 0.6 .. 0.9,
  from calibration.measure's tables of the target and of the MTP block (timed), and from the
  uncalibrated prior (this host's table, the bytes ratio: deterministic).
Random weights: no acceptance is measured or claimed; the predictions are at given acceptances.

    python benchmarks/mtp.py [--file ~/.cache/specdec/qwen35-2b-shape-q4_k.gguf] [--tiny]
                             [--out OUT.json] [--bytes-only]
"""
from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np

import specdec
from specdec.api.drafting import AUTO_N_MAX, AUTO_VOCAB
from specdec.engine.mtp_session import MTPModel, MTPSession, mtp_bytes
from specdec.speculation import calibration
from specdec.speculation.cost_model import Costs, model_rate
from common import machine_info, prompt_ids, write_json
from qwen35 import model_file

ALPHAS = (0.6, 0.7, 0.8, 0.9)


def step_bytes(m) -> int:
    """Bytes a target decode step reads: every layer's weights and the output head."""
    total = m.weights.output.w.nbytes
    for L in m.weights.layers:
        for v in vars(L).values():
            if hasattr(v, "w") and hasattr(v, "n_out"):
                total += v.w.nbytes
        dn = L.deltanet
        if dn is not None:
            total += sum(v.w.nbytes for v in vars(dn).values() if hasattr(v, "w") and hasattr(v, "n_out"))
    return int(total)


def predictions(costs: Costs) -> dict:
    """{alpha: (speedup, n)} of the plan's model at each acceptance."""
    return {str(a): dict(zip(("speedup", "n"), (round(r, 3), n))) for a in ALPHAS
            for r, n in [model_rate(costs, a, AUTO_N_MAX)]}


def timed_steps(m, vocab: int, n_past: int, repeats: int) -> dict:
    """Medians (ms) of the target's one-row pass and of the MTP block's draft step."""
    target = m.session(n_past + 64)
    target.keep_hidden = True
    target.eval(prompt_ids(n_past), last_only=True)
    row = []
    for i in range(repeats * 5):
        t = time.perf_counter()
        target.eval([prompt_ids(8)[i % 8]])
        row.append(time.perf_counter() - t)
        target.truncate(n_past)
    out = {"target_row_ms": float(np.median(row) * 1e3)}
    for name, n_logits in (("mtp_step_ms", vocab), ("mtp_step_ms_full_head", None)):
        s = MTPSession(m.config, m.weights, n_past + 64, n_logits)
        s.attach(target)
        s.eval(prompt_ids(n_past))                       # the context's rows, the target's h
        steps = []
        for i in range(repeats * 5):
            t = time.perf_counter()
            s.eval([prompt_ids(8)[i % 8]])               # a drafted row: chained on its own h'
            steps.append(time.perf_counter() - t)
            s.truncate(n_past)
        out[name] = float(np.median(steps) * 1e3)
    return {k: round(v, 3) for k, v in out.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--file", type=Path, default=Path.home() / ".cache" / "specdec" / "qwen35-2b-shape-q4_k.gguf")
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results/zen5/mtp.json"))
    ap.add_argument("--tiny", action="store_true", help="a small file of the same layout (a dry run)")
    ap.add_argument("--bytes-only", action="store_true", help="the deterministic figures only: nothing timed")
    ap.add_argument("--draft-vocab", type=int, default=AUTO_VOCAB, help="the MTP head's ids (the defaults')")
    ap.add_argument("--n-past", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=5)
    a = ap.parse_args()
    _, path = model_file(a.file, a.tiny)
    m = specdec.load(path, n_ctx=a.n_past + 64)
    vocab = min(a.draft_vocab, m.config.n_vocab)
    tb, mb, mb_full = step_bytes(m), mtp_bytes(m.weights, vocab), mtp_bytes(m.weights)
    prior = Costs.prior(float(tb), float(mb))
    out = {"file": str(path), "draft_vocab": vocab, "target_step_bytes": tb, "mtp_step_bytes": mb,
           "mtp_over_target_bytes": round(mb / tb, 4), "mtp_full_head_over_target_bytes": round(mb_full / tb, 4),
           "predicted_from_prior": {"table": list(prior.target.table), "c": round(prior.c, 4),
                                    "by_alpha": predictions(prior)},
           "note": "random weights: no acceptance is measured; speedups are the plan's model at given acceptances",
           "machine": machine_info()}
    if not a.bytes_only:
        out["timed"] = t = timed_steps(m, vocab, a.n_past, a.repeats)
        out["mtp_step_over_target_pass"] = round(t["mtp_step_ms"] / t["target_row_ms"], 4)
        out["mtp_full_head_step_over_target_pass"] = round(t["mtp_step_ms_full_head"] / t["target_row_ms"], 4)
        measured = Costs(calibration.measure(m), calibration.measure(MTPModel(m), n_logits=vocab))
        out["predicted_from_calibration"] = {"table": list(measured.target.table), "c": round(measured.c, 4),
                                             "by_alpha": predictions(measured)}
    write_json(a.out, out)
    print(a.out, {k: out[k] for k in ("mtp_over_target_bytes", "mtp_step_over_target_pass") if k in out})
    for k in ("predicted_from_prior", "predicted_from_calibration"):
        if k in out:
            print(k, out[k]["c"], out[k]["by_alpha"])


if __name__ == "__main__":
    main()
