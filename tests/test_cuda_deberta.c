/* DeBERTa-v2/v3 and the classification heads on the CUDA backend (fp16 and bf16), issue 25.
 *
 * The op: attention_rel against the CPU reference (cpu_attention_rel, itself checked against HF's
 * formula in test_deberta.c) on random inputs rounded to the GPU dtype first, so both sides see
 * the same numbers; random lengths with 1 and 512 included; c2p, p2c and both; one table for both
 * terms (as DeBERTa-v3's shared keys make them alike) and two; log buckets of several sizes and
 * none, tables far shorter than the sequences (the clamp at both ends); head sizes 32/64/128 (the
 * tensor-core kernel) and 8/40 (the generic one); a recorded graph's shape (slack rows past the
 * last sequence, max_seqlen rounded up). Bound, row-relative: fp16 2e-3, bf16 1e-2, the bound of
 * plain attention in test_cuda_encoder.c. The relative terms are float32 dot products of the
 * rounded inputs (the CPU's are too; only the summation order differs, ~1e-7 relative), rounded
 * to fp16 (2^-11 of each term) before they join the float32 score; the rest is the attention's:
 * P rounded to the dtype before P·V (fp16 2^-11 relative, bf16 2^-8) and the output's rounding
 * (same), plus fp32 order differences.
 * Models: the tiny HF fixtures (scripts/make_deberta_fixtures.py) end to end from ids: last hidden
 * states within 5e-3 (fp16) / 2e-2 (bf16) row-relative of HF fp32 (the model bounds of
 * test_cuda_encoder.c: rounding compounds over the layers), padded = packed.
 * Heads: every family's *ForSequenceClassification fixture (test_heads.c's): logits within the
 * same bounds of HF's, relative to the batch's largest |logit|.
 * No GPU: exit 77 (ctest: skipped). */
#include <math.h>
#include <stdio.h>
#include <cuda_runtime.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_testutil.h"

#include "backend/backend.h"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/deberta/attention_rel.h"
#include "golden.h"

static const nopad_dtype DTYPES[2] = {NOPAD_DTYPE_F16, NOPAD_DTYPE_BF16};
static const char *const DTYPE_NAMES[2] = {"f16", "bf16"};
static const double OP_BOUND[2] = {2e-3, 1e-2};
static const double MODEL_BOUND[2] = {5e-3, 2e-2};

static float *random_floats(size_t n, float lo, float hi, uint64_t *rng) {
    float *x = malloc(n * sizeof(float));
    assert_non_null(x);
    test_fill_uniform(x, (int64_t)n, lo, hi, rng);
    return x;
}

/* ---- the op ----------------------------------------------------------------------------------- */

