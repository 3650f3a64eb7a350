/* Flux's fused kernels (flux.h): one tile loop for AllGather+GEMM and GEMM+ReduceScatter, in two
 * mainloops: configuration 0 (flux_gemm, described here) and the TMA, warp-specialized,
 * persistent configurations 1-2 (flux_gemm_ws, described above it), which share its tile order,
 * signals, waits and destinations.
 *
 * A CTA of 8 warps (two warpgroups) owns a BM x BN output tile (128 or 64 rows): cp.async loads of
 * x and w tiles (K slices of 64, rows of 128 bytes XOR-swizzled by row: wgmma's 128-byte swizzle)
 * into a ring of STAGES slices, wgmma straight from shared memory into fp32 accumulators, and an
 * epilogue through shared memory. One CTA a tile, tiles in the order the communication delivers
 * them (the block scheduler hands out blocks in index order, so a CTA waiting on a late chunk
 * never keeps the tiles before it from running): a chunk's tiles together, in groups of 8 tile
 * rows swept column by column so a group's x rows and w columns are reused from L2.
 *
 * Waits: one thread (AllGather: the chunk's signal; ReduceScatter: one thread per source) spins
 * on ld.acquire.sys until the word equals the epoch, with __nanosleep between reads, and gives up
 * past the timeout (globaltimer) or as soon as another CTA has reported one; the barrier after it
 * orders the CTA's loads after the acquire. Signals are set after a __syncthreads (every thread's
 * stores done) by one thread: fence.sc.sys then st.release.sys, so a peer that sees the word sees
 * the tile. */
#include <stdint.h>
#include <stdlib.h>

#include <type_traits>

#include <cuda.h> /* CUtensorMap and its enums only: the encoder comes from the runtime's entry point */
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "backend/cuda/common.h"
#include "backend/cuda/flux/flux.h"
#include "backend/cuda/ptx_helpers.cuh"
#include <pthread.h>
extern "C" {
#include "util/error.h"
}

