/* moe_f8p.cuh - the routed experts of a prefill pass on FP8 tensor cores with one promotion per 128 columns (included
 * by moe_tc.cu after moe_bf16.cuh, whose ring, weight copies and epilogue it follows; run by dsv4_moe_pfb_run where
 * DSV4_MOE_PFB_F8=1 and the experts' scales allow it, MXFP4 weights with the FP8 act quant only).
 *
 * Why: the BF16 kernel (moe_bf16.cuh) runs at the BF16 tensor rate; Hopper's FP8 rate is twice that. moe_f8.cuh's FP8
 * kernel promotes every 32-column group (one E8M0 scale each) out of the tensor core, which held it near 190 TFLOP/s in
 * the prefill. Here the per-group scales are folded into the A operand's codes instead: a row's weights
 * e2m1 x 2^(e_g - 127) are e2m1 x 2^(6 - δ) x 2^(E_r - 133) with E_r the row's largest group scale and δ = E_r - e_g
 * (0 .. 14), and e2m1 x 2^(6 - δ) is exactly an e4m3 code for every δ <= 14 (6 x 2^6 = 384 <= 448; 0.5 x 2^-8 is e4m3's
 * smallest subnormal, and 1.5, 3 x 2^-8 are on its grid). A group further than 14 binades below its row's largest is
 * exact only when all its codes are zero: dsv4_moe_pf8_check (once, at dsv4_cuda_experts_init) checks that for every
 * row of every expert and sets the experts' pf8; without it this kernel is never used. The row factor 2^(E_r - 133)
 * is applied in the epilogue; the x codes' act-quant scale (per token and 128-column unit) in the promotion: a unit's
 * four k32 wgmmas accumulate fresh, then acc += D x s_x. So a unit's sums are the tensor core's (Hopper's FP8 MMA keeps
 * ~13 fraction bits while it adds a k32 step's products: moe_f8.cuh), the units' in fp32: not the BF16 kernel's bits,
 * and not the FP8 decode kernels' either. A token's outputs still depend on its own row only.
 *
 * The A operand's k-order: lane (g, c) holds 32 consecutive columns (group c of the unit) of rows g and g + 8; k-step
 * s takes word s (columns 32 c + 8 s .. + 7): its nibbles 0-3 become register 0 (k 4 c .. 4 c + 3), 4-7 register 2
 * (k 16 + 4 c ..), each nibble through a byte permute of the row's 8-code table for its δ (mq_dec). Logical column
 * L = 32 s + kk of a unit is physical column 32 c + 8 s + 4 (kk >> 4) + (kk & 3) with c = (kk & 15) >> 2 (mq_logical is
 * the inverse); the x image holds the codes in logical order.
 *
 * The image of a chunk-unit (ng = ceil(tokens / 8) n-groups): [k-step 4][n-group ng][k half 2][8 tokens][16 codes]
 * (wgmma's K-major core matrices, LBO 128, SBO 256, as moe_bf16.cuh's) then the tokens' act-quant scales [8 ng] fp32:
 * ng 1056 bytes, i.e. rows of C + C / 32 bytes (mq_rowb); an expert's chunks from row act_off + 8 a, chunk j at + 128 j
 * rows, unit u at + u ng 1056 bytes. h's image (the gate / up epilogue's output, the down projection's input) likewise.
 *
 * The block: as moe_bf16.cuh's with the producer warpgroup (PROD 1): 128 rows of w1 and w3 (gate / up) or two 128-row
 * tiles of w2 (down), two consumer warpgroups of 64 rows, a 4-stage x ring (one bulk copy a chunk-unit), each warp's
 * weight ring. A unit, for each matrix: its four k-steps' A fragments decoded, then the chunk's tokens in halves of 64
 * (wgmma m64n64k32 e4m3, into t[0] / t[1]: 32 registers each, the second half skipped for chunks of 64 tokens or
 * fewer), each half promoted once its wgmmas are done. A row's E_r at least 7 (its factor a normal float) and no NaN
 * scale (255), also checked. */
#pragma once

#define MQ_STAGE 16896 /* bytes of a stage: a chunk-unit of 16 n-groups (16 x 1056) */
#define MQ_TBL (16 * 8) /* the 16 code tables (δ 0 .. 14, and 15: zeros) */
#define MQ_SMEM (MB_S * MQ_STAGE + 2 * MB_S * 8 + 8 * 128 * 4 + 3 * 128 * 4 + MQ_TBL + 8 * MB_W * MB_WSTAGE)

/* PDEC (DSV4_MOE_PFB_F8=4): the producer warpgroup decodes the A fragments into shared memory, MQ_NA stages of a unit's
 * fragments for the 8 consumer warps ([warp 8][matrix 2][k-step 4][lane 32][16 bytes]: one conflict-free 16-byte load a
 * k-step), on mbarriers afull (the 128 producer threads arrive) / aempty (8 consumer warps); after the weight rings */
#define MQ_NA 2
#define MQ_ASTAGE 32768
#define MQ_SMEM_D (MQ_SMEM + MQ_NA * MQ_ASTAGE + 2 * MQ_NA * 8)
/* SC (DSV4_MOE_PFB_F8=5, the down projection): stages of two chunk-units */
#define MQ_SMEM_SC (MQ_SMEM + MB_S * MQ_STAGE)

/* bytes of an image row: C codes and C / 128 scales of 4 bytes */
static inline __host__ __device__ int64_t mq_rowb(int C) { return (int64_t)C + C / 32; }

/* logical position in a unit of physical column p (0..127) */
__device__ __forceinline__ int mq_logical(int p) {
    const int c = p >> 5, s = (p >> 3) & 3, i = p & 7;
    return 32 * s + 16 * (i >> 2) + 4 * c + (i & 3);
}
/* byte of logical column L of token t in a chunk-unit of ng n-groups */
__device__ __forceinline__ int mq_off(int L, int t, int ng) {
    return (((L >> 5) * ng + (t >> 3)) * 2 + ((L >> 4) & 1)) * 128 + (t & 7) * 16 + (L & 15);
}

__device__ __forceinline__ uint32_t mq_prmt(uint32_t a, uint32_t b, uint32_t s) {
    uint32_t r;
    asm("prmt.b32 %0, %1, %2, %3;" : "=r"(r) : "r"(a), "r"(b), "r"(s));
    return r;
}
/* 8 e2m1 nibbles of w (column i at bits 4 i) -> e4m3 codes through lut (the 8 magnitudes' codes): lo columns 0-3, hi
 * 4-7. The magnitude by a byte permute of the table; the sign by a permute in sign-replicating mode (a selector nibble
 * with bit 3 set gives the picked byte's top bit, 0, in every bit; one clear copies the byte, 0x40), shifted to bit 7:
 * 0x80 for a positive code, 0 for a negative one. (A sign-replicated byte's top bit is always the picked byte's, so
 * bit 7 itself cannot tell the two apart: session 45's first build read it and set every positive code's sign.) */
__device__ __forceinline__ void mq_dec(uint32_t w, uint2 lut, uint32_t &lo, uint32_t &hi) {
    const uint32_t m = w & 0x77777777u, wh = w >> 16;
    const uint32_t plo = mq_prmt(0x40404040u, 0x40404040u, w) << 1, phi = mq_prmt(0x40404040u, 0x40404040u, wh) << 1;
    lo = mq_prmt(lut.x, lut.y, m) | (~plo & 0x80808080u);
    hi = mq_prmt(lut.x, lut.y, m >> 16) | (~phi & 0x80808080u);
}

