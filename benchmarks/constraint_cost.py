"""What a constraint costs per token on a real vocabulary: the tokenizer build, and the mask
computed at every position of a valid output (then applied to the logits), for llguidance
(specdec's choice, generation/constraint.py) and, when installed, outlines-core and xgrammar.

    python benchmarks/constraint_cost.py --out benchmarks/results/intel/constraint_cost.json

Writes the JSON --out names (machine record included; the run kept is
benchmarks/results/intel/constraint_cost.json).  The outputs are
fixed texts that fit their constraints, tokenized by the engine; every position's mask is
timed (median, p99, max) as the decode loop computes it.
"""
from __future__ import annotations

import argparse
import json
import time

import numpy as np

from common import QWEN_TARGET, machine_info, write_json
from specdec.engine.gguf_file import GGUFFile
from specdec.generation.constraint import ConstraintSpec, _Encode, compile_constraint, ll_tokenizer, masked
from specdec.models import hub
from specdec.text.tokenizer import Tokenizer

SCHEMA = {"type": "object", "properties": {
    "name": {"type": "string"}, "age": {"type": "integer"},
    "email": {"type": "string"}, "tags": {"type": "array", "items": {"type": "string"}},
    "address": {"type": "object", "properties": {"city": {"type": "string"}, "zip": {"type": "string"}},
                "required": ["city", "zip"]}},
    "required": ["name", "age", "email", "tags", "address"], "additionalProperties": False}
ANSWER = json.dumps({"name": "Ada Lovelace", "age": 36, "email": "ada@example.org",
                     "tags": ["math", "poetry", "engines"], "address": {"city": "London", "zip": "W1"}})
GBNF = 'root ::= "Answer: " ("yes" | "no") ", because " [a-z ]+ "."'
CASES = [("json_schema", json.dumps(SCHEMA), ANSWER),
         ("json_object", "", ANSWER),
         ("gbnf", GBNF, "Answer: yes, because the sky is blue."),
         ("regex", r"[0-9]{3}-[0-9]{4} [A-Z][a-z]+", "555-1234 Smith")]


def _stats(xs: list[float]) -> dict:
    a = np.asarray(xs) * 1e3
    return {"median_ms": float(np.median(a)), "p99_ms": float(np.percentile(a, 99)),
            "max_ms": float(a.max()), "mean_ms": float(a.mean()), "n": int(a.size)}


def llguidance_case(tok, n_vocab: int, kind: str, source: str, text: str) -> dict:
    spec = ConstraintSpec(kind, source)
    t0 = time.perf_counter()
    c = compile_constraint(spec, tok, n_vocab)
    compile_s = time.perf_counter() - t0
    ids = tok.encode(text, special=False, bos=False, eos=False)
    logits = np.random.default_rng(0).standard_normal(n_vocab).astype(np.float32)
    mask_t, apply_t, ff = [], [], 0
    for x in ids:
        t = time.perf_counter()
        m = c.mask()
        mask_t.append(time.perf_counter() - t)
        t = time.perf_counter()
        masked(logits, m)
        apply_t.append(time.perf_counter() - t)
        ff += len(c.forced())
        if not m[x]:
            raise SystemExit(f"{kind}: token {x} of the fixed answer is masked")
        c.advance(x)
    return {"kind": kind, "n_tokens": len(ids), "compile_s": compile_s, "mask": _stats(mask_t),
            "apply": _stats(apply_t), "forced_tokens_seen": ff}