namespace {

constexpr int BK = 64, THREADS = 256;
constexpr int GROUP_M = 8; /* tile rows swept together, column by column */

/* The error word: FLUX_ERR_TIMEOUT | kind << 8 | the rank waited for. */
constexpr uint32_t FLUX_ERR_TIMEOUT = 0x80000000u;
constexpr uint32_t KIND_AG = 1, KIND_RS = 2;
constexpr uint32_t KIND_STALL = 3; /* flux_gemm_ws: an mbarrier never completed (a bug, not a peer) */

struct Params {
    const void *x; /* AllGather: the gathered buffer [M, K]; ReduceScatter: this rank's x [M, K] */
    const void *w; /* [N, K] */
    void *y;       /* AllGather: [M, N]; ReduceScatter: [rows[rank], N] */
    int32_t K, N, world, rank;
    int32_t row0[CUDA_FLUX_MAX_WORLD + 1];  /* chunk d: rows [row0[d], row0[d + 1]) */
    int32_t tile0[CUDA_FLUX_MAX_WORLD + 1]; /* position p's tiles: blocks [tile0[p], tile0[p + 1]) */
    int32_t tiles_n;
    void *inbox[CUDA_FLUX_MAX_WORLD];
    uint32_t *signals[CUDA_FLUX_MAX_WORLD];
    uint32_t *error;
    uint64_t timeout_ns;
    uint32_t epoch;
};

template <class T>
struct Pack;
template <>
struct Pack<__half> {
    static __device__ __forceinline__ uint32_t pack(float a, float b) {
        __half2 h = __floats2half2_rn(a, b);
        return *reinterpret_cast<uint32_t *>(&h);
    }
    static __device__ __forceinline__ float2 unpack(uint32_t v) {
        return __half22float2(*reinterpret_cast<__half2 *>(&v));
    }
};
template <>
struct Pack<__nv_bfloat16> {
    static __device__ __forceinline__ uint32_t pack(float a, float b) {
        __nv_bfloat162 h = __floats2bfloat162_rn(a, b);
        return *reinterpret_cast<uint32_t *>(&h);
    }
    static __device__ __forceinline__ float2 unpack(uint32_t v) {
        return __bfloat1622float2(*reinterpret_cast<__nv_bfloat162 *>(&v));
    }
};

__device__ __forceinline__ uint64_t globaltimer(void) {
    uint64_t t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}
__device__ __forceinline__ uint32_t load_acquire_sys(const uint32_t *p) {
    uint32_t v;
    asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}
__device__ __forceinline__ void store_release_sys(uint32_t *p, uint32_t v) {
    asm volatile("st.release.sys.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

/* Spins until *word == epoch; false on timeout (reported in *error) or when another CTA has
 * already reported one. */
__device__ bool wait_signal(const uint32_t *word, uint32_t epoch, uint32_t *error, uint64_t timeout_ns,
                            uint32_t code) {
    if (load_acquire_sys(word) == epoch) return true;
    const uint64_t start = globaltimer();
    for (;;) {
        __nanosleep(128);
        if (load_acquire_sys(word) == epoch) return true;
        if (*(volatile uint32_t *)error != 0) return false;
        if (globaltimer() - start > timeout_ns) {
            atomicCAS(error, 0u, code);
            return false;
        }
    }
}

/* Which chunk position p of the tile order holds: AllGather the local chunk first, then the ones
 * pushed to it in order (rank - 1, rank - 2, ...); ReduceScatter rank + 1, rank + 2, ... and its
 * own chunk last, whose tiles wait for the others' partials. */
__device__ __forceinline__ int chunk_at(int p, int rank, int world, bool rs) {
    return rs ? (rank + 1 + p) % world : (rank - p + world) % world;
}

/* Where tile b (a block's index, or a persistent CTA's tile) lies: its chunk, the chunk's rows,
 * the tile's place in the chunk (groups of GROUP_M tile rows swept column by column) and its rows
 * and first column. */
struct TileCoord {
    int chunk, c_row0, c_rows, tiles_m, tile_m, tile_n, m_begin, m_end, n0;
};
template <int BM, int BN, bool RS>
__device__ __forceinline__ TileCoord locate(const Params &p, int b) {
    TileCoord t;
    int pos = 0;
    while (pos + 1 < p.world && b >= p.tile0[pos + 1]) pos++;
    t.chunk = chunk_at(pos, p.rank, p.world, RS);
    t.c_row0 = p.row0[t.chunk], t.c_rows = p.row0[t.chunk + 1] - t.c_row0;
    t.tiles_m = (t.c_rows + BM - 1) / BM;
    const int local = b - p.tile0[pos];
    const int group = local / (GROUP_M * p.tiles_n);
    const int group_m = min(GROUP_M, t.tiles_m - group * GROUP_M);
    const int in_group = local - group * GROUP_M * p.tiles_n;
    t.tile_m = group * GROUP_M + in_group % group_m, t.tile_n = in_group / group_m;
    t.m_begin = t.c_row0 + t.tile_m * BM, t.m_end = min(t.m_begin + BM, t.c_row0 + t.c_rows);
    t.n0 = t.tile_n * BN;
    return t;
}

/* One K slice (64 wide) of the x tile (BM rows) or the w tile (BN rows) into shared memory by
 * cp.async, 16-byte pieces: piece c of row r at c ^ (r & 7) in a row of 128 bytes, wgmma's
 * 128-byte swizzle (the stage 1024-byte aligned). Rows past the tile's end (the chunk's, or N) are
 * zero-filled. */
template <class T, int ROWS>
__device__ __forceinline__ void load_slice(T *dst, const T *src, int row0, int row_end, int K, int kt) {
#pragma unroll
    for (int i = 0; i < ROWS * 8 / THREADS; i++) {
        const int id = threadIdx.x + i * THREADS, r = id >> 3, c = id & 7;
        const bool valid = row0 + r < row_end;
        const T *from = src + (int64_t)(valid ? row0 + r : 0) * K + kt * BK + c * 8;
        cp_async16(dst + r * BK + ((c ^ (r & 7)) << 3), from, valid);
    }
}

/* The AllGather's wait for the tile's chunk (the local one needs none); false: the kernel gives up
 * on this tile (timeout, reported). */
template <bool RS>
__device__ __forceinline__ bool wait_chunk(const Params &p, const TileCoord &t, int *ok_shared) {
    if (RS || t.chunk == p.rank) return true;
    if (threadIdx.x == 0)
        *ok_shared = wait_signal(p.signals[p.rank] + t.chunk, p.epoch, p.error, p.timeout_ns,
                                 FLUX_ERR_TIMEOUT | KIND_AG << 8 | (uint32_t)t.chunk);
    __syncthreads();
    return *ok_shared != 0;
}

/* 16-byte vectors of 8 elements: packed from / unpacked to fp32 */
template <class T>
__device__ __forceinline__ uint4 pack8(const float4 a, const float4 b) {
    return make_uint4(Pack<T>::pack(a.x, a.y), Pack<T>::pack(a.z, a.w), Pack<T>::pack(b.x, b.y),
                      Pack<T>::pack(b.z, b.w));
}
template <class T>
__device__ __forceinline__ void add8(float4 &a, float4 &b, const uint4 v) {
    const float2 p0 = Pack<T>::unpack(v.x), p1 = Pack<T>::unpack(v.y), p2 = Pack<T>::unpack(v.z),
                 p3 = Pack<T>::unpack(v.w);
    a.x += p0.x, a.y += p0.y, a.z += p1.x, a.w += p1.y, b.x += p2.x, b.y += p2.y, b.z += p3.x, b.w += p3.y;
}

/* The epilogue. stage_tile(stage, ld) writes the fp32 accumulators into shared memory (the ring,
 * free after the mainloop) at [tile row][tile column] with row stride ld, so that the stores are
 * whole 16-byte vectors of 8 columns, a warp's consecutive: AllGather stores y; ReduceScatter
 * stores a remote chunk's partial tile into its owner's inbox and signals it, or sums the local
 * chunk's tile with the other ranks' partials (in rank order, one rounding). ld = BN + 8: a
 * quarter-warp's float2 writes (4 rows x 32 bytes) land in distinct banks. */
template <class T, int BM, int BN, bool RS, class StageTile>
__device__ __forceinline__ void epilogue(const Params &p, const TileCoord &t, float *stage, StageTile &&stage_tile) {
    constexpr int LD = BN + 8, VECTORS = BM * BN / 8;
    const int N = p.N;
    __syncthreads(); /* every warp is done reading the ring */
    stage_tile(stage, LD);
    __syncthreads();

    /* the destination: y (AllGather: global rows; the local chunk: rows of the chunk) or slot
     * p.rank of the owner's inbox */
    uint4 *dst;
    int64_t row_base;
    if (!RS) dst = static_cast<uint4 *>(p.y), row_base = 0;
    else if (t.chunk == p.rank) dst = static_cast<uint4 *>(p.y), row_base = -(int64_t)t.c_row0;
    else dst = static_cast<uint4 *>(p.inbox[t.chunk]), row_base = (int64_t)p.rank * t.c_rows - t.c_row0;
    const bool sum = RS && t.chunk == p.rank;
    if (sum) {
        /* the other ranks' partials of this tile: one thread waits for each */
        bool ok = true;
        const int src = threadIdx.x;
        if (src < p.world && src != p.rank)
            ok = wait_signal(p.signals[p.rank] + ((int64_t)src * t.tiles_m + t.tile_m) * p.tiles_n + t.tile_n,
                             p.epoch, p.error, p.timeout_ns, FLUX_ERR_TIMEOUT | KIND_RS << 8 | (uint32_t)src);
        if (!__syncthreads_and(ok)) return;
    }
    const uint4 *inbox = static_cast<const uint4 *>(p.inbox[p.rank]);
#pragma unroll 4
    for (int v = threadIdx.x; v < VECTORS; v += THREADS) {
        const int r = v / (BN / 8), c = (v % (BN / 8)) * 8;
        const int row = t.m_begin + r, col = t.n0 + c;
        if (row >= t.m_end || col >= N) continue;
        float4 a = *reinterpret_cast<const float4 *>(stage + r * LD + c);
        float4 b = *reinterpret_cast<const float4 *>(stage + r * LD + c + 4);
        const int64_t at = ((row + row_base) * N + col) >> 3;
        if (sum) {
            /* every peer's vector requested before the first add (a loop over the runtime world
             * issued them one latency apart), then the adds in rank order */
            uint4 part[CUDA_FLUX_MAX_WORLD];
#pragma unroll
            for (int s = 0; s < CUDA_FLUX_MAX_WORLD; s++)
                if (s < p.world && s != p.rank)
                    part[s] = __ldcg(inbox + (((int64_t)s * t.c_rows + row - t.c_row0) * N + col) / 8);
#pragma unroll
            for (int s = 0; s < CUDA_FLUX_MAX_WORLD; s++)
                if (s < p.world && s != p.rank) add8<T>(a, b, part[s]);
        }
        dst[at] = pack8<T>(a, b);
    }
    if (RS && t.chunk != p.rank) {
        /* the partial tile is in rank t.chunk's inbox: its signal word */
        __syncthreads();
        if (threadIdx.x == 0) {
            __threadfence_system();
            store_release_sys(p.signals[t.chunk] + ((int64_t)p.rank * t.tiles_m + t.tile_m) * p.tiles_n + t.tile_n,
                              p.epoch);
        }
    }
}

/* wgmma (sm_90a): the shared-memory matrix descriptor of a K-major tile of 128-byte rows in the
 * 128-byte swizzle (8-row groups 1024 bytes apart; the leading offset is unused for it). */
__device__ __forceinline__ uint64_t smem_desc(const void *p) {
    const uint64_t addr = smem_addr(p);
    return ((addr & 0x3FFFF) >> 4) | (uint64_t)1 << 16 | (uint64_t)(1024 >> 4) << 32 | (uint64_t)1 << 62;
}
__device__ __forceinline__ void wgmma_fence(void) { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit(void) { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wgmma_wait(void) {
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
/* cp.async's writes (the generic proxy) made visible to wgmma's reads (the async proxy) */
__device__ __forceinline__ void fence_proxy_async(void) {
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

/* d[64 x N] += a (64 x 16, K-major in shared memory) · b (N x 16, K-major), fp32, one warpgroup */
template <int N, bool BF16>
__device__ __forceinline__ void wgmma_async(float (&d)[N / 2], uint64_t desc_a, uint64_t desc_b);
template <>
__device__ __forceinline__ void wgmma_async<256, false>(float (&d)[128], uint64_t desc_a,
                                                          uint64_t desc_b) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n256k16.f32.f16.f16 {"
                 "%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,"
                 "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,"
                 "%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,"
                 "%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63,"
                 "%64,%65,%66,%67,%68,%69,%70,%71,%72,%73,%74,%75,%76,%77,%78,%79,"
                 "%80,%81,%82,%83,%84,%85,%86,%87,%88,%89,%90,%91,%92,%93,%94,%95,"
                 "%96,%97,%98,%99,%100,%101,%102,%103,%104,%105,%106,%107,%108,%109,%110,%111,"
                 "%112,%113,%114,%115,%116,%117,%118,%119,%120,%121,%122,%123,%124,%125,%126,%127"
                 "}, %128, %129, p, 1, 1, 0, 0;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
                   "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]),
                   "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]),
                   "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]),
                   "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]),
                   "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]),
                   "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]),
                   "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]),
                   "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]),
                   "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]),
                   "+f"(d[71]), "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]),
                   "+f"(d[78]), "+f"(d[79]), "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]),
                   "+f"(d[85]), "+f"(d[86]), "+f"(d[87]), "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]),
                   "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]), "+f"(d[96]), "+f"(d[97]), "+f"(d[98]),
                   "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]), "+f"(d[104]), "+f"(d[105]),
                   "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]), "+f"(d[112]),
                   "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]),
                   "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]),
                   "+f"(d[127])
                 : "l"(desc_a), "l"(desc_b), "r"(1));
}
template <>
__device__ __forceinline__ void wgmma_async<256, true>(float (&d)[128], uint64_t desc_a,
                                                          uint64_t desc_b) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 {"
                 "%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,"
                 "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,"
                 "%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,"
                 "%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63,"
                 "%64,%65,%66,%67,%68,%69,%70,%71,%72,%73,%74,%75,%76,%77,%78,%79,"
                 "%80,%81,%82,%83,%84,%85,%86,%87,%88,%89,%90,%91,%92,%93,%94,%95,"
                 "%96,%97,%98,%99,%100,%101,%102,%103,%104,%105,%106,%107,%108,%109,%110,%111,"
                 "%112,%113,%114,%115,%116,%117,%118,%119,%120,%121,%122,%123,%124,%125,%126,%127"
                 "}, %128, %129, p, 1, 1, 0, 0;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
                   "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]),
                   "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]),
                   "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]),
                   "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]),
                   "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]),
                   "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]),
                   "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]),
                   "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]),
                   "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]),
                   "+f"(d[71]), "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]),
                   "+f"(d[78]), "+f"(d[79]), "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]),
                   "+f"(d[85]), "+f"(d[86]), "+f"(d[87]), "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]),
                   "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]), "+f"(d[96]), "+f"(d[97]), "+f"(d[98]),
                   "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]), "+f"(d[104]), "+f"(d[105]),
                   "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]), "+f"(d[112]),
                   "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]),
                   "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]),
                   "+f"(d[127])
                 : "l"(desc_a), "l"(desc_b), "r"(1));
}
template <>
__device__ __forceinline__ void wgmma_async<128, false>(float (&d)[64], uint64_t desc_a,
                                                          uint64_t desc_b) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 {"
                 "%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,"
                 "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,"
                 "%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,"
                 "%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63"
                 "}, %64, %65, p, 1, 1, 0, 0;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
                   "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]),
                   "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]),
                   "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]),
                   "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]),
                   "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]),
                   "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]),
                   "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]),
                   "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
                 : "l"(desc_a), "l"(desc_b), "r"(1));
}
template <>
__device__ __forceinline__ void wgmma_async<128, true>(float (&d)[64], uint64_t desc_a,
                                                          uint64_t desc_b) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {"
                 "%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,"
                 "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,"
                 "%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,"
                 "%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63"
                 "}, %64, %65, p, 1, 1, 0, 0;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
                   "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]),
                   "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]),
                   "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]),
                   "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]),
                   "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]),
                   "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]),
                   "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]),
                   "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
                 : "l"(desc_a), "l"(desc_b), "r"(1));
}
template <>
__device__ __forceinline__ void wgmma_async<64, false>(float (&d)[32], uint64_t desc_a,
                                                          uint64_t desc_b) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 {"
                 "%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,"
                 "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31"
                 "}, %32, %33, p, 1, 1, 0, 0;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
                   "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]),
                   "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]),
                   "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]),
                   "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
                 : "l"(desc_a), "l"(desc_b), "r"(1));
}
template <>
__device__ __forceinline__ void wgmma_async<64, true>(float (&d)[32], uint64_t desc_a,
                                                          uint64_t desc_b) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {"
                 "%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,"
                 "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31"
                 "}, %32, %33, p, 1, 1, 0, 0;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
                   "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]),
                   "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]),
                   "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]),
                   "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
                 : "l"(desc_a), "l"(desc_b), "r"(1));
}

/* The tile loop: 2 warpgroups, with BM = 128 each 64 rows x BN (m64nBNk16), with BM = 64
 * each 64 rows x BN/2 (m64n(BN/2)k16); STAGES slices in the ring.
 * INFLIGHT = 1: a slice's wgmma group is waited for one slice later, so the slice before the one
 * computed may still be read and STAGES - 2 slices are loaded ahead; INFLIGHT = 0: each slice's
 * group is waited for at once and STAGES - 1 are ahead, for two CTAs a SM, where one CTA's waits,
 * prologue and epilogue run under the other's MMAs. Only BM = 64, INFLIGHT = 1 is launched now
 * (configuration 0); BM = 128 with INFLIGHT = 0 was the 128 x 128 configuration, deleted when the
 * pick stopped taking it (docs/parallel.md has its last numbers). */
template <class T, int BM, int BN, int STAGES, int INFLIGHT, int MIN_CTAS, bool RS>
__global__ void __launch_bounds__(THREADS, MIN_CTAS) flux_gemm(const __grid_constant__ Params p) {
    static_assert(BM == 128 || BM == 64, "two warpgroups split the tile's rows (128) or its columns (64)");
    constexpr int AHEAD = STAGES - 1 - INFLIGHT; /* slices loaded ahead of the one computed */
    constexpr int WG_N = BM == 128 ? BN : BN / 2; /* a warpgroup's columns; its rows: 64 */
    constexpr int A_STAGE = BM * BK, B_STAGE = BN * BK; /* elements */
    static_assert(BM * (BN + 8) * sizeof(float) <= STAGES * (A_STAGE + B_STAGE) * sizeof(T),
                  "the epilogue's fp32 tile fits in the ring");
    extern __shared__ unsigned char smem_raw[];
    T *As = reinterpret_cast<T *>(((uintptr_t)smem_raw + 1023) & ~(uintptr_t)1023);
    T *Bs = As + STAGES * A_STAGE;
    __shared__ int ok_shared;

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, wg = tid >> 7;
    const TileCoord t = locate<BM, BN, RS>(p, blockIdx.x);
    const int K = p.K, N = p.N, KT = K / BK;
    const T *x = static_cast<const T *>(p.x);
    const T *w = static_cast<const T *>(p.w);

#pragma unroll
    for (int s = 0; s < AHEAD; s++)
        if (s < KT) load_slice<T, BN>(Bs + s * B_STAGE, w, t.n0, N, K, s);
    if (!wait_chunk<RS>(p, t, &ok_shared)) {
        cp_async_wait_all();
        return;
    }
#pragma unroll
    for (int s = 0; s < AHEAD; s++) {
        if (s < KT) load_slice<T, BM>(As + s * A_STAGE, x, t.m_begin, t.m_end, K, s);
        cp_async_commit();
    }

    const int wg_row = BM == 128 ? wg * 64 : 0, wg_col = BM == 128 ? 0 : wg * WG_N;
    float d[WG_N / 2];
#pragma unroll
    for (int i = 0; i < WG_N / 2; i++) d[i] = 0.0f;

    for (int kt = 0; kt < KT; kt++) {
        cp_async_wait_group<AHEAD - 1>();
        fence_proxy_async();
        __syncthreads();
        const int next = kt + AHEAD;
        if (next < KT) {
            load_slice<T, BM>(As + (next % STAGES) * A_STAGE, x, t.m_begin, t.m_end, K, next);
            load_slice<T, BN>(Bs + (next % STAGES) * B_STAGE, w, t.n0, N, K, next);
        }
        cp_async_commit();
        const T *a_s = As + (kt % STAGES) * A_STAGE + wg_row * BK;
        const T *b_s = Bs + (kt % STAGES) * B_STAGE + wg_col * BK;
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < BK / 16; kk++)
            wgmma_async<WG_N, std::is_same<T, __nv_bfloat16>::value>(d, smem_desc(a_s + kk * 16),
                                                                      smem_desc(b_s + kk * 16));
        wgmma_commit();
        wgmma_wait<INFLIGHT>();
    }
    wgmma_wait<0>();
    cp_async_wait_all();

