/* moe_group.cu - the routed experts of a MoE layer on the device, with no host round trip (cuda_model.h,
 * "MoE on the device"):
 *   1. moe_group: the router's picks -> per-expert token lists (count, scan, scatter) in a deterministic
 *      order (each expert's tokens in increasing order, the active experts in increasing id), and each
 *      token's slots in increasing expert id;
 *   2. moe_experts: two grouped launches over (active expert, block of output rows) with a fixed launch
 *      shape: gate + up (w1, w3) with the SwiGLU and routing weight fused, then down (w2). FP8 / MXFP4 /
 *      NVFP4 matrices with columns a multiple of 128 go to the tensor-core kernel of moe_tc.cu; the others
 *      here: a warp streams two weight rows 16 bytes per lane (wvec.cuh) against up to 8 of the expert's
 *      token rows staged in shared memory; every output value is one warp's dot product over the whole row
 *      in a fixed order, so it does not depend on which other tokens share the expert (batch invariance);
 *   3. moe_combine: each token's expert outputs summed in increasing expert id, then the shared expert:
 *      the CPU's order (src/model/forward_moe.c), by one thread per output element, no atomics. */
#include "cuda_model.h"
#include "moe_router.cuh"
#include "moe_tc.h"
#include "wvec.cuh"

/* ---- 1. grouping: one block ---- */

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
__device__ void block_scan2(int a, int b, int *ea, int *eb, int *ta, int *tb) {
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

template <int CACHE>
__global__ void __launch_bounds__(GROUP_THREADS) moe_group_kernel(const int *sel, const float *ew, const int *sid, int T, int K,
                                                                  int E, dsv4_cuda_moe_plan p) {
    dev_pdl_enter();
    extern __shared__ uint32_t gsm[];
    moe_group_block<CACHE>(sel, ew, sid, T, K, E, p, gsm);
}

/* Few tokens (T <= ROUTE_GROUP_T, E <= 32 * ROUTER_RPL): the router and the grouping in one block, one launch fewer on
 * the decode chain. Warp t routes token t (router_reg_warp: moe.cu's router_reg_kernel's code) into shared memory, then
 * the block groups those picks (moe_group_block, cached); the picks and weights also go to sel / weight. The same
 * values as dsv4_cuda_router then dsv4_cuda_moe_group. Shared memory: group_smem's, then the picks [T * K], the
 * weights [T * K] and each warp's scores [T][32 * ROUTER_RPL]. */
#define ROUTE_GROUP_T 8
__global__ void __launch_bounds__(GROUP_THREADS) moe_route_group_kernel(const float *logits, int E, int K, const float *bias,
                                                                        const int *tid2eid, const int *tokens, float route_scale,
                                                                        const int *sid, int T, size_t goff, int *sel,
                                                                        float *weight, dsv4_cuda_moe_plan p) {
    dev_pdl_enter();
    extern __shared__ uint32_t gsm[];
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

/* ---- 1b. grouping of a large pass over many blocks (plan.gcnt set, more than GROUP_CACHE picks) ----
 * The single block above walks every pick of a 4096-token pass on one SM (~176 us a call in session 30's 8K prefill
 * profile, two calls a layer). Here block b takes tokens [b GB_T, (b + 1) GB_T): moe_gcount_kernel counts each expert's
 * tokens in it (gcnt [NB][E]); moe_gscatter_kernel then has every block scan those counts (the experts' first slots,
 * the tokens of blocks before its own) and place its tokens. The plan is the single block's, value for value: each
 * expert's tokens in increasing order (blocks in order, a token's rank in its block from the block's bitmap), the
 * active experts in increasing id, each token's slots in increasing expert id. */
#define GB_T 256 /* tokens a block (8 bitmap words an expert) */
#define GB_W (GB_T / 32)

/* the block's [E][GB_W] token bitmap (zeroed by the caller) from its picks */
__device__ __forceinline__ void gb_bitmap(const int *sel, const int *sid, int t0, int nt, int K, int E, uint32_t *bm) {
    for (int q = threadIdx.x; q < nt * K; q += blockDim.x) {
        const int tl = q / K;
        int e;
        if (pick_used(sel, sid, t0 + tl, q - tl * K, K, E, &e)) atomicOr(&bm[e * GB_W + (tl >> 5)], 1u << (tl & 31));
    }
}

/* a block token's rank among the block's tokens of one expert (its bitmap row r) */
__device__ __forceinline__ int gb_rank(const uint32_t *r, int tl) {
    int rank = __popc(r[tl >> 5] & ((1u << (tl & 31)) - 1u));
    for (int v = 0; v < (tl >> 5); v++) rank += __popc(r[v]);
    return rank;
}

__global__ void __launch_bounds__(256) moe_gcount_kernel(const int *sel, const int *sid, int T, int K, int E, dsv4_cuda_moe_plan p) {
    dev_pdl_enter();
    extern __shared__ uint32_t gsm[];
    const int t0 = blockIdx.x * GB_T, nt = T - t0 < GB_T ? T - t0 : GB_T;
    for (int i = threadIdx.x; i < E * GB_W; i += blockDim.x) gsm[i] = 0;
    __syncthreads();
    gb_bitmap(sel, sid, t0, nt, K, E, gsm);
    __syncthreads();
    for (int e = threadIdx.x; e < E; e += blockDim.x) {
        int c = 0;
#pragma unroll
        for (int w = 0; w < GB_W; w++) c += __popc(gsm[e * GB_W + w]);
        p.gcnt[(int64_t)blockIdx.x * E + e] = c;
    }
}

__global__ void __launch_bounds__(256) moe_gscatter_kernel(const int *sel, const float *ew, const int *sid, int T, int K, int E,
                                                           dsv4_cuda_moe_plan p) {
    dev_pdl_enter();
    extern __shared__ uint32_t gsm[];
    uint32_t *bm = gsm;                        /* [E][GB_W] */
    int *off = (int *)(bm + (size_t)E * GB_W); /* [E]: this block's first slot of each expert */
    int *tot = off + E;                        /* [E]: each expert's tokens in the pass */
    const int NB = gridDim.x, b = blockIdx.x, tid = threadIdx.x, nth = blockDim.x;
    const int t0 = b * GB_T, nt = T - t0 < GB_T ? T - t0 : GB_T;
    for (int i = tid; i < E * GB_W; i += nth) bm[i] = 0;
    __syncthreads();
    gb_bitmap(sel, sid, t0, nt, K, E, bm);
    /* each expert's tokens in all blocks and in the blocks before this one; then the experts' first slots (a scan over
     * the experts: a contiguous run of them a thread, as moe_group_block's) */
    const int per = (E + nth - 1) / nth, e0 = tid * per, e1 = e0 + per < E ? e0 + per : E;
    int cnt = 0, act = 0;
    for (int e = e0; e < e1; e++) {
        int all = 0, below = 0;
        for (int j = 0; j < NB; j++) {
            const int c = p.gcnt[(int64_t)j * E + e];
            all += c;
            below += j < b ? c : 0;
        }
        off[e] = below, tot[e] = all;
        cnt += all;
        act += all > 0;
    }
    int ca, aa, tc, ta;
    block_scan2(cnt, act, &ca, &aa, &tc, &ta);
    for (int e = e0; e < e1; e++) {
        const int c = tot[e];
        off[e] += ca;
        if (b == 0 && c) {
            p.act_e[aa] = e;
            p.act_off[aa] = ca;
            p.act_cnt[aa] = c;
            aa++;
        }
        ca += c;
    }
    if (b == 0 && tid == 0) *p.nact = ta;
    __syncthreads();
    /* this block's picks: slot = the expert's first slot for this block + the tokens below in the block's bitmap */
    for (int q = tid; q < nt * K; q += nth) {
        const int tl = q / K, t = t0 + tl;
        int e;
        if (!pick_used(sel, sid, t, q - tl * K, K, E, &e)) continue;
        const int slot = off[e] + gb_rank(bm + e * GB_W, tl);
        p.rows[slot] = t;
        p.rw[slot] = ew[(int64_t)t * K + (q - tl * K)];
    }
    /* each token's slots in increasing expert id (= increasing slot) */
    for (int tl = tid; tl < nt; tl += nth) {
        const int t = t0 + tl;
        int sl[GROUP_MAXK], ns = 0;
        for (int k = 0; k < K; k++) {
            int e;
            if (!pick_used(sel, sid, t, k, K, E, &e)) continue;
            int v = off[e] + gb_rank(bm + e * GB_W, tl), i = ns++;
            while (i > 0 && sl[i - 1] > v) sl[i] = sl[i - 1], i--;
            sl[i] = v;
        }
        for (int k = 0; k < K; k++) p.tslot[(int64_t)t * K + k] = k < ns ? sl[k] : -1;
    }
}

/* The kernel's shared memory for T tokens: the [E][NW] bitmap, the experts' first slots, the cached picks, the
 * [E][NW / 4] prefix counts. */
static size_t group_smem(int T, int K, int E) {
    size_t smem = sizeof(uint32_t) * (size_t)E * ((T + 31) / 32) + sizeof(int) * (size_t)E;
    if (T * K <= GROUP_CACHE) smem += sizeof(int) * (2 * (size_t)T * K + T);
    return smem + sizeof(uint16_t) * (size_t)E * ((T + 127) / 128); /* prefix counts per 4 bitmap words */
}

extern "C" int dsv4_cuda_moe_group_maxt(int K, int E) {
    if (K < 1 || K > GROUP_MAXK || E < 1) return 0;
    for (int T = GROUP_MAXT; T > 0; T -= 32)
        if (group_smem(T, K, E) <= (size_t)dsv4_cuda_dev.smem_optin) return T;
    return 0;
}

/* the many-block grouping: on unless DSV4_MOE_GROUP_BLOCKS=0, for E experts whose block bitmaps fit */
static int gb_usable(int K, int E) {
    static int on = -1;
    if (on < 0) on = dsv4_env_int("DSV4_MOE_GROUP_BLOCKS", 1) != 0;
    return on && K >= 1 && K <= GROUP_MAXK && E >= 1 &&
           sizeof(uint32_t) * (size_t)E * GB_W + 2 * sizeof(int) * (size_t)E <= (size_t)dsv4_cuda_dev.smem_optin;
}

extern "C" int dsv4_cuda_moe_group_maxt_plan(int K, int E) {
    if (!gb_usable(K, E)) return dsv4_cuda_moe_group_maxt(K, E);
    static int lim = -1; /* (A/B: groups of at most this many tokens, a multiple of 32; read once, as the arena is sized once) */
    if (lim < 0) lim = dsv4_env_int("DSV4_MOE_GROUP_T", 0);
    return lim >= 32 ? lim / 32 * 32 : 1 << 20;
}

extern "C" int dsv4_cuda_moe_group(const int *sel, const float *w, const int *sid, int T, int K, int E,
                                   const dsv4_cuda_moe_plan *p, void *stream) {
    const int cache = T * K <= GROUP_CACHE, blocks = !cache && p->gcnt && gb_usable(K, E);
    if (T < 0 || (T > GROUP_MAXT && !blocks) || K < 1 || K > GROUP_MAXK || E < 1)
        return dsv4_cuda_fail("moe_group: bad arguments (T %d K %d E %d)", T, K, E);
    if (!T) return dsv4_cuda_memset(p->nact, 0, sizeof(int), stream);
    if (blocks) { /* many blocks (1b) */
        const int nb = (T + GB_T - 1) / GB_T;
        const size_t sm1 = sizeof(uint32_t) * (size_t)E * GB_W, sm2 = sm1 + 2 * sizeof(int) * (size_t)E;
        if (sm2 > 48 * 1024 && (cudaFuncSetAttribute((const void *)moe_gcount_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                     (int)sm1) != cudaSuccess ||
                                cudaFuncSetAttribute((const void *)moe_gscatter_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                     (int)sm2) != cudaSuccess))
            return dsv4_cuda_fail("moe_group: cannot raise shared memory to %zu bytes", sm2);
        dev_launch(moe_gcount_kernel, nb, 256, sm1, DSV4_STREAM(stream), sel, sid, T, K, E, *p);
        if (dsv4_cuda_check_launch("moe_group (counts)")) return -1;
        dev_launch(moe_gscatter_kernel, nb, 256, sm2, DSV4_STREAM(stream), sel, w, sid, T, K, E, *p);
        return dsv4_cuda_check_launch("moe_group (scatter)");
    }
    const size_t smem = group_smem(T, K, E);
    if (smem > (size_t)dsv4_cuda_dev.smem_optin)
        return dsv4_cuda_fail("moe_group: %d experts x %d tokens do not fit (at most %d tokens a group)", E, T,
                              dsv4_cuda_moe_group_maxt(K, E));
    void (*kern)(const int *, const float *, const int *, int, int, int, dsv4_cuda_moe_plan) =
        cache ? moe_group_kernel<1> : moe_group_kernel<0>;
    if (smem > 48 * 1024 &&
        cudaFuncSetAttribute((const void *)kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem) != cudaSuccess)
        return dsv4_cuda_fail("moe_group: cannot raise shared memory to %zu bytes", smem);
    /* the cached kernel at decode sizes: a thread per expert / pick (fewer warps to scan and synchronize) */
    int nth = GROUP_THREADS;
    if (cache) {
        const int want = E > T * K ? E : T * K;
        nth = want >= GROUP_THREADS ? GROUP_THREADS : (want + 31) / 32 * 32;
    }
    dev_launch(kern, 1, nth, smem, DSV4_STREAM(stream), sel, w, sid, T, K, E, *p);
    return dsv4_cuda_check_launch("moe_group");
}

/* DSV4_CUDA_ROUTE_GROUP=0: the router and the grouping as two launches at every size */
static int route_group_on(void) {
    static int on = -1;
    if (on < 0) on = dsv4_env_int("DSV4_CUDA_ROUTE_GROUP", 1) != 0;
    return on;
}

extern "C" int dsv4_cuda_moe_route(const float *logits, int T, int E, int K, const float *bias, const int *tid2eid,
                                   const int *tokens, float route_scale, const int *sid, int *sel, float *weight,
                                   const dsv4_cuda_moe_plan *p, void *stream) {
    const size_t goff = (group_smem(T, K, E) + 15) & ~(size_t)15;
    const size_t smem = goff + sizeof(float) * (2 * (size_t)T * K + (size_t)T * 32 * ROUTER_RPL);
    if (T < 1 || T > ROUTE_GROUP_T || E > 32 * ROUTER_RPL || K > 32 || K > E || T * K > GROUP_CACHE || (!tid2eid && !bias) ||
        (tid2eid && !tokens) || smem > 48 * 1024 || !route_group_on()) {
        if (dsv4_cuda_router(logits, T, E, K, bias, tid2eid, tokens, route_scale, sel, weight, stream)) return -1;
        return dsv4_cuda_moe_group(sel, weight, sid, T, K, E, p, stream);
    }
    /* the cached grouping's block size (a thread per expert / pick), and a warp per token */
    const int want = E > T * K ? E : T * K;
    int nth = want >= GROUP_THREADS ? GROUP_THREADS : (want + 31) / 32 * 32;
    if (nth < 32 * T) nth = 32 * T;
    dev_launch(moe_route_group_kernel, 1, nth, smem, DSV4_STREAM(stream), logits, E, K, bias, tid2eid, tokens, route_scale, sid,
               T, goff, sel, weight, *p);
    return dsv4_cuda_check_launch("moe_route");
}

/* ---- 2. grouped expert GEMV ---- */

#define MX_WARPS 16
#define MX_UNROLL 4
#define MX_GENERIC DSV4_WF_COUNT /* element-by-element decode (dev_weight_at) for rows that are not 16-byte chunks */

/* grid (row blocks, expert slots). GATEUP: out = h [slots, I], each warp one row j of w1 and of w3
 * (x = the MoE input [T, D], gathered by rows[]); else out = y [slots, D], each warp rows j, j+1 of w2
 * (x = h, the expert's slots are its rows). */
template <int FMT, int TB, int GATEUP>
__global__ void __launch_bounds__(MX_WARPS * 32)
    moe_expert_kernel(const dsv4_cuda_weight *WA, const dsv4_cuda_weight *WB, const float *x, dsv4_cuda_moe_plan p,
                      float lim, int Cpad, float *out) {
    constexpr bool VEC = FMT != MX_GENERIC;
    constexpr int E = wv_elems<FMT>::E, NG = E / 4, STEP = GATEUP ? 1 : 2;
    extern __shared__ float4 mx4[];
    float *xs = (float *)mx4;
    const int a = blockIdx.y;
    if (a >= *p.nact) return;
    const int ex = p.act_e[a], off = p.act_off[a], cnt = p.act_cnt[a];
    const dsv4_cuda_weight w0 = WA[ex], w1 = GATEUP ? WB[ex] : w0;
    const int C = w0.cols, R = w0.rows, lane = threadIdx.x & 31, warp = threadIdx.x >> 5, ngrp = Cpad / 128;
    const bool rb = !w0.act_quant && w0.act_bf16; /* BF16 activations */
    for (int c0 = 0; c0 < cnt; c0 += TB) {
        const int nt = cnt - c0 < TB ? cnt - c0 : TB;
        /* stage the chunk's rows (zeros past nt and past C), act-quantized per 128 values when asked, else rounded to
         * bf16 for BF16 activations (act_bf16; w1 / w3 agree on both, checked by dsv4_cuda_experts_init) */
        for (int gi = warp; gi < TB * ngrp; gi += MX_WARPS) {
            const int t = gi / ngrp, j0 = (gi - t * ngrp) * 128;
            const float *src = NULL;
            if (t < nt) src = x + (int64_t)(GATEUP ? p.rows[off + c0 + t] : off + c0 + t) * C;
            float v[4];
#pragma unroll
            for (int i = 0; i < 4; i++) {
                const int j = j0 + i * 32 + lane;
                v[i] = src && j < C ? src[j] : 0.0f;
            }
            if (w0.act_quant) wv_act_quant_fp8(v);
            if (rb)
#pragma unroll
                for (int i = 0; i < 4; i++) v[i] = dev_round_bf16(v[i]);
#pragma unroll
            for (int i = 0; i < 4; i++) {
                const int j = j0 + i * 32 + lane;
                xs[(size_t)t * Cpad + (VEC ? wv_stage_pos<E>(j) : j)] = v[i];
            }
        }
        __syncthreads();
        for (int r0 = (blockIdx.x * MX_WARPS + warp) * STEP; r0 < R; r0 += gridDim.x * MX_WARPS * STEP) {
            const int r1 = GATEUP ? r0 : (r0 + 1 < R ? r0 + 1 : r0);
            float acc[2][TB];
#pragma unroll
            for (int m = 0; m < 2; m++)
#pragma unroll
                for (int t = 0; t < TB; t++) acc[m][t] = 0.0f;
            if constexpr (VEC) {
                const int nch = C / E;
                const int64_t rowbytes = (int64_t)C * 16 / E, R0 = (int64_t)w0.row0 + r0, R1 = (int64_t)w1.row0 + r1;
                const uint4 *q0 = (const uint4 *)(w0.data + R0 * rowbytes), *q1 = (const uint4 *)(w1.data + R1 * rowbytes);
                for (int b0 = 0; b0 < nch; b0 += 32 * MX_UNROLL) {
                    uint4 q[2][MX_UNROLL];
#pragma unroll
                    for (int u = 0; u < MX_UNROLL; u++) {
                        const int ch = b0 + u * 32 + lane;
                        q[0][u] = ch < nch ? wv_load(q0 + ch) : make_uint4(0, 0, 0, 0);
                        q[1][u] = ch < nch ? wv_load(q1 + ch) : make_uint4(0, 0, 0, 0);
                    }
#pragma unroll
                    for (int u = 0; u < MX_UNROLL; u++) {
                        const int ch = b0 + u * 32 + lane;
                        if (ch >= nch) break;
                        float s0[2], s1[2];
                        wv_scale<FMT>(w0, R0, ch, s0[0], s1[0]);
                        wv_scale<FMT>(w1, R1, ch, s0[1], s1[1]);
                        const float4 *xc = mx4 + (size_t)(ch >> 5) * NG * 32 + lane;
                        float pa[2][TB], pb[2][TB];
#pragma unroll
                        for (int m = 0; m < 2; m++)
#pragma unroll
                            for (int t = 0; t < TB; t++) pa[m][t] = pb[m][t] = 0.0f;
#pragma unroll
                        for (int g = 0; g < NG; g++) {
                            const float4 wv[2] = {wv_group<FMT>(q[0][u], g), wv_group<FMT>(q[1][u], g)};
#pragma unroll
                            for (int t = 0; t < TB; t++) {
                                const float4 xv = xc[(size_t)t * (Cpad / 4) + g * 32];
#pragma unroll
                                for (int m = 0; m < 2; m++) {
                                    float &s = (FMT == DSV4_WF_NVFP4 && g >= NG / 2) ? pb[m][t] : pa[m][t];
                                    s = fmaf(wv[m].x, xv.x, s);
                                    s = fmaf(wv[m].y, xv.y, s);
                                    s = fmaf(wv[m].z, xv.z, s);
                                    s = fmaf(wv[m].w, xv.w, s);
                                }
                            }
                        }
#pragma unroll
                        for (int m = 0; m < 2; m++)
#pragma unroll
                            for (int t = 0; t < TB; t++) {
                                if (FMT == DSV4_WF_NVFP4) acc[m][t] = fmaf(s1[m], pb[m][t], fmaf(s0[m], pa[m][t], acc[m][t]));
                                else if (FMT == DSV4_WF_FP8 || FMT == DSV4_WF_MXFP4) acc[m][t] = fmaf(s0[m], pa[m][t], acc[m][t]);
                                else acc[m][t] += pa[m][t];
                            }
                    }
                }
            } else {
                for (int j = lane; j < C; j += 32) {
                    const float a0 = dev_weight_at(w0, r0, j), a1 = dev_weight_at(w1, r1, j);
#pragma unroll
                    for (int t = 0; t < TB; t++) {
                        const float xv = xs[(size_t)t * Cpad + j];
                        acc[0][t] = fmaf(a0, xv, acc[0][t]);
                        acc[1][t] = fmaf(a1, xv, acc[1][t]);
                    }
                }
            }
#pragma unroll
            for (int t = 0; t < TB; t++) {
                const float g = warp_sum(acc[0][t]), u = warp_sum(acc[1][t]);
                if (lane == 0 && t < nt) {
                    const int64_t slot = off + c0 + t;
                    if (GATEUP) {
                        out[slot * R + r0] = dev_swiglu(g, u, lim, p.rw[slot]);
                    } else {
                        out[slot * R + r0] = g;
                        if (r1 != r0) out[slot * R + r1] = u;
                    }
                }
            }
        }
        __syncthreads();
    }
}

typedef void (*mx_fn)(const dsv4_cuda_weight *, const dsv4_cuda_weight *, const float *, dsv4_cuda_moe_plan, float, int,
                      float *);

template <int FMT, int GATEUP> static mx_fn mx_pick_tb(int tb) {
    switch (tb) {
    case 1: return moe_expert_kernel<FMT, 1, GATEUP>;
    case 2: return moe_expert_kernel<FMT, 2, GATEUP>;
    case 4: return moe_expert_kernel<FMT, 4, GATEUP>;
    default: return moe_expert_kernel<FMT, 8, GATEUP>;
    }
}

template <int GATEUP> static mx_fn mx_pick(int fmt, int vec, int tb) {
    if (!vec) return mx_pick_tb<MX_GENERIC, GATEUP>(tb);
    switch (fmt) {
    case DSV4_WF_BF16: return mx_pick_tb<DSV4_WF_BF16, GATEUP>(tb);
    case DSV4_WF_FP8: return mx_pick_tb<DSV4_WF_FP8, GATEUP>(tb);
    case DSV4_WF_MXFP4: return mx_pick_tb<DSV4_WF_MXFP4, GATEUP>(tb);
    default: return mx_pick_tb<DSV4_WF_NVFP4, GATEUP>(tb);
    }
}

/* one grouped launch: R output rows per expert from C columns */
static int mx_launch(int gateup, int fmt, int vec, const dsv4_cuda_weight *WA, const dsv4_cuda_weight *WB, int R, int C,
                     const float *x, int T, int maxslots, const dsv4_cuda_moe_plan *p, float lim, float *out, cudaStream_t st) {
    const int E = vec ? wv_elems_of(fmt) : 4;
    const int cpad = vec ? (C + 32 * E - 1) / (32 * E) * (32 * E) : (C + 127) / 128 * 128;
    int tb = T <= 1 ? 1 : T <= 2 ? 2 : T <= 4 ? 4 : 8; /* an expert gets at most T rows */
    while (tb > 1 && (size_t)tb * cpad * sizeof(float) > (size_t)dsv4_cuda_dev.smem_optin) tb >>= 1;
    const size_t smem = (size_t)tb * cpad * sizeof(float);
    if (smem > (size_t)dsv4_cuda_dev.smem_optin) return dsv4_cuda_fail("moe_experts: a %d-column row does not fit in shared memory", C);
    mx_fn fn = gateup ? mx_pick<1>(fmt, vec, tb) : mx_pick<0>(fmt, vec, tb);
    if (smem > 48 * 1024 && cudaFuncSetAttribute((const void *)fn, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem) != cudaSuccess)
        return dsv4_cuda_fail("moe_experts: cannot raise shared memory to %zu bytes", smem);
    /* enough row blocks per expert that the active experts fill the GPU about twice */
    const int step = gateup ? 1 : 2, tiles = (R + MX_WARPS * step - 1) / (MX_WARPS * step);
    int gx = (2 * dsv4_cuda_dev.sm_count + maxslots - 1) / maxslots;
    if (gx > tiles) gx = tiles;
    if (gx < 1) gx = 1;
    fn<<<dim3(gx, maxslots), MX_WARPS * 32, smem, st>>>(WA, WB, x, *p, lim, cpad, out);
    return dsv4_cuda_check_launch(gateup ? "moe_experts (gate/up)" : "moe_experts (down)");
}

static int mx_cuda_cores; /* dsv4_cuda_moe_experts_path */

extern "C" void dsv4_cuda_moe_experts_path(int mode) {
    mx_cuda_cores = mode & 1;
    dsv4_moe_tc_mode(mode & ~1);
}

extern "C" int dsv4_cuda_moe_experts(const dsv4_cuda_experts *ex, const float *x, int T, int K, const dsv4_cuda_moe_plan *p,
                                     float lim, float *h, float *y, void *stream) {
    if (T < 0 || K < 1 || !ex->w1) return dsv4_cuda_fail("moe_experts: bad arguments (T %d K %d)", T, K);
    if (!T) return 0;
    const int maxslots = ex->E < T * K ? ex->E : T * K;
    cudaStream_t st = DSV4_STREAM(stream);
    int f8 = 0; /* gate / up on the FP8 kernel (dsv4_moe_tc_run) */
    if (ex->tc13 && !mx_cuda_cores) {
        if ((f8 = dsv4_moe_tc_run(1, ex->fmt13, ex->aq13, ex->w1, ex->w3, ex->I, ex->D, ex->E, x, T, K, maxslots, p, lim, h, y, 0, st)) < 0)
            return -1;
    } else if (mx_launch(1, ex->fmt13, ex->vec13, ex->w1, ex->w3, ex->I, ex->D, x, T, maxslots, p, lim, h, st)) {
        return -1;
    }
    if (ex->tc2 && !mx_cuda_cores)
        return dsv4_moe_tc_run(0, ex->fmt2, ex->aq2, ex->w2, NULL, ex->D, ex->I, ex->E, h, T, K, maxslots, p, 0.0f, y, NULL, f8, st) < 0 ? -1 : 0;
    return mx_launch(0, ex->fmt2, ex->vec2, ex->w2, NULL, ex->D, ex->I, h, T, maxslots, p, 0.0f, y, st);
}

extern "C" int dsv4_cuda_moe_experts_pass(const dsv4_cuda_experts *ex, const float *x, int T, int K, const dsv4_cuda_moe_plan *p,
                                          float lim, float *h, float *y, void *stream) {
    if (T > 0 && K > 0 && ex->w1 && !mx_cuda_cores) {
        const int r = dsv4_moe_pfb_run(ex, x, T, K, ex->E < T * K ? ex->E : T * K, p, lim, h, y, DSV4_STREAM(stream));
        if (r) return r < 0 ? -1 : 1;
    }
    return dsv4_cuda_moe_experts(ex, x, T, K, p, lim, h, y, stream);
}

/* ---- 3. combine ---- */

/* the token's slots and then their values are loaded 8 at a time, all in flight, then added in order. V = float: a
 * column a thread; V = float4: four (16-byte loads and stores; D % 4 == 0, 16-byte aligned rows), each column's
 * additions exactly as with float, so the same bits. (The 8K prefill's combine read ~1 GB a layer at ~2.6 TB/s with
 * one 4-byte load a thread and slot: RESULTS "Session 31".) */
__device__ __forceinline__ float cb_zero(float) { return 0.0f; }
__device__ __forceinline__ float4 cb_zero(float4) { return make_float4(0.0f, 0.0f, 0.0f, 0.0f); }
__device__ __forceinline__ float cb_add(float a, float b) { return __fadd_rn(a, b); }
__device__ __forceinline__ float4 cb_add(float4 a, float4 b) {
    return make_float4(__fadd_rn(a.x, b.x), __fadd_rn(a.y, b.y), __fadd_rn(a.z, b.z), __fadd_rn(a.w, b.w));
}
template <typename V>
__global__ void moe_combine_kernel(const float *y, const int *tslot, int K, int D, const float *shared, float *out) {
    dev_pdl_enter();
    constexpr int VW = sizeof(V) / sizeof(float);
    const int t = blockIdx.y;
    const int d = VW * (blockIdx.x * blockDim.x + threadIdx.x);
    if (d >= D) return;
    const int *ts = tslot + (int64_t)t * K;
    const V z = cb_zero(V()), sh = shared ? *(const V *)(shared + (int64_t)t * D + d) : z;
    V acc = z;
    for (int k0 = 0; k0 < K; k0 += 8) {
        int s[8];
        V v[8];
        bool live = true;
#pragma unroll
        for (int u = 0; u < 8; u++) s[u] = k0 + u < K ? ts[k0 + u] : -1;
#pragma unroll
        for (int u = 0; u < 8; u++) {
            live = live && s[u] >= 0;
            v[u] = live ? *(const V *)(y + (int64_t)s[u] * D + d) : z;
        }
        bool add = true;
#pragma unroll
        for (int u = 0; u < 8; u++) {
            add = add && s[u] >= 0;
            if (add) acc = cb_add(acc, v[u]);
        }
        if (!live) break;
    }
    if (shared) acc = cb_add(acc, sh);
    *(V *)(out + (int64_t)t * D + d) = acc;
}

/* the four-column form (the same bits), the default where the rows allow it (session 32 on an H100: the Flash 8K prefill
 * 0.992x, with the warp-a-row q prep 0.989-0.990x); DSV4_MOE_COMBINE_VEC=0 (read once) or dsv4_cuda_moe_combine_vec(0):
 * a column a thread */
static int combine_vec_mode = -2;
extern "C" void dsv4_cuda_moe_combine_vec(int mode) { combine_vec_mode = mode == 0 || mode == 1 ? mode : -2; }

extern "C" int dsv4_cuda_moe_combine(const float *y, const int *tslot, int T, int K, int D, const float *shared, float *out,
                                     void *stream) {
    if (T < 0 || K < 1 || D < 1) return dsv4_cuda_fail("moe_combine: bad arguments (T %d K %d D %d)", T, K, D);
    if (!T) return 0;
    if (combine_vec_mode == -2) combine_vec_mode = dsv4_env_int("DSV4_MOE_COMBINE_VEC", 1) != 0;
    if (combine_vec_mode && D % 4 == 0 && !((uintptr_t)y & 15) && !((uintptr_t)out & 15) && !((uintptr_t)shared & 15)) {
        dev_launch(moe_combine_kernel<float4>, dim3((D / 4 + 255) / 256, T), 256, 0, DSV4_STREAM(stream), y, tslot, K, D, shared, out);
        return dsv4_cuda_check_launch("moe_combine");
    }
    dev_launch(moe_combine_kernel<float>, dim3((D + 255) / 256, T), 256, 0, DSV4_STREAM(stream), y, tslot, K, D, shared, out);
    return dsv4_cuda_check_launch("moe_combine");
}

/* ---- the experts' descriptors ---- */

static int vec_ok(const dsv4_cuda_weight *w) {
    if (w->fmt != DSV4_WF_BF16 && w->fmt != DSV4_WF_FP8 && w->fmt != DSV4_WF_MXFP4 && w->fmt != DSV4_WF_NVFP4) return 0;
    if (w->cols % wv_elems_of(w->fmt) || ((uintptr_t)w->data & 15)) return 0;
    if (w->fmt == DSV4_WF_NVFP4 && ((w->scale_stride & 1) || ((uintptr_t)w->scale & 1))) return 0;
    return 1;
}

extern "C" int dsv4_cuda_experts_init(dsv4_cuda_experts *x, const dsv4_cuda_weight *w1, const dsv4_cuda_weight *w3,
                                      const dsv4_cuda_weight *w2, int E) {
    memset(x, 0, sizeof *x);
    if (E < 1) return dsv4_cuda_fail("experts: none");
    x->E = E;
    x->I = w1[0].rows;
    x->D = w1[0].cols;
    x->fmt13 = w1[0].fmt;
    x->fmt2 = w2[0].fmt;
    x->vec13 = x->vec2 = 1;
    x->tc13 = x->tc2 = 1;
    x->aq13 = w1[0].act_quant;
    x->aq2 = w2[0].act_quant;
    for (int e = 0; e < E; e++) {
        if (!w1[e].data || !w3[e].data || !w2[e].data) return dsv4_cuda_fail("experts: expert %d has no weights on the device", e);
        if ((int)w1[e].fmt != x->fmt13 || (int)w3[e].fmt != x->fmt13 || (int)w2[e].fmt != x->fmt2)
            return dsv4_cuda_fail("experts: expert %d has another weight format than expert 0", e);
        if (w1[e].rows != x->I || w3[e].rows != x->I || w1[e].cols != x->D || w3[e].cols != x->D || w2[e].rows != x->D ||
            w2[e].cols != x->I)
            return dsv4_cuda_fail("experts: expert %d has other shapes than expert 0", e);
        if (w1[e].act_quant != w3[e].act_quant || w1[e].act_bf16 != w3[e].act_bf16)
            return dsv4_cuda_fail("experts: expert %d: w1 and w3 differ in act quant or bf16 activations", e);
        x->vec13 &= vec_ok(&w1[e]) && vec_ok(&w3[e]);
        x->vec2 &= vec_ok(&w2[e]);
        x->tc13 &= dsv4_moe_tc_fits(&w1[e]) && dsv4_moe_tc_fits(&w3[e]) && w1[e].act_quant == x->aq13;
        x->tc2 &= dsv4_moe_tc_fits(&w2[e]) && w2[e].act_quant == x->aq2;
    }
    if ((x->tc13 || x->tc2) && dsv4_moe_tc_selftest()) return -1;
    const size_t b = sizeof(dsv4_cuda_weight) * (size_t)E;
    x->w1 = (dsv4_cuda_weight *)dsv4_cuda_alloc(3 * b);
    if (!x->w1) return -1;
    x->w3 = x->w1 + E;
    x->w2 = x->w3 + E;
    if (dsv4_cuda_upload(x->w1, w1, b) || dsv4_cuda_upload(x->w3, w3, b) || dsv4_cuda_upload(x->w2, w2, b)) {
        dsv4_cuda_experts_free(x);
        return -1;
    }
    if (x->tc13 && x->tc2 && x->fmt13 == DSV4_WF_MXFP4 && x->fmt2 == DSV4_WF_MXFP4) {
        const int ok = dsv4_moe_pf8_check(x);
        if (ok < 0) {
            dsv4_cuda_experts_free(x);
            return -1;
        }
        x->pf8 = ok;
    }
    return 0;
}

extern "C" void dsv4_cuda_experts_free(dsv4_cuda_experts *x) {
    dsv4_cuda_free(x->w1);
    memset(x, 0, sizeof *x);
}
