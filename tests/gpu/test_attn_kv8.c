/* test_attn_kv8.c - the KV cache in its stored format (src/cuda/kv_cache.h, attn_kv8.cu) on the GPU:
 *   1. pack -> unpack returns FP8-simulated rows (rope dims in bf16) bit for bit;
 *   2. dsv4_cuda_attn_kv8 on the unpacked rows (random queries, several sequences' caches, -1 padding, a
 *      prefill chunk's own fp32 rows, lists of 1 .. 5000 entries, a query with no entry) against the same
 *      math in double, |got - ref| <= 1e-5 rms(ref) + 1e-4 |ref|; the distances of the CPU twin
 *      (dsv4_cpu_sparse_attn) and of the kernel before the rewrite to it are printed too (the twin's scores
 *      are sequential float sums over the dims: at 512 dims they are the noisiest of the three);
 *   3. the same query alone and inside a batch: bitwise equal (batch invariance), and a second run
 *      bitwise equal to the first;
 *   4. every launch shape of dsv4_cuda_attn_kv8 (heads per block, a block per span or per query) gives the
 *      same bits;
 *   5. indexer scores over keys packed in their FP4 format bitwise equal to the scores over the fp32 keys, and
 *      both bitwise equal to the CPU's loop (indexer_topk of src/model/forward_attn.c, written out here);
 *   6. timings (CUDA events around CUDA-graph replays, as in the decode step) at V4-Flash decode shapes,
 *      against the kernels before the rewrite (tests/gpu/legacy_kv8.cu), whose outputs are compared too;
 *   7. the prefill path on tensor cores (dsv4_cuda_attn_kv8_tc): checks 2 and 3 (the same bar against the double
 *      evaluation, repeatable, queries alone == in the batch; the decode kernel's distance printed), and timings of
 *      whole 256- and 4096-row passes at Flash shapes against the decode kernel in the forward's 64-row calls;
 *   8. the decode path on tensor cores (dsv4_cuda_attn_kv8_tc_dec, "_tcd"): checks 2 and 3, every launch shape (a
 *      block per span / per query, 64 / 16 heads a block) bitwise equal, the fused inverse RoPE bitwise the kernel then dsv4_cuda_rope; its
 *      timings beside dsv4_cuda_attn_kv8's in 6, and both at long lists (2048 .. 8320 entries) at T 1 and 8.
 * 7 and 8 run each case twice on the same inputs: with hi + lo f16 terms at check 2's double bar, and with one f16 term (the
 * default) at the distances of the official model's bf16 arithmetic (attn_ref_bf16) from the double evaluation and
 * the twin.
 * Needs a GPU:  build-cuda/tests/gpu/test_attn_kv8 [--no-bench] [--only-tc | --only-dec | --only-ix]   (scripts/gpu_test.sh
 * runs it) (--only-tc: 7 alone; --only-dec: 8 and the decode timings of 6; --only-ix: 5 and the indexer's timings) */
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

#include <cuda_runtime.h>

/* tests/gpu/legacy_kv8.cu: the kernels before the rewrite */
int legacy_attn_kv8(const float *q, int T, int H, int Dh, int R, const uint8_t *const *base, const float *kv2,
                    const int *idx, int nidx, const float *sink, float scale, float *out, float *scratch, void *stream);
size_t legacy_attn_kv8_scratch(int T, int H, int Dh, int nidx);
int legacy_indexer_scores(const float *qi, const float *wt, int T, int Hi, int Di, const uint8_t *const *keys, int fp4,
                          const int *ncausal, const int *nlist, int maxlist, int ld, float *out, void *stream);

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

static double bf(double v) { return dsv4_bf16_to_f32(dsv4_f32_to_bf16((float)v)); }
static double id(double v) { return v; }
/* The twin's math in double (r = id: exact scores, softmax with the sink, weighted sum), or as the official model runs
 * it in bf16 (r = bf: spec 7.1, q and the kv rows bf16, fp32 scores and softmax, the weights bf16 into the weighted
 * sum, o bf16) in double otherwise: the bar of the single-term tensor-core forms (no further from the double evaluation
 * than this) */
static void attn_ref_r(const float *q, int H, int Dh, const float *const *kv, int n, const float *sink, float scale,
                       float *out, double (*r)(double)) {
    double *s = malloc(sizeof(double) * (size_t)(n ? n : 1)), *o = malloc(sizeof(double) * (size_t)Dh);
    for (int h = 0; h < H; h++) {
        const float *qh = q + (size_t)h * Dh;
        double mx = -INFINITY, den = 0;
        for (int t = 0; t < n; t++) {
            double a = 0;
            for (int d = 0; d < Dh; d++) a += r(qh[d]) * r(kv[t][d]);
            s[t] = a * scale;
            if (s[t] > mx) mx = s[t];
        }
        for (int d = 0; d < Dh; d++) o[d] = 0;
        if (n) {
            for (int t = 0; t < n; t++) den += (s[t] = exp(s[t] - mx));
            den += exp((double)sink[h] - mx);
            for (int t = 0; t < n; t++)
                for (int d = 0; d < Dh; d++) o[d] += r == id ? s[t] / den * kv[t][d] : r(s[t]) * r(kv[t][d]);
        }
        for (int d = 0; d < Dh; d++) out[(size_t)h * Dh + d] = r == id ? (float)o[d] : n ? (float)r(o[d] / den) : 0.0f;
    }
    free(s), free(o);
}
static void attn_ref_double(const float *q, int H, int Dh, const float *const *kv, int n, const float *sink, float scale,
                            float *out) {
    attn_ref_r(q, H, Dh, kv, n, sink, scale, out, id);
}
static void attn_ref_bf16(const float *q, int H, int Dh, const float *const *kv, int n, const float *sink, float scale,
                          float *out) {
    attn_ref_r(q, H, Dh, kv, n, sink, scale, out, bf);
}

/* ||got - ref|| / ||ref|| */
static double rel_l2(const float *got, const float *ref, size_t n) {
    double e = 0, r = 0;
    for (size_t i = 0; i < n; i++) e += ((double)got[i] - ref[i]) * ((double)got[i] - ref[i]), r += (double)ref[i] * ref[i];
    return r > 0 ? sqrt(e / r) : sqrt(e);
}

/* the timings' sanity check of a tensor-core output against a CUDA-core kernel's: worst <= 100 of the double bar with
 * hi + lo terms; with one f16 term (hl 0) a relative L2 <= 1e-2 (the checks above hold its precision to the bf16
 * arithmetic's; this catches a broken kernel: errors of order 1) */
static int tc_sane(int hl, double worst, const float *got, const float *ref, size_t n, double *rl) {
    *rl = rel_l2(got, ref, n);
    return hl ? worst <= 100 : *rl <= 1e-2;
}

/* worst |got - ref| / (1e-5 rms(ref) + 1e-4 |ref|) and the count over 1 */
static double tol_worst(const float *got, const float *ref, size_t n, int *bad) {
    double ss = 0, worst = 0;
    for (size_t i = 0; i < n; i++) ss += (double)ref[i] * ref[i];
    const double atol = 1e-5 * sqrt(ss / (double)(n ? n : 1)), rtol = 1e-4;
    if (bad) *bad = 0;
    for (size_t i = 0; i < n; i++) {
        double e = fabs((double)got[i] - ref[i]), tol = atol + rtol * fabs(ref[i]);
        if (!(e <= worst * tol)) worst = e / tol;
        if (!(e <= tol) && bad) (*bad)++;
    }
    return worst;
}
/* tol_worst of two device arrays of n floats, downloaded into hg / hr (infinite when a download fails) */
static double tol_worst_dev(const float *dgot, const float *dref, size_t n, float *hg, float *hr) {
    if (dsv4_cuda_download(hg, dgot, sizeof(float) * n) || dsv4_cuda_download(hr, dref, sizeof(float) * n)) return INFINITY;
    return tol_worst(hg, hr, n, NULL);
}
/* floats of scratch that both decode paths (dsv4_cuda_attn_kv8, dsv4_cuda_attn_kv8_tc_dec) may take */
static size_t attn_scratch_both(int T, int H, int Dh, int nidx) {
    const size_t a = dsv4_cuda_attn_kv8_scratch(T, H, Dh, nidx), b = dsv4_cuda_attn_kv8_tc_scratch(T, H, Dh, nidx);
    return a > b ? a : b;
}

/* the pass's own rows (kv2) of the case under test: the prefill form on warpgroup MMA packs them */
static int tc_n2 = 0;
/* the path under test: dsv4_cuda_attn_kv8 (decode), the prefill form (tc 1: dsv4_cuda_attn_kv8_wg for one f16 term where
 * it fits, else dsv4_cuda_attn_kv8_tc) or dsv4_cuda_attn_kv8_tc_dec (decode on tensor cores, tc 2) */
static int attn_call(int tc, const float *q, int T, int H, int Dh, int R, const uint8_t *const *base, const float *kv2,
                     const int *idx, int nidx, const float *sink, float scale, float *out, float *scratch) {
    if (tc == 2)
        return dsv4_cuda_attn_kv8_tc_dec(q, T, H, Dh, R, base, kv2, idx, nidx, sink, scale, NULL, NULL, out, scratch, NULL);
    if (tc && !dsv4_cuda_attn_kv8_tc_hilo(0, -2) && dsv4_cuda_attn_kv8_wg_fits(H, Dh, R))
        return dsv4_cuda_attn_kv8_wg(q, T, H, Dh, R, base, kv2, kv2 ? tc_n2 : 0, idx, nidx, sink, scale, out, scratch, NULL);
    if (tc) return dsv4_cuda_attn_kv8_tc(q, T, H, Dh, R, base, kv2, idx, nidx, sink, scale, out, NULL);
    return dsv4_cuda_attn_kv8(q, T, H, Dh, R, base, kv2, idx, nidx, sink, scale, out, scratch, NULL);
}

