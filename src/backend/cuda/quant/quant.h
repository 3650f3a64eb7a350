/* CUDA linear layers and embedding gathers on weights kept in a GGUF block format (backend.h's
 * nopad_weight_format: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 in blocks of 32; Q4_K, Q5_K, Q6_K in
 * super-blocks of 256), stored in device memory byte for byte as in the file: row n of w [N, K]
 * at w + n · cuda_quant_row_bytes(format, K).
 *
 * - cuda_qgemv (qgemv.cuh, a decode step's 1 .. CUDA_QGEMV_MAX_T tokens): the weights are read
 *   once and dequantised in registers into tensor-core fragments. A lane holds small integers q
 *   (|q| <= 128, exact in fp16 and bf16); one m16n8k16 MMA pair gives Σ q·x over a chunk of 32 in
 *   fp32, scaled by the chunk's fp32 scale afterwards (so scales up to fp16's largest never
 *   overflow a 16-bit value) plus min · Σ x (an MMA of ones) for the formats with a min. The same
 *   epilogues as the fp16 gemv (gemm/gemv.h), or a float32 output (the LM head).
 * - cuda_quant_dequantize (dequant.cu): w to the compute dtype, for the prompts' GEMMs (the
 *   caller multiplies the copy with the ordinary GEMM).
 * - cuda_quant_embed_tokens (dequant.cu): the decoder's embed_tokens (decoder_ops.h) with word in a
 *   block format, each row dequantised as it is gathered.
 * Nothing synchronises or allocates: every call can be captured in a CUDA graph. */
#ifndef NOPAD_BACKEND_CUDA_QUANT_QUANT_H
#define NOPAD_BACKEND_CUDA_QUANT_QUANT_H

#include <stddef.h>
#include <stdint.h>

#include "backend/backend.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The most tokens cuda_qgemv takes: up to 32 (four MMA tiles of 8 tokens) the weights' bytes set
 * a decode step's time, and the in-register dequantisation, done once per weight whatever the
 * token count, costs less than writing and re-reading a 16-bit copy (2 bytes a weight against
 * 0.56 for Q4_1). Above it the prompts' path dequantises into a scratch and runs the GEMM. */
enum { CUDA_QGEMV_MAX_T = 32 };

/* Elements per block of `format` (32 or 256), 0 for a format these kernels do not run. */
int32_t cuda_quant_block(nopad_weight_format format);

/* Whether the kernels run `format` on rows of n_in values (n_in a positive multiple of the block). */
int cuda_quant_runs(nopad_weight_format format, int32_t n_in);

/* Bytes of one row of n_in values (n_in a multiple of the block). */
size_t cuda_quant_row_bytes(nopad_weight_format format, int32_t n_in);

/* y[T, N] = x[T, K] · w[N, K]ᵀ, 1 <= T <= CUDA_QGEMV_MAX_T, x in `dtype` (F16 or BF16, 8-byte
 * aligned), w 2-byte aligned; a w 16-byte aligned (as the backend allocates) streams through
 * shared memory with 16-byte copies, any other w is read 2 bytes at a time (slower, same bits). out_f32: y float32, no epilogue (bias, residual NULL, act < 0). Else y in dtype with
 * + bias[N] (NULL: none), act (a nopad_activation, < 0: none) and + residual[T, N] (NULL: none;
 * may alias y), in fp32 with one rounding at the store. Unsupported shapes or formats are
 * NOPAD_ERR_UNSUPPORTED, naming them. */
nopad_status cuda_qgemv(nopad_dtype dtype, void *y, const void *x, const void *w, nopad_weight_format format,
                        const void *bias, const void *residual, int32_t n_tokens, int32_t n_in, int32_t n_out,
                        int act, int out_f32, void *stream);

/* out[rows, K] (dtype) = the rows of w (format) dequantised, each value rounded once. */
nopad_status cuda_quant_dequantize(nopad_dtype dtype, void *out, const void *w, nopad_weight_format format,
                                   int32_t rows, int32_t n_in, void *stream);

/* The decoder's embed_tokens (decoder_ops.h, cuda_dec_embed_tokens) with word's vocab_rows rows
 * (ids vocab0 .. vocab0 + vocab_rows - 1) in `format`: out32[t] = word[id - vocab0] dequantised
 * (0 for another rank's id) + pos[position] (pos in dtype, or NULL); a bad id or position gives a
 * row of NaN. */
nopad_status cuda_quant_embed_tokens(nopad_dtype dtype, float *out32, const int32_t *tokens, const int32_t *feed,
                                     const int32_t *positions, int32_t n_tokens, int32_t vocab, int32_t vocab0,
                                     int32_t vocab_rows, int32_t n_positions, const void *word,
                                     nopad_weight_format format, const void *pos, int32_t dim, void *stream);

#ifdef __cplusplus
}
#endif
#endif
