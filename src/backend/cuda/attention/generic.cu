/* CUDA: varlen attention for any head size <= 128, one warp per (query row, head), fp32 online
 * softmax, no tensor cores: the correctness path for the head sizes the fused kernels do not cover. */
#include "backend/cuda/attention/kernels.h"
#include "backend/cuda/common.cuh"

template <typename T>
__global__ void attention_generic_kernel(T *__restrict__ out, const T *__restrict__ qkv,
                                         const int32_t *__restrict__ cu_seqlens, int n_seqs,
                                         int n_tokens, int heads, int d, float scale, int causal) {
    const int warp = (int)(((size_t)blockIdx.x * blockDim.x + threadIdx.x) / 32), lane = threadIdx.x % 32;
    const int t = warp / heads, h = warp % heads;
    if (t >= n_tokens) return;
    const int s = sequence_of(cu_seqlens, n_seqs, t);
    const int end = causal ? t + 1 : cu_seqlens[s + 1];
    const size_t H = (size_t)heads * d, stride = 3 * H;
    float q[4], acc[4] = {0, 0, 0, 0};
#pragma unroll
    for (int k = 0; k < 4; k++) {
        const int c = lane + 32 * k;
        q[k] = c < d ? to_f32(qkv[t * stride + (size_t)h * d + c]) * scale : 0.0f;
    }
    float m = -INFINITY, l = 0.0f;
    for (int j = cu_seqlens[s]; j < end; j++) {
        const T *kr = qkv + j * stride + H + (size_t)h * d, *vr = kr + H;
        float dot = 0.0f;
#pragma unroll
        for (int k = 0; k < 4; k++) {
            const int c = lane + 32 * k;
            if (c < d) dot += q[k] * to_f32(kr[c]);
        }
        dot = warp_sum(dot);
        const float m_new = fmaxf(m, dot), correction = __expf(m - m_new), p = __expf(dot - m_new);
        l = l * correction + p;
#pragma unroll
        for (int k = 0; k < 4; k++) {
            const int c = lane + 32 * k;
            acc[k] = acc[k] * correction + (c < d ? p * to_f32(vr[c]) : 0.0f);
        }
        m = m_new;
    }
#pragma unroll
    for (int k = 0; k < 4; k++) {
        const int c = lane + 32 * k;
        if (c < d) out[t * H + (size_t)h * d + c] = from_f32<T>(acc[k] / l);
    }
}

template <typename T>
static nopad_status attention_generic_t(void *out, const void *qkv, const int32_t *cu, int n_seqs,
                                        int n_tokens, int heads, int d, float scale, int causal,
                                        cudaStream_t s) {
    const size_t warps = (size_t)n_tokens * heads;
    const int blocks = (int)((warps * 32 + 255) / 256);
    attention_generic_kernel<T><<<blocks, 256, 0, s>>>((T *)out, (const T *)qkv, cu, n_seqs, n_tokens,
                                                       heads, d, scale, causal);
    return launch_status("attention_generic");
}

extern "C" nopad_status cuda_attention_varlen_generic(nopad_dtype dtype, void *out, const void *qkv,
                                                      const int32_t *cu_seqlens, int32_t n_seqs,
                                                      int32_t n_tokens, int32_t n_heads,
                                                      int32_t head_size, float scale, int causal,
                                                      void *stream) {
    if (head_size < 1 || head_size > 128)
        return nopad_set_error(NOPAD_ERR_UNSUPPORTED, "attention: head size %d is not in [1, 128]", head_size);
    if (n_tokens == 0) return NOPAD_OK;
    cudaStream_t s = (cudaStream_t)stream;
    DISPATCH_DTYPE(dtype,
                   attention_generic_t<__half>(out, qkv, cu_seqlens, n_seqs, n_tokens, n_heads, head_size, scale, causal, s),
                   attention_generic_t<__nv_bfloat16>(out, qkv, cu_seqlens, n_seqs, n_tokens, n_heads, head_size, scale, causal, s));
}
