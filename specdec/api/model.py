"""The Python API: `specdec.load(...)` and what a loaded model can do.

    m = specdec.load("qwen2.5-coder-1.5b-instruct-q4_k_m")      # a path or a known model id
    m.tokenize("Hello")  ->  [9707]
    m.logits(ids)        ->  (len(ids), n_vocab) float32
    m.generate("def f(", n_predict=64, draft=specdec.load("qwen2.5-coder-0.5b-instruct"))
"""
from __future__ import annotations

import os
import time
from typing import Callable, Sequence

import numpy as np

from ..models import hub
from ..kernels import cpu
from ..engine.config import ModelConfig
from ..speculation.drafters import Drafter, SuffixStore
from ..errors import ConfigError, GGUFError
from ..engine import prepared, resources
from ..engine.gguf_file import GGUFFile, should_map
from ..engine.transformer import ModelSession
from ..engine.weights import Weights
from ..engine.requant import Requant
from ..speculation.policies import DraftPolicy
from .request import Completion, DraftOptions, Runner
from ..generation.constraint import ConstraintSpec
from ..generation.sampling import SamplerParams
from ..text.template import chat_prompt
from ..text.tokenizer import Tokenizer
from ..speculation.trace import TraceSink

DEFAULT_N_CTX = 4096


class _Clock:
    def __init__(self):
        self.laps: dict[str, float] = {}
        self._t = time.perf_counter()

    def lap(self, name: str) -> None:
        t = time.perf_counter()
        self.laps[name] = round(t - self._t, 3)
        self._t = t


def _load_prepared(path: str, params: str, mmap: bool | None) -> prepared.Prepared | None:
    """An earlier load's prepared weights (engine/prepared.py); its in-memory image only where
    this load reads the file into memory (mmap False, or None and the file fits)."""
    cached = prepared.load(path, params, want_image=mmap is False or (
        mmap is None and not should_map(os.path.getsize(path), resources.available_bytes())))
    if cached is not None and cached.image is None:
        cached.rewritten = {}
    return cached


