/* CUDA: the backward of LayerNorm (the encoder's fused LN(x + bias + residual)) and of the
 * embedding (word + position + type, then LayerNorm), on packed [T, dim] rows in fp16 / bf16 with
 * float32 arithmetic.
 *
 * One warp per row, the row in registers as the forward holds it (norm.cuh): the row's mean and
 * 1/std are recomputed from the saved input s (two passes over the registers, as the forward
 * does), then ds = rstd·(g - mean(g) - ŝ·mean(g·ŝ)) with g = dy ⊙ w. Each lane also sums its
 * columns' dw = Σ dy·ŝ, db = Σ dy (and dbias = Σ ds) over the rows of its warp in registers; the
 * warps' sums are added in warp order into the block's float32 partials, and a second kernel
 * (cuda_train_column_finish) adds the blocks' partials in block order: the parameter gradients do
 * not depend on scheduling. Blocks take rows in a fixed stride (row = warp + k·warps of the grid),
 * and the grid is capped at a few blocks a SM, so the partials stay a few MB. Rows wider than a
 * warp's registers hold (above 1024, up to 4096) take a block each, the same way.
 *
 * The embedding's backward recomputes s from the tables, writes ds over dy and scatter-adds the
 * float32 ds (before rounding) into the float32 tables with atomics; the rows of token types 0 and
 * 1 (every token of a BERT batch) are first summed per block in shared memory, so the type table
 * gets one atomic per block and column rather than one per token. */
#include "backend/cuda/norm.cuh"
#include "backend/cuda/train/train_kernels.h"

enum { NB_WARPS = 4, NB_BLOCKS_PER_SM = 2 };
/* The widest row a warp holds in registers: 32 columns a lane. */
enum { NARROW_MAX_DIM = 1024 };
/* token types summed in shared memory before their atomics (BERT has 2) */
enum { SHARED_TYPES = 2 };

static bool aligned16(const void *p) { return ((uintptr_t)p & 15) == 0; }

/* What the kernel reads and writes; the embedding's fields are unused by the LayerNorm. */
template <typename T>
struct norm_backward_args {
    T *ds;              /* [T, dim] (may alias dy; the embedding: == dy) */
    const T *dy;        /* [T, dim] */
    const T *s;         /* [T, dim] LayerNorm input (LayerNorm only) */
    const T *w;         /* [dim] LayerNorm weight */
    float *partial32;   /* [gridDim.x, n_vec, dim] */
    int with_dbias;     /* LayerNorm: a third partial vector, Σ ds */
    float eps;
    int n_tokens, dim;
    /* embedding */
    const int32_t *tokens, *types, *cu_seqlens;
    int n_seqs, position_offset;
    const T *word, *pos, *type; /* [V, dim], [P, dim] or NULL, [TV, dim] or NULL */
    float *d_word32, *d_pos32, *d_type32;
    int vec_atomics;    /* the float32 tables are 16-byte aligned: float4 atomics */
};

/* dst[0 .. VEC) += v[0 .. VEC) with float32 atomics (float4 ones on sm_90 when allowed). */
template <int VEC>
static __device__ __forceinline__ void atomic_add_vec(float *dst, const float *v, bool vec4) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    if (VEC == 8 && vec4) {
        atomicAdd(reinterpret_cast<float4 *>(dst), make_float4(v[0], v[1], v[2], v[3]));
        atomicAdd(reinterpret_cast<float4 *>(dst + 4), make_float4(v[4], v[5], v[6], v[7]));
        return;
    }
#endif
#pragma unroll
    for (int j = 0; j < VEC; j++) atomicAdd(dst + j, v[j]);
}

/* Lane `lane` holds columns (it·32 + lane)·VEC + j of a row (it < ITERS, j < VEC): N = ITERS·VEC
 * registers a vector; columns past dim hold 0. */
