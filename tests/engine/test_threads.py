"""The parallel runtime: the threading layer (kernels/threading_layer.py) and the thread count chosen
per pass (engine/thread_count.py).  Neither may change a bit of the logits; the governor runs the
faster count, notices a change, and yields to -t."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T

import specdec
from specdec.engine import thread_count as threads
from specdec.engine.thread_count import GOVERNOR, MAX_INTERVAL, PassKind
from helpers import cli, one_line_error
from synth import TinySpec

SPECS = [TinySpec(arch="qwen2", qtype=int(T.Q8_0), seed=1),
         TinySpec(arch="qwen2", qtype=int(T.Q4_K), d_model=256, d_ff=256, n_head=4, n_head_kv=2, seed=3)]
IDS = [3, 17, 4, 40, 22, 9, 9, 31, 0, 45, 12, 7]


def run_kind(kind: PassKind, cost: dict, n: int) -> list[int]:
    counts = []
    for _ in range(n):
        c = kind.pick()
        kind.record(c, cost[c])
        counts.append(c)
    return counts


def test_governor_runs_the_faster_count_and_follows_a_change():
    kind = PassKind((2, 1))
    idle = run_kind(kind, {2: 0.06, 1: 0.10}, 200)
    assert idle[:4] == [2, 2, 1, 1]                     # each count timed twice first
    assert idle[-100:].count(2) >= 100 - 100 // MAX_INTERVAL - 1
    busy = run_kind(kind, {2: 0.30, 1: 0.11}, 200)      # a neighbour takes a core
    assert busy.index(1) <= MAX_INTERVAL and busy[-100:].count(1) >= 97
    back = run_kind(kind, {2: 0.06, 1: 0.10}, 200)      # ... and leaves
    assert back.index(2) <= 2 * MAX_INTERVAL and back[-100:].count(2) >= 97


def test_a_models_busiest_kind_of_pass_decides_for_all():
    import numba
    from specdec.engine.thread_count import Governor
    gov, key, ran = Governor(), ("m", 1), []
    gov.adaptive = True
    cores = numba.config.NUMBA_NUM_THREADS
    for _ in range(40):                                  # decode steps: one row each
        gov.run(key, 1, lambda: ran.append(numba.get_num_threads()))
    leader = gov.kinds[key][1]
    for rows in (3, 9, 200):                             # rarer kinds and a prompt pass follow it
        gov.run(key, rows, lambda: ran.append(numba.get_num_threads()))
        assert ran[-1] == leader.current
    assert gov.kinds[key][4].n_timed() == 1 and 256 not in gov.kinds[key]
    assert set(ran) <= {cores, max(1, cores // 2), 1}
    numba.set_num_threads(cores)


def test_fixed_threads_turn_the_governor_off():
    import numba
    seen = []
    try:
        threads.set_threads(1)
        GOVERNOR.run(("test", 0), 1, lambda: seen.append(numba.get_num_threads()))
        assert GOVERNOR.describe()["threads_mode"] == "fixed 1"
    finally:
        threads.set_threads(0)
    assert seen == [1] and GOVERNOR.describe()["threads_mode"] in ("adaptive", "all threads")


def test_the_governor_is_on_where_the_layer_has_static_shares(monkeypatch):
    from specdec.engine.thread_count import Governor
    from specdec.kernels import threading_layer as layer
    monkeypatch.delenv("SPECDEC_ADAPTIVE_THREADS", raising=False)
    on_tbb = layer.describe()["threading_asked"] == "tbb"
    assert Governor().adaptive is not on_tbb
    monkeypatch.setenv("SPECDEC_ADAPTIVE_THREADS", "1")
    assert Governor().adaptive


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: T(s.qtype).name)
def test_logits_are_the_same_bits_on_any_thread_count(tiny_model, spec):
    import numba
    m = specdec.load(tiny_model(spec).path, n_ctx=64)
    out = {}
    try:
        for n in sorted({1, numba.config.NUMBA_NUM_THREADS}):
            threads.set_threads(n)
            s = m.session(64)
            out[n] = [s.eval(IDS[:8]), s.eval(IDS[8:9]), s.eval(IDS[9:])]
    finally:
        threads.set_threads(0)
    first = out[1]
    for got in out.values():
        assert all(np.array_equal(a, b) for a, b in zip(got, first))


LAYER_SCRIPT = """
import hashlib, json, sys
import numba, specdec
from specdec.kernels import threading_layer
m = specdec.load(sys.argv[1], n_ctx=64)
s = m.session(64)
h = hashlib.sha256()
for ids in ({ids}[:8], {ids}[8:9], {ids}[9:]):
    h.update(s.eval(ids).tobytes())
print(json.dumps(dict(threading_layer.describe(), ran=numba.threading_layer(), sha=h.hexdigest())))
""".format(ids=IDS)


@pytest.mark.slow
def test_every_threading_layer_gives_the_same_bits(tiny_model):
    path = tiny_model(SPECS[1]).path
    got = {}
    for layer in ("tbb", "omp", "workqueue"):
        env = {"SPECDEC_THREADING": layer}
        r = subprocess.run([sys.executable, "-c", LAYER_SCRIPT, str(path)], capture_output=True, text=True,
                           env={**os.environ, **env}, timeout=600)
        assert r.returncode == 0, r.stderr
        rec = json.loads(r.stdout.strip().splitlines()[-1])
        if rec["threading_asked"] != layer:             # e.g. no oneTBB wheel for this platform
            assert "threading_note" in rec
            continue
        assert rec["ran"] == layer
        got[layer] = rec["sha"]
    assert "omp" in got or "workqueue" in got
    assert len(set(got.values())) == 1, got


def test_a_bad_threading_layer_is_one_line(tiny_model):
    path = tiny_model(SPECS[0]).path
    r = cli("run", "-m", path, "-p", "hi", "-n", "2", env={"SPECDEC_THREADING": "fibers"})
    one_line_error(r, "SPECDEC_THREADING=fibers", "tbb")


def test_default_layer_is_reported():
    from specdec.frontends.bench import machine_info
    info = machine_info()
    assert info["threading_asked"] in ("tbb", "omp", "workqueue")
    assert info["threads_mode"] in ("adaptive", "all threads") or info["threads_mode"].startswith("fixed")