    /* warp w of the warpgroup holds rows 16w + g and 16w + g + 8 (g = lane / 4), columns 8j + 2q
     * and 8j + 2q + 1 (q = lane % 4) in d[4j .. 4j + 3] */
    const int g = lane >> 2, q2 = (lane & 3) * 2;
    epilogue<T, BM, BN, RS>(p, t, reinterpret_cast<float *>(As), [&](float *stage, int ld) {
#pragma unroll
        for (int h = 0; h < 2; h++)
#pragma unroll
            for (int j = 0; j < WG_N / 8; j++)
                *reinterpret_cast<float2 *>(stage + (wg_row + (warp & 3) * 16 + g + h * 8) * ld + wg_col + j * 8 + q2) =
                    make_float2(d[4 * j + 2 * h], d[4 * j + 2 * h + 1]);
    });
}

/* ---- configurations 1 and 2: TMA, warp specialization, persistent CTAs ----------------------------
 *
 * 384 threads. Warpgroup 0 is the producer: one thread issues the TMA copies (cp.async.bulk.tensor,
 * boxes of 64 columns x 128 rows of x and x BN rows of w, 128-byte swizzle: the layout the cp.async
 * kernel builds by hand) into a ring of STAGES slices, each guarded by a "full" mbarrier (the
 * slice's bytes landed) and an "empty" one (both consumer warpgroups' wgmmas are done with it).
 * It keeps 32 registers (setmaxnreg.dec). Warpgroups 1 and 2 are consumers, rows 0-63 and 64-127
 * of the 128 x BN tile, m64nBNk16 from the ring; 224 registers each (setmaxnreg.inc). The CTA's
 * allocation is 160 a thread (__maxnreg__): 128 x 32 + 256 x 224 = 61440 of the 65536, so a
 * 128-thread kernel of up to 32 registers still fits beside it on a SM (the emulated peers'
 * arrivals kernel: with every SM's registers taken by the persistent grid, it would wait for the
 * grid, which waits for it, until the timeout).
 *
 * Persistent: min(SMs, tiles) CTAs, CTA c taking tiles c, c + grid, ... in the order locate()
 * numbers them, the order the data arrives (AllGather: the local chunk, then rank - 1, ...;
 * ReduceScatter: the local chunk's tiles, which wait for the peers' partials, last). Producer and
 * consumers walk the same sequence; a running slice count g (across tiles) gives the ring slot
 * g % STAGES and the phase (g / STAGES) & 1, so the producer loads the next tile's first slices
 * while the consumers are still in this tile's epilogue.
 *
 * The AllGather's wait sits in the producer: for a remote chunk's tile it first loads the w boxes
 * of the first min(STAGES, K/64) slices (their full barriers expect the x bytes too, so no
 * consumer starts early), then waits for the chunk's signal (acquire, then a proxy fence so the
 * async proxy's reads come after it), then loads the x boxes. On a timeout the error word is set
 * and the producer loads the rows anyway (the memory is there, the values stale): the consumers
 * never wait on a slice that is not coming, the grid drains, the caller gets the error and the
 * output is undefined. The x box may reach past the chunk (into the next chunk's rows, maybe still
 * in flight, or past M: zeros): those rows only make output rows that are never stored.
 *
 * Epilogue, per consumer warp (16 rows x BN), without a CTA barrier: 32 columns at a time through
 * a 16 x 32 fp32 block of its own in shared memory (row stride 40 floats: a half-warp's float2
 * writes cover the 32 banks once; its float4 reads are whole 128-byte rows), then 8-byte stores,
 * rows of 64 bytes a quarter-warp. Destinations as in epilogue(): y, slot `rank` of the owner's
 * inbox (then, after the consumers' named barrier, one thread's system fence and release of the
 * tile's signal), or, for a local tile, y = the tile plus the W - 1 peers' partials, one rounding.
 *
 * The ReduceScatter's partials come through the ring (PartialBoxes below): after a local tile's
 * last K slice the producer acquires the W - 1 sources' signals of the tile, in rank order, each
 * before its first box (then fence.proxy.async.global, as for the AllGather's chunk), and loads
 * their partial tiles from the local inbox as 128 x 64 boxes (a 3-D tensor map: column, row,
 * source slot), PER_SLOT boxes a ring slot, through the same full / empty barriers: the slot
 * count g runs on over them, so the slices and boxes of the next tile follow in the same ring.
 * The consumers wait on each slot's full barrier, add its boxes into their accumulators
 * (ldmatrix from the swizzled box: the fragment's own rows and columns), release the slot and
 * store y once. The waits left the consumers: the partials' reads are bulk copies in flight under
 * the tile's last MMAs, and the epilogue touches shared memory only. On a timeout (reported) the
 * producer loads the boxes anyway, as the AllGather's rows, and the output is undefined. */
