/* test_sample.c - sampler: RNG, parameter validation, greedy/seeded sampling, filters,
 * penalties, log-probabilities, streaming stop strings. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "check.h"
#include "engine/sample.h"

/* ---- helpers ------------------------------------------------------------------------------ */

static dsv4_sampler *mk(const dsv4_sampling *p, int vocab) {
    dsv4_err e = {{0}};
    dsv4_sampler *s = NULL;
    cr_assert_eq(dsv4_sampler_init(&s, p, vocab, &e), 0, "init: %s", e.msg);
    cr_assert_not_null(s);
    return s;
}

static int32_t draw(dsv4_sampler *s, const float *logits) {
    dsv4_err e = {{0}};
    int32_t t = dsv4_sampler_sample(s, logits, &e);
    cr_assert_geq(t, 0, "sample: %s", e.msg);
    return t;
}

static void accept(dsv4_sampler *s, int32_t t) {
    dsv4_err e = {{0}};
    cr_assert_eq(dsv4_sampler_accept(s, t, &e), 0, "accept: %s", e.msg);
}

/* n draws at consecutive steps; counts[token]++ */
static void histogram(dsv4_sampler *s, const float *logits, int vocab, int n, int *counts) {
    memset(counts, 0, (size_t)vocab * sizeof *counts);
    for (int i = 0; i < n; i++) {
        int32_t t = draw(s, logits);
        counts[t]++;
        accept(s, t);
    }
}

/* Pearson chi-square of counts against probabilities p (cells with p == 0 must be empty). */
static double chi_square(const int *counts, const double *p, int k, int n) {
    double x = 0;
    for (int i = 0; i < k; i++) {
        if (p[i] == 0) {
            cr_assert_eq(counts[i], 0, "token %d has probability 0 but was drawn %d times", i, counts[i]);
            continue;
        }
        double e = p[i] * n, d = counts[i] - e;
        x += d * d / e;
    }
    return x;
}

static void softmax(const float *l, int n, double T, double *p) {
    double m = -INFINITY, s = 0;
    for (int i = 0; i < n; i++)
        if (l[i] / T > m) m = l[i] / T;
    for (int i = 0; i < n; i++) s += p[i] = exp(l[i] / T - m);
    for (int i = 0; i < n; i++) p[i] /= s;
}

/* ---- RNG ---------------------------------------------------------------------------------- */

Test(sample_rng, philox_known_answers) {
    static const uint32_t kat[3][10] = {
        {0, 0, 0, 0, 0, 0, 0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8},
        {0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff, 0x408f276d,
         0x41c83b0e, 0xa20bc7c6, 0x6d5451fd},
        {0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344, 0xa4093822, 0x299f31d0, 0xd16cfe09,
         0x94fdcceb, 0x5001e420, 0x24126ea1},
    };
    for (int v = 0; v < 3; v++) {
        uint32_t out[4];
        dsv4_philox4x32_10(kat[v], kat[v] + 4, out);
        for (int i = 0; i < 4; i++)
            cr_assert_eq(out[i], kat[v][6 + i], "vector %d word %d: %08x != %08x", v, i, out[i],
                         kat[v][6 + i]);
    }
}

/* (seed, step) -> x[0], x[1], u. Produced identically by CUDA (H200): curand_init(seed, step, 0,
 * &st) with curandStatePhilox4_32_10_t, then two curand(&st) calls - a GPU twin can reuse these. */
Test(sample_rng, curand_compatible_known_answers) {
    static const struct {
        uint64_t seed, step;
        uint32_t x0, x1;
        double u;
    } kat[] = {
        {0, 0, 0x6627e8d5, 0xe169c58d, 0.39904647231489565},
        {0, 7, 0xd1fc5bdd, 0x965c2541, 0.82025693794595844},
        {0, 4294967301ull, 0xac867c6a, 0x79f3906d, 0.67392709461132239},
        {42, 1, 0x02933769, 0x2051e913, 0.010058843540026619},
        {0x0123456789abcdefull, 0, 0xb850222e, 0xc58cb04b, 0.71997274288295199},
        {0x0123456789abcdefull, 4294967301ull, 0xcfd2f5e7, 0xf4e5149d, 0.81181275812253717},
        {~0ull, 1, 0xa74236ed, 0x7e853102, 0.6533541045652318},
        {~0ull, 4294967301ull, 0x536485a5, 0xc7b6e502, 0.32575259938936307},
    };
    for (size_t i = 0; i < sizeof kat / sizeof kat[0]; i++) {
        uint32_t key[2] = {(uint32_t)kat[i].seed, (uint32_t)(kat[i].seed >> 32)};
        uint32_t ctr[4] = {0, 0, (uint32_t)kat[i].step, (uint32_t)(kat[i].step >> 32)}, x[4];
        dsv4_philox4x32_10(ctr, key, x);
        cr_assert_eq(x[0], kat[i].x0, "row %zu", i);
        cr_assert_eq(x[1], kat[i].x1, "row %zu", i);
        cr_assert_eq(dsv4_rng_uniform(kat[i].seed, kat[i].step), kat[i].u, "row %zu", i);
    }
}

