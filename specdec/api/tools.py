"""Tool calls in the model's own chat template: OpenAI's `tools` and `tool_choice` checked,
rendered into the prompt by the template's tools branch, turned into a grammar the answer
must follow, and the answer parsed back into OpenAI's `tool_calls`.

The call format is the one Qwen2.5's template (and Hermes 2 Pro's) asks the model for, one
block per call:

    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>

`tool_choice` picks the grammar (`grammar`, a Lark grammar in llguidance's dialect, whose
`%json` rule holds each function's `parameters` schema):
    "auto"      free text (without `<tool_call>`) or one or more calls of the given tools;
    "none"      no tools in the prompt, no constraint: free text;
    "required"  one or more calls;
    {"type": "function", "function": {"name": N}}   exactly one call of N.
Every bad definition is a ToolError naming the field (`tools[1].function.name`), so the
server answers a 400 with OpenAI's error body and `param` set.
"""
from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Mapping, Sequence

from ..errors import ConstraintError
from ..generation.constraint import ConstraintSpec
from ..text import template

MAX_TOOLS = 128
MAX_SCHEMA_CHARS = 64_000          # a tool's parameters schema, as compact JSON
NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
OPEN, CLOSE = "<tool_call>", "</tool_call>"
CHOICES = ("auto", "none", "required")
COMPACT = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}   # llguidance's JSON options


class ToolError(ConstraintError):
    """A tool definition or tool_choice is invalid; `field` names it (OpenAI's `param`)."""

    def __init__(self, message: str, field: str):
        super().__init__(f"{field}: {message}", field)


@dataclass(frozen=True)
class Tool:
    """One function the model may call: its name, description and parameters schema."""
    name: str
    description: str = ""
    parameters: Mapping[str, Any] | None = None

    def openai(self) -> dict:
        """The tool as OpenAI writes it (what the chat template renders with `tojson`)."""
        fn: dict = {"name": self.name}
        if self.description:
            fn["description"] = self.description
        empty = {"type": "object", "properties": {}}
        fn["parameters"] = dict(self.parameters) if self.parameters is not None else empty
        return {"type": "function", "function": fn}


@dataclass(frozen=True)
class ToolCall:
    """One call the model made: OpenAI's tool_calls item (`arguments`: a JSON string)."""
    id: str
    name: str
    arguments: str

    def openai(self) -> dict:
        return {"id": self.id, "type": "function",
                "function": {"name": self.name, "arguments": self.arguments}}


def new_call_id() -> str:
    return "call_" + uuid.uuid4().hex[:24]


def check_tools(tools: Any, field: str = "tools") -> tuple[Tool, ...]:
    """OpenAI's `tools` list as Tools (names unique, each schema an object within the size
    limit); a ToolError naming the field otherwise."""
    if not isinstance(tools, Sequence) or isinstance(tools, (str, bytes)):
        raise ToolError("must be a list of {'type': 'function', 'function': {...}}", field)
    if len(tools) > MAX_TOOLS:
        raise ToolError(f"at most {MAX_TOOLS} tools, got {len(tools)}", field)
    out: list[Tool] = []
    for i, t in enumerate(tools):
        f = f"{field}[{i}]"
        if not isinstance(t, Mapping) or t.get("type", "function") != "function":
            raise ToolError("must be {'type': 'function', 'function': {...}}", f"{f}.type")
        fn = t.get("function")
        if not isinstance(fn, Mapping):
            raise ToolError("must be an object with a name", f"{f}.function")
        name = fn.get("name")
        if not isinstance(name, str) or not NAME.match(name):
            raise ToolError(f"must be 1 to 64 letters, digits, '_' or '-', got {name!r:.80}", f"{f}.function.name")
        if any(x.name == name for x in out):
            raise ToolError(f"the name {name!r} is used twice", f"{f}.function.name")
        desc = fn.get("description") or ""
        if not isinstance(desc, str):
            raise ToolError("must be a string", f"{f}.function.description")
        params = fn.get("parameters")
        if params is not None:
            _check_schema(params, f"{f}.function.parameters")
        out.append(Tool(name, desc, params))
    return tuple(out)


def _check_schema(schema: Any, field: str) -> None:
    if not isinstance(schema, Mapping):
        raise ToolError("must be a JSON schema object", field)
    if schema.get("type", "object") != "object":
        raise ToolError(f"must have type 'object', got {schema.get('type')!r:.40}", field)
    try:
        size = len(json.dumps(schema, separators=(",", ":")))
    except (TypeError, ValueError, RecursionError):
        raise ToolError("is not JSON", field) from None
    if size > MAX_SCHEMA_CHARS:
        raise ToolError(f"the schema is {size} characters, more than the {MAX_SCHEMA_CHARS} allowed", field)


