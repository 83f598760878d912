"""AMX tiles on the 16-row interleaved K-quants (kernels/kquants_x16_amx.py) against today's kernels.

1. Kernels, Qwen2.5-Coder-1.5B's own tensors (ffn_up Q4_K 8960×1536, ffn_down Q6_K 1536×8960),
   M = 16, 64, 128, 512: milliseconds per call, the Q8_K activations given, of
       x16-amx     kquants_x16_amx.matmul on kquants_x16.interleave's records (this checkout)
       base-vnni   --base's kquants.matmul_q8k on the lane-repacked layout, SPECDEC_KERNELS=vnni
       base-amx    the same under SPECDEC_KERNELS=amx (its kquants_amx tiles from 64 rows)
   each in a process of its own, the three alternated --rounds times, the fastest call kept;
   and the bound of x16-amx, same process: its driver without the update (B prep + tile
   products), without the products (B prep + update), B prep alone, and products and update
   apart instead of side by side.
2. pp512: every K-quant matmul of the model at M = 512 (one tensor per kind, times its count)
   for x16-amx and base-amx / base-vnni; the base's pp512 (a 512-token prompt, last_only)
   under both paths; llama-bench's pp512 (-t 2); and the pp512 the tiles would give:
   512 / (base pass − base matmuls + x16-amx matmuls), an estimate made before the engine
   called the tiles (benchmarks/verify_curve.py measures the pp512 they give).

Intel hosts with AMX only.  Writes x16_amx.json (machine record included) into --out.

    python benchmarks/x16_amx.py --base /work/wt-base [--rounds 3] [--reps 5] [--out bench-results]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

MODEL = Path.home() / ".cache/specdec/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"
LLAMA_BENCH = Path.home() / ".cache/specdec/llama.cpp-0.3.36/bin/llama-bench"
TENSORS = ("blk.0.ffn_up.weight", "blk.0.ffn_down.weight")
MS = (16, 64, 128, 512)
PP = 512


_READER: list = []


def _tensors(names=None) -> dict:
    """{name: (qtype, w uint8 (N, row_bytes), K)} of the model's K-quant matrices (all: names None)."""
    import gguf
    if not _READER:
        _READER.append(gguf.GGUFReader(str(MODEL)))
    out = {}
    for t in _READER[0].tensors:
        if (names is None and int(t.tensor_type) in (12, 13, 14) and len(t.shape) == 2
                and not t.name.startswith(("token_embd", "output"))) or (names and t.name in names):
            w = np.ascontiguousarray(np.asarray(t.data).reshape(int(t.shape[1]), -1))
            out[t.name] = (int(t.tensor_type), w, int(t.shape[0]))
    return out


def _kinds() -> dict:
    """{(qtype, N, K): [names]} over the model's K-quant matmuls (the output layer left out: a
    prompt pass computes its last row only)."""
    kinds: dict = {}
    for name, (qt, w, k) in _tensors().items():
        kinds.setdefault((qt, w.shape[0], k), []).append(name)
    return kinds


def _best_ms(fn, reps: int) -> float:
    fn()
    best = float("inf")
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best * 1e3


def _acts(m: int, k: int):
    from specdec.kernels.q8k import quantize_q8_k
    return quantize_q8_k(np.random.default_rng(m).standard_normal((m, k)).astype(np.float32))


