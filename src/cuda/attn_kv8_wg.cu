/* attn_kv8_wg.cu - the prefill passes' sparse attention on Hopper's warpgroup MMA (dsv4_cuda_attn_kv8_wg; kv_cache.h):
 * the one-f16-term form of attn_kv8_tc.cu's prefill kernel (q, the rows, p as one f16 term each, fp32 sums), 1.9-2.3x
 * faster (bench/NOTES.md "Session 27").
 *
 * Why: attn_kv8_tc's prefill form ran at ~75 TFLOP/s (8-12 K cycles a tile of 32 entries for 2 M multiply-adds): each
 * of its 8 warps decoded rows, then waited, then ran mma.sync, one phase after the other. Here (a block per query and
 * 64 heads, 256 threads = two warpgroups; warpgroup w owns dims 256 w .. 256 w + 255 of q, the rows and the output):
 *  - the rows of tile s + 3 are gathered as stored (16-byte cp.async copies, 8 lanes a row, three raw stages, an
 *    mbarrier each) while tile s computes;
 *  - S = q.k over the warpgroup's dims is one chain of 16 wgmma m64n32k16 (q and the rows in shared memory), with tile
 *    s + 1's rows decoded into f16 between them (cvt e4m3x2 -> f16x2 times the e8m0 scale: exact);
 *  - the two halves' partial scores are swapped through shared memory and added (a + b: the same bits in both), both
 *    warpgroups run the same online softmax (attn_kv8_tc's, with e^x as 2^(x log2 e) on the SFU), and O += p.V is two
 *    wgmma m64n256k16 with p from registers and V = the same rows read N-major (transposed) from shared memory.
 * With attn_kv8_tc's expf and division instead (the version measured first) it gave attn_kv8_tc's bits exactly: the
 * wgmma chains are those of its mma.sync chains. Now ~2 ulp of e^x and one rounding of 1 / (l + e^(sink - m)) apart.
 * The pass's own rows (ids <= -2, fp32 kv2) are first packed into the cache format with f16 rope dims
 * (attn_wg_pack_kernel; their non-rope dims are FP8-simulated, so the codes hold them exactly, and f16(rope) is what
 * attn_kv8_tc's one-term form takes), so every entry is one 16-byte-aligned row to copy.
 * Shared memory in wgmma's core matrices (8 rows x 16 bytes, 128 contiguous bytes, no swizzle): q [64 heads][512]
 * chunk c (8 dims) of head h at c * 1024 + (h / 8) * 128 + (h % 8) * 16; a tile's rows [32][512] chunk c of entry e
 * at c * 512 + (e / 8) * 128 + (e % 8) * 16: K-major for q.k (lbo 512 steps 8 dims, sbo 128 steps 8 entries) and
 * N-major for p.V (lbo 128 steps 8 entries, sbo 512 steps 8 dims).
 * Spans of WA_F tiles go into out as attn_kv8_tc's do (out = out e^(mf - m) + O); out = O 2^-12 / (l + exp(sink -
 * m)); zeros for a query without entries. Every sum's order depends only on the query's own list: batch invariant. */
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <stdio.h>
#include <stdlib.h>

#include "attn_fold.cuh"
#include "common.cuh"
#include "kv_cache.cuh"
#include "mbarrier.cuh"
#include "wgmma.cuh"

#define WA_N 32       /* entries a tile */
#define WA_D 512      /* dims a row in shared memory (zero-padded) */
#define WA_H 64       /* heads a block */
#define WA_NT 256     /* threads: two warpgroups */
#define WA_RS 3       /* raw stages (tiles s + 1 .. s + 3 in flight) */
#define WA_IR 8       /* id ring, tiles */
#define WA_PS 4096.0f /* p is taken as p x 2^12 (f16 subnormals only below p 2^-26); O carries the factor */
#define WA_F 32       /* tiles a span (attn_kv8_tc's TC_F) */
#define WA_L2E 1.4426950408889634f
#define WA_TAU 2.0f /* the running max's slack (below): e^2 x 2^12 < 65504 */

__device__ __forceinline__ float wa_ex2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

#define WA_QS 0                          /* q: 64 x 512 f16 */
#define WA_KS (WA_QS + WA_H * WA_D * 2)  /* rows: 2 x 32 x 512 f16 */
#define WA_SX (WA_KS + 2 * WA_N * WA_D * 2) /* partial scores: [2 warpgroups][16][128 threads] fp32 */
#define WA_ID (WA_SX + 2 * 16 * 128 * 4) /* ids: [8 tiles][32] */
#define WA_MB (WA_ID + WA_IR * WA_N * 4) /* the raw stages' mbarriers: [WA_RS] */
#define WA_CS (WA_MB + 128)             /* the terms form's inverse RoPE: (cos, -sin) of the query's pairs, [256] float2 */
#define WA_RAW (WA_CS + 256 * 8)        /* rows as stored: [3][32][rb] */

/* clock trace (DSV4_ATTN_WG_TRACE=FILE, measurement only): thread 0 of each warpgroup of every 512th block stamps
 * %clock64 at fixed points: 0 start, 1 ids and first copies issued, 2 q in, 3 tile 0 decoded, then per tile s < 12 at
 * 4 + 8 s + {0 loop barrier, 1 rows of s + 1 in, 2 q.k issued and s + 1 decoded, 3 copies issued, 4 scores in,
 * 5 swapped, 6 softmax, 7 p.V done}, 100 loop end, 101 stores done (bench/wa_trace.py) */
