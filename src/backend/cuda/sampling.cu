/* CUDA: the sampler of src/model/sampling.c on the GPU, one CTA of 1024 threads per row, so that a
 * decode step sends back only the chosen ids (and their log-probabilities), not rows of logits.
 * Same rules, order and ties as sample_token (sampling.h); nothing is sorted or allocated:
 *   - a constraint's mask first (refused ids -inf in the row), then logit_bias, a thread a pair
 *     (sampling_check refuses a repeated id);
 *   - repetition penalty once per distinct history id: a bitmap of the vocab in shared memory, the
 *     thread whose atomicOr sets an id's bit applies it; the frequency and presence penalties the
 *     same way over the output, that thread counting the id's occurrences (the output listed in
 *     shared memory when it fits);
 *   - greedy: the lowest id among the maxima, found in the pass that checks the row and takes its
 *     max;
 *   - top-k: the k-th largest logit by radix select over the order-preserving bits of the float
 *     (-0 counted as +0, as the float comparisons see it): count histograms of 11, 11 and 10 bits,
 *     the first taken in the pass of the max;
 *   - top-p: the host's weight bins first (16 a nat of distance from the max, the last bin the
 *     rest), the bin where the running weight reaches top_p x z found by a scan; then, inside that
 *     bin, a radix select over the 64-bit rank key (logit descending, then id ascending) with the
 *     weight per 8-bit digit summed in double finds the first id whose running weight reaches the
 *     target: its key is the boundary. Each round starts at the highest bit where the smallest and
 *     the largest key left differ and ends when one id is left (the bin's ids and logits are
 *     listed in shared memory when they fit, so that those rounds skip the rest of the row);
 *   - min-p: the weight against min_p;
 *   - the top log-probabilities: n_top rounds of a block minimum of the rank keys above the last
 *     round's (ranking every id, -inf last), each id's log-probability from the row's kept set;
 *   - the draw: inverse CDF in id order over three levels of contiguous ranges. Each warp sums the
 *     kept weights of its 32nd of the row, one thread scans the 32 sums in order and finds the warp
 *     whose range holds u x the total; the 32 warps then sum 32 pieces of that range, the piece
 *     that holds the target is found the same way, and one warp walks it 32 ids at a time.
 * Weights are exp((logit - max) / t) in double from the fp32 logits, as the host computes them, and
 * are recomputed where needed (the row of logits is the only scratch in global memory); greedy's
 * log-probability sums expf in double (it is returned as a float; the id does not depend on it).
 * Passes over the row give each warp a contiguous 32nd of it and keep UNROLL coalesced loads in
 * flight a lane. Weight histograms are private to each pair of warps (shared-memory atomics on
 * doubles spin when many threads hit one bin) and merged in a fixed order. Sums are taken in
 * another order than the host's, so a kept set or a draw can differ from the host's only where a
 * top-p or min-p boundary or the draw's cut falls within double rounding of it. */
#include <float.h>
#include <limits.h>

#include "backend/cuda/common.cuh"
#include "backend/cuda/sampling_ops.h"

enum {
    SAMPLE_THREADS = 1024,
    SAMPLE_WARPS = SAMPLE_THREADS / 32,
    N_BINS = 512,     // sampling.c's top-p weight bins: BINS_PER_NAT a nat, the last the rest
    BINS_PER_NAT = 16,
    UNROLL = 8,       // loads in flight a lane in a pass over the row
    N_PRIV = 16,      // private weight histograms, one a pair of warps
    LIST_CAP = 8192,  // ids (and logits) of top-p's cut bin listed in shared memory
};
static const unsigned FULL = 0xffffffffu;
/* Top-k's radix select: three digits of the 32-bit key, bits 21-31, 10-20 and 0-9; the first is
 * counted in the pass that takes the row's max. */
enum { TOPK_BINS = 2048 };
static __device__ __forceinline__ int topk_shift(int d) { return d == 0 ? 21 : d == 1 ? 10 : 0; }
/* Dynamic shared memory: the private histograms (N_PRIV x N_BINS doubles), which the repetition
 * penalty's bitmap (a bit an id) overlays first, then the list (LIST_CAP ids, LIST_CAP logits),
 * whose first part holds top-k's counts before top-p lists ids there. */
static const size_t PRIV_BYTES = (size_t)N_PRIV * N_BINS * sizeof(double);
static const size_t LIST_BYTES = (size_t)LIST_CAP * (sizeof(int) + sizeof(float));
static const size_t MAX_DYNAMIC_SMEM = 200 * 1024; // bitmap + list: 1.1 million ids at most

/* ---- the draw: sampling_uniform of sampling.c ----------------------------------------------- */

