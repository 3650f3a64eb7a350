/* GGUF decoders with their block-quantized weights kept as stored on the CPU (docs/decoder.md,
 * "Quantized weights on the CPU") against the same file dequantised (weights f32):
 * - tests/data/gguf/quant_tiny.gguf (scripts/make_gguf_quant_fixtures.py: random Q4_K, Q6_K and
 *   Q8_0 weights, layer 1's Q|K|V of mixed formats, held as stored part by part): no notice,
 *   the weight groups and bytes, prefill logits (the dequantising path, float rounding only),
 *   decode logits (the int8 path) and greedy ids;
 * - the real SmolLM2-135M-Instruct Q4_1 (NOPAD_SMOLLM2_GGUF; skipped without it): logits of the
 *   prompts and of decode steps, and generation;
 * - SmolLM2 in llama.cpp's Q4_K_M mix (NOPAD_SMOLLM2_Q4_K_M_GGUF, skipped without it; made from
 *   the Q4_1 file by `llama-quantize --allow-requantize in.gguf out.gguf Q4_K_M`): Q5_0, Q4_K,
 *   Q6_K and Q8_0 tensors held as stored, the same comparisons;
 * - the weights choice: fp8 refused, a float choice that is not the compute dtype refused, native on
 *   a float checkpoint loads as it is. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/quant.h"
#include "golden.h"

/* Every step's linear layers run the int8 GEMM (on x86; on the portable path a prompt of at least
 * 32 tokens dequantises tiles of weight rows to float and runs sgemm on the activations rounded as
 * the int8 path rounds them, equal to float rounding): a row's products do not depend on the
 * step's token count (test_cpu_quant). A model is more than one op, though: the float ops between them
 * (attention whole or over a cache) differ by 1e-7 between a prompt fed whole and in chunks, and a
 * value that lies that close to a rounding boundary of its int8 block rounds the other way, moving
 * by d = max|x|_block / 127 (measured on the tiny model: rows equal to 3e-7 up to the first such
 * value, at position 18 of 80, then up to 2e-2 in this random model, whose sharp attention carries
 * it to every later row). So a prompt whole and in chunks agree within the int8 bound below
 * (measured since the int8 GEMM: equal, 0 on the tiny model). */
/* Every step (prefill too, see above) quantizes each activation row to int8 per block of 32 /
 * 256, d = max|x| / 127: each value moves by at most d / 2, about uniformly in [-d/2, d/2], so a
 * dot product over K values moves by about |w|·d·sqrt(K / 12) against |y| ≈ |w|·|x|: a relative
 * error of about (max|x| / rms(x)) / (127·sqrt(12)) = 2.3e-3·(max / rms) per linear layer
 * (measured on SmolLM2's layers with x uniform, max / rms = 1.7: 3.0e-3..4.9e-3). Real
 * activations have heavier tails (SwiGLU's products, RMSNorm's weights): max / rms of 5-20 in a
 * block. A step chains layers × 4 linear layers and the head, the errors adding in quadrature.
 * With the activations left in float, the same steps differ from the dequantised model's by 5e-6
 * (checked by hand): the int8 rounding is all of it. Measured: the tiny model (2 layers, 9 linear
 * layers) up to 2.7e-2; 5e-2 bounds it, while a wrong row order or block read gives errors of
 * order 1. */
static const double DECODE_BOUND_TINY = 5e-2;
/* SmolLM2: 30 layers, 121 linear layers, outlier channels after its RMS norms: measured up to
 * 8.9e-2 on decode steps (greedy ids then part where two candidates are close: printed, not
 * asserted). 0.15 bounds it, still far below a wrong weight's order-1 error. */
static const double DECODE_BOUND_SMOLLM2 = 0.15;

/* Loads `path` with `weights`, with what the load writes to stderr into *err (caller frees). */
static nopad_model *load_capturing(const char *path, nopad_weights weights, char **err) {
    nopad_model *m = NULL;
    assert_nopad_ok(test_load_capturing(path, weights, &m, err));
    return m;
}

static const nopad_weight_group *find_group(const nopad_weight_group *g, int32_t n, const char *name,
                                            const char *format) {
    for (int32_t i = 0; i < n; i++)
        if (strcmp(g[i].name, name) == 0 && strcmp(g[i].format, format) == 0) return &g[i];
    return NULL;
}

