/* The helpers state.h declares for every file of the backend: CUDA errors as nopad errors, and the
 * backend's device made current. */
#ifdef NOPAD_HAVE_CUDA

#include <cuda_runtime.h>

#include "backend/cuda/state.h"
#include "util/error.h"

nopad_status cuda_check(cudaError_t err, const char *what) {
    if (err == cudaSuccess) return NOPAD_OK;
    return nopad_set_error(NOPAD_ERR_BACKEND, "cuda %s: %s", what, cudaGetErrorString(err));
}

nopad_status cuda_use_device(const cuda_state *s) {
    int current = -1;
    if (cudaGetDevice(&current) == cudaSuccess && current == s->device) return NOPAD_OK;
    cudaGetLastError();
    return cuda_check(cudaSetDevice(s->device), "set device");
}

#endif /* NOPAD_HAVE_CUDA */
