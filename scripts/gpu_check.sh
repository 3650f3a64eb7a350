#!/usr/bin/env bash
# The one script for the GPU machine: GPU tests, compute-sanitizer, then the FMHA benchmark.
#
# The build folder is made on the development machine (nvcc builds sm_90a without a GPU):
#   cmake -S . -B build-cuda -DNOPAD_CUDA=ON -DCMAKE_BUILD_TYPE=Release
#   cmake --build build-cuda -j --target test_cuda_attention nopad_shared
#   scripts/gpu_check.sh --stage build-cuda      # copies the Debian libraries the binaries need
# and carried to the GPU machine (device tool: carry build-cuda/tests, build-cuda/libnopad.so,
# build-cuda/CTestTestfile.cmake, build-cuda/deplibs). There:
#   scripts/gpu_check.sh build-cuda [test|sanitize|bench|all]...
# Logs go to $OUT (or ./gpu_check_out). Env: BENCH_ARGS (extra fmha_bench.py arguments),
# NOPAD_GPU_TEST_QUICK (the sanitizer runs set it to 1).
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)

if [ "${1:-}" = "--stage" ]; then
    # Copy the non-base shared libraries (openblas, cjson, utf8proc, cmocka, gfortran, ...) that
    # the GPU machine's image may lack. libc/libstdc++/libgcc stay the system's: torch shares them.
    B=${2:?build folder}
    mkdir -p "$B/deplibs"
    for bin in "$B/libnopad.so" "$B/tests/test_cuda_attention"; do
        ldd "$bin" | awk '/=> \//{print $3}'
    done | sort -u | grep -Ev '/(libc|libm|libstdc\+\+|libgcc_s|libpthread|libdl|librt|ld-linux[^/]*)\.so' |
        while read -r lib; do cp -L "$lib" "$B/deplibs/"; done
    ls -la "$B/deplibs"
    exit 0
fi

BUILD=$(cd "${1:?usage: gpu_check.sh BUILD_DIR [test|sanitize|bench|all]...}" && pwd)
shift
STEPS=${*:-all}
OUTDIR=${OUT:-$ROOT/gpu_check_out}
mkdir -p "$OUTDIR"
TEST=$BUILD/tests/test_cuda_attention

