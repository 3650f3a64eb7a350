/* FP8 E4M3 weights on the host (docs/fp8.md):
 * - io/fp8.h's conversions against ml_dtypes' float8_e4m3fn (tests/data/fp8, written by
 *   scripts/make_fp8_fixtures.py): all 256 codes, and the rounding of random floats, the ties
 *   between neighbouring codes, subnormals, NaN, infinities and values past 448 (saturating);
 * - the per-output-channel quantizer: scales, codes, and its error bound, on random rows with wide
 *   scales (and a row of zeros);
 * - tiny_f8_requant, the GPU test's reference for weights fp8, against this quantizer, bit for bit;
 * - an F8_E4M3 safetensors LLaMA (tiny_f8: per-channel scales [N, 1] and [N] in layer 0, per-tensor
 *   scalar and [1] in layer 1) on the CPU, which dequantises it at load (code · scale in float32),
 *   against the same model written with those products in F32 (tiny_f8_ref): logits equal bit for
 *   bit, and the notice and weight groups of the dequantised layers;
 * - the loader's FP8 layout (backend.h), on a CPU backend made to claim FP8: tiny_f8's F8 weights kept
 *   as stored (per-tensor scales repeated per row), tiny_f8_ref quantized with weights fp8, each fused
 *   matrix's codes and scales where they belong, and the groups' bytes;
 * - weights fp8 on a GGUF file: the dequantised, un-permuted weights quantized per channel;
 * - an E4M3 NaN code in a weight refused, naming the tensor, kept as FP8 or dequantised;
 * - what is refused, each naming the tensor: E5M2 weights, block-wise scales (weight_scale_inv), a
 *   scale of the wrong shape, a missing scale; and `weights fp8` on the CPU. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "io/fp8.h"
#include "io/gguf.h"
#include "io/gguf_config.h"
#include "io/hf_config.h"
#include "io/safetensors.h"
#include "model/decoder.h"
#include "testutil.h"

static uint32_t bits_of(float f) {
    uint32_t b;
    memcpy(&b, &f, sizeof b);
    return b;
}

static void test_all_codes(void **state) {
    (void)state;
    FILE *f = fopen(test_data_path("fp8/e4m3_codes.txt"), "r");
    assert_non_null(f);
    unsigned code, want;
    int n = 0;
    while (fscanf(f, "%u %x", &code, &want) == 2) {
        const float v = fp8_e4m3_to_f32((uint8_t)code);
        float w;
        memcpy(&w, &want, sizeof w);
        if (isnan(w)) {
            if (!isnan(v)) fail_msg("code 0x%02x: %g, expected NaN", code, (double)v);
        } else if (bits_of(v) != want) {
            fail_msg("code 0x%02x: %a, expected %a", code, (double)v, (double)w);
        }
        /* every finite code survives the way back (0x80, -0, stays -0) */
        if (!isnan(w) && fp8_e4m3_from_f32(v) != code)
            fail_msg("code 0x%02x -> %a -> 0x%02x", code, (double)v, fp8_e4m3_from_f32(v));
        n++;
    }
    fclose(f);
    assert_int_equal(n, 256);
}

static void test_rounding(void **state) {
    (void)state;
    FILE *f = fopen(test_data_path("fp8/e4m3_round.txt"), "r");
    assert_non_null(f);
    unsigned xb, want;
    int n = 0, ties = 0, saturated = 0;
    while (fscanf(f, "%x %u", &xb, &want) == 2) {
        float x;
        memcpy(&x, &xb, sizeof x);
        const uint8_t got = fp8_e4m3_from_f32(x);
        if (isnan(x)) {
            if ((got & 0x7F) != 0x7F) fail_msg("NaN -> 0x%02x, expected a NaN code", got);
        } else if (got != want) {
            fail_msg("%a (0x%08x) -> 0x%02x, expected 0x%02x", (double)x, xb, got, want);
        }
        /* a tie: exactly halfway between the two codes around it */
        if (!isnan(x) && fabsf(x) < 448.0f && (want & 0x7F) < 0x7E) {
            const float lo = fabsf(fp8_e4m3_to_f32((uint8_t)(want & 0x7F)));
            const float other = fabsf(x) > lo ? fp8_e4m3_to_f32((uint8_t)((want & 0x7F) + 1))
                                              : fp8_e4m3_to_f32((uint8_t)((want & 0x7F) - 1));
            if ((want & 0x7F) > 0 && fabsf(x) - lo == (fabsf(other) - lo) / 2) ties++;
        }
        if ((want & 0x7F) == 0x7E && !(fabsf(x) == 448.0f)) saturated++;
        n++;
    }
    fclose(f);
    assert_true(n > 2000);
    /* the fixture holds both signs of every tie between positive codes, and values past 448 */
    if (ties < 200) fail_msg("only %d ties in the fixture", ties);
    if (saturated < 8) fail_msg("only %d saturated values in the fixture", saturated);
}

