"""Request fuzzing of `specdec serve`: random bodies against every endpoint, each answer
classified, the server checked alive and still right afterwards.

Bodies start from a valid request of each endpoint and are mutated from a seeded
np.random.Generator: fields dropped, set to values of every JSON type (and to huge, negative,
NaN-like and deeply nested ones), unknown fields added, messages broken, the body replaced
by non-JSON bytes (invalid UTF-8, truncated JSON, a bare array or scalar, nothing).

Outcomes: `ok` (200 with a JSON body of the endpoint's shape, or a stream ending in
`data: [DONE]`), `rejected` (a 4xx with an OpenAI error body {"error": {"message", ...}});
failures: `server_error` (5xx), `bad_body` (a status without the body it promises),
`hang` (no answer within the timeout), `dead` (the server process exited).
"""
from __future__ import annotations

import json
from collections import Counter
from typing import Callable

import httpx
import numpy as np

FAILURES = ("server_error", "bad_body", "hang", "dead")

BASES = {
    "/v1/completions": {"prompt": "abcabc", "max_tokens": 4, "temperature": 0},
    "/v1/chat/completions": {"messages": [{"role": "user", "content": "abc"}], "max_tokens": 4},
}
FIELDS = ["prompt", "max_tokens", "temperature", "top_p", "top_k", "min_p", "seed", "stop",
          "stream", "messages", "n", "model", "draft", "draft_n", "logprobs", "n_probs",
          "ignore_eos", "stream_options", "max_completion_tokens", "n_predict",
          "response_format", "json_schema", "grammar", "tools", "tool_choice", "parallel_tool_calls"]
STRUCTURED = ("response_format", "json_schema", "grammar", "tools", "tool_choice")
SCHEMAS = [{"type": "object", "properties": {"a": {"enum": ["x", "y"]}}, "required": ["a"]},
           {"type": "nope"}, {"type": "object", "properties": {"a": {"$ref": "#/missing"}}}, True, False,
           {"type": "string", "pattern": "(("}, {"enum": []}, {"type": "array", "minItems": 5, "maxItems": 2},
           {"type": "object", "description": "x" * 70_000}, {"type": "integer", "minimum": 1e308}]
GRAMMARS = ['root ::= "yes" | "no"', "root ::= ", 'root ::= [a-z]+ "("', "root ::= other",
            'root ::= "a" root | "b"', "%%%", 'root ::= "x"{1000000}', "start: /a+/"]
TOOL = {"type": "function", "function": {"name": "f", "parameters": SCHEMAS[0]}}


def _structured(rng: np.random.Generator, name: str):
    """A value for one of the structured-output fields: well-formed, broken, or hostile."""
    pick = lambda xs: xs[int(rng.integers(0, len(xs)))]     # noqa: E731
    if name == "response_format":
        return pick([{"type": "text"}, {"type": "json_object"}, {"type": "xml"}, {"type": "json_schema"},
                     {"type": "json_schema", "json_schema": {"name": "s", "schema": pick(SCHEMAS),
                                                             "strict": pick([True, False, "yes"])}},
                     {"type": "json_object", "schema": pick(SCHEMAS)}, "json"])
    if name == "json_schema":
        return pick([*SCHEMAS, "{not json", "[]"])
    if name == "grammar":
        return pick(GRAMMARS)
    if name == "tools":
        return pick([[TOOL], [TOOL, TOOL], [{"type": "function", "function": {"name": "bad name"}}],
                     [{"type": "function", "function": {"name": "g", "parameters": pick(SCHEMAS)}}],
                     [{"type": "retrieval"}], {"f": 1}, [TOOL] * 300])
    return pick(["auto", "none", "required", "any", {"type": "function", "function": {"name": "f"}},
                 {"type": "function", "function": {"name": "missing"}}, {"type": "function"}])


