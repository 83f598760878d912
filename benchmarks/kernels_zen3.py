"""A deterministic model of the AVX2 kernels on AMD Zen 3, on any x86 host (no timing).

Each AVX2 kernel's per-record code for a pass of M activation rows is emitted by the kernel
modules' own IR emitters into a bare LLVM function (M a constant: LLVM keeps that one path),
compiled by llvmlite for ``-mcpu=znver3`` with the AVX2 path's features (no AVX-512: every
vector instruction VEX, 16 ymm registers), and measured three ways:

    spills     ymm stores to the stack and stack reloads (folded or not) in the hot loop
    cycles     llvm-mca -mcpu=znver3 cycles per iteration of the hot loop (its steady state)
    bytes      weight bytes fetched from beyond L2 per pass (the loop order's re-reads)

The hot loop of a K-quant kernel is the loop over super-block records (one record: 16
weight rows × 256 values); a legacy-quant tile's is one 32-value block of 16 rows plus its
loop over the activation rows (``cycles = outside + M · m-loop``).  ``ratio(M)`` =
cycles(M) / cycles(1): what a pass of M rows costs against one row when the pass is bound
by the core (a one-row pass is bound by memory, so the real ratio is at most this).

Run it under the AVX2 path (the kernel modules pick their instruction path at import):

    SPECDEC_KERNELS=avx2 python benchmarks/kernels_zen3.py [--m 1 2 4 9 17] [--json out.json]

tests/kernels/test_zen3_model.py asserts its bounds.  Needs llvm-mca (llvm-14-tools) on PATH
or in LLVM_MCA.
"""
from __future__ import annotations

import contextlib
import os
import re
import shutil
import subprocess
import sys

import llvmlite.binding as llvm
from llvmlite import ir

CPU = "znver3"
PACKAGE = os.environ.get("KERNELS_PACKAGE", "specdec.kernels")   # "kernels": another checkout's, on PYTHONPATH
EVEX = re.compile(r"%zmm|%ymm(1[6-9]|2\d|3[01])\b|%xmm(1[6-9]|2\d|3[01])\b|%k[0-7]\b|\{1to\d+\}")
STACK = re.compile(r"-?\d*\(%r[sb]p\)")


def _kernels(name: str):
    """The kernels' module ``name`` (of PACKAGE)."""
    import importlib
    return importlib.import_module(f"{PACKAGE}.{name}")


def llvm_mca() -> str | None:
    """The llvm-mca binary (LLVM_MCA, llvm-mca, llvm-mca-14 …) or None."""
    for name in (os.environ.get("LLVM_MCA"), "llvm-mca", "llvm-mca-14", "llvm-mca-15", "llvm-mca-18"):
        if name and shutil.which(name):
            return shutil.which(name)
    return None


def _target_machine():
    cpu_features = _kernels("ir").cpu_features
    llvm.initialize_native_target()
    llvm.initialize_native_asmprinter()
    feats = ",".join(sorted(f for f in cpu_features() if f))
    target = llvm.Target.from_triple(llvm.get_process_triple())
    return target.create_target_machine(cpu=CPU, features=feats, opt=3, reloc="pic", codemodel="default")


def compile_asm(module: ir.Module) -> str:
    """The module optimized at O3 (Numba's pipeline options) and compiled to AT&T assembly."""
    tm = _target_machine()
    mod = llvm.parse_assembly(str(module))
    mod.verify()
    pto = llvm.create_pipeline_tuning_options()
    pto.speed_level = 3
    pto.slp_vectorization = False
    pto.loop_vectorization = False
    pb = llvm.create_pass_builder(tm, pto)
    pb.getModulePassManager().run(mod, pb)
    return tm.emit_assembly(mod)


def _instructions(asm: str) -> list[tuple[str, str]]:
    """(label or '', instruction) lines of the function's body."""
    out = []
    for line in asm.splitlines():
        s = line.split("#")[0].strip()
        if not s:
            continue
        if s.endswith(":"):
            out.append((s[:-1], ""))
        elif not s.startswith("."):
            out.append(("", s))
    return out


