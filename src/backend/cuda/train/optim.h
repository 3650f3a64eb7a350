/* Internal: the optimiser steps of the CUDA backend (optim.cu) as multi-tensor kernels over the
 * caller's list of parameter tensors (nopad_opt_tensor, backend.h): AdamW, LAMB and torch's
 * clip_grad_norm_. The list is host memory; it reaches the kernels as kernel parameters, in
 * batches of (tensor, chunk) entries, so nothing waits for the host. Every reduction (the global
 * gradient norm, LAMB's per-tensor norms) stays on the device and runs in a fixed order. */
#ifndef NOPAD_BACKEND_CUDA_TRAIN_OPTIM_H
#define NOPAD_BACKEND_CUDA_TRAIN_OPTIM_H

#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime.h>

#include "backend/backend.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Device scratch that lamb and clip_grad_norm need for this list (per-chunk partial sums, the
 * global norm, per-tensor trust ratios); adamw needs none. */
size_t cuda_optim_workspace_bytes(const nopad_opt_tensor *tensors, int32_t n_tensors);

/* backend.h's adamw; param_compute (when not NULL) receives the new weights in `dtype`. */
nopad_status cuda_optim_adamw(nopad_dtype dtype, const nopad_opt_tensor *tensors, int32_t n_tensors,
                              const nopad_opt_step *h, cudaStream_t stream);

/* backend.h's lamb; ws: cuda_optim_workspace_bytes of device memory; grad_norm32: device or NULL. */
nopad_status cuda_optim_lamb(nopad_dtype dtype, const nopad_opt_tensor *tensors, int32_t n_tensors,
                             const nopad_opt_step *h, float *grad_norm32, void *ws, cudaStream_t stream);

/* backend.h's clip_grad_norm; ws and grad_norm32 as for lamb. */
nopad_status cuda_optim_clip_grad_norm(const nopad_opt_tensor *tensors, int32_t n_tensors, float max_norm,
                                       float *grad_norm32, void *ws, cudaStream_t stream);

#ifdef __cplusplus
}
#endif
#endif
