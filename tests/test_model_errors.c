/* Bad input to model loading and encoding: each case must return a non-OK status whose message
 * names the problem, without crashing or leaking (this program also runs under ASan/LSan). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "testutil.h"

/* Copies model folder tests/data/models/<name> (flat files only) into a fresh temp folder,
 * replacing config.json with `config` when not NULL. */
static const char *copy_model(const char *name, const char *config) {
    static const char *const files[] = {"config.json", "model.safetensors"};
    const char *dir = test_make_temp_dir(0);
    for (size_t i = 0; i < 2; i++) {
        char src[512], dst[512];
        snprintf(src, sizeof src, "models/%s/%s", name, files[i]);
        size_t len;
        char *data = test_read_file(test_data_path(src), &len);
        assert_non_null(data);
        if (i == 0 && config) {
            free(data);
            data = strdup(config);
            len = strlen(config);
        }
        snprintf(dst, sizeof dst, "%s/%s", dir, files[i]);
        FILE *f = fopen(dst, "wb");
        assert_non_null(f);
        assert_int_equal(fwrite(data, 1, len, f), len);
        fclose(f);
        free(data);
    }
    return dir;
}

/* tests/data/models/<name>'s config.json with the first "key": value replaced (value given as
 * JSON text). */
static char *config_with(const char *name, const char *key, const char *value) {
    size_t len;
    char rel[256];
    snprintf(rel, sizeof rel, "models/%s/config.json", name);
    char *cfg = test_read_file(test_data_path(rel), &len);
    assert_non_null(cfg);
    char needle[128];
    snprintf(needle, sizeof needle, "\"%s\":", key);
    char *at = strstr(cfg, needle);
    assert_non_null(at);
    char *val = at + strlen(needle);
    char *end = val + strcspn(val, ",}\n");
    char *out = malloc(len + strlen(value) + 8);
    sprintf(out, "%.*s %s%s", (int)(val - cfg), cfg, value, end);
    free(cfg);
    return out;
}

static char *bert_a_config_with(const char *key, const char *value) {
    return config_with("bert_a", key, value);
}

static void expect_load_error(const char *dir, nopad_status want, const char *needle) {
    nopad_model *m = (nopad_model *)0x1;
    assert_nopad_error(nopad_model_load(dir, NULL, &m), want, needle);
    assert_null(m);
}

static void test_missing_folder_and_files(void **state) {
    expect_load_error("/nonexistent/nopad-model", NOPAD_ERR_IO, "does not exist");
    expect_load_error(test_make_temp_dir(1), NOPAD_ERR_IO, "config.json");
    /* config present, weights absent */
    const char *dir = copy_model("bert_a", NULL);
    char path[512];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    assert_int_equal(remove(path), 0);
    expect_load_error(dir, NOPAD_ERR_IO, "model.safetensors");
}

/* A model path that is not a model says what it is and what was expected; a path ending in
 * .gguf is spoken of as a GGUF file, not as a folder. */
static void test_model_path_messages(void **state) {
    expect_load_error("/nonexistent/nopad.gguf", NOPAD_ERR_IO,
                      "GGUF file '/nonexistent/nopad.gguf' does not exist");
    expect_load_error("/nonexistent/nopad.GGUF", NOPAD_ERR_IO, "GGUF file");
    expect_load_error("/nonexistent/nopad-model", NOPAD_ERR_IO,
                      "model folder '/nonexistent/nopad-model' does not exist");
    const char *zip = test_write_temp(0, ".gguf", "PK\x03\x04rest", 8);
    char want[768];
    snprintf(want, sizeof want,
             "'%s' is not a GGUF file (magic \"PK\\x03\\x04\", expected \"GGUF\"); a model is a "
             "folder with config.json or a .gguf file", zip);
    expect_load_error(zip, NOPAD_ERR_FORMAT, want);
    const char *empty = test_write_temp(1, ".gguf", "", 0);
    expect_load_error(empty, NOPAD_ERR_FORMAT, "is not a GGUF file (0 bytes, shorter than the magic");
    const char *text = test_write_temp(2, ".txt", "{}\n", 3);
    snprintf(want, sizeof want, "model folder '%s' is not a folder, nor a GGUF file (3 bytes", text);
    expect_load_error(text, NOPAD_ERR_IO, want);
    expect_load_error(text, NOPAD_ERR_IO, "a model is a folder with config.json or a .gguf file");
    char fifo[600];
    snprintf(fifo, sizeof fifo, "%s/pipe.gguf", test_make_temp_dir(1));
    assert_int_equal(mkfifo(fifo, 0600), 0);
    snprintf(want, sizeof want, "GGUF file '%s' is not a regular file", fifo);
    expect_load_error(fifo, NOPAD_ERR_IO, want);
}

