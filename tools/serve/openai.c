/* Parsing and checking the OpenAI-style request bodies (see openai.h). */
#include "openai.h"
#include "structured.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#define INVALID "invalid_request_error"

/* The length of the UTF-8 character at s (as the tokenizers check it: no overlong forms, no
 * surrogates, nothing above U+10FFFF), or 0 when s holds none. */
static int utf8_char(const unsigned char *s) {
    const int need = *s < 0x80 ? 0 : *s >= 0xC2 && *s <= 0xDF ? 1 : *s >= 0xE0 && *s <= 0xEF ? 2
                   : *s >= 0xF0 && *s <= 0xF4 ? 3 : -1;
    if (need < 0) return 0;
    unsigned cp = need ? *s & (0x3Fu >> need) : *s;
    for (int k = 1; k <= need; k++) {
        if ((s[k] & 0xC0) != 0x80) return 0;
        cp = cp << 6 | (s[k] & 0x3F);
    }
    static const unsigned least[] = {0, 0x80, 0x800, 0x10000};
    if (cp < least[need] || (cp >= 0xD800 && cp <= 0xDFFF) || cp > 0x10FFFF) return 0;
    return need + 1;
}

int api_fail(api_error *e, int status, const char *type, const char *code, const char *param,
             const char *fmt, ...) {
    e->status = status;
    e->type = type;
    e->code = code;
    snprintf(e->param, sizeof e->param, "%s", param ? param : "");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->message, sizeof e->message, fmt, ap);
    va_end(ap);
    /* a quoted text cut at its byte limit (%.64s), or the message at its size, may end inside a
     * character: the message goes back as JSON, which must be UTF-8, so such bytes are dropped */
    unsigned char *in = (unsigned char *)e->message, *out = in;
    while (*in) {
        const int n = utf8_char(in);
        if (!n) {
            in++;
            continue;
        }
        memmove(out, in, (size_t)n);
        out += n, in += n;
    }
    *out = '\0';
    return -1;
}

static const char *type_name(const cJSON *v) {
    if (cJSON_IsString(v)) return "a string";
    if (cJSON_IsNumber(v)) return "a number";
    if (cJSON_IsBool(v)) return "a boolean";
    if (cJSON_IsArray(v)) return "an array";
    if (cJSON_IsObject(v)) return "an object";
    return "null";
}

static int wrong_type(api_error *e, const char *name, const char *want, const cJSON *v) {
    return api_fail(e, 400, INVALID, "invalid_type", name, "'%s' must be %s, got %s", name, want,
                    type_name(v));
}

/* JSON null counts as absent, as the OpenAI API treats it. */
static const cJSON *field(const cJSON *obj, const char *name) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, name);
    return v && !cJSON_IsNull(v) ? v : NULL;
}

static int get_bool(const cJSON *obj, const char *name, int *out, api_error *e) {
    const cJSON *v = field(obj, name);
    if (!v) return 0;
    if (!cJSON_IsBool(v)) return wrong_type(e, name, "true or false", v);
    *out = cJSON_IsTrue(v);
    return 0;
}

static int in_range(double x, double lo, int lo_open, double hi, int hi_open) {
    return isfinite(x) && (lo_open ? x > lo : x >= lo) && (hi_open ? x < hi : x <= hi);
}

/* A sampling number in [lo, hi] (open ends where lo_open / hi_open), checked as the engine will
 * use it: a 32-bit float (top_p 1e-300 is 0 there, min_p 0.9999999999 is 1). */
static int get_number(const cJSON *obj, const char *name, double lo, int lo_open, double hi,
                      int hi_open, const char *range, double *out, api_error *e) {
    const cJSON *v = field(obj, name);
    if (!v) return 0;
    if (!cJSON_IsNumber(v)) return wrong_type(e, name, "a number", v);
    const double x = v->valuedouble;
    if (!in_range(x, lo, lo_open, hi, hi_open))
        return api_fail(e, 400, INVALID, "invalid_value", name, "'%s' must be %s, got %g", name,
                        range, x);
    const double f = (float)x;
    if (!in_range(f, lo, lo_open, hi, hi_open))
        return api_fail(e, 400, INVALID, "invalid_value", name,
                        "'%s' must be %s as a 32-bit float (the precision nopad samples with), "
                        "got %.12g, which is %g there", name, range, x, f);
    *out = f;
    return 0;
}

/* A whole number in [lo, hi]; a JSON number is a double, whole numbers exact up to 2^53. */
static int get_whole(const cJSON *obj, const char *name, double lo, double hi, double *out,
                     api_error *e) {
    const cJSON *v = field(obj, name);
    if (!v) return 0;
    if (!cJSON_IsNumber(v)) return wrong_type(e, name, "a whole number", v);
    const double x = v->valuedouble;
    if (!(x >= lo && x <= hi) || x != floor(x))
        return api_fail(e, 400, INVALID, "invalid_value", name,
                        "'%s' must be a whole number in [%.0f, %.0f], got %g", name, lo, hi, x);
    *out = x;
    return 0;
}

static int get_int32(const cJSON *obj, const char *name, double lo, int32_t *out, api_error *e) {
    double x = *out;
    if (get_whole(obj, name, lo, 2147483647.0, &x, e)) return -1;
    *out = (int32_t)x;
    return 0;
}

static int oom(api_error *e) {
    return api_fail(e, 500, "server_error", NULL, NULL, "out of memory");
}

/* ---- which fields a route knows --------------------------------------------------------------- */

/* Fields accepted only at their neutral value: set to anything else they would change the answer
 * in a way nopad does not implement. */
static int check_neutral(const cJSON *obj, api_error *e) {
    const cJSON *v;
    if ((v = field(obj, "best_of")) && !(cJSON_IsNumber(v) && v->valuedouble == 1))
        return api_fail(e, 400, INVALID, "unsupported_value", "best_of", "'best_of' must be 1");
    if ((v = field(obj, "suffix")) && !(cJSON_IsString(v) && !v->valuestring[0]))
        return api_fail(e, 400, INVALID, "unsupported_value", "suffix", "'suffix' is not supported");
    if ((v = field(obj, "functions")) && !(cJSON_IsArray(v) && !v->child))
        return api_fail(e, 400, INVALID, "unsupported_value", "functions",
                        "'functions' (the deprecated form of tools) is not supported: send 'tools'");
    if ((v = field(obj, "function_call")))
        return api_fail(e, 400, INVALID, "unsupported_value", "function_call",
                        "'function_call' (the deprecated form of tool_choice) is not supported: "
                        "send 'tool_choice'");
    if ((v = field(obj, "skip_special_tokens")) && !cJSON_IsTrue(v))
        return api_fail(e, 400, INVALID, "unsupported_value", "skip_special_tokens",
                        "'skip_special_tokens' must be true: special tokens are always left out "
                        "of the text");
    if ((v = field(obj, "add_generation_prompt")) && !cJSON_IsTrue(v))
        return api_fail(e, 400, INVALID, "unsupported_value", "add_generation_prompt",
                        "'add_generation_prompt' must be true");
    return 0;
}

/* Every field of obj must be in `known` (NULL-terminated). */
static int check_known(const cJSON *obj, const char *const *known, api_error *e) {
    for (const cJSON *f = obj->child; f; f = f->next) {
        int ok = 0;
        for (int i = 0; known[i] && !ok; i++) ok = strcmp(f->string, known[i]) == 0;
        if (!ok)
            return api_fail(e, 400, INVALID, "unknown_parameter", f->string,
                            "Unrecognized request argument supplied: %s", f->string);
    }
    return 0;
}

/* Fields that change nothing here, accepted everywhere. */
#define HARMLESS "model", "user", "metadata", "store", "service_tier", "parallel_tool_calls"

static const char *const completion_fields[] = {
    HARMLESS, "prompt", "max_tokens", "temperature", "top_p", "top_k", "min_p",
    "repetition_penalty", "seed", "stop", "stop_token_ids", "stream", "stream_options",
    "ignore_eos", "min_tokens", "n", "best_of", "logprobs", "echo", "suffix", "presence_penalty",
    "frequency_penalty", "logit_bias", "response_format", "guided_json", "guided_regex", "guided_choice",
    "skip_special_tokens", NULL};

