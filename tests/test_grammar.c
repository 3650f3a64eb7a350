/* Constrained decoding (issue 44, src/grammar/): schemas, regexes and choices to grammars, the
 * byte matcher on documents it must accept and reject, the token masks against brute force over
 * random vocabularies, random walks through masks that must end in valid documents, the refused
 * keywords, and the mask time on SmolLM2's vocabulary (printed; skipped without the GGUF).
 *
 * Also the C side of tests/python/test_grammar_schema.py (the jsonschema package as the
 * reference), run as:
 *   test_grammar --check CASES.json
 *       CASES: [{"schema": S | "regex": R | "choices": [..] | "json_object": true,
 *                "docs": ["text", ...]}]; prints a line per case: "ERR <message>", or one
 *       character per document, 1 accepted, 0 refused;
 *   test_grammar --generate CASES.json N SEED
 *       prints, per case, N documents from random byte walks through the grammar (one JSON
 *       string per line; a line "ERR <message>" for a grammar that does not compile). */
#include "testutil.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cjson/cJSON.h>

#include "grammar/grammar.h"
#include "grammar/grammar_internal.h" /* the kept masks' hit count */

/* ---- helpers -------------------------------------------------------------------------------- */

static grammar *schema_grammar(const char *schema) {
    grammar *g = NULL;
    nopad_status st = grammar_from_json_schema(schema, strlen(schema), &g);
    if (st != NOPAD_OK) fail_msg("schema %s: %s", schema, nopad_last_error());
    return g;
}

static int matches(const grammar *g, const char *doc) {
    grammar_matcher *m = NULL;
    assert_nopad_ok(grammar_matcher_create(g, &m));
    int ok = grammar_matcher_accept_bytes(m, (const uint8_t *)doc, strlen(doc)) &&
             grammar_matcher_is_accepting(m);
    grammar_matcher_free(m);
    return ok;
}

static void expect_docs(const char *schema, const char *const *good, const char *const *bad) {
    grammar *g = schema_grammar(schema);
    for (const char *const *d = good; *d; d++)
        if (!matches(g, *d)) fail_msg("schema %s refuses valid %s", schema, *d);
    for (const char *const *d = bad; *d; d++)
        if (matches(g, *d)) fail_msg("schema %s accepts invalid %s", schema, *d);
    grammar_free(g);
}

/* A random walk over bytes: at each step one of the bytes the matcher takes; stops when
 * accepting with probability 1/4, and after `soft` bytes prefers closing bytes and a few letters,
 * so that nested values and searched patterns end. Returns the length, or -1 when the walk died or ran past cap. */
static long random_walk(grammar_matcher *m, char *out, long cap, long soft, uint64_t *rng) {
    long n = 0;
    while (n + 1 < cap) {
        if (grammar_matcher_is_accepting(m) &&
            (!grammar_matcher_can_continue(m) || test_rand_u32(rng) % 4 == 0 || n > soft))
            break;
        /* past `soft`: closing bytes first, then a small alphabet (a pattern's "ab|cd" is
         * met sooner among few letters than among every character) */
        uint8_t allowed[256], closing[256], small[256];
        int na = 0, nc = 0, ns = 0;
        for (int b = 0; b < 256; b++) {
            grammar_mark mark = grammar_matcher_save(m);
            if (grammar_matcher_accept(m, (uint8_t)b)) {
                allowed[na++] = (uint8_t)b;
                if (b && strchr("\"}]0123456789el", b)) closing[nc++] = (uint8_t)b;
                if (b && strchr("abcdfAZ:-.T@", b)) small[ns++] = (uint8_t)b;
            }
            grammar_matcher_restore(m, mark);
        }
        if (na == 0) return -1;
        uint8_t pick = allowed[test_rand_u32(rng) % na];
        if (n > soft && nc > 0 && test_rand_u32(rng) % 2) pick = closing[test_rand_u32(rng) % nc];
        else if (n > soft && ns > 0) pick = small[test_rand_u32(rng) % ns];
        if (!grammar_matcher_accept(m, pick)) return -1;
        out[n++] = (char)pick;
    }
    out[n] = 0;
    return grammar_matcher_is_accepting(m) ? n : -1;
}

/* ---- documents ------------------------------------------------------------------------------ */

static void test_objects(void **state) {
    (void)state;
    const char *schema =
        "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\"},"
        "\"age\":{\"type\":\"integer\",\"minimum\":0,\"maximum\":150},"
        "\"tags\":{\"type\":\"array\",\"items\":{\"type\":\"string\"},\"minItems\":1,\"maxItems\":3}},"
        "\"required\":[\"name\",\"age\"],\"additionalProperties\":false}";
    const char *good[] = {"{\"name\":\"Ann\",\"age\":31}", "{\"name\": \"A\\\"b\", \"age\": 0}",
                          "{\"name\":\"\",\"age\":150,\"tags\":[\"x\"]}",
                          "{\"name\":\"é😀\",\"age\":7,\"tags\":[\"a\", \"b\",\"c\"]}",
                          "{\n\"name\":\"x\\u00e9\",\"age\":99\n}", NULL};
    const char *bad[] = {"{\"age\":31,\"name\":\"Ann\"}", /* order: canonical form only */
                         "{\"name\":\"Ann\"}", "{\"name\":\"Ann\",\"age\":151}",
                         "{\"name\":\"Ann\",\"age\":-1}", "{\"name\":\"Ann\",\"age\":01}",
                         "{\"name\":\"Ann\",\"age\":3,\"tags\":[]}",
                         "{\"name\":\"Ann\",\"age\":3,\"tags\":[\"a\",\"b\",\"c\",\"d\"]}",
                         "{\"name\":\"Ann\",\"age\":3,\"x\":1}", "{\"name\":\"Ann\",\"age\":3}x",
                         "{\"name\":\"A\nB\",\"age\":3}", "{\"name\":\"\\ud800\",\"age\":3}",
                         "{  \"name\":\"Ann\",\"age\":3}", "{\"name\":\"\xC0\x80\",\"age\":3}", NULL};
    expect_docs(schema, good, bad);

    /* additionalProperties absent: extra keys after the listed ones, never a listed key again */
    const char *open_schema = "{\"type\":\"object\",\"properties\":{\"id\":{\"type\":\"integer\"}},"
                              "\"required\":[\"id\"]}";
    const char *open_good[] = {"{\"id\":1}", "{\"id\":1,\"i\":[1,{\"a\":null}]}", "{\"id\":1,\"idx\":true}",
                               "{\"id\":1,\"x\":\"y\",\"z\":-2.5e3}", NULL};
    const char *open_bad[] = {"{\"id\":1,\"id\":2}", "{\"id\":1,\"\\u0069d\":2}", "{}", NULL};
    expect_docs(open_schema, open_good, open_bad);
}

