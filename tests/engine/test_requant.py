"""Requantization at load (kernels/quantize.py, engine/requant.py, load(requant=, requant_head=)).

- quantize() writes the bytes gguf-py's reference quantizers write (ggml's rounding rules),
  bit for bit, and requantize() is dequantize-then-quantize;
- the round trip stays within each format's error (|d| for Q4_0 / Q5_0, |d| / 2 for Q8_0);
- only narrowing conversions happen, the lookup table stays, a tied head gets its own copy;
- a requantized tiny model gives finite logits close to the original's, alike mapped or not;
- greedy speculative decoding with a requantized draft is greedy plain decoding, token for
  token (a requantized draft is just another draft: the output law is untouched);
- a bad type is one ConfigError naming the flag, in the API and on the command line.
"""
from __future__ import annotations

import gguf
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import specdec
from specdec.engine.requant import Requant, bits_per_weight, narrows, parse_type
from specdec.errors import ConfigError
from specdec.kernels import get_rows, registry
from specdec.kernels import quantize as kq
from specdec.kernels.formats import Q4_0, Q4_K, Q5_0, Q6_K, Q8_0
from synth import TinySpec, write_tiny_model
from helpers import cli, one_line_error

T = gguf.GGMLQuantizationType
TARGETS = (Q4_0, Q5_0, Q8_0)


