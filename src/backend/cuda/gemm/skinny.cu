/* Skinny linear layers (skinny.h): y[T, N] = epilogue(x[T, K] · w[N, K]ᵀ) for T <= 256.
 *
 * Work split. A CTA (8 warps) owns an output tile of 64 features (rows of w) x up to 64 tokens and
 * one slice of K: grid = N/64 tiles x `splits` slices x ceil(T/64) token tiles, with the fewest
 * slices (1..8) whose grid covers the SMs (BERT-base at T <= 64: 144, 144, 96 and 96 CTAs for the
 * qkv, FFN-in, attention-out and FFN-out GEMMs). Each CTA brings its weight slice and token slice
 * into shared memory with one bulk copy per row (cp.async.bulk, completing on an mbarrier). The
 * MMAs are mma.sync m16n8k16 with w as the A operand (16 features per warp) and x as B (8 tokens
 * per MMA), both K-contiguous as ldmatrix reads them; warp w takes features 16·(w % 4) and tokens
 * 32·(w / 4) .. +32.
 *
 * Reduction. The slices of a tile form one thread-block cluster. Each CTA stages its fp32 partial
 * tile in its own shared memory; after a cluster barrier, CTA r sums token rows r, r + splits, ...
 * over the cluster's tiles through distributed shared memory, in slice order (deterministic),
 * applies bias, activation and residual and stores y. No workspace, no atomics, no second kernel.
 * (A first version reduced through global memory, the last CTA of a tile summing every slice
 * after a fence and a ticket: the serial chain of L2 round trips made each GEMM take 12-14 us
 * at 64 tokens against 7.9-10.2 for this one; docs/gemm.md.)
 *
 * Programmatic dependent launch. The weights do not depend on the kernel before, so each CTA issues
 * their copies first and only then waits (griddepcontrol.wait) for the upstream grid before
 * reading x and the residual; and it lets its own dependents launch at once, so the next layer's
 * CTAs can be resident and streaming their weights while this one finishes. The wait covers the
 * upstream grid's completion and memory flush, so reading its output is safe however early either
 * kernel started. */
#include <cooperative_groups.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdlib.h>

#include "backend/cuda/activation.cuh"
#include "backend/cuda/common.h"
#include "backend/cuda/gemm/skinny.h"
#include "backend/cuda/ptx_helpers.cuh"
extern "C" {
#include "util/error.h"
}