/* Per output channel: scale = amax / 448, codes of w / scale; each value reproduced within half
 * an E4M3 step: 2^-4 of itself for normal codes (3 mantissa bits), 2^-10·scale in the subnormal
 * range (steps of 2^-9·scale), plus the float32 rounding of the division and the product
 * (2^-23 relative, two of them). The row's largest value maps onto 448 exactly or within one
 * rounding of the division. */
static void test_quantize_rows(void **state) {
    (void)state;
    enum { ROWS = 37, COLS = 129 };
    float *w = malloc(ROWS * COLS * sizeof *w), *scales = malloc(ROWS * sizeof *scales);
    uint8_t *q = malloc(ROWS * COLS);
    srand(43);
    for (int r = 0; r < ROWS; r++) {
        const float row_scale = ldexpf(1.0f, r % 31 - 15); /* 2^-15 .. 2^15 */
        for (int c = 0; c < COLS; c++) {
            const float u = (float)rand() / (float)RAND_MAX - 0.5f;
            w[r * COLS + c] = r == 5 ? 0.0f : u * row_scale * (c % 7 == 0 ? 8.0f : 1.0f);
        }
    }
    fp8_e4m3_quantize_rows(w, ROWS, COLS, q, scales);
    for (int r = 0; r < ROWS; r++) {
        float amax = 0;
        for (int c = 0; c < COLS; c++) amax = fmaxf(amax, fabsf(w[r * COLS + c]));
        assert_true(scales[r] == (r == 5 ? 1.0f : amax / 448.0f));
        int at_max = 0;
        for (int c = 0; c < COLS; c++) {
            const float x = w[r * COLS + c], back = fp8_e4m3_to_f32(q[r * COLS + c]) * scales[r];
            const double bound = fmax(fabs(x) * 0x1p-4, scales[r] * 0x1p-10) * (1 + 0x1p-20);
            if (fabs((double)back - x) > bound)
                fail_msg("row %d col %d: %a -> %a, off by more than %a", r, c, (double)x, (double)back, bound);
            if ((q[r * COLS + c] & 0x7F) == 0x7E) at_max++;
        }
        if (r != 5) assert_true(at_max >= 1);
    }
    free(w);
    free(scales);
    free(q);
}

/* The F8 model and its dequantised twin through the same steps: every position's logits of two
 * prompts, then decode steps, equal bit for bit (the CPU holds the F8 weights as the same float32
 * products, so every op sees the same numbers). */
