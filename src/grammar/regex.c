/* A regex subset to grammar rules: literals, classes ([a-z], [^...], \d \w \s and their
 * negations, .), groups ((...), (?:...), (?P<name>...)), alternation, the quantifiers * + ? {m}
 * {m,} {m,n} (lazy forms accepted: same language), and ^ / $ at the pattern's two ends.
 *
 * Where Python's re (the jsonschema reference) is wider than what is compiled, the grammar is
 * the narrower: \d \w \s are their ASCII sets, and a class holding \d \w \s (or their negations)
 * never matches non-ASCII characters. Generated text then always matches the pattern, at the cost
 * of refusing some text Python would accept. Backreferences, lookaround, \b and non-ASCII class
 * members are refused with the pattern's position. */
#include <stdio.h>
#include <string.h>

#include "grammar/grammar_internal.h"

#define RX_MAX_DEPTH 64

typedef struct rx_class {
    uint32_t ascii[4]; /* bit c of word c / 32 for c < 128 */
    int non_ascii;     /* every non-ASCII character too */
} rx_class;

typedef struct rx {
    gram_builder *b;
    const uint8_t *p;
    size_t n, i;
    int json;
    const char *where;
    int depth;
} rx;

static int rx_failed(rx *r) { return r->b->status != NOPAD_OK; }

static int32_t rx_error(rx *r, const char *what) {
    gb_fail(r->b, NOPAD_ERR_UNSUPPORTED, "%s: regex %.*s: %s at offset %zu", r->where,
            (int)(r->n < 200 ? r->n : 200), (const char *)r->p, what, r->i);
    return 0;
}

static void cls_add(rx_class *c, unsigned lo, unsigned hi) {
    for (unsigned x = lo; x <= hi && x < 128; x++) c->ascii[x >> 5] |= 1u << (x & 31);
}

static int cls_has(const rx_class *c, unsigned x) { return (c->ascii[x >> 5] >> (x & 31)) & 1; }

/* \d \w \s (ASCII) into c, negated when upper case. Returns 0 when `e` is none of them. */
static int cls_shorthand(rx_class *c, uint8_t e) {
    rx_class s = {{0}, 0};
    switch (e | 0x20) {
    case 'd': cls_add(&s, '0', '9'); break;
    case 'w': cls_add(&s, '0', '9'); cls_add(&s, 'A', 'Z'); cls_add(&s, 'a', 'z'); cls_add(&s, '_', '_'); break;
    case 's': cls_add(&s, ' ', ' '); cls_add(&s, '\t', '\r'); break;
    default: return 0;
    }
    for (int w = 0; w < 4; w++) c->ascii[w] |= (e & 0x20) ? s.ascii[w] : ~s.ascii[w];
    return 1;
}

/* One character of a JSON string's content spelling the ASCII character x. */
static int32_t json_escape_of(gram_builder *b, unsigned x) {
    char buf[8];
    int len;
    switch (x) {
    case '"': len = snprintf(buf, sizeof(buf), "\\\""); break;
    case '\\': len = snprintf(buf, sizeof(buf), "\\\\"); break;
    case '\b': len = snprintf(buf, sizeof(buf), "\\b"); break;
    case '\f': len = snprintf(buf, sizeof(buf), "\\f"); break;
    case '\n': len = snprintf(buf, sizeof(buf), "\\n"); break;
    case '\r': len = snprintf(buf, sizeof(buf), "\\r"); break;
    case '\t': len = snprintf(buf, sizeof(buf), "\\t"); break;
    default: len = snprintf(buf, sizeof(buf), "\\u%04x", x); break;
    }
    return gb_literal(b, buf, (size_t)len);
}

static int32_t cls_symbol(rx *r, const rx_class *c) {
    gram_builder *b = r->b;
    int32_t alts[64];
    uint32_t n = 0;
    uint32_t raw[8] = {0};
    int any_raw = 0;
    for (unsigned x = 0; x < 128; x++) {
        if (!cls_has(c, x)) continue;
        if (r->json && (x < 0x20 || x == '"' || x == '\\')) {
            if (n < 60) alts[n++] = json_escape_of(b, x);
        } else {
            raw[x >> 5] |= 1u << (x & 31);
            any_raw = 1;
        }
    }
    if (any_raw) alts[n++] = gb_set(b, raw);
    if (c->non_ascii) alts[n++] = gb_utf8_char(b);
    if (n == 1) return alts[0];
    return gb_choice(b, alts, n);
}

