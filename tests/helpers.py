"""Helpers that several test modules share: the llama.cpp reference records, the pair
factories' parametrization, sampling strategies, the target's exact output law, a list trace.

p is always the target's distribution, q the draft's.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import strategies as st

from fakes import PAIR_FACTORIES
from specdec.sampling import SamplerParams, probs
from specdec.trace import StepRecord

REFERENCE = Path(__file__).parent / "data" / "reference"
RECORDS = [json.loads(line) for line in open(REFERENCE / "llamacpp.jsonl", encoding="utf-8")]
MARGIN = 0.5             # greedy ids must match llama.cpp's up to its first top-2 margin below this


def greedy_records(model_id: str) -> list[dict]:
    return [r for r in RECORDS if r["kind"] == "greedy" and r["model"] == model_id]


def first_low_margin(margins) -> int:
    return next((i for i, m in enumerate(margins) if m < MARGIN), len(margins))


def perplexity(m, tokens: list[int], n_ctx: int, chunks: int) -> float:
    """llama-perplexity: chunk, BOS in place of each chunk's first token when the model adds
    BOS, score positions n_ctx/2 .. n_ctx-2 against the next token."""
    nll, count = 0.0, 0
    for c in range(chunks):
        chunk = list(tokens[c * n_ctx:(c + 1) * n_ctx])
        if m.tokenizer.add_bos:
            chunk[0] = m.tokenizer.bos_id
        logits = m.logits(chunk).astype(np.float64)                  # (n_ctx, V)
        for j in range(n_ctx // 2, n_ctx - 1):
            row = logits[j]
            mx = row.max()
            lse = mx + np.log(np.exp(row - mx).sum())
            nll += lse - row[chunk[j + 1]]
            count += 1
    return float(np.exp(nll / count))


factories = pytest.mark.parametrize("factory", list(PAIR_FACTORIES.values()), ids=list(PAIR_FACTORIES))


class ListTrace:
    def __init__(self, check=None):
        self.records: list[StepRecord] = []
        self.check = check

    def write(self, record: StepRecord) -> None:
        self.records.append(record)
        if self.check:
            self.check(record)


def target_law(session, prompt, n_predict, params, eog):
    """{(ids, stop_reason): probability} of sampling the target alone, from its logits."""
    law: dict = {}

    def rec(prefix, pr):
        if len(prefix) == n_predict:
            law[(tuple(prefix), "n_predict")] = law.get((tuple(prefix), "n_predict"), 0.0) + pr
            return
        session.reset()
        p = probs(session.eval(list(prompt) + prefix)[-1], params)       # (V,)
        for y in np.flatnonzero(p):
            if int(y) in eog:
                key = (tuple(prefix), "eog")
                law[key] = law.get(key, 0.0) + pr * p[y]
            else:
                rec(prefix + [int(y)], pr * p[y])
    rec([], 1.0)
    return law


sampling_params = st.builds(
    SamplerParams, temperature=st.floats(0.7, 1.5),
    top_k=st.sampled_from([0, 0, 2, 3]), top_p=st.sampled_from([1.0, 1.0, 0.7, 0.9]),
    min_p=st.sampled_from([0.0, 0.0, 0.05, 0.2]))
