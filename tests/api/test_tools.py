"""Tool calls (specdec.api.tools): OpenAI's tools checked with the field named, rendered in the
model's own template, the grammar of each tool_choice accepting the calls it should and no
other text, and answers parsed back into OpenAI's tool_calls, streamed pieces joining into
what the whole answer parses to."""
from __future__ import annotations

import itertools
import json
from dataclasses import dataclass

import pytest
from hypothesis import given, settings, strategies as st

from specdec.api import tools as T

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather of a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"},
                                                    "unit": {"enum": ["C", "F"]}},
                   "required": ["city"], "additionalProperties": False}}}
TIME = {"type": "function", "function": {"name": "get_time", "parameters": {
    "type": "object", "properties": {"tz": {"type": "string"}}, "required": ["tz"]}}}
TOOLS = T.check_tools([WEATHER, TIME])


def call(name: str, args: dict) -> str:
    return f'<tool_call>\n{{"name": "{name}", "arguments": {json.dumps(args)}}}\n</tool_call>'


def ids():
    n = itertools.count()
    return lambda: f"call_{next(n)}"


# -- definitions ---------------------------------------------------------------------------

@pytest.mark.parametrize("tools, field", [
    ("get_weather", "tools"),
    ([{"type": "retrieval"}], "tools[0].type"),
    ([{"type": "function"}], "tools[0].function"),
    ([{"type": "function", "function": {"name": "has space"}}], "tools[0].function.name"),
    ([{"type": "function", "function": {"name": "x" * 65}}], "tools[0].function.name"),
    ([WEATHER, WEATHER], "tools[1].function.name"),
    ([{"type": "function", "function": {"name": "f", "parameters": "{}"}}], "tools[0].function.parameters"),
    ([{"type": "function", "function": {"name": "f", "parameters": {"type": "array"}}}],
     "tools[0].function.parameters"),
    ([{"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "description": "x" * (T.MAX_SCHEMA_CHARS + 1)}}}], "tools[0].function.parameters"),
    ([{"type": "function", "function": {"name": "f", "description": 3}}], "tools[0].function.description"),
])
def test_bad_tools_name_the_field(tools, field):
    with pytest.raises(T.ToolError) as e:
        T.check_tools(tools)
    assert e.value.field == field and str(e.value).startswith(field + ":")


@pytest.mark.parametrize("choice, tools, field", [
    ("sometimes", TOOLS, "tool_choice"),
    ("required", (), "tool_choice"),
    ({"type": "function", "function": {"name": "nope"}}, TOOLS, "tool_choice.function.name"),
    ({"type": "function"}, TOOLS, "tool_choice"),
    (3, TOOLS, "tool_choice"),
])
def test_bad_tool_choice_names_the_field(choice, tools, field):
    with pytest.raises(T.ToolError) as e:
        T.check_tool_choice(choice, tools)
    assert e.value.field == field


def test_tool_choice_values():
    assert T.check_tool_choice(None, TOOLS) == "auto"
    assert T.check_tool_choice(None, ()) == "none"
    assert T.check_tool_choice("required", TOOLS) == "required"
    assert T.check_tool_choice({"type": "function", "function": {"name": "get_time"}}, TOOLS) == "get_time"
    assert T.grammar(TOOLS, "none") is None and T.grammar((), "auto") is None


# -- the prompt ------------------------------------------------------------------------------

QWEN_LIKE = (
    "{%- if tools %}{{- '<|im_start|>system\\n# Tools\\n<tools>' }}{%- for tool in tools %}"
    "{{- '\\n' }}{{- tool | tojson }}{%- endfor %}{{- '\\n</tools><|im_end|>\\n' }}{%- endif %}"
    "{%- for message in messages %}{%- if message.role == 'assistant' and message.tool_calls %}"
    "{{- '<|im_start|>assistant' }}{%- for tc in message.tool_calls %}"
    "{{- '\\n<tool_call>\\n{\"name\": \"' + tc.function.name + '\", \"arguments\": ' }}"
    "{{- tc.function.arguments | tojson }}{{- '}\\n</tool_call>' }}{%- endfor %}{{- '<|im_end|>\\n' }}"
    "{%- else %}{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}"
    "{%- endif %}{%- endfor %}{{- '<|im_start|>assistant\\n' }}")


@dataclass
class Tok:
    chat_template: str | None
    tokens: tuple = ("<s>", "</s>")
    bos_id: int | None = None
    eos_id: int | None = 1
    add_bos: bool = False


def test_tools_go_through_the_models_template():
    msgs = [{"role": "user", "content": "Paris?"},
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": "call_1", "type": "function",
                 "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
            {"role": "tool", "content": "sunny", "tool_call_id": "call_1"}]
    text = T.chat_prompt(Tok(QWEN_LIKE), msgs, TOOLS)
    assert text.startswith("<|im_start|>system\n# Tools\n<tools>\n" + json.dumps(TOOLS[0].openai()))
    assert call("get_weather", {"city": "Paris"}) in text             # arguments rendered as an object
    assert "<tools>" not in T.chat_prompt(Tok(QWEN_LIKE), msgs, TOOLS, "none")


def test_a_template_without_tools_gets_them_in_a_system_message():
    text = T.chat_prompt(Tok(None), [{"role": "user", "content": "Paris?"}], TOOLS)
    assert text.startswith("<|im_start|>system\n# Tools") and '"name": "get_time"' in text
    with pytest.raises(T.ToolError, match=r"messages\[0\].tool_calls\[0\].function.arguments"):
        T.chat_prompt(Tok(None), [{"role": "assistant", "tool_calls": [
            {"function": {"name": "f", "arguments": "{nope"}}]}], TOOLS)


# -- the grammar -----------------------------------------------------------------------------

def _matcher_factory():
    llg = pytest.importorskip("llguidance")

    class Bytes:                        # a byte-level vocabulary: every text has one tokenization
        eos_token_id, bos_token_id = 256, None
        tokens = [bytes([i]) for i in range(256)] + [b"<eos>"]
        special_token_ids = [256]

        def __call__(self, s):
            return list(s if isinstance(s, bytes) else s.encode())
    tok = llg.LLTokenizer(llg.TokenizerWrapper(Bytes()))

    def accepts(grammar: str, text: str) -> bool:
        m = llg.LLMatcher(tok, grammar, log_level=0)
        assert not m.is_error(), m.get_error()
        return m.consume_tokens(list(text.encode())) and m.is_accepting()
    return accepts


PARIS, TOKYO = call("get_weather", {"city": "Paris"}), call("get_time", {"tz": "Asia/Tokyo"})


@pytest.mark.parametrize("choice, text, ok", [
    ("auto", "It is sunny.", True),
    ("auto", PARIS, True),
    ("auto", PARIS + "\n" + TOKYO, True),
    ("auto", "Let me look. " + PARIS, False),                   # text or calls, not both
    ("auto", call("get_weather", {"town": "Paris"}), False),    # the schema holds
    ("auto", call("launch", {}), False),                        # only the given tools
    ("required", "It is sunny.", False),
    ("required", TOKYO + "\n" + PARIS, True),
    ("get_time", TOKYO, True),
    ("get_time", PARIS, False),
    ("get_time", TOKYO + "\n" + TOKYO, False),                  # exactly one call
    ("get_weather", call("get_weather", {"city": "Oslo", "unit": "K"}), False),
])
def test_the_grammar_of_each_choice(choice, text, ok):
    assert _matcher_factory()(T.grammar(TOOLS, choice), text) is ok


# -- the answer ------------------------------------------------------------------------------

def test_parse_calls_and_content():
    assert T.parse("It is sunny.") == ("It is sunny.", [])
    content, calls = T.parse(PARIS + "\n" + TOKYO, ids())
    assert content is None
    assert [c.openai() for c in calls] == [
        {"id": "call_0", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}},
        {"id": "call_1", "type": "function", "function": {"name": "get_time", "arguments": '{"tz": "Asia/Tokyo"}'}}]
    assert T.parse("Looking. " + PARIS, ids())[0] == "Looking."
    broken = "<tool_call>\n{\"name\": \n</tool_call>"
    assert T.parse(broken) == (broken, [])
    assert T.parse(PARIS[:-3]) == (PARIS[:-3], [])              # cut off by max_tokens


def _stream(pieces):
    p = T.StreamParser(ids())
    deltas = [d for x in pieces for d in p.feed(x)] + list(p.flush())
    content = "".join(d.get("content", "") for d in deltas)
    calls = [tc for d in deltas for tc in d.get("tool_calls", ())]
    return content, calls


@settings(max_examples=200, deadline=None)
@given(st.sampled_from(["It is <b>sunny</b> <tool", PARIS, PARIS + "\n" + TOKYO, "Ok. " + TOKYO,
                        PARIS[:-5], "<tool_call>\nnot json\n</tool_call>"]),
       st.lists(st.integers(0, 200), max_size=8))
def test_streamed_deltas_join_into_the_parse(text, cuts):
    cuts = sorted({min(c, len(text)) for c in cuts})
    pieces = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)])]
    content, calls = _stream(pieces)
    want_content, want_calls = T.parse(text, ids())
    assert content.strip() == (want_content or "").strip()
    assert [(c["index"], c["id"], c["function"]) for c in calls] == \
           [(i, c.id, c.openai()["function"]) for i, c in enumerate(want_calls)]


@pytest.mark.parametrize("choice", ["auto", "required", "get_weather"])
def test_each_grammar_is_a_valid_constraint(choice):
    pytest.importorskip("llguidance")
    T.constraint(TOOLS, choice).check()
    T.constraint(TOOLS, choice, parallel=False).check()
    assert T.constraint(TOOLS, "none") is None
