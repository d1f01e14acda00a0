/* kt_rows.c - test_kernels: RMSNorm, RoPE, the FP8 / FP4 quants, and the fused row kernels (norm_rope_q8, rope_hq4)
 * bitwise against the separate launches. */
#include "kt.h"

/* ---- norm, rope, quant ---- */

void test_rmsnorm(int rows, int n, int ld, int weighted) {
    float *x = randn((size_t)rows * ld, 2.0f), *w = weighted ? randn(n, 1.0f) : NULL;
    float *ref = malloc(sizeof(float) * (size_t)rows * ld), *got = malloc(sizeof(float) * (size_t)rows * ld);
    memcpy(ref, x, sizeof(float) * (size_t)rows * ld);
    for (int r = 0; r < rows; r++) dsv4_cpu_rmsnorm(ref + (size_t)r * ld, n, w, 1e-6f);
    float *dx = dup_to_dev(x, sizeof(float) * (size_t)rows * ld), *dw = w ? dup_to_dev(w, sizeof(float) * n) : NULL;
    op_ok(dsv4_cuda_rmsnorm(dx, rows, n, ld, dw, 1e-6f, NULL), "rmsnorm");
    sync_ok();
    from_dev(got, dx, sizeof(float) * (size_t)rows * ld);
    char name[128];
    snprintf(name, sizeof name, "rmsnorm rows=%d n=%d ld=%d %s", rows, n, ld, weighted ? "weighted" : "unweighted");
    check(name, got, ref, (size_t)rows * ld, 1e-6, 2e-6);
    dsv4_cuda_free(dx), dsv4_cuda_free(dw), free(x), free(w), free(ref), free(got);
}

void test_rope(int T, int H, int n, int npairs, int inverse) {
    float *x = randn((size_t)T * H * n, 1.0f), *freq = malloc(sizeof(float) * npairs);
    int *pos = malloc(sizeof(int) * T);
    for (int i = 0; i < npairs; i++) freq[i] = powf(10000.0f, -2.0f * i / (2.0f * npairs));
    for (int t = 0; t < T; t++) pos[t] = t == 0 ? 0 : (int)(rnd_u32() % 1000000);
    float *ref = malloc(sizeof(float) * (size_t)T * H * n), *got = malloc(sizeof(float) * (size_t)T * H * n);
    memcpy(ref, x, sizeof(float) * (size_t)T * H * n);
    for (int t = 0; t < T; t++)
        for (int h = 0; h < H; h++) dsv4_cpu_rope(ref + ((size_t)t * H + h) * n, n, npairs, freq, pos[t], inverse);
    float *dx = dup_to_dev(x, sizeof(float) * (size_t)T * H * n), *df = dup_to_dev(freq, sizeof(float) * npairs);
    int *dp = dup_to_dev(pos, sizeof(int) * T);
    op_ok(dsv4_cuda_rope(dx, T, H, n, npairs, df, dp, inverse, NULL), "rope");
    sync_ok();
    from_dev(got, dx, sizeof(float) * (size_t)T * H * n);
    char name[128];
    snprintf(name, sizeof name, "rope%s T=%d H=%d n=%d pairs=%d", inverse ? " inverse" : "", T, H, n, npairs);
    check(name, got, ref, (size_t)T * H * n, 1e-5, 1e-5); /* cosf/sinf: a few ulp apart */
    dsv4_cuda_free(dx), dsv4_cuda_free(df), dsv4_cuda_free(dp), free(x), free(freq), free(pos), free(ref), free(got);
}


/* A fused row-preparation check: x [T, H, n] random on the device twice (da for the separate launches, db for the fused
 * one), optional norm weights, RoPE frequencies and positions; prep_done compares the two results bitwise */
typedef struct {
    size_t N;
    float *x, *w, *freq, *da, *db, *dw, *df;
    int *pos, *dp;
} prep_case;

static prep_case prep_new(int T, int H, int n, int npairs, int weighted) {
    prep_case c;
    c.N = (size_t)T * H * n;
    c.x = randn(c.N, 2.0f), c.w = weighted ? randn(n, 1.0f) : NULL, c.freq = malloc(sizeof(float) * (npairs ? npairs : 1));
    c.pos = malloc(sizeof(int) * T);
    for (int i = 0; i < npairs; i++) c.freq[i] = powf(10000.0f, -2.0f * i / (2.0f * npairs));
    for (int t = 0; t < T; t++) c.pos[t] = t == 0 ? 0 : (int)(rnd_u32() % 1000000);
    c.da = dup_to_dev(c.x, sizeof(float) * c.N), c.db = dup_to_dev(c.x, sizeof(float) * c.N);
    c.dw = c.w ? dup_to_dev(c.w, sizeof(float) * n) : NULL;
    c.df = dup_to_dev(c.freq, sizeof(float) * (npairs ? npairs : 1));
    c.dp = dup_to_dev(c.pos, sizeof(int) * T);
    return c;
}

