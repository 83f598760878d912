"""The server's counters and gauges, rendered in the Prometheus text exposition format
(version 0.0.4) for `GET /metrics`.

The scheduler thread updates them under one lock; the HTTP thread renders a snapshot.  Names
start with `specdec_`; counters end in `_total`.  Written by hand (a few dozen lines) rather
than with prometheus_client: no global registry, one instance per server.
"""
from __future__ import annotations

import threading
from collections import Counter


class Metrics:
    """Counters of the requests, tokens, drafting and steps of one server."""

    def __init__(self):
        self.lock = threading.Lock()
        self.requests = Counter()            # finish status -> count (ok, error, cancelled, rejected)
        self.prompt_tokens = 0
        self.generated_tokens = 0
        self.draft_tokens = 0                # drafted tokens verified by the target
        self.draft_accepted = 0
        self.steps = 0                       # batched target passes
        self.step_rows = 0                   # rows over all of them
        self.step_sequences = 0              # sequences over all of them (sum of batch sizes)
        self.step_seconds = 0.0
        self.capped_steps = 0                # greedy steps whose draft the load cap shortened
        self.prefill_chunks = 0              # prompt chunks run ahead of a prompt's last one
        self.last_batch_size = 0
        self.last_batch_rows = 0

    def request_done(self, status: str, n_prompt: int = 0, n_generated: int = 0,
                     n_drafted: int = 0, n_accepted: int = 0) -> None:
        with self.lock:
            self.requests[status] += 1
            self.prompt_tokens += n_prompt
            self.generated_tokens += n_generated
            self.draft_tokens += n_drafted
            self.draft_accepted += n_accepted

    def step_done(self, n_sequences: int, n_rows: int, seconds: float) -> None:
        with self.lock:
            self.steps += 1
            self.step_rows += n_rows
            self.step_sequences += n_sequences
            self.step_seconds += seconds
            self.last_batch_size, self.last_batch_rows = n_sequences, n_rows

    def prefill_chunk_done(self) -> None:
        with self.lock:
            self.prefill_chunks += 1

    def render(self, gauges: dict[str, tuple[str, float]],
               draft_caps: dict[str, dict[int, int | None]]) -> str:
        """The exposition text: these counters, the scheduler's gauges {name: (help, value)}
        and the draft cap per drafter and batch size {drafter: {B: cap}} (-1: uncapped)."""
        out: list[str] = []

        def metric(name: str, kind: str, help_: str, samples) -> None:
            out.append(f"# HELP specdec_{name} {help_}")
            out.append(f"# TYPE specdec_{name} {kind}")
            for labels, value in samples:
                lab = "{" + ",".join(f'{k}="{v}"' for k, v in labels.items()) + "}" if labels else ""
                out.append(f"specdec_{name}{lab} {_num(value)}")

        with self.lock:
            statuses = dict(self.requests)
            for s in ("ok", "error", "cancelled", "rejected"):
                statuses.setdefault(s, 0)
            metric("requests_total", "counter", "requests finished, by status",
                   [({"status": s}, n) for s, n in sorted(statuses.items())])
            metric("prompt_tokens_total", "counter", "prompt tokens of finished requests",
                   [({}, self.prompt_tokens)])
            metric("tokens_predicted_total", "counter", "tokens generated",
                   [({}, self.generated_tokens)])
            metric("draft_tokens_total", "counter", "drafted tokens verified by the target",
                   [({}, self.draft_tokens)])
            metric("draft_accepted_total", "counter", "drafted tokens accepted",
                   [({}, self.draft_accepted)])
            metric("draft_acceptance_ratio", "gauge", "draft_accepted_total / draft_tokens_total",
                   [({}, self.draft_accepted / self.draft_tokens if self.draft_tokens else 0.0)])
            metric("steps_total", "counter", "batched target forward passes", [({}, self.steps)])
            metric("step_rows_total", "counter", "rows evaluated over all steps", [({}, self.step_rows)])
            metric("step_sequences_total", "counter", "sum over steps of the batch size",
                   [({}, self.step_sequences)])
            metric("step_seconds_total", "counter", "seconds spent in steps (drafting included)",
                   [({}, self.step_seconds)])
            metric("batch_size_mean", "gauge", "mean sequences per step",
                   [({}, self.step_sequences / self.steps if self.steps else 0.0)])
            metric("batch_size", "gauge", "sequences in the last step", [({}, self.last_batch_size)])
            metric("batch_rows", "gauge", "rows in the last step", [({}, self.last_batch_rows)])
            metric("draft_capped_steps_total", "counter",
                   "greedy speculative steps whose draft length the load cap lowered",
                   [({}, self.capped_steps)])
            metric("prefill_chunks_total", "counter",
                   "prompt chunks evaluated ahead of a prompt's last one (--prefill-chunk)",
                   [({}, self.prefill_chunks)])
        for name, (help_, value) in gauges.items():
            metric(name, "gauge", help_, [({}, value)])
        metric("draft_cap", "gauge", "most tokens a greedy request drafts per step at a batch "
               "size from this one up (-1: its own policy, uncapped); sampled requests are never capped",
               [({"drafter": d, "batch_size": str(b)}, -1 if c is None else c)
                for d, table in draft_caps.items() for b, c in sorted(table.items())])
        return "\n".join(out) + "\n"


def _num(v: float) -> str:
    return str(int(v)) if isinstance(v, int) or float(v).is_integer() else f"{v:.6g}"
