/* test_kernels.c - every op of src/cuda/cuda_backend.h against its CPU twin (src/cpu, src/quant), on
 * random inputs at DeepSeek-V4-Flash shapes (dim 4096, 64 heads x 512, rope 64, q_lora 1024, expert
 * inter 2048, indexer 64 x 128) plus odd sizes, then timings (CUDA events; GEMV GB/s against a
 * device-to-device copy measured in the same run, weights rotated through > 256 MiB so that L2 does not serve them).
 *
 * One closeness rule: |got - ref| <= atol + rtol * |ref| per element; the worst element (largest
 * |got - ref| / (atol + rtol * |ref|)) is printed; any failure makes the exit status non-zero.
 * The device-side pieces of the decode step (top-k, MoE grouping, grouped experts, attention index
 * lists, the window ring store) are checked against twins written here from their definitions in
 * src/cuda/cuda_model.h and kv_cache.h.
 * Linears and experts with BF16 activations (dsv4_cuda_weight.act_bf16) against the twin on x rounded to bf16; the FP8
 * prefill GEMM (cuBLASLt) to a bf16-level tolerance (test_linear_gemm says why).
 * Build and run: scripts/gpu_test.sh (make CUDA=1 builds build/tests/gpu/test_kernels).
 * Usage: test_kernels [--no-bench] [--only linear|gemm|multi|mt|hc|moe|moebench|topk]   (--only linear: the linear checks and timings
 * alone; --only gemm: those of the FP8 prefill GEMM alone; --only multi: those of the grouped linears, and the single ones
 * they replace; --only mt: those of the multi-token GEMM, timed against the GEMV at Flash's shapes; --only hc: those of
 * mHC pre / post / head; --only moe: the MoE grouping / expert / combine checks and the
 * experts' timings; --only moebench: the experts' timings alone; --only topk: the indexer top-k's checks and times) */
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cpu/ops.h"
#include "cpu/topk.h"
#include "cuda/cuda_backend.h"
#include "cuda/cuda_model.h"
#include "cuda/kv_cache.h"
#include "cuda/bench_cuda.h"
#include "cuda/linear_gemm.h"
#include "cuda/moe_tc.h"
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

/* x rounded to bf16 in place (round to nearest even, as the device's act_bf16 staging and torch's .to(bfloat16)) */
static void round_bf16(float *x, size_t n) {
    for (size_t i = 0; i < n; i++) x[i] = dsv4_bf16_to_f32(dsv4_f32_to_bf16(x[i]));
}

/* row0 > 0: a view of rows row0 .. row0+R-1 of a stored [row0 + R, C] weight (slices of fused tensors).
 * ab: the device weight has act_bf16 (BF16 activations); the twin is dsv4_cpu_linear on x rounded to bf16 (unless
 * aq: the act quant wins), while the device gets the fp32 x: the rounding is the kernel's. */
static void test_linear_ab(const char *tag, dsv4_wfmt fmt, int R, int C, int T, int scale_f32, int aq, int xbf16, int row0,
                           int ab) {
    hweight h = make_weight(fmt, R + row0, C, scale_f32, aq);
    h.w.row0 = row0, h.w.rows = R;
    dsv4_cuda_weight dw;
    op_ok(dsv4_cuda_weight_upload(&h.w, &dw), "weight upload");
    dw.act_bf16 = ab;
    float *x = rand_wide((size_t)T * C), *xr = malloc(sizeof(float) * (size_t)T * C);
    uint16_t *xb = NULL;
    if (xbf16) { /* the reference sees the bf16 values */
        xb = malloc(sizeof(uint16_t) * (size_t)T * C);
        for (size_t i = 0; i < (size_t)T * C; i++) x[i] = dsv4_bf16_to_f32(xb[i] = dsv4_f32_to_bf16(x[i]));
    }
    memcpy(xr, x, sizeof(float) * (size_t)T * C);
    if (ab && !aq) round_bf16(xr, (size_t)T * C);
    float *ref = malloc(sizeof(float) * (size_t)T * R), *got = malloc(sizeof(float) * (size_t)T * R);
    dsv4_cpu_linear(&h.w, xr, T, ref);
    void *dx = xbf16 ? dup_to_dev(xb, sizeof(uint16_t) * (size_t)T * C) : dup_to_dev(x, sizeof(float) * (size_t)T * C);
    float *dy = dsv4_cuda_alloc(sizeof(float) * (size_t)T * R);
    op_ok(dsv4_cuda_linear(&dw, dx, xbf16, T, dy, NULL), "linear");
    sync_ok();
    from_dev(got, dy, sizeof(float) * (size_t)T * R);
    char name[128];
    snprintf(name, sizeof name, "linear %s %s%s %dx%d%s T=%d%s%s%s", tag, dsv4_wfmt_name(fmt), scale_f32 ? "(f32 s)" : "", R, C,
             row0 ? "+view" : "", T, aq ? " aq" : "", xbf16 ? " x:bf16" : "", ab ? " act:bf16" : "");
    /* fp32 vs double accumulation: errors ~ eps * sqrt(C) * |terms|, far below 1e-4 * rms (with act_bf16 the twin
     * rounds x as the kernel does, so the same bound holds; a kernel that skipped the rounding would be ~2^-9 off) */
    check(name, got, ref, (size_t)T * R, 1e-4 * rms(ref, (size_t)T * R), 1e-4);
    dsv4_cuda_free(dx), dsv4_cuda_free(dy), dsv4_cuda_weight_free(&dw);
    free(x), free(xr), free(xb), free(ref), free(got), free_hweight(&h);
}
static void test_linear_v(const char *tag, dsv4_wfmt fmt, int R, int C, int T, int scale_f32, int aq, int xbf16, int row0) {
    test_linear_ab(tag, fmt, R, C, T, scale_f32, aq, xbf16, row0, 0);
}
static void test_linear(const char *tag, dsv4_wfmt fmt, int R, int C, int T, int scale_f32, int aq, int xbf16) {
    test_linear_v(tag, fmt, R, C, T, scale_f32, aq, xbf16, 0);
}
/* BF16 activations (act_bf16) at T = 1, 5, 16 (the tensor-core GEMV, one and two 8-token tiles) and 40 (16 rows per
 * launch; the tiled GEMM for odd sizes) */
static void test_linear_bf16act(const char *tag, dsv4_wfmt fmt, int R, int C, int row0) {
    static const int Ts[4] = {1, 5, 16, 40};
    for (int i = 0; i < 4; i++) test_linear_ab(tag, fmt, R, C, Ts[i], 0, 0, 0, row0, 1);
}

/* Bitwise the same rows whatever T (1 .. 16, and 40: prefill) and the other rows of x are, and from run to run. */
static void test_linear_invariant(const char *tag, dsv4_wfmt fmt, int R, int C, int aq, int ab) {
    hweight h = make_weight(fmt, R, C, 0, aq);
    dsv4_cuda_weight dw;
    op_ok(dsv4_cuda_weight_upload(&h.w, &dw), "weight upload");
    dw.act_bf16 = ab;
    const int T = 16, Ts[7] = {1, 2, 3, 5, 8, 9, 13}, TL = 40;
    float *x = rand_wide((size_t)TL * C);
    float *dx = dup_to_dev(x, sizeof(float) * (size_t)TL * C), *dy = dsv4_cuda_alloc(sizeof(float) * (size_t)T * R),
          *dy1 = dsv4_cuda_alloc(sizeof(float) * (size_t)TL * R);
    float *y16 = malloc(sizeof(float) * (size_t)T * R), *y1 = malloc(sizeof(float) * (size_t)TL * R);
    op_ok(dsv4_cuda_linear(&dw, dx, 0, T, dy, NULL), "linear");
    sync_ok();
    from_dev(y16, dy, sizeof(float) * (size_t)T * R);
    int bad = 0, runs = 0;
    for (int k = 0; k < 7; k++)
        for (int side = 0; side < 2; side++) {
            int Tk = Ts[k], t0 = side ? T - Tk : 0;
            op_ok(dsv4_cuda_linear(&dw, dx + (size_t)t0 * C, 0, Tk, dy1, NULL), "linear");
            sync_ok();
            from_dev(y1, dy1, sizeof(float) * (size_t)Tk * R);
            bad += memcmp(y1, y16 + (size_t)t0 * R, sizeof(float) * (size_t)Tk * R) != 0, runs++;
        }
    op_ok(dsv4_cuda_linear(&dw, dx, 0, T, dy1, NULL), "linear");
    sync_ok();
    from_dev(y1, dy1, sizeof(float) * (size_t)T * R);
    bad += memcmp(y1, y16, sizeof(float) * (size_t)T * R) != 0, runs++;
    op_ok(dsv4_cuda_linear(&dw, dx, 0, TL, dy1, NULL), "linear"); /* prefill: rows 0..15 again, row 37 below */
    sync_ok();
    from_dev(y1, dy1, sizeof(float) * (size_t)TL * R);
    bad += memcmp(y1, y16, sizeof(float) * (size_t)T * R) != 0, runs++;
    float *y37 = malloc(sizeof(float) * (size_t)R);
    op_ok(dsv4_cuda_linear(&dw, dx + (size_t)37 * C, 0, 1, dy, NULL), "linear");
    sync_ok();
    from_dev(y37, dy, sizeof(float) * (size_t)R);
    bad += memcmp(y37, y1 + (size_t)37 * R, sizeof(float) * (size_t)R) != 0, runs++;
    free(y37);
    g_checks++;
    if (bad) g_fail++;
    printf("%-4s linear %s %s %dx%d%s%s: rows bitwise equal for T = 1..16, 40 and a rerun (%d of %d calls differ)%s\n",
           bad ? "FAIL" : "ok", tag, dsv4_wfmt_name(fmt), R, C, aq ? " aq" : "", ab ? " act:bf16" : "", bad, runs, bad ? " <<<" : "");
    dsv4_cuda_free(dx), dsv4_cuda_free(dy), dsv4_cuda_free(dy1), dsv4_cuda_weight_free(&dw);
    free(x), free(y16), free(y1), free_hweight(&h);
}

/* ---- the multi-token GEMM (dsv4_cuda_linear_ws / _multi_ws, linear_bi.cu): every row bitwise the GEMV's ---- */

static void *g_lws; /* set: test_linear_multi's grouped call gets this workspace (its references stay the GEMV) */
static size_t g_lwsb;

/* dsv4_cuda_linear_ws (the multi-token GEMM from DSV4_CUDA_LINEAR_WS_MIN_T rows; more than 256: passes) against
 * dsv4_cuda_linear (the GEMV, 16 rows a launch), bitwise, and a rerun; plus the CPU twin's tolerance on a sample of rows */
static void test_linear_mt(const char *tag, dsv4_wfmt fmt, int R, int C, int T, int sf32, int aq, int ab, int xbf16, int row0) {
    hweight h = make_weight(fmt, R + row0, C, sf32, aq);
    h.w.row0 = row0, h.w.rows = R;
    dsv4_cuda_weight dw;
    op_ok(dsv4_cuda_weight_upload(&h.w, &dw), "weight upload");
    dw.act_bf16 = ab;
    const size_t xn = (size_t)T * C, yn = (size_t)T * R;
    float *x = rand_wide(xn);
    uint16_t *xb = malloc(2 * xn);
    for (size_t i = 0; i < xn; i++) x[i] = xbf16 ? dsv4_bf16_to_f32(xb[i] = dsv4_f32_to_bf16(x[i])) : x[i];
    void *dx = xbf16 ? dup_to_dev(xb, 2 * xn) : dup_to_dev(x, 4 * xn);
    float *dy0 = dsv4_cuda_alloc(4 * yn), *dy1 = dsv4_cuda_alloc(4 * yn);
    const size_t wsb = dsv4_cuda_linear_ws_bytes(T, C, 1);
    void *ws = dsv4_cuda_alloc(wsb);
    op_ok(dsv4_cuda_memset(dy1, 0xff, 4 * yn, NULL), "memset");
    op_ok(dsv4_cuda_linear(&dw, dx, xbf16, T, dy0, NULL), "linear");
    op_ok(dsv4_cuda_linear_ws(&dw, dx, xbf16, T, dy1, ws, wsb, NULL), "linear ws");
    sync_ok();
    float *y0 = malloc(4 * yn), *y1 = malloc(4 * yn);
    from_dev(y0, dy0, 4 * yn);
    from_dev(y1, dy1, 4 * yn);
    size_t nd = 0;
    for (size_t i = 0; i < yn; i++) nd += memcmp(&y0[i], &y1[i], 4) != 0;
    op_ok(dsv4_cuda_linear_ws(&dw, dx, xbf16, T, dy1, ws, wsb, NULL), "linear ws");
    sync_ok();
    from_dev(y0, dy1, 4 * yn);
    const int rerun = memcmp(y0, y1, 4 * yn) != 0;
    g_checks++;
    if (nd || rerun) g_fail++;
    printf("%-4s linear mt %s %s %dx%d%s T=%d%s%s%s: bitwise the GEMV (%zu of %zu values differ), rerun %s%s\n",
           nd || rerun ? "FAIL" : "ok", tag, dsv4_wfmt_name(fmt), R, C, row0 ? "+view" : "", T, aq ? " aq" : "",
           ab ? " act:bf16" : "", xbf16 ? " x:bf16" : "", nd, yn, rerun ? "differs" : "the same", nd || rerun ? " <<<" : "");
    /* the twin on the first and last 3 rows (the GEMV's own accuracy, checked at 1e-4 elsewhere) */
    const int ts[6] = {0, 1, 2, T - 3, T - 2, T - 1};
    float *xr = malloc(4 * (size_t)C * 6), *ref = malloc(4 * (size_t)R * 6), *got = malloc(4 * (size_t)R * 6);
    for (int i = 0; i < 6; i++) {
        memcpy(xr + (size_t)i * C, x + (size_t)ts[i] * C, 4 * (size_t)C);
        memcpy(got + (size_t)i * R, y1 + (size_t)ts[i] * R, 4 * (size_t)R);
    }
    if (ab && !aq) round_bf16(xr, (size_t)C * 6);
    dsv4_cpu_linear(&h.w, xr, 6, ref);
    char name[128];
    snprintf(name, sizeof name, "linear mt %s %s %dx%d T=%d (6 rows)", tag, dsv4_wfmt_name(fmt), R, C, T);
    check(name, got, ref, (size_t)R * 6, 1e-4 * rms(ref, (size_t)R * 6), 1e-4);
    dsv4_cuda_free(dx), dsv4_cuda_free(dy0), dsv4_cuda_free(dy1), dsv4_cuda_free(ws), dsv4_cuda_weight_free(&dw);
    free(x), free(xb), free(y0), free(y1), free(xr), free(ref), free(got), free_hweight(&h);
}

/* ---- grouped linears (dsv4_cuda_linear_multi) ---- */

typedef struct mspec {
    dsv4_wfmt fmt;
    int R, C, aq, sf32, ab; /* rows, columns, act quant, FP8 fp32 scales, BF16 activations (act_bf16) */
} mspec;

#define MJ_MAX 24

/* Flash's grouped linears, the job lists of the checks and timings below: wq_a + wkv; the compressors' wkv / wgate,
 * the indexer compressor's and weights_proj; the gate + shared w1 / w3; NVFP4 with BF16 activations; mixed formats
 * (one odd shape: the element path) */
static const mspec qkv[2] = {{DSV4_WF_FP8, 1024, 4096, 1, 0, 0}, {DSV4_WF_FP8, 512, 4096, 1, 0, 0}};
static const mspec cmp[5] = {{DSV4_WF_BF16, 1024, 4096, 0, 0, 0}, {DSV4_WF_BF16, 1024, 4096, 0, 0, 0},
                             {DSV4_WF_BF16, 256, 4096, 0, 0, 0},  {DSV4_WF_BF16, 256, 4096, 0, 0, 0},
                             {DSV4_WF_BF16, 64, 4096, 0, 0, 0}};
static const mspec moe3[3] = {{DSV4_WF_BF16, 256, 4096, 0, 0, 0}, {DSV4_WF_FP8, 2048, 4096, 1, 0, 0},
                              {DSV4_WF_FP8, 2048, 4096, 1, 0, 0}};
static const mspec nvab[2] = {{DSV4_WF_NVFP4, 1024, 4096, 0, 0, 1}, {DSV4_WF_NVFP4, 512, 4096, 0, 0, 1}};
static const mspec mix[4] = {{DSV4_WF_FP8, 1024, 4096, 1, 0, 0}, {DSV4_WF_BF16, 77, 1003, 0, 0, 0},
                             {DSV4_WF_FP8, 512, 4096, 1, 0, 0},  {DSV4_WF_MXFP4, 256, 2048, 0, 0, 0}};
/* n wo_a groups (views of one FP8 act-quant weight, 1024 rows x 4096 each) */
static void ms_wo_a(mspec *w, int n) {
    for (int i = 0; i < n; i++) w[i] = (mspec){DSV4_WF_FP8, 1024, 4096, 1, 0, 0};
}
/* 20 small BF16 jobs of three row counts (more jobs than one launch holds) */
static void ms_b20(mspec *b) {
    for (int i = 0; i < 20; i++) b[i] = (mspec){DSV4_WF_BF16, 128 + 16 * (i % 3), 1024, 0, 0, 0};
}

/* The weights of n jobs: views (the wo_a groups): rows i * R .. of one stored weight of spec 0 with n * R rows; else a
 * weight per job. Host copies in h[0 .. nh-1], the stored device weights in d, each job's in w. */
typedef struct mweights {
    int nh;
    hweight h[MJ_MAX];
    dsv4_cuda_weight d[MJ_MAX], w[MJ_MAX];
} mweights;

static void mweights_make(mweights *m, const mspec *s, int n, int views) {
    memset(m, 0, sizeof *m);
    m->nh = views ? 1 : n;
    for (int i = 0; i < m->nh; i++) {
        m->h[i] = make_weight(s[i].fmt, views ? n * s[0].R : s[i].R, s[i].C, s[i].sf32, s[i].aq);
        op_ok(dsv4_cuda_weight_upload(&m->h[i].w, &m->d[i]), "weight upload");
        m->d[i].act_bf16 = s[i].ab;
    }
    for (int i = 0; i < n; i++) {
        m->w[i] = m->d[views ? 0 : i];
        if (views) m->w[i].row0 = i * s[0].R, m->w[i].rows = s[0].R;
    }
}
static void mweights_free(mweights *m) {
    for (int i = 0; i < m->nh; i++) dsv4_cuda_weight_free(&m->d[i]), free_hweight(&m->h[i]);
}

/* x of the jobs: xs = 0: one x [T, C] for all (ldx left 0: contiguous); xs = 1: job i reads its C_i columns of a
 * [T, sum C] x at their offset. y: ys = 0: a contiguous y per job (ldy 0); ys = 1: job i writes its R_i columns of one
 * y whose rows are sum R + 3 n wide (3 columns between jobs, which must stay untouched). Sets xo / yo (element offsets),
 * *ldx, *ldy. */
static void multi_layout(const mspec *s, int n, int xs, int ys, int64_t *xo, int64_t *yo, int64_t *ldx, int64_t *ldy) {
    int64_t cx = 0, cy = 0;
    for (int i = 0; i < n; i++) {
        xo[i] = xs ? cx : 0, cx += s[i].C;
        yo[i] = ys ? cy : 0, cy += s[i].R + 3;
    }
    *ldx = xs ? cx : s[0].C;
    *ldy = cy;
}

/* dsv4_cuda_linear_multi gives each job's rows bitwise as dsv4_cuda_linear on contiguous rows does (whatever the other
 * jobs, their formats and row counts are; strided x / y; jobs the tensor-core GEMV cannot take; more jobs than one
 * launch holds), and leaves y between the jobs' columns alone. */
