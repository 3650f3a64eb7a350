/* CUDA: the decoder ops (fp16 / bf16 storage, fp32 arithmetic), each tested against the CPU op:
 * token embedding, LayerNorm / RMSNorm into a new buffer, rotary embeddings, the paged KV store,
 * causal attention over paged keys and values (below), SwiGLU and the row gather. */
#include "backend/cuda/common.cuh"
#include "backend/cuda/decoder_ops.h"

#include <type_traits>

#include "backend/cuda/attention/attention.h"

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

/* ---- causal attention over the paged cache ---------------------------------------------------
 *
 * One CTA takes a group of query rows of one sequence (R consecutive new tokens; 1 for a decode
 * step) and one KV head, with the G query heads that read it, so every key and value row is read
 * from memory once for all R·G query vectors. Keys come in tiles of PA_KEYS through shared
 * memory, the next tile's copy (cp.async) in flight while the current one is used:
 *   scores  s[q][k] = q·k·scale, masked past the row's position (causal) and the CTA's range;
 *   softmax a warp per query vector: the tile's max, the running (max, sum) and the rescale;
 *   values  acc[q][d] = acc·rescale + Σ_k p[q][k]·v[k][d], a thread per (q, 8 of d), threads
 *           left over splitting the keys and adding up at the end.
 * When few CTAs would face long histories (decode at small batch), blockIdx.z splits the keys
 * (flash-decoding): each split writes its (max, sum, unnormalised acc) to the workspace and
 * attention_combine_kernel merges them. Arithmetic is float32. */
enum {
    PA_THREADS = 128,
    PA_KEYS = 32,         /* keys per tile (a warp's width: the softmax reads one key per lane) */
    PA_PAD = 8,           /* elements of padding per shared K/V row: no bank conflicts */
    PA_QD = 4096,         /* query vectors x head size a CTA aims at (R is chosen for it) */
    PA_MAX_UNITS = 8,     /* (query vector, 8 of d) pairs a thread accumulates at most */
};

template <typename T>
struct paged_args {
    T *out;                  /* [T, n_heads·D] */
    float *ws;               /* [T, n_heads, splits, D + 2] when splits > 1 */
    const T *qkv, *k_cache, *v_cache;
    const int32_t *cu_q, *seqlen_k, *block_table;
    int n_seqs, max_blocks, block_size, n_heads, n_kv_heads, head_size;
    int rows;                /* R: query rows per CTA */
    int tiles_per_split;
    float scale;
};

