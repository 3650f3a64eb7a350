/* The CPU's paged attention (attention_paged, cpu_attention_paged.c) on every path this CPU runs
 * (portable C, and AVX2 + FMA where the CPU has them) against a double-precision reference that
 * reads the same paged cache: grouped-query, multi-head and multi-query heads, several sequences
 * of random lengths (1 and the longest included) with and without history, prompts spanning many
 * KV blocks, key chunks and key segments (merged, one masking some rows whole), decode steps, head
 * sizes off the kernels' 4-wide steps, block sizes that cut the key chunks; a sequence alone or cut
 * in two bit for bit as in the batch; and its 2^x against exp2 in double. */
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "backend/cpu/cpu_attention_paged.h"
#include "testutil.h"

static nopad_backend *be;

static int setup(void **state) { return nopad_backend_cpu_create(2, &be) == NOPAD_OK ? 0 : -1; }
static int teardown(void **state) {
    be->destroy(be);
    return 0;
}

/* The paths to run: the portable one, and the best one when it is another. */
static int paths(cpu_quant_isa isa[2]) {
    isa[0] = CPU_QUANT_PORTABLE;
    isa[1] = cpu_quant_best_isa();
    return isa[1] == CPU_QUANT_PORTABLE ? 1 : 2;
}

/* exp2 in double, a float's ulp-free measure: the kernels' 2^x is a degree-6 polynomial whose
 * float evaluation was measured at 1.05e-7 relative on [-1/2, 1/2] (the header); 1.5e-7 allows
 * the FMA path's other roundings. Below 2^-125 the kernels give 0 (masked keys weigh nothing,
 * and such a weight is < 2^-125 of the row's largest, 1), NaN stays NaN. */
static void test_exp2(void **state) {
    enum { N = 400003 };
    float *x = malloc(N * sizeof *x), *y = malloc(N * sizeof *y);
    for (int i = 0; i < N - 3; i++) x[i] = -130.0f * (float)i / (float)(N - 4); /* 0 .. -130, n > 1/2 ulp apart */
    x[N - 3] = -INFINITY, x[N - 2] = NAN, x[N - 1] = -0.0f;
    cpu_quant_isa isa[2];
    for (int pi = 0, n = paths(isa); pi < n; pi++) {
        cpu_attention_exp2_on(isa[pi], y, x, N);
        double worst = 0.0;
        for (int i = 0; i < N - 2; i++) {
            if (x[i] < -125.0f) {
                if (y[i] != 0.0f) fail_msg("path %d: 2^%.9g = %.9g, not 0", (int)isa[pi], x[i], y[i]);
                continue;
            }
            const double want = exp2((double)x[i]), err = fabs((double)y[i] - want) / want;
            if (err > worst) worst = err;
            if (!(err <= 1.5e-7))
                fail_msg("path %d: 2^%.9g = %.9g, want %.9g (%.2e)", (int)isa[pi], x[i], y[i], want, err);
        }
        if (!isnan(y[N - 2])) fail_msg("path %d: 2^NaN = %g", (int)isa[pi], y[N - 2]);
        print_message("exp2 path %d: worst relative error %.3e\n", (int)isa[pi], worst);
    }
    free(x);
    free(y);
}

typedef struct paged_case {
    const char *what;
    int32_t n_seqs, n_heads, n_kv_heads, head_size, block_size;
    int32_t max_new;  /* new tokens of a sequence: 1 .. max_new, the last max_new and (B > 1) the first 1 */
    int32_t max_past; /* keys before them: min_past .. max_past (0: prompts only) */
    float q_range;    /* queries uniform in ±q_range: 1 gives scores of ~1, 8 sharp softmaxes */
    int32_t min_past;
} paged_case;

/* out[T, H·D] in double: sequence b's token t at position p attends to keys 0 .. p through the
 * block table, query head h to KV head h / (H / KVH). */
static void reference(double *out, const float *qkv, const float *kc, const float *vc, const nopad_kv_batch *kv,
                      int32_t H, int32_t KVH, int32_t D, double scale) {
    const size_t row = (size_t)(H + 2 * KVH) * D, kvrow = (size_t)KVH * D;
    double *w = malloc(((size_t)kv->max_k + 1) * sizeof *w);
    for (int32_t b = 0; b < kv->n_seqs; b++) {
        const int32_t n_new = kv->cu_q[b + 1] - kv->cu_q[b], past = kv->seqlen_k[b] - n_new;
        const int32_t *blocks = kv->block_table + (size_t)b * kv->max_blocks;
        for (int32_t i = 0; i < n_new; i++)
            for (int32_t h = 0; h < H; h++) {
                const int32_t t = kv->cu_q[b] + i, p = past + i, g = h / (H / KVH);
                const float *q = qkv + (size_t)t * row + (size_t)h * D;
                double mx = -INFINITY, sum = 0.0;
                for (int32_t j = 0; j <= p; j++) {
                    const size_t slot = (size_t)blocks[j / kv->block_size] * kv->block_size + j % kv->block_size;
                    const float *k = kc + slot * kvrow + (size_t)g * D;
                    double dot = 0.0;
                    for (int32_t d = 0; d < D; d++) dot += (double)q[d] * k[d];
                    w[j] = dot * scale;
                    mx = fmax(mx, w[j]);
                }
                for (int32_t j = 0; j <= p; j++) sum += (w[j] = exp(w[j] - mx));
                for (int32_t d = 0; d < D; d++) {
                    double acc = 0.0;
                    for (int32_t j = 0; j <= p; j++) {
                        const size_t slot = (size_t)blocks[j / kv->block_size] * kv->block_size + j % kv->block_size;
                        acc += w[j] * vc[slot * kvrow + (size_t)g * D + d];
                    }
                    out[(size_t)t * H * D + (size_t)h * D + d] = acc / sum;
                }
            }
    }
    free(w);
}

