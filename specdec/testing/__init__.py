"""specdec.testing: prove that speculation changes nothing — for your drafter, your policy or
your decoding scheme.  Importable without pytest; hypothesis is needed by `strategies` only.

    tiny_model(path, arch=..., n_vocab=..., ...)   write a small random-weight GGUF file
    assert_greedy_identical(target, prompts, n_predict, **generate_kwargs)
    output_law(target, prompt, n_tokens, *, temperature, ..., **draft_kwargs)
                                                  the exact law of the next n_tokens
    assert_same_law(target, prompt, n_tokens, *, temperature, ..., **draft_kwargs)
    check_drafter(make_drafter, ...)               greedy identity and the exact law of a
                                                  Drafter (subclass) on tiny models
    enumerate_outcomes(run), PathRng               the enumeration underneath (law.py)
    strategies                                     hypothesis strategies (strategies.py)
    replay                                         the drafting plan replayed over recorded
                                                  requests at injected pass costs (replay.py)

Every check compares speculative generation with plain generation of the same target; an
AssertionError names the smallest counterexample found.  docs/testing.md has a walk-through,
examples/test_my_drafter.py a complete property test.

p is always the target's distribution, q the draft's.
"""
from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Callable, Sequence

from ..errors import ConfigError
from ..api.request import DraftOptions, Runner
from ..generation.sampling import SamplerParams
from .law import PathRng, enumerate_outcomes
from .synth import TinySpec, write_tiny_model

__all__ = ["TinySpec", "tiny_model", "assert_greedy_identical", "output_law", "assert_same_law",
           "check_drafter", "enumerate_outcomes", "PathRng"]

QUANTS = {"f32": 0, "f16": 1, "q4_0": 2, "q4_1": 3, "q5_0": 6, "q5_1": 7, "q8_0": 8,
          "q2_k": 10, "q3_k": 11, "q4_k": 12, "q5_k": 13, "q6_k": 14}
ARCHS = ("llama", "qwen2", "gemma3")
LAW_TOLERANCE = 1e-9


def tiny_model(path: str | Path, *, arch: str = "llama", n_vocab: int = 16, n_layer: int = 2,
               d_model: int = 32, n_head: int = 2, n_head_kv: int = 1, d_ff: int = 48,
               quant: str = "f32", seed: int = 0, logit_scale: float = 3.0, n_ctx: int = 256) -> Path:
    """Write a small random-weight GGUF model (any supported architecture and weight format)
    to `path` and return it; `specdec.load(path)` reads it.  Its vocabulary is single letters
    then pairs ('a', 'b', ...); the last id is the end-of-generation token.  logit_scale > 1
    sharpens the output distribution."""
    if arch not in ARCHS:
        raise ConfigError(f"tiny_model: arch must be one of {', '.join(ARCHS)}, got {arch!r}")
    if quant not in QUANTS:
        raise ConfigError(f"tiny_model: quant must be one of {', '.join(QUANTS)}, got {quant!r}")
    spec = TinySpec(arch=arch, n_vocab=n_vocab, d_model=d_model, n_layer=n_layer, n_head=n_head,
                    n_head_kv=n_head_kv, d_ff=d_ff, qtype=QUANTS[quant], seed=seed,
                    logit_scale=logit_scale, n_ctx=n_ctx)
    return write_tiny_model(path, spec)


def _ids(target, prompt) -> list[int]:
    return target.tokenize(prompt) if isinstance(prompt, str) else [int(t) for t in prompt]


def assert_greedy_identical(target, prompts: Sequence, n_predict: int, **generate_kwargs) -> None:
    """Greedy generation with `generate_kwargs` (draft=..., draft_n=..., a Drafter, ...) gives
    exactly the plain greedy tokens on every prompt (text or ids); AssertionError naming the
    prompt, the position and both tokens otherwise."""
    from ..frontends.check import first_divergence
    kw = {k: v for k, v in generate_kwargs.items() if k not in ("temperature",)}
    for prompt in prompts:
        ids = _ids(target, prompt)
        plain = target.generate(ids, n_predict, temperature=0.0, ignore_eos=kw.get("ignore_eos", False)).ids
        spec = target.generate(ids, n_predict, temperature=0.0, **kw).ids
        at = first_divergence(plain, spec)
        if at is not None:
            raise AssertionError(
                f"greedy speculative != plain for prompt {prompt!r}: token {at} is "
                f"{spec[at] if at < len(spec) else '<end>'} (speculative) vs "
                f"{plain[at] if at < len(plain) else '<end>'} (plain); plain {plain}, speculative {spec}")


