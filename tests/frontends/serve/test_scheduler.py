"""The serve scheduler in process (no HTTP): a request's tokens are the same alone and under
any load — greedy with and without drafting (the draft model, prompt lookup), seeded sampled
requests, random arrival orders (a hypothesis property) — and cancellation, failures, a full
queue and the draft caps behave.  Tiny synthetic models (tests/synth.py)."""
from __future__ import annotations

import time
from dataclasses import replace

import pytest

from specdec.errors import ConfigError
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from specdec.frontends.serve.draft_caps import DraftCaps
from specdec.frontends.serve.scheduler import Cancelled, Job, QueueFull, Scheduler, _TextTracker
from specdec.api.request import DraftOptions, Runner
from specdec.generation.sampling import SamplerParams
from specdec.speculation.drafters import SuffixStore
from synth import TinySpec

GREEDY = SamplerParams(temperature=0.0)
SAMPLED = SamplerParams(temperature=0.9, top_k=0, top_p=1.0, min_p=0.0)
SPEC = TinySpec(n_vocab=64, d_model=32, n_head=2, n_head_kv=1, d_ff=48, n_layer=2, seed=3,
                n_ctx=256, logit_scale=3.0)
TIMEOUT = 60


@pytest.fixture(scope="module")
def models(tiny_model):
    """(target, draft): the draft is the target's first layer (same seed: a good draft)."""
    return tiny_model(SPEC), tiny_model(replace(SPEC, n_layer=1))


