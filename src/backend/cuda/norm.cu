/* CUDA: the encoder's memory-bound ops — embedding gather + LayerNorm, bias + residual +
 * LayerNorm, bias + activation, pooling, L2 normalisation and dtype conversions. All on packed
 * [T, dim] tensors in fp16 or bf16 with fp32 arithmetic.
 *
 * The LayerNorm kernels give each row to one warp and keep the row in registers, so a row is read
 * once and written once (one pass). When dim is a multiple of 8 every lane moves 16 bytes at a time
 * (8 halves); other widths (the tiny test models) take the scalar path of the same kernel. */
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#include "backend/cuda/activation.cuh"
#include "backend/cuda/cuda_ops.h"
#include "backend/cuda/ptx_helpers.cuh"
extern "C" {
#include "util/error.h"
}

/* ---- element helpers -------------------------------------------------------------------------- */

template <typename T> __device__ __forceinline__ float to_f32(T x);
template <> __device__ __forceinline__ float to_f32<__half>(__half x) { return __half2float(x); }
template <> __device__ __forceinline__ float to_f32<__nv_bfloat16>(__nv_bfloat16 x) {
    return __bfloat162float(x);
}
template <typename T> __device__ __forceinline__ T from_f32(float x);
template <> __device__ __forceinline__ __half from_f32<__half>(float x) { return __float2half_rn(x); }
template <> __device__ __forceinline__ __nv_bfloat16 from_f32<__nv_bfloat16>(float x) {
    return __float2bfloat16_rn(x);
}

/* Loads VEC consecutive elements as floats (VEC == 8: one 16-byte load; the caller guarantees the
 * alignment, which holds when dim % 8 == 0). */
template <typename T, int VEC>
__device__ __forceinline__ void load_vec(float *dst, const T *src) {
    if (VEC == 8) {
        uint4 raw = *reinterpret_cast<const uint4 *>(src);
        const T *p = reinterpret_cast<const T *>(&raw);
#pragma unroll
        for (int j = 0; j < 8; j++) dst[j] = to_f32(p[j]);
    } else {
#pragma unroll
        for (int j = 0; j < VEC; j++) dst[j] = to_f32(src[j]);
    }
}

template <typename T, int VEC>
__device__ __forceinline__ void store_vec(T *dst, const float *src) {
    if (VEC == 8) {
        uint4 raw;
        T *p = reinterpret_cast<T *>(&raw);
#pragma unroll
        for (int j = 0; j < 8; j++) p[j] = from_f32<T>(src[j]);
        *reinterpret_cast<uint4 *>(dst) = raw;
    } else {
#pragma unroll
        for (int j = 0; j < VEC; j++) dst[j] = from_f32<T>(src[j]);
    }
}


static nopad_status launch_status(const char *what) {
    cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess)
        return nopad_set_error(NOPAD_ERR_BACKEND, "cuda %s: %s", what, cudaGetErrorString(err));
    return NOPAD_OK;
}

/* cuda_ops.h says what this is for; cached per device (up to 64) */
extern "C" int cuda_sm_count(void) {
    static int cached[64];
    int dev = 0;
    if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= 64) {
        cudaGetLastError();
        return 132;
    }
    if (!cached[dev]) {
        int n = 0;
        if (cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess || n <= 0) {
            cudaGetLastError();
            n = 132;
        }
        cached[dev] = n;
    }
    return cached[dev];
}

/* Programmatic dependent launch (Hopper): the row-wise kernels below follow a GEMM each. Launched
 * with programmatic stream serialisation they are scheduled while the GEMM's last CTAs drain, load
 * what does not depend on it (LayerNorm weights, biases), and wait in griddepcontrol.wait until the
 * GEMM's results are complete and visible. Without the attribute the wait returns at once.
 * NOPAD_PDL=0 turns it off (for A/B timing). */
extern "C" int cuda_pdl_enabled(void) {
    static int enabled = -1;
    if (enabled < 0) {
        const char *env = getenv("NOPAD_PDL");
        enabled = !(env && env[0] == '0');
    }
    return enabled;
}

extern "C" int cuda_pdl_tensor_enabled(void) {
    static int enabled = -1;
    if (enabled < 0) {
        const char *env = getenv("NOPAD_PDL_TENSOR");
        enabled = cuda_pdl_enabled() && !(env && env[0] == '0');
    }
    return enabled;
}

