"""`specdec trace-report`: a speculative-decoding trace (docs/trace-format.md) as one PNG.

Four panels, p the target's distribution and q the draft's:
  1. acceptance by draft position: measured P(accept at i | i reached) beside the predicted
     mean of 1 - TV(p_i, q_i) over the same reached positions;
  2. the distribution of p(x)/q(x) over drafted tokens (x is accepted with probability
     min(1, p/q), so everything right of 1 is accepted for sure);
  3. tokens emitted (and drafted) per verification step over the request;
  4. predicted acceptance 1 - TV(p, q) beside the measured acceptance, cumulative over steps.
Multi-candidate traces (--draft-tree) add a line on their branches: candidates per step and
which branch won; the panels show each step's verified branch.

``load_trace`` is the one reader of a trace file (the tests' too).
matplotlib is an optional dependency (the `bench` extra): it is imported only here, with the
Agg backend, and its absence is a one-line error.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from ..errors import ConfigError, SpecdecError
from ..speculation.trace import StepRecord


class MissingExtraError(SpecdecError):
    """An optional dependency is not installed."""


def pyplot():
    """matplotlib.pyplot on the Agg backend, or a one-line error saying how to install it."""
    try:
        import matplotlib
    except ImportError:
        raise MissingExtraError("plots need matplotlib: pip install 'specdec[bench]' "
                                "(or pip install matplotlib)") from None
    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt
    return plt


def load_trace(path: str | Path) -> list[StepRecord]:
    """The records of a JSONL trace; one-line errors for a missing, empty or foreign file."""
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except OSError as e:
        raise ConfigError(f"{path}: {e.strerror or e}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{path}: not a trace (not UTF-8 text)") from None
    records = []
    for i, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            records.append(StepRecord.from_json(line))
        except (ValueError, TypeError) as e:
            msg = " ".join(str(e).split())[:120]
            raise ConfigError(f"{path}: line {i} is not a trace record ({msg})") from None
    if not records:
        raise ConfigError(f"{path}: the trace has no records")
    return records


def summarize(records: list[StepRecord]) -> dict:
    """The numbers the plots show (pure)."""
    n_pos = max((len(r.drafted) for r in records), default=0)
    reached = np.zeros(n_pos, np.int64)          # (n_pos,)
    accepted = np.zeros(n_pos, np.int64)         # (n_pos,)
    alpha = np.zeros(n_pos, np.float64)          # (n_pos,) summed over reached positions
    for r in records:
        for i, ok in enumerate(r.accepted):
            if ok is None:
                break
            reached[i] += 1
            accepted[i] += bool(ok)
            alpha[i] += r.alpha[i]
    n_drafted = sum(r.n_nodes or len(r.drafted) for r in records)
    n_emitted = sum(len(r.emitted) for r in records)
    n_reached, n_accepted = int(reached.sum()), int(accepted.sum())
    return {
        "n_steps": len(records), "n_drafted": n_drafted, "n_accepted": n_accepted,
        "n_emitted": n_emitted, "n_verified": n_reached,
        "acceptance_rate": n_accepted / n_drafted if n_drafted else 0.0,
        "tokens_per_step": n_emitted / len(records) if records else 0.0,
        "measured_acceptance": n_accepted / n_reached if n_reached else 0.0,
        "predicted_acceptance": float(alpha.sum() / n_reached) if n_reached else 0.0,
        "by_position": [{"position": i + 1, "reached": int(reached[i]), "accepted": int(accepted[i]),
                         "measured": float(accepted[i] / reached[i]) if reached[i] else None,
                         "predicted": float(alpha[i] / reached[i]) if reached[i] else None}
                        for i in range(n_pos)],
        "branches": branches(records),
    }


def branches(records: list[StepRecord]) -> dict:
    """Multi-candidate steps: how many candidates they verified, and how often the verified
    branch was the first one (a linear draft would have found the same) or another."""
    tree = [r for r in records if r.n_branches > 1]
    won = np.bincount([r.branch for r in tree if r.n_accepted > 0], minlength=1)
    return {"n_tree_steps": len(tree),
            "mean_branches": float(np.mean([r.n_branches for r in tree])) if tree else 0.0,
            "won_by_branch": [int(c) for c in won],          # [b]: steps whose accepted path is on branch b
            "won_off_first": int(won[1:].sum())}


def branches_line(s: dict) -> str:
    """One line on the candidates of multi-candidate steps, '' when there were none."""
    b = s["branches"]
    if not b["n_tree_steps"]:
        return ""
    won = " ".join(f"{i}:{c}" for i, c in enumerate(b["won_by_branch"]))
    return (f"branches: {b['n_tree_steps']} tree steps, {b['mean_branches']:.2f} candidates per step; "
            f"steps that accepted a token, by winning branch {won}; {b['won_off_first']} won off the first branch")


def trace_report(trace_path: str | Path, out_png: str | Path | None = None) -> tuple[Path, dict]:
    """Write the PNG (default: the trace's path with .png) and return (its path, summary)."""
    records = load_trace(trace_path)
    plt = pyplot()
    out = Path(out_png) if out_png else Path(trace_path).with_suffix(".png")
    s = summarize(records)
    fig, ax = plt.subplots(2, 2, figsize=(12, 8))
    _by_position(ax[0, 0], s)
    _ratios(ax[0, 1], records)
    _tokens_per_step(ax[1, 0], records)
    _predicted_vs_measured(ax[1, 1], records)
    title = (f"{Path(trace_path).name}: {s['n_steps']} steps, {s['n_emitted']} tokens, "
             f"{s['tokens_per_step']:.2f} tokens/step; {s['acceptance_rate']:.1%} of drafted tokens "
             f"accepted; at verified positions measured {s['measured_acceptance']:.1%}, predicted "
             f"{s['predicted_acceptance']:.1%}")
    fig.suptitle(title + ("\n" + branches_line(s) if branches_line(s) else ""), fontsize=10)
    fig.tight_layout()
    try:
        fig.savefig(out, dpi=110)
    except OSError as e:
        raise ConfigError(f"{out}: {e.strerror or e}") from None
    finally:
        plt.close(fig)
    return out, s


def _empty(ax, title: str) -> None:
    ax.set_title(title)
    ax.text(0.5, 0.5, "nothing drafted", ha="center", va="center", transform=ax.transAxes)


def _by_position(ax, s: dict) -> None:
    title = "acceptance by draft position"
    rows = [r for r in s["by_position"] if r["reached"]]
    if not rows:
        return _empty(ax, title)
    x = np.array([r["position"] for r in rows])
    ax.bar(x - 0.2, [r["measured"] for r in rows], 0.4, label="measured")
    ax.bar(x + 0.2, [r["predicted"] for r in rows], 0.4, label="predicted 1 - TV(p, q)", color="0.65")
    for r in rows:
        ax.text(r["position"], 1.02, str(r["reached"]), ha="center", fontsize=7, color="0.3")
    ax.set_ylim(0, 1.3)
    ax.set_xticks(x)
    ax.set_xlabel("draft position i (number above: times reached)")
    ax.set_ylabel("P(accept | reached)")
    ax.set_title(title)
    ax.legend(fontsize=8, loc="upper center", ncol=2)


def _ratios(ax, records: list[StepRecord]) -> None:
    title = "p(x) / q(x) of drafted tokens"
    ratio = np.array([v for r in records for v in r.ratio], dtype=np.float64)
    if ratio.size == 0:
        return _empty(ax, title)
    floor = 1e-6
    logs = np.log10(np.maximum(ratio, floor))
    ax.hist(logs, bins=40, color="tab:purple")
    ax.axvline(0.0, color="k", lw=0.8)
    ax.set_xlabel(f"log10 p/q   (right of 0: accepted for sure; p/q < {floor:g} shown at {np.log10(floor):.0f})")
    ax.set_ylabel("drafted tokens")
    ax.set_title(f"{title}: {np.mean(ratio >= 1):.0%} have p >= q")


def _tokens_per_step(ax, records: list[StepRecord]) -> None:
    steps = np.arange(len(records))
    emitted = np.array([len(r.emitted) for r in records], dtype=np.float64)
    drafted = np.array([len(r.drafted) for r in records], dtype=np.float64)
    ax.plot(steps, drafted, color="0.75", lw=0.8, label="drafted")
    ax.plot(steps, emitted, ".", ms=3, label="emitted")
    w = max(1, min(20, len(records) // 5))
    if len(records) >= w > 1:
        ax.plot(steps[w - 1:], np.convolve(emitted, np.ones(w) / w, "valid"), lw=1.5,
                label=f"emitted, mean of {w}")
    ax.set_xlabel("verification step")
    ax.set_ylabel("tokens")
    ax.set_title("tokens per step over time")
    ax.legend(fontsize=8)


def _predicted_vs_measured(ax, records: list[StepRecord]) -> None:
    title = "predicted vs measured acceptance (cumulative)"
    reached = np.array([sum(a is not None for a in r.accepted) for r in records], dtype=np.float64)
    if reached.sum() == 0:
        return _empty(ax, title)
    acc = np.array([r.n_accepted for r in records], dtype=np.float64)
    alpha = np.array([sum(r.alpha[: int(k)]) for r, k in zip(records, reached)], dtype=np.float64)
    n = np.maximum(np.cumsum(reached), 1)
    steps = np.arange(len(records))
    ax.plot(steps, np.cumsum(acc) / n, label="measured: accepted / verified")
    ax.plot(steps, np.cumsum(alpha) / n, "--", label="predicted: mean 1 - TV(p_i, q_i)")
    ax.set_ylim(0, 1.05)
    ax.set_xlabel("verification step")
    ax.set_ylabel("acceptance")
    ax.set_title(title)
    ax.legend(fontsize=8, loc="lower right")
