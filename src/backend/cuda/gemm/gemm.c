/* The GEMM dispatch of the CUDA backend (gemm.h): skinny -> CUTLASS -> cuBLASLt, and the rules that
 * choose between them. The measurements behind the rules are in docs/gemm.md (CUDA-graph replays,
 * BERT-base and -large shapes). */
#ifdef NOPAD_HAVE_CUDA

#include "backend/cuda/gemm/gemm.h"
#include "backend/cuda/ops.h"
#include "util/knobs.h"

/* ---- which path ---------------------------------------------------------------------------- */

cuda_gemm_mode cuda_gemm_get_mode(void) { return (cuda_gemm_mode)knob_int(KNOB_GEMM); }

void cuda_gemm_set_mode(cuda_gemm_mode mode) { knob_set_int(KNOB_GEMM, (long)mode); }

static int lt_rank_wanted;

int cuda_gemm_set_lt_rank(int rank) {
    lt_rank_wanted = rank < 0 ? 0 : rank > CUDA_GEMM_LT_MAX_RANK ? CUDA_GEMM_LT_MAX_RANK : rank;
    return lt_rank_wanted;
}

/* Output tiles of 128x128: the measure of the grid the rules below go by (132 SMs: 256 tiles are
 * about 2 waves). */
static int64_t tiles_128(int32_t n_tokens, int32_t n_out) {
    return ((int64_t)n_tokens + 127) / 128 * (((int64_t)n_out + 127) / 128);
}

int cuda_gemm_use_fused(int32_t n_tokens, int32_t n_in, int32_t n_out, cuda_gemm_epilogue ep) {
    if (!cuda_gemm_fused_available()) return 0;
    switch (cuda_gemm_get_mode()) {
    case CUDA_GEMM_MODE_CUBLASLT: return 0;
    case CUDA_GEMM_MODE_CUTLASS: return 1;
    case CUDA_GEMM_MODE_AUTO: break;
    }
    /* CUTLASS against cuBLASLt, T = 128 .. 39798:
     * - exact GELU: cuBLASLt cannot fuse it; the fused kernel beats cuBLASLt + the separate
     *   bias+GELU pass 1.2x to 1.7x from T = 1024 up and ties at T = 128; below 256 tokens it is
     *   1% slower in the whole forward;
     * - bias only (or none): 1.06x to 1.14x from ~4 waves of 128x128 tiles up when K <= 1024
     *   (qkv, attention out); slower below, and 0.96x to 1.03x at K = 3072/4096 (FFN out);
     * - residual: 1.07x to 1.35x from ~2 waves up at K <= 1024, 1.02x to 1.07x from ~8 waves
     *   up at K = 3072/4096; slower or tied below. */
    const int64_t tiles = tiles_128(n_tokens, n_out);
    switch (ep) {
    case CUDA_GEMM_BIAS_GELU_ERF: return n_tokens >= 256;
    case CUDA_GEMM_BIAS: return n_in <= 1024 && tiles >= 512;
    case CUDA_GEMM_BIAS_RESIDUAL: return tiles >= 1024 || (n_in <= 1024 && tiles >= 256);
    }
    return 0;
}

static int32_t clamp_skinny_tokens(long v) {
    return (int32_t)(v < 0 ? 0 : v > CUDA_SKINNY_MAX_T ? CUDA_SKINNY_MAX_T : v);
}

int32_t cuda_gemm_skinny_max_tokens(void) { return clamp_skinny_tokens(knob_int(KNOB_SKINNY_MAX_TOKENS)); }

void cuda_gemm_skinny_set_max_tokens(int32_t max_tokens) {
    knob_set_int(KNOB_SKINNY_MAX_TOKENS, clamp_skinny_tokens(max_tokens));
}

/* Up to this many tokens the gemv kernels take the skinny GEMM's layers too (H100, docs/gemm.md):
 * the forward of one 8- or 16-token sequence of MiniLM's shape 0.17-0.18 -> 0.13 ms and of
 * BERT-base's 0.365 -> 0.29; at 24 tokens MiniLM's 0.19 -> 0.17-0.18 and BERT-base's 0.41 -> 0.42;
 * a decode step of SmolLM2's shape at 20-24 sequences 1.08-1.13 -> 0.80-0.81 ms. */
enum { GEMV_BEFORE_SKINNY = 24 };

int cuda_gemm_skinny_wins(int32_t n_tokens, int32_t n_in, int32_t n_out) {
    /* measured where it pays: BERT-family layers (one side <= 1024). On LLaMA-1B's layers (both
     * sides >= 2048) cuBLASLt is faster: a decode step at batch 1 takes 1.33 ms against 1.68 ms
     * with the skinny GEMM (docs/gemm.md) */
    const int32_t narrow = n_in < n_out ? n_in : n_out;
    if (!(n_tokens <= cuda_gemm_skinny_max_tokens() && narrow <= 1024 &&
          cuda_gemm_skinny_supported(n_tokens, n_in, n_out)))
        return 0;
    return !(n_tokens <= GEMV_BEFORE_SKINNY && n_tokens <= cuda_gemv_max_tokens() &&
             cuda_gemv_supported(n_tokens, n_in, n_out));
}

int cuda_gemm_gemv_wins(int32_t n_tokens, int32_t n_in, int32_t n_out) {
    return n_tokens <= cuda_gemv_max_tokens() && !cuda_gemm_skinny_wins(n_tokens, n_in, n_out) &&
           cuda_gemv_supported(n_tokens, n_in, n_out);
}

