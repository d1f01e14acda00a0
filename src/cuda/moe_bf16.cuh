/* moe_bf16.cuh - the routed experts of a prefill pass on BF16 tensor cores (included by moe_tc.cu; run by
 * dsv4_moe_pfb_run for passes, never for decode steps): MXFP4 or NVFP4 weights (mb_kernel's NV) with the FP8 act quant,
 * every product exact.
 *
 * Why: the FP8 kernel (moe_f8.cuh) must promote every 32-column group (one E8M0 scale each) out of the tensor core
 * into fp32, 64 FFMA a group at 64 tokens, which keeps it near 190 TFLOP/s in the prefill (bench/NOTES.md, sessions
 * 19-24). Here both operands are exact BF16 values: a weight e2m1 x 2^(e - 127) (e2m1 has 2 significant bits, any E8M0
 * scale up to 2^125 fits bf16's exponent) and an activation e4m3 code x its power-of-two act-quant scale (4 significant
 * bits); their products are exact and the tensor core sums them in fp32 over all the columns, so no promotion at all.
 * The sums are the exact products added in fp32, as the CPU engine's dsv4_cpu_linear, only in another order; they are
 * not the FP8 decode kernels' bits (a decode step never comes here, so decode steps stay batch invariant; in a pass a
 * token's outputs depend on its own row only: the k-order is fixed and each column of D is its own).
 *
 * Three launches a pass:
 *  1. mb_ximage_kernel: each slot's x row act-quantized (mt_quant<1>'s rule: the codes every other path makes) and
 *     written as bf16 values into an image in the order the tensor cores read (below), in y (scratch until the down
 *     projection).
 *  2. mb_kernel<1> (gate / up): a block is 128 rows of w1 and the same 128 rows of w3 (so 128 columns of h, one unit
 *     of the down projection) of one active expert, over the expert's tokens in chunks of 128 (N = 128).
 *     Two warpgroups (64 rows each) hold the two accumulators (64 x 128 each, wgmma m64n128k16); warp 0 also streams
 *     the x image unit by unit (one cp.async.bulk a unit into a 4-stage ring, mbarriers full / empty: a stage is
 *     refilled once all 8 warps' wgmmas that read it are done; PROD: a third warpgroup's warp 8 streams it instead,
 *     DSV4_MOE_PFB_PRODUCER=1). Each thread copies its own weights (cp.async, a
 *     4-stage ring per warp) and decodes them into the A fragments (wgmma A from registers); the k-steps' wgmmas run
 *     one behind the decode (two A register sets). D and I multiples of 256.
 *     The epilogue applies the SwiGLU and the routing weight, act-quantizes h per token over the block's 128 columns
 *     (the unit of the down projection: the same amax, scale and codes as mt_quant<1>) and writes h's image into h.
 *  3. mb_kernel<0> (down): the same with w2's rows 256 b .. 256 b + 127 and 256 b + 128 .. as the two accumulators and
 *     the h image; y [slots, D] fp32, as the other kernels leave it.
 *
 * The A operand's k-order: lane (g, c) of a warp holds 32 consecutive columns (its 16-byte chunk of a row's unit,
 * group c, one E8M0 scale) for rows g and g + 8; k-step s takes nibbles i and i + 4 of word s / 2 (i = 2 (s & 1) and
 * + 1) as one bf16x2 register each, so logical column 16 s + q of a unit is physical column
 * 32 c + 8 (s >> 1) + 2 (s & 1) + (q >> 3) + 4 (q & 1) with c = (q & 7) >> 1; the x image holds the columns in that
 * logical order (mb_logical is the inverse). A nibble becomes a bf16 with one shift pair and a mask: its three
 * magnitude bits at bf16 bits 6-8 read as e2m1 x 2^-126 (a subnormal for e2m1's 0.5), times 2^(e - 1) (mul.rn.bf16x2,
 * exact) gives e2m1 x 2^(e - 127); scales above 2^1 take a second factor (E8M0 codes above 252, scales past 2^125,
 * would overflow bf16: not in any checkpoint's range, as for moe_f8.cuh's 248).
 *
 * The image of a chunk (128 slots of one expert, ng = ceil(tokens / 8) groups of 8) and unit: [k-step 8][n-group ng]
 * [k half 2][8 tokens][8 bf16], i.e. the K-major core matrices of wgmma's B (LBO 128, SBO 256); an expert's chunks
 * from row act_off + 8 a of the image (rows of 2 C bytes; at most T K + 8 E rows), chunk j at + 128 j rows, unit u at
 * + u ng 2048 bytes. A stage of the ring is a chunk's unit as it lies in the image (one bulk copy of ng 2048 bytes):
 * k-step s's B at s ng 256 bytes; wgmma reads 16 n-groups from there, those past ng (the next k-step's, or older
 * units') only into columns of D that are never stored. (Session 25's chunks of 64 took 16 copies a unit, which the
 * compiler issues one lane at a time: ~1,000 cycles of warp 0 a unit, holding back its warpgroup; session 26.) */
