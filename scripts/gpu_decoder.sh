#!/usr/bin/env bash
# The GPU machine's check of the decoders, in one device call: the CUDA decoder and sampling tests,
# PyTorch's own half-precision error on the same inputs, the paged attention alone against torch
# SDPA, and the DEC benchmark. Smaller than gpu_check.sh's bundle, so the SmolLM2 GGUF (and MiniLM)
# can travel beside it in parts.
#
# Here:  [TESTS="..."] [BENCHES="..."] [BASE=OTHER_BUILD] [CLI=1] [BLAS_STUB=1] scripts/gpu_decoder.sh --stage build-cuda [GGUF PARTS [GGUF_WHEEL]]
#        writes .gpu_carry/dec/bundle.tar.xz (binaries + the Debian libraries they need) and, with
#        GGUF, splits a tar of it (and, with MINILM=1, of all-MiniLM-L6-v2 in fp16) into PARTS
#        pieces .gpu_carry/gN/models.tar.N (carry one a device call, as the carry limit allows;
#        the pieces gather in /tmp/nopad_gguf there while the machine stays warm, and so does the
#        unpacked bundle). GGUF_WHEEL: the `gguf` package for the `half`
#        step's SmolLM2 part (transformers reads GGUF through it), carried with the last piece.
# There: scripts/gpu_decoder.sh --run [steps]      (carry [".gpu_carry/dec"], then [".gpu_carry/gN"])
#        steps: gguf (keep this call's piece of the models; the last one unpacks them), test
#        (every staged test), half (HF fp16/bf16 error), attn, gemv (tools/gemv_bench: the linear
#        layers alone), decode, ab (the decode grid of base/ and this build alternated, BASE= at
#        staging), engine (bench/engine_bench.py, nopad alone: --peers none), ab-engine (workloads 4 and 1 through the engine, base/ and this
#        build alternated; AB_ENGINE="smollm2:64 1b:32"),
#        issue 22's benchmarks, each within one 10-minute device call (the JSON is rewritten as it
#        goes, so a cut run keeps what it measured):
#          engine-peers      workload 1, 32 requests: nopad + the HF peers (static eager, static
#                            + compile, generate_batch, its manager), each peer <= 120 s; ~4-9 min
#          engine-peers-256  workload 1, 256 requests, the same; ~5-9 min
#          engine-smol       workload 4, SmolLM2-135M shape, 64 requests, the same; ~3-8 min
#          flover            workload 2 (Flover), gaps 5,20,50,200 ms x 64 requests, 4 modes;
#                            ~5-9 min (each mode <= 100 s after its last arrival)
#          flover-long       workload 2, gaps 1000 ms x 32 and 5000 ms x 12 requests (fewer than
#                            64: 64 at 5 s would take 4 x 5.3 min); ~6-9 min
#          eviction          workload 3, L = 256..1792, with and without early leaving; ~1-3 min
#          serve             issue 23: bench/serve_bench.py, `nopad serve` ($BUILD/nopad: CLI=1) on the 1b
#                            shape: workload 1 (32 requests) over HTTP (SSE and plain) against the
#                            in-process engine, TTFT p50/p99 at 1, 16, 64 streams; JSON + logs in
#                            $OUT/serve/; ~2-5 min (--budget-s 300; SERVE_ARGS appends)
#          deberta           issue 25: bench/deberta_bench.py, DeBERTa-v3-base and BERT-base shapes at
#                            16x512, 128x512, 128xU[128,512], fp16: nopad (plain and graph) against HF
#                            (sdpa, or eager where DeBERTa refuses sdpa) and HF + torch.compile, each
#                            in a child process; JSON + log in $OUT/deberta/; ~6-9 min (--budget-s
#                            560; DEBERTA_ARGS appends)
#        (ENGINE_ARGS, FLOVER_ARGS, ... append to or override a stage's arguments; PNGs by
#        bench/plot_flover.py beside the JSON when matplotlib is there, else plot here)
#        ab-overlap (workloads 4 and 1 with the engine's step overlap off and on, one library,
#        alternated twice), profile-engine (bench/engine_profile.py: device spans and host gaps of a
#        throughput run, overlap off and on),
#        profile (ncu per-kernel times of one decode step at PROFILE_BATCHES, default "1 64", of
#        the PROFILE_SHAPE, default 1b (or smollm2);
#        ncu times each kernel alone with cold caches, so the sum exceeds the step's replay time);
#        test-comm (issue 39: every staged test again with NOPAD_COMM_FORCE=1, the tensor-parallel
#        path at world size one on NCCL), test-seq (issue 40: the same with
#        NOPAD_TP_SEQUENCE_PARALLEL=1 too: prompt steps and encoder forwards through the
#        sequence-parallel path, its NCCL reduce-scatters and all-gathers), ab-comm (its cost: the decode grid and the engine's
#        workloads 4 and 1 with NOPAD_COMM_FORCE off and on, alternated; AB_ROUNDS decode rounds,
#        default 3, of AB_STEPS steps, default 20), ab-comm-profile (a decode step's kernels
#        under CUPTI with the path off and on), ab-env (the decode grid under each of AB_ENVS's
#        environments, alternated),
#        quant (issue 43: bench/quant_gpu.py, the GGUF's decode step native against f16, and
#        gemv_bench --format per GEMV_FORMATS), quant-peer (the same decode step on the random GGUF
#        files bench/llamacpp_gpu.sh made in this call, beside llama.cpp CUDA's rows), quant-fp8 (FP8 weights against fp16 on random
#        checkpoints, and the FP8 GEMV alone), sanitize (compute-sanitizer memcheck over SANITIZE,
#        default test_cuda_quant),
#        pytest-cuda (tests/python/test_cuda_engine.py: the engine on CUDA),
#        engine-fp8 (issue 43: workloads 1 and 4 through the engine, fp16 and FP8 weights),
#        constrained (issue 44: bench/constrained_bench.py, the SERVE constrained row; carry
#        .gpu_carry/ctok too), constrained-profile (the same under CUPTI: where the cost goes),
#        default "gguf test". Logs and JSON to $OUT.
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
CARRY="$ROOT/.gpu_carry/dec"

