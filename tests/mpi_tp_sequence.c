/* Sequence parallelism in a split decoder's prompt steps (model/tp.h's tp_seq), under mpirun at 2,
 * 3 and 4 ranks (tp = the world's size). Each model runs the same steps three times: whole (one
 * process), split with the all-reduces, and split sequence-parallel (NOPAD_TP_SEQUENCE_PARALLEL,
 * set with knob_set_int before the load, where rank 0's value goes to every rank). Rank 0 loads
 * and compares; every other rank follows each split load (nopad_tp_follow).
 *
 * Models: a random LLaMA written here (12 query heads, one key/value head, intermediate 144: it
 * splits at 2, 3 and 4), and the tiny decoders of tests/data/models where the world splits them
 * (GPT-2's biases, learned positions and LayerNorm; GQA; Qwen2's QKV biases).
 *
 * Steps: T = tp (a row a rank), T = 5 (at tp 4 the chunks are 2, 2, 1, 0: a rank with no row),
 * three sequences packed with T = 5·tp - 1 (not a multiple of tp: the last chunk padded), the same
 * sequences' next prompt chunks (attention over the history the split steps cached), and decode
 * steps after them (the all-reduce path, on that cache), and a step of the workspace's 61 rows (its
 * chunks fill the padding rows). Then a greedy generation of two prompts.
 *
 * What must hold:
 *   - every logit of the sequence-parallel model is the split model's, bit for bit. On the CPU the
 *     ops work row by row or on the same T rows either way, and the host reduce-scatter sums each
 *     element as the all-reduce does (in double, in rank order, rounded once: comm.h), so only
 *     where a row is computed changes;
 *   - and within 1e-5 of one process, relative to each row's norm (mpi_tp_decoder's bound: float32
 *     on both sides; the split sums the row-parallel products in another order);
 *   - the generated ids are one process's. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "io/hf_config.h"
#include "model/tp.h"
#include "mpi_lib.h" /* a failure on any rank ends the job: no rank waits in a collective */
#include "util/knobs.h"

static int32_t world, rank;
enum { MAX_ROWS = 61 };

