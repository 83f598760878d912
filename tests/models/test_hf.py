"""`-hf REPO[:QUANT]` / `hf://` (specdec/models/hf.py) through the real huggingface_hub client,
against a hub served on loopback (its model-info and resolve routes) with HF_ENDPOINT pointing at
it: the quant chosen as llama.cpp's -hf chooses, split files fetched together, the hub's cache
shared and offline use, every failure one line naming the repository."""
from __future__ import annotations

import hashlib
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

import specdec
from helpers import cli, one_line_error
from specdec.models import hf
from synth import TinySpec, write_tiny_model

COMMIT = "0123456789abcdef0123456789abcdef01234567"


class Hub:
    """repo -> {filename: bytes}; 'gated/*' repos answer 401 as a gated repository does."""

    def __init__(self, repos: dict[str, dict[str, bytes]]):
        self.repos, self.hits = repos, []
        hub = self

        class H(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def do_HEAD(self):
                self._serve(body=False)

            def do_GET(self):
                self._serve(body=True)

            def _serve(self, body: bool):
                path = self.path.split("?")[0]
                hub.hits.append(path)
                parts = path.strip("/").split("/")
                if parts[:2] == ["api", "models"]:
                    return self._info("/".join(parts[2:4]), body)
                if len(parts) >= 5 and parts[2] == "resolve":
                    return self._file("/".join(parts[:2]), "/".join(parts[4:]), body)
                self._error(404, "EntryNotFound", body)

            def _info(self, repo: str, body: bool):
                if repo.startswith("gated/"):
                    return self._error(401, "GatedRepo", body)
                if repo not in hub.repos:
                    return self._error(404, "RepoNotFound", body)
                data = json.dumps({"id": repo, "modelId": repo, "sha": COMMIT, "private": False,
                                   "siblings": [{"rfilename": f} for f in hub.repos[repo]]}).encode()
                self._send(200, data, {"Content-Type": "application/json"}, body)

            def _file(self, repo: str, name: str, body: bool):
                if repo.startswith("gated/"):
                    return self._error(401, "GatedRepo", body)
                data = hub.repos.get(repo, {}).get(name)
                if data is None:
                    return self._error(404, "EntryNotFound", body)
                etag = hashlib.sha256(data).hexdigest()
                self._send(200, data, {"X-Repo-Commit": COMMIT, "ETag": f'"{etag}"',
                                       "Content-Type": "application/octet-stream"}, body)

            def _error(self, code: int, kind: str, body: bool):
                self._send(code, json.dumps({"error": kind}).encode(),
                           {"X-Error-Code": kind, "X-Error-Message": kind, "Content-Type": "application/json"}, body)

            def _send(self, code, data, headers, body):
                self.send_response(code)
                for k, v in headers.items():
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if body:
                    self.wfile.write(data)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("hfsrc")
    q8 = write_tiny_model(d / "a.gguf", TinySpec(qtype=8, seed=5)).read_bytes()        # Q8_0
    q4 = write_tiny_model(d / "b.gguf", TinySpec(qtype=2, seed=5)).read_bytes()        # Q4_0
    return q8, q4


@pytest.fixture
def hub(files, tmp_path, monkeypatch):
    q8, q4 = files
    h = Hub({"someone/Tiny-GGUF": {"README.md": b"# tiny\n", "tiny-Q8_0.gguf": q8, "tiny-Q4_K_M.gguf": q4,
                                   "mmproj-tiny-f16.gguf": q4},
             "someone/Split-GGUF": {"big-Q8_0-00001-of-00002.gguf": q8[:4096],
                                    "big-Q8_0-00002-of-00002.gguf": q8[4096:]},
             "someone/NoGGUF": {"model.safetensors": b"x"}})
    monkeypatch.setenv("HF_ENDPOINT", h.url)
    h.cache = tmp_path / "hfcache"
    monkeypatch.setenv("HF_HUB_CACHE", str(h.cache))
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("HF_TOKEN", raising=False)
    yield h
    h.close()


def test_a_quant_is_chosen_as_llamacpp_does_and_loaded(hub, files):
    got = hf.resolve("hf://someone/Tiny-GGUF:q8_0", progress=False)
    assert got.read_bytes() == files[0] and got.name == "tiny-Q8_0.gguf"
    assert hub.cache in got.parents                                         # in the hub's own cache
    assert hf.resolve("someone/Tiny-GGUF", progress=False).read_bytes() == files[1]   # Q4_K_M by default
    m = specdec.load("hf://someone/Tiny-GGUF:Q8_0")
    assert m.generate("ab", n_predict=3, ignore_eos=True).ids == specdec.load(str(got)).generate(
        "ab", n_predict=3, ignore_eos=True).ids


def test_the_cache_is_shared_and_works_offline(hub, monkeypatch):
    first = hf.resolve("hf://someone/Tiny-GGUF:Q8_0", progress=False)
    n = len(hub.hits)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert hf.resolve("hf://someone/Tiny-GGUF:Q8_0", progress=False) == first
    assert len(hub.hits) == n                                               # offline: not one request
    with pytest.raises(hf.HubError, match=r"someone/Tiny-GGUF:Q4_K_M: .*HF_HUB_OFFLINE"):
        hf.resolve("hf://someone/Tiny-GGUF:Q4_K_M", progress=False)         # a cache miss
    with pytest.raises(hf.HubError, match=r"someone/Other-GGUF: not in the Hugging Face cache"):
        hf.resolve("hf://someone/Other-GGUF", progress=False)


def test_split_files_are_fetched_together(hub):
    first = hf.resolve("hf://someone/Split-GGUF:Q8_0", progress=False)
    assert first.name == "big-Q8_0-00001-of-00002.gguf"
    assert (first.parent / "big-Q8_0-00002-of-00002.gguf").is_file()


@pytest.mark.parametrize("spec, error", [
    ("hf://someone/Missing-GGUF", r"-hf someone/Missing-GGUF: repository not found"),
    ("hf://gated/Llama-GGUF", r"-hf gated/Llama-GGUF: access denied .*HF_TOKEN"),
    ("hf://someone/Tiny-GGUF:IQ2_XS", r"-hf someone/Tiny-GGUF:IQ2_XS: no such quant; the repository has Q4_K_M, Q8_0"),
    ("hf://someone/NoGGUF", r"-hf someone/NoGGUF: the repository has no GGUF file"),
    ("hf://not a repo", r"expected OWNER/NAME"),
])
def test_failures_are_one_line_naming_the_repository(hub, spec, error):
    with pytest.raises(hf.HubError, match=error) as e:
        hf.resolve(spec, progress=False)
    assert "\n" not in str(e.value)
    assert not any(p.suffix == ".gguf" for p in hub.cache.rglob("*"))      # nothing half-written


def test_no_network_is_one_line(hub, monkeypatch, tmp_path):
    import socket
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()                                                               # nothing listens there
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{port}")
    with pytest.raises(hf.HubError, match=r"-hf someone/Tiny-GGUF: cannot reach the hub"):
        hf.resolve("hf://someone/Tiny-GGUF", progress=False)
    assert not any(p.suffix == ".gguf" for p in (tmp_path / "hfcache").rglob("*"))   # nothing half-written


def test_cli_takes_hf_flags(hub):
    r = cli("run", "-hf", "someone/Tiny-GGUF:Q8_0", "-hfd", "someone/Tiny-GGUF:Q4_K_M", "-p", "ab", "-n", "4",
            "--ignore-eos", "--raw")
    assert r.returncode == 0, r.stderr
    one_line_error(cli("run", "-hf", "someone/Missing-GGUF", "-p", "ab", "-n", "2"),
                   "-hf someone/Missing-GGUF: repository not found")
