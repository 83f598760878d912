"""`specdec serve` left running: API keys, request limits (each a 4xx with OpenAI's error
body), isolation between requests of one slot, a restart that answers identically, and a
CI-sized soak (benchmarks/soak.py).  Real server processes on 127.0.0.1, tiny models."""
from __future__ import annotations

import json
import socket
import sys
import time
from dataclasses import replace

import httpx
import openai
import pytest

from servers import ROOT, SPEC, Server
from synth import write_tiny_model

sys.path.insert(0, str(ROOT / "benchmarks"))


@pytest.fixture(scope="module")
def model_files(tmp_path_factory):
    d = tmp_path_factory.mktemp("harden")
    return (write_tiny_model(d / "target.gguf", SPEC),
            write_tiny_model(d / "draft.gguf", replace(SPEC, n_layer=1)))


def test_api_keys_from_flags_file_and_environment(model_files, tmp_path):
    target, _ = model_files
    keyfile = tmp_path / "keys"
    keyfile.write_text("# ours\nk-two\n\n")
    s = Server(["-m", str(target), "-np", "1", "-c", "128", "--api-key", "k-one",
                "--api-key-file", str(keyfile)], tmp_path / "log", key="k-one",
               env={"SPECDEC_API_KEY": "k-three"})
    try:
        assert httpx.get(s.url + "/health").status_code == 200            # probes stay open
        for path in ("/v1/models", "/metrics"):
            for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "k-one"},
                            {"Authorization": "Basic k-one"}):
                r = httpx.get(s.url + path, headers=headers)
                assert r.status_code == 401, (path, headers)
                err = r.json()["error"]
                assert err["code"] == "invalid_api_key" and set(err) == {"message", "type", "param", "code"}
        r = httpx.post(s.url + "/v1/completions", json={"prompt": "ab", "max_tokens": 2})
        assert r.status_code == 401 and "Bearer" in r.json()["error"]["message"]
        for key in ("k-one", "k-two", "k-three"):
            c = openai.OpenAI(base_url=s.url + "/v1", api_key=key, max_retries=0)
            out = c.completions.create(model=c.models.list().data[0].id, prompt="ab", max_tokens=3)
            assert out.usage.completion_tokens >= 1
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(base_url=s.url + "/v1", api_key="nope", max_retries=0).models.list()
        assert httpx.get(s.url + "/metrics", headers=s.headers).status_code == 200
    finally:
        s.stop()


def test_key_flags_and_the_open_address_warning(tmp_path):
    from specdec.errors import ConfigError
    from specdec.frontends.serve.launch import api_keys, open_warning
    assert "--api-key" in open_warning("0.0.0.0", ()) and "0.0.0.0" in open_warning("0.0.0.0", ())
    assert open_warning("0.0.0.0", ("k",)) is None and open_warning("127.0.0.1", ()) is None
    assert open_warning("::1", ()) is None and open_warning("localhost", ()) is None
    f = tmp_path / "k"
    f.write_text("a\nb\n# c\n")
    assert api_keys(["x", "a"], str(f), "e") == ("x", "a", "b", "e")
    for bad in ((["has space"], None, None), ([""], None, None), (None, str(tmp_path / "none"), None)):
        with pytest.raises(ConfigError):
            api_keys(*bad)
    (tmp_path / "empty").write_text("\n")
    with pytest.raises(ConfigError, match="no key"):
        api_keys(None, str(tmp_path / "empty"), None)


@pytest.fixture(scope="module")
def limited(model_files, tmp_path_factory):
    target, draft = model_files
    s = Server(["-m", str(target), "-md", str(draft), "-np", "1", "-c", "256", "--max-body", "4096",
                "--max-tokens-limit", "16", "--body-timeout", "1"],
               tmp_path_factory.mktemp("limits") / "log")
    yield s
    s.stop()


def _error(r: httpx.Response, status: int) -> dict:
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and "Traceback" not in r.text
    return err


def test_limits_are_4xx_errors(limited):
    s = limited
    _error(s.post("/v1/completions", {"prompt": "a" * 5000}), 413)
    chunks = (b'{"prompt": "' + b"a" * 1000 for _ in range(6))         # no Content-Length
    _error(httpx.post(s.url + "/v1/completions", content=chunks, timeout=30), 413)
    assert _error(s.post("/v1/completions", {"prompt": "ab", "max_tokens": 17}), 400)["param"] == "max_tokens"
    assert _error(s.post("/v1/chat/completions", {"messages": [{"role": "user", "content": "a"}],
                                                  "max_completion_tokens": 99}), 400)["param"] == "max_tokens"
    r = s.post("/v1/completions", {"prompt": "ab", "ignore_eos": True})     # no max_tokens: the ceiling
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 16
    _error(s.post("/v1/completions", {"prompt": "ab", "n": 2}), 400)
    _error(s.post("/v1/completions", {"prompt": "ab", "logprobs": 21}), 400)
    _error(s.post("/v1/chat/completions", {"messages": [{"role": "user", "content": "a"}],
                                           "logprobs": True, "top_logprobs": 21}), 400)
    _error(s.post("/v1/completions", {"prompt": "a" * 300}), 400)          # over the slot context


def test_a_slow_body_times_out_and_takes_no_slot(limited):
    s = limited
    with socket.create_connection(("127.0.0.1", s.port), timeout=10) as sock:
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: 100\r\n\r\n" + b'{"prompt": ')
        time.sleep(0.3)
        assert s.metrics()["specdec_slots_busy"] == 0
        t = time.monotonic()
        data = b""
        while chunk := sock.recv(4096):                         # the server closes the connection
            data += chunk
        assert time.monotonic() - t < 8
    head, _, body = data.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 408") and json.loads(body)["error"]["code"] == "timeout"
    assert httpx.get(s.url + "/health").json()["slots_idle"] == 1


