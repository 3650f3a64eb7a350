/* Flux: the tensor-parallel communication fused into the GEMM's tiles (Hopper, fp16 / bf16).
 *
 * Two kernels, one tile loop (flux.cu), y = x · wᵀ with w [N, K] K-contiguous as in the linear op:
 *
 * - AllGather+GEMM (before a column-parallel GEMM): the token rows of x are spread over the W ranks,
 *   rank d holding chunk d, rows [row0(d), row0(d) + rows[d]). Each rank's chunk lands in every
 *   rank's gathered buffer x[M, K] (M = the sum of rows), pushed by its owner (cuda_flux_ag_push)
 *   or by whatever moves it, and its arrival is announced by the signal word signals[d] of the
 *   receiving rank = epoch. The GEMM's tiles run chunk by chunk, the local chunk first (it needs
 *   no signal), then the others in the order they are pushed (rank - 1, rank - 2, ...); a tile
 *   waits for its chunk's signal before it loads a row of it, and the weights of its first stages
 *   are already being loaded while it waits. y[M, N], all tokens, this rank's features.
 *
 * - GEMM+ReduceScatter (after a row-parallel GEMM): every rank computes a partial y_r[M, N] from
 *   its own x[M, K_r] and w[N, K_r]; rank d owns the sum of the partials' chunk d. Each output
 *   tile of chunk d != rank goes, as soon as it is done, into rank d's inbox (slot `rank` of
 *   W slots of [rows[d], N]) and its signal word there is set to epoch. The local chunk's tiles
 *   come last: each waits for the W - 1 partial tiles of its place in the local inbox, adds them
 *   to its own fp32 accumulator in rank order (deterministic) and stores y[rows[rank], N] with one
 *   rounding.
 *
 * Peers are plain device pointers in a table the caller fills: with one GPU (the tests, the
 * benchmark) W buffers in the same device's memory; on several GPUs each rank's buffers as mapped
 * into this process (CUDA IPC handles exchanged over the communicator, or NCCL symmetric-memory
 * window pointers). NVLink multicast is never used. Signals are 32-bit words compared for equality
 * with an epoch that the caller changes every call, so nothing has to be reset between calls.
 *
 * A wait spins with a bound: past peers->timeout_ns (globaltimer) the waiting CTA writes a code in
 * the error word and the kernel's remaining CTAs leave; cuda_flux_check turns the word into an
 * error naming the rank that never arrived. The output is then undefined. No call allocates or
 * synchronises, so each can be captured in a CUDA graph (an epoch baked into a graph must then be
 * changed by re-recording or by resetting the signals between replays).
 *
 * Shapes: 1 <= W <= CUDA_FLUX_MAX_WORLD, any rows per chunk (0 too, odd ones), K a multiple of 64,
 * N a multiple of 8, every pointer 16-byte aligned; else NOPAD_ERR_UNSUPPORTED so the caller runs
 * the unfused path (the collective, then cuBLASLt). */
#ifndef NOPAD_BACKEND_CUDA_FLUX_FLUX_H
#define NOPAD_BACKEND_CUDA_FLUX_FLUX_H

#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime.h>

#include "backend/backend.h"

