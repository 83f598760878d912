"""`specdec check`: does speculation change anything on my prompts?

Greedy (the default): each prompt is generated plainly and speculatively (the drafting flags
of `specdec run`), and the two token lists must be the same; a divergence is reported with its
position, both tokens as text and the target's top-2 logit margin there (a margin near 0 is a
tie the float arithmetic may break either way — a kernel question, not a speculation one).

Sampled (`--temp T --samples K`): K seeded runs of each generate the first token after each
prompt, whose law is known exactly (the target's warped distribution p over its logits), and
a chi-square goodness-of-fit test compares the counts with K·p: bins of expected count >= 5,
the rest pooled; the statistic's null distribution and the test's power are simulated with
multinomial draws (no SciPy), the power against the alternative that moves `--shift` of p's
mass from its most likely token to the next.  Verdict at significance `--alpha`.

p is always the target's distribution, q the draft's.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import ConfigError
from ..generation.constraint import compile_constraint, masked
from ..generation.sampling import SamplerParams, probs_rows

N_SIMULATIONS = 4000        # multinomial draws for the null distribution and the power


@dataclass(frozen=True)
class GreedyCheck:
    index: int
    identical: bool
    n_tokens: int
    position: int | None = None       # first index where the token lists differ
    plain: str = ""                   # the plain token there, as text
    speculative: str = ""             # the speculative one
    margin: float | None = None       # the target's top-1 minus top-2 logit there


@dataclass(frozen=True)
class SampledCheck:
    index: int
    samples: int
    n_bins: int
    chi2: float
    p_value: float
    power: float
    consistent: bool
    plain_p_value: float


def read_prompts(prompt: str | None, path: str | None) -> list[dict]:
    """[{'prompt': text} | {'messages': [...]}] from -p, or -f: JSONL records with 'prompt' or
    'messages', or a text file of one prompt a line (blank lines skipped)."""
    if (prompt is None) == (path is None):
        raise ConfigError("specdec check takes -p TEXT or -f PROMPTS (one of them)")
    if prompt is not None:
        return [{"prompt": prompt}]
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"-f {path}: {getattr(e, 'strerror', None) or e}") from None
    lines = [ln for ln in text.splitlines() if ln.strip()]
    if not path.endswith(".jsonl"):
        return [{"prompt": ln} for ln in lines]
    out = []
    for i, ln in enumerate(lines, 1):
        try:
            rec = json.loads(ln)
        except ValueError:
            raise ConfigError(f"-f {path}: line {i} is not JSON") from None
        if not isinstance(rec, dict) or not (isinstance(rec.get("prompt"), str)
                                             or isinstance(rec.get("messages"), list)):
            raise ConfigError(f"-f {path}: line {i} needs a 'prompt' string or a 'messages' list")
        out.append({"messages": rec["messages"]} if "messages" in rec else {"prompt": rec["prompt"]})
    if not out:
        raise ConfigError(f"-f {path}: no prompt in it")
    return out


def first_divergence(a: list[int], b: list[int]) -> int | None:
    """The first index where a and b differ (one ending first counts), or None."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def check_greedy(target, ids: list[int], n_predict: int, draft, index: int, **kw) -> GreedyCheck:
    """Plain vs speculative greedy generation of one prompt's ids."""
    plain = target.generate(ids, n_predict, temperature=0.0, **kw).ids
    spec = target.generate(ids, n_predict, temperature=0.0, draft=draft, **kw).ids
    at = first_divergence(plain, spec)
    if at is None:
        return GreedyCheck(index, True, len(plain))
    logits = target.logits([*ids, *plain[:at]])[-1]          # (V,) where they part
    top = np.sort(logits)[-2:]
    tok = (lambda seq: target.detokenize([seq[at]]) if at < len(seq) else "<end>")
    return GreedyCheck(index, False, len(plain), at, tok(plain), tok(spec), float(top[1] - top[0]))


def _end(target) -> int:
    return min(target.tokenizer.eog_ids) if target.tokenizer.eog_ids else 0


def chi2_test(counts: np.ndarray, p: np.ndarray, shift: float, alpha: float,
              rng: np.random.Generator) -> tuple[int, float, float, float]:
    """(bins, X², Monte Carlo p-value, power against the shifted alternative) of counts (V,)
    drawn from p (V,); module docstring."""
    k = int(counts.sum())
    order = np.argsort(-p)
    big = order[p[order] * k >= 5]                            # own bins; the rest pooled
    rest = np.setdiff1d(np.arange(len(p)), big)
    pb = np.append(p[big], p[rest].sum()) if len(rest) else p[big]
    cb = np.append(counts[big], counts[rest].sum()) if len(rest) else counts[big]
    if len(pb) > 1 and pb[-1] * k < 5 and len(rest):          # a thin pool joins the last bin
        pb, cb = np.append(pb[:-2], pb[-2:].sum()), np.append(cb[:-2], cb[-2:].sum())
    if len(pb) < 2:
        return len(pb), 0.0, 1.0, 0.0                          # one outcome: nothing to test
    exp = k * pb

    def stat(c):
        return (((c - exp) ** 2) / exp).sum(axis=-1)
    null = stat(rng.multinomial(k, pb / pb.sum(), size=N_SIMULATIONS))
    x2 = float(stat(cb))
    p_value = (1 + int((null >= x2).sum())) / (1 + N_SIMULATIONS)
    alt = pb.copy()
    move = min(shift, alt[0])
    alt[0] -= move
    alt[1] += move
    crit = np.quantile(null, 1 - alpha)
    power = float((stat(rng.multinomial(k, alt / alt.sum(), size=N_SIMULATIONS)) > crit).mean())
    return len(pb), x2, p_value, power


def check_sampled(target, ids: list[int], params: SamplerParams, samples: int, draft, index: int,
                  shift: float, alpha: float, seed: int, constraint=None, **kw) -> SampledCheck:
    """The first token after ids: K seeded speculative runs (two tokens each, so that the
    first is drafted and verified) against p, and K plain runs as the control.  constraint
    (a ConstraintSpec): both under it, p its masked law."""
    logits = target.logits(ids)[-1:]                           # (1, V)
    if constraint is not None:
        first = compile_constraint(constraint, target.tokenizer, int(target.config.n_vocab))
        logits, kw = masked(logits, first.mask()[None]), dict(kw, constraint=constraint)
    p = probs_rows(logits, params)[0]                          # (V,) the exact law
    rng = np.random.default_rng(seed)
    sp = dict(temperature=params.temperature, top_k=params.top_k, top_p=params.top_p,
              min_p=params.min_p, ignore_eos=True, **kw)
    counts = {}
    for name, d in (("speculative", draft), ("plain", None)):
        c = np.zeros(len(p), np.int64)
        for s in range(samples):
            out = target.generate(ids, 2, seed=seed * 100003 + s, draft=d, **sp).ids
            c[out[0] if out else _end(target)] += 1             # nothing: the end came first
        counts[name] = c
    bins, x2, pv, power = chi2_test(counts["speculative"], p, shift, alpha, rng)
    plain_pv = chi2_test(counts["plain"], p, shift, alpha, rng)[2]
    return SampledCheck(index, samples, bins, x2, pv, power, pv > alpha, plain_pv)
