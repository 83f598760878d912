"""Structured output of a request: OpenAI's `response_format` and `tools` / `tool_choice`,
llama-server's `grammar` and `json_schema`, each checked and turned into the one
ConstraintSpec its job decodes under (generation/constraint.py); a bad one is a 400 naming
the field.

    response_format {"type": "text"}                           no constraint
                    {"type": "json_object"}                     any JSON object
                    {"type": "json_object", "schema": S}        S (llama-server's form)
                    {"type": "json_schema", "json_schema": {"name", "schema": S, "strict"}}
    json_schema     S                                           (llama-server)
    grammar         GBNF text, as llama.cpp writes it           (llama-server)
    tools, tool_choice                                          api/tools.py's grammar

`strict` is accepted either way: the output always follows the schema (a constraint, not a
hint).  At most one of these per request.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from ...api import tools as T
from ...errors import SpecdecError
from ...generation.constraint import ConstraintSpec
from .wire import ApiError

FORMATS = ("text", "json_object", "json_schema")


@dataclass(frozen=True)
class Structured:
    """What a request asks of its output: the constraint (None: free text) and, for a chat
    with tools, the tools and the choice (the answer is parsed into tool_calls)."""
    constraint: ConstraintSpec | None = None
    tools: tuple[T.Tool, ...] = ()
    choice: str = "none"

    @property
    def parses_tools(self) -> bool:
        return bool(self.tools) and self.choice != "none"


def _schema_text(schema: Any, field: str) -> str:
    if isinstance(schema, str):                 # a schema sent as JSON text
        try:
            schema = json.loads(schema)
        except ValueError:
            raise ApiError(400, f"{field}: not valid JSON", param=field) from None
    if not isinstance(schema, (dict, bool)):
        raise ApiError(400, f"{field}: a JSON schema is an object, got {type(schema).__name__}", param=field)
    return json.dumps(schema, ensure_ascii=False)


def _response_format(rf: Any) -> tuple[ConstraintSpec | None, str]:
    field = "response_format"
    if not isinstance(rf, dict) or rf.get("type") not in FORMATS:
        raise ApiError(400, f"{field}.type: must be one of {', '.join(FORMATS)}", param=f"{field}.type")
    kind = rf["type"]
    if kind == "text":
        return None, field
    if kind == "json_object":
        if rf.get("schema") is not None:
            return ConstraintSpec("json_schema", _schema_text(rf["schema"], f"{field}.schema")), f"{field}.schema"
        return ConstraintSpec("json_object", ""), field
    js = rf.get("json_schema")
    if not isinstance(js, dict):
        raise ApiError(400, f"{field}.json_schema: expected {{'name', 'schema', 'strict'}}",
                       param=f"{field}.json_schema")
    if "strict" in js and not isinstance(js["strict"], bool):
        raise ApiError(400, f"{field}.json_schema.strict: expected true or false",
                       param=f"{field}.json_schema.strict")
    if js.get("schema") is None:                # OpenAI: a name with no schema is any JSON object
        return ConstraintSpec("json_object", ""), f"{field}.json_schema"
    where = f"{field}.json_schema.schema"
    return ConstraintSpec("json_schema", _schema_text(js["schema"], where)), where


def _tools(body) -> tuple[tuple[T.Tool, ...], str]:
    try:
        tools = T.check_tools(body.tools) if body.tools else ()
        choice = T.check_tool_choice(body.tool_choice, tools)
    except T.ToolError as e:
        raise ApiError(400, str(e), param=e.field) from None
    return tools, choice


def structured(body, chat: bool) -> Structured:
    """The request's Structured output, every constraint checked (an ApiError naming the
    field otherwise: a bad schema, grammar or tool; a tool_choice naming no tool; a schema
    over the size limit; two constraints at once)."""
    given: list[tuple[ConstraintSpec | None, str]] = []
    if body.response_format is not None:
        given.append(_response_format(body.response_format))
    if body.json_schema is not None:
        given.append((ConstraintSpec("json_schema", _schema_text(body.json_schema, "json_schema")), "json_schema"))
    if body.grammar is not None:
        if not isinstance(body.grammar, str):
            raise ApiError(400, "grammar: expected GBNF text", param="grammar")
        given.append((ConstraintSpec("gbnf", body.grammar) if body.grammar.strip() else None, "grammar"))
    tools, choice = _tools(body) if chat else ((), "none")
    if chat and tools and choice != "none":
        given.append((T.constraint(tools, choice, parallel=body.parallel_tool_calls is not False), "tools"))
    given = [(c, f) for c, f in given if c is not None]
    if len(given) > 1:
        names = ", ".join(f.split(".")[0] for _, f in given)
        raise ApiError(400, f"{given[1][1]}: give one of response_format, json_schema, grammar "
                            f"and tools per request (got {names})", param=given[1][1].split(".")[0])
    spec, field = given[0] if given else (None, "")
    if spec is not None:
        _check(spec, field)
    return Structured(spec, tools, choice)


def _check(spec: ConstraintSpec, field: str) -> None:
    """spec.check(), its error a 400 naming the request's own field."""
    try:
        spec.check()
    except SpecdecError as e:
        msg = str(e)
        own = getattr(e, "field", None)
        if own and msg.startswith(own + ":"):       # the core names its kind; say the request's field
            msg = msg[len(own) + 1:].strip()
        raise ApiError(400, f"{field}: {msg}", param=field) from None