static void test_types_enums_unions(void **state) {
    (void)state;
    const char *schema =
        "{\"$defs\":{\"Color\":{\"enum\":[\"red\",\"green\",\"a\\\"b\"],\"type\":\"string\"},"
        "\"Node\":{\"type\":\"object\",\"properties\":{\"v\":{\"type\":\"integer\"},"
        "\"next\":{\"anyOf\":[{\"$ref\":\"#/$defs/Node\"},{\"type\":\"null\"}]}},"
        "\"required\":[\"v\",\"next\"],\"additionalProperties\":false}},"
        "\"type\":\"object\",\"properties\":{\"c\":{\"$ref\":\"#/$defs/Color\"},"
        "\"n\":{\"$ref\":\"#/$defs/Node\"},\"k\":{\"const\":{\"a\":[1,2.5,true]}},"
        "\"t\":{\"type\":[\"number\",\"boolean\"]}},"
        "\"required\":[\"c\",\"n\"],\"additionalProperties\":false}";
    const char *good[] = {"{\"c\":\"red\",\"n\":{\"v\":1,\"next\":null}}",
                          "{\"c\":\"a\\\"b\",\"n\":{\"v\":1,\"next\":{\"v\":-2,\"next\":null}},\"k\":{\"a\":[1,2.5,true]}}",
                          "{\"c\":\"green\",\"n\":{\"v\":0,\"next\":null},\"t\":-0.5e-3}",
                          "{\"c\":\"green\",\"n\":{\"v\":0,\"next\":null},\"t\":false}", NULL};
    const char *bad[] = {"{\"c\":\"blue\",\"n\":{\"v\":1,\"next\":null}}",
                         "{\"c\":\"red\",\"n\":{\"v\":1}}", "{\"c\":\"red\",\"n\":{\"v\":1,\"next\":null},\"k\":{\"a\":[1]}}",
                         "{\"c\":\"red\",\"n\":{\"v\":1,\"next\":null},\"t\":\"1\"}",
                         "{\"c\":\"red\",\"n\":{\"v\":1,\"next\":null},\"t\":1.}", NULL};
    expect_docs(schema, good, bad);

    /* integer bounds across signs and digit counts, exclusive bounds */
    const char *ints = "{\"type\":\"integer\",\"minimum\":-125,\"exclusiveMaximum\":1000}";
    const char *int_good[] = {"-125", "-99", "-1", "0", "7", "10", "999", "-100", NULL};
    const char *int_bad[] = {"-126", "1000", "-0", "007", "1e2", "1.0", "", "-", NULL};
    expect_docs(ints, int_good, int_bad);
}

static void test_strings(void **state) {
    (void)state;
    const char *lengths = "{\"type\":\"string\",\"minLength\":2,\"maxLength\":3}";
    const char *len_good[] = {"\"ab\"", "\"a\\nb\"", "\"éé\"", "\"\\u00e9ab\"", NULL};
    const char *len_bad[] = {"\"a\"", "\"abcd\"", "\"\"", "\"a\\\"bc\"", NULL};
    expect_docs(lengths, len_good, len_bad);

    /* counted repetitions: a large bound is one element, not expanded, and counts exactly */
    const char *huge = "{\"type\":\"array\",\"items\":{\"type\":\"string\",\"minLength\":3,\"maxLength\":100000000},"
                       "\"minItems\":2,\"maxItems\":500000000}";
    grammar *g = schema_grammar(huge);
    assert_true(grammar_size(g) < 2000);
    assert_true(matches(g, "[\"abc\",\"defg\"]"));
    assert_false(matches(g, "[\"abc\"]"));
    assert_false(matches(g, "[\"abc\",\"de\"]"));
    grammar_free(g);

    const char *pattern = "{\"type\":\"string\",\"pattern\":\"^[A-Z]{2}-\\\\d{3,4}(x|yz)?$\"}";
    const char *pat_good[] = {"\"AB-123\"", "\"ZZ-0000x\"", "\"QQ-999yz\"", NULL};
    const char *pat_bad[] = {"\"ab-123\"", "\"AB-12\"", "\"AB-12345\"", "\"AB-123y\"", "\" AB-123\"", NULL};
    expect_docs(pattern, pat_good, pat_bad);

    /* unanchored: a search, anything around the match */
    const char *search = "{\"type\":\"string\",\"pattern\":\"a\\\"+b\"}";
    const char *search_good[] = {"\"a\\\"b\"", "\"xxa\\\"\\\"by\"", NULL};
    const char *search_bad[] = {"\"ab\"", "\"a\\\"\"", NULL};
    expect_docs(search, search_good, search_bad);

    const char *dates = "{\"type\":\"array\",\"items\":{\"type\":\"string\",\"format\":\"date\"}}";
    const char *date_good[] = {"[\"2024-02-29\",\"2000-02-29\",\"1999-12-31\",\"0001-01-01\"]", NULL};
    const char *date_bad[] = {"[\"2023-02-29\"]", "[\"1900-02-29\"]", "[\"2024-04-31\"]", "[\"0000-01-01\"]",
                              "[\"2024-1-01\"]", NULL};
    expect_docs(dates, date_good, date_bad);

    const char *formats = "{\"type\":\"object\",\"properties\":{\"id\":{\"type\":\"string\",\"format\":\"uuid\"},"
                          "\"at\":{\"type\":\"string\",\"format\":\"date-time\"},"
                          "\"mail\":{\"type\":\"string\",\"format\":\"email\"}},"
                          "\"required\":[\"id\",\"at\",\"mail\"],\"additionalProperties\":false}";
    const char *fmt_good[] = {"{\"id\":\"123e4567-e89b-12d3-a456-426614174000\",\"at\":\"2024-05-06T07:08:09Z\","
                              "\"mail\":\"a.b+c@ex-ample.co.uk\"}",
                              "{\"id\":\"123E4567-E89B-12D3-A456-426614174000\",\"at\":\"2024-05-06T23:59:59.123+05:30\","
                              "\"mail\":\"x@y.z\"}", NULL};
    const char *fmt_bad[] = {"{\"id\":\"123e4567e89b12d3a456426614174000\",\"at\":\"2024-05-06T07:08:09Z\",\"mail\":\"x@y.z\"}",
                             "{\"id\":\"123e4567-e89b-12d3-a456-426614174000\",\"at\":\"2024-05-06T24:00:00Z\",\"mail\":\"x@y.z\"}",
                             "{\"id\":\"123e4567-e89b-12d3-a456-426614174000\",\"at\":\"2024-05-06T07:08:09Z\",\"mail\":\"xy.z\"}",
                             NULL};
    expect_docs(formats, fmt_good, fmt_bad);
}

