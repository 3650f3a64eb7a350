/* CUDA: fused variable-length attention, head size 64, in the FlashAttention-3 structure (Hopper).
 *
 * Same contract and math as wgmma.cu (read that first: 128-byte swizzled tiles, S = Q K^T
 * with both operands in shared memory, O += P V with P from registers, lazy online softmax). What
 * this kernel changes is who does what inside a CTA:
 *
 *  - warpgroup 0 is the producer. One warp of it issues TMA bulk tensor copies
 *    (cp.async.bulk.tensor) of the Q tile and of each K / V tile into a ring of STAGES shared-memory
 *    slots. A slot's "full" mbarrier completes when its bytes have landed; the consumers release it
 *    through its "empty" mbarrier once their wgmmas have read it. No CTA-wide barrier per tile, no
 *    load instructions in the math warps. The producer keeps 40 registers (setmaxnreg.dec).
 *  - warpgroups 1..NWG are consumers, each owning 64 query rows (setmaxnreg.inc: 232 registers
 *    with two consumer warpgroups, 160 with three).
 *    Inside one warpgroup S_j = Q K_j^T and O += P_(j-1) V_(j-1) are issued together and the
 *    softmax of S_j runs while P V is still on the tensor cores (intra-warpgroup overlap).
 *    Optionally (PINGPONG) the consumer warpgroups take turns issuing their wgmmas through named
 *    barriers, so one warpgroup's softmax runs under the other's matrix products.
 *    The row sums of P are not added on the CUDA cores: P V multiplies P by [V | ones] (N = 72),
 *    so columns 64..71 of the accumulator carry them (see sOnes). Per key tile the softmax is then
 *    one max, one FFMA, one exp2 and half a pack per score (docs/attention.md).
 *
 * The TMA tensor map covers the packed qkv as a 2-D tensor [rows, 3*heads*64] (16-bit elements,
 * 64 x 64 boxes, 128-byte swizzle): Q of head h is column block h, K is heads + h, V 2*heads + h.
 * It is encoded on the host for every call (a pure host function, no device sync, fine inside CUDA
 * graph capture) through cudaGetDriverEntryPointByVersion, so libcuda is not linked, and passed as a
 * __grid_constant__ kernel parameter.
 *
 * Rows past a sequence's end: a tile of sequence s may cover rows of sequence s+1 (the TMA box does
 * not know sequence boundaries). Those keys are masked to -inf in S (P = 0; V rows of other tokens
 * are finite) and those query rows are never written. The host does not know T = cu_seqlens[B]
 * (it lives on the device), so the map's row extent is the bound n_seqs * max_seqlen; a tile that
 * would reach past row T is copied by the producer warp with plain loads instead (rows >= T become
 * zeros), so nothing past the qkv buffer is ever read. */
#include <cuda.h>  // CUtensorMap and its enums only: the encoder comes from the runtime's entry point
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <pthread.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#include "backend/cuda/attention/common.cuh"
#include "backend/cuda/attention/kernels.h"
#include "backend/cuda/common.h"
#include "util/knobs.h"
#include "backend/cuda/ptx_helpers.cuh"
#include "backend/cuda/attention/wgmma_helpers.cuh"

/* ---- mbarrier, TMA, named barriers, register reallocation -------------------------------------- */

/* 2-D tile copy global -> shared (box from the tensor map at element coordinates col, row) */
static __device__ __forceinline__ void tma_load_2d(void *dst, const CUtensorMap *map, uint64_t *bar, int col, int row) {
    asm volatile(
        "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4}], [%2];\n" ::"r"(
            smem_addr(dst)),
        "l"(map), "r"(smem_addr(bar)), "r"(col), "r"(row)
        : "memory");
}
static __device__ __forceinline__ void named_bar_sync(int id, int threads) {
    asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
static __device__ __forceinline__ void named_bar_arrive(int id, int threads) {
    asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
template <int REGS>
static __device__ __forceinline__ void regs_dealloc(void) {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(REGS));
}
template <int REGS>
static __device__ __forceinline__ void regs_alloc(void) {
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(REGS));
}

/* ---- producer: one tile of ROWS rows x 64 columns into a swizzled slot ---------------------------- */

constexpr int FA3_BOX_ROWS = 64;  // rows per TMA box (64 rows x 128 bytes = 8 KB)

/* Run by the whole producer warp. Rows [row0, row0 + ROWS) of column block col of qkv, landing as
 * ROWS swizzled 128-byte rows at dst; `bar` completes when they are there. */