template <typename T, int VEC, int ITERS, bool EMBED>
__global__ void __launch_bounds__(NB_WARPS * 32)
norm_backward_kernel(norm_backward_args<T> a) {
    constexpr int N = ITERS * VEC;
    __shared__ float red[NB_WARPS][32 * N];
    __shared__ float type_sum[EMBED ? SHARED_TYPES : 1][EMBED ? 32 * N : 1];
    __shared__ int type_seen[SHARED_TYPES];
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, dim = a.dim;
    if (EMBED) {
        for (int k = threadIdx.x; k < SHARED_TYPES * 32 * N; k += blockDim.x) type_sum[k / (32 * N)][k % (32 * N)] = 0.0f;
        if (threadIdx.x < SHARED_TYPES) type_seen[threadIdx.x] = 0;
        __syncthreads();
    }
    row_share<T, VEC, ITERS> wv;
    wv.load(a.w, dim, lane);
    float acc_w[N], acc_b[N], acc_bias[EMBED ? 1 : N];
#pragma unroll
    for (int k = 0; k < N; k++) acc_w[k] = acc_b[k] = acc_bias[EMBED ? 0 : k] = 0.0f;
    const bool vec4 = a.vec_atomics != 0;

    for (int t = blockIdx.x * NB_WARPS + warp; t < a.n_tokens; t += gridDim.x * NB_WARPS) {
        float sv[N], gv[N]; /* the row of s, then ŝ; of dy, then g, then ds */
        const T *word_row = NULL, *pos_row = NULL, *type_row = NULL;
        int p = 0, ty = 0;
        if (EMBED) {
            const int seq = sequence_of(a.cu_seqlens, a.n_seqs, t);
            p = a.position_offset + t - a.cu_seqlens[seq];
            ty = a.types ? a.types[t] : 0;
            word_row = a.word + (size_t)a.tokens[t] * dim;
            pos_row = a.pos ? a.pos + (size_t)p * dim : NULL;
            type_row = a.type ? a.type + (size_t)ty * dim : NULL;
        }
        const T *dy_row = a.dy + (size_t)t * dim;
#pragma unroll
        for (int it = 0; it < ITERS; it++) {
            const int e0 = (it * 32 + lane) * VEC;
            float *s_part = sv + it * VEC, *g_part = gv + it * VEC;
            if (e0 < dim) {
                load_vec<T, VEC>(g_part, dy_row + e0);
                if (EMBED) {
                    /* the forward's sum, in its order: word + pos, then + type */
                    load_vec<T, VEC>(s_part, word_row + e0);
                    float extra[VEC];
                    if (pos_row) {
                        load_vec<T, VEC>(extra, pos_row + e0);
#pragma unroll
                        for (int j = 0; j < VEC; j++) s_part[j] += extra[j];
                    }
                    if (type_row) {
                        load_vec<T, VEC>(extra, type_row + e0);
#pragma unroll
                        for (int j = 0; j < VEC; j++) s_part[j] += extra[j];
                    }
                } else {
                    load_vec<T, VEC>(s_part, a.s + (size_t)t * dim + e0);
                }
            } else {
#pragma unroll
                for (int j = 0; j < VEC; j++) s_part[j] = g_part[j] = 0.0f;
            }
        }
        float sum = 0.0f;
#pragma unroll
        for (int k = 0; k < N; k++) sum += sv[k];
        const float mean = warp_sum(sum) / (float)dim;
        float sq = 0.0f;
#pragma unroll
        for (int it = 0; it < ITERS; it++)
            if ((it * 32 + lane) * VEC < dim)
#pragma unroll
                for (int j = 0; j < VEC; j++) {
                    const float d = sv[it * VEC + j] - mean;
                    sq += d * d;
                }
        const float rstd = rsqrtf(warp_sum(sq) / (float)dim + a.eps);
        float sum_g = 0.0f, sum_gx = 0.0f;
#pragma unroll
        for (int it = 0; it < ITERS; it++) {
            const bool valid = (it * 32 + lane) * VEC < dim;
#pragma unroll
            for (int j = 0; j < VEC; j++) {
                const int k = it * VEC + j;
                const float xhat = valid ? (sv[k] - mean) * rstd : 0.0f;
                sv[k] = xhat;
                acc_w[k] += gv[k] * xhat;
                acc_b[k] += gv[k];
                gv[k] *= wv[k]; /* 0 past dim: w's share is 0 there */
                sum_g += gv[k];
                sum_gx += gv[k] * xhat;
            }
        }
        const float mean_g = warp_sum(sum_g) / (float)dim, mean_gx = warp_sum(sum_gx) / (float)dim;
#pragma unroll
        for (int k = 0; k < N; k++) {
            gv[k] = rstd * (gv[k] - mean_g - sv[k] * mean_gx);
            if (!EMBED) acc_bias[k] += gv[k];
        }
        T *ds_row = a.ds + (size_t)t * dim;
#pragma unroll
        for (int it = 0; it < ITERS; it++) {
            const int e0 = (it * 32 + lane) * VEC;
            if (e0 >= dim) continue;
            const float *d = gv + it * VEC;
            store_vec<T, VEC>(ds_row + e0, d);
            if (EMBED) {
                atomic_add_vec<VEC>(a.d_word32 + (size_t)a.tokens[t] * dim + e0, d, vec4);
                if (pos_row && a.d_pos32) atomic_add_vec<VEC>(a.d_pos32 + (size_t)p * dim + e0, d, vec4);
                if (type_row && a.d_type32) {
                    if (ty < SHARED_TYPES) {
#pragma unroll
                        for (int j = 0; j < VEC; j++) atomicAdd(&type_sum[ty][e0 + j], d[j]);
                    } else {
                        atomic_add_vec<VEC>(a.d_type32 + (size_t)ty * dim + e0, d, vec4);
                    }
                }
            }
        }
        if (EMBED && type_row && a.d_type32 && ty < SHARED_TYPES && lane == 0) type_seen[ty] = 1;
    }

    /* the block's partial sums: each vector through shared memory, warps added in order */
    const int n_vec = EMBED ? 2 : (a.with_dbias ? 3 : 2);
    for (int v = 0; v < n_vec; v++) {
#pragma unroll
        for (int it = 0; it < ITERS; it++)
#pragma unroll
            for (int j = 0; j < VEC; j++) {
                const int k = it * VEC + j;
                red[warp][(it * 32 + lane) * VEC + j] = v == 0 ? acc_w[k] : v == 1 ? acc_b[k] : acc_bias[EMBED ? 0 : k];
            }
        __syncthreads();
        for (int e = threadIdx.x; e < dim; e += blockDim.x) {
            float total = 0.0f;
#pragma unroll
            for (int w = 0; w < NB_WARPS; w++) total += red[w][e];
            a.partial32[((size_t)blockIdx.x * n_vec + v) * dim + e] = total;
        }
        __syncthreads();
    }
    if (EMBED && a.d_type32) /* the block's sums of the type rows it saw */
        for (int k = threadIdx.x; k < SHARED_TYPES * dim; k += blockDim.x) {
            const int ty = k / dim, e = k % dim;
            if (type_seen[ty]) atomicAdd(a.d_type32 + (size_t)ty * dim + e, type_sum[ty][e]);
        }
}

