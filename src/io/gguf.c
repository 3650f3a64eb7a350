/* GGUF reader. A file is:
 *   "GGUF", u32 version, u64 tensor count, u64 metadata count,
 *   metadata: (string key, u32 value type, value) x count,
 *   tensor infos: (string name, u32 n_dims, u64 dims[n_dims], u32 ggml type, u64 offset) x count,
 *   padding to the alignment, then the data section the offsets index into.
 * A string is a u64 length and that many bytes; an array is a u32 element type, a u64 count and
 * the elements. Everything is little-endian.
 *
 * Reading goes through one cursor that checks each read against the bytes left, and every count
 * is checked against the smallest size its elements could take before anything is allocated, so
 * a file claiming 2^60 strings fails at once. Lists grow as their entries are read, so memory
 * follows what the file really holds. */
#define _POSIX_C_SOURCE 200809L /* open flags, fstat, mmap, strdup under -std=c11 */

#include "io/gguf.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "util/error.h"

/* ---- types ---------------------------------------------------------------------------------- */

static const struct {
    const char *name;
    size_t size; /* 0: not fixed-size */
} value_types[] = {
    [GGUF_TYPE_UINT8] = {"uint8", 1},     [GGUF_TYPE_INT8] = {"int8", 1},
    [GGUF_TYPE_UINT16] = {"uint16", 2},   [GGUF_TYPE_INT16] = {"int16", 2},
    [GGUF_TYPE_UINT32] = {"uint32", 4},   [GGUF_TYPE_INT32] = {"int32", 4},
    [GGUF_TYPE_FLOAT32] = {"float32", 4}, [GGUF_TYPE_BOOL] = {"bool", 1},
    [GGUF_TYPE_STRING] = {"string", 0},   [GGUF_TYPE_ARRAY] = {"array", 0},
    [GGUF_TYPE_UINT64] = {"uint64", 8},   [GGUF_TYPE_INT64] = {"int64", 8},
    [GGUF_TYPE_FLOAT64] = {"float64", 8},
};
enum { N_VALUE_TYPES = (int)(sizeof value_types / sizeof value_types[0]) };

const char *gguf_type_name(gguf_type type) {
    return (unsigned)type < N_VALUE_TYPES ? value_types[type].name : "unknown";
}

/* The fewest bytes a value of this type takes: a string its length, an array its header. */
static size_t min_value_size(gguf_type type) {
    return type == GGUF_TYPE_STRING ? 8 : type == GGUF_TYPE_ARRAY ? 12 : value_types[type].size;
}

/* ggml's type traits: elements per block and bytes per block (ggml-common.h). Ids ggml no longer
 * or not yet defines have no name. */
static const struct {
    const char *name;
    uint32_t block, size;
    int supported; /* gguf_tensor_data hands the bytes out */
} tensor_types[] = {
    [0] = {"F32", 1, 4, 1},           [1] = {"F16", 1, 2, 1},
    [2] = {"Q4_0", 32, 18, 1},        [3] = {"Q4_1", 32, 20, 1},
    [6] = {"Q5_0", 32, 22, 1},        [7] = {"Q5_1", 32, 24, 1},
    [8] = {"Q8_0", 32, 34, 1},        [9] = {"Q8_1", 32, 36, 0},
    [10] = {"Q2_K", 256, 84, 0},      [11] = {"Q3_K", 256, 110, 0},
    [12] = {"Q4_K", 256, 144, 1},     [13] = {"Q5_K", 256, 176, 0},
    [14] = {"Q6_K", 256, 210, 1},     [15] = {"Q8_K", 256, 292, 0},
    [16] = {"IQ2_XXS", 256, 66, 0},   [17] = {"IQ2_XS", 256, 74, 0},
    [18] = {"IQ3_XXS", 256, 98, 0},   [19] = {"IQ1_S", 256, 50, 0},
    [20] = {"IQ4_NL", 32, 18, 0},     [21] = {"IQ3_S", 256, 110, 0},
    [22] = {"IQ2_S", 256, 82, 0},     [23] = {"IQ4_XS", 256, 136, 0},
    [24] = {"I8", 1, 1, 0},           [25] = {"I16", 1, 2, 0},
    [26] = {"I32", 1, 4, 0},          [27] = {"I64", 1, 8, 0},
    [28] = {"F64", 1, 8, 0},          [29] = {"IQ1_M", 256, 56, 0},
    [30] = {"BF16", 1, 2, 1},         [34] = {"TQ1_0", 256, 54, 0},
    [35] = {"TQ2_0", 256, 66, 0},     [39] = {"MXFP4", 32, 17, 0},
    [40] = {"NVFP4", 64, 36, 0},      [41] = {"Q1_0", 128, 18, 0},
};
enum { N_TENSOR_TYPES = (int)(sizeof tensor_types / sizeof tensor_types[0]) };

