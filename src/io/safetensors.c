/* safetensors reader. A file is: u64 little-endian N, N bytes of JSON header, then the data buffer
 * that the header's data_offsets index into.
 *
 * Validation follows huggingface/safetensors (tensor.rs) so that a file is accepted here exactly
 * when the reference accepts it, and every byte range is checked before a pointer into the data is
 * formed: bad files end in a nopad_status and a message, never in an out-of-bounds read. */
#define _POSIX_C_SOURCE 200809L /* open flags, fstat, mmap, strdup under -std=c11 */

#include "io/safetensors.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "io/json.h"
#include "util/error.h"
#include "util/file.h"

/* ---- dtypes ------------------------------------------------------------------------------- */

static const struct {
    const char *name;
    size_t size;
} dtype_info[] = {
    [ST_BOOL] = {"BOOL", 1},        [ST_U8] = {"U8", 1},     [ST_I8] = {"I8", 1},
    [ST_I16] = {"I16", 2},          [ST_U16] = {"U16", 2},   [ST_F16] = {"F16", 2},
    [ST_BF16] = {"BF16", 2},        [ST_I32] = {"I32", 4},   [ST_U32] = {"U32", 4},
    [ST_F32] = {"F32", 4},          [ST_F64] = {"F64", 8},   [ST_I64] = {"I64", 8},
    [ST_U64] = {"U64", 8},          [ST_F8_E4M3] = {"F8_E4M3", 1},
    [ST_F8_E5M2] = {"F8_E5M2", 1},
};
enum { N_DTYPES = (int)(sizeof dtype_info / sizeof dtype_info[0]) };

const char *safetensors_dtype_name(safetensors_dtype dtype) {
    return (int)dtype >= 0 && (int)dtype < N_DTYPES ? dtype_info[dtype].name : "UNKNOWN";
}

size_t safetensors_dtype_size(safetensors_dtype dtype) {
    return (int)dtype >= 0 && (int)dtype < N_DTYPES ? dtype_info[dtype].size : 0;
}

/* ---- small helpers ------------------------------------------------------------------------ */

/* A count or byte offset. cJSON stores numbers as doubles, so the value must be an exact integer
 * in [0, 2^53]: past 2^53 a double no longer holds every integer and the file's digits may have
 * been rounded. NaN and infinities (from "1e999") fail the range test. */
static int json_to_u64(const cJSON *item, uint64_t *out) {
    if (!cJSON_IsNumber(item)) return 0;
    double d = item->valuedouble;
    if (!(d >= 0.0 && d <= 0x1p53)) return 0;
    uint64_t u = (uint64_t)d;
    if ((double)u != d) return 0;
    *out = u;
    return 1;
}

