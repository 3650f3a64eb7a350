/* The prompts' path of the quantized linear op (quant_gemm.h): dequantise, then the ordinary GEMM,
 * in slices of output rows when the whole weight's 16-bit copy would pass the scratch cap. */
#ifdef NOPAD_HAVE_CUDA

#include "backend/cuda/quant/quant_gemm.h"

#include "backend/cuda/gemm/gemm.h"
#include "backend/cuda/quant/quant.h"
#include "backend/cuda/state.h"
#include "util/error.h"

enum { SLICE_ALIGN = 256, SLICE_ROWS_MULTIPLE = 16 };
#define DEFAULT_SCRATCH_CAP ((size_t)64 << 20)

static size_t scratch_cap = DEFAULT_SCRATCH_CAP;

void cuda_quant_set_scratch_cap(size_t bytes) { scratch_cap = bytes ? bytes : DEFAULT_SCRATCH_CAP; }

static size_t align_up(size_t v) { return (v + SLICE_ALIGN - 1) / SLICE_ALIGN * SLICE_ALIGN; }

/* Output rows a slice takes: all N when the whole copy fits the cap, else as many as fit with their
 * [T, rows] output, a multiple of 16 (so that a bias slice stays 32-byte aligned), at least 16. */
static int32_t slice_rows(int32_t T, int32_t K, int32_t N, int out_f32) {
    if ((size_t)N * (size_t)K * 2 <= scratch_cap) return N;
    const size_t per_row = (size_t)K * 2 + (size_t)T * (out_f32 ? 4 : 2);
    size_t rows = scratch_cap / per_row / SLICE_ROWS_MULTIPLE * SLICE_ROWS_MULTIPLE;
    if (rows < SLICE_ROWS_MULTIPLE) rows = SLICE_ROWS_MULTIPLE;
    return rows >= (size_t)N ? N : (int32_t)rows;
}

size_t cuda_quant_gemm_scratch_bytes(int32_t n_tokens, int32_t n_in, int32_t n_out, int out_f32) {
    const int32_t rows = slice_rows(n_tokens, n_in, n_out, out_f32);
    const size_t weight = (size_t)rows * (size_t)n_in * 2;
    if (rows == n_out) return weight;
    return align_up(weight) + (size_t)n_tokens * (size_t)rows * (out_f32 ? 4 : 2);
}

nopad_status cuda_quant_gemm(cuda_lt *lt, nopad_dtype dtype, void *out, const void *x, const void *w,
                             nopad_weight_format format, const void *bias, const void *residual, int32_t n_tokens,
                             int32_t n_in, int32_t n_out, nopad_epilogue epilogue, nopad_activation act, int out_f32,
                             void *scratch, cudaStream_t stream) {
    const int32_t rows = slice_rows(n_tokens, n_in, n_out, out_f32);
    if (rows == n_out) { /* the whole weight at once, the GEMM straight into out */
        nopad_status st = cuda_quant_dequantize(dtype, scratch, w, format, n_out, n_in, stream);
        if (st != NOPAD_OK) return st;
        if (out_f32) return cuda_lt_matmul_f32(lt, dtype, out, x, scratch, n_tokens, n_in, n_out, stream);
        return cuda_gemm_linear(lt, dtype, out, x, scratch, bias, residual, n_tokens, n_in, n_out, epilogue, act,
                                stream);
    }
    /* slices of rows: out[:, n0 .. n0 + nc) computed into a [T, nc] buffer after the weight slice
     * (the GEMMs write whole rows of their output), then copied into place; a residual is copied
     * into that buffer first and added in place */
    char *weight = scratch, *slice_out = (char *)scratch + align_up((size_t)rows * (size_t)n_in * 2);
    const size_t out_bytes = out_f32 ? 4 : 2, w_row_bytes = cuda_quant_row_bytes(format, n_in);
    const int with_residual = epilogue == NOPAD_EPILOGUE_BIAS_RESIDUAL;
    for (int32_t n0 = 0; n0 < n_out; n0 += rows) {
        const int32_t nc = n_out - n0 < rows ? n_out - n0 : rows;
        nopad_status st =
            cuda_quant_dequantize(dtype, weight, (const char *)w + (size_t)n0 * w_row_bytes, format, nc, n_in, stream);
        if (st == NOPAD_OK && with_residual)
            st = cuda_check(cudaMemcpy2DAsync(slice_out, (size_t)nc * out_bytes,
                                              (const char *)residual + (size_t)n0 * out_bytes, (size_t)n_out * out_bytes,
                                              (size_t)nc * out_bytes, (size_t)n_tokens, cudaMemcpyDeviceToDevice,
                                              stream),
                            "gemm_q residual slice");
        if (st != NOPAD_OK) return st;
        if (out_f32)
            st = cuda_lt_matmul_f32(lt, dtype, (float *)slice_out, x, weight, n_tokens, n_in, nc, stream);
        else
            st = cuda_gemm_linear(lt, dtype, slice_out, x, weight,
                                  bias ? (const char *)bias + (size_t)n0 * 2 : NULL,
                                  with_residual ? slice_out : NULL, n_tokens, n_in, nc, epilogue, act, stream);
        if (st == NOPAD_OK)
            st = cuda_check(cudaMemcpy2DAsync((char *)out + (size_t)n0 * out_bytes, (size_t)n_out * out_bytes,
                                              slice_out, (size_t)nc * out_bytes, (size_t)nc * out_bytes,
                                              (size_t)n_tokens, cudaMemcpyDeviceToDevice, stream),
                            "gemm_q output slice");
        if (st != NOPAD_OK) return st;
    }
    return NOPAD_OK;
}

#endif /* NOPAD_HAVE_CUDA */
