/* nopad_attention_varlen: the attention op on its own, dispatched to the CPU reference or, in a
 * CUDA build, to the fused kernels. */
#include "backend/backend.h"
#include "util/error.h"
#ifdef NOPAD_HAVE_CUDA
#include "backend/cuda/attention/attention.h"
#endif

nopad_status nopad_attention_varlen(nopad_device device, nopad_dtype dtype, void *out,
                                    const void *qkv, const int32_t *cu_seqlens, int32_t n_seqs,
                                    int32_t n_tokens, int32_t max_seqlen, int32_t n_heads, int32_t head_size,
                                    float scale, int causal, void *workspace, void *stream) {
    if (!out || !qkv || !cu_seqlens)
        return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT, "attention_varlen: NULL tensor");
    if (n_seqs < 1 || max_seqlen < 1 || n_heads < 1 || head_size < 1)
        return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT,
                               "attention_varlen: need n_seqs, max_seqlen, n_heads, head_size >= 1 "
                               "(got %d, %d, %d, %d)", n_seqs, max_seqlen, n_heads, head_size);
    if (n_tokens < n_seqs)
        return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT,
                               "attention_varlen: n_tokens %d < n_seqs %d (every sequence has a token)",
                               n_tokens, n_seqs);
    if (device == NOPAD_DEVICE_CPU) {
        if (dtype != NOPAD_DTYPE_F32)
            return nopad_set_error(NOPAD_ERR_UNSUPPORTED, "attention_varlen: the CPU computes in F32");
        /* Host pointers: the lengths can be checked here. */
        if (cu_seqlens[0] != 0)
            return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT, "attention_varlen: cu_seqlens[0] != 0");
        for (int32_t s = 0; s < n_seqs; s++) {
            int32_t len = cu_seqlens[s + 1] - cu_seqlens[s];
            if (len < 1 || len > max_seqlen)
                return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT,
                                       "attention_varlen: sequence %d has length %d, outside [1, "
                                       "max_seqlen = %d]", s, len, max_seqlen);
        }
        if (cu_seqlens[n_seqs] != n_tokens)
            return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT,
                                   "attention_varlen: n_tokens is %d but cu_seqlens[%d] = %d", n_tokens,
                                   n_seqs, cu_seqlens[n_seqs]);
        nopad_backend *be;
        nopad_status st = nopad_backend_cpu_create(0, &be);
        if (st != NOPAD_OK) return st;
        nopad_seqs seqs = {.n_seqs = n_seqs, .n_tokens = cu_seqlens[n_seqs],
                           .max_seqlen = max_seqlen, .cu_seqlens = cu_seqlens};
        st = be->attention(be, out, qkv, &seqs, n_heads, head_size, scale, causal);
        be->destroy(be);
        return st;
    }
    if (device == NOPAD_DEVICE_CUDA) {
#ifdef NOPAD_HAVE_CUDA
        return cuda_attention_varlen(dtype, out, qkv, cu_seqlens, n_seqs, n_tokens, max_seqlen, n_heads,
                                     head_size, scale, causal, workspace, stream);
#else
        return nopad_set_error(NOPAD_ERR_UNSUPPORTED,
                               "attention_varlen: this build of nopad has no CUDA backend "
                               "(configure with -DNOPAD_CUDA=ON)");
#endif
    }
    return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT, "attention_varlen: unknown device %d", (int)device);
}
