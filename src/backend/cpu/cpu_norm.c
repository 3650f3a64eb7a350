/* CPU: embedding gather + LayerNorm, bias + residual + LayerNorm, and LayerNorm + linear. */
#include <math.h>
#include <string.h>

#include "backend/cpu/cpu_ops.h"

void cpu_layernorm_row(float *y, const float *x, const float *w, const float *b, float eps,
                       int32_t dim) {
    /* Accumulate in double: the reference must not be the least accurate side of a comparison. */
    double sum = 0;
    for (int32_t i = 0; i < dim; i++) sum += x[i];
    double mean = sum / dim;
    double var = 0;
    for (int32_t i = 0; i < dim; i++) {
        double d = x[i] - mean;
        var += d * d;
    }
    float inv_std = (float)(1.0 / sqrt(var / dim + eps));
    float m = (float)mean;
    for (int32_t i = 0; i < dim; i++) y[i] = (x[i] - m) * inv_std * w[i] + b[i];
}

nopad_status cpu_embed_layernorm(nopad_backend *be, void *out_, const int32_t *tokens,
                                 const int32_t *types, const nopad_seqs *seqs,
                                 int32_t position_offset, int32_t vocab_size, int32_t n_positions,
                                 int32_t type_vocab_size, const void *word_, const void *pos_,
                                 const void *type_, const void *ln_weight, const void *ln_bias,
                                 float eps, int32_t dim) {
    float *out = out_;              // [T, dim]
    const float *word = word_;      // [V, dim]
    const float *pos = pos_;        // [P, dim] or NULL (no absolute positions)
    const float *type = type_;      // [TV, dim] or NULL
#pragma omp parallel for schedule(dynamic, 1) num_threads(cpu_threads_for(be, seqs->n_seqs))
    for (int32_t s = 0; s < seqs->n_seqs; s++) {
        for (int32_t t = seqs->cu_seqlens[s]; t < seqs->cu_seqlens[s + 1]; t++) {
            float *row = out + (size_t)t * dim;
            const float *w = word + (size_t)tokens[t] * dim;
            for (int32_t i = 0; i < dim; i++) row[i] = w[i];
            if (pos) {
                const float *p = pos + (size_t)(position_offset + t - seqs->cu_seqlens[s]) * dim;
                for (int32_t i = 0; i < dim; i++) row[i] += p[i];
            }
            if (type) {
                const float *ty = type + (size_t)(types ? types[t] : 0) * dim;
                for (int32_t i = 0; i < dim; i++) row[i] += ty[i];
            }
            cpu_layernorm_row(row, row, ln_weight, ln_bias, eps, dim);
        }
    }
    return NOPAD_OK;
}

nopad_status cpu_bias_residual_layernorm(nopad_backend *be, void *x_, const void *bias_,
                                         const void *residual_, const void *ln_weight,
                                         const void *ln_bias, float eps, int32_t n_tokens,
                                         int32_t dim) {
    float *x = x_;                      // [T, dim]
    const float *bias = bias_;          // [dim] or NULL
    const float *residual = residual_;  // [T, dim] or NULL
#pragma omp parallel for schedule(static) num_threads(cpu_threads_for(be, n_tokens))
    for (int32_t t = 0; t < n_tokens; t++) {
        float *row = x + (size_t)t * dim;
        const float *res = residual ? residual + (size_t)t * dim : NULL;
        for (int32_t i = 0; i < dim; i++) row[i] += (res ? res[i] : 0.0f) + (bias ? bias[i] : 0.0f);
        cpu_layernorm_row(row, row, ln_weight, ln_bias, eps, dim);
    }
    return NOPAD_OK;
}