def _value(rng: np.random.Generator, depth: int = 0):
    """A random JSON value of any type, sometimes extreme."""
    k = int(rng.integers(0, 14))
    if k == 0:
        return None
    if k == 1:
        return bool(rng.integers(0, 2))
    if k == 2:
        return int(rng.integers(-5, 40))
    if k == 3:
        return int(rng.choice([-2**63, -1, 0, 2**31, 2**63 - 1, 10**30]))
    if k == 4:
        return float(rng.choice([-1e308, -0.5, 0.0, 0.3, 1.0, 2.5, 1e308]))
    if k == 5:
        return "".join(chr(int(c)) for c in rng.integers(1, 0x2FFF, int(rng.integers(0, 12))))
    if k == 6:
        return "x" * int(rng.choice([0, 1, 5000, 200_000]))
    if k == 7:
        return ["NaN", "Infinity", "-1", "1e999", "\u0000", "<|im_end|>"][int(rng.integers(0, 6))]
    if k == 8 and depth < 3:
        return [_value(rng, depth + 1) for _ in range(int(rng.integers(0, 4)))]
    if k == 9 and depth < 3:
        return {str(_value(rng, 3)): _value(rng, depth + 1) for _ in range(int(rng.integers(0, 3)))}
    if k == 10:
        return [{"role": str(rng.choice(["user", "system", "assistant", "robot", ""])),
                 "content": _value(rng, 3)} for _ in range(int(rng.integers(0, 3)))]
    if k == 11:
        nested: object = 1
        for _ in range(int(rng.integers(50, 400))):
            nested = [nested]
        return nested
    if k == 12:
        return str(rng.choice(["model", "prompt-lookup", "hybrid", "none", "tree"]))
    return int(rng.integers(0, 3))


def body(rng: np.random.Generator, path: str) -> bytes:
    """One mutated request body for `path` (bytes, maybe not JSON)."""
    k = int(rng.integers(0, 10))
    if k == 0:                                          # not JSON at all
        return [b"", b"{", b"{\"prompt\": ", b"\xff\xfe\x00", b"null", b"[1, 2]", b"42",
                b"{\"prompt\": \"a\"} trailing", b"\"just a string\""][int(rng.integers(0, 9))]
    req = dict(BASES[path])
    for _ in range(int(rng.integers(1, 4))):
        op = int(rng.integers(0, 3))
        name = FIELDS[int(rng.integers(0, len(FIELDS)))]
        if op == 0 and req:
            req.pop(list(req)[int(rng.integers(0, len(req)))])
        elif op == 1:
            req[name] = _structured(rng, name) if name in STRUCTURED and rng.integers(0, 4) else _value(rng)
        else:
            req[f"unknown_{int(rng.integers(0, 99))}"] = _value(rng)
    if req.get("max_tokens") is not None and isinstance(req["max_tokens"], int) and req["max_tokens"] > 64:
        req["max_tokens"] = 64                          # bounded work: the context holds 256
    return json.dumps(req).encode("utf-8", "surrogatepass")


def classify(r: httpx.Response) -> str:
    """The outcome of one answer (module docstring)."""
    if r.status_code >= 500:
        return "server_error"
    if r.status_code == 200 and r.headers.get("content-type", "").startswith("text/event-stream"):
        return "ok" if r.text.rstrip().endswith("data: [DONE]") else "bad_body"
    try:
        j = r.json()
    except ValueError:
        return "bad_body"
    if r.status_code == 200:
        return "ok" if isinstance(j, dict) and "choices" in j and "usage" in j else "bad_body"
    if 400 <= r.status_code < 500:
        err = j.get("error") if isinstance(j, dict) else None
        return "rejected" if isinstance(err, dict) and isinstance(err.get("message"), str) else "bad_body"
    return "bad_body"


def run(url: str, n: int, rng: np.random.Generator, alive: Callable[[], bool],
        timeout: float = 60.0) -> tuple[Counter, list[dict]]:
    """n fuzzed requests, spread over the POST endpoints (plus a GET of each other route now
    and then) -> (counts by outcome, the failing cases with their bodies)."""
    counts: Counter = Counter()
    failed: list[dict] = []
    paths = list(BASES)
    with httpx.Client(timeout=timeout) as client:
        for i in range(n):
            path = paths[i % len(paths)]
            data = body(rng, path)
            try:
                if i % 25 == 24:
                    r = client.get(url + ["/health", "/v1/models", "/metrics", "/v1/nothing"][(i // 25) % 4])
                    outcome = "ok" if r.status_code in (200, 404) else "server_error"
                else:
                    r = client.post(url + path, content=data, headers={"content-type": "application/json"})
                    outcome = classify(r)
            except httpx.TimeoutException:
                outcome = "hang"
            except httpx.HTTPError:
                outcome = "dead" if not alive() else "hang"
            counts[outcome] += 1
            if outcome in FAILURES:
                failed.append({"path": path, "body": data[:300].decode("utf-8", "replace"),
                               "outcome": outcome})
                if outcome == "dead":
                    break
    return counts, failed
