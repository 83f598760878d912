"""Request fuzzing of a real `specdec serve` process on a tiny synthetic model: every answer
a 200 or a 4xx with a JSON body, and the server alive and giving the same greedy answer
afterwards (tests/fuzz/request_fuzz.py; the nightly run is benchmarks/fuzz.py --requests)."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).parent))

import request_fuzz  # noqa: E402
from servers import SPEC, Server  # noqa: E402
from synth import write_tiny_model  # noqa: E402

N_CI = 240


def reference(s: Server) -> str:
    r = s.post("/v1/completions", {"prompt": "abcabc", "max_tokens": 12, "temperature": 0,
                                   "ignore_eos": True})
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]["text"]


@pytest.mark.slow
def test_fuzzed_requests_are_answered_and_the_server_survives(tmp_path):
    target = write_tiny_model(tmp_path / "target.gguf", SPEC)
    s = Server(["-m", str(target), "-np", "2", "-c", "256", "--queue-size", "8"],
               tmp_path / "server.log")
    try:
        before = reference(s)
        counts, failed = request_fuzz.run(s.url, N_CI, np.random.default_rng(0),
                                          alive=lambda: s.proc.poll() is None)
        print(f"\nrequest fuzz: {sum(counts.values())} requests, {dict(counts)}")
        assert failed == []
        assert sum(counts.values()) == N_CI and counts["ok"] > 0 and counts["rejected"] > 0
        assert s.proc.poll() is None and reference(s) == before
    finally:
        s.stop()
