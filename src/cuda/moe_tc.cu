/* moe_tc.cu - the routed experts' grouped GEMM on tensor cores (moe_tc.h), for FP8 (E8M0 block scales), MXFP4 and
 * NVFP4 experts: the body of dsv4_cuda_moe_experts (cuda_model.h) for the matrices it takes.
 *
 * Grid (row blocks, expert slots), 8 warps a block, blocks past *nact return: the launch shape depends only on
 * the shapes, T and K. A warp owns a pair of 16-row weight tiles (gate/up: the same 16 rows of w1 and of w3,
 * so the SwiGLU is fused; down: 32 rows of w2) and a column slice (the S slices of a block: units u = j*S + s of
 * the 128-column units); the expert's tokens are the mma's N. mma.sync m16n8k16 f16 x f16 -> fp32: the weight is
 * the A operand, decoded exactly in registers as in linear.cu's gemv_tc (linear_tc.cuh: e4m3 by the hardware
 * convert, e2m1 re-packed as e4m3, MXFP4 group scales relative to the unit's largest as an f16 power of two,
 * NVFP4 group scales folded in f16); x is staged in shared memory as 16-bit terms in the permuted order of the
 * fragments, with one power-of-two scale per (token, unit): FP8 act-quant codes (act_quant) or x / 2^e as two
 * f16 terms (or, 8-warp ring kernels, the e4m3 code bytes, converted when the fragments are read: the same f16).
 * Decode (FP4 formats): a cp.async ring of DEPTH units a warp in shared memory (4-5 stages: 3-4 units of weights in
 * flight a warp, counted by commit groups), 16 warps an SM: 4-warp blocks when the chunk's x fits four an SM (batch
 * 1: 384 blocks on 132 SMs, not 192 of 8 warps), else 8-warp blocks; their dependents launch when the work is done.
 * Prefill, MXFP4 / NVFP4 with S <= 2 (moe_pf2_kernel): 8 tile pairs a block, each warp holding the accumulators of every
 * slice (unit u adds into set u % S), a 6-stage cp.async pipeline of units (x codes and scales of the chunk's 64
 * tokens, shared, and each warp's weights), one barrier and one basic block for the S units of a step, the products on
 * wgmma m64nNk16 (A: the decoded weights in registers, B: the x codes in shared memory, staged by moe_quant in the
 * wgmma order; the same bits as the mma.sync chain: wgmma.cuh), DSV4_MOE_WG=0 on mma.sync; DSV4_MOE_PF=0 runs the
 * register kernel.
 * Prefill otherwise, FP8 and DSV4_MOE_TC_LEGACY: a lane keeps its weight loads of the next unit in registers while the
 * current one is computed (the scale bytes' loads, combined right away, made that wait for each unit: one latency a unit).
 * (Opt-in for comparisons, both measured slower: an L2 bulk prefetch of the units after those, and MXFP4 codes to
 * f16 with integer instructions, mt_e2m1x8_alu, checked against the e4m3-convert decode once on the device.)
 *
 * Scales without a second accumulator: a (row, token) accumulator holds the sum in the unit's scale P = weight
 * unit scale (E8M0 / MXFP4 unit max; 1 for NVFP4) x x scale, both powers of two; before the mma of the next
 * unit it is multiplied by P_prev / P_next (exact: a power of two), and at the end of the slice by the last P
 * (and the NVFP4 tensor scale). Slices are added in order 0..S-1 through shared memory. So every (row, token)
 * value goes through the same operations in the same order whatever other tokens share its expert, however
 * many there are, and which variant runs (decode: 8 or 16 tokens a chunk, x act-quantized by each block;
 * prefill: 64 tokens a chunk, x act-quantized once into scratch by moe_quant, staged with cp.async, double
 * buffered, or moe_pf2_kernel's pipeline with the slices' sums in one warp, added in the same order): the results are
 * bitwise batch invariant. S depends only on the matrix shape. */
#include <stdlib.h>

#include "linear_tc.cuh"
#include "moe_tc.h"
#include "wgmma.cuh"

#define MT_WARPS 8 /* warps a block of the register-buffer kernels (prefill, FP8, the legacy decode) */
#define MT_SB 4    /* (token, unit) items in flight per warp while staging x */
#define MT_PQW 4   /* units per staged window on the pre-quantized path; also the most column slices S */
#define MT_PQ_AVG 16 /* token-expert rows per expert (average) from which the pre-quantized 64-token path runs */
#define MT_PF 2      /* with DSV4_MOE_TC_PF: units of weights prefetched into L2 ahead of the register loads */
#define MT_RQ_T 16   /* ring kernels: from chunks of this many tokens on, x act-quantized once per row (moe_quant_kernel) */

/* a compile-time int as an argument (generic lambdas) */
template <int N> struct mt_int { static constexpr int value = N; };

/* V chunks of 16 bytes per row per 128-column unit, E elements per chunk */
template <int FMT> struct mt_fmt { static constexpr int V = 1, E = 32; }; /* MXFP4, NVFP4 */
template <> struct mt_fmt<DSV4_WF_FP8> { static constexpr int V = 2, E = 16; };

/* Slot of column i (0..127) of a unit in the staged x (as linear.cu's tc_slot): FP4 in tc_e2m1_perm order inside a
 * chunk, with (16-bit slots, XB = 2) the 16-byte halves of odd lane pairs swapped (conflict-free reads); FP8 as is.
 * XB = 1 (x held as e4m3 bytes): no swap (the token rows' 8-byte pad keeps the 8-byte reads conflict-free). */
/* moe_f8.cuh's x order: column 32 q + l of a unit (lane l of a warp's quant) at byte 32 q + mf8_pos(l): value i = l & 7 of
 * word l >> 3 goes to core matrix i & 1 (the wgmma B operand's two 16-byte rows of a k32 step), byte 4 (l >> 3) + (i >> 1) */
__device__ __forceinline__ int mf8_pos(int l) { return (l & 1) * 16 + (l >> 3) * 4 + ((l & 7) >> 1); }

template <int FMT, int XB = 2> __device__ __forceinline__ int mt_slot(int i) {
    if (FMT == DSV4_WF_MXFP4 || FMT == DSV4_WF_NVFP4) {
        const int ch = i >> 5, e = i & 31;
        const int q = (e & ~7) + tc_e2m1_slot(e & 7);
        return ch * 32 + (((q >> 3) ^ (XB == 2 ? (ch >> 1) & 1 : 0)) << 3) + (q & 7);
    }
    return i;
}

/* Position of column i (0..127) of a unit in the wgmma order of the staged x (moe_pf2_kernel on wgmma, MXFP4): k-step ks
 * (0..7) of 16 codes holds at index kk the code that the mma.sync fragments of mt_slot's order read at k-step ks,
 * index kk (b0: kk = 2c + e, b1: 8 + 2c + e), so each 8-code half is one 16-byte row of a wgmma core matrix. */
__device__ __forceinline__ int mt_wslot(int i) {
    const int p = mt_slot<DSV4_WF_MXFP4>(i), c = p >> 5, js = (p >> 3) & 3, k = (p >> 2) & 1, h = (p >> 1) & 1, e = p & 1;
    return (2 * (js ^ ((c >> 1) & 1)) + k) * 16 + 8 * h + 2 * c + e;
}

/* One (token, unit) of x held by a warp, 4 values per lane (columns q*32 + lane): XT = 1, the FP8 act quant (codes as
 * f16, exact; bit-identical to dsv4_act_quant_fp8: same amax floor, clamp and power-of-two scale, hardware RNE
 * convert); XT = 2, x / s as two f16 terms with s a power of two that puts the largest |x| in [2^14, 2^15). */
template <int XT> __device__ __forceinline__ float mt_quant(const float (&v)[4], uint16_t (&term)[4][XT], uint8_t *code = NULL) {
    float a = XT == 1 ? 1e-4f : 0.0f, s;
#pragma unroll
    for (int q = 0; q < 4; q++) a = fmaxf(a, fabsf(v[q]));
    a = warp_max(a);
    if (XT == 1) {
        s = dev_pow2_ceil(a * (1.0f / 448.0f));
        const float inv = 1.0f / s; /* exact: s is a power of two */
#pragma unroll
        for (int q = 0; q < 4; q++) {
            const float y = fminf(fmaxf(__fmul_rn(v[q], inv), -448.0f), 448.0f);
            const __nv_fp8_storage_t b = __nv_cvt_float_to_fp8(y, __NV_SATFINITE, __NV_E4M3);
            if (code) code[q] = b;
            else term[q][0] = __nv_cvt_fp8_to_halfraw(b, __NV_E4M3).x;
        }
    } else {
        int e = (int)((__float_as_uint(a) >> 23) & 0xff) - 14;
        e = e < 1 ? 1 : e;
        s = __uint_as_float((uint32_t)e << 23);
        const float inv = __uint_as_float((uint32_t)(254 - e) << 23);
#pragma unroll
        for (int q = 0; q < 4; q++) {
            const float y = __fmul_rn(v[q], inv);
            const __half h = __float2half_rn(y);
            term[q][0] = __half_as_ushort(h);
            term[q][XT - 1] = __half_as_ushort(__float2half_rn(y - __half2float(h)));
        }
    }
    return s;
}

/* 2^d as a float, d clamped to the normal range */
__device__ __forceinline__ float mt_pow2(int d) {
    d = d < -126 ? -126 : d > 127 ? 127 : d;
    return __int_as_float((d + 127) << 23);
}
/* one function for every kernel: the same instructions (no contraction chosen per call site) */
__device__ __noinline__ float mt_swiglu(float g, float u, float lim, float w) { return dev_swiglu(g, u, lim, w); }

/* biased exponent of a positive normal float */
__device__ __forceinline__ int mt_exp(float f) { return (__float_as_int(f) >> 23) & 0xff; }

/* Eight e2m1 codes of a word to four f16x2 holding the values times 2^-14, in tc_e2m1x8_f16x2's order (r0 = {e0, e2},
 * r1 = {e4, e6}, r2 = {e1, e3}, r3 = {e5, e7}) with integer instructions only (no conversion unit): nibble s|e1 e0|m
 * becomes the f16 s|0 0 0 e1 e0|m 0..0, i.e. 2^(e - 15) (1 + m/2) = e2m1 x 2^-14, the subnormal 0.5 x 2^-14 included. */
__device__ __forceinline__ void mt_e2m1x8_alu(uint32_t w, uint32_t (&r)[4]) {
    const uint32_t x01 = __byte_perm(w, 0u, 0x4140), x23 = __byte_perm(w, 0u, 0x4342); /* bytes 0, 1 / 2, 3 into the halves */
    r[0] = ((x01 << 9) & 0x0E000E00u) | ((x01 << 12) & 0x80008000u);
    r[1] = ((x23 << 9) & 0x0E000E00u) | ((x23 << 12) & 0x80008000u);
    r[2] = ((x01 << 5) & 0x0E000E00u) | ((x01 << 8) & 0x80008000u);
    r[3] = ((x23 << 5) & 0x0E000E00u) | ((x23 << 8) & 0x80008000u);
}
/* Two e4m3 of the low / high half of a word to f16x2: the instruction of tc_e4m3x2_f16x2, the high half read in place
 * (no shift) */
__device__ __forceinline__ uint32_t mt_e4m3x2_lo(uint32_t v) {
    uint32_t r;
    asm("{ .reg .b16 l, h; mov.b32 {l, h}, %1; cvt.rn.f16x2.e4m3x2 %0, l; }" : "=r"(r) : "r"(v));
    return r;
}
__device__ __forceinline__ uint32_t mt_e4m3x2_hi(uint32_t v) {
    uint32_t r;
    asm("{ .reg .b16 l, h; mov.b32 {l, h}, %1; cvt.rn.f16x2.e4m3x2 %0, h; }" : "=r"(r) : "r"(v));
    return r;
}
/* tc_e2m1x8_f16x2 (linear_tc.cuh) with the high halves converted in place: the same values */
__device__ __forceinline__ void mt_e2m1x8_f16x2(uint32_t w, uint32_t (&r)[4]) {
    const uint32_t lo = ((w & 0x07070707u) << 2) | ((w & 0x08080808u) << 4);
    const uint32_t hi = ((w >> 2) & 0x1C1C1C1Cu) | (w & 0x80808080u);
    r[0] = mt_e4m3x2_lo(lo), r[1] = mt_e4m3x2_hi(lo), r[2] = mt_e4m3x2_lo(hi), r[3] = mt_e4m3x2_hi(hi);
}
/* exponent offset of the FP4 group factor: the decoded e2m1 values carry 2^-6 (e4m3 convert) or 2^-14 (ALU) */
#define MT_F4OFF(DEC) ((DEC) ? 14 : 6)

/* A fragments of sub-step j of one chunk of one row: registers 2k / 2k+1 feed k-step k (as linear.cu's tc_decode).
 * DEC (MXFP4): the integer decode; the products with the group factor equal the convert path's bit for bit. IH: the
 * in-place high-half convert (the ring kernels; the register kernels keep tc_e2m1x8_f16x2). */
template <int FMT, int DEC, int IH = 0> __device__ __forceinline__ void mt_decode(const uint4 &q, int j, uint32_t f, uint32_t (&A)[4]) {
    const uint32_t wd[4] = {q.x, q.y, q.z, q.w};
    if (FMT == DSV4_WF_FP8) {
        A[0] = tc_e4m3x2_f16x2(wd[2 * j]), A[1] = tc_e4m3x2_f16x2(wd[2 * j] >> 16);
        A[2] = tc_e4m3x2_f16x2(wd[2 * j + 1]), A[3] = tc_e4m3x2_f16x2(wd[2 * j + 1] >> 16);
    } else {
        uint32_t r[4];
        if (DEC) mt_e2m1x8_alu(wd[j], r);
        else if (IH) mt_e2m1x8_f16x2(wd[j], r);
        else tc_e2m1x8_f16x2(wd[j], r);
#pragma unroll
        for (int i = 0; i < 4; i++) A[i] = tc_hmul2(r[i], f);
    }
}

/* Both MXFP4 decodes of every byte pair in every position, for group factors 2^0 .. 2^-30 of the unit's largest:
 * bad = 1 on any difference (then the kernels keep the convert path). */
__global__ void moe_tc_selftest(int *bad) {
    const uint32_t b = threadIdx.x, w = b | ((b ^ 0x5Au) << 8) | (((b * 7u + 3u) & 255u) << 16) | ((255u - b) << 24);
    int diff = 0;
    for (int d = 0; d <= 30; d++) {
        uint32_t r0[4], r1[4];
        tc_e2m1x8_f16x2(w, r0);
        mt_e2m1x8_alu(w, r1);
        const uint32_t f0 = tc_f16x2_pow2(6 - d), f1 = tc_f16x2_pow2(14 - d);
#pragma unroll
        for (int i = 0; i < 4; i++) diff |= tc_hmul2(r0[i], f0) != tc_hmul2(r1[i], f1);
    }
    if (diff) atomicOr(bad, 1);
}

__device__ __forceinline__ void mt_cp_wait_all() { asm volatile("cp.async.wait_all;" ::: "memory"); }
/* weights into the ring: 16 bytes read once (L2 only, 256-byte L2 fetch: the row's next units are wanted soon) */
__device__ __forceinline__ void mt_cp16s(unsigned sa, const void *g) {
    asm volatile("cp.async.cg.shared.global.L2::256B [%0], [%1], 16;" ::"r"(sa), "l"(g) : "memory");
}
/* scale words into the ring (4 or 8 bytes, cached: a row's scales serve the block's next units) */
template <int B> __device__ __forceinline__ void mt_cps(unsigned sa, const void *g) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], %2;" ::"r"(sa), "l"(g), "n"(B) : "memory");
}

