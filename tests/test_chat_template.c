/* The chat template text a model ships (nopad_model_chat_template, io/chat_template.c): a folder's
 * chat_template.jinja or tokenizer_config.json "chat_template" (a string or the "default" entry
 * of a list), a GGUF file's tokenizer.chat_template; absent -> NULL; a wrong shape -> an error. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "io/chat_template.h"
#include "testutil.h"

static void write_in(const char *dir, const char *name, const char *text) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

static void test_folder(void **state) {
    (void)state;
    char *t = (char *)1;
    const char *dir = test_make_temp_dir(0);
    assert_int_equal(chat_template_from_folder(dir, &t), NOPAD_OK);
    assert_null(t); /* no file at all */

    write_in(dir, "tokenizer_config.json", "{\"do_lower_case\": false}");
    assert_int_equal(chat_template_from_folder(dir, &t), NOPAD_OK);
    assert_null(t);

    write_in(dir, "tokenizer_config.json", "{\"chat_template\": \"<|im_start|>{{x}}\"}");
    assert_int_equal(chat_template_from_folder(dir, &t), NOPAD_OK);
    assert_string_equal(t, "<|im_start|>{{x}}");
    free(t);

    write_in(dir, "tokenizer_config.json",
             "{\"chat_template\": [{\"name\": \"tool_use\", \"template\": \"A\"},"
             " {\"name\": \"default\", \"template\": \"B\"}]}");
    assert_int_equal(chat_template_from_folder(dir, &t), NOPAD_OK);
    assert_string_equal(t, "B");
    free(t);

    write_in(dir, "tokenizer_config.json", "{\"chat_template\": [{\"name\": \"x\", \"template\": \"A\"}]}");
    assert_int_equal(chat_template_from_folder(dir, &t), NOPAD_ERR_FORMAT);
    assert_non_null(strstr(nopad_last_error(), "default"));

    write_in(dir, "tokenizer_config.json", "{\"chat_template\": 7}");
    assert_int_equal(chat_template_from_folder(dir, &t), NOPAD_ERR_FORMAT);
    assert_non_null(strstr(nopad_last_error(), "chat_template"));

    write_in(dir, "tokenizer_config.json", "{\"chat_template\": ");
    assert_int_equal(chat_template_from_folder(dir, &t), NOPAD_ERR_FORMAT);

    /* chat_template.jinja wins over the config */
    write_in(dir, "chat_template.jinja", "{{ '[INST]' }}");
    assert_int_equal(chat_template_from_folder(dir, &t), NOPAD_OK);
    assert_string_equal(t, "{{ '[INST]' }}");
    free(t);
}

static void test_gguf_model(void **state) {
    (void)state;
    const char *path = getenv("NOPAD_SMOLLM2_GGUF");
    FILE *f = path ? fopen(path, "rb") : NULL;
    if (!f) {
        skip(); /* scripts/fetch_default_decoder.sh */
        return;
    }
    fclose(f);
    nopad_model *m = NULL;
    assert_int_equal(nopad_model_load(path, NULL, &m), NOPAD_OK);
    const char *t = nopad_model_chat_template(m);
    assert_non_null(t);
    assert_non_null(strstr(t, "<|im_start|>"));
    nopad_model_free(m);
    /* an encoder or a decoder folder without one */
    assert_int_equal(nopad_model_load(test_data_path("models/llama_gqa"), NULL, &m), NOPAD_OK);
    assert_null(nopad_model_chat_template(m));
    nopad_model_free(m);
    assert_null(nopad_model_chat_template(NULL));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_folder),
        cmocka_unit_test(test_gguf_model),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
