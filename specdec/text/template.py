"""Chat templates: the Jinja2 source a GGUF file stores (`tokenizer.chat_template`), rendered.

The template is rendered the way Hugging Face transformers and llama.cpp (`--jinja`) render it:
a sandboxed, immutable environment with trim_blocks and lstrip_blocks, the variables
`messages`, `add_generation_prompt`, `bos_token` and `eos_token`, the helpers
`raise_exception(msg)` and `strftime_now(fmt)`, the `tojson` filter and loop controls.  A
model without a template gets ChatML, llama.cpp's fallback.

A template is code from a downloaded file, so rendering is bounded (`Limits`): every
failure is a one-line ChatTemplateError, never a hang, a MemoryError or a traceback.
- time: every loop iteration and every call checks a deadline (`seconds`);
- output: the text is produced chunk by chunk (`Template.generate`) and may not exceed
  `max_chars`; operations that build big values in one step (`*` on sequences, `**`, `%`
  and format widths, str padding / replace / join and the filters that do the same) are
  checked against `max_chars` before they run;
- recursion: macro and call nesting deeper than `max_depth` (and Python's RecursionError);
- attributes: an unsafe attribute (`__class__`, `__globals__`, `mro`, ...) raises at once
  instead of printing as an empty Undefined.
"""
from __future__ import annotations

import contextvars
import datetime
import json
import re
import time
from dataclasses import dataclass
from functools import lru_cache
from typing import Mapping, Sequence

from ..errors import ChatTemplateError, ConfigError

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


@dataclass(frozen=True)
class Limits:
    """Bounds on one rendering: wall seconds, output characters, call nesting depth."""
    seconds: float = 5.0
    max_chars: int = 4_000_000
    max_depth: int = 40


LIMITS = Limits()
_GUARD = "__specdec_loop_guard"     # wraps every for-loop's iterable (see _compile)


class _Budget:
    """The running render's deadline and call depth (one per render, in a ContextVar)."""

    def __init__(self, limits: Limits):
        self.limits = limits
        self.deadline = time.monotonic() + limits.seconds
        self.depth = 0

    def tick(self) -> None:
        if time.monotonic() > self.deadline:
            raise ChatTemplateError(f"chat template: rendering took longer than {self.limits.seconds:g} s "
                                    f"(a loop that does not end?)")

    def size(self, n: int, what: str) -> None:
        if n > self.limits.max_chars:
            raise ChatTemplateError(f"chat template: {what} would make {n} items, more than the "
                                    f"{self.limits.max_chars} allowed")


_BUDGET: contextvars.ContextVar[_Budget] = contextvars.ContextVar("specdec_template_budget")


def _budget() -> _Budget:
    b = _BUDGET.get(None)
    return b if b is not None else _Budget(LIMITS)


def _loop_guard(iterable):
    """The iterable of a for loop, checking the deadline every 256 items."""
    b = _budget()
    for i, x in enumerate(iterable):
        if not i & 255:
            b.tick()
        yield x


def _big_digits(s, limit: int) -> bool:
    """Does the format string s hold a number above limit (a width or precision)?"""
    return isinstance(s, str) and any(int(d) > limit for d in re.findall(r"\d{4,}", s))


def _check_args(obj, args, kwargs) -> None:
    """Refuse calls that would build a value far above max_chars in one step."""
    b = _budget()
    limit = b.limits.max_chars
    obj = getattr(obj, "__wrapped__", obj)          # the sandbox wraps str.format
    name = getattr(obj, "__name__", "")
    target = getattr(obj, "__self__", None)
    if isinstance(target, str):
        if name in ("center", "ljust", "rjust", "zfill", "expandtabs"):
            for a in (*args, *kwargs.values()):
                if isinstance(a, int):
                    b.size(a, f"str.{name}")
        elif name == "replace" and len(args) >= 2 and isinstance(args[0], str) and isinstance(args[1], str):
            n = len(target) + 1 if not args[0] else target.count(args[0])
            b.size(len(target) + n * max(0, len(args[1]) - len(args[0])), "str.replace")
        elif name == "join" and args and hasattr(args[0], "__len__"):
            b.size(len(target) * len(args[0]), "str.join")
        elif name in ("format", "format_map") and _big_digits(target, limit):
            b.size(limit + 1, "a format width")


class _Env:
    """Namespace for the sandbox subclass, built on first use (jinja2 imported lazily)."""
    cls = None