/* ---- rows wider than a warp's registers hold (dim > 1024): a block a row -------------------------- */

enum { WIDE_THREADS = 256, WIDE_WARPS = WIDE_THREADS / 32 };

/* v[0 .. K) := their sums over the block, in every thread (the warps' sums added in warp order). */
template <int K>
static __device__ __forceinline__ void block_sums(float v[K], float (*red)[WIDE_WARPS]) {
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
#pragma unroll
    for (int k = 0; k < K; k++) v[k] = warp_sum(v[k]);
    if (lane == 0)
#pragma unroll
        for (int k = 0; k < K; k++) red[k][warp] = v[k];
    __syncthreads();
#pragma unroll
    for (int k = 0; k < K; k++) {
        float total = 0.0f;
#pragma unroll
        for (int w = 0; w < WIDE_WARPS; w++) total += red[k][w];
        v[k] = total;
    }
    __syncthreads(); /* red is reused by the next call */
}

/* The same backward with a block a row: thread i holds columns i + k·WIDE_THREADS (k < ITEMS) of
 * each row and sums its columns' gradients over the block's rows, so the block's partials need no
 * combining. Two block-wide reductions a row: Σ s, then Σ (s - mean)², Σ g, Σ g·(s - mean).
 * The embedding's tables all take float32 atomics here. */
