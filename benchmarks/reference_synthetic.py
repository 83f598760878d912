"""llama.cpp's outputs on synthetic models of every architecture specdec runs: the reference
tests/agreement/test_reference_synthetic.py compares against.

Each architecture gets a small random-weight file written by specdec.testing.synth (F32 and
Q8_0 weights; llama also in IQ4_NL, IQ4_XS and MXFP4, qwen3moe's experts in MXFP4; Llama
3.1 with its rope_freqs tensor; qwen3moe and a Mixtral-style llama file with experts, whose
router stays F32 as in real files), run through llama.cpp (llama-cpp-python,
the version of tests/data/reference, built natively): the logits of every position of a
fixed prompt (logits_all) and a greedy continuation with its margins.  The file itself is not
committed: the test writes it again from the same spec and checks its SHA-256 against the one
recorded here, and fails when they differ, so a changed writer is noticed instead of compared.

    python benchmarks/reference_synthetic.py [--out tests/data/reference/synthetic.json] [--add | --refresh]

--add keeps the records --out has and runs the specs it lacks; --refresh also runs again every
record whose file, written now, is not the one recorded (a changed writer or spec), and drops
records no spec here names.
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
MOE = {"qwen3moe": dict(arch="qwen3moe", n_expert=8, n_expert_used=3, d_ff_exp=64),   # top-3 of 8
       "mixtral": dict(arch="llama", n_expert=4, n_expert_used=2)}                     # top-2 of 4
SPECS.update({f"{name}-{'f32' if qt == F32 else 'q8_0'}": TinySpec(**kw, n_layer=4, qtype=qt, seed=21, n_ctx=256,
                                                                  n_vocab=64, merges=("a a",))
              for name, kw in MOE.items() for qt in (F32, Q8_0)})
# the 4-bit codebook formats (IQ4_XS's rows need 256 values: a wider model), and MXFP4 experts
IQ4_NL, IQ4_XS, MXFP4 = 20, 23, 39
SPECS.update({f"llama-{name}": TinySpec(arch="llama", n_layer=4, qtype=qt, seed=21, n_ctx=256, n_vocab=64,
                                        d_model=256, d_ff=512, merges=("a a",))
              for name, qt in (("iq4_nl", IQ4_NL), ("iq4_xs", IQ4_XS), ("mxfp4", MXFP4))})
SPECS["qwen3moe-mxfp4"] = TinySpec(**MOE["qwen3moe"], n_layer=4, qtype=MXFP4, seed=21, n_ctx=256, n_vocab=64,
                                   merges=("a a",))


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def run(path: Path) -> dict | None:
    """llama.cpp's logits over PROMPT and its greedy continuation, or None if it refuses."""
    import llama_cpp
    from llama_cpp import Llama
    # ggml's extra buffer types (the AMX / repacked weights of a native build) crash the
    # 0.3.36 build on these tiny Q8_0 files on an AMX host: the plain CPU buffers instead
    default = llama_cpp.llama_model_default_params

    def plain_buffers():
        params = default()
        params.use_extra_bufts = False
        return params
    llama_cpp.llama_cpp.llama_model_default_params = llama_cpp.llama_model_default_params = plain_buffers
    import llama_cpp.llama as llama_mod
    llama_mod.llama_cpp.llama_model_default_params = plain_buffers
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


def run_apart(path: Path) -> dict | None:
    """run(path) in a child process of its own (a second model in one process may crash
    llama-cpp-python's native build)."""
    import subprocess
    import sys
    code = (f"import json, sys; sys.path.insert(0, {str(Path(__file__).parent)!r}); "
            f"from reference_synthetic import run; from pathlib import Path; "
            f"print(json.dumps(run(Path({str(path)!r}))))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def _current(rec: dict, spec: TinySpec, path: Path) -> bool:
    """The record was made from this spec (a field it lacks: TinySpec's default) and this very file."""
    def fields(s: TinySpec) -> dict:
        return json.loads(json.dumps(dataclasses.asdict(s)))
    kept = TinySpec(**{k: tuple(v) if isinstance(v, list) else v for k, v in rec["spec"].items()})
    return rec["sha256"] == sha256(path) and fields(kept) == fields(spec)


def main() -> None:
    import llama_cpp
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("tests/data/reference/synthetic.json"))
    ap.add_argument("--add", action="store_true", help="keep the records --out has, run the specs it lacks")
    ap.add_argument("--refresh", action="store_true",
                    help="as --add, and run again the records whose file or spec is not the one recorded")
    a = ap.parse_args()
    keep = a.add or a.refresh
    old = json.loads(a.out.read_text()) if keep and a.out.exists() else {"models": {}}
    if keep and old.get("llama_cpp_python") not in (None, llama_cpp.__version__):
        raise SystemExit(f"{a.out} was made with llama-cpp-python {old['llama_cpp_python']}, "
                         f"this is {llama_cpp.__version__}")
    records = {n: r for n, r in old["models"].items() if n in SPECS or not a.refresh}
    with tempfile.TemporaryDirectory() as tmp:
        for name, spec in SPECS.items():
            path = write_tiny_model(Path(tmp) / f"{name}.gguf", spec)
            rec = records.pop(name, None)
            if rec is not None and (not a.refresh or _current(rec, spec, path)):
                records[name] = rec
                continue
            out = run_apart(path)
            print(name, "refused by llama.cpp" if out is None else f"greedy {out['greedy'][:8]}", flush=True)
            if out is not None:
                records[name] = {"spec": dataclasses.asdict(spec), "sha256": sha256(path), **out}
    a.out.write_text(json.dumps({"llama_cpp_python": llama_cpp.__version__, "prompt": PROMPT,
                                 "n_greedy": N_GREEDY, "models": records}) + "\n")


if __name__ == "__main__":
    main()
