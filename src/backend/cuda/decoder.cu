/* CUDA: the decoder ops (fp16 / bf16 storage, fp32 arithmetic). First, correct versions tested
 * against the CPU ops: token embedding, LayerNorm / RMSNorm into a new buffer, rotary embeddings,
 * the paged KV store, causal attention over paged keys and values (flash-decoding: the keys of
 * each query row split across CTAs of 64 keys, merged by a second kernel), SwiGLU and the row
 * gather. Still to come: wgmma tiles for long query spans (prefill). */
#include "backend/cuda/common.cuh"
#include "backend/cuda/decoder_ops.h"

template <typename T>
__global__ void embed_tokens_kernel(float *out, const int32_t *tokens, const int32_t *positions,
                                    int vocab, int n_positions, const T *word, const T *pos,
                                    int dim) {
    const int t = blockIdx.x;
    const int id = tokens[t], p = positions ? positions[t] : 0;
    const bool bad = id < 0 || id >= vocab || (pos && (p < 0 || p >= n_positions));
    for (int i = threadIdx.x; i < dim; i += blockDim.x) {
        float v = bad ? NAN : to_f32(word[(size_t)id * dim + i]);
        if (!bad && pos) v += to_f32(pos[(size_t)p * dim + i]);
        out[(size_t)t * dim + i] = v;
    }
}

template <typename T>
__global__ void norm_kernel(T *out, const float *x, const T *w, const T *b, float eps, int dim,
                            int rms) {
    __shared__ float red[2][32];
    const float *row = x + (size_t)blockIdx.x * dim;
    float s = 0.0f, ss = 0.0f;
    for (int i = threadIdx.x; i < dim; i += blockDim.x) {
        const float v = row[i];
        s += v;
        ss += v * v;
    }
    s = warp_sum(s);
    ss = warp_sum(ss);
    if (threadIdx.x % 32 == 0) {
        red[0][threadIdx.x / 32] = s;
        red[1][threadIdx.x / 32] = ss;
    }
    __syncthreads();
    if (threadIdx.x < 32) {
        const int nw = blockDim.x / 32;
        float a = threadIdx.x < nw ? red[0][threadIdx.x] : 0.0f;
        float c = threadIdx.x < nw ? red[1][threadIdx.x] : 0.0f;
        a = warp_sum(a);
        c = warp_sum(c);
        if (threadIdx.x == 0) {
            red[0][0] = a;
            red[1][0] = c;
        }
    }
    __syncthreads();
    const float mean = red[0][0] / dim;
    const float inv = rms ? rsqrtf(red[1][0] / dim + eps)
                          : rsqrtf(fmaxf(red[1][0] / dim - mean * mean, 0.0f) + eps);
    for (int i = threadIdx.x; i < dim; i += blockDim.x) {
        const float v = row[i];
        float y = rms ? v * inv * to_f32(w[i]) : (v - mean) * inv * to_f32(w[i]);
        if (!rms && b) y += to_f32(b[i]);
        out[(size_t)blockIdx.x * dim + i] = from_f32<T>(y);
    }
}

template <typename T>
__global__ void rope_kernel(T *qkv, const int32_t *positions, int n_rot_heads, int row_heads,
                            int head_size, const float *inv_freq) {
    const int t = blockIdx.x, half = head_size / 2;
    const float p = (float)positions[t];
    for (int k = threadIdx.x; k < n_rot_heads * half; k += blockDim.x) {
        const int h = k / half, i = k % half;
        float s, c;
        sincosf(p * inv_freq[i], &s, &c);
        T *x = qkv + ((size_t)t * row_heads + h) * head_size;
        const float a = to_f32(x[i]), b = to_f32(x[i + half]);
        x[i] = from_f32<T>(a * c - b * s);
        x[i + half] = from_f32<T>(b * c + a * s);
    }
}

template <typename T>
__global__ void kv_store_kernel(T *k_cache, T *v_cache, const T *qkv, const int32_t *slots,
                                int n_heads, int n_kv_heads, int head_size) {
    const int t = blockIdx.x;
    const size_t kv = (size_t)n_kv_heads * head_size;
    const size_t row = (size_t)(n_heads + 2 * n_kv_heads) * head_size;
    const T *k = qkv + (size_t)t * row + (size_t)n_heads * head_size;
    const size_t slot = (size_t)slots[t];
    for (size_t i = threadIdx.x; i < kv; i += blockDim.x) {
        k_cache[slot * kv + i] = k[i];
        v_cache[slot * kv + i] = k[kv + i];
    }
}

