/* moe_group.cuh - the MoE grouping of one block and the router + grouping of few tokens in one block (moe_group.cu's
 * kernels; the linear chain's routing tail, linear.cu): device code shared by the two files (C++, included by .cu
 * files only). */
#ifndef DSV4_CUDA_MOE_GROUP_CUH
#define DSV4_CUDA_MOE_GROUP_CUH

#include "cuda_model.h"
#include "moe_router.cuh"

#define GROUP_THREADS 1024
#define GROUP_MAXT DSV4_MOE_GROUP_MAXT
#define GROUP_MAXK 32

/* Is pick k of token t used, and its expert: idle tokens pick nothing, an expert out of range is skipped,
 * a repeated expert counts at its first pick only. */
__device__ __forceinline__ int pick_used(const int *sel, const int *sid, int t, int k, int K, int E, int *e) {
    if (sid[t] < 0) return 0;
    const int *st = sel + (int64_t)t * K;
    const int v = st[k];
    if (v < 0 || v >= E) return 0;
    for (int j = 0; j < k; j++)
        if (st[j] == v) return 0;
    *e = v;
    return 1;
}

/* Exclusive block-wide scan of two counters at once (blockDim.x a multiple of 32, <= 1024). */
static __device__ void block_scan2(int a, int b, int *ea, int *eb, int *ta, int *tb) {
    __shared__ int wa[32], wb[32];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    int ia = a, ib = b;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        int va = __shfl_up_sync(0xffffffffu, ia, o), vb = __shfl_up_sync(0xffffffffu, ib, o);
        if (lane >= o) ia += va, ib += vb;
    }
    if (lane == 31) wa[warp] = ia, wb[warp] = ib;
    __syncthreads();
    if (warp == 0) {
        int sa = lane < nw ? wa[lane] : 0, sb = lane < nw ? wb[lane] : 0;
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
            int va = __shfl_up_sync(0xffffffffu, sa, o), vb = __shfl_up_sync(0xffffffffu, sb, o);
            if (lane >= o) sa += va, sb += vb;
        }
        if (lane < nw) wa[lane] = sa, wb[lane] = sb; /* inclusive over warps */
    }
    __syncthreads();
    const int pa = warp ? wa[warp - 1] : 0, pb = warp ? wb[warp - 1] : 0;
    *ea = pa + ia - a;
    *eb = pb + ib - b;
    *ta = wa[nw - 1];
    *tb = wb[nw - 1];
    __syncthreads();
}

/* A token's rank among its expert's tokens: the prefix count of its group of 4 bitmap words, the words before its own
 * in the group, the bits below it in its word (one count per 4 words keeps 384 experts x 4096 tokens in shared memory:
 * Pro's 4096-row prefill passes in one group). */
__device__ __forceinline__ int group_rank(const uint32_t *bm, const uint16_t *pre, int t) {
    const int w = t >> 5;
    int r = pre[w >> 2] + __popc(bm[w] & ((1u << (t & 31)) - 1u));
    for (int v = w & ~3; v < w; v++) r += __popc(bm[v]);
    return r;
}

/* CACHE (T * K <= GROUP_CACHE): the picks and slot ids are read from global memory once, into shared memory, and each
 * pick's expert (or -1) is decided once; else every step reads them. Any block size (a multiple of 32, <= 1024) gives
 * the same plan. */
#define GROUP_CACHE 2048

