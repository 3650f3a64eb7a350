#!/usr/bin/env bash
# Issue 43's GPU peer: llama.cpp's CUDA build (from PyPI's llama-cpp-python sdist,
# vendor/llama.cpp), carried to the GPU machine, timed on GGUF files made there from random weights
# (the models cannot travel: the carry holds ~20 MB of ours).
#
# The build (sm_90a only; the flash-attention kernels left out, see below):
#   pip download --no-binary :all: --no-deps llama-cpp-python   # 0.3.36: vendor/llama.cpp inside
#   cmake -S .../vendor/llama.cpp -B /tmp/lcp-cuda -G Ninja $CMAKE_FLAGS   # (below)
#   bench/llamacpp_gpu.sh --patch .../vendor/llama.cpp    # llama-batched-bench flushes its rows
#   ninja -C /tmp/lcp-cuda llama-bench llama-batched-bench llama-quantize
# On the 2-core development machine this is hours: ~290 steps, ~190 of them nvcc (mmvq.cu alone
# 70 s of CPU, an mmq instance 45 s, measured here), when other work shares the cores; so the
# sources travel (--stage-src, 5 MB) and the GPU machine builds them on its 16 cores, once
# (LCP_KEEP_BUILD=1 brings the binaries back to carry next time). --stage packs a build made here.
# GGML_CUDA_FA=OFF: no flash-attention kernels (82 of ggml-cuda's template files). llama-bench's
# default is `-fa auto`, which turns flash attention on where the backend has it; in this build it
# resolves to off, so the rows are llama.cpp's `-fa 0` (this script passes -fa off to say so). At
# context 512 attention is a small share of a decode step; the rows say flash_attn 0.
# CUDA graphs stay on (llama.cpp's top-level default), as in its release builds.
#
# Here:  bench/llamacpp_gpu.sh --stage [BUILD [LLAMA_CPP_SRC]]
#        (defaults /tmp/lcp-cuda and the sdist's vendor/llama.cpp under /tmp/lcp-src): the three
#        binaries stripped, the libraries they need that the GPU machine lacks (not libcuda, nor
#        cuBLAS: the machine's CUDA 13 toolkit and torch's nvidia-cublas wheel have it), and the
#        sdist's gguf-py (bench/make_gguf_shape.py writes GGUF through it) into
#        .gpu_carry/lcp/lcp.tar.xz (at most 20 MB, checked).
# Or:    bench/llamacpp_gpu.sh --stage-src [LLAMA_CPP_SRC]: the sources instead (~5 MB,
#        .gpu_carry/lcp/lcp-src.tar.xz), built with the same flags by --run on the GPU machine
#        (nvcc 13, CMake, ninja there; all its cores) when no lcp.tar.xz is carried. With
#        LCP_KEEP_BUILD=1 that build comes back as $OUT/lcp.tar.xz.part0, part1 ... (15 MiB each):
#        `cat lcp.tar.xz.part* > .gpu_carry/lcp/lcp.tar.xz` here (and remove lcp-src.tar.xz), and
#        later calls skip the build.
# There: bench/llamacpp_gpu.sh --run [models|bench|batched ...]   (carry [".gpu_carry/lcp"])
#        models: the f16 GGUF of each shape from random weights, then llama-quantize to each of
#          QUANTS (default "Q4_1 Q8_0 Q4_K_M"), in $LCP_MODELS (default /tmp/lcp/models), kept
#          while the machine stays warm (a file already there is not made again);
#        bench: llama-bench -p 512 -n 128 -ngl 99 -fa off -o json on every file
#          (bench_<shape>_<quant>.json, stderr beside it in .log);
#        batched: llama-batched-bench -ngl 99 -fa off -npp 448 -ntg 128 -npl 1,8,32,64 (each
#          sequence decodes from 448 to 576 tokens of context: 512 on average, as
#          bench/quant_gpu.py's --context 512) --output-format jsonl
#          (batched_<shape>_<quant>.jsonl);
#        build: nothing more than the build from the sources, when they are what was carried
#          (it comes before any step; ~5-10 min on 16 cores, a guess: a build cut by
#          LCP_BUILD_TIMEOUT, default 540 s, exits 3 and the next call goes on);
#        default: models bench batched. LCP_NGL (99), LCP_PP, LCP_TG, LCP_NPP, LCP_NPL, LCP_NTG
#        change the lengths and layers (a check on a CPU: small ones, LCP_NGL=0). The raw files
#        gather in $LCP_DIR/out (default /tmp/lcp/out); after each step $OUT gets three files (a device call brings back 8 at most):
#          llamacpp_gpu_<date>_<gpu>.json (every llama-bench row and llama-batched-bench row, each
#          with its shape and quant, and the build), .log (what this script printed), and
#          _raw.tar.gz (the raw files: JSON, JSONL, each tool's stderr, the quantize logs).
#        Environment: SHAPES (default "smollm2 llama1b"),
#        QUANTS, LCP_BENCH_ARGS / LCP_BATCHED_ARGS (appended).
#        bench/llamacpp_gpu.sh --paths: one line per file, "<shape> <quant> <path> <quant_gpu shape>",
#        for bench/quant_gpu.py on the same files in the same call (the fourth column is
#        quant_gpu.py's --shape for the KV bytes of its floor).
# Shapes (bench/make_gguf_shape.py's arguments):
#   smollm2: SmolLM2-135M (hidden 576, 30 layers, 9 heads, 3 KV heads, FFN 1536, vocab 49152,
#            RoPE base 100000, tied), as decode_bench.SHAPES["smollm2"];
#   llama1b: decode_bench.SHAPES["1b"] (hidden 2048, 16 layers, 32 heads, 4 KV heads, FFN 5632,
#            vocab 32000, RoPE base 10000), so quant_gpu.py's --shape 1b counts its KV bytes right.
#            (make_gguf_shape.py's own default is LLaMA-3.2-1B: 8 KV heads, FFN 8192; the CPU rows'
#            file; LCP_1B_ARGS="" picks that one instead, and quant_gpu.py has no shape for it.)
# SmolLM2's rows of 576 are no multiple of 256, so its Q4_K_M file is mostly Q5_0 (llama-quantize's
# fallback for Q4_K; Q8_0 for Q6_K), as SmolLM2's published Q4_K_M files are; llama1b's is Q4_K/Q6_K.
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
CARRY="$ROOT/.gpu_carry/lcp"
MAX_BYTES=$((20 * 1024 * 1024))
BINS=(llama-bench llama-batched-bench llama-quantize)
# the build's flags (also those of the carried build, above)
# (LCP_CMAKE_FLAGS replaces them: a CPU build, -DGGML_CUDA=OFF, tests the script on a machine with no GPU)
CMAKE_FLAGS=${LCP_CMAKE_FLAGS:-"-DCMAKE_BUILD_TYPE=Release -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90a-real -DBUILD_SHARED_LIBS=OFF \
-DGGML_NATIVE=OFF -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DGGML_CUDA_FA=OFF -DGGML_CUDA_NCCL=OFF -DLLAMA_BUILD_TESTS=OFF \
-DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF -DCMAKE_CUDA_COMPILER=/usr/local/cuda/bin/nvcc"}

