"""Do the defaults pay?  Greedy speculative generation on the Qwen pair with no drafting
flags at all (`specdec run -md DRAFT`: `generate(draft=draft_model)` with the draft loaded as
the CLI loads it then, its layers requantized to Q4_0, --draft-quant) against the target
alone, and against llama.cpp's flags given explicitly (--draft-n 5 --draft-p 0.9), prompt by
prompt in one process.

Each request is the prompt plus up to --n-predict (160) tokens, timed from the call to its
return (prefill included, as a user waits for it): speedup = plain seconds / speculative
seconds for the same prompt, and the greedy ids must be identical.  Sets: the code-editing
and fresh-code prompts of benchmarks/prompts/ and the README's two examples.  Both models
are loaded with the default load (read into memory when they fit, see gguf_file.should_map)
unless --mmap; every kernel path is warmed before any timing.

--temperature T (with --seed S, default 0) samples instead: every config gets the same seed,
so plain and speculative draw from the same law but not the same tokens (same_ids is then not
expected); --tag names the JSON (defaults<tag>.json).  The drafting plan's pass costs are
calibrated (or read from the cache) before any timing and recorded.

    python benchmarks/defaults.py --out benchmarks/results            # the real run
    python benchmarks/defaults.py --prompts 1 --n-predict 16 --out /tmp/x   # smoke
"""
from __future__ import annotations

import argparse
from contextlib import contextmanager
from dataclasses import asdict, replace
from pathlib import Path

import specdec
from specdec.api.drafting import DraftPlan
from specdec.api.request import AUTO_DRAFT_QUANT, DraftOptions
from specdec.kernels.cpu import verify_growth
from common import QWEN_DRAFT, QWEN_TARGET, load_prompts, machine_info, timed_configs, warm_up, write_json

README_PROMPTS = ("Write a quicksort in Python.",
                  "Write a Python function that checks whether a number is prime.")
CONFIGS = {                     # DRAFT: the draft as `specdec run -md` loads it for that config
    "plain": {},
    "defaults": {"draft": "DRAFT"},                  # layers requantized (--draft-quant's default)
    "llama.cpp flags": {"draft": "DRAFT", "draft_n": 5, "draft_p": 0.9},   # as stored
    # the defaults with another verify-cost prior (--growth-prior: e.g. the one-row-relative
    # growth per extra row verify_curve.py measured on this host) in place of cpu.verify_growth()
    "defaults, prior": {"draft": "DRAFT"},
}
PRIOR_CONFIG = "defaults, prior"


@contextmanager
def growth_prior(value: float):
    """The drafting plan's verify growth (calibrated) patched to `value` for the duration
    (benchmark only)."""
    saved = DraftPlan.costs

    def patched(self):
        c = saved(self)
        return replace(c, target=replace(c.target, growth=value))
    DraftPlan.costs = patched
    try:
        yield
    finally:
        DraftPlan.costs = saved


def timed_rows(target, ids, n_predict: int, kws: dict, prior: float | None) -> dict:
    """timed_configs, with PRIOR_CONFIG run under growth_prior(prior)."""
    rows = timed_configs(target, ids, n_predict, {k: v for k, v in kws.items() if k != PRIOR_CONFIG})
    if PRIOR_CONFIG in kws:
        with growth_prior(prior):
            c = timed_configs(target, ids, n_predict, {PRIOR_CONFIG: kws[PRIOR_CONFIG]})[PRIOR_CONFIG]
        if "plain" in rows:
            c.update(speedup=round(rows["plain"]["wall_s"] / c["wall_s"], 3), same_ids=c["ids"] == rows["plain"]["ids"])
        rows[PRIOR_CONFIG] = c
    return rows