constexpr int WS_THREADS = 384, WS_BM = 128;
constexpr int WS_PRODUCER_REGS = 32, WS_CONSUMER_REGS = 224;
constexpr int WS_EPI_COLS = 32, WS_EPI_LD = 40; /* a warp's epilogue block: 16 x 32 fp32, row stride 40 */
constexpr int WS_EPI_FLOATS = 16 * WS_EPI_LD;   /* per consumer warp */

__device__ __forceinline__ void tma_load_2d(void *dst, const CUtensorMap *map, uint64_t *bar, int col, int row) {
    asm volatile(
        "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4}], [%2];\n" ::"r"(
            smem_addr(dst)),
        "l"(map), "r"(smem_addr(bar)), "r"(col), "r"(row)
        : "memory");
}
/* a box of the 3-D map of the local inbox ([W][rows][N]: column, row, source slot) */
__device__ __forceinline__ void tma_load_3d(void *dst, const CUtensorMap *map, uint64_t *bar, int col, int row,
                                            int slot) {
    asm volatile(
        "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4, %5}], [%2];\n" ::"r"(
            smem_addr(dst)),
        "l"(map), "r"(smem_addr(bar)), "r"(col), "r"(row), "r"(slot)
        : "memory");
}
__device__ __forceinline__ void tma_prefetch_map(const CUtensorMap *map) {
    asm volatile("prefetch.tensormap [%0];\n" ::"l"(map) : "memory");
}
/* the generic proxy's view of global memory (the acquire of a signal) ordered before the async
 * proxy's reads (the TMA copies of the chunk it announced) */
__device__ __forceinline__ void fence_proxy_async_global(void) {
    asm volatile("fence.proxy.async.global;\n" ::: "memory");
}
__device__ __forceinline__ void named_bar_sync(int id, int threads) {
    asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
template <int REGS>
__device__ __forceinline__ void regs_dealloc(void) {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(REGS));
}
template <int REGS>
__device__ __forceinline__ void regs_alloc(void) {
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(REGS));
}

/* mbar_wait with a bound: false (and KIND_STALL in the error word) once the phase has not
 * completed within W + 1 times the signal timeout plus 1 s. No wait of a correct kernel comes
 * near it (a slice waits at most for one signal's timeout; a slot of partial boxes for the W - 1
 * sources' signals one after the other, each within its timeout); it turns a pipeline bug into an
 * error that cuda_flux_check reports instead of a hung device. */
__device__ __forceinline__ bool mbar_try_wait(uint64_t *bar, uint32_t parity) {
    uint32_t done;
    asm volatile("{\n.reg .pred q;\nmbarrier.try_wait.parity.shared::cta.b64 q, [%1], %2;\nselp.u32 %0, 1, 0, q;\n}\n"
                 : "=r"(done)
                 : "r"(smem_addr(bar)), "r"(parity)
                 : "memory");
    return done != 0;
}
__device__ __forceinline__ bool mbar_wait_bounded(uint64_t *bar, uint32_t parity, const Params &p) {
    if (mbar_try_wait(bar, parity)) return true;
    const uint64_t start = globaltimer(), limit = (uint64_t)(p.world + 1) * p.timeout_ns + 1000000000ull;
    while (!mbar_try_wait(bar, parity))
        if (globaltimer() - start > limit) {
            atomicCAS(p.error, 0u, FLUX_ERR_TIMEOUT | KIND_STALL << 8);
            return false;
        }
    return true;
}

/* 4 fp32 to 4 packed elements (8 bytes) */
template <class T>
__device__ __forceinline__ uint2 pack4(const float4 a) {
    return make_uint2(Pack<T>::pack(a.x, a.y), Pack<T>::pack(a.z, a.w));
}

/* The ReduceScatter's partial boxes (configurations 1-2): a local-chunk tile's W - 1 peer partial
 * tiles come through the ring as 128-row x 64-column boxes of the local inbox (16 KB, the 128-byte
 * swizzle of the x and w boxes), after the tile's K slices, as extra slices of the tile. A ring
 * slot holds 1 + BN / 128 boxes (its x part one, its w part BN / 128). Box i of the tile is source
 * index i / col_boxes (the peers in rank order, the local rank skipped), column box i % col_boxes;
 * col_boxes = the tile's 64-column boxes that reach into N (a box wholly past N is not loaded).
 * So the consumers add each element's W - 1 partials in rank order, as epilogue() does. */
template <int BN>
struct PartialBoxes {
    static constexpr int PER_SLOT = 1 + BN / 128;
    int n, col_boxes; /* boxes of the tile (0: not a local ReduceScatter tile), column boxes a source */
};
template <int BN, bool RS>
__device__ __forceinline__ PartialBoxes<BN> partial_boxes(const Params &p, const TileCoord &t) {
    PartialBoxes<BN> b{0, 0};
    if (RS && t.chunk == p.rank) {
        b.col_boxes = min(BN / BK, (p.N - t.n0 + BK - 1) / BK);
        b.n = (p.world - 1) * b.col_boxes;
    }
    return b;
}
/* where box k (0 .. PER_SLOT - 1) of ring slot s lies: the slot's x part, then its w part */
template <class T, int BN, int STAGES>
__device__ __forceinline__ T *box_at(T *As, T *Bs, int s, int k) {
    return k == 0 ? As + s * (WS_BM * BK) : Bs + s * (BN * BK) + (k - 1) * (WS_BM * BK);
}

/* d (a consumer warp's accumulators: rows r0 + g and r0 + g + 8 of the tile, g = lane / 4; columns
 * 8j + 2q, 8j + 2q + 1, q = lane % 4, in d[4j .. 4j + 3]) += column box cb of a partial box (128 x 64
 * in the 128-byte swizzle: 16-byte piece c of row r at c ^ (r & 7)). ldmatrix.x4 hands each lane
 * exactly that fragment of four 8 x 8 matrices (rows r0..r0+7 / r0+8..r0+15, pieces c / c + 1);
 * a matrix's 8 row pieces are 8 distinct bank groups under the swizzle. cb is a runtime value: the
 * branch per column box keeps d's indices constant (d stays in registers). */
template <class T, int BN>
__device__ __forceinline__ void add_box(float (&d)[BN / 2], const T *box, int cb, int r0, int lane) {
    const int row = r0 + (lane & 7) + ((lane >> 3) & 1) * 8, piece_hi = lane >> 4;
    const unsigned char *base = reinterpret_cast<const unsigned char *>(box) + row * 128;
#pragma unroll
    for (int c = 0; c < BN / BK; c++) {
        if (c != cb) continue;
#pragma unroll
        for (int jj = 0; jj < 8; jj += 2) {
            uint32_t v[4];
            ldmatrix_x4(v, base + (((jj + piece_hi) ^ (row & 7)) << 4));
#pragma unroll
            for (int m = 0; m < 4; m++) {
                /* matrix m: rows + 8 (m & 1), piece jj + (m >> 1) -> d[4j + 2h], j = 8c + jj + (m >> 1), h = m & 1 */
                const float2 f = Pack<T>::unpack(v[m]);
                const int at = 4 * (8 * c + jj + (m >> 1)) + 2 * (m & 1);
                d[at] += f.x, d[at + 1] += f.y;
            }
        }
    }
}

/* One consumer warp's share of the tile's epilogue: rows r0 .. r0 + 15 of the tile (r0 = 64 x its
 * warpgroup + 16 x its warp there), every column. d: the warp's wgmma accumulators (row g and
 * g + 8, g = lane / 4, columns 8j + 2q and 8j + 2q + 1, q = lane % 4, in d[4j .. 4j + 3]), the
 * peers' partials already added for a local ReduceScatter tile. */
template <class T, int BN, bool RS>
__device__ __forceinline__ void epilogue_ws(const Params &p, const TileCoord &t, const float (&d)[BN / 2], int r0,
                                            float *blk, int lane) {
    const int N = p.N;
    uint2 *dst;
    int64_t row_base; /* the destination's row of tile row r: t.m_begin + r + row_base (in units of N) */
    if (!RS) dst = static_cast<uint2 *>(p.y), row_base = 0;
    else if (t.chunk == p.rank) dst = static_cast<uint2 *>(p.y), row_base = -(int64_t)t.c_row0;
    else dst = static_cast<uint2 *>(p.inbox[t.chunk]), row_base = (int64_t)p.rank * t.c_rows - t.c_row0;
    const int g = lane >> 2, q2 = (lane & 3) * 2;
#pragma unroll
    for (int cb = 0; cb < BN / WS_EPI_COLS; cb++) {
#pragma unroll
        for (int jj = 0; jj < WS_EPI_COLS / 8; jj++) {
            const int j = cb * (WS_EPI_COLS / 8) + jj;
#pragma unroll
            for (int h = 0; h < 2; h++)
                *reinterpret_cast<float2 *>(blk + (g + 8 * h) * WS_EPI_LD + jj * 8 + q2) =
                    make_float2(d[4 * j + 2 * h], d[4 * j + 2 * h + 1]);
        }
        __syncwarp();
#pragma unroll
        for (int i = 0; i < 16 * WS_EPI_COLS / 4 / 32; i++) {
            const int v = i * 32 + lane, r = v / (WS_EPI_COLS / 4), c = (v % (WS_EPI_COLS / 4)) * 4;
            const int row = t.m_begin + r0 + r, col = t.n0 + cb * WS_EPI_COLS + c;
            /* N is a multiple of 8 and col of 4: col < N means the 4 columns are in */
            if (row < t.m_end && col < N)
                dst[((row + row_base) * N + col) / 4] =
                    pack4<T>(*reinterpret_cast<const float4 *>(blk + r * WS_EPI_LD + c));
        }
        __syncwarp(); /* the block is read before the next 32 columns overwrite it */
    }
}