static int compare_strings(const void *a, const void *b) {
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* cJSON keeps every member of an object, duplicates included, and the reference reader's hash map
 * would silently keep only one of them: a file whose meaning depends on that is rejected. Sets
 * *dup to a key that occurs twice, or NULL. */
static nopad_status find_duplicate_key(const cJSON *object, const char **dup) {
    *dup = NULL;
    size_t n = 0;
    for (const cJSON *c = object->child; c; c = c->next) n++;
    if (n < 2) return NOPAD_OK;
    const char **keys = malloc(n * sizeof *keys);
    if (!keys) return nopad_set_error(NOPAD_ERR_OUT_OF_MEMORY, "safetensors: %zu JSON keys", n);
    size_t i = 0;
    for (const cJSON *c = object->child; c; c = c->next) keys[i++] = c->string;
    qsort(keys, n, sizeof *keys, compare_strings);
    for (i = 1; i < n && !*dup; i++)
        if (strcmp(keys[i - 1], keys[i]) == 0) *dup = keys[i];
    free(keys);
    return NOPAD_OK;
}

static uint64_t read_u64_le(const uint8_t *p) {
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = (v << 8) | p[i];
    return v;
}

/* "[2, 3]" for messages. */
static void format_shape(char *buf, size_t cap, const safetensors_tensor *t) {
    size_t used = (size_t)snprintf(buf, cap, "[");
    for (int d = 0; d < t->ndim && used < cap; d++)
        used += (size_t)snprintf(buf + used, cap - used, "%s%lld", d ? ", " : "",
                                 (long long)t->shape[d]);
    if (used < cap) snprintf(buf + used, cap - used, "]");
}

/* ---- header text -------------------------------------------------------------------------- */

/* Length of the valid UTF-8 sequence at s (lead byte >= 0x80), or 0. As strict as Rust's
 * str::from_utf8: no overlong forms, no surrogates, nothing above U+10FFFF. */
static size_t utf8_sequence_length(const uint8_t *s, size_t n) {
    uint8_t c = s[0], lo = 0x80, hi = 0xBF;
    size_t len;
    if (c >= 0xC2 && c <= 0xDF) {
        len = 2;
    } else if (c >= 0xE0 && c <= 0xEF) {
        len = 3;
        if (c == 0xE0) lo = 0xA0; /* overlong */
        if (c == 0xED) hi = 0x9F; /* surrogates */
    } else if (c >= 0xF0 && c <= 0xF4) {
        len = 4;
        if (c == 0xF0) lo = 0x90; /* overlong */
        if (c == 0xF4) hi = 0x8F; /* > U+10FFFF */
    } else {
        return 0;
    }
    if (n < len || s[1] < lo || s[1] > hi) return 0;
    for (size_t k = 2; k < len; k++)
        if ((s[k] & 0xC0) != 0x80) return 0;
    return len;
}

static int is_digit(uint8_t c) { return c >= '0' && c <= '9'; }

/* Length of the JSON number token at s, or 0 if it breaks the grammar
 * -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)? or runs into more number characters ("01"). */
static size_t json_number_length(const uint8_t *s, size_t n) {
    size_t i = 0;
    if (i < n && s[i] == '-') i++;
    if (i < n && s[i] == '0') {
        i++;
    } else if (i < n && s[i] >= '1' && s[i] <= '9') {
        while (i < n && is_digit(s[i])) i++;
    } else {
        return 0;
    }
    if (i < n && s[i] == '.') {
        if (++i >= n || !is_digit(s[i])) return 0;
        while (i < n && is_digit(s[i])) i++;
    }
    if (i < n && (s[i] == 'e' || s[i] == 'E')) {
        i++;
        if (i < n && (s[i] == '+' || s[i] == '-')) i++;
        if (i >= n || !is_digit(s[i])) return 0;
        while (i < n && is_digit(s[i])) i++;
    }
    if (i < n && (is_digit(s[i]) || s[i] == '.' || s[i] == 'e' || s[i] == 'E' || s[i] == '+' ||
                  s[i] == '-'))
        return 0;
    return i;
}

/* The reference reads the header with Rust's str::from_utf8 and serde_json. cJSON alone is laxer:
 * it treats every byte <= 0x20 as whitespace, accepts raw control characters inside strings, ends
 * strings at an escaped "\u0000" (C strings) and reads numbers with strtod ("+1", "01", ".5").
 * This pass rejects all of those, so both readers agree on which headers are valid. */
static nopad_status check_header_text(const uint8_t *s, size_t n, const char *where) {
    int in_string = 0;
    size_t i = 0;
    while (i < n) {
        uint8_t c = s[i];
        if (c >= 0x80) {
            size_t len = utf8_sequence_length(s + i, n - i);
            if (!len)
                return nopad_set_error(NOPAD_ERR_FORMAT,
                                       "%s: header is not valid UTF-8 (byte 0x%02x at header "
                                       "offset %zu)", where, c, i);
            i += len;
            continue;
        }
        if (in_string) {
            if (c < 0x20)
                return nopad_set_error(NOPAD_ERR_FORMAT,
                                       "%s: header has a raw control character 0x%02x inside a "
                                       "string at header offset %zu (JSON requires it escaped)",
                                       where, c, i);
            if (c == '"') {
                in_string = 0;
            } else if (c == '\\' && i + 1 < n) {
                if (s[i + 1] == 'u' && i + 6 <= n && memcmp(s + i + 2, "0000", 4) == 0)
                    return nopad_set_error(NOPAD_ERR_FORMAT,
                                           "%s: header has an escaped NUL (\\u0000) at header "
                                           "offset %zu; names and metadata may not contain NUL",
                                           where, i);
                /* Skip the escaped character so that \" does not end the string. A non-ASCII byte
                 * after '\' is invalid JSON anyway; leave it to the UTF-8 check and cJSON. */
                if (s[i + 1] < 0x80) i++;
            }
            i++;
            continue;
        }
        if (c == '"') {
            in_string = 1;
        } else if (c < 0x20 && c != '\t' && c != '\n' && c != '\r') {
            return nopad_set_error(NOPAD_ERR_FORMAT,
                                   "%s: header has a control character 0x%02x at header offset "
                                   "%zu (only space, tab, CR and LF may separate JSON tokens)",
                                   where, c, i);
        } else if (c == '-' || is_digit(c) || c == '+' || c == '.') {
            size_t len = json_number_length(s + i, n - i);
            if (!len)
                return nopad_set_error(NOPAD_ERR_FORMAT,
                                       "%s: header has a malformed JSON number at header offset "
                                       "%zu", where, i);
            i += len;
            continue;
        }
        i++;
    }
    return NOPAD_OK;
}

/* ---- one tensor entry --------------------------------------------------------------------- */

/* Where a tensor's bytes lie in the data buffer, before they are known to be inside it. */
typedef struct tensor_span {
    uint64_t begin, end;
    int index;        /* into safetensors_file.tensors */
    const char *name; /* that tensor's name, for sorting and messages */
} tensor_span;

/* Reads one header entry {"dtype": ..., "shape": [...], "data_offsets": [begin, end]} into *t
 * (everything but t->data) and *span, and checks that the byte range fits shape x dtype. */
static nopad_status parse_entry(const cJSON *entry, const char *where, safetensors_tensor *t,
                                tensor_span *span) {
    const char *name = entry->string;
    t->name = strdup(name);
    if (!t->name) return nopad_set_error(NOPAD_ERR_OUT_OF_MEMORY, "%s: tensor name", where);
    if (!cJSON_IsObject(entry))
        return nopad_set_error(NOPAD_ERR_FORMAT,
                               "%s: tensor '%s': expected an object with dtype, shape and "
                               "data_offsets, found %s", where, name, json_type_name(entry));

    const cJSON *dtype = NULL, *shape = NULL, *offsets = NULL;
    for (const cJSON *k = entry->child; k; k = k->next) {
        const cJSON **slot = strcmp(k->string, "dtype") == 0          ? &dtype
                             : strcmp(k->string, "shape") == 0        ? &shape
                             : strcmp(k->string, "data_offsets") == 0 ? &offsets
                                                                      : NULL;
        if (!slot)
            return nopad_set_error(NOPAD_ERR_FORMAT,
                                   "%s: tensor '%s': unexpected key '%s' (expected exactly "
                                   "dtype, shape and data_offsets)", where, name, k->string);
        if (*slot)
            return nopad_set_error(NOPAD_ERR_FORMAT, "%s: tensor '%s': key '%s' appears twice",
                                   where, name, k->string);
        *slot = k;
    }
    const char *missing = !dtype ? "dtype" : !shape ? "shape" : !offsets ? "data_offsets" : NULL;
    if (missing)
        return nopad_set_error(NOPAD_ERR_FORMAT, "%s: tensor '%s': missing \"%s\"", where, name,
                               missing);

    if (!cJSON_IsString(dtype))
        return nopad_set_error(NOPAD_ERR_FORMAT,
                               "%s: tensor '%s': dtype must be a string, found %s", where, name,
                               json_type_name(dtype));
    int found = -1;
    for (int d = 0; d < N_DTYPES && found < 0; d++)
        if (strcmp(dtype->valuestring, dtype_info[d].name) == 0) found = d;
    if (found < 0)
        return nopad_set_error(NOPAD_ERR_UNSUPPORTED,
                               "%s: tensor '%s': unknown dtype '%s' (supported: BOOL, U8, I8, I16, "
                               "U16, F16, BF16, I32, U32, F32, F64, I64, U64, F8_E4M3, F8_E5M2)",
                               where, name, dtype->valuestring);
    t->dtype = (safetensors_dtype)found;

    if (!cJSON_IsArray(shape))
        return nopad_set_error(NOPAD_ERR_FORMAT,
                               "%s: tensor '%s': shape must be an array of non-negative integers, "
                               "found %s", where, name, json_type_name(shape));
    int ndim = cJSON_GetArraySize(shape);
    if (ndim > SAFETENSORS_MAX_DIMS)
        return nopad_set_error(NOPAD_ERR_UNSUPPORTED,
                               "%s: tensor '%s': shape has %d dims, more than the %d supported",
                               where, name, ndim, SAFETENSORS_MAX_DIMS);
    t->ndim = 0;
    for (const cJSON *d = shape->child; d; d = d->next) {
        uint64_t dim;
        if (!json_to_u64(d, &dim)) {
            if (cJSON_IsNumber(d))
                return nopad_set_error(NOPAD_ERR_FORMAT,
                                       "%s: tensor '%s': shape[%d] = %.17g is not an integer in "
                                       "[0, 2^53]", where, name, t->ndim, d->valuedouble);
            return nopad_set_error(NOPAD_ERR_FORMAT,
                                   "%s: tensor '%s': shape[%d] is %s, expected a non-negative "
                                   "integer", where, name, t->ndim, json_type_name(d));
        }
        t->shape[t->ndim++] = (int64_t)dim;
    }

    uint64_t off[2];
    if (!cJSON_IsArray(offsets) || cJSON_GetArraySize(offsets) != 2 ||
        !json_to_u64(offsets->child, &off[0]) || !json_to_u64(offsets->child->next, &off[1]))
        return nopad_set_error(NOPAD_ERR_FORMAT,
                               "%s: tensor '%s': data_offsets must be [begin, end], two integers "
                               "in [0, 2^53]", where, name);
    if (off[0] > off[1])
        return nopad_set_error(NOPAD_ERR_FORMAT,
                               "%s: tensor '%s': data_offsets [%llu, %llu] have begin > end",
                               where, name, (unsigned long long)off[0],
                               (unsigned long long)off[1]);

    /* Same order of multiplications as the reference, so the same shapes overflow. */
    char shape_text[256];
    format_shape(shape_text, sizeof shape_text, t);
    uint64_t n = 1;
    for (int d = 0; d < t->ndim; d++) {
        uint64_t dim = (uint64_t)t->shape[d];
        if (dim != 0 && n > (uint64_t)INT64_MAX / dim)
            return nopad_set_error(NOPAD_ERR_FORMAT,
                                   "%s: tensor '%s': shape %s has too many elements (overflow)",
                                   where, name, shape_text);
        n *= dim;
    }
    size_t elem = dtype_info[t->dtype].size;
    if (n > SIZE_MAX / elem)
        return nopad_set_error(NOPAD_ERR_FORMAT,
                               "%s: tensor '%s': shape %s of %s is too many bytes (overflow)",
                               where, name, shape_text, dtype_info[t->dtype].name);
    t->n_elements = (int64_t)n;
    t->nbytes = (size_t)n * elem;
    if (off[1] - off[0] != (uint64_t)t->nbytes)
        return nopad_set_error(NOPAD_ERR_FORMAT,
                               "%s: tensor '%s': data_offsets [%llu, %llu] span %llu bytes but "
                               "shape %s of %s needs %zu", where, name,
                               (unsigned long long)off[0], (unsigned long long)off[1],
                               (unsigned long long)(off[1] - off[0]), shape_text,
                               dtype_info[t->dtype].name, t->nbytes);
    span->begin = off[0];
    span->end = off[1];
    return NOPAD_OK;
}

static nopad_status check_metadata(const cJSON *meta, const char *where) {
    if (!cJSON_IsObject(meta))
        return nopad_set_error(NOPAD_ERR_FORMAT,
                               "%s: __metadata__ must be an object of string values, found %s",
                               where, json_type_name(meta));
    for (const cJSON *c = meta->child; c; c = c->next)
        if (!cJSON_IsString(c))
            return nopad_set_error(NOPAD_ERR_FORMAT,
                                   "%s: __metadata__ key '%s' is %s, expected a string", where,
                                   c->string, json_type_name(c));
    const char *dup;
    nopad_status st = find_duplicate_key(meta, &dup);
    if (st != NOPAD_OK) return st;
    if (dup)
        return nopad_set_error(NOPAD_ERR_FORMAT, "%s: __metadata__ key '%s' appears twice", where,
                               dup);
    return NOPAD_OK;
}

/* ---- the whole header --------------------------------------------------------------------- */

/* Tile order: by begin, then end, so empty tensors sit before the tensor that starts where they
 * are; the name breaks ties so the first reported problem does not depend on qsort. */
static int compare_spans(const void *a, const void *b) {
    const tensor_span *x = a, *y = b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    if (x->end != y->end) return x->end < y->end ? -1 : 1;
    return strcmp(x->name, y->name);
}

static int compare_tensor_names(const void *a, const void *b) {
    return strcmp(((const safetensors_tensor *)a)->name, ((const safetensors_tensor *)b)->name);
}

/* The tensors, sorted by begin, must tile [0, data_size) exactly: the first starts at 0, each
 * starts where the previous ends, the last ends at data_size. */
static nopad_status check_tiling(const tensor_span *spans, int n, uint64_t data_size,
                                 const char *where) {
    uint64_t at = 0;
    const tensor_span *prev = NULL;
    for (int i = 0; i < n; i++) {
        const tensor_span *s = &spans[i];
        const char *name = s->name;
        if (s->begin > at)
            return nopad_set_error(NOPAD_ERR_FORMAT,
                                   "%s: hole in the data buffer: bytes [%llu, %llu) belong to no "
                                   "tensor (tensor '%s' has data_offsets [%llu, %llu])", where,
                                   (unsigned long long)at, (unsigned long long)s->begin, name,
                                   (unsigned long long)s->begin, (unsigned long long)s->end);
        if (s->begin < at)
            return nopad_set_error(NOPAD_ERR_FORMAT,
                                   "%s: tensor '%s' data_offsets [%llu, %llu] overlap tensor '%s' "
                                   "data_offsets [%llu, %llu]", where, name,
                                   (unsigned long long)s->begin, (unsigned long long)s->end,
                                   prev->name, (unsigned long long)prev->begin,
                                   (unsigned long long)prev->end);
        if (s->end > data_size)
            return nopad_set_error(NOPAD_ERR_FORMAT,
                                   "%s: tensor '%s' data_offsets [%llu, %llu] run past the end of "
                                   "the %llu-byte data buffer (file truncated?)", where, name,
                                   (unsigned long long)s->begin, (unsigned long long)s->end,
                                   (unsigned long long)data_size);
        at = s->end;
        prev = s;
    }
    if (at != data_size)
        return nopad_set_error(NOPAD_ERR_FORMAT,
                               "%s: data buffer is %llu bytes but the tensors cover only %llu "
                               "(the last %llu bytes belong to no tensor)", where,
                               (unsigned long long)data_size, (unsigned long long)at,
                               (unsigned long long)(data_size - at));
    return NOPAD_OK;
}

/* Fills out->tensors from the parsed header. On failure the caller closes `out`. */
static nopad_status build_index(const cJSON *root, const uint8_t *data, size_t data_size,
                                const char *where, safetensors_file *out) {
    const char *dup;
    nopad_status st = find_duplicate_key(root, &dup);
    if (st != NOPAD_OK) return st;
    if (dup)
        return nopad_set_error(NOPAD_ERR_FORMAT,
                               "%s: header lists '%s' twice (tensor names must be unique)", where,
                               dup);

    size_t count = 0;
    for (const cJSON *c = root->child; c; c = c->next) {
        if (strcmp(c->string, "__metadata__") == 0) {
            st = check_metadata(c, where);
            if (st != NOPAD_OK) return st;
        } else {
            count++;
        }
    }
    if (count > (size_t)INT32_MAX)
        return nopad_set_error(NOPAD_ERR_UNSUPPORTED, "%s: %zu tensors is too many", where, count);
    if (count == 0) return check_tiling(NULL, 0, data_size, where);

    out->tensors = calloc(count, sizeof *out->tensors);
    tensor_span *spans = malloc(count * sizeof *spans);
    if (!out->tensors || !spans) {
        free(spans);
        return nopad_set_error(NOPAD_ERR_OUT_OF_MEMORY, "%s: index of %zu tensors", where, count);
    }
    out->n_tensors = (int)count; /* names are NULL until set, so closing frees what exists */
    int i = 0;
    for (const cJSON *c = root->child; c && st == NOPAD_OK; c = c->next) {
        if (strcmp(c->string, "__metadata__") == 0) continue;
        st = parse_entry(c, where, &out->tensors[i], &spans[i]);
        spans[i].index = i;
        spans[i].name = out->tensors[i].name;
        i++;
    }
    if (st == NOPAD_OK) {
        qsort(spans, count, sizeof *spans, compare_spans);
        st = check_tiling(spans, (int)count, data_size, where);
    }
    if (st == NOPAD_OK) {
        /* Only now are the ranges known to lie inside the buffer. */
        for (size_t k = 0; k < count; k++)
            out->tensors[spans[k].index].data = data + spans[k].begin;
        qsort(out->tensors, count, sizeof *out->tensors, compare_tensor_names);
    }
    free(spans);
    return st;
}

nopad_status safetensors_parse(const uint8_t *buf, size_t size, const char *where,
                               safetensors_file *out) {
    if (!out) return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT, "safetensors_parse: out is NULL");
    memset(out, 0, sizeof *out);
    if (!where) where = "<memory>";
    if (!buf && size)
        return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT, "%s: buffer is NULL but size is %zu",
                               where, size);
    if (size == 0)
        return nopad_set_error(NOPAD_ERR_FORMAT,
                               "%s: empty file (0 bytes); a safetensors file starts with an "
                               "8-byte header length", where);
    if (size < 8)
        return nopad_set_error(NOPAD_ERR_FORMAT,
                               "%s: file is %zu bytes, too short for the 8-byte header length",
                               where, size);
    uint64_t n = read_u64_le(buf);
    if (n > SAFETENSORS_MAX_HEADER_SIZE)
        return nopad_set_error(NOPAD_ERR_FORMAT,
                               "%s: header length %llu exceeds the limit of %llu bytes", where,
                               (unsigned long long)n, SAFETENSORS_MAX_HEADER_SIZE);
    if (n > size - 8)
        return nopad_set_error(NOPAD_ERR_FORMAT,
                               "%s: header length %llu runs past the end of the file (%zu bytes "
                               "follow the length field)", where, (unsigned long long)n, size - 8);
    const uint8_t *header = buf + 8;
    if (n == 0)
        return nopad_set_error(NOPAD_ERR_FORMAT,
                               "%s: header length is 0; expected a JSON object starting with '{'",
                               where);
    if (header[0] != '{')
        return nopad_set_error(NOPAD_ERR_FORMAT,
                               "%s: header must be a JSON object starting with '{', found first "
                               "byte 0x%02x", where, header[0]);
    nopad_status st = check_header_text(header, (size_t)n, where);
    if (st != NOPAD_OK) return st;

    /* A NUL-terminated copy: the mapping has no terminator, and cJSON should never get the chance
     * to read past the header whatever its length handling does. */
    char *text = malloc((size_t)n + 1);
    if (!text) return nopad_set_error(NOPAD_ERR_OUT_OF_MEMORY, "%s: %llu-byte header", where,
                                      (unsigned long long)n);
    memcpy(text, header, (size_t)n);
    text[n] = '\0';
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(text, (size_t)n, &end, 0);
    if (!root) {
        size_t at = end ? (size_t)(end - text) : 0;
        free(text);
        return nopad_set_error(NOPAD_ERR_FORMAT,
                               "%s: header is not valid JSON (parse error at header byte %zu)",
                               where, at);
    }
    /* Writers pad the header with spaces so the data starts 8-byte aligned; serde_json accepts any
     * JSON whitespace there, and nothing else. */
    for (const char *p = end; p < text + n; p++) {
        if (*p != ' ' && *p != '\t' && *p != '\n' && *p != '\r') {
            size_t at = (size_t)(p - text);
            free(text);
            cJSON_Delete(root);
            return nopad_set_error(NOPAD_ERR_FORMAT,
                                   "%s: trailing data after the header's JSON object at header "
                                   "byte %zu (only whitespace may pad it)", where, at);
        }
    }
    free(text);
    if (!cJSON_IsObject(root)) { /* unreachable after the '{' check; kept as a guard */
        cJSON_Delete(root);
        return nopad_set_error(NOPAD_ERR_FORMAT, "%s: header is not a JSON object", where);
    }

    out->path = strdup(where);
    if (!out->path) st = nopad_set_error(NOPAD_ERR_OUT_OF_MEMORY, "%s: path", where);
    if (st == NOPAD_OK) st = build_index(root, header + n, size - 8 - (size_t)n, where, out);
    cJSON_Delete(root);
    if (st != NOPAD_OK) safetensors_close(out);
    return st;
}

