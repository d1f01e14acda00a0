/* kt_util.c - test_kernels' helpers (kt.h): the random inputs, device copies, the closeness and bitwise checks, and
 * random weights in every release format with their host copies. */
#include "kt.h"

int g_fail, g_checks;

/* ---- helpers ---- */

static uint64_t rng = 0x9e3779b97f4a7c15ull;
uint32_t rnd_u32(void) {
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return (uint32_t)(rng >> 11);
}
uint64_t rnd_state_get(void) { return rng; }
void rnd_state_set(uint64_t s) { rng = s; }
float rnd_uni(void) { return (float)((rnd_u32() >> 8) * (1.0 / 16777216.0)); } /* [0, 1) */
float rnd_n(void) {
    float u = rnd_uni() + 1e-7f, v = rnd_uni();
    return sqrtf(-2.0f * logf(u)) * cosf(6.2831853f * v);
}
float *randn(size_t n, float sd) {
    float *p = malloc(sizeof(float) * (n ? n : 1));
    for (size_t i = 0; i < n; i++) p[i] = rnd_n() * sd;
    return p;
}
/* values spread over 6 decades, so every act-quant block gets its own scale */
float *rand_wide(size_t n) {
    float *p = malloc(sizeof(float) * (n ? n : 1));
    float mag = 1;
    for (size_t i = 0; i < n; i++) {
        if (i % 32 == 0) mag = powf(10.0f, 6.0f * rnd_uni() - 3.0f);
        p[i] = rnd_n() * mag;
    }
    return p;
}

void *dup_to_dev(const void *h, size_t bytes) {
    void *d = dsv4_cuda_alloc(bytes);
    if (!d || dsv4_cuda_upload(d, h, bytes)) {
        fprintf(stderr, "device buffer: %s\n", dsv4_cuda_last_error());
        exit(2);
    }
    return d;
}
void from_dev(void *h, const void *d, size_t bytes) {
    if (dsv4_cuda_download(h, d, bytes)) {
        fprintf(stderr, "download: %s\n", dsv4_cuda_last_error());
        exit(2);
    }
}
void op_ok(int rc, const char *what) {
    if (rc) {
        fprintf(stderr, "%s: %s\n", what, dsv4_cuda_last_error());
        exit(2);
    }
}
void sync_ok(void) {
    cudaError_t e = cudaDeviceSynchronize();
    if (e != cudaSuccess) {
        fprintf(stderr, "device error: %s\n", cudaGetErrorString(e));
        exit(2);
    }
}

double rms(const float *v, size_t n) {
    double s = 0;
    for (size_t i = 0; i < n; i++) s += (double)v[i] * v[i];
    return n ? sqrt(s / n) : 0;
}

/* The one rule. Returns 1 on pass. */
int check(const char *name, const float *got, const float *ref, size_t n, double atol, double rtol) {
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


static uint8_t rnd_e4m3(void) { /* any non-NaN code */
    uint8_t b = (uint8_t)rnd_u32();
    return (b & 0x7f) == 0x7f ? (uint8_t)(b ^ 1) : b;
}

hweight make_weight(dsv4_wfmt fmt, int R, int C, int scale_f32, int act_quant) {
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

void free_hweight(hweight *h) {
    free(h->data);
    free(h->scale);
}


/* bitwise comparison (a count of differing elements is printed) */
void check_same(const char *name, const float *got, const float *ref, size_t n) {
    size_t nbad = 0;
    for (size_t i = 0; i < n; i++) nbad += memcmp(got + i, ref + i, sizeof(float)) != 0;
    g_checks++;
    if (nbad) g_fail++;
    printf("%-4s %-44s n=%-9zu %zu elements differ (bitwise)%s\n", nbad ? "FAIL" : "ok", name, n, nbad, nbad ? " <<<" : "");
}
