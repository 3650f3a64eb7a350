/* Classes of bad input at load, for every file a loader opens:
 *   - each file of a model folder replaced by a FIFO, a folder, a symbolic-link loop and (when not
 *     root, who reads anything) an unreadable file: a clear error naming the file, never a hang
 *     (an alarm ends the program if a loader blocks);
 *   - config.json against the weights: a tensor the config says is absent, layers past the
 *     config's count: an error naming both files' sides;
 *   - non-finite weights: an error naming the tensor and the element;
 *   - JSON nested deeper than any real file (every JSON a loader reads, the safetensors header
 *     included), just under and far over cJSON's nesting limit: an error, never a stack overflow.
 * Runs under ASan/LSan too. */
#define _XOPEN_SOURCE 700 /* mkfifo, symlink, alarm */
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "testutil.h"

/* Writes `len` bytes to dir/name. */
static void write_file(const char *dir, const char *name, const void *data, size_t len) {
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(data, 1, len, f), len);
    fclose(f);
}

/* Copies the listed files of tests/data/models/<model> into a fresh temp folder (slot 0..7). */
static const char *copy_folder(int slot, const char *model, const char *const *files, size_t n_files) {
    const char *dir = test_make_temp_dir(slot);
    for (size_t i = 0; i < n_files; i++) {
        char rel[512];
        snprintf(rel, sizeof rel, "models/%s/%s", model, files[i]);
        size_t len;
        char *data = test_read_file(test_data_path(rel), &len);
        if (!data) fail_msg("fixture %s is missing", rel);
        if (strchr(files[i], '/')) { /* 1_Pooling/config.json */
            char sub[1024];
            snprintf(sub, sizeof sub, "%s/%.*s", dir, (int)(strchr(files[i], '/') - files[i]), files[i]);
            mkdir(sub, 0755);
        }
        write_file(dir, files[i], data, len);
        free(data);
    }
    return dir;
}

typedef enum bad_kind { BAD_FIFO, BAD_FOLDER, BAD_LINK_LOOP, BAD_UNREADABLE, BAD_KINDS } bad_kind;
static const char *const BAD_NAMES[BAD_KINDS] = {"a FIFO", "a folder", "a symlink loop", "unreadable"};

/* Replaces dir/name by a bad file of `kind`; 0 when this kind cannot be made here. */
static int make_bad(const char *dir, const char *name, bad_kind kind) {
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    assert_int_equal(remove(path), 0);
    switch (kind) {
    case BAD_FIFO: assert_int_equal(mkfifo(path, 0644), 0); return 1;
    case BAD_FOLDER: assert_int_equal(mkdir(path, 0755), 0); return 1;
    case BAD_LINK_LOOP: assert_int_equal(symlink(path, path), 0); return 1;
    case BAD_UNREADABLE:
        if (geteuid() == 0) return 0; /* root reads a mode-000 file anyway */
        write_file(dir, name, "{}", 2);
        assert_int_equal(chmod(path, 0), 0);
        return 1;
    default: return 0;
    }
}

/* Every file of a folder made bad in every way: the load fails, naming the file, and returns. */
static void check_every_file(const char *model, const char *const *files, size_t n_files) {
    for (size_t i = 0; i < n_files; i++) {
        for (int kind = 0; kind < BAD_KINDS; kind++) {
            const char *dir = copy_folder(1, model, files, n_files);
            if (!make_bad(dir, files[i], (bad_kind)kind)) continue;
            alarm(30); /* a loader that blocks on the FIFO ends the test here, not in CI's timeout */
            nopad_model *m = NULL;
            const nopad_status st = nopad_model_load(dir, NULL, &m);
            alarm(0);
            if (st == NOPAD_OK) fail_msg("%s/%s as %s: loaded", model, files[i], BAD_NAMES[kind]);
            assert_null(m);
            const char *base = strrchr(files[i], '/') ? strrchr(files[i], '/') + 1 : files[i];
            if (!strstr(nopad_last_error(), base))
                fail_msg("%s/%s as %s: the message does not name the file: %s", model, files[i],
                         BAD_NAMES[kind], nopad_last_error());
            printf("  %-22s as %-15s %s\n", files[i], BAD_NAMES[kind], nopad_last_error());
        }
    }
}

