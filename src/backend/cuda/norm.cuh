/* LayerNorm of rows held in registers, shared by the LayerNorm kernels (norm.cu) and the embedding
 * gather (embed.cu). Each row goes to one warp and stays in registers, so it is read once and
 * written once. When dim is a multiple of 8 every lane moves 16 bytes at a time (8 halves); other
 * widths (the tiny test models) take the scalar path of the same kernel. */
#ifndef NOPAD_BACKEND_CUDA_NORM_CUH
#define NOPAD_BACKEND_CUDA_NORM_CUH

#include "backend/cuda/common.cuh"

enum { LN_WARPS = 4 }; /* rows per 128-thread block */

/* The lane's share of a row-wide weight vector (gamma, beta, bias), kept in its 16-bit form (half
 * the registers of floats: the kernels hold three of them); 0 past dim or when src is NULL. */
template <typename T, int VEC, int ITERS>
struct row_share {
    T e[ITERS * VEC];
    __device__ __forceinline__ void load(const T *src, int dim, int lane) {
#pragma unroll
        for (int it = 0; it < ITERS; it++) {
            const int e0 = (it * 32 + lane) * VEC;
            if (VEC == 8 && src && e0 < dim) {
                *reinterpret_cast<uint4 *>(e + it * VEC) = *reinterpret_cast<const uint4 *>(src + e0);
            } else {
#pragma unroll
                for (int j = 0; j < VEC; j++) e[it * VEC + j] = src && e0 + j < dim ? src[e0 + j] : from_f32<T>(0.0f);
            }
        }
    }
    __device__ __forceinline__ float operator[](int i) const { return to_f32(e[i]); }
};

/* Normalises the row held in v[ITERS * VEC] (lane's share; invalid slots hold 0) with the
 * preloaded shares wv (gamma) and bv (beta), and stores it. */
template <typename T, int VEC, int ITERS>
__device__ __forceinline__ void layernorm_store(float *v, T *out_row, const row_share<T, VEC, ITERS> &wv,
                                                const row_share<T, VEC, ITERS> &bv, float eps, int dim,
                                                int lane) {
    float sum = 0.0f;
#pragma unroll
    for (int i = 0; i < ITERS * VEC; i++) sum += v[i];
    const float mean = warp_sum(sum) / (float)dim;
    float sq = 0.0f;
#pragma unroll
    for (int it = 0; it < ITERS; it++) {
#pragma unroll
        for (int j = 0; j < VEC; j++) {
            const int e = (it * 32 + lane) * VEC + j;
            if (e < dim) {
                const float d = v[it * VEC + j] - mean;
                sq += d * d;
            }
        }
    }
    const float rstd = rsqrtf(warp_sum(sq) / (float)dim + eps);
#pragma unroll
    for (int it = 0; it < ITERS; it++) {
        const int e0 = (it * 32 + lane) * VEC;
        if (e0 >= dim) continue;
        float o[VEC];
        if (VEC == 8 || e0 + VEC <= dim) {
#pragma unroll
            for (int j = 0; j < VEC; j++)
                o[j] = (v[it * VEC + j] - mean) * rstd * wv[it * VEC + j] + bv[it * VEC + j];
            store_vec<T, VEC>(out_row + e0, o);
        }
    }
}

/* Chooses VEC and the per-lane register count for `dim`; returns 0 if dim is too wide. */
#define LN_DISPATCH(T, KERNEL, GRID, STREAM, ...)                                                  \
    do {                                                                                           \
        if (dim % 8 == 0) {                                                                        \
            const int iters = (dim + 255) / 256;                                                   \
            if (iters <= 1) launch_row_kernel(KERNEL<T, 8, 1>, GRID, LN_WARPS * 32, STREAM, __VA_ARGS__);      \
            else if (iters <= 2) launch_row_kernel(KERNEL<T, 8, 2>, GRID, LN_WARPS * 32, STREAM, __VA_ARGS__); \
            else if (iters <= 3) launch_row_kernel(KERNEL<T, 8, 3>, GRID, LN_WARPS * 32, STREAM, __VA_ARGS__); \
            else if (iters <= 4) launch_row_kernel(KERNEL<T, 8, 4>, GRID, LN_WARPS * 32, STREAM, __VA_ARGS__); \
            else if (iters <= 8) launch_row_kernel(KERNEL<T, 8, 8>, GRID, LN_WARPS * 32, STREAM, __VA_ARGS__); \
            else return nopad_set_error(NOPAD_ERR_UNSUPPORTED, "LayerNorm width %d > 2048", dim);   \
        } else {                                                                                   \
            const int iters = (dim + 31) / 32;                                                     \
            if (iters <= 2) launch_row_kernel(KERNEL<T, 1, 2>, GRID, LN_WARPS * 32, STREAM, __VA_ARGS__);      \
            else if (iters <= 8) launch_row_kernel(KERNEL<T, 1, 8>, GRID, LN_WARPS * 32, STREAM, __VA_ARGS__); \
            else if (iters <= 32) launch_row_kernel(KERNEL<T, 1, 32>, GRID, LN_WARPS * 32, STREAM, __VA_ARGS__); \
            else return nopad_set_error(NOPAD_ERR_UNSUPPORTED,                                     \
                                        "LayerNorm width %d > 1024 and not a multiple of 8", dim); \
        }                                                                                          \
    } while (0)

#endif