static void test_regex_choices_json_object(void **state) {
    (void)state;
    grammar *g = NULL;
    const char *re = "(yes|no)( [0-9]+)?\\.|[^a-z\\n]{2}";
    assert_nopad_ok(grammar_from_regex(re, strlen(re), &g));
    assert_true(matches(g, "yes."));
    assert_true(matches(g, "no 42."));
    assert_true(matches(g, "A\""));
    assert_true(matches(g, "é!"));
    assert_false(matches(g, "maybe."));
    assert_false(matches(g, "yes"));
    assert_false(matches(g, "ab"));
    assert_false(matches(g, "A\n"));
    grammar_free(g);

    const char *choices[] = {"positive", "negative", "pos"};
    size_t lens[] = {8, 8, 3};
    assert_nopad_ok(grammar_from_choices(choices, lens, 3, &g));
    grammar_matcher *m = NULL;
    assert_nopad_ok(grammar_matcher_create(g, &m));
    assert_true(grammar_matcher_accept_bytes(m, (const uint8_t *)"pos", 3));
    /* "pos" is whole and also continues to "positive" */
    assert_true(grammar_matcher_is_accepting(m));
    assert_true(grammar_matcher_can_continue(m));
    assert_false(grammar_matcher_accept(m, 'x'));
    assert_true(grammar_matcher_accept_bytes(m, (const uint8_t *)"itive", 5));
    assert_true(grammar_matcher_is_accepting(m));
    assert_false(grammar_matcher_can_continue(m));
    grammar_matcher_free(m);
    assert_false(matches(g, "neg"));
    grammar_free(g);

    assert_nopad_ok(grammar_any_json_object(&g));
    assert_true(matches(g, "{}"));
    assert_true(matches(g, "{\"a\": [1, {\"b\": \"c\"}], \"a\": null}"));
    assert_false(matches(g, "[1]"));
    assert_false(matches(g, "{\"a\":1,}"));
    assert_false(matches(g, "{\"a\"  :1}"));
    grammar_free(g);
}

