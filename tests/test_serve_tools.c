/* nopad serve's tool calls (tools/serve/tool_calls.c, chat_template.c): answers parsed back into
 * calls in the three formats (Hermes, Llama-3, Mistral), malformed or cut-off calls left as text,
 * what a stream may release before a call (checked on random answers at every length), the tools
 * and tool turns in each family's prompt (written out by hand from the families' templates), a
 * call written into a prompt parsed back to itself, and the markers an unknown template is
 * described by. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "chat_template.h"
#include "testutil.h"
#include "tool_calls.h"

static tool_answer parse(chat_tool_format f, const char *text, int max_calls) {
    tool_answer a;
    assert_int_equal(tool_answer_parse(f, text, strlen(text), max_calls, &a), 0);
    return a;
}

static void expect_call(const tool_answer *a, int i, const char *name, const char *arguments) {
    assert_true(i < a->n_calls);
    assert_string_equal(a->calls[i].name, name);
    assert_string_equal(a->calls[i].arguments, arguments);
}

static void test_hermes(void **state) {
    (void)state;
    tool_answer a = parse(TOOLS_HERMES,
                          "Let me look.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": "
                          "{\"city\": \"Paris\", \"days\": [1, 2]}}\n</tool_call>\n<tool_call>"
                          "{\"name\": \"now\", \"arguments\": {}}</tool_call>\n",
                          0);
    assert_int_equal(a.n_calls, 2);
    expect_call(&a, 0, "get_weather", "{\"city\":\"Paris\",\"days\":[1,2]}");
    expect_call(&a, 1, "now", "{}");
    assert_string_equal(a.content, "Let me look.");
    tool_answer_free(&a);
    /* parallel_tool_calls false: the first call only */
    a = parse(TOOLS_HERMES, "<tool_call>{\"name\": \"a\", \"arguments\": {\"x\": 1}}</tool_call>"
                            "<tool_call>{\"name\": \"b\", \"arguments\": {}}</tool_call>", 1);
    assert_int_equal(a.n_calls, 1);
    expect_call(&a, 0, "a", "{\"x\":1}");
    assert_null(a.content);
    tool_answer_free(&a);
    /* arguments as a string holding an object; missing arguments */
    a = parse(TOOLS_HERMES, "<tool_call>{\"name\": \"a\", \"arguments\": \"{\\\"x\\\": 2}\"}</tool_call>"
                            "<tool_call>{\"name\": \"b\"}</tool_call>", 0);
    assert_int_equal(a.n_calls, 2);
    expect_call(&a, 0, "a", "{\"x\":2}");
    expect_call(&a, 1, "b", "{}");
    tool_answer_free(&a);
    /* malformed JSON, no name, arguments not an object, cut off: all text, as they came */
    static const char *const text_only[] = {
        "<tool_call>{\"name\": \"a\", \"arguments\": {</tool_call>",
        "<tool_call>{\"arguments\": {}}</tool_call>",
        "<tool_call>{\"name\": \"a\", \"arguments\": [1]}</tool_call>",
        "<tool_call>{\"name\": \"a\"} trailing</tool_call>",
        "Sure: <tool_call>{\"name\": \"a\", \"arguments\": {}}",
        "no call at all",
    };
    for (size_t i = 0; i < sizeof text_only / sizeof text_only[0]; i++) {
        a = parse(TOOLS_HERMES, text_only[i], 0);
        assert_int_equal(a.n_calls, 0);
        assert_string_equal(a.content, text_only[i]);
        tool_answer_free(&a);
    }
    /* a malformed call beside a good one: the good one is a call, the other stays in the content */
    a = parse(TOOLS_HERMES, "<tool_call>{bad}</tool_call> <tool_call>{\"name\": \"a\", \"arguments\": {}}</tool_call>", 0);
    assert_int_equal(a.n_calls, 1);
    expect_call(&a, 0, "a", "{}");
    assert_string_equal(a.content, "<tool_call>{bad}</tool_call>");
    tool_answer_free(&a);
    a = parse(TOOLS_HERMES, "", 0);
    assert_int_equal(a.n_calls, 0);
    assert_null(a.content);
    tool_answer_free(&a);
}

