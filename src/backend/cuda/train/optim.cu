/* Multi-tensor optimiser steps (optim.h): AdamW, LAMB (apex FusedLAMB) and torch's
 * clip_grad_norm_, on float32 master weights, gradients and moments, with the compute copy of the
 * weights (fp16 / bf16) written in the same pass.
 *
 * How the tensor list reaches the kernels (apex's multi_tensor_apply, without its host copy):
 * every tensor is cut into chunks of OPT_CHUNK elements, and one block updates one chunk. The
 * host lays the list out as batches, each a table of tensor descriptors and (tensor, chunk)
 * entries small enough to be a kernel's parameters (opt_batch, ~27 KB: Hopper with CUDA 12.1+
 * takes up to 32 KB); one launch per batch, blockIdx.x = the entry. Kernel parameters are copied
 * at launch, so no host buffer must outlive the call and nothing waits for the host (the launches
 * can be captured in a CUDA graph). BERT-large's ~340M parameters in ~400 tensors are ~5,600
 * chunks: five or six launches a pass.
 *
 * Reductions are deterministic: each block sums its chunk in a fixed order (per thread, then a
 * warp shuffle tree, then the warps in order) into one double per chunk, and a later kernel sums
 * those partials in a fixed order — the global gradient norm in one block, LAMB's per-tensor
 * norms of the weights and of the update in one block per tensor. Sums of squares are in
 * double (cheap next to the memory traffic), the per-element updates in float, as apex does. */
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/common.cuh"
#include "backend/cuda/train/optim.h"

enum {
    OPT_CHUNK = 65536,       /* elements one block updates: 32 groups of 4 per thread */
    OPT_THREADS = 512,
    OPT_BATCH_TENSORS = 96,  /* tensor descriptors in one launch's parameters */
    OPT_BATCH_CHUNKS = 4096, /* (tensor, chunk) entries in one launch's parameters */
    NORM_THREADS = 1024,     /* the global norm: one block */
    RATIO_THREADS = 256,     /* LAMB's trust ratios: one block per tensor */
};

/* One tensor of the list as the kernels see it. */
typedef struct opt_tensor_desc {
    float *param;        /* [n] master weights */
    float *grad;         /* [n] (clip_grad_norm scales it) */
    float *m, *v;        /* [n] moments (NULL for clip_grad_norm) */
    void *param_compute; /* [n] in the compute dtype, or NULL */
    int64_t n;
    float weight_decay;
    int32_t index;       /* the tensor's position in the caller's list: its trust ratio's slot */
    int32_t first_chunk; /* id of its chunk 0 among the list's chunks: its partial sums' slot */
    int32_t n_chunks;
    int32_t vec4;        /* every pointer allows 16-byte float4 access (8 bytes for param_compute) */
} opt_tensor_desc;

/* One launch's share of the list: the tensors it touches and its blocks' (tensor, chunk) entries.
 * A tensor with more chunks than fit continues in the next batch under the same index. */
typedef struct opt_batch {
    opt_tensor_desc tensors[OPT_BATCH_TENSORS];
    int32_t chunk_index[OPT_BATCH_CHUNKS];  /* entry e updates chunk chunk_index[e] ... */
    uint8_t chunk_tensor[OPT_BATCH_CHUNKS]; /* ... of tensors[chunk_tensor[e]] */
    int32_t n_tensors, n_chunks;
} opt_batch;
static_assert(sizeof(opt_batch) <= 32764, "a batch must fit the kernel parameter limit (32,764 bytes)");
static_assert(OPT_BATCH_TENSORS <= 256, "chunk_tensor is a uint8_t");

/* The step's hyperparameters in the precision of the per-element arithmetic. */
typedef struct opt_hyper {
    float lr, beta1, beta2, eps;
    float bias_correction1, bias_correction2; /* 1 - beta^step */
} opt_hyper;

/* ---- device helpers ---------------------------------------------------------------------------- */

/* The chunk this block updates: elements [begin, end) of tensor t, chunk id `id` of the list. */
typedef struct opt_chunk {
    const opt_tensor_desc *t;
    int64_t begin, end;
    int32_t id;
} opt_chunk;

