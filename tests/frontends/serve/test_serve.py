"""`specdec serve` as a real server process on 127.0.0.1, called through the official
`openai` client and raw HTTP (httpx): the OpenAI wire format, streaming, batch invariance
over HTTP, bad input as 4xx OpenAI error bodies, disconnects, a full queue, SIGTERM drain.
Tiny synthetic models (tests/synth.py); the `real` tests use smollm2-135m."""
from __future__ import annotations

import json
import os
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace

import httpx
import openai
import pytest

from servers import ROOT, SPEC, Server
from synth import write_tiny_model


@pytest.fixture(scope="module")
def model_files(tmp_path_factory):
    d = tmp_path_factory.mktemp("serve")
    return (write_tiny_model(d / "target.gguf", SPEC),
            write_tiny_model(d / "draft.gguf", replace(SPEC, n_layer=1)))


@pytest.fixture(scope="module")
def server(model_files, tmp_path_factory):
    target, draft = model_files
    s = Server(["-m", str(target), "-md", str(draft), "-np", "4", "-c", "256", "--draft-n", "4", "--draft-p", "0"],
               tmp_path_factory.mktemp("log") / "server.log")
    yield s
    s.stop()


def complete(s: Server, prompt: str, n: int, **extra) -> tuple[str, dict]:
    body = {"prompt": prompt, "max_tokens": n, "ignore_eos": True, "temperature": 0, **extra}
    r = s.post("/v1/completions", body)
    assert r.status_code == 200, r.text
    j = r.json()
    return j["choices"][0]["text"], j


def test_models_health_and_the_openai_client(server):
    assert httpx.get(server.url + "/health").json()["status"] == "ok"
    models = server.client.models.list()
    name = models.data[0].id
    out = server.client.completions.create(model=name, prompt="abcabc", max_tokens=8,
                                           temperature=0, extra_body={"ignore_eos": True})
    assert out.object == "text_completion" and out.usage.completion_tokens == 8
    assert out.choices[0].finish_reason == "length" and len(out.choices[0].text) > 0
    timings = out.model_extra["timings"]
    assert {"prompt_n", "predicted_n", "predicted_per_second", "draft_n",
            "draft_n_accepted"} <= set(timings)
    chat = server.client.chat.completions.create(
        model=name, messages=[{"role": "user", "content": "abc"}], max_tokens=5)
    assert chat.choices[0].message.role == "assistant"
    assert chat.usage.prompt_tokens > 3


def test_streaming_matches_the_full_answer(server):
    text, _ = complete(server, "abcdabcd", 12)
    parts, finish = [], None
    for ch in server.client.completions.create(model=server.client.models.list().data[0].id,
                                               prompt="abcdabcd", max_tokens=12, temperature=0,
                                               stream=True, extra_body={"ignore_eos": True}):
        parts.append(ch.choices[0].text)
        finish = ch.choices[0].finish_reason or finish
    assert "".join(parts) == text and finish == "length"
    chunks = list(server.client.chat.completions.create(
        model=server.client.models.list().data[0].id, messages=[{"role": "user", "content": "ab"}],
        max_tokens=6, temperature=0, stream=True, stream_options={"include_usage": True},
        extra_body={"ignore_eos": True}))
    assert chunks[-1].usage.completion_tokens == 6
    raw = server.post("/v1/completions", {"prompt": "ab", "max_tokens": 3, "stream": True})
    assert raw.text.rstrip().endswith("data: [DONE]")


