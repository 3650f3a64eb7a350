/* The quantized GEMV's kernels in bf16 (qgemv.cuh; one file per dtype so the two compile
 * side by side). */
#include "backend/cuda/quant/qgemv.cuh"

cudaError_t qgemv_launch_bf16(int format, const qgemv::params &p, cudaStream_t stream) {
    return qgemv::launch<true>(format, p, stream);
}