static void test_bad_files(void **state) {
    /* a sentence-transformers folder with tokenizer.json: config, weights, tokenizer, pipeline */
    static const char *const st_files[] = {"config.json",           "model.safetensors", "tokenizer.json",
                                           "modules.json",          "1_Pooling/config.json",
                                           "sentence_bert_config.json"};
    check_every_file("st_mean_norm", st_files, sizeof st_files / sizeof st_files[0]);
    /* the same folder with vocab.txt and tokenizer_config.json as its tokenizer */
    static const char *const vocab_files[] = {"config.json", "model.safetensors", "vocab.txt",
                                              "tokenizer_config.json"};
    check_every_file("st_mean_norm", vocab_files, sizeof vocab_files / sizeof vocab_files[0]);
    /* a sharded checkpoint: the index and a shard */
    static const char *const sharded[] = {"config.json", "model.safetensors.index.json",
                                          "model-00001-of-00006.safetensors", "model-00002-of-00006.safetensors",
                                          "model-00003-of-00006.safetensors", "model-00004-of-00006.safetensors",
                                          "model-00005-of-00006.safetensors", "model-00006-of-00006.safetensors"};
    const size_t n = sizeof sharded / sizeof sharded[0];
    for (size_t bad = 1; bad <= 2; bad++) { /* the index, then the first shard */
        for (int kind = 0; kind < BAD_KINDS; kind++) {
            const char *dir = copy_folder(2, "xlmr_b", sharded, n);
            if (!make_bad(dir, sharded[bad], (bad_kind)kind)) continue;
            alarm(30);
            nopad_model *m = NULL;
            const nopad_status st = nopad_model_load(dir, NULL, &m);
            alarm(0);
            if (st == NOPAD_OK || !strstr(nopad_last_error(), sharded[bad]))
                fail_msg("xlmr_b/%s as %s: %s", sharded[bad], BAD_NAMES[kind],
                         st == NOPAD_OK ? "loaded" : nopad_last_error());
        }
    }
}

/* bert_a's config.json with the integer field `key` set to `value`. */
static char *bert_a_config(const char *key, int value) {
    char *text = test_read_file(test_data_path("models/bert_a/config.json"), NULL);
    assert_non_null(text);
    cJSON *cfg = cJSON_Parse(text);
    free(text);
    assert_non_null(cfg);
    cJSON_ReplaceItemInObject(cfg, key, cJSON_CreateNumber(value));
    char *out = cJSON_Print(cfg);
    cJSON_Delete(cfg);
    return out;
}

static const char *const BERT_FILES[] = {"config.json", "model.safetensors"};

/* A folder of bert_a with config.json replaced. */
static const char *bert_a_with_config(char *config) {
    const char *dir = copy_folder(3, "bert_a", BERT_FILES, 2);
    write_file(dir, "config.json", config, strlen(config));
    free(config);
    return dir;
}

static void test_config_contradicts_weights(void **state) {
    nopad_model *m = NULL;
    /* the weights hold token-type embeddings the config says do not exist */
    const char *dir = bert_a_with_config(bert_a_config("type_vocab_size", 0));
    assert_nopad_error(nopad_model_load(dir, NULL, &m), NOPAD_ERR_FORMAT, "type_vocab_size 0");
    assert_true(strstr(nopad_last_error(), "token_type_embeddings") != NULL);
    /* fewer layers in the config than in the weights */
    dir = bert_a_with_config(bert_a_config("num_hidden_layers", 1));
    assert_nopad_error(nopad_model_load(dir, NULL, &m), NOPAD_ERR_FORMAT, "num_hidden_layers 1");
    assert_true(strstr(nopad_last_error(), "encoder.layer.1.") != NULL);
    /* more layers in the config than in the weights: a missing tensor, as before */
    dir = bert_a_with_config(bert_a_config("num_hidden_layers", 3));
    assert_nopad_error(nopad_model_load(dir, NULL, &m), NOPAD_ERR_FORMAT, "encoder.layer.2.");
    assert_null(m);
}