/* d (64 x 64 fp32: d[0..7], 8 n-tiles) = (acc ? d : 0) + A (registers) . B (descriptor), wgmma m64n64k32 e4m3 */
__device__ __forceinline__ void mq_mma(float (&d)[8][4], const uint32_t (&a)[4], uint64_t desc, int acc) {
#define MQ_D4(n) "+f"(d[n][0]), "+f"(d[n][1]), "+f"(d[n][2]), "+f"(d[n][3])
    asm volatile("{ .reg .pred p; setp.ne.b32 p, %37, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n64k32.f32.e4m3.e4m3 {"
                 "%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,"
                 "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31"
                 "}, {%32,%33,%34,%35}, %36, p, 1, 1; }"
                 : MQ_D4(0), MQ_D4(1), MQ_D4(2), MQ_D4(3), MQ_D4(4), MQ_D4(5), MQ_D4(6), MQ_D4(7)
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(acc)
                 : "memory");
#undef MQ_D4
}

/* d += A . B (scale-d true as an immediate: no register input but A, B and D) */
__device__ __forceinline__ void mq_mma1(float (&d)[8][4], const uint32_t (&a)[4], uint64_t desc) {
#define MQ_D4(n) "+f"(d[n][0]), "+f"(d[n][1]), "+f"(d[n][2]), "+f"(d[n][3])
    asm volatile("{ .reg .pred p; setp.ne.b32 p, 1, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n64k32.f32.e4m3.e4m3 {"
                 "%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,"
                 "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31"
                 "}, {%32,%33,%34,%35}, %36, p, 1, 1; }"
                 : MQ_D4(0), MQ_D4(1), MQ_D4(2), MQ_D4(3), MQ_D4(4), MQ_D4(5), MQ_D4(6), MQ_D4(7)
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc)
                 : "memory");
#undef MQ_D4
}
/* the same with scale-d false and D write-only (the first k-step of a fresh sum: D's old registers are no input, so
 * nothing has to define them while other wgmmas are in flight) */
__device__ __forceinline__ void mq_mma0(float (&d)[8][4], const uint32_t (&a)[4], uint64_t desc) {
#define MQ_D4(n) "=f"(d[n][0]), "=f"(d[n][1]), "=f"(d[n][2]), "=f"(d[n][3])
    asm volatile("{ .reg .pred p; setp.ne.b32 p, 0, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n64k32.f32.e4m3.e4m3 {"
                 "%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,"
                 "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31"
                 "}, {%32,%33,%34,%35}, %36, p, 1, 1; }"
                 : MQ_D4(0), MQ_D4(1), MQ_D4(2), MQ_D4(3), MQ_D4(4), MQ_D4(5), MQ_D4(6), MQ_D4(7)
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc)
                 : "memory");
#undef MQ_D4
}

/* v's FP8 act quant code with its block's scale (inv = 1 / s): RNE to e4m3 of v / s clamped to +-448 (mb_q8's code) */
__device__ __forceinline__ uint8_t mq_q8(float v, float inv) {
    const float y = fminf(fmaxf(__fmul_rn(v, inv), -448.0f), 448.0f);
    return (uint8_t)__nv_cvt_float_to_fp8(y, __NV_SATFINITE, __NV_E4M3);
}

/* 1. the x image: a warp takes a slot and four units at a time, lane l piece pc = l & 7 of unit u0 + (l >> 3): k-step
 * pc >> 1, k half pc & 1, i.e. logical columns 32 (pc >> 1) + 16 (pc & 1) + b (b 0..15), physical 32 (b >> 2) +
 * 8 (pc >> 1) + 4 (pc & 1) + (b & 3): four 16-byte loads. The unit's amax over its 8 lanes, its power-of-two scale
 * (mt_quant<1>'s rule), the codes as one 16-byte store, the scale by lane pc 0 */
__global__ void __launch_bounds__(256) mq_ximage_kernel(const float *x, dsv4_cuda_moe_plan p, int C, uint8_t *img) {
    const int ia = blockIdx.y;
    if (ia >= *p.nact) return;
    const int off = p.act_off[ia], cnt = p.act_cnt[ia], NU = C / 128, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int pc = lane & 7, uq = lane >> 3, s = pc >> 1, kh = pc & 1;
    const int64_t rowb = mq_rowb(C);
    for (int j = blockIdx.x * 8 + warp; j < cnt; j += gridDim.x * 8) {
        const float *xr = x + (int64_t)p.rows[off + j] * C;
        const int ch = j >> 7, t = j & 127, rest = cnt - ch * 128, ng = ((rest < 128 ? rest : 128) + 7) >> 3;
        uint8_t *cb = img + ((int64_t)off + 8 * ia + (int64_t)ch * 128) * rowb;
        for (int u0 = 0; u0 < NU; u0 += 4) {
            const int u = u0 + uq;
            float v[16];
#pragma unroll
            for (int q = 0; q < 4; q++) {
                const float4 f = u < NU ? *(const float4 *)(xr + u * 128 + 32 * q + 8 * s + 4 * kh) : make_float4(0.f, 0.f, 0.f, 0.f);
                v[4 * q] = f.x, v[4 * q + 1] = f.y, v[4 * q + 2] = f.z, v[4 * q + 3] = f.w;
            }
            float a = 1e-4f;
#pragma unroll
            for (int q = 0; q < 16; q++) a = fmaxf(a, fabsf(v[q]));
#pragma unroll
            for (int o = 1; o < 8; o <<= 1) a = fmaxf(a, __shfl_xor_sync(0xffffffffu, a, o));
            const float sc = dev_pow2_ceil(a * (1.0f / 448.0f)), inv = 1.0f / sc;
            uint32_t w[4];
#pragma unroll
            for (int q = 0; q < 4; q++)
                w[q] = (uint32_t)mq_q8(v[4 * q], inv) | ((uint32_t)mq_q8(v[4 * q + 1], inv) << 8) | ((uint32_t)mq_q8(v[4 * q + 2], inv) << 16) |
                       ((uint32_t)mq_q8(v[4 * q + 3], inv) << 24);
            if (u < NU) {
                uint8_t *ub = cb + (int64_t)u * ng * 1056;
                *(uint4 *)(ub + ((s * ng + (t >> 3)) * 2 + kh) * 128 + (t & 7) * 16) = make_uint4(w[0], w[1], w[2], w[3]);
                if (pc == 0) *(float *)(ub + ng * 1024 + 4 * t) = sc;
            }
        }
    }
}