const char *gguf_tensor_type_name(uint32_t type) {
    return type < N_TENSOR_TYPES ? tensor_types[type].name : NULL;
}

/* ---- little-endian reads -------------------------------------------------------------------- */

uint64_t gguf_read_u64(const uint8_t *p) {
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = (v << 8) | p[i];
    return v;
}

uint32_t gguf_read_u32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* ---- the cursor ----------------------------------------------------------------------------- */

typedef struct reader {
    const uint8_t *buf;
    size_t size, pos;
    const char *where;
    char section[160]; /* what is being read, for messages: "key 3 ('general.name')" */
} reader;

static size_t remaining(const reader *r) { return r->size - r->pos; }

/* At most this many bytes of a key or name go into a message. */
enum { SHOWN = 96 };
static int shown(uint64_t len) { return len < SHOWN ? (int)len : SHOWN; }

static nopad_status truncated(const reader *r, size_t need, const char *what) {
    return nopad_set_error(NOPAD_ERR_FORMAT,
                           "%s: file truncated in %s: %s needs %zu bytes at offset %zu, but the "
                           "file ends at %zu",
                           r->where, r->section, what, need, r->pos, r->size);
}

static nopad_status take(reader *r, size_t n, const char *what, const uint8_t **out) {
    if (n > remaining(r)) return truncated(r, n, what);
    *out = r->buf + r->pos;
    r->pos += n;
    return NOPAD_OK;
}

static nopad_status read_u32(reader *r, const char *what, uint32_t *out) {
    const uint8_t *p = NULL;
    nopad_status st = take(r, 4, what, &p);
    if (st == NOPAD_OK) *out = gguf_read_u32(p);
    return st;
}

static nopad_status read_u64(reader *r, const char *what, uint64_t *out) {
    const uint8_t *p = NULL;
    nopad_status st = take(r, 8, what, &p);
    if (st == NOPAD_OK) *out = gguf_read_u64(p);
    return st;
}

static nopad_status read_str(reader *r, const char *what, gguf_str *out) {
    uint64_t len;
    nopad_status st = read_u64(r, what, &len);
    if (st != NOPAD_OK) return st;
    if (len > remaining(r))
        return nopad_set_error(NOPAD_ERR_FORMAT,
                               "%s: %s: %s has length %llu, past the end of the file (%zu bytes "
                               "remain at offset %zu)",
                               r->where, r->section, what, (unsigned long long)len, remaining(r),
                               r->pos);
    out->data = (const char *)r->buf + r->pos;
    out->len = len;
    r->pos += (size_t)len;
    return NOPAD_OK;
}

/* Makes room for one more element in a list that grows by doubling. */
static nopad_status grow(void **items, uint64_t *cap, uint64_t count, size_t elem,
                         const char *where) {
    if (count < *cap) return NOPAD_OK;
    uint64_t want = *cap ? *cap * 2 : 16;
    if (want > SIZE_MAX / elem)
        return nopad_set_error(NOPAD_ERR_OUT_OF_MEMORY, "%s: list of %llu entries", where,
                               (unsigned long long)want);
    void *p = realloc(*items, (size_t)want * elem);
    if (!p)
        return nopad_set_error(NOPAD_ERR_OUT_OF_MEMORY, "%s: list of %llu entries", where,
                               (unsigned long long)want);
    memset((char *)p + (size_t)*cap * elem, 0, (size_t)(want - *cap) * elem);
    *items = p;
    *cap = want;
    return NOPAD_OK;
}

/* ---- values --------------------------------------------------------------------------------- */

static nopad_status check_value_type(const reader *r, uint32_t type, const char *what) {
    if (type < N_VALUE_TYPES) return NOPAD_OK;
    return nopad_set_error(NOPAD_ERR_FORMAT,
                           "%s: %s: unknown %s %u (expected 0 to 12: uint8, int8, uint16, int16, "
                           "uint32, int32, float32, bool, string, array, uint64, int64, float64)",
                           r->where, r->section, what, type);
}

/* `n` bools at p, of an array or (array == 0) the one value. */
static nopad_status check_bools(const reader *r, const uint8_t *p, uint64_t n, int array) {
    for (uint64_t i = 0; i < n; i++) {
        if (p[i] <= 1) continue;
        if (!array)
            return nopad_set_error(NOPAD_ERR_FORMAT, "%s: %s: bool value is %u, expected 0 or 1",
                                   r->where, r->section, p[i]);
        return nopad_set_error(NOPAD_ERR_FORMAT,
                               "%s: %s: bool element %llu is %u, expected 0 or 1", r->where,
                               r->section, (unsigned long long)i, p[i]);
    }
    return NOPAD_OK;
}

static void free_array(gguf_array *a) {
    if (a->arrs)
        for (uint64_t i = 0; i < a->n; i++) free_array(&a->arrs[i]);
    free(a->arrs);
    free(a->strs);
    memset(a, 0, sizeof *a);
}