static void test_f8_checkpoint_on_cpu(void **state) {
    (void)state;
    nopad_model *f8 = NULL, *ref = NULL;
    char *err = NULL, *err_ref = NULL;
    assert_nopad_ok(test_load_capturing(test_data_path("fp8/tiny_f8"), NOPAD_WEIGHTS_AUTO, &f8, &err));
    assert_nopad_ok(test_load_capturing(test_data_path("fp8/tiny_f8_ref"), NOPAD_WEIGHTS_AUTO, &ref, &err_ref));
    /* the notice: each group of both layers (a fused Q|K|V counts once), dequantised because the
     * CPU has no FP8 kernels */
    assert_non_null(strstr(err, "attn_qkv F8_E4M3 (2 weights) dequantised to F32"));
    assert_non_null(strstr(err, "ffn_down F8_E4M3 (2 weights)"));
    assert_non_null(strstr(err, "no FP8 kernels"));
    assert_null(strstr(err_ref, "notice"));
    nopad_weight_group g[16];
    const int32_t n_groups = nopad_model_weight_groups(f8, g, 16);
    int f8_stored = 0;
    for (int32_t i = 0; i < n_groups; i++) {
        assert_string_equal(g[i].format, "F32");
        if (strcmp(g[i].stored, "F8_E4M3") == 0) f8_stored += g[i].n_tensors;
    }
    assert_int_equal(f8_stored, 14); /* 7 linear weights a layer */

    nopad_model_info info;
    assert_nopad_ok(nopad_model_get_info(f8, &info));
    assert_string_equal(info.weights_dtype, "F8_E4M3"); /* the checkpoint's, though held in F32 */
    const int32_t V = info.vocab_size, B = 2, cu[3] = {0, 9, 40};
    int32_t ids[40];
    srand(8);
    for (int t = 0; t < 40; t++) ids[t] = rand() % V;
    float *a = malloc((size_t)40 * V * sizeof *a), *b = malloc((size_t)40 * V * sizeof *b);
    nopad_context *ca = nopad_model_context(f8), *cb = nopad_model_context(ref);
    nopad_sequence *sa[2], *sb[2];
    for (int i = 0; i < B; i++) {
        assert_nopad_ok(nopad_sequence_create(ca, &sa[i]));
        assert_nopad_ok(nopad_sequence_create(cb, &sb[i]));
    }
    assert_nopad_ok(nopad_decode(ca, B, sa, cu, ids, 1, a));
    assert_nopad_ok(nopad_decode(cb, B, sb, cu, ids, 1, b));
    assert_memory_equal(a, b, (size_t)40 * V * sizeof *a);
    /* the logits are not flat: a model whose weights were read wrong would not pass by chance */
    float lo = a[0], hi = a[0];
    for (size_t i = 0; i < (size_t)40 * V; i++) lo = fminf(lo, a[i]), hi = fmaxf(hi, a[i]);
    assert_true(hi - lo > 1.0f);
    const int32_t step_cu[3] = {0, 1, 2};
    for (int s = 0; s < 4; s++) {
        const int32_t next[2] = {(7 * s + 3) % V, (11 * s + 5) % V};
        assert_nopad_ok(nopad_decode(ca, B, sa, step_cu, next, 0, a));
        assert_nopad_ok(nopad_decode(cb, B, sb, step_cu, next, 0, b));
        assert_memory_equal(a, b, (size_t)B * V * sizeof *a);
    }
    for (int i = 0; i < B; i++) {
        nopad_sequence_free(sa[i]);
        nopad_sequence_free(sb[i]);
    }
    /* weights f32 asked for: the same dequantised weights, without the notice */
    nopad_model *f32 = NULL;
    char *err_f32 = NULL;
    assert_nopad_ok(test_load_capturing(test_data_path("fp8/tiny_f8"), NOPAD_WEIGHTS_F32, &f32, &err_f32));
    assert_null(strstr(err_f32, "notice"));
    nopad_sequence *sf[2];
    for (int i = 0; i < B; i++) {
        assert_nopad_ok(nopad_sequence_create(nopad_model_context(f32), &sf[i]));
        assert_nopad_ok(nopad_sequence_create(cb, &sb[i]));
    }
    assert_nopad_ok(nopad_decode(nopad_model_context(f32), B, sf, cu, ids, 1, a));
    assert_nopad_ok(nopad_decode(cb, B, sb, cu, ids, 1, b));
    assert_memory_equal(a, b, (size_t)40 * V * sizeof *a);
    for (int i = 0; i < B; i++) {
        nopad_sequence_free(sf[i]);
        nopad_sequence_free(sb[i]);
    }
    free(a);
    free(b);
    free(err);
    free(err_ref);
    free(err_f32);
    nopad_model_free(f32);
    nopad_model_free(f8);
    nopad_model_free(ref);
}

/* tiny_f8_requant (test_cuda_fp8's reference for weights fp8) holds tiny_f8_ref's linear weights as
 * this quantizer gives them, dequantised: equal bit for bit (ml_dtypes wrote it). */
