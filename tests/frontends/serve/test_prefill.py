"""Chunked prefill in the serve scheduler (in process, tiny synthetic models): a long prompt
that arrives while others decode is evaluated --prefill-chunk rows per step, interleaved with
the others' decode steps, and no answer changes by a bit — tokens and logprobs equal to the
request alone, for any chunk size, greedy and seeded sampled, with and without drafting.
Also: -c is the context of each slot (every slot holds a full context at once), and `-t`
reaches the scheduler thread (numba's thread count is per thread)."""
from __future__ import annotations

import time
from dataclasses import replace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from specdec.frontends.serve.scheduler import Job, Scheduler
from test_scheduler import GREEDY, SAMPLED, SPEC, TIMEOUT, clone, draft_of, prompt, solo


@pytest.fixture(scope="module")
def models(tiny_model):
    return tiny_model(SPEC), tiny_model(replace(SPEC, n_layer=1))


def long_prompt(i: int, n: int) -> list[int]:
    return [(11 * i + 5 * k + k * k) % 61 + 1 for k in range(n)]


@pytest.mark.parametrize("kind", [None, "model", "prompt-lookup"])
@pytest.mark.parametrize("params", [GREEDY, SAMPLED], ids=["greedy", "sampled"])
def test_chunked_prompt_gives_the_solo_answer_and_others_keep_decoding(models, kind, params):
    target, draft = models
    job = Job(long_prompt(1, 150), 12, params, draft_of(kind, draft), seed=5, ignore_eos=True,
              logprobs=3)
    sch = Scheduler(target, n_parallel=4, n_ctx=256, prefill_chunk=16)
    try:
        alone = sch.submit(clone(job, logprobs=3)).wait(TIMEOUT)
        assert alone.ids == solo(target, job) and sch.metrics.prefill_chunks == 0   # alone: whole
        steps = []
        other = Job(prompt(2, 6), 200, GREEDY, ignore_eos=True,          # decoding through the whole prefill
                    on_event=lambda k, v: steps.append(sch.metrics.steps) if k == "text" else None)
        sch.submit(other)
        while not steps:
            time.sleep(0.001)
        busy = sch.submit(clone(job, logprobs=3)).wait(TIMEOUT)
        other_r = other.wait(TIMEOUT)
    finally:
        sch.close()
    assert busy.ids == alone.ids and busy.logprobs == alone.logprobs
    assert other_r.ids == solo(target, other)
    assert sch.metrics.prefill_chunks >= 150 // 16 - 1
    # the other request got a token at (nearly) every step while the long prompt went in chunks
    assert max(b - a for a, b in zip(steps, steps[1:])) <= 2


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_any_chunk_size_gives_the_solo_answers(models, data):
    target, draft = models
    chunk = data.draw(st.integers(1, 40), label="chunk")
    n = data.draw(st.integers(2, 4), label="requests")
    jobs = [Job(long_prompt(data.draw(st.integers(0, 30)), data.draw(st.integers(2, 120))),
                data.draw(st.integers(1, 10)), data.draw(st.sampled_from([GREEDY, SAMPLED])),
                draft_of(data.draw(st.sampled_from([None, "model", "prompt-lookup"])), draft),
                seed=data.draw(st.integers(0, 2**31)), ignore_eos=True, logprobs=1) for _ in range(n)]
    want = [solo(target, j) for j in jobs]
    sch = Scheduler(target, n_parallel=data.draw(st.integers(1, 4), label="slots"), n_ctx=256,
                    prefill_chunk=chunk)
    ref = Scheduler(target, n_parallel=1, n_ctx=256, prefill_chunk=0)
    try:
        for j in jobs:
            sch.submit(j)
        got = [j.wait(TIMEOUT) for j in jobs]
        lps = [ref.submit(clone(j, logprobs=1)).wait(TIMEOUT).logprobs for j in jobs]
    finally:
        sch.close()
        ref.close()
    assert [g.ids for g in got] == want
    assert [g.logprobs for g in got] == lps


def test_ctx_is_per_slot(models):
    """-c 64 with 3 slots: three 60-token prompts run at once, each in its own 64 rows."""
    target, _ = models
    sch = Scheduler(target, n_parallel=3, n_ctx=64)
    try:
        assert [s.n_ctx for s in sch.sessions] == [64] * 3
        jobs = [sch.submit(Job(long_prompt(i, 60), 3, GREEDY, ignore_eos=True)) for i in range(3)]
        assert [j.wait(TIMEOUT).ids for j in jobs] == [solo(target, j) for j in jobs]
        over = sch.submit(Job(long_prompt(9, 64), 3, GREEDY))
        with pytest.raises(Exception, match="ctx-size 64"):
            over.wait(TIMEOUT)
    finally:
        sch.close()


def test_threads_reach_the_scheduler_thread(models):
    import numba
    target, _ = models
    seen = []
    sch = Scheduler(target, n_parallel=1, n_ctx=64, threads=1)
    try:
        j = Job(prompt(3, 5), 2, GREEDY, ignore_eos=True,
                on_event=lambda k, v: seen.append(numba.get_num_threads()))
        sch.submit(j).wait(TIMEOUT)
    finally:
        sch.close()
    assert seen and set(seen) == {1}
    with pytest.raises(Exception, match="prefill-chunk"):
        Scheduler(target, n_parallel=1, n_ctx=64, prefill_chunk=-1)
