/* moe.cu - the MoE router (sqrt-softplus scores, bias top-k or hash selection, normalized weights)
 * and SwiGLU with clamps (spec 11). Twins: the router loop and swiglu() of
 * src/model/forward_moe.c. */
#include "common.cuh"
#include "moe_router.cuh"

#define ROUTER_MAXK 32

/* One warp per token. The biased scores live in shared memory; K rounds of a warp arg-max (ties
 * to the lower expert id) pick the experts in decreasing order. */
__global__ void __launch_bounds__(32) router_kernel(const float *logits, int E, int K, const float *bias, const int *tid2eid,
                                                    const int *tokens, float route_scale, int *sel, float *weight) {
    dev_pdl_enter();
    extern __shared__ float rs[];
    float *s = rs, *bs = rs + E;
    __shared__ int pick[ROUTER_MAXK];
    const int t = blockIdx.x, lane = threadIdx.x;
    const float *lt = logits + (int64_t)t * E;
    for (int e = lane; e < E; e += 32) {
        float z = lt[e];
        float sp = z > 20.0f ? z : log1pf(expf(z));
        s[e] = sqrtf(sp);
        if (!tid2eid) bs[e] = s[e] + bias[e];
    }
    __syncwarp();
    if (tid2eid) {
        if (lane < K) pick[lane] = tid2eid[(int64_t)tokens[t] * K + lane];
    } else {
        for (int k = 0; k < K; k++) {
            float best = -INFINITY;
            int bi = 0x7fffffff;
            for (int e = lane; e < E; e += 32)
                if (bs[e] > best) best = bs[e], bi = e;
#pragma unroll
            for (int o = 16; o > 0; o >>= 1) {
                float ob = __shfl_xor_sync(0xffffffffu, best, o);
                int oi = __shfl_xor_sync(0xffffffffu, bi, o);
                if (ob > best || (ob == best && oi < bi)) best = ob, bi = oi;
            }
            if (lane == 0) {
                pick[k] = bi;
                bs[bi] = -INFINITY;
            }
            __syncwarp();
        }
    }
    __syncwarp();
    if (lane == 0) {
        float sum = 0;
        for (int k = 0; k < K; k++) sum += s[pick[k]];
        for (int k = 0; k < K; k++) {
            sel[(int64_t)t * K + k] = pick[k];
            weight[(int64_t)t * K + k] = s[pick[k]] / sum * route_scale;
        }
    }
}

/* E <= 32 * ROUTER_RPL (moe_router.cuh): one warp per token */
__global__ void __launch_bounds__(32) router_reg_kernel(const float *logits, int E, int K, const float *bias, const int *tid2eid,
                                                        const int *tokens, float route_scale, int *sel, float *weight) {
    dev_pdl_enter();
    __shared__ float s[32 * ROUTER_RPL];
    const int t = blockIdx.x;
    router_reg_warp(logits + (int64_t)t * E, E, K, bias, tid2eid, tid2eid ? tokens[t] : 0, route_scale, s, sel + (int64_t)t * K,
                    weight + (int64_t)t * K);
}

extern "C" int dsv4_cuda_router(const float *logits, int T, int E, int K, const float *bias, const int *tid2eid,
                                const int *tokens, float route_scale, int *sel, float *weight, void *stream) {
    if (T < 0 || E <= 0 || E > 4096 || K <= 0 || K > ROUTER_MAXK || K > E || (!tid2eid && !bias) || (tid2eid && !tokens))
        return dsv4_cuda_fail("router: bad arguments (T %d E %d K %d)", T, E, K);
    if (!T) return 0;
    if (E <= 32 * ROUTER_RPL)
        dev_launch(router_reg_kernel, T, 32, 0, DSV4_STREAM(stream), logits, E, K, bias, tid2eid, tokens, route_scale, sel, weight);
    else
        dev_launch(router_kernel, T, 32, sizeof(float) * 2 * (size_t)E, DSV4_STREAM(stream), logits, E, K, bias, tid2eid, tokens,
                   route_scale, sel, weight);
    return dsv4_cuda_check_launch("router");
}

__global__ void swiglu_kernel(const float *g, const float *u, int64_t ld, int T, int I, float lim, const float *rw, float *out) {
    dev_pdl_enter();
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (int64_t)T * I) return;
    int t = (int)(i / I), c = (int)(i - (int64_t)t * I);
    out[i] = dev_swiglu(g[(int64_t)t * ld + c], u[(int64_t)t * ld + c], lim, rw ? rw[t] : 1.0f);
}

extern "C" int dsv4_cuda_swiglu(const float *g, const float *u, int64_t ld, int T, int I, float lim, const float *rw, float *out,
                                void *stream) {
    if (T < 0 || I <= 0 || ld < I) return dsv4_cuda_fail("swiglu: bad shape (T %d I %d ld %lld)", T, I, (long long)ld);
    int64_t n = (int64_t)T * I;
    if (!n) return 0;
    dev_launch(swiglu_kernel, (unsigned)((n + 255) / 256), 256, 0, DSV4_STREAM(stream), g, u, ld, T, I, lim, rw, out);
    return dsv4_cuda_check_launch("swiglu");
}
