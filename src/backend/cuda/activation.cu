/* CUDA: x = act(x + bias) in place, for the epilogues cuBLASLt lacks (the exact erf GELU). */
#include "backend/cuda/activation.cuh"
#include "backend/cuda/common.cuh"
#include "backend/cuda/ops.h"

template <typename T, int VEC>
__global__ void bias_activation_kernel(T *__restrict__ x, const T *__restrict__ bias, size_t n,
                                       int dim, int act) {
    const size_t stride = (size_t)gridDim.x * blockDim.x * VEC;
    wait_for_upstream_grid();
    for (size_t i = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * VEC; i < n; i += stride) {
        float v[VEC], bv[VEC];
        load_vec<T, VEC>(v, x + i);
        if (bias) load_vec<T, VEC>(bv, bias + i % dim);
#pragma unroll
        for (int j = 0; j < VEC; j++) v[j] = apply_activation(v[j] + (bias ? bv[j] : 0.0f), act);
        store_vec<T, VEC>(x + i, v);
    }
}

template <typename T>
static nopad_status bias_activation_t(void *x, const void *bias, int rows, int dim,
                                      nopad_activation act, cudaStream_t stream) {
    const size_t n = (size_t)rows * dim;
    if (dim % 8 == 0)
        launch_row_kernel(bias_activation_kernel<T, 8>, grid_for(n / 8, 256), 256, stream, (T *)x, (const T *)bias, n, dim, (int)act);
    else
        launch_row_kernel(bias_activation_kernel<T, 1>, grid_for(n, 256), 256, stream, (T *)x, (const T *)bias, n, dim, (int)act);
    return launch_status("bias_activation");
}

extern "C" nopad_status cuda_bias_activation(nopad_dtype dtype, void *x, const void *bias,
                                             int32_t rows, int32_t dim, nopad_activation act,
                                             void *stream) {
    if (rows == 0) return NOPAD_OK;
    cudaStream_t s = (cudaStream_t)stream;
    DISPATCH_DTYPE(dtype, bias_activation_t<__half>(x, bias, rows, dim, act, s),
                   bias_activation_t<__nv_bfloat16>(x, bias, rows, dim, act, s));
}