#pragma once

#include <type_traits>

#include "mbarrier.cuh"

#define MB_S 4          /* stages of the x ring */
#define MB_STAGE 32768  /* bytes of a stage: 8 k-steps x 16 n-groups x 256 */
#define MB_THREADS 256  /* two warpgroups; warp 0 also issues the x copies (PROD: MB_PTHREADS, below) */
#define MB_W 4           /* stages of each warp's weight ring (cp.async) */
#define MB_WSTAGE 2560  /* bytes of a warp's weight stage: [4 row chunks + the scale words][32 lanes][16 bytes] */
#define MB_SMEM (MB_S * MB_STAGE + 2 * MB_S * 8 + 8 * 128 * 4 + 3 * 128 * 4 + 8 * MB_W * MB_WSTAGE)

/* logical position in a unit of physical column p (0..127) */
__device__ __forceinline__ int mb_logical(int p) {
    const int c = p >> 5, n = p & 31;
    return 16 * (2 * (n >> 3) + ((n >> 1) & 1)) + 8 * (n & 1) + 2 * c + ((n >> 2) & 1);
}
/* byte of logical column L of token t (0..127) in an image chunk-unit of ng n-groups */
__device__ __forceinline__ int mb_off(int L, int t, int ng) {
    return (((L >> 4) * ng + (t >> 3)) * 2 + ((L >> 3) & 1)) * 128 + (t & 7) * 16 + (L & 7) * 2;
}

/* v times m, two bf16 each */
__device__ __forceinline__ uint32_t mb_mul(uint32_t v, uint32_t m) {
    uint32_t r;
    asm("mul.rn.bf16x2 %0, %1, %2;" : "=r"(r) : "r"(v), "r"(m));
    return r;
}
/* nibbles i and i + 4 of w as a bf16x2 (low half nibble i) times m (two bf16 factors) */
template <int I> __device__ __forceinline__ uint32_t mb_dec(uint32_t w, uint32_t m) {
    const uint32_t t = w >> (4 * I);
    return mb_mul(((t << 6) & 0x01C001C0u) | ((t << 12) & 0x80008000u), m);
}

/* d (64 x NN fp32: d[0 .. NN / 8 - 1], NN / 8 n-tiles) = (acc ? d : 0) + A (registers) . B (descriptor), wgmma
 * m64nNNk16 bf16; NN 128 the full chunk, 32 / 64 / 96 a chunk of at most that many tokens: the n-tiles
 * past them are neither computed nor stored (d's registers are the same for every NN: tile j is d[j]); mb_kernel's NSZ
 * instances pick it a chunk */
template <int NN>
__device__ __forceinline__ void mb_mma(float (&d)[16][4], const uint32_t (&a)[4], uint64_t desc, int acc) {
    static_assert(NN == 32 || NN == 64 || NN == 96 || NN == 128, "wgmma N of a chunk");
#define MB_D4(n) "+f"(d[n][0]), "+f"(d[n][1]), "+f"(d[n][2]), "+f"(d[n][3])
    if constexpr (NN == 32)
        asm volatile("{ .reg .pred p; setp.ne.b32 p, %21, 0;\n"
                     "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {"
                     "%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15"
                     "}, {%16,%17,%18,%19}, %20, p, 1, 1, 0; }"
                     : MB_D4(0), MB_D4(1), MB_D4(2), MB_D4(3)
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(acc)
                     : "memory");
    if constexpr (NN == 64)
        asm volatile("{ .reg .pred p; setp.ne.b32 p, %37, 0;\n"
                     "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {"
                     "%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,"
                     "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31"
                     "}, {%32,%33,%34,%35}, %36, p, 1, 1, 0; }"
                     : MB_D4(0), MB_D4(1), MB_D4(2), MB_D4(3), MB_D4(4), MB_D4(5), MB_D4(6), MB_D4(7)
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(acc)
                     : "memory");
    if constexpr (NN == 96)
        asm volatile("{ .reg .pred p; setp.ne.b32 p, %53, 0;\n"
                     "wgmma.mma_async.sync.aligned.m64n96k16.f32.bf16.bf16 {"
                     "%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,"
                     "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,"
                     "%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47"
                     "}, {%48,%49,%50,%51}, %52, p, 1, 1, 0; }"
                     : MB_D4(0), MB_D4(1), MB_D4(2), MB_D4(3), MB_D4(4), MB_D4(5), MB_D4(6), MB_D4(7),
                       MB_D4(8), MB_D4(9), MB_D4(10), MB_D4(11)
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(acc)
                     : "memory");
    if constexpr (NN == 128)
        asm volatile("{ .reg .pred p; setp.ne.b32 p, %69, 0;\n"
                     "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {"
                     "%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,"
                     "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,"
                     "%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,"
                     "%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63"
                     "}, {%64,%65,%66,%67}, %68, p, 1, 1, 0; }"
                     : MB_D4(0), MB_D4(1), MB_D4(2), MB_D4(3), MB_D4(4), MB_D4(5), MB_D4(6), MB_D4(7),
                       MB_D4(8), MB_D4(9), MB_D4(10), MB_D4(11), MB_D4(12), MB_D4(13), MB_D4(14), MB_D4(15)
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(acc)
                     : "memory");
#undef MB_D4
}