/* One unit of a lane's weights: [tile][row g / g+8][chunk], and the scale bytes of tile t in sc[t] (MXFP4 / FP8:
 * byte m = row half m; NVFP4: the chunk's two e4m3 group scales, 16 bits per row half). */
template <int V> struct mt_buf {
    uint4 q[2][2][V];
    uint32_t sc[2];
    uint32_t scw[2][2]; /* ring: the scale word of row half m of tile t (MXFP4: the row's 4 group scales of the unit;
                         * NVFP4: the two 16-bit pairs of chunks 2 (c / 2), 2 (c / 2) + 1) */
};

/* The ring (decode kernels, FP4): per warp DEPTH stages of one unit each: the lane's weights, [t][m][lane] 16 bytes,
 * then the scale words, [g][t][m] (MXFP4: 4 bytes, the row's unit; NVFP4: 8 bytes, the row's unit), lane 4 g + c
 * copying those of (t, m) = (c / 2, c % 2). */
template <int FMT> struct mt_ring {
    static constexpr int SCB = FMT == DSV4_WF_NVFP4 ? 8 : 4, STAGE = 2048 + 32 * SCB;
};

struct mt_params {
    const dsv4_cuda_weight *WA, *WB; /* device [E]; WB: w3 (gate/up) */
    const float *x;                  /* fp32 rows: gate/up the MoE input [T, C] (by token), down h [slots, C] */
    const uint8_t *xq;               /* pre-quantized rows (row stride xq_ld bytes): per unit 128 f16 codes in slot order, then NU fp32 scales */
    int64_t xq_ld;
    dsv4_cuda_moe_plan p;
    float lim;
    float *out; /* gate/up: h [slots, R]; down: y [slots, R] */
    int R, C, NU, S, RT, NRP, W, ntok, tok, gx, iters;
    int pf; /* units of weights prefetched into L2 beyond the DEPTH in registers (0: none) */
    int x1;    /* moe_f8.cuh: a pass of one token (its x staged as one row) */
    int pre;   /* moe_f8.cuh, down: the plan is complete before the grid starts (dsv4_moe_tc_run's pre) */
    int csplit; /* moe_f8.cuh with x quantized per row: blocks a row tile's chunks are split over (1: one) */
    int sg;     /* moe_f8.cuh: the scale words 4 units at a time where they can be (x quantized per row, 8-token chunks) */
};

/* x staging for the kernels that act-quantize it themselves: items i = (token t, unit wu) = (i / nwu, i % nwu) of n, a
 * warp taking i0, i0 + step, ...: SB items' rows loaded (lane l: columns 32 q + l of the unit) before any is handed to
 * put(t, wu, v); rows of x by token (gate / up, through the plan's rows) or of h by slot (down), from slot off + c0 */
template <int SB, int GATEUP, typename F>
__device__ __forceinline__ void mt_stage_items(const mt_params &P, int off, int c0, int u0, int nwu, int n, int i0, int step, int lane,
                                               F &&put) {
    for (; i0 < n; i0 += step * SB) {
        float v[SB][4];
#pragma unroll
        for (int bb = 0; bb < SB; bb++) {
            const int i = i0 + bb * step, t = i / nwu, wu = i - t * nwu;
            const float *src = NULL;
            if (i < n) src = P.x + (int64_t)(GATEUP ? P.p.rows[off + c0 + t] : off + c0 + t) * P.C + (int64_t)(u0 + wu) * 128;
#pragma unroll
            for (int q = 0; q < 4; q++) v[bb][q] = src ? src[q * 32 + lane] : 0.0f;
        }
#pragma unroll
        for (int bb = 0; bb < SB; bb++) {
            const int i = i0 + bb * step, t = i / nwu;
            if (i >= n) break;
            put(t, i - t * nwu, v[bb]);
        }
    }
}

/* NW warps a block; RING 0: DEPTH units of weights in registers (prefill, FP8, DSV4_MOE_TC_LEGACY), 1: a cp.async ring
 * of DEPTH units a warp in shared memory (decode, FP4; 16 warps an SM); XB: bytes of a staged x code (1: e4m3). */
template <int FMT, int GATEUP, int XT, int NT, int PQ, int DEPTH, int DEC, int NW = MT_WARPS, int RING = 0, int XB = 2>
__global__ void __launch_bounds__(NW * 32, RING ? 16 / NW : (NT > 2 || FMT == DSV4_WF_FP8) ? 1 : 2)
    moe_tc_kernel(const __grid_constant__ mt_params P) {
    constexpr int V = mt_fmt<FMT>::V, E = mt_fmt<FMT>::E, NSUB = E / 8, NBUF = PQ ? 2 : 1;
    constexpr bool FP4 = FMT == DSV4_WF_MXFP4 || FMT == DSV4_WF_NVFP4;
    static_assert(!RING || (FP4 && !PQ && V == 1), "the ring holds FP4 decode units");
    static_assert(XB == 2 || (XT == 1 && !PQ), "e4m3 x: act-quantized decode only");
    extern __shared__ __align__(16) unsigned char mt_sm[];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, c = lane & 3;
    const int S = P.S, RT = P.RT, W = P.W, NU = P.NU, ntok = P.ntok, tok = P.tok, R = P.R, C = P.C;
    const int rt = warp / S, s = warp - rt * S;
    /* programmatic dependent launch: the next kernel may start launching (the ring kernels: only once their work is
     * done, else its waiting blocks take the SM slots that balance this grid: measured 10 us at batch 1); wait for
     * the plan and x */
    if (!RING) dev_pdl_trigger();
    dev_pdl_wait();
    const int ia = blockIdx.y;
    if (ia >= *P.p.nact) return;
    const int ex = P.p.act_e[ia], off = P.p.act_off[ia], cnt = P.p.act_cnt[ia];
    const dsv4_cuda_weight w0 = P.WA[ex], w1 = GATEUP ? P.WB[ex] : w0;
    const uint4 *wq[2] = {(const uint4 *)w0.data, (const uint4 *)w1.data};
    const uint8_t *wsc[2] = {w0.scale, w1.scale};
    const int64_t wss[2] = {w0.scale_stride, w1.scale_stride}, wr0[2] = {w0.row0, w1.row0}, rowq = C / E;
    const float cw[2] = {w0.scale2, w1.scale2};

    const size_t xsb = (size_t)XT * ntok * tok; /* slots (XB bytes each) of one x buffer: [XT][ntok][tok] */
    uint16_t *xs = (uint16_t *)mt_sm;
    unsigned char *xs8 = mt_sm;
    float *sxs = (float *)(mt_sm + (size_t)NBUF * xsb * XB); /* [NBUF][ntok][W] */
    const size_t red_off = ((size_t)NBUF * xsb * XB + (size_t)NBUF * ntok * W * 4 + 15) & ~(size_t)15;
    float4 *red = (float4 *)(mt_sm + red_off);
    /* the ring after the reduction space (mt_smem lays out the same) */
    unsigned char *ring = mt_sm + ((red_off + (S > 1 ? (size_t)(S - 1) * RT * 2 * NT * 32 * 16 : 0) + 127) & ~(size_t)127) +
                          (size_t)warp * DEPTH * mt_ring<FMT>::STAGE;
    const unsigned ring_sa = (unsigned)__cvta_generic_to_shared(ring);

    const int nsu = NU / S, JW = W / S, nch = (cnt + ntok - 1) / ntok, NWIN = (NU + W - 1) / W;
    const bool win2 = nsu <= 2 * JW; /* every unit's j / JW is 0 or 1 */
    const int total = P.iters * nch * nsu, nwin_tot = P.iters * nch * NWIN;

    /* unit j of the slice into b; with pfj < nsu also an L2 prefetch of unit pfj of the same rows (no registers held;
     * weights only, which no kernel writes): lane (g, c) takes row g + 8 (c & 1) of tile c / 2, its V * 64 bytes */
    auto load = [&](mt_buf<V> &b, int it, int j, int pfj) {
        const int tp = (it * P.gx + (int)blockIdx.x) * RT + rt, u = j * S + s;
        const bool act = tp < P.NRP;
        const uint4 *pfq = wq[0];
        b.sc[0] = b.sc[1] = 0;
#pragma unroll
        for (int t = 0; t < 2; t++)
#pragma unroll
            for (int m = 0; m < 2; m++) {
                int r = (GATEUP ? 16 * tp : 32 * tp + 16 * t) + g + 8 * m;
                r = r < R ? r : R - 1; /* rows past the end: re-read the last one, never stored */
                const int64_t Rs = wr0[t] + r;
                if (c == 2 * t + m) pfq = wq[t] + Rs * rowq;
#pragma unroll
                for (int v = 0; v < V; v++)
                    b.q[t][m][v] = act ? tc_ld_stream(wq[t] + Rs * rowq + (u * V + v) * 4 + c) : make_uint4(0, 0, 0, 0);
                if (act) {
                    if (FMT == DSV4_WF_MXFP4) b.sc[t] |= (uint32_t)__ldg(wsc[t] + Rs * wss[t] + u * 4 + c) << (8 * m);
                    else if (FMT == DSV4_WF_NVFP4)
                        b.sc[t] |= (uint32_t)__ldg((const uint16_t *)(wsc[t] + Rs * wss[t]) + u * 4 + c) << (16 * m);
                    else b.sc[t] |= (uint32_t)__ldg(wsc[t] + (Rs >> 7) * wss[t] + u) << (8 * m);
                }
            }
        if (act && pfj < nsu)
            asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(pfq + (pfj * S + s) * V * 4), "r"(V * 64));
    };

    /* x of tokens c0 .. c0+nt-1, units u0 .. u0+nwu-1, act-quantized here (decode path) */
    auto stage = [&](int c0, int nt, int u0, int nwu) {
        mt_stage_items<MT_SB, GATEUP>(P, off, c0, u0, nwu, nt * nwu, warp, NW, lane, [&](int t, int wu, const float(&v)[4]) {
            uint16_t term[4][XT];
            uint8_t code[4];
            const float sc = mt_quant<XT>(v, term, XB == 1 ? code : NULL);
            if (XB == 1) {
                unsigned char *dst = xs8 + (size_t)t * tok + wu * 128;
#pragma unroll
                for (int q = 0; q < 4; q++) dst[mt_slot<FMT, 1>(q * 32 + lane)] = code[q];
            } else {
                uint16_t *dst = xs + (size_t)t * tok + wu * 128;
#pragma unroll
                for (int q = 0; q < 4; q++) {
                    const int pos = mt_slot<FMT>(q * 32 + lane);
#pragma unroll
                    for (int xt = 0; xt < XT; xt++) dst[(size_t)xt * ntok * tok + pos] = term[q][xt];
                }
            }
            if (lane == 0) sxs[t * W + wu] = sc;
        });
    };

    /* ring kernels with P.xq (the chunk's x act-quantized once per row by moe_quant_kernel, WO = 0 for XB = 2, 2 for
     * XB = 1: the codes in this kernel's staged order, then the unit scales): the same bytes as stage() writes, copied
     * (8 bytes a piece for e4m3 codes, 16 for f16), four pieces a thread in flight */
    auto stage_q = [&](int c0, int nt, int u0, int nwu) {
        constexpr int PB = 8 * XB, NP = 128 * XB / PB; /* bytes a piece, pieces a (token, unit) */
        const int per = nwu * NP, n = nt * per;
        for (int i0 = threadIdx.x; i0 < n; i0 += 4 * NW * 32) {
            uint4 v[4];
#pragma unroll
            for (int k = 0; k < 4; k++) {
                const int i = i0 + k * NW * 32, t = i / per, r = i - t * per, wu = r / NP, pc = r - wu * NP;
                if (i < n) {
                    const int row = GATEUP ? P.p.rows[off + c0 + t] : off + c0 + t;
                    const uint8_t *src = P.xq + (int64_t)row * P.xq_ld + (int64_t)(u0 + wu) * 128 * XB + pc * PB;
                    if (XB == 1) {
                        const uint2 q = *(const uint2 *)src;
                        v[k] = make_uint4(q.x, q.y, 0, 0);
                    } else v[k] = *(const uint4 *)src;
                }
            }
#pragma unroll
            for (int k = 0; k < 4; k++) {
                const int i = i0 + k * NW * 32, t = i / per, r = i - t * per, wu = r / NP, pc = r - wu * NP;
                if (i >= n) break;
                unsigned char *dst = mt_sm + ((size_t)t * tok + (size_t)wu * 128) * XB + pc * PB;
                if (XB == 1) *(uint2 *)dst = make_uint2(v[k].x, v[k].y);
                else *(uint4 *)dst = v[k];
            }
        }
        for (int i = threadIdx.x; i < nt * nwu; i += NW * 32) {
            const int t = i / nwu, wu = i - t * nwu, row = GATEUP ? P.p.rows[off + c0 + t] : off + c0 + t;
            sxs[t * W + wu] = ((const float *)(P.xq + (int64_t)row * P.xq_ld + (int64_t)C * XB))[u0 + wu];
        }
    };

    /* pre-quantized path: window wn (of the sequence iteration x chunk x window) into buffer wn & 1, 16 bytes a copy */
    auto issue = [&](int wn) {
        const int wi = wn % NWIN, chk = (wn / NWIN) % nch, c0 = chk * ntok, nt = min(ntok, cnt - c0), u0 = wi * W;
        uint16_t *xb = xs + (size_t)(wn & 1) * xsb;
        float *sb = sxs + (size_t)(wn & 1) * ntok * W;
        const int per = W * 16 + W / 4; /* 16-byte pieces of a token: its codes, then its scales */
        for (int i = threadIdx.x; i < nt * per; i += NW * 32) {
            const int t = i / per, r = i - t * per;
            const int row = GATEUP ? P.p.rows[off + c0 + t] : off + c0 + t;
            const uint8_t *src = P.xq + (int64_t)row * P.xq_ld;
            if (r < W * 16) dev_cp16(xb + (size_t)t * tok + (r >> 4) * 128 + (r & 15) * 8, src + (int64_t)(u0 + (r >> 4)) * 256 + (r & 15) * 16);
            else dev_cp16(sb + t * W + (r - W * 16) * 4, src + 2 * (int64_t)C + (int64_t)(u0 + (r - W * 16) * 4) * 4);
        }
        dev_cp_commit();
    };

    float acc[2][NT][4];
    int ewp[2][2];
    float sxp[NT][2];
#pragma unroll
    for (int t = 0; t < 2; t++) {
#pragma unroll
        for (int m = 0; m < 2; m++) ewp[t][m] = 127;
#pragma unroll
        for (int n = 0; n < NT; n++)
#pragma unroll
            for (int k = 0; k < 4; k++) acc[t][n][k] = 0.0f;
    }