@pytest.mark.parametrize("draft", ["none", "model", "prompt-lookup"])
def test_greedy_identical_alone_and_with_concurrent_others(server, draft):
    mine = dict(prompt="abcabcabcdd", n=20, draft=draft)
    alone, j = complete(server, mine["prompt"], mine["n"], draft=draft)
    if draft == "model":
        assert j["timings"]["draft_n"] > 0
    for k in (1, 3, 7):
        others = [("xyzxyz" * (1 + i % 3), 4 + 3 * i, ["none", "model", "prompt-lookup"][i % 3],
                   0.0 if i % 2 else 0.8) for i in range(k)]
        with ThreadPoolExecutor(k + 1) as ex:
            futs = [ex.submit(complete, server, p, n, draft=d, temperature=t, seed=i)
                    for i, (p, n, d, t) in enumerate(others[: k // 2])]
            me = ex.submit(complete, server, mine["prompt"], mine["n"], draft=draft)
            futs += [ex.submit(complete, server, p, n, draft=d, temperature=t, seed=i)
                     for i, (p, n, d, t) in enumerate(others[k // 2:])]
            assert me.result(60)[0] == alone, f"{k} others"
            for f in futs:
                f.result(60)


def test_draft_none_decodes_plain(server):
    """A request's draft "none" is plain decoding, even on a server started with -md (whose
    default drafting is hybrid): nothing drafted, the same text as the plain answer."""
    text, j = complete(server, "abcabcabcabcdd", 12, draft="none")
    assert j["timings"]["draft_n"] == 0 and j["timings"].get("draft_steps", 0) == 0
    assert text == complete(server, "abcabcabcabcdd", 12, draft="model")[0]


def test_seeded_sampled_identical_alone_and_under_load(server):
    kw = dict(temperature=0.9, top_k=0, top_p=1.0, min_p=0.0, seed=77, draft="model")
    alone, _ = complete(server, "abcab", 24, **kw)
    with ThreadPoolExecutor(4) as ex:
        futs = [ex.submit(complete, server, "zzyzz" * (i + 1), 10 + 4 * i, seed=i) for i in range(3)]
        me = ex.submit(complete, server, "abcab", 24, **kw)
        assert me.result(60)[0] == alone
        for f in futs:
            f.result(60)


def test_predicted_outputs_same_tokens_and_usage(server):
    """OpenAI's `prediction`: the same greedy text with a right, a partial or a wrong one,
    alone and under load, streamed and not; usage counts its accepted / rejected tokens."""
    prompt = "abcabcabcdd"
    plain, j0 = complete(server, prompt, 24, draft="none")
    assert j0["usage"]["completion_tokens_details"] == {"accepted_prediction_tokens": 0,
                                                        "rejected_prediction_tokens": 0}
    for draft in ("none", "model", "prompt-lookup"):
        for pred in (plain, {"type": "content", "content": plain},
                     {"type": "content", "content": [{"type": "text", "text": plain[:5]},
                                                     {"type": "text", "text": plain[5:]}]}):
            text, j = complete(server, prompt, 24, draft=draft, prediction=pred)
            d = j["usage"]["completion_tokens_details"]
            # the plan's lengths follow the host's costs: what holds is that it drafted and was accepted
            assert text == plain and d["accepted_prediction_tokens"] > 0, (draft, pred)
            assert j["timings"]["draft_n"] >= d["accepted_prediction_tokens"] + d["rejected_prediction_tokens"]
    text, j = complete(server, prompt, 24, prediction={"type": "content", "content": "zq" * 20})
    assert text == plain
    with ThreadPoolExecutor(4) as ex:                       # under load: draft caps, same text
        futs = [ex.submit(complete, server, "xyzxyz" * (1 + i), 8 + 4 * i, draft="model") for i in range(3)]
        me = ex.submit(complete, server, prompt, 24, prediction=plain[3:])
        assert me.result(60)[0] == plain
        for f in futs:
            f.result(60)
    chunks = list(server.client.chat.completions.create(
        model=server.client.models.list().data[0].id, messages=[{"role": "user", "content": "ab"}],
        max_tokens=8, temperature=0, stream=True, stream_options={"include_usage": True},
        prediction={"type": "content", "content": "abcabc"}, extra_body={"ignore_eos": True}))
    assert chunks[-1].usage.completion_tokens == 8
    assert chunks[-1].usage.completion_tokens_details.accepted_prediction_tokens is not None


@pytest.mark.parametrize("pred", [5, {"type": "text", "content": "x"}, {"type": "content"},
                                  {"type": "content", "content": 7}, [1, 2],
                                  {"type": "content", "content": "x", "extra": 1}])
def test_bad_predictions_are_a_400(server, pred):
    for route, body in (("/v1/completions", {"prompt": "ab"}),
                        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "ab"}]})):
        r = server.post(route, {**body, "max_tokens": 2, "prediction": pred})
        assert r.status_code == 400, r.text
        err = r.json()["error"]
        assert err["param"].startswith("prediction") and "Traceback" not in r.text


def test_stop_strings_are_trimmed(server):
    text, _ = complete(server, "abcdabcd", 20)
    stop = text[4:6]
    cut, j = complete(server, "abcdabcd", 20, stop=[stop])
    assert cut == text[: text.find(stop)] and j["choices"][0]["finish_reason"] == "stop"


def test_logprobs_through_the_openai_client(server):
    """completions' logprobs: N and chat's logprobs + top_logprobs, full and streamed, with
    and without the draft model and under load: the same numbers."""
    name = server.client.models.list().data[0].id
    kw = dict(model=name, prompt="abcabcab", max_tokens=10, temperature=0, logprobs=3)
    full = server.client.completions.create(**kw, extra_body={"ignore_eos": True, "draft": "none"})
    lp = full.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == 10
    assert all(v <= 0 for v in lp.token_logprobs) and all(1 <= len(t) <= 3 for t in lp.top_logprobs)
    assert lp.text_offset[0] == 0 and "".join(lp.tokens) == full.choices[0].text
    for draft in ("model", "prompt-lookup"):
        d = server.client.completions.create(**kw, extra_body={"ignore_eos": True, "draft": draft})
        assert d.choices[0].logprobs.token_logprobs == lp.token_logprobs, draft
    with ThreadPoolExecutor(4) as ex:
        futs = [ex.submit(complete, server, "xyzxyz" * (i + 1), 8 + 3 * i, draft="model") for i in range(3)]
        busy = ex.submit(server.client.completions.create, **kw,
                         extra_body={"ignore_eos": True, "draft": "model"})
        assert busy.result(60).choices[0].logprobs.token_logprobs == lp.token_logprobs
        for f in futs:
            f.result(60)
    streamed = [x for ch in server.client.completions.create(
        **kw, stream=True, extra_body={"ignore_eos": True}) if ch.choices[0].logprobs
        for x in ch.choices[0].logprobs.token_logprobs]
    assert streamed == lp.token_logprobs

    msgs = [{"role": "user", "content": "abc"}]
    chat = server.client.chat.completions.create(model=name, messages=msgs, max_tokens=6,
                                                 temperature=0, logprobs=True, top_logprobs=2,
                                                 extra_body={"ignore_eos": True})
    content = chat.choices[0].logprobs.content
    assert len(content) == 6 and all(len(c.top_logprobs) == 2 for c in content)
    assert all(c.top_logprobs[0].logprob >= c.logprob for c in content)       # greedy: the top
    assert "".join(bytes(c.bytes).decode("utf-8", "replace") for c in content) == chat.choices[0].message.content
    chunks = server.client.chat.completions.create(model=name, messages=msgs, max_tokens=6,
                                                   temperature=0, logprobs=True, top_logprobs=2,
                                                   stream=True, extra_body={"ignore_eos": True})
    got = [c.logprob for ch in chunks if ch.choices and ch.choices[0].logprobs
           for c in ch.choices[0].logprobs.content]
    assert got == [c.logprob for c in content]
    plain = server.client.chat.completions.create(model=name, messages=msgs, max_tokens=3)
    assert plain.choices[0].logprobs is None
    n_probs = server.post("/v1/completions", {"prompt": "abcabcab", "max_tokens": 10, "temperature": 0,
                                              "ignore_eos": True, "n_probs": 3}).json()
    assert n_probs["choices"][0]["logprobs"]["token_logprobs"] == lp.token_logprobs
    assert server.post("/v1/completions", {"prompt": "ab", "logprobs": 21}).status_code == 400


@pytest.mark.parametrize("body,status,param", [
    ("{not json", 400, None),
    ('["a list"]', 400, None),
    ({"prompt": "ab", "max_tokens": 0}, 400, "max_tokens"),
    ({"prompt": "ab", "max_tokens": "many"}, 400, "max_tokens"),
    ({"prompt": "ab", "temperature": "hot"}, 400, "temperature"),
    ({"prompt": "ab", "stream": {"x": 1}}, 400, "stream"),
    ({"prompt": "ab", "stop": 5}, 400, None),
    ({"prompt": "ab", "draft": "telepathy"}, 400, "draft"),
    ({"prompt": "ab", "draft_n": 99}, 400, "draft_n"),
    ({"prompt": "ab", "n": 2}, 400, "n"),
    ({"prompt": "ab", "seed": -2**63}, 400, "seed"),
    ({"prompt": "a" * 400}, 400, "prompt"),
    ({"prompt": ""}, 400, "prompt"),
    ({"prompt": [1, 2, 10**6]}, 400, "prompt"),
    ({}, 400, "prompt"),
    ({"prompt": "ab", "model": "gpt-4"}, 404, "model"),
])
def test_bad_input_is_a_4xx_openai_error(server, body, status, param):
    r = server.post("/v1/completions", body)
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"]
    assert "Traceback" not in r.text
    if param is not None:
        assert err["param"] == param


def test_bad_chat_input_and_routes(server):
    for body in ({"messages": []}, {"messages": [{"role": "wizard", "content": "x"}]},
                 {"messages": "hello"}):
        r = server.post("/v1/chat/completions", body)
        assert r.status_code == 400 and "error" in r.json()
    r = httpx.get(server.url + "/v1/nothing-here")
    assert r.status_code == 404 and r.json()["error"]["type"] == "not_found_error"
    with pytest.raises(openai.NotFoundError):
        server.client.completions.create(model="gpt-4", prompt="ab", max_tokens=2)
    with pytest.raises(openai.BadRequestError):
        server.client.completions.create(model=server.client.models.list().data[0].id,
                                         prompt="ab", max_tokens=0)


def test_disconnect_mid_stream_frees_the_slot(server):
    before = server.metrics()
    with httpx.stream("POST", server.url + "/v1/completions", timeout=30,
                      content=json.dumps({"prompt": "abc", "max_tokens": 240, "ignore_eos": True,
                                          "stream": True})) as r:
        for line in r.iter_lines():
            if line.startswith("data:"):
                break
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        m = server.metrics()
        if (m['specdec_requests_total{status="cancelled"}'] >
                before['specdec_requests_total{status="cancelled"}'] and m["specdec_slots_busy"] == 0):
            break
        time.sleep(0.1)
    else:
        pytest.fail(f"the slot was not freed: {m}")
    assert m["specdec_tokens_predicted_total"] - before["specdec_tokens_predicted_total"] < 240
    assert complete(server, "ab", 3)[0]                       # the server goes on


def test_metrics_in_prometheus_format(server):
    complete(server, "abcabc", 6, draft="model")
    text = httpx.get(server.url + "/metrics").text
    for name in ("specdec_requests_total", "specdec_tokens_predicted_total",
                 "specdec_draft_acceptance_ratio", "specdec_queue_length", "specdec_batch_size",
                 "specdec_draft_cap"):
        assert f"# TYPE {name} " in text
    m = server.metrics()
    assert m['specdec_requests_total{status="ok"}'] >= 1 and m["specdec_draft_tokens_total"] > 0
    assert m['specdec_draft_cap{drafter="model",batch_size="1"}'] == -1
    assert m['specdec_draft_cap{drafter="prompt-lookup",batch_size="2"}'] == 4


def test_full_queue_answers_503_and_sigterm_drains(model_files, tmp_path):
    target, _ = model_files
    s = Server(["-m", str(target), "-np", "1", "--queue-size", "0", "-c", "2048",
                "--drain-timeout", "300"], tmp_path / "log")          # a loaded host: time enough
    try:
        got = {}

        def long():
            got["text"] = complete(s, "abc", 2000)[0]             # busy for seconds
        t = threading.Thread(target=long)
        t.start()
        s.wait_busy()
        r = s.post("/v1/completions", {"prompt": "ab", "max_tokens": 2})
        assert r.status_code == 503 and r.headers["Retry-After"] and "error" in r.json()
        with pytest.raises(openai.APIStatusError) as e:
            s.client.completions.create(model=s.client.models.list().data[0].id, prompt="ab",
                                        max_tokens=2)
        assert e.value.status_code == 503
        s.proc.send_signal(signal.SIGTERM)                    # drain: the open request finishes
        t.join(60)
        assert s.proc.wait(60) == 0
        assert len(got.get("text", "")) > 0
    finally:
        s.stop()


def test_requests_past_the_drain_deadline_get_503_with_the_error_body(model_files, tmp_path):
    """--drain-timeout: a request still running when it runs out is answered 503 with OpenAI's
    error body and Retry-After (not a dropped connection or a bare 500), and the server exits 0."""
    target, _ = model_files
    s = Server(["-m", str(target), "-np", "1", "-c", "2048", "--drain-timeout", "0.5"], tmp_path / "log")
    try:
        got = {}

        def long():
            got["r"] = s.post("/v1/completions", {"prompt": "abc", "max_tokens": 2000, "ignore_eos": True,
                                                  "temperature": 0})
        t = threading.Thread(target=long)
        t.start()
        s.wait_busy()
        s.proc.send_signal(signal.SIGTERM)
        t.join(60)
        assert s.proc.wait(60) == 0
        r = got["r"]
        if r.status_code == 200:                  # the host outran the deadline: nothing to see
            pytest.skip("the request finished within 0.5 s")
        assert r.status_code == 503 and r.headers["Retry-After"], (r.status_code, r.text)
        err = r.json()["error"]
        assert err["code"] == "cancelled" and "shut down before the request finished" in err["message"]
    finally:
        s.stop()


SLOW_STEPS = """
import os, time
import specdec.frontends.serve.scheduler as scheduler
_run_evals = scheduler.run_evals

def run_evals(evals):                                       # a step that outlasts the drain grace
    time.sleep(float(os.environ["SPECDEC_TEST_STEP_S"]))
    return _run_evals(evals)

scheduler.run_evals = run_evals
"""


def test_the_drain_deadline_answers_503_while_a_long_step_runs(model_files, tmp_path):
    """A request running at the --drain-timeout deadline gets its 503 with OpenAI's error body
    from the HTTP side at once, not when the scheduler's current step ends: a step longer than
    the grace before uvicorn's own deadline (a loaded host, a long prompt) would otherwise let
    uvicorn cancel the request and answer its plain-text 500.  Each step here takes 8 s."""
    target, _ = model_files
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(SLOW_STEPS)
    s = Server(["-m", str(target), "-np", "1", "-c", "256", "--drain-timeout", "0.5"], tmp_path / "log",
               env={"PYTHONPATH": f"{hook}{os.pathsep}{ROOT}", "SPECDEC_TEST_STEP_S": "8"})
    try:
        got = {}

        def ask():
            got["r"] = s.post("/v1/completions", {"prompt": "abc", "max_tokens": 20, "ignore_eos": True})
        t = threading.Thread(target=ask)
        t.start()
        s.wait_busy()
        t0 = time.monotonic()
        s.proc.send_signal(signal.SIGTERM)
        t.join(60)
        waited = time.monotonic() - t0
        r = got["r"]
        assert r.status_code == 503 and r.headers["Retry-After"], (r.status_code, r.text)
        assert r.json()["error"]["code"] == "cancelled" and waited < 5, waited
        assert s.proc.wait(60) == 0                 # the step ends, the slot is freed, exit 0
    finally:
        s.stop()


@pytest.mark.real
def test_real_model_chat_and_invariance(tmp_path):
    from helpers import real_model_path
    path = real_model_path("smollm2-135m-instruct-q4_1")
    s = Server(["-m", str(path), "-np", "4", "-c", "512", "--draft", "prompt-lookup"],
               tmp_path / "log")
    try:
        name = s.client.models.list().data[0].id
        ask = dict(model=name, messages=[{"role": "user", "content": "Name three colours."}],
                   max_tokens=24, temperature=0)
        alone = s.client.chat.completions.create(**ask).choices[0].message.content
        assert alone.strip()
        with ThreadPoolExecutor(4) as ex:
            futs = [ex.submit(s.client.chat.completions.create, model=name, max_tokens=8 + 6 * i,
                              messages=[{"role": "user", "content": "Count to %d." % (i + 3)}])
                    for i in range(3)]
            me = ex.submit(s.client.chat.completions.create, **ask)
            assert me.result(120).choices[0].message.content == alone
            for f in futs:
                f.result(120)
    finally:
        s.stop()
