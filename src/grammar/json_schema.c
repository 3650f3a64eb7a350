/* A JSON schema to the grammar of the documents that validate against it.
 *
 * Documents come out in one canonical form: the schema's properties in the schema's order
 * (extra keys, where allowed, after them), enum/const values in compact form, at most one space
 * or newline between tokens, integers of at most 18 digits, numbers of at most 18+18 digits and a
 * 2-digit exponent. Every document the grammar accepts validates (the grammar is never wider than
 * the schema); some valid documents outside the canonical form are not accepted. Keywords the
 * compiler cannot enforce are refused by name and JSON path, never ignored; annotations (title,
 * description, default, examples, ...) are ignored. docs/grammar.md lists both. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "grammar/grammar_internal.h"
#include "io/json.h"
#include "util/error.h"

#define SCHEMA_MAX_DEPTH 64
#define INT_DIGITS_MAX 18
static const int64_t INT_BOUND = 999999999999999999LL; /* 10^18 - 1 */

typedef struct schema_ref {
    char *ref;
    int32_t rule;
} schema_ref;

typedef struct schema_compiler {
    gram_builder *b;
    const cJSON *root;
    schema_ref *refs;
    size_t n_refs, cap_refs;
    int depth;
} schema_compiler;

static int32_t compile(schema_compiler *c, const cJSON *s, const char *path);

static int32_t fail(schema_compiler *c, nopad_status st, const char *path, const char *what) {
    gb_fail(c->b, st, "%s: %s", path, what);
    return 0;
}

/* Keywords: what they constrain. ANNOTATION: ignored (no constraint); CONTAINER: holds
 * definitions ($defs), not a constraint at its own level. */
enum { KW_ANNOTATION, KW_CONTAINER, KW_ANY, KW_OBJECT, KW_ARRAY, KW_STRING, KW_NUMBER };
static const struct {
    const char *name;
    int family;
} KEYWORDS[] = {
    {"title", KW_ANNOTATION}, {"description", KW_ANNOTATION}, {"default", KW_ANNOTATION},
    {"examples", KW_ANNOTATION}, {"$schema", KW_ANNOTATION}, {"$comment", KW_ANNOTATION},
    {"$id", KW_ANNOTATION}, {"deprecated", KW_ANNOTATION}, {"readOnly", KW_ANNOTATION},
    {"writeOnly", KW_ANNOTATION}, {"discriminator", KW_ANNOTATION},
    {"$defs", KW_CONTAINER}, {"definitions", KW_CONTAINER},
    {"type", KW_ANY}, {"enum", KW_ANY}, {"const", KW_ANY}, {"anyOf", KW_ANY}, {"oneOf", KW_ANY},
    {"allOf", KW_ANY}, {"$ref", KW_ANY},
    {"properties", KW_OBJECT}, {"required", KW_OBJECT}, {"additionalProperties", KW_OBJECT},
    {"items", KW_ARRAY}, {"minItems", KW_ARRAY}, {"maxItems", KW_ARRAY},
    {"pattern", KW_STRING}, {"format", KW_STRING}, {"minLength", KW_STRING}, {"maxLength", KW_STRING},
    {"minimum", KW_NUMBER}, {"maximum", KW_NUMBER}, {"exclusiveMinimum", KW_NUMBER},
    {"exclusiveMaximum", KW_NUMBER},
};

static int keyword_family(const char *name) {
    for (size_t i = 0; i < sizeof(KEYWORDS) / sizeof(KEYWORDS[0]); i++)
        if (!strcmp(KEYWORDS[i].name, name)) return KEYWORDS[i].family;
    return -1;
}

static void sub_path(char *out, size_t cap, const char *path, const char *key) {
    snprintf(out, cap, "%s.%s", path, key);
}

/* ---- canonical JSON text (enum / const values and property names) ------------------------ */

typedef struct text_buf {
    char *p;
    size_t n, cap;
    int oom;
} text_buf;

static void tb_put(text_buf *t, const char *s, size_t n) {
    if (t->oom) return;
    if (t->n + n + 1 > t->cap) {
        size_t cap = t->cap ? t->cap * 2 : 64;
        while (cap < t->n + n + 1) cap *= 2;
        char *p = realloc(t->p, cap);
        if (!p) {
            t->oom = 1;
            return;
        }
        t->p = p;
        t->cap = cap;
    }
    memcpy(t->p + t->n, s, n);
    t->n += n;
    t->p[t->n] = 0;
}

/* A string as Python's json.dumps(ensure_ascii=False) spells it. */
static void tb_string(text_buf *t, const char *s) {
    tb_put(t, "\"", 1);
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        char esc[8];
        switch (*p) {
        case '"': tb_put(t, "\\\"", 2); break;
        case '\\': tb_put(t, "\\\\", 2); break;
        case '\n': tb_put(t, "\\n", 2); break;
        case '\r': tb_put(t, "\\r", 2); break;
        case '\t': tb_put(t, "\\t", 2); break;
        case '\b': tb_put(t, "\\b", 2); break;
        case '\f': tb_put(t, "\\f", 2); break;
        default:
            if (*p < 0x20) {
                snprintf(esc, sizeof(esc), "\\u%04x", *p);
                tb_put(t, esc, 6);
            } else {
                tb_put(t, (const char *)p, 1);
            }
        }
    }
    tb_put(t, "\"", 1);
}

