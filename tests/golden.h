/* Reading golden fixtures (safetensors written by scripts/make_*_fixtures.py) in tests. */
#ifndef NOPAD_TESTS_GOLDEN_H
#define NOPAD_TESTS_GOLDEN_H

#include <stdlib.h>
#include <string.h>

#include "io/safetensors.h"
#include "testutil.h"

/* Copies tensor `name` of `f` (which must have dtype `dtype`) into a fresh malloc'd buffer;
 * *n receives its element count. Fails the test when absent. */
static inline void *golden_copy(const safetensors_file *f, const char *name,
                                safetensors_dtype dtype, int64_t *n) {
    const safetensors_tensor *t = safetensors_find(f, name);
    if (!t) fail_msg("%s: fixture tensor '%s' missing", f->path ? f->path : "?", name);
    assert_int_equal(t->dtype, dtype);
    void *buf = malloc(t->nbytes ? t->nbytes : 1);
    assert_non_null(buf);
    memcpy(buf, t->data, t->nbytes);
    if (n) *n = t->n_elements;
    return buf;
}

static inline int golden_has(const safetensors_file *f, const char *name) {
    return safetensors_find(f, name) != NULL;
}

#endif
