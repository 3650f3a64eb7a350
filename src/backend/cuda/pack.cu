/* CUDA: right-padded batches <-> the packed token stream, on the device (no host sync). */
#include <string.h>

#include "backend/cuda/common.cuh"
#include "backend/cuda/ops.h"

/* cu_seqlens[B+1] = the prefix sum of lengths[B], in one block (a chunked scan: any B works, and B
 * is small next to the tokens). The host was told n_tokens and max_seqlen without reading the
 * lengths back; if any length is outside [1, min(max_len, max_seqlen)] or they do not add up to
 * n_tokens, the batch cannot be packed as announced: *bad is set and cu_seqlens becomes the valid
 * layout [0, 1, ..., B-1, n_tokens] (n_tokens >= B is checked on the host), so every later kernel
 * stays in bounds while the gather poisons the ids (NaN rows out). */
__global__ void lengths_to_cu_seqlens_kernel(const int32_t *__restrict__ lengths, int n_seqs,
                                             int max_len /* min(max_len, max_seqlen) */, int n_tokens,
                                             int32_t *__restrict__ cu, int32_t *__restrict__ bad) {
    __shared__ long long carry;
    __shared__ int bad_seen;
    __shared__ int warp_totals[32];
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, n_warps = blockDim.x / 32;
    if (threadIdx.x == 0) carry = 0, bad_seen = 0, cu[0] = 0;
    __syncthreads();
    for (int base = 0; base < n_seqs; base += blockDim.x) {
        const int i = base + threadIdx.x;
        int len = i < n_seqs ? lengths[i] : 0;
        if (i < n_seqs && (len < 1 || len > max_len)) bad_seen = 1; /* every writer writes 1 */
        len = len < 0 ? 0 : len > max_len ? max_len : len;
        int v = len; /* inclusive scan: lanes, then warps */
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
            const int up = __shfl_up_sync(0xffffffffu, v, o);
            if (lane >= o) v += up;
        }
        if (lane == 31) warp_totals[warp] = v;
        __syncthreads();
        if (warp == 0) {
            int w = lane < n_warps ? warp_totals[lane] : 0;
#pragma unroll
            for (int o = 1; o < 32; o <<= 1) {
                const int up = __shfl_up_sync(0xffffffffu, w, o);
                if (lane >= o) w += up;
            }
            warp_totals[lane] = w; /* inclusive over warps */
        }
        __syncthreads();
        const long long prefix = carry + v + (warp ? warp_totals[warp - 1] : 0);
        if (i < n_seqs) cu[i + 1] = (int32_t)(prefix < n_tokens ? prefix : n_tokens);
        __syncthreads();
        if (threadIdx.x == 0) carry += warp_totals[n_warps - 1];
        __syncthreads();
    }
    if (threadIdx.x == 0 && carry != n_tokens) bad_seen = 1;
    __syncthreads();
    if (bad_seen) {
        for (int i = threadIdx.x; i < n_seqs; i += blockDim.x) cu[i] = i;
        if (threadIdx.x == 0) cu[n_seqs] = n_tokens;
    }
    if (threadIdx.x == 0) *bad = bad_seen;
}

/* tokens_out[cu[b] + p] = tokens[b, p] for p < lengths[b] (types alike); every id -1 when *bad. */
__global__ void gather_padded_kernel(const int32_t *__restrict__ tokens, const int32_t *__restrict__ types,
                                     const int32_t *__restrict__ cu, const int32_t *__restrict__ bad,
                                     int n_seqs, int max_len, int n_tokens,
                                     int32_t *__restrict__ tokens_out, int32_t *__restrict__ types_out) {
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (size_t)n_seqs * max_len) return;
    if (*bad) {
        if (i < (size_t)n_tokens) {
            tokens_out[i] = -1;
            if (types_out) types_out[i] = 0;
        }
        return;
    }
    const int b = (int)(i / max_len), p = (int)(i % max_len);
    if (p >= cu[b + 1] - cu[b]) return;
    tokens_out[cu[b] + p] = tokens[i];
    if (types_out) types_out[cu[b] + p] = types ? types[i] : 0;
}

/* out[b, p, :] = x[cu[b] + p, :] for p < the length, zeros after; rows of row_bytes, moved in
 * 16-byte words when the row allows it (a plain copy: the dtype does not matter). */
template <typename W>
__global__ void unpack_padded_kernel(W *__restrict__ out, const W *__restrict__ x,
                                     const int32_t *__restrict__ cu, int max_len, int row_words) {
    const int b = blockIdx.y, p = blockIdx.x;
    const int len = cu[b + 1] - cu[b];
    W *dst = out + ((size_t)b * max_len + p) * row_words;
    if (p < len) {
        const W *src = x + (size_t)(cu[b] + p) * row_words;
        for (int w = threadIdx.x; w < row_words; w += blockDim.x) dst[w] = src[w];
    } else {
        W zero;
        memset(&zero, 0, sizeof zero);
        for (int w = threadIdx.x; w < row_words; w += blockDim.x) dst[w] = zero;
    }
}

extern "C" nopad_status cuda_pack_padded(const int32_t *tokens, const int32_t *types,
                                         const int32_t *lengths, int32_t n_seqs, int32_t max_len,
                                         int32_t max_seqlen, int32_t n_tokens, int32_t *cu_out,
                                         int32_t *tokens_out, int32_t *types_out, int32_t *bad,
                                         void *stream) {
    cudaStream_t s = (cudaStream_t)stream;
    const int32_t limit = max_seqlen < max_len ? max_seqlen : max_len;
    lengths_to_cu_seqlens_kernel<<<1, 1024, 0, s>>>(lengths, n_seqs, limit, n_tokens, cu_out, bad);
    nopad_status st = launch_status("pack_padded (lengths)");
    if (st != NOPAD_OK) return st;
    const size_t n = (size_t)n_seqs * max_len;
    gather_padded_kernel<<<(unsigned)((n + 255) / 256), 256, 0, s>>>(tokens, types, cu_out, bad, n_seqs,
                                                                      max_len, n_tokens, tokens_out, types_out);
    return launch_status("pack_padded (gather)");
}

extern "C" nopad_status cuda_unpack_padded(void *out, const void *x, const int32_t *cu, int32_t n_seqs,
                                           int32_t max_len, size_t row_bytes, void *stream) {
    if (n_seqs > 65535)
        return nopad_set_error(NOPAD_ERR_UNSUPPORTED, "unpack_padded: %d sequences, at most 65535", n_seqs);
    cudaStream_t s = (cudaStream_t)stream;
    const dim3 grid((unsigned)max_len, (unsigned)n_seqs);
    if (row_bytes % 16 == 0 && (uintptr_t)out % 16 == 0 && (uintptr_t)x % 16 == 0)
        unpack_padded_kernel<uint4><<<grid, 128, 0, s>>>((uint4 *)out, (const uint4 *)x, cu, max_len,
                                                         (int)(row_bytes / 16));
    else
        unpack_padded_kernel<uint16_t><<<grid, 128, 0, s>>>((uint16_t *)out, (const uint16_t *)x, cu, max_len,
                                                            (int)(row_bytes / 2));
    return launch_status("unpack_padded");
}
