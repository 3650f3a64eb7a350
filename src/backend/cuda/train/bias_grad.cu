/* The bias gradient of a linear layer: db32[N] += Σ_t dy[t, :] (gemm_backward.h).
 *
 * Why a kernel of our own rather than cuBLASLt's BGRADB epilogue on the dw GEMM: the epilogue
 * stores the bias gradient (it does not add to the vector), while db32 accumulates (+=) across
 * uses of a parameter and micro-batches, so it would need a scratch vector and an add anyway; and
 * its reduction order is the library's. This column sum reads dy once (T·N·2 bytes, small next to
 * the GEMMs that read it too), in a fixed order, so the result has the same bits on every run.
 *
 * Shape: a block sums 64 columns of one slice of rows; its 8 warps take every 8th row, each lane
 * two columns 32 apart (a warp reads 64 consecutive bytes a load). The 8 partial sums are added
 * in order; with several slices, each slice's sums go to ws [slices, N] and a second kernel adds
 * the slices in order. Slices are at least 256 rows and at most 64 of them, from T alone, so the
 * order does not depend on the device. */
#include "backend/cuda/common.cuh"
#include "backend/cuda/train/gemm_backward.h"

enum {
    COLSUM_COLS = 64,       /* columns a block sums */
    COLSUM_WARPS = 8,       /* warps of a block, each walking every 8th row of the slice */
    COLSUM_MIN_ROWS = 256,  /* rows a slice holds at least */
    COLSUM_MAX_SLICES = 64, /* slices of T at most: the partials are [slices, N] float32 */
};

static int32_t slice_rows(int32_t n_tokens) {
    const int32_t even = (n_tokens + COLSUM_MAX_SLICES - 1) / COLSUM_MAX_SLICES;
    return even > COLSUM_MIN_ROWS ? even : COLSUM_MIN_ROWS;
}

static int32_t slices_of(int32_t n_tokens) {
    const int32_t rows = slice_rows(n_tokens);
    return (n_tokens + rows - 1) / rows;
}

/* Rows [slice·rows_per_slice, ...) of dy [T, N]: out[col] += Σ (add_into, one slice) or
 * out[slice, col] = Σ (partials [slices, N]). grid (⌈N / 64⌉, slices), block (32, 8). */
template <typename T>
__global__ void __launch_bounds__(32 * COLSUM_WARPS)
column_sum_kernel(float *out, const T *dy, int32_t n_tokens, int32_t n_out, int32_t rows_per_slice, int add_into) {
    __shared__ float sums[COLSUM_WARPS][COLSUM_COLS];
    const int32_t col0 = blockIdx.x * COLSUM_COLS + threadIdx.x, col1 = col0 + 32;
    const int32_t row_begin = blockIdx.y * rows_per_slice;
    const int32_t row_end = n_tokens < row_begin + rows_per_slice ? n_tokens : row_begin + rows_per_slice;
    float s0 = 0.0f, s1 = 0.0f;
    for (int32_t r = row_begin + threadIdx.y; r < row_end; r += COLSUM_WARPS) {
        const T *row = dy + (size_t)r * n_out; // [N]
        if (col0 < n_out) s0 += to_f32(row[col0]);
        if (col1 < n_out) s1 += to_f32(row[col1]);
    }
    sums[threadIdx.y][threadIdx.x] = s0;
    sums[threadIdx.y][threadIdx.x + 32] = s1;
    __syncthreads();
    if (threadIdx.y != 0) return;
    for (int half = 0; half < 2; half++) {
        const int32_t col = half ? col1 : col0;
        if (col >= n_out) continue;
        float total = 0.0f;
        for (int w = 0; w < COLSUM_WARPS; w++) total += sums[w][threadIdx.x + 32 * half];
        if (add_into) out[col] += total;
        else out[(size_t)blockIdx.y * n_out + col] = total;
    }
}

/* db32[col] += Σ_s partials[s, col], slices in order. */
__global__ void add_slices_kernel(float *db32, const float *partials, int32_t n_slices, int32_t n_out) {
    const int32_t col = blockIdx.x * blockDim.x + threadIdx.x;
    if (col >= n_out) return;
    float total = 0.0f;
    for (int32_t s = 0; s < n_slices; s++) total += partials[(size_t)s * n_out + col];
    db32[col] += total;
}

template <typename T>
static nopad_status bias_grad_launch(float *db32, const T *dy, int32_t n_tokens, int32_t n_out, float *ws,
                                     cudaStream_t stream) {
    const int32_t rows = slice_rows(n_tokens), slices = slices_of(n_tokens);
    const dim3 grid((n_out + COLSUM_COLS - 1) / COLSUM_COLS, slices), block(32, COLSUM_WARPS);
    if (slices == 1) {
        column_sum_kernel<T><<<grid, block, 0, stream>>>(db32, dy, n_tokens, n_out, rows, 1);
    } else {
        column_sum_kernel<T><<<grid, block, 0, stream>>>(ws, dy, n_tokens, n_out, rows, 0);
        add_slices_kernel<<<(n_out + 255) / 256, 256, 0, stream>>>(db32, ws, slices, n_out);
    }
    return launch_status("bias gradient");
}

/* Room for the most slices whenever there are several: T changes from step to step (a batch is a
 * token budget), and a workspace sized by N alone stops growing after a step's widest layer, so a
 * later step can be recorded into a CUDA graph (nothing may be allocated during a recording). */
extern "C" size_t cuda_bias_grad_workspace_bytes(int32_t n_tokens, int32_t n_out) {
    if (n_tokens <= 0 || n_out <= 0) return 0;
    return slices_of(n_tokens) > 1 ? (size_t)COLSUM_MAX_SLICES * (size_t)n_out * sizeof(float) : 0;
}

extern "C" nopad_status cuda_bias_grad(nopad_dtype dtype, float *db32, const void *dy, int32_t n_tokens,
                                       int32_t n_out, float *ws, cudaStream_t stream) {
    if (n_tokens <= 0 || n_out <= 0) return NOPAD_OK;
    if (!ws && cuda_bias_grad_workspace_bytes(n_tokens, n_out) > 0)
        return nopad_set_error(NOPAD_ERR_INTERNAL, "cuda bias gradient: T = %d needs a workspace", (int)n_tokens);
    DISPATCH_DTYPE(dtype, bias_grad_launch(db32, static_cast<const __half *>(dy), n_tokens, n_out, ws, stream),
                   bias_grad_launch(db32, static_cast<const __nv_bfloat16 *>(dy), n_tokens, n_out, ws, stream))
}
