/* The quantized linear op for more tokens than the GEMV takes (quant.h, CUDA_QGEMV_MAX_T): the
 * weight dequantised to the compute dtype into a scratch, then the ordinary GEMM with its epilogue
 * (gemm/gemm.h's cuda_gemm_linear; cuBLASLt's float32 GEMM for logits). A weight whose 16-bit copy
 * is at most the scratch cap (64 MiB) is done at once; a larger one (a big vocabulary's LM head)
 * in slices of output rows, each GEMM writing a [T, rows] buffer that is then copied into its
 * columns of out (the GEMM entries write whole rows), a residual copied into that buffer first.
 * C only: it needs the backend's cuBLASLt state. */
#ifndef NOPAD_BACKEND_CUDA_QUANT_QUANT_GEMM_H
#define NOPAD_BACKEND_CUDA_QUANT_QUANT_GEMM_H

#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime.h>

#include "backend/backend.h"
#include "backend/cuda/gemm/cublaslt.h"

/* Bytes of scratch cuda_quant_gemm needs for this shape (at most about the cap). */
size_t cuda_quant_gemm_scratch_bytes(int32_t n_tokens, int32_t n_in, int32_t n_out, int out_f32);

/* out[T, N] = epilogue(x[T, K] · wᵀ), w [N, K] in `format`, as the backend's gemm_q (out_f32:
 * float32, epilogue NONE), with `scratch` of cuda_quant_gemm_scratch_bytes bytes (device memory
 * nothing else uses until the stream has passed this call). */
nopad_status cuda_quant_gemm(cuda_lt *lt, nopad_dtype dtype, void *out, const void *x, const void *w,
                             nopad_weight_format format, const void *bias, const void *residual, int32_t n_tokens,
                             int32_t n_in, int32_t n_out, nopad_epilogue epilogue, nopad_activation act, int out_f32,
                             void *scratch, cudaStream_t stream);

/* Sets the cap (0: the default, 64 MiB), for the tests, which make it small to run the slices. */
void cuda_quant_set_scratch_cap(size_t bytes);

#endif