static int hex_value(uint8_t c) {
    if (c >= '0' && c <= '9') return c - '0';
    if ((c | 0x20) >= 'a' && (c | 0x20) <= 'f') return (c | 0x20) - 'a' + 10;
    return -1;
}

/* An escape's character (after the backslash, at r->i): its code point, or -1 after an error. */
static long rx_escape_char(rx *r) {
    uint8_t e = r->p[r->i++];
    switch (e) {
    case 'n': return '\n';
    case 't': return '\t';
    case 'r': return '\r';
    case 'f': return '\f';
    case 'v': return '\v';
    case 'x':
    case 'u': {
        int digits = e == 'x' ? 2 : 4;
        long v = 0;
        for (int k = 0; k < digits; k++) {
            int h = r->i < r->n ? hex_value(r->p[r->i]) : -1;
            if (h < 0) return rx_error(r, "a malformed \\x / \\u escape"), -1;
            v = v * 16 + h;
            r->i++;
        }
        return v;
    }
    default:
        if ((e >= 'a' && e <= 'z') || (e >= 'A' && e <= 'Z') || (e >= '0' && e <= '9'))
            return rx_error(r, "an unsupported escape (backreference, \\b, \\A, ...)"), -1;
        if (e >= 0x80) return rx_error(r, "an escaped non-ASCII character"), -1;
        return e; /* escaped punctuation is itself */
    }
}

/* The UTF-8 bytes of code point v as a literal symbol. */
static int32_t codepoint_literal(rx *r, long v) {
    if (v < 128) {
        rx_class c = {{0}, 0};
        cls_add(&c, (unsigned)v, (unsigned)v);
        return cls_symbol(r, &c);
    }
    char buf[4];
    size_t len;
    if (v < 0x800) {
        buf[0] = (char)(0xC0 | (v >> 6));
        buf[1] = (char)(0x80 | (v & 0x3F));
        len = 2;
    } else if (v >= 0xD800 && v <= 0xDFFF) {
        return rx_error(r, "a surrogate code point");
    } else {
        buf[0] = (char)(0xE0 | (v >> 12));
        buf[1] = (char)(0x80 | ((v >> 6) & 0x3F));
        buf[2] = (char)(0x80 | (v & 0x3F));
        len = 3;
    }
    return gb_literal(r->b, buf, len);
}

static int32_t rx_class_atom(rx *r) {
    rx_class c = {{0}, 0};
    int negated = 0, shorthand = 0, first = 1;
    if (r->i < r->n && r->p[r->i] == '^') {
        negated = 1;
        r->i++;
    }
    for (;;) {
        if (r->i >= r->n) return rx_error(r, "an unclosed [");
        uint8_t ch = r->p[r->i];
        if (ch == ']' && !first) {
            r->i++;
            break;
        }
        first = 0;
        long lo;
        if (ch == '\\') {
            r->i++;
            if (r->i >= r->n) return rx_error(r, "a trailing backslash");
            if (cls_shorthand(&c, r->p[r->i])) {
                r->i++;
                shorthand = 1;
                continue;
            }
            lo = rx_escape_char(r);
            if (lo < 0) return 0;
        } else if (ch >= 0x80) {
            return rx_error(r, "a non-ASCII character class member");
        } else {
            if (ch == '[' && r->i + 1 < r->n && r->p[r->i + 1] == ':')
                return rx_error(r, "a POSIX class [:name:]");
            lo = ch;
            r->i++;
        }
        long hi = lo;
        if (r->i + 1 < r->n && r->p[r->i] == '-' && r->p[r->i + 1] != ']') {
            r->i++;
            uint8_t h = r->p[r->i];
            if (h == '\\') {
                r->i++;
                if (r->i >= r->n) return rx_error(r, "a trailing backslash");
                hi = rx_escape_char(r);
                if (hi < 0) return 0;
            } else if (h >= 0x80) {
                return rx_error(r, "a non-ASCII character class member");
            } else {
                hi = h;
                r->i++;
            }
            if (hi < lo) return rx_error(r, "a class range out of order");
        }
        if (hi >= 128) return rx_error(r, "a non-ASCII character class member");
        cls_add(&c, (unsigned)lo, (unsigned)hi);
    }
    if (negated) {
        for (int w = 0; w < 4; w++) c.ascii[w] = ~c.ascii[w];
        /* Python's [^\d] also excludes non-ASCII digits: take no non-ASCII character then */
        c.non_ascii = !shorthand;
    }
    return cls_symbol(r, &c);
}