static void test_llama3_and_mistral(void **state) {
    (void)state;
    tool_answer a = parse(TOOLS_LLAMA3, " {\"name\": \"get_weather\", \"parameters\": {\"city\": \"a;b\"}}", 0);
    assert_int_equal(a.n_calls, 1);
    expect_call(&a, 0, "get_weather", "{\"city\":\"a;b\"}");
    assert_null(a.content);
    tool_answer_free(&a);
    a = parse(TOOLS_LLAMA3, "<|python_tag|>{\"name\": \"a\", \"parameters\": {}}; {\"name\": \"b\", \"arguments\": {\"k\": true}}", 0);
    assert_int_equal(a.n_calls, 2);
    expect_call(&a, 0, "a", "{}");
    expect_call(&a, 1, "b", "{\"k\":true}");
    tool_answer_free(&a);
    static const char *const llama_text[] = {"The answer is {42}.", "{\"name\": \"a\", \"parameters\": {}} and more",
                                             "{\"no_name\": 1}"};
    for (size_t i = 0; i < sizeof llama_text / sizeof llama_text[0]; i++) {
        a = parse(TOOLS_LLAMA3, llama_text[i], 0);
        assert_int_equal(a.n_calls, 0);
        assert_string_equal(a.content, llama_text[i]);
        tool_answer_free(&a);
    }
    a = parse(TOOLS_MISTRAL, "[TOOL_CALLS] [{\"name\": \"a\", \"arguments\": {\"x\": \"y\"}}, {\"name\": \"b\", \"arguments\": {}}]", 0);
    assert_int_equal(a.n_calls, 2);
    expect_call(&a, 0, "a", "{\"x\":\"y\"}");
    expect_call(&a, 1, "b", "{}");
    assert_null(a.content);
    tool_answer_free(&a);
    a = parse(TOOLS_MISTRAL, " [{\"name\": \"a\", \"arguments\": {}}]", 0); /* the marker skipped as a special token */
    assert_int_equal(a.n_calls, 1);
    tool_answer_free(&a);
    a = parse(TOOLS_MISTRAL, "Checking.[TOOL_CALLS][{\"name\": \"a\", \"arguments\": {}}]", 0);
    assert_int_equal(a.n_calls, 1);
    assert_string_equal(a.content, "Checking.");
    tool_answer_free(&a);
    static const char *const mistral_text[] = {"[1, 2] are numbers", "[{\"name\": \"a\", \"arguments\": {}}, 3]", "[]"};
    for (size_t i = 0; i < sizeof mistral_text / sizeof mistral_text[0]; i++) {
        a = parse(TOOLS_MISTRAL, mistral_text[i], 0);
        assert_int_equal(a.n_calls, 0);
        assert_string_equal(a.content, mistral_text[i]);
        tool_answer_free(&a);
    }
}

/* Random answers of words, '<', '[', '{' and call markers: at every length the bytes a stream may
 * release never decrease, never reach into the first call marker of the whole answer, and are
 * everything when no byte of what follows could begin a call. */
