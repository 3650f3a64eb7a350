#!/usr/bin/env bash
# Issue 42, parts 1 and 3, on one machine of several GPUs: a split model's correctness and the
# engine under tensor parallelism at tp = 1, 2, 4, 8 (those the machine has), against Hugging
# Face's tp_plan="auto" under torchrun; and each tp's decode step against one GPU's share of the
# bytes. bench/tp_engine.py and bench/decode_bench.py do the work; this stages and runs them.
#
# Here:  bench/tp_multi.sh --stage BUILD     BUILD: a CUDA build with MPI (cmake -DNOPAD_CUDA=ON
#                                            -DNOPAD_MPI=ON; targets nopad_shared nopad_worker);
#                                            writes .gpu_carry/tp (the library, nopad-worker and
#                                            what they link) and .gpu_carry/ompi (this machine's
#                                            Open MPI: scripts/openmpi_carry.sh; optional there)
# There: bench/tp_multi.sh --run [steps]     carry [".gpu_carry/tp"] (and ".gpu_carry/ompi")
#   steps (default "check run arrivals decode hf"):
#     check     greedy ids at every tp against tp = 1, and logits against the CPU in float32
#     run       ENGINE workload 1 with 64 and 256 requests at every tp
#     arrivals  Flover's arrival experiment at 20 ms mean gaps, 64 requests, at every tp
#     decode    the decode step at batch 1, 8, 32, 64 (context 512) at every tp, against the floor
#               of one GPU's share of the weights and KV
#     hf        HF transformers' static batch of workload 1 with tp_plan="auto" under torchrun
#     spawn     a check of the carried Open MPI there: tp_size 2 on the CPU (tiny model) equals
#               one process (needs no second GPU)
#   GPUS="1 2 4 8" (default: the powers of two up to nvidia-smi's count), SHAPE (default 8b: the
#   LLaMA-3-8B shape, random fp16 weights written there, ~16 GB), REQUESTS (run; default 64,256).
# NVLink multicast stays off in every process started here (NCCL_NVLS_ENABLE=0,
# TORCH_SYMM_MEM_DISABLE_MULTICAST=1, NVSHMEM_DISABLE_NVLS=1). Logs and JSON to $OUT.
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
CARRY="$ROOT/.gpu_carry/tp"

if [ "${1:-}" = "--stage" ]; then
    B=$(cd "${2:?usage: tp_multi.sh --stage BUILD}" && pwd)
    for f in libnopad.so nopad-worker; do [ -f "$B/$f" ] || { echo "missing $B/$f" >&2; exit 1; }; done
    ldd "$B/libnopad.so" | grep -q libmpi || { echo "$B/libnopad.so has no MPI: configure with -DNOPAD_MPI=ON" >&2; exit 1; }
    stage=$(mktemp -d)
    trap 'rm -rf "$stage"' EXIT
    mkdir -p "$stage/build/deplibs" "$CARRY"
    cp "$B/libnopad.so" "$B/nopad-worker" "$stage/build/"
    # what they link, but the C library's, CUDA's own (the machine has them) and Open MPI's (its
    # own archive)
    for f in "$B/libnopad.so" "$B/nopad-worker"; do ldd "$f" | awk '/=> \//{print $3}'; done | sort -u |
        grep -Ev '/(libc|libm|libstdc\+\+|libgcc_s|libpthread|libdl|librt|ld-linux[^/]*|libcublasLt|libcublas|libcudart)\.so' |
        grep -Ev '/(libmpi|libopen-pal|libopen-rte|libpmix|libhwloc|libevent)[^/]*$' |
        while read -r lib; do cp -L "$lib" "$stage/build/deplibs/"; done
    (cd "$stage" && tar cf - build | xz -9 -T1 > "$CARRY/bundle.tar.xz")
    "$ROOT/scripts/openmpi_carry.sh" --stage > /dev/null || exit 1
    ls -la "$CARRY" "$ROOT/.gpu_carry/ompi"
    exit 0
fi

[ "${1:-}" = "--run" ] || { echo "usage: tp_multi.sh --stage BUILD | --run [steps]" >&2; exit 2; }
shift
STEPS=${*:-check run arrivals decode hf}
OUT=${OUT:-$ROOT/tp_multi_out}
mkdir -p "$OUT" /tmp/nopad_tp
[ -f "$CARRY/bundle.tar.xz" ] || { echo "no bundle: bench/tp_multi.sh --stage BUILD here, carry .gpu_carry/tp" >&2; exit 1; }
rm -rf /tmp/nopad_tp/build && tar xJf "$CARRY/bundle.tar.xz" -C /tmp/nopad_tp
BUILD=/tmp/nopad_tp/build
# Open MPI: the carried copy where it came with the call, else the machine's own (the lent
# machines' Ubuntu 24.04 has Open MPI 4.1 in /usr/bin, seen 2026-12-07; its libmpi.so.40 serves a
# library built against Debian's 4.1)
if [ -f "$ROOT/.gpu_carry/ompi/openmpi.tar.xz" ]; then
    # shellcheck source=../scripts/openmpi_carry.sh
    source "$ROOT/scripts/openmpi_carry.sh" --use || exit 1
