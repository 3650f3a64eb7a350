/* C entry points of the CUDA varlen attention (dispatch.cu, the one place that chooses a kernel:
 * fa3.cu, wgmma.cu, mma.cu or generic.cu). */
#ifndef NOPAD_BACKEND_CUDA_ATTENTION_ATTENTION_H
#define NOPAD_BACKEND_CUDA_ATTENTION_ATTENTION_H

#include <stdint.h>

#include "nopad.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Enqueues fused varlen attention on `stream` (cudaStream_t). qkv [T, 3, n_heads, head_size] and
 * out [T, n_heads*head_size] in dtype F16 or BF16; cu_seqlens [n_seqs+1] on the device; n_tokens
 * = T (or an upper bound of cu_seqlens[n_seqs]: rows of qkv/out), which the kernel choice uses.
 * workspace: NULL or NOPAD_ATTENTION_WORKSPACE_BYTES of device memory, zero before its first use,
 * that the persistent kernels count work items in (and leave zero); see nopad_attention_varlen.
 * Returns NOPAD_ERR_UNSUPPORTED for head sizes / dtypes without a kernel, NOPAD_ERR_BACKEND
 * (with the CUDA error string) if the launch fails. No host synchronisation. */
nopad_status cuda_attention_varlen(nopad_dtype dtype, void *out, const void *qkv,
                                   const int32_t *cu_seqlens, int32_t n_seqs, int32_t n_tokens,
                                   int32_t max_seqlen, int32_t n_heads, int32_t head_size, float scale,
                                   int causal, void *workspace, void *stream);

/* The backend's attention op: cuda_attention_varlen where a fused kernel takes the head size (32,
 * 64, 128), else the generic kernel (head sizes 1..128; others: NOPAD_ERR_UNSUPPORTED). */
nopad_status cuda_attention(nopad_dtype dtype, void *out, const void *qkv, const int32_t *cu_seqlens,
                            int32_t n_seqs, int32_t n_tokens, int32_t max_seqlen, int32_t n_heads,
                            int32_t head_size, float scale, int causal, void *workspace, void *stream);

#ifdef __cplusplus
}
#endif
#endif