def _env_class():
    if _Env.cls is not None:
        return _Env.cls
    import operator

    from jinja2.exceptions import SecurityError
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class BoundedEnvironment(ImmutableSandboxedEnvironment):
        intercepted_binops = frozenset(("*", "**", "%"))

        def call_binop(self, context, op, left, right):
            b = _budget()
            if op == "*":
                for seq, n in ((left, right), (right, left)):
                    if isinstance(n, int) and hasattr(seq, "__len__") and not isinstance(seq, (int, float)):
                        b.size(len(seq) * max(n, 0), "a repetition")
                return operator.mul(left, right)
            if op == "**":
                if isinstance(left, int) and isinstance(right, int) and abs(left) > 1 and right > 0:
                    b.size(right * abs(left).bit_length() // 8, "a power")
                return operator.pow(left, right)
            if isinstance(left, str) and _big_digits(left, b.limits.max_chars):
                b.size(b.limits.max_chars + 1, "a format width")
            return operator.mod(left, right)

        def call(__self, __context, __obj, *args, **kwargs):  # noqa: N805 (jinja's convention)
            b = _budget()
            b.tick()
            _check_args(__obj, args, kwargs)
            b.depth += 1
            try:
                if b.depth > b.limits.max_depth:
                    raise ChatTemplateError(f"chat template: calls nested deeper than {b.limits.max_depth} "
                                            f"(a macro that recurses without end?)")
                return super().call(__context, __obj, *args, **kwargs)
            finally:
                b.depth -= 1

        def unsafe_undefined(self, obj, attribute):
            raise SecurityError(f"access to attribute {attribute!r} of {type(obj).__name__!r} "
                                f"object is unsafe")

    _Env.cls = BoundedEnvironment
    return BoundedEnvironment


def _bounded_filter(env, name: str, size) -> None:
    """Wrap filter `name` so that size(args) (the items it would build) is checked first."""
    inner = env.filters[name]

    def wrapper(*args, **kwargs):
        b = _budget()
        b.tick()
        b.size(size(b.limits.max_chars, *args, **kwargs), f"the {name} filter")
        return inner(*args, **kwargs)
    for attr in ("jinja_pass_arg",):
        if hasattr(inner, attr):
            setattr(wrapper, attr, getattr(inner, attr))
    env.filters[name] = wrapper


def _n(x) -> int:
    return len(x) if hasattr(x, "__len__") else 1


@lru_cache(maxsize=8)
def _compile(template: str):
    from jinja2 import TemplateError, nodes
    if _GUARD in template:
        raise ChatTemplateError(f"chat template uses the reserved name {_GUARD}")
    env = _env_class()(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    env.globals[_GUARD] = _loop_guard
    _bounded_filter(env, "join", lambda lim, ctx, value, d="", attribute=None: _n(value) * (len(str(d)) + 1))
    _bounded_filter(env, "center", lambda lim, value, width=80: int(width) if isinstance(width, int) else 0)
    _bounded_filter(env, "indent", lambda lim, s, width=4, *a, **k: (
        str(s).count("\n") + 1) * (int(width) if isinstance(width, int) else len(str(width))))
    _bounded_filter(env, "format", lambda lim, value, *a, **k: lim + 1 if _big_digits(value, lim) else 0)
    _bounded_filter(env, "replace", lambda lim, ctx, s, old, new, count=None: (
        len(str(s)) + (str(s).count(str(old)) if old else len(str(s)) + 1) * max(0, len(str(new)) - len(str(old)))))
    try:
        ast = env.parse(template)
        for loop in ast.find_all(nodes.For):        # every loop checks the deadline
            loop.iter = nodes.Call(nodes.Name(_GUARD, "load", lineno=loop.lineno), [loop.iter], [],
                                   None, None, lineno=loop.lineno)
        return env.from_string(ast)
    except TemplateError as e:
        raise ChatTemplateError(f"chat template does not parse: {_one_line(e)}") from None
    except RecursionError:
        raise ChatTemplateError("chat template does not parse: nested too deeply") from None


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
           limits: Limits = LIMITS, **extra) -> str:
    """The template's text for these messages (no tokenization, nothing stripped), rendered
    within `limits` (module docstring)."""
    from jinja2 import TemplateError
    compiled = _compile(template)
    budget = _Budget(limits)
    token = _BUDGET.set(budget)
    try:
        out, n = [], 0
        for chunk in compiled.generate(messages=check_messages(messages),
                                       add_generation_prompt=add_generation_prompt,
                                       bos_token=bos_token, eos_token=eos_token, **extra):
            n += len(chunk)
            budget.size(n, "the rendered text")
            budget.tick()
            out.append(chunk)
        return "".join(out)
    except (ChatTemplateError, ConfigError):
        raise
    except RecursionError:
        raise ChatTemplateError("chat template failed: recursion too deep") from None
    except MemoryError:
        raise ChatTemplateError("chat template failed: out of memory while rendering") from None
    except (TemplateError, TypeError, ValueError, KeyError, AttributeError, IndexError,
            ArithmeticError, LookupError, UnicodeError) as e:
        raise ChatTemplateError(f"chat template failed: {_one_line(e)}") from None
    finally:
        _BUDGET.reset(token)


def chat_prompt(tokenizer, messages: Sequence[Mapping[str, str]],
                add_generation_prompt: bool = True, tools: Sequence[Mapping] | None = None) -> str:
    """The prompt text for `messages` in the tokenizer's own template (ChatML if it has none),
    ready for `Model.tokenize` / `Model.generate`: a BOS the template writes itself is left
    out when the tokenizer adds one anyway, so the prompt never starts with two.  tools:
    OpenAI's tool definitions, handed to the template as `tools` (api/tools.py)."""
    def text(tid):
        return "" if tid is None else tokenizer.tokens[tid]
    bos = text(tokenizer.bos_id)
    out = render(tokenizer.chat_template or CHATML, messages,
                 add_generation_prompt=add_generation_prompt, bos_token=bos,
                 eos_token=text(tokenizer.eos_id), **({"tools": list(tools)} if tools else {}))
    if tokenizer.add_bos and bos and out.startswith(bos):
        out = out[len(bos):]
    return out
