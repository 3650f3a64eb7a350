/* CPU: variable-length multi-head attention, the reference for the fused CUDA kernels.
 * One task per (sequence, head); each query row computes its scores against its own sequence's
 * keys only, so nothing is padded and no [B, S, S] tensor exists. Softmax in float with the
 * running max subtracted, as every GPU kernel does. */
#include <math.h>
#include <stdlib.h>

#include "backend/cpu/cpu_ops.h"
#include "util/error.h"

nopad_status cpu_attention_varlen(nopad_backend *be, void *out_, const void *qkv_,
                                  const nopad_seqs *seqs, int32_t n_heads, int32_t head_size,
                                  float scale, int causal) {
    float *out = out_;         // [T, n_heads * head_size]
    const float *qkv = qkv_;   // [T, 3, n_heads, head_size]
    const int32_t hidden = n_heads * head_size;
    const size_t row_stride = (size_t)3 * hidden;
    const int64_t n_tasks = (int64_t)seqs->n_seqs * n_heads;
    int failed = 0;

#pragma omp parallel num_threads(cpu_threads(be))
    {
        /* scores[max_seqlen] for one query row at a time */
        float *scores = malloc((size_t)(seqs->max_seqlen > 0 ? seqs->max_seqlen : 1) * sizeof(float));
        if (!scores) {
#pragma omp atomic write
            failed = 1;
        }
#pragma omp for schedule(dynamic, 1)
        for (int64_t task = 0; task < n_tasks; task++) {
            if (!scores) continue;
            const int32_t s = (int32_t)(task / n_heads), h = (int32_t)(task % n_heads);
            const int32_t start = seqs->cu_seqlens[s];
            const int32_t len = seqs->cu_seqlens[s + 1] - start;
            const float *q_base = qkv + (size_t)start * row_stride + (size_t)h * head_size;
            const float *k_base = q_base + hidden;
            const float *v_base = q_base + 2 * hidden;
            for (int32_t i = 0; i < len; i++) {
                const float *q = q_base + (size_t)i * row_stride;
                const int32_t n_keys = causal ? i + 1 : len;
                float max_score = -INFINITY;
                for (int32_t j = 0; j < n_keys; j++) {
                    const float *k = k_base + (size_t)j * row_stride;
                    float dot = 0.0f;
                    for (int32_t d = 0; d < head_size; d++) dot += q[d] * k[d];
                    scores[j] = dot * scale;
                    if (scores[j] > max_score) max_score = scores[j];
                }
                float sum = 0.0f;
                for (int32_t j = 0; j < n_keys; j++) {
                    scores[j] = expf(scores[j] - max_score);
                    sum += scores[j];
                }
                const float inv_sum = 1.0f / sum;
                float *o = out + (size_t)(start + i) * hidden + (size_t)h * head_size;
                for (int32_t d = 0; d < head_size; d++) o[d] = 0.0f;
                for (int32_t j = 0; j < n_keys; j++) {
                    const float p = scores[j] * inv_sum;
                    const float *v = v_base + (size_t)j * row_stride;
                    for (int32_t d = 0; d < head_size; d++) o[d] += p * v[d];
                }
            }
        }
        free(scores);
    }
    if (failed) return nopad_set_error(NOPAD_ERR_OUT_OF_MEMORY, "cpu attention: no scratch memory");
    return NOPAD_OK;
}