/* a·b of 8 elements held as 16 bytes each */
template <typename T>
__device__ __forceinline__ float dot8(uint4 a, uint4 b) {
    const T *x = reinterpret_cast<const T *>(&a), *y = reinterpret_cast<const T *>(&b);
    float s = 0.0f;
#pragma unroll
    for (int j = 0; j < 8; j++) s += to_f32(x[j]) * to_f32(y[j]);
    return s;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

template <typename T>
__global__ void __launch_bounds__(PA_THREADS) paged_attention_kernel(paged_args<T> a) {
    extern __shared__ __align__(16) unsigned char smem[];
    const int t0 = blockIdx.x, kvh = blockIdx.y, split = blockIdx.z, n_splits = gridDim.z;
    const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
    const int b = sequence_of(a.cu_q, a.n_seqs, t0);
    const int q0 = a.cu_q[b], n_new = a.cu_q[b + 1] - q0;
    if ((t0 - q0) % a.rows != 0) return; /* not the first row of a group: another CTA's */
    const int G = a.n_heads / a.n_kv_heads, D = a.head_size, DV = D / 8, LD = D + PA_PAD;
    const int QV = a.rows * G;                    /* query vectors the shared memory holds */
    const int n_rows = min(a.rows, q0 + n_new - t0);
    const int nq = n_rows * G;                    /* query vectors of this CTA */
    const int pos0 = a.seqlen_k[b] - n_new + (t0 - q0); /* the first row's position */
    const int key_begin = split * a.tiles_per_split * PA_KEYS;
    const int key_end = min((split + 1) * a.tiles_per_split * PA_KEYS, pos0 + n_rows);

    T *q_s = reinterpret_cast<T *>(smem);                      /* [QV][D] */
    T *k_s = q_s + (size_t)QV * D;                             /* [2][PA_KEYS][LD] */
    T *v_s = k_s + 2 * PA_KEYS * LD;                           /* [2][PA_KEYS][LD] */
    float *s_s = reinterpret_cast<float *>(v_s + 2 * PA_KEYS * LD); /* [QV][PA_KEYS] */
    float *m_s = s_s + QV * PA_KEYS, *l_s = m_s + QV, *c_s = l_s + QV; /* [QV] each */
    float *red = c_s + QV;                                     /* [PA_THREADS][8] */

    const size_t row_stride = (size_t)(a.n_heads + 2 * a.n_kv_heads) * D;
    if (key_begin >= key_end) { /* this split lies past every row's keys: an empty partial */
        for (int i = tid; i < nq; i += PA_THREADS) {
            const int r = i / G, h = kvh * G + i % G;
            float *part = a.ws + (((size_t)(t0 + r) * a.n_heads + h) * n_splits + split) * (D + 2);
            part[0] = -INFINITY;
            part[1] = 0.0f;
        }
        return;
    }
    const int32_t *blocks = a.block_table + (size_t)b * a.max_blocks;
    const int bs = a.block_size;
    auto load_tile = [&](int key0, int buf) {
        T *kd = k_s + buf * PA_KEYS * LD, *vd = v_s + buf * PA_KEYS * LD;
        for (int i = tid; i < PA_KEYS * DV; i += PA_THREADS) {
            const int k = i / DV, c = i % DV, j = key0 + k;
            const bool valid = j < key_end;
            const size_t slot = valid ? (size_t)blocks[j / bs] * bs + j % bs : 0;
            const size_t off = (slot * a.n_kv_heads + kvh) * D + c * 8;
            cp_async16(kd + k * LD + c * 8, a.k_cache + off, valid);
            cp_async16(vd + k * LD + c * 8, a.v_cache + off, valid);
        }
        cp_async_commit();
    };
    load_tile(key_begin, 0);
    for (int i = tid; i < QV * DV; i += PA_THREADS) {
        const int qi = i / DV, c = i % DV;
        uint4 v = make_uint4(0, 0, 0, 0);
        if (qi < nq) {
            const int r = qi / G, h = kvh * G + qi % G;
            v = *reinterpret_cast<const uint4 *>(a.qkv + (size_t)(t0 + r) * row_stride + (size_t)h * D + c * 8);
        }
        *reinterpret_cast<uint4 *>(q_s + (size_t)qi * D + c * 8) = v;
    }
    for (int i = tid; i < QV; i += PA_THREADS) {
        m_s[i] = -INFINITY;
        l_s[i] = 0.0f;
    }

    /* the (query vector, 8 of d) units of the value phase: each thread a few, or, when there are
     * fewer units than threads, n_ksub threads a unit, each summing every n_ksub-th key */
    const int units = QV * DV;
    const int n_ksub = units >= PA_THREADS ? 1 : PA_THREADS / units;
    const int ksub = units >= PA_THREADS ? 0 : tid / units;
    const bool active = tid < units * n_ksub;
    float acc[PA_MAX_UNITS][8];
#pragma unroll
    for (int u = 0; u < PA_MAX_UNITS; u++)
#pragma unroll
        for (int e = 0; e < 8; e++) acc[u][e] = 0.0f;

    const int n_tiles = (key_end - key_begin + PA_KEYS - 1) / PA_KEYS;
    for (int it = 0; it < n_tiles; it++) {
        const int buf = it & 1, key0 = key_begin + it * PA_KEYS;
        if (it + 1 < n_tiles) {
            load_tile(key0 + PA_KEYS, buf ^ 1);
            cp_async_wait_group<1>();
        } else {
            cp_async_wait_group<0>();
        }
        __syncthreads();
        const T *kb = k_s + buf * PA_KEYS * LD, *vb = v_s + buf * PA_KEYS * LD;
        { /* scores: a key per thread, query vectors strided over the thread's group */
            const int k = tid % PA_KEYS, j = key0 + k;
            const T *kr = kb + k * LD;
            for (int qi = tid / PA_KEYS; qi < QV; qi += PA_THREADS / PA_KEYS) {
                float s = -INFINITY;
                if (qi < nq && j < key_end && j <= pos0 + qi / G) {
                    float d = 0.0f;
                    for (int c = 0; c < DV; c++)
                        d += dot8<T>(*reinterpret_cast<const uint4 *>(kr + c * 8),
                                     *reinterpret_cast<const uint4 *>(q_s + (size_t)qi * D + c * 8));
                    s = d * a.scale;
                }
                s_s[qi * PA_KEYS + k] = s;
            }
        }
        __syncthreads();
        for (int qi = warp; qi < nq; qi += PA_THREADS / 32) { /* online softmax, a warp each */
            const float s = s_s[qi * PA_KEYS + lane];
            const float m_old = m_s[qi], m_new = fmaxf(m_old, warp_max(s));
            const float p = m_new == -INFINITY ? 0.0f : __expf(s - m_new);
            const float corr = m_new == -INFINITY ? 1.0f : __expf(m_old - m_new);
            s_s[qi * PA_KEYS + lane] = p;
            const float sum = warp_sum(p);
            if (lane == 0) {
                m_s[qi] = m_new;
                l_s[qi] = l_s[qi] * corr + sum;
                c_s[qi] = corr;
            }
        }
        __syncthreads();
        if (active) {
#pragma unroll
            for (int u = 0; u < PA_MAX_UNITS; u++) {
                const int unit = n_ksub > 1 ? tid % units : tid + u * PA_THREADS;
                if ((n_ksub > 1 && u > 0) || unit >= units) break;
                const int qi = unit / DV, c = unit % DV;
                if (qi >= nq) continue;
                const float corr = c_s[qi];
#pragma unroll
                for (int e = 0; e < 8; e++) acc[u][e] *= corr;
                for (int k = ksub; k < PA_KEYS; k += n_ksub) {
                    const float p = s_s[qi * PA_KEYS + k];
                    if (p == 0.0f) continue;
                    const uint4 raw = *reinterpret_cast<const uint4 *>(vb + k * LD + c * 8);
                    const T *v = reinterpret_cast<const T *>(&raw);
#pragma unroll
                    for (int e = 0; e < 8; e++) acc[u][e] += p * to_f32(v[e]);
                }
            }
        }
        __syncthreads(); /* the next tile's copy goes into the buffer just read */
    }

    if (n_ksub > 1) { /* add up the key subsets of each unit */
        if (active)
#pragma unroll
            for (int e = 0; e < 8; e++) red[tid * 8 + e] = acc[0][e];
        __syncthreads();
        if (tid < units)
            for (int k = 1; k < n_ksub; k++)
#pragma unroll
                for (int e = 0; e < 8; e++) acc[0][e] += red[(tid + k * units) * 8 + e];
    }
    const int n_own = n_ksub > 1 ? (tid < units ? 1 : 0) : PA_MAX_UNITS;
#pragma unroll
    for (int u = 0; u < PA_MAX_UNITS; u++) {
        const int unit = n_ksub > 1 ? tid : tid + u * PA_THREADS;
        if (u >= n_own || unit >= units) break;
        const int qi = unit / DV, c = unit % DV;
        if (qi >= nq) continue;
        const int r = qi / G, h = kvh * G + qi % G;
        const size_t t = (size_t)t0 + r;
        if (n_splits == 1) {
            const float inv = 1.0f / l_s[qi];
            float o[8];
#pragma unroll
            for (int e = 0; e < 8; e++) o[e] = acc[u][e] * inv;
            store_vec<T, 8>(a.out + t * a.n_heads * D + (size_t)h * D + c * 8, o);
        } else {
            float *part = a.ws + ((t * a.n_heads + h) * n_splits + split) * (D + 2);
#pragma unroll
            for (int e = 0; e < 8; e++) part[2 + c * 8 + e] = acc[u][e];
            if (c == 0) {
                part[0] = m_s[qi];
                part[1] = l_s[qi];
            }
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

/* The launch shape of the paged attention for kv: rows per CTA, key splits, shared memory. */
typedef struct paged_plan {
    int rows, splits, tiles_per_split;
    size_t smem;
} paged_plan;

static paged_plan plan_paged(const nopad_kv_batch *kv, int n_heads, int n_kv_heads, int head_size,
                             size_t elem) {
    paged_plan p;
    const int G = n_heads / n_kv_heads;
    p.rows = PA_QD / head_size / G;
    if (p.rows > kv->max_q) p.rows = kv->max_q;
    if (p.rows < 1) p.rows = 1;
    const int qv = p.rows * G;
    /* CTAs that hold rows; the keys are split until there are about 4 a SM */
    const long groups = kv->max_q <= 1 ? kv->n_seqs
                                        : (long)kv->n_seqs * ((kv->max_q + p.rows - 1) / p.rows);
    const long ctas = (groups < kv->n_tokens ? groups : kv->n_tokens) * (long)n_kv_heads;
    const int n_tiles = kv->max_k > 0 ? (kv->max_k + PA_KEYS - 1) / PA_KEYS : 1;
    const long target = 4L * cuda_sm_count();
    long want = (target + ctas - 1) / ctas;
    if (want > n_tiles) want = n_tiles;
    if (want < 1) want = 1;
    p.tiles_per_split = (int)((n_tiles + want - 1) / want);
    p.splits = (n_tiles + p.tiles_per_split - 1) / p.tiles_per_split;
    p.smem = (size_t)qv * head_size * elem + 4 * (size_t)PA_KEYS * (head_size + PA_PAD) * elem +
             ((size_t)qv * PA_KEYS + 3 * (size_t)qv + PA_THREADS * 8) * sizeof(float);
    return p;
}

/* Whether the prompts-only path takes this step: the fused causal attention of the encoder over the
 * new tokens (tensor cores), for head sizes it has. */
static bool use_prefill_path(const nopad_kv_batch *kv, int head_size) {
    return kv->no_history && (head_size == 32 || head_size == 64 || head_size == 128);
}

extern "C" void cuda_dec_attention_workspace(const nopad_kv_batch *kv, nopad_dtype dtype,
                                             int32_t n_heads, int32_t n_kv_heads, int32_t head_size,
                                             size_t *split_bytes, size_t *expand_bytes) {
    const size_t elem = dtype == NOPAD_DTYPE_F32 ? 4 : 2;
    *split_bytes = 0;
    *expand_bytes = 0;
    if (kv->n_tokens <= 0) return;
    if (use_prefill_path(kv, head_size)) {
        if (n_heads != n_kv_heads) *expand_bytes = (size_t)kv->n_tokens * 3 * n_heads * head_size * elem;
        return;
    }
    const paged_plan p = plan_paged(kv, n_heads, n_kv_heads, head_size, elem);
    if (p.splits > 1)
        *split_bytes = (size_t)kv->n_tokens * n_heads * p.splits * (head_size + 2) * sizeof(float);
}

/* [T, H + 2·KVH, D] -> [T, 3, H, D]: each query head gets its own copy of its K and V head, the
 * layout of the encoder's attention. */
template <typename T>
__global__ void expand_kv_heads_kernel(T *out, const T *qkv, int n_heads, int n_kv_heads, int head_size) {
    const int t = blockIdx.x, G = n_heads / n_kv_heads, DV = head_size / 8;
    const T *src = qkv + (size_t)t * (n_heads + 2 * n_kv_heads) * head_size;
    T *dst = out + (size_t)t * 3 * n_heads * head_size;
    for (int i = threadIdx.x; i < 3 * n_heads * DV; i += blockDim.x) {
        const int part = i / (n_heads * DV), h = (i / DV) % n_heads, c = i % DV;
        const int from = part == 0 ? h : n_heads + (part - 1) * n_kv_heads + h / G;
        *reinterpret_cast<uint4 *>(dst + (size_t)(part * n_heads + h) * head_size + c * 8) =
            *reinterpret_cast<const uint4 *>(src + (size_t)from * head_size + c * 8);
    }
}

template <typename T>
static nopad_status attention_t(void *out, const void *qkv, const void *k_cache,
                                const void *v_cache, const nopad_kv_batch *kv, int n_heads,
                                int n_kv_heads, int head_size, float scale,
                                const cuda_dec_attention_ws *ws, cudaStream_t s) {
    if (use_prefill_path(kv, head_size)) {
        const void *packed = qkv;
        if (n_heads != n_kv_heads) {
            expand_kv_heads_kernel<T><<<kv->n_tokens, 128, 0, s>>>((T *)ws->expand, (const T *)qkv,
                                                                   n_heads, n_kv_heads, head_size);
            nopad_status st = launch_status("expand_kv_heads");
            if (st != NOPAD_OK) return st;
            packed = ws->expand;
        }
        return cuda_attention(std::is_same<T, __half>::value ? NOPAD_DTYPE_F16 : NOPAD_DTYPE_BF16,
                              out, packed, kv->cu_q, kv->n_seqs, kv->n_tokens, kv->max_q, n_heads,
                              head_size, scale, 1, ws->attention, s);
    }
    const paged_plan p = plan_paged(kv, n_heads, n_kv_heads, head_size, sizeof(T));
    static bool big_smem_set = false; /* per instantiation: the opt-in beyond 48 KB, once */
    if (!big_smem_set) {
        cudaFuncSetAttribute(paged_attention_kernel<T>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             160 * 1024);
        big_smem_set = true;
    }
    paged_args<T> a;
    a.out = (T *)out;
    a.ws = ws->split;
    a.qkv = (const T *)qkv;
    a.k_cache = (const T *)k_cache;
    a.v_cache = (const T *)v_cache;
    a.cu_q = kv->cu_q;
    a.seqlen_k = kv->seqlen_k;
    a.block_table = kv->block_table;
    a.n_seqs = kv->n_seqs;
    a.max_blocks = kv->max_blocks;
    a.block_size = kv->block_size;
    a.n_heads = n_heads;
    a.n_kv_heads = n_kv_heads;
    a.head_size = head_size;
    a.rows = p.rows;
    a.tiles_per_split = p.tiles_per_split;
    a.scale = scale;
    dim3 grid((unsigned)kv->n_tokens, (unsigned)n_kv_heads, (unsigned)p.splits);
    paged_attention_kernel<T><<<grid, PA_THREADS, p.smem, s>>>(a);
    nopad_status st = launch_status("attention_paged");
    if (st != NOPAD_OK || p.splits == 1) return st;
    attention_combine_kernel<T><<<dim3((unsigned)kv->n_tokens, (unsigned)n_heads), 64, 0, s>>>(
        (T *)out, ws->split, n_heads, head_size, p.splits);
    return launch_status("attention_combine");
}

extern "C" nopad_status cuda_dec_attention_paged(nopad_dtype dtype, void *out, const void *qkv,
                                                 const void *k_cache, const void *v_cache,
                                                 const nopad_kv_batch *kv, int32_t n_heads,
                                                 int32_t n_kv_heads, int32_t head_size,
                                                 float scale, const cuda_dec_attention_ws *workspace,
                                                 void *stream) {
    cudaStream_t s = (cudaStream_t)stream;
    if (kv->n_tokens == 0) return NOPAD_OK;
    if (head_size % 8 != 0 || head_size > 256 || n_kv_heads < 1 || n_heads % n_kv_heads != 0 ||
        (n_heads / n_kv_heads) * head_size > PA_MAX_UNITS * 8 * PA_THREADS)
        return nopad_set_error(NOPAD_ERR_UNSUPPORTED,
                               "cuda attention_paged: head size %d (a multiple of 8, at most 256), "
                               "%d heads over %d KV heads (query heads per KV head x head size at "
                               "most %d)",
                               head_size, n_heads, n_kv_heads, PA_MAX_UNITS * 8 * PA_THREADS);
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