static const char *const chat_fields[] = {
    HARMLESS, "messages", "max_tokens", "max_completion_tokens", "temperature", "top_p", "top_k",
    "min_p", "repetition_penalty", "seed", "stop", "stop_token_ids", "stream", "stream_options",
    "ignore_eos", "min_tokens", "n", "logprobs", "top_logprobs", "presence_penalty",
    "frequency_penalty", "logit_bias", "response_format", "guided_json", "guided_regex", "guided_choice",
    "tools", "tool_choice", "functions", "function_call", "skip_special_tokens", "add_generation_prompt", NULL};

/* /v1/responses, text only. "top_k", "min_p", "repetition_penalty" and "seed" are vLLM's
 * extensions, as on the other routes. */
static const char *const responses_fields[] = {
    HARMLESS, "input", "instructions", "max_output_tokens", "temperature", "top_p", "top_k",
    "min_p", "repetition_penalty", "seed", "stream", "text", "tools", "tool_choice", "truncation",
    "previous_response_id", "reasoning", "include", "background", "top_logprobs",
    "max_tool_calls", NULL};

/* ---- pieces ------------------------------------------------------------------------------------ */

/* An array of token ids (whole numbers in [0, 2^31)), or -1. */
static int get_ids(const cJSON *arr, const char *name, int32_t **ids, int32_t *n, api_error *e) {
    const int count = cJSON_GetArraySize(arr);
    *ids = malloc((size_t)(count ? count : 1) * sizeof **ids);
    if (!*ids) return oom(e);
    *n = 0;
    for (const cJSON *v = arr->child; v; v = v->next) {
        if (!cJSON_IsNumber(v) || !(v->valuedouble >= 0 && v->valuedouble <= 2147483647.0) ||
            v->valuedouble != floor(v->valuedouble))
            return api_fail(e, 400, INVALID, "invalid_type", name,
                            "'%s' must hold token ids (whole numbers >= 0)", name);
        (*ids)[(*n)++] = (int32_t)v->valuedouble;
    }
    return 0;
}

static int get_stop(const cJSON *obj, gen_request *r, api_error *e) {
    const cJSON *stop = field(obj, "stop");
    if (stop) {
        const int n = cJSON_IsString(stop) ? 1 : cJSON_IsArray(stop) ? cJSON_GetArraySize(stop) : -1;
        if (n < 0) return wrong_type(e, "stop", "a string or an array of strings", stop);
        if (n > 16)
            return api_fail(e, 400, INVALID, "invalid_value", "stop", "'stop' holds at most 16 strings");
        r->stops = calloc((size_t)(n ? n : 1), sizeof *r->stops);
        if (!r->stops) return oom(e);
        const cJSON *s = cJSON_IsString(stop) ? stop : stop->child;
        for (int i = 0; i < n; i++, s = s->next) {
            if (!cJSON_IsString(s) || !s->valuestring[0])
                return api_fail(e, 400, INVALID, "invalid_value", "stop",
                                "'stop' must hold non-empty strings");
            if (!(r->stops[i] = strdup(s->valuestring))) return oom(e);
            r->n_stops++;
        }
    }
    const cJSON *ids = field(obj, "stop_token_ids");
    if (ids) {
        if (!cJSON_IsArray(ids)) return wrong_type(e, "stop_token_ids", "an array of token ids", ids);
        if (get_ids(ids, "stop_token_ids", &r->stop_ids, &r->n_stop_ids, e)) return -1;
    }
    return 0;
}

/* A message's content `c` (named `name` in errors): a string, or an array of text parts {"type",
 * "text"} joined, each part's type one of part_types (NULL-terminated; the first is the one
 * errors name): chat's "text", /v1/responses' "input_text", "output_text" and "text". */
static int get_text_content(const cJSON *c, const char *name, const char *const *part_types, char **out,
                            api_error *e) {
    if (!c) return api_fail(e, 400, INVALID, "missing_field", name, "'%s' is required", name);
    if (cJSON_IsString(c)) {
        *out = strdup(c->valuestring);
        return *out ? 0 : oom(e);
    }
    if (!cJSON_IsArray(c)) return wrong_type(e, name, "a string or an array of text parts", c);
    size_t len = 0;
    for (const cJSON *p = c->child; p; p = p->next) {
        const cJSON *type = cJSON_IsObject(p) ? field(p, "type") : NULL;
        const cJSON *text = cJSON_IsObject(p) ? field(p, "text") : NULL;
        int known = 0;
        for (const char *const *t = part_types; *t && cJSON_IsString(type) && !known; t++)
            known = strcmp(type->valuestring, *t) == 0;
        if (!known || !cJSON_IsString(text))
            return api_fail(e, 400, INVALID, "unsupported_value", name,
                            "'%s' parts must be {\"type\": \"%s\", \"text\": ...} (nopad serve takes "
                            "text only)", name, part_types[0]);
        len += strlen(text->valuestring);
    }
    if (!(*out = malloc(len + 1))) return oom(e);
    len = 0;
    for (const cJSON *p = c->child; p; p = p->next) {
        const char *t = field(p, "text")->valuestring;
        memcpy(*out + len, t, strlen(t));
        len += strlen(t);
    }
    (*out)[len] = '\0';
    return 0;
}

static const char *const CHAT_PARTS[] = {"text", NULL};
static const char *const RESPONSES_PARTS[] = {"input_text", "output_text", "text", NULL};

/* An assistant message's tool_calls: [{"id", "type": "function", "function": {"name",
 * "arguments": JSON text}}], arguments checked to be JSON (they go into the prompt as such). */
static int get_tool_calls(const cJSON *arr, int index, chat_message *m, api_error *e) {
    char name[96];
    snprintf(name, sizeof name, "messages[%d].tool_calls", index);
    if (!cJSON_IsArray(arr)) return wrong_type(e, name, "an array of tool calls", arr);
    const int n = cJSON_GetArraySize(arr);
    if (!n) return 0;
    chat_tool_call *calls = calloc((size_t)n, sizeof *calls);
    if (!calls) return oom(e);
    m->tool_calls = calls;
    int k = 0;
    for (const cJSON *c = arr->child; c; c = c->next, k++) {
        snprintf(name, sizeof name, "messages[%d].tool_calls[%d]", index, k);
        if (!cJSON_IsObject(c)) return wrong_type(e, name, "an object", c);
        const cJSON *id = field(c, "id"), *type = field(c, "type"), *fn = field(c, "function");
        if (type && !(cJSON_IsString(type) && strcmp(type->valuestring, "function") == 0))
            return api_fail(e, 400, INVALID, "invalid_value", name, "'%s.type' must be \"function\"", name);
        if (id && !cJSON_IsString(id)) return wrong_type(e, name, "an object with a string 'id'", id);
        const cJSON *fname = cJSON_IsObject(fn) ? field(fn, "name") : NULL;
        const cJSON *args = cJSON_IsObject(fn) ? field(fn, "arguments") : NULL;
        if (!cJSON_IsString(fname) || !fname->valuestring[0] || (args && !cJSON_IsString(args)))
            return api_fail(e, 400, INVALID, "invalid_value", name,
                            "'%s' must be {\"id\", \"type\": \"function\", \"function\": {\"name\", "
                            "\"arguments\": a JSON string}}", name);
        cJSON *parsed = args ? cJSON_Parse(args->valuestring) : NULL;
        if (args && !parsed)
            return api_fail(e, 400, INVALID, "invalid_value", name,
                            "'%s.function.arguments' must be a JSON text", name);
        cJSON_Delete(parsed);
        calls[k].id = id ? strdup(id->valuestring) : NULL;
        calls[k].name = strdup(fname->valuestring);
        calls[k].arguments = strdup(args ? args->valuestring : "{}");
        m->n_tool_calls = k + 1;
        if ((id && !calls[k].id) || !calls[k].name || !calls[k].arguments) return oom(e);
    }
    return 0;
}

