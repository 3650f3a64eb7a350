/* CPU: linear layers through OpenBLAS with the epilogue applied in one extra pass. */
#include <math.h>
#include <string.h>

#include <cblas.h>

#include "backend/cpu/cpu_ops.h"

static inline float activate(float x, nopad_activation act) {
    switch (act) {
    case NOPAD_ACT_GELU: return 0.5f * x * (1.0f + erff(x * 0.70710678118654752f));
    case NOPAD_ACT_GELU_TANH: {
        const float k = 0.79788456080286536f; /* sqrt(2/pi) */
        return 0.5f * x * (1.0f + tanhf(k * (x + 0.044715f * x * x * x)));
    }
    case NOPAD_ACT_RELU: return x > 0.0f ? x : 0.0f;
    }
    return x;
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
    float beta = 0.0f;
    if (epilogue == NOPAD_EPILOGUE_BIAS_RESIDUAL) {
        /* Accumulate onto the residual: GEMM with beta = 1 saves a pass over [T, n_out]. */
        if (residual != out) memcpy(out, residual, (size_t)n_tokens * n_out * sizeof(float));
        beta = 1.0f;
    }
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n_tokens, n_out, n_in, 1.0f, x, n_in, w,
                n_in, beta, out, n_out);
    if (epilogue == NOPAD_EPILOGUE_NONE) return NOPAD_OK;
#pragma omp parallel for schedule(static) num_threads(cpu_threads(be))
    for (int32_t t = 0; t < n_tokens; t++) {
        float *row = out + (size_t)t * n_out;
        if (epilogue == NOPAD_EPILOGUE_BIAS_ACT)
            for (int32_t i = 0; i < n_out; i++) row[i] = activate(row[i] + bias[i], act);
        else
            for (int32_t i = 0; i < n_out; i++) row[i] += bias[i];
    }
    return NOPAD_OK;
}
