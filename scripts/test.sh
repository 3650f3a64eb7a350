#!/usr/bin/env bash
# Builds and runs every test: the default model and decoder GGUF are fetched once, then
#   1. release build + ctest (unit, golden, real-model, CLI tests) + the Python package's pytest,
#   2. AddressSanitizer + UBSan build + ctest,
#   3. libFuzzer targets, each for NOPAD_FUZZ_SECONDS (default 25 s; >= 60 s in all),
#   4. where nvcc is installed: the CUDA build (sm_90a) compiles, and its GPU tests run or, with no
#      GPU present, report themselves skipped (the GPU machine runs them: scripts/gpu_check*.sh).
# Usage: scripts/test.sh [--quick]   (--quick: step 1 only)
set -euo pipefail
cd "$(dirname "$0")/.."
JOBS=${JOBS:-$(nproc)}
QUICK=0
[ "${1:-}" = "--quick" ] && QUICK=1

NOPAD_MINILM_DIR=$(scripts/fetch_default_model.sh)
export NOPAD_MINILM_DIR
NOPAD_SMOLLM2_GGUF=$(scripts/fetch_default_decoder.sh)
export NOPAD_SMOLLM2_GGUF

echo "== release build and tests"
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j "$JOBS"
ctest --test-dir build --output-on-failure -j "$JOBS"
echo "== Python package tests (build/libnopad.so)"
NOPAD_LIBRARY=build/libnopad.so NOPAD_CLI=build/nopad python3 -m pytest -q tests/python
[ "$QUICK" = 1 ] && exit 0

echo "== AddressSanitizer + UndefinedBehaviorSanitizer build and tests"
cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=Debug -DNOPAD_SANITIZE=ON >/dev/null
cmake --build build-asan -j "$JOBS"
# OpenMP's runtime keeps thread pools alive at exit; those are not our leaks.
ASAN_OPTIONS=detect_leaks=1 LSAN_OPTIONS=suppressions=$PWD/scripts/lsan.supp \
UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
    ctest --test-dir build-asan --output-on-failure -j "$JOBS"

echo "== fuzzing"
CC=clang cmake -S . -B build-fuzz -DCMAKE_BUILD_TYPE=RelWithDebInfo -DNOPAD_FUZZ=ON >/dev/null
cmake --build build-fuzz -j "$JOBS"
SECONDS_EACH=${NOPAD_FUZZ_SECONDS:-25}
for fuzzer in build-fuzz/fuzz_*; do
    name=$(basename "$fuzzer")
    corpus=fuzz/corpus/${name#fuzz_}
    work=$(mktemp -d)
    echo "-- $name for ${SECONDS_EACH}s (seeds: $corpus)"
    "$fuzzer" -max_total_time="$SECONDS_EACH" -timeout=10 -rss_limit_mb=2048 \
        -artifact_prefix="$work/" -print_final_stats=1 "$work" "$corpus" 2>&1 | tail -n 12
    rm -rf "$work"
done
if command -v nvcc >/dev/null 2>&1 || [ -x /usr/local/cuda/bin/nvcc ]; then
    echo "== CUDA build (GPU tests skip without a GPU)"
    cmake -S . -B build-cuda -DCMAKE_BUILD_TYPE=Release -DNOPAD_CUDA=ON >/dev/null
    cmake --build build-cuda -j "$JOBS"
    ctest --test-dir build-cuda --output-on-failure -L gpu
fi
echo "== all tests passed"
