#!/usr/bin/env bash
# Unpack the llama.cpp source vendored in llama-cpp-python's sdist (default 0.3.36, the version
# of tests/data/reference) into ${SPECDEC_CACHE:-~/.cache/specdec}/llama.cpp-src-<version> and
# print that folder.  Its models/ggml-vocab-*.gguf with their .inp/.out cases are what
# tests/text/test_vocab_files.py runs (export SPECDEC_LLAMACPP_SRC=<the folder printed>).
# A finished unpack is reused.
set -euo pipefail
CACHE="${SPECDEC_CACHE:-$HOME/.cache/specdec}"
VERSION="${1:-0.3.36}"
out="$CACHE/llama.cpp-src-$VERSION"
if [ -d "$out/models" ]; then echo "$out"; exit 0; fi
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
"${PYTHON:-python3}" -m pip download --quiet --no-deps --no-binary llama-cpp-python -d "$work" \
  "llama-cpp-python==$VERSION" >&2
tar -xzf "$work"/llama_cpp_python-*.tar.gz -C "$work"
mkdir -p "$CACHE"
rm -rf "$out.tmp" && mv "$work/llama_cpp_python-$VERSION/vendor/llama.cpp" "$out.tmp" && mv "$out.tmp" "$out"
echo "$out"
