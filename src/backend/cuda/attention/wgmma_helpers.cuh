/* wgmma helpers shared by the Hopper attention kernels (wgmma.cu, fa3.cu):
 * proxy fences, the 128-byte-swizzle shared-memory descriptor, wgmma wrappers for the shapes the
 * kernels use, and the online-softmax step of one S tile (lazy rescaling). */
#ifndef NOPAD_BACKEND_CUDA_ATTENTION_WGMMA_HELPERS_CUH
#define NOPAD_BACKEND_CUDA_ATTENTION_WGMMA_HELPERS_CUH

#include <math.h>
#include <stdint.h>

#include "backend/cuda/ptx_helpers.cuh"
/* 1: skip the O rescale when no row of the warp moved its (lazy) maximum; 0: always multiply */
#ifndef NOPAD_FMHA_VOTE
#define NOPAD_FMHA_VOTE 1
#endif

/* cp.async writes go through the generic proxy; wgmma reads through the async proxy */
static __device__ __forceinline__ void fence_proxy_async(void) {
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}
static __device__ __forceinline__ void wgmma_fence(void) { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
static __device__ __forceinline__ void wgmma_commit(void) { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
static __device__ __forceinline__ void wgmma_wait0(void) { asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory"); }

/* Shared-memory matrix descriptor, 128-byte swizzle. Tiles are [rows][64] 16-bit elements, one
 * 128-byte row each, 8-row groups 1024 bytes apart, tile bases 1024-byte aligned. Both byte-offset
 * fields are 1024: for K-major operands (Q, K) only the 8-row-group stride is read; for the
 * MN-major V (64 columns = one swizzle atom wide) likewise only the 8-row-group stride matters. */
static __device__ __forceinline__ uint64_t sw128_desc(const void *p) {
    const uint64_t addr = smem_addr(p);
    return ((addr >> 4) & 0x3FFFull) | ((uint64_t)(1024 >> 4) << 16) | ((uint64_t)(1024 >> 4) << 32) |
           (1ull << 62);
}

/* The same descriptor in two halves: the high word is one constant for every tile, the low word is
 * the start address (>> 4, 14 bits) and the leading byte offset. Shared memory ends below 256 KB, so
 * the address field never carries: a descriptor of base + k bytes (k a multiple of 16 that stays
 * inside shared memory) is the base's low word + k / 16, one integer add instead of rebuilding it. */
constexpr uint32_t SW128_DESC_HI = (uint32_t)(1024 >> 4) | (1u << 30);
static __device__ __forceinline__ uint32_t sw128_desc_lo(const void *p) {
    return ((smem_addr(p) >> 4) & 0x3FFFu) | ((uint32_t)(1024 >> 4) << 16);
}
static __device__ __forceinline__ uint64_t sw128_desc_from_lo(uint32_t lo) {
    return ((uint64_t)SW128_DESC_HI << 32) | lo;
}

/* element offset of (row, col) in a swizzled [rows][64] tile: 16-byte chunk index ^= row % 8 */
static __device__ __forceinline__ int sw_off(int row, int col) {
    return row * 64 + ((((col >> 3) ^ row) & 7) << 3) + (col & 7);
}

/* D[64 x 32] (+)= A * B, both in shared memory: the half-width last key tile of a sequence
 * (wgmma.cu); 16 fp32 accumulators a thread, the first 16 of the m64n64 layout */
static __device__ __forceinline__ void wgmma_ss_m64n32k16_f16(float d[16], uint64_t desc_a, uint64_t desc_b, int accumulate) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n32k16.f32.f16.f16 "
        "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15}, %16, %17, p, 1, 1, 0, 0;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
        : "l"(desc_a), "l"(desc_b), "r"(accumulate));
}
static __device__ __forceinline__ void wgmma_ss_m64n32k16_bf16(float d[16], uint64_t desc_a, uint64_t desc_b, int accumulate) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 "
        "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15}, %16, %17, p, 1, 1, 0, 0;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
        : "l"(desc_a), "l"(desc_b), "r"(accumulate));
}
/* D[64 x 64] (+)= A (shared, K-major) * B (shared, K-major); 32 fp32 accumulators a thread */
static __device__ __forceinline__ void wgmma_ss_m64n64k16_f16(float d[32], uint64_t desc_a, uint64_t desc_b, int accumulate) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 "
        "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31}, %32, %33, p, 1, 1, 0, 0;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
        : "l"(desc_a), "l"(desc_b), "r"(accumulate));
}

/* D[64 x 128] (+)= A (shared, K-major) * B (shared, K-major); 64 fp32 accumulators a thread */
static __device__ __forceinline__ void wgmma_ss_m64n128k16_f16(float d[64], uint64_t desc_a, uint64_t desc_b, int accumulate) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 "
        "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63}, %64, %65, p, 1, 1, 0, 0;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
        : "l"(desc_a), "l"(desc_b), "r"(accumulate));
}

