/* attn_kv8_tc.cu - the sparse attention on tensor cores, for prefill passes (dsv4_cuda_attn_kv8_tc) and decode steps
 * (dsv4_cuda_attn_kv8_tc_dec; kv_cache.h): the math of dsv4_cuda_attn_kv8 (mma.sync m16n8k16, f16 operands, fp32
 * accumulate).
 *
 * A block takes one query and 64 of its heads (they share the query's entry list): warp (g, hf) of 8 holds heads
 * 16 g .. 16 g + 15 and dims 256 hf .. 256 hf + 255 (of 512: q and rows zero-padded); decode blocks may take 16 heads
 * instead, warp hf holding dims 64 hf .. 64 hf + 63 (below). The list goes in tiles of 32
 * entries (rows by cp.async while the previous tile computes):
 *  - rows decoded into shared memory as f16: FP8 code x e8m0 scale (exact, see Range), rope dims as hi + lo
 *    (hi = f16(v), lo = f16(v - hi)); q likewise as hi + lo. Scores qh.k + ql.k (+ qh.k_lo on the rope dims): ~2^-22
 *    relative per product, fp32 sums (HL false, the prefill form's default since session 24: q, the rope dims and p
 *    as one f16 term each, half the products, ~2^-12 relative per operand, against the official model's bf16 2^-9);
 *  - each warp scores its 16 heads over its 256 dims; the two warps of a head group swap the partial scores through
 *    shared memory and add them (a + b: the same bits in both), then both run the same online softmax (fp32: running
 *    max m, sum l of the fp32 p);
 *  - p 2^12 = ph + pl (f16 each); O[16 heads x 256 dims] += ph.V + pl.V (+ ph.V_lo on the rope dims), fp32 in
 *    registers.
 * Prefill passes (kernel DEC = false): one online softmax over the whole list; O goes into out after every TC_F tiles
 * (1024 entries; out = out e^(m' - m) + O), so that no tensor-core accumulator takes more than a span's terms.
 * Decode steps (DEC = true): spans of spt tiles (DSV4_CUDA_ATTN_TC_SPT, default 2: parallelism at batch 1), each
 * span's state (m, l, O) started afresh and folded in order into the total (attn_fold.cuh: attn_kv8_combine's
 * operations), by the query's block (the total's O waits in out between spans) or by attn_kv8_combine over the states
 * a block per span left in scratch: the same bits either way. The decode form scores in slices of 64 dims, one chain
 * each (q hi and q lo products together), added as (((p0 + p1) + p2) + p3) + (((p4 + p5) + p6) + p7), so a block may
 * also take 16 heads with a warp per slice (8 warps x 64 dims; more blocks and a quarter of the work a warp: batch 1
 * was latency-bound at ~30 us with 10 blocks) and give the same bits. (One template for both: the prefill form is the kernel
 * as it was before the decode form existed, instruction for instruction but for a handful, so its speed is kept; the
 * decode form's span folds made the prefill passes 7-20 % slower, RESULTS session 14.)
 * out = O / (L + exp(sink - M)); zeros for a query without entries. Every sum's order depends only on the query's own
 * list (and spt): batch invariant, repeatable; the bits are not dsv4_cuda_attn_kv8's (another order: ~1e-6 relative).
 * Range: f16 holds an FP8 value exactly when it is 0 or 2^-21 <= |v| < 65504 (kv_norm'd rows are; smaller ones keep
 * an absolute error < 2^-25); q must stay under 65504 (it is RMS-normed). Rows of kv2 (the pass's own kv): non-rope
 * dims FP8-simulated (forward_cuda.c quantizes w->kv; taken as hi only), rope dims fp32 (hi + lo). */
#include <cuda_fp16.h>

#include "attn_fold.cuh"
#include "common.cuh"
#include "kv_cache.cuh"
#include "linear_tc.cuh"
#include "wgmma.cuh"

#define TC_N 32   /* entries per tile */
#define TC_D 512  /* dims per row in shared memory (zero-padded) */
#define TC_HB 64  /* heads per block */
#define TC_NT 256 /* threads: 8 warps */
#define TC_LO 64  /* dims with a lo term in the rows: nope .. nope + 63 (the rope dims) */
#define TC_PS 4096.0f /* p is split as p x 2^12 (f16 subnormals only below p 2^-26); O carries the factor */
#define TC_F 32       /* prefill: tiles per span (no tensor-core accumulator takes more than a span's terms) */
#define TC_MAXSPAN 32 /* spans per query at most: a span takes ceil(tiles / 32) tiles if that is more than asked */
#define TC_PMAX_T 32  /* decode: a block per span (partials in scratch) for T <= this (bounds the scratch) */
/* decode: layers whose lists hold at least this many entries take the tensor cores (DSV4_CUDA_ATTN_TC_DECODE_MIN):
 * every layer since the blocks of 16 heads and 1-tile spans for short lists (session 16: batch 1 0.996x, 8 0.982x,
 * 64 0.977x, 256 0.968x against the ratio-4 layers alone; with blocks of 64 heads short lists took ~30 us at batch 1
 * against attn_kv8's 12, so session 14 kept them at >= 512). */
#define TC_DEC_MIN 0
/* decode: lists under this many entries are short: spans of DSV4_CUDA_ATTN_TC_SPT_SHORT tiles (twice the blocks at
 * batch 1; V4's sliding-window and, up to 48K of capacity, ratio-128 layers) */
#define TC_DEC_SHORT 512
#define TC_WG_SG 2 /* warpgroup MMA decode form: score slices a commit group (their chains in flight together) */

/* halves from a row's start to its 16-byte chunk c: chunks XOR-swizzled by row (ldmatrix without bank conflicts) */
__device__ __forceinline__ int tc_sw(int r, int c) { return (c ^ (r & 7)) << 3; }

__device__ __forceinline__ uint32_t tc_u32(__half2 h) { return *(const uint32_t *)&h; }
/* (x, y) -> hi = f16 pair, lo = f16 pair of the remainders (x - hi exact in fp32) */
__device__ __forceinline__ void tc_split(float x, float y, uint32_t &hi, uint32_t &lo) {
    const __half2 h = __floats2half2_rn(x, y);
    const float2 f = __half22float2(h);
    hi = tc_u32(h);
    lo = tc_u32(__floats2half2_rn(x - f.x, y - f.y));
}
__device__ __forceinline__ void tc_split8(const float (&v)[8], uint4 &hi, uint4 &lo) {
    tc_split(v[0], v[1], hi.x, lo.x);
    tc_split(v[2], v[3], hi.y, lo.y);
    tc_split(v[4], v[5], hi.z, lo.z);
    tc_split(v[6], v[7], hi.w, lo.w);
}
/* WGM: bytes from a tile's start to 16-byte chunk c of row r in wgmma's core matrices (8 rows x 16 bytes, 128 contiguous
 * bytes, no swizzle; attn_kv8_wg's layout), cs bytes a chunk's column of core matrices */
