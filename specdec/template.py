"""Chat templates: the Jinja2 source a GGUF file stores (`tokenizer.chat_template`), rendered.

The template is rendered the way Hugging Face transformers and llama.cpp (`--jinja`) render it:
a sandboxed, immutable environment with trim_blocks and lstrip_blocks, the variables
`messages`, `add_generation_prompt`, `bos_token` and `eos_token`, the helpers
`raise_exception(msg)` and `strftime_now(fmt)`, the `tojson` filter and loop controls.  A
model without a template gets ChatML, llama.cpp's fallback.
"""
from __future__ import annotations

import datetime
import json
from functools import lru_cache
from typing import Mapping, Sequence

from .errors import ChatTemplateError, ConfigError

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