enum { ATT_WARPS = 4, MAX_D_PER_LANE = 8, SPLIT_KEYS = 64 }; /* head sizes up to 256 */

/* Flash-decoding: blockIdx.z takes keys [z·SPLIT_KEYS, (z+1)·SPLIT_KEYS) of the query row's
 * history, its four warps one key each at a time with an online softmax, merged in shared memory;
 * the split's (max, sum, weighted values) go to the workspace and attention_combine_kernel merges
 * the splits. Few query rows over long histories thus still fill the GPU. */
template <typename T>
__global__ void attention_split_kernel(float *ws, const T *qkv, const T *k_cache, const T *v_cache,
                                       const int32_t *cu_q, const int32_t *seqlen_k,
                                       const int32_t *block_table, int n_seqs, int max_blocks,
                                       int block_size, int n_heads, int n_kv_heads, int head_size,
                                       float scale) {
    const int t = blockIdx.x, h = blockIdx.y, split = blockIdx.z, n_splits = gridDim.z;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int b = sequence_of(cu_q, n_seqs, t);
    const int n_new = cu_q[b + 1] - cu_q[b];
    const int pos = seqlen_k[b] - n_new + (t - cu_q[b]);
    const int first = split * SPLIT_KEYS, last = min(first + SPLIT_KEYS - 1, pos);
    float *part = ws + (((size_t)t * n_heads + h) * n_splits + split) * (head_size + 2);
    if (first > pos) { /* past this row's keys: an empty split */
        if (threadIdx.x == 0) {
            part[0] = -INFINITY;
            part[1] = 0.0f;
        }
        return;
    }
    const int32_t *blocks = block_table + (size_t)b * max_blocks;
    const int kvh = h / (n_heads / n_kv_heads);
    const size_t row = (size_t)(n_heads + 2 * n_kv_heads) * head_size;
    const size_t kvrow = (size_t)n_kv_heads * head_size;
    const int per_lane = (head_size + 31) / 32;
    float q[MAX_D_PER_LANE], acc[MAX_D_PER_LANE];
    for (int j = 0; j < per_lane; j++) {
        const int d = lane + 32 * j;
        q[j] = d < head_size ? to_f32(qkv[(size_t)t * row + (size_t)h * head_size + d]) * scale : 0.0f;
        acc[j] = 0.0f;
    }
    float m = -INFINITY, l = 0.0f;
    for (int key = first + warp; key <= last; key += ATT_WARPS) {
        const size_t slot = (size_t)blocks[key / block_size] * block_size + key % block_size;
        const T *k = k_cache + slot * kvrow + (size_t)kvh * head_size;
        const T *v = v_cache + slot * kvrow + (size_t)kvh * head_size;
        float kk[MAX_D_PER_LANE], vv[MAX_D_PER_LANE];
        for (int j = 0; j < per_lane; j++) { /* both loads in flight before the reduction */
            const int d = lane + 32 * j;
            kk[j] = d < head_size ? to_f32(k[d]) : 0.0f;
            vv[j] = d < head_size ? to_f32(v[d]) : 0.0f;
        }
        float s = 0.0f;
        for (int j = 0; j < per_lane; j++) s += q[j] * kk[j];
        s = warp_sum(s);
        const float m2 = fmaxf(m, s), corr = __expf(m - m2), p = __expf(s - m2);
        for (int j = 0; j < per_lane; j++) acc[j] = acc[j] * corr + p * vv[j];
        l = l * corr + p;
        m = m2;
    }
    __shared__ float sm[ATT_WARPS], sl[ATT_WARPS];
    __shared__ float sacc[ATT_WARPS][32 * MAX_D_PER_LANE];
    if (lane == 0) {
        sm[warp] = m;
        sl[warp] = l;
    }
    for (int j = 0; j < per_lane; j++) sacc[warp][lane + 32 * j] = acc[j];
    __syncthreads();
    if (warp == 0) {
        float M = -INFINITY;
        for (int w = 0; w < ATT_WARPS; w++) M = fmaxf(M, sm[w]);
        float L = 0.0f;
        for (int w = 0; w < ATT_WARPS; w++) L += sm[w] == -INFINITY ? 0.0f : sl[w] * __expf(sm[w] - M);
        for (int j = 0; j < per_lane; j++) {
            const int d = lane + 32 * j;
            if (d >= head_size) continue;
            float o = 0.0f;
            for (int w = 0; w < ATT_WARPS; w++)
                if (sm[w] != -INFINITY) o += sacc[w][d] * __expf(sm[w] - M);
            part[2 + d] = o; /* unnormalised: sum of p·v at max M */
        }
        if (lane == 0) {
            part[0] = M;
            part[1] = L;
        }
    }
}

