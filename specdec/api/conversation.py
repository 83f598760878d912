"""Chat: prompts in the model's own chat template, and conversations that keep their KV caches.

The prompt of each turn is the model's own chat template rendered by specdec.text.template
(sandboxed Jinja2; ChatML for a model without one).

A `Conversation` owns one target session and one drafter for its whole life.  Each turn the
whole conversation is rendered and tokenized again, and compared with the tokens the target's
KV cache already holds: only what follows their common prefix is evaluated (normally just the
new user turn and the assistant header).  Because the comparison is on token ids, the cache
can never hold something the prompt does not say; a turn costs what is new, and the output of
every turn is exactly what a fresh request with the same prompt would give (greedy: the same
tokens; sampled: the same law).

With a suffix store (draft='suffix', or suffix_store= / -lcd), each finished turn's prompt and
answer go into it as one document, the conversation's transcript, which the next turn's
replaces; after `clear` a new transcript starts beside it, so a question asked again drafts
from the earlier answer.
"""
from __future__ import annotations

from typing import Callable, Sequence

import numpy as np

from ..errors import ConfigError, ContextOverflowError
from .model import Model
from .request import Completion, DraftOptions, Runner
from ..generation.constraint import ConstraintSpec
from ..generation.sampling import SamplerParams
from ..speculation.trace import TraceSink
from ..text.template import CHATML, ROLES, chat_prompt, check_messages, render  # noqa: F401


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    if n == 0:
        return 0
    diff = np.flatnonzero(np.asarray(a[:n]) != np.asarray(b[:n]))
    return int(diff[0]) if diff.size else n


class Conversation:
    """A multi-turn chat with one model (and optionally a drafter), keeping the KV caches.

        conv = specdec.Conversation(model, draft=draft_model, system="Be brief.")
        conv.say("Hi!").text;  conv.say("And again?").text

    Sampling and drafting options are those of `Model.generate` and fixed for the
    conversation; one random generator serves every turn (`seed`).  `say` raises what
    `generate` raises; after an exception, KeyboardInterrupt included, the conversation holds
    the question and whatever part of the answer was already emitted, and both caches are
    cut back to rows that are known to be right, so the next `say` simply continues."""

    def __init__(self, model: "Model", *, system: str | None = None, draft=None,
                 n_ctx: int | None = None, temperature: float = 0.0, top_k: int = 40,
                 top_p: float = 0.95, min_p: float = 0.05, seed: int | None = None,
                 ignore_eos: bool = False, draft_n: int | None = None, draft_p: float | None = None,
                 draft_policy=None, draft_model=None, draft_vocab: int | None = None,
                 draft_retokenize: bool = False, **lookup):
        self.model = model
        self.system = system
        self.n_ctx = int(n_ctx or model.n_ctx)
        options = DraftOptions.of(draft, draft_model, n=draft_n, p=draft_p, policy=draft_policy,
                                  vocab=draft_vocab, retokenize=draft_retokenize, **lookup)
        params = SamplerParams(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p)
        self.runner = Runner(model, params, options, seed=seed, ignore_eos=ignore_eos,
                             n_ctx=self.n_ctx)
        self.target, self.drafter = self.runner.target, self.runner.drafter
        self.messages: list[dict] = []
        self._ids: list[int] = []           # what the target cache holds, row for row
        self.n_reused = 0                   # prompt tokens the last turn took from the cache
        self.clear()

    def clear(self) -> None:
        """Forget every turn (the system message stays)."""
        self.messages = [{"role": "system", "content": self.system}] if self.system else []
        self._ids = []
        self._n_clears = getattr(self, "_n_clears", -1) + 1
        self._doc_key = ("conversation", id(self), self._n_clears)   # its transcript in the store
        self.target.reset()
        if self.drafter is not None:
            self.drafter.reset()

    @property
    def n_cached(self) -> int:
        """Tokens of the conversation held in the target's KV cache."""
        return len(self._ids)

    def prompt(self, text: str) -> str:
        """The prompt text the next `say(text)` evaluates (the whole conversation)."""
        return chat_prompt(self.model.tokenizer, [*self.messages, {"role": "user", "content": text}])

    def say(self, text: str, n_predict: int = 128, *,
            on_token: Callable[[int, str], None] | None = None,
            trace: "TraceSink | None" = None,
            prediction: "str | Sequence[int] | None" = None,
            grammar: str | None = None, json_schema: "dict | str | None" = None,
            constraint: "ConstraintSpec | None" = None) -> "Completion":
        """Add a user turn, generate the assistant's answer (streamed through on_token) and
        add it to the conversation.  prediction: what this answer is expected to be, drafted
        first (Model.generate's prediction=; this turn only).  grammar / json_schema /
        constraint: this answer must fit it (Model.generate's; this turn only)."""
        if not isinstance(text, str):
            raise ConfigError(f"say() takes the user's text, got {type(text).__name__}")
        spec = ConstraintSpec.of(grammar, json_schema, constraint)
        if spec is not None:
            spec.check()
        question = {"role": "user", "content": text}
        ids = self.model.tokenize(chat_prompt(self.model.tokenizer, [*self.messages, question]))
        if len(ids) + 1 > self.n_ctx:
            raise ContextOverflowError(f"the conversation ({len(ids)} tokens) no longer fits "
                                       f"--ctx-size {self.n_ctx}; clear it to start afresh")
        self.n_reused = min(common_prefix(self._ids, ids), len(ids) - 1)
        self.target.truncate(min(self.n_reused, self.target.n_past))   # rows past it are stale
        self._ids = ids[:self.target.n_past]
        emitted: list[int] = []

        def record(token: int, kind: str) -> None:
            if on_token is not None:
                on_token(token, kind)
            emitted.append(token)               # after: an interrupted token was not shown

        try:
            self.runner.predict(prediction)
            res = self.runner.run(ids, n_predict, on_token=record, trace=trace,
                                  n_keep=len(self._ids), constraint=spec)
        except KeyboardInterrupt:           # Ctrl-C: keep the question and the partial answer
            self._settle(ids, emitted, interrupted=True)
            self.messages += [question, {"role": "assistant", "content": self.model.detokenize(emitted)}]
            raise
        except BaseException:
            self._settle(ids, emitted, interrupted=True)
            raise
        finally:
            self.runner.predict(None)
        self._settle(ids, res.ids, interrupted=False)
        self.runner.remember(ids, res.ids, key=self._doc_key)
        self.messages += [question, {"role": "assistant", "content": self.model.detokenize(res.ids)}]
        return self.runner.completion(ids, res)

    def _settle(self, prompt_ids: list[int], emitted: list[int], interrupted: bool) -> None:
        """Keep the cache rows known to be right.  Generation started from a cache holding a
        prefix of prompt_ids, so the target's first min(n_past, |prompt + emitted|) rows are
        right: rows past n_past were never committed (a token being evaluated when an
        exception hit is not yet counted), and a drafted token that was rejected, or the one
        correction / bonus token not yet evaluated, sits only past the emitted ones."""
        valid = min(self.target.n_past, len(prompt_ids) + len(emitted))
        self.target.truncate(valid)
        self._ids = (list(prompt_ids) + list(emitted))[:valid]
        if interrupted and self.drafter is not None:
            self.drafter.reset()            # its bookkeeping may be mid-update: re-derive next turn