static void test_refused(void **state) {
    (void)state;
    struct {
        const char *schema, *message;
    } cases[] = {
        {"{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\",\"multipleOf\":3}}}",
         "schema.properties.a: keyword \"multipleOf\" is not supported"},
        {"{\"type\":\"array\",\"items\":{\"type\":\"string\",\"format\":\"hostname\"}}",
         "schema.items: format \"hostname\" is not supported"},
        {"{\"type\":\"number\",\"minimum\":0.5}", "schema: keyword \"minimum\" on a number that may be fractional"},
        {"{\"type\":\"string\",\"pattern\":\"(a)\\\\1\"}", "schema.pattern: regex (a)\\1: an unsupported escape"},
        {"{\"type\":\"string\",\"pattern\":\"a(?=b)\"}", "lookaround"},
        {"{\"type\":\"object\",\"patternProperties\":{}}", "keyword \"patternProperties\" is not supported"},
        {"{\"$ref\":\"#/$defs/Missing\"}", "points at nothing"},
        {"{\"type\":\"string\",\"maxLength\":3000000000}", "above 1000000000"},
        {"{\"type\":\"string\",\"pattern\":\"^a{1,20000000000}$\"}", "above 1000000000"},
        {"{\"type\":\"integer\",\"minimum\":5,\"maximum\":4}", "no integer lies within"},
        {"{\"type\":\"string\",\"pattern\":\"[é]\"}", "non-ASCII character class member"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        grammar *g = NULL;
        nopad_status st = grammar_from_json_schema(cases[i].schema, strlen(cases[i].schema), &g);
        assert_null(g);
        assert_int_not_equal(st, NOPAD_OK);
        if (!strstr(nopad_last_error(), cases[i].message))
            fail_msg("schema %s: error \"%s\" lacks \"%s\"", cases[i].schema, nopad_last_error(), cases[i].message);
    }
    /* annotations constrain nothing */
    grammar *g = schema_grammar("{\"title\":\"T\",\"description\":\"d\",\"$schema\":\"x\",\"type\":\"boolean\","
                                "\"default\":true,\"examples\":[false]}");
    assert_true(matches(g, "true"));
    assert_false(matches(g, "1"));
    grammar_free(g);
}

/* A left-recursive schema and x* of a nullable x end (and refuse) instead of looping. */
static void test_degenerate_grammars(void **state) {
    (void)state;
    grammar *g = schema_grammar("{\"$defs\":{\"A\":{\"anyOf\":[{\"$ref\":\"#/$defs/A\"},{\"type\":\"null\"}]}},"
                                "\"$ref\":\"#/$defs/A\"}");
    assert_true(matches(g, "null"));
    assert_false(matches(g, "nul"));
    grammar_free(g);
    const char *re = "(a*|b?)*c";
    assert_nopad_ok(grammar_from_regex(re, strlen(re), &g));
    assert_true(matches(g, "aabac"));
    assert_true(matches(g, "c"));
    assert_false(matches(g, "aab"));
    grammar_free(g);
    /* stacked and nested quantifiers over one atom are one loop, not 80 nested nullable ones
     * (which the matcher expanded for 48 s over a 150-byte text: fuzz_grammar's timeout, kept in
     * fuzz/corpus/grammar/stacked_stars); the same language as "[ab]*c" */
    char stacked[256] = "(";
    for (int i = 0; i < 40; i++) strcat(stacked, "(");
    strcat(stacked, "[ab]");
    for (int i = 0; i < 40; i++) strcat(stacked, i % 3 == 0 ? ")*" : i % 3 == 1 ? ")?" : ")+");
    strcat(stacked, "*?)**c");
    grammar *flat = NULL;
    assert_nopad_ok(grammar_from_regex(stacked, strlen(stacked), &g));
    assert_nopad_ok(grammar_from_regex("[ab]*c", 6, &flat));
    /* the group's wrapper of the class aside (two elements), no larger: 40 loops were 203 */
    assert_true(grammar_size(g) <= grammar_size(flat) + 2);
    assert_true(matches(g, "abbac"));
    assert_true(matches(g, "c"));
    assert_false(matches(g, "abca"));
    grammar_free(g);
    grammar_free(flat);
}

/* ---- masks ---------------------------------------------------------------------------------- */

static const char *const MASK_SCHEMAS[] = {
    "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\",\"maxLength\":6},"
    "\"n\":{\"type\":\"integer\",\"minimum\":-20,\"maximum\":300},"
    "\"ok\":{\"type\":\"boolean\"},\"e\":{\"enum\":[\"ab\",\"b\\\"c\",null]},"
    "\"xs\":{\"type\":\"array\",\"items\":{\"type\":\"number\"},\"maxItems\":3}},"
    "\"required\":[\"name\",\"n\"],\"additionalProperties\":false}",
    "{\"type\":\"object\"}",
    "{\"type\":\"array\",\"items\":{\"type\":\"string\",\"pattern\":\"^[a-c]+-\\\\d$\"},\"minItems\":1}",
    /* counted repetitions whose shape changes mid-token (minLength crossed, maxLength reached) */
    "{\"type\":\"array\",\"items\":{\"type\":\"string\",\"minLength\":2,\"maxLength\":5},\"maxItems\":4}",
    /* states that loop on themselves after a detour (a domain label's first character after its
     * dot): the walk allows such subtrees whole */
    "{\"type\":\"array\",\"items\":{\"type\":\"string\",\"format\":\"email\"},\"maxItems\":3}",
};

/* The alphabet of the random vocabularies: JSON's (with the letters of the schemas' keys) plus a
 * few non-ASCII bytes; the sequence test adds the bytes of its framing. */
static const char JSON_ALPHA[] = "{}[]\":, -.0123456789eEabcmnokrstuflx@\\\n\xC3\xA9\xE2\x82\xAC";

/* A vocabulary of random byte strings (1-7 bytes) over `alpha`, every single byte of the alphabet
 * also a token (so every document is reachable), one empty (special) token and one EOS. */
static grammar_token_trie *random_trie(const char *alpha, int32_t vocab, uint64_t *rng, uint8_t (*store)[8],
                                       uint32_t *lens, int32_t *eos) {
    const int na = (int)strlen(alpha);
    const uint8_t *ptrs[4096];
    for (int32_t i = 0; i < vocab; i++) {
        if (i < na) {
            store[i][0] = (uint8_t)alpha[i];
            lens[i] = 1;
        } else {
            lens[i] = 1 + (i % 3 ? test_rand_u32(rng) % 4 : test_rand_u32(rng) % 7);
            for (uint32_t k = 0; k < lens[i]; k++) store[i][k] = (uint8_t)alpha[test_rand_u32(rng) % na];
        }
        ptrs[i] = store[i];
    }
    lens[vocab - 2] = 0; /* a special token: never text */
    *eos = vocab - 1;
    lens[vocab - 1] = 0;
    grammar_token_trie *t = NULL;
    assert_nopad_ok(grammar_token_trie_create(ptrs, lens, vocab, eos, 1, &t));
    return t;
}

enum { BRUTE_VOCAB = 700 };

/* One random walk through g's masks, each mask checked token by token against the matcher fed
 * the token's bytes. The document into doc[0..*len) (NUL-terminated); 1 when it is whole. */
static int walk_checking_masks(const grammar *g, const grammar_token_trie *trie, uint8_t (*store)[8],
                               const uint32_t *lens, int32_t eos, uint64_t *rng, const char *label, char *doc,
                               size_t *len) {
    grammar_matcher *m = NULL;
    assert_nopad_ok(grammar_matcher_create(g, &m));
    uint32_t mask[(BRUTE_VOCAB + 31) / 32];
    *len = 0;
    for (int step = 0; step < 400; step++) {
        int32_t allowed = grammar_token_mask(trie, m, mask);
        int32_t count = 0, pick_non_eos[BRUTE_VOCAB], n_non_eos = 0;
        for (int32_t t = 0; t < BRUTE_VOCAB; t++) {
            int bit = (mask[t >> 5] >> (t & 31)) & 1;
            count += bit;
            int alive;
            if (t == eos) {
                alive = grammar_matcher_is_accepting(m);
            } else {
                grammar_mark mark = grammar_matcher_save(m);
                alive = lens[t] > 0 && grammar_matcher_accept_bytes(m, store[t], lens[t]);
                grammar_matcher_restore(m, mark);
            }
            if (bit != alive)
                fail_msg("%s step %d token %d (\"%.*s\"): mask %d, matcher %d after \"%.*s\"", label, step, t,
                         (int)lens[t], (const char *)store[t], bit, alive, (int)*len, doc);
            if (bit && t != eos) pick_non_eos[n_non_eos++] = t;
        }
        assert_int_equal(count, allowed);
        if (allowed == 0) fail_msg("%s: nothing allowed after \"%.*s\"", label, (int)*len, doc);
        int stop = grammar_matcher_is_accepting(m) &&
                   (n_non_eos == 0 || test_rand_u32(rng) % 3 == 0 || step > 200);
        if (stop) break;
        int32_t t = pick_non_eos[test_rand_u32(rng) % n_non_eos];
        assert_true(grammar_matcher_accept_token(m, trie, t));
        memcpy(doc + *len, store[t], lens[t]);
        *len += lens[t];
        if (step % 16 == 0) assert_nopad_ok(grammar_matcher_commit(m));
    }
    doc[*len] = 0;
    const int whole = grammar_matcher_is_accepting(m);
    grammar_matcher_free(m);
    return whole;
}

static void test_masks_brute_force(void **state) {
    (void)state;
    uint64_t rng = 0x6a09e667f3bcc909ull;
    static uint8_t store[BRUTE_VOCAB][8];
    uint32_t lens[BRUTE_VOCAB];
    int32_t eos;
    grammar_token_trie *trie = random_trie(JSON_ALPHA, BRUTE_VOCAB, &rng, store, lens, &eos);
    int documents = 0;
    for (size_t s = 0; s < sizeof(MASK_SCHEMAS) / sizeof(MASK_SCHEMAS[0]); s++) {
        grammar *g = schema_grammar(MASK_SCHEMAS[s]);
        char label[32];
        snprintf(label, sizeof label, "schema %zu", s);
        for (int walk = 0; walk < 12; walk++) {
            char doc[4096];
            size_t len;
            if (walk_checking_masks(g, trie, store, lens, eos, &rng, label, doc, &len)) {
                cJSON *parsed = cJSON_ParseWithLength(doc, len);
                if (!parsed) fail_msg("schema %zu: the walk's document does not parse: %s", s, doc);
                if (s == 0) { /* the required fields, with their bounds */
                    const cJSON *n = cJSON_GetObjectItemCaseSensitive(parsed, "n");
                    const cJSON *name = cJSON_GetObjectItemCaseSensitive(parsed, "name");
                    assert_true(cJSON_IsNumber(n) && n->valuedouble >= -20 && n->valuedouble <= 300);
                    assert_true(cJSON_IsString(name));
                }
                cJSON_Delete(parsed);
                documents++;
            }
        }
        grammar_free(g);
    }
    /* most walks end within their 400 steps */
    assert_true(documents >= 32);
    grammar_token_trie_free(trie);
}

/* The shared mask cache: two compilations of one schema (as two requests make them) share their
 * states' masks, and every mask through the cache equals the one computed without it, along
 * documents walked on the random vocabulary, a third schema's walk after them included (its
 * states may have the positions of schema 0's, never its fingerprint). */
static void test_shared_mask_cache(void **state) {
    (void)state;
    uint64_t rng = 0x3c6ef372fe94f82bull;
    static uint8_t store[BRUTE_VOCAB][8];
    uint32_t lens[BRUTE_VOCAB];
    int32_t eos;
    grammar_token_trie *trie = random_trie(JSON_ALPHA, BRUTE_VOCAB, &rng, store, lens, &eos);
    grammar_mask_cache *cache = NULL;
    assert_nopad_ok(grammar_mask_cache_create(trie, 64, &cache));
    grammar *g[3] = {schema_grammar(MASK_SCHEMAS[0]), schema_grammar(MASK_SCHEMAS[0]), schema_grammar(MASK_SCHEMAS[3])};
    uint32_t shared[(BRUTE_VOCAB + 31) / 32], plain[(BRUTE_VOCAB + 31) / 32];
    uint64_t hits_before = 0, misses = 0, hits = 0;
    for (int k = 0; k < 3; k++) {
        grammar_matcher *m = NULL, *ref = NULL;
        assert_nopad_ok(grammar_matcher_create(g[k], &m));
        assert_nopad_ok(grammar_matcher_create(g[k], &ref));
        uint64_t walk = 0x9e3779b97f4a7c15ull; /* the same walk for both copies of schema 0 */
        for (int step = 0; step < 60; step++) {
            const int32_t a = grammar_token_mask_shared(cache, m, shared), b = grammar_token_mask(trie, ref, plain);
            assert_int_equal(a, b);
            assert_memory_equal(shared, plain, sizeof shared);
            int32_t allowed_ids[BRUTE_VOCAB], n = 0;
            for (int32_t id = 0; id < BRUTE_VOCAB; id++)
                if (((plain[id >> 5] >> (id & 31)) & 1) && id != eos) allowed_ids[n++] = id;
            if (n == 0) break;
            walk = walk * 6364136223846793005ull + 1442695040888963407ull;
            const int32_t id = allowed_ids[(walk >> 33) % (uint64_t)n];
            assert_true(grammar_matcher_accept_token(m, trie, id) && grammar_matcher_accept_token(ref, trie, id));
            assert_nopad_ok(grammar_matcher_commit(m));
            assert_nopad_ok(grammar_matcher_commit(ref));
        }
        grammar_matcher_free(m);
        grammar_matcher_free(ref);
        grammar_mask_cache_counts(cache, &hits, &misses);
        if (k == 0) hits_before = hits;
        /* the second copy of schema 0 walks the first's states: every mask from the cache */
        if (k == 1) assert_true(hits - hits_before >= 30);
    }
    for (int k = 0; k < 3; k++) grammar_free(g[k]);
    grammar_mask_cache_free(cache);
    grammar_token_trie_free(trie);
}

/* ---- JSON sequences (tool calls) ------------------------------------------------------------ */

/* Two tools as Hermes calls: each schema {"name": const, "arguments": parameters}, the second
 * with its own $defs (resolved within that schema, not the first). */
static const char *const CALL_SCHEMAS[] = {
    "{\"type\":\"object\",\"properties\":{\"name\":{\"const\":\"get_weather\"},"
    "\"arguments\":{\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\",\"maxLength\":8},"
    "\"unit\":{\"enum\":[\"c\",\"f\"]}},\"required\":[\"city\"],\"additionalProperties\":false}},"
    "\"required\":[\"name\",\"arguments\"],\"additionalProperties\":false}",
    "{\"$defs\":{\"N\":{\"type\":\"integer\",\"minimum\":0,\"maximum\":99}},\"type\":\"object\","
    "\"properties\":{\"name\":{\"const\":\"add\"},\"arguments\":{\"type\":\"object\",\"properties\":"
    "{\"a\":{\"$ref\":\"#/$defs/N\"},\"b\":{\"$ref\":\"#/$defs/N\"}},\"required\":[\"a\",\"b\"],"
    "\"additionalProperties\":false}},\"required\":[\"name\",\"arguments\"],\"additionalProperties\":false}",
};
static const char HERMES_OPEN[] = "<tool_call>\n", HERMES_SEP[] = "\n</tool_call>\n<tool_call>\n",
                  HERMES_CLOSE[] = "\n</tool_call>";

static grammar *call_grammar(size_t n_schemas, int32_t min_count, int32_t max_count) {
    size_t lens[2] = {strlen(CALL_SCHEMAS[0]), strlen(CALL_SCHEMAS[1])};
    grammar *g = NULL;
    nopad_status st = grammar_from_json_sequence(CALL_SCHEMAS, lens, n_schemas, HERMES_OPEN, HERMES_SEP,
                                                 HERMES_CLOSE, min_count, max_count, &g);
    if (st != NOPAD_OK) fail_msg("json sequence: %s", nopad_last_error());
    return g;
}

#define WEATHER "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>"
#define ADD "<tool_call>\n{\"name\":\"add\",\"arguments\":{\"a\":1,\"b\":99}}\n</tool_call>"

static void test_json_sequence(void **state) {
    (void)state;
    /* one call, of either tool (tool_choice "required" without parallel calls) */
    grammar *g = call_grammar(2, 1, 1);
    assert_true(matches(g, WEATHER));
    assert_true(matches(g, ADD));
    assert_true(matches(g, "<tool_call>\n{\"name\":\"get_weather\",\"arguments\":{\"city\":\"\",\"unit\":\"f\"}}\n</tool_call>"));
    assert_false(matches(g, WEATHER "\n" ADD)); /* one at most */
    assert_false(matches(g, "")); /* one at least */
    assert_false(matches(g, "{\"name\":\"add\",\"arguments\":{\"a\":1,\"b\":2}}")); /* no markers */
    assert_false(matches(g, "<tool_call>\n{\"name\":\"add\",\"arguments\":{\"a\":1,\"b\":2}}</tool_call>"));
    assert_false(matches(g, "<tool_call>\n{\"name\":\"sub\",\"arguments\":{\"a\":1,\"b\":2}}\n</tool_call>"));
    assert_false(matches(g, "<tool_call>\n{\"name\":\"add\",\"arguments\":{\"a\":1,\"b\":100}}\n</tool_call>"));
    /* a tool's arguments are not another's */
    assert_false(matches(g, "<tool_call>\n{\"name\":\"add\",\"arguments\":{\"city\":\"Paris\"}}\n</tool_call>"));
    assert_false(matches(g, "<tool_call>\n{\"name\":\"get_weather\",\"arguments\":{\"city\":\"Parisienne\"}}\n</tool_call>"));
    grammar_free(g);

    /* a named function: exactly that one */
    g = call_grammar(1, 1, 1);
    assert_true(matches(g, WEATHER));
    assert_false(matches(g, ADD));
    grammar_free(g);

    /* parallel calls: one or more */
    g = call_grammar(2, 1, -1);
    assert_true(matches(g, ADD));
    assert_true(matches(g, WEATHER "\n" ADD "\n" WEATHER));
    assert_false(matches(g, WEATHER ADD)); /* the separator's newline */
    assert_false(matches(g, WEATHER "\n"));
    grammar_free(g);

    /* two to three */
    g = call_grammar(2, 2, 3);
    assert_false(matches(g, ADD));
    assert_true(matches(g, ADD "\n" ADD));
    assert_true(matches(g, ADD "\n" ADD "\n" WEATHER));
    assert_false(matches(g, ADD "\n" ADD "\n" WEATHER "\n" ADD));
    grammar_free(g);

    /* a Mistral-style list: bare JSON framing */
    size_t len0 = strlen(CALL_SCHEMAS[1]);
    assert_nopad_ok(grammar_from_json_sequence(&CALL_SCHEMAS[1], &len0, 1, "[", ", ", "]", 1, -1, &g));
    assert_true(matches(g, "[{\"name\":\"add\",\"arguments\":{\"a\":1,\"b\":2}}]"));
    assert_true(matches(g, "[{\"name\":\"add\",\"arguments\":{\"a\":1,\"b\":2}}, {\"name\": \"add\", \"arguments\": {\"a\": 3, \"b\": 4}}]"));
    assert_false(matches(g, "[]"));
    grammar_free(g);

    /* refusals: the schema's keyword named with the schema's index; bad counts */
    const char *bad[] = {CALL_SCHEMAS[0], "{\"type\":\"integer\",\"multipleOf\":2}"};
    size_t bad_lens[] = {strlen(bad[0]), strlen(bad[1])};
    g = NULL;
    assert_int_equal(grammar_from_json_sequence(bad, bad_lens, 2, "", ",", "", 1, 1, &g), NOPAD_ERR_UNSUPPORTED);
    assert_null(g);
    if (!strstr(nopad_last_error(), "schemas[1]: keyword \"multipleOf\" is not supported"))
        fail_msg("error: %s", nopad_last_error());
    assert_int_equal(grammar_from_json_sequence(bad, bad_lens, 1, "", ",", "", 0, 1, &g), NOPAD_ERR_INVALID_ARGUMENT);
    assert_int_equal(grammar_from_json_sequence(bad, bad_lens, 1, "", ",", "", 3, 2, &g), NOPAD_ERR_INVALID_ARGUMENT);
    assert_int_equal(grammar_from_json_sequence(bad, bad_lens, 0, "", ",", "", 1, 1, &g), NOPAD_ERR_INVALID_ARGUMENT);
    const char *not_json = "{\"type\":";
    size_t not_json_len = strlen(not_json);
    assert_int_equal(grammar_from_json_sequence(&not_json, &not_json_len, 1, "", ",", "", 1, 1, &g),
                     NOPAD_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(nopad_last_error(), "schemas[0]: not valid JSON"));
    assert_null(g);
}

/* The masks of call sequences against brute force on a random vocabulary that holds the
 * framing's bytes; every whole walk is calls whose JSON parses and names one of the tools. */
static void test_json_sequence_masks_brute_force(void **state) {
    (void)state;
    uint64_t rng = 0xbb67ae8584caa73bull;
    static uint8_t store[BRUTE_VOCAB][8];
    uint32_t lens[BRUTE_VOCAB];
    int32_t eos;
    char alpha[128];
    snprintf(alpha, sizeof alpha, "%s<>/_gwhdiy", JSON_ALPHA);
    grammar_token_trie *trie = random_trie(alpha, BRUTE_VOCAB, &rng, store, lens, &eos);
    const int32_t counts[][2] = {{1, 1}, {1, -1}, {2, 3}};
    int documents = 0, calls = 0;
    for (size_t c = 0; c < sizeof(counts) / sizeof(counts[0]); c++) {
        grammar *g = call_grammar(2, counts[c][0], counts[c][1]);
        char label[48];
        snprintf(label, sizeof label, "calls {%d,%d}", counts[c][0], counts[c][1]);
        for (int walk = 0; walk < 10; walk++) {
            char doc[4096];
            size_t len;
            if (!walk_checking_masks(g, trie, store, lens, eos, &rng, label, doc, &len)) continue;
            documents++;
            int n = 0;
            for (const char *p = doc; (p = strstr(p, HERMES_OPEN)); n++) {
                p += strlen(HERMES_OPEN);
                const char *end = strstr(p, HERMES_CLOSE);
                assert_non_null(end);
                cJSON *call = cJSON_ParseWithLength(p, (size_t)(end - p));
                if (!call) fail_msg("%s: a call that does not parse in %s", label, doc);
                const cJSON *name = cJSON_GetObjectItemCaseSensitive(call, "name");
                assert_true(cJSON_IsString(name));
                assert_true(!strcmp(name->valuestring, "get_weather") || !strcmp(name->valuestring, "add"));
                assert_true(cJSON_IsObject(cJSON_GetObjectItemCaseSensitive(call, "arguments")));
                cJSON_Delete(call);
            }
            assert_true(n >= counts[c][0]);
            if (counts[c][1] > 0) assert_true(n <= counts[c][1]);
            calls += n;
        }
        grammar_free(g);
    }
    assert_true(documents >= 10);
    assert_true(calls > documents); /* some walks made several calls */
    grammar_token_trie_free(trie);
}

/* The mask time on SmolLM2's vocabulary (49,152 tokens) for a 10-field schema, at positions
 * inside a key, a string value, a number and between fields. Printed, not bounded. Timed as the
 * thread's CPU time, which the other processes sharing the machine's cores disturb less than
 * wall time (they still share its caches). */
static void test_smollm2_mask_time(void **state) {
    (void)state;
    const char *path = getenv("NOPAD_SMOLLM2_GGUF");
    FILE *f = path ? fopen(path, "rb") : NULL;
    if (!f) {
        fprintf(stderr, "SmolLM2 GGUF absent ($NOPAD_SMOLLM2_GGUF): mask timing skipped\n");
        skip();
    }
    fclose(f);
    nopad_tokenizer *tok = NULL;
    assert_nopad_ok(nopad_tokenizer_load(path, &tok));
    int32_t eos = nopad_tokenizer_token_to_id(tok, "<|im_end|>");
    assert_true(eos >= 0);
    grammar_token_trie *trie = NULL;
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    assert_nopad_ok(grammar_token_trie_from_tokenizer(tok, &eos, 1, &trie));
    clock_gettime(CLOCK_MONOTONIC, &t1);
    fprintf(stderr, "SmolLM2 trie: %.1f ms\n", (t1.tv_sec - t0.tv_sec) * 1e3 + (t1.tv_nsec - t0.tv_nsec) / 1e6);
    /* " {" and "\":" are tokens the model writes JSON with: the vocabulary decodes to real bytes */
    int32_t vocab = grammar_token_trie_vocab_size(trie);
    assert_int_equal(vocab, 49152);
    const char *schema =
        "{\"type\":\"object\",\"properties\":{"
        "\"id\":{\"type\":\"string\",\"format\":\"uuid\"},\"name\":{\"type\":\"string\",\"maxLength\":40},"
        "\"email\":{\"type\":\"string\",\"format\":\"email\"},\"age\":{\"type\":\"integer\",\"minimum\":0,\"maximum\":130},"
        "\"score\":{\"type\":\"number\"},\"active\":{\"type\":\"boolean\"},"
        "\"role\":{\"enum\":[\"admin\",\"user\",\"guest\"]},\"tags\":{\"type\":\"array\",\"items\":{\"type\":\"string\"},\"maxItems\":5},"
        "\"born\":{\"type\":\"string\",\"format\":\"date\"},"
        "\"address\":{\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\"},\"zip\":{\"type\":\"string\",\"pattern\":\"^[0-9]{5}$\"}},"
        "\"required\":[\"city\",\"zip\"],\"additionalProperties\":false}},"
        "\"required\":[\"id\",\"name\",\"email\",\"age\",\"score\",\"active\",\"role\",\"tags\",\"born\",\"address\"],"
        "\"additionalProperties\":false}";
    grammar *g = schema_grammar(schema);
    const char *doc =
        "{\"id\": \"123e4567-e89b-12d3-a456-426614174000\", \"name\": \"Ada Lovelace\", \"email\": \"ada@ex.org\", "
        "\"age\": 36, \"score\": 9.5, \"active\": true, \"role\": \"admin\", \"tags\": [\"math\", \"poet\"], "
        "\"born\": \"1815-12-10\", \"address\": {\"city\": \"London\", \"zip\": \"12345\"}}";
    struct {
        const char *label;
        const char *after; /* the prefix of doc the mask is taken after */
    } points[] = {
        {"start", ""},
        {"in a key", "{\"id\": \"123e4567-e89b-12d3-a456-426614174000\", \"na"},
        {"in a free string", "{\"id\": \"123e4567-e89b-12d3-a456-426614174000\", \"name\": \"Ada Lo"},
        {"in a uuid", "{\"id\": \"123e45"},
        {"in a number", "{\"id\": \"123e4567-e89b-12d3-a456-426614174000\", \"name\": \"Ada Lovelace\", \"email\": "
                        "\"ada@ex.org\", \"age\": 36, \"score\": 9"},
        {"after a value", "{\"id\": \"123e4567-e89b-12d3-a456-426614174000\", \"name\": \"Ada Lovelace\", \"email\": "
                          "\"ada@ex.org\", \"age\": 36, \"score\": 9.5, \"active\": true"},
        {"in an array", "{\"id\": \"123e4567-e89b-12d3-a456-426614174000\", \"name\": \"Ada Lovelace\", \"email\": "
                        "\"ada@ex.org\", \"age\": 36, \"score\": 9.5, \"active\": true, \"role\": \"admin\", "
                        "\"tags\": [\"math\", \"po"},
        /* a domain label's first character: a state the walk reaches by a detour, that then loops */
        {"after an email's dot", "{\"id\": \"123e4567-e89b-12d3-a456-426614174000\", \"name\": \"Ada Lovelace\", "
                                 "\"email\": \"ada@ex."},
    };
    uint32_t *mask = malloc(((size_t)vocab + 31) / 32 * sizeof(uint32_t));
    for (size_t p = 0; p < sizeof(points) / sizeof(points[0]); p++) {
        assert_true(!strncmp(doc, points[p].after, strlen(points[p].after)));
        /* computed: a new matcher each time (its kept masks empty); kept: the same state again */
        int32_t allowed = 0;
        const int reps = 20;
        double us = 0, kept_us = 0;
        for (int r = 0; r < reps; r++) {
            grammar_matcher *m = NULL;
            assert_nopad_ok(grammar_matcher_create(g, &m));
            assert_true(grammar_matcher_accept_bytes(m, (const uint8_t *)points[p].after, strlen(points[p].after)));
            clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t0);
            allowed = grammar_token_mask(trie, m, mask);
            clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t1);
            us += ((t1.tv_sec - t0.tv_sec) * 1e6 + (t1.tv_nsec - t0.tv_nsec) / 1e3) / reps;
            clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t0);
            assert_int_equal(grammar_token_mask(trie, m, mask), allowed);
            clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t1);
            kept_us += ((t1.tv_sec - t0.tv_sec) * 1e6 + (t1.tv_nsec - t0.tv_nsec) / 1e3) / reps;
            assert_int_equal(grammar_matcher_kept_hits(m), 1);
            grammar_matcher_free(m);
        }
        fprintf(stderr, "SmolLM2 mask %-20s %8.1f us CPU computed, %5.1f us kept  %6d tokens allowed\n",
                points[p].label, us, kept_us, allowed);
        /* the mask against every token tried alone (the walk's shortcuts on a real vocabulary) */
        grammar_matcher *m = NULL;
        assert_nopad_ok(grammar_matcher_create(g, &m));
        assert_true(grammar_matcher_accept_bytes(m, (const uint8_t *)points[p].after, strlen(points[p].after)));
        assert_nopad_ok(grammar_matcher_commit(m));
        int32_t wrong = 0;
        for (int32_t id = 0; id < vocab; id++) {
            uint32_t len = 0;
            const uint8_t *bytes = grammar_token_trie_token(trie, id, &len);
            const grammar_mark before = grammar_matcher_save(m);
            const int ok = id == eos ? grammar_matcher_is_accepting(m)
                                     : len > 0 && grammar_matcher_accept_bytes(m, bytes, len);
            grammar_matcher_restore(m, before);
            if (ok != (int)((mask[id >> 5] >> (id & 31)) & 1) && wrong++ < 3)
                fprintf(stderr, "  %s: token %d: mask %d, matcher %d\n", points[p].label, id, !ok, ok);
        }
        grammar_matcher_free(m);
        assert_int_equal(wrong, 0);
        /* the token the document continues with is allowed */
        assert_true(allowed > 0);
    }
    /* the whole document, token by token as the tokenizer splits it: every token allowed */
    int32_t ids[512], n_ids = 0;
    nopad_tokenize_params tp = nopad_tokenize_default_params();
    tp.add_special_tokens = 0;
    assert_nopad_ok(nopad_tokenize(tok, doc, strlen(doc), &tp, ids, 512, &n_ids));
    grammar_matcher *m = NULL;
    assert_nopad_ok(grammar_matcher_create(g, &m));
    double total_us = 0, max_us = 0, accept_us = 0;
    int32_t max_at = 0;
    const size_t words = ((size_t)vocab + 31) / 32;
    uint32_t *fresh_mask = malloc(words * sizeof(uint32_t));
    uint8_t prefix[4096];
    size_t prefix_len = 0;
    for (int32_t i = 0; i < n_ids; i++) {
        clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t0);
        const int32_t allowed = grammar_token_mask(trie, m, mask);
        clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t1);
        const double us = (t1.tv_sec - t0.tv_sec) * 1e6 + (t1.tv_nsec - t0.tv_nsec) / 1e3;
        total_us += us;
        if (us > max_us) max_us = us, max_at = i;
        if (!((mask[ids[i] >> 5] >> (ids[i] & 31)) & 1)) fail_msg("token %d of the document refused", i);
        /* a kept mask equals the one a new matcher computes from the same bytes */
        grammar_matcher *fresh = NULL;
        assert_nopad_ok(grammar_matcher_create(g, &fresh));
        assert_true(grammar_matcher_accept_bytes(fresh, prefix, prefix_len));
        assert_int_equal(grammar_token_mask(trie, fresh, fresh_mask), allowed);
        if (memcmp(fresh_mask, mask, words * sizeof(uint32_t)) != 0) fail_msg("token %d: the kept mask differs", i);
        grammar_matcher_free(fresh);
        uint32_t len = 0;
        const uint8_t *bytes = grammar_token_trie_token(trie, ids[i], &len);
        assert_true(prefix_len + len <= sizeof prefix);
        memcpy(prefix + prefix_len, bytes, len);
        prefix_len += len;
        clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t0);
        assert_true(grammar_matcher_accept_token(m, trie, ids[i]));
        assert_nopad_ok(grammar_matcher_commit(m));
        clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t1);
        accept_us += (t1.tv_sec - t0.tv_sec) * 1e6 + (t1.tv_nsec - t0.tv_nsec) / 1e3;
    }
    grammar_token_mask(trie, m, mask);
    assert_true((mask[eos >> 5] >> (eos & 31)) & 1);
    fprintf(stderr, "SmolLM2 accepting a token and committing: mean %.2f us CPU\n", accept_us / n_ids);
    /* the name's and the tags' free characters come back to their states */
    const uint64_t hits = grammar_matcher_kept_hits(m);
    assert_true(hits > 0);
    fprintf(stderr, "SmolLM2 mask over the document's %d tokens: mean %.1f us CPU, the slowest %.1f us (before "
            "token %d), %llu of them kept masks\n", n_ids, total_us / n_ids, max_us, max_at, (unsigned long long)hits);
    free(fresh_mask);
    grammar_matcher_free(m);
    free(mask);
    grammar_free(g);
    grammar_token_trie_free(trie);
    nopad_tokenizer_free(tok);
}