template <typename... Params, typename... Args>
static void launch_row_kernel(void (*kernel)(Params...), dim3 grid, dim3 block, cudaStream_t stream,
                              Args... args) {
    launch_maybe_pdl(kernel, grid, block, 0, stream, cuda_pdl_enabled() != 0, args...);
}

enum { LN_WARPS = 4 }; /* rows per 128-thread block */

/* The lane's share of a row-wide weight vector (gamma, beta, bias), kept in its 16-bit form (half
 * the registers of floats: the kernels hold three of them); 0 past dim or when src is NULL. */
template <typename T, int VEC, int ITERS>
struct row_share {
    T e[ITERS * VEC];
    __device__ __forceinline__ void load(const T *src, int dim, int lane) {
#pragma unroll
        for (int it = 0; it < ITERS; it++) {
            const int e0 = (it * 32 + lane) * VEC;
            if (VEC == 8 && src && e0 < dim) {
                *reinterpret_cast<uint4 *>(e + it * VEC) = *reinterpret_cast<const uint4 *>(src + e0);
            } else {
#pragma unroll
                for (int j = 0; j < VEC; j++) e[it * VEC + j] = src && e0 + j < dim ? src[e0 + j] : from_f32<T>(0.0f);
            }
        }
    }
    __device__ __forceinline__ float operator[](int i) const { return to_f32(e[i]); }
};

/* Normalises the row held in v[ITERS * VEC] (lane's share; invalid slots hold 0) with the
 * preloaded shares wv (gamma) and bv (beta), and stores it. */
template <typename T, int VEC, int ITERS>
__device__ __forceinline__ void layernorm_store(float *v, T *out_row, const row_share<T, VEC, ITERS> &wv,
                                                const row_share<T, VEC, ITERS> &bv, float eps, int dim,
                                                int lane) {
    float sum = 0.0f;
#pragma unroll
    for (int i = 0; i < ITERS * VEC; i++) sum += v[i];
    const float mean = warp_sum(sum) / (float)dim;
    float sq = 0.0f;
#pragma unroll
    for (int it = 0; it < ITERS; it++) {
#pragma unroll
        for (int j = 0; j < VEC; j++) {
            const int e = (it * 32 + lane) * VEC + j;
            if (e < dim) {
                const float d = v[it * VEC + j] - mean;
                sq += d * d;
            }
        }
    }
    const float rstd = rsqrtf(warp_sum(sq) / (float)dim + eps);
#pragma unroll
    for (int it = 0; it < ITERS; it++) {
        const int e0 = (it * 32 + lane) * VEC;
        if (e0 >= dim) continue;
        float o[VEC];
        if (VEC == 8 || e0 + VEC <= dim) {
#pragma unroll
            for (int j = 0; j < VEC; j++)
                o[j] = (v[it * VEC + j] - mean) * rstd * wv[it * VEC + j] + bv[it * VEC + j];
            store_vec<T, VEC>(out_row + e0, o);
        }
    }
}

/* ---- bias + residual + LayerNorm ------------------------------------------------------------- */

template <typename T, int VEC, int ITERS>
__global__ void __launch_bounds__(LN_WARPS * 32)
bias_residual_layernorm_kernel(T *__restrict__ x, const T *__restrict__ bias,
                               const T *__restrict__ residual, const T *__restrict__ w,
                               const T *__restrict__ b, float eps, int rows, int dim) {
    const int row = blockIdx.x * LN_WARPS + threadIdx.x / 32, lane = threadIdx.x % 32;
    allow_dependent_launch(); /* the next GEMM may start streaming its weights */
    /* weights first: they do not depend on the GEMM this kernel follows */
    row_share<T, VEC, ITERS> wv, bv, biasv;
    wv.load(w, dim, lane);
    bv.load(b, dim, lane);
    biasv.load(bias, dim, lane);
    wait_for_upstream_grid();
    if (row >= rows) return;
    T *xr = x + (size_t)row * dim;
    const T *rr = residual ? residual + (size_t)row * dim : nullptr; /* NULL: no residual */
    float v[ITERS * VEC];
#pragma unroll
    for (int it = 0; it < ITERS; it++) {
        const int e0 = (it * 32 + lane) * VEC;
        float xv[VEC], rv[VEC];
        if (e0 < dim) {
            load_vec<T, VEC>(xv, xr + e0);
            if (rr) {
                load_vec<T, VEC>(rv, rr + e0);
            } else {
#pragma unroll
                for (int j = 0; j < VEC; j++) rv[j] = 0.0f;
            }
        }
#pragma unroll
        for (int j = 0; j < VEC; j++)
            v[it * VEC + j] = e0 < dim ? xv[j] + rv[j] + biasv[it * VEC + j] : 0.0f;
    }
    layernorm_store<T, VEC, ITERS>(v, xr, wv, bv, eps, dim, lane);
}

