#!/usr/bin/env bash
# The GPU machine's check of Flux's fused kernels (issue 40), in one device call: test_cuda_flux
# (emulated peers) and tools/flux_bench (the FLUX table of bench/RESULTS.md).
#
# Here:  scripts/gpu_flux.sh --stage BUILD
#        BUILD is a CUDA build (cmake -DNOPAD_CUDA=ON -DNOPAD_MPI=OFF) with the targets test_cuda_flux
#        and flux_bench built; writes .gpu_carry/flux/bundle.tar.xz: the two binaries (they link the
#        static library) and the Debian libraries ldd shows beyond libc, libstdc++ and CUDA's
#        (cuBLASLt is in the CUDA toolkit there); ~15 MB.
# There: scripts/gpu_flux.sh --run [steps]     (carry [".gpu_carry/flux"])
#        steps: info (the GPU, its driver and clocks as they are: nothing is changed), test
#        (test_cuda_flux), bench (flux_bench, fp16, LLaMA-3-8B/70B x T 1024/4096/16384 x tp 2/4/8;
#        its delayed runs leave the emulated arrivals' CTA an SM: the persistent grid on SMs - 1),
#        bench-bf16 (the same at T 4096), bench-fullgrid (fp16 at T 4096 and 16384, the delayed runs
#        on the full grid as before 2026-12-07d: the emulation's artefact, beside bench's default in
#        the same build), quick (flux_bench at T 4096, tp 8 only);
#        default "info test bench bench-bf16". FLUX_ARGS appends to every flux_bench run; the test
#        is stopped after TEST_TIMEOUT seconds (default 300), so a broken kernel leaves the call
#        time for the benchmark.
#        Logs and JSON to $OUT (flux_<date>_<gpu>_<dtype>.json).
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
CARRY="$ROOT/.gpu_carry/flux"

if [ "${1:-}" = "--stage" ]; then
    B=$(cd "${2:?usage: gpu_flux.sh --stage BUILD}" && pwd)
    stage=$(mktemp -d)
    trap 'rm -rf "$stage"' EXIT
    mkdir -p "$stage/build/deplibs" "$CARRY"
    rm -f "$CARRY"/*
    bins=("$B/tests/test_cuda_flux" "$B/flux_bench")
    for bin in "${bins[@]}"; do [ -f "$bin" ] || { echo "missing $bin" >&2; exit 1; }; done
    for bin in "${bins[@]}"; do ldd "$bin" | awk '/=> \//{print $3}'; done | sort -u |
        grep -Ev '/(libc|libm|libstdc\+\+|libgcc_s|libpthread|libdl|librt|ld-linux[^/]*|libcublasLt|libcublas)\.so' |
        while read -r lib; do cp -L "$lib" "$stage/build/deplibs/"; done
    cp "${bins[@]}" "$stage/build/"
    git -C "$ROOT" rev-parse --short HEAD > "$stage/build/commit"
    # xz -9e: its 64 MiB window finds the code the binaries share (each links the library's
    # kernels), so seven test binaries and the library pack into ~6 MB, not ~45
    (cd "$stage" && tar cf - build | xz -9e -T1 > "$CARRY/bundle.tar.xz")
    ls -la "$CARRY"
    exit 0
fi

[ "${1:-}" = "--run" ] || { echo "usage: gpu_flux.sh --stage BUILD | --run [steps]" >&2; exit 2; }
shift
STEPS=${*:-info test bench bench-bf16}
OUT=${OUT:-$ROOT/gpu_flux_out}
mkdir -p "$OUT" /tmp/nopad_flux
if [ -f "$CARRY/bundle.tar.xz" ]; then
    rm -rf /tmp/nopad_flux/build && tar xJf "$CARRY/bundle.tar.xz" -C /tmp/nopad_flux
fi
[ -d /tmp/nopad_flux/build ] || { echo "no bundle: carry .gpu_carry/flux first" >&2; exit 1; }
BUILD=/tmp/nopad_flux/build
export LD_LIBRARY_PATH=$BUILD/deplibs:/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export NCCL_NVLS_ENABLE=0 # NVLink multicast stays off on the shared machines (nothing here uses NCCL)
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1 | tr -c 'A-Za-z0-9\n' '_' | sed 's/_*$//')
tag="$(date -u +%Y-%m-%d)_${gpu:-gpu}"
status=0
for step in $STEPS; do
    echo "=== $step ($(date -u +%H:%M:%S)) ==="
    case $step in
    info)
        echo "bundle built from $(cat "$BUILD/commit")"
        nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm,power.limit --format=csv
        nvidia-smi topo -m 2>/dev/null | head -5
        ;;
    test)
        timeout "${TEST_TIMEOUT:-300}" "$BUILD/test_cuda_flux" 2>&1 | tee "$OUT/test_flux_$tag.log" || status=1
        ;;
    bench)
        "$BUILD/flux_bench" --json "$OUT/flux_${tag}_f16.json" ${FLUX_ARGS:-} 2>&1 | tee "$OUT/flux_${tag}_f16.log" ||
            status=1
        ;;
    bench-bf16)
        "$BUILD/flux_bench" --dtype bf16 --tokens 4096 --json "$OUT/flux_${tag}_bf16.json" ${FLUX_ARGS:-} 2>&1 |
            tee "$OUT/flux_${tag}_bf16.log" || status=1
        ;;
    bench-fullgrid)
        # fp16 at T 4096 and 16384 with the delayed runs' persistent grid on every SM (the arrivals
        # CTA then waits for one: docs/parallel.md), to set beside bench's default (SMs - 1)
        "$BUILD/flux_bench" --delayed-ctas 0 --tokens 4096,16384 --json "$OUT/flux_${tag}_f16_fullgrid.json" \
            ${FLUX_ARGS:-} 2>&1 | tee "$OUT/flux_${tag}_f16_fullgrid.log" || status=1
        ;;
    quick)
        "$BUILD/flux_bench" --tokens 4096 --tp 8 ${FLUX_ARGS:-} 2>&1 | tee "$OUT/flux_${tag}_quick.log" || status=1
        ;;
    *)
        echo "unknown step $step" >&2
        status=2
        ;;
    esac
done
exit $status
