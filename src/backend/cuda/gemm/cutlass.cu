/* cuda_gemm_fused (gemm_fused.h): argument checks, the tile configuration per shape, and the
 * dispatch to the per-dtype CUTLASS kernels (gemm_cutlass_f16.cu, gemm_cutlass_bf16.cu). Without
 * CUTLASS (NOPAD_HAVE_CUTLASS undefined) every entry reports NOPAD_ERR_UNSUPPORTED. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime.h>

#include "backend/cuda/gemm_fused.h"
extern "C" {
#include "util/error.h"
}

/* Output tiles of 128x128: the measure of the grid both choices below go by (132 SMs: 256 tiles
 * are about 2 waves). */
static int64_t tiles_128(int32_t n_tokens, int32_t n_out) {
    return ((int64_t)n_tokens + 127) / 128 * (((int64_t)n_out + 127) / 128);
}

#ifdef NOPAD_HAVE_CUTLASS
nopad_status nopad_gemm_cutlass_f16(int cfg, int gelu, void *y, const void *x, const void *w,
                                    const void *bias, const void *residual, int M, int K, int N,
                                    cudaStream_t stream);
nopad_status nopad_gemm_cutlass_bf16(int cfg, int gelu, void *y, const void *x, const void *w,
                                     const void *bias, const void *residual, int M, int K, int N,
                                     cudaStream_t stream);

static const char *const CONFIG_NAMES[] = {
    "pingpong 128x128x64",
    "pingpong 64x128x64",
};
enum { N_CONFIGS = sizeof CONFIG_NAMES / sizeof CONFIG_NAMES[0] };

extern "C" int cuda_gemm_fused_available(void) { return 1; }
extern "C" int cuda_gemm_fused_n_configs(void) { return N_CONFIGS; }
extern "C" const char *cuda_gemm_fused_config_name(int config) {
    return config >= 0 && config < N_CONFIGS ? CONFIG_NAMES[config] : "?";
}

/* From 256 tiles of 128x128 (about 2 waves) the 128x128 ping-pong kernel wins, below it the
 * 64x128 one, which has twice the tiles to spread (measured on an H200 for the BERT-base/large
 * shapes, bench/RESULTS.md 2026-11-21). */
extern "C" int cuda_gemm_fused_pick(int32_t n_tokens, int32_t n_in, int32_t n_out,
                                    cuda_gemm_epilogue ep) {
    (void)n_in;
    (void)ep;
    return tiles_128(n_tokens, n_out) >= 256 ? 0 : 1;
}

extern "C" nopad_status cuda_gemm_fused_config(nopad_dtype dtype, void *y, const void *x,
                                               const void *w, const void *bias,
                                               const void *residual, int32_t n_tokens,
                                               int32_t n_in, int32_t n_out, cuda_gemm_epilogue ep,
                                               int config, cudaStream_t stream) {
    if (n_tokens <= 0 || n_in <= 0 || n_out <= 0 || !y || !x || !w)
        return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT, "cutlass gemm: bad arguments (T %d, K %d, N %d)",
                               n_tokens, n_in, n_out);
    if (dtype != NOPAD_DTYPE_F16 && dtype != NOPAD_DTYPE_BF16)
        return nopad_set_error(NOPAD_ERR_UNSUPPORTED, "cutlass gemm: dtype must be F16 or BF16");
    if (ep == CUDA_GEMM_BIAS_RESIDUAL && !residual)
        return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT, "cutlass gemm: residual epilogue without a residual");
    /* The TMA moves 16-byte boxes: rows of K and N elements must be whole multiples of 16 bytes
     * and every base pointer 16-byte aligned (so is the bias, read 8 elements at a time). */
    const uintptr_t misaligned = ((uintptr_t)y | (uintptr_t)x | (uintptr_t)w | (uintptr_t)bias |
                                  (uintptr_t)(ep == CUDA_GEMM_BIAS_RESIDUAL ? residual : NULL)) & 15u;
    if (n_in % 8 || n_out % 8 || misaligned)
        return nopad_set_error(NOPAD_ERR_UNSUPPORTED,
                               "cutlass gemm: K (%d) and N (%d) must be multiples of 8 and pointers 16-byte aligned",
                               n_in, n_out);
    if (config == CUDA_GEMM_CONFIG_AUTO) config = cuda_gemm_fused_pick(n_tokens, n_in, n_out, ep);
    if (config < 0 || config >= N_CONFIGS)
        return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT, "cutlass gemm: no config %d", config);
    const int gelu = ep == CUDA_GEMM_BIAS_GELU_ERF;
    const void *res = ep == CUDA_GEMM_BIAS_RESIDUAL ? residual : NULL;
    return dtype == NOPAD_DTYPE_F16
               ? nopad_gemm_cutlass_f16(config, gelu, y, x, w, bias, res, n_tokens, n_in, n_out, stream)
               : nopad_gemm_cutlass_bf16(config, gelu, y, x, w, bias, res, n_tokens, n_in, n_out, stream);
}