#pragma unroll
    for (int n = 0; n < NT; n++) sxp[n][0] = sxp[n][1] = 1.0f;
    int wc = -1; /* windows started */

    auto process = [&](const mt_buf<V> &b, int it, int chk, int j) {
        /* the unit's window j / JW: a compare when j < 2 JW (decode: batch 256's 16-token chunks come in two windows),
         * the division (~24 instructions a unit) only beyond */
        const int wi = NWIN == 1 ? 0 : win2 ? (int)(j >= JW) : j / JW;
        const int tp = (it * P.gx + (int)blockIdx.x) * RT + rt, u = j * S + s, wu = u - wi * W;
        const bool act = tp < P.NRP;
        const int c0 = chk * ntok, nt = min(ntok, cnt - c0), ntl = (nt + 7) >> 3;
        if (j == wi * JW) { /* a window of units starts (every warp of the block at once) */
            wc++;
            if (PQ) {
                mt_cp_wait_all(); /* this window's copies (issued one window ahead) */
                __syncthreads();  /* ... landed for every thread, and the other buffer is free */
                if (wc + 1 < nwin_tot) issue(wc + 1);
            } else {
                __syncthreads();
                if (RING && P.xq) stage_q(c0, nt, wi * W, min(W, NU - wi * W));
                else stage(c0, nt, wi * W, min(W, NU - wi * W));
                __syncthreads();
            }
        }
        const uint16_t *xb = xs + (size_t)(PQ ? (wc & 1) : 0) * xsb;
        const float *sb = sxs + (size_t)(PQ ? (wc & 1) : 0) * ntok * W;
        /* the unit's products; NTL n-tiles hold tokens, a compile-time count where it can be (NT <= 2: one basic block,
         * no branch per n-tile; tiles past ntl are neither used nor stored), else (NT > 2) the runtime ntl */
        auto unit = [&](auto ntl_c) {
            constexpr int NTL = decltype(ntl_c)::value;
            const int ntlv = NT > 2 ? ntl : NTL;
            int ew[2][2], kq[2][2];
            uint32_t fq[2][2][2];
            bool slow = false; /* ring, MXFP4: a group factor below the normal f16 range */
#pragma unroll
            for (int t = 0; t < 2; t++)
#pragma unroll
                for (int m = 0; m < 2; m++) {
                    if (FMT == DSV4_WF_MXFP4) {
                        int e, em;
                        if (RING) { /* the row's four group scales: the largest without shuffles */
                            const uint32_t w = b.scw[t][m];
                            e = (int)__byte_perm(w, 0u, 0x4440u + c);
                            em = max(max((int)__byte_perm(w, 0u, 0x4440u), (int)__byte_perm(w, 0u, 0x4441u)),
                                     max((int)__byte_perm(w, 0u, 0x4442u), (int)(w >> 24)));
                        } else {
                            e = (int)((b.sc[t] >> (8 * m)) & 0xffu);
                            em = max(e, __shfl_xor_sync(0xffffffffu, e, 1));
                            em = max(em, __shfl_xor_sync(0xffffffffu, em, 2));
                        }
                        const int k = e - em + MT_F4OFF(DEC);
                        kq[t][m] = k, slow |= k < -14;
                        /* ring: tc_f16x2_pow2(k) for k >= -14 (normal; the others below) */
                        fq[t][m][0] = fq[t][m][1] = RING ? (uint32_t)(k + 15) * 0x04000400u : tc_f16x2_pow2(k);
                        ew[t][m] = em;
                    } else if (FMT == DSV4_WF_NVFP4) {
                        const uint32_t sv = RING ? b.scw[t][m] >> (16 * (c & 1)) : b.sc[t] >> (16 * m);
                        const uint32_t f = tc_hmul2(tc_e4m3x2_f16x2(sv), 0x54005400u); /* x 64, exact */
                        fq[t][m][0] = (f & 0xffffu) * 0x10001u;
                        fq[t][m][1] = (f >> 16) * 0x10001u;
                        ew[t][m] = 127;
                    } else {
                        fq[t][m][0] = fq[t][m][1] = 0;
                        ew[t][m] = (int)((b.sc[t] >> (8 * m)) & 0xffu);
                    }
                }
            if (FMT == DSV4_WF_MXFP4 && RING && __any_sync(0xffffffffu, slow)) { /* rare: one branch for the warp */
#pragma unroll
                for (int t = 0; t < 2; t++)
#pragma unroll
                    for (int m = 0; m < 2; m++) fq[t][m][0] = fq[t][m][1] = tc_f16x2_pow2(kq[t][m]);
            }
            float sx[NTL][2];
#pragma unroll
            for (int n = 0; n < NTL; n++)
#pragma unroll
                for (int kk = 0; kk < 2; kk++) {
                    const int tk = 8 * n + 2 * c + kk;
                    sx[n][kk] = tk < nt ? sb[tk * W + wu] : 1.0f;
                }
            if (RING || j > 0) { /* the sums so far into this unit's scale (powers of two: exact; the ring kernels also
                                  * at j = 0, where every sum is +0: no branch) */
                float fr[2][2], fx[NTL][2];
#pragma unroll
                for (int t = 0; t < 2; t++)
#pragma unroll
                    for (int m = 0; m < 2; m++) fr[t][m] = mt_pow2(ewp[t][m] - ew[t][m]);
#pragma unroll
                for (int n = 0; n < NTL; n++)
#pragma unroll
                    for (int kk = 0; kk < 2; kk++) fx[n][kk] = mt_pow2(mt_exp(sxp[n][kk]) - mt_exp(sx[n][kk]));
#pragma unroll
                for (int n = 0; n < NT; n++) {
                    if (n >= ntlv) break;
#pragma unroll
                    for (int t = 0; t < 2; t++)
#pragma unroll
                        for (int k = 0; k < 4; k++) {
                            float a = acc[t][n][k];
                            if (FMT != DSV4_WF_NVFP4) a = __fmul_rn(a, fr[t][k >> 1]);
                            acc[t][n][k] = __fmul_rn(a, fx[n][k & 1]);
                        }
                }
            }
#pragma unroll
            for (int t = 0; t < 2; t++)
#pragma unroll
                for (int m = 0; m < 2; m++) ewp[t][m] = ew[t][m];
#pragma unroll
            for (int n = 0; n < NTL; n++) sxp[n][0] = sx[n][0], sxp[n][1] = sx[n][1];
#pragma unroll
            for (int v = 0; v < V; v++)
#pragma unroll
                for (int jj = 0; jj < NSUB; jj++) {
                    uint32_t A[2][2][4];
#pragma unroll
                    for (int t = 0; t < 2; t++)
#pragma unroll
                        for (int m = 0; m < 2; m++) mt_decode<FMT, DEC, RING>(b.q[t][m][v], jj, fq[t][m][jj >> 1], A[t][m]);
                    const int js = FP4 ? (jj ^ ((c >> 1) & 1)) : jj;
                    /* groups of up to 4 n-tiles: their x fragments first, then k-step 0 of every (tile, n-tile), then
                     * k-step 1 (the two mma of one accumulator are 2 x NG apart); per accumulator the order is k, xt */
                    constexpr int NG = NT <= 2 ? 1 : 4; /* decode sizes: one at a time (registers) */
#pragma unroll
                    for (int n0 = 0; n0 < NT; n0 += NG) {
                        if (n0 >= ntlv) break;
                        uint32_t B[NG][XT][4];
#pragma unroll
                        for (int n = 0; n < NG; n++) {
                            const int tk = 8 * (n0 + n) + g;
#pragma unroll
                            for (int xt = 0; xt < XT; xt++) {
                                if (XB == 1) { /* e4m3 codes to f16 as the staging of XB = 2 does: the same bits */
                                    /* tokens past nt: token nt - 1 again (staged); a token's values reach only its own
                                     * accumulator column, and those columns are never stored */
                                    const unsigned char *bp = xs8 + (size_t)(tk < nt ? tk : nt - 1) * tok + wu * 128 + (v * 4 + c) * E + jj * 8;
                                    const uint2 q = *(const uint2 *)bp;
                                    B[n][xt][0] = mt_e4m3x2_lo(q.x), B[n][xt][1] = mt_e4m3x2_hi(q.x);
                                    B[n][xt][2] = mt_e4m3x2_lo(q.y), B[n][xt][3] = mt_e4m3x2_hi(q.y);
                                } else if (RING) {
                                    /* tokens past nt: token nt - 1 again, as above */
                                    const uint16_t *bp = xb + ((size_t)xt * ntok + (tk < nt ? tk : nt - 1)) * tok + wu * 128 + (v * 4 + c) * E + js * 8;
                                    const uint4 q = *(const uint4 *)bp;
                                    B[n][xt][0] = q.x, B[n][xt][1] = q.y, B[n][xt][2] = q.z, B[n][xt][3] = q.w;
                                } else {
                                    const uint16_t *bp = xb + ((size_t)xt * ntok + tk) * tok + wu * 128 + (v * 4 + c) * E + js * 8;
                                    const uint4 q = tk < nt ? *(const uint4 *)bp : make_uint4(0, 0, 0, 0);
                                    B[n][xt][0] = q.x, B[n][xt][1] = q.y, B[n][xt][2] = q.z, B[n][xt][3] = q.w;
                                }
                            }
                        }
#pragma unroll
                        for (int k = 0; k < 2; k++)
#pragma unroll
                            for (int n = 0; n < NG; n++) {
                                if (n0 + n >= ntlv) break;
#pragma unroll
                                for (int t = 0; t < 2; t++)
#pragma unroll
                                    for (int xt = 0; xt < XT; xt++)
                                        tc_mma<0>(acc[t][n0 + n], A[t][0][2 * k], A[t][1][2 * k], A[t][0][2 * k + 1], A[t][1][2 * k + 1],
                                                  B[n][xt][2 * k], B[n][xt][2 * k + 1]);
                            }
                    }
                }
        };
        if (act) {
            if (NT == 1) unit(mt_int<1>());
            else if (NT > 2 || ntl == NT) unit(mt_int<NT>());
            else unit(mt_int<1>());
        }
        if (j != nsu - 1) return;
        /* end of the slice for this tile pair and chunk: out of the scale, add the slices in order, store */
        if (act) {
#pragma unroll
            for (int n = 0; n < NT; n++) {
                if (n >= ntl) break;
#pragma unroll
                for (int t = 0; t < 2; t++)
#pragma unroll
                    for (int k = 0; k < 4; k++) {
                        float a = acc[t][n][k];
                        if (FMT != DSV4_WF_NVFP4) a = __fmul_rn(a, dev_e8m0((uint8_t)ewp[t][k >> 1]));
                        a = __fmul_rn(a, sxp[n][k & 1]);
                        if (FMT == DSV4_WF_NVFP4) a = __fmul_rn(a, cw[t]);
                        acc[t][n][k] = a;
                    }
            }
        }
        if (S > 1) {
            if (s > 0 && act) {
                float4 *rp = red + (size_t)((s - 1) * RT + rt) * 2 * NT * 32;
#pragma unroll
                for (int n = 0; n < NT; n++) {
                    if (n >= ntl) break;
#pragma unroll
                    for (int t = 0; t < 2; t++) rp[(t * NT + n) * 32 + lane] = make_float4(acc[t][n][0], acc[t][n][1], acc[t][n][2], acc[t][n][3]);
                }
            }
            __syncthreads();
            if (s == 0 && act) {
                for (int s2 = 1; s2 < S; s2++) {
                    const float4 *rp = red + (size_t)((s2 - 1) * RT + rt) * 2 * NT * 32;
#pragma unroll
                    for (int n = 0; n < NT; n++) {
                        if (n >= ntl) break;
#pragma unroll
                        for (int t = 0; t < 2; t++) {
                            const float4 q = rp[(t * NT + n) * 32 + lane];
                            acc[t][n][0] = __fadd_rn(acc[t][n][0], q.x), acc[t][n][1] = __fadd_rn(acc[t][n][1], q.y);
                            acc[t][n][2] = __fadd_rn(acc[t][n][2], q.z), acc[t][n][3] = __fadd_rn(acc[t][n][3], q.w);
                        }
                    }
                }
            }
        }
        if (s == 0 && act) {
#pragma unroll
            for (int n = 0; n < NT; n++) {
                if (n >= ntl) break;
#pragma unroll
                for (int k = 0; k < 4; k++) {
                    const int tk = 8 * n + 2 * c + (k & 1);
                    if (tk >= nt) continue;
                    const int64_t slot = off + c0 + tk;
                    if (GATEUP) {
                        const int r = 16 * tp + g + 8 * (k >> 1);
                        if (r < R) P.out[slot * R + r] = mt_swiglu(acc[0][n][k], acc[1][n][k], P.lim, P.p.rw[slot]);
                    } else {
#pragma unroll
                        for (int t = 0; t < 2; t++) {
                            const int r = 32 * tp + 16 * t + g + 8 * (k >> 1);
                            if (r < R) P.out[slot * R + r] = acc[t][n][k];
                        }
                    }
                }
            }
        }
#pragma unroll
        for (int t = 0; t < 2; t++)
#pragma unroll
            for (int n = 0; n < NT; n++)
#pragma unroll
                for (int k = 0; k < 4; k++) acc[t][n][k] = 0.0f;
    };

    /* steps (iteration, chunk, unit of the slice); loads run DEPTH steps ahead of the compute */
    auto adv = [&](int &it, int &chk, int &j) {
        if (++j == nsu) {
            j = 0;
            if (++chk == nch) chk = 0, it++;
        }
    };
    int lit = 0, lchk = 0, lj = 0, pit = 0, pchk = 0, pj = 0;
    if (RING) {
        /* step (it, chk, j) into ring slot sl: lane 4 g + c copies its 16 bytes of each (t, m) and the scale word(s) of
         * row g of (t, m) = (c / 2, c % 2); tile pairs past the end copy nothing (process skips them) */
        /* one tile pair a warp (the decode grid covers every pair: P.iters == 1): the lane's row pointers once */
        constexpr int SCB = mt_ring<FMT>::SCB;
        const int tp = (int)blockIdx.x * RT + rt;
        const bool ract = tp < P.NRP;
        const unsigned char *rp[2][2], *rsp;
#pragma unroll
        for (int t = 0; t < 2; t++)
#pragma unroll
            for (int m = 0; m < 2; m++) {
                int r = (GATEUP ? 16 * tp : 32 * tp + 16 * t) + g + 8 * m;
                r = r < R ? r : R - 1; /* rows past the end: re-read the last one, never stored */
                rp[t][m] = (const unsigned char *)(wq[t] + (wr0[t] + r) * rowq + s * 4 + c);
            }
        {
            const int t = c >> 1, m = c & 1;
            int r = (GATEUP ? 16 * tp : 32 * tp + 16 * t) + g + 8 * m;
            r = r < R ? r : R - 1;
            rsp = (t ? wsc[1] : wsc[0]) + ((t ? wr0[1] : wr0[0]) + r) * (t ? wss[1] : wss[0]) + s * SCB;
        }
        /* step (chunk, unit j of the slice) into ring slot sl: lane 4 g + c copies its 16 bytes of each (t, m) and the
         * scale word(s) of row g of (t, m) = (c / 2, c % 2); tile pairs past the end copy nothing (process skips them) */
        auto rload = [&](int sl, int, int j) {
            if (!ract) return;
            const unsigned sa = ring_sa + (unsigned)(sl * mt_ring<FMT>::STAGE);
            const int64_t o = (int64_t)j * S;
#pragma unroll
            for (int t = 0; t < 2; t++)
#pragma unroll
                for (int m = 0; m < 2; m++) mt_cp16s(sa + (2 * t + m) * 512 + lane * 16, rp[t][m] + o * 64);
            if (FMT == DSV4_WF_MXFP4) mt_cps<4>(sa + 2048 + g * 16 + c * 4, rsp + o * SCB);
            else mt_cps<8>(sa + 2048 + g * 32 + c * 8, rsp + o * SCB);
        };
        auto fetch = [&](mt_buf<V> &b, int sl) {
            const unsigned char *st = ring + (size_t)sl * mt_ring<FMT>::STAGE;
#pragma unroll
            for (int t = 0; t < 2; t++)
#pragma unroll
                for (int m = 0; m < 2; m++) b.q[t][m][0] = *(const uint4 *)(st + (2 * t + m) * 512 + lane * 16);
            if (FMT == DSV4_WF_MXFP4) {
                const uint4 w = *(const uint4 *)(st + 2048 + g * 16);
                b.scw[0][0] = w.x, b.scw[0][1] = w.y, b.scw[1][0] = w.z, b.scw[1][1] = w.w;
            } else {
#pragma unroll
                for (int t = 0; t < 2; t++)
#pragma unroll
                    for (int m = 0; m < 2; m++) b.scw[t][m] = *(const uint32_t *)(st + 2048 + g * 32 + (2 * t + m) * 8 + (c >> 1) * 4);
            }
        };
        int sl = 0, sq = 0;
#pragma unroll
        for (int d = 0; d < DEPTH - 1; d++) {
            if (d < total) {
                rload(sl, lit, lj);
                adv(lit, lchk, lj);
            }
            dev_cp_commit();
            sl++;
        }
        for (int i = 0; i < total; i++) {
            __syncwarp(); /* every lane is past its reads of the slot refilled now (processed at step i - 1) */
            if (i + DEPTH - 1 < total) {
                rload(sl, lit, lj);
                adv(lit, lchk, lj);
            }
            dev_cp_commit();
            sl = sl == DEPTH - 1 ? 0 : sl + 1;
            dev_cp_wait<DEPTH - 1>(); /* step i's copies landed */
            __syncwarp();            /* ... for every lane (the scale words come from the row's lanes) */
            mt_buf<V> b;
            fetch(b, sq);
            sq = sq == DEPTH - 1 ? 0 : sq + 1;
            process(b, pit, pchk, pj);
            adv(pit, pchk, pj);
        }
        dev_pdl_trigger();
    } else {
        mt_buf<V> bf[DEPTH];
        /* the prefetch runs P.pf units ahead of the loads within a tile pair's slice (not across tile pairs or chunks) */
#pragma unroll
        for (int d = 0; d < DEPTH; d++) {
            load(bf[d], lit, lj, P.pf ? (d ? lj + P.pf : lj + DEPTH) : nsu);
            adv(lit, lchk, lj);
        }
        if (PQ) issue(0);
        for (int gs0 = 0; gs0 < total; gs0 += DEPTH) {
#pragma unroll
            for (int d = 0; d < DEPTH; d++) {
                if (gs0 + d >= total) break;
                process(bf[d], pit, pchk, pj);
                adv(pit, pchk, pj);
                load(bf[d], lit, lj, P.pf ? lj + P.pf : nsu);
                adv(lit, lchk, lj);
            }
        }
        if (PQ) mt_cp_wait_all();
    }
}