def test_a_slot_keeps_nothing_of_its_last_request_and_a_restart_answers_the_same(model_files, tmp_path):
    """-np 1: the same greedy and seeded requests after a long different one (drafting,
    sampling, a suffix store) answer as on a fresh server, and after a restart."""
    target, draft = model_files
    args = ["-m", str(target), "-md", str(draft), "-np", "1", "-c", "256"]
    asks = [{"prompt": "abcab", "max_tokens": 20, "ignore_eos": True, "temperature": 0, "draft": d}
            for d in ("none", "model", "prompt-lookup", "hybrid")]
    asks.append({"prompt": "xyz", "max_tokens": 12, "ignore_eos": True, "temperature": 0.9, "seed": 3,
                 "top_k": 0, "top_p": 1.0, "min_p": 0.0, "draft": "model", "draft_n": 4})
    # (sampled: a length setting, as the adaptive default reads the clock; docs/serve.md)

    def answers(s):
        return [s.post("/v1/completions", a).json()["choices"][0]["text"] for a in asks]

    fresh = Server(args, tmp_path / "fresh.log")
    try:
        want = answers(fresh)
    finally:
        fresh.stop()
    s = Server(args, tmp_path / "used.log")
    try:
        long = {"prompt": "the long one " * 8, "max_tokens": 120, "ignore_eos": True,
                "temperature": 0.7, "seed": 9, "draft": "hybrid"}
        for a in asks:
            assert s.post("/v1/completions", long).status_code == 200
            assert s.post("/v1/completions", a).json()["choices"][0]["text"] == want[asks.index(a)]
    finally:
        s.stop()
    again = Server(args, tmp_path / "again.log")
    try:
        assert answers(again) == want
    finally:
        again.stop()


def test_sigterm_under_load_finishes_the_active_and_503s_the_queued(model_files, tmp_path):
    import signal
    import threading
    target, _ = model_files
    s = Server(["-m", str(target), "-np", "1", "--queue-size", "4", "-c", "2048"], tmp_path / "log")
    try:
        got = {}

        def ask(name, n):
            got[name] = s.post("/v1/completions", {"prompt": "abc", "max_tokens": n, "ignore_eos": True})
        first = threading.Thread(target=ask, args=("active", 1500))
        first.start()
        deadline = time.monotonic() + 20
        while s.metrics()["specdec_slots_busy"] < 1 and time.monotonic() < deadline:
            time.sleep(0.02)
        queued = threading.Thread(target=ask, args=("queued", 4))
        queued.start()
        while s.metrics()["specdec_queue_length"] < 1 and time.monotonic() < deadline:
            time.sleep(0.02)
        s.proc.send_signal(signal.SIGTERM)
        first.join(120)
        queued.join(120)
        assert s.proc.wait(60) == 0
        assert got["active"].status_code == 200 and got["active"].json()["usage"]["completion_tokens"] == 1500
        r = got["queued"]
        assert r.status_code == 503 and r.headers["Retry-After"] and "shutting down" in r.json()["error"]["message"]
    finally:
        s.stop()


@pytest.mark.slow
def test_soak_ci_sized(model_files, tmp_path):
    import soak
    target, draft = model_files
    res = soak.run(["-m", str(target), "-md", str(draft), "-np", "3", "-c", "256"], seconds=25,
                   clients=4, max_requests=400, drafts=["none", "prompt-lookup", "model", "hybrid"],
                   workdir=tmp_path)
    fig = soak.check(res)
    assert fig["requests"] >= 20 and fig["answers_compared"] >= 10
    assert fig["cancelled"] >= 1 and fig["bad"] >= 1


def _urllib_post(url: str, data, headers: dict) -> tuple[int, dict]:
    """(status, JSON body) of a POST sent the way urllib sends it: the whole body first, then
    the answer read (a refused body must still reach the client, not a connection reset)."""
    import urllib.error
    import urllib.request
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json", **headers})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


@pytest.mark.parametrize("size", [5000, 300_000, 16 << 20])
def test_a_body_sent_whole_gets_its_413(limited, size):
    """urllib sends the whole body before it reads: the server answers 413 at once and reads
    and discards the rest (a lingering close) instead of resetting the connection under it."""
    status, body = _urllib_post(limited.url + "/v1/completions", b"a" * size, {})
    assert status == 413 and body["error"]["code"] == "request_too_large"
    assert httpx.get(limited.url + "/health").json()["slots_idle"] == 1


def test_requests_gets_the_413_of_a_body_sent_whole(limited):
    requests = pytest.importorskip("requests")
    r = requests.post(limited.url + "/v1/completions", data=b"a" * (16 << 20), timeout=30)
    assert r.status_code == 413 and r.json()["error"]["code"] == "request_too_large"


def test_a_stalled_body_sent_on_afterwards_gets_its_408(model_files, tmp_path):
    """A body that stalls past --body-timeout and then comes whole: the client reads the 408."""
    rest = 16 << 20
    s = Server(["-m", str(model_files[0]), "-np", "1", "-c", "128", "--max-body", str(32 << 20),
                "--body-timeout", "1"], tmp_path / "log")

    def body():
        yield b'{"prompt": "'
        time.sleep(2.0)                                         # --body-timeout 1
        yield b"a" * rest
    try:
        status, err = _urllib_post(s.url + "/v1/completions", body(),
                                   {"Content-Length": str(len(b'{"prompt": "') + rest)})
        assert status == 408 and err["error"]["code"] == "timeout"
    finally:
        s.stop()
