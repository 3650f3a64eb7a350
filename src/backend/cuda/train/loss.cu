/* CUDA: the training losses and their gradients: softmax cross-entropy over rows of up to tens of
 * thousands of classes (the MLM head's vocabulary), and squared error (regression). Logits and
 * their gradient in fp16 / bf16, losses in float32, arithmetic in float32. */
#include "backend/cuda/common.cuh"
#include "backend/cuda/train/train_kernels.h"

enum { CE_THREADS = 256, CE_WARPS = CE_THREADS / 32 };

/* (m, s) := the log-sum-exp state of both (m, s) and (m2, s2): m the running maximum and s the sum
 * of exp(x - m). Symmetric in its two states, so a butterfly gives every lane the same result. */
static __device__ __forceinline__ void lse_merge(float &m, float &s, float m2, float s2) {
    const float mx = fmaxf(m, m2);
    if (mx == -INFINITY) return; /* both empty */
    s = s * expf(m - mx) + s2 * expf(m2 - mx);
    m = mx;
}

/* One block per row. The row is read twice (the log-sum-exp, then the gradient), the second time
 * mostly from L2. Rows of an odd number of classes (BERT's 30522) are not 16-byte aligned: each
 * row is split into a scalar head up to the first 16-byte boundary, 8-element vectors, and a
 * scalar tail. VEC: logits and dlogits rows share their alignment (else all scalar). */
template <typename T, bool VEC>
__global__ void __launch_bounds__(CE_THREADS)
cross_entropy_kernel(float *__restrict__ losses32, T *dlogits, const T *logits, const int32_t *__restrict__ labels,
                     int classes, float grad_scale) {
    __shared__ float red_m[CE_WARPS], red_s[CE_WARPS];
    const int r = blockIdx.x, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const T *x = logits + (size_t)r * classes;
    T *dx = dlogits + (size_t)r * classes;
    const int label = labels[r];
    const bool label_ok = label >= 0 && label < classes;
    /* read before the barrier below: after it, threads overwrite the row when dlogits aliases it */
    const float x_label = threadIdx.x == 0 && label_ok ? to_f32(x[label]) : NAN;
    int head = 0, n_vec = 0;
    if (VEC) {
        const int mis = (int)(((uintptr_t)x & 15) / sizeof(T)); /* elements past a 16-byte boundary */
        head = mis ? min(8 - mis, classes) : 0;
        n_vec = (classes - head) / 8;
    }
    const int tail = head + 8 * n_vec;

    float m = -INFINITY, s = 0.0f;
    for (int c = threadIdx.x; c < head; c += blockDim.x) lse_merge(m, s, to_f32(x[c]), 1.0f);
    for (int v = threadIdx.x; v < n_vec; v += blockDim.x) {
        float e[8];
        load_vec<T, 8>(e, x + head + 8 * v);
        float vm = e[0];
#pragma unroll
        for (int j = 1; j < 8; j++) vm = fmaxf(vm, e[j]);
        const float mx = fmaxf(m, vm);
        float vs = 0.0f;
#pragma unroll
        for (int j = 0; j < 8; j++) vs += expf(e[j] - mx);
        s = (m == -INFINITY ? 0.0f : s * expf(m - mx)) + vs;
        m = mx;
    }
    for (int c = tail + threadIdx.x; c < classes; c += blockDim.x) lse_merge(m, s, to_f32(x[c]), 1.0f);
#pragma unroll
    for (int o = 16; o > 0; o /= 2) {
        const float m2 = __shfl_xor_sync(0xffffffffu, m, o), s2 = __shfl_xor_sync(0xffffffffu, s, o);
        lse_merge(m, s, m2, s2);
    }
    if (lane == 0) red_m[warp] = m, red_s[warp] = s;
    __syncthreads();
    float row_m = red_m[0], row_s = red_s[0];
#pragma unroll
    for (int w = 1; w < CE_WARPS; w++) lse_merge(row_m, row_s, red_m[w], red_s[w]);
    const float lse = row_m + logf(row_s);
    if (threadIdx.x == 0) losses32[r] = lse - x_label;

    /* dlogits = (softmax - onehot(label))·grad_scale; each thread rewrites what it read */
    for (int c = threadIdx.x; c < head; c += blockDim.x)
        dx[c] = from_f32<T>((expf(to_f32(x[c]) - lse) - (c == label ? 1.0f : 0.0f)) * grad_scale);
    for (int v = threadIdx.x; v < n_vec; v += blockDim.x) {
        const int c0 = head + 8 * v;
        float e[8];
        load_vec<T, 8>(e, x + c0);
#pragma unroll
        for (int j = 0; j < 8; j++) e[j] = (expf(e[j] - lse) - (c0 + j == label ? 1.0f : 0.0f)) * grad_scale;
        store_vec<T, 8>(dx + c0, e);
    }
    for (int c = tail + threadIdx.x; c < classes; c += blockDim.x)
        dx[c] = from_f32<T>((expf(to_f32(x[c]) - lse) - (c == label ? 1.0f : 0.0f)) * grad_scale);
}