/* An array's element type, count and elements. `depth` is 1 for a top-level array. On failure
 * `a` holds what was allocated, for free_array. */
static nopad_status read_array(reader *r, gguf_array *a, int depth) {
    uint32_t type;
    uint64_t n;
    nopad_status st = read_u32(r, "the array element type", &type);
    if (st == NOPAD_OK) st = check_value_type(r, type, "array element type");
    if (st == NOPAD_OK) st = read_u64(r, "the array length", &n);
    if (st != NOPAD_OK) return st;
    if (type == GGUF_TYPE_ARRAY && depth >= GGUF_MAX_ARRAY_DEPTH)
        return nopad_set_error(NOPAD_ERR_UNSUPPORTED,
                               "%s: %s: arrays nested more than %d deep", r->where, r->section,
                               GGUF_MAX_ARRAY_DEPTH);
    size_t min = min_value_size((gguf_type)type);
    if (n > remaining(r) / min)
        return nopad_set_error(NOPAD_ERR_FORMAT,
                               "%s: %s: array of %llu %s elements needs at least %llu bytes, but "
                               "only %zu remain in the file at offset %zu (file truncated?)",
                               r->where, r->section, (unsigned long long)n,
                               gguf_type_name((gguf_type)type),
                               n > UINT64_MAX / min ? UINT64_MAX : (unsigned long long)(n * min),
                               remaining(r), r->pos);
    a->type = (gguf_type)type;
    a->data = r->buf + r->pos;
    if (type == GGUF_TYPE_STRING) {
        /* Walk the lengths first, so the views are allocated only for an array that fits. */
        size_t start = r->pos;
        gguf_str s;
        for (uint64_t i = 0; i < n; i++) {
            st = read_str(r, "an array string", &s);
            if (st != NOPAD_OK) return st;
        }
        r->pos = start;
        if (n) {
            a->strs = malloc((size_t)n * sizeof *a->strs);
            if (!a->strs)
                return nopad_set_error(NOPAD_ERR_OUT_OF_MEMORY, "%s: %s: %llu strings", r->where,
                                       r->section, (unsigned long long)n);
        }
        for (uint64_t i = 0; i < n; i++) (void)read_str(r, "an array string", &a->strs[i]);
        a->n = n;
        return NOPAD_OK;
    }
    if (type == GGUF_TYPE_ARRAY) {
        uint64_t cap = 0;
        for (uint64_t i = 0; i < n; i++) {
            st = grow((void **)&a->arrs, &cap, i, sizeof *a->arrs, r->where);
            if (st != NOPAD_OK) return st;
            a->n = i + 1; /* the child is zeroed, so freeing it is safe whatever happens */
            st = read_array(r, &a->arrs[i], depth + 1);
            if (st != NOPAD_OK) return st;
        }
        return NOPAD_OK;
    }
    const uint8_t *p = NULL;
    st = take(r, (size_t)(n * min), "the array elements", &p); /* fits: checked above */
    if (st == NOPAD_OK && type == GGUF_TYPE_BOOL) st = check_bools(r, p, n, 1);
    if (st == NOPAD_OK) a->n = n;
    return st;
}

static nopad_status read_value(reader *r, gguf_kv *kv) {
    uint32_t type;
    nopad_status st = read_u32(r, "the value type", &type);
    if (st == NOPAD_OK) st = check_value_type(r, type, "value type");
    if (st != NOPAD_OK) return st;
    kv->type = (gguf_type)type;
    if (type == GGUF_TYPE_STRING) return read_str(r, "the string value", &kv->str);
    if (type == GGUF_TYPE_ARRAY) return read_array(r, &kv->arr, 1);
    st = take(r, value_types[type].size, "the value", &kv->data);
    if (st == NOPAD_OK && type == GGUF_TYPE_BOOL) st = check_bools(r, kv->data, 1, 0);
    return st;
}

/* ---- lookups -------------------------------------------------------------------------------- */

static int compare_bytes(const char *a, uint64_t alen, const char *b, uint64_t blen) {
    int c = memcmp(a, b, (size_t)(alen < blen ? alen : blen));
    return c ? c : (alen < blen ? -1 : alen > blen);
}

static int compare_kv_keys(const void *x, const void *y) {
    const gguf_kv *a = *(const gguf_kv *const *)x, *b = *(const gguf_kv *const *)y;
    int c = compare_bytes(a->key.data, a->key.len, b->key.data, b->key.len);
    return c ? c : (a < b ? -1 : a > b); /* file order among equals: the report names both */
}

static int compare_tensor_names(const void *x, const void *y) {
    const gguf_tensor *a = *(const gguf_tensor *const *)x, *b = *(const gguf_tensor *const *)y;
    int c = strcmp(a->name, b->name);
    return c ? c : (a < b ? -1 : a > b);
}

