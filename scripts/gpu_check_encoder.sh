#!/usr/bin/env bash
# GPU check of the CUDA encoder backend, one call on the GPU machine: GPU tests (encoder, attention,
# fused GEMMs, the Python package's), compute-sanitizer, and the benchmarks with their peers.
# Here (development machine; nvcc builds sm_90a without a GPU):
#   cmake -S . -B build-cuda -DNOPAD_CUDA=ON -DCMAKE_BUILD_TYPE=Release && cmake --build build-cuda -j
#   scripts/gpu_check_encoder.sh --stage build-cuda
# which writes .gpu_carry/bundle.tar.xz: the CLI, libnopad.so, the GPU test binaries, the Debian
# libraries they need and an fp16 copy of all-MiniLM-L6-v2 (a device call carries <= 64 MiB).
# There (device tool, carry .gpu_carry):
#   mkdir -p /tmp/g && tar xJf .gpu_carry/bundle.tar.xz -C /tmp/g
#   NOPAD_MINILM_DIR=/tmp/g/minilm_f16 scripts/gpu_check_encoder.sh /tmp/g/build [steps]
# steps: test fused pytest sanitize sanitize_fmha sanitize_fused sanitize_small bench fmha sweep
# fmha_ab fmha_profile graphs ab profile profile_small, or all (test fused pytest sanitize sanitize_fmha sanitize_fused sanitize_small bench fmha). Logs and JSON go to
# $OUT. Env knobs per step: ENC_ARGS, FMHA_ARGS, SWEEP_SETTINGS, SWEEP_POINTS, SWEEP_ARGS,
# AB_SETTINGS, AB_POINTS, PROFILE_BATCH, PROFILE_MAX, PROFILE_TAG, NOPAD_TEST_FILTER (sanitize),
# FMHA_AB_LIBS, FMHA_PROFILE_KERNEL, FMHA_PROFILE_LIB, FMHA_PROFILE_POINT, FMHA_PROFILE_TAG.
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)

if [ "${1:-}" = "--stage" ]; then
    B=${2:?build folder}
    mkdir -p "$B/deplibs" "$ROOT/.gpu_carry"
    for bin in "$B/libnopad.so" "$B"/tests/test_cuda_*; do ldd "$bin" | awk '/=> \//{print $3}'; done | sort -u |
        grep -Ev '/(libc|libm|libstdc\+\+|libgcc_s|libpthread|libdl|librt|ld-linux[^/]*|libcublasLt|libcublas)\.so' |
        while read -r lib; do cp -L "$lib" "$B/deplibs/"; done
    # all-MiniLM-L6-v2 with fp16 weights (the fp32 file is larger than a call carries; fp16 and
    # bf16 backends round the weights to their dtype anyway)
    stage=$(mktemp -d)
    python3 - "$stage/minilm_f16" <<'PY'
import os, shutil, subprocess, sys
from safetensors.numpy import load_file, save_file
dst = sys.argv[1]
src = subprocess.check_output(["scripts/fetch_default_model.sh"]).decode().strip()
os.makedirs(dst + "/1_Pooling", exist_ok=True)
save_file({k: v.astype("float16") for k, v in load_file(src + "/model.safetensors").items()}, dst + "/model.safetensors")
for f in ["config.json", "modules.json", "sentence_bert_config.json", "1_Pooling/config.json",
          "tokenizer.json", "tokenizer_config.json", "vocab.txt"]:
    if os.path.exists(os.path.join(src, f)):  # the tokenizer: the Python GPU tests encode text
        shutil.copy(os.path.join(src, f), os.path.join(dst, f))
PY
    mkdir -p "$stage/build/tests"
    cp "$B/nopad" "$B/libnopad.so" "$stage/build/"
    [ -x "$B/gemm_bench" ] && cp "$B/gemm_bench" "$stage/build/"
    cp "$B"/tests/test_cuda_* "$stage/build/tests/"
    cp -r "$B/deplibs" "$stage/build/"
    tar cJf "$ROOT/.gpu_carry/bundle.tar.xz" -C "$stage" .
    rm -rf "$stage"
    du -sh "$ROOT/.gpu_carry/bundle.tar.xz"
    exit 0
fi

