/* CUDA training kernels that work element by element or row by row: the activation alone and its
 * backward with the bias gradient (a deterministic column sum), dropout from Philox counters keyed
 * by the example (the CPU's mask bit for bit), the heads' row gather and row scatter-add, and the second pass shared
 * by every column sum of the family. fp16 / bf16 storage, float32 arithmetic. */
#include "backend/cuda/common.cuh"
#include "backend/cuda/train/train_kernels.h"
#include "util/philox.h"

/* Elementwise kernels give each thread a group of 8 elements (one 16-byte load when aligned). */
enum { GROUP = 8, EW_THREADS = 256 };
/* Column sums: 8 warps share a tile of 32 lanes × VEC columns and walk a chunk of rows. */
enum { COL_WARPS = 8, COL_BLOCKS_PER_SM = 8 };
/* The second pass: a block adds 32 columns, its 16 warps taking every 16th block of partials. */
enum { FINISH_WARPS = 16 };

static bool aligned16(const void *p) { return ((uintptr_t)p & 15) == 0; }

/* ---- activations, in float32 --------------------------------------------------------------------- */

/* act(x): the formulas of the CPU's cpu_activate (tanh included, which the forward's fused epilogue
 * never needs). */
static __device__ __forceinline__ float act_forward(float x, int act) {
    switch (act) {
    case NOPAD_ACT_GELU: return 0.5f * x * (1.0f + erff(x * 0.70710678118654752f));
    case NOPAD_ACT_GELU_TANH: return 0.5f * x * (1.0f + tanhf(0.79788456080286536f * (x + 0.044715f * x * x * x)));
    case NOPAD_ACT_RELU: return x > 0.0f ? x : 0.0f;
    case NOPAD_ACT_SILU: return x / (1.0f + expf(-x));
    case NOPAD_ACT_TANH: return tanhf(x);
    default: return x;
    }
}

/* act'(x): the derivative of each formula above (the CPU's activation_derivative, in float). */
static __device__ __forceinline__ float act_derivative(float x, int act) {
    switch (act) {
    case NOPAD_ACT_GELU: /* Φ(x) + x·φ(x) */
        return 0.5f * (1.0f + erff(x * 0.70710678118654752f)) + x * expf(-0.5f * x * x) * 0.39894228040143268f;
    case NOPAD_ACT_GELU_TANH: {
        const float k = 0.79788456080286536f, c = 0.044715f;
        const float t = tanhf(k * (x + c * x * x * x));
        return 0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * k * (1.0f + 3.0f * c * x * x);
    }
    case NOPAD_ACT_RELU: return x > 0.0f ? 1.0f : 0.0f;
    case NOPAD_ACT_SILU: {
        const float s = 1.0f / (1.0f + expf(-x));
        return s * (1.0f + x * (1.0f - s));
    }
    case NOPAD_ACT_TANH: {
        const float t = tanhf(x);
        return 1.0f - t * t;
    }
    default: return 1.0f;
    }
}

/* y[n] = act(x); VEC8: x and y 16-byte aligned (a group that runs past n goes element by element). */
template <typename T, bool VEC8>
__global__ void activation_kernel(T *y, const T *x, size_t n, int act) {
    const size_t n_groups = (n + GROUP - 1) / GROUP;
    for (size_t g = blockIdx.x * (size_t)blockDim.x + threadIdx.x; g < n_groups; g += (size_t)gridDim.x * blockDim.x) {
        const size_t i = g * GROUP;
        if (VEC8 && i + GROUP <= n) {
            float v[GROUP];
            load_vec<T, GROUP>(v, x + i);
#pragma unroll
            for (int j = 0; j < GROUP; j++) v[j] = act_forward(v[j], act);
            store_vec<T, GROUP>(y + i, v);
        } else {
            for (size_t k = i; k < n && k < i + GROUP; k++) y[k] = from_f32<T>(act_forward(to_f32(x[k]), act));
        }
    }
}

