/* Internal: the launchers of the attention kernels, called by the dispatcher (dispatch.cu), which
 * has checked the arguments and chosen the kernel and its tile shape. Same tensors as
 * cuda_attention_varlen (attention.h). C++ linkage except the generic kernel's C launcher. */
#ifndef NOPAD_BACKEND_CUDA_ATTENTION_KERNELS_H
#define NOPAD_BACKEND_CUDA_ATTENTION_KERNELS_H

#include <cuda_runtime.h>
#include <stdint.h>

#include "nopad.h"

/* fa3.cu: the FlashAttention-3-structured kernel (TMA producer warp, consumer warpgroups), head
 * size 64. */

/* 1 if cuda_attention_fa3 would launch its persistent kernel for this batch: it needs the
 * workspace, at most 1024 sequences, and NOPAD_FMHA_FA3_PERSIST not 0 */
int cuda_attention_fa3_persistent(int32_t n_seqs, int32_t max_seqlen, int32_t n_heads, const void *workspace);

/* The persistent variant needs the workspace, the other ignores it. rescale_thresh: the
 * lazy-rescaling threshold (log2 units). Returns cudaErrorNotSupported, having enqueued nothing,
 * when the driver has no tensor-map encoder (the caller then uses another kernel). */
cudaError_t cuda_attention_fa3(int bf16, void *out, const void *qkv, const int32_t *cu_seqlens, int32_t n_seqs,
                               int32_t max_seqlen, int32_t n_heads, float scale, float rescale_thresh, int causal,
                               int pdl, void *workspace, void *stream);


/* Training's attention-probability dropout (backend.h, nopad_attention_dropout) as the mma.sync
 * kernels take it: keep a probability, times scale = 1/(1 - p), when its bits reach threshold =
 * p·2³²; threshold 0: off. */
struct attention_dropout_params {
    uint32_t threshold;
    float scale;
    uint64_t key;
    uint32_t site;
    const int64_t *examples; /* [B] each sequence's example number, which keys its masks; NULL: s */
};

/* wgmma.cu: the wgmma kernels, head sizes 64 and 128: block_m query rows (64 | 128: one or two
 * warpgroups) and block_n keys (64 | 128) a tile; pipe: the pipelined variant (64-key tiles,
 * block_n ignored). lse: NULL (inference), or float32 [T, n_heads] that also receives each query
 * row's log-sum-exp of its scaled scores (training's forward, as cuda_attention_mma's). drop
 * (training, with lse): as cuda_attention_mma's; a dropout run takes one warpgroup and 64-key
 * tiles whatever block_m, block_n and pipe say. */
cudaError_t cuda_attention_wgmma(int32_t head_size, int block_m, int block_n, bool pipe, bool bf16, void *out,
                                 const void *qkv, const int32_t *cu_seqlens, int32_t n_seqs, int32_t max_seqlen,
                                 int32_t n_heads, float scale, float rescale_thresh, int causal, bool pdl,
                                 cudaStream_t stream, float *lse = nullptr,
                                 const attention_dropout_params *drop = nullptr);

/* mma.cu: the mma.sync kernels, head sizes 32, 64 and 128: block_m query rows (64 | 128: four or
 * eight warps) and block_n keys (64 | 128) a tile. lse: NULL (inference), or float32 [T, n_heads]
 * that also receives each query row's log-sum-exp of its scaled scores (training's forward). drop
 * (training, with lse): the probabilities are dropped before they weight V; a dropout run takes
 * the 64 x 64 tile whatever block_m and block_n say. */
cudaError_t cuda_attention_mma(int32_t head_size, int block_m, int block_n, bool bf16, void *out, const void *qkv,
                               const int32_t *cu_seqlens, int32_t n_seqs, int32_t max_seqlen, int32_t n_heads,
                               float scale, int causal, bool pdl, cudaStream_t stream, float *lse = nullptr,
                               const attention_dropout_params *drop = nullptr);

/* generic.cu: any head size <= 128 (one warp per query row and head, fp32 online softmax, no
 * tensor cores): the correctness path for head sizes the fused kernels do not cover. */
extern "C" nopad_status cuda_attention_varlen_generic(nopad_dtype dtype, void *out, const void *qkv,
                                                      const int32_t *cu_seqlens, int32_t n_seqs,
                                                      int32_t n_tokens, int32_t n_heads, int32_t head_size,
                                                      float scale, int causal, void *stream);
#endif