__device__ __forceinline__ int tc_cm(int c, int r, int cs) { return c * cs + (r >> 3) * 128 + (r & 7) * 16; }
/* the two warps of head group g (named barrier 1 + g) */
__device__ __forceinline__ void tc_pair_sync(int g) { asm volatile("bar.sync %0, 64;\n" ::"r"(1 + g) : "memory"); }

static size_t tc_smem(int Dh, int R, int HB, int WGM = 0) {
    return sizeof(__half) * ((size_t)2 * HB * TC_D + (size_t)TC_N * TC_D + (size_t)TC_N * TC_LO) + (WGM ? (size_t)32 * 512 : 0) +
           sizeof(float) * (8 * 16 * TC_N + 8 * 16 * 2 + TC_LO) + sizeof(int) * 2 * TC_N + (size_t)TC_N * dsv4_kv_row_bytes(Dh, R);
}

/* Block (query blockIdx.x, heads blockIdx.y * 64 .., span blockIdx.z). vec: q and kv2 rows 16-byte aligned, Dh % 4 == 0.
 * DEC false (prefill passes): every tile in order, O (x 2^12) into out every TC_F tiles (out = out e^(m' - m) + O),
 * l running over the whole list; part, spt, nspan and orope unused.
 * DEC true (decode steps): spans of spt tiles, nspan of them, each span's state (m, l, O) started afresh; gridDim.z ==
 * 1: the block takes every span and folds each into the total (attn_fold.cuh; the total's O waits in out between
 * spans), else the block takes span blockIdx.z and writes its state (m, l, O x 2^12) to part for ak_combine_launch:
 * the same bits either way. orope: the output's inverse RoPE (freq NULL: none). */