template <class T, int BN, int STAGES, bool RS>
__global__ void __maxnreg__(160) flux_gemm_ws(const __grid_constant__ Params p,
                                               const __grid_constant__ CUtensorMap map_x, /* x [M, K], 64 x 128 boxes */
                                               const __grid_constant__ CUtensorMap map_w, /* w [N, K], 64 x BN boxes */
                                               const __grid_constant__ CUtensorMap map_p) /* ReduceScatter: the local
                                                 inbox [W][rows][N], 64 x 128 x 1 boxes; else unused */ {
    constexpr int BM = WS_BM, A_STAGE = BM * BK, B_STAGE = BN * BK; /* elements */
    constexpr uint32_t STAGE_BYTES = (uint32_t)(A_STAGE + B_STAGE) * sizeof(T);
    static_assert(128 * WS_PRODUCER_REGS + 256 * WS_CONSUMER_REGS <= WS_THREADS * 160, "the CTA's registers");
    extern __shared__ unsigned char smem_raw[];
    /* the swizzle acts on address bits: every slice starts on a 1024-byte boundary */
    T *As = reinterpret_cast<T *>(((uintptr_t)smem_raw + 1023) & ~(uintptr_t)1023); /* [STAGES][BM][64] */
    T *Bs = As + STAGES * A_STAGE;                                                   /* [STAGES][BN][64] */
    float *epi = reinterpret_cast<float *>(Bs + STAGES * B_STAGE);                   /* [8][16][WS_EPI_LD] */
    __shared__ __align__(8) uint64_t full[STAGES], empty[STAGES];

    const int tid = threadIdx.x, wg = tid >> 7, lane = tid & 31;
    const int n_tiles = p.tile0[p.world], KT = p.K / BK;
    if (tid == 0) {
#pragma unroll
        for (int s = 0; s < STAGES; s++) {
            mbar_init(&full[s], 1);  /* the producer's arrive.expect_tx; the rest is the copies' bytes */
            mbar_init(&empty[s], 8); /* lane 0 of each consumer warp */
        }
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    __syncthreads();

    if (wg == 0) {
        /* ---- producer ---- */
        regs_dealloc<WS_PRODUCER_REGS>();
        if (tid != 0) return;
        tma_prefetch_map(&map_x);
        tma_prefetch_map(&map_w);
        int g = 0; /* slices issued so far, all tiles */
        for (int tile = blockIdx.x; tile < n_tiles; tile += gridDim.x) {
            const TileCoord t = locate<BM, BN, RS>(p, tile);
            const int ahead = KT < STAGES ? KT : STAGES;
            /* w of the first slices first: they need no signal */
            for (int kt = 0; kt < ahead; kt++) {
                const int gk = g + kt, s = gk % STAGES;
                if (gk >= STAGES && !mbar_wait_bounded(&empty[s], ((gk / STAGES) + 1) & 1, p)) /* phase gk/STAGES - 1 */
                    return;
                mbar_arrive_expect_tx(&full[s], STAGE_BYTES);
                tma_load_2d(Bs + s * B_STAGE, &map_w, &full[s], kt * BK, t.n0);
            }
            if (!RS && t.chunk != p.rank) {
                /* false: timed out (reported) or another CTA did; the rows are loaded regardless */
                wait_signal(p.signals[p.rank] + t.chunk, p.epoch, p.error, p.timeout_ns,
                            FLUX_ERR_TIMEOUT | KIND_AG << 8 | (uint32_t)t.chunk);
                fence_proxy_async_global();
            }
            for (int kt = 0; kt < KT; kt++, g++) {
                const int s = g % STAGES;
                if (kt >= ahead) {
                    if (g >= STAGES && !mbar_wait_bounded(&empty[s], ((g / STAGES) + 1) & 1, p)) return;
                    mbar_arrive_expect_tx(&full[s], STAGE_BYTES);
                    tma_load_2d(Bs + s * B_STAGE, &map_w, &full[s], kt * BK, t.n0);
                }
                tma_load_2d(As + s * A_STAGE, &map_x, &full[s], kt * BK, t.m_begin);
            }
            /* a local ReduceScatter tile: the peers' partial tiles, PER_SLOT boxes a slot, each
             * source's signal acquired (then the proxy fence) before its first box is loaded. On a
             * timeout (reported) the boxes are loaded anyway, as the AllGather's rows are. */
            const PartialBoxes<BN> pb = partial_boxes<BN, RS>(p, t);
            int acquired = 0; /* sources (index among the peers, rank order) acquired */
            for (int i0 = 0; i0 < pb.n; i0 += PartialBoxes<BN>::PER_SLOT, g++) {
                const int s = g % STAGES, n = min(PartialBoxes<BN>::PER_SLOT, pb.n - i0);
                const int last = (i0 + n - 1) / pb.col_boxes;
                if (acquired <= last) {
                    for (; acquired <= last; acquired++) {
                        const int src = acquired < p.rank ? acquired : acquired + 1;
                        wait_signal(p.signals[p.rank] + ((int64_t)src * t.tiles_m + t.tile_m) * p.tiles_n + t.tile_n,
                                    p.epoch, p.error, p.timeout_ns, FLUX_ERR_TIMEOUT | KIND_RS << 8 | (uint32_t)src);
                    }
                    fence_proxy_async_global();
                }
                if (g >= STAGES && !mbar_wait_bounded(&empty[s], ((g / STAGES) + 1) & 1, p)) return;
                mbar_arrive_expect_tx(&full[s], (uint32_t)n * (WS_BM * BK) * sizeof(T));
                for (int k = 0; k < n; k++) {
                    const int i = i0 + k, src_i = i / pb.col_boxes, src = src_i < p.rank ? src_i : src_i + 1;
                    tma_load_3d(box_at<T, BN, STAGES>(As, Bs, s, k), &map_p, &full[s], t.n0 + (i % pb.col_boxes) * BK,
                                t.m_begin - t.c_row0, src);
                }
            }
        }
        return;
    }

    /* ---- consumers ---- */
    regs_alloc<WS_CONSUMER_REGS>();
    const int cw = wg - 1, warp = (tid >> 5) & 3;                   /* consumer warpgroup 0..1, its warp */
    float *blk = epi + (cw * 4 + warp) * WS_EPI_FLOATS;             /* this warp's epilogue block */
    float d[BN / 2];
    int g = 0;            /* slices consumed so far, all tiles */
    bool stalled = false; /* a full barrier timed out (reported): the rest runs without waiting, so
                           * every consumer warp still reaches the named barriers and the kernel ends */
    for (int tile = blockIdx.x; tile < n_tiles; tile += gridDim.x) {
        const TileCoord t = locate<BM, BN, RS>(p, tile);
#pragma unroll
        for (int i = 0; i < BN / 2; i++) d[i] = 0.0f;
        for (int kt = 0; kt < KT; kt++, g++) {
            const int s = g % STAGES;
            if (!stalled && !mbar_wait_bounded(&full[s], (g / STAGES) & 1, p)) stalled = true;
            const T *a_s = As + s * A_STAGE + cw * 64 * BK, *b_s = Bs + s * B_STAGE;
            wgmma_fence();
#pragma unroll
            for (int kk = 0; kk < BK / 16; kk++)
                wgmma_async<BN, std::is_same<T, __nv_bfloat16>::value>(d, smem_desc(a_s + kk * 16),
                                                                       smem_desc(b_s + kk * 16));
            wgmma_commit();
            /* the slice before this one is no longer read: its slot goes back to the producer */
            wgmma_wait<1>();
            if (kt > 0 && lane == 0) mbar_arrive(&empty[(g - 1) % STAGES]);
        }
        wgmma_wait<0>();
        if (lane == 0) mbar_arrive(&empty[(g - 1) % STAGES]);

        /* a local ReduceScatter tile: the peers' partial boxes, added as they land (rank order) */
        const PartialBoxes<BN> pb = partial_boxes<BN, RS>(p, t);
        for (int i0 = 0; i0 < pb.n; i0 += PartialBoxes<BN>::PER_SLOT, g++) {
            const int s = g % STAGES;
            if (!stalled && !mbar_wait_bounded(&full[s], (g / STAGES) & 1, p)) stalled = true;
#pragma unroll
            for (int k = 0; k < PartialBoxes<BN>::PER_SLOT; k++)
                if (i0 + k < pb.n)
                    add_box<T, BN>(d, box_at<T, BN, STAGES>(As, Bs, s, k), (i0 + k) % pb.col_boxes, cw * 64 + warp * 16,
                                   lane);
            /* the warp's reads of the slot (generic proxy) ordered before the TMA's next writes into
             * it (async proxy), as CUTLASS's sm90 epilogue does before releasing a TMA-loaded
             * source tile; then the slot goes back */
            fence_proxy_async();
            __syncwarp();
            if (lane == 0) mbar_arrive(&empty[s]);
        }

        epilogue_ws<T, BN, RS>(p, t, d, cw * 64 + warp * 16, blk, lane);
        if (RS && t.chunk != p.rank) {
            /* the partial tile is in rank t.chunk's inbox, every consumer thread's stores done: its signal */
            named_bar_sync(1, 256);
            if (tid == 128) {
                __threadfence_system();
                store_release_sys(p.signals[t.chunk] + ((int64_t)p.rank * t.tiles_m + t.tile_m) * p.tiles_n + t.tile_n,
                                  p.epoch);
            }
        }
    }
}

__global__ void signal_kernel(uint32_t *words, int64_t n, uint32_t value) {
    __threadfence_system();
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        store_release_sys(words + i, value);
}

__global__ void __launch_bounds__(128) arrivals_kernel(const cuda_flux_arrival *items, int32_t n) {
    const uint64_t start = globaltimer();
    for (int i = 0; i < n; i++) {
        const cuda_flux_arrival it = items[i];
        if (threadIdx.x == 0)
            while (globaltimer() - start < it.at_ns) __nanosleep(256);
        __syncthreads();
        const uint4 *src = static_cast<const uint4 *>(it.src);
        uint4 *dst = static_cast<uint4 *>(it.dst);
        for (uint64_t j = threadIdx.x; j < it.bytes / 16; j += blockDim.x) dst[j] = __ldcg(src + j);
        __syncthreads();
        __threadfence_system();
        for (uint32_t j = threadIdx.x; j < it.n_signals; j += blockDim.x) store_release_sys(it.signals + j, it.value);
        __syncthreads();
    }
}

/* The tile configurations (flux.h): the tile's rows and columns. */
constexpr int BM_OF[CUDA_FLUX_N_CONFIGS] = {64, 128, 128};
constexpr int BN_OF[CUDA_FLUX_N_CONFIGS] = {128, 256, 128};
constexpr int BM_MIN = 64, BN_MIN = 128; /* the smallest tiles: the ReduceScatter's signal words */
const char *const CONFIG_NAMES[CUDA_FLUX_N_CONFIGS] = {"wgmma 64x128x64 4 stages 2 CTAs/SM",
                                                       "tma warp-specialized persistent 128x256x64 4 stages",
                                                       "tma warp-specialized persistent 128x128x64 6 stages"};

/* Lets `kernel` take `smem` bytes of dynamic shared memory, once per device (the attribute is per
 * device and context); `attribute_set` is the kernel's own record of the devices done, one static
 * array per kernel instantiation (a template's statics would be shared by kernels of one type). */
nopad_status allow_dynamic_smem(int (&attribute_set)[CUDA_MAX_DEVICES], const void *kernel, size_t smem) {
    const int dev = cuda_current_device();
    if (dev >= 0 && cuda_cache_load(&attribute_set[dev])) return NOPAD_OK;
    const cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    if (e != cudaSuccess)
        return nopad_set_error(NOPAD_ERR_BACKEND, "flux gemm: %zu bytes of shared memory: %s", smem,
                               cudaGetErrorString(e));
    if (dev >= 0) cuda_cache_store(&attribute_set[dev], 1);
    return NOPAD_OK;
}

template <class T, int BM, int BN, int STAGES, int INFLIGHT, int MIN_CTAS, bool RS>
nopad_status launch(const Params &p, int blocks, cudaStream_t stream) {
    /* + 1024: the kernel aligns the ring to 1024 bytes (wgmma's swizzle atom) */
    constexpr size_t smem = (size_t)STAGES * (BM + BN) * BK * sizeof(T) + 1024;
    auto kernel = flux_gemm<T, BM, BN, STAGES, INFLIGHT, MIN_CTAS, RS>;
    static int attribute_set[CUDA_MAX_DEVICES];
    const nopad_status st = allow_dynamic_smem(attribute_set, reinterpret_cast<const void *>(kernel), smem);
    if (st != NOPAD_OK) return st;
    kernel<<<blocks, THREADS, smem, stream>>>(p);
    const cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess)
        return nopad_set_error(NOPAD_ERR_BACKEND, "flux gemm: launch of %d blocks: %s", blocks, cudaGetErrorString(e));
    return NOPAD_OK;
}