/* v's FP8 act quant with its block's scale s (a power of two; inv = 1 / s), as mt_quant<1>: RNE to e4m3 of v / s
 * clamped to +-448, then its value code x s as a bf16 (exact) */
__device__ __forceinline__ uint16_t mb_q8(float v, float s, float inv) {
    const float y = fminf(fmaxf(__fmul_rn(v, inv), -448.0f), 448.0f);
    const __nv_fp8_storage_t b = __nv_cvt_float_to_fp8(y, __NV_SATFINITE, __NV_E4M3);
    return __bfloat16_as_ushort(__float2bfloat16_rn(dev_e4m3(b) * s));
}

/* 1. the x image of a pass: a warp takes a slot (active expert blockIdx.y) and two units at a time, lane l the
 * 16-byte core-matrix row pc = l & 15 of unit u0 + (l >> 4), i.e. k-step pc >> 1, k half pc & 1: its 8 physical
 * columns 32 (kk >> 1) + 8 (s >> 1) + 2 (s & 1) + h + 4 (kk & 1), act-quantized as mt_quant<1> does (the unit's amax
 * over the 16 lanes, its power-of-two scale, RNE to e4m3), written as one 16-byte store of bf16 values (exact) */
__device__ __forceinline__ int mb_phys(int pc, int kk) {
    const int s = pc >> 1;
    return 32 * (kk >> 1) + 8 * (s >> 1) + 2 * (s & 1) + (pc & 1) + 4 * (kk & 1);
}
/* lane pc's 16-byte piece of slot j (of an active expert: image rows from off + 8 ia, cnt slots) for unit 0 (unit u at
 * + u ng 2048), and the slot's chunk's n-groups ng */
__device__ __forceinline__ uint8_t *mb_slot_piece(uint8_t *img, int off, int ia, int C, int j, int cnt, int pc, int &ng) {
    const int ch = j >> 7, t = j & 127, rest = cnt - ch * 128;
    ng = ((rest < 128 ? rest : 128) + 7) >> 3;
    return img + ((int64_t)off + 8 * ia) * C * 2 + (int64_t)ch * 128 * C * 2 +
           (size_t)((((pc >> 1) * ng + (t >> 3)) * 2 + (pc & 1)) * 128 + (t & 7) * 16);
}
/* this lane's values of units u0 + uh and u0 + 2 + uh (v[r]: unit u0 + 2 r + uh; zeros past NU) of row xr */
__device__ __forceinline__ void mb_load2(const float *xr, int u0, int NU, int pc, int uh, float (&v)[2][8]) {
#pragma unroll
    for (int r = 0; r < 2; r++)
#pragma unroll
        for (int kk = 0; kk < 8; kk++) {
            const int u = u0 + 2 * r + uh;
            v[r][kk] = u < NU ? xr[u * 128 + mb_phys(pc, kk)] : 0.0f;
        }
}
/* one unit's piece from its 16 lanes' values: the unit's amax over the 16 lanes, its power-of-two scale, the codes as
 * bf16 values */
__device__ __forceinline__ uint4 mb_piece(const float (&v)[8]) {
    float a = 1e-4f;
#pragma unroll
    for (int kk = 0; kk < 8; kk++) a = fmaxf(a, fabsf(v[kk]));
#pragma unroll
    for (int o = 1; o < 16; o <<= 1) a = fmaxf(a, __shfl_xor_sync(0xffffffffu, a, o));
    const float sc = dev_pow2_ceil(a * (1.0f / 448.0f)), inv = 1.0f / sc;
    uint32_t w[4];
#pragma unroll
    for (int kk = 0; kk < 8; kk += 2) w[kk >> 1] = (uint32_t)mb_q8(v[kk], sc, inv) | ((uint32_t)mb_q8(v[kk + 1], sc, inv) << 16);
    return make_uint4(w[0], w[1], w[2], w[3]);
}

