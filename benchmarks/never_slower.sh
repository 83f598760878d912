#!/usr/bin/env bash
# The defaults against plain on this host's own kernel path and on a forced dear one (issue:
# "never slower on any host"): Spec-Bench's groups, the code sets, the README's first command,
# prompt lookup on a code edit and a prediction on a whole-file edit, every greedy output
# checked against plain by each benchmark.  One folder per path; then summary.py-style
# figures by benchmarks/never_slower_summary.py.
#
#   benchmarks/never_slower.sh OUT_DIR [PATH ...]      # PATH: default (the host's) | avx2 | vnni
set -euo pipefail
out="${1:?OUT_DIR}"; shift
paths=("${@:-default}")
cd "$(dirname "$0")/.."
for p in "${paths[@]}"; do
    d="$out/$p"; mkdir -p "$d"
    if [ "$p" = default ]; then unset SPECDEC_KERNELS; else export SPECDEC_KERNELS="$p"; fi
    unset SPECDEC_PASS_COSTS SPECDEC_CALIBRATE
    python benchmarks/specbench.py --per-category "${PER_CATEGORY:-3}" --max-tokens 96 --methods plain,defaults --out "$d"
    python benchmarks/defaults.py --configs plain defaults --n-predict 128 --prompts "${PROMPTS:-3}" --out "$d"
    python benchmarks/predicted.py --configs plain "prompt lookup" prediction --prompts 2 --n-predict 200 \
        --n-predict-large 200 --out "$d"
    { /usr/bin/time -f "%e" specdec run -md qwen2.5-coder-0.5b-instruct -p "Write a quicksort in Python." -n 128 \
        --compare > "$d/readme_run.txt" 2> "$d/readme_run.err"; } || true
done
