#include "io/json.h"

#include "util/error.h"

const char *json_type_name(const cJSON *item) {
    if (cJSON_IsObject(item)) return "an object";
    if (cJSON_IsArray(item)) return "an array";
    if (cJSON_IsString(item)) return "a string";
    if (cJSON_IsNumber(item)) return "a number";
    if (cJSON_IsBool(item)) return "a boolean";
    if (cJSON_IsNull(item)) return "null";
    return "an invalid value";
}

nopad_status json_wrong_type(const char *where, const char *key, const char *expected, const cJSON *item) {
    return nopad_set_error(NOPAD_ERR_FORMAT, "%s: field \"%s\" has the wrong JSON type: expected %s, found %s",
                           where, key, expected, json_type_name(item));
}