# Debian libraries from the build machine, but only those this machine lacks (gomp is kept apart
# so a system libgomp, if present, wins).
if [ -d "$BUILD/deplibs" ]; then
    mkdir -p /tmp/nopad_deplibs
    for f in "$BUILD"/deplibs/*.so*; do
        name=$(basename "$f")
        ldconfig -p | grep -q " $name " || cp -L "$f" /tmp/nopad_deplibs/
    done
    export LD_LIBRARY_PATH=/tmp/nopad_deplibs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
    echo "libraries taken from the build machine: $(ls /tmp/nopad_deplibs | tr '\n' ' ')"
fi

nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv | tee "$OUTDIR/gpu.txt"
date -u | tee -a "$OUTDIR/gpu.txt"
status=0

want() { [[ " $STEPS " == *" all "* || " $STEPS " == *" $1 "* ]]; }

if want test; then
    # ctest's files name absolute paths of the build machine: make them resolve here.
    src=$(grep -m1 '^# Source directory:' "$BUILD/CTestTestfile.cmake" | sed 's/^# Source directory: //')
    bld=$(grep -m1 '^# Build directory:' "$BUILD/CTestTestfile.cmake" | sed 's/^# Build directory: //')
    if [ -n "$src" ] && [ ! -e "$src" ]; then mkdir -p "$(dirname "$src")" && ln -s "$ROOT" "$src"; fi
    if [ -n "$bld" ] && [ ! -e "$bld" ]; then mkdir -p "$(dirname "$bld")" && ln -s "$BUILD" "$bld"; fi
    (cd "$bld" 2>/dev/null || cd "$BUILD"; ctest -L gpu --output-on-failure -V) 2>&1 | tee "$OUTDIR/gpu_tests.log"
    [ "${PIPESTATUS[0]}" = 0 ] || status=1
    # d=64/128 have several kernels (wgmma pipelined or plain, lazy or exact rescaling, mma.sync): test all
    # (FA3 kernel forced for every d=64 length, and its variants)
    for setting in NOPAD_FMHA_FA3=1 "NOPAD_FMHA_FA3=1 NOPAD_FMHA_FA3_PERSIST=0" \
        "NOPAD_FMHA_FA3=1 NOPAD_FMHA_FA3_WG=2 NOPAD_FMHA_FA3_STAGES=3 NOPAD_FMHA_FA3_PINGPONG=0" \
        "NOPAD_FMHA_FA3=1 NOPAD_FMHA_RESCALE=0" \
        NOPAD_FMHA_FA3=0 NOPAD_FMHA_WG_PIPE=0 NOPAD_FMHA_RESCALE=0 NOPAD_FMHA_WGMMA=0; do
        echo "## $setting" | tee -a "$OUTDIR/gpu_tests.log"
        env $setting "$TEST" 2>&1 | tee -a "$OUTDIR/gpu_tests.log"
        [ "${PIPESTATUS[0]}" = 0 ] || status=1
    done
    command -v cuobjdump >/dev/null && echo "SASS of libnopad.so: $(cuobjdump --dump-sass "$BUILD/libnopad.so" |
        grep -oE 'HGMMA|HMMA' | sort | uniq -c | tr '\n' ' ')" | tee -a "$OUTDIR/gpu_tests.log"
fi

if want sanitize; then
    for tool in memcheck racecheck; do
        NOPAD_GPU_TEST_QUICK=1 compute-sanitizer --tool $tool --error-exitcode 3 "$TEST" 2>&1 |
            tail -n 60 | tee "$OUTDIR/sanitizer_$tool.log"
        rc=${PIPESTATUS[0]}
        echo "compute-sanitizer --tool $tool: exit $rc" | tee -a "$OUTDIR/sanitizer_$tool.log"
        [ "$rc" = 0 ] || status=1
        # the FA3 kernel (TMA, mbarriers) at every quick shape, d=64
        NOPAD_FMHA_FA3=1 NOPAD_GPU_TEST_QUICK=1 NOPAD_GPU_TEST_D=64 compute-sanitizer --tool $tool --error-exitcode 3 "$TEST" 2>&1 |
            tail -n 60 | tee "$OUTDIR/sanitizer_${tool}_fa3.log"
        rc=${PIPESTATUS[0]}
        echo "compute-sanitizer --tool $tool (NOPAD_FMHA_FA3=1): exit $rc" | tee -a "$OUTDIR/sanitizer_${tool}_fa3.log"
        [ "$rc" = 0 ] || status=1
    done
fi

if want bench; then
    PYTHONUNBUFFERED=1 python3 "$ROOT/bench/fmha_bench.py" --lib "$BUILD/libnopad.so" --out "$OUTDIR" \
        ${BENCH_ARGS:-} 2>&1 | tee "$OUTDIR/bench.log"
    [ "${PIPESTATUS[0]}" = 0 ] || status=1
fi
if want sweep; then
    # tile-shape sweep of nopad alone (varlen_attn as the yardstick), one log for all settings.
    # SWEEP_SETTINGS: space-separated settings, each a comma-separated list of VAR=value.
    SETTINGS=${SWEEP_SETTINGS:-"NOPAD_FMHA_WG_PIPE=0,NOPAD_FMHA_WG_M=64 NOPAD_FMHA_WG_PIPE=0,NOPAD_FMHA_WG_M=128 NOPAD_FMHA_WG_PIPE=1,NOPAD_FMHA_WG_M=64 NOPAD_FMHA_WG_PIPE=1,NOPAD_FMHA_WG_M=128"}
    for setting in $SETTINGS; do
        echo "## $setting"
        env ${setting//,/ } PYTHONUNBUFFERED=1 python3 "$ROOT/bench/fmha_bench.py" \
            --lib "$BUILD/libnopad.so" --out /tmp/sweep --only-nopad --reps 15 \
            --points "${SWEEP_POINTS:-16x64,128x128,16x512,128x512,8x2048,128x1024}" --d "${SWEEP_D:-64}" \
            2>&1 | grep -E '^\||Error|error'
    done 2>&1 | tee "$OUTDIR/sweep.log"
fi

echo "gpu_check: exit $status"
exit $status
