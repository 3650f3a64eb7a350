/* CUDA training ops: attention_lse and attention_backward (FlashAttention-2 style; the kernels
 * and their design are in attention_backward.cu). The adapters make the device current, grow the
 * backward's float32 scratch (dq accumulator and row sums) when a batch needs more, and enqueue. */
#ifdef NOPAD_HAVE_CUDA

#include <cuda_runtime.h>

#include "backend/cuda/state.h"
#include "backend/cuda/train/attention_backward.h"
#include "backend/cuda/train/train_ops.h"
#include "util/error.h"

static nopad_status cu_attention_lse(nopad_backend *be, void *out, float *lse32, const void *qkv,
                                     const nopad_seqs *seqs, int32_t n_heads, int32_t head_size, float scale,
                                     int causal, const nopad_attention_dropout *drop) {
    CUDA_ENTER(be, s);
    return cuda_attention_lse(be->dtype == NOPAD_DTYPE_BF16, out, lse32, qkv, seqs->cu_seqlens, seqs->n_seqs,
                              seqs->n_tokens, seqs->max_seqlen, n_heads, head_size, scale, causal, drop, s->stream);
}

/* The scratch grows to `need` bytes: the old buffer may still be read by work on the stream, and
 * recorded graphs name it, so the graphs are cleared (which synchronises the stream) before it is
 * freed; nothing may be allocated while a graph is being recorded (a shape runs once outside a
 * recording first, as graph_run arranges). */
static nopad_status grow_scratch(nopad_backend *be, cuda_state *s, size_t need) {
    if (need <= s->attn_bwd_ws_bytes) return NOPAD_OK;
    enum cudaStreamCaptureStatus capturing = cudaStreamCaptureStatusNone;
    if (cudaStreamIsCapturing(s->stream, &capturing) != cudaSuccess) cudaGetLastError();
    if (capturing != cudaStreamCaptureStatusNone)
        return nopad_set_error(NOPAD_ERR_INTERNAL,
                               "cuda attention_backward: the scratch must grow during a graph recording");
    if (s->attn_bwd_ws) {
        cuda_graph_clear(be);
        cudaFree(s->attn_bwd_ws);
        s->attn_bwd_ws = NULL;
        s->attn_bwd_ws_bytes = 0;
    }
    nopad_status st = cuda_check(cudaMalloc((void **)&s->attn_bwd_ws, need), "attention_backward scratch");
    if (st == NOPAD_OK) s->attn_bwd_ws_bytes = need;
    return st;
}

static nopad_status cu_attention_backward(nopad_backend *be, void *dqkv, const void *dout, const void *qkv,
                                          const void *out, const float *lse32, const nopad_seqs *seqs,
                                          int32_t n_heads, int32_t head_size, float scale, int causal,
                                          const nopad_attention_dropout *drop) {
    CUDA_ENTER(be, s);
    if (head_size != 32 && head_size != 64 && head_size != 128)
        return nopad_set_error(NOPAD_ERR_UNSUPPORTED,
                               "cuda attention_backward: head size %d has no kernel (32, 64, 128)", head_size);
    if (seqs->n_tokens < 1 || n_heads < 1)
        return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT,
                               "cuda attention_backward: need n_tokens and n_heads >= 1 (got %d, %d)",
                               seqs->n_tokens, n_heads);
    nopad_status st = grow_scratch(be, s, cuda_attention_backward_ws_bytes(seqs->n_tokens, n_heads, head_size));
    if (st != NOPAD_OK) return st;
    return cuda_attention_backward(be->dtype == NOPAD_DTYPE_BF16, dqkv, dout, qkv, out, lse32, seqs->cu_seqlens,
                                   seqs->n_seqs, seqs->n_tokens, seqs->max_seqlen, n_heads, head_size, scale,
                                   causal, drop, s->attn_bwd_ws, s->stream);
}

void cuda_train_install_attention(nopad_backend *be) {
    be->attention_lse = cu_attention_lse;
    be->attention_backward = cu_attention_backward;
}

#endif /* NOPAD_HAVE_CUDA */