static void test_releasable_random(void **state) {
    (void)state;
    static const char *const pieces[] = {"Sure", " ", "\n", "<", "<tool", "_call>", "<tool_call>",
                                         "</tool_call>", "{", "}", "[", "[TOOL_CALLS]", "ok",
                                         "\"name\"", "<b>"};
    const int n_pieces = (int)(sizeof pieces / sizeof pieces[0]);
    uint64_t rng = 0x5eed7001;
    for (int round = 0; round < 2000; round++) {
        char text[512];
        size_t len = 0;
        const int n = 1 + (int)(test_rand_u32(&rng) % 24);
        for (int k = 0; k < n; k++) {
            const char *p = pieces[test_rand_u32(&rng) % (uint32_t)n_pieces];
            memcpy(text + len, p, strlen(p));
            len += strlen(p);
        }
        text[len] = '\0';
        for (int f = TOOLS_HERMES; f <= TOOLS_MISTRAL; f++) {
            const char *marker = f == TOOLS_HERMES ? "<tool_call>" : f == TOOLS_MISTRAL ? "[TOOL_CALLS]" : NULL;
            const char *first_call = marker ? strstr(text, marker) : NULL;
            size_t first_ns = 0;
            while (first_ns < len && strchr(" \n", text[first_ns])) first_ns++;
            size_t prev = 0;
            for (size_t l = 0; l <= len; l++) {
                const size_t r = tool_text_releasable((chat_tool_format)f, text, l);
                assert_true(r <= l);
                assert_true(r >= prev);
                if (first_call) assert_true(r <= (size_t)(first_call - text));
                if (f == TOOLS_LLAMA3 && first_ns < l && text[first_ns] != '{' && text[first_ns] != '<')
                    assert_int_equal(r, l);
                if (f == TOOLS_HERMES && !memchr(text, '<', l)) assert_int_equal(r, l);
                prev = r;
            }
        }
    }
}

static const chat_tool weather = {
    "get_weather", "{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"parameters\":{}}}"};
static const chat_tool_call call = {"call_1", "get_weather", "{\"city\": \"Paris\"}"};

static void expect_prompt(chat_template *t, const chat_message *m, int n, const chat_tool *tools,
                          int n_tools, const char *want) {
    size_t len = 0;
    char *got = chat_template_apply_tools(t, m, n, tools, n_tools, &len);
    assert_non_null(got);
    if (strcmp(got, want) != 0) print_error("%s:\n got  [%s]\n want [%s]\n", chat_family_name(t->family), got, want);
    assert_string_equal(got, want);
    assert_int_equal(len, strlen(want));
    free(got);
}