const gguf_kv *gguf_find(const gguf_file *f, const char *key) {
    if (!f || !key || !f->kv_by_key) return NULL;
    size_t len = strlen(key);
    uint64_t lo = 0, hi = f->n_kv;
    while (lo < hi) {
        uint64_t mid = lo + (hi - lo) / 2;
        const gguf_kv *kv = f->kv_by_key[mid];
        int c = compare_bytes(key, len, kv->key.data, kv->key.len);
        if (c == 0) return kv;
        if (c < 0) hi = mid;
        else lo = mid + 1;
    }
    return NULL;
}

const gguf_tensor *gguf_find_tensor(const gguf_file *f, const char *name) {
    if (!f || !name || !f->tensor_by_name) return NULL;
    uint64_t lo = 0, hi = f->n_tensors;
    while (lo < hi) {
        uint64_t mid = lo + (hi - lo) / 2;
        const gguf_tensor *t = f->tensor_by_name[mid];
        int c = strcmp(name, t->name);
        if (c == 0) return t;
        if (c < 0) hi = mid;
        else lo = mid + 1;
    }
    return NULL;
}

/* ---- the file ------------------------------------------------------------------------------- */

static nopad_status read_header(reader *r, gguf_file *out, uint64_t *n_tensors, uint64_t *n_kv) {
    snprintf(r->section, sizeof r->section, "the header");
    if (r->size < 4)
        return nopad_set_error(NOPAD_ERR_FORMAT,
                               "%s: file is %zu bytes, too short for the magic 'GGUF'", r->where,
                               r->size);
    const uint8_t *m = r->buf;
    if (memcmp(m, "GGUF", 4) != 0) {
        char shown_magic[5];
        for (int i = 0; i < 4; i++) shown_magic[i] = m[i] >= 0x20 && m[i] < 0x7f ? (char)m[i] : '?';
        shown_magic[4] = '\0';
        return nopad_set_error(NOPAD_ERR_FORMAT,
                               "%s: not a GGUF file: starts with bytes %02x %02x %02x %02x "
                               "('%s'), expected 'GGUF'",
                               r->where, m[0], m[1], m[2], m[3], shown_magic);
    }
    r->pos = 4;
    uint32_t version;
    nopad_status st = read_u32(r, "the version", &version);
    if (st != NOPAD_OK) return st;
    /* A big-endian file's version 2 or 3 reads as 0x02000000 or 0x03000000 here. */
    if (version != 0 && (version & 0xffffu) == 0)
        return nopad_set_error(NOPAD_ERR_UNSUPPORTED,
                               "%s: version field reads 0x%08x: a big-endian GGUF file (only "
                               "little-endian files are supported)",
                               r->where, version);
    if (version == 1)
        return nopad_set_error(NOPAD_ERR_UNSUPPORTED,
                               "%s: GGUF version 1 is not supported (it used 32-bit counts and "
                               "lengths); expected version 2 or 3",
                               r->where);
    if (version != 2 && version != 3)
        return nopad_set_error(NOPAD_ERR_UNSUPPORTED,
                               "%s: GGUF version %u is not supported; expected version 2 or 3",
                               r->where, version);
    out->version = version;
    st = read_u64(r, "the tensor count", n_tensors);
    if (st == NOPAD_OK) st = read_u64(r, "the metadata count", n_kv);
    if (st != NOPAD_OK) return st;
    /* A pair takes at least 14 bytes (a non-empty key, a type, a one-byte value), a tensor info
     * at least 24 (name length, n_dims, type, offset); more cannot fit in what is left. */
    if (*n_kv > remaining(r) / 14)
        return nopad_set_error(NOPAD_ERR_FORMAT,
                               "%s: header claims %llu metadata pairs, but the %zu bytes after "
                               "the header hold at most %zu (each takes at least 14 bytes; file "
                               "truncated?)",
                               r->where, (unsigned long long)*n_kv, remaining(r),
                               remaining(r) / 14);
    if (*n_tensors > remaining(r) / 24)
        return nopad_set_error(NOPAD_ERR_FORMAT,
                               "%s: header claims %llu tensors, but the %zu bytes after the "
                               "header hold at most %zu tensor infos (each takes at least 24 "
                               "bytes; file truncated?)",
                               r->where, (unsigned long long)*n_tensors, remaining(r),
                               remaining(r) / 24);
    return NOPAD_OK;
}