Test(sample_rng, uniform_is_a_function_of_seed_and_step) {
    /* the documented derivation */
    uint64_t seed = 0x0123456789abcdefull, step = 0x100000002ull;
    uint32_t key[2] = {0x89abcdef, 0x01234567}, ctr[4] = {0, 0, 2, 1}, x[4];
    dsv4_philox4x32_10(ctr, key, x);
    double want = ((double)(x[0] >> 5) * 67108864.0 + (double)(x[1] >> 6)) / 9007199254740992.0;
    cr_assert_eq(dsv4_rng_uniform(seed, step), want);
    cr_assert_eq(dsv4_rng_uniform(seed, step), dsv4_rng_uniform(seed, step));
    /* range, mean, and seeds/steps giving different values */
    double sum = 0, sum2 = 0;
    int n = 100000, same = 0;
    for (int i = 0; i < n; i++) {
        double u = dsv4_rng_uniform(42, (uint64_t)i);
        cr_assert(u >= 0.0 && u < 1.0);
        sum += u;
        sum2 += u * u;
        if (u == dsv4_rng_uniform(43, (uint64_t)i)) same++;
    }
    cr_assert_lt(fabs(sum / n - 0.5), 0.005, "mean %g", sum / n);
    cr_assert_lt(fabs(sum2 / n - 1.0 / 3.0), 0.005, "second moment %g", sum2 / n);
    cr_assert_eq(same, 0);
}

/* ---- parameters --------------------------------------------------------------------------- */

Test(sample_params, defaults_are_valid) {
    dsv4_sampling p;
    dsv4_sampling_defaults(&p);
    dsv4_err e = {{0}};
    cr_assert_eq(dsv4_sampling_validate(&p, &e), 0, "%s", e.msg);
    cr_assert_eq(p.temperature, 1.0f);
    cr_assert_eq(p.top_p, 1.0f);
    cr_assert_eq(p.top_k, 0);
    cr_assert_eq(p.repetition_penalty, 1.0f);
    /* edges that are valid */
    p.temperature = 0;
    p.top_p = 1e-6f;
    p.min_p = 1;
    p.presence_penalty = -2;
    p.frequency_penalty = 2;
    p.repetition_penalty = 0.01f;
    p.max_tokens = 0;
    p.top_k = 1 << 30;
    const char *stops[] = {"a", "</s>"};
    p.stop = stops;
    p.n_stop = 2;
    cr_assert_eq(dsv4_sampling_validate(&p, &e), 0, "%s", e.msg);
    p.temperature = 100;
    cr_assert_eq(dsv4_sampling_validate(&p, &e), 0, "%s", e.msg);
}

static void expect_invalid(const dsv4_sampling *p, const char *field) {
    dsv4_err e = {{0}};
    cr_assert_eq(dsv4_sampling_validate(p, &e), -1, "expected %s to be rejected", field);
    cr_assert_not_null(strstr(e.msg, field), "message '%s' does not name '%s'", e.msg, field);
    /* init refuses too and leaves *out NULL */
    dsv4_sampler *s = (dsv4_sampler *)(uintptr_t)1; /* any non-NULL value */
    cr_assert_eq(dsv4_sampler_init(&s, p, 10, &e), -1);
    cr_assert_null(s);
    cr_assert_not_null(strstr(e.msg, field));
}

Test(sample_params, invalid_values_name_the_parameter) {
    dsv4_sampling d;
    dsv4_sampling_defaults(&d);
    dsv4_sampling p;
#define BAD(field, value, name)                                                                    \
    do {                                                                                           \
        p = d;                                                                                     \
        p.field = value;                                                                           \
        expect_invalid(&p, name);                                                                  \
    } while (0)
    BAD(temperature, -0.1f, "temperature");
    BAD(temperature, 100.5f, "temperature");
    BAD(temperature, NAN, "temperature");
    BAD(temperature, INFINITY, "temperature");
    BAD(top_p, 0.0f, "top_p");
    BAD(top_p, 1.01f, "top_p");
    BAD(top_p, -0.5f, "top_p");
    BAD(top_p, NAN, "top_p");
    BAD(top_k, -1, "top_k");
    BAD(min_p, -0.01f, "min_p");
    BAD(min_p, 1.5f, "min_p");
    BAD(min_p, NAN, "min_p");
    BAD(presence_penalty, 2.5f, "presence_penalty");
    BAD(presence_penalty, -2.01f, "presence_penalty");
    BAD(frequency_penalty, -3.0f, "frequency_penalty");
    BAD(frequency_penalty, NAN, "frequency_penalty");
    BAD(repetition_penalty, 0.0f, "repetition_penalty");
    BAD(repetition_penalty, -1.0f, "repetition_penalty");
    BAD(repetition_penalty, INFINITY, "repetition_penalty");
    BAD(max_tokens, -1, "max_tokens");
#undef BAD
    const char *empty[] = {"ok", ""};
    p = d;
    p.stop = empty;
    p.n_stop = 2;
    expect_invalid(&p, "stop[1]");
    const char *null[] = {NULL};
    p.stop = null;
    p.n_stop = 1;
    expect_invalid(&p, "stop[0]");
    p.stop = NULL;
    expect_invalid(&p, "stop");
    char *longstop = malloc(DSV4_STOP_MAX_LEN + 2);
    memset(longstop, 'x', DSV4_STOP_MAX_LEN + 1);
    longstop[DSV4_STOP_MAX_LEN + 1] = 0;
    const char *lng[] = {longstop};
    p.stop = lng;
    expect_invalid(&p, "stop[0]");
    free(longstop);
}

