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

    host() -> CpuInfo        vendor, model name, family/model/stepping, flags, clock (first CPU)
    kernel_paths() -> dict   the path each kernel family compiles to on this host
    describe() -> dict       both, as the benchmarks record them
    verify_growth() -> float what one more verification row costs, as a fraction of a
                             one-row pass, on this host's path (measured; a prior only)
    force_path()             SPECDEC_KERNELS=amx|vnni|avx2: compile the kernels for that path only
                             (kernels/__init__ calls it before anything compiles); check_path()
                             raises the one-line error of a path this host cannot run

SPECDEC_KERNELS chooses an instruction path by what Numba compiles for: the host's features
less those of the faster paths (``NUMBA_CPU_FEATURES``; Numba's on-disk cache keys every
function on those features, so the paths' compiled code sits side by side).  Unset: the
fastest path the host has.  Every path computes the same numbers bit for bit
(tests/kernels/test_paths.py runs each path the host has against the default one).
"""
from __future__ import annotations

import os
from dataclasses import dataclass

from numba.core import config
from numba.core.codegen import get_host_cpu_features

from . import threading_layer
from .ir import cpu_features, have_avx2, have_f16c, have_vnni256, have_vnni512

KERNELS_ENV = "SPECDEC_KERNELS"
PATHS = ("amx", "vnni", "avx2")            # forceable paths, fastest first
# LLVM features each path turns off (prefixes): AVX2 drops every AVX-512 / AMX / AVX-VNNI form
_OFF = {"amx": (), "vnni": ("amx",), "avx2": ("avx512", "amx", "avxvnni", "avx10", "avxifma", "avxneconvert")}
_NEEDS = {"amx": ("avx512f", "avx512bw", "avx512_vnni", "amx_tile", "amx_int8"),   # /proc/cpuinfo flags
          "vnni": ("avx512f", "avx512bw", "avx512_vnni"), "avx2": ("avx2",)}
_forced: dict[str, str] = {}               # {"path": ...} or {"error": ...}, set by force_path

SIMD_PREFIXES = ("avx", "amx", "fma", "f16c", "sse4", "bmi")


@dataclass(frozen=True)
class CpuInfo:
    vendor: str                 # 'GenuineIntel' | 'AuthenticAMD' | ... ('unknown' off Linux)
    model_name: str             # e.g. 'AMD EPYC 9R14 96-Core Processor'
    family: int | None
    model: int | None
    stepping: int | None
    flags: tuple[str, ...]      # /proc/cpuinfo flags of the first CPU
    mhz: float = 0.0            # its clock as /proc/cpuinfo reports it ('cpu MHz'; 0: unknown)

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

    def num(key: str, kind=int):
        try:
            return kind(fields[key])
        except (KeyError, ValueError):
            return None
    return CpuInfo(vendor=fields.get("vendor_id", "unknown"), model_name=fields.get("model name", "unknown"),
                   family=num("cpu family"), model=num("model"), stepping=num("stepping"),
                   flags=tuple(fields.get("flags", "").split()), mhz=num("cpu MHz", float) or 0.0)


def host(path: str = "/proc/cpuinfo") -> CpuInfo:
    try:
        with open(path) as f:
            return parse_cpuinfo(f.read())
    except OSError:
        return CpuInfo("unknown", "unknown", None, None, None, ())


def _amx():
    """kernels/amx.py, imported only when asked: it defines @njit functions, whose first one
    fixes Numba's code generator for the process, so it must not load before force_path has
    set the path's features (or a forced AVX2 path compiles to AVX-512 code where the host
    has it: zmm registers, 32 of them)."""
    from . import amx
    return amx


def force_path(env: dict | None = None) -> str | None:
    """Apply SPECDEC_KERNELS (from env, default os.environ) before any kernel compiles: the
    path's features for Numba, or the error check_path() raises.  Returns the path forced."""
    name = (os.environ if env is None else env).get(KERNELS_ENV, "").strip().lower()
    if not name:
        return None
    if name not in PATHS:
        _forced["error"] = f"{KERNELS_ENV}={name}: the paths are {', '.join(PATHS)} (unset: the fastest this host has)"
        return None
    flags = host().flags
    missing = [f for f in _NEEDS[name] if f not in flags]
    if missing:
        _forced["error"] = f"{KERNELS_ENV}={name}: this CPU lacks {', '.join(missing)} ({host().model_name})"
        return None
    feats = [f if not (f.startswith("+") and f[1:].startswith(_OFF[name])) else "-" + f[1:]
             for f in get_host_cpu_features().split(",")]
    os.environ["NUMBA_CPU_FEATURES"] = ",".join(feats)
    os.environ["NUMBA_CACHE_DIR"] = _cache_dir(name)
    config.reload_config()
    _forced["path"] = name
    return name


