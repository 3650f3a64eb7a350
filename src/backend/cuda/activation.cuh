/* The activations of nopad_activation on one fp32 value, shared by the CUDA kernels that apply them
 * (activation.cu's bias + activation pass, gemm/skinny.cu's fused epilogue), so every path uses
 * the same formula. act < 0: none. */
#ifndef NOPAD_BACKEND_CUDA_ACTIVATION_CUH
#define NOPAD_BACKEND_CUDA_ACTIVATION_CUH

#include "backend/backend.h"

static __device__ __forceinline__ float apply_activation(float v, int act) {
    switch (act) {
    case NOPAD_ACT_GELU: return 0.5f * v * (1.0f + erff(v * 0.70710678118654752f));
    case NOPAD_ACT_GELU_TANH:
        return 0.5f * v * (1.0f + tanhf(0.79788456080286536f * (v + 0.044715f * v * v * v)));
    case NOPAD_ACT_RELU: return v > 0.0f ? v : 0.0f;
    case NOPAD_ACT_SILU: return v / (1.0f + __expf(-v));
    case NOPAD_ACT_TANH: return tanhf(v); /* the classification heads' pooler */
    default: return v;
    }
}

#endif
