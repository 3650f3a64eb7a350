/* The grammar builder (rules of byte sets and rule references), its compiled form, and the JSON
 * pieces every compiler shares: whitespace, UTF-8 characters, string content, any value. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "grammar/grammar_internal.h"
#include "util/error.h"

void gb_init(gram_builder *b) {
    memset(b, 0, sizeof(*b));
    b->status = NOPAD_OK;
    b->ws = b->json_unit = b->any_value = b->string_rule = b->utf8_char = -1;
}

void gb_discard(gram_builder *b) {
    for (uint32_t r = 0; r < b->n_rules; r++) free(b->rules[r].syms);
    free(b->rules);
    free(b->sets);
    memset(b, 0, sizeof(*b));
}

nopad_status gb_fail(gram_builder *b, nopad_status status, const char *fmt, ...) {
    if (b->status != NOPAD_OK) return b->status;
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    b->status = nopad_set_error(status, "%s", msg);
    return b->status;
}

static int gb_grow(gram_builder *b, void **ptr, uint32_t *cap, uint32_t need, size_t elem) {
    if (need <= *cap) return 1;
    uint32_t cap2 = *cap ? *cap * 2 : 16;
    while (cap2 < need) cap2 *= 2;
    void *p = realloc(*ptr, (size_t)cap2 * elem);
    if (!p) {
        gb_fail(b, NOPAD_ERR_OUT_OF_MEMORY, "grammar: out of memory building the rules");
        return 0;
    }
    *ptr = p;
    *cap = cap2;
    return 1;
}

int32_t gb_set(gram_builder *b, const uint32_t set[8]) {
    if (b->status != NOPAD_OK) return GB_SET(0);
    /* byte sets repeat a lot (digits, string characters): share them */
    for (uint32_t i = 0; i < b->n_sets; i++)
        if (!memcmp(b->sets[i], set, sizeof(b->sets[i]))) return GB_SET(i);
    if (!gb_grow(b, (void **)&b->sets, &b->cap_sets, b->n_sets + 1, sizeof(b->sets[0])))
        return GB_SET(0);
    memcpy(b->sets[b->n_sets], set, sizeof(b->sets[0]));
    return GB_SET(b->n_sets++);
}

int32_t gb_range(gram_builder *b, uint8_t lo, uint8_t hi) {
    uint32_t set[8] = {0};
    for (unsigned c = lo; c <= hi; c++) set[c >> 5] |= 1u << (c & 31);
    return gb_set(b, set);
}

int32_t gb_byte(gram_builder *b, uint8_t byte) { return gb_range(b, byte, byte); }

int32_t gb_rule_new(gram_builder *b) {
    if (b->status != NOPAD_OK) return 0;
    if (!gb_grow(b, (void **)&b->rules, &b->cap_rules, b->n_rules + 1, sizeof(gb_rule))) return 0;
    memset(&b->rules[b->n_rules], 0, sizeof(gb_rule));
    return (int32_t)b->n_rules++;
}

void gb_rule_add(gram_builder *b, int32_t rule, const int32_t *syms, uint32_t n) {
    if (b->status != NOPAD_OK) return;
    b->total += n + 1;
    if (b->total > GRAMMAR_MAX_SYMBOLS) {
        gb_fail(b, NOPAD_ERR_UNSUPPORTED,
                "grammar: more than %u symbols (a repetition or length bound too large to expand)",
                GRAMMAR_MAX_SYMBOLS);
        return;
    }
    gb_rule *r = &b->rules[rule];
    if (!gb_grow(b, (void **)&r->syms, &r->cap, r->n + n + 1, sizeof(int32_t))) return;
    if (r->n_alts++ > 0) r->syms[r->n++] = GB_ALT;
    if (n) memcpy(r->syms + r->n, syms, n * sizeof(int32_t));
    r->n += n;
}