/* ---- files -------------------------------------------------------------------------------- */

nopad_status safetensors_open(const char *path, safetensors_file *out) {
    if (!out) return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT, "safetensors_open: out is NULL");
    memset(out, 0, sizeof *out);
    if (!path) return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT, "safetensors_open: path is NULL");
    /* O_NONBLOCK: a FIFO with no writer opens at once (and is refused below) instead of blocking
     * the caller; a regular file ignores the flag */
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) return nopad_set_error(NOPAD_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    struct stat sb;
    if (fstat(fd, &sb) != 0) {
        int e = errno;
        close(fd);
        return nopad_set_error(NOPAD_ERR_IO, "%s: cannot stat: %s", path, strerror(e));
    }
    if (!S_ISREG(sb.st_mode)) {
        close(fd);
        return nopad_set_error(NOPAD_ERR_IO, "%s: not a regular file%s", path,
                               S_ISDIR(sb.st_mode) ? " (it is a folder)" : "");
    }
    if (sb.st_size < 0 || (uint64_t)sb.st_size > SIZE_MAX) {
        close(fd);
        return nopad_set_error(NOPAD_ERR_IO, "%s: file too large to map", path);
    }
    size_t size = (size_t)sb.st_size;
    if (size == 0) { /* mmap of 0 bytes fails; let the parser report the empty file */
        close(fd);
        return safetensors_parse((const uint8_t *)"", 0, path, out);
    }
    /* Read-only private mapping: tensors are views into it, loaded lazily by the kernel. (A file
     * truncated by someone else while mapped would still fault; nothing portable prevents that.) */
    void *map = mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0);
    int e = errno;
    close(fd);
    if (map == MAP_FAILED)
        return nopad_set_error(NOPAD_ERR_IO, "%s: cannot mmap %zu bytes: %s", path, size,
                               strerror(e));
    nopad_status st = safetensors_parse(map, size, path, out);
    if (st != NOPAD_OK) {
        munmap(map, size);
        return st;
    }
    out->map = map;
    out->map_size = size;
    return NOPAD_OK;
}

