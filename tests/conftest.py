"""Shared fixtures: tiny synthetic models (written per test session) and the real models.

Real models come from the model cache (SPECDEC_HOME, default ~/.cache/specdec) and are
fetched on first use like `specdec pull` would; SPECDEC_OFFLINE=1 skips those tests instead.
"""
from __future__ import annotations

import os
import sys
from functools import lru_cache
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
# The suite loads many files once each: no prepared-weights folders in the user's cache
# (tests/engine/test_prepared.py turns them on, in a folder of its own).  Subprocesses inherit it.
os.environ.setdefault("SPECDEC_PREPARED", "0")
# ... nor calibrations: the drafting plan uses its prior (tests/speculation/test_plan.py turns
# calibration on, in a folder of its own).
os.environ.setdefault("SPECDEC_CALIBRATE", "0")
# ... and that prior pinned, whatever this host's kernels cost: no assertion may follow the host.
# The README's test command runs the speculation, API and serve tests a second time under the
# dear rows of an AVX2 Zen 3 (SPECDEC_PASS_COSTS=zen3), so one that does fails on every host.
os.environ.setdefault("SPECDEC_PASS_COSTS", "vnni")

from helpers import real_model_path  # noqa: E402
from synth import TinySpec, write_tiny_model  # noqa: E402

REAL_MODELS = ("smollm2-135m-instruct-q4_1", "qwen2.5-coder-0.5b-instruct",
               "qwen2.5-coder-1.5b-instruct-q4_k_m", "gemma-3-270m-q4_k_m")


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("tiny")


@pytest.fixture(scope="session")
def tiny_model(tiny_dir):
    """tiny_model(TinySpec(...)) -> specdec.Model, written once per distinct spec."""
    import specdec

    @lru_cache(maxsize=None)
    def make(spec: TinySpec = TinySpec()):
        name = f"{spec.arch}-{spec.qtype}-{spec.n_vocab}-{spec.d_model}-{spec.seed}-{abs(hash(spec))}.gguf"
        return specdec.load(write_tiny_model(tiny_dir / name, spec), n_ctx=spec.n_ctx)
    return make


@lru_cache(maxsize=None)
def _load_real(model_id: str):
    import specdec
    return specdec.load(real_model_path(model_id), n_ctx=1024)


@pytest.fixture(scope="session")
def real_model():
    """real_model(model_id) -> specdec.Model (loaded once per test session)."""
    return _load_real


@pytest.fixture(scope="session")
def qwen35_file(tiny_dir):
    """qwen35_file(Qwen35Spec(...)) -> the path of its synthetic qwen35 file, written once per spec."""
    from specdec.testing.synth_qwen35 import write_qwen35_model

    @lru_cache(maxsize=None)
    def make(spec):
        return write_qwen35_model(tiny_dir / f"qwen35-{abs(hash(spec))}.gguf", spec)
    return make
