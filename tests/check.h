/* check.h - shared helpers for the Criterion tests: fixture paths and closeness checks. */
#ifndef DSV4_TESTS_CHECK_H
#define DSV4_TESTS_CHECK_H

#include <math.h>
#include <stddef.h>
#include <stdlib.h>

/* Directory of the project's own copies of the fixtures (tests/fixtures), overridable with
 * DSV4_FIXTURES. Tests run from the repository root. */
static inline const char *dsv4_test_fixtures(void) {
    const char *e = getenv("DSV4_FIXTURES");
    return e && *e ? e : "tests/fixtures";
}

/* Relative L2 error ||got-ref|| / ||ref||. */
static inline double dsv4_rel_l2(const float *got, const float *ref, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        double d = (double)got[i] - ref[i];
        num += d * d;
        den += (double)ref[i] * ref[i];
    }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

#endif
