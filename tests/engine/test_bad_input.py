"""Bad input: every failure is a SpecdecError subclass with one line naming the file and the
problem; the CLI turns it into exit code 2 with no traceback."""
from __future__ import annotations

import subprocess
import sys

import gguf
import numpy as np
import pytest
from gguf import GGMLQuantizationType as T

import specdec
from specdec.errors import (ContextOverflowError, GGUFError, SpecdecError, UnsupportedModelError)
from specdec.engine.gguf_file import GGUFFile
from synth import TinySpec, write_tiny_model


def _one_line(err: Exception, *needles: str) -> None:
    msg = str(err)
    assert "\n" not in msg, msg
    for n in needles:
        assert n in msg, (n, msg)


def test_missing_file(tmp_path):
    with pytest.raises(GGUFError) as e:
        GGUFFile(tmp_path / "nope.gguf")
    _one_line(e.value, "nope.gguf", "no such file")


def test_not_gguf(tmp_path):
    p = tmp_path / "notes.gguf"
    p.write_text("this is not a model file, just some text that is long enough")
    with pytest.raises(GGUFError) as e:
        GGUFFile(p)
    _one_line(e.value, "notes.gguf", "not a GGUF file")


@pytest.mark.parametrize("keep", [0.01, 0.5, 0.98])
def test_truncated(tmp_path, keep):
    full = write_tiny_model(tmp_path / "full.gguf")
    data = full.read_bytes()
    p = tmp_path / "cut.gguf"
    p.write_bytes(data[: int(len(data) * keep)])
    with pytest.raises(GGUFError) as e:
        specdec.load(p)
    _one_line(e.value, "cut.gguf", "truncated")


def test_unknown_architecture(tmp_path):
    p = tmp_path / "mamba.gguf"
    w = gguf.GGUFWriter(str(p), "mamba")
    w.add_tensor("x", np.zeros(32, np.float32))
    w.write_header_to_file(); w.write_kv_data_to_file(); w.write_tensors_to_file(); w.close()
    with pytest.raises(UnsupportedModelError) as e:
        specdec.load(p)
    _one_line(e.value, "mamba.gguf", "unknown architecture 'mamba'")


def _rewrite_without(src, dst, drop: str | None = None, retype: str | None = None, as_type=T.IQ2_XXS):
    """Copy a GGUF file, dropping one tensor or storing one as `as_type` (one we lack)."""
    r = gguf.GGUFReader(str(src))
    w = gguf.GGUFWriter(str(dst), r.fields["general.architecture"].contents())
    for k, f in r.fields.items():
        if k.startswith("GGUF.") or k == "general.architecture":
            continue
        vtype = f.types[0]
        if vtype == gguf.GGUFValueType.ARRAY:
            w.add_array(k, f.contents())
        else:
            w.add_key_value(k, f.contents(), vtype)
    for t in r.tensors:
        if t.name == drop:
            continue
        if t.name == retype:
            n_rows, k = t.shape[1], t.shape[0]
            block, size = gguf.GGML_QUANT_SIZES[as_type]
            raw = np.random.default_rng(0).integers(0, 255, (n_rows, k // block * size), dtype=np.uint8)
            w.add_tensor(t.name, raw, raw_shape=raw.shape, raw_dtype=as_type)
        else:
            w.add_tensor(t.name, np.asarray(t.data), raw_dtype=t.tensor_type)
    w.write_header_to_file(); w.write_kv_data_to_file(); w.write_tensors_to_file(); w.close()
    return dst


def test_missing_tensor(tmp_path):
    src = write_tiny_model(tmp_path / "full.gguf")
    p = _rewrite_without(src, tmp_path / "holey.gguf", drop="blk.1.ffn_up.weight")
    with pytest.raises(GGUFError) as e:
        specdec.load(p)
    _one_line(e.value, "holey.gguf", "missing tensor 'blk.1.ffn_up.weight'")


@pytest.mark.parametrize("lacking", [T.IQ2_XXS, T.IQ3_S, T.IQ1_M, T.TQ1_0], ids=lambda t: t.name)
def test_unsupported_quant_type(tmp_path, lacking):
    """A type we still lack (IQ1 / IQ2 / IQ3, TQ) is refused by name, with the tensor and the type."""
    src = write_tiny_model(tmp_path / "full.gguf", TinySpec(d_model=256, d_ff=256))
    p = _rewrite_without(src, tmp_path / "iq.gguf", retype="blk.0.attn_q.weight", as_type=lacking)
    with pytest.raises(UnsupportedModelError) as e:
        specdec.load(p)
    _one_line(e.value, "iq.gguf", "blk.0.attn_q.weight", lacking.name)


def test_prompt_longer_than_context(tiny_model):
    m = tiny_model(TinySpec(n_ctx=16))
    with pytest.raises(ContextOverflowError) as e:
        m.generate(list(range(20)), n_predict=4)
    _one_line(e.value, "20 tokens", "--ctx-size 16")


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "specdec.frontends.cli", *args], capture_output=True, text=True)


@pytest.mark.parametrize("make", ["missing", "not_gguf"])
def test_cli_bad_file_exit_2(tmp_path, make):
    p = tmp_path / "bad.gguf"
    if make == "not_gguf":
        p.write_text("hello" * 20)
    r = _cli("run", "-m", str(p), "-p", "hi", "-n", "1")
    assert r.returncode == 2, r.stderr
    lines = [l for l in r.stderr.splitlines() if "error" in l]
    assert len(lines) == 1 and "bad.gguf" in lines[0], r.stderr
    assert "Traceback" not in r.stderr


@pytest.mark.parametrize("flags,needle", [
    (["--draft-n", "0"], "--draft-n"), (["--draft-n", "17"], "--draft-n"),
    (["--draft-p", "1.5"], "--draft-p"), (["--n-predict", "x"], "--n-predict"),
    (["--bogus"], "--bogus"), (["-s", "-5"], "--seed"),
])
def test_cli_bad_flag_exit_2(flags, needle):
    r = _cli("run", "-p", "hi", *flags)
    assert r.returncode == 2, r.stderr
    assert needle in r.stderr and "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr


def test_errors_are_specdec_errors():
    for cls in (GGUFError, UnsupportedModelError, ContextOverflowError):
        assert issubclass(cls, SpecdecError)


def test_activations_choice(tiny_model, tmp_path):
    """activations= picks the matmul input path per layer (gemma3: float by default); a bad
    value is a one-line ConfigError; both paths give close logits, rows stay independent."""
    spec = TinySpec(arch="gemma3", qtype=int(T.Q5_0), n_layer=2, sliding_window=3, tied=True, seed=5)
    path = write_tiny_model(tmp_path / "g.gguf", spec)
    auto, q8 = specdec.load(path), specdec.load(path, activations="q8")
    assert all(lin.float_act for lin in (auto.weights.layers[0].wq, auto.weights.layers[1].w_down))
    assert not auto.weights.output.float_act and not q8.weights.layers[0].wq.float_act
    ids = [3, 1, 4, 1, 5, 9, 2, 6]
    a, b = auto.logits(ids), q8.logits(ids)
    assert np.allclose(a, b, atol=0.1 * np.abs(a).max())
    np.testing.assert_array_equal(auto.logits(ids[:3])[-1], a[2])
    with pytest.raises(specdec.SpecdecError) as e:
        specdec.load(path, activations="fp8")
    _one_line(e.value, "activations", "'fp8'")