/* ---- prefill, MXFP4 and NVFP4 (moe_pf2_kernel): a cp.async pipeline of units ----
 * (NVFP4: a stage holds 8 E4M3 group scales a row a unit; the lane's two become f16 factors as in the ring kernels,
 * the unit scale is 1 and the tensor scale multiplies at the end, in the register kernel's order: the same bits)
 * 8 warps a block, one tile pair a warp (8 a block: 128 rows of h or 256 of y), the chunk's 64 tokens as n-tiles
 * (the register kernel's mma order and decode), and every column slice in each warp: S <= 2 accumulator sets, unit
 * u adding into set u % S, so the slices' sums meet in registers (added in order at the end, no reduction through
 * shared memory). A step is one unit: its x codes and scales (shared by the 8 warps) and each warp's 32 weight rows
 * with their scale words go into a stage of the ring by cp.async; the S units of one step of every set share one
 * barrier and one basic block (n-tiles a compile-time count, 4 / 6 / 8: no branch between the mma, so the compiler
 * interleaves decode, rescale and mma of both sets; a first version with a branch per n-tile split the mma into
 * ~30 blocks of 2 and ran 1.14x slower, bench/NOTES.md); the next steps' copies are issued after them, MP2_DEPTH - S
 * steps ahead. Steps run (tile-pair group, chunk, unit), so the weights of the next group or chunk are in flight
 * across the boundary. Token columns past the chunk's tokens read whatever the stage holds (never stored). Per
 * (row, token) the same operations in the same order as moe_tc_kernel: bitwise its results.
 * WG (the default): each warpgroup's 4 warps issue their units' products together as wgmma m64nNk16 (N = 8 x the
 * n-tiles) with the A fragments of mma.sync, k-step by k-step in the same order, into the same accumulators; the x
 * codes come in the wgmma order (mt_wslot: per k-step two 8-code halves, the core matrices' rows), a stage's x as
 * [16-byte piece][token] (MP_WXP bytes a piece). Every warp runs the units (a path ptxas sees as uniform: with the
 * idle-warp test in the branch it serialized the wgmma), idle warps on whatever their stage rows hold, never stored. */
#define MP_WARPS 8
#define MP_XSTR 144                          /* halves a staged token row: 128 codes + 16 pad (conflict-free reads) */
#define MP_XB (64 * MP_XSTR * 2)             /* x codes of a stage */
#define MP_WXP (64 * 16)                     /* wgmma order: bytes of one core-matrix column (16 bytes of 64 tokens) */
#define MP_WOFF (MP_XB + 512)                /* after them the 64 x scales and their 64 ratios (moe_quant), then the weights:
                                              * [warp][t][m][lane] 16 B */
#define MP_SOFF (MP_WOFF + MP_WARPS * 2048)  /* then the scale words: [warp][g][t][m] 4 B (MXFP4) / 8 B (NVFP4) */
/* bytes of a row's scales of a unit (MXFP4: 4 E8M0 group scales; NVFP4: 8 E4M3), a stage */
template <int FMT> struct mp_fmt {
    static constexpr int SCB = FMT == DSV4_WF_NVFP4 ? 8 : 4, STAGE = MP_SOFF + MP_WARPS * 32 * SCB;
};

#define MP2_DEPTH 6

template <int GATEUP, int SL, int WG, int FMT>
__global__ void __launch_bounds__(MP_WARPS * 32, 1) moe_pf2_kernel(const __grid_constant__ mt_params P) {
    constexpr int NT = 8, SCB = mp_fmt<FMT>::SCB, MP_STAGE = mp_fmt<FMT>::STAGE;
    constexpr bool NV = FMT == DSV4_WF_NVFP4;
    static_assert(MP2_DEPTH >= 2 * SL, "the steps of one iteration and the next ones in flight");
    extern __shared__ __align__(16) unsigned char mt_sm[];
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, c = lane & 3;
    dev_pdl_trigger();
    dev_pdl_wait();
    const int ia = blockIdx.y;
    if (ia >= *P.p.nact) return;
    const int ex = P.p.act_e[ia], off = P.p.act_off[ia], cnt = P.p.act_cnt[ia];
    const dsv4_cuda_weight w0 = P.WA[ex], w1 = GATEUP ? P.WB[ex] : w0;
    const int R = P.R, C = P.C, NU = P.NU;
    const int64_t rowq = C / 32;
    const int nch = (cnt + 63) >> 6, total = P.iters * nch * NU;
    const unsigned sm_sa = (unsigned)__cvta_generic_to_shared(mt_sm);

    /* loader: step (lit, lchk, lu) into a stage; row pointers cached per tile-pair group / chunk */
    int lit = 0, lchk = 0, lu = 0, wit = -1, xkey = -1;
    bool lact = false, xcode = false, xsc = false;
    const unsigned char *wrow[2][2] = {{NULL, NULL}, {NULL, NULL}}, *wsrow = NULL;
    const uint8_t *xrc = NULL, *xrs = NULL;
    auto lstep = [&](int slot) {
        const unsigned sa = sm_sa + (unsigned)(slot * MP_STAGE);
        if (lit != wit) {
            wit = lit;
            const int tp = (lit * P.gx + (int)blockIdx.x) * MP_WARPS + warp;
            lact = tp < P.NRP;
#pragma unroll
            for (int t = 0; t < 2; t++)
#pragma unroll
                for (int m = 0; m < 2; m++) {
                    int r = (GATEUP ? 16 * tp : 32 * tp + 16 * t) + g + 8 * m;
                    r = r < R ? r : R - 1; /* rows past the end: re-read the last one, never stored */
                    const dsv4_cuda_weight &w = t ? w1 : w0;
                    wrow[t][m] = (const unsigned char *)((const uint4 *)w.data + (w.row0 + r) * rowq + c);
                }
            const int t = c >> 1, m = c & 1;
            int r = (GATEUP ? 16 * tp : 32 * tp + 16 * t) + g + 8 * m;
            r = r < R ? r : R - 1;
            const dsv4_cuda_weight &w = t ? w1 : w0;
            wsrow = w.scale + (w.row0 + r) * w.scale_stride;
        }
        const int key = lit * nch + lchk;
        if (key != xkey) {
            xkey = key;
            const int c0 = lchk * 64, nt = min(64, cnt - c0), tc = tid >> 2;
            xcode = tc < nt, xsc = tid < nt;
            if (xcode) xrc = P.xq + (int64_t)(GATEUP ? P.p.rows[off + c0 + tc] : off + c0 + tc) * P.xq_ld + (tid & 3) * 64;
            if (xsc) xrs = P.xq + (int64_t)(GATEUP ? P.p.rows[off + c0 + tid] : off + c0 + tid) * P.xq_ld + 2 * (int64_t)C;
        }
        if (xcode && WG) { /* wgmma order: 16-byte piece p of the token's unit to row `token` of core matrix p */
            const unsigned d = sa + (unsigned)((tid >> 2) * 16 + (tid & 3) * 4 * MP_WXP);
#pragma unroll
            for (int q = 0; q < 4; q++) mt_cp16s(d + q * MP_WXP, xrc + (int64_t)lu * 256 + q * 16);
        } else if (xcode) {
            const unsigned d = sa + (unsigned)((tid >> 2) * MP_XSTR * 2 + (tid & 3) * 64);
#pragma unroll
            for (int q = 0; q < 4; q++) mt_cp16s(d + q * 16, xrc + (int64_t)lu * 256 + q * 16);
        }
        if (xsc) {
            mt_cps<4>(sa + MP_XB + tid * 4, xrs + lu * 4);
            mt_cps<4>(sa + MP_XB + 256 + tid * 4, xrs + (NU + lu) * 4);
        }
        if (lact) {
            const unsigned w = sa + MP_WOFF + warp * 2048 + lane * 16;
#pragma unroll
            for (int t = 0; t < 2; t++)
#pragma unroll
                for (int m = 0; m < 2; m++) mt_cp16s(w + (2 * t + m) * 512, wrow[t][m] + (int64_t)lu * 64);
            mt_cps<SCB>(sa + MP_SOFF + warp * 32 * SCB + g * 4 * SCB + c * SCB, wsrow + lu * SCB);
        }
        if (++lu == NU) {
            lu = 0;
            if (++lchk == nch) lchk = 0, lit++;
        }
    };

    float acc[SL][2][NT][4];
    int ewp[SL][2][2];
#pragma unroll
    for (int sl = 0; sl < SL; sl++)
#pragma unroll
        for (int t = 0; t < 2; t++) {
            ewp[sl][t][0] = ewp[sl][t][1] = 127;
#pragma unroll
            for (int n = 0; n < NT; n++)
#pragma unroll
                for (int k = 0; k < 4; k++) acc[sl][t][n][k] = 0.0f;
        }

    /* the next unit of a set from stage st into its accumulators; n-tiles 0 .. NTL - 1, NTL >= ntl a constant (no branch
     * between the mma). Token columns past nt read whatever the stage holds: an mma column depends only on its own
     * x column and scale, and those columns are never stored. */
    /* wgmma: the A registers of a set's unit, in use by the tensor cores until the set's group is waited for, at the end
     * of the set's unit (waiting only after the next set's scales and rescale made ptxas inject a wait of its own there:
     * 1.27x slower, bench/NOTES.md) */
    uint32_t Aw[4][2][2][4];
    auto wg_done = [&](int sl) {
        wg_wait<0>();
#pragma unroll
        for (int jj = 0; jj < 4; jj++)
#pragma unroll
            for (int t = 0; t < 2; t++)
#pragma unroll
                for (int m = 0; m < 2; m++)
#pragma unroll
                    for (int i = 0; i < 4; i++) wg_keep(Aw[jj][t][m][i]);
#pragma unroll
        for (int t = 0; t < 2; t++)
#pragma unroll
            for (int n = 0; n < NT; n++)
#pragma unroll
                for (int k = 0; k < 4; k++) wg_keep(acc[sl][t][n][k]);
    };
    auto body = [&](auto ntlc, int sl, const unsigned char *st) {
        float (&A)[2][NT][4] = acc[sl];
        int (&EW)[2][2] = ewp[sl];
        constexpr int NTL = decltype(ntlc)::value;
        uint4 q[2][2];
#pragma unroll
        for (int t = 0; t < 2; t++)
#pragma unroll
            for (int m = 0; m < 2; m++) q[t][m] = *(const uint4 *)(st + MP_WOFF + warp * 2048 + (2 * t + m) * 512 + lane * 16);
        int ew[2][2];
        uint32_t fq[2][2][2]; /* the group factors of k-steps 0-1 / 2-3 of the lane's chunk */
        if (NV) { /* as the ring kernels: the chunk's two E4M3 group scales x 64 (exact) in f16; unit scale 1 */
            const uint4 s0 = *(const uint4 *)(st + MP_SOFF + warp * 256 + g * 32), s1 = *(const uint4 *)(st + MP_SOFF + warp * 256 + g * 32 + 16);
            const uint32_t scw[2][2] = {{c >> 1 ? s0.y : s0.x, c >> 1 ? s0.w : s0.z}, {c >> 1 ? s1.y : s1.x, c >> 1 ? s1.w : s1.z}};
#pragma unroll
            for (int t = 0; t < 2; t++)
#pragma unroll
                for (int m = 0; m < 2; m++) {
                    const uint32_t f = tc_hmul2(tc_e4m3x2_f16x2(scw[t][m] >> (16 * (c & 1))), 0x54005400u);
                    fq[t][m][0] = (f & 0xffffu) * 0x10001u, fq[t][m][1] = (f >> 16) * 0x10001u;
                    ew[t][m] = 127;
                }
        } else {
            const uint4 sw = *(const uint4 *)(st + MP_SOFF + warp * 128 + g * 16);
            const uint32_t scw[2][2] = {{sw.x, sw.y}, {sw.z, sw.w}};
#pragma unroll
            for (int t = 0; t < 2; t++)
#pragma unroll
                for (int m = 0; m < 2; m++) { /* as the ring kernels: the row's four group scales, the largest */
                    const uint32_t w = scw[t][m];
                    const int e = (int)__byte_perm(w, 0u, 0x4440u + c);
                    const int em = max(max((int)__byte_perm(w, 0u, 0x4440u), (int)__byte_perm(w, 0u, 0x4441u)),
                                       max((int)__byte_perm(w, 0u, 0x4442u), (int)(w >> 24)));
                    /* the register kernel's (k + 15) * 0x04000400 where k >= -14 */
                    fq[t][m][0] = fq[t][m][1] = tc_f16x2_pow2(e - em + MT_F4OFF(0));
                    ew[t][m] = em;
                }
        }
        /* x: the ratio of the set's previous unit's scale to this one's per token, moe_quant's mt_pow2 of the exponent
         * difference (the register kernels compute the same from the scales) */
        const float *sxr = (const float *)(st + MP_XB + 256);
        { /* the sums so far into this unit's scale (powers of two: exact; +0 stays +0 at a set's first unit) */
            float fr[2][2], fx[NT][2];
#pragma unroll
            for (int t = 0; t < 2; t++)
#pragma unroll
                for (int m = 0; m < 2; m++) fr[t][m] = mt_pow2(EW[t][m] - ew[t][m]);
#pragma unroll
            for (int n = 0; n < NTL; n++) {
                const float2 v = *(const float2 *)(sxr + 8 * n + 2 * c);
                fx[n][0] = v.x, fx[n][1] = v.y;
            }
#pragma unroll
            for (int n = 0; n < NTL; n++)
#pragma unroll
                for (int t = 0; t < 2; t++)
#pragma unroll
                    for (int k = 0; k < 4; k++) A[t][n][k] = __fmul_rn(__fmul_rn(A[t][n][k], fr[t][k >> 1]), fx[n][k & 1]);
        }
#pragma unroll
        for (int t = 0; t < 2; t++) EW[t][0] = ew[t][0], EW[t][1] = ew[t][1];
        if (WG) { /* the warpgroup's 64 rows of each tile x the chunk's tokens: per accumulator the same k-steps in the
                   * same order as the mma.sync path below (wgmma.cuh: the same bits) */
            const unsigned xsa = (unsigned)__cvta_generic_to_shared(st);
#pragma unroll
            for (int jj = 0; jj < 4; jj++) {
#pragma unroll
                for (int t = 0; t < 2; t++)
#pragma unroll
                    for (int m = 0; m < 2; m++) mt_decode<FMT, 0, 1>(q[t][m], jj, fq[t][m][jj >> 1], Aw[jj][t][m]);
                wg_fence(); /* the rescaled accumulators and this k-step pair's A registers */
#pragma unroll
                for (int k = 0; k < 2; k++)
#pragma unroll
                    for (int t = 0; t < 2; t++) {
                        const uint32_t a[4] = {Aw[jj][t][0][2 * k], Aw[jj][t][1][2 * k], Aw[jj][t][0][2 * k + 1], Aw[jj][t][1][2 * k + 1]};
                        wg_mma_f16<NTL>(A[t], a, wg_desc(xsa + (unsigned)((2 * jj + k) * 2 * MP_WXP), MP_WXP, 128));
                    }
            }
            wg_commit();
            wg_done(sl);
            return;
        }
        const uint16_t *xb = (const uint16_t *)st;
#pragma unroll
        for (int jj = 0; jj < 4; jj++) {
            uint32_t Af[2][2][4];
#pragma unroll
            for (int t = 0; t < 2; t++)
#pragma unroll
                for (int m = 0; m < 2; m++) mt_decode<FMT, 0, 1>(q[t][m], jj, fq[t][m][jj >> 1], Af[t][m]);
            const int js = jj ^ ((c >> 1) & 1);
            /* as the register kernel: x fragments of 4 n-tiles, k-step 0 of every (tile, n-tile), then k-step 1 */
#pragma unroll
            for (int n0 = 0; n0 < NTL; n0 += 4) {
                uint32_t B[4][4];
#pragma unroll
                for (int n = 0; n < 4; n++) {
                    const uint4 v = n0 + n < NTL ? *(const uint4 *)(xb + (8 * (n0 + n) + g) * MP_XSTR + c * 32 + js * 8) : make_uint4(0, 0, 0, 0);
                    B[n][0] = v.x, B[n][1] = v.y, B[n][2] = v.z, B[n][3] = v.w;
                }
#pragma unroll
                for (int k = 0; k < 2; k++)
#pragma unroll
                    for (int n = 0; n < 4; n++) {
                        if (n0 + n >= NTL) break;
#pragma unroll
                        for (int t = 0; t < 2; t++)
                            tc_mma<0>(A[t][n0 + n], Af[t][0][2 * k], Af[t][1][2 * k], Af[t][0][2 * k + 1], Af[t][1][2 * k + 1],
                                      B[n][2 * k], B[n][2 * k + 1]);
                    }
            }
        }
    };

    /* one unit of every set (steps i0 .. i0 + SL - 1, stages sl0 ..), one basic block */
    auto units = [&](auto ntlc, int sl0) {
#pragma unroll
        for (int sl = 0; sl < SL; sl++) {
            const int sg = sl0 + sl < MP2_DEPTH ? sl0 + sl : sl0 + sl - MP2_DEPTH;
            body(ntlc, sl, mt_sm + (size_t)sg * MP_STAGE);
        }
    };
    /* prologue: steps 0 .. MP2_DEPTH - SL - 1 in flight (one commit group a step, empty ones included) */
#pragma unroll
    for (int d = 0; d < MP2_DEPTH - SL; d++) {
        if (d < total) lstep(d);
        dev_cp_commit();
    }
    int it = 0, chk = 0, sl0 = 0; /* sl0: stage of step i0 */
    for (int i0 = 0; i0 < total; i0 += SL) {
        const int tp = (it * P.gx + (int)blockIdx.x) * MP_WARPS + warp, c0 = chk * 64, nt = min(64, cnt - c0), ntl = (nt + 7) >> 3;
        const bool act = tp < P.NRP;
        const int u0 = i0 - (it * nch + chk) * NU; /* unit of set 0 */
        dev_cp_wait<MP2_DEPTH - 2 * SL>(); /* steps i0 .. i0 + SL - 1: this thread's copies landed */
        if (WG) wg_fence_proxy();          /* ... also for the tensor cores' reads */
        __syncthreads();                 /* ... every thread's; and every warp is done with the previous steps' stages */
        /* wgmma: every warp (the 4 of a warpgroup together, on a path the compiler sees as uniform; rows of idle warps
         * hold whatever the stage holds and are never stored) */
        const bool run = WG || act;
        if (run && ntl > 6) units(mt_int<8>(), sl0);
        else if (run && ntl > 4) units(mt_int<6>(), sl0);
        else if (run) units(mt_int<4>(), sl0);
        /* then steps i0 + MP2_DEPTH - SL .. into the previous steps' stages */
        const int ls0 = sl0 >= SL ? sl0 - SL : sl0 + MP2_DEPTH - SL;
#pragma unroll
        for (int sl = 0; sl < SL; sl++) {
            if (i0 + sl + MP2_DEPTH - SL < total) lstep(ls0 + sl < MP2_DEPTH ? ls0 + sl : ls0 + sl - MP2_DEPTH);
            dev_cp_commit();
        }
        const int sc0 = sl0; /* the stages of this step: the sets' last units at the chunk's end (refilled only after the
                              * next barrier) */
        sl0 = sl0 + SL < MP2_DEPTH ? sl0 + SL : sl0 + SL - MP2_DEPTH;
        if (u0 + SL < NU) continue;
        /* end of the chunk for this tile pair: each set out of its scale, the sets added in order, store */
        if (act) {
#pragma unroll
            for (int sl = 0; sl < SL; sl++) {
                const int sg = sc0 + sl < MP2_DEPTH ? sc0 + sl : sc0 + sl - MP2_DEPTH;
                const float *sxs = (const float *)(mt_sm + (size_t)sg * MP_STAGE + MP_XB); /* the unit's x scales */
#pragma unroll
                for (int n = 0; n < NT; n++) {
                    if (n >= ntl) break;
                    const float2 sv = *(const float2 *)(sxs + 8 * n + 2 * c);
#pragma unroll
                    for (int t = 0; t < 2; t++)
#pragma unroll
                        for (int k = 0; k < 4; k++) {
                            const float sxp = k & 1 ? sv.y : sv.x;
                            float a = __fmul_rn(__fmul_rn(acc[sl][t][n][k], dev_e8m0((uint8_t)ewp[sl][t][k >> 1])), sxp);
                            if (NV) a = __fmul_rn(a, t ? w1.scale2 : w0.scale2); /* the tensor scale (the ring's order) */
                            acc[sl][t][n][k] = a;
                        }
                }
            }
#pragma unroll
            for (int sl = 1; sl < SL; sl++)
#pragma unroll
                for (int n = 0; n < NT; n++) {
                    if (n >= ntl) break;
#pragma unroll
                    for (int t = 0; t < 2; t++)
#pragma unroll
                        for (int k = 0; k < 4; k++) acc[0][t][n][k] = __fadd_rn(acc[0][t][n][k], acc[sl][t][n][k]);
                }
#pragma unroll
            for (int n = 0; n < NT; n++) {
                if (n >= ntl) break;
#pragma unroll
                for (int k = 0; k < 4; k++) {
                    const int tk = 8 * n + 2 * c + (k & 1);
                    if (tk >= nt) continue;
                    const int64_t slot = off + c0 + tk;
                    if (GATEUP) {
                        const int r = 16 * tp + g + 8 * (k >> 1);
                        if (r < R) P.out[slot * R + r] = mt_swiglu(acc[0][0][n][k], acc[0][1][n][k], P.lim, P.p.rw[slot]);
                    } else {
#pragma unroll
                        for (int t = 0; t < 2; t++) {
                            const int r = 32 * tp + 16 * t + g + 8 * (k >> 1);
                            if (r < R) P.out[slot * R + r] = acc[0][t][n][k];
                        }
                    }
                }
            }
        }
#pragma unroll
        for (int sl = 0; sl < SL; sl++)
#pragma unroll
            for (int t = 0; t < 2; t++)
#pragma unroll
                for (int n = 0; n < NT; n++)
#pragma unroll
                    for (int k = 0; k < 4; k++) acc[sl][t][n][k] = 0.0f;
        if (++chk == nch) chk = 0, it++;
    }
    mt_cp_wait_all();
}

