/* FP8 E4M3 (the "fn" variant: 4 exponent bits of bias 7, 3 mantissa bits, no infinities, NaN at
 * S.1111.111, largest 448) on the host: the conversions and the per-output-channel quantizer that
 * `--weights fp8` uses at load. Checked code for code against ml_dtypes' float8_e4m3fn
 * (scripts/make_fp8_fixtures.py, tests/test_fp8.c); the CUDA kernels' conversions
 * (cvt.rn.satfinite.e4m3x2.f32) give the same codes. */
#ifndef NOPAD_IO_FP8_H
#define NOPAD_IO_FP8_H

#include <stdint.h>

#define FP8_E4M3_MAX 448.0f

/* The value of an E4M3 code (NaN for 0x7F and 0xFF). */
float fp8_e4m3_to_f32(uint8_t code);

/* The E4M3 code nearest to x, ties to the even code, saturating: |x| >= 448 (infinities too)
 * gives ±448; NaN gives NaN (0x7F with x's sign). */
uint8_t fp8_e4m3_from_f32(float x);

/* The scale of a row (or token) whose largest magnitude is amax: amax / 448, or 1 for a row of
 * zeros (or one so small that amax / 448 underflows to 0), so that x / scale never divides by 0. */
float fp8_e4m3_scale(float amax);

/* Per output channel: for each of the `rows` rows of w [rows, cols], scales[r] =
 * fp8_e4m3_scale(max |w[r, :]|) and q[r, c] = fp8_e4m3_from_f32(w[r, c] / scales[r]), so that
 * q · scale reproduces w within half an E4M3 step (2⁻⁴ relative) of each value, or 2⁻¹⁰·scale
 * for the smallest (subnormal) ones. */
void fp8_e4m3_quantize_rows(const float *w, int64_t rows, int64_t cols, uint8_t *q, float *scales);

#endif