static void test_attention_rel_against_cpu(void **state) {
    nopad_backend *cpu = NULL;
    assert_nopad_ok(nopad_backend_cpu_create(2, &cpu));
    /* buckets <= 0: distances as they are, clamped to the table */
    const struct { int32_t buckets, max_rel, span, c2p, p2c, shared, d, graph; } CASES[] = {
        {256, 512, 256, 1, 1, 1, 64, 0},  /* DeBERTa-v3-base's setting (shared keys) */
        {256, 512, 256, 1, 1, 0, 64, 1},  /* the same, separate tables, a graph's shape */
        {8, 64, 8, 1, 1, 0, 32, 0},       /* small buckets: most distances saturate */
        {-1, 5, 5, 1, 1, 0, 128, 0},      /* no buckets, a table of 10 rows */
        {16, 40, 16, 1, 0, 0, 64, 0},     /* c2p only */
        {32, 256, 32, 0, 1, 0, 128, 1},   /* p2c only, a graph's shape */
        {4, 7, 4, 1, 1, 1, 32, 0},        /* the smallest buckets that reach */
        {8, 64, 8, 1, 1, 0, 8, 0},        /* the generic kernel (the fixtures' head size) */
        {-1, 24, 24, 1, 0, 0, 40, 1},     /* the generic kernel, no buckets, a graph's shape */
        {256, 140, 256, 1, 1, 0, 64, 0},  /* log buckets steeper than a row a distance: the
                                             windows of the tiles near |i - j| = 128 widest */
    };
    uint64_t rng = 2525;
    for (int di = 0; di < 2; di++) {
        nopad_backend *gpu = NULL;
        assert_nopad_ok(nopad_backend_cuda_create(DTYPES[di], 0, NULL, &gpu));
        for (size_t c = 0; c < sizeof CASES / sizeof CASES[0]; c++) {
            const int32_t n_heads = 3, d = CASES[c].d, H = n_heads * d, B = 6, k = CASES[c].span;
            const nopad_rel_positions rel = {.att_span = k, .position_buckets = CASES[c].buckets,
                                             .max_relative_positions = CASES[c].max_rel};
            int32_t cu[7] = {0}, max_len = 0;
            for (int32_t b = 0; b < B; b++) {
                const int32_t len = b == 0 ? 1 : b == 1 ? 512 : 1 + (int32_t)(test_rand_u32(&rng) % 300);
                cu[b + 1] = cu[b] + len;
                if (len > max_len) max_len = len;
            }
            const int32_t T = cu[B];
            /* a recorded graph runs the layers on a bucket of rows past T, with max_seqlen
             * rounded up to 64 (src/model/context.c run_encoder) */
            const int32_t rows = CASES[c].graph ? T + 37 : T;
            const int32_t dev_max_len = CASES[c].graph ? (max_len + 63) / 64 * 64 : max_len;
            float *qkv = random_floats((size_t)rows * 3 * H, -1.0f, 1.0f, &rng);
            float *pk = random_floats((size_t)2 * k * H, -1.0f, 1.0f, &rng);
            float *pq = CASES[c].shared ? pk : random_floats((size_t)2 * k * H, -1.0f, 1.0f, &rng);
            void *dqkv = test_to_device(gpu, qkv, (size_t)rows * 3 * H);
            void *dpk = test_to_device(gpu, pk, (size_t)2 * k * H);
            void *dpq = CASES[c].shared ? dpk : test_to_device(gpu, pq, (size_t)2 * k * H);
            void *dcu, *dout;
            assert_nopad_ok(gpu->alloc(gpu, sizeof cu, &dcu));
            assert_nopad_ok(gpu->upload_i32(gpu, dcu, cu, (size_t)B + 1));
            /* NaN everywhere first: a row the kernel does not write fails the comparison */
            float *nan = malloc((size_t)rows * H * sizeof *nan);
            assert_non_null(nan);
            for (size_t i = 0; i < (size_t)rows * H; i++) nan[i] = NAN;
            assert_nopad_ok(gpu->alloc(gpu, (size_t)rows * H * 2, &dout));
            assert_nopad_ok(gpu->upload_f32(gpu, dout, nan, (size_t)rows * H));
            free(nan);

            const float scale = 1.0f / sqrtf((float)d * (float)(1 + CASES[c].c2p + CASES[c].p2c));
            const nopad_seqs hs = {.n_seqs = B, .n_tokens = T, .max_seqlen = max_len, .cu_seqlens = cu};
            const nopad_seqs ds = {.n_seqs = B, .n_tokens = rows, .max_seqlen = dev_max_len, .cu_seqlens = dcu};
            assert_nopad_ok(gpu->attention_rel(gpu, dout, dqkv, &ds, n_heads, d, scale, CASES[c].c2p ? dpk : NULL,
                                               CASES[c].p2c ? dpq : NULL, &rel));
            float *want = malloc((size_t)T * H * sizeof *want), *got = malloc((size_t)rows * H * sizeof *got);
            assert_true(want && got);
            assert_nopad_ok(cpu->attention_rel(cpu, want, qkv, &hs, n_heads, d, scale, CASES[c].c2p ? pk : NULL,
                                               CASES[c].p2c ? pq : NULL, &rel));
            assert_nopad_ok(gpu->download_f32(gpu, got, dout, (size_t)rows * H));
            /* per sequence, so a failure names the length */
            double worst = 0;
            int32_t worst_len = 0;
            for (int32_t b = 0; b < B; b++) {
                const double e = test_max_row_rel_error(got + (size_t)cu[b] * H, want + (size_t)cu[b] * H,
                                                        cu[b + 1] - cu[b], H);
                if (!(e <= worst)) worst = e, worst_len = cu[b + 1] - cu[b];
            }
            printf("  %-4s d %3d buckets %4d max_rel %4d k %3d c2p %d p2c %d shared %d graph %d T %4d: "
                   "max row rel err %.2e (length %d)\n",
                   DTYPE_NAMES[di], d, CASES[c].buckets, CASES[c].max_rel, k, CASES[c].c2p, CASES[c].p2c,
                   CASES[c].shared, CASES[c].graph, T, worst, worst_len);
            if (!(worst <= OP_BOUND[di]))
                fail_msg("%s case %zu (d %d, buckets %d): row-relative error %.3e > %.0e at length %d",
                         DTYPE_NAMES[di], c, d, CASES[c].buckets, worst, OP_BOUND[di], worst_len);
            free(want), free(got), free(qkv), free(pk);
            if (!CASES[c].shared) free(pq), gpu->free(gpu, dpq);
            gpu->free(gpu, dqkv), gpu->free(gpu, dpk), gpu->free(gpu, dcu), gpu->free(gpu, dout);
        }
        gpu->destroy(gpu);
    }
    cpu->destroy(cpu);
}