template <bool DEC, int HB, bool HL, bool WGM = false>
__global__ void __launch_bounds__(TC_NT, HB == TC_HB ? 1 : 2) attn_kv8_tc_kernel(const float *q, int H, int Dh, int R,
                                                              const uint8_t *const *base, const float *kv2,
                                                              const int *idx, int nidx, const float *sink, float scale,
                                                              float *out, float *part, int spt, int nspan, int vec,
                                                              ak_rope orope) {
    dev_pdl_enter();
    extern __shared__ __align__(16) uint8_t tsm[];
    static_assert(HB == TC_HB || (DEC && HB == 16), "64 heads a block, or 16 (decode)");
    static_assert(!WGM || (DEC && HB == TC_HB && HL), "warpgroup MMA: the decode form of 64 heads, hi + lo");
    constexpr int WG = HB / 16, DW = TC_D * WG / 8; /* head groups of 16; dims a warp (256 or 64) */
    __half *Qh = (__half *)tsm;              /* [HB heads][512] q hi */
    __half *Ql = Qh + HB * TC_D;             /* [HB][512] q lo */
    __half *Kh = Ql + HB * TC_D;             /* [32 entries][512] rows (hi) */
    /* WGM: 32 chunks of zeros (Kz, 16 KB) before Kl: read as 256 dims N-major from Kz + 8 chunks, the rope terms of p.V
     * land on n-tiles 24 .. 31 (rope dims 448 .. 511) and zeros elsewhere; from Kz, zeros (the warpgroup without them) */
    __half *Kz = Kh + TC_N * TC_D;
    __half *Kl = Kz + (WGM ? 32 * 256 : 0);  /* [32][64] lo of dims nope .. nope + 63 */
    float *Sx = (float *)(Kl + TC_N * TC_LO); /* [8 warps][16][32] partial scores, fragment order */
    float *Tml = Sx + 8 * 16 * TC_N;         /* [8 warps][16 rows][M, L] the total's (full mode; O waits in out) */
    float *Rcs = Tml + 8 * 16 * 2;           /* [R / 2][cos, sin] of the output's inverse RoPE (decode, full mode) */
    int *ids = (int *)(Rcs + TC_LO);         /* [2][32] entry ids, double-buffered */
    uint8_t *raw = (uint8_t *)(ids + 2 * TC_N); /* [32][rb] cache rows as stored */

    const int t = blockIdx.x, h0 = blockIdx.y * HB, tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int g = warp & (WG - 1), hf = WG == 4 ? warp >> 2 : warp, db = DW * hf, gr = lane >> 2, tq = lane & 3; /* heads 16 g .., dims db .. */
    const int64_t rb = dsv4_kv_row_bytes(Dh, R);
    const int nope = Dh - R, ro = dsv4_kv_rope_off(Dh, R), nchk = (int)(rb >> 4), ns = (nidx + TC_N - 1) / TC_N;
    const uint8_t *cache = base ? base[t] : NULL;
    const int *lidx = idx + (int64_t)t * nidx;
    const bool full = !DEC || gridDim.z == 1;
    const int s_begin = full ? 0 : blockIdx.z * spt, s_end = full ? ns : min(ns, s_begin + spt);

    auto fetch = [&](int s, int i) {
        const int e = s * TC_N + i;
        int id = e < nidx ? lidx[e] : -1;
        if (id >= 0 && !cache) id = -1;
        if (id < -1 && !kv2) id = -1;
        return id;
    };
    auto issue = [&](int s, const int *sid) {
        const int nc = min(TC_N, nidx - s * TC_N);
        for (int it = tid; it < nc * nchk; it += TC_NT) {
            const int i = it / nchk, k = it - i * nchk, id = sid[i];
            if (id >= 0) dev_cp16(raw + i * rb + 16 * k, cache + (int64_t)id * rb + 16 * k);
        }
        dev_cp_commit();
    };
    if (tid < TC_N) ids[tid] = fetch(s_begin, tid);
    if constexpr (DEC) { /* the first tile's rows come in while q is split */
        __syncthreads();
        issue(s_begin, ids);
    }

    /* q of the block's heads as hi + lo (zeros past H and Dh); decode: 8 steps' loads in flight */
#pragma unroll (DEC ? 2 * WG : 1)
    for (int u = tid; u < HB * (TC_D / 8); u += TC_NT) {
        const int r = WGM ? u & (HB - 1) : u >> 6, c = WGM ? u / HB : u & 63, hh = h0 + r, d0 = 8 * c;
        float v[8];
        if (hh < H && d0 < Dh) {
            const float *src = q + ((int64_t)t * H + hh) * Dh + d0;
            if (vec && d0 + 8 <= Dh) {
                const float4 a = *(const float4 *)src, b = *(const float4 *)(src + 4);
                v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
            } else {
#pragma unroll
                for (int j = 0; j < 8; j++) v[j] = d0 + j < Dh ? src[j] : 0.0f;
            }
        } else {
#pragma unroll
            for (int j = 0; j < 8; j++) v[j] = 0.0f;
        }
        uint4 hi, lo;
        tc_split8(v, hi, lo);
        if constexpr (WGM) { /* wgmma's core matrices (attn_kv8_wg's q layout): chunk c of head r */
            *(uint4 *)((uint8_t *)Qh + tc_cm(c, r, 1024)) = hi;
            *(uint4 *)((uint8_t *)Ql + tc_cm(c, r, 1024)) = lo;
        } else {
            *(uint4 *)(Qh + r * TC_D + tc_sw(r, c)) = hi;
            if constexpr (HL) *(uint4 *)(Ql + r * TC_D + tc_sw(r, c)) = lo;
        }
    }
    if constexpr (WGM) {
#pragma unroll
        for (int k = 0; k < 4; k++) ((uint4 *)Kz)[tid + k * TC_NT] = make_uint4(0, 0, 0, 0); /* 16 KB */
        wg_fence_proxy();
    }
    __syncthreads();
    if constexpr (!DEC) issue(s_begin, ids);

    constexpr int NO = DW / 8; /* O's n-tiles of 8 dims */
    float O[NO][4];
#pragma unroll
    for (int n = 0; n < NO; n++) O[n][0] = O[n][1] = O[n][2] = O[n][3] = 0.0f;
    float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.0f, l1 = 0.0f; /* the span's state, rows gr and gr + 8 of the warp's heads */
    if (DEC && full && orope.freq && tid < R / 2) /* once a block: the epilogue's rotations read them (the same values) */
        ak_rope_cs((float)orope.pos[t], orope.freq[tid], Rcs[2 * tid], Rcs[2 * tid + 1]);
    if (DEC && tq == 0) /* the quad's lanes hold the same values: lane 4 gr keeps them */
        Tml[(warp * 16 + gr) * 2] = Tml[(warp * 16 + gr + 8) * 2] = -INFINITY,
        Tml[(warp * 16 + gr) * 2 + 1] = Tml[(warp * 16 + gr + 8) * 2 + 1] = 0.0f;
    const int hA = h0 + 16 * g + gr, hB = hA + 8;
    const bool lo_mine = DEC ? nope >= db && nope < db + DW : (nope >> 8) == hf; /* the rope dims lie in this warp's dims */
    /* ldmatrix row / chunk of this lane: A (q), B of q.k (rows of K), B of p.V (rows of V, transposed) */
    const int ra = 16 * g + (lane & 7) + ((lane >> 3) & 1) * 8, ca = lane >> 4;
    const int rk = (lane & 7) + (lane >> 4) * 8, ck = (lane >> 3) & 1;
    const int rv = (lane & 7) + ((lane >> 3) & 1) * 8, cv = lane >> 4;
    /* one k-step of 16 dims at 16-byte chunk c0 of q.k over the tile's 32 entries: q hi into ah, then q lo into al
     * (the decode form passes one accumulator for both) */
    auto qk_step = [&](float (&ah)[4][4], float (&al)[4][4], int c0) {
        uint32_t a[4], aq[4], b0[4], b1[4];
        tc_ldsm4(a, Qh + ra * TC_D + tc_sw(ra, c0 + ca));
        if constexpr (HL) tc_ldsm4(aq, Ql + ra * TC_D + tc_sw(ra, c0 + ca));
        tc_ldsm4(b0, Kh + rk * TC_D + tc_sw(rk, c0 + ck));
        tc_ldsm4(b1, Kh + (rk + 16) * TC_D + tc_sw(rk + 16, c0 + ck));
        tc_mma(ah[0], a, b0[0], b0[1]);
        tc_mma(ah[1], a, b0[2], b0[3]);
        tc_mma(ah[2], a, b1[0], b1[1]);
        tc_mma(ah[3], a, b1[2], b1[3]);
        if constexpr (!HL) return;
        tc_mma(al[0], aq, b0[0], b0[1]);
        tc_mma(al[1], aq, b0[2], b0[3]);
        tc_mma(al[2], aq, b1[0], b1[1]);
        tc_mma(al[3], aq, b1[2], b1[3]);
    };
    /* q hi . k lo over the rope dims (q's chunks from qc), all TC_LO / 16 k-steps into acc */
    auto qk_rope = [&](float (&acc)[4][4], int qc) {
#pragma unroll
        for (int kk = 0; kk < TC_LO / 16; kk++) {
            uint32_t a[4], b0[4], b1[4];
            tc_ldsm4(a, Qh + ra * TC_D + tc_sw(ra, qc + 2 * kk + ca));
            tc_ldsm4(b0, Kl + rk * TC_LO + tc_sw(rk, 2 * kk + ck));
            tc_ldsm4(b1, Kl + (rk + 16) * TC_LO + tc_sw(rk + 16, 2 * kk + ck));
            tc_mma(acc[0], a, b0[0], b0[1]);
            tc_mma(acc[1], a, b0[2], b0[3]);
            tc_mma(acc[2], a, b1[0], b1[1]);
            tc_mma(acc[3], a, b1[2], b1[3]);
        }
    };

    /* one tile of 32 entries: rows in (the next tile's requested), scores, the online softmax of the span, O += p.V */
    auto tile = [&](int s) {
        const int *cid = ids + ((s - s_begin) & 1) * TC_N;
        dev_cp_wait<0>();
        __syncthreads(); /* raw rows in; every warp is done with the previous tile */
        if (tid < TC_N && s + 1 < s_end) ids[((s + 1 - s_begin) & 1) * TC_N + tid] = fetch(s + 1, tid);
        /* rows into Kh / Kl: a thread per 8 dims of a row */
#pragma unroll 4
        for (int k = 0; k < TC_N * (TC_D / 8) / TC_NT; k++) {
            const int u = tid + k * TC_NT, i = WGM ? u & (TC_N - 1) : u >> 6, c = WGM ? u / TC_N : u & 63, d0 = 8 * c, id = cid[i];
            float v[8];
#pragma unroll
            for (int j = 0; j < 8; j++) v[j] = 0.0f;
            if (id >= 0 && d0 < Dh) {
                const uint8_t *row = raw + i * rb;
                if (d0 + 8 <= nope) {
                    const uint2 w = *(const uint2 *)(row + d0);
                    const float sc = dev_e8m0(row[nope + d0 / 64]);
                    const float2 a = dev_e4m3x2((uint16_t)w.x), b = dev_e4m3x2((uint16_t)(w.x >> 16));
                    const float2 e = dev_e4m3x2((uint16_t)w.y), f = dev_e4m3x2((uint16_t)(w.y >> 16));
                    v[0] = a.x * sc, v[1] = a.y * sc, v[2] = b.x * sc, v[3] = b.y * sc;
                    v[4] = e.x * sc, v[5] = e.y * sc, v[6] = f.x * sc, v[7] = f.y * sc;
                } else if (d0 >= nope && d0 + 8 <= Dh) {
                    const uint4 w = *(const uint4 *)(row + ro + 2 * (d0 - nope));
                    v[0] = dev_bf16((uint16_t)w.x), v[1] = dev_bf16((uint16_t)(w.x >> 16));
                    v[2] = dev_bf16((uint16_t)w.y), v[3] = dev_bf16((uint16_t)(w.y >> 16));
                    v[4] = dev_bf16((uint16_t)w.z), v[5] = dev_bf16((uint16_t)(w.z >> 16));
                    v[6] = dev_bf16((uint16_t)w.w), v[7] = dev_bf16((uint16_t)(w.w >> 16));
                } else {
#pragma unroll
                    for (int j = 0; j < 8; j++) v[j] = d0 + j < Dh ? dev_kv_at(row, Dh, R, d0 + j) : 0.0f;
                }
            } else if (id < -1 && d0 < Dh) {
                const float *row = kv2 + (int64_t)(-id - 2) * Dh + d0;
                if (vec && d0 + 8 <= Dh) {
                    const float4 a = *(const float4 *)row, b = *(const float4 *)(row + 4);
                    v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
                } else {
#pragma unroll
                    for (int j = 0; j < 8; j++) v[j] = d0 + j < Dh ? row[j] : 0.0f;
                }
            }
            uint4 hi, lo;
            if (HL && d0 >= nope && d0 < nope + TC_LO) {
                tc_split8(v, hi, lo);
                if constexpr (WGM) *(uint4 *)((uint8_t *)Kl + tc_cm((d0 - nope) >> 3, i, 512)) = lo;
                else *(uint4 *)(Kl + i * TC_LO + tc_sw(i, (d0 - nope) >> 3)) = lo;
            } else { /* FP8 values (exact); without HL the rope dims too, as one f16 term */
                hi.x = tc_u32(__floats2half2_rn(v[0], v[1])), hi.y = tc_u32(__floats2half2_rn(v[2], v[3]));
                hi.z = tc_u32(__floats2half2_rn(v[4], v[5])), hi.w = tc_u32(__floats2half2_rn(v[6], v[7]));
            }
            if constexpr (WGM) *(uint4 *)((uint8_t *)Kh + tc_cm(c, i, 512)) = hi;
            else *(uint4 *)(Kh + i * TC_D + tc_sw(i, c)) = hi;
        }
        if constexpr (WGM) wg_fence_proxy();
        __syncthreads(); /* Kh / Kl and the next ids are in; raw is free */
        if (s + 1 < s_end) issue(s + 1, ids + ((s + 1 - s_begin) & 1) * TC_N);

        float S[16];
        if constexpr (!DEC) {
            /* partial scores over this warp's dims: hi-q and lo-q terms in separate accumulators */
            float sa[4][4], sb[4][4];
#pragma unroll
            for (int n = 0; n < 4; n++)
#pragma unroll
                for (int j = 0; j < 4; j++) sa[n][j] = sb[n][j] = 0.0f;
#pragma unroll 4
            for (int kk = 0; kk < 16; kk++) qk_step(sa, sb, 32 * hf + 2 * kk);
            if (HL && lo_mine) qk_rope(sb, nope / 8);
            /* swap partials with the other half: S = own + other (commutative: both warps get the same bits) */
#pragma unroll
            for (int n = 0; n < 4; n++)
#pragma unroll
                for (int j = 0; j < 4; j++) {
                    S[4 * n + j] = sa[n][j] + sb[n][j];
                    Sx[(warp * 16 + 4 * n + j) * TC_N + lane] = S[4 * n + j];
                }
            tc_pair_sync(g);
#pragma unroll
            for (int v = 0; v < 16; v++) S[v] += Sx[((warp ^ 4) * 16 + v) * TC_N + lane];
        } else {
            if constexpr (WGM) {
                /* the decode form's chains on warpgroup MMA (the bits of mma.sync's: wgmma.cuh), warpgroup hf's four
                 * slices: per k-step q hi . k then q lo . k (m64n32k16, both operands in shared memory; accumulators
                 * from +0 as mma.sync's), then q hi . k lo on the rope slice (nope 448: slice 3 of warpgroup 1).
                 * Warpgroup 0 runs the same four steps on zeros (Kz: a value plus +0 is the value; no branch around a
                 * wgmma) */
                const unsigned qha = (unsigned)__cvta_generic_to_shared(Qh), qla = (unsigned)__cvta_generic_to_shared(Ql);
                const unsigned kha = (unsigned)__cvta_generic_to_shared(Kh);
                const unsigned kra = (unsigned)__cvta_generic_to_shared(lo_mine ? Kl : Kz);
                constexpr int SG = TC_WG_SG;
#pragma unroll
                for (int s0 = 0; s0 < 4; s0 += SG) {
                    float p[SG][4][4];
#pragma unroll
                    for (int sl = 0; sl < SG; sl++)
#pragma unroll
                        for (int n = 0; n < 4; n++)
#pragma unroll
                            for (int j = 0; j < 4; j++) p[sl][n][j] = 0.0f;
                    wg_fence();
#pragma unroll
                    for (int sl = 0; sl < SG; sl++) {
                        const int cb = 32 * hf + 8 * (s0 + sl); /* the slice's first chunk of 8 dims */
#pragma unroll
                        for (int kk = 0; kk < 4; kk++) {
                            const int c = cb + 2 * kk;
                            wg_mma_ss_n32(p[sl], wg_desc(qha + c * 1024, 1024, 128), wg_desc(kha + c * 512, 512, 128), 1);
                            wg_mma_ss_n32(p[sl], wg_desc(qla + c * 1024, 1024, 128), wg_desc(kha + c * 512, 512, 128), 1);
                        }
                        if (s0 + sl == 3)
#pragma unroll
                            for (int kk = 0; kk < 4; kk++)
                                wg_mma_ss_n32(p[sl], wg_desc(qha + (cb + 2 * kk) * 1024, 1024, 128),
                                              wg_desc(kra + kk * 1024, 512, 128), 1);
                    }
                    wg_commit();
                    wg_wait<0>();
#pragma unroll
                    for (int sl = 0; sl < SG; sl++)
#pragma unroll
                        for (int n = 0; n < 4; n++)
#pragma unroll
                            for (int j = 0; j < 4; j++) {
                                wg_keep(p[sl][n][j]);
                                S[4 * n + j] = s0 + sl ? __fadd_rn(S[4 * n + j], p[sl][n][j]) : p[sl][n][j];
                            }
                }
            } else {
                /* decode: the scores in slices of 64 dims, p_i = one chain per slice (q hi then q lo products a k-step;
                 * q hi . k lo after them on the rope slice), S = (((p0 + p1) + p2) + p3) + (((p4 + p5) + p6) + p7):
                 * the same bits whether a warp holds four slices (64 heads a block) or one (16 heads a block) */
#pragma unroll 1
                for (int sl = 0; sl < DW / 64; sl++) {
                    const int cb = (db >> 3) + 8 * sl; /* the slice's first 16-byte chunk */
                    float p[4][4];
#pragma unroll
                    for (int n = 0; n < 4; n++)
#pragma unroll
                        for (int j = 0; j < 4; j++) p[n][j] = 0.0f;
#pragma unroll
                    for (int kk = 0; kk < 4; kk++) qk_step(p, p, cb + 2 * kk);
                    if (HL && 8 * cb == nope) qk_rope(p, cb); /* the rope slice */
#pragma unroll
                    for (int n = 0; n < 4; n++)
#pragma unroll
                        for (int j = 0; j < 4; j++) S[4 * n + j] = sl ? __fadd_rn(S[4 * n + j], p[n][j]) : p[n][j];
                }
            }
#pragma unroll
            for (int v = 0; v < 16; v++) Sx[(warp * 16 + v) * TC_N + lane] = S[v];
            if constexpr (WG == 4) { /* two warps a head group: S = own half + other half (commutative) */
                tc_pair_sync(g);
#pragma unroll
                for (int v = 0; v < 16; v++) S[v] = __fadd_rn(S[v], Sx[((warp ^ 4) * 16 + v) * TC_N + lane]);
            } else { /* eight warps of one slice each: every warp adds the same chains */
                __syncthreads();
#pragma unroll
                for (int v = 0; v < 16; v++) {
                    float a = Sx[v * TC_N + lane], b = Sx[(4 * 16 + v) * TC_N + lane];
#pragma unroll
                    for (int w = 1; w < 4; w++)
                        a = __fadd_rn(a, Sx[(w * 16 + v) * TC_N + lane]), b = __fadd_rn(b, Sx[((4 + w) * 16 + v) * TC_N + lane]);
                    S[v] = __fadd_rn(a, b);
                }
            }
        }

        /* online softmax; S[4 n + j]: entry 8 n + 2 tq + (j & 1), head row gr (j < 2) or gr + 8 */
        const unsigned vm = __ballot_sync(0xffffffffu, cid[lane] != -1);
        float mt0, mt1;
        ak_tile_max(S, vm, tq, scale, mt0, mt1);
        const float mn0 = fmaxf(m0, mt0), mn1 = fmaxf(m1, mt1);
        const float a0 = mn0 == -INFINITY ? 1.0f : expf(m0 - mn0), a1 = mn1 == -INFINITY ? 1.0f : expf(m1 - mn1);
        float ls0 = 0.0f, ls1 = 0.0f;
#pragma unroll
        for (int v = 0; v < 16; v++) {
            const float mn = (v & 2) ? mn1 : mn0;
            const float p = S[v] == -INFINITY ? 0.0f : expf(S[v] - mn);
            S[v] = p;
            if (v & 2) ls1 += p;
            else ls0 += p;
        }
        ak_row_fold(O, ls0, ls1, a0, a1, mn0, mn1, l0, l1, m0, m1);

        /* p x 2^12 as A operands (k-steps of 16 entries): hi and lo */
        uint32_t ph[2][4], pl[2][4];
#pragma unroll
        for (int v = 0; v < 16; v++) S[v] *= TC_PS;
#pragma unroll
        for (int j = 0; j < 2; j++) {
            if constexpr (!HL) {
                ph[j][0] = tc_u32(__floats2half2_rn(S[8 * j + 0], S[8 * j + 1]));
                ph[j][1] = tc_u32(__floats2half2_rn(S[8 * j + 2], S[8 * j + 3]));
                ph[j][2] = tc_u32(__floats2half2_rn(S[8 * j + 4], S[8 * j + 5]));
                ph[j][3] = tc_u32(__floats2half2_rn(S[8 * j + 6], S[8 * j + 7]));
                continue;
            }
            tc_split(S[8 * j + 0], S[8 * j + 1], ph[j][0], pl[j][0]);
            tc_split(S[8 * j + 2], S[8 * j + 3], ph[j][1], pl[j][1]);
            tc_split(S[8 * j + 4], S[8 * j + 5], ph[j][2], pl[j][2]);
            tc_split(S[8 * j + 6], S[8 * j + 7], ph[j][3], pl[j][3]);
        }
        if constexpr (WGM) {
            /* O += p.V on warpgroup MMA: per k-step of 16 entries p hi . V then p lo . V over the warpgroup's 256 dims
             * (m64n256k16, V = the rows read N-major), then p hi . V lo: 256 dims from Kz + 8 chunks, i.e. the rope
             * dims' lo on n-tiles 24 .. 31 of warpgroup 1 and zeros elsewhere (all zeros for warpgroup 0): mma.sync's
             * order for every n-tile (an exact zero added changes no sum; O is never -0: it starts at +0) */
            const unsigned vb = (unsigned)__cvta_generic_to_shared(Kh) + hf * 32 * 512;
            const unsigned vr = (unsigned)__cvta_generic_to_shared(Kz) + (lo_mine ? 8 * 512 : 0);
            wg_fence();
#pragma unroll
            for (int j = 0; j < 2; j++) {
                wg_mma_rs_n256t(O, ph[j], wg_desc(vb + j * 256, 128, 512));
                wg_mma_rs_n256t(O, pl[j], wg_desc(vb + j * 256, 128, 512));
            }
#pragma unroll
            for (int j = 0; j < 2; j++) wg_mma_rs_n256t(O, ph[j], wg_desc(vr + j * 256, 128, 512));
            wg_commit();
            wg_wait<0>();
#pragma unroll
            for (int n = 0; n < NO; n++)
#pragma unroll
                for (int j = 0; j < 4; j++) wg_keep(O[n][j]);
#pragma unroll
            for (int j = 0; j < 2; j++)
#pragma unroll
                for (int k = 0; k < 4; k++) wg_keep(ph[j][k]), wg_keep(pl[j][k]);
        } else {
            /* O += p.V over this warp's dims, 16 at a time */
#pragma unroll
            for (int dp = 0; dp < NO / 2; dp++) {
                const int c0 = DW / 8 * hf + 2 * dp;
#pragma unroll
                for (int j = 0; j < 2; j++) {
                    uint32_t b[4];
                    tc_ldsm4t(b, Kh + (16 * j + rv) * TC_D + tc_sw(16 * j + rv, c0 + cv));
                    tc_mma(O[2 * dp], ph[j], b[0], b[1]);
                    tc_mma(O[2 * dp + 1], ph[j], b[2], b[3]);
                    if constexpr (HL) {
                        tc_mma(O[2 * dp], pl[j], b[0], b[1]);
                        tc_mma(O[2 * dp + 1], pl[j], b[2], b[3]);
                    }
                }
                const int dl = 8 * c0 - nope; /* p hi . V lo on the rope dims */
                if (HL && lo_mine && dl >= 0 && dl < TC_LO) {
#pragma unroll
                    for (int j = 0; j < 2; j++) {
                        uint32_t b[4];
                        tc_ldsm4t(b, Kl + (16 * j + rv) * TC_LO + tc_sw(16 * j + rv, (dl >> 3) + cv));
                        tc_mma(O[2 * dp], ph[j], b[0], b[1]);
                        tc_mma(O[2 * dp + 1], ph[j], b[2], b[3]);
                    }
                }
            }
        }
    };
    if constexpr (!DEC) {
        float *oA = out + ((int64_t)t * H + hA) * Dh, *oB = out + ((int64_t)t * H + hB) * Dh;
        float mf0 = -INFINITY, mf1 = -INFINITY; /* m when O last went into out (spans) */
        bool fl = false;
        for (int s = 0; s < ns; s++) {
            tile(s);
            if ((s + 1) % TC_F == 0 && s + 1 < ns) { /* end of a span: out = out e^(mf - m) + O (x 2^12), O = 0 */
                const float b0 = mf0 == -INFINITY ? 0.0f : expf(mf0 - m0), b1 = mf1 == -INFINITY ? 0.0f : expf(mf1 - m1);
#pragma unroll
                for (int n = 0; n < 32; n++) {
                    const int d = 256 * hf + 8 * n + 2 * tq;
#pragma unroll
                    for (int j = 0; j < 2; j++) {
                        if (d + j < Dh && hA < H) oA[d + j] = fl ? fmaf(oA[d + j], b0, O[n][j]) : O[n][j];
                        if (d + j < Dh && hB < H) oB[d + j] = fl ? fmaf(oB[d + j], b1, O[n][2 + j]) : O[n][2 + j];
                        O[n][j] = O[n][2 + j] = 0.0f;
                    }
                }
                mf0 = m0, mf1 = m1, fl = true;
            }
        }

        /* out = (out e^(mf - m) + O) 2^-12 / (l + exp(sink - m)) */
        const float dA = hA < H && m0 != -INFINITY ? __fadd_rn(l0, expf(sink[hA] - m0)) : 0.0f;
        const float dB = hB < H && m1 != -INFINITY ? __fadd_rn(l1, expf(sink[hB] - m1)) : 0.0f;
        const float b0 = mf0 == -INFINITY ? 0.0f : expf(mf0 - m0), b1 = mf1 == -INFINITY ? 0.0f : expf(mf1 - m1);
#pragma unroll
        for (int n = 0; n < 32; n++) {
            const int d = 256 * hf + 8 * n + 2 * tq;
#pragma unroll
            for (int j = 0; j < 2; j++) {
                if (d + j >= Dh) continue;
                if (hA < H) {
                    const float o = fl ? fmaf(oA[d + j], b0, O[n][j]) : O[n][j];
                    oA[d + j] = dA > 0 ? __fdiv_rn(o * (1.0f / TC_PS), dA) : 0.0f;
                }
                if (hB < H) {
                    const float o = fl ? fmaf(oB[d + j], b1, O[n][2 + j]) : O[n][2 + j];
                    oB[d + j] = dB > 0 ? __fdiv_rn(o * (1.0f / TC_PS), dB) : 0.0f;
                }
            }
        }
    } else {
        for (int s0 = s_begin; s0 < s_end; s0 += spt) { /* the block's spans */
            const int s1 = min(s_end, s0 + spt);
            for (int s = s0; s < s1; s++) tile(s);
            if (s1 == s_end) break;
            /* the end of a span that is not the block's last (full mode): into the total, attn_kv8_combine's operations
             * (ak_coef / ak_fold1; a span without entries skipped); the total's O read back from out 8 n-steps of both
             * rows at a time (float2: d is even, so is Dh), enough loads in flight without spilling O's 128 registers */
            float ca[2], cb[2];
            bool act[2], had[2];
#pragma unroll
            for (int r = 0; r < 2; r++) { /* head rows gr (O[.][0..1]) and gr + 8 (O[.][2..3]) */
                const float m = r ? m1 : m0, l = r ? l1 : l0;
                float *ml = Tml + (warp * 16 + gr + 8 * r) * 2;
                const float M = ml[0], Lt = ml[1];
                __syncwarp(); /* every lane has read the quad's total before lane 4 gr rewrites it */
                act[r] = (r ? hB : hA) < H && m != -INFINITY;
                had[r] = M != -INFINITY;
                ca[r] = cb[r] = 0.0f;
                if (act[r]) {
                    float Mn;
                    ak_coef(M, m, Mn, ca[r], cb[r]);
                    if (tq == 0) ml[0] = Mn, ml[1] = ak_fold1(Lt, ca[r], l, cb[r]);
                }
            }
            float *orw[2] = {out + ((int64_t)t * H + hA) * Dh, out + ((int64_t)t * H + hB) * Dh};
#pragma unroll
            for (int n0 = 0; n0 < NO; n0 += 8) {
                float2 pv[2][8];
#pragma unroll
                for (int r = 0; r < 2; r++)
#pragma unroll
                    for (int k = 0; k < 8; k++) {
                        const int d = db + 8 * (n0 + k) + 2 * tq;
                        pv[r][k] = act[r] && had[r] && d < Dh ? *(const float2 *)(orw[r] + d) : make_float2(0.0f, 0.0f);
                    }
#pragma unroll
                for (int r = 0; r < 2; r++)
#pragma unroll
                    for (int k = 0; k < 8; k++) {
                        const int d = db + 8 * (n0 + k) + 2 * tq;
                        if (act[r] && d < Dh)
                            *(float2 *)(orw[r] + d) = make_float2(ak_fold1(pv[r][k].x, ca[r], O[n0 + k][2 * r], cb[r]),
                                                                  ak_fold1(pv[r][k].y, ca[r], O[n0 + k][2 * r + 1], cb[r]));
                    }
                asm volatile("" ::: "memory"); /* the next step's loads stay after these stores */
            }
            m0 = m1 = -INFINITY, l0 = l1 = 0.0f;
#pragma unroll
            for (int n = 0; n < NO; n++) O[n][0] = O[n][1] = O[n][2] = O[n][3] = 0.0f;
        }

        /* the block's last span */
        __syncthreads(); /* Rcs (a block without tiles passed no barrier since) */
#pragma unroll
        for (int r = 0; r < 2; r++) { /* head rows gr (O[.][0..1]) and gr + 8 (O[.][2..3]) */
            const float m = r ? m1 : m0, l = r ? l1 : l0;
            const int hh = r ? hB : hA;
            if (hh >= H) continue;
            float *orow = out + ((int64_t)t * H + hh) * Dh;
            if (!full) { /* the span's state, for ak_combine_launch */
                float *pp = part + (((int64_t)t * H + hh) * nspan + blockIdx.z) * ak_pst(Dh);
                if (db == 0 && tq == 0) pp[0] = m, pp[1] = l;
#pragma unroll
                for (int n = 0; n < NO; n++) {
                    const int d = db + 8 * n + 2 * tq;
                    if (d + 1 < Dh) *(float2 *)(pp + 4 + d) = make_float2(O[n][2 * r], O[n][2 * r + 1]);
                    else if (d < Dh) pp[4 + d] = O[n][2 * r];
                }
                continue;
            }
            /* into the total, then out = O 2^-12 / (L + exp(sink - M)) and the inverse RoPE (pairs d, d + 1) */
            const float *ml = Tml + (warp * 16 + gr + 8 * r) * 2;
            float M = ml[0], L = ml[1];
            const bool had = M != -INFINITY, v = m != -INFINITY;
            float a = 0.0f, b = 0.0f;
            if (v) {
                float Mn;
                ak_coef(M, m, Mn, a, b);
                L = ak_fold1(L, a, l, b);
                M = Mn;
            }
            const float den = ak_den(M, L, sink[hh]);
#pragma unroll
            for (int n = 0; n < NO; n++) {
                const int d = db + 8 * n + 2 * tq;
                if (d >= Dh) continue;
                float y[2];
#pragma unroll
                for (int j = 0; j < 2; j++) {
                    const float prev = had && d + j < Dh ? orow[d + j] : 0.0f;
                    y[j] = ak_fin1(v ? ak_fold1(prev, a, O[n][2 * r + j], b) : prev, den, 1.0f / TC_PS);
                }
                if (orope.freq && d >= nope) ak_unrot_cs(y[0], y[1], Rcs[d - nope], Rcs[d - nope + 1]);
                orow[d] = y[0];
                if (d + 1 < Dh) orow[d + 1] = y[1];
            }
        }
    }
}