static int get_messages(const cJSON *obj, gen_request *r, api_error *e) {
    const cJSON *msgs = field(obj, "messages");
    if (!msgs) return api_fail(e, 400, INVALID, "missing_field", "messages", "'messages' is required");
    if (!cJSON_IsArray(msgs)) return wrong_type(e, "messages", "an array of messages", msgs);
    const int n = cJSON_GetArraySize(msgs);
    if (n == 0)
        return api_fail(e, 400, INVALID, "invalid_value", "messages", "'messages' must not be empty");
    r->messages = calloc((size_t)n, sizeof *r->messages);
    if (!r->messages) return oom(e);
    int i = 0;
    for (const cJSON *m = msgs->child; m; m = m->next, i++) {
        char name[64];
        snprintf(name, sizeof name, "messages[%d]", i);
        if (!cJSON_IsObject(m)) return wrong_type(e, name, "an object", m);
        snprintf(name, sizeof name, "messages[%d].role", i);
        const cJSON *role = field(m, "role");
        if (!role) return api_fail(e, 400, INVALID, "missing_field", name, "'%s' is required", name);
        if (!cJSON_IsString(role)) return wrong_type(e, name, "a string", role);
        const char *rn = role->valuestring;
        /* OpenAI's "developer" is the newer name of "system" */
        const char *canon = strcmp(rn, "system") == 0 || strcmp(rn, "developer") == 0 ? "system"
                            : strcmp(rn, "user") == 0                                ? "user"
                            : strcmp(rn, "assistant") == 0                           ? "assistant"
                            : strcmp(rn, "tool") == 0                                ? "tool"
                                                                                     : NULL;
        if (!canon)
            return api_fail(e, 400, INVALID, "invalid_value", name,
                            "'%s' must be \"system\", \"developer\", \"user\", \"assistant\" or "
                            "\"tool\", got \"%.64s\"",
                            name, rn);
        const int assistant = strcmp(canon, "assistant") == 0, tool = strcmp(canon, "tool") == 0;
        for (const cJSON *f = m->child; f; f = f->next)
            if (strcmp(f->string, "role") && strcmp(f->string, "content") && strcmp(f->string, "name") &&
                !(assistant && (!strcmp(f->string, "tool_calls") || !strcmp(f->string, "refusal"))) &&
                !(tool && !strcmp(f->string, "tool_call_id")))
                return api_fail(e, 400, INVALID, "unknown_parameter", f->string,
                                "Unrecognized field in messages[%d]: %s", i, f->string);
        chat_message *out = &r->messages[i];
        out->role = canon; /* a static string */
        r->n_messages = i + 1;
        const cJSON *calls = assistant ? field(m, "tool_calls") : NULL;
        if (calls && get_tool_calls(calls, i, out, e)) return -1;
        const cJSON *call_id = tool ? field(m, "tool_call_id") : NULL;
        if (call_id) {
            snprintf(name, sizeof name, "messages[%d].tool_call_id", i);
            if (!cJSON_IsString(call_id)) return wrong_type(e, name, "a string", call_id);
            if (!(out->tool_call_id = strdup(call_id->valuestring))) return oom(e);
        }
        char *content = NULL;
        snprintf(name, sizeof name, "messages[%d].content", i);
        if (out->n_tool_calls && !field(m, "content")) content = strdup(""); /* calls alone */
        else if (get_text_content(field(m, "content"), name, CHAT_PARTS, &content, e)) return -1;
        if (!content) return oom(e);
        out->content = content;
    }
    return 0;
}

static int get_tools(const cJSON *obj, int flat, gen_request *r, api_error *e);
static int get_tool_choice(const cJSON *obj, gen_request *r, api_error *e);

/* A /v1/responses input item of a call the model made ({"type": "function_call", "call_id",
 * "name", "arguments": JSON text}: consecutive ones join one assistant message) or of its result
 * ({"type": "function_call_output", "call_id", "output": text}: a tool message). */
static int get_call_item(const cJSON *m, int index, gen_request *r, api_error *e) {
    char name[64];
    snprintf(name, sizeof name, "input[%d]", index);
    const int output = !strcmp(field(m, "type")->valuestring, "function_call_output");
    static const char *const call_fields[] = {"type", "id", "call_id", "name", "arguments", "status", NULL};
    static const char *const output_fields[] = {"type", "id", "call_id", "output", "status", NULL};
    if (check_known(m, output ? output_fields : call_fields, e)) return -1;
    const cJSON *call_id = field(m, "call_id");
    if (!cJSON_IsString(call_id))
        return api_fail(e, 400, INVALID, "invalid_value", name, "'%s.call_id' must be a string", name);
    if (output) {
        const cJSON *out = field(m, "output");
        if (!cJSON_IsString(out))
            return api_fail(e, 400, INVALID, "invalid_value", name, "'%s.output' must be a string", name);
        char *content = strdup(out->valuestring), *id = strdup(call_id->valuestring);
        r->messages[r->n_messages++] = (chat_message){.role = "tool", .content = content, .tool_call_id = id};
        return content && id ? 0 : oom(e);
    }
    const cJSON *fname = field(m, "name"), *args = field(m, "arguments");
    if (!cJSON_IsString(fname) || !fname->valuestring[0] || !cJSON_IsString(args))
        return api_fail(e, 400, INVALID, "invalid_value", name,
                        "'%s' must be {\"type\": \"function_call\", \"call_id\", \"name\", "
                        "\"arguments\": a JSON string}", name);
    cJSON *parsed = cJSON_Parse(args->valuestring);
    if (!parsed)
        return api_fail(e, 400, INVALID, "invalid_value", name, "'%s.arguments' must be a JSON text", name);
    cJSON_Delete(parsed);
    chat_message *prev = r->n_messages ? &r->messages[r->n_messages - 1] : NULL;
    if (!prev || strcmp(prev->role, "assistant") || !prev->n_tool_calls || prev->content[0])
        prev = &r->messages[r->n_messages++], *prev = (chat_message){.role = "assistant", .content = strdup("")};
    if (!prev->content) return oom(e);
    chat_tool_call *calls = realloc((chat_tool_call *)prev->tool_calls, (size_t)(prev->n_tool_calls + 1) * sizeof *calls);
    if (!calls) return oom(e);
    prev->tool_calls = calls;
    calls[prev->n_tool_calls] = (chat_tool_call){strdup(call_id->valuestring), strdup(fname->valuestring),
                                                 strdup(args->valuestring)};
    prev->n_tool_calls++;
    const chat_tool_call *c = &calls[prev->n_tool_calls - 1];
    return c->id && c->name && c->arguments ? 0 : oom(e);
}

/* /v1/responses: instructions (a system message first) and input (a string: one user message;
 * or message items {"type": "message"?, "role", "content"}), and the fields that would ask for
 * more than text (tools, structured output, stored conversations, reasoning): 400s. */