/* dx[n] = dy ⊙ act'(x) with no bias gradient (dx may alias dy: no __restrict__). */
template <typename T, bool VEC8>
__global__ void activation_backward_kernel(T *dx, const T *dy, const T *x, size_t n, int act) {
    const size_t n_groups = (n + GROUP - 1) / GROUP;
    for (size_t g = blockIdx.x * (size_t)blockDim.x + threadIdx.x; g < n_groups; g += (size_t)gridDim.x * blockDim.x) {
        const size_t i = g * GROUP;
        if (VEC8 && i + GROUP <= n) {
            float d[GROUP], v[GROUP];
            load_vec<T, GROUP>(d, dy + i);
            load_vec<T, GROUP>(v, x + i);
#pragma unroll
            for (int j = 0; j < GROUP; j++) d[j] *= act_derivative(v[j], act);
            store_vec<T, GROUP>(dx + i, d);
        } else {
            for (size_t k = i; k < n && k < i + GROUP; k++)
                dx[k] = from_f32<T>(to_f32(dy[k]) * act_derivative(to_f32(x[k]), act));
        }
    }
}

/* The same with the bias gradient: block (tile, chunk) owns columns [tile·32·VEC, +32·VEC) of the
 * rows [T·chunk/n_chunks, T·(chunk+1)/n_chunks); each thread sums its VEC columns over the rows of
 * its warp (every COL_WARPS-th), the warps' sums are added in warp order, and the block writes
 * partial32[chunk, columns] (float32, [n_chunks, dim]). The sums take dx before its rounding to
 * the dtype. VEC == 8 needs dim % 8 == 0 and 16-byte aligned tensors. */
template <typename T, int VEC>
__global__ void __launch_bounds__(COL_WARPS * 32)
activation_backward_colsum_kernel(T *dx, float *__restrict__ partial32, const T *dy, const T *x, int n_tokens,
                                  int dim, int act) {
    __shared__ float red[COL_WARPS][32 * VEC];
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int c0 = (blockIdx.x * 32 + lane) * VEC; /* this thread's first column */
    const int chunk = blockIdx.y, n_chunks = gridDim.y;
    const int r0 = (int)((int64_t)n_tokens * chunk / n_chunks);
    const int r1 = (int)((int64_t)n_tokens * (chunk + 1) / n_chunks);
    float acc[VEC];
#pragma unroll
    for (int j = 0; j < VEC; j++) acc[j] = 0.0f;
    if (c0 < dim) {
        for (int r = r0 + warp; r < r1; r += COL_WARPS) {
            const size_t i = (size_t)r * dim + c0;
            float d[VEC], v[VEC];
            load_vec<T, VEC>(d, dy + i);
            load_vec<T, VEC>(v, x + i);
#pragma unroll
            for (int j = 0; j < VEC; j++) {
                d[j] *= act_derivative(v[j], act);
                acc[j] += d[j];
            }
            store_vec<T, VEC>(dx + i, d);
        }
    }
#pragma unroll
    for (int j = 0; j < VEC; j++) red[warp][lane * VEC + j] = acc[j];
    __syncthreads();
    for (int k = threadIdx.x; k < 32 * VEC; k += blockDim.x) {
        const int c = blockIdx.x * 32 * VEC + k;
        if (c >= dim) continue;
        float sum = 0.0f;
#pragma unroll
        for (int w = 0; w < COL_WARPS; w++) sum += red[w][k];
        partial32[(size_t)chunk * dim + c] = sum;
    }
}

/* Blocks of rows the column-sum kernel may use for `dim`: enough 256-thread blocks to fill the
 * device (COL_BLOCKS_PER_SM a SM) across the column tiles. With 8-column tiles this is the most
 * any vector width gives, so the scratch query uses it. */
static int colsum_max_chunks(int dim, int vec) {
    const int tiles = (dim + 32 * vec - 1) / (32 * vec);
    const int want = cuda_sm_count() * COL_BLOCKS_PER_SM;
    const int chunks = (want + tiles - 1) / tiles;
    return chunks > 1 ? chunks : 1;
}

extern "C" size_t cuda_train_activation_backward_scratch_floats(int32_t dim) {
    return (size_t)colsum_max_chunks(dim, 8) * (size_t)dim;
}