/* Bytes of a group held in `format`, whatever the file stored (a group is listed per pair). */
static size_t group_bytes(const nopad_weight_group *g, int32_t n, const char *name, const char *format) {
    size_t bytes = 0;
    for (int32_t i = 0; i < n; i++)
        if (strcmp(g[i].name, name) == 0 && strcmp(g[i].format, format) == 0) bytes += g[i].bytes;
    return bytes;
}

/* Random prompts of `lens` (ids in [0, vocab)), packed. */
static int32_t *random_prompts(int32_t B, const int32_t *lens, int32_t vocab, int32_t *cu, unsigned seed) {
    cu[0] = 0;
    for (int32_t b = 0; b < B; b++) cu[b + 1] = cu[b] + lens[b];
    int32_t *ids = malloc((size_t)cu[B] * sizeof *ids);
    srand(seed);
    for (int32_t t = 0; t < cu[B]; t++) ids[t] = rand() % vocab;
    return ids;
}

typedef struct compare_result {
    double prefill, chunks, decode;
    int32_t greedy_equal, greedy_total;
} compare_result;

/* The same prompts through both models: every position's logits of the prompts in one step
 * (all_logits: T >= 32 rows, the dequantising path throughout) when `all`, else the last
 * position's (prefill); with `all`, the native model's again with each prompt fed in chunks of 7
 * tokens (the int8 path) against its whole-prompt logits (chunks); then `steps` decode steps of
 * one token per sequence, fed the dequantised model's greedy ids so that both see the same
 * tokens; then `greedy` tokens of nopad_generate from each. */
static compare_result compare_models(nopad_model *native, nopad_model *dequant, int32_t B, const int32_t *lens,
                                     int all, int32_t steps, int32_t greedy, unsigned seed) {
    compare_result r = {0};
    nopad_model_info info;
    assert_nopad_ok(nopad_model_get_info(native, &info));
    const int32_t V = info.vocab_size;
    int32_t cu[16];
    assert_true(B < 16);
    int32_t *ids = random_prompts(B, lens, V, cu, seed);
    const int32_t T = cu[B], rows = all ? T : B;
    float *a = malloc((size_t)rows * V * sizeof *a), *b = malloc((size_t)rows * V * sizeof *b);
    nopad_context *cn = nopad_model_context(native), *cd = nopad_model_context(dequant);
    nopad_sequence *sn[16], *sd[16];
    for (int32_t i = 0; i < B; i++) {
        assert_nopad_ok(nopad_sequence_create(cn, &sn[i]));
        assert_nopad_ok(nopad_sequence_create(cd, &sd[i]));
    }
    assert_nopad_ok(nopad_decode(cn, B, sn, cu, ids, all, a));
    assert_nopad_ok(nopad_decode(cd, B, sd, cu, ids, all, b));
    r.prefill = test_max_row_rel_error(a, b, rows, V);
    if (all) {
        float *c = malloc((size_t)rows * V * sizeof *c);
        for (int32_t i = 0; i < B; i++) {
            nopad_sequence *seq;
            assert_nopad_ok(nopad_sequence_create(cn, &seq));
            for (int32_t t0 = cu[i]; t0 < cu[i + 1]; t0 += 7) {
                const int32_t n = cu[i + 1] - t0 < 7 ? cu[i + 1] - t0 : 7, chunk_cu[2] = {0, n};
                assert_nopad_ok(nopad_decode(cn, 1, &seq, chunk_cu, ids + t0, 1, c + (size_t)t0 * V));
            }
            nopad_sequence_free(seq);
        }
        r.chunks = test_max_row_rel_error(c, a, rows, V);
        free(c);
        /* each sequence's last row, as a decode would continue from */
        for (int32_t i = 0; i < B; i++) {
            memmove(a + (size_t)i * V, a + (size_t)(cu[i + 1] - 1) * V, (size_t)V * sizeof *a);
            memmove(b + (size_t)i * V, b + (size_t)(cu[i + 1] - 1) * V, (size_t)V * sizeof *b);
        }
    }
    int32_t step_cu[17], next[16];
    for (int32_t i = 0; i <= B; i++) step_cu[i] = i;
    for (int32_t s = 0; s < steps; s++) {
        for (int32_t i = 0; i < B; i++) { /* the dequantised model's greedy id */
            int32_t best = 0;
            for (int32_t v = 1; v < V; v++)
                if (b[(size_t)i * V + v] > b[(size_t)i * V + best]) best = v;
            next[i] = best;
        }
        assert_nopad_ok(nopad_decode(cn, B, sn, step_cu, next, 0, a));
        assert_nopad_ok(nopad_decode(cd, B, sd, step_cu, next, 0, b));
        const double e = test_max_row_rel_error(a, b, B, V);
        if (e > r.decode) r.decode = e;
    }
    for (int32_t i = 0; i < B; i++) {
        nopad_sequence_free(sn[i]);
        nopad_sequence_free(sd[i]);
    }
    if (greedy > 0) {
        int32_t *gn = malloc((size_t)B * greedy * sizeof *gn), *gd = malloc((size_t)B * greedy * sizeof *gd);
        nopad_generate_params gp = nopad_generate_default_params();
        gp.max_tokens = greedy;
        gp.ignore_eos = 1;
        assert_nopad_ok(nopad_generate(cn, B, cu, ids, &gp, gn, NULL, NULL, NULL));
        assert_nopad_ok(nopad_generate(cd, B, cu, ids, &gp, gd, NULL, NULL, NULL));
        /* a sequence's ids equal up to its first difference (after it, the inputs differ) */
        for (int32_t i = 0; i < B; i++)
            for (int32_t k = 0; k < greedy && gn[i * greedy + k] == gd[i * greedy + k]; k++) r.greedy_equal++;
        r.greedy_total = B * greedy;
        free(gn);
        free(gd);
    }
    free(a);
    free(b);
    free(ids);
    return r;
}

