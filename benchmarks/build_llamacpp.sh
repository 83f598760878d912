#!/usr/bin/env bash
# Build the llama.cpp anchor natively from llama-cpp-python's sdist (its vendored llama.cpp).
#
#   benchmarks/build_llamacpp.sh [VERSION|latest]   # default 0.3.36, the version the other
#                                                   # benchmarks and tests/data/reference use
#
# Binaries (llama-server, llama-bench, llama-cli) land in
#   ${SPECDEC_CACHE:-~/.cache/specdec}/llama.cpp-<version>/bin/
# beside build.json (version, llama.cpp commit, cmake options, CPU), which the benchmarks record.
# A finished build is reused (the script prints its folder and exits). The folder is printed last.
#
# -DGGML_NATIVE=ON compiles for this CPU (-march=native). On CPUs whose /proc/cpuinfo reports amx
# flags the AMX kernels are turned off, as the llama.cpp figures elsewhere in this project were
# measured without them (docs/reproduce.md). With GGML_NATIVE=ON llama.cpp ignores
# -DGGML_AMX_*=OFF (those only select flags of a non-native build; -march=native implies AMX and
# ggml-cpu compiles its AMX kernels whenever __AMX_INT8__ is defined), so the compiler is told
# -mno-amx-tile -mno-amx-int8 -mno-amx-bf16 as well; GCC lets explicit -mno-* win over -march.
# build.json records whether the flags the build used define __AMX_INT8__.
# SPECDEC_LLAMACPP_AMX=1 keeps AMX (a separate folder, llama.cpp-<version>-amx).
set -euo pipefail
CACHE="${SPECDEC_CACHE:-$HOME/.cache/specdec}"
JOBS="${JOBS:-$(nproc)}"
PY="${PYTHON:-python3}"
VERSION="${1:-0.3.36}"
[ "$VERSION" = latest ] && VERSION=""

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
spec="llama-cpp-python"
[ -n "$VERSION" ] && spec="llama-cpp-python==$VERSION"
if [ -n "$VERSION" ] && [ "${SPECDEC_LLAMACPP_AMX:-0}" != 1 ] && [ -f "$CACHE/llama.cpp-$VERSION/build.json" ]; then
  echo "$CACHE/llama.cpp-$VERSION"; exit 0
fi
"$PY" -m pip download --quiet --no-deps --no-binary llama-cpp-python -d "$work" "$spec" >&2
sdist="$(ls "$work"/llama_cpp_python-*.tar.gz)"
VERSION="$(basename "$sdist" .tar.gz)"; VERSION="${VERSION#llama_cpp_python-}"
amx_off=0
if grep -qw 'amx_tile' /proc/cpuinfo && [ "${SPECDEC_LLAMACPP_AMX:-0}" != 1 ]; then amx_off=1; fi
out="$CACHE/llama.cpp-$VERSION"
if grep -qw 'amx_tile' /proc/cpuinfo && [ $amx_off = 0 ]; then out="$out-amx"; fi
if [ -f "$out/build.json" ]; then echo "$out"; exit 0; fi
tar -xzf "$sdist" -C "$work"
src="$work/llama_cpp_python-$VERSION/vendor/llama.cpp"
[ -f "$src/CMakeLists.txt" ] || { echo "no vendored llama.cpp in $sdist" >&2; exit 1; }

opts=(-DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DLLAMA_CURL=OFF -DBUILD_SHARED_LIBS=OFF
      -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_TOOLS=ON)
cflags=""
if [ $amx_off = 1 ]; then
  cflags="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
  opts+=(-DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF
         "-DCMAKE_C_FLAGS=$cflags" "-DCMAKE_CXX_FLAGS=$cflags")
fi
amx_macro=$(echo | ${CC:-cc} -march=native $cflags -dM -E - | grep -c '__AMX_INT8__' || true)
gen=(); command -v ninja >/dev/null && gen=(-G Ninja)
build="$out.build"
rm -rf "$build"; mkdir -p "$out/bin"
cmake -S "$src" -B "$build" "${gen[@]}" "${opts[@]}" >&2
cmake --build "$build" --config Release -j "$JOBS" --target llama-server llama-bench llama-cli >&2
for b in llama-server llama-bench llama-cli; do cp "$build/bin/$b" "$out/bin/"; done

# llama.cpp's own version line (build number and commit) as the binary reports it
ver_line="$("$out/bin/llama-server" --version 2>&1 | tr '\n' ' ' || true)"
"$PY" - "$out/build.json" "$VERSION" "$ver_line" "$build/CMakeCache.txt" "$amx_macro" "${opts[@]}" <<'PYEOF'
import json, platform, re, sys, time
path, version, ver_line, cache, amx_macro = sys.argv[1:6]
opts = sys.argv[6:]
flags = ""
model = ""
for line in open("/proc/cpuinfo"):
    if line.startswith("model name") and not model:
        model = line.split(":", 1)[1].strip()
    if line.startswith("flags") and not flags:
        flags = line.split(":", 1)[1].strip()
m = (re.search(r"build (\d+), commit ([0-9a-f]+)", ver_line)          # 0.5.0-dev (build 1, commit x)
     or re.search(r"version:\s*(\d+)\s*\(([0-9a-f]+)\)", ver_line))     # older: version: 4000 (x)
ggml = {}
try:
    for line in open(cache):
        k, _, v = line.strip().partition("=")
        if k.startswith("GGML_") and ":" in k:
            name, typ = k.split(":", 1)
            gpu = ("CUDA", "HIP", "METAL", "VULKAN", "SYCL", "MUSA", "OPENCL", "CANN", "RPC",
                   "WEBGPU", "KOMPUTE", "ZDNN", "HEXAGON", "ET_", "ZENDNN", "VXE", "RVV", "RV_",
                   "LASX", "LSX", "XTHEADVECTOR", "ACCELERATE", "BLAS", "KLEIDIAI", "HBM")
            if typ == "BOOL" and v in ("ON", "OFF") and not any(g in name for g in gpu):
                ggml[name] = v
except OSError:
    pass
json.dump({
    "llama_cpp_python": version,
    "llama_cpp_build": int(m.group(1)) if m else None,
    "llama_cpp_commit": m.group(2) if m else None,
    "version_line": ver_line.strip(),
    "cmake_options": opts,
    "amx_compiled": amx_macro.strip() not in ("", "0"),
    "ggml_options": ggml,
    "cpu_model": model,
    "cpu_flags": flags.split(),
    "machine": platform.machine(),
    "built": time.strftime("%Y-%m-%d %H:%M:%S"),
}, open(path, "w"), indent=1)
PYEOF
rm -rf "$build"
echo "$out"
