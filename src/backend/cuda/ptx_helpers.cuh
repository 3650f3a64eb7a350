/* Small PTX helpers shared by the op families: the attention kernels (attention/), the skinny GEMM
 * (gemm/skinny.cu), the GEMVs (gemm/gemv.cu, quant/qgemv.cuh) and the row-wise kernels
 * (common.cuh). */
#ifndef NOPAD_BACKEND_CUDA_PTX_HELPERS_CUH
#define NOPAD_BACKEND_CUDA_PTX_HELPERS_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <math.h>
#include <stdint.h>

/* An fp16 or bf16 element's bits to float and back (round to nearest). */
template <bool BF16> static __device__ __forceinline__ float to_float(uint16_t bits) {
    if (BF16) return __uint_as_float((uint32_t)bits << 16);
    return __half2float(__ushort_as_half(bits));
}
template <bool BF16> static __device__ __forceinline__ uint16_t from_float(float v) {
    if (BF16) return __bfloat16_as_ushort(__float2bfloat16_rn(v));
    return __half_as_ushort(__float2half_rn(v));
}

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
/* all but the N most recently committed groups have landed */
template <int N>
static __device__ __forceinline__ void cp_async_wait_group(void) { asm volatile("cp.async.wait_group %0;\n" ::"n"(N)); }

static __device__ __forceinline__ void ldmatrix_x4(uint32_t r[4], const void *p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_addr(p)));
}
static __device__ __forceinline__ void ldmatrix_x4_trans(uint32_t r[4], const void *p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_addr(p)));
}

/* c[4] += a[4] (16x16, row) * b (16x8, col), fp32 accumulate. */
template <bool BF16>
static __device__ __forceinline__ void mma16816(float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1) {
    if (BF16)
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
                     "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                     : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    else
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
                     "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                     : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

static __device__ __forceinline__ void mbar_init(uint64_t *bar, uint32_t count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_addr(bar)), "r"(count) : "memory");
}
/* one arrival that also announces `bytes` of transactions (the TMA copies) for the current phase */
static __device__ __forceinline__ void mbar_arrive_expect_tx(uint64_t *bar, uint32_t bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_addr(bar)), "r"(bytes)
                 : "memory");
}
static __device__ __forceinline__ void mbar_arrive(uint64_t *bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(smem_addr(bar)) : "memory");
}
/* spins until the phase with the given parity has completed */
static __device__ __forceinline__ void mbar_wait(uint64_t *bar, uint32_t parity) {
    uint32_t done;
    do {
        asm volatile(
            "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
            : "=r"(done)
            : "r"(smem_addr(bar)), "r"(parity)
            : "memory");
    } while (!done);
}
/* 1-D bulk copy global -> shared of `bytes` (a multiple of 16; both addresses 16-byte aligned),
 * completing as transactions on `bar` */
static __device__ __forceinline__ void bulk_copy_g2s(void *dst, const void *src, uint32_t bytes, uint64_t *bar) {
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(
                     smem_addr(dst)),
                 "l"(src), "r"(bytes), "r"(smem_addr(bar))
                 : "memory");
}

/* Programmatic dependent launch (Hopper): lets the next kernel on the stream, when it was launched
 * with programmatic stream serialisation, be scheduled before this grid ends, so its CTAs can
 * start on what does not depend on this one (weights) while this grid finishes. Safe whatever the
 * dependent does: it still reads this grid's results only after griddepcontrol.wait, which waits
 * for this grid's completion and memory flush. A no-op for dependents launched without the
 * attribute. */
static __device__ __forceinline__ void allow_dependent_launch(void) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

/* The other half: a kernel launched with programmatic stream serialisation may start before the
 * grid ahead of it on the stream has finished; this waits until that grid has completed and its
 * memory is visible. Everything before it must not read what that grid writes, nor write what it
 * reads. Returns at once for a kernel launched without the attribute. */
static __device__ __forceinline__ void wait_for_upstream_grid(void) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

#ifdef __CUDACC__
#include <cuda_runtime.h>
/* Host: launches `kernel` with programmatic stream serialisation when `pdl` is set (the kernel
 * must call wait_for_upstream_grid before touching anything the previous kernel reads or writes),
 * as a plain launch otherwise. */
template <typename... Params, typename... Args>
static cudaError_t launch_maybe_pdl(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem,
                                    cudaStream_t stream, bool pdl, Args... args) {
    cudaLaunchAttribute attr;
    attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr.val.programmaticStreamSerializationAllowed = 1;
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = smem;
    cfg.stream = stream;
    cfg.attrs = &attr;
    cfg.numAttrs = pdl ? 1 : 0;
    return cudaLaunchKernelEx(&cfg, kernel, ((Params)args)...);
}
#endif

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

/* Eight floats rounded to eight packed f16 / bf16 values (16 bytes). */
template <bool BF16>
static __device__ __forceinline__ uint4 pack8(const float v[8]) {
    return make_uint4(pack2<BF16>(v[0], v[1]), pack2<BF16>(v[2], v[3]), pack2<BF16>(v[4], v[5]),
                      pack2<BF16>(v[6], v[7]));
}

/* The sum of v over the 32 lanes of a warp, in every lane. */
static __device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

/* 2^x with the SFU; ex2.approx(-inf) = +0, which is what a masked score must give. */
static __device__ __forceinline__ float fast_exp2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}

/* One key step of a flash-attention warp: o[D/8][4] += P · V over 16 keys. The two m16n8 score
 * accumulators of the step (s_lo: keys 0-7, s_hi: 8-15) are, rounded to the dtype, exactly the
 * A fragment of the m16n8k16 MMA; v points at the step's first key row of V (row-major
 * [key][dim], ld elements apart), read as the B operand through ldmatrix.trans. */
template <bool BF16, int D, typename E>
static __device__ __forceinline__ void mma_pv_step(float (*o)[4], const float s_lo[4], const float s_hi[4],
                                                   const E *v, int ld, int lane) {
    uint32_t a[4];
    a[0] = pack2<BF16>(s_lo[0], s_lo[1]);
    a[1] = pack2<BF16>(s_lo[2], s_lo[3]);
    a[2] = pack2<BF16>(s_hi[0], s_hi[1]);
    a[3] = pack2<BF16>(s_hi[2], s_hi[3]);
#pragma unroll
    for (int dd = 0; dd < D / 16; dd++) {
        uint32_t b[4];
        ldmatrix_x4_trans(b, v + ((lane & 7) + ((lane >> 3) & 1) * 8) * ld + dd * 16 + (lane >> 4) * 8);
        mma16816<BF16>(o[2 * dd], a, b[0], b[1]);
        mma16816<BF16>(o[2 * dd + 1], a, b[2], b[3]);
    }
}

#endif