template <typename T>
static nopad_status activation_t(void *y, const void *x, int64_t n, nopad_activation act, cudaStream_t stream) {
    const size_t groups = ((size_t)n + GROUP - 1) / GROUP;
    if (aligned16(y) && aligned16(x))
        activation_kernel<T, true><<<grid_for(groups, EW_THREADS), EW_THREADS, 0, stream>>>((T *)y, (const T *)x, (size_t)n, (int)act);
    else
        activation_kernel<T, false><<<grid_for(groups, EW_THREADS), EW_THREADS, 0, stream>>>((T *)y, (const T *)x, (size_t)n, (int)act);
    return launch_status("train activation");
}

extern "C" nopad_status cuda_train_activation(nopad_dtype dtype, void *y, const void *x, int64_t n,
                                              nopad_activation act, void *stream) {
    if (n <= 0) return NOPAD_OK;
    cudaStream_t s = (cudaStream_t)stream;
    DISPATCH_DTYPE(dtype, activation_t<__half>(y, x, n, act, s), activation_t<__nv_bfloat16>(y, x, n, act, s));
}

template <typename T>
static nopad_status activation_backward_t(void *dx, float *db32, const void *dy, const void *x, int n_tokens,
                                          int dim, nopad_activation act, float *partial32, cudaStream_t stream) {
    const bool vec8 = aligned16(dx) && aligned16(dy) && aligned16(x);
    if (!db32) {
        const size_t n = (size_t)n_tokens * dim, groups = (n + GROUP - 1) / GROUP;
        if (vec8)
            activation_backward_kernel<T, true><<<grid_for(groups, EW_THREADS), EW_THREADS, 0, stream>>>(
                (T *)dx, (const T *)dy, (const T *)x, n, (int)act);
        else
            activation_backward_kernel<T, false><<<grid_for(groups, EW_THREADS), EW_THREADS, 0, stream>>>(
                (T *)dx, (const T *)dy, (const T *)x, n, (int)act);
        return launch_status("train activation_backward");
    }
    const int vec = vec8 && dim % 8 == 0 ? 8 : 1;
    const int tiles = (dim + 32 * vec - 1) / (32 * vec);
    const int most = colsum_max_chunks(dim, vec), by_rows = (n_tokens + COL_WARPS - 1) / COL_WARPS;
    const int chunks = most < by_rows ? most : by_rows;
    const dim3 grid(tiles, chunks);
    if (vec == 8)
        activation_backward_colsum_kernel<T, 8><<<grid, COL_WARPS * 32, 0, stream>>>(
            (T *)dx, partial32, (const T *)dy, (const T *)x, n_tokens, dim, (int)act);
    else
        activation_backward_colsum_kernel<T, 1><<<grid, COL_WARPS * 32, 0, stream>>>(
            (T *)dx, partial32, (const T *)dy, (const T *)x, n_tokens, dim, (int)act);
    nopad_status st = launch_status("train activation_backward");
    if (st != NOPAD_OK) return st;
    float *const out[3] = {db32, NULL, NULL};
    return cuda_train_column_finish(out, partial32, chunks, 1, dim, stream);
}

extern "C" nopad_status cuda_train_activation_backward(nopad_dtype dtype, void *dx, float *db32, const void *dy,
                                                       const void *x, int32_t n_tokens, int32_t dim,
                                                       nopad_activation act, float *partial32, void *stream) {
    if (n_tokens <= 0 || dim <= 0) return NOPAD_OK;
    cudaStream_t s = (cudaStream_t)stream;
    DISPATCH_DTYPE(dtype, activation_backward_t<__half>(dx, db32, dy, x, n_tokens, dim, act, partial32, s),
                   activation_backward_t<__nv_bfloat16>(dx, db32, dy, x, n_tokens, dim, act, partial32, s));
}

/* ---- the second pass of the column sums ------------------------------------------------------------ */

struct column_outputs {
    float *v[3];
};