/* mma.sync m16n8k16 f16 -> f32 issue rate alone (dsv4_moe_tc_mma_rate): NA independent accumulators a warp */
template <int NA> __global__ void __launch_bounds__(256) moe_mma_rate_kernel(float *out, int iters) {
    float acc[NA][4];
#pragma unroll
    for (int j = 0; j < NA; j++) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.0f;
    const uint32_t a = 0x00010001u * (threadIdx.x & 1), b = 0x00010001u;
    for (int i = 0; i < iters; i++)
#pragma unroll
        for (int j = 0; j < NA; j++) tc_mma<0>(acc[j], a, a, a, a, b, b);
    float sum = 0.0f;
#pragma unroll
    for (int j = 0; j < NA; j++) sum += acc[j][0] + acc[j][1] + acc[j][2] + acc[j][3];
    if (sum == 1.0f) out[0] = sum; /* never: keeps the loop */
}

/* The act quant of rows [rows, C] into the pre-quantized layout (WO: the codes of a unit in mt_wslot's order), one warp
 * a row, units in order. dst may be src (h):
 * a unit's codes overwrite floats of unit u / 2 <= u, already read by the whole warp (__syncwarp), and the scales
 * (after the codes) are written once the row is read. S > 0 (moe_pf2_kernel, S column slices): after the NU scales NU
 * floats 2^(e(u - S) - e(u)) of their exponents (mt_pow2, as the register kernels' rescale computes it), 1 for u < S. */
template <int FMT, int WO>
__global__ void __launch_bounds__(256) moe_quant_kernel(const float *src, int64_t sld, uint8_t *dst, int64_t dld, int rows, int C, int S) {
    dev_pdl_trigger();
    dev_pdl_wait();
    const int lane = threadIdx.x & 31, row = blockIdx.x * 8 + (threadIdx.x >> 5), NU = C / 128;
    if (row >= rows) return;
    const float *sr = src + (int64_t)row * sld;
    uint8_t *dr = dst + (int64_t)row * dld;
    float keep0 = 0.0f, keep1 = 0.0f;
    for (int u = 0; u < NU; u++) {
        float v[4];
#pragma unroll
        for (int q = 0; q < 4; q++) v[q] = sr[u * 128 + q * 32 + lane];
        __syncwarp();
        uint16_t term[4][1];
        uint8_t code[4];
        const float sc = mt_quant<1>(v, term, WO >= 2 ? code : NULL);
        if (WO == 2) { /* e4m3 code bytes in the order of the ring kernels' staged x (XB = 1) */
#pragma unroll
            for (int q = 0; q < 4; q++) dr[(int64_t)u * 128 + mt_slot<FMT, 1>(q * 32 + lane)] = code[q];
        } else if (WO == 3) { /* e4m3 codes in moe_f8.cuh's order: per 32-column group its two core-matrix rows (mf8_pos) */
#pragma unroll
            for (int q = 0; q < 4; q++) dr[(int64_t)u * 128 + q * 32 + mf8_pos(lane)] = code[q];
        } else {
#pragma unroll
            for (int q = 0; q < 4; q++) *(uint16_t *)(dr + (int64_t)u * 256 + 2 * (WO ? mt_wslot(q * 32 + lane) : mt_slot<FMT>(q * 32 + lane))) = term[q][0];
        }
        if (u == lane) keep0 = sc;
        if (u == lane + 32) keep1 = sc;
    }
    __syncwarp();
    float *ds = (float *)(dr + (WO >= 2 ? 1 : 2) * (int64_t)C);
    if (lane < NU) ds[lane] = keep0;
    if (lane + 32 < NU) ds[lane + 32] = keep1;
    if (S > 0) { /* then the ratios 2^(e(u - S) - e(u)) (moe_pf2_kernel's rescale of set u % S; 1 at a set's first unit) */
        const float p0 = __shfl_sync(0xffffffffu, keep0, (lane - S) & 31), p1 = __shfl_sync(0xffffffffu, keep1, (lane - S) & 31),
                    p1b = __shfl_sync(0xffffffffu, keep0, (lane + 32 - S) & 31);
        if (lane < NU) ds[NU + lane] = lane >= S ? mt_pow2(mt_exp(p0) - mt_exp(keep0)) : 1.0f;
        if (lane + 32 < NU) ds[NU + lane + 32] = mt_pow2(mt_exp(lane >= S ? p1 : p1b) - mt_exp(keep1));
    }
}

/* ---- host ---- */

int dsv4_moe_tc_fits(const dsv4_cuda_weight *w) {
    if (w->fmt != DSV4_WF_MXFP4 && w->fmt != DSV4_WF_NVFP4 && !(w->fmt == DSV4_WF_FP8 && !w->scale_f32)) return 0;
    if (w->rows < 1 || w->cols < 128 || w->cols % 128 || ((uintptr_t)w->data & 15)) return 0;
    if (w->act_bf16 && !w->act_quant) return 0; /* BF16 activations: the CUDA-core kernel rounds x / h to bf16 */
    /* the ring copies a row's scales of a unit as one word (MXFP4: 4 bytes, NVFP4: 8) */
    if (w->fmt == DSV4_WF_NVFP4 && ((w->scale_stride & 7) || ((uintptr_t)w->scale & 7))) return 0;
    if (w->fmt == DSV4_WF_MXFP4 && ((w->scale_stride & 3) || ((uintptr_t)w->scale & 3))) return 0;
    return 1;
}

