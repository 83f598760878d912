"""Structured output over HTTP (serve/structured.py, api/tools.py), through the official
`openai` client and raw HTTP: response_format (json_object, json_schema with strict),
llama-server's json_schema and grammar, tools with each tool_choice answered as tool_calls
(whole and streamed), every bad schema / grammar / tool a 400 naming the field, and the
server alive afterwards.  A tiny synthetic model whose vocabulary spells JSON."""
from __future__ import annotations

import json
from dataclasses import replace

import httpx
import openai
import pytest

pytest.importorskip("llguidance")

from servers import SPEC, Server  # noqa: E402
from synth import write_tiny_model  # noqa: E402

# byte-level BPE texts: newline and space in GPT-2's byte alphabet, then printable ASCII
TOKENS = ("<s>", "\u010a", "\u0120", *(chr(c) for c in range(0x21, 0x7f)), "</s>")
TYPES = (3, *([1] * (len(TOKENS) - 2)), 3)
JSON_SPEC = replace(SPEC, n_vocab=len(TOKENS), tokens=TOKENS, token_types=TYPES)
SCHEMA = {"type": "object", "properties": {"answer": {"enum": ["yes", "no"]}, "sure": {"type": "boolean"}},
          "required": ["answer", "sure"], "additionalProperties": False}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "weather",
                                            "parameters": {"type": "object", "properties": {
                                                "unit": {"enum": ["C", "F"]}}, "required": ["unit"],
                                                "additionalProperties": False}}},
         {"type": "function", "function": {"name": "get_time", "parameters": {
             "type": "object", "properties": {"utc": {"type": "boolean"}}, "required": ["utc"],
             "additionalProperties": False}}}]
MSGS = [{"role": "user", "content": "weather?"}]
N = 48
NT = 200          # a tool call: ~80 one-character tokens of forced text around the arguments
MODEL = "tiny"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    d = tmp_path_factory.mktemp("structured")
    target = write_tiny_model(d / "target.gguf", JSON_SPEC)
    draft = write_tiny_model(d / "draft.gguf", replace(JSON_SPEC, n_layer=1))
    s = Server(["-m", str(target), "-md", str(draft), "-np", "2", "-c", "1536", "--draft-n", "4", "--draft-p", "0",
                "--alias", MODEL],
               d / "server.log")
    yield s
    s.stop()


def chat(s: Server, **kw) -> dict:
    r = s.post("/v1/chat/completions", {"messages": MSGS, "max_tokens": N, "temperature": 0, **kw})
    assert r.status_code == 200, r.text
    return r.json()


def valid(obj) -> bool:
    return set(obj) == {"answer", "sure"} and obj["answer"] in ("yes", "no") and isinstance(obj["sure"], bool)


def test_response_format_json_schema_through_the_openai_client(server):
    out = server.client.chat.completions.create(
        model=MODEL, messages=MSGS, max_tokens=N, temperature=0,
        response_format={"type": "json_schema", "json_schema": {"name": "a", "schema": SCHEMA, "strict": True}})
    c = out.choices[0]
    assert c.finish_reason == "stop", c
    assert valid(json.loads(c.message.content))


def test_json_object_and_llama_server_fields(server):
    j = chat(server, response_format={"type": "json_object"})
    if j["choices"][0]["finish_reason"] == "stop":
        assert isinstance(json.loads(j["choices"][0]["message"]["content"]), dict)
    for body in ({"json_schema": SCHEMA}, {"response_format": {"type": "json_object", "schema": SCHEMA}}):
        r = server.post("/v1/completions", {"prompt": "abc", "max_tokens": N, "temperature": 0, **body})
        assert r.status_code == 200, r.text
        assert valid(json.loads(r.json()["choices"][0]["text"]))
    r = server.post("/v1/completions", {"prompt": "abc", "max_tokens": N, "temperature": 0,
                                        "grammar": 'root ::= ("yes" | "no") "!"'})
    assert r.json()["choices"][0]["text"] in ("yes!", "no!")


def test_speculation_changes_nothing_under_a_constraint(server):
    plain = chat(server, json_schema=SCHEMA, draft="none", seed=3, temperature=0)
    for draft in ("model", "prompt-lookup"):
        spec = chat(server, json_schema=SCHEMA, draft=draft, seed=3, temperature=0)
        assert spec["choices"][0]["message"]["content"] == plain["choices"][0]["message"]["content"]


def test_a_named_tool_is_answered_as_tool_calls(server):
    out = server.client.chat.completions.create(
        model=MODEL, messages=MSGS, max_tokens=NT, temperature=0, tools=TOOLS,
        tool_choice={"type": "function", "function": {"name": "get_time"}})
    c = out.choices[0]
    assert c.finish_reason == "tool_calls" and c.message.content is None
    (call,) = c.message.tool_calls
    assert call.type == "function" and call.id.startswith("call_") and call.function.name == "get_time"
    assert isinstance(json.loads(call.function.arguments)["utc"], bool)


def test_required_tool_calls_stream_as_deltas(server):
    whole = chat(server, tools=TOOLS, tool_choice="required", parallel_tool_calls=False, max_tokens=NT)["choices"][0]
    assert whole["finish_reason"] == "tool_calls" and whole["message"]["tool_calls"]
    calls: dict[int, dict] = {}
    finish = None
    for ch in server.client.chat.completions.create(model=MODEL, messages=MSGS, max_tokens=NT, temperature=0,
                                                    tools=TOOLS, tool_choice="required", stream=True,
                                                    parallel_tool_calls=False):
        d = ch.choices[0].delta if ch.choices else None
        for tc in (d.tool_calls or []) if d else []:
            c = calls.setdefault(tc.index, {"name": "", "arguments": ""})
            c["name"] += tc.function.name or ""
            c["arguments"] += tc.function.arguments or ""
        finish = (ch.choices[0].finish_reason if ch.choices else None) or finish
    assert finish == "tool_calls"
    assert [calls[i] for i in sorted(calls)] == [
        {"name": t["function"]["name"], "arguments": t["function"]["arguments"]}
        for t in whole["message"]["tool_calls"]]


