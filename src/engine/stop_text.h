/* Stop strings over text that comes a piece at a time (one token's text per piece): releases the
 * text as it grows, except a tail that may be the beginning of a stop string, which waits for the
 * next piece to settle it; when a stop string appears, the released text ends before it. So what
 * has been released never has to be taken back. */
#ifndef NOPAD_ENGINE_STOP_TEXT_H
#define NOPAD_ENGINE_STOP_TEXT_H

#include <stddef.h>
#include <stdint.h>

#include "nopad.h"

typedef struct stop_text {
    char **strings;        // [n] NUL-terminated, none empty
    size_t *lengths;       // [n]
    int32_t n;
    char *held;            // [held_len] text not released yet
    size_t held_len, held_cap;
    char *out;             // the text released by the last call
    size_t out_cap;
} stop_text;

/* Copies the n stop strings (NOPAD_ERR_INVALID_ARGUMENT for a NULL or empty one, naming it). */
nopad_status stop_text_init(stop_text *s, const char *const *strings, int32_t n);
void stop_text_free(stop_text *s);

/* Adds a piece. *out receives the text it releases (NUL-terminated, *out_len bytes, owned by s
 * and valid until the next call). Returns 1 when a stop string is now complete: the released text
 * ends right before the first one and nothing more is held; else 0. -1: out of memory. */
int stop_text_add(stop_text *s, const char *piece, size_t len, const char **out, size_t *out_len);

/* The text still held, released because the request ended for another reason. */
int stop_text_flush(stop_text *s, const char **out, size_t *out_len);

#endif
