"""Record what real greedy requests offer each drafter: the traces specdec.testing.replay replays
(tests/data/traces.json, tests/speculation/test_replay.py).

Per request the target answers alone (greedy: speculation would give the same ids), then along
the answer, at every position i (the context = prompt + the answer's first i tokens):
  model          the draft model's greedy guesses, from one teacher-forced pass over prompt +
                 answer over the defaults' draft vocabulary: while its drafts are accepted its
                 rollout is exactly those guesses, so `run` is how many in a row match (<= 16)
  prompt-lookup  PromptLookupDrafter's key and proposal (up to 16) on that context
  prediction     (code edits) PredictionDrafter's, the prompt's code block as the prediction
Requests: Spec-Bench's first turns (--per-category per group, specbench.py's seeded subset)
and the code-edit prompts (benchmarks/prompts/code_editing.jsonl).

    python benchmarks/record_traces.py --per-category 2 --code 4 --out tests/data/traces.json
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import QWEN_DRAFT, QWEN_TARGET, load_prompts  # noqa: E402
from specbench import DATA, questions  # noqa: E402

RUN_MAX = 16


def model_offers(draft, seq: list[int], p: int, ids: list[int], n_logits: int) -> dict:
    s = draft.session(len(seq) + 1, n_logits=n_logits)
    pred = s.eval(seq).argmax(axis=1)                        # pred[t]: the guess for seq[t + 1]
    runs = []
    for i in range(len(ids)):
        k = 0
        while k < RUN_MAX and i + k < len(ids) and int(pred[p + i - 1 + k]) == ids[i + k]:
            k += 1
        runs.append(k)
    return {"keys": ["model"] * len(ids), "offer": [RUN_MAX] * len(ids), "run": runs}


def drafter_offers(drafter, seq: list[int], p: int, ids: list[int]) -> dict:
    rng = np.random.default_rng(0)
    out = {"keys": [], "offer": [], "run": []}
    drafter.reset()
    drafter.prefill(seq[:p])
    for i in range(len(ids)):
        ctx = seq[:p + i]
        key = drafter.key(ctx)
        toks = drafter.propose(ctx, RUN_MAX, rng).tokens
        k = 0
        while k < len(toks) and i + k < len(ids) and toks[k] == ids[i + k]:
            k += 1
        out["keys"].append(key or drafter.source)
        out["offer"].append(len(toks))
        out["run"].append(k)
    return out


def record(target, draft, name: str, prompt: str, n_new: int, prediction: str | None, n_logits: int) -> dict:
    from specdec.speculation.drafters import PredictionDrafter, PromptLookupDrafter
    out = target.generate(prompt, n_predict=n_new, temperature=0.0, ignore_eos=False)
    p, ids = list(out.prompt_ids), list(out.ids)
    seq = p + ids
    V = int(target.config.n_vocab)
    kinds = {"model": model_offers(draft, seq, len(p), ids, n_logits),
             "prompt-lookup": drafter_offers(PromptLookupDrafter(V), seq, len(p), ids)}
    if prediction is not None:
        pred_ids = target.tokenizer.encode(prediction, special=False, bos=False, eos=False, continued=True)
        kinds["prediction"] = drafter_offers(PredictionDrafter(pred_ids, V), seq, len(p), ids)
    return {"name": name, "prompt_len": len(p), "n_new": len(ids), "kinds": kinds}


def main(argv=None) -> None:
    import re

    import specdec
    from specdec.api.drafting import AUTO_VOCAB
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--per-category", type=int, default=2)
    ap.add_argument("--code", type=int, default=4, help="code-edit prompts, with their prediction")
    ap.add_argument("--n-predict", type=int, default=96)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=Path("tests/data/traces.json"))
    a = ap.parse_args(argv)
    target, draft = specdec.load(QWEN_TARGET), specdec.load(QWEN_DRAFT)
    rows = []
    for q in questions(DATA, a.per_category, a.seed):
        prompt = target.chat_prompt([{"role": "user", "content": q["turns"][0]}])
        rows.append(record(target, draft, f"{q['group']}/{q['question_id']}", prompt, a.n_predict, None, AUTO_VOCAB))
        print(rows[-1]["name"], rows[-1]["prompt_len"], rows[-1]["n_new"], flush=True)
    for r in load_prompts("code_editing", a.code):
        pred = re.search(r"```python\n(.*?)```", r["prompt"], re.S).group(1)
        rows.append(record(target, draft, f"code_editing/{r['id']}", r["prompt"], 2 * a.n_predict, pred, AUTO_VOCAB))
        print(rows[-1]["name"], rows[-1]["prompt_len"], rows[-1]["n_new"], flush=True)
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(rows, separators=(",", ":")) + "\n", encoding="utf-8")
    print(f"{len(rows)} traces -> {a.out}")


if __name__ == "__main__":
    main()