/* 2. gate / up (GATEUP 1) and down (0): moe_bf16.cuh's mb_kernel with the producer warpgroup, FP8 wgmmas and a
 * promotion a unit (above). PIPE 1: a unit's two halves of tokens in flight together (DSV4_MOE_PFB_F8=2). PDEC 1
 * (DSV4_MOE_PFB_F8=4, not with PIPE): the four producer warps fetch the weights and decode the A fragments (warp p those
 * of consumer warps p and p + 4, lane for lane: the same words, tables and decode), the consumers load them from
 * shared memory (session 46: the decode was half the consumers' instructions and on their chain before each matrix's
 * wgmmas, with 2.2 warps a scheduler); warp 8 also issues the x copies, one unit ahead of its decode. The same
 * operations on the same values: the same bits as PDEC 0. SC 1 (the down projection, DSV4_MOE_PFB_F8=5; session 47,
 * NOTES "Design of (a)"): a block of one 128-row tile (warpgroup 0 rows 0-63, 1 rows 64-127) over a super chunk of two
 * 128-token chunks (chunks 2 c, 2 c + 1; a stage holds both chunk-units, the second at MQ_STAGE), each unit's A decoded
 * once and used for both chunks (d[m]: chunk m's sums): half the decode a FLOP; per (row, token) the same wgmmas and
 * promotions, so the same y. */
template <int GATEUP, int PIPE, int PDEC = 0, int SC = 0>
__global__ void __launch_bounds__(MB_PTHREADS, 1) mq_kernel(const __grid_constant__ mb_params P) {
    constexpr int NM = 2;
    /* SC (the down projection alone): m is the super chunk's chunk, not the matrix; one A set (a[0]) for both */
    constexpr int STG = SC ? 2 * MQ_STAGE : MQ_STAGE, NMW = SC ? 1 : NM;
    static_assert(!SC || (!GATEUP && !PIPE && !PDEC), "SC: the down projection's plain form");
    extern __shared__ __align__(128) unsigned char mb_sm[];
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, c = lane & 3;
    const int ia = blockIdx.y;
    if (ia >= *P.p.nact) return;
    const int ex = P.p.act_e[ia], off = P.p.act_off[ia], cnt = P.p.act_cnt[ia];
    const int C = P.C, NU = C / 128, Z = gridDim.z, z = blockIdx.z, nch = SC ? (((cnt + 127) >> 7) + 1) >> 1 : (cnt + 127) >> 7,
              npb = nch - z > 0 ? (nch - z + Z - 1) / Z : 0;
    if (!npb) return;
    const int n = npb * NU;
    const unsigned sb = (unsigned)__cvta_generic_to_shared(mb_sm), fullb = sb + MB_S * STG, emptyb = fullb + MB_S * 8;
    float *red = (float *)(mb_sm + MB_S * STG + 2 * MB_S * 8), *scs = red + 8 * 128, *scsi = scs + 128, *rws = scsi + 128;
    uint8_t *tbl = (uint8_t *)(rws + 128);
    const unsigned afullb = sb + MQ_SMEM + MQ_NA * MQ_ASTAGE, aemptyb = afullb + 8 * MQ_NA; /* (PDEC) */
    if (tid == 0) {
        for (int s = 0; s < MB_S; s++) dev_mbar_init(fullb + 8 * s, 1), dev_mbar_init(emptyb + 8 * s, 8);
        if (PDEC)
            for (int s = 0; s < MQ_NA; s++) dev_mbar_init(afullb + 8 * s, 128), dev_mbar_init(aemptyb + 8 * s, 8);
        dev_mbar_fence_init();
    }
    if (tid < MQ_TBL) { /* table δ (tid >> 3), magnitude code tid & 7: e2m1 x 2^(6 - δ) as e4m3 (exact for δ <= 14); 15: 0 */
        const int dl = tid >> 3, m = tid & 7;
        const float v = dl < 15 ? ldexpf(0.5f * (float)((0xC8643210u >> (4 * m)) & 15), 6 - dl) : 0.0f;
        tbl[tid] = (uint8_t)__nv_cvt_float_to_fp8(v, __NV_SATFINITE, __NV_E4M3);
    }
    __syncthreads();
    const int64_t rowb = mq_rowb(C);
    const uint8_t *img = P.img + ((int64_t)off + 8 * ia) * rowb;
    /* the x copy of unit j (chunk j / NU, unit j % NU) into stage j % MB_S once its readers released it (one lane) */
    auto xcopy = [&](int j) {
        const int s = j % MB_S, t0 = (z + (j / NU) * Z) * 128;
        const int ng = ((cnt - t0 < 128 ? cnt - t0 : 128) + 7) >> 3;
        if (j >= MB_S) dev_mbar_wait(emptyb + 8 * s, ((j / MB_S) - 1) & 1);
        dev_mbar_expect(fullb + 8 * s, (unsigned)ng * 1056);
        dev_bulk_g2s(sb + s * STG, img + (int64_t)t0 * rowb + (int64_t)(j % NU) * ng * 1056, (unsigned)ng * 1056, fullb + 8 * s);
    };
    if (PDEC && warp >= 8) { /* the decoding producer: unit it's A fragments of consumer warps pw and pw + 4 */
        asm volatile("setmaxnreg.dec.sync.aligned.u32 56;\n" ::: "memory");
        const int pw = warp - 8, rb = blockIdx.x * (GATEUP ? 128 : 256);
        int er[2][NM][2]; /* (q: consumer warp pw + 4 q) */
#pragma unroll
        for (int q = 0; q < 2; q++)
#pragma unroll
            for (int m = 0; m < NM; m++) {
                const dsv4_cuda_weight &w = GATEUP && m ? P.WB[ex] : P.WA[ex];
#pragma unroll
                for (int h = 0; h < 2; h++) {
                    const uint8_t *sc = w.scale + ((int64_t)w.row0 + rb + (GATEUP ? 0 : 128 * m) + 64 * q + 16 * pw + g + 8 * h) * w.scale_stride;
                    uint32_t mx = 0u;
                    for (int i = c; i < NU; i += 4) mx = __vmaxu4(mx, ((const uint32_t *)sc)[i]);
                    mx = __vmaxu4(mx, mx >> 16);
                    mx = __vmaxu4(mx, mx >> 8) & 0xFFu;
                    mx = max(mx, (uint32_t)__shfl_xor_sync(0xffffffffu, mx, 1));
                    er[q][m][h] = (int)max(mx, (uint32_t)__shfl_xor_sync(0xffffffffu, mx, 2));
                }
            }
        const unsigned wsa0 = sb + MB_S * STG + 2 * MB_S * 8 + 8 * 128 * 4 + 3 * 128 * 4 + MQ_TBL + pw * MB_W * MB_WSTAGE;
        /* this lane's weights of unit v into the rings of consumer warps pw and pw + 4 (theirs in PDEC 0) */
        auto pissue = [&](int v) {
            if (v < n) {
                const int wu = v % NU;
#pragma unroll
                for (int q = 0; q < 2; q++) {
                    const unsigned sa = wsa0 + 4 * q * MB_W * MB_WSTAGE + (v % MB_W) * MB_WSTAGE;
#pragma unroll
                    for (int m = 0; m < NM; m++) {
                        const dsv4_cuda_weight &w = GATEUP && m ? P.WB[ex] : P.WA[ex];
#pragma unroll
                        for (int h = 0; h < 2; h++) {
                            const int64_t r = (int64_t)w.row0 + rb + (GATEUP ? 0 : 128 * m) + 64 * q + 16 * pw + g + 8 * h;
                            mt_cp16s(sa + ((2 * m + h) * 32 + lane) * 16, (const uint4 *)w.data + r * (C / 32) + c + wu * 4);
                            mt_cps<4>(sa + (128 + lane) * 16 + (2 * m + h) * 4, w.scale + r * w.scale_stride + wu * 4);
                        }
                    }
                }
            }
            dev_cp_commit();
        };
#pragma unroll 1
        for (int v = 0; v < MB_W - 1; v++) pissue(v);
        int xi = 0;
#pragma unroll 1
        for (int it = 0; it < n; it++) {
            if (warp == 8) {
                for (; xi <= it + 1 && xi < n; xi++) {
                    if (lane == 0) xcopy(xi);
                    __syncwarp();
                }
            }
            pissue(it + MB_W - 1); /* (into unit it - 1's ring stage: decoded) */
            dev_cp_wait<MB_W - 1>();
            const int sa = it % MQ_NA;
            if (it >= MQ_NA) dev_mbar_wait(aemptyb + 8 * sa, ((it / MQ_NA) - 1) & 1);
#pragma unroll
            for (int q = 0; q < 2; q++) {
                const unsigned char *ws = mb_sm + (wsa0 - sb) + 4 * q * MB_W * MB_WSTAGE + (it % MB_W) * MB_WSTAGE;
                const uint4 scw = *(const uint4 *)(ws + (128 + lane) * 16);
                unsigned char *ab = mb_sm + MQ_SMEM + sa * MQ_ASTAGE + ((pw + 4 * q) * 256 + lane) * 16;
#pragma unroll
                for (int m = 0; m < NM; m++) {
                    uint2 lut[2];
#pragma unroll
                    for (int h = 0; h < 2; h++) {
                        const int dl = er[q][m][h] - (int)(((&scw.x)[2 * m + h] >> (8 * c)) & 0xFFu);
                        lut[h] = *(const uint2 *)(tbl + 8 * (dl < 15 ? dl : 15));
                    }
                    const uint4 w0 = *(const uint4 *)(ws + ((2 * m) * 32 + lane) * 16), w1 = *(const uint4 *)(ws + ((2 * m + 1) * 32 + lane) * 16);
#pragma unroll
                    for (int ks = 0; ks < 4; ks++) {
                        uint4 a;
                        mq_dec((&w0.x)[ks], lut[0], a.x, a.z);
                        mq_dec((&w1.x)[ks], lut[1], a.y, a.w);
                        *(uint4 *)(ab + (m * 4 + ks) * 512) = a;
                    }
                }
            }
            dev_mbar_arrive(afullb + 8 * sa); /* (every producer thread: each releases its own stores) */
        }
        return;
    }
    if (warp >= 8) { /* the producer: unit it of chunk it / NU into stage it % MB_S once its readers released it */
        asm volatile("setmaxnreg.dec.sync.aligned.u32 24;\n" ::: "memory");
        if (warp == 8) {
            int pu = 0, pcl = 0;
            for (int it = 0; it < n; it++) {
                const int s = it % MB_S, t0 = (z + pcl * Z) * (SC ? 256 : 128);
                const int ng = ((cnt - t0 < 128 ? cnt - t0 : 128) + 7) >> 3;
                const int ng1 = SC && cnt > t0 + 128 ? ((cnt - t0 - 128 < 128 ? cnt - t0 - 128 : 128) + 7) >> 3 : 0; /* (SC: chunk 1) */
                if (it >= MB_S) dev_mbar_wait(emptyb + 8 * s, ((it / MB_S) - 1) & 1);
                if (lane == 0) {
                    dev_mbar_expect(fullb + 8 * s, (unsigned)(ng + ng1) * 1056);
                    dev_bulk_g2s(sb + s * STG, img + (int64_t)t0 * rowb + (int64_t)pu * ng * 1056, (unsigned)ng * 1056, fullb + 8 * s);
                    if (ng1) /* (at the stage's second half: its descriptors aligned as the first's) */
                        dev_bulk_g2s(sb + s * STG + MQ_STAGE, img + (int64_t)(t0 + 128) * rowb + (int64_t)pu * ng1 * 1056, (unsigned)ng1 * 1056,
                                     fullb + 8 * s);
                }
                __syncwarp();
                if (++pu == NU) pu = 0, pcl++;
            }
        }
        return;
    }
    if constexpr (PDEC) asm volatile("setmaxnreg.inc.sync.aligned.u32 224;\n" ::: "memory");
    else asm volatile("setmaxnreg.inc.sync.aligned.u32 240;\n" ::: "memory");
    const int wgi = warp >> 2, rl = 64 * wgi + 16 * (warp & 3) + g, rb = blockIdx.x * (GATEUP || SC ? 128 : 256);
    const uint4 *wq[NM][2];
    const uint8_t *wsc[NM][2];
    int er[NM][2]; /* the rows' largest group scale E_r */
#pragma unroll
    for (int m = 0; m < NMW; m++) {
        const dsv4_cuda_weight &w = GATEUP && m ? P.WB[ex] : P.WA[ex];
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const int64_t r = (int64_t)w.row0 + rb + (GATEUP ? 0 : 128 * m) + rl + 8 * h;
            wq[m][h] = (const uint4 *)w.data + r * (C / 32) + c;
            wsc[m][h] = w.scale + r * w.scale_stride;
            uint32_t mx = 0u; /* lane c: the row's scale words c, c + 4, ... (a unit's four groups a word) */
            for (int i = c; i < NU; i += 4) mx = __vmaxu4(mx, ((const uint32_t *)wsc[m][h])[i]);
            mx = __vmaxu4(mx, mx >> 16);
            mx = __vmaxu4(mx, mx >> 8) & 0xFFu;
            mx = max(mx, (uint32_t)__shfl_xor_sync(0xffffffffu, mx, 1));
            er[m][h] = (int)max(mx, (uint32_t)__shfl_xor_sync(0xffffffffu, mx, 2));
        }
    }
    const unsigned wsa = sb + MB_S * STG + 2 * MB_S * 8 + 8 * 128 * 4 + 3 * 128 * 4 + MQ_TBL + warp * MB_W * MB_WSTAGE;
    int wu = 0;
    auto wissue = [&](int v) { /* (moe_bf16.cuh's: this thread's weights of unit v into its warp's ring; PDEC: the producer's) */
        if (PDEC) return;
        if (v < n) {
            const unsigned sa = wsa + (v % MB_W) * MB_WSTAGE;
#pragma unroll
            for (int m = 0; m < NMW; m++)
#pragma unroll
                for (int h = 0; h < 2; h++) {
                    mt_cp16s(sa + ((2 * m + h) * 32 + lane) * 16, wq[m][h] + wu * 4);
                    mt_cps<4>(sa + (128 + lane) * 16 + (2 * m + h) * 4, wsc[m][h] + wu * 4);
                }
            if (++wu == NU) wu = 0;
        }
        dev_cp_commit();
    };
    float d[NM][16][4];
