/* CUDA: pooling of each sequence's rows (CLS, mean, max) and L2 normalisation of rows. */
#include "backend/cuda/common.cuh"
#include "backend/cuda/ops.h"

template <typename T>
__global__ void pool_kernel(T *__restrict__ out, const T *__restrict__ x,
                            const int32_t *__restrict__ cu_seqlens, int dim, int mode) {
    const int s = blockIdx.x;
    const int start = cu_seqlens[s], end = mode == NOPAD_POOLING_CLS ? start + 1 : cu_seqlens[s + 1];
    for (int c = threadIdx.x; c < dim; c += blockDim.x) {
        float acc = mode == NOPAD_POOLING_MAX ? -INFINITY : 0.0f;
        for (int t = start; t < end; t++) {
            const float v = to_f32(x[(size_t)t * dim + c]);
            acc = mode == NOPAD_POOLING_MAX ? fmaxf(acc, v) : acc + v;
        }
        if (mode == NOPAD_POOLING_MEAN) acc /= (float)(end - start);
        out[(size_t)s * dim + c] = from_f32<T>(acc);
    }
}

template <typename T>
__global__ void l2_normalize_kernel(T *__restrict__ x, int dim) {
    __shared__ float partial[32];
    T *row = x + (size_t)blockIdx.x * dim;
    float ss = 0.0f;
    for (int c = threadIdx.x; c < dim; c += blockDim.x) {
        const float v = to_f32(row[c]);
        ss += v * v;
    }
    ss = warp_sum(ss);
    if (threadIdx.x % 32 == 0) partial[threadIdx.x / 32] = ss;
    __syncthreads();
    if (threadIdx.x < 32) {
        float v = threadIdx.x < blockDim.x / 32 ? partial[threadIdx.x] : 0.0f;
        v = warp_sum(v);
        if (threadIdx.x == 0) partial[0] = v;
    }
    __syncthreads();
    const float inv = 1.0f / fmaxf(sqrtf(partial[0]), 1e-12f);
    for (int c = threadIdx.x; c < dim; c += blockDim.x) row[c] = from_f32<T>(to_f32(row[c]) * inv);
}

template <typename T>
static nopad_status pool_t(void *out, const void *x, const int32_t *cu, int n_seqs, int dim,
                           nopad_pooling mode, cudaStream_t s) {
    pool_kernel<T><<<n_seqs, 256, 0, s>>>((T *)out, (const T *)x, cu, dim, (int)mode);
    return launch_status("pool");
}

extern "C" nopad_status cuda_pool(nopad_dtype dtype, void *out, const void *x,
                                  const int32_t *cu_seqlens, int32_t n_seqs, int32_t dim,
                                  nopad_pooling mode, void *stream) {
    if (mode != NOPAD_POOLING_CLS && mode != NOPAD_POOLING_MEAN && mode != NOPAD_POOLING_MAX)
        return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT, "pool: mode %d is not cls, mean or max", (int)mode);
    cudaStream_t s = (cudaStream_t)stream;
    DISPATCH_DTYPE(dtype, pool_t<__half>(out, x, cu_seqlens, n_seqs, dim, mode, s),
                   pool_t<__nv_bfloat16>(out, x, cu_seqlens, n_seqs, dim, mode, s));
}

template <typename T>
static nopad_status l2_t(void *x, int rows, int dim, cudaStream_t s) {
    l2_normalize_kernel<T><<<rows, 256, 0, s>>>((T *)x, dim);
    return launch_status("l2_normalize");
}

extern "C" nopad_status cuda_l2_normalize(nopad_dtype dtype, void *x, int32_t rows, int32_t dim,
                                          void *stream) {
    if (rows == 0) return NOPAD_OK;
    cudaStream_t s = (cudaStream_t)stream;
    DISPATCH_DTYPE(dtype, l2_t<__half>(x, rows, dim, s), l2_t<__nv_bfloat16>(x, rows, dim, s));
}