void safetensors_close(safetensors_file *f) {
    if (!f) return;
    for (int i = 0; i < f->n_tensors && f->tensors; i++) free(f->tensors[i].name);
    free(f->tensors);
    free(f->path);
    if (f->map) munmap(f->map, f->map_size);
    memset(f, 0, sizeof *f);
}

static int compare_name_to_tensor(const void *key, const void *elem) {
    return strcmp((const char *)key, ((const safetensors_tensor *)elem)->name);
}

const safetensors_tensor *safetensors_find(const safetensors_file *f, const char *name) {
    if (!f || !name || !f->tensors || f->n_tensors <= 0) return NULL;
    return bsearch(name, f->tensors, (size_t)f->n_tensors, sizeof *f->tensors,
                   compare_name_to_tensor);
}

/* ---- conversion --------------------------------------------------------------------------- */

static float bits_to_float(uint32_t bits) {
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

/* IEEE binary16 -> binary32, exact for every input (every half is a float). */
static float f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t mant = h & 0x3ffu;
    if (exp == 0x1f) return bits_to_float(sign | 0x7f800000u | (mant << 13)); /* inf, NaN */
    if (exp != 0) return bits_to_float(sign | ((exp + 127 - 15) << 23) | (mant << 13));
    /* Zero or subnormal: mant x 2^-24, exact in float, then the sign. */
    float mag = (float)mant * 0x1p-24f;
    return sign ? -mag : mag;
}

