/* CUDA: element conversions between float32 and the compute dtype (uploads and downloads). */
#include "backend/cuda/common.cuh"
#include "backend/cuda/ops.h"

template <typename T>
__global__ void from_f32_kernel(T *__restrict__ dst, const float *__restrict__ src, size_t n) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        dst[i] = from_f32<T>(src[i]);
}
template <typename T>
__global__ void to_f32_kernel(float *__restrict__ dst, const T *__restrict__ src, size_t n) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        dst[i] = to_f32(src[i]);
}

template <typename T>
static nopad_status from_f32_t(void *dst, const float *src, size_t n, cudaStream_t s) {
    from_f32_kernel<T><<<grid_for(n, 256), 256, 0, s>>>((T *)dst, src, n);
    return launch_status("convert");
}
template <typename T>
static nopad_status to_f32_t(float *dst, const void *src, size_t n, cudaStream_t s) {
    to_f32_kernel<T><<<grid_for(n, 256), 256, 0, s>>>(dst, (const T *)src, n);
    return launch_status("convert");
}

extern "C" nopad_status cuda_convert_from_f32(nopad_dtype dtype, void *dst, const float *src,
                                              size_t n, void *stream) {
    if (n == 0) return NOPAD_OK;
    cudaStream_t s = (cudaStream_t)stream;
    DISPATCH_DTYPE(dtype, from_f32_t<__half>(dst, src, n, s), from_f32_t<__nv_bfloat16>(dst, src, n, s));
}

extern "C" nopad_status cuda_convert_to_f32(nopad_dtype dtype, float *dst, const void *src,
                                            size_t n, void *stream) {
    if (n == 0) return NOPAD_OK;
    cudaStream_t s = (cudaStream_t)stream;
    DISPATCH_DTYPE(dtype, to_f32_t<__half>(dst, src, n, s), to_f32_t<__nv_bfloat16>(dst, src, n, s));
}