int32_t gb_seq(gram_builder *b, const int32_t *syms, uint32_t n) {
    if (n == 1 && !GB_IS_SET(syms[0])) return syms[0];
    int32_t r = gb_rule_new(b);
    gb_rule_add(b, r, syms, n);
    return r;
}

int32_t gb_choice(gram_builder *b, const int32_t *syms, uint32_t n) {
    int32_t r = gb_rule_new(b);
    for (uint32_t i = 0; i < n; i++) gb_rule_add(b, r, &syms[i], 1);
    return r;
}

int32_t gb_empty(gram_builder *b) {
    int32_t r = gb_rule_new(b);
    gb_rule_add(b, r, NULL, 0);
    return r;
}

/* x's rule when it is one (not a byte set) and the builder works, else NULL. */
static const gb_rule *rule_of(const gram_builder *b, int32_t x) {
    return b->status == NOPAD_OK && !GB_IS_SET(x) ? &b->rules[x] : NULL;
}

/* 1 when x is body{0,} or body{1,} (a regex's "a+"): its star is body's. */
static int unbounded_from_one(const gb_rule *x) {
    return x && x->is_repeat && x->rep_min <= 1 && x->rep_max == UINT32_MAX;
}

int32_t gb_opt(gram_builder *b, int32_t x) {
    const gb_rule *rx = rule_of(b, x);
    if (rx && rx->shape != GB_PLAIN) return x;                   /* (x*)? = x*, (x?)? = x? */
    if (unbounded_from_one(rx)) return gb_star(b, rx->rep_body); /* (x+)? = x* */
    int32_t r = gb_rule_new(b);
    gb_rule_add(b, r, &x, 1);
    gb_rule_add(b, r, NULL, 0);
    if (b->status == NOPAD_OK) b->rules[r].shape = GB_OPT, b->rules[r].inner = x;
    return r;
}

int32_t gb_star(gram_builder *b, int32_t x) {
    const gb_rule *rx = rule_of(b, x);
    if (rx && rx->shape == GB_STAR) return x;                     /* (x*)* = x* */
    if (rx && rx->shape == GB_OPT) return gb_star(b, rx->inner);  /* (x?)* = x* */
    if (unbounded_from_one(rx)) return gb_star(b, rx->rep_body); /* (x+)* = x* */
    /* R ::= x R | empty: right recursion, which the matcher runs in constant stack depth */
    int32_t r = gb_rule_new(b);
    int32_t seq[2] = {x, r};
    gb_rule_add(b, r, seq, 2);
    gb_rule_add(b, r, NULL, 0);
    if (b->status == NOPAD_OK) b->rules[r].shape = GB_STAR, b->rules[r].inner = x;
    return r;
}

int32_t gb_repeat(gram_builder *b, int32_t x, int64_t min, int64_t max) {
    if (b->status != NOPAD_OK) return 0;
    if (max >= 0 && max < min) {
        gb_fail(b, NOPAD_ERR_INVALID_ARGUMENT, "grammar: a repetition {%lld,%lld} with max < min",
                (long long)min, (long long)max);
        return 0;
    }
    if (min > GRAMMAR_MAX_COUNT || max > GRAMMAR_MAX_COUNT) {
        gb_fail(b, NOPAD_ERR_UNSUPPORTED, "grammar: a repetition bound %lld above %u",
                (long long)(max > min ? max : min), GRAMMAR_MAX_COUNT);
        return 0;
    }
    if (min == 0 && max < 0) return gb_star(b, x);
    if (min == 0 && max == 1) return gb_opt(b, x);
    const gb_rule *rx = rule_of(b, x);
    if (rx && rx->shape == GB_STAR && max != 0) return x;                 /* (x*){m,n} = x* */
    if (rx && rx->shape == GB_OPT && max < 0) return gb_star(b, rx->inner); /* (x?){m,} = x* */
    /* a counted repetition: the matcher carries the count, so x{0,4000} is one element and a
     * bounded string's characters differ only by the count (which the mask walk exploits) */
    int32_t body = gb_seq(b, &x, 1);
    int32_t r = gb_rule_new(b);
    if (b->status != NOPAD_OK) return 0;
    b->rules[r].is_repeat = 1;
    b->rules[r].rep_body = body;
    b->rules[r].rep_min = (uint32_t)min;
    b->rules[r].rep_max = max < 0 ? UINT32_MAX : (uint32_t)max;
    return r;
}

