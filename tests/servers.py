"""A `specdec serve` subprocess for the tests that talk HTTP to a real server (frontends/serve/test_serve.py,
fuzz/test_fuzz_requests.py), and the tiny synthetic model they serve."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import openai

from synth import TinySpec

ROOT = Path(__file__).resolve().parent.parent
SPEC = TinySpec(n_vocab=64, d_model=32, n_head=2, n_head_kv=1, d_ff=48, n_layer=2, seed=5,
                n_ctx=256, logit_scale=3.0)
START_TIMEOUT = 120


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """A `specdec serve` subprocess; killed at teardown whatever happens."""

    def __init__(self, args: list[str], log: Path, key: str | None = None, env: dict | None = None):
        self.port = free_port()
        self.headers = {"Authorization": f"Bearer {key}"} if key else {}
        self.url = f"http://127.0.0.1:{self.port}"
        env = {**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}
        self.log = log
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "specdec.frontends.cli", "serve", *args, "--port", str(self.port)],
            stdout=subprocess.DEVNULL, stderr=open(log, "w"), env=env, cwd=ROOT)
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited: {log.read_text()}")
            try:
                if httpx.get(self.url + "/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.2)
        else:
            self.stop()
            raise RuntimeError(f"server did not start: {log.read_text()}")
        assert "serving on http://127.0.0.1" in log.read_text()
        self.client = openai.OpenAI(base_url=self.url + "/v1", api_key=key or "none", timeout=60,
                                    max_retries=0)

    def post(self, path: str, body, **kw) -> httpx.Response:
        content = body if isinstance(body, (str, bytes)) else json.dumps(body)
        kw["headers"] = {**self.headers, **kw.get("headers", {})}
        return httpx.post(self.url + path, content=content, timeout=60, **kw)

    def metrics(self) -> dict[str, float]:
        out = {}
        for line in httpx.get(self.url + "/metrics", headers=self.headers, timeout=10).text.splitlines():
            if line and not line.startswith("#"):
                k, v = line.rsplit(" ", 1)
                out[k] = float(v)
        return out

    def wait_busy(self, n: int = 1, timeout: float = 20.0) -> None:
        """Until /metrics shows at least n busy slots (or timeout seconds have passed)."""
        deadline = time.monotonic() + timeout
        while self.metrics()["specdec_slots_busy"] < n and time.monotonic() < deadline:
            time.sleep(0.02)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
