/* Internal: the launchers of training's varlen attention (attention_backward.cu), called by the op
 * table's adapters (attention.c), which have checked the arguments. Same tensors as backend.h's
 * attention_lse / attention_backward: qkv and dqkv [T, 3, n_heads, D], out and dout [T, n_heads·D]
 * in fp16 (bf16 = 0) or bf16, lse32 [T, n_heads] float32, cu_seqlens [n_seqs + 1] on the device.
 * Everything is enqueued on `stream` (cudaStream_t); nothing synchronises with the host. */
#ifndef NOPAD_BACKEND_CUDA_TRAIN_ATTENTION_BACKWARD_H
#define NOPAD_BACKEND_CUDA_TRAIN_ATTENTION_BACKWARD_H

#include <stddef.h>
#include <stdint.h>

#include "backend/backend.h"
#include "nopad.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The backward's scratch for a batch: dq32 [T, n_heads, D] and dsum [T, n_heads], float32. */
size_t cuda_attention_backward_ws_bytes(int32_t n_tokens, int32_t n_heads, int32_t head_size);

/* The forward that also writes lse32 (the wgmma kernels of attention/wgmma.cu at d = 64 and 128,
 * the mma.sync ones of attention/mma.cu at d = 32). drop: NULL or the attention's dropout
 * (backend.h). */
nopad_status cuda_attention_lse(int bf16, void *out, float *lse32, const void *qkv, const int32_t *cu_seqlens,
                                int32_t n_seqs, int32_t n_tokens, int32_t max_seqlen, int32_t n_heads,
                                int32_t head_size, float scale, int causal, const nopad_attention_dropout *drop,
                                void *stream);

/* dqkv from dout, qkv, out and lse32; ws: cuda_attention_backward_ws_bytes of device memory
 * (16-byte aligned; its contents are overwritten). */
nopad_status cuda_attention_backward(int bf16, void *dqkv, const void *dout, const void *qkv, const void *out,
                                     const float *lse32, const int32_t *cu_seqlens, int32_t n_seqs,
                                     int32_t n_tokens, int32_t max_seqlen, int32_t n_heads, int32_t head_size,
                                     float scale, int causal, const nopad_attention_dropout *drop, void *ws,
                                     void *stream);

#ifdef __cplusplus
}
#endif
#endif