/* Block b adds columns [32·b, 32·b + 32) of the n_vec·dim columns of partial32 [n_blocks, n_vec·dim]:
 * warp w sums the partials w, w + 16, ... in order, then warp 0 adds the 16 warp sums in order. */
__global__ void __launch_bounds__(FINISH_WARPS * 32)
column_finish_kernel(column_outputs out, const float *__restrict__ partial32, int n_blocks, int n_vec, int dim) {
    __shared__ float red[FINISH_WARPS][32];
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int width = n_vec * dim, col = blockIdx.x * 32 + lane;
    float sum = 0.0f;
    if (col < width) {
#pragma unroll 4
        for (int b = warp; b < n_blocks; b += FINISH_WARPS) sum += partial32[(size_t)b * width + col];
    }
    red[warp][lane] = sum;
    __syncthreads();
    if (warp != 0 || col >= width) return;
    float total = 0.0f;
#pragma unroll
    for (int w = 0; w < FINISH_WARPS; w++) total += red[w][lane];
    const int v = col / dim;
    float *o = v == 0 ? out.v[0] : v == 1 ? out.v[1] : out.v[2];
    if (o) o[col - v * dim] += total;
}

extern "C" nopad_status cuda_train_column_finish(float *const out[3], const float *partial32, int32_t n_blocks,
                                                 int32_t n_vec, int32_t dim, void *stream) {
    column_outputs o = {{out[0], n_vec > 1 ? out[1] : NULL, n_vec > 2 ? out[2] : NULL}};
    if (!o.v[0] && !o.v[1] && !o.v[2]) return NOPAD_OK;
    const int width = n_vec * dim;
    column_finish_kernel<<<(width + 31) / 32, FINISH_WARPS * 32, 0, (cudaStream_t)stream>>>(o, partial32, n_blocks,
                                                                                            n_vec, dim);
    return launch_status("train column sums");
}

/* ---- dropout ------------------------------------------------------------------------------------------ */

/* y[t, c] = x[t, c]·scale where hidden_dropout_bits(key, site, example of t's sequence, t's
 * position in it, c) >= threshold, else 0, plus residual[t, c] when residual is not NULL (y may
 * alias x). A thread takes 8 columns of one row, starting on a multiple of 8: two whole Philox
 * blocks. VEC8: dim % 8 == 0 and aligned tensors (16-byte loads). */
template <typename T, bool VEC8>
__global__ void dropout_kernel(T *y, const T *x, const T *residual, const int32_t *cu_seqlens, int n_seqs,
                               const int64_t *examples, int n_tokens, int dim, uint32_t threshold, float scale,
                               uint64_t key, uint32_t site) {
    const int groups_per_row = (dim + GROUP - 1) / GROUP;
    const size_t n_groups = (size_t)n_tokens * groups_per_row;
    for (size_t g = blockIdx.x * (size_t)blockDim.x + threadIdx.x; g < n_groups; g += (size_t)gridDim.x * blockDim.x) {
        const int t = (int)(g / groups_per_row), c0 = (int)(g % groups_per_row) * GROUP;
        const int seq = sequence_of(cu_seqlens, n_seqs, t);
        const uint64_t example = examples ? (uint64_t)examples[seq] : (uint64_t)seq;
        const uint32_t position = (uint32_t)(t - cu_seqlens[seq]);
        uint32_t bits[GROUP];
        hidden_dropout_block(key, site, example, position, (uint32_t)c0, bits);
        if (c0 + 4 < dim) hidden_dropout_block(key, site, example, position, (uint32_t)c0 + 4, bits + 4);
        else bits[4] = bits[5] = bits[6] = bits[7] = 0;
        const size_t i = (size_t)t * dim + c0;
        float v[GROUP];
        if (VEC8) {
            load_vec<T, GROUP>(v, x + i);
        } else {
#pragma unroll
            for (int j = 0; j < GROUP; j++) v[j] = c0 + j < dim ? to_f32(x[i + j]) : 0.0f;
        }
#pragma unroll
        for (int j = 0; j < GROUP; j++) v[j] = bits[j] >= threshold ? v[j] * scale : 0.0f;
        if (residual) {
            float r[GROUP];
            if (VEC8) {
                load_vec<T, GROUP>(r, residual + i);
            } else {
#pragma unroll
                for (int j = 0; j < GROUP; j++) r[j] = c0 + j < dim ? to_f32(residual[i + j]) : 0.0f;
            }
#pragma unroll
            for (int j = 0; j < GROUP; j++) v[j] += r[j];
        }
        if (VEC8) {
            store_vec<T, GROUP>(y + i, v);
        } else {
#pragma unroll
            for (int j = 0; j < GROUP; j++)
                if (c0 + j < dim) y[i + j] = from_f32<T>(v[j]);
        }
    }
}

