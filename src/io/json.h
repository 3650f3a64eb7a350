/* What every JSON reader of io/ shares (cJSON underneath): naming a value's type in messages. */
#ifndef NOPAD_IO_JSON_H
#define NOPAD_IO_JSON_H

#include <cjson/cJSON.h>

#include "nopad.h"

/* "a string", "a number", "a boolean", "an array", "an object", "null": for messages. */
const char *json_type_name(const cJSON *item);

/* NOPAD_ERR_FORMAT for a field present with the wrong JSON type (distinct from a missing one):
 * "<where>: field "<key>" has the wrong JSON type: expected <expected>, found <type>". */
nopad_status json_wrong_type(const char *where, const char *key, const char *expected, const cJSON *item);

#endif
