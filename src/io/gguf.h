/* GGUF reader (ggml's docs/gguf.md, versions 2 and 3, little-endian): header, every metadata
 * key-value pair (all 13 value types, arrays nested to GGUF_MAX_ARRAY_DEPTH), tensor infos, and
 * the tensor data as pointers into a read-only mapping. Strings and arrays are views into the
 * file's bytes, never copies.
 *
 * The checks follow llama.cpp's gguf.cpp, the reference reader, so that a file is accepted here
 * when llama.cpp accepts it: no empty or duplicate keys, general.alignment a uint32 power of two,
 * tensor names shorter than 64 bytes and unique, at most 4 dimensions, element counts below 2^63,
 * rows a whole number of blocks, and tensor data back to back in file order, each tensor at the
 * running offset padded to the alignment. Beyond llama.cpp: every tensor's bytes must lie inside
 * the file, bools must be 0 or 1, and arrays may nest (the format allows it). Every count and
 * length is checked against the bytes left before anything is allocated for it. */
#ifndef NOPAD_IO_GGUF_H
#define NOPAD_IO_GGUF_H

#include <stddef.h>
#include <stdint.h>

#include "nopad.h"

enum {
    GGUF_MAX_DIMS = 4,            /* ggml's GGML_MAX_DIMS */
    GGUF_MAX_NAME = 64,           /* tensor names are shorter (ggml's GGML_MAX_NAME) */
    GGUF_DEFAULT_ALIGNMENT = 32,  /* when general.alignment is absent */
    GGUF_MAX_ARRAY_DEPTH = 8,     /* arrays of arrays: deeper nesting is refused */
};

/* Metadata value types, numbered as in the file. */
typedef enum gguf_type {
    GGUF_TYPE_UINT8 = 0,
    GGUF_TYPE_INT8 = 1,
    GGUF_TYPE_UINT16 = 2,
    GGUF_TYPE_INT16 = 3,
    GGUF_TYPE_UINT32 = 4,
    GGUF_TYPE_INT32 = 5,
    GGUF_TYPE_FLOAT32 = 6,
    GGUF_TYPE_BOOL = 7,
    GGUF_TYPE_STRING = 8,
    GGUF_TYPE_ARRAY = 9,
    GGUF_TYPE_UINT64 = 10,
    GGUF_TYPE_INT64 = 11,
    GGUF_TYPE_FLOAT64 = 12,
} gguf_type;

/* ggml tensor types, numbered as in the file (ggml.h's enum ggml_type). Only these have their
 * data handed out (gguf_tensor_data); the others are parsed, sized and bounds-checked. */
typedef enum gguf_tensor_type {
    GGUF_TENSOR_F32 = 0,
    GGUF_TENSOR_F16 = 1,
    GGUF_TENSOR_Q4_0 = 2,
    GGUF_TENSOR_Q4_1 = 3,
    GGUF_TENSOR_Q5_0 = 6,
    GGUF_TENSOR_Q5_1 = 7,
    GGUF_TENSOR_Q8_0 = 8,
    GGUF_TENSOR_Q4_K = 12,
    GGUF_TENSOR_Q6_K = 14,
    GGUF_TENSOR_BF16 = 30,
} gguf_tensor_type;

/* A string in the file: `len` bytes at `data`, not NUL-terminated, not checked to be UTF-8. */
typedef struct gguf_str {
    const char *data;
    uint64_t len;
} gguf_str;

typedef struct gguf_array gguf_array;
struct gguf_array {
    gguf_type type;      /* of the elements */
    uint64_t n;
    const uint8_t *data; /* fixed-size elements: n of them back to back, little-endian, at any
                          * byte offset (read them with the gguf_array_* accessors) */
    gguf_str *strs;      /* type STRING: the n strings (owned by the file) */
    gguf_array *arrs;    /* type ARRAY: the n nested arrays (owned by the file) */
};

typedef struct gguf_kv {
    gguf_str key;
    gguf_type type;
    const uint8_t *data; /* a fixed-size value's bytes (little-endian, any offset) */
    gguf_str str;        /* type STRING */
    gguf_array arr;      /* type ARRAY */
} gguf_kv;