#pragma unroll
    for (int m = 0; m < NM; m++)
#pragma unroll
        for (int j = 0; j < 16; j++) d[m][j][0] = d[m][j][1] = d[m][j][2] = d[m][j][3] = 0.0f;

    /* unit it (u: its place in its chunk of ng n-groups) */
    auto unit = [&](int it, int ng, int ng1) { /* (ng1: SC's chunk 1, 0 where it has no tokens) */
        const int s = it % MB_S;
        if (!PDEC) dev_cp_wait<MB_W - 2>();
        const unsigned char *ws = mb_sm + (wsa - sb) + (it % MB_W) * MB_WSTAGE;
        uint2 lut[NM][2];
        if constexpr (!PDEC) {
            const uint4 scw = *(const uint4 *)(ws + (128 + lane) * 16);
#pragma unroll
            for (int m = 0; m < NMW; m++)
#pragma unroll
                for (int h = 0; h < 2; h++) {
                    const int dl = er[m][h] - (int)(((&scw.x)[2 * m + h] >> (8 * c)) & 0xFFu);
                    lut[m][h] = *(const uint2 *)(tbl + 8 * (dl < 15 ? dl : 15));
                }
        } else {
            dev_mbar_wait(afullb + 8 * (it % MQ_NA), (it / MQ_NA) & 1);
        }
        /* the A fragments of matrix m (a[m]) */
        uint32_t a[NM][4][4];
        auto dec = [&](int m) {
            if constexpr (PDEC) { /* the producer's, then (matrix 1's loaded) the stage released */
                const unsigned char *ab = mb_sm + MQ_SMEM + (it % MQ_NA) * MQ_ASTAGE + (warp * 256 + lane) * 16;
#pragma unroll
                for (int ks = 0; ks < 4; ks++) {
                    const uint4 v = *(const uint4 *)(ab + (m * 4 + ks) * 512);
                    a[m][ks][0] = v.x, a[m][ks][1] = v.y, a[m][ks][2] = v.z, a[m][ks][3] = v.w;
                }
                if (m == NM - 1) {
                    __syncwarp();
                    if (lane == 0) dev_mbar_arrive(aemptyb + 8 * (it % MQ_NA));
                }
            } else {
#pragma unroll
                for (int ks = 0; ks < 4; ks++) {
                    const uint32_t w0 = *(const uint32_t *)(ws + ((2 * m) * 32 + lane) * 16 + 4 * ks);
                    const uint32_t w1 = *(const uint32_t *)(ws + ((2 * m + 1) * 32 + lane) * 16 + 4 * ks);
                    mq_dec(w0, lut[m][0], a[m][ks][0], a[m][ks][2]);
                    mq_dec(w1, lut[m][1], a[m][ks][1], a[m][ks][3]);
                }
            }
        };
        /* (not PIPE: matrix 0's A before the x stage's wait, which it does not need; matrix 1's there too, or while
         * matrix 0's first wgmmas run, spills: 32 bytes) */
        if constexpr (!PIPE) dec(0);
        dev_mbar_wait(fullb + 8 * s, (it / MB_S) & 1);
        const uint64_t desc00 = wg_desc(sb + s * STG, 128, 256); /* (+ 16 ng a k-step: ng 256 bytes; + 128: n-group 8) */
#pragma unroll
        for (int m = 0; m < NM; m++) {
            /* SC: chunk m's part of the stage (chunk 1 at its second half), one A set */
            const int ngm = SC && m ? ng1 : ng, am = SC ? 0 : m;
            if (SC && m && !ngm) break;
            const uint64_t desc0 = SC && m ? desc00 + (uint64_t)(MQ_STAGE >> 4) : desc00;
            const float *sx = (const float *)(mb_sm + s * STG + (SC && m ? MQ_STAGE : 0) + ngm * 1024);
            const int two = ngm > 8;
            if (!SC && (PIPE || m)) dec(m);
            /* tokens 64 hf + 8 j + 2 c and + 1 of half hf: t x their act-quant scales of this unit added to d[m] */
            /* half hf's act-quant scales, loaded before the wait for its wgmmas (session 46: the promotions' FFMA
             * waiting on these loads after the wait was the kernel's most sampled stall) */
            auto scales = [&](int hf, float2 (&f)[8]) {
#pragma unroll
                for (int j = 0; j < 8; j++) f[j] = *(const float2 *)(sx + 64 * hf + 8 * j + 2 * c);
            };
            auto promote = [&](int hf, float (&t)[8][4], const float2 (&fs)[8]) {
#pragma unroll
                for (int j = 0; j < 8; j++)
#pragma unroll
                    for (int k = 0; k < 4; k++) wg_keep(t[j][k]);
#pragma unroll
                for (int j = 0; j < 8; j++) {
                    const float2 f = fs[j];
                    float (&dd)[4] = d[m][8 * hf + j];
                    dd[0] = fmaf(t[j][0], f.x, dd[0]), dd[1] = fmaf(t[j][1], f.y, dd[1]);
                    dd[2] = fmaf(t[j][2], f.x, dd[2]), dd[3] = fmaf(t[j][3], f.y, dd[3]);
                }
            };
            if constexpr (!PIPE) {
                /* the halves of 64 tokens one after the other (one set of 32 accumulators); the other warpgroup's
                 * wgmmas run meanwhile */
#pragma unroll
                for (int hf = 0; hf < 2; hf++) {
                    if (hf && !two) break;
                    float t[8][4];
                    wg_fence();
#pragma unroll
                    for (int ks = 0; ks < 4; ks++) mq_mma(t, a[am][ks], desc0 + (uint64_t)(ks * 16 * ngm + 128 * hf), ks);
                    wg_commit();
                    /* the weight copies between the commit and the wait (moe_bf16.cuh: the wait covers their address
                     * registers) */
                    if (m == 0 && hf == 0) wissue(it + MB_W - 1);
                    float2 f[8];
                    scales(hf, f);
                    wg_wait<0>();
                    promote(hf, t, f);
                }
            } else {
                /* PIPE: both halves' wgmmas in flight (two sets of 32 accumulators), half 0 promoted while half 1's run
                 * (two static paths: with the second half's wgmmas and waits under a condition, ptxas serialized them) */
                if (two) {
                    float t0[8][4], t1[8][4];
                    wg_fence();
#pragma unroll
                    for (int ks = 0; ks < 4; ks++) mq_mma(t0, a[am][ks], desc0 + (uint64_t)(ks * 16 * ngm), ks);
                    wg_commit();
#pragma unroll
                    for (int ks = 0; ks < 4; ks++) mq_mma(t1, a[am][ks], desc0 + (uint64_t)(ks * 16 * ngm + 128), ks);
                    wg_commit();
                    if (m == 0) wissue(it + MB_W - 1);
                    float2 f[8]; /* (PIPE: the scales after the waits, as before: loaded earlier its instances spill 168 bytes) */
                    wg_wait<1>(), scales(0, f), promote(0, t0, f);
                    wg_wait<0>(), scales(1, f), promote(1, t1, f);
                } else {
                    float t0[8][4];
                    wg_fence();
#pragma unroll
                    for (int ks = 0; ks < 4; ks++) mq_mma(t0, a[am][ks], desc0 + (uint64_t)(ks * 16 * ngm), ks);
                    wg_commit();
                    if (m == 0) wissue(it + MB_W - 1);
                    float2 f[8];
                    wg_wait<0>(), scales(0, f), promote(0, t0, f);
                }
            }
#pragma unroll
            for (int ks = 0; ks < 4; ks++)
#pragma unroll
                for (int k = 0; k < 4; k++) wg_keep(a[am][ks][k]);
        }
        __syncwarp();
        if (lane == 0) dev_mbar_arrive(emptyb + 8 * s); /* this warp's reads of the stage are done */
    };

    /* the rows' factors 2^(E_r - 133) (exact: E8M0 scales past 2^-120 keep it normal) */
    float fr[NM][2];