else
    export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
fi
export LD_LIBRARY_PATH=$BUILD/deplibs:$LD_LIBRARY_PATH
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
# NCCL lives in the Python environment there (nvidia.nccl); nopad opens it at run time
if [ -z "${NOPAD_NCCL_LIBRARY:-}" ]; then
    nccl_dir=$(python3 -c 'import importlib.util as u; s = u.find_spec("nvidia.nccl"); print(list(s.submodule_search_locations)[0])' 2>/dev/null)
    [ -f "$nccl_dir/lib/libnccl.so.2" ] && export NOPAD_NCCL_LIBRARY=$nccl_dir/lib/libnccl.so.2
fi
export PYTHONPATH=$ROOT/python${PYTHONPATH:+:$PYTHONPATH}
n_gpu=$(nvidia-smi --list-gpus | wc -l)
if [ -z "${GPUS:-}" ]; then
    GPUS=""
    for n in 1 2 4 8; do [ "$n" -le "$n_gpu" ] && GPUS="$GPUS $n"; done
fi
tps=$(echo $GPUS | tr ' ' ',')
SHAPE=${SHAPE:-8b}
LIB=$BUILD/libnopad.so
status=0
{
    date -u
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
    nvidia-smi topo -m 2>/dev/null
    echo "NCCL: ${NOPAD_NCCL_LIBRARY:-not found}; mpirun: $(command -v mpirun); GPUS: $GPUS; shape $SHAPE"
    git -C "$ROOT" log -1 --format='%h %s' 2>/dev/null
} | tee "$OUT/env.txt"

for step in $STEPS; do
    echo "== $step"
    case $step in
    check)
        timeout 1800 python3 "$ROOT/bench/tp_engine.py" check --library "$LIB" --shape "$SHAPE" --tp "$tps" \
            --cpu-reference --out "$OUT/tp_check_$SHAPE.json" 2>&1 | tee "$OUT/tp_check_$SHAPE.log" | grep '^#' || status=1
        ;;
    run | arrivals)
        timeout 3000 python3 "$ROOT/bench/tp_engine.py" $step --library "$LIB" --shape "$SHAPE" --tp "$tps" \
            --requests "${REQUESTS:-64,256}" --gap-ms 20 --out "$OUT/tp_${step}_$SHAPE.json" 2>&1 |
            tee "$OUT/tp_${step}_$SHAPE.log" | grep '^#' || status=1
        ;;
    decode)
        for n in $GPUS; do
            timeout 900 python3 "$ROOT/bench/decode_bench.py" --library "$LIB" --shape "$SHAPE" --tp "$n" \
                --sections decode --dtypes fp16 --batches 1,8,32,64 --contexts 512 --prefill 1x64 \
                --prefill-reps 1 --prefill-warmup 0 --out "$OUT/tp_decode_${SHAPE}_tp$n.json" \
                > "$OUT/tp_decode_${SHAPE}_tp$n.log" 2>&1 || status=1
            echo "tp $n: $(grep '^| fp16' "$OUT/tp_decode_${SHAPE}_tp$n.log" | head -4 | tr '\n' ' ')"
        done
        ;;
    hf)
        for n in $GPUS; do
            timeout 1800 torchrun --standalone --nproc-per-node "$n" "$ROOT/bench/tp_engine.py" hf --shape "$SHAPE" \
                --requests "${REQUESTS:-64,256}" --out "$OUT/tp_hf_${SHAPE}_tp$n.json" \
                > "$OUT/tp_hf_${SHAPE}_tp$n.log" 2>&1 || status=1
            grep '^# hf' "$OUT/tp_hf_${SHAPE}_tp$n.log" || tail -3 "$OUT/tp_hf_${SHAPE}_tp$n.log"
        done
        ;;
    spawn)
        timeout 300 python3 "$ROOT/bench/tp_engine.py" check --library "$LIB" --device cpu --shape tiny --tp 2 \
            --out "$OUT/tp_spawn_check.json" 2>&1 | tee "$OUT/tp_spawn_check.log" | grep '^#' || status=1
        ;;
    *)
        echo "unknown step $step" && status=1
        ;;
    esac
done
exit $status