static void test_tiny(void **state) {
    (void)state;
    const char *path = test_data_path("gguf/quant_tiny.gguf");
    char *err_native, *err_f32;
    nopad_model *native = load_capturing(path, NOPAD_WEIGHTS_AUTO, &err_native); /* the CPU's default: native */
    nopad_model *dequant = load_capturing(path, NOPAD_WEIGHTS_F32, &err_f32);
    /* layer 1's Q|K|V mixes Q4_K and Q6_K: held as stored, each part in its format (backend.h's
     * NOPAD_WEIGHT_MIXED), so nothing falls back and nothing is said */
    assert_null(strstr(err_native, "notice"));
    assert_null(strstr(err_f32, "notice"));

    /* what is held: the embeddings (and the tied head) as Q6_K, layer 0's Q|K|V as Q4_K, layer
     * 1's Q and K as Q4_K and its V as Q6_K (with the mixed weight's header of 64 bytes), both
     * layers' down projections as Q6_K, the O projections as Q8_0; no float copy */
    nopad_weight_group g[32];
    const int32_t n = nopad_model_weight_groups(native, g, 32);
    assert_true(n > 0 && n <= 32);
    const nopad_weight_group *emb = find_group(g, n, "token_embd", "Q6_K");
    assert_non_null(emb);
    assert_int_equal(emb->bytes, 512 * 256 / 256 * 210);
    /* Q4_K rows (all multiples of 8 here) held repacked in groups of 8 where the CPU runs the AVX2
     * path: 148 bytes a row's super-block instead of 144 (backend/cpu/quant.h's CPU_QUANT_Q4_K_R8) */
    const int q4k = cpu_quant_best_isa() == CPU_QUANT_PORTABLE ? 144 : CPU_QUANT_R8_BYTES / 8;
    assert_int_equal(group_bytes(g, n, "attn_qkv", "Q4_K"), (256 + 2 * 128 + 256 + 128) * q4k + 64);
    assert_int_equal(group_bytes(g, n, "attn_qkv", "Q6_K"), 128 * 210);
    assert_int_equal(group_bytes(g, n, "attn_qkv", "F32"), 0);
    assert_non_null(find_group(g, n, "attn_output", "Q8_0"));
    assert_non_null(find_group(g, n, "ffn_gate_up", "Q4_K"));
    const nopad_weight_group *down = find_group(g, n, "ffn_down", "Q6_K");
    assert_non_null(down);
    assert_int_equal(down->n_tensors, 2);
    size_t bytes_native, bytes_f32, sum = 0;
    assert_nopad_ok(nopad_model_memory(native, &bytes_native, NULL, NULL));
    assert_nopad_ok(nopad_model_memory(dequant, &bytes_f32, NULL, NULL));
    for (int32_t i = 0; i < n; i++) sum += g[i].bytes;
    assert_int_equal(sum, bytes_native); /* the groups account for every weight */
    printf("  quant_tiny: %d groups, %zu bytes native, %zu dequantised\n", n, bytes_native, bytes_f32);
    assert_true(bytes_native * 3 < bytes_f32);

    const int32_t lens[3] = {37, 5, 50};
    compare_result r = compare_models(native, dequant, 3, lens, 1, 8, 16, 7);
    printf("  quant_tiny: max row rel err against dequantised: prefill (all %d rows) %.2e, decode %.2e; "
           "prompts in chunks of 7 against whole %.2e; greedy %d / %d equal\n",
           37 + 5 + 50, r.prefill, r.decode, r.chunks, r.greedy_equal, r.greedy_total);
    if (!(r.prefill <= DECODE_BOUND_TINY)) fail_msg("prefill logits: %.3e > %.1e", r.prefill, DECODE_BOUND_TINY);
    if (!(r.chunks <= DECODE_BOUND_TINY)) fail_msg("chunked prompt logits: %.3e > %.1e", r.chunks, DECODE_BOUND_TINY);
    if (!(r.decode <= DECODE_BOUND_TINY)) fail_msg("decode logits: %.3e > %.1e", r.decode, DECODE_BOUND_TINY);
    /* a random model's top logits are far apart (measured margins); the int8 error does not flip
     * them over 16 tokens */
    assert_int_equal(r.greedy_equal, r.greedy_total);
    nopad_model_free(native);
    nopad_model_free(dequant);
    free(err_native);
    free(err_f32);
}

