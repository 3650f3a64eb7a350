/* Error reporting: every failing path records a message in a thread-local buffer and returns a
 * nopad_status. Messages say what failed, where (file, tensor, line...) and what was expected. */
#ifndef NOPAD_UTIL_ERROR_H
#define NOPAD_UTIL_ERROR_H

#include "nopad.h"

#if defined(__GNUC__)
#define NOPAD_PRINTF(a, b) __attribute__((format(printf, a, b)))
#else
#define NOPAD_PRINTF(a, b)
#endif

/* Formats the message, stores it as the thread's last error and returns `status`, so a failing
 * path reads: return nopad_set_error(NOPAD_ERR_FORMAT, "%s: ...", path); */
nopad_status nopad_set_error(nopad_status status, const char *fmt, ...) NOPAD_PRINTF(2, 3);

/* Prepends "prefix: " to the current message (adds context on the way up) and returns status. */
nopad_status nopad_wrap_error(nopad_status status, const char *fmt, ...) NOPAD_PRINTF(2, 3);

void nopad_clear_error(void);

#endif
