"""A draft of another tokenizer: greedy generation with Qwen2.5-Coder-1.5B drafted by
SmolLM2-135M through text (--draft-retokenize), against the target alone and against the
same-tokenizer Qwen2.5-Coder-0.5B draft, prompt by prompt in one process.

Each request is a code prompt of benchmarks/prompts/ plus up to --n-predict tokens, timed from
the call to its return (prefill included): tokens/s, acceptance (accepted / drafted target
ids), tokens per target pass, draft seconds, and speedup = plain seconds / speculative
seconds for the same prompt; the greedy ids must be identical to plain's.  Both drafts run
the model drafter alone (--draft model) with the same length policy (--draft-policy,
--draft-n), so the difference is the draft and its retokenization.  Every kernel path is
warmed before any timing.  JSON: <out>/retok.json with machine_info().

    nice -n 19 python benchmarks/retok.py --out benchmarks/results                 # the real run
    nice -n 19 python benchmarks/retok.py --prompts 1 --sets fresh_code --n-predict 16 --out /tmp/retok  # smoke
"""
from __future__ import annotations

import argparse
from pathlib import Path

import specdec
from common import QWEN_DRAFT, QWEN_TARGET, load_prompts, machine_info, timed_configs, warm_up, write_json

SMOL_DRAFT = "smollm2-135m-instruct-q4_1"
CONFIGS = {
    "plain": {},
    "smollm2 retok": {"draft": "model", "draft_model": "SMOL", "draft_retokenize": True},
    "qwen-0.5b": {"draft": "model", "draft_model": "QWEN"},
}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sets", nargs="+", default=["code_editing", "fresh_code"])
    ap.add_argument("--prompts", type=int, default=3, help="at most this many prompts per set")
    ap.add_argument("--n-predict", type=int, default=128)
    ap.add_argument("--draft-policy", default="adaptive", choices=("fixed", "threshold", "adaptive"))
    ap.add_argument("--draft-n", type=int, default=8)
    ap.add_argument("--configs", nargs="+", default=list(CONFIGS), choices=list(CONFIGS))
    ap.add_argument("--out", default="benchmarks/results")
    a = ap.parse_args(argv)
    target = specdec.load(QWEN_TARGET, n_ctx=2048)
    drafts = {"SMOL": specdec.load(SMOL_DRAFT, n_ctx=2048), "QWEN": specdec.load(QWEN_DRAFT, n_ctx=2048)}
    warm_s = warm_up(target, *drafts.values())
    rows = [r for name in a.sets for r in load_prompts(name, a.prompts)]
    runs = []
    for r in rows:
        ids = target.tokenize(r["prompt"])
        kws = {}
        for name in a.configs:
            kw = kws[name] = {k: drafts.get(v, v) if isinstance(v, str) else v for k, v in CONFIGS[name].items()}
            if kw:
                kw.update(draft_policy=a.draft_policy, draft_n=a.draft_n)
        row = {"id": r["id"], "kind": r["kind"], "n_prompt": len(ids),
               "configs": timed_configs(target, ids, a.n_predict, kws)}
        print(f"{r['id']:24s} " + "  ".join(
            f"{n} {c['wall_tok_s']:.1f} tok/s" + (f" acc {c['acceptance']:.2f}" if "acceptance" in c else "")
            + (f" ({c['speedup']:.2f}x)" if "speedup" in c else "")
            for n, c in row["configs"].items()), flush=True)
        runs.append(row)
    summary: dict = {}
    for name in a.configs:
        cs = [r["configs"][name] for r in runs]
        wall, tok = sum(c["wall_s"] for c in cs), sum(c["n_tokens"] for c in cs)
        s = summary[name] = {"tok_s": round(tok / wall, 3) if wall else 0.0, "wall_s": round(wall, 2)}
        if name != "plain":
            drafted, accepted = sum(c["n_drafted"] for c in cs), sum(c["n_accepted"] for c in cs)
            s.update(acceptance=round(accepted / drafted, 4) if drafted else 0.0,
                     tokens_per_step=round(tok / max(1, sum(c["n_steps"] for c in cs)), 3),
                     draft_s=round(sum(c["draft_s"] for c in cs), 3))
            if "plain" in a.configs:
                s.update(speedup=round(sum(r["configs"]["plain"]["wall_s"] for r in runs) / wall, 3),
                         min_speedup=min(c["speedup"] for c in cs),
                         all_same_ids=all(c["same_ids"] for c in cs))
    for r in runs:                                             # ids checked; keep the JSON small
        for c in r["configs"].values():
            c.pop("ids")
    result = {"machine": machine_info(), "target": QWEN_TARGET,
              "drafts": {"smollm2 retok": SMOL_DRAFT, "qwen-0.5b": QWEN_DRAFT},
              "n_predict": a.n_predict, "draft_policy": a.draft_policy, "draft_n": a.draft_n,
              "warm_up_s": round(warm_s, 2), "summary": summary, "runs": runs}
    write_json(Path(a.out) / "retok.json", result)
    for name, s in summary.items():
        print(f"{name:14s} {s['tok_s']:.1f} tok/s"
              + (f", acceptance {s['acceptance']:.2f}" if "acceptance" in s else "")
              + (f", {s['speedup']:.2f}x (min {s['min_speedup']:.2f}x), same ids: {s['all_same_ids']}"
                 if "speedup" in s else ""))


if __name__ == "__main__":
    main()