Test(sample_params, bad_vocab_and_tokens) {
    dsv4_sampling p;
    dsv4_sampling_defaults(&p);
    dsv4_err e = {{0}};
    dsv4_sampler *s = NULL;
    cr_assert_eq(dsv4_sampler_init(&s, &p, 0, &e), -1);
    cr_assert_not_null(strstr(e.msg, "vocab"));
    s = mk(&p, 10);
    cr_assert_eq(dsv4_sampler_accept(s, 10, &e), -1);
    cr_assert_not_null(strstr(e.msg, "10"));
    cr_assert_eq(dsv4_sampler_accept(s, -1, &e), -1);
    int32_t prompt[] = {1, 2, 99};
    cr_assert_eq(dsv4_sampler_add_prompt(s, prompt, 3, &e), -1);
    cr_assert_not_null(strstr(e.msg, "99"));
    cr_assert_eq(dsv4_sampler_step(s), 0);
    float l[10] = {0};
    l[7] = NAN;
    cr_assert_eq(dsv4_sampler_sample(s, l, &e), -1);
    cr_assert_not_null(strstr(e.msg, "token 7"), "%s", e.msg);
    l[7] = INFINITY;
    cr_assert_eq(dsv4_sampler_sample(s, l, &e), -1);
    for (int i = 0; i < 10; i++) l[i] = -INFINITY;
    cr_assert_eq(dsv4_sampler_sample(s, l, &e), -1);
    cr_assert_not_null(strstr(e.msg, "-inf"), "%s", e.msg);
    dsv4_sampler_free(s);
    dsv4_sampler_free(NULL);
}

/* ---- greedy and seeded sampling ----------------------------------------------------------- */

Test(sample_greedy, picks_argmax_lowest_id_on_ties) {
    dsv4_sampling p;
    dsv4_sampling_defaults(&p);
    p.temperature = 0;
    p.top_k = 2; /* filters are ignored when greedy */
    p.top_p = 0.1f;
    const int V = 1000;
    dsv4_sampler *s = mk(&p, V);
    float *l = malloc(V * sizeof *l);
    srand(7);
    for (int trial = 0; trial < 50; trial++) {
        int best = 0;
        for (int i = 0; i < V; i++) {
            l[i] = (float)rand() / RAND_MAX * 20 - 10;
            if (l[i] > l[best]) best = i;
        }
        p.seed = (uint64_t)trial;
        cr_assert_eq(draw(s, l), best);
        accept(s, best);
    }
    for (int i = 0; i < V; i++) l[i] = (i % 3 == 0) ? -INFINITY : 1.0f;
    l[500] = 3;
    l[900] = 3;
    l[200] = 3;
    cr_assert_eq(draw(s, l), 200);
    for (int i = 0; i < V; i++) l[i] = -5;
    cr_assert_eq(draw(s, l), 0);
    free(l);
    dsv4_sampler_free(s);
}

static void run_sequence(uint64_t seed, int n, int32_t *out) {
    dsv4_sampling p;
    dsv4_sampling_defaults(&p);
    p.seed = seed;
    p.temperature = 0.9f;
    p.top_p = 0.95f;
    p.top_k = 40;
    p.frequency_penalty = 0.3f;
    const int V = 5000;
    dsv4_sampler *s = mk(&p, V);
    float *l = malloc(V * sizeof *l);
    for (int step = 0; step < n; step++) {
        for (int i = 0; i < V; i++) l[i] = (float)sin(i * 0.37 + step * 1.3) * 4;
        out[step] = draw(s, l);
        cr_assert_eq(draw(s, l), out[step], "sampling twice at one step must agree");
        accept(s, out[step]);
    }
    free(l);
    dsv4_sampler_free(s);
}

Test(sample_seeded, same_seed_same_tokens_different_seed_differs) {
    enum { N = 200 };
    int32_t a[N], b[N], c[N];
    run_sequence(1234, N, a);
    run_sequence(1234, N, b);
    run_sequence(1235, N, c);
    int diff = 0;
    for (int i = 0; i < N; i++) {
        cr_assert_eq(a[i], b[i], "step %d", i);
        diff += a[i] != c[i];
    }
    cr_assert_gt(diff, N / 4, "different seeds agree on %d of %d steps", N - diff, N);
}

Test(sample_seeded, draw_depends_only_on_seed_step_and_logits) {
    /* Two samplers with different histories (no penalties) at the same step give the same token. */
    dsv4_sampling p;
    dsv4_sampling_defaults(&p);
    p.seed = 99;
    const int V = 64;
    float l[64];
    for (int i = 0; i < V; i++) l[i] = (float)(i % 7) * 0.5f;
    for (int step = 0; step < 30; step++) {
        dsv4_sampler *x = mk(&p, V), *y = mk(&p, V);
        for (int j = 0; j < step; j++) {
            accept(x, j % V);
            accept(y, (j * 13 + 5) % V);
        }
        cr_assert_eq(dsv4_sampler_step(x), (uint64_t)step);
        int32_t tx = draw(x, l), ty = draw(y, l);
        cr_assert_eq(tx, ty, "step %d", step);
        /* and it is the documented inverse-CDF draw */
        double w[64], S = 0, c = 0, u = dsv4_rng_uniform(99, (uint64_t)step);
        for (int i = 0; i < V; i++) S += w[i] = exp((double)l[i] - 3.0);
        int want = -1;
        for (int i = 0; i < V && want < 0; i++)
            if ((c += w[i]) > u * S) want = i;
        cr_assert_eq(tx, want, "step %d", step);
        dsv4_sampler_free(x);
        dsv4_sampler_free(y);
    }
}

Test(sample_seeded, temperature_one_matches_softmax) {
    const float l[8] = {1.0f, 2.0f, 0.5f, -1.0f, 3.0f, 2.5f, 0.0f, 1.5f};
    const int N = 20000;
    int counts[8];
    double p[8];
    for (int t = 0; t < 3; t++) {
        float T = t == 0 ? 1.0f : t == 1 ? 0.5f : 2.0f;
        dsv4_sampling sp;
        dsv4_sampling_defaults(&sp);
        sp.temperature = T;
        sp.seed = 2024 + (uint64_t)t;
        dsv4_sampler *s = mk(&sp, 8);
        histogram(s, l, 8, N, counts);
        softmax(l, 8, T, p);
        /* 7 degrees of freedom: P(chi2 > 30) ~ 1e-4; deterministic for the fixed seed anyway */
        double x = chi_square(counts, p, 8, N);
        cr_assert_lt(x, 30.0, "T=%g chi-square %g", (double)T, x);
        dsv4_sampler_free(s);
    }
}