static nopad_status read_metadata(reader *r, gguf_file *out, uint64_t n_kv) {
    uint64_t cap = 0;
    for (uint64_t i = 0; i < n_kv; i++) {
        nopad_status st = grow((void **)&out->kvs, &cap, i, sizeof *out->kvs, r->where);
        if (st != NOPAD_OK) return st;
        out->n_kv = i + 1;
        gguf_kv *kv = &out->kvs[i];
        snprintf(r->section, sizeof r->section, "metadata pair %llu", (unsigned long long)i);
        st = read_str(r, "the key", &kv->key);
        if (st != NOPAD_OK) return st;
        if (kv->key.len == 0)
            return nopad_set_error(NOPAD_ERR_FORMAT, "%s: metadata pair %llu has an empty key",
                                   r->where, (unsigned long long)i);
        snprintf(r->section, sizeof r->section, "metadata pair %llu ('%.*s')",
                 (unsigned long long)i, shown(kv->key.len), kv->key.data);
        st = read_value(r, kv);
        if (st != NOPAD_OK) return st;
    }
    if (n_kv == 0) return NOPAD_OK;
    out->kv_by_key = malloc((size_t)n_kv * sizeof *out->kv_by_key);
    if (!out->kv_by_key)
        return nopad_set_error(NOPAD_ERR_OUT_OF_MEMORY, "%s: index of %llu keys", r->where,
                               (unsigned long long)n_kv);
    for (uint64_t i = 0; i < n_kv; i++) out->kv_by_key[i] = &out->kvs[i];
    qsort(out->kv_by_key, (size_t)n_kv, sizeof *out->kv_by_key, compare_kv_keys);
    for (uint64_t i = 1; i < n_kv; i++) {
        const gguf_kv *a = out->kv_by_key[i - 1], *b = out->kv_by_key[i];
        if (compare_bytes(a->key.data, a->key.len, b->key.data, b->key.len) == 0)
            return nopad_set_error(NOPAD_ERR_FORMAT,
                                   "%s: key '%.*s' appears twice (metadata pairs %llu and %llu)",
                                   r->where, shown(a->key.len), a->key.data,
                                   (unsigned long long)(a - out->kvs),
                                   (unsigned long long)(b - out->kvs));
    }
    return NOPAD_OK;
}

static nopad_status read_alignment(const reader *r, gguf_file *out) {
    out->alignment = GGUF_DEFAULT_ALIGNMENT;
    const gguf_kv *kv = gguf_find(out, "general.alignment");
    if (!kv) return NOPAD_OK;
    if (kv->type != GGUF_TYPE_UINT32)
        return nopad_set_error(NOPAD_ERR_FORMAT, "%s: general.alignment is %s, expected uint32",
                               r->where, gguf_type_name(kv->type));
    uint32_t a = gguf_read_u32(kv->data);
    if (a == 0 || (a & (a - 1)) != 0)
        return nopad_set_error(NOPAD_ERR_FORMAT,
                               "%s: general.alignment is %u, expected a power of two", r->where,
                               a);
    out->alignment = a;
    return NOPAD_OK;
}

/* "[4096, 32000]" for messages. */
static void format_dims(char *buf, size_t cap, const uint64_t *dims, uint32_t n) {
    size_t used = (size_t)snprintf(buf, cap, "[");
    for (uint32_t d = 0; d < n && used < cap; d++)
        used += (size_t)snprintf(buf + used, cap - used, "%s%llu", d ? ", " : "",
                                 (unsigned long long)dims[d]);
    if (used < cap) snprintf(buf + used, cap - used, "]");
}

