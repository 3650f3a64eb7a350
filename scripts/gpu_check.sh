#!/usr/bin/env bash
# The GPU machine's check of nopad, in one call: GPU tests (every tests/test_cuda_* binary; the
# attention under each kernel setting; the Python package's GPU tests), compute-sanitizer, the ENC
# and FMHA benchmarks with their peers, and a same-GPU comparison of this build against a baseline.
#
# Here (development machine; nvcc builds sm_90a without a GPU):
#   cmake -S . -B build-cuda -DNOPAD_CUDA=ON -DCMAKE_BUILD_TYPE=Release && cmake --build build-cuda -j
#   scripts/gpu_check.sh --stage build-cuda [--base BASE_BUILD [BASE_SRC]]
# writes .gpu_carry/bundle.tar.xz (checked to be under the 64 MiB a device call carries): the CLI,
# libnopad.so, gemm_bench, the GPU test binaries, the Debian libraries they need and an fp16 copy of
# all-MiniLM-L6-v2. --base adds a baseline for the `compare` step: BASE_BUILD/libnopad.so and the
# bench/*.py of the baseline's source tree (BASE_SRC, default the source folder in
# BASE_BUILD/CMakeCache.txt), which time it through the C API it was built with. A baseline build:
#   git worktree add ../nopad-base <commit> &&
#   cmake -S ../nopad-base -B ../nopad-base/build-cuda -DNOPAD_CUDA=ON -DCMAKE_BUILD_TYPE=Release &&
#   cmake --build ../nopad-base/build-cuda -j --target nopad_shared
#
# There (device tool `run`, carry [".gpu_carry"]):
#   mkdir -p /tmp/g && tar xJf .gpu_carry/bundle.tar.xz -C /tmp/g && scripts/gpu_check.sh /tmp/g/build [steps]
#
# Steps. "all" (the default) is the check: test pytest sanitize sanitize_fmha sanitize_gemm bench fmha.
# By name only:
#   compare       the ENC and FMHA points of bench/RESULTS.md, nopad alone, baseline and this build
#                 alternated on this GPU; flags every point slower by more than COMPARE_TOL percent
#   sweep         the attention alone under several tuning settings
#   fmha_ab       the attention alone from several libraries
#   fmha_profile  ncu of one attention launch
#   gemm          gemm_bench
#   decode        the DEC benchmark (bench/decode_bench.py: decode grid, prefill, HF peers, SmolLM2);
#                 ~8 minutes on an H100 (its --budget-s), so alone in a device call
#   graphs, ab    nopad bench: graph replay on/off; A/B of runtime knobs
#   profile       ncu per-kernel times of one forward
# Logs and JSON go to $OUT (or ./gpu_check_out). Exit status 0 only if every step passed.
#
# Env knobs:
#   bench         ENC_ARGS
#   decode        DEC_ARGS, NOPAD_SMOLLM2_GGUF (the GGUF for its SmolLM2 part)
#   fmha          FMHA_ARGS
#   compare       BASE_LIB, BASE_BENCH (default: the staged baseline next to BUILD), COMPARE_WHAT
#                 ("enc fmha"), COMPARE_ENC ("base:fp16 base:bf16 large:fp16"), COMPARE_REPS (2),
#                 COMPARE_TOL (2), COMPARE_FMHA_ARGS
#   sweep         SWEEP_SETTINGS, SWEEP_POINTS, SWEEP_ARGS, SWEEP_D
#   fmha_ab       FMHA_AB_LIBS, SWEEP_POINTS, SWEEP_ARGS
#   fmha_profile  FMHA_PROFILE_KERNEL, FMHA_PROFILE_LIB, FMHA_PROFILE_POINT, FMHA_PROFILE_TAG
#   gemm          GEMM_ARGS
#   ab            AB_SETTINGS, AB_POINTS
#   profile       PROFILE_BATCH, PROFILE_MAX, PROFILE_TAG
#   sanitize      NOPAD_TEST_FILTER
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BUNDLE_LIMIT=$((64 * 1024 * 1024))

# ldd's non-base libraries of the given binaries (openblas, cjson, utf8proc, cmocka, ...); libc,
# libstdc++ and cuBLAS stay the GPU machine's own (torch shares them)
deplibs() {
    for bin in "$@"; do ldd "$bin" | awk '/=> \//{print $3}'; done | sort -u |
        grep -Ev '/(libc|libm|libstdc\+\+|libgcc_s|libpthread|libdl|librt|ld-linux[^/]*|libcublasLt|libcublas)\.so'
}