extern "C" int dsv4_cuda_attn_tc_enabled(void) {
    static int on = -1;
    if (on < 0) on = dsv4_env_int("DSV4_CUDA_ATTN_TC", 1) != 0;
    return on;
}

extern "C" int dsv4_cuda_attn_tc_decode_takes(int H, int Dh, int R, int nidx) {
    static int on = -1, min = 0;
    if (on < 0) {
        on = dsv4_env_int("DSV4_CUDA_ATTN_TC_DECODE", 1) != 0;
        min = dsv4_env_int("DSV4_CUDA_ATTN_TC_DECODE_MIN", TC_DEC_MIN);
    }
    return on && nidx >= min && dsv4_cuda_attn_kv8_tc_fits(H, Dh, R);
}

/* decode: tiles per span asked for lists of nidx entries (DSV4_CUDA_ATTN_TC_SPT, default 2; lists under TC_DEC_SHORT
 * entries DSV4_CUDA_ATTN_TC_SPT_SHORT, default 1; read once). It changes bits, the same for every T: a list's length
 * is the layer's (its capacity), never the batch's. */
static int tc_dec_spt(int nidx) {
    static int spt = 0, sps = 0;
    if (!spt) {
        spt = dsv4_env_int("DSV4_CUDA_ATTN_TC_SPT", 2);
        if (spt < 1) spt = 1;
        sps = dsv4_env_int("DSV4_CUDA_ATTN_TC_SPT_SHORT", 1);
        if (sps < 1) sps = 1;
    }
    return nidx < TC_DEC_SHORT ? sps : spt;
}
/* tiles per span and spans for nidx entries, spt asked */
static void tc_spans(int nidx, int spt, int *spt_eff, int *nspan) {
    const int ns = (nidx + TC_N - 1) / TC_N, need = (ns + TC_MAXSPAN - 1) / TC_MAXSPAN;
    *spt_eff = spt > need ? spt : need;
    *nspan = (ns + *spt_eff - 1) / *spt_eff;
}
/* decode: 16 heads a block (4x the blocks, a quarter of the work a warp) when those blocks fit in one wave (two an
 * SM), else 64 (the rows' decode into shared memory is repeated by every block of a query: T 8, 640 entries 38.9 us
 * in 320 blocks of 16 heads against 33.9 in 80 of 64; T 1 18.2 against 31.2; RESULTS session 16). The same bits
 * either way. DSV4_CUDA_ATTN_TC_H16 (read once): 0 never, 1 always, else this rule. */
