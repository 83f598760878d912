"""The `specdec` extension of `specdec serve`'s responses (serve/tokenlog.py, docs/serve.md
"Watching speculation") and the page's routes (serve/webui.py), over HTTP on 127.0.0.1:
clients that do not ask never see the field; the tokens spell the answer; the step records
are the request's `--trace` records (a real model: the stream against `specdec run --trace`
with the same flags); the page is public, keyless and off with --no-webui."""
from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace

import httpx
import pytest

from servers import ROOT, SPEC, Server
from synth import write_tiny_model

from specdec.frontends.report import summarize
from specdec.frontends.report import load_trace
from specdec.speculation.trace import StepRecord

KEY = "page-test-key-7f3a"
TIMES = ("draft_s", "verify_s")          # wall-clock fields: equal in kind, not in value


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    d = tmp_path_factory.mktemp("tokens")
    target = write_tiny_model(d / "target.gguf", SPEC)
    draft = write_tiny_model(d / "draft.gguf", replace(SPEC, n_layer=1))
    s = Server(["-m", str(target), "-md", str(draft), "-np", "2", "-c", "256", "--draft-n", "4",
                "--draft-p", "0", "--api-key", KEY], d / "server.log", key=KEY)
    yield s
    s.stop()


def stream(s: Server, body: dict) -> list[dict]:
    r = s.post("/v1/completions", {**body, "stream": True})
    assert r.status_code == 200, r.text
    return [json.loads(line[6:]) for line in r.text.splitlines()
            if line.startswith("data: ") and line != "data: [DONE]"]


def gathered(chunks: list[dict]) -> tuple[str, list[dict], list[dict], dict | None]:
    text, tokens, steps, summary = "", [], [], None
    for c in chunks:
        text += c["choices"][0]["text"] if c["choices"] else ""
        ext = c.get("specdec") or {}
        tokens += ext.get("tokens", [])
        steps += ext.get("steps", [])
        summary = ext.get("summary", summary)
    return text, tokens, steps, summary


def check_against_records(tokens: list[dict], steps: list[dict]) -> None:
    """Each token's step, position, p(x) and q(x) are its step record's."""
    records = [StepRecord.from_json(json.dumps(r)) for r in steps]
    assert [r.step for r in records] == list(range(len(records)))
    assert [t["id"] for t in tokens] == [x for r in records for x in r.emitted]
    for t in tokens:
        r = records[t["step"]]
        j = t["pos"] - 1
        assert t["id"] == r.emitted[j]
        if j < r.n_accepted:
            assert t["kind"] == "accepted" and (t["p"], t["q"]) == (r.p_x[j], r.q_x[j])
        else:
            assert t["kind"] == r.next_kind and t["p"] is None and t["q"] is None


def test_clients_that_do_not_ask_never_see_the_field(server):
    body = {"prompt": "abcabc", "max_tokens": 12, "ignore_eos": True, "temperature": 0}
    assert all("specdec" not in c for c in stream(server, body))
    full = server.post("/v1/completions", body).json()
    assert "specdec" not in full
    chat = server.post("/v1/chat/completions", {"messages": [{"role": "user", "content": "ab"}],
                                                 "max_tokens": 6, "stream": True})
    assert '"specdec"' not in chat.text


@pytest.mark.parametrize("extra", [{}, {"temperature": 0.9, "seed": 3}, {"stop": ["d"]}])
def test_tokens_spell_the_text_and_match_their_steps(server, extra):
    body = {"prompt": "abcdabcdab", "max_tokens": 24, "ignore_eos": True, "temperature": 0,
            "specdec": {"tokens": True}, **extra}
    chunks = stream(server, body)
    text, tokens, steps, summary = gathered(chunks)
    assert "".join(t["text"] for t in tokens) == text
    last = chunks[-1]
    assert len(tokens) == last["usage"]["completion_tokens"]
    assert len(steps) == last["timings"]["draft_steps"] and "summary" in last["specdec"]
    check_against_records(tokens, steps)
    records = [StepRecord.from_json(json.dumps(r)) for r in steps]
    assert summary == {**summarize(records), "by_source": summary["by_source"], "kinds": summary["kinds"],
                       "drafting": summary["drafting"]}
    assert summary["drafting"].startswith("model, up to 4")
    assert sum(summary["kinds"].values()) == len(tokens)
    full = server.post("/v1/completions", {**body, "stream": False}).json()
    assert full["choices"][0]["text"] == text
    strip = (lambda rs: [{k: v for k, v in r.items() if k not in TIMES} for r in rs])
    assert full["specdec"]["tokens"] == tokens and strip(full["specdec"]["steps"]) == strip(steps)