def prompts(target, sets: list[str], limit: int | None) -> list[dict]:
    rows = []
    for name in sets:
        if name == "readme":
            rows += [{"id": f"readme_{i}", "kind": "readme",
                      "prompt": target.chat_prompt([{"role": "user", "content": t}])}
                     for i, t in enumerate(README_PROMPTS)]
        else:
            rows += load_prompts(name)
    if limit:
        by_kind: dict[str, list] = {}
        for r in rows:
            by_kind.setdefault(r["kind"], []).append(r)
        rows = [r for rs in by_kind.values() for r in rs[:limit]]
    return rows


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sets", nargs="+", default=["code_editing", "fresh_code", "readme"])
    ap.add_argument("--prompts", type=int, default=None, help="at most this many prompts per set")
    ap.add_argument("--n-predict", type=int, default=160)
    ap.add_argument("--configs", nargs="+", default=list(CONFIGS), choices=list(CONFIGS))
    ap.add_argument("--mmap", action="store_true", help="map both files (default: specdec's default load)")
    ap.add_argument("--draft-quant", default=AUTO_DRAFT_QUANT,
                    help=f"the defaults' draft layers requantized at load, as `specdec run -md` does "
                         f"with no length flag (default {AUTO_DRAFT_QUANT}; none: as stored)")
    ap.add_argument("--growth-prior", type=float, default=None,
                    help=f"the verify-cost prior of the '{PRIOR_CONFIG}' config (default: not run)")
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument("--seed", type=int, default=0, help="with --temperature > 0")
    ap.add_argument("--tag", default="", help="the JSON is defaults<tag>.json")
    ap.add_argument("--out", default="bench-results")
    a = ap.parse_args(argv)
    if a.growth_prior is None:
        a.configs = [c for c in a.configs if c != PRIOR_CONFIG]
    mmap = True if a.mmap else None
    target = specdec.load(QWEN_TARGET, n_ctx=2048, mmap=mmap)
    draft = specdec.load(QWEN_DRAFT, n_ctx=2048, mmap=mmap)                  # as stored
    quant = None if a.draft_quant == "none" else a.draft_quant
    auto_draft = specdec.load(QWEN_DRAFT, n_ctx=2048, mmap=mmap, requant=quant) if quant else draft
    warm_s = warm_up(target, draft) + (warm_up(auto_draft) if quant else 0.0)
    for d in {id(draft): draft, id(auto_draft): auto_draft}.values():
        d.session(32, n_logits=32768).eval([1, 2, 3])         # the trimmed-head draft path
    costs = DraftPlan(DraftOptions(model=auto_draft), target).costs()     # calibrated before any timing
    print(f"pass costs: {costs}", flush=True)
    sampling = {"temperature": a.temperature, "seed": a.seed} if a.temperature > 0 else {}
    rows = prompts(target, a.sets, a.prompts)
    runs = []
    for r in rows:
        ids = target.tokenize(r["prompt"])
        kws = {name: {**sampling, **{k: ((auto_draft if name.startswith("defaults") else draft) if v == "DRAFT" else v)
                                     for k, v in CONFIGS[name].items()}} for name in a.configs}
        row = {"id": r["id"], "kind": r["kind"], "n_prompt": len(ids),
               "configs": timed_rows(target, ids, a.n_predict, kws, a.growth_prior)}
        print(f"{r['id']:24s} " + "  ".join(
            f"{n} {c['wall_tok_s']:.1f} tok/s" + (f" ({c['speedup']:.2f}x)" if "speedup" in c else "")
            for n, c in row["configs"].items()), flush=True)
        runs.append(row)
    summary: dict = {}
    for kind in dict.fromkeys(r["kind"] for r in runs):
        ks = [r for r in runs if r["kind"] == kind]
        s = summary.setdefault(kind, {})
        for name in a.configs:
            wall = sum(r["configs"][name]["wall_s"] for r in ks)
            tok = sum(r["configs"][name]["n_tokens"] for r in ks)
            s[name] = {"tok_s": round(tok / wall, 3), "wall_s": round(wall, 2)}
            if name != "plain" and "plain" in a.configs:
                sp = [r["configs"][name]["speedup"] for r in ks]
                s[name].update(speedup=round(sum(r["configs"]["plain"]["wall_s"] for r in ks) / wall, 3),
                               min_speedup=min(sp), all_same_ids=all(r["configs"][name]["same_ids"] for r in ks))
    for r in runs:                                             # ids checked; keep the JSON small
        for c in r["configs"].values():
            c.pop("ids")
    result = {"machine": machine_info(), "target": QWEN_TARGET, "draft": QWEN_DRAFT,
              "defaults_draft_quant": quant, "n_predict": a.n_predict, "verify_growth": verify_growth(),
              "growth_prior": a.growth_prior, "warm_up_s": round(warm_s, 2),
              "temperature": a.temperature, "seed": a.seed if sampling else None,
              "pass_costs": {"target": asdict(costs.target), "draft": asdict(costs.draft)},
              "load": "mapped" if a.mmap else ("in memory" if target.gguf.in_memory else "mapped"),
              "configs": {k: {kk: ("draft model" if vv == "DRAFT" else vv) for kk, vv in v.items()}
                          for k, v in CONFIGS.items() if k in a.configs},
              "summary": summary, "runs": runs}
    write_json(Path(a.out) / f"defaults{a.tag}.json", result)
    for kind, s in summary.items():
        print(f"{kind:14s} " + "  ".join(f"{n} {v['tok_s']:.1f} tok/s"
                                         + (f" {v['speedup']:.2f}x (min {v['min_speedup']:.2f}x)"
                                            if "speedup" in v else "")
                                         for n, v in s.items()))


if __name__ == "__main__":
    main()