#define WA_TRN 104
#define WA_TR(k)                                                                                                        \
    do {                                                                                                               \
        if (trc && (tid & 127) == 0 && (blockIdx.x & 511) == 0)                                                        \
            trc[((blockIdx.x >> 9) * 2 + (tid >> 7)) * WA_TRN + (k)] = clock64();                                      \
    } while (0)

static size_t wa_smem(int Dh, int R) { return (size_t)WA_RAW + (size_t)WA_RS * WA_N * (size_t)dsv4_kv_row_bytes(Dh, R); }

/* 8 e4m3 codes x 2^(sc - 127) as 8 f16, rounded once (attn_kv8_tc rounds the exact fp32 product), without a branch:
 * x 2^k1 (k1 = k clamped to -14 .. 15: exact, or an overflow the value has too), then x 2^k2 (k2 = k - k1; one rounding;
 * 0 when 2^k2 < 2^-24: the value is then under 2^-29 and rounds to zero; 2^15 past 2^15: the value overflows) */
__device__ __forceinline__ uint4 wa_fp8x8(uint2 w, unsigned sc) {
    const int k = (int)sc - 127, k1 = min(max(k, -14), 15), k2 = k - k1;
    const uint32_t b1 = (uint32_t)(k1 + 15) << 10;
    const uint32_t b2 = k2 >= -14 ? (uint32_t)(min(k2, 15) + 15) << 10 : k2 >= -24 ? 1u << (k2 + 24) : 0u;
    const __half2 s1 = __halves2half2(__ushort_as_half((uint16_t)b1), __ushort_as_half((uint16_t)b1));
    const __half2 s2 = __halves2half2(__ushort_as_half((uint16_t)b2), __ushort_as_half((uint16_t)b2));
    const uint16_t c2[4] = {(uint16_t)w.x, (uint16_t)(w.x >> 16), (uint16_t)w.y, (uint16_t)(w.y >> 16)};
    uint32_t o[4];
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)c2[i], __NV_E4M3);
        const __half2 p = __hmul2(__hmul2(__half2(h), s1), s2);
        o[i] = *(const uint32_t *)&p;
    }
    return make_uint4(o[0], o[1], o[2], o[3]);
}
/* 8 bf16 -> 8 f16 (round to nearest) */
__device__ __forceinline__ uint4 wa_bf16x8(uint4 w) {
    const uint32_t in[4] = {w.x, w.y, w.z, w.w};
    uint32_t o[4];
#pragma unroll
    for (int k = 0; k < 4; k++) {
        const __half2 p = __floats2half2_rn(__uint_as_float(in[k] << 16), __uint_as_float(in[k] & 0xffff0000u));
        o[k] = *(const uint32_t *)&p;
    }
    return make_uint4(o[0], o[1], o[2], o[3]);
}

/* the pass's own rows in the cache format, rope dims f16: a warp a row */
__global__ void attn_wg_pack_kernel(const float *kv2, int n, int Dh, int R, uint8_t *dst) {
    dev_pdl_enter();
    const int row = blockIdx.x * 8 + (threadIdx.x >> 5);
    if (row < n) dev_kv_pack_row_warp(kv2 + (int64_t)row * Dh, Dh, R, dst + (int64_t)row * dsv4_kv_row_bytes(Dh, R), true);
}

/* Block (query blockIdx.x, heads blockIdx.y * 64 ..). Entry id >= 0: row id of base[t]; id <= -2: row -id-2 of kv2p
 * (attn_wg_pack_kernel's); -1: none. q 16-byte aligned, Dh % 8 == 0. */