/* D[64 x 64] += A (registers, m16k16 fragments per warp) * B (shared, MN-major: transposed) */
static __device__ __forceinline__ void wgmma_rs_m64n64k16_f16(float d[32], const uint32_t a[4], uint64_t desc_b) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 "
        "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31}, {%32,%33,%34,%35}, %36, p, 1, 1, 1;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(1));
}

/* D[64 x 64] (+)= A (shared, K-major) * B (shared, K-major); 32 fp32 accumulators a thread */
static __device__ __forceinline__ void wgmma_ss_m64n64k16_bf16(float d[32], uint64_t desc_a, uint64_t desc_b, int accumulate) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
        "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31}, %32, %33, p, 1, 1, 0, 0;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
        : "l"(desc_a), "l"(desc_b), "r"(accumulate));
}

/* D[64 x 128] (+)= A (shared, K-major) * B (shared, K-major); 64 fp32 accumulators a thread */
static __device__ __forceinline__ void wgmma_ss_m64n128k16_bf16(float d[64], uint64_t desc_a, uint64_t desc_b, int accumulate) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
        "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63}, %64, %65, p, 1, 1, 0, 0;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
        : "l"(desc_a), "l"(desc_b), "r"(accumulate));
}

/* D[64 x 64] += A (registers, m16k16 fragments per warp) * B (shared, MN-major: transposed) */
static __device__ __forceinline__ void wgmma_rs_m64n64k16_bf16(float d[32], const uint32_t a[4], uint64_t desc_b) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
        "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31}, {%32,%33,%34,%35}, %36, p, 1, 1, 1;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(1));
}

/* D[64 x 72] += A (registers) * B (shared, MN-major: transposed), B's columns 64..71 from a second
 * swizzle atom at the descriptor's leading byte offset (fa3.cu: a block of ones, so that
 * columns 64..71 of D accumulate the row sums of A); 36 fp32 accumulators a thread */
static __device__ __forceinline__ void wgmma_rs_m64n72k16_f16(float d[36], const uint32_t a[4], uint64_t desc_b) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %41, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n72k16.f32.f16.f16 "
        "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35}, {%36,%37,%38,%39}, %40, p, 1, 1, 1;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(1));
}
static __device__ __forceinline__ void wgmma_rs_m64n72k16_bf16(float d[36], const uint32_t a[4], uint64_t desc_b) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %41, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n72k16.f32.bf16.bf16 "
        "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35}, {%36,%37,%38,%39}, %40, p, 1, 1, 1;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(1));
}
template <bool BF16>
static __device__ __forceinline__ void wgmma_rs72(float *d, const uint32_t a[4], uint64_t db) {
    if constexpr (BF16) wgmma_rs_m64n72k16_bf16(d, a, db);
    else wgmma_rs_m64n72k16_f16(d, a, db);
}

template <bool BF16, int N>
static __device__ __forceinline__ void wgmma_ss(float *d, uint64_t da, uint64_t db, int acc) {
    if constexpr (N == 32) {
        if constexpr (BF16) wgmma_ss_m64n32k16_bf16(d, da, db, acc);
        else wgmma_ss_m64n32k16_f16(d, da, db, acc);
    } else if constexpr (N == 64) {
        if constexpr (BF16) wgmma_ss_m64n64k16_bf16(d, da, db, acc);
        else wgmma_ss_m64n64k16_f16(d, da, db, acc);
    } else {
        static_assert(N == 128, "wgmma_ss: N is 32, 64 or 128");
        if constexpr (BF16) wgmma_ss_m64n128k16_bf16(d, da, db, acc);
        else wgmma_ss_m64n128k16_f16(d, da, db, acc);
    }
}
template <bool BF16>
static __device__ __forceinline__ void wgmma_rs(float *d, const uint32_t a[4], uint64_t db) {
    if constexpr (BF16) wgmma_rs_m64n64k16_bf16(d, a, db);
    else wgmma_rs_m64n64k16_f16(d, a, db);
}

/* keeps the compiler from moving register reads/writes of wgmma operands across the issue/wait */
template <int N>
static __device__ __forceinline__ void fence_regs(float *r) {
#pragma unroll
    for (int i = 0; i < N; i++) asm volatile("" : "+f"(r[i])::"memory");
}

/* P of an S tile (in s, after softmax_tile) as the A fragments of the P V wgmmas: S groups 2k and
 * 2k+1 form the fragment of k-step k (16 keys). */
template <bool BF16, int KS>
static __device__ __forceinline__ void pack_p(uint32_t (*pa)[4], const float *s) {
#pragma unroll
    for (int kk = 0; kk < KS; kk++) {
        pa[kk][0] = pack2<BF16>(s[8 * kk + 0], s[8 * kk + 1]);
        pa[kk][1] = pack2<BF16>(s[8 * kk + 2], s[8 * kk + 3]);
        pa[kk][2] = pack2<BF16>(s[8 * kk + 4], s[8 * kk + 5]);
        pa[kk][3] = pack2<BF16>(s[8 * kk + 6], s[8 * kk + 7]);
    }
}

