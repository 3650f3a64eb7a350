/* Internal: the FlashAttention-3-structured kernel of varlen attention (TMA producer warp, consumer
 * warpgroups, sm_90a), head size 64. Called by the wgmma dispatcher (attention_wgmma.cu). C++
 * linkage: both sides are .cu files. */
#ifndef NOPAD_BACKEND_CUDA_ATTENTION_FA3_H
#define NOPAD_BACKEND_CUDA_ATTENTION_FA3_H

#include <cuda_runtime.h>
#include <stdint.h>

/* NOPAD_FMHA_FA3: -1 (unset: the dispatcher decides by max_seqlen), 0 (never), 1 (always, d = 64) */
int cuda_attention_fa3_mode(void);

/* 1 if cuda_attention_fa3 would launch its persistent kernel for this batch: it needs the
 * workspace, at most 1024 sequences, and NOPAD_FMHA_FA3_PERSIST not 0 */
int cuda_attention_fa3_persistent(int32_t n_seqs, int32_t max_seqlen, int32_t n_heads, const void *workspace);

/* Enqueues attention for head_size 64; same tensors and workspace as cuda_attention_varlen (the
 * persistent variant needs the workspace, the other ignores it). rescale_thresh: the lazy-rescaling
 * threshold (log2 units). Returns cudaErrorNotSupported, having enqueued nothing, when the driver
 * has no tensor-map encoder (the caller then uses another kernel). */
cudaError_t cuda_attention_fa3(int bf16, void *out, const void *qkv, const int32_t *cu_seqlens, int32_t n_seqs,
                               int32_t max_seqlen, int32_t n_heads, float scale, float rescale_thresh, int causal,
                               int pdl, void *workspace, void *stream);
#endif