patch_src() {  # $1: vendor/llama.cpp. llama-batched-bench prints its rows through common's log
    # thread and returns without flushing it, so the last rows can be lost at exit (the logger is
    # leaked on purpose, upstream issue 22142; seen here: the B=2 row missing from one run of
    # three); one line flushes it. Timing is not touched.
    local f="$1/tools/batched-bench/batched-bench.cpp"
    grep -q "common_log_pause(common_log_main())" "$f" && return 0
    perl -0pi -e 's/(\n    llama_backend_free\(\);\n)(\n    return 0;\n\}\n)/$1    common_log_pause(common_log_main()); \/\/ flush the rows (bench\/llamacpp_gpu.sh)\n$2/' "$f"
    grep -q "common_log_pause(common_log_main())" "$f" || { echo "patching $f failed: its end is not as expected" >&2; return 1; }
}
if [ "${1:-}" = "--patch" ]; then
    patch_src "${2:?usage: llamacpp_gpu.sh --patch LLAMA_CPP_SRC}" && echo "patched $2/tools/batched-bench/batched-bench.cpp"
    exit
fi

if [ "${1:-}" = "--stage-src" ]; then
    # the fallback: the sources (~5 MB), built on the GPU machine by --run (its 16 cores, nvcc 13)
    SRC=${2:-$(ls -d /tmp/lcp-src/llama_cpp_python-*/vendor/llama.cpp 2>/dev/null | tail -1)}
    [ -f "$SRC/CMakeLists.txt" ] || { echo "no llama.cpp sources in '$SRC'" >&2; exit 1; }
    SRC=$(cd "$SRC" && pwd)
    mkdir -p "$CARRY"
    rm -f "$CARRY/lcp.tar.xz"
    stage=$(mktemp -d)
    trap 'rm -rf "$stage"' EXIT
    echo "$(basename "$(dirname "$(dirname "$SRC")")") sdist, vendor/llama.cpp" > "$stage/SOURCE"
    # what the three tools' build needs: no model files, docs, web UI, nor the other backends
    tar cf "$stage/src.tar" -C "$(dirname "$SRC")" --exclude=llama.cpp/models --exclude=llama.cpp/media \
        --exclude=llama.cpp/docs --exclude=llama.cpp/tools/ui --exclude=.git \
        $(for b in vulkan sycl opencl metal hexagon et webgpu openvino cann hip musa zdnn zendnn virtgpu blas rpc; do echo "--exclude=llama.cpp/ggml/src/ggml-$b"; done) \
        llama.cpp || exit 1
    tar rf "$stage/src.tar" -C "$stage" SOURCE || exit 1
    xz -9 -T1 < "$stage/src.tar" > "$CARRY/lcp-src.tar.xz" || exit 1
    size=$(stat -c %s "$CARRY/lcp-src.tar.xz")
    [ "$size" -gt "$MAX_BYTES" ] && { echo "lcp-src.tar.xz is $size bytes, over $MAX_BYTES" >&2; exit 1; }
    echo "staged $CARRY/lcp-src.tar.xz: $size bytes (built there by --run: ~5 min of device time, a guess)"
    exit 0
