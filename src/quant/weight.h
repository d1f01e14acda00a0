/* weight.h - a linear layer's weight matrix [rows, cols] in its stored format, dequantized on the fly.
 *
 * Owns: the formats a weight can be stored in (spec 14): F32 / BF16 / F16; FP8 e4m3 with 128x128
 * block scales (E8M0 `.scale` or F32 `weight_scale_inv`); MXFP4 (packed e2m1 + E8M0 per 32);
 * NVFP4 (packed e2m1 + e4m3 per 16 + an F32 tensor scale). The data stays where it was mapped; a row
 * is decoded to float only when a kernel needs it. */
#ifndef DSV4_QUANT_WEIGHT_H
#define DSV4_QUANT_WEIGHT_H

#include <stdint.h>

typedef enum dsv4_wfmt {
    DSV4_WF_F32,
    DSV4_WF_BF16,
    DSV4_WF_F16,
    DSV4_WF_FP8,   /* e4m3, scale [ceil(R/128), ceil(C/128)] E8M0 or F32 */
    DSV4_WF_MXFP4, /* packed e2m1 [R, C/2], scale [R, C/32] E8M0 */
    DSV4_WF_NVFP4, /* packed e2m1 [R, C/2], scale [R, C/16] e4m3, times scale2 */
    DSV4_WF_COUNT
} dsv4_wfmt;

const char *dsv4_wfmt_name(dsv4_wfmt f);

typedef struct dsv4_weight {
    dsv4_wfmt fmt;
    int rows, cols;          /* logical shape of this view */
    int row0;                /* first stored row of the view (slices of fused tensors) */
    const uint8_t *data;     /* stored row 0 */
    const uint8_t *scale;    /* FP8 / MXFP4 / NVFP4 scales, stored row 0 */
    int scale_f32;           /* FP8: scales are F32 (weight_scale_inv) instead of E8M0 */
    int64_t scale_stride;    /* elements per scale row */
    float scale2;            /* NVFP4 tensor scale (weight_scale_2) */
    int act_quant;           /* FP8-recipe: quantize the input rows to FP8 (block 128) first */
    const char *name;        /* internal tensor name, for errors */
} dsv4_weight;

/* Decodes row r (0 <= r < rows) into out[cols]. */
void dsv4_weight_row(const dsv4_weight *w, int r, float *out);
/* Stored bytes of the view (data + scales). */
uint64_t dsv4_weight_bytes(const dsv4_weight *w);

/* MXFP4 views: for every row and every block of `block` columns (a multiple of 32), the spread max - min of its groups'
 * E8M0 exponents, counted into hist[min(spread, DSV4_SPREAD_BINS - 1)] (a NaN scale, 0xFF, counts in the last bin).
 * Returns the blocks counted (0 for other formats or a block that is not a multiple of 32). The question it answers: an
 * MXFP4 block whose spread is at most 14 holds, exactly, e4m3 codes times one power of two: e2m1's 0.5 .. 6 times
 * 2^(e - e_max + 6) stay <= 384, and for group exponents e down to e_max - 14 they stay on e4m3's grid (0.5 x 2^-8 is its
 * smallest subnormal, 2^-9), so an FP8 GEMM with one scale per 128 columns could read it. */
#define DSV4_SPREAD_BINS 16
uint64_t dsv4_weight_scale_spread(const dsv4_weight *w, int block, uint64_t hist[DSV4_SPREAD_BINS]);

#endif