template <int ROWS>
static __device__ __forceinline__ void produce_tile(uint16_t *dst, uint64_t *bar, const CUtensorMap *map,
                                                    const uint16_t *qkv, size_t row_stride, int col, int row0,
                                                    int t_rows, int lane) {
    if (row0 + ROWS <= t_rows) {
        if (lane == 0) {
            mbar_arrive_expect_tx(bar, ROWS * 64 * 2);
#pragma unroll
            for (int b = 0; b < ROWS / FA3_BOX_ROWS; b++)
                tma_load_2d(dst + b * FA3_BOX_ROWS * 64, map, bar, col, row0 + b * FA3_BOX_ROWS);
        }
        return;
    }
    /* The tile reaches past the last row of qkv (the last sequence's last tiles). Boxes wholly
     * below row T still come by TMA; the box that straddles T is copied with plain 16-byte loads,
     * zeros for its rows >= T, and the boxes past T are zero-filled, all in the same swizzled
     * layout. The loads are issued four at a time: one load per iteration waited ~1 us of memory
     * latency 32 times per tile, which made every item of the last sequence ~25 us late (ncu: a
     * few SMs busy 40% longer than the rest at 16 x 1024). The proxy fence makes these
     * generic-proxy stores visible to the wgmmas (async proxy) that wait on `bar`; the phase
     * completes once this arrival is made and the TMA boxes have landed. */
    const int tma_boxes = t_rows > row0 ? min((t_rows - row0) / FA3_BOX_ROWS, ROWS / FA3_BOX_ROWS) : 0;
    constexpr int BATCH = 4;
    for (int c0 = tma_boxes * FA3_BOX_ROWS * 8 + lane; c0 < ROWS * 8; c0 += 32 * BATCH) {
        uint4 v[BATCH];
#pragma unroll
        for (int u = 0; u < BATCH; u++) {
            const int c = c0 + 32 * u, r = c >> 3, ch = c & 7;
            v[u] = make_uint4(0u, 0u, 0u, 0u);
            if (c < ROWS * 8 && row0 + r < t_rows)
                v[u] = *reinterpret_cast<const uint4 *>(qkv + (size_t)(row0 + r) * row_stride + col + ch * 8);
        }
#pragma unroll
        for (int u = 0; u < BATCH; u++) {
            const int c = c0 + 32 * u, r = c >> 3, ch = c & 7;
            if (c < ROWS * 8) *reinterpret_cast<uint4 *>(dst + r * 64 + ((ch ^ (r & 7)) << 3)) = v[u];
        }
    }
    fence_proxy_async();
    __syncwarp();
    if (lane == 0) {
        mbar_arrive_expect_tx(bar, tma_boxes * FA3_BOX_ROWS * 64 * 2);
        for (int b = 0; b < tma_boxes; b++)
            tma_load_2d(dst + b * FA3_BOX_ROWS * 64, map, bar, col, row0 + b * FA3_BOX_ROWS);
    }
}

/* keeps the packing of P (plain conversions) from sinking past wgmma.fence into the wgmma issue */
template <int KS>
static __device__ __forceinline__ void fence_pa(uint32_t (*pa)[4]) {
#pragma unroll
    for (int k = 0; k < KS; k++)
#pragma unroll
        for (int i = 0; i < 4; i++) asm volatile("" : "+r"(pa[k][i])::"memory");
}

/* keeps a value computed here: the compiler would otherwise sink it past a barrier to its use */
static __device__ __forceinline__ void pin_reg(uint32_t &r) { asm volatile("" : "+r"(r)); }

/* ---- work list: longest sequences first (persistent launch) -------------------------------------- */

constexpr int ONES_ELEMS = 16 * 64;  // the ones block: 16 rows (one k16 step) of one 64-column atom

constexpr int FA3_MAX_PERSIST_SEQS = 1024;  // sequences a persistent launch sorts in shared memory
constexpr int FA3_LEN_BUCKETS = 256;        // sort key: key tiles of the sequence, clamped

/* The persistent grid takes work items (sequence, head, query tile) in the order: sequences by
 * decreasing length (each CTA counting-sorts cu_seqlens into shared memory at start, stably, so
 * every CTA builds the same order; no host sync), then head, then query tile. Items are handed out
 * dynamically: a CTA's producer warp takes the next one from a global counter when it is ready to
 * load another Q tile, so the longest items start first and whichever CTA frees up first takes
 * the next (greedy list scheduling, as the hardware does with one CTA per item, but without a CTA
 * launched per empty tile). */
struct Fa3Schedule {
    int order[FA3_MAX_PERSIST_SEQS];       // sequences, longest first
    int prefix[FA3_MAX_PERSIST_SEQS + 1];  // work items before position p of `order`
    int bucket[FA3_LEN_BUCKETS];
};

template <int THREADS, int BLOCK_M, int BLOCK_N>
static __device__ void build_schedule(Fa3Schedule &sc, const int32_t *cu_seqlens, int n_seqs, int n_heads, int tid) {
    for (int b = tid; b < FA3_LEN_BUCKETS; b += THREADS) sc.bucket[b] = 0;
    __syncthreads();
    for (int i = tid; i < n_seqs; i += THREADS) {
        const int len = cu_seqlens[i + 1] - cu_seqlens[i];
        atomicAdd(&sc.bucket[min((len + BLOCK_N - 1) / BLOCK_N, FA3_LEN_BUCKETS - 1)], 1);
    }
    __syncthreads();
    if (tid < 32) {  // bucket offsets, longest bucket first: 8 buckets a lane, then a warp scan
        constexpr int PER = FA3_LEN_BUCKETS / 32;
        int c[PER], sum = 0;
#pragma unroll
        for (int k = 0; k < PER; k++) {
            c[k] = sc.bucket[FA3_LEN_BUCKETS - 1 - (tid * PER + k)];
            sum += c[k];
        }
        int incl = sum;
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
            const int v = __shfl_up_sync(0xffffffffu, incl, o);
            if (tid >= o) incl += v;
        }
        int off = incl - sum;
#pragma unroll
        for (int k = 0; k < PER; k++) {
            sc.bucket[FA3_LEN_BUCKETS - 1 - (tid * PER + k)] = off;
            off += c[k];
        }
    }
    __syncthreads();
    /* stable scatter by one warp, 32 sequences at a time (ranks among equal keys from
     * __match_any_sync): every CTA must build the same order, which atomics would not guarantee */
    if (tid < 32) {
        for (int base = 0; base < n_seqs; base += 32) {
            const int i = base + tid;
            const int key = i < n_seqs
                                ? min((cu_seqlens[i + 1] - cu_seqlens[i] + BLOCK_N - 1) / BLOCK_N, FA3_LEN_BUCKETS - 1)
                                : -1;
            const unsigned peers = __match_any_sync(0xffffffffu, key);
            const int rank = __popc(peers & ((1u << tid) - 1u));
            if (key >= 0) sc.order[sc.bucket[key] + rank] = i;
            __syncwarp();
            if (key >= 0 && rank == 0) sc.bucket[key] += __popc(peers);
            __syncwarp();
        }
    }
    __syncthreads();
    /* prefix of items (query tiles x heads) along `order`: consecutive chunks per thread, a scan of
     * the chunk sums through warp shuffles and one shared array of warp totals (in `bucket`) */
    constexpr int CHUNK = (FA3_MAX_PERSIST_SEQS + THREADS - 1) / THREADS;
    int items[CHUNK], sum = 0;