/* ---- filters ------------------------------------------------------------------------------ */

/* probabilities 0.5, 0.3, 0.15, 0.05 */
static void four(float *l) {
    l[0] = logf(0.5f);
    l[1] = logf(0.3f);
    l[2] = logf(0.15f);
    l[3] = logf(0.05f);
}

static void check_filter(dsv4_sampling sp, const float *l, int V, const double *p_expected) {
    const int N = 20000;
    int *counts = malloc(V * sizeof *counts);
    sp.seed = 777;
    dsv4_sampler *s = mk(&sp, V);
    histogram(s, l, V, N, counts);
    int dof = -1;
    for (int i = 0; i < V; i++) {
        if (p_expected[i] > 0) {
            dof++;
            cr_assert_gt(counts[i], 0, "token %d never drawn", i);
        }
    }
    double x = chi_square(counts, p_expected, V, N);
    cr_assert_lt(x, 20.0 + 4.0 * dof, "chi-square %g (dof %d)", x, dof);
    dsv4_sampler_free(s);
    free(counts);
}

Test(sample_filters, top_k) {
    float l[16];
    for (int i = 0; i < 16; i++) l[i] = (float)((i * 7) % 16) * 0.25f; /* distinct */
    dsv4_sampling sp;
    dsv4_sampling_defaults(&sp);
    sp.top_k = 3;
    double p[16] = {0}, S = 0;
    for (int i = 0; i < 16; i++)
        if ((i * 7) % 16 >= 13) S += p[i] = exp(l[i]);
    for (int i = 0; i < 16; i++) p[i] /= S;
    check_filter(sp, l, 16, p);
    /* ties at the k-th value are kept */
    float t[6] = {5, 1, 5, 0, 5, 2};
    double pt[6] = {1.0 / 3, 0, 1.0 / 3, 0, 1.0 / 3, 0};
    sp.top_k = 2;
    check_filter(sp, t, 6, pt);
    /* top_k >= vocab is off */
    sp.top_k = 6;
    double all[6];
    softmax(t, 6, 1, all);
    check_filter(sp, t, 6, all);
    sp.top_k = 1; /* top_k 1 = greedy-like */
    float g[5] = {0, 3, 1, 3.5f, 2};
    double pg[5] = {0, 0, 0, 1, 0};
    check_filter(sp, g, 5, pg);
}

Test(sample_filters, top_p) {
    float l[4];
    four(l);
    dsv4_sampling sp;
    dsv4_sampling_defaults(&sp);
    sp.top_p = 0.75f; /* 0.5 < 0.75 keeps token 1; 0.8 >= 0.75 drops token 2 */
    double p1[4] = {0.5 / 0.8, 0.3 / 0.8, 0, 0};
    check_filter(sp, l, 4, p1);
    sp.top_p = 0.81f;
    double p2[4] = {0.5 / 0.95, 0.3 / 0.95, 0.15 / 0.95, 0};
    check_filter(sp, l, 4, p2);
    sp.top_p = 0.45f;
    double p3[4] = {1, 0, 0, 0};
    check_filter(sp, l, 4, p3);
    /* order of the logits does not matter */
    float r[4] = {l[3], l[2], l[0], l[1]};
    sp.top_p = 0.75f;
    double p4[4] = {0, 0, 0.5 / 0.8, 0.3 / 0.8};
    check_filter(sp, r, 4, p4);
}

Test(sample_filters, min_p) {
    float l[4];
    four(l);
    dsv4_sampling sp;
    dsv4_sampling_defaults(&sp);
    sp.min_p = 0.2f; /* threshold 0.1 */
    double p1[4] = {0.5 / 0.95, 0.3 / 0.95, 0.15 / 0.95, 0};
    check_filter(sp, l, 4, p1);
    sp.min_p = 0.5f; /* threshold 0.25 */
    double p2[4] = {0.5 / 0.8, 0.3 / 0.8, 0, 0};
    check_filter(sp, l, 4, p2);
    sp.min_p = 1.0f;
    double p3[4] = {1, 0, 0, 0};
    check_filter(sp, l, 4, p3);
    /* min_p then top_p renormalizes over what min_p kept: {0.5, 0.3, 0.15}/0.95;
     * top_p 0.8: mass before token 2 is 0.8/0.95 = 0.842 >= 0.8 -> dropped */
    sp.min_p = 0.2f;
    sp.top_p = 0.8f;
    double p4[4] = {0.5 / 0.8, 0.3 / 0.8, 0, 0};
    check_filter(sp, l, 4, p4);
}

Test(sample_filters, masked_tokens_never_drawn) {
    float l[10];
    for (int i = 0; i < 10; i++) l[i] = (i % 2) ? -INFINITY : 0.0f;
    dsv4_sampling sp;
    dsv4_sampling_defaults(&sp);
    double p[10] = {0};
    for (int i = 0; i < 10; i += 2) p[i] = 0.2;
    check_filter(sp, l, 10, p);
    sp.top_p = 0.5f;
    double q[10] = {0};
    q[0] = q[2] = q[4] = 1.0 / 3; /* before token 4: 0.4 < 0.5; before 6: 0.6 */
    check_filter(sp, l, 10, q);
}

/* Reference implementation of the documented algorithm with a full sort. */
static const float *ref_logits;

static int cmp_desc(const void *a, const void *b) {
    const int *x = a, *y = b;
    float fx = ref_logits[*x], fy = ref_logits[*y];
    if (fx != fy) return fx > fy ? -1 : 1;
    return (*x > *y) - (*x < *y);
}