/* ---- embedding gather + LayerNorm -------------------------------------------------------------- */

/* The sequence holding token t: the last s with cu_seqlens[s] <= t (binary search, B+1 entries). */
__device__ __forceinline__ int sequence_of(const int32_t *cu_seqlens, int n_seqs, int t) {
    int lo = 0, hi = n_seqs - 1;
    while (lo < hi) {
        const int mid = (lo + hi + 1) / 2;
        if (__ldg(cu_seqlens + mid) <= t) lo = mid;
        else hi = mid - 1;
    }
    return lo;
}

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
    if (id < 0 || id >= vocab || p >= n_positions || (type && (ty < 0 || ty >= type_vocab))) {
        /* invalid input that could not be checked on the host: poison the row, never read out
         * of bounds */
        for (int e = lane; e < dim; e += 32) orow[e] = from_f32<T>(NAN);
        return;
    }
    const T *wr = word + (size_t)id * dim, *pr = pos + (size_t)p * dim;
    const T *tr = type ? type + (size_t)ty * dim : NULL;
    float v[ITERS * VEC];
#pragma unroll
    for (int it = 0; it < ITERS; it++) {
        const int e0 = (it * 32 + lane) * VEC;
        float a[VEC], c[VEC], d[VEC];
        if (e0 < dim) {
            load_vec<T, VEC>(a, wr + e0);
            load_vec<T, VEC>(c, pr + e0);
            if (tr) load_vec<T, VEC>(d, tr + e0);
        }
#pragma unroll
        for (int j = 0; j < VEC; j++) v[it * VEC + j] = e0 < dim ? a[j] + c[j] + (tr ? d[j] : 0.0f) : 0.0f;
    }
    layernorm_store<T, VEC, ITERS>(v, orow, wv, bv, eps, dim, lane);
}

/* Chooses VEC and the per-lane register count for `dim`; returns 0 if dim is too wide. */
#define LN_DISPATCH(T, KERNEL, GRID, STREAM, ...)                                                  \
    do {                                                                                           \
        if (dim % 8 == 0) {                                                                        \
            const int iters = (dim + 255) / 256;                                                   \
            if (iters <= 1) launch_row_kernel(KERNEL<T, 8, 1>, GRID, LN_WARPS * 32, STREAM, __VA_ARGS__);      \
            else if (iters <= 2) launch_row_kernel(KERNEL<T, 8, 2>, GRID, LN_WARPS * 32, STREAM, __VA_ARGS__); \
            else if (iters <= 3) launch_row_kernel(KERNEL<T, 8, 3>, GRID, LN_WARPS * 32, STREAM, __VA_ARGS__); \
            else if (iters <= 4) launch_row_kernel(KERNEL<T, 8, 4>, GRID, LN_WARPS * 32, STREAM, __VA_ARGS__); \
            else if (iters <= 8) launch_row_kernel(KERNEL<T, 8, 8>, GRID, LN_WARPS * 32, STREAM, __VA_ARGS__); \
            else return nopad_set_error(NOPAD_ERR_UNSUPPORTED, "LayerNorm width %d > 2048", dim);   \
        } else {                                                                                   \
            const int iters = (dim + 31) / 32;                                                     \
            if (iters <= 2) launch_row_kernel(KERNEL<T, 1, 2>, GRID, LN_WARPS * 32, STREAM, __VA_ARGS__);      \
            else if (iters <= 8) launch_row_kernel(KERNEL<T, 1, 8>, GRID, LN_WARPS * 32, STREAM, __VA_ARGS__); \
            else if (iters <= 32) launch_row_kernel(KERNEL<T, 1, 32>, GRID, LN_WARPS * 32, STREAM, __VA_ARGS__); \
            else return nopad_set_error(NOPAD_ERR_UNSUPPORTED,                                     \
                                        "LayerNorm width %d > 1024 and not a multiple of 8", dim); \
        }                                                                                          \
    } while (0)

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

