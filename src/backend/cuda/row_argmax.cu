/* CUDA: row_argmax (backend.h), a greedy choice over a tensor-parallel rank's share of the
 * vocabulary: per row the largest logit, the lowest column holding it and the exp-sum against it,
 * which ranks merge without gathering logits. One CTA per row, two passes over the row: the first
 * takes the max and its lowest column and looks for NaN / +inf, the second sums expf(x - max), each
 * term taken as cpu_row_argmax takes it. Each thread sums its terms in double and the CTA adds
 * the threads' sums in a fixed order: the result, rounded once to float, is within a few float
 * ulps of the exact sum and does not depend on timing (a float32 sum over a vocabulary's share
 * drifts by 1e-4 to 1e-3 relative at 150k terms). Nothing is allocated; the CTA's scratch is static
 * shared memory, so the launch can be recorded in a CUDA graph. */
#include <limits.h>

#include "backend/cuda/common.cuh"
#include "backend/cuda/sampling_ops.h"

enum {
    ARGMAX_THREADS = 1024,
    ARGMAX_WARPS = ARGMAX_THREADS / 32,
    ARGMAX_UNROLL = 8, // loads in flight a thread
};
static const unsigned FULL_MASK = 0xffffffffu;

/* (value, column) with the larger value first, then the lower column: the pair the CPU's
 * left-to-right `v > top` keeps. Columns of -inf never win (column INT_MAX stands for none). */
static __device__ __forceinline__ void keep_better(float &m, int &at, float v, int j) {
    if (v > m || (v == m && j < at)) m = v, at = j;
}

/* Thread tid's ARGMAX_UNROLL columns of the chunk of the row starting at `base` (the thread's
 * columns ascending), -inf past cols (it never wins and adds 0). All are loaded before any is
 * used, so the loads are in flight together. */
static __device__ __forceinline__ void load_columns(float (&v)[ARGMAX_UNROLL], const float *row, int base, int cols,
                                                    int tid) {
#pragma unroll
    for (int u = 0; u < ARGMAX_UNROLL; u++) {
        const int j = base + u * ARGMAX_THREADS + tid;
        v[u] = j < cols ? row[j] : -INFINITY;
    }
}

__global__ void __launch_bounds__(ARGMAX_THREADS)
row_argmax_kernel(float *best, const float *x, int cols, int ld, int id0) {
    __shared__ float s_max[ARGMAX_WARPS];
    __shared__ int s_at[ARGMAX_WARPS];
    __shared__ double s_sum[ARGMAX_WARPS];
    allow_dependent_launch();
    wait_for_upstream_grid(); // x is the LM head's output, written by the grid before this one
    const int tid = threadIdx.x, lane = tid & 31, warp = tid / 32;
    const float *row = x + (size_t)blockIdx.x * ld; // [cols] of [rows, ld]
    float *out = best + (size_t)blockIdx.x * 3;

    // pass 1: NaN / +inf, the max and its lowest column (a thread sees its columns in ascending
    // order, so `>` keeps its first)
    float m = -INFINITY;
    int at = INT_MAX, bad = 0;
    for (int base = 0; base < cols; base += ARGMAX_THREADS * ARGMAX_UNROLL) {
        float v[ARGMAX_UNROLL];
        load_columns(v, row, base, cols, tid);
#pragma unroll
        for (int u = 0; u < ARGMAX_UNROLL; u++) {
            bad |= (v[u] != v[u]) | (v[u] == INFINITY);
            if (v[u] > m) m = v[u], at = base + u * ARGMAX_THREADS + tid;
        }
    }
    if (__syncthreads_or(bad)) {
        if (tid == 0) out[0] = NAN, out[1] = -1.0f, out[2] = 0.0f;
        return;
    }
#pragma unroll
    for (int o = 16; o > 0; o /= 2)
        keep_better(m, at, __shfl_xor_sync(FULL_MASK, m, o), __shfl_xor_sync(FULL_MASK, at, o));
    if (lane == 0) s_max[warp] = m, s_at[warp] = at;
    __syncthreads();
    float top = s_max[0];
    int top_at = s_at[0];
    for (int w = 1; w < ARGMAX_WARPS; w++) keep_better(top, top_at, s_max[w], s_at[w]);
    if (top == -INFINITY) { // -inf only, or no columns
        if (tid == 0) out[0] = -INFINITY, out[1] = -1.0f, out[2] = 0.0f;
        return;
    }

    // pass 2: sum of expf(x - max), -inf columns adding 0
    double z = 0.0;
    for (int base = 0; base < cols; base += ARGMAX_THREADS * ARGMAX_UNROLL) {
        float v[ARGMAX_UNROLL];
        load_columns(v, row, base, cols, tid);
#pragma unroll
        for (int u = 0; u < ARGMAX_UNROLL; u++) z += (double)expf(v[u] - top);
    }
#pragma unroll
    for (int o = 16; o > 0; o /= 2) z += __shfl_xor_sync(FULL_MASK, z, o);
    if (lane == 0) s_sum[warp] = z;
    __syncthreads();
    if (tid == 0) {
        double total = 0.0;
        for (int w = 0; w < ARGMAX_WARPS; w++) total += s_sum[w];
        out[0] = top;
        out[1] = (float)(id0 + top_at);
        out[2] = (float)total;
    }
}

