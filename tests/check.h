/* check.h - shared helpers for the Criterion tests: fixture paths and closeness checks. */
#ifndef DSV4_TESTS_CHECK_H
#define DSV4_TESTS_CHECK_H

#include <ftw.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Directory of the project's own copies of the fixtures (tests/fixtures), overridable with
 * DSV4_FIXTURES. Tests run from the repository root. */
static inline const char *dsv4_test_fixtures(void) {
    const char *e = getenv("DSV4_FIXTURES");
    return e && *e ? e : "tests/fixtures";
}

/* Temporary directories of a test: dsv4_test_mkdtemp makes one from a template ("/tmp/dsv4-NAME-XXXXXX") and records
 * it; dsv4_test_tmp_clean removes every recorded one with its files. A suite that makes them names the latter as its
 * .fini (`TestSuite(name, .fini = dsv4_test_tmp_clean)`: each Criterion test runs in its own process, and .fini runs
 * after a failed assertion too), so that `make test` leaves nothing in /tmp. NULL when mkdtemp fails or 16 are made. */
static inline char (*dsv4_test_tmps(int **n))[64] {
    static char d[16][64];
    static int k;
    *n = &k;
    return d;
}
static inline const char *dsv4_test_mkdtemp(const char *tmpl) {
    int *n;
    char (*d)[64] = dsv4_test_tmps(&n);
    if (*n >= 16 || strlen(tmpl) >= sizeof d[0]) return NULL;
    strcpy(d[*n], tmpl);
    if (!mkdtemp(d[*n])) return NULL;
    return d[(*n)++];
}
static inline int dsv4_test_rm_one(const char *p, const struct stat *sb, int flag, struct FTW *ftw) {
    (void)sb, (void)flag, (void)ftw;
    return remove(p);
}
/* dir and everything under it (the tests' one way to remove a directory they made) */
static inline void dsv4_test_rm_tree(const char *dir) { nftw(dir, dsv4_test_rm_one, 16, FTW_DEPTH | FTW_PHYS); }
static inline void dsv4_test_tmp_clean(void) {
    int *n;
    char (*d)[64] = dsv4_test_tmps(&n);
    for (int i = 0; i < *n; i++) dsv4_test_rm_tree(d[i]);
    *n = 0;
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