static void test_requant_fixture(void **state) {
    (void)state;
    safetensors_checkpoint ref, requant;
    assert_nopad_ok(safetensors_checkpoint_open(test_data_path("fp8/tiny_f8_ref"), &ref));
    assert_nopad_ok(safetensors_checkpoint_open(test_data_path("fp8/tiny_f8_requant"), &requant));
    int checked = 0;
    for (int i = 0; i < ref.files[0].n_tensors; i++) {
        const safetensors_tensor *t = &ref.files[0].tensors[i];
        if (!strstr(t->name, "proj.weight")) continue;
        const safetensors_tensor *r = safetensors_checkpoint_find(&requant, t->name);
        assert_non_null(r);
        assert_int_equal(t->ndim, 2);
        const int64_t rows = t->shape[0], cols = t->shape[1];
        float *w = malloc((size_t)(rows * cols) * sizeof *w), *want = malloc((size_t)(rows * cols) * sizeof *want);
        float *scales = malloc((size_t)rows * sizeof *scales);
        uint8_t *q = malloc((size_t)(rows * cols));
        assert_nopad_ok(safetensors_to_f32(t, w));
        assert_nopad_ok(safetensors_to_f32(r, want));
        fp8_e4m3_quantize_rows(w, rows, cols, q, scales);
        for (int64_t k = 0; k < rows * cols; k++) {
            const float got = fp8_e4m3_to_f32(q[k]) * scales[k / cols];
            if (bits_of(got) != bits_of(want[k]))
                fail_msg("%s [%lld]: %a, the fixture %a", t->name, (long long)k, (double)got, (double)want[k]);
        }
        free(w);
        free(want);
        free(scales);
        free(q);
        checked++;
    }
    assert_int_equal(checked, 14);
    safetensors_checkpoint_close(&ref);
    safetensors_checkpoint_close(&requant);
}

/* ---- the loader's FP8 layout, on a CPU backend that claims FP8 -------------------------------- */

/* The CPU backend has no FP8 kernels; the loader asks supports(): this one says yes for rows of
 * multiples of 16, so the loader lays FP8 weights out in host memory, where the test reads them. */
static int (*cpu_supports)(nopad_backend *, nopad_op, const nopad_op_shape *);
static int claims_fp8(nopad_backend *be, nopad_op op, const nopad_op_shape *shape) {
    if (op == NOPAD_OP_GEMM && shape && shape->weight_format == NOPAD_WEIGHT_FP8_E4M3) return shape->n_in % 16 == 0;
    return cpu_supports(be, op, shape);
}