static __device__ __forceinline__ uint64_t mix64(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static __device__ __forceinline__ double sampling_uniform_dev(uint64_t seed, uint64_t step) {
    const uint64_t z = mix64(mix64(seed) + (step + 1) * 0x9E3779B97F4A7C15ull);
    return (double)(z >> 11) * 0x1.0p-53;
}

/* ---- keys and weights, bit for bit as sampling.c computes them ------------------------------- */

/* The float's bits as an unsigned integer ascending in its value, -0 as +0. */
static __device__ __forceinline__ uint32_t ascending_bits(float v) {
    uint32_t u = __float_as_uint(v);
    if (u == 0x80000000u) u = 0;
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

static __device__ __forceinline__ float from_ascending_bits(uint32_t a) {
    return __uint_as_float((a & 0x80000000u) ? (a & 0x7fffffffu) : ~a);
}

/* rank_key of sampling.c: ascending = logit descending, then id ascending. */
static __device__ __forceinline__ uint64_t rank_key(float v, int id) {
    return ((uint64_t)(uint32_t)~ascending_bits(v) << 32) | (uint32_t)id;
}

/* (max - logit) / t; the _rn intrinsics keep the compiler from fusing what the host rounds
 * twice. */
static __device__ __forceinline__ double distance(float xmax, float v, double inv_t) {
    return __dmul_rn(__dsub_rn((double)xmax, (double)v), inv_t);
}

static __device__ __forceinline__ int weight_bin(double d) {
    const double b = d * BINS_PER_NAT;
    return b < N_BINS - 1 ? (int)b : N_BINS - 1;
}

/* ---- warp and block helpers ------------------------------------------------------------------ */

struct SumD {
    __device__ double operator()(double a, double b) const { return a + b; }
};
struct MaxF {
    __device__ float operator()(float a, float b) const { return fmaxf(a, b); }
};
struct MinI {
    __device__ int operator()(int a, int b) const { return a < b ? a : b; }
};
struct MaxI {
    __device__ int operator()(int a, int b) const { return a > b ? a : b; }
};
struct MinU64 {
    __device__ uint64_t operator()(uint64_t a, uint64_t b) const { return a < b ? a : b; }
};
struct MaxU64 {
    __device__ uint64_t operator()(uint64_t a, uint64_t b) const { return a > b ? a : b; }
};

template <typename T, typename Op> static __device__ __forceinline__ T warp_reduce(T v, Op op) {
#pragma unroll
    for (int o = 16; o > 0; o /= 2) v = op(v, __shfl_xor_sync(FULL, v, o));
    return v;
}

/* The block's reduction of v, in every thread; the warps' values are combined in warp order, so
 * the result does not depend on timing. `scratch` holds SAMPLE_WARPS values of 8 bytes. Its
 * barriers also publish every shared-memory write made before the call. */
template <typename T, typename Op>
static __device__ __forceinline__ T block_reduce(T v, Op op, double *scratch) {
    T *red = reinterpret_cast<T *>(scratch);
    v = warp_reduce(v, op);
    __syncthreads(); // every thread has read `scratch` of an earlier call
    if ((threadIdx.x & 31) == 0) red[threadIdx.x / 32] = v;
    __syncthreads();
    T r = red[0];
    for (int w = 1; w < SAMPLE_WARPS; w++) r = op(r, red[w]);
    return r;
}

/* f(i, x[i], valid) over ids [lo, hi) of one warp, each lane with UNROLL coalesced loads in flight;
 * every lane of the warp makes the same calls (valid false past hi), so f may use warp collectives.
 * A lane sees its ids in ascending order. */
template <typename F>
static __device__ __forceinline__ void warp_pass(const float *x, int lo, int hi, F &&f) {
    const int lane = threadIdx.x & 31;
    for (int base = lo; base < hi; base += 32 * UNROLL) {
        float v[UNROLL];
#pragma unroll
        for (int u = 0; u < UNROLL; u++) {
            const int i = base + 32 * u + lane;
            v[u] = i < hi ? x[i] : 0.0f;
        }
#pragma unroll
        for (int u = 0; u < UNROLL; u++) {
            const int i = base + 32 * u + lane;
            f(i, v[u], i < hi);
        }
    }
}

/* count[bin] += 1 for the lanes with bin >= 0 (all 32 lanes call it); one atomic for the warp when
 * they all hit the same bin, as the first digits of a radix select mostly do. */
static __device__ __forceinline__ void warp_count(unsigned *count, int bin) {
    const unsigned part = __ballot_sync(FULL, bin >= 0);
    if (!part) return;
    const int lead = __ffs(part) - 1;
    const int b0 = __shfl_sync(FULL, bin, lead);
    if (__all_sync(FULL, bin < 0 || bin == b0)) {
        if ((int)(threadIdx.x & 31) == lead) atomicAdd(&count[b0], (unsigned)__popc(part));
    } else if (bin >= 0) {
        atomicAdd(&count[bin], 1u);
    }
}

/* mass[bin] += w for the lanes with bin >= 0 (all 32 lanes call it), likewise; `mass` is the
 * histogram private to this warp's pair. */
static __device__ __forceinline__ void warp_add_mass(double *mass, int bin, double w) {
    const unsigned part = __ballot_sync(FULL, bin >= 0);
    if (!part) return;
    const int lead = __ffs(part) - 1;
    const int b0 = __shfl_sync(FULL, bin, lead);
    if (__all_sync(FULL, bin < 0 || bin == b0)) {
        const double s = warp_reduce(bin >= 0 ? w : 0.0, SumD());
        if ((int)(threadIdx.x & 31) == lead) atomicAdd(&mass[b0], s);
    } else if (bin >= 0) {
        atomicAdd(&mass[bin], w);
    }
}

static __device__ __forceinline__ void zero_private(double *priv) {
    for (int i = threadIdx.x; i < N_PRIV * N_BINS; i += SAMPLE_THREADS) priv[i] = 0.0;
}

/* out[b] = the private histograms' bin b (each nb bins), summed in a fixed order. */
static __device__ __forceinline__ void merge_private(double *out, const double *priv, int nb) {
    for (int b = threadIdx.x; b < nb; b += SAMPLE_THREADS) {
        double s = 0.0;
        for (int c = 0; c < N_PRIV; c++) s += priv[c * nb + b];
        out[b] = s;
    }
}

/* Warp-wide (one whole warp): the bin of count[0, nb) (nb a multiple of 32) that holds the k-th
 * smallest key (1 <= k <= the total); *k becomes the key's rank inside that bin. Integer counts:
 * the scan is exact. */
static __device__ int find_kth_bin(const unsigned *count, int nb, unsigned *k) {
    const int lane = threadIdx.x & 31, per = nb / 32;
    const unsigned *c = count + lane * per;
    unsigned s = 0;
    for (int j = 0; j < per; j++) s += c[j];
    unsigned incl = s;
#pragma unroll
    for (int o = 1; o < 32; o *= 2) {
        const unsigned t = __shfl_up_sync(FULL, incl, o);
        if (lane >= o) incl += t;
    }
    const unsigned excl = incl - s, kk = *k;
    const bool mine = excl < kk && kk <= incl;
    int b = 0;
    unsigned rest = 0;
    if (mine) {
        unsigned acc = excl;
        for (int j = 0; j < per && rest == 0; j++) {
            if (acc + c[j] >= kk) {
                b = lane * per + j;
                rest = kk - acc;
            }
            acc += c[j];
        }
    }
    const unsigned who = __ballot_sync(FULL, mine);
    const int src = who ? __ffs(who) - 1 : 0; // who != 0 while k <= the total
    b = __shfl_sync(FULL, b, src);
    rest = __shfl_sync(FULL, rest, src);
    *k = rest ? rest : 1;
    return b;
}

/* Warp-wide (one whole warp): the first bin b of mass[0, NB) at which the running weight, started
 * at base, reaches target, or -1 when it never does; *before = the running weight before b. The
 * running weight is one fixed sequence (each lane's NB / 32 bins in order, from base + the scan
 * of the lanes' sums), so b and *before agree with each other whatever the rounding. */
template <int NB>
static __device__ int find_cut(const double *mass, double base, double target, double *before) {
    constexpr int PER = NB / 32;
    const int lane = threadIdx.x & 31;
    double s = 0.0;
#pragma unroll
    for (int j = 0; j < PER; j++) s += mass[lane * PER + j];
    double incl = s;
#pragma unroll
    for (int o = 1; o < 32; o *= 2) {
        const double t = __shfl_up_sync(FULL, incl, o);
        if (lane >= o) incl += t;
    }
    double excl = __shfl_up_sync(FULL, incl, 1);
    if (lane == 0) excl = 0.0;
    double acc = base + excl, hit_before = 0.0;
    int hit = -1;
#pragma unroll
    for (int j = 0; j < PER; j++) {
        const double next = acc + mass[lane * PER + j]; // read again: fewer registers
        if (hit < 0 && next >= target) {
            hit = lane * PER + j;
            hit_before = acc;
        }
        acc = next;
    }
    const unsigned any = __ballot_sync(FULL, hit >= 0);
    if (!any) return -1;
    const int src = __ffs(any) - 1;
    *before = __shfl_sync(FULL, hit_before, src);
    return __shfl_sync(FULL, hit, src);
}

/* ---- the kernel ------------------------------------------------------------------------------ */

/* What the rows' passes share: the row, the candidates, top-p's cut, min-p. */
struct Row {
    const float *x;
    float xmax, lowest; // the candidates: logit >= lowest and > -inf
    double inv_t;
    int cut_bin;        // top-p: ids of bins > cut_bin, and of cut_bin with key > boundary, go
    uint64_t boundary;
    double min_p, min_p_d; // min-p: w >= min_p; a distance past min_p_d never is

    __device__ bool candidate(float v) const { return v >= lowest && v > -INFINITY; }

    /* Whether the filters keep id i (logit v), its weight underflowed or not. */
    __device__ bool kept(int i, float v) const {
        if (!candidate(v)) return false;
        const double d = distance(xmax, v, inv_t);
        if (cut_bin < N_BINS) {
            const int b = weight_bin(d);
            if (b > cut_bin || (b == cut_bin && rank_key(v, i) > boundary)) return false;
        }
        return d <= min_p_d && exp(-d) >= min_p;
    }

    /* The weight of id i (logit v) when the filters keep it, else 0. */
    __device__ double kept_weight(int i, float v) const {
        if (!candidate(v)) return 0.0;
        const double d = distance(xmax, v, inv_t);
        if (cut_bin < N_BINS) {
            const int b = weight_bin(d);
            if (b > cut_bin || (b == cut_bin && rank_key(v, i) > boundary)) return 0.0;
        }
        if (d > min_p_d) return 0.0;
        const double w = exp(-d);
        return w >= min_p ? w : 0.0;
    }
};

/* f(i, v, member) over the ids of top-p's cut bin: from the shared list when it holds them all
 * (n of them), else over the row (each warp its range). All threads call it. */
template <typename F>
static __device__ __forceinline__ void visit_cut_bin(const Row &row, bool listed, int n,
                                                     const int *list_id, const float *list_x,
                                                     int lo, int hi, F &&f) {
    if (listed) {
        for (int base = 0; base < n; base += SAMPLE_THREADS) {
            const int j = base + (int)threadIdx.x;
            const bool ok = j < n;
            f(ok ? list_id[j] : 0, ok ? list_x[j] : 0.0f, ok);
        }
    } else {
        warp_pass(row.x, lo, hi, [&](int i, float v, bool ok) {
            f(i, v, ok && row.candidate(v) &&
                        weight_bin(distance(row.xmax, v, row.inv_t)) == row.cut_bin);
        });
    }
}

/* sampling_top_logprobs of sampling.c (all threads call it): the n_top smallest rank keys of the
 * row x[vocab] (the processed logits), one block minimum a round over the keys above the last
 * round's; id i's log-probability -(xmax - v) · inv_t - log_total when kept(i, v), else -inf.
 * Thread 0 writes top_ids / top_lps [n_top]; past the vocab (-1, -inf). */
template <typename Kept>
static __device__ void top_logprobs_of_row(const float *x, int lo, int hi, float xmax, double inv_t,
                                           double log_total, const Kept &kept, int n_top, int32_t *top_ids,
                                           float *top_lps, double *s_red) {
    uint64_t prev = 0;
    for (int j = 0; j < n_top; j++) {
        uint64_t best = ~0ull; // no id's key: the NaN-free keys are below it
        warp_pass(x, lo, hi, [&](int i, float v, bool ok) {
            const uint64_t key = rank_key(v, i);
            if (ok && (j == 0 || key > prev) && key < best) best = key;
        });
        best = block_reduce(best, MinU64(), s_red);
        if (threadIdx.x == 0) {
            int id = -1;
            float lp = -INFINITY;
            if (best != ~0ull) {
                id = (int)(uint32_t)best;
                const float v = x[id];
                if (v > -INFINITY && kept(id, v)) lp = (float)(-distance(xmax, v, inv_t) - log_total);
            }
            top_ids[j] = id;
            top_lps[j] = lp;
        }
        prev = best;
    }
}

__global__ void __launch_bounds__(SAMPLE_THREADS, 1)
sample_rows_kernel(float *logits, int vocab, const cuda_sample_row *rows, const int32_t *history,
                   const nopad_logit_bias *biases, const uint32_t *masks, int32_t *ids, float *logprobs,
                   int n_top, int32_t *top_ids, float *top_logprobs) {
    __shared__ double s_red[SAMPLE_WARPS];
    __shared__ double s_mass[N_BINS]; // top-p's weight bins, then its digit bins (merged)
    __shared__ double s_wsum[SAMPLE_WARPS]; // the draw: kept weight of each warp's range
    __shared__ int s_wlast[SAMPLE_WARPS];   // and its last id of positive weight
    __shared__ int s_bin, s_members, s_pick, s_chosen;
    __shared__ unsigned s_rank;
    __shared__ double s_before, s_base, s_total, s_target;
    extern __shared__ __align__(16) unsigned char s_dyn[];
    const size_t bitmap_bytes = ((size_t)vocab + 31) / 32 * sizeof(uint32_t);
    uint32_t *bitmap = reinterpret_cast<uint32_t *>(s_dyn); // the penalty's, first
    double *priv = reinterpret_cast<double *>(s_dyn);       // then the private histograms
    int *list_id = reinterpret_cast<int *>(s_dyn + (bitmap_bytes > PRIV_BYTES ? bitmap_bytes
                                                                              : PRIV_BYTES));
    float *list_x = reinterpret_cast<float *>(list_id + LIST_CAP);
    unsigned *topk_count = reinterpret_cast<unsigned *>(list_id); // before the list
    int *out_ids = list_id; // the output's ids for its penalties, before both

    const int tid = threadIdx.x, lane = tid & 31, warp = tid / 32, r = blockIdx.x;
    float *x = logits + (size_t)r * vocab;
    const cuda_sample_row p = rows[r];
    const float t = p.temperature, pen = p.repetition_penalty;
    const int hl = p.history_len;
    const int32_t *hist = history ? history + p.history_start : nullptr;
    int32_t *row_top_ids = top_ids + (size_t)r * n_top;
    float *row_top_lps = top_logprobs + (size_t)r * n_top;
    // each warp's range of the row (passes, and the draw's first level)
    const int span = ((vocab + SAMPLE_WARPS - 1) / SAMPLE_WARPS + 31) / 32 * 32;
    const int lo = min(warp * span, vocab), hi = min(lo + span, vocab);
    // every branch on the row's values below is the same in all threads of the CTA
#define FINISH(id_, lp_)                                                                           \
    do {                                                                                           \
        if (tid == 0) {                                                                            \
            ids[r] = (id_);                                                                        \
            if (logprobs) logprobs[r] = (lp_);                                                     \
        }                                                                                          \
    } while (0)
    // a row without a choice lists no ids (its -1 is the error the host reports)
#define FINISH_NONE()                                                                              \
    do {                                                                                           \
        FINISH(-1, NAN);                                                                           \
        for (int j = tid; j < n_top; j += SAMPLE_THREADS) {                                        \
            row_top_ids[j] = -1;                                                                   \
            row_top_lps[j] = NAN;                                                                  \
        }                                                                                          \
    } while (0)

    // sampling_check's ranges; the host reports what -1 stands for
    const bool bad_params = !(t >= 0.0f && t <= FLT_MAX) || p.top_k < 0 ||
                            !(p.top_p > 0.0f && p.top_p <= 1.0f) ||
                            !(p.min_p >= 0.0f && p.min_p < 1.0f) ||
                            !(pen > 0.0f && pen <= FLT_MAX) || hl < 0 ||
                            (hl > 0 && (!hist || p.history_start < 0)) ||
                            !(p.presence_penalty >= -2.0f && p.presence_penalty <= 2.0f) ||
                            !(p.frequency_penalty >= -2.0f && p.frequency_penalty <= 2.0f) ||
                            p.bias_len < 0 || (p.bias_len > 0 && (!biases || p.bias_start < 0)) ||
                            p.mask_index < 0 || (p.mask_index > 0 && !masks);
    if (bad_params) {
        FINISH_NONE();
        return;
    }
    const int words = (vocab + 31) / 32;

    // the constraint's mask: the refused ids are -inf before anything reads the row
    if (p.mask_index > 0) {
        const uint32_t *mask = masks + (size_t)(p.mask_index - 1) * words;
        for (int i = tid; i < vocab; i += SAMPLE_THREADS)
            if (!(mask[i >> 5] >> (i & 31) & 1u)) x[i] = -INFINITY;
        __syncthreads();
    }
    // logit_bias, a thread a pair (no id twice); its ids are checked here, the logits with the max
    int bad = 0;
    if (p.bias_len > 0) {
        for (int j = tid; j < p.bias_len; j += SAMPLE_THREADS) {
            const nopad_logit_bias b = biases[p.bias_start + j];
            if (b.id < 0 || b.id >= vocab || !(b.bias >= -100.0f && b.bias <= 100.0f)) {
                bad = 1;
                continue;
            }
            x[b.id] = __fadd_rn(x[b.id], b.bias);
        }
        __syncthreads();
    }

    // check_call's history ids; HF's repetition penalty in fp32, once per distinct id: by the
    // thread whose atomicOr sets the id's bit. The host checks the logits before the penalty,
    // which would turn +inf into FLT_MAX: the penalised ids are checked here.
    const bool penalise = pen != 1.0f && hl > 0;
    // the output: the last min(step, history_len) ids of the history
    const int n_out = (uint64_t)hl < p.step ? hl : (int)p.step;
    const bool penalise_output = (p.presence_penalty != 0.0f || p.frequency_penalty != 0.0f) && n_out > 0;
    // top-k's first digit is counted in the pass that takes the max
    const bool top_k = t > 0.0f && p.top_k > 1 && p.top_k < vocab;
    if (penalise || penalise_output) {
        for (int i = tid; i < words; i += SAMPLE_THREADS) bitmap[i] = 0;
        __syncthreads();
    }
    for (int h = tid; h < hl; h += SAMPLE_THREADS) {
        const int id = hist[h];
        if (id < 0 || id >= vocab) {
            bad = 1;
            continue;
        }
        if (!penalise) continue;
        const uint32_t bit = 1u << (id & 31);
        if (atomicOr(&bitmap[id >> 5], bit) & bit) continue; // another entry has this id
        const float v = x[id];
        bad |= (v != v) | (v == INFINITY);
        const float y = v < 0.0f ? __fmul_rn(v, pen) : __fdiv_rn(v, pen);
        x[id] = y > FLT_MAX ? FLT_MAX : y;
    }
    if (penalise) __syncthreads(); // the penalised logits, for every thread

    // OpenAI's frequency and presence penalties over the output, as vLLM orders them: the thread
    // that sets a distinct id's bit counts its occurrences and applies both, in fp32
    if (__syncthreads_or(bad)) {
        FINISH_NONE();
        return;
    }
    if (penalise_output) {
        const int32_t *output = hist + (hl - n_out);
        const bool listed = n_out <= 2 * LIST_CAP; // the list's ids and logits hold as many ints
        if (listed)
            for (int h = tid; h < n_out; h += SAMPLE_THREADS) out_ids[h] = output[h];
        if (penalise)
            for (int i = tid; i < words; i += SAMPLE_THREADS) bitmap[i] = 0;
        __syncthreads();
        const int32_t *out = listed ? out_ids : output;
        for (int h = tid; h < n_out; h += SAMPLE_THREADS) {
            const int id = out[h];
            const uint32_t bit = 1u << (id & 31);
            if (atomicOr(&bitmap[id >> 5], bit) & bit) continue;
            int count = 0;
            for (int g = 0; g < n_out; g++) count += out[g] == id;
            const float v = __fsub_rn(x[id], __fmul_rn(p.frequency_penalty, (float)count));
            x[id] = __fsub_rn(v, p.presence_penalty);
        }
        __syncthreads(); // every thread has read the list (top-k's counts overlay it)
    }
    if (top_k) {
        for (int i = tid; i < TOPK_BINS; i += SAMPLE_THREADS) topk_count[i] = 0;
        __syncthreads();
    }

    // NaN / +inf, the max and the lowest id holding it (a lane sees its ids in ascending order);
    // greedy's sum of exp(logit - max), taken from the lane's running max (expf, in double)
    const bool greedy_lp = t == 0.0f && (logprobs || n_top > 0);
    float m = -INFINITY;
    int arg = INT_MAX;
    double zg = 0.0;
    warp_pass(x, lo, hi, [&](int i, float v, bool ok) {
        int bin = -1;
        if (ok) {
            bad |= (v != v) | (v == INFINITY);
            if (v > m) {
                if (greedy_lp) zg = zg * (double)expf(m - v) + 1.0;
                m = v;
                arg = i;
            } else if (greedy_lp && v > -INFINITY) {
                zg += (double)expf(v - m);
            }
            if (top_k) bin = (int)(~ascending_bits(v) >> topk_shift(0));
        }
        if (top_k) warp_count(topk_count, bin);
    });
    if (__syncthreads_or(bad)) {
        FINISH_NONE();
        return;
    }
    const float xmax = block_reduce(m, MaxF(), s_red);
    if (xmax == -INFINITY) {
        FINISH_NONE();
        return;
    }

    if (t == 0.0f) { // greedy: the lowest id among the maxima; logprob at temperature 1
        const int best = block_reduce(m == xmax ? arg : INT_MAX, MinI(), s_red);
        double z = 0.0;
        if (greedy_lp)
            z = block_reduce(m > -INFINITY ? zg * exp((double)m - (double)xmax) : 0.0, SumD(),
                             s_red);
        if (n_top > 0)
            top_logprobs_of_row(x, lo, hi, xmax, 1.0, log(z), [](int, float) { return true; }, n_top,
                                row_top_ids, row_top_lps, s_red);
        FINISH(best, (float)-log(z));
        return;
    }

    Row row;
    row.x = x;
    row.xmax = xmax;
    row.lowest = -INFINITY;
    row.inv_t = __ddiv_rn(1.0, (double)t);
    row.cut_bin = N_BINS; // no top-p cut: every candidate stays
    row.boundary = ~0ull;
    row.min_p = (double)p.min_p;
    row.min_p_d = p.min_p > 0.0f ? -log(row.min_p) + 1e-6 : INFINITY; // far past rounding

    // top-k: the candidates are the ids whose logit is >= the k-th largest (ties kept)
    if (p.top_k > 0 && p.top_k < vocab) {
        if (p.top_k == 1) {
            row.lowest = xmax;
        } else { // the k-th smallest of ~ascending_bits: the k-th largest logit
            uint32_t prefix = 0, mask = 0;
            unsigned k = (unsigned)p.top_k;
            for (int d = 0; d < 3; d++) {
                const int shift = topk_shift(d), nb = d == 2 ? 1024 : TOPK_BINS;
                if (d > 0) { // the first digit's counts come from the max's pass
                    for (int i = tid; i < TOPK_BINS; i += SAMPLE_THREADS) topk_count[i] = 0;
                    __syncthreads();
                    warp_pass(x, lo, hi, [&](int, float v, bool ok) {
                        int bin = -1;
                        if (ok) {
                            const uint32_t key = ~ascending_bits(v);
                            if ((key & mask) == prefix) bin = (int)((key >> shift) & (nb - 1));
                        }
                        warp_count(topk_count, bin);
                    });
                    __syncthreads();
                }
                if (warp == 0) {
                    unsigned kk = k;
                    const int b = find_kth_bin(topk_count, nb, &kk);
                    if (lane == 0) {
                        s_bin = b;
                        s_rank = kk;
                    }
                }
                __syncthreads();
                prefix |= (uint32_t)s_bin << shift;
                mask |= (uint32_t)(nb - 1) << shift;
                k = s_rank;
            }
            row.lowest = from_ascending_bits(~prefix);
        }
    }

    // the candidates' weights: their total z; with top-p the weight per bin, else the draw's sums
    const bool top_p = p.top_p < 1.0f;
    if (top_p) {
        zero_private(priv);
        __syncthreads();
    }
    double *my_priv = priv + (warp / 2) * N_BINS;
    double z = 0.0, tail = 0.0, wsum = 0.0; // tail: the last bin, which most ids fall in
    int wlast = -1;
    warp_pass(x, lo, hi, [&](int i, float v, bool ok) {
        int bin = -1;
        double w = 0.0;
        if (ok && row.candidate(v)) {
            const double d = distance(xmax, v, row.inv_t);
            w = exp(-d);
            z += w;
            if (top_p) {
                const int b = weight_bin(d);
                if (b == N_BINS - 1) tail += w;
                else if (w > 0.0) bin = b;
            } else if (w > 0.0 && w >= row.min_p) {
                wsum += w;
                wlast = i;
            }
        }
        if (top_p) warp_add_mass(my_priv, bin, w);
    });
    z = block_reduce(z, SumD(), s_red);

    // top-p: the cut bin, then the boundary key inside it
    if (top_p) {
        tail = block_reduce(tail, SumD(), s_red); // (its barriers: every atomic is done)
        merge_private(s_mass, priv, N_BINS);
        __syncthreads();
        if (tid == 0) s_mass[N_BINS - 1] += tail;
        __syncthreads();
        const double target = __dmul_rn((double)p.top_p, z);
        if (warp == 0) {
            double before = 0.0;
            const int b = find_cut<N_BINS>(s_mass, 0.0, target, &before);
            if (lane == 0) {
                s_bin = b;
                s_before = before;
                s_members = 0;
            }
        }
        __syncthreads();
        if (s_bin >= 0) { // else rounding left top_p x z above the whole weight: keep all
            row.cut_bin = s_bin;
            double before = s_before;
            // the bin's ids and logits into the list while they fit; its smallest and largest key
            uint64_t kmin = ~0ull, kmax = 0;
            warp_pass(x, lo, hi, [&](int i, float v, bool ok) {
                const bool member = ok && row.candidate(v) &&
                                    weight_bin(distance(xmax, v, row.inv_t)) == row.cut_bin;
                if (member) {
                    const uint64_t key = rank_key(v, i);
                    kmin = min(kmin, key);
                    kmax = max(kmax, key);
                }
                const unsigned bal = __ballot_sync(FULL, member);
                if (bal) {
                    const int lead = __ffs(bal) - 1;
                    int start = 0;
                    if (lane == lead) start = atomicAdd(&s_members, __popc(bal));
                    start = __shfl_sync(FULL, start, lead);
                    const int slot = start + __popc(bal & ((1u << lane) - 1u));
                    if (member && slot < LIST_CAP) {
                        list_id[slot] = i;
                        list_x[slot] = v;
                    }
                }
            });
            kmin = block_reduce(kmin, MinU64(), s_red); // (its barriers publish the list)
            kmax = block_reduce(kmax, MaxU64(), s_red);
            const int n_members = s_members;
            const bool listed = n_members <= LIST_CAP;
            // rounds of radix select over the keys in [kmin, kmax], all sharing the bits above
            // the highest one where kmin and kmax differ
            for (;;) {
                if (kmin >= kmax) { // one id left (or none: the bin is empty, keep none of it)
                    row.boundary = kmin == kmax ? kmin : 0;
                    break;
                }
                const int shift = (63 - __clzll((long long)(kmin ^ kmax))) & ~7;
                const uint64_t mask = shift >= 56 ? 0ull : ~0ull << (shift + 8);
                const uint64_t prefix = kmin & mask;
                zero_private(priv);
                __syncthreads();
                double *digit_priv = priv + (warp / 2) * 256;
                visit_cut_bin(row, listed, n_members, list_id, list_x, lo, hi,
                              [&](int i, float v, bool member) {
                                  int bin = -1;
                                  double w = 0.0;
                                  if (member) {
                                      const uint64_t key = rank_key(v, i);
                                      if ((key & mask) == prefix) {
                                          w = exp(-distance(xmax, v, row.inv_t));
                                          if (w > 0.0) bin = (int)((key >> shift) & 255u);
                                      }
                                  }
                                  warp_add_mass(digit_priv, bin, w);
                              });
                __syncthreads();
                merge_private(s_mass, priv, 256);
                __syncthreads();
                if (warp == 0) {
                    double bf = 0.0;
                    const int b = find_cut<256>(s_mass, before, target, &bf);
                    if (lane == 0) {
                        s_bin = b;
                        s_before = bf;
                    }
                }
                __syncthreads();
                const int b = s_bin;
                if (b < 0) { // rounding: the target lies past these ids; keep them all
                    row.boundary = kmax;
                    break;
                }
                before = s_before;
                const uint64_t dmask = mask | (0xffull << shift);
                const uint64_t dprefix = prefix | ((uint64_t)b << shift);
                uint64_t nmin = ~0ull, nmax = 0;
                visit_cut_bin(row, listed, n_members, list_id, list_x, lo, hi,
                              [&](int i, float v, bool member) {
                                  if (!member) return;
                                  const uint64_t key = rank_key(v, i);
                                  if ((key & dmask) == dprefix) {
                                      nmin = min(nmin, key);
                                      nmax = max(nmax, key);
                                  }
                              });
                kmin = block_reduce(nmin, MinU64(), s_red);
                kmax = block_reduce(nmax, MaxU64(), s_red);
                if (kmin > kmax) { // the digit holds no id (rounding): keep the ids before it
                    row.boundary = dprefix | ~dmask;
                    break;
                }
            }
        }
        // the draw's sums over the kept ids, now that the boundary is known
        warp_pass(x, lo, hi, [&](int i, float v, bool ok) {
            const double w = ok ? row.kept_weight(i, v) : 0.0;
            if (w > 0.0) {
                wsum += w;
                wlast = i;
            }
        });
    }

    // the draw, first level: the warps' ranges, scanned in order by one thread
    wsum = warp_reduce(wsum, SumD());
    wlast = warp_reduce(wlast, MaxI());
    if (lane == 0) {
        s_wsum[warp] = wsum;
        s_wlast[warp] = wlast;
    }
    __syncthreads();
    if (tid == 0) {
        double total = 0.0;
        int last = -1;
        for (int w = 0; w < SAMPLE_WARPS; w++) {
            total += s_wsum[w];
            last = max(last, s_wlast[w]);
        }
        const double target = __dmul_rn(sampling_uniform_dev(p.seed, p.step), total);
        double acc = 0.0;
        int pick = -1;
        for (int w = 0; w < SAMPLE_WARPS; w++) { // the same sums again: acc ends at total
            const double next = acc + s_wsum[w];
            if (next > target) {
                pick = w;
                break;
            }
            acc = next;
        }
        s_pick = pick;
        s_chosen = last; // when u x total rounds up to the total: the host takes the last id
        s_base = acc;
        s_total = total;
        s_target = target;
    }
    __syncthreads();
    const double total = s_total, target = s_target;
    const int pick = s_pick;
    if (n_top > 0)
        top_logprobs_of_row(x, lo, hi, xmax, row.inv_t, log(total),
                            [&](int i, float v) { return row.kept(i, v); }, n_top, row_top_ids, row_top_lps,
                            s_red);
    if (pick < 0) {
        const int c = s_chosen;
        FINISH(c, c >= 0 ? (float)(-distance(xmax, x[c], row.inv_t) - log(total)) : NAN);
        return;
    }
    // second level: the 32 pieces of the picked warp's range, one a warp
    const int plo = min(pick * span, vocab), phi = min(plo + span, vocab);
    const int piece = ((phi - plo + SAMPLE_WARPS - 1) / SAMPLE_WARPS + 31) / 32 * 32;
    const int qlo = min(plo + warp * piece, phi), qhi = min(qlo + piece, phi);
    wsum = 0.0;
    wlast = -1;
    warp_pass(x, qlo, qhi, [&](int i, float v, bool ok) {
        const double w = ok ? row.kept_weight(i, v) : 0.0;
        if (w > 0.0) {
            wsum += w;
            wlast = i;
        }
    });
    wsum = warp_reduce(wsum, SumD());
    wlast = warp_reduce(wlast, MaxI());
    __syncthreads(); // thread 0 has read the first level's sums
    if (lane == 0) {
        s_wsum[warp] = wsum;
        s_wlast[warp] = wlast;
    }
    __syncthreads();
    if (tid == 0) {
        double acc = s_base;
        int pick2 = -1, last = -1;
        for (int w = 0; w < SAMPLE_WARPS; w++) {
            last = max(last, s_wlast[w]);
            const double next = acc + s_wsum[w];
            if (pick2 < 0 && next > target) {
                pick2 = w;
                s_base = acc;
            }
            acc = next;
        }
        s_pick = pick2;
        s_chosen = last; // rounding: the range's sum passed the target, its pieces' did not
    }
    __syncthreads();
    const int pick2 = s_pick;
    if (pick2 < 0) {
        const int c = s_chosen;
        FINISH(c, c >= 0 ? (float)(-distance(xmax, x[c], row.inv_t) - log(total)) : NAN);
        return;
    }
    if (warp != pick2) return;
    // third level: that warp walks its piece in id order, 32 ids at a time: the first id whose
    // running weight exceeds the target
    double acc = s_base;
    int chosen = -1, last_pos = -1;
    for (int base = qlo; base < qhi; base += 32) {
        const int i = base + lane;
        const double w = i < qhi ? row.kept_weight(i, x[i]) : 0.0;
        double incl = w;
#pragma unroll
        for (int o = 1; o < 32; o *= 2) {
            const double u = __shfl_up_sync(FULL, incl, o);
            if (lane >= o) incl += u;
        }
        const unsigned cross = __ballot_sync(FULL, w > 0.0 && acc + incl > target);
        if (cross) {
            chosen = base + __ffs(cross) - 1;
            break;
        }
        const unsigned pos = __ballot_sync(FULL, w > 0.0);
        if (pos) last_pos = base + 31 - __clz(pos);
        acc += __shfl_sync(FULL, incl, 31);
    }
    if (chosen < 0) chosen = last_pos; // rounding: the piece's sum passed the target, its walk not
    if (lane == 0) {
        ids[r] = chosen;
        if (logprobs)
            logprobs[r] =
                chosen >= 0 ? (float)(-distance(xmax, x[chosen], row.inv_t) - log(total)) : NAN;
    }
#undef FINISH_NONE
#undef FINISH
}

/* ---- the C launcher ----------------------------------------------------------------------- */

extern "C" nopad_status cuda_sample_rows(float *logits, int32_t n, int32_t vocab,
                                         const cuda_sample_row *rows, const int32_t *history,
                                         const nopad_logit_bias *biases, const uint32_t *masks,
                                         int32_t *ids, float *logprobs, int32_t n_top, int32_t *top_ids,
                                         float *top_logprobs, void *stream) {
    if (n < 0 || vocab <= 0)
        return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT,
                               "cuda sample_rows: %d rows of vocab %d; rows must be >= 0 and the "
                               "vocab > 0", n, vocab);
    if (n == 0) return NOPAD_OK;
    if (!logits || !rows || !ids)
        return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT, "cuda sample_rows: %s is NULL",
                               !logits ? "logits" : !rows ? "rows" : "ids");
    if (n_top < 0 || n_top > NOPAD_MAX_TOP_LOGPROBS || (n_top > 0 && (!top_ids || !top_logprobs)))
        return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT,
                               "cuda sample_rows: %d top ids%s; 0 to %d, with top_ids and top_logprobs",
                               n_top, n_top > 0 && (!top_ids || !top_logprobs) ? " without their arrays" : "",
                               NOPAD_MAX_TOP_LOGPROBS);
    const size_t bitmap = ((size_t)vocab + 31) / 32 * sizeof(uint32_t);
    const size_t smem = (bitmap > PRIV_BYTES ? bitmap : PRIV_BYTES) + LIST_BYTES;
    if (smem > MAX_DYNAMIC_SMEM)
        return nopad_set_error(NOPAD_ERR_UNSUPPORTED,
                               "cuda sample_rows: a vocab of %d ids; the sampler takes at most %zu",
                               vocab, (MAX_DYNAMIC_SMEM - LIST_BYTES) * 8);
    // above 48 KiB a kernel must opt in: once a device
    static int attr_set[CUDA_MAX_DEVICES];
    const int dev = cuda_current_device();
    if (dev < 0 || !cuda_cache_load(&attr_set[dev])) {
        cudaError_t e = cudaFuncSetAttribute(sample_rows_kernel,
                                             cudaFuncAttributeMaxDynamicSharedMemorySize,
                                             (int)MAX_DYNAMIC_SMEM);
        if (e != cudaSuccess)
            return nopad_set_error(NOPAD_ERR_BACKEND, "cuda sample_rows: %s",
                                   cudaGetErrorString(e));
        if (dev >= 0) cuda_cache_store(&attr_set[dev], 1);
    }
    sample_rows_kernel<<<n, SAMPLE_THREADS, smem, (cudaStream_t)stream>>>(
        logits, vocab, rows, history, biases, masks, ids, logprobs, n_top, top_ids, top_logprobs);
    return launch_status("sample_rows");
}