/* a row's pieces (this lane's of every unit), two unit pairs' loads in flight: store(u, piece) for each unit u < NU */
template <typename F> __device__ __forceinline__ void mb_row_pieces(const float *xr, int NU, int pc, int uh, F store) {
    for (int u0 = 0; u0 < NU; u0 += 4) {
        float v[2][8];
        mb_load2(xr, u0, NU, pc, uh, v);
#pragma unroll
        for (int r = 0; r < 2; r++) {
            const int u = u0 + 2 * r + uh;
            const uint4 w = mb_piece(v[r]);
            if (u < NU) store(u, w);
        }
    }
}

__global__ void __launch_bounds__(256) mb_ximage_kernel(const float *x, dsv4_cuda_moe_plan p, int C, uint8_t *img) {
    const int ia = blockIdx.y;
    if (ia >= *p.nact) return;
    const int off = p.act_off[ia], cnt = p.act_cnt[ia], NU = C / 128, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int pc = lane & 15, uh = lane >> 4;
    for (int j = blockIdx.x * 8 + warp; j < cnt; j += gridDim.x * 8) {
        const float *xr = x + (int64_t)p.rows[off + j] * C;
        int ng;
        uint8_t *cb = mb_slot_piece(img, off, ia, C, j, cnt, pc, ng);
        mb_row_pieces(xr, NU, pc, uh, [&](int u, uint4 w) { *(uint4 *)(cb + (int64_t)u * ng * 2048) = w; });
    }
}

/* 1'. The same image a token at a time (DSV4_MOE_PFB_XTOK=1; off by default: slower on an H200, NOTES "Session 30"): warp t % 8 of block t / 8
 * reads token t's row once and writes its pieces (the same codes: one row, one act quant) to each of its slots
 * (tslot; a slot's active expert by a binary search of act_off), instead of reading and quantizing the row once a slot
 * (K times: Flash's 6 x 64 MB a 4096-row pass) */
#define MB_XK 8 /* the most slots a token here (V4: 6; more: mb_ximage_kernel) */
__global__ void __launch_bounds__(256, 3) mb_ximage_tok_kernel(const float *x, dsv4_cuda_moe_plan p, int T, int K, int C, uint8_t *img) {
    const int t = blockIdx.x * 8 + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    if (t >= T) return;
    const int NU = C / 128, pc = lane & 15, uh = lane >> 4, na = *p.nact;
    uint8_t *cb[MB_XK]; /* (fixed indices: registers) */
    int ngs[MB_XK], ns = 0;
#pragma unroll
    for (int k = 0; k < MB_XK; k++) {
        cb[k] = NULL, ngs[k] = 0;
        const int sl = k < K ? p.tslot[(int64_t)t * K + k] : -1;
        if (sl < 0) continue;
        int lo = 0, hi = na - 1; /* the last active expert whose slots start at or before sl */
        while (lo < hi) {
            const int mid = (lo + hi + 1) >> 1;
            if (p.act_off[mid] <= sl) lo = mid;
            else hi = mid - 1;
        }
        cb[k] = mb_slot_piece(img, p.act_off[lo], lo, C, sl - p.act_off[lo], p.act_cnt[lo], pc, ngs[k]);
        ns++;
    }
    if (!ns) return;
    mb_row_pieces(x + (int64_t)t * C, NU, pc, uh, [=](int u, uint4 w) {
#pragma unroll
        for (int k = 0; k < MB_XK; k++)
            if (cb[k]) *(uint4 *)(cb[k] + (int64_t)u * ngs[k] * 2048) = w;
    });
}

struct mb_params {
    const dsv4_cuda_weight *WA, *WB; /* device [E]; WB: w3 (gate / up) */
    const uint8_t *img;              /* the input's image (x in y, or h's in h) */
    dsv4_cuda_moe_plan p;
    float lim;
    void *out; /* gate / up: h's image (rows of 2 R bytes); down: y [slots, R] fp32 */
    int R, C;
    long long *trc; /* the clock trace (mb_kernel's TR instances only): [MB_TRB blocks][3 roles][MB_TRN] */
};

/* Clock trace (DSV4_MOE_PFB_TRACE=FILE, measurement only; the TR instances, with the producer warpgroup): lane 0 of
 * warps 0 and 4 (the consumer warpgroups) and 8 (the producer) of the blocks with blockIdx.x == 0, blockIdx.z == 0 and
 * an active-expert slot that is a multiple of 16 write (clock64 << 4) | tag: 1 a unit's start, 2 its x stage in (the
 * full barrier passed), 3 its last k-step's wait done, 4 / 5 an epilogue's start / end; the producer 6 before a stage's
 * empty barrier, 7 its copy issued. Slot k of the buffer: [k][role][MB_TRN], stamp 0 the warp's start (bench/mb_trace.py
 * summarizes). */
#define MB_TRB 16
#define MB_TRN 2048