class Model:
    """A loaded GGUF model: config, tokenizer and its quantized weights, read once into memory
    or memory-mapped (mmap=, see `load`)."""

    def __init__(self, path: str | os.PathLike, n_ctx: int | None = None, activations: str = "auto",
                 mmap: bool | None = None, requant: Requant | None = None):
        try:
            cpu.check_path()                   # SPECDEC_KERNELS names a path this host has
        except ValueError as e:
            raise ConfigError(str(e)) from None
        self.path = str(path)
        self.name = os.path.basename(self.path)
        clock = _Clock()                # seconds per part of the load (self.load_times)
        params = f"activations={activations}|requant={requant!r}"     # what preparation depends on
        cached = _load_prepared(self.path, params, mmap)
        self.gguf = GGUFFile(path, mmap=mmap, image=None if cached is None else cached.image)
        self.config = ModelConfig.from_gguf(self.gguf)
        clock.lap("read" if cached is None or cached.image is None else "read prepared")
        self.tokenizer = Tokenizer.from_metadata(self.gguf.metadata, self.path)
        clock.lap("tokenizer")
        if self.tokenizer.n_vocab > self.config.n_vocab:
            raise GGUFError(f"{self.path}: the vocabulary has {self.tokenizer.n_vocab} tokens but "
                            f"token_embd.weight only {self.config.n_vocab} rows")
        self.requant = requant          # what was converted at load (None: weights as stored)
        record = None if cached is not None else prepared.Prepared()
        self.weights = Weights.from_gguf(self.gguf, self.config, activations, requant, cached, record)
        clock.lap("weights" if cached is None else "weights (prepared)")
        if record:                      # first load: keep what was prepared for the next one
            record.image = self.gguf.image if self.gguf.in_memory else None
            prepared.save(self.path, params, record)
            clock.lap("write prepared")
        self.load_times = clock.laps
        self.n_ctx = int(n_ctx or min(DEFAULT_N_CTX, self.config.n_ctx_train))

    def __repr__(self) -> str:
        c = self.config
        return f"<specdec.Model {self.name}: {c.arch}, {c.n_layer} layers, d_model {c.d_model}, vocab {c.n_vocab}>"

    # -- text ----------------------------------------------------------------------------
    def tokenize(self, text: str, special: bool = True, bos: bool | None = None) -> list[int]:
        return self.tokenizer.encode(text, special=special, bos=bos)

    def detokenize(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(ids))

    def chat_prompt(self, messages: Sequence[dict], add_generation_prompt: bool = True) -> str:
        """messages [{'role': 'system'|'user'|'assistant', 'content': str}, ...] in this model's
        own chat template (GGUF tokenizer.chat_template; ChatML if it has none), as prompt
        text for `generate`.  Multi-turn chats that keep their KV cache: specdec.Conversation."""
        return chat_prompt(self.tokenizer, messages, add_generation_prompt)

    # -- numbers -------------------------------------------------------------------------
    def session(self, n_ctx: int | None = None, n_logits: int | None = None) -> ModelSession:
        """A fresh KV cache over this model's weights (each holds its own context); n_logits:
        compute the logits of ids below it only (transformer.ModelSession)."""
        return ModelSession(self.config, self.weights, int(n_ctx or self.n_ctx), n_logits,
                            source=self.path)

    def logits(self, ids: Sequence[int]) -> np.ndarray:
        """(len(ids), n_vocab) float32 logits of one fresh forward pass over ids."""
        ids = list(ids)
        if not ids:
            raise ConfigError("logits: ids is empty")
        return self.session(n_ctx=len(ids)).eval(ids)

    # -- generation ----------------------------------------------------------------------
    def generate(self, prompt: str | Sequence[int], n_predict: int = 128, *,
                 temperature: float = 0.0, top_k: int = 40, top_p: float = 0.95,
                 min_p: float = 0.05, seed: int | None = None,
                 draft: "Model | Drafter | DraftOptions | str | None" = None,
                 draft_n: int | None = None, draft_p: float | None = None,
                 draft_model: "Model | None" = None,
                 draft_policy: "str | DraftPolicy | None" = None,
                 lookup_ngram_min: int = 2, lookup_ngram_max: int = 16,
                 draft_vocab: int | None = None, lookup_copy_ratio: float = 1.0,
                 draft_retokenize: bool = False, draft_tree: int = 1,
                 suffix_store: "SuffixStore | None" = None,
                 ignore_eos: bool = False, n_ctx: int | None = None,
                 on_token: Callable[[int, str], None] | None = None,
                 trace: TraceSink | None = None,
                 prediction: str | Sequence[int] | None = None,
                 grammar: str | None = None, json_schema: "dict | str | None" = None,
                 constraint: ConstraintSpec | None = None) -> Completion:
        """Generate up to n_predict tokens after `prompt` (text with special tokens parsed and
        BOS as the metadata says, or a list of ids).  With `draft=` the tokens come from
        speculative decoding, with exactly the target's output law (greedy: the same ids).

        draft: a loaded draft Model, a Drafter object, DraftOptions (then the draft_* and
        lookup_* arguments are its fields, not these), or a name: 'model' / 'hybrid' (with
        draft_model=) or 'prompt-lookup' (n-grams of lookup_ngram_min..max tokens; a match of n
        tokens copies at most lookup_copy_ratio · n of them, 0: draft_n) or 'suffix' (the most
        frequent continuation of the longest match in the prompt and in suffix_store, a
        SuffixStore of earlier requests; 'hybrid' looks up in it too when given); see
        drafters.make_drafter.  With a suffix_store (or a SuffixDrafter as draft=), the
        prompt and answer go into the store when the request finishes: warm it with
        `store.add(ids)` or by earlier calls.  draft_policy: 'threshold' (up to draft_n, model drafts stop
        below confidence draft_p), 'fixed' (draft_n) or 'adaptive' (1..draft_n chosen from
        the measured acceptance and costs), or a DraftPolicy object; see specdec.speculation.policies.
        draft_vocab: the draft model computes logits for token ids below it only (a cheaper
        draft over the common tokens; exactness is unaffected); 0: all.
        draft_tree: verify up to this many candidate continuations per step in one target
        pass (multi-candidate verification; 1: one linear draft), with draft_policy 'fixed'
        or 'threshold' (the default then).
        Left out (None), draft_n, draft_p, draft_policy and draft_vocab take the defaults
        that measured fastest: a draft model drafts as 'hybrid' with the adaptive length in
        1..8 and its head trimmed to 32768 ids (request.DraftOptions); given, draft_n /
        draft_p / draft_policy mean llama.cpp's --draft-max / --draft-p-min (threshold, 5, 0.9).
        draft_retokenize: the draft model drafts through text (greedy drafts, re-encoded into
        this model's ids; drafters.RetokenizingDrafter): how a draft of another vocabulary
        drafts at all, and still exactly the target's output law.
        prediction: what the answer is expected to be (text, or ids) — the file an edit
        starts from, OpenAI's predicted outputs: drafted first wherever the output follows
        it (drafters.PredictionDrafter; accepted tokens reach on_token as 'predicted'), the
        other drafting elsewhere; with no draft= at all, the prediction alone.  The output
        law is unchanged (greedy: the same ids, whatever the prediction says).
        grammar (GBNF text, as llama.cpp writes it), json_schema (a dict or its JSON text) or
        constraint (a generation.constraint.ConstraintSpec: also any JSON object, a regex, a
        Lark grammar), at most one: the output fits it, with exactly the law of sampling under
        the grammar's mask (each drafted position masked too; the forced text drafted for
        free); the grammar's end stops generation (stop_reason 'eog'), n_predict before it
        'n_predict'.  An invalid one: ConstraintError naming the field."""
        spec = ConstraintSpec.of(grammar, json_schema, constraint)
        if spec is not None:
            spec.check()
        prompt_ids = self.tokenize(prompt) if isinstance(prompt, str) else [int(t) for t in prompt]
        options = DraftOptions.of(draft, draft_model, n=draft_n, p=draft_p, policy=draft_policy,
                                  lookup_ngram_min=lookup_ngram_min,
                                  lookup_ngram_max=lookup_ngram_max,
                                  lookup_copy_ratio=lookup_copy_ratio, vocab=draft_vocab,
                                  retokenize=draft_retokenize, tree=draft_tree,
                                  suffix_store=suffix_store)
        params = SamplerParams(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p)
        runner = Runner(self, params, options, seed=seed, ignore_eos=ignore_eos, n_ctx=n_ctx)
        runner.predict(prediction)
        res = runner.run(prompt_ids, n_predict, on_token=on_token, trace=trace, constraint=spec)
        runner.remember(prompt_ids, res.ids)
        return runner.completion(prompt_ids, res)


