"""llama.cpp measured in the same run, when its Python binding is installed.

The benchmarks compare against llama.cpp side by side where they can: `llama-cpp-python`
(not a dependency; docs/reproduce.md says how to build it for this CPU) in the same process,
same threads, same GGUF file.  Each function returns None when the binding is missing or
llama.cpp cannot load the file (specdec reads some files it does not, e.g. the tests'
synthetic ones), and the benchmarks then fall back to the figures recorded in frontends/bench.py.

    decode(path, prompt, n_tg, repeats)   pp (one batched eval of the prompt) and tg (n_tg
                                          single-token evals) tokens/s, best of repeats
    forward_ms(path, ms, n_past, repeats) median ms of one eval of M tokens after n_past
                                          cached ones, logits for every row (what
                                          verification needs), for each M in ms
"""
from __future__ import annotations

import os
import time
from typing import Sequence

import numpy as np


def available() -> bool:
    try:
        import llama_cpp  # noqa: F401
    except ImportError:
        return False
    return True


def version() -> str | None:
    if not available():
        return None
    import llama_cpp
    return str(llama_cpp.__version__)


def _load(path: str, n_ctx: int, logits_all: bool, mmap: bool = True):
    """A llama_cpp.Llama on path, or None when llama.cpp refuses the file."""
    from llama_cpp import Llama
    try:
        return Llama(path, n_ctx=n_ctx, n_threads=os.cpu_count() or 1, n_threads_batch=os.cpu_count() or 1,
                     n_batch=512, logits_all=logits_all, use_mmap=mmap, verbose=False)
    except ValueError:                  # "Failed to load model from file: ..."
        return None


def _rewind(llm, n: int) -> None:
    """Drop every cached position >= n (llama_kv_cache_seq_rm on sequence -1)."""
    llm._ctx.kv_cache_seq_rm(-1, n, -1)
    llm.n_tokens = n


def decode(path: str, prompt: Sequence[int], n_tg: int, repeats: int = 3,
           mmap: bool = True) -> dict | None:
    """{'pp_tok_s', 'tg_tok_s'} for llama.cpp on the file at path, or None without it
    (mmap=False: llama.cpp's --no-mmap, as specdec's)."""
    if not available():
        return None
    llm = _load(path, len(prompt) + n_tg + 8, logits_all=False, mmap=mmap)
    if llm is None:
        return None
    llm.eval(list(prompt[:8]))                                    # warm-up
    pp, tg = 0.0, 0.0
    for _ in range(repeats):
        _rewind(llm, 0)
        t = time.perf_counter()
        llm.eval(list(prompt))
        pp = max(pp, len(prompt) / (time.perf_counter() - t))
        tok = int(prompt[-1])
        t = time.perf_counter()
        for i in range(n_tg):
            llm.eval([tok])
            tok = int(prompt[i % len(prompt)])                     # any id: the cost is the same
        tg = max(tg, n_tg / (time.perf_counter() - t))
    return {"pp_tok_s": round(pp, 2), "tg_tok_s": round(tg, 2)}


def forward_ms(path: str, ms: Sequence[int], n_past: int = 128, repeats: int = 5,
               mmap: bool = True) -> dict | None:
    """{M: median ms} of one eval over M tokens after n_past cached ones, all rows' logits."""
    if not available():
        return None
    llm = _load(path, n_past + max(ms) + 8, logits_all=True, mmap=mmap)
    if llm is None:
        return None
    llm.eval([(17 * i) % 1000 + 100 for i in range(n_past)])
    out = {}
    for m in ms:
        times = []
        for _ in range(repeats + 1):                              # the first one warms up
            _rewind(llm, n_past)
            t = time.perf_counter()
            llm.eval([(31 * i) % 1000 + 100 for i in range(m)])
            times.append(time.perf_counter() - t)
        out[m] = float(np.median(times[1:]) * 1e3)
    _rewind(llm, 0)
    return out