/* PROD: a third warpgroup whose warp 8 streams the x ring (setmaxnreg: 24 registers there, 240 for the consumers),
 * so that warp 0's refills (~570 cycles a unit, which its warpgroup's next wgmma waited for: session 26's trace) leave
 * the consumers' path (DSV4_MOE_PFB_PRODUCER, on by default since session 30); PROD 0: warp 0 refills as it releases */
#define MB_PTHREADS 384
/* NV: NVFP4 weights (e2m1 x an E4M3 scale per 16 columns x the matrix's F32 scale2): a nibble's bf16 times
 * s 2^119 (one factor per 16 columns, exact: s has 4 significant bits, 448 2^119 < 2^128) is e2m1 s 2^-7, exact in bf16
 * (2 x 4 significant bits, 2^-17 .. 21); the sums are scaled by 2^7 scale2 at the end. Lane c's 32 columns are scale
 * groups 2 c and 2 c + 1 (k-steps 0-3 and 4-7); it copies the 4 bytes holding them (a unit's 8 scales: bytes
 * 4 (c >> 1) ..), so its weight stage is MXFP4's */
template <int GATEUP, int PROD, int TR = 0, int NV = 0, int NSZ = 0>
__global__ void __launch_bounds__(PROD ? MB_PTHREADS : MB_THREADS, 1) mb_kernel(const __grid_constant__ mb_params P) {
    constexpr int NM = 2; /* gate / up: w1 and w3 on the block's 128 rows; down: w2's rows 256 b .. and 256 b + 128 .. */
    extern __shared__ __align__(128) unsigned char mb_sm[];
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, c = lane & 3;
    const int ia = blockIdx.y;
    if (ia >= *P.p.nact) return;
    const int ex = P.p.act_e[ia], off = P.p.act_off[ia], cnt = P.p.act_cnt[ia];
    /* chunks blockIdx.z, + gridDim.z, ... (a hot expert's chunks side by side) */
    const int C = P.C, NU = C / 128, Z = gridDim.z, z = blockIdx.z, npb = ((cnt + 127) >> 7) - z > 0 ? (((cnt + 127) >> 7) - z + Z - 1) / Z : 0;
    if (!npb) return;
    const int n = npb * NU;
    long long *trp = NULL; /* this thread's trace row (TR) */
    int trk = 1;
    if (TR && P.trc && lane == 0 && blockIdx.x == 0 && blockIdx.z == 0 && ia % 16 == 0 && ia / 16 < MB_TRB &&
        (warp == 0 || warp == 4 || warp == 8)) {
        trp = P.trc + ((int64_t)(ia / 16) * 3 + warp / 4) * MB_TRN;
        trp[0] = clock64() << 4;
    }
    auto trs = [&](int tag) {
        if (TR && trp && trk < MB_TRN) trp[trk++] = (clock64() << 4) | tag;
    };
    const unsigned sb = (unsigned)__cvta_generic_to_shared(mb_sm), fullb = sb + MB_S * MB_STAGE, emptyb = fullb + MB_S * 8;
    /* the epilogue's: per warp and token its largest |h|, per token the act-quant scale and its inverse, the routing
     * weights of the chunk's tokens */
    float *red = (float *)(mb_sm + MB_S * MB_STAGE + 2 * MB_S * 8), *scs = red + 8 * 128, *scsi = scs + 128, *rws = scsi + 128;
    if (tid == 0) {
        for (int s = 0; s < MB_S; s++) dev_mbar_init(fullb + 8 * s, 1), dev_mbar_init(emptyb + 8 * s, 8);
        dev_mbar_fence_init();
    }
    __syncthreads();
    const int64_t rowb = (int64_t)C * 2; /* bytes of an image row */
    const uint8_t *img = P.img + ((int64_t)off + 8 * ia) * rowb;
    /* warp 0: unit it of chunk it / NU into stage it % MB_S once its last reader released it, one bulk copy. (Refills
     * by whichever warp released a stage last, through a counter in shared memory, measured slower: the atomics sat on
     * every warp's chain; session 25.) */
    int pu = 0, pcl = 0; /* the next unit to produce: its place in its chunk, its chunk (calls come in order) */
    auto produce = [&](int it) {
        const int s = it % MB_S, t0 = (z + pcl * Z) * 128;
        const int ng = ((cnt - t0 < 128 ? cnt - t0 : 128) + 7) >> 3;
        trs(6);
        if (it >= MB_S) dev_mbar_wait(emptyb + 8 * s, ((it / MB_S) - 1) & 1);
        trs(7);
        if (lane == 0) {
            dev_mbar_expect(fullb + 8 * s, (unsigned)ng * 2048);
            dev_bulk_g2s(sb + s * MB_STAGE, img + (int64_t)t0 * rowb + (int64_t)pu * ng * 2048, (unsigned)ng * 2048, fullb + 8 * s);
        }
        __syncwarp();
        if (++pu == NU) pu = 0, pcl++;
    };
    if (PROD) {
        if (warp >= 8) {
            asm volatile("setmaxnreg.dec.sync.aligned.u32 24;\n" ::: "memory");
            if (warp == 8)
                for (int it = 0; it < n; it++) produce(it);
            return;
        }
        asm volatile("setmaxnreg.inc.sync.aligned.u32 240;\n" ::: "memory");
    } else if (warp == 0) {
        for (int it = 0; it < MB_S && it < n; it++) produce(it);
    }
    /* consumers: warpgroup wgi's rows 64 wgi .. of the block's 128; this thread's rows rl and rl + 8 */
    const int wgi = warp >> 2, rl = 64 * wgi + 16 * (warp & 3) + g, rb = blockIdx.x * (GATEUP ? 128 : 256);
    const uint4 *wq[NM][2];
    const uint8_t *wsc[NM][2]; /* the rows' scale words (a unit's four groups) */
#pragma unroll
    for (int m = 0; m < NM; m++) {
        const dsv4_cuda_weight &w = GATEUP && m ? P.WB[ex] : P.WA[ex];
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const int64_t r = (int64_t)w.row0 + rb + (GATEUP ? 0 : 128 * m) + rl + 8 * h;
            wq[m][h] = (const uint4 *)w.data + r * (C / 32) + c;
            wsc[m][h] = w.scale + r * w.scale_stride + (NV ? 4 * (c >> 1) : 0);
        }
    }
    /* this thread's weights of unit v (of the block's sequence; columns v % NU) into its warp's ring, stage v % MB_W:
     * its 16-byte chunks (m, h) at [2 m + h][lane], the scale words at [4][lane][2 m + h]; one commit group a unit
     * (empty past the last), so that cp.async.wait_group counts units: loads in registers a unit ahead shared their
     * scoreboards with the next unit's, which then waited for those (ncu, session 25) */
    const unsigned wsa = sb + MB_S * MB_STAGE + 2 * MB_S * 8 + 8 * 128 * 4 + 3 * 128 * 4 + warp * MB_W * MB_WSTAGE;
    int wu = 0; /* the columns (unit) of the next weight copies (calls come in order) */
    auto wissue = [&](int v) {
        if (v < n) {
            const unsigned sa = wsa + (v % MB_W) * MB_WSTAGE;
#pragma unroll
            for (int m = 0; m < NM; m++)
#pragma unroll
                for (int h = 0; h < 2; h++) {
                    mt_cp16s(sa + ((2 * m + h) * 32 + lane) * 16, wq[m][h] + wu * 4);
                    mt_cps<4>(sa + (128 + lane) * 16 + (2 * m + h) * 4, wsc[m][h] + wu * (NV ? 8 : 4));
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
    /* the A fragments of (k-step s, matrix m) in set (2 s + m) & 3 (kept live across units): one commit group a k-step
     * (both matrices), k-step s's sets written while s - 1's wgmmas run (one group a matrix, three in flight, measured
     * no faster: bench/NOTES.md session 25) */
    uint32_t a[4][4];
#pragma unroll
    for (int e = 0; e < 4; e++) a[e][0] = a[e][1] = a[e][2] = a[e][3] = 0u;
    /* unit it - 1's stage released (its wgmmas are done); warp 0 refills it with unit it - 1 + MB_S. (Refilling the
     * stage released a unit earlier instead, whose barrier is long complete, measured no faster: the refill's own
     * instructions, not the wait, cost warp 0 ~400 cycles a unit; session 26) */
    auto release = [&](int it) {
        __syncwarp();
        if (lane == 0) dev_mbar_arrive(emptyb + 8 * ((it - 1) % MB_S));
        if (!PROD && warp == 0 && it - 1 + MB_S < n) produce(it - 1 + MB_S);
    };

    /* NVFP4: the sums' factors 2^7 scale2 (w1 / w2, and w3) */
    const float fsa = NV ? P.WA[ex].scale2 * 128.0f : 1.0f, fsb = NV && GATEUP ? P.WB[ex].scale2 * 128.0f : 1.0f;
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
                        if (tp < nv) y[(int64_t)(off + t0 + tp) * P.R + rb + 128 * m + rl + 8 * (k >> 1)] = NV ? __fmul_rn(d[m][j][k], fsa) : d[m][j][k];
                    }
        } else {
        /* h = SwiGLU x routing weight into d[0] (the weights from rws, written at the chunk's start: one load a token
         * there instead of 32 global loads a thread here, each ahead of a call of the noinline mt_swiglu; with
         * dev_swiglu inline, 0.985x on the 8K prefill; session 26); per token its largest |h| over the block's 128
         * columns */
        asm volatile("bar.sync 1, 256;" ::: "memory");
#pragma unroll
        for (int j = 0; j < 16; j++) {
            float mx[2];
#pragma unroll
            for (int e = 0; e < 2; e++) {
                const int tp = 8 * j + 2 * c + e;
                const float rw = rws[tp];
                if (NV) {
                    d[0][j][e] = __fmul_rn(d[0][j][e], fsa), d[1][j][e] = __fmul_rn(d[1][j][e], fsb);
                    d[0][j][2 + e] = __fmul_rn(d[0][j][2 + e], fsa), d[1][j][2 + e] = __fmul_rn(d[1][j][2 + e], fsb);
                }
                d[0][j][e] = dev_swiglu(d[0][j][e], d[1][j][e], P.lim, rw);
                d[0][j][2 + e] = dev_swiglu(d[0][j][2 + e], d[1][j][2 + e], P.lim, rw);
                float v = tp < nv ? fmaxf(fabsf(d[0][j][e]), fabsf(d[0][j][2 + e])) : 0.0f;
                v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 4));
                v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 8));
                mx[e] = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 16));
            }
            if (g == 0) red[warp * 128 + 8 * j + 2 * c] = mx[0], red[warp * 128 + 8 * j + 2 * c + 1] = mx[1];
        }
        asm volatile("bar.sync 1, 256;" ::: "memory");
        if (tid < 128) { /* mt_quant<1>'s scale: the amax floor 1e-4, 2^ceil(log2(amax / 448)) */
            float am = 1e-4f;
#pragma unroll
            for (int w8 = 0; w8 < 8; w8++) am = fmaxf(am, red[w8 * 128 + tid]);
            const float sc = dev_pow2_ceil(am * (1.0f / 448.0f));
            scs[tid] = sc, scsi[tid] = 1.0f / sc; /* (exact: a power of two) */
        }
        asm volatile("bar.sync 1, 256;" ::: "memory");
        uint8_t *himg = (uint8_t *)P.out + ((int64_t)off + 8 * ia + t0) * P.R * 2;
