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

#endif