#pragma unroll
    for (int m = 0; m < NMW; m++)
#pragma unroll
        for (int h = 0; h < 2; h++) fr[m][h] = ldexpf(1.0f, er[m][h] - 133);
    auto epilogue = [&](int cp) {
        const int t0 = cp * 128, nv = cnt - t0 < 128 ? cnt - t0 : 128;
        if constexpr (!GATEUP) {
            float *y = (float *)P.out;
#pragma unroll
            for (int m = 0; m < NM; m++)
#pragma unroll
                for (int j = 0; j < 16; j++)
#pragma unroll
                    for (int k = 0; k < 4; k++) {
                        const int tp = 8 * j + 2 * c + (k & 1);
                        if constexpr (SC) { /* chunk m of the super chunk cp, one tile */
                            const int tm = 256 * cp + 128 * m, nvm = cnt - tm < 128 ? cnt - tm : 128;
                            if (tp < nvm) y[(int64_t)(off + tm + tp) * P.R + rb + rl + 8 * (k >> 1)] = __fmul_rn(d[m][j][k], fr[0][k >> 1]);
                        } else if (tp < nv)
                            y[(int64_t)(off + t0 + tp) * P.R + rb + 128 * m + rl + 8 * (k >> 1)] = __fmul_rn(d[m][j][k], fr[m][k >> 1]);
                    }
        } else {
            asm volatile("bar.sync 1, 256;" ::: "memory");
#pragma unroll
            for (int j = 0; j < 16; j++) {
                float mx[2];
#pragma unroll
                for (int e = 0; e < 2; e++) {
                    const int tp = 8 * j + 2 * c + e;
                    const float rw = rws[tp];
#pragma unroll
                    for (int h = 0; h < 2; h++)
                        d[0][j][2 * h + e] = dev_swiglu(__fmul_rn(d[0][j][2 * h + e], fr[0][h]), __fmul_rn(d[1][j][2 * h + e], fr[1][h]), P.lim, rw);
                    float v = tp < nv ? fmaxf(fabsf(d[0][j][e]), fabsf(d[0][j][2 + e])) : 0.0f;
                    v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 4));
                    v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 8));
                    mx[e] = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 16));
                }
                if (g == 0) red[warp * 128 + 8 * j + 2 * c] = mx[0], red[warp * 128 + 8 * j + 2 * c + 1] = mx[1];
            }
            asm volatile("bar.sync 1, 256;" ::: "memory");
            const int ng = (nv + 7) >> 3;
            uint8_t *hb = (uint8_t *)P.out + ((int64_t)off + 8 * ia + t0) * mq_rowb(P.R) + (int64_t)blockIdx.x * ng * 1056;
            if (tid < 128) { /* mt_quant<1>'s scale; the image's scale of token tid */
                float am = 1e-4f;
#pragma unroll
                for (int w8 = 0; w8 < 8; w8++) am = fmaxf(am, red[w8 * 128 + tid]);
                const float sc = dev_pow2_ceil(am * (1.0f / 448.0f));
                scs[tid] = sc, scsi[tid] = 1.0f / sc;
                if (tid < nv) *(float *)(hb + ng * 1024 + 4 * tid) = sc;
            }
            asm volatile("bar.sync 1, 256;" ::: "memory");
