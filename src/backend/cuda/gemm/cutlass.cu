/* cuda_gemm_fused (cutlass.h): argument checks, the tile configuration per shape, and the
 * dispatch to the per-dtype CUTLASS kernels (cutlass_f16.cu, cutlass_bf16.cu). Without
 * CUTLASS (NOPAD_HAVE_CUTLASS undefined) every entry reports NOPAD_ERR_UNSUPPORTED. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime.h>

#include "backend/cuda/gemm/cutlass.h"
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

nopad_status nopad_gemm_cutlass_gelu_aux_bf16(void *y, void *aux, const void *x, const void *w, const void *bias,
                                              int M, int K, int N, cudaStream_t stream);
nopad_status nopad_gemm_cutlass_dgelu_bf16(void *dx, const void *dy, const void *w, const void *aux, int M, int K,
                                           int N, cudaStream_t stream);

/* The TMA's rules for the training kernels: bf16, rows of K and N whole 16-byte multiples,
 * 16-byte aligned pointers. */
static nopad_status train_shape_ok(const char *what, nopad_dtype dtype, int32_t T, int32_t K, int32_t N,
                                   uintptr_t pointers) {
    if (T <= 0 || K <= 0 || N <= 0)
        return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT, "cutlass %s: T %d, K %d, N %d", what, T, K, N);
    if (dtype != NOPAD_DTYPE_BF16)
        return nopad_set_error(NOPAD_ERR_UNSUPPORTED, "cutlass %s: bf16 only", what);
    if (K % 8 || N % 8 || (pointers & 15u))
        return nopad_set_error(NOPAD_ERR_UNSUPPORTED, "cutlass %s: K (%d) and N (%d) must be multiples of 8 and "
                               "pointers 16-byte aligned", what, K, N);
    return NOPAD_OK;
}

extern "C" nopad_status cuda_gemm_gelu_aux(nopad_dtype dtype, void *y, void *aux, const void *x, const void *w,
                                           const void *bias, int32_t n_tokens, int32_t n_in, int32_t n_out,
                                           cudaStream_t stream) {
    if (!y || !aux || !x || !w) return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT, "cutlass gemm gelu+aux: NULL");
    nopad_status st = train_shape_ok("gemm gelu+aux", dtype, n_tokens, n_in, n_out,
                                     (uintptr_t)y | (uintptr_t)aux | (uintptr_t)x | (uintptr_t)w | (uintptr_t)bias);
    if (st != NOPAD_OK) return st;
    return nopad_gemm_cutlass_gelu_aux_bf16(y, aux, x, w, bias, n_tokens, n_in, n_out, stream);
}

extern "C" nopad_status cuda_gemm_dgelu(nopad_dtype dtype, void *dx, const void *dy, const void *w, const void *aux,
                                        int32_t n_tokens, int32_t n_in, int32_t n_out, cudaStream_t stream) {
    if (!dx || !dy || !w || !aux) return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT, "cutlass gemm dgelu: NULL");
    nopad_status st = train_shape_ok("gemm dgelu", dtype, n_tokens, n_out, n_in,
                                     (uintptr_t)dx | (uintptr_t)dy | (uintptr_t)w | (uintptr_t)aux);
    if (st != NOPAD_OK) return st;
    /* in CUTLASS's terms M = T, K = the forward's n_out, N = its n_in */
    return nopad_gemm_cutlass_dgelu_bf16(dx, dy, w, aux, n_tokens, n_out, n_in, stream);
}

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
 * 64x128 one, which has twice the tiles to spread (BERT-base/large shapes; docs/gemm.md). */
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
extern "C" nopad_status cuda_gemm_gelu_aux(nopad_dtype dtype, void *y, void *aux, const void *x, const void *w,
                                           const void *bias, int32_t n_tokens, int32_t n_in, int32_t n_out,
                                           cudaStream_t stream) {
    return nopad_set_error(NOPAD_ERR_UNSUPPORTED, "cutlass gemm gelu+aux: built without CUTLASS");
}
extern "C" nopad_status cuda_gemm_dgelu(nopad_dtype dtype, void *dx, const void *dy, const void *w, const void *aux,
                                        int32_t n_tokens, int32_t n_in, int32_t n_out, cudaStream_t stream) {
    return nopad_set_error(NOPAD_ERR_UNSUPPORTED, "cutlass gemm dgelu: built without CUTLASS");
}
#endif

extern "C" nopad_status cuda_gemm_fused(nopad_dtype dtype, void *y, const void *x, const void *w,
                                        const void *bias, const void *residual, int32_t n_tokens,
                                        int32_t n_in, int32_t n_out, cuda_gemm_epilogue ep,
                                        cudaStream_t stream) {
    return cuda_gemm_fused_config(dtype, y, x, w, bias, residual, n_tokens, n_in, n_out, ep,
                                  CUDA_GEMM_CONFIG_AUTO, stream);
}