static int32_t reference_draw(const float *z, int V, const dsv4_sampling *p, uint64_t step) {
    int *idx = malloc(V * sizeof *idx);
    char *keep = calloc(V, 1);
    ref_logits = z;
    for (int i = 0; i < V; i++) idx[i] = i;
    qsort(idx, V, sizeof *idx, cmp_desc);
    double m = z[idx[0]];
    int n = 0;
    for (int r = 0; r < V; r++) { /* min_p keeps a prefix of the sorted order */
        double w = exp((double)z[idx[r]] - m);
        if (z[idx[r]] == -INFINITY || (p->min_p > 0 && w < p->min_p)) break;
        n = r + 1;
    }
    if (p->top_k > 0 && p->top_k < n) {
        float t = z[idx[p->top_k - 1]];
        int k = p->top_k;
        while (k < n && z[idx[k]] == t) k++;
        n = k;
    }
    if (p->top_p < 1) {
        double W = 0, c = 0;
        for (int r = 0; r < n; r++) W += exp((double)z[idx[r]] - m);
        int k = 0;
        while (k < n && c < p->top_p * W) c += exp((double)z[idx[k++]] - m);
        n = k;
    }
    for (int r = 0; r < n; r++) keep[idx[r]] = 1;
    double S = 0, c = 0, u = dsv4_rng_uniform(p->seed, step);
    for (int i = 0; i < V; i++)
        if (keep[i]) S += exp((double)z[i] - m);
    int32_t tok = -1;
    for (int i = 0; i < V && tok < 0; i++)
        if (keep[i] && (c += exp((double)z[i] - m)) > u * S) tok = i;
    free(idx);
    free(keep);
    return tok;
}

Test(sample_filters, full_vocab_matches_reference, .timeout = 120) {
    const int V = 129280;
    float *l = malloc(V * sizeof *l);
    struct {
        int k;
        float p, minp, T;
    } cfg[] = {
        {0, 1, 0, 1},       {50, 1, 0, 0.7f},    {0, 0.9f, 0, 1},      {0, 0.95f, 0, 2.0f},
        {0, 1, 0.05f, 1},   {40, 0.9f, 0, 0.8f}, {0, 0.9f, 0.02f, 1},  {1000, 0.99f, 0.001f, 1.3f},
        {20000, 1, 0, 5.f}, {0, 0.999f, 0, 10.f},
    };
    uint64_t rs = 88172645463325252ull;
    for (size_t c = 0; c < sizeof cfg / sizeof cfg[0]; c++) {
        dsv4_sampling p;
        dsv4_sampling_defaults(&p);
        p.top_k = cfg[c].k;
        p.top_p = cfg[c].p;
        p.min_p = cfg[c].minp;
        p.temperature = cfg[c].T;
        p.seed = 1000 + c;
        dsv4_sampler *s = mk(&p, V);
        double secs = 0;
        for (int step = 0; step < 6; step++) {
            for (int i = 0; i < V; i++) { /* peaked: a few large logits on a noisy floor */
                rs ^= rs << 13, rs ^= rs >> 7, rs ^= rs << 17;
                double g = (double)(rs >> 11) / 9007199254740992.0;
                l[i] = (float)(g * 6 - 3 + ((rs & 0xfff) == 0 ? 8 : 0));
                if (step % 3 == 1) l[i] = roundf(l[i] * 4) / 4; /* many ties */
                if (step % 3 == 2 && (rs & 7) == 0) l[i] = -INFINITY; /* masked */
            }
            l[(step * 7919) % V] = (float)(step % 3) * 2; /* some ties and repeats */
            struct timespec a, b;
            clock_gettime(CLOCK_MONOTONIC, &a);
            int32_t got = draw(s, l);
            clock_gettime(CLOCK_MONOTONIC, &b);
            secs += (b.tv_sec - a.tv_sec) + (b.tv_nsec - a.tv_nsec) * 1e-9;
            const float *z = dsv4_sampler_processed_logits(s);
            for (int i = 0; i < V; i += 9973) cr_assert_eq(z[i], l[i] / p.temperature);
            int32_t want = reference_draw(z, V, &p, (uint64_t)step);
            cr_assert_eq(got, want, "config %zu step %d: %d != reference %d", c, step, got, want);
            accept(s, got);
        }
        cr_log_info("config %zu (k=%d p=%g min_p=%g T=%g): %.2f ms/sample", c, cfg[c].k,
                    (double)cfg[c].p, (double)cfg[c].minp, (double)cfg[c].T, secs / 6 * 1e3);
        dsv4_sampler_free(s);
    }
    free(l);
}

Test(sample_filters, all_equal_logits) {
    /* one histogram bucket holds everything; ties are cut by id */
    const int V = 129280;
    float *l = calloc(V, sizeof *l);
    dsv4_sampling p;
    dsv4_sampling_defaults(&p);
    p.top_p = 0.5f; /* keeps exactly the ids < V / 2 */
    p.seed = 5;
    dsv4_sampler *s = mk(&p, V);
    int lo = 0, hi = 0;
    for (int i = 0; i < 400; i++) {
        int32_t t = draw(s, l);
        cr_assert_lt(t, V / 2);
        lo += t < V / 4;
        hi += t >= V / 4;
        accept(s, t);
    }
    cr_assert(lo > 150 && hi > 150, "%d %d", lo, hi);
    dsv4_sampler_free(s);
    p.top_p = 1;
    p.top_k = 10; /* ties with the 10th value: everything stays */
    s = mk(&p, V);
    int high = 0;
    for (int i = 0; i < 100; i++) {
        int32_t t = draw(s, l);
        high += t >= 10;
        accept(s, t);
    }
    cr_assert_gt(high, 90);
    dsv4_sampler_free(s);
    free(l);
}