template <typename T, int ITEMS, bool EMBED>
__global__ void __launch_bounds__(WIDE_THREADS)
norm_backward_wide_kernel(norm_backward_args<T> a) {
    __shared__ float red[3][WIDE_WARPS];
    const int dim = a.dim;
    float wv[ITEMS], acc_w[ITEMS], acc_b[ITEMS], acc_bias[EMBED ? 1 : ITEMS];
#pragma unroll
    for (int i = 0; i < ITEMS; i++) {
        const int e = threadIdx.x + i * WIDE_THREADS;
        wv[i] = e < dim ? to_f32(a.w[e]) : 0.0f;
        acc_w[i] = acc_b[i] = acc_bias[EMBED ? 0 : i] = 0.0f;
    }
    for (int t = blockIdx.x; t < a.n_tokens; t += gridDim.x) { /* uniform over the block */
        const T *word_row = NULL, *pos_row = NULL, *type_row = NULL;
        int p = 0, ty = 0;
        if (EMBED) {
            const int seq = sequence_of(a.cu_seqlens, a.n_seqs, t);
            p = a.position_offset + t - a.cu_seqlens[seq];
            ty = a.types ? a.types[t] : 0;
            word_row = a.word + (size_t)a.tokens[t] * dim;
            pos_row = a.pos ? a.pos + (size_t)p * dim : NULL;
            type_row = a.type ? a.type + (size_t)ty * dim : NULL;
        }
        float sv[ITEMS], gv[ITEMS]; /* s, then s - mean; dy */
        float r1[1] = {0.0f};
#pragma unroll
        for (int i = 0; i < ITEMS; i++) {
            const int e = threadIdx.x + i * WIDE_THREADS;
            sv[i] = gv[i] = 0.0f;
            if (e < dim) {
                gv[i] = to_f32(a.dy[(size_t)t * dim + e]);
                if (EMBED) {
                    sv[i] = to_f32(word_row[e]);
                    if (pos_row) sv[i] += to_f32(pos_row[e]);
                    if (type_row) sv[i] += to_f32(type_row[e]);
                } else {
                    sv[i] = to_f32(a.s[(size_t)t * dim + e]);
                }
            }
            r1[0] += sv[i];
        }
        block_sums<1>(r1, red);
        const float mean = r1[0] / (float)dim;
        float r3[3] = {0.0f, 0.0f, 0.0f}; /* Σ d², Σ g, Σ g·d with d = s - mean, g = dy·w */
#pragma unroll
        for (int i = 0; i < ITEMS; i++) {
            if (threadIdx.x + i * WIDE_THREADS >= dim) continue;
            const float d = sv[i] - mean, g = gv[i] * wv[i];
            sv[i] = d;
            r3[0] += d * d;
            r3[1] += g;
            r3[2] += g * d;
        }
        block_sums<3>(r3, red);
        const float rstd = rsqrtf(r3[0] / (float)dim + a.eps);
        const float mean_g = r3[1] / (float)dim, mean_gx = r3[2] * rstd / (float)dim;
#pragma unroll
        for (int i = 0; i < ITEMS; i++) {
            const int e = threadIdx.x + i * WIDE_THREADS;
            if (e >= dim) continue;
            const float xhat = sv[i] * rstd;
            const float ds = rstd * (gv[i] * wv[i] - mean_g - xhat * mean_gx);
            acc_w[i] += gv[i] * xhat;
            acc_b[i] += gv[i];
            a.ds[(size_t)t * dim + e] = from_f32<T>(ds);
            if (!EMBED) {
                acc_bias[i] += ds;
            } else {
                atomicAdd(a.d_word32 + (size_t)a.tokens[t] * dim + e, ds);
                if (pos_row && a.d_pos32) atomicAdd(a.d_pos32 + (size_t)p * dim + e, ds);
                if (type_row && a.d_type32) atomicAdd(a.d_type32 + (size_t)ty * dim + e, ds);
            }
        }
    }
    const int n_vec = EMBED ? 2 : (a.with_dbias ? 3 : 2);
    float *part = a.partial32 + (size_t)blockIdx.x * n_vec * dim;
#pragma unroll
    for (int i = 0; i < ITEMS; i++) {
        const int e = threadIdx.x + i * WIDE_THREADS;
        if (e >= dim) continue;
        part[e] = acc_w[i];
        part[dim + e] = acc_b[i];
        if (n_vec == 3) part[2 * dim + e] = acc_bias[EMBED ? 0 : i];
    }
}