static void prep_done(prep_case *c, const char *name) {
    float *ref = malloc(sizeof(float) * c->N), *got = malloc(sizeof(float) * c->N);
    sync_ok();
    from_dev(ref, c->da, sizeof(float) * c->N), from_dev(got, c->db, sizeof(float) * c->N);
    check_same(name, got, ref, c->N);
    dsv4_cuda_free(c->da), dsv4_cuda_free(c->db), dsv4_cuda_free(c->dw), dsv4_cuda_free(c->df), dsv4_cuda_free(c->dp);
    free(c->x), free(c->w), free(c->freq), free(c->pos), free(ref), free(got);
}

/* the fused [norm] + rope + Hadamard + FP4 quant == the four launches one after the other (bitwise) */
void test_rope_hq4(int T, int H, int n, int npairs, int norm, int weighted) {
    prep_case c = prep_new(T, H, n, npairs, weighted);
    if (norm) op_ok(dsv4_cuda_rmsnorm(c.da, T * H, n, n, c.dw, 1e-6f, NULL), "rmsnorm");
    op_ok(dsv4_cuda_rope(c.da, T, H, n, npairs, c.df, c.dp, 0, NULL), "rope");
    op_ok(dsv4_cuda_hadamard(c.da, T * H, n, n, NULL), "hadamard");
    op_ok(dsv4_cuda_act_quant_fp4(c.da, T * H, n, n, 32, NULL), "act_quant_fp4");
    op_ok(dsv4_cuda_rope_hq4(c.db, T, H, n, norm, c.dw, 1e-6f, npairs, c.df, c.dp, NULL), "rope_hq4");
    char name[128];
    snprintf(name, sizeof name, "rope_hq4 T=%d H=%d n=%d pairs=%d %s", T, H, n, npairs, norm ? (weighted ? "norm w" : "norm") : "-");
    prep_done(&c, name);
}

/* the fused norm + rope + FP8 quant == rmsnorm, rope, act_quant_fp8 launched one after the other (bitwise), with one
 * row a block and with two (dsv4_cuda_row_prep2; rows of <= 128 quads) */
void test_norm_rope_q8(int T, int H, int n, int npairs, int weighted, int qn, int qb) {
    prep_case c = prep_new(T, H, n, npairs, weighted);
    float *d1 = dup_to_dev(c.x, sizeof(float) * c.N);
    op_ok(dsv4_cuda_rmsnorm(c.da, T * H, n, n, c.dw, 1e-6f, NULL), "rmsnorm");
    op_ok(dsv4_cuda_rope(c.da, T, H, n, npairs, c.df, c.dp, 0, NULL), "rope");
    if (qb > 0) op_ok(dsv4_cuda_act_quant_fp8(c.da, T * H, qn, n, qb, NULL), "act_quant_fp8");
    dsv4_cuda_row_prep2(1);
    op_ok(dsv4_cuda_norm_rope_q8(c.db, T, H, n, c.dw, 1e-6f, npairs, c.df, c.dp, qn, qb, NULL), "norm_rope_q8");
    dsv4_cuda_row_prep2(0);
    op_ok(dsv4_cuda_norm_rope_q8(d1, T, H, n, c.dw, 1e-6f, npairs, c.df, c.dp, qn, qb, NULL), "norm_rope_q8 (one row a block)");
    dsv4_cuda_row_prep2(-1);
    char name[128];
    snprintf(name, sizeof name, "norm_rope_q8 T=%d H=%d n=%d pairs=%d %s qn=%d qb=%d one row a block", T, H, n, npairs,
             weighted ? "w" : "-", qn, qb);
    float *ref = malloc(sizeof(float) * c.N), *got = malloc(sizeof(float) * c.N);
    sync_ok();
    from_dev(ref, c.da, sizeof(float) * c.N), from_dev(got, d1, sizeof(float) * c.N);
    check_same(name, got, ref, c.N);
    free(ref), free(got), dsv4_cuda_free(d1);
    snprintf(name, sizeof name, "norm_rope_q8 T=%d H=%d n=%d pairs=%d %s qn=%d qb=%d%s", T, H, n, npairs, weighted ? "w" : "-",
             qn, qb, n <= 512 && n % 4 == 0 ? " two rows a block" : "");
    prep_done(&c, name);
}

/* the f16 form (dsv4_cuda_norm_rope_h16: the prefill attention's q) == rmsnorm and rope, then each value rounded to f16
 * (here) into the first half of its row's bytes (bitwise), with one row a block and with two; the second half as the
 * kernel found it */