#pragma unroll
    for (int k = 0; k < CHUNK; k++) {
        const int p = tid * CHUNK + k;
        items[k] = 0;
        if (p < n_seqs) {
            const int s = sc.order[p];
            items[k] = (cu_seqlens[s + 1] - cu_seqlens[s] + BLOCK_M - 1) / BLOCK_M * n_heads;
        }
        sum += items[k];
    }
    const int lane = tid & 31, warp = tid >> 5;
    int incl = sum;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        const int v = __shfl_up_sync(0xffffffffu, incl, o);
        if (lane >= o) incl += v;
    }
    __syncthreads();  // everyone is done reading bucket offsets
    if (lane == 31) sc.bucket[warp] = incl;
    __syncthreads();
    int base = 0;
    for (int w = 0; w < warp; w++) base += sc.bucket[w];
    int run = base + incl - sum;
#pragma unroll
    for (int k = 0; k < CHUNK; k++) {
        const int p = tid * CHUNK + k;
        if (p < n_seqs) sc.prefix[p] = run;
        run += items[k];
    }
    if (tid == THREADS - 1) sc.prefix[n_seqs] = run;
    __syncthreads();
}

/* ---- the kernel --------------------------------------------------------------------------------- */

/* Called once per persistent CTA, after its last take from the counter: the last CTA to finish
 * sets the counter back to zero for the next launch (launches that share a counter run one after
 * another: see cuda_attention_fa3). */
static __device__ __forceinline__ void sched_finish(int32_t *sched_counter) {
    __threadfence();
    if (atomicAdd(&sched_counter[1], 1) == (int)(gridDim.x * gridDim.y * gridDim.z) - 1) {
        atomicExch(&sched_counter[0], 0);
        atomicExch(&sched_counter[1], 0);
    }
}

/* named barrier ids (0 is __syncthreads): the ping-pong turn of consumer warpgroup c is 1 + c, the
 * output staging of consumer warpgroup c is 1 + NWG + c.
 *
 * PERSIST: grid = one CTA per SM, items from the sorted list above (n_seqs <= FA3_MAX_PERSIST_SEQS),
 * taken one at a time through sched_counter; else one CTA per (query tile, head, sequence) as in the
 * other kernels. The producer announces each item to the consumers in item_info, next to its Q tile.
 * The shared-memory ring keeps running across a CTA's items, and Q is double-buffered: the producer
 * takes the next item and prefetches its Q and K/V while the consumers finish the current one; a Q
 * buffer (and its item_info) is reused once every consumer thread is done with it (empty_q). */
