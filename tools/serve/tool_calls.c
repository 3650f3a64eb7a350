/* Tool calls parsed from an answer's text (see tool_calls.h). */
#include "tool_calls.h"

#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

static const char hermes_open[] = "<tool_call>", hermes_close[] = "</tool_call>";
static const char mistral_marker[] = "[TOOL_CALLS]", python_tag[] = "<|python_tag|>";

static int is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

/* The first occurrence of the NUL-terminated needle in s[0..n), or NULL. */
static const char *find(const char *s, size_t n, const char *needle) {
    const size_t k = strlen(needle);
    for (size_t i = 0; i + k <= n; i++)
        if (memcmp(s + i, needle, k) == 0) return s + i;
    return NULL;
}

/* The length of the longest tail of s[0..n) that is a proper beginning of needle. */
static size_t partial_tail(const char *s, size_t n, const char *needle) {
    const size_t k = strlen(needle);
    for (size_t t = k - 1 < n ? k - 1 : n; t > 0; t--)
        if (memcmp(s + n - t, needle, t) == 0) return t;
    return 0;
}

size_t tool_text_releasable(chat_tool_format format, const char *text, size_t len) {
    size_t first = 0; /* the first byte that is not white space */
    while (first < len && is_space(text[first])) first++;
    if (format == TOOLS_LLAMA3)
        return first == len || text[first] == '{' || text[first] == '<' ? 0 : len;
    if (format == TOOLS_MISTRAL && (first == len || text[first] == '[')) return 0;
    const char *marker = format == TOOLS_HERMES ? hermes_open : mistral_marker;
    const char *at = find(text, len, marker);
    return at ? (size_t)(at - text) : len - partial_tail(text, len, marker);
}

/* ---- the text of parsed JSON -------------------------------------------------------------------
 * The arguments are returned as the model spelt them, white space outside strings removed: printed
 * back from cJSON, a number would pass through a double (an 18-digit integer rounded). These scan
 * text that cJSON has already parsed, so they need not check it. */

typedef struct span {
    const char *p;
    size_t n;
} span;

/* The end of the JSON value that starts at or after s[i] (white space first). */
static size_t skip_value(const char *s, size_t n, size_t i) {
    while (i < n && is_space(s[i])) i++;
    if (i < n && s[i] == '"') {
        for (i++; i < n && s[i] != '"'; i++)
            if (s[i] == '\\') i++;
        return i + 1 < n ? i + 1 : n;
    }
    if (i < n && (s[i] == '{' || s[i] == '[')) {
        for (int depth = 0; i < n; i++) {
            if (s[i] == '"') i = skip_value(s, n, i) - 1;
            else if (s[i] == '{' || s[i] == '[') depth++;
            else if ((s[i] == '}' || s[i] == ']') && --depth == 0) return i + 1;
        }
        return n;
    }
    while (i < n && !is_space(s[i]) && s[i] != ',' && s[i] != '}' && s[i] != ']') i++;
    return i;
}

/* The text of the value of obj's first member spelt "key" (quotes included), or {NULL, 0}. */
static span member_text(span obj, const char *key) {
    const char *s = obj.p;
    size_t i = 0;
    while (i < obj.n && s[i] != '{') i++;
    for (i++; i < obj.n;) {
        while (i < obj.n && (is_space(s[i]) || s[i] == ',')) i++;
        if (i >= obj.n || s[i] == '}') break;
        const size_t key_end = skip_value(s, obj.n, i);
        size_t v = key_end;
        while (v < obj.n && (is_space(s[v]) || s[v] == ':')) v++;
        const size_t end = skip_value(s, obj.n, v);
        if (key_end - i == strlen(key) && memcmp(s + i, key, key_end - i) == 0) return (span){s + v, end - v};
        i = end;
    }
    return (span){NULL, 0};
}

/* The items of an array's text into items[cap]: their count. */
static int array_items(span arr, span *items, int cap) {
    const char *s = arr.p;
    size_t i = 0;
    int k = 0;
    while (i < arr.n && s[i] != '[') i++;
    for (i++; i < arr.n && k < cap;) {
        while (i < arr.n && (is_space(s[i]) || s[i] == ',')) i++;
        if (i >= arr.n || s[i] == ']') break;
        const size_t end = skip_value(s, arr.n, i);
        items[k++] = (span){s + i, end - i};
        i = end;
    }
    return k;
}

/* The text without white space outside strings, or NULL when out of memory. */
static char *compact(span t) {
    char *out = malloc(t.n + 1);
    if (!out) return NULL;
    size_t k = 0;
    for (size_t i = 0; i < t.n; i++) {
        if (t.p[i] == '"') {
            const size_t end = skip_value(t.p, t.n, i);
            memcpy(out + k, t.p + i, end - i);
            k += end - i;
            i = end - 1;
        } else if (!is_space(t.p[i])) {
            out[k++] = t.p[i];
        }
    }
    out[k] = '\0';
    return out;
}