def hot_loop(asm: str) -> tuple[list[str], list[str]]:
    """(the innermost loop's instructions, every other instruction): the innermost loop is
    the shortest span from a label to a branch back to it that holds no other back edge."""
    lines = _instructions(asm)
    labels = {lab: i for i, (lab, _) in enumerate(lines) if lab}
    loops = []
    for i, (_, ins) in enumerate(lines):
        m = re.match(r"j\w+\s+(\S+)$", ins)
        if m and m.group(1) in labels and labels[m.group(1)] < i:
            loops.append((labels[m.group(1)], i))
    inner = [(a, b) for a, b in loops if not any(a <= c < d <= b and (c, d) != (a, b) for c, d in loops)]
    body = set()
    if inner:
        a, b = max(inner, key=lambda ab: ab[1] - ab[0])
        body = set(range(a, b + 1))
    loop = [ins for i, (_, ins) in enumerate(lines) if ins and i in body]
    rest = [ins for i, (_, ins) in enumerate(lines) if ins and i not in body and not ins.startswith("ret")]
    return loop, rest


def spills(ins: list[str]) -> tuple[int, int]:
    """(vector spills, vector reloads): ymm/xmm stores to the stack, stack loads into (or
    folded into an operation on) a vector register."""
    st = ld = 0
    for s in ins:
        if "mm" not in s or not STACK.search(s) or s.startswith(("prefetch", "lea")):
            continue
        ops = s.split(None, 1)[1] if " " in s else ""
        if STACK.search(ops.split(",")[-1]):
            st += 1
        else:
            ld += 1
    return st, ld


def mca_cycles(ins: list[str], iterations: int = 200) -> float:
    """llvm-mca -mcpu=znver3: cycles per iteration of the instructions as a loop body."""
    if not ins:
        return 0.0
    text = "\n".join(i for i in ins if not re.match(r"j\w+\s", i)) + "\n"
    res = subprocess.run([llvm_mca(), f"-mcpu={CPU}", f"-iterations={iterations}", "-all-views=false",
                          "-summary-view"], input=text, capture_output=True, text=True, check=True)
    total = int(re.search(r"Total Cycles:\s+(\d+)", res.stdout).group(1))
    return total / iterations


def evex(asm: str) -> list[str]:
    """The instructions that are not plain AVX2 (EVEX registers, masks or broadcasts)."""
    return [s for _, s in _instructions(asm) if s and EVEX.search(s)]


# ------------------------------------------------------------------------- the kernels

def kquant_function(qtype: int, m: int, emit=None) -> ir.Module:
    """A module whose function runs the interleaved K-quant chunk kernel's code for M = m rows
    over every tile and record (kquants_x16_ir._emit_chunk, or ``emit`` of the same signature)."""
    kx = _kernels("kquants_x16_ir")
    F32, I8, I64 = (getattr(_kernels("ir"), n) for n in ("F32", "I8", "I64"))
    emit = emit or kx._emit_chunk
    mod = ir.Module(name=f"kquant_{qtype}_m{m}")
    i8p, f32p = I8.as_pointer(), F32.as_pointer()
    fn = ir.Function(mod, ir.FunctionType(ir.VoidType(), [i8p, i8p, f32p, i8p, f32p, I64, I64]), "kernel")
    w, xq, xd, xbs, out, n, nblk = fn.args
    builder = ir.IRBuilder(fn.append_basic_block("entry"))
    x = (getattr(kx, "_Q8K", None) or _kernels("ir").Q8K)(xq, xd, xbs, I64(m), nblk)
    with _constant_switches():
        emit(builder, qtype, False, True, w, x, out, n, I64(0), I64(1))
    builder.ret_void()
    return mod


@contextlib.contextmanager
def _constant_switches():
    """ir.switch_static on a constant emits only that case's path (the others LLVM would
    drop anyway: emitting all 17 per M only costs time)."""
    original = _kernels("ir").switch_static

    def switch_static(builder, value, n_max, body, name):
        if isinstance(value, ir.Constant):
            if 1 <= value.constant <= n_max:
                body(value.constant)
            return None
        return original(builder, value, n_max, body, name)
    patched = [mod for mod in list(sys.modules.values())
               if "kernels" in getattr(mod, "__name__", "") and getattr(mod, "switch_static", None) is original]
    for mod in patched:
        mod.switch_static = switch_static
    try:
        yield
    finally:
        for mod in patched:
            mod.switch_static = original