#pragma unroll
            for (int j = 0; j < 16; j++)
#pragma unroll
                for (int k = 0; k < 4; k++) {
                    const int tp = 8 * j + 2 * c + (k & 1);
                    if (tp < nv) hb[mq_off(mq_logical(rl + 8 * (k >> 1)), tp, ng)] = mq_q8(d[0][j][k], scsi[tp]);
                }
        }
    };

#pragma unroll 1
    for (int v = 0; v < MB_W - 1; v++) wissue(v);
    for (int cl = 0, it = 0; cl < npb; cl++) {
        const int t0 = (z + cl * Z) * (SC ? 256 : 128), ng = ((cnt - t0 < 128 ? cnt - t0 : 128) + 7) >> 3;
        const int ng1 = SC && cnt > t0 + 128 ? ((cnt - t0 - 128 < 128 ? cnt - t0 - 128 : 128) + 7) >> 3 : 0;
        if (GATEUP && tid < 128) rws[tid] = t0 + tid < cnt ? P.p.rw[off + t0 + tid] : 0.0f;
#pragma unroll
        for (int m = 0; m < NM; m++)
#pragma unroll
            for (int j = 0; j < 16; j++) d[m][j][0] = d[m][j][1] = d[m][j][2] = d[m][j][3] = 0.0f;
        for (int u = 0; u < NU; u++, it++) unit(it, ng, ng1);
        epilogue(z + cl * Z);
    }
}

/* 3. The same sums in passes of 64 tokens (DSV4_MOE_PFB_F8=3): a chunk of 128 tokens is worked in two passes over its
 * units (one when it has 64 tokens or fewer), each with 64 x 2 accumulators (64 registers), so that a temporary set and
 * an A set per matrix fit: a unit issues matrix 0's wgmmas, then (decoding matrix 1's A meanwhile) matrix 1's, promotes
 * matrix 0's sums once they are done while matrix 1's run, decodes the next unit's matrix-0 A, then waits for matrix
 * 1's: one drain of the warpgroup's wgmmas a unit (mq_kernel: two or four). The weights are decoded once a pass (twice a
 * full chunk). The x ring's stages hold a pass's half of a chunk-unit: four 2-KB copies (k-step s's 8 n-groups) and the
 * half's scales, 8 n-groups x 1056 bytes at most (MQH_STAGE), six stages. The wgmmas (m64n64k32) and the promotions are
 * mq_kernel's, in the same order: the same bits. (A first form kept a group in flight across the units' loop, each
 * matrix's promotion under the other's next wgmmas: ptxas serialized its wgmmas, C7513 / C7514, in every variant tried;
 * within one iteration, as here, it does not.) */
