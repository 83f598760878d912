"""Test doubles: fake model sessions and random-number generators that enumerate branches.

FakeSession follows the Session contract of specdec.engine.transformer (eval / truncate / reset, n_past,
n_ctx, n_vocab) with logits that are a fixed pseudo-random function of the last `window`
tokens of the context: deterministic, context dependent, and bitwise identical whatever the
batch size.  A pair factory returns (target, draft) sessions; tests parametrize over
PAIR_FACTORIES: 'fake' (FakeSession), 'synth' (tiny random-weight GGUF transformers of
tests/synth.py, run by specdec.engine.transformer) and 'synth_moe' (the same with experts); a new
kind of model is one more entry with the same signature.  As everywhere: p is the target's distribution, q the draft's.
"""
from __future__ import annotations

import atexit
import shutil
import tempfile
from contextlib import contextmanager
from dataclasses import replace
from functools import lru_cache
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from specdec.generation.interfaces import Session

LogitFn = Callable[[tuple[int, ...]], np.ndarray]     # context ids -> (V,) float32


@contextmanager
def one_thread():
    """Run the Numba kernels on one thread inside the block, then restore the thread count."""
    import numba
    n_threads = numba.get_num_threads()
    numba.set_num_threads(1)
    try:
        yield
    finally:
        numba.set_num_threads(n_threads)


def window_logits(n_vocab: int, seed: int, window: int = 2, scale: float = 1.5) -> LogitFn:
    """Logits drawn from N(0, scale²), seeded by (seed, last `window` ids); memoised."""
    memo: dict[tuple[int, ...], np.ndarray] = {}

    def fn(ctx: tuple[int, ...]) -> np.ndarray:
        key = (0,) * max(0, window - len(ctx)) + tuple(t + 1 for t in ctx[-window:])
        row = memo.get(key)
        if row is None:
            gen = np.random.default_rng([seed, *key])
            row = memo[key] = (gen.standard_normal(n_vocab) * scale).astype(np.float32)
        return row
    return fn


def mixed_logits(base: LogitFn, noise: LogitFn, weight: float) -> LogitFn:
    """base + weight * noise: a model close to `base` when weight is small."""
    w = np.float32(weight)
    return lambda ctx: (base(ctx) + w * noise(ctx)).astype(np.float32)


class FakeSession(Session):
    """A Session with a KV 'cache' that just remembers its token ids (`tokens`)."""

    def __init__(self, n_vocab: int, logit_fn: LogitFn, n_ctx: int = 512):
        self.n_vocab, self.n_ctx, self.logit_fn = n_vocab, n_ctx, logit_fn
        self.tokens: list[int] = []
        self.n_evals = 0           # eval calls
        self.n_rows = 0            # tokens evaluated

    @property
    def n_past(self) -> int:
        return len(self.tokens)

    @property
    def n_logits(self) -> int:
        return self.n_vocab

    def eval(self, tokens: Sequence[int], last_only: bool = False) -> np.ndarray:
        tokens = [int(t) for t in tokens]
        if not tokens:
            raise ValueError("eval needs a non-empty sequence")
        if min(tokens) < 0 or max(tokens) >= self.n_vocab:
            raise ValueError(f"token id out of range 0..{self.n_vocab - 1}")
        if self.n_past + len(tokens) > self.n_ctx:
            raise ValueError(f"context overflow: {self.n_past} + {len(tokens)} > {self.n_ctx}")
        rows = []
        for t in tokens:
            self.tokens.append(t)
            rows.append(self.logit_fn(tuple(self.tokens)))
        self.n_evals += 1
        self.n_rows += len(tokens)
        out = np.stack(rows).astype(np.float32)          # (M, V)
        return out[-1:] if last_only else out

    def eval_tree(self, tokens: Sequence[int], parents: Sequence[int]) -> np.ndarray:
        """Row i: the logits after the context and node i's root-to-i path."""
        tokens, parents = [int(t) for t in tokens], [int(a) for a in parents]
        if not tokens or len(parents) != len(tokens) or any(not -1 <= a < i for i, a in enumerate(parents)):
            raise ValueError("eval_tree needs tokens and parents (-1 or an earlier node) of one length")
        if self.n_past + len(tokens) > self.n_ctx:
            raise ValueError(f"context overflow: {self.n_past} + {len(tokens)} > {self.n_ctx}")
        paths: list[list[int]] = []
        for t, a in zip(tokens, parents):
            paths.append((paths[a] if a >= 0 else []) + [t])
        self._tree = (self.n_past, parents, paths)
        self.n_evals += 1
        self.n_rows += len(tokens)
        return np.stack([self.logit_fn(tuple(self.tokens + path)) for path in paths]).astype(np.float32)

    def commit_path(self, node_ids: Sequence[int]) -> None:
        start, parents, paths = self._tree
        path = list(node_ids)
        assert start == self.n_past and all(parents[c] == (path[d - 1] if d else -1)
                                            for d, c in enumerate(path))
        self.tokens.extend(paths[path[-1]] if path else [])
        self._tree = None

    def truncate(self, n: int) -> None:
        if not 0 <= n <= self.n_past:
            raise ValueError(f"cannot truncate {self.n_past} tokens to {n}")
        del self.tokens[n:]

    def reset(self) -> None:
        self.truncate(0)


