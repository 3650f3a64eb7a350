#!/usr/bin/env bash
# Issue 43's GPU rows in one device call: nopad beside llama.cpp CUDA on the same random GGUF
# files, and the quantized GEMV of this build against another (an A/B), as time allows.
#
# Here (the carry: ~37.5 MiB of tracked files + the two bundles, under 64 MiB):
#   BLAS_STUB=1 TESTS="test_cuda_quant" BENCHES="gemv_bench" scripts/gpu_decoder.sh --stage build-cuda
#       (~7 MB: OpenBLAS left out for a stub, BLAS_STUB in gpu_decoder.sh)
#   bench/llamacpp_gpu.sh --stage /tmp/lcp-cuda      (~17 MB: llama-bench, -batched-bench, -quantize)
#   scripts/gpu_quant_peer.sh --stage [OTHER_GEMV_BENCH]
#       adds another build's gemv_bench to the bundle as gemv_old (the three binaries share most of
#       their code, so xz with a 192 MiB window adds ~0.1 MB), for the A/B below
# There (carry [".gpu_carry/dec", ".gpu_carry/lcp"]):
#   DEADLINE=420 scripts/gpu_quant_peer.sh --run
#   in this order, each step only while DEADLINE seconds (default 520) are not spent:
#   1. test_cuda_quant;
#   2. gemv_bench --format q4_1 and q4_k at 1, 8, 32 tokens, this build and gemv_old alternated
#      (when carried), then the fp16 gemv;
#   3. for each "shape quant" of PAIRS (default "smollm2 Q4_1" "llama1b Q4_K_M"): llama.cpp's
#      models and bench steps (bench/llamacpp_gpu.sh: the random GGUF file, llama-bench pp512 and
#      tg128), then nopad's decode step on that file (gpu_decoder.sh quant-peer: native and f16,
#      batch 1, 8, 32, 64 at context 512, 2 rounds);
#   4. llama-batched-bench on the last pair's file.
#   $OUT gets run.log, dec.tar.gz (nopad's JSON and logs) and llama.cpp's three files in lcp/.
set -u
ROOT=$(cd "$(dirname "$0")/.." && pwd)
if [ "${1:-}" = "--stage" ]; then
    bundle=$ROOT/.gpu_carry/dec/bundle.tar.xz
    [ -f "$bundle" ] || { echo "no $bundle: gpu_decoder.sh --stage first" >&2; exit 1; }
    [ -n "${2:-}" ] || exit 0
    t=$(mktemp -d) && trap 'rm -rf "$t"' EXIT
    tar xJf "$bundle" -C "$t" && cp "$2" "$t/build/gemv_old" &&
        (cd "$t" && tar cf - build | xz -9e --lzma2=preset=9e,dict=192MiB -T1 > "$bundle") || exit 1
    ls -la "$bundle"
    exit 0
fi
[ "${1:-}" = "--run" ] || { echo "usage: gpu_quant_peer.sh --stage [OTHER_GEMV_BENCH] | --run" >&2; exit 2; }
T0=$(date +%s)
left() { echo $((${DEADLINE:-520} - ($(date +%s) - T0))); }
OUT=${OUT:-$ROOT/gpu_quant_peer_out}
D=/tmp/quant_peer
mkdir -p "$OUT/lcp" "$D" /tmp/nopad_dec
exec > >(tee "$OUT/run.log") 2>&1
trap 'tar czf "$OUT/dec.tar.gz" -C "$D" . 2>/dev/null' EXIT
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv
git -C "$ROOT" log -1 --format='%h %s' 2>/dev/null
rm -rf /tmp/nopad_dec/build && tar xJf "$ROOT/.gpu_carry/dec/bundle.tar.xz" -C /tmp/nopad_dec || exit 1
B=/tmp/nopad_dec/build
(
    export LD_LIBRARY_PATH=$B/deplibs NOPAD_TEST_DATA=$ROOT/tests/data
    echo "== test_cuda_quant ($(left) s left)"
    timeout 90 "$B/tests/test_cuda_quant" > "$D/test_cuda_quant.log" 2>&1
    echo "test_cuda_quant: exit $?"
    tail -n 3 "$D/test_cuda_quant.log"
    builds=new
    [ -x "$B/gemv_old" ] && builds="new old"
    for round in 1 2; do
        for fmt in q4_1 q4_k; do
            for v in $builds; do
                [ "$(left)" -gt 300 ] || continue
                bin=$B/gemv_bench
                [ $v = old ] && bin=$B/gemv_old
                timeout 40 "$bin" --format $fmt --tokens 1,8,32 >> "$D/gemv_${fmt}_$v.jsonl" 2>&1
                echo "gemv $fmt $v round $round: $(grep -o '"mode": "chain", "tokens": [0-9]*.*"us": [0-9.]*' \
                    "$D/gemv_${fmt}_$v.jsonl" | sed 's/"dtype.*"us"//' | tail -n 3 | tr '\n' ' ')"
            done
        done
    done
    timeout 40 "$B/gemv_bench" --tokens 1,8,32 > "$D/gemv_f16.jsonl" 2>&1
)
pairs=("smollm2 Q4_1" "llama1b Q4_K_M")
[ -n "${PAIRS:-}" ] && IFS=';' read -r -a pairs <<< "$PAIRS" # e.g. PAIRS="smollm2 Q8_0;llama1b Q4_K_M"
for sq in "${pairs[@]}"; do
    set -- $sq
    [ "$(left)" -gt 60 ] || break
    echo "== llama.cpp $sq ($(left) s left)"
    OUT=$OUT/lcp SHAPES=$1 QUANTS=$2 timeout $(($(left) - 40)) bash "$ROOT/bench/llamacpp_gpu.sh" --run models bench
    [ "$(left)" -gt 30 ] || break
    echo "== nopad $sq ($(left) s left)"
    OUT=$D SHAPES=$1 QUANTS=$2 timeout $(($(left) - 10)) env KEEP_UNPACKED=1 QUANT_ARGS="--rounds 2" \
        bash "$ROOT/scripts/gpu_decoder.sh" --run quant-peer
done
if [ "$(left)" -gt 100 ]; then
    echo "== llama-batched-bench $sq ($(left) s left)"
    OUT=$OUT/lcp SHAPES=$1 QUANTS=$2 timeout $(($(left) - 10)) bash "$ROOT/bench/llamacpp_gpu.sh" --run batched
fi
echo "done ($(left) s left)"