namespace {

namespace cg = cooperative_groups;

enum {
    THREADS = 256,
    TILE_N = 64,     /* features per CTA: 16 per warp, two warps per 16 features */
    TILE_T = 64,     /* tokens per CTA */
    MAX_SPLITS = 8,  /* slices of K per tile = the cluster size (8: the portable limit) */
    MAX_KS = 512,    /* the longest slice */
    ROW_PAD = 8,     /* elements past each shared row: ldmatrix's 8 rows land on distinct banks */
    STAGE_LD = TILE_N + 4, /* floats per row of the fp32 partial tile [token][feature] */
};
constexpr size_t STAGE_BYTES = (size_t)TILE_T * STAGE_LD * 4;
constexpr size_t MAX_SMEM = 200u << 10; /* a slice whose tiles need more is not taken */

struct params {
    void *y;
    const void *x, *w, *bias, *residual;
    int T, K, N, ks, act;
};

/* Shared memory for a slice of ks and up to `rows` tokens: the w and x tiles, which the staged
 * partial tile later overwrites. */
size_t smem_bytes(int ks, int rows) {
    const size_t tiles = (size_t)(TILE_N + (rows + 15) / 16 * 16) * (ks + ROW_PAD) * 2;
    return tiles > STAGE_BYTES ? tiles : STAGE_BYTES;
}

template <bool BF16> struct elem;
template <> struct elem<false> {
    using T = __half;
    static __device__ __forceinline__ float f(T v) { return __half2float(v); }
};
template <> struct elem<true> {
    using T = __nv_bfloat16;
    static __device__ __forceinline__ float f(T v) { return __bfloat162float(v); }
};

/* Four consecutive elements (8 bytes) as floats. */
template <bool BF16>
__device__ __forceinline__ void load4(float v[4], const void *base, size_t i) {
    using T = typename elem<BF16>::T;
    const uint2 raw = *reinterpret_cast<const uint2 *>(static_cast<const T *>(base) + i);
    const T *e = reinterpret_cast<const T *>(&raw);
#pragma unroll
    for (int j = 0; j < 4; j++) v[j] = elem<BF16>::f(e[j]);
}

/* y[t][n .. n+4) = act(v + bias) + residual, rounded once. */
template <bool BF16>
__device__ __forceinline__ void epilogue_store(const params &p, float v[4], int t, int n) {
    if (p.bias) {
        float b[4];
        load4<BF16>(b, p.bias, n);
#pragma unroll
        for (int j = 0; j < 4; j++) v[j] += b[j];
    }
    if (p.act >= 0) {
#pragma unroll
        for (int j = 0; j < 4; j++) v[j] = apply_activation(v[j], p.act);
    }
    const size_t i = (size_t)t * p.N + n;
    if (p.residual) {
        float r[4];
        load4<BF16>(r, p.residual, i);
#pragma unroll
        for (int j = 0; j < 4; j++) v[j] += r[j];
    }
    uint2 out;
    out.x = pack2<BF16>(v[0], v[1]);
    out.y = pack2<BF16>(v[2], v[3]);
    *reinterpret_cast<uint2 *>(static_cast<typename elem<BF16>::T *>(p.y) + i) = out;
}

template <bool BF16>
__global__ void __launch_bounds__(THREADS) skinny_gemm_kernel(const params p) {
    using T = typename elem<BF16>::T;
    extern __shared__ __align__(128) unsigned char smem[];
    const int ld = p.ks + ROW_PAD;
    T *sw = reinterpret_cast<T *>(smem); /* [64 features][ld] */
    T *sx = sw + TILE_N * ld;            /* [16·groups tokens][ld] */
    float *stage = reinterpret_cast<float *>(smem); /* [64 tokens][STAGE_LD], after the MMAs */
    __shared__ uint64_t loaded; /* completes when both tiles have landed */
    cg::cluster_group cluster = cg::this_cluster();

    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
    const int n0 = blockIdx.x * TILE_N, split = blockIdx.y, t0 = blockIdx.z * TILE_T;
    const int k0 = split * p.ks;
    const int k_valid = min(p.ks, p.K - k0);      /* elements of the slice inside K (% 8 == 0) */
    const int k_len = (k_valid + 15) / 16 * 16;   /* what the MMAs read: zeros past k_valid */
    const int rows = min(TILE_T, p.T - t0);       /* tokens of this tile, >= 1 */
    const int groups = (rows + 15) / 16;          /* 16-token groups the MMAs read */
    const uint32_t row_bytes = (uint32_t)k_valid * 2;

    if (tid == 0) {
        mbar_init(&loaded, 1);
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
        mbar_arrive_expect_tx(&loaded, (uint32_t)(TILE_N + rows) * row_bytes);
    }
    /* zeros where the MMAs read past the copies: the slice's tail past K, tokens past T */
    const int tail_chunks = (k_len - k_valid) / 8;
    for (int i = tid; i < (TILE_N + 16 * groups) * tail_chunks; i += THREADS) {
        const int r = i / tail_chunks, c = k_valid + (i % tail_chunks) * 8;
        *reinterpret_cast<uint4 *>(sw + r * ld + c) = make_uint4(0, 0, 0, 0); /* sx follows sw */
    }
    for (int i = tid; i < (16 * groups - rows) * (k_len / 8); i += THREADS) {
        const int r = rows + i / (k_len / 8), c = (i % (k_len / 8)) * 8;
        *reinterpret_cast<uint4 *>(sx + r * ld + c) = make_uint4(0, 0, 0, 0);
    }
    __syncthreads(); /* the barrier is initialised before any copy signals it */

    /* One bulk copy per row, a thread each; the weight slice first: it does not depend on the
     * upstream kernel. */
    if (tid < TILE_N)
        bulk_copy_g2s(sw + tid * ld, static_cast<const T *>(p.w) + (size_t)(n0 + tid) * p.K + k0, row_bytes,
                      &loaded);
    allow_dependent_launch();
#if __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
    if (tid >= TILE_N && tid < TILE_N + rows) {
        bulk_copy_g2s(sx + (tid - TILE_N) * ld, static_cast<const T *>(p.x) + (size_t)(t0 + tid - TILE_N) * p.K + k0,
                      row_bytes, &loaded);
    }
    mbar_wait(&loaded, 0);
    /* acc[j]: features (g, g + 8) of the warp's 16 x tokens 8j + 2q + (0, 1) of its 32,
     * g = lane / 4, q = lane % 4 */
    const int fg = warp % 4, g0 = 2 * (warp / 4);
    float acc[4][4];
#pragma unroll
    for (int j = 0; j < 4; j++) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.0f;
    if (g0 < groups) {
        const T *a_row = sw + (fg * 16 + lane % 16) * ld + (lane / 16) * 8;
        const T *b_row = sx + (g0 * 16 + lane % 8 + (lane / 16) * 8) * ld + ((lane / 8) % 2) * 8;
        const bool second = g0 + 1 < groups;
        for (int kk = 0; kk < k_len; kk += 16) {
            uint32_t a[4], b[4];
            ldmatrix_x4(a, a_row + kk);
            ldmatrix_x4(b, b_row + kk);
            mma16816<BF16>(acc[0], a, b[0], b[1]);
            mma16816<BF16>(acc[1], a, b[2], b[3]);
            if (second) {
                ldmatrix_x4(b, b_row + 16 * ld + kk);
                mma16816<BF16>(acc[2], a, b[0], b[1]);
                mma16816<BF16>(acc[3], a, b[2], b[3]);
            }
        }
    }
    __syncthreads(); /* the tiles become the staging tile */
    if (g0 < groups) {
        const int f = fg * 16 + lane / 4, tq = g0 * 16 + 2 * (lane % 4);
#pragma unroll
        for (int j = 0; j < 4; j++) {
            stage[(8 * j + tq) * STAGE_LD + f] = acc[j][0];
            stage[(8 * j + tq + 1) * STAGE_LD + f] = acc[j][1];
            stage[(8 * j + tq) * STAGE_LD + f + 8] = acc[j][2];
            stage[(8 * j + tq + 1) * STAGE_LD + f + 8] = acc[j][3];
        }
    }
    cluster.sync(); /* every slice's partial tile is staged (release / acquire across the cluster) */

    /* CTA r of the cluster finishes token rows r, r + splits, ...: 16 threads per row, 4 features
     * each, every slice's value loaded before the first add. */
    const int splits = (int)cluster.num_blocks(), rank = (int)cluster.block_rank();
    const int owned = (rows - rank + splits - 1) / splits; /* rows rank + splits·j, j < owned */
    for (int i = tid; i < owned * (TILE_N / 4); i += THREADS) {
        const int t = rank + splits * (i / (TILE_N / 4)), f = (i % (TILE_N / 4)) * 4;
        float4 q[MAX_SPLITS];
#pragma unroll
        for (int s = 0; s < MAX_SPLITS; s++)
            if (s < splits) q[s] = *cluster.map_shared_rank(reinterpret_cast<float4 *>(stage + t * STAGE_LD + f), s);
        float v[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
        for (int s = 0; s < MAX_SPLITS; s++) /* slice order: the same sum on every run */
            if (s < splits) v[0] += q[s].x, v[1] += q[s].y, v[2] += q[s].z, v[3] += q[s].w;
        epilogue_store<BF16>(p, v, t0 + t, n0 + f);
    }
    cluster.sync(); /* no CTA leaves while another still reads its shared memory */
}

/* The fewest slices (1..8) whose grid covers the SMs, else 8; a slice is a multiple of 16
 * elements, at most MAX_KS, with tiles that fit MAX_SMEM. Returns 0 when no slice fits (K > 4096). */
int choose_slice(int T, int K, int N, int *ks_out, int *splits_out) {
    const int tiles = N / TILE_N, z = (T + TILE_T - 1) / TILE_T, sms = cuda_sm_count();
    const int rows = T < TILE_T ? T : TILE_T;
    int found = 0;
    for (int splits = 1; splits <= MAX_SPLITS; splits++) {
        const int ks = ((K + splits - 1) / splits + 15) / 16 * 16;
        if ((K + ks - 1) / ks != splits) continue; /* a shorter slice count covers K already */
        if (ks > MAX_KS || smem_bytes(ks, rows) > MAX_SMEM) continue;
        *ks_out = ks, *splits_out = splits, found = 1;
        if ((long)tiles * splits * z >= sms) break;
    }
    return found;
}

} // namespace

extern "C" int cuda_gemm_skinny_supported(int32_t n_tokens, int32_t n_in, int32_t n_out) {
    int ks, splits;
    return n_tokens >= 1 && n_tokens <= CUDA_SKINNY_MAX_T && n_in >= 8 && n_in % 8 == 0 &&
           n_out >= TILE_N && n_out % TILE_N == 0 && n_out / TILE_N <= 65535 &&
           choose_slice(n_tokens, n_in, n_out, &ks, &splits);
}

extern "C" nopad_status cuda_gemm_skinny(nopad_dtype dtype, void *y, const void *x, const void *w,
                                         const void *bias, const void *residual, int32_t n_tokens,
                                         int32_t n_in, int32_t n_out, int act, void *stream) {
    const char *what = "skinny gemm";
    if (dtype != NOPAD_DTYPE_F16 && dtype != NOPAD_DTYPE_BF16)
        return nopad_set_error(NOPAD_ERR_UNSUPPORTED, "%s: dtype must be F16 or BF16", what);
    if (!y || !x || !w) return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT, "%s: NULL y, x or w", what);
    if (!cuda_gemm_skinny_supported(n_tokens, n_in, n_out))
        return nopad_set_error(NOPAD_ERR_UNSUPPORTED,
                               "%s: T %d K %d N %d (needs 1 <= T <= %d, K %% 8 == 0 and <= 4096, N %% 64 == 0)",
                               what, n_tokens, n_in, n_out, (int)CUDA_SKINNY_MAX_T);
    if ((((uintptr_t)y | (uintptr_t)x | (uintptr_t)w | (uintptr_t)residual) & 15u) || ((uintptr_t)bias & 7u))
        return nopad_set_error(NOPAD_ERR_UNSUPPORTED,
                               "%s: x, w, y and residual must be 16-byte aligned, bias 8-byte aligned", what);
    params p = {};
    p.y = y, p.x = x, p.w = w, p.bias = bias, p.residual = residual;
    p.T = n_tokens, p.K = n_in, p.N = n_out, p.act = act;
    int splits = 1;
    choose_slice(p.T, p.K, p.N, &p.ks, &splits);

