/* test_formats.c - scalar format conversions of src/quant/formats.c that the tests' host references use, and
 * src/quant/weight.c's scale statistics. */
#include <criterion/criterion.h>
#include <math.h>
#include <string.h>

#include "quant/formats.h"
#include "quant/weight.h"

static float bits_f(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* every f16 value comes back as itself (NaNs as NaNs) */
Test(formats, f16_round_trip) {
    for (uint32_t h = 0; h < 65536; h++) {
        const float v = dsv4_f16_to_f32((uint16_t)h);
        const uint16_t b = dsv4_f32_to_f16(v);
        if (isnan(v)) cr_assert(isnan(dsv4_f16_to_f32(b)), "f16 0x%04x: NaN lost", h);
        else cr_assert_eq(b, h, "f16 0x%04x (%g) came back as 0x%04x", h, (double)v, b);
    }
}

/* halfway between neighbours goes to the even code; just off halfway to the nearer one; the ends */
Test(formats, f16_rounding) {
    for (uint32_t h = 0; h < 0x7bff; h++) { /* positive finite neighbours h, h + 1 (h + 1 still finite) */
        const double lo = dsv4_f16_to_f32((uint16_t)h), hi = dsv4_f16_to_f32((uint16_t)(h + 1));
        const float mid = (float)((lo + hi) / 2); /* exact in f32: 11 significant bits plus one */
        const uint16_t even = (h & 1) ? (uint16_t)(h + 1) : (uint16_t)h;
        cr_assert_eq(dsv4_f32_to_f16(mid), even, "midpoint of 0x%04x and 0x%04x", h, h + 1);
        cr_assert_eq(dsv4_f32_to_f16(-mid), even | 0x8000, "negative midpoint of 0x%04x and 0x%04x", h, h + 1);
        cr_assert_eq(dsv4_f32_to_f16(nextafterf(mid, 0.0f)), h, "below the midpoint of 0x%04x", h);
        cr_assert_eq(dsv4_f32_to_f16(nextafterf(mid, INFINITY)), h + 1, "above the midpoint of 0x%04x", h);
    }
    cr_assert_eq(dsv4_f32_to_f16(65504.0f), 0x7bff);
    cr_assert_eq(dsv4_f32_to_f16(65519.996f), 0x7bff);
    cr_assert_eq(dsv4_f32_to_f16(65520.0f), 0x7c00); /* the tie above the largest goes to inf (even) */
    cr_assert_eq(dsv4_f32_to_f16(1e30f), 0x7c00);
    cr_assert_eq(dsv4_f32_to_f16(-INFINITY), 0xfc00);
    cr_assert_eq(dsv4_f32_to_f16(bits_f(1)), 0x0000);           /* the smallest f32 subnormal: to +0 */
    cr_assert_eq(dsv4_f32_to_f16(-bits_f(1)), 0x8000);          /* and -0 */
    cr_assert_eq(dsv4_f32_to_f16(0x1p-25f), 0x0000);            /* half the smallest f16 subnormal: to even (0) */
    cr_assert_eq(dsv4_f32_to_f16(0x1.8p-24f), 0x0002);          /* 1.5 units: to even (2) */
    cr_assert(isnan(dsv4_f16_to_f32(dsv4_f32_to_f16(NAN))));
}

/* dsv4_weight_scale_spread: a block's spread is max - min of its groups' E8M0 bytes; rows of a view from row0; NaN scales
 * and spreads past 14 in the last bin; other formats and blocks that are not whole groups count nothing */
Test(formats, mxfp4_scale_spread) {
    enum { R = 3, C = 256, NG = C / 32 };
    uint8_t data[R * C / 2], sc[R * NG] = {
        127, 127, 127, 127, 120, 127, 134, 127, /* row 0: spreads 0 and 14 */
        100, 127, 127, 127, 127, 127, 127, 128, /* row 1: 27 (last bin) and 1 */
        127, 0xFF, 127, 127, 5, 5, 6, 5,        /* row 2: a NaN (last bin) and 1 */
    };
    memset(data, 0, sizeof data);
    dsv4_weight w = {.fmt = DSV4_WF_MXFP4, .rows = R, .cols = C, .data = data, .scale = sc, .scale_stride = NG, .name = "t"};
    uint64_t h[DSV4_SPREAD_BINS] = {0};
    cr_assert_eq(dsv4_weight_scale_spread(&w, 128, h), 6);
    cr_assert_eq(h[0], 1);
    cr_assert_eq(h[1], 2);
    cr_assert_eq(h[14], 1);
    cr_assert_eq(h[DSV4_SPREAD_BINS - 1], 2);
    /* a view of rows 1-2, one block a row */
    memset(h, 0, sizeof h);
    w.row0 = 1, w.rows = 2;
    cr_assert_eq(dsv4_weight_scale_spread(&w, 256, h), 2);
    cr_assert_eq(h[DSV4_SPREAD_BINS - 1], 2);
    /* nothing counted: a block of 48 columns, an FP8 weight */
    memset(h, 0, sizeof h);
    cr_assert_eq(dsv4_weight_scale_spread(&w, 48, h), 0);
    w.fmt = DSV4_WF_FP8;
    cr_assert_eq(dsv4_weight_scale_spread(&w, 128, h), 0);
    for (int b = 0; b < DSV4_SPREAD_BINS; b++) cr_assert_eq(h[b], 0);
}