/* ---- whole models ----------------------------------------------------------------------------- */

static nopad_model *load_cuda(const char *name, int di) {
    char rel[256];
    snprintf(rel, sizeof rel, "models/%s", name);
    nopad_model_params p = nopad_model_default_params();
    p.device = NOPAD_DEVICE_CUDA;
    p.dtype = DTYPES[di];
    nopad_model *m = NULL;
    assert_nopad_ok(nopad_model_load(test_data_path(rel), &p, &m));
    return m;
}

static const char *const DEBERTA[] = {"deberta_v3_a", "deberta_v2_b", "deberta_c2p", "deberta_p2c"};

static void test_deberta_hidden_states_match_hf(void **state) {
    for (int di = 0; di < 2; di++) {
        for (size_t i = 0; i < sizeof DEBERTA / sizeof DEBERTA[0]; i++) {
            nopad_model *m = load_cuda(DEBERTA[i], di);
            nopad_model_info info;
            assert_nopad_ok(nopad_model_get_info(m, &info));
            char rel[256];
            snprintf(rel, sizeof rel, "models/%s/golden.safetensors", DEBERTA[i]);
            safetensors_file f;
            assert_nopad_ok(safetensors_open(test_data_path(rel), &f));
            int64_t T, n_cu;
            int32_t *ids = golden_copy(&f, "input_ids", ST_I32, &T);
            int32_t *types = golden_copy(&f, "token_type_ids", ST_I32, NULL);
            int32_t *cu = golden_copy(&f, "cu_seqlens", ST_I32, &n_cu);
            float *want = golden_copy(&f, "last_hidden_state", ST_F32, NULL);
            const int32_t B = (int32_t)n_cu - 1, H = info.hidden_size;
            const int32_t *ty = info.type_vocab_size > 0 ? types : NULL;
            float *got = malloc((size_t)T * H * sizeof *got);
            assert_non_null(got);
            nopad_encode_params p = nopad_encode_default_params();
            p.pooling = NOPAD_POOLING_NONE;
            assert_nopad_ok(nopad_encode_packed(m, B, cu, ids, ty, &p, got, NULL));
            const double err = test_max_row_rel_error(got, want, T, H);

            /* the padded layout of the same batch: packed on entry, then the same forward */
            int32_t max_len = 0;
            for (int32_t s = 0; s < B; s++)
                if (cu[s + 1] - cu[s] > max_len) max_len = cu[s + 1] - cu[s];
            int32_t *pad_ids = calloc((size_t)B * max_len, sizeof *pad_ids);
            int32_t *pad_types = calloc((size_t)B * max_len, sizeof *pad_types);
            int32_t *lengths = malloc((size_t)B * sizeof *lengths);
            float *padded = malloc((size_t)B * max_len * H * sizeof *padded);
            assert_true(pad_ids && pad_types && lengths && padded);
            for (int32_t s = 0; s < B; s++) {
                lengths[s] = cu[s + 1] - cu[s];
                memcpy(pad_ids + (size_t)s * max_len, ids + cu[s], (size_t)lengths[s] * sizeof *ids);
                memcpy(pad_types + (size_t)s * max_len, types + cu[s], (size_t)lengths[s] * sizeof *ids);
            }
            const nopad_batch b = {.layout = NOPAD_LAYOUT_PADDED, .n_seqs = B, .max_len = max_len,
                                   .tokens = pad_ids, .token_type_ids = ty ? pad_types : NULL, .lengths = lengths};
            assert_nopad_ok(nopad_encode(nopad_model_context(m), &b, &p, padded, NULL));
            double pad_err = 0;
            for (int32_t s = 0; s < B; s++) {
                const double e = test_max_row_rel_error(padded + (size_t)s * max_len * H, got + (size_t)cu[s] * H,
                                                        lengths[s], H);
                if (!(e <= pad_err)) pad_err = e;
            }
            printf("  %-4s %-13s B=%d T=%-4d max row rel err %.2e (bound %.0e); padded vs packed %.2e\n",
                   DTYPE_NAMES[di], DEBERTA[i], B, (int)T, err, MODEL_BOUND[di], pad_err);
            if (!(err <= MODEL_BOUND[di]))
                fail_msg("%s %s: row-relative error %.3e > %.0e", DTYPE_NAMES[di], DEBERTA[i], err, MODEL_BOUND[di]);
            /* the same kernels on the same rows: equal up to nothing but identical arithmetic */
            if (!(pad_err <= 1e-6)) fail_msg("%s %s: padded differs from packed by %.3e", DTYPE_NAMES[di], DEBERTA[i], pad_err);
            free(pad_ids), free(pad_types), free(lengths), free(padded);
            free(got), free(want), free(cu), free(types), free(ids);
            safetensors_close(&f);
            nopad_model_free(m);
        }
    }
}

