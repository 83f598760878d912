"""Multi-candidate (tree) verification on the Qwen pair: plain target, one linear draft, and
K = 2, 3 candidate continuations verified in one target pass (--draft-tree K), over
code-editing prompts (prompt lookup finds several earlier matches) and fresh-code prompts (the
draft model's K first tokens branch).

Target qwen2.5-coder-1.5b-instruct-q4_k_m, draft qwen2.5-coder-0.5b-instruct, greedy.  Every
configuration drafts with the hybrid drafter (prompt lookup where it matches, the model
otherwise) under the threshold policy (up to --draft-n, a model draft stops below --draft-p),
so the only difference between linear and tree-K is the number of candidates.  Configurations
run prompt by prompt in one process, plain first; every kernel path (prefill, decode, verify,
the tree pass) is compiled before timing.  tok/s: generated tokens over decode time;
acceptance: accepted / drafted tokens (a tree drafts every branch: more drafted, the same or
more accepted); tokens_per_step: tokens per target pass.  Greedy outputs must be identical
across configurations (exactness), and the JSON says whether they were.

    nice -n 19 python benchmarks/tree.py --no-mmap                                   # the real run
    nice -n 19 python benchmarks/tree.py --prompts 1 --n-predict 16 --out /tmp/tree   # smoke
"""
from __future__ import annotations

import argparse
import time
from pathlib import Path

import specdec
from common import (QWEN_DRAFT, QWEN_TARGET, aggregate, completion_row, load_prompts,
                    machine_info, warm_up, write_json)

CONFIGS = ("plain", "linear", "tree-2", "tree-3")
SETS = ("code_editing", "fresh_code")


def config_kwargs(name: str, draft, a) -> dict:
    """Model.generate keyword arguments of one configuration."""
    if name == "plain":
        return {}
    k = 1 if name == "linear" else int(name.split("-")[1])
    return dict(draft="hybrid", draft_model=draft, draft_n=a.draft_n, draft_p=a.draft_p,
                draft_policy="threshold", draft_vocab=a.draft_vocab, draft_tree=k)


def warm_tree(*models) -> None:
    """Compile the tree pass (kernels/attention_tree.py) of each model."""
    for m in models:
        s = m.session(32)
        s.eval([1, 2, 3])
        s.eval_tree([4, 5, 6, 7], [-1, 0, -1, 2])
        s.commit_path([0, 1])


def run_set(target, draft, set_name: str, a) -> dict:
    prompts = load_prompts(set_name, a.prompts)
    rows: dict[str, list[dict]] = {c: [] for c in a.configs}
    identical = True
    for i, rec in enumerate(prompts):
        ids = {}
        for c in a.configs:
            out = target.generate(rec["prompt"], n_predict=a.n_predict, temperature=0.0,
                                  seed=1000 + i, **config_kwargs(c, draft, a))
            row = completion_row(out)
            row["prompt_id"] = rec["id"]
            rows[c].append(row)
            ids[c] = out.ids
            print(f"{set_name:13s} {rec['id']:22s} {c:8s} {row['n_tokens']:4d} tok "
                  f"{row['tok_s']:7.2f} tok/s" + (f"  acc {row['acceptance']:.2f} "
                                                  f"{row['tokens_per_step']:.2f} tok/step"
                                                  if "acceptance" in row else ""), flush=True)
        identical &= all(v == ids[a.configs[0]] for v in ids.values())
    summary = {c: aggregate(r) for c, r in rows.items()}
    base = summary.get("plain", {}).get("tok_s")
    for s in summary.values():
        s["speedup"] = round(s["tok_s"] / base, 3) if base else None
    return {"prompts": [p["id"] for p in prompts], "summary": summary, "runs": rows,
            "greedy_outputs_identical": identical}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sets", nargs="+", default=list(SETS), choices=SETS)
    ap.add_argument("--configs", nargs="+", default=list(CONFIGS), choices=CONFIGS)
    ap.add_argument("--prompts", type=int, default=6, help="prompts per set (default: all 6)")
    ap.add_argument("--n-predict", type=int, default=512)
    ap.add_argument("--draft-n", type=int, default=8)
    ap.add_argument("--draft-p", type=float, default=0.9)
    ap.add_argument("--draft-vocab", type=int, default=32768, help="0: all ids")
    ap.add_argument("--out", default=str(Path(__file__).parent / "results"))
    ap.add_argument("--no-mmap", action="store_true", help="read the model files into memory")
    a = ap.parse_args()
    a.draft_vocab = a.draft_vocab or None
    if "plain" in a.configs:
        a.configs = ["plain"] + [c for c in a.configs if c != "plain"]
    target = specdec.load(QWEN_TARGET, n_ctx=2048, mmap=False if a.no_mmap else None)
    draft = specdec.load(QWEN_DRAFT, n_ctx=2048, mmap=False if a.no_mmap else None)
    t = time.perf_counter()
    warm_up(target, draft)
    warm_tree(target, draft)
    warm_s = time.perf_counter() - t
    print(f"warm-up (JIT compile or cache load, not timed below): {warm_s:.1f} s", flush=True)
    t0 = time.perf_counter()
    results = {s: run_set(target, draft, s, a) for s in a.sets}
    out = Path(a.out)
    write_json(out / "tree.json", {
        "machine": machine_info(), "target": QWEN_TARGET, "draft": QWEN_DRAFT,
        "settings": {k: v for k, v in vars(a).items() if k != "out"},
        "warmup_s": round(warm_s, 2), "wall_s": round(time.perf_counter() - t0, 1),
        "results": results})
    print(f"\n{'set':13s} {'config':8s} {'tok/s':>7s} {'speedup':>7s} {'acc':>5s} {'tok/step':>8s}")
    for s, r in results.items():
        for c, m in r["summary"].items():
            print(f"{s:13s} {c:8s} {m['tok_s']:7.2f} {m['speedup'] or 0:7.2f} "
                  f"{m.get('acceptance', 0):5.2f} {m.get('tokens_per_step', 1):8.2f}")
        print(f"{s}: greedy outputs identical across configurations: {r['greedy_outputs_identical']}")
    print(f"wrote {out / 'tree.json'}")


if __name__ == "__main__":
    main()
