"""llama.cpp's outputs on synthetic qwen35 files (Gated DeltaNet + gated attention, with and
without the MTP block's nextn tensors, F32 and Q8_0 weights): the reference
tests/agreement/test_reference_qwen35.py compares against.

Each file is written by specdec.testing.synth_qwen35 and run through llama.cpp
(llama-cpp-python, the version recorded, built natively): the logits of every position of
a fixed prompt evaluated in one call (logits_all), then a greedy continuation fed one token
per call, with the logits after each.  The file is not committed: the test writes it again
and checks its SHA-256 against the one recorded here.

    python benchmarks/reference_qwen35.py [--out tests/data/reference/qwen35_synthetic.json]
"""
from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

from specdec.testing.synth_qwen35 import Qwen35Spec, write_qwen35_model

PROMPT = [3, 17, 4, 40, 22, 9, 9, 31, 0, 45, 12, 7, 30, 2, 44, 5, 19, 26, 8, 1]
N_CONTINUE = 24
F32, Q8_0 = 0, 8
# 8 layers: two attention layers (3, 7) among six recurrent ones
SPECS = {f"qwen35-{'f32' if qt == F32 else 'q8_0'}{'-nextn' if nextn else ''}":
         Qwen35Spec(n_layer=8, qtype=qt, seed=21, n_ctx=256, n_vocab=64, merges=("a a",), nextn=nextn)
         for qt in (F32, Q8_0) for nextn in (False, True)}
# qwen35moe: top-3 of 8 experts (F32 router) and the gated shared expert
SPECS.update({f"qwen35moe-{'f32' if qt == F32 else 'q8_0'}{'-nextn' if nextn else ''}":
              Qwen35Spec(n_layer=8, qtype=qt, seed=21, n_ctx=256, n_vocab=64, merges=("a a",), nextn=nextn,
                         n_expert=8, n_expert_used=3, d_ff_exp=64)
              for qt in (F32, Q8_0) for nextn in (False, True)})


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def run(path: Path) -> dict:
    """llama.cpp's logits over PROMPT (one call), then N_CONTINUE greedy tokens one per call;
    and (logits_whole) the logits of PROMPT + the continuation evaluated again in one call."""
    import llama_cpp
    import llama_cpp.llama as llama_mod
    from llama_cpp import Llama
    default = llama_cpp.llama_model_default_params

    def plain_buffers():           # the plain CPU buffers (as reference_synthetic.py)
        params = default()
        params.use_extra_bufts = False
        return params
    llama_cpp.llama_cpp.llama_model_default_params = llama_cpp.llama_model_default_params = plain_buffers
    llama_mod.llama_cpp.llama_model_default_params = plain_buffers
    llm = Llama(str(path), n_ctx=128, n_threads=2, n_threads_batch=2, logits_all=True, verbose=False, n_batch=64)
    llm.eval(PROMPT)
    rows = [np.array(r, np.float64) for r in llm.scores[:len(PROMPT)]]
    ids = []
    for _ in range(N_CONTINUE):
        tok = int(np.argmax(rows[-1]))
        ids.append(tok)
        llm.eval([tok])
        rows.append(np.array(llm.scores[llm.n_tokens - 1], np.float64))
    llm._ctx.kv_cache_seq_rm(-1, 0, -1)                          # the whole sequence: allowed
    llm.n_tokens = 0
    llm.eval(PROMPT + ids)
    whole = np.array(llm.scores[:len(PROMPT) + len(ids)], np.float64)
    return {"logits": np.round(np.array(rows), 5).tolist(), "continuation": ids,
            "logits_whole": np.round(whole, 5).tolist()}


def run_apart(path: Path) -> dict:
    """run(path) in a child process of its own."""
    code = (f"import json, sys; sys.path.insert(0, {str(Path(__file__).parent)!r}); "
            f"from reference_qwen35 import run; from pathlib import Path; "
            f"print(json.dumps(run(Path({str(path)!r}))))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    import llama_cpp
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("tests/data/reference/qwen35_synthetic.json"))
    a = ap.parse_args()
    records = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, spec in SPECS.items():
            path = write_qwen35_model(Path(tmp) / f"{name}.gguf", spec)
            out = run_apart(path)
            print(name, "continuation", out["continuation"][:8], flush=True)
            records[name] = {"spec": dataclasses.asdict(spec), "sha256": sha256(path), **out}
    a.out.write_text(json.dumps({"llama_cpp_python": llama_cpp.__version__, "prompt": PROMPT,
                                 "models": records}) + "\n")


if __name__ == "__main__":
    main()