#define MQH_S 6
#define MQH_STAGE 8448
#define MQH_SMEM (MQH_S * MQH_STAGE + 2 * MQH_S * 8 + 8 * 128 * 4 + 3 * 128 * 4 + MQ_TBL + 8 * MB_W * MB_WSTAGE)
template <int GATEUP>
__global__ void __launch_bounds__(MB_PTHREADS, 1) mqh_kernel(const __grid_constant__ mb_params P) {
    constexpr int NM = 2;
    extern __shared__ __align__(128) unsigned char mb_sm[];
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, c = lane & 3;
    const int ia = blockIdx.y;
    if (ia >= *P.p.nact) return;
    const int ex = P.p.act_e[ia], off = P.p.act_off[ia], cnt = P.p.act_cnt[ia];
    const int C = P.C, NU = C / 128, Z = gridDim.z, z = blockIdx.z, npb = ((cnt + 127) >> 7) - z > 0 ? (((cnt + 127) >> 7) - z + Z - 1) / Z : 0;
    if (!npb) return;
    const unsigned sb = (unsigned)__cvta_generic_to_shared(mb_sm), fullb = sb + MQH_S * MQH_STAGE, emptyb = fullb + MQH_S * 8;
    float *red = (float *)(mb_sm + MQH_S * MQH_STAGE + 2 * MQH_S * 8), *scs = red + 8 * 128, *scsi = scs + 128, *rws = scsi + 128;
    uint8_t *tbl = (uint8_t *)(rws + 128);
    if (tid == 0) {
        for (int s = 0; s < MQH_S; s++) dev_mbar_init(fullb + 8 * s, 1), dev_mbar_init(emptyb + 8 * s, 8);
        dev_mbar_fence_init();
    }
    if (tid < MQ_TBL) {
        const int dl = tid >> 3, m = tid & 7;
        const float v = dl < 15 ? ldexpf(0.5f * (float)((0xC8643210u >> (4 * m)) & 15), 6 - dl) : 0.0f;
        tbl[tid] = (uint8_t)__nv_cvt_float_to_fp8(v, __NV_SATFINITE, __NV_E4M3);
    }
    __syncthreads();
    const int64_t rowb = mq_rowb(C);
    const uint8_t *img = P.img + ((int64_t)off + 8 * ia) * rowb;
    if (warp >= 8) { /* the producer: pass by pass, unit by unit, the pass's half of the chunk-unit */
        asm volatile("setmaxnreg.dec.sync.aligned.u32 24;\n" ::: "memory");
        if (warp == 8) {
            int it = 0;
            for (int cl = 0; cl < npb; cl++) {
                const int t0 = (z + cl * Z) * 128, nv = cnt - t0 < 128 ? cnt - t0 : 128, ng = (nv + 7) >> 3;
                for (int hf = 0; hf < 1 + (nv > 64); hf++) {
                    const int ngh = ng - 8 * hf < 8 ? ng - 8 * hf : 8;
                    for (int u = 0; u < NU; u++, it++) {
                        const int s = it % MQH_S;
                        if (it >= MQH_S) dev_mbar_wait(emptyb + 8 * s, ((it / MQH_S) - 1) & 1);
                        if (lane == 0) {
                            const uint8_t *cu = img + (int64_t)t0 * rowb + (int64_t)u * ng * 1056;
                            const unsigned st = sb + s * MQH_STAGE;
                            dev_mbar_expect(fullb + 8 * s, (unsigned)ngh * 1056);
#pragma unroll
                            for (int ks = 0; ks < 4; ks++)
                                dev_bulk_g2s(st + ks * ngh * 256, cu + (ks * ng + 8 * hf) * 256, (unsigned)ngh * 256, fullb + 8 * s);
                            dev_bulk_g2s(st + ngh * 1024, cu + ng * 1024 + hf * 256, (unsigned)ngh * 32, fullb + 8 * s);
                        }
                        __syncwarp();
                    }
                }
            }
        }
        return;
    }
    asm volatile("setmaxnreg.inc.sync.aligned.u32 240;\n" ::: "memory");
    const int wgi = warp >> 2, rl = 64 * wgi + 16 * (warp & 3) + g, rb = blockIdx.x * (GATEUP ? 128 : 256);
    const uint4 *wq[NM][2];
    const uint8_t *wsc[NM][2];
    int er[NM][2];
#pragma unroll
    for (int m = 0; m < NM; m++) {
        const dsv4_cuda_weight &w = GATEUP && m ? P.WB[ex] : P.WA[ex];
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const int64_t r = (int64_t)w.row0 + rb + (GATEUP ? 0 : 128 * m) + rl + 8 * h;
            wq[m][h] = (const uint4 *)w.data + r * (C / 32) + c;
            wsc[m][h] = w.scale + r * w.scale_stride;
            uint32_t mx = 0u;
            for (int i = c; i < NU; i += 4) mx = __vmaxu4(mx, ((const uint32_t *)wsc[m][h])[i]);
            mx = __vmaxu4(mx, mx >> 16);
            mx = __vmaxu4(mx, mx >> 8) & 0xFFu;
            mx = max(mx, (uint32_t)__shfl_xor_sync(0xffffffffu, mx, 1));
            er[m][h] = (int)max(mx, (uint32_t)__shfl_xor_sync(0xffffffffu, mx, 2));
        }
    }
    const unsigned wsa = sb + MQH_S * MQH_STAGE + 2 * MQH_S * 8 + 8 * 128 * 4 + 3 * 128 * 4 + MQ_TBL + warp * MB_W * MB_WSTAGE;
    const int n = [&] { /* units over all passes */
        int k = 0;
        for (int cl = 0; cl < npb; cl++) k += NU * (1 + (cnt - (z + cl * Z) * 128 > 64));
        return k;
    }();
    int wu = 0;
    auto wissue = [&](int v) {
        if (v < n) {
            const unsigned sa = wsa + (v % MB_W) * MB_WSTAGE;
#pragma unroll
            for (int m = 0; m < NM; m++)
#pragma unroll
                for (int h = 0; h < 2; h++) {
                    mt_cp16s(sa + ((2 * m + h) * 32 + lane) * 16, wq[m][h] + wu * 4);
                    mt_cps<4>(sa + (128 + lane) * 16 + (2 * m + h) * 4, wsc[m][h] + wu * 4);
                }
            if (++wu == NU) wu = 0;
        }
        dev_cp_commit();
    };
    float d[NM][8][4];
    float t[NM][8][4];
    uint32_t a[NM][4][4];
    float fr[NM][2];
#pragma unroll
    for (int m = 0; m < NM; m++)
#pragma unroll
        for (int h = 0; h < 2; h++) fr[m][h] = ldexpf(1.0f, er[m][h] - 133);
    /* matrix m's A fragments of unit it (its weights in the ring) */
    auto decode = [&](int m, int it) {
        const unsigned char *ws = mb_sm + (wsa - sb) + (it % MB_W) * MB_WSTAGE;
        const uint4 scw = *(const uint4 *)(ws + (128 + lane) * 16);
        uint2 lut[2];
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const int dl = er[m][h] - (int)(((&scw.x)[2 * m + h] >> (8 * c)) & 0xFFu);
            lut[h] = *(const uint2 *)(tbl + 8 * (dl < 15 ? dl : 15));
        }
