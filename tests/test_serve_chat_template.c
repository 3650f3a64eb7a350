/* nopad serve's chat templates (tools/serve/chat_template.c): each family's prompt for one
 * conversation (a system turn, an assistant turn with surrounding spaces, two user turns), written
 * out by hand from the family's format; recognition from a template's text, SmolLM2's default
 * system turn, names. */
#include <stdlib.h>
#include <string.h>

#include "chat_template.h"
#include "testutil.h"

static const chat_message conv[] = {
    {.role = "system", .content = "Be brief."},
    {.role = "user", .content = "Hi"},
    {.role = "assistant", .content = " Hello! "},
    {.role = "user", .content = "Bye"},
};

static void expect_prompt(chat_family f, const chat_message *m, int n, const char *want) {
    chat_template t = {.family = f};
    size_t len = 0;
    char *got = chat_template_apply(&t, m, n, &len);
    assert_non_null(got);
    if (strcmp(got, want) != 0) print_error("%s:\n got  [%s]\n want [%s]\n", chat_family_name(f), got, want);
    assert_string_equal(got, want);
    assert_int_equal(len, strlen(want));
    free(got);
}

static void test_families(void **state) {
    (void)state;
    expect_prompt(CHAT_CHATML, conv, 4,
                  "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
                  "<|im_start|>assistant\n Hello! <|im_end|>\n<|im_start|>user\nBye<|im_end|>\n"
                  "<|im_start|>assistant\n");
    expect_prompt(CHAT_LLAMA3, conv, 4,
                  "<|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>"
                  "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
                  "<|start_header_id|>assistant<|end_header_id|>\n\nHello!<|eot_id|>"
                  "<|start_header_id|>user<|end_header_id|>\n\nBye<|eot_id|>"
                  "<|start_header_id|>assistant<|end_header_id|>\n\n");
    expect_prompt(CHAT_LLAMA2, conv, 4, "[INST] Be brief.\nHi [/INST] Hello! </s>[INST] Bye [/INST]");
    expect_prompt(CHAT_LLAMA2_SYS, conv, 4,
                  "[INST] <<SYS>>\nBe brief.\n<</SYS>>\n\nHi [/INST] Hello! </s>[INST] Bye [/INST]");
    expect_prompt(CHAT_LLAMA2_SYS_BOS, conv, 4,
                  "[INST] <<SYS>>\nBe brief.\n<</SYS>>\n\nHi [/INST] Hello! </s><s>[INST] Bye [/INST]");
    expect_prompt(CHAT_LLAMA2_SYS_STRIP, conv, 4,
                  "[INST] <<SYS>>\nBe brief.\n<</SYS>>\n\nHi [/INST]Hello!</s>[INST] Bye [/INST]");
    expect_prompt(CHAT_MISTRAL_V1, conv, 4, " [INST] Be brief.\n\nHi [/INST]  Hello! </s> [INST] Bye [/INST]");
    expect_prompt(CHAT_MISTRAL_V3, conv, 4, "[INST] Be brief.\n\nHi[/INST] Hello!</s>[INST] Bye[/INST]");
    expect_prompt(CHAT_MISTRAL_V3_TEKKEN, conv, 4, "[INST]Be brief.\n\nHi[/INST] Hello! </s>[INST]Bye[/INST]");
    expect_prompt(CHAT_MISTRAL_V7, conv, 4,
                  "[SYSTEM_PROMPT] Be brief.[/SYSTEM_PROMPT][INST] Hi[/INST]  Hello! </s>[INST] Bye[/INST]");
    /* one user message */
    expect_prompt(CHAT_CHATML, conv + 1, 1, "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
    expect_prompt(CHAT_LLAMA2_SYS, conv + 1, 1, "[INST] Hi [/INST]");
}

static void test_detect(void **state) {
    (void)state;
    static const struct {
        const char *text;
        chat_family want;
    } cases[] = {
        {"{% for m in messages %}{{'<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>'}}{% endfor %}", CHAT_CHATML},
        {"{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' }}", CHAT_LLAMA3},
        {"{{ bos_token }}{% if m['role'] == 'user' %}{{ '[INST] ' + m['content'] + ' [/INST]' }}{% endif %}", CHAT_LLAMA2},
        {"{{ '[INST] <<SYS>>\\n' + system + '\\n<</SYS>>\\n\\n' }}", CHAT_LLAMA2_SYS},
        {"{{ bos_token + '[INST] ' + content }} <<SYS>>", CHAT_LLAMA2_SYS_BOS},
        {"{{ '[INST] ' + content.strip() + ' [/INST]' }} <<SYS>>", CHAT_LLAMA2_SYS_STRIP},
        {"{{ ' [INST] ' + system_message + '\\n\\n' + m['content'] + ' [/INST]' }}", CHAT_MISTRAL_V1},
        {"{{ '[INST] ' + system_message }}{{ '[AVAILABLE_TOOLS]' }}", CHAT_MISTRAL_V3},
        {"{{ \"[INST]\" + m['content'] + \"[/INST]\" }}{{ '[AVAILABLE_TOOLS]' }}", CHAT_MISTRAL_V3_TEKKEN},
        {"{{ '[SYSTEM_PROMPT]' + s + '[/SYSTEM_PROMPT]' }}{{ '[INST]' + c + '[/INST]' }}", CHAT_MISTRAL_V7},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        chat_template t;
        assert_int_equal(chat_template_detect(cases[i].text, &t), 0);
        if (t.family != cases[i].want)
            print_error("case %zu: %s, want %s\n", i, chat_family_name(t.family), chat_family_name(cases[i].want));
        assert_int_equal(t.family, cases[i].want);
        assert_null(t.default_system);
        chat_template_free(&t);
    }
    chat_template t;
    assert_int_equal(chat_template_detect("{{ '<start_of_turn>' + role }}", &t), -1); /* Gemma: not known */
    assert_int_equal(chat_template_detect("", &t), -1);
}

static void test_default_system(void **state) {
    (void)state;
    /* SmolLM2's template: its own system turn when the messages bring none */
    const char *text =
        "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
        "{{ '<|im_start|>system\nYou are SmolLM.<|im_end|>\n' }}{% endif %}"
        "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
        "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";
    chat_template t;
    assert_int_equal(chat_template_detect(text, &t), 0);
    assert_int_equal(t.family, CHAT_CHATML);
    assert_non_null(t.default_system);
    assert_string_equal(t.default_system, "You are SmolLM.");
    size_t len;
    char *p = chat_template_apply(&t, conv + 1, 1, &len);
    assert_string_equal(p, "<|im_start|>system\nYou are SmolLM.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
                           "<|im_start|>assistant\n");
    free(p);
    p = chat_template_apply(&t, conv, 2, &len); /* a system message of their own: no default */
    assert_string_equal(p, "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
                           "<|im_start|>assistant\n");
    free(p);
    chat_template_free(&t);
}

static void test_names(void **state) {
    (void)state;
    for (int f = 0; f < CHAT_N_FAMILIES; f++) {
        chat_template t;
        assert_int_equal(chat_template_by_name(chat_family_name((chat_family)f), &t), 0);
        assert_int_equal(t.family, f);
        assert_non_null(strstr(chat_template_names(), chat_family_name((chat_family)f)));
    }
    chat_template t;
    assert_int_equal(chat_template_by_name("jinja", &t), -1);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_families),
        cmocka_unit_test(test_detect),
        cmocka_unit_test(test_default_system),
        cmocka_unit_test(test_names),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
