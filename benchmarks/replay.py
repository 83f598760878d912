"""What drafting could reach on the drafters benchmark's answers: a replay at measured costs.

Greedy decoding is deterministic and speculation does not change it (drafters.py checks that
every configuration gives the same answer), so which drafted tokens the target accepts depends
on the answer alone: a draft is accepted up to its first token that differs from it.  This
script reads the answers drafters.py recorded, measures here what a forward pass costs (the
target for 1 … 17 rows, the draft model for 1 … 17 rows, at the answers' typical context) and
replays drafting step by step on the token ids: the real PromptLookupDrafter; for the draft
model its greedy predictions along the answer, from one teacher-forced pass per answer (while
its drafts are accepted, its rollout is exactly those predictions; after its first wrong token
the replay keeps drafting while the model was confident on the answer's own path, a proxy for
its confidence on its wrong path, which a teacher-forced pass cannot see).  Decode
time is the sum of forward passes (sampling and bookkeeping, ~3% of a real step, are left out).

Configurations:
  model, prompt-lookup, hybrid   as in drafters.py (threshold --draft-p, fixed --draft-n): the
                                 measured speedups of that run check the replay
  lookup-perfect                 lookup that drafts exactly the tokens that will be accepted (a
                                 bound for any draft-length policy on prompt lookup)
  hybrid-perfect                 the same for the hybrid's lookup and model drafts
  any-match                      among every earlier occurrence of the context's last two
                                 tokens, the continuation that proves right for longest,
                                 drafted exactly as far as it is accepted (a bound for any
                                 n-gram or suffix lookup, several candidates verified at once
                                 as a tree included, at the cost of one)
  oracle-copy                    lookup where it matches, elsewhere a free and always accepted
                                 draft of --draft-n tokens (a bound for any second drafter)
  suffix                         the suffix drafter at fixed --draft-n, its store warmed as in
                                 drafters.py (the set's other answers; multi_turn: the earlier
                                 requests of the group)

The what-if grid scales the measured costs: a verification row costs s_v times what it costs
here (the extra time of an M-row pass over a one-row pass) and a draft-model pass s_d times,
to show how much cheaper each would have to be for the hybrid to reach --goal.

    python benchmarks/replay.py --no-mmap --out bench-results      # reads bench-results/drafters.json
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

import specdec
from common import QWEN_DRAFT, QWEN_TARGET, forward_ms, load_prompts, machine_info, write_json
from drafters import warm_store
from specdec.speculation.drafters import PromptLookupDrafter, SuffixDrafter

MS = range(1, 18)                       # rows per forward pass measured (draft-n up to 16, + 1)
SCALES = (1.0, 0.75, 0.5, 0.35, 0.25)   # what-if factors for verification rows and draft passes


def cost_curve(model, n_past: int, n_logits: int | None = None) -> dict[int, float]:
    """Milliseconds of one forward pass over M rows after n_past cached tokens, M in MS: the
    target's with logits for every row (verification), the draft's (n_logits given) with the
    last row's only, over its first n_logits ids (its catch-up passes)."""
    return {m: forward_ms(model, m, n_past=n_past, n_logits=n_logits, last_only=bool(n_logits))
            for m in MS}


def teacher_forced(draft, prompt_ids: list[int], ids: list[int], n_logits: int):
    """The draft model's greedy guess and top probability after every prefix of the answer:
    pred[t], top[t] for the token at position t+1 of prompt + answer."""
    seq = prompt_ids + ids
    s = draft.session(len(seq) + 1, n_logits=n_logits)
    logits = s.eval(seq)                                               # (T, n_logits)
    z = np.exp(logits - logits.max(axis=1, keepdims=True))
    return logits.argmax(axis=1), (z.max(axis=1) / z.sum(axis=1))


class Costs:
    """Forward times, optionally scaled: verify(M) = T1 + s_v · (T(M) − T1), draft(M) = s_d · D(M)."""

    def __init__(self, target: dict, draft: dict, s_v: float = 1.0, s_d: float = 1.0):
        self.t, self.d, self.s_v, self.s_d = target, draft, s_v, s_d

    def verify(self, n_draft: int) -> float:
        m = min(n_draft + 1, max(self.t))
        return self.t[1] + self.s_v * (self.t[m] - self.t[1])

    def draft(self, rows: int) -> float:
        return self.s_d * self.d[min(max(rows, 1), max(self.d))]


