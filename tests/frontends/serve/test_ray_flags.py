"""The Ray Serve flags of `specdec serve` without a cluster (Ray need not be installed): a
missing Ray is one line naming the flag and the extra, bad values are one line (exit 2), the
deployment's options follow the flags, and the replicas' /metrics sum as documented."""
from __future__ import annotations

import sys

import pytest

from specdec.frontends.cli import build_parser, main
from specdec.frontends.serve import ray as ray_serve


def args(*flags: str):
    return build_parser().parse_args(["serve", "-m", "model.gguf", *flags])


def test_without_ray_the_flag_is_a_one_line_error(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "ray", None)          # `import ray` raises ImportError
    monkeypatch.setenv("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")   # restored afterwards
    assert main(["serve", "-m", "model.gguf", "--ray-replicas", "2"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert "--ray-replicas" in err and "pip install 'specdec[ray]'" in err


@pytest.mark.parametrize("flags, message", [
    (["--ray-replicas", "-1"], "--ray-replicas must be >= 1"),
    (["--ray-replicas", "2", "--ray-max-replicas", "1"], "--ray-max-replicas must be >= --ray-replicas"),
    (["--ray-replicas", "1", "--port", "70000"], "--port must be in 0..65535"),
    (["--ray-replicas", "1", "--draft-caps", "x"], "--draft-caps"),
])
def test_bad_flags_are_caught_before_any_cluster(flags, message):
    from specdec.errors import ConfigError
    with pytest.raises(ConfigError, match=message):
        ray_serve.check(args(*flags))


def test_deployment_options_follow_the_flags():
    o = ray_serve.deployment_options(args("-np", "3", "-t", "2", "--queue-size", "5", "--ray-replicas", "2"))
    assert o["num_replicas"] == 2 and "autoscaling_config" not in o
    assert o["ray_actor_options"] == {"num_cpus": 2}
    assert o["max_ongoing_requests"] == 3 and o["max_queued_requests"] == 5
    o = ray_serve.deployment_options(args("-np", "4", "-t", "1", "--ray-replicas", "1", "--ray-max-replicas", "3"))
    assert "num_replicas" not in o
    assert o["autoscaling_config"] == {"min_replicas": 1, "initial_replicas": 1, "max_replicas": 3,
                                       "target_ongoing_requests": 4}


def test_sum_metrics_adds_counters_and_slot_gauges_only():
    a = ('# HELP specdec_requests_total x\nspecdec_requests_total{status="ok"} 3\n'
         'specdec_tokens_predicted_total 40\nspecdec_slots_total 4\nspecdec_batch_size_mean 1.5\n')
    b = 'specdec_requests_total{status="ok"} 5\nspecdec_tokens_predicted_total 2\nspecdec_slots_total 4\n'
    total = ray_serve.sum_metrics([a, b])
    assert total == {("specdec_requests_total", (("status", "ok"),)): 8.0,
                     ("specdec_tokens_predicted_total", ()): 42.0, ("specdec_slots_total", ()): 8.0}