static void test_linear_multi(const char *tag, const mspec *s, int n, int views, int xs, int ys, int xbf16, int T) {
    mweights m;
    mweights_make(&m, s, n, views);
    int64_t xo[MJ_MAX], yo[MJ_MAX], ldx, ldy;
    multi_layout(s, n, xs, ys, xo, yo, &ldx, &ldy);
    const size_t xn = (size_t)T * ldx, es = xbf16 ? 2 : 4;
    float *x = rand_wide(xn);
    uint16_t *xb = malloc(2 * (xn ? xn : 1));
    for (size_t i = 0; i < xn; i++) xb[i] = dsv4_f32_to_bf16(x[i]);
    const void *xh = xbf16 ? (const void *)xb : (const void *)x;
    uint8_t *dx = dup_to_dev(xh, es * xn);
    float *dy[MJ_MAX], *dyc = NULL;
    const size_t yall = ys ? (size_t)T * ldy : 0;
    if (ys) {
        dyc = dsv4_cuda_alloc(4 * yall);
        op_ok(dsv4_cuda_memset(dyc, 0xff, 4 * yall, NULL), "memset");
    }
    dsv4_cuda_linear_job jb[MJ_MAX];
    for (int i = 0; i < n; i++) {
        dy[i] = ys ? dyc + yo[i] : dsv4_cuda_alloc(4 * (size_t)T * s[i].R);
        if (!ys) op_ok(dsv4_cuda_memset(dy[i], 0xff, 4 * (size_t)T * s[i].R, NULL), "memset");
        jb[i].w = m.w[i];
        jb[i].x = dx + es * (size_t)xo[i];
        jb[i].ldx = xs ? ldx : 0;
        jb[i].y = dy[i];
        jb[i].ldy = ys ? ldy : 0;
    }
    op_ok(g_lws ? dsv4_cuda_linear_multi_ws(jb, n, xbf16, T, g_lws, g_lwsb, NULL) : dsv4_cuda_linear_multi(jb, n, xbf16, T, NULL),
          "linear multi");
    sync_ok();
    int bad = 0, gap = 0;
    float *yc = ys ? malloc(4 * yall) : NULL;
    if (ys) {
        from_dev(yc, dyc, 4 * yall);
        for (int t = 0; t < T; t++)
            for (int i = 0; i < n; i++)
                for (int k = 0; k < 3; k++) {
                    uint32_t u;
                    memcpy(&u, yc + (size_t)t * ldy + yo[i] + s[i].R + k, 4);
                    gap += u != 0xffffffffu;
                }
    }
    for (int i = 0; i < n; i++) { /* the reference: the job alone, on a contiguous copy of its x */
        const int C = s[i].C, R = s[i].R;
        uint8_t *xi = malloc(es * (size_t)T * C);
        for (int t = 0; t < T; t++) memcpy(xi + es * (size_t)t * C, (const uint8_t *)xh + es * ((size_t)t * ldx + xo[i]), es * C);
        void *dxi = dup_to_dev(xi, es * (size_t)T * C);
        float *dr = dsv4_cuda_alloc(4 * (size_t)T * R), *ref = malloc(4 * (size_t)T * R), *got = malloc(4 * (size_t)T * R);
        op_ok(dsv4_cuda_linear(&m.w[i], dxi, xbf16, T, dr, NULL), "linear");
        sync_ok();
        from_dev(ref, dr, 4 * (size_t)T * R);
        if (ys)
            for (int t = 0; t < T; t++) memcpy(got + (size_t)t * R, yc + (size_t)t * ldy + yo[i], 4 * R);
        else
            from_dev(got, dy[i], 4 * (size_t)T * R);
        bad += memcmp(got, ref, 4 * (size_t)T * R) != 0;
        dsv4_cuda_free(dxi), dsv4_cuda_free(dr), free(xi), free(ref), free(got);
        if (!ys) dsv4_cuda_free(dy[i]);
    }
    g_checks++;
    if (bad || gap) g_fail++;
    char fm[96] = "";
    for (int i = 0, k = 0; i < n && k < 80; i++)
        if (!i || s[i].fmt != s[i - 1].fmt || s[i].R != s[i - 1].R || s[i].C != s[i - 1].C)
            k += snprintf(fm + k, sizeof fm - k, "%s%s %dx%d", k ? ", " : "", dsv4_wfmt_name(s[i].fmt), s[i].R, s[i].C);
    printf("%-4s linear multi%s %s (%d jobs: %s%s%s%s%s) T=%d: rows bitwise equal to dsv4_cuda_linear (%d of %d jobs differ, %d gap "
           "values written)%s\n",
           bad || gap ? "FAIL" : "ok", g_lws ? " mt" : "", tag, n, fm, views ? "; views" : "", xs ? "; x strided" : "", ys ? "; y strided" : "",
           xbf16 ? "; x:bf16" : "", T, bad, n, gap, bad || gap ? " <<<" : "");
    dsv4_cuda_free(dx), dsv4_cuda_free(dyc), free(x), free(xb), free(yc);
    mweights_free(&m);
}

static void test_linear_multi_T(const char *tag, const mspec *s, int n, int views, int xs, int ys, int xbf16) {
    static const int Ts[4] = {1, 3, 16, 40};
    for (int i = 0; i < 4; i++) test_linear_multi(tag, s, n, views, xs, ys, xbf16, Ts[i]);
}

/* FP8 act-quant prefill GEMM (linear_gemm.h, cuBLASLt block-scaled FP8) against dsv4_cpu_linear; big shapes on a sample
 * of rows (every row's act quant is its own, so a subset of x is exact), the last T % 4 rows (GEMV) always.
 * Its tolerance is bf16's, not the GEMV checks' (1e-4): Hopper's FP8 tensor cores sum the e4m3 products of each
 * 128-column block with ~14 significant bits before the block scales apply in fp32 (DeepSeek's own FP8 GEMMs promote
 * at the same interval), measured on the H200 (2026-12-01) as relative L2 1.8-2.0e-4 whatever K, worst element
 * 1.8e-3 (|ref| + rms(ref)). DeepSeek's FP8 GEMMs round their output to bf16 (spec 14.4), an error of up to 2^-8 |y|
 * per element (half a bf16 ulp at the bottom of a binade) and ~1.6e-3 relative L2 over a random output. So:
 *   every element within 2^-8 (|ref| + rms(ref)): no further than the reference recipe's own output rounding, with
 *     rms(ref) standing for the summands' size where cancellation makes |ref| small;
 *   relative L2 <= 1e-3: below the output rounding's 1.6e-3 (5x the measured error);
 *   a rerun gives the same bits. */
static void test_linear_gemm(const char *tag, int R, int C, int T, int scale_f32, int row0) {
    hweight h = make_weight(DSV4_WF_FP8, R + row0, C, scale_f32, 1);
    h.w.row0 = row0, h.w.rows = R;
    dsv4_cuda_weight dw;
    op_ok(dsv4_cuda_weight_upload(&h.w, &dw), "weight upload");
    float *x = rand_wide((size_t)T * C);
    float *dx = dup_to_dev(x, sizeof(float) * (size_t)T * C), *dy = dsv4_cuda_alloc(sizeof(float) * (size_t)T * R);
    const size_t wsb = dsv4_cuda_linear_gemm_ws_bytes(T, C, R);
    void *ws = dsv4_cuda_alloc(wsb);
    if (!dy || !ws) op_ok(-1, "gemm buffers");
    char name[128];
    snprintf(name, sizeof name, "linear gemm %s FP8%s %dx%d%s T=%d aq", tag, scale_f32 ? "(f32 s)" : "", R, C, row0 ? "+view" : "", T);
    int rc = dsv4_cuda_linear_gemm(&dw, dx, T, dy, ws, wsb, NULL);
    if (rc < 0) op_ok(rc, name);
    if (rc == 1) { /* declined (no cuBLASLt, no algorithm): a failure here, the shape was meant to take it */
        g_checks++, g_fail++;
        printf("FAIL %s: declined (not applicable) <<<\n", name);
    } else {
        sync_ok();
        float *got = malloc(sizeof(float) * (size_t)T * R);
        from_dev(got, dy, sizeof(float) * (size_t)T * R);
        /* rows checked: all when the CPU twin is cheap, else 0..3, ~32 spread rows and the last 4 */
        int *rows = malloc(sizeof(int) * (size_t)T), nr = 0;
        const int full = (double)T * R * C <= 2147483648.0, step = T / 32 > 0 ? T / 32 : 1;
        for (int t = 0; t < T; t++)
            if (full || t < 4 || t >= T - 4 || t % step == (t / step * 7) % step) rows[nr++] = t;
        float *xs = malloc(sizeof(float) * (size_t)nr * C), *ref = malloc(sizeof(float) * (size_t)nr * R),
              *gs = malloc(sizeof(float) * (size_t)nr * R);
        for (int i = 0; i < nr; i++) {
            memcpy(xs + (size_t)i * C, x + (size_t)rows[i] * C, sizeof(float) * (size_t)C);
            memcpy(gs + (size_t)i * R, got + (size_t)rows[i] * R, sizeof(float) * (size_t)R);
        }
        dsv4_cpu_linear(&h.w, xs, nr, ref);
        double e2 = 0, r2 = 0;
        for (size_t i = 0; i < (size_t)nr * R; i++) e2 += ((double)gs[i] - ref[i]) * ((double)gs[i] - ref[i]), r2 += (double)ref[i] * ref[i];
        const double rl2 = r2 > 0 ? sqrt(e2 / r2) : 0.0, bf = 1.0 / 256; /* 2^-8 */
        char cname[192];
        snprintf(cname, sizeof cname, "%s (%d of %d rows; bf16 tol)", name, nr, T);
        check(cname, gs, ref, (size_t)nr * R, bf * rms(ref, (size_t)nr * R), bf);
        const int lok = rl2 <= 1e-3;
        g_checks++, g_fail += !lok;
        printf("%-4s %s: relative L2 %.2e vs the twin (<= 1e-3)%s\n", lok ? "ok" : "FAIL", name, rl2, lok ? "" : " <<<");
        op_ok(dsv4_cuda_linear_gemm(&dw, dx, T, dy, ws, wsb, NULL) < 0, "linear gemm rerun");
        sync_ok();
        float *got2 = malloc(sizeof(float) * (size_t)T * R);
        from_dev(got2, dy, sizeof(float) * (size_t)T * R);
        const int same = !memcmp(got, got2, sizeof(float) * (size_t)T * R);
        g_checks++, g_fail += !same;
        printf("%-4s %s: rerun bitwise equal%s\n", same ? "ok" : "FAIL", name, same ? "" : " <<<");
        free(got), free(got2), free(rows), free(xs), free(ref), free(gs);
    }
    dsv4_cuda_free(dx), dsv4_cuda_free(dy), dsv4_cuda_free(ws), dsv4_cuda_weight_free(&dw);
    free(x), free_hweight(&h);
}

/* The split GEMM (linear_gemm.h: weights without act quant, x as three bf16 terms, or one for act_bf16) against
 * dsv4_cpu_linear at the GEMV checks' tolerance (1e-4: the three terms hold x to ~2^-24, the products are exact in
 * fp32, the tensor cores accumulate in fp32); x and y as slices of wider rows (ldx, ldy: the wo_a groups) with the gaps
 * of y untouched; a rerun bitwise equal. */
static void test_linear_gemm_split(const char *tag, dsv4_wfmt fmt, int R, int C, int T, int row0, int ab, int strided) {
    hweight h = make_weight(fmt, R + row0, C, 0, 0);
    h.w.row0 = row0, h.w.rows = R;
    dsv4_cuda_weight dw;
    op_ok(dsv4_cuda_weight_upload(&h.w, &dw), "weight upload");
    dw.act_bf16 = ab;
    const int64_t ldx = strided ? 3 * C : C, ldy = strided ? 2 * R + 4 : R;
    float *x = rand_wide((size_t)T * ldx), *xr = malloc(sizeof(float) * (size_t)T * C);
    for (int t = 0; t < T; t++) memcpy(xr + (size_t)t * C, x + (size_t)t * ldx + (strided ? C : 0), sizeof(float) * (size_t)C);
    if (ab) round_bf16(xr, (size_t)T * C);
    float *ref = malloc(sizeof(float) * (size_t)T * R), *got = malloc(sizeof(float) * (size_t)T * ldy),
          *got2 = malloc(sizeof(float) * (size_t)T * ldy);
    dsv4_cpu_linear(&h.w, xr, T, ref);
    float *dx = dup_to_dev(x, sizeof(float) * (size_t)T * ldx), *dy = dsv4_cuda_alloc(sizeof(float) * (size_t)T * ldy);
    const size_t wsb = dsv4_cuda_linear_gemm_split_ws_bytes(T, C, fmt == DSV4_WF_FP8 ? R : 0);
    void *ws = dsv4_cuda_alloc(wsb);
    if (!dy || !ws) op_ok(-1, "gemm buffers");
    op_ok(dsv4_cuda_fill(dy, (int64_t)T * ldy, 7.0f, NULL), "fill");
    char name[160];
    snprintf(name, sizeof name, "linear gemm split %s %s %dx%d%s T=%d%s%s", tag, dsv4_wfmt_name(fmt), R, C, row0 ? "+view" : "", T,
             ab ? " act:bf16" : "", strided ? " strided" : "");
    const float *dxs = dx + (strided ? C : 0);
    int rc = dsv4_cuda_linear_gemm_split(&dw, dxs, ldx, T, dy, ldy, ws, wsb, NULL);
    if (rc < 0) op_ok(rc, name);
    if (rc == 1) {
        g_checks++, g_fail++;
        printf("FAIL %s: declined (not applicable) <<<\n", name);
    } else {
        sync_ok();
        from_dev(got, dy, sizeof(float) * (size_t)T * ldy);
        float *gs = malloc(sizeof(float) * (size_t)T * R);
        int gap = 0;
        for (int t = 0; t < T; t++) {
            memcpy(gs + (size_t)t * R, got + (size_t)t * ldy, sizeof(float) * (size_t)R);
            for (int64_t i = R; i < ldy; i++) gap += got[(size_t)t * ldy + i] != 7.0f;
        }
        check(name, gs, ref, (size_t)T * R, 1e-4 * rms(ref, (size_t)T * R), 1e-4);
        op_ok(dsv4_cuda_linear_gemm_split(&dw, dxs, ldx, T, dy, ldy, ws, wsb, NULL) != 0, "split rerun");
        sync_ok();
        from_dev(got2, dy, sizeof(float) * (size_t)T * ldy);
        const int same = !memcmp(got, got2, sizeof(float) * (size_t)T * ldy);
        g_checks++, g_fail += !same || gap;
        printf("%-4s %s: rerun bitwise equal, %d gap values written%s\n", same && !gap ? "ok" : "FAIL", name, gap,
               same && !gap ? "" : " <<<");
        free(gs);
    }
    dsv4_cuda_free(dx), dsv4_cuda_free(dy), dsv4_cuda_free(ws), dsv4_cuda_weight_free(&dw);
    free(x), free(xr), free(ref), free(got), free(got2), free_hweight(&h);
}