static nopad_status read_tensor_info(reader *r, gguf_tensor *t, uint64_t i) {
    snprintf(r->section, sizeof r->section, "tensor info %llu", (unsigned long long)i);
    gguf_str name;
    nopad_status st = read_str(r, "the tensor name", &name);
    if (st != NOPAD_OK) return st;
    if (name.len >= GGUF_MAX_NAME)
        return nopad_set_error(NOPAD_ERR_FORMAT,
                               "%s: tensor %llu: name '%.*s...' is %llu bytes, expected fewer "
                               "than %d",
                               r->where, (unsigned long long)i, 40, name.data,
                               (unsigned long long)name.len, GGUF_MAX_NAME);
    if (memchr(name.data, 0, (size_t)name.len))
        return nopad_set_error(NOPAD_ERR_FORMAT, "%s: tensor %llu: name contains a NUL byte",
                               r->where, (unsigned long long)i);
    memcpy(t->name, name.data, (size_t)name.len);
    t->name[name.len] = '\0';
    snprintf(r->section, sizeof r->section, "tensor info %llu ('%s')", (unsigned long long)i,
             t->name);

    st = read_u32(r, "the number of dimensions", &t->n_dims);
    if (st != NOPAD_OK) return st;
    if (t->n_dims > GGUF_MAX_DIMS)
        return nopad_set_error(NOPAD_ERR_FORMAT,
                               "%s: tensor '%s': %u dimensions, expected at most %d", r->where,
                               t->name, t->n_dims, GGUF_MAX_DIMS);
    uint64_t dims[GGUF_MAX_DIMS] = {1, 1, 1, 1};
    for (uint32_t d = 0; d < t->n_dims && st == NOPAD_OK; d++)
        st = read_u64(r, "a dimension", &dims[d]);
    if (st != NOPAD_OK) return st;
    char shape[128];
    format_dims(shape, sizeof shape, dims, t->n_dims);
    int64_t n = 1;
    for (int d = 0; d < GGUF_MAX_DIMS; d++) {
        if (dims[d] > (uint64_t)INT64_MAX)
            return nopad_set_error(NOPAD_ERR_FORMAT,
                                   "%s: tensor '%s': dimension %d is %llu, expected below 2^63",
                                   r->where, t->name, d, (unsigned long long)dims[d]);
        t->dims[d] = (int64_t)dims[d];
    }
    int zero = 0;
    for (int d = 0; d < GGUF_MAX_DIMS; d++) zero |= dims[d] == 0;
    for (int d = 0; d < GGUF_MAX_DIMS && !zero; d++) {
        if (t->dims[d] > INT64_MAX / n)
            return nopad_set_error(NOPAD_ERR_FORMAT,
                                   "%s: tensor '%s': shape %s has 2^63 or more elements",
                                   r->where, t->name, shape);
        n *= t->dims[d];
    }
    t->n_elements = zero ? 0 : n;

    st = read_u32(r, "the ggml type", &t->type);
    if (st != NOPAD_OK) return st;
    const char *type_name = gguf_tensor_type_name(t->type);
    if (!type_name)
        return nopad_set_error(NOPAD_ERR_FORMAT,
                               "%s: tensor '%s': unknown ggml type %u", r->where, t->name,
                               t->type);
    uint32_t block = tensor_types[t->type].block, size = tensor_types[t->type].size;
    if (t->dims[0] % block != 0)
        return nopad_set_error(NOPAD_ERR_FORMAT,
                               "%s: tensor '%s': type %s stores rows in blocks of %u elements, "
                               "but its rows (dimension 0) have %lld",
                               r->where, t->name, type_name, block, (long long)t->dims[0]);
    uint64_t blocks = (uint64_t)t->n_elements / block;
    if (blocks > (uint64_t)SIZE_MAX / size)
        return nopad_set_error(NOPAD_ERR_FORMAT,
                               "%s: tensor '%s': %s of type %s is too many bytes to address",
                               r->where, t->name, shape, type_name);
    t->nbytes = blocks * size;
    return read_u64(r, "the data offset", &t->offset);
}

/* Tensor data lies back to back in tensor-info order from the start of the data section, each
 * tensor padded to the alignment (llama.cpp requires exactly this), and inside the file. */
static nopad_status check_tensor_data(const reader *r, const gguf_file *out) {
    uint64_t expected = 0, align = out->alignment;
    uint64_t data_size = out->data_offset <= r->size ? r->size - out->data_offset : 0;
    for (uint64_t i = 0; i < out->n_tensors; i++) {
        const gguf_tensor *t = &out->tensors[i];
        if (t->offset % align != 0)
            return nopad_set_error(NOPAD_ERR_FORMAT,
                                   "%s: tensor '%s': data offset %llu is not a multiple of the "
                                   "alignment %u",
                                   r->where, t->name, (unsigned long long)t->offset,
                                   out->alignment);
        if (t->offset != expected)
            return nopad_set_error(NOPAD_ERR_FORMAT,
                                   "%s: tensor '%s': data offset %llu, expected %llu (tensor data "
                                   "lies back to back in tensor-info order, each padded to the "
                                   "alignment %u)",
                                   r->where, t->name, (unsigned long long)t->offset,
                                   (unsigned long long)expected, out->alignment);
        if (t->nbytes > data_size || t->offset > data_size - t->nbytes)
            return nopad_set_error(NOPAD_ERR_FORMAT,
                                   "%s: tensor '%s': its %llu bytes at data offset %llu run past "
                                   "the end of the file (the data section at byte %llu holds %llu "
                                   "bytes; file truncated?)",
                                   r->where, t->name, (unsigned long long)t->nbytes,
                                   (unsigned long long)t->offset,
                                   (unsigned long long)out->data_offset,
                                   (unsigned long long)data_size);
        /* both below data_size <= SIZE_MAX, so neither sum overflows */
        expected = t->offset + (t->nbytes + align - 1) / align * align;
    }
    return NOPAD_OK;
}

static nopad_status read_tensor_infos(reader *r, gguf_file *out, uint64_t n_tensors) {
    uint64_t cap = 0;
    for (uint64_t i = 0; i < n_tensors; i++) {
        nopad_status st = grow((void **)&out->tensors, &cap, i, sizeof *out->tensors, r->where);
        if (st != NOPAD_OK) return st;
        out->n_tensors = i + 1;
        st = read_tensor_info(r, &out->tensors[i], i);
        if (st != NOPAD_OK) return st;
    }
    if (n_tensors == 0) return NOPAD_OK;
    out->tensor_by_name = malloc((size_t)n_tensors * sizeof *out->tensor_by_name);
    if (!out->tensor_by_name)
        return nopad_set_error(NOPAD_ERR_OUT_OF_MEMORY, "%s: index of %llu tensors", r->where,
                               (unsigned long long)n_tensors);
    for (uint64_t i = 0; i < n_tensors; i++) out->tensor_by_name[i] = &out->tensors[i];
    qsort(out->tensor_by_name, (size_t)n_tensors, sizeof *out->tensor_by_name,
          compare_tensor_names);
    for (uint64_t i = 1; i < n_tensors; i++) {
        const gguf_tensor *a = out->tensor_by_name[i - 1], *b = out->tensor_by_name[i];
        if (strcmp(a->name, b->name) == 0)
            return nopad_set_error(NOPAD_ERR_FORMAT,
                                   "%s: tensor name '%s' appears twice (tensors %llu and %llu)",
                                   r->where, a->name, (unsigned long long)(a - out->tensors),
                                   (unsigned long long)(b - out->tensors));
    }
    return NOPAD_OK;
}