if [ "${1:-}" = "--stage" ]; then
    B=$(cd "${2:?usage: gpu_decoder.sh --stage BUILD [GGUF PARTS]}" && pwd)
    stage=$(mktemp -d)
    trap 'rm -rf "$stage"' EXIT
    mkdir -p "$stage/build/tests" "$stage/build/deplibs" "$CARRY"
    rm -f "$CARRY"/*
    # the decoder's tests by default; TESTS="..." names others (e.g. test_cuda_train_ops
    # test_cuda_deberta test_cuda_attention_backward): every test binary is ~15 MB, and the carry
    # limit (64 MB with the tracked files) leaves room for about three
    tests=(${TESTS:-test_cuda_decoder test_cuda_sampling test_cuda_gemm})
    # the CLI only for the serve step (CLI=1): each binary costs ~3-4 MB of the carry compressed
    extra=()
    [ "${CLI:-0}" = 1 ] && extra+=("$B/nopad")
    # the benchmarks of the attn and gemv steps (BENCHES="" leaves them out: ~4 MB each of the carry)
    benches=(${BENCHES-attn_paged_bench gemv_bench})
    bins=("$B/libnopad.so" "${benches[@]/#/$B/}" "${extra[@]}")
    for t in "${tests[@]}"; do bins+=("$B/tests/$t"); done
    for bin in "${bins[@]}"; do [ -f "$bin" ] || { echo "missing $bin" >&2; exit 1; }; done
    # BLAS_STUB=1: OpenBLAS (36 MB, ~5 MB of the carry with the Fortran runtime it needs) left out
    # for a stub libopenblas.so.0 whose cblas_sgemm stops the program with a message: the GPU
    # paths never call the CPU's GEMM, and the room goes to another bundle (llama.cpp's)
    skip='libc|libm|libstdc\+\+|libgcc_s|libpthread|libdl|librt|ld-linux[^/]*|libcublasLt|libcublas'
    [ "${BLAS_STUB:-0}" = 1 ] && skip="$skip|libopenblas|libgfortran|libquadmath"
    for bin in "${bins[@]}"; do ldd "$bin" | awk '/=> \//{print $3}'; done | sort -u |
        grep -Ev "/($skip)\.so" | while read -r lib; do cp -L "$lib" "$stage/build/deplibs/"; done
    if [ "${BLAS_STUB:-0}" = 1 ]; then
        # the three OpenBLAS symbols the library uses (nm -D); a binary that needs more fails to load
        printf '%s\n' '#include <stdio.h>' '#include <stdlib.h>' \
            'void cblas_sgemm(void) { fputs("cblas_sgemm: OpenBLAS was left out of this GPU bundle (BLAS_STUB=1)\n", stderr); abort(); }' \
            'void openblas_set_num_threads(int n) { (void)n; }' \
            'const char *openblas_get_corename(void) { return "none (BLAS_STUB)"; }' > "$stage/blas_stub.c"
        cc -shared -fPIC -O2 -Wl,-soname,libopenblas.so.0 -o "$stage/build/deplibs/libopenblas.so.0" "$stage/blas_stub.c" || exit 1
    fi
    cp "$B/libnopad.so" "${benches[@]/#/$B/}" "${extra[@]}" "$stage/build/"
    for t in "${tests[@]}"; do cp "$B/tests/$t" "$stage/build/tests/"; done
    # BASE=OTHER_BUILD: that build's libnopad.so as base/ for the `ab` step
    if [ -n "${BASE:-}" ]; then
        mkdir -p "$stage/build/base"
        cp "$BASE/libnopad.so" "$stage/build/base/"
    fi
    # xz -9e: its 64 MiB window finds the code the binaries share (each links the library's
    # kernels), so seven test binaries and the library pack into ~6 MB, not ~45
    (cd "$stage" && tar cf - build | xz -9e -T1 > "$CARRY/bundle.tar.xz")
    if [ -n "${3:-}" ]; then
        # the models travel as one tar in PARTS pieces: the GGUF and, with MINILM=1,
        # all-MiniLM-L6-v2 with fp16 weights (minilm_f16/)
        parts=${4:-3}
        mkdir -p "$stage/models"
        ln -s "$(cd "$(dirname "$3")" && pwd)/$(basename "$3")" "$stage/models/$(basename "$3")"
        if [ "${MINILM:-0}" = 1 ]; then
            python3 "$ROOT/scripts/make_minilm_f16.py" "$stage/models/minilm_f16" || { echo "staging MiniLM failed" >&2; exit 1; }
        fi
        tar chf "$stage/models.tar" -C "$stage/models" .
        rm -rf "$ROOT"/.gpu_carry/g[0-9]
        split -n "$parts" -d -a 1 "$stage/models.tar" "$stage/models.tar."
        for ((i = 0; i < parts; i++)); do
            mkdir -p "$ROOT/.gpu_carry/g$i"
            mv "$stage/models.tar.$i" "$ROOT/.gpu_carry/g$i/"
            sha256sum "$stage/models.tar" | cut -d' ' -f1 > "$ROOT/.gpu_carry/g$i/models.sha256"
            echo "$parts" > "$ROOT/.gpu_carry/g$i/models.parts"
        done
        [ -n "${5:-}" ] && cp "$5" "$ROOT/.gpu_carry/g$((parts - 1))/"
    fi
    ls -la "$CARRY" "$ROOT"/.gpu_carry/g[0-9] 2>/dev/null
    exit 0
fi

[ "${1:-}" = "--run" ] || { echo "usage: gpu_decoder.sh --stage BUILD [GGUF PARTS] | --run [steps]" >&2; exit 2; }
shift
STEPS=${*:-gguf test}
OUT=${OUT:-$ROOT/gpu_decoder_out}
mkdir -p "$OUT" /tmp/nopad_dec /tmp/nopad_gguf
if [ -f "$CARRY/bundle.tar.xz" ] && [ -z "${KEEP_UNPACKED:-}" ]; then # KEEP_UNPACKED=1: the last call's, as it is
    rm -rf /tmp/nopad_dec/build && tar xJf "$CARRY/bundle.tar.xz" -C /tmp/nopad_dec
fi
[ -d /tmp/nopad_dec/build ] || { echo "no bundle: carry .gpu_carry/dec first" >&2; exit 1; }
BUILD=/tmp/nopad_dec/build
export LD_LIBRARY_PATH=$BUILD/deplibs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export NOPAD_TEST_DATA=$ROOT/tests/data
# NCCL lives only in the Python environment's nvidia.nccl here; the communicator opens it at run
# time ($NOPAD_NCCL_LIBRARY): test_cuda_comm and the world-of-one steps (test-comm, ab-comm) need it
if [ -z "${NOPAD_NCCL_LIBRARY:-}" ]; then
    nccl_dir=$(python3 -c 'import importlib.util as u; s = u.find_spec("nvidia.nccl"); print(list(s.submodule_search_locations)[0])' 2>/dev/null)
    [ -f "$nccl_dir/lib/libnccl.so.2" ] && export NOPAD_NCCL_LIBRARY=$nccl_dir/lib/libnccl.so.2
fi
export NCCL_NVLS_ENABLE=0 # NVLink multicast stays off on the shared machines
GGUF=/tmp/nopad_gguf/SmolLM2-135M-Instruct.Q4_1.gguf
# all-MiniLM-L6-v2 in fp16 when the models' parts carried it (MINILM=1 at staging)
[ -d /tmp/nopad_gguf/minilm_f16 ] && export NOPAD_MINILM_DIR=/tmp/nopad_gguf/minilm_f16
status=0
{
    date -u
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
    git -C "$ROOT" log -1 --format='%h %s' 2>/dev/null
} | tee "$OUT/env.txt"

for step in $STEPS; do
    case $step in
    gguf)
        for d in "$ROOT"/.gpu_carry/g[0-9]; do
            [ -d "$d" ] && cp "$d"/* /tmp/nopad_gguf/
        done
        ls /tmp/nopad_gguf
        if [ ! -f "$GGUF" ] && [ -f /tmp/nopad_gguf/models.sha256 ] &&
            [ "$(ls /tmp/nopad_gguf/models.tar.[0-9] 2>/dev/null | wc -l)" -ge "$(cat /tmp/nopad_gguf/models.parts)" ]; then
            cat /tmp/nopad_gguf/models.tar.[0-9] > /tmp/nopad_gguf/models.tar
            if [ "$(sha256sum /tmp/nopad_gguf/models.tar | cut -d' ' -f1)" = "$(cat /tmp/nopad_gguf/models.sha256)" ]; then
                tar xf /tmp/nopad_gguf/models.tar -C /tmp/nopad_gguf && rm /tmp/nopad_gguf/models.tar*
                echo "models: assembled $(ls /tmp/nopad_gguf)"
            else
                echo "models: checksum mismatch" && status=1
            fi
        fi
        ;;
    test)
        [ -f "$GGUF" ] && export NOPAD_SMOLLM2_GGUF=$GGUF
        for t in $(ls "$BUILD/tests"); do
            [ "$t" = test_cuda_attention_backward ] && continue
            echo "== $t"
            (cd "$ROOT" && timeout 300 "$BUILD/tests/$t") > "$OUT/$t.log" 2>&1
            rc=$?
            tail -5 "$OUT/$t.log"
            echo "$t: exit $rc"
            [ $rc -eq 0 ] || status=1
        done
        # training's attention (when staged): the C test against the CPU ops, dumping cases for
        # the torch autograd check (padded SDPA, float32) that follows
        [ -f "$BUILD/tests/test_cuda_attention_backward" ] || continue
        echo "== test_cuda_attention_backward"
        rm -rf /tmp/nopad_attn_bwd
        (cd "$ROOT" && NOPAD_ATTN_BWD_DUMP=/tmp/nopad_attn_bwd timeout 300 "$BUILD/tests/test_cuda_attention_backward") \
            > "$OUT/test_cuda_attention_backward.log" 2>&1
        rc=$?
        tail -5 "$OUT/test_cuda_attention_backward.log"
        echo "test_cuda_attention_backward: exit $rc"
        [ $rc -eq 0 ] || status=1
        echo "== torch_attention_backward_check"
        timeout 300 python3 "$ROOT/scripts/torch_attention_backward_check.py" /tmp/nopad_attn_bwd \
            > "$OUT/torch_attention_backward_check.log" 2>&1
        rc=$?
        tail -30 "$OUT/torch_attention_backward_check.log"
        echo "torch_attention_backward_check: exit $rc"
        [ $rc -eq 0 ] || status=1
        ;;
    pytest-cuda)
        # the Python package's CUDA engine tests (tests/python/test_cuda_engine.py) on this build
        (cd "$ROOT" && PYTHONPATH=$ROOT/python NOPAD_LIBRARY=$BUILD/libnopad.so timeout 300 \
            python3 -m pytest -q -p no:cacheprovider tests/python/test_cuda_engine.py) > "$OUT/pytest_cuda.log" 2>&1 ||
            status=1
        tail -n 5 "$OUT/pytest_cuda.log"
        ;;
    test-comm|test-seq)
        # issue 39: the tensor-parallel path at world size one: every staged test again with
        # NOPAD_COMM_FORCE=1, so models keep a group of one and their collectives (NCCL all-reduces,
        # the LM head's merge of greedy choices) run inside every step. test-seq (issue 40): with
        # NOPAD_TP_SEQUENCE_PARALLEL=1 too, every prompt step and encoder forward sequence-parallel
        # (at one rank the chunk is every row: NCCL's reduce-scatter and all-gather in place, and
        # gate|up and SwiGLU unfused); the row split itself is tested on the CPU (mpi_tp_sequence)
        seq=0 tag=comm
        [ "$step" = test-seq ] && seq=1 tag=seq
        echo "NCCL: ${NOPAD_NCCL_LIBRARY:-not found}"
        [ -f "$GGUF" ] && export NOPAD_SMOLLM2_GGUF=$GGUF
        for t in $(ls "$BUILD/tests"); do
            [ "$t" = test_cuda_attention_backward ] && continue
            echo "== $t (NOPAD_COMM_FORCE=1 NOPAD_TP_SEQUENCE_PARALLEL=$seq)"
            (cd "$ROOT" && NOPAD_COMM_FORCE=1 NOPAD_TP_SEQUENCE_PARALLEL=$seq timeout 300 "$BUILD/tests/$t") \
                > "$OUT/${t}_$tag.log" 2>&1
            rc=$?
            tail -5 "$OUT/${t}_$tag.log"
            echo "$t (NOPAD_COMM_FORCE=1 NOPAD_TP_SEQUENCE_PARALLEL=$seq): exit $rc"
            [ $rc -eq 0 ] || status=1
        done
        ;;
    ab-comm)
        # issue 39's cost of the tensor-parallel path at world size one: the engine's throughput
        # workloads and the decode-step grid with NOPAD_COMM_FORCE off and on, one library,
        # alternated (AB_ENGINE: SHAPE:REQUESTS pairs, default workload 4, then 1)
        echo "NCCL: ${NOPAD_NCCL_LIBRARY:-not found}"
        for round in $(seq 1 "${AB_ROUNDS:-3}"); do
            # odd rounds off first, even rounds on first: a GPU that slows as a run goes on
            # (clocks, heat) must not always charge the same side
            order="0 1"
            [ $((round % 2)) = 0 ] && order="1 0"
            for force in $order; do
                f="$OUT/ab_comm_decode_force${force}_$round"
                NOPAD_COMM_FORCE=$force timeout 150 python3 "$ROOT/bench/decode_bench.py" --library "$BUILD/libnopad.so" \
                    --sections decode --dtypes fp16 --batches ${AB_BATCHES:-1,8,64} --steps ${AB_STEPS:-20} --contexts 512 --prefill 1x64 \
                    --prefill-reps 1 --prefill-warmup 0 --out "$f.json" > "$f.log" 2>&1 || status=1
                echo "== decode force $force round $round: $(grep '^| [0-9]' "$f.log" | awk -F'|' '{printf "%s:%s ", $2, $3}')"
            done
        done
        for w in ${AB_ENGINE:-smollm2:64 1b:32}; do
            for round in 1 2; do
                for force in 0 1; do
                    f="$OUT/ab_comm_${w%%:*}_force${force}_$round"
                    NOPAD_COMM_FORCE=$force timeout 150 python3 "$ROOT/bench/engine_bench.py" --library "$BUILD/libnopad.so" \
                        --shape "${w%%:*}" --requests "${w##*:}" --peers none --reps 2 --out "$f.json" > "$f.log" 2>&1 || status=1
                    echo "== $w force $force round $round: $(grep -E '^# nopad .* rep ' "$f.log" | sed 's/^# nopad //' | tr '\n' ' ')"
                done
            done
        done
        ;;
    ab-env)
        # the decode grid under several environments, one library, their order rotated each
        # round: AB_ENVS="VAR=a OTHER=b;VAR=c;..." (';' between variants, spaces inside one),
        # AB_ROUNDS rounds (default 2) of AB_STEPS steps (default 100) at AB_BATCHES
        IFS=';' read -r -a variants <<< "${AB_ENVS:?ab-env needs AB_ENVS}"
        n=${#variants[@]}
        for round in $(seq 1 "${AB_ROUNDS:-2}"); do
            for k in $(seq 0 $((n - 1))); do
                v=$(( (k + round - 1) % n ))
                f="$OUT/ab_env_v${v}_$round"
                env ${variants[$v]} timeout 150 python3 "$ROOT/bench/decode_bench.py" --library "$BUILD/libnopad.so" \
                    --sections decode --dtypes fp16 --batches ${AB_BATCHES:-1,8,32,64} --steps ${AB_STEPS:-100} --contexts 512 \
                    --prefill 1x64 --prefill-reps 1 --prefill-warmup 0 --out "$f.json" > "$f.log" 2>&1 || status=1
                echo "== [${variants[$v]}] round $round: $(grep '^| [0-9]' "$f.log" | awk -F'|' '{printf "%s:%s ", $2, $3}')"
                grep '^XP ' "$f.log"
            done
        done
        ;;
    ab-comm-profile)
        # where a decode step differs with the path at world size one: the CUPTI timeline of
        # AB_PROFILE_BATCH (default 64) rows at context 512, NOPAD_COMM_FORCE off and on
        for force in 0 1; do
            f="$OUT/ab_comm_profile_b${AB_PROFILE_BATCH:-64}_force$force"
            NOPAD_COMM_FORCE=$force timeout 150 python3 "$ROOT/bench/decode_profile.py" --library "$BUILD/libnopad.so" \
                --batch "${AB_PROFILE_BATCH:-64}" --context 512 --timeline --steps 20 > "$f.json" 2> "$f.log" || status=1
            echo "== decode step profile force $force: $(head -c 300 "$f.json" | tr '\n' ' ')"
        done
        ;;
    quant)
        # issue 43's GPU rows: the GGUF's decode step with its blocks kept against dequantised to
        # fp16 (bench/quant_gpu.py), and the quantized GEMV alone per format (gemv_bench --format)
        [ -f "$GGUF" ] || { echo "quant: no GGUF (the gguf step first)"; status=1; continue; }
        mkdir -p "$OUT/quant"
        timeout 300 python3 "$ROOT/bench/quant_gpu.py" --library "$BUILD/libnopad.so" --gguf "$GGUF" \
            --out "$OUT/quant/smollm2_q4_1.json" ${QUANT_ARGS:-} 2>&1 | tee "$OUT/quant/smollm2_q4_1.log" | grep -v '^{' || status=1
        for fmt in f16 ${GEMV_FORMATS:-q4_1 q8_0 q4_k q6_k}; do
            timeout 120 "$BUILD/gemv_bench" --format $fmt --tokens 1,8,32 > "$OUT/quant/gemv_$fmt.jsonl" 2>&1 || status=1
            echo "== gemv $fmt: $(grep -o '"mode": "chain", "tokens": [0-9]*.*"us": [0-9.]*' "$OUT/quant/gemv_$fmt.jsonl" | tr '\n' ' ')"
            [ $fmt = f16 ] && continue
            # the same weights 2 bytes off: the direct kernel, which reads any address
            timeout 120 "$BUILD/gemv_bench" --format $fmt --tokens 1,8,32 --misalign > "$OUT/quant/gemv_${fmt}_misaligned.jsonl" 2>&1 || status=1
            echo "== gemv $fmt misaligned: $(grep -o '"mode": "chain", "tokens": [0-9]*.*"us": [0-9.]*' "$OUT/quant/gemv_${fmt}_misaligned.jsonl" | tr '\n' ' ')"
        done
        ;;
    quant-peer)
        # issue 43's GPU rows beside llama.cpp CUDA: nopad's decode step (bench/quant_gpu.py, native
        # against f16) on the files bench/llamacpp_gpu.sh made in this call (its `models` step,
        # /tmp/lcp/models while the machine is warm), one JSON a file; QUANT_PEER_FILTER (a regex on
        # "<shape> <quant>") picks some
        mkdir -p "$OUT/quant"
        bash "$ROOT/bench/llamacpp_gpu.sh" --paths | grep -E "${QUANT_PEER_FILTER:-.}" | while read -r shape quant path qshape; do
            [ -f "$path" ] || { echo "quant-peer: no $path (llamacpp_gpu.sh --run models first)"; continue; }
            timeout 240 python3 "$ROOT/bench/quant_gpu.py" --library "$BUILD/libnopad.so" --model "$path" --shape "$qshape" \
                --out "$OUT/quant/peer_${shape}_$quant.json" ${QUANT_ARGS:-} 2>&1 |
                tee "$OUT/quant/peer_${shape}_$quant.log" | grep -v '^{'
        done
        ;;
    quant-fp8)
        # issue 43's FP8 rows: random fp16 checkpoints of FP8_SHAPES (default "1b smollm2") decoded
        # with their linear weights quantized to FP8 at load against fp16 (bench/quant_gpu.py), and
        # the FP8 GEMV alone (gemv_bench --format fp8) beside the fp16 one
        mkdir -p "$OUT/quant"
        for shape in ${FP8_SHAPES:-1b smollm2}; do
            timeout 300 python3 "$ROOT/bench/quant_gpu.py" --library "$BUILD/libnopad.so" --shape "$shape" \
                --weights fp8,f16 --out "$OUT/quant/fp8_$shape.json" ${QUANT_ARGS:-} 2>&1 |
                tee "$OUT/quant/fp8_$shape.log" | grep -v '^{' || status=1
        done
        for fmt in f16 fp8; do
            timeout 120 "$BUILD/gemv_bench" --format $fmt --tokens 1,8,32 > "$OUT/quant/gemv_$fmt.jsonl" 2>&1 || status=1
            echo "== gemv $fmt: $(grep -o '"mode": "chain", "tokens": [0-9]*.*"us": [0-9.]*' "$OUT/quant/gemv_$fmt.jsonl" | tr '\n' ' ')"
        done
        ;;
    sanitize)
        # compute-sanitizer's memcheck over the staged tests named in SANITIZE (default
        # test_cuda_quant), their kernels only: whole models under memcheck take minutes
        cs=$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -1)
        [ -n "$cs" ] || { echo "sanitize: no compute-sanitizer"; status=1; continue; }
        for t in ${SANITIZE:-test_cuda_quant}; do
            (cd "$ROOT" && env -u NOPAD_SMOLLM2_GGUF timeout 400 "$cs" --tool memcheck --error-exitcode 9 "$BUILD/tests/$t") \
                > "$OUT/${t}_memcheck.log" 2>&1
            rc=$?
            tail -4 "$OUT/${t}_memcheck.log"
            echo "$t under memcheck: exit $rc"
            [ $rc -eq 0 ] || status=1
        done
        ;;
    constrained)
        # issue 44's SERVE constrained row: 64 requests, half under a 10-field JSON schema, against
        # the same requests unconstrained (bench/constrained_bench.py); random checkpoints of the
        # smollm2 and 1b shapes with the tokenizers staged here (carry .gpu_carry/ctok, written by
        # `bench/constrained_bench.py tokenizers`), then the real SmolLM2 when its GGUF is here
        # (CONSTRAINED_RANDOM=0: the real SmolLM2 only)
        mkdir -p "$OUT/constrained"
        if [ "${CONSTRAINED_RANDOM:-1}" = 1 ]; then
            timeout 300 python3 "$ROOT/bench/constrained_bench.py" run --library "$BUILD/libnopad.so" \
                --tokenizers "$ROOT/.gpu_carry/ctok" --out "$OUT/constrained/random.json" ${CONSTRAINED_ARGS:-} \
                2>&1 | tee "$OUT/constrained/random.log" | grep '^# [a-z0-9]*:' || status=1
        fi
        # the real SmolLM2 with its blocks kept (native) and dequantised to fp16
        for w in ${CONSTRAINED_WEIGHTS:-native f16}; do
            [ -f "$GGUF" ] || break
            timeout 200 python3 "$ROOT/bench/constrained_bench.py" run --library "$BUILD/libnopad.so" \
                --tokenizers "$ROOT/.gpu_carry/ctok" --shapes smollm2 --model "smollm2=$GGUF" --weights $w \
                --out "$OUT/constrained/smollm2_gguf_$w.json" ${CONSTRAINED_ARGS:-} \
                2>&1 | tee "$OUT/constrained/smollm2_gguf_$w.log" | grep '^# [a-z0-9]*:' | sed "s/^/$w /" || status=1
        done
        ;;
    constrained-profile)
        # where the constrained requests' cost goes: one constrained and one plain pass per shape
        # under CUPTI (bench/constrained_bench.py profile: device spans, idle gaps, kernels)
        mkdir -p "$OUT/constrained"
        timeout 300 python3 "$ROOT/bench/constrained_bench.py" profile --library "$BUILD/libnopad.so" \
            --tokenizers "$ROOT/.gpu_carry/ctok" --out "$OUT/constrained/profile.json" ${CONSTRAINED_ARGS:-} \
            2>&1 | tee "$OUT/constrained/profile.log" | grep '^# [a-z0-9]* ' || status=1
        ;;
    half)
        args=("$ROOT/tests/data" --out "$OUT/hf_half_error.json")
        if [ -f "$GGUF" ]; then
            python3 -m pip install --no-index --no-deps /tmp/nopad_gguf/gguf-*.whl 2>&1 | tail -1
            args+=(--gguf "$GGUF")
        fi
        timeout 300 python3 "$ROOT/scripts/hf_decoder_half_error.py" "${args[@]}" 2>&1 | grep -v Warning | tail -12 || status=1
        ;;
    attn)
        timeout 300 python3 "$ROOT/bench/attn_decode_bench.py" --bench "$BUILD/attn_paged_bench" \
            --out "$OUT/attn_decode.json" 2>&1 | tee "$OUT/attn_decode.log" || status=1
        ;;
    gemv)
        "$BUILD/gemv_bench" ${GEMV_ARGS:-} | tee "$OUT/gemv.jsonl" || status=1
        ;;
    ab)
        # the decode-step grid (fp16, decode only), base/ and this build alternated twice
        [ -f "$BUILD/base/libnopad.so" ] || { echo "ab: no base/ (stage with BASE=OTHER_BUILD)"; status=1; continue; }
        for round in 1 2; do
            for lib in base new; do
                l=$BUILD/libnopad.so
                [ $lib = base ] && l=$BUILD/base/libnopad.so
                timeout 120 python3 "$ROOT/bench/decode_bench.py" --library "$l" --sections decode --dtypes fp16 \
                    --batches ${AB_BATCHES:-1,8,16,32,64} --contexts 512,2048 --prefill 1x64 --prefill-reps 1 \
                    --prefill-warmup 0 --out "$OUT/ab_${lib}_$round.json" ${AB_ARGS:-} > "$OUT/ab_${lib}_$round.log" 2>&1 || status=1
                echo "== $lib round $round"
                grep '^| [0-9]' "$OUT/ab_${lib}_$round.log" | awk -F'|' '{printf "%s:%s ", $2, $3} END {print ""}'
            done
        done
        ;;
    ab-engine)
        # issue 22's throughput workloads through nopad.Engine alone, base/ and this build alternated
        # twice; AB_ENGINE: SHAPE:REQUESTS pairs (default workload 4, then 1)
        [ -f "$BUILD/base/libnopad.so" ] || { echo "ab-engine: no base/ (stage with BASE=OTHER_BUILD)"; status=1; continue; }
        for w in ${AB_ENGINE:-smollm2:64 1b:32}; do
            for round in 1 2; do
                for lib in base new; do
                    l=$BUILD/libnopad.so
                    [ $lib = base ] && l=$BUILD/base/libnopad.so
                    f="$OUT/ab_engine_${w%%:*}_${lib}_$round"
                    timeout 150 python3 "$ROOT/bench/engine_bench.py" --library "$l" --shape "${w%%:*}" \
                        --requests "${w##*:}" --peers none --reps 2 --out "$f.json" > "$f.log" 2>&1 || status=1
                    echo "== $w $lib round $round: $(grep -E '^# nopad .* rep ' "$f.log" | sed 's/^# nopad //' | tr '\n' ' ')"
                done
            done
        done
        ;;
    decode)
        [ -f "$GGUF" ] && export NOPAD_SMOLLM2_GGUF=$GGUF
        timeout 590 python3 "$ROOT/bench/decode_bench.py" --library "$BUILD/libnopad.so" \
            --out "$OUT/dec.json" ${DEC_ARGS:-} 2>&1 | tee "$OUT/dec.log" || status=1
        ;;
    ab-overlap)
        # issue 22's throughput workloads with the engine's step overlap off and on (one library),
        # alternated twice; AB_ENGINE: SHAPE:REQUESTS pairs (default workload 4, then 1)
        for w in ${AB_ENGINE:-smollm2:64 1b:32}; do
            for round in 1 2; do
                for mode in off on; do
                    f="$OUT/ab_overlap_${w%%:*}_${mode}_$round"
                    timeout 150 python3 "$ROOT/bench/engine_bench.py" --library "$BUILD/libnopad.so" --shape "${w%%:*}" \
                        --requests "${w##*:}" --peers none --reps 2 --overlap $mode --out "$f.json" > "$f.log" 2>&1 || status=1
                    echo "== $w overlap $mode round $round: $(grep -E '^# nopad .* rep ' "$f.log" | sed 's/^# nopad //' | tr '\n' ' ')"
                done
            done
        done
        ;;
    ab-flover)
        # workload 2's engine alone at gaps 5, 20, 50 ms, the step overlap off and on, alternated twice
        for round in 1 2; do
            for mode in off on; do
                f="$OUT/ab_flover_${mode}_$round"
                timeout 200 python3 "$ROOT/bench/engine_arrivals.py" flover --gaps 5,20,50 --requests 64 --modes engine \
                    --overlap $mode --library "$BUILD/libnopad.so" --budget-s 180 --out "$f.json" > "$f.log" 2>&1 || status=1
                echo "== flover overlap $mode round $round:"; grep -E '^# gap' "$f.log" | sed 's/^/   /'
            done
        done
        ;;
    profile-engine)
        # where a throughput run's wall time goes on the device (bench/engine_profile.py), overlap
        # off and on; PROFILE_ENGINE: SHAPE:REQUESTS pairs
        for w in ${PROFILE_ENGINE:-1b:32 smollm2:64}; do
            for mode in off on; do
                f="$OUT/engine_profile_${w%%:*}_${w##*:}_$mode"
                timeout 200 python3 "$ROOT/bench/engine_profile.py" --library "$BUILD/libnopad.so" --shape "${w%%:*}" \
                    --requests "${w##*:}" --overlap $mode --out "$f.json" > "$f.log" 2>&1 || status=1
                python3 - "$f.json" <<'PY' || tail -5 "$f.log"
import json, sys
r = json.load(open(sys.argv[1]))
print("== %s x%d overlap %s: plain %s s, profiled %.3f s; device spans %.3f s + gaps %.3f s over %d steps" % (
    r["shape"], r["requests"], r["overlap"], r["wall_s_plain"], r["wall_s_profiled"], r["span_s_sum"], r["gap_s_sum"], r["steps"]))
for g in r["groups"]:
    print("   %5d tokens: %4d steps, span %7.1f us, gap %6.1f us (median)" % (g["tokens"], g["steps"], g["span_us_median"], g["gap_us_median"] or -1))
PY
            done
        done
        ;;
    engine)
        timeout 300 python3 "$ROOT/bench/engine_bench.py" --library "$BUILD/libnopad.so" \
            --out "$OUT/engine.json" --peers none ${ENGINE_ARGS:-} 2>&1 | tee "$OUT/engine.log" || status=1
        ;;
    engine-fp8)
        # issue 43: workloads 1 (1b, 32 requests) and 4 (smollm2, 64) through the engine with fp16
        # and FP8 weights (the random checkpoints quantized at load), tokens/s and bytes in memory
        mkdir -p "$OUT/engine_fp8"
        for a in "1b 32" "smollm2 64"; do
            read -r shp nreq <<< "$a"
            timeout 280 python3 "$ROOT/bench/engine_bench.py" --library "$BUILD/libnopad.so" --shape "$shp" \
                --requests "$nreq" --peers none --reps 2 --weights f16,fp8 \
                --out "$OUT/engine_fp8/engine_fp8_${shp}_$nreq.json" ${ENGINE_FP8_ARGS:-} 2>&1 |
                tee "$OUT/engine_fp8/engine_fp8_${shp}_$nreq.log" | grep -v '^{' || status=1
        done
        ;;
    engine-peers | engine-peers-256 | engine-smol)
        case $step in
        engine-peers) a=(--shape 1b --requests 32) name=engine_peers_1b_32 ;;
        engine-peers-256) a=(--shape 1b --requests 256) name=engine_peers_1b_256 ;;
        engine-smol) a=(--shape smollm2 --requests 64) name=engine_peers_smollm2_64 ;;
        esac
        mkdir -p "$OUT/$name"
        timeout 595 python3 "$ROOT/bench/engine_bench.py" --library "$BUILD/libnopad.so" "${a[@]}" \
            --budget-s 550 --out "$OUT/$name/$name.json" ${ENGINE_PEERS_ARGS:-} 2>&1 | grep -v Warning |
            tee "$OUT/$name/$name.log" || status=1
        rm -f "$OUT/$name"/workload_*.json # the lengths are drawn again from the seed in the JSON
        ;;
    flover | flover-long | eviction)
        case $step in
        flover) a=(flover --gaps 5,20,50,200 --requests 64 --mode-limit-s 100) name=flover ;;
        flover-long) a=(flover --gaps 1000,5000 --requests-per-gap 1000:32,5000:12 --mode-limit-s 60) name=flover_long ;;
        eviction) a=(eviction --requests 32) name=eviction ;;
        esac
        mkdir -p "$OUT/$name"
        timeout 595 python3 "$ROOT/bench/engine_arrivals.py" "${a[@]}" --library "$BUILD/libnopad.so" \
            --budget-s 560 --out "$OUT/$name/$name.json" ${FLOVER_ARGS:-} 2>&1 | tee "$OUT/$name/$name.log" || status=1
        if python3 -c "import matplotlib" 2>/dev/null; then
            python3 "$ROOT/bench/plot_flover.py" "$OUT/$name/$name.json" --outdir "$OUT/$name" || status=1
        else
            echo "no matplotlib here: python3 bench/plot_flover.py $name.json on the development machine"
        fi
        ;;
    serve)
        mkdir -p "$OUT/serve"
        timeout 420 python3 "$ROOT/bench/serve_bench.py" --cli "$BUILD/nopad" --library "$BUILD/libnopad.so" \
            --shape 1b --device cuda --budget-s 300 --out "$OUT/serve/serve.json" ${SERVE_ARGS:-} 2>&1 |
            grep -v Warning | tee "$OUT/serve/serve.log" || status=1
        ;;
    deberta)
        mkdir -p "$OUT/deberta"
        timeout 595 python3 "$ROOT/bench/deberta_bench.py" --library "$BUILD/libnopad.so" --budget-s 560 \
            --out "$OUT/deberta/deberta.json" ${DEBERTA_ARGS:-} 2>&1 | grep -v Warning |
            tee "$OUT/deberta/deberta.log" || status=1
        ;;
    profile)
        for bb in ${PROFILE_BATCHES:-1 64}; do
            timeout 300 ncu --clock-control none --nvtx --nvtx-include "decode_step/" \
                --metrics gpu__time_duration.sum --csv python3 "$ROOT/bench/decode_profile.py" \
                --library "$BUILD/libnopad.so" --batch "$bb" --context 512 --shape "${PROFILE_SHAPE:-1b}" \
                > "$OUT/profile_b$bb.csv" 2> "$OUT/profile_b$bb.err"
            python3 - "$OUT/profile_b$bb.csv" <<'PY'
import csv, sys, collections
rows = [r for r in csv.DictReader(l for l in open(sys.argv[1]) if l.startswith('"'))]
tot = collections.defaultdict(float); n = collections.Counter()
for r in rows:
    if r.get("Metric Name") != "gpu__time_duration.sum": continue
    name = r["Kernel Name"].split("(")[0].split("<")[0][:60]
    v = float(r["Metric Value"].replace(",", "")); unit = r["Metric Unit"]
    tot[name] += v * {"nsecond": 1e-3, "ns": 1e-3, "msecond": 1e3, "ms": 1e3}.get(unit, 1.0)
    n[name] += 1
print(sys.argv[1], "kernels", sum(n.values()), "sum us %.1f" % sum(tot.values()))
for k, v in sorted(tot.items(), key=lambda kv: -kv[1]): print("  %8.1f us  %4d x  %s" % (v, n[k], k))
PY
        done
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