fi

if [ "${1:-}" = "--stage" ]; then
    B=$(cd "${2:-/tmp/lcp-cuda}" && pwd) || exit 1
    SRC=${3:-$(ls -d /tmp/lcp-src/llama_cpp_python-*/vendor/llama.cpp 2>/dev/null | tail -1)}
    [ -d "$SRC/gguf-py/gguf" ] || { echo "no gguf-py in '$SRC' (pass the sdist's vendor/llama.cpp)" >&2; exit 1; }
    stage=$(mktemp -d)
    trap 'rm -rf "$stage"' EXIT
    mkdir -p "$stage/lcp/bin" "$stage/lcp/lib" "$CARRY"
    rm -f "$CARRY/lcp-src.tar.xz"  # the binaries replace the sources (--stage-src) in the carry
    for b in "${BINS[@]}"; do
        [ -x "$B/bin/$b" ] || { echo "missing $B/bin/$b (build it: ninja -C $B ${BINS[*]})" >&2; exit 1; }
        strip -o "$stage/lcp/bin/$b" "$B/bin/$b" || exit 1
    done
    # the shared libraries they load: the C runtime and libcuda are the machine's own; cuBLAS
    # (hundreds of MB) is the machine's CUDA 13 (its toolkit, or torch's nvidia-cublas wheel);
    # what is left (the CUDA runtime, OpenMP) travels
    for b in "${BINS[@]}"; do ldd "$B/bin/$b"; done | awk '/=> \//{print $3}' | sort -u |
        grep -Ev '/(libc|libm|libstdc\+\+|libgcc_s|libpthread|libdl|librt|ld-linux[^/]*|libcuda|libcublasLt|libcublas)\.so' |
        while read -r lib; do cp -L "$lib" "$stage/lcp/lib/"; done
    for b in "${BINS[@]}"; do ldd "$B/bin/$b" | grep -q "not found" && { echo "$b: unresolved libraries here:" >&2; ldd "$B/bin/$b" | grep "not found" >&2; }; done
    cp -r "$SRC/gguf-py/gguf" "$stage/lcp/gguf"
    find "$stage/lcp/gguf" -name __pycache__ -prune -exec rm -rf {} +
    {
        echo "llama.cpp: $(basename "$(dirname "$(dirname "$SRC")")") sdist, vendor/llama.cpp, build $(grep -o 'LLAMA_COMMIT = "[^"]*"' "$B/common/build-info.cpp" 2>/dev/null)"
        echo "gguf-py: $(grep -m1 '^version' "$SRC/gguf-py/pyproject.toml")"
        echo "nvcc: $(grep -m1 'CMAKE_CUDA_COMPILER_VERSION\|CMAKE_CUDA_COMPILER:' "$B/CMakeCache.txt")"
        echo "flags:"
        grep -E '^(CMAKE_BUILD_TYPE|CMAKE_CUDA_ARCHITECTURES|BUILD_SHARED_LIBS|GGML_NATIVE|GGML_CUDA[A-Z_]*|GGML_AVX[A-Z0-9_]*|GGML_FMA|GGML_F16C|LLAMA_CURL|LLAMA_OPENSSL):' "$B/CMakeCache.txt"
        echo "libraries carried: $(ls "$stage/lcp/lib" | tr '\n' ' ')"
        for b in "${BINS[@]}"; do echo "ldd $b:"; ldd "$B/bin/$b" | sed 's/ (0x[0-9a-f]*)//'; done
    } > "$stage/lcp/BUILD_INFO"
    # xz's 192 MiB window: the three binaries each hold ggml-cuda (static), so the second and
    # third copies cost little once the first is in the window
    (cd "$stage" && tar cf - lcp | xz -9e --lzma2=preset=9e,dict=192MiB -T1 > "$CARRY/lcp.tar.xz") || exit 1
    size=$(stat -c %s "$CARRY/lcp.tar.xz")
    ls -la "$stage/lcp/bin" "$stage/lcp/lib" "$CARRY"
    cat "$stage/lcp/BUILD_INFO" | head -30
    if [ "$size" -gt "$MAX_BYTES" ]; then
        echo "lcp.tar.xz is $size bytes, over the ${MAX_BYTES}-byte carry budget" >&2
        exit 1
    fi
    echo "staged $CARRY/lcp.tar.xz: $size bytes"
    exit 0
fi

MODELS=${LCP_MODELS:-/tmp/lcp/models}
SHAPES=(${SHAPES:-smollm2 llama1b})
QUANTS=(${QUANTS:-Q4_1 Q8_0 Q4_K_M})

shape_args() {  # make_gguf_shape.py's arguments for a shape
    case "$1" in
        smollm2) echo "--hidden 576 --layers 30 --heads 9 --kv-heads 3 --ffn 1536 --vocab 49152 --rope-base 100000" ;;
        llama1b) echo "${LCP_1B_ARGS---hidden 2048 --layers 16 --heads 32 --kv-heads 4 --ffn 5632 --vocab 32000 --rope-base 10000}" ;;
        *) echo "unknown shape '$1' (smollm2, llama1b)" >&2; return 1 ;;
    esac
}
quant_gpu_shape() {  # bench/quant_gpu.py's --shape for a file of this shape ("-": none fits)
    case "$1" in
        smollm2) echo smollm2 ;;
        llama1b) [ -z "${LCP_1B_ARGS+x}" ] && echo 1b || echo - ;;
    esac
}

