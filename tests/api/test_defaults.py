"""The defaults: how a model file is loaded (read into memory when it fits, else mapped), how
a draft model drafts when no drafting flag is given, and what the benchmarks record about
the CPU.  Speed itself is measured by benchmarks/defaults.py and bandwidth.py, not here."""
from __future__ import annotations

import numpy as np
import pytest

import specdec
from specdec.engine import gguf_file, resources
from specdec.kernels import cpu
from specdec.api.request import AUTO_N_MAX, AUTO_VOCAB, DraftOptions
from specdec.speculation.policies import AdaptiveLength, Threshold
from synth import TinySpec, write_tiny_model

ZEN4 = """processor\t: 0
vendor_id\t: AuthenticAMD
cpu family\t: 25
model\t\t: 17
model name\t: AMD EPYC 9R14 96-Core Processor
stepping\t: 1
flags\t\t: fpu sse4_2 avx avx2 fma f16c avx512f avx512bw avx512vl avx512_vnni avx512_bf16

processor\t: 1
vendor_id\t: AuthenticAMD
model name\t: something else
"""


def test_should_map_reads_files_that_fit_in_half_the_memory():
    assert not gguf_file.should_map(1000, 2000)
    assert gguf_file.should_map(1001, 2000)
    assert gguf_file.should_map(10, None)              # unknown memory: map, read nothing up front


def test_default_load_reads_into_memory_when_it_fits(tmp_path, monkeypatch):
    p = write_tiny_model(tmp_path / "t.gguf")
    m = specdec.load(p)
    assert m.gguf.in_memory
    raw = np.fromfile(p, dtype=np.uint8)
    assert not m.gguf._mm.flags.writeable
    mapped = specdec.load(p, mmap=True)
    assert not mapped.gguf.in_memory
    ids = [1, 2, 3, 4]
    assert np.array_equal(m.logits(ids), mapped.logits(ids))          # same bits either way
    monkeypatch.setattr(resources, "available_bytes", lambda meminfo=None: raw.size)   # < 2x file
    assert not specdec.load(p).gguf.in_memory                          # too big: mapped


def test_read_into_memory_is_the_file(tmp_path):
    p = tmp_path / "blob"
    data = np.random.default_rng(0).integers(0, 256, (3 << 20) + 17, dtype=np.uint8)
    data.tofile(p)
    got = gguf_file.read_into_memory(str(p))
    assert got.shape == data.shape and np.array_equal(got, data) and not got.flags.writeable


def test_mmap_flags(tmp_path):
    from specdec.frontends.cli import build_parser
    ap = build_parser()
    assert ap.parse_args(["run"]).mmap is None
    assert ap.parse_args(["run", "--mmap"]).mmap is True
    assert ap.parse_args(["run", "--no-mmap"]).mmap is False


def test_parse_cpuinfo_of_a_zen4_host():
    c = cpu.parse_cpuinfo(ZEN4)
    assert (c.vendor, c.family, c.model, c.stepping) == ("AuthenticAMD", 25, 17, 1)
    assert c.model_name == "AMD EPYC 9R14 96-Core Processor"
    assert c.microarchitecture == "zen4" and "avx512_vnni" in c.simd and "avx_vnni" not in c.flags


def test_machine_info_says_where_it_ran():
    from specdec.frontends.bench import machine_info
    info = machine_info()
    for key in ("cpu", "cpu_vendor", "cpu_flags", "cpu_simd", "kernel_paths", "cores", "llama_cpp_build"):
        assert key in info
    assert set(info["kernel_paths"]) >= {"kquants", "legacy", "fp16"}


class _Big:                                  # a draft model's config with a large vocabulary
    class config:
        n_vocab = 151936


def test_defaults_draft_hybrid_adaptive_with_a_trimmed_head():
    o = DraftOptions(model=_Big())
    assert o.enabled and o.auto and o.drafter_kind == "hybrid"
    pol = o.length_policy()
    assert isinstance(pol, AdaptiveLength) and pol.n_max == AUTO_N_MAX
    assert o.draft_vocab(o.model) == AUTO_VOCAB
    assert DraftOptions(model=_Big(), vocab=0).draft_vocab(_Big()) is None      # 0: every id
    assert "(defaults)" in o.describe()


@pytest.mark.parametrize("fields", [dict(n=5, p=0.9), dict(n=5), dict(p=0.9), dict(policy="threshold")])
def test_llamacpp_flags_keep_their_meaning(fields):
    o = DraftOptions(model=_Big(), **fields)
    assert not o.auto and o.drafter_kind == "model"
    pol = o.length_policy()
    assert isinstance(pol, Threshold) and (pol.n_max, pol.p_min) == (5, 0.9)


def test_cli_defaults_are_auto():
    from specdec.frontends.cli import _draft_options, build_parser
    ap = build_parser()
    assert _draft_options(ap.parse_args(["run"])).auto
    o = _draft_options(ap.parse_args(["run", "--draft-n", "5", "--draft-p", "0.9"]))
    assert (o.n, o.p, o.auto) == (5, 0.9, False)


def test_greedy_defaults_equal_plain(tiny_model):
    """generate(draft=model) with every default: the same ids as the target alone."""
    target = tiny_model(TinySpec(seed=3))
    draft = tiny_model(TinySpec(seed=4))
    for prompt in ([1, 2, 3, 1, 2, 3, 1, 2], [5, 9, 2]):
        plain = target.generate(prompt, n_predict=24, ignore_eos=True)
        spec = target.generate(prompt, n_predict=24, ignore_eos=True, draft=draft)
        assert spec.ids == plain.ids and spec.stats is not None and spec.stats.n_steps > 0
        assert "model" not in spec.stats.by_drafter          # a draft as large as the target never pays
        assert set(spec.stats.by_drafter) <= {"prompt-lookup"}


@pytest.mark.parametrize("table", ["vnni", "zen3"])
def test_the_defaults_draft_with_the_model_where_it_pays(tiny_model, monkeypatch, table):
    """A draft model an eighth of the target's bytes (the plan's uncalibrated prior): on a
    host whose extra rows are cheap (the vnni table, pinned here) both prompt lookup and the
    draft model draft, and the answer is plain greedy's; where rows are dear (zen3) the plan
    leaves the model out."""
    monkeypatch.setenv("SPECDEC_PASS_COSTS", table)
    target = tiny_model(TinySpec(seed=3, n_layer=8))
    draft = tiny_model(TinySpec(seed=3, n_layer=1))
    plain = target.generate([5, 9, 2], n_predict=64, ignore_eos=True)
    spec = target.generate([5, 9, 2], n_predict=64, ignore_eos=True, draft=draft, seed=0)
    assert spec.ids == plain.ids
    by = spec.stats.by_drafter
    if table == "vnni":
        assert set(by) == {"prompt-lookup", "model"} and by["model"].n_drafted > 0, spec.stats.plan
        assert "prompt-lookup+model" in spec.stats.plan
    else:
        assert "model" not in by, spec.stats.plan