/* A number as Python's repr: integers without a fraction, others in the shortest form that
 * reads back to the same double. */
static void tb_number(text_buf *t, double v) {
    char buf[40];
    if (v == floor(v) && fabs(v) < 1e15) {
        snprintf(buf, sizeof(buf), "%lld", (long long)v);
    } else {
        for (int prec = 15; prec <= 17; prec++) {
            snprintf(buf, sizeof(buf), "%.*g", prec, v);
            if (strtod(buf, NULL) == v) break;
        }
    }
    tb_put(t, buf, strlen(buf));
}

/* A scalar value's JSON text. */
static void tb_value(text_buf *t, const cJSON *v) {
    if (cJSON_IsString(v)) tb_string(t, v->valuestring);
    else if (cJSON_IsNumber(v)) tb_number(t, v->valuedouble);
    else if (cJSON_IsTrue(v)) tb_put(t, "true", 4);
    else if (cJSON_IsFalse(v)) tb_put(t, "false", 5);
    else if (cJSON_IsNull(v)) tb_put(t, "null", 4);
}

/* An enum / const value: its scalars as Python's json.dumps spells them, the same whitespace
 * between an array's or object's tokens as everywhere else. */
static int32_t value_literal(schema_compiler *c, const cJSON *v, const char *path) {
    gram_builder *b = c->b;
    if (cJSON_IsArray(v) || cJSON_IsObject(v)) {
        int is_obj = cJSON_IsObject(v);
        int32_t ws = gb_ws(b);
        int32_t rule = gb_rule_new(b);
        int32_t open = gb_byte(b, is_obj ? '{' : '['), close = gb_byte(b, is_obj ? '}' : ']');
        int32_t seq[2] = {open, ws};
        int32_t acc = gb_seq(b, seq, 2);
        for (const cJSON *x = v->child; x && b->status == NOPAD_OK; x = x->next) {
            int32_t parts[8];
            uint32_t n = 0;
            parts[n++] = acc;
            if (x != v->child) {
                parts[n++] = ws;
                parts[n++] = gb_byte(b, ',');
                parts[n++] = ws;
            }
            if (is_obj) {
                text_buf key = {0};
                tb_string(&key, x->string);
                if (key.oom) {
                    free(key.p);
                    return fail(c, NOPAD_ERR_OUT_OF_MEMORY, path, "out of memory");
                }
                parts[n++] = gb_literal(b, key.p, key.n);
                free(key.p);
                parts[n++] = ws;
                parts[n++] = gb_byte(b, ':');
                parts[n++] = ws;
            }
            parts[n++] = value_literal(c, x, path);
            acc = gb_seq(b, parts, n);
        }
        int32_t tail[] = {acc, ws, close};
        gb_rule_add(b, rule, tail, 3);
        return rule;
    }
    text_buf t = {0};
    tb_value(&t, v);
    if (t.oom) {
        free(t.p);
        return fail(c, NOPAD_ERR_OUT_OF_MEMORY, path, "out of memory");
    }
    int32_t lit = gb_literal(b, t.p ? t.p : "", t.n);
    free(t.p);
    return lit;
}

/* ---- $ref ------------------------------------------------------------------------------------- */

static const cJSON *resolve_pointer(schema_compiler *c, const char *ref) {
    const cJSON *at = c->root;
    const char *p = ref + 1; /* after '#' */
    while (*p == '/' && at) {
        p++;
        char token[256];
        size_t n = 0;
        while (*p && *p != '/' && n + 1 < sizeof(token)) {
            if (p[0] == '~' && p[1] == '0') { token[n++] = '~'; p += 2; }
            else if (p[0] == '~' && p[1] == '1') { token[n++] = '/'; p += 2; }
            else token[n++] = *p++;
        }
        token[n] = 0;
        if (cJSON_IsArray(at)) {
            char *end;
            long idx = strtol(token, &end, 10);
            at = (*end || n == 0) ? NULL : cJSON_GetArrayItem(at, (int)idx);
        } else {
            at = cJSON_IsObject(at) ? cJSON_GetObjectItemCaseSensitive(at, token) : NULL;
        }
    }
    return *p ? NULL : at;
}

static int32_t compile_ref(schema_compiler *c, const char *ref, const char *path) {
    if (ref[0] != '#') return fail(c, NOPAD_ERR_UNSUPPORTED, path, "$ref outside the schema (only \"#...\" references)");
    for (size_t i = 0; i < c->n_refs; i++)
        if (!strcmp(c->refs[i].ref, ref)) return c->refs[i].rule;
    const cJSON *target = resolve_pointer(c, ref);
    if (!target) {
        char msg[400];
        snprintf(msg, sizeof(msg), "$ref \"%.300s\" points at nothing", ref);
        return fail(c, NOPAD_ERR_INVALID_ARGUMENT, path, msg);
    }
    if (c->n_refs == c->cap_refs) {
        size_t cap = c->cap_refs ? c->cap_refs * 2 : 8;
        schema_ref *r = realloc(c->refs, cap * sizeof(*r));
        if (!r) return fail(c, NOPAD_ERR_OUT_OF_MEMORY, path, "out of memory");
        c->refs = r;
        c->cap_refs = cap;
    }
    /* the rule exists before its body: a recursive schema refers back to it */
    int32_t rule = gb_rule_new(c->b);
    char *copy = strdup(ref);
    if (!copy) return fail(c, NOPAD_ERR_OUT_OF_MEMORY, path, "out of memory");
    c->refs[c->n_refs++] = (schema_ref){copy, rule};
    char target_path[512];
    snprintf(target_path, sizeof(target_path), "schema%.400s", ref + 1);
    int32_t body = compile(c, target, target_path);
    gb_rule_add(c->b, rule, &body, 1);
    return rule;
}