/* ---- penalties ---------------------------------------------------------------------------- */

Test(sample_penalties, change_logits_as_specified) {
    const float l[8] = {1.0f, 2.0f, -1.5f, 0.5f, 3.0f, -0.25f, 0.0f, 4.0f};
    int32_t prompt[] = {1, 2, 2};
    for (int greedy = 0; greedy < 2; greedy++) {
        dsv4_sampling p;
        dsv4_sampling_defaults(&p);
        p.repetition_penalty = 2.0f;
        p.presence_penalty = 0.5f;
        p.frequency_penalty = 0.25f;
        p.temperature = greedy ? 0.0f : 2.0f;
        dsv4_sampler *s = mk(&p, 8);
        dsv4_err e = {{0}};
        cr_assert_null(dsv4_sampler_processed_logits(s));
        cr_assert_eq(dsv4_sampler_add_prompt(s, prompt, 3, &e), 0, "%s", e.msg);
        accept(s, 2);
        accept(s, 3);
        accept(s, 3);
        accept(s, 3);
        accept(s, 7);
        cr_assert_eq(dsv4_sampler_count(s, 3), 3);
        cr_assert_eq(dsv4_sampler_count(s, 1), 0);
        cr_assert_eq(dsv4_sampler_count(s, 4), 0);
        cr_assert_eq(dsv4_sampler_step(s), 5);
        draw(s, l);
        const float *z = dsv4_sampler_processed_logits(s);
        cr_assert_not_null(z);
        float want[8];
        memcpy(want, l, sizeof want);
        want[1] = 2.0f / 2;                        /* prompt only: repetition */
        want[2] = -1.5f * 2 - 0.25f * 1 - 0.5f;    /* prompt + once */
        want[3] = 0.5f / 2 - 0.25f * 3 - 0.5f;     /* three times */
        want[7] = 4.0f / 2 - 0.25f - 0.5f;         /* once */
        for (int i = 0; i < 8; i++) {
            float w = greedy ? want[i] : want[i] / 2.0f;
            cr_assert_float_eq(z[i], w, 1e-6, "token %d: %g != %g", i, (double)z[i], (double)w);
        }
        dsv4_sampler_free(s);
    }
}

Test(sample_penalties, steer_greedy_choice) {
    float l[4] = {0.0f, 1.0f, 0.9f, -1.0f};
    dsv4_sampling p;
    dsv4_sampling_defaults(&p);
    p.temperature = 0;
    p.presence_penalty = 0.2f;
    dsv4_sampler *s = mk(&p, 4);
    cr_assert_eq(draw(s, l), 1);
    accept(s, 1);
    cr_assert_eq(draw(s, l), 2); /* 1.0 - 0.2 < 0.9 */
    accept(s, 2);
    cr_assert_eq(draw(s, l), 1); /* 0.8 vs 0.7 */
    dsv4_sampler_free(s);
    /* negative presence penalty encourages repeats */
    p.presence_penalty = -0.5f;
    s = mk(&p, 4);
    accept(s, 2);
    cr_assert_eq(draw(s, l), 2);
    dsv4_sampler_free(s);
    /* repetition penalty on a negative logit makes it more negative */
    float n[3] = {-1.0f, -1.1f, -5.0f};
    p.presence_penalty = 0;
    p.repetition_penalty = 1.2f;
    s = mk(&p, 3);
    int32_t pr = 0;
    dsv4_err e = {{0}};
    cr_assert_eq(dsv4_sampler_add_prompt(s, &pr, 1, &e), 0);
    cr_assert_eq(draw(s, n), 1); /* -1.2 < -1.1 */
    dsv4_sampler_free(s);
}

Test(sample_penalties, many_distinct_tokens) {
    /* exercises the count table growth */
    dsv4_sampling p;
    dsv4_sampling_defaults(&p);
    p.frequency_penalty = 1.0f;
    p.temperature = 0;
    const int V = 129280;
    dsv4_sampler *s = mk(&p, V);
    for (int i = 0; i < 50000; i++) accept(s, (i * 7) % V);
    for (int i = 0; i < 50000; i++) accept(s, (i * 7) % V);
    cr_assert_eq(dsv4_sampler_count(s, 7), 2);
    cr_assert_eq(dsv4_sampler_count(s, 8), 0);
    float *l = calloc(V, sizeof *l);
    cr_assert_eq(draw(s, l), 1); /* 0 was generated, 1 was not */
    const float *z = dsv4_sampler_processed_logits(s);
    cr_assert_eq(z[0], -2.0f);
    cr_assert_eq(z[14], -2.0f);
    cr_assert_eq(z[1], 0.0f);
    free(l);
    dsv4_sampler_free(s);
}