def test_plain_decoding_tokens(server):
    chunks = stream(server, {"prompt": "abab", "max_tokens": 8, "ignore_eos": True, "draft": "none",
                             "specdec": {"tokens": True}})
    text, tokens, steps, summary = gathered(chunks)
    assert "".join(t["text"] for t in tokens) == text and len(tokens) == 8
    assert {t["kind"] for t in tokens} == {"sampled"} and steps == [] and summary["n_steps"] == 0
    assert all(t["step"] is None and t["p"] is None for t in tokens)


@pytest.mark.parametrize("field", [True, {"tokenz": True}, {"tokens": "maybe"}])
def test_a_bad_extension_request_is_a_400(server, field):
    r = server.post("/v1/completions", {"prompt": "ab", "max_tokens": 2, "specdec": field})
    assert r.status_code == 400 and r.json()["error"]["param"].startswith("specdec")


def test_the_page_is_public_and_holds_no_key(server):
    api = httpx.get(server.url + "/v1/models")
    assert api.status_code == 401                       # the API still wants the key
    for path, kind in [("/", "text/html"), ("/webui/app.js", "text/javascript"),
                       ("/webui/markdown.js", "text/javascript"), ("/webui/style.css", "text/css"),
                       ("/favicon.ico", "image/svg+xml")]:
        r = httpx.get(server.url + path)
        assert r.status_code == 200 and r.headers["content-type"].startswith(kind), path
        assert KEY not in r.text
        assert "script-src 'self'" in r.headers["content-security-policy"]
    page = httpx.get(server.url + "/").text
    assert "http://" not in page and "https://" not in page     # nothing from elsewhere
    assert httpx.get(server.url + "/webui/nothing.js").status_code == 401   # not a page file


def test_no_webui_turns_the_page_off(tmp_path):
    target = write_tiny_model(tmp_path / "t.gguf", SPEC)
    s = Server(["-m", str(target), "-np", "1", "-c", "128", "--no-webui"], tmp_path / "log")
    try:
        r = httpx.get(s.url + "/")
        assert r.status_code == 404 and r.json()["error"]["type"] == "not_found_error"
        assert httpx.get(s.url + "/webui/app.js").status_code == 404
        assert s.post("/v1/completions", {"prompt": "ab", "max_tokens": 2}).status_code == 200
    finally:
        s.stop()


@pytest.mark.real
@pytest.mark.slow
def test_the_stream_carries_the_requests_trace_record(tmp_path):
    """smollm2 drafting for itself (the draft's layers requantized to q4_0, so p != q), sampled:
    the step records a stream carries are `specdec run --trace`'s for the same request, field
    for field but the two timings, and the summary is trace-report's over that file."""
    from helpers import real_model_path
    path = str(real_model_path("smollm2-135m-instruct-q4_1"))
    flags = ["-m", path, "-md", path, "--draft-quant", "q4_0", "--draft-policy", "fixed", "--draft-n", "4",
             "-c", "512", "-t", "1"]
    prompt, n, seed, temp = "Write a short poem about the sea.", 48, 7, 0.8
    trace = tmp_path / "trace.jsonl"
    subprocess.run([sys.executable, "-m", "specdec.frontends.cli", "run", *flags, "-p", prompt, "-n", str(n),
                    "-s", str(seed), "--temp", str(temp), "--trace", str(trace)],
                   cwd=ROOT, check=True, capture_output=True, timeout=300)
    s = Server([*flags, "-np", "1"], tmp_path / "log")
    try:
        r = s.post("/v1/chat/completions", {"messages": [{"role": "user", "content": prompt}],
                                            "max_tokens": n, "seed": seed, "temperature": temp,
                                            "stream": True, "specdec": {"tokens": True}})
    finally:
        s.stop()
    chunks = [json.loads(x[6:]) for x in r.text.splitlines() if x.startswith("data: {")]
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"])
    tokens = [t for c in chunks for t in (c.get("specdec") or {}).get("tokens", [])]
    steps = [st for c in chunks for st in (c.get("specdec") or {}).get("steps", [])]
    summary = chunks[-1]["specdec"]["summary"]
    records = load_trace(trace)
    assert len(records) == len(steps) > 3
    for got, want in zip(steps, records):
        want = json.loads(want.to_json())
        assert {k: v for k, v in got.items() if k not in TIMES} == {k: v for k, v in want.items() if k not in TIMES}
    assert any(p != q for t in tokens if t["p"] is not None for p, q in [(t["p"], t["q"])])
    check_against_records(tokens, steps)
    assert "".join(t["text"] for t in tokens) == text
    assert {k: summary[k] for k in summarize(records)} == summarize(records)