static int tc_h16(int T, int H, int Dh, int R, int nspan_launched) {
    static int env = -2;
    if (env == -2) env = dsv4_env_int("DSV4_CUDA_ATTN_TC_H16", -1);
    if (env == 0 || env == 1) return env;
    const int64_t blocks = (int64_t)T * nspan_launched * ((H + 15) / 16);
    return 2 * tc_smem(Dh, R, 16) <= (size_t)dsv4_cuda_dev.smem_optin && blocks <= 2 * (int64_t)dsv4_cuda_dev.sm_count;
}
static int tc_force_mode = -1;

extern "C" void dsv4_cuda_attn_kv8_tc_force(int mode) { tc_force_mode = mode >= 0 && mode <= 4 ? mode : -1; }

/* decode, query blocks of 64 heads (hi + lo; Dh 512 with 64 rope dims: V4's): the decode form's chains on warpgroup
 * MMA (the same bits; on by default since session 38: T 256, 128 entries 205 -> 193 us, batch 256 steps 0.993-0.996x on
 * an H100). DSV4_CUDA_ATTN_TC_WG=0 (read once) for mma.sync; dsv4_cuda_attn_kv8_tc_wg for tests. */
static int tc_wg = -1;
extern "C" void dsv4_cuda_attn_kv8_tc_wg(int on) { tc_wg = on == 0 || on == 1 ? on : -1; }
static int tc_wg_on(void) {
    static int env = -1;
    if (tc_wg >= 0) return tc_wg;
    if (env < 0) env = dsv4_env_int("DSV4_CUDA_ATTN_TC_WG", 1) != 0;
    return env;
}