#pragma unroll
        for (int j = 0; j < 16; j++)
#pragma unroll
            for (int k = 0; k < 4; k++) {
                const int tp = 8 * j + 2 * c + (k & 1);
                if (tp < nv) {
                    const uint16_t v = mb_q8(d[0][j][k], scs[tp], scsi[tp]);
                    const int ng = (nv + 7) >> 3;
                    *(uint16_t *)(himg + (int64_t)blockIdx.x * ng * 2048 + mb_off(mb_logical(rl + 8 * (k >> 1)), tp, ng)) = v;
                }
            }
        }
    };

    /* unit it (u: its place in its chunk of ng n-groups): its weights from the ring (at k-step 1, unit it + MB_W - 1's
     * copies into the stage read at it - 1), the x stage it % MB_S */
    auto unit = [&](auto nnc, int it, int u, int ng) {
        constexpr int NN = decltype(nnc)::value;
        const int s = it % MB_S;
        trs(1);
        dev_cp_wait<MB_W - 2>();
        const unsigned char *ws = mb_sm + (wsa - sb) + (it % MB_W) * MB_WSTAGE;
        uint4 q[NM][2];
#pragma unroll
        for (int m = 0; m < NM; m++)
#pragma unroll
            for (int h = 0; h < 2; h++) q[m][h] = *(const uint4 *)(ws + ((2 * m + h) * 32 + lane) * 16);
        const uint4 scw = *(const uint4 *)(ws + (128 + lane) * 16);
        uint32_t mul[NM][2][NV ? 2 : 1], mul2[NM][2];
        bool big = false;
#pragma unroll
        for (int m = 0; m < NM; m++)
#pragma unroll
            for (int h = 0; h < 2; h++) {
                if constexpr (NV) { /* groups 2 c, 2 c + 1: bytes 2 (c & 1) and + 1 of the word */
#pragma unroll
                    for (int q2 = 0; q2 < (NV ? 2 : 1); q2++) {
                        const uint32_t e = ((&scw.x)[2 * m + h] >> (16 * (c & 1) + 8 * q2)) & 0xFFu;
                        const uint32_t f = __float_as_uint(dev_e4m3((uint8_t)e) * 0x1p119f) >> 16;
                        mul[m][h][q2] = f | (f << 16);
                    }
                    mul2[m][h] = 0u;
                } else {
                    const uint32_t e = ((&scw.x)[2 * m + h] >> (8 * c)) & 0xFFu, lo = e <= 128u ? e + 126u : 254u, hi = e <= 128u ? 127u : e - 1u;
                    mul[m][h][0] = (lo << 7) | (lo << 23), mul2[m][h] = (hi << 7) | (hi << 23);
                    big |= e > 128u;
                }
            }
        if (!NV) big = __any_sync(0xffffffffu, big);
        dev_mbar_wait(fullb + 8 * s, (it / MB_S) & 1);
        trs(2);
        const uint64_t desc0 = wg_desc(sb + s * MB_STAGE, 128, 256); /* (+ 16 ng a k-step: ng 256 bytes) */
#pragma unroll
        for (int ks = 0; ks < 8; ks++) {
            const uint64_t desc = desc0 + (uint64_t)(ks * 16 * ng);
#pragma unroll
            for (int m = 0; m < NM; m++) {
                uint32_t (&A)[4] = a[(2 * ks + m) & 3];
                const uint32_t w0 = (&q[m][0].x)[ks >> 1], w1 = (&q[m][1].x)[ks >> 1];
                const int sg = NV ? ks >> 2 : 0; /* NVFP4: k-steps 0-3 the lane's first group of 16, 4-7 its second */
                if (ks & 1) {
                    A[0] = mb_dec<2>(w0, mul[m][0][sg]), A[2] = mb_dec<3>(w0, mul[m][0][sg]);
                    A[1] = mb_dec<2>(w1, mul[m][1][sg]), A[3] = mb_dec<3>(w1, mul[m][1][sg]);
                } else {
                    A[0] = mb_dec<0>(w0, mul[m][0][sg]), A[2] = mb_dec<1>(w0, mul[m][0][sg]);
                    A[1] = mb_dec<0>(w1, mul[m][1][sg]), A[3] = mb_dec<1>(w1, mul[m][1][sg]);
                }
                if (!NV && big) {
                    A[0] = mb_mul(A[0], mul2[m][0]), A[2] = mb_mul(A[2], mul2[m][0]);
                    A[1] = mb_mul(A[1], mul2[m][1]), A[3] = mb_mul(A[3], mul2[m][1]);
                }
            }
            wg_fence();
#pragma unroll
            for (int m = 0; m < NM; m++) mb_mma<NN>(d[m], a[(2 * ks + m) & 3], desc, u != 0 || ks != 0);
            wg_commit();
            /* the weight copies between the commit and the wait: the wait covers the copies' reads of their address
             * registers, which the next k-step's decode may reuse (after the wait they stalled it: ncu, session 26) */
            if (ks == 1) wissue(it + MB_W - 1);
            wg_wait<1>(); /* k-step ks - 1's wgmmas are done: its A sets may be written again, its stage released */
#pragma unroll
            for (int m = 0; m < NM; m++)
#pragma unroll
                for (int k = 0; k < 4; k++) wg_keep(a[(2 * ks + 2 + m) & 3][k]);
            if (ks == 0 && it > 0) release(it);
        }
        trs(3);
    };
