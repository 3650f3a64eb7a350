#!/usr/bin/env bash
# The GPU machine's check of training (issue 24), in one device call: the CUDA training op tests
# against the CPU ops, the attention backward against torch autograd, a whole bf16 step against
# the CPU's float32 step on random BERT checkpoints (head sizes 32, 64, 128), and the TRAIN
# benchmark against HF BertForMaskedLM (bench/train_bench.py).
#
# Here:  scripts/gpu_train.sh --stage BUILD      (a CUDA build: cmake -DNOPAD_CUDA=ON)
#        writes .gpu_carry/train/bundle.tar.xz (test binaries, train_bench, the Debian libraries)
# There: scripts/gpu_train.sh --run [steps]      (carry [".gpu_carry/train"])
#        steps: test (every CUDA training test + the torch check), cli (nopad train --device cuda
#        against the CPU's run of the same command), dp1 (issue 41: the data-parallel path at world
#        size one against the plain run, bench/train_scaling.sh with GPUS=1), bench (TRAIN workload;
#        TRAIN_ARGS appends, e.g. "--shapes large"), profile (per-kernel times of BERT-large
#        steps, nsys or ncu); default "test". Logs and JSON to $OUT.
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
# CARRY_NAME=trcli with CLI_ONLY=1: a small bundle for the `cli` step alone (the whole one and
# the tree can pass the carry limit together)
CARRY="$ROOT/.gpu_carry/${CARRY_NAME:-train}"
TESTS=(test_cuda_train_ops test_cuda_train_gemm_optim test_cuda_attention_backward test_cuda_train_step
       test_cuda_attention test_cuda_encoder test_cuda_deberta) # the last three: inference attention (its wgmma kernels gained an lse output) and DeBERTa