def worker(kind: str, reps: int) -> dict:
    """One process's timings: kind 'x16' (this checkout) or 'base' (run from --base)."""
    if kind == "x16":
        from specdec.kernels import kquants_x16, kquants_x16_amx as xa

        def prepare(qt, w):
            return kquants_x16.interleave(qt, w)

        def call(qt, wp, act, out, driver=None):
            xa.run(driver or xa._DRIVERS[qt], wp, *act, out)
    else:
        from specdec.kernels import kquants, kquants_ir, kquants_repack

        def prepare(qt, w):
            return kquants_repack.repack(w, qt)

        def call(qt, wp, act, out, driver=None):
            kquants.matmul_q8k(qt, wp, *act, out, kquants_ir.MATMUL_Q8K_REPACKED)
    res: dict = {"kernels": {}, "bound": {}, "pp_matmuls": {}}
    for name, (qt, w, k) in _tensors(TENSORS).items():
        wp = prepare(qt, w)
        for m in MS:
            act, out = _acts(m, k), np.empty((m, w.shape[0]), np.float32)
            res["kernels"][f"{name} M={m}"] = _best_ms(lambda: call(qt, wp, act, out), reps)
            if kind == "x16":
                variants = {"tiles+prep": dict(update=False), "update+prep": dict(tiles=False),
                            "prep": dict(tiles=False, update=False), "apart": dict(side=False)}
                for vname, kw in variants.items():
                    drv = xa._make_driver(qt, **kw)
                    res["bound"][f"{name} M={m} {vname}"] = _best_ms(lambda: call(qt, wp, act, out, drv), reps)
    for (qt, n, k), names in _kinds().items():
        _, w, _ = _tensors([names[0]])[names[0]]
        wp, act, out = prepare(qt, w), _acts(PP, k), np.empty((PP, n), np.float32)
        ms = _best_ms(lambda: call(qt, wp, act, out), max(2, reps // 2))
        res["pp_matmuls"][f"q{qt} {n}x{k}"] = {"count": len(names), "ms": ms}
    return res


def model_pass(reps: int) -> dict:
    """The checkout's pp512 on the model (a prompt of PP tokens, last_only), fastest of reps."""
    sys.path.insert(0, "benchmarks")
    import specdec
    from common import prompt_ids, warm_up
    model = specdec.load(str(MODEL))
    warm_up(model)
    s = model.session(PP + 8)
    ids = prompt_ids(PP)

    def one():
        s.truncate(0)
        s.eval(ids, last_only=True)
    return {"pp512_s": _best_ms(one, reps) / 1e3}


def _run(cmd: list, cwd: Path, env: dict) -> dict:
    out = subprocess.run(cmd, cwd=cwd, env={**os.environ, **env}, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def llama_bench() -> dict:
    out = subprocess.run([str(LLAMA_BENCH), "-m", str(MODEL), "-p", str(PP), "-n", "0", "-t", "2", "-o", "json"],
                         capture_output=True, text=True, check=True)
    row = json.loads(out.stdout)[0]
    return {"pp512_tok_s": row["avg_ts"], "stddev": row["stddev_ts"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base", type=Path, default=Path("/work/wt-base"))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--out", type=Path, default=Path("bench-results"))
    ap.add_argument("--worker", choices=("x16", "base", "model"))
    ap.add_argument("--no-model", action="store_true", help="kernels only (no pp512 passes, no llama-bench)")
    ap.add_argument("--ms", default="16,64,128,512", help="part 1's activation rows, e.g. 8,9,16,32")
    ap.add_argument("--kernels-from", type=Path, help="take part 1 from this earlier JSON (part 2 only)")
    args = ap.parse_args()
    global MS
    MS = tuple(int(m) for m in args.ms.split(","))
    if args.worker:
        print(json.dumps(worker(args.worker, args.reps) if args.worker != "model" else model_pass(args.reps)))
        return
    me, here = Path(__file__).resolve(), Path(__file__).resolve().parent.parent
    runs = {"x16-amx": ([sys.executable, str(me), "--worker", "x16"], here, {}),
            "base-vnni": ([str(args.base / ".venv/bin/python"), str(me), "--worker", "base"], args.base,
                          {"SPECDEC_KERNELS": "vnni"}),
            "base-amx": ([str(args.base / ".venv/bin/python"), str(me), "--worker", "base"], args.base,
                         {"SPECDEC_KERNELS": "amx"})}
    best: dict = json.loads(args.kernels_from.read_text())["runs"] if args.kernels_from else {}
    for r in range(0 if args.kernels_from else args.rounds):
        for label, (cmd, cwd, env) in runs.items():
            got = _run(cmd + ["--reps", str(args.reps), "--ms", args.ms], cwd, env)
            for part, rows in got.items():
                for key, v in rows.items():
                    slot = best.setdefault(label, {}).setdefault(part, {})
                    ms = v["ms"] if isinstance(v, dict) else v
                    if key not in slot or ms < (slot[key]["ms"] if isinstance(v, dict) else slot[key]):
                        slot[key] = v
            print(f"round {r + 1}: {label} done", file=sys.stderr, flush=True)
    result = {"runs": best}
    if not args.no_model:
        result["llama_bench"] = llama_bench()
        for label in ("base-vnni", "base-amx"):
            cmd, cwd, env = runs[label]
            result.setdefault("pp512", {})[label] = _run(cmd[:2] + ["--worker", "model", "--reps", "2"], cwd, env)
        result["estimate"] = _estimate(best, result)
    sys.path.insert(0, str(here / "benchmarks"))
    from common import machine_info, write_json
    result["machine"] = machine_info()
    args.out.mkdir(parents=True, exist_ok=True)
    write_json(args.out / "x16_amx.json", result)
    print(json.dumps(result, indent=1, default=str))


def _estimate(best: dict, result: dict) -> dict:
    """pp512 with the tiles in place of each base path's K-quant matmuls (same-run figures)."""
    mine = sum(v["count"] * v["ms"] for v in best["x16-amx"]["pp_matmuls"].values()) / 1e3
    est = {"x16_amx_matmuls_s": mine}
    for label in ("base-vnni", "base-amx"):
        theirs = sum(v["count"] * v["ms"] for v in best[label]["pp_matmuls"].values()) / 1e3
        pass_s = result["pp512"][label]["pp512_s"]
        rest = pass_s - theirs
        est[label] = {"pass_s": pass_s, "kquant_matmuls_s": theirs, "rest_s": rest,
                      "pp512_tok_s": PP / pass_s, "with_tiles_tok_s": PP / (rest + mine),
                      "vs_llama": PP / (rest + mine) / result["llama_bench"]["pp512_tok_s"]}
    return est


if __name__ == "__main__":
    main()
