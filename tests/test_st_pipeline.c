/* sentence-transformers side files: classic (flags) and >= 6 (string mode) pooling configs,
 * Normalize, the max_seq_length sources, and modules we must refuse rather than skip. */
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "io/hf_config.h"
#include "io/st_pipeline.h"
#include "testutil.h"

static void write_text(const char *dir, const char *rel, const char *text) {
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", dir, rel);
    char *slash = strrchr(path, '/');
    if (strchr(rel, '/')) {
        *slash = '\0';
        mkdir(path, 0700);
        *slash = '/';
    }
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

static const char *folder(const char *modules, const char *pooling, const char *sbert,
                          const char *tok_cfg) {
    const char *dir = test_make_temp_dir(2);
    if (modules) write_text(dir, "modules.json", modules);
    if (pooling) write_text(dir, "1_Pooling/config.json", pooling);
    if (sbert) write_text(dir, "sentence_bert_config.json", sbert);
    if (tok_cfg) write_text(dir, "tokenizer_config.json", tok_cfg);
    return dir;
}

static const char *MODULES =
    "[{\"idx\":0,\"name\":\"0\",\"path\":\"\",\"type\":\"sentence_transformers.models.Transformer\"},"
    "{\"idx\":1,\"name\":\"1\",\"path\":\"1_Pooling\",\"type\":\"sentence_transformers.models.Pooling\"},"
    "{\"idx\":2,\"name\":\"2\",\"path\":\"2_Normalize\",\"type\":\"sentence_transformers.models.Normalize\"}]";

static void test_plain_folder_defaults_to_cls(void **state) {
    st_pipeline p;
    assert_nopad_ok(st_pipeline_load(folder(NULL, NULL, NULL, NULL), &p));
    assert_int_equal(p.has_pipeline, 0);
    assert_int_equal(p.pooling, NOPAD_POOLING_CLS);
    assert_int_equal(p.normalize, 0);
    assert_int_equal(p.max_seq_length, 0);
}

static void test_classic_flags(void **state) {
    st_pipeline p;
    assert_nopad_ok(st_pipeline_load(
        folder(MODULES, "{\"pooling_mode_mean_tokens\": true, \"pooling_mode_cls_token\": false}",
               "{\"max_seq_length\": 128}", "{\"model_max_length\": 512}"), &p));
    assert_int_equal(p.pooling, NOPAD_POOLING_MEAN);
    assert_int_equal(p.normalize, 1);
    assert_int_equal(p.max_seq_length, 128); /* sentence_bert_config wins */
}

static void test_v6_string_mode(void **state) {
    st_pipeline p;
    assert_nopad_ok(st_pipeline_load(
        folder("[{\"path\":\"1_Pooling\",\"type\":\"sentence_transformers.sentence_transformer.modules.pooling.Pooling\"}]",
               "{\"embedding_dimension\": 8, \"pooling_mode\": \"max\"}", "{\"transformer_task\": \"x\"}",
               "{\"model_max_length\": 77}"), &p));
    assert_int_equal(p.pooling, NOPAD_POOLING_MAX);
    assert_int_equal(p.normalize, 0);
    assert_int_equal(p.max_seq_length, 77);
    /* transformers' "no limit" sentinel is ignored */
    assert_nopad_ok(st_pipeline_load(folder(NULL, NULL, NULL, "{\"model_max_length\": 1e30}"), &p));
    assert_int_equal(p.max_seq_length, 0);
}

static void test_refused_pipelines(void **state) {
    st_pipeline p;
    assert_nopad_error(st_pipeline_load(folder("[{\"path\":\"2_Dense\",\"type\":\"sentence_transformers.models.Dense\"}]",
                                               NULL, NULL, NULL), &p),
                       NOPAD_ERR_UNSUPPORTED, "Dense");
    assert_nopad_error(st_pipeline_load(folder(MODULES, "{\"pooling_mode\": \"lasttoken\"}", NULL, NULL), &p),
                       NOPAD_ERR_UNSUPPORTED, "lasttoken");
    assert_nopad_error(st_pipeline_load(folder(MODULES, "{\"pooling_mode_weightedmean_tokens\": true}", NULL, NULL), &p),
                       NOPAD_ERR_UNSUPPORTED, "weightedmean");
    assert_nopad_error(st_pipeline_load(folder(MODULES, "{\"pooling_mode_cls_token\": true, \"pooling_mode_max_tokens\": true}", NULL, NULL), &p),
                       NOPAD_ERR_UNSUPPORTED, "exactly one");
    assert_nopad_error(st_pipeline_load(folder(MODULES, NULL, NULL, NULL), &p), NOPAD_ERR_IO, "1_Pooling");
    assert_nopad_error(st_pipeline_load(folder("{not json", NULL, NULL, NULL), &p), NOPAD_ERR_FORMAT, "modules.json");
    assert_nopad_error(st_pipeline_load(folder("{}", NULL, NULL, NULL), &p), NOPAD_ERR_FORMAT, "array");
    assert_nopad_error(st_pipeline_load(folder("[{\"path\":\"../x\",\"type\":\"sentence_transformers.models.Pooling\"}]", NULL, NULL, NULL), &p),
                       NOPAD_ERR_FORMAT, "leaves the folder");
    assert_nopad_error(st_pipeline_load(folder(NULL, NULL, "{\"max_seq_length\": -4}", NULL), &p),
                       NOPAD_ERR_FORMAT, "max_seq_length");
}

/* Pooling values that are not booleans ("yes", 7) are named with the file and key, not counted
 * as false (issue 19, item 5). */
static void test_pooling_values_of_the_wrong_type(void **state) {
    /* modules.json, 1_Pooling/config.json, sentence_bert_config.json, tokenizer_config.json (NULL:
     * the default), and the whole message expected */
    const struct { const char *files[4], *message; } cases[] = {
        {{MODULES, "{\"pooling_mode_mean_tokens\": \"yes\"}"},
         "1_Pooling/config.json: field \"pooling_mode_mean_tokens\" has the wrong JSON type: expected a boolean (true/false), found a string"},
        {{MODULES, "{\"pooling_mode_cls_token\": 7}"},
         "1_Pooling/config.json: field \"pooling_mode_cls_token\" has the wrong JSON type: expected a boolean (true/false), found a number"},
        {{MODULES, "{\"pooling_mode_mean_tokens\": true, \"pooling_mode_lasttoken\": 1}"},
         "field \"pooling_mode_lasttoken\" has the wrong JSON type: expected a boolean (true/false), found a number"},
        {{MODULES, "{\"pooling_mode\": 7}"},
         "field \"pooling_mode\" has the wrong JSON type: expected a string (cls, mean or max), found a number"},
        {{MODULES, "[true]"}, "1_Pooling/config.json: expected a JSON object, found an array"},
        {{NULL, NULL, "{\"max_seq_length\": \"128\"}"},
         "sentence_bert_config.json: field \"max_seq_length\" has the wrong JSON type: expected a positive integer, found a string"},
        {{NULL, NULL, "[128]"}, "sentence_bert_config.json: expected a JSON object, found an array"},
        {{NULL, NULL, NULL, "\"x\""}, "tokenizer_config.json: expected a JSON object, found a string"},
        {{"[5]"}, "modules.json: module 0: expected a JSON object, found a number"},
        {{"[{\"type\": 5, \"path\": \"\"}]"},
         "module 0: field \"type\" has the wrong JSON type: expected a string, found a number"},
        {{"[{\"type\": \"sentence_transformers.models.Transformer\"}]"}, "module 0: required string field \"path\" is missing"},
    };
    st_pipeline p;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const char *const *f = cases[i].files;
        assert_nopad_error(st_pipeline_load(folder(f[0], f[1], f[2], f[3]), &p), NOPAD_ERR_FORMAT, cases[i].message);
    }
    /* null, as older sentence-transformers write for unset flags, stays false */
    assert_nopad_ok(st_pipeline_load(
        folder(MODULES, "{\"pooling_mode_mean_tokens\": true, \"pooling_mode_lasttoken\": null}", NULL, NULL), &p));
    assert_int_equal(p.pooling, NOPAD_POOLING_MEAN);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_plain_folder_defaults_to_cls),
        cmocka_unit_test(test_classic_flags),
        cmocka_unit_test(test_v6_string_mode),
        cmocka_unit_test(test_refused_pipelines),
        cmocka_unit_test(test_pooling_values_of_the_wrong_type),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