static void test_smollm2(void **state) {
    (void)state;
    const char *path = getenv("NOPAD_SMOLLM2_GGUF");
    FILE *f = path ? fopen(path, "rb") : NULL;
    if (!f) {
        printf("  NOPAD_SMOLLM2_GGUF not set or missing: skipped\n");
        skip();
    }
    fclose(f);
    char *err_native, *err_f32;
    nopad_model *native = load_capturing(path, NOPAD_WEIGHTS_NATIVE, &err_native);
    nopad_model *dequant = load_capturing(path, NOPAD_WEIGHTS_F32, &err_f32);
    assert_null(strstr(err_native, "notice")); /* Q4_1 and Q8_0 only: everything runs as stored */
    size_t bytes_native, bytes_f32;
    assert_nopad_ok(nopad_model_memory(native, &bytes_native, NULL, NULL));
    assert_nopad_ok(nopad_model_memory(dequant, &bytes_f32, NULL, NULL));
    const int32_t lens[4] = {9, 3, 21, 6}; /* 39 tokens: the dequantising path; the head's 4 rows: int8 */
    compare_result r = compare_models(native, dequant, 4, lens, 0, 6, 16, 11);
    printf("  SmolLM2 Q4_1: %zu bytes native, %zu dequantised; max row rel err against dequantised: "
           "prompts' last logits %.2e, decode %.2e; greedy %d / %d equal\n",
           bytes_native, bytes_f32, r.prefill, r.decode, r.greedy_equal, r.greedy_total);
    if (!(r.prefill <= DECODE_BOUND_SMOLLM2)) fail_msg("last logits: %.3e", r.prefill);
    if (!(r.decode <= DECODE_BOUND_SMOLLM2)) fail_msg("decode logits: %.3e", r.decode);
    assert_true(bytes_native * 4 < bytes_f32);
    nopad_model_free(native);
    nopad_model_free(dequant);
    free(err_native);
    free(err_f32);
}

/* SmolLM2 in llama.cpp's Q4_K_M mix: its 576-wide rows are no whole super-blocks, so llama.cpp
 * stores Q, K, O, gate and up as Q5_0, half the V and down as Q8_0 / Q6_K, the other down as
 * Q4_K. Q5_0 and the rest are held as stored, a Q|K|V of Q5_0 + Q5_0 + Q8_0 too (each part in its
 * format). The same bounds as the Q4_1 file's: the same model, the int8 rounding of the same
 * activations. */