static int32_t rx_alternation(rx *r);

static int32_t rx_atom(rx *r) {
    uint8_t ch = r->p[r->i];
    if (ch == '(') {
        r->i++;
        if (r->i < r->n && r->p[r->i] == '?') {
            if (r->i + 1 < r->n && r->p[r->i + 1] == ':') {
                r->i += 2;
            } else if (r->i + 2 < r->n && r->p[r->i + 1] == 'P' && r->p[r->i + 2] == '<') {
                while (r->i < r->n && r->p[r->i] != '>') r->i++;
                if (r->i >= r->n) return rx_error(r, "an unclosed group name");
                r->i++;
            } else {
                return rx_error(r, "a lookaround, flag or other (?...) group");
            }
        }
        if (++r->depth > RX_MAX_DEPTH) return rx_error(r, "groups nested too deep");
        int32_t inner = rx_alternation(r);
        r->depth--;
        if (rx_failed(r)) return 0;
        if (r->i >= r->n || r->p[r->i] != ')') return rx_error(r, "an unclosed (");
        r->i++;
        return inner;
    }
    if (ch == '[') {
        r->i++;
        return rx_class_atom(r);
    }
    if (ch == '.') {
        r->i++;
        rx_class c = {{0}, 1};
        cls_add(&c, 0, 127);
        c.ascii['\n' >> 5] &= ~(1u << ('\n' & 31));
        return cls_symbol(r, &c);
    }
    if (ch == '^' || ch == '$') return rx_error(r, "an anchor inside the pattern (only ^ first and $ last)");
    if (ch == '\\') {
        r->i++;
        if (r->i >= r->n) return rx_error(r, "a trailing backslash");
        rx_class c = {{0}, 0};
        if (cls_shorthand(&c, r->p[r->i])) {
            r->i++;
            return cls_symbol(r, &c);
        }
        long v = rx_escape_char(r);
        return v < 0 ? 0 : codepoint_literal(r, v);
    }
    if (ch == '*' || ch == '+' || ch == '?') return rx_error(r, "a quantifier with nothing to repeat");
    if (ch < 0x80) {
        r->i++;
        return codepoint_literal(r, ch);
    }
    /* a non-ASCII character: its bytes as they are */
    size_t len = ch >= 0xF0 ? 4 : ch >= 0xE0 ? 3 : ch >= 0xC0 ? 2 : 0;
    if (len == 0 || r->i + len > r->n) return rx_error(r, "malformed UTF-8");
    for (size_t k = 1; k < len; k++)
        if ((r->p[r->i + k] & 0xC0) != 0x80) return rx_error(r, "malformed UTF-8");
    int32_t lit = gb_literal(r->b, (const char *)r->p + r->i, len);
    r->i += len;
    return lit;
}

/* {m}, {m,}, {m,n}, {,n} at r->i: 1 with the bounds (max -1: none), 0 when it is no quantifier
 * (Python then reads the { as a literal). */
static int rx_braces(rx *r, int64_t *min, int64_t *max) {
    size_t i = r->i + 1;
    int64_t a = 0, bnd = -1;
    int have_a = 0, have_b = 0, comma = 0;
    /* numbers past GRAMMAR_MAX_COUNT saturate just above it, so gb_repeat refuses them */
    while (i < r->n && r->p[i] >= '0' && r->p[i] <= '9') {
        a = a * 10 + (r->p[i] - '0');
        if (a > GRAMMAR_MAX_COUNT) a = (int64_t)GRAMMAR_MAX_COUNT + 1;
        have_a = 1;
        i++;
    }
    if (i < r->n && r->p[i] == ',') {
        comma = 1;
        i++;
        bnd = 0;
        while (i < r->n && r->p[i] >= '0' && r->p[i] <= '9') {
            bnd = bnd * 10 + (r->p[i] - '0');
            if (bnd > GRAMMAR_MAX_COUNT) bnd = (int64_t)GRAMMAR_MAX_COUNT + 1;
            have_b = 1;
            i++;
        }
    }
    if (i >= r->n || r->p[i] != '}' || (!have_a && !have_b)) return 0;
    *min = have_a ? a : 0;
    *max = comma ? (have_b ? bnd : -1) : a;
    r->i = i + 1;
    return 1;
}