static __device__ __forceinline__ opt_chunk chunk_of(const opt_batch &batch) {
    opt_chunk c;
    c.t = &batch.tensors[batch.chunk_tensor[blockIdx.x]];
    const int32_t index = batch.chunk_index[blockIdx.x];
    c.begin = (int64_t)index * OPT_CHUNK;
    c.end = c.t->n < c.begin + OPT_CHUNK ? c.t->n : c.begin + OPT_CHUNK;
    c.id = c.t->first_chunk + index;
    return c;
}

/* Threads walk a chunk in groups of 4 consecutive elements, thread k taking groups k, k + 512,
 * ...: the elements of group i are [i, i + group_size(i, end)), the last group may be short. */
static __device__ __forceinline__ int group_size(int64_t i, int64_t end) { return end - i < 4 ? (int)(end - i) : 4; }

/* src[0 .. count) into v (zeros past count): one 16-byte load when vec (count == 4, aligned). */
static __device__ __forceinline__ void load4(float v[4], const float *src, int count, bool vec) {
    if (vec) {
        const float4 q = *reinterpret_cast<const float4 *>(src);
        v[0] = q.x, v[1] = q.y, v[2] = q.z, v[3] = q.w;
    } else {
#pragma unroll
        for (int j = 0; j < 4; j++) v[j] = j < count ? src[j] : 0.0f;
    }
}

static __device__ __forceinline__ void store4(float *dst, const float v[4], int count, bool vec) {
    if (vec) {
        *reinterpret_cast<float4 *>(dst) = make_float4(v[0], v[1], v[2], v[3]);
    } else {
#pragma unroll
        for (int j = 0; j < 4; j++)
            if (j < count) dst[j] = v[j];
    }
}

/* The compute copy: 4 elements of 2 bytes, one 8-byte store when vec. */
template <typename T>
static __device__ __forceinline__ void store4_compute(T *dst, const float v[4], int count, bool vec) {
    if (vec) {
        uint2 raw;
        T *p = reinterpret_cast<T *>(&raw);
#pragma unroll
        for (int j = 0; j < 4; j++) p[j] = from_f32<T>(v[j]);
        *reinterpret_cast<uint2 *>(dst) = raw;
    } else {
#pragma unroll
        for (int j = 0; j < 4; j++)
            if (j < count) dst[j] = from_f32<T>(v[j]);
    }
}

/* The sum of every thread's v in a fixed order (the same bits on every run), valid in thread 0.
 * warp_sums: [THREADS / 32] in shared memory, not used by another call of the same kernel. */
template <int THREADS>
static __device__ __forceinline__ double block_sum(double v, double *warp_sums) {
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_down_sync(0xffffffffu, v, offset);
    if ((threadIdx.x & 31) == 0) warp_sums[threadIdx.x >> 5] = v;
    __syncthreads();
    double total = 0.0;
    if (threadIdx.x == 0)
        for (int w = 0; w < THREADS / 32; w++) total += warp_sums[w];
    return total;
}

/* Adam's moments (torch: m = β1·m + (1-β1)·g, v = β2·v + (1-β2)·g²). */
static __device__ __forceinline__ void adam_moments(float &m, float &v, float g, const opt_hyper &h) {
    m = h.beta1 * m + (1.0f - h.beta1) * g;
    v = h.beta2 * v + (1.0f - h.beta2) * g * g;
}

/* m̂ / (√v̂ + eps), from the updated moments. */
static __device__ __forceinline__ float adam_direction(float m, float v, const opt_hyper &h) {
    return (m / h.bias_correction1) / (sqrtf(v / h.bias_correction2) + h.eps);
}

/* ---- kernels ------------------------------------------------------------------------------------ */