int32_t gb_literal(gram_builder *b, const char *bytes, size_t n) {
    int32_t r = gb_rule_new(b);
    int32_t buf[64];
    /* long literals (enum values) in one alternative, 64 symbols at a time */
    gb_rule *rule;
    for (size_t i = 0; i < n && b->status == NOPAD_OK;) {
        uint32_t k = 0;
        while (k < 64 && i < n) buf[k++] = gb_byte(b, (uint8_t)bytes[i++]);
        rule = &b->rules[r];
        b->total += k;
        if (b->total > GRAMMAR_MAX_SYMBOLS) {
            gb_fail(b, NOPAD_ERR_UNSUPPORTED, "grammar: more than %u symbols", GRAMMAR_MAX_SYMBOLS);
            break;
        }
        if (!gb_grow(b, (void **)&rule->syms, &rule->cap, rule->n + k + 1, sizeof(int32_t))) break;
        memcpy(rule->syms + rule->n, buf, k * sizeof(int32_t));
        rule->n += k;
        rule->n_alts = 1;
    }
    if (b->status == NOPAD_OK && b->rules[r].n_alts == 0) gb_rule_add(b, r, NULL, 0);
    return r;
}

/* ---- JSON pieces ---------------------------------------------------------------------------- */

int32_t gb_ws(gram_builder *b) {
    /* At most one whitespace byte where JSON allows any amount: a model may space its JSON as it
     * learnt to ({"a": 1, "b": 2}), but cannot loop on whitespace forever. */
    if (b->ws < 0) {
        uint32_t set[8] = {0};
        set[' ' >> 5] |= 1u << (' ' & 31);
        set['\n' >> 5] |= 1u << ('\n' & 31);
        b->ws = gb_opt(b, gb_set(b, set));
    }
    return b->ws;
}

int32_t gb_utf8_char(gram_builder *b) {
    if (b->utf8_char < 0) {
        /* the well-formed sequences of Unicode's table 3-7: no overlongs, no surrogates */
        int32_t cont = gb_range(b, 0x80, 0xBF);
        int32_t r = gb_rule_new(b);
        int32_t s2[] = {gb_range(b, 0xC2, 0xDF), cont};
        int32_t s3a[] = {gb_byte(b, 0xE0), gb_range(b, 0xA0, 0xBF), cont};
        uint32_t e1_ef[8] = {0}; /* E1-EC and EE-EF: the same shape, one alternative */
        for (unsigned c = 0xE1; c <= 0xEF; c++)
            if (c != 0xED) e1_ef[c >> 5] |= 1u << (c & 31);
        int32_t s3b[] = {gb_set(b, e1_ef), cont, cont};
        int32_t s3c[] = {gb_byte(b, 0xED), gb_range(b, 0x80, 0x9F), cont};
        int32_t s4a[] = {gb_byte(b, 0xF0), gb_range(b, 0x90, 0xBF), cont, cont};
        int32_t s4b[] = {gb_range(b, 0xF1, 0xF3), cont, cont, cont};
        int32_t s4c[] = {gb_byte(b, 0xF4), gb_range(b, 0x80, 0x8F), cont, cont};
        gb_rule_add(b, r, s2, 2);
        gb_rule_add(b, r, s3a, 3);
        gb_rule_add(b, r, s3b, 3);
        gb_rule_add(b, r, s3c, 3);
        gb_rule_add(b, r, s4a, 4);
        gb_rule_add(b, r, s4b, 4);
        gb_rule_add(b, r, s4c, 4);
        b->utf8_char = r;
    }
    return b->utf8_char;
}