/* the tensor-core forms with one f16 term (the default): held to the official model's bf16 arithmetic (attn_ref_bf16:
 * no further from the double evaluation, nor from the CPU twin, than it), not to the double bar of the hi + lo terms */
static int tc_f16 = 0;

/* T queries over NS sequences' caches of C rows each; lists of nidx entries. tc: a tensor-core path (1 prefill,
 * 2 decode), with kv2 rows as the forward makes them (non-rope dims FP8-simulated, rope dims fp32) */
static void test_attn_p(int T, int H, int Dh, int R, int nidx, int C, int with_kv2, int tc) {
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
    float *kv2;
    if (tc) {
        kv2 = make_rows(n2, Dh, R);
        for (int i = 0; i < n2; i++)
            for (int d = Dh - R; d < Dh; d++) kv2[(size_t)i * Dh + d] = nrand();
    } else {
        kv2 = malloc(sizeof(float) * n2 * Dh);
        for (int i = 0; i < n2 * Dh; i++) kv2[i] = nrand();
    }
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
    size_t sc = attn_scratch_both(T, H, Dh, nidx) + (tc == 1 ? (dsv4_cuda_attn_kv8_wg_scratch(n2, Dh, R) + 3) / 4 : 0);
    tc_n2 = n2;
    float *dscr = sc ? dsv4_cuda_alloc(sizeof(float) * sc) : NULL;
    const float scale = 1.0f / sqrtf((float)Dh);
    float *got = malloc(sizeof(float) * (size_t)T * H * Dh), *got2 = malloc(sizeof(float) * (size_t)T * H * Dh);
    if (attn_call(tc, dq, T, H, Dh, R, dbase, with_kv2 ? dkv2 : NULL, didx, nidx, dsink, scale, dout, dscr) ||
        dsv4_cuda_download(got, dout, sizeof(float) * (size_t)T * H * Dh) ||
        attn_call(tc, dq, T, H, Dh, R, dbase, with_kv2 ? dkv2 : NULL, didx, nidx, dsink, scale, dout, dscr) ||
        dsv4_cuda_download(got2, dout, sizeof(float) * (size_t)T * H * Dh)) {
        printf("FAIL attn_kv8%s T %d H %d Dh %d nidx %d: %s\n", tc == 2 ? "_tcd" : tc ? "_tc" : "", T, H, Dh, nidx,
               dsv4_cuda_last_error());
        fails++;
        return;
    }
    /* references: the math in double (the bar), the CPU twin and the kernel before the rewrite (printed) */
    float *ref = malloc(sizeof(float) * (size_t)T * H * Dh), *twin = malloc(sizeof(float) * (size_t)T * H * Dh);
    float *old = malloc(sizeof(float) * (size_t)T * H * Dh), *refb = malloc(sizeof(float) * (size_t)T * H * Dh);
    const int f16 = tc && tc_f16;
#pragma omp parallel for schedule(dynamic)
    for (int t = 0; t < T; t++) {
        const float **keys = malloc(sizeof(void *) * (nidx ? nidx : 1));
        int n = 0;
        for (int i = 0; i < nidx; i++) {
            int id = idx[(size_t)t * nidx + i];
            if (id >= 0) keys[n++] = rows[seq[t]] + (size_t)id * Dh;
            else if (id < -1) keys[n++] = kv2 + (size_t)(-id - 2) * Dh;
        }
        attn_ref_double(q + (size_t)t * H * Dh, H, Dh, keys, n, sink, scale, ref + (size_t)t * H * Dh);
        dsv4_cpu_sparse_attn(q + (size_t)t * H * Dh, H, Dh, keys, n, sink, scale, twin + (size_t)t * H * Dh);
        if (f16) attn_ref_bf16(q + (size_t)t * H * Dh, H, Dh, keys, n, sink, scale, refb + (size_t)t * H * Dh);
        free(keys);
    }
    int bad = 0;
    const double worst = tol_worst(got, ref, (size_t)T * H * Dh, &bad), wtwin = tol_worst(twin, ref, (size_t)T * H * Dh, NULL);
    double wold = -1;
    if (tc) { /* the prefill path's "old": the decode kernel */
        if (!dsv4_cuda_attn_kv8(dq, T, H, Dh, R, dbase, with_kv2 ? dkv2 : NULL, didx, nidx, dsink, scale, dout, dscr, NULL) &&
            !dsv4_cuda_download(old, dout, sizeof(float) * (size_t)T * H * Dh))
            wold = tol_worst(old, ref, (size_t)T * H * Dh, NULL);
    } else {
        size_t ls = legacy_attn_kv8_scratch(T, H, Dh, nidx);
        float *lscr = ls ? dsv4_cuda_alloc(sizeof(float) * ls) : NULL;
        if (!legacy_attn_kv8(dq, T, H, Dh, R, dbase, with_kv2 ? dkv2 : NULL, didx, nidx, dsink, scale, dout, lscr, NULL) &&
            !dsv4_cuda_download(old, dout, sizeof(float) * (size_t)T * H * Dh))
            wold = tol_worst(old, ref, (size_t)T * H * Dh, NULL);
        dsv4_cuda_free(lscr);
    }
    long wgd = -1; /* the warpgroup form's values that differ from attn_kv8_tc's one-term kernel's */
    double wgm = 0;
    if (tc == 1 && f16 && dsv4_cuda_attn_kv8_wg_fits(H, Dh, R) &&
        !dsv4_cuda_attn_kv8_tc(dq, T, H, Dh, R, dbase, with_kv2 ? dkv2 : NULL, didx, nidx, dsink, scale, dout, NULL) &&
        !dsv4_cuda_download(old, dout, sizeof(float) * (size_t)T * H * Dh)) {
        wgd = 0;
        for (size_t i = 0; i < (size_t)T * H * Dh; i++)
            if (memcmp(&got[i], &old[i], 4)) wgd++, wgm = fmax(wgm, fabs((double)got[i] - old[i]) / (fabs((double)old[i]) + 1e-30));
        printf("     attn_kv8_wg vs attn_kv8_tc (one term): %ld of %zu values differ (largest relative %.3g)\n", wgd,
               (size_t)T * H * Dh, wgm);
    }
    int nondet = memcmp(got, got2, sizeof(float) * (size_t)T * H * Dh) != 0;
    /* batch invariance: query 0 alone (tc: query T - 2 alone too) */
    int var = 0;
    for (int t1 = 0; t1 < T && t1 <= (tc ? T - 2 : 0) && T > 1 && !var; t1 += T - 2 > 0 ? T - 2 : T) {
        float *one = malloc(sizeof(float) * H * Dh);
        if (attn_call(tc, dq + (size_t)t1 * H * Dh, 1, H, Dh, R, dbase + t1, with_kv2 ? dkv2 : NULL, didx + (size_t)t1 * nidx, nidx,
                      dsink, scale, dout, dscr) ||
            dsv4_cuda_download(one, dout, sizeof(float) * H * Dh))
            var = 1;
        else
            var = memcmp(one, got + (size_t)t1 * H * Dh, sizeof(float) * H * Dh) != 0;
        if (var) printf("     query %d alone: %s\n", t1, dsv4_cuda_last_error());
        free(one);
    }
    /* every launch shape: the same bits */
    int shapes = 0, shape_diff = 0;
    for (int cfg = 0; cfg < (tc == 1 ? 0 : tc == 2 ? 1 : 5); cfg++)
        for (int mode = 0; mode < (tc == 2 ? 5 : 2); mode++) { /* tc: 64 / 16 heads a block x span / query blocks; 4: warpgroup MMA */
            if (tc == 2) dsv4_cuda_attn_kv8_tc_force(mode);
            else dsv4_cuda_attn_kv8_force(cfg, mode);
            if (attn_call(tc, dq, T, H, Dh, R, dbase, with_kv2 ? dkv2 : NULL, didx, nidx, dsink, scale, dout, dscr) ||
                dsv4_cuda_download(got2, dout, sizeof(float) * (size_t)T * H * Dh)) {
                printf("     shape %d mode %d: %s\n", cfg, mode, dsv4_cuda_last_error());
                shape_diff++;
            } else if (memcmp(got, got2, sizeof(float) * (size_t)T * H * Dh)) {
                size_t nd = 0;
                double md = 0;
                for (size_t i = 0; i < (size_t)T * H * Dh; i++)
                    if (memcmp(&got[i], &got2[i], 4)) nd++, md = fmax(md, fabs((double)got[i] - got2[i]));
                printf("     shape %d mode %d: %zu values differ (max %.3g)\n", cfg, mode, nd, md);
                shape_diff++;
            }
            shapes++;
        }
    dsv4_cuda_attn_kv8_force(-1, -1);
    dsv4_cuda_attn_kv8_tc_force(-1);
    /* the output's inverse RoPE in the same kernels (decode paths): bitwise attn_kv8 then dsv4_cuda_rope(inverse), at
     * every launch shape (mode -1: the shape attn_kv8 picks) */
    int rope_diff = 0, rope_shapes = 0;
    if (tc != 1 && R > 0) {
        float *freq = malloc(sizeof(float) * (size_t)(R / 2));
        int *pos = malloc(sizeof(int) * T);
        for (int i = 0; i < R / 2; i++) freq[i] = powf(10000.0f, -2.0f * i / (float)R);
        for (int t = 0; t < T; t++) pos[t] = t == 0 ? 0 : (int)(urand() * 1000000);
        float *dfreq = dup_dev(freq, sizeof(float) * (size_t)(R / 2));
        int *dpos = dup_dev(pos, sizeof(int) * T);
        float *dout2 = dsv4_cuda_alloc(sizeof(float) * (size_t)T * H * Dh);
        float *ra = malloc(sizeof(float) * (size_t)T * H * Dh), *rf = malloc(sizeof(float) * (size_t)T * H * Dh);
        for (int cfg = -1; cfg < (tc ? 0 : 5); cfg++)
            for (int mode = 0; mode < (cfg < 0 ? (tc ? 6 : 1) : 2); mode++) {
                if (tc) dsv4_cuda_attn_kv8_tc_force(mode - 1);
                else dsv4_cuda_attn_kv8_force(cfg, cfg < 0 ? -1 : mode);
                const float *k2 = with_kv2 ? dkv2 : NULL;
                if (attn_call(tc, dq, T, H, Dh, R, dbase, k2, didx, nidx, dsink, scale, dout, dscr) ||
                    dsv4_cuda_rope(dout, T, H, Dh, R / 2, dfreq, dpos, 1, NULL) ||
                    (tc ? dsv4_cuda_attn_kv8_tc_dec(dq, T, H, Dh, R, dbase, k2, didx, nidx, dsink, scale, dfreq, dpos, dout2, dscr, NULL)
                        : dsv4_cuda_attn_kv8_rope(dq, T, H, Dh, R, dbase, k2, didx, nidx, dsink, scale, dfreq, dpos, dout2, dscr,
                                                  NULL)) ||
                    dsv4_cuda_download(ra, dout, sizeof(float) * (size_t)T * H * Dh) ||
                    dsv4_cuda_download(rf, dout2, sizeof(float) * (size_t)T * H * Dh)) {
                    printf("     rope, shape %d mode %d: %s\n", cfg, mode, dsv4_cuda_last_error());
                    rope_diff++;
                } else if (memcmp(ra, rf, sizeof(float) * (size_t)T * H * Dh)) {
                    printf("     rope, shape %d mode %d: the fused inverse RoPE differs\n", cfg, mode);
                    rope_diff++;
                }
                rope_shapes++;
            }
        dsv4_cuda_attn_kv8_force(-1, -1);
        dsv4_cuda_attn_kv8_tc_force(-1);
        free(freq), free(pos), free(ra), free(rf), dsv4_cuda_free(dfreq), dsv4_cuda_free(dpos), dsv4_cuda_free(dout2);
    }
    /* the terms form (wo_a's input): bitwise the kernel's fp32 output, then dsv4_cuda_rope(inverse), then the split's
     * terms in each row's group layout; G groups of H / G heads (G = H / 8 where a block holds whole groups, and 1),
     * two terms and one */
    int terms_diff = 0, terms_runs = 0;
    if (tc == 1 && f16 && dsv4_cuda_attn_kv8_wg_fits(H, Dh, R)) {
        float *freq = malloc(sizeof(float) * (size_t)(R / 2 + 1));
        int *pos = malloc(sizeof(int) * T);
        for (int i = 0; i < R / 2; i++) freq[i] = powf(10000.0f, -2.0f * i / (float)R);
        for (int t = 0; t < T; t++) pos[t] = t == 0 ? 0 : (int)(urand() * 1000000);
        float *dfreq = dup_dev(freq, sizeof(float) * (size_t)(R / 2 + 1));
        int *dpos = dup_dev(pos, sizeof(int) * T);
        float *dout2 = dsv4_cuda_alloc(sizeof(float) * (size_t)T * H * Dh);
        float *ra = malloc(sizeof(float) * (size_t)T * H * Dh);
        uint16_t *tg = malloc(sizeof(float) * (size_t)T * H * Dh);
        const float *k2 = with_kv2 ? dkv2 : NULL;
        /* q as dsv4_cuda_norm_rope_h16 leaves it: f16 in the first half of each row's bytes, the rest NaN (unread) */
        float *q16 = malloc(sizeof(float) * (size_t)T * H * Dh);
        for (size_t r = 0; r < (size_t)T * H; r++) {
            uint16_t *hr = (uint16_t *)(q16 + r * Dh);
            for (int d = 0; d < Dh; d++) hr[d] = dsv4_f32_to_f16(q[r * Dh + d]), q16[r * Dh + Dh / 2 + d / 2] = NAN;
        }
        float *dq16 = dup_dev(q16, sizeof(float) * (size_t)T * H * Dh);
        /* variant 3: one f16 term of v x 2^-3 (wo_a's f16 form; f16s in device memory) */
        const int Gs[4] = {H % 8 == 0 ? H / 8 : 1, 1, H % 8 == 0 ? H / 8 : 1, H % 8 == 0 ? H / 8 : 1}, nts[4] = {2, 1, 2, 1},
                  qhs[4] = {0, 0, 1, 1};
        const float f16sc = 0.125f;
        float *df16s = dup_dev(&f16sc, sizeof f16sc);
        for (int v = 0; v < 4; v++) {
            const int G = Gs[v], nt = nts[v], gin = H / G * Dh, qh = qhs[v], f16 = v == 3;
            if (!dsv4_cuda_attn_kv8_wg_terms_fits(H, Dh, R, G)) continue;
            terms_runs++;
            if (dsv4_cuda_attn_kv8_wg(dq, T, H, Dh, R, dbase, k2, k2 ? n2 : 0, didx, nidx, dsink, scale, dout, dscr, NULL) ||
                (R > 0 && dsv4_cuda_rope(dout, T, H, Dh, R / 2, dfreq, dpos, 1, NULL)) ||
                dsv4_cuda_fill(dout2, (int64_t)T * H * Dh, 0.0f, NULL) ||
                dsv4_cuda_attn_kv8_wg_terms(qh ? dq16 : dq, T, H, Dh, R, dbase, k2, k2 ? n2 : 0, didx, nidx, dsink, scale, dfreq,
                                            dpos, G, nt, qh, f16 ? df16s : NULL, dout2, dscr, NULL) ||
                dsv4_cuda_download(ra, dout, sizeof(float) * (size_t)T * H * Dh) ||
                dsv4_cuda_download(tg, dout2, sizeof(float) * (size_t)T * H * Dh)) {
                printf("     terms, G %d nt %d q16 %d f16 %d: %s\n", G, nt, qh, f16, dsv4_cuda_last_error());
                terms_diff++;
                continue;
            }
            long nd = 0;
            for (int t = 0; t < T; t++)
                for (int h = 0; h < H; h++)
                    for (int d = 0; d < Dh; d++) {
                        const int gi = h / (H / G);
                        const size_t at = (size_t)t * 2 * H * Dh + (size_t)gi * 2 * gin + (size_t)(h - gi * (H / G)) * Dh + d;
                        const float x = ra[((size_t)t * H + h) * Dh + d];
                        const uint16_t hi = f16 ? dsv4_f32_to_f16(x * f16sc) : dsv4_f32_to_bf16(x),
                                       mid = dsv4_f32_to_bf16(x - dsv4_bf16_to_f32(hi));
                        /* (nt 1: the mid half is not written; it may hold the spans' fp32 partials) */
                        nd += tg[at] != hi || (nt > 1 && tg[at + gin] != mid);
                    }
            if (nd) {
                printf("     terms, G %d nt %d q16 %d f16 %d: %ld of %zu values differ from the kernel + RoPE + split\n", G, nt,
                       qh, f16, nd, (size_t)T * H * Dh);
                terms_diff++;
            }
        }
        free(freq), free(pos), free(ra), free(tg), free(q16), dsv4_cuda_free(dfreq), dsv4_cuda_free(dpos), dsv4_cuda_free(dout2);
        dsv4_cuda_free(dq16), dsv4_cuda_free(df16s);
    }
    /* against the CPU twin too: within 10x the double bar (1e-4 rms + 1e-3 relative, still 4x under a bf16 rounding);
     * the twin's own sequential fp32 sums sit at ~2.4x the double bar. One f16 term: the bf16 arithmetic's distances */
    const size_t no = (size_t)T * H * Dh;
    const double wvt = tol_worst(got, twin, no, NULL);
    const double bar = f16 ? tol_worst(refb, ref, no, NULL) : 1, tbar = f16 ? tol_worst(refb, twin, no, NULL) : 10;
    int f = (f16 ? !(worst <= bar) : bad) || nondet || var || shape_diff || rope_diff || terms_diff || !(wvt <= tbar);
    printf("%s attn_kv8%s%s T %3d H %2d Dh %3d nidx %4d%s: worst %.3f of tolerance (bar %.3g; CPU twin %.3f, %s %.3f; vs the "
           "twin %.3f, bar %.3g; relative L2 %.2e, bf16 arithmetic %.2e)%s%s, %d of %d launch shapes differ, fused inverse "
           "RoPE %d of %d, terms form %d of %d\n",
           f ? "FAIL" : "ok  ", tc == 2 ? "_tcd" : tc ? "_tc" : "", tc ? (f16 ? " (f16)" : " (hi+lo)") : "", T, H, Dh,
           nidx, with_kv2 ? " +chunk rows" : "", worst, bar, wtwin, tc ? "decode kernel" : "old kernel", wold, wvt, tbar,
           rel_l2(got, ref, no), f16 ? rel_l2(refb, ref, no) : -1.0, nondet ? ", NOT repeatable" : "",
           var ? ", a query alone differs from in the batch" : "", shape_diff, shapes, rope_diff, rope_shapes, terms_diff, terms_runs);
    fails += f;
    for (int s = 0; s < NS; s++) free(rows[s]), dsv4_cuda_free(dcache[s]);
    free(kv2), free(q), free(sink), free(idx), free(seq), free(base), free(got), free(got2), free(ref), free(twin), free(old);
    free(refb);
    dsv4_cuda_free(dq), dsv4_cuda_free(dsink), dsv4_cuda_free(dkv2), dsv4_cuda_free(didx), dsv4_cuda_free(dbase);
    dsv4_cuda_free(dout), dsv4_cuda_free(dscr);
}

