/* safetensors reader: mmap + validation as strict as the reference implementation
 * (huggingface/safetensors tensor.rs): header size bound, well-formed JSON, known dtype,
 * shape x dtype size == byte range, ranges inside the buffer, no overlaps and no holes.
 * Also sharded checkpoints (model.safetensors.index.json). */
#ifndef NOPAD_IO_SAFETENSORS_H
#define NOPAD_IO_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "nopad.h"

enum { SAFETENSORS_MAX_DIMS = 8 };
#define SAFETENSORS_MAX_HEADER_SIZE 100000000ull /* the reference reader's bound */

typedef enum safetensors_dtype {
    ST_BOOL, ST_U8, ST_I8, ST_I16, ST_U16, ST_F16, ST_BF16, ST_I32, ST_U32, ST_F32, ST_F64,
    ST_I64, ST_U64, ST_F8_E4M3, ST_F8_E5M2,
} safetensors_dtype;

typedef struct safetensors_tensor {
    char *name;                 /* owned */
    safetensors_dtype dtype;
    int ndim;                   /* 0 for a scalar */
    int64_t shape[SAFETENSORS_MAX_DIMS];
    int64_t n_elements;
    size_t nbytes;
    const void *data;           /* points into the mapping (may be unaligned) */
} safetensors_tensor;

typedef struct safetensors_file {
    char *path;                 /* owned, for messages */
    void *map;                  /* mmap'd file, or NULL for an in-memory parse */
    size_t map_size;
    safetensors_tensor *tensors;/* [n_tensors] sorted by name */
    int n_tensors;
} safetensors_file;

/* Validates and indexes `size` bytes at `buf` (not copied; must outlive `out`). `where` names the
 * source in error messages. This is the fuzzed entry point. */
nopad_status safetensors_parse(const uint8_t *buf, size_t size, const char *where,
                               safetensors_file *out);
/* mmaps `path` and parses it. */
nopad_status safetensors_open(const char *path, safetensors_file *out);
void safetensors_close(safetensors_file *f);
const safetensors_tensor *safetensors_find(const safetensors_file *f, const char *name);

const char *safetensors_dtype_name(safetensors_dtype dtype);
size_t safetensors_dtype_size(safetensors_dtype dtype);

/* A checkpoint folder: model.safetensors, or model.safetensors.index.json and its shards. */
typedef struct safetensors_checkpoint {
    safetensors_file *files;
    int n_files;
} safetensors_checkpoint;

nopad_status safetensors_checkpoint_open(const char *dir, safetensors_checkpoint *out);
void safetensors_checkpoint_close(safetensors_checkpoint *c);
/* The tensor called `name` in any shard, or NULL. */
const safetensors_tensor *safetensors_checkpoint_find(const safetensors_checkpoint *c,
                                                      const char *name);

/* Converts an F32, F16 or BF16 tensor to float32 (dst has n_elements floats). Other dtypes ->
 * NOPAD_ERR_UNSUPPORTED naming the tensor. */
nopad_status safetensors_to_f32(const safetensors_tensor *t, float *dst);

#endif