template <bool FIX>
__global__ void __launch_bounds__(WA_NT, 1) attn_kv8_wg_kernel(const float *q, int H, int Dh, int R,
                                                             const uint8_t *const *base, const uint8_t *kv2p,
                                                             const int *idx, int nidx, const float *sink, float scale,
                                                             float *out, ak_rope rp, int G, int ntm, int qh, int ost,
                                                             const float *tsc, long long *trc) {
    dev_pdl_enter();
    extern __shared__ __align__(128) uint8_t wsm[];
    uint8_t *Qs = wsm + WA_QS, *Ks = wsm + WA_KS, *raw = wsm + WA_RAW;
    float *Sx = (float *)(wsm + WA_SX);
    int *ids = (int *)(wsm + WA_ID);
    const int t = blockIdx.x, h0 = blockIdx.y * WA_H, tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int wg = warp >> 2, g = warp & 3, gr = lane >> 2, tq = lane & 3, wt = tid & 127;
    WA_TR(0);
    const int rb = (int)dsv4_kv_row_bytes(Dh, R), nope = Dh - R, ro = dsv4_kv_rope_off(Dh, R);
    const int nq = nope >> 3, dc = Dh >> 3, ns = (nidx + WA_N - 1) / WA_N;
    const uint8_t *cache = base ? base[t] : NULL;
    const int *lidx = idx + (int64_t)t * nidx;

    /* an entry's id as listed (-1 past the list), and as used: -1 where its source is missing. Apart, so that warp 0's
     * load of the next tile's ids is not waited for where it is issued (session 52: the checks right after it stalled) */
    auto raw_id = [&](int s, int i) {
        const int e = s * WA_N + i;
        return s < ns && e < nidx ? lidx[e] : -1;
    };
    auto fix = [&](int id) { return (id >= 0 && !cache) || (id < -1 && !kv2p) ? -1 : id; };
    auto fetch = [&](int s, int i) { return fix(raw_id(s, i)); };
    /* tile s's rows into raw stage s % 3 on the stage's mbarrier (WA_NT arrivals a phase): warp w copies rows 4 w .. 4 w
     * + 3, 8 lanes a row, lane l of a row its 16-byte chunks l, l + 8, .. (37 a c4 row: 4-5 a lane) as cp.async copies;
     * each thread's arrival is made when its copies have landed (cp.async.mbarrier.arrive.noinc); past the list nothing.
     * cp.async.bulk takes its addresses in uniform registers, so a warp's bulk copies go out one at a time: 32 from one
     * warp were a ~1,000-cycle loop the other warps waited for (session 52, ncu), 4 from each warp still ~680 cycles a
     * c4 tile (session 54's trace); the same chunks spread over the threads by a division a chunk took 1,718 (s54-acpa) */
    const unsigned mb0 = (unsigned)__cvta_generic_to_shared(wsm + WA_MB), raw0 = (unsigned)__cvta_generic_to_shared(raw);
    const int cpr = rb >> 4, ce = 4 * warp + (lane >> 3), cl = lane & 7; /* chunks a row; this lane's row and first chunk */
    auto issue = [&](int s) {
        if (s >= ns) return;
        const int id = ids[(s & (WA_IR - 1)) * WA_N + ce];
        const uint8_t *src = id >= 0 ? cache + (int64_t)id * rb : id < -1 ? kv2p + (int64_t)(-id - 2) * rb : NULL;
        if (src) {
            const unsigned dst = raw0 + (s % WA_RS) * (WA_N * rb) + ce * rb;
            for (int c = cl; c < cpr; c += 8) dev_cp16_g2s(dst + 16 * c, src + 16 * c);
        }
        dev_cp_mbar_arrive(mb0 + 8 * (s % WA_RS));
    };
    /* chunk j of tile s's rows (raw stage s % 3) into f16 rows buffer s & 1: lane = entry id, warp w chunk w + 8 j;
     * without branches (FIX: chunk 7 the rope dims, the others FP8), so that it can sit between wgmma instructions */
    auto dchunk = [&](int s, int j, int id) {
        const int c = warp + 8 * j, cr = FIX ? c : min(c, dc - 1); /* cr: a chunk of the row to read (c past Dh: zeros) */
        const uint8_t *row = raw + (s % WA_RS) * (WA_N * rb) + lane * rb;
        uint4 o;
        if (FIX ? j < 7 : cr < nq) o = wa_fp8x8(*(const uint2 *)(row + 8 * cr), row[nope + (cr >> 3)]);
        else {
            const uint4 w = *(const uint4 *)(row + ro + 16 * (cr - nq)), b = wa_bf16x8(w);
            o = id >= 0 ? b : w; /* the pass's own rows carry f16 rope dims */
        }
        if (id == -1 || (!FIX && c >= dc)) o = make_uint4(0, 0, 0, 0);
        *(uint4 *)(Ks + (s & 1) * (WA_N * WA_D * 2) + c * (WA_N * 16) + (lane >> 3) * 128 + (lane & 7) * 16) = o;
    };

    /* ids of tiles 0 .. 4; tile 5's in flight in warp 0's registers */
    if (tid == 0) {
        for (int k = 0; k < WA_RS; k++) dev_mbar_init(mb0 + 8 * k, WA_NT);
        dev_mbar_fence_init();
    }
    for (int i = tid; i < 5 * WA_N; i += WA_NT) ids[i] = fetch(i / WA_N, i % WA_N);
    int nxt = warp == 0 ? raw_id(5, lane) : -1; /* checked when stored */
    __syncthreads();
    issue(0), issue(1), issue(2);
    WA_TR(1);
    /* the terms form: the inverse RoPE's cos / sin (warp 6, while q's loads are in flight) */
    auto cs_table = [&]() {
        if (ntm && rp.freq && warp == 6)
            for (int i = lane; i < R / 2; i += 32) {
                float c, sn;
                ak_rope_cs((float)rp.pos[t], rp.freq[i], c, sn);
                ((float2 *)(wsm + WA_CS))[i] = make_float2(c, sn);
            }
    };
    /* q of the block's heads as f16 (zeros past H and Dh; Dh % 8 == 0, rows 16-byte aligned: the wrapper checks). A warp
     * instruction takes 8 heads x 4 chunks of 8 dims: 8 lines of q to read (lanes one head apart would touch 32) and 4
     * smem rows to write (conflict-free). All 16 items' loads in flight at once. qh: q's rows already f16
     * (dsv4_cuda_norm_rope_h16: the same roundings), each in the first half of its fp32 row's bytes. */
    if (qh) {
        uint4 hv[16];
#pragma unroll
        for (int k = 0; k < 16; k++) {
            const int P = warp * 16 + k, hh = h0 + 8 * (P & 7) + (lane & 7), c = 4 * (P >> 3) + (lane >> 3);
            hv[k] = make_uint4(0, 0, 0, 0);
            if (hh < H && 8 * c < Dh) hv[k] = *(const uint4 *)((const __half *)q + ((int64_t)t * H + hh) * 2 * Dh + 8 * c);
        }
        cs_table();
#pragma unroll
        for (int k = 0; k < 16; k++) {
            const int P = warp * 16 + k, h = 8 * (P & 7) + (lane & 7), c = 4 * (P >> 3) + (lane >> 3);
            *(uint4 *)(Qs + c * 1024 + (h >> 3) * 128 + (h & 7) * 16) = hv[k];
        }
    } else {
        float4 va[16], vb[16];
#pragma unroll
        for (int k = 0; k < 16; k++) {
            const int P = warp * 16 + k, hh = h0 + 8 * (P & 7) + (lane & 7), c = 4 * (P >> 3) + (lane >> 3);
            va[k] = vb[k] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            if (hh < H && 8 * c < Dh) {
                const float4 *src = (const float4 *)(q + ((int64_t)t * H + hh) * Dh + 8 * c);
                va[k] = src[0], vb[k] = src[1];
            }
        }
        cs_table();
#pragma unroll
        for (int k = 0; k < 16; k++) {
            const int P = warp * 16 + k, h = 8 * (P & 7) + (lane & 7), c = 4 * (P >> 3) + (lane >> 3);
            const __half2 p[4] = {__floats2half2_rn(va[k].x, va[k].y), __floats2half2_rn(va[k].z, va[k].w),
                                  __floats2half2_rn(vb[k].x, vb[k].y), __floats2half2_rn(vb[k].z, vb[k].w)};
            *(uint4 *)(Qs + c * 1024 + (h >> 3) * 128 + (h & 7) * 16) = *(const uint4 *)p;
        }
    }
    wg_fence_proxy();
    WA_TR(2);
    dev_mbar_wait(mb0, 0);
#pragma unroll
    for (int j = 0; j < 8; j++) dchunk(0, j, ids[lane]);
    wg_fence_proxy();
    WA_TR(3);

    float O[32][4];
#pragma unroll
    for (int n = 0; n < 32; n++) O[n][0] = O[n][1] = O[n][2] = O[n][3] = 0.0f;
    float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.0f, l1 = 0.0f; /* rows gr and gr + 8 of the warp's 16 heads */
    const int hA = h0 + 16 * g + gr, hB = hA + 8;
    float *oA = out + ((int64_t)t * H + hA) * Dh, *oB = out + ((int64_t)t * H + hB) * Dh;
    float mf0 = -INFINITY, mf1 = -INFINITY; /* m when O last went into out (spans) */
    bool fl = false;
    /* a row's pair (x, y) of O plus, once a span went into out (fl), the row's partial there (o) times b */
    auto fold = [&](float x, float y, const float *o, float b) {
        float2 v = make_float2(x, y);
        if (fl) {
            const float2 q = *(const float2 *)o;
            v.x = fmaf(q.x, b, v.x), v.y = fmaf(q.y, b, v.y);
        }
        return v;
    };
    const unsigned qa = (unsigned)__cvta_generic_to_shared(Qs), ka0 = (unsigned)__cvta_generic_to_shared(Ks);

    for (int s = 0; s < ns; s++) {
        __syncthreads(); /* tile s's f16 rows are in (and visible to the tensor cores); buffer (s + 1) & 1 is free */
        const int tb = s < 12 ? 4 + 8 * s : -1;
#define WA_TS(k) if (tb >= 0) WA_TR(tb + (k))
        WA_TS(0);
        const unsigned ka = ka0 + (s & 1) * (WA_N * WA_D * 2);
        /* q.k: every k-step (the zero padding past Dh too: wgmma in a divergent path is serialized), with tile s + 1's
         * rows decoded between them (half of them, a chunk every fourth k-step: the tensor pipe's queue drains
         * meanwhile; the other half while p.V runs; past the list into the free buffer, harmlessly) */
        if (s + 1 < ns) dev_mbar_wait(mb0 + 8 * ((s + 1) % WA_RS), ((s + 1) / WA_RS) & 1);
        WA_TS(1);
        const int did = ids[((s + 1) & (WA_IR - 1)) * WA_N + lane];
        float S4[4][4];
        wg_fence();
#pragma unroll
        for (int k = 0; k < 16; k++) {
            wg_mma_ss_n32(S4, wg_desc(qa + (16 * wg + k) * 2048, 1024, 128), wg_desc(ka + (16 * wg + k) * 1024, 512, 128), k);
            if (FIX && (k & 3) == 3) dchunk(s + 1, k >> 2, did); /* chunks 0 .. 3; 4 .. 7 during p.V */
        }
        wg_commit();
        if (!FIX) /* the generic layout's branches between wgmma instructions would make ptxas wait on each */
#pragma unroll
            for (int j = 0; j < 8; j++) dchunk(s + 1, j, did);
        WA_TS(2);
        if (warp == 0) ids[((s + 5) & (WA_IR - 1)) * WA_N + lane] = fix(nxt); /* tile s + 5's ids (loaded a tile ago) */
        issue(s + 3); /* into the stage tile s left (decoded a tile ago, before this tile's barrier) */
        if (warp == 0) nxt = raw_id(s + 6, lane);
        WA_TS(3);

        /* S = own half + other half (commutative: both warpgroups get the same bits) */
        wg_wait<0>();
#pragma unroll
        for (int n = 0; n < 4; n++)
#pragma unroll
            for (int j = 0; j < 4; j++) wg_keep(S4[n][j]);
        WA_TS(4);
        float S[16];
#pragma unroll
        for (int v = 0; v < 16; v++) {
            S[v] = S4[v >> 2][v & 3];
            Sx[(wg * 16 + v) * 128 + wt] = S[v];
        }
        __syncthreads();
        WA_TS(5);
#pragma unroll
        for (int v = 0; v < 16; v++) S[v] += Sx[((wg ^ 1) * 16 + v) * 128 + wt];

        /* online softmax (attn_kv8_tc's); S[4 n + j]: entry 8 n + 2 tq + (j & 1), head row gr (j < 2) or gr + 8 */
        const unsigned vm = __ballot_sync(0xffffffffu, ids[(s & (WA_IR - 1)) * WA_N + lane] != -1);
        float mt0, mt1;
        ak_tile_max(S, vm, tq, scale, mt0, mt1);
        /* the running max moves only when a tile's exceeds it by more than WA_TAU (p = e^(x - m) stays <= e^2, p 2^12 in
         * f16's range): most tiles of a long list then skip O's rescale (128 multiplies a thread) */
        const float mn0 = mt0 > m0 + WA_TAU ? mt0 : m0, mn1 = mt1 > m1 + WA_TAU ? mt1 : m1; /* m -inf: the tile's */
        /* e^(x - m) as 2^(x log2 e - m log2 e) on the SFU (~2 ulp; attn_kv8_tc's expf took ~10 instructions each) */
        const float ms0 = mn0 == -INFINITY ? 0.0f : mn0 * WA_L2E, ms1 = mn1 == -INFINITY ? 0.0f : mn1 * WA_L2E;
        const float a0 = m0 == mn0 ? 1.0f : wa_ex2(fmaf(m0, WA_L2E, -ms0)); /* m -inf: 0 */
        const float a1 = m1 == mn1 ? 1.0f : wa_ex2(fmaf(m1, WA_L2E, -ms1));
        float ls0 = 0.0f, ls1 = 0.0f;
#pragma unroll
        for (int v = 0; v < 16; v++) {
            const float p = wa_ex2(fmaf(S[v], WA_L2E, -((v & 2) ? ms1 : ms0))); /* S = -inf: 0 */
            S[v] = p;
            if (v & 2) ls1 += p;
            else ls0 += p;
        }
        ak_row_fold(O, ls0, ls1, a0, a1, mn0, mn1, l0, l1, m0, m1);

        WA_TS(6);
        /* p x 2^12 as A fragments (k-steps of 16 entries), then O += p.V over this warpgroup's 256 dims */
        uint32_t ph[2][4];
#pragma unroll
        for (int j = 0; j < 2; j++)
#pragma unroll
            for (int k = 0; k < 4; k++) {
                const __half2 h = __floats2half2_rn(S[8 * j + 2 * k] * WA_PS, S[8 * j + 2 * k + 1] * WA_PS);
                ph[j][k] = *(const uint32_t *)&h;
            }
        wg_fence();
#pragma unroll
        for (int j = 0; j < 2; j++) wg_mma_rs_n256t(O, ph[j], wg_desc(ka + wg * 32 * 512 + j * 256, 128, 512));
        wg_commit();
        if (FIX) /* the rest of tile s + 1's rows: q.k is bound by shared memory's bandwidth, p.V (B only) leaves some */
#pragma unroll
            for (int j = 4; j < 8; j++) dchunk(s + 1, j, did);
        wg_fence_proxy(); /* the decoded rows, for the next tile's wgmma (after its barrier) */
        wg_wait<0>();
#pragma unroll
        for (int n = 0; n < 32; n++)
#pragma unroll
            for (int j = 0; j < 4; j++) wg_keep(O[n][j]);
#pragma unroll
        for (int j = 0; j < 2; j++)
#pragma unroll
            for (int k = 0; k < 4; k++) wg_keep(ph[j][k]);
        WA_TS(7);
#undef WA_TS

        if ((s + 1) % WA_F == 0 && s + 1 < ns) { /* end of a span: out = out e^(mf - m) + O (x 2^12), O = 0 */
            const float b0 = mf0 == -INFINITY ? 0.0f : expf(mf0 - m0), b1 = mf1 == -INFINITY ? 0.0f : expf(mf1 - m1);
#pragma unroll
            for (int n = 0; n < 32; n++) {
                const int d = 256 * wg + 8 * n + 2 * tq; /* d + 1 < Dh when d < Dh: Dh % 8 == 0 */
                if (d < Dh && hA < H) *(float2 *)(oA + d) = fold(O[n][0], O[n][1], oA + d, b0);
                if (d < Dh && hB < H) *(float2 *)(oB + d) = fold(O[n][2], O[n][3], oB + d, b1);
                O[n][0] = O[n][1] = O[n][2] = O[n][3] = 0.0f;
            }
            mf0 = m0, mf1 = m1, fl = true;
        }
    }
    WA_TR(100);
    /* out = (out e^(mf - m) + O) 2^-12 / (l + exp(sink - m)), as a product with 2^-12 / (l + exp(sink - m)); float2
     * stores (full 32-byte sectors a quad) */
    const float dA = hA < H && m0 != -INFINITY ? __fadd_rn(l0, expf(sink[hA] - m0)) : 0.0f;
    const float dB = hB < H && m1 != -INFINITY ? __fadd_rn(l1, expf(sink[hB] - m1)) : 0.0f;
    float rA = dA > 0 ? (1.0f / WA_PS) / dA : 0.0f, rB = dB > 0 ? (1.0f / WA_PS) / dB : 0.0f;
    const float b0 = mf0 == -INFINITY ? 0.0f : expf(mf0 - m0), b1 = mf1 == -INFINITY ? 0.0f : expf(mf1 - m1);
    /* the fp32 form stores the values; the terms form keeps them in O, then (below) the inverse RoPE (dsv4_cuda_rope's
     * arithmetic, ak_unrot_cs) and the split path's terms (hi = bf16(v), mid = bf16(v - hi)) in place of the row: group
     * gi's hi at gi * 2 gin, mid at (2 gi + 1) gin (bf16 elements; gin = H / G heads x Dh). A group's terms take the bytes
     * of its own fp32 values and the block holds whole groups (the wrapper checks), so every read of out (spans) is done
     * at the barrier before any write. (A lambda called with constants: one loop each, as separate code would give.) */
    auto fin = [&](bool terms) {
#pragma unroll
        for (int n = 0; n < 32; n++) {
            const int d = 256 * wg + 8 * n + 2 * tq;
            if (d >= Dh) continue;
            if (hA < H) {
                const float2 v = fold(O[n][0], O[n][1], oA + d, b0);
                if (terms) O[n][0] = v.x * rA, O[n][1] = v.y * rA;
                else *(float2 *)(oA + d) = make_float2(v.x * rA, v.y * rA);
            }
            if (hB < H) {
                const float2 v = fold(O[n][2], O[n][3], oB + d, b1);
                if (terms) O[n][2] = v.x * rB, O[n][3] = v.y * rB;
                else *(float2 *)(oB + d) = make_float2(v.x * rB, v.y * rB);
            }
        }
    };
    if (!ntm) {
        fin(false);
        WA_TR(101);
        return;
    }
    if (ntm == 3) { /* one f16 term of v x *tsc (a power of two: the same roundings, scaled) */
        const float sc = __ldg(tsc);
        rA *= sc, rB *= sc;
    }
    fin(true);
    __syncthreads();
    {
        const int hpg = H / G, gin = hpg * Dh, r0 = Dh - R, gA = hA / hpg, gB = hB / hpg;
        __nv_bfloat16 *tb = (__nv_bfloat16 *)(out + (int64_t)t * H * Dh);
        __nv_bfloat16 *pA = tb + (int64_t)gA * 2 * gin + (hA - gA * hpg) * Dh, *pB = tb + (int64_t)gB * 2 * gin + (hB - gB * hpg) * Dh;
        const float2 *cs = (const float2 *)(wsm + WA_CS);
        /* the inverse RoPE of O's pairs at dim d (rows A and B), and a pair's split terms: hi = bf16(v), mid = bf16(v - hi) */
        auto unrot = [&](int n, int d) {
            if (rp.freq && d >= r0) {
                const float2 c = cs[(d - r0) >> 1];
                ak_unrot_cs(O[n][0], O[n][1], c.x, c.y);
                ak_unrot_cs(O[n][2], O[n][3], c.x, c.y);
            }
        };
        auto mid_of = [](float x, float y, __nv_bfloat162 hi) { return __floats2bfloat162_rn(x - __low2float(hi), y - __high2float(hi)); };
        /* a pair's first term's 4 bytes: bf16 hi, or (ntm 3) the f16 term */
        auto first = [&](float x, float y) {
            if (ntm == 3) {
                const __half2 h = __floats2half2_rn(x, y);
                return *(const uint32_t *)&h;
            }
            const __nv_bfloat162 hi = __floats2bfloat162_rn(x, y);
            return *(const uint32_t *)&hi;
        };
        auto put = [&](__nv_bfloat16 *p, float x, float y) {
            const uint32_t f = first(x, y);
            *(uint32_t *)p = f;
            if (ntm == 2) *(__nv_bfloat162 *)(p + gin) = mid_of(x, y, *(const __nv_bfloat162 *)&f);
        };
        /* ost (V4's rows, whole blocks of 64 heads, out 16-byte aligned): the terms through shared memory, so that global
         * memory takes 16-byte stores of whole rows (a warp a 512-byte row) instead of 4-byte ones a quarter of a sector
         * apart: each warp stages its 16 heads x 256 dims per term as [term][row][256 + 8 pad] bf16 (the pad makes the
         * quads' 4-byte writes conflict-free), then copies row by row. Session 40's source profile had the 4-byte stores
         * at ~30 % of a sliding-window layer's samples. The same values as put's. */
        if (FIX && ost && H % WA_H == 0 && !((uintptr_t)out & 15)) {
            constexpr int RW = 132; /* 4-byte words a staged row: 512 bytes + 16 of pad */
            static_assert(WA_NT / 32 * 2 * 16 * RW * 4 <= WA_CS, "the staged terms stay below the cos / sin table");
            uint32_t *sw = (uint32_t *)wsm + warp * (2 * 16 * RW);
#pragma unroll
            for (int n = 0; n < 32; n++) {
                unrot(n, 256 * wg + 8 * n + 2 * tq);
#pragma unroll
                for (int e = 0; e < 2; e++) {
                    const float x = O[n][2 * e], y = O[n][2 * e + 1];
                    const uint32_t f = first(x, y);
                    sw[(gr + 8 * e) * RW + 4 * n + tq] = f;
                    if (ntm == 2) {
                        const __nv_bfloat162 mid = mid_of(x, y, *(const __nv_bfloat162 *)&f);
                        sw[(16 + gr + 8 * e) * RW + 4 * n + tq] = *(const uint32_t *)&mid;
                    }
                }
            }
            __syncwarp();
            for (int tm = 0; tm < (ntm == 2 ? 2 : 1); tm++)
#pragma unroll 4
                for (int r = 0; r < 16; r++) {
                    const int h = h0 + 16 * g + r, gh = h / hpg;
                    const uint4 v = *(const uint4 *)(sw + (16 * tm + r) * RW + 4 * lane);
                    *(uint4 *)(tb + (int64_t)gh * 2 * gin + (int64_t)tm * gin + (h - gh * hpg) * Dh + 256 * wg + 8 * lane) = v;
                }
            WA_TR(101);
            return;
        }
#pragma unroll
        for (int n = 0; n < 32; n++) {
            const int d = 256 * wg + 8 * n + 2 * tq;
            if (d >= Dh) continue;
            unrot(n, d);
            if (hA < H) put(pA + d, O[n][0], O[n][1]);
            if (hB < H) put(pB + d, O[n][2], O[n][3]);
        }
    }
    WA_TR(101);
}