static void test_attn(int T, int H, int Dh, int R, int nidx, int C, int with_kv2) { test_attn_p(T, H, Dh, R, nidx, C, with_kv2, 0); }
/* a tensor-core form (tc 1 prefill, 2 decode) in both precisions on the same inputs (the random stream replayed, so
 * later checks keep theirs): hi + lo terms at the double bar, one f16 term (the default) at the bf16 arithmetic's */
static void test_attn_tc(int T, int H, int Dh, int R, int nidx, int C, int with_kv2, int tc) {
    const uint64_t st = rs;
    dsv4_cuda_attn_kv8_tc_hilo(tc == 2, 1), tc_f16 = 0;
    test_attn_p(T, H, Dh, R, nidx, C, with_kv2, tc);
    rs = st;
    dsv4_cuda_attn_kv8_tc_hilo(tc == 2, 0), tc_f16 = 1;
    test_attn_p(T, H, Dh, R, nidx, C, with_kv2, tc);
    dsv4_cuda_attn_kv8_tc_hilo(tc == 2, -1), tc_f16 = 0;
}

/* indexer scores over FP4-packed keys == over the same keys in fp32, bit for bit. qfp4: q as the forward has it
 * (act_quant_fp4 per 32, block magnitudes 2^-4 .. 2^4, every 7th block 2^+-13 and every 11th zero: the tensor-core
 * kernel's exact path and its chains, T >= 32); else q unquantized (its chains everywhere). split: queries t % 3 == 1
 * read a second key set (another array). */