/* ---- integers ----------------------------------------------------------------------------- */

/* Digit strings a..b of the same length (a <= b), no sign. */
static int32_t digits_between(schema_compiler *c, const char *a, const char *b, int len) {
    gram_builder *g = c->b;
    if (len == 0) return gb_empty(g);
    if (a[0] == b[0]) {
        int32_t seq[] = {gb_byte(g, (uint8_t)a[0]), digits_between(c, a + 1, b + 1, len - 1)};
        return gb_seq(g, seq, 2);
    }
    int low_all0 = 1, high_all9 = 1;
    for (int i = 1; i < len; i++) {
        low_all0 &= a[i] == '0';
        high_all9 &= b[i] == '9';
    }
    int32_t any_rest = gb_repeat(g, gb_range(g, '0', '9'), len - 1, len - 1);
    if (low_all0 && high_all9) {
        int32_t seq[] = {gb_range(g, (uint8_t)a[0], (uint8_t)b[0]), any_rest};
        return gb_seq(g, seq, 2);
    }
    char nines[INT_DIGITS_MAX + 1], zeros[INT_DIGITS_MAX + 1];
    memset(nines, '9', sizeof(nines));
    memset(zeros, '0', sizeof(zeros));
    int32_t alts[3];
    uint32_t n = 0;
    int32_t lo_seq[] = {gb_byte(g, (uint8_t)a[0]), digits_between(c, a + 1, nines, len - 1)};
    alts[n++] = gb_seq(g, lo_seq, 2);
    if (a[0] + 1 <= b[0] - 1) {
        int32_t mid[] = {gb_range(g, (uint8_t)(a[0] + 1), (uint8_t)(b[0] - 1)), any_rest};
        alts[n++] = gb_seq(g, mid, 2);
    }
    int32_t hi_seq[] = {gb_byte(g, (uint8_t)b[0]), digits_between(c, zeros, b + 1, len - 1)};
    alts[n++] = gb_seq(g, hi_seq, 2);
    return gb_choice(g, alts, n);
}

/* Decimal spellings (no leading zeros) of lo..hi, 0 <= lo <= hi <= 10^18 - 1. */
static int32_t nonneg_between(schema_compiler *c, int64_t lo, int64_t hi) {
    int32_t alts[INT_DIGITS_MAX];
    uint32_t n = 0;
    int64_t pow = 1; /* 10^(d-1) */
    for (int d = 1; d <= INT_DIGITS_MAX; d++, pow *= 10) {
        int64_t first = d == 1 ? 0 : pow, last = pow * 10 - 1;
        int64_t a = lo > first ? lo : first, b = hi < last ? hi : last;
        if (a > b) continue;
        char sa[24], sb[24];
        snprintf(sa, sizeof(sa), "%lld", (long long)a);
        snprintf(sb, sizeof(sb), "%lld", (long long)b);
        alts[n++] = digits_between(c, sa, sb, d);
        if (d == INT_DIGITS_MAX) break;
    }
    return gb_choice(c->b, alts, n);
}

/* A bound keyword as an integer bound: 1 when present (into *out), 0 when absent. */
static int int_bound(schema_compiler *c, const cJSON *s, const char *key, int lower, int exclusive,
                     int64_t *out, const char *path) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(s, key);
    if (!v) return 0;
    if (!cJSON_IsNumber(v)) {
        char msg[128];
        snprintf(msg, sizeof(msg), "\"%s\" must be a number (a boolean exclusive bound is draft 4's, not supported)", key);
        fail(c, NOPAD_ERR_UNSUPPORTED, path, msg);
        return 0;
    }
    double x = v->valuedouble;
    double b = lower ? (exclusive ? floor(x) + 1 : ceil(x)) : (exclusive ? ceil(x) - 1 : floor(x));
    if (b > (double)INT_BOUND) b = (double)INT_BOUND + 1;
    if (b < -(double)INT_BOUND) b = -(double)INT_BOUND - 1;
    *out = (int64_t)b;
    return 1;
}