double dsv4_moe_tc_mma_rate(int na, int blocks_per_sm) {
    int dev = 0, nsm = 0;
    cudaGetDevice(&dev);
    if (cudaDeviceGetAttribute(&nsm, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess) return -1.0;
    float *d = NULL;
    if (cudaMalloc((void **)&d, sizeof(float)) != cudaSuccess) return -1.0;
    const int iters = 4096, grid = nsm * blocks_per_sm;
    void (*fn)(float *, int) = na == 8 ? moe_mma_rate_kernel<8> : moe_mma_rate_kernel<16>;
    cudaEvent_t e0, e1;
    cudaEventCreate(&e0), cudaEventCreate(&e1);
    fn<<<grid, 256>>>(d, 16);
    cudaEventRecord(e0, 0);
    fn<<<grid, 256>>>(d, iters);
    cudaEventRecord(e1, 0);
    cudaEventSynchronize(e1);
    float ms = 0.0f;
    cudaEventElapsedTime(&ms, e0, e1);
    cudaEventDestroy(e0), cudaEventDestroy(e1);
    cudaFree(d);
    if (cudaGetLastError() != cudaSuccess || ms <= 0.0f) return -1.0;
    return (double)grid * 8 * iters * na * 4096.0 / (ms * 1e-3) / 1e12;
}

#include "moe_f8.cuh"
#include "moe_bf16.cuh"
#include "moe_f8p.cuh"

typedef void (*mt_fn)(const mt_params);

template <int FMT, int G, int DEC> static mt_fn mt_pick_f(int xt, int nt, int pq) {
    if (pq) return moe_tc_kernel<FMT, G, 1, 8, 1, 2, DEC>;
    if (xt == 1) return nt == 1 ? moe_tc_kernel<FMT, G, 1, 1, 0, 2, DEC> : moe_tc_kernel<FMT, G, 1, 2, 0, 2, DEC>;
    return moe_tc_kernel<FMT, G, 2, 2, 0, 2, DEC>;
}
/* the ring kernels (decode, FP4): 4 warps a block with 5 stages and f16 x, or 8 warps with 4 stages and x as e4m3
 * codes when act-quantized (dsv4_moe_tc_run picks) */
#define MT_RING4 5
#define MT_RING8 4
template <int FMT, int G> static mt_fn mt_pick_ring(int xt, int nt, int nw) {
    if (xt == 1) {
        if (nt == 1) return nw == 4 ? moe_tc_kernel<FMT, G, 1, 1, 0, MT_RING4, 0, 4, 1, 2> : moe_tc_kernel<FMT, G, 1, 1, 0, MT_RING8, 0, 8, 1, 1>;
        return nw == 4 ? moe_tc_kernel<FMT, G, 1, 2, 0, MT_RING4, 0, 4, 1, 2> : moe_tc_kernel<FMT, G, 1, 2, 0, MT_RING8, 0, 8, 1, 1>;
    }
    return nw == 4 ? moe_tc_kernel<FMT, G, 2, 2, 0, MT_RING4, 0, 4, 1, 2> : moe_tc_kernel<FMT, G, 2, 2, 0, MT_RING8, 0, 8, 1, 2>;
}
template <int G> static mt_fn mt_pick(int fmt, int xt, int nt, int pq, int alu, int nw) {
    if (nw) return fmt == DSV4_WF_MXFP4 ? mt_pick_ring<DSV4_WF_MXFP4, G>(xt, nt, nw) : mt_pick_ring<DSV4_WF_NVFP4, G>(xt, nt, nw);
    switch (fmt) {
    case DSV4_WF_FP8: return mt_pick_f<DSV4_WF_FP8, G, 0>(xt, nt, pq);
    case DSV4_WF_MXFP4: return alu ? mt_pick_f<DSV4_WF_MXFP4, G, 1>(xt, nt, pq) : mt_pick_f<DSV4_WF_MXFP4, G, 0>(xt, nt, pq);
    default: return mt_pick_f<DSV4_WF_NVFP4, G, 0>(xt, nt, pq);
    }
}

/* MXFP4 integer decode (DSV4_MOE_TC_ALU): -1 not tested yet, 0 failed the self-test (convert path), 1 usable */
static int mt_alu = -1;
static int mt_mode; /* dsv4_moe_tc_mode */

void dsv4_moe_tc_mode(int mode) { mt_mode = mode; }

int dsv4_moe_tc_selftest(void) {
    if (mt_alu >= 0) return 0;
    int *d = NULL, bad = 1;
    if (cudaMalloc((void **)&d, sizeof(int)) != cudaSuccess) {
        cudaGetLastError();
        return dsv4_cuda_fail("moe_experts: self-test buffer");
    }
    cudaError_t e = cudaMemset(d, 0, sizeof(int));
    if (e == cudaSuccess) {
        moe_tc_selftest<<<1, 256>>>(d);
        e = cudaGetLastError();
    }
    if (e == cudaSuccess) e = cudaMemcpy(&bad, d, sizeof(int), cudaMemcpyDeviceToHost);
    cudaFree(d);
    if (e != cudaSuccess) {
        cudaGetLastError();
        return dsv4_cuda_fail("moe_experts: self-test: %s", cudaGetErrorString(e));
    }
    mt_alu = !bad;
    return 0;
}

/* the kernel's layout: x slots (xb bytes each), x scales, the slices' reduction, then (ring > 0: bytes a warp) the ring */
static size_t mt_smem(int xt, int nbuf, int ntok, int tok, int W, int S, int RT, int NT, int xb = 2, size_t ring = 0) {
    size_t b = (size_t)nbuf * xt * ntok * tok * xb + (size_t)nbuf * ntok * W * 4;
    b = (b + 15) & ~(size_t)15;
    if (S > 1) b += (size_t)(S - 1) * RT * 2 * NT * 32 * 16;
    if (ring) b = ((b + 127) & ~(size_t)127) + (size_t)(RT * S) * ring;
    return b;
}

/* largest dynamic shared memory set per kernel (cudaFuncSetAttribute once per size increase) */
static struct {
    const void *fn;
    size_t smem;
} mt_attr[128];
static int mt_nattr;
/* carve: the ring kernels want the most shared memory an SM has (several blocks of ~50-110 KB) */
static int mt_set_smem(const void *fn, size_t smem, int carve) {
    int i = 0;
    while (i < mt_nattr && mt_attr[i].fn != fn) i++;
    if (i == mt_nattr && carve && cudaFuncSetAttribute(fn, cudaFuncAttributePreferredSharedMemoryCarveout, 100) != cudaSuccess)
        cudaGetLastError(); /* a hint only */
    if (i == mt_nattr && mt_nattr < 128) mt_attr[mt_nattr++].fn = fn, mt_attr[i].smem = 48 * 1024;
    if (smem <= 48 * 1024 || (i < mt_nattr && mt_attr[i].smem >= smem)) return 0;
    if (cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem) != cudaSuccess)
        return dsv4_cuda_fail("moe_experts: cannot raise shared memory to %zu bytes", smem);
    if (i < 128) mt_attr[i].smem = smem;
    return 0;
}
static int mt_sm_smem; /* shared memory of an SM (bytes) */

static int mt_no_pdl = -1; /* 1: launch without programmatic dependent launch (refused once, or DSV4_MOE_NO_PDL=1) */
static int mp_off = -1;    /* DSV4_MOE_PF=0: 1, the MXFP4 prefill on the register kernel */
static int mp_wg = -1;     /* DSV4_MOE_WG=0: 0, moe_pf2_kernel on mma.sync rather than wgmma */
static int mt_rq = -1;     /* DSV4_MOE_RQ=0: 0, the ring kernels act-quantize x in every block (no moe_quant launch) */
static int mt_f8 = -1;     /* DSV4_MOE_F8=0: MXFP4 with act quant on the f16 kernels instead of moe_f8.cuh's (default since session 20) */
static int mf8_gp = -1;    /* DSV4_MOE_F8_PIPE=0: 0, its wgmmas one group at a time (the same bits) */
static int mf8_sl;         /* DSV4_MOE_F8_SL=1|2|4: its column slices instead of the shape's (experiments) */
static int mf8_rq = 1;     /* DSV4_MOE_F8_RQ=0: its blocks act-quantize x themselves at every batch */
static int mf8_ntmax = 8;  /* DSV4_MOE_F8_NTMAX=1|2|4: its chunks at most 8 x this many tokens (measurements) */
static int mf8_ntmin = 1;  /* DSV4_MOE_F8_NTMIN=2|4|8: with x quantized once per row, chunks of at least 8 x this many tokens */
/* DSV4_MOE_F8_ST_GU=4|5|6, DSV4_MOE_F8_ST_DN=4|6|8: the weight ring's depth for 8-token chunks (-1, the default: down 8
 * units with x quantized per row, i.e. 16+ tokens, else 4; session 39: gate / up at 5 was slower than at 4 in the step) */
static int mf8_st_gu = -1, mf8_st_dn = -1;
/* DSV4_MOE_F8_CSPLIT=1..4: with x quantized per row and 8-token chunks, a row tile's chunks split over that many blocks
 * (-1, the default: 2) */
static int mf8_csplit = -1, mf8_csplit_dn = -1; /* (DSV4_MOE_F8_CSPLIT_DN: the down projection's, -1: 2) */
static int mf8_sg = 1; /* DSV4_MOE_F8_SG=0: the scale words a unit at a time in every variant (measurements) */
/* DSV4_MOE_F8_D2=0: with x quantized per row and 8-token chunks, the down projection on one 64-row tile a warpgroup
 * instead of two (moe_f8.cuh's GATEUP 2, a 4-unit ring: the default since session 43, batch 256 0.976x, 64 0.987x on an
 * H100); mf8_d2_force: tests */
static int mf8_d2 = 1, mf8_d2_force = -1, mf8_d2_n;
static void mf8_env(void) {
    mf8_gp = dsv4_env_int("DSV4_MOE_F8_PIPE", 1) != 0, mf8_sl = dsv4_env_int("DSV4_MOE_F8_SL", 0);
    mf8_rq = dsv4_env_int("DSV4_MOE_F8_RQ", 1) != 0, mf8_ntmax = dsv4_env_int("DSV4_MOE_F8_NTMAX", 8);
    mf8_ntmin = dsv4_env_int("DSV4_MOE_F8_NTMIN", 1), mf8_st_gu = dsv4_env_int("DSV4_MOE_F8_ST_GU", -1);
    mf8_st_dn = dsv4_env_int("DSV4_MOE_F8_ST_DN", -1), mf8_csplit = dsv4_env_int("DSV4_MOE_F8_CSPLIT", -1);
    mf8_csplit_dn = dsv4_env_int("DSV4_MOE_F8_CSPLIT_DN", mf8_csplit);
    mf8_sg = dsv4_env_int("DSV4_MOE_F8_SG", 1) != 0;
    mf8_d2 = dsv4_env_int("DSV4_MOE_F8_D2", 1) != 0;
}
extern "C" void dsv4_cuda_moe_f8_d2(int on) { mf8_d2_force = on == 0 || on == 1 ? on : -1; }
extern "C" int dsv4_cuda_moe_f8_d2_count(void) { return mf8_d2_n; }
extern "C" void dsv4_cuda_moe_f8_force(int st_gu, int st_dn, int csplit, int sg) {
    mf8_env();
    if (st_gu == -2) return; /* the environment's (or the defaults) */
    mf8_st_gu = st_gu, mf8_st_dn = st_dn, mf8_csplit = mf8_csplit_dn = csplit, mf8_sg = sg != 0;
}
template <int GATEUP, int NT, int XR, int GP, int ST = MF8_STAGES> static mt_fn mf8_pick_s(int sl) {
    return sl == 4 ? mf8_kernel<GATEUP, NT, 4, XR, GP, ST> : sl == 2 ? mf8_kernel<GATEUP, NT, 2, XR, GP, ST> : mf8_kernel<GATEUP, NT, 1, XR, GP, ST>;
}
/* 8-token chunks with their groups in flight: the ring's depth st (gate / up 4, 5 or 6 units, down 4, 6 or 8; else 4) */
template <int GATEUP, int XR> static mt_fn mf8_pick_st(int sl, int st) {
    if constexpr (GATEUP) return st == 6 ? mf8_pick_s<1, 1, XR, 4, 6>(sl) : st == 5 ? mf8_pick_s<1, 1, XR, 4, 5>(sl) : mf8_pick_s<1, 1, XR, 4>(sl);
    else return st == 8 ? mf8_pick_s<0, 1, XR, 4, 8>(sl) : st == 6 ? mf8_pick_s<0, 1, XR, 4, 6>(sl) : mf8_pick_s<0, 1, XR, 4>(sl);
}
/* groups in flight: 4 (8-, 16-token chunks), 2 (32: the registers); pipe 0: 1 */
template <int GATEUP> static mt_fn mf8_pick(int nt, int sl, int xr, int pipe, int st) {
    if (!xr) return pipe ? mf8_pick_st<GATEUP, 0>(sl, st) : mf8_pick_s<GATEUP, 1, 0, 1>(sl);
    if (nt == 8) return mf8_pick_s<GATEUP, 8, 1, 1>(sl); /* (one group at a time: the registers) */
    if (nt == 4) return pipe ? mf8_pick_s<GATEUP, 4, 1, 2>(sl) : mf8_pick_s<GATEUP, 4, 1, 1>(sl);
    if (nt == 2) return pipe ? mf8_pick_s<GATEUP, 2, 1, 4>(sl) : mf8_pick_s<GATEUP, 2, 1, 1>(sl);
    return pipe ? mf8_pick_st<GATEUP, 1>(sl, st) : mf8_pick_s<GATEUP, 1, 1, 1>(sl);
}
/* the ring's depth of mf8_pick (st) for 8-token chunks with their groups in flight, else MF8_STAGES */
static int mf8_depth(int gateup, int nt, int pipe, int st) {
    if (nt != 1 || !pipe) return MF8_STAGES;
    return gateup ? (st == 5 || st == 6 ? st : MF8_STAGES) : (st == 6 || st == 8 ? st : MF8_STAGES);
}
static int mt_nt1 = 2;     /* DSV4_MOE_NT1_AVG: 8-token decode chunks while experts average at most this many tokens (0: only T <= 8) */

/* nw warps a block; ring: a ring kernel (carve-out hint) */
template <typename F, typename... A>
static int mt_launch(F fn, dim3 grid, int nw, int ring, size_t smem, cudaStream_t st, const char *what, A... args) {
    if (mt_no_pdl < 0) {
        const char *e = getenv("DSV4_MOE_NO_PDL");
        mt_no_pdl = e && *e && *e != '0';
    }
    if (mt_set_smem((const void *)fn, smem, ring)) return -1;
    cudaLaunchConfig_t cfg = {};
    cudaLaunchAttribute at;
    at.id = cudaLaunchAttributeProgrammaticStreamSerialization;
    at.val.programmaticStreamSerializationAllowed = 1;
    cfg.gridDim = grid;
    cfg.blockDim = dim3(nw * 32);
    cfg.dynamicSmemBytes = smem;
    cfg.stream = st;
    cfg.attrs = &at;
    cfg.numAttrs = mt_no_pdl || (mt_mode & DSV4_MOE_TC_NO_PDL) ? 0 : 1;
    cudaError_t e = cudaLaunchKernelEx(&cfg, fn, args...);
    if (e != cudaSuccess && cfg.numAttrs) { /* no programmatic dependent launch here: plain stream order */
        cudaGetLastError();
        mt_no_pdl = 1;
        cfg.numAttrs = 0;
        e = cudaLaunchKernelEx(&cfg, fn, args...);
    }
    if (e != cudaSuccess) {
        cudaGetLastError();
        return dsv4_cuda_fail("%s: launch: %s", what, cudaGetErrorString(e));
    }
    return dsv4_cuda_check_launch(what);
}

typedef void (*mq_fn)(const float *, int64_t, uint8_t *, int64_t, int, int, int);
/* wo: 0 f16 codes in mt_slot order (the register kernels, the XB = 2 ring kernels), 1 the wgmma order (moe_pf2_kernel),
 * 2 e4m3 code bytes in the XB = 1 ring kernels' order, 3 e4m3 code bytes in moe_f8.cuh's order */
static mq_fn mq_pick(int fmt, int wo) {
    if (wo == 3) return moe_quant_kernel<DSV4_WF_MXFP4, 3>;
    if (wo == 2) return moe_quant_kernel<DSV4_WF_MXFP4, 2>; /* NVFP4: MXFP4's order */
    if (wo) return moe_quant_kernel<DSV4_WF_MXFP4, 1>;
    return fmt == DSV4_WF_FP8 ? moe_quant_kernel<DSV4_WF_FP8, 0> : moe_quant_kernel<DSV4_WF_MXFP4, 0>; /* NVFP4: MXFP4's order */
}

