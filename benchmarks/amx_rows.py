"""What AMX tiles buy, and what bounds them: the quantized matmul with and without tiles.

1. Kernels: per legacy format on real shapes (Qwen2.5-0.5B's ffn_up Q5_0 and attention Q8_0,
   SmolLM2's Q4_1, a Q4_0 probe), per M, the median milliseconds of the VNNI tile and of the
   AMX tiles (kernels/legacy_amx.py, called directly whatever legacy_amx.MIN_M says), and
   the share of the AMX time the tile instructions themselves take (a loop of the same
   tileloadd/tdpbsud/tilestored count alone): the rest is the per-block float update.
   (The K-quants' tiles read the interleaved layout: benchmarks/x16_amx.py.)
   With --records, the legacy shapes in repack.py's 8-row records instead (the layout of a
   requantized draft and of a --no-mmap file): the VNNI records path against the tiles.
2. Models: one forward over M new tokens after 128 cached (M = 1, 9, 16, 32, 64, 128) and a 512-token
   prompt pass (pp512) of the Q5_0/Q8_0-heavy models and of the K-quant target, in two
   processes: SPECDEC_KERNELS=amx and =vnni (the path is chosen at import).

Intel hosts with AMX only.  Writes amx_rows.json (machine record included) into --out.

    python benchmarks/amx_rows.py [--reps 7] [--out bench-results]
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
from numba import njit

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import machine_info, write_json  # noqa: E402
from specdec.kernels import amx  # noqa: E402

SHAPES = [("qwen0.5b ffn_up", 6, 4864, 896), ("qwen0.5b attn_q", 8, 896, 896),
          ("smollm2 ffn_up", 3, 1536, 576), ("q4_0 probe", 2, 4864, 896)]
MS = (1, 9, 16, 32, 64, 128, 512)
KQUANT_SHAPES = [("qwen1.5b ffn_up", "blk.0.ffn_up.weight"), ("qwen1.5b ffn_down", "blk.0.ffn_down.weight"),
                 ("qwen1.5b attn_q", "blk.0.attn_q.weight")]
KQUANT_MODEL = "qwen2.5-coder-1.5b-instruct"
MS_K = (16, 32, 64, 128)
MODELS = ("qwen2.5-coder-0.5b-instruct", "gemma-3-270m-q4_k_m", KQUANT_MODEL)

MODEL_SCRIPT = r"""
import json, sys, time
import numpy as np
sys.path.insert(0, "benchmarks")
import specdec
from specdec.kernels import cpu
from common import forward_ms, prompt_ids, warm_up
model = specdec.load(sys.argv[1])
warm_up(model)
reps = int(sys.argv[2])
s = model.session(520)
s.eval(prompt_ids(512), last_only=True)     # untimed: first touches
s.truncate(0)
pp = []
for _ in range(max(3, reps // 3)):
    t = time.perf_counter()
    s.eval(prompt_ids(512), last_only=True)
    pp.append(time.perf_counter() - t)
    s.truncate(0)
row = {"path": cpu.path(),
       "forward_ms": {str(m): round(forward_ms(model, m, repeats=reps), 3) for m in (1, 9, 16, 32, 64, 128)},
       "pp512_ms": round(float(np.median(pp)) * 1e3, 1), "pp512_tok_s": round(512 / float(np.median(pp)), 1)}
print(json.dumps(row))
"""


def _median_ms(fn, reps: int) -> float:
    fn()
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return float(np.median(times) * 1e3)


@njit(nogil=True)
def _tiles_alone(cfg, xq, k, bbuf, cbuf, n):
    amx.load_config(cfg)
    for _ in range(n):
        amx.load_b(bbuf, 0, 64)
        amx.dot_store2(xq, 0, k, xq, 16 * k, k, cbuf, 0, 64, cbuf, 1024, 64)
    amx.release()


def kernels(reps: int) -> list[dict]:
    import gguf
    from numba import get_num_threads
    from specdec.kernels import legacy, legacy_amx
    rng = np.random.default_rng(0)
    rows = []
    for name, qt, n, k in SHAPES:
        vals = rng.standard_normal((n, k)).astype(np.float32)
        w = gguf.quants.quantize(vals, gguf.GGMLQuantizationType(qt))
        for m in MS:
            x = rng.standard_normal((m, k)).astype(np.float32)
            out = np.empty((m, n), np.float32)
            vnni = _median_ms(lambda: legacy._matmul_quant(qt, w, x, out), reps)
            tiles = _median_ms(lambda: legacy_amx.matmul(qt, w, x, out, legacy._matmul_quant), reps)
            pairs = (n // 16) * (k // 32) * -(-m // 32)          # dot_store2 calls of the pass
            xq, bbuf, cbuf = np.zeros((32, k), np.int8), np.zeros(512, np.uint8), np.zeros(512, np.int32)
            alone = _median_ms(lambda: _tiles_alone(legacy_amx.CONFIG, xq, k, bbuf, cbuf, pairs), reps)
            alone /= get_num_threads()                        # the pass splits them over the threads
            rows.append({"tensor": name, "qtype": qt, "N": n, "K": k, "M": m, "vnni_ms": round(vnni, 4),
                         "amx_ms": round(tiles, 4), "speedup": round(vnni / tiles, 3),
                         "tile_instructions_share": round(min(1.0, alone / tiles), 3)})
            print(json.dumps(rows[-1]), flush=True)
    return rows


def _alternated_ms(f1, f2, reps: int) -> tuple[float, float]:
    """The fastest of reps calls of each, the two alternated (after one warm-up call each)."""
    f1(), f2()
    t1, t2 = [], []
    for _ in range(reps):
        for f, ts in ((f1, t1), (f2, t2)):
            t = time.perf_counter()
            f()
            ts.append(time.perf_counter() - t)
    return min(t1) * 1e3, min(t2) * 1e3


def record_kernels(reps: int) -> list[dict]:
    import gguf
    from specdec.kernels import legacy_amx, repack
    rng = np.random.default_rng(0)
    rows = []
    for name, qt, n, k in SHAPES:
        if qt not in legacy_amx.MIN_M:
            continue
        w = repack.repack(gguf.quants.quantize(rng.standard_normal((n, k)).astype(np.float32),
                                               gguf.GGMLQuantizationType(qt)), qt)
        for m in MS_K:
            x = rng.standard_normal((m, k)).astype(np.float32)
            out, out2 = np.empty((m, n), np.float32), np.empty((m, n), np.float32)
            vnni, tiles = _alternated_ms(
                lambda: repack._matmul_quant(qt, w, x, out),
                lambda: legacy_amx.matmul(qt, w, x, out2, lambda q, *a: repack.MATMUL[q](*a), repacked=True), reps)
            assert np.array_equal(out.view(np.uint32), out2.view(np.uint32))
            rows.append({"tensor": name, "qtype": qt, "layout": "records", "N": n, "K": k, "M": m,
                         "vnni_ms": round(vnni, 4), "amx_ms": round(tiles, 4), "speedup": round(vnni / tiles, 3)})
            print(json.dumps(rows[-1]), flush=True)
    return rows


def models(reps: int, names=MODELS) -> list[dict]:
    root = Path(__file__).resolve().parent.parent
    rows = []
    for model in names:
        for path in ("amx", "vnni"):
            env = {**os.environ, "SPECDEC_KERNELS": path}
            r = subprocess.run([sys.executable, "-c", MODEL_SCRIPT, model, str(reps)], env=env, cwd=root,
                               capture_output=True, text=True, timeout=3600)
            if r.returncode:
                raise SystemExit(r.stderr[-2000:])
            rows.append({"model": model, **json.loads(r.stdout.strip().splitlines()[-1])})
            print(json.dumps(rows[-1]), flush=True)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--out", type=Path, default=Path("bench-results"))
    ap.add_argument("--skip-models", action="store_true")
    ap.add_argument("--kquants-only", action="store_true", help="the K-quant kernels and the K-quant model only")
    ap.add_argument("--records", action="store_true", help="the legacy kernels in repacked records only")
    a = ap.parse_args()
    if not amx.available():
        raise SystemExit(f"amx_rows: no AMX here ({amx.status()})")
    if a.records:
        write_json(a.out / "amx_rows_records.json", {"machine": machine_info(), "kernels": record_kernels(a.reps)})
        return
    result = {"machine": machine_info(), "kernels": [] if a.kquants_only else kernels(a.reps),
              "models": [] if a.skip_models else models(a.reps, (KQUANT_MODEL,) if a.kquants_only else MODELS)}
    write_json(a.out / ("amx_rows_kquants.json" if a.kquants_only else "amx_rows.json"), result)


if __name__ == "__main__":
    main()