if [ "${1:-}" = "--paths" ]; then
    for s in "${SHAPES[@]}"; do
        for q in "${QUANTS[@]}"; do echo "$s $q $MODELS/${s}_$q.gguf $(quant_gpu_shape "$s")"; done
    done
    exit 0
fi

[ "${1:-}" = "--run" ] || { echo "usage: llamacpp_gpu.sh --stage [BUILD [SRC]] | --run [models bench batched] | --paths" >&2; exit 2; }
shift
steps=(${*:-models bench batched})
OUT=${OUT:-$ROOT/llamacpp_gpu_out}
LCP=${LCP_DIR:-/tmp/lcp}
RAW=$LCP/out
mkdir -p "$OUT" "$MODELS" "$RAW"
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1 | tr -c 'A-Za-z0-9\n' '_' | sed 's/_*$//')
tag="llamacpp_gpu_$(date -u +%Y-%m-%d)_${gpu:-nogpu}"
exec > >(tee -a "$RAW/run.log") 2>&1
collect() {  # $OUT gets three files, rewritten after every step: a cut call keeps what it measured
    python3 - "$LCP" "$OUT/$tag.json" <<'PYEOF' || echo "collecting the JSON failed" >&2
import glob, json, os, sys
lcp, out = sys.argv[1], sys.argv[2]
raw = os.path.join(lcp, "out")
def text(path):
    return open(path).read() if os.path.exists(path) else None
doc = {"build": text(os.path.join(lcp, "lcp", "BUILD_INFO")), "env": text(os.path.join(raw, "env.txt")),
       "llama_bench": [], "llama_batched_bench": []}
for f in sorted(glob.glob(os.path.join(raw, "bench_*.json"))):
    shape, quant = os.path.basename(f)[len("bench_"):-len(".json")].split("_", 1)
    try:
        rows = json.load(open(f))
    except ValueError as e:
        doc["llama_bench"].append({"shape": shape, "quant": quant, "error": "unreadable %s: %s" % (f, e)})
        continue
    doc["llama_bench"] += [dict(r, shape=shape, quant=quant) for r in rows]
for f in sorted(glob.glob(os.path.join(raw, "batched_*.jsonl"))):
    shape, quant = os.path.basename(f)[len("batched_"):-len(".jsonl")].split("_", 1)
    for line in open(f):
        if line.startswith("{"):
            doc["llama_batched_bench"].append(dict(json.loads(line), shape=shape, quant=quant))
json.dump(doc, open(out, "w"), indent=1)
PYEOF
    cp "$RAW/run.log" "$OUT/$tag.log"
    tar czf "$OUT/${tag}_raw.tar.gz" --warning=no-file-changed -C "$RAW" .
}
trap collect EXIT
if [ ! -x "$LCP/lcp/bin/llama-bench" ]; then
    if [ -f "$CARRY/lcp.tar.xz" ]; then
        tar xJf "$CARRY/lcp.tar.xz" -C "$LCP" || exit 1
    elif [ -f "$CARRY/lcp-src.tar.xz" ]; then
        # the sources instead of the binaries (--stage-src): built here on all cores, the flags
        # as the carried build's
        echo "building llama.cpp from $CARRY/lcp-src.tar.xz ($(date -u +%H:%M:%S))"
        mkdir -p "$LCP/lcp/bin"
        if [ ! -f "$LCP/src/llama.cpp/CMakeLists.txt" ]; then
            rm -rf "$LCP/src" && mkdir -p "$LCP/src" && tar xJf "$CARRY/lcp-src.tar.xz" -C "$LCP/src" || exit 1
        fi
        patch_src "$LCP/src/llama.cpp" || exit 1
        # CMake and ninja may be the Python environment's (pip's cmake and ninja) alone
        PATH=$PATH:$(dirname "$(command -v python3)")
        for t in cmake ninja; do command -v $t > /dev/null || { echo "no $t on PATH" >&2; exit 1; }; done
        case "$CMAKE_FLAGS" in *GGML_CUDA=ON*)
            [ -x /usr/local/cuda/bin/nvcc ] || CMAKE_FLAGS="${CMAKE_FLAGS//\/usr\/local\/cuda\/bin\/nvcc/$(command -v nvcc)}"
            # ggml-cuda compiles against cuBLAS's header and links its library: the toolkit's
            cuda_root=$(dirname "$(dirname "$(readlink -f "$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)")")")
            [ -f "$cuda_root/include/cublas_v2.h" ] && ls "$cuda_root"/lib64/libcublas.so "$cuda_root"/targets/*/lib/libcublas.so 2> /dev/null | grep -q libcublas ||
                { echo "no cublas_v2.h or libcublas.so in the CUDA toolkit at $cuda_root: ggml-cuda needs both" >&2; exit 1; } ;;
        esac
        if [ ! -f "$LCP/build/build.ninja" ]; then
            cmake -S "$LCP/src/llama.cpp" -B "$LCP/build" -G Ninja $CMAKE_FLAGS > "$RAW/cmake.log" 2>&1 ||
                { echo "configuring llama.cpp failed:" >&2; tail -n 30 "$RAW/cmake.log" >&2; exit 1; }
        fi
        # within one device call (10 minutes): a build cut at LCP_BUILD_TIMEOUT seconds goes on
        # where it stopped at the next call, while the machine is warm
        timeout "${LCP_BUILD_TIMEOUT:-540}" ninja -C "$LCP/build" -j"$(nproc)" "${BINS[@]}" >> "$RAW/ninja.log" 2>&1
        rc=$?
        if [ $rc = 124 ]; then
            echo "the build did not finish in ${LCP_BUILD_TIMEOUT:-540} s ($(tail -n 1 "$RAW/ninja.log" | cut -c1-60)):" \
                 "run the same command again while the machine is warm, ninja goes on" >&2
            exit 3
        fi
        [ $rc = 0 ] || { echo "building llama.cpp failed:" >&2; grep -m5 -B2 -A10 "FAILED\|error" "$RAW/ninja.log" | head -n 40 >&2; exit 1; }
        for b in "${BINS[@]}"; do strip -o "$LCP/lcp/bin/$b" "$LCP/build/bin/$b" || exit 1; done
        cp -r "$LCP/src/llama.cpp/gguf-py/gguf" "$LCP/lcp/gguf"
        { echo "llama.cpp: built on $(hostname) from lcp-src.tar.xz ($(cat "$LCP/src/SOURCE" 2>/dev/null)), $(date -u)"
          echo "nvcc: $(nvcc --version 2>/dev/null | tail -1)"
          echo "cmake $CMAKE_FLAGS"; } > "$LCP/lcp/BUILD_INFO"
        echo "built ($(date -u +%H:%M:%S)): $(du -sh "$LCP/lcp/bin" | cut -f1) of binaries"
        if [ "${LCP_KEEP_BUILD:-0}" = 1 ]; then
            # the binaries back through $OUT (16 MiB a file at most), to carry as lcp.tar.xz next
            # time and skip the build; the window spans all three binaries (they share ggml)
            # (in pieces of 15 MiB: cat lcp.tar.xz.part* > .gpu_carry/lcp/lcp.tar.xz here)
            (cd "$LCP" && tar cf - lcp | xz -9 --lzma2=preset=9,dict=192MiB -T1 > "$LCP/lcp.tar.xz") &&
                split -b 15M -d -a 1 "$LCP/lcp.tar.xz" "$OUT/lcp.tar.xz.part"
            echo "lcp.tar.xz for the carry: $(stat -c %s "$LCP/lcp.tar.xz") bytes in $(ls "$OUT"/lcp.tar.xz.part* | wc -l) pieces ($(date -u +%H:%M:%S))"
        fi
    else
        echo "no $CARRY/lcp.tar.xz nor lcp-src.tar.xz: bench/llamacpp_gpu.sh --stage (or --stage-src) here, carry .gpu_carry/lcp" >&2
        exit 1
    fi
fi
BIN=$LCP/lcp/bin
# cuBLAS 13: the toolkit's, else torch's nvidia-cublas wheel (nvidia/cu13/lib or nvidia/cublas/lib);
# the carried libraries (the CUDA runtime) last, so a machine's own newer one wins
cublas_dirs=$(python3 - <<'EOF' 2>/dev/null
import glob, importlib.util as u
dirs = []
for name in ("nvidia.cu13", "nvidia.cublas", "nvidia"):
    try:
        s = u.find_spec(name)
    except Exception:
        continue
    for loc in (s.submodule_search_locations or []) if s else []:
        dirs += sorted({p.rsplit("/", 1)[0] for p in glob.glob(loc + "/**/libcublas.so.*", recursive=True)})
