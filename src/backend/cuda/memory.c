/* The CUDA backend's memory: allocations, float32 staging for uploads and downloads (converted to
 * the compute dtype on the device), copies. Every entry makes the backend's device current. */
#ifdef NOPAD_HAVE_CUDA

#include "backend/cuda/ops.h"
#include "backend/cuda/state.h"
#include "util/error.h"

nopad_status cuda_mem_alloc(nopad_backend *be, size_t bytes, void **out) {
    *out = NULL;
    CUDA_ENTER(be, s);
    (void)s;
    cudaError_t err = cudaMalloc(out, bytes ? bytes : 16);
    if (err != cudaSuccess) {
        cudaGetLastError(); /* clear the sticky-free error so later calls are unaffected */
        return nopad_set_error(NOPAD_ERR_OUT_OF_MEMORY, "cuda: cannot allocate %zu bytes: %s", bytes,
                               cudaGetErrorString(err));
    }
    return NOPAD_OK;
}

void cuda_mem_free(nopad_backend *be, void *ptr) {
    if (!ptr) return;
    cuda_use_device(state_of(be));
    cudaFree(ptr);
}

static nopad_status reserve_scratch(cuda_state *s, size_t bytes) {
    if (bytes <= s->scratch_bytes) return NOPAD_OK;
    if (s->scratch) cudaFree(s->scratch);
    s->scratch = NULL;
    s->scratch_bytes = 0;
    cudaError_t err = cudaMalloc((void **)&s->scratch, bytes);
    if (err != cudaSuccess) {
        cudaGetLastError();
        return nopad_set_error(NOPAD_ERR_OUT_OF_MEMORY, "cuda: cannot allocate %zu bytes of staging: %s",
                               bytes, cudaGetErrorString(err));
    }
    s->scratch_bytes = bytes;
    return NOPAD_OK;
}

/* Staging for n float32 elements, counted in the backend's extra bytes. */
static nopad_status reserve_staging(nopad_backend *be, cuda_state *s, size_t n) {
    nopad_status st = reserve_scratch(s, n * sizeof(float));
    be->extra_bytes = FIXED_EXTRA_BYTES + s->scratch_bytes;
    return st;
}

nopad_status cuda_mem_upload_f32(nopad_backend *be, void *dst, const float *src, size_t n) {
    CUDA_ENTER(be, s);
    nopad_status st = reserve_staging(be, s, n);
    if (st != NOPAD_OK) return st;
    st = cuda_check(cudaMemcpyAsync(s->scratch, src, n * sizeof(float), cudaMemcpyHostToDevice, s->stream),
                    "upload");
    if (st == NOPAD_OK) st = cuda_convert_from_f32(be->dtype, dst, s->scratch, n, s->stream);
    /* the caller may reuse `src` and the scratch at once: wait (only at load time) */
    if (st == NOPAD_OK) st = cuda_check(cudaStreamSynchronize(s->stream), "upload");
    return st;
}

nopad_status cuda_mem_download_f32(nopad_backend *be, float *dst, const void *src, size_t n) {
    CUDA_ENTER(be, s);
    nopad_status st = reserve_staging(be, s, n);
    if (st != NOPAD_OK) return st;
    st = cuda_convert_to_f32(be->dtype, s->scratch, src, n, s->stream);
    if (st == NOPAD_OK)
        st = cuda_check(cudaMemcpyAsync(dst, s->scratch, n * sizeof(float), cudaMemcpyDeviceToHost, s->stream),
                        "download");
    if (st == NOPAD_OK) st = cuda_check(cudaStreamSynchronize(s->stream), "download");
    return st;
}

nopad_status cuda_mem_download(nopad_backend *be, void *dst, const void *src, size_t bytes) {
    CUDA_ENTER(be, s);
    nopad_status st = cuda_check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, s->stream), "download");
    if (st == NOPAD_OK) st = cuda_check(cudaStreamSynchronize(s->stream), "download");
    return st;
}

nopad_status cuda_mem_upload(nopad_backend *be, void *dst, const void *src, size_t bytes) {
    CUDA_ENTER(be, s);
    return cuda_check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, s->stream), "upload");
}

nopad_status cuda_mem_upload_i32(nopad_backend *be, int32_t *dst, const int32_t *src, size_t n) {
    CUDA_ENTER(be, s);
    return cuda_check(cudaMemcpyAsync(dst, src, n * sizeof(int32_t), cudaMemcpyHostToDevice, s->stream), "upload");
}

void cuda_mem_release_staging(nopad_backend *be) {
    cuda_state *s = state_of(be);
    cuda_use_device(s);
    cudaStreamSynchronize(s->stream);
    if (s->scratch) cudaFree(s->scratch);
    s->scratch = NULL;
    s->scratch_bytes = 0;
    be->extra_bytes = FIXED_EXTRA_BYTES;
}

nopad_status cuda_mem_synchronize(nopad_backend *be) {
    CUDA_ENTER(be, s);
    return cuda_check(cudaStreamSynchronize(s->stream), "synchronize");
}

nopad_status cuda_mem_copy(nopad_backend *be, void *dst, const void *src, size_t bytes) {
    if (!bytes) return NOPAD_OK;
    CUDA_ENTER(be, s);
    return cuda_check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, s->stream), "copy");
}

nopad_status cuda_mem_copy_2d(nopad_backend *be, void *dst, size_t dst_pitch, const void *src, size_t src_pitch,
                              size_t width, size_t rows) {
    if (!width || !rows) return NOPAD_OK;
    CUDA_ENTER(be, s);
    return cuda_check(cudaMemcpy2DAsync(dst, dst_pitch, src, src_pitch, width, rows, cudaMemcpyDeviceToDevice,
                                        s->stream),
                      "copy_2d");
}

#endif /* NOPAD_HAVE_CUDA */