template <int FMT> static mt_fn mp_pick(int gateup, int S, int wg) {
    if (wg) return gateup ? (S == 2 ? moe_pf2_kernel<1, 2, 1, FMT> : moe_pf2_kernel<1, 1, 1, FMT>)
                          : (S == 2 ? moe_pf2_kernel<0, 2, 1, FMT> : moe_pf2_kernel<0, 1, 1, FMT>);
    return gateup ? (S == 2 ? moe_pf2_kernel<1, 2, 0, FMT> : moe_pf2_kernel<1, 1, 0, FMT>)
                  : (S == 2 ? moe_pf2_kernel<0, 2, 0, FMT> : moe_pf2_kernel<0, 1, 0, FMT>);
}

int dsv4_moe_tc_run(int gateup, int fmt, int aq, const dsv4_cuda_weight *WA, const dsv4_cuda_weight *WB, int R, int C, int E,
                    const float *x, int T, int K, int maxslots, const dsv4_cuda_moe_plan *p, float lim, float *out,
                    float *scratch, int pre, cudaStream_t st) {
    const int NU = C / 128, NRP = gateup ? (R + 15) / 16 : (R + 31) / 32, xt = aq ? 1 : 2;
    /* column slices from the shape only: enough (tile pair, slice) warps per expert to fill the GPU at batch 1 */
    int S = 1;
    while (S < MT_PQW && NU % (2 * S) == 0 && NRP * S < 256) S *= 2;
    int RT = MT_WARPS / S, pad = fmt == DSV4_WF_FP8 ? 8 : 16; /* pad: conflict-free fragment reads */
    const int pqw = MT_PQW;
    int pq = aq && NU % pqw == 0 && NU <= 64 && (int64_t)T * K >= (int64_t)MT_PQ_AVG * E;
    if (pq && mt_smem(1, 2, 64, pqw * 128 + pad, pqw, S, RT, 8) > (size_t)dsv4_cuda_dev.smem_optin) pq = 0;
    if (mp_off < 0) {
        const char *e = getenv("DSV4_MOE_PF"), *w = getenv("DSV4_MOE_WG");
        mp_off = e && *e == '0';
        mp_wg = !(w && *w == '0');
        const char *q = getenv("DSV4_MOE_RQ");
        mt_rq = !(q && *q == '0');
        const char *n1 = getenv("DSV4_MOE_NT1_AVG");
        if (n1 && *n1) mt_nt1 = atoi(n1);
    }
    /* decode and prefill on FP8 tensor cores (the default; DSV4_MOE_F8=0: the f16 kernels, other bits) */
    if (mt_f8 < 0) mt_f8 = dsv4_env_int("DSV4_MOE_F8", 1) != 0;
    const int f16_only = mt_mode & (DSV4_MOE_TC_LEGACY | DSV4_MOE_TC_ALU | DSV4_MOE_TC_PF | DSV4_MOE_TC_PF2 | DSV4_MOE_TC_NO_PDL);
    if (((mt_f8 && !f16_only) || (mt_mode & DSV4_MOE_TC_F8)) && fmt == DSV4_WF_MXFP4 && aq && R % 64 == 0) {
        /* FP8 tensor cores (moe_f8.cuh) at every batch: column slices from the shape; fewer than MF8_RQ_T tokens: x
         * quantized by the blocks, 8-token chunks; else x act-quantized once per row (into the scratch for gate/up, in
         * place for h) and chunks of 8, 16, 32 or 64 tokens by the experts' average count */
        if (mf8_gp < 0) mf8_env();
        int sl = mf8_slices(R, NU);
        if ((mf8_sl == 1 || mf8_sl == 2 || mf8_sl == 4) && NU % mf8_sl == 0) sl = mf8_sl; /* experiments: not batch invariant across values */
        /* (also below MF8_RQ_T tokens when a chunk's whole x would leave one block an SM: Pro's 7,168 columns) */
        const int x1 = T == 1, xr = (T >= MF8_RQ_T || mf8_smem(1, NU, gateup ? 2 : 1, sl, 0, x1) > 110 * 1024) && mf8_rq && (gateup ? scratch != NULL : 1);
        const int64_t avg8 = (int64_t)T * K * 8 / E; /* 8 x the average tokens an expert */
        int nt = !xr ? 1 : avg8 <= 64 ? 1 : avg8 <= 128 ? 2 : avg8 <= 256 ? 4 : 8;
        if (xr && nt < mf8_ntmin && (mf8_ntmin == 2 || mf8_ntmin == 4 || mf8_ntmin == 8)) nt = mf8_ntmin;
        if (nt > mf8_ntmax) nt = mf8_ntmax;
        while (nt > 1 && mf8_smem(nt, NU, gateup ? 2 : 1, sl, xr, 0) > (size_t)dsv4_cuda_dev.smem_optin) nt /= 2; /* (SL 4's rings) */
        const int sts = gateup ? mf8_st_gu : mf8_st_dn;
        int dep = mf8_depth(gateup, nt, mf8_gp, sts >= 0 ? sts : !xr || gateup ? MF8_STAGES : 8);
        if (mf8_smem(nt, NU, gateup ? 2 : 1, sl, xr, x1 && !xr, dep) > (size_t)dsv4_cuda_dev.smem_optin) dep = MF8_STAGES;
        const size_t fs = mf8_smem(nt, NU, gateup ? 2 : 1, sl, xr, x1 && !xr, dep);
        const int csv = gateup ? mf8_csplit : mf8_csplit_dn;
        const int cs = !xr || nt != 1 ? 1 : csv < 0 ? 2 : csv >= 2 && csv <= 4 ? csv : 1;
        /* the down projection on two row tiles a warpgroup (8-token chunks, x quantized per row, a 4-unit ring) */
        const size_t fs2 = mf8_smem(1, NU, 2, sl, 1, 0, MF8_STAGES);
        const int d2 = !gateup && xr && nt == 1 && mf8_gp && R % 128 == 0 && (mf8_d2_force >= 0 ? mf8_d2_force : mf8_d2) &&
                       fs2 <= (size_t)dsv4_cuda_dev.smem_optin;
        const size_t fsk = d2 ? fs2 : fs;
        if (fs <= (size_t)dsv4_cuda_dev.smem_optin) { /* (else the f16 kernels: a shape no model has) */
            mf8_d2_n += d2; /* (counted where the launch is) */
            mt_params fp;
            memset(&fp, 0, sizeof fp);
            fp.WA = WA, fp.WB = WB, fp.x = x, fp.p = *p, fp.lim = lim, fp.out = out, fp.R = R, fp.C = C, fp.NU = NU, fp.x1 = x1 && !xr;
            if (xr) { /* x act-quantized once per row (the same codes and scales as the kernels' own quant) */
                const int rows = gateup ? T : T * K;
                const int64_t ld = gateup ? (((int64_t)C + 4 * NU + 15) & ~(int64_t)15) : (int64_t)4 * C;
                uint8_t *dst = gateup ? (uint8_t *)scratch : (uint8_t *)x;
                if (mt_launch(mq_pick(fmt, 3), dim3((rows + 7) / 8), 8, 0, 0, st, "moe_experts (act quant, fp8)", x, (int64_t)C, dst, ld, rows, C, 0))
                    return -1;
                fp.xq = dst, fp.xq_ld = ld;
            }
            const mt_fn fn = gateup ? mf8_pick<1>(nt, sl, xr, mf8_gp, dep) : d2 ? mf8_pick_s<2, 1, 1, 4>(sl) : mf8_pick<0>(nt, sl, xr, mf8_gp, dep);
            fp.pre = !gateup && pre;
            fp.csplit = cs;
            fp.sg = mf8_sg;
            if (mt_launch(fn, dim3(R / (d2 ? 128 : 64) * cs, maxslots), 4 * sl, 1, fsk, st, gateup ? "moe_experts (gate/up, fp8)" : "moe_experts (down, fp8)", fp))
                return -1;
            return gateup; /* (an FP8 gate / up: its grid lets the next start only at its end) */
        }
    }
    /* pf: the FP4 prefill on moe_pf2_kernel (the register kernel with DSV4_MOE_PF=0 or the comparison modes) */
    const size_t mp_smem = (size_t)MP2_DEPTH * (fmt == DSV4_WF_NVFP4 ? mp_fmt<DSV4_WF_NVFP4>::STAGE : mp_fmt<DSV4_WF_MXFP4>::STAGE);
    const int pf = pq && (fmt == DSV4_WF_MXFP4 || fmt == DSV4_WF_NVFP4) && S <= 2 && mp_off != 1 &&
                   !(mt_mode & (DSV4_MOE_TC_LEGACY | DSV4_MOE_TC_ALU | DSV4_MOE_TC_PF)) && mp_smem <= (size_t)dsv4_cuda_dev.smem_optin;
    const int wg = pf && mp_wg && !(mt_mode & DSV4_MOE_TC_PF2); /* ... on wgmma (x codes in its order) */
    /* 8-token chunks (NT 1) up to 8 tokens, and with act quant while experts average at most mt_nt1 tokens (a chunk's x
     * in one window of the 8-warp ring; an expert with more tokens takes more chunks, its weights read again), else 16 */
    const int NT = pq ? 8 : xt == 1 && (T <= 8 || (int64_t)T * K <= (int64_t)mt_nt1 * E) ? 1 : 2, ntok = pq ? 64 : (T < 8 * NT ? T : 8 * NT);
    int W = pq ? pqw : NU, nw = 0, xb = 2; /* nw: warps a block of a ring kernel (0: the register-buffer kernels) */
    size_t ring = 0, smem;
    if (!mt_sm_smem) {
        int v = 0, dev = 0;
        cudaGetDevice(&dev);
        if (cudaDeviceGetAttribute(&v, cudaDevAttrMaxSharedMemoryPerMultiprocessor, dev) != cudaSuccess || v <= 0) cudaGetLastError(), v = 228 * 1024;
        mt_sm_smem = v;
    }
    if (!pq && (fmt == DSV4_WF_MXFP4 || fmt == DSV4_WF_NVFP4) && !(mt_mode & (DSV4_MOE_TC_LEGACY | DSV4_MOE_TC_ALU | DSV4_MOE_TC_PF))) {
        /* decode on the ring, 16 warps an SM: 4-warp blocks (finer for the SMs to share at batch 1) while the x of a
         * chunk fits four blocks an SM, else 8-warp blocks with x as e4m3 codes (act quant), else fewer units a window */
        const size_t stg = fmt == DSV4_WF_NVFP4 ? mt_ring<DSV4_WF_NVFP4>::STAGE : mt_ring<DSV4_WF_MXFP4>::STAGE;
        for (int ci = 0; ci < 2; ci++) {
            nw = ci ? 8 : 4, xb = ci && xt == 1 ? 1 : 2, RT = nw / S, pad = xb == 1 ? 8 : 16;
            ring = stg * (ci ? MT_RING8 : MT_RING4);
            size_t budget = (size_t)mt_sm_smem / (16 / nw) - 1024;
            if (budget > (size_t)dsv4_cuda_dev.smem_optin) budget = (size_t)dsv4_cuda_dev.smem_optin;
            W = NU;
            while (W > S && mt_smem(xt, 1, ntok, W * 128 + pad, W, S, RT, NT, xb, ring) > budget) W -= S;
            if (W == NU && mt_smem(xt, 1, ntok, W * 128 + pad, W, S, RT, NT, xb, ring) <= budget) break;
        }
    } else if (!pq) /* one window of units when it fits two blocks an SM, else fewer units a window */
        while (W > S && mt_smem(xt, 1, ntok, W * 128 + pad, W, S, RT, NT) > 100 * 1024) W -= S;
    smem = mt_smem(xt, pq ? 2 : 1, ntok, W * 128 + pad, W, S, RT, NT, xb, ring);
    if (smem > (size_t)dsv4_cuda_dev.smem_optin) return dsv4_cuda_fail("moe_experts: %zu bytes of shared memory do not fit", smem);
    int gx = (NRP + RT - 1) / RT; /* decode: one tile pair per warp */
    if (pq) gx = (gx + 3) / 4;    /* prefill: four in a row per warp (fewer block starts) */
    mt_params prm;
    prm.WA = WA, prm.WB = WB, prm.x = x, prm.xq = NULL, prm.xq_ld = 0, prm.p = *p, prm.lim = lim, prm.out = out;
    prm.R = R, prm.C = C, prm.NU = NU, prm.S = S, prm.RT = RT, prm.NRP = NRP, prm.W = W, prm.ntok = ntok;
    prm.tok = W * 128 + pad, prm.gx = gx, prm.iters = (NRP + gx * RT - 1) / (gx * RT);
    prm.pf = mt_mode & DSV4_MOE_TC_PF ? MT_PF : 0;
    if (pq) { /* act quant once: x into the scratch (y), h in place */
        const int rows = gateup ? T : T * K;
        const int64_t ld = gateup ? (((int64_t)2 * C + 8 * NU + 15) & ~(int64_t)15) : (int64_t)4 * C; /* codes, scales, ratios */
        uint8_t *dst = gateup ? (uint8_t *)scratch : (uint8_t *)x;
        if (mt_launch(mq_pick(fmt, wg), dim3((rows + 7) / 8), 8, 0, 0, st, "moe_experts (act quant)", x, (int64_t)C, dst, ld, rows, C, pf ? S : 0)) return -1;
        prm.xq = dst, prm.xq_ld = ld;
    }
    if (pf) { /* FP4 prefill on the cp.async pipeline: 8 tile pairs a block, two groups of them a block in a row */
        const int nrb = (NRP + MP_WARPS - 1) / MP_WARPS;
        prm.gx = (nrb + 1) / 2, prm.iters = (nrb + prm.gx - 1) / prm.gx;
        const mt_fn fp = fmt == DSV4_WF_NVFP4 ? mp_pick<DSV4_WF_NVFP4>(gateup, S, wg) : mp_pick<DSV4_WF_MXFP4>(gateup, S, wg);
        return mt_launch(fp, dim3(prm.gx, maxslots), MP_WARPS, 1, mp_smem, st,
                         gateup ? "moe_experts (gate/up, prefill pipeline)" : "moe_experts (down, prefill pipeline)", prm);
    }
    if (nw && xt == 1 && ntok >= MT_RQ_T && mt_rq && (gateup ? scratch != NULL : 1)) {
        /* ring kernels with a chunk of MT_RQ_T or more tokens: x act-quantized once per row into the scratch (gate/up) or
         * in place (down; the codes and scales of a row fit in its fp32 values), in the staged order of the kernel's x
         * (XB = 1: e4m3 bytes, XB = 2: f16 codes), instead of once per block of every expert's 32-64 blocks (the same
         * mt_quant of the same values: the same bits) */
        const int rows = gateup ? T : T * K;
        const int64_t ld = gateup ? (((int64_t)C * xb + 4 * NU + 15) & ~(int64_t)15) : (int64_t)4 * C;
        uint8_t *dst = gateup ? (uint8_t *)scratch : (uint8_t *)x;
        if (mt_launch(mq_pick(fmt, xb == 1 ? 2 : 0), dim3((rows + 7) / 8), 8, 0, 0, st, "moe_experts (act quant, ring)", x, (int64_t)C, dst,
                      ld, rows, C, 0))
            return -1;
        prm.xq = dst, prm.xq_ld = ld;
    }
    const int alu = mt_alu == 1 && (mt_mode & DSV4_MOE_TC_ALU);
    mt_fn fn = gateup ? mt_pick<1>(fmt, xt, NT, pq, alu, nw) : mt_pick<0>(fmt, xt, NT, pq, alu, nw);
    return mt_launch(fn, dim3(gx, maxslots), nw ? nw : MT_WARPS, nw != 0, smem, st, gateup ? "moe_experts (gate/up, tensor cores)" : "moe_experts (down, tensor cores)", prm);
}