/* One case on every path: random lengths and histories, each sequence's blocks scattered over the
 * cache in a random order, the cache's other slots random too (a read outside the table shows). */
static void run_case(const paged_case *pc, uint64_t *rng) {
    const int32_t B = pc->n_seqs, H = pc->n_heads, KVH = pc->n_kv_heads, D = pc->head_size, BS = pc->block_size;
    int32_t *cu = malloc(((size_t)B + 1) * sizeof *cu), *seqlen = malloc((size_t)B * sizeof *seqlen);
    cu[0] = 0;
    int32_t max_q = 0, max_k = 0, max_blocks = 0;
    for (int32_t b = 0; b < B; b++) {
        const int32_t n_new = b == B - 1 ? pc->max_new : b == 0 ? 1 : 1 + (int32_t)(test_rand_u32(rng) % pc->max_new);
        const int32_t past = pc->min_past + (int32_t)(test_rand_u32(rng) % (pc->max_past - pc->min_past + 1));
        cu[b + 1] = cu[b] + n_new;
        seqlen[b] = past + n_new;
        if (n_new > max_q) max_q = n_new;
        if (seqlen[b] > max_k) max_k = seqlen[b];
        if ((seqlen[b] + BS - 1) / BS > max_blocks) max_blocks = (seqlen[b] + BS - 1) / BS;
    }
    const int32_t T = cu[B], n_blocks = B * max_blocks + 3; /* 3 spare blocks no table names */
    int32_t *table = malloc((size_t)B * max_blocks * sizeof *table), *perm = malloc((size_t)n_blocks * sizeof *perm);
    for (int32_t i = 0; i < n_blocks; i++) perm[i] = i;
    for (int32_t i = n_blocks - 1; i > 0; i--) {
        const int32_t j = (int32_t)(test_rand_u32(rng) % (uint32_t)(i + 1)), tmp = perm[i];
        perm[i] = perm[j], perm[j] = tmp;
    }
    for (int32_t i = 0; i < B * max_blocks; i++) table[i] = perm[i];
    const size_t row = (size_t)(H + 2 * KVH) * D, cache_n = (size_t)n_blocks * BS * KVH * D;
    float *qkv = malloc((size_t)T * row * sizeof *qkv), *kc = malloc(cache_n * sizeof *kc),
          *vc = malloc(cache_n * sizeof *vc), *out = malloc((size_t)T * H * D * sizeof *out);
    double *want = malloc((size_t)T * H * D * sizeof *want);
    test_fill_uniform(qkv, (int64_t)(T * row), -pc->q_range, pc->q_range, rng);
    test_fill_uniform(kc, (int64_t)cache_n, -1.0f, 1.0f, rng);
    test_fill_uniform(vc, (int64_t)cache_n, -1.0f, 1.0f, rng);
    const nopad_kv_batch kv = {.n_seqs = B, .n_tokens = T, .max_q = max_q, .max_k = max_k, .no_history = !pc->max_past,
                               .cu_q = cu, .seqlen_k = seqlen, .block_table = table, .max_blocks = max_blocks,
                               .block_size = BS};
    const float scale = 1.0f / sqrtf((float)D);
    reference(want, qkv, kc, vc, &kv, H, KVH, D, scale);
    /* Bound, against max|v| = 1: a weight e^(s - max) carries the score's float error (D products
     * of |q·k| ≤ q_range·scale each, summed: ~D·u·|s| at worst, ~sqrt(D)·u·|s| in practice, with
     * |s| up to q_range·sqrt(D)), the folded log2(e)·scale (u·|s|) and the exponential's 1.5e-7;
     * an output, a weighted mean of values in [-1, 1], moves by at most twice its weights'
     * relative error, plus the float sums of up to max_k weights and products (sqrt(n)·u in
     * practice). 1e-5 at q_range 1 (scores of a few units), 4e-5 at 8 (scores up to 60: their
     * rounding alone is ~4e-6 a weight). Measured: 0.7-1.7e-7 at 1, up to 9e-7 (decode) and
     * 1.8e-6 (the 600-token prompt) at 8. */
    const double tol = pc->q_range > 1.0f ? 4e-5 : 1e-5;
    cpu_quant_isa isa[2];
    for (int pi = 0, n = paths(isa); pi < n; pi++) {
        for (size_t i = 0; i < (size_t)T * H * D; i++) out[i] = NAN; /* poison: every row must be written */
        assert_int_equal(cpu_attention_paged_on(isa[pi], be, out, qkv, kc, vc, &kv, H, KVH, D, scale), NOPAD_OK);
        double worst = 0.0;
        for (size_t i = 0; i < (size_t)T * H * D; i++) {
            const double err = fabs((double)out[i] - want[i]);
            if (!(err <= tol))
                fail_msg("%s, path %d: out[token %zu, head %zu, %zu] = %.8g, want %.8g (error %.2e > %.0e)", pc->what,
                         (int)isa[pi], i / ((size_t)H * D), i / D % H, i % D, out[i], want[i], err, tol);
            if (err > worst) worst = err;
        }
        print_message("%-44s path %d: T %4d, max_k %4d, worst error %.2e\n", pc->what, (int)isa[pi], T, max_k, worst);
        /* the last sequence alone, and its new tokens' second half as a step of its own (the first
         * half then history), give the same bits: a row's arithmetic does not depend on the rows
         * that share its tile or step, so a prompt computes the same whole, in chunks or batched */
        const int32_t last = B - 1, n_new = cu[B] - cu[last], half = n_new / 2;
        float *alone = malloc((size_t)n_new * H * D * sizeof *alone);
        for (int split = 0; split < 2; split++) {
            const int32_t skip = split ? half : 0, cu1[2] = {0, n_new - skip};
            const nopad_kv_batch one = {.n_seqs = 1, .n_tokens = n_new - skip, .max_q = n_new - skip,
                                        .max_k = seqlen[last], .no_history = 0, .cu_q = cu1, .seqlen_k = seqlen + last,
                                        .block_table = table + (size_t)last * max_blocks, .max_blocks = max_blocks,
                                        .block_size = BS};
            assert_int_equal(cpu_attention_paged_on(isa[pi], be, alone, qkv + (size_t)(cu[last] + skip) * row, kc, vc,
                                                    &one, H, KVH, D, scale),
                             NOPAD_OK);
            if (memcmp(alone, out + (size_t)(cu[last] + skip) * H * D, (size_t)(n_new - skip) * H * D * sizeof *alone))
                fail_msg("%s, path %d: the last sequence %s differs from the batch's", pc->what, (int)isa[pi],
                         split ? "from its middle on" : "alone");
        }
        free(alone);
    }
    if (be->attention_paged) { /* the op table's entry is one of the paths */
        assert_int_equal(be->attention_paged(be, out, qkv, kc, vc, &kv, H, KVH, D, scale), NOPAD_OK);
        for (size_t i = 0; i < (size_t)T * H * D; i++)
            if (!(fabs((double)out[i] - want[i]) <= tol))
                fail_msg("%s: the op table's attention_paged at %zu", pc->what, i);
    }
    free(cu), free(seqlen), free(table), free(perm), free(qkv), free(kc), free(vc), free(out), free(want);
}