static int32_t compile_integer(schema_compiler *c, const cJSON *s, const char *path) {
    int64_t lo = -INT_BOUND, hi = INT_BOUND, v;
    if (int_bound(c, s, "minimum", 1, 0, &v, path) && v > lo) lo = v;
    if (int_bound(c, s, "exclusiveMinimum", 1, 1, &v, path) && v > lo) lo = v;
    if (int_bound(c, s, "maximum", 0, 0, &v, path) && v < hi) hi = v;
    if (int_bound(c, s, "exclusiveMaximum", 0, 1, &v, path) && v < hi) hi = v;
    if (c->b->status != NOPAD_OK) return 0;
    if (lo > hi) return fail(c, NOPAD_ERR_INVALID_ARGUMENT, path, "no integer lies within the bounds (or within 18 digits)");
    int32_t alts[2];
    uint32_t n = 0;
    if (hi >= 0) alts[n++] = nonneg_between(c, lo > 0 ? lo : 0, hi);
    if (lo < 0) {
        int32_t seq[] = {gb_byte(c->b, '-'), nonneg_between(c, hi < 0 ? -hi : 1, -lo)};
        alts[n++] = gb_seq(c->b, seq, 2);
    }
    return gb_choice(c->b, alts, n);
}

/* ---- strings ---------------------------------------------------------------------------------- */

/* The formats as anchored patterns, each no wider than the check the jsonschema package runs
 * (date: a real calendar day of years 0001-9999; time: RFC 3339 with an offset). */
#define RX_YEAR "(?:[1-9][0-9]{3}|0[1-9][0-9]{2}|00[1-9][0-9]|000[1-9])"
#define RX_LEAP "(?:[0-9]{2}(?:0[48]|[2468][048]|[13579][26])|(?:0[48]|[2468][048]|[13579][26])00)"
#define RX_DATE "(?:" RX_YEAR "-(?:(?:0[13578]|1[02])-(?:0[1-9]|[12][0-9]|3[01])|(?:0[469]|11)-" \
                "(?:0[1-9]|[12][0-9]|30)|02-(?:0[1-9]|1[0-9]|2[0-8]))|" RX_LEAP "-02-29)"
#define RX_TIME "(?:[01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](?:\\.[0-9]{1,6})?(?:Z|[+-](?:[01][0-9]|2[0-3]):[0-5][0-9])"
static const struct {
    const char *name, *pattern;
} FORMATS[] = {
    {"date", "^" RX_DATE "$"},
    {"time", "^" RX_TIME "$"},
    {"date-time", "^" RX_DATE "T" RX_TIME "$"},
    {"uuid", "^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$"},
    {"email", "^[A-Za-z0-9._%+-]+@[A-Za-z0-9-]+(?:\\.[A-Za-z0-9-]+)+$"},
};

static int length_bound(schema_compiler *c, const cJSON *s, const char *key, int64_t *out, const char *path) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(s, key);
    if (!v) return 0;
    if (!cJSON_IsNumber(v) || v->valuedouble < 0 || v->valuedouble != floor(v->valuedouble)) {
        char msg[96];
        snprintf(msg, sizeof(msg), "\"%s\" must be a non-negative integer", key);
        fail(c, NOPAD_ERR_INVALID_ARGUMENT, path, msg);
        return 0;
    }
    /* past GRAMMAR_MAX_COUNT: refused by gb_repeat, not clamped (clamping a minimum would widen) */
    *out = v->valuedouble > 2e9 ? 2000000000 : (int64_t)v->valuedouble;
    return 1;
}

static int32_t compile_string(schema_compiler *c, const cJSON *s, const char *path) {
    gram_builder *b = c->b;
    const cJSON *pattern = cJSON_GetObjectItemCaseSensitive(s, "pattern");
    const cJSON *format = cJSON_GetObjectItemCaseSensitive(s, "format");
    int64_t min = 0, max = -1;
    int has_min = length_bound(c, s, "minLength", &min, path);
    int has_max = length_bound(c, s, "maxLength", &max, path);
    if (b->status != NOPAD_OK) return 0;
    if ((pattern || format) && (has_min || has_max))
        return fail(c, NOPAD_ERR_UNSUPPORTED, path, "minLength/maxLength together with pattern or format");
    if (pattern && format) return fail(c, NOPAD_ERR_UNSUPPORTED, path, "pattern together with format");
    int32_t q = gb_byte(b, '"');
    int32_t content;
    if (pattern) {
        if (!cJSON_IsString(pattern)) return fail(c, NOPAD_ERR_INVALID_ARGUMENT, path, "\"pattern\" must be a string");
        char where[600];
        sub_path(where, sizeof(where), path, "pattern");
        content = gb_regex(b, pattern->valuestring, strlen(pattern->valuestring), 1, where);
    } else if (format) {
        if (!cJSON_IsString(format)) return fail(c, NOPAD_ERR_INVALID_ARGUMENT, path, "\"format\" must be a string");
        size_t i = 0;
        while (i < sizeof(FORMATS) / sizeof(FORMATS[0]) && strcmp(FORMATS[i].name, format->valuestring)) i++;
        if (i == sizeof(FORMATS) / sizeof(FORMATS[0])) {
            char msg[200];
            snprintf(msg, sizeof(msg), "format \"%.100s\" is not supported (date, time, date-time, uuid, email)",
                     format->valuestring);
            return fail(c, NOPAD_ERR_UNSUPPORTED, path, msg);
        }
        content = gb_regex(b, FORMATS[i].pattern, strlen(FORMATS[i].pattern), 1, path);
    } else {
        if (has_max && max < min) return fail(c, NOPAD_ERR_INVALID_ARGUMENT, path, "maxLength < minLength");
        content = has_min || has_max ? gb_repeat(b, gb_json_unit(b), min, has_max ? max : -1)
                                     : gb_star(b, gb_json_unit(b));
    }
    int32_t seq[] = {q, content, q};
    return gb_seq(b, seq, 3);
}