nopad_status safetensors_to_f32(const safetensors_tensor *t, float *dst) {
    if (!t)
        return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT, "safetensors_to_f32: tensor is NULL");
    if (!dst && t->n_elements > 0)
        return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT,
                               "safetensors_to_f32: tensor '%s': dst is NULL", t->name);
    const uint8_t *src = t->data;
    size_t n = (size_t)t->n_elements;
    switch (t->dtype) {
    case ST_F32:
        /* The data may sit at any byte offset; memcpy is the aligned-or-not load. Safetensors is
         * little-endian, as are the hosts nopad targets (x86-64, aarch64). */
        if (n) memcpy(dst, src, n * sizeof(float));
        return NOPAD_OK;
    case ST_F16:
        for (size_t i = 0; i < n; i++)
            dst[i] = f16_to_f32((uint16_t)(src[2 * i] | (src[2 * i + 1] << 8)));
        return NOPAD_OK;
    case ST_BF16: /* bfloat16 is the top half of a float32 */
        for (size_t i = 0; i < n; i++)
            dst[i] = bits_to_float((uint32_t)(src[2 * i] | (src[2 * i + 1] << 8)) << 16);
        return NOPAD_OK;
    default:
        return nopad_set_error(NOPAD_ERR_UNSUPPORTED,
                               "tensor '%s': cannot convert %s to F32 (only F32, F16 and BF16)",
                               t->name, safetensors_dtype_name(t->dtype));
    }
}

