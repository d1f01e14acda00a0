/* ops.c - see ops.h. */
#include "ops.h"
#include "hc_split.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../quant/formats.h"

/* Dot product accumulated in double (four independent lanes): nearly the exact value, so the
 * FP8/FP4 rounding simulations downstream rarely land on the other side of a midpoint from the
 * float32 reference (see bench/NOTES.md, "rounding flips"). */
float dsv4_cpu_dot(const float *a, const float *b, int n) {
    /* eight double lanes; with a float product exact in double (24+24 bits < 53) the only rounding
     * is in the sums */
    double s[8] = {0};
    int j = 0;
    for (; j + 8 <= n; j += 8)
        for (int k = 0; k < 8; k++) s[k] += (double)a[j + k] * (double)b[j + k];
    for (; j < n; j++) s[0] += (double)a[j] * b[j];
    return (float)(((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7])));
}

void dsv4_cpu_linear(const dsv4_weight *w, const float *x, int T, float *y) {
    const int R = w->rows, C = w->cols;
    const float *xin = x;
    float *xq = NULL;
    if (w->act_quant) {
        xq = malloc(sizeof(float) * (size_t)T * C);
        memcpy(xq, x, sizeof(float) * (size_t)T * C);
        for (int t = 0; t < T; t++) dsv4_act_quant_fp8(xq + (size_t)t * C, (size_t)C, 128);
        xin = xq;
    }
    /* threads only pay off past ~a million multiply-adds */
#pragma omp parallel if ((long long)R * C * (T + 4) > (1LL << 21))
    {
        float *row = malloc(sizeof(float) * (size_t)C);
#pragma omp for schedule(static)
        for (int r = 0; r < R; r++) {
            dsv4_weight_row(w, r, row);
            for (int t = 0; t < T; t++) y[(size_t)t * R + r] = dsv4_cpu_dot(row, xin + (size_t)t * C, C);
        }
        free(row);
    }
    free(xq);
}

void dsv4_cpu_rmsnorm(float *x, int n, const float *w, float eps) {
    double ss = 0;
    for (int i = 0; i < n; i++) ss += (double)x[i] * x[i];
    float r = 1.0f / sqrtf((float)(ss / n) + eps);
    for (int i = 0; i < n; i++) x[i] = w ? w[i] * (x[i] * r) : x[i] * r;
}

void dsv4_cpu_rope(float *x, int n, int npairs, const float *freq, int pos, int inverse) {
    float *p = x + n - 2 * npairs;
    for (int i = 0; i < npairs; i++) {
        float ang = (float)pos * freq[i];
        float c = cosf(ang), s = sinf(ang);
        if (inverse) s = -s;
        float a = p[2 * i], b = p[2 * i + 1];
        p[2 * i] = a * c - b * s;
        p[2 * i + 1] = a * s + b * c;
    }
}


/* r * (fn . xf) for the rows of fn, with r = 1/sqrt(mean(xf^2) + eps). */
static void hc_mix(const float *X, int MD, const dsv4_weight *fn, float norm_eps, float *mix) {
    double ss = 0;
    for (int i = 0; i < MD; i++) ss += (double)X[i] * X[i];
    float r = 1.0f / sqrtf((float)(ss / MD) + norm_eps);
    float *row = malloc(sizeof(float) * (size_t)MD);
    for (int t = 0; t < fn->rows; t++) {
        dsv4_weight_row(fn, t, row);
        float acc = 0;
        for (int c = 0; c < MD; c++) acc += row[c] * X[c];
        mix[t] = acc * r;
    }
    free(row);
}

void dsv4_cpu_hc_pre(const float *X, int M, int D, const dsv4_weight *fn, const float *scale, const float *base,
                     int iters, float norm_eps, float hc_eps, float *x, float *post, float *comb) {
    float mix[(2 + 16) * 16];
    float pre[16];
    hc_mix(X, M * D, fn, norm_eps, mix);
    dsv4_hc_pre_weights(mix, M, scale[0], base, hc_eps, pre);
    dsv4_hc_post_comb(mix, M, scale, base, iters, hc_eps, post, comb);
    for (int d = 0; d < D; d++) {
        float acc = 0;
        for (int j = 0; j < M; j++) acc += pre[j] * X[j * D + d];
        x[d] = acc;
    }
}

void dsv4_cpu_hc_post(const float *f, float *X, int M, int D, const float *post, const float *comb) {
    float *old = malloc(sizeof(float) * (size_t)M * D);
    memcpy(old, X, sizeof(float) * (size_t)M * D);
    for (int k = 0; k < M; k++)
        for (int d = 0; d < D; d++) {
            float acc = post[k] * f[d];
            for (int j = 0; j < M; j++) acc += comb[j * M + k] * old[j * D + d];
            X[k * D + d] = acc;
        }
    free(old);
}

void dsv4_cpu_hc_head(const float *X, int M, int D, const dsv4_weight *fn, const float *scale, const float *base,
                      float norm_eps, float hc_eps, float *y) {
    float mix[16], pre[16];
    hc_mix(X, M * D, fn, norm_eps, mix);
    dsv4_hc_pre_weights(mix, M, scale[0], base, hc_eps, pre);
    for (int d = 0; d < D; d++) {
        float acc = 0;
        for (int j = 0; j < M; j++) acc += pre[j] * X[j * D + d];
        y[d] = acc;
    }
}

void dsv4_cpu_sparse_attn(const float *q, int H, int Dh, const float *const *kv, int n, const float *sink,
                          float scale, float *out) {
    float *s = malloc(sizeof(float) * (size_t)(n ? n : 1));
    for (int h = 0; h < H; h++) {
        const float *qh = q + (size_t)h * Dh;
        float *oh = out + (size_t)h * Dh;
        float mx = -INFINITY;
        for (int t = 0; t < n; t++) {
            float acc = 0; /* float, in order: this matches the reference's rounding best (measured) */
            for (int d = 0; d < Dh; d++) acc += qh[d] * kv[t][d];
            s[t] = acc * scale;
            mx = fmaxf(mx, s[t]);
        }
        memset(oh, 0, sizeof(float) * (size_t)Dh);
        if (n == 0) continue;
        /* as torch: softmax over [scores, sink], then the weighted sum of the normalized weights */
        float den = 0;
        for (int t = 0; t < n; t++) den += (s[t] = expf(s[t] - mx));
        den += expf(sink[h] - mx);
        for (int d = 0; d < Dh; d++) {
            double acc = 0;
            for (int t = 0; t < n; t++) acc += (double)(s[t] / den) * kv[t][d];
            oh[d] = (float)acc;
        }
    }
    free(s);
}
