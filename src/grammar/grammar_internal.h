/* What the grammar's compilers (json_schema.c, regex.c) and its matcher share: the builder of
 * rules and the compiled form. */
#ifndef NOPAD_GRAMMAR_GRAMMAR_INTERNAL_H
#define NOPAD_GRAMMAR_GRAMMAR_INTERNAL_H

#include <stdint.h>

#include "grammar/grammar.h"

/* ---- the compiled grammar -----------------------------------------------------------------------
 * elems: every alternative of every rule, back to back, each closed by GRAM_END. An element is
 * kind (low 2 bits) | payload << 2: GRAM_CHAR payload = byte set id, GRAM_REF payload = rule id,
 * GRAM_REPEAT payload = the id of a repetition rule (repeat[id]: body{min,max}), which the
 * matcher runs with a count in the stack node. */
enum { GRAM_END = 0, GRAM_CHAR = 1, GRAM_REF = 2, GRAM_REPEAT = 3 };

typedef struct grammar_repeat {
    uint32_t body;     /* the repeated rule */
    uint32_t min, max; /* max UINT32_MAX: unbounded */
} grammar_repeat;
#define GRAM_KIND(e) ((e) & 3u)
#define GRAM_ARG(e) ((e) >> 2)

struct grammar {
    uint32_t *elems;
    uint32_t n_elems;
    uint32_t (*sets)[8];   /* 256-bit byte sets: bit b of word b / 32 */
    uint32_t n_sets;
    uint32_t *alt_start;   /* elems index of each alternative's first element */
    uint32_t *rule_alt0;   /* rule r's alternatives: alt_start[rule_alt0[r] .. rule_alt0[r + 1]) */
    uint32_t n_rules;
    grammar_repeat *repeat; /* by rule id; meaningful for the rules GRAM_REPEAT names */
    uint32_t root;
    /* a hash of all the above: two compilations of one schema are equal grammars, whose equal
     * states share masks (grammar_mask_cache) */
    uint64_t fingerprint;
};

/* ---- the builder ----------------------------------------------------------------------------------
 * A symbol is a rule (>= 0) or a byte set (GB_SET(id) < 0). Builder calls never fail on their own:
 * an allocation failure or the size limit sets `status` and later calls return placeholders, so
 * the compilers check once, in gb_finish. */
#define GB_SET(id) (-(int32_t)(id) - 2)
#define GB_IS_SET(sym) ((sym) <= -2)
#define GB_SET_ID(sym) ((uint32_t)(-(sym) - 2))
#define GB_ALT INT32_MIN /* separates alternatives inside a rule's symbol list */

typedef struct gb_rule {
    int32_t *syms; /* alternatives separated by GB_ALT */
    uint32_t n, cap;
    uint32_t n_alts;
    int is_repeat; /* a counted repetition of rep_body, no alternatives of its own */
    int32_t rep_body;
    uint32_t rep_min, rep_max;
    /* made by gb_star / gb_opt (of `inner`): a star or option of one is itself or a star, so
     * stacked and nested quantifiers ("a**", "((a*)?)*") stay one rule instead of nested
     * nullable loops, which the matcher expands at a cost that grows with their depth */
    enum { GB_PLAIN, GB_STAR, GB_OPT } shape;
    int32_t inner;
} gb_rule;

typedef struct gram_builder {
    uint32_t (*sets)[8];
    uint32_t n_sets, cap_sets;
    gb_rule *rules;
    uint32_t n_rules, cap_rules;
    size_t total;        /* symbols in all rules: the size limit */
    nopad_status status; /* NOPAD_OK until something failed */
    int32_t ws;          /* the optional whitespace between JSON tokens (0 until first asked) */
    int32_t json_unit, any_value, string_rule, utf8_char;
} gram_builder;

/* The most symbols a grammar may hold: bounds the memory and compile time a request can take. */
#define GRAMMAR_MAX_SYMBOLS (1u << 20)
/* The largest repetition bound (maxLength, maxItems, a regex's {m,n}): counts stay far from
 * overflow. */
#define GRAMMAR_MAX_COUNT 1000000000u

void gb_init(gram_builder *b);
void gb_discard(gram_builder *b);
/* The grammar whose start is `root`; frees the builder. On failure the builder's status (its
 * message set where it failed). */