static void test_ikeys_qs(int T, int Hi, int Di, int n, int qfp4, int split) {
    float *k = malloc(sizeof(float) * 2 * (size_t)n * Di), *q = malloc(sizeof(float) * (size_t)T * Hi * Di);
    float *wt = malloc(sizeof(float) * (size_t)T * Hi);
    for (int i = 0; i < 2 * n; i++) {
        float *r = k + (size_t)i * Di;
        for (int d = 0; d < Di; d++) r[d] = (float)pow(2.0, (int)(urand() * 6) - 3) * nrand();
        if (i % 5 == 2) memset(r, 0, sizeof(float) * 32);
        dsv4_act_quant_fp4(r, (size_t)Di, 32);
    }
    for (size_t i = 0; i < (size_t)T * Hi * Di; i++) q[i] = nrand();
    if (qfp4)
        for (size_t b = 0; b < (size_t)T * Hi * Di / 32; b++) {
            const float m = b % 11 == 3 ? 0.0f : (float)pow(2.0, b % 7 == 5 ? (b % 2 ? 13 : -13) : (int)(urand() * 9) - 4);
            for (int j = 0; j < 32; j++) q[b * 32 + j] *= m;
            dsv4_act_quant_fp4(q + b * 32, 32, 32);
        }
    for (int i = 0; i < T * Hi; i++) wt[i] = nrand();
    int *nc = malloc(sizeof(int) * T), *nl = malloc(sizeof(int) * T);
    for (int t = 0; t < T; t++) nl[t] = n, nc[t] = n - t % 3;
    const int64_t rb = dsv4_ikey_row_bytes(Di);
    float *dk = dup_dev(k, sizeof(float) * 2 * (size_t)n * Di), *dq = dup_dev(q, sizeof(float) * (size_t)T * Hi * Di);
    float *dw = dup_dev(wt, sizeof(float) * (size_t)T * Hi);
    uint8_t *dpk = dsv4_cuda_alloc((size_t)(rb * 2 * n));
    int *dnc = dup_dev(nc, sizeof(int) * T), *dnl = dup_dev(nl, sizeof(int) * T);
    const uint8_t **bf = malloc(sizeof(void *) * T), **bp = malloc(sizeof(void *) * T);
    for (int t = 0; t < T; t++) {
        const int s2 = split && t % 3 == 1; /* the query's key set */
        bf[t] = (const uint8_t *)(dk + (size_t)s2 * n * Di), bp[t] = dpk + (size_t)s2 * n * rb;
    }
    const uint8_t **dbf = dup_dev(bf, sizeof(void *) * T), **dbp = dup_dev(bp, sizeof(void *) * T);
    float *o1 = dsv4_cuda_alloc(sizeof(float) * (size_t)T * n), *o2 = dsv4_cuda_alloc(sizeof(float) * (size_t)T * n);
    float *h1 = malloc(sizeof(float) * (size_t)T * n), *h2 = malloc(sizeof(float) * (size_t)T * n);
    int rc = dsv4_cuda_ikey_pack(dk, Di, 2 * n, Di, dpk, NULL, NULL) ||
             dsv4_cuda_indexer_scores(dq, dw, T, Hi, Di, dbf, 0, dnc, dnl, n, n, o1, NULL) ||
             dsv4_cuda_indexer_scores(dq, dw, T, Hi, Di, dbp, 1, dnc, dnl, n, n, o2, NULL) ||
             dsv4_cuda_download(h1, o1, sizeof(float) * (size_t)T * n) || dsv4_cuda_download(h2, o2, sizeof(float) * (size_t)T * n);
    int same = !rc && !memcmp(h1, h2, sizeof(float) * (size_t)T * n);
    /* the CPU's loop (indexer_topk in forward_attn.c; this file is C11 too: no contraction) */
    int cpu_diff = 0;
    for (int t = 0; t < T; t++)
        for (int w = 0; w < nl[t]; w++) {
            float sc = -INFINITY;
            if (w < nc[t]) {
                const float *kk = k + ((size_t)(split && t % 3 == 1) * n + w) * Di;
                sc = 0;
                for (int h = 0; h < Hi; h++) {
                    float dot = 0;
                    for (int j = 0; j < Di; j++) dot += q[((size_t)t * Hi + h) * Di + j] * kk[j];
                    sc += wt[t * Hi + h] * (dot > 0 ? dot : 0);
                }
            }
            cpu_diff += memcmp(&sc, &h1[(size_t)t * n + w], sizeof sc) != 0;
        }
    /* and the kernel before the rewrite */
    int leg_diff = -1;
    if (!rc && !legacy_indexer_scores(dq, dw, T, Hi, Di, dbp, 1, dnc, dnl, n, n, o1, NULL) &&
        !dsv4_cuda_download(h1, o1, sizeof(float) * (size_t)T * n)) {
        leg_diff = 0;
        for (size_t i = 0; i < (size_t)T * n; i++) leg_diff += memcmp(&h1[i], &h2[i], sizeof(float)) != 0;
    }
    same = same && !cpu_diff && !leg_diff;
    printf("%s indexer scores, FP4-packed keys (%lld bytes a row) == fp32 keys == CPU loop == old kernel, bitwise: "
           "T %d Hi %d Di %d, %d keys%s, q %s (%d differ from the CPU, %d from the old kernel)%s%s\n",
           same ? "ok  " : "FAIL", (long long)rb, T, Hi, Di, n, split ? " in two sets" : "", qfp4 ? "FP4" : "fp32", cpu_diff,
           leg_diff, rc ? ": " : "", rc ? dsv4_cuda_last_error() : "");
    fails += !same;
    free(k), free(q), free(wt), free(nc), free(nl), free(bf), free(bp), free(h1), free(h2);
    dsv4_cuda_free(dk), dsv4_cuda_free(dq), dsv4_cuda_free(dw), dsv4_cuda_free(dpk), dsv4_cuda_free(dnc), dsv4_cuda_free(dnl);
    dsv4_cuda_free((void *)dbf), dsv4_cuda_free((void *)dbp), dsv4_cuda_free(o1), dsv4_cuda_free(o2);
}

static void test_ikeys_q(int T, int Hi, int Di, int n, int qfp4) { test_ikeys_qs(T, Hi, Di, n, qfp4, 0); }
static void test_ikeys(int T, int Hi, int Di, int n) { test_ikeys_q(T, Hi, Di, n, 0); }

/* ---- timings ---- */

static uint64_t bs = 0x2545F4914F6CDD1Dull;
static uint64_t brand(void) {
    bs ^= bs << 13, bs ^= bs >> 7, bs ^= bs << 17;
    return bs;
}

/* n cache rows (Dh 512, R 64) of random codes: e4m3 without NaN, scales 2^-7 .. 2^-1, rope bf16 around 1 */
static uint8_t *rand_rows(size_t n, int Dh, int R) {
    const int64_t rb = dsv4_kv_row_bytes(Dh, R);
    const int nope = Dh - R, ro = dsv4_kv_rope_off(Dh, R);
    uint8_t *c = calloc((size_t)(n * rb), 1);
    for (size_t r = 0; r < n; r++) {
        uint8_t *row = c + r * rb;
        for (int d = 0; d < nope; d += 8) {
            uint64_t x = brand();
            for (int k = 0; k < 8; k++) {
                uint8_t b = (uint8_t)(x >> (8 * k));
                row[d + k] = (b & 0x7f) == 0x7f ? b ^ 1 : b;
            }
        }
        for (int b = 0; b < nope / 64; b++) row[nope + b] = (uint8_t)(120 + brand() % 7);
        uint16_t *rp = (uint16_t *)(row + ro);
        for (int j = 0; j < R; j++) {
            uint64_t x = brand();
            rp[j] = (uint16_t)(((x & 1) << 15) | ((122 + (x >> 1) % 7) << 7) | ((x >> 8) & 0x7f));
        }
    }
    return c;
}