def _cache_dir(name: str) -> str:
    """A forced path's own Numba cache: the cache index keys compiled code by signature and
    the codegen's CPU, not by the features a path turns off, so without it a forced process
    would load the default path's machine code (and the default path a forced one's)."""
    base = os.environ.get("NUMBA_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "specdec", "numba")
    leaf = f"path-{name}"
    return base if os.path.basename(os.path.normpath(base)) == leaf else os.path.join(base, leaf)


def check_path() -> None:
    """ValueError (one line) when SPECDEC_KERNELS names a path this host cannot run (for
    amx: also when the OS or the process's permission stands in the way, amx.status())."""
    threading_layer.check()                        # SPECDEC_THREADING names a layer
    if "error" in _forced:
        raise ValueError(_forced["error"])
    if _forced.get("path") == "amx" and not _amx().available():
        raise ValueError(f"{KERNELS_ENV}=amx: {_amx().status()} ({host().model_name})")


def tiles() -> bool:
    """Whether the legacy quants' passes of many rows run on AMX tiles: only when forced
    (SPECDEC_KERNELS=amx) on a host that can; measured no faster than the VNNI paths under
    their exact per-block float contract, so not the default (docs/architecture.md, AMX)."""
    return _forced.get("path") == "amx" and _amx().available()


def tiles_x16() -> bool:
    """Whether the interleaved K-quants' passes of many rows (kquants_x16) run on AMX tiles:
    on by default where the host can (their folded-scale tiles are several times the VNNI
    kernels, docs/architecture.md), off when SPECDEC_KERNELS forces vnni or avx2."""
    return _forced.get("path") in (None, "amx") and _amx().available()


def path() -> str:
    """The instruction path the kernels run: 'amx' (AMX tiles for passes of many rows: the
    interleaved K-quants' wherever the host has them, the legacy quants' too when forced;
    vnni below them and for everything else), 'vnni', 'avx2' or 'portable'."""
    if have_vnni512():
        return "amx" if tiles_x16() else "vnni"
    return "avx2" if have_avx2() else "portable"


def kernel_paths() -> dict[str, str]:
    """Which instruction path each kernel family compiles to with the current target."""
    dot = "avx2 vpmaddubsw + vpmaddwd" if have_avx2() else "portable (no AVX2)"
    return {"path": path(), "forced": _forced.get("path", ""),
            "amx": ("tiles: legacy quants (tdpbsud) from 16 rows, interleaved K-quants from 16"
                    if tiles() else
                    "tiles: interleaved K-quants from 16 rows; the rest off unless SPECDEC_KERNELS=amx"
                    if tiles_x16() else "available, off (SPECDEC_KERNELS forces another path)"
                    if _amx().available() else _amx().status()),
            "kquants": "avx512-vnni 512-bit" if have_vnni512() else dot,
            "legacy": "avx512-vnni 256-bit" if have_vnni256() else dot,
            "fp16": "f16c" if have_f16c() else "exact software conversion",
            "numba_target_features": ",".join(sorted(f for f in cpu_features()
                                                     if f.startswith("+") and f[1:].startswith(SIMD_PREFIXES)))}


def describe() -> dict:
    """Everything a benchmark JSON records about the CPU."""
    c = host()
    return {"cpu": c.model_name, "cpu_vendor": c.vendor, "cpu_family": c.family, "cpu_model": c.model,
            "cpu_stepping": c.stepping, "cpu_microarchitecture": c.microarchitecture,
            "cpu_simd": list(c.simd), "cpu_flags": list(c.flags), "kernel_paths": kernel_paths(),
            **threading_layer.describe()}


# The verify-cost prior: what an extra verification row costs relative to a one-row pass, per
# instruction path, until AdaptiveLength's fit measures it (docs/speculative.md, "Defaults":
# AVX2's is the slope measured on AMD Zen 3; VNNI's the slope of the interleaved K-quants and the
# legacy records measured on the Intel host, 9-row passes against one row).
VERIFY_GROWTH = {"vnni512": 0.09, "avx2": 0.35, "portable": 1.0}


def verify_growth() -> float:
    """The prior verify-cost growth per extra row for this host's kernel path (a starting
    point that AdaptiveLength's online fit corrects)."""
    if have_vnni512():
        return VERIFY_GROWTH["vnni512"]
    return VERIFY_GROWTH["avx2" if have_avx2() else "portable"]