def test_tool_results_go_back_in_and_none_means_text(server):
    msgs = [*MSGS, {"role": "assistant", "content": None, "tool_calls": [
                {"id": "call_1", "type": "function", "function": {"name": "get_time", "arguments": '{"utc": true}'}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": "12:00"}]
    j = chat(server, messages=msgs, tools=TOOLS, tool_choice="none")
    assert "tool_calls" not in j["choices"][0]["message"] and j["choices"][0]["finish_reason"] != "tool_calls"


def test_a_constraint_cut_by_max_tokens_ends_with_length(server):
    j = chat(server, json_schema=SCHEMA, max_tokens=3)
    assert j["choices"][0]["finish_reason"] == "length"
    j = chat(server, tools=TOOLS, tool_choice="required", max_tokens=5)
    c = j["choices"][0]
    assert c["finish_reason"] == "length" and "tool_calls" not in c["message"]


BIG = {"type": "object", "properties": {f"p{i}": {"type": "string", "description": "x" * 64} for i in range(1200)}}


@pytest.mark.parametrize("body, param", [
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "a", "schema": {"type": "nope"}}}},
     "response_format.json_schema.schema"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "a", "schema": SCHEMA, "strict": "y"}}},
     "response_format.json_schema.strict"),
    ({"response_format": {"type": "xml"}}, "response_format.type"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "a", "schema": BIG}}},
     "response_format.json_schema.schema"),
    ({"json_schema": "{nope"}, "json_schema"),
    ({"json_schema": {"type": "string", "pattern": "(("}}, "json_schema"),
    ({"grammar": 'root ::= "a" ('}, "grammar"),
    ({"grammar": "root ::= undefined_rule"}, "grammar"),
    ({"json_schema": SCHEMA, "grammar": 'root ::= "a"'}, "grammar"),
    ({"tools": [{"type": "function", "function": {"name": "bad name"}}]}, "tools[0].function.name"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "array"}}}]},
     "tools[0].function.parameters"),
    ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}},
     "tool_choice.function.name"),
    ({"tools": TOOLS, "tool_choice": "sometimes"}, "tool_choice"),
    ({"tool_choice": "required"}, "tool_choice"),
    ({"tools": "get_time"}, "tools"),
    ({"messages": [{"role": "assistant", "content": None, "tool_calls": [
        {"id": "c", "type": "function", "function": {"name": "f", "arguments": "{bad"}}]}]},
     "messages[0].tool_calls[0].function.arguments"),
])
def test_bad_structured_input_is_a_400_naming_the_field(server, body, param):
    r = server.post("/v1/chat/completions", {"messages": MSGS, "max_tokens": 4, **body})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == param and err["type"] == "invalid_request_error", err
    assert err["message"].startswith(param.split("[")[0])
    with pytest.raises(openai.BadRequestError):
        server.client.chat.completions.create(model=MODEL, messages=MSGS, max_tokens=4,
                                              extra_body=body if "messages" not in body else {"grammar": "%%%"})
    assert httpx.get(server.url + "/health").json()["status"] == "ok"


def test_a_streamed_tool_call_keeps_every_tokens_logprob_and_the_specdec_field(server):
    body = {"messages": MSGS, "max_tokens": NT, "temperature": 0, "tools": TOOLS, "stream": True,
            "tool_choice": {"type": "function", "function": {"name": "get_time"}}, "logprobs": True,
            "specdec": {"tokens": True}, "stream_options": {"include_usage": True}}
    r = server.post("/v1/chat/completions", body)
    assert r.status_code == 200 and r.text.rstrip().endswith("data: [DONE]")
    chunks = [json.loads(x[6:]) for x in r.text.split("\n\n") if x.startswith("data: {")]
    lps = [t for c in chunks for ch in c.get("choices", []) for t in ((ch.get("logprobs") or {}).get("content") or [])]
    tokens = [t for c in chunks for t in (c.get("specdec") or {}).get("tokens", [])]
    n = chunks[-1]["usage"]["completion_tokens"]
    assert len(lps) == n and len(tokens) == n
    assert "".join(t["token"] for t in lps).startswith('<tool_call>\n{"name": "get_time"')
    finish = [ch["finish_reason"] for c in chunks for ch in c.get("choices", []) if ch.get("finish_reason")]
    assert finish == ["tool_calls"]


@pytest.mark.slow
def test_fuzzed_structured_requests_on_a_vocabulary_that_spells_json(server):
    """The request fuzzer (tests/fuzz/request_fuzz.py) against a model whose constraints can
    be met: every answer a 200 or a 4xx body, the server alive and its answers unchanged."""
    import sys
    from pathlib import Path

    import numpy as np
    sys.path.insert(0, str(Path(__file__).parents[2] / "fuzz"))
    import request_fuzz
    before = chat(server, json_schema=SCHEMA)["choices"][0]["message"]["content"]
    counts, failed = request_fuzz.run(server.url, 120, np.random.default_rng(7),
                                      alive=lambda: server.proc.poll() is None)
    assert failed == [] and counts["ok"] > 0 and counts["rejected"] > 0, (counts, failed[:3])
    assert chat(server, json_schema=SCHEMA)["choices"][0]["message"]["content"] == before
