/* test_kernels.c - every op of src/cuda/cuda_backend.h against its CPU twin (src/cpu, src/quant), on
 * random inputs at DeepSeek-V4-Flash shapes (dim 4096, 64 heads x 512, rope 64, q_lora 1024, expert
 * inter 2048, indexer 64 x 128) plus odd sizes, then timings (CUDA events; GEMV GB/s against the
 * H200's ~4.8 TB/s, weights rotated through > 256 MiB so that L2 does not serve them).
 *
 * One closeness rule: |got - ref| <= atol + rtol * |ref| per element; the worst element (largest
 * |got - ref| / (atol + rtol * |ref|)) is printed; any failure makes the exit status non-zero.
 * Build and run: scripts/gpu_test.sh (make CUDA=1 builds build/tests/gpu/test_kernels).
 * Usage: test_kernels [--no-bench] */
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cpu/ops.h"
#include "cpu/topk.h"
#include "cuda/cuda_backend.h"
#include "quant/formats.h"
#include "quant/weight.h"

static int g_fail, g_checks;

/* ---- helpers ---- */

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static uint32_t rnd_u32(void) {
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return (uint32_t)(rng >> 11);
}
static float rnd_uni(void) { return (float)((rnd_u32() >> 8) * (1.0 / 16777216.0)); } /* [0, 1) */
static float rnd_n(void) {
    float u = rnd_uni() + 1e-7f, v = rnd_uni();
    return sqrtf(-2.0f * logf(u)) * cosf(6.2831853f * v);
}
static float *randn(size_t n, float sd) {
    float *p = malloc(sizeof(float) * (n ? n : 1));
    for (size_t i = 0; i < n; i++) p[i] = rnd_n() * sd;
    return p;
}
/* values spread over 6 decades, so every act-quant block gets its own scale */
static float *rand_wide(size_t n) {
    float *p = malloc(sizeof(float) * (n ? n : 1));
    float mag = 1;
    for (size_t i = 0; i < n; i++) {
        if (i % 32 == 0) mag = powf(10.0f, 6.0f * rnd_uni() - 3.0f);
        p[i] = rnd_n() * mag;
    }
    return p;
}

static void *dup_to_dev(const void *h, size_t bytes) {
    void *d = dsv4_cuda_alloc(bytes);
    if (!d || dsv4_cuda_upload(d, h, bytes)) {
        fprintf(stderr, "device buffer: %s\n", dsv4_cuda_last_error());
        exit(2);
    }
    return d;
}
static void from_dev(void *h, const void *d, size_t bytes) {
    if (dsv4_cuda_download(h, d, bytes)) {
        fprintf(stderr, "download: %s\n", dsv4_cuda_last_error());
        exit(2);
    }
}
static void op_ok(int rc, const char *what) {
    if (rc) {
        fprintf(stderr, "%s: %s\n", what, dsv4_cuda_last_error());
        exit(2);
    }
}
static void sync_ok(void) {
    cudaError_t e = cudaDeviceSynchronize();
    if (e != cudaSuccess) {
        fprintf(stderr, "device error: %s\n", cudaGetErrorString(e));
        exit(2);
    }
}

static double rms(const float *v, size_t n) {
    double s = 0;
    for (size_t i = 0; i < n; i++) s += (double)v[i] * v[i];
    return n ? sqrt(s / n) : 0;
}

/* The one rule. Returns 1 on pass. */
static int check(const char *name, const float *got, const float *ref, size_t n, double atol, double rtol) {
    size_t worst = 0, nbad = 0;
    double wr = -1;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)got[i] - ref[i]), lim = atol + rtol * fabs(ref[i]);
        double r = d / (lim > 0 ? lim : 1e-300);
        if (!(d <= lim)) nbad++;
        if (r > wr || isnan(got[i])) wr = isnan(got[i]) ? INFINITY : r, worst = i;
    }
    int ok = nbad == 0;
    g_checks++;
    if (!ok) g_fail++;
    printf("%-4s %-44s n=%-9zu worst [%zu] got % .8e ref % .8e |d|=%.2e (%.3f of tol; atol %.1e rtol %.1e)%s\n",
           ok ? "ok" : "FAIL", name, n, worst, n ? got[worst] : 0.0, n ? ref[worst] : 0.0,
           n ? fabs((double)got[worst] - ref[worst]) : 0.0, wr, atol, rtol, ok ? "" : " <<<");
    if (!ok) printf("     %zu elements out of tolerance\n", nbad);
    return ok;
}

/* ---- random weights in every format ---- */

typedef struct hweight {
    dsv4_weight w;
    uint8_t *data, *scale;
    size_t data_b, scale_b;
} hweight;