template <typename T>
static nopad_status bias_residual_layernorm_t(void *x, const void *bias, const void *residual,
                                              const void *w, const void *b, float eps, int rows,
                                              int dim, cudaStream_t stream) {
    const int grid = (rows + LN_WARPS - 1) / LN_WARPS;
    LN_DISPATCH(T, bias_residual_layernorm_kernel, grid, stream, (T *)x, (const T *)bias,
                (const T *)residual, (const T *)w, (const T *)b, eps, rows, dim);
    return launch_status("bias_residual_layernorm");
}

/* ---- bias + activation ---------------------------------------------------------------------- */

template <typename T, int VEC>
__global__ void bias_activation_kernel(T *__restrict__ x, const T *__restrict__ bias, size_t n,
                                       int dim, int act) {
    const size_t stride = (size_t)gridDim.x * blockDim.x * VEC;
    wait_for_upstream_grid();
    for (size_t i = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * VEC; i < n; i += stride) {
        float v[VEC], bv[VEC];
        load_vec<T, VEC>(v, x + i);
        if (bias) load_vec<T, VEC>(bv, bias + i % dim);
#pragma unroll
        for (int j = 0; j < VEC; j++) v[j] = apply_activation(v[j] + (bias ? bv[j] : 0.0f), act);
        store_vec<T, VEC>(x + i, v);
    }
}

static int grid_for(size_t work, int threads) {
    size_t blocks = (work + threads - 1) / threads;
    return (int)(blocks < 132 * 16 ? (blocks ? blocks : 1) : 132 * 16);
}

template <typename T>
static nopad_status bias_activation_t(void *x, const void *bias, int rows, int dim,
                                      nopad_activation act, cudaStream_t stream) {
    const size_t n = (size_t)rows * dim;
    if (dim % 8 == 0)
        launch_row_kernel(bias_activation_kernel<T, 8>, grid_for(n / 8, 256), 256, stream, (T *)x, (const T *)bias, n, dim, (int)act);
    else
        launch_row_kernel(bias_activation_kernel<T, 1>, grid_for(n, 256), 256, stream, (T *)x, (const T *)bias, n, dim, (int)act);
    return launch_status("bias_activation");
}

/* ---- pooling and L2 normalisation -------------------------------------------------------------- */

template <typename T>
__global__ void pool_kernel(T *__restrict__ out, const T *__restrict__ x,
                            const int32_t *__restrict__ cu_seqlens, int dim, int mode) {
    const int s = blockIdx.x;
    const int start = cu_seqlens[s], end = mode == NOPAD_POOLING_CLS ? start + 1 : cu_seqlens[s + 1];
    for (int c = threadIdx.x; c < dim; c += blockDim.x) {
        float acc = mode == NOPAD_POOLING_MAX ? -INFINITY : 0.0f;
        for (int t = start; t < end; t++) {
            const float v = to_f32(x[(size_t)t * dim + c]);
            acc = mode == NOPAD_POOLING_MAX ? fmaxf(acc, v) : acc + v;
        }
        if (mode == NOPAD_POOLING_MEAN) acc /= (float)(end - start);
        out[(size_t)s * dim + c] = from_f32<T>(acc);
    }
}

template <typename T>
__global__ void l2_normalize_kernel(T *__restrict__ x, int dim) {
    __shared__ float partial[32];
    T *row = x + (size_t)blockIdx.x * dim;
    float ss = 0.0f;
    for (int c = threadIdx.x; c < dim; c += blockDim.x) {
        const float v = to_f32(row[c]);
        ss += v * v;
    }
    ss = warp_sum(ss);
    if (threadIdx.x % 32 == 0) partial[threadIdx.x / 32] = ss;
    __syncthreads();
    if (threadIdx.x < 32) {
        float v = threadIdx.x < blockDim.x / 32 ? partial[threadIdx.x] : 0.0f;
        v = warp_sum(v);
        if (threadIdx.x == 0) partial[0] = v;
    }
    __syncthreads();
    const float inv = 1.0f / fmaxf(sqrtf(partial[0]), 1e-12f);
    for (int c = threadIdx.x; c < dim; c += blockDim.x) row[c] = from_f32<T>(to_f32(row[c]) * inv);
}

/* ---- attention for other head sizes --------------------------------------------------------- */

