"""GGUF fuzzing in CI: a few hundred mutants (fixed seed) of synthetic files and of a real
file's header, each through a worker subprocess; every one must load and give finite logits
or fail with a one-line SpecdecError (the nightly run: benchmarks/fuzz.py)."""
from __future__ import annotations

import struct
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import fuzz_harness
from fuzz_bases import real_header_base, synthetic_bases
from gguf_mutants import mutate, scan
from specdec.errors import SpecdecError

CI_SYNTHETIC, CI_REAL = 240, 60


def _real_base(tmp_path):
    from specdec.models import hub
    try:
        src = hub.resolve("smollm2-135m-instruct-q4_1", download=False)
    except Exception:           # not in the model cache: the synthetic files only
        return None
    return real_header_base(src, tmp_path, "smollm2")


@pytest.mark.slow
def test_fuzz_ci(tmp_path):
    bases = synthetic_bases(tmp_path)
    rep = fuzz_harness.run(bases, CI_SYNTHETIC, np.random.default_rng(20261204), tmp_path / "work")
    real = _real_base(tmp_path)
    if real is not None:
        r2 = fuzz_harness.run([real], CI_REAL, np.random.default_rng(7), tmp_path / "work-real")
        rep.n += r2.n
        rep.counts.update(r2.counts)
        rep.failures += r2.failures
    print(rep.as_dict()["counts"])
    assert rep.n >= 200
    assert not rep.failures, rep.failures[:5]
    assert rep.counts["ok"] > 0 and rep.counts["error"] > 0


@pytest.fixture(scope="module")
def tiny_file(tmp_path_factory):
    d = tmp_path_factory.mktemp("fuzzbase")
    _, path, _ = synthetic_bases(d)[0]
    return path


@settings(max_examples=150, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(data=st.data())
def test_hypothesis_header_edits(tiny_file, tmp_path_factory, data):
    """Hypothesis picks fields of the header / KV / tensor infos and the values written into
    them; parsing, the config and the tokenizer (pure Python, no kernel: safe in-process)
    either succeed or raise a one-line SpecdecError."""
    from specdec.engine.config import ModelConfig
    from specdec.engine.gguf_file import GGUFFile
    from specdec.text.tokenizer import Tokenizer
    buf = bytearray(tiny_file.read_bytes())
    lay = scan(bytes(buf))
    fields = [8, 16] + [k.start for k in lay.kvs] + [p for k in lay.kvs for p in k.strlens] \
        + [p + 4 for k in lay.kvs for p in k.arrays] + [d for t in lay.tinfos for d in t.dims_pos] \
        + [t.off_pos for t in lay.tinfos]
    for _ in range(data.draw(st.integers(1, 3))):
        pos = data.draw(st.sampled_from(fields))
        buf[pos:pos + 8] = struct.pack("<Q", data.draw(st.integers(0, (1 << 64) - 1)))
    if data.draw(st.booleans()):
        pos = data.draw(st.integers(0, lay.header_end - 1))
        buf[pos] ^= data.draw(st.integers(1, 255))
    cut = data.draw(st.one_of(st.just(len(buf)), st.integers(0, len(buf))))
    p = tmp_path_factory.mktemp("h") / "m.gguf"
    p.write_bytes(bytes(buf[:cut]))
    try:
        gf = GGUFFile(p)
        ModelConfig.from_gguf(gf)
        Tokenizer.from_metadata(gf.metadata, str(p))
    except SpecdecError as e:
        assert "\n" not in str(e) and str(p) in str(e), str(e)


CLI_KINDS = ("truncate_boundary", "lie_strlen", "dup_kv", "lie_dims")


@pytest.mark.slow
@pytest.mark.parametrize("kind", CLI_KINDS)
def test_cli_on_mutants(tmp_path, tiny_file, kind):
    """`specdec info` and `specdec run -m` on a mutant: exit 2, one line on stderr, no traceback."""
    buf = tiny_file.read_bytes()
    lay = scan(buf)
    rng = np.random.default_rng(CLI_KINDS.index(kind))
    for _ in range(50):                  # a mutant of this kind that specdec refuses
        detail, data = mutate(buf, lay, kind, rng)
        p = tmp_path / "m.gguf"
        p.write_bytes(data)
        try:
            specdec_load(p)
        except SpecdecError:
            break
    else:
        pytest.skip(f"no refused {kind} mutant in 50 tries")
    for args in (["info", str(p)], ["run", "-m", str(p), "-p", "hi", "-n", "1"]):
        r = subprocess.run([sys.executable, "-m", "specdec.frontends.cli", *args], capture_output=True, text=True)
        assert r.returncode == 2, (detail, r.stderr)
        lines = [ln for ln in r.stderr.splitlines() if "error" in ln]
        assert len(lines) == 1 and str(p) in lines[0], (detail, r.stderr)
        assert "Traceback" not in r.stderr, r.stderr


def specdec_load(p):
    """Load without running a kernel: the mutants picked here fail in parsing."""
    from specdec.engine.config import ModelConfig
    from specdec.engine.gguf_file import GGUFFile
    from specdec.text.tokenizer import Tokenizer
    gf = GGUFFile(p)
    ModelConfig.from_gguf(gf)
    Tokenizer.from_metadata(gf.metadata, str(p))
    import specdec
    specdec.load(p)