template <typename T>
__global__ void attention_combine_kernel(T *out, const float *ws, int n_heads, int head_size,
                                         int n_splits) {
    const int t = blockIdx.x, h = blockIdx.y;
    const float *parts = ws + ((size_t)t * n_heads + h) * n_splits * (head_size + 2);
    float M = -INFINITY;
    for (int s = 0; s < n_splits; s++) M = fmaxf(M, parts[(size_t)s * (head_size + 2)]);
    float L = 0.0f;
    for (int s = 0; s < n_splits; s++) {
        const float m = parts[(size_t)s * (head_size + 2)];
        if (m != -INFINITY) L += parts[(size_t)s * (head_size + 2) + 1] * __expf(m - M);
    }
    for (int d = threadIdx.x; d < head_size; d += blockDim.x) {
        float o = 0.0f;
        for (int s = 0; s < n_splits; s++) {
            const float m = parts[(size_t)s * (head_size + 2)];
            if (m != -INFINITY) o += parts[(size_t)s * (head_size + 2) + 2 + d] * __expf(m - M);
        }
        out[(size_t)t * n_heads * head_size + (size_t)h * head_size + d] = from_f32<T>(o / L);
    }
}

template <typename T>
__global__ void swiglu_kernel(T *out, const T *gate_up, int dim, size_t n) {
    for (size_t k = blockIdx.x * (size_t)blockDim.x + threadIdx.x; k < n;
         k += (size_t)gridDim.x * blockDim.x) {
        const size_t t = k / dim, i = k % dim;
        const float g = to_f32(gate_up[t * 2 * dim + i]), u = to_f32(gate_up[t * 2 * dim + dim + i]);
        out[k] = from_f32<T>(g / (1.0f + __expf(-g)) * u);
    }
}

__global__ void gather_rows_kernel(float *out, const float *x, const int32_t *rows, int dim) {
    const float *src = x + (size_t)rows[blockIdx.x] * dim;
    for (int i = threadIdx.x; i < dim; i += blockDim.x) out[(size_t)blockIdx.x * dim + i] = src[i];
}

template <typename T>
__global__ void residual_add_kernel(float *h, const T *x, size_t n) {
    for (size_t k = blockIdx.x * (size_t)blockDim.x + threadIdx.x; k < n;
         k += (size_t)gridDim.x * blockDim.x)
        h[k] += to_f32(x[k]);
}

/* ---- C launchers: a typed body each, dispatched on the dtype ---------------------------------- */

template <typename T>
static nopad_status embed_t(void *out, const int32_t *tokens, const int32_t *positions, int n,
                            int vocab, int n_pos, const void *word, const void *pos, int dim,
                            cudaStream_t s) {
    embed_tokens_kernel<T><<<n, 256, 0, s>>>((float *)out, tokens, positions, vocab, n_pos,
                                             (const T *)word, (const T *)pos, dim);
    return launch_status("embed_tokens");
}

extern "C" nopad_status cuda_dec_embed_tokens(nopad_dtype dtype, float *out, const int32_t *tokens,
                                              const int32_t *positions, int32_t n_tokens,
                                              int32_t vocab, int32_t n_positions, const void *word,
                                              const void *pos, int32_t dim, void *stream) {
    cudaStream_t s = (cudaStream_t)stream;
    if (n_tokens == 0) return NOPAD_OK;
    DISPATCH_DTYPE(dtype, embed_t<__half>(out, tokens, positions, n_tokens, vocab, n_positions, word, pos, dim, s),
                   embed_t<__nv_bfloat16>(out, tokens, positions, n_tokens, vocab, n_positions, word, pos, dim, s));
}

