"""Predicted outputs: code edits with the original file as the prediction, as an editor sends
it (OpenAI's `prediction`, `generate(prediction=)`, `specdec run --predict`), greedy, Qwen
pair, prompt by prompt in one process.

Configurations per prompt (timed from the call to its return, prefill included):
    plain                       the target alone
    prompt lookup               draft='prompt-lookup' (the defaults' adaptive length)
    prediction                  prediction=<the file>, nothing else drafting
    prediction + draft model    prediction=<the file>, draft=<the 0.5B draft> (the defaults:
                                the prediction first, hybrid lookup/model elsewhere)
    wrong prediction            prediction=<another prompt's file>: what a prediction that
                                does not match costs
Every configuration's ids must equal plain's (`same_ids`); speedup = plain seconds / its
seconds (the whole request), decode speedup the same over the decode phase alone (after the
prompt pass: a long file's prompt takes most of a capped answer's time); tokens per target
pass and acceptance come from the speculative stats.

Sets: `code_editing` (benchmarks/prompts/code_editing.jsonl: 20-30-line functions, the
prediction is the code block of the prompt) and `large_files` (large_files.jsonl: four
150-170-line modules of CPython 3.11's standard library (PSF licence) — rename a class, add
type hints, add docstrings, fix a planted bug; the answer capped at --n-predict-large tokens).
Kernels are warmed before any timing (compiled once per process).

    python benchmarks/predicted.py --out benchmarks/results/intel          # the real run
    python benchmarks/predicted.py --prompts 1 --n-predict 16 --sets code_editing --out /tmp/x
"""
from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

import specdec
from specdec.api.request import AUTO_DRAFT_QUANT
from common import (PROMPTS_DIR, QWEN_DRAFT, QWEN_TARGET, load_prompts, machine_info, timed_configs,
                    warm_up, write_json)

CONFIGS = ("plain", "prompt lookup", "prediction", "prediction + draft model", "wrong prediction")
CODE = re.compile(r"```python\n(.*?)```", re.S)


def prompt_rows(target, sets: list[str], limit: int | None) -> list[dict]:
    """{id, kind, prompt, prediction} per prompt: the prediction is the file being edited."""
    rows = []
    if "code_editing" in sets:
        for r in load_prompts("code_editing", limit):
            rows.append({**r, "prediction": CODE.search(r["prompt"]).group(1)})
    if "large_files" in sets:
        lines = (PROMPTS_DIR / "large_files.jsonl").read_text().splitlines()
        for r in [json.loads(x) for x in lines if x.strip()][:limit]:
            msg = f"{r['task']}\n\n```python\n{r['code']}```"
            rows.append({"id": r["id"], "kind": r["kind"], "prediction": r["code"],
                         "prompt": target.chat_prompt([{"role": "user", "content": msg}])})
    for i, r in enumerate(rows):                     # another prompt's file: a wrong prediction
        same = [x for x in rows if x["kind"] == r["kind"] and x is not r] or [x for x in rows if x is not r]
        r["wrong"] = same[i % len(same)]["prediction"] if same else "x = 1\n" * 40
    return rows


def configs(row: dict, draft, names) -> dict:
    kws = {"plain": {}, "prompt lookup": {"draft": "prompt-lookup"},
           "prediction": {"prediction": row["prediction"]},
           "prediction + draft model": {"prediction": row["prediction"], "draft": draft},
           "wrong prediction": {"prediction": row["wrong"]}}
    return {k: kws[k] for k in names}


