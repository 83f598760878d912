"""What CPU the kernels run on: /proc/cpuinfo's facts and the instruction paths chosen for it.

The kernels pick their instruction path at compile time from the features Numba compiles for
(ir.cpu_features(): the host's, read at run time, or NUMBA_CPU_FEATURES): 512-bit
``vpdpbusd`` for the K-quants where AVX-512 VNNI is there, the 256-bit form for the legacy
quants (EVEX with AVX-512 VNNI + VL); without VNNI (AMD Zen 2 / Zen 3, older Intel cores)
the AVX2 pair ``vpmaddubsw`` + ``vpmaddwd`` (ir.dpbusd_chain: the same integers); exact fp16
loads with F16C, and a portable fallback without any of them.  The same choice serves both
vendors: AMD Zen 4 runs a 512-bit instruction as two 256-bit halves, so the 512-bit K-quant
path issues half the instructions for the same work there too, and no path needs Intel's
VEX-only AVX-VNNI.  On a Zen 3 host the portable widen-and-multiply code LLVM made of the
dot products ran decode at 0.18-0.35x llama.cpp's native build; the AVX2 path 0.6-1.0x
(docs/architecture.md, "The kernels on each CPU").

    host() -> CpuInfo        vendor, model name, family/model/stepping, flags (first CPU)
    kernel_paths() -> dict   the path each kernel family compiles to on this host
    describe() -> dict       both, as the benchmarks record them
    verify_growth() -> float what one more verification row costs, as a fraction of a
                             one-row pass, on this host's path (measured; a prior only)
"""
from __future__ import annotations

from dataclasses import dataclass

from .ir import cpu_features, have_avx2, have_f16c, have_vnni256, have_vnni512

SIMD_PREFIXES = ("avx", "amx", "fma", "f16c", "sse4", "bmi")


@dataclass(frozen=True)
class CpuInfo:
    vendor: str                 # 'GenuineIntel' | 'AuthenticAMD' | ... ('unknown' off Linux)
    model_name: str             # e.g. 'AMD EPYC 9R14 96-Core Processor'
    family: int | None
    model: int | None
    stepping: int | None
    flags: tuple[str, ...]      # /proc/cpuinfo flags of the first CPU

    @property
    def simd(self) -> tuple[str, ...]:
        """The flags that matter to the kernels (avx*, amx*, fma, f16c, sse4*, bmi*)."""
        return tuple(f for f in self.flags if f.startswith(SIMD_PREFIXES))

    @property
    def microarchitecture(self) -> str:
        """A coarse name from vendor and family: 'zen4' / 'zen5' / 'zen3' / 'amd' or
        'intel-avx512' / 'intel' (from flags: Intel reuses family 6 for every core)."""
        if self.vendor == "AuthenticAMD":
            zen = {0x17: "zen2", 0x19: "zen4" if "avx512f" in self.flags else "zen3", 0x1A: "zen5"}
            return zen.get(self.family or 0, "amd")
        if self.vendor == "GenuineIntel":
            return "intel-avx512" if "avx512f" in self.flags else "intel"
        return self.vendor


def parse_cpuinfo(text: str) -> CpuInfo:
    """CpuInfo of the first processor block of a /proc/cpuinfo text."""
    fields: dict[str, str] = {}
    for line in text.splitlines():
        if not line.strip():
            if fields:
                break                   # end of the first processor's block
            continue
        key, _, value = line.partition(":")
        fields.setdefault(key.strip(), value.strip())

    def num(key: str) -> int | None:
        try:
            return int(fields[key])
        except (KeyError, ValueError):
            return None
    return CpuInfo(vendor=fields.get("vendor_id", "unknown"), model_name=fields.get("model name", "unknown"),
                   family=num("cpu family"), model=num("model"), stepping=num("stepping"),
                   flags=tuple(fields.get("flags", "").split()))


def host(path: str = "/proc/cpuinfo") -> CpuInfo:
    try:
        with open(path) as f:
            return parse_cpuinfo(f.read())
    except OSError:
        return CpuInfo("unknown", "unknown", None, None, None, ())


def kernel_paths() -> dict[str, str]:
    """Which instruction path each kernel family compiles to with the current target."""
    dot = "avx2 vpmaddubsw + vpmaddwd" if have_avx2() else "portable (no AVX2)"
    return {"kquants": "avx512-vnni 512-bit" if have_vnni512() else dot,
            "legacy": "avx512-vnni 256-bit" if have_vnni256() else dot,
            "fp16": "f16c" if have_f16c() else "exact software conversion",
            "numba_target_features": ",".join(sorted(f for f in cpu_features()
                                                     if f.startswith("+") and f[1:].startswith(SIMD_PREFIXES)))}


def describe() -> dict:
    """Everything a benchmark JSON records about the CPU."""
    c = host()
    return {"cpu": c.model_name, "cpu_vendor": c.vendor, "cpu_family": c.family, "cpu_model": c.model,
            "cpu_stepping": c.stepping, "cpu_microarchitecture": c.microarchitecture,
            "cpu_simd": list(c.simd), "cpu_flags": list(c.flags), "kernel_paths": kernel_paths()}


# What an extra verification row costs, relative to a one-row pass, per instruction path
# (benchmarks/verify_curve.py, Qwen-1.5B and -0.5B, 2 cores): with 512-bit vpdpbusd the
# passes are memory bound and rows nearly free (Intel Xeon: M = 8 at ~2.0x, the speculation
# policy's old fixed prior 0.05 was tuned there); with AVX2 every row adds 0.35-0.37 of a
# pass (AMD EPYC Zen 3, repacked K-quants: M = 8 at 3.6x, M = 2 at 1.35x).
VERIFY_GROWTH = {"vnni512": 0.05, "avx2": 0.35, "portable": 1.0}


def verify_growth() -> float:
    """The prior verify-cost growth per extra row for this host's kernel path (a starting
    point that AdaptiveLength's online fit corrects)."""
    if have_vnni512():
        return VERIFY_GROWTH["vnni512"]
    return VERIFY_GROWTH["avx2" if have_avx2() else "portable"]