static uint8_t rnd_e4m3(void) { /* any non-NaN code */
    uint8_t b = (uint8_t)rnd_u32();
    return (b & 0x7f) == 0x7f ? (uint8_t)(b ^ 1) : b;
}

static hweight make_weight(dsv4_wfmt fmt, int R, int C, int scale_f32, int act_quant) {
    hweight h;
    memset(&h, 0, sizeof h);
    dsv4_weight *w = &h.w;
    w->fmt = fmt, w->rows = R, w->cols = C, w->act_quant = act_quant, w->name = "test";
    size_t RC = (size_t)R * C;
    switch (fmt) {
    case DSV4_WF_F32: {
        h.data_b = RC * 4;
        float *p = randn(RC, 0.05f);
        h.data = (uint8_t *)p;
        break;
    }
    case DSV4_WF_BF16:
    case DSV4_WF_F16: {
        h.data_b = RC * 2;
        uint16_t *p = malloc(h.data_b);
        for (size_t i = 0; i < RC; i++) {
            if (fmt == DSV4_WF_BF16) p[i] = dsv4_f32_to_bf16(rnd_n() * 0.05f);
            else p[i] = (uint16_t)((rnd_u32() & 0x8000) | ((8 + rnd_u32() % 8) << 10) | (rnd_u32() & 0x3ff));
        }
        h.data = (uint8_t *)p;
        break;
    }
    case DSV4_WF_FP8: {
        h.data_b = RC;
        h.data = malloc(RC);
        for (size_t i = 0; i < RC; i++) h.data[i] = rnd_e4m3();
        w->scale_f32 = scale_f32;
        w->scale_stride = (C + 127) / 128;
        size_t ns = (size_t)((R + 127) / 128) * w->scale_stride;
        h.scale_b = ns * (scale_f32 ? 4 : 1);
        h.scale = malloc(h.scale_b);
        for (size_t i = 0; i < ns; i++) {
            if (scale_f32) {
                float s = 1e-3f * (1 + 9 * rnd_uni());
                memcpy(h.scale + 4 * i, &s, 4);
            } else {
                h.scale[i] = (uint8_t)(118 + rnd_u32() % 8);
            }
        }
        break;
    }
    case DSV4_WF_MXFP4:
    case DSV4_WF_NVFP4: {
        int g = fmt == DSV4_WF_MXFP4 ? 32 : 16;
        h.data_b = RC / 2;
        h.data = malloc(h.data_b);
        for (size_t i = 0; i < h.data_b; i++) h.data[i] = (uint8_t)rnd_u32();
        w->scale_stride = (C + g - 1) / g;
        h.scale_b = (size_t)R * w->scale_stride;
        h.scale = malloc(h.scale_b);
        for (size_t i = 0; i < h.scale_b; i++)
            h.scale[i] = fmt == DSV4_WF_MXFP4 ? (uint8_t)(120 + rnd_u32() % 6) : (uint8_t)(0x28 + rnd_u32() % 0x28);
        w->scale2 = fmt == DSV4_WF_NVFP4 ? 0.0123f : 0;
        break;
    }
    default: break;
    }
    w->data = h.data;
    w->scale = h.scale;
    return h;
}

static void free_hweight(hweight *h) {
    free(h->data);
    free(h->scale);
}

/* ---- linear ---- */

static void test_linear(const char *tag, dsv4_wfmt fmt, int R, int C, int T, int scale_f32, int aq, int xbf16) {
    hweight h = make_weight(fmt, R, C, scale_f32, aq);
    dsv4_cuda_weight dw;
    op_ok(dsv4_cuda_weight_upload(&h.w, &dw), "weight upload");
    float *x = rand_wide((size_t)T * C);
    uint16_t *xb = NULL;
    if (xbf16) { /* the reference sees the bf16 values */
        xb = malloc(sizeof(uint16_t) * (size_t)T * C);
        for (size_t i = 0; i < (size_t)T * C; i++) x[i] = dsv4_bf16_to_f32(xb[i] = dsv4_f32_to_bf16(x[i]));
    }
    float *ref = malloc(sizeof(float) * (size_t)T * R), *got = malloc(sizeof(float) * (size_t)T * R);
    dsv4_cpu_linear(&h.w, x, T, ref);
    void *dx = xbf16 ? dup_to_dev(xb, sizeof(uint16_t) * (size_t)T * C) : dup_to_dev(x, sizeof(float) * (size_t)T * C);
    float *dy = dsv4_cuda_alloc(sizeof(float) * (size_t)T * R);
    op_ok(dsv4_cuda_linear(&dw, dx, xbf16, T, dy, NULL), "linear");
    sync_ok();
    from_dev(got, dy, sizeof(float) * (size_t)T * R);
    char name[128];
    snprintf(name, sizeof name, "linear %s %s%s %dx%d T=%d%s%s", tag, dsv4_wfmt_name(fmt), scale_f32 ? "(f32 s)" : "", R, C, T,
             aq ? " aq" : "", xbf16 ? " x:bf16" : "");
    /* fp32 vs double accumulation: errors ~ eps * sqrt(C) * |terms|, far below 1e-4 * rms */
    check(name, got, ref, (size_t)T * R, 1e-4 * rms(ref, (size_t)T * R), 1e-4);
    dsv4_cuda_free(dx), dsv4_cuda_free(dy), dsv4_cuda_weight_free(&dw);
    free(x), free(xb), free(ref), free(got), free_hweight(&h);
}