#ifdef __cplusplus
extern "C" {
#endif

enum { CUDA_FLUX_MAX_WORLD = 8 };

/* The W ranks' buffers and signal words, each as this rank addresses it.
 *   AllGather+GEMM:     buffers[i] = rank i's gathered x [M, K];
 *                       signals[i] = rank i's W words, word d: chunk d arrived.
 *   GEMM+ReduceScatter: buffers[i] = rank i's inbox, W slots of [rows[i], N] (cuda_flux_rs_inbox_bytes);
 *                       signals[i] = rank i's cuda_flux_rs_signal_words(...) words.
 * error: this rank's error word (device memory, zero before the first call); timeout_ns: how long
 * one wait may spin (0: CUDA_FLUX_DEFAULT_TIMEOUT_NS). */
typedef struct cuda_flux_peers {
    int32_t world, rank;
    void *buffers[CUDA_FLUX_MAX_WORLD];
    uint32_t *signals[CUDA_FLUX_MAX_WORLD];
    uint32_t *error;
    uint64_t timeout_ns;
    /* The persistent configurations (1-2) launch min(SMs, tiles) CTAs, or at most max_ctas when it
     * is > 0 (each CTA then takes more tiles); configuration 0 ignores it. 0: one CTA a SM. For
     * leaving SMs to concurrent kernels, and for tools/flux_bench's delayed runs (the emulated
     * arrivals' CTA must be resident beside the grid). */
    int32_t max_ctas;
} cuda_flux_peers;

#define CUDA_FLUX_DEFAULT_TIMEOUT_NS 2000000000ull /* 2 s: far beyond any transfer of one chunk */

/* Tile configurations, two warpgroups of wgmma, K slices of 64 in a ring of shared memory:
 * one CTA a tile, 256 threads loading the slices by cp.async, two CTAs a SM:
 *   0 = 64 x 128 (m64n64k16 each, side by side, 4 slices);
 * persistent CTAs (one a SM) of a TMA producer warp and two consumer warpgroups (flux.cu):
 *   1 = 128 x 256 (4 slices),
 *   2 = 128 x 128 (6 slices).
 * (Dropped after measurement, docs/parallel.md: 128 x 128 by cp.async at two CTAs a SM, picked
 * nowhere since the ReduceScatter's partials came through the TMA ring (it was configuration 0,
 * and these were 1-3, up to the runs of 2026-12-07d); 128 x 256 and 128 x 128 at one CTA a SM by
 * cp.async and 128 x 256 in clusters of 2 sharing w by TMA multicast, fastest nowhere or within 5%
 * of another where the fused path loses anyway, in the H100 run of f359b49.)
 * CUDA_FLUX_CONFIG_AUTO takes cuda_flux_pick's. Every rank of a GEMM+ReduceScatter must run the
 * same configuration (the signal words are per tile): the pick depends only on the shape and the
 * SM count. */
enum { CUDA_FLUX_CONFIG_AUTO = -1, CUDA_FLUX_N_CONFIGS = 3 };
/* the persistent TMA configurations (those peers->max_ctas bounds): 128 x 256 and 128 x 128 */
enum { CUDA_FLUX_CONFIG_TMA_256 = 1, CUDA_FLUX_CONFIG_TMA_128 = 2 };
int cuda_flux_pick(const int32_t *rows, int32_t world, int32_t n_in, int32_t n_out);
const char *cuda_flux_config_name(int config);

/* AllGather+GEMM: y[M, N] = x[M, K] · w[N, K]ᵀ, x = peers->buffers[peers->rank], rows[d] the rows
 * of chunk d. Chunk d != rank is read only after peers->signals[rank][d] == epoch. */
nopad_status cuda_flux_ag_gemm(nopad_dtype dtype, void *y, const void *w, const cuda_flux_peers *peers,
                               const int32_t *rows, int32_t n_in, int32_t n_out, uint32_t epoch, int config,
                               cudaStream_t stream);

/* Pushes this rank's chunk (its rows of the local gathered buffer) into every other rank's
 * gathered buffer, in the order rank + 1, rank + 2, ..., each copy followed by that rank's signal
 * word `rank` = epoch (a system-scope release after the copy). On a stream of its own, beside the
 * GEMM's. */
nopad_status cuda_flux_ag_push(nopad_dtype dtype, const cuda_flux_peers *peers, const int32_t *rows, int32_t n_in,
                               uint32_t epoch, cudaStream_t stream);

/* GEMM+ReduceScatter: this rank's partial x[M, K] · w[N, K]ᵀ, chunk d's tiles into rank d's inbox
 * (then signalled), and y[rows[rank], N] = the sum of every rank's partial of the local chunk. */
nopad_status cuda_flux_gemm_rs(nopad_dtype dtype, void *y, const void *x, const void *w,
                               const cuda_flux_peers *peers, const int32_t *rows, int32_t n_in, int32_t n_out,
                               uint32_t epoch, int config, cudaStream_t stream);

/* Sizes of rank `owner`'s GEMM+ReduceScatter inbox and signal words (the signals are enough for
 * every configuration: the tiles are at least 64 rows and 128 columns). */
size_t cuda_flux_rs_inbox_bytes(nopad_dtype dtype, int32_t owner_rows, int32_t n_out, int32_t world);
size_t cuda_flux_rs_signal_words(int32_t owner_rows, int32_t n_out, int32_t world);
/* Where the partial tile (src's, tile m of the owner's chunk, tile n) is signalled in the owner's
 * words under `config`, and how many tiles the owner's chunk has: for emulated peers that play the
 * other ranks. */
int64_t cuda_flux_rs_signal_index(int config, int32_t owner_rows, int32_t n_out, int32_t world, int32_t src,
                                  int32_t tile_m, int32_t tile_n);
void cuda_flux_rs_tiles(int config, int32_t owner_rows, int32_t n_out, int32_t *tiles_m, int32_t *tiles_n);

/* Waits for `stream`, reads and clears the error word: NOPAD_OK, or NOPAD_ERR_BACKEND naming the
 * kernel and the rank whose chunk or partial never arrived within peers->timeout_ns. */
nopad_status cuda_flux_check(const cuda_flux_peers *peers, cudaStream_t stream);

/* Sets n words to value with a system-scope release after the work before it on the stream. */
nopad_status cuda_flux_signal(uint32_t *words, int64_t n, uint32_t value, cudaStream_t stream);

/* Emulated peers (one GPU playing W ranks): one CTA works through the items in order; item i waits
 * until at_ns after the kernel started, copies bytes from src to dst (bytes 0: no copy; multiples
 * of 16, 16-byte aligned), then sets its n_signals words to value (release, system scope). Launch
 * it on a stream of its own before the fused kernel it feeds. */
typedef struct cuda_flux_arrival {
    const void *src;
    void *dst;
    uint64_t bytes;
    uint64_t at_ns;
    uint32_t *signals;
    uint32_t n_signals;
    uint32_t value;
} cuda_flux_arrival;
/* items: device memory holding n items. */
nopad_status cuda_flux_emulate_arrivals(const cuda_flux_arrival *items, int32_t n, cudaStream_t stream);

/* Whether the linear op should take the fused kernel (AllGather+GEMM: all_gather != 0, else
 * GEMM+ReduceScatter) for T tokens in all, y[T, N] = x[T, K] · w[N, K]ᵀ (K and N of this rank's
 * GEMM), at this world size, from the FLUX measurements (bench/RESULTS.md); 0: the collective,
 * then cuBLASLt. */
int cuda_flux_wins(int all_gather, int32_t n_tokens, int32_t n_in, int32_t n_out, int32_t world);

#ifdef __cplusplus
}
#endif
#endif