if [ "${1:-}" = "--stage" ]; then
    B=$(cd "${2:?usage: gpu_train.sh --stage BUILD}" && pwd)
    stage=$(mktemp -d)
    trap 'rm -rf "$stage"' EXIT
    mkdir -p "$stage/build/tests" "$stage/build/deplibs" "$CARRY"
    rm -f "$CARRY"/*
    bins=("$B/train_bench")
    [ -n "${CLI_ONLY:-}" ] && TESTS=() && bins=()
    bins+=("$B/nopad")
    for t in "${TESTS[@]}"; do bins+=("$B/tests/$t"); done
    for bin in "${bins[@]}"; do [ -f "$bin" ] || { echo "missing $bin" >&2; exit 1; }; done
    for bin in "${bins[@]}"; do ldd "$bin" | awk '/=> \//{print $3}'; done | sort -u |
        grep -Ev '/(libc|libm|libstdc\+\+|libgcc_s|libpthread|libdl|librt|ld-linux[^/]*|libcublasLt|libcublas)\.so' |
        while read -r lib; do cp -L "$lib" "$stage/build/deplibs/"; done
    [ -z "${CLI_ONLY:-}" ] && cp "$B/train_bench" "$stage/build/"
    cp "$B/nopad" "$stage/build/"
    for t in "${TESTS[@]}"; do cp "$B/tests/$t" "$stage/build/tests/"; done
    # the `cli` step's tokenizer: all-MiniLM-L6-v2's (BERT's uncased WordPiece, 30522 ids)
    TOK=${NOPAD_MINILM_DIR:-$HOME/.cache/nopad/all-MiniLM-L6-v2}
    mkdir -p "$stage/build/tokenizer"
    for f in tokenizer.json vocab.txt tokenizer_config.json special_tokens_map.json; do
        [ -f "$TOK/$f" ] && cp "$TOK/$f" "$stage/build/tokenizer/"
    done
    # xz -9e: its 64 MiB window finds the code the binaries share (each links the library's
    # kernels), so seven test binaries and the library pack into ~6 MB, not ~45
    (cd "$stage" && tar cf - build | xz -9e -T1 > "$CARRY/bundle.tar.xz")
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
        # training attention timings: the forward with lse (mma.sync and wgmma) and the backward, on
        # the BERT-large and BERT-base shapes
        echo "== attention forward/backward timings"
        NOPAD_ATTN_BWD_BENCH=1 timeout 120 "$BUILD/tests/test_cuda_attention_backward" 2>&1 |
            tee "$OUT/attn_bwd_bench.log" | grep -v "^device"
        [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
        # DeBERTa's attention_rel at the DeBERTa-v3-base layer shape
        echo "== DeBERTa attention_rel timings"
        (cd "$ROOT" && NOPAD_DEBERTA_BENCH=1 timeout 180 "$BUILD/tests/test_cuda_deberta") 2>&1 |
            tee "$OUT/deberta_bench.log" | grep -v "^device"
        [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
        ;;
    cli)
        # `nopad train --device cuda` end to end (the CLI, the trainer, checkpoints) beside the same
        # run on the CPU: a random BERT (4 x 64 heads, 2 layers) with MiniLM's tokenizer, a new
        # 2-label head, the README's review data; per-step losses compared, then the CUDA-trained
        # folder classified by `nopad classify` on the CPU
        M=/tmp/nopad_train/models/cli_h64
        python3 "$ROOT/scripts/make_random_bert.py" "$M" --hidden 256 --heads 4 --layers 2 > /dev/null || status=1
        cp "$BUILD"/tokenizer/* "$M/"
        D="$ROOT/tests/data/train"
        for dev in cuda cpu; do
            rm -rf "/tmp/nopad_train/tuned_$dev"
            "$BUILD/nopad" train --device "$dev" --model "$M" --task classify --num-labels 2 --epochs 5 \
                --data "$D/reviews_train.jsonl" --eval "$D/reviews_test.jsonl" --output "/tmp/nopad_train/tuned_$dev" \
                --log "$OUT/cli_$dev.jsonl" --quiet > "$OUT/cli_$dev.log" 2>&1 || status=1
            echo "== nopad train --device $dev"; tail -4 "$OUT/cli_$dev.log"
        done
        python3 - "$OUT/cli_cuda.jsonl" "$OUT/cli_cpu.jsonl" <<'PY' || status=1
import json, sys
a, b = ([json.loads(l)["loss"] for l in open(p)] for p in sys.argv[1:3])
rel = [abs(x - y) / abs(y) for x, y in zip(a, b)]
print("per-step loss, cuda (bf16) against cpu (fp32): %d steps, max relative difference %.2e, last %.4f / %.4f"
      % (len(rel), max(rel), a[-1], b[-1]))
sys.exit(0 if len(a) == len(b) and max(rel) <= 2e-2 else 1)
PY
        head -3 "$D/reviews_test.jsonl" | python3 -c "import json,sys; [print(json.loads(l)['text']) for l in sys.stdin]" |
            "$BUILD/nopad" classify --model /tmp/nopad_train/tuned_cuda 2>&1 | tee "$OUT/cli_classify.log" || status=1
        ;;
    dp1)
        # issue 41 on one GPU: the data-parallel path at world size one (NOPAD_COMM_FORCE=1: the
        # gradient buckets' all-reduces through NCCL on its second stream) against the plain run,
        # BERT-large MLM, lengths U[102, 512] (bench/train_scaling.sh; the bound: <= 1% slower),
        # and the two runs' per-step losses, which must be equal (a world of one sums nothing)
        mkdir -p "$OUT/dp1"
        GPUS=1 ROUNDS=${DP_ROUNDS:-2} STEPS=${DP_STEPS:-40} WARMUP=${DP_WARMUP:-8} NOPAD_MINILM_DIR=$BUILD/tokenizer timeout 560 \
            bash "$ROOT/bench/train_scaling.sh" "$BUILD/nopad" "$OUT/dp1" 2>&1 | tee "$OUT/dp1/dp1.log" | tail -8
        [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
        ;;
    bench)
        mkdir -p "$OUT/train"
        timeout 590 python3 "$ROOT/bench/train_bench.py" --train-bench "$BUILD/train_bench" \
            --out "$OUT/train" ${TRAIN_ARGS:-} 2>&1 | grep -v Warning | tee "$OUT/train/train.log" || status=1
        ;;
    profile)
        # per-kernel GPU time of TRAIN steps of the BERT-large shape (PROFILE_SHAPE="layers hidden
        # heads batch" to change it): nsys when the machine has it (real overlap), else ncu
        set -- ${PROFILE_SHAPE:-24 1024 16 32}
        M=/tmp/nopad_train/models/prof_$1_$2
        python3 "$ROOT/scripts/make_random_bert.py" "$M" --layers "$1" --hidden "$2" --heads "$3" > /dev/null || status=1
        cmd=("$BUILD/train_bench" --model "$M" --batch "$4" --steps 3 --warmup 2)
        if command -v nsys > /dev/null; then
            timeout 400 nsys profile -o "$OUT/train_prof" --force-overwrite true "${cmd[@]}" > "$OUT/profile.log" 2>&1
            nsys stats --report cuda_gpu_kern_sum --format csv "$OUT/train_prof.nsys-rep" > "$OUT/profile_kernels.csv" 2>> "$OUT/profile.log"
            python3 - "$OUT/profile_kernels.csv" <<'PY'
import csv, sys
rows = list(csv.DictReader(l for l in open(sys.argv[1]) if l.count(",") > 3))
tot = sum(float(r["Total Time (ns)"]) for r in rows)
print("kernels: %d names, total %.1f ms over 5 steps" % (len(rows), tot / 1e6))
for r in sorted(rows, key=lambda r: -float(r["Total Time (ns)"]))[:40]:
    print("  %7.2f ms/step %5.1f%%  %6d x  %s" % (float(r["Total Time (ns)"]) / 5e6, 100 * float(r["Total Time (ns)"]) / tot,
          int(r["Instances"]) // 5, r["Name"][:110]))
PY
            rm -f "$OUT/train_prof.sqlite"
        else
            timeout 500 ncu --clock-control none --metrics gpu__time_duration.sum --csv "${cmd[@]}" > "$OUT/profile_b.csv" 2> "$OUT/profile.log"
            python3 - "$OUT/profile_b.csv" <<'PY'
import csv, sys, collections
rows = [r for r in csv.DictReader(l for l in open(sys.argv[1]) if l.startswith('"'))]
tot = collections.defaultdict(float); n = collections.Counter()
for r in rows:
    if r.get("Metric Name") != "gpu__time_duration.sum": continue
    name = r["Kernel Name"][:110]
    v = float(r["Metric Value"].replace(",", "")); unit = r["Metric Unit"]
    tot[name] += v * {"nsecond": 1e-6, "ns": 1e-6, "usecond": 1e-3, "us": 1e-3, "msecond": 1.0, "ms": 1.0}.get(unit, 1e-3)
    n[name] += 1
s = sum(tot.values())
print("kernels %d, total %.1f ms over 5 steps" % (sum(n.values()), s))
for k, v in sorted(tot.items(), key=lambda kv: -kv[1])[:40]: print("  %7.2f ms/step %5.1f%%  %5d x  %s" % (v / 5, 100 * v / s, n[k] // 5, k))
PY
        fi
        ;;
    *) echo "unknown step $step" && status=1 ;;
    esac
done
# the device returns a limited number of files: every log and JSON in one archive (PACK=0: loose)
if [ "${PACK:-1}" = 1 ]; then
    (cd "$OUT" && tar cJf /tmp/nopad_results.tar.xz --exclude=results.tar.xz . &&
        find . -mindepth 1 -delete && mv /tmp/nopad_results.tar.xz results.tar.xz)
fi
exit $status