template <int NWG, int BLOCK_N, int STAGES, bool BF16, bool PINGPONG, bool PERSIST, bool CAUSAL>
__global__ void __launch_bounds__((NWG + 1) * 128, 1)
attention_fa3_kernel(const __grid_constant__ CUtensorMap qkv_map,  // qkv as [rows, 3*heads*64], 64x64 boxes
                     uint16_t *__restrict__ out,                   // [T, heads*64]
                     const uint16_t *__restrict__ qkv,             // [T, 3, heads, 64]
                     const int32_t *__restrict__ cu_seqlens, int seq_offset, int n_seqs_total, int n_heads,
                     float scale_log2, float rescale_thresh,
                     int32_t *__restrict__ sched_counter) {  // PERSIST: {next item, CTAs done}, zero at launch
    constexpr int D = 64;
    /* a template argument, so that the non-causal kernel's key mask is the short one (softmax_tile) */
    constexpr bool causal = CAUSAL;
    constexpr int BLOCK_M = 64 * NWG;
    constexpr int THREADS = (NWG + 1) * 128;
    constexpr int NT = BLOCK_N / 8;   // n8 column groups of S
    constexpr int KS = BLOCK_N / 16;  // k16 steps of P V
    constexpr int TILE = BLOCK_N * 64;  // elements of one K or V slot
    constexpr int OA = 36;              // O accumulators a thread: 64 columns of O + 8 of row sums
    /* register split after setmaxnreg (the 64K file): 40 for the producer warpgroup (with 24 its
     * addressing spilled), the rest for the consumers: 128*40 + 256*232 = 64512,
     * 128*32 + 384*160 = 65536 */
    constexpr int PRODUCER_REGS = NWG == 2 ? 40 : 32;
    constexpr int CONSUMER_REGS = NWG == 2 ? 232 : 160;
    /* Q buffers: a persistent CTA loads the next item's Q while its consumers finish the current one */
    constexpr int QBUF = PERSIST ? 2 : 1;

    /* launched early behind the QKV GEMM: nothing is read before it ends; the next kernel may be
     * scheduled only after that (wgmma.cu says why) */
    wait_for_upstream_grid();
    allow_dependent_launch();
    extern __shared__ uint16_t smem_raw[];
    /* the swizzle is applied to absolute address bits: tiles start on 1024-byte boundaries */
    const uint32_t pad = (1024u - (smem_addr(smem_raw) & 1023u)) & 1023u;
    uint16_t *sQ = smem_raw + pad / 2;     // [QBUF][BLOCK_M][64]
    uint16_t *sK = sQ + QBUF * BLOCK_M * 64;  // [STAGES][BLOCK_N][64]
    uint16_t *sV = sK + STAGES * TILE;     // [STAGES][BLOCK_N][64]
    /* [16][64] ones: the second column atom of every P V product, whose columns 64..71 then hold
     * the row sums of P (see the consumers) */
    uint16_t *sOnes = sV + STAGES * TILE;
    /* the persistent schedule sits behind the tiles */
    Fa3Schedule &sched = *reinterpret_cast<Fa3Schedule *>(sOnes + ONES_ELEMS);
    __shared__ __align__(8) uint64_t full_q[QBUF], empty_q[QBUF], full_k[STAGES], full_v[STAGES], empty_k[STAGES],
        empty_v[STAGES];
    __shared__ int4 item_info[QBUF];  // (start, len, head, m0) of the item whose Q is in buffer b

    const int tid = threadIdx.x, wg = tid / 128, warp = (tid / 32) % 4, lane = tid % 32;
    int n_items;
    if constexpr (PERSIST) {
        build_schedule<THREADS, BLOCK_M, BLOCK_N>(sched, cu_seqlens, n_seqs_total, n_heads, tid);
        n_items = sched.prefix[n_seqs_total];
        if ((int)blockIdx.x >= n_items) {  // the whole CTA, before any barrier; it takes no item
            if (tid == 0) sched_finish(sched_counter);
            return;
        }
    } else {
        const int seq = seq_offset + blockIdx.z;
        const int m_block = causal ? (int)(gridDim.x - 1 - blockIdx.x) : (int)blockIdx.x;
        if (m_block * BLOCK_M >= cu_seqlens[seq + 1] - cu_seqlens[seq]) return;  // whole CTA
        n_items = 1;
    }
    /* item w -> (start, len, head, m0) */
    auto item_at = [&](int w) -> int4 {
        int seq, m_block, head, start, len;
        if constexpr (PERSIST) {
            int lo = 0, hi = n_seqs_total - 1;  // last position p with prefix[p] <= w
            while (lo < hi) {
                const int mid = (lo + hi + 1) >> 1;
                if (sched.prefix[mid] <= w) lo = mid;
                else hi = mid - 1;
            }
            seq = sched.order[lo];
            start = cu_seqlens[seq];
            len = cu_seqlens[seq + 1] - start;
            const int mb = (len + BLOCK_M - 1) / BLOCK_M, r = w - sched.prefix[lo];
            head = r / mb;
            m_block = r - head * mb;
            if (causal) m_block = mb - 1 - m_block;  // the longest rows of the causal triangle first
        } else {
            seq = seq_offset + blockIdx.z;
            head = blockIdx.y;
            m_block = causal ? (int)(gridDim.x - 1 - blockIdx.x) : (int)blockIdx.x;
            start = cu_seqlens[seq];
            len = cu_seqlens[seq + 1] - start;
        }
        return make_int4(start, len, head, m_block * BLOCK_M);
    };
    const int hidden = n_heads * D;

    {
        /* the ones block, written through the generic proxy and read by wgmma (async proxy) after
         * the barrier below */
        const uint32_t one2 = BF16 ? 0x3F803F80u : 0x3C003C00u;
        for (int i = tid; i < ONES_ELEMS / 2; i += THREADS) reinterpret_cast<uint32_t *>(sOnes)[i] = one2;
        fence_proxy_async();
    }
    if (tid == 0) {
#pragma unroll
        for (int b = 0; b < QBUF; b++) {
            mbar_init(&full_q[b], 1);
            /* one arrival per consumer thread: each has read item_info (and the staged output)
             * itself, and its own release orders those reads before the producer's next write */
            mbar_init(&empty_q[b], 128 * NWG);
        }
#pragma unroll
        for (int s = 0; s < STAGES; s++) {
            mbar_init(&full_k[s], 1);
            mbar_init(&full_v[s], 1);
            mbar_init(&empty_k[s], 4 * NWG);
            mbar_init(&empty_v[s], 4 * NWG);
        }
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    __syncthreads();

    if (wg == 0) {
        /* ---- producer ---- */
        regs_dealloc<PRODUCER_REGS>();
        if (warp != 0) return;
        const int t_rows = cu_seqlens[n_seqs_total];  // rows of qkv: nothing at or past it is read
        const size_t row_stride = (size_t)3 * hidden;
        int g = 0;  // K/V tiles produced so far (ring slot / phase)
        for (int it = 0;; it++) {  // items this CTA has taken
            const int qb = it % QBUF;
            if (it >= QBUF) mbar_wait(&empty_q[qb], ((it / QBUF) + 1) & 1);  // phase it/QBUF - 1
            int w = it;
            if constexpr (PERSIST) {
                if (lane == 0) w = atomicAdd(&sched_counter[0], 1);
                w = __shfl_sync(0xffffffffu, w, 0);
                if (w >= n_items) {  // no work left: tell the consumers (len = -1) and leave
                    if (lane == 0) {
                        item_info[qb] = make_int4(0, -1, 0, 0);
                        mbar_arrive(&full_q[qb]);
                        sched_finish(sched_counter);
                    }
                    return;
                }
            }
            const int4 item = item_at(w);
            const int start = item.x, len = item.y, head = item.z, m0 = item.w;
            /* the consumers read the item from here once full_q[qb] completes (the arrival that
             * completes it comes after this store, and mbarrier arrivals release) */
            if (lane == 0) item_info[qb] = item;
            const int n_end = causal ? min(len, m0 + BLOCK_M) : len;
            const int n_tiles = (n_end + BLOCK_N - 1) / BLOCK_N;
            const int col_q = head * D, col_k = hidden + head * D, col_v = 2 * hidden + head * D;
            produce_tile<BLOCK_M>(sQ + qb * BLOCK_M * 64, &full_q[qb], &qkv_map, qkv, row_stride, col_q, start + m0,
                                  t_rows, lane);
            for (int j = 0; j < n_tiles; j++, g++) {
                const int s = g % STAGES;
                const uint32_t wait_parity = ((g / STAGES) + 1) & 1;  // phase (g/STAGES - 1) of the slot
                if (g >= STAGES) mbar_wait(&empty_k[s], wait_parity);
                produce_tile<BLOCK_N>(sK + s * TILE, &full_k[s], &qkv_map, qkv, row_stride, col_k,
                                      start + j * BLOCK_N, t_rows, lane);
                if (g >= STAGES) mbar_wait(&empty_v[s], wait_parity);
                produce_tile<BLOCK_N>(sV + s * TILE, &full_v[s], &qkv_map, qkv, row_stride, col_v,
                                      start + j * BLOCK_N, t_rows, lane);
            }
            if constexpr (!PERSIST) return;
        }
    }

    /* ---- consumers ---- */
    regs_alloc<CONSUMER_REGS>();
    const int cw = wg - 1;  // consumer warpgroup 0..NWG-1
    /* ping-pong: warpgroup cw waits for its turn on barrier 1 + cw, then passes the turn on to the
     * next; the last one opens the first turn of warpgroup 0. Every warpgroup takes the same number
     * of turns, so the last one's final hand-over has no taker: one CTA = one item skips it, a
     * persistent CTA's warpgroup 0 takes it after its last item. */
    const bool pingpong = PINGPONG && NWG > 1;
    const int turn_bar = 1 + cw, next_bar = 1 + (cw + 1) % NWG;
    const bool last_wg = cw == NWG - 1;
    if (pingpong && last_wg) named_bar_arrive(1, 256);

    /* wgmma descriptors as low words (sw128_desc_lo) of this warpgroup's rows of Q buffer 0 and of
     * K / V slot 0; another buffer, slot or k-step is a fixed offset in 16-byte units. Built once
     * here: rebuilt from pointers at every tile they cost ~70 integer instructions, issued while
     * this warpgroup held the ping-pong turn. */
    const uint32_t desc_q0 = sw128_desc_lo(sQ + cw * 64 * 64), desc_k0 = sw128_desc_lo(sK);
    constexpr uint32_t Q_BUF_STEP = BLOCK_M * 64 * 2 / 16, SLOT_STEP = TILE * 2 / 16;
    constexpr uint32_t QK_KSTEP = 16 * 2 / 16;  // 16 columns of a K-major row
    /* P V reads B = [V | ones] (N = 72): V's rows as one 64-column swizzle atom, the ones as the
     * next atom, which the descriptor places at its leading byte offset (bits 16..29, MN-major
     * operand) from the start address. Moving the start by k (16-byte units: another slot, or the
     * next 16 rows) moves that offset by -k, so the ones stay where they are: both fields change
     * by one multiply-add, without a borrow between them (the ones lie past every V slot). */
    const uint32_t ones_offset = (smem_addr(sOnes) - smem_addr(sV)) >> 4;
    const uint32_t desc_v0 = (sw128_desc_lo(sV) & 0xFFFFu) | (ones_offset << 16);
    constexpr uint32_t V_KSTEP = 16 * 64 * 2 / 16;  // 16 rows of V
    constexpr uint32_t V_MOVE = 1u - (1u << 16);    // start + k, leading offset - k (mod 2^32)

    int g = 0;  // K/V tiles consumed so far
    for (int it = 0;; it++) {
        const int qb = it % QBUF;
        mbar_wait(&full_q[qb], (it / QBUF) & 1);
        /* the item's length and first row now; its start and head only for the output store, read
         * again there, so that they do not hold registers through the loop (the persistent kernel
         * spilled inside the loop otherwise) */
        const int len = item_info[qb].y, m0 = item_info[qb].w;
        if (PERSIST && len < 0) break;  // no work left
        const int n_end = causal ? min(len, m0 + BLOCK_M) : len;
        const int n_tiles = (n_end + BLOCK_N - 1) / BLOCK_N;
        const bool hand_over_last = PERSIST || !last_wg;  // see ping-pong above
        const int wrow0 = m0 + cw * 64 + warp * 16;  // first query row of this warp
        const int row_a = wrow0 + lane / 4;          // this thread's rows: row_a, row_a + 8
        uint16_t *q_wg = sQ + qb * BLOCK_M * 64 + cw * 64 * 64;  // this warpgroup's 64 query rows
        const uint32_t desc_q = desc_q0 + (uint32_t)qb * Q_BUF_STEP;

        if (m0 + cw * 64 >= len) {
            /* All 64 rows of this warpgroup lie past the sequence's end (the last query tile of a
             * sequence shorter than a multiple of BLOCK_M): no matrix products, no softmax, no
             * output. It still takes its ping-pong turns and releases the ring slots as the others
             * do, waiting for each slot to fill first, so that its arrivals always count towards the
             * phase the others are in. */
            for (int j = 0; j <= n_tiles; j++) {
                const int gk = g + j, gv = g + j - 1;
                if (j > 0) mbar_wait(&full_v[gv % STAGES], (gv / STAGES) & 1);
                if (j < n_tiles) mbar_wait(&full_k[gk % STAGES], (gk / STAGES) & 1);
                if (pingpong) {
                    named_bar_sync(turn_bar, 256);
                    if (j < n_tiles || hand_over_last) named_bar_arrive(next_bar, 256);
                }
                if (lane == 0) {
                    if (j < n_tiles) mbar_arrive(&empty_k[gk % STAGES]);
                    if (j > 0) mbar_arrive(&empty_v[gv % STAGES]);
                }
            }
            g += n_tiles;
            mbar_arrive(&empty_q[qb]);
            if constexpr (!PERSIST) break;
            continue;
        }

        /* [O | l] [64 x 72] of this warpgroup: n8 column group t holds o[4t..4t+3]; group 8 is
         * P times the ones block, the running row sums (o[32], o[33]: row_a; o[34], o[35]:
         * row_a + 8), rescaled with O and summed over the P values as rounded for the product */
        float o[OA];
#pragma unroll
        for (int i = 0; i < OA; i++) o[i] = 0.0f;
        float m_run[2] = {-INFINITY, -INFINITY}, alpha[2];
        float l_run[2] = {0.0f, 0.0f};  // softmax_tile's argument, unused: the sums are o[32..35]
        float s[BLOCK_N / 2];
        uint32_t pa[KS][4];

        /* prologue: S_0 and its softmax */
        {
            const int sk = g % STAGES;
            uint32_t desc_k = desc_k0 + (uint32_t)sk * SLOT_STEP;
            pin_reg(desc_k);
            mbar_wait(&full_k[sk], (g / STAGES) & 1);
            if (pingpong) named_bar_sync(turn_bar, 256);
#pragma unroll
            for (int i = 0; i < BLOCK_N / 2; i++) s[i] = 0.0f;
            fence_regs<BLOCK_N / 2>(s);
            wgmma_fence();
#pragma unroll
            for (int kk = 0; kk < D / 16; kk++)
                wgmma_ss<BF16, BLOCK_N>(s, sw128_desc_from_lo(desc_q + kk * QK_KSTEP),
                                        sw128_desc_from_lo(desc_k + kk * QK_KSTEP), kk > 0);
            wgmma_commit();
            if (pingpong) named_bar_arrive(next_bar, 256);
            wgmma_wait0();
            fence_regs<BLOCK_N / 2>(s);
            if (lane == 0) mbar_arrive(&empty_k[sk]);
            softmax_tile<NT, false, CAUSAL>(s, m_run, l_run, alpha, scale_log2, rescale_thresh, 0, len, wrow0,
                                            row_a, causal, lane);
            pack_p<BF16, KS>(pa, s);
        }

        for (int j = 1; j < n_tiles; j++) {
            const int gk = g + j, gv = g + j - 1;
            const int sk = gk % STAGES, sv = gv % STAGES;
            /* computed before the turn is taken (pin_reg keeps them there) */
            uint32_t desc_k = desc_k0 + (uint32_t)sk * SLOT_STEP;
            uint32_t desc_v = desc_v0 + (uint32_t)sv * SLOT_STEP * V_MOVE;
            pin_reg(desc_k);
            pin_reg(desc_v);
            /* V_(j-1) was requested before K_j, so waiting for it first costs nothing and keeps the
             * branch of the wait out of the two wgmma issues below */
            mbar_wait(&full_v[sv], (gv / STAGES) & 1);
            mbar_wait(&full_k[sk], (gk / STAGES) & 1);
            if (pingpong) named_bar_sync(turn_bar, 256);
            fence_regs<BLOCK_N / 2>(s);
            fence_regs<OA>(o);
            fence_pa<KS>(pa);
            wgmma_fence();
#pragma unroll
            for (int kk = 0; kk < D / 16; kk++)
                wgmma_ss<BF16, BLOCK_N>(s, sw128_desc_from_lo(desc_q + kk * QK_KSTEP),
                                        sw128_desc_from_lo(desc_k + kk * QK_KSTEP), kk > 0);
            wgmma_commit();
#pragma unroll
            for (int kk = 0; kk < KS; kk++)
                wgmma_rs72<BF16>(o, pa[kk], sw128_desc_from_lo(desc_v + kk * V_KSTEP * V_MOVE));
            wgmma_commit();
            if (pingpong) named_bar_arrive(next_bar, 256);
            asm volatile("wgmma.wait_group.sync.aligned 1;\n" ::: "memory");  // S_j done, P V may run on
            fence_regs<BLOCK_N / 2>(s);
            if (lane == 0) mbar_arrive(&empty_k[sk]);
            softmax_tile<NT, false, CAUSAL>(s, m_run, l_run, alpha, scale_log2, rescale_thresh, j * BLOCK_N, len,
                                            wrow0, row_a, causal, lane);
            wgmma_wait0();
            fence_regs<OA>(o);
            if (lane == 0) mbar_arrive(&empty_v[sv]);
            if (__any_sync(0xffffffffu, alpha[0] != 1.0f || alpha[1] != 1.0f))
                rescale_o<OA / 4>(o, alpha);
            pack_p<BF16, KS>(pa, s);
        }
        /* epilogue: the last P V */
        {
            const int gv = g + n_tiles - 1, sv = gv % STAGES;
            uint32_t desc_v = desc_v0 + (uint32_t)sv * SLOT_STEP * V_MOVE;
            pin_reg(desc_v);
            mbar_wait(&full_v[sv], (gv / STAGES) & 1);
            if (pingpong) named_bar_sync(turn_bar, 256);
            fence_regs<OA>(o);
            fence_pa<KS>(pa);
            wgmma_fence();
#pragma unroll
            for (int kk = 0; kk < KS; kk++)
                wgmma_rs72<BF16>(o, pa[kk], sw128_desc_from_lo(desc_v + kk * V_KSTEP * V_MOVE));
            wgmma_commit();
            if (pingpong && hand_over_last) named_bar_arrive(next_bar, 256);
            wgmma_wait0();
            fence_regs<OA>(o);
            if (lane == 0) mbar_arrive(&empty_v[sv]);
        }
        g += n_tiles;

        float inv[2];
#pragma unroll
        for (int r = 0; r < 2; r++) {
            const float l = o[32 + 2 * r];  // the whole row's sum (the product summed over all keys)
            inv[r] = row_sum_inverse(l);
        }
        /* stage O in this warpgroup's Q rows (swizzled, conflict-free) once all four warps' wgmmas
         * that read them are done */
        named_bar_sync(1 + NWG + cw, 128);
        uint16_t *sO = q_wg;
        const int r0 = warp * 16 + lane / 4;
#pragma unroll
        for (int t = 0; t < 8; t++) {
            const int col = t * 8 + (lane & 3) * 2;
            *reinterpret_cast<uint32_t *>(sO + sw_off(r0, col)) = pack2<BF16>(o[4 * t] * inv[0], o[4 * t + 1] * inv[0]);
            *reinterpret_cast<uint32_t *>(sO + sw_off(r0 + 8, col)) =
                pack2<BF16>(o[4 * t + 2] * inv[1], o[4 * t + 3] * inv[1]);
        }
        __syncwarp();
        const int start = *reinterpret_cast<volatile const int *>(&item_info[qb].x);
        const int head = *reinterpret_cast<volatile const int *>(&item_info[qb].z);
#pragma unroll
        for (int c = lane; c < 16 * 8; c += 32) {  // this warp's 16 rows, 8 chunks of 16 bytes each
            const int r = warp * 16 + (c >> 3), ch = c & 7;
            const int row = m0 + cw * 64 + r;
            if (row < len)
                *reinterpret_cast<uint4 *>(out + (size_t)(start + row) * hidden + (size_t)head * D + ch * 8) =
                    *reinterpret_cast<const uint4 *>(sO + r * 64 + ((ch ^ (r & 7)) << 3));
        }
        /* this thread is done with its rows of sQ and with item_info: the next item may land there */
        mbar_arrive(&empty_q[qb]);
        if constexpr (!PERSIST) break;
    }
    /* the last warpgroup's final hand-over (persistent CTAs): take it, so no arrival is left pending */
    if (PERSIST && pingpong && cw == 0) named_bar_sync(1, 256);
}

/* ---- host: tensor map and launch ------------------------------------------------------------------ */

typedef CUresult (*encode_tiled_fn)(CUtensorMap *, CUtensorMapDataType, cuuint32_t, void *, const cuuint64_t *,
                                    const cuuint64_t *, const cuuint32_t *, const cuuint32_t *, CUtensorMapInterleave,
                                    CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill);

/* cuTensorMapEncodeTiled from the driver the runtime already loaded; NULL if it has none */
static encode_tiled_fn tensor_map_encoder_fn; /* set once, under tensor_map_encoder_once */
static pthread_once_t tensor_map_encoder_once = PTHREAD_ONCE_INIT;

static void look_up_tensor_map_encoder(void) {
    void *p = NULL;
    cudaDriverEntryPointQueryResult q;
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault, &q) == cudaSuccess &&
        q == cudaDriverEntryPointSuccess)
        tensor_map_encoder_fn = (encode_tiled_fn)p;
    else
        cudaGetLastError();
}

