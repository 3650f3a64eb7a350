/* Internal: the CUDA backend's training ops (backend.h, section "training"), by family. Each
 * install function fills its entries of the op table; cuda_backend.c calls all three.
 *   ops.c            zero, activation(_backward), dropout, layernorm_backward, embed_backward,
 *                    scatter_add_rows, select_rows, cross_entropy, squared_error
 *   gemm_optim.c     gemm_backward (cuBLASLt), adamw, lamb, clip_grad_norm
 *   attention.c      attention_lse, attention_backward (FlashAttention-2 style) */
#ifndef NOPAD_BACKEND_CUDA_TRAIN_OPS_H
#define NOPAD_BACKEND_CUDA_TRAIN_OPS_H

#include "backend/backend.h"

void cuda_train_install_ops(nopad_backend *be);
void cuda_train_install_gemm_optim(nopad_backend *be);
void cuda_train_install_attention(nopad_backend *be);

#endif