static int mb_on = -1; /* DSV4_MOE_PFB=0: 0, passes on the kernels of decode steps */
static int mb_avg;     /* DSV4_MOE_PFB_AVG: from this many tokens an expert on average */
static int mb_pz;      /* DSV4_MOE_PFB_PZ: blocks an (expert, row tile) that share its chunks */
static int mb_prod;    /* DSV4_MOE_PFB_PRODUCER (default 1): a producer warpgroup streams the x ring (mb_kernel's PROD 1) */
static int mb_xtok;    /* DSV4_MOE_PFB_XTOK=1: the x image a token at a time (mb_ximage_tok_kernel) */

static int mb_nv;       /* DSV4_MOE_PFB_NVFP4 (default 1): NVFP4 experts (with the FP8 act quant) here too (mb_kernel's NV) */

static int mb_nsz;      /* DSV4_MOE_PFB_NSZ: a chunk's wgmmas as wide as its tokens (mb_kernel's NSZ), bit 0 gate / up (N 32 / 64 /
                        * 96 / 128), bit 1 the down projection (64 / 128; its NSZ instance spills 8 bytes against 4); 3 by default
                        * since session 45 (the same bits; 8K prefill 0.988x on an H100) */
static int mb_f8;       /* DSV4_MOE_PFB_F8: the FP8 form (moe_f8p.cuh) where it applies, 2 with mq_kernel's PIPE, 3 in passes of 64
                        * tokens (mqh_kernel); session 45; 4: the producer warps decode the weights (mq_kernel's PDEC; session 47);
                        * 5: the down projection over 256-token super chunks (mq_kernel's SC; session 47) */
static int mb_fprod = -1, mb_fxtok = -1, mb_fnv = -1, mb_fnsz = -1, mb_ff8 = -1, mb_last_f8;
extern "C" void dsv4_cuda_moe_pfb_f8(int on) { mb_ff8 = on >= 0 && on <= 5 ? on : -1; }
extern "C" int dsv4_cuda_moe_pfb_f8_last(void) { return mb_last_f8; }

int dsv4_moe_pf8_check(const dsv4_cuda_experts *ex) {
    int *bad = (int *)dsv4_cuda_alloc(sizeof(int)), h = 0;
    if (!bad) return -1;
    int rc = cudaMemset(bad, 0, sizeof(int)) != cudaSuccess ? dsv4_cuda_fail("experts: FP8 prefill check: memset") : 0;
    const int rmax = ex->I > ex->D ? ex->I : ex->D;
    if (!rc) {
        mq_check_kernel<<<dim3((unsigned)((rmax + 7) / 8), (unsigned)ex->E, 3), 256>>>(ex->w1, ex->w3, ex->w2, bad);
        rc = dsv4_cuda_check_launch("experts: FP8 prefill check");
    }
    if (!rc && (cudaMemcpy(&h, bad, sizeof(int), cudaMemcpyDeviceToHost) != cudaSuccess))
        rc = dsv4_cuda_fail("experts: FP8 prefill check: copy");
    dsv4_cuda_free(bad);
    return rc ? -1 : !h;
}
extern "C" void dsv4_cuda_moe_pfb_nsz(int on) { mb_fnsz = on >= 0 && on <= 3 ? on : -1; }
extern "C" void dsv4_cuda_moe_pfb_force(int prod, int xtok) { mb_fprod = prod, mb_fxtok = xtok; }
extern "C" void dsv4_cuda_moe_pfb_nvfp4(int on) { mb_fnv = on == 0 || on == 1 ? on : -1; }

/* the clock trace (moe_bf16.cuh; DSV4_MOE_PFB_TRACE=FILE, with the producer warpgroup, not under graph capture): the
 * kernel's TR instance into a device buffer, then each traced warp's stamps appended to FILE as
 * "call KIND T <T> NU <NU>" and "blk SLOT role ROLE: v1 v2 ..." (v: (clock - start) << 4 | tag) */
static const char *mb_trace_file(void) {
    static const char *f = (const char *)-1;
    if (f == (const char *)-1) f = getenv("DSV4_MOE_PFB_TRACE");
    return f;
}
static int mb_trace_run(void (*k)(mb_params), dim3 grid, int nth, mb_params P, cudaStream_t st, const char *kind, int T) {
    const size_t nb = (size_t)MB_TRB * 3 * MB_TRN * sizeof(long long);
    long long *d = NULL, *h = (long long *)malloc(nb);
    if (!h || cudaMalloc((void **)&d, nb) != cudaSuccess) {
        free(h);
        return dsv4_cuda_fail("moe_experts: trace buffer");
    }
    cudaMemsetAsync(d, 0, nb, st);
    P.trc = d;
    k<<<grid, nth, MB_SMEM, st>>>(P);
    int rc = dsv4_cuda_check_launch("moe_experts (bf16 prefill, traced)");
    if (!rc && (cudaMemcpyAsync(h, d, nb, cudaMemcpyDeviceToHost, st) != cudaSuccess || cudaStreamSynchronize(st) != cudaSuccess))
        rc = dsv4_cuda_fail("moe_experts: trace copy");
    FILE *f = rc ? NULL : fopen(mb_trace_file(), "a");
    if (f) {
        fprintf(f, "call %s T %d NU %d\n", kind, T, P.C / 128);
        for (int b = 0; b < MB_TRB; b++)
            for (int r = 0; r < 3; r++) {
                const long long *v = h + ((size_t)b * 3 + r) * MB_TRN;
                if (!v[0]) continue;
                fprintf(f, "blk %d role %d:", b * 16, r);
                for (int i = 1; i < MB_TRN && v[i]; i++) fprintf(f, " %lld", (((v[i] >> 4) - (v[0] >> 4)) << 4) | (v[i] & 15));
                fprintf(f, "\n");
            }
        fclose(f);
    }
    cudaFree(d);
    free(h);
    return rc;
}

/* mb_kernel's instance for a matrix's format (nv: NVFP4), the producer form and NSZ (no trace) */
typedef void (*mb_fn)(mb_params);
template <int GATEUP, int NSZ> static mb_fn mb_pick_nsz(int nv, int prod) {
    return nv ? (prod ? mb_kernel<GATEUP, 1, 0, 1, NSZ> : mb_kernel<GATEUP, 0, 0, 1, NSZ>)
              : (prod ? mb_kernel<GATEUP, 1, 0, 0, NSZ> : mb_kernel<GATEUP, 0, 0, 0, NSZ>);
}
template <int GATEUP> static mb_fn mb_pick(int nv, int prod, int nsz) {
    return nsz ? mb_pick_nsz<GATEUP, 1>(nv, prod) : mb_pick_nsz<GATEUP, 0>(nv, prod);
}

int dsv4_moe_pfb_run(const dsv4_cuda_experts *ex, const float *x, int T, int K, int maxslots, const dsv4_cuda_moe_plan *p, float lim,
                     float *h, float *y, cudaStream_t st) {
    if (mb_on < 0) mb_on = dsv4_env_int("DSV4_MOE_PFB", 1) != 0, mb_avg = dsv4_env_int("DSV4_MOE_PFB_AVG", 32),
                     mb_pz = dsv4_env_int("DSV4_MOE_PFB_PZ", 1), mb_prod = dsv4_env_int("DSV4_MOE_PFB_PRODUCER", 1) != 0,
                     mb_xtok = dsv4_env_int("DSV4_MOE_PFB_XTOK", 0) != 0, /* (the producer on, the x image a token at a time off: NOTES "Session 30") */
                     mb_nv = dsv4_env_int("DSV4_MOE_PFB_NVFP4", 1) != 0, /* (on since session 30: NVFP4 8K prefill +33 %) */
                     mb_nsz = dsv4_env_int("DSV4_MOE_PFB_NSZ", 3) & 3, mb_f8 = dsv4_env_int("DSV4_MOE_PFB_F8", 0);
    const int64_t slots = (int64_t)T * K;
    /* the images: at most T K + 8 maxslots rows of 2 D bytes (x, in y's T K rows of 4 D bytes) and of 2 I bytes (h's, in
     * h's T K rows of 4 I): they fit while 8 maxslots <= T K (always at the default DSV4_MOE_PFB_AVG) */
    /* (MXFP4 or NVFP4 each matrix, with the FP8 act quant: NVFP4 checkpoints of the DeepSeek recipe; NVFP4 without it, W4A16,
     * stays on the f16 kernels, whose x terms carry fp32 x) */
    const int nvok = mb_fnv >= 0 ? mb_fnv : mb_nv;
    const int fok13 = ex->fmt13 == DSV4_WF_MXFP4 || (nvok && ex->fmt13 == DSV4_WF_NVFP4),
              fok2 = ex->fmt2 == DSV4_WF_MXFP4 || (nvok && ex->fmt2 == DSV4_WF_NVFP4);
    if (!mb_on || mt_mode || !ex->tc13 || !ex->tc2 || !fok13 || !fok2 || !ex->aq13 || !ex->aq2 || ex->D % 256 || ex->I % 256 ||
        slots < (int64_t)mb_avg * ex->E || slots < (int64_t)8 * maxslots)
        return 0;
    const int prod = mb_fprod >= 0 ? mb_fprod : mb_prod, xtok = mb_fxtok >= 0 ? mb_fxtok : mb_xtok;
    const int nv13 = ex->fmt13 == DSV4_WF_NVFP4, nv2 = ex->fmt2 == DSV4_WF_NVFP4;
    /* NSZ: a chunk's wgmmas as wide as its tokens (separate instances: the default's code stays as it was) */
    const int nsz = mb_fnsz >= 0 ? mb_fnsz : mb_nsz;
    void (*const kg)(mb_params) = mb_pick<1>(nv13, prod, nsz & 1), (*const kd)(mb_params) = mb_pick<0>(nv2, prod, nsz & 2);
    const int nth = prod ? MB_PTHREADS : MB_THREADS;
    mb_last_f8 = 0;
    /* the FP8 form (moe_f8p.cuh): MXFP4 both, every row's scales within reach, rows of whole 16-byte image rows */
    const int f8 = (mb_ff8 >= 0 ? mb_ff8 : mb_f8) > 0 && prod && !nv13 && !nv2 && ex->pf8 && ex->D % 512 == 0 && ex->I % 512 == 0;
    if (f8) {
        const int pz = mb_pz >= 1 && mb_pz <= 8 ? mb_pz : 1;
        const int form = mb_ff8 >= 0 ? mb_ff8 : mb_f8, pipe = form == 2, half = form == 3, pdec = form == 4, sc = form == 5;
        void (*const qg)(mb_params) = half ? mqh_kernel<1> : pipe ? mq_kernel<1, 1> : pdec ? mq_kernel<1, 0, 1> : mq_kernel<1, 0>;
        void (*const qd)(mb_params) = half ? mqh_kernel<0>
                                      : pipe ? mq_kernel<0, 1>
                                      : pdec ? mq_kernel<0, 0, 1>
                                      : sc   ? mq_kernel<0, 0, 0, 1>
                                             : mq_kernel<0, 0>;
        const int qsm = half ? MQH_SMEM : pdec ? MQ_SMEM_D : MQ_SMEM, qsmd = sc ? MQ_SMEM_SC : qsm;
        if (mt_set_smem((const void *)qg, qsm, 0) || mt_set_smem((const void *)qd, qsmd, 0)) return -1;
        mq_ximage_kernel<<<dim3(16, maxslots), 256, 0, st>>>(x, *p, ex->D, (uint8_t *)y);
        if (dsv4_cuda_check_launch("moe_experts (x image, fp8 prefill)")) return -1;
        mb_params P;
        P.WA = ex->w1, P.WB = ex->w3, P.img = (const uint8_t *)y, P.p = *p, P.lim = lim, P.out = h, P.R = ex->I, P.C = ex->D, P.trc = NULL;
        qg<<<dim3(ex->I / 128, maxslots, pz), MB_PTHREADS, qsm, st>>>(P);
        if (dsv4_cuda_check_launch("moe_experts (gate/up, fp8 prefill)")) return -1;
        P.WA = ex->w2, P.WB = NULL, P.img = (const uint8_t *)h, P.lim = 0.0f, P.out = y, P.R = ex->D, P.C = ex->I;
        qd<<<dim3(ex->D / (sc ? 128 : 256), maxslots, pz), MB_PTHREADS, qsmd, st>>>(P);
        if (dsv4_cuda_check_launch("moe_experts (down, fp8 prefill)")) return -1;
        mb_last_f8 = 1;
        return 1;
    }
    const void *fg = (const void *)kg, *fd = (const void *)kd;
    if (mt_set_smem(fg, MB_SMEM, 0) || mt_set_smem(fd, MB_SMEM, 0)) return -1;
    if (xtok && K <= MB_XK) mb_ximage_tok_kernel<<<(unsigned)((T + 7) / 8), 256, 0, st>>>(x, *p, T, K, ex->D, (uint8_t *)y);
    else mb_ximage_kernel<<<dim3(16, maxslots), 256, 0, st>>>(x, *p, ex->D, (uint8_t *)y);
    if (dsv4_cuda_check_launch("moe_experts (x image, bf16 prefill)")) return -1;
    mb_params P;
    P.WA = ex->w1, P.WB = ex->w3, P.img = (const uint8_t *)y, P.p = *p, P.lim = lim, P.out = h, P.R = ex->I, P.C = ex->D;
    const int pz = mb_pz >= 1 && mb_pz <= 8 ? mb_pz : 1;
    P.trc = NULL;
    cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
    const int tr = prod && !nv13 && !nv2 && mb_trace_file() && cudaStreamIsCapturing(st, &cs) == cudaSuccess && cs == cudaStreamCaptureStatusNone;
    static int tr_told;
    if (mb_trace_file() && !tr && !tr_told) {
        tr_told = 1;
        fprintf(stderr, "dsv4: DSV4_MOE_PFB_TRACE: no trace from this pass (it needs DSV4_MOE_PFB_PRODUCER=1, MXFP4 experts and no graph "
                        "capture)\n");
    }
    if (tr) {
        if (mt_set_smem((const void *)mb_kernel<1, 1, 1>, MB_SMEM, 0) || mt_set_smem((const void *)mb_kernel<0, 1, 1>, MB_SMEM, 0) ||
            mb_trace_run(mb_kernel<1, 1, 1>, dim3(ex->I / 128, maxslots, pz), nth, P, st, "gateup", T))
            return -1;
    } else {
        kg<<<dim3(ex->I / 128, maxslots, pz), nth, MB_SMEM, st>>>(P);
        if (dsv4_cuda_check_launch("moe_experts (gate/up, bf16 prefill)")) return -1;
    }
    P.WA = ex->w2, P.WB = NULL, P.img = (const uint8_t *)h, P.lim = 0.0f, P.out = y, P.R = ex->D, P.C = ex->I;
    if (tr) {
        if (mb_trace_run(mb_kernel<0, 1, 1>, dim3(ex->D / 256, maxslots, pz), nth, P, st, "down", T)) return -1;
    } else {
        kd<<<dim3(ex->D / 256, maxslots, pz), nth, MB_SMEM, st>>>(P);
        if (dsv4_cuda_check_launch("moe_experts (down, bf16 prefill)")) return -1;
    }
    return 1;
}
