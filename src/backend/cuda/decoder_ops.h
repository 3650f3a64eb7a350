/* C launchers of the CUDA decoder ops (decoder.cu); the op table's decoder entries of backend.h,
 * with the dtype and stream made explicit. */
#ifndef NOPAD_BACKEND_CUDA_DECODER_OPS_H
#define NOPAD_BACKEND_CUDA_DECODER_OPS_H

#include <stdint.h>

#include "backend/backend.h"

#ifdef __cplusplus
extern "C" {
#endif

nopad_status cuda_dec_embed_tokens(nopad_dtype dtype, float *out, const int32_t *tokens, const int32_t *feed,
                                   const int32_t *positions, int32_t n_tokens, int32_t vocab,
                                   int32_t vocab0, int32_t vocab_rows, int32_t n_positions,
                                   const void *word, const void *pos, int32_t dim, void *stream);
/* out = norm(h) per row; with x (not NULL), first h += x. */
nopad_status cuda_dec_norm(nopad_dtype dtype, void *out, float *h, const void *x, const void *w,
                           const void *b, float eps, int32_t n_tokens, int32_t dim, int rms,
                           void *stream);
nopad_status cuda_dec_rope_kv_store(nopad_dtype dtype, void *qkv, void *k_cache, void *v_cache,
                                    const int32_t *positions, const int32_t *slots,
                                    int32_t n_tokens, int32_t n_heads, int32_t n_kv_heads,
                                    int32_t head_size, const float *inv_freq, void *stream);
/* The paged attention's device workspaces. */
typedef struct cuda_dec_attention_ws {
    float *split;    /* the key splits' partial results: [T, heads, splits, head_size + 2] */
    void *expand;    /* prompts-only steps with grouped KV heads: qkv as [T, 3, heads, head_size] */
    void *attention; /* the encoder attention's work counter (NOPAD_ATTENTION_WORKSPACE_BYTES) */
} cuda_dec_attention_ws;
/* Bytes of each workspace cuda_dec_attention_paged needs for kv (0: none). */
void cuda_dec_attention_workspace(const nopad_kv_batch *kv, nopad_dtype dtype, int32_t n_heads,
                                  int32_t n_kv_heads, int32_t head_size, size_t *split_bytes,
                                  size_t *expand_bytes);
nopad_status cuda_dec_attention_paged(nopad_dtype dtype, void *out, const void *qkv,
                                      const void *k_cache, const void *v_cache,
                                      const nopad_kv_batch *kv, int32_t n_heads,
                                      int32_t n_kv_heads, int32_t head_size, float scale,
                                      const cuda_dec_attention_ws *workspace, void *stream);
/* cuda_dec_rope_kv_store then cuda_dec_attention_paged in one kernel, for steps of one new token
 * per sequence (kv->max_q == 1); qkv is not changed. */
nopad_status cuda_dec_attention_paged_rope(nopad_dtype dtype, void *out, const void *qkv, void *k_cache,
                                           void *v_cache, const nopad_kv_batch *kv, int32_t n_heads,
                                           int32_t n_kv_heads, int32_t head_size, float scale,
                                           const float *inv_freq, const cuda_dec_attention_ws *workspace,
                                           void *stream);
nopad_status cuda_dec_swiglu(nopad_dtype dtype, void *out, const void *gate_up, int32_t n_tokens,
                             int32_t dim, void *stream);
nopad_status cuda_dec_gather_rows(float *out, const float *x, const int32_t *rows, int32_t n,
                                  int32_t dim, void *stream);
nopad_status cuda_dec_residual_add(nopad_dtype dtype, float *h, const void *x, int32_t n_tokens,
                                   int32_t dim, void *stream);

#ifdef __cplusplus
}
#endif
#endif