nopad_status gb_finish(gram_builder *b, int32_t root, grammar **out);
/* Marks the builder failed with a message (the first failure wins); returns the status. */
nopad_status gb_fail(gram_builder *b, nopad_status status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

int32_t gb_set(gram_builder *b, const uint32_t set[8]);
int32_t gb_byte(gram_builder *b, uint8_t byte);
int32_t gb_range(gram_builder *b, uint8_t lo, uint8_t hi);
/* A new rule with no alternatives yet (for recursion), and adding one. */
int32_t gb_rule_new(gram_builder *b);
void gb_rule_add(gram_builder *b, int32_t rule, const int32_t *syms, uint32_t n);
/* New rules from parts: one sequence, a choice of single symbols, x?, x*, x+, x{min,max} (max < 0:
 * unbounded), a literal byte string. */
int32_t gb_seq(gram_builder *b, const int32_t *syms, uint32_t n);
int32_t gb_choice(gram_builder *b, const int32_t *syms, uint32_t n);
int32_t gb_opt(gram_builder *b, int32_t x);
int32_t gb_star(gram_builder *b, int32_t x);
int32_t gb_repeat(gram_builder *b, int32_t x, int64_t min, int64_t max);
int32_t gb_literal(gram_builder *b, const char *bytes, size_t n);
int32_t gb_empty(gram_builder *b);

/* JSON's pieces (json_schema.c and the regex's JSON-string mode share them). */
int32_t gb_ws(gram_builder *b);          /* at most one space or newline */
int32_t gb_utf8_char(gram_builder *b);   /* one well-formed non-ASCII UTF-8 character */
int32_t gb_json_unit(gram_builder *b);   /* one character of a JSON string's content */
int32_t gb_json_string(gram_builder *b); /* a whole JSON string, quotes included */
int32_t gb_json_number(gram_builder *b); /* any JSON number (bounded digit counts) */
int32_t gb_any_value(gram_builder *b);   /* any JSON value */

/* A regex (the subset of docs/grammar.md) to a symbol. json_string = 1: the pattern constrains a
 * JSON string's decoded content, so the symbol spells its characters as JSON does (escaping " \
 * and controls) and, unless anchored by ^ / $, any content may come before / after the match
 * (JSON Schema's search semantics); json_string = 0: raw bytes, the whole output matches. */
int32_t gb_regex(gram_builder *b, const char *pattern, size_t len, int json_string,
                 const char *where);

/* 1 when the current state has the same stacks (by content, in the same order) as the state
 * saved at `mark` on the current path: every byte then does the same in both. */
int grammar_matcher_same_state(const grammar_matcher *m, grammar_mark mark);
/* After steps from the state at `mark`: 1 when the current state is that one with a single
 * counted repetition further by *delta >= 1 (a bounded string's characters), *counter naming
 * that repetition's node in the marked state and *slack how far its count may go from there
 * (in steps of one) before the repetition's bounds change what may follow. */
int grammar_matcher_counted_step(const grammar_matcher *m, grammar_mark mark, uint32_t *counter,
                                 uint32_t *slack, uint32_t *delta);
/* The current state's stacks as positions (each stack's positions from the top down, then
 * UINT32_MAX) into key[cap]: the length, or 0 when it does not fit. Equal keys mean equal
 * states. */
uint32_t grammar_matcher_state_key(const grammar_matcher *m, uint32_t *key, uint32_t cap);

/* The matcher keeps the masks of its last few states (each of `words` words, over the vocabulary
 * `trie`): equal states have equal masks, and a free string's characters lead back to the state
 * they started from. find: 1 and mask / *allowed filled when the current state's mask is kept;
 * put: keeps it (the least recently used entry goes). Out of memory only stops the keeping. */
int grammar_matcher_kept_find(grammar_matcher *m, const void *trie, uint32_t *mask, size_t words, int32_t *allowed);
void grammar_matcher_kept_put(grammar_matcher *m, const void *trie, const uint32_t *mask, size_t words,
                            int32_t allowed);
/* How many masks came from the kept ones (for the tests). */
uint64_t grammar_matcher_kept_hits(const grammar_matcher *m);
/* The grammar a matcher runs. */
const grammar *grammar_matcher_grammar(const grammar_matcher *m);

#endif
