/* CUDA training ops: see train_ops.h for which. */
#ifdef NOPAD_HAVE_CUDA

#include "backend/cuda/train/train_ops.h"

void cuda_train_install_gemm_optim(nopad_backend *be) { (void)be; }

#endif /* NOPAD_HAVE_CUDA */