static void test_bad_config(void **state) {
    expect_load_error(copy_model("bert_a", "{\"model_type\": \"bert\", "), NOPAD_ERR_FORMAT,
                      "not valid JSON");
    expect_load_error(copy_model("bert_a", "[1, 2, 3]"), NOPAD_ERR_FORMAT, "JSON object");
    expect_load_error(copy_model("bert_a", "{\"hidden_size\": 48}"), NOPAD_ERR_FORMAT, "model_type");
    expect_load_error(copy_model("bert_a", "{\"model_type\": \"t5\"}"), NOPAD_ERR_UNSUPPORTED,
                      "\"t5\"");
    /* a decoder family with its fields missing names the first one */
    expect_load_error(copy_model("bert_a", "{\"model_type\": \"gpt2\"}"), NOPAD_ERR_FORMAT,
                      "vocab_size");
    expect_load_error(copy_model("bert_a", "{\"model_type\": \"bert\", \"vocab_size\": 10}"),
                      NOPAD_ERR_FORMAT, "hidden_size");
    char *cfg = bert_a_config_with("hidden_size", "\"wide\"");
    expect_load_error(copy_model("bert_a", cfg), NOPAD_ERR_FORMAT, "hidden_size");
    free(cfg);
    cfg = bert_a_config_with("num_attention_heads", "5"); /* 48 % 5 != 0 */
    expect_load_error(copy_model("bert_a", cfg), NOPAD_ERR_FORMAT, "divisible");
    free(cfg);
    cfg = bert_a_config_with("hidden_act", "\"mish\"");
    expect_load_error(copy_model("bert_a", cfg), NOPAD_ERR_UNSUPPORTED, "mish");
    free(cfg);
    cfg = bert_a_config_with("num_hidden_layers", "-2");
    expect_load_error(copy_model("bert_a", cfg), NOPAD_ERR_FORMAT, "num_hidden_layers");
    free(cfg);
}

/* An epsilon, a RoPE base or a RoPE scaling factor that is infinite (1e999 in JSON, or 1e300,
 * finite as a double but not as the float it becomes), zero or negative is refused with the key
 * and the value, never loaded. */