/* partials[chunk id] = Σ g² over the block's chunk. */
__global__ void __launch_bounds__(OPT_THREADS)
grad_sumsq_kernel(const __grid_constant__ opt_batch batch, double *partials) {
    __shared__ double warp_sums[OPT_THREADS / 32];
    const opt_chunk c = chunk_of(batch);
    const float *grad = c.t->grad;
    const bool vec4 = c.t->vec4 != 0;
    double sum = 0.0;
    for (int64_t i = c.begin + 4 * (int64_t)threadIdx.x; i < c.end; i += 4 * OPT_THREADS) {
        const int count = group_size(i, c.end);
        float g[4];
        load4(g, grad + i, count, vec4 && count == 4);
#pragma unroll
        for (int j = 0; j < 4; j++) sum += (double)g[j] * g[j]; /* zeros past count */
    }
    sum = block_sum<OPT_THREADS>(sum, warp_sums);
    if (threadIdx.x == 0) partials[c.id] = sum;
}

enum { NORM_FOR_LAMB = 0, NORM_FOR_CLIP = 1 };

/* The global norm from the chunks' partial sums, in one block: scalars[0] = norm, scalars[1] =
 * LAMB's divisor (norm / max_norm when the norm exceeds max_norm > 0, else 1) or clipping's
 * factor (torch: max_norm / (norm + 1e-6) unless that is >= 1, then 1; with max_norm <= 0, 1);
 * *grad_norm32 = norm when not NULL. The comparisons are written as cpu_optim.c writes them, so a
 * NaN norm does what it does there. */
__global__ void __launch_bounds__(NORM_THREADS)
global_norm_kernel(const double *partials, int32_t n_chunks, double *scalars, float *grad_norm32,
                   float max_norm, int mode) {
    __shared__ double warp_sums[NORM_THREADS / 32];
    double sum = 0.0;
    for (int32_t i = threadIdx.x; i < n_chunks; i += NORM_THREADS) sum += partials[i];
    sum = block_sum<NORM_THREADS>(sum, warp_sums);
    if (threadIdx.x != 0) return;
    const double norm = sqrt(sum), bound = max_norm;
    double factor;
    if (mode == NORM_FOR_LAMB) {
        factor = bound > 0 && norm > bound ? norm / bound : 1.0;
    } else {
        const double coef = bound > 0 ? bound / (norm + 1e-6) : 1.0;
        factor = coef >= 1.0 ? 1.0 : coef;
    }
    scalars[0] = norm;
    scalars[1] = factor;
    if (grad_norm32) *grad_norm32 = (float)norm;
}

/* clip_grad_norm_: g = g·factor (scalars[1]) in double, rounded once as the CPU does; nothing to
 * do when the factor is 1 (the common case: the gradients are only read once, by the norm). */
__global__ void __launch_bounds__(OPT_THREADS)
clip_scale_kernel(const __grid_constant__ opt_batch batch, const double *scalars) {
    const double factor = scalars[1];
    if (factor >= 1.0) return; /* the same for every thread of the grid */
    const opt_chunk c = chunk_of(batch);
    float *grad = c.t->grad;
    const bool vec4 = c.t->vec4 != 0;
    for (int64_t i = c.begin + 4 * (int64_t)threadIdx.x; i < c.end; i += 4 * OPT_THREADS) {
        const int count = group_size(i, c.end);
        const bool vec = vec4 && count == 4;
        float g[4];
        load4(g, grad + i, count, vec);
#pragma unroll
        for (int j = 0; j < 4; j++) g[j] = (float)((double)g[j] * factor);
        store4(grad + i, g, count, vec);
    }
}

/* torch.optim.AdamW: p = p·(1 - lr·wd) - lr·m̂ / (√v̂ + eps); the compute copy from the new p. */
template <typename T>
__global__ void __launch_bounds__(OPT_THREADS)
adamw_kernel(const __grid_constant__ opt_batch batch, const opt_hyper h) {
    const opt_chunk c = chunk_of(batch);
    const opt_tensor_desc *t = c.t;
    float *param = t->param, *m = t->m, *v = t->v;
    const float *grad = t->grad;
    T *compute = static_cast<T *>(t->param_compute);
    const bool vec4 = t->vec4 != 0;
    const float decay = 1.0f - h.lr * t->weight_decay;
    for (int64_t i = c.begin + 4 * (int64_t)threadIdx.x; i < c.end; i += 4 * OPT_THREADS) {
        const int count = group_size(i, c.end);
        const bool vec = vec4 && count == 4;
        float p4[4], g4[4], m4[4], v4[4];
        load4(p4, param + i, count, vec);
        load4(g4, grad + i, count, vec);
        load4(m4, m + i, count, vec);
        load4(v4, v + i, count, vec);
#pragma unroll
        for (int j = 0; j < 4; j++) {
            adam_moments(m4[j], v4[j], g4[j], h);
            p4[j] = p4[j] * decay - h.lr * adam_direction(m4[j], v4[j], h);
        }
        store4(param + i, p4, count, vec);
        store4(m + i, m4, count, vec);
        store4(v + i, v4, count, vec);
        if (compute) store4_compute(compute + i, p4, count, vec);
    }
}

