/* The quantized GEMV's kernels in fp16 (qgemv.cuh; one file per dtype so the two compile
 * side by side). */
#include "backend/cuda/quant/qgemv.cuh"

cudaError_t qgemv_launch_f16(int format, const qgemv::params &p, cudaStream_t stream) {
    return qgemv::launch<false>(format, p, stream);
}