extern "C" int dsv4_cuda_attn_kv8_tc_fits(int H, int Dh, int R) {
    return H > 0 && Dh <= TC_D && Dh > R && R >= 0 && R <= TC_LO && R % 2 == 0 && (Dh - R) % 64 == 0 &&
           Dh - R + TC_LO <= TC_D && tc_smem(Dh, R, TC_HB) <= (size_t)dsv4_cuda_dev.smem_optin;
}

/* enough for every list of up to nidx entries: the span count is not monotone in the length (a short list's spans
 * are of DSV4_CUDA_ATTN_TC_SPT_SHORT tiles; past 32 spans of spt tiles a span grows by a tile), so the largest over
 * the lengths up to nidx (the ends of every tile count: the span size changes only at tile boundaries) */
extern "C" size_t dsv4_cuda_attn_kv8_tc_scratch(int T, int H, int Dh, int nidx) {
    int spt, nspan = 0;
    for (int t = 1; (int64_t)TC_N * (t - 1) < nidx; t++) {
        const int ends[2] = {TC_N * (t - 1) + 1, TC_N * t < nidx ? TC_N * t : nidx};
        for (int k = 0; k < 2; k++) {
            int ns;
            tc_spans(ends[k], tc_dec_spt(ends[k]), &spt, &ns);
            if (ns > nspan) nspan = ns;
        }
    }
    if (nspan <= 1 || T <= 0 || H <= 0) return 0;
    return (size_t)(T < TC_PMAX_T ? T : TC_PMAX_T) * H * nspan * (size_t)ak_pst(Dh);
}

