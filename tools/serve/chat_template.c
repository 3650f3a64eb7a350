/* Chat templates by family (see chat_template.h); the formats follow llama.cpp's llama-chat.cpp. */
#include "chat_template.h"

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

static void render_mistral(sbuf *b, chat_family f, const chat_message *m, int n) {
    const char *lead = f == CHAT_MISTRAL_V1 ? " " : "";
    const char *trail = f == CHAT_MISTRAL_V3_TEKKEN ? "" : " ";
    int inside_turn = 0;
    for (int i = 0; i < n; i++) {
        if (!inside_turn) {
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

char *chat_template_apply(const chat_template *t, const chat_message *m, int n, size_t *len) {
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
    case CHAT_MISTRAL_V3_TEKKEN: render_mistral(&b, t->family, m, n); break;
    case CHAT_MISTRAL_V7:
        for (int i = 0; i < n; i++) {
            if (is_role(&m[i], "system")) {
                put(&b, "[SYSTEM_PROMPT] ");
                put(&b, m[i].content);
                put(&b, "[/SYSTEM_PROMPT]");
            } else if (is_role(&m[i], "user")) {
                put(&b, "[INST] ");
                put(&b, m[i].content);
                put(&b, "[/INST]");
            } else {
                put(&b, " ");
                put(&b, m[i].content);
                put(&b, "</s>");
            }
        }
        break;
    default: b.failed = 1;
    }
    if (b.failed) {
        free(b.s);
        return NULL;
    }
    *len = b.len;
    return b.s;
}