/* LAMB, pass 1: the moments from the gradient divided by the clipping divisor (scalars[1]), and
 * the chunk's Σ p² and Σ u² with u = m̂ / (√v̂ + eps) + wd·p (pass 3 recomputes u from the stored
 * moments rather than storing it). */
template <typename T>
__global__ void __launch_bounds__(OPT_THREADS)
lamb_moments_kernel(const __grid_constant__ opt_batch batch, const opt_hyper h, const double *scalars,
                    double *partial_p, double *partial_u) {
    __shared__ double warp_sums_p[OPT_THREADS / 32], warp_sums_u[OPT_THREADS / 32];
    const opt_chunk c = chunk_of(batch);
    const opt_tensor_desc *t = c.t;
    const float *param = t->param, *grad = t->grad;
    float *m = t->m, *v = t->v;
    const bool vec4 = t->vec4 != 0;
    const float inv_clip = (float)(1.0 / scalars[1]), wd = t->weight_decay;
    double p_sq = 0.0, u_sq = 0.0;
    for (int64_t i = c.begin + 4 * (int64_t)threadIdx.x; i < c.end; i += 4 * OPT_THREADS) {
        const int count = group_size(i, c.end);
        const bool vec = vec4 && count == 4;
        float p4[4], g4[4], m4[4], v4[4];
        load4(p4, param + i, count, vec);
        load4(g4, grad + i, count, vec);
        load4(m4, m + i, count, vec);
        load4(v4, v + i, count, vec);
#pragma unroll
        for (int j = 0; j < 4; j++) {
            adam_moments(m4[j], v4[j], g4[j] * inv_clip, h);
            const float u = adam_direction(m4[j], v4[j], h) + wd * p4[j];
            if (j < count) {
                p_sq += (double)p4[j] * p4[j];
                u_sq += (double)u * u;
            }
        }
        store4(m + i, m4, count, vec);
        store4(v + i, v4, count, vec);
    }
    p_sq = block_sum<OPT_THREADS>(p_sq, warp_sums_p);
    u_sq = block_sum<OPT_THREADS>(u_sq, warp_sums_u);
    if (threadIdx.x == 0) {
        partial_p[c.id] = p_sq;
        partial_u[c.id] = u_sq;
    }
}

/* LAMB, pass 2: one block per tensor of the batch sums its chunks' partials in order; the trust
 * ratio ‖p‖ / ‖u‖ on tensors with weight decay, 1 on the others and when either norm is 0. A
 * tensor split over two batches is done twice, to the same bits. */
__global__ void __launch_bounds__(RATIO_THREADS)
lamb_ratio_kernel(const __grid_constant__ opt_batch batch, const double *partial_p, const double *partial_u,
                  float *ratios) {
    __shared__ double warp_sums_p[RATIO_THREADS / 32], warp_sums_u[RATIO_THREADS / 32];
    const opt_tensor_desc *t = &batch.tensors[blockIdx.x];
    double p_sq = 0.0, u_sq = 0.0;
    for (int32_t k = threadIdx.x; k < t->n_chunks; k += RATIO_THREADS) {
        p_sq += partial_p[t->first_chunk + k];
        u_sq += partial_u[t->first_chunk + k];
    }
    p_sq = block_sum<RATIO_THREADS>(p_sq, warp_sums_p);
    u_sq = block_sum<RATIO_THREADS>(u_sq, warp_sums_u);
    if (threadIdx.x == 0) {
        double ratio = 1.0;
        if (t->weight_decay != 0.0f && p_sq > 0 && u_sq > 0) ratio = sqrt(p_sq) / sqrt(u_sq);
        ratios[t->index] = (float)ratio;
    }
}