static const char *const PARTS[][3] = {
    {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"},
    {"self_attn.o_proj", NULL, NULL},
    {"mlp.gate_proj", "mlp.up_proj", NULL},
    {"mlp.down_proj", NULL, NULL},
};

/* The fused matrix at w (backend.h's FP8 layout) against its parts in the checkpoint: an F8 part's
 * codes as stored and its weight_scale (repeated per row when per tensor); a float part's codes and
 * scales as fp8_e4m3_quantize_rows gives them. */
static void expect_layout(const safetensors_checkpoint *ckpt, int32_t layer, int matrix, const uint8_t *w) {
    int64_t n_rows = 0, cols = 0;
    const safetensors_tensor *t[3] = {NULL, NULL, NULL};
    char name[128];
    for (int i = 0; i < 3 && PARTS[matrix][i]; i++) {
        snprintf(name, sizeof name, "model.layers.%d.%s.weight", layer, PARTS[matrix][i]);
        t[i] = safetensors_checkpoint_find(ckpt, name);
        assert_non_null(t[i]);
        n_rows += t[i]->shape[0];
        cols = t[i]->shape[1];
    }
    const float *scales = (const float *)(w + nopad_fp8_scales_offset(n_rows, cols));
    int64_t row0 = 0;
    for (int i = 0; i < 3 && t[i]; i++) {
        const int64_t rows = t[i]->shape[0];
        uint8_t *want_q = malloc((size_t)(rows * cols));
        float *want_s = malloc((size_t)rows * sizeof *want_s);
        if (t[i]->dtype == ST_F8_E4M3) {
            memcpy(want_q, t[i]->data, (size_t)(rows * cols));
            snprintf(name, sizeof name, "model.layers.%d.%s.weight_scale", layer, PARTS[matrix][i]);
            const safetensors_tensor *s = safetensors_checkpoint_find(ckpt, name);
            assert_non_null(s);
            float *file_s = malloc((size_t)s->n_elements * sizeof *file_s);
            assert_nopad_ok(safetensors_to_f32(s, file_s));
            for (int64_t r = 0; r < rows; r++) want_s[r] = file_s[s->n_elements == 1 ? 0 : r];
            free(file_s);
        } else {
            float *f = malloc((size_t)(rows * cols) * sizeof *f);
            assert_nopad_ok(safetensors_to_f32(t[i], f));
            fp8_e4m3_quantize_rows(f, rows, cols, want_q, want_s);
            free(f);
        }
        if (memcmp(w + row0 * cols, want_q, (size_t)(rows * cols)))
            fail_msg("layer %d %s: codes differ", layer, PARTS[matrix][i]);
        for (int64_t r = 0; r < rows; r++)
            if (bits_of(scales[row0 + r]) != bits_of(want_s[r]))
                fail_msg("layer %d %s row %lld: scale %a, want %a", layer, PARTS[matrix][i], (long long)r,
                         (double)scales[row0 + r], (double)want_s[r]);
        free(want_q);
        free(want_s);
        row0 += rows;
    }
}

static void load_claiming_fp8(const char *rel, int fp8, nopad_backend **be, model_config *cfg,
                              safetensors_checkpoint *ckpt, decoder_weights *w) {
    assert_nopad_ok(nopad_backend_cpu_create(1, be));
    cpu_supports = (*be)->supports;
    (*be)->supports = claims_fp8;
    char path[512];
    snprintf(path, sizeof path, "%s/config.json", test_data_path(rel));
    size_t len;
    char *json = test_read_file(path, &len);
    assert_non_null(json);
    assert_nopad_ok(hf_config_parse(json, len, path, cfg));
    free(json);
    assert_nopad_ok(safetensors_checkpoint_open(test_data_path(rel), ckpt));
    assert_nopad_ok(decoder_weights_load_st(*be, cfg, NULL, ckpt, rel, fp8, w));
}

/* tiny_f8 (F8 on disk) kept as stored; tiny_f8_ref quantized with weights fp8: every fused matrix's
 * codes and scales where backend.h says, the embeddings and the head in the dtype, the groups'
 * bytes. */
static void test_loader_layout(void **state) {
    (void)state;
    for (int which = 0; which < 2; which++) {
        nopad_backend *be;
        model_config cfg;
        safetensors_checkpoint ckpt;
        decoder_weights w;
        load_claiming_fp8(which == 0 ? "fp8/tiny_f8" : "fp8/tiny_f8_ref", which, &be, &cfg, &ckpt, &w);
        assert_int_equal(w.tok_emb_format, NOPAD_WEIGHT_DTYPE);
        assert_int_equal(w.lm_head_format, NOPAD_WEIGHT_DTYPE);
        for (int32_t l = 0; l < cfg.num_layers; l++) {
            const decoder_layer *L = &w.layers[l];
            assert_int_equal(L->qkv_format, NOPAD_WEIGHT_FP8_E4M3);
            assert_int_equal(L->o_format, NOPAD_WEIGHT_FP8_E4M3);
            assert_int_equal(L->up_format, NOPAD_WEIGHT_FP8_E4M3);
            assert_int_equal(L->down_format, NOPAD_WEIGHT_FP8_E4M3);
            expect_layout(&ckpt, l, 0, L->qkv_w);
            expect_layout(&ckpt, l, 1, L->o_w);
            expect_layout(&ckpt, l, 2, L->up_w);
            expect_layout(&ckpt, l, 3, L->down_w);
        }
        size_t fp8_bytes = 0;
        for (int32_t i = 0; i < w.n_groups; i++)
            if (strcmp(w.groups[i].format, "F8_E4M3") == 0) {
                fp8_bytes += w.groups[i].bytes;
                assert_string_equal(w.groups[i].stored, which == 0 ? "F8_E4M3" : "F32");
            }
        /* 2 layers: qkv [256, 32], o [32, 128], gate|up [192, 32], down [32, 96]: codes, 4 bytes a
         * row of scales, each matrix's codes padded to 16 (all are multiples of 16 here) */
        const size_t codes = 2 * (256 * 32 + 32 * 128 + 192 * 32 + 32 * 96), rows = 2 * (256 + 32 + 192 + 32);
        assert_int_equal(fp8_bytes, codes + 4 * rows);
        decoder_weights_free(be, &w);
        safetensors_checkpoint_close(&ckpt);
        be->destroy(be);
    }
}

/* One FP8 matrix at q ([rows, cols], backend.h's layout) against the float32 matrix f quantized by
 * io/fp8: equal codes and scales. */
static void expect_quantized(const uint8_t *q, const float *f, int64_t rows, int64_t cols, const char *what) {
    uint8_t *codes = malloc((size_t)(rows * cols));
    float *scales = malloc((size_t)rows * sizeof *scales);
    fp8_e4m3_quantize_rows(f, rows, cols, codes, scales);
    if (memcmp(q, codes, (size_t)(rows * cols))) fail_msg("%s: codes differ", what);
    if (memcmp(q + nopad_fp8_scales_offset(rows, cols), scales, (size_t)rows * sizeof *scales))
        fail_msg("%s: scales differ", what);
    free(codes);
    free(scales);
}

/* weights fp8 on a GGUF file (tests/data/gguf/quant_tiny.gguf: Q4_K, Q6_K, Q8_0 blocks; Q and K
 * rows permuted by llama.cpp's converter): each fused matrix is the file's weights dequantised and
 * put back in HF's row order (the float load, weights f32) quantized per channel. */
static void test_gguf_to_fp8(void **state) {
    (void)state;
    nopad_backend *be;
    assert_nopad_ok(nopad_backend_cpu_create(1, &be));
    cpu_supports = be->supports;
    be->supports = claims_fp8;
    gguf_file f;
    model_config cfg;
    assert_nopad_ok(gguf_open(test_data_path("gguf/quant_tiny.gguf"), &f));
    assert_nopad_ok(gguf_model_config(&f, &cfg));
    decoder_weights q, ref;
    assert_nopad_ok(decoder_weights_load_gguf(be, &cfg, NULL, &f, 0, 1, &q));
    assert_nopad_ok(decoder_weights_load_gguf(be, &cfg, NULL, &f, 0, -1, &ref));
    gguf_close(&f);
    const int64_t H = cfg.hidden_size, F = cfg.intermediate_size, D = cfg.head_size;
    const int64_t qkv = (int64_t)(cfg.num_heads + 2 * cfg.num_kv_heads) * D;
    for (int32_t l = 0; l < cfg.num_layers; l++) {
        const decoder_layer *a = &q.layers[l], *b = &ref.layers[l];
        assert_int_equal(a->qkv_format, NOPAD_WEIGHT_FP8_E4M3);
        assert_int_equal(b->qkv_format, NOPAD_WEIGHT_DTYPE);
        expect_quantized(a->qkv_w, b->qkv_w, qkv, H, "attn_qkv");
        expect_quantized(a->o_w, b->o_w, H, (int64_t)cfg.num_heads * D, "attn_output");
        expect_quantized(a->up_w, b->up_w, 2 * F, H, "ffn_gate_up");
        expect_quantized(a->down_w, b->down_w, H, F, "ffn_down");
    }
    assert_int_equal(q.tok_emb_format, NOPAD_WEIGHT_DTYPE);
    decoder_weights_free(be, &q);
    decoder_weights_free(be, &ref);
    be->destroy(be);
}

/* tiny_f8 with one E4M3 NaN code (0x7F) in layer 0's k_proj: refused, naming the tensor, whether
 * the weight is kept as FP8 (a backend claiming FP8) or dequantised (the CPU). */
static void test_nan_code(void **state) {
    (void)state;
    char path[512];
    snprintf(path, sizeof path, "%s/model.safetensors", test_data_path("fp8/tiny_f8"));
    size_t len, cfg_len;
    char *bytes = test_read_file(path, &len);
    assert_non_null(bytes);
    safetensors_file f;
    assert_nopad_ok(safetensors_parse((const uint8_t *)bytes, len, "tiny_f8", &f));
    const safetensors_tensor *t = safetensors_find(&f, "model.layers.0.self_attn.k_proj.weight");
    assert_non_null(t);
    ((uint8_t *)bytes)[(const char *)t->data - bytes + 100] = 0x7F;
    safetensors_close(&f);
    const char *dir = test_make_temp_dir(0);
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    FILE *out = fopen(path, "wb");
    assert_non_null(out);
    assert_int_equal(fwrite(bytes, 1, len, out), len);
    fclose(out);
    free(bytes);
    snprintf(path, sizeof path, "%s/config.json", test_data_path("fp8/tiny_f8"));
    char *cfg_json = test_read_file(path, &cfg_len);
    snprintf(path, sizeof path, "%s/config.json", dir);
    out = fopen(path, "wb");
    assert_non_null(out);
    assert_int_equal(fwrite(cfg_json, 1, cfg_len, out), cfg_len);
    fclose(out);
    free(cfg_json);
    for (int kept = 0; kept < 2; kept++) {
        nopad_model *m = NULL;
        nopad_status st;
        if (kept) {
            nopad_backend *be;
            assert_nopad_ok(nopad_backend_cpu_create(1, &be));
            cpu_supports = be->supports;
            be->supports = claims_fp8;
            model_config cfg;
            size_t n;
            char *json = test_read_file(path, &n);
            assert_nopad_ok(hf_config_parse(json, n, path, &cfg));
            free(json);
            safetensors_checkpoint ckpt;
            assert_nopad_ok(safetensors_checkpoint_open(dir, &ckpt));
            decoder_weights w;
            st = decoder_weights_load_st(be, &cfg, NULL, &ckpt, dir, 0, &w);
            safetensors_checkpoint_close(&ckpt);
            be->destroy(be);
        } else {
            char *err = NULL;
            st = test_load_capturing(dir, NOPAD_WEIGHTS_AUTO, &m, &err);
            free(err);
        }
        assert_int_equal(st, NOPAD_ERR_FORMAT);
        assert_null(m);
        if (!strstr(nopad_last_error(), "model.layers.0.self_attn.k_proj.weight") ||
            !strstr(nopad_last_error(), "NaN at element 100"))
            fail_msg("%s: '%s'", kept ? "kept" : "dequantised", nopad_last_error());
    }
}

static void expect_refused(const char *dir, nopad_status want, const char *needle) {
    nopad_model *m = NULL;
    char *err = NULL;
    const nopad_status st = test_load_capturing(test_data_path(dir), NOPAD_WEIGHTS_AUTO, &m, &err);
    free(err);
    if (st != want) fail_msg("%s: status %d, expected %d (%s)", dir, (int)st, (int)want, nopad_last_error());
    assert_null(m);
    const char *msg = nopad_last_error();
    if (!strstr(msg, needle)) fail_msg("%s: '%s' does not say '%s'", dir, msg, needle);
    /* every message names the tensor */
    if (!strstr(msg, "model.layers.0.self_attn.q_proj.weight"))
        fail_msg("%s: '%s' does not name the tensor", dir, msg);
}

static void test_refused(void **state) {
    (void)state;
    expect_refused("fp8/bad_e5m2", NOPAD_ERR_UNSUPPORTED, "is F8_E5M2: nopad runs FP8 weights stored as F8_E4M3");
    expect_refused("fp8/bad_block_scale", NOPAD_ERR_UNSUPPORTED, "has block-wise scales ('model.layers.0.self_attn."
                                                                 "q_proj.weight_scale_inv'");
    expect_refused("fp8/bad_scale_shape", NOPAD_ERR_FORMAT, "of shape [32] for 128 rows");
    expect_refused("fp8/bad_no_scale", NOPAD_ERR_FORMAT, "has no 'weight_scale' beside it");
    /* fp8 weights on the CPU: refused before anything loads */
    nopad_model_params p = nopad_model_default_params();
    p.weights = NOPAD_WEIGHTS_FP8;
    nopad_model *m = NULL;
    assert_nopad_error(nopad_model_load(test_data_path("fp8/tiny_f8_ref"), &p, &m), NOPAD_ERR_UNSUPPORTED,
                       "fp8 weights run on CUDA (Hopper)");
    assert_null(m);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_all_codes),
        cmocka_unit_test(test_rounding),
        cmocka_unit_test(test_quantize_rows),
        cmocka_unit_test(test_f8_checkpoint_on_cpu),
        cmocka_unit_test(test_requant_fixture),
        cmocka_unit_test(test_loader_layout),
        cmocka_unit_test(test_nan_code),
        cmocka_unit_test(test_gguf_to_fp8),
        cmocka_unit_test(test_refused),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