static void test_prompts(void **state) {
    (void)state;
    const chat_message conv[] = {
        {.role = "user", .content = "Weather in Paris?"},
        {.role = "assistant", .content = "", .tool_calls = &call, .n_tool_calls = 1},
        {.role = "tool", .content = "18 C", .tool_call_id = "call_1"},
        {.role = "tool", .content = "sunny", .tool_call_id = "call_1"},
    };
    static const char hermes_tools[] =
        "# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are "
        "provided with function signatures within <tools></tools> XML tags:\n<tools>\n"
        "{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"parameters\":{}}}\n</tools>\n\n"
        "For each function call, return a json object with function name and arguments within "
        "<tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": "
        "<args-json-object>}\n</tool_call>";
    /* ChatML with the template's own system text (SmolLM2), as Qwen2.5's template writes tools */
    chat_template t = {.family = CHAT_CHATML, .default_system = strdup("You are SmolLM.")};
    char want[4096];
    snprintf(want, sizeof want,
             "<|im_start|>system\nYou are SmolLM.\n\n%s<|im_end|>\n<|im_start|>user\nWeather in Paris?<|im_end|>\n"
             "<|im_start|>assistant\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n"
             "</tool_call><|im_end|>\n<|im_start|>user\n<tool_response>\n18 C\n</tool_response>\n<tool_response>\n"
             "sunny\n</tool_response><|im_end|>\n<|im_start|>assistant\n",
             hermes_tools);
    expect_prompt(&t, conv, 4, &weather, 1, want);
    /* a system message of the request's own comes before the tools */
    const chat_message sys[] = {{.role = "system", .content = "Be brief."}, conv[0]};
    snprintf(want, sizeof want,
             "<|im_start|>system\nBe brief.\n\n%s<|im_end|>\n<|im_start|>user\nWeather in Paris?<|im_end|>\n"
             "<|im_start|>assistant\n", hermes_tools);
    expect_prompt(&t, sys, 2, &weather, 1, want);
    chat_template_free(&t);
    /* Llama-3.1: the tools before the first user message, the call as {"name", "parameters"},
     * results as ipython turns */
    t = (chat_template){.family = CHAT_LLAMA3};
    expect_prompt(&t, conv, 3, &weather, 1,
                  "<|start_header_id|>user<|end_header_id|>\n\nGiven the following functions, please "
                  "respond with a JSON for a function call with its proper arguments that best answers "
                  "the given prompt.\n\nRespond in the format {\"name\": function name, \"parameters\": "
                  "dictionary of argument name and its value}.Do not use variables.\n\n"
                  "{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"parameters\":{}}}\n\n"
                  "Weather in Paris?<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n"
                  "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}<|eot_id|>"
                  "<|start_header_id|>ipython<|end_header_id|>\n\n18 C<|eot_id|>"
                  "<|start_header_id|>assistant<|end_header_id|>\n\n");
    /* Mistral v3: [AVAILABLE_TOOLS] before the last user turn, [TOOL_CALLS], [TOOL_RESULTS] */
    t = (chat_template){.family = CHAT_MISTRAL_V3};
    const chat_message mconv[] = {conv[0], conv[1], conv[2], {.role = "user", .content = "Thanks"}};
    expect_prompt(&t, mconv, 4, &weather, 1,
                  "[INST] Weather in Paris?[/INST][TOOL_CALLS] [{\"name\": \"get_weather\", \"arguments\": "
                  "{\"city\": \"Paris\"}, \"id\": \"call_1\"}]</s>[TOOL_RESULTS] {\"content\": \"18 C\", "
                  "\"call_id\": \"call_1\"}[/TOOL_RESULTS][AVAILABLE_TOOLS] [{\"type\":\"function\","
                  "\"function\":{\"name\":\"get_weather\",\"parameters\":{}}}][/AVAILABLE_TOOLS][INST] "
                  "Thanks[/INST]");
    /* without tools and tool turns the prompt is the plain one */
    t = (chat_template){.family = CHAT_CHATML};
    expect_prompt(&t, conv, 1, NULL, 0, "<|im_start|>user\nWeather in Paris?<|im_end|>\n<|im_start|>assistant\n");
}

/* A call written into the prompt by each family is parsed back to the same call. */
static void test_prompt_call_round_trip(void **state) {
    (void)state;
    static const struct {
        chat_family family;
        const char *open, *close; /* the assistant turn's text lies between them */
    } cases[] = {
        {CHAT_CHATML, "<|im_start|>assistant\n", "<|im_end|>"},
        {CHAT_LLAMA3, "<|start_header_id|>assistant<|end_header_id|>\n\n", "<|eot_id|>"},
        {CHAT_MISTRAL_V3, "[/INST]", "</s>"},
    };
    const chat_tool_call calls[] = {{"c1", "f", "{\"a\": [1, \"x;y\"], \"b\": {\"c\": null}}"}, {"c2", "g", "{}"}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        chat_template t = {.family = cases[i].family};
        const int n_calls = cases[i].family == CHAT_LLAMA3 ? 1 : 2; /* Llama-3.1 calls one at a time */
        const chat_message m[] = {{.role = "user", .content = "go"},
                                  {.role = "assistant", .content = "", .tool_calls = calls, .n_tool_calls = n_calls}};
        size_t len;
        char *p = chat_template_apply_tools(&t, m, 2, NULL, 0, &len);
        assert_non_null(p);
        const char *a = strstr(p, cases[i].open);
        assert_non_null(a);
        a += strlen(cases[i].open);
        const char *z = strstr(a, cases[i].close);
        assert_non_null(z);
        tool_answer got;
        assert_int_equal(tool_answer_parse(chat_template_tool_format(&t), a, (size_t)(z - a), 0, &got), 0);
        assert_int_equal(got.n_calls, n_calls);
        expect_call(&got, 0, "f", "{\"a\":[1,\"x;y\"],\"b\":{\"c\":null}}");
        if (n_calls == 2) expect_call(&got, 1, "g", "{}");
        tool_answer_free(&got);
        free(p);
    }
}