Test(sample_logit_bias, added_before_the_penalties) {
    const float l[6] = {1.0f, 2.0f, -1.5f, 0.5f, -INFINITY, 0.0f};
    const int32_t bt[4] = {0, 2, 4, 2};
    const float bv[4] = {3.0f, 1.0f, 100.0f, 0.5f}; /* token 2 twice: both added, in order */
    dsv4_sampling p;
    dsv4_sampling_defaults(&p);
    p.temperature = 0;
    p.repetition_penalty = 2.0f;
    p.bias_tok = bt, p.bias_val = bv, p.n_bias = 4;
    dsv4_sampler *s = mk(&p, 6);
    int32_t pr = 2;
    dsv4_err e = {{0}};
    cr_assert_eq(dsv4_sampler_add_prompt(s, &pr, 1, &e), 0, "%s", e.msg);
    cr_assert_eq(draw(s, l), 0); /* 1 + 3 = 4 beats 2 */
    const float *z = dsv4_sampler_processed_logits(s);
    cr_assert_eq(z[0], 4.0f);
    cr_assert_eq(z[2], (-1.5f + 1.0f + 0.5f) * 2.0f); /* bias, then the repetition penalty of a prompt token */
    cr_assert(z[4] == -INFINITY, "a masked token stays masked");
    cr_assert_eq(z[1], 2.0f);
    dsv4_sampler_free(s);
    /* -100 keeps a token out of greedy and practically out of a draw */
    const int32_t ban = 1;
    const float m100 = -100.0f;
    dsv4_sampling q;
    dsv4_sampling_defaults(&q);
    q.bias_tok = &ban, q.bias_val = &m100, q.n_bias = 1;
    q.seed = 9;
    s = mk(&q, 6);
    for (int i = 0; i < 200; i++) {
        cr_assert_neq(draw(s, l), 1);
        accept(s, 0);
    }
    dsv4_sampler_free(s);
    /* bad entries */
    float big = 100.5f, nan = NAN;
    int32_t neg = -1, out = 6;
    dsv4_sampling b;
    dsv4_sampling_defaults(&b);
    b.n_bias = 1;
    b.bias_tok = &ban, b.bias_val = &big;
    cr_assert_neq(dsv4_sampling_validate(&b, &e), 0);
    cr_assert(strstr(e.msg, "logit_bias"), "%s", e.msg);
    b.bias_val = &nan;
    cr_assert_neq(dsv4_sampling_validate(&b, &e), 0);
    b.bias_val = &m100, b.bias_tok = &neg;
    cr_assert_neq(dsv4_sampling_validate(&b, &e), 0);
    b.bias_tok = &out;
    cr_assert_eq(dsv4_sampling_validate(&b, &e), 0, "%s", e.msg);
    dsv4_sampler *x = NULL;
    cr_assert_neq(dsv4_sampler_init(&x, &b, 6, &e), 0);
    cr_assert(strstr(e.msg, "outside the vocabulary"), "%s", e.msg);
    cr_assert_null(x);
    b.bias_tok = NULL;
    cr_assert_neq(dsv4_sampling_validate(&b, &e), 0);
}

/* ---- log-probabilities -------------------------------------------------------------------- */

Test(sample_logprobs, log_softmax_and_top_n) {
    const float l[6] = {1.0f, 3.0f, -INFINITY, 3.0f, 0.5f, 2.0f};
    double S = 0;
    for (int i = 0; i < 6; i++) S += exp(l[i]);
    dsv4_logprob top[8];
    memset(top, 0, sizeof top);
    float lp = 0;
    dsv4_err e = {{0}};
    cr_assert_eq(dsv4_logprobs(l, 6, 4, 4, &lp, top, &e), 4, "%s", e.msg);
    cr_assert_float_eq(lp, 0.5 - log(S), 1e-6);
    int order[4] = {1, 3, 5, 0};
    for (int i = 0; i < 4; i++) {
        cr_assert_eq(top[i].token, order[i], "rank %d", i);
        cr_assert_float_eq(top[i].logprob, l[order[i]] - log(S), 1e-6);
    }
    cr_assert_eq(dsv4_logprobs(l, 6, 2, 0, &lp, NULL, &e), 0);
    cr_assert(isinf(lp) && lp < 0);
    cr_assert_eq(dsv4_logprobs(l, 6, 1, 100, NULL, top, &e), 6); /* clamped */
    cr_assert_eq(top[5].token, 2);
    cr_assert_eq(dsv4_logprobs(l, 6, 6, 1, &lp, top, &e), -1);
    float bad[2] = {0, NAN};
    cr_assert_eq(dsv4_logprobs(bad, 2, 0, 1, &lp, top, &e), -1);
    cr_assert_not_null(strstr(e.msg, "token 1"));
}

Test(sample_logprobs, large_top_n_agrees_with_small) {
    const int V = 129280;
    float *l = malloc(V * sizeof *l);
    for (int i = 0; i < V; i++) l[i] = (float)((i * 2654435761u) % 1000) * 0.01f;
    dsv4_logprob a[20], *b = malloc(500 * sizeof *b);
    dsv4_err e = {{0}};
    float la, lb;
    cr_assert_eq(dsv4_logprobs(l, V, 5, 20, &la, a, &e), 20);
    cr_assert_eq(dsv4_logprobs(l, V, 5, 500, &lb, b, &e), 500);
    cr_assert_eq(la, lb);
    for (int i = 0; i < 20; i++) {
        cr_assert_eq(a[i].token, b[i].token, "rank %d", i);
        cr_assert_eq(a[i].logprob, b[i].logprob);
    }
    for (int i = 1; i < 500; i++) {
        cr_assert(b[i].logprob < b[i - 1].logprob ||
                  (b[i].logprob == b[i - 1].logprob && b[i].token > b[i - 1].token));
    }
    double sum = 0;
    for (int i = 0; i < V; i++) sum += exp(l[i]);
    cr_assert_float_eq(a[0].logprob, 9.99f - log(sum), 1e-5);
    free(b);
    free(l);
}

Test(sample_logprobs, processed_logits_feed_logprobs) {
    float l[3] = {0.0f, 1.0f, 2.0f};
    dsv4_sampling p;
    dsv4_sampling_defaults(&p);
    p.temperature = 0.5f;
    dsv4_sampler *s = mk(&p, 3);
    int32_t t = draw(s, l);
    dsv4_logprob top[1];
    float lp;
    dsv4_err e = {{0}};
    cr_assert_eq(dsv4_logprobs(dsv4_sampler_processed_logits(s), 3, t, 1, &lp, top, &e), 1);
    double S = exp(0) + exp(2) + exp(4);
    cr_assert_float_eq(lp, 2.0 * l[t] - log(S), 1e-6);
    cr_assert_eq(top[0].token, 2);
    dsv4_sampler_free(s);
}