static encode_tiled_fn tensor_map_encoder(void) {
    pthread_once(&tensor_map_encoder_once, look_up_tensor_map_encoder);
    return tensor_map_encoder_fn;
}

template <int NWG, int BLOCK_N, int STAGES, bool BF16, bool PINGPONG, bool PERSIST, bool CAUSAL>
static cudaError_t launch_fa3(const CUtensorMap &map, void *out, const void *qkv, const int32_t *cu_seqlens,
                              int32_t n_seqs, int32_t max_seqlen, int32_t n_heads, float scale_log2,
                              float rescale_thresh, int32_t *sched_counter, bool pdl, cudaStream_t stream) {
    constexpr int BLOCK_M = 64 * NWG;
    /* Q + K/V ring + alignment slack (+ the sorted work list) */
    const size_t tiles = (size_t)((PERSIST ? 2 : 1) * BLOCK_M + 2 * STAGES * BLOCK_N) * 64 + ONES_ELEMS;
    const size_t smem = tiles * sizeof(uint16_t) + 1024 + (PERSIST ? sizeof(Fa3Schedule) : 0);
    auto kernel = attention_fa3_kernel<NWG, BLOCK_N, STAGES, BF16, PINGPONG, PERSIST, CAUSAL>;
    /* above 48 KB a kernel must opt in: once per instantiation and device */
    static int attr_set[CUDA_MAX_DEVICES];
    const int dev = cuda_current_device();
    if (dev < 0 || !cuda_cache_load(&attr_set[dev])) {
        cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
        if (e != cudaSuccess) return e;
        if (dev >= 0) cuda_cache_store(&attr_set[dev], 1);
    }
    const unsigned m_blocks = (unsigned)((max_seqlen + BLOCK_M - 1) / BLOCK_M);
    if constexpr (PERSIST) {
        const int n_sm = cuda_sm_count();
        /* one CTA per SM (registers allow no more), fewer when there are fewer items at most */
        const uint64_t most_items = (uint64_t)m_blocks * (uint64_t)n_heads * (uint64_t)n_seqs;
        const unsigned grid = (unsigned)(most_items < (uint64_t)n_sm ? most_items : (uint64_t)n_sm);
        cudaError_t e = launch_maybe_pdl(kernel, dim3(grid), dim3((NWG + 1) * 128), smem, stream,
                                         pdl, map, (uint16_t *)out, (const uint16_t *)qkv,
                                         cu_seqlens, 0, n_seqs, n_heads, scale_log2, rescale_thresh, sched_counter);
        return e == cudaSuccess ? cudaGetLastError() : e;
    } else {
        for (int32_t s0 = 0; s0 < n_seqs; s0 += 65535) {
            const int32_t ns = n_seqs - s0 < 65535 ? n_seqs - s0 : 65535;
            dim3 grid(m_blocks, (unsigned)n_heads, (unsigned)ns);
            cudaError_t e = launch_maybe_pdl(kernel, grid, dim3((NWG + 1) * 128), smem, stream,
                                             pdl, map, (uint16_t *)out,
                                             (const uint16_t *)qkv, cu_seqlens, s0, n_seqs, n_heads, scale_log2,
                                             rescale_thresh, (int32_t *)nullptr);
            if (e == cudaSuccess) e = cudaGetLastError();
            if (e != cudaSuccess) return e;
        }
        return cudaSuccess;
    }
}

