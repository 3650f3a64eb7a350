/* Chat templates by family (see chat_template.h); the formats follow llama.cpp's llama-chat.cpp. */
#include "chat_template.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const family_names[CHAT_N_FAMILIES] = {
    [CHAT_CHATML] = "chatml",
    [CHAT_LLAMA3] = "llama3",
    [CHAT_LLAMA2] = "llama2",
    [CHAT_LLAMA2_SYS] = "llama2-sys",
    [CHAT_LLAMA2_SYS_BOS] = "llama2-sys-bos",
    [CHAT_LLAMA2_SYS_STRIP] = "llama2-sys-strip",
    [CHAT_MISTRAL_V1] = "mistral-v1",
    [CHAT_MISTRAL_V3] = "mistral-v3",
    [CHAT_MISTRAL_V3_TEKKEN] = "mistral-v3-tekken",
    [CHAT_MISTRAL_V7] = "mistral-v7",
};

const char *chat_family_name(chat_family family) {
    return family >= 0 && family < CHAT_N_FAMILIES ? family_names[family] : "?";
}

const char *chat_template_names(void) {
    return "chatml, llama3, llama2, llama2-sys, llama2-sys-bos, llama2-sys-strip, mistral-v1, "
           "mistral-v3, mistral-v3-tekken, mistral-v7";
}

int chat_template_by_name(const char *name, chat_template *out) {
    *out = (chat_template){0};
    for (int f = 0; f < CHAT_N_FAMILIES; f++)
        if (strcmp(name, family_names[f]) == 0) {
            out->family = (chat_family)f;
            return 0;
        }
    return -1;
}

void chat_template_free(chat_template *t) {
    free(t->default_system);
    t->default_system = NULL;
}

/* A ChatML template that writes a system turn of its own when messages[0] is not one (SmolLM2):
 * the literal text of that turn, between "<|im_start|>system\n" and "<|im_end|>". */
static char *chatml_default_system(const char *text) {
    if (!strstr(text, "messages[0]['role'] != 'system'") &&
        !strstr(text, "messages[0][\"role\"] != \"system\""))
        return NULL;
    static const char open[] = "<|im_start|>system\n";
    const char *s = strstr(text, open);
    if (!s) return NULL;
    s += sizeof open - 1;
    const char *e = strstr(s, "<|im_end|>");
    /* a literal, not an expression: no Jinja inside */
    if (!e || memchr(s, '{', (size_t)(e - s)) || memchr(s, '\'', (size_t)(e - s))) return NULL;
    char *out = malloc((size_t)(e - s) + 1);
    if (!out) return NULL;
    memcpy(out, s, (size_t)(e - s));
    out[e - s] = '\0';
    return out;
}

int chat_template_detect(const char *text, chat_template *out) {
    *out = (chat_template){0};
#define HAS(s) (strstr(text, s) != NULL)
    if (HAS("<|im_start|>")) {
        out->family = CHAT_CHATML;
        out->default_system = chatml_default_system(text);
    } else if (HAS("<|start_header_id|>") && HAS("<|end_header_id|>")) {
        out->family = CHAT_LLAMA3;
    } else if (HAS("[INST]")) {
        if (HAS("[SYSTEM_PROMPT]")) out->family = CHAT_MISTRAL_V7;
        else if (HAS("' [INST] ' + system_message") || HAS("[AVAILABLE_TOOLS]"))
            out->family = HAS(" [INST]")       ? CHAT_MISTRAL_V1
                          : HAS("\"[INST]\"") ? CHAT_MISTRAL_V3_TEKKEN
                                              : CHAT_MISTRAL_V3;
        else if (HAS("content.strip()")) out->family = CHAT_LLAMA2_SYS_STRIP;
        else if (HAS("bos_token + '[INST]")) out->family = CHAT_LLAMA2_SYS_BOS;
        else if (HAS("<<SYS>>")) out->family = CHAT_LLAMA2_SYS;
        else out->family = CHAT_LLAMA2;
    } else {
        return -1;
    }
#undef HAS
    return 0;
}

/* Turn markers of chat formats nopad has no writer for, and of the ones it has (a template can
 * name one without being recognised, e.g. "[INST]"-free Mistral variants). */
