/* mhc.cu - manifold-constrained hyper-connections (spec 4): pre (mix, sigmoid gates, Sinkhorn-
 * normalized combination, weighted sum of the M streams), post (recombination), head. Twins:
 * dsv4_cpu_hc_pre / _post / _head. One block per token for pre / head: the (2+M)*M mixing rows
 * are dot products over the token's M*D stream values (a warp per row), the tiny M x M Sinkhorn runs
 * on one thread, the same code as the twin (src/cpu/hc_split.h). */
#include "common.cuh"
#include "../cpu/hc_split.h"

#define HC_MAXM 16

/* HEAD = 0: pre (x, post, comb); HEAD = 1: head (y = x). */
template <int HEAD>
__global__ void __launch_bounds__(256) hc_pre_kernel(const float *X, int M, int D, dsv4_cuda_weight fn, const float *scale,
                                                     const float *base, int iters, float norm_eps, float hc_eps,
                                                     float *x, float *post, float *comb) {
    __shared__ float mix[(2 + HC_MAXM) * HC_MAXM];
    __shared__ float pre[HC_MAXM];
    __shared__ double part[8];
    const int t = blockIdx.x, MD = M * D, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const float *Xt = X + (int64_t)t * MD;
    double ss = 0;
    for (int i = threadIdx.x; i < MD; i += 256) ss += (double)Xt[i] * Xt[i];
    ss = warp_sum_d(ss);
    if (lane == 0) part[warp] = ss;
    __syncthreads();
    if (threadIdx.x == 0) {
        double s = 0;
        for (int w = 0; w < 8; w++) s += part[w];
        part[0] = s;
    }
    __syncthreads();
    const float r = 1.0f / sqrtf((float)(part[0] / MD) + norm_eps);
    const int nr = HEAD ? M : (2 + M) * M;
    for (int row = warp; row < nr; row += 8) {
        float acc = 0;
        if (fn.fmt == DSV4_WF_F32) {
            const float *wr = (const float *)fn.data + ((int64_t)fn.row0 + row) * fn.cols;
            for (int c = lane; c < MD; c += 32) acc = fmaf(wr[c], Xt[c], acc);
        } else {
            for (int c = lane; c < MD; c += 32) acc = fmaf(dev_weight_at(fn, row, c), Xt[c], acc);
        }
        acc = warp_sum(acc);
        if (lane == 0) mix[row] = acc * r;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        dsv4_hc_pre_weights(mix, M, scale[0], base, hc_eps, pre);
        if (!HEAD) dsv4_hc_post_comb(mix, M, scale, base, iters, hc_eps, post + (int64_t)t * M, comb + (int64_t)t * M * M);
    }
    __syncthreads();
    float *xt = x + (int64_t)t * D;
    for (int d = threadIdx.x; d < D; d += 256) {
        float acc = 0;
        for (int j = 0; j < M; j++) acc = fmaf(pre[j], Xt[(int64_t)j * D + d], acc);
        xt[d] = acc;
    }
}

static int hc_check(const char *op, int T, int M, int D, const dsv4_cuda_weight *fn, int nr) {
    if (T < 0 || M <= 0 || M > HC_MAXM || D <= 0 || !fn || fn->rows != nr || fn->cols != M * D)
        return dsv4_cuda_fail("%s: bad shape (T %d M %d D %d, fn %dx%d)", op, T, M, D, fn ? fn->rows : 0, fn ? fn->cols : 0);
    return 0;
}

extern "C" int dsv4_cuda_hc_pre(const float *X, int T, int M, int D, const dsv4_cuda_weight *fn, const float *scale,
                                const float *base, int iters, float norm_eps, float hc_eps, float *x, float *post,
                                float *comb, void *stream) {
    if (hc_check("hc_pre", T, M, D, fn, (2 + M) * M)) return -1;
    if (!T) return 0;
    hc_pre_kernel<0><<<T, 256, 0, DSV4_STREAM(stream)>>>(X, M, D, *fn, scale, base, iters, norm_eps, hc_eps, x, post, comb);
    return dsv4_cuda_check_launch("hc_pre");
}

extern "C" int dsv4_cuda_hc_head(const float *X, int T, int M, int D, const dsv4_cuda_weight *fn, const float *scale,
                                 const float *base, float norm_eps, float hc_eps, float *y, void *stream) {
    if (hc_check("hc_head", T, M, D, fn, M)) return -1;
    if (!T) return 0;
    hc_pre_kernel<1><<<T, 256, 0, DSV4_STREAM(stream)>>>(X, M, D, *fn, scale, base, 0, norm_eps, hc_eps, y, NULL, NULL);
    return dsv4_cuda_check_launch("hc_head");
}

/* post: thread per (token, d); the M old stream values are read before any is written. */
__global__ void hc_post_kernel(const float *f, float *X, int M, int D, const float *post, const float *comb) {
    int t = blockIdx.y, d = blockIdx.x * blockDim.x + threadIdx.x;
    if (d >= D) return;
    float *Xt = X + (int64_t)t * M * D;
    const float *pt = post + (int64_t)t * M, *C = comb + (int64_t)t * M * M;
    float old[HC_MAXM];
#pragma unroll
    for (int j = 0; j < HC_MAXM; j++) old[j] = j < M ? Xt[(int64_t)j * D + d] : 0.0f;
    float fd = f[(int64_t)t * D + d];
    for (int k = 0; k < M; k++) {
        float acc = __fmul_rn(pt[k], fd);
#pragma unroll
        for (int j = 0; j < HC_MAXM; j++)
            if (j < M) acc = fmaf(C[j * M + k], old[j], acc);
        Xt[(int64_t)k * D + d] = acc;
    }
}

extern "C" int dsv4_cuda_hc_post(const float *f, float *X, int T, int M, int D, const float *post, const float *comb,
                                 void *stream) {
    if (T < 0 || M <= 0 || M > HC_MAXM || D <= 0) return dsv4_cuda_fail("hc_post: bad shape (T %d M %d D %d)", T, M, D);
    if (!T) return 0;
    dim3 grid((D + 255) / 256, T);
    hc_post_kernel<<<grid, 256, 0, DSV4_STREAM(stream)>>>(f, X, M, D, post, comb);
    return dsv4_cuda_check_launch("hc_post");
}