/* run-time knobs -> template arguments */
struct Fa3Args {
    const CUtensorMap *map;
    void *out;
    const void *qkv;
    const int32_t *cu_seqlens;
    int32_t n_seqs, max_seqlen, n_heads;
    float scale_log2, rescale_thresh;
    int causal;
    int32_t *counter;  // the persistent kernel's item counter (NULL: no persistent launch)
    bool pdl;          // launched with programmatic stream serialisation
    cudaStream_t st;
};
template <int NWG, int STAGES, bool BF16, bool PP, bool CAUSAL>
static cudaError_t fa3_persist(const Fa3Args &a, bool persist) {
    if (persist)
        return launch_fa3<NWG, 128, STAGES, BF16, PP, true, CAUSAL>(*a.map, a.out, a.qkv, a.cu_seqlens, a.n_seqs,
                                                                    a.max_seqlen, a.n_heads, a.scale_log2,
                                                                    a.rescale_thresh, a.counter, a.pdl, a.st);
    return launch_fa3<NWG, 128, STAGES, BF16, PP, false, CAUSAL>(*a.map, a.out, a.qkv, a.cu_seqlens, a.n_seqs,
                                                                 a.max_seqlen, a.n_heads, a.scale_log2,
                                                                 a.rescale_thresh, nullptr, a.pdl, a.st);
}
template <int NWG, int STAGES, bool BF16, bool PP>
static cudaError_t fa3_causal(const Fa3Args &a, bool persist) {
    return a.causal ? fa3_persist<NWG, STAGES, BF16, PP, true>(a, persist)
                    : fa3_persist<NWG, STAGES, BF16, PP, false>(a, persist);
}
template <int NWG, int STAGES, bool BF16>
static cudaError_t fa3_pingpong(const Fa3Args &a, bool pp, bool persist) {
    return pp ? fa3_causal<NWG, STAGES, BF16, true>(a, persist) : fa3_causal<NWG, STAGES, BF16, false>(a, persist);
}
template <int NWG, bool BF16>
static cudaError_t fa3_stages(const Fa3Args &a, int stages, bool pp, bool persist) {
    return stages == 3 ? fa3_pingpong<NWG, 3, BF16>(a, pp, persist) : fa3_pingpong<NWG, 2, BF16>(a, pp, persist);
}

