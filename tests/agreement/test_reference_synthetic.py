"""Agreement with llama.cpp on synthetic models of every architecture specdec runs (llama with
Llama 3.1's rope_freqs, qwen2, qwen3, phi3, smollm3, gemma3, and the mixtures of experts:
qwen3moe top-3 of 8, a Mixtral-style llama file top-2 of 4; F32 and Q8_0 weights).

tests/data/reference/synthetic.json holds what llama.cpp (llama-cpp-python 0.3.36, built
natively) computed on files written by specdec.testing.synth from the specs recorded there
(benchmarks/reference_synthetic.py): the logits of every position of a 20-token prompt and a
24-token greedy continuation with its margins.  The test writes each file again and checks its
SHA-256 against the recorded one: a different writer or NumPy stream would compare other weights,
so a file that differs fails its cases, naming the command that runs llama.cpp on the new files
(`python benchmarks/reference_synthetic.py --refresh`); the records must also be exactly the
specs that script holds.  Then it compares:

- logits: max |ours - llama.cpp| over all positions and tokens <= LOGIT_BOUND[weights].  The
  bounds are calibrated as agreement/test_reference.py's are, from the measured gaps times ~4 (logits
  span about ±3.5): F32 files 0.0005-0.0014 (llama.cpp keeps K and V in fp16; summation
  order), Q8_0 files 0.034-0.066 (mean 0.006-0.013: both round the matmul inputs to Q8_0, a
  code here and there lands on the other side; gemma3 keeps float activations here).  A rule
  broken moves them further (BROKEN in docs/architecture.md, "Architectures");
- greedy: the same tokens up to the first step where llama.cpp's margin is below
  MARGIN (a different rounding may legitimately pick the other token there);
- experts: a router whose k-th and (k+1)-th logits are closer than ROUTE_MARGIN may pick
  the other expert under another rounding (the Q8_0 files' router inputs differ by ~0.01):
  those positions are left out of the logit bound, and there may be at most MAX_AMBIGUOUS.
  Measured: qwen3moe F32 0.0013, Q8_0 0.097 over 17 positions (3 left out, margins 0.002-
  0.0085; at one of them, margin 0.0085 in layer 1, llama.cpp woke the other expert: 0.66
  apart); Mixtral-style F32 0.0014, Q8_0 0.050 (none left out).
- the 4-bit codebook formats (llama, 256 wide; qwen3moe's experts in MXFP4): measured max
  |Δlogit| IQ4_NL 0.058, IQ4_XS 0.077, MXFP4 0.051, qwen3moe MXFP4 0.060 (means 0.010-0.018,
  like Q8_0's: the same Q8_0 / Q8_K rounding of the matmul inputs); IQ4_XS's first greedy step
  has a margin of 0.070, within its gap: its greedy comparison stops below 0.15.
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest

from specdec.testing.synth import TinySpec, write_tiny_model
from written_files import model_or_fail, route_margins, written_models

DATA = Path(__file__).parents[1] / "data" / "reference" / "synthetic.json"
WRITER = Path(__file__).parents[2] / "benchmarks" / "reference_synthetic.py"
STALE = ("{name}: the file specdec.testing.synth writes here differs from the one llama.cpp ran "
         "(SHA-256 {got} against {want}): run `python benchmarks/reference_synthetic.py --refresh` "
         "(llama-cpp-python {version}) and commit tests/data/reference/synthetic.json")
REF = json.loads(DATA.read_text())
LOGIT_BOUND = {"f32": 0.005, "q8_0": 0.25, "iq4_nl": 0.25, "iq4_xs": 0.3, "mxfp4": 0.25}
MARGIN = {"iq4_xs": 0.15}             # else 0.05: a step with a smaller margin may pick the other token
ROUTE_MARGIN = {"f32": 0.0, "q8_0": 0.01, "mxfp4": 0.01}
MAX_AMBIGUOUS = 5                     # of the 20 positions


def _spec(fields: dict) -> TinySpec:
    return TinySpec(**{k: tuple(v) if isinstance(v, list) else v for k, v in fields.items()})


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    stale = STALE.replace("{version}", REF["llama_cpp_python"])
    return written_models(tmp_path_factory.mktemp("synthetic"), REF["models"],
                          lambda path, spec: write_tiny_model(path, TinySpec(**spec)), stale)


def test_a_file_that_differs_fails_rather_than_skips(tmp_path):
    """The stale path itself: a record whose SHA-256 is not the written file's is a failure
    naming the command that refreshes it."""
    name, rec = next(iter(REF["models"].items()))
    path = write_tiny_model(tmp_path / "x.gguf", _spec({**rec["spec"], "seed": rec["spec"]["seed"] + 1}))
    assert hashlib.sha256(path.read_bytes()).hexdigest() != rec["sha256"]
    stale = STALE.format(name=name, got="0" * 12, want=rec["sha256"][:12], version=REF["llama_cpp_python"])
    with pytest.raises(pytest.fail.Exception, match="reference_synthetic.py --refresh"):
        model_or_fail({name: stale}, name)


def test_the_records_are_the_writers_specs():
    """Every spec benchmarks/reference_synthetic.py writes has its record, and no other: a spec
    added or changed there without running llama.cpp on it fails here."""
    import dataclasses
    import importlib.util
    load = importlib.util.spec_from_file_location("reference_synthetic", WRITER)
    writer = importlib.util.module_from_spec(load)
    load.loader.exec_module(writer)
    def fields(spec: TinySpec) -> dict:            # a field a record lacks is TinySpec's default
        return json.loads(json.dumps(dataclasses.asdict(spec)))
    specs = {name: fields(s) for name, s in writer.SPECS.items()}
    recorded = {name: fields(_spec(rec["spec"])) for name, rec in REF["models"].items()}
    assert specs == recorded, ("tests/data/reference/synthetic.json is not benchmarks/reference_synthetic.py's "
                               "SPECS: run `python benchmarks/reference_synthetic.py --refresh`")
    assert REF["prompt"] == writer.PROMPT and REF["n_greedy"] == writer.N_GREEDY


@pytest.mark.parametrize("name", sorted(REF["models"]))
def test_logits_and_greedy_agree_with_llamacpp(models, name, monkeypatch):
    rec, m = REF["models"][name], model_or_fail(models, name)
    prompt = REF["prompt"]
    weights = name.rsplit("-", 1)[1]
    ours = m.session(128).eval(prompt).astype(np.float64)
    ref = np.array(rec["logits"])
    if rec["spec"].get("n_expert"):
        clear = route_margins(m, prompt, monkeypatch) >= ROUTE_MARGIN[weights]
        assert (~clear).sum() <= MAX_AMBIGUOUS, f"{name}: {(~clear).sum()} positions route ambiguously"
        ours, ref = ours[clear], ref[clear]
    gap = np.abs(ours - ref).max()
    bound = LOGIT_BOUND[weights]
    assert gap <= bound, f"{name}: max |Δlogit| {gap:.4g} > {bound}"
    got = m.generate(prompt, n_predict=len(rec["greedy"]), temperature=0.0, ignore_eos=True).ids
    for i, (a, b, margin) in enumerate(zip(got, rec["greedy"], rec["margins"])):
        if margin < MARGIN.get(weights, 0.05):
            break
        assert a == b, f"{name}: greedy step {i}: {a} vs llama.cpp's {b} (margin {margin:.3f})"


def test_every_architecture_is_covered():
    archs = {rec["spec"]["arch"] for rec in REF["models"].values()}
    assert archs == {"llama", "mistral3", "qwen2", "qwen3", "phi3", "smollm3", "gemma3", "qwen3moe"}
    assert any(rec["spec"].get("rope_freqs") for rec in REF["models"].values())
    moe = {rec["spec"]["arch"] for rec in REF["models"].values() if rec["spec"].get("n_expert")}
    assert moe == {"llama", "qwen3moe"}


def _softmax_after_topk(logits, k, norm, scale):
    """The top k router logits, then a softmax over those k (no renormalisation needed)."""
    ids = np.argsort(-logits, axis=1, kind="stable")[:, :k]
    top = np.take_along_axis(logits, ids, 1).astype(np.float64)
    w = np.exp(top - top.max(1, keepdims=True))
    return ids, (w / w.sum(1, keepdims=True) * scale).astype(np.float32)


@pytest.mark.parametrize("name", sorted(n for n, r in REF["models"].items()
                                        if r["spec"].get("n_expert") and n.endswith("-f32")))
def test_a_routing_rule_broken_lands_outside_the_bound(models, name, monkeypatch):
    """F32 MoE files: without renormalising the top-k weights the logits leave LOGIT_BOUND
    (measured: qwen3moe 1.10, Mixtral-style 0.78); a softmax over the top-k logits is the
    renormalised softmax itself, so it stays inside (the same law, another rounding)."""
    import specdec.engine.moe as moe_mod
    m, ref = model_or_fail(models, name), np.array(REF["models"][name]["logits"])
    real = moe_mod.route

    def gap(route) -> float:
        monkeypatch.setattr(moe_mod, "route", route)
        out = m.session(128).eval(REF["prompt"]).astype(np.float64)
        monkeypatch.setattr(moe_mod, "route", real)
        return float(np.abs(out - ref).max())
    assert gap(lambda lg, k, norm, s: real(lg, k, False, s)) > 10 * LOGIT_BOUND["f32"]
    assert gap(_softmax_after_topk) <= LOGIT_BOUND["f32"]