/* DEC: the decode form (spt tiles per span asked; partial: a block per span, scratch; HB heads a block), else the
 * prefill form */
template <bool DEC, int HB, bool HL = true, bool WGM = false>
static int tc_run(const float *q, int T, int H, int Dh, int R, const uint8_t *const *base, const float *kv2,
                  const int *idx, int nidx, const float *sink, float scale, const float *freq, const int *pos,
                  float *out, float *scratch, int spt, int partial, cudaStream_t st) {
    if (T < 0 || nidx < 0 || !dsv4_cuda_attn_kv8_tc_fits(H, Dh, R))
        return dsv4_cuda_fail("attn_kv8_tc: shape outside the path (T %d H %d Dh %d R %d nidx %d)", T, H, Dh, R, nidx);
    if (!T) return 0;
    if (nidx == 0) {
        if (cudaMemsetAsync(out, 0, sizeof(float) * (size_t)T * H * Dh, st) != cudaSuccess)
            return dsv4_cuda_fail("attn_kv8_tc: memset failed");
        return 0; /* zeros rotate to zeros */
    }
    const size_t smem = tc_smem(Dh, R, HB, WGM);
    static size_t raised = 0;
    if (smem > raised) {
        if (cudaFuncSetAttribute((const void *)attn_kv8_tc_kernel<DEC, HB, HL, WGM>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                 (int)smem) != cudaSuccess)
            return dsv4_cuda_fail("attn_kv8_tc: cannot raise shared memory to %zu bytes", smem);
        raised = smem;
    }
    int spe, nspan;
    tc_spans(nidx, spt, &spe, &nspan);
    if (nspan <= 1 || !DEC) partial = 0;
    if (partial && (!scratch || ((uintptr_t)scratch & 15)))
        return dsv4_cuda_fail("attn_kv8_tc: %d entries in %d spans need 16-byte aligned scratch", nidx, nspan);
    const int vec = Dh % 4 == 0 && !((uintptr_t)q & 15) && !((uintptr_t)kv2 & 15);
    const ak_rope ro = {freq, pos};
    dev_launch(attn_kv8_tc_kernel<DEC, HB, HL, WGM>, dim3(T, (H + HB - 1) / HB, partial ? nspan : 1), TC_NT, smem, st, q, H, Dh, R,
               base, kv2, idx, nidx, sink, scale, out, scratch, spe, nspan, vec, ro);
    if (dsv4_cuda_check_launch("attn_kv8_tc")) return -1;
    if (!partial) return 0;
    const int ovec = Dh % 4 == 0 && !((uintptr_t)out & 15);
    return ak_combine_launch(scratch, T, H, Dh, R, nspan, sink, 1.0f / TC_PS, out, ovec, ro, st);
}

