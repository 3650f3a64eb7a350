/* The one dispatcher of varlen attention: checks the arguments, then chooses the kernel and its tile
 * shape for the batch,
 *   head size 64, the FA3-structured kernel (fa3.cu) where it measured faster;
 *   head sizes 64 and 128, the wgmma kernels (wgmma.cu), unless NOPAD_FMHA_WGMMA=0;
 *   head sizes 32 (and 64, 128 with NOPAD_FMHA_WGMMA=0), the mma.sync kernels (mma.cu);
 *   any other head size up to 128, for the backend's op only, the generic kernel (generic.cu).
 * The measurements behind each choice are in docs/attention.md (H200, 12 heads, ratios to PyTorch's
 * varlen attention). */
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>

#include "backend/cuda/attention/attention.h"
#include "backend/cuda/attention/kernels.h"
#include "backend/cuda/common.h"
extern "C" {
#include "util/error.h"
#include "util/knobs.h"
}

/* The attention of a batch of at most 32 tokens sits between skinny GEMMs (gemm/skinny.h), whose
 * kernels already chain by programmatic launch; launched with the attribute too it made the forward
 * 3.5% slower there, while with more tokens it gains 1-4%. So: the attribute above 32 tokens. */
static bool attention_pdl(int32_t n_tokens) { return cuda_pdl_tensor_enabled() && n_tokens > 32; }

/* Lazy-rescaling threshold in log2 units (P <= 2^8 = 256 stays exact enough in fp16/bf16);
 * NOPAD_FMHA_RESCALE=0 rescales at every new maximum. */
static float lazy_rescale_threshold(void) {
    const float thresh = (float)knob_float(KNOB_FMHA_RESCALE);
    return thresh >= 0.0f && thresh <= 8.0f ? thresh : 8.0f;
}

/* Head size 64: whether the FA3 kernel wins over the wgmma kernels. With a workspace (persistent
 * FA3): non-causal above 512 tokens; causal above 1024, or above 512 with many work items
 * (192-row query tiles x heads x sequences). Without one, the one-CTA-per-tile FA3 kernel only for
 * non-causal dense batches: its CTAs past a sequence's end each hold an SM alone before exiting,
 * which cost a skewed batch (density T / (B * max_seqlen) = 0.03) 28%. */
static bool fa3_wins(int32_t n_seqs, int32_t n_tokens, int32_t max_seqlen, int32_t n_heads, int causal,
                     const void *workspace) {
    if (cuda_attention_fa3_persistent(n_seqs, max_seqlen, n_heads, workspace)) {
        const int64_t items = (int64_t)n_seqs * n_heads * ((max_seqlen + 191) / 192);
        return causal ? max_seqlen > 1024 || (max_seqlen > 512 && items >= 4608) : max_seqlen > 512;
    }
    const bool dense = (int64_t)n_tokens * 2 >= (int64_t)n_seqs * max_seqlen;
    return !causal && dense && (max_seqlen > 1024 || (max_seqlen > 512 && n_seqs >= 64));
}

/* 64 or 128 from a tile knob, else 0 (per shape). */
static int forced_tile(knob_id id) {
    const long v = knob_int(id);
    return v == 64 || v == 128 ? (int)v : 0;
}

/* The wgmma kernels' tile. Query rows: 64 (more CTAs in flight, five a SM at d = 64) up to 512
 * tokens for d = 64 (1024 causal), 128 above (half the K/V re-reads); d = 128: 64 up to 256 tokens.
 * Keys: 64 (keeps registers at 4 CTAs/SM), except 128 at d = 128 with 128-row tiles, and at d = 64
 * where a sequence of 65-128 keys is then one tile and the grid is under one wave of four CTAs a SM.
 * The pipelined variant for d = 64 with two warpgroups and 64-key tiles. NOPAD_FMHA_WG_M / _WG_N /
 * _WG_PIPE override. */
static cudaError_t run_wgmma(int32_t D, bool bf16, void *out, const void *qkv, const int32_t *cu_seqlens,
                             int32_t n_seqs, int32_t max_seqlen, int32_t n_heads, float scale, int causal,
                             bool pdl, cudaStream_t st) {
    const int fm = forced_tile(KNOB_FMHA_WG_M), fn = forced_tile(KNOB_FMHA_WG_N);
    const int pipe = fn == 128 ? 0 : (int)knob_int(KNOB_FMHA_WG_PIPE); /* pipelined: 64-key tiles only */
    const int rows64_upto = D == 64 ? (causal ? 1024 : 512) : 256;
    const int bm = fm ? fm : (max_seqlen <= rows64_upto ? 64 : 128);
    const bool one_key_tile = D == 64 && bm == 64 && max_seqlen > 64 && max_seqlen <= 128 &&
                              (int64_t)2 * n_heads * n_seqs < (int64_t)4 * cuda_sm_count();
    const int bn = fn ? fn : ((D == 128 && bm == 128) || one_key_tile ? 128 : 64);
    const bool pipelined = pipe == 1 || (pipe < 0 && D == 64 && bm == 128 && bn == 64);
    return cuda_attention_wgmma(D, bm, bn, pipelined, bf16, out, qkv, cu_seqlens, n_seqs, max_seqlen, n_heads,
                                scale, lazy_rescale_threshold(), causal, pdl, st);
}