static const char *const known_markers[] = {
    "<|im_start|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>", "[INST]",
    "[/INST]", "<<SYS>>", "[SYSTEM_PROMPT]", "[AVAILABLE_TOOLS]", "<start_of_turn>",
    "<end_of_turn>", "<|user|>", "<|assistant|>", "<|system|>", "<|end|>", "<|endoftext|>",
    "<|START_OF_TURN_TOKEN|>", "<|USER_TOKEN|>", "<|CHATBOT_TOKEN|>", "<\xef\xbd\x9cUser\xef\xbd\x9c>",
    "<|User|>", "<|Assistant|>", "### Instruction", "### Response", "USER:", "ASSISTANT:",
    "GPT4 Correct User", "<|role_start|>", "<|turn>", "<|message|>", "<|channel|>", "<s>", "</s>"};

void chat_template_markers(const char *text, char *buf, size_t cap) {
    size_t len = 0;
    if (cap) buf[0] = '\0';
    for (size_t i = 0; i < sizeof known_markers / sizeof known_markers[0]; i++) {
        if (!strstr(text, known_markers[i])) continue;
        const int n = snprintf(buf + len, cap - len, "%s\"%s\"", len ? ", " : "", known_markers[i]);
        if (n < 0 || (size_t)n >= cap - len) { /* cut at the last whole marker */
            buf[len] = '\0';
            return;
        }
        len += (size_t)n;
    }
}

chat_tool_format chat_template_tool_format(const chat_template *t) {
    switch (t->family) {
    case CHAT_LLAMA3: return TOOLS_LLAMA3;
    case CHAT_MISTRAL_V1:
    case CHAT_MISTRAL_V3:
    case CHAT_MISTRAL_V3_TEKKEN:
    case CHAT_MISTRAL_V7: return TOOLS_MISTRAL;
    default: return TOOLS_HERMES;
    }
}

/* ---- rendering ---------------------------------------------------------------------------- */

typedef struct sbuf {
    char *s;
    size_t len, cap;
    int failed;
} sbuf;

static void put_n(sbuf *b, const char *s, size_t n) {
    if (b->failed) return;
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->len + n + 1) cap *= 2;
        char *p = realloc(b->s, cap);
        if (!p) {
            b->failed = 1;
            return;
        }
        b->s = p;
        b->cap = cap;
    }
    memcpy(b->s + b->len, s, n);
    b->len += n;
    b->s[b->len] = '\0';
}

static void put(sbuf *b, const char *s) { put_n(b, s, strlen(s)); }

static int is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'; }

/* s without leading and trailing white space (as llama.cpp's trim). */
static void put_trimmed(sbuf *b, const char *s) {
    size_t n = strlen(s);
    while (n && is_space(*s)) s++, n--;
    while (n && is_space(s[n - 1])) n--;
    put_n(b, s, n);
}

static int is_role(const chat_message *m, const char *role) { return strcmp(m->role, role) == 0; }

static void render_llama2(sbuf *b, chat_family f, const chat_message *m, int n) {
    const int system_ok = f != CHAT_LLAMA2, bos_inside = f == CHAT_LLAMA2_SYS_BOS,
              strip = f == CHAT_LLAMA2_SYS_STRIP;
    int inside_turn = 1; /* the first [INST] follows the tokenizer's BOS */
    put(b, "[INST] ");
    for (int i = 0; i < n; i++) {
        if (!inside_turn) {
            inside_turn = 1;
            put(b, bos_inside ? "<s>[INST] " : "[INST] ");
        }
        sbuf content = {0};
        if (strip) put_trimmed(&content, m[i].content);
        else put(&content, m[i].content);
        const char *c = content.s ? content.s : "";
        if (content.failed) b->failed = 1;
        if (is_role(&m[i], "system")) {
            if (system_ok) {
                put(b, "<<SYS>>\n");
                put(b, c);
                put(b, "\n<</SYS>>\n\n");
            } else {
                put(b, c);
                put(b, "\n");
            }
        } else if (is_role(&m[i], "user")) {
            put(b, c);
            put(b, " [/INST]");
        } else {
            put(b, c);
            put(b, "</s>");
            inside_turn = 0;
        }
        free(content.s);
    }
}