RELATIONS = ("identical", "good", "bad")


def fake_pair(n_vocab: int, seed: int, relation: str, n_ctx: int = 512):
    """(target, draft) sessions.  relation: 'identical' (same model, own cache), 'good'
    (the target's logits plus small noise) or 'bad' (an unrelated model)."""
    target_fn = window_logits(n_vocab, seed)
    if relation == "identical":
        draft_fn = target_fn
    elif relation == "good":
        draft_fn = mixed_logits(target_fn, window_logits(n_vocab, seed + 7919, window=1), 0.4)
    elif relation == "bad":
        draft_fn = window_logits(n_vocab, seed + 104729, window=1, scale=2.5)
    else:
        raise ValueError(relation)
    return FakeSession(n_vocab, target_fn, n_ctx), FakeSession(n_vocab, draft_fn, n_ctx)


class Recorder:
    """Wraps a real Session and records its cache contents like FakeSession does."""

    def __init__(self, session):
        self.session = session
        self.tokens: list[int] = []
        self.n_evals = 0
        self.n_rows = 0
        session.reset()

    n_vocab = property(lambda self: self.session.n_vocab)
    n_ctx = property(lambda self: self.session.n_ctx)
    n_past = property(lambda self: self.session.n_past)
    n_logits = property(lambda self: self.session.n_logits)

    def eval(self, tokens: Sequence[int], last_only: bool = False) -> np.ndarray:
        with one_thread():            # tiny matrices: thread start-up would dominate
            out = self.session.eval(tokens, last_only=last_only)
        self.tokens.extend(int(t) for t in tokens)
        self.n_evals += 1
        self.n_rows += len(tokens)
        assert self.session.n_past == len(self.tokens)
        return out

    def eval_tree(self, tokens: Sequence[int], parents: Sequence[int]) -> np.ndarray:
        with one_thread():
            out = self.session.eval_tree(tokens, parents)
        self._tree = ([int(t) for t in tokens], [int(a) for a in parents])
        self.n_evals += 1
        self.n_rows += len(tokens)
        return out

    def commit_path(self, node_ids: Sequence[int]) -> None:
        self.session.commit_path(node_ids)
        self.tokens.extend(self._tree[0][c] for c in node_ids)
        assert self.session.n_past == len(self.tokens)

    def routing(self):
        return self.session.routing()

    def truncate(self, n: int) -> None:
        self.session.truncate(n)
        del self.tokens[n:]

    def reset(self) -> None:
        self.truncate(0)


@lru_cache(maxsize=None)
def _synth_dir() -> Path:
    d = Path(tempfile.mkdtemp(prefix="specdec-synth-"))
    atexit.register(shutil.rmtree, d, True)
    return d


@lru_cache(maxsize=256)
def _synth_model(spec):
    import specdec
    from synth import write_tiny_model
    name = f"{spec.arch}-{spec.n_vocab}-{spec.n_layer}-{spec.seed}-{spec.n_ctx}.gguf"
    return specdec.load(write_tiny_model(_synth_dir() / name, spec), n_ctx=spec.n_ctx)


def synth_pair(n_vocab: int, seed: int, relation: str, n_ctx: int = 512):
    """(target, draft) sessions of tiny random-weight GGUF transformers (tests/synth.py).
    'identical': the same model; 'good': the target's first layer only (same seed, so the
    same embeddings, output and layer 0); 'bad': another seed."""
    from synth import TinySpec
    base = TinySpec(n_vocab=n_vocab, d_model=16, n_head=2, n_head_kv=1, d_ff=24, n_layer=2,
                    seed=seed, n_ctx=n_ctx)
    draft = {"identical": base, "good": replace(base, n_layer=1),
             "bad": replace(base, seed=seed + 104729)}[relation]
    return (Recorder(_synth_model(base).session(n_ctx)),
            Recorder(_synth_model(draft).session(n_ctx)))


def synth_moe_pair(n_vocab: int, seed: int, relation: str, n_ctx: int = 512):
    """synth_pair of qwen3moe files (4 experts, top 2): each verification pass groups its
    rows by expert differently than the one-row passes."""
    from synth import TinySpec
    base = TinySpec(arch="qwen3moe", n_vocab=n_vocab, d_model=16, n_head=2, n_head_kv=1, d_ff=24,
                    n_layer=2, seed=seed, n_ctx=n_ctx, n_expert=4, n_expert_used=2)
    draft = {"identical": base, "good": replace(base, n_layer=1),
             "bad": replace(base, seed=seed + 104729)}[relation]
    return (Recorder(_synth_model(base).session(n_ctx)),
            Recorder(_synth_model(draft).session(n_ctx)))


# name -> factory(n_vocab, seed, relation, n_ctx=...) -> (target, draft)
PAIR_FACTORIES = {"fake": fake_pair, "synth": synth_pair, "synth_moe": synth_moe_pair}


from specdec.testing.law import PathRng, enumerate_outcomes  # noqa: E402,F401  (public now)
