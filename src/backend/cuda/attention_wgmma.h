/* Internal: the wgmma (sm_90a) kernels of varlen attention, head sizes 64 and 128. Called by
 * cuda_attention_varlen (attention_varlen.cu) after it has checked the arguments. C++ linkage: both
 * callers are .cu files. */
#ifndef NOPAD_BACKEND_CUDA_ATTENTION_WGMMA_H
#define NOPAD_BACKEND_CUDA_ATTENTION_WGMMA_H

#include <cuda_runtime.h>
#include <stdint.h>

/* 0 when NOPAD_FMHA_WGMMA=0 (falls back to the mma.sync kernels; for comparisons and tests) */
int cuda_attention_wgmma_enabled(void);

/* Whether the attention kernels of a batch of n_tokens launch with programmatic stream
 * serialisation (attention_varlen.cu says when). */
int cuda_attention_pdl(int32_t n_tokens);

/* Enqueues attention for head_size 64 or 128; same tensors as cuda_attention_varlen. */
cudaError_t cuda_attention_wgmma(int32_t head_size, int bf16, void *out, const void *qkv,
                                 const int32_t *cu_seqlens, int32_t n_seqs, int32_t n_tokens, int32_t max_seqlen,
                                 int32_t n_heads, float scale, int causal, void *workspace, void *stream);
#endif