print(":".join(dict.fromkeys(dirs)))
EOF
)
export LD_LIBRARY_PATH=/usr/local/cuda/lib64${cublas_dirs:+:$cublas_dirs}:$LCP/lcp/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export PYTHONPATH=$LCP/lcp${PYTHONPATH:+:$PYTHONPATH}
{
    date -u
    cat "$LCP/lcp/BUILD_INFO" | head -20
    echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"
    for b in "${BINS[@]}"; do echo "ldd $b:"; ldd "$BIN/$b" | grep -E 'cuda|cublas|not found|gomp'; done
    nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,memory.used --format=csv 2>&1
} > "$RAW/env.txt" 2>&1
cat "$RAW/env.txt"
if ldd "$BIN/llama-bench" | grep -q "not found"; then
    echo "llama-bench has unresolved libraries (above): LD_LIBRARY_PATH needs cuBLAS 13" >&2
    exit 1
fi
NGL=${LCP_NGL:-99}
# llama-bench's prompt and generation lengths; llama-batched-bench's prompt, generated tokens and
# batches (ascending: the last sizes the cache). Lists given twice append in both tools, hence
# variables rather than LCP_*_ARGS for these.
PP=${LCP_PP:-512} TG=${LCP_TG:-128} NPP=${LCP_NPP:-448} NTG=${LCP_NTG:-128} NPL=${LCP_NPL:-1,8,32,64}
status=0
for step in "${steps[@]}"; do
    echo "=== $step ($(date -u +%H:%M:%S)) ==="
    case "$step" in
    models)
        for s in "${SHAPES[@]}"; do
            f16=$MODELS/${s}_f16.gguf
            args=$(shape_args "$s") || exit 2
            if [ ! -f "$f16" ]; then
                python3 "$ROOT/bench/make_gguf_shape.py" --out "$f16.part" $args && mv "$f16.part" "$f16" ||
                    { echo "making $f16 failed" >&2; exit 1; }
            fi
            for q in "${QUANTS[@]}"; do
                f=$MODELS/${s}_$q.gguf
                [ -f "$f" ] && continue
                "$BIN/llama-quantize" "$f16" "$f.part" "$q" > "$RAW/quantize_${s}_$q.log" 2>&1 &&
                    mv "$f.part" "$f" || { echo "llama-quantize $s $q failed:" >&2; tail -n 20 "$RAW/quantize_${s}_$q.log" >&2; exit 1; }
                tail -n 3 "$RAW/quantize_${s}_$q.log"
            done
        done
        ls -la "$MODELS"
        ;;
    bench)
        for s in "${SHAPES[@]}"; do
            for q in "${QUANTS[@]}"; do
                f=$MODELS/${s}_$q.gguf
                [ -f "$f" ] || { echo "no $f (the models step makes it)" >&2; status=1; continue; }
                j=$RAW/bench_${s}_$q.json
                "$BIN/llama-bench" -m "$f" -p "$PP" -n "$TG" -ngl "$NGL" -fa off -o json ${LCP_BENCH_ARGS:-} \
                    > "$j" 2> "${j%.json}.log" || { echo "llama-bench $s $q failed:" >&2; tail -n 20 "${j%.json}.log" >&2; status=1; continue; }
                # one line a test: pp512 / tg128 tokens/s (mean ± sd over llama-bench's repetitions)
                python3 -c '