/* What the GEMM must decline (so that the caller takes the GEMV): too few rows, no act quant, FP4. */
static void test_linear_gemm_declines(void) {
    hweight a = make_weight(DSV4_WF_FP8, 256, 1024, 0, 1), b = make_weight(DSV4_WF_FP8, 256, 1024, 0, 0),
            c = make_weight(DSV4_WF_MXFP4, 256, 1024, 0, 0);
    dsv4_cuda_weight da, db, dc;
    op_ok(dsv4_cuda_weight_upload(&a.w, &da) || dsv4_cuda_weight_upload(&b.w, &db) || dsv4_cuda_weight_upload(&c.w, &dc), "upload");
    const int ok = dsv4_cuda_linear_gemm_fits(&da, 64) && !dsv4_cuda_linear_gemm_fits(&da, 63) &&
                   !dsv4_cuda_linear_gemm_fits(&db, 512) && !dsv4_cuda_linear_gemm_fits(&dc, 512) &&
                   dsv4_cuda_linear_gemm(&da, NULL, 16, NULL, NULL, 0, NULL) == 1;
    g_checks++, g_fail += !ok;
    printf("%-4s linear gemm: applies to FP8 aq T >= %d only%s\n", ok ? "ok" : "FAIL", DSV4_LINEAR_GEMM_MIN_T, ok ? "" : " <<<");
    dsv4_cuda_weight_free(&da), dsv4_cuda_weight_free(&db), dsv4_cuda_weight_free(&dc);
    free_hweight(&a), free_hweight(&b), free_hweight(&c);
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

static void check_same(const char *name, const float *got, const float *ref, size_t n);

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
static void test_rope_hq4(int T, int H, int n, int npairs, int norm, int weighted) {
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

/* the fused norm + rope + FP8 quant == rmsnorm, rope, act_quant_fp8 launched one after the other (bitwise) */
static void test_norm_rope_q8(int T, int H, int n, int npairs, int weighted, int qn, int qb) {
    prep_case c = prep_new(T, H, n, npairs, weighted);
    op_ok(dsv4_cuda_rmsnorm(c.da, T * H, n, n, c.dw, 1e-6f, NULL), "rmsnorm");
    op_ok(dsv4_cuda_rope(c.da, T, H, n, npairs, c.df, c.dp, 0, NULL), "rope");
    if (qb > 0) op_ok(dsv4_cuda_act_quant_fp8(c.da, T * H, qn, n, qb, NULL), "act_quant_fp8");
    op_ok(dsv4_cuda_norm_rope_q8(c.db, T, H, n, c.dw, 1e-6f, npairs, c.df, c.dp, qn, qb, NULL), "norm_rope_q8");
    char name[128];
    snprintf(name, sizeof name, "norm_rope_q8 T=%d H=%d n=%d pairs=%d %s qn=%d qb=%d", T, H, n, npairs, weighted ? "w" : "-", qn, qb);
    prep_done(&c, name);
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

/* bitwise comparison (a count of differing elements is printed) */
static void check_same(const char *name, const float *got, const float *ref, size_t n) {
    size_t nbad = 0;
    for (size_t i = 0; i < n; i++) nbad += memcmp(got + i, ref + i, sizeof(float)) != 0;
    g_checks++;
    if (nbad) g_fail++;
    printf("%-4s %-44s n=%-9zu %zu elements differ (bitwise)%s\n", nbad ? "FAIL" : "ok", name, n, nbad, nbad ? " <<<" : "");
}

static void test_hc(int T, int M, int D, dsv4_wfmt fmt, int iters) {
    int nr = (2 + M) * M;
    hweight fn = make_weight(fmt, nr, M * D, 0, 0), fh = make_weight(fmt, M, M * D, 0, 0);
    float *X = randn((size_t)T * M * D, 1.0f), *scale = randn(3, 0.5f), *base = randn(nr, 0.5f), *nw = randn(D, 1.0f);
    float *rx = malloc(sizeof(float) * (size_t)T * D), *rp = malloc(sizeof(float) * (size_t)T * M),
          *rc = malloc(sizeof(float) * (size_t)T * M * M);
    float *gx = malloc(sizeof(float) * (size_t)T * D), *gp = malloc(sizeof(float) * (size_t)T * M),
          *gc = malloc(sizeof(float) * (size_t)T * M * M);
    float *g2 = malloc(sizeof(float) * (size_t)T * D), *g3 = malloc(sizeof(float) * (size_t)T * M * M);
    for (int t = 0; t < T; t++)
        dsv4_cpu_hc_pre(X + (size_t)t * M * D, M, D, &fn.w, scale, base, iters, 1e-6f, 1e-6f, rx + (size_t)t * D,
                        rp + (size_t)t * M, rc + (size_t)t * M * M);
    dsv4_cuda_weight dfn, dfh;
    op_ok(dsv4_cuda_weight_upload(&fn.w, &dfn), "upload");
    op_ok(dsv4_cuda_weight_upload(&fh.w, &dfh), "upload");
    float *dX = dup_to_dev(X, sizeof(float) * (size_t)T * M * D), *ds = dup_to_dev(scale, 12), *db = dup_to_dev(base, sizeof(float) * nr);
    float *dnw = dup_to_dev(nw, sizeof(float) * D), *dx2 = dsv4_cuda_alloc(sizeof(float) * (size_t)T * D);
    float *dx = dsv4_cuda_alloc(sizeof(float) * (size_t)T * D), *dp = dsv4_cuda_alloc(sizeof(float) * (size_t)T * M),
          *dc = dsv4_cuda_alloc(sizeof(float) * (size_t)T * M * M);
    void *scr = dsv4_cuda_alloc(dsv4_cuda_hc_scratch_bytes(T, M, D));
    op_ok(dsv4_cuda_hc_pre(dX, T, M, D, &dfn, ds, db, iters, 1e-6f, 1e-6f, NULL, dx, dp, dc, scr, NULL), "hc_pre");
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

    /* the reference Sinkhorn / pre weights on one thread (flag 1) and plain launches (flag 2): the same bits */
    for (int fl = 1; fl <= 2; fl++) {
        dsv4_cuda_hc_test_flags = fl;
        op_ok(dsv4_cuda_hc_pre(dX, T, M, D, &dfn, ds, db, iters, 1e-6f, 1e-6f, NULL, dx2, dp, dc, scr, NULL), "hc_pre");
        sync_ok();
        dsv4_cuda_hc_test_flags = 0;
        from_dev(g2, dx2, sizeof(float) * (size_t)T * D);
        from_dev(g3, dc, sizeof(float) * (size_t)T * M * M);
        snprintf(name, sizeof name, "hc_pre x    T=%d M=%d %s", T, M, fl == 1 ? "serial Sinkhorn" : "no PDL");
        check_same(name, g2, gx, (size_t)T * D);
        snprintf(name, sizeof name, "hc_pre comb T=%d M=%d %s", T, M, fl == 1 ? "serial Sinkhorn" : "no PDL");
        check_same(name, g3, gc, (size_t)T * M * M);
        from_dev(g3, dp, sizeof(float) * (size_t)T * M);
        snprintf(name, sizeof name, "hc_pre post T=%d M=%d %s", T, M, fl == 1 ? "serial Sinkhorn" : "no PDL");
        check_same(name, g3, gp, (size_t)T * M);
    }

    /* batch invariance: tokens alone (T = 1) and in slices of 8 give the bits of the whole batch */
    {
        int bad = 0, runs = 0;
        const int tl[3] = {0, T / 2, T - 1};
        for (int k = 0; k < 3 + (T >= 8) * 2; k++) {
            int t0 = k < 3 ? tl[k] : k == 3 ? 0 : T - 8, n = k < 3 ? 1 : 8;
            op_ok(dsv4_cuda_hc_pre(dX + (size_t)t0 * M * D, n, M, D, &dfn, ds, db, iters, 1e-6f, 1e-6f, NULL, dx2, dp, dc, scr, NULL),
                  "hc_pre");
            sync_ok();
            from_dev(g2, dx2, sizeof(float) * (size_t)n * D);
            from_dev(g3, dc, sizeof(float) * (size_t)n * M * M);
            bad += memcmp(g2, gx + (size_t)t0 * D, sizeof(float) * (size_t)n * D) != 0;
            bad += memcmp(g3, gc + (size_t)t0 * M * M, sizeof(float) * (size_t)n * M * M) != 0;
            from_dev(g3, dp, sizeof(float) * (size_t)n * M);
            bad += memcmp(g3, gp + (size_t)t0 * M, sizeof(float) * (size_t)n * M) != 0, runs += 3;
        }
        g_checks++;
        if (bad) g_fail++;
        printf("%-4s hc_pre batch invariance T=%d M=%d D=%d: %d of %d slices differ%s\n", bad ? "FAIL" : "ok", T, M, D, bad, runs,
               bad ? " <<<" : "");
    }
    /* the fused RMSNorm: bitwise the unfused x then dsv4_cuda_rmsnorm; near the twins in sequence */
    op_ok(dsv4_cuda_rmsnorm(dx, T, D, D, dnw, 1e-6f, NULL), "rmsnorm");
    op_ok(dsv4_cuda_hc_pre(dX, T, M, D, &dfn, ds, db, iters, 1e-6f, 1e-6f, dnw, dx2, dp, dc, scr, NULL), "hc_pre");
    sync_ok();
    from_dev(gx, dx, sizeof(float) * (size_t)T * D);
    from_dev(g2, dx2, sizeof(float) * (size_t)T * D);
    snprintf(name, sizeof name, "hc_pre+norm = hc_pre, rmsnorm T=%d D=%d", T, D);
    check_same(name, g2, gx, (size_t)T * D);
    /* the norm scales column d of token t by rn_t * nw[d] (|nw| reaches ~4x its rms): both sides are divided by the CPU's
     * rn_t * nw[d] and held to the pre-norm x check's tolerance (1e-5 rms + 1e-4 |ref|): that error carried through the
     * norm (without the division, a column with a large weight turned the absolute part into ~1.5x the bar) */
    const double xrms = rms(rx, (size_t)T * D);
    for (int t = 0; t < T; t++) {
        float *r = rx + (size_t)t * D, *gg = g2 + (size_t)t * D;
        double ss = 0;
        for (int d = 0; d < D; d++) ss += (double)r[d] * r[d];
        const double rn = 1.0 / sqrt(ss / D + 1e-6);
        dsv4_cpu_rmsnorm(r, D, nw, 1e-6f);
        for (int d = 0; d < D; d++) {
            const double k = rn * nw[d];
            if (fabs(k) > 1e-30) r[d] = (float)(r[d] / k), gg[d] = (float)(gg[d] / k);
        }
    }
    snprintf(name, sizeof name, "hc_pre+norm x T=%d M=%d D=%d (/ rn nw)", T, M, D);
    check(name, g2, rx, (size_t)T * D, 1e-5 * xrms, 1e-4);

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
    op_ok(dsv4_cuda_hc_head(dX, T, M, D, &dfh, ds, db, 1e-6f, 1e-6f, NULL, dx, scr, NULL), "hc_head");
    sync_ok();
    from_dev(gx, dx, sizeof(float) * (size_t)T * D);
    snprintf(name, sizeof name, "hc_head T=%d M=%d D=%d %s", T, M, D, dsv4_wfmt_name(fmt));
    check(name, gx, rx, (size_t)T * D, 1e-5 * rms(rx, (size_t)T * D), 1e-4);
    {
        int bad = 0;
        const int t0 = T / 2;
        op_ok(dsv4_cuda_hc_head(dX + (size_t)t0 * M * D, 1, M, D, &dfh, ds, db, 1e-6f, 1e-6f, NULL, dx2, scr, NULL), "hc_head");
        sync_ok();
        from_dev(g2, dx2, sizeof(float) * D);
        bad = memcmp(g2, gx + (size_t)t0 * D, sizeof(float) * D) != 0;
        g_checks++;
        if (bad) g_fail++;
        printf("%-4s hc_head batch invariance T=%d (token %d alone)%s\n", bad ? "FAIL" : "ok", T, t0, bad ? " <<<" : "");
    }
    op_ok(dsv4_cuda_rmsnorm(dx, T, D, D, dnw, 1e-6f, NULL), "rmsnorm");
    op_ok(dsv4_cuda_hc_head(dX, T, M, D, &dfh, ds, db, 1e-6f, 1e-6f, dnw, dx2, scr, NULL), "hc_head");
    sync_ok();
    from_dev(gx, dx, sizeof(float) * (size_t)T * D);
    from_dev(g2, dx2, sizeof(float) * (size_t)T * D);
    snprintf(name, sizeof name, "hc_head+norm = hc_head, rmsnorm T=%d D=%d", T, D);
    check_same(name, g2, gx, (size_t)T * D);

    dsv4_cuda_free(dX), dsv4_cuda_free(ds), dsv4_cuda_free(db), dsv4_cuda_free(dx), dsv4_cuda_free(dp), dsv4_cuda_free(dc),
        dsv4_cuda_free(df), dsv4_cuda_free(dnw), dsv4_cuda_free(dx2), dsv4_cuda_free(scr);
    dsv4_cuda_weight_free(&dfn), dsv4_cuda_weight_free(&dfh), free_hweight(&fn), free_hweight(&fh);
    free(X), free(scale), free(base), free(nw), free(rx), free(rp), free(rc), free(gx), free(gp), free(gc), free(g2), free(g3),
        free(f), free(rX), free(gX);
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

/* ---- device top-k (twin: the CPU engine's indexer selection: dsv4_topk_torch of the first nlist
 * scores, k' = min(k, nlist), picks >= ncausal dropped) ---- */

/* T rows of ld scores; row t ranks nlist[t] entries of which ncausal[t] are real (the rest -inf, as the
 * masked prefill list); levels > 0: scores from that many values (many exact ties), else continuous */
static void test_topk(int T, int ld, int k, int levels) {
    float *sc = malloc(sizeof(float) * (size_t)T * ld);
    int *nl = malloc(sizeof(int) * T), *nc = malloc(sizeof(int) * T), *tmp = malloc(sizeof(int) * (size_t)(k + ld));
    for (int t = 0; t < T; t++) {
        nl[t] = t == 0 ? ld : t == 1 ? 0 : t == 2 ? (k > 1 && k - 1 < ld ? k - 1 : ld) : 1 + (int)(rnd_u32() % (uint32_t)ld);
        nc[t] = t % 3 == 2 ? (int)(rnd_u32() % (uint32_t)(nl[t] + 1)) : nl[t]; /* some rows with masked entries */
        for (int i = 0; i < ld; i++) {
            float v = levels > 0 ? (float)(int)(rnd_uni() * levels) - levels / 2 : rnd_n();
            if (levels > 0 && rnd_uni() < 0.3f) v = 0.0f;
            sc[(size_t)t * ld + i] = i < nc[t] ? v : -INFINITY;
        }
    }
    size_t nout = (size_t)T * (k + 1);
    float *ref = calloc(nout, sizeof(float)), *got = calloc(nout, sizeof(float));
    for (int t = 0; t < T; t++) {
        int kk = k < nl[t] ? k : nl[t], kept = 0;
        if (kk > 0) dsv4_topk_torch(sc + (size_t)t * ld, nl[t], kk, tmp);
        for (int i = 0; i < kk; i++)
            if (tmp[i] < nc[t]) ref[(size_t)t * (k + 1) + 1 + kept++] = (float)tmp[i];
        ref[(size_t)t * (k + 1)] = (float)kept;
    }
    float *dsc = dup_to_dev(sc, sizeof(float) * (size_t)T * ld);
    int *dnl = dup_to_dev(nl, sizeof(int) * T), *dnc = dup_to_dev(nc, sizeof(int) * T);
    int *dsel = dsv4_cuda_alloc(sizeof(int) * (size_t)T * k), *dnsel = dsv4_cuda_alloc(sizeof(int) * T);
    void *scratch = dsv4_cuda_alloc((size_t)8 * T * ld);
    op_ok(dsv4_cuda_topk(dsc, T, ld, dnl, dnc, k, dsel, dnsel, scratch, NULL), "topk");
    sync_ok();
    int *sel = malloc(sizeof(int) * (size_t)T * k), *nsel = malloc(sizeof(int) * T);
    from_dev(sel, dsel, sizeof(int) * (size_t)T * k);
    from_dev(nsel, dnsel, sizeof(int) * T);
    for (int t = 0; t < T; t++) {
        got[(size_t)t * (k + 1)] = (float)nsel[t];
        for (int i = 0; i < nsel[t] && i < k; i++) got[(size_t)t * (k + 1) + 1 + i] = (float)sel[(size_t)t * k + i];
    }
    char name[128];
    snprintf(name, sizeof name, "topk T=%d n<=%d k=%d %s (exact, torch order)", T, ld, k, levels ? "ties" : "distinct");
    check(name, got, ref, nout, 0, 0);
    { /* the time of a launch (ties: the one-thread path in shared memory up to 8192 entries a row, else in the scratch) */
        cudaEvent_t e0, e1;
        cudaEventCreate(&e0), cudaEventCreate(&e1);
        cudaEventRecord(e0, 0);
        for (int i = 0; i < 5; i++) dsv4_cuda_topk(dsc, T, ld, dnl, dnc, k, dsel, dnsel, scratch, NULL);
        cudaEventRecord(e1, 0);
        sync_ok();
        float ms = 0;
        cudaEventElapsedTime(&ms, e0, e1);
        printf("time topk T=%d n<=%d k=%d %s: %.1f us\n", T, ld, k, levels ? "ties" : "distinct", 1000.0 * ms / 5);
        cudaEventDestroy(e0), cudaEventDestroy(e1);
    }
    dsv4_cuda_free(dsc), dsv4_cuda_free(dnl), dsv4_cuda_free(dnc), dsv4_cuda_free(dsel), dsv4_cuda_free(dnsel),
        dsv4_cuda_free(scratch);
    free(sc), free(nl), free(nc), free(tmp), free(ref), free(got), free(sel), free(nsel);
}

/* ---- MoE grouping (twin: the definition in cuda_model.h) ---- */

typedef struct {
    int nact, *act_e, *act_off, *act_cnt, *rows, *tslot;
    float *rw;
} hplan;

static int pick_used_ref(const int *sel, const int *sid, int t, int k, int K, int E) {
    if (sid[t] < 0) return -1;
    int e = sel[t * K + k];
    if (e < 0 || e >= E) return -1;
    for (int j = 0; j < k; j++)
        if (sel[t * K + j] == e) return -1;
    return e;
}

static void group_ref(const int *sel, const float *w, const int *sid, int T, int K, int E, hplan *p) {
    int *cnt = calloc((size_t)E, sizeof(int)), *base = calloc((size_t)E, sizeof(int)), *fill = calloc((size_t)E, sizeof(int));
    for (int t = 0; t < T; t++)
        for (int k = 0; k < K; k++) {
            int e = pick_used_ref(sel, sid, t, k, K, E);
            if (e >= 0) cnt[e]++;
        }
    p->nact = 0;
    for (int e = 0, o = 0; e < E; e++) {
        base[e] = o;
        if (cnt[e]) p->act_e[p->nact] = e, p->act_off[p->nact] = o, p->act_cnt[p->nact] = cnt[e], p->nact++;
        o += cnt[e];
    }
    for (int t = 0; t < T; t++) {
        int ns = 0, sl[64];
        for (int k = 0; k < K; k++) {
            int e = pick_used_ref(sel, sid, t, k, K, E);
            if (e < 0) continue;
            int slot = base[e] + fill[e]++;
            p->rows[slot] = t, p->rw[slot] = w[t * K + k];
            int i = ns++;
            while (i > 0 && sl[i - 1] > slot) sl[i] = sl[i - 1], i--;
            sl[i] = slot;
        }
        for (int k = 0; k < K; k++) p->tslot[t * K + k] = k < ns ? sl[k] : -1;
    }
    free(cnt), free(base), free(fill);
}

static hplan hplan_new(int T, int K, int E) {
    hplan p = {0, calloc(E, sizeof(int)), calloc(E, sizeof(int)), calloc(E, sizeof(int)), calloc((size_t)T * K, sizeof(int)),
               calloc((size_t)T * K, sizeof(int)), calloc((size_t)T * K, sizeof(float))};
    return p;
}
static void hplan_free(hplan *p) { free(p->act_e), free(p->act_off), free(p->act_cnt), free(p->rows), free(p->tslot), free(p->rw); }

static dsv4_cuda_moe_plan dplan_new(int T, int K, int E) {
    dsv4_cuda_moe_plan p = {dsv4_cuda_alloc(sizeof(int)), dsv4_cuda_alloc(sizeof(int) * E), dsv4_cuda_alloc(sizeof(int) * E),
                            dsv4_cuda_alloc(sizeof(int) * E), dsv4_cuda_alloc(sizeof(int) * (size_t)T * K),
                            dsv4_cuda_alloc(sizeof(int) * (size_t)T * K), dsv4_cuda_alloc(sizeof(float) * (size_t)T * K)};
    return p;
}
static void dplan_free(dsv4_cuda_moe_plan *p) {
    dsv4_cuda_free(p->nact), dsv4_cuda_free(p->act_e), dsv4_cuda_free(p->act_off), dsv4_cuda_free(p->act_cnt);
    dsv4_cuda_free(p->rows), dsv4_cuda_free(p->tslot), dsv4_cuda_free(p->rw);
}

/* random picks: some repeated within a token, some out of range, some tokens idle */
static void rand_picks(int T, int K, int E, int *sel, float *w, int *sid) {
    for (int t = 0; t < T; t++) {
        sid[t] = rnd_uni() < 0.15f && T > 1 ? -1 : t;
        for (int k = 0; k < K; k++) {
            float u = rnd_uni();
            sel[t * K + k] = u < 0.05f ? -1 : u < 0.12f && k ? sel[t * K + k - 1] : (int)(rnd_u32() % (uint32_t)E);
            w[t * K + k] = 0.1f + rnd_uni();
        }
    }
}

static void test_moe_group(int T, int K, int E) {
    int *sel = malloc(sizeof(int) * (size_t)T * K), *sid = malloc(sizeof(int) * T);
    float *w = malloc(sizeof(float) * (size_t)T * K);
    rand_picks(T, K, E, sel, w, sid);
    hplan r = hplan_new(T, K, E), g = hplan_new(T, K, E);
    group_ref(sel, w, sid, T, K, E, &r);
    int *dsel = dup_to_dev(sel, sizeof(int) * (size_t)T * K), *dsid = dup_to_dev(sid, sizeof(int) * T);
    float *dw = dup_to_dev(w, sizeof(float) * (size_t)T * K);
    dsv4_cuda_moe_plan dp = dplan_new(T, K, E);
    op_ok(dsv4_cuda_moe_group(dsel, dw, dsid, T, K, E, &dp, NULL), "moe_group");
    sync_ok();
    from_dev(&g.nact, dp.nact, sizeof(int));
    int na = g.nact >= 0 && g.nact <= E ? g.nact : 0, ns = 0;
    from_dev(g.act_e, dp.act_e, sizeof(int) * na), from_dev(g.act_off, dp.act_off, sizeof(int) * na);
    from_dev(g.act_cnt, dp.act_cnt, sizeof(int) * na), from_dev(g.tslot, dp.tslot, sizeof(int) * (size_t)T * K);
    for (int a = 0; a < r.nact; a++) ns += r.act_cnt[a];
    from_dev(g.rows, dp.rows, sizeof(int) * ns), from_dev(g.rw, dp.rw, sizeof(float) * ns);
    /* everything as one float vector: nact, the active lists, rows, weights, tslot */
    size_t n = 1 + 3 * (size_t)E + 2 * (size_t)ns + (size_t)T * K, o = 0;
    float *vr = calloc(n, sizeof(float)), *vg = calloc(n, sizeof(float));
    vr[o] = (float)r.nact, vg[o++] = (float)g.nact;
    for (int a = 0; a < E; a++, o += 3) {
        if (a < r.nact) vr[o] = (float)r.act_e[a], vr[o + 1] = (float)r.act_off[a], vr[o + 2] = (float)r.act_cnt[a];
        if (a < na) vg[o] = (float)g.act_e[a], vg[o + 1] = (float)g.act_off[a], vg[o + 2] = (float)g.act_cnt[a];
    }
    for (int i = 0; i < ns; i++, o += 2) vr[o] = (float)r.rows[i], vr[o + 1] = r.rw[i], vg[o] = (float)g.rows[i], vg[o + 1] = g.rw[i];
    for (int i = 0; i < T * K; i++, o++) vr[o] = (float)r.tslot[i], vg[o] = (float)g.tslot[i];
    char name[128];
    snprintf(name, sizeof name, "moe_group T=%d K=%d E=%d (%d active, exact)", T, K, E, r.nact);
    check(name, vg, vr, n, 0, 0);
    dsv4_cuda_free(dsel), dsv4_cuda_free(dsid), dsv4_cuda_free(dw), dplan_free(&dp);
    hplan_free(&r), hplan_free(&g), free(sel), free(sid), free(w), free(vr), free(vg);
}

/* Pro's 384 experts: the largest group whose token bitmaps fit in shared memory (forward_cuda.c splits a pass into
 * groups of at most that many tokens), exact there, and a clean error one group size past it; Flash's 256 experts take
 * the whole 4096. */
static void test_moe_group_limit(void) {
    const int gmax = dsv4_cuda_moe_group_maxt(6, 384), gflash = dsv4_cuda_moe_group_maxt(6, 256);
    const int ok = gmax >= 2048 && gmax < DSV4_MOE_GROUP_MAXT && gmax % 32 == 0 && gflash == DSV4_MOE_GROUP_MAXT;
    g_checks++, g_fail += !ok;
    printf("%-4s moe_group_maxt: %d tokens for 384 experts, %d for 256%s\n", ok ? "ok" : "FAIL", gmax, gflash, ok ? "" : " <<<");
    if (!ok || gmax + 32 > DSV4_MOE_GROUP_MAXT) return;
    test_moe_group(gmax, 6, 384);
    const int T = gmax + 32, K = 6, E = 384;
    int *sel = malloc(sizeof(int) * (size_t)T * K), *sid = malloc(sizeof(int) * T);
    float *w = malloc(sizeof(float) * (size_t)T * K);
    rand_picks(T, K, E, sel, w, sid);
    int *dsel = dup_to_dev(sel, sizeof(int) * (size_t)T * K), *dsid = dup_to_dev(sid, sizeof(int) * T);
    float *dw = dup_to_dev(w, sizeof(float) * (size_t)T * K);
    dsv4_cuda_moe_plan dp = dplan_new(T, K, E);
    const int rc = dsv4_cuda_moe_group(dsel, dw, dsid, T, K, E, &dp, NULL);
    const char *msg = dsv4_cuda_last_error();
    const int clean = rc != 0 && msg && strstr(msg, "do not fit");
    sync_ok();
    g_checks++, g_fail += !clean;
    printf("%-4s moe_group T=%d E=%d refused: %s%s\n", clean ? "ok" : "FAIL", T, E, msg ? msg : "(no message)", clean ? "" : " <<<");
    dsv4_cuda_free(dsel), dsv4_cuda_free(dsid), dsv4_cuda_free(dw), dplan_free(&dp), free(sel), free(sid), free(w);
}

/* ---- grouped experts + combine (twin: per token, its distinct experts in increasing id:
 * SwiGLU(x w1, x w3) * weight, then w2, summed; then + shared) ---- */

/* ab: the weights have act_bf16 (BF16 activations): the twin rounds x and h to bf16 before their products */
static void test_moe_experts(const char *tag, dsv4_wfmt f13, dsv4_wfmt f2, int aq, int ab, int T, int K, int E, int D, int I) {
    const float lim = 10.0f;
    hweight *h1 = malloc(sizeof(hweight) * E), *h3 = malloc(sizeof(hweight) * E), *h2 = malloc(sizeof(hweight) * E);
    dsv4_cuda_weight *d1 = malloc(sizeof(dsv4_cuda_weight) * E), *d3 = malloc(sizeof(dsv4_cuda_weight) * E),
                     *d2 = malloc(sizeof(dsv4_cuda_weight) * E);
    for (int e = 0; e < E; e++) {
        h1[e] = make_weight(f13, I, D, 0, aq), h3[e] = make_weight(f13, I, D, 0, aq), h2[e] = make_weight(f2, D, I, 0, aq);
        op_ok(dsv4_cuda_weight_upload(&h1[e].w, &d1[e]), "upload");
        op_ok(dsv4_cuda_weight_upload(&h3[e].w, &d3[e]), "upload");
        op_ok(dsv4_cuda_weight_upload(&h2[e].w, &d2[e]), "upload");
        d1[e].act_bf16 = d3[e].act_bf16 = d2[e].act_bf16 = ab;
    }
    dsv4_cuda_experts ex;
    op_ok(dsv4_cuda_experts_init(&ex, d1, d3, d2, E), "experts_init");
    int *sel = malloc(sizeof(int) * (size_t)T * K), *sid = malloc(sizeof(int) * T);
    float *w = malloc(sizeof(float) * (size_t)T * K), *x = randn((size_t)T * D, 1.0f), *sh = randn((size_t)T * D, 0.5f);
    rand_picks(T, K, E, sel, w, sid);
    int *dsel = dup_to_dev(sel, sizeof(int) * (size_t)T * K), *dsid = dup_to_dev(sid, sizeof(int) * T);
    float *dw = dup_to_dev(w, sizeof(float) * (size_t)T * K), *dx = dup_to_dev(x, sizeof(float) * (size_t)T * D),
          *dsh = dup_to_dev(sh, sizeof(float) * (size_t)T * D), *dh = dsv4_cuda_alloc(sizeof(float) * (size_t)T * K * I),
          *dy = dsv4_cuda_alloc(sizeof(float) * (size_t)T * K * D), *dout = dsv4_cuda_alloc(sizeof(float) * (size_t)T * D);
    dsv4_cuda_moe_plan dp = dplan_new(T, K, E);
    op_ok(dsv4_cuda_moe_group(dsel, dw, dsid, T, K, E, &dp, NULL), "moe_group");
    op_ok(dsv4_cuda_moe_experts(&ex, dx, T, K, &dp, lim, dh, dy, NULL), "moe_experts");
    op_ok(dsv4_cuda_moe_combine(dy, dp.tslot, T, K, D, dsh, dout, NULL), "moe_combine");
    sync_ok();
    float *ref = malloc(sizeof(float) * (size_t)T * D), *got = malloc(sizeof(float) * (size_t)T * D);
    from_dev(got, dout, sizeof(float) * (size_t)T * D);
    char name[160];
    snprintf(name, sizeof name, "moe_experts %s %s/%s%s%s T=%d K=%d E=%d D=%d I=%d (%s path)", tag, dsv4_wfmt_name(f13),
             dsv4_wfmt_name(f2), aq ? " aq" : "", ab ? " act:bf16" : "", T, K, E, D, I, ex.vec13 && ex.vec2 ? "vector" : "element");
    /* reference */
    float *g = malloc(sizeof(float) * I), *u = malloc(sizeof(float) * I), *y = malloc(sizeof(float) * D);
    if (!ab && !aq) { /* nothing rounded between the two projections: the twin's own h */
        for (int t = 0; t < T; t++) {
            float *o = ref + (size_t)t * D;
            memset(o, 0, sizeof(float) * D);
            for (int e = 0; e < E; e++) {
                int k = 0;
                for (; k < K; k++)
                    if (pick_used_ref(sel, sid, t, k, K, E) == e) break;
                if (k == K) continue;
                dsv4_cpu_linear(&h1[e].w, x + (size_t)t * D, 1, g);
                dsv4_cpu_linear(&h3[e].w, x + (size_t)t * D, 1, u);
                swiglu_ref(g, u, I, lim, w[t * K + k]);
                dsv4_cpu_linear(&h2[e].w, g, 1, y);
                for (int d = 0; d < D; d++) o[d] += y[d];
            }
            for (int d = 0; d < D; d++) o[d] += sh[(size_t)t * D + d];
        }
    } else if (aq) {
        /* FP8 act quant (x and h quantized in blocks of 128 before their products): the down projection's twin
         * quantizes the device's h, not its own, which may sit on the other side of an e4m3 rounding boundary (a whole
         * step on one term: 3.5 on an output of 1215, 1.3x the bar, once the inputs changed in session 4). With 16 or
         * more rows per expert the device replaces h by its codes in place, so h comes from each token run alone (T = 1:
         * h stays fp32; the experts are batch invariant, so it is the batch's h bit for bit) and is checked against the
         * twin's own h. Each token's experts in increasing id, as the combine sums them. */
        hplan r = hplan_new(1, K, E);
        dsv4_cuda_moe_plan p1 = dplan_new(1, K, E);
        int *ds1 = dsv4_cuda_alloc(sizeof(int) * K), *di1 = dsv4_cuda_alloc(sizeof(int));
        float *dw1 = dsv4_cuda_alloc(sizeof(float) * K), *dh1 = dsv4_cuda_alloc(sizeof(float) * (size_t)K * I),
              *dy1 = dsv4_cuda_alloc(sizeof(float) * (size_t)K * D);
        float *h1g = malloc(sizeof(float) * (size_t)K * I), *hg = malloc(sizeof(float) * ((size_t)T * K * I + 1)),
              *hr = malloc(sizeof(float) * ((size_t)T * K * I + 1));
        size_t nh = 0;
        for (int t = 0; t < T; t++) {
            float *o = ref + (size_t)t * D;
            memset(o, 0, sizeof(float) * D);
            group_ref(sel + (size_t)t * K, w + (size_t)t * K, sid + t, 1, K, E, &r);
            if (r.nact) {
                op_ok(dsv4_cuda_upload(ds1, sel + (size_t)t * K, sizeof(int) * K) || dsv4_cuda_upload(di1, sid + t, sizeof(int)) ||
                          dsv4_cuda_upload(dw1, w + (size_t)t * K, sizeof(float) * K),
                      "upload");
                op_ok(dsv4_cuda_moe_group(ds1, dw1, di1, 1, K, E, &p1, NULL), "moe_group");
                op_ok(dsv4_cuda_moe_experts(&ex, dx + (size_t)t * D, 1, K, &p1, lim, dh1, dy1, NULL), "moe_experts");
                sync_ok();
                from_dev(h1g, dh1, sizeof(float) * (size_t)r.nact * I);
            }
            for (int a = 0; a < r.nact; a++) {
                const int e = r.act_e[a], i = r.act_off[a];
                float *hi = hr + nh * I;
                dsv4_cpu_linear(&h1[e].w, x + (size_t)t * D, 1, hi);
                dsv4_cpu_linear(&h3[e].w, x + (size_t)t * D, 1, u);
                swiglu_ref(hi, u, I, lim, r.rw[i]);
                memcpy(hg + nh * I, h1g + (size_t)i * I, sizeof(float) * I);
                dsv4_cpu_linear(&h2[e].w, h1g + (size_t)i * I, 1, y);
                for (int d = 0; d < D; d++) o[d] += y[d];
                nh++;
            }
            for (int d = 0; d < D; d++) o[d] += sh[(size_t)t * D + d];
        }
        if (nh) {
            char hname[176];
            snprintf(hname, sizeof hname, "%s h", name);
            check(hname, hg, hr, nh * I, 2e-4 * rms(hr, nh * I), 2e-4);
        }
        hplan_free(&r), dplan_free(&p1), free(h1g), free(hg), free(hr);
        dsv4_cuda_free(ds1), dsv4_cuda_free(di1), dsv4_cuda_free(dw1), dsv4_cuda_free(dh1), dsv4_cuda_free(dy1);
    } else {
        /* BF16 activations: x and h rounded to bf16 before their products. h is checked on its own, and the down
         * projection's twin rounds the device's h (the twin's own h may sit on the other side of a bf16 rounding
         * boundary: a whole bf16 step on one term). Slots from group_ref (test_moe_group: equal to the device's);
         * each token's experts in increasing id, as the combine sums them. */
        hplan r = hplan_new(T, K, E);
        group_ref(sel, w, sid, T, K, E, &r);
        int ns = 0;
        for (int a = 0; a < r.nact; a++) ns += r.act_cnt[a];
        float *xr = malloc(sizeof(float) * (size_t)T * D), *hg = malloc(sizeof(float) * ((size_t)ns * I + 1)),
              *hr = malloc(sizeof(float) * ((size_t)ns * I + 1));
        memcpy(xr, x, sizeof(float) * (size_t)T * D);
        if (!aq) round_bf16(xr, (size_t)T * D);
        from_dev(hg, dh, sizeof(float) * (size_t)ns * I);
        memset(ref, 0, sizeof(float) * (size_t)T * D);
        for (int a = 0; a < r.nact; a++)
            for (int i = r.act_off[a]; i < r.act_off[a] + r.act_cnt[a]; i++) {
                const int e = r.act_e[a], t = r.rows[i];
                float *hi = hr + (size_t)i * I;
                dsv4_cpu_linear(&h1[e].w, xr + (size_t)t * D, 1, hi);
                dsv4_cpu_linear(&h3[e].w, xr + (size_t)t * D, 1, u);
                swiglu_ref(hi, u, I, lim, r.rw[i]);
                memcpy(g, hg + (size_t)i * I, sizeof(float) * I);
                if (!aq) round_bf16(g, (size_t)I);
                dsv4_cpu_linear(&h2[e].w, g, 1, y);
                for (int d = 0; d < D; d++) ref[(size_t)t * D + d] += y[d];
            }
        for (size_t i = 0; i < (size_t)T * D; i++) ref[i] += sh[i];
        char hname[176];
        snprintf(hname, sizeof hname, "%s h", name);
        check(hname, hg, hr, (size_t)ns * I, 2e-4 * rms(hr, (size_t)ns * I), 2e-4);
        hplan_free(&r), free(xr), free(hg), free(hr);
    }
    check(name, got, ref, (size_t)T * D, 2e-4 * rms(ref, (size_t)T * D), 2e-4);
    dsv4_cuda_experts_free(&ex);
    for (int e = 0; e < E; e++) {
        dsv4_cuda_weight_free(&d1[e]), dsv4_cuda_weight_free(&d3[e]), dsv4_cuda_weight_free(&d2[e]);
        free_hweight(&h1[e]), free_hweight(&h3[e]), free_hweight(&h2[e]);
    }
    dsv4_cuda_free(dsel), dsv4_cuda_free(dsid), dsv4_cuda_free(dw), dsv4_cuda_free(dx), dsv4_cuda_free(dsh);
    dsv4_cuda_free(dh), dsv4_cuda_free(dy), dsv4_cuda_free(dout), dplan_free(&dp);
    free(h1), free(h3), free(h2), free(d1), free(d3), free(d2), free(sel), free(sid), free(w), free(x), free(sh);
    free(ref), free(got), free(g), free(u), free(y);
}

/* Batch invariance of the grouped experts: token t's output row is bitwise the same in the batch of T tokens
 * (other tokens, other experts active, the 64-token pre-quantized path when T*K >= 16*E with act quant) as
 * alone (T = 1), and on a rerun of the batch. */
static void test_moe_invariant(const char *tag, dsv4_wfmt f, int aq, int T, int K, int E, int D, int I) {
    const float lim = 10.0f;
    dsv4_cuda_weight *d1 = malloc(sizeof(dsv4_cuda_weight) * E), *d3 = malloc(sizeof(dsv4_cuda_weight) * E),
                     *d2 = malloc(sizeof(dsv4_cuda_weight) * E);
    for (int e = 0; e < E; e++) {
        hweight a = make_weight(f, I, D, 0, aq), b = make_weight(f, I, D, 0, aq), c = make_weight(f, D, I, 0, aq);
        op_ok(dsv4_cuda_weight_upload(&a.w, &d1[e]), "upload");
        op_ok(dsv4_cuda_weight_upload(&b.w, &d3[e]), "upload");
        op_ok(dsv4_cuda_weight_upload(&c.w, &d2[e]), "upload");
        free_hweight(&a), free_hweight(&b), free_hweight(&c);
    }
    dsv4_cuda_experts ex;
    op_ok(dsv4_cuda_experts_init(&ex, d1, d3, d2, E), "experts_init");
    int *sel = malloc(sizeof(int) * (size_t)T * K), *sid = malloc(sizeof(int) * T);
    float *w = malloc(sizeof(float) * (size_t)T * K), *x = rand_wide((size_t)T * D);
    rand_picks(T, K, E, sel, w, sid);
    int *dsel = dup_to_dev(sel, sizeof(int) * (size_t)T * K), *dsid = dup_to_dev(sid, sizeof(int) * T);
    float *dw = dup_to_dev(w, sizeof(float) * (size_t)T * K), *dx = dup_to_dev(x, sizeof(float) * (size_t)T * D),
          *dh = dsv4_cuda_alloc(sizeof(float) * (size_t)T * K * I), *dy = dsv4_cuda_alloc(sizeof(float) * (size_t)T * K * D),
          *dout = dsv4_cuda_alloc(sizeof(float) * (size_t)T * D);
    float *b1 = malloc(sizeof(float) * (size_t)T * D), *b2 = malloc(sizeof(float) * (size_t)T * D), *one = malloc(sizeof(float) * D);
    dsv4_cuda_moe_plan dp = dplan_new(T, K, E);
    for (int rep = 0; rep < 2; rep++) {
        op_ok(dsv4_cuda_moe_group(dsel, dw, dsid, T, K, E, &dp, NULL), "moe_group");
        op_ok(dsv4_cuda_moe_experts(&ex, dx, T, K, &dp, lim, dh, dy, NULL), "moe_experts");
        op_ok(dsv4_cuda_moe_combine(dy, dp.tslot, T, K, D, NULL, dout, NULL), "moe_combine");
        sync_ok();
        from_dev(rep ? b2 : b1, dout, sizeof(float) * (size_t)T * D);
    }
    char name[160];
    snprintf(name, sizeof name, "moe_experts %s %s%s T=%d K=%d E=%d rerun (bitwise)", tag, dsv4_wfmt_name(f), aq ? " aq" : "", T, K, E);
    check(name, b2, b1, (size_t)T * D, 0, 0);
    /* the register-buffer kernels (also the prefill before moe_pf2_kernel) give the same bits */
    dsv4_cuda_moe_experts_path(DSV4_MOE_TC_LEGACY);
    op_ok(dsv4_cuda_moe_group(dsel, dw, dsid, T, K, E, &dp, NULL), "moe_group");
    op_ok(dsv4_cuda_moe_experts(&ex, dx, T, K, &dp, lim, dh, dy, NULL), "moe_experts");
    op_ok(dsv4_cuda_moe_combine(dy, dp.tslot, T, K, D, NULL, dout, NULL), "moe_combine");
    sync_ok();
    dsv4_cuda_moe_experts_path(0);
    from_dev(b2, dout, sizeof(float) * (size_t)T * D);
    snprintf(name, sizeof name, "moe_experts %s %s%s T=%d K=%d E=%d register kernels == default (bitwise)", tag, dsv4_wfmt_name(f),
             aq ? " aq" : "", T, K, E);
    check(name, b2, b1, (size_t)T * D, 0, 0);
    /* up to 8 busy tokens spread over the batch, each alone */
    int nt = 0, bad = 0;
    for (int t = 0; t < T && nt < 8; t += T / 8 > 0 ? T / 8 : 1) {
        if (sid[t] < 0) continue;
        int s0 = 0;
        float *dw1 = dw + (size_t)t * K, *dx1 = dx + (size_t)t * D;
        int *dsel1 = dsel + (size_t)t * K, *dsid1 = dup_to_dev(&s0, sizeof(int));
        op_ok(dsv4_cuda_moe_group(dsel1, dw1, dsid1, 1, K, E, &dp, NULL), "moe_group");
        op_ok(dsv4_cuda_moe_experts(&ex, dx1, 1, K, &dp, lim, dh, dy, NULL), "moe_experts");
        op_ok(dsv4_cuda_moe_combine(dy, dp.tslot, 1, K, D, NULL, dout, NULL), "moe_combine");
        sync_ok();
        from_dev(one, dout, sizeof(float) * D);
        bad += memcmp(one, b1 + (size_t)t * D, sizeof(float) * D) != 0;
        dsv4_cuda_free(dsid1);
        nt++;
    }
    g_checks++;
    if (bad) g_fail++;
    printf("%-4s moe_experts %s %s%s T=%d K=%d E=%d D=%d I=%d: %d tokens alone == in the batch (bitwise)%s\n", bad ? "FAIL" : "ok",
           tag, dsv4_wfmt_name(f), aq ? " aq" : "", T, K, E, D, I, nt - bad, bad ? " <<<" : "");
    dsv4_cuda_experts_free(&ex);
    for (int e = 0; e < E; e++) dsv4_cuda_weight_free(&d1[e]), dsv4_cuda_weight_free(&d3[e]), dsv4_cuda_weight_free(&d2[e]);
    dsv4_cuda_free(dsel), dsv4_cuda_free(dsid), dsv4_cuda_free(dw), dsv4_cuda_free(dx), dsv4_cuda_free(dh), dsv4_cuda_free(dy);
    dsv4_cuda_free(dout), dplan_free(&dp);
    free(d1), free(d3), free(d2), free(sel), free(sid), free(w), free(x), free(b1), free(b2), free(one);
}

/* ---- attention index lists (twin: the list loop of dsv4_attention_fwd) ---- */

/* S slots (the last one idle) with chunks of n[s] tokens at p0[s]; one layer of ratio `ratio`. */
static void test_attn_index(int S, int W, int ratio, int ksel, const int *p0, const int *n) {
    const int L = 1; /* layer 1 of 2 */
    int T = 0;
    for (int s = 0; s < S; s++) T += n[s];
    T += 2; /* two idle rows at the end */
    int *tok = calloc(T, sizeof(int)), *pos = calloc(T, sizeof(int)), *sid = calloc(T, sizeof(int)), *off = calloc(S, sizeof(int));
    int *sel = malloc(sizeof(int) * (size_t)T * ksel), *nsel = calloc(T, sizeof(int));
    void **sq = calloc(S, sizeof(void *));
    float *fake = dsv4_cuda_alloc(16); /* abuf values only travel into qbase */
    for (int s = 0, t = 0; s < S; s++) {
        off[s] = t;
        for (int i = 0; i < n[s]; i++, t++) pos[t] = p0[s] + i, sid[t] = s;
        if (n[s]) { /* a device seqdev with NL layer states */
            dsv4_cuda_seqdev hd = {0, 1 << 20, NULL};
            dsv4_cuda_lstate ls[2] = {{0}};
            uint8_t *d = dsv4_cuda_alloc(256 + sizeof ls);
            hd.L = (dsv4_cuda_lstate *)(d + 256);
            ls[L].abuf = (uint8_t *)(fake + s); /* distinct per slot */
            dsv4_cuda_upload(d, &hd, sizeof hd), dsv4_cuda_upload(d + 256, ls, sizeof ls);
            sq[s] = d;
        }
    }
    for (int t = T - 2; t < T; t++) sid[t] = -1;
    for (int t = 0; t < T; t++) {
        int nc = (pos[t] + 1) / 4;
        nsel[t] = nc < ksel ? nc : ksel;
        for (int i = 0; i < ksel; i++) sel[(size_t)t * ksel + i] = nc ? (int)(rnd_u32() % (uint32_t)nc) : 0;
    }
    int maxc = 0;
    for (int s = 0; s < S; s++) if (n[s] && (p0[s] + n[s]) / (ratio ? ratio : 1) > maxc) maxc = (p0[s] + n[s]) / (ratio ? ratio : 1);
    const int nidx = W + (ratio == 4 ? ksel : ratio ? maxc : 0);
    /* reference */
    float *ref = malloc(sizeof(float) * ((size_t)T * nidx + T)), *got = malloc(sizeof(float) * ((size_t)T * nidx + T));
    for (int t = 0; t < T; t++) {
        float *it = ref + (size_t)t * nidx;
        int k = 0;
        ref[(size_t)T * nidx + t] = sid[t] < 0 ? -1.0f : (float)sid[t]; /* which slot's abuf qbase holds */
        if (sid[t] >= 0) {
            int s = sid[t], p = pos[t];
            for (int pp = p - W + 1 < 0 ? 0 : p - W + 1; pp <= p; pp++) it[k++] = (float)(pp >= p0[s] ? -(off[s] + pp - p0[s]) - 2 : pp % W);
            if (ratio == 4)
                for (int i = 0; i < nsel[t]; i++) it[k++] = (float)(W + sel[(size_t)t * ksel + i]);
            else if (ratio > 0)
                for (int w = 0; w < (p + 1) / ratio; w++) it[k++] = (float)(W + w);
        }
        while (k < nidx) it[k++] = -1.0f;
    }
    int *dtok = dup_to_dev(tok, sizeof(int) * T), *dpos = dup_to_dev(pos, sizeof(int) * T), *dsid = dup_to_dev(sid, sizeof(int) * T);
    int *dp0 = dup_to_dev(p0, sizeof(int) * S), *dn = dup_to_dev(n, sizeof(int) * S), *doff = dup_to_dev(off, sizeof(int) * S);
    void *dsq = dup_to_dev(sq, sizeof(void *) * S);
    int *dsel = dup_to_dev(sel, sizeof(int) * (size_t)T * ksel), *dnsel = dup_to_dev(nsel, sizeof(int) * T);
    int *didx = dsv4_cuda_alloc(sizeof(int) * (size_t)T * nidx);
    const uint8_t **dqb = dsv4_cuda_alloc(sizeof(void *) * T);
    dsv4_cuda_batch b = {.T = T, .S = S, .tok = dtok, .pos = dpos, .sid = dsid, .p0 = dp0, .n = dn, .off = doff, .sq = dsq};
    op_ok(dsv4_cuda_attn_index(&b, L, W, ratio, ratio == 4 ? dsel : NULL, dnsel, ksel, nidx, didx, dqb, NULL), "attn_index");
    sync_ok();
    int *gi = malloc(sizeof(int) * (size_t)T * nidx);
    const uint8_t **qb = malloc(sizeof(void *) * T);
    from_dev(gi, didx, sizeof(int) * (size_t)T * nidx);
    from_dev(qb, dqb, sizeof(void *) * T);
    for (size_t i = 0; i < (size_t)T * nidx; i++) got[i] = (float)gi[i];
    for (int t = 0; t < T; t++) got[(size_t)T * nidx + t] = qb[t] ? (float)((const float *)(const void *)qb[t] - fake) : -1.0f;
    char name[128];
    snprintf(name, sizeof name, "attn_index S=%d T=%d W=%d ratio=%d nidx=%d (exact)", S, T, W, ratio, nidx);
    check(name, got, ref, (size_t)T * nidx + T, 0, 0);
    for (int s = 0; s < S; s++) dsv4_cuda_free(sq[s]);
    dsv4_cuda_free(fake), dsv4_cuda_free(dtok), dsv4_cuda_free(dpos), dsv4_cuda_free(dsid), dsv4_cuda_free(dp0), dsv4_cuda_free(dn);
    dsv4_cuda_free(doff), dsv4_cuda_free(dsq), dsv4_cuda_free(dsel), dsv4_cuda_free(dnsel), dsv4_cuda_free(didx), dsv4_cuda_free((void *)dqb);
    free(tok), free(pos), free(sid), free(off), free(sel), free(nsel), free(sq), free(ref), free(got), free(gi), free(qb);
}

/* ---- window ring store (twin: kv_cache.h's row format written out here: e4m3 codes of the 64-blocks over their
 * recomputed power-of-two scale, e8m0 scales, bf16 rope dims) ---- */

static void kv_pack_ref(const float *x, int Dh, int R, uint8_t *row) {
    const int nope = Dh - R;
    for (int b = 0; b < nope / 64; b++) {
        float a = 0;
        for (int j = 0; j < 64; j++) a = fmaxf(a, fabsf(x[b * 64 + j]));
        union { float f; uint32_t u; } sc = {fmaxf(a, 1e-4f) * (1.0f / 448.0f)};
        const int e = (int)((sc.u >> 23) & 0xff) - 127 + ((sc.u & 0x7fffffu) != 0);
        const float s = ldexpf(1.0f, e);
        row[nope + b] = (uint8_t)(e + 127);
        for (int j = 0; j < 64; j++) { /* the code whose value is x / s exactly (the row is FP8-simulated) */
            const float v = x[b * 64 + j] / s;
            int c = 0;
            while (c < 256 && memcmp(&(float){dsv4_e4m3_to_f32((uint8_t)c)}, &v, sizeof v)) c++;
            row[b * 64 + j] = (uint8_t)(c < 256 ? c : 0x7f);
        }
    }
    uint16_t *rp = (uint16_t *)(row + dsv4_kv_rope_off(Dh, R));
    for (int j = 0; j < R; j++) rp[j] = dsv4_f32_to_bf16(x[nope + j]);
}

/* The compressor's token loop (compress_tokens() of src/model/forward_attn.c up to the RMSNorm, the loop
 * dsv4_cuda_cmp_batch computes in parallel) on one slot's state: n rows at positions p0 .. of kvp / scp [n, cd]. */
static void cmp_ref(float *skv, float *ssc, const float *kvp, const float *scp, const float *ape, int p0, int n, int mr,
                    int d, int overlap, float *ent, int *rpos) {
    const int cd = (overlap ? 2 : 1) * d, nslot = overlap ? 2 * mr : mr;
    for (int i = 0; i < n; i++) {
        const int p = p0 + i, r = p % mr, row = overlap ? mr + r : r;
        rpos[i] = (p + 1) % mr ? 0 : p + 1 - mr;
        for (int col = 0; col < cd; col++) {
            skv[(size_t)row * cd + col] = kvp[(size_t)i * cd + col];
            ssc[(size_t)row * cd + col] = scp[(size_t)i * cd + col] + ape[(size_t)r * cd + col];
        }
        if ((p + 1) % mr) continue;
        for (int ch = 0; ch < d; ch++) {
            float mx = -INFINITY, den = 0;
            for (int k = 0; k < nslot; k++) mx = fmaxf(mx, ssc[(size_t)k * cd + (overlap && k >= mr ? d + ch : ch)]);
            for (int k = 0; k < nslot; k++) {
                const float v = ssc[(size_t)k * cd + (overlap && k >= mr ? d + ch : ch)];
                den += v == -INFINITY ? 0.0f : expf(v - mx);
            }
            double acc = 0;
            for (int k = 0; k < nslot; k++) {
                const int col = overlap && k >= mr ? d + ch : ch;
                const float v = ssc[(size_t)k * cd + col], w = v == -INFINITY ? 0.0f : expf(v - mx);
                acc += (double)(w / den) * skv[(size_t)k * cd + col];
            }
            ent[(size_t)i * d + ch] = (float)acc;
        }
        if (overlap) memcpy(skv, skv + (size_t)mr * cd, sizeof(float) * mr * cd), memcpy(ssc, ssc + (size_t)mr * cd, sizeof(float) * mr * cd);
    }
}

/* dsv4_cuda_cmp_batch over several passes of two slots (slot 0 cut by cuts[], slot 1 by the same cuts reversed, two
 * idle rows per pass) against cmp_ref: entries at a tight tolerance (expf of the device vs the host's), RoPE positions
 * and the pending rows after every pass exactly. */
static void test_cmp_batch(int mr, int d, int overlap, const int *cuts, int nc) {
    const int S = 2, L = 0, cd = (overlap ? 2 : 1) * d, nslot = overlap ? 2 * mr : mr;
    float *hkv[2], *hsc[2], *dkv[2], *dsc[2];
    void *sq[2];
    float *ape = randn((size_t)mr * cd, 1.0f);
    float *dape = dup_to_dev(ape, sizeof(float) * (size_t)mr * cd);
    for (int s = 0; s < S; s++) {
        hkv[s] = calloc((size_t)nslot * cd, sizeof(float));
        hsc[s] = malloc(sizeof(float) * (size_t)nslot * cd);
        for (size_t i = 0; i < (size_t)nslot * cd; i++) hsc[s][i] = -INFINITY;
        dkv[s] = dup_to_dev(hkv[s], sizeof(float) * (size_t)nslot * cd);
        dsc[s] = dup_to_dev(hsc[s], sizeof(float) * (size_t)nslot * cd);
        dsv4_cuda_seqdev hd = {0, 1 << 20, NULL};
        dsv4_cuda_lstate ls[1] = {{0}};
        uint8_t *dv = dsv4_cuda_alloc(256 + sizeof ls);
        hd.L = (dsv4_cuda_lstate *)(dv + 256);
        ls[L].ckv = dkv[s], ls[L].csc = dsc[s];
        dsv4_cuda_upload(dv, &hd, sizeof hd), dsv4_cuda_upload(dv + 256, ls, sizeof ls);
        sq[s] = dv;
    }
    void *dsq = dup_to_dev(sq, sizeof sq);
    int pos[2] = {0, 0}, ok = 1;
    double worst = 0;
    for (int c = 0; c < nc; c++) {
        const int n[2] = {cuts[c], cuts[nc - 1 - c]}, T = n[0] + n[1] + 2;
        int p0[2] = {pos[0], pos[1]}, off[2] = {0, n[0]};
        int *tp = calloc(T, sizeof(int)), *sid = calloc(T, sizeof(int)), *rpos = calloc(T, sizeof(int)), *rref = calloc(T, sizeof(int));
        float *kvp = randn((size_t)T * cd, 1.0f), *scp = randn((size_t)T * cd, 2.0f);
        float *ent = calloc((size_t)T * d, sizeof(float)), *eref = calloc((size_t)T * d, sizeof(float));
        for (int s = 0, t = 0; s < S; s++)
            for (int i = 0; i < n[s]; i++, t++) tp[t] = p0[s] + i, sid[t] = s;
        sid[T - 2] = sid[T - 1] = -1;
        int *dtp = dup_to_dev(tp, sizeof(int) * T), *dsid = dup_to_dev(sid, sizeof(int) * T), *drp = dup_to_dev(rpos, sizeof(int) * T);
        int *dp0 = dup_to_dev(p0, sizeof p0), *dn = dup_to_dev(n, sizeof n), *doff = dup_to_dev(off, sizeof off);
        float *dkvp = dup_to_dev(kvp, sizeof(float) * (size_t)T * cd), *dscp = dup_to_dev(scp, sizeof(float) * (size_t)T * cd);
        float *dent = dup_to_dev(ent, sizeof(float) * (size_t)T * d);
        dsv4_cuda_batch b = {.T = T, .S = S, .tok = dtp, .pos = dtp, .sid = dsid, .p0 = dp0, .n = dn, .off = doff, .sq = dsq};
        op_ok(dsv4_cuda_cmp_batch(&b, L, 0, dkvp, dscp, dape, mr, d, overlap, dent, drp, NULL), "cmp_batch");
        sync_ok();
        from_dev(ent, dent, sizeof(float) * (size_t)T * d);
        from_dev(rpos, drp, sizeof(int) * T);
        for (int s = 0; s < S; s++) {
            cmp_ref(hkv[s], hsc[s], kvp + (size_t)off[s] * cd, scp + (size_t)off[s] * cd, ape, p0[s], n[s], mr, d, overlap,
                    eref + (size_t)off[s] * d, rref + off[s]);
            pos[s] += n[s];
            float *gkv = malloc(sizeof(float) * (size_t)nslot * cd), *gsc = malloc(sizeof(float) * (size_t)nslot * cd);
            from_dev(gkv, dkv[s], sizeof(float) * (size_t)nslot * cd);
            from_dev(gsc, dsc[s], sizeof(float) * (size_t)nslot * cd);
            ok &= !memcmp(gkv, hkv[s], sizeof(float) * (size_t)nslot * cd) && !memcmp(gsc, hsc[s], sizeof(float) * (size_t)nslot * cd);
            free(gkv), free(gsc);
        }
        for (int t = 0; t < T - 2; t++) {
            ok &= rpos[t] == rref[t];
            if (!((tp[t] + 1) % mr))
                for (int ch = 0; ch < d; ch++) {
                    const double e = fabs((double)ent[(size_t)t * d + ch] - eref[(size_t)t * d + ch]) / (1e-6 + 1e-5 * fabs(eref[(size_t)t * d + ch]));
                    worst = e > worst ? e : worst;
                }
        }
        dsv4_cuda_free(dtp), dsv4_cuda_free(dsid), dsv4_cuda_free(drp), dsv4_cuda_free(dp0), dsv4_cuda_free(dn), dsv4_cuda_free(doff);
        dsv4_cuda_free(dkvp), dsv4_cuda_free(dscp), dsv4_cuda_free(dent);
        free(tp), free(sid), free(rpos), free(rref), free(kvp), free(scp), free(ent), free(eref);
    }
    ok &= worst <= 1;
    g_checks++, g_fail += !ok;
    printf("%-4s cmp_batch m=%d d=%d overlap=%d, %d passes: entries %.3f of tol (atol 1e-6 rtol 1e-5), positions and pending rows %s%s\n",
           ok ? "ok" : "FAIL", mr, d, overlap, nc, worst, ok ? "exact" : "checked", ok ? "" : " <<<");
    for (int s = 0; s < S; s++) free(hkv[s]), free(hsc[s]), dsv4_cuda_free(dkv[s]), dsv4_cuda_free(dsc[s]), dsv4_cuda_free(sq[s]);
    dsv4_cuda_free(dsq), dsv4_cuda_free(dape), free(ape);
}

/* S slots with n[s] rows at positions p0[s] ..; two idle rows at the end. Each slot's ring (W rows, prefilled) after
 * dsv4_cuda_ring_store, bytewise. */
static void test_ring_store(int S, int W, int Dh, int R, const int *p0, const int *n) {
    const int L = 1; /* layer 1 of 2 */
    int T = 0;
    for (int s = 0; s < S; s++) T += n[s];
    T += 2;
    const int64_t rb = dsv4_kv_row_bytes(Dh, R), nope = Dh - R;
    int *pos = calloc(T, sizeof(int)), *sid = calloc(T, sizeof(int)), *off = calloc(S, sizeof(int));
    void **sq = calloc(S, sizeof(void *));
    uint8_t **ring = calloc(S, sizeof(uint8_t *)), *ref = malloc((size_t)S * W * rb), *got = malloc((size_t)S * W * rb);
    memset(ref, 0xa5, (size_t)S * W * rb);
    float *kv = randn((size_t)T * Dh, 1.0f);
    for (int t = 0; t < T; t++) dsv4_act_quant_fp8(kv + (size_t)t * Dh, (size_t)nope, 64);
    for (int s = 0, t = 0; s < S; s++) {
        off[s] = t;
        for (int i = 0; i < n[s]; i++, t++) pos[t] = p0[s] + i, sid[t] = s;
        ring[s] = dup_to_dev(ref + (size_t)s * W * rb, (size_t)W * rb);
        if (n[s]) {
            dsv4_cuda_seqdev hd = {0, 1 << 20, NULL};
            dsv4_cuda_lstate ls[2] = {{0}};
            uint8_t *d = dsv4_cuda_alloc(256 + sizeof ls);
            hd.L = (dsv4_cuda_lstate *)(d + 256);
            ls[L].abuf = ring[s];
            dsv4_cuda_upload(d, &hd, sizeof hd), dsv4_cuda_upload(d + 256, ls, sizeof ls);
            sq[s] = d;
        }
    }
    for (int t = T - 2; t < T; t++) sid[t] = -1;
    for (int t = 0; t < T - 2; t++) {
        const int s = sid[t];
        if (pos[t] >= p0[s] + n[s] - W) kv_pack_ref(kv + (size_t)t * Dh, Dh, R, ref + ((size_t)s * W + pos[t] % W) * rb);
    }
    int *dpos = dup_to_dev(pos, sizeof(int) * T), *dsid = dup_to_dev(sid, sizeof(int) * T);
    int *dp0 = dup_to_dev(p0, sizeof(int) * S), *dn = dup_to_dev(n, sizeof(int) * S), *doff = dup_to_dev(off, sizeof(int) * S);
    void *dsq = dup_to_dev(sq, sizeof(void *) * S);
    float *dkv = dup_to_dev(kv, sizeof(float) * (size_t)T * Dh);
    dsv4_cuda_batch b = {.T = T, .S = S, .tok = dpos, .pos = dpos, .sid = dsid, .p0 = dp0, .n = dn, .off = doff, .sq = dsq};
    op_ok(dsv4_cuda_ring_store(&b, L, dkv, W, Dh, R, NULL), "ring_store");
    sync_ok();
    for (int s = 0; s < S; s++) from_dev(got + (size_t)s * W * rb, ring[s], (size_t)W * rb);
    size_t nb = (size_t)S * W * rb;
    float *fr = malloc(sizeof(float) * nb), *fg = malloc(sizeof(float) * nb);
    for (size_t i = 0; i < nb; i++) fr[i] = ref[i], fg[i] = got[i];
    char name[128];
    snprintf(name, sizeof name, "ring_store S=%d T=%d W=%d Dh=%d R=%d (bytes, exact)", S, T, W, Dh, R);
    check(name, fg, fr, nb, 0, 0);
    /* the twin against dsv4_cuda_kv_pack (attn_kv8.cu) on the same rows */
    {
        uint8_t *pk = malloc((size_t)T * rb), *hk = malloc((size_t)T * rb), *dpk = dsv4_cuda_alloc((size_t)T * rb);
        memset(hk, 0, (size_t)T * rb);
        op_ok(dsv4_cuda_memset(dpk, 0, (size_t)T * rb, NULL), "memset");
        op_ok(dsv4_cuda_kv_pack(dkv, Dh, T, Dh, R, dpk, NULL, NULL), "kv_pack");
        sync_ok();
        from_dev(pk, dpk, (size_t)T * rb);
        for (int t = 0; t < T; t++) kv_pack_ref(kv + (size_t)t * Dh, Dh, R, hk + (size_t)t * rb);
        size_t nd = 0;
        for (size_t i = 0; i < (size_t)T * rb; i++) nd += pk[i] != hk[i];
        g_checks++, g_fail += nd != 0;
        printf("%-4s kv_pack rows = the ring store's twin: %zu of %zu bytes differ%s\n", nd ? "FAIL" : "ok", nd, (size_t)T * rb,
               nd ? " <<<" : "");
        dsv4_cuda_free(dpk), free(pk), free(hk);
    }
    for (int s = 0; s < S; s++) dsv4_cuda_free(sq[s]), dsv4_cuda_free(ring[s]);
    dsv4_cuda_free(dpos), dsv4_cuda_free(dsid), dsv4_cuda_free(dp0), dsv4_cuda_free(dn), dsv4_cuda_free(doff), dsv4_cuda_free(dsq);
    dsv4_cuda_free(dkv);
    free(pos), free(sid), free(off), free(sq), free(ring), free(ref), free(got), free(kv), free(fr), free(fg);
}

/* ---- GEMV / GEMM timing: NR copies of one weight (> 256 MiB in all), a different copy per call ---- */

static double g_copy_gbs; /* device-to-device cudaMemcpy, read + write, measured in this run */

static int cmp_float(const void *a, const void *b) {
    float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

/* Median of 20 copies of 1 GiB, counted as bytes read + bytes written (as bench/RESULTS.md does). */
static void bench_copy(void) {
    const size_t n = (size_t)1 << 30;
    void *a = dsv4_cuda_alloc(n), *b = dsv4_cuda_alloc(n);
    if (!a || !b) {
        fprintf(stderr, "copy bench: %s\n", dsv4_cuda_last_error());
        exit(2);
    }
    dsv4_cuda_memset(a, 1, n, NULL);
    float ms[20];
    cudaEvent_t e0, e1;
    cudaEventCreate(&e0), cudaEventCreate(&e1);
    cudaMemcpy(b, a, n, cudaMemcpyDeviceToDevice);
    for (int i = 0; i < 20; i++) {
        cudaEventRecord(e0, 0);
        cudaMemcpy(b, a, n, cudaMemcpyDeviceToDevice);
        cudaEventRecord(e1, 0);
        sync_ok();
        cudaEventElapsedTime(&ms[i], e0, e1);
    }
    qsort(ms, 20, sizeof(float), cmp_float);
    g_copy_gbs = 2.0 * n / (ms[10] * 1e-3) / 1e9;
    printf("time copy d2d 1 GiB: %.1f us, %.1f GB/s (read + write, median of 20)\n", ms[10] * 1e3, g_copy_gbs);
    cudaEventDestroy(e0), cudaEventDestroy(e1);
    dsv4_cuda_free(a), dsv4_cuda_free(b);
}

/* mHC pre / head at Flash shapes (M 4, D 4096, fn [24, 16384] F32, 20 Sinkhorn rounds): `it` calls captured in a
 * CUDA graph (as in a decode step), GPU time per call. At T <= 16 the fn is rotated through 128 copies (192 MiB),
 * so that L2 does not serve it. Variants: pre + fused RMSNorm; pre then dsv4_cuda_rmsnorm; pre without Sinkhorn
 * rounds (iters 0); the reference Sinkhorn on one thread (test flag 1); no programmatic dependent launch (2); the
 * mixing kernel alone (4) and the finishing kernel alone (8); head + fused RMSNorm. */
static void bench_hc(int T) {
    const int M = 4, D = 4096, nr = 24, K = M * D, NR = T <= 16 ? 128 : 1, it = T <= 16 ? 200 : 10;
    hweight fn = make_weight(DSV4_WF_F32, nr, K, 0, 0), fh = make_weight(DSV4_WF_F32, M, K, 0, 0);
    uint8_t *dfn = dsv4_cuda_alloc((size_t)NR * nr * K * 4), *dfh = dsv4_cuda_alloc((size_t)NR * M * K * 4);
    if (!dfn || !dfh) op_ok(-1, "hc bench alloc");
    for (int k = 0; k < NR; k++) {
        dsv4_cuda_upload(dfn + (size_t)k * nr * K * 4, fn.data, (size_t)nr * K * 4);
        dsv4_cuda_upload(dfh + (size_t)k * M * K * 4, fh.data, (size_t)M * K * 4);
    }
    float *X = randn((size_t)T * K, 1.0f), *scale = randn(3, 0.5f), *base = randn(nr, 0.5f), *nw = randn(D, 1.0f);
    float *dX = dup_to_dev(X, sizeof(float) * (size_t)T * K), *ds = dup_to_dev(scale, 12), *db = dup_to_dev(base, 4 * nr),
          *dnw = dup_to_dev(nw, 4 * D);
    float *dx = dsv4_cuda_alloc(sizeof(float) * (size_t)T * D), *dp = dsv4_cuda_alloc(sizeof(float) * (size_t)T * M),
          *dc = dsv4_cuda_alloc(sizeof(float) * (size_t)T * M * M);
    void *scr = dsv4_cuda_alloc(dsv4_cuda_hc_scratch_bytes(T, M, D));
    cudaStream_t st;
    cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking);
    static const char *vn[8] = {"pre + norm", "pre, then rmsnorm", "pre + norm (iters 0)", "pre + norm, serial Sinkhorn",
                                "pre + norm, no PDL", "pre: mixing kernel alone", "pre: finishing kernel alone", "head + norm"};
    static const int vf[8] = {0, 0, 0, 1, 2, 4, 8, 0};
    for (int v = 0; v < 8; v++) {
        double us = 0;
        for (int pass = 0; pass < 2; pass++) { /* pass 0: warm up outside capture; pass 1: the graph */
            cudaGraph_t gr = NULL;
            cudaGraphExec_t ge = NULL;
            dsv4_cuda_hc_test_flags = vf[v];
            if (pass && cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal) != cudaSuccess) op_ok(-1, "capture");
            for (int k = 0; k < (pass ? it : 2); k++) {
                dsv4_cuda_weight w = {DSV4_WF_F32, nr, K, 0, dfn + (size_t)(k % NR) * nr * K * 4, NULL, 0, 0, 0, 0, 0};
                dsv4_cuda_weight wh = {DSV4_WF_F32, M, K, 0, dfh + (size_t)(k % NR) * M * K * 4, NULL, 0, 0, 0, 0, 0};
                if (v == 7) op_ok(dsv4_cuda_hc_head(dX, T, M, D, &wh, ds, db, 1e-6f, 1e-6f, dnw, dx, scr, st), "hc_head");
                else op_ok(dsv4_cuda_hc_pre(dX, T, M, D, &w, ds, db, v == 2 ? 0 : 20, 1e-6f, 1e-6f, v == 1 ? NULL : dnw, dx, dp,
                                            dc, scr, st), "hc_pre");
                if (v == 1) op_ok(dsv4_cuda_rmsnorm(dx, T, D, D, dnw, 1e-6f, st), "rmsnorm");
            }
            dsv4_cuda_hc_test_flags = 0;
            if (!pass) {
                op_ok(cudaStreamSynchronize(st) != cudaSuccess, "hc bench warm-up");
                continue;
            }
            if (cudaStreamEndCapture(st, &gr) != cudaSuccess || cudaGraphInstantiate(&ge, gr, 0) != cudaSuccess) op_ok(-1, "graph");
            cudaGraphLaunch(ge, st); /* warm */
            cudaEvent_t e0, e1;
            cudaEventCreate(&e0), cudaEventCreate(&e1);
            float ms[5];
            for (int r = 0; r < 5; r++) {
                cudaEventRecord(e0, st);
                cudaGraphLaunch(ge, st);
                cudaEventRecord(e1, st);
                op_ok(cudaStreamSynchronize(st) != cudaSuccess, "hc bench");
                cudaEventElapsedTime(&ms[r], e0, e1);
            }
            qsort(ms, 5, sizeof(float), cmp_float);
            us = 1000.0 * ms[2] / it;
            cudaEventDestroy(e0), cudaEventDestroy(e1);
            cudaGraphExecDestroy(ge), cudaGraphDestroy(gr);
        }
        printf("time hc %-28s M=%d D=%d T=%-4d: %8.2f us / call (graph of %d calls, median of 5)\n", vn[v], M, D, T, us, it);
    }
    cudaStreamDestroy(st);
    dsv4_cuda_free(dfn), dsv4_cuda_free(dfh), dsv4_cuda_free(dX), dsv4_cuda_free(ds), dsv4_cuda_free(db), dsv4_cuda_free(dnw),
        dsv4_cuda_free(dx), dsv4_cuda_free(dp), dsv4_cuda_free(dc), dsv4_cuda_free(scr);
    free_hweight(&fn), free_hweight(&fh), free(X), free(scale), free(base), free(nw);
}

/* Times the FP8 prefill GEMM (act quant + cuBLASLt block-scaled matmul, fp32 out) next to the plain cuBLASLt FP8
 * GEMM of the same size (bench_cuda.c: one tensor-wide scale, bf16 out) and the GEMV path, all measured here. */
static void bench_linear_gemm(const char *tag, int R, int C, int T) {
    hweight h = make_weight(DSV4_WF_FP8, R, C, 0, 1);
    dsv4_cuda_weight w;
    op_ok(dsv4_cuda_weight_upload(&h.w, &w), "weight upload");
    float *x = randn((size_t)T * C, 1.0f);
    float *dx = dup_to_dev(x, sizeof(float) * (size_t)T * C), *dy = dsv4_cuda_alloc(sizeof(float) * (size_t)T * R);
    const size_t wsb = dsv4_cuda_linear_gemm_ws_bytes(T, C, R);
    void *ws = dsv4_cuda_alloc(wsb);
    if (!dy || !ws) op_ok(-1, "gemm bench buffers");
    double us[2] = {0, 0};
    const int rc = dsv4_cuda_linear_gemm(&w, dx, T, dy, ws, wsb, NULL);
    for (int path = rc ? 2 : 0; path < 2; path++) { /* 0: the GEMM, 1: the GEMV (dsv4_cuda_linear) */
        const int it = path ? 3 : 20;
        for (int k = 0; k < 2; k++)
            op_ok(path ? dsv4_cuda_linear(&w, dx, 0, T, dy, NULL) : dsv4_cuda_linear_gemm(&w, dx, T, dy, ws, wsb, NULL), "linear");
        cudaEvent_t e0, e1;
        cudaEventCreate(&e0), cudaEventCreate(&e1);
        cudaEventRecord(e0, 0);
        for (int k = 0; k < it; k++) path ? dsv4_cuda_linear(&w, dx, 0, T, dy, NULL) : dsv4_cuda_linear_gemm(&w, dx, T, dy, ws, wsb, NULL);
        cudaEventRecord(e1, 0);
        sync_ok();
        float ms;
        cudaEventElapsedTime(&ms, e0, e1);
        us[path] = 1000.0 * ms / it;
        cudaEventDestroy(e0), cudaEventDestroy(e1);
    }
    if (rc) printf("time linear gemm %-14s FP8 %6dx%-5d T=%-4d aq: declined (%d)\n", tag, R, C, T, rc);
    double ref_us = 0;
    char err[256] = "";
    const int rr = dsv4_cuda_bench_fp8_gemm(R, T, C, 20, &ref_us, err, sizeof err);
    const double fl = 2.0 * R * C * T / 1e6, tf = fl / us[0], tref = rr ? 0 : fl / ref_us;
    if (!rc) printf("time linear gemm %-14s FP8 %6dx%-5d T=%-4d aq: %8.1f us %7.1f TFLOP/s  (%5.1f%% of cuBLASLt FP8 %.1f us %.1f TFLOP/s%s%s; "
           "GEMV path %.1f us %.1f TFLOP/s, %.1fx)\n",
           tag, R, C, T, us[0], tf, rr ? 0.0 : 100.0 * tf / tref, ref_us, tref, rr ? ": " : "", rr ? err : "", us[1], fl / us[1],
           us[1] / us[0]);
    dsv4_cuda_free(dx), dsv4_cuda_free(dy), dsv4_cuda_free(ws), dsv4_cuda_weight_free(&w);
    free(x), free_hweight(&h);
}

/* Times y = x . W^T for each T of Ts. The host generates at most ~32 MiB of rows (a multiple of 128) and tiles
 * them over the device copies; bytes = weight + scales + x + y, against the measured copy rate. */
static void bench_linear(const char *tag, dsv4_wfmt fmt, int R, int C, const int *Ts, int nT, int aq) {
    size_t rowb = fmt == DSV4_WF_F32 ? 4 * (size_t)C : fmt == DSV4_WF_BF16 || fmt == DSV4_WF_F16 ? 2 * (size_t)C
                  : fmt == DSV4_WF_FP8 ? (size_t)C : (size_t)C / 2;
    int Rg = (int)(((size_t)32 << 20) / rowb) / 128 * 128;
    if (Rg < 128) Rg = 128;
    if (Rg > R) Rg = R;
    hweight h = make_weight(fmt, Rg, C, 0, aq);
    dsv4_weight full = h.w;
    full.rows = R;
    const int fp8 = fmt == DSV4_WF_FP8;
    const size_t srow = fp8 ? h.scale_b / ((Rg + 127) / 128) : h.scale_b / Rg; /* per 128 rows (FP8) or per row */
    const size_t DB = rowb * R, SB = fp8 ? srow * ((R + 127) / 128) : srow * R, per = DB + SB;
    int NR = (int)((256u << 20) / per) + 1;
    if (NR > 64) NR = 64;
    uint8_t *dd = dsv4_cuda_alloc(DB * NR), *ds = SB ? dsv4_cuda_alloc(SB * NR) : NULL;
    if (!dd || (SB && !ds)) {
        fprintf(stderr, "bench alloc: %s\n", dsv4_cuda_last_error());
        exit(2);
    }
    for (int k = 0; k < NR; k++)
        for (int r = 0; r < R; r += Rg) {
            int n = R - r < Rg ? R - r : Rg;
            dsv4_cuda_upload(dd + DB * k + rowb * r, h.data, rowb * n);
            if (ds && fp8) dsv4_cuda_upload(ds + SB * k + srow * (r / 128), h.scale, srow * ((n + 127) / 128));
            else if (ds) dsv4_cuda_upload(ds + SB * k + srow * r, h.scale, srow * n);
        }
    int Tmax = 0;
    for (int i = 0; i < nT; i++) Tmax = Ts[i] > Tmax ? Ts[i] : Tmax;
    float *x = randn((size_t)Tmax * C, 1.0f);
    float *dx = dup_to_dev(x, sizeof(float) * (size_t)Tmax * C), *dy = dsv4_cuda_alloc(sizeof(float) * (size_t)Tmax * R);
    dsv4_cuda_weight w = {fmt, R, C, 0, dd, ds, 0, h.w.scale_stride, h.w.scale2, aq, 0};
    for (int i = 0; i < nT; i++) {
        const int T = Ts[i], it = T > 16 ? 10 : 100;
        for (int k = 0; k < 3; k++) op_ok(dsv4_cuda_linear(&w, dx, 0, T, dy, NULL), "linear");
        cudaEvent_t e0, e1;
        cudaEventCreate(&e0), cudaEventCreate(&e1);
        struct timespec h0, h1;
        cudaEventRecord(e0, 0);
        clock_gettime(CLOCK_MONOTONIC, &h0);
        for (int k = 0; k < it; k++) {
            w.data = dd + DB * (k % NR);
            w.scale = ds ? ds + SB * (k % NR) : NULL;
            dsv4_cuda_linear(&w, dx, 0, T, dy, NULL);
        }
        clock_gettime(CLOCK_MONOTONIC, &h1);
        cudaEventRecord(e1, 0);
        sync_ok();
        const double host_us = ((h1.tv_sec - h0.tv_sec) * 1e6 + (h1.tv_nsec - h0.tv_nsec) * 1e-3) / it;
        float ms;
        cudaEventElapsedTime(&ms, e0, e1);
        double us = 1000.0 * ms / it, bytes = (double)dsv4_weight_bytes(&full) + 4.0 * T * ((double)C + R);
        if (T <= 16)
            printf("time linear %-24s %s %6dx%-5d T=%-3d%s: %8.2f us  %7.1f GB/s  %5.1f%% of copy  (host %.1f us/call)\n", tag,
                   dsv4_wfmt_name(fmt), R, C, T, aq ? " aq" : "   ", us, bytes / us / 1e3, 100.0 * bytes / us / 1e3 / g_copy_gbs, host_us);
        else
            printf("time linear %-24s %s %6dx%-5d T=%-4d%s: %8.1f us  %7.2f TFLOP/s\n", tag, dsv4_wfmt_name(fmt), R, C, T,
                   aq ? " aq" : "   ", us, 2.0 * R * C * T / us / 1e6);
        cudaEventDestroy(e0), cudaEventDestroy(e1);
    }
    dsv4_cuda_free(dd), dsv4_cuda_free(ds), dsv4_cuda_free(dx), dsv4_cuda_free(dy), free(x), free_hweight(&h);
}

/* Times y = x . W^T at T rows through the GEMV (dsv4_cuda_linear: 16 rows a launch, 8 for wide BF16 x) and through the
 * multi-token GEMM (dsv4_cuda_linear_ws); n > 1: n jobs as the wo_a groups (views of one weight, strided x and y) through
 * dsv4_cuda_linear_multi / _multi_ws. The weights stay where they are (the large ones do not fit L2). */
static void bench_mt(const char *tag, dsv4_wfmt fmt, int R, int C, int aq, int n, const int *Ts, int nT) {
    mspec sp[MJ_MAX];
    for (int i = 0; i < n; i++) sp[i] = (mspec){fmt, R, C, aq, 0, 0};
    mweights m;
    mweights_make(&m, sp, n, n > 1);
    int Tmax = 0;
    for (int i = 0; i < nT; i++) Tmax = Ts[i] > Tmax ? Ts[i] : Tmax;
    float *x = randn((size_t)Tmax * C * n, 1.0f);
    float *dx = dup_to_dev(x, sizeof(float) * (size_t)Tmax * C * n), *dy = dsv4_cuda_alloc(sizeof(float) * (size_t)Tmax * R * n);
    const size_t wsb = dsv4_cuda_linear_ws_bytes(Tmax, (int64_t)C * n, n);
    void *ws = dsv4_cuda_alloc(wsb);
    dsv4_cuda_linear_job jb[MJ_MAX];
    for (int i = 0; i < n; i++) jb[i] = (dsv4_cuda_linear_job){m.w[i], dx + (size_t)i * C, (int64_t)C * n, dy + (size_t)i * R, (int64_t)R * n};
    for (int i = 0; i < nT; i++) {
        const int T = Ts[i];
        double us[2];
        for (int path = 0; path < 2; path++) {
            void *w = path ? ws : NULL;
            const size_t wb = path ? wsb : 0;
            const int it = 5;
            cudaEvent_t e0, e1;
            cudaEventCreate(&e0), cudaEventCreate(&e1);
            for (int k = 0; k < it + 2; k++) {
                if (k == 2) cudaEventRecord(e0, 0);
                op_ok(n > 1 ? dsv4_cuda_linear_multi_ws(jb, n, 0, T, w, wb, NULL) : dsv4_cuda_linear_ws(&m.w[0], dx, 0, T, dy, w, wb, NULL),
                      "linear");
            }
            cudaEventRecord(e1, 0);
            sync_ok();
            float ms;
            cudaEventElapsedTime(&ms, e0, e1);
            us[path] = 1000.0 * ms / it;
            cudaEventDestroy(e0), cudaEventDestroy(e1);
        }
        const double wbytes = (double)dsv4_weight_bytes(&m.h[0].w);
        printf("time linear mt %-22s %s %dx %6dx%-5d T=%-4d%s: GEMV %9.1f us, multi-token GEMM %8.1f us (%.1fx; %6.1f TFLOP/s, "
               "weight %6.0f GB/s)\n",
               tag, dsv4_wfmt_name(fmt), n, R, C, T, aq ? " aq" : "   ", us[0], us[1], us[0] / us[1], 2.0 * n * R * C * T / us[1] / 1e6,
               wbytes / us[1] / 1e3);
    }
    dsv4_cuda_free(dx), dsv4_cuda_free(dy), dsv4_cuda_free(ws), free(x);
    mweights_free(&m);
}

/* Times a group of linears at T rows as separate dsv4_cuda_linear calls and as one dsv4_cuda_linear_multi call, the
 * weights rotated through > 256 MiB of copies. views + xs (the wo_a groups): also the forward's former path, each group
 * through copy2d of its slice of x, the linear, copy2d into its slice of y. */
static void bench_linear_multi(const char *tag, const mspec *s, int n, int views, int xs, int T) {
    mweights m;
    mweights_make(&m, s, n, views);
    size_t DB[MJ_MAX], SB[MJ_MAX], per = 0;
    for (int i = 0; i < m.nh; i++) DB[i] = m.h[i].data_b, SB[i] = m.h[i].scale_b, per += DB[i] + SB[i];
    int NR = (int)((256u << 20) / per) + 1;
    if (NR > 64) NR = 64;
    uint8_t *dd[MJ_MAX], *ds[MJ_MAX];
    for (int i = 0; i < m.nh; i++) {
        dd[i] = dsv4_cuda_alloc(DB[i] * NR), ds[i] = SB[i] ? dsv4_cuda_alloc(SB[i] * NR) : NULL;
        if (!dd[i] || (SB[i] && !ds[i])) op_ok(-1, "bench alloc");
        for (int k = 0; k < NR; k++) {
            dsv4_cuda_upload(dd[i] + DB[i] * k, m.h[i].data, DB[i]);
            if (SB[i]) dsv4_cuda_upload(ds[i] + SB[i] * k, m.h[i].scale, SB[i]);
        }
    }
    int64_t xo[MJ_MAX], yo[MJ_MAX], ldx, ldy;
    multi_layout(s, n, xs, 1, xo, yo, &ldx, &ldy);
    float *x = randn((size_t)T * ldx, 1.0f);
    float *dx = dup_to_dev(x, 4 * (size_t)T * ldx), *dy = dsv4_cuda_alloc(4 * (size_t)T * ldy);
    int Cm = 0, Rm = 0;
    for (int i = 0; i < n; i++) Cm = s[i].C > Cm ? s[i].C : Cm, Rm = s[i].R > Rm ? s[i].R : Rm;
    float *dxg = dsv4_cuda_alloc(4 * (size_t)T * Cm), *dyg = dsv4_cuda_alloc(4 * (size_t)T * Rm);
    op_ok(dsv4_cuda_memset(dxg, 0, 4 * (size_t)T * Cm, NULL), "memset");
    dsv4_cuda_linear_job jb[MJ_MAX];
    double us[3] = {0, 0, 0}, bytes = 0;
    for (int i = 0; i < n; i++) bytes += (double)dsv4_weight_bytes(&m.h[views ? 0 : i].w) / (views ? n : 1) + 4.0 * T * (s[i].C + s[i].R);
    const int it = 50;
    for (int path = 0; path < 3; path++) { /* 0: separate linears, 1: grouped, 2: separate with the slice copies */
        if (path == 2 && !(views && xs)) break;
        cudaEvent_t e0, e1;
        cudaEventCreate(&e0), cudaEventCreate(&e1);
        for (int k = -3; k < it; k++) {
            if (k == 0) cudaEventRecord(e0, 0);
            const int c = (k + 3) % NR;
            for (int i = 0; i < n; i++) {
                const int hi = views ? 0 : i;
                jb[i].w = m.w[i];
                jb[i].w.data = dd[hi] + DB[hi] * c;
                jb[i].w.scale = SB[hi] ? ds[hi] + SB[hi] * c : NULL;
                jb[i].x = dx + xo[i], jb[i].ldx = ldx;
                jb[i].y = dy + yo[i], jb[i].ldy = ldy;
            }
            if (path == 1) {
                op_ok(dsv4_cuda_linear_multi(jb, n, 0, T, NULL), "linear multi");
                continue;
            }
            for (int i = 0; i < n; i++) {
                if (path == 2) op_ok(dsv4_cuda_copy2d(dxg, s[i].C, dx + xo[i], ldx, T, s[i].C, NULL), "copy2d");
                op_ok(dsv4_cuda_linear(&jb[i].w, path == 2 || xs ? dxg : dx, 0, T, dyg, NULL), "linear");
                if (path == 2) op_ok(dsv4_cuda_copy2d(dy + yo[i], ldy, dyg, s[i].R, T, s[i].R, NULL), "copy2d");
            }
        }
        cudaEventRecord(e1, 0);
        sync_ok();
        float ms;
        cudaEventElapsedTime(&ms, e0, e1);
        us[path] = 1000.0 * ms / it;
        cudaEventDestroy(e0), cudaEventDestroy(e1);
    }
    printf("time linear multi %-28s T=%-2d: separate %7.2f us (%2d launches)", tag, T, us[0], n);
    if (us[2] > 0) printf(", with slice copies %7.2f us (%2d launches)", us[2], 3 * n);
    printf(", grouped %7.2f us  %7.1f GB/s  %5.1f%% of copy  (%.2fx%s)\n", us[1], bytes / us[1] / 1e3,
           100.0 * bytes / us[1] / 1e3 / g_copy_gbs, (us[2] > 0 ? us[2] : us[0]) / us[1], us[2] > 0 ? " vs with copies" : "");
    for (int i = 0; i < m.nh; i++) dsv4_cuda_free(dd[i]), dsv4_cuda_free(ds[i]);
    dsv4_cuda_free(dx), dsv4_cuda_free(dy), dsv4_cuda_free(dxg), dsv4_cuda_free(dyg), free(x);
    mweights_free(&m);
}

/* The routed experts of one Flash layer (dim 4096, inter 2048, 256 MXFP4 experts with FP8 act quant, 6 a token) at
 * batch 1, 8, 256 and 2048- / 4096-token prefills, random routing (distinct experts a token; plans rotated so that L2 does not
 * serve the weights), the CUDA-core kernel ("old") against the tensor-core one ("new"). GB/s: the active experts'
 * weight bytes over the time. The two paths' y are also compared (the checks' tolerance). */
static void bench_moe(void) {
    const int E = 256, K = 6, D = 4096, I = 2048, NH = 4;
    hweight h1[NH], h3[NH], h2[NH];
    for (int i = 0; i < NH; i++)
        h1[i] = make_weight(DSV4_WF_MXFP4, I, D, 0, 1), h3[i] = make_weight(DSV4_WF_MXFP4, I, D, 0, 1),
        h2[i] = make_weight(DSV4_WF_MXFP4, D, I, 0, 1);
    dsv4_cuda_weight *d1 = malloc(sizeof(dsv4_cuda_weight) * E), *d3 = malloc(sizeof(dsv4_cuda_weight) * E),
                     *d2 = malloc(sizeof(dsv4_cuda_weight) * E);
    for (int e = 0; e < E; e++) {
        op_ok(dsv4_cuda_weight_upload(&h1[e % NH].w, &d1[e]), "upload");
        op_ok(dsv4_cuda_weight_upload(&h3[(e + 1) % NH].w, &d3[e]), "upload");
        op_ok(dsv4_cuda_weight_upload(&h2[(e + 2) % NH].w, &d2[e]), "upload");
    }
    dsv4_cuda_experts ex;
    op_ok(dsv4_cuda_experts_init(&ex, d1, d3, d2, E), "experts_init");
    const double eb = 2.0 * (double)dsv4_weight_bytes(&h1[0].w) + (double)dsv4_weight_bytes(&h2[0].w);
    static const int Ts[5] = {1, 8, 256, 2048, 4096};
    for (int ti = 0; ti < 5; ti++) {
        const int T = Ts[ti], NP = T <= 8 ? 16 : T <= 256 ? 4 : 2;
        float *x = randn((size_t)T * D, 1.0f);
        float *dx = dup_to_dev(x, sizeof(float) * (size_t)T * D), *dh = dsv4_cuda_alloc(sizeof(float) * (size_t)T * K * I),
              *dy = dsv4_cuda_alloc(sizeof(float) * (size_t)T * K * D);
        dsv4_cuda_moe_plan dp[16];
        double act = 0;
        int *sel = malloc(sizeof(int) * (size_t)T * K), *sid = malloc(sizeof(int) * T), *used = malloc(sizeof(int) * E);
        float *w = malloc(sizeof(float) * (size_t)T * K);
        for (int pi = 0; pi < NP; pi++) {
            memset(used, 0, sizeof(int) * E);
            for (int t = 0; t < T; t++) {
                sid[t] = t;
                for (int k = 0; k < K; k++) {
                    int e, dup;
                    do {
                        e = (int)(rnd_u32() % (uint32_t)E), dup = 0;
                        for (int j = 0; j < k; j++) dup |= sel[t * K + j] == e;
                    } while (dup);
                    sel[t * K + k] = e, w[t * K + k] = 0.1f + rnd_uni(), used[e] = 1;
                }
            }
            for (int e = 0; e < E; e++) act += used[e];
            int *dsel = dup_to_dev(sel, sizeof(int) * (size_t)T * K), *dsid = dup_to_dev(sid, sizeof(int) * T);
            float *dw = dup_to_dev(w, sizeof(float) * (size_t)T * K);
            dp[pi] = dplan_new(T, K, E);
            op_ok(dsv4_cuda_moe_group(dsel, dw, dsid, T, K, E, &dp[pi], NULL), "moe_group");
            sync_ok();
            dsv4_cuda_free(dsel), dsv4_cuda_free(dsid), dsv4_cuda_free(dw);
        }
        act /= NP;
        /* modes (dsv4_cuda_moe_experts_path): CUDA-core kernel, tensor cores, the tensor-core kernel before the ring
         * and before moe_pf2_kernel (weights in registers, 8-warp blocks), and that with the integer MXFP4 decode, with
         * the L2 prefetch; the default without programmatic dependent launch; moe_pf2_kernel on mma.sync rather than
         * wgmma (prefill sizes) */
        enum { NM = 7 };
        static const int modes[NM] = {1, 0, 16, 18, 20, 8, 32};
        static const char *mname[NM] = {"old (CUDA cores)", "new",           "tc, registers (before)",
                                        "tc, regs + integer decode", "tc, regs + L2 prefetch", "new, no PDL",
                                        "prefill on mma.sync"};
        double us[NM];
        float *yr[NM];
        const size_t ny = (size_t)T * K * D;
        for (int mi = 0; mi < NM; mi++) {
            dsv4_cuda_moe_experts_path(modes[mi]);
            const int it = T > 8 ? (mi ? 5 : 2) : T == 8 ? 48 : 160;
            /* y of plan 0 for the comparisons (the profiler range of bench/ncu runs: this call of "new", and of "before"
             * at decode sizes) */
            if ((T <= 8 && (mi == 1 || mi == 2)) || ((T == 256 || T == 2048) && mi == 1)) dsv4_cuda_profiler_range(1);
            op_ok(dsv4_cuda_moe_experts(&ex, dx, T, K, &dp[0], 10.0f, dh, dy, NULL), "moe_experts");
            sync_ok();
            if ((T <= 8 && (mi == 1 || mi == 2)) || ((T == 256 || T == 2048) && mi == 1)) dsv4_cuda_profiler_range(0);
            yr[mi] = malloc(sizeof(float) * ny);
            from_dev(yr[mi], dy, sizeof(float) * ny);
            for (int k = 0; k < 2; k++) op_ok(dsv4_cuda_moe_experts(&ex, dx, T, K, &dp[(k + 1) % NP], 10.0f, dh, dy, NULL), "moe_experts");
            cudaEvent_t e0, e1;
            cudaEventCreate(&e0), cudaEventCreate(&e1);
            cudaEventRecord(e0, 0);
            for (int k = 0; k < it; k++) dsv4_cuda_moe_experts(&ex, dx, T, K, &dp[k % NP], 10.0f, dh, dy, NULL);
            cudaEventRecord(e1, 0);
            sync_ok();
            float ms;
            cudaEventElapsedTime(&ms, e0, e1);
            us[mi] = 1000.0 * ms / it;
            cudaEventDestroy(e0), cudaEventDestroy(e1);
        }
        dsv4_cuda_moe_experts_path(0);
        const double gb = act * eb / 1e9, tf = 2.0 * T * K * 3.0 * D * I / 1e12;
        for (int mi = 0; mi < NM; mi++)
            printf("time moe_experts Flash MXFP4 aq T=%-4d (%5.1f experts, %6.1f MB) %-26s %8.1f us %6.0f GB/s (%5.1f%% of copy) %6.1f TFLOP/s%s\n",
                   T, act, gb * 1e3, mname[mi], us[mi], gb / us[mi] * 1e6, g_copy_gbs > 0 ? 100.0 * gb / us[mi] * 1e6 / g_copy_gbs : 0.0,
                   tf / us[mi] * 1e6, mi == 1 ? "  <<" : "");
        printf("time moe_experts Flash MXFP4 aq T=%-4d: old / new time = %.2fx, before / new = %.2fx\n", T, us[0] / us[1],
               us[2] / us[1]);
        {
            /* new against old, for information: the checks' tolerance per element. A few token-expert rows differ
             * more at T=2048 (20 of 12288 on the H200): where an h value sits on an FP8 rounding boundary, the two
             * kernels' fp32 sums (other orders) can round it to neighbouring e4m3 codes, and the row of y moves by
             * that step times a column of w2 (worst |d| 6.0 = 4 x 1.5). The bitwise checks below are the test. */
            const double at = 2e-4 * rms(yr[0], ny);
            int rows_bad = 0;
            double worst = 0;
            for (size_t r = 0; r < (size_t)T * K; r++) {
                int bad = 0;
                for (int d = 0; d < D; d++) {
                    const double a = yr[1][r * D + d], b = yr[0][r * D + d], dd = fabs(a - b), lim = at + 2e-4 * fabs(b);
                    if (!(dd <= lim)) bad = 1;
                    if (dd / lim > worst || isnan(a)) worst = isnan(a) ? INFINITY : dd / lim;
                }
                rows_bad += bad;
            }
            printf("info moe_experts Flash T=%d: new y vs old y: %d of %d token-expert rows beyond the checks' tolerance (worst %.2f "
                   "of tol: FP8 rounding flips of h)\n", T, rows_bad, T * K, worst);
            char name[96];
            for (int mi = 2; mi < NM; mi++) {
                snprintf(name, sizeof name, "moe_experts Flash T=%d: %s == new (bitwise)", T, mname[mi]);
                check(name, yr[mi], yr[1], ny, 0, 0);
            }
        }
        for (int mi = 0; mi < NM; mi++) free(yr[mi]);
        for (int pi = 0; pi < NP; pi++) dplan_free(&dp[pi]);
        dsv4_cuda_free(dx), dsv4_cuda_free(dh), dsv4_cuda_free(dy);
        free(x), free(sel), free(sid), free(used), free(w);
    }
    dsv4_cuda_experts_free(&ex);
    for (int e = 0; e < E; e++) dsv4_cuda_weight_free(&d1[e]), dsv4_cuda_weight_free(&d3[e]), dsv4_cuda_weight_free(&d2[e]);
    for (int i = 0; i < NH; i++) free_hweight(&h1[i]), free_hweight(&h3[i]), free_hweight(&h2[i]);
    /* the ceiling: mma.sync alone, as many accumulators a warp as the prefill kernels (16) or half, 8 / 16 warps an SM */
    for (int na = 8; na <= 16; na += 8)
        for (int b = 1; b <= 2; b++)
            printf("time mma.sync m16n8k16 f16->f32 alone: %2d accumulators a warp, %2d warps an SM: %6.1f TFLOP/s\n", na, 8 * b,
                   dsv4_moe_tc_mma_rate(na, b));
    free(d1), free(d3), free(d2);
}

int main(int argc, char **argv) {
    int bench = 1, only_lin = 0, only_gemm = 0, only_hc = 0, only_multi = 0, only_moe = 0, only_mt = 0, only_topk = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--no-bench")) bench = 0;
        else if (!strcmp(argv[i], "--only") && i + 1 < argc && !strcmp(argv[i + 1], "multi")) only_lin = only_multi = 1, i++;
        else if (!strcmp(argv[i], "--only") && i + 1 < argc && !strcmp(argv[i + 1], "linear")) only_lin = 1, i++;
        else if (!strcmp(argv[i], "--only") && i + 1 < argc && !strcmp(argv[i + 1], "mt")) only_lin = only_mt = 1, i++;
        else if (!strcmp(argv[i], "--only") && i + 1 < argc && !strcmp(argv[i + 1], "gemm")) only_lin = only_gemm = 1, i++;
        else if (!strcmp(argv[i], "--only") && i + 1 < argc && !strcmp(argv[i + 1], "hc")) only_hc = 1, i++;
        else if (!strcmp(argv[i], "--only") && i + 1 < argc && !strcmp(argv[i + 1], "moe")) only_moe = 1, i++;
        else if (!strcmp(argv[i], "--only") && i + 1 < argc && !strcmp(argv[i + 1], "moebench")) only_moe = 2, i++;
        else if (!strcmp(argv[i], "--only") && i + 1 < argc && !strcmp(argv[i + 1], "topk")) only_topk = 1, i++;
    }
    dsv4_cuda_info info;
    char err[256];
    if (dsv4_cuda_init(0, &info, err, sizeof err)) {
        fprintf(stderr, "cuda init: %s\n", err);
        return 2;
    }
    printf("device: %s, sm_%d%d, %d SMs, %.1f GiB, L2 %d MiB, smem/block %d KiB\n", info.name, info.cc_major, info.cc_minor,
           info.sm_count, info.mem_total / 1073741824.0, info.l2_bytes >> 20, info.smem_optin >> 10);

    if (only_hc) goto hc_checks;
    if (only_gemm) goto gemm_checks;
    if (only_multi) goto multi_checks;
    if (only_mt) goto mt_checks;
    if (only_moe == 2) goto checks_done; /* the MoE bench alone (bench/ncu runs) */
    if (only_moe) goto moe_checks;
    if (only_topk) goto topk_checks;
    /* linear: every format, decode (GEMV, 16-byte path) and odd sizes (element path), prefill (GEMM) */
    test_linear("wq_a", DSV4_WF_FP8, 1024, 4096, 1, 0, 1, 0);
    test_linear("wq_b", DSV4_WF_FP8, 4096, 1024, 4, 0, 1, 0);
    test_linear("f32-scale", DSV4_WF_FP8, 512, 1024, 2, 1, 1, 0);
    test_linear("T=16", DSV4_WF_FP8, 640, 4096, 16, 0, 1, 0);
    test_linear("odd", DSV4_WF_FP8, 200, 1000, 3, 0, 1, 0);
    test_linear("odd x:bf16", DSV4_WF_FP8, 130, 520, 2, 0, 1, 1);
    test_linear("gemm", DSV4_WF_FP8, 300, 640, 37, 0, 1, 0);
    test_linear("gemm odd", DSV4_WF_FP8, 129, 1000, 70, 1, 1, 0);
    test_linear("gemm odd", DSV4_WF_FP8, 129, 1000, 300, 1, 1, 0); /* past 256 rows: the tiled GEMM */
    test_linear("gemm odd", DSV4_WF_BF16, 77, 1003, 270, 0, 0, 0);
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
    /* the tensor-core GEMV at the model's shapes: T = 1..16 (one and two 8-token mma tiles), column slices over
     * warps and clusters (few rows), views, x in bf16, FP8 with and without act quant, FP4 with act quant */
    test_linear("wq_a T=8", DSV4_WF_FP8, 1024, 4096, 8, 0, 1, 0);
    test_linear("wq_a T=16", DSV4_WF_FP8, 1024, 4096, 16, 0, 1, 0);
    test_linear("wkv", DSV4_WF_FP8, 512, 4096, 5, 0, 1, 0);
    test_linear("wo_b", DSV4_WF_FP8, 4096, 8192, 3, 0, 1, 0);
    test_linear("wq_b", DSV4_WF_FP8, 32768, 1024, 2, 0, 1, 0);
    test_linear("shared w1 T=9", DSV4_WF_FP8, 2048, 4096, 9, 0, 1, 0);
    test_linear("Pro wq_a", DSV4_WF_FP8, 1536, 7168, 2, 0, 1, 0);
    test_linear("x:bf16", DSV4_WF_FP8, 1024, 4096, 3, 0, 1, 1);
    test_linear("no aq", DSV4_WF_FP8, 1024, 2048, 4, 0, 0, 0);
    test_linear("no aq T=12", DSV4_WF_FP8, 512, 1024, 12, 1, 0, 0);
    test_linear_v("", DSV4_WF_FP8, 1000, 2048, 4, 0, 1, 0, 40);
    test_linear_v("", DSV4_WF_FP8, 300, 1024, 2, 1, 1, 0, 129);
    test_linear("expert w1 T=16", DSV4_WF_MXFP4, 2048, 4096, 16, 0, 0, 0);
    test_linear("expert w2 T=3", DSV4_WF_MXFP4, 4096, 2048, 3, 0, 0, 0);
    test_linear("aq", DSV4_WF_MXFP4, 2048, 2048, 4, 0, 1, 0);
    test_linear_v("", DSV4_WF_MXFP4, 500, 1024, 2, 0, 0, 0, 3);
    test_linear("T=12", DSV4_WF_NVFP4, 1024, 4096, 12, 0, 0, 0);
    test_linear("expert w2", DSV4_WF_NVFP4, 4096, 2048, 8, 0, 0, 0);
    test_linear("x:bf16", DSV4_WF_NVFP4, 2048, 4096, 2, 0, 0, 1);
    test_linear("head-like", DSV4_WF_BF16, 4096, 4096, 3, 0, 0, 0);
    test_linear("T=16", DSV4_WF_BF16, 512, 4096, 16, 0, 0, 0);
    test_linear("x:bf16 T=9", DSV4_WF_BF16, 1024, 4096, 9, 0, 0, 1);
    test_linear("T=11", DSV4_WF_F16, 256, 4096, 11, 0, 0, 0);
    test_linear("hc fn T=4", DSV4_WF_F32, 24, 16384, 4, 0, 0, 0);
    test_linear("hc fn x:bf16", DSV4_WF_F32, 24, 16384, 2, 0, 0, 1);
    test_linear_invariant("wq_a", DSV4_WF_FP8, 1024, 4096, 1, 0);
    test_linear_invariant("wq_b", DSV4_WF_FP8, 32768, 1024, 1, 0);
    /* wo_b at T = 1 and 8 (x staged in 1 and 8 passes per warp) and bitwise T-invariant */
    test_linear("wo_b", DSV4_WF_FP8, 4096, 8192, 1, 0, 1, 0);
    test_linear("wo_b", DSV4_WF_FP8, 4096, 8192, 8, 0, 1, 0);
    test_linear_invariant("wo_b", DSV4_WF_FP8, 4096, 8192, 1, 0);
    test_linear_invariant("expert", DSV4_WF_MXFP4, 2048, 4096, 0, 0);
    test_linear_invariant("expert", DSV4_WF_NVFP4, 4096, 2048, 0, 0);
    test_linear_invariant("", DSV4_WF_BF16, 4096, 4096, 0, 0);
    test_linear_invariant("hc fn", DSV4_WF_F32, 24, 16384, 0, 0);
    test_linear_invariant("odd", DSV4_WF_FP8, 200, 1000, 1, 0); /* the element path: T-invariant up to 256 rows */
    test_linear_invariant("odd", DSV4_WF_NVFP4, 64, 200, 0, 1);
    test_linear_invariant("odd", DSV4_WF_BF16, 77, 1003, 0, 0);
    /* BF16 activations (act_bf16: linears of models without the FP8 recipe): every format that can carry it (all
     * but act-quant ones), T = 1, 5, 16, 40; odd sizes take the element path (T <= 16) and the tiled GEMM (T = 40) */
    test_linear_bf16act("head-like", DSV4_WF_BF16, 4096, 4096, 0);
    test_linear_bf16act("", DSV4_WF_F16, 256, 4096, 0);
    test_linear_bf16act("", DSV4_WF_F32, 96, 2048, 0);
    test_linear_bf16act("no aq", DSV4_WF_FP8, 1024, 2048, 0);
    test_linear_bf16act("expert w1", DSV4_WF_MXFP4, 2048, 4096, 0);
    test_linear_bf16act("wq_b", DSV4_WF_NVFP4, 4096, 1024, 0);
    test_linear_bf16act("wo_b", DSV4_WF_NVFP4, 1024, 8192, 0);
    test_linear_bf16act("", DSV4_WF_NVFP4, 300, 1024, 17);
    test_linear_bf16act("odd", DSV4_WF_BF16, 77, 1003, 0);
    test_linear_bf16act("odd", DSV4_WF_NVFP4, 64, 200, 0);
    test_linear_bf16act("odd", DSV4_WF_MXFP4, 100, 330, 0);
    test_linear_bf16act("odd", DSV4_WF_FP8, 129, 1000, 0);
    test_linear_ab("x:bf16", DSV4_WF_NVFP4, 1024, 4096, 3, 0, 0, 1, 0, 1); /* bf16 input: the rounding is a no-op */
    test_linear_ab("ignored with aq", DSV4_WF_FP8, 1024, 4096, 5, 0, 1, 0, 0, 1); /* the twin: act quant of fp32 x */
    test_linear_ab("ignored with aq", DSV4_WF_MXFP4, 2048, 2048, 40, 0, 1, 0, 0, 1);
    test_linear_invariant("", DSV4_WF_NVFP4, 4096, 2048, 0, 1);
    test_linear_invariant("", DSV4_WF_BF16, 4096, 4096, 0, 1);
    test_linear_invariant("", DSV4_WF_F16, 256, 4096, 0, 1);
    /* grouped linears (dsv4_cuda_linear_multi): bitwise the separate calls, T = 1, 3, 16, 40 */
multi_checks: {
        mspec wo8[8], b20[20];
        ms_wo_a(wo8, 8), ms_b20(b20);
        const mspec mx[3] = {{DSV4_WF_MXFP4, 2048, 2048, 0, 0, 0}, {DSV4_WF_MXFP4, 512, 2048, 0, 0, 0}, {DSV4_WF_MXFP4, 100, 2048, 0, 0, 0}};
        const mspec nv[2] = {{DSV4_WF_NVFP4, 1024, 4096, 0, 0, 0}, {DSV4_WF_NVFP4, 333, 4096, 0, 0, 0}};
        const mspec f32[2] = {{DSV4_WF_F32, 24, 2048, 0, 0, 0}, {DSV4_WF_F32, 48, 2048, 0, 0, 0}};
        const mspec f16[2] = {{DSV4_WF_F16, 256, 4096, 0, 0, 0}, {DSV4_WF_F16, 128, 4096, 0, 0, 0}};
        const mspec f8s[2] = {{DSV4_WF_FP8, 512, 1024, 0, 1, 0}, {DSV4_WF_FP8, 640, 1024, 0, 1, 0}};
        const mspec odd[2] = {{DSV4_WF_FP8, 200, 1000, 1, 0, 0}, {DSV4_WF_FP8, 130, 1000, 1, 0, 0}};
        test_linear_multi_T("wo_a groups Flash", wo8, 8, 1, 1, 1, 0);
        test_linear_multi_T("wq_a+wkv", qkv, 2, 0, 0, 0, 0);
        test_linear_multi_T("compressors+wproj", cmp, 5, 0, 0, 0, 0);
        test_linear_multi_T("gate+sw1+sw3", moe3, 3, 0, 0, 1, 0);
        test_linear_multi_T("", mx, 3, 0, 1, 1, 0);
        test_linear_multi_T("", nv, 2, 0, 0, 1, 0);
        test_linear_multi("act:bf16", nvab, 2, 0, 1, 1, 0, 5);
        test_linear_multi("", f32, 2, 0, 1, 1, 0, 3);
        test_linear_multi("", f16, 2, 0, 0, 1, 0, 5);
        test_linear_multi("no aq", f8s, 2, 0, 1, 1, 0, 12);
        test_linear_multi("no aq", f8s, 2, 0, 1, 1, 0, 40);
        test_linear_multi("wq_a+wkv", qkv, 2, 0, 1, 1, 1, 3);
        test_linear_multi("wq_a+wkv", qkv, 2, 0, 0, 1, 1, 17);
        test_linear_multi("20 jobs", b20, 20, 0, 1, 1, 0, 2);
        test_linear_multi("element path", odd, 2, 0, 1, 1, 0, 3);
        test_linear_multi("element path", odd, 2, 0, 1, 1, 0, 40);
        test_linear_multi("mixed", mix, 4, 0, 1, 1, 0, 3);
        test_linear_multi("mixed", mix, 4, 0, 1, 0, 0, 20);
        if (only_multi) goto checks_done;
    }
    /* the multi-token GEMM (dsv4_cuda_linear_ws): bitwise the GEMV for every format and x kind it takes, rows not a
     * multiple of its 128-row blocks, views, few rows (many column slices; less than a wave of blocks: a slice a block,
     * then their sums in order), T from its minimum to more than one pass;
     * grouped jobs (dsv4_cuda_linear_multi_ws) against the GEMV's single calls; F32 and odd shapes keep the GEMV */
mt_checks: {
        test_linear_mt("head-like", DSV4_WF_BF16, 1000, 4096, 200, 0, 0, 0, 0, 0);
        test_linear_mt("", DSV4_WF_BF16, 4096, 4096, DSV4_CUDA_LINEAR_WS_MIN_T, 0, 0, 0, 0, 0);
        test_linear_mt("GEMV kept", DSV4_WF_BF16, 4096, 4096, DSV4_CUDA_LINEAR_WS_MIN_T - 1, 0, 0, 0, 0, 0);
        test_linear_mt("2 passes", DSV4_WF_BF16, 512, 4096, 300, 0, 0, 0, 0, 0);
        test_linear_mt("", DSV4_WF_BF16, 1024, 4096, 64, 0, 0, 0, 1, 0);
        test_linear_mt("", DSV4_WF_BF16, 768, 2048, 177, 0, 0, 1, 0, 0);
        test_linear_mt("gate", DSV4_WF_BF16, 256, 4096, 256, 0, 0, 0, 0, 0);
        test_linear_mt("few rows", DSV4_WF_BF16, 64, 4096, 140, 0, 0, 0, 0, 0);
        test_linear_mt("wo_b", DSV4_WF_FP8, 4096, 8192, 64, 0, 1, 0, 0, 0);
        test_linear_mt("wq_b", DSV4_WF_FP8, 32768, 1024, 80, 0, 1, 0, 0, 0);
        test_linear_mt("4 slices, a wave", DSV4_WF_FP8, 8192, 4096, 256, 0, 1, 0, 0, 0);
        test_linear_mt("", DSV4_WF_FP8, 1000, 2048, 100, 0, 1, 0, 0, 128);
        test_linear_mt("f32 scales", DSV4_WF_FP8, 640, 1024, 150, 1, 1, 0, 0, 0);
        test_linear_mt("no aq", DSV4_WF_FP8, 1024, 2048, 130, 0, 0, 0, 0, 0);
        test_linear_mt("x:bf16", DSV4_WF_FP8, 1024, 4096, 133, 0, 1, 0, 1, 0);
        test_linear_mt("expert w1", DSV4_WF_MXFP4, 2048, 4096, 96, 0, 0, 0, 0, 0);
        test_linear_mt("aq", DSV4_WF_MXFP4, 2048, 2048, 130, 0, 1, 0, 0, 0);
        test_linear_mt("", DSV4_WF_MXFP4, 500, 1024, 170, 0, 0, 0, 0, 3);
        test_linear_mt("", DSV4_WF_NVFP4, 1024, 4096, 64, 0, 0, 0, 0, 0);
        test_linear_mt("", DSV4_WF_NVFP4, 300, 1024, 133, 0, 0, 0, 0, 17);
        test_linear_mt("", DSV4_WF_NVFP4, 2048, 4096, 140, 0, 0, 1, 0, 0);
        test_linear_mt("", DSV4_WF_F16, 256, 4096, 150, 0, 0, 0, 0, 0);
        test_linear_mt("", DSV4_WF_F16, 256, 4096, 150, 0, 0, 1, 0, 0);
        test_linear_mt("GEMV kept", DSV4_WF_F32, 24, 2048, 130, 0, 0, 0, 0, 0);
        test_linear_mt("element path kept", DSV4_WF_FP8, 200, 1000, 130, 0, 1, 0, 0, 0);
        mspec wo8[8], b20[20];
        ms_wo_a(wo8, 8), ms_b20(b20);
        g_lwsb = dsv4_cuda_linear_ws_bytes(300, 20 * 4096, 20);
        g_lws = dsv4_cuda_alloc(g_lwsb);
        test_linear_multi("wo_a groups Flash", wo8, 8, 1, 1, 1, 0, 64);
        test_linear_multi("wo_a groups Flash", wo8, 8, 1, 1, 1, 0, 256);
        test_linear_multi("wo_a groups Flash", wo8, 8, 1, 1, 1, 0, 300);
        test_linear_multi("wq_a+wkv", qkv, 2, 0, 0, 0, 0, 128);
        test_linear_multi("wq_a+wkv x:bf16", qkv, 2, 0, 1, 1, 1, 140);
        test_linear_multi("compressors+wproj", cmp, 5, 0, 0, 0, 0, 100);
        test_linear_multi("gate+sw1+sw3", moe3, 3, 0, 0, 1, 0, 133);
        test_linear_multi("act:bf16", nvab, 2, 0, 1, 1, 0, 148);
        test_linear_multi("20 jobs", b20, 20, 0, 1, 1, 0, 130);
        test_linear_multi("mixed", mix, 4, 0, 1, 1, 0, 150);
        dsv4_cuda_free(g_lws);
        g_lws = NULL, g_lwsb = 0;
        if (only_mt) goto checks_done;
    }
    /* the FP8 prefill GEMM (cuBLASLt) at Flash shapes: T = 64 .. 2048, K = 1024 .. 8192, N = 512 .. 32768 */
gemm_checks:
    test_linear_gemm_declines();
    test_linear_gemm("wq_a", 1024, 4096, 64, 0, 0);
    test_linear_gemm("wkv", 512, 4096, 512, 0, 0);
    test_linear_gemm("tail", 2048, 4096, 67, 0, 0);
    test_linear_gemm("wo_a group", 1024, 4096, 130, 1, 1024);
    test_linear_gemm("wq_b", 32768, 1024, 2048, 0, 0);
    test_linear_gemm("wo_b", 4096, 8192, 512, 0, 0);
    test_linear_gemm("shared w1", 2048, 4096, 2048, 0, 0);
    test_linear_gemm("shared w2", 4096, 2048, 1021, 0, 0);
    test_linear_gemm_split("gate", DSV4_WF_BF16, 256, 4096, 130, 0, 0, 0);
    test_linear_gemm_split("compressor", DSV4_WF_BF16, 1024, 4096, 512, 0, 0, 0);
    test_linear_gemm_split("compressor", DSV4_WF_BF16, 1024, 4096, 67, 0, 1, 0);
    test_linear_gemm_split("wo_a group", DSV4_WF_FP8, 1024, 4096, 257, 3072, 0, 1);
    test_linear_gemm_split("wo_a group", DSV4_WF_FP8, 1024, 4096, 64, 0, 1, 1);
    test_linear_gemm_split("odd", DSV4_WF_BF16, 200, 520, 99, 8, 0, 1);
    if (only_lin) goto checks_done;

    test_rmsnorm(4, 4096, 4096, 1);
    test_rmsnorm(3, 1024, 1024, 1);
    test_rmsnorm(4 * 64, 512, 512, 0);
    test_rmsnorm(5, 1000, 1024, 1);
    test_rope(5, 64, 512, 32, 0);
    test_rope(5, 64, 512, 32, 1);
    test_rope(3, 64, 128, 32, 0);
    test_rope(2, 3, 70, 5, 1);
    test_norm_rope_q8(1, 1, 512, 32, 1, 448, 64);   /* the kv row (Flash) */
    test_norm_rope_q8(7, 1, 512, 32, 1, 448, 64);
    test_norm_rope_q8(3, 64, 512, 32, 0, 0, 0);     /* the query heads */
    test_norm_rope_q8(5, 1, 128, 32, 1, 64, 64);    /* a compressor entry of head dim 128 */
    test_norm_rope_q8(2, 3, 4096, 32, 1, 4032, 128); /* RQ 4 */
    test_norm_rope_q8(2, 2, 70, 5, 1, 60, 32);       /* the unfused fallback (n % 4 != 0) */
    test_rope_hq4(3, 64, 128, 32, 0, 0);  /* the indexer's queries (Flash) */
    test_rope_hq4(1, 64, 128, 32, 0, 0);
    test_rope_hq4(5, 1, 128, 32, 1, 1);   /* an indexer compressor entry */
    test_rope_hq4(37, 64, 128, 32, 0, 0); /* the warp form: a prefill's queries, rows not a multiple of 8 */
    test_rope_hq4(7, 1, 128, 32, 1, 0);   /* the warp form's norm without weights */
    test_rope_hq4(3, 5, 256, 32, 0, 0);   /* the warp form at n 256, 512 */
    test_rope_hq4(2, 3, 512, 64, 0, 0);
    test_rope_hq4(2, 9, 128, 0, 0, 0);    /* no RoPE pairs */
    test_rope_hq4(3, 2, 256, 32, 1, 1);   /* a norm past 128 values: the block form */
    test_rope_hq4(2, 1, 1024, 32, 1, 1);  /* RQ 1 at its widest, 8 KB of doubles */
    test_rope_hq4(2, 2, 4096, 32, 1, 0);  /* past 48 KB of shared memory: the separate kernels */
    test_quant(0, 16, 448, 512, 64);   /* window / compressed keys: first Dh - rope values */
    test_quant(0, 8, 4096, 4096, 128); /* act quant of linear inputs */
    test_quant(0, 3, 1000, 1003, 128);
    test_quant(1, 64, 128, 128, 32); /* indexer */
    test_quant(1, 5, 100, 101, 32);
    test_quant(2, 64, 128, 128, 0);
    test_quant(2, 4, 4096, 4096, 0);
    test_quant(2, 37, 32, 35, 0);      /* the warp-per-row kernel: n 32 .. 512, rows not a multiple of 8, ld > n */
    test_quant(2, 11, 64, 64, 0);
    test_quant(2, 9, 256, 260, 0);
    test_quant(2, 5, 512, 512, 0);
    test_quant(2, 3, 1024, 1024, 0);   /* the block-per-row kernel */
    test_quant(3, 64, 128, 128, 32);
    test_quant(3, 7, 512, 512, 32);

hc_checks:
    test_hc(3, 4, 4096, DSV4_WF_F32, 20);
    test_hc(2, 4, 1000, DSV4_WF_BF16, 3);
    test_hc(1, 3, 64, DSV4_WF_F32, 0);
    test_hc(1, 4, 4096, DSV4_WF_F32, 20); /* Flash shapes: the few-token path, then (T >= 32) the tiled one */
    test_hc(8, 4, 4096, DSV4_WF_F32, 20);
    test_hc(300, 4, 4096, DSV4_WF_F32, 20);
    test_hc(40, 4, 1000, DSV4_WF_BF16, 3);   /* many tokens, the few-token path (BF16 fn, ragged super-chunk) */
    test_hc(37, 3, 1024, DSV4_WF_F32, 20);   /* tiled path, M 3 (15 rows), a partial token tile */
    if (only_hc) goto checks_done;

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

    /* device-side decode step pieces: top-k, MoE grouping, grouped experts, attention index lists */
topk_checks:
    test_topk(6, 1024, 512, 0);      /* Flash: top-512 of context 4096's entries */
    test_topk(5, 4096, 1024, 0);     /* Pro */
    test_topk(7, 300, 16, 5);        /* exact ties (few levels, many zeros): torch's choice and order */
    test_topk(9, 8, 4, 3);           /* tiny models: 8 entries, top-4, mostly ties */
    test_topk(4, 40000, 64, 3);
    test_topk(3, 50, 64, 0);         /* k > n: every entry, sorted */
    test_topk(6, 3000, 40, 2);       /* k * 64 <= n: torch's partial_sort path, with ties */
    test_topk(256, 2048, 512, 3);    /* batch 256 at 8K (ratio 4), every row tied: the tie path in shared memory */
    test_topk(4, 8192, 512, 3);      /* the longest rows it takes; 8193 and more: the scratch (40000 above) */
    test_topk(3, 8193, 512, 3);
    if (only_topk) goto checks_done;
moe_checks:
    test_moe_group(1, 6, 256);
    test_moe_group(8, 6, 256);
    test_moe_group(256, 6, 256);
    test_moe_group(100, 8, 384);
    test_moe_group(33, 2, 8);
    test_moe_experts("flash", DSV4_WF_MXFP4, DSV4_WF_MXFP4, 0, 0, 3, 6, 8, 4096, 2048);
    test_moe_experts("batch", DSV4_WF_MXFP4, DSV4_WF_MXFP4, 0, 0, 40, 2, 8, 512, 256); /* > 8 rows per expert */
    test_moe_experts("", DSV4_WF_NVFP4, DSV4_WF_NVFP4, 0, 0, 9, 3, 8, 512, 256);
    test_moe_experts("", DSV4_WF_FP8, DSV4_WF_FP8, 1, 0, 5, 2, 6, 512, 384);
    test_moe_experts("", DSV4_WF_BF16, DSV4_WF_BF16, 0, 0, 4, 2, 8, 64, 32);
    test_moe_experts("odd", DSV4_WF_FP8, DSV4_WF_BF16, 1, 0, 6, 2, 5, 200, 72);
    test_moe_experts("T=1", DSV4_WF_MXFP4, DSV4_WF_MXFP4, 0, 0, 1, 6, 32, 1024, 512);
    /* BF16 activations (NVFP4-only / BF16 models) */
    test_moe_experts("", DSV4_WF_NVFP4, DSV4_WF_NVFP4, 0, 1, 9, 3, 8, 512, 256);
    test_moe_experts("batch", DSV4_WF_NVFP4, DSV4_WF_NVFP4, 0, 1, 40, 2, 8, 512, 256);
    test_moe_experts("", DSV4_WF_BF16, DSV4_WF_BF16, 0, 1, 4, 2, 8, 64, 32);
    test_moe_experts("odd", DSV4_WF_FP8, DSV4_WF_BF16, 0, 1, 6, 2, 5, 200, 72);
    test_moe_group(2048, 6, 256);
    test_moe_group(4096, 6, 256); /* the largest group: bitmap + prefix counts in shared memory */
    test_moe_group_limit();
    /* tensor cores: act quant at decode sizes (8 / 16 tokens a chunk) and on the pre-quantized 64-token path (>= 16
     * rows per expert on average; more than 64 rows: several chunks), every format */
    test_moe_experts("T=1 aq", DSV4_WF_MXFP4, DSV4_WF_MXFP4, 1, 0, 1, 6, 32, 4096, 2048);
    test_moe_experts("T=12 aq", DSV4_WF_MXFP4, DSV4_WF_MXFP4, 1, 0, 12, 6, 16, 1024, 512);
    test_moe_experts("pq", DSV4_WF_MXFP4, DSV4_WF_MXFP4, 1, 0, 160, 2, 8, 512, 256);
    test_moe_experts("pq flash", DSV4_WF_MXFP4, DSV4_WF_MXFP4, 1, 0, 48, 2, 4, 4096, 2048);
    test_moe_experts("pq chunks", DSV4_WF_MXFP4, DSV4_WF_MXFP4, 1, 0, 300, 2, 4, 512, 512);
    test_moe_experts("pq", DSV4_WF_NVFP4, DSV4_WF_NVFP4, 1, 0, 100, 2, 4, 1024, 512);
    test_moe_experts("pq", DSV4_WF_FP8, DSV4_WF_FP8, 1, 0, 100, 2, 4, 512, 512);
    test_moe_experts("T=16", DSV4_WF_NVFP4, DSV4_WF_NVFP4, 1, 0, 16, 3, 8, 1024, 512);
    test_moe_experts("T=12", DSV4_WF_FP8, DSV4_WF_FP8, 1, 0, 12, 3, 8, 1024, 512);
    test_moe_invariant("pq", DSV4_WF_MXFP4, 1, 200, 6, 16, 1024, 512);
    /* prefill sizes with unit counts that are not a multiple of 4 (NU 3 / 5 / 6 / 2): the decode ring at many tokens an
     * expert (not the pre-quantized path, which needs NU % 4 == 0) */
    test_moe_experts("pf", DSV4_WF_MXFP4, DSV4_WF_MXFP4, 1, 0, 2048, 6, 256, 384, 256);
    test_moe_experts("pf chunks", DSV4_WF_MXFP4, DSV4_WF_MXFP4, 1, 0, 700, 6, 32, 640, 384);
    test_moe_invariant("pf", DSV4_WF_MXFP4, 1, 300, 6, 16, 768, 768);
    /* the MXFP4 prefill pipeline (moe_pf2_kernel on wgmma: NU % 4 == 0 and S <= 2, i.e. Flash's widths): ~175 tokens an
     * expert (chunks of 64, 64 and a rest), gate/up and down, against the register kernels and tokens alone (the ring);
     * "pq flash" above has one partial chunk an expert; moebench compares it with every other kernel at Flash's E */
    test_moe_invariant("pf flash", DSV4_WF_MXFP4, 1, 700, 2, 8, 4096, 2048);
    test_moe_invariant("decode", DSV4_WF_MXFP4, 1, 12, 6, 16, 1024, 512);
    /* decode with many expert slots (the ring kernels at a large batch) */
    test_moe_invariant("decode, many experts", DSV4_WF_MXFP4, 1, 64, 6, 256, 2048, 1024);
    test_moe_invariant("decode, many experts", DSV4_WF_NVFP4, 0, 64, 6, 256, 2048, 1024);
    test_moe_invariant("", DSV4_WF_MXFP4, 0, 40, 2, 8, 512, 256);
    test_moe_invariant("pq", DSV4_WF_NVFP4, 1, 200, 6, 16, 1024, 512);
    test_moe_invariant("pq", DSV4_WF_FP8, 1, 200, 6, 16, 512, 512);
    if (only_moe) goto checks_done;
    {
        int p0a[4] = {0, 5, 300, 0}, na[4] = {3, 1, 1, 0}; /* decode-like: ring + own rows */
        test_attn_index(4, 8, 4, 16, p0a, na);
        test_attn_index(4, 8, 128, 16, p0a, na);
        test_attn_index(4, 8, 0, 16, p0a, na);
        int p0b[3] = {10, 0, 0}, nb[3] = {40, 17, 0}; /* prefill chunks longer than the window */
        test_attn_index(3, 16, 4, 32, p0b, nb);
        test_attn_index(3, 16, 16, 32, p0b, nb);
        int p0c[5] = {0, 7, 300, 4095, 0}, nc[5] = {1, 1, 1, 1, 0}; /* decode: one row per slot, Flash head_dim */
        test_ring_store(5, 128, 512, 64, p0c, nc);
        int p0d[3] = {10, 0, 5}, nd[3] = {40, 17, 3}; /* prefill chunks longer and shorter than the window */
        test_ring_store(3, 16, 512, 64, p0d, nd);
        test_ring_store(3, 16, 192, 64, p0d, nd); /* two 64-blocks */
        test_ring_store(3, 8, 704, 128, p0d, nd); /* more 64-blocks than warps */
        /* the compressor over passes that cut windows anywhere (decode-like single rows, chunks shorter and longer
         * than a window, a long pass): CSA (m 4, overlap), HCA (m 128), the indexer's (m 4, d 128) */
        const int cuts[] = {1, 3, 1, 1, 6, 9, 1, 40, 2, 300, 1, 5};
        test_cmp_batch(4, 512, 1, cuts, 12);
        test_cmp_batch(4, 128, 1, cuts, 12);
        test_cmp_batch(128, 512, 0, cuts, 12);
        test_cmp_batch(8, 64, 0, cuts, 12);
        test_cmp_batch(3, 96, 1, cuts, 12);
    }

checks_done:
    printf("%d checks, %d failed\n", g_checks, g_fail);

    if (bench && only_moe) {
        bench_copy();
        bench_moe();
    } else if (bench) {
        /* Flash (dim 4096, q_lora 1024, 64 x 512 heads, expert 2048) and Pro (dim 7168, q_lora 1536, 128 heads,
         * expert 3072) decode shapes; FP4 experts take 1..8 rows each */
        static const int T16[6] = {1, 2, 4, 8, 12, 16}, T8[4] = {1, 2, 4, 8}, T1[2] = {1, 4};
        static const int TP[2] = {512, 2048};
        if (only_hc) {
            bench_hc(1), bench_hc(8), bench_hc(2048);
            return g_fail ? 1 : 0;
        }
        if (only_gemm) goto gemm_bench;
        if (only_mt) { /* Flash's linears at batch 32 .. 256 (decode): GEMV against the multi-token GEMM */
            static const int TM[4] = {32, 64, 128, 256};
            bench_mt("head Flash", DSV4_WF_BF16, 129280, 4096, 0, 1, TM, 4);
            bench_mt("wo_a groups Flash", DSV4_WF_FP8, 1024, 4096, 1, 8, TM, 4);
            bench_mt("wo_b Flash", DSV4_WF_FP8, 4096, 8192, 1, 1, TM, 4);
            bench_mt("wq_b Flash", DSV4_WF_FP8, 32768, 1024, 1, 1, TM, 4);
            bench_mt("gate Flash", DSV4_WF_BF16, 256, 4096, 0, 1, TM, 4);
            bench_mt("shared w2 Flash", DSV4_WF_FP8, 4096, 2048, 1, 1, TM, 4);
            return g_fail ? 1 : 0;
        }
        bench_copy();
        {
            mspec wo8[16];
            ms_wo_a(wo8, 16);
            const mspec sw[2] = {{DSV4_WF_FP8, 2048, 4096, 1, 0, 0}, {DSV4_WF_FP8, 2048, 4096, 1, 0, 0}};
            bench_linear_multi("wo_a 8 groups Flash", wo8, 8, 1, 1, 1);
            bench_linear_multi("wo_a 8 groups Flash", wo8, 8, 1, 1, 8);
            bench_linear_multi("wo_a 16 groups Pro", wo8, 16, 1, 1, 1);
            bench_linear_multi("wq_a+wkv Flash", qkv, 2, 0, 0, 1);
            bench_linear_multi("wq_a+wkv Flash", qkv, 2, 0, 0, 8);
            bench_linear_multi("cmp+idx cmp+wproj Flash", cmp, 5, 0, 0, 1);
            bench_linear_multi("cmp wkv+wgate Flash c4", cmp, 2, 0, 0, 1);
            bench_linear_multi("shared w1+w3 Flash", sw, 2, 0, 0, 1);
            bench_linear_multi("shared w1+w3 Flash", sw, 2, 0, 0, 8);
        }
        if (only_multi) { /* the single linears the grouped ones replace, for comparison with older builds */
            bench_linear("wq_a Flash", DSV4_WF_FP8, 1024, 4096, T16, 6, 1);
            bench_linear("wkv Flash", DSV4_WF_FP8, 512, 4096, T8, 4, 1);
            bench_linear("wo_b Flash", DSV4_WF_FP8, 4096, 8192, T16, 6, 1);
            bench_linear("shared w1/w3 Flash", DSV4_WF_FP8, 2048, 4096, T8, 4, 1);
            bench_linear("expert w1 Flash", DSV4_WF_MXFP4, 2048, 4096, T8, 4, 0);
            bench_linear("head-like", DSV4_WF_BF16, 4096, 4096, T1, 2, 0);
            return g_fail ? 1 : 0;
        }
        bench_linear("wq_b Flash", DSV4_WF_FP8, 32768, 1024, T16, 6, 1);
        bench_linear("wq_a Flash", DSV4_WF_FP8, 1024, 4096, T16, 6, 1);
        bench_linear("wkv Flash", DSV4_WF_FP8, 512, 4096, T8, 4, 1);
        bench_linear("wo_b Flash", DSV4_WF_FP8, 4096, 8192, T16, 6, 1);
        bench_linear("shared w1/w3 Flash", DSV4_WF_FP8, 2048, 4096, T8, 4, 1);
        bench_linear("shared w2 Flash", DSV4_WF_FP8, 4096, 2048, T8, 4, 1);
        bench_linear("wq_b Pro", DSV4_WF_FP8, 65536, 1536, T16, 6, 1);
        bench_linear("wo_b Pro", DSV4_WF_FP8, 7168, 16384, T8, 4, 1);
        bench_linear("expert w1 Flash", DSV4_WF_MXFP4, 2048, 4096, T8, 4, 0);
        bench_linear("expert w2 Flash", DSV4_WF_MXFP4, 4096, 2048, T8, 4, 0);
        bench_linear("expert w1 Flash", DSV4_WF_NVFP4, 2048, 4096, T8, 4, 0);
        bench_linear("expert w1 Pro", DSV4_WF_MXFP4, 3072, 7168, T8, 4, 0);
        bench_linear("8 experts w1 stacked", DSV4_WF_MXFP4, 16384, 4096, T8, 4, 0);
        bench_linear("head Flash", DSV4_WF_BF16, 129280, 4096, T1, 2, 0);
        bench_linear("hc fn Flash", DSV4_WF_F32, 24, 16384, T1, 1, 0);
        bench_hc(1), bench_hc(8), bench_hc(2048);
        bench_linear("prefill", DSV4_WF_FP8, 4096, 4096, TP, 2, 1);
        bench_linear("prefill wq_b Flash", DSV4_WF_FP8, 32768, 1024, TP + 1, 1, 1);
        bench_linear("prefill", DSV4_WF_MXFP4, 2048, 4096, TP, 1, 0);
    gemm_bench:
        bench_linear_gemm("", 4096, 4096, 512);
        bench_linear_gemm("", 4096, 4096, 2048);
        bench_linear_gemm("wq_a Flash", 1024, 4096, 1024);
        bench_linear_gemm("wq_b Flash", 32768, 1024, 1024);
        bench_linear_gemm("wq_b Flash", 32768, 1024, 2048);
        bench_linear_gemm("wkv Flash", 512, 4096, 1024);
        bench_linear_gemm("wo_b Flash", 4096, 8192, 1024);
        bench_linear_gemm("shared w1 Flash", 2048, 4096, 1024);
        bench_linear_gemm("shared w2 Flash", 4096, 2048, 1024);
        bench_linear_gemm("wq_b Pro", 65536, 1536, 2048);
        if (!only_lin) {
            int nv[1] = {640}, nv8[8] = {640, 640, 640, 640, 640, 640, 640, 640};
            test_attn(1, 64, 512, 100000, 640, nv, 1);
            test_attn(8, 64, 512, 100000, 640, nv8, 1);
        }
    }
    return g_fail ? 1 : 0;
}