void test_norm_rope_h16(int T, int H, int n, int npairs, int weighted) {
    prep_case c = prep_new(T, H, n, npairs, weighted);
    float *d1 = dup_to_dev(c.x, sizeof(float) * c.N);
    op_ok(dsv4_cuda_rmsnorm(c.da, T * H, n, n, c.dw, 1e-6f, NULL), "rmsnorm");
    op_ok(dsv4_cuda_rope(c.da, T, H, n, npairs, c.df, c.dp, 0, NULL), "rope");
    float *ref = malloc(sizeof(float) * c.N), *got = malloc(sizeof(float) * c.N);
    sync_ok();
    from_dev(ref, c.da, sizeof(float) * c.N);
    float *d2 = dup_to_dev(c.x, sizeof(float) * c.N);
    for (int mode = 0; mode < 3; mode++) { /* a warp a row, two rows a block, one row a block */
        float *d = mode == 2 ? d2 : mode ? d1 : c.db;
        dsv4_cuda_row_prep2(mode != 2);
        dsv4_cuda_row_h16_warp(mode == 0);
        op_ok(!dsv4_cuda_norm_rope_h16_fits(d, n, c.dw) || dsv4_cuda_norm_rope_h16(d, T, H, n, c.dw, 1e-6f, npairs, c.df, c.dp, NULL),
              "norm_rope_h16");
        sync_ok();
        from_dev(got, d, sizeof(float) * c.N);
        long nd = 0;
        for (size_t r = 0; r < c.N / n; r++) {
            const uint16_t *h = (const uint16_t *)(got + r * n);
            for (int i = 0; i < n; i++) nd += h[i] != dsv4_f32_to_f16(ref[r * n + i]);
            nd += memcmp(got + r * n + n / 2, c.x + r * n + n / 2, sizeof(float) * (n / 2)) != 0;
        }
        g_checks++, g_fail += nd != 0;
        printf("%-4s norm_rope_h16 T=%d H=%d n=%d pairs=%d %s%s: %ld of %zu values differ from rmsnorm + rope in f16%s\n",
               nd ? "FAIL" : "ok", T, H, n, npairs, weighted ? "w" : "-",
               n / 4 > 128 ? (mode ? " (quads of a long row a thread)" : " (quads of a long row a thread, again)")
               : mode == 2 ? " one row a block" : mode ? " two rows a block" : " a warp a row", nd, c.N, nd ? " <<<" : "");
    }
    dsv4_cuda_row_prep2(-1);
    dsv4_cuda_row_h16_warp(-1);
    free(ref), free(got), dsv4_cuda_free(d1), dsv4_cuda_free(d2);
    dsv4_cuda_free(c.da), dsv4_cuda_free(c.db), dsv4_cuda_free(c.dw), dsv4_cuda_free(c.df), dsv4_cuda_free(c.dp);
    free(c.x), free(c.w), free(c.freq), free(c.pos);
}

/* kind 0: fp8, 1: fp4, 2: hadamard, 3: hadamard then fp4 (the indexer's rotation) */
void test_quant(int kind, int rows, int n, int ld, int block) {
    float *x = rand_wide((size_t)rows * ld);
    float *ref = malloc(sizeof(float) * (size_t)rows * ld), *got = malloc(sizeof(float) * (size_t)rows * ld);
    memcpy(ref, x, sizeof(float) * (size_t)rows * ld);
    for (int r = 0; r < rows; r++) {
        float *p = ref + (size_t)r * ld;
        if (kind == 0) dsv4_act_quant_fp8(p, (size_t)n, (size_t)block);
        if (kind == 1) dsv4_act_quant_fp4(p, (size_t)n, (size_t)block);
        if (kind >= 2) dsv4_hadamard(p, (size_t)n);
        if (kind == 3) dsv4_act_quant_fp4(p, (size_t)n, (size_t)block);
    }
    float *dx = dup_to_dev(x, sizeof(float) * (size_t)rows * ld);
    if (kind == 0) op_ok(dsv4_cuda_act_quant_fp8(dx, rows, n, ld, block, NULL), "act_quant_fp8");
    if (kind == 1) op_ok(dsv4_cuda_act_quant_fp4(dx, rows, n, ld, block, NULL), "act_quant_fp4");
    if (kind >= 2) op_ok(dsv4_cuda_hadamard(dx, rows, n, ld, NULL), "hadamard");
    if (kind == 3) op_ok(dsv4_cuda_act_quant_fp4(dx, rows, n, ld, block, NULL), "act_quant_fp4");
    sync_ok();
    from_dev(got, dx, sizeof(float) * (size_t)rows * ld);
    static const char *kn[] = {"act_quant_fp8", "act_quant_fp4", "hadamard", "hadamard+fp4"};
    char name[128];
    snprintf(name, sizeof name, "%s rows=%d n=%d ld=%d block=%d (exact)", kn[kind], rows, n, ld, block);
    check(name, got, ref, (size_t)rows * ld, 0, 0);
    dsv4_cuda_free(dx), free(x), free(ref), free(got);
}