static int get_responses_input(const cJSON *obj, gen_request *r, api_error *e) {
    const cJSON *v;
    if (get_tools(obj, 1, r, e) || get_tool_choice(obj, r, e) ||
        get_bool(obj, "parallel_tool_calls", &r->parallel_tool_calls, e))
        return -1;
    if ((v = field(obj, "text"))) {
        const cJSON *format = cJSON_IsObject(v) ? field(v, "format") : NULL;
        if (!cJSON_IsObject(v))
            return api_fail(e, 400, INVALID, "invalid_type", "text", "'text' must be an object");
        if (format && structured_text_format(format, &r->constraint, e)) return -1;
        for (const cJSON *f = v->child; f; f = f->next)
            if (strcmp(f->string, "format"))
                return api_fail(e, 400, INVALID, "unsupported_value", "text", "'text.%s' is not supported",
                                f->string);
    }
    if ((v = field(obj, "previous_response_id")))
        return api_fail(e, 400, INVALID, "unsupported_value", "previous_response_id",
                        "'previous_response_id' is not supported: nopad serve stores no responses "
                        "(send the conversation as input)");
    if ((v = field(obj, "reasoning")))
        return api_fail(e, 400, INVALID, "unsupported_value", "reasoning", "'reasoning' is not supported");
    if ((v = field(obj, "background")) && !cJSON_IsFalse(v))
        return api_fail(e, 400, INVALID, "unsupported_value", "background",
                        "'background' is not supported: the answer comes on the request's connection");
    if ((v = field(obj, "truncation")) && !(cJSON_IsString(v) && !strcmp(v->valuestring, "disabled")))
        return api_fail(e, 400, INVALID, "unsupported_value", "truncation",
                        "'truncation' must be \"disabled\": a conversation over the context is a 400");
    const cJSON *instructions = field(obj, "instructions"), *in = field(obj, "input");
    if (instructions && !cJSON_IsString(instructions)) return wrong_type(e, "instructions", "a string", instructions);
    if (!in) return api_fail(e, 400, INVALID, "missing_field", "input", "'input' is required");
    if (!cJSON_IsString(in) && !cJSON_IsArray(in))
        return wrong_type(e, "input", "a string or an array of messages", in);
    const int n_items = cJSON_IsString(in) ? 1 : cJSON_GetArraySize(in);
    if (n_items == 0 || (cJSON_IsString(in) && !in->valuestring[0]))
        return api_fail(e, 400, INVALID, "invalid_value", "input", "'input' must not be empty");
    r->messages = calloc((size_t)n_items + 1, sizeof *r->messages);
    if (!r->messages) return oom(e);
    if (instructions) {
        r->instructions = strdup(instructions->valuestring);
        char *content = strdup(instructions->valuestring);
        r->messages[r->n_messages++] = (chat_message){.role = "system", .content = content};
        if (!content || !r->instructions) return oom(e);
    }
    if (cJSON_IsString(in)) {
        char *content = strdup(in->valuestring);
        r->messages[r->n_messages++] = (chat_message){.role = "user", .content = content};
        return content ? 0 : oom(e);
    }
    int i = 0;
    for (const cJSON *m = in->child; m; m = m->next, i++) {
        char name[64];
        snprintf(name, sizeof name, "input[%d]", i);
        if (!cJSON_IsObject(m)) return wrong_type(e, name, "a message object", m);
        const cJSON *type = field(m, "type"), *role = field(m, "role");
        if (cJSON_IsString(type) && (!strcmp(type->valuestring, "function_call") ||
                                     !strcmp(type->valuestring, "function_call_output"))) {
            if (get_call_item(m, i, r, e)) return -1;
            continue;
        }
        if (type && !(cJSON_IsString(type) && !strcmp(type->valuestring, "message")))
            return api_fail(e, 400, INVALID, "unsupported_value", name,
                            "'%s' of type \"%.64s\" is not supported: nopad serve takes message "
                            "items of text", name, cJSON_IsString(type) ? type->valuestring : "?");
        for (const cJSON *f = m->child; f; f = f->next)
            if (strcmp(f->string, "type") && strcmp(f->string, "role") && strcmp(f->string, "content") &&
                strcmp(f->string, "id") && strcmp(f->string, "status"))
                return api_fail(e, 400, INVALID, "unknown_parameter", f->string,
                                "Unrecognized field in %s: %s", name, f->string);
        const char *rn = cJSON_IsString(role) ? role->valuestring : "";
        const char *canon = !strcmp(rn, "system") || !strcmp(rn, "developer") ? "system"
                            : !strcmp(rn, "user")                            ? "user"
                            : !strcmp(rn, "assistant")                       ? "assistant"
                                                                             : NULL;
        snprintf(name, sizeof name, "input[%d].role", i);
        if (!canon)
            return api_fail(e, 400, INVALID, "invalid_value", name,
                            "'%s' must be \"system\", \"developer\", \"user\" or \"assistant\"", name);
        snprintf(name, sizeof name, "input[%d].content", i);
        char *content = NULL;
        if (get_text_content(field(m, "content"), name, RESPONSES_PARTS, &content, e)) return -1;
        r->messages[r->n_messages++] = (chat_message){.role = canon, .content = content};
    }
    return 0;
}

/* tools: [{"type": "function", "function": {"name", "description", "parameters", "strict"}}], each
 * kept as its name and its definition's JSON text (what the prompt lists). */
static int get_tools(const cJSON *obj, int flat, gen_request *r, api_error *e) {
    const cJSON *tools = field(obj, "tools");
    if (!tools) return 0;
    if (!cJSON_IsArray(tools)) return wrong_type(e, "tools", "an array of tools", tools);
    const int n = cJSON_GetArraySize(tools);
    if (!n) return 0;
    if (n > 128)
        return api_fail(e, 400, INVALID, "invalid_value", "tools", "'tools' holds at most 128 tools");
    r->tools = calloc((size_t)n, sizeof *r->tools);
    if (!r->tools) return oom(e);
    int k = 0;
    for (const cJSON *t = tools->child; t; t = t->next, k++) {
        char name[64];
        snprintf(name, sizeof name, "tools[%d]", k);
        /* chat: {"type": "function", "function": {...}}; /v1/responses: the function's fields
         * beside "type" (flat) */
        const cJSON *type = cJSON_IsObject(t) ? field(t, "type") : NULL;
        const cJSON *fn = !cJSON_IsObject(t) ? NULL : flat ? t : field(t, "function");
        if (!cJSON_IsString(type) || strcmp(type->valuestring, "function") != 0 || !cJSON_IsObject(fn))
            return api_fail(e, 400, INVALID, "invalid_value", name,
                            flat ? "'%s' must be {\"type\": \"function\", \"name\", ...} (the only kind "
                                   "of tool nopad serve offers a model)"
                                 : "'%s' must be {\"type\": \"function\", \"function\": {...}} (the only "
                                   "kind of tool nopad serve offers a model)", name);
        static const char *const fn_fields[] = {"name", "description", "parameters", "strict", NULL};
        static const char *const flat_fields[] = {"type", "name", "description", "parameters", "strict", NULL};
        if (check_known(fn, flat ? flat_fields : fn_fields, e)) return -1;
        const cJSON *fname = field(fn, "name"), *desc = field(fn, "description");
        const cJSON *params = field(fn, "parameters"), *strict = field(fn, "strict");
        snprintf(name, sizeof name, flat ? "tools[%d].name" : "tools[%d].function.name", k);
        if (!cJSON_IsString(fname)) return wrong_type(e, name, "a string", fname);
        const size_t len = strlen(fname->valuestring);
        if (!len || len > 64 || strspn(fname->valuestring, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                                                           "0123456789_-") != len)
            return api_fail(e, 400, INVALID, "invalid_value", name,
                            "'%s' must be 1 to 64 letters, digits, '_' or '-'", name);
        for (int j = 0; j < k; j++)
            if (strcmp(r->tools[j].name, fname->valuestring) == 0)
                return api_fail(e, 400, INVALID, "invalid_value", name,
                                "'%s': two tools are named \"%s\"", name, fname->valuestring);
        snprintf(name, sizeof name, flat ? "tools[%d]" : "tools[%d].function", k);
        if (desc && !cJSON_IsString(desc)) return wrong_type(e, name, "an object with a string 'description'", desc);
        if (params && !cJSON_IsObject(params))
            return wrong_type(e, name, "an object whose 'parameters' is a JSON schema object", params);
        if (strict && !cJSON_IsBool(strict)) return wrong_type(e, name, "an object with a boolean 'strict'", strict);
        /* the definition as the prompt lists it: type, then the function's name, description and
         * parameters (strict is a promise about decoding, not something the model reads) */
        cJSON *def = cJSON_CreateObject(), *f = cJSON_CreateObject();
        if (!def || !f) {
            cJSON_Delete(def), cJSON_Delete(f);
            return oom(e);
        }
        cJSON_AddStringToObject(def, "type", "function");
        cJSON_AddItemToObject(def, "function", f);
        cJSON_AddStringToObject(f, "name", fname->valuestring);
        if (desc) cJSON_AddStringToObject(f, "description", desc->valuestring);
        if (params) cJSON_AddItemToObject(f, "parameters", cJSON_Duplicate(params, 1));
        r->tools[k].json = cJSON_PrintUnformatted(def);
        cJSON_Delete(def);
        r->tools[k].name = strdup(fname->valuestring);
        r->n_tools = k + 1;
        if (!r->tools[k].json || !r->tools[k].name) return oom(e);
    }
    return 0;
}

/* tool_choice: "auto" (the default with tools), "none" (the tools are not offered), "required"
 * (one or more calls, parallel_tool_calls allowing) or a named function (exactly one call of it:
 * chat's {"type": "function", "function": {"name"}}, /v1/responses' {"type": "function", "name"});
 * the last two are forced by a constraint built once the model's call format is known. */