extern "C" int dsv4_cuda_attn_kv8_wg_enabled(void) {
    static int on = -1;
    if (on < 0) on = dsv4_env_int("DSV4_CUDA_ATTN_WG", 1) != 0;
    return on;
}

extern "C" int dsv4_cuda_attn_kv8_wg_fits(int H, int Dh, int R) {
    return H > 0 && Dh <= WA_D && Dh > R && R >= 0 && R % 8 == 0 && (Dh - R) % 64 == 0 &&
           wa_smem(Dh, R) <= (size_t)dsv4_cuda_dev.smem_optin;
}

extern "C" size_t dsv4_cuda_attn_kv8_wg_scratch(int nkv2, int Dh, int R) {
    return nkv2 > 0 ? (size_t)nkv2 * (size_t)dsv4_kv_row_bytes(Dh, R) : 0;
}

/* written in session 28 without a device (bench/NOTES.md "Session 28"), measured and turned on in session 30 */
#ifndef DSV4_ATTN_TERMS_DEFAULT
#define DSV4_ATTN_TERMS_DEFAULT 1 /* on since session 30 (bench/NOTES.md "Session 30": 8K prefill 1.8 %) */
#endif
extern "C" int dsv4_cuda_attn_kv8_wg_terms_enabled(void) {
    static int on = -1;
    if (on < 0) on = dsv4_env_int("DSV4_CUDA_ATTN_TERMS", DSV4_ATTN_TERMS_DEFAULT) != 0;
    return on;
}

