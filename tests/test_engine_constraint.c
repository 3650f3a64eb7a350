/* Constrained decoding in the engine (nopad_constraint, issue 44) on the CPU backend, with the
 * real SmolLM2 (NOPAD_SMOLLM2_GGUF; those parts skip without it): requests under a JSON schema,
 * any JSON object, a regex and a list of choices give outputs that are such documents, sampled
 * (temperature 1, seeded: unconstrained, a 135M model's text is rarely JSON) as well as greedy;
 * the unconstrained requests of the same steps give exactly what they give without the
 * constrained ones beside them (greedy, dequantised weights: a row's logits do not depend on its
 * batch); a constraint freed while its requests run keeps them going. Refusals: an unsupported
 * schema keyword names itself and its path; a model without a tokenizer refuses a constraint at
 * submit. Both with the CPU's default step order and with the overlap the CUDA backend uses. */
#include <cjson/cJSON.h>
#include <regex.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "testutil.h"

enum { MAX_TOKENS = 96, N_SAMPLED = 2 };

static int OVERLAP_ON = 1;

static const char SCHEMA[] =
    "{\"type\": \"object\", \"properties\": {"
    "\"name\": {\"type\": \"string\", \"maxLength\": 16},"
    "\"age\": {\"type\": \"integer\", \"minimum\": 0, \"maximum\": 150},"
    "\"tags\": {\"type\": \"array\", \"items\": {\"enum\": [\"red\", \"green\", \"blue\"]}, \"maxItems\": 3}},"
    "\"required\": [\"name\", \"age\", \"tags\"], \"additionalProperties\": false}";

static nopad_model *load_smollm2(void) {
    const char *path = getenv("NOPAD_SMOLLM2_GGUF");
    if (!path || access(path, R_OK) != 0) {
        printf("  (NOPAD_SMOLLM2_GGUF not set or missing: skipped)\n");
        return NULL;
    }
    nopad_model_params p = nopad_model_default_params();
    p.weights = NOPAD_WEIGHTS_F32; /* batch-invariant rows: the unconstrained outputs compare exactly */
    nopad_model *m = NULL;
    assert_nopad_ok(nopad_model_load(path, &p, &m));
    return m;
}

static nopad_engine *engine_for(nopad_model *m, void **state) {
    nopad_engine_params ep = nopad_engine_default_params();
    ep.max_step_tokens = 256;
    ep.kv_cache_tokens = 4096;
    if (state && *state) ep.overlap_steps = *(const int *)*state;
    nopad_engine *e = NULL;
    assert_nopad_ok(nopad_engine_create(m, &ep, &e));
    return e;
}

static nopad_request *submit(nopad_engine *e, const char *prompt, const nopad_constraint *c, float temperature,
                             uint64_t seed) {
    nopad_request_params p = nopad_request_default_params();
    p.prompt_text = prompt;
    p.max_tokens = MAX_TOKENS;
    p.constraint = c;
    p.sampling.temperature = temperature;
    p.sampling.seed = seed;
    nopad_request *r = NULL;
    assert_nopad_ok(nopad_engine_submit(e, &p, &r));
    return r;
}

/* The request's whole text and ids, once it ends. */
static nopad_finish_reason finish(nopad_request *r, char *text, size_t cap, int32_t *ids, int32_t *n_ids) {
    nopad_finish_reason f = NOPAD_FINISH_NONE;
    int32_t n = 0, got = 0;
    while (f == NOPAD_FINISH_NONE) {
        assert_nopad_ok(nopad_request_read(r, ids + n, MAX_TOKENS - n, &got, &f, -1));
        n += got;
    }
    size_t len = 0;
    assert_nopad_ok(nopad_request_text(r, text, cap, &len));
    *n_ids = n;
    return f;
}