extern "C" nopad_status cuda_row_argmax(float *best, const float *x, int32_t rows, int32_t cols, int32_t ld,
                                        int32_t id0, void *stream) {
    if (rows < 0 || cols < 0 || ld < cols)
        return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT,
                               "cuda row_argmax: %d rows of %d columns, leading dimension %d; need rows >= 0, "
                               "cols >= 0 and ld >= cols",
                               rows, cols, ld);
    if (rows == 0) return NOPAD_OK;
    launch_row_kernel(row_argmax_kernel, dim3(rows), dim3(ARGMAX_THREADS), (cudaStream_t)stream, best, x,
                      (int)cols, (int)ld, (int)id0);
    return launch_status("row_argmax");
}

/* The merge of the ranks' triples best[parts, n, 3], one thread a row, as sampling_merge_greedy
 * (model/sampling.c): the largest max, the lowest part on ties, the log-probability -log of the
 * parts' exp-sums rescaled to the winner's max, summed in double in part order. A row with a NaN
 * part, or only -inf parts, gets id -1 (sample_wait reports it). */
__global__ void greedy_merge_kernel(const float *best, int parts, int n, int *ids, float *logprobs) {
    allow_dependent_launch();
    wait_for_upstream_grid(); // best is the all-gather's output
    const int r = blockIdx.x * blockDim.x + threadIdx.x;
    if (r >= n) return;
    float top = -INFINITY;
    int id = -1, bad = 0;
    for (int k = 0; k < parts; k++) {
        const float *t = best + ((size_t)k * n + r) * 3;
        bad |= t[0] != t[0];
        if (t[0] > top) top = t[0], id = (int)t[1];
    }
    if (bad || top == -INFINITY) {
        ids[r] = -1;
        if (logprobs) logprobs[r] = NAN;
        return;
    }
    double z = 0.0;
    for (int k = 0; k < parts; k++) {
        const float *t = best + ((size_t)k * n + r) * 3;
        if (t[0] > -INFINITY) z += (double)t[2] * exp((double)t[0] - (double)top);
    }
    ids[r] = id;
    if (logprobs) logprobs[r] = (float)-log(z);
}

extern "C" nopad_status cuda_greedy_merge(const float *best, int32_t parts, int32_t n, int32_t *ids, float *logprobs,
                                          void *stream) {
    if (parts < 1 || n < 0)
        return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT,
                               "cuda greedy merge: %d parts of %d rows; need parts >= 1 and rows >= 0", parts, n);
    if (n == 0) return NOPAD_OK;
    enum { MERGE_THREADS = 128 };
    launch_row_kernel(greedy_merge_kernel, dim3((unsigned)((n + MERGE_THREADS - 1) / MERGE_THREADS)),
                      dim3(MERGE_THREADS), (cudaStream_t)stream, best, (int)parts, (int)n, (int *)ids, logprobs);
    return launch_status("greedy merge");
}
