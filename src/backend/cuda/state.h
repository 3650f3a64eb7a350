/* Internal: the CUDA backend's state (nopad_backend.impl), shared by the table (cuda_backend.c),
 * memory and staging (memory.c) and the graph cache (graphs.c). Everything in it belongs to one
 * device, `device`, which every op makes current on entry (cuda_use_device). */
#ifndef NOPAD_BACKEND_CUDA_STATE_H
#define NOPAD_BACKEND_CUDA_STATE_H

#include <stdint.h>

#include <cuda_runtime.h>

#include "backend/backend.h"
#include "backend/cuda/gemm/cublaslt.h"

enum { GRAPH_CACHE_SIZE = 48, SEEN_KEYS = 64 };
/* Device memory the backend holds whatever the model: cuBLASLt's workspace and the attention's
 * work counter. */
#define FIXED_EXTRA_BYTES (CUDA_LT_WORKSPACE_BYTES + NOPAD_ATTENTION_WORKSPACE_BYTES)

/* One recorded forward, replayed whenever the same key comes back. */
typedef struct graph_entry {
    int64_t key[4];
    cudaGraphExec_t exec;
    uint64_t last_use; /* for evicting the least recently used */
} graph_entry;

typedef struct cuda_state {
    int device; /* the CUDA device ordinal everything below belongs to */
    cudaStream_t stream;
    int own_stream;
    cuda_lt lt;     /* cuBLASLt handle, workspace and plans */
    float *scratch; /* device float32 staging for uploads and downloads */
    size_t scratch_bytes;
    struct cuda_train_gemm_plans *train_gemm_plans; /* gemm_backward's cuBLASLt plans (train/) */
    void *train_ws; /* gemm_backward's bias-gradient partials and the optimisers' partial norms
                       (grown on demand, stream-ordered; train/gemm_optim.c) */
    size_t train_ws_bytes;
    graph_entry graphs[GRAPH_CACHE_SIZE];
    int n_graphs;
    uint64_t graph_clock;
    int64_t seen[SEEN_KEYS][4]; /* keys run once, not yet recorded */
    int next_seen;
    int32_t *pack_bad; /* device flag of pack_padded: the lengths did not match what the host said */
    void *attention_ws; /* the attention kernels' work counter (NOPAD_ATTENTION_WORKSPACE_BYTES,
                           zeroed once; every use is ordered on `stream`) */
    float *split_ws;   /* float32 scratch of results that end within one op: the decoder attention's
                          partial results, the training ops' column partial sums (train/ops.c);
                          grown on demand, stream-ordered */
    size_t split_ws_bytes;
    void *expand_ws;   /* prompts-only decoder steps: qkv with a K and V head per query head */
    size_t expand_ws_bytes;
    void *sample_dev;  /* sampling: rows, ids, log-probs, histories (grown on demand) */
    size_t sample_dev_bytes;
    void *sample_host; /* its host staging */
    size_t sample_host_bytes;
    int32_t sample_pending; /* rows of ids sample_begin queued, not yet waited for */
    cudaEvent_t sample_done; /* recorded after their download: sample_wait waits for it, not for the
                                next step's forward queued behind it (created with the staging) */
    float *attn_bwd_ws; /* attention_backward: dq32 and dsum (grown on demand, stream-ordered) */
    size_t attn_bwd_ws_bytes;
    float *rel_ws;      /* attention_rel: the c2p / p2c projections (grown on demand, stream-ordered) */
    size_t rel_ws_bytes;
    int32_t *rel_rows;  /* attention_rel: the table row of each distance, for rel_key's setting */
    int32_t rel_key[3]; /* att_span, position_buckets, max_relative_positions of rel_rows */
    int32_t rel_sat;    /* rel_rows holds distances -rel_sat .. rel_sat */
    int cannot_record; /* a recording failed once (e.g. a caller's stream that cannot be captured):
                          run ops directly from then on */
} cuda_state;

static inline cuda_state *state_of(nopad_backend *be) { return (cuda_state *)be->impl; }

/* NOPAD_OK, or NOPAD_ERR_BACKEND with "cuda <what>: <CUDA's message>". */
nopad_status cuda_check(cudaError_t err, const char *what);

/* Makes the backend's device current if it is not (cudaGetDevice is cheap; cudaSetDevice only
 * when another device is current, e.g. a second backend's in the same thread). */
nopad_status cuda_use_device(const cuda_state *s);

/* The start of an op returning nopad_status: `s`, the backend's state, with its device current. */
#define CUDA_ENTER(be, s)                                                                          \
    cuda_state *s = state_of(be);                                                                  \
    do {                                                                                           \
        const nopad_status enter_status_ = cuda_use_device(s);                                     \
        if (enter_status_ != NOPAD_OK) return enter_status_;                                       \
    } while (0)

/* memory.c */
nopad_status cuda_mem_alloc(nopad_backend *be, size_t bytes, void **out);
void cuda_mem_free(nopad_backend *be, void *ptr);
nopad_status cuda_mem_upload_f32(nopad_backend *be, void *dst, const float *src, size_t n);
nopad_status cuda_mem_download_f32(nopad_backend *be, float *dst, const void *src, size_t n);
nopad_status cuda_mem_download(nopad_backend *be, void *dst, const void *src, size_t bytes);
nopad_status cuda_mem_upload(nopad_backend *be, void *dst, const void *src, size_t bytes);
nopad_status cuda_mem_upload_i32(nopad_backend *be, int32_t *dst, const int32_t *src, size_t n);
void cuda_mem_release_staging(nopad_backend *be);
nopad_status cuda_mem_synchronize(nopad_backend *be);
nopad_status cuda_mem_copy(nopad_backend *be, void *dst, const void *src, size_t bytes);
nopad_status cuda_mem_copy_2d(nopad_backend *be, void *dst, size_t dst_pitch, const void *src, size_t src_pitch,
                              size_t width, size_t rows);

/* graphs.c */
nopad_status cuda_graph_run(nopad_backend *be, const int64_t key[4], nopad_status (*record)(void *ctx),
                            void *ctx);
void cuda_graph_clear(nopad_backend *be);
/* Destroys every recorded graph (the stream is idle). */
void cuda_graph_destroy_all(cuda_state *s);

/* train/gemm_optim.c: frees train_gemm_plans and train_ws (the stream is idle). */
void cuda_train_gemm_optim_release(cuda_state *s);

#endif