int cuda_gemm_gemv_swiglu_wins(int32_t n_tokens, int32_t n_in, int32_t n_ffn) {
    if (cuda_gemm_gemv_wins(n_tokens, n_in, 2 * n_ffn)) return 1;
    return cuda_gemv_max_tokens() > 0 && cuda_gemm_skinny_wins(n_tokens, n_in, 2 * n_ffn) &&
           cuda_gemv_supported(n_tokens, n_in, 2 * n_ffn);
}

/* ---- the linear op --------------------------------------------------------------------------- */

nopad_status cuda_gemm_linear(cuda_lt *lt, nopad_dtype dtype, void *out, const void *x, const void *w,
                              const void *bias, const void *residual, int32_t n_tokens, int32_t n_in,
                              int32_t n_out, nopad_epilogue epilogue, nopad_activation act,
                              cudaStream_t stream) {
    if (n_tokens == 0) return NOPAD_OK;
    /* ---- a decode step's few tokens on a decoder's layers (gemv.h): the weights streamed at copy
     * speed, every epilogue in the same kernel; the BERT-family shapes the skinny GEMM was
     * measured on stay with it */
    if (cuda_gemm_gemv_wins(n_tokens, n_in, n_out)) {
        const void *gbias = epilogue == NOPAD_EPILOGUE_NONE ? NULL : bias;
        const void *gresidual = epilogue == NOPAD_EPILOGUE_BIAS_RESIDUAL ? residual : NULL;
        const int gact = epilogue == NOPAD_EPILOGUE_BIAS_ACT ? (int)act : -1;
        nopad_status gst = cuda_gemv(dtype, out, x, w, gbias, gresidual, n_tokens, n_in, n_out, gact, stream);
        if (gst != NOPAD_ERR_UNSUPPORTED) return gst;
    }
    /* ---- a few tokens (skinny.h): one kernel with every epilogue, weights read by all SMs; bias
     * and residual NULL where the epilogue does not add them, the activation -1 where it applies
     * none; shapes it does not take come back UNSUPPORTED and go on below */
    if (cuda_gemm_skinny_wins(n_tokens, n_in, n_out)) {
        const void *sbias = epilogue == NOPAD_EPILOGUE_NONE ? NULL : bias;
        const void *sresidual = epilogue == NOPAD_EPILOGUE_BIAS_RESIDUAL ? residual : NULL;
        const int sact = epilogue == NOPAD_EPILOGUE_BIAS_ACT ? (int)act : -1;
        nopad_status sst = cuda_gemm_skinny(dtype, out, x, w, sbias, sresidual, n_tokens, n_in, n_out, sact, stream);
        if (sst != NOPAD_ERR_UNSUPPORTED) return sst;
    }
    /* ---- CUTLASS with the epilogue fused (cutlass.h): for the exact-erf GELU, which cuBLASLt
     * cannot fuse, and wherever the mode picks it; shapes it does not take (K or N not multiples
     * of 8, ...) come back UNSUPPORTED and go on to cuBLASLt below. */
    const int fused_ep = epilogue == NOPAD_EPILOGUE_BIAS_ACT
                             ? (act == NOPAD_ACT_GELU ? CUDA_GEMM_BIAS_GELU_ERF : -1)
                         : epilogue == NOPAD_EPILOGUE_BIAS_RESIDUAL ? CUDA_GEMM_BIAS_RESIDUAL
                                                                    : CUDA_GEMM_BIAS;
    if (fused_ep >= 0 && cuda_gemm_use_fused(n_tokens, n_in, n_out, (cuda_gemm_epilogue)fused_ep)) {
        nopad_status fst = cuda_gemm_fused(dtype, out, x, w, epilogue == NOPAD_EPILOGUE_NONE ? NULL : bias,
                                           residual, n_tokens, n_in, n_out, (cuda_gemm_epilogue)fused_ep, stream);
        if (fst != NOPAD_ERR_UNSUPPORTED) return fst;
    }
    /* ---- cuBLASLt ---- */
    cublasLtEpilogue_t lt_epilogue = CUBLASLT_EPILOGUE_DEFAULT;
    int separate_activation = 0;
    switch (epilogue) {
    case NOPAD_EPILOGUE_NONE: break;
    case NOPAD_EPILOGUE_BIAS:
    case NOPAD_EPILOGUE_BIAS_RESIDUAL: lt_epilogue = CUBLASLT_EPILOGUE_BIAS; break;
    case NOPAD_EPILOGUE_BIAS_ACT:
        /* cuBLASLt's GELU is the tanh approximation: exact-erf GELU gets its own pass. */
        if (act == NOPAD_ACT_GELU_TANH) lt_epilogue = CUBLASLT_EPILOGUE_GELU_BIAS;
        else if (act == NOPAD_ACT_RELU) lt_epilogue = CUBLASLT_EPILOGUE_RELU_BIAS;
        else separate_activation = 1;
        break;
    }
    nopad_status st = cuda_lt_matmul(lt, dtype, out, x, w, bias, residual, n_tokens, n_in, n_out, lt_epilogue,
                                     epilogue == NOPAD_EPILOGUE_BIAS_RESIDUAL, lt_rank_wanted, stream);
    if (st == NOPAD_OK && separate_activation) st = cuda_bias_activation(dtype, out, bias, n_tokens, n_out, act, stream);
    return st;
}

#endif /* NOPAD_HAVE_CUDA */
