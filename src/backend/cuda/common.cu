/* The queries of common.h: the current device, SMs per device, the PDL switches. */
#include <cuda_runtime.h>

#include "backend/cuda/common.h"
#include "util/knobs.h"

extern "C" int cuda_current_device(void) {
    int dev = 0;
    if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= CUDA_MAX_DEVICES) {
        cudaGetLastError();
        return -1;
    }
    return dev;
}

extern "C" int cuda_sm_count(void) {
    static int cached[CUDA_MAX_DEVICES];
    const int dev = cuda_current_device();
    if (dev < 0) return 132;
    int n = cuda_cache_load(&cached[dev]);
    if (!n) {
        if (cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess || n <= 0) {
            cudaGetLastError();
            n = 132;
        }
        cuda_cache_store(&cached[dev], n);
    }
    return n;
}

extern "C" int cuda_pdl_enabled(void) { return knob_int(KNOB_PDL) != 0; }

extern "C" int cuda_pdl_tensor_enabled(void) { return cuda_pdl_enabled() && knob_int(KNOB_PDL_TENSOR) != 0; }