/* LAMB, pass 3: p -= lr·ratio·u; the compute copy from the new p. */
template <typename T>
__global__ void __launch_bounds__(OPT_THREADS)
lamb_update_kernel(const __grid_constant__ opt_batch batch, const opt_hyper h, const float *ratios) {
    const opt_chunk c = chunk_of(batch);
    const opt_tensor_desc *t = c.t;
    float *param = t->param;
    const float *m = t->m, *v = t->v;
    T *compute = static_cast<T *>(t->param_compute);
    const bool vec4 = t->vec4 != 0;
    const float step = h.lr * ratios[t->index], wd = t->weight_decay;
    for (int64_t i = c.begin + 4 * (int64_t)threadIdx.x; i < c.end; i += 4 * OPT_THREADS) {
        const int count = group_size(i, c.end);
        const bool vec = vec4 && count == 4;
        float p4[4], m4[4], v4[4];
        load4(p4, param + i, count, vec);
        load4(m4, m + i, count, vec);
        load4(v4, v + i, count, vec);
#pragma unroll
        for (int j = 0; j < 4; j++) p4[j] -= step * (adam_direction(m4[j], v4[j], h) + wd * p4[j]);
        store4(param + i, p4, count, vec);
        if (compute) store4_compute(compute + i, p4, count, vec);
    }
}

/* ---- host: the batches ------------------------------------------------------------------------- */

typedef struct opt_plan {
    opt_batch *batches;
    int32_t n_batches;
    int32_t n_chunks; /* over the whole list */
} opt_plan;

static int64_t chunks_of(int64_t n) { return n > 0 ? (n + OPT_CHUNK - 1) / OPT_CHUNK : 0; }

static int aligned(const void *p, uintptr_t bytes) { return ((uintptr_t)p & (bytes - 1)) == 0; }

/* Lays the list out as batches. with_state: the step reads param, m and v (not only grad). */
static nopad_status plan_make(const nopad_opt_tensor *tensors, int32_t n_tensors, int with_state,
                              const char *op, opt_plan *plan) {
    memset(plan, 0, sizeof *plan);
    if (n_tensors < 0 || (n_tensors > 0 && !tensors))
        return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT, "cuda %s: %d tensors at %p", op, (int)n_tensors,
                               (const void *)tensors);
    int64_t total = 0;
    int32_t capacity = 0, in_batch = -1; /* in_batch: the list index whose descriptor ends the last batch */
    for (int32_t k = 0; k < n_tensors; k++) {
        const nopad_opt_tensor *t = &tensors[k];
        if (t->n < 0 || (t->n > 0 && (!t->grad || (with_state && (!t->param || !t->m || !t->v))))) {
            free(plan->batches);
            memset(plan, 0, sizeof *plan);
            return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT,
                                   "cuda %s: tensor %d of %d: n = %lld with param %p, grad %p, m %p, v %p "
                                   "(a negative size or a NULL pointer)",
                                   op, (int)k, (int)n_tensors, (long long)t->n, (void *)t->param,
                                   (const void *)t->grad, (void *)t->m, (void *)t->v);
        }
        const int64_t n_chunks = chunks_of(t->n);
        if (n_chunks == 0) continue;
        if (total + n_chunks > INT32_MAX) {
            free(plan->batches);
            memset(plan, 0, sizeof *plan);
            return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT, "cuda %s: more than 2^31 chunks of %d elements",
                                   op, OPT_CHUNK);
        }
        opt_tensor_desc desc;
        memset(&desc, 0, sizeof desc);
        desc.param = t->param;
        desc.grad = (float *)t->grad; /* clip_grad_norm scales the caller's gradient buffer */
        desc.m = t->m;
        desc.v = t->v;
        desc.param_compute = t->param_compute;
        desc.n = t->n;
        desc.weight_decay = t->weight_decay;
        desc.index = k;
        desc.first_chunk = (int32_t)total;
        desc.n_chunks = (int32_t)n_chunks;
        desc.vec4 = aligned(t->param, 16) && aligned(t->grad, 16) && aligned(t->m, 16) && aligned(t->v, 16) &&
                    aligned(t->param_compute, 8);
        for (int64_t c = 0; c < n_chunks; c++) {
            opt_batch *b = plan->n_batches ? &plan->batches[plan->n_batches - 1] : NULL;
            if (!b || b->n_chunks == OPT_BATCH_CHUNKS || (in_batch != k && b->n_tensors == OPT_BATCH_TENSORS)) {
                if (plan->n_batches == capacity) {
                    capacity = capacity ? 2 * capacity : 4;
                    opt_batch *grown = (opt_batch *)realloc(plan->batches, (size_t)capacity * sizeof(opt_batch));
                    if (!grown) {
                        free(plan->batches);
                        memset(plan, 0, sizeof *plan);
                        return nopad_set_error(NOPAD_ERR_OUT_OF_MEMORY, "cuda %s: the launch tables", op);
                    }
                    plan->batches = grown;
                }
                b = &plan->batches[plan->n_batches++];
                memset(b, 0, sizeof *b);
                in_batch = -1;
            }
            if (in_batch != k) {
                b->tensors[b->n_tensors++] = desc;
                in_batch = k;
            }
            b->chunk_index[b->n_chunks] = (int32_t)c;
            b->chunk_tensor[b->n_chunks] = (uint8_t)(b->n_tensors - 1);
            b->n_chunks++;
        }
        total += n_chunks;
    }
    plan->n_chunks = (int32_t)total;
    return NOPAD_OK;
}

