/* formats.h - scalar number formats of DeepSeek-V4 checkpoints and the official rounding simulations.
 *
 * Owns: decoding BF16 / F16 / FP8 e4m3 / E8M0 / FP4 e2m1 codes to float, and the exact activation
 * quantization simulations of spec section 14.3 (act_quant with ue8m0 power-of-two scales, FP4
 * act quant, the Sylvester Hadamard rotation of the indexer, section 9). */
#ifndef DSV4_QUANT_FORMATS_H
#define DSV4_QUANT_FORMATS_H

#include <stddef.h>
#include <stdint.h>

float dsv4_bf16_to_f32(uint16_t h);
uint16_t dsv4_f32_to_bf16(float f); /* round to nearest even; NaN stays NaN */
float dsv4_f16_to_f32(uint16_t h);
uint16_t dsv4_f32_to_f16(float f); /* round to nearest even (subnormals, overflow to inf); NaN stays NaN */
float dsv4_e4m3_to_f32(uint8_t b);  /* e4m3fn: bias 7, no inf, 0x7f/0xff = NaN */
float dsv4_e8m0_to_f32(uint8_t b);  /* 2^(b-127); 0xff = NaN */
float dsv4_e2m1_to_f32(uint8_t code); /* low 4 bits: 0, .5, 1, 1.5, 2, 3, 4, 6 and negatives */

/* Round a float (already in [-448, 448]) to the nearest e4m3 value, ties to even. */
float dsv4_round_e4m3(float x);
/* Round a float (already in [-6, 6]) to the nearest e2m1 value, ties to even. */
float dsv4_round_e2m1(float x);

/* In-place FP8 act_quant simulation (spec 14.3): for every block of `block` values (the last block
 * may be shorter), amax = max(|x|, 1e-4), s = 2^ceil(log2(amax * (1/448))), x = e4m3(clamp(x/s)) * s. */
void dsv4_act_quant_fp8(float *x, size_t n, size_t block);
/* In-place FP4 act quant simulation: amax = max(|x|, 6*2^-126), s = 2^ceil(log2(amax/6)),
 * x = e2m1(clamp(x/s, -6, 6)) * s, blocks of `block`. */
void dsv4_act_quant_fp4(float *x, size_t n, size_t block);
/* In place y = (x . H_n) / sqrt(n), Sylvester Hadamard; n must be a power of two. */
void dsv4_hadamard(float *x, size_t n);

#endif
