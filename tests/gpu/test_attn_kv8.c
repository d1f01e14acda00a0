/* test_attn_kv8.c - the KV cache in its stored format (src/cuda/kv_cache.h, attn_kv8.cu) on the GPU:
 *   1. pack -> unpack returns FP8-simulated rows (rope dims in bf16) bit for bit;
 *   2. dsv4_cuda_attn_kv8 against dsv4_cpu_sparse_attn on the unpacked rows (random queries, several
 *      sequences' caches, -1 padding, a prefill chunk's own fp32 rows, lists of 1 .. 5000 entries, a
 *      query with no entry), |got - ref| <= 1e-5 rms(ref) + 1e-4 |ref|;
 *   3. the same query alone and inside a batch: bitwise equal (batch invariance), and a second run
 *      bitwise equal to the first;
 *   4. indexer scores over keys packed in their FP4 format bitwise equal to the scores over the fp32 keys.
 * Needs a GPU:  build-cuda/tests/gpu/test_attn_kv8      (scripts/gpu_test.sh runs it) */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../src/cpu/ops.h"
#include "../../src/cuda/cuda_backend.h"
#include "../../src/cuda/cuda_model.h"
#include "../../src/cuda/kv_cache.h"
#include "../../src/quant/formats.h"

#include "gpu_rand.h"

static int fails = 0;

static void *dup_dev(const void *h, size_t bytes) {
    void *d = dsv4_cuda_alloc(bytes ? bytes : 16);
    if (!d || (bytes && dsv4_cuda_upload(d, h, bytes))) {
        fprintf(stderr, "device: %s\n", dsv4_cuda_last_error());
        exit(1);
    }
    return d;
}

/* n FP8-simulated rows of Dh (rope dims rounded to bf16) with magnitudes varying by row */
static float *make_rows(int n, int Dh, int R) {
    float *x = malloc(sizeof(float) * (size_t)n * Dh);
    for (int i = 0; i < n; i++) {
        float mag = (float)pow(2.0, (int)(urand() * 5) - 2); /* unit-RMS rows (kv_norm), FP8 scales vary */
        float *r = x + (size_t)i * Dh;
        for (int d = 0; d < Dh; d++) r[d] = mag * nrand();
        if (i % 7 == 3) memset(r, 0, sizeof(float) * 64); /* an all-zero block */
        dsv4_act_quant_fp8(r, (size_t)(Dh - R), 64);
        for (int d = Dh - R; d < Dh; d++) r[d] = dsv4_bf16_to_f32(dsv4_f32_to_bf16(r[d]));
    }
    return x;
}

static void test_pack(int Dh, int R, int n) {
    float *x = make_rows(n, Dh, R);
    int64_t rb = dsv4_kv_row_bytes(Dh, R);
    float *dx = dup_dev(x, sizeof(float) * (size_t)n * Dh), *dy = dsv4_cuda_alloc(sizeof(float) * (size_t)n * Dh);
    uint8_t *dc = dsv4_cuda_alloc((size_t)(rb * n));
    float *y = malloc(sizeof(float) * (size_t)n * Dh);
    if (dsv4_cuda_kv_pack(dx, Dh, n, Dh, R, dc, NULL, NULL) || dsv4_cuda_kv_unpack(dc, n, Dh, R, dy, Dh, NULL) ||
        dsv4_cuda_download(y, dy, sizeof(float) * (size_t)n * Dh)) {
        printf("FAIL pack Dh %d: %s\n", Dh, dsv4_cuda_last_error());
        fails++;
        return;
    }
    int bad = 0;
    for (size_t i = 0; i < (size_t)n * Dh; i++) bad += memcmp(&x[i], &y[i], 4) != 0 && !(x[i] == 0 && y[i] == 0);
    printf("%s pack/unpack Dh %d R %d, %d rows of %lld bytes: %d values differ\n", bad ? "FAIL" : "ok  ", Dh, R, n,
           (long long)rb, bad);
    fails += bad != 0;
    free(x), free(y);
    dsv4_cuda_free(dx), dsv4_cuda_free(dy), dsv4_cuda_free(dc);
}