/* ---- norm, rope, quant ---- */

static void test_rmsnorm(int rows, int n, int ld, int weighted) {
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

static void test_rope(int T, int H, int n, int npairs, int inverse) {
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

/* kind 0: fp8, 1: fp4, 2: hadamard, 3: hadamard then fp4 (the indexer's rotation) */
static void test_quant(int kind, int rows, int n, int ld, int block) {
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

/* ---- mHC ---- */

static void test_hc(int T, int M, int D, dsv4_wfmt fmt, int iters) {
    int nr = (2 + M) * M;
    hweight fn = make_weight(fmt, nr, M * D, 0, 0), fh = make_weight(fmt, M, M * D, 0, 0);
    float *X = randn((size_t)T * M * D, 1.0f), *scale = randn(3, 0.5f), *base = randn(nr, 0.5f);
    float *rx = malloc(sizeof(float) * (size_t)T * D), *rp = malloc(sizeof(float) * (size_t)T * M),
          *rc = malloc(sizeof(float) * (size_t)T * M * M);
    float *gx = malloc(sizeof(float) * (size_t)T * D), *gp = malloc(sizeof(float) * (size_t)T * M),
          *gc = malloc(sizeof(float) * (size_t)T * M * M);
    for (int t = 0; t < T; t++)
        dsv4_cpu_hc_pre(X + (size_t)t * M * D, M, D, &fn.w, scale, base, iters, 1e-6f, 1e-6f, rx + (size_t)t * D,
                        rp + (size_t)t * M, rc + (size_t)t * M * M);
    dsv4_cuda_weight dfn, dfh;
    op_ok(dsv4_cuda_weight_upload(&fn.w, &dfn), "upload");
    op_ok(dsv4_cuda_weight_upload(&fh.w, &dfh), "upload");
    float *dX = dup_to_dev(X, sizeof(float) * (size_t)T * M * D), *ds = dup_to_dev(scale, 12), *db = dup_to_dev(base, sizeof(float) * nr);
    float *dx = dsv4_cuda_alloc(sizeof(float) * (size_t)T * D), *dp = dsv4_cuda_alloc(sizeof(float) * (size_t)T * M),
          *dc = dsv4_cuda_alloc(sizeof(float) * (size_t)T * M * M);
    op_ok(dsv4_cuda_hc_pre(dX, T, M, D, &dfn, ds, db, iters, 1e-6f, 1e-6f, dx, dp, dc, NULL), "hc_pre");
    sync_ok();
    from_dev(gx, dx, sizeof(float) * (size_t)T * D);
    from_dev(gp, dp, sizeof(float) * (size_t)T * M);
    from_dev(gc, dc, sizeof(float) * (size_t)T * M * M);
    char name[128];
    snprintf(name, sizeof name, "hc_pre x    T=%d M=%d D=%d %s it=%d", T, M, D, dsv4_wfmt_name(fmt), iters);
    check(name, gx, rx, (size_t)T * D, 1e-5 * rms(rx, (size_t)T * D), 1e-4);
    snprintf(name, sizeof name, "hc_pre post T=%d M=%d D=%d", T, M, D);
    check(name, gp, rp, (size_t)T * M, 1e-6, 1e-4);
    snprintf(name, sizeof name, "hc_pre comb T=%d M=%d D=%d", T, M, D);
    check(name, gc, rc, (size_t)T * M * M, 1e-6, 1e-4);

    /* post: f = the layer output, with the post / comb just computed (CPU ones, on both sides) */
    float *f = randn((size_t)T * D, 1.0f), *rX = malloc(sizeof(float) * (size_t)T * M * D), *gX = malloc(sizeof(float) * (size_t)T * M * D);
    memcpy(rX, X, sizeof(float) * (size_t)T * M * D);
    for (int t = 0; t < T; t++) dsv4_cpu_hc_post(f + (size_t)t * D, rX + (size_t)t * M * D, M, D, rp + (size_t)t * M, rc + (size_t)t * M * M);
    float *df = dup_to_dev(f, sizeof(float) * (size_t)T * D);
    dsv4_cuda_upload(dp, rp, sizeof(float) * (size_t)T * M);
    dsv4_cuda_upload(dc, rc, sizeof(float) * (size_t)T * M * M);
    op_ok(dsv4_cuda_hc_post(df, dX, T, M, D, dp, dc, NULL), "hc_post");
    sync_ok();
    from_dev(gX, dX, sizeof(float) * (size_t)T * M * D);
    snprintf(name, sizeof name, "hc_post T=%d M=%d D=%d", T, M, D);
    check(name, gX, rX, (size_t)T * M * D, 1e-6, 1e-5);

    /* head, on the updated streams */
    for (int t = 0; t < T; t++) dsv4_cpu_hc_head(rX + (size_t)t * M * D, M, D, &fh.w, scale, base, 1e-6f, 1e-6f, rx + (size_t)t * D);
    dsv4_cuda_upload(dX, rX, sizeof(float) * (size_t)T * M * D);
    op_ok(dsv4_cuda_hc_head(dX, T, M, D, &dfh, ds, db, 1e-6f, 1e-6f, dx, NULL), "hc_head");
    sync_ok();
    from_dev(gx, dx, sizeof(float) * (size_t)T * D);
    snprintf(name, sizeof name, "hc_head T=%d M=%d D=%d %s", T, M, D, dsv4_wfmt_name(fmt));
    check(name, gx, rx, (size_t)T * D, 1e-5 * rms(rx, (size_t)T * D), 1e-4);

    dsv4_cuda_free(dX), dsv4_cuda_free(ds), dsv4_cuda_free(db), dsv4_cuda_free(dx), dsv4_cuda_free(dp), dsv4_cuda_free(dc),
        dsv4_cuda_free(df);
    dsv4_cuda_weight_free(&dfn), dsv4_cuda_weight_free(&dfh), free_hweight(&fn), free_hweight(&fh);
    free(X), free(scale), free(base), free(rx), free(rp), free(rc), free(gx), free(gp), free(gc), free(f), free(rX), free(gX);
}

/* ---- sparse attention ---- */

/* nvalid[t] entries per token (distinct rows of a pool of N), the rest of nidx padded with -1 */
static void test_attn(int T, int H, int Dh, int N, int nidx, const int *nvalid, int bench) {
    float *q = randn((size_t)T * H * Dh, 1.0f), *kv = randn((size_t)N * Dh, 1.0f), *sink = randn(H, 1.0f);
    int *idx = malloc(sizeof(int) * (size_t)T * nidx);
    int *perm = malloc(sizeof(int) * N);
    for (int t = 0; t < T; t++) {
        for (int i = 0; i < N; i++) perm[i] = i;
        for (int i = 0; i < nidx; i++) {
            int j = i + (int)(rnd_u32() % (uint32_t)(N - i));
            int tmp = perm[i];
            perm[i] = perm[j], perm[j] = tmp;
        }
        /* valid entries scattered among the padding */
        int nv = nvalid[t];
        for (int i = 0; i < nidx; i++) idx[(size_t)t * nidx + i] = -1;
        for (int v = 0; v < nv; v++) idx[(size_t)t * nidx + (nv == nidx ? v : (int)((int64_t)v * nidx / nv))] = perm[v];
    }
    const float scale = 1.0f / sqrtf((float)Dh);
    float *ref = malloc(sizeof(float) * (size_t)T * H * Dh), *got = malloc(sizeof(float) * (size_t)T * H * Dh);
    const float **keys = malloc(sizeof(float *) * (nidx ? nidx : 1));
    for (int t = 0; t < T; t++) {
        int n = 0;
        for (int i = 0; i < nidx; i++)
            if (idx[(size_t)t * nidx + i] >= 0) keys[n++] = kv + (size_t)idx[(size_t)t * nidx + i] * Dh;
        dsv4_cpu_sparse_attn(q + (size_t)t * H * Dh, H, Dh, keys, n, sink, scale, ref + (size_t)t * H * Dh);
    }
    float *dq = dup_to_dev(q, sizeof(float) * (size_t)T * H * Dh), *dkv = dup_to_dev(kv, sizeof(float) * (size_t)N * Dh),
          *dsk = dup_to_dev(sink, sizeof(float) * H), *dout = dsv4_cuda_alloc(sizeof(float) * (size_t)T * H * Dh);
    int *didx = dup_to_dev(idx, sizeof(int) * (size_t)T * nidx);
    op_ok(dsv4_cuda_sparse_attn(dq, T, H, Dh, dkv, Dh, didx, nidx, dsk, scale, dout, NULL), "sparse_attn");
    sync_ok();
    from_dev(got, dout, sizeof(float) * (size_t)T * H * Dh);
    char name[128];
    snprintf(name, sizeof name, "sparse_attn T=%d H=%d Dh=%d nidx=%d", T, H, Dh, nidx);
    check(name, got, ref, (size_t)T * H * Dh, 1e-5 * rms(ref, (size_t)T * H * Dh), 1e-4);
    if (bench) {
        cudaEvent_t e0, e1;
        cudaEventCreate(&e0), cudaEventCreate(&e1);
        const int it = 50;
        cudaEventRecord(e0, 0);
        for (int i = 0; i < it; i++) dsv4_cuda_sparse_attn(dq, T, H, Dh, dkv, Dh, didx, nidx, dsk, scale, dout, NULL);
        cudaEventRecord(e1, 0);
        sync_ok();
        float ms;
        cudaEventElapsedTime(&ms, e0, e1);
        printf("time sparse_attn T=%d H=%d Dh=%d nidx=%d: %.1f us per call\n", T, H, Dh, nidx, 1000.0 * ms / it);
        cudaEventDestroy(e0), cudaEventDestroy(e1);
    }
    dsv4_cuda_free(dq), dsv4_cuda_free(dkv), dsv4_cuda_free(dsk), dsv4_cuda_free(dout), dsv4_cuda_free(didx);
    free(q), free(kv), free(sink), free(idx), free(perm), free(ref), free(got), free(keys);
}

/* ---- router, SwiGLU: twins copied from src/model/forward_moe.c (static there) ---- */

static float softplusf_ref(float z) { return z > 20.0f ? z : log1pf(expf(z)); }

static void swiglu_ref(float *g, const float *u, int n, float lim, float weight) {
    for (int i = 0; i < n; i++) {
        float gi = g[i], ui = u[i];
        if (lim > 0) {
            gi = fminf(gi, lim);
            ui = fminf(fmaxf(ui, -lim), lim);
        }
        g[i] = gi / (1.0f + expf(-gi)) * ui * weight;
    }
}

static int cmp_pair(const void *a, const void *b) {
    const float *x = a, *y = b;
    return (x[0] > y[0]) - (x[0] < y[0]);
}

static void test_router(int T, int E, int K, int hash) {
    const int V = 1000;
    float *lg = randn((size_t)T * E, 2.0f), *bias = randn(E, 0.1f);
    int *tok = malloc(sizeof(int) * T), *tid2eid = malloc(sizeof(int) * (size_t)V * K);
    for (int t = 0; t < T; t++) tok[t] = (int)(rnd_u32() % V);
    for (int i = 0; i < V * K; i++) tid2eid[i] = (int)(rnd_u32() % E);
    const float rsc = 1.5f;
    /* reference: (expert, weight) pairs sorted by expert, per token */
    float *ref = malloc(sizeof(float) * (size_t)T * K * 2), *got = malloc(sizeof(float) * (size_t)T * K * 2);
    float *st = malloc(sizeof(float) * E), *bs = malloc(sizeof(float) * E);
    int *sel = malloc(sizeof(int) * K);
    for (int t = 0; t < T; t++) {
        for (int e = 0; e < E; e++) st[e] = sqrtf(softplusf_ref(lg[(size_t)t * E + e]));
        if (hash) memcpy(sel, tid2eid + (size_t)tok[t] * K, sizeof(int) * K);
        else {
            for (int e = 0; e < E; e++) bs[e] = st[e] + bias[e];
            dsv4_topk_torch(bs, E, K, sel);
        }
        float sum = 0;
        for (int k = 0; k < K; k++) sum += st[sel[k]];
        for (int k = 0; k < K; k++) {
            ref[((size_t)t * K + k) * 2] = (float)sel[k];
            ref[((size_t)t * K + k) * 2 + 1] = st[sel[k]] / sum * rsc;
        }
        if (!hash) qsort(ref + (size_t)t * K * 2, K, 2 * sizeof(float), cmp_pair);
    }
    float *dlg = dup_to_dev(lg, sizeof(float) * (size_t)T * E), *db = dup_to_dev(bias, sizeof(float) * E),
          *dw = dsv4_cuda_alloc(sizeof(float) * (size_t)T * K);
    int *dtok = dup_to_dev(tok, sizeof(int) * T), *dt2e = dup_to_dev(tid2eid, sizeof(int) * (size_t)V * K),
        *dsel = dsv4_cuda_alloc(sizeof(int) * (size_t)T * K);
    op_ok(dsv4_cuda_router(dlg, T, E, K, db, hash ? dt2e : NULL, dtok, rsc, dsel, dw, NULL), "router");
    sync_ok();
    int *gsel = malloc(sizeof(int) * (size_t)T * K);
    float *gw = malloc(sizeof(float) * (size_t)T * K);
    from_dev(gsel, dsel, sizeof(int) * (size_t)T * K);
    from_dev(gw, dw, sizeof(float) * (size_t)T * K);
    for (int t = 0; t < T; t++) {
        for (int k = 0; k < K; k++) {
            got[((size_t)t * K + k) * 2] = (float)gsel[(size_t)t * K + k];
            got[((size_t)t * K + k) * 2 + 1] = gw[(size_t)t * K + k];
        }
        if (!hash) qsort(got + (size_t)t * K * 2, K, 2 * sizeof(float), cmp_pair);
    }
    char name[128];
    snprintf(name, sizeof name, "router%s T=%d E=%d K=%d (expert, weight)", hash ? " hash" : " bias-topk", T, E, K);
    check(name, got, ref, (size_t)T * K * 2, 1e-7, 1e-5);
    dsv4_cuda_free(dlg), dsv4_cuda_free(db), dsv4_cuda_free(dw), dsv4_cuda_free(dtok), dsv4_cuda_free(dt2e), dsv4_cuda_free(dsel);
    free(lg), free(bias), free(tok), free(tid2eid), free(ref), free(got), free(st), free(bs), free(sel), free(gsel), free(gw);
}

static void test_swiglu(int T, int I, int ld, float lim, int weighted) {
    float *g = randn((size_t)T * ld, 6.0f), *u = randn((size_t)T * ld, 6.0f), *rw = weighted ? randn(T, 1.0f) : NULL;
    float *ref = malloc(sizeof(float) * (size_t)T * I), *got = malloc(sizeof(float) * (size_t)T * I);
    for (int t = 0; t < T; t++) {
        memcpy(ref + (size_t)t * I, g + (size_t)t * ld, sizeof(float) * I);
        swiglu_ref(ref + (size_t)t * I, u + (size_t)t * ld, I, lim, rw ? rw[t] : 1.0f);
    }
    float *dg = dup_to_dev(g, sizeof(float) * (size_t)T * ld), *du = dup_to_dev(u, sizeof(float) * (size_t)T * ld),
          *drw = rw ? dup_to_dev(rw, sizeof(float) * T) : NULL, *dout = dsv4_cuda_alloc(sizeof(float) * (size_t)T * I);
    op_ok(dsv4_cuda_swiglu(dg, du, ld, T, I, lim, drw, dout, NULL), "swiglu");
    sync_ok();
    from_dev(got, dout, sizeof(float) * (size_t)T * I);
    char name[128];
    snprintf(name, sizeof name, "swiglu T=%d I=%d ld=%d lim=%g%s", T, I, ld, lim, weighted ? " weighted" : "");
    check(name, got, ref, (size_t)T * I, 1e-6, 4e-6); /* expf: a few ulp apart */
    dsv4_cuda_free(dg), dsv4_cuda_free(du), dsv4_cuda_free(drw), dsv4_cuda_free(dout);
    free(g), free(u), free(rw), free(ref), free(got);
}

/* ---- GEMV / GEMM timing: NR copies of one weight (> 256 MiB in all), a different copy per call ---- */

static void bench_linear(const char *tag, dsv4_wfmt fmt, int R, int C, int T, int aq) {
    hweight h = make_weight(fmt, R, C, 0, aq);
    size_t per = h.data_b + h.scale_b;
    int NR = (int)((256u << 20) / per) + 1;
    if (NR > 64) NR = 64;
    uint8_t *dd = dsv4_cuda_alloc(h.data_b * NR), *ds = h.scale_b ? dsv4_cuda_alloc(h.scale_b * NR) : NULL;
    for (int k = 0; k < NR; k++) {
        dsv4_cuda_upload(dd + h.data_b * k, h.data, h.data_b);
        if (ds) dsv4_cuda_upload(ds + h.scale_b * k, h.scale, h.scale_b);
    }
    dsv4_cuda_weight w = {fmt, R, C, 0, dd, ds, 0, h.w.scale_stride, h.w.scale2, aq};
    float *x = randn((size_t)T * C, 1.0f);
    float *dx = dup_to_dev(x, sizeof(float) * (size_t)T * C), *dy = dsv4_cuda_alloc(sizeof(float) * (size_t)T * R);
    const int it = T > 16 ? 10 : 100;
    for (int i = 0; i < 3; i++) op_ok(dsv4_cuda_linear(&w, dx, 0, T, dy, NULL), "linear");
    cudaEvent_t e0, e1;
    cudaEventCreate(&e0), cudaEventCreate(&e1);
    cudaEventRecord(e0, 0);
    for (int i = 0; i < it; i++) {
        int k = i % NR;
        w.data = dd + h.data_b * k;
        w.scale = ds ? ds + h.scale_b * k : NULL;
        dsv4_cuda_linear(&w, dx, 0, T, dy, NULL);
    }
    cudaEventRecord(e1, 0);
    sync_ok();
    float ms;
    cudaEventElapsedTime(&ms, e0, e1);
    double us = 1000.0 * ms / it, bytes = (double)dsv4_weight_bytes(&h.w);
    if (T <= 16)
        printf("time linear %-22s %s %5dx%-5d T=%-3d%s: %8.1f us  %7.1f GB/s (%4.1f%% of 4.8 TB/s)\n", tag, dsv4_wfmt_name(fmt), R, C,
               T, aq ? " aq" : "   ", us, bytes / us / 1e3, bytes / us / 1e3 / 48.0);
    else
        printf("time linear %-22s %s %5dx%-5d T=%-4d%s: %8.1f us  %7.2f TFLOP/s (fp32 FMA tiles)\n", tag, dsv4_wfmt_name(fmt), R, C,
               T, aq ? " aq" : "   ", us, 2.0 * R * C * T / us / 1e6);
    cudaEventDestroy(e0), cudaEventDestroy(e1);
    dsv4_cuda_free(dd), dsv4_cuda_free(ds), dsv4_cuda_free(dx), dsv4_cuda_free(dy), free(x), free_hweight(&h);
}

int main(int argc, char **argv) {
    int bench = !(argc > 1 && !strcmp(argv[1], "--no-bench"));
    dsv4_cuda_info info;
    char err[256];
    if (dsv4_cuda_init(0, &info, err, sizeof err)) {
        fprintf(stderr, "cuda init: %s\n", err);
        return 2;
    }
    printf("device: %s, sm_%d%d, %d SMs, %.1f GiB, L2 %d MiB, smem/block %d KiB\n", info.name, info.cc_major, info.cc_minor,
           info.sm_count, info.mem_total / 1073741824.0, info.l2_bytes >> 20, info.smem_optin >> 10);

    /* linear: every format, decode (GEMV, 16-byte path) and odd sizes (element path), prefill (GEMM) */
    test_linear("wq_a", DSV4_WF_FP8, 1024, 4096, 1, 0, 1, 0);
    test_linear("wq_b", DSV4_WF_FP8, 4096, 1024, 4, 0, 1, 0);
    test_linear("f32-scale", DSV4_WF_FP8, 512, 1024, 2, 1, 1, 0);
    test_linear("T=16", DSV4_WF_FP8, 640, 4096, 16, 0, 1, 0);
    test_linear("odd", DSV4_WF_FP8, 200, 1000, 3, 0, 1, 0);
    test_linear("odd x:bf16", DSV4_WF_FP8, 130, 520, 2, 0, 1, 1);
    test_linear("gemm", DSV4_WF_FP8, 300, 640, 37, 0, 1, 0);
    test_linear("gemm odd", DSV4_WF_FP8, 129, 1000, 70, 1, 1, 0);
    test_linear("expert w1", DSV4_WF_MXFP4, 2048, 4096, 1, 0, 0, 0);
    test_linear("expert w2", DSV4_WF_MXFP4, 4096, 2048, 8, 0, 0, 0);
    test_linear("odd", DSV4_WF_MXFP4, 100, 330, 2, 0, 0, 0);
    test_linear("gemm", DSV4_WF_MXFP4, 512, 1024, 70, 0, 0, 0);
    test_linear("expert w1", DSV4_WF_NVFP4, 2048, 4096, 1, 0, 0, 0);
    test_linear("odd rows", DSV4_WF_NVFP4, 333, 4096, 5, 0, 0, 0);
    test_linear("odd", DSV4_WF_NVFP4, 64, 200, 2, 0, 0, 0);
    test_linear("gemm", DSV4_WF_NVFP4, 256, 2048, 40, 0, 0, 0);
    test_linear("x:bf16", DSV4_WF_BF16, 1024, 4096, 1, 0, 0, 1);
    test_linear("odd", DSV4_WF_BF16, 77, 1003, 2, 0, 0, 0);
    test_linear("gemm", DSV4_WF_BF16, 129, 4096, 20, 0, 0, 0);
    test_linear("hc fn", DSV4_WF_F32, 24, 16384, 1, 0, 0, 0);
    test_linear("", DSV4_WF_F16, 256, 4096, 2, 0, 0, 0);
    test_linear("gemm", DSV4_WF_F16, 100, 300, 33, 0, 0, 0);

    test_rmsnorm(4, 4096, 4096, 1);
    test_rmsnorm(3, 1024, 1024, 1);
    test_rmsnorm(4 * 64, 512, 512, 0);
    test_rmsnorm(5, 1000, 1024, 1);
    test_rope(5, 64, 512, 32, 0);
    test_rope(5, 64, 512, 32, 1);
    test_rope(3, 64, 128, 32, 0);
    test_rope(2, 3, 70, 5, 1);
    test_quant(0, 16, 448, 512, 64);   /* window / compressed keys: first Dh - rope values */
    test_quant(0, 8, 4096, 4096, 128); /* act quant of linear inputs */
    test_quant(0, 3, 1000, 1003, 128);
    test_quant(1, 64, 128, 128, 32); /* indexer */
    test_quant(1, 5, 100, 101, 32);
    test_quant(2, 64, 128, 128, 0);
    test_quant(2, 4, 4096, 4096, 0);
    test_quant(3, 64, 128, 128, 32);
    test_quant(3, 7, 512, 512, 32);

    test_hc(3, 4, 4096, DSV4_WF_F32, 20);
    test_hc(2, 4, 1000, DSV4_WF_BF16, 3);
    test_hc(1, 3, 64, DSV4_WF_F32, 0);

    {
        int nv[3] = {640, 200, 0};
        test_attn(3, 64, 512, 3000, 640, nv, 0);
        int nv2[2] = {37, 5};
        test_attn(2, 10, 96, 50, 37, nv2, 0);
        int nv3[1] = {2048};
        test_attn(1, 64, 512, 4096, 2048, nv3, 0);
        int nv4[12] = {128, 100, 1, 128, 64, 0, 128, 128, 77, 128, 128, 3}; /* 4 heads per block */
        test_attn(12, 64, 512, 1000, 128, nv4, 0);
        int nv5[40];
        for (int i = 0; i < 40; i++) nv5[i] = i % 7 ? 128 : 50;
        test_attn(40, 64, 512, 1000, 128, nv5, 0); /* 16 heads per block */
    }
    test_router(7, 256, 6, 0);
    test_router(5, 384, 6, 0);
    test_router(4, 256, 6, 1);
    test_router(3, 37, 5, 0);
    test_swiglu(4, 2048, 2048, 10.0f, 1);
    test_swiglu(3, 1000, 1003, 0.0f, 0);

    printf("%d checks, %d failed\n", g_checks, g_fail);

    if (bench) {
        bench_linear("wq_b (q_lora -> H*Dh)", DSV4_WF_FP8, 32768, 1024, 1, 1);
        bench_linear("wq_b", DSV4_WF_FP8, 32768, 1024, 4, 1);
        bench_linear("wq_b", DSV4_WF_FP8, 32768, 1024, 8, 1);
        bench_linear("dim x 8192", DSV4_WF_FP8, 4096, 8192, 1, 1);
        bench_linear("8 experts w1 stacked", DSV4_WF_MXFP4, 16384, 4096, 1, 0);
        bench_linear("8 experts w1 stacked", DSV4_WF_MXFP4, 16384, 4096, 4, 0);
        bench_linear("one expert w1", DSV4_WF_MXFP4, 2048, 4096, 1, 0);
        bench_linear("8 experts w1 stacked", DSV4_WF_NVFP4, 16384, 4096, 1, 0);
        bench_linear("4096^2", DSV4_WF_BF16, 4096, 4096, 1, 0);
        bench_linear("4096^2", DSV4_WF_BF16, 4096, 4096, 8, 0);
        bench_linear("prefill", DSV4_WF_FP8, 4096, 4096, 512, 1);
        bench_linear("prefill", DSV4_WF_MXFP4, 2048, 4096, 512, 0);
        int nv[1] = {640}, nv8[8] = {640, 640, 640, 640, 640, 640, 640, 640};
        test_attn(1, 64, 512, 100000, 640, nv, 1);
        test_attn(8, 64, 512, 100000, 640, nv8, 1);
    }
    return g_fail ? 1 : 0;
}
