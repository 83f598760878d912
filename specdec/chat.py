"""Chat: prompts in the model's own chat template, and conversations that keep their KV caches.

The template is the Jinja2 source stored in the GGUF file (`tokenizer.chat_template`),
rendered the way Hugging Face transformers and llama.cpp (`--jinja`) render it: a sandboxed,
immutable environment with trim_blocks and lstrip_blocks, the variables `messages`,
`add_generation_prompt`, `bos_token` and `eos_token`, the helpers `raise_exception(msg)` and
`strftime_now(fmt)`, the `tojson` filter and loop controls.  A model without a template gets
ChatML, llama.cpp's fallback.

A `Conversation` owns one target session and one drafter for its whole life.  Each turn the
whole conversation is rendered and tokenized again, and compared with the tokens the target's
KV cache already holds: only what follows their common prefix is evaluated (normally just the
new user turn and the assistant header).  Because the comparison is on token ids, the cache
can never hold something the prompt does not say; a turn costs what is new, and the output of
every turn is exactly what a fresh request with the same prompt would give (greedy: the same
tokens; sampled: the same law).
"""
from __future__ import annotations

import datetime
import json
from functools import lru_cache
from typing import TYPE_CHECKING, Callable, Mapping, Sequence

import numpy as np

from .errors import ChatTemplateError, ConfigError, ContextOverflowError
from .request import DraftOptions, Runner
from .sampling import SamplerParams

if TYPE_CHECKING:
    from .api import Model
    from .request import Completion
    from .speculation.trace import TraceSink

CHATML = ("{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + "
          "message['content'] + '<|im_end|>\\n' }}{% endfor %}"
          "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")
ROLES = ("system", "user", "assistant", "tool")


def _raise_exception(message: str):
    raise ChatTemplateError(f"chat template: {' '.join(str(message).split())}")


def _tojson(x, ensure_ascii: bool = False, indent=None, separators=None, sort_keys: bool = False) -> str:
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)


def _strftime_now(fmt: str) -> str:
    return datetime.datetime.now().strftime(fmt)


@lru_cache(maxsize=8)
def _compile(template: str):
    from jinja2 import TemplateError
    from jinja2.sandbox import ImmutableSandboxedEnvironment
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=["jinja2.ext.loopcontrols"])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    try:
        return env.from_string(template)
    except TemplateError as e:
        raise ChatTemplateError(f"chat template does not parse: {_one_line(e)}") from None


def _one_line(e: Exception) -> str:
    return " ".join(str(e).split()) or type(e).__name__


def check_messages(messages: Sequence[Mapping[str, str]]) -> list[dict]:
    """A copy of messages as plain dicts; one-line errors for what no template can render."""
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, Mapping) or not isinstance(m.get("content"), str):
            raise ConfigError(f"message {i}: expected {{'role': ..., 'content': str}}, got {m!r:.60}")
        if m.get("role") not in ROLES:
            raise ConfigError(f"message {i}: role must be one of {', '.join(ROLES)}, got {m.get('role')!r}")
        out.append(dict(m))
    if not out:
        raise ConfigError("a chat needs at least one message")
    return out


def render(template: str, messages: Sequence[Mapping[str, str]], *,
           add_generation_prompt: bool = True, bos_token: str = "", eos_token: str = "",
           **extra) -> str:
    """The template's text for these messages (no tokenization, nothing stripped)."""
    from jinja2 import TemplateError
    try:
        return _compile(template).render(messages=check_messages(messages),
                                         add_generation_prompt=add_generation_prompt,
                                         bos_token=bos_token, eos_token=eos_token, **extra)
    except ChatTemplateError:
        raise
    except (TemplateError, TypeError, ValueError, KeyError, AttributeError, IndexError) as e:
        raise ChatTemplateError(f"chat template failed: {_one_line(e)}") from None


def chat_prompt(tokenizer, messages: Sequence[Mapping[str, str]],
                add_generation_prompt: bool = True) -> str:
    """The prompt text for `messages` in the tokenizer's own template (ChatML if it has none),
    ready for `Model.tokenize` / `Model.generate`: a BOS the template writes itself is left
    out when the tokenizer adds one anyway, so the prompt never starts with two."""
    def text(tid):
        return "" if tid is None else tokenizer.tokens[tid]
    bos = text(tokenizer.bos_id)
    out = render(tokenizer.chat_template or CHATML, messages,
                 add_generation_prompt=add_generation_prompt, bos_token=bos,
                 eos_token=text(tokenizer.eos_id))
    if tokenizer.add_bos and bos and out.startswith(bos):
        out = out[len(bos):]
    return out


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
                 ignore_eos: bool = False, draft_n: int = 5, draft_p: float = 0.9,
                 draft_policy="threshold", draft_model=None, draft_vocab: int | None = None,
                 **lookup):
        self.model = model
        self.system = system
        self.n_ctx = int(n_ctx or model.n_ctx)
        options = DraftOptions.of(draft, draft_model, n=draft_n, p=draft_p, policy=draft_policy,
                                  vocab=draft_vocab, **lookup)
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
            trace: "TraceSink | None" = None) -> "Completion":
        """Add a user turn, generate the assistant's answer (streamed through on_token) and
        add it to the conversation."""
        if not isinstance(text, str):
            raise ConfigError(f"say() takes the user's text, got {type(text).__name__}")
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
            res = self.runner.run(ids, n_predict, on_token=record, trace=trace,
                                  n_keep=len(self._ids))
        except KeyboardInterrupt:           # Ctrl-C: keep the question and the partial answer
            self._settle(ids, emitted, interrupted=True)
            self.messages += [question, {"role": "assistant", "content": self.model.detokenize(emitted)}]
            raise
        except BaseException:
            self._settle(ids, emitted, interrupted=True)
            raise
        self._settle(ids, res.ids, interrupted=False)
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
