#include "util/error.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "nopad_build_id.h" /* generated at build time: cmake/build_id.cmake */

enum { ERROR_CAPACITY = 2048 };
static _Thread_local char last_error[ERROR_CAPACITY];

nopad_status nopad_set_error(nopad_status status, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(last_error, sizeof last_error, fmt, ap);
    va_end(ap);
    return status;
}

nopad_status nopad_wrap_error(nopad_status status, const char *fmt, ...) {
    char prefix[ERROR_CAPACITY];
    char old[ERROR_CAPACITY];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(prefix, sizeof prefix, fmt, ap);
    va_end(ap);
    memcpy(old, last_error, sizeof old);
    snprintf(last_error, sizeof last_error, "%.1000s: %.1000s", prefix, old);
    return status;
}

void nopad_clear_error(void) { last_error[0] = '\0'; }

const char *nopad_last_error(void) { return last_error; }

const char *nopad_status_string(nopad_status status) {
    switch (status) {
    case NOPAD_OK: return "ok";
    case NOPAD_ERR_INVALID_ARGUMENT: return "invalid argument";
    case NOPAD_ERR_IO: return "i/o error";
    case NOPAD_ERR_FORMAT: return "malformed file";
    case NOPAD_ERR_UNSUPPORTED: return "unsupported";
    case NOPAD_ERR_OUT_OF_MEMORY: return "out of memory";
    case NOPAD_ERR_BUFFER_TOO_SMALL: return "buffer too small";
    case NOPAD_ERR_TOO_LONG: return "sequence too long";
    case NOPAD_ERR_BACKEND: return "backend error";
    case NOPAD_ERR_INTERNAL: return "internal error";
    case NOPAD_ERR_QUEUE_FULL: return "queue full";
    }
    return "unknown status";
}

#define NOPAD_STR2(x) #x
#define NOPAD_STR(x) NOPAD_STR2(x)
const char *nopad_version(void) {
    return NOPAD_STR(NOPAD_VERSION_MAJOR) "." NOPAD_STR(NOPAD_VERSION_MINOR) "." NOPAD_STR(
        NOPAD_VERSION_PATCH);
}

const char *nopad_build_id(void) { return NOPAD_BUILD_ID; }
