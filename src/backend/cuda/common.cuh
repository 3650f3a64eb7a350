/* What the CUDA kernels of every op family share: fp16 / bf16 <-> fp32 element helpers, 16-byte
 * vector loads and stores, the sequence of a packed token, the launch-status check, the dtype switch
 * of the C launchers and the launch of row-wise kernels with programmatic dependent launch. The
 * C-callable queries (SM count, PDL switches, the current device) are in common.h. */
#ifndef NOPAD_BACKEND_CUDA_COMMON_CUH
#define NOPAD_BACKEND_CUDA_COMMON_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#include "backend/backend.h"
#include "backend/cuda/common.h"
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

/* Loads VEC consecutive elements as floats (VEC == 8: one 16-byte load, VEC == 4: one 8-byte load;
 * the caller guarantees the alignment, which holds when dim % VEC == 0). */
template <typename T, int VEC>
__device__ __forceinline__ void load_vec(float *dst, const T *src) {
    if (VEC == 8) {
        uint4 raw = *reinterpret_cast<const uint4 *>(src);
        const T *p = reinterpret_cast<const T *>(&raw);
#pragma unroll
        for (int j = 0; j < 8; j++) dst[j] = to_f32(p[j]);
    } else if (VEC == 4) {
        uint2 raw = *reinterpret_cast<const uint2 *>(src);
        const T *p = reinterpret_cast<const T *>(&raw);
#pragma unroll
        for (int j = 0; j < 4; j++) dst[j] = to_f32(p[j]);
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
    } else if (VEC == 4) {
        uint2 raw;
        T *p = reinterpret_cast<T *>(&raw);
#pragma unroll
        for (int j = 0; j < 4; j++) p[j] = from_f32<T>(src[j]);
        *reinterpret_cast<uint2 *>(dst) = raw;
    } else {
#pragma unroll
        for (int j = 0; j < VEC; j++) dst[j] = from_f32<T>(src[j]);
    }
}

static inline nopad_status launch_status(const char *what) {
    cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess)
        return nopad_set_error(NOPAD_ERR_BACKEND, "cuda %s: %s", what, cudaGetErrorString(err));
    return NOPAD_OK;
}

/* The sequence holding token t: the last s with cu_seqlens[s] <= t (binary search, B+1 entries). */
static __device__ __forceinline__ int sequence_of(const int32_t *cu_seqlens, int n_seqs, int t) {
    int lo = 0, hi = n_seqs - 1;
    while (lo < hi) {
        const int mid = (lo + hi + 1) / 2;
        if (__ldg(cu_seqlens + mid) <= t) lo = mid;
        else hi = mid - 1;
    }
    return lo;
}

/* Blocks of a grid-stride loop over `work` items: enough to cover them, at most 16 a SM of an H100. */
static inline int grid_for(size_t work, int threads) {
    size_t blocks = (work + threads - 1) / threads;
    return (int)(blocks < 132 * 16 ? (blocks ? blocks : 1) : 132 * 16);
}

/* A row-wise kernel that follows a GEMM: launched with programmatic stream serialisation unless
 * NOPAD_PDL=0 (common.h). */
template <typename... Params, typename... Args>
static void launch_row_kernel(void (*kernel)(Params...), dim3 grid, dim3 block, cudaStream_t stream,
                              Args... args) {
    launch_maybe_pdl(kernel, grid, block, 0, stream, cuda_pdl_enabled() != 0, args...);
}

/* The body of a C launcher: the F16 or the BF16 instantiation, else NOPAD_ERR_UNSUPPORTED. */
#define DISPATCH_DTYPE(dtype, CALL_HALF, CALL_BF16)                                                \
    switch (dtype) {                                                                               \
    case NOPAD_DTYPE_F16: return CALL_HALF;                                                        \
    case NOPAD_DTYPE_BF16: return CALL_BF16;                                                       \
    default: return nopad_set_error(NOPAD_ERR_UNSUPPORTED, "cuda: dtype %d is not F16 or BF16", (int)dtype); \
    }

#endif