nopad_status gguf_parse(const uint8_t *buf, size_t size, const char *where, gguf_file *out) {
    if (!out) return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT, "gguf_parse: out is NULL");
    memset(out, 0, sizeof *out);
    if (!where) where = "<memory>";
    if (!buf && size)
        return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT, "%s: buffer is NULL but size is %zu",
                               where, size);
    reader r = {.buf = buf, .size = size, .where = where};
    out->bytes = buf;
    out->size = size;
    out->path = strdup(where);
    if (!out->path) return nopad_set_error(NOPAD_ERR_OUT_OF_MEMORY, "%s: path", where);
    uint64_t n_tensors = 0, n_kv = 0;
    nopad_status st = read_header(&r, out, &n_tensors, &n_kv);
    if (st == NOPAD_OK) st = read_metadata(&r, out, n_kv);
    if (st == NOPAD_OK) st = read_alignment(&r, out);
    if (st == NOPAD_OK) st = read_tensor_infos(&r, out, n_tensors);
    if (st == NOPAD_OK) {
        uint64_t a = out->alignment;
        out->data_offset = ((uint64_t)r.pos + a - 1) / a * a;
        if (n_tensors > 0 && out->data_offset > size)
            st = nopad_set_error(NOPAD_ERR_FORMAT,
                                 "%s: file truncated: the data section would start at byte %llu "
                                 "(the tensor infos end at %zu, padded to the alignment %u), but "
                                 "the file ends at %zu",
                                 where, (unsigned long long)out->data_offset, r.pos,
                                 out->alignment, size);
    }
    if (st == NOPAD_OK) st = check_tensor_data(&r, out);
    if (st != NOPAD_OK) gguf_close(out);
    return st;
}

nopad_status gguf_open(const char *path, gguf_file *out) {
    if (!out) return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT, "gguf_open: out is NULL");
    memset(out, 0, sizeof *out);
    if (!path) return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT, "gguf_open: path is NULL");
    /* O_NONBLOCK: a FIFO with no writer opens at once (and is refused below) */
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
    if (size == 0) { /* mmap of 0 bytes fails; the parser reports the empty file */
        close(fd);
        return gguf_parse((const uint8_t *)"", 0, path, out);
    }
    void *map = mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0);
    int e = errno;
    close(fd);
    if (map == MAP_FAILED)
        return nopad_set_error(NOPAD_ERR_IO, "%s: cannot mmap %zu bytes: %s", path, size,
                               strerror(e));
    nopad_status st = gguf_parse(map, size, path, out);
    if (st != NOPAD_OK) {
        munmap(map, size);
        return st;
    }
    out->map = map;
    out->map_size = size;
    return NOPAD_OK;
}

void gguf_close(gguf_file *f) {
    if (!f) return;
    for (uint64_t i = 0; i < f->n_kv && f->kvs; i++) free_array(&f->kvs[i].arr);
    free(f->kvs);
    free(f->kv_by_key);
    free(f->tensors);
    free(f->tensor_by_name);
    free(f->path);
    if (f->map) munmap(f->map, f->map_size);
    memset(f, 0, sizeof *f);
}

/* ---- typed getters -------------------------------------------------------------------------- */

static nopad_status find_typed(const gguf_file *f, const char *key, gguf_type type,
                               gguf_type element, const gguf_kv **out) {
    if (!f || !key || !out)
        return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT, "gguf: need a file, a key and out");
    const gguf_kv *kv = gguf_find(f, key);
    const char *where = f->path ? f->path : "<gguf>";
    const char *of = type == GGUF_TYPE_ARRAY ? " of " : "";
    const char *elem = type == GGUF_TYPE_ARRAY ? gguf_type_name(element) : "";
    if (!kv)
        return nopad_set_error(NOPAD_ERR_FORMAT, "%s: no key '%s' (expected %s%s%s)", where, key,
                               gguf_type_name(type), of, elem);
    if (kv->type != type || (type == GGUF_TYPE_ARRAY && kv->arr.type != element)) {
        const char *found_of = kv->type == GGUF_TYPE_ARRAY ? " of " : "";
        const char *found_elem = kv->type == GGUF_TYPE_ARRAY ? gguf_type_name(kv->arr.type) : "";
        return nopad_set_error(NOPAD_ERR_FORMAT, "%s: key '%s' is %s%s%s, expected %s%s%s", where,
                               key, gguf_type_name(kv->type), found_of, found_elem,
                               gguf_type_name(type), of, elem);
    }
    *out = kv;
    return NOPAD_OK;
}

