"""`specdec serve` on a qwen35 target with its MTP head and no -md: the server's drafting (a
length given: the head alone, 4 tokens per step) and the per-request `draft` "mtp" / "hybrid"
draft with the head; a greedy answer is the plain one,
alone and beside concurrent requests (batched passes, each slot's own head cache and hidden
rows); the token extension names the head as the steps' source."""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest

from servers import Server
from specdec.testing.synth_qwen35 import Qwen35Spec, write_qwen35_model

SPEC = Qwen35Spec(n_vocab=64, seed=5, n_ctx=256, logit_scale=3.0, nextn=True)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    d = tmp_path_factory.mktemp("serve-mtp")
    target = write_qwen35_model(d / "target.gguf", SPEC)
    s = Server(["-m", str(target), "-np", "4", "-c", "256", "--draft-n", "4", "--draft-p", "0"], d / "server.log")
    yield s
    s.stop()


def complete(s: Server, prompt: str, n: int, **extra) -> dict:
    body = {"prompt": prompt, "max_tokens": n, "ignore_eos": True, "temperature": 0, **extra}
    r = s.post("/v1/completions", body)
    assert r.status_code == 200, r.text
    return r.json()


@pytest.mark.parametrize("draft", [None, "mtp", "hybrid"])
def test_greedy_identical_alone_and_with_concurrent_others(server, draft):
    extra = {} if draft is None else {"draft": draft}
    plain = complete(server, "abcabcabcdd", 20, draft="none")["choices"][0]["text"]
    alone = complete(server, "abcabcabcdd", 20, **extra, specdec={"tokens": True})
    assert alone["choices"][0]["text"] == plain
    sources = {st["source"] for st in alone["specdec"]["steps"]}
    assert "mtp" in sources and sources <= {"mtp", "prompt-lookup", "none"}     # none: the last step, capped at 0
    others = [("xyzxyz" * (1 + i % 3), 4 + 3 * i, ["none", "mtp", "hybrid"][i % 3], 0.0 if i % 2 else 0.8)
              for i in range(3)]
    with ThreadPoolExecutor(4) as ex:
        futs = [ex.submit(complete, server, p, n, draft=d, temperature=t, seed=i)
                for i, (p, n, d, t) in enumerate(others)]
        me = ex.submit(complete, server, "abcabcabcdd", 20, **extra)
        assert me.result(120)["choices"][0]["text"] == plain
        for f in futs:
            f.result(120)