def load(path_or_id: str | os.PathLike, n_ctx: int | None = None, download: bool = True,
         progress: bool = True, activations: str = "auto", mmap: bool | None = None,
         requant: str | None = None, requant_head: str | None = None) -> Model:
    """Load a GGUF file, or a known model id (fetched into the model cache on first use).

    activations: "q8" (round matmul inputs to 8 bits per block, as llama.cpp), "float" (keep
    them in float32 in the layers), or "auto" (float for gemma3, q8 otherwise).
    mmap: True maps the file (nothing is copied); False reads it once into process memory
    (llama.cpp's --no-mmap), where the legacy-quant layer weights are then rearranged in place
    into the 8-row records of kernels/repack.py (faster to read, same results bit for bit);
    None (default) reads it when it takes at most half the available memory and maps it
    otherwise (gguf_file.should_map): decoding from memory is the faster on every host
    measured (docs/architecture.md, "Mapped or in memory").
    requant / requant_head: 'q4_0', 'q5_0' or 'q8_0': convert the layers' matmul weights / the
    output head at load, in memory, into that format where it is narrower than the stored
    one (engine/requant.py; a cheaper draft model: the speculative output law is unchanged)."""
    spec = Requant.of(requant, requant_head)                  # checked before any download
    return Model(hub.resolve(str(path_or_id), download=download, progress=progress), n_ctx=n_ctx,
                 activations=activations, mmap=mmap, requant=spec)