/* ---- arrays ----------------------------------------------------------------------------------- */

static int32_t compile_array(schema_compiler *c, const cJSON *s, const char *path) {
    gram_builder *b = c->b;
    const cJSON *items = cJSON_GetObjectItemCaseSensitive(s, "items");
    int64_t min = 0, max = -1;
    int has_max;
    length_bound(c, s, "minItems", &min, path);
    has_max = length_bound(c, s, "maxItems", &max, path);
    if (b->status != NOPAD_OK) return 0;
    if (has_max && max < min) return fail(c, NOPAD_ERR_INVALID_ARGUMENT, path, "maxItems < minItems");
    if (items && cJSON_IsArray(items))
        return fail(c, NOPAD_ERR_UNSUPPORTED, path, "\"items\" as a list (tuple validation)");
    char sub[600];
    sub_path(sub, sizeof(sub), path, "items");
    int32_t item = items ? compile(c, items, sub) : gb_any_value(b);
    int32_t ws = gb_ws(b);
    int32_t open = gb_byte(b, '['), close = gb_byte(b, ']');
    if (has_max && max == 0) {
        int32_t seq[] = {open, ws, close};
        return gb_seq(b, seq, 3);
    }
    int32_t more[] = {ws, gb_byte(b, ','), ws, item};
    int32_t list[] = {item, gb_repeat(b, gb_seq(b, more, 4), min > 0 ? min - 1 : 0, has_max ? max - 1 : -1)};
    int32_t body = gb_seq(b, list, 2);
    if (min == 0) body = gb_opt(b, body);
    int32_t seq[] = {open, ws, body, ws, close};
    return gb_seq(b, seq, 5);
}

/* ---- objects ---------------------------------------------------------------------------------- */

/* A property name's JSON content: plain ASCII, so that the extra keys can be told apart from it
 * byte by byte. */
static int plain_ascii(const char *s) {
    for (; *s; s++)
        if ((unsigned char)*s < 0x20 || (unsigned char)*s >= 0x80 || *s == '"' || *s == '\\') return 0;
    return 1;
}

/* The rest of a key (after its opening quote, `depth` bytes in) that equals none of names[n],
 * all of which share their first `depth` bytes. Extra keys are spelt without escapes, so an
 * escape cannot spell a listed name in disguise. */
static int32_t key_not_in(schema_compiler *c, const char **names, size_t n, size_t depth, int32_t raw_unit) {
    gram_builder *b = c->b;
    int32_t q = gb_byte(b, '"');
    int32_t rule = gb_rule_new(b);
    int is_name = 0;
    uint32_t children[8] = {0};
    for (size_t i = 0; i < n; i++) {
        unsigned char ch = (unsigned char)names[i][depth];
        if (!ch) is_name = 1;
        else children[ch >> 5] |= 1u << (ch & 31);
    }
    if (!is_name) gb_rule_add(b, rule, &q, 1);
    /* a byte none of the names has here: any key from there on */
    uint32_t other[8] = {0};
    for (unsigned ch = 0x20; ch < 0x80; ch++)
        if (ch != '"' && ch != '\\' && !((children[ch >> 5] >> (ch & 31)) & 1)) other[ch >> 5] |= 1u << (ch & 31);
    int32_t rest[] = {gb_star(b, raw_unit), q};
    int32_t tail = gb_seq(b, rest, 2);
    int32_t away_ascii[] = {gb_set(b, other), tail};
    gb_rule_add(b, rule, away_ascii, 2);
    int32_t away_utf8[] = {gb_utf8_char(b), tail};
    gb_rule_add(b, rule, away_utf8, 2);
    for (unsigned ch = 0x20; ch < 0x80; ch++) {
        if (!((children[ch >> 5] >> (ch & 31)) & 1)) continue;
        const char *sub[256];
        size_t k = 0;
        for (size_t i = 0; i < n && k < 256; i++)
            if ((unsigned char)names[i][depth] == ch) sub[k++] = names[i];
        int32_t seq[] = {gb_byte(b, (uint8_t)ch), key_not_in(c, sub, k, depth + 1, raw_unit)};
        gb_rule_add(b, rule, seq, 2);
    }
    return rule;
}

