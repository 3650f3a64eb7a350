/* CUDA training ops: gemm_backward (cuBLASLt for dx and dw32, a column sum for db32:
 * gemm_backward.{h,c}, bias_grad.cu), the FFN's GELU fused into its GEMMs (gemm_act_aux,
 * gemm_dx_act: gemm/cutlass_train.cu) and the optimisers adamw, lamb, clip_grad_norm (multi-tensor
 * kernels: optim.{h,cu}). Each op makes the backend's device current and enqueues on its stream;
 * none waits for the host. */
#ifdef NOPAD_HAVE_CUDA

#include <stdlib.h>

#include "backend/cuda/gemm/cutlass.h"
#include "backend/cuda/state.h"
#include "backend/cuda/train/gemm_backward.h"
#include "backend/cuda/train/optim.h"
#include "backend/cuda/train/train_ops.h"
#include "util/error.h"

/* Grows the training scratch to `need` bytes. Graphs recorded earlier name the old buffer, so
 * they are forgotten; nothing may be allocated while a graph is being recorded (a shape must run
 * once outside a recording first, as graph_run arranges). Growing waits for the stream once. */
static nopad_status grow_train_ws(nopad_backend *be, cuda_state *s, size_t need) {
    if (need <= s->train_ws_bytes) return NOPAD_OK;
    enum cudaStreamCaptureStatus capturing = cudaStreamCaptureStatusNone;
    if (cudaStreamIsCapturing(s->stream, &capturing) != cudaSuccess) cudaGetLastError();
    if (capturing != cudaStreamCaptureStatusNone)
        return nopad_set_error(NOPAD_ERR_INTERNAL, "cuda training scratch: must grow to %zu bytes during a graph recording",
                               need);
    if (s->train_ws) {
        cuda_graph_clear(be);
        nopad_status st = cuda_check(cudaStreamSynchronize(s->stream), "training scratch");
        if (st != NOPAD_OK) return st;
        cudaFree(s->train_ws);
        s->train_ws = NULL;
        s->train_ws_bytes = 0;
    }
    /* with a quarter to spare, so slowly growing lists do not reallocate every step */
    const size_t bytes = need + need / 4;
    nopad_status st = cuda_check(cudaMalloc(&s->train_ws, bytes), "training scratch");
    if (st == NOPAD_OK) s->train_ws_bytes = bytes;
    else s->train_ws = NULL;
    return st;
}

void cuda_train_gemm_optim_release(cuda_state *s) {
    cuda_train_gemm_plans_free(s->train_gemm_plans);
    s->train_gemm_plans = NULL;
    if (s->train_ws) cudaFree(s->train_ws);
    s->train_ws = NULL;
    s->train_ws_bytes = 0;
}

/* y[T, N] = x[T, K]·w[N, K]ᵀ (+ b): dx[T, K] = dy·w (+= when accumulate_dx), dw32[N, K] += dyᵀ·x,
 * db32[N] += Σ_t dy; any of the three may be NULL. */
static nopad_status cu_gemm_backward(nopad_backend *be, void *dx, float *dw32, float *db32, const void *dy,
                                     const void *x, const void *w, int32_t n_tokens, int32_t n_in, int32_t n_out,
                                     int accumulate_dx) {
    CUDA_ENTER(be, s);
    if (n_tokens < 0 || n_in <= 0 || n_out <= 0)
        return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT, "cuda gemm_backward: T = %d, K = %d, N = %d", (int)n_tokens,
                               (int)n_in, (int)n_out);
    if (n_tokens == 0) return NOPAD_OK; /* no rows of dx; nothing to add to dw32, db32 */
    if (!dy || (dx && !w) || (dw32 && !x))
        return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT, "cuda gemm_backward: NULL input (dy %p, x %p, w %p)", dy, x,
                               w);
    nopad_status st = NOPAD_OK;
    if (dx)
        st = cuda_train_gemm_dx(&s->lt, &s->train_gemm_plans, be->dtype, dx, dy, w, n_tokens, n_in, n_out,
                                accumulate_dx, s->stream);
    if (st == NOPAD_OK && dw32)
        st = cuda_train_gemm_dw(&s->lt, &s->train_gemm_plans, be->dtype, dw32, dy, x, n_tokens, n_in, n_out,
                                s->stream);
    if (st == NOPAD_OK && db32) {
        st = grow_train_ws(be, s, cuda_bias_grad_workspace_bytes(n_tokens, n_out));
        if (st == NOPAD_OK) st = cuda_bias_grad(be->dtype, db32, dy, n_tokens, n_out, s->train_ws, s->stream);
    }
    return st;
}

