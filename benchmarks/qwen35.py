"""A Qwen3.5-2B-shaped qwen35 file (random Q4_K weights, the MTP block's nextn tensors) timed
beside llama.cpp in the same run: decode tokens/s, prompt tokens/s, the verification curve
M = 1..9, and the MTP block's one-row step beside a target pass.

The file has Qwen3.5-2B's shape: 24 layers (gated attention at every 4th), width 2048, FFN
6144, 8 query heads and 2 key/value heads of 256 (64 dims rotated, interleaved M-RoPE
sections 11/11/10), Gated DeltaNet layers of 16 key and 16 value heads of 128, conv kernel 4,
a 248,320-id vocabulary, the head tied to the embedding; every matrix Q4_K (ssm_conv1d F32).
Random weights: the timings are real, the text and any acceptance rate are not, so none is
claimed.  It is written once to --file and reused.

llama.cpp (llama-cpp-python, as specdec.models.llamacpp): its hybrid memory cannot drop the
last rows of a recurrent state (a partial seq_rm fails), so each timed verification pass of
M rows starts from a cache rebuilt by evaluating the n_past context again (not timed).

    python benchmarks/qwen35.py [--file ~/.cache/specdec/qwen35-2b-shape-q4_k.gguf]
                                [--out benchmarks/results/zen5/qwen35.json] [--tiny]
--tiny: a small file of the same layout (checks that the script runs; not a measurement).
"""
from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import numpy as np

import specdec
from specdec.engine.kv_cache import KVCache
from specdec.engine.qwen35 import mtp_forward
from specdec.testing.synth_qwen35 import Qwen35Spec, write_qwen35_model
from common import machine_info, prompt_ids, write_json

Q4_K = 12
SHAPE_2B = Qwen35Spec(n_vocab=248320, d_model=2048, n_layer=24, n_head=8, n_head_kv=2, d_head=256, d_ff=6144,
                      rope_dim=64, rope_sections=(11, 11, 10, 0), conv_kernel=4, n_k_heads=16, n_v_heads=16,
                      d_state=128, interval=4, qtype=Q4_K, seed=35, nextn=True, tied=True, n_ctx=4096,
                      merges=("a a",))
TINY = Qwen35Spec(n_vocab=2048, d_model=256, n_layer=4, n_head=4, n_head_kv=2, d_head=64, d_ff=512, rope_dim=16,
                  rope_sections=(3, 3, 2, 0), n_k_heads=2, n_v_heads=4, d_state=64, qtype=Q4_K, seed=35,
                  nextn=True, tied=True, n_ctx=1024, merges=("a a",))