def measure(module: ir.Module, m: int, per_m_loop: bool = False) -> dict:
    """Spills, EVEX instructions and modelled cycles of the module's hot loop.  per_m_loop:
    the hot loop runs once per activation row (cycles = outside + m · loop), else once per
    record with all m rows inside (cycles = loop)."""
    asm = compile_asm(module)
    loop, rest = hot_loop(asm)
    st, ld = spills(loop)
    cyc = mca_cycles(loop)
    if per_m_loop:
        cyc = mca_cycles(rest) + m * cyc
    return {"m": m, "loop_instructions": len(loop), "spills": st, "reloads": ld,
            "cycles": round(cyc, 2), "evex": len(evex(asm))}


# ------------------------------------------------------------------------------ the model

BYTES_PER_CYCLE = 3.0   # one Zen 3 core's share of a one-row pass's weight stream (docs/architecture.md)
BOUNDS = {9: 2.0, 17: 3.5}   # modelled pass of M rows / one row, at most (tests/kernels/test_zen3_model.py)


def kquant_model(qtypes=None, ms=(1, 9, 17)) -> dict:
    """{format name: [measure(M) + 'ratio']} for the interleaved K-quants' AVX2 code: ratio =
    max(cycles(M), floor) / max(cycles(1), floor), floor = the record's bytes / BYTES_PER_CYCLE
    (a one-row pass streams the weights; the rows' work hides behind that stream up to it)."""
    kx, FORMATS = _kernels("kquants_x16_ir"), _kernels("formats").FORMATS
    out = {}
    for qt in qtypes or tuple(kx.RECORD):
        floor = kx.RECORD[qt] / BYTES_PER_CYCLE
        rows = [measure(kquant_function(qt, m, _emitter(kx)), m) for m in ms]
        out[FORMATS[qt].name] = _ratios(rows, floor)
    return out


def _ratios(rows: list, floor: float, field: str = "cycles") -> list:
    """rows with 'ratio' = max(row[field], floor) / max(first row's, floor) and 'floor'."""
    base = max(rows[0][field], floor)
    for r in rows:
        r["ratio"] = round(max(r[field], floor) / base, 3)
        r["floor"] = round(floor, 1)
    return rows


def _emitter(kx):
    """The chunk emitter the AVX2 build of kquants_x16_ir uses (this tree's, or an older
    tree's _emit_chunk when it has no separate AVX2 code)."""
    avx2 = getattr(kx, "kquants_x16_avx2", None)
    return avx2.emit_chunk if avx2 is not None and getattr(kx, "AVX2_PATH", False) else kx._emit_chunk


def mapped_function(qtype: int, m: int) -> ir.Module:
    """A module whose function runs the mapped (GGUF-layout) K-quant chunk kernel's code for
    M = m rows over every row and super-block (kquants_ir._emit_chunk)."""
    kq, kir, fm = _kernels("kquants_ir"), _kernels("ir"), _kernels("formats")
    F32, I8, I64 = kir.F32, kir.I8, kir.I64
    mod = ir.Module(name=f"mapped_{qtype}_m{m}")
    i8p, f32p = I8.as_pointer(), F32.as_pointer()
    fn = ir.Function(mod, ir.FunctionType(ir.VoidType(), [i8p, i8p, f32p, i8p, f32p, I64, I64, I64]), "kernel")
    w, xq, xd, xbs, out, n, nblk, row_bytes = fn.args
    builder = ir.IRBuilder(fn.append_basic_block("entry"))
    x = kir.Q8K(xq, xd, xbs, I64(m), nblk)
    f16c = kir.have_f16c()
    with _constant_switches():
        kq._emit_chunk(builder, lambda b, p: kq.DECODERS[qtype](b, p, f16c), fm.FORMATS[qtype].type_size,
                       False, f16c, w, row_bytes, x, out, n, I64(0), I64(1))
    builder.ret_void()
    return mod


