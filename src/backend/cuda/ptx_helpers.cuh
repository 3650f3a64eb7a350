/* Small PTX helpers shared by the attention kernels (attention_varlen.cu, attention_wgmma.cu). */
#ifndef NOPAD_BACKEND_CUDA_PTX_HELPERS_CUH
#define NOPAD_BACKEND_CUDA_PTX_HELPERS_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

static __device__ __forceinline__ uint32_t smem_addr(const void *p) {
    return (uint32_t)__cvta_generic_to_shared(p);
}

/* 16-byte async copy global -> shared; when !valid the destination is zero-filled (src-size 0), so
 * rows past a sequence's end are zeros in shared memory and P * V stays finite. */
static __device__ __forceinline__ void cp_async16(void *dst, const void *src, bool valid) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(dst)), "l"(src),
                 "r"(valid ? 16 : 0));
}
static __device__ __forceinline__ void cp_async_commit(void) { asm volatile("cp.async.commit_group;\n" ::); }
static __device__ __forceinline__ void cp_async_wait_all(void) { asm volatile("cp.async.wait_group 0;\n" ::); }

/* Two floats rounded to one packed f16x2 / bf16x2 register. */
template <bool BF16>
static __device__ __forceinline__ uint32_t pack2(float lo, float hi) {
    uint32_t r;
    if (BF16) {
        __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
        r = *reinterpret_cast<uint32_t *>(&v);
    } else {
        __half2 v = __floats2half2_rn(lo, hi);
        r = *reinterpret_cast<uint32_t *>(&v);
    }
    return r;
}

/* 2^x with the SFU; ex2.approx(-inf) = +0, which is what a masked score must give. */
static __device__ __forceinline__ float fast_exp2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}

#endif