/* Blocks of the grid (rows are strided over them): a couple a SM; the partials scale with it. */
static int norm_max_blocks(void) { return cuda_sm_count() * NB_BLOCKS_PER_SM; }

/* 0 for a width the kernels refuse: the launcher then says why, with nothing allocated */
static size_t norm_scratch_floats(int32_t dim, int n_vec) {
    if (dim < 1 || dim > CUDA_TRAIN_NORM_MAX_DIM) return 0;
    return (size_t)norm_max_blocks() * n_vec * (size_t)dim;
}

extern "C" size_t cuda_train_layernorm_backward_scratch_floats(int32_t dim) { return norm_scratch_floats(dim, 3); }

extern "C" size_t cuda_train_embed_backward_scratch_floats(int32_t dim) { return norm_scratch_floats(dim, 2); }

/* Launches the kernel with the register layout for dim: 8-element vectors when dim % 8 == 0 and
 * every row is 16-byte aligned, else one element a lane. Returns the grid size in *blocks. */
template <typename T, bool EMBED>
static nopad_status norm_backward_launch(const norm_backward_args<T> &a, bool vec8, int *blocks, cudaStream_t stream) {
    const int dim = a.dim, most = norm_max_blocks();
    if (dim > NARROW_MAX_DIM) { /* a block a row */
        const int grid = a.n_tokens < most ? a.n_tokens : most;
        *blocks = grid;
        const int items = (dim + WIDE_THREADS - 1) / WIDE_THREADS;
        if (items <= 8) norm_backward_wide_kernel<T, 8, EMBED><<<grid, WIDE_THREADS, 0, stream>>>(a);
        else norm_backward_wide_kernel<T, 16, EMBED><<<grid, WIDE_THREADS, 0, stream>>>(a);
        return launch_status(EMBED ? "train embed_backward" : "train layernorm_backward");
    }
    const int by_rows = (a.n_tokens + NB_WARPS - 1) / NB_WARPS;
    const int grid = by_rows < most ? by_rows : most;
    *blocks = grid;
    const int threads = NB_WARPS * 32;
    if (vec8 && dim % 8 == 0) {
        const int iters = (dim + 255) / 256;
        if (iters <= 2) norm_backward_kernel<T, 8, 2, EMBED><<<grid, threads, 0, stream>>>(a);
        else if (iters <= 3) norm_backward_kernel<T, 8, 3, EMBED><<<grid, threads, 0, stream>>>(a);
        else norm_backward_kernel<T, 8, 4, EMBED><<<grid, threads, 0, stream>>>(a);
    } else {
        if (dim <= 256) norm_backward_kernel<T, 1, 8, EMBED><<<grid, threads, 0, stream>>>(a);
        else norm_backward_kernel<T, 1, 32, EMBED><<<grid, threads, 0, stream>>>(a);
    }
    return launch_status(EMBED ? "train embed_backward" : "train layernorm_backward");
}

static nopad_status check_dim(int dim, const char *what) {
    if (dim < 1 || dim > CUDA_TRAIN_NORM_MAX_DIM)
        return nopad_set_error(NOPAD_ERR_UNSUPPORTED, "cuda %s: width %d is outside [1, %d]", what, dim,
                               (int)CUDA_TRAIN_NORM_MAX_DIM);
    return NOPAD_OK;
}

template <typename T>
static nopad_status layernorm_backward_t(void *ds, float *dw32, float *db32, float *dbias32, const void *dy,
                                         const void *s, const void *w, float eps, int n_tokens, int dim,
                                         float *partial32, cudaStream_t stream) {
    norm_backward_args<T> a = {};
    a.ds = (T *)ds;
    a.dy = (const T *)dy;
    a.s = (const T *)s;
    a.w = (const T *)w;
    a.partial32 = partial32;
    a.with_dbias = dbias32 != NULL;
    a.eps = eps;
    a.n_tokens = n_tokens;
    a.dim = dim;
    const bool vec8 = aligned16(ds) && aligned16(dy) && aligned16(s) && aligned16(w);
    int blocks = 0;
    nopad_status st = norm_backward_launch<T, false>(a, vec8, &blocks, stream);
    if (st != NOPAD_OK) return st;
    float *const out[3] = {dw32, db32, dbias32};
    return cuda_train_column_finish(out, partial32, blocks, dbias32 ? 3 : 2, dim, stream);
}