/* ---- the Python test's entry points ----------------------------------------------------------- */

static nopad_status case_grammar(const cJSON *c, grammar **g) {
    const cJSON *schema = cJSON_GetObjectItemCaseSensitive(c, "schema");
    const cJSON *regex = cJSON_GetObjectItemCaseSensitive(c, "regex");
    const cJSON *choices = cJSON_GetObjectItemCaseSensitive(c, "choices");
    if (schema) {
        char *text = cJSON_PrintUnformatted(schema);
        nopad_status st = grammar_from_json_schema(text, strlen(text), g);
        free(text);
        return st;
    }
    if (regex) return grammar_from_regex(regex->valuestring, strlen(regex->valuestring), g);
    if (choices) {
        int n = cJSON_GetArraySize(choices);
        const char *texts[256];
        size_t lens[256];
        for (int i = 0; i < n && i < 256; i++) {
            texts[i] = cJSON_GetArrayItem(choices, i)->valuestring;
            lens[i] = strlen(texts[i]);
        }
        return grammar_from_choices(texts, lens, (size_t)(n < 256 ? n : 256), g);
    }
    return grammar_any_json_object(g);
}

static int run_cases(int argc, char **argv) {
    size_t len;
    char *text = test_read_file(argv[2], &len);
    cJSON *cases = text ? cJSON_ParseWithLength(text, len) : NULL;
    free(text);
    if (!cases) {
        fprintf(stderr, "%s: unreadable cases\n", argv[2]);
        return 2;
    }
    int generate = !strcmp(argv[1], "--generate");
    long per_case = generate && argc > 3 ? atol(argv[3]) : 0;
    uint64_t rng = generate && argc > 4 ? strtoull(argv[4], NULL, 10) : 1;
    for (const cJSON *c = cases->child; c; c = c->next) {
        grammar *g = NULL;
        if (case_grammar(c, &g) != NOPAD_OK) {
            printf("ERR %s\n", nopad_last_error());
            continue;
        }
        grammar_matcher *m = NULL;
        if (grammar_matcher_create(g, &m) != NOPAD_OK) return 2;
        if (generate) {
            static char doc[8192];
            for (long k = 0; k < per_case; k++) {
                long n = -1;
                for (int attempt = 0; attempt < 20 && n < 0; attempt++) {
                    grammar_matcher_reset(m);
                    n = random_walk(m, doc, sizeof(doc), 200, &rng);
                }
                cJSON *s = cJSON_CreateString(n >= 0 ? doc : "");
                char *line = cJSON_PrintUnformatted(s);
                printf("%s\n", n >= 0 ? line : "null");
                free(line);
                cJSON_Delete(s);
            }
        } else {
            const cJSON *docs = cJSON_GetObjectItemCaseSensitive(c, "docs");
            for (const cJSON *d = docs ? docs->child : NULL; d; d = d->next) {
                grammar_matcher_reset(m);
                int ok = grammar_matcher_accept_bytes(m, (const uint8_t *)d->valuestring, strlen(d->valuestring)) &&
                         grammar_matcher_is_accepting(m);
                putchar(ok ? '1' : '0');
            }
            putchar('\n');
        }
        grammar_matcher_free(m);
        grammar_free(g);
    }
    cJSON_Delete(cases);
    return 0;
}

int main(int argc, char **argv) {
    if (argc > 2 && (!strcmp(argv[1], "--check") || !strcmp(argv[1], "--generate"))) return run_cases(argc, argv);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_objects),
        cmocka_unit_test(test_types_enums_unions),
        cmocka_unit_test(test_strings),
        cmocka_unit_test(test_regex_choices_json_object),
        cmocka_unit_test(test_refused),
        cmocka_unit_test(test_degenerate_grammars),
        cmocka_unit_test(test_masks_brute_force),
        cmocka_unit_test(test_json_sequence),
        cmocka_unit_test(test_json_sequence_masks_brute_force),
        cmocka_unit_test(test_shared_mask_cache),
        cmocka_unit_test(test_smollm2_mask_time),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
