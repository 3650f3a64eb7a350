#!/usr/bin/env bash
# Builds and runs every test. The default model and decoder GGUF are fetched once, then:
#   1. release build + ctest (unit, golden, real-model, CLI tests) + the Python package's pytest,
#   2. AddressSanitizer + UBSan build + ctest,
#   3. libFuzzer targets, each for NOPAD_FUZZ_SECONDS (default 25 s; >= 60 s in all),
#   4. the CUDA build (sm_90a), where `nvidia-smi -L` finds a GPU or with --cuda: it compiles, and
#      its GPU tests run or, with no GPU present, report themselves skipped (the GPU machine runs
#      them: scripts/gpu_check*.sh).
# Each stage prints a header with the time since the start; ctest prints "n/N Test #k" as each
# test ends, and while tests run, a line a minute names those still running.
set -euo pipefail
cd "$(dirname "$0")/.."

usage() {
    cat <<'EOF'
usage: scripts/test.sh [--quick] [--cuda] [--long] [--verbose]
  --quick    the release build's ctest and pytest only: no sanitizer build, no fuzzing, no CUDA
             build
  --cuda     compile the CUDA build even where no GPU is present (needs nvcc; CI passes it);
             without it the CUDA build is compiled only where `nvidia-smi -L` lists a GPU
             and nvcc is installed
  --long     long fuzzing: the tokenizer parity on 100,000 random strings a tokenizer instead of
             10,000, and each fuzzer for 300 s instead of 25 s
  --verbose  ctest -V: every test's output as it runs (the default shows a test's output only
             when it fails)
environment: JOBS (parallel jobs, default the number of cores), NOPAD_FUZZ_SECONDS (seconds a
fuzzer, overrides the default and --long), NOPAD_RANDOM_STRINGS (random strings a tokenizer)
EOF
}

QUICK=0 CUDA=0 LONG=0 VERBOSE=0
for arg in "$@"; do
    case "$arg" in
    --quick) QUICK=1 ;;
    --cuda) CUDA=1 ;;
    --long) LONG=1 ;;
    --verbose) VERBOSE=1 ;;
    -h | --help) usage; exit 0 ;;
    *) echo "scripts/test.sh: unknown option '$arg'" >&2; usage >&2; exit 2 ;;
    esac
done
JOBS=${JOBS:-$(nproc)}
if [ "$LONG" = 1 ]; then
    export NOPAD_RANDOM_STRINGS=${NOPAD_RANDOM_STRINGS:-100000}
    FUZZ_SECONDS=${NOPAD_FUZZ_SECONDS:-300}
else
    FUZZ_SECONDS=${NOPAD_FUZZ_SECONDS:-25}
fi
CTEST_OUTPUT=(--output-on-failure)
[ "$VERBOSE" = 1 ] && CTEST_OUTPUT=(-V)

# The CUDA build takes long on few cores and its tests need a GPU: by default only where one is.
NVCC=$(command -v nvcc || { [ -x /usr/local/cuda/bin/nvcc ] && echo /usr/local/cuda/bin/nvcc; } || true)
HAVE_GPU=0
nvidia-smi -L 2>/dev/null | grep -q '^GPU ' && HAVE_GPU=1
if [ "$CUDA" = 1 ] && [ -z "$NVCC" ]; then
    echo "scripts/test.sh: --cuda: the CUDA build needs nvcc, which is neither on PATH nor in" \
        "/usr/local/cuda/bin" >&2
    exit 2
fi
BUILD_CUDA=0
if [ "$QUICK" = 0 ] && { [ "$CUDA" = 1 ] || { [ "$HAVE_GPU" = 1 ] && [ -n "$NVCC" ]; }; }; then
    BUILD_CUDA=1
fi
STAGES=4
[ "$QUICK" = 1 ] && STAGES=2
[ "$BUILD_CUDA" = 1 ] && STAGES=5

START=$SECONDS
clock() { printf '%d:%02d' $(((SECONDS - START) / 60)) $(((SECONDS - START) % 60)); }
stage_no=0
stage() {
    stage_no=$((stage_no + 1))
    echo
    echo "== [$stage_no/$STAGES, $(clock)] $*"
}