/* T queries over NS sequences' caches of C rows each; lists of nidx entries */
static void test_attn(int T, int H, int Dh, int R, int nidx, int C, int with_kv2) {
    const int NS = 3, n2 = 8;
    const int64_t rb = dsv4_kv_row_bytes(Dh, R);
    float *rows[3];
    uint8_t *dcache[3];
    for (int s = 0; s < NS; s++) {
        rows[s] = make_rows(C, Dh, R);
        float *d = dup_dev(rows[s], sizeof(float) * (size_t)C * Dh);
        dcache[s] = dsv4_cuda_alloc((size_t)(rb * C));
        if (dsv4_cuda_kv_pack(d, Dh, C, Dh, R, dcache[s], NULL, NULL)) exit(1);
        dsv4_cuda_free(d);
    }
    float *kv2 = malloc(sizeof(float) * n2 * Dh);
    for (int i = 0; i < n2 * Dh; i++) kv2[i] = nrand();
    float *q = malloc(sizeof(float) * (size_t)T * H * Dh), *sink = malloc(sizeof(float) * H);
    for (size_t i = 0; i < (size_t)T * H * Dh; i++) q[i] = nrand();
    for (int h = 0; h < H; h++) sink[h] = nrand();
    int *idx = malloc(sizeof(int) * (size_t)T * nidx), *seq = malloc(sizeof(int) * T);
    const uint8_t **base = malloc(sizeof(void *) * T);
    for (int t = 0; t < T; t++) {
        seq[t] = t % NS;
        base[t] = dcache[seq[t]];
        int valid = t == T - 1 && T > 2 ? 0 : nidx; /* the last query of a batch: no entry */
        for (int i = 0; i < nidx; i++) {
            int id = (int)(urand() * C);
            if (i >= valid || urand() < 0.1) id = -1;
            else if (with_kv2 && urand() < 0.2) id = -2 - (int)(urand() * n2);
            idx[(size_t)t * nidx + i] = id;
        }
    }
    float *dq = dup_dev(q, sizeof(float) * (size_t)T * H * Dh), *dsink = dup_dev(sink, sizeof(float) * H);
    float *dkv2 = dup_dev(kv2, sizeof(float) * n2 * Dh);
    int *didx = dup_dev(idx, sizeof(int) * (size_t)T * nidx);
    const uint8_t **dbase = dup_dev(base, sizeof(void *) * T);
    float *dout = dsv4_cuda_alloc(sizeof(float) * (size_t)T * H * Dh);
    size_t sc = dsv4_cuda_attn_kv8_scratch(T, H, Dh, nidx);
    float *dscr = sc ? dsv4_cuda_alloc(sizeof(float) * sc) : NULL;
    const float scale = 1.0f / sqrtf((float)Dh);
    float *got = malloc(sizeof(float) * (size_t)T * H * Dh), *got2 = malloc(sizeof(float) * (size_t)T * H * Dh);
    if (dsv4_cuda_attn_kv8(dq, T, H, Dh, R, dbase, with_kv2 ? dkv2 : NULL, didx, nidx, dsink, scale, dout, dscr, NULL) ||
        dsv4_cuda_download(got, dout, sizeof(float) * (size_t)T * H * Dh) ||
        dsv4_cuda_attn_kv8(dq, T, H, Dh, R, dbase, with_kv2 ? dkv2 : NULL, didx, nidx, dsink, scale, dout, dscr, NULL) ||
        dsv4_cuda_download(got2, dout, sizeof(float) * (size_t)T * H * Dh)) {
        printf("FAIL attn_kv8 T %d H %d Dh %d nidx %d: %s\n", T, H, Dh, nidx, dsv4_cuda_last_error());
        fails++;
        return;
    }
    /* reference */
    float *ref = malloc(sizeof(float) * (size_t)T * H * Dh);
    const float **keys = malloc(sizeof(void *) * (nidx ? nidx : 1));
    double ss = 0;
    for (int t = 0; t < T; t++) {
        int n = 0;
        for (int i = 0; i < nidx; i++) {
            int id = idx[(size_t)t * nidx + i];
            if (id >= 0) keys[n++] = rows[seq[t]] + (size_t)id * Dh;
            else if (id < -1) keys[n++] = kv2 + (size_t)(-id - 2) * Dh;
        }
        dsv4_cpu_sparse_attn(q + (size_t)t * H * Dh, H, Dh, keys, n, sink, scale, ref + (size_t)t * H * Dh);
    }
    for (size_t i = 0; i < (size_t)T * H * Dh; i++) ss += (double)ref[i] * ref[i];
    const double atol = 1e-5 * sqrt(ss / ((double)T * H * Dh)), rtol = 1e-4;
    double worst = 0;
    int bad = 0;
    for (size_t i = 0; i < (size_t)T * H * Dh; i++) {
        double e = fabs((double)got[i] - ref[i]), tol = atol + rtol * fabs(ref[i]);
        if (e / tol > worst) worst = e / tol;
        if (!(e <= tol)) bad++;
    }
    int nondet = memcmp(got, got2, sizeof(float) * (size_t)T * H * Dh) != 0;
    /* batch invariance: query 0 alone */
    int var = 0;
    if (T > 1) {
        float *one = malloc(sizeof(float) * H * Dh);
        if (dsv4_cuda_attn_kv8(dq, 1, H, Dh, R, dbase, with_kv2 ? dkv2 : NULL, didx, nidx, dsink, scale, dout, dscr, NULL) ||
            dsv4_cuda_download(one, dout, sizeof(float) * H * Dh))
            var = 1;
        else
            var = memcmp(one, got, sizeof(float) * H * Dh) != 0;
        free(one);
    }
    int f = bad || nondet || var;
    printf("%s attn_kv8 T %3d H %2d Dh %3d nidx %4d%s: worst %.3f of tolerance%s%s\n", f ? "FAIL" : "ok  ", T, H, Dh,
           nidx, with_kv2 ? " +chunk rows" : "", worst, nondet ? ", NOT repeatable" : "",
           var ? ", query 0 alone differs from in the batch" : "");
    fails += f;
    for (int s = 0; s < NS; s++) free(rows[s]), dsv4_cuda_free(dcache[s]);
    free(kv2), free(q), free(sink), free(idx), free(seq), free(base), free(got), free(got2), free(ref), free(keys);
    dsv4_cuda_free(dq), dsv4_cuda_free(dsink), dsv4_cuda_free(dkv2), dsv4_cuda_free(didx), dsv4_cuda_free(dbase);
    dsv4_cuda_free(dout), dsv4_cuda_free(dscr);
}