def mapped_model(qtypes=None, ms=(1, 9, 17)) -> dict:
    """{format name: [measure(M) + 'per_row' + 'ratio']} for the mapped K-quants' AVX2 code:
    the static path of M rows takes R = 16 // M weight rows per loop (one from M = 9 on), so
    per_row = cycles / R per weight row and super-block; floor: a super-block's bytes /
    BYTES_PER_CYCLE (reported, no bound: tests/kernels/test_zen3_model.py checks the
    interleaved layout, the one weights get at load)."""
    fm, kq = _kernels("formats"), _kernels("kquants_ir")
    out = {}
    for qt in qtypes or (fm.Q4_K, fm.Q5_K, fm.Q6_K):
        floor = fm.FORMATS[qt].type_size / BYTES_PER_CYCLE
        rows = []
        for m in ms:
            r = measure(mapped_function(qt, m), m)
            r["per_row"] = round(r["cycles"] / (max(1, 16 // m) if m <= kq.MAX_STATIC_M else 1), 2)
            rows.append(r)
        out[fm.FORMATS[qt].name] = _ratios(rows, floor, "per_row")
    return out


def main(argv=None) -> int:
    import argparse
    import json
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--m", type=int, nargs="+", default=[1, 2, 4, 9, 17], help="rows per pass (first: the base)")
    ap.add_argument("--json", help="write the figures here")
    ap.add_argument("--legacy", action="store_true", help="also the legacy quants' tiles (Q4_0, Q4_1, Q8_0)")
    ap.add_argument("--mapped", action="store_true", help="also the mapped (GGUF-layout) K-quants' code")
    args = ap.parse_args(argv)
    if llvm_mca() is None:
        print("llvm-mca not found (apt-get install llvm-14-tools, or set LLVM_MCA)")
        return 2
    cpu = _kernels("cpu")
    res = {"cpu_model": CPU, "path": cpu.path(), "bytes_per_cycle": BYTES_PER_CYCLE, "kquants": kquant_model(ms=args.m)}
    if args.legacy:
        res["legacy"] = legacy_model(ms=args.m)
    if args.mapped:
        res["mapped"] = mapped_model(ms=args.m)
    for name, rows in [*res["kquants"].items(), *res.get("legacy", {}).items(),
                       *((f"mapped {k}", v) for k, v in res.get("mapped", {}).items())]:
        print(name, " ".join(f"M={r['m']}: {r['cycles']:.0f} cyc {r['spills']}/{r['reloads']} spill/reload "
                             f"x{r['ratio']:.2f}" for r in rows))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=1)
    return 0



def legacy_function(qtype: int, m: int, rows: int = 16) -> ir.Module:
    """A module whose function runs one 32-value block of a legacy-quant tile of ``rows``
    repacked rows (repack.make_tile's code: records.decode_record, legacy_ir.emit_tile)
    against activation rows 0 … m−1."""
    kir, rec_mod, lir = _kernels("ir"), _kernels("records"), _kernels("legacy_ir")
    I8, I32, I64, F32 = kir.I8, kir.I32, kir.I64, kir.F32
    mod = ir.Module(name=f"legacy_{qtype}_m{m}")
    i8p, i32p, f32p = I8.as_pointer(), I32.as_pointer(), F32.as_pointer()
    fn = ir.Function(mod, ir.FunctionType(ir.VoidType(), [i8p, I64, I64, i8p, i32p, f32p, f32p, I64, I64,
                                                          f32p]), "kernel")
    wp, t0, b, xq, xsum, xd, xs, k, nb, acc = fn.args
    builder = ir.IRBuilder(fn.append_basic_block("entry"))
    rec = rec_mod.REC[qtype]
    offs = [builder.add(t0, builder.mul(b, I64(rec)))]
    if rows == 16:
        offs.append(builder.add(offs[0], builder.mul(nb, I64(rec))))
    decs = [rec_mod.decode_record(builder, wp, o, qtype) for o in offs]
    dec = decs[0]
    if rows == 16:
        hi = decs[1]
        dec = lir.Decoded([kir.join(builder, a, c) for a, c in zip(dec.cols, hi.cols)], dec.off,
                          kir.join(builder, dec.d, hi.d), None if dec.m is None else kir.join(builder, dec.m, hi.m))
    lir.emit_tile(builder, dec, False, (xq, xsum, xd, xs, acc), (b, k, nb, I64(0), I64(m), I64(0), I64(rows)))
    builder.ret_void()
    return mod


def legacy_model(qtypes=None, ms=(1, 9, 17)) -> dict:
    """{format name: [measure(M) + 'ratio']} for a legacy-quant tile block: cycles = the block's
    decode + M · the loop over activation rows; floor: its 16 rows' bytes / BYTES_PER_CYCLE."""
    formats, rec_mod = _kernels("formats"), _kernels("records")
    out = {}
    for qt in qtypes or (formats.Q4_0, formats.Q4_1, formats.Q8_0):
        floor = 2 * rec_mod.REC[qt] / BYTES_PER_CYCLE
        rows = [measure(legacy_function(qt, m), m, per_m_loop=True) for m in ms]
        out[formats.FORMATS[qt].name] = _ratios(rows, floor)
    return out


if __name__ == "__main__":
    sys.exit(main())