extern "C" nopad_status cuda_train_layernorm_backward(nopad_dtype dtype, void *ds, float *dw32, float *db32,
                                                      float *dbias32, const void *dy, const void *s, const void *w,
                                                      float eps, int32_t n_tokens, int32_t dim, float *partial32,
                                                      void *stream) {
    nopad_status st = check_dim(dim, "layernorm_backward");
    if (st != NOPAD_OK || n_tokens <= 0) return st;
    cudaStream_t cs = (cudaStream_t)stream;
    DISPATCH_DTYPE(dtype,
                   layernorm_backward_t<__half>(ds, dw32, db32, dbias32, dy, s, w, eps, n_tokens, dim, partial32, cs),
                   layernorm_backward_t<__nv_bfloat16>(ds, dw32, db32, dbias32, dy, s, w, eps, n_tokens, dim,
                                                       partial32, cs));
}

template <typename T>
static nopad_status embed_backward_t(float *d_word32, float *d_pos32, float *d_type32, float *d_ln_w32,
                                     float *d_ln_b32, void *dy, const int32_t *tokens, const int32_t *types,
                                     const int32_t *cu_seqlens, int n_seqs, int n_tokens, int position_offset,
                                     const void *word, const void *pos, const void *type, const void *ln_w,
                                     float eps, int dim, float *partial32, cudaStream_t stream) {
    norm_backward_args<T> a = {};
    a.ds = (T *)dy;
    a.dy = (const T *)dy;
    a.w = (const T *)ln_w;
    a.partial32 = partial32;
    a.eps = eps;
    a.n_tokens = n_tokens;
    a.dim = dim;
    a.tokens = tokens;
    a.types = types;
    a.cu_seqlens = cu_seqlens;
    a.n_seqs = n_seqs;
    a.position_offset = position_offset;
    a.word = (const T *)word;
    a.pos = (const T *)pos;
    a.type = (const T *)type;
    a.d_word32 = d_word32;
    a.d_pos32 = d_pos32;
    a.d_type32 = d_type32;
    a.vec_atomics = aligned16(d_word32) && (!d_pos32 || aligned16(d_pos32)) && (!d_type32 || aligned16(d_type32));
    const bool vec8 = aligned16(dy) && aligned16(word) && (!pos || aligned16(pos)) && (!type || aligned16(type)) &&
                      aligned16(ln_w);
    int blocks = 0;
    nopad_status st = norm_backward_launch<T, true>(a, vec8, &blocks, stream);
    if (st != NOPAD_OK) return st;
    float *const out[3] = {d_ln_w32, d_ln_b32, NULL};
    return cuda_train_column_finish(out, partial32, blocks, 2, dim, stream);
}

extern "C" nopad_status cuda_train_embed_backward(nopad_dtype dtype, float *d_word32, float *d_pos32,
                                                  float *d_type32, float *d_ln_w32, float *d_ln_b32, void *dy,
                                                  const int32_t *tokens, const int32_t *types,
                                                  const int32_t *cu_seqlens, int32_t n_seqs, int32_t n_tokens,
                                                  int32_t position_offset, const void *word, const void *pos,
                                                  const void *type, const void *ln_weight, float eps, int32_t dim,
                                                  float *partial32, void *stream) {
    nopad_status st = check_dim(dim, "embed_backward");
    if (st != NOPAD_OK || n_tokens <= 0) return st;
    cudaStream_t cs = (cudaStream_t)stream;
    DISPATCH_DTYPE(dtype,
                   embed_backward_t<__half>(d_word32, d_pos32, d_type32, d_ln_w32, d_ln_b32, dy, tokens, types,
                                            cu_seqlens, n_seqs, n_tokens, position_offset, word, pos, type,
                                            ln_weight, eps, dim, partial32, cs),
                   embed_backward_t<__nv_bfloat16>(d_word32, d_pos32, d_type32, d_ln_w32, d_ln_b32, dy, tokens,
                                                   types, cu_seqlens, n_seqs, n_tokens, position_offset, word, pos,
                                                   type, ln_weight, eps, dim, partial32, cs));
}