/* Every family's classifier (test_heads.c's fixtures): tanh (BERT, RoBERTa/XLM-R, ALBERT), gelu
 * (DeBERTa) and relu (DistilBERT) poolers, 1 to 3 labels. */
static const char *const CLASSIFIERS[] = {"bert_cls", "xlmr_rerank", "deberta_v3_a", "deberta_v2_b",
                                          "distilbert_cls", "albert_cls"};

static void test_heads_logits_match_hf(void **state) {
    for (int di = 0; di < 2; di++) {
        for (size_t i = 0; i < sizeof CLASSIFIERS / sizeof CLASSIFIERS[0]; i++) {
            nopad_model *m = load_cuda(CLASSIFIERS[i], di);
            nopad_model_info info;
            assert_nopad_ok(nopad_model_get_info(m, &info));
            const int32_t L = nopad_model_num_labels(m);
            char rel[256];
            snprintf(rel, sizeof rel, "models/%s/golden.safetensors", CLASSIFIERS[i]);
            safetensors_file f;
            assert_nopad_ok(safetensors_open(test_data_path(rel), &f));
            int64_t T, n_cu, n_logits;
            int32_t *ids = golden_copy(&f, "input_ids", ST_I32, &T);
            int32_t *types = golden_copy(&f, "token_type_ids", ST_I32, NULL);
            int32_t *cu = golden_copy(&f, "cu_seqlens", ST_I32, &n_cu);
            float *want = golden_copy(&f, "class_logits", ST_F32, &n_logits);
            const int32_t B = (int32_t)n_cu - 1;
            assert_int_equal(n_logits, (int64_t)B * L);
            float *got = malloc((size_t)n_logits * sizeof *got);
            assert_non_null(got);
            assert_nopad_ok(nopad_classify_packed(m, B, cu, ids, info.type_vocab_size > 0 ? types : NULL, got));
            double diff = 0, scale = 0;
            for (int64_t j = 0; j < n_logits; j++) {
                const double e = fabs((double)got[j] - want[j]);
                if (!(e <= diff)) diff = e; /* NaN propagates */
                if (fabs(want[j]) > scale) scale = fabs(want[j]);
            }
            const double err = diff / fmax(scale, 1e-6);
            printf("  %-4s %-15s %-10s B=%d labels=%d max |logit - HF| %.2e, / max |logit| %.2e (bound %.0e)\n",
                   DTYPE_NAMES[di], CLASSIFIERS[i], info.family, B, L, diff, err, MODEL_BOUND[di]);
            if (!(err <= MODEL_BOUND[di]))
                fail_msg("%s %s: logits' relative error %.3e > %.0e", DTYPE_NAMES[di], CLASSIFIERS[i], err,
                         MODEL_BOUND[di]);
            free(got), free(want), free(cu), free(types), free(ids);
            safetensors_close(&f);
            nopad_model_free(m);
        }
    }
}

/* ---- NOPAD_DEBERTA_BENCH=1: timings instead of the tests --------------------------------------- */

static int cmp_float(const void *a, const void *b) {
    const float x = *(const float *)a, y = *(const float *)b;
    return x < y ? -1 : x > y;
}

typedef struct {
    nopad_backend *g;
    void *out, *qkv, *pk, *pq;
    nopad_seqs seqs;
    nopad_rel_positions rel;
    int32_t heads, d;
    float scale;
} rel_bench;