#pragma unroll
        for (int ks = 0; ks < 4; ks++) {
            const uint32_t w0 = *(const uint32_t *)(ws + ((2 * m) * 32 + lane) * 16 + 4 * ks);
            const uint32_t w1 = *(const uint32_t *)(ws + ((2 * m + 1) * 32 + lane) * 16 + 4 * ks);
            mq_dec(w0, lut[0], a[m][ks][0], a[m][ks][2]);
            mq_dec(w1, lut[1], a[m][ks][1], a[m][ks][3]);
        }
    };
    /* matrix m's wgmmas of unit it (stage it % MQH_S, ngh n-groups) into t[m] */
    auto issue = [&](int m, int it, int ngh) {
        const uint64_t desc0 = wg_desc(sb + (it % MQH_S) * MQH_STAGE, 128, 256);
        wg_fence();
        mq_mma0(t[m], a[m][0], desc0);
#pragma unroll
        for (int ks = 1; ks < 4; ks++) mq_mma1(t[m], a[m][ks], desc0 + (uint64_t)(ks * 16 * ngh));
        wg_commit();
    };
    /* t[m] (done) x the act-quant scales of unit it's tokens added to d[m] */
    auto promote = [&](int m, int it, int ngh) {
#pragma unroll
        for (int j = 0; j < 8; j++)
#pragma unroll
            for (int k = 0; k < 4; k++) wg_keep(t[m][j][k]);
#pragma unroll
        for (int ks = 0; ks < 4; ks++)
#pragma unroll
            for (int k = 0; k < 4; k++) wg_keep(a[m][ks][k]);
        const float *sx = (const float *)(mb_sm + (it % MQH_S) * MQH_STAGE + ngh * 1024);
#pragma unroll
        for (int j = 0; j < 8; j++) {
            const float2 f = *(const float2 *)(sx + 8 * j + 2 * c);
            float (&dd)[4] = d[m][j];
            dd[0] = fmaf(t[m][j][0], f.x, dd[0]), dd[1] = fmaf(t[m][j][1], f.y, dd[1]);
            dd[2] = fmaf(t[m][j][2], f.x, dd[2]), dd[3] = fmaf(t[m][j][3], f.y, dd[3]);
        }
    };
    auto release = [&](int it) {
        __syncwarp();
        if (lane == 0) dev_mbar_arrive(emptyb + 8 * (it % MQH_S));
    };
    /* the pass's 64 tokens from t0 (nh of them) */
    auto epilogue = [&](int t0, int hf, int nh, int ng) {
        if constexpr (!GATEUP) {
            float *y = (float *)P.out;
#pragma unroll
            for (int m = 0; m < NM; m++)
#pragma unroll
                for (int j = 0; j < 8; j++)
#pragma unroll
                    for (int k = 0; k < 4; k++) {
                        const int tp = 8 * j + 2 * c + (k & 1);
                        if (tp < nh) y[(int64_t)(off + t0 + 64 * hf + tp) * P.R + rb + 128 * m + rl + 8 * (k >> 1)] = __fmul_rn(d[m][j][k], fr[m][k >> 1]);
                    }
        } else {
            asm volatile("bar.sync 1, 256;" ::: "memory");
#pragma unroll
            for (int j = 0; j < 8; j++) {
                float mx[2];
#pragma unroll
                for (int e = 0; e < 2; e++) {
                    const int tp = 8 * j + 2 * c + e;
                    const float rw = rws[64 * hf + tp];
#pragma unroll
                    for (int h = 0; h < 2; h++)
                        d[0][j][2 * h + e] = dev_swiglu(__fmul_rn(d[0][j][2 * h + e], fr[0][h]), __fmul_rn(d[1][j][2 * h + e], fr[1][h]), P.lim, rw);
                    float v = tp < nh ? fmaxf(fabsf(d[0][j][e]), fabsf(d[0][j][2 + e])) : 0.0f;
                    v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 4));
                    v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 8));
                    mx[e] = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 16));
                }
                if (g == 0) red[warp * 128 + 8 * j + 2 * c] = mx[0], red[warp * 128 + 8 * j + 2 * c + 1] = mx[1];
            }
            asm volatile("bar.sync 1, 256;" ::: "memory");
            uint8_t *hb = (uint8_t *)P.out + ((int64_t)off + 8 * ia + t0) * mq_rowb(P.R) + (int64_t)blockIdx.x * ng * 1056;
            if (tid < 64) {
                float am = 1e-4f;
#pragma unroll
                for (int w8 = 0; w8 < 8; w8++) am = fmaxf(am, red[w8 * 128 + tid]);
                const float sc = dev_pow2_ceil(am * (1.0f / 448.0f));
                scs[tid] = sc, scsi[tid] = 1.0f / sc;
                if (tid < nh) *(float *)(hb + ng * 1024 + 4 * (64 * hf + tid)) = sc;
            }
            asm volatile("bar.sync 1, 256;" ::: "memory");
#pragma unroll
            for (int j = 0; j < 8; j++)
#pragma unroll
                for (int k = 0; k < 4; k++) {
                    const int tp = 8 * j + 2 * c + (k & 1);
                    if (tp < nh) hb[mq_off(mq_logical(rl + 8 * (k >> 1)), 64 * hf + tp, ng)] = mq_q8(d[0][j][k], scsi[tp]);
                }
        }
    };

#pragma unroll 1
    for (int v = 0; v < MB_W - 1; v++) wissue(v);
    int it = 0;
    dev_cp_wait<MB_W - 2>();
    decode(0, 0);
    for (int cl = 0; cl < npb; cl++) {
        const int t0 = (z + cl * Z) * 128, nv = cnt - t0 < 128 ? cnt - t0 : 128, ng = (nv + 7) >> 3;
        if (GATEUP && tid < 128) rws[tid] = t0 + tid < cnt ? P.p.rw[off + t0 + tid] : 0.0f;
        for (int hf = 0; hf < 1 + (nv > 64); hf++) {
            const int nh = nv - 64 * hf < 64 ? nv - 64 * hf : 64, ngh = (nh + 7) >> 3;
#pragma unroll
            for (int m = 0; m < NM; m++)
#pragma unroll
                for (int j = 0; j < 8; j++) d[m][j][0] = d[m][j][1] = d[m][j][2] = d[m][j][3] = 0.0f;
            /* unit u (its matrix-0 A decoded by the unit before, or above): matrix 0's wgmmas, matrix 1's A and wgmmas,
             * matrix 0's promotion under matrix 1's wgmmas, the next unit's matrix-0 A, matrix 1's promotion */
            for (int u = 0; u < NU; u++, it++) {
                dev_mbar_wait(fullb + 8 * (it % MQH_S), (it / MQH_S) & 1);
                issue(0, it, ngh);
                wissue(it + MB_W - 1);
                decode(1, it);
                issue(1, it, ngh);
                wg_wait<1>(), promote(0, it, ngh);
                dev_cp_wait<MB_W - 2>();
                decode(0, it + 1);
                wg_wait<0>(), promote(1, it, ngh), release(it);
            }
            epilogue(t0, hf, nh, ng);
        }
    }
}

/* dsv4_moe_pf8_check's kernel: a warp a row of (expert e = blockIdx.y, matrix blockIdx.z: w1, w3, w2): E_r, then every
 * group more than 14 binades below it must hold zeros (codes 0 and 8) only; a violation sets *bad */
__global__ void mq_check_kernel(const dsv4_cuda_weight *w1, const dsv4_cuda_weight *w3, const dsv4_cuda_weight *w2, int *bad) {
    const dsv4_cuda_weight &w = blockIdx.z == 0 ? w1[blockIdx.y] : blockIdx.z == 1 ? w3[blockIdx.y] : w2[blockIdx.y];
    const int r = blockIdx.x * 8 + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    if (r >= w.rows) return;
    const int ngr = w.cols / 32;
    const uint8_t *sc = w.scale + ((int64_t)w.row0 + r) * w.scale_stride;
    unsigned mx = 0;
    for (int i = lane; i < ngr; i += 32) mx = max(mx, (unsigned)sc[i]);
#pragma unroll
    for (int o = 16; o; o >>= 1) mx = max(mx, __shfl_xor_sync(0xffffffffu, mx, o));
    const uint4 *q = (const uint4 *)w.data + ((int64_t)w.row0 + r) * (w.cols / 32);
    int b = 0;
    for (int i = lane; i < ngr; i += 32)
        if ((int)mx - (int)sc[i] > 14) {
            const uint4 v = q[i];
            b |= ((v.x | v.y | v.z | v.w) & 0x77777777u) != 0;
        }
    b |= mx < 7 || mx == 255; /* (the row factor 2^(E_r - 133) a normal float; no NaN scale) */
    if (__any_sync(0xffffffffu, b) && lane == 0) atomicOr(bad, 1);
}