typedef struct {
    const float *q, *sink;
    const uint8_t **base;
    const int *idx;
    float *out, *scr, *lscr;
    int T, nidx, legacy, tcd;
} attn_job;

typedef int (*run_fn)(const void *ctx, void *stream);

/* us per call: reps calls captured into a CUDA graph (as the decode step runs them: no host gaps), the graph
 * replayed 3 times between events after one warm replay; without a graph if the capture fails */
static double time_us(run_fn fn, const void *ctx, int reps) {
    cudaStream_t st;
    cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking);
    int rc = fn(ctx, st) | fn(ctx, st);
    cudaStreamSynchronize(st);
    if (rc) {
        printf("FAIL timing: %s\n", dsv4_cuda_last_error());
        fails++;
        cudaStreamDestroy(st);
        return -1;
    }
    cudaGraph_t g = NULL;
    cudaGraphExec_t ge = NULL;
    int graph = cudaStreamBeginCapture(st, cudaStreamCaptureModeRelaxed) == cudaSuccess;
    if (graph) {
        for (int i = 0; i < reps; i++) rc |= fn(ctx, st);
        graph = cudaStreamEndCapture(st, &g) == cudaSuccess && !rc && cudaGraphInstantiate(&ge, g, 0) == cudaSuccess;
    }
    cudaGetLastError();
    cudaEvent_t e0, e1;
    cudaEventCreate(&e0), cudaEventCreate(&e1);
    int calls = reps;
    if (graph) {
        cudaGraphLaunch(ge, st);
        cudaEventRecord(e0, st);
        for (int i = 0; i < 3; i++) cudaGraphLaunch(ge, st);
        calls = 3 * reps;
    } else {
        printf("     (no graph: timing launch by launch)\n");
        cudaEventRecord(e0, st);
        for (int i = 0; i < reps; i++) fn(ctx, st);
    }
    cudaEventRecord(e1, st);
    cudaEventSynchronize(e1);
    float ms = 0;
    cudaEventElapsedTime(&ms, e0, e1);
    cudaEventDestroy(e0), cudaEventDestroy(e1);
    if (ge) cudaGraphExecDestroy(ge);
    if (g) cudaGraphDestroy(g);
    cudaStreamDestroy(st);
    return 1000.0 * ms / calls;
}

static int run_attn(const void *ctx, void *st) {
    const attn_job *j = ctx;
    const float sc = 1.0f / sqrtf(512.0f);
    if (j->tcd) return dsv4_cuda_attn_kv8_tc_dec(j->q, j->T, 64, 512, 64, j->base, NULL, j->idx, j->nidx, j->sink, sc, NULL, NULL,
                                                 j->out, j->scr, st);
    if (j->legacy) return legacy_attn_kv8(j->q, j->T, 64, 512, 64, j->base, NULL, j->idx, j->nidx, j->sink, sc, j->out, j->lscr, st);
    return dsv4_cuda_attn_kv8(j->q, j->T, 64, 512, 64, j->base, NULL, j->idx, j->nidx, j->sink, sc, j->out, j->scr, st);
}

/* V4-Flash decode shapes: 64 heads x 512, rope 64; per query its own cache of 1024 rows; lists: window only (128),
 * window + 32 (ratio 128 at context 4096), window + 512 (ratio 4, index_topk 512) */
static void bench_attn(void) {
    const int Ts[] = {1, 8, 64, 256}, nidxs[] = {128, 160, 640}, C = 1024, H = 64, Dh = 512, R = 64, TMAX = 256;
    const int64_t rb = dsv4_kv_row_bytes(Dh, R);
    uint8_t *hc = rand_rows((size_t)TMAX * C, Dh, R);
    uint8_t *dc = dup_dev(hc, (size_t)(TMAX * C * rb));
    free(hc);
    float *q = malloc(sizeof(float) * (size_t)TMAX * H * Dh), sink[64];
    for (size_t i = 0; i < (size_t)TMAX * H * Dh; i++) q[i] = nrand();
    for (int h = 0; h < H; h++) sink[h] = nrand();
    float *dq = dup_dev(q, sizeof(float) * (size_t)TMAX * H * Dh), *dsink = dup_dev(sink, sizeof sink);
    const uint8_t **base = malloc(sizeof(void *) * TMAX);
    for (int t = 0; t < TMAX; t++) base[t] = dc + (size_t)t * C * rb;
    const uint8_t **dbase = dup_dev(base, sizeof(void *) * TMAX);
    float *dout = dsv4_cuda_alloc(sizeof(float) * (size_t)TMAX * H * Dh), *dout2 = dsv4_cuda_alloc(sizeof(float) * (size_t)TMAX * H * Dh);
    float *o1 = malloc(sizeof(float) * (size_t)TMAX * H * Dh), *o2 = malloc(sizeof(float) * (size_t)TMAX * H * Dh);
    int *idx = malloc(sizeof(int) * (size_t)TMAX * 640);
    for (int ni = 0; ni < 3; ni++) {
        const int nidx = nidxs[ni];
        for (int t = 0; t < TMAX; t++)
            for (int i = 0; i < nidx; i++)
                idx[(size_t)t * nidx + i] = i < 128 ? i : nidx == 160 ? i : 128 + (int)(brand() % (uint64_t)(C - 128));
        int *didx = dup_dev(idx, sizeof(int) * (size_t)TMAX * nidx);
        size_t ns = attn_scratch_both(TMAX, H, Dh, nidx), ls = legacy_attn_kv8_scratch(TMAX, H, Dh, nidx);
        float *scr = ns ? dsv4_cuda_alloc(sizeof(float) * ns) : NULL, *lscr = ls ? dsv4_cuda_alloc(sizeof(float) * ls) : NULL;
        for (int ti = 0; ti < 4; ti++) {
            const int T = Ts[ti], reps = T <= 8 ? 50 : 10;
            attn_job j = {dq, dsink, dbase, didx, dout, scr, lscr, T, nidx, 1, 0};
            if (ni == 0 && ti == 0) /* clocks up: ~0.3 s of the old kernel at T 256 */
                for (int i = 0; i < 200; i++) {
                    j.T = 256;
                    run_attn(&j, NULL);
                    j.T = T;
                }
            cudaDeviceSynchronize();
            double before = time_us(run_attn, &j, T == 256 ? 3 : reps);
            j.out = dout2, j.legacy = 0;
            double after = time_us(run_attn, &j, reps);
            /* the new result against the old one (both checked against the CPU above) */
            const double worst = tol_worst_dev(dout2, dout, (size_t)T * H * Dh, o2, o1);
            printf("     time attn_kv8 T %3d nidx %3d (64 x 512): before %8.1f us, after %7.1f us (%5.1fx); new vs old: worst %.3g "
                   "of the tolerance (random FP8 codes: peaked softmax, both kernels' score roundings show)\n",
                   T, nidx, before, after, before / after, worst);
            fails += !(worst <= 100);
            { /* the decode path on tensor cores (its launch shapes: a block per span up to 32 queries, else per query) */
                attn_job k = j;
                k.tcd = 1;
                const double tcd = time_us(run_attn, &k, reps);
                dsv4_cuda_download(o1, dout2, sizeof(float) * (size_t)T * H * Dh);
                const double wt = tol_worst(o1, o2, (size_t)T * H * Dh, NULL);
                double rl;
                const int ok = tc_sane(dsv4_cuda_attn_kv8_tc_hilo(1, -2), wt, o1, o2, (size_t)T * H * Dh, &rl);
                double sh[5] = {-1, -1, -1, -1, -1};
                for (int mode = 0; mode < 5; mode++) {
                    if (!(mode & 1) && mode != 4 && T > 32) continue;
                    dsv4_cuda_attn_kv8_tc_force(mode);
                    sh[mode] = time_us(run_attn, &k, T == 256 ? 3 : reps);
                }
                dsv4_cuda_attn_kv8_tc_force(-1);
                printf("     time attn_kv8_tc_dec T %3d nidx %3d: %7.1f us (%5.2fx attn_kv8; 64 heads a block: span blocks "
                       "%.1f, query blocks %.1f, on warpgroup MMA %.1f; 16 heads: %.1f, %.1f); vs attn_kv8: worst %.3g of the "
                       "tolerance, relative L2 %.2e%s\n",
                       T, nidx, tcd, after / tcd, sh[0], sh[1], sh[4], sh[2], sh[3], wt, rl, ok ? "" : " FAIL");
                fails += !ok;
            }
            if (T <= 64) { /* every launch shape, for tuning */
                char line[512];
                int o = snprintf(line, sizeof line, "     shapes T %3d nidx %3d:", T, nidx);
                for (int mode = 0; mode < 2; mode++)
                    for (int cfg = 0; cfg < 5; cfg++) {
                        if (mode == 0 && T > 32) continue;
                        dsv4_cuda_attn_kv8_force(cfg, mode);
                        double us = time_us(run_attn, &j, reps);
                        o += snprintf(line + o, sizeof line - (size_t)o, " %s%d %.1f", mode ? "F" : "P", cfg, us);
                    }
                dsv4_cuda_attn_kv8_force(-1, -1);
                printf("%s us (P: a block per span, F: per query; 0..4: 32, 16, 8, 4, 2 heads per block)\n", line);
            }
        }
        dsv4_cuda_free(didx), dsv4_cuda_free(scr), dsv4_cuda_free(lscr);
    }
    free(q), free(base), free(idx), free(o1), free(o2);
    dsv4_cuda_free(dc), dsv4_cuda_free(dq), dsv4_cuda_free(dsink), dsv4_cuda_free((void *)dbase), dsv4_cuda_free(dout), dsv4_cuda_free(dout2);
}