def check_tool_choice(choice: Any, tools: Sequence[Tool], field: str = "tool_choice") -> str:
    """'auto', 'none', 'required' or the name of the function the request forces."""
    if choice is None:
        return "auto" if tools else "none"
    if isinstance(choice, str):
        if choice not in CHOICES:
            raise ToolError(f"must be one of {', '.join(CHOICES)} or {{'type': 'function', "
                            f"'function': {{'name': ...}}}}, got {choice!r:.40}", field)
        if choice == "required" and not tools:
            raise ToolError("'required' needs at least one tool in `tools`", field)
        return choice
    fn = choice.get("function") if isinstance(choice, Mapping) else None
    name = fn.get("name") if isinstance(fn, Mapping) else None
    if not isinstance(name, str) or choice.get("type", "function") != "function":
        raise ToolError("must be {'type': 'function', 'function': {'name': ...}}", field)
    if not any(t.name == name for t in tools):
        raise ToolError(f"names the function {name!r:.80}, which is not in `tools`", f"{field}.function.name")
    return name


# -- the grammar ---------------------------------------------------------------------------

def _lark_str(s: str) -> str:
    """s as a Lark string literal."""
    return json.dumps(s, ensure_ascii=False)


def _call_rule(i: int, tool: Tool) -> list[str]:
    head = '{"name": ' + json.dumps(tool.name) + ', "arguments": '
    schema = dict(tool.parameters) if tool.parameters is not None else {"type": "object"}
    schema["x-guidance"] = COMPACT         # as the template writes calls: no free whitespace
    return [f"call{i}: {_lark_str(OPEN + chr(10) + head)} args{i} {_lark_str('}' + chr(10) + CLOSE)}",
            f"args{i}: %json {json.dumps(schema, ensure_ascii=False)}"]


def grammar(tools: Sequence[Tool], choice: str, parallel: bool = True) -> str | None:
    """The Lark grammar (llguidance's dialect) an answer under `choice` follows; None: free
    text.  parallel False (OpenAI's parallel_tool_calls): at most one call."""
    if choice == "none" or not tools:
        return None
    chosen = [t for t in tools if t.name == choice] if choice not in CHOICES else list(tools)
    rules = []
    for i, t in enumerate(chosen):
        rules += _call_rule(i, t)
    calls = " | ".join(f"call{i}" for i in range(len(chosen)))
    if choice not in CHOICES:                                   # a named function: one call
        start = "start: call0"
    else:
        start = "start: TEXT | calls" if choice == "auto" else "start: calls"
        rules += ['calls: call ("\\n" call)*' if parallel else "calls: call", f"call: {calls}"]
    if choice == "auto":
        rules.append(f"TEXT: /(?s:.+)/ & ~/(?s:.*{re.escape(OPEN)}.*)/")
    return "\n".join([start, *rules]) + "\n"


def constraint(tools: Sequence[Tool], choice: str, parallel: bool = True) -> ConstraintSpec | None:
    """The ConstraintSpec of `grammar` (for generate(constraint=...)); None: free text."""
    g = grammar(tools, choice, parallel)
    return None if g is None else ConstraintSpec("lark", g)


# -- the prompt -----------------------------------------------------------------------------

def template_messages(messages: Sequence[Mapping[str, Any]]) -> list[dict]:
    """Messages as chat templates expect them: an assistant's tool_calls with `arguments`
    parsed into objects (templates write them with `tojson`), content "" where it is None."""
    out = []
    for i, m in enumerate(messages):
        m = dict(m)
        if m.get("tool_calls"):
            calls = []
            for j, c in enumerate(m["tool_calls"]):
                fn = dict(c.get("function") or {}) if isinstance(c, Mapping) else {}
                args = fn.get("arguments", "{}")
                if isinstance(args, str):
                    try:
                        args = json.loads(args or "{}")
                    except ValueError:
                        raise ToolError("is not JSON", f"messages[{i}].tool_calls[{j}].function.arguments") from None
                calls.append({**dict(c), "function": {**fn, "arguments": args}})
            m["tool_calls"] = calls
        if m.get("content") is None:
            m["content"] = ""
        out.append(m)
    return out


