/* The CPU backend's ops (float32). Signatures follow the op table in backend/backend.h. */
#ifndef NOPAD_BACKEND_CPU_OPS_H
#define NOPAD_BACKEND_CPU_OPS_H

#include <omp.h>

#include "backend/backend.h"

typedef struct cpu_state {
    int n_threads;
} cpu_state;

static inline int cpu_threads(const nopad_backend *be) {
    return ((const cpu_state *)be->impl)->n_threads;
}

nopad_status cpu_embed_layernorm(nopad_backend *be, void *out, const int32_t *tokens,
                                 const int32_t *types, const nopad_seqs *seqs,
                                 int32_t position_offset, int32_t vocab_size, int32_t n_positions,
                                 int32_t type_vocab_size, const void *word, const void *pos,
                                 const void *type, const void *ln_weight, const void *ln_bias,
                                 float eps, int32_t dim);
nopad_status cpu_linear(nopad_backend *be, void *out, const void *x, const void *w,
                        const void *bias, const void *residual, int32_t n_tokens, int32_t n_in,
                        int32_t n_out, nopad_epilogue epilogue, nopad_activation act);
/* The float32 backend's gemm_f32: cpu_linear without an epilogue. */
nopad_status cpu_gemm_f32(nopad_backend *be, float *out, const void *x, const void *w,
                          int32_t n_tokens, int32_t n_in, int32_t n_out);
nopad_status cpu_bias_residual_layernorm(nopad_backend *be, void *x, const void *bias,
                                         const void *residual, const void *ln_weight,
                                         const void *ln_bias, float eps, int32_t n_tokens,
                                         int32_t dim);
nopad_status cpu_attention_varlen(nopad_backend *be, void *out, const void *qkv,
                                  const nopad_seqs *seqs, int32_t n_heads, int32_t head_size,
                                  float scale, int causal);
nopad_status cpu_pool(nopad_backend *be, void *out, const void *x, const nopad_seqs *seqs,
                      int32_t dim, nopad_pooling mode);
nopad_status cpu_l2_normalize(nopad_backend *be, void *x, int32_t rows, int32_t dim);

nopad_status cpu_embed_tokens(nopad_backend *be, float *out, const int32_t *tokens,
                              const int32_t *positions, int32_t n_tokens, int32_t vocab_size,
                              int32_t n_positions, const void *word, const void *pos, int32_t dim);
nopad_status cpu_norm(nopad_backend *be, void *out, const float *x, const void *w, const void *b,
                      float eps, int32_t n_tokens, int32_t dim, int rms);
nopad_status cpu_residual_add(nopad_backend *be, float *h, const void *x, int32_t n_tokens,
                              int32_t dim);
nopad_status cpu_rope_kv_store(nopad_backend *be, void *qkv, void *k_cache, void *v_cache,
                               const int32_t *positions, const int32_t *slots, int32_t n_tokens,
                               int32_t n_heads, int32_t n_kv_heads, int32_t head_size,
                               const float *inv_freq);
nopad_status cpu_add_norm(nopad_backend *be, void *out, float *h, const void *x, const void *w,
                          const void *b, float eps, int32_t n_tokens, int32_t dim, int rms);
nopad_status cpu_attention_paged(nopad_backend *be, void *out, const void *qkv,
                                 const void *k_cache, const void *v_cache,
                                 const nopad_kv_batch *kv, int32_t n_heads, int32_t n_kv_heads,
                                 int32_t head_size, float scale);
nopad_status cpu_swiglu(nopad_backend *be, void *out, const void *gate_up, int32_t n_tokens,
                        int32_t dim);
nopad_status cpu_gather_rows(nopad_backend *be, float *out, const float *x, const int32_t *rows,
                             int32_t n, int32_t dim);

/* Row LayerNorm of x[dim] into y[dim] (may alias): (x - mean) / sqrt(var + eps) · w + b, with
 * the biased variance as torch computes it. */
void cpu_layernorm_row(float *y, const float *x, const float *w, const float *b, float eps,
                       int32_t dim);

#endif