static void test_non_finite_config_floats(void **state) {
    static const struct {
        const char *model, *key, *value, *message;
    } cases[] = {
        {"llama_gqa", "rms_norm_eps", "1e999",
         "field \"rms_norm_eps\" is inf, expected a positive finite number"},
        {"llama_gqa", "rms_norm_eps", "1e300", "field \"rms_norm_eps\" is 1e+300, expected"},
        {"llama_gqa", "rms_norm_eps", "1e-300", "field \"rms_norm_eps\" is 1e-300, expected"},
        {"llama_gqa", "rms_norm_eps", "0", "field \"rms_norm_eps\" is 0, expected"},
        {"llama_gqa", "rms_norm_eps", "-1e-5", "field \"rms_norm_eps\" is -1e-05, expected"},
        {"llama_gqa", "rope_theta", "1e999", "field \"rope_theta\" is inf, expected"},
        {"llama_gqa", "rope_theta", "-1e999", "field \"rope_theta\" is -inf, expected"},
        {"llama_gqa", "rope_theta", "3.5e38", "field \"rope_theta\" is 3.5e+38, expected"},
        {"llama_linear", "factor", "1e999", "field \"factor\" is inf, expected"},
        {"llama_linear", "rope_theta", "0", "field \"rope_theta\" is 0, expected"},
        {"gpt2_dec", "layer_norm_epsilon", "1e999", "field \"layer_norm_epsilon\" is inf"},
        {"bert_a", "layer_norm_eps", "1e999", "\"layer_norm_eps\" must be a number in (0, 1]"},
        {"bert_a", "layer_norm_eps", "1e-300", "\"layer_norm_eps\" must be a number in (0, 1]"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char *cfg = config_with(cases[i].model, cases[i].key, cases[i].value);
        nopad_model *m = NULL;
        nopad_status st = nopad_model_load(copy_model(cases[i].model, cfg), NULL, &m);
        if (st != NOPAD_ERR_FORMAT || !strstr(nopad_last_error(), cases[i].message))
            fail_msg("%s %s %s: %s \"%s\", expected FORMAT and \"%s\"", cases[i].model,
                     cases[i].key, cases[i].value, nopad_status_string(st), nopad_last_error(),
                     cases[i].message);
        assert_null(m);
        free(cfg);
    }
}

/* A field that is present with the wrong JSON type says so and names the type expected; only an
 * absent field is "missing" (issue 19, item 5). */
static void test_wrong_json_types(void **state) {
    expect_load_error(copy_model("bert_a", "{\"model_type\": 5}"), NOPAD_ERR_FORMAT,
                      "field \"model_type\" has the wrong JSON type: expected a string (bert, roberta, "
                      "xlm-roberta, camembert, distilbert, albert, deberta-v2 (encoders); gpt2, "
                      "llama, mistral, qwen2 (decoders)), found a number");
    expect_load_error(copy_model("bert_a", "{\"model_type\": [\"bert\"]}"), NOPAD_ERR_FORMAT,
                      "(decoders)), found an array");
    expect_load_error(copy_model("bert_a", "{\"hidden_size\": 48}"), NOPAD_ERR_FORMAT,
                      "required field \"model_type\" is missing");
    static const struct {
        const char *key, *value, *needle;
    } cases[] = {
        {"hidden_size", "\"48\"", "field \"hidden_size\" has the wrong JSON type: expected an integer in [1, 65536], found a string"},
        {"vocab_size", "true", "field \"vocab_size\" has the wrong JSON type: expected an integer in [1, 16777216], found a boolean"},
        {"num_hidden_layers", "{}", "field \"num_hidden_layers\" has the wrong JSON type: expected an integer in [1, 1024], found an object"},
        {"hidden_size", "null", "required field \"hidden_size\" is null; expected an integer"},
        {"hidden_size", "48.5", "field \"hidden_size\" must be an integer in [1, 65536], found 48.5"},
        {"layer_norm_eps", "\"1e-12\"", "field \"layer_norm_eps\" has the wrong JSON type: expected a number in (0, 1], found a string"},
        {"hidden_act", "7", "field \"hidden_act\" has the wrong JSON type: expected a string, found a number"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char *cfg = bert_a_config_with(cases[i].key, cases[i].value);
        expect_load_error(copy_model("bert_a", cfg), NOPAD_ERR_FORMAT, cases[i].needle);
        free(cfg);
    }
}

static void test_tensors_that_do_not_fit_the_config(void **state) {
    /* one more layer than the checkpoint has: the first tensor of that layer is missing */
    char *cfg = bert_a_config_with("num_hidden_layers", "3");
    expect_load_error(copy_model("bert_a", cfg), NOPAD_ERR_FORMAT,
                      "'encoder.layer.2.attention.self.query.weight' is missing");
    free(cfg);
    /* a different intermediate size: the FFN weight has the wrong shape */
    cfg = bert_a_config_with("intermediate_size", "99");
    expect_load_error(copy_model("bert_a", cfg), NOPAD_ERR_FORMAT,
                      "'encoder.layer.0.intermediate.dense.weight' has shape");
    free(cfg);
    cfg = bert_a_config_with("vocab_size", "1000");
    expect_load_error(copy_model("bert_a", cfg), NOPAD_ERR_FORMAT, "word_embeddings");
    free(cfg);
}

static void test_truncated_weights(void **state) {
    const char *dir = copy_model("bert_a", NULL);
    char path[512];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    size_t len;
    char *data = test_read_file(path, &len);
    FILE *f = fopen(path, "wb");
    fwrite(data, 1, len / 2, f);
    fclose(f);
    free(data);
    nopad_model *m = NULL;
    nopad_status st = nopad_model_load(dir, NULL, &m);
    assert_int_equal(st, NOPAD_ERR_FORMAT);
    assert_non_null(strstr(nopad_last_error(), "model.safetensors"));
    assert_null(m);
}

static void test_unsupported_params(void **state) {
    nopad_model_params p = nopad_model_default_params();
    p.device = NOPAD_DEVICE_CUDA;
    nopad_model *m = NULL;
    assert_nopad_error(nopad_model_load(test_data_path("models/bert_a"), &p, &m),
                       NOPAD_ERR_UNSUPPORTED, "cuda");
    p = nopad_model_default_params();
    p.dtype = NOPAD_DTYPE_BF16;
    assert_nopad_error(nopad_model_load(test_data_path("models/bert_a"), &p, &m),
                       NOPAD_ERR_UNSUPPORTED, "BF16");
    assert_nopad_error(nopad_model_load(NULL, NULL, &m), NOPAD_ERR_INVALID_ARGUMENT, "folder");
}

static void write_text(const char *dir, const char *name, const char *text) {
    char path[512];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(text, 1, strlen(text), f), strlen(text));
    fclose(f);
}

/* A tokenizer.json nopad does not support leaves the model loadable for token ids (a warning on
 * stderr and nopad_model_tokenizer_error say why); a malformed one still fails the load. */
static void test_unsupported_tokenizer(void **state) {
    const char *dir = copy_model("bert_a", NULL);
    nopad_model *m = NULL;
    assert_nopad_ok(nopad_model_load(dir, NULL, &m));
    assert_null(nopad_model_tokenizer_error(m)); /* no tokenizer at all: no reason either */
    nopad_model_free(m);

    write_text(dir, "tokenizer.json",
               "{\"model\": {\"type\": \"WordLevel\", \"vocab\": {\"[UNK]\": 0, \"a\": 1}, "
               "\"unk_token\": \"[UNK]\"}}");
    assert_nopad_ok(nopad_model_load(dir, NULL, &m));
    assert_null(nopad_model_tokenizer(m));
    const char *why = nopad_model_tokenizer_error(m);
    assert_non_null(why);
    if (!strstr(why, "WordLevel") || !strstr(why, "tokenizer.json"))
        fail_msg("the reason does not name the file and the model type: %s", why);
    nopad_model_info info;
    assert_nopad_ok(nopad_model_get_info(m, &info));
    assert_int_equal(info.has_tokenizer, 0);
    assert_string_equal(info.tokenizer_kind, "unsupported");
    const int32_t cu[] = {0, 3}, ids[] = {1, 2, 3};
    float *pooled = malloc((size_t)info.hidden_size * sizeof *pooled);
    assert_nopad_ok(nopad_encode_packed(m, 1, cu, ids, NULL, NULL, NULL, pooled));
    free(pooled);
    nopad_model_free(m);
    assert_null(nopad_model_tokenizer_error(NULL));

    /* broken files are still errors */
    write_text(dir, "tokenizer.json", "{\"model\": ");
    expect_load_error(dir, NOPAD_ERR_FORMAT, "not valid JSON");
    write_text(dir, "tokenizer.json", "{\"model\": {\"type\": \"WordPiece\", \"vocab\": 5}}");
    expect_load_error(dir, NOPAD_ERR_FORMAT, "model.vocab");
    write_text(dir, "tokenizer.json",
               "{\"model\": {\"type\": \"WordPiece\", \"unk_token\": \"a\", "
               "\"continuing_subword_prefix\": \"##\", \"max_input_chars_per_word\": 9, "
               "\"vocab\": {\"a\": 0}}, \"decoder\": 5}");
    expect_load_error(dir, NOPAD_ERR_FORMAT, "decoder");
}

static void test_bad_batches(void **state) {
    nopad_model *m = NULL;
    assert_nopad_ok(nopad_model_load(test_data_path("models/bert_a"), NULL, &m));
    nopad_model_info info;
    assert_nopad_ok(nopad_model_get_info(m, &info));
    const int H = info.hidden_size;
    int32_t ids[64];
    for (int i = 0; i < 64; i++) ids[i] = 1 + i % 50;
    float out[64 * 48], pooled[4 * 48];
    int32_t cu[3] = {0, 3, 5};
    nopad_encode_params p = nopad_encode_default_params();

    assert_nopad_error(nopad_encode_packed(m, 0, cu, ids, NULL, &p, out, NULL),
                       NOPAD_ERR_INVALID_ARGUMENT, "empty batch");
    ids[4] = info.vocab_size;
    assert_nopad_error(nopad_encode_packed(m, 2, cu, ids, NULL, &p, out, NULL),
                       NOPAD_ERR_INVALID_ARGUMENT, "outside the vocabulary");
    ids[4] = -1;
    assert_nopad_error(nopad_encode_packed(m, 2, cu, ids, NULL, &p, out, NULL),
                       NOPAD_ERR_INVALID_ARGUMENT, "-1");
    ids[4] = 3;
    int32_t types[5] = {0, 0, 0, 0, info.type_vocab_size};
    assert_nopad_error(nopad_encode_packed(m, 2, cu, ids, types, &p, out, NULL),
                       NOPAD_ERR_INVALID_ARGUMENT, "token type");
    int32_t cu_bad[3] = {0, 3, 3};
    assert_nopad_error(nopad_encode_packed(m, 2, cu_bad, ids, NULL, &p, out, NULL),
                       NOPAD_ERR_INVALID_ARGUMENT, "sequence 1");
    int32_t cu_start[3] = {1, 3, 5};
    assert_nopad_error(nopad_encode_packed(m, 2, cu_start, ids, NULL, &p, out, NULL),
                       NOPAD_ERR_INVALID_ARGUMENT, "cu_seqlens[0]");
    int32_t cu_long[2] = {0, info.max_seq_length + 1};
    assert_nopad_error(nopad_encode_packed(m, 1, cu_long, ids, NULL, &p, out, NULL),
                       NOPAD_ERR_TOO_LONG, "at most");
    p.pooling = NOPAD_POOLING_NONE;
    assert_nopad_error(nopad_encode_packed(m, 2, cu, ids, NULL, &p, NULL, pooled),
                       NOPAD_ERR_INVALID_ARGUMENT, "pooling is none");
    assert_nopad_error(nopad_encode_packed(m, 2, cu, ids, NULL, &p, NULL, NULL),
                       NOPAD_ERR_INVALID_ARGUMENT, "NULL");
    int32_t lengths[2] = {3, 0};
    const nopad_batch padded = {.layout = NOPAD_LAYOUT_PADDED, .n_seqs = 2, .tokens = ids,
                                .lengths = lengths, .max_len = 3};
    assert_nopad_error(nopad_encode(nopad_model_context(m), &padded, NULL, out, NULL),
                       NOPAD_ERR_INVALID_ARGUMENT, "lengths[1]");
    const nopad_batch on_device = {.layout = NOPAD_LAYOUT_PACKED, .on_device = 1, .n_seqs = 2,
                                   .tokens = ids, .cu_seqlens = cu, .n_tokens = 5, .max_seqlen = 3};
    assert_nopad_error(nopad_encode(nopad_model_context(m), &on_device, NULL, out, NULL),
                       NOPAD_ERR_INVALID_ARGUMENT, "needs a model loaded on cuda");
    const nopad_batch bad_layout = {.layout = (nopad_layout)7, .n_seqs = 2, .tokens = ids, .cu_seqlens = cu};
    assert_nopad_error(nopad_encode(nopad_model_context(m), &bad_layout, NULL, out, NULL),
                       NOPAD_ERR_INVALID_ARGUMENT, "layout 7");
    /* a failed call leaves the model usable */
    p.pooling = NOPAD_POOLING_CLS;
    assert_nopad_ok(nopad_encode_packed(m, 2, cu, ids, NULL, &p, out, pooled));
    (void)H;
    nopad_model_free(m);

    nopad_model_params mp = nopad_model_default_params();
    mp.max_batch_tokens = 4;
    assert_nopad_ok(nopad_model_load(test_data_path("models/bert_a"), &mp, &m));
    assert_nopad_error(nopad_encode_packed(m, 2, cu, ids, NULL, NULL, out, NULL),
                       NOPAD_ERR_INVALID_ARGUMENT, "max_batch_tokens");
    nopad_model_free(m);
}

static void test_status_strings_and_version(void **state) {
    for (int s = NOPAD_OK; s <= NOPAD_ERR_QUEUE_FULL; s++)
        assert_true(strlen(nopad_status_string((nopad_status)s)) > 1);
    char want[32];
    snprintf(want, sizeof want, "%d.%d.%d", NOPAD_VERSION_MAJOR, NOPAD_VERSION_MINOR, NOPAD_VERSION_PATCH);
    assert_string_equal(nopad_version(), want);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_missing_folder_and_files),
        cmocka_unit_test(test_model_path_messages),
        cmocka_unit_test(test_bad_config),
        cmocka_unit_test(test_non_finite_config_floats),
        cmocka_unit_test(test_wrong_json_types),
        cmocka_unit_test(test_tensors_that_do_not_fit_the_config),
        cmocka_unit_test(test_truncated_weights),
        cmocka_unit_test(test_unsupported_params),
        cmocka_unit_test(test_unsupported_tokenizer),
        cmocka_unit_test(test_bad_batches),
        cmocka_unit_test(test_status_strings_and_version),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