/* The schema's documents: checked field by field (the test's own reading of SCHEMA). */
static void check_person(const char *text) {
    cJSON *doc = cJSON_Parse(text);
    if (!doc) fail_msg("not JSON: %s", text);
    assert_true(cJSON_IsObject(doc));
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(doc, "name");
    const cJSON *age = cJSON_GetObjectItemCaseSensitive(doc, "age");
    const cJSON *tags = cJSON_GetObjectItemCaseSensitive(doc, "tags");
    if (!cJSON_IsString(name) || !cJSON_IsNumber(age) || !cJSON_IsArray(tags)) fail_msg("fields: %s", text);
    assert_true(cJSON_GetArraySize(doc) == 3);
    assert_true(strlen(name->valuestring) <= 16 * 4); /* 16 characters, at most 4 bytes each */
    assert_true(age->valuedouble == (double)(long long)age->valuedouble);
    assert_true(age->valuedouble >= 0 && age->valuedouble <= 150);
    assert_true(cJSON_GetArraySize(tags) <= 3);
    const cJSON *t;
    cJSON_ArrayForEach(t, tags) {
        if (!cJSON_IsString(t) || (strcmp(t->valuestring, "red") && strcmp(t->valuestring, "green") &&
                                   strcmp(t->valuestring, "blue")))
            fail_msg("tag outside the enum: %s", text);
    }
    cJSON_Delete(doc);
}

static void test_schema_under_load(void **state) {
    nopad_model *m = load_smollm2();
    if (!m) return;
    nopad_engine *e = engine_for(m, state);
    nopad_constraint *c = NULL;
    assert_nopad_ok(nopad_constraint_json_schema(SCHEMA, strlen(SCHEMA), &c));
    static const char *free_prompts[] = {"The capital of France is", "Once upon a time"};
    static char text[8192];
    int32_t ids[MAX_TOKENS], n;

    /* the unconstrained requests alone first */
    int32_t alone[2][MAX_TOKENS], n_alone[2];
    nopad_finish_reason f_alone[2];
    for (int i = 0; i < 2; i++) {
        nopad_request *r = submit(e, free_prompts[i], NULL, 0.0f, 0);
        f_alone[i] = finish(r, text, sizeof text, alone[i], &n_alone[i]);
        nopad_request_free(r);
    }
    /* then beside constrained ones: sampled at temperature 1 and greedy */
    nopad_request *con[N_SAMPLED + 1], *fr[2];
    const char *ask = "Describe a person as JSON with name, age and tags:";
    for (int i = 0; i < N_SAMPLED; i++) con[i] = submit(e, ask, c, 1.0f, 100 + (uint64_t)i);
    con[N_SAMPLED] = submit(e, ask, c, 0.0f, 0);
    for (int i = 0; i < 2; i++) fr[i] = submit(e, free_prompts[i], NULL, 0.0f, 0);
    nopad_constraint_free(c); /* the running requests hold it */
    int complete = 0;
    for (int i = 0; i <= N_SAMPLED; i++) {
        const nopad_finish_reason f = finish(con[i], text, sizeof text, ids, &n);
        printf("  constrained %d (%s, %d ids): %s\n", i, nopad_finish_reason_name(f), n, text);
        if (f == NOPAD_FINISH_STOP) {
            check_person(text);
            complete++;
        } else {
            assert_int_equal(f, NOPAD_FINISH_LENGTH); /* a prefix of a document, cut by max_tokens */
        }
        nopad_request_free(con[i]);
    }
    assert_true(complete >= 2); /* 96 tokens is room for these documents; a stuck mask would give none */
    for (int i = 0; i < 2; i++) {
        const nopad_finish_reason f = finish(fr[i], text, sizeof text, ids, &n);
        assert_int_equal(f, f_alone[i]);
        assert_int_equal(n, n_alone[i]);
        assert_memory_equal(ids, alone[i], (size_t)n * sizeof *ids);
        nopad_request_free(fr[i]);
    }
    nopad_engine_free(e);
    nopad_model_free(m);
}