/* The set of the bytes in `chars`. */
static int32_t gb_chars(gram_builder *b, const char *chars) {
    uint32_t set[8] = {0};
    for (const char *p = chars; *p; p++) set[(uint8_t)*p >> 5] |= 1u << (*p & 31);
    return gb_set(b, set);
}

int32_t gb_json_unit(gram_builder *b) {
    if (b->json_unit < 0) {
        /* printable ASCII but " and \, a non-ASCII character, or an escape; \u escapes of
         * surrogates are refused, so each unit is one character of the decoded string (what
         * minLength / maxLength count). The escapes share their backslash: the fewer the
         * alternatives after a character, the cheaper each matcher step inside a string. */
        uint32_t plain[8] = {0};
        for (unsigned c = 0x20; c < 0x80; c++)
            if (c != '"' && c != '\\') plain[c >> 5] |= 1u << (c & 31);
        int32_t h = gb_chars(b, "0123456789abcdefABCDEF");
        int32_t u_plain[] = {gb_chars(b, "0123456789abcABC"), h, h, h};
        int32_t u_d[] = {gb_chars(b, "dD"), gb_chars(b, "01234567"), h, h};
        int32_t u_ef[] = {gb_chars(b, "efEF"), h, h, h};
        int32_t hex4_alts[] = {gb_seq(b, u_plain, 4), gb_seq(b, u_d, 4), gb_seq(b, u_ef, 4)};
        int32_t u_seq[] = {gb_byte(b, 'u'), gb_choice(b, hex4_alts, 3)};
        int32_t after_alts[] = {gb_chars(b, "\"\\/bfnrt"), gb_seq(b, u_seq, 2)};
        int32_t escape[] = {gb_byte(b, '\\'), gb_choice(b, after_alts, 2)};
        int32_t r = gb_rule_new(b);
        int32_t one = gb_set(b, plain);
        gb_rule_add(b, r, &one, 1);
        int32_t utf8 = gb_utf8_char(b);
        gb_rule_add(b, r, &utf8, 1);
        int32_t esc = gb_seq(b, escape, 2);
        gb_rule_add(b, r, &esc, 1);
        b->json_unit = r;
    }
    return b->json_unit;
}

int32_t gb_json_string(gram_builder *b) {
    if (b->string_rule < 0) {
        int32_t q = gb_byte(b, '"');
        int32_t seq[] = {q, gb_star(b, gb_json_unit(b)), q};
        b->string_rule = gb_seq(b, seq, 3);
    }
    return b->string_rule;
}

/* The number forms a JSON value may take, with bounded digit counts (18 integer digits, 18
 * fraction digits, 2 exponent digits): a model cannot loop on digits forever, and every number
 * reads as a finite double (below 1e118). */
int32_t gb_json_number(gram_builder *b) {
    int32_t digit = gb_range(b, '0', '9');
    int32_t int_part_nz[] = {gb_range(b, '1', '9'), gb_repeat(b, digit, 0, 17)};
    int32_t int_alts[] = {gb_byte(b, '0'), gb_seq(b, int_part_nz, 2)};
    int32_t frac[] = {gb_byte(b, '.'), gb_repeat(b, digit, 1, 18)};
    uint32_t e[8] = {0}, sign[8] = {0};
    e['e' >> 5] |= 1u << ('e' & 31);
    e['E' >> 5] |= 1u << ('E' & 31);
    sign['+' >> 5] |= 1u << ('+' & 31);
    sign['-' >> 5] |= 1u << ('-' & 31);
    int32_t exp[] = {gb_set(b, e), gb_opt(b, gb_set(b, sign)), gb_repeat(b, digit, 1, 2)};
    int32_t seq[] = {gb_opt(b, gb_byte(b, '-')), gb_choice(b, int_alts, 2),
                     gb_opt(b, gb_seq(b, frac, 2)), gb_opt(b, gb_seq(b, exp, 3))};
    return gb_seq(b, seq, 4);
}