template <typename T>
static nopad_status cross_entropy_t(float *losses32, void *dlogits, const void *logits, const int32_t *labels, int n,
                                    int classes, float grad_scale, cudaStream_t stream) {
    const bool vec = ((uintptr_t)logits & 15) == ((uintptr_t)dlogits & 15);
    if (vec)
        cross_entropy_kernel<T, true><<<n, CE_THREADS, 0, stream>>>(losses32, (T *)dlogits, (const T *)logits, labels,
                                                                    classes, grad_scale);
    else
        cross_entropy_kernel<T, false><<<n, CE_THREADS, 0, stream>>>(losses32, (T *)dlogits, (const T *)logits, labels,
                                                                     classes, grad_scale);
    return launch_status("train cross_entropy");
}

extern "C" nopad_status cuda_train_cross_entropy(nopad_dtype dtype, float *losses32, void *dlogits, const void *logits,
                                                 const int32_t *labels, int32_t n, int32_t classes, float grad_scale,
                                                 void *stream) {
    if (n <= 0) return NOPAD_OK;
    if (classes < 1)
        return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT, "cuda cross_entropy: %d classes", (int)classes);
    cudaStream_t s = (cudaStream_t)stream;
    DISPATCH_DTYPE(dtype, cross_entropy_t<__half>(losses32, dlogits, logits, labels, n, classes, grad_scale, s),
                   cross_entropy_t<__nv_bfloat16>(losses32, dlogits, logits, labels, n, classes, grad_scale, s));
}

/* losses32[i] = (pred - target)², dpred[i] = 2·(pred - target)·grad_scale (dpred may alias pred). */
template <typename T>
__global__ void squared_error_kernel(float *__restrict__ losses32, T *dpred, const T *pred,
                                     const float *__restrict__ target32, int n, float grad_scale) {
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
        const float diff = to_f32(pred[i]) - target32[i];
        losses32[i] = diff * diff;
        dpred[i] = from_f32<T>(2.0f * diff * grad_scale);
    }
}

extern "C" nopad_status cuda_train_squared_error(nopad_dtype dtype, float *losses32, void *dpred, const void *pred,
                                                 const float *target32, int32_t n, float grad_scale, void *stream) {
    if (n <= 0) return NOPAD_OK;
    cudaStream_t s = (cudaStream_t)stream;
    const int grid = grid_for((size_t)n, 256);
    switch (dtype) {
    case NOPAD_DTYPE_F16:
        squared_error_kernel<__half><<<grid, 256, 0, s>>>(losses32, (__half *)dpred, (const __half *)pred, target32, n,
                                                          grad_scale);
        break;
    case NOPAD_DTYPE_BF16:
        squared_error_kernel<__nv_bfloat16><<<grid, 256, 0, s>>>(losses32, (__nv_bfloat16 *)dpred,
                                                                 (const __nv_bfloat16 *)pred, target32, n, grad_scale);
        break;
    default: return nopad_set_error(NOPAD_ERR_UNSUPPORTED, "cuda: dtype %d is not F16 or BF16", (int)dtype);
    }
    return launch_status("train squared_error");
}
