/* formats.c - see formats.h. Spec sections 9, 14. */
#include "formats.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static float bits_f32(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static uint32_t f32_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

float dsv4_bf16_to_f32(uint16_t h) { return bits_f32((uint32_t)h << 16); }

uint16_t dsv4_f32_to_bf16(float f) {
    uint32_t u = f32_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);
    u += 0x7fffu + ((u >> 16) & 1);
    return (uint16_t)(u >> 16);
}

uint16_t dsv4_f32_to_f16(float f) {
    const uint32_t u = f32_bits(f), s = (u >> 16) & 0x8000u, a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return (uint16_t)(s | 0x7e00u | ((a >> 13) & 0x3ffu)); /* NaN: quiet, payload's top bits */
    if (a >= 0x477ff000u) return (uint16_t)(s | 0x7c00u);                      /* 65520 and up round to inf */
    if (a < 0x38800000u) /* below 2^-14: f16's subnormals in units of 2^-24 (exact scaling), rounded to even */
        return (uint16_t)(s | (uint32_t)nearbyintf(bits_f32(a) * 0x1p24f));
    const uint32_t r = a + 0xfffu + ((a >> 13) & 1u); /* round the 13 dropped bits to even (a carry moves the exponent) */
    return (uint16_t)(s | ((r >> 13) - (112u << 10)));
}

float dsv4_f16_to_f32(uint16_t h) {
    uint32_t s = (uint32_t)(h >> 15) << 31, e = (h >> 10) & 0x1f, m = h & 0x3ff;
    if (e == 0) {
        float v = ldexpf((float)m, -24);
        return s ? -v : v;
    }
    if (e == 31) return bits_f32(s | 0x7f800000u | (m << 13));
    return bits_f32(s | ((e + 112) << 23) | (m << 13));
}

float dsv4_e4m3_to_f32(uint8_t b) {
    int s = b >> 7, e = (b >> 3) & 0xf, m = b & 7;
    float v;
    if (e == 0xf && m == 7) return NAN;
    if (e == 0) v = ldexpf((float)m, -9);
    else v = ldexpf((float)(8 + m), e - 10);
    return s ? -v : v;
}

float dsv4_e8m0_to_f32(uint8_t b) {
    if (b == 0xff) return NAN;
    if (b == 0) return bits_f32(0x00400000u); /* 2^-127, a subnormal */
    return bits_f32((uint32_t)b << 23);
}

float dsv4_e2m1_to_f32(uint8_t code) {
    static const float lut[16] = {0, 0.5f, 1, 1.5f, 2, 3, 4, 6, -0.0f, -0.5f, -1, -1.5f, -2, -3, -4, -6};
    return lut[code & 15];
}

/* Both grids are "integer multiples of a power-of-two step within each binade", and the parity of
 * the multiple is the parity of the mantissa, so rintf (round to nearest even) on x/step is RNE. */
float dsv4_round_e4m3(float x) {
    float a = fabsf(x);
    if (a == 0 || isnan(x)) return x;
    int e;
    frexpf(a, &e);          /* a in [2^(e-1), 2^e) */
    int ex = e - 1;
    if (ex < -6) ex = -6;   /* subnormals share the step of the lowest binade */
    float step = ldexpf(1.0f, ex - 3);
    return copysignf(rintf(a / step) * step, x);
}

float dsv4_round_e2m1(float x) {
    float a = fabsf(x), step = a < 2 ? 0.5f : a < 4 ? 1.0f : 2.0f;
    return copysignf(rintf(a / step) * step, x);
}

/* 2^ceil(log2(y)) for y > 0 normal, from the fp32 bits: exponent - 127 + (mantissa != 0). */
static float pow2_ceil(float y) {
    uint32_t u = f32_bits(y);
    int e = (int)((u >> 23) & 0xff) - 127 + ((u & 0x7fffffu) != 0);
    return ldexpf(1.0f, e);
}

void dsv4_act_quant_fp8(float *x, size_t n, size_t block) {
    for (size_t b0 = 0; b0 < n; b0 += block) {
        size_t b1 = b0 + block < n ? b0 + block : n;
        float amax = 1e-4f;
        for (size_t i = b0; i < b1; i++) amax = fmaxf(amax, fabsf(x[i]));
        float s = pow2_ceil(amax * (1.0f / 448.0f));
        for (size_t i = b0; i < b1; i++) {
            float v = x[i] / s;
            v = fminf(fmaxf(v, -448.0f), 448.0f);
            x[i] = dsv4_round_e4m3(v) * s;
        }
    }
}

void dsv4_act_quant_fp4(float *x, size_t n, size_t block) {
    const float tiny = 6.0f * 0x1p-126f;
    for (size_t b0 = 0; b0 < n; b0 += block) {
        size_t b1 = b0 + block < n ? b0 + block : n;
        float amax = tiny;
        for (size_t i = b0; i < b1; i++) amax = fmaxf(amax, fabsf(x[i]));
        float s = pow2_ceil(amax / 6.0f);
        for (size_t i = b0; i < b1; i++) {
            float v = x[i] / s;
            v = fminf(fmaxf(v, -6.0f), 6.0f);
            x[i] = dsv4_round_e2m1(v) * s;
        }
    }
}

void dsv4_hadamard(float *x, size_t n) {
    /* Sums in double: the exact result rounded once, so FP4 rounding downstream sees the value
     * closest to the real-number rotation. */
    double *t = malloc(sizeof(double) * n);
    for (size_t i = 0; i < n; i++) t[i] = x[i];
    for (size_t h = 1; h < n; h *= 2)
        for (size_t i = 0; i < n; i += 2 * h)
            for (size_t j = i; j < i + h; j++) {
                double a = t[j], b = t[j + h];
                t[j] = a + b;
                t[j + h] = a - b;
            }
    double s = 1.0 / sqrt((double)n);
    for (size_t i = 0; i < n; i++) x[i] = (float)(t[i] * s);
    free(t);
}
