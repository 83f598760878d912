"""Helpers that several test modules share: the real models' paths and llama.cpp reference
records, the pair factories' parametrization, sampling strategies, the target's exact output
law, a list trace, and the kernel tests' weight generators and float-sum emulation.

p is always the target's distribution, q the draft's.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import strategies as st

import gguf

from fakes import PAIR_FACTORIES
from specdec.kernels import formats, reference
from specdec.testing.synth import quantize_iq4
from specdec.generation.sampling import SamplerParams, probs
from specdec.speculation.trace import StepRecord

T = gguf.GGMLQuantizationType

REFERENCE = Path(__file__).parent / "data" / "reference"
RECORDS = [json.loads(line) for line in open(REFERENCE / "llamacpp.jsonl", encoding="utf-8")]
MARGIN = 0.5             # greedy ids must match llama.cpp's up to its first top-2 margin below this


def real_model_path(model_id: str) -> Path:
    from specdec.models import hub
    if os.environ.get("SPECDEC_OFFLINE") == "1":
        try:
            return hub.resolve(model_id, download=False)
        except Exception:
            pytest.skip(f"{model_id} not in the model cache (SPECDEC_OFFLINE=1)")
    return hub.resolve(model_id, download=True, progress=False)


def greedy_records(model_id: str) -> list[dict]:
    return [r for r in RECORDS if r["kind"] == "greedy" and r["model"] == model_id]


def first_low_margin(margins) -> int:
    return next((i for i, m in enumerate(margins) if m < MARGIN), len(margins))


def perplexity(m, tokens: list[int], n_ctx: int, chunks: int) -> float:
    """llama-perplexity: chunk, BOS in place of each chunk's first token when the model adds
    BOS, score positions n_ctx/2 .. n_ctx-2 against the next token."""
    nll, count = 0.0, 0
    for c in range(chunks):
        chunk = list(tokens[c * n_ctx:(c + 1) * n_ctx])
        if m.tokenizer.add_bos:
            chunk[0] = m.tokenizer.bos_id
        logits = m.logits(chunk).astype(np.float64)                  # (n_ctx, V)
        for j in range(n_ctx // 2, n_ctx - 1):
            row = logits[j]
            mx = row.max()
            lse = mx + np.log(np.exp(row - mx).sum())
            nll += lse - row[chunk[j + 1]]
            count += 1
    return float(np.exp(nll / count))


factories = pytest.mark.parametrize("factory", list(PAIR_FACTORIES.values()), ids=list(PAIR_FACTORIES))


class ListTrace:
    def __init__(self, check=None):
        self.records: list[StepRecord] = []
        self.check = check

    def write(self, record: StepRecord) -> None:
        self.records.append(record)
        if self.check:
            self.check(record)


def target_law(session, prompt, n_predict, params, eog):
    """{(ids, stop_reason): probability} of sampling the target alone, from its logits."""
    law: dict = {}

    def rec(prefix, pr):
        if len(prefix) == n_predict:
            law[(tuple(prefix), "n_predict")] = law.get((tuple(prefix), "n_predict"), 0.0) + pr
            return
        session.reset()
        p = probs(session.eval(list(prompt) + prefix)[-1], params)       # (V,)
        for y in np.flatnonzero(p):
            if int(y) in eog:
                key = (tuple(prefix), "eog")
                law[key] = law.get(key, 0.0) + pr * p[y]
            else:
                rec(prefix + [int(y)], pr * p[y])
    rec([], 1.0)
    return law


sampling_params = st.builds(
    SamplerParams, temperature=st.floats(0.7, 1.5),
    top_k=st.sampled_from([0, 0, 2, 3]), top_p=st.sampled_from([1.0, 1.0, 0.7, 0.9]),
    min_p=st.sampled_from([0.0, 0.0, 0.05, 0.2]))


# ---- kernel tests -----------------------------------------------------------------------------

FLOATS = [T.F32, T.F16, T.BF16]
# byte layout of a 32-block: (fp16 fields, offset of qh or None, offset of qs, code offset)
LAYOUT = reference.LEGACY_LAYOUT
F16_FIELDS = {T.Q2_K: (80, 82), T.Q3_K: (108,), T.Q4_K: (0, 2), T.Q5_K: (0, 2), T.Q6_K: (208,)}

def make_weights(qt, n: int, k: int, rng: np.random.Generator, raw: bool) -> np.ndarray:
    """Weights as GGUFReader holds them: F32 float32 (n, k), F16 float16 (n, k), else uint8.

    raw=False quantizes normal values with gguf; raw=True draws random bytes (every code,
    Q8_0's -128 included) with finite fp16 scales / mins in ±[1e-3, 1].
    """
    if qt in FLOATS or not raw:
        vals = (rng.standard_normal((n, k)) * rng.uniform(0.1, 3.0)).astype(np.float32)
        if qt in (T.IQ4_NL, T.IQ4_XS):                       # gguf.quants has no quantizer for them
            return quantize_iq4(vals, T(qt))
        return vals.astype(np.float16) if qt == T.F16 else gguf.quants.quantize(vals, qt)
    bb = formats.FORMATS[int(qt)].type_size
    w = rng.integers(0, 256, (n, k // 32, bb), dtype=np.uint8)
    for o in LAYOUT[qt][0]:
        h = (rng.uniform(1e-3, 1.0, (n, k // 32)) * rng.choice([-1, 1], (n, k // 32)))
        w[:, :, o:o + 2] = h.astype(np.float16).view(np.uint8).reshape(n, k // 32, 2)
    return w.reshape(n, -1)


def random_weights(rng, qtype, n: int, nb: int, f16=None) -> np.ndarray:
    """uint8 (n, nb·block_bytes): random bytes; the fp16 fields get ``f16`` (an fp16 value)
    or random finite halves (zero, subnormal and normal, either sign, |v| < 1)."""
    w = rng.integers(0, 256, (n, nb, formats.FORMATS[int(qtype)].type_size), dtype=np.uint8)
    for o in F16_FIELDS[qtype]:
        if f16 is None:
            bits = (rng.integers(0, 2, (n, nb)) << 15) | (rng.integers(0, 15, (n, nb)) << 10) \
                | rng.integers(0, 1024, (n, nb))
            h = bits.astype(np.uint16)
        else:
            h = np.full((n, nb), np.float16(f16)).view(np.uint16)
        w[:, :, o:o + 2] = h.view(np.uint8).reshape(n, nb, 2)
    return w.reshape(n, -1)


def widen(w: np.ndarray, qt) -> np.ndarray:
    """Float-format weights -> exact float32 (n, k)."""
    if qt == T.BF16:
        return (w.view(np.uint16).astype(np.uint32) << 16).view(np.float32)
    return w.astype(np.float32)


def emulate_float(w: np.ndarray, qt, x: np.ndarray) -> np.ndarray:
    """kernels/reference.float_dot of float-format weights (widened exactly)."""
    return reference.float_dot(widen(w, qt), x)


# the CLI as a user runs it, and the one-line error contract (exit 2, no traceback)
def cli(*args, merge=False, stdin=None, env=None, timeout=240):
    return subprocess.run([sys.executable, "-m", "specdec.frontends.cli", *map(str, args)], input=stdin,
                          capture_output=not merge, stdout=subprocess.PIPE if merge else None,
                          stderr=subprocess.STDOUT if merge else None, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})})


def one_line_error(r, *needles):
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    assert "Traceback" not in r.stderr
    errors = [line for line in r.stderr.splitlines() if line.startswith("specdec: error:")]
    assert len(errors) == 1, r.stderr
    for n in needles:
        assert n in errors[0], (n, errors[0])


def assert_rows_independent(matmul, w: np.ndarray, x: np.ndarray, rng: np.random.Generator) -> None:
    """matmul(w, x, out) over all of x's rows: rows 0, 7 and the last equal the row alone
    (M = 1) bit for bit, and row 0 stays the same whatever the other rows hold."""
    n = w.shape[0]
    out = np.empty((x.shape[0], n), np.float32)
    matmul(w, x, out)
    for i in (0, 7, x.shape[0] - 1):
        alone = np.empty((1, n), np.float32)
        matmul(w, x[i:i + 1], alone)
        assert np.array_equal(out[i].view(np.uint32), alone[0].view(np.uint32)), i
    x2 = x.copy()
    x2[1:] = rng.standard_normal(x2[1:].shape).astype(np.float32) * 100
    out2 = np.empty_like(out)
    matmul(w, x2, out2)
    assert np.array_equal(out[0].view(np.uint32), out2[0].view(np.uint32))