#else /* no CUTLASS: the cuBLASLt path only */

extern "C" int cuda_gemm_fused_available(void) { return 0; }
extern "C" int cuda_gemm_fused_n_configs(void) { return 0; }
extern "C" const char *cuda_gemm_fused_config_name(int config) { return "?"; }
extern "C" int cuda_gemm_fused_pick(int32_t n_tokens, int32_t n_in, int32_t n_out,
                                    cuda_gemm_epilogue ep) {
    return CUDA_GEMM_CONFIG_AUTO;
}
extern "C" nopad_status cuda_gemm_fused_config(nopad_dtype dtype, void *y, const void *x,
                                               const void *w, const void *bias,
                                               const void *residual, int32_t n_tokens,
                                               int32_t n_in, int32_t n_out, cuda_gemm_epilogue ep,
                                               int config, cudaStream_t stream) {
    return nopad_set_error(NOPAD_ERR_UNSUPPORTED, "cutlass gemm: built without CUTLASS");
}
#endif

/* ---- which path cu_linear takes ------------------------------------------------------------- */

static int mode_read; /* 0: NOPAD_GEMM not read yet */
static cuda_gemm_mode mode_value;

extern "C" cuda_gemm_mode cuda_gemm_get_mode(void) {
    if (!mode_read) {
        const char *v = getenv("NOPAD_GEMM");
        mode_value = !v ? CUDA_GEMM_MODE_AUTO
                     : strcmp(v, "cublaslt") == 0 ? CUDA_GEMM_MODE_CUBLASLT
                     : strcmp(v, "cutlass") == 0  ? CUDA_GEMM_MODE_CUTLASS
                                                  : CUDA_GEMM_MODE_AUTO;
        mode_read = 1;
    }
    return mode_value;
}

extern "C" void cuda_gemm_set_mode(cuda_gemm_mode mode) {
    mode_value = mode;
    mode_read = 1;
}

extern "C" int cuda_gemm_use_fused(int32_t n_tokens, int32_t n_in, int32_t n_out,
                                   cuda_gemm_epilogue ep) {
    if (!cuda_gemm_fused_available()) return 0;
    switch (cuda_gemm_get_mode()) {
    case CUDA_GEMM_MODE_CUBLASLT: return 0;
    case CUDA_GEMM_MODE_CUTLASS: return 1;
    case CUDA_GEMM_MODE_AUTO: break;
    }
    /* Measured on an H200 (bench/RESULTS.md, 2026-11-21; times of CUDA-graph replays), BERT-base
     * and -large shapes, T = 128 .. 39798:
     * - exact GELU: cuBLASLt cannot fuse it; the fused kernel beat cuBLASLt + the separate
     *   bias+GELU pass 1.2x to 1.7x from T = 1024 up, and tied at T = 128 (0.96x to 1.07x);
     * - bias only (or none): 1.06x to 1.14x from ~4 waves of 128x128 tiles up when K <= 1024
     *   (qkv, attention out); slower below, and 0.96x to 1.03x at K = 3072/4096 (FFN out);
     * - residual: 1.07x to 1.35x from ~2 waves up at K <= 1024, 1.02x to 1.07x from ~8 waves
     *   up at K = 3072/4096; slower or tied below. */
    const int64_t tiles = tiles_128(n_tokens, n_out);
    switch (ep) {
    /* below 256 tokens: a tie alone, and 1% slower in the whole forward at 1 x 128 (100 tokens;
     * A/B on an H200, results/enc_2026-11-21_H200_ab_gemm.log); 256 lies between the measured
     * 128 (tie) and 1024 (1.16x) */
    case CUDA_GEMM_BIAS_GELU_ERF: return n_tokens >= 256;
    case CUDA_GEMM_BIAS: return n_in <= 1024 && tiles >= 512;
    case CUDA_GEMM_BIAS_RESIDUAL: return tiles >= 1024 || (n_in <= 1024 && tiles >= 256);
    }
    return 0;
}

extern "C" nopad_status cuda_gemm_fused(nopad_dtype dtype, void *y, const void *x, const void *w,
                                        const void *bias, const void *residual, int32_t n_tokens,
                                        int32_t n_in, int32_t n_out, cuda_gemm_epilogue ep,
                                        cudaStream_t stream) {
    return cuda_gemm_fused_config(dtype, y, x, w, bias, residual, n_tokens, n_in, n_out, ep,
                                  CUDA_GEMM_CONFIG_AUTO, stream);
}
