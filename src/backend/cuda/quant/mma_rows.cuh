/* The end both tensor-core GEMVs share: qgemv.cuh (GGUF block formats) and fp8.cu (E4M3). */
#ifndef NOPAD_BACKEND_CUDA_QUANT_MMA_ROWS_CUH
#define NOPAD_BACKEND_CUDA_QUANT_MMA_ROWS_CUH

#include <stdint.h>

#include "backend/cuda/activation.cuh"
#include "backend/cuda/ptx_helpers.cuh"

/* A block of WARPS warps computes 16 weight rows, n0 + g and n0 + g + 8 (g = lane / 4), for every
 * token, in NT tiles of 8 tokens. Each warp holds m16n8k16 accumulators over its share of K:
 * acc[j][r] is row n0 + g + 8·(r / 2), token 8j + 2·(lane % 4) + r % 2.
 * The warps' sums are added in warp order through `partial` (shared, WARPS × NT·4 × 32 floats; the
 * caller has synchronised any earlier use of it), times the row's scale (row_scale NULL: none).
 * Then y[T, N] float32 (out_f32, no epilogue), or y in fp16 / bf16 (BF16) with + bias[N] (NULL:
 * none), act (a nopad_activation, < 0: none) and + residual[T, N] (NULL: none; may alias y), in
 * fp32 with one rounding at the store. */
template <bool BF16, int WARPS, int NT>
__device__ __forceinline__ void mma_rows_reduce_store(float (*partial)[NT * 4][32], const float (&acc)[NT][4], int n0,
                                                      int T, int N, const float *row_scale, void *y,
                                                      const void *bias, const void *residual, int act, int out_f32) {
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
#pragma unroll
    for (int j = 0; j < NT; j++)
#pragma unroll
        for (int r = 0; r < 4; r++) partial[warp][j * 4 + r][lane] = acc[j][r];
    __syncthreads();
    for (int e = threadIdx.x; e < NT * 4 * 32; e += WARPS * 32) {
        const int j = e / 128, r = (e / 32) % 4, l = e % 32;
        const int t = 8 * j + 2 * (l % 4) + r % 2, n = n0 + l / 4 + 8 * (r / 2);
        if (t >= T || n >= N) continue;
        float v = 0.0f;
#pragma unroll
        for (int wi = 0; wi < WARPS; wi++) v += partial[wi][j * 4 + r][l]; /* warp order */
        if (row_scale) v *= row_scale[n];
        const size_t i = (size_t)t * N + n;
        if (out_f32) {
            static_cast<float *>(y)[i] = v;
            continue;
        }
        if (bias) v += to_float<BF16>(static_cast<const uint16_t *>(bias)[n]);
        if (act >= 0) v = apply_activation(v, act);
        if (residual) v += to_float<BF16>(static_cast<const uint16_t *>(residual)[i]);
        static_cast<uint16_t *>(y)[i] = from_float<BF16>(v);
    }
}

#endif