int32_t gb_any_value(gram_builder *b) {
    if (b->any_value < 0) {
        int32_t value = gb_rule_new(b);
        b->any_value = value;
        int32_t ws = gb_ws(b);
        int32_t str = gb_json_string(b);
        /* object: { ws (kv (ws , ws kv)*)? ws } with kv = string ws : ws value */
        int32_t kv_seq[] = {str, ws, gb_byte(b, ':'), ws, value};
        int32_t kv = gb_seq(b, kv_seq, 5);
        int32_t more_kv[] = {ws, gb_byte(b, ','), ws, kv};
        int32_t members[] = {kv, gb_star(b, gb_seq(b, more_kv, 4))};
        int32_t object[] = {gb_byte(b, '{'), ws, gb_opt(b, gb_seq(b, members, 2)), ws, gb_byte(b, '}')};
        int32_t more_v[] = {ws, gb_byte(b, ','), ws, value};
        int32_t items[] = {value, gb_star(b, gb_seq(b, more_v, 4))};
        int32_t array[] = {gb_byte(b, '['), ws, gb_opt(b, gb_seq(b, items, 2)), ws, gb_byte(b, ']')};
        int32_t alts[] = {gb_seq(b, object, 5), gb_seq(b, array, 5), str, gb_json_number(b),
                          gb_literal(b, "true", 4), gb_literal(b, "false", 5), gb_literal(b, "null", 4)};
        for (int i = 0; i < 7; i++) gb_rule_add(b, value, &alts[i], 1);
    }
    return b->any_value;
}

/* ---- the compiled form ---------------------------------------------------------------------- */

/* FNV-1a over n bytes, continuing from h. */
static uint64_t fnv1a(uint64_t h, const void *bytes, size_t n) {
    const unsigned char *p = bytes;
    for (size_t i = 0; i < n; i++) h = (h ^ p[i]) * 0x100000001b3ull;
    return h;
}

/* Everything a matcher reads of the grammar, hashed. */
static uint64_t grammar_fingerprint(const grammar *g) {
    uint64_t h = 0xcbf29ce484222325ull;
    const uint32_t n_alts = g->rule_alt0[g->n_rules];
    const uint32_t sizes[5] = {g->n_elems, g->n_sets, g->n_rules, n_alts, g->root};
    h = fnv1a(h, sizes, sizeof sizes);
    h = fnv1a(h, g->elems, (size_t)g->n_elems * sizeof *g->elems);
    h = fnv1a(h, g->sets, (size_t)g->n_sets * sizeof g->sets[0]);
    h = fnv1a(h, g->alt_start, (size_t)n_alts * sizeof *g->alt_start);
    h = fnv1a(h, g->rule_alt0, ((size_t)g->n_rules + 1) * sizeof *g->rule_alt0);
    return fnv1a(h, g->repeat, ((size_t)g->n_rules + 1) * sizeof g->repeat[0]);
}