def output_law(target, prompt, n_tokens: int, *, temperature: float = 1.0, top_k: int = 0,
               top_p: float = 1.0, min_p: float = 0.0, ignore_eos: bool = False,
               **draft_kwargs) -> dict[tuple, float]:
    """The exact law of the next n_tokens after prompt: {(ids, stop_reason): probability},
    every random branch enumerated (sampling, drafting, acceptance).  draft_kwargs: the
    drafting keywords of Model.generate (draft=, draft_n=, draft_policy=, ...; a Drafter
    factory `make_drafter=fn(target)` builds a fresh drafter per branch); none: plain
    sampling.  Tiny vocabularies and a few tokens only: the branches multiply."""
    params = SamplerParams(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p)
    if params.greedy:
        raise ConfigError("output_law: temperature must be > 0 (greedy has one outcome)")
    ids = _ids(target, prompt)
    make = draft_kwargs.pop("make_drafter", None)

    def run(rng: PathRng):
        kw = dict(draft_kwargs)
        if make is not None:
            kw["draft"] = make(target)
        options = DraftOptions.of(kw.pop("draft", None), kw.pop("draft_model", None),
                                  **_option_fields(kw))
        runner = Runner(target, params, options, seed=0, ignore_eos=ignore_eos)
        runner.rng = rng
        res = runner.run(ids, n_tokens)
        return tuple(res.ids), res.stop_reason
    return enumerate_outcomes(run)


def _option_fields(kw: dict) -> dict:
    """Model.generate's drafting keywords -> DraftOptions fields."""
    names = {"draft_n": "n", "draft_p": "p", "draft_policy": "policy", "draft_vocab": "vocab",
             "draft_tree": "tree", "draft_retokenize": "retokenize", "lookup_ngram_min": "lookup_ngram_min",
             "lookup_ngram_max": "lookup_ngram_max", "lookup_copy_ratio": "lookup_copy_ratio"}
    unknown = set(kw) - set(names)
    if unknown:
        raise ConfigError(f"output_law: unknown drafting keywords {sorted(unknown)}")
    return {names[k]: v for k, v in kw.items()}


def assert_same_law(target, prompt, n_tokens: int, *, tolerance: float = LAW_TOLERANCE,
                    **kwargs) -> None:
    """output_law with the drafting keywords equals the plain law, every outcome within
    `tolerance`; AssertionError naming the outcome that differs most otherwise."""
    sampling = {k: kwargs[k] for k in ("temperature", "top_k", "top_p", "min_p", "ignore_eos") if k in kwargs}
    got = output_law(target, prompt, n_tokens, **kwargs)
    want = output_law(target, prompt, n_tokens, **sampling)
    worst = max(set(got) | set(want), key=lambda o: abs(got.get(o, 0.0) - want.get(o, 0.0)))
    diff = abs(got.get(worst, 0.0) - want.get(worst, 0.0))
    if diff > tolerance:
        raise AssertionError(
            f"speculative law != plain law after prompt {prompt!r} ({n_tokens} tokens, {sampling}): "
            f"outcome {worst} has probability {got.get(worst, 0.0):.6g} speculative vs "
            f"{want.get(worst, 0.0):.6g} plain")


def check_drafter(make_drafter: Callable, *, n_vocab: int = 5, seeds: Sequence[int] = (0, 1),
                  draft_ns: Sequence[int] = (1, 2, 3), n_tokens: int = 3,
                  temperatures: Sequence[float] = (1.0, 0.7), workdir: str | Path | None = None) -> None:
    """Put a drafter through greedy identity and the exact output law on tiny models.

    make_drafter(target) -> a fresh Drafter (your subclass) proposing for the specdec Model
    `target`.  For each seed a tiny target of n_vocab ids is written; greedy identity is checked
    on a few prompts at every draft length (fixed policy), then the exact law of n_tokens
    sampled tokens at each temperature, smallest cases first; the first failure is raised as
    an AssertionError naming that (smallest) counterexample."""
    import specdec
    folder = Path(workdir or tempfile.mkdtemp(prefix="specdec-check-drafter-"))
    for seed in seeds:
        target = specdec.load(tiny_model(folder / f"target-{n_vocab}-{seed}.gguf", n_vocab=n_vocab,
                                         seed=seed, d_model=16, d_ff=24), n_ctx=64)
        prompts = [[1], [2, 1], [1, 2, 1, 2]]
        for n in draft_ns:
            try:
                assert_greedy_identical(target, prompts, 8, draft=make_drafter(target), draft_n=n,
                                        draft_policy="fixed", ignore_eos=True)
            except AssertionError as e:
                raise AssertionError(f"check_drafter (seed {seed}, draft_n {n}): {e}") from None
        for k in range(1, n_tokens + 1):
            for prompt in prompts[:2]:
                for n in draft_ns:
                    for t in temperatures:
                        try:
                            assert_same_law(target, prompt, k, temperature=t, ignore_eos=True,
                                            make_drafter=make_drafter, draft_n=n, draft_policy="fixed")
                        except AssertionError as e:
                            raise AssertionError(f"check_drafter (seed {seed}, draft_n {n}, "
                                                 f"temperature {t}): {e}") from None
