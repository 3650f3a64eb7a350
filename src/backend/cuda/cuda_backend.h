/* The CUDA backend's constructor and the few things the model needs beyond the op table. */
#ifndef NOPAD_BACKEND_CUDA_BACKEND_H
#define NOPAD_BACKEND_CUDA_BACKEND_H

#include <stdint.h>

#include "backend/backend.h"

/* Creates the CUDA backend computing in `dtype` (F16 or BF16) on device ordinal `device`, on
 * `stream` (a cudaStream_t of that device owned by the caller), or on a stream of its own when
 * NULL. */
nopad_status nopad_backend_cuda_create(nopad_dtype dtype, int device, void *stream, nopad_backend **out);

/* The backend's stream (a cudaStream_t), for callers that time or order work around its ops. */
void *cuda_backend_stream(nopad_backend *be);

#endif