HEARTBEAT=
trap '[ -n "$HEARTBEAT" ] && kill "$HEARTBEAT" 2>/dev/null; true' EXIT
# run_ctest DIR ARGS...: ctest on DIR; meanwhile a line a minute names the tests still running
# (those with a "Start" line and no result line yet in ctest's output) and for how many minutes.
run_ctest() {
    local dir="$1" log rc=0
    shift
    log=$(mktemp)
    (
        declare -A seen  # test -> $SECONDS at the first line that found it running
        while sleep 60 </dev/null >/dev/null 2>&1; do  # sleep holds no pipe open past the end
            line=
            for t in $(awk '$1 == "Start" { run[$3] = 1 } $2 == "Test" { delete run[$4] }
                            END { for (t in run) print t }' "$log"); do
                # a test started in the minute before the line that first found it running
                seen[$t]=${seen[$t]:-$SECONDS}
                line+=" $t (<$(((SECONDS - seen[$t]) / 60 + 1)) min)"
            done
            [ -n "$line" ] && echo "   ... $(clock) still running:$line"
        done
    ) &
    HEARTBEAT=$!
    ctest --test-dir "$dir" "${CTEST_OUTPUT[@]}" "$@" 2>&1 | tee "$log" || rc=$?
    kill "$HEARTBEAT" 2>/dev/null || true
    wait "$HEARTBEAT" 2>/dev/null || true
    HEARTBEAT=
    rm -f "$log"
    return "$rc"
}

echo "== scripts/test.sh: $STAGES stages, $JOBS jobs$([ "$QUICK" = 1 ] && echo ", --quick")$(
    [ "$LONG" = 1 ] && echo ", --long")"
NOPAD_MINILM_DIR=$(scripts/fetch_default_model.sh)
export NOPAD_MINILM_DIR
NOPAD_SMOLLM2_GGUF=$(scripts/fetch_default_decoder.sh)
export NOPAD_SMOLLM2_GGUF

stage "release build and ctest"
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j "$JOBS"
run_ctest build -j "$JOBS"
stage "Python package tests (build/libnopad.so)"
NOPAD_LIBRARY=build/libnopad.so NOPAD_CLI=build/nopad python3 -m pytest -q tests/python
if [ "$QUICK" = 1 ]; then
    echo
    echo "== quick tests passed in $(clock) (not run: sanitizers, fuzzing, the CUDA build)"
    exit 0
fi

stage "AddressSanitizer + UndefinedBehaviorSanitizer build and ctest"
cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=Debug -DNOPAD_SANITIZE=ON >/dev/null
cmake --build build-asan -j "$JOBS"
# OpenMP's runtime keeps thread pools alive at exit; those are not our leaks.
ASAN_OPTIONS=detect_leaks=1 LSAN_OPTIONS=suppressions=$PWD/scripts/lsan.supp \
UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
    run_ctest build-asan -j "$JOBS"

stage "fuzzing, ${FUZZ_SECONDS} s a target"
CC=clang cmake -S . -B build-fuzz -DCMAKE_BUILD_TYPE=RelWithDebInfo -DNOPAD_FUZZ=ON >/dev/null
cmake --build build-fuzz -j "$JOBS"
fuzzers=(build-fuzz/fuzz_*)
i=0
for fuzzer in "${fuzzers[@]}"; do
    i=$((i + 1))
    name=$(basename "$fuzzer")
    corpus=fuzz/corpus/${name#fuzz_}
    work=$(mktemp -d)
    echo "-- $i/${#fuzzers[@]} $name for ${FUZZ_SECONDS} s (seeds: $corpus, $(clock))"
    "$fuzzer" -max_total_time="$FUZZ_SECONDS" -timeout=10 -rss_limit_mb=2048 \
        -artifact_prefix="$work/" -print_final_stats=1 "$work" "$corpus" 2>&1 | tail -n 12
    rm -rf "$work"
done

if [ "$BUILD_CUDA" = 1 ]; then
    stage "CUDA build ($([ "$HAVE_GPU" = 1 ] && echo "GPU tests run" || echo "--cuda: no GPU, its tests skip"))"
    cmake -S . -B build-cuda -DCMAKE_BUILD_TYPE=Release -DNOPAD_CUDA=ON >/dev/null
    cmake --build build-cuda -j "$JOBS"
    run_ctest build-cuda -L gpu  # one at a time: they share the GPU
elif [ "$HAVE_GPU" = 1 ]; then
    echo
    echo "== CUDA build skipped: a GPU but no nvcc (neither on PATH nor in /usr/local/cuda/bin)"
else
    echo
    echo "== CUDA build skipped: no GPU (nvidia-smi -L lists none); --cuda compiles it anyway"
fi
echo
echo "== all tests passed in $(clock)"