/* bert_a's weights with element `index` of tensor `name` (F32) set to `value`. */
static const char *bert_a_with_weight(const char *name, size_t index, float value) {
    const char *dir = copy_folder(4, "bert_a", BERT_FILES, 2);
    size_t len;
    char *data = test_read_file(test_data_path("models/bert_a/model.safetensors"), &len);
    assert_non_null(data);
    uint64_t header = 0;
    memcpy(&header, data, 8); /* little-endian length of the JSON header */
    char *json = strndup(data + 8, header);
    cJSON *root = cJSON_Parse(json);
    free(json);
    assert_non_null(root);
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(root, name);
    assert_non_null(t);
    assert_string_equal(cJSON_GetObjectItemCaseSensitive(t, "dtype")->valuestring, "F32");
    const size_t begin = (size_t)cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(t, "data_offsets"), 0)->valuedouble;
    cJSON_Delete(root);
    memcpy(data + 8 + header + begin + index * sizeof(float), &value, sizeof value);
    write_file(dir, "model.safetensors", data, len);
    free(data);
    return dir;
}

static void test_non_finite_weights(void **state) {
    nopad_model *m = NULL;
    const char *dir = bert_a_with_weight("encoder.layer.1.output.dense.weight", 100, NAN);
    assert_nopad_error(nopad_model_load(dir, NULL, &m), NOPAD_ERR_FORMAT, "NaN at element 100");
    assert_true(strstr(nopad_last_error(), "encoder.layer.1.output.dense.weight") != NULL);
    dir = bert_a_with_weight("embeddings.LayerNorm.bias", 3, -INFINITY);
    assert_nopad_error(nopad_model_load(dir, NULL, &m), NOPAD_ERR_FORMAT, "an infinity at element 3");
    assert_null(m);
}

/* "[[[...]]]" nested `depth` deep. */
static char *nested_json(size_t depth) {
    char *text = malloc(2 * depth + 1);
    memset(text, '[', depth);
    memset(text + depth, ']', depth);
    text[2 * depth] = '\0';
    return text;
}

static void test_deep_json(void **state) {
    static const char *const st_files[] = {"config.json", "model.safetensors", "tokenizer.json", "modules.json",
                                           "1_Pooling/config.json", "sentence_bert_config.json"};
    const size_t n = sizeof st_files / sizeof st_files[0];
    const size_t depths[] = {900, 100000}; /* cJSON parses up to 1000 levels, refuses more */
    for (size_t d = 0; d < 2; d++) {
        char *json = nested_json(depths[d]);
        const size_t len = strlen(json);
        for (size_t i = 0; i < n; i++) {
            const char *dir = copy_folder(5, "st_mean_norm", st_files, n);
            if (strcmp(st_files[i], "model.safetensors") == 0) { /* the header: 8-byte length, JSON */
                char *file = malloc(8 + len);
                const uint64_t header = len;
                memcpy(file, &header, 8);
                memcpy(file + 8, json, len);
                write_file(dir, st_files[i], file, 8 + len);
                free(file);
            } else {
                write_file(dir, st_files[i], json, len);
            }
            nopad_model *m = NULL;
            if (nopad_model_load(dir, NULL, &m) == NOPAD_OK)
                fail_msg("%s nested %zu deep: loaded", st_files[i], depths[d]);
            assert_null(m);
        }
        /* the sharded checkpoint's index */
        static const char *const sharded[] = {"config.json", "model.safetensors.index.json"};
        const char *dir = copy_folder(6, "xlmr_b", sharded, 2);
        write_file(dir, sharded[1], json, len);
        nopad_model *m = NULL;
        if (nopad_model_load(dir, NULL, &m) == NOPAD_OK) fail_msg("index nested %zu deep: loaded", depths[d]);
        free(json);
    }
}

/* The model folder itself: missing, a file, a symlink loop: the CLI's words from the library. */
static void test_folder_itself(void **state) {
    nopad_model *m = NULL;
    assert_nopad_error(nopad_model_load("/nonexistent/nopad-model", NULL, &m), NOPAD_ERR_IO, "does not exist");
    const char *dir = copy_folder(7, "bert_a", BERT_FILES, 2);
    char path[1024];
    snprintf(path, sizeof path, "%s/config.json", dir);
    assert_nopad_error(nopad_model_load(path, NULL, &m), NOPAD_ERR_IO, "is not a folder");
    snprintf(path, sizeof path, "%s/loop", dir);
    assert_int_equal(symlink(path, path), 0);
    assert_nopad_error(nopad_model_load(path, NULL, &m), NOPAD_ERR_IO, "symbolic links");
    assert_null(m);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bad_files),
        cmocka_unit_test(test_config_contradicts_weights),
        cmocka_unit_test(test_non_finite_weights),
        cmocka_unit_test(test_deep_json),
        cmocka_unit_test(test_folder_itself),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
