/* The CPU backend's ops (float32). Signatures follow the op table in backend/backend.h. */
#ifndef NOPAD_BACKEND_CPU_OPS_H
#define NOPAD_BACKEND_CPU_OPS_H

#include <math.h>
#include <omp.h>

#include "backend/backend.h"

typedef struct cpu_state {
    int n_threads;
} cpu_state;

static inline int cpu_threads(const nopad_backend *be) {
    return ((const cpu_state *)be->impl)->n_threads;
}

/* Threads for a loop over n_items independent items (rows, sequences): never more than the items.
 * A decode step's row ops (one token: norm, rotary, SwiGLU, residual add) then run on the calling
 * thread alone instead of waking a worker that has nothing to do and waiting for it: half of a
 * step's parallel regions, each a wake-up with passive waits or a stall when the cores are
 * shared (docs/cpu.md). */
static inline int cpu_threads_for(const nopad_backend *be, int64_t n_items) {
    const int n = cpu_threads(be);
    return n_items >= n ? n : n_items > 1 ? (int)n_items : 1;
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
nopad_status cpu_row_argmax(nopad_backend *be, float *best, const float *x, int32_t rows, int32_t cols,
                            int32_t ld, int32_t id0);
nopad_status cpu_gemm_f32(nopad_backend *be, float *out, const void *x, const void *w,
                          int32_t n_tokens, int32_t n_in, int32_t n_out);
nopad_status cpu_bias_residual_layernorm(nopad_backend *be, void *x, const void *bias,
                                         const void *residual, const void *ln_weight,
                                         const void *ln_bias, float eps, int32_t n_tokens,
                                         int32_t dim);
nopad_status cpu_attention_varlen(nopad_backend *be, void *out, const void *qkv,
                                  const nopad_seqs *seqs, int32_t n_heads, int32_t head_size,
                                  float scale, int causal);
nopad_status cpu_attention_rel(nopad_backend *be, void *out, const void *qkv,
                               const nopad_seqs *seqs, int32_t n_heads, int32_t head_size,
                               float scale, const void *pos_key, const void *pos_query,
                               const nopad_rel_positions *rel);
nopad_status cpu_pool(nopad_backend *be, void *out, const void *x, const nopad_seqs *seqs,
                      int32_t dim, nopad_pooling mode);
nopad_status cpu_l2_normalize(nopad_backend *be, void *x, int32_t rows, int32_t dim);

nopad_status cpu_embed_tokens(nopad_backend *be, float *out, const int32_t *tokens, const int32_t *feed,
                              const int32_t *positions, int32_t n_tokens, int32_t vocab_size,
                              int32_t vocab0, int32_t vocab_rows, int32_t n_positions,
                              const void *word, const void *pos, int32_t dim);
/* Weights in a GGUF block format (cpu_quant_ops.c): whether the CPU runs `format` on rows of
 * n_in values (quant.h's six formats, n_in a whole number of blocks; the dtype always), gemm_q and
 * embed_tokens_q. */
int cpu_runs_format(nopad_weight_format format, int32_t n_in);
nopad_weight_format cpu_packed_format(nopad_backend *be, nopad_weight_format format, int64_t rows, int64_t cols,
                                      size_t *bytes);
nopad_status cpu_pack_q(nopad_backend *be, void *dst, const void *src, nopad_weight_format format, int64_t rows,
                        int64_t cols);
nopad_status cpu_gemm_q(nopad_backend *be, void *out, const void *x, const void *w,
                        nopad_weight_format format, const void *bias, const void *residual,
                        int32_t n_tokens, int32_t n_in, int32_t n_out, nopad_epilogue epilogue,
                        nopad_activation act, int out_f32);
nopad_status cpu_embed_tokens_q(nopad_backend *be, float *out, const int32_t *tokens, const int32_t *feed,
                                const int32_t *positions, int32_t n_tokens, int32_t vocab_size,
                                int32_t vocab0, int32_t vocab_rows, int32_t n_positions, const void *word,
                                nopad_weight_format format, const void *pos, int32_t dim);
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

/* Training (cpu_backward.c, cpu_attention_backward.c, cpu_optim.c). */
nopad_status cpu_zero(nopad_backend *be, void *dst, size_t bytes);
nopad_status cpu_gemm_backward(nopad_backend *be, void *dx, float *dw, float *db, const void *dy,
                               const void *x, const void *w, int32_t n_tokens, int32_t n_in,
                               int32_t n_out, int accumulate_dx);
nopad_status cpu_activation(nopad_backend *be, void *y, const void *x, int32_t n_tokens,
                            int32_t dim, nopad_activation act);
nopad_status cpu_activation_backward(nopad_backend *be, void *dx, float *db, const void *dy,
                                     const void *x, int32_t n_tokens, int32_t dim,
                                     nopad_activation act);
nopad_status cpu_dropout(nopad_backend *be, void *y, const void *x, const void *residual, const nopad_seqs *seqs,
                         const int64_t *examples, int32_t dim, float p, uint64_t key, uint32_t site);
nopad_status cpu_layernorm_backward(nopad_backend *be, void *ds, float *dw, float *db, float *dbias,
                                    const void *dy, const void *s, const void *w, float eps,
                                    int32_t n_tokens, int32_t dim);
nopad_status cpu_embed_backward(nopad_backend *be, float *d_word, float *d_pos, float *d_type,
                                float *d_ln_w, float *d_ln_b, void *dy, const int32_t *tokens,
                                const int32_t *types, const nopad_seqs *seqs,
                                int32_t position_offset, const void *word, const void *pos,
                                const void *type, const void *ln_weight, float eps, int32_t dim);
nopad_status cpu_attention_lse(nopad_backend *be, void *out, float *lse, const void *qkv,
                               const nopad_seqs *seqs, int32_t n_heads, int32_t head_size,
                               float scale, int causal, const nopad_attention_dropout *drop);
nopad_status cpu_attention_backward(nopad_backend *be, void *dqkv, const void *dout,
                                    const void *qkv, const void *out, const float *lse,
                                    const nopad_seqs *seqs, int32_t n_heads, int32_t head_size,
                                    float scale, int causal, const nopad_attention_dropout *drop);
nopad_status cpu_scatter_add_rows(nopad_backend *be, void *x, const int32_t *rows, const void *src,
                                  int32_t n, int32_t dim);
nopad_status cpu_select_rows(nopad_backend *be, void *out, const void *x, const int32_t *rows,
                             int32_t n, int32_t dim);
nopad_status cpu_cross_entropy(nopad_backend *be, float *losses, void *dlogits, const void *logits,
                               const int32_t *labels, int32_t n, int32_t classes,
                               float grad_scale);
nopad_status cpu_squared_error(nopad_backend *be, float *losses, void *dpred, const void *pred,
                               const float *target, int32_t n, float grad_scale);
nopad_status cpu_adamw(nopad_backend *be, const nopad_opt_tensor *tensors, int32_t n_tensors,
                       const nopad_opt_step *h);
nopad_status cpu_lamb(nopad_backend *be, const nopad_opt_tensor *tensors, int32_t n_tensors,
                      const nopad_opt_step *h, float *grad_norm);
nopad_status cpu_clip_grad_norm(nopad_backend *be, const nopad_opt_tensor *tensors,
                                int32_t n_tensors, float max_norm, float *grad_norm);

static inline float cpu_activate(float x, nopad_activation act) {
    switch (act) {
    case NOPAD_ACT_GELU: return 0.5f * x * (1.0f + erff(x * 0.70710678118654752f));
    case NOPAD_ACT_GELU_TANH: {
        const float k = 0.79788456080286536f; /* sqrt(2/pi) */
        return 0.5f * x * (1.0f + tanhf(k * (x + 0.044715f * x * x * x)));
    }
    case NOPAD_ACT_RELU: return x > 0.0f ? x : 0.0f;
    case NOPAD_ACT_SILU: return x / (1.0f + expf(-x));
    case NOPAD_ACT_TANH: return tanhf(x);
    }
    return x;
}

/* Row LayerNorm of x[dim] into y[dim] (may alias): (x - mean) / sqrt(var + eps) · w + b, with
 * the biased variance as torch computes it. */
void cpu_layernorm_row(float *y, const float *x, const float *w, const float *b, float eps,
                       int32_t dim);

#endif