/* Long lists at small batches (a ratio-128 layer at long capacities: 128 + capacity / 128 entries), the decode kernels
 * on CUDA cores and on tensor cores: T queries over one shared cache of 8320 rows, lists of random rows. */
static void bench_attn_long(void) {
    const int Ts[] = {1, 8}, nidxs[] = {2048, 5000, 8320}, C = 8320, H = 64, Dh = 512, R = 64, TMAX = 8, NMAX = 8320;
    const int64_t rb = dsv4_kv_row_bytes(Dh, R);
    uint8_t *hc = rand_rows((size_t)C, Dh, R), *dc = dup_dev(hc, (size_t)(C * rb));
    free(hc);
    float *q = malloc(sizeof(float) * (size_t)TMAX * H * Dh), sink[64];
    for (size_t i = 0; i < (size_t)TMAX * H * Dh; i++) q[i] = nrand();
    for (int h = 0; h < H; h++) sink[h] = nrand();
    float *dq = dup_dev(q, sizeof(float) * (size_t)TMAX * H * Dh), *dsink = dup_dev(sink, sizeof sink);
    const uint8_t *base[8];
    for (int t = 0; t < TMAX; t++) base[t] = dc;
    const uint8_t **dbase = dup_dev(base, sizeof base);
    float *dout = dsv4_cuda_alloc(sizeof(float) * (size_t)TMAX * H * Dh), *dout2 = dsv4_cuda_alloc(sizeof(float) * (size_t)TMAX * H * Dh);
    float *o1 = malloc(sizeof(float) * (size_t)TMAX * H * Dh), *o2 = malloc(sizeof(float) * (size_t)TMAX * H * Dh);
    int *idx = malloc(sizeof(int) * (size_t)TMAX * NMAX);
    for (int ni = 0; ni < 3; ni++) {
        const int nidx = nidxs[ni];
        for (int i = 0; i < TMAX * nidx; i++) idx[i] = (int)(brand() % (uint64_t)C);
        int *didx = dup_dev(idx, sizeof(int) * (size_t)TMAX * nidx);
        float *scr = dsv4_cuda_alloc(sizeof(float) * (attn_scratch_both(TMAX, H, Dh, nidx) + 4));
        for (int ti = 0; ti < 2; ti++) {
            const int T = Ts[ti];
            attn_job j = {dq, dsink, dbase, didx, dout, scr, NULL, T, nidx, 0, 0};
            const double cc = time_us(run_attn, &j, 20);
            j.out = dout2, j.tcd = 1;
            const double tc = time_us(run_attn, &j, 20);
            const double worst = tol_worst_dev(dout2, dout, (size_t)T * H * Dh, o2, o1);
            double rl;
            const int ok = tc_sane(dsv4_cuda_attn_kv8_tc_hilo(1, -2), worst, o2, o1, (size_t)T * H * Dh, &rl);
            printf("%s time attn long list T %d nidx %4d (64 x 512): attn_kv8 %7.1f us, attn_kv8_tc_dec %7.1f us (%.2fx); "
                   "tc vs attn_kv8: worst %.3g of the tolerance, relative L2 %.2e\n",
                   ok ? "    " : "FAIL", T, nidx, cc, tc, cc / tc, worst, rl);
            fails += !ok;
        }
        dsv4_cuda_free(didx), dsv4_cuda_free(scr);
    }
    free(q), free(o1), free(o2), free(idx);
    dsv4_cuda_free(dc), dsv4_cuda_free(dq), dsv4_cuda_free(dsink), dsv4_cuda_free((void *)dbase), dsv4_cuda_free(dout),
        dsv4_cuda_free(dout2);
}

/* Prefill passes (forward_cuda.c): TP queries of one sequence, window entries = the pass's own kv rows (kv2,
 * FP8-simulated, rope dims fp32), compressed entries = random rows of one cache (random codes); the decode kernel in
 * calls of 64 rows (as the forward ran it) against dsv4_cuda_attn_kv8_tc in one call (CUDA events around graph
 * replays of the whole pass). */
typedef struct {
    const float *q, *kv2, *sink;
    const uint8_t **base;
    const int *idx;
    float *out, *scr;
    int T, nidx, tc;
    void *wscr; /* the warpgroup form's copy of the pass's rows */
    const float *freq, *q16; /* tc 4-6: the inverse RoPE's frequencies (positions: the query's index); q as f16 rows */
    const int *pos;
} pf_job;

static int run_pf(const void *ctx, void *st) {
    const pf_job *j = ctx;
    const float sc = 1.0f / sqrtf(512.0f);
    if (j->tc == 2) /* the decode form over the same pass (T > 32: a block per query, its spans folded there) */
        return dsv4_cuda_attn_kv8_tc_dec(j->q, j->T, 64, 512, 64, j->base, j->kv2, j->idx, j->nidx, j->sink, sc, NULL, NULL,
                                         j->out, NULL, st);
    if (j->tc == 1 || j->tc == 4) { /* 4: then the output's inverse RoPE (the forward before the terms form) */
        const int r = dsv4_cuda_attn_kv8_wg(j->q, j->T, 64, 512, 64, j->base, j->kv2, j->T, j->idx, j->nidx, j->sink, sc, j->out,
                                            j->wscr, st);
        return r || j->tc == 1 ? r : dsv4_cuda_rope(j->out, j->T, 64, 512, 32, j->freq, j->pos, 1, st);
    }
    if (j->tc == 5 || j->tc == 6) /* the terms form (wo_a's 8 groups, two terms); 6: q as f16 rows */
        return dsv4_cuda_attn_kv8_wg_terms(j->tc == 6 ? j->q16 : j->q, j->T, 64, 512, 64, j->base, j->kv2, j->T, j->idx, j->nidx,
                                           j->sink, sc, j->freq, j->pos, 8, 2, j->tc == 6, NULL, j->out, j->wscr, st);
    if (j->tc) return dsv4_cuda_attn_kv8_tc(j->q, j->T, 64, 512, 64, j->base, j->kv2, j->idx, j->nidx, j->sink, sc, j->out, st);
    for (int t0 = 0; t0 < j->T; t0 += 64) {
        const int tn = j->T - t0 < 64 ? j->T - t0 : 64;
        if (dsv4_cuda_attn_kv8(j->q + (size_t)t0 * 64 * 512, tn, 64, 512, 64, j->base + t0, j->kv2, j->idx + (size_t)t0 * j->nidx,
                               j->nidx, j->sink, sc, j->out + (size_t)t0 * 64 * 512, j->scr, st))
            return -1;
    }
    return 0;
}