BUILD=$(cd "${1:?usage: gpu_check_encoder.sh BUILD_DIR [steps]}" && pwd)
shift
STEPS=${*:-all}
OUTDIR=${OUT:-$ROOT/gpu_check_out}
mkdir -p "$OUTDIR" /tmp/nopad_deplibs
for f in "$BUILD"/deplibs/*.so*; do
    name=$(basename "$f")
    ldconfig -p | grep -q " $name " || cp -L "$f" /tmp/nopad_deplibs/
done
export LD_LIBRARY_PATH=/tmp/nopad_deplibs:/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export NOPAD_TEST_DATA=$ROOT/tests/data NOPAD_MINILM_DIR=${NOPAD_MINILM_DIR:-$(dirname "$BUILD")/minilm_f16}
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUTDIR/gpu.txt"
date -u | tee -a "$OUTDIR/gpu.txt"
# "all": the check itself; graphs, ab and profile are diagnostics, run by name
want() { [[ " $STEPS " == *" $1 "* ]] || { [[ " $STEPS " == *" all "* ]] && [[ " test fused pytest sanitize sanitize_fmha sanitize_fused sanitize_small bench fmha " == *" $1 "* ]]; }; }
# a BERT-base-shaped model with random weights (bench/enc_bench.py), made once per machine
bert_base() {
    [ -f /tmp/nopad_enc_base/config.json ] || python3 -c "import sys, torch; sys.path.insert(0, '$ROOT/bench'); \
import enc_bench; enc_bench.make_model('base', torch.float16, '/tmp/nopad_enc_base')" >/dev/null 2>&1
    echo /tmp/nopad_enc_base
}
status=0
if want test; then
    NOPAD_BERT_BASE_DIR=$(bert_base) "$BUILD/tests/test_cuda_encoder" 2>&1 | tee "$OUTDIR/test_cuda_encoder.log" || status=1
fi
if want test; then
    # the attention op alone (every kernel the dispatcher picks), and the fused GEMMs where built
    for t in test_cuda_attention test_cuda_gemm; do
        [ -x "$BUILD/tests/$t" ] || continue
        "$BUILD/tests/$t" > "$OUTDIR/$t.log" 2>&1 || status=1
        echo "$t: $(grep -E 'PASSED|FAILED' "$OUTDIR/$t.log" | tr '\n' ' ')"
    done
    # the attention kernels the default dispatch may not reach at the test's shapes: the FA3
    # kernel forced for every d=64 length, one CTA per tile and persistent, and its variants
    for setting in "NOPAD_FMHA_FA3=1 NOPAD_FMHA_FA3_PERSIST=0" "NOPAD_FMHA_FA3=1 NOPAD_FMHA_FA3_PERSIST=1" \
        "NOPAD_FMHA_FA3=1 NOPAD_FMHA_FA3_PERSIST=1 NOPAD_FMHA_FA3_WG=2 NOPAD_FMHA_FA3_STAGES=3" \
        "NOPAD_FMHA_FA3=1 NOPAD_FMHA_FA3_PERSIST=1 NOPAD_FMHA_FA3_PINGPONG=0" \
        "NOPAD_FMHA_FA3=1 NOPAD_FMHA_FA3_PERSIST=0 NOPAD_FMHA_FA3_WG=2" NOPAD_FMHA_FA3=0; do
        env $setting NOPAD_GPU_TEST_D=64 "$BUILD/tests/test_cuda_attention" > "$OUTDIR/attention_variant.log" 2>&1 || status=1
        echo "test_cuda_attention d=64 [$setting]: $(grep -E 'PASSED|FAILED' "$OUTDIR/attention_variant.log" |
            tr '\n' ' ') worst $(grep -oE 'row rel err [0-9.e+-]+' "$OUTDIR/attention_variant.log" | awk '{print $4}' | sort -g | tail -n 1)" |
            tee -a "$OUTDIR/attention_variants.log"
    done
fi
if want fused; then
    # the skinny GEMM's variants with the LayerNorm or the attention of its input fused in
    # (gemm_skinny.h): their kernel tests, then the whole model with both fused loops taking every
    # batch they can (the LayerNorm up to 256 tokens, the attention up to 64)
    for t in '*layernorm*' '*attention*'; do
        NOPAD_TEST_FILTER=$t "$BUILD/tests/test_cuda_gemm" > "$OUTDIR/test_skinny_fused.log" 2>&1 || status=1
        echo "test_cuda_gemm $t: $(grep -E 'PASSED|FAILED|worst' "$OUTDIR/test_skinny_fused.log" | tr '\n' ' ')" |
            tee -a "$OUTDIR/test_skinny_fused_summary.log"
        cat "$OUTDIR/test_skinny_fused.log" >> "$OUTDIR/test_skinny_fused_all.log"
    done
    NOPAD_SKINNY_LN=1 NOPAD_SKINNY_ATTN=1 NOPAD_SKINNY_MAX_TOKENS=256 "$BUILD/tests/test_cuda_encoder" \
        > "$OUTDIR/test_cuda_encoder_fused.log" 2>&1 || status=1
    echo "test_cuda_encoder, fused loops: $(grep -E 'PASSED|FAILED' "$OUTDIR/test_cuda_encoder_fused.log" | tr '\n' ' ')"
fi
if want fmha; then
    # the FMHA grid of bench/RESULTS.md with its peers (same seed: the same lengths every run)
    python3 "$ROOT/bench/fmha_bench.py" --lib "$BUILD/libnopad.so" --out "$OUTDIR" ${FMHA_ARGS:-} \
        > "$OUTDIR/fmha_bench.log" 2>&1 || status=1
    tail -n 40 "$OUTDIR/fmha_bench.log"
fi
if want pytest; then
    # the Python package's GPU tests (torch CUDA tensors in and out) against this build
    (cd "$ROOT" && PYTHONPATH=$ROOT/python NOPAD_LIBRARY=$BUILD/libnopad.so \
        python3 -m pytest -q -p no:cacheprovider tests/python/test_cuda_encoder.py tests/python/test_attention.py) \
        2>&1 | tee "$OUTDIR/pytest_gpu.log" | tail -n 15 || status=1
fi
if want sanitize; then
    # NOPAD_TEST_FILTER narrows it (the full suite under memcheck takes minutes)
    compute-sanitizer --tool memcheck --leak-check no "$BUILD/tests/test_cuda_encoder" > "$OUTDIR/memcheck.log" 2>&1 || status=1
    tail -n 5 "$OUTDIR/memcheck.log"
fi
if want sanitize_fmha; then
    # the FA3 kernel (TMA, mbarriers, named barriers, the persistent counter) on the quick shapes
    for persist in 0 1; do
        for tool in memcheck racecheck; do
            NOPAD_FMHA_FA3=1 NOPAD_FMHA_FA3_PERSIST=$persist NOPAD_GPU_TEST_QUICK=1 NOPAD_GPU_TEST_D=64 \
                compute-sanitizer --tool $tool --error-exitcode 3 "$BUILD/tests/test_cuda_attention" \
                > "$OUTDIR/sanitizer_fa3_p${persist}_$tool.log" 2>&1
            rc=$?
            [ "$rc" = 0 ] || status=1
            echo "compute-sanitizer --tool $tool, FA3 persist=$persist: exit $rc; $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' \
                "$OUTDIR/sanitizer_fa3_p${persist}_$tool.log" | tail -n 1)" | tee -a "$OUTDIR/sanitizer_fmha.log"
        done
    done
    # the v5 kernels (cp.async, wgmma; the dead-warpgroup path and the half-width last key tile):
    # the default dispatch with FA3 off, and 128-row tiles forced (the pipelined kernel) at every length
    for setting in "NOPAD_FMHA_FA3=0" "NOPAD_FMHA_FA3=0 NOPAD_FMHA_WG_M=128"; do
        for tool in memcheck racecheck; do
            env $setting NOPAD_GPU_TEST_QUICK=1 compute-sanitizer --tool $tool --error-exitcode 3 \
                "$BUILD/tests/test_cuda_attention" > "$OUTDIR/sanitizer_v5_$tool.log" 2>&1
            rc=$?
            [ "$rc" = 0 ] || status=1
            echo "compute-sanitizer --tool $tool, v5 [$setting]: exit $rc; $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' \
                "$OUTDIR/sanitizer_v5_$tool.log" | tail -n 1)" | tee -a "$OUTDIR/sanitizer_fmha.log"
        done
    done
fi
if want sanitize_fused; then
    # the skinny GEMM's fused variants (mbarriers, bulk copies, cluster barriers, distributed
    # shared memory) under memcheck, racecheck and synccheck
    for t in '*layernorm*' '*attention*'; do
        for tool in memcheck racecheck synccheck; do
            NOPAD_TEST_FILTER=$t NOPAD_GPU_TEST_QUICK=1 compute-sanitizer --tool $tool --error-exitcode 3 \
                "$BUILD/tests/test_cuda_gemm" > "$OUTDIR/sanitizer_fused_$tool.log" 2>&1
            rc=$?
            [ "$rc" = 0 ] || status=1
            echo "compute-sanitizer --tool $tool, test_cuda_gemm $t: exit $rc; $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' \
                "$OUTDIR/sanitizer_fused_$tool.log" | tail -n 1)" | tee -a "$OUTDIR/sanitizer_fused.log"
        done
    done
fi
if want sanitize_small; then
    # the one-kernel small-batch encoder (encoder_small.cu: grid barriers, shared memory reused
    # between phases) under memcheck, racecheck and synccheck, on its phase-by-phase test
    for tool in memcheck racecheck synccheck; do
        NOPAD_TEST_FILTER='*phases*' NOPAD_GPU_TEST_QUICK=1 compute-sanitizer --tool $tool --error-exitcode 3 \
            "$BUILD/tests/test_cuda_encoder" > "$OUTDIR/sanitizer_small_$tool.log" 2>&1
        rc=$?
        [ "$rc" = 0 ] || status=1
        echo "compute-sanitizer --tool $tool, test_small_kernel_phases: exit $rc; $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' \
            "$OUTDIR/sanitizer_small_$tool.log" | tail -n 1)" | tee -a "$OUTDIR/sanitizer_small.log"
    done
fi
if want sweep; then
    # nopad's attention alone under several settings, same points and lengths for each:
    # SWEEP_SETTINGS (space-separated; each a comma-separated list of VAR=value), SWEEP_POINTS
    # (BxM, sBxM for the skewed mix), SWEEP_ARGS (more fmha_bench.py arguments)
    for setting in ${SWEEP_SETTINGS:-NOPAD_FMHA_FA3=0 NOPAD_FMHA_FA3=1,NOPAD_FMHA_FA3_PERSIST=0 NOPAD_FMHA_FA3=1,NOPAD_FMHA_FA3_PERSIST=1}; do
        echo "## $setting"
        env ${setting//,/ } PYTHONUNBUFFERED=1 python3 "$ROOT/bench/fmha_bench.py" --lib "$BUILD/libnopad.so" \
            --out /tmp/sweep --only-nopad --reps 15 \
            --points "${SWEEP_POINTS:-16x512,128x512,16x1024,128x1024,8x2048,128x2048,s64x2048}" ${SWEEP_ARGS:-} \
            2>&1 | grep -E '^\||Error|error'
    done 2>&1 | tee -a "$OUTDIR/sweep.log"
fi
if want fmha_ab; then
    # nopad's attention from several builds of libnopad.so (FMHA_AB_LIBS, space-separated paths),
    # alternated twice per library, same points and lengths: A/B of a kernel change in one process order
    for rep in 1 2; do
        for lib in ${FMHA_AB_LIBS:-$BUILD/libnopad.so}; do
            echo "## rep $rep $(basename "$lib")"
            PYTHONUNBUFFERED=1 python3 "$ROOT/bench/fmha_bench.py" --lib "$lib" --out /tmp/fmha_ab --only-nopad \
                --reps 15 --points "${SWEEP_POINTS:-16x1024,64x512,128x512,128x1024,8x2048,128x2048}" ${SWEEP_ARGS:-} \
                2>&1 | grep -E '^\||Error|error'
        done
    done 2>&1 | tee -a "$OUTDIR/fmha_ab.log"
fi
if want fmha_profile; then
    # an attention kernel under ncu (one launch at FMHA_PROFILE_POINT, default 128x1024, d 64, fp16):
    # throughput, warp states and the stall samples of every SASS instruction. FMHA_PROFILE_KERNEL
    # (a regex, default attention_fa3: the FA3 kernel; attention_varlen_wgmma: the v5 kernels) picks the
    # kernel, FMHA_PROFILE_LIB the library (default this build's); FMHA_PROFILE_TAG names the outputs.
    tag=${FMHA_PROFILE_TAG:-}
    ncu --clock-control none --kernel-name "regex:${FMHA_PROFILE_KERNEL:-attention_fa3}" --launch-skip 3 --launch-count 1 \
        --section LaunchStats --section SpeedOfLight --section ComputeWorkloadAnalysis --section WarpStateStats \
        --section InstructionStats --section SchedulerStats --section SourceCounters -o "$OUTDIR/ncu_fmha$tag" \
        python3 "$ROOT/bench/fmha_bench.py" --lib "${FMHA_PROFILE_LIB:-$BUILD/libnopad.so}" --out /tmp/fmha_prof \
        --only-nopad --reps 1 --inner 1 --points "${FMHA_PROFILE_POINT:-128x1024}" > "$OUTDIR/ncu_fmha$tag.err" 2>&1 ||
        echo "ncu failed: $(tail -n 3 "$OUTDIR/ncu_fmha$tag.err")"
    ncu --import "$OUTDIR/ncu_fmha$tag.ncu-rep" --page details > "$OUTDIR/ncu_fmha$tag.txt" 2>&1
    ncu --import "$OUTDIR/ncu_fmha$tag.ncu-rep" --page source --print-source sass --csv \
        > "$OUTDIR/ncu_fmha${tag}_sass.csv" 2>&1
    grep -E 'Duration|Issue Slots|Warp Cycles|Stall|pipeline|Eligible|Active Warps' "$OUTDIR/ncu_fmha$tag.txt" | head -30
fi
# A BERT-base folder with random weights (what bench/enc_bench.py times), for nopad bench/ncu.
if want graphs; then
    # the host entry (nopad bench: ids in, CLS rows out, synchronous) with and without the graph
    # replay of small batches
    model=$(bert_base)
    for point in "1 128" "1 512" "4 256" "16 128" "8 256"; do
        set -- $point
        for g in 0 -1; do
            echo "== batch $1 max $2, cuda_graph_max_tokens $g" | tee -a "$OUTDIR/graphs.log"
            "$BUILD/nopad" bench --model "$model" --device cuda --batch "$1" --max "$2" --iters 200 \
                --warmup 20 --cuda-graph-max-tokens "$g" 2>&1 | tee -a "$OUTDIR/graphs.log" || status=1
        done
    done
fi
if want ab; then
    # A/B of a runtime knob on nopad bench (host entry), alternating settings point by point:
    # AB_SETTINGS="NOPAD_PDL=0 NOPAD_PDL=1" (words are env assignments or nopad bench options,
    # joined by commas: "NOPAD_PDL=0,--cuda-graph-max-tokens=-1"), AB_POINTS="1x128 16x512"
    model=$(bert_base)
    for point in ${AB_POINTS:-1x128 16x256 16x512 128x512}; do
        for rep in 1 2; do
            for setting in ${AB_SETTINGS:-NOPAD_PDL=0 NOPAD_PDL=1}; do
                envs=() opts=()
                for w in ${setting//,/ }; do
                    if [[ $w == --* ]]; then opts+=("${w%%=*}" "${w#*=}"); else envs+=("$w"); fi
                done
                printf '%s rep %s %s: ' "$point" "$rep" "$setting" | tee -a "$OUTDIR/ab.log"
                env "${envs[@]}" "$BUILD/nopad" bench --model "$model" --device cuda --batch "${point%x*}" \
                    --max "${point#*x}" --iters 100 --warmup 10 "${opts[@]}" 2>&1 | grep '^| [0-9]' | tee -a "$OUTDIR/ab.log"
            done
        done
    done
fi
if want profile; then
    # per-kernel times of one BERT-base forward at batch 1 x 128, launched directly (ncu serialises
    # kernels, so this is each kernel alone, not the overlap)
    model=$(bert_base)
    ncu --clock-control none --cache-control none --metrics gpu__time_duration.sum --csv \
        "$BUILD/nopad" bench --model "$model" --device cuda --batch "${PROFILE_BATCH:-1}" \
        --max "${PROFILE_MAX:-128}" --iters 1 --warmup 0 --cuda-graph-max-tokens -1 \
        > "$OUTDIR/ncu_profile${PROFILE_TAG:-}.csv" 2> "$OUTDIR/ncu_profile.err" || echo "ncu failed: $(tail -n 3 "$OUTDIR/ncu_profile.err")"
    python3 - "$OUTDIR/ncu_profile${PROFILE_TAG:-}.csv" <<'PY' | tee "$OUTDIR/ncu_summary${PROFILE_TAG:-}.txt"
import csv, collections, sys
rows = [r for r in csv.DictReader(l for l in open(sys.argv[1]) if l.startswith('"'))]
rows = [r for r in rows if r.get("Metric Name") == "gpu__time_duration.sum"]
if not rows:
    sys.exit("no ncu rows")
# the timed forward: the kernels after the last weight conversion at load, before the download
last = max(i for i, r in enumerate(rows) if "from_f32" in r["Kernel Name"])
fwd = [r for r in rows[last + 1:] if "to_f32" not in r["Kernel Name"]]
unit = {"ns": 1e-3, "nsecond": 1e-3, "us": 1.0, "usecond": 1.0, "ms": 1e3, "msecond": 1e3}
by = collections.OrderedDict()
for r in fwd:
    t = float(r["Metric Value"].replace(",", "")) * unit[r["Metric Unit"]]
    by.setdefault((r["Kernel Name"][:80], r["Grid Size"]), []).append(t)
total = sum(sum(v) for v in by.values())
print(f"{len(fwd)} kernels in the forward, sum of kernel times {total:.1f} us")
for (name, grid), v in sorted(by.items(), key=lambda kv: -sum(kv[1])):
    print(f"{sum(v):9.1f} us {100 * sum(v) / total:5.1f}%  {len(v):4d} x {sum(v) / len(v):8.2f} us  {name} {grid}")
# the second layer in launch order (the first may differ: it follows the embedding kernel)
per_layer = (len(fwd) - 2) // 12 if len(fwd) > 14 else 0
if per_layer:
    print("second layer, in launch order:")
    for r in fwd[1 + per_layer:1 + 2 * per_layer]:
        t = float(r["Metric Value"].replace(",", "")) * unit[r["Metric Unit"]]
        print(f"{t:9.2f} us  {r['Kernel Name'][:80]} {r['Grid Size']}")
PY
fi
if want profile_small; then
    # the one-kernel small-batch encoder (NOPAD_ENCODER_SMALL=1) under ncu: warp stall reasons,
    # memory traffic and the source lines they fall on, one BERT-base forward of PROFILE_MAX tokens
    model=$(bert_base)
    NOPAD_ENCODER_SMALL=1 ncu --clock-control none --kernel-name regex:encoder_small --launch-count 1 \
        --section LaunchStats --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats \
        --section SourceCounters --import-source yes -o "$OUTDIR/ncu_encoder_small" \
        "$BUILD/nopad" bench --model "$model" --device cuda --batch 1 --max "${PROFILE_MAX:-32}" --iters 1 \
        --warmup 0 --cuda-graph-max-tokens -1 > "$OUTDIR/ncu_encoder_small.err" 2>&1 ||
        echo "ncu failed: $(tail -n 3 "$OUTDIR/ncu_encoder_small.err")"
    ncu --import "$OUTDIR/ncu_encoder_small.ncu-rep" --page details > "$OUTDIR/ncu_encoder_small.txt" 2>&1
    ncu --import "$OUTDIR/ncu_encoder_small.ncu-rep" --page source --csv > "$OUTDIR/ncu_encoder_small_source.csv" 2>&1
    grep -E 'Duration|Stall|L2 Hit|Mem Busy|Max Bandwidth|Warp Cycles' "$OUTDIR/ncu_encoder_small.txt" | head -40
fi
if want bench; then
    python3 "$ROOT/bench/enc_bench.py" --lib "$BUILD/libnopad.so" ${ENC_ARGS:---quick --out $OUTDIR/enc.json} \
        2>&1 | tee -a "$OUTDIR/enc_bench.log" || status=1
fi
exit $status