/* ---- one call --------------------------------------------------------------------------------- */

/* A call object {"name": string, <args_key>: object} (or the other key of "arguments" /
 * "parameters"; arguments given as a string holding an object are taken too), whose text is raw,
 * into *out. 0, 1 when it is not one, -1 when out of memory. */
static int call_from_json(const cJSON *obj, span raw, tool_call *out) {
    if (!cJSON_IsObject(obj)) return 1;
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(obj, "name");
    if (!cJSON_IsString(name) || !name->valuestring[0]) return 1;
    const cJSON *args = cJSON_GetObjectItemCaseSensitive(obj, "arguments");
    span args_text = member_text(raw, "\"arguments\"");
    if (!args) {
        args = cJSON_GetObjectItemCaseSensitive(obj, "parameters");
        args_text = member_text(raw, "\"parameters\"");
    }
    cJSON *parsed = NULL;
    if (cJSON_IsString(args)) {
        args_text = (span){args->valuestring, strlen(args->valuestring)};
        args = parsed = cJSON_Parse(args->valuestring);
    }
    int rc = 1;
    if (!args || cJSON_IsObject(args)) {
        out->name = strdup(name->valuestring);
        /* a key spelt with escapes is not found in the text: printed back then */
        out->arguments = !args ? strdup("{}") : args_text.p ? compact(args_text) : cJSON_PrintUnformatted(args);
        rc = out->name && out->arguments ? 0 : -1;
        if (rc) {
            free(out->name);
            free(out->arguments);
            *out = (tool_call){0};
        }
    }
    cJSON_Delete(parsed);
    return rc;
}

/* s[0..n) as one JSON value with only white space around it, or NULL. */
static cJSON *parse_whole(const char *s, size_t n) {
    const char *end = NULL;
    cJSON *v = cJSON_ParseWithLengthOpts(s, n, &end, 0);
    if (!v) return NULL;
    for (const char *p = end; p < s + n; p++)
        if (!is_space(*p)) {
            cJSON_Delete(v);
            return NULL;
        }
    return v;
}

/* ---- the answer ------------------------------------------------------------------------------- */

typedef struct builder {
    tool_answer *a;
    int max_calls, kept, failed;
    char *content;
    size_t content_len;
} builder;

static void add_content(builder *b, const char *s, size_t n) {
    if (b->failed || !n) return;
    char *c = realloc(b->content, b->content_len + n + 1);
    if (!c) {
        b->failed = 1;
        return;
    }
    memcpy(c + b->content_len, s, n);
    b->content_len += n;
    c[b->content_len] = '\0';
    b->content = c;
}

/* Takes *call (a parsed call): kept unless max_calls are kept already. */
static void add_call(builder *b, tool_call *call) {
    if (b->failed || (b->max_calls > 0 && b->kept >= b->max_calls)) {
        free(call->name);
        free(call->arguments);
        return;
    }
    tool_call *calls = realloc(b->a->calls, (size_t)(b->a->n_calls + 1) * sizeof *calls);
    if (!calls) {
        free(call->name);
        free(call->arguments);
        b->failed = 1;
        return;
    }
    calls[b->a->n_calls++] = *call;
    b->a->calls = calls;
    b->kept++;
}

/* The objects of a JSON array (or the one object) v as calls, raw[i] the text of item i (of v
 * when it is one object); 0 when every item is a call, 1 when one is not (nothing kept then), -1
 * when out of memory. */
static int calls_from_value(builder *b, const cJSON *v, const span *raw) {
    const int many = cJSON_IsArray(v);
    const int n = many ? cJSON_GetArraySize(v) : 1;
    if (n == 0) return 1;
    tool_call *calls = calloc((size_t)n, sizeof *calls);
    if (!calls) return -1;
    int rc = 0, got = 0;
    for (const cJSON *item = many ? v->child : v; item && got < n && !rc; item = item->next, got++)
        rc = call_from_json(item, raw[got], &calls[got]);
    if (rc) {
        for (int i = 0; i < got; i++) free(calls[i].name), free(calls[i].arguments);
    } else {
        for (int i = 0; i < n; i++) add_call(b, &calls[i]);
    }
    free(calls);
    return rc;
}

