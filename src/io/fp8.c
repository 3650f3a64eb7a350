/* E4M3 conversions (fp8.h). Plain arithmetic on floats: scaling by powers of two is exact, so the
 * only rounding is rintf's, to nearest-even in the default rounding mode. */
#include "io/fp8.h"

#include <math.h>

float fp8_e4m3_to_f32(uint8_t code) {
    const int exponent = (code >> 3) & 15, mantissa = code & 7;
    float v;
    if (exponent == 15 && mantissa == 7)
        v = NAN;
    else if (exponent == 0)
        v = ldexpf((float)mantissa, -9); /* subnormal: m/8 · 2⁻⁶ */
    else
        v = ldexpf((float)(8 + mantissa), exponent - 10); /* (1 + m/8) · 2^(e-7) */
    return (code & 0x80) ? -v : v;
}

uint8_t fp8_e4m3_from_f32(float x) {
    const uint8_t sign = signbit(x) ? 0x80 : 0;
    const float a = fabsf(x);
    if (isnan(x)) return sign | 0x7F;
    /* 448 < a < 464 rounds down to 448, 464 is a tie that goes to 448's even mantissa, and above
     * it 480 does not exist: every a >= 448 saturates */
    if (a >= FP8_E4M3_MAX) return sign | 0x7E;
    if (a < 0x1p-6f) /* subnormal steps of 2⁻⁹; 8 steps is the smallest normal, code 0x08 */
        return sign | (uint8_t)rintf(a * 0x1p9f);
    int e;
    frexpf(a, &e); /* a = f · 2^e, f in [0.5, 1): a's exponent is e - 1, in [-6, 8] */
    int exponent = e - 1;
    float steps = rintf(ldexpf(a, 3 - exponent)); /* in [8, 16] */
    if (steps == 16.0f) { /* rounded up into the next binade */
        exponent++;
        steps = 8.0f;
    }
    return sign | (uint8_t)(((exponent + 7) << 3) | ((int)steps - 8));
}

float fp8_e4m3_scale(float amax) {
    const float scale = amax / FP8_E4M3_MAX;
    return scale > 0.0f && isfinite(scale) ? scale : 1.0f;
}

void fp8_e4m3_quantize_rows(const float *w, int64_t rows, int64_t cols, uint8_t *q, float *scales) {
    for (int64_t r = 0; r < rows; r++) {
        const float *row = w + r * cols;
        float amax = 0.0f;
        for (int64_t c = 0; c < cols; c++) amax = fmaxf(amax, fabsf(row[c]));
        const float scale = fp8_e4m3_scale(amax);
        scales[r] = scale;
        for (int64_t c = 0; c < cols; c++) q[r * cols + c] = fp8_e4m3_from_f32(row[c] / scale);
    }
}