static int32_t compile_object(schema_compiler *c, const cJSON *s, const char *path) {
    gram_builder *b = c->b;
    const cJSON *props = cJSON_GetObjectItemCaseSensitive(s, "properties");
    const cJSON *required = cJSON_GetObjectItemCaseSensitive(s, "required");
    const cJSON *additional = cJSON_GetObjectItemCaseSensitive(s, "additionalProperties");
    if (props && !cJSON_IsObject(props)) return fail(c, NOPAD_ERR_INVALID_ARGUMENT, path, "\"properties\" must be an object");
    if (required && !cJSON_IsArray(required)) return fail(c, NOPAD_ERR_INVALID_ARGUMENT, path, "\"required\" must be an array");
    size_t n = (size_t)(props ? cJSON_GetArraySize(props) : 0);
    if (n > 256) return fail(c, NOPAD_ERR_UNSUPPORTED, path, "more than 256 properties");
    const char *names[256];
    int32_t members[256];
    int is_required[256];
    int32_t ws = gb_ws(b), colon = gb_byte(b, ':'), comma = gb_byte(b, ',');
    size_t i = 0;
    for (const cJSON *p = props ? props->child : NULL; p; p = p->next, i++) {
        names[i] = p->string;
        is_required[i] = 0;
        char sub[600];
        snprintf(sub, sizeof(sub), "%s.properties.%s", path, p->string);
        text_buf key = {0};
        tb_string(&key, p->string);
        if (key.oom) {
            free(key.p);
            return fail(c, NOPAD_ERR_OUT_OF_MEMORY, path, "out of memory");
        }
        int32_t seq[] = {gb_literal(b, key.p, key.n), ws, colon, ws, compile(c, p, sub)};
        free(key.p);
        members[i] = gb_seq(b, seq, 5);
        if (b->status != NOPAD_OK) return 0;
    }
    for (const cJSON *r = required ? required->child : NULL; r; r = r->next) {
        if (!cJSON_IsString(r)) return fail(c, NOPAD_ERR_INVALID_ARGUMENT, path, "\"required\" must list strings");
        size_t k = 0;
        while (k < n && strcmp(names[k], r->valuestring)) k++;
        if (k == n) {
            char msg[300];
            snprintf(msg, sizeof(msg), "required property \"%.200s\" is not among \"properties\" (not supported)", r->valuestring);
            return fail(c, NOPAD_ERR_UNSUPPORTED, path, msg);
        }
        is_required[k] = 1;
    }
    /* extra keys: absent or true -> any value, false -> none, a schema -> values of it */
    int32_t extra = -1;
    if (!additional || cJSON_IsTrue(additional) || cJSON_IsObject(additional)) {
        for (size_t k = 0; k < n; k++)
            if (!plain_ascii(names[k]))
                return fail(c, NOPAD_ERR_UNSUPPORTED, path,
                            "a property name with non-ASCII, quote or backslash characters while "
                            "additionalProperties is not false");
        uint32_t raw[8] = {0};
        for (unsigned ch = 0x20; ch < 0x80; ch++)
            if (ch != '"' && ch != '\\') raw[ch >> 5] |= 1u << (ch & 31);
        int32_t raw_alts[] = {gb_set(b, raw), gb_utf8_char(b)};
        int32_t raw_unit = gb_choice(b, raw_alts, 2);
        char sub[600];
        sub_path(sub, sizeof(sub), path, "additionalProperties");
        int32_t value = cJSON_IsObject(additional) ? compile(c, additional, sub) : gb_any_value(b);
        int32_t seq[] = {gb_byte(b, '"'), key_not_in(c, names, n, 0, raw_unit), ws, colon, ws, value};
        extra = gb_seq(b, seq, 6);
    } else if (!cJSON_IsFalse(additional)) {
        return fail(c, NOPAD_ERR_INVALID_ARGUMENT, path, "\"additionalProperties\" must be a boolean or a schema");
    }
    /* rest: members i.. after at least one was written (each with its comma); first: members
     * i.. before any was written */
    int32_t rest, first;
    if (extra >= 0) {
        int32_t more[] = {ws, comma, ws, extra};
        rest = gb_star(b, gb_seq(b, more, 4));
        int32_t seq[] = {extra, rest};
        first = gb_opt(b, gb_seq(b, seq, 2));
    } else {
        rest = gb_empty(b);
        first = rest;
    }
    for (size_t k = n; k-- > 0;) {
        int32_t with_seq[] = {ws, comma, ws, members[k], rest};
        int32_t with = gb_seq(b, with_seq, 5);
        int32_t first_seq[] = {members[k], rest};
        int32_t starts = gb_seq(b, first_seq, 2);
        int32_t rest_alts[] = {with, rest}, first_alts[] = {starts, first};
        rest = is_required[k] ? with : gb_choice(b, rest_alts, 2);
        first = is_required[k] ? starts : gb_choice(b, first_alts, 2);
    }
    int32_t seq[] = {gb_byte(b, '{'), ws, first, ws, gb_byte(b, '}')};
    return gb_seq(b, seq, 5);
}

/* ---- the schema ------------------------------------------------------------------------------- */

static int32_t compile_type(schema_compiler *c, const cJSON *s, const char *type, const char *path) {
    gram_builder *b = c->b;
    if (!strcmp(type, "null")) return gb_literal(b, "null", 4);
    if (!strcmp(type, "boolean")) {
        int32_t alts[] = {gb_literal(b, "true", 4), gb_literal(b, "false", 5)};
        return gb_choice(b, alts, 2);
    }
    if (!strcmp(type, "integer")) return compile_integer(c, s, path);
    if (!strcmp(type, "number")) {
        for (size_t i = 0; i < sizeof(KEYWORDS) / sizeof(KEYWORDS[0]); i++)
            if (KEYWORDS[i].family == KW_NUMBER && cJSON_GetObjectItemCaseSensitive(s, KEYWORDS[i].name)) {
                char msg[160];
                snprintf(msg, sizeof(msg), "keyword \"%s\" on a number that may be fractional is not "
                         "supported (bounds are enforced on \"type\": \"integer\")", KEYWORDS[i].name);
                return fail(c, NOPAD_ERR_UNSUPPORTED, path, msg);
            }
        return gb_json_number(b);
    }
    if (!strcmp(type, "string")) return compile_string(c, s, path);
    if (!strcmp(type, "array")) return compile_array(c, s, path);
    if (!strcmp(type, "object")) return compile_object(c, s, path);
    char msg[200];
    snprintf(msg, sizeof(msg), "unknown type \"%.100s\"", type);
    return fail(c, NOPAD_ERR_INVALID_ARGUMENT, path, msg);
}

