#!/usr/bin/env bash
# Issue 43's GPU peer: llama.cpp's CUDA build (from PyPI's llama-cpp-python sdist,
# vendor/llama.cpp), carried to the GPU machine, timed on GGUF files made there from random weights
# (the models cannot travel: the carry holds ~20 MB of ours).
#
# Build here (2 cores: ~1 h; sm_90a only, flash attention kernels left out, see below):
#   pip download --no-binary :all: --no-deps llama-cpp-python   # vendor/llama.cpp inside
#   cmake -S .../vendor/llama.cpp -B /tmp/lcp-cuda -G Ninja -DCMAKE_BUILD_TYPE=Release \
#     -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90a-real -DBUILD_SHARED_LIBS=OFF -DGGML_NATIVE=OFF \
#     -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DGGML_CUDA_FA=OFF -DGGML_CUDA_NCCL=OFF \
#     -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF
#   nice -n 10 ninja -C /tmp/lcp-cuda -j2 llama-bench llama-batched-bench llama-quantize
# GGML_CUDA_FA=OFF: no flash-attention kernels (a third of ggml-cuda's compile). llama-bench's
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
# There: bench/llamacpp_gpu.sh --run [models|bench|batched ...]   (carry [".gpu_carry/lcp"])
#        models: the f16 GGUF of each shape from random weights, then llama-quantize to each of
#          QUANTS (default "Q4_1 Q8_0 Q4_K_M"), in $LCP_MODELS (default /tmp/lcp/models), kept
#          while the machine stays warm (a file already there is not made again);
#        bench: llama-bench -p 512 -n 128 -ngl 99 -fa off -o json on every file
#          ($OUT/llamacpp_bench_<shape>_<quant>.json, stderr beside it in .log);
#        batched: llama-batched-bench -ngl 99 -fa off -npp 448 -ntg 128 -npl 1,8,32,64 (each
#          sequence decodes from 448 to 576 tokens of context: 512 on average, as
#          bench/quant_gpu.py's --context 512) --output-format jsonl
#          ($OUT/llamacpp_batched_<shape>_<quant>.jsonl);
#        default: models bench batched. Environment: SHAPES (default "smollm2 llama1b"),
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
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
CARRY="$ROOT/.gpu_carry/lcp"
MAX_BYTES=$((20 * 1024 * 1024))
BINS=(llama-bench llama-batched-bench llama-quantize)

if [ "${1:-}" = "--stage" ]; then
    B=$(cd "${2:-/tmp/lcp-cuda}" && pwd) || exit 1
    SRC=${3:-$(ls -d /tmp/lcp-src/llama_cpp_python-*/vendor/llama.cpp 2>/dev/null | tail -1)}
    [ -d "$SRC/gguf-py/gguf" ] || { echo "no gguf-py in '$SRC' (pass the sdist's vendor/llama.cpp)" >&2; exit 1; }
    stage=$(mktemp -d)
    trap 'rm -rf "$stage"' EXIT
    mkdir -p "$stage/lcp/bin" "$stage/lcp/lib" "$CARRY"
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
mkdir -p "$OUT" "$MODELS" "$LCP"
if [ ! -x "$LCP/lcp/bin/llama-bench" ]; then
    [ -f "$CARRY/lcp.tar.xz" ] || { echo "no $CARRY/lcp.tar.xz: bench/llamacpp_gpu.sh --stage here, carry .gpu_carry/lcp" >&2; exit 1; }
    tar xJf "$CARRY/lcp.tar.xz" -C "$LCP" || exit 1
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
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1 | tr -c 'A-Za-z0-9\n' '_' | sed 's/_*$//')
{
    date -u
    cat "$LCP/lcp/BUILD_INFO" | head -20
    echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"
    for b in "${BINS[@]}"; do echo "ldd $b:"; ldd "$BIN/$b" | grep -E 'cuda|cublas|not found|gomp'; done
    nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,memory.used --format=csv 2>&1
} > "$OUT/llamacpp_env.txt" 2>&1
cat "$OUT/llamacpp_env.txt"
if ldd "$BIN/llama-bench" | grep -q "not found"; then
    echo "llama-bench has unresolved libraries (above): LD_LIBRARY_PATH needs cuBLAS 13" >&2
    exit 1
fi
NGL=${LCP_NGL:-99}
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
                "$BIN/llama-quantize" "$f16" "$f.part" "$q" > "$OUT/llamacpp_quantize_${s}_$q.log" 2>&1 &&
                    mv "$f.part" "$f" || { echo "llama-quantize $s $q failed:" >&2; tail -20 "$OUT/llamacpp_quantize_${s}_$q.log" >&2; exit 1; }
                tail -3 "$OUT/llamacpp_quantize_${s}_$q.log"
            done
        done
        ls -la "$MODELS"
        ;;
    bench)
        for s in "${SHAPES[@]}"; do
            for q in "${QUANTS[@]}"; do
                f=$MODELS/${s}_$q.gguf
                [ -f "$f" ] || { echo "no $f (the models step makes it)" >&2; status=1; continue; }
                j=$OUT/llamacpp_bench_${s}_$q.json
                "$BIN/llama-bench" -m "$f" -p 512 -n 128 -ngl "$NGL" -fa off -o json ${LCP_BENCH_ARGS:-} \
                    > "$j" 2> "${j%.json}.log" || { echo "llama-bench $s $q failed:" >&2; tail -20 "${j%.json}.log" >&2; status=1; continue; }
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
                j=$OUT/llamacpp_batched_${s}_$q.jsonl
                # -c: 64 sequences of 448 + 128 tokens (a sequence's share of the cache when it is
                # split per sequence; llama-batched-bench checks each row fits)
                "$BIN/llama-batched-bench" -m "$f" -ngl "$NGL" -fa off -c $((64 * 576)) -b 2048 -ub 512 \
                    -npp 448 -ntg 128 -npl 1,8,32,64 --output-format jsonl ${LCP_BATCHED_ARGS:-} \
                    > "$j" 2> "${j%.jsonl}.log" || { echo "llama-batched-bench $s $q failed:" >&2; tail -20 "${j%.jsonl}.log" >&2; status=1; continue; }
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
    *) echo "unknown step '$step' (models bench batched)" >&2; exit 2 ;;
    esac
done
exit $status