/* ---- host: the tensor maps of flux_gemm_ws ---- */

typedef CUresult (*encode_tiled_fn)(CUtensorMap *, CUtensorMapDataType, cuuint32_t, void *, const cuuint64_t *,
                                    const cuuint64_t *, const cuuint32_t *, const cuuint32_t *, CUtensorMapInterleave,
                                    CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill);

/* cuTensorMapEncodeTiled from the driver the runtime already loaded (libcuda is not linked); NULL
 * if it has none */
encode_tiled_fn tensor_map_encoder_fn; /* set once, under tensor_map_encoder_once */
pthread_once_t tensor_map_encoder_once = PTHREAD_ONCE_INIT;
void look_up_tensor_map_encoder(void) {
    void *fn = NULL;
    cudaDriverEntryPointQueryResult q;
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &q) == cudaSuccess &&
        q == cudaDriverEntryPointSuccess)
        tensor_map_encoder_fn = (encode_tiled_fn)fn;
    else
        cudaGetLastError();
}

/* Encodes a 16-bit tensor of `dims` dimensions (sizes[0] contiguous; strides[i]: bytes from one
 * index of dimension i + 1 to the next) read in `box` boxes, element strides 1, in the 128-byte
 * swizzle (a 64-element row of 128 bytes, wgmma's layout), elements past the end read as zeros.
 * `what` names the tensor in the error. A pure host function: no device work, fine inside graph
 * capture (the map is a kernel parameter). */
nopad_status encode_tiled(CUtensorMap *map, const char *what, const void *base, cuuint32_t dims,
                          const cuuint64_t *sizes, const cuuint64_t *strides, const cuuint32_t *box) {
    pthread_once(&tensor_map_encoder_once, look_up_tensor_map_encoder);
    if (!tensor_map_encoder_fn)
        return nopad_set_error(NOPAD_ERR_UNSUPPORTED, "flux gemm: the driver has no cuTensorMapEncodeTiled");
    const cuuint32_t elem_strides[3] = {1, 1, 1};
    const CUresult r = tensor_map_encoder_fn(map, CU_TENSOR_MAP_DATA_TYPE_UINT16, dims, const_cast<void *>(base),
                                             sizes, strides, box, elem_strides, CU_TENSOR_MAP_INTERLEAVE_NONE,
                                             CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                                             CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    if (r != CUDA_SUCCESS)
        return nopad_set_error(NOPAD_ERR_BACKEND,
                               "flux gemm: tensor map of %s (%u-D, sizes %llu x %llu x %llu from the innermost, "
                               "boxes %u x %u x %u): CUresult %d",
                               what, (unsigned)dims, (unsigned long long)sizes[0], (unsigned long long)sizes[1],
                               dims > 2 ? (unsigned long long)sizes[2] : 1ull, (unsigned)box[0], (unsigned)box[1],
                               dims > 2 ? (unsigned)box[2] : 1u, (int)r);
    return NOPAD_OK;
}

/* A row-major [rows, cols] 16-bit matrix (cols a multiple of 64, 16-byte aligned) as 64-column x
 * box_rows boxes; rows past the end read as zeros. */
nopad_status encode_map(CUtensorMap *map, const char *what, const void *base, int64_t rows, int32_t cols,
                        int box_rows) {
    const cuuint64_t sizes[2] = {(cuuint64_t)cols, (cuuint64_t)rows};
    const cuuint64_t strides[1] = {(cuuint64_t)cols * 2}; /* bytes from row to row */
    const cuuint32_t box[2] = {(cuuint32_t)BK, (cuuint32_t)box_rows};
    return encode_tiled(map, what, base, 2, sizes, strides, box);
}

/* The local ReduceScatter inbox, W slots of [rows, N] (N a multiple of 8, 16-byte aligned), as a
 * 3-D tensor (column, row, slot) of 64-column x 128-row x 1-slot boxes: a box's rows past the
 * slot's end and columns past N read as zeros (never the next slot's rows, which a peer may still
 * be writing). */
nopad_status encode_inbox_map(CUtensorMap *map, const void *base, int32_t rows, int32_t cols, int32_t world) {
    const cuuint64_t sizes[3] = {(cuuint64_t)cols, (cuuint64_t)rows, (cuuint64_t)world};
    const cuuint64_t strides[2] = {(cuuint64_t)cols * 2, (cuuint64_t)cols * 2 * (cuuint64_t)rows}; /* bytes */
    const cuuint32_t box[3] = {(cuuint32_t)BK, (cuuint32_t)WS_BM, 1};
    return encode_tiled(map, "the inbox", base, 3, sizes, strides, box);
}

template <class T, int BN, int STAGES, bool RS>
nopad_status launch_ws(const Params &p, int tiles, int max_ctas, cudaStream_t stream) {
    /* + 1024: the kernel aligns the ring to 1024 bytes (the swizzle atom) */
    constexpr size_t smem =
        (size_t)STAGES * (WS_BM + BN) * BK * sizeof(T) + 8 * WS_EPI_FLOATS * sizeof(float) + 1024;
    static_assert(smem <= 227 * 1024, "the ring and the epilogue blocks fit a SM's shared memory");
    CUtensorMap map_x, map_w, map_p;
    nopad_status st = encode_map(&map_x, "x", p.x, p.row0[p.world], p.K, WS_BM);
    if (st == NOPAD_OK) st = encode_map(&map_w, "w", p.w, p.N, p.K, BN);
    /* the peers' partials of the local chunk; without local rows or peers the kernel never reads it */
    const int32_t local_rows = p.row0[p.rank + 1] - p.row0[p.rank];
    if (st == NOPAD_OK && RS && local_rows > 0 && p.world > 1)
        st = encode_inbox_map(&map_p, p.inbox[p.rank], local_rows, p.N, p.world);
    else
        map_p = map_x;
    if (st != NOPAD_OK) return st;
    auto kernel = flux_gemm_ws<T, BN, STAGES, RS>;
    static int attribute_set[CUDA_MAX_DEVICES];
    st = allow_dynamic_smem(attribute_set, reinterpret_cast<const void *>(kernel), smem);
    if (st != NOPAD_OK) return st;
    const int sms = cuda_sm_count();
    int grid = sms > 0 && sms < tiles ? sms : tiles; /* persistent: one CTA a SM at most */
    if (max_ctas > 0 && max_ctas < grid) grid = max_ctas; /* any grid >= 1 takes every tile */
    kernel<<<grid, WS_THREADS, smem, stream>>>(p, map_x, map_w, map_p);
    const cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess)
        return nopad_set_error(NOPAD_ERR_BACKEND, "flux gemm: launch of %d persistent CTAs: %s", grid,
                               cudaGetErrorString(e));
    return NOPAD_OK;
}

