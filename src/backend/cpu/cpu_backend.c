/* CPU backend: the float32 reference implementation of the op table. Every CUDA op is tested
 * against these. GEMMs go to OpenBLAS; the rest is plain loops parallelised with OpenMP. */
#include "backend/cpu/cpu_ops.h"

#include <stdlib.h>
#include <string.h>

#include <cblas.h>

#include "util/error.h"

static void cpu_destroy(nopad_backend *be) {
    free(be->impl);
    free(be);
}

static nopad_status cpu_alloc(nopad_backend *be, size_t bytes, void **out) {
    /* 64-byte alignment for vector loads; aligned_alloc wants a multiple of the alignment. */
    size_t rounded = (bytes + 63) & ~(size_t)63;
    *out = aligned_alloc(64, rounded ? rounded : 64);
    if (!*out) return nopad_set_error(NOPAD_ERR_OUT_OF_MEMORY, "cpu: cannot allocate %zu bytes", bytes);
    return NOPAD_OK;
}

static void cpu_free(nopad_backend *be, void *ptr) { free(ptr); }

static nopad_status cpu_upload_f32(nopad_backend *be, void *dst, const float *src, size_t n) {
    memcpy(dst, src, n * sizeof(float));
    return NOPAD_OK;
}

static nopad_status cpu_download_f32(nopad_backend *be, float *dst, const void *src, size_t n) {
    memcpy(dst, src, n * sizeof(float));
    return NOPAD_OK;
}

static nopad_status cpu_download(nopad_backend *be, void *dst, const void *src, size_t bytes) {
    (void)be;
    if (bytes) memmove(dst, src, bytes);
    return NOPAD_OK;
}

static nopad_status cpu_upload(nopad_backend *be, void *dst, const void *src, size_t bytes) {
    (void)be;
    if (bytes) memcpy(dst, src, bytes);
    return NOPAD_OK;
}

static nopad_status cpu_upload_i32(nopad_backend *be, int32_t *dst, const int32_t *src, size_t n) {
    memcpy(dst, src, n * sizeof(int32_t));
    return NOPAD_OK;
}

static nopad_status cpu_synchronize(nopad_backend *be) { return NOPAD_OK; }

static nopad_status cpu_copy(nopad_backend *be, void *dst, const void *src, size_t bytes) {
    if (bytes) memmove(dst, src, bytes);
    return NOPAD_OK;
}

static nopad_status cpu_copy_2d(nopad_backend *be, void *dst, size_t dst_pitch, const void *src,
                                size_t src_pitch, size_t width, size_t rows) {
    for (size_t i = 0; i < rows; i++)
        memmove((char *)dst + i * dst_pitch, (const char *)src + i * src_pitch, width);
    return NOPAD_OK;
}

/* Every op on every shape, but no device-side packing and no recorded graphs: the CPU runs ops
 * as they come, and its buffers are host memory the caller packs. GEMMs on weights in a block
 * format: quant.h's six, on rows of whole blocks. */
static int cpu_supports(nopad_backend *be, nopad_op op, const nopad_op_shape *shape) {
    (void)be;
    if (op == NOPAD_OP_GEMM && shape) return cpu_runs_format(shape->weight_format, shape->n_in);
    return op != NOPAD_OP_PACK && op != NOPAD_OP_GRAPH;
}

nopad_status nopad_backend_cpu_create(int n_threads, nopad_backend **out) {
    *out = NULL;
    nopad_backend *be = calloc(1, sizeof *be);
    cpu_state *state = calloc(1, sizeof *state);
    if (!be || !state) {
        free(be);
        free(state);
        return nopad_set_error(NOPAD_ERR_OUT_OF_MEMORY, "cpu: cannot allocate the backend");
    }
    state->n_threads = n_threads > 0 ? n_threads : omp_get_max_threads();
    /* OpenBLAS's own pool would spin against our OpenMP threads (each waits while the other
     * runs): keep OpenBLAS single-threaded and split GEMMs across our threads (cpu_linear.c). */
    openblas_set_num_threads(1);

    be->supports = cpu_supports;
    be->name = "cpu";
    be->device = -1;
    be->dtype = NOPAD_DTYPE_F32;
    be->impl = state;
    be->destroy = cpu_destroy;
    be->alloc = cpu_alloc;
    be->free = cpu_free;
    be->upload_f32 = cpu_upload_f32;
    be->download_f32 = cpu_download_f32;
    be->upload_i32 = cpu_upload_i32;
    be->upload = cpu_upload;
    be->download = cpu_download;
    be->synchronize = cpu_synchronize;
    be->copy = cpu_copy;
    be->copy_2d = cpu_copy_2d;
    be->embed = cpu_embed_layernorm;
    be->gemm = cpu_linear;
    be->layernorm = cpu_bias_residual_layernorm;
    be->attention = cpu_attention_varlen;
    be->attention_rel = cpu_attention_rel;
    be->pool = cpu_pool;
    be->l2_normalize = cpu_l2_normalize;
    be->embed_tokens = cpu_embed_tokens;
    be->norm = cpu_norm;
    be->residual_add = cpu_residual_add;
    be->add_norm = cpu_add_norm;
    be->rope_kv_store = cpu_rope_kv_store;
    be->attention_paged = cpu_attention_paged;
    be->swiglu = cpu_swiglu;
    be->gather_rows = cpu_gather_rows;
    be->gemm_f32 = cpu_gemm_f32;
    be->gemm_q = cpu_gemm_q;
    be->embed_tokens_q = cpu_embed_tokens_q;
    be->packed_format = cpu_packed_format;
    be->pack_q = cpu_pack_q;
    be->row_argmax = cpu_row_argmax;
    be->zero = cpu_zero;
    be->gemm_backward = cpu_gemm_backward;
    be->activation = cpu_activation;
    be->activation_backward = cpu_activation_backward;
    be->dropout = cpu_dropout;
    be->layernorm_backward = cpu_layernorm_backward;
    be->embed_backward = cpu_embed_backward;
    be->attention_lse = cpu_attention_lse;
    be->attention_backward = cpu_attention_backward;
    be->scatter_add_rows = cpu_scatter_add_rows;
    be->select_rows = cpu_select_rows;
    be->cross_entropy = cpu_cross_entropy;
    be->squared_error = cpu_squared_error;
    be->adamw = cpu_adamw;
    be->lamb = cpu_lamb;
    be->clip_grad_norm = cpu_clip_grad_norm;
    *out = be;
    return NOPAD_OK;
}

const char *nopad_cpu_blas_kernels(void) { return openblas_get_corename(); }
