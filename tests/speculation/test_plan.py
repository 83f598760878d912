"""The drafting plan (api/drafting.py, speculation/cost_model.py, speculation/calibration.py): the
calibration cache is written, read and invalidated; the cost model picks the draft model only
where it pays and bounds its prompt window; the draft's prompt pass never comes before the
first token; a seeded request's tokens do not depend on the clock; greedy output stays plain's;
the calibration is a table per pass size that drift measures again, and the plan's choices on a
cheap-row and a dear-row host (their tables set here, never the host's)."""
from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from specdec.api.drafting import DraftPlan
from specdec.api.request import DraftOptions, Runner
from specdec.errors import ConfigError
from specdec.generation.sampling import SamplerParams
from specdec.speculation import calibration
from specdec.speculation.calibration import PassCosts
from specdec.speculation.cost_model import (MODEL_ALPHA, WAIT_TOKENS, WINDOW_MAX, WINDOW_MIN, Costs, Ledger, PlanInput,
                                      PlannedLength, choose)
from specdec.speculation.policies import StepFeedback
from specdec.speculation.trace import StepRecord
from synth import TinySpec

CHEAP = Costs(PassCosts(0.05, 0.1, 0.02, True), PassCosts(0.01, 0.1, 0.003, True))   # c 0.2


def _counting(monkeypatch, tmp_path, measured: PassCosts):
    monkeypatch.setenv("SPECDEC_HOME", str(tmp_path))
    monkeypatch.setenv(calibration.ENV, "1")
    monkeypatch.delenv(calibration.OVERRIDE, raising=False)       # the pinned prior off: measure
    monkeypatch.setattr(calibration, "_MEMO", {})
    calls = []

    def fake(model):
        calls.append(model)
        return measured
    return calls, fake


