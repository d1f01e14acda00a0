/* moe_router.cuh - the router of one token by one warp, for E <= 32 * ROUTER_RPL experts (moe.cu's router_reg_kernel,
 * moe_group.cu's fused route + group kernel): each lane's scores in registers; a pick is the warp's largest biased score
 * as an order-preserving key (__reduce_max_sync), then the lowest expert id holding it (__reduce_min_sync); a lane per
 * pick forms the weights. The same picks and weights as moe.cu's router_kernel (shared-memory scores). */
#pragma once
#include "common.cuh"

#define ROUTER_RPL 8

/* order-preserving key of a biased score; 0 (never picked) for -inf and NaN, which `bs[e] > best` never picks */
__device__ __forceinline__ unsigned router_key(float b) {
    if (!(b > -INFINITY)) return 0u;
    const unsigned u = __float_as_uint(b + 0.0f); /* -0 -> +0: equal scores, equal keys */
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

/* the token's logits lt [E] -> its K picks osel[k] and weights ow[k] (lanes k < K write them); token: its id (read for
 * tid2eid only); s: 32 * ROUTER_RPL floats of shared memory, the warp's own */
__device__ __forceinline__ void router_reg_warp(const float *lt, int E, int K, const float *bias, const int *tid2eid, int token,
                                                float route_scale, float *s, int *osel, float *ow) {
    const int lane = threadIdx.x & 31;
    float z[ROUTER_RPL], bv[ROUTER_RPL];
    unsigned key[ROUTER_RPL];
    int pk = 0;
    if (tid2eid && lane < K) pk = tid2eid[(int64_t)token * K + lane];
#pragma unroll
    for (int i = 0; i < ROUTER_RPL; i++) {
        const int e = lane + 32 * i;
        z[i] = e < E ? lt[e] : 0.0f;
        bv[i] = e < E && !tid2eid ? bias[e] : 0.0f;
    }
#pragma unroll
    for (int i = 0; i < ROUTER_RPL; i++) {
        const int e = lane + 32 * i;
        key[i] = 0u;
        if (e >= E) continue;
        const float sp = z[i] > 20.0f ? z[i] : log1pf(expf(z[i]));
        const float si = sqrtf(sp);
        s[e] = si;
        if (!tid2eid) key[i] = router_key(si + bv[i]);
    }
    if (!tid2eid) {
        for (int k = 0; k < K; k++) {
            unsigned best = 0u;
            int bi = 0x7fffffff;
#pragma unroll
            for (int i = 0; i < ROUTER_RPL; i++)
                if (key[i] > best) best = key[i], bi = lane + 32 * i;
            const unsigned m = __reduce_max_sync(0xffffffffu, best);
            const int w = __reduce_min_sync(0xffffffffu, m && best == m ? bi : 0x7fffffff);
            if (lane == k) pk = w;
            if (m && (w & 31) == lane)
#pragma unroll
                for (int i = 0; i < ROUTER_RPL; i++)
                    if (i == (w >> 5)) key[i] = 0u;
        }
    }
    __syncwarp();
    const float sk = lane < K && pk >= 0 && pk < E ? s[pk] : 0.0f;
    float sum = 0;
    for (int k = 0; k < K; k++) sum += __shfl_sync(0xffffffffu, sk, k);
    if (lane < K) {
        osel[lane] = pk;
        ow[lane] = sk / sum * route_scale;
    }
}