import json, sys
for r in json.load(open(sys.argv[1])):
    t = "pp%d" % r["n_prompt"] if r["n_prompt"] else "tg%d" % r["n_gen"]
    print("%-8s %-7s %-6s %10.1f ± %.1f t/s  (%s, fa %s, ngl %s)" % (sys.argv[2], sys.argv[3], t, r["avg_ts"], r["stddev_ts"], r["model_type"], r["flash_attn"], r["n_gpu_layers"]))
' "$j" "$s" "$q" || status=1
            done
        done
        ;;
    batched)
        for s in "${SHAPES[@]}"; do
            for q in "${QUANTS[@]}"; do
                f=$MODELS/${s}_$q.gguf
                [ -f "$f" ] || { echo "no $f (the models step makes it)" >&2; status=1; continue; }
                j=$RAW/batched_${s}_$q.jsonl
                # -c: the most sequences, each of NPP + NTG tokens (a sequence's share of the cache
                # when it is split per sequence; llama-batched-bench checks each row fits)
                "$BIN/llama-batched-bench" -m "$f" -ngl "$NGL" -fa off -c $((${NPL##*,} * (NPP + NTG))) -b 2048 -ub 512 \
                    -npp "$NPP" -ntg "$NTG" -npl "$NPL" --output-format jsonl ${LCP_BATCHED_ARGS:-} \
                    > "$j" 2> "${j%.jsonl}.log" || { echo "llama-batched-bench $s $q failed:" >&2; tail -n 20 "${j%.jsonl}.log" >&2; status=1; continue; }
                python3 -c '
import json, sys
for line in open(sys.argv[1]):
    line = line.strip()
    if not line.startswith("{"):
        continue
    r = json.loads(line)
    print("%-8s %-7s B=%-3d decode %9.1f t/s (%.3f ms/step)  prompt %9.1f t/s  fa %s" % (sys.argv[2], sys.argv[3], r["pl"], r["speed_tg"], r["t_tg"] / r["tg"] * 1e3, r["speed_pp"], r["flash_attn"]))
' "$j" "$s" "$q" || status=1
            done
        done
        ;;
    build) ;;  # done above
    *) echo "unknown step '$step' (build models bench batched)" >&2; exit 2 ;;
    esac
    collect
done
exit $status