template <typename T>
static nopad_status dropout_t(void *y, const void *x, const void *residual, const int32_t *cu_seqlens,
                              int32_t n_seqs, const int64_t *examples, int32_t n_tokens, int32_t dim, float p,
                              uint64_t key, uint32_t site, cudaStream_t stream) {
    /* the CPU's threshold and scale, computed the same way on the host */
    const uint32_t threshold = dropout_threshold(p);
    const float scale = (float)(1.0 / (1.0 - p));
    const size_t groups = (size_t)n_tokens * (size_t)((dim + GROUP - 1) / GROUP);
    if (dim % GROUP == 0 && aligned16(y) && aligned16(x) && (!residual || aligned16(residual)))
        dropout_kernel<T, true><<<grid_for(groups, EW_THREADS), EW_THREADS, 0, stream>>>(
            (T *)y, (const T *)x, (const T *)residual, cu_seqlens, n_seqs, examples, n_tokens, dim, threshold,
            scale, key, site);
    else
        dropout_kernel<T, false><<<grid_for(groups, EW_THREADS), EW_THREADS, 0, stream>>>(
            (T *)y, (const T *)x, (const T *)residual, cu_seqlens, n_seqs, examples, n_tokens, dim, threshold,
            scale, key, site);
    return launch_status("train dropout");
}

extern "C" nopad_status cuda_train_dropout(nopad_dtype dtype, void *y, const void *x, const void *residual,
                                           const int32_t *cu_seqlens, int32_t n_seqs, const int64_t *examples,
                                           int32_t n_tokens, int32_t dim, float p, uint64_t key, uint32_t site,
                                           void *stream) {
    if (n_tokens <= 0 || dim <= 0) return NOPAD_OK;
    if (!(p >= 0.0f && p < 1.0f))
        return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT, "cuda dropout: p = %g is outside [0, 1)", (double)p);
    cudaStream_t s = (cudaStream_t)stream;
    DISPATCH_DTYPE(dtype,
                   dropout_t<__half>(y, x, residual, cu_seqlens, n_seqs, examples, n_tokens, dim, p, key, site, s),
                   dropout_t<__nv_bfloat16>(y, x, residual, cu_seqlens, n_seqs, examples, n_tokens, dim, p, key,
                                            site, s));
}

/* ---- row gather and scatter-add --------------------------------------------------------------------- */

/* out[i, :] = x[rows[i], :] as 2-byte elements (a copy of bits, any 16-bit dtype); VEC8: 16 bytes at
 * a time (dim % 8 == 0, aligned tensors). */
template <bool VEC8>
__global__ void select_rows_kernel(uint16_t *out, const uint16_t *x, const int32_t *rows, int n, int dim) {
    const int per_row = VEC8 ? dim / 8 : dim;
    const size_t total = (size_t)n * per_row;
    for (size_t k = blockIdx.x * (size_t)blockDim.x + threadIdx.x; k < total; k += (size_t)gridDim.x * blockDim.x) {
        const int i = (int)(k / per_row), c = (int)(k % per_row);
        const size_t src = (size_t)rows[i] * dim, dst = (size_t)i * dim;
        if (VEC8) reinterpret_cast<uint4 *>(out + dst)[c] = reinterpret_cast<const uint4 *>(x + src)[c];
        else out[dst + c] = x[src + c];
    }
}

