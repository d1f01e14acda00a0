/* ops.h - float32 CPU reference of every DeepSeek-V4 op (spec sections 4-11). Plain pointers, shapes
 * in the comments; rows of a batch are independent, so results do not depend on what else is in
 * the batch or on the number of threads. */
#ifndef DSV4_CPU_OPS_H
#define DSV4_CPU_OPS_H

#include "../quant/weight.h"

/* sum a[i] * b[i], accumulated in double. */
float dsv4_cpu_dot(const float *a, const float *b, int n);

/* y[T, w.rows] = x[T, w.cols] . w^T. With w->act_quant, each input row is first rounded by the FP8
 * act_quant simulation (block 128), as the release's FP8 GEMMs do (spec 14.3-14.4). */
void dsv4_cpu_linear(const dsv4_weight *w, const float *x, int T, float *y);

/* Weighted RMSNorm over n values, in place: x = w * x / sqrt(mean(x^2) + eps) (spec 5). w may be
 * NULL (unweighted). */
void dsv4_cpu_rmsnorm(float *x, int n, const float *w, float eps);

/* Interleaved RoPE on the last 2*npairs values of x: pair i = (x[off+2i], x[off+2i+1]) rotated by
 * angle pos*freq[i] (inverse: -angle). Spec 6. */
void dsv4_cpu_rope(float *x, int n, int npairs, const float *freq, int pos, int inverse);

/* mHC (spec 4). X: [M, D] streams of one token. */
void dsv4_cpu_hc_pre(const float *X, int M, int D, const dsv4_weight *fn, const float *scale, const float *base,
                     int iters, float norm_eps, float hc_eps, float *x, float *post, float *comb);
void dsv4_cpu_hc_post(const float *f, float *X, int M, int D, const float *post, const float *comb);
void dsv4_cpu_hc_head(const float *X, int M, int D, const dsv4_weight *fn, const float *scale, const float *base,
                      float norm_eps, float hc_eps, float *y);

/* Sparse attention with a sink (spec 7.1) for one query: q [H, Dh]; keys [n, Dh] addressed by
 * kv[i] (n pointers, K = V); out [H, Dh]. */
void dsv4_cpu_sparse_attn(const float *q, int H, int Dh, const float *const *kv, int n, const float *sink,
                          float scale, float *out);

#endif