/* ---- checkpoints -------------------------------------------------------------------------- */

static char *join_path(const char *dir, const char *name) {
    size_t a = strlen(dir), b = strlen(name);
    char *p = malloc(a + 1 + b + 1);
    if (!p) return NULL;
    memcpy(p, dir, a);
    p[a] = '/';
    memcpy(p + a + 1, name, b + 1);
    return p;
}

/* A shard must be a plain file name in the checkpoint folder: an index may not reach outside. */
static int is_plain_file_name(const char *s) {
    return s[0] && !strchr(s, '/') && !strstr(s, "..");
}

typedef struct named_tensor {
    const char *name;
    int file;
} named_tensor;

static int compare_named_tensors(const void *a, const void *b) {
    return strcmp(((const named_tensor *)a)->name, ((const named_tensor *)b)->name);
}

/* Opens the shards named by `index` (the parsed index.json) into out->files, then checks that
 * every tensor is where the weight_map says and in no other shard. */
static nopad_status open_shards(const char *dir, const char *index_path, const cJSON *index,
                                safetensors_checkpoint *out) {
    if (!cJSON_IsObject(index))
        return nopad_set_error(NOPAD_ERR_FORMAT,
                               "%s: expected a JSON object with a \"weight_map\", found %s",
                               index_path, json_type_name(index));
    const cJSON *meta = cJSON_GetObjectItemCaseSensitive(index, "metadata");
    if (meta && !cJSON_IsObject(meta))
        return nopad_set_error(NOPAD_ERR_FORMAT, "%s: \"metadata\" must be an object, found %s",
                               index_path, json_type_name(meta));
    const cJSON *map = cJSON_GetObjectItemCaseSensitive(index, "weight_map");
    if (!cJSON_IsObject(map))
        return nopad_set_error(NOPAD_ERR_FORMAT,
                               "%s: \"weight_map\" must be an object {tensor: shard file}, "
                               "found %s", index_path, map ? json_type_name(map) : "nothing");
    const char *dup;
    nopad_status st = find_duplicate_key(map, &dup);
    if (st != NOPAD_OK) return st;
    if (dup)
        return nopad_set_error(NOPAD_ERR_FORMAT, "%s: weight_map lists tensor '%s' twice",
                               index_path, dup);
    size_t n_entries = 0;
    for (const cJSON *e = map->child; e; e = e->next) {
        if (!cJSON_IsString(e))
            return nopad_set_error(NOPAD_ERR_FORMAT,
                                   "%s: weight_map entry for tensor '%s' is %s, expected a shard "
                                   "file name", index_path, e->string, json_type_name(e));
        if (!is_plain_file_name(e->valuestring))
            return nopad_set_error(NOPAD_ERR_FORMAT,
                                   "%s: weight_map puts tensor '%s' in shard '%s'; a shard must be "
                                   "a file name in the checkpoint folder (no '/' or '..')",
                                   index_path, e->string, e->valuestring);
        n_entries++;
    }
    if (n_entries == 0)
        return nopad_set_error(NOPAD_ERR_FORMAT, "%s: weight_map lists no tensors", index_path);
    if (n_entries > (size_t)INT32_MAX)
        return nopad_set_error(NOPAD_ERR_UNSUPPORTED, "%s: too many weight_map entries",
                               index_path);

    /* Distinct shard names, sorted, so each shard is opened once and found by bsearch. */
    const char **shards = malloc(n_entries * sizeof *shards);
    if (!shards) return nopad_set_error(NOPAD_ERR_OUT_OF_MEMORY, "%s: shard list", index_path);
    size_t n_shards = 0;
    for (const cJSON *e = map->child; e; e = e->next) shards[n_shards++] = e->valuestring;
    qsort(shards, n_shards, sizeof *shards, compare_strings);
    size_t unique = 0;
    for (size_t i = 0; i < n_shards; i++)
        if (unique == 0 || strcmp(shards[unique - 1], shards[i]) != 0) shards[unique++] = shards[i];
    n_shards = unique;

    out->files = calloc(n_shards, sizeof *out->files);
    if (!out->files) {
        free(shards);
        return nopad_set_error(NOPAD_ERR_OUT_OF_MEMORY, "%s: %zu shards", index_path, n_shards);
    }
    out->n_files = (int)n_shards; /* zeroed files close cleanly if a later one fails */
    for (size_t i = 0; i < n_shards && st == NOPAD_OK; i++) {
        char *path = join_path(dir, shards[i]);
        if (!path) {
            st = nopad_set_error(NOPAD_ERR_OUT_OF_MEMORY, "%s: shard path", index_path);
            break;
        }
        st = safetensors_open(path, &out->files[i]);
        free(path);
        if (st != NOPAD_OK) st = nopad_wrap_error(st, "%s: shard '%s'", index_path, shards[i]);
    }

    for (const cJSON *e = map->child; e && st == NOPAD_OK; e = e->next) {
        const char **hit = bsearch(&e->valuestring, shards, n_shards, sizeof *shards,
                                   compare_strings);
        const safetensors_file *f = &out->files[hit - shards];
        if (!safetensors_find(f, e->string))
            st = nopad_set_error(NOPAD_ERR_FORMAT,
                                 "%s: weight_map puts tensor '%s' in '%s', but that shard has no "
                                 "such tensor", index_path, e->string, e->valuestring);
    }
    free(shards);
    if (st != NOPAD_OK) return st;

    /* A name in two shards would make safetensors_checkpoint_find depend on shard order. */
    size_t total = 0;
    for (int i = 0; i < out->n_files; i++) total += (size_t)out->files[i].n_tensors;
    if (total < 2) return NOPAD_OK;
    named_tensor *all = malloc(total * sizeof *all);
    if (!all) return nopad_set_error(NOPAD_ERR_OUT_OF_MEMORY, "%s: %zu names", index_path, total);
    size_t k = 0;
    for (int i = 0; i < out->n_files; i++)
        for (int j = 0; j < out->files[i].n_tensors; j++)
            all[k++] = (named_tensor){out->files[i].tensors[j].name, i};
    qsort(all, total, sizeof *all, compare_named_tensors);
    for (k = 1; k < total && st == NOPAD_OK; k++)
        if (strcmp(all[k - 1].name, all[k].name) == 0)
            st = nopad_set_error(NOPAD_ERR_FORMAT, "%s: tensor '%s' is in both %s and %s",
                                 index_path, all[k].name, out->files[all[k - 1].file].path,
                                 out->files[all[k].file].path);
    free(all);
    return st;
}