static int get_tool_choice(const cJSON *obj, gen_request *r, api_error *e) {
    const cJSON *c = field(obj, "tool_choice");
    if (!c) return 0;
    if (cJSON_IsString(c) && strcmp(c->valuestring, "none") == 0) {
        r->tool_choice_none = 1;
        return 0;
    }
    if (cJSON_IsString(c) && strcmp(c->valuestring, "auto") == 0) {
        if (!r->n_tools && r->kind == GEN_CHAT)
            return api_fail(e, 400, INVALID, "invalid_value", "tool_choice",
                            "'tool_choice' \"auto\" is only allowed when 'tools' are given");
        return 0;
    }
    if (cJSON_IsString(c) && strcmp(c->valuestring, "required") == 0) {
        if (!r->n_tools)
            return api_fail(e, 400, INVALID, "invalid_value", "tool_choice",
                            "'tool_choice' \"required\" is only allowed when 'tools' are given");
        r->tool_choice_required = 1;
        return 0;
    }
    const cJSON *type = cJSON_IsObject(c) ? field(c, "type") : NULL;
    const cJSON *fn = r->kind == GEN_RESPONSES ? c : cJSON_IsObject(c) ? field(c, "function") : NULL;
    const cJSON *name = cJSON_IsObject(fn) ? field(fn, "name") : NULL;
    if (cJSON_IsString(type) && strcmp(type->valuestring, "function") == 0 && cJSON_IsString(name)) {
        for (int k = 0; k < r->n_tools; k++)
            if (strcmp(r->tools[k].name, name->valuestring) == 0) {
                r->tool_choice_required = 1;
                r->tool_choice_named = k;
                return 0;
            }
        return api_fail(e, 400, INVALID, "invalid_value", "tool_choice",
                        "'tool_choice' names the function \"%.64s\", which is not among 'tools'",
                        name->valuestring);
    }
    return api_fail(e, 400, INVALID, "invalid_value", "tool_choice",
                    r->kind == GEN_RESPONSES
                        ? "'tool_choice' must be \"none\", \"auto\", \"required\" or {\"type\": "
                          "\"function\", \"name\"}"
                        : "'tool_choice' must be \"none\", \"auto\", \"required\" or {\"type\": "
                          "\"function\", \"function\": {\"name\"}}");
}

static int get_prompt(const cJSON *obj, gen_request *r, api_error *e) {
    const cJSON *p = field(obj, "prompt");
    if (!p) return api_fail(e, 400, INVALID, "missing_field", "prompt", "'prompt' is required");
    if (cJSON_IsArray(p) && cJSON_GetArraySize(p) == 1 && cJSON_IsString(p->child))
        p = p->child; /* ["text"] is one prompt */
    if (cJSON_IsString(p)) {
        if (!p->valuestring[0])
            return api_fail(e, 400, INVALID, "invalid_value", "prompt", "'prompt' must not be empty");
        r->prompt = strdup(p->valuestring);
        return r->prompt ? 0 : oom(e);
    }
    if (cJSON_IsArray(p) && p->child && cJSON_IsNumber(p->child)) {
        if (get_ids(p, "prompt", &r->prompt_ids, &r->n_prompt_ids, e)) return -1;
        return 0;
    }
    if (cJSON_IsArray(p) && cJSON_GetArraySize(p) > 1)
        return api_fail(e, 400, INVALID, "unsupported_value", "prompt",
                        "'prompt' must be one prompt (a string or an array of token ids): send "
                        "one request per prompt");
    if (cJSON_IsArray(p) && !p->child)
        return api_fail(e, 400, INVALID, "invalid_value", "prompt", "'prompt' must not be empty");
    return wrong_type(e, "prompt", "a string or an array of token ids", p);
}

/* ---- the body ---------------------------------------------------------------------------------- */

/* cJSON ends its strings at the first NUL ("Par\u0000xyz" reads as "Par") and copies their bytes
 * as they come (invalid UTF-8 passes). So the body's own bytes are walked once cJSON has accepted
 * them: every string (names too) must hold no NUL, escaped or raw, and be UTF-8 as the tokenizers
 * require it, and only JSON white space may stand between the tokens (cJSON skips any byte up to
 * 0x20). A failure names the string's place as the other errors do (prompt, stop[0],
 * messages[1].content, input[3]) and its byte offset in the decoded string, the text the server
 * passes on. */
typedef struct body_walk {
    const unsigned char *s;
    size_t n, pos;
    char path[sizeof(((api_error *)0)->param)];
    api_error *e;
} body_walk;