/* ---- stop strings ------------------------------------------------------------------------- */

Test(sample_stop, whole_text) {
    const char *stops[] = {"</s>", "\n\nUser:", "END"};
    dsv4_stop_result r;
    const char *t = "hello world";
    dsv4_stop_scan(t, strlen(t), 0, stops, 3, &r);
    cr_assert_eq(r.stop, -1);
    cr_assert_eq(r.safe, strlen(t));
    cr_assert_eq(r.hold, 0);
    t = "hello </s> world END";
    dsv4_stop_scan(t, strlen(t), 0, stops, 3, &r);
    cr_assert_eq(r.stop, 0);
    cr_assert_eq(r.cut, 6);
    t = "abc\n\nUs";
    dsv4_stop_scan(t, strlen(t), 0, stops, 3, &r);
    cr_assert_eq(r.stop, -1);
    cr_assert_eq(r.hold, 4);
    cr_assert_eq(r.safe, 3);
    t = "abc\n\nUser: hi";
    dsv4_stop_scan(t, strlen(t), 0, stops, 3, &r);
    cr_assert_eq(r.stop, 1);
    cr_assert_eq(r.cut, 3);
    /* a full stop string at the very start, and an "almost" prefix that is not one */
    dsv4_stop_scan("END", 3, 0, stops, 3, &r);
    cr_assert_eq(r.stop, 2);
    cr_assert_eq(r.cut, 0);
    dsv4_stop_scan("EN!", 3, 0, stops, 3, &r);
    cr_assert_eq(r.stop, -1);
    cr_assert_eq(r.hold, 0);
    /* earliest start wins regardless of the order of the stop strings */
    const char *two[] = {"world", "lo"};
    dsv4_stop_scan("hello world", 11, 0, two, 2, &r);
    cr_assert_eq(r.stop, 1);
    cr_assert_eq(r.cut, 3);
    /* same start: lowest index */
    const char *same[] = {"abc", "ab"};
    dsv4_stop_scan("xxabcd", 6, 0, same, 2, &r);
    cr_assert_eq(r.stop, 0);
    cr_assert_eq(r.cut, 2);
    /* no stop strings */
    dsv4_stop_scan("abc", 3, 0, NULL, 0, &r);
    cr_assert_eq(r.stop, -1);
    cr_assert_eq(r.safe, 3);
}

Test(sample_stop, partial_prefix_across_chunks) {
    const char *stops[] = {"</s>"};
    char buf[64] = "";
    size_t prev = 0, emitted = 0;
    const char *chunks[] = {"Hi <", "/", "s", "x and <", "/s", ">tail"};
    size_t want_safe[] = {3, 3, 3, 12, 12};
    char out[64] = "";
    dsv4_stop_result r;
    for (int c = 0; c < 6; c++) {
        strcat(buf, chunks[c]);
        size_t len = strlen(buf);
        dsv4_stop_scan(buf, len, prev, stops, 1, &r);
        prev = len;
        if (r.stop >= 0) {
            cr_assert_eq(c, 5);
            cr_assert_geq(r.cut, emitted);
            strncat(out, buf + emitted, r.cut - emitted);
            break;
        }
        cr_assert_eq(r.safe, want_safe[c], "chunk %d: safe %zu", c, r.safe);
        cr_assert_geq(r.safe, emitted);
        strncat(out, buf + emitted, r.safe - emitted);
        emitted = r.safe;
    }
    cr_assert_eq(r.stop, 0);
    cr_assert_str_eq(out, "Hi </sx and ");
}

/* Random texts streamed in random chunks: what is emitted is always a prefix of the text cut at
 * the first stop string, and at the end exactly that. */
Test(sample_stop, random_streams_match_reference) {
    const char *stops[] = {"abab", "ba?", "cc", "abca"};
    const size_t ns = 4;
    uint32_t rs = 12345;
    for (int trial = 0; trial < 3000; trial++) {
        char text[80];
        size_t n = 0;
        int len = 5 + trial % 60;
        for (int i = 0; i < len; i++) {
            rs = rs * 1664525u + 1013904223u;
            text[n++] = "abc?"[(rs >> 16) % 4];
        }
        text[n] = 0;
        /* reference: no stop string is a substring of another, so earliest start = earliest end */
        size_t ref = n;
        for (size_t k = 0; k < ns; k++) {
            char *f = strstr(text, stops[k]);
            if (f && (size_t)(f - text) < ref) ref = (size_t)(f - text);
        }
        size_t have = 0, prev = 0, emitted = 0;
        int stopped = 0;
        while (have < n && !stopped) {
            rs = rs * 1664525u + 1013904223u;
            have += 1 + (rs >> 16) % 6;
            if (have > n) have = n;
            dsv4_stop_result r;
            dsv4_stop_scan(text, have, prev, stops, ns, &r);
            prev = have;
            size_t upto = r.stop >= 0 ? r.cut : r.safe;
            cr_assert_geq(upto, emitted, "trial %d: emitted text taken back", trial);
            cr_assert_leq(upto, ref, "trial %d: emitted past the stop string (%zu > %zu) in '%s'",
                          trial, upto, ref, text);
            emitted = upto;
            stopped = r.stop >= 0;
        }
        if (!stopped) { /* the stream ended: the held-back tail is flushed */
            cr_assert_eq(ref, n, "trial %d: missed a stop string in '%s'", trial, text);
            emitted = n;
        }
        cr_assert_eq(emitted, ref, "trial %d '%s'", trial, text);
    }
}