/* Tile shape and schedule (docs/attention.md): three consumer warpgroups (192 query rows), 128-key
 * tiles, two K/V stages, ping-pong on, persistent where the caller gave a workspace (as fast as one
 * CTA per item at 2048 tokens, faster below, and no CTAs launched for tiles past a sequence's end).
 * NOPAD_FMHA_FA3_WG (2|3), NOPAD_FMHA_FA3_STAGES (2|3), NOPAD_FMHA_FA3_PINGPONG (0|1),
 * NOPAD_FMHA_FA3_PERSIST (0|1) override. */
static int fa3_setting(int which) {
    switch (which) {
    case 0: return knob_int(KNOB_FMHA_FA3_WG) == 2 ? 2 : 3;
    case 1: return knob_int(KNOB_FMHA_FA3_STAGES) == 3 ? 3 : 2;
    case 2: return knob_int(KNOB_FMHA_FA3_PINGPONG) != 0;
    default: return knob_int(KNOB_FMHA_FA3_PERSIST) != 0;
    }
}

int cuda_attention_fa3_persistent(int32_t n_seqs, int32_t max_seqlen, int32_t n_heads, const void *workspace) {
    /* the in-CTA sort holds FA3_MAX_PERSIST_SEQS sequences; item indices must fit an int */
    const int rows = 64 * fa3_setting(0);
    const uint64_t most_items = (uint64_t)((max_seqlen + rows - 1) / rows) * (uint64_t)n_heads * (uint64_t)n_seqs;
    return fa3_setting(3) && workspace && n_seqs <= FA3_MAX_PERSIST_SEQS && most_items < (1ull << 31);
}

