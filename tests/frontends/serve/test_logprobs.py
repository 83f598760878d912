"""Log-probabilities in the serve scheduler (in process, tiny synthetic models): each token's
logprob is log softmax of the target's own logits at its position, computed independently
here from one forward pass over prompt + answer; the numbers are the same bits with and
without drafting (the draft model, prompt lookup), alone and under load; post-sampling
logprobs are the log of sampling.probs; the streamed events carry every token once."""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from specdec.frontends.serve.logprobs import RowCursor, chat_logprobs, completion_logprobs, token_logprob
from specdec.frontends.serve.scheduler import Job, Scheduler
from specdec.generation.sampling import probs
from test_scheduler import GREEDY, SAMPLED, SPEC, TIMEOUT, clone, draft_of, others, prompt

TOP = 5


@pytest.fixture(scope="module")
def models(tiny_model):
    return tiny_model(SPEC), tiny_model(replace(SPEC, n_layer=1))


def reference(target, prompt_ids, ids, n_top, params=None):
    """The logprobs of ids after prompt_ids from one forward pass over both."""
    lg = target.logits(list(prompt_ids) + list(ids))[len(prompt_ids) - 1:-1]     # (n, V)
    return [token_logprob(row, t, n_top, params) for row, t in zip(lg, ids)]


def run(sch, job):
    return sch.submit(job).wait(TIMEOUT)


@pytest.mark.parametrize("params", [GREEDY, SAMPLED], ids=["greedy", "sampled"])
def test_logprobs_same_with_and_without_draft_alone_and_under_load(models, params):
    target, draft = models
    base = Job(prompt(3, 11), 24, params, seed=7, ignore_eos=True, logprobs=TOP)
    sch = Scheduler(target, n_parallel=8, n_ctx=256)
    try:
        plain = run(sch, clone(base, logprobs=TOP))
        want = reference(target, base.prompt_ids, plain.ids, TOP)
        assert list(plain.logprobs) == want
        for kind in [None, "model", "prompt-lookup"]:
            job = clone(base, draft=draft_of(kind, draft), logprobs=TOP)
            alone = run(sch, job)
            load = others(5, draft, seed0=300)
            for j in load[:2]:
                sch.submit(j)
            busy = sch.submit(clone(job, logprobs=TOP))
            for j in load[2:]:
                sch.submit(j)
            busy = busy.wait(TIMEOUT)
            for j in load:
                j.wait(TIMEOUT)
            if params.greedy or kind is None:          # sampled + draft: other tokens, same law
                assert alone.ids == plain.ids
                assert alone.logprobs == plain.logprobs, kind
            assert busy.ids == alone.ids and busy.logprobs == alone.logprobs, kind
            assert list(alone.logprobs) == reference(target, base.prompt_ids, alone.ids, TOP)
    finally:
        sch.close()


def test_post_sampling_logprobs_are_the_sampler_distribution(models):
    target, draft = models
    params = replace(SAMPLED, top_k=8, temperature=0.7)
    job = Job(prompt(4, 9), 16, params, draft_of("model", draft), seed=3, ignore_eos=True,
              logprobs=TOP, post_sampling=True)
    sch = Scheduler(target, n_parallel=2, n_ctx=256)
    try:
        r = run(sch, job)
        g = run(sch, clone(job, params=GREEDY, post_sampling=True, logprobs=TOP))
    finally:
        sch.close()
    lg = target.logits(job.prompt_ids + r.ids)[len(job.prompt_ids) - 1:-1]
    for row, t, lp in zip(lg, r.ids, r.logprobs):
        pr = probs(row, params)
        assert lp.logprob == float(np.log(pr[t])) and len(lp.top) <= 8
        assert all(np.isfinite(v) for _, v in lp.top)
    assert all(lp.logprob == 0.0 and lp.top == ((lp.token, 0.0),) for lp in g.logprobs)


def test_events_carry_each_tokens_logprob_once_and_before_its_text(models):
    target, _ = models
    events = []
    job = Job(prompt(5, 8), 20, GREEDY, ignore_eos=True, logprobs=2,
              on_event=lambda k, v: events.append((k, v)))
    sch = Scheduler(target, n_parallel=1, n_ctx=256)
    try:
        r = run(sch, job)
    finally:
        sch.close()
    streamed = [x for k, v in events if k == "logprobs" for x in v]
    assert streamed == list(r.logprobs) and len(r.logprobs) == len(r.ids)
    assert events[0][0] == "logprobs" and events[-1][0] == "done"
    assert r.text_offsets[0] == 0 and list(r.text_offsets) == sorted(r.text_offsets)


def test_no_logprobs_unless_asked(models):
    target, _ = models
    sch = Scheduler(target, n_parallel=1, n_ctx=256)
    try:
        r = run(sch, Job(prompt(6, 8), 5, GREEDY, ignore_eos=True))
    finally:
        sch.close()
    assert r.logprobs is None


def test_wire_formats(models):
    target, _ = models
    row = np.linspace(-1, 1, SPEC.n_vocab).astype(np.float32)
    lps = [token_logprob(row, 3, 2), token_logprob(row, 63, 0)]
    assert lps[1].top == () and [i for i, _ in lps[0].top] == [63, 62]
    c = completion_logprobs(target.tokenizer, lps, [0, 4])
    assert c["token_logprobs"] == [lps[0].logprob, lps[1].logprob] and c["text_offset"] == [0, 4]
    assert len(c["tokens"]) == 2 and len(c["top_logprobs"][0]) <= 2 and c["top_logprobs"][1] == {}
    ch = chat_logprobs(target.tokenizer, lps)["content"]
    assert ch[0]["logprob"] == lps[0].logprob and [x["logprob"] for x in ch[0]["top_logprobs"]] == \
        [v for _, v in lps[0].top]
    assert bytes(ch[0]["bytes"]) == target.tokenizer.token_bytes(3)
    cur = RowCursor()
    with pytest.raises(RuntimeError):
        cur.take()
