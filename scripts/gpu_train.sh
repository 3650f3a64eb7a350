#!/usr/bin/env bash
# The GPU machine's check of training (issue 24), in one device call: the CUDA training op tests
# against the CPU ops, the attention backward against torch autograd, a whole bf16 step against
# the CPU's float32 step on random BERT checkpoints (head sizes 32, 64, 128), and the TRAIN
# benchmark against HF BertForMaskedLM (bench/train_bench.py).
#
# Here:  scripts/gpu_train.sh --stage BUILD      (a CUDA build: cmake -DNOPAD_CUDA=ON)
#        writes .gpu_carry/train/bundle.tar.xz (test binaries, train_bench, the Debian libraries)
# There: scripts/gpu_train.sh --run [steps]      (carry [".gpu_carry/train"])
#        steps: test (every CUDA training test + the torch check), bench (TRAIN workload;
#        TRAIN_ARGS appends, e.g. "--shapes large"); default "test". Logs and JSON to $OUT.
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
CARRY="$ROOT/.gpu_carry/train"
TESTS=(test_cuda_train_ops test_cuda_train_gemm_optim test_cuda_attention_backward test_cuda_train_step)

if [ "${1:-}" = "--stage" ]; then
    B=$(cd "${2:?usage: gpu_train.sh --stage BUILD}" && pwd)
    stage=$(mktemp -d)
    trap 'rm -rf "$stage"' EXIT
    mkdir -p "$stage/build/tests" "$stage/build/deplibs" "$CARRY"
    rm -f "$CARRY"/*
    bins=("$B/train_bench")
    for t in "${TESTS[@]}"; do bins+=("$B/tests/$t"); done
    for bin in "${bins[@]}"; do [ -f "$bin" ] || { echo "missing $bin" >&2; exit 1; }; done
    for bin in "${bins[@]}"; do ldd "$bin" | awk '/=> \//{print $3}'; done | sort -u |
        grep -Ev '/(libc|libm|libstdc\+\+|libgcc_s|libpthread|libdl|librt|ld-linux[^/]*|libcublasLt|libcublas)\.so' |
        while read -r lib; do cp -L "$lib" "$stage/build/deplibs/"; done
    cp "$B/train_bench" "$stage/build/"
    for t in "${TESTS[@]}"; do cp "$B/tests/$t" "$stage/build/tests/"; done
    (cd "$stage" && tar cJf "$CARRY/bundle.tar.xz" build)
    ls -la "$CARRY"
    exit 0
fi

[ "${1:-}" = "--run" ] || { echo "usage: gpu_train.sh --stage BUILD | --run [steps]" >&2; exit 2; }
shift
STEPS=${*:-test}
OUT=${OUT:-$ROOT/gpu_train_out}
mkdir -p "$OUT" /tmp/nopad_train
if [ -f "$CARRY/bundle.tar.xz" ]; then
    rm -rf /tmp/nopad_train/build && tar xJf "$CARRY/bundle.tar.xz" -C /tmp/nopad_train
fi
[ -d /tmp/nopad_train/build ] || { echo "no bundle: carry .gpu_carry/train first" >&2; exit 1; }
BUILD=/tmp/nopad_train/build
export LD_LIBRARY_PATH=$BUILD/deplibs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export NOPAD_TEST_DATA=$ROOT/tests/data
status=0
{
    date -u
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
    git -C "$ROOT" log -1 --format='%h %s' 2>/dev/null
} | tee "$OUT/env.txt"

for step in $STEPS; do
    case $step in
    test)
        # random BERT checkpoints: head size 32 (128 / 4), 64 (256 / 4) and 128 (256 / 2)
        M=/tmp/nopad_train/models
        models=""
        for spec in "h32 128 4" "h64 256 4" "h128 256 2"; do
            set -- $spec
            python3 "$ROOT/scripts/make_random_bert.py" "$M/$1" --hidden "$2" --heads "$3" --layers 2 > /dev/null || status=1
            models="${models:+$models:}$M/$1"
        done
        export NOPAD_TRAIN_GPU_MODELS=$models
        mkdir -p "$OUT/attn_bwd_dump"
        for t in "${TESTS[@]}"; do
            echo "== $t"
            (cd "$ROOT" && NOPAD_ATTN_BWD_DUMP=$OUT/attn_bwd_dump timeout 400 "$BUILD/tests/$t") > "$OUT/$t.log" 2>&1
            rc=$?
            tail -5 "$OUT/$t.log"
            echo "$t: exit $rc"
            [ $rc -eq 0 ] || status=1
        done
        if [ -f "$ROOT/scripts/torch_attention_backward_check.py" ]; then
            echo "== torch attention backward check"
            timeout 300 python3 "$ROOT/scripts/torch_attention_backward_check.py" "$OUT/attn_bwd_dump" 2>&1 |
                tee "$OUT/torch_attention_backward_check.log" | tail -15
            [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
            rm -rf "$OUT/attn_bwd_dump"
        fi
        # training attention timings, both variants of the NOPAD_TRAIN_ATTN A/B (forward with lse and
        # backward; BERT-large and BERT-base shapes)
        echo "== attention forward/backward timings"
        NOPAD_ATTN_BWD_BENCH=1 timeout 120 "$BUILD/tests/test_cuda_attention_backward" 2>&1 |
            tee "$OUT/attn_bwd_bench.log" | grep -v "^device"
        [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
        ;;
    bench)
        mkdir -p "$OUT/train"
        timeout 590 python3 "$ROOT/bench/train_bench.py" --train-bench "$BUILD/train_bench" \
            --out "$OUT/train" ${TRAIN_ARGS:-} 2>&1 | grep -v Warning | tee "$OUT/train/train.log" || status=1
        ;;
    *) echo "unknown step $step" && status=1 ;;
    esac
done
exit $status