/* s as a JSON string, quotes included. */
static void put_json_string(sbuf *b, const char *s) {
    put(b, "\"");
    for (const unsigned char *c = (const unsigned char *)s; *c; c++) {
        char esc[8];
        if (*c == '"' || *c == '\\') {
            esc[0] = '\\', esc[1] = (char)*c, esc[2] = '\0';
        } else if (*c == '\n') {
            strcpy(esc, "\\n");
        } else if (*c == '\t') {
            strcpy(esc, "\\t");
        } else if (*c == '\r') {
            strcpy(esc, "\\r");
        } else if (*c < 0x20) {
            snprintf(esc, sizeof esc, "\\u%04x", *c);
        } else {
            esc[0] = (char)*c, esc[1] = '\0';
        }
        put(b, esc);
    }
    put(b, "\"");
}

/* Mistral's tools (after its v3 / v7 templates): the definitions in [AVAILABLE_TOOLS] before the
 * turn of the last user message, calls as [TOOL_CALLS] [{"name", "arguments", "id"}],
 * results as [TOOL_RESULTS] {"content", "call_id"}[/TOOL_RESULTS]. */
static void put_mistral_tools(sbuf *b, chat_family f, const chat_tool *tools, int n_tools) {
    put(b, f == CHAT_MISTRAL_V3_TEKKEN || f == CHAT_MISTRAL_V7 ? "[AVAILABLE_TOOLS][" : "[AVAILABLE_TOOLS] [");
    for (int k = 0; k < n_tools; k++) {
        if (k) put(b, ", ");
        put(b, tools[k].json);
    }
    put(b, "][/AVAILABLE_TOOLS]");
}

static void put_mistral_calls(sbuf *b, const chat_message *m) {
    put(b, "[TOOL_CALLS] [");
    for (int k = 0; k < m->n_tool_calls; k++) {
        const chat_tool_call *c = &m->tool_calls[k];
        put(b, k ? ", {\"name\": " : "{\"name\": ");
        put_json_string(b, c->name);
        put(b, ", \"arguments\": ");
        put(b, c->arguments);
        if (c->id) {
            put(b, ", \"id\": ");
            put_json_string(b, c->id);
        }
        put(b, "}");
    }
    put(b, "]</s>");
}

static void put_mistral_result(sbuf *b, const chat_message *m) {
    put(b, "[TOOL_RESULTS] {\"content\": ");
    put_json_string(b, m->content);
    if (m->tool_call_id) {
        put(b, ", \"call_id\": ");
        put_json_string(b, m->tool_call_id);
    }
    put(b, "}[/TOOL_RESULTS]");
}

/* The message that opens the [INST] turn holding the last user message (-1: none). */
static int last_user_turn(const chat_message *m, int n) {
    int i = n - 1;
    while (i >= 0 && !is_role(&m[i], "user")) i--;
    while (i > 0 && !is_role(&m[i - 1], "assistant") && !is_role(&m[i - 1], "tool")) i--;
    return i;
}

static void render_mistral(sbuf *b, chat_family f, const chat_message *m, int n,
                           const chat_tool *tools, int n_tools) {
    const char *lead = f == CHAT_MISTRAL_V1 ? " " : "";
    const char *trail = f == CHAT_MISTRAL_V3_TEKKEN ? "" : " ";
    const int tools_at = n_tools ? last_user_turn(m, n) : -1;
    int inside_turn = 0;
    for (int i = 0; i < n; i++) {
        if (is_role(&m[i], "tool")) {
            put_mistral_result(b, &m[i]);
            continue;
        }
        if (is_role(&m[i], "assistant") && m[i].n_tool_calls) {
            put_mistral_calls(b, &m[i]);
            inside_turn = 0;
            continue;
        }
        if (!inside_turn) {
            if (i == tools_at) put_mistral_tools(b, f, tools, n_tools);
            put(b, lead);
            put(b, "[INST]");
            put(b, trail);
            inside_turn = 1;
        }
        if (is_role(&m[i], "system")) {
            put(b, m[i].content);
            put(b, "\n\n");
        } else if (is_role(&m[i], "user")) {
            put(b, m[i].content);
            put(b, lead);
            put(b, "[/INST]");
        } else {
            put(b, trail);
            if (f == CHAT_MISTRAL_V3) put_trimmed(b, m[i].content);
            else put(b, m[i].content);
            put(b, "</s>");
            inside_turn = 0;
        }
    }
}

