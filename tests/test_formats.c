/* test_formats.c - scalar format conversions of src/quant/formats.c that the tests' host references use. */
#include <criterion/criterion.h>
#include <math.h>
#include <string.h>

#include "quant/formats.h"

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