template <typename T>
__global__ void attention_generic_kernel(T *__restrict__ out, const T *__restrict__ qkv,
                                         const int32_t *__restrict__ cu_seqlens, int n_seqs,
                                         int n_tokens, int heads, int d, float scale, int causal) {
    const int warp = (int)(((size_t)blockIdx.x * blockDim.x + threadIdx.x) / 32), lane = threadIdx.x % 32;
    const int t = warp / heads, h = warp % heads;
    if (t >= n_tokens) return;
    const int s = sequence_of(cu_seqlens, n_seqs, t);
    const int end = causal ? t + 1 : cu_seqlens[s + 1];
    const size_t H = (size_t)heads * d, stride = 3 * H;
    float q[4], acc[4] = {0, 0, 0, 0};
#pragma unroll
    for (int k = 0; k < 4; k++) {
        const int c = lane + 32 * k;
        q[k] = c < d ? to_f32(qkv[t * stride + (size_t)h * d + c]) * scale : 0.0f;
    }
    float m = -INFINITY, l = 0.0f;
    for (int j = cu_seqlens[s]; j < end; j++) {
        const T *kr = qkv + j * stride + H + (size_t)h * d, *vr = kr + H;
        float dot = 0.0f;
#pragma unroll
        for (int k = 0; k < 4; k++) {
            const int c = lane + 32 * k;
            if (c < d) dot += q[k] * to_f32(kr[c]);
        }
        dot = warp_sum(dot);
        const float m_new = fmaxf(m, dot), correction = __expf(m - m_new), p = __expf(dot - m_new);
        l = l * correction + p;
#pragma unroll
        for (int k = 0; k < 4; k++) {
            const int c = lane + 32 * k;
            acc[k] = acc[k] * correction + (c < d ? p * to_f32(vr[c]) : 0.0f);
        }
        m = m_new;
    }
#pragma unroll
    for (int k = 0; k < 4; k++) {
        const int c = lane + 32 * k;
        if (c < d) out[t * H + (size_t)h * d + c] = from_f32<T>(acc[k] / l);
    }
}

template <typename T>
static nopad_status attention_generic_t(void *out, const void *qkv, const int32_t *cu, int n_seqs,
                                        int n_tokens, int heads, int d, float scale, int causal,
                                        cudaStream_t s) {
    const size_t warps = (size_t)n_tokens * heads;
    const int blocks = (int)((warps * 32 + 255) / 256);
    attention_generic_kernel<T><<<blocks, 256, 0, s>>>((T *)out, (const T *)qkv, cu, n_seqs, n_tokens,
                                                       heads, d, scale, causal);
    return launch_status("attention_generic");
}

/* ---- conversions ----------------------------------------------------------------------------- */

template <typename T>
__global__ void from_f32_kernel(T *__restrict__ dst, const float *__restrict__ src, size_t n) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        dst[i] = from_f32<T>(src[i]);
}
template <typename T>
__global__ void to_f32_kernel(float *__restrict__ dst, const T *__restrict__ src, size_t n) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        dst[i] = to_f32(src[i]);
}

/* ---- C launchers ----------------------------------------------------------------------------- */

#define DISPATCH_DTYPE(dtype, CALL_HALF, CALL_BF16)                                                \
    switch (dtype) {                                                                               \
    case NOPAD_DTYPE_F16: return CALL_HALF;                                                        \
    case NOPAD_DTYPE_BF16: return CALL_BF16;                                                       \
    default: return nopad_set_error(NOPAD_ERR_UNSUPPORTED, "cuda: dtype %d is not F16 or BF16", (int)dtype); \
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

extern "C" nopad_status cuda_bias_residual_layernorm(nopad_dtype dtype, void *x, const void *bias,
                                                     const void *residual, const void *w,
                                                     const void *b, float eps, int32_t rows,
                                                     int32_t dim, void *stream) {
    if (rows == 0) return NOPAD_OK;
    cudaStream_t s = (cudaStream_t)stream;
    DISPATCH_DTYPE(dtype, bias_residual_layernorm_t<__half>(x, bias, residual, w, b, eps, rows, dim, s),
                   bias_residual_layernorm_t<__nv_bfloat16>(x, bias, residual, w, b, eps, rows, dim, s));
}

extern "C" nopad_status cuda_bias_activation(nopad_dtype dtype, void *x, const void *bias,
                                             int32_t rows, int32_t dim, nopad_activation act,
                                             void *stream) {
    if (rows == 0) return NOPAD_OK;
    cudaStream_t s = (cudaStream_t)stream;
    DISPATCH_DTYPE(dtype, bias_activation_t<__half>(x, bias, rows, dim, act, s),
                   bias_activation_t<__nv_bfloat16>(x, bias, rows, dim, act, s));
}

template <typename T>
static nopad_status pool_t(void *out, const void *x, const int32_t *cu, int n_seqs, int dim,
                           nopad_pooling mode, cudaStream_t s) {
    pool_kernel<T><<<n_seqs, 256, 0, s>>>((T *)out, (const T *)x, cu, dim, (int)mode);
    return launch_status("pool");
}

extern "C" nopad_status cuda_pool(nopad_dtype dtype, void *out, const void *x,
                                  const int32_t *cu_seqlens, int32_t n_seqs, int32_t dim,
                                  nopad_pooling mode, void *stream) {
    if (mode != NOPAD_POOLING_CLS && mode != NOPAD_POOLING_MEAN && mode != NOPAD_POOLING_MAX)
        return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT, "pool: mode %d is not cls, mean or max", (int)mode);
    cudaStream_t s = (cudaStream_t)stream;
    DISPATCH_DTYPE(dtype, pool_t<__half>(out, x, cu_seqlens, n_seqs, dim, mode, s),
                   pool_t<__nv_bfloat16>(out, x, cu_seqlens, n_seqs, dim, mode, s));
}

