"""Log-probabilities of the generated tokens, and their two OpenAI wire formats.

p is the target's distribution.  Every token a request emits was drawn from one row of the
target's logits: plain decoding samples the last row of a pass, speculative decoding accepts
or resamples position j of a verification pass from row j (interfaces.Eval).  The k-th
token a request's coroutine emits while it handles one pass's logits belongs to row k of
those logits (`RowCursor`), so the same code gives every kind of request its rows.  Because
the rows are bitwise the same alone, in a batch, split over chunks or verified after a
draft (the kernels are row independent), so are the numbers computed from them.

Two distributions, as llama-server offers them:
  * default: the model's own next-token distribution, log softmax(logits) at temperature 1
    with no filters (what OpenAI and llama-server report);
  * post_sampling: sampling.probs(logits, params), the warped distribution the sampler
    draws from (top-k, top-p, min-p, temperature; a one-hot at temperature 0); only ids of
    non-zero probability are listed, so no value is ever -inf.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ...generation.sampling import SamplerParams, probs

MAX_TOP = 20            # most alternatives per token (OpenAI's limit for top_logprobs)


@dataclass(frozen=True)
class TokenLogprob:
    """One emitted token: its log-probability under p and the n_top most likely ids."""
    token: int
    logprob: float
    top: tuple[tuple[int, float], ...]      # (id, logprob), descending, ties: lowest id first


def token_logprob(row: np.ndarray, token: int, n_top: int,
                  params: SamplerParams | None = None) -> TokenLogprob:
    """row (V,) float32 logits -> TokenLogprob of `token`.  params None: log softmax at
    temperature 1; else the log of sampling.probs(row, params) (post-sampling)."""
    x = np.asarray(row, dtype=np.float64)                     # (V,)
    if params is None:
        lp = x - (x.max() + math.log(np.exp(x - x.max()).sum()))   # (V,) log softmax
    else:
        pr = probs(x, params)                                  # (V,)
        lp = np.full(x.size, -np.inf)
        nz = pr > 0
        lp[nz] = np.log(pr[nz])
    top: tuple[tuple[int, float], ...] = ()
    if n_top > 0:
        k = min(n_top, x.size)
        cand = np.argpartition(-lp, k - 1)[:k]                 # (k,) unsorted
        cand = cand[np.lexsort((cand, -lp[cand]))]             # descending, then ascending id
        top = tuple((int(i), float(lp[i])) for i in cand if np.isfinite(lp[i]))
    return TokenLogprob(int(token), float(lp[token]), top)


class RowCursor:
    """Which logits row the next emitted token was drawn from: `feed` the logits a request
    is sent (M, V), then `take()` once per token it emits while handling them."""

    def __init__(self):
        self.rows, self.k = None, 0

    def feed(self, logits: np.ndarray) -> None:
        self.rows, self.k = logits, 0

    def take(self) -> np.ndarray:
        if self.rows is None or self.k >= len(self.rows):
            raise RuntimeError("a token was emitted without a logits row of its own")
        row, self.k = self.rows[self.k], self.k + 1
        return row


# -- wire formats ----------------------------------------------------------------------------

def _piece(tokenizer, token: int) -> tuple[str, list[int]]:
    b = tokenizer.token_bytes(token)
    return b.decode("utf-8", errors="replace"), list(b)


def completion_logprobs(tokenizer, lps: list[TokenLogprob], offsets: list[int]) -> dict:
    """OpenAI's legacy /v1/completions `logprobs`: tokens, token_logprobs, top_logprobs (one
    {text: logprob} per token), text_offset (each token's first character in the text)."""
    return {"tokens": [_piece(tokenizer, t.token)[0] for t in lps],
            "token_logprobs": [t.logprob for t in lps],
            "top_logprobs": [{_piece(tokenizer, i)[0]: v for i, v in t.top} for t in lps],
            "text_offset": list(offsets)}


def chat_logprobs(tokenizer, lps: list[TokenLogprob]) -> dict:
    """OpenAI's chat `logprobs`: content[] with token, logprob, bytes, top_logprobs[]."""
    def one(token: int, logprob: float) -> dict:
        text, b = _piece(tokenizer, token)
        return {"token": text, "logprob": logprob, "bytes": b}
    return {"content": [{**one(t.token, t.logprob), "top_logprobs": [one(i, v) for i, v in t.top]}
                        for t in lps], "refusal": None}