nopad_status gb_finish(gram_builder *b, int32_t root, grammar **out) {
    *out = NULL;
    if (b->status != NOPAD_OK) {
        nopad_status st = b->status;
        gb_discard(b);
        return st;
    }
    /* the start as a reference, so that a counted repetition at the top is run as one */
    int32_t start = gb_rule_new(b);
    gb_rule_add(b, start, &root, 1);
    root = start;
    grammar *g = calloc(1, sizeof(*g));
    /* a rule without alternatives (an empty anyOf) matches nothing: one alternative of the
     * empty byte set */
    int32_t nothing = gb_set(b, (const uint32_t[8]){0});
    for (uint32_t r = 0; r < b->n_rules && b->status == NOPAD_OK; r++)
        if (b->rules[r].n_alts == 0 && !b->rules[r].is_repeat) gb_rule_add(b, (int32_t)r, &nothing, 1);
    if (b->status != NOPAD_OK) {
        free(g);
        nopad_status st = b->status;
        gb_discard(b);
        return st;
    }
    size_t n_elems = 0, n_alts = 0;
    for (uint32_t r = 0; r < b->n_rules; r++) {
        gb_rule *rule = &b->rules[r];
        n_alts++;
        n_elems += 1;
        for (uint32_t i = 0; i < rule->n; i++) {
            if (rule->syms[i] == GB_ALT) n_alts++;
            n_elems++;
        }
    }
    if (g) {
        g->elems = malloc(n_elems * sizeof(uint32_t));
        g->alt_start = malloc(n_alts * sizeof(uint32_t));
        g->rule_alt0 = malloc((b->n_rules + 1) * sizeof(uint32_t));
        g->sets = malloc((b->n_sets ? b->n_sets : 1) * sizeof(g->sets[0]));
        g->repeat = calloc(b->n_rules + 1, sizeof(g->repeat[0]));
    }
    if (!g || !g->elems || !g->alt_start || !g->rule_alt0 || !g->sets || !g->repeat) {
        grammar_free(g);
        gb_discard(b);
        return nopad_set_error(NOPAD_ERR_OUT_OF_MEMORY, "grammar: out of memory compiling %zu elements",
                               n_elems);
    }
    uint32_t e = 0, a = 0;
    for (uint32_t r = 0; r < b->n_rules; r++) {
        gb_rule *rule = &b->rules[r];
        g->rule_alt0[r] = a;
        g->alt_start[a++] = e;
        for (uint32_t i = 0; i < rule->n; i++) {
            int32_t s = rule->syms[i];
            if (s == GB_ALT) {
                g->elems[e++] = GRAM_END;
                g->alt_start[a++] = e;
            } else if (GB_IS_SET(s)) {
                g->elems[e++] = GRAM_CHAR | GB_SET_ID(s) << 2;
            } else {
                g->elems[e++] = (b->rules[s].is_repeat ? GRAM_REPEAT : GRAM_REF) | (uint32_t)s << 2;
            }
        }
        g->elems[e++] = GRAM_END;
    }
    g->rule_alt0[b->n_rules] = a;
    for (uint32_t r = 0; r < b->n_rules; r++)
        if (b->rules[r].is_repeat)
            g->repeat[r] = (grammar_repeat){(uint32_t)b->rules[r].rep_body, b->rules[r].rep_min, b->rules[r].rep_max};
    g->n_elems = e;
    g->n_rules = b->n_rules;
    if (b->n_sets) memcpy(g->sets, b->sets, b->n_sets * sizeof(g->sets[0]));
    g->n_sets = b->n_sets;
    g->root = (uint32_t)root;
    g->fingerprint = grammar_fingerprint(g);
    gb_discard(b);
    *out = g;
    return NOPAD_OK;
}

void grammar_free(grammar *g) {
    if (!g) return;
    free(g->elems);
    free(g->sets);
    free(g->alt_start);
    free(g->rule_alt0);
    free(g->repeat);
    free(g);
}

size_t grammar_size(const grammar *g) { return g->n_elems; }

/* ---- grammars of a regex and of a list of choices ------------------------------------------- */

nopad_status grammar_from_regex(const char *pattern, size_t len, grammar **out) {
    gram_builder b;
    gb_init(&b);
    int32_t root = gb_regex(&b, pattern, len, 0, "guided_regex");
    return gb_finish(&b, root, out);
}

nopad_status grammar_from_choices(const char *const *choices, const size_t *lens, size_t n,
                                  grammar **out) {
    *out = NULL;
    if (n == 0) return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT, "guided_choice: an empty list of choices");
    gram_builder b;
    gb_init(&b);
    int32_t root = gb_rule_new(&b);
    for (size_t i = 0; i < n; i++) {
        int32_t lit = gb_literal(&b, choices[i], lens[i]);
        gb_rule_add(&b, root, &lit, 1);
    }
    return gb_finish(&b, root, out);
}