template <typename T>
static nopad_status l2_t(void *x, int rows, int dim, cudaStream_t s) {
    l2_normalize_kernel<T><<<rows, 256, 0, s>>>((T *)x, dim);
    return launch_status("l2_normalize");
}

extern "C" nopad_status cuda_l2_normalize(nopad_dtype dtype, void *x, int32_t rows, int32_t dim,
                                          void *stream) {
    if (rows == 0) return NOPAD_OK;
    cudaStream_t s = (cudaStream_t)stream;
    DISPATCH_DTYPE(dtype, l2_t<__half>(x, rows, dim, s), l2_t<__nv_bfloat16>(x, rows, dim, s));
}

template <typename T>
static nopad_status from_f32_t(void *dst, const float *src, size_t n, cudaStream_t s) {
    from_f32_kernel<T><<<grid_for(n, 256), 256, 0, s>>>((T *)dst, src, n);
    return launch_status("convert");
}
template <typename T>
static nopad_status to_f32_t(float *dst, const void *src, size_t n, cudaStream_t s) {
    to_f32_kernel<T><<<grid_for(n, 256), 256, 0, s>>>(dst, (const T *)src, n);
    return launch_status("convert");
}

extern "C" nopad_status cuda_convert_from_f32(nopad_dtype dtype, void *dst, const float *src,
                                              size_t n, void *stream) {
    if (n == 0) return NOPAD_OK;
    cudaStream_t s = (cudaStream_t)stream;
    DISPATCH_DTYPE(dtype, from_f32_t<__half>(dst, src, n, s), from_f32_t<__nv_bfloat16>(dst, src, n, s));
}

extern "C" nopad_status cuda_convert_to_f32(nopad_dtype dtype, float *dst, const void *src,
                                            size_t n, void *stream) {
    if (n == 0) return NOPAD_OK;
    cudaStream_t s = (cudaStream_t)stream;
    DISPATCH_DTYPE(dtype, to_f32_t<__half>(dst, src, n, s), to_f32_t<__nv_bfloat16>(dst, src, n, s));
}

extern "C" nopad_status cuda_attention_varlen_generic(nopad_dtype dtype, void *out, const void *qkv,
                                                      const int32_t *cu_seqlens, int32_t n_seqs,
                                                      int32_t n_tokens, int32_t n_heads,
                                                      int32_t head_size, float scale, int causal,
                                                      void *stream) {
    if (head_size < 1 || head_size > 128)
        return nopad_set_error(NOPAD_ERR_UNSUPPORTED, "attention: head size %d is not in [1, 128]", head_size);
    if (n_tokens == 0) return NOPAD_OK;
    cudaStream_t s = (cudaStream_t)stream;
    DISPATCH_DTYPE(dtype,
                   attention_generic_t<__half>(out, qkv, cu_seqlens, n_seqs, n_tokens, n_heads, head_size, scale, causal, s),
                   attention_generic_t<__nv_bfloat16>(out, qkv, cu_seqlens, n_seqs, n_tokens, n_heads, head_size, scale, causal, s));
}

/* ---- right-padded batches <-> packed, on the device ------------------------------------------- */

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