def _system_text(tools: Sequence[Tool]) -> str:
    """The tools described as Qwen2.5's template does, for templates without a tools branch."""
    sigs = "".join("\n" + json.dumps(t.openai(), ensure_ascii=False) for t in tools)
    return ("# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
            "You are provided with function signatures within <tools></tools> XML tags:\n<tools>"
            f"{sigs}\n</tools>\n\nFor each function call, return a json object with function name "
            "and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n"
            '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>')


def chat_prompt(tokenizer, messages: Sequence[Mapping[str, Any]], tools: Sequence[Tool] = (),
                choice: str = "auto") -> str:
    """The prompt for a chat with tools, in the model's own template: its tools branch
    (`tools` rendered with `tojson`), or, for a template without one, the tools described
    in a system message.  choice 'none': the tools are left out of the prompt."""
    msgs = template_messages(messages)
    if not tools or choice == "none":
        return template.chat_prompt(tokenizer, msgs)
    source = tokenizer.chat_template or ""
    if "tools" in source:
        return template.chat_prompt(tokenizer, msgs, tools=[t.openai() for t in tools])
    if msgs[0].get("role") == "system":
        msgs[0] = {**msgs[0], "content": msgs[0]["content"] + "\n\n" + _system_text(tools)}
    else:
        msgs.insert(0, {"role": "system", "content": _system_text(tools)})
    return template.chat_prompt(tokenizer, msgs)


# -- the answer -----------------------------------------------------------------------------

_BLOCK = re.compile(re.escape(OPEN) + r"\s*(.*?)\s*" + re.escape(CLOSE), re.S)


def _call(body: str, make_id: Callable[[], str]) -> ToolCall | None:
    try:
        obj = json.loads(body)
    except ValueError:
        return None
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return None
    args = obj.get("arguments", {})
    return ToolCall(make_id(), obj["name"], args if isinstance(args, str) else json.dumps(args, ensure_ascii=False))


def parse(text: str, make_id: Callable[[], str] = new_call_id) -> tuple[str | None, list[ToolCall]]:
    """(content, calls) of an answer: every complete, well-formed <tool_call> block becomes a
    call; the rest of the text (None if nothing but blanks) is the content.  A block that
    does not parse stays in the content, as written."""
    calls, rest, at = [], [], 0
    for m in _BLOCK.finditer(text):
        call = _call(m.group(1), make_id)
        if call is None:
            continue
        rest.append(text[at:m.start()])
        at = m.end()
        calls.append(call)
    rest.append(text[at:])
    content = "".join(rest).strip() if calls else text
    return (content or None) if calls else text, calls


class StreamParser:
    """The answer's text, fed piece by piece, as OpenAI's stream deltas: {"content": ...}
    for free text and {"tool_calls": [{"index", "id", "type", "function": {"name",
    "arguments"}}]} for each call, once its block is complete (a call's deltas therefore
    join into what `parse` returns).  Text that may be the start of `<tool_call>` is held
    back until it is known not to be."""

    def __init__(self, make_id: Callable[[], str] = new_call_id):
        self.buf = ""
        self.make_id = make_id
        self.calls: list[ToolCall] = []

    def feed(self, text: str) -> Iterator[dict]:
        self.buf += text
        while self.buf:
            start = self.buf.find(OPEN)
            if start < 0:
                keep = _partial_suffix(self.buf, OPEN)
                out, self.buf = self.buf[:len(self.buf) - keep], self.buf[len(self.buf) - keep:]
                if out:
                    yield {"content": out}
                return
            if start > 0:
                yield {"content": self.buf[:start]}
                self.buf = self.buf[start:]
            end = self.buf.find(CLOSE)
            if end < 0:
                return
            block, self.buf = self.buf[:end + len(CLOSE)], self.buf[end + len(CLOSE):]
            call = _call(block[len(OPEN):end].strip(), self.make_id)
            if call is None:
                yield {"content": block}
                continue
            if self.calls and self.buf.startswith("\n"):     # the blank between two calls
                self.buf = self.buf[1:]
            yield self._delta(call)

    def _delta(self, call: ToolCall) -> dict:
        self.calls.append(call)
        return {"tool_calls": [{"index": len(self.calls) - 1, **call.openai()}]}

    def flush(self) -> Iterator[dict]:
        """What is left when the answer ends (an unfinished block: content, as written)."""
        if self.buf and not (self.calls and not self.buf.strip()):
            yield {"content": self.buf}
        self.buf = ""


def _partial_suffix(text: str, word: str) -> int:
    """Length of the longest suffix of text that is a proper prefix of word."""
    for n in range(min(len(word) - 1, len(text)), 0, -1):
        if text.endswith(word[:n]):
            return n
    return 0