static void test_paged_attention(void **state) {
    uint64_t rng = 0x43A77E47104ull;
    const paged_case cases[] = {
        /* SmolLM2's heads (9 over 3: 3 rows a token, tiles of 16 rows cut tokens), prompts only */
        {"GQA 9/3 D64 prompts", 6, 9, 3, 64, 16, 150, 0, 1.0f, 0},
        /* prompts appended to histories (pos > 0), chunks straddling history and new keys */
        {"GQA 9/3 D64 prompts after history", 5, 9, 3, 64, 16, 70, 600, 1.0f, 0},
        /* a tile across the first key segment's end (CPU_ATTN_SEGMENT 512): its rows before it read
         * no key of the second segment, those after it both */
        {"GQA 9/3 D64 prompt across a segment's end", 1, 9, 3, 64, 16, 30, 500, 1.0f, 500},
        /* one long prompt over many blocks and chunks, sharp softmaxes: the running max moves */
        {"GQA 9/3 D64 one long prompt, sharp", 1, 9, 3, 64, 16, 600, 0, 8.0f, 0},
        /* decode: one new token a sequence over long histories */
        {"GQA 9/3 D64 decode", 7, 9, 3, 64, 16, 1, 900, 1.0f, 0},
        {"GQA 9/3 D64 decode, sharp", 3, 9, 3, 64, 16, 1, 1100, 8.0f, 0},
        /* multi-head (a group of 1), block size 7 (blocks cut the chunks of 32), D 128 */
        {"MHA 4/4 D128 block 7", 4, 4, 4, 128, 7, 45, 700, 1.0f, 0},
        /* multi-query: a group of 20 rows a token, more than a tile */
        {"MQA 20/1 D32", 3, 20, 1, 32, 16, 9, 50, 1.0f, 0},
        /* D 18 and 6: the 4-wide steps' tails; a group of 8 (2 tokens a tile) */
        {"GQA 16/2 D18 block 5", 4, 16, 2, 18, 5, 20, 600, 1.0f, 0},
        {"GQA 8/1 D6 block 1", 3, 8, 1, 6, 1, 17, 5, 1.0f, 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) run_case(&cases[i], &rng);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_exp2),
        cmocka_unit_test(test_paged_attention),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