static int value_has_type(const cJSON *v, const char *type) {
    if (!strcmp(type, "null")) return cJSON_IsNull(v);
    if (!strcmp(type, "boolean")) return cJSON_IsBool(v);
    if (!strcmp(type, "integer")) return cJSON_IsNumber(v) && v->valuedouble == floor(v->valuedouble);
    if (!strcmp(type, "number")) return cJSON_IsNumber(v);
    if (!strcmp(type, "string")) return cJSON_IsString(v);
    if (!strcmp(type, "array")) return cJSON_IsArray(v);
    if (!strcmp(type, "object")) return cJSON_IsObject(v);
    return 0;
}

static int value_allowed_by_type(const cJSON *v, const cJSON *type) {
    if (!type) return 1;
    if (cJSON_IsString(type)) return value_has_type(v, type->valuestring);
    for (const cJSON *t = type->child; t; t = t->next)
        if (cJSON_IsString(t) && value_has_type(v, t->valuestring)) return 1;
    return 0;
}

static int32_t compile_inner(schema_compiler *c, const cJSON *s, const char *path) {
    gram_builder *b = c->b;
    if (cJSON_IsTrue(s)) return gb_any_value(b);
    if (cJSON_IsFalse(s)) return gb_rule_new(b); /* no alternatives: nothing validates */
    if (!cJSON_IsObject(s)) return fail(c, NOPAD_ERR_INVALID_ARGUMENT, path, "a schema must be an object or a boolean");
    /* which keywords constrain here, and of which types */
    int families = 0, constraining = 0;
    for (const cJSON *k = s->child; k; k = k->next) {
        int f = keyword_family(k->string);
        if (f < 0) {
            char msg[200];
            snprintf(msg, sizeof(msg), "keyword \"%.100s\" is not supported", k->string);
            return fail(c, NOPAD_ERR_UNSUPPORTED, path, msg);
        }
        if (f >= KW_ANY) constraining++;
        if (f > KW_ANY) families |= 1 << f;
    }
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(s, "type");
    const cJSON *ref = cJSON_GetObjectItemCaseSensitive(s, "$ref");
    const cJSON *enum_ = cJSON_GetObjectItemCaseSensitive(s, "enum");
    const cJSON *const_ = cJSON_GetObjectItemCaseSensitive(s, "const");
    const cJSON *any_of = cJSON_GetObjectItemCaseSensitive(s, "anyOf");
    const cJSON *one_of = cJSON_GetObjectItemCaseSensitive(s, "oneOf");
    const cJSON *all_of = cJSON_GetObjectItemCaseSensitive(s, "allOf");
    if (type && !cJSON_IsString(type) && !cJSON_IsArray(type))
        return fail(c, NOPAD_ERR_INVALID_ARGUMENT, path, "\"type\" must be a string or a list of strings");

    if (ref) {
        if (!cJSON_IsString(ref)) return fail(c, NOPAD_ERR_INVALID_ARGUMENT, path, "\"$ref\" must be a string");
        if (constraining > 1) return fail(c, NOPAD_ERR_UNSUPPORTED, path, "$ref beside other constraining keywords");
        return compile_ref(c, ref->valuestring, path);
    }
    if (enum_ || const_) {
        if (enum_ && const_) return fail(c, NOPAD_ERR_UNSUPPORTED, path, "enum together with const");
        if (constraining > 1 + (type != NULL))
            return fail(c, NOPAD_ERR_UNSUPPORTED, path, "enum/const beside keywords other than type");
        if (enum_ && !cJSON_IsArray(enum_)) return fail(c, NOPAD_ERR_INVALID_ARGUMENT, path, "\"enum\" must be an array");
        int32_t rule = gb_rule_new(b);
        if (const_) {
            if (value_allowed_by_type(const_, type)) {
                int32_t lit = value_literal(c, const_, path);
                gb_rule_add(b, rule, &lit, 1);
            }
            return rule;
        }
        for (const cJSON *v = enum_->child; v; v = v->next) {
            if (!value_allowed_by_type(v, type)) continue; /* the type rules it out */
            int32_t lit = value_literal(c, v, path);
            gb_rule_add(b, rule, &lit, 1);
        }
        return rule;
    }
    if (any_of || one_of || all_of) {
        if (constraining > 1)
            return fail(c, NOPAD_ERR_UNSUPPORTED, path, "anyOf/oneOf/allOf beside other constraining keywords");
        const cJSON *list = any_of ? any_of : one_of ? one_of : all_of;
        const char *name = any_of ? "anyOf" : one_of ? "oneOf" : "allOf";
        if (!cJSON_IsArray(list) || cJSON_GetArraySize(list) == 0) {
            char msg[100];
            snprintf(msg, sizeof(msg), "\"%s\" must be a non-empty array", name);
            return fail(c, NOPAD_ERR_INVALID_ARGUMENT, path, msg);
        }
        if (all_of && cJSON_GetArraySize(list) != 1)
            return fail(c, NOPAD_ERR_UNSUPPORTED, path, "allOf with more than one schema");
        /* oneOf as anyOf: exact when the branches cannot both match (Pydantic's unions) */
        int32_t rule = gb_rule_new(b);
        int i = 0;
        for (const cJSON *x = list->child; x; x = x->next, i++) {
            char sub[600];
            snprintf(sub, sizeof(sub), "%s.%s[%d]", path, name, i);
            int32_t alt = compile(c, x, sub);
            gb_rule_add(b, rule, &alt, 1);
        }
        return rule;
    }
    if (type) {
        if (cJSON_IsString(type)) return compile_type(c, s, type->valuestring, path);
        int32_t rule = gb_rule_new(b);
        for (const cJSON *t = type->child; t; t = t->next) {
            if (!cJSON_IsString(t)) return fail(c, NOPAD_ERR_INVALID_ARGUMENT, path, "\"type\" must list strings");
            int32_t alt = compile_type(c, s, t->valuestring, path);
            gb_rule_add(b, rule, &alt, 1);
        }
        return rule;
    }
    /* no type: the keywords say which type; none at all -> any value */
    if (families == 0) return gb_any_value(b);
    for (int f = KW_OBJECT; f <= KW_NUMBER; f++) {
        if (families != 1 << f) continue;
        static const char *const FAMILY_TYPE[] = {[KW_OBJECT] = "object", [KW_ARRAY] = "array",
                                                  [KW_STRING] = "string", [KW_NUMBER] = "integer"};
        if (f == KW_NUMBER)
            return fail(c, NOPAD_ERR_UNSUPPORTED, path, "numeric bounds without \"type\": \"integer\"");
        return compile_type(c, s, FAMILY_TYPE[f], path);
    }
    return fail(c, NOPAD_ERR_UNSUPPORTED, path, "keywords of several types without \"type\"");
}

