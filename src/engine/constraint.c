/* nopad_constraint: a grammar with a reference count (the caller's and each running request's),
 * so a caller may free it while requests that use it still run. */
#include "engine/constraint.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "util/error.h"

struct nopad_constraint {
    grammar *g;
    atomic_int refs;
};

/* c->g = *g once compiled (st): the grammar is passed by address, so that it is read after the
 * call that fills it (a function's arguments are evaluated in no set order). */
static nopad_status wrap(nopad_status st, grammar **compiled, nopad_constraint **out) {
    if (st != NOPAD_OK) return st;
    grammar *g = *compiled;
    nopad_constraint *c = malloc(sizeof *c);
    if (!c) {
        grammar_free(g);
        return nopad_set_error(NOPAD_ERR_OUT_OF_MEMORY, "nopad_constraint: out of memory");
    }
    c->g = g;
    atomic_init(&c->refs, 1);
    *out = c;
    return NOPAD_OK;
}

nopad_status nopad_constraint_json_schema(const char *schema, size_t len, nopad_constraint **out) {
    if (!out) return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT, "nopad_constraint_json_schema: out is NULL");
    *out = NULL;
    if (!schema) return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT, "nopad_constraint_json_schema: schema is NULL");
    grammar *g = NULL;
    const nopad_status st = grammar_from_json_schema(schema, len, &g);
    return wrap(st, &g, out);
}

nopad_status nopad_constraint_json_object(nopad_constraint **out) {
    if (!out) return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT, "nopad_constraint_json_object: out is NULL");
    *out = NULL;
    grammar *g = NULL;
    const nopad_status st = grammar_any_json_object(&g);
    return wrap(st, &g, out);
}

nopad_status nopad_constraint_regex(const char *pattern, size_t len, nopad_constraint **out) {
    if (!out) return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT, "nopad_constraint_regex: out is NULL");
    *out = NULL;
    if (!pattern) return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT, "nopad_constraint_regex: pattern is NULL");
    grammar *g = NULL;
    const nopad_status st = grammar_from_regex(pattern, len, &g);
    return wrap(st, &g, out);
}

nopad_status nopad_constraint_choices(const char *const *choices, int32_t n, nopad_constraint **out) {
    if (!out) return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT, "nopad_constraint_choices: out is NULL");
    *out = NULL;
    if (!choices || n < 1)
        return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT, "nopad_constraint_choices: %d choices; at least 1", n);
    size_t *lens = malloc((size_t)n * sizeof *lens);
    if (!lens) return nopad_set_error(NOPAD_ERR_OUT_OF_MEMORY, "nopad_constraint_choices: out of memory");
    nopad_status st = NOPAD_OK;
    for (int32_t i = 0; i < n && st == NOPAD_OK; i++) {
        if (!choices[i]) st = nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT, "nopad_constraint_choices: choice %d is NULL", i);
        else lens[i] = strlen(choices[i]);
    }
    grammar *g = NULL;
    if (st == NOPAD_OK) st = grammar_from_choices(choices, lens, (size_t)n, &g);
    free(lens);
    return wrap(st, &g, out);
}

nopad_status nopad_constraint_json_sequence(const char *const *schemas, int32_t n_schemas, const char *open,
                                            const char *separator, const char *close, int32_t min_count,
                                            int32_t max_count, nopad_constraint **out) {
    if (!out) return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT, "nopad_constraint_json_sequence: out is NULL");
    *out = NULL;
    if (!schemas || n_schemas < 1)
        return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT, "nopad_constraint_json_sequence: %d schemas; at least 1",
                               n_schemas);
    if (!open || !separator || !close)
        return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT,
                               "nopad_constraint_json_sequence: open, separator and close must be texts (\"\" for none)");
    size_t *lens = malloc((size_t)n_schemas * sizeof *lens);
    if (!lens) return nopad_set_error(NOPAD_ERR_OUT_OF_MEMORY, "nopad_constraint_json_sequence: out of memory");
    nopad_status st = NOPAD_OK;
    for (int32_t i = 0; i < n_schemas && st == NOPAD_OK; i++) {
        if (!schemas[i]) st = nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT, "nopad_constraint_json_sequence: schema %d is NULL", i);
        else lens[i] = strlen(schemas[i]);
    }
    grammar *g = NULL;
    if (st == NOPAD_OK)
        st = grammar_from_json_sequence(schemas, lens, (size_t)n_schemas, open, separator, close, min_count,
                                        max_count, &g);
    free(lens);
    return wrap(st, &g, out);
}

const grammar *constraint_grammar(const nopad_constraint *c) { return c->g; }

void constraint_ref(const nopad_constraint *c) {
    atomic_fetch_add(&((nopad_constraint *)c)->refs, 1);
}

void constraint_unref(const nopad_constraint *c) {
    if (!c) return;
    nopad_constraint *m = (nopad_constraint *)c;
    if (atomic_fetch_sub(&m->refs, 1) == 1) {
        grammar_free(m->g);
        free(m);
    }
}

void nopad_constraint_free(nopad_constraint *constraint) { constraint_unref(constraint); }