static void render_mistral_v7(sbuf *b, const chat_message *m, int n, const chat_tool *tools,
                              int n_tools) {
    const int tools_at = n_tools ? last_user_turn(m, n) : -1;
    for (int i = 0; i < n; i++) {
        if (i == tools_at) put_mistral_tools(b, CHAT_MISTRAL_V7, tools, n_tools);
        if (is_role(&m[i], "system")) {
            put(b, "[SYSTEM_PROMPT] ");
            put(b, m[i].content);
            put(b, "[/SYSTEM_PROMPT]");
        } else if (is_role(&m[i], "user")) {
            put(b, "[INST] ");
            put(b, m[i].content);
            put(b, "[/INST]");
        } else if (is_role(&m[i], "tool")) {
            put_mistral_result(b, &m[i]);
        } else if (m[i].n_tool_calls) {
            put_mistral_calls(b, &m[i]);
        } else {
            put(b, " ");
            put(b, m[i].content);
            put(b, "</s>");
        }
    }
}

/* ---- tools as plain turns (Hermes, Llama-3.1) ----------------------------------------------- */

/* Messages rewritten into the plain roles the renderers write: the texts they point to are
 * owned by `texts`. */
typedef struct plain_messages {
    chat_message *m;
    int n;
    char **texts;
    int n_texts;
    int failed;
} plain_messages;

static const char *keep_text(plain_messages *p, sbuf *b) {
    if (b->failed || !b->s) {
        free(b->s);
        p->failed = 1;
        return "";
    }
    p->texts[p->n_texts++] = b->s;
    return b->s;
}

static const char hermes_tools_intro[] =
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are "
    "provided with function signatures within <tools></tools> XML tags:\n<tools>";
static const char hermes_tools_outro[] =
    "\n</tools>\n\nFor each function call, return a json object with function name and arguments "
    "within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, "
    "\"arguments\": <args-json-object>}\n</tool_call>";

static const char llama3_tools_intro[] =
    "Given the following functions, please respond with a JSON for a function call with its "
    "proper arguments that best answers the given prompt.\n\nRespond in the format {\"name\": "
    "function name, \"parameters\": dictionary of argument name and its value}.Do not use "
    "variables.\n\n";

/* Hermes (Qwen2.5's template): the tools in the system turn, calls as <tool_call> JSON in the
 * assistant's turn, consecutive results as <tool_response> blocks in one user turn.
 * Llama-3.1 (its template, tools in the first user message): the tools before that message's
 * text, calls as {"name", "parameters"}, results as "ipython" turns. */
static int to_plain(const chat_template *t, const chat_message *m, int n, const chat_tool *tools,
                    int n_tools, plain_messages *p) {
    const int hermes = t->family != CHAT_LLAMA3;
    *p = (plain_messages){0};
    p->m = calloc((size_t)n + 1, sizeof *p->m);
    p->texts = calloc((size_t)n + 1, sizeof *p->texts);
    if (!p->m || !p->texts) return -1;
    int i = 0, first_user_done = 0;
    if (n_tools && hermes) { /* the system turn, the given one or the template's own */
        sbuf b = {0};
        const char *system = n && is_role(&m[0], "system") ? m[0].content : t->default_system;
        if (system) {
            put(&b, system);
            put(&b, "\n\n");
        }
        put(&b, hermes_tools_intro);
        for (int k = 0; k < n_tools; k++) {
            put(&b, "\n");
            put(&b, tools[k].json);
        }
        put(&b, hermes_tools_outro);
        p->m[p->n++] = (chat_message){.role = "system", .content = keep_text(p, &b)};
        if (n && is_role(&m[0], "system")) i = 1;
    }
    for (; i < n; i++) {
        sbuf b = {0};
        if (is_role(&m[i], "tool") && hermes) {
            for (; i < n && is_role(&m[i], "tool"); i++) {
                put(&b, b.len ? "\n<tool_response>\n" : "<tool_response>\n");
                put(&b, m[i].content);
                put(&b, "\n</tool_response>");
            }
            i--;
            p->m[p->n++] = (chat_message){.role = "user", .content = keep_text(p, &b)};
        } else if (is_role(&m[i], "tool")) {
            p->m[p->n++] = (chat_message){.role = "ipython", .content = m[i].content};
        } else if (is_role(&m[i], "assistant") && m[i].n_tool_calls) {
            put(&b, m[i].content);
            for (int k = 0; k < m[i].n_tool_calls; k++) {
                if (b.len) put(&b, "\n");
                put(&b, hermes ? "<tool_call>\n{\"name\": " : "{\"name\": ");
                put_json_string(&b, m[i].tool_calls[k].name);
                put(&b, hermes ? ", \"arguments\": " : ", \"parameters\": ");
                put(&b, m[i].tool_calls[k].arguments);
                put(&b, hermes ? "}\n</tool_call>" : "}");
            }
            p->m[p->n++] = (chat_message){.role = "assistant", .content = keep_text(p, &b)};
        } else if (n_tools && !hermes && is_role(&m[i], "user") && !first_user_done) {
            first_user_done = 1;
            put(&b, llama3_tools_intro);
            for (int k = 0; k < n_tools; k++) {
                put(&b, tools[k].json);
                put(&b, "\n\n");
            }
            put(&b, m[i].content);
            p->m[p->n++] = (chat_message){.role = "user", .content = keep_text(p, &b)};
        } else {
            p->m[p->n++] = m[i];
        }
    }
    return p->failed ? -1 : 0;
}