/* O *= alpha per row (this thread's two rows) over N8 n8 column groups of the O accumulator */
template <int N8>
static __device__ __forceinline__ void rescale_o(float *o, const float alpha[2]) {
#pragma unroll
    for (int t = 0; t < N8; t++) {
        o[4 * t] *= alpha[0];
        o[4 * t + 1] *= alpha[0];
        o[4 * t + 2] *= alpha[1];
        o[4 * t + 3] *= alpha[1];
    }
}

/* Online softmax of one S tile (NT n8 column groups; this thread's rows row_a and row_a + 8):
 * masks keys >= len (and the causal triangle), updates the running max / sum, and leaves
 * P = 2^(S*scale_log2 - m) in s and the factor O must be multiplied by in alpha. The running max is
 * rescaled lazily: it moves only when the new maximum exceeds it by more than rescale_thresh (log2
 * units), so p <= 2^thresh and O is rarely rescaled; l and O share the max, so the final
 * normalisation stays exact. (both -inf: NaN > t is false) With SUM false the row sums are left to
 * the caller (fa3.cu takes them from the P V product) and l_run is not touched. CAUSAL = 0:
 * the caller knows at compile time that it is not causal (the causal argument is then not read, and
 * the key mask is the short one); otherwise the causal argument decides. */
template <int NT, bool SUM = true, int CAUSAL = -1>
static __device__ __forceinline__ void softmax_tile(float *s, float m_run[2], float l_run[2], float alpha[2],
                                                    float scale_log2, float rescale_thresh, int n0, int len,
                                                    int wrow0, int row_a, int causal, int lane) {
    if constexpr (CAUSAL == 0) {
        /* non-causal, known at compile time: only keys past the end are masked, and that test
         * depends on the column alone (two compares per n8 group instead of four) */
        if (n0 + NT * 8 > len) {
            const int lim = len - n0 - (lane & 3) * 2;  // column t*8 + c of this thread is a key iff t*8 + c < lim
#pragma unroll
            for (int t = 0; t < NT; t++)
#pragma unroll
                for (int c = 0; c < 2; c++)
                    if (t * 8 + c >= lim) s[4 * t + c] = s[4 * t + 2 + c] = -INFINITY;
        }
    } else if (n0 + NT * 8 > len || (causal && n0 + NT * 8 - 1 > wrow0)) {
#pragma unroll
        for (int t = 0; t < NT; t++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int col = n0 + t * 8 + (lane & 3) * 2 + (e & 1);
                const int row = row_a + (e >> 1) * 8;
                if (col >= len || (causal && col > row)) s[4 * t + e] = -INFINITY;
            }
    }
    /* the row maxima and sums go into four independent partials, combined at the end: one running
     * max or sum would be a chain of 2·NT dependent instructions per row (a full tree needs more
     * live registers than the FA3 consumer has) */
    constexpr int PARTS = NT >= 4 ? 4 : NT;
#pragma unroll
    for (int r = 0; r < 2; r++) {
        float part[PARTS];
#pragma unroll
        for (int t = 0; t < NT; t++) {
            const float v = fmaxf(s[4 * t + 2 * r], s[4 * t + 2 * r + 1]);
            part[t % PARTS] = t < PARTS ? v : fmaxf(part[t % PARTS], v);
        }
#pragma unroll
        for (int w = PARTS / 2; w >= 1; w /= 2)
#pragma unroll
            for (int t = 0; t < w; t++) part[t] = fmaxf(part[t], part[t + w]);
        float mx = part[0];
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
        const bool bump = (fmaxf(m_run[r], mx) - m_run[r]) * scale_log2 > rescale_thresh;
        const float m_keep = bump ? fmaxf(m_run[r], mx) : m_run[r];
        const float m_use = m_keep == -INFINITY ? 0.0f : m_keep * scale_log2;
        alpha[r] = bump ? fast_exp2(fmaf(m_run[r], scale_log2, -m_use)) : 1.0f;
        m_run[r] = m_keep;
#pragma unroll
        for (int t = 0; t < NT; t++) {
            s[4 * t + 2 * r] = fast_exp2(fmaf(s[4 * t + 2 * r], scale_log2, -m_use));
            s[4 * t + 2 * r + 1] = fast_exp2(fmaf(s[4 * t + 2 * r + 1], scale_log2, -m_use));
            if constexpr (SUM) {
                const float v = s[4 * t + 2 * r] + s[4 * t + 2 * r + 1];
                part[t % PARTS] = t < PARTS ? v : part[t % PARTS] + v;
            }
        }
        if constexpr (SUM) {
#pragma unroll
            for (int w = PARTS / 2; w >= 1; w /= 2)
#pragma unroll
                for (int t = 0; t < w; t++) part[t] += part[t + w];
            l_run[r] = l_run[r] * alpha[r] + part[0];
        }
    }
}

#endif