static void test_object_regex_choices(void **state) {
    nopad_model *m = load_smollm2();
    if (!m) return;
    nopad_engine *e = engine_for(m, state);
    static char text[8192];
    int32_t ids[MAX_TOKENS], n;

    nopad_constraint *obj = NULL, *re = NULL, *choice = NULL;
    assert_nopad_ok(nopad_constraint_json_object(&obj));
    static const char pattern[] = "[0-9]{3}-[a-z]{2,4}";
    assert_nopad_ok(nopad_constraint_regex(pattern, strlen(pattern), &re));
    static const char *const choices[] = {"positive", "negative", "neutral"};
    assert_nopad_ok(nopad_constraint_choices(choices, 3, &choice));

    nopad_request *r = submit(e, "Give me a JSON object:", obj, 1.0f, 7);
    nopad_finish_reason f = finish(r, text, sizeof text, ids, &n);
    printf("  json_object (%s): %s\n", nopad_finish_reason_name(f), text);
    if (f == NOPAD_FINISH_STOP) {
        cJSON *doc = cJSON_Parse(text);
        if (!doc || !cJSON_IsObject(doc)) fail_msg("not a JSON object: %s", text);
        cJSON_Delete(doc);
    }
    nopad_request_free(r);

    r = submit(e, "A code:", re, 1.0f, 11);
    f = finish(r, text, sizeof text, ids, &n);
    printf("  regex %s (%s): %s\n", pattern, nopad_finish_reason_name(f), text);
    assert_int_equal(f, NOPAD_FINISH_STOP); /* at most 8 bytes: always whole */
    regex_t rx;
    assert_int_equal(regcomp(&rx, "^[0-9]{3}-[a-z]{2,4}$", REG_EXTENDED | REG_NOSUB), 0);
    if (regexec(&rx, text, 0, NULL, 0) != 0) fail_msg("\"%s\" does not match %s", text, pattern);
    regfree(&rx);
    nopad_request_free(r);

    r = submit(e, "The review 'I loved it' is", choice, 0.0f, 0);
    f = finish(r, text, sizeof text, ids, &n);
    printf("  choices (%s): %s\n", nopad_finish_reason_name(f), text);
    assert_int_equal(f, NOPAD_FINISH_STOP);
    assert_true(!strcmp(text, "positive") || !strcmp(text, "negative") || !strcmp(text, "neutral"));
    nopad_request_free(r);

    nopad_constraint_free(obj);
    nopad_constraint_free(re);
    nopad_constraint_free(choice);
    nopad_engine_free(e);
    nopad_model_free(m);
}

static void test_refusals(void **state) {
    (void)state;
    nopad_constraint *c = NULL;
    static const char bad[] = "{\"type\": \"object\", \"properties\": {\"n\": {\"type\": \"number\", \"multipleOf\": 3}}}";
    assert_int_equal(nopad_constraint_json_schema(bad, strlen(bad), &c), NOPAD_ERR_UNSUPPORTED);
    assert_null(c);
    assert_non_null(strstr(nopad_last_error(), "multipleOf"));
    assert_non_null(strstr(nopad_last_error(), "properties.n"));
    assert_int_equal(nopad_constraint_json_schema("{\"type\": ", 9, &c), NOPAD_ERR_INVALID_ARGUMENT);
    assert_int_equal(nopad_constraint_choices(NULL, 0, &c), NOPAD_ERR_INVALID_ARGUMENT);
    nopad_constraint_free(NULL);

    /* a model without a tokenizer has no token bytes to mask by */
    nopad_model *m = NULL;
    assert_nopad_ok(nopad_model_load(test_data_path("models/llama_gqa"), NULL, &m));
    nopad_engine *e = NULL;
    assert_nopad_ok(nopad_engine_create(m, NULL, &e));
    assert_nopad_ok(nopad_constraint_json_object(&c));
    const int32_t prompt[] = {5, 6, 7};
    nopad_request_params p = nopad_request_default_params();
    p.prompt_ids = prompt;
    p.n_prompt_ids = 3;
    p.constraint = c;
    nopad_request *r = NULL;
    assert_int_equal(nopad_engine_submit(e, &p, &r), NOPAD_ERR_INVALID_ARGUMENT);
    assert_null(r);
    assert_non_null(strstr(nopad_last_error(), "tokenizer"));
    nopad_constraint_free(c);
    nopad_engine_free(e);
    nopad_model_free(m);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_refusals),
        cmocka_unit_test(test_schema_under_load),
        cmocka_unit_test_prestate(test_schema_under_load, &OVERLAP_ON),
        cmocka_unit_test(test_object_regex_choices),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
