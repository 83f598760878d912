"""llama.cpp's outputs on synthetic models of every architecture specdec runs: the reference
tests/agreement/test_reference_synthetic.py compares against.

Each architecture gets a small random-weight file written by specdec.testing.synth (F32 and
Q8_0 weights; Llama 3.1 with its rope_freqs tensor), run through llama.cpp (llama-cpp-python,
the version of tests/data/reference, built natively): the logits of every position of a
fixed prompt (logits_all) and a greedy continuation with its margins.  The file itself is not
committed: the test writes it again from the same spec and checks its SHA-256 against the one
recorded here, so a changed writer is noticed instead of compared.

    python benchmarks/reference_synthetic.py [--out tests/data/reference/synthetic.json]
"""
from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import tempfile
from pathlib import Path

import numpy as np

from specdec.testing.synth import TinySpec, write_tiny_model

PROMPT = [3, 17, 4, 40, 22, 9, 9, 31, 0, 45, 12, 7, 30, 2, 44, 5, 19, 26, 8, 1]
N_GREEDY = 24
F32, Q8_0 = 0, 8
SPECS = {   # name -> TinySpec; 4 layers so that smollm3 has a layer without RoPE
    f"{arch}-{'f32' if qt == F32 else 'q8_0'}": TinySpec(arch=arch, n_layer=4, qtype=qt, seed=21, n_ctx=256, n_vocab=64,
                                                          merges=("a a",),
                                                          rope_freqs=arch == "llama")
    for arch in ("llama", "mistral3", "qwen2", "qwen3", "phi3", "smollm3", "gemma3") for qt in (F32, Q8_0)
}


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def run(path: Path) -> dict | None:
    """llama.cpp's logits over PROMPT and its greedy continuation, or None if it refuses."""
    from llama_cpp import Llama
    try:
        llm = Llama(str(path), n_ctx=128, n_threads=2, n_threads_batch=2, logits_all=True,
                    verbose=False, n_batch=64)
    except ValueError:
        return None
    llm.eval(PROMPT)
    logits = np.array(llm.scores[:len(PROMPT)], dtype=np.float64)       # (P, V)
    ids, margins = [], []
    last = logits[-1]
    for _ in range(N_GREEDY):
        top2 = np.sort(last)[-2:]
        margins.append(float(top2[1] - top2[0]))
        tok = int(np.argmax(last))
        ids.append(tok)
        llm.eval([tok])
        last = np.array(llm.scores[llm.n_tokens - 1], dtype=np.float64)
    return {"logits": np.round(logits, 5).tolist(), "greedy": ids, "margins": np.round(margins, 5).tolist()}


def main() -> None:
    import llama_cpp
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("tests/data/reference/synthetic.json"))
    a = ap.parse_args()
    records = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, spec in SPECS.items():
            path = write_tiny_model(Path(tmp) / f"{name}.gguf", spec)
            out = run(path)
            print(name, "refused by llama.cpp" if out is None else f"greedy {out['greedy'][:8]}", flush=True)
            if out is not None:
                records[name] = {"spec": dataclasses.asdict(spec), "sha256": sha256(path), **out}
    a.out.write_text(json.dumps({"llama_cpp_python": llama_cpp.__version__, "prompt": PROMPT,
                                 "n_greedy": N_GREEDY, "models": records}) + "\n")


if __name__ == "__main__":
    main()
