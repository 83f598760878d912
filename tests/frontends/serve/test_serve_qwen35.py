"""`specdec serve` on a qwen35 target (Gated DeltaNet layers, a recurrent state per slot):
a greedy answer is the same alone and beside concurrent requests of every drafter (batched
passes, rollbacks of each slot's own state)."""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest

from servers import Server
from specdec.testing.synth_qwen35 import Qwen35Spec, write_qwen35_model

SPEC = Qwen35Spec(n_vocab=64, seed=5, n_ctx=256, logit_scale=3.0)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    d = tmp_path_factory.mktemp("serve-qwen35")
    target = write_qwen35_model(d / "target.gguf", SPEC)
    draft = write_qwen35_model(d / "draft.gguf", Qwen35Spec(n_vocab=64, seed=6, n_ctx=256, n_layer=2, interval=2))
    s = Server(["-m", str(target), "-md", str(draft), "-np", "4", "-c", "256", "--draft-n", "4", "--draft-p", "0"],
               d / "server.log")
    yield s
    s.stop()


def complete(s: Server, prompt: str, n: int, **extra) -> str:
    body = {"prompt": prompt, "max_tokens": n, "ignore_eos": True, "temperature": 0, **extra}
    r = s.post("/v1/completions", body)
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]["text"]


@pytest.mark.parametrize("draft", ["none", "model", "prompt-lookup"])
def test_greedy_identical_alone_and_with_concurrent_others(server, draft):
    alone = complete(server, "abcabcabcdd", 20, draft=draft)
    for k in (1, 3):
        others = [("xyzxyz" * (1 + i % 3), 4 + 3 * i, ["none", "model", "prompt-lookup"][i % 3],
                   0.0 if i % 2 else 0.8) for i in range(k)]
        with ThreadPoolExecutor(k + 1) as ex:
            futs = [ex.submit(complete, server, p, n, draft=d, temperature=t, seed=i)
                    for i, (p, n, d, t) in enumerate(others)]
            me = ex.submit(complete, server, "abcabcabcdd", 20, draft=draft)
            assert me.result(120) == alone, f"{k} others"
            for f in futs:
                f.result(120)
