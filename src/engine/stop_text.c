/* Stop strings: the held tail is the shortest suffix that could still grow into a stop string,
 * so a stop string, once complete, begins inside the held text (everything before it was released
 * only because no stop string could begin there). */
#include "engine/stop_text.h"

#include <stdlib.h>
#include <string.h>

#include "util/error.h"

nopad_status stop_text_init(stop_text *s, const char *const *strings, int32_t n) {
    memset(s, 0, sizeof *s);
    if (n == 0) return NOPAD_OK;
    s->strings = calloc((size_t)n, sizeof *s->strings);
    s->lengths = calloc((size_t)n, sizeof *s->lengths);
    if (!s->strings || !s->lengths) {
        stop_text_free(s);
        return nopad_set_error(NOPAD_ERR_OUT_OF_MEMORY, "stop strings: out of memory");
    }
    for (int32_t i = 0; i < n; i++) {
        if (!strings[i] || !strings[i][0]) {
            stop_text_free(s);
            return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT,
                                   "stop string %d is %s (a stop string needs at least one byte)",
                                   i, strings[i] ? "empty" : "NULL");
        }
        s->strings[i] = strdup(strings[i]);
        s->n = i + 1;
        if (!s->strings[i]) {
            stop_text_free(s);
            return nopad_set_error(NOPAD_ERR_OUT_OF_MEMORY, "stop strings: out of memory");
        }
        s->lengths[i] = strlen(strings[i]);
    }
    return NOPAD_OK;
}

void stop_text_free(stop_text *s) {
    for (int32_t i = 0; i < s->n; i++) free(s->strings[i]);
    free(s->strings);
    free(s->lengths);
    free(s->held);
    free(s->out);
    memset(s, 0, sizeof *s);
}

static int grow(char **buf, size_t *cap, size_t need) {
    if (need <= *cap) return 0;
    size_t c = *cap ? *cap : 64;
    while (c < need) c *= 2;
    char *b = realloc(*buf, c);
    if (!b) return -1;
    *buf = b;
    *cap = c;
    return 0;
}

/* Moves held[0, n) to out and keeps the rest held. */
static int release(stop_text *s, size_t n, const char **out, size_t *out_len) {
    if (grow(&s->out, &s->out_cap, n + 1)) return -1;
    if (n) memcpy(s->out, s->held, n);
    s->out[n] = '\0';
    if (n && s->held_len > n) memmove(s->held, s->held + n, s->held_len - n);
    s->held_len -= n;
    *out = s->out;
    *out_len = n;
    return 0;
}

/* Does held[p ..] begin some stop string (and is shorter than it)? */
static int may_begin_stop(const stop_text *s, size_t p) {
    const size_t tail = s->held_len - p;
    for (int32_t i = 0; i < s->n; i++)
        if (tail < s->lengths[i] && memcmp(s->held + p, s->strings[i], tail) == 0) return 1;
    return 0;
}

int stop_text_add(stop_text *s, const char *piece, size_t len, const char **out, size_t *out_len) {
    if (grow(&s->held, &s->held_cap, s->held_len + len)) return -1;
    if (len) memcpy(s->held + s->held_len, piece, len);
    s->held_len += len;
    /* the first stop string to appear, by where it begins */
    size_t first = s->held_len;
    for (int32_t i = 0; i < s->n; i++) {
        const size_t L = s->lengths[i];
        for (size_t p = 0; p + L <= s->held_len && p < first; p++)
            if (memcmp(s->held + p, s->strings[i], L) == 0) {
                first = p;
                break;
            }
    }
    if (first < s->held_len) {
        if (release(s, first, out, out_len)) return -1;
        s->held_len = 0;
        return 1;
    }
    size_t keep = s->held_len;
    for (size_t p = 0; p < s->held_len; p++)
        if (may_begin_stop(s, p)) {
            keep = p;
            break;
        }
    return release(s, keep, out, out_len);
}

int stop_text_flush(stop_text *s, const char **out, size_t *out_len) {
    return release(s, s->held_len, out, out_len);
}
