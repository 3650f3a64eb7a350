/* Helpers of the GPU test programs (they link the CUDA runtime; the CPU tests do not). */
#ifndef NOPAD_CUDA_TESTUTIL_H
#define NOPAD_CUDA_TESTUTIL_H

#include <stdio.h>

#include <cuda_runtime.h>

#include "backend/backend.h"
#include "testutil.h"

/* 77 (ctest's "skipped") when no CUDA device is present, else 0. */
static inline int test_skip_without_gpu(void) {
    int n_dev = 0;
    if (cudaGetDeviceCount(&n_dev) != cudaSuccess || n_dev == 0) {
        printf("no CUDA device: skipping the GPU tests\n");
        return 77;
    }
    return 0;
}

/* Uploads host floats to a fresh device tensor of be's dtype and rewrites the host copy with the
 * rounded values, so the CPU reference computes on exactly what the GPU sees. */
static inline void *test_to_device(nopad_backend *be, float *host, size_t n) {
    void *dev;
    assert_nopad_ok(be->alloc(be, n * 2, &dev));
    assert_nopad_ok(be->upload_f32(be, dev, host, n));
    assert_nopad_ok(be->download_f32(be, host, dev, n));
    return dev;
}

#endif
