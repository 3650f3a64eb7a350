/* CUDA: bias + residual + LayerNorm on packed [T, dim] rows (fp16 / bf16, fp32 arithmetic). */
#include "backend/cuda/norm.cuh"
#include "backend/cuda/ops.h"

template <typename T, int VEC, int ITERS>
__global__ void __launch_bounds__(LN_WARPS * 32)
bias_residual_layernorm_kernel(T *__restrict__ x, const T *__restrict__ bias,
                               const T *__restrict__ residual, const T *__restrict__ w,
                               const T *__restrict__ b, float eps, int rows, int dim) {
    const int row = blockIdx.x * LN_WARPS + threadIdx.x / 32, lane = threadIdx.x % 32;
    allow_dependent_launch(); /* the next GEMM may start streaming its weights */
    /* weights first: they do not depend on the GEMM this kernel follows */
    row_share<T, VEC, ITERS> wv, bv, biasv;
    wv.load(w, dim, lane);
    bv.load(b, dim, lane);
    biasv.load(bias, dim, lane);
    wait_for_upstream_grid();
    if (row >= rows) return;
    T *xr = x + (size_t)row * dim;
    const T *rr = residual ? residual + (size_t)row * dim : nullptr; /* NULL: no residual */
    float v[ITERS * VEC];
#pragma unroll
    for (int it = 0; it < ITERS; it++) {
        const int e0 = (it * 32 + lane) * VEC;
        float xv[VEC], rv[VEC];
        if (e0 < dim) {
            load_vec<T, VEC>(xv, xr + e0);
            if (rr) {
                load_vec<T, VEC>(rv, rr + e0);
            } else {
#pragma unroll
                for (int j = 0; j < VEC; j++) rv[j] = 0.0f;
            }
        }
#pragma unroll
        for (int j = 0; j < VEC; j++)
            v[it * VEC + j] = e0 < dim ? xv[j] + rv[j] + biasv[it * VEC + j] : 0.0f;
    }
    layernorm_store<T, VEC, ITERS>(v, xr, wv, bv, eps, dim, lane);
}

template <typename T>
static nopad_status bias_residual_layernorm_t(void *x, const void *bias, const void *residual,
                                              const void *w, const void *b, float eps, int rows,
                                              int dim, cudaStream_t stream) {
    const int grid = (rows + LN_WARPS - 1) / LN_WARPS;
    LN_DISPATCH(T, bias_residual_layernorm_kernel, grid, stream, (T *)x, (const T *)bias,
                (const T *)residual, (const T *)w, (const T *)b, eps, rows, dim);
    return launch_status("bias_residual_layernorm");
}

extern "C" nopad_status cuda_bias_residual_layernorm(nopad_dtype dtype, void *x, const void *bias,
                                                     const void *residual, const void *w,
                                                     const void *b, float eps, int32_t rows,
                                                     int32_t dim, void *stream) {
    if (rows == 0) return NOPAD_OK;
    cudaStream_t s = (cudaStream_t)stream;
    DISPATCH_DTYPE(dtype, bias_residual_layernorm_t<__half>(x, bias, residual, w, b, eps, rows, dim, s),
                   bias_residual_layernorm_t<__nv_bfloat16>(x, bias, residual, w, b, eps, rows, dim, s));
}