typedef struct gguf_tensor {
    char name[GGUF_MAX_NAME]; /* NUL-terminated copy */
    uint32_t n_dims;
    int64_t dims[GGUF_MAX_DIMS]; /* dims[0] varies fastest; dims past n_dims are 1 */
    uint32_t type;               /* a ggml type id (gguf_tensor_type for the supported ones) */
    uint64_t offset;             /* from the start of the data section */
    int64_t n_elements;
    uint64_t nbytes;
} gguf_tensor;

typedef struct gguf_file {
    char *path;           /* owned, for messages */
    void *map;            /* the mmap'd file, or NULL for an in-memory parse */
    size_t map_size;
    const uint8_t *bytes; /* what was parsed (the mapping or the caller's buffer) */
    size_t size;
    uint32_t version;     /* 2 or 3 */
    gguf_kv *kvs;         /* [n_kv] in file order: iterate over these */
    uint64_t n_kv;
    gguf_tensor *tensors; /* [n_tensors] in file order */
    uint64_t n_tensors;
    uint32_t alignment;   /* general.alignment, else 32 */
    uint64_t data_offset; /* where the data section starts, from the start of the file */
    const gguf_kv **kv_by_key;            /* [n_kv] sorted by key, for lookups */
    const gguf_tensor **tensor_by_name;   /* [n_tensors] sorted by name */
} gguf_file;

/* Validates and indexes `size` bytes at `buf` (not copied; they must outlive `out`). `where`
 * names the source in messages. The fuzzed entry point. On failure `out` holds nothing to free. */
nopad_status gguf_parse(const uint8_t *buf, size_t size, const char *where, gguf_file *out);
/* mmaps `path` read-only and parses it. */
nopad_status gguf_open(const char *path, gguf_file *out);
void gguf_close(gguf_file *f);

/* "uint32", "array", ...; "unknown" for ids past 12. */
const char *gguf_type_name(gguf_type type);
/* "Q4_K", ...; NULL for an id ggml does not define. */
const char *gguf_tensor_type_name(uint32_t type);

/* ---- metadata ------------------------------------------------------------------------------- */

/* The pair whose key is `key`, or NULL. */
const gguf_kv *gguf_find(const gguf_file *f, const char *key);

/* Typed getters. A missing key or a value of another type is NOPAD_ERR_FORMAT naming the file,
 * the key, the type found and the type expected. Strings are views into the file. */
nopad_status gguf_get_str(const gguf_file *f, const char *key, gguf_str *out);
nopad_status gguf_get_u32(const gguf_file *f, const char *key, uint32_t *out);
nopad_status gguf_get_i32(const gguf_file *f, const char *key, int32_t *out);
nopad_status gguf_get_u64(const gguf_file *f, const char *key, uint64_t *out);
nopad_status gguf_get_f32(const gguf_file *f, const char *key, float *out);
nopad_status gguf_get_bool(const gguf_file *f, const char *key, int *out);
/* An array whose elements are strings / float32 / int32. */
nopad_status gguf_get_str_array(const gguf_file *f, const char *key, const gguf_array **out);
nopad_status gguf_get_f32_array(const gguf_file *f, const char *key, const gguf_array **out);
nopad_status gguf_get_i32_array(const gguf_file *f, const char *key, const gguf_array **out);

/* Element i of an array of that element type (i < a->n; no checks). */
float gguf_array_f32(const gguf_array *a, uint64_t i);
int32_t gguf_array_i32(const gguf_array *a, uint64_t i);
gguf_str gguf_array_str(const gguf_array *a, uint64_t i);

/* A fixed-size scalar, read from its little-endian bytes (the type must match; no checks). */
uint64_t gguf_read_u64(const uint8_t *p);
uint32_t gguf_read_u32(const uint8_t *p);

/* ---- tensors -------------------------------------------------------------------------------- */

/* The tensor called `name`, or NULL. */
const gguf_tensor *gguf_find_tensor(const gguf_file *f, const char *name);
/* Where a tensor's bytes are (inside the file, checked at parse). A type other than F32, F16,
 * BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K and Q6_K is NOPAD_ERR_UNSUPPORTED naming the type and tensor. */
nopad_status gguf_tensor_data(const gguf_file *f, const gguf_tensor *t, const void **data,
                              size_t *nbytes);

#endif
