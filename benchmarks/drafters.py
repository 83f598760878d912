"""More than one way to draft, on the Qwen pair: plain target, draft model, prompt lookup,
hybrid and the adaptive draft length, over code-editing prompts (the answer largely repeats
the prompt) and fresh-code prompts (it does not).

Target qwen2.5-coder-1.5b-instruct-q4_k_m, draft qwen2.5-coder-0.5b-instruct.  Every
configuration runs on the same prompts in the same process, prompt by prompt, plain first, so
speedups are against plain decoding measured alongside.  Before any timing, every kernel path
(batched prefill, one-row decode, few-row verify) of both models is compiled or loaded from the
Numba cache (`warm_up`), and the JSON records how long that took.  tok/s counts generated
tokens over decode time (prefill excluded, drafting included; the draft model reads the prompt
in the prefill, as the target does).  Every answer runs to its end of generation
(--n-predict 1024 is a cap none reaches): an edit's answer often opens with prose and repeats
the code after it, so cutting answers short would measure mostly the prose.  p is the target's
distribution, q the draft's; predicted acceptance is the mean of 1 - TV(p, q) over verified
positions (Leviathan et al. 2023, Def. 3.1), measured is accepted / verified.

Configurations (draft_n = --draft-n unless said; the draft model computes logits for ids below
--draft-vocab only):
  plain          the target alone
  model          draft model, threshold policy (up to draft_n, stop below --draft-p)
  prompt-lookup  n-grams of 2..16 tokens (--lookup-ngram-min/max), fixed length draft_n
  lookup-adaptive prompt lookup, draft length 1..16 chosen online (specdec.speculation.policies)
  hybrid         lookup when it matches, else the draft model (threshold policy)
  adaptive       hybrid drafter, draft length 1..16 chosen online
  suffix         the suffix drafter (drafters/suffix.py), fixed length draft_n, its store warmed
                 with earlier requests: in a set of independent prompts (code_editing,
                 fresh_code) the other prompts' prompt + answer, in multi_turn the earlier
                 requests of the same group (the same refactor of three files, in file order)
  suffix-adaptive the same, draft length 1..16 chosen online

With a suffix configuration, plain runs first over the whole set (its greedy answers warm the
stores; the answers of every configuration are the same at temperature 0), then the other
configurations prompt by prompt.  The suffix rows record how many stored tokens they drafted
from (`store_tokens`).

    python benchmarks/drafters.py --no-mmap --out bench-results             # the real run
    python benchmarks/drafters.py --prompts 1 --n-predict 16 --sets fresh_code --out /tmp/x  # smoke
    # the suffix store: plain, lookup and suffix over all three sets (multi_turn: 9 prompts)
    nice -n 19 python benchmarks/drafters.py --no-mmap --sets code_editing fresh_code multi_turn \
        --configs plain prompt-lookup lookup-adaptive suffix suffix-adaptive --prompts 9 \
        --out bench-results/suffix
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import specdec
from common import (QWEN_DRAFT, QWEN_TARGET, aggregate, completion_row, load_prompts,
                    machine_info, warm_up, write_json)

CONFIGS = ("plain", "model", "prompt-lookup", "lookup-adaptive", "hybrid", "adaptive", "suffix",
           "suffix-adaptive")
SETS = ("code_editing", "fresh_code", "multi_turn")
SUFFIX = ("suffix", "suffix-adaptive")


def config_kwargs(name: str, draft, a) -> dict:
    """Model.generate keyword arguments of one configuration."""
    lookup = dict(lookup_ngram_min=a.lookup_ngram_min, lookup_ngram_max=a.lookup_ngram_max,
                  lookup_copy_ratio=a.lookup_copy_ratio)
    if name == "plain":
        return {}
    if name == "model":
        return dict(draft=draft, draft_n=a.draft_n, draft_p=a.draft_p, draft_policy="threshold",
                    draft_vocab=a.draft_vocab)
    if name == "prompt-lookup":
        return dict(draft="prompt-lookup", draft_n=a.draft_n, draft_policy="fixed", **lookup)
    if name == "lookup-adaptive":
        return dict(draft="prompt-lookup", draft_n=16, draft_policy="adaptive", **lookup)
    if name == "hybrid":
        return dict(draft="hybrid", draft_model=draft, draft_n=a.draft_n, draft_p=a.draft_p,
                    draft_policy="threshold", draft_vocab=a.draft_vocab, **lookup)
    if name == "adaptive":
        return dict(draft="hybrid", draft_model=draft, draft_n=16, draft_policy="adaptive",
                    draft_vocab=a.draft_vocab, **lookup)
    if name == "suffix":
        return dict(draft="suffix", draft_n=a.draft_n, draft_policy="fixed", **lookup)
    if name == "suffix-adaptive":
        return dict(draft="suffix", draft_n=16, draft_policy="adaptive", **lookup)
    raise ValueError(name)


def warm_store(prompts: list[dict], i: int, answers: dict):
    """The suffix store of prompt i: the prompt + answer ids of the set's other requests
    (records with a 'group': the earlier ones of its group)."""
    from specdec import SuffixStore
    rec, store = prompts[i], SuffixStore()
    for j, other in enumerate(prompts):
        if j == i or other["id"] not in answers:
            continue
        if "group" in rec and (other.get("group") != rec["group"] or j > i):
            continue
        store.add(answers[other["id"]]["prompt_ids"] + answers[other["id"]]["ids"])
    return store


def run_set(target, draft, set_name: str, a) -> dict:
    prompts = load_prompts(set_name, a.prompts)
    rows: dict[str, list[dict]] = {c: [] for c in a.configs}
    answers: dict[str, dict] = {}         # greedy: the one answer of every configuration
    identical = True
    first: dict[str, object] = {}         # plain's completions when it runs first (suffix configs)
    if any(c in SUFFIX for c in a.configs):
        for i, rec in enumerate(prompts):
            first[rec["id"]] = out = target.generate(rec["prompt"], n_predict=a.n_predict,
                                                     temperature=a.temp, seed=1000 + i,
                                                     ignore_eos=a.ignore_eos)
            answers[rec["id"]] = {"prompt_ids": list(out.prompt_ids), "ids": list(out.ids)}
    for i, rec in enumerate(prompts):
        ids_by_config = {}
        for c in a.configs:
            kw = config_kwargs(c, draft, a)
            store = None
            if c in SUFFIX:
                kw["suffix_store"] = store = warm_store(prompts, i, answers)
                n_stored = store.n_tokens
            if c == "plain" and rec["id"] in first:
                out = first[rec["id"]]
            else:
                out = target.generate(rec["prompt"], n_predict=a.n_predict, temperature=a.temp,
                                      seed=1000 + i, ignore_eos=a.ignore_eos, **kw)
            row = completion_row(out)
            row["prompt_id"] = rec["id"]
            if store is not None:
                row["store_tokens"] = n_stored
            rows[c].append(row)
            ids_by_config[c] = out.ids
            print(f"{set_name:13s} {rec['id']:22s} {c:15s} {row['n_tokens']:4d} tok "
                  f"{row['tok_s']:7.2f} tok/s" + (f"  acc {row['acceptance']:.2f} "
                                                  f"{row['tokens_per_step']:.2f} tok/step"
                                                  if "acceptance" in row else ""), flush=True)
        if a.temp == 0.0:
            identical &= all(v == ids_by_config[a.configs[0]] for v in ids_by_config.values())
            answers[rec["id"]] = {"prompt_ids": list(out.prompt_ids),
                                  "ids": list(ids_by_config[a.configs[0]])}
    summary = {c: aggregate(r) for c, r in rows.items()}
    base = summary.get("plain", {}).get("tok_s")
    for s in summary.values():
        s["speedup"] = round(s["tok_s"] / base, 3) if base else None
    return {"prompts": [p["id"] for p in prompts], "summary": summary, "runs": rows,
            "greedy_outputs_identical": identical if a.temp == 0.0 else None,
            "answers": answers}   # token ids, for benchmarks/replay.py


def plot(results: dict, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    sets = list(results)
    configs = [c for c in CONFIGS if c in results[sets[0]]["summary"]]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    width = 0.8 / max(1, len(sets))
    for k, s in enumerate(sets):
        summ = results[s]["summary"]
        xs = [j + k * width for j in range(len(configs))]
        axes[0].bar(xs, [summ[c]["speedup"] or 0 for c in configs], width, label=s)
        axes[1].bar(xs, [summ[c].get("tokens_per_step", 1.0) for c in configs], width, label=s)
    for ax, title in zip(axes, ("speedup over plain (tok/s ratio)", "tokens per target pass")):
        ax.set_xticks([j + width * (len(sets) - 1) / 2 for j in range(len(configs))])
        ax.set_xticklabels(configs, rotation=20)
        ax.axhline(1.0, color="grey", lw=0.8)
        ax.set_title(title)
        ax.legend()
    fig.suptitle(f"{QWEN_TARGET} / {QWEN_DRAFT}")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sets", nargs="+", default=list(SETS), choices=SETS)
    ap.add_argument("--configs", nargs="+", default=list(CONFIGS), choices=CONFIGS)
    ap.add_argument("--prompts", type=int, default=0, help="prompts per set (default: all; 6, 6 and 9)")
    ap.add_argument("--n-predict", type=int, default=1024, help="cap on each answer (default: 1024)")
    ap.add_argument("--temp", type=float, default=0.0)
    ap.add_argument("--draft-n", type=int, default=8)
    ap.add_argument("--draft-p", type=float, default=0.9)
    ap.add_argument("--lookup-ngram-min", type=int, default=2)
    ap.add_argument("--lookup-ngram-max", type=int, default=16)
    ap.add_argument("--lookup-copy-ratio", type=float, default=1.0,
                    help="a match of n tokens copies at most this many times n (0: draft-n)")
    ap.add_argument("--draft-vocab", type=int, default=32768,
                    help="the draft model computes logits for ids below this only (0: all; "
                         "default 32768: 95%% of the answers' tokens, 89%% greedy agreement with "
                         "the target vs 93%% with all 151936, 23%% fewer draft bytes per token)")
    ap.add_argument("--ignore-eos", action="store_true")
    ap.add_argument("--out", default="bench-results")
    ap.add_argument("--no-mmap", action="store_true", help="read the model files into memory (specdec --no-mmap)")
    a = ap.parse_args()
    a.draft_vocab = a.draft_vocab or None
    if "plain" in a.configs:
        a.configs = ["plain"] + [c for c in a.configs if c != "plain"]
    target = specdec.load(QWEN_TARGET, n_ctx=2048, mmap=False if a.no_mmap else None)
    draft = specdec.load(QWEN_DRAFT, n_ctx=2048, mmap=False if a.no_mmap else None)
    warm_s = warm_up(target, draft)
    print(f"warm-up (JIT compile or cache load, not timed below): {warm_s:.1f} s", flush=True)
    t0 = time.perf_counter()
    results = {s: run_set(target, draft, s, a) for s in a.sets}
    out = Path(a.out)
    write_json(out / "drafters.json", {
        "machine": machine_info(), "target": QWEN_TARGET, "draft": QWEN_DRAFT,
        "settings": {k: v for k, v in vars(a).items() if k != "out"},
        "warmup_s": round(warm_s, 2), "warmup": "every kernel path compiled before timing",
        "wall_s": round(time.perf_counter() - t0, 1), "results": results})
    plot(results, out / "drafters.png")
    print(f"\n{'set':13s} {'config':14s} {'tok/s':>7s} {'speedup':>7s} {'acc':>5s} {'tok/step':>8s} "
          f"{'pred':>5s} {'meas':>5s}")
    for s, r in results.items():
        for c, m in r["summary"].items():
            print(f"{s:13s} {c:14s} {m['tok_s']:7.2f} {m['speedup'] or 0:7.2f} "
                  f"{m.get('acceptance', 0):5.2f} {m.get('tokens_per_step', 1):8.2f} "
                  f"{m.get('predicted_acceptance', 0):5.2f} {m.get('measured_acceptance', 0):5.2f}")
        if r["greedy_outputs_identical"] is not None:
            print(f"{s}: greedy outputs identical across configurations: {r['greedy_outputs_identical']}")
    print(f"wrote {out / 'drafters.json'} and {out / 'drafters.png'}")
    print(json.dumps({s: {c: m["speedup"] for c, m in r["summary"].items()} for s, r in results.items()}))


if __name__ == "__main__":
    main()