static void run_op(rel_bench *c) {
    assert_nopad_ok(c->g->attention_rel(c->g, c->out, c->qkv, &c->seqs, c->heads, c->d, c->scale, c->pk, c->pq, &c->rel));
}

/* median ms of 20 CUDA-event timings after 5 untimed runs */
static float time_it(rel_bench *c, void (*fn)(rel_bench *)) {
    cudaStream_t st = (cudaStream_t)cuda_backend_stream(c->g);
    cudaEvent_t e0, e1;
    cudaEventCreate(&e0), cudaEventCreate(&e1);
    for (int i = 0; i < 5; i++) fn(c);
    assert_nopad_ok(c->g->synchronize(c->g));
    float ms[20];
    for (int i = 0; i < 20; i++) {
        cudaEventRecord(e0, st);
        fn(c);
        cudaEventRecord(e1, st);
        cudaEventSynchronize(e1);
        cudaEventElapsedTime(&ms[i], e0, e1);
    }
    cudaEventDestroy(e0), cudaEventDestroy(e1);
    qsort(ms, 20, sizeof ms[0], cmp_float);
    return ms[10];
}

/* One DeBERTa-v3-base layer's attention_rel (12 heads x 64, 256 buckets over 512, c2p + p2c with
 * two tables) on B sequences of L tokens, fp16. TFLOP/s counts plain attention's 4·L²·d a head and
 * sequence (the relative terms' products are extra work, not counted). */
static void bench_deberta(int32_t B, int32_t L) {
    const int32_t heads = 12, d = 64, H = heads * d, k = 256, T = B * L;
    nopad_backend *g = NULL;
    assert_nopad_ok(nopad_backend_cuda_create(NOPAD_DTYPE_F16, 0, NULL, &g));
    uint64_t rng = 77;
    int32_t *cu = malloc((size_t)(B + 1) * sizeof *cu);
    assert_non_null(cu);
    for (int32_t b = 0; b <= B; b++) cu[b] = b * L;
    float *qkv = random_floats((size_t)T * 3 * H, -1.0f, 1.0f, &rng);
    float *pk = random_floats((size_t)2 * k * H, -1.0f, 1.0f, &rng);
    float *pq = random_floats((size_t)2 * k * H, -1.0f, 1.0f, &rng);
    rel_bench c = {.g = g, .heads = heads, .d = d, .scale = 1.0f / sqrtf(64.0f * 3.0f)};
    c.qkv = test_to_device(g, qkv, (size_t)T * 3 * H);
    c.pk = test_to_device(g, pk, (size_t)2 * k * H);
    c.pq = test_to_device(g, pq, (size_t)2 * k * H);
    void *dcu;
    assert_nopad_ok(g->alloc(g, (size_t)(B + 1) * sizeof *cu, &dcu));
    assert_nopad_ok(g->upload_i32(g, dcu, cu, (size_t)B + 1));
    assert_nopad_ok(g->alloc(g, (size_t)T * H * 2, &c.out));
    c.seqs = (nopad_seqs){.n_seqs = B, .n_tokens = T, .max_seqlen = L, .cu_seqlens = dcu};
    c.rel = (nopad_rel_positions){.att_span = k, .position_buckets = 256, .max_relative_positions = 512};
    const float op_ms = time_it(&c, run_op);
    const double flop = 4.0 * B * heads * (double)L * L * d;
    printf("deberta-v3-base layer %3dx%d f16: attention_rel %.3f ms (%.0f TFLOP/s plain-attention-equivalent)\n", B,
           L, op_ms, flop / op_ms * 1e-9);
    fflush(stdout);
    assert_nopad_ok(g->synchronize(g));
    g->free(g, c.qkv), g->free(g, c.pk), g->free(g, c.pq), g->free(g, dcu), g->free(g, c.out);
    free(qkv), free(pk), free(pq), free(cu);
    g->destroy(g);
}

static void test_bench(void **state) {
    bench_deberta(16, 512);
    bench_deberta(128, 512);
    bench_deberta(128, 128);
}

int main(void) {
    if (test_skip_without_gpu()) return 77;
    const char *bench = getenv("NOPAD_DEBERTA_BENCH");
    if (bench && bench[0] == '1') {
        const struct CMUnitTest b[] = {cmocka_unit_test(test_bench)};
        return cmocka_run_group_tests(b, NULL, NULL);
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_attention_rel_against_cpu),
        cmocka_unit_test(test_deberta_hidden_states_match_hf),
        cmocka_unit_test(test_heads_logits_match_hf),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