/* Each form's precision: q, p and the rope dims as hi + lo f16 terms (1) or as one f16 term each (0: half the
 * products; f16 keeps 11 significant bits, more than the bf16 the official model computes attention in). Prefill
 * passes: one term by default since session 24 (DSV4_CUDA_ATTN_TC_HILO=1 for two; 8K prefill 0.953x); decode steps:
 * two by default (DSV4_CUDA_ATTN_TC_DEC_HILO=0 for one: ~1 % at batches 1-64, nothing at 256, and every fixture's
 * decode steps then leave the CPU engine's fp32 noise for bf16-level distances; bench/NOTES.md "Session 24"). Read
 * once; dsv4_cuda_attn_kv8_tc_hilo for tests. */
static int tc_hilo[2] = {-1, -1};
static int tc_hl(int dec) {
    if (tc_hilo[dec] < 0)
        tc_hilo[dec] = dsv4_env_int(dec ? "DSV4_CUDA_ATTN_TC_DEC_HILO" : "DSV4_CUDA_ATTN_TC_HILO", dec) != 0;
    return tc_hilo[dec];
}
extern "C" int dsv4_cuda_attn_kv8_tc_hilo(int dec, int on) {
    dec = dec != 0;
    if (on != -2) tc_hilo[dec] = on < 0 ? -1 : on != 0;
    return tc_hl(dec);
}

extern "C" int dsv4_cuda_attn_kv8_tc(const float *q, int T, int H, int Dh, int R, const uint8_t *const *base,
                                     const float *kv2, const int *idx, int nidx, const float *sink, float scale,
                                     float *out, void *stream) {
    if (tc_hl(0))
        return tc_run<false, TC_HB, true>(q, T, H, Dh, R, base, kv2, idx, nidx, sink, scale, NULL, NULL, out, NULL, TC_F, 0,
                                          DSV4_STREAM(stream));
    return tc_run<false, TC_HB, false>(q, T, H, Dh, R, base, kv2, idx, nidx, sink, scale, NULL, NULL, out, NULL, TC_F, 0,
                                       DSV4_STREAM(stream));
}

extern "C" int dsv4_cuda_attn_kv8_tc_dec(const float *q, int T, int H, int Dh, int R, const uint8_t *const *base,
                                         const float *kv2, const int *idx, int nidx, const float *sink, float scale,
                                         const float *freq, const int *pos, float *out, float *scratch, void *stream) {
    /* the launch shape changes no bit: a block per span up to TC_PMAX_T queries (fills the GPU), else per query; 16
     * or 64 heads a block (tc_h16); query blocks of 64 heads on warpgroup MMA (tc_wg_on; force mode 4) */
    const int fm = tc_force_mode;
    const int partial = fm >= 0 ? fm != 4 && !(fm & 1) && T <= TC_PMAX_T : T <= TC_PMAX_T;
    int spe, nspan;
    tc_spans(nidx, tc_dec_spt(nidx), &spe, &nspan);
    const int h16 = fm >= 0 ? fm == 2 || fm == 3 : tc_h16(T, H, Dh, R, partial && nspan > 1 ? nspan : 1);
    const int sp = tc_dec_spt(nidx);
    cudaStream_t st = DSV4_STREAM(stream);
    const int wgm = (fm == 4 || (fm < 0 && tc_wg_on())) && !h16 && !(partial && nspan > 1) && tc_hl(1) && Dh == TC_D && R == TC_LO &&
                    tc_smem(Dh, R, TC_HB, 1) <= (size_t)dsv4_cuda_dev.smem_optin;
    if (wgm)
        return tc_run<true, TC_HB, true, true>(q, T, H, Dh, R, base, kv2, idx, nidx, sink, scale, freq, pos, out, scratch, sp,
                                               partial, st);
    if (tc_hl(1))
        return h16 ? tc_run<true, 16, true>(q, T, H, Dh, R, base, kv2, idx, nidx, sink, scale, freq, pos, out, scratch, sp,
                                            partial, st)
                   : tc_run<true, TC_HB, true>(q, T, H, Dh, R, base, kv2, idx, nidx, sink, scale, freq, pos, out, scratch, sp,
                                               partial, st);
    return h16 ? tc_run<true, 16, false>(q, T, H, Dh, R, base, kv2, idx, nidx, sink, scale, freq, pos, out, scratch, sp,
                                         partial, st)
               : tc_run<true, TC_HB, false>(q, T, H, Dh, R, base, kv2, idx, nidx, sink, scale, freq, pos, out, scratch, sp,
                                            partial, st);
}