static int32_t compile(schema_compiler *c, const cJSON *s, const char *path) {
    if (c->b->status != NOPAD_OK) return 0;
    if (++c->depth > SCHEMA_MAX_DEPTH) return fail(c, NOPAD_ERR_UNSUPPORTED, path, "schema nested deeper than 64");
    int32_t sym = compile_inner(c, s, path);
    c->depth--;
    return sym;
}

/* One schema's text into the builder: its start symbol (0 with the builder failed). Each schema
 * has its own compiler, so its $ref resolve within it; `path` names it in errors. */
static int32_t compile_schema_text(gram_builder *b, const char *schema, size_t len, const char *path) {
    cJSON *root = cJSON_ParseWithLength(schema, len);
    if (!root) {
        gb_fail(b, NOPAD_ERR_INVALID_ARGUMENT, "%s: not valid JSON", path);
        return 0;
    }
    schema_compiler c = {b, root, NULL, 0, 0, 0};
    int32_t top = compile(&c, root, path);
    for (size_t i = 0; i < c.n_refs; i++) free(c.refs[i].ref);
    free(c.refs);
    cJSON_Delete(root);
    return top;
}

nopad_status grammar_from_json_schema(const char *schema, size_t len, grammar **out) {
    *out = NULL;
    gram_builder b;
    gb_init(&b);
    int32_t top = compile_schema_text(&b, schema, len, "schema");
    return gb_finish(&b, top, out);
}

nopad_status grammar_from_json_sequence(const char *const *schemas, const size_t *lens, size_t n_schemas,
                                        const char *open, const char *separator, const char *close,
                                        int32_t min_count, int32_t max_count, grammar **out) {
    *out = NULL;
    if (n_schemas == 0)
        return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT, "json sequence: no schema; at least 1");
    if (min_count < 1 || (max_count >= 0 && max_count < min_count))
        return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT,
                               "json sequence: %d to %d values; at least 1, and max_count -1 or >= min_count",
                               min_count, max_count);
    gram_builder b;
    gb_init(&b);
    int32_t value = gb_rule_new(&b);
    for (size_t i = 0; i < n_schemas; i++) {
        char path[32];
        snprintf(path, sizeof path, "schemas[%zu]", i);
        int32_t alt = compile_schema_text(&b, schemas[i], lens[i], path);
        gb_rule_add(&b, value, &alt, 1);
    }
    /* open value (separator value){min-1, max-1} close */
    int32_t next[] = {gb_literal(&b, separator, strlen(separator)), value};
    int32_t more = max_count == 1 ? gb_empty(&b)
                                  : gb_repeat(&b, gb_seq(&b, next, 2), min_count - 1, max_count < 0 ? -1 : max_count - 1);
    int32_t whole[] = {gb_literal(&b, open, strlen(open)), value, more, gb_literal(&b, close, strlen(close))};
    return gb_finish(&b, gb_seq(&b, whole, 4), out);
}

nopad_status grammar_any_json_object(grammar **out) {
    return grammar_from_json_schema("{\"type\":\"object\"}", 17, out);
}