def best_match(seq: list[int], L: int, n: int) -> list[int]:
    """The longest seq[L:L+k], k <= n, that follows an earlier occurrence of seq[L-2:L]."""
    a, b, best = seq[L - 2], seq[L - 1], 0
    for j in range(2, L):
        if seq[j - 2] == a and seq[j - 1] == b:
            k = 0
            while k < n and seq[j + k] == seq[L + k]:
                k += 1
            best = max(best, k)
    return seq[L:L + best]


def replay(config: str, prompt_ids: list[int], answer: list[int], tf, costs: Costs, a,
           store=None) -> float:
    """Decode milliseconds of ``config`` producing ``answer`` (its first token comes from the
    prefill; answer ends with the end-of-generation token); store: the suffix config's."""
    seq, pred, top = prompt_ids + answer, tf[0], tf[1]
    L, end = len(prompt_ids) + 1, len(seq)
    lookup = PromptLookupDrafter(max(seq) + 1, a.lookup_ngram_max, a.lookup_ngram_min, copy_ratio=a.lookup_copy_ratio)
    if config == "suffix":                      # (the vocabulary bound only stops ids past it)
        lookup = SuffixDrafter(1 << 30, store, a.lookup_ngram_max, a.lookup_ngram_min,
                               copy_ratio=a.lookup_copy_ratio)
    cached = L - 1                              # draft-model cache: prefilled with the prompt
    total = 0.0
    while L < end:
        n = min(a.draft_n, end - L)
        d: list[int] = []
        spent = 0.0
        use_lookup = config in ("prompt-lookup", "lookup-perfect", "oracle-copy", "suffix") or (
            config.startswith("hybrid") and lookup.match(seq[:L]) is not None)
        if config == "any-match":
            d = best_match(seq, L, n)
        elif use_lookup:
            d = lookup.tokens(seq[:L], n)
            if not d and config == "oracle-copy":
                d = seq[L:L + n]                # free, always right
        elif config in ("model", "hybrid", "hybrid-perfect"):
            keep = min(cached, L - 1)           # the drafter re-feeds what it has not seen
            spent += costs.draft(L - keep)
            cached = L
            for i in range(n):                  # rollout = teacher-forced guesses while right
                if top[L - 1 + i] < a.draft_p:
                    break
                if i > 0:
                    spent += costs.draft(1)
                    cached += 1
                d.append(int(pred[L - 1 + i]))
        acc = 0
        while acc < len(d) and d[acc] == seq[L + acc]:
            acc += 1
        if config.endswith("perfect"):
            d = d[:acc]
        cached = min(cached, L + acc)
        total += spent + costs.verify(len(d))
        L += acc + 1
    return total


def run(answers: dict, tfs: dict, costs: Costs, configs, a, prompts=()) -> dict:
    """Speedup over plain (replayed) per configuration, pooled over the answers of a set
    (prompts: the set's records, for the suffix config's stores)."""
    plain = sum(costs.verify(0) * (len(r["ids"])) for r in answers.values())
    recs = [r for r in prompts if r["id"] in answers]
    at = {r["id"]: i for i, r in enumerate(recs)}
    out = {}
    for c in configs:
        if c == "suffix" and len(at) < len(answers):
            continue                            # (a set whose records are not at hand)
        t = sum(replay(c, r["prompt_ids"], r["ids"] + [a.eog], tfs[p], costs, a,
                       warm_store(recs, at[p], answers) if c == "suffix" else None)
                for p, r in answers.items())
        out[c] = round(plain / t, 3)
    return out