static void bench_attn_tc(void) {
    const int TP = 4096, H = 64, Dh = 512, R = 64, C = 2048, Ts[] = {256, 4096}, nidxs[] = {128, 160, 640};
    const int64_t rb = dsv4_kv_row_bytes(Dh, R);
    uint8_t *hc = rand_rows((size_t)C, Dh, R), *dc = dup_dev(hc, (size_t)(C * rb));
    free(hc);
    float *kv2 = make_rows(TP, Dh, R);
    for (int i = 0; i < TP; i++)
        for (int d = Dh - R; d < Dh; d++) kv2[(size_t)i * Dh + d] = nrand();
    float *dkv2 = dup_dev(kv2, sizeof(float) * (size_t)TP * Dh);
    float *q = malloc(sizeof(float) * (size_t)TP * H * Dh), sink[64];
    for (size_t i = 0; i < (size_t)TP * H * Dh; i++) q[i] = nrand();
    for (int h = 0; h < H; h++) sink[h] = nrand();
    float *dq = dup_dev(q, sizeof(float) * (size_t)TP * H * Dh), *dsink = dup_dev(sink, sizeof sink);
    const uint8_t **base = malloc(sizeof(void *) * TP);
    for (int t = 0; t < TP; t++) base[t] = dc;
    const uint8_t **dbase = dup_dev(base, sizeof(void *) * TP);
    float *d1 = dsv4_cuda_alloc(sizeof(float) * (size_t)TP * H * Dh), *d2 = dsv4_cuda_alloc(sizeof(float) * (size_t)TP * H * Dh);
    float *scr = dsv4_cuda_alloc(sizeof(float) * (dsv4_cuda_attn_kv8_scratch(64, H, Dh, 640) + 4));
    void *wscr = dsv4_cuda_alloc(dsv4_cuda_attn_kv8_wg_scratch(TP, Dh, R));
    float *o1 = malloc(sizeof(float) * (size_t)TP * H * Dh), *o2 = malloc(sizeof(float) * (size_t)TP * H * Dh);
    int *idx = malloc(sizeof(int) * (size_t)TP * 640);
    float freq[32], *q16 = malloc(sizeof(float) * (size_t)TP * H * Dh);
    int *pos = malloc(sizeof(int) * TP);
    for (int i = 0; i < 32; i++) freq[i] = powf(10000.0f, -2.0f * i / 64.0f);
    for (int t = 0; t < TP; t++) pos[t] = 4096 + t;
    for (size_t r = 0; r < (size_t)TP * H; r++)
        for (int d = 0; d < Dh; d++) ((uint16_t *)(q16 + r * Dh))[d] = dsv4_f32_to_f16(q[r * Dh + d]);
    float *dfreq = dup_dev(freq, sizeof freq), *dq16 = dup_dev(q16, sizeof(float) * (size_t)TP * H * Dh);
    int *dpos = dup_dev(pos, sizeof(int) * TP);
    for (int ni = 0; ni < 3; ni++) {
        const int nidx = nidxs[ni];
        long nval = 0;
        for (int t = 0; t < TP; t++)
            for (int i = 0; i < nidx; i++) {
                int id = i < 128 ? (t - 127 + i >= 0 ? -2 - (t - 127 + i) : -1) : (int)(brand() % (uint64_t)C);
                idx[(size_t)t * nidx + i] = id;
                nval += id != -1;
            }
        int *didx = dup_dev(idx, sizeof(int) * (size_t)TP * nidx);
        for (int ti = 0; ti < 2; ti++) {
            const int T = Ts[ti];
            pf_job j = {dq, dkv2, dsink, dbase, didx, d1, scr, T, nidx, 0, wscr, dfreq, dq16, dpos};
            const double before = time_us(run_pf, &j, 1);
            j.out = d2, j.tc = 3; /* hi + lo terms: attn_kv8_tc */
            dsv4_cuda_attn_kv8_tc_hilo(0, 1);
            const double hilo = time_us(run_pf, &j, 1);
            const size_t no = (size_t)T * H * Dh;
            double rl, rhl, rd;
            const double whl = tol_worst_dev(d2, d1, no, o2, o1);
            const int okhl = tc_sane(1, whl, o2, o1, no, &rhl);
            dsv4_cuda_attn_kv8_tc_hilo(0, 0);
            j.tc = 1; /* one f16 term: attn_kv8_wg */
            const double after = time_us(run_pf, &j, 1);
            const double worst = tol_worst_dev(d2, d1, no, o2, o1);
            const int ok = tc_sane(0, worst, o2, o1, no, &rl);
            j.tc = 3; /* attn_kv8_tc's one-term kernel (mma.sync), the form before */
            float *d3 = dsv4_cuda_alloc(sizeof(float) * no);
            j.out = d3;
            const double mma = time_us(run_pf, &j, 1);
            const double wm = tol_worst_dev(d2, d3, no, o2, o1);
            printf("     time attn_kv8 prefill T %4d nidx %3d: one f16 term on warpgroup MMA (attn_kv8_wg) %8.1f us, on mma.sync "
                   "(attn_kv8_tc) %8.1f us (%.2fx); worst %.3g of the tolerance between them\n",
                   T, nidx, after, mma, mma / after, wm);
            j.tc = 4;
            const double wr = time_us(run_pf, &j, 1);
            j.tc = 5;
            const double tm = time_us(run_pf, &j, 1);
            j.tc = 6;
            const double tq = time_us(run_pf, &j, 1);
            printf("     time attn_kv8 prefill T %4d nidx %3d: attn_kv8_wg + inverse RoPE %8.1f us, the terms form (8 groups, two "
                   "terms, RoPE inside) %8.1f us (%.2fx), with q as f16 rows %8.1f us (%.2fx)\n",
                   T, nidx, wr, tm, wr / tm, tq, wr / tq);
            dsv4_cuda_free(d3);
            j.out = d2, j.tc = 1;
            const double fl = 4.0 * H * Dh * (double)nval * T / TP; /* q.k and p.v, 2 flops a product */
            printf("%s time attn_kv8 prefill T %4d nidx %3d (64 x 512): decode kernel in 64-row calls %9.1f us, tensor cores "
                   "%8.1f us (%5.1fx; %.1f -> %.1f TFLOP/s); tc vs decode kernel: worst %.3g of the tolerance, relative L2 "
                   "%.2e\n",
                   ok ? "    " : "FAIL", T, nidx, before, after, before / after, fl / before * 1e-6, fl / after * 1e-6, worst, rl);
            fails += !ok;
            printf("%s time attn_kv8 prefill T %4d nidx %3d: tensor cores with hi + lo terms %8.1f us (%.2fx the f16 form); vs "
                   "decode kernel: worst %.3g of the tolerance, relative L2 %.2e\n",
                   okhl ? "    " : "FAIL", T, nidx, hilo, hilo / after, whl, rhl);
            fails += !okhl;
            j.tc = 2; /* the decode form of the kernel on the same pass: its fixed cost a block against the prefill form's */
            const double dec = time_us(run_pf, &j, 1);
            const double wd = tol_worst_dev(d2, d1, no, o2, o1);
            const int okd = tc_sane(dsv4_cuda_attn_kv8_tc_hilo(1, -2), wd, o2, o1, no, &rd);
            dsv4_cuda_attn_kv8_tc_hilo(0, -1);
            printf("%s time attn_kv8 prefill T %4d nidx %3d: the decode form (spans of 64 entries) %8.1f us (%.2fx the prefill "
                   "form); vs decode kernel: worst %.3g of the tolerance, relative L2 %.2e\n",
                   okd ? "    " : "FAIL", T, nidx, dec, dec / after, wd, rd);
            fails += !okd;
        }
        dsv4_cuda_free(didx);
    }
    free(kv2), free(q), free(base), free(o1), free(o2), free(idx), free(q16), free(pos);
    dsv4_cuda_free(dfreq), dsv4_cuda_free(dq16), dsv4_cuda_free(dpos);
    dsv4_cuda_free(dc), dsv4_cuda_free(dkv2), dsv4_cuda_free(dq), dsv4_cuda_free(dsink), dsv4_cuda_free((void *)dbase);
    dsv4_cuda_free(d1), dsv4_cuda_free(d2), dsv4_cuda_free(scr), dsv4_cuda_free(wscr);
}

typedef struct {
    const float *q, *w;
    const uint8_t **keys;
    const int *nl;
    float *out;
    int T, n, legacy;
    const int *nc; /* causal counts (NULL: nl) */
} ix_job;

static int run_ix(const void *ctx, void *st) {
    const ix_job *j = ctx;
    const int *nc = j->nc ? j->nc : j->nl;
    if (j->legacy) return legacy_indexer_scores(j->q, j->w, j->T, 64, 128, j->keys, 1, nc, j->nl, j->n, j->n, j->out, st);
    return dsv4_cuda_indexer_scores(j->q, j->w, j->T, 64, 128, j->keys, 1, nc, j->nl, j->n, j->n, j->out, st);
}

/* n random FP4 indexer key rows (random codes, scales 2^-3 .. 2^0: e8m0 124 .. 127; the padding zero) on the device */
static uint8_t *rand_ikeys_dev(size_t n, int Di) {
    const int64_t rb = dsv4_ikey_row_bytes(Di);
    uint8_t *hk = malloc((size_t)(n * rb));
    for (size_t r = 0; r < n; r++) {
        uint8_t *row = hk + r * rb;
        for (int j = 0; j < Di / 2; j++) row[j] = (uint8_t)brand();
        for (int b = 0; b < Di / 32; b++) row[Di / 2 + b] = (uint8_t)(124 + brand() % 4);
        memset(row + Di / 2 + Di / 32, 0, (size_t)(rb - Di / 2 - Di / 32));
    }
    uint8_t *dk = dup_dev(hk, (size_t)(n * rb));
    free(hk);
    return dk;
}

/* T indexer queries [T, Hi, Di] (act_quant_fp4 per 32, as the forward's q) and their head weights [T, Hi] on the device */
static void rand_iq_dev(int T, int Hi, int Di, float **dq, float **dw) {
    float *q = malloc(sizeof(float) * (size_t)T * Hi * Di), *w = malloc(sizeof(float) * (size_t)T * Hi);
    for (size_t i = 0; i < (size_t)T * Hi * Di; i++) q[i] = nrand();
    dsv4_act_quant_fp4(q, (size_t)T * Hi * Di, 32);
    for (int i = 0; i < T * Hi; i++) w[i] = nrand();
    *dq = dup_dev(q, sizeof(float) * (size_t)T * Hi * Di), *dw = dup_dev(w, sizeof(float) * (size_t)T * Hi);
    free(q), free(w);
}

/* indexer scores: 64 heads x 128, 1024 FP4 keys per query (context 4096, ratio 4), each query its own keys */
static void bench_ikeys(void) {
    const int Ts[] = {1, 8, 64, 512}, TMAX = 512, Hi = 64, Di = 128, n = 1024;
    const int64_t rb = dsv4_ikey_row_bytes(Di);
    uint8_t *dk = rand_ikeys_dev((size_t)TMAX * n, Di);
    float *dq, *dw;
    rand_iq_dev(TMAX, Hi, Di, &dq, &dw);
    int *nl = malloc(sizeof(int) * TMAX);
    for (int t = 0; t < TMAX; t++) nl[t] = n;
    const uint8_t **kp = malloc(sizeof(void *) * TMAX);
    for (int t = 0; t < TMAX; t++) kp[t] = dk + (size_t)t * n * rb;
    int *dnl = dup_dev(nl, sizeof(int) * TMAX);
    const uint8_t **dkp = dup_dev(kp, sizeof(void *) * TMAX);
    float *o1 = dsv4_cuda_alloc(sizeof(float) * (size_t)TMAX * n), *o2 = dsv4_cuda_alloc(sizeof(float) * (size_t)TMAX * n);
    float *h1 = malloc(sizeof(float) * (size_t)TMAX * n), *h2 = malloc(sizeof(float) * (size_t)TMAX * n);
    for (int ti = 0; ti < 4; ti++) {
        const int T = Ts[ti], reps = T <= 8 ? 50 : T <= 64 ? 10 : 3;
        double us[2];
        for (int v = 0; v < 2; v++) {
            ix_job j = {dq, dw, dkp, dnl, v ? o2 : o1, T, n, !v, NULL};
            us[v] = time_us(run_ix, &j, reps);
        }
        dsv4_cuda_download(h1, o1, sizeof(float) * (size_t)T * n);
        dsv4_cuda_download(h2, o2, sizeof(float) * (size_t)T * n);
        int diff = memcmp(h1, h2, sizeof(float) * (size_t)T * n) != 0;
        printf("%s time indexer_scores T %2d, %d FP4 keys (64 x 128): before %8.1f us, after %6.1f us (%5.1fx)%s\n",
               diff ? "FAIL" : "    ", T, n, us[0], us[1], us[0] / us[1], diff ? ", results differ from the old kernel" : ", bitwise equal to the old kernel");
        fails += diff;
    }
    free(nl), free(kp), free(h1), free(h2);
    dsv4_cuda_free(dk), dsv4_cuda_free(dq), dsv4_cuda_free(dw), dsv4_cuda_free(dnl), dsv4_cuda_free((void *)dkp);
    dsv4_cuda_free(o1), dsv4_cuda_free(o2);
}