def summarize(runs: list[dict], names) -> dict:
    """Per set and configuration: mean and lowest speedup, tokens per pass, acceptance."""
    out: dict = {}
    for kind in dict.fromkeys(r["kind"] for r in runs):
        rs = [r for r in runs if r["kind"] == kind]
        out[kind] = {}
        for name in names:
            cs = [r["configs"][name] for r in rs]
            s = {"wall_s": round(sum(c["wall_s"] for c in cs), 3),
                 "all_same_ids": all(c.get("same_ids", True) for c in cs)}
            if name != "plain":
                sp = [c["speedup"] for c in cs]
                dec = [x["configs"]["plain"]["decode_s"] / max(c["decode_s"], 1e-9) for x, c in zip(rs, cs)]
                s.update(mean_speedup=round(sum(sp) / len(sp), 3), min_speedup=min(sp),
                         pooled_speedup=round(sum(x["configs"]["plain"]["wall_s"] for x in rs) / s["wall_s"], 3),
                         mean_decode_speedup=round(sum(dec) / len(dec), 3), min_decode_speedup=round(min(dec), 3))
            if "tokens_per_step" in cs[0]:
                steps = sum(c["n_steps"] for c in cs)
                s.update(tokens_per_pass=round(sum(c["n_tokens"] for c in cs) / steps, 3),
                         acceptance=round(sum(c["n_accepted"] for c in cs)
                                          / max(1, sum(c["n_drafted"] for c in cs)), 4))
            out[kind][name] = s
        pl, lk = out[kind]["plain"] if "plain" in out[kind] else None, out[kind].get("prompt lookup")
        for name in ("prediction", "prediction + draft model"):
            if name in out[kind] and lk and pl:
                out[kind][name]["vs_prompt_lookup"] = round(lk["wall_s"] / out[kind][name]["wall_s"], 3)
    return out


def plot(result: dict, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    names = [n for n in result["configs"] if n != "plain"]
    runs = result["runs"]
    fig, ax = plt.subplots(figsize=(max(8, 1.1 * len(runs)), 4.2))
    w = 0.8 / len(names)
    for j, name in enumerate(names):
        ax.bar([i + (j - (len(names) - 1) / 2) * w for i in range(len(runs))],
               [r["configs"][name]["speedup"] for r in runs], w, label=name)
    ax.axhline(1.0, color="k", lw=0.8)
    ax.set_xticks(range(len(runs)))
    ax.set_xticklabels([r["id"] for r in runs], rotation=30, ha="right", fontsize=8)
    ax.set_ylabel("speedup over plain (wall, same tokens)")
    m = result["machine"]
    ax.set_title(f"Predicted outputs, {result['target']} greedy — {m['cpu']}, {m['cores']} cores", fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sets", nargs="+", default=["code_editing", "large_files"],
                    choices=["code_editing", "large_files"])
    ap.add_argument("--prompts", type=int, default=None, help="the first N prompts of each set")
    ap.add_argument("--n-predict", type=int, default=400, help="tokens per answer, code_editing")
    ap.add_argument("--n-predict-large", type=int, default=320, help="tokens per answer, large_files")
    ap.add_argument("--configs", nargs="+", default=list(CONFIGS), choices=CONFIGS)
    ap.add_argument("--out", default="bench-results")
    a = ap.parse_args(argv)
    target = specdec.load(QWEN_TARGET, n_ctx=4096)
    draft = specdec.load(QWEN_DRAFT, n_ctx=4096, requant=AUTO_DRAFT_QUANT)   # as `specdec run -md`
    warm_s = warm_up(target, draft)
    draft.session(32, n_logits=32768).eval([1, 2, 3])          # the trimmed-head draft path
    names = ["plain", *[n for n in a.configs if n != "plain"]]
    runs = []
    for r in prompt_rows(target, a.sets, a.prompts):
        ids = target.tokenize(r["prompt"])
        n = a.n_predict_large if r["kind"] == "large_file_editing" else a.n_predict
        row = {"id": r["id"], "kind": r["kind"], "n_prompt": len(ids),
               "n_prediction": len(target.tokenize(r["prediction"], special=False, bos=False)),
               "configs": timed_configs(target, ids, n, configs(r, draft, names))}
        for c in row["configs"].values():
            c.pop("ids")
        print(f"{r['id']:24s} " + "  ".join(
            f"{k} {c.get('speedup', c['wall_tok_s'])}{'' if c.get('same_ids', True) else ' DIFF'}"
            for k, c in row["configs"].items()), flush=True)
        runs.append(row)
    result = {"machine": machine_info(), "target": QWEN_TARGET, "draft": QWEN_DRAFT,
              "draft_quant": AUTO_DRAFT_QUANT, "n_predict": a.n_predict,
              "n_predict_large": a.n_predict_large, "warm_up_s": round(warm_s, 2),
              "configs": names, "summary": summarize(runs, names), "runs": runs}
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    write_json(out / "predicted.json", result)
    plot(result, out / "predicted.png")
    print(json.dumps(result["summary"], indent=1))
    print(f"wrote {out / 'predicted.json'} and {out / 'predicted.png'}")


if __name__ == "__main__":
    main()