static void test_smollm2_q4_k_m(void **state) {
    (void)state;
    const char *path = getenv("NOPAD_SMOLLM2_Q4_K_M_GGUF");
    FILE *f = path ? fopen(path, "rb") : NULL;
    if (!f) {
        printf("  NOPAD_SMOLLM2_Q4_K_M_GGUF not set or missing: skipped\n");
        skip();
    }
    fclose(f);
    char *err_native, *err_f32;
    nopad_model *native = load_capturing(path, NOPAD_WEIGHTS_NATIVE, &err_native);
    nopad_model *dequant = load_capturing(path, NOPAD_WEIGHTS_F32, &err_f32);
    assert_null(strstr(err_native, "notice")); /* every format has a kernel; mixed Q|K|V are kept as stored */
    nopad_weight_group g[32];
    const int32_t n = nopad_model_weight_groups(native, g, 32);
    assert_true(n > 0 && n <= 32);
    assert_non_null(find_group(g, n, "attn_output", "Q5_0"));
    assert_non_null(find_group(g, n, "ffn_gate_up", "Q5_0"));
    assert_non_null(find_group(g, n, "attn_qkv", "Q5_0"));
    assert_non_null(find_group(g, n, "attn_qkv", "Q8_0"));
    assert_null(find_group(g, n, "attn_qkv", "F32"));
    assert_non_null(find_group(g, n, "ffn_down", "Q4_K"));
    assert_non_null(find_group(g, n, "ffn_down", "Q6_K"));
    size_t bytes_native, bytes_f32;
    assert_nopad_ok(nopad_model_memory(native, &bytes_native, NULL, NULL));
    assert_nopad_ok(nopad_model_memory(dequant, &bytes_f32, NULL, NULL));
    const int32_t lens[4] = {9, 3, 21, 6};
    compare_result r = compare_models(native, dequant, 4, lens, 0, 6, 16, 11);
    printf("  SmolLM2 Q4_K_M: %zu bytes native, %zu dequantised; max row rel err against dequantised: "
           "prompts' last logits %.2e, decode %.2e; greedy %d / %d equal\n",
           bytes_native, bytes_f32, r.prefill, r.decode, r.greedy_equal, r.greedy_total);
    if (!(r.prefill <= DECODE_BOUND_SMOLLM2)) fail_msg("last logits: %.3e", r.prefill);
    if (!(r.decode <= DECODE_BOUND_SMOLLM2)) fail_msg("decode logits: %.3e", r.decode);
    assert_true(bytes_native * 3 < bytes_f32);
    nopad_model_free(native);
    nopad_model_free(dequant);
    free(err_native);
    free(err_f32);
}

static void test_weights_choice(void **state) {
    (void)state;
    nopad_model *m = NULL;
    nopad_model_params p = nopad_model_default_params();
    p.weights = NOPAD_WEIGHTS_FP8;
    assert_nopad_error(nopad_model_load(test_data_path("gguf/quant_tiny.gguf"), &p, &m), NOPAD_ERR_UNSUPPORTED,
                       "fp8 is not supported yet");
    assert_null(m);
    p.weights = NOPAD_WEIGHTS_F16; /* the CPU computes in F32 */
    assert_nopad_error(nopad_model_load(test_data_path("gguf/quant_tiny.gguf"), &p, &m), NOPAD_ERR_INVALID_ARGUMENT,
                       "compute dtype, which is F32");
    p.weights = (nopad_weights)42;
    assert_nopad_error(nopad_model_load(test_data_path("gguf/quant_tiny.gguf"), &p, &m), NOPAD_ERR_INVALID_ARGUMENT,
                       "weights 42");
    /* a float checkpoint is native as it is */
    p.weights = NOPAD_WEIGHTS_NATIVE;
    assert_nopad_ok(nopad_model_load(test_data_path("models/llama_gqa"), &p, &m));
    nopad_weight_group g[16];
    const int32_t n = nopad_model_weight_groups(m, g, 16);
    for (int32_t i = 0; i < n; i++) assert_string_equal(g[i].format, "F32");
    nopad_model_free(m);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tiny),
        cmocka_unit_test(test_smollm2),
        cmocka_unit_test(test_smollm2_q4_k_m),
        cmocka_unit_test(test_weights_choice),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