/* The FFN's exact GELU fused into its GEMMs (gemm/cutlass_train.cu); other activations and dtypes
 * come back unsupported, and the step runs the unfused ops. */
static nopad_status cu_gemm_act_aux(nopad_backend *be, void *y, void *aux, const void *x, const void *w,
                                    const void *b, int32_t n_tokens, int32_t n_in, int32_t n_out,
                                    nopad_activation act) {
    CUDA_ENTER(be, s);
    if (act != NOPAD_ACT_GELU)
        return nopad_set_error(NOPAD_ERR_UNSUPPORTED, "cuda gemm_act_aux: fused for the exact GELU only");
    if (n_tokens == 0) return NOPAD_OK;
    return cuda_gemm_gelu_aux(be->dtype, y, aux, x, w, b, n_tokens, n_in, n_out, s->stream);
}

static nopad_status cu_gemm_dx_act(nopad_backend *be, void *dx, const void *dy, const void *w, const void *aux,
                                   int32_t n_tokens, int32_t n_in, int32_t n_out, nopad_activation act) {
    CUDA_ENTER(be, s);
    if (act != NOPAD_ACT_GELU)
        return nopad_set_error(NOPAD_ERR_UNSUPPORTED, "cuda gemm_dx_act: fused for the exact GELU only");
    if (n_tokens == 0) return NOPAD_OK;
    return cuda_gemm_dgelu(be->dtype, dx, dy, w, aux, n_tokens, n_in, n_out, s->stream);
}

static nopad_status cu_adamw(nopad_backend *be, const nopad_opt_tensor *tensors, int32_t n_tensors,
                             const nopad_opt_step *h) {
    CUDA_ENTER(be, s);
    return cuda_optim_adamw(be->dtype, tensors, n_tensors, h, s->stream);
}

static nopad_status cu_lamb(nopad_backend *be, const nopad_opt_tensor *tensors, int32_t n_tensors,
                            const nopad_opt_step *h, float *grad_norm32) {
    CUDA_ENTER(be, s);
    nopad_status st = grow_train_ws(be, s, cuda_optim_workspace_bytes(tensors, n_tensors));
    if (st != NOPAD_OK) return st;
    return cuda_optim_lamb(be->dtype, tensors, n_tensors, h, grad_norm32, s->train_ws, s->stream);
}

static nopad_status cu_clip_grad_norm(nopad_backend *be, const nopad_opt_tensor *tensors, int32_t n_tensors,
                                      float max_norm, float *grad_norm32) {
    CUDA_ENTER(be, s);
    nopad_status st = grow_train_ws(be, s, cuda_optim_workspace_bytes(tensors, n_tensors));
    if (st != NOPAD_OK) return st;
    return cuda_optim_clip_grad_norm(tensors, n_tensors, max_norm, grad_norm32, s->train_ws, s->stream);
}

void cuda_train_install_gemm_optim(nopad_backend *be) {
    be->gemm_backward = cu_gemm_backward;
    be->gemm_act_aux = cu_gemm_act_aux;
    be->gemm_dx_act = cu_gemm_dx_act;
    be->adamw = cu_adamw;
    be->lamb = cu_lamb;
    be->clip_grad_norm = cu_clip_grad_norm;
}

#endif /* NOPAD_HAVE_CUDA */
