/* CPU: linear layers through OpenBLAS with the epilogue applied in one extra pass. */
#include <math.h>
#include <string.h>

#include <cblas.h>

#include "backend/cpu/cpu_ops.h"

/* One thread's share: out[r0:r1, c0:c1] = epilogue(x[r0:r1] · w[c0:c1]ᵀ). */
static void linear_block(float *out, const float *x, const float *w, const float *bias,
                         const float *residual, int32_t n_in, int32_t n_out, int32_t r0, int32_t r1,
                         int32_t c0, int32_t c1, nopad_epilogue epilogue, nopad_activation act) {
    const int32_t rows = r1 - r0, cols = c1 - c0;
    if (rows <= 0 || cols <= 0) return;
    float beta = 0.0f;
    if (epilogue == NOPAD_EPILOGUE_BIAS_RESIDUAL) {
        /* Accumulate onto the residual: GEMM with beta = 1 saves a pass over the block. */
        if (residual != out)
            for (int32_t t = r0; t < r1; t++)
                memcpy(out + (size_t)t * n_out + c0, residual + (size_t)t * n_out + c0,
                       (size_t)cols * sizeof(float));
        beta = 1.0f;
    }
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rows, cols, n_in, 1.0f,
                x + (size_t)r0 * n_in, n_in, w + (size_t)c0 * n_in, n_in, beta,
                out + (size_t)r0 * n_out + c0, n_out);
    if (epilogue == NOPAD_EPILOGUE_NONE) return;
    for (int32_t t = r0; t < r1; t++) {
        float *row = out + (size_t)t * n_out;
        if (epilogue == NOPAD_EPILOGUE_BIAS_ACT)
            for (int32_t i = c0; i < c1; i++) row[i] = cpu_activate(row[i] + bias[i], act);
        else
            for (int32_t i = c0; i < c1; i++) row[i] += bias[i];
    }
}

nopad_status cpu_linear(nopad_backend *be, void *out_, const void *x_, const void *w_,
                        const void *bias_, const void *residual_, int32_t n_tokens, int32_t n_in,
                        int32_t n_out, nopad_epilogue epilogue, nopad_activation act) {
    float *out = out_;                  // [T, n_out]
    const float *x = x_;                // [T, n_in]
    const float *w = w_;                // [n_out, n_in]
    const float *bias = bias_;          // [n_out]
    const float *residual = residual_;  // [T, n_out]
    if (n_tokens == 0) return NOPAD_OK;
    /* OpenBLAS runs single-threaded (see cpu_backend.c); the threads are ours, each computing a
     * block of rows (many tokens) or of output columns (few tokens) with its epilogue, so one
     * thread pool serves every op and nothing spins against anything else. */
    const int n_threads = cpu_threads(be);
    const int split_rows = n_tokens >= 32 * n_threads;
#pragma omp parallel num_threads(n_threads)
    {
        const int tid = omp_get_thread_num(), nt = omp_get_num_threads();
        if (split_rows) {
            const int32_t per = (n_tokens + nt - 1) / nt;
            const int32_t r0 = tid * per, r1 = r0 + per < n_tokens ? r0 + per : n_tokens;
            linear_block(out, x, w, bias, residual, n_in, n_out, r0, r1, 0, n_out, epilogue, act);
        } else {
            /* columns in multiples of 16 keep each block's stores on whole cache lines */
            const int32_t per = ((n_out + nt - 1) / nt + 15) & ~15;
            const int32_t c0 = tid * per, c1 = c0 + per < n_out ? c0 + per : n_out;
            linear_block(out, x, w, bias, residual, n_in, n_out, 0, n_tokens, c0, c1, epilogue, act);
        }
    }
    return NOPAD_OK;
}

nopad_status cpu_gemm_f32(nopad_backend *be, float *out, const void *x, const void *w,
                          int32_t n_tokens, int32_t n_in, int32_t n_out) {
    return cpu_linear(be, out, x, w, NULL, NULL, n_tokens, n_in, n_out, NOPAD_EPILOGUE_NONE,
                      NOPAD_ACT_GELU);
}