#define CHECK(st)                                                                                      \
    do {                                                                                           \
        nopad_status st_ = (st);                                                                   \
        if (st_ != NOPAD_OK) fail_msg("rank %d: %s: %s", rank, #st, nopad_last_error());            \
    } while (0)

static nopad_model_params params_for(int32_t tp) {
    nopad_model_params p = nopad_model_default_params();
    p.tp_size = tp;
    p.weights = NOPAD_WEIGHTS_F32;
    /* 61 rows at most: a full step's chunks over 2, 3, 4 ranks take 62, 63, 64 rows (tp - 1 of
     * padding at tp 4), the decoder's spare rows (AddressSanitizer's builds see any row past them) */
    p.max_batch_tokens = MAX_ROWS;
    p.kv_cache_tokens = 512;
    return p;
}

/* ---- a random LLaMA that 2, 3 and 4 ranks split ------------------------------------------------ */

enum { R_H = 96, R_HEADS = 12, R_KV = 1, R_D = 8, R_F = 144, R_V = 211, R_LAYERS = 2 };

typedef struct tensor_spec {
    char name[96];
    int64_t rows, cols; /* cols 0: a vector */
    float lo, hi;
} tensor_spec;

/* config.json and model.safetensors (float32, uniform draws) in a new directory of this process. */
static const char *write_random_llama(uint64_t seed) {
    const char *dir = test_make_temp_dir(1);
    char path[700];
    snprintf(path, sizeof path, "%s/config.json", dir);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fprintf(f, "{\"architectures\": [\"LlamaForCausalLM\"], \"model_type\": \"llama\", \"hidden_act\": \"silu\", "
               "\"hidden_size\": %d, \"intermediate_size\": %d, \"num_attention_heads\": %d, "
               "\"num_key_value_heads\": %d, \"head_dim\": %d, \"num_hidden_layers\": %d, \"vocab_size\": %d, "
               "\"max_position_embeddings\": 128, \"rms_norm_eps\": 1e-05, \"rope_theta\": 10000.0, "
               "\"tie_word_embeddings\": false, \"bos_token_id\": 1, \"eos_token_id\": 2, \"dtype\": \"float32\"}\n",
            R_H, R_F, R_HEADS, R_KV, R_D, R_LAYERS, R_V);
    fclose(f);
    tensor_spec t[3 + 9 * R_LAYERS];
    int n = 0;
    /* scales that keep the activations O(1) through the layers (about 1/sqrt(fan-in)) */
    t[n++] = (tensor_spec){"model.embed_tokens.weight", R_V, R_H, -1.0f, 1.0f};
    t[n++] = (tensor_spec){"lm_head.weight", R_V, R_H, -0.2f, 0.2f};
    t[n++] = (tensor_spec){"model.norm.weight", R_H, 0, 0.8f, 1.2f};
    for (int l = 0; l < R_LAYERS; l++) {
        const struct { const char *what; int64_t rows, cols; float s; } parts[] = {
            {"self_attn.q_proj.weight", R_HEADS * R_D, R_H, 0.2f}, {"self_attn.k_proj.weight", R_KV * R_D, R_H, 0.2f},
            {"self_attn.v_proj.weight", R_KV * R_D, R_H, 0.2f},    {"self_attn.o_proj.weight", R_H, R_HEADS * R_D, 0.15f},
            {"mlp.gate_proj.weight", R_F, R_H, 0.2f},              {"mlp.up_proj.weight", R_F, R_H, 0.2f},
            {"mlp.down_proj.weight", R_H, R_F, 0.15f},
        };
        for (size_t k = 0; k < sizeof parts / sizeof parts[0]; k++) {
            t[n] = (tensor_spec){"", parts[k].rows, parts[k].cols, -parts[k].s, parts[k].s};
            snprintf(t[n++].name, sizeof t[0].name, "model.layers.%d.%s", l, parts[k].what);
        }
        t[n] = (tensor_spec){"", R_H, 0, 0.8f, 1.2f};
        snprintf(t[n++].name, sizeof t[0].name, "model.layers.%d.input_layernorm.weight", l);
        t[n] = (tensor_spec){"", R_H, 0, 0.8f, 1.2f};
        snprintf(t[n++].name, sizeof t[0].name, "model.layers.%d.post_attention_layernorm.weight", l);
    }
    /* the header: each tensor's dtype, shape and byte range, padded with spaces to 8 bytes */
    char header[8192];
    size_t len = 0, offset = 0;
    len += (size_t)snprintf(header + len, sizeof header - len, "{");
    for (int i = 0; i < n; i++) {
        const size_t bytes = (size_t)t[i].rows * (size_t)(t[i].cols ? t[i].cols : 1) * sizeof(float);
        if (t[i].cols)
            len += (size_t)snprintf(header + len, sizeof header - len,
                                    "%s\"%s\":{\"dtype\":\"F32\",\"shape\":[%lld,%lld],\"data_offsets\":[%zu,%zu]}",
                                    i ? "," : "", t[i].name, (long long)t[i].rows, (long long)t[i].cols, offset,
                                    offset + bytes);
        else
            len += (size_t)snprintf(header + len, sizeof header - len,
                                    "%s\"%s\":{\"dtype\":\"F32\",\"shape\":[%lld],\"data_offsets\":[%zu,%zu]}",
                                    i ? "," : "", t[i].name, (long long)t[i].rows, offset, offset + bytes);
        offset += bytes;
    }
    len += (size_t)snprintf(header + len, sizeof header - len, "}");
    assert_true(len + 8 < sizeof header);
    while (len % 8) header[len++] = ' ';
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    f = fopen(path, "wb");
    assert_non_null(f);
    const uint64_t header_len = len;
    assert_int_equal(fwrite(&header_len, sizeof header_len, 1, f), 1);
    assert_int_equal(fwrite(header, 1, len, f), len);
    uint64_t state = seed;
    for (int i = 0; i < n; i++) {
        const size_t count = (size_t)t[i].rows * (size_t)(t[i].cols ? t[i].cols : 1);
        float *x = malloc(count * sizeof *x);
        assert_non_null(x);
        test_fill_uniform(x, (int64_t)count, t[i].lo, t[i].hi, &state);
        assert_int_equal(fwrite(x, sizeof *x, count, f), count);
        free(x);
    }
    fclose(f);
    return dir;
}

/* ---- the steps ------------------------------------------------------------------------------ */

enum { B = 3, MAX_STEPS = 9 };

typedef struct run {
    int n_steps;
    int32_t rows[MAX_STEPS];  /* rows of logits each step returned */
    float *logits[MAX_STEPS]; /* [rows, V] */
    const char *what[MAX_STEPS];
    int32_t gen[2 * 12], n_gen[2];
} run;

static void run_free(run *r) {
    for (int i = 0; i < r->n_steps; i++) free(r->logits[i]);
    memset(r, 0, sizeof *r);
}

/* One step of `n` sequences (of seqs) with `lens` new tokens each, drawn from rng; every row's
 * logits kept when all_logits, else each sequence's last. */
static void step(nopad_model *m, run *r, const char *what, nopad_sequence **seqs, int n, const int32_t *lens,
                 int all_logits, int32_t V, uint64_t *rng) {
    assert_true(r->n_steps < MAX_STEPS);
    int32_t cu[B + 1] = {0};
    for (int b = 0; b < n; b++) cu[b + 1] = cu[b] + lens[b];
    int32_t *ids = malloc((size_t)cu[n] * sizeof *ids);
    for (int32_t t = 0; t < cu[n]; t++) ids[t] = (int32_t)(test_rand_u32(rng) % (uint32_t)V);
    const int32_t rows = all_logits ? cu[n] : n;
    float *logits = malloc((size_t)rows * V * sizeof *logits);
    CHECK(nopad_decode(nopad_model_context(m), n, seqs, cu, ids, all_logits, logits));
    r->what[r->n_steps] = what;
    r->rows[r->n_steps] = rows;
    r->logits[r->n_steps++] = logits;
    free(ids);
}

/* The steps of the file's comment on model m; the same draws on every model. */
static void run_steps(nopad_model *m, int32_t V, run *r) {
    memset(r, 0, sizeof *r);
    uint64_t rng = 0x5e0ull + (uint64_t)world;
    nopad_sequence *s[B];
    const int32_t tp_rows[1] = {world}, five[2] = {2, 3};
    const int32_t packed[B] = {5, 1, 5 * world - 7 > 0 ? 5 * world - 7 : 1};
    const int32_t more[B] = {4, 2 * world + 1, 3}, one[B] = {1, 1, 1};
    CHECK(nopad_sequence_create(nopad_model_context(m), &s[0]));
    step(m, r, "T = tp, one sequence", s, 1, tp_rows, 1, V, &rng);
    nopad_sequence_free(s[0]);
    for (int b = 0; b < 2; b++) CHECK(nopad_sequence_create(nopad_model_context(m), &s[b]));
    step(m, r, "T = 5, two sequences", s, 2, five, 1, V, &rng);
    for (int b = 0; b < 2; b++) nopad_sequence_free(s[b]);
    for (int b = 0; b < B; b++) CHECK(nopad_sequence_create(nopad_model_context(m), &s[b]));
    step(m, r, "three sequences packed, T = 5 tp - 1", s, B, packed, 1, V, &rng);
    step(m, r, "their next prompt chunks (with history)", s, B, more, 1, V, &rng);
    step(m, r, "their next prompt chunks, last rows only", s, B, more, 0, V, &rng);
    step(m, r, "a decode step after them", s, B, one, 0, V, &rng);
    step(m, r, "another decode step", s, B, one, 0, V, &rng);
    for (int b = 0; b < B; b++) nopad_sequence_free(s[b]);
    const int32_t full[1] = {MAX_ROWS};
    CHECK(nopad_sequence_create(nopad_model_context(m), &s[0]));
    step(m, r, "a step of the workspace's every row", s, 1, full, 1, V, &rng);
    nopad_sequence_free(s[0]);
    /* greedy generation: two prompts prefilled together, then decoded */
    int32_t cu[3] = {0, 6, 6 + 2 * world + 1}, prompt[6 + 2 * 4 + 1];
    for (int32_t t = 0; t < cu[2]; t++) prompt[t] = (int32_t)(test_rand_u32(&rng) % (uint32_t)V);
    nopad_generate_params g = nopad_generate_default_params();
    g.max_tokens = 12;
    g.ignore_eos = 1;
    CHECK(nopad_generate(nopad_model_context(m), 2, cu, prompt, &g, r->gen, r->n_gen, NULL, NULL));
}

/* ---- per model ------------------------------------------------------------------------------ */

static int splits(const char *dir) {
    char path[700];
    snprintf(path, sizeof path, "%s/config.json", dir);
    size_t len = 0;
    char *json = test_read_file(path, &len);
    assert_non_null(json);
    model_config cfg;
    CHECK(hf_config_parse(json, len, path, &cfg));
    free(json);
    tp_shard shard;
    return tp_shard_plan(&cfg, NULL, 0, world, &shard) == NOPAD_OK;
}

/* A split load of dir on every rank, sequence-parallel or not: rank 0's model, NULL on the others
 * (which follow it until rank 0 frees it). The other ranks' switch says the opposite: rank 0's
 * choice is every rank's (ranks that chose apart would meet in different collectives). */
static nopad_model *load_split(const char *dir, int sequence_parallel) {
    knob_set_int(KNOB_TP_SEQUENCE_PARALLEL, rank == 0 ? sequence_parallel : !sequence_parallel);
    nopad_model_params p = params_for(world);
    if (rank != 0) {
        CHECK(nopad_tp_follow(dir, &p));
        return NULL;
    }
    nopad_model *m = NULL;
    CHECK(nopad_model_load(dir, &p, &m));
    return m;
}

static void check_model(const char *dir) {
    if (!splits(dir)) return; /* mpi_tp_decoder checks the refusal */
    if (rank != 0) {
        load_split(dir, 0);
        load_split(dir, 1);
        return;
    }
    nopad_model_params p1 = params_for(1);
    nopad_model *one = NULL;
    CHECK(nopad_model_load(dir, &p1, &one));
    nopad_model_info info;
    CHECK(nopad_model_get_info(one, &info));
    const int32_t V = info.vocab_size;
    run want, split, seq;
    run_steps(one, V, &want);
    nopad_model_free(one);
    nopad_model *m = load_split(dir, 0);
    run_steps(m, V, &split);
    nopad_model_free(m);
    m = load_split(dir, 1);
    run_steps(m, V, &seq);
    nopad_model_free(m);
    for (int i = 0; i < want.n_steps; i++) {
        const size_t n = (size_t)want.rows[i] * V;
        if (memcmp(seq.logits[i], split.logits[i], n * sizeof(float)) != 0) {
            size_t k = 0;
            while (seq.logits[i][k] == split.logits[i][k]) k++;
            fail_msg("%s, tp %d, %s: sequence-parallel logit %zu (row %zu) is %.9g, %.9g with the all-reduces",
                     dir, world, want.what[i], k, k / (size_t)V, seq.logits[i][k], split.logits[i][k]);
        }
        const double err = test_max_row_rel_error(seq.logits[i], want.logits[i], want.rows[i], V);
        if (!(err <= 1e-5))
            fail_msg("%s, tp %d, %s: sequence-parallel logits differ from one process by %.3g (row-relative)", dir,
                     world, want.what[i], err);
    }
    for (int i = 0; i < 2; i++) {
        assert_int_equal(seq.n_gen[i], want.n_gen[i]);
        for (int32_t k = 0; k < want.n_gen[i]; k++)
            if (seq.gen[i * 12 + k] != want.gen[i * 12 + k])
                fail_msg("%s, tp %d: greedy generation, prompt %d, token %d: %d sequence-parallel, %d in one process",
                         dir, world, i, k, seq.gen[i * 12 + k], want.gen[i * 12 + k]);
    }
    run_free(&want), run_free(&split), run_free(&seq);
}

static void test_random_llama(void **state) {
    (void)state;
    check_model(write_random_llama(0xc6c6ull)); /* every rank writes the same file into its own directory */
}

static void test_tiny_decoders(void **state) {
    (void)state;
    static const char *const models[] = {"models/gpt2_dec", "models/llama_gqa", "models/qwen2_bias"};
    for (size_t i = 0; i < sizeof models / sizeof models[0]; i++) check_model(test_data_path(models[i]));
}

int main(void) {
    world = nopad_world_size();
    rank = nopad_world_rank();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_random_llama),
        cmocka_unit_test(test_tiny_decoders),
    };
    return MPI_RUN_TESTS(tests);
}
