/* The small vocabulary every layer shares: activation functions and element sizes. Plain enums,
 * no behaviour; io/ fills them from config files, backend/ implements them, model/ passes them. */
#ifndef NOPAD_UTIL_TYPES_H
#define NOPAD_UTIL_TYPES_H

#include <stddef.h>

#include "nopad.h"

typedef enum nopad_activation {
    NOPAD_ACT_GELU = 0,      /* exact: 0.5·x·(1 + erf(x/√2)) — HF "gelu" */
    NOPAD_ACT_GELU_TANH = 1, /* tanh approximation — HF "gelu_new", "gelu_pytorch_tanh" */
    NOPAD_ACT_RELU = 2,
    NOPAD_ACT_SILU = 3,      /* x·sigmoid(x) — the gate of LLaMA's SwiGLU MLP */
    NOPAD_ACT_TANH = 4,      /* BERT's pooler: the training ops (activation, its backward) and
                                the CPU backend's gemm epilogue (classification heads) take it */
} nopad_activation;

/* Bytes of one element of `dtype`. */
size_t nopad_dtype_size(nopad_dtype dtype);
/* "F32", "F16" or "BF16", as safetensors and messages write it. */
const char *nopad_dtype_name(nopad_dtype dtype);

#endif