def _blocks(seed: int, n: int, k: int, log_scale=(-8, 4)) -> np.ndarray:
    """(n, k) float32 with the awkward cases in: zero blocks, constant blocks, ties of |x|,
    a lone outlier, tiny and huge scales (row scales e^log_scale)."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, k)) * np.exp(rng.uniform(*log_scale, (n, 1)))
    x = x.astype(np.float32)
    x[0, :32] = 0
    if n > 1:
        x[1, :32] = x[1, 0]
    if n > 2:
        x[2, 3], x[2, 7] = 2.0, -2.0              # |x| tie: the first one is the block's max
    if n > 3:
        x[3, 40 % k] = 1e4
    return x


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**31), n=st.integers(1, 9), nb=st.integers(1, 6),
       qtype=st.sampled_from(TARGETS))
def test_quantize_is_ggml_reference_bit_for_bit(seed, n, nb, qtype):
    x = _blocks(seed, n, 32 * nb)
    want = gguf.quants.quantize(x, T(qtype))
    got = kq.quantize(x, qtype)
    assert got.dtype == np.uint8 and got.shape == want.shape
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("src", [Q8_0, Q5_0, Q6_K, Q4_K, int(T.F16), int(T.F32)])
@pytest.mark.parametrize("dst", TARGETS)
def test_requantize_is_dequantize_then_quantize(src, dst):
    rng = np.random.default_rng(src * 7 + dst)
    k = 512
    if src in (Q6_K, Q4_K):
        from synth import _random_kquant
        w = _random_kquant(rng, 24, k, T(src), 0.05)
    else:
        w = gguf.quants.quantize(_blocks(src, 24, k) * np.float32(0.01), T(src))
    x = gguf.quants.dequantize(w, T(src)).astype(np.float32)              # (24, k)
    got = kq.requantize(w, src, dst, k)
    # + 0 turns -0.0 into 0.0: for an all-zero block whose first value is -0.0 gguf-py takes
    # that value as the block's max (d = +0.0) where ggml's C loop keeps its initial 0.0f
    # (d = -0.0); both dequantize to zeros, and here the C rule is followed
    np.testing.assert_array_equal(got, gguf.quants.quantize(x + np.float32(0), T(dst)))


@pytest.mark.parametrize("qtype", TARGETS)
def test_round_trip_within_the_format_error(qtype):
    x = _blocks(3, 64, 256, log_scale=(-4, 4))       # scales d above fp16's subnormals
    w = kq.quantize(x, qtype)
    back = get_rows(w, qtype, np.arange(64), 256)                          # (64, 256)
    d = np.abs(w.reshape(64, 8, -1)[:, :, :2].copy().view(np.float16).astype(np.float32))
    d = np.repeat(d.reshape(64, 8), 32, axis=1)                            # (64, 256) each value's |d|
    amax = np.repeat(np.abs(x).reshape(64, 8, 32).max(-1), 32, axis=1)     # fp16 rounding of d
    bound = (0.5 if qtype == Q8_0 else 1.0) * d + amax * 2e-3 + 1e-30
    assert (np.abs(back - x) <= bound).all()


def test_only_narrowing_conversions():
    assert [round(bits_per_weight(q), 2) for q in (Q4_0, Q4_K, Q5_0, Q6_K, Q8_0)] == \
        [4.5, 4.5, 5.5, 6.56, 8.5]
    assert narrows(Q8_0, Q4_0) and narrows(Q5_0, Q4_0) and narrows(Q6_K, Q5_0)
    assert not narrows(Q4_K, Q4_0) and not narrows(Q4_0, Q4_0) and not narrows(Q4_0, Q8_0)
    assert not narrows(Q8_0, None)
    spec = Requant.of("Q4_0", None)
    assert spec.target_for("blk.3.ffn_down.weight") == Q4_0
    assert spec.target_for("output.weight") is None and spec.target_for("blk.3.attn_norm.weight") is None
    assert Requant.of(None, "q5_0").target_for("token_embd.weight") == Q5_0
    assert Requant.of(None, None) is None


@pytest.mark.parametrize("tied", [False, True])
def test_load_requantized_tiny_model(tmp_path, tied):
    path = write_tiny_model(tmp_path / "q8.gguf", TinySpec(arch="qwen2", qtype=Q8_0, tied=tied,
                                                           n_vocab=64, d_model=128, d_ff=256))
    base = specdec.load(path)
    ids = list(range(1, 40, 3))
    want = base.logits(ids)                                                 # (13, 64)
    for mmap in (True, False):
        m = specdec.load(path, requant="q4_0", requant_head="q4_0", mmap=mmap)
        w = m.weights
        assert w.layers[0].wq.qtype == w.layers[1].w_down.qtype == registry.REPACKED[Q4_0]
        assert w.output.qtype == registry.REPACKED[Q4_0]
        assert w.tok_embd_type == Q8_0                                       # the lookup table stays
        if tied:
            assert w.output.w is not w.tok_embd
        got = m.logits(ids)
        assert np.isfinite(got).all()
        rel = np.linalg.norm(got - want) / np.linalg.norm(want)
        assert 0 < rel < 0.25, rel
        if mmap:
            first = got
        else:
            np.testing.assert_array_equal(got, first)                        # repacking is bit-exact
    layers_only = specdec.load(path, requant="q5_0")
    assert layers_only.weights.layers[0].w_up.qtype == registry.REPACKED[Q5_0]
    assert layers_only.weights.output.qtype in (Q8_0, registry.REPACKED[Q8_0])


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    path = write_tiny_model(tmp_path_factory.mktemp("rq") / "q8.gguf",
                            TinySpec(arch="qwen2", qtype=Q8_0, n_vocab=64, d_model=128, d_ff=256,
                                     logit_scale=3.0, seed=4))
    return specdec.load(path), specdec.load(path, requant="q4_0", requant_head="q4_0")


@settings(max_examples=10, deadline=None)
@given(prompt=st.lists(st.integers(0, 62), min_size=1, max_size=8), draft_n=st.integers(1, 8),
       vocab=st.sampled_from([None, 32, 48]), draft_p=st.sampled_from([0.0, 0.5]))
def test_greedy_speculative_with_requantized_draft_is_plain(pair, prompt, draft_n, vocab, draft_p):
    target, draft = pair
    want = target.generate(prompt, n_predict=24, ignore_eos=True)
    got = target.generate(prompt, n_predict=24, ignore_eos=True, draft=draft, draft_n=draft_n,
                          draft_p=draft_p, draft_vocab=vocab, draft_policy="fixed")
    assert got.ids == want.ids
    assert got.stats.n_drafted > 0


def test_bad_type_is_one_config_error(tmp_path):
    with pytest.raises(ConfigError, match=r"^requant must be one of q4_0, q5_0, q8_0, got 'q3_k'$"):
        specdec.load("no-such-model", requant="q3_k")
    with pytest.raises(ConfigError, match="requant_head"):
        specdec.load("no-such-model", requant_head="f16")
    with pytest.raises(ConfigError, match="--draft-quant"):
        parse_type("Q4", "--draft-quant")


@pytest.mark.parametrize("flags,needle", [
    (["-md", "x", "--draft-quant", "q3_k"], "--draft-quant must be one of"),
    (["-md", "x", "--draft-quant-head", "bf16"], "--draft-quant-head must be one of"),
    (["--quant", "int4"], "--quant must be one of"),
    (["--draft-quant", "q4_0"], "--draft-quant needs a draft model"),
])
def test_bad_quant_flags_fail_before_loading(flags, needle):
    one_line_error(cli("run", "-m", "no-such-model", *flags), needle)


def test_cli_runs_with_a_requantized_draft(tmp_path):
    path = write_tiny_model(tmp_path / "q8.gguf", TinySpec(arch="qwen2", qtype=Q8_0))
    args = ["run", "-m", path, "-p", "abc", "-n", 8, "--ignore-eos", "--temp", 0]
    plain = cli(*args)
    spec = cli(*args, "-md", path, "--draft-quant", "q4_0", "--draft-quant-head", "q4_0")
    assert plain.returncode == spec.returncode == 0, spec.stderr
    assert spec.stdout == plain.stdout


@pytest.mark.parametrize("flags,want", [
    (["-md", "d"], ("q4_0", None)),                                  # the defaults: a cheaper draft
    (["-md", "d", "--draft-quant", "none"], (None, None)),           # as stored
    (["-md", "d", "--draft-n", "5"], (None, None)),                  # llama.cpp's meaning
    (["-md", "d", "--draft-policy", "adaptive"], (None, None)),
    (["-md", "d", "--draft-quant-head", "q4_0"], (None, "q4_0")),
    (["-md", "d", "--draft-quant", "q5_0"], ("q5_0", None)),
    ([], (None, None)),
])
def test_the_defaults_requantize_the_draft_layers(flags, want):
    from specdec.frontends.cli import _quant, build_parser
    a = build_parser().parse_args(["run", "-m", "t", *flags])
    assert _quant(a, "draft") == want and _quant(a, "target") == (None, None)


@pytest.mark.parametrize("n_logits", [1, 30, 32, 61, 64])
def test_trimmed_head_of_records_is_the_first_logits(pair, n_logits):
    """A head in 8-row records (a requantized head, or any --no-mmap legacy head) cut at any
    --draft-vocab: the logits are the first n_logits of the full ones, bit for bit."""
    _, draft = pair
    assert draft.weights.output.qtype == registry.REPACKED[Q4_0]
    full = draft.session(8).eval([1, 2, 3])                                  # (3, 64)
    s = draft.session(8, n_logits=n_logits)
    got = s.eval([1, 2, 3])
    assert got.shape == (3, n_logits) and got.flags.c_contiguous
    np.testing.assert_array_equal(got, full[:, :n_logits])
    from specdec.engine.transformer import eval_batch
    a, b = draft.session(8, n_logits=n_logits), draft.session(8, n_logits=n_logits)
    for lg in eval_batch([a, b], [[1, 2, 3], [1, 2, 3]]):
        np.testing.assert_array_equal(lg, full[:, :n_logits])