# the commit a source tree is at, and whether it has changes on top
describe() {
    git -C "$1" log -1 --format='%h %s' 2>/dev/null || echo "? ($1)"
    [ -z "$(git -C "$1" status --porcelain --untracked-files=no 2>/dev/null)" ] || echo "(with uncommitted changes)"
}

if [ "${1:-}" = "--stage" ]; then
    B=$(cd "${2:?usage: gpu_check.sh --stage BUILD [--base BASE_BUILD [BASE_SRC]]}" && pwd)
    BASE=""
    BASE_SRC=""
    if [ "${3:-}" = "--base" ]; then
        BASE=$(cd "${4:?--base needs a build folder}" && pwd)
        BASE_SRC=${5:-$(sed -n 's/^CMAKE_HOME_DIRECTORY:INTERNAL=//p' "$BASE/CMakeCache.txt")}
        [ -f "$BASE/libnopad.so" ] || { echo "no $BASE/libnopad.so" >&2; exit 1; }
        [ -f "$BASE_SRC/bench/enc_bench.py" ] || { echo "no bench/enc_bench.py under '$BASE_SRC'" >&2; exit 1; }
    fi
    stage=$(mktemp -d)
    trap 'rm -rf "$stage"' EXIT
    mkdir -p "$stage/build/tests" "$stage/build/deplibs" "$ROOT/.gpu_carry"
    deplibs "$B/libnopad.so" "$B"/tests/test_cuda_* ${BASE:+"$BASE/libnopad.so"} |
        while read -r lib; do cp -L "$lib" "$stage/build/deplibs/"; done
    # all-MiniLM-L6-v2 with fp16 weights and its tokenizer (for the Python tests too)
    python3 "$ROOT/scripts/make_minilm_f16.py" "$stage/minilm_f16" || { echo "staging MiniLM failed" >&2; exit 1; }
    cp "$B/nopad" "$B/libnopad.so" "$stage/build/"
    [ -x "$B/gemm_bench" ] && cp "$B/gemm_bench" "$stage/build/"
    cp "$B"/tests/test_cuda_* "$stage/build/tests/"
    if [ -n "$BASE" ]; then
        mkdir -p "$stage/base/bench"
        cp "$BASE/libnopad.so" "$stage/base/"
        cp "$BASE_SRC"/bench/*.py "$stage/base/bench/"
        describe "$BASE_SRC" > "$stage/base/COMMIT"
    fi
    describe "$(sed -n 's/^CMAKE_HOME_DIRECTORY:INTERNAL=//p' "$B/CMakeCache.txt")" > "$stage/build/COMMIT"
    # -9: a 64 MiB dictionary, so the binaries' shared code (each links libnopad statically) is
    # stored once; one thread, because xz's threads split the input into separate blocks
    tar cf - -C "$stage" . | xz -9 > "$ROOT/.gpu_carry/bundle.tar.xz" || exit 1
    size=$(stat -c %s "$ROOT/.gpu_carry/bundle.tar.xz")
    echo "$ROOT/.gpu_carry/bundle.tar.xz: $((size / 1024)) KiB (limit $((BUNDLE_LIMIT / 1024)) KiB)"
    [ "$size" -lt "$BUNDLE_LIMIT" ] || { echo "bundle too large for a device call" >&2; exit 1; }
    exit 0
fi

BUILD=$(cd "${1:?usage: gpu_check.sh BUILD_DIR [steps] | gpu_check.sh --stage BUILD [--base BASE_BUILD]}" && pwd)
shift
STEPS=${*:-all}
OUTDIR=${OUT:-$ROOT/gpu_check_out}
mkdir -p "$OUTDIR" /tmp/nopad_deplibs
# Debian libraries from the build machine, only those this machine lacks
for f in "$BUILD"/deplibs/*.so*; do
    [ -e "$f" ] || continue
    name=$(basename "$f")
    ldconfig -p | grep -q " $name " || cp -L "$f" /tmp/nopad_deplibs/
done
export LD_LIBRARY_PATH=/tmp/nopad_deplibs:/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export NOPAD_TEST_DATA=$ROOT/tests/data NOPAD_MINILM_DIR=${NOPAD_MINILM_DIR:-$(dirname "$BUILD")/minilm_f16}
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader | tee "$OUTDIR/gpu.txt"
date -u | tee -a "$OUTDIR/gpu.txt"
[ -f "$BUILD/COMMIT" ] && echo "build: $(tr '\n' ' ' < "$BUILD/COMMIT")" | tee -a "$OUTDIR/gpu.txt"
CHECK=" test pytest sanitize sanitize_fmha sanitize_gemm bench fmha "
want() { [[ " $STEPS " == *" $1 "* ]] || { [[ " $STEPS " == *" all "* ]] && [[ $CHECK == *" $1 "* ]]; }; }
# a BERT-base-shaped model with random weights (bench/enc_bench.py), made once per machine
bert_base() {
    [ -f /tmp/nopad_enc_base/config.json ] || python3 -c "import sys, torch; sys.path.insert(0, '$ROOT/bench'); \
import enc_bench; enc_bench.make_model('base', torch.float16, '/tmp/nopad_enc_base')" >/dev/null 2>&1
    echo /tmp/nopad_enc_base
}
# summary line of a compute-sanitizer log
san_summary() { grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$1" | tail -n 1; }
# sanitize_run TOOL LABEL LOG BINARY [VAR=value ...]: BINARY under compute-sanitizer --tool TOOL
# with those variables; the outcome goes to sanitizer.log, a failure to $status
sanitize_run() {
    local tool=$1 label=$2 log=$3 bin=$4
    shift 4
    env "$@" compute-sanitizer --tool "$tool" --error-exitcode 3 "$bin" > "$log" 2>&1
    local rc=$?
    [ "$rc" = 0 ] || status=1
    echo "compute-sanitizer --tool $tool, $label: exit $rc; $(san_summary "$log")" | tee -a "$OUTDIR/sanitizer.log"
}
status=0

if want test; then
    # every GPU test binary (encoder with the BERT-base shape too, attention, GEMMs, ...)
    base_dir=$(bert_base)
    for t in "$BUILD"/tests/test_cuda_*; do
        name=$(basename "$t")
        NOPAD_BERT_BASE_DIR=$base_dir "$t" > "$OUTDIR/$name.log" 2>&1 || status=1
        echo "$name: $(grep -E 'PASSED|FAILED' "$OUTDIR/$name.log" | tr '\n' ' ')" | tee -a "$OUTDIR/gpu_tests.log"
    done
    # the attention kernels the default dispatch may not reach at the test's shapes: the FA3 kernel
    # forced for every d=64 length (one CTA per tile and persistent, and its variants), then the
    # v5 kernels' variants and mma.sync at every head size
    for setting in "NOPAD_GPU_TEST_D=64 NOPAD_FMHA_FA3=1 NOPAD_FMHA_FA3_PERSIST=0" \
        "NOPAD_GPU_TEST_D=64 NOPAD_FMHA_FA3=1 NOPAD_FMHA_FA3_PERSIST=1" \
        "NOPAD_GPU_TEST_D=64 NOPAD_FMHA_FA3=1 NOPAD_FMHA_FA3_PERSIST=1 NOPAD_FMHA_FA3_WG=2 NOPAD_FMHA_FA3_STAGES=3" \
        "NOPAD_GPU_TEST_D=64 NOPAD_FMHA_FA3=1 NOPAD_FMHA_FA3_PERSIST=1 NOPAD_FMHA_FA3_PINGPONG=0" \
        "NOPAD_GPU_TEST_D=64 NOPAD_FMHA_FA3=1 NOPAD_FMHA_FA3_PERSIST=0 NOPAD_FMHA_FA3_WG=2" \
        "NOPAD_GPU_TEST_D=64 NOPAD_FMHA_FA3=1 NOPAD_FMHA_RESCALE=0" \
        "NOPAD_GPU_TEST_D=64 NOPAD_FMHA_FA3=0" \
        "NOPAD_FMHA_FA3=0 NOPAD_FMHA_WG_PIPE=0" "NOPAD_FMHA_FA3=0 NOPAD_FMHA_RESCALE=0" \
        "NOPAD_FMHA_FA3=0 NOPAD_FMHA_WG_M=128" "NOPAD_FMHA_WGMMA=0"; do
        env $setting "$BUILD/tests/test_cuda_attention" > "$OUTDIR/attention_variant.log" 2>&1 || status=1
        echo "test_cuda_attention [$setting]: $(grep -E 'PASSED|FAILED' "$OUTDIR/attention_variant.log" |
            tr '\n' ' ') worst $(grep -oE 'row rel err [0-9.e+-]+' "$OUTDIR/attention_variant.log" | awk '{print $4}' | sort -g | tail -n 1)" |
            tee -a "$OUTDIR/attention_variants.log"
    done
    command -v cuobjdump >/dev/null && echo "SASS of libnopad.so: $(cuobjdump --dump-sass "$BUILD/libnopad.so" |
        grep -oE 'HGMMA|HMMA' | sort | uniq -c | tr '\n' ' ')" | tee -a "$OUTDIR/gpu_tests.log"
fi
if want pytest; then
    # the Python package's GPU tests (torch CUDA tensors in and out) against this build
    (cd "$ROOT" && PYTHONPATH=$ROOT/python NOPAD_LIBRARY=$BUILD/libnopad.so \
        python3 -m pytest -q -p no:cacheprovider tests/python/test_cuda_encoder.py tests/python/test_attention.py) \
        > "$OUTDIR/pytest_gpu.log" 2>&1 || status=1
    tail -n 15 "$OUTDIR/pytest_gpu.log"
fi
if want sanitize; then
    # the encoder test under memcheck (NOPAD_TEST_FILTER narrows it: the full suite takes minutes)
    compute-sanitizer --tool memcheck --leak-check no --error-exitcode 3 "$BUILD/tests/test_cuda_encoder" \
        > "$OUTDIR/memcheck_encoder.log" 2>&1 || status=1
    echo "compute-sanitizer --tool memcheck, test_cuda_encoder: $(san_summary "$OUTDIR/memcheck_encoder.log")" |
        tee -a "$OUTDIR/sanitizer.log"
fi
if want sanitize_fmha; then
    # the FA3 kernel (TMA, mbarriers, named barriers, the persistent counter) on the quick shapes
    for persist in 0 1; do
        for tool in memcheck racecheck; do
            sanitize_run $tool "FA3 persist=$persist" "$OUTDIR/sanitizer_fa3_p${persist}_$tool.log" \
                "$BUILD/tests/test_cuda_attention" NOPAD_FMHA_FA3=1 NOPAD_FMHA_FA3_PERSIST=$persist \
                NOPAD_GPU_TEST_QUICK=1 NOPAD_GPU_TEST_D=64
        done
    done
    # the v5 kernels (cp.async, wgmma; dead warpgroups, the half-width last key tile) and mma.sync
    # (d = 32): the dispatch with FA3 off, and 128-row tiles forced (the pipelined kernel)
    for setting in "NOPAD_FMHA_FA3=0" "NOPAD_FMHA_FA3=0 NOPAD_FMHA_WG_M=128"; do
        for tool in memcheck racecheck; do
            # shellcheck disable=SC2086 # $setting is a list of VAR=value words
            sanitize_run $tool "v5 [$setting]" "$OUTDIR/sanitizer_v5_$tool.log" "$BUILD/tests/test_cuda_attention" \
                $setting NOPAD_GPU_TEST_QUICK=1
        done
    done
fi
if want sanitize_gemm; then
    # the skinny GEMM (bulk copies on mbarriers, cluster barriers, distributed shared memory)
    for tool in memcheck racecheck synccheck; do
        sanitize_run $tool "test_cuda_gemm *skinny*" "$OUTDIR/sanitizer_skinny_$tool.log" "$BUILD/tests/test_cuda_gemm" \
            'NOPAD_TEST_FILTER=*skinny*' NOPAD_GPU_TEST_QUICK=1
    done
fi
if want bench; then
    # the ENC table of bench/RESULTS.md (its command there adds --peers sdpa,compile,nested)
    python3 "$ROOT/bench/enc_bench.py" --lib "$BUILD/libnopad.so" ${ENC_ARGS:---quick --out $OUTDIR/enc.json} \
        > "$OUTDIR/enc_bench.log" 2>&1 || status=1
    tail -n 12 "$OUTDIR/enc_bench.log"
fi
if want fmha; then
    # the FMHA grid of bench/RESULTS.md with its peers (same seed: the same lengths every run)
    python3 "$ROOT/bench/fmha_bench.py" --lib "$BUILD/libnopad.so" --out "$OUTDIR" ${FMHA_ARGS:-} \
        > "$OUTDIR/fmha_bench.log" 2>&1 || status=1
    tail -n 40 "$OUTDIR/fmha_bench.log"
fi
if want decode; then
    # the DEC table (issue 21): LLaMA-1B-shaped random weights, decode step against the copy-bandwidth
    # floor, prefill and HF peers, SmolLM2 generation; dec.json, the HF peers' logs beside it
    PYTHONUNBUFFERED=1 python3 "$ROOT/bench/decode_bench.py" --library "$BUILD/libnopad.so" --out "$OUTDIR/dec.json" \
        ${NOPAD_SMOLLM2_GGUF:+--smollm2 "$NOPAD_SMOLLM2_GGUF"} ${DEC_ARGS:-} > "$OUTDIR/dec_bench.log" 2>&1 || status=1
    if grep -q '^## DEC' "$OUTDIR/dec_bench.log"; then sed -n '/^## DEC/,$p' "$OUTDIR/dec_bench.log"
    else tail -n 40 "$OUTDIR/dec_bench.log"; fi
fi
if want compare; then
    # Baseline against this build, on this GPU, in this call: the ENC points (enc_bench.py --quick,
    # nopad alone, for each shape:dtype of COMPARE_ENC) and the FMHA grid (fmha_bench.py
    # --only-nopad, with varlen_attn as a yardstick). Each library is timed by the bench scripts of
    # its own source tree (the C API may differ between them); the two alternate ABBA over
    # COMPARE_REPS rounds. Per point the best of the rounds is compared (ENC: the faster of direct
    # calls and graph replays, as RESULTS.md reports); a point slower by more than COMPARE_TOL
    # percent fails the step. Not timed yet: each sub-run logs its seconds; if the whole nears a
    # device call's 10 minutes, split it over two calls on the same warm machine (COMPARE_WHAT=enc,
    # then COMPARE_WHAT=fmha).
    base_lib=${BASE_LIB:-$(dirname "$BUILD")/base/libnopad.so}
    base_bench=${BASE_BENCH:-$(dirname "$(readlink -f "$base_lib")")/bench}
    cmp=$OUTDIR/compare
    mkdir -p "$cmp"
    if [ ! -f "$base_lib" ] || [ ! -f "$base_bench/enc_bench.py" ]; then
        echo "compare: no baseline ($base_lib, $base_bench): stage with --base, or set BASE_LIB and BASE_BENCH"
        status=1
    else
        [ -f "$(dirname "$base_lib")/COMMIT" ] && echo "baseline: $(tr '\n' ' ' < "$(dirname "$base_lib")/COMMIT")" | tee -a "$cmp/compare.log"
        for rep in $(seq 1 "${COMPARE_REPS:-2}"); do
            order="base new"
            [ $((rep % 2)) = 0 ] && order="new base"
            for side in $order; do
                if [ "$side" = base ]; then lib=$base_lib bench=$base_bench; else lib=$BUILD/libnopad.so bench=$ROOT/bench; fi
                for what in ${COMPARE_WHAT:-enc fmha}; do
                    t0=$(date +%s)
                    if [ "$what" = enc ]; then
                        for cfg in ${COMPARE_ENC:-base:fp16 base:bf16 large:fp16}; do
                            PYTHONUNBUFFERED=1 python3 "$bench/enc_bench.py" --lib "$lib" --quick --peers none \
                                --shape "${cfg%:*}" --dtype "${cfg#*:}" --out "$cmp/enc_${cfg%:*}_${cfg#*:}_${side}_r$rep.json" \
                                >> "$cmp/compare.log" 2>&1 || status=1
                        done
                    else
                        PYTHONUNBUFFERED=1 python3 "$bench/fmha_bench.py" --lib "$lib" --only-nopad --out "$cmp" \
                            --tag "${side}_r$rep" ${COMPARE_FMHA_ARGS:-} >> "$cmp/compare.log" 2>&1 || status=1
                    fi
                    echo "compare: round $rep, $side, $what: $(($(date +%s) - t0)) s" | tee -a "$cmp/compare.log"
                done
            done
        done
        python3 - "$cmp" "${COMPARE_TOL:-2}" <<'PY' | tee "$cmp/summary.md"
import glob, json, os, re, sys
d, tol = sys.argv[1], float(sys.argv[2])
best = {}  # (workload, point) -> {side: ms}
for f in glob.glob(os.path.join(d, "enc_*_r*.json")):
    shape, dtype, side = re.match(r"enc_(\w+?)_(\w+?)_(base|new)_r\d+\.json", os.path.basename(f)).groups()
    for r in json.load(open(f))["rows"]:
        ms = min(x for x in (r["nopad_ms"], r.get("nopad_graph_ms")) if x)
        k = ("ENC", f"{shape} {dtype} {r['batch']} x {r['max']}")
        best.setdefault(k, {})[side] = min(ms, best.get(k, {}).get(side, 1e30))
for f in glob.glob(os.path.join(d, "fmha_*_r*.json")):
    side = re.search(r"_(base|new)_r\d+\.json$", f).group(1)
    for r in json.load(open(f))["results"]:
        for impl, tag in (("nopad", ""), ("varlen_attn", " [varlen_attn]")):
            ms = r["impls"].get(impl, {}).get("ms")
            if ms is None:
                continue
            k = ("FMHA", "%s%d x %d d%d %s%s%s" % ("skew " if r["skew"] else "", r["batch"], r["max"], r["d"],
                                                  r["dtype"], " causal" if r["causal"] else "", tag))
            best.setdefault(k, {})[side] = min(ms, best.get(k, {}).get(side, 1e30))
print("| workload | point | base ms | new ms | new / base | |")
print("|---|---|---|---|---|---|")
slower = 0
for (w, p), v in sorted(best.items()):
    if "base" not in v or "new" not in v:
        print(f"| {w} | {p} | {v.get('base', '–')} | {v.get('new', '–')} | missing | **FAIL** |")
        slower += 1
        continue
    q = v["new"] / v["base"]
    yardstick = "varlen_attn" in p  # the same peer both times: how much the GPU itself moved
    bad = q > 1 + tol / 100 and not yardstick
    slower += bad
    print(f"| {w} | {p} | {v['base']:.4f} | {v['new']:.4f} | {q:.3f} | {'**SLOWER**' if bad else ''} |")
print(f"\n{slower} point(s) slower by more than {tol}% (best of the rounds; varlen_attn rows are the yardstick)")
sys.exit(1 if slower else 0)
PY
        [ "${PIPESTATUS[0]}" = 0 ] || status=1
    fi
fi
if want sweep; then
    # nopad's attention alone under several settings, same points and lengths for each:
    # SWEEP_SETTINGS (space-separated; each a comma-separated list of VAR=value), SWEEP_POINTS
    # (BxM, sBxM for the skewed mix), SWEEP_D (head sizes), SWEEP_ARGS (more fmha_bench.py arguments)
    for setting in ${SWEEP_SETTINGS:-NOPAD_FMHA_FA3=0 NOPAD_FMHA_FA3=1,NOPAD_FMHA_FA3_PERSIST=0 NOPAD_FMHA_FA3=1,NOPAD_FMHA_FA3_PERSIST=1}; do
        echo "## $setting"
        env ${setting//,/ } PYTHONUNBUFFERED=1 python3 "$ROOT/bench/fmha_bench.py" --lib "$BUILD/libnopad.so" \
            --out /tmp/sweep --only-nopad --reps 15 --d "${SWEEP_D:-64}" \
            --points "${SWEEP_POINTS:-16x512,128x512,16x1024,128x1024,8x2048,128x2048,s64x2048}" ${SWEEP_ARGS:-} \
            2>&1 | grep -E '^\||Error|error'
    done 2>&1 | tee -a "$OUTDIR/sweep.log"
fi
if want fmha_ab; then
    # nopad's attention from several builds of libnopad.so (FMHA_AB_LIBS, space-separated paths),
    # alternated twice per library, same points and lengths: A/B of a kernel change in one process order
    for rep in 1 2; do
        for lib in ${FMHA_AB_LIBS:-$BUILD/libnopad.so}; do
            echo "## rep $rep $lib"
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
if want gemm; then
    # cuBLASLt against the CUTLASS fused epilogues per GEMM (the GEMM table of bench/RESULTS.md)
    if [ -x "$BUILD/gemm_bench" ]; then
        "$BUILD/gemm_bench" ${GEMM_ARGS:---json $OUTDIR/gemm.json} 2>&1 | tee "$OUTDIR/gemm_bench.log"
        [ "${PIPESTATUS[0]}" = 0 ] || status=1
    else
        echo "gemm: no $BUILD/gemm_bench"
        status=1
    fi
fi
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
    # per-kernel times of one BERT-base forward (default batch 1 x 128), launched directly (ncu
    # serialises kernels, so this is each kernel alone, not the overlap)
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
echo "gpu_check: exit $status"
exit $status