def prompt(i: int, n: int) -> list[int]:
    """A prompt with repeats (prompt lookup finds matches)."""
    base = [(7 * i + 3 * k) % 60 + 1 for k in range(max(2, n // 3))]
    return (base * 4)[:n]


def draft_of(kind, draft_model) -> DraftOptions:
    return DraftOptions() if kind is None else DraftOptions(kind=kind, model=draft_model, n=4)


def solo(target, job: Job) -> list[int]:
    """The request run alone through the same path (Runner.run), no scheduler."""
    r = Runner(target, job.params, job.draft, seed=job.seed, ignore_eos=job.ignore_eos, n_ctx=256)
    return r.run(job.prompt_ids, job.n_predict).ids


def clone(job: Job, **kw) -> Job:
    """The same request, not yet run."""
    fields = dict(prompt_ids=job.prompt_ids, n_predict=job.n_predict, params=job.params,
                  draft=job.draft, seed=job.seed, stop=job.stop, ignore_eos=job.ignore_eos)
    return Job(**{**fields, **kw})


def others(k: int, draft_model, seed0: int = 100) -> list[Job]:
    """k concurrent requests of different lengths, kinds and sampling."""
    kinds = [None, "model", "prompt-lookup"]
    return [Job(prompt(seed0 + j, 5 + 7 * j), 6 + 5 * j, GREEDY if j % 2 else SAMPLED,
                draft_of(kinds[j % 3], draft_model), seed=j, ignore_eos=True) for j in range(k)]


@pytest.mark.parametrize("kind", [None, "model", "prompt-lookup"])
def test_greedy_alone_and_under_load(models, kind):
    target, draft = models
    job = Job(prompt(1, 12), 24, GREEDY, draft_of(kind, draft), ignore_eos=True)
    want = solo(target, job)
    sch = Scheduler(target, n_parallel=8, n_ctx=256)
    try:
        for k in (0, 1, 3, 7):
            load = others(k, draft)
            mine = clone(job)
            for j in load[: k // 2]:
                sch.submit(j)
            sch.submit(mine)
            for j in load[k // 2:]:
                sch.submit(j)
            assert mine.wait(TIMEOUT).ids == want, f"{k} others"
            for j in load:
                j.wait(TIMEOUT)
    finally:
        sch.close()
    assert sch.metrics.steps > 0 and sch.metrics.step_sequences > sch.metrics.steps  # batched


@pytest.mark.parametrize("kind", [None, "model"])
def test_seeded_sampled_alone_and_under_load(models, kind):
    target, draft = models
    job = Job(prompt(2, 9), 30, SAMPLED, draft_of(kind, draft), seed=1234, ignore_eos=True)
    want = solo(target, job)
    sch = Scheduler(target, n_parallel=8, n_ctx=256)
    try:
        alone = sch.submit(clone(job)).wait(TIMEOUT)
        load = others(7, draft, seed0=200)
        for j in load[:3]:
            sch.submit(j)
        busy = sch.submit(job)
        for j in load[3:]:
            sch.submit(j)
        assert alone.ids == want and busy.wait(TIMEOUT).ids == want
    finally:
        sch.close()


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_any_arrival_order_gives_the_solo_answers(models, data):
    """Random request mixes, submission orders and arrival gaps: each answer is its solo one."""
    target, draft = models
    n = data.draw(st.integers(2, 5), label="requests")
    jobs = []
    for _ in range(n):
        kind = data.draw(st.sampled_from([None, "model", "prompt-lookup"]), label="draft")
        greedy = data.draw(st.booleans(), label="greedy")
        jobs.append(Job(prompt(data.draw(st.integers(0, 50)), data.draw(st.integers(2, 30))),
                        data.draw(st.integers(1, 16)), GREEDY if greedy else SAMPLED,
                        draft_of(kind, draft), seed=data.draw(st.integers(0, 2**31)), ignore_eos=True))
    want = [solo(target, j) for j in jobs]
    order = data.draw(st.permutations(range(n)), label="order")
    gaps = data.draw(st.lists(st.floats(0, 0.01), min_size=n, max_size=n), label="gaps")
    sch = Scheduler(target, n_parallel=data.draw(st.integers(1, 4), label="slots"), n_ctx=256)
    try:
        for i, gap in zip(order, gaps):
            time.sleep(gap)
            sch.submit(jobs[i])
        assert [j.wait(TIMEOUT).ids for j in jobs] == want
    finally:
        sch.close()


def test_cancel_frees_the_slot_and_others_go_on(models):
    target, _ = models
    sch = Scheduler(target, n_parallel=2, n_ctx=2048)
    try:                                    # long enough to be running whenever the cancel comes
        long = sch.submit(Job(prompt(3, 5), 2000, GREEDY, ignore_eos=True))
        other = sch.submit(Job(prompt(4, 6), 20, GREEDY, ignore_eos=True))
        time.sleep(0.05)
        long.cancel()
        with pytest.raises(Cancelled):
            long.wait(TIMEOUT)
        assert other.wait(TIMEOUT).ids == solo(target, other)
        deadline = time.monotonic() + 5
        while len(sch.free) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert len(sch.free) == 2 and sch.metrics.requests["cancelled"] == 1
    finally:
        sch.close()


def test_a_failing_request_does_not_disturb_the_others(models):
    target, _ = models
    sch = Scheduler(target, n_parallel=3, n_ctx=256)
    try:
        good = Job(prompt(5, 7), 20, GREEDY, ignore_eos=True)
        bad = Job([1, 2, 9999], 10, GREEDY)                 # an id outside the vocabulary
        empty = Job([], 10, GREEDY)
        for j in (good, bad, empty):
            sch.submit(j)
        with pytest.raises(ValueError, match="token id out of range"):
            bad.wait(TIMEOUT)
        with pytest.raises(ConfigError, match="the prompt is empty"):
            empty.wait(TIMEOUT)
        assert good.wait(TIMEOUT).ids == solo(target, good)
        assert sch.metrics.requests["error"] == 2
    finally:
        sch.close()


def test_full_queue_is_refused(models):
    target, _ = models
    sch = Scheduler(target, n_parallel=1, n_ctx=256, max_queue=1)
    try:
        a = sch.submit(Job(prompt(6, 5), 200, GREEDY, ignore_eos=True))
        deadline = time.monotonic() + TIMEOUT           # a busy machine: wait until a holds the slot
        while not sch.active and time.monotonic() < deadline:
            time.sleep(0.005)
        b = sch.submit(Job(prompt(7, 5), 5, GREEDY, ignore_eos=True))
        with pytest.raises(QueueFull):
            sch.submit(Job(prompt(8, 5), 5, GREEDY))
        a.cancel()
        b.wait(TIMEOUT)
    finally:
        sch.close()


def test_close_finishes_the_active_and_refuses_the_queued(models):
    from specdec.frontends.serve.scheduler import Cancelled
    target, _ = models
    sch = Scheduler(target, n_parallel=1, n_ctx=256)
    a = sch.submit(Job(prompt(6, 5), 120, GREEDY, ignore_eos=True))
    deadline = time.monotonic() + TIMEOUT
    while not sch.active and time.monotonic() < deadline:
        time.sleep(0.005)
    b = sch.submit(Job(prompt(7, 5), 5, GREEDY, ignore_eos=True))
    sch.close()
    with pytest.raises(Cancelled, match="shutting down"):
        b.wait(1)
    assert a.wait(1).ids == solo(target, a)               # the active one completed
    assert sch.metrics.requests["rejected"] == 1


def test_stop_strings_and_text(models):
    target, _ = models
    job = Job(prompt(9, 8), 30, GREEDY, ignore_eos=True)
    full = target.detokenize(solo(target, job))
    stop = full[5:7]
    sch = Scheduler(target, n_parallel=1, n_ctx=256)
    try:
        plain = sch.submit(clone(job)).wait(TIMEOUT)
        cut = sch.submit(clone(job, stop=(stop,))).wait(TIMEOUT)
    finally:
        sch.close()
    assert plain.text == full
    assert cut.text == full[: full.find(stop)] and cut.gen.stop_reason == "stop"


def test_text_tracker_holds_back_a_possible_stop(models):
    target, _ = models
    tr = _TextTracker(target.tokenizer, ["xyz"])
    out = ""
    for t in target.tokenize("abcxyzdef", bos=False):
        stopped = tr.push(t)
        out += tr.ready()
        if stopped:
            break
    assert out + tr.ready(final=True) == "abc"


def test_draft_caps():
    caps = DraftCaps(DraftCaps.parse_table("1:-,2:4,4:0"))
    assert [caps.cap(b) for b in (1, 2, 3, 4, 9)] == [None, 4, 4, 0, 0]
    assert DraftCaps({3: 1}).cap(1) is None
    assert [DraftCaps().cap(b, lookup=True) for b in (1, 2, 3, 4, 5, 8)] == [None, 4, 3, 2, 1, 0]
    assert [DraftCaps().cap(b) for b in (1, 2, 8)] == [None, 0, 0]
    for bad in ("2", "0:1", "x:y", "2:-3"):
        with pytest.raises(ConfigError, match="B:N pairs"):
            DraftCaps.parse_table(bad)


def test_greedy_drafts_are_capped_under_load(models):
    target, draft = models
    sch = Scheduler(target, n_parallel=4, n_ctx=256, caps=DraftCaps({1: None, 2: 0}))
    try:
        jobs = [sch.submit(Job(prompt(10 + i, 8), 20, GREEDY, draft_of("model", draft),
                               ignore_eos=True)) for i in range(4)]
        results = [j.wait(TIMEOUT) for j in jobs]
    finally:
        sch.close()
    assert [r.ids for r in results] == [solo(target, j) for j in jobs]
    assert sch.metrics.capped_steps > 0


def test_a_scheduler_made_with_start_false_steps_in_the_thread_that_runs_it(models):
    """specdec serve steps the model in its main thread (one OpenMP team: Scheduler's
    docstring): with start=False no thread of its own is made, run() does the stepping and
    returns after close()."""
    import threading
    target, _ = models
    sch = Scheduler(target, n_parallel=2, n_ctx=64, start=False)
    assert sch._thread is None
    seen = set()
    runner = threading.Thread(target=sch.run)
    runner.start()
    try:
        j = Job(prompt(1, 6), 3, GREEDY, ignore_eos=True,
                on_event=lambda k, v: seen.add(threading.get_ident()))
        assert sch.submit(j).wait(TIMEOUT).ids == solo(target, j)
    finally:
        sch.close()
    runner.join(TIMEOUT)
    assert not runner.is_alive() and seen == {runner.ident}


def test_requests_share_one_suffix_store(tiny_model):
    """Requests with the same DraftOptions draft from one store: each finished request's prompt
    and answer go into it, a plain request's too, and a repeated request drafts its answer."""
    target = tiny_model(SPEC)
    store = SuffixStore()
    options = DraftOptions(kind="suffix", n=8, policy="fixed", suffix_store=store)
    sch = Scheduler(target, n_parallel=3, n_ctx=256, draft=options)
    try:
        p = prompt(3, 10)
        first = sch.submit(Job(p, 24, GREEDY, options, ignore_eos=True)).wait(60)
        assert store.documents() == [p + first.ids]
        jobs = [sch.submit(Job(p, 24, GREEDY, options, ignore_eos=True)) for _ in range(2)]
        jobs.append(sch.submit(Job(prompt(4, 9), 12, GREEDY, replace(options, kind=None),
                                   ignore_eos=True)))          # a plain request is remembered too
        results = [j.wait(60) for j in jobs]
    finally:
        sch.close()
    assert results[0].ids == results[1].ids == first.ids
    s = results[0].gen.stats
    assert s.n_accepted >= len(first.ids) - s.n_steps and len(store) == 4