    const int di = dtype == NOPAD_DTYPE_BF16;
    void (*kernel)(params) = di ? skinny_gemm_kernel<true> : skinny_gemm_kernel<false>;
    /* the shared-memory limit is a per-device attribute of the kernel: set once per device */
    static int attr_set[CUDA_MAX_DEVICES][2];
    const int dev = cuda_current_device();
    if (dev < 0)
        return nopad_set_error(NOPAD_ERR_UNSUPPORTED, "%s: no current device below %d", what, (int)CUDA_MAX_DEVICES);
    if (!cuda_cache_load(&attr_set[dev][di])) {
        if (cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)MAX_SMEM) != cudaSuccess)
            return nopad_set_error(NOPAD_ERR_BACKEND, "%s: %s", what, cudaGetErrorString(cudaGetLastError()));
        cuda_cache_store(&attr_set[dev][di], 1);
    }
    const int pdl = cuda_pdl_enabled();
    cudaLaunchAttribute attrs[2];
    attrs[0].id = cudaLaunchAttributeClusterDimension;
    attrs[0].val.clusterDim.x = 1;
    attrs[0].val.clusterDim.y = (unsigned)splits;
    attrs[0].val.clusterDim.z = 1;
    attrs[1].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attrs[1].val.programmaticStreamSerializationAllowed = 1;
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(p.N / TILE_N, splits, (p.T + TILE_T - 1) / TILE_T);
    cfg.blockDim = dim3(THREADS);
    cfg.dynamicSmemBytes = smem_bytes(p.ks, p.T < TILE_T ? p.T : TILE_T);
    cfg.stream = static_cast<cudaStream_t>(stream);
    cfg.attrs = attrs;
    cfg.numAttrs = pdl ? 2 : 1;
    const cudaError_t err = cudaLaunchKernelEx(&cfg, kernel, p);
    if (err != cudaSuccess) {
        cudaGetLastError();
        return nopad_set_error(NOPAD_ERR_BACKEND, "%s: launch: %s", what, cudaGetErrorString(err));
    }
    return NOPAD_OK;
}