static nopad_status open_sharded(const char *dir, const char *index_path,
                                 safetensors_checkpoint *out) {
    char *text;
    size_t len = 0;
    nopad_status st = read_file(index_path, SAFETENSORS_MAX_HEADER_SIZE, &text, &len);
    if (st != NOPAD_OK) return st;
    if (strlen(text) != len) {
        free(text);
        return nopad_set_error(NOPAD_ERR_FORMAT, "%s: contains a NUL byte; not a JSON text",
                               index_path);
    }
    const char *end = NULL;
    /* require_null_terminated: only whitespace may follow the object (len + 1 covers the NUL) */
    cJSON *index = cJSON_ParseWithLengthOpts(text, len + 1, &end, 1);
    if (!index) {
        size_t at = end ? (size_t)(end - text) : 0;
        free(text);
        return nopad_set_error(NOPAD_ERR_FORMAT, "%s: not valid JSON (parse error at byte %zu)",
                               index_path, at);
    }
    free(text);
    st = open_shards(dir, index_path, index, out);
    cJSON_Delete(index);
    return st;
}

nopad_status safetensors_checkpoint_open(const char *dir, safetensors_checkpoint *out) {
    if (!out)
        return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT,
                               "safetensors_checkpoint_open: out is NULL");
    memset(out, 0, sizeof *out);
    if (!dir)
        return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT,
                               "safetensors_checkpoint_open: dir is NULL");
    char *single = join_path(dir, "model.safetensors");
    char *index = join_path(dir, "model.safetensors.index.json");
    nopad_status st = NOPAD_OK;
    struct stat sb;
    if (!single || !index) {
        st = nopad_set_error(NOPAD_ERR_OUT_OF_MEMORY, "%s: paths", dir);
    } else if (stat(single, &sb) == 0 || errno != ENOENT) {
        /* Present (or there but unreadable): the single file is the checkpoint; open reports. */
        out->files = calloc(1, sizeof *out->files);
        if (!out->files) {
            st = nopad_set_error(NOPAD_ERR_OUT_OF_MEMORY, "%s: checkpoint", dir);
        } else {
            out->n_files = 1;
            st = safetensors_open(single, &out->files[0]);
        }
    } else if (stat(index, &sb) == 0 || errno != ENOENT) {
        st = open_sharded(dir, index, out);
    } else {
        st = nopad_set_error(NOPAD_ERR_IO, "%s: no model.safetensors or "
                                           "model.safetensors.index.json", dir);
    }
    free(single);
    free(index);
    if (st != NOPAD_OK) safetensors_checkpoint_close(out);
    return st;
}

void safetensors_checkpoint_close(safetensors_checkpoint *c) {
    if (!c) return;
    for (int i = 0; i < c->n_files && c->files; i++) safetensors_close(&c->files[i]);
    free(c->files);
    c->files = NULL;
    c->n_files = 0;
}

const safetensors_tensor *safetensors_checkpoint_find(const safetensors_checkpoint *c,
                                                      const char *name) {
    if (!c || !name) return NULL;
    for (int i = 0; i < c->n_files; i++) {
        const safetensors_tensor *t = safetensors_find(&c->files[i], name);
        if (t) return t;
    }
    return NULL;
}