#pragma unroll 1
    for (int v = 0; v < MB_W - 1; v++) wissue(v);
    for (int cl = 0, it = 0; cl < npb; cl++) {
        const int t0 = (z + cl * Z) * 128, ng = ((cnt - t0 < 128 ? cnt - t0 : 128) + 7) >> 3;
        if (GATEUP && tid < 128) /* (read after the epilogue's first barrier; the last reads of the previous chunk's
                                  * were before its second) */
            rws[tid] = t0 + tid < cnt ? P.p.rw[off + t0 + tid] : 0.0f;
        /* the chunk's units with wgmmas N wide (a whole loop a width: the accumulation runs across the units) */
        auto units = [&](auto nnc) {
            for (int u = 0; u < NU; u += 2, it += 2) { /* (NU is even) */
                unit(nnc, it, u, ng);
                unit(nnc, it + 1, u + 1, ng);
            }
        };
        if constexpr (!NSZ) units(std::integral_constant<int, 128>{});
        else {
            /* gate / up N 32 / 64 / 96 / 128; the down projection 64 / 128 only (with all four its instances spilled 80
             * bytes against the default's 4; with two, 8) */
            const int nn = ng > 12 ? 128 : ng > 8 ? (GATEUP ? 96 : 128) : ng > 4 || !GATEUP ? 64 : 32;
            if (nn == 128) units(std::integral_constant<int, 128>{});
            else if (nn == 64) units(std::integral_constant<int, 64>{});
            else if constexpr (GATEUP) {
                if (nn == 96) units(std::integral_constant<int, 96>{});
                else units(std::integral_constant<int, 32>{});
            }
        }
        /* (the epilogue outside the units' loop: on every path through that loop the accumulators are in flight) */
        wg_wait<0>();
#pragma unroll
        for (int m = 0; m < NM; m++)
#pragma unroll
            for (int j = 0; j < 16; j++)
#pragma unroll
                for (int k = 0; k < 4; k++) wg_keep(d[m][j][k]);
        trs(4);
        epilogue(z + cl * Z);
        trs(5);
    }
}