/* The workspace: two doubles a chunk (Σ g², then Σ p²; Σ u²), the norm and the factor, then a
 * float trust ratio per tensor of the list. */
typedef struct opt_ws {
    double *partial_a, *partial_b; /* [n_chunks] each */
    double *scalars;               /* [2]: norm, factor */
    float *ratios;                 /* [n_tensors] */
} opt_ws;

static opt_ws ws_layout(void *ws, int32_t n_chunks) {
    opt_ws w;
    w.partial_a = (double *)ws;
    w.partial_b = w.partial_a + n_chunks;
    w.scalars = w.partial_b + n_chunks;
    w.ratios = (float *)(w.scalars + 2);
    return w;
}

extern "C" size_t cuda_optim_workspace_bytes(const nopad_opt_tensor *tensors, int32_t n_tensors) {
    if (!tensors || n_tensors < 0) n_tensors = 0; /* cuda_optim_lamb reports the bad list */
    size_t n_chunks = 0;
    for (int32_t k = 0; k < n_tensors; k++) n_chunks += (size_t)chunks_of(tensors[k].n);
    return (2 * n_chunks + 2) * sizeof(double) + (size_t)(n_tensors > 0 ? n_tensors : 0) * sizeof(float);
}

static opt_hyper hyper_of(const nopad_opt_step *h) {
    opt_hyper hp;
    hp.lr = h->lr;
    hp.beta1 = h->beta1;
    hp.beta2 = h->beta2;
    hp.eps = h->eps;
    hp.bias_correction1 = (float)(1.0 - pow((double)h->beta1, (double)h->step));
    hp.bias_correction2 = (float)(1.0 - pow((double)h->beta2, (double)h->step));
    return hp;
}

/* Σ g² of every chunk into ws.partial_a, then the norm and the factor into ws.scalars. */
static nopad_status global_norm(const opt_plan *plan, const opt_ws *w, float *grad_norm32, float max_norm,
                                int mode, cudaStream_t stream) {
    for (int32_t b = 0; b < plan->n_batches; b++)
        grad_sumsq_kernel<<<plan->batches[b].n_chunks, OPT_THREADS, 0, stream>>>(plan->batches[b], w->partial_a);
    global_norm_kernel<<<1, NORM_THREADS, 0, stream>>>(w->partial_a, plan->n_chunks, w->scalars, grad_norm32,
                                                       max_norm, mode);
    return launch_status("gradient norm");
}

template <typename T>
static nopad_status adamw_launch(const opt_plan *plan, const opt_hyper &hp, cudaStream_t stream) {
    for (int32_t b = 0; b < plan->n_batches; b++)
        adamw_kernel<T><<<plan->batches[b].n_chunks, OPT_THREADS, 0, stream>>>(plan->batches[b], hp);
    return launch_status("adamw");
}