template <typename T>
static nopad_status norm_t(void *out, const float *x, const void *w, const void *b, float eps,
                           int n, int dim, int rms, cudaStream_t s) {
    norm_kernel<T><<<n, 256, 0, s>>>((T *)out, x, (const T *)w, (const T *)b, eps, dim, rms);
    return launch_status("norm");
}

extern "C" nopad_status cuda_dec_norm(nopad_dtype dtype, void *out, const float *x, const void *w,
                                      const void *b, float eps, int32_t n_tokens, int32_t dim,
                                      int rms, void *stream) {
    cudaStream_t s = (cudaStream_t)stream;
    if (n_tokens == 0) return NOPAD_OK;
    DISPATCH_DTYPE(dtype, norm_t<__half>(out, x, w, b, eps, n_tokens, dim, rms, s),
                   norm_t<__nv_bfloat16>(out, x, w, b, eps, n_tokens, dim, rms, s));
}

template <typename T>
static nopad_status rope_t(void *qkv, const int32_t *positions, int n, int n_heads, int n_kv_heads,
                           int head_size, const float *inv_freq, cudaStream_t s) {
    rope_kernel<T><<<n, 256, 0, s>>>((T *)qkv, positions, n_heads + n_kv_heads,
                                     n_heads + 2 * n_kv_heads, head_size, inv_freq);
    return launch_status("rope");
}

extern "C" nopad_status cuda_dec_rope(nopad_dtype dtype, void *qkv, const int32_t *positions,
                                      int32_t n_tokens, int32_t n_heads, int32_t n_kv_heads,
                                      int32_t head_size, const float *inv_freq, void *stream) {
    cudaStream_t s = (cudaStream_t)stream;
    if (n_tokens == 0) return NOPAD_OK;
    DISPATCH_DTYPE(dtype, rope_t<__half>(qkv, positions, n_tokens, n_heads, n_kv_heads, head_size, inv_freq, s),
                   rope_t<__nv_bfloat16>(qkv, positions, n_tokens, n_heads, n_kv_heads, head_size, inv_freq, s));
}

template <typename T>
static nopad_status kv_store_t(void *k_cache, void *v_cache, const void *qkv, const int32_t *slots,
                               int n, int n_heads, int n_kv_heads, int head_size, cudaStream_t s) {
    kv_store_kernel<T><<<n, 256, 0, s>>>((T *)k_cache, (T *)v_cache, (const T *)qkv, slots, n_heads,
                                         n_kv_heads, head_size);
    return launch_status("kv_store");
}

extern "C" nopad_status cuda_dec_kv_store(nopad_dtype dtype, void *k_cache, void *v_cache,
                                          const void *qkv, const int32_t *slots, int32_t n_tokens,
                                          int32_t n_heads, int32_t n_kv_heads, int32_t head_size,
                                          void *stream) {
    cudaStream_t s = (cudaStream_t)stream;
    if (n_tokens == 0) return NOPAD_OK;
    DISPATCH_DTYPE(dtype, kv_store_t<__half>(k_cache, v_cache, qkv, slots, n_tokens, n_heads, n_kv_heads, head_size, s),
                   kv_store_t<__nv_bfloat16>(k_cache, v_cache, qkv, slots, n_tokens, n_heads, n_kv_heads, head_size, s));
}

static int attention_splits(const nopad_kv_batch *kv) {
    return (kv->max_k + SPLIT_KEYS - 1) / SPLIT_KEYS > 0 ? (kv->max_k + SPLIT_KEYS - 1) / SPLIT_KEYS : 1;
}

extern "C" size_t cuda_dec_attention_workspace(const nopad_kv_batch *kv, int32_t n_heads,
                                               int32_t head_size) {
    return (size_t)kv->n_tokens * n_heads * attention_splits(kv) * (head_size + 2) * sizeof(float);
}