template <class T, bool RS>
nopad_status launch_config(int config, const Params &p, int blocks, int max_ctas, cudaStream_t stream) {
    switch (config) {
    case 0: return launch<T, 64, 128, 4, 1, 2, RS>(p, blocks, stream);
    case 1: return launch_ws<T, 256, 4, RS>(p, blocks, max_ctas, stream);
    default: return launch_ws<T, 128, 6, RS>(p, blocks, max_ctas, stream);
    }
}

int64_t tiles_of(int32_t rows, int32_t n_out, int bm, int bn) {
    return ((int64_t)rows + bm - 1) / bm * (((int64_t)n_out + bn - 1) / bn);
}

/* Arguments shared by both kernels; fills the chunk offsets and the tile prefix of p. */
nopad_status prepare(const char *what, Params *p, nopad_dtype dtype, const cuda_flux_peers *peers,
                     const int32_t *rows, int32_t n_in, int32_t n_out, uint32_t epoch, int *config,
                     bool rs, int *blocks) {
    if (!peers || !rows || n_in <= 0 || n_out <= 0)
        return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT, "%s: NULL peers or rows, or K %d / N %d not positive", what,
                               n_in, n_out);
    const int W = peers->world;
    if (W < 1 || W > CUDA_FLUX_MAX_WORLD || peers->rank < 0 || peers->rank >= W)
        return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT, "%s: rank %d of world %d (world 1..%d)", what,
                               peers->rank, W, CUDA_FLUX_MAX_WORLD);
    if (dtype != NOPAD_DTYPE_F16 && dtype != NOPAD_DTYPE_BF16)
        return nopad_set_error(NOPAD_ERR_UNSUPPORTED, "%s: dtype must be F16 or BF16", what);
    if (n_in % BK || n_out % 8)
        return nopad_set_error(NOPAD_ERR_UNSUPPORTED, "%s: K (%d) must be a multiple of %d and N (%d) of 8", what,
                               n_in, BK, n_out);
    if (!peers->error) return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT, "%s: no error word", what);
    if (peers->max_ctas < 0)
        return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT, "%s: max_ctas %d (0: one CTA a SM, else > 0)", what,
                               (int)peers->max_ctas);
    if (*config == CUDA_FLUX_CONFIG_AUTO) *config = cuda_flux_pick(rows, W, n_in, n_out);
    if (*config < 0 || *config >= CUDA_FLUX_N_CONFIGS)
        return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT, "%s: no config %d", what, *config);
    const int bm = BM_OF[*config], bn = BN_OF[*config];
    *p = Params{};
    p->K = n_in, p->N = n_out, p->world = W, p->rank = peers->rank;
    p->tiles_n = (n_out + bn - 1) / bn;
    p->error = peers->error;
    p->timeout_ns = peers->timeout_ns ? peers->timeout_ns : CUDA_FLUX_DEFAULT_TIMEOUT_NS;
    p->epoch = epoch;
    int64_t m = 0;
    for (int d = 0; d < W; d++) {
        if (rows[d] < 0) return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT, "%s: rows[%d] = %d", what, d, rows[d]);
        p->row0[d] = (int32_t)m;
        m += rows[d];
        if (!peers->buffers[d] || !peers->signals[d])
            return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT, "%s: rank %d's buffer or signals are NULL", what, d);
        if ((uintptr_t)peers->buffers[d] & 15u)
            return nopad_set_error(NOPAD_ERR_UNSUPPORTED, "%s: rank %d's buffer not 16-byte aligned", what, d);
        p->inbox[d] = peers->buffers[d];
        p->signals[d] = peers->signals[d];
    }
    if (m > INT32_MAX) return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT, "%s: %lld rows", what, (long long)m);
    p->row0[W] = (int32_t)m;
    int64_t t = 0;
    for (int pos = 0; pos < W; pos++) {
        const int chunk = rs ? (peers->rank + 1 + pos) % W : (peers->rank - pos + W) % W;
        p->tile0[pos] = (int32_t)t;
        t += tiles_of(rows[chunk], n_out, bm, bn);
    }
    p->tile0[W] = (int32_t)t;
    if (t > INT32_MAX) return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT, "%s: %lld tiles", what, (long long)t);
    *blocks = (int)t;
    return NOPAD_OK;
}

} // namespace

extern "C" int cuda_flux_pick(const int32_t *rows, int32_t world, int32_t n_in, int32_t n_out) {
    /* Measured on an H200 (132 SMs, as the H100) at the LLaMA-3 8B/70B layers, the ReduceScatter's
     * partials through the TMA ring (bench/results/flux_2026-12-07c_H200, build C; derived by
     * tools/flux_rules.py from its JSON: 1.001x the fastest configuration of each shape on average,
     * 1.07x at worst, the fastest at 71 of 72 points in fp16 and 24 of 24 in bf16):
     * - fewer 128 x 128 tiles than half the SMs: 64 x 128 tiles, two CTAs a SM;
     * - else the persistent TMA kernel, 128 x 256 tiles unless 128 x 128 ones keep more of the
     *   last wave's SMs busy (by more than 10%: the 128 x 256 tile reads less of L2 a FLOP).
     * K no longer matters (n_in is unused): the old rule's 128 x 128 tiles at two CTAs a SM for
     * K < 2048 hid the ReduceScatter's partial reads of the epilogue; through the ring, the TMA
     * kernel is 1.2-1.7x faster there, and that configuration is deleted. On the H100 run of 2026-12-07d
     * (bench/results/flux_2026-12-07d_H100, fp16) the rule took the fastest of these three at 71
     * of 72 points with every chunk present (1.045x at the other: 8B o, T 1024, tp 8). */
    (void)n_in;
    int64_t tiles_256 = 0, tiles_128 = 0;
    for (int d = 0; d < world; d++)
        tiles_256 += tiles_of(rows[d], n_out, 128, 256), tiles_128 += tiles_of(rows[d], n_out, 128, 128);
    int sms = cuda_sm_count();
    if (sms < 1) sms = 1;
    if (tiles_128 < sms / 2) return 0;
    const int64_t waves_256 = (tiles_256 + sms - 1) / sms, waves_128 = (tiles_128 + sms - 1) / sms;
    /* busy_128 > 1.1 busy_256, busy = tiles / (SMs x waves) */
    return 10 * tiles_128 * waves_256 > 11 * tiles_256 * waves_128 ? CUDA_FLUX_CONFIG_TMA_128 : CUDA_FLUX_CONFIG_TMA_256;
}

extern "C" const char *cuda_flux_config_name(int config) {
    return config >= 0 && config < CUDA_FLUX_N_CONFIGS ? CONFIG_NAMES[config] : "?";
}

extern "C" nopad_status cuda_flux_ag_gemm(nopad_dtype dtype, void *y, const void *w, const cuda_flux_peers *peers,
                                          const int32_t *rows, int32_t n_in, int32_t n_out, uint32_t epoch,
                                          int config, cudaStream_t stream) {
    Params p;
    int blocks = 0;
    nopad_status st = prepare("flux all-gather+gemm", &p, dtype, peers, rows, n_in, n_out, epoch, &config, false,
                              &blocks);
    if (st != NOPAD_OK) return st;
    if (!y || !w || (((uintptr_t)y | (uintptr_t)w) & 15u))
        return nopad_set_error(!y || !w ? NOPAD_ERR_INVALID_ARGUMENT : NOPAD_ERR_UNSUPPORTED,
                               "flux all-gather+gemm: y or w NULL or not 16-byte aligned");
    p.x = peers->buffers[peers->rank], p.w = w, p.y = y;
    if (blocks == 0) return NOPAD_OK;
    return dtype == NOPAD_DTYPE_F16 ? launch_config<__half, false>(config, p, blocks, peers->max_ctas, stream)
                                    : launch_config<__nv_bfloat16, false>(config, p, blocks, peers->max_ctas, stream);
}