template <typename T>
static nopad_status lamb_launch(const opt_plan *plan, const opt_hyper &hp, const opt_ws *w, cudaStream_t stream) {
    for (int32_t b = 0; b < plan->n_batches; b++)
        lamb_moments_kernel<T><<<plan->batches[b].n_chunks, OPT_THREADS, 0, stream>>>(
            plan->batches[b], hp, w->scalars, w->partial_a, w->partial_b);
    for (int32_t b = 0; b < plan->n_batches; b++)
        lamb_ratio_kernel<<<plan->batches[b].n_tensors, RATIO_THREADS, 0, stream>>>(plan->batches[b], w->partial_a,
                                                                                    w->partial_b, w->ratios);
    for (int32_t b = 0; b < plan->n_batches; b++)
        lamb_update_kernel<T><<<plan->batches[b].n_chunks, OPT_THREADS, 0, stream>>>(plan->batches[b], hp,
                                                                                     w->ratios);
    return launch_status("lamb");
}

extern "C" nopad_status cuda_optim_adamw(nopad_dtype dtype, const nopad_opt_tensor *tensors, int32_t n_tensors,
                                         const nopad_opt_step *h, cudaStream_t stream) {
    opt_plan plan;
    nopad_status st = plan_make(tensors, n_tensors, 1, "adamw", &plan);
    if (st != NOPAD_OK) return st;
    const opt_hyper hp = hyper_of(h);
    switch (dtype) {
    case NOPAD_DTYPE_F16: st = adamw_launch<__half>(&plan, hp, stream); break;
    case NOPAD_DTYPE_BF16: st = adamw_launch<__nv_bfloat16>(&plan, hp, stream); break;
    default: st = nopad_set_error(NOPAD_ERR_UNSUPPORTED, "cuda adamw: dtype %d is not F16 or BF16", (int)dtype);
    }
    free(plan.batches);
    return st;
}

extern "C" nopad_status cuda_optim_lamb(nopad_dtype dtype, const nopad_opt_tensor *tensors, int32_t n_tensors,
                                        const nopad_opt_step *h, float *grad_norm32, void *ws, cudaStream_t stream) {
    if (dtype != NOPAD_DTYPE_F16 && dtype != NOPAD_DTYPE_BF16)
        return nopad_set_error(NOPAD_ERR_UNSUPPORTED, "cuda lamb: dtype %d is not F16 or BF16", (int)dtype);
    opt_plan plan;
    nopad_status st = plan_make(tensors, n_tensors, 1, "lamb", &plan);
    if (st != NOPAD_OK) return st;
    const opt_ws w = ws_layout(ws, plan.n_chunks);
    const opt_hyper hp = hyper_of(h);
    st = global_norm(&plan, &w, grad_norm32, h->max_grad_norm, NORM_FOR_LAMB, stream);
    if (st == NOPAD_OK)
        st = dtype == NOPAD_DTYPE_F16 ? lamb_launch<__half>(&plan, hp, &w, stream)
                                      : lamb_launch<__nv_bfloat16>(&plan, hp, &w, stream);
    free(plan.batches);
    return st;
}

extern "C" nopad_status cuda_optim_clip_grad_norm(const nopad_opt_tensor *tensors, int32_t n_tensors, float max_norm,
                                                  float *grad_norm32, void *ws, cudaStream_t stream) {
    opt_plan plan;
    nopad_status st = plan_make(tensors, n_tensors, 0, "clip_grad_norm", &plan);
    if (st != NOPAD_OK) return st;
    const opt_ws w = ws_layout(ws, plan.n_chunks);
    st = global_norm(&plan, &w, grad_norm32, max_norm, NORM_FOR_CLIP, stream);
    if (st == NOPAD_OK) {
        for (int32_t b = 0; b < plan.n_batches; b++)
            clip_scale_kernel<<<plan.batches[b].n_chunks, OPT_THREADS, 0, stream>>>(plan.batches[b], w.scalars);
        st = launch_status("clip_grad_norm");
    }
    free(plan.batches);
    return st;
}
