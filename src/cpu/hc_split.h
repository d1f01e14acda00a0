/* hc_split.h - the mHC weights (spec 4): pre, post and the Sinkhorn-normalized comb from a token's mixes,
 * shared by the CPU op (src/cpu/ops.c) and its GPU twin (src/cuda/mhc.cu), so both run the same steps. */
#ifndef DSV4_CPU_HC_SPLIT_H
#define DSV4_CPU_HC_SPLIT_H

#include <math.h>

#ifdef __CUDACC__
#define DSV4_HC_HD __host__ __device__
#else
#define DSV4_HC_HD
#endif

static inline DSV4_HC_HD float dsv4_hc_sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }

/* pre[j] = sigmoid(mix[j] * scale0 + base[j]) + hc_eps, j < M (also the head's weights). */
static inline DSV4_HC_HD void dsv4_hc_pre_weights(const float *mix, int M, float scale0, const float *base, float hc_eps,
                                                  float *pre) {
    for (int j = 0; j < M; j++) pre[j] = dsv4_hc_sigmoid(mix[j] * scale0 + base[j]) + hc_eps;
}

/* post[j] = 2 sigmoid(mix[M + j] * scale[1] + base[M + j]); C [M, M] = the comb logits mix[2M ..] * scale[2] +
 * base[2M ..], a row softmax + hc_eps, then `iters` Sinkhorn rounds (column normalization; from the second round
 * on a row normalization first), each division by (sum + hc_eps). */
static inline DSV4_HC_HD void dsv4_hc_post_comb(const float *mix, int M, const float *scale, const float *base, int iters,
                                                float hc_eps, float *post, float *C) {
    for (int j = 0; j < M; j++) post[j] = 2.0f * dsv4_hc_sigmoid(mix[M + j] * scale[1] + base[M + j]);
    for (int j = 0; j < M; j++)
        for (int k = 0; k < M; k++) C[j * M + k] = mix[2 * M + j * M + k] * scale[2] + base[2 * M + j * M + k];
    for (int j = 0; j < M; j++) { /* row softmax + eps */
        float mx = -INFINITY, s = 0;
        for (int k = 0; k < M; k++) mx = fmaxf(mx, C[j * M + k]);
        for (int k = 0; k < M; k++) s += (C[j * M + k] = expf(C[j * M + k] - mx));
        for (int k = 0; k < M; k++) C[j * M + k] = C[j * M + k] / s + hc_eps;
    }
    for (int it = 0; it < iters; it++) {
        if (it > 0)
            for (int j = 0; j < M; j++) {
                float s = 0;
                for (int k = 0; k < M; k++) s += C[j * M + k];
                for (int k = 0; k < M; k++) C[j * M + k] /= (s + hc_eps);
            }
        for (int k = 0; k < M; k++) {
            float s = 0;
            for (int j = 0; j < M; j++) s += C[j * M + k];
            for (int j = 0; j < M; j++) C[j * M + k] /= (s + hc_eps);
        }
    }
}

#endif
