/* What the fused attention kernels share at their two ends: where a CTA's sequence, head and
 * query rows are in the packed qkv [T, 3, heads, D] (prologue), and the normalisation of O by the
 * row sums and its store into out [T, heads * D] (epilogue). */
#ifndef NOPAD_BACKEND_CUDA_ATTENTION_COMMON_CUH
#define NOPAD_BACKEND_CUDA_ATTENTION_COMMON_CUH

#include <stdint.h>

#include "backend/cuda/ptx_helpers.cuh"

/* One head of one sequence in the packed qkv: q, k and v point at the sequence's row 0 of the
 * head's Q, K and V columns; consecutive rows are row_stride elements apart. */
struct attention_head {
    const uint16_t *q, *k, *v;
    int hidden;        // heads * D: the row length of out
    size_t row_stride; // 3 * hidden: the row length of qkv
};

template <int D>
static __device__ __forceinline__ attention_head attention_head_of(const uint16_t *qkv, int start, int head,
                                                                  int n_heads) {
    attention_head h;
    h.hidden = n_heads * D;
    h.row_stride = (size_t)3 * h.hidden;
    h.q = qkv + (size_t)start * h.row_stride + (size_t)head * D;
    h.k = h.q + h.hidden;
    h.v = h.q + 2 * h.hidden;
    return h;
}

/* 1 / the row sum, or 0 for a row that saw no key (causal rows past every key stay zero). */
static __device__ __forceinline__ float row_sum_inverse(float l) { return l > 0.0f ? 1.0f / l : 0.0f; }

/* The m16 accumulator layout of mma.sync and wgmma: a thread holds rows lane/4 and lane/4 + 8 of its
 * warp's 16, each quad (four lanes) a row's partial sums. inv[r] = 1 / the whole row's sum. */
static __device__ __forceinline__ void quad_row_inverse(const float l_run[2], float inv[2]) {
#pragma unroll
    for (int r = 0; r < 2; r++) {
        float l = l_run[r];
        l += __shfl_xor_sync(0xffffffffu, l, 1);
        l += __shfl_xor_sync(0xffffffffu, l, 2);
        inv[r] = row_sum_inverse(l);
    }
}

#endif