/* indexer scores as in a prefill pass: 4096 queries of one sequence over its 2048 FP4 keys (an 8K prompt at ratio 4,
 * the pass's second half), query t's causal entries (4096 + t + 1) / 4 */
static void bench_ikeys_prefill(void) {
    const int T = 4096, Hi = 64, Di = 128, n = 2048;
    uint8_t *dk = rand_ikeys_dev((size_t)n, Di);
    float *dq, *dw;
    rand_iq_dev(T, Hi, Di, &dq, &dw);
    int *nl = malloc(sizeof(int) * T), *nc = malloc(sizeof(int) * T);
    const uint8_t **kp = malloc(sizeof(void *) * T);
    for (int t = 0; t < T; t++) nl[t] = n, nc[t] = (T + t + 1) / 4, kp[t] = dk;
    int *dnl = dup_dev(nl, sizeof(int) * T), *dnc = dup_dev(nc, sizeof(int) * T);
    const uint8_t **dkp = dup_dev(kp, sizeof(void *) * T);
    float *o = dsv4_cuda_alloc(sizeof(float) * (size_t)T * n);
    ix_job j = {dq, dw, dkp, dnl, o, T, n, 0, dnc};
    const double us = time_us(run_ix, &j, 3);
    double fl = 0; /* causal dots: 64 heads x 128 columns x 2 FLOPs an entry */
    for (int t = 0; t < T; t++) fl += 2.0 * Hi * Di * nc[t];
    printf("     time indexer_scores prefill T %d over %d FP4 keys (causal, 64 x 128): %.1f us, %.1f TFLOP/s\n", T, n, us,
           fl / us * 1e-6);
    free(nl), free(nc), free(kp);
    dsv4_cuda_free(dk), dsv4_cuda_free(dq), dsv4_cuda_free(dw), dsv4_cuda_free(dnl), dsv4_cuda_free(dnc), dsv4_cuda_free((void *)dkp);
    dsv4_cuda_free(o);
}

/* check 5: the indexer scores in every kernel and shape */
static void test_ix_all(void) {
    test_ikeys(3, 64, 128, 1000);
    test_ikeys(1, 64, 128, 1024);
    test_ikeys(2, 4, 64, 37);
    test_ikeys(2, 48, 128, 300);  /* threads left over in a block */
    test_ikeys_q(70, 64, 128, 1000, 1); /* the tensor-core kernel (T >= 32): exact path and chains */
    test_ikeys_q(40, 16, 64, 200, 1);
    test_ikeys_q(33, 48, 128, 130, 1);  /* 3 warps, a partial chunk */
    test_ikeys_q(32, 64, 128, 300, 0);  /* q not FP4: chains only */
    test_ikeys_q(3, 64, 128, 500, 1);   /* FP4 q through the other kernels */
    test_ikeys_qs(70, 64, 128, 330, 1, 1); /* two key sets */
    test_ikeys_qs(45, 32, 64, 150, 1, 1);
    test_ikeys(1, 128, 64, 100);
    test_ikeys(2, 8, 96, 50);     /* the thread-per-entry kernel */
}

int main(int argc, char **argv) {
    int bench = 1, only_tc = 0, only_dec = 0, only_ix = 0;
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "--no-bench")) bench = 0;
        else if (!strcmp(argv[i], "--only-tc")) only_tc = 1;
        else if (!strcmp(argv[i], "--only-dec")) only_dec = 1;
        else if (!strcmp(argv[i], "--only-ix")) only_ix = 1;
    setvbuf(stdout, NULL, _IOLBF, 0); /* lines reach a log even if a timeout kills the run */
    rs = 0x9E3779B97F4A7C15ull;
    char err[256];
    if (dsv4_cuda_init(0, NULL, err, sizeof err)) {
        fprintf(stderr, "test_attn_kv8: %s\n", err);
        return 1;
    }
    if (only_ix) { /* check 5 and the indexer's timings alone (a branch's indexer change: seconds, not the whole test) */
        test_ix_all();
        if (bench) bench_ikeys(), bench_ikeys_prefill();
        printf("test_attn_kv8: %s\n", fails ? "FAILED" : "all passed");
        return fails != 0;
    }
    if (only_dec) goto dec;
    /* the prefill path (tensor cores): Flash shapes (window as the pass's own rows, + 32 / 512 compressed), odd T,
     * invalid entries, a query without entries (the last of each batch), few heads, two head blocks, odd Dh */
    test_attn_tc(64, 64, 512, 64, 640, 2048, 1, 1);
    test_attn_tc(37, 64, 512, 64, 128, 1024, 1, 1);
    test_attn_tc(33, 64, 512, 64, 160, 1024, 1, 1);
    test_attn_tc(3, 64, 512, 64, 5000, 8192, 0, 1); /* spans of 1024 entries folded through out */
    test_attn_tc(2, 8, 512, 64, 2100, 3000, 1, 1);
    test_attn_tc(2, 128, 512, 64, 300, 1000, 1, 1); /* 2 blocks of 64 heads */
    test_attn_tc(5, 4, 128, 64, 100, 300, 1, 1);    /* few heads, rope dims in the first half */
    test_attn_tc(7, 10, 192, 64, 257, 600, 1, 1);
    test_attn_tc(3, 3, 130, 2, 70, 90, 1, 1);       /* Dh not a multiple of 8 */
    test_attn_tc(4, 8, 384, 64, 1, 10, 0, 1);       /* one entry */
    test_attn_tc(3, 16, 512, 64, 31, 40, 1, 1);     /* one partial tile */
dec:
    /* the decode path on tensor cores: Flash c4 / c128 / window lists, a block per span (T <= 32) and per query */
    test_attn_tc(1, 64, 512, 64, 640, 2048, 1, 2);
    test_attn_tc(8, 64, 512, 64, 160, 1024, 1, 2);
    test_attn_tc(33, 64, 512, 64, 640, 2048, 1, 2); /* per query; query 0 alone per span */
    test_attn_tc(4, 64, 512, 64, 128, 300, 0, 2);
    test_attn_tc(3, 64, 512, 64, 5000, 8192, 0, 2); /* 157 tiles: spans of 5 tiles */
    test_attn_tc(2, 128, 512, 64, 300, 1000, 1, 2); /* 2 blocks of 64 heads */
    test_attn_tc(5, 4, 128, 64, 100, 300, 1, 2);
    test_attn_tc(7, 10, 192, 64, 257, 600, 1, 2);
    test_attn_tc(3, 3, 130, 2, 70, 90, 1, 2);       /* Dh not a multiple of 8 */
    test_attn_tc(4, 8, 384, 64, 1, 10, 0, 2);       /* one entry */
    test_attn_tc(3, 16, 512, 64, 31, 40, 1, 2);     /* one partial tile */
    test_attn_tc(8, 64, 512, 64, 480, 1024, 1, 2);  /* a short list in 1-tile spans: 15 spans, more than 640's 10 */
    { /* the decode scratch sized for the longest list holds every shorter one's spans (short lists: 1-tile spans) */
        int bad = 0;
        for (int nmax = 1; nmax <= 9000 && !bad; nmax += nmax < 1100 ? 3 : 97)
            for (int n = 1; n <= nmax && !bad; n += n < 1100 ? 5 : 89)
                if (dsv4_cuda_attn_kv8_tc_scratch(8, 64, 512, n) > dsv4_cuda_attn_kv8_tc_scratch(8, 64, 512, nmax)) {
                    printf("FAIL attn_kv8_tc_scratch: %d entries need more than the %d-entry size\n", n, nmax);
                    bad = 1;
                }
        if (!bad) printf("ok   attn_kv8_tc_scratch: every list up to 9000 entries fits the size of any longer one\n");
        fails += bad;
    }
    if (only_tc || only_dec) {
        if (bench && only_tc) bench_attn_tc();
        if (bench && only_dec) bench_attn(), bench_attn_long();
        printf("test_attn_kv8: %s\n", fails ? "FAILED" : "all passed");
        return fails != 0;
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
    test_attn(40, 64, 512, 64, 640, 2048, 0);  /* full mode (T > 32) against query 0 alone */
    test_attn(2, 8, 384, 64, 1100, 1500, 1);   /* spans of 2 sub-splits, Dh 384 */
    test_attn(3, 3, 130, 2, 70, 90, 1);        /* Dh not a multiple of 4, heads not filling a block */
    test_ix_all();
    if (bench) {
        bench_attn_tc();
        bench_attn();
        bench_attn_long();
        bench_ikeys();
        bench_ikeys_prefill();
    }
    printf("test_attn_kv8: %s\n", fails ? "FAILED" : "all passed");
    return fails != 0;
}