extern "C" nopad_status cuda_flux_gemm_rs(nopad_dtype dtype, void *y, const void *x, const void *w,
                                          const cuda_flux_peers *peers, const int32_t *rows, int32_t n_in,
                                          int32_t n_out, uint32_t epoch, int config, cudaStream_t stream) {
    Params p;
    int blocks = 0;
    nopad_status st = prepare("flux gemm+reduce-scatter", &p, dtype, peers, rows, n_in, n_out, epoch, &config,
                              true, &blocks);
    if (st != NOPAD_OK) return st;
    if (!y || !x || !w || (((uintptr_t)y | (uintptr_t)x | (uintptr_t)w) & 15u))
        return nopad_set_error(!y || !x || !w ? NOPAD_ERR_INVALID_ARGUMENT : NOPAD_ERR_UNSUPPORTED,
                               "flux gemm+reduce-scatter: y, x or w NULL or not 16-byte aligned");
    p.x = x, p.w = w, p.y = y;
    if (blocks == 0) return NOPAD_OK;
    return dtype == NOPAD_DTYPE_F16 ? launch_config<__half, true>(config, p, blocks, peers->max_ctas, stream)
                                    : launch_config<__nv_bfloat16, true>(config, p, blocks, peers->max_ctas, stream);
}

extern "C" nopad_status cuda_flux_ag_push(nopad_dtype dtype, const cuda_flux_peers *peers, const int32_t *rows,
                                          int32_t n_in, uint32_t epoch, cudaStream_t stream) {
    if (!peers || !rows || peers->world < 1 || peers->world > CUDA_FLUX_MAX_WORLD || peers->rank < 0 ||
        peers->rank >= peers->world || n_in <= 0)
        return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT, "flux all-gather push: bad peers, rows or K %d", n_in);
    const size_t es = dtype == NOPAD_DTYPE_F32 ? 4 : 2;
    int64_t row0 = 0;
    for (int d = 0; d < peers->rank; d++) row0 += rows[d];
    const size_t offset = (size_t)row0 * n_in * es, bytes = (size_t)rows[peers->rank] * n_in * es;
    const char *src = static_cast<const char *>(peers->buffers[peers->rank]) + offset;
    for (int i = 1; i < peers->world; i++) {
        const int to = (peers->rank + i) % peers->world;
        if (bytes) {
            const cudaError_t e = cudaMemcpyAsync(static_cast<char *>(peers->buffers[to]) + offset, src, bytes,
                                                  cudaMemcpyDefault, stream);
            if (e != cudaSuccess)
                return nopad_set_error(NOPAD_ERR_BACKEND, "flux all-gather push: copy to rank %d: %s", to,
                                       cudaGetErrorString(e));
        }
        nopad_status st = cuda_flux_signal(peers->signals[to] + peers->rank, 1, epoch, stream);
        if (st != NOPAD_OK) return st;
    }
    return NOPAD_OK;
}

extern "C" size_t cuda_flux_rs_inbox_bytes(nopad_dtype dtype, int32_t owner_rows, int32_t n_out, int32_t world) {
    return (size_t)world * owner_rows * n_out * (dtype == NOPAD_DTYPE_F32 ? 4 : 2);
}

extern "C" size_t cuda_flux_rs_signal_words(int32_t owner_rows, int32_t n_out, int32_t world) {
    return (size_t)world * tiles_of(owner_rows, n_out, BM_MIN, BN_MIN);
}

extern "C" void cuda_flux_rs_tiles(int config, int32_t owner_rows, int32_t n_out, int32_t *tiles_m,
                                   int32_t *tiles_n) {
    const int c = config >= 0 && config < CUDA_FLUX_N_CONFIGS ? config : 0;
    *tiles_m = (owner_rows + BM_OF[c] - 1) / BM_OF[c];
    const int bn = BN_OF[c];
    *tiles_n = (n_out + bn - 1) / bn;
}

extern "C" int64_t cuda_flux_rs_signal_index(int config, int32_t owner_rows, int32_t n_out, int32_t world,
                                             int32_t src, int32_t tile_m, int32_t tile_n) {
    (void)world;
    int32_t tm, tn;
    cuda_flux_rs_tiles(config, owner_rows, n_out, &tm, &tn);
    return ((int64_t)src * tm + tile_m) * tn + tile_n;
}

extern "C" nopad_status cuda_flux_check(const cuda_flux_peers *peers, cudaStream_t stream) {
    cudaError_t e = cudaStreamSynchronize(stream);
    if (e != cudaSuccess) return nopad_set_error(NOPAD_ERR_BACKEND, "flux: stream: %s", cudaGetErrorString(e));
    uint32_t word = 0;
    e = cudaMemcpy(&word, peers->error, sizeof word, cudaMemcpyDeviceToHost);
    if (e != cudaSuccess) return nopad_set_error(NOPAD_ERR_BACKEND, "flux: error word: %s", cudaGetErrorString(e));
    if (word == 0) return NOPAD_OK;
    const uint32_t zero = 0;
    cudaMemcpy(peers->error, &zero, sizeof zero, cudaMemcpyHostToDevice);
    const double ms = (peers->timeout_ns ? peers->timeout_ns : CUDA_FLUX_DEFAULT_TIMEOUT_NS) / 1e6;
    const unsigned kind = (word >> 8) & 0xff, who = word & 0xff;
    if (kind == KIND_STALL)
        return nopad_set_error(NOPAD_ERR_BACKEND,
                               "flux gemm on rank %d: the TMA pipeline stalled (an mbarrier phase never completed "
                               "within (world + 1) times the timeout plus 1 s: a kernel bug, not a late peer); the "
                               "output is undefined",
                               peers->rank);
    if (kind == KIND_AG)
        return nopad_set_error(NOPAD_ERR_BACKEND,
                               "flux all-gather+gemm on rank %d: the chunk of rank %u did not arrive within %.1f ms "
                               "(its signal never equalled the epoch); the output is undefined",
                               peers->rank, who, ms);
    return nopad_set_error(NOPAD_ERR_BACKEND,
                           "flux gemm+reduce-scatter on rank %d: the partial tiles of rank %u did not arrive within "
                           "%.1f ms (their signals never equalled the epoch); the output is undefined",
                           peers->rank, who, ms);
}

extern "C" nopad_status cuda_flux_signal(uint32_t *words, int64_t n, uint32_t value, cudaStream_t stream) {
    if (n <= 0) return NOPAD_OK;
    const int blocks = (int)((n + 255) / 256 < 64 ? (n + 255) / 256 : 64);
    signal_kernel<<<blocks, 256, 0, stream>>>(words, n, value);
    const cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) return nopad_set_error(NOPAD_ERR_BACKEND, "flux signal: %s", cudaGetErrorString(e));
    return NOPAD_OK;
}

extern "C" nopad_status cuda_flux_emulate_arrivals(const cuda_flux_arrival *items, int32_t n, cudaStream_t stream) {
    if (n <= 0) return NOPAD_OK;
    arrivals_kernel<<<1, 128, 0, stream>>>(items, n);
    const cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) return nopad_set_error(NOPAD_ERR_BACKEND, "flux arrivals: %s", cudaGetErrorString(e));
    return NOPAD_OK;
}

extern "C" int cuda_flux_wins(int all_gather, int32_t n_tokens, int32_t n_in, int32_t n_out, int32_t world) {
    if (world < 2 || world > CUDA_FLUX_MAX_WORLD || n_in % BK || n_out % 8) return 0;
    /* The collective's time over the GEMM's grows as (W - 1) / W over the side it does not move
     * (AllGather: N, each rank's x chunk is T/W x K; ReduceScatter: K, each partial chunk T/W x N):
     * the rule bounds that side times W / (W - 1), and the AllGather's tokens. Fitted by
     * tools/flux_rules.py on an H100, fp16, the other ranks' data arriving as over a 400 GB/s link
     * (bench/results/flux_2026-12-07d_H100): at T = 4096 and 16384 the 48 points whose delayed runs
     * left the emulated arrivals' CTA an SM (the persistent grid on 131 of 132: the _ctas JSON); at
     * T = 1024 only the full-grid run exists (11 of its 24 grids leave an SM free). It matches the sign
     * of the share hidden at 43 of the 48 (64 of all 72) and saves 7.09 of the 7.27 ms a perfect
     * rule would over the 48; it takes one loser (8B qkv, T 4096, tp 8: -12%):
     * - AllGather from 4096 tokens where that side is <= 20480. At 1024 tokens the fused kernel's
     *   own cost (0.99-1.34x the GEMM's) outweighs the collective: it lost at 10 of 12 points. Beyond
     *   20480 (gate|up at tp 2) the collective is < 7% of the GEMM and the share hidden is noise
     *   around zero (8B: -191% and -73%, 70B: +111% and +6%).
     * - ReduceScatter from 1024 tokens (the fewest measured: decode steps stay unfused) where that
     *   side is <= 12288: all 20 such points of T 4096 and 16384 gain, +26% to +130%, and the 10 of
     *   T 1024. Its old upper bound of 8192 tokens came from T = 16384's losses, which were the
     *   emulation's (the arrivals CTA waiting for an SM). Above 12288 are the down GEMMs at tp 2
     *   (8B: side 14336, +2% and -91%; 70B: 28672, -223% and +18%), where the collective is 6-13% of
     *   the GEMM. */
    const int64_t side = (int64_t)(all_gather ? n_out : n_in) * world / (world - 1);
    if (all_gather) return n_tokens >= 4096 && side <= 20480;
    return n_tokens >= 1024 && side <= 12288;
}