static void test_markers(void **state) {
    (void)state;
    char buf[256];
    chat_template_markers("{{ '<start_of_turn>' + role + '\\n' + content + '<end_of_turn>\\n' }}", buf, sizeof buf);
    assert_string_equal(buf, "\"<start_of_turn>\", \"<end_of_turn>\"");
    chat_template_markers("{{ messages }}", buf, sizeof buf);
    assert_string_equal(buf, "");
    /* cut at a whole marker when the buffer is short */
    chat_template_markers("<|user|> <|assistant|> <|system|>", buf, 24);
    assert_string_equal(buf, "\"<|user|>\"");
}

/* The arguments as the model spelt them, white space outside strings dropped: an integer past
 * 2^53 and a number's own spelling survive (a double would round them), escapes stay, a key spelt
 * with escapes falls back to cJSON's print; in each format, several calls each its own. */
static void test_arguments_as_spelt(void **state) {
    (void)state;
    static const char args[] = "{ \"id\" : 123456789012345678 ,\n\"x\": 1.50e+01, \"s\": \"a  b\\\"}\\u00e9\", "
                               "\"list\": [ 1 , {\"k\": [] } ] }";
    static const char want[] = "{\"id\":123456789012345678,\"x\":1.50e+01,\"s\":\"a  b\\\"}\\u00e9\","
                               "\"list\":[1,{\"k\":[]}]}";
    char text[512];
    snprintf(text, sizeof text, "<tool_call>\n{\"name\": \"f\", \"arguments\": %s}\n</tool_call>\n"
                                "<tool_call>\n{\"arguments\": {\"n\": 7}, \"name\": \"g\"}\n</tool_call>", args);
    tool_answer a = parse(TOOLS_HERMES, text, 0);
    assert_int_equal(a.n_calls, 2);
    expect_call(&a, 0, "f", want);
    expect_call(&a, 1, "g", "{\"n\":7}");
    tool_answer_free(&a);
    snprintf(text, sizeof text, "{\"name\": \"f\", \"parameters\": %s}; {\"name\": \"g\", \"parameters\": {\"t\": \";\"}}", args);
    a = parse(TOOLS_LLAMA3, text, 0);
    assert_int_equal(a.n_calls, 2);
    expect_call(&a, 0, "f", want);
    expect_call(&a, 1, "g", "{\"t\":\";\"}");
    tool_answer_free(&a);
    snprintf(text, sizeof text, "[TOOL_CALLS] [{\"name\": \"g\", \"arguments\": {}} , {\"name\": \"f\", \"arguments\": %s}]", args);
    a = parse(TOOLS_MISTRAL, text, 0);
    assert_int_equal(a.n_calls, 2);
    expect_call(&a, 0, "g", "{}");
    expect_call(&a, 1, "f", want);
    tool_answer_free(&a);
    /* "arguments" spelt with an escape: found by cJSON only, printed back */
    a = parse(TOOLS_HERMES, "<tool_call>{\"name\": \"f\", \"\\u0061rguments\": {\"x\": 2.5}}</tool_call>", 0);
    assert_int_equal(a.n_calls, 1);
    expect_call(&a, 0, "f", "{\"x\":2.5}");
    tool_answer_free(&a);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_hermes),
        cmocka_unit_test(test_llama3_and_mistral),
        cmocka_unit_test(test_arguments_as_spelt),
        cmocka_unit_test(test_releasable_random),
        cmocka_unit_test(test_prompts),
        cmocka_unit_test(test_prompt_call_round_trip),
        cmocka_unit_test(test_markers),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