template <int CACHE>
__device__ __forceinline__ void moe_group_block(const int *sel, const float *ew, const int *sid, int T, int K, int E,
                                                const dsv4_cuda_moe_plan &p, uint32_t *gsm) {
    const int NW = (T + 31) / 32, NQ = (NW + 3) / 4, TK = T * K;
    uint32_t *bm = gsm;                          /* [E][NW]: token bitmap of each expert */
    int *base = (int *)(bm + (size_t)E * NW);    /* [E]: first slot of each expert */
    int *pe = base + E;                          /* CACHE: [T * K] each pick's expert, -1 when unused */
    uint16_t *pre = (uint16_t *)(pe + (CACHE ? 2 * TK + T : 0)); /* [E][NQ]: the expert's tokens below word 4q */
    int *ssel = pe + (CACHE ? TK : 0), *ssid = ssel + (CACHE ? TK : 0); /* CACHE: [T * K] sel, [T] sid */
    const int tid = threadIdx.x, nth = blockDim.x;
    const float ew0 = CACHE && tid < TK ? ew[tid] : 0.0f; /* the first pick's weight, loaded early */
    if (CACHE) {
        for (int q = tid; q < TK; q += nth) ssel[q] = sel[q];
        for (int t = tid; t < T; t += nth) ssid[t] = sid[t];
    }
    for (int i = tid; i < E * NW; i += nth) bm[i] = 0;
    __syncthreads();
    const int *gs = CACHE ? ssel : sel, *gi = CACHE ? ssid : sid;
    for (int q = tid; q < TK; q += nth) {
        int t = q / K, e;
        const int used = pick_used(gs, gi, t, q - t * K, K, E, &e);
        if (CACHE) pe[q] = used ? e : -1;
        if (used) atomicOr(&bm[e * NW + (t >> 5)], 1u << (t & 31));
    }
    __syncthreads();
    /* counts per expert, scanned over the experts (a contiguous run of experts per thread) */
    const int per = (E + nth - 1) / nth, e0 = tid * per, e1 = e0 + per < E ? e0 + per : E;
    int cnt = 0, act = 0;
    for (int e = e0; e < e1; e++) {
        int c = 0;
        for (int w = 0; w < NW; w++) {
            if (!(w & 3)) pre[e * NQ + (w >> 2)] = (uint16_t)c;
            c += __popc(bm[e * NW + w]);
        }
        base[e] = c;
        cnt += c;
        act += c > 0;
    }
    int ca, aa, tc, ta;
    block_scan2(cnt, act, &ca, &aa, &tc, &ta);
    for (int e = e0; e < e1; e++) {
        const int c = base[e];
        base[e] = ca;
        if (c) {
            p.act_e[aa] = e;
            p.act_off[aa] = ca;
            p.act_cnt[aa] = c;
            aa++;
        }
        ca += c;
    }
    if (tid == 0) *p.nact = ta;
    __syncthreads();
    /* scatter: a token's rank in its expert's list = the tokens below it in the expert's bitmap */
    for (int q = tid; q < TK; q += nth) {
        int t = q / K, e;
        if (CACHE ? (e = pe[q]) < 0 : !pick_used(sel, sid, t, q - t * K, K, E, &e)) continue;
        const int rank = group_rank(bm + e * NW, pre + e * NQ, t);
        const int slot = base[e] + rank;
        p.rows[slot] = t;
        p.rw[slot] = CACHE && q == tid ? ew0 : ew[q];
    }
    /* each token's slots in increasing expert id (= increasing slot) */
    for (int t = tid; t < T; t += nth) {
        int sl[GROUP_MAXK], ns = 0;
        for (int k = 0; k < K; k++) {
            int e;
            if (CACHE ? (e = pe[t * K + k]) < 0 : !pick_used(sel, sid, t, k, K, E, &e)) continue;
            const int rank = group_rank(bm + e * NW, pre + e * NQ, t);
            int v = base[e] + rank, i = ns++;
            while (i > 0 && sl[i - 1] > v) sl[i] = sl[i - 1], i--;
            sl[i] = v;
        }
        for (int k = 0; k < K; k++) p.tslot[(int64_t)t * K + k] = k < ns ? sl[k] : -1;
    }
}

/* Few tokens (T <= ROUTE_GROUP_T, E <= 32 * ROUTER_RPL): the router and the grouping in one block, one launch fewer on
 * the decode chain. Warp t routes token t (router_reg_warp: moe.cu's router_reg_kernel's code) into shared memory, then
 * the block groups those picks (moe_group_block, cached); the picks and weights also go to sel / weight. The same
 * values as dsv4_cuda_router then dsv4_cuda_moe_group. Shared memory gsm: group_smem's, then from goff the picks
 * [T * K], the weights [T * K] and each warp's scores [T][32 * ROUTER_RPL] (moe_route_smem). Any block of at least
 * 32 T threads (a multiple of 32, <= 1024). */
#define ROUTE_GROUP_T 8
__device__ __forceinline__ void moe_route_group_block(const float *logits, int E, int K, const float *bias, const int *tid2eid,
                                                      const int *tokens, float route_scale, const int *sid, int T, size_t goff,
                                                      int *sel, float *weight, const dsv4_cuda_moe_plan &p, uint32_t *gsm) {
    int *ssel = (int *)((unsigned char *)gsm + goff);
    float *sw = (float *)(ssel + T * K), *ssc = sw + T * K;
    const int warp = threadIdx.x >> 5;
    if (warp < T)
        router_reg_warp(logits + (int64_t)warp * E, E, K, bias, tid2eid, tid2eid ? tokens[warp] : 0, route_scale,
                        ssc + warp * 32 * ROUTER_RPL, ssel + warp * K, sw + warp * K);
    __syncthreads();
    for (int q = threadIdx.x; q < T * K; q += blockDim.x) sel[q] = ssel[q], weight[q] = sw[q];
    moe_group_block<1>(ssel, sw, sid, T, K, E, p, gsm);
}

/* The kernel's shared memory for T tokens: the [E][NW] bitmap, the experts' first slots, the cached picks, the
 * [E][NW / 4] prefix counts. */
static inline size_t group_smem(int T, int K, int E) {
    size_t smem = sizeof(uint32_t) * (size_t)E * ((T + 31) / 32) + sizeof(int) * (size_t)E;
    if (T * K <= GROUP_CACHE) smem += sizeof(int) * (2 * (size_t)T * K + T);
    return smem + sizeof(uint16_t) * (size_t)E * ((T + 127) / 128); /* prefix counts per 4 bitmap words */
}

/* moe_route_group_block's shared memory for T tokens; *goff: where its picks start */
static inline size_t moe_route_smem(int T, int K, int E, size_t *goff) {
    *goff = (group_smem(T, K, E) + 15) & ~(size_t)15;
    return *goff + sizeof(float) * (2 * (size_t)T * K + (size_t)T * 32 * ROUTER_RPL);
}

#endif
