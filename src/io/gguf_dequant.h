/* GGUF tensor data to float32, value for value what ggml's dequantize_row_* (ggml-quants.c) and
 * its fp16 / bf16 conversions give: F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K and Q6_K.
 *
 * Output is in storage order: dims[0] varies fastest. A 2-D weight stored with dims = [in, out]
 * comes out as `out` rows of `in` floats, i.e. row-major [out, in], nn.Linear's layout. A row is
 * dims[0] elements; a tensor has dims[1]·dims[2]·dims[3] rows, each a whole number of blocks.
 *
 * Every product of a quant and its fp16 scales is exact in float32, so each value is rounded at
 * most once (at Q4_1's, Q5_1's and Q4_K's final add) and the result is bit for bit that of ggml's
 * reference code and of the `gguf` Python package's dequantize(), on any build. fp16 -> f32 is
 * exact for all 65536 inputs, subnormals included; a signalling NaN comes out quiet with its
 * payload kept (IEEE 754, the F16C instruction and ggml's conversions all do this); bf16 -> f32
 * is the bits shifted up 16. */
#ifndef NOPAD_IO_GGUF_DEQUANT_H
#define NOPAD_IO_GGUF_DEQUANT_H

#include <stdint.h>

#include "io/gguf.h"
#include "nopad.h"

/* The rows of t: dims[1]·dims[2]·dims[3] (INT64_MAX if that overflows, which only a tensor
 * with dims[0] = 0 can do). */
int64_t gguf_tensor_rows(const gguf_tensor *t);

/* All t->n_elements values of t into out (float[t->n_elements]). Large tensors are converted by
 * the OpenMP threads, each taking a contiguous run of blocks. A type other than the ten above
 * is NOPAD_ERR_UNSUPPORTED naming the file, the tensor and the type. */
nopad_status gguf_tensor_to_f32(const gguf_file *f, const gguf_tensor *t, float *out);

/* Rows [first_row, first_row + n_rows) of t into out (float[n_rows · dims[0]]), on the calling
 * thread only: for converting an embedding table in parts, or a large tensor from threads the
 * caller runs. A range outside [0, gguf_tensor_rows(t)] is NOPAD_ERR_INVALID_ARGUMENT naming
 * the tensor, the range and its row count; types as gguf_tensor_to_f32. */
nopad_status gguf_rows_to_f32(const gguf_file *f, const gguf_tensor *t, int64_t first_row,
                              int64_t n_rows, float *out);

/* n values of ggml type `type` from their bytes at src (n a multiple of the type's block size,
 * src the start of a block, any alignment) into out, on the calling thread. For callers holding
 * the bytes already (one row of an mmap'd embedding table). An unsupported type is
 * NOPAD_ERR_UNSUPPORTED, an n that is not whole blocks NOPAD_ERR_INVALID_ARGUMENT. */
nopad_status gguf_dequantize(uint32_t type, const void *src, int64_t n, float *out);

/* One IEEE binary16 / bfloat16 value, given as its bits, to float32 (exact). */
float gguf_fp16_to_f32(uint16_t h);
float gguf_bf16_to_f32(uint16_t h);

#endif