static int32_t rx_repeat(rx *r) {
    int32_t x = rx_atom(r);
    while (!rx_failed(r) && r->i < r->n) {
        uint8_t q = r->p[r->i];
        int64_t min, max;
        if (q == '*') { min = 0; max = -1; r->i++; }
        else if (q == '+') { min = 1; max = -1; r->i++; }
        else if (q == '?') { min = 0; max = 1; r->i++; }
        else if (q == '{' && rx_braces(r, &min, &max)) {
            if (max >= 0 && max < min) return rx_error(r, "a repetition {m,n} with n < m");
        } else break;
        if (r->i < r->n && r->p[r->i] == '?') r->i++; /* lazy: the same language */
        else if (r->i < r->n && r->p[r->i] == '+') return rx_error(r, "a possessive quantifier");
        x = max == 1 && min == 0 ? gb_opt(r->b, x) : gb_repeat(r->b, x, min, max);
    }
    return x;
}

static int32_t rx_concat(rx *r) {
    int32_t parts[256];
    uint32_t n = 0;
    int32_t seq = -1;
    while (!rx_failed(r) && r->i < r->n && r->p[r->i] != '|' && r->p[r->i] != ')') {
        parts[n++] = rx_repeat(r);
        if (n == 256) { /* long literal runs: chain them */
            int32_t s = gb_seq(r->b, parts, n);
            if (seq >= 0) {
                int32_t two[2] = {seq, s};
                s = gb_seq(r->b, two, 2);
            }
            seq = s;
            n = 0;
        }
    }
    if (rx_failed(r)) return 0;
    int32_t s = n ? gb_seq(r->b, parts, n) : gb_empty(r->b);
    if (seq >= 0) {
        int32_t two[2] = {seq, s};
        s = gb_seq(r->b, two, 2);
    }
    return s;
}

static int32_t rx_alternation(rx *r) {
    int32_t rule = -1;
    for (;;) {
        int32_t alt = rx_concat(r); /* a rule */
        if (rx_failed(r)) return 0;
        const int more = r->i < r->n && r->p[r->i] == '|';
        /* one alternative is itself: a group adds no rule, so "((a*))*" is a star of a star */
        if (rule < 0 && !more) return alt;
        if (rule < 0) rule = gb_rule_new(r->b);
        gb_rule_add(r->b, rule, &alt, 1);
        if (!more) return rule;
        r->i++;
    }
}

int32_t gb_regex(gram_builder *b, const char *pattern, size_t len, int json_string, const char *where) {
    rx r = {b, (const uint8_t *)pattern, len, 0, json_string, where, 0};
    int anchored_start = 0, anchored_end = 0;
    if (r.n > 0 && r.p[0] == '^') {
        anchored_start = 1;
        r.i = 1;
    }
    if (r.n > r.i && r.p[r.n - 1] == '$') {
        size_t slashes = 0;
        while (r.n - 1 > slashes + r.i && r.p[r.n - 2 - slashes] == '\\') slashes++;
        if (slashes % 2 == 0) {
            anchored_end = 1;
            r.n--;
        }
    }
    int32_t core = rx_alternation(&r);
    if (rx_failed(&r)) return 0;
    if (r.i < r.n) return rx_error(&r, "an unmatched )");
    if (!json_string) return core;
    /* JSON Schema's pattern searches: any content around an unanchored match */
    int32_t parts[3];
    uint32_t n = 0;
    if (!anchored_start) parts[n++] = gb_star(b, gb_json_unit(b));
    parts[n++] = core;
    if (!anchored_end) parts[n++] = gb_star(b, gb_json_unit(b));
    return gb_seq(b, parts, n);
}