def plot(grid: dict, goal: float, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    sets = list(grid)
    fig, axes = plt.subplots(1, len(sets), figsize=(5.2 * len(sets), 4.2))
    for ax, s in zip(np.atleast_1d(axes), sets):
        z = np.array([[grid[s][f"{sv}/{sd}"] for sd in SCALES] for sv in SCALES])
        im = ax.imshow(z, cmap="viridis", origin="upper")
        for i in range(len(SCALES)):
            for j in range(len(SCALES)):
                ax.text(j, i, f"{z[i, j]:.2f}", ha="center", va="center", fontsize=8,
                        color="red" if z[i, j] >= goal else "white")
        ax.set_xticks(range(len(SCALES)), [str(v) for v in SCALES])
        ax.set_yticks(range(len(SCALES)), [str(v) for v in SCALES])
        ax.set_xlabel("draft-model pass cost, x measured")
        ax.set_ylabel("verification row cost, x measured")
        ax.set_title(f"{s}: best replayed speedup (red: >= {goal})", fontsize=10)
        fig.colorbar(im, ax=ax, shrink=0.8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--drafters", default=None,
                    help="a drafters.py result with recorded answers (greedy run; default: "
                         "drafters.json in --out)")
    ap.add_argument("--goal", type=float, default=2.5)
    ap.add_argument("--out", default="bench-results")
    ap.add_argument("--no-mmap", action="store_true", help="read the model files into memory")
    a = ap.parse_args()
    a.drafters = a.drafters or str(Path(a.out) / "drafters.json")
    if not Path(a.drafters).is_file():
        raise SystemExit(f"{a.drafters}: no such file (run benchmarks/drafters.py first)")
    src = json.loads(Path(a.drafters).read_text())
    st = src["settings"]
    for k in ("draft_n", "draft_p", "lookup_ngram_min", "lookup_ngram_max", "lookup_copy_ratio", "draft_vocab"):
        setattr(a, k, st[k])
    sets = {s: r["answers"] for s, r in src["results"].items() if r.get("answers")}
    if not sets:
        raise SystemExit(f"{a.drafters}: no recorded answers (rerun benchmarks/drafters.py at --temp 0)")
    target = specdec.load(QWEN_TARGET, n_ctx=2048, mmap=False if a.no_mmap else None)
    draft = specdec.load(QWEN_DRAFT, n_ctx=2048, mmap=False if a.no_mmap else None)
    a.eog = target.tokenize("<|im_end|>")[-1]
    lengths = [len(r["prompt_ids"]) + len(r["ids"]) // 2 for ans in sets.values() for r in ans.values()]
    n_past = int(np.median(lengths))
    t_curve = cost_curve(target, n_past)
    d_curve = cost_curve(draft, n_past, n_logits=a.draft_vocab)
    print(f"context {n_past}: target M=1 {t_curve[1]:.1f} ms, M=9 {t_curve[9]:.1f}, M=17 "
          f"{t_curve[17]:.1f}; draft M=1 {d_curve[1]:.1f} ms, M=4 {d_curve[4]:.1f}", flush=True)
    configs = ("model", "prompt-lookup", "hybrid", "lookup-perfect", "hybrid-perfect", "any-match", "oracle-copy",
               "suffix")
    results, grid = {}, {}
    for s, answers in sets.items():
        tfs = {p: teacher_forced(draft, r["prompt_ids"], r["ids"] + [a.eog], a.draft_vocab)
               for p, r in answers.items()}
        try:
            prompts = load_prompts(s)
        except OSError:
            prompts = []
        replayed = run(answers, tfs, Costs(t_curve, d_curve), configs, a, prompts)
        measured = {c: m["speedup"] for c, m in src["results"][s]["summary"].items()}
        results[s] = {"replayed": replayed, "measured": measured}
        grid[s] = {}
        for sv in SCALES:
            for sd in SCALES:
                r = run(answers, tfs, Costs(t_curve, d_curve, sv, sd), ("prompt-lookup", "hybrid"), a)
                grid[s][f"{sv}/{sd}"] = max(r.values())
        print(f"{s}: replayed {replayed}\n{' ' * len(s)}  measured {measured}", flush=True)
    out = Path(a.out)
    write_json(out / "replay.json", {
        "machine": machine_info(), "target": QWEN_TARGET, "draft": QWEN_DRAFT,
        "source": str(a.drafters), "source_date": src["machine"]["date"], "settings": st,
        "context": n_past, "target_ms": {str(k): round(v, 2) for k, v in t_curve.items()},
        "draft_ms": {str(k): round(v, 2) for k, v in d_curve.items()}, "goal": a.goal,
        "results": results, "what_if": {"scales": list(SCALES), "best_speedup": grid,
                                         "key": "verification-row scale / draft-pass scale"}})
    plot(grid, a.goal, out / "replay.png")
    print(f"wrote {out / 'replay.json'} and {out / 'replay.png'}")


if __name__ == "__main__":
    main()