def ours(path: Path, pp: int, n_tg: int, ms, n_past: int, repeats: int) -> dict:
    """specdec on the file: pp and tg tokens/s (best of repeats), {M: median ms} of a pass of
    M rows after n_past and of its rollback to M // 2 rows (the recurrent state's replay), and
    the MTP block's one-row step (full head) in ms."""
    m = specdec.load(path, n_ctx=max(pp, n_past + max(ms)) + n_tg + 8)
    s = m.session()
    s.eval(prompt_ids(8))
    s.eval([9])
    s.eval(prompt_ids(3))                                        # compile / warm every pass kind
    pp_best, tg_best = 0.0, 0.0
    for _ in range(repeats):
        s.reset()
        t = time.perf_counter()
        s.eval(prompt_ids(pp), last_only=True)
        pp_best = max(pp_best, pp / (time.perf_counter() - t))
        s.reset()
        s.eval(prompt_ids(min(pp, 128)), last_only=True)        # the decode's context (not timed)
        t = time.perf_counter()
        for i in range(n_tg):
            s.eval([prompt_ids(n_tg)[i]])
        tg_best = max(tg_best, n_tg / (time.perf_counter() - t))
    curve, rollback = {}, {}
    s.reset()
    s.eval(prompt_ids(n_past), last_only=True)
    for mm in ms:
        times, back = [], []
        for _ in range(repeats):
            t = time.perf_counter()
            s.eval(prompt_ids(mm))
            times.append(time.perf_counter() - t)
            t = time.perf_counter()
            s.truncate(n_past + mm // 2)                         # a rejection half way: the replay
            back.append(time.perf_counter() - t)
            s.truncate(n_past)
        curve[mm] = float(np.median(times) * 1e3)
        rollback[mm] = float(np.median(back) * 1e3)
    mtp_ms = None
    if m.weights.mtp is not None:
        cfg = m.config
        cache = KVCache(1, cfg.n_head_kv, n_past + 8, cfg.d_head)
        hid = np.ones((1, cfg.d_model), np.float32)
        mtp_forward(cfg, m.weights.mtp, cache, np.array([5]), hid, 0)
        times = []
        for i in range(repeats * 3):
            t = time.perf_counter()
            mtp_forward(cfg, m.weights.mtp, cache, np.array([5 + i]), hid, 1 + i)
            times.append(time.perf_counter() - t)
        mtp_ms = float(np.median(times) * 1e3)
    return {"pp_tok_s": round(pp_best, 2), "tg_tok_s": round(tg_best, 2),
            "verify_ms": {str(k): round(v, 2) for k, v in curve.items()},
            "rollback_ms": {str(k): round(v, 3) for k, v in rollback.items()},
            "mtp_step_ms_full_head": None if mtp_ms is None else round(mtp_ms, 2)}


def llamacpp(path: Path, pp: int, n_tg: int, ms, n_past: int, repeats: int) -> dict | None:
    """llama.cpp on the same file (None without llama-cpp-python or if it refuses the file)."""
    try:
        from llama_cpp import Llama
    except ImportError:
        return None
    threads = os.cpu_count() or 1
    try:
        llm = Llama(str(path), n_ctx=max(pp, n_past + max(ms)) + n_tg + 8, n_threads=threads,
                    n_threads_batch=threads, n_batch=512, logits_all=True, verbose=False)
    except ValueError:
        return None

    def restart(ids):
        llm._ctx.kv_cache_seq_rm(-1, 0, -1)                       # a whole sequence: allowed
        llm.n_tokens = 0
        if ids:
            llm.eval(ids)
    restart(prompt_ids(8))
    llm.eval([9])
    llm.eval(prompt_ids(3))                                      # warm every pass kind (graphs)
    pp_best, tg_best = 0.0, 0.0
    for _ in range(repeats):
        restart([])
        t = time.perf_counter()
        llm.eval(prompt_ids(pp))
        pp_best = max(pp_best, pp / (time.perf_counter() - t))
        restart(prompt_ids(min(pp, 128)))
        t = time.perf_counter()
        for i in range(n_tg):
            llm.eval([prompt_ids(n_tg)[i]])
        tg_best = max(tg_best, n_tg / (time.perf_counter() - t))
    curve = {}
    for mm in ms:
        times = []
        for _ in range(repeats):
            restart(prompt_ids(n_past))
            t = time.perf_counter()
            llm.eval(prompt_ids(mm))
            times.append(time.perf_counter() - t)
        curve[mm] = float(np.median(times) * 1e3)
    return {"pp_tok_s": round(pp_best, 2), "tg_tok_s": round(tg_best, 2),
            "verify_ms": {str(k): round(v, 2) for k, v in curve.items()}}


def model_file(file: Path, tiny: bool):
    """(spec, path) of the 2B-shaped file (or --tiny's), written once where it is missing."""
    spec = TINY if tiny else SHAPE_2B
    path = file.with_name(file.stem + "-tiny.gguf") if tiny else file
    if not path.exists():
        print(f"writing {path} ...", flush=True)
        path.parent.mkdir(parents=True, exist_ok=True)
        write_qwen35_model(path, spec)
    return spec, path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--file", type=Path, default=Path.home() / ".cache" / "specdec" / "qwen35-2b-shape-q4_k.gguf")
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results/zen5/qwen35.json"))
    ap.add_argument("--tiny", action="store_true", help="a small file of the same layout (a dry run)")
    ap.add_argument("--pp", type=int, default=512, help="prompt tokens")
    ap.add_argument("--tg", type=int, default=32, help="decoded tokens per repeat")
    ap.add_argument("--n-past", type=int, default=128, help="cached tokens before each verification pass")
    ap.add_argument("--repeats", type=int, default=3)
    a = ap.parse_args()
    spec, path = model_file(a.file, a.tiny)
    ms = list(range(1, 10))
    args = (path, a.pp, a.tg, ms, a.n_past, a.repeats)
    theirs = llamacpp(*args)                      # first: its process-wide state stays out of ours
    mine = ours(*args)
    out = {"file": str(path), "spec": {k: v for k, v in vars(spec).items()}, "specdec": mine, "llama_cpp": theirs,
           "note": "random weights: timings only, no acceptance rate", "machine": machine_info()}
    if theirs:
        out["ratio_tg"] = round(mine["tg_tok_s"] / theirs["tg_tok_s"], 3)
        out["ratio_pp"] = round(mine["pp_tok_s"] / theirs["pp_tok_s"], 3)
    if mine["mtp_step_ms_full_head"] is not None:
        out["mtp_step_over_target_pass"] = round(mine["mtp_step_ms_full_head"] / mine["verify_ms"]["1"], 3)
    write_json(a.out, out)
    print(a.out, {k: out[k] for k in ("ratio_tg", "ratio_pp", "mtp_step_over_target_pass") if k in out})
    print("specdec", mine, "\nllama.cpp", theirs)


if __name__ == "__main__":
    main()