/* indexer scores over FP4-packed keys == over the same keys in fp32, bit for bit */
static void test_ikeys(int T, int Hi, int Di, int n) {
    float *k = malloc(sizeof(float) * (size_t)n * Di), *q = malloc(sizeof(float) * (size_t)T * Hi * Di);
    float *wt = malloc(sizeof(float) * (size_t)T * Hi);
    for (int i = 0; i < n; i++) {
        float *r = k + (size_t)i * Di;
        for (int d = 0; d < Di; d++) r[d] = (float)pow(2.0, (int)(urand() * 6) - 3) * nrand();
        if (i % 5 == 2) memset(r, 0, sizeof(float) * 32);
        dsv4_act_quant_fp4(r, (size_t)Di, 32);
    }
    for (size_t i = 0; i < (size_t)T * Hi * Di; i++) q[i] = nrand();
    for (int i = 0; i < T * Hi; i++) wt[i] = nrand();
    int *nc = malloc(sizeof(int) * T), *nl = malloc(sizeof(int) * T);
    for (int t = 0; t < T; t++) nl[t] = n, nc[t] = n - t % 3;
    const int64_t rb = dsv4_ikey_row_bytes(Di);
    float *dk = dup_dev(k, sizeof(float) * (size_t)n * Di), *dq = dup_dev(q, sizeof(float) * (size_t)T * Hi * Di);
    float *dw = dup_dev(wt, sizeof(float) * (size_t)T * Hi);
    uint8_t *dpk = dsv4_cuda_alloc((size_t)(rb * n));
    int *dnc = dup_dev(nc, sizeof(int) * T), *dnl = dup_dev(nl, sizeof(int) * T);
    const uint8_t **bf = malloc(sizeof(void *) * T), **bp = malloc(sizeof(void *) * T);
    for (int t = 0; t < T; t++) bf[t] = (const uint8_t *)dk, bp[t] = dpk;
    const uint8_t **dbf = dup_dev(bf, sizeof(void *) * T), **dbp = dup_dev(bp, sizeof(void *) * T);
    float *o1 = dsv4_cuda_alloc(sizeof(float) * (size_t)T * n), *o2 = dsv4_cuda_alloc(sizeof(float) * (size_t)T * n);
    float *h1 = malloc(sizeof(float) * (size_t)T * n), *h2 = malloc(sizeof(float) * (size_t)T * n);
    int rc = dsv4_cuda_ikey_pack(dk, Di, n, Di, dpk, NULL, NULL) ||
             dsv4_cuda_indexer_scores(dq, dw, T, Hi, Di, dbf, 0, dnc, dnl, n, n, o1, NULL) ||
             dsv4_cuda_indexer_scores(dq, dw, T, Hi, Di, dbp, 1, dnc, dnl, n, n, o2, NULL) ||
             dsv4_cuda_download(h1, o1, sizeof(float) * (size_t)T * n) || dsv4_cuda_download(h2, o2, sizeof(float) * (size_t)T * n);
    int same = !rc && !memcmp(h1, h2, sizeof(float) * (size_t)T * n);
    printf("%s indexer scores, FP4-packed keys (%lld bytes a row) == fp32 keys bitwise: T %d Hi %d Di %d, %d keys%s%s\n",
           same ? "ok  " : "FAIL", (long long)rb, T, Hi, Di, n, rc ? ": " : "", rc ? dsv4_cuda_last_error() : "");
    fails += !same;
    free(k), free(q), free(wt), free(nc), free(nl), free(bf), free(bp), free(h1), free(h2);
    dsv4_cuda_free(dk), dsv4_cuda_free(dq), dsv4_cuda_free(dw), dsv4_cuda_free(dpk), dsv4_cuda_free(dnc), dsv4_cuda_free(dnl);
    dsv4_cuda_free((void *)dbf), dsv4_cuda_free((void *)dbp), dsv4_cuda_free(o1), dsv4_cuda_free(o2);
}

int main(void) {
    rs = 0x9E3779B97F4A7C15ull;
    char err[256];
    if (dsv4_cuda_init(0, NULL, err, sizeof err)) {
        fprintf(stderr, "test_attn_kv8: %s\n", err);
        return 1;
    }
    test_pack(512, 64, 300);
    test_pack(128, 64, 100);
    test_pack(192, 64, 77);
    test_attn(1, 64, 512, 64, 640, 2048, 0);   /* V4 decode, CSA: window + top-512 */
    test_attn(4, 64, 512, 64, 5000, 8192, 0);  /* HCA at long context: more than 4096 entries */
    test_attn(8, 64, 512, 64, 160, 1024, 0);
    test_attn(37, 4, 128, 64, 100, 300, 1);    /* prefill chunk with its own rows */
    test_attn(5, 16, 192, 64, 257, 600, 1);
    test_attn(3, 1, 128, 64, 1, 10, 0);
    test_attn(2, 10, 128, 64, 64, 100, 0);
    test_ikeys(3, 64, 128, 1000);
    test_ikeys(2, 4, 64, 37);
    printf("test_attn_kv8: %s\n", fails ? "FAILED" : "all passed");
    return fails != 0;
}
