/* CUDA: embedding gather (word + position + token type) and LayerNorm in one pass, on the packed
 * token stream: positions come from cu_seqlens on the device. pos and type may be NULL (DeBERTa
 * without position_biased_input has no position embeddings). */
#include "backend/cuda/norm.cuh"
#include "backend/cuda/ops.h"

template <typename T, int VEC, int ITERS>
__global__ void __launch_bounds__(LN_WARPS * 32)
embed_layernorm_kernel(T *__restrict__ out, const int32_t *__restrict__ tokens,
                       const int32_t *__restrict__ types, const int32_t *__restrict__ cu_seqlens,
                       int n_seqs, int n_tokens, int position_offset, int vocab, int n_positions,
                       int type_vocab, const T *__restrict__ word, const T *__restrict__ pos,
                       const T *__restrict__ type, const T *__restrict__ w, const T *__restrict__ b,
                       float eps, int dim) {
    const int t = blockIdx.x * LN_WARPS + threadIdx.x / 32, lane = threadIdx.x % 32;
    allow_dependent_launch();
    row_share<T, VEC, ITERS> wv, bv;
    wv.load(w, dim, lane);
    bv.load(b, dim, lane);
    wait_for_upstream_grid(); /* the ids may come from the packing kernel */
    if (t >= n_tokens) return;
    const int s = sequence_of(cu_seqlens, n_seqs, t);
    const int id = tokens[t];
    const int p = position_offset + t - cu_seqlens[s];
    const int ty = types ? types[t] : 0;
    T *orow = out + (size_t)t * dim;
    if (id < 0 || id >= vocab || (pos && p >= n_positions) || (type && (ty < 0 || ty >= type_vocab))) {
        /* invalid input that could not be checked on the host: poison the row, never read out
         * of bounds */
        for (int e = lane; e < dim; e += 32) orow[e] = from_f32<T>(NAN);
        return;
    }
    const T *wr = word + (size_t)id * dim, *pr = pos ? pos + (size_t)p * dim : NULL;
    const T *tr = type ? type + (size_t)ty * dim : NULL;
    float v[ITERS * VEC];
#pragma unroll
    for (int it = 0; it < ITERS; it++) {
        const int e0 = (it * 32 + lane) * VEC;
        float a[VEC], c[VEC], d[VEC];
        if (e0 < dim) {
            load_vec<T, VEC>(a, wr + e0);
            if (pr) load_vec<T, VEC>(c, pr + e0);
            if (tr) load_vec<T, VEC>(d, tr + e0);
        }
#pragma unroll
        for (int j = 0; j < VEC; j++) v[it * VEC + j] = e0 < dim ? a[j] + (pr ? c[j] : 0.0f) + (tr ? d[j] : 0.0f) : 0.0f;
    }
    layernorm_store<T, VEC, ITERS>(v, orow, wv, bv, eps, dim, lane);
}

template <typename T>
static nopad_status embed_layernorm_t(void *out, const int32_t *tokens, const int32_t *types,
                                      const int32_t *cu, int n_seqs, int n_tokens, int offset,
                                      int vocab, int n_pos, int type_vocab, const void *word,
                                      const void *pos, const void *type, const void *w,
                                      const void *b, float eps, int dim, cudaStream_t stream) {
    const int grid = (n_tokens + LN_WARPS - 1) / LN_WARPS;
    LN_DISPATCH(T, embed_layernorm_kernel, grid, stream, (T *)out, tokens, types, cu, n_seqs,
                n_tokens, offset, vocab, n_pos, type_vocab, (const T *)word, (const T *)pos,
                (const T *)type, (const T *)w, (const T *)b, eps, dim);
    return launch_status("embed_layernorm");
}

extern "C" nopad_status cuda_embed_layernorm(nopad_dtype dtype, void *out, const int32_t *tokens,
                                             const int32_t *types, const int32_t *cu_seqlens,
                                             int32_t n_seqs, int32_t n_tokens, int32_t offset,
                                             int32_t vocab, int32_t n_pos, int32_t type_vocab,
                                             const void *word, const void *pos, const void *type,
                                             const void *w, const void *b, float eps, int32_t dim,
                                             void *stream) {
    if (n_tokens == 0) return NOPAD_OK;
    cudaStream_t s = (cudaStream_t)stream;
    DISPATCH_DTYPE(dtype,
                   embed_layernorm_t<__half>(out, tokens, types, cu_seqlens, n_seqs, n_tokens, offset, vocab,
                                             n_pos, type_vocab, word, pos, type, w, b, eps, dim, s),
                   embed_layernorm_t<__nv_bfloat16>(out, tokens, types, cu_seqlens, n_seqs, n_tokens, offset,
                                                    vocab, n_pos, type_vocab, word, pos, type, w, b, eps, dim, s));
}