static void plain_free(plain_messages *p) {
    for (int i = 0; i < p->n_texts; i++) free(p->texts[i]);
    free(p->texts);
    free(p->m);
}

static int needs_plain(const chat_message *m, int n) {
    for (int i = 0; i < n; i++)
        if (is_role(&m[i], "tool") || m[i].n_tool_calls) return 1;
    return 0;
}

char *chat_template_apply(const chat_template *t, const chat_message *m, int n, size_t *len) {
    return chat_template_apply_tools(t, m, n, NULL, 0, len);
}

char *chat_template_apply_tools(const chat_template *t, const chat_message *m, int n,
                                const chat_tool *tools, int n_tools, size_t *len) {
    plain_messages plain = {0};
    const int mistral = chat_template_tool_format(t) == TOOLS_MISTRAL;
    if (!mistral && (n_tools || needs_plain(m, n))) {
        if (to_plain(t, m, n, tools, n_tools, &plain)) {
            plain_free(&plain);
            return NULL;
        }
        m = plain.m;
        n = plain.n;
    }
    sbuf b = {0};
    put(&b, ""); /* an empty prompt is still a string */
    switch (t->family) {
    case CHAT_CHATML:
        if (t->default_system && (n == 0 || !is_role(&m[0], "system"))) {
            put(&b, "<|im_start|>system\n");
            put(&b, t->default_system);
            put(&b, "<|im_end|>\n");
        }
        for (int i = 0; i < n; i++) {
            put(&b, "<|im_start|>");
            put(&b, m[i].role);
            put(&b, "\n");
            put(&b, m[i].content);
            put(&b, "<|im_end|>\n");
        }
        put(&b, "<|im_start|>assistant\n");
        break;
    case CHAT_LLAMA3:
        for (int i = 0; i < n; i++) {
            put(&b, "<|start_header_id|>");
            put(&b, m[i].role);
            put(&b, "<|end_header_id|>\n\n");
            put_trimmed(&b, m[i].content);
            put(&b, "<|eot_id|>");
        }
        put(&b, "<|start_header_id|>assistant<|end_header_id|>\n\n");
        break;
    case CHAT_LLAMA2:
    case CHAT_LLAMA2_SYS:
    case CHAT_LLAMA2_SYS_BOS:
    case CHAT_LLAMA2_SYS_STRIP: render_llama2(&b, t->family, m, n); break;
    case CHAT_MISTRAL_V1:
    case CHAT_MISTRAL_V3:
    case CHAT_MISTRAL_V3_TEKKEN: render_mistral(&b, t->family, m, n, tools, n_tools); break;
    case CHAT_MISTRAL_V7: render_mistral_v7(&b, m, n, tools, n_tools); break;
    default: b.failed = 1;
    }
    plain_free(&plain);
    if (b.failed) {
        free(b.s);
        return NULL;
    }
    *len = b.len;
    return b.s;
}