def test_calibration_cache_is_written_read_and_invalidated(tmp_path, monkeypatch, tiny_model):
    m = tiny_model(TinySpec(seed=3))
    costs = PassCosts(0.02, 0.3, 0.005, True)
    calls, fake = _counting(monkeypatch, tmp_path, costs)
    assert calibration.costs(m, fake) == costs and len(calls) == 1          # measured, written
    files = list((tmp_path / "calibration").glob("*.json"))
    assert len(files) == 1 and "0.3" in files[0].read_text()
    monkeypatch.setattr(calibration, "_MEMO", {})                          # a new process
    assert calibration.costs(m, fake) == costs and len(calls) == 1          # read, not measured
    files[0].write_text("{not json")                                       # corrupt: measured again
    monkeypatch.setattr(calibration, "_MEMO", {})
    assert calibration.costs(m, fake) == costs and len(calls) == 2
    key = calibration.cache_key(m.path)
    st = os.stat(m.path)
    os.utime(m.path, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))          # the file changed
    try:
        assert calibration.cache_key(m.path) != key
        monkeypatch.setattr(calibration, "_MEMO", {})
        assert calibration.costs(m, fake) == costs and len(calls) == 3
        now = calibration.cache_key(m.path)
        other = "vnni" if os.environ.get("SPECDEC_KERNELS") == "avx2" else "avx2"
        monkeypatch.setenv("SPECDEC_KERNELS", other)                       # another kernels path
        assert calibration.cache_key(m.path) != now
        monkeypatch.delenv("SPECDEC_KERNELS")
        now = calibration.cache_key(m.path)
        monkeypatch.setattr(calibration.kernel_code, "code_stamp", lambda: "other kernels")
        assert calibration.cache_key(m.path) != now                        # the kernels' code changed
    finally:
        os.utime(m.path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert PassCosts.from_json(costs.to_json("k"), "other") is None          # another key: not trusted


def test_prior_until_calibrated(monkeypatch, tiny_model):
    monkeypatch.setenv(calibration.ENV, "0")
    got = calibration.costs(tiny_model(TinySpec(seed=3)), lambda m: 1 / 0)
    assert not got.measured and got.growth >= 0 and got.prefill_tok_s == calibration.PREFILL_PRIOR


def test_measure_times_passes(tiny_model):
    got = calibration.measure(tiny_model(TinySpec(seed=3)))
    assert got.measured and got.row_s > 0 and got.prefill_tok_s > 0 and got.growth >= 0


def test_a_verification_pass_is_priced_with_its_rollback(tiny_model):
    """On a clock that ticks 1 per pass and 0.5 per truncation, a pass of 2..17 rows costs 1.5
    one-row passes in the table: the rollback a rejected draft pays (a recurrent target's
    replay, engine/recurrent.py) is in it; the one-row pass (plain decoding) has none."""
    m, now = tiny_model(TinySpec(seed=3)), [0.0]

    class Session:
        def __init__(self, s):
            self.s = s

        def eval(self, ids, **kw):
            now[0] += 1.0
            return self.s.eval(ids, **kw)

        def truncate(self, n):
            now[0] += 0.5
            return self.s.truncate(n)

        def reset(self):
            return self.s.reset()

    class Model:
        config = m.config

        def session(self, *a, **kw):
            return Session(m.session(*a, **kw))

    got = calibration.measure(Model(), clock=lambda: now[0])
    assert got.row_s == 1.0 and got.table[1:] == (1.5,) * (calibration.TABLE_ROWS - 1)


def test_the_model_drafts_only_where_it_pays_and_sees_a_bounded_window():
    inp = PlanInput(prompt_len=1800, n_predict=128, greedy=True, seeded=False, model=True,
                    free=("prompt-lookup",))
    c = choose(inp, CHEAP)
    assert c.model and WINDOW_MIN <= c.window <= min(WINDOW_MAX, 1800) and "window" in c.describe()
    tps = dict(c.tps)
    assert tps["prompt-lookup"] >= tps["plain"] and tps["model"] > tps["plain"]
    slow = Costs(CHEAP.target, PassCosts(0.05, 0.1, 0.02, True))             # the draft costs a target step
    c = choose(inp, slow)
    assert not c.model and c.drafters == ("prompt-lookup",) and c.free_only
    short = choose(PlanInput(1800, 4, True, False, True, ("prompt-lookup",)), CHEAP)
    assert not short.model and "less than its prompt pass" in short.reason   # too few tokens to pay
    assert choose(PlanInput(10, 64, True, False, True, ()), CHEAP).window <= 10


def _runner(target, draft, params, seed=None, costs=CHEAP, options=None):
    r = Runner(target, params, options or DraftOptions(model=draft), seed=seed, ignore_eos=True)
    r.plan._costs = costs
    return r


def test_the_drafts_prompt_pass_is_bounded_and_after_the_first_token(tiny_model):
    target, draft = tiny_model(TinySpec(seed=3)), tiny_model(TinySpec(seed=4))
    prompt = [int(x) for x in np.random.default_rng(0).integers(1, 48, 300)]
    greedy = SamplerParams(temperature=0.0)
    r = _runner(target, draft, greedy)
    hybrid = r._base[0]
    rows = []
    real_eval = hybrid.model.session.eval
    hybrid.model.session.eval = lambda ids, **kw: (rows.append(len(ids)), real_eval(ids, **kw))[1]

    class Trace(list):
        write = list.append
    trace = Trace()
    out = r.run(prompt, 100, trace=trace)
    c = r.plan.choice
    assert c.model and c.window < len(prompt) and c.wait >= WAIT_TOKENS
    assert sum(rows) <= c.window + 100 + 8                 # the window, then what was generated
    assert trace[0].source != "model" and "plan:" in trace[0].plan
    model_steps = [t for t in trace if t.source == "model"]
    assert model_steps and min(t.n_context for t in model_steps) >= len(prompt) + c.wait
    assert StepRecord.from_json(trace[0].to_json()) == trace[0]
    assert out.ids == target.generate(prompt, n_predict=100, ignore_eos=True).ids
    assert "plan:" in out.stats.plan


def test_the_plan_never_changes_a_drafter_another_request_holds(tiny_model):
    """Requests on one DraftOptions(drafter=...), and a conversation's turns, share that
    drafter (its caches): each request's choice (whether the model drafts, the wait, the
    draft's window) lives in a per-request copy on the same caches, never in the shared one."""
    target, draft = tiny_model(TinySpec(seed=3)), tiny_model(TinySpec(seed=4))
    greedy = SamplerParams(temperature=0.0)
    shared = Runner(target, greedy, DraftOptions(model=draft))._base[0]
    settings = lambda d: (d.use_model, d.wait, d.model.window, d.model.lazy)
    before = settings(shared)
    a, b = (_runner(target, None, greedy, seed=1, options=DraftOptions(drafter=shared)) for _ in range(2))
    a.plan_request(300, 100)
    held = settings(a.drafter)
    b.plan_request(1800, 4)
    assert a.plan.choice.model and not b.plan.choice.model           # two different choices
    assert settings(a.drafter) == held and settings(b.drafter)[0] is False
    assert settings(shared) == before
    assert a.drafter.model.cache is shared.model.cache                # the same draft cache


def test_greedy_defaults_equal_plain_with_the_model_planned(tiny_model):
    target, draft = tiny_model(TinySpec(seed=3)), tiny_model(TinySpec(seed=4))
    greedy = SamplerParams(temperature=0.0)
    for prompt in ([1, 2, 3, 1, 2, 3, 1, 2], [5, 9, 2], list(range(1, 40))):
        plain = target.generate(prompt, n_predict=30, ignore_eos=True)
        assert _runner(target, draft, greedy).run(prompt, 30).ids == plain.ids


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(prompt=st.lists(st.integers(1, 47), min_size=1, max_size=120), n=st.integers(1, 60),
       window_costs=st.sampled_from([0.0005, 0.003, 0.05]))
def test_planned_greedy_output_is_plain_whatever_the_plan(tiny_model, prompt, n, window_costs):
    target, draft = tiny_model(TinySpec(seed=3)), tiny_model(TinySpec(seed=4))
    costs = Costs(CHEAP.target, PassCosts(0.01, 0.1, window_costs, True))
    got = _runner(target, draft, SamplerParams(temperature=0.0), costs=costs).run(prompt, n).ids
    assert got == target.generate(prompt, n_predict=n, ignore_eos=True).ids


def _wild(seed):
    rng = np.random.default_rng(seed)
    t = [0.0]

    def clock():
        t[0] += float(rng.exponential(10.0 ** rng.uniform(-6, 1)))
        return t[0]
    return clock


def test_seeded_sampled_requests_do_not_read_the_clock(tiny_model):
    target, draft = tiny_model(TinySpec(seed=3)), tiny_model(TinySpec(seed=4))
    params = SamplerParams(temperature=0.9, top_k=0, top_p=1.0, min_p=0.0)
    prompt = [1, 2, 3, 4, 1, 2, 3, 4, 5, 6]
    outs, asked = [], []
    for clock_seed in range(4):
        unseeded = _runner(target, draft, params)              # feeds this pair's Ledger
        unseeded.clock = _wild(clock_seed + 10)
        unseeded.run(prompt[::-1], 30)
        r = _runner(target, draft, params, seed=11)
        r.clock = _wild(clock_seed)
        res = r.run(prompt, 40)
        outs.append(res.ids)
        asked.append(r.policy.history)
        assert r.plan.choice.model and r.plan.choice.counts and res.stats.n_drafted > 0
    assert all(o == outs[0] for o in outs) and all(a == asked[0] for a in asked)


def test_counts_mode_ignores_timings_and_clock_mode_follows_them():
    def run(counts, draft_s):
        p = PlannedLength(CHEAP, 8, counts=counts)
        p.reset()
        for _ in range(10):
            p.prepare("model")
            n = p.next_n()
            p.observe(StepFeedback("model", n, n, n, n // 2, draft_s * n, 0.05, "model"))
        return p.history
    assert run(True, 1e-6) == run(True, 10.0)
    assert run(False, 1e-6) != run(False, 10.0)


def test_server_request_fields_go_through_the_plan():
    base = DraftOptions(kind="prompt-lookup")
    assert not DraftPlan.for_request(base, "none", None, None).enabled
    assert DraftPlan.for_request(base, None, 3, None).n == 3
    assert DraftPlan.for_request(base, "suffix", None, None).kind == "suffix"
    assert DraftPlan(base, None).free and not DraftPlan(DraftOptions(model=object()), None).free


def test_the_ledger_learns_acceptance_and_fades_back_to_the_prior():
    led = Ledger()
    assert led.alpha("model", 0.75) == 0.75
    led.record("model", 200, 40)
    low = led.alpha("model", 0.75)
    assert low < 0.4
    for _ in range(10):
        led.fade("model")
    assert low < led.alpha("model", 0.75) < 0.75
    inp = PlanInput(300, 128, True, False, True, ("prompt-lookup",), alpha_model=low)
    assert not choose(inp, CHEAP).model                       # measured to lose: free drafters alone
    assert choose(PlanInput(300, 128, True, False, True, ("prompt-lookup",)), CHEAP).model


def test_unseeded_requests_feed_the_ledger_and_seeded_ones_do_not(tiny_model):
    target, draft = tiny_model(TinySpec(seed=5)), tiny_model(TinySpec(seed=6))
    greedy = SamplerParams(temperature=0.0)
    r = _runner(target, draft, greedy, seed=1)
    r.run([1, 2, 3, 4, 5], 30)
    led = r.plan.ledger(True)
    assert led.verified == {} and r.plan.choice.reason.count("prior")
    r = _runner(target, draft, greedy)
    r.run([1, 2, 3, 4, 5], 30)
    assert led.verified.get("model", 0) > 0
    assert MODEL_ALPHA[True] != led.alpha("model", MODEL_ALPHA[True])


def test_a_seeded_explicit_adaptive_policy_reads_counts_too(tiny_model):
    target, draft = tiny_model(TinySpec(seed=3)), tiny_model(TinySpec(seed=4))
    params = SamplerParams(temperature=0.9, top_k=0, top_p=1.0, min_p=0.0)
    options = DraftOptions(kind="model", model=draft, policy="adaptive", n=6)
    outs = []
    for clock_seed in range(3):
        r = Runner(target, params, options, seed=5, ignore_eos=True)
        r.clock = _wild(clock_seed)
        outs.append((r.run([3, 1, 4, 1, 5, 9, 2, 6], 30).ids, r.policy.history))
        assert isinstance(r.policy, PlannedLength) and r.policy.counts
    assert all(o == outs[0] for o in outs)


# -- the table of pass costs (docs/speculative.md, "What a pass costs") ------------------------

DEAR = calibration.PROFILES["zen3"]              # an AVX2 Zen 3's measured curve: 9 rows 7.7x one


def _host(table, c: float = 0.35) -> Costs:
    t = PassCosts.of_table(0.05, tuple(table), 0.01, measured=True)
    return Costs(t, PassCosts.of_table(c * 0.05, tuple(table), 0.002, measured=True))


def test_measure_gives_a_table_for_every_pass_size(tiny_model):
    got = calibration.measure(tiny_model(TinySpec(seed=3)))
    assert len(got.table) == calibration.TABLE_ROWS and got.table[0] == 1.0
    assert all(v >= 1.0 for v in got.table) and got.rel(1) == 1.0
    assert got.verify_s(8) == got.row_s * got.table[8]
    assert got.rel(30) >= got.rel(17)                                          # past the table: extended


def test_an_old_slope_file_is_measured_again(tmp_path, monkeypatch, tiny_model):
    m = tiny_model(TinySpec(seed=3))
    costs = PassCosts.of_table(0.02, DEAR, 0.005, measured=True)
    calls, fake = _counting(monkeypatch, tmp_path, costs)
    key = calibration.cache_key(m.path, "None|None")
    old = {"version": 2, "key": key, "row_s": 0.02, "growth": 0.6, "prefill_tok_s": 0.005, "measured": True}
    calibration.cache_path(m.path, key).parent.mkdir(parents=True)
    calibration.cache_path(m.path, key).write_text(json.dumps(old))
    got = calibration.costs(m, fake)
    assert len(calls) == 1 and got.table == DEAR                                # measured, not read
    assert json.loads(calibration.cache_path(m.path, key).read_text())["table"] == list(DEAR)


def test_drift_measures_again_either_way(tmp_path, monkeypatch, tiny_model):
    m = tiny_model(TinySpec(seed=3))
    calls, fake = _counting(monkeypatch, tmp_path, PassCosts.of_table(0.02, DEAR, 0.005, measured=True))
    monkeypatch.setattr(calibration, "_DRIFT", {})
    monkeypatch.setattr(calibration, "_STALE", set())
    c = calibration.costs(m, fake)
    for factor in (3.0, 0.3):                                                   # slower, then faster
        for i in range(calibration.DRIFT_STEPS):
            gone = calibration.drifted(c, 2, factor * c.verify_s(2))
            assert gone == (i == calibration.DRIFT_STEPS - 1)
        assert calibration.stale(c) and not list((tmp_path / "calibration").glob("*.json"))
        c = calibration.costs(m, fake)
        assert not calibration.stale(c)
    assert len(calls) == 3
    for _ in range(3 * calibration.DRIFT_STEPS):                                # within the margin: never
        assert not calibration.drifted(c, 4, 1.3 * c.verify_s(4))
        assert not calibration.drifted(c, 4, c.verify_s(4) / 1.3)


def test_the_override_pins_every_table_and_refuses_nonsense(monkeypatch, tiny_model):
    monkeypatch.setenv(calibration.ENV, "1")
    monkeypatch.setenv(calibration.OVERRIDE, "zen3")
    assert not calibration.enabled() and calibration.prior().table == DEAR
    monkeypatch.setenv(calibration.OVERRIDE, "1.5,2.5")
    assert calibration.prior().table[:3] == (1.0, 1.5, 2.5) and calibration.prior().rel(5) > 2.5
    monkeypatch.setenv(calibration.OVERRIDE, "1.2")
    assert calibration.prior().rel(6) == pytest.approx(2.0)
    for bad in ("fast", "0.5,2", "nan", "1,,2"):
        monkeypatch.setenv(calibration.OVERRIDE, bad)
        with pytest.raises(ConfigError, match=calibration.OVERRIDE):
            calibration.prior()


@pytest.mark.parametrize("alpha, cheap_n, dear_n", [(0.9, 8, 2), (0.6, 2, 0), (0.3, 1, 0)])
def test_a_free_drafters_length_follows_the_host(alpha, cheap_n, dear_n):
    """Prompt lookup's length from the prior, on a cheap-row and a dear-row host: the same
    acceptance drafts long where rows are cheap and plain where they are dear."""
    got = {}
    for name, table in (("cheap", calibration.PROFILES["cheap"]), ("dear", DEAR)):
        p = PlannedLength(_host(table), 8, counts=True, alpha_prior=alpha)
        p.prepare("prompt-lookup/3")
        got[name] = p.next_n()
    assert got["cheap"] >= cheap_n and got["dear"] <= dear_n, got


def test_the_model_drafts_where_rows_are_cheap_and_not_where_they_are_dear():
    inp = PlanInput(prompt_len=200, n_predict=256, greedy=True, seeded=True, model=True, free=("prompt-lookup",))
    assert choose(inp, _host(calibration.PROFILES["cheap"])).model
    assert choose(inp, _host(calibration.PROFILES["vnni"])).model
    dear = choose(inp, _host(DEAR))
    assert not dear.model and dear.drafters == ("prompt-lookup",)            # the free drafters only


def test_specdec_calibrate_measures_writes_and_prints_the_table(tmp_path, tiny_model):
    from helpers import cli, one_line_error
    m = tiny_model(TinySpec(seed=3))
    env = {"SPECDEC_HOME": str(tmp_path), calibration.ENV: "1", calibration.OVERRIDE: ""}
    r = cli("calibrate", "-m", m.path, "-md", m.path, "--json", env=env)
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout)
    assert set(got) == {"target", "draft"} and len(got["target"]["table"]) == calibration.TABLE_ROWS
    assert Path(got["target"]["file"]).is_file()
    r = cli("calibrate", "-m", m.path, env=env)
    assert r.returncode == 0 and "t(M)/t(1)" in r.stdout
    one_line_error(cli("calibrate", "-m", m.path, env={**env, calibration.OVERRIDE: "zen3"}), "calibration is off")