extern "C" int dsv4_cuda_attn_kv8_wg_terms_fits(int H, int Dh, int R, int G) {
    return dsv4_cuda_attn_kv8_wg_fits(H, Dh, R) && G > 0 && H % G == 0 && (H <= WA_H || WA_H % (H / G) == 0);
}

/* ntm 0: fp32 out; 1 / 2: the terms form's bf16 terms, 3 its one f16 term of v x *tsc (dsv4_cuda_attn_kv8_wg_terms) */
static int wa_run(const float *q, int T, int H, int Dh, int R, const uint8_t *const *base, const float *kv2, int nkv2,
                  const int *idx, int nidx, const float *sink, float scale, ak_rope rp, int G, int ntm, int qh,
                  const float *tsc, float *out,
                  void *scratch, void *stream) {
    if (T < 0 || nidx < 0 || !dsv4_cuda_attn_kv8_wg_fits(H, Dh, R))
        return dsv4_cuda_fail("attn_kv8_wg: shape outside the path (T %d H %d Dh %d R %d nidx %d)", T, H, Dh, R, nidx);
    if (ntm && (ntm > 3 || (ntm == 3 && !tsc) || !dsv4_cuda_attn_kv8_wg_terms_fits(H, Dh, R, G) || (rp.freq && !rp.pos)))
        return dsv4_cuda_fail("attn_kv8_wg: terms form outside the path (H %d G %d terms %d%s)", H, G, ntm,
                              rp.freq && !rp.pos ? ", RoPE without positions" : "");
    if (((uintptr_t)q & 15) || ((uintptr_t)out & 7)) return dsv4_cuda_fail("attn_kv8_wg: q must be 16-byte aligned, out 8-byte");
    if (kv2 && nkv2 > 0 && (!scratch || ((uintptr_t)scratch & 15)))
        return dsv4_cuda_fail("attn_kv8_wg: %d rows of the pass need 16-byte aligned scratch", nkv2);
    if (!T) return 0;
    cudaStream_t st = DSV4_STREAM(stream);
    if (nidx == 0) {
        if (cudaMemsetAsync(out, 0, sizeof(float) * (size_t)T * H * Dh, st) != cudaSuccess)
            return dsv4_cuda_fail("attn_kv8_wg: memset failed");
        return 0;
    }
    const uint8_t *kv2p = NULL;
    if (kv2 && nkv2 > 0) {
        dev_launch(attn_wg_pack_kernel, (nkv2 + 7) / 8, 256, 0, st, kv2, nkv2, Dh, R, (uint8_t *)scratch);
        if (dsv4_cuda_check_launch("attn_kv8_wg (pack)")) return -1;
        kv2p = (const uint8_t *)scratch;
    }
    const size_t smem = wa_smem(Dh, R);
    static size_t raised = 0;
    if (smem > raised) {
        if (cudaFuncSetAttribute((const void *)attn_kv8_wg_kernel<true>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem) !=
                cudaSuccess ||
            cudaFuncSetAttribute((const void *)attn_kv8_wg_kernel<false>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem) !=
                cudaSuccess)
            return dsv4_cuda_fail("attn_kv8_wg: cannot raise shared memory to %zu bytes", smem);
        raised = smem;
    }
    /* the clock trace (measurement only; not under graph capture): every call appends its stamps to the file */
    static const char *trf = (const char *)-1;
    if (trf == (const char *)-1) trf = getenv("DSV4_ATTN_WG_TRACE");
    cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
    long long *trc = NULL;
    const size_t ntr = (size_t)((T + 511) / 512) * 2 * WA_TRN;
    if (trf && cudaStreamIsCapturing(st, &cs) == cudaSuccess && cs == cudaStreamCaptureStatusNone &&
        cudaMalloc((void **)&trc, ntr * sizeof(long long)) == cudaSuccess)
        cudaMemsetAsync(trc, 0, ntr * sizeof(long long), st);
    if (!ntm) rp.freq = NULL, rp.pos = NULL, G = 1, qh = 0;
    /* the terms through shared memory (the kernel's ost; DSV4_ATTN_WG_OST=0: 4-byte stores from registers; session 40) */
    static int ost = -1;
    if (ost < 0) ost = dsv4_env_int("DSV4_ATTN_WG_OST", 1) != 0;
    if (Dh == 512 && R == 64) /* V4's rows: the chunks' kinds known at compile time */
        dev_launch(attn_kv8_wg_kernel<true>, dim3(T, (H + WA_H - 1) / WA_H), WA_NT, smem, st, q, H, Dh, R, base, kv2p, idx,
                   nidx, sink, scale, out, rp, G, ntm, qh, ost, tsc, trc);
    else
        dev_launch(attn_kv8_wg_kernel<false>, dim3(T, (H + WA_H - 1) / WA_H), WA_NT, smem, st, q, H, Dh, R, base, kv2p, idx,
                   nidx, sink, scale, out, rp, G, ntm, qh, ost, tsc, trc);
    if (trc) {
        long long *h = (long long *)malloc(ntr * sizeof(long long));
        FILE *f = fopen(trf, "a");
        if (h && f && cudaMemcpyAsync(h, trc, ntr * sizeof(long long), cudaMemcpyDeviceToHost, st) == cudaSuccess &&
            cudaStreamSynchronize(st) == cudaSuccess) {
            fprintf(f, "call T %d nidx %d\n", T, nidx);
            for (size_t b = 0; b < ntr / WA_TRN; b++) {
                fprintf(f, "blk %zu wg %zu:", b / 2 * 512, b % 2);
                for (int k = 1; k < WA_TRN; k++) fprintf(f, " %lld", h[b * WA_TRN + k] ? h[b * WA_TRN + k] - h[b * WA_TRN] : -1);
                fprintf(f, "\n");
            }
        }
        if (f) fclose(f);
        free(h);
        cudaFree(trc);
    }
    return dsv4_cuda_check_launch("attn_kv8_wg");
}