nopad_status gguf_get_str(const gguf_file *f, const char *key, gguf_str *out) {
    const gguf_kv *kv = NULL;
    nopad_status st = find_typed(f, key, GGUF_TYPE_STRING, 0, &kv);
    if (st == NOPAD_OK) *out = kv->str;
    return st;
}

nopad_status gguf_get_u32(const gguf_file *f, const char *key, uint32_t *out) {
    const gguf_kv *kv = NULL;
    nopad_status st = find_typed(f, key, GGUF_TYPE_UINT32, 0, &kv);
    if (st == NOPAD_OK) *out = gguf_read_u32(kv->data);
    return st;
}

nopad_status gguf_get_i32(const gguf_file *f, const char *key, int32_t *out) {
    const gguf_kv *kv = NULL;
    nopad_status st = find_typed(f, key, GGUF_TYPE_INT32, 0, &kv);
    if (st == NOPAD_OK) {
        uint32_t u = gguf_read_u32(kv->data);
        memcpy(out, &u, sizeof *out);
    }
    return st;
}

nopad_status gguf_get_u64(const gguf_file *f, const char *key, uint64_t *out) {
    const gguf_kv *kv = NULL;
    nopad_status st = find_typed(f, key, GGUF_TYPE_UINT64, 0, &kv);
    if (st == NOPAD_OK) *out = gguf_read_u64(kv->data);
    return st;
}

nopad_status gguf_get_f32(const gguf_file *f, const char *key, float *out) {
    const gguf_kv *kv = NULL;
    nopad_status st = find_typed(f, key, GGUF_TYPE_FLOAT32, 0, &kv);
    if (st == NOPAD_OK) {
        uint32_t u = gguf_read_u32(kv->data);
        memcpy(out, &u, sizeof *out);
    }
    return st;
}

nopad_status gguf_get_bool(const gguf_file *f, const char *key, int *out) {
    const gguf_kv *kv = NULL;
    nopad_status st = find_typed(f, key, GGUF_TYPE_BOOL, 0, &kv);
    if (st == NOPAD_OK) *out = kv->data[0] != 0;
    return st;
}

static nopad_status get_array(const gguf_file *f, const char *key, gguf_type element,
                              const gguf_array **out) {
    const gguf_kv *kv = NULL;
    nopad_status st = find_typed(f, key, GGUF_TYPE_ARRAY, element, &kv);
    if (st == NOPAD_OK) *out = &kv->arr;
    return st;
}

nopad_status gguf_get_str_array(const gguf_file *f, const char *key, const gguf_array **out) {
    return get_array(f, key, GGUF_TYPE_STRING, out);
}

nopad_status gguf_get_f32_array(const gguf_file *f, const char *key, const gguf_array **out) {
    return get_array(f, key, GGUF_TYPE_FLOAT32, out);
}

nopad_status gguf_get_i32_array(const gguf_file *f, const char *key, const gguf_array **out) {
    return get_array(f, key, GGUF_TYPE_INT32, out);
}

float gguf_array_f32(const gguf_array *a, uint64_t i) {
    uint32_t u = gguf_read_u32(a->data + 4 * i);
    float v;
    memcpy(&v, &u, sizeof v);
    return v;
}

int32_t gguf_array_i32(const gguf_array *a, uint64_t i) {
    uint32_t u = gguf_read_u32(a->data + 4 * i);
    int32_t v;
    memcpy(&v, &u, sizeof v);
    return v;
}

gguf_str gguf_array_str(const gguf_array *a, uint64_t i) { return a->strs[i]; }

/* ---- tensor data ---------------------------------------------------------------------------- */

nopad_status gguf_tensor_data(const gguf_file *f, const gguf_tensor *t, const void **data,
                              size_t *nbytes) {
    if (!f || !t || !data || !nbytes)
        return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT,
                               "gguf_tensor_data: need a file, a tensor and outputs");
    const char *where = f->path ? f->path : "<gguf>";
    const char *name = gguf_tensor_type_name(t->type);
    if (!name || !tensor_types[t->type].supported)
        return nopad_set_error(NOPAD_ERR_UNSUPPORTED,
                               "%s: tensor '%s' has ggml type %s (%u), which is not supported "
                               "(F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q6_K)",
                               where, t->name, name ? name : "unknown", t->type);
    *data = f->bytes + f->data_offset + t->offset;
    *nbytes = (size_t)t->nbytes;
    return NOPAD_OK;
}