template <bool BF16>
static cudaError_t dispatch_fa3(const Fa3Args &a) {
    const int nwg = fa3_setting(0), stages = fa3_setting(1);
    const bool pingpong = fa3_setting(2);
    const bool use_persist = cuda_attention_fa3_persistent(a.n_seqs, a.max_seqlen, a.n_heads, a.counter);
    return nwg == 2 ? fa3_stages<2, BF16>(a, stages, pingpong, use_persist)
                    : fa3_stages<3, BF16>(a, stages, pingpong, use_persist);
}

cudaError_t cuda_attention_fa3(int bf16, void *out, const void *qkv, const int32_t *cu_seqlens, int32_t n_seqs,
                               int32_t max_seqlen, int32_t n_heads, float scale, float rescale_thresh, int causal,
                               int pdl, void *workspace, void *stream) {
    encode_tiled_fn encode = tensor_map_encoder();
    if (!encode) return cudaErrorNotSupported;
    /* qkv as a 2-D tensor: columns 3*heads*64 (innermost), rows bounded by n_seqs * max_seqlen (>= T;
     * the kernel never lets TMA touch rows >= T, see the file comment) */
    const uint64_t row_bound = (uint64_t)n_seqs * (uint64_t)max_seqlen;
    const cuuint64_t dims[2] = {(cuuint64_t)3 * (cuuint64_t)n_heads * 64,
                                (cuuint64_t)(row_bound < 0xFFFFFFFFull ? row_bound : 0xFFFFFFFFull)};
    const cuuint64_t strides[1] = {(cuuint64_t)3 * (cuuint64_t)n_heads * 64 * sizeof(uint16_t)};  // bytes, row 1
    const cuuint32_t box[2] = {64, FA3_BOX_ROWS};
    const cuuint32_t elem_strides[2] = {1, 1};
    CUtensorMap map;
    if (encode(&map, CU_TENSOR_MAP_DATA_TYPE_UINT16, 2, const_cast<void *>(qkv), dims, strides, box, elem_strides,
               CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
               CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) != CUDA_SUCCESS)
        return cudaErrorNotSupported;
    const Fa3Args args = {&map, out, qkv, cu_seqlens, n_seqs, max_seqlen, n_heads, scale * 1.4426950408889634f,
                          rescale_thresh, causal, (int32_t *)workspace, pdl != 0, (cudaStream_t)stream};
    return bf16 ? dispatch_fa3<true>(args) : dispatch_fa3<false>(args);
}