static int is_space(unsigned char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

/* Skips white space; -1 (invalid JSON) at a control byte, which cJSON would have skipped too. */
static int skip_space(body_walk *w) {
    while (w->pos < w->n && is_space(w->s[w->pos])) w->pos++;
    if (w->pos < w->n && w->s[w->pos] < 0x20)
        return api_fail(w->e, 400, INVALID, "invalid_json", NULL,
                        "invalid JSON at byte %zu of the body: a control byte (0x%02x) outside a "
                        "string", w->pos, w->s[w->pos]);
    return 0;
}

/* The length of the valid UTF-8 sequence at s[0..n) (n >= 1, s[0] >= 0x80), or 0: the rules of
 * the tokenizers' check (no overlong forms, no surrogates, nothing above U+10FFFF). */
static size_t utf8_seq(const unsigned char *s, size_t n) {
    size_t need;
    unsigned char lo = 0x80, hi = 0xBF;
    if (s[0] >= 0xC2 && s[0] <= 0xDF) need = 1;
    else if (s[0] == 0xE0) need = 2, lo = 0xA0;
    else if (s[0] >= 0xE1 && s[0] <= 0xEC) need = 2;
    else if (s[0] == 0xED) need = 2, hi = 0x9F;
    else if (s[0] >= 0xEE && s[0] <= 0xEF) need = 2;
    else if (s[0] == 0xF0) need = 3, lo = 0x90;
    else if (s[0] >= 0xF1 && s[0] <= 0xF3) need = 3;
    else if (s[0] == 0xF4) need = 3, hi = 0x8F;
    else return 0;
    if (n <= need || s[1] < lo || s[1] > hi) return 0;
    for (size_t k = 2; k <= need; k++)
        if ((s[k] & 0xC0) != 0x80) return 0;
    return need + 1;
}

/* The code unit of \uXXXX's four digits, or -1 where one is not a hex digit (cJSON reads such an
 * escape as a NUL). */
static long hex4(const unsigned char *s) {
    long v = 0;
    for (int k = 0; k < 4; k++) {
        const int c = s[k] | 0x20;
        if (s[k] >= '0' && s[k] <= '9') v = v * 16 + (s[k] - '0');
        else if (c >= 'a' && c <= 'f') v = v * 16 + (c - 'a' + 10);
        else return -1;
    }
    return v;
}

/* The string at w->pos (its opening quote), up to its closing quote. cJSON accepted its escapes
 * (surrogates in pairs), but also takes a \u with a non-hex digit as a NUL: those, \u0000 and raw
 * bytes can be wrong. */
static int walk_string(body_walk *w, int is_name) {
    const char *what = is_name ? "the field name " : "";
    const unsigned char *s = w->s;
    size_t out = 0; /* bytes of the decoded string so far */
    for (w->pos++; w->pos < w->n && s[w->pos] != '"';) {
        const unsigned char c = s[w->pos];
        if (c == '\\' && w->pos + 1 < w->n && s[w->pos + 1] == 'u' && w->pos + 6 <= w->n) {
            const long cp = hex4(s + w->pos + 2);
            if (cp < 0)
                return api_fail(w->e, 400, INVALID, "invalid_value", w->path,
                                "%s'%s' holds an invalid \\u escape at byte %zu", what, w->path, out);
            if (cp == 0) break;
            const int pair = cp >= 0xD800 && cp <= 0xDBFF;
            out += cp < 0x80 ? 1 : cp < 0x800 ? 2 : pair ? 4 : 3;
            w->pos += pair ? 12 : 6;
        } else if (c == '\\') {
            out++;
            w->pos += 2;
        } else if (c == 0) {
            break;
        } else if (c < 0x80) {
            out++;
            w->pos++;
        } else {
            const size_t k = utf8_seq(s + w->pos, w->n - w->pos);
            if (!k)
                return api_fail(w->e, 400, INVALID, "invalid_value", w->path,
                                "%s'%s' is not valid UTF-8 at byte %zu", what, w->path, out);
            out += k;
            w->pos += k;
        }
    }
    if (w->pos < w->n && s[w->pos] != '"')
        return api_fail(w->e, 400, INVALID, "invalid_value", w->path,
                        "%s'%s' holds a NUL character at byte %zu: nopad takes text without NULs",
                        what, w->path, out);
    w->pos++;
    return 0;
}

/* Appends ".name" (the name's bytes from the body, up to its closing quote, as printable ASCII) or
 * "[index]" to w->path, cut to fit. */
static void path_push(body_walk *w, size_t key_at, long index) {
    size_t len = strlen(w->path);
    const size_t cap = sizeof w->path;
    if (key_at == (size_t)-1) {
        snprintf(w->path + len, cap - len, "[%ld]", index);
        return;
    }
    if (len && len + 1 < cap) w->path[len++] = '.';
    for (size_t i = key_at + 1; i < w->n && w->s[i] != '"' && len + 1 < cap; i++)
        w->path[len++] = w->s[i] >= 0x20 && w->s[i] < 0x7f ? (char)w->s[i] : '?';
    w->path[len] = '\0';
}

/* The value at w->pos. cJSON accepted the body, so its structure is sound; a surprise ends the
 * walk early rather than loop. */
static int walk_value(body_walk *w) {
    if (skip_space(w)) return -1;
    if (w->pos >= w->n) return 0;
    const unsigned char open = w->s[w->pos];
    if (open == '"') return walk_string(w, 0);
    if (open != '{' && open != '[') { /* a number, true, false or null */
        while (w->pos < w->n && w->s[w->pos] > 0x20 && !strchr(",]}", w->s[w->pos])) w->pos++;
        return 0;
    }
    const unsigned char close = open == '{' ? '}' : ']';
    const size_t path_len = strlen(w->path);
    w->pos++;
    for (long i = 0;; i++) {
        if (skip_space(w)) return -1;
        if (w->pos >= w->n || w->s[w->pos] == close) break;
        const size_t at = w->pos;
        if (open == '{') {
            if (w->s[at] != '"') return 0;
            path_push(w, at, 0);
            if (walk_string(w, 1) || skip_space(w)) return -1;
            if (w->pos >= w->n || w->s[w->pos] != ':') return 0;
            w->pos++;
        } else {
            path_push(w, (size_t)-1, i);
        }
        if (walk_value(w) || skip_space(w)) return -1;
        w->path[path_len] = '\0';
        if (w->pos < w->n && w->s[w->pos] == ',') w->pos++;
        else if (w->pos < w->n && w->s[w->pos] != close) return 0;
        if (w->pos == at) return 0;
    }
    w->pos++;
    return 0;
}

/* The body as a JSON object, or NULL with e filled (400). The body need not end with a NUL. */
static cJSON *parse_object(const char *body, size_t len, api_error *e) {
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(body, len, &end, 0);
    if (!root && !len) {
        api_fail(e, 400, INVALID, "invalid_json", NULL, "the body is empty: a JSON object is expected");
        return NULL;
    }
    if (!root) {
        api_fail(e, 400, INVALID, "invalid_json", NULL, "invalid JSON at byte %zu of the body",
                 end && end >= body ? (size_t)(end - body) : (size_t)0);
        return NULL;
    }
    if (!cJSON_IsObject(root)) {
        api_fail(e, 400, INVALID, "invalid_json", NULL, "the body must be a JSON object");
        cJSON_Delete(root);
        return NULL;
    }
    size_t at = (size_t)(end - body);
    while (at < len && is_space((unsigned char)body[at])) at++;
    if (at < len) {
        api_fail(e, 400, INVALID, "invalid_json", NULL,
                 "invalid JSON at byte %zu of the body: more follows the object (one JSON object "
                 "per request)", at);
        cJSON_Delete(root);
        return NULL;
    }
    body_walk w = {.s = (const unsigned char *)body, .n = len, .e = e};
    if (len >= 3 && memcmp(body, "\xEF\xBB\xBF", 3) == 0) w.pos = 3; /* cJSON skips a BOM too */
    if (walk_value(&w)) {
        cJSON_Delete(root);
        return NULL;
    }
    return root;
}

/* logit_bias: {"<token id>": bias, ...}, OpenAI's shape: each key a token id written in decimal
 * (at most once), each bias a number in [-100, 100]. The ids are checked against the vocabulary
 * where the model is known (generation.c). */
static int get_logit_bias(const cJSON *root, gen_request *r, api_error *e) {
    const cJSON *v = field(root, "logit_bias");
    if (!v) return 0;
    if (!cJSON_IsObject(v)) return wrong_type(e, "logit_bias", "an object of token ids to biases", v);
    const int count = cJSON_GetArraySize(v);
    if (count > NOPAD_MAX_LOGIT_BIAS)
        return api_fail(e, 400, INVALID, "invalid_value", "logit_bias",
                        "'logit_bias' holds %d entries; at most %d are allowed", count, NOPAD_MAX_LOGIT_BIAS);
    r->logit_bias = malloc((size_t)(count ? count : 1) * sizeof *r->logit_bias);
    if (!r->logit_bias) return oom(e);
    for (const cJSON *f = v->child; f; f = f->next) {
        const char *key = f->string;
        size_t digits = 0;
        while (key[digits] >= '0' && key[digits] <= '9') digits++;
        const double id = digits && !key[digits] && digits <= 10 ? strtod(key, NULL) : -1;
        if (!(id >= 0 && id <= 2147483647.0))
            return api_fail(e, 400, INVALID, "invalid_value", "logit_bias",
                            "'logit_bias' key '%.64s' is not a token id (a whole number >= 0 in "
                            "decimal, as a string)", key);
        for (int32_t k = 0; k < r->n_logit_bias; k++)
            if (r->logit_bias[k].id == (int32_t)id)
                return api_fail(e, 400, INVALID, "invalid_value", "logit_bias",
                                "'logit_bias' key '%.64s' names token %d, which an earlier key names too",
                                key, (int32_t)id);
        if (!cJSON_IsNumber(f))
            return api_fail(e, 400, INVALID, "invalid_type", "logit_bias",
                            "'logit_bias' key '%.64s': the bias must be a number in [-100, 100], got %s",
                            key, type_name(f));
        if (!in_range(f->valuedouble, -100, 0, 100, 0))
            return api_fail(e, 400, INVALID, "invalid_value", "logit_bias",
                            "'logit_bias' key '%.64s': the bias must be in [-100, 100], got %g",
                            key, f->valuedouble);
        r->logit_bias[r->n_logit_bias++] = (nopad_logit_bias){.id = (int32_t)id, .bias = (float)f->valuedouble};
    }
    return 0;
}

/* Chat: "logprobs" true, with "top_logprobs" alternatives (0..20, logprobs true required).
 * Completions: "logprobs" k, OpenAI's legacy API (0..5 there; up to 20 here, as vLLM): the chosen
 * tokens' log-probabilities and, k > 0, the k most likely alternatives. /v1/responses: "include"
 * ["message.output_text.logprobs"] reports them on the output_text part and its events, with
 * "top_logprobs" alternatives (0..20; more than 0 reports them without the include too). */
static int get_logprobs(const cJSON *root, gen_kind kind, gen_request *r, api_error *e) {
    double top = 0;
    if (kind == GEN_RESPONSES) {
        const cJSON *include = field(root, "include");
        if (include && !cJSON_IsArray(include))
            return wrong_type(e, "include", "an array of strings", include);
        for (const cJSON *v = include ? include->child : NULL; v; v = v->next) {
            if (!cJSON_IsString(v)) return wrong_type(e, "include", "an array of strings", v);
            if (strcmp(v->valuestring, "message.output_text.logprobs") != 0)
                return api_fail(e, 400, INVALID, "unsupported_value", "include",
                                "'include' value '%.64s' is not supported (nopad serve includes only "
                                "\"message.output_text.logprobs\")", v->valuestring);
            r->logprobs = 1;
        }
        if (get_whole(root, "top_logprobs", 0, NOPAD_MAX_TOP_LOGPROBS, &top, e)) return -1;
        r->top_logprobs = (int32_t)top;
        if (top > 0) r->logprobs = 1;
        return 0;
    }
    if (kind == GEN_CHAT) {
        if (get_bool(root, "logprobs", &r->logprobs, e) ||
            get_whole(root, "top_logprobs", 0, NOPAD_MAX_TOP_LOGPROBS, &top, e))
            return -1;
        if (top > 0 && !r->logprobs)
            return api_fail(e, 400, INVALID, "invalid_value", "top_logprobs",
                            "'top_logprobs' needs 'logprobs': true");
        r->top_logprobs = (int32_t)top;
        return 0;
    }
    const cJSON *lp = field(root, "logprobs");
    if (!lp) return 0;
    if (get_whole(root, "logprobs", 0, NOPAD_MAX_TOP_LOGPROBS, &top, e)) return -1;
    r->logprobs = 1;
    r->top_logprobs = (int32_t)top;
    return 0;
}

int openai_parse_generation(const char *body, size_t len, gen_kind kind, gen_request *r,
                            api_error *e) {
    *r = (gen_request){.kind = kind, .max_tokens = -1, .temperature = 1.0, .top_p = 1.0,
                       .repetition_penalty = 1.0, .parallel_tool_calls = 1, .tool_choice_named = -1,
                       .n = 1};
    cJSON *root = parse_object(body, len, e);
    int rc = -1;
    if (!root) goto done;
    if (check_known(root, kind == GEN_CHAT ? chat_fields : kind == GEN_RESPONSES ? responses_fields
                                                                                 : completion_fields,
                    e) ||
        check_neutral(root, e))
        goto done;
    const cJSON *model = field(root, "model");
    if (model && !cJSON_IsString(model)) {
        wrong_type(e, "model", "a string", model);
        goto done;
    }
    if (model && !(r->model = strdup(model->valuestring))) {
        oom(e);
        goto done;
    }
    if (kind == GEN_CHAT        ? get_messages(root, r, e) || get_tools(root, 0, r, e) ||
                                      get_tool_choice(root, r, e) ||
                                      get_bool(root, "parallel_tool_calls", &r->parallel_tool_calls, e)
        : kind == GEN_RESPONSES ? get_responses_input(root, r, e)
                                : get_prompt(root, r, e))
        goto done;
    if (get_bool(root, "stream", &r->stream, e)) goto done;
    const cJSON *so = field(root, "stream_options");
    if (so) {
        if (!cJSON_IsObject(so)) {
            wrong_type(e, "stream_options", "an object", so);
            goto done;
        }
        static const char *const so_fields[] = {"include_usage", "continuous_usage_stats", NULL};
        if (check_known(so, so_fields, e) || get_bool(so, "include_usage", &r->include_usage, e))
            goto done;
        const cJSON *cu = field(so, "continuous_usage_stats");
        if (cu && !cJSON_IsFalse(cu)) {
            api_fail(e, 400, INVALID, "unsupported_value", "stream_options.continuous_usage_stats",
                     "'continuous_usage_stats' is not supported");
            goto done;
        }
        if (!r->stream) {
            api_fail(e, 400, INVALID, "invalid_value", "stream_options",
                     "'stream_options' is only allowed with 'stream': true");
            goto done;
        }
    }
    int32_t max_tokens = -1, max_completion = -1;
    double seed = -1;
    if (get_int32(root, "n", 1, &r->n, e)) goto done;
    if (r->n > GEN_MAX_CHOICES) {
        api_fail(e, 400, INVALID, "invalid_value", "n", "'n' must be at most %d, got %d",
                 GEN_MAX_CHOICES, r->n);
        goto done;
    }
    if (get_int32(root, "max_tokens", 1, &max_tokens, e) ||
        (kind == GEN_CHAT && get_int32(root, "max_completion_tokens", 1, &max_completion, e)) ||
        (kind == GEN_RESPONSES && get_int32(root, "max_output_tokens", 1, &max_tokens, e)) ||
        get_int32(root, "min_tokens", 0, &r->min_tokens, e) ||
        get_int32(root, "top_k", -1, &r->top_k, e) ||
        get_number(root, "temperature", 0, 0, 100, 0, "in [0, 100]", &r->temperature, e) ||
        get_number(root, "top_p", 0, 1, 1, 0, "in (0, 1]", &r->top_p, e) ||
        get_number(root, "min_p", 0, 0, 1, 1, "in [0, 1)", &r->min_p, e) ||
        get_number(root, "repetition_penalty", 0, 1, 100, 0, "in (0, 100]", &r->repetition_penalty, e) ||
        get_whole(root, "seed", -9007199254740992.0, 9007199254740992.0, &seed, e) ||
        get_bool(root, "ignore_eos", &r->ignore_eos, e) || get_stop(root, r, e))
        goto done;
    if (r->top_k < 0) r->top_k = 0; /* vLLM's -1: all */
    r->max_tokens = max_completion > 0 ? max_completion : max_tokens;
    if (r->max_tokens > 0 && r->min_tokens > r->max_tokens) {
        api_fail(e, 400, INVALID, "invalid_value", "min_tokens",
                 "'min_tokens' (%d) must not exceed 'max_tokens' (%d)", r->min_tokens, r->max_tokens);
        goto done;
    }
    if (get_number(root, "presence_penalty", -2, 0, 2, 0, "in [-2, 2]", &r->presence_penalty, e) ||
        get_number(root, "frequency_penalty", -2, 0, 2, 0, "in [-2, 2]", &r->frequency_penalty, e) ||
        get_logit_bias(root, r, e) || get_logprobs(root, kind, r, e))
        goto done;
    if (kind == GEN_COMPLETION && get_bool(root, "echo", &r->echo, e)) goto done;
    if (r->echo && r->logprobs) {
        api_fail(e, 400, INVALID, "unsupported_value", "echo",
                 "'echo' with 'logprobs' would need the prompt tokens' log-probabilities, which "
                 "nopad does not compute: send one of them");
        goto done;
    }
    if (field(root, "seed")) {
        r->has_seed = 1;
        r->seed = (uint64_t)(int64_t)seed; /* a negative seed is a stream of its own too */
    }
    /* response_format / guided_*: the output follows a schema, a regex or choices */
    if (kind != GEN_RESPONSES && structured_constraint(root, &r->constraint, e)) goto done;
    rc = 0;
done:
    cJSON_Delete(root);
    if (rc) gen_request_free(r);
    return rc;
}

void gen_request_free(gen_request *r) {
    nopad_constraint_free(r->constraint);
    r->constraint = NULL;
    free(r->model);
    free(r->prompt);
    free(r->prompt_ids);
    for (int i = 0; i < r->n_messages; i++) {
        chat_message *m = &r->messages[i];
        free((char *)m->content);
        free((char *)m->tool_call_id);
        for (int k = 0; k < m->n_tool_calls; k++) {
            free((char *)m->tool_calls[k].id);
            free((char *)m->tool_calls[k].name);
            free((char *)m->tool_calls[k].arguments);
        }
        free((chat_tool_call *)m->tool_calls);
    }
    free(r->messages);
    for (int i = 0; i < r->n_tools; i++) {
        free((char *)r->tools[i].name);
        free((char *)r->tools[i].json);
    }
    free(r->tools);
    free(r->instructions);
    for (int32_t i = 0; i < r->n_stops; i++) free(r->stops[i]);
    free(r->stops);
    free(r->stop_ids);
    free(r->logit_bias);
    *r = (gen_request){0};
}

/* ---- embeddings ---------------------------------------------------------------------------- */

static const char *const embed_fields[] = {HARMLESS, "input", "encoding_format", "dimensions", NULL};
static const char *const tei_fields[] = {"inputs", "normalize", "truncate", "truncation_direction",
                                         "prompt_name", NULL};

int openai_parse_embeddings(const char *body, size_t len, int tei, embed_request *r, api_error *e) {
    *r = (embed_request){.tei = tei, .normalize = tei ? 1 : -1};
    const char *in_name = tei ? "inputs" : "input";
    cJSON *root = parse_object(body, len, e);
    int rc = -1;
    if (!root) goto done;
    if (check_known(root, tei ? tei_fields : embed_fields, e)) goto done;
    if (tei) {
        if (get_bool(root, "normalize", &r->normalize, e) || get_bool(root, "truncate", &r->truncate, e))
            goto done;
        const cJSON *dir = field(root, "truncation_direction");
        if (dir && !(cJSON_IsString(dir) && (strcmp(dir->valuestring, "right") == 0 ||
                                             strcmp(dir->valuestring, "Right") == 0))) {
            api_fail(e, 400, INVALID, "unsupported_value", "truncation_direction",
                     "'truncation_direction' must be \"right\" (nopad truncates on the right)");
            goto done;
        }
        if (field(root, "prompt_name")) {
            api_fail(e, 400, INVALID, "unsupported_value", "prompt_name", "'prompt_name' is not supported");
            goto done;
        }
    } else {
        const cJSON *model = field(root, "model");
        if (model && !cJSON_IsString(model)) {
            wrong_type(e, "model", "a string", model);
            goto done;
        }
        if (model && !(r->model = strdup(model->valuestring))) {
            oom(e);
            goto done;
        }
        const cJSON *fmt = field(root, "encoding_format");
        if (fmt) {
            if (!cJSON_IsString(fmt) || (strcmp(fmt->valuestring, "float") != 0 &&
                                         strcmp(fmt->valuestring, "base64") != 0)) {
                api_fail(e, 400, INVALID, "invalid_value", "encoding_format",
                         "'encoding_format' must be \"float\" or \"base64\"");
                goto done;
            }
            r->base64 = strcmp(fmt->valuestring, "base64") == 0;
        }
        if (get_int32(root, "dimensions", 1, &r->dimensions, e)) goto done;
    }
    const cJSON *in = field(root, in_name);
    if (!in) {
        api_fail(e, 400, INVALID, "missing_field", in_name, "'%s' is required", in_name);
        goto done;
    }
    /* a string, [strings], [ids] or [[ids]] */
    const int one = cJSON_IsString(in) || (cJSON_IsArray(in) && cJSON_IsNumber(in->child));
    if (!one && !cJSON_IsArray(in)) {
        wrong_type(e, in_name, "a string, an array of strings or token ids", in);
        goto done;
    }
    const int n = one ? 1 : cJSON_GetArraySize(in);
    if (n == 0) {
        api_fail(e, 400, INVALID, "invalid_value", in_name, "'%s' must not be empty", in_name);
        goto done;
    }
    if (n > EMBED_MAX_INPUTS) {
        api_fail(e, 413, INVALID, "too_many_inputs", in_name,
                 "'%s' holds %d inputs; at most %d in one request", in_name, n, EMBED_MAX_INPUTS);
        goto done;
    }
    const cJSON *first = one ? in : in->child;
    const int texts = cJSON_IsString(first);
    r->ids = calloc((size_t)n, sizeof *r->ids);
    r->n_ids = calloc((size_t)n, sizeof *r->n_ids);
    if (texts) r->texts = calloc((size_t)n, sizeof *r->texts);
    if (!r->ids || !r->n_ids || (texts && !r->texts)) {
        oom(e);
        goto done;
    }
    r->n_inputs = n;
    const cJSON *item = first;
    for (int i = 0; i < n; i++, item = item->next) {
        char name[64];
        snprintf(name, sizeof name, "%s[%d]", in_name, i);
        if (texts) {
            if (!cJSON_IsString(item)) {
                wrong_type(e, name, "a string (like the other inputs)", item);
                goto done;
            }
            if (!item->valuestring[0]) {
                api_fail(e, 400, INVALID, "invalid_value", name, "'%s' must not be empty", name);
                goto done;
            }
            if (!(r->texts[i] = strdup(item->valuestring))) {
                oom(e);
                goto done;
            }
        } else {
            const cJSON *arr = one ? in : item;
            if (!cJSON_IsArray(arr) || !arr->child) {
                api_fail(e, 400, INVALID, "invalid_type", name,
                         "'%s' must be a non-empty array of token ids (like the other inputs)", name);
                goto done;
            }
            if (get_ids(arr, name, &r->ids[i], &r->n_ids[i], e)) goto done;
        }
    }
    rc = 0;
done:
    cJSON_Delete(root);
    if (rc) embed_request_free(r);
    return rc;
}

void embed_request_free(embed_request *r) {
    for (int i = 0; i < r->n_inputs; i++) {
        if (r->texts) free(r->texts[i]);
        if (r->ids) free(r->ids[i]);
    }
    free(r->texts);
    free(r->ids);
    free(r->n_ids);
    free(r->model);
    *r = (embed_request){0};
}

/* ---- TEI's /predict and /rerank ---------------------------------------------------------------- */

static const char *const predict_fields[] = {"inputs", "raw_scores", "truncate", "truncation_direction", NULL};
static const char *const rerank_fields[] = {"query", "texts", "raw_scores", "return_text", "truncate",
                                            "truncation_direction", NULL};

/* A non-empty string field value, copied. */
static int copy_text(const cJSON *v, const char *name, char **out, api_error *e) {
    if (!cJSON_IsString(v)) return wrong_type(e, name, "a string", v);
    if (!v->valuestring[0]) return api_fail(e, 400, INVALID, "invalid_value", name, "'%s' must not be empty", name);
    if (!(*out = strdup(v->valuestring))) return oom(e);
    return 0;
}

int openai_parse_classify(const char *body, size_t len, int rerank, classify_request *r, api_error *e) {
    *r = (classify_request){.rerank = rerank};
    cJSON *root = parse_object(body, len, e);
    int rc = -1;
    if (!root) goto done;
    if (check_known(root, rerank ? rerank_fields : predict_fields, e)) goto done;
    if (get_bool(root, "raw_scores", &r->raw_scores, e) || get_bool(root, "truncate", &r->truncate, e) ||
        (rerank && get_bool(root, "return_text", &r->return_text, e)))
        goto done;
    const cJSON *dir = field(root, "truncation_direction");
    if (dir && !(cJSON_IsString(dir) && (strcmp(dir->valuestring, "right") == 0 ||
                                         strcmp(dir->valuestring, "Right") == 0))) {
        api_fail(e, 400, INVALID, "unsupported_value", "truncation_direction",
                 "'truncation_direction' must be \"right\" (nopad truncates on the right)");
        goto done;
    }
    const char *in_name = rerank ? "texts" : "inputs";
    const cJSON *in = field(root, in_name);
    if (!in) {
        api_fail(e, 400, INVALID, "missing_field", in_name, "'%s' is required", in_name);
        goto done;
    }
    const cJSON *query = rerank ? field(root, "query") : NULL;
    if (rerank && !query) {
        api_fail(e, 400, INVALID, "missing_field", "query", "'query' is required");
        goto done;
    }
    /* /predict: a string or [a, b] is one input; anything else a list of them */
    const int pair_alone = !rerank && cJSON_IsArray(in) && cJSON_GetArraySize(in) == 2 &&
                           cJSON_IsString(in->child) && cJSON_IsString(in->child->next);
    const int one = !rerank && (cJSON_IsString(in) || pair_alone);
    if (!one && !cJSON_IsArray(in)) {
        wrong_type(e, in_name, rerank ? "an array of strings" : "a string, [text, text] or an array of them", in);
        goto done;
    }
    const int n = one ? 1 : cJSON_GetArraySize(in);
    if (n == 0) {
        api_fail(e, 400, INVALID, "invalid_value", in_name, "'%s' must not be empty", in_name);
        goto done;
    }
    if (n > EMBED_MAX_INPUTS) {
        api_fail(e, 413, INVALID, "too_many_inputs", in_name, "'%s' holds %d inputs; at most %d in one request",
                 in_name, n, EMBED_MAX_INPUTS);
        goto done;
    }
    r->batch = !one;
    r->a = calloc((size_t)n, sizeof *r->a);
    r->b = calloc((size_t)n, sizeof *r->b);
    if (!r->a || !r->b) {
        oom(e);
        goto done;
    }
    r->n_inputs = n;
    const cJSON *item = one ? in : in->child;
    for (int i = 0; i < n; i++, item = item->next) {
        char name[64];
        snprintf(name, sizeof name, one ? "%s" : "%s[%d]", in_name, i);
        if (rerank) {
            if (copy_text(query, "query", &r->a[i], e) || copy_text(item, name, &r->b[i], e)) goto done;
        } else if (cJSON_IsString(item)) {
            if (copy_text(item, name, &r->a[i], e)) goto done;
        } else {
            const int k = cJSON_IsArray(item) ? cJSON_GetArraySize(item) : 0;
            if (k != 1 && k != 2) {
                api_fail(e, 400, INVALID, "invalid_type", name, "'%s' must be a text or an array of 1 or 2 texts",
                         name);
                goto done;
            }
            if (copy_text(item->child, name, &r->a[i], e) || (k == 2 && copy_text(item->child->next, name, &r->b[i], e)))
                goto done;
        }
    }
    rc = 0;
done:
    cJSON_Delete(root);
    if (rc) classify_request_free(r);
    return rc;
}

void classify_request_free(classify_request *r) {
    for (int i = 0; i < r->n_inputs; i++) {
        if (r->a) free(r->a[i]);
        if (r->b) free(r->b[i]);
    }
    free(r->a);
    free(r->b);
    *r = (classify_request){0};
}
