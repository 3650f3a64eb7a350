#!/usr/bin/env bash
# Flux's fused kernels on several GPUs of one host (issue 42, part 2): tools/flux_bench --devices N
# for N = 2, 4, 8 (those the host has), every rank in one process with peer access, against the
# GEMM alone and NCCL's collective then cuBLASLt, at the LLaMA-3-8B/70B layer shapes, tokens
# 1024/4096/16384; the share of the collective hidden and a check of the fused output against the
# unfused one. Not run yet (no machine of several GPUs was lent when it was written).
#
# Here:  scripts/gpu_flux.sh --stage BUILD        (the same bundle as the one-GPU runs)
# There: bench/flux_multi.sh [N ...]              (carry [".gpu_carry/flux"]; default: 2 4 8, up to
#        the GPUs present). FLUX_ARGS appends to every run (e.g. "--tokens 4096 --dtype bf16").
#        Logs and JSON to $OUT (flux_multi_<date>_<gpu>_tp<N>.json), with nvidia-smi's topology.
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
CARRY="$ROOT/.gpu_carry/flux"
OUT=${OUT:-$ROOT/flux_multi_out}
mkdir -p "$OUT" /tmp/nopad_flux
[ -f "$CARRY/bundle.tar.xz" ] || { echo "no bundle: scripts/gpu_flux.sh --stage BUILD here, carry .gpu_carry/flux" >&2; exit 1; }
rm -rf /tmp/nopad_flux/build && tar xJf "$CARRY/bundle.tar.xz" -C /tmp/nopad_flux
BUILD=/tmp/nopad_flux/build
export LD_LIBRARY_PATH=$BUILD/deplibs:/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
# NVLink multicast stays off on the shared machines, in every library that could use it
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
# NCCL lives in the Python environment there (nvidia.nccl); flux_bench opens it at run time
if [ -z "${NOPAD_NCCL_LIBRARY:-}" ]; then
    nccl_dir=$(python3 -c 'import importlib.util as u; s = u.find_spec("nvidia.nccl"); print(list(s.submodule_search_locations)[0])' 2>/dev/null)
    [ -f "$nccl_dir/lib/libnccl.so.2" ] && export NOPAD_NCCL_LIBRARY=$nccl_dir/lib/libnccl.so.2
fi
n_gpu=$(nvidia-smi --list-gpus | wc -l)
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | tr -c 'A-Za-z0-9\n' '_' | sed 's/_*$//')
tag="$(date -u +%Y-%m-%d)_${gpu:-gpu}"
{
    echo "bundle built from $(cat "$BUILD/commit"); $n_gpu GPUs; NOPAD_NCCL_LIBRARY=${NOPAD_NCCL_LIBRARY:-unset}"
    nvidia-smi --query-gpu=index,name,driver_version,clocks.sm,clocks.max.sm --format=csv
    nvidia-smi topo -m
} 2>&1 | tee "$OUT/flux_multi_${tag}_topology.log"
status=0
for n in ${*:-2 4 8}; do
    if [ "$n" -gt "$n_gpu" ]; then
        echo "tp $n: only $n_gpu GPUs here, skipped"
        continue
    fi
    echo "=== tp $n ($(date -u +%H:%M:%S)) ==="
    "$BUILD/flux_bench" --devices "$n" --json "$OUT/flux_multi_${tag}_tp$n.json" ${FLUX_ARGS:-} 2>&1 |
        tee "$OUT/flux_multi_${tag}_tp$n.log" || status=1
done
exit $status