static void parse_hermes(builder *b, const char *text, size_t len) {
    size_t pos = 0;
    while (pos < len && !b->failed) {
        const char *open = find(text + pos, len - pos, hermes_open);
        const char *inner = open ? open + strlen(hermes_open) : NULL;
        const char *close = inner ? find(inner, (size_t)(text + len - inner), hermes_close) : NULL;
        if (!close) { /* no call, or one cut off: text */
            add_content(b, text + pos, len - pos);
            break;
        }
        add_content(b, text + pos, (size_t)(open - text) - pos);
        const size_t after = (size_t)(close - text) + strlen(hermes_close);
        cJSON *v = parse_whole(inner, (size_t)(close - inner));
        tool_call call = {0};
        const int rc = v ? call_from_json(v, (span){inner, (size_t)(close - inner)}, &call) : 1;
        cJSON_Delete(v);
        if (rc == 0) add_call(b, &call);
        else if (rc < 0) b->failed = 1;
        else add_content(b, open, after - (size_t)(open - text)); /* malformed: stays text */
        pos = after;
    }
}

/* Llama-3: after an optional <|python_tag|>, one or more call objects joined by ';'. */
static int parse_llama3(builder *b, const char *text, size_t len) {
    size_t pos = 0;
    while (pos < len && is_space(text[pos])) pos++;
    if (len - pos >= strlen(python_tag) && memcmp(text + pos, python_tag, strlen(python_tag)) == 0)
        pos += strlen(python_tag);
    cJSON *all = cJSON_CreateArray();
    span *raw = NULL; /* each call's text */
    int n = 0;
    if (!all) return -1;
    int rc = 0;
    while (pos < len && rc == 0) {
        const char *semi = memchr(text + pos, ';', len - pos);
        const size_t end = semi ? (size_t)(semi - text) : len;
        cJSON *v = parse_whole(text + pos, end - pos);
        /* a ';' inside a string of the arguments: try the longer piece */
        while (!v && semi && (semi = memchr(semi + 1, ';', (size_t)(text + len - semi - 1))))
            v = parse_whole(text + pos, (size_t)(semi - text) - pos);
        if (!v && !semi) v = parse_whole(text + pos, len - pos);
        if (!v || !cJSON_IsObject(v)) {
            cJSON_Delete(v);
            rc = 1;
            break;
        }
        span *grown = realloc(raw, (size_t)(n + 1) * sizeof *raw);
        if (!grown) {
            cJSON_Delete(v);
            rc = -1;
            break;
        }
        raw = grown;
        raw[n++] = (span){text + pos, (semi ? (size_t)(semi - text) : len) - pos};
        cJSON_AddItemToArray(all, v);
        pos = semi ? (size_t)(semi - text) + 1 : len;
        while (pos < len && is_space(text[pos])) pos++;
    }
    if (rc == 0) rc = calls_from_value(b, all, raw);
    cJSON_Delete(all);
    free(raw);
    return rc;
}

/* Mistral: text, then [TOOL_CALLS] and an array of call objects; or the bare array alone. */
static int parse_mistral(builder *b, const char *text, size_t len) {
    const char *marker = find(text, len, mistral_marker);
    const char *calls = marker ? marker + strlen(mistral_marker) : text;
    cJSON *v = parse_whole(calls, (size_t)(text + len - calls));
    if (!v || !cJSON_IsArray(v)) {
        cJSON_Delete(v);
        return 1;
    }
    const int n = cJSON_GetArraySize(v);
    span *raw = malloc((size_t)(n ? n : 1) * sizeof *raw);
    const int rc = !raw ? -1 : array_items((span){calls, (size_t)(text + len - calls)}, raw, n) == n
                                   ? calls_from_value(b, v, raw) : 1;
    free(raw);
    cJSON_Delete(v);
    if (rc == 0 && marker) add_content(b, text, (size_t)(marker - text));
    return rc;
}

int tool_answer_parse(chat_tool_format format, const char *text, size_t len, int max_calls,
                      tool_answer *out) {
    *out = (tool_answer){0};
    builder b = {.a = out, .max_calls = max_calls};
    if (format == TOOLS_HERMES) {
        parse_hermes(&b, text, len);
    } else {
        const int rc = format == TOOLS_LLAMA3 ? parse_llama3(&b, text, len) : parse_mistral(&b, text, len);
        if (rc < 0) b.failed = 1;
        else if (rc > 0) add_content(&b, text, len); /* no call: the answer is text */
    }
    if (b.failed) {
        free(b.content);
        tool_answer_free(out);
        return -1;
    }
    if (out->n_calls) { /* the text around calls, without the white space that joins them */
        size_t start = 0, end = b.content_len;
        while (start < end && is_space(b.content[start])) start++;
        while (end > start && is_space(b.content[end - 1])) end--;
        if (start == end) {
            free(b.content);
            b.content = NULL;
        } else {
            memmove(b.content, b.content + start, end - start);
            b.content[end - start] = '\0';
        }
    }
    out->content = b.content;
    return 0;
}

void tool_answer_free(tool_answer *a) {
    for (int i = 0; i < a->n_calls; i++) {
        free(a->calls[i].name);
        free(a->calls[i].arguments);
    }
    free(a->calls);
    free(a->content);
    *a = (tool_answer){0};
}
