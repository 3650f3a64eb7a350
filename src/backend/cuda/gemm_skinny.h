/* Linear layers for the few tokens of a small batch: y[T, N] = epilogue(x[T, K] · w[N, K]ᵀ) with
 * T <= CUDA_SKINNY_MAX_T, in one kernel whatever the epilogue (gemm_skinny.cu says how).
 *
 * At T = 26 (one short sentence) a BERT-base linear layer is a stream of 1.2–4.7 MB of weights
 * through ~0.2 GFLOP: what counts is reading the weights with every SM and doing the rest in the
 * same kernel. The library GEMMs run such shapes on 48-96 CTAs of the 132 SMs and add kernels of
 * their own (cuBLASLt's split-K reduction at K = 3072; the exact GELU as a separate pass).
 *
 * Epilogue, in fp32 with one rounding at the store: + bias[N] (NULL: none), then the activation
 * (act >= 0: a nopad_activation; act < 0: none), then + residual[T, N] (NULL: none; may alias y).
 * The K slices of a tile are summed in a fixed order, so equal inputs give identical bits.
 * No workspace, no allocation, no synchronisation: a call can be captured in a CUDA graph.
 * Requires K % 8 == 0 and K <= 4096, N % 64 == 0, 16-byte aligned x, w, y and residual, bias
 * 8-byte aligned. Anything else returns NOPAD_ERR_UNSUPPORTED (the caller takes another path). */
#ifndef NOPAD_BACKEND_CUDA_GEMM_SKINNY_H
#define NOPAD_BACKEND_CUDA_GEMM_SKINNY_H

#include <stddef.h>
#include <stdint.h>

#include "backend/backend.h"

#ifdef __cplusplus
extern "C" {
#endif

enum { CUDA_SKINNY_MAX_T = 256 };

/* Whether cuda_gemm_skinny takes this shape (the arguments it checks without looking at data). */
int cuda_gemm_skinny_supported(int32_t n_tokens, int32_t n_in, int32_t n_out);

nopad_status cuda_gemm_skinny(nopad_dtype dtype, void *y, const void *x, const void *w,
                              const void *bias, const void *residual, int32_t n_tokens,
                              int32_t n_in, int32_t n_out, int act, void *stream);

/* The LayerNorm of the input fused in front: xn[T, K] = LayerNorm(x[T, K]) over each row
 * (ln_weight, ln_bias [K], eps) is stored, rounded to the dtype as the LayerNorm kernel stores
 * it, and y[T, N] = epilogue(xn · wᵀ) is computed from those rounded values, with the epilogue of
 * cuda_gemm_skinny. One kernel instead of a LayerNorm kernel and a GEMM: the K slices of a tile
 * (one thread-block cluster) hold whole rows between them and exchange their row statistics
 * through distributed shared memory. xn must not overlap x, y or residual, nor y overlap x;
 * xn, ln_weight and ln_bias 16-byte aligned; the shapes of cuda_gemm_skinny_supported. */
nopad_status cuda_gemm_skinny_layernorm(nopad_dtype dtype, void *y, void *xn, const void *x,
                                        const void *ln_weight, const void *ln_bias, float eps,
                                        const void *w, const void *bias, const void *residual,
                                        int32_t n_tokens, int32_t n_in, int32_t n_out, int act,
                                        void *stream);

/* Whether the backend's layernorm_linear op takes this shape: T within
 * cuda_gemm_skinny_max_tokens(), a supported shape, and NOPAD_SKINNY_LN = "1" (read at the
 * first call; otherwise the model keeps the LayerNorm kernels). */
int cuda_gemm_skinny_layernorm_takes(int32_t n_tokens, int32_t n_in, int32_t n_out);

/* The attention of the batch fused in front: y[T, N] = epilogue(attention(qkv) · wᵀ), where
 * attention is the backend's attention_varlen (not causal; qkv [T, 3, heads, head_size], the
 * sequences cu_seqlens[n_seqs + 1] in device memory, softmax(scale · q·kᵀ)) and its output
 * [T, heads·head_size], rounded to the dtype, is the GEMM's input. It is never stored: each CTA
 * computes the heads of its K slice for every token. For one tile of tokens (T <= 64) and head
 * sizes 32 and 64; y must not overlap qkv (residual may alias y). cu_seqlens is read on the
 * device, as the attention op reads it; tokens past cu_seqlens[n_seqs] (at most T) belong to no
 * sequence: they attend to nothing and get y = epilogue(0). */
nopad_status cuda_gemm_skinny_attention(nopad_dtype dtype, void *y, const void *qkv,
                                        const int32_t *cu_seqlens, int32_t n_seqs, int32_t n_tokens,
                                        int32_t n_heads, int32_t head_size, float scale, const void *w,
                                        const void *bias, const void *residual, int32_t n_out, int act,
                                        void *stream);
int cuda_gemm_skinny_attention_supported(int32_t n_tokens, int32_t n_heads, int32_t head_size,
                                         int32_t n_out);
/* Whether the backend's attention_linear op takes this batch: T within
 * cuda_gemm_skinny_max_tokens(), a supported shape, and NOPAD_SKINNY_ATTN = "1" (read at the first
 * call; otherwise the model keeps the attention kernel and the linear layer). */
int cuda_gemm_skinny_attention_takes(int32_t n_tokens, int32_t n_heads, int32_t head_size,
                                     int32_t n_out);

/* The largest T that the backend's linear op sends here: NOPAD_SKINNY_MAX_TOKENS (0 turns the
 * path off; at most CUDA_SKINNY_MAX_T), read at the first call; by default 32, the crossover
 * measured on an H200 in the whole BERT-base forward (faster at 16 and 32 tokens, slower from
 * 64). Timed alone by ncu the kernel takes 7-8 us at 32 tokens where a cuBLASLt GEMM takes
 * 4.6-5.9: in the forward it gains by replacing the split-K reduction and GELU kernels and by
 * fetching its weights before the kernel ahead of it has finished. */
int32_t cuda_gemm_skinny_max_tokens(void);
/* Overrides it (0: off), for the benchmark and the tests. */
void cuda_gemm_skinny_set_max_tokens(int32_t max_tokens);

/* Whether the backend's linear op takes the skinny GEMM for this shape and activation (act < 0:
 * none): every supported shape within cuda_gemm_skinny_max_tokens(). Alone, graph-replayed, the
 * skinny GEMM beats the library path only at K >= 2·N (FFN out: 1.34x at 16 tokens, 1.09x at
 * 32) and for the exact GELU at 16 tokens (1.17x), and loses elsewhere (qkv 0.95x / 0.77x;
 * bench/results/gemm_2026-11-21_H200_skinny.log); but in the forward, where consecutive skinny
 * kernels fetch their weights while the kernel before them finishes, taking it for every GEMM
 * measured faster than taking it only where it won alone (26 tokens: 0.347 against 0.366 ms;
 * bench/results/enc_2026-11-21_H200_ab_skinny.log). NOPAD_SKINNY_ONLY_WINS=1 takes it only
 * where it won alone (for A/B runs). */
int cuda_gemm_skinny_wins(int32_t n_tokens, int32_t n_in, int32_t n_out, int act);

#ifdef __cplusplus
}
#endif
#endif