extern "C" int dsv4_cuda_attn_kv8_wg(const float *q, int T, int H, int Dh, int R, const uint8_t *const *base,
                                     const float *kv2, int nkv2, const int *idx, int nidx, const float *sink, float scale,
                                     float *out, void *scratch, void *stream) {
    const ak_rope rp = {NULL, NULL};
    return wa_run(q, T, H, Dh, R, base, kv2, nkv2, idx, nidx, sink, scale, rp, 1, 0, 0, NULL, out, scratch, stream);
}

extern "C" int dsv4_cuda_attn_kv8_wg_terms(const float *q, int T, int H, int Dh, int R, const uint8_t *const *base,
                                           const float *kv2, int nkv2, const int *idx, int nidx, const float *sink, float scale,
                                           const float *freq, const int *pos, int G, int nt, int qh, const float *f16s,
                                           float *out, void *scratch, void *stream) {
    if (nt < 1 || nt > 2 || (f16s && nt != 1))
        return dsv4_cuda_fail("attn_kv8_wg_terms: %d terms (1 or 2 bf16, or one f16 term)", nt);
    const ak_rope rp = {R > 0 ? freq : NULL, pos};
    return wa_run(q, T, H, Dh, R, base, kv2, nkv2, idx, nidx, sink, scale, rp, G, f16s ? 3 : nt, qh != 0, f16s, out, scratch,
                  stream);
}