/* The mma.sync kernels' tile. Query rows: 64 (4 warps) for short sequences, where a 128-row tile
 * would be mostly past the sequence's end and more CTAs fill the SMs, else 128 (8 warps). Keys: 64,
 * except d = 128 with 128-row tiles. NOPAD_FMHA_BLOCK_M / _BLOCK_N override. */
static cudaError_t run_mma(int32_t D, bool bf16, void *out, const void *qkv, const int32_t *cu_seqlens,
                           int32_t n_seqs, int32_t max_seqlen, int32_t n_heads, float scale, int causal, bool pdl,
                           cudaStream_t st) {
    const int fm = forced_tile(KNOB_FMHA_BLOCK_M), fn = forced_tile(KNOB_FMHA_BLOCK_N);
    const int bm = fm ? fm : (max_seqlen <= (D == 128 ? 512 : 256) ? 64 : 128);
    const int bn = fn ? fn : (D == 128 && bm == 128 ? 128 : 64);
    return cuda_attention_mma(D, bm, bn, bf16, out, qkv, cu_seqlens, n_seqs, max_seqlen, n_heads, scale, causal,
                              pdl, st);
}

extern "C" nopad_status cuda_attention_varlen(nopad_dtype dtype, void *out, const void *qkv,
                                              const int32_t *cu_seqlens, int32_t n_seqs, int32_t n_tokens,
                                              int32_t max_seqlen, int32_t n_heads, int32_t head_size,
                                              float scale, int causal, void *workspace, void *stream) {
    if (dtype != NOPAD_DTYPE_F16 && dtype != NOPAD_DTYPE_BF16)
        return nopad_set_error(NOPAD_ERR_UNSUPPORTED, "cuda attention_varlen: dtype %d has no kernel (F16, BF16)",
                               (int)dtype);
    if (head_size != 32 && head_size != 64 && head_size != 128)
        return nopad_set_error(NOPAD_ERR_UNSUPPORTED,
                               "cuda attention_varlen: head size %d has no kernel (32, 64, 128)", head_size);
    if (n_seqs < 1 || max_seqlen < 1 || n_heads < 1 || n_heads > 65535)
        return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT,
                               "cuda attention_varlen: need n_seqs, max_seqlen >= 1 and 1 <= n_heads <= 65535 "
                               "(got %d, %d, %d)", n_seqs, max_seqlen, n_heads);
    if (n_tokens < n_seqs)
        return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT,
                               "cuda attention_varlen: n_tokens %d < n_seqs %d (every sequence has a token)",
                               n_tokens, n_seqs);
    if (!(scale > 0.0f) || isinf(scale))
        return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT,
                               "cuda attention_varlen: scale must be positive and finite (got %g)", (double)scale);
    if ((uintptr_t)workspace % 8)
        return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT,
                               "cuda attention_varlen: the workspace must be 8-byte aligned");
    if (((uintptr_t)out | (uintptr_t)qkv) % 16)
        return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT,
                               "cuda attention_varlen: qkv and out must be 16-byte aligned");
    cudaStream_t st = (cudaStream_t)stream;
    const bool bf16 = dtype == NOPAD_DTYPE_BF16;
    const bool pdl = attention_pdl(n_tokens);
    cudaError_t e = cudaErrorNotSupported;
    if (head_size == 64) {
        const long mode = knob_int(KNOB_FMHA_FA3);
        const int fa3 = mode < -1 || mode > 1 ? -1 : (int)mode; /* -1 per shape, 0 never, 1 always */
        if (knob_int(KNOB_FMHA_WGMMA) != 0 &&
            (fa3 == 1 || (fa3 < 0 && fa3_wins(n_seqs, n_tokens, max_seqlen, n_heads, causal, workspace))))
            e = cuda_attention_fa3(bf16, out, qkv, cu_seqlens, n_seqs, max_seqlen, n_heads, scale,
                                   lazy_rescale_threshold(), causal, pdl, workspace, st);
    }
    if (e == cudaErrorNotSupported) /* not tried, or no tensor-map encoder in the driver */
        e = head_size >= 64 && knob_int(KNOB_FMHA_WGMMA) != 0
                ? run_wgmma(head_size, bf16, out, qkv, cu_seqlens, n_seqs, max_seqlen, n_heads, scale, causal, pdl, st)
                : run_mma(head_size, bf16, out, qkv, cu_seqlens, n_seqs, max_seqlen, n_heads, scale, causal, pdl, st);
    if (e != cudaSuccess)
        return nopad_set_error(NOPAD_ERR_BACKEND, "cuda attention_varlen: launch failed: %s (%s)",
                               cudaGetErrorString(e), cudaGetErrorName(e));
    return NOPAD_OK;
}

extern "C" nopad_status cuda_attention(nopad_dtype dtype, void *out, const void *qkv, const int32_t *cu_seqlens,
                                       int32_t n_seqs, int32_t n_tokens, int32_t max_seqlen, int32_t n_heads,
                                       int32_t head_size, float scale, int causal, void *workspace, void *stream) {
    if (head_size != 32 && head_size != 64 && head_size != 128)
        return cuda_attention_varlen_generic(dtype, out, qkv, cu_seqlens, n_seqs, n_tokens, n_heads, head_size,
                                             scale, causal, stream);
    return cuda_attention_varlen(dtype, out, qkv, cu_seqlens, n_seqs, n_tokens, max_seqlen, n_heads, head_size,
                                 scale, causal, workspace, stream);
}
