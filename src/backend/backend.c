/* The backend registry: which backend serves a device. A new backend adds its constructor here. */
#include "backend/backend.h"

#ifdef NOPAD_HAVE_CUDA
#include "backend/cuda/cuda_backend.h"
#endif
#include "util/error.h"
#include "util/types.h"

nopad_status nopad_attention_dropout_check(const char *op, const nopad_attention_dropout *drop) {
    if (!drop) return NOPAD_OK;
    if (!(drop->p >= 0.0f && drop->p < 1.0f))
        return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT, "%s: dropout rate %g is outside [0, 1)", op,
                               (double)drop->p);
    if (drop->p > 0.0f && drop->site >= 32768u)
        return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT, "%s: dropout site %u is past 32767", op, drop->site);
    return NOPAD_OK;
}

nopad_status nopad_backend_create(const nopad_backend_params *p, nopad_backend **out) {
    *out = NULL;
    if (p->device == NOPAD_DEVICE_CUDA) {
#ifdef NOPAD_HAVE_CUDA
        return nopad_backend_cuda_create(p->dtype, p->device_index, p->cuda_stream, out);
#else
        return nopad_set_error(NOPAD_ERR_UNSUPPORTED,
                               "device cuda: this build of nopad has no CUDA backend (configure "
                               "with -DNOPAD_CUDA=ON); use cpu");
#endif
    }
    if (p->device != NOPAD_DEVICE_CPU)
        return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT, "device %d is not cpu or cuda", (int)p->device);
    if (p->dtype != NOPAD_DTYPE_F32)
        return nopad_set_error(NOPAD_ERR_UNSUPPORTED,
                               "dtype %s: the CPU backend computes in F32 (F16 and BF16 need the "
                               "CUDA backend)", nopad_dtype_name(p->dtype));
    return nopad_backend_cpu_create(p->n_threads, out);
}