template <typename T>
static nopad_status attention_t(void *out, const void *qkv, const void *k_cache,
                                const void *v_cache, const nopad_kv_batch *kv, int n_heads,
                                int n_kv_heads, int head_size, float scale, float *ws,
                                cudaStream_t s) {
    const int splits = attention_splits(kv);
    dim3 grid((unsigned)kv->n_tokens, (unsigned)n_heads, (unsigned)splits);
    attention_split_kernel<T><<<grid, 32 * ATT_WARPS, 0, s>>>(
        ws, (const T *)qkv, (const T *)k_cache, (const T *)v_cache, kv->cu_q, kv->seqlen_k,
        kv->block_table, kv->n_seqs, kv->max_blocks, kv->block_size, n_heads, n_kv_heads,
        head_size, scale);
    nopad_status st = launch_status("attention_split");
    if (st != NOPAD_OK) return st;
    attention_combine_kernel<T><<<dim3((unsigned)kv->n_tokens, (unsigned)n_heads), 64, 0, s>>>(
        (T *)out, ws, n_heads, head_size, splits);
    return launch_status("attention_combine");
}

extern "C" nopad_status cuda_dec_attention_paged(nopad_dtype dtype, void *out, const void *qkv,
                                                 const void *k_cache, const void *v_cache,
                                                 const nopad_kv_batch *kv, int32_t n_heads,
                                                 int32_t n_kv_heads, int32_t head_size,
                                                 float scale, float *workspace, void *stream) {
    cudaStream_t s = (cudaStream_t)stream;
    if (kv->n_tokens == 0) return NOPAD_OK;
    if (head_size > 32 * MAX_D_PER_LANE || n_heads % n_kv_heads != 0)
        return nopad_set_error(NOPAD_ERR_UNSUPPORTED,
                               "cuda attention_paged: head size %d (at most %d) or %d heads over %d "
                               "KV heads",
                               head_size, 32 * MAX_D_PER_LANE, n_heads, n_kv_heads);
    DISPATCH_DTYPE(dtype, attention_t<__half>(out, qkv, k_cache, v_cache, kv, n_heads, n_kv_heads, head_size, scale, workspace, s),
                   attention_t<__nv_bfloat16>(out, qkv, k_cache, v_cache, kv, n_heads, n_kv_heads, head_size, scale, workspace, s));
}

template <typename T>
static nopad_status swiglu_t(void *out, const void *gate_up, int n, int dim, cudaStream_t s) {
    const size_t total = (size_t)n * dim;
    swiglu_kernel<T><<<grid_for(total, 256), 256, 0, s>>>((T *)out, (const T *)gate_up, dim, total);
    return launch_status("swiglu");
}

extern "C" nopad_status cuda_dec_swiglu(nopad_dtype dtype, void *out, const void *gate_up,
                                        int32_t n_tokens, int32_t dim, void *stream) {
    cudaStream_t s = (cudaStream_t)stream;
    if (n_tokens == 0) return NOPAD_OK;
    DISPATCH_DTYPE(dtype, swiglu_t<__half>(out, gate_up, n_tokens, dim, s),
                   swiglu_t<__nv_bfloat16>(out, gate_up, n_tokens, dim, s));
}

extern "C" nopad_status cuda_dec_gather_rows(float *out, const float *x, const int32_t *rows,
                                             int32_t n, int32_t dim, void *stream) {
    cudaStream_t s = (cudaStream_t)stream;
    if (n == 0) return NOPAD_OK;
    gather_rows_kernel<<<n, 256, 0, s>>>(out, x, rows, dim);
    return launch_status("gather_rows");
}

template <typename T>
static nopad_status residual_t(float *h, const void *x, size_t n, cudaStream_t s) {
    residual_add_kernel<T><<<grid_for(n, 256), 256, 0, s>>>(h, (const T *)x, n);
    return launch_status("residual_add");
}

extern "C" nopad_status cuda_dec_residual_add(nopad_dtype dtype, float *h, const void *x,
                                              int32_t n_tokens, int32_t dim, void *stream) {
    cudaStream_t s = (cudaStream_t)stream;
    const size_t n = (size_t)n_tokens * dim;
    if (n == 0) return NOPAD_OK;
    DISPATCH_DTYPE(dtype, residual_t<__half>(h, x, n, s), residual_t<__nv_bfloat16>(h, x, n, s));
}
