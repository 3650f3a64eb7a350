/* C launchers of the CUDA backend's memory-bound op families, one .cu file each: embed.cu,
 * norm.cu, activation.cu, pool.cu, pack.cu, convert.cu. Tensors are device
 * pointers of `dtype` (F16 or BF16) unless named f32; every launcher enqueues on `stream`
 * (cudaStream_t) and returns NOPAD_ERR_BACKEND with the CUDA error if the launch fails. */
#ifndef NOPAD_BACKEND_CUDA_OPS_H
#define NOPAD_BACKEND_CUDA_OPS_H

#include <stddef.h>
#include <stdint.h>

#include "backend/backend.h"
#include "backend/cuda/common.h"

#ifdef __cplusplus
extern "C" {
#endif

/* out[T, dim] = LayerNorm(word[tokens] + pos[offset + t - start(seq)] + type[types]); type may be
 * NULL (no token types), types may be NULL (all 0). Ids outside [0, vocab) give NaN rows rather
 * than reading out of bounds (device-side input cannot be checked on the host without a sync). */
nopad_status cuda_embed_layernorm(nopad_dtype dtype, void *out, const int32_t *tokens,
                                  const int32_t *types, const int32_t *cu_seqlens, int32_t n_seqs,
                                  int32_t n_tokens, int32_t position_offset, int32_t vocab_size,
                                  int32_t n_positions, int32_t type_vocab_size, const void *word,
                                  const void *pos, const void *type, const void *ln_weight,
                                  const void *ln_bias, float eps, int32_t dim, void *stream);

/* x[T, dim] = LayerNorm(x + bias + residual), bias may be NULL; one pass, fp32 statistics. */
nopad_status cuda_bias_residual_layernorm(nopad_dtype dtype, void *x, const void *bias,
                                          const void *residual, const void *ln_weight,
                                          const void *ln_bias, float eps, int32_t n_tokens,
                                          int32_t dim, void *stream);

/* x[rows, dim] = act(x + bias) in place (for epilogues cuBLASLt lacks, e.g. exact erf GELU). */
nopad_status cuda_bias_activation(nopad_dtype dtype, void *x, const void *bias, int32_t rows,
                                  int32_t dim, nopad_activation act, void *stream);

/* out[B, dim] = pooling of x[T, dim] per sequence (fp32 accumulation). */
nopad_status cuda_pool(nopad_dtype dtype, void *out, const void *x, const int32_t *cu_seqlens,
                       int32_t n_seqs, int32_t dim, nopad_pooling mode, void *stream);

/* x[rows, dim] /= max(||row||, 1e-12) in place. */
nopad_status cuda_l2_normalize(nopad_dtype dtype, void *x, int32_t rows, int32_t dim, void *stream);

/* Packs a right-padded batch on the device: cu_out[B+1] = prefix sum of lengths[B];
 * tokens_out[T] (types_out[T], or NULL) gathered from tokens[B, max_len] (types or NULL: zeros).
 * The lengths are not read back: if one is outside [1, min(max_len, max_seqlen)] or they do not
 * add up to n_tokens,
 * *bad (device int) is set, cu_out becomes [0, 1, ..., B-1, n_tokens] and every id -1, so the
 * forward stays in bounds and yields NaN rows. Needs n_tokens >= n_seqs. */
nopad_status cuda_pack_padded(const int32_t *tokens, const int32_t *types, const int32_t *lengths,
                              int32_t n_seqs, int32_t max_len, int32_t max_seqlen, int32_t n_tokens,
                              int32_t *cu_out, int32_t *tokens_out, int32_t *types_out, int32_t *bad,
                              void *stream);

/* out[B, max_len, row] = the packed rows x[T, row] of each sequence (cu[B+1]), zeros past its
 * length; row_bytes per row (a byte copy: any dtype). */
nopad_status cuda_unpack_padded(void *out, const void *x, const int32_t *cu, int32_t n_seqs,
                                int32_t max_len, size_t row_bytes, void *stream);

/* Element conversions between float32 and dtype, n elements, device to device. */
nopad_status cuda_convert_from_f32(nopad_dtype dtype, void *dst, const float *src, size_t n,
                                   void *stream);
nopad_status cuda_convert_to_f32(nopad_dtype dtype, float *dst, const void *src, size_t n,
                                 void *stream);

#ifdef __cplusplus
}
#endif
#endif