def outlines_case(tok, n_vocab: int, source: str, text: str) -> dict | None:
    try:
        from outlines_core import Guide, Index, Vocabulary
        from outlines_core.json_schema import build_regex_from_schema
    except ImportError:
        return None
    enc = _Encode(tok, n_vocab)
    eos = enc.eos_token_id
    vocab_map: dict = {}
    for i, p in enumerate(enc.tokens):
        if p and not p.startswith(b"\xff") and i != eos:
            vocab_map.setdefault(p, []).append(i)
    t0 = time.perf_counter()
    vocab = Vocabulary(eos, vocab_map)
    vocab_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    index = Index(build_regex_from_schema(source), vocab)
    index_s = time.perf_counter() - t0
    guide = Guide(index)
    ids = tok.encode(text, special=False, bos=False, eos=False)
    mask_t = []
    for x in ids:
        t = time.perf_counter()
        allowed = guide.get_tokens()
        m = np.zeros(n_vocab, bool)
        m[allowed] = True
        mask_t.append(time.perf_counter() - t)
        guide.advance(x)
    return {"vocabulary_s": vocab_s, "index_s": index_s, "mask": _stats(mask_t)}


def xgrammar_case(tok, n_vocab: int, source: str, text: str) -> dict | None:
    try:
        import xgrammar as xgr
    except ImportError:
        return None
    enc = _Encode(tok, n_vocab)
    t0 = time.perf_counter()
    info = xgr.TokenizerInfo([p.decode("utf-8", errors="replace") if not p.startswith(b"\xff") else p[1:].decode()
                              for p in enc.tokens], vocab_type=xgr.VocabType.BYTE_LEVEL,
                             vocab_size=n_vocab, stop_token_ids=sorted(tok.eog_ids))
    compiler = xgr.GrammarCompiler(info)
    build_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    compiled = compiler.compile_json_schema(source)
    compile_s = time.perf_counter() - t0
    matcher = xgr.GrammarMatcher(compiled)
    bitmask = xgr.allocate_token_bitmask(1, n_vocab)
    ids = tok.encode(text, special=False, bos=False, eos=False)
    mask_t = []
    for x in ids:
        t = time.perf_counter()
        matcher.fill_next_token_bitmask(bitmask)
        mask_t.append(time.perf_counter() - t)
        matcher.accept_token(x)
    return {"tokenizer_s": build_s, "compile_s": compile_s, "mask": _stats(mask_t)}


def _bounded(fn, tok, n_vocab: int, limit: float) -> dict | None:
    """fn's result, run in a child process given `limit` seconds (an index build can take
    minutes on a 151k vocabulary); an error or the time-out is recorded as such."""
    import multiprocessing as mp
    ctx = mp.get_context("fork")
    q = ctx.Queue()

    def child():
        try:
            q.put(fn(tok, n_vocab, json.dumps(SCHEMA), ANSWER))
        except Exception as e:
            q.put({"error": " ".join(str(e).split())[:300]})
    proc = ctx.Process(target=child)
    t0 = time.perf_counter()
    proc.start()
    proc.join(limit)
    if proc.is_alive():
        proc.kill()
        proc.join()
        return {"error": f"not done after {limit:.0f} s (vocabulary and index build)"}
    return q.get() if not q.empty() else {"error": f"exit code {proc.exitcode} after {time.perf_counter() - t0:.1f} s"}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=QWEN_TARGET)
    ap.add_argument("--out", default="bench-results/constraint_cost.json")
    ap.add_argument("--limit", type=float, default=150.0, help="seconds each other library is given")
    a = ap.parse_args()
    path = hub.resolve(a.model, download=False, progress=False)
    gguf = GGUFFile(path, mmap=True)
    n_vocab = int(gguf.tensors["token_embd.weight"].dims[-1])
    tok = Tokenizer.from_metadata(gguf.metadata, path)
    t0 = time.perf_counter()
    ll_tokenizer(tok, n_vocab)
    build_s = time.perf_counter() - t0
    res = {"machine": machine_info(), "model": a.model, "n_vocab": n_vocab,
           "llguidance": {"tokenizer_build_s": build_s,
                          "cases": [llguidance_case(tok, n_vocab, *case) for case in CASES]}}
    for name, fn in (("outlines_core", outlines_case), ("xgrammar", xgrammar_case)):
        res[name] = _bounded(fn, tok, n_vocab, a.limit)
    write_json(a.out, res)
    print(json.dumps(res, indent=1)[:4000])


if __name__ == "__main__":
    main()
