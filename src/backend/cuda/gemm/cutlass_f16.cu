/* cuda_gemm_fused's f16 kernels (cutlass.cuh); a translation unit of their own so the two
 * dtypes compile in parallel. Empty without CUTLASS. */
#ifdef NOPAD_HAVE_CUTLASS
/* CUTLASS's device asserts are calls to __assert_fail: a call inside the mainloop makes ptxas
 * serialise the wgmma pipeline (warning C7510). Off here in every build type. */
#ifndef NDEBUG
#define NDEBUG
#endif
#include "backend/cuda/gemm/cutlass.cuh"

nopad_status nopad_gemm_cutlass_f16(int cfg, int gelu, void *y, const void *x, const void *w,
                                   const void *bias, const void *residual, int M, int K, int N,
                                   cudaStream_t stream) {
    return nopad_gemm::dispatch<cutlass::half_t>(cfg, gelu, y, x, w, bias, residual, M, K, N, stream);
}
#endif