extern "C" nopad_status cuda_train_select_rows(nopad_dtype dtype, void *out, const void *x, const int32_t *rows,
                                               int32_t n, int32_t dim, void *stream) {
    if (dtype != NOPAD_DTYPE_F16 && dtype != NOPAD_DTYPE_BF16)
        return nopad_set_error(NOPAD_ERR_UNSUPPORTED, "cuda: dtype %d is not F16 or BF16", (int)dtype);
    if (n <= 0 || dim <= 0) return NOPAD_OK;
    cudaStream_t s = (cudaStream_t)stream;
    const bool vec8 = dim % 8 == 0 && aligned16(out) && aligned16(x);
    const size_t total = (size_t)n * (vec8 ? dim / 8 : dim);
    if (vec8)
        select_rows_kernel<true><<<grid_for(total, EW_THREADS), EW_THREADS, 0, s>>>((uint16_t *)out, (const uint16_t *)x,
                                                                                     rows, n, dim);
    else
        select_rows_kernel<false><<<grid_for(total, EW_THREADS), EW_THREADS, 0, s>>>((uint16_t *)out, (const uint16_t *)x,
                                                                                      rows, n, dim);
    return launch_status("train select_rows");
}

enum { SCATTER_THREADS = 128 };

/* Block i adds src[i] into x[rows[i]]. Rows may repeat: the block of a row's first occurrence adds
 * the sources of every occurrence, in order, in float32, and rounds once; the blocks of later
 * occurrences return. So no two blocks write one row and the result does not depend on scheduling.
 * Each block scans rows[] once (n is the masked tokens or the sequences of a batch). */
template <typename T, int VEC>
__global__ void __launch_bounds__(SCATTER_THREADS)
scatter_add_rows_kernel(T *x, const int32_t *__restrict__ rows, const T *__restrict__ src, int n, int dim) {
    const int i = blockIdx.x, row = rows[i];
    int earlier = 0, later = 0;
    for (int j = threadIdx.x; j < n; j += blockDim.x)
        if (rows[j] == row) {
            earlier |= j < i;
            later |= j > i;
        }
    if (__syncthreads_or(earlier)) return; /* uniform: the whole block returns */
    const bool any_later = __syncthreads_or(later) != 0;
    T *xr = x + (size_t)row * dim;
    for (int c = threadIdx.x * VEC; c < dim; c += blockDim.x * VEC) {
        float acc[VEC], v[VEC];
        load_vec<T, VEC>(acc, xr + c);
        load_vec<T, VEC>(v, src + (size_t)i * dim + c);
#pragma unroll
        for (int j = 0; j < VEC; j++) acc[j] += v[j];
        if (any_later)
            for (int k = i + 1; k < n; k++)
                if (rows[k] == row) {
                    load_vec<T, VEC>(v, src + (size_t)k * dim + c);
#pragma unroll
                    for (int j = 0; j < VEC; j++) acc[j] += v[j];
                }
        store_vec<T, VEC>(xr + c, acc);
    }
}

template <typename T>
static nopad_status scatter_add_rows_t(void *x, const int32_t *rows, const void *src, int n, int dim,
                                       cudaStream_t stream) {
    if (dim % 8 == 0 && aligned16(x) && aligned16(src))
        scatter_add_rows_kernel<T, 8><<<n, SCATTER_THREADS, 0, stream>>>((T *)x, rows, (const T *)src, n, dim);
    else
        scatter_add_rows_kernel<T, 1><<<n, SCATTER_THREADS, 0, stream>>>((T *)x, rows, (const T *)src, n, dim);
    return launch_status("train scatter_add_rows");
}

extern "C" nopad_status cuda_train_scatter_add_rows(nopad_dtype dtype, void *x, const int32_t *rows, const void *src,
                                                    int32_t n, int32_t dim, void *stream) {
    if (n <= 0 || dim <= 0) return NOPAD_OK;
    cudaStream_t s = (cudaStream_t)stream;
    DISPATCH_DTYPE(dtype, scatter_add_rows_t<__half>(x, rows, src, n, dim, s),
                   scatter_add_rows_t<__nv_bfloat16>(x, rows, src, n, dim, s));
}
