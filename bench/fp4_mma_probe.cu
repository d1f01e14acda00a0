/* fp4_mma_probe.cu - a measurement for the routed experts' decode kernels (issue 5): MXFP4 weights against FP8 (e4m3)
 * activations on the tensor cores, two ways, in a stripped-down streaming GEMM (no experts, no ring; every warp a 16-row
 * tile over all K columns, register double buffering of the weight loads, x staged once a block):
 *   f16  the current kernels' way (moe_tc.cu, linear_tc.cuh): e2m1 re-packed as e4m3, converted to f16 (F2FP), times
 *        the group's f16 factor 2^(e - emax) (HMUL2), mma.sync m16n8k16 f16 -> fp32 into the unit's accumulator, added
 *        at the unit's end times 2^emax (the unit: 128 columns, four groups of 32);
 *   e4m3 the re-packed e4m3 codes straight into mma.sync m16n8k32 e4m3 -> fp32, one mma a group (a group's 32 values in
 *        one k-step: the weights laid out so that a lane's 16-byte load holds one word of each of the unit's four
 *        groups), each group's fp32 result times its scale into the accumulator (FFMA): no F2FP, no HMUL2, half the
 *        mma, x read as the e4m3 codes.
 * It prints each way's time and weight bandwidth for 8 and 16 tokens against the device-to-device copy rate, and each
 * way's error against a double-precision reference of the same codes (the e4m3 tensor-core sums are known to keep
 * ~13 mantissa bits: that error is the price of the second way). "wgmma k128 *" runs a unit's four groups as one wgmma
 * chain with one scale (wrong values unless a unit's group scales are equal: its speed is the ceiling of promoting once a
 * unit, its error column meaningless).
 *   nvcc -O3 -gencode arch=compute_90a,code=sm_90a -o fp4_mma_probe bench/fp4_mma_probe.cu && ./fp4_mma_probe [rows [way]]
 *   (way: only the ways whose name contains it)
 *   (or make -f bench/Makefile fp4-mma-probe)
 * Results and what they mean: bench/NOTES.md, session 17. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../src/cuda/linear_tc.cuh" /* tc_ld_stream, tc_e2m1x8_f16x2, tc_hmul2, tc_mma: the decode kernels' own */
#include "../src/cuda/wgmma.cuh"     /* wg_desc, the fences, wg_keep */

dsv4_cuda_props dsv4_cuda_dev; /* common.cuh declares it (unused here) */

#define K 2048 /* the down projection's columns (Flash); x of 16 tokens as f16 then fits three blocks an SM */
#define NU (K / 128)
#define XPAD 32 /* bytes of padding per staged token row (conflict-free 8- and 16-byte fragment reads) */

#define CK(x)                                                                                                          \
    do {                                                                                                               \
        cudaError_t e_ = (x);                                                                                          \
        if (e_ != cudaSuccess) {                                                                                       \
            fprintf(stderr, "fp4_mma_probe: %s: %s (line %d)\n", #x, cudaGetErrorString(e_), __LINE__);               \
            exit(1);                                                                                                   \
        }                                                                                                              \
    } while (0)

/* 8 e2m1 nibbles (value 8c + i at bits 4i) -> two words of e4m3 codes carrying 2^-6: lo the even nibbles (bytes j:
 * nibble 2j), hi the odd ones (nibble 2j + 1); e4m3 = sign << 7 | magnitude bits << 2 (tc_e2m1x8_f16x2's bytes,
 * before its conversion to f16) */
__device__ __forceinline__ void repack(uint32_t w, uint32_t &lo, uint32_t &hi) {
    const uint32_t t = w << 2;
    lo = (t & 0x1C1C1C1Cu) | ((t << 2) & 0x80808080u);
    hi = ((w >> 2) & 0x1C1C1C1Cu) | (w & 0x80808080u);
}

__device__ __forceinline__ void mma_e4m3(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0, uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%10,%10,%10,%10};"
                 : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1), "f"(0.0f));
}

/* the weights' layouts: row-major (the checkpoint's, as the kernels read it today: a row's 1 KB in order, so a warp's
 * 16-byte loads of a unit touch 16 rows, 64 bytes each, 1 KB apart), or tiled (TL: per 16-row tile and unit, the 16
 * rows' 64 bytes together, 1 KB contiguous: a warp's load of a unit half is 512 contiguous bytes), or interleaved (TL 2:
 * per 8-row group and unit the 8 rows' 64 bytes together, 512 bytes: the same warp loads, the two halves of a 16-row
 * tile in two streams). wbase: the scale word of (row r, unit 0); unit u adds u, 16 u or 8 u scale words (wustride),
 * 4x that in 16-byte weight quads. */
template <int TL> __device__ __forceinline__ size_t wbase(int r) {
    return TL == 1 ? (size_t)(r >> 4) * NU * 16 + (r & 15) : TL == 2 ? (size_t)(r >> 3) * NU * 8 + (r & 7) : (size_t)r * NU;
}
template <int TL> __host__ __device__ constexpr int wustride() { return TL == 1 ? 16 : TL == 2 ? 8 : 1; }

/* The register kernels' weight stream of one lane: rows r0, r1 (= r0 + 8), quad c, their scale words; D units in flight
 * ahead of the one handed out (ptxas places the loads as it likes: D > 1 measured the same as 1). Called with
 * compile-time u (fully unrolled loops), so the arrays stay in registers. */
template <int D, int TL> struct reg_stream {
    const uint4 *w0, *w1;
    const uint32_t *s0, *s1;
    uint4 qa[NU], qb[NU];
    uint32_t ea[NU], eb[NU];
    __device__ __forceinline__ void load(int u) {
        constexpr int US = wustride<TL>(); /* a unit's stride in scale words (x 4: in weight quads) */
        qa[u] = tc_ld_stream(w0 + u * US * 4), qb[u] = tc_ld_stream(w1 + u * US * 4), ea[u] = __ldg(s0 + u * US), eb[u] = __ldg(s1 + u * US);
    }
    __device__ __forceinline__ reg_stream(const uint4 *W, const uint32_t *S, int r0, int r1, int c)
        : w0(W + wbase<TL>(r0) * 4 + c), w1(W + wbase<TL>(r1) * 4 + c), s0(S + wbase<TL>(r0)), s1(S + wbase<TL>(r1)) {
#pragma unroll
        for (int u = 0; u < D; u++) load(u);
    }
    /* unit u's words of both rows and their scale words; starts the loads of unit u + D */
    __device__ __forceinline__ void next(int u, uint32_t (&wa)[4], uint32_t (&wb)[4], uint32_t &f0, uint32_t &f1) {
        if (u + D < NU) load(u + D);
        wa[0] = qa[u].x, wa[1] = qa[u].y, wa[2] = qa[u].z, wa[3] = qa[u].w;
        wb[0] = qb[u].x, wb[1] = qb[u].y, wb[2] = qb[u].z, wb[3] = qb[u].w;
        f0 = ea[u], f1 = eb[u];
    }
};

/* one 128-column unit of the f16 way: rows g and g + 8 (words wa, wb; scale words f0, f1) against the NT x 8 staged
 * tokens (f16, LD bytes a row), summed at the unit's end into acc */
template <int NT, int LD>
__device__ __forceinline__ void unit_f16(float (&acc)[NT][4], const uint32_t (&wa)[4], const uint32_t (&wb)[4], uint32_t f0, uint32_t f1,
                                         const uint8_t *xs, int u, int g, int c) {
    /* each row's largest group exponent; the groups' f16 factors 2^(e - emax + 6) (the codes carry 2^-6) */
    const int m0 = max(max((int)__byte_perm(f0, 0u, 0x4440u), (int)__byte_perm(f0, 0u, 0x4441u)),
                       max((int)__byte_perm(f0, 0u, 0x4442u), (int)(f0 >> 24)));
    const int m1 = max(max((int)__byte_perm(f1, 0u, 0x4440u), (int)__byte_perm(f1, 0u, 0x4441u)),
                       max((int)__byte_perm(f1, 0u, 0x4442u), (int)(f1 >> 24)));
    float ua[NT][4];
#pragma unroll
    for (int n = 0; n < NT; n++) ua[n][0] = ua[n][1] = ua[n][2] = ua[n][3] = 0.0f;
#pragma unroll
    for (int G = 0; G < 4; G++) {
        const uint32_t h0 = (uint32_t)((int)__byte_perm(f0, 0u, 0x4440u + G) - m0 + 6 + 15) * 0x04000400u;
        const uint32_t h1 = (uint32_t)((int)__byte_perm(f1, 0u, 0x4440u + G) - m1 + 6 + 15) * 0x04000400u;
        uint32_t r0[4], r1[4]; /* {e0, e2}, {e4, e6}, {e1, e3}, {e5, e7} of rows g, g + 8 */
        tc_e2m1x8_f16x2(wa[G], r0);
        tc_e2m1x8_f16x2(wb[G], r1);
        const uint32_t A0 = tc_hmul2(r0[0], h0), A1 = tc_hmul2(r1[0], h1), A2 = tc_hmul2(r0[1], h0), A3 = tc_hmul2(r1[1], h1);
        const uint32_t B0 = tc_hmul2(r0[2], h0), B1 = tc_hmul2(r1[2], h1), B2 = tc_hmul2(r0[3], h0), B3 = tc_hmul2(r1[3], h1);
#pragma unroll
        for (int n = 0; n < NT; n++) {
            const uint4 b = *(const uint4 *)(xs + (n * 8 + g) * LD + ((u * 4 + G) * 32 + c * 8) * 2);
            tc_mma<0>(ua[n], A0, A1, A2, A3, b.x, b.y);
            tc_mma<0>(ua[n], B0, B1, B2, B3, b.z, b.w);
        }
    }
    const float sc0 = __uint_as_float((uint32_t)m0 << 23), sc1 = __uint_as_float((uint32_t)m1 << 23);
#pragma unroll
    for (int n = 0; n < NT; n++) {
        acc[n][0] = fmaf(ua[n][0], sc0, acc[n][0]), acc[n][1] = fmaf(ua[n][1], sc0, acc[n][1]);
        acc[n][2] = fmaf(ua[n][2], sc1, acc[n][2]), acc[n][3] = fmaf(ua[n][3], sc1, acc[n][3]);
    }
}

/* weights: word ((r * NU + u) * 4 + c) * 4 + G holds values u * 128 + G * 32 + 8c + i (i = 0..7) of row r; scales: word
 * r * NU + u holds the E8M0 bytes of the unit's groups 0..3. x: [tokens][K + XPAD] bytes (e4m3) or halves (f16), each
 * (u, G, c) eight values in the order 8c + {0, 2, 4, 6, 1, 3, 5, 7}. y [tokens][R]. */
template <int NT, bool E4, int D = 1, int TL = 0> /* D: units whose weight loads are in flight ahead of the one computed */
__global__ void __launch_bounds__(256) probe_kernel(const uint4 *__restrict__ W, const uint32_t *__restrict__ S,
                                                    const void *__restrict__ xg, int R, float *__restrict__ y) {
    extern __shared__ __align__(16) uint8_t xs[];
    constexpr int XB = E4 ? 1 : 2, LD = (K + XPAD) * XB;
    const int tid = threadIdx.x;
    for (int i = tid; i < NT * 8 * K * XB / 16; i += 256) {
        const int n = i / (K * XB / 16), o = i % (K * XB / 16);
        *(uint4 *)(xs + n * LD + o * 16) = ((const uint4 *)xg)[i];
    }
    __syncthreads();
    const int warp = tid >> 5, lane = tid & 31, g = lane >> 2, c = lane & 3;
    for (int tile = blockIdx.x * 8 + warp; tile < R / 16; tile += gridDim.x * 8) {
        const int r0 = tile * 16 + g, r1 = r0 + 8;
        reg_stream<D, TL> rs(W, S, r0, r1, c);
        float acc[NT][4];
#pragma unroll
        for (int n = 0; n < NT; n++) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.0f;
#pragma unroll
        for (int u = 0; u < NU; u++) {
            uint32_t wa[4], wb[4], f0, f1;
            rs.next(u, wa, wb, f0, f1);
            if (E4) {
#pragma unroll
                for (int G = 0; G < 4; G++) {
                    uint32_t a0, a2, a1, a3;
                    repack(wa[G], a0, a2);
                    repack(wb[G], a1, a3);
                    /* the codes carry 2^-6: scale 2^(e - 127 + 6) */
                    const float sc0 = __uint_as_float((__byte_perm(f0, 0u, 0x4440u + G) + 6u) << 23);
                    const float sc1 = __uint_as_float((__byte_perm(f1, 0u, 0x4440u + G) + 6u) << 23);
#pragma unroll
                    for (int n = 0; n < NT; n++) {
                        const uint2 b = *(const uint2 *)(xs + (n * 8 + g) * LD + (u * 4 + G) * 32 + c * 8);
                        float d[4];
                        mma_e4m3(d, a0, a1, a2, a3, b.x, b.y);
                        acc[n][0] = fmaf(d[0], sc0, acc[n][0]), acc[n][1] = fmaf(d[1], sc0, acc[n][1]);
                        acc[n][2] = fmaf(d[2], sc1, acc[n][2]), acc[n][3] = fmaf(d[3], sc1, acc[n][3]);
                    }
                }
            } else {
                unit_f16<NT, LD>(acc, wa, wb, f0, f1, xs, u, g, c);
            }
        }
#pragma unroll
        for (int n = 0; n < NT; n++) {
            const int t0 = n * 8 + 2 * c;
            y[(size_t)t0 * R + r0] = acc[n][0], y[(size_t)(t0 + 1) * R + r0] = acc[n][1];
            y[(size_t)t0 * R + r1] = acc[n][2], y[(size_t)(t0 + 1) * R + r1] = acc[n][3];
        }
    }
}

/* the e4m3 way on Hopper's FP8 tensor-core path, wgmma m64nNk32 e4m3 (mma.sync m16n8k32 e4m3 above compiles on sm_90
 * to F2FP conversions and two f16 HMMA: no FP8 mma.sync there). A warpgroup takes a 64-row tile (warp w: rows 16 w ..,
 * the same per-lane words and re-pack as above, A from registers), B (x) from shared memory as K-major core matrices (8
 * tokens x 16 bytes; the k32 step's two along K 128 bytes apart, n-groups of 8 tokens 256 bytes apart); one wgmma a group
 * into a zeroed D (scale-d 0), each group's D times its scale into the accumulator while the next group's wgmma runs
 * (A and D double buffered: a wgmma reads and writes its registers asynchronously until its wait). */
template <int NT, int ACC = 0> /* ACC: D += A B (scale-d 1), else D = A B */
__device__ __forceinline__ void wg_e4m3(float (&d)[2][4], const uint32_t (&a)[4], uint64_t desc) {
    if (NT == 1)
        asm volatile("{ .reg .pred p; setp.ne.b32 p, %9, 0;\n"
                     "wgmma.mma_async.sync.aligned.m64n8k32.f32.e4m3.e4m3 {%0,%1,%2,%3}, {%4,%5,%6,%7}, %8, p, 1, 1; }"
                     : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "n"(ACC)
                     : "memory");
    else
        asm volatile("{ .reg .pred p; setp.ne.b32 p, %13, 0;\n"
                     "wgmma.mma_async.sync.aligned.m64n16k32.f32.e4m3.e4m3 {%0,%1,%2,%3,%4,%5,%6,%7}, {%8,%9,%10,%11}, %12, p, 1, 1; }"
                     : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]),
                       "+f"(d[1][3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "n"(ACC)
                     : "memory");
}
/* one 128-column unit of the wgmma way (the warpgroup's 64 rows; this warp's rows g and g + 8 from words wa, wb, scale
 * words f0, f1): one wgmma a group into a zeroed D, waited for at once (other warpgroups of the SM hide the latency),
 * then D times the group's scale into acc */
template <int NT>
__device__ __forceinline__ void unit_wg(float (&acc)[NT][4], const uint32_t (&wa)[4], const uint32_t (&wb)[4], uint32_t f0, uint32_t f1,
                                        unsigned xsa, int u) {
#pragma unroll
    for (int G = 0; G < 4; G++) {
        uint32_t A[4];
        float dt[2][4] = {};
        repack(wa[G], A[0], A[2]);
        repack(wb[G], A[1], A[3]);
        wg_fence();
        wg_e4m3<NT>(dt, A, wg_desc(xsa + (unsigned)((u * 4 + G) * NT * 256), 128, 256));
        wg_commit();
        wg_wait<0>();
        const float sc0 = __uint_as_float((__byte_perm(f0, 0u, 0x4440u + G) + 6u) << 23);
        const float sc1 = __uint_as_float((__byte_perm(f1, 0u, 0x4440u + G) + 6u) << 23);
#pragma unroll
        for (int n = 0; n < NT; n++) {
#pragma unroll
            for (int k = 0; k < 4; k++) wg_keep(dt[n][k]);
            acc[n][0] = fmaf(dt[n][0], sc0, acc[n][0]), acc[n][1] = fmaf(dt[n][1], sc0, acc[n][1]);
            acc[n][2] = fmaf(dt[n][2], sc1, acc[n][2]), acc[n][3] = fmaf(dt[n][3], sc1, acc[n][3]);
        }
    }
}

/* x staged once a block: f16 rows of LD bytes (the f16 way), or the e4m3 codes as wgmma core matrices
 * [K / 32][NT][2][8][16] (from the staged order, per (u, G, c): 8c + {0, 2, 4, 6} then {1, 3, 5, 7}: word h of lane c
 * goes to core matrix h) */
template <int NT, int LD>
__device__ __forceinline__ void stage_f16(uint8_t *xs, const void *xg) {
    for (int i = threadIdx.x; i < NT * 8 * K * 2 / 16; i += 256) {
        const int n = i / (K * 2 / 16), o = i % (K * 2 / 16);
        *(uint4 *)(xs + n * LD + o * 16) = ((const uint4 *)xg)[i];
    }
}
template <int NT>
__device__ __forceinline__ void stage_wg(uint8_t *xs, const uint32_t *xg) {
    for (int i = threadIdx.x; i < NT * 8 * K / 4; i += 256) {
        const int n = i / (K / 4), o = i % (K / 4), q = o / 8, c = (o % 8) / 2, h = o % 2;
        *(uint32_t *)(xs + ((q * NT + n / 8) * 2 + h) * 128 + (n % 8) * 16 + c * 4) = xg[i];
    }
    wg_fence_proxy();
}

template <int NT, int PIPE, int D = 1, int TL = 0>
__global__ void __launch_bounds__(256) probe_wg(const uint4 *__restrict__ W, const uint32_t *__restrict__ S,
                                                const uint32_t *__restrict__ xg, int R, float *__restrict__ y) {
    extern __shared__ __align__(16) uint8_t xs[]; /* [K / 32][NT][2][8][16] */
    const int tid = threadIdx.x;
    stage_wg<NT>(xs, xg);
    __syncthreads();
    const unsigned xsa = (unsigned)__cvta_generic_to_shared(xs);
    const int warp = tid >> 5, wg = warp >> 2, lane = tid & 31, g = lane >> 2, c = lane & 3;
    for (int tile = blockIdx.x * 2 + wg; tile < R / 64; tile += gridDim.x * 2) {
        const int r0 = tile * 64 + (warp & 3) * 16 + g, r1 = r0 + 8;
        reg_stream<D, TL> rs(W, S, r0, r1, c);
        float acc[NT][4], dt[2][2][4];
        uint32_t A[2][4];
        float scp0 = 0.0f, scp1 = 0.0f;
#pragma unroll
        for (int n = 0; n < NT; n++) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.0f;
#pragma unroll
        for (int b = 0; b < 2; b++)
#pragma unroll
            for (int n = 0; n < 2; n++) dt[b][n][0] = dt[b][n][1] = dt[b][n][2] = dt[b][n][3] = 0.0f;
#pragma unroll
        for (int u = 0; u < NU; u++) {
            uint32_t wa[4], wb[4], f0, f1;
            rs.next(u, wa, wb, f0, f1);
            if constexpr (PIPE == 2) { /* speed only: the unit's four groups in one wgmma chain (k128), one D and one scale a unit,
                              * as if the group scales were folded into the codes: the ceiling of per-unit promotion */
                uint32_t A4[4][4];
#pragma unroll
                for (int G = 0; G < 4; G++) repack(wa[G], A4[G][0], A4[G][2]), repack(wb[G], A4[G][1], A4[G][3]);
                wg_fence();
                wg_e4m3<NT, 0>(dt[0], A4[0], wg_desc(xsa + (unsigned)((u * 4 + 0) * NT * 256), 128, 256));
#pragma unroll
                for (int G = 1; G < 4; G++) wg_e4m3<NT, 1>(dt[0], A4[G], wg_desc(xsa + (unsigned)((u * 4 + G) * NT * 256), 128, 256));
                wg_commit();
                wg_wait<0>();
                scp0 = __uint_as_float((__byte_perm(f0, 0u, 0x4440u) + 6u) << 23);
                scp1 = __uint_as_float((__byte_perm(f1, 0u, 0x4440u) + 6u) << 23);
#pragma unroll
                for (int n = 0; n < NT; n++) {
#pragma unroll
                    for (int k = 0; k < 4; k++) wg_keep(dt[0][n][k]);
                    acc[n][0] = fmaf(dt[0][n][0], scp0, acc[n][0]), acc[n][1] = fmaf(dt[0][n][1], scp0, acc[n][1]);
                    acc[n][2] = fmaf(dt[0][n][2], scp1, acc[n][2]), acc[n][3] = fmaf(dt[0][n][3], scp1, acc[n][3]);
                }
            } else if constexpr (PIPE == 0) {
                unit_wg<NT>(acc, wa, wb, f0, f1, xsa, u);
            } else
#pragma unroll
            for (int G = 0; G < 4; G++) {
                const int b = G & 1; /* the buffers of group q = 4u + G */
                repack(wa[G], A[b][0], A[b][2]);
                repack(wb[G], A[b][1], A[b][3]);
                wg_fence();
                wg_e4m3<NT>(dt[b], A[b], wg_desc(xsa + (unsigned)((u * 4 + G) * NT * 256), 128, 256));
                wg_commit();
                wg_wait<1>(); /* group q - 1 done */
                if (u > 0 || G > 0) {
#pragma unroll
                    for (int n = 0; n < NT; n++) {
#pragma unroll
                        for (int k = 0; k < 4; k++) wg_keep(dt[b ^ 1][n][k]);
                        acc[n][0] = fmaf(dt[b ^ 1][n][0], scp0, acc[n][0]), acc[n][1] = fmaf(dt[b ^ 1][n][1], scp0, acc[n][1]);
                        acc[n][2] = fmaf(dt[b ^ 1][n][2], scp1, acc[n][2]), acc[n][3] = fmaf(dt[b ^ 1][n][3], scp1, acc[n][3]);
                    }
                }
                scp0 = __uint_as_float((__byte_perm(f0, 0u, 0x4440u + G) + 6u) << 23);
                scp1 = __uint_as_float((__byte_perm(f1, 0u, 0x4440u + G) + 6u) << 23);
            }
        }
        wg_wait<0>();
#pragma unroll
        for (int n = 0; n < NT && PIPE == 1; n++) {
#pragma unroll
            for (int k = 0; k < 4; k++) wg_keep(dt[1][n][k]);
            acc[n][0] = fmaf(dt[1][n][0], scp0, acc[n][0]), acc[n][1] = fmaf(dt[1][n][1], scp0, acc[n][1]);
            acc[n][2] = fmaf(dt[1][n][2], scp1, acc[n][2]), acc[n][3] = fmaf(dt[1][n][3], scp1, acc[n][3]);
        }
#pragma unroll
        for (int n = 0; n < NT; n++) {
            const int t0 = n * 8 + 2 * c;
            y[(size_t)t0 * R + r0] = acc[n][0], y[(size_t)(t0 + 1) * R + r0] = acc[n][1];
            y[(size_t)t0 * R + r1] = acc[n][2], y[(size_t)(t0 + 1) * R + r1] = acc[n][3];
        }
    }
}

__device__ __forceinline__ void cp16(void *dst, const void *src) {
    asm volatile("cp.async.cg.shared.global.L2::256B [%0], [%1], 16;" ::"r"((unsigned)__cvta_generic_to_shared(dst)), "l"(src) : "memory");
}
__device__ __forceinline__ void cp4(void *dst, const void *src) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" ::"r"((unsigned)__cvta_generic_to_shared(dst)), "l"(src) : "memory");
}
__device__ __forceinline__ void cp_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int N> __device__ __forceinline__ void cp_wait() { asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory"); }

/* The decode kernels' way of streaming (moe_tc.cu's ring): each warp copies its own weight and scale words by cp.async
 * into a ring of S unit stages in shared memory, S - 1 units in flight ahead of the one computed, across its tiles
 * (no drain between them); each lane reads back only what it copied (no barrier). WG: the wgmma way (64-row tiles a
 * warpgroup), else the f16 way (16-row tiles a warp). */
template <int NT, bool WG, int S, int TL = 0>
__global__ void __launch_bounds__(256) probe_ring(const uint4 *__restrict__ W, const uint32_t *__restrict__ Sc,
                                                  const void *__restrict__ xg, int R, float *__restrict__ y) {
    extern __shared__ __align__(16) uint8_t sm[];
    constexpr int LD = (K + XPAD) * 2, XBYTES = WG ? NT * 8 * K : NT * 8 * LD;
    uint8_t *xs = sm;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, c = lane & 3;
    if (WG) stage_wg<NT>(xs, (const uint32_t *)xg);
    else stage_f16<NT, LD>(xs, xg);
    __syncthreads();
    const unsigned xsa = (unsigned)__cvta_generic_to_shared(xs);
    uint4 *rw = (uint4 *)(sm + XBYTES) + warp * S * 64;                      /* [S][2][32] */
    uint32_t *rs = (uint32_t *)((uint4 *)(sm + XBYTES) + 8 * S * 64) + warp * S * 64; /* [S][2][32] */
    const int ntile = WG ? R / 64 : R / 16, t0 = WG ? blockIdx.x * 2 + (warp >> 2) : blockIdx.x * 8 + warp;
    const int ts = WG ? gridDim.x * 2 : gridDim.x * 8, n = (t0 < ntile ? (ntile - t0 + ts - 1) / ts : 0) * NU;
    auto row = [&](int i) { return WG ? (t0 + (i / NU) * ts) * 64 + (warp & 3) * 16 + g : (t0 + (i / NU) * ts) * 16 + g; };
    auto issue = [&](int i) {
        if (i < n) {
            const int u = i % NU, st = i % S, r0 = row(i);
            constexpr int US = wustride<TL>();
            cp16(rw + st * 64 + lane, W + (wbase<TL>(r0) + u * US) * 4 + c);
            cp16(rw + st * 64 + 32 + lane, W + (wbase<TL>(r0 + 8) + u * US) * 4 + c);
            cp4(rs + st * 64 + lane, Sc + wbase<TL>(r0) + u * US);
            cp4(rs + st * 64 + 32 + lane, Sc + wbase<TL>(r0 + 8) + u * US);
        }
        cp_commit();
    };
#pragma unroll
    for (int i = 0; i < S - 1; i++) issue(i);
    float acc[NT][4];
#pragma unroll
    for (int q = 0; q < NT; q++) acc[q][0] = acc[q][1] = acc[q][2] = acc[q][3] = 0.0f;
    for (int i = 0; i < n; i++) {
        issue(i + S - 1); /* into the stage read (into registers, used) at i - 1 */
        cp_wait<S - 1>();
        const int st = i % S, u = i % NU;
        const uint4 p0 = rw[st * 64 + lane], p1 = rw[st * 64 + 32 + lane];
        const uint32_t f0 = rs[st * 64 + lane], f1 = rs[st * 64 + 32 + lane];
        const uint32_t wa[4] = {p0.x, p0.y, p0.z, p0.w}, wb[4] = {p1.x, p1.y, p1.z, p1.w};
        if constexpr (WG) unit_wg<NT>(acc, wa, wb, f0, f1, xsa, u);
        else unit_f16<NT, LD>(acc, wa, wb, f0, f1, xs, u, g, c);
        if (u == NU - 1) {
            const int r0 = row(i), r1 = r0 + 8;
#pragma unroll
            for (int q = 0; q < NT; q++) {
                const int tq = q * 8 + 2 * c;
                y[(size_t)tq * R + r0] = acc[q][0], y[(size_t)(tq + 1) * R + r0] = acc[q][1];
                y[(size_t)tq * R + r1] = acc[q][2], y[(size_t)(tq + 1) * R + r1] = acc[q][3];
                acc[q][0] = acc[q][1] = acc[q][2] = acc[q][3] = 0.0f;
            }
        }
    }
    cp_wait<0>();
}

/* mbarrier and bulk copy (TMA, one instruction for a contiguous run of bytes): the completion is counted in bytes on the
 * stage's barrier, the consumer waits for the barrier's phase */
__device__ __forceinline__ void mbar_init(uint64_t *b, unsigned count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"((unsigned)__cvta_generic_to_shared(b)), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_expect(uint64_t *b, unsigned bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"((unsigned)__cvta_generic_to_shared(b)), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_wait(uint64_t *b, unsigned parity) {
    const unsigned a = (unsigned)__cvta_generic_to_shared(b);
    uint32_t ok = 0;
    while (!ok)
        asm volatile("{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2; selp.u32 %0, 1, 0, p; }"
                     : "=r"(ok) : "r"(a), "r"(parity) : "memory");
}
__device__ __forceinline__ void bulk_g2s(void *dst, const void *src, unsigned bytes, uint64_t *b) {
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
                     (unsigned)__cvta_generic_to_shared(dst)),
                 "l"(src), "r"(bytes), "r"((unsigned)__cvta_generic_to_shared(b))
                 : "memory");
}

/* The tiled layout streamed by bulk copies: per warp a ring of S stages, each one (16-row tile, unit): its 1 KB of
 * weights and 64 bytes of scale words in two bulk copies issued by lane 0 on the stage's barrier, S - 1 units ahead;
 * each lane then reads its 16 bytes of each row half (conflict-free) and its rows' scale words. WG: the wgmma way. */
template <int NT, bool WG, int S>
__global__ void __launch_bounds__(256) probe_bulk(const uint4 *__restrict__ W, const uint32_t *__restrict__ Sc,
                                                  const void *__restrict__ xg, int R, float *__restrict__ y) {
    extern __shared__ __align__(16) uint8_t sm[];
    constexpr int LD = (K + XPAD) * 2, XBYTES = WG ? NT * 8 * K : NT * 8 * LD, STG = 1024 + 64;
    uint8_t *xs = sm;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, c = lane & 3;
    uint8_t *ring = sm + XBYTES + warp * S * STG;
    uint64_t *bar = (uint64_t *)(sm + XBYTES + 8 * S * STG) + warp * S;
    if (WG) stage_wg<NT>(xs, (const uint32_t *)xg);
    else stage_f16<NT, LD>(xs, xg);
    if (lane < S) mbar_init(bar + lane, 1);
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    __syncthreads();
    const unsigned xsa = (unsigned)__cvta_generic_to_shared(xs);
    const int ntile = WG ? R / 64 : R / 16, t0 = WG ? blockIdx.x * 2 + (warp >> 2) : blockIdx.x * 8 + warp;
    const int ts = WG ? gridDim.x * 2 : gridDim.x * 8, n = (t0 < ntile ? (ntile - t0 + ts - 1) / ts : 0) * NU;
    auto tile16 = [&](int i) { return WG ? (t0 + (i / NU) * ts) * 4 + (warp & 3) : t0 + (i / NU) * ts; };
    auto issue = [&](int i) {
        if (lane == 0 && i < n) {
            const int st = i % S;
            const size_t tu = (size_t)tile16(i) * NU + i % NU;
            mbar_expect(bar + st, STG);
            bulk_g2s(ring + st * STG, W + tu * 64, 1024, bar + st);
            bulk_g2s(ring + st * STG + 1024, Sc + tu * 16, 64, bar + st);
        }
    };
#pragma unroll
    for (int i = 0; i < S - 1; i++) issue(i);
    float acc[NT][4];
#pragma unroll
    for (int q = 0; q < NT; q++) acc[q][0] = acc[q][1] = acc[q][2] = acc[q][3] = 0.0f;
    for (int i = 0; i < n; i++) {
        __syncwarp(); /* every lane has read stage (i - 1) % S, which the next issue refills */
        issue(i + S - 1);
        const int st = i % S, u = i % NU;
        mbar_wait(bar + st, (unsigned)(i / S) & 1u);
        const uint8_t *sb = ring + st * STG;
        const uint4 p0 = *(const uint4 *)(sb + lane * 16), p1 = *(const uint4 *)(sb + 512 + lane * 16);
        const uint32_t f0 = *(const uint32_t *)(sb + 1024 + g * 4), f1 = *(const uint32_t *)(sb + 1024 + (g + 8) * 4);
        const uint32_t wa[4] = {p0.x, p0.y, p0.z, p0.w}, wb[4] = {p1.x, p1.y, p1.z, p1.w};
        if constexpr (WG) unit_wg<NT>(acc, wa, wb, f0, f1, xsa, u);
        else unit_f16<NT, LD>(acc, wa, wb, f0, f1, xs, u, g, c);
        if (u == NU - 1) {
            const int r0 = tile16(i) * 16 + g, r1 = r0 + 8;
#pragma unroll
            for (int q = 0; q < NT; q++) {
                const int tq = q * 8 + 2 * c;
                y[(size_t)tq * R + r0] = acc[q][0], y[(size_t)(tq + 1) * R + r0] = acc[q][1];
                y[(size_t)tq * R + r1] = acc[q][2], y[(size_t)(tq + 1) * R + r1] = acc[q][3];
                acc[q][0] = acc[q][1] = acc[q][2] = acc[q][3] = 0.0f;
            }
        }
    }
}

/* random weights on the device: codes from a hash, E8M0 scales 127 +- 6 (the f16 path's factors stay normal) */
__global__ void fill_kernel(uint32_t *W, uint32_t *S, size_t nw, size_t ns) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < nw + ns; i += (size_t)gridDim.x * blockDim.x) {
        uint32_t h = (uint32_t)i * 2654435761u ^ (uint32_t)(i >> 32) * 40503u;
        h ^= h >> 15, h *= 2246822519u, h ^= h >> 13, h *= 3266489917u, h ^= h >> 16;
        if (i < nw) W[i] = h;
        else {
            uint32_t s = 0;
            for (int b = 0; b < 4; b++) s |= (121u + ((h >> (8 * b)) % 13u)) << (8 * b);
            S[i - nw] = s;
        }
    }
}

/* wbase + u * wustride on the host: the scale word (and the weight quad / 4) of (row r, unit u) in layout tl */
static size_t hix(int tl, int r, int u) {
    return tl == 1 ? ((size_t)(r >> 4) * NU + u) * 16 + (r & 15) : tl == 2 ? ((size_t)(r >> 3) * NU + u) * 8 + (r & 7) : (size_t)r * NU + u;
}
static float e2m1_val(int n) {
    static const float v[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
    return n & 8 ? -v[n & 7] : v[n & 7];
}
static float e4m3_val(uint8_t b) {
    const int e = (b >> 3) & 15, m = b & 7;
    const float v = e ? ldexpf(1.0f + m / 8.0f, e - 7) : ldexpf(m / 8.0f, -6);
    return b & 0x80 ? -v : v;
}

int main(int argc, char **argv) {
    const int R = argc > 1 ? atoi(argv[1]) : 524288; /* rows: 524288 x 2048 FP4 = 512 MiB of weights */
    if (R < 16 || R % 16) {
        fprintf(stderr, "fp4_mma_probe: rows must be a positive multiple of 16\n");
        return 2;
    }
    const size_t nw = (size_t)R * K / 8, ns = (size_t)R * NU, wbytes = nw * 4 + ns * 4;
    uint32_t *dW, *dS;
    float *dy;
    void *dx8, *dx16, *dcp;
    CK(cudaMalloc(&dW, nw * 4));
    CK(cudaMalloc(&dS, ns * 4));
    CK(cudaMalloc(&dy, sizeof(float) * 16 * (size_t)R));
    CK(cudaMalloc(&dx8, 16 * K));
    CK(cudaMalloc(&dx16, 16 * K * 2));
    CK(cudaMalloc(&dcp, wbytes));
    fill_kernel<<<1024, 256>>>(dW, dS, nw, ns);
    CK(cudaGetLastError());
    /* x: 16 tokens of random e4m3 codes (no NaN), as codes and as f16 in the staged order */
    static uint8_t xc[16][K], xs8[16][K];
    static __half xs16[16][K];
    srand(1);
    for (int n = 0; n < 16; n++)
        for (int k = 0; k < K; k++) {
            uint8_t b;
            do b = (uint8_t)(rand() & 0xff);
            while ((b & 0x7f) == 0x7f || ((b >> 3) & 15) < 2 || ((b >> 3) & 15) > 12);
            xc[n][k] = b;
        }
    static const int ord[8] = {0, 2, 4, 6, 1, 3, 5, 7};
    for (int n = 0; n < 16; n++)
        for (int k0 = 0; k0 < K; k0 += 8)
            for (int i = 0; i < 8; i++) {
                xs8[n][k0 + i] = xc[n][k0 + ord[i]];
                xs16[n][k0 + i] = __float2half(e4m3_val(xc[n][k0 + ord[i]]));
            }
    CK(cudaMemcpy(dx8, xs8, sizeof xs8, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dx16, xs16, sizeof xs16, cudaMemcpyHostToDevice));
    CK(cudaDeviceSynchronize());

    int dev = 0, sms = 0;
    CK(cudaGetDevice(&dev));
    CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    cudaEvent_t a, b;
    CK(cudaEventCreate(&a));
    CK(cudaEventCreate(&b));
    float ms, best = 1e30f;
    for (int i = 0; i < 10; i++) {
        CK(cudaEventRecord(a));
        CK(cudaMemcpy(dcp, dW, wbytes < nw * 4 ? wbytes : nw * 4, cudaMemcpyDeviceToDevice));
        CK(cudaEventRecord(b));
        CK(cudaEventSynchronize(b));
        CK(cudaEventElapsedTime(&ms, a, b));
        if (ms < best) best = ms;
    }
    printf("device-to-device copy of %.0f MiB: %.0f GB/s (read + write)\n", nw * 4 / 1048576.0, 2.0 * nw * 4 / best / 1e6);

    /* the reference for the first 64 rows (double, from the codes) */
    const int RR = 64;
    uint32_t *hW = (uint32_t *)malloc((size_t)RR * K / 8 * 4), *hS = (uint32_t *)malloc((size_t)RR * NU * 4);
    CK(cudaMemcpy(hW, dW, (size_t)RR * K / 8 * 4, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(hS, dS, (size_t)RR * NU * 4, cudaMemcpyDeviceToHost));
    static double ref[3][16][64], mag[3][16][64]; /* [layout] */
    for (int tl = 0; tl < 3; tl++)
    for (int r = 0; r < RR; r++)
        for (int n = 0; n < 16; n++) {
            double s = 0, m = 0;
            for (int u = 0; u < NU; u++)
                for (int c = 0; c < 4; c++)
                    for (int G = 0; G < 4; G++) {
                        const uint32_t w = hW[hix(tl, r, u) * 16 + c * 4 + G];
                        const int e = (int)((hS[hix(tl, r, u)] >> (8 * G)) & 0xff) - 127;
                        for (int i = 0; i < 8; i++) {
                            const double p = ldexp(e2m1_val((int)(w >> (4 * i)) & 15), e) * e4m3_val(xc[n][u * 128 + G * 32 + 8 * c + i]);
                            s += p, m += fabs(p);
                        }
                    }
            ref[tl][n][r] = s, mag[tl][n][r] = m;
        }

    float *hy = (float *)malloc(sizeof(float) * 16 * (size_t)R);
    typedef void (*kfn)(const uint4 *, const uint32_t *, const void *, int, float *);
    /* kind: 0 f16 (x as f16), 1 mma.sync e4m3, 2 wgmma (x codes as core matrices); d: units in flight ahead (registers),
     * -S: a cp.async ring of S stages a warp (probe_ring), -100 - S: a bulk-copy ring (probe_bulk, tiled) */
    static const struct {
        const char *name;
        int kind, d, tl;
        kfn k1, k2;
    } ways[] = {
        {"f16", 0, 1, 0, (kfn)probe_kernel<1, false>, (kfn)probe_kernel<2, false>},
        {"f16 d2", 0, 2, 0, (kfn)probe_kernel<1, false, 2>, (kfn)probe_kernel<2, false, 2>},
        {"f16 d4", 0, 4, 0, (kfn)probe_kernel<1, false, 4>, (kfn)probe_kernel<2, false, 4>},
        {"mma.sync e4m3", 1, 1, 0, (kfn)probe_kernel<1, true>, (kfn)probe_kernel<2, true>},
        {"wgmma e4m3", 2, 1, 0, (kfn)probe_wg<1, 0>, (kfn)probe_wg<2, 0>},
        {"wgmma d2", 2, 2, 0, (kfn)probe_wg<1, 0, 2>, (kfn)probe_wg<2, 0, 2>},
        {"wgmma d4", 2, 4, 0, (kfn)probe_wg<1, 0, 4>, (kfn)probe_wg<2, 0, 4>},
        {"wgmma e4m3 p1", 2, 1, 0, (kfn)probe_wg<1, 1>, (kfn)probe_wg<2, 1>},
        {"wgmma k128 *", 2, 1, 0, (kfn)probe_wg<1, 2>, (kfn)probe_wg<2, 2>},
        {"wgmma k128 * d4", 2, 4, 0, (kfn)probe_wg<1, 2, 4>, (kfn)probe_wg<2, 2, 4>},
        {"f16 ring 4", 0, -4, 0, (kfn)probe_ring<1, false, 4>, (kfn)probe_ring<2, false, 4>},
        {"f16 ring 6", 0, -6, 0, (kfn)probe_ring<1, false, 6>, (kfn)probe_ring<2, false, 6>},
        {"f16 tiled", 0, 1, 1, (kfn)probe_kernel<1, false, 1, 1>, (kfn)probe_kernel<2, false, 1, 1>},
        {"wgmma tiled", 2, 1, 1, (kfn)probe_wg<1, 0, 1, 1>, (kfn)probe_wg<2, 0, 1, 1>},
        {"f16 ring 4 tiled", 0, -4, 1, (kfn)probe_ring<1, false, 4, 1>, (kfn)probe_ring<2, false, 4, 1>},
        {"f16 ring 6 tiled", 0, -6, 1, (kfn)probe_ring<1, false, 6, 1>, (kfn)probe_ring<2, false, 6, 1>},
        {"f16 il8", 0, 1, 2, (kfn)probe_kernel<1, false, 1, 2>, (kfn)probe_kernel<2, false, 1, 2>},
        {"wgmma il8", 2, 1, 2, (kfn)probe_wg<1, 0, 1, 2>, (kfn)probe_wg<2, 0, 1, 2>},
        {"f16 bulk 4", 0, -104, 1, (kfn)probe_bulk<1, false, 4>, (kfn)probe_bulk<2, false, 4>},
        {"f16 bulk 8", 0, -108, 1, (kfn)probe_bulk<1, false, 8>, (kfn)probe_bulk<2, false, 8>},
        {"wgmma bulk 4", 2, -104, 1, (kfn)probe_bulk<1, true, 4>, (kfn)probe_bulk<2, true, 4>},
        {"wgmma bulk 8", 2, -108, 1, (kfn)probe_bulk<1, true, 8>, (kfn)probe_bulk<2, true, 8>},
        {"wgmma ring 4 tiled", 2, -4, 1, (kfn)probe_ring<1, true, 4, 1>, (kfn)probe_ring<2, true, 4, 1>},
        {"wgmma ring 4", 2, -4, 0, (kfn)probe_ring<1, true, 4>, (kfn)probe_ring<2, true, 4>},
        {"wgmma ring 6", 2, -6, 0, (kfn)probe_ring<1, true, 6>, (kfn)probe_ring<2, true, 6>},
        {"wgmma ring 8", 2, -8, 0, (kfn)probe_ring<1, true, 8>, (kfn)probe_ring<2, true, 8>},
    };
    for (int way = 0; way < (int)(sizeof ways / sizeof ways[0]); way++)
        for (int nt = 1; nt <= 2; nt++) {
            if (argc > 2 && !strstr(ways[way].name, argv[2])) continue;
            const int kind = ways[way].kind;
            const size_t smem = (kind == 2 ? (size_t)nt * 8 * K : (size_t)nt * 8 * (K + XPAD) * (kind ? 1 : 2)) +
                                (ways[way].d < -100 ? (size_t)8 * (-ways[way].d - 100) * (1024 + 64 + 8)
                                 : ways[way].d < 0 ? (size_t)8 * -ways[way].d * 64 * 20 : 0);
            const kfn kern = nt == 1 ? ways[way].k1 : ways[way].k2;
            CK(cudaFuncSetAttribute((const void *)kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
            int per = 0;
            CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per, kern, 256, smem));
            const int grid = per * sms;
            best = 1e30f;
            for (int i = 0; i < 12; i++) {
                CK(cudaEventRecord(a));
                kern<<<grid, 256, smem>>>((const uint4 *)dW, dS, kind ? dx8 : dx16, R, dy);
                CK(cudaEventRecord(b));
                CK(cudaEventSynchronize(b));
                CK(cudaGetLastError());
                CK(cudaEventElapsedTime(&ms, a, b));
                if (i > 1 && ms < best) best = ms;
            }
            CK(cudaMemcpy(hy, dy, sizeof(float) * nt * 8 * (size_t)R, cudaMemcpyDeviceToHost));
            double worst = 0, sum = 0;
            int cnt = 0;
            for (int n = 0; n < nt * 8; n++)
                for (int r = 0; r < RR; r++) {
                    const double e = fabs(hy[(size_t)n * R + r] - ref[ways[way].tl][n][r]) / mag[ways[way].tl][n][r];
                    worst = e > worst ? e : worst, sum += e, cnt++;
                }
            printf("%-15s %2d tokens: %8.1f us  %6.0f GB/s of weights  (%d blocks of 8 warps, %d an SM)  error / sum|w x|: "
                   "mean %.2e worst %.2e\n",
                   ways[way].name, nt * 8, best * 1e3, wbytes / best / 1e6, grid, per, sum / cnt, worst);
        }
    free(hW), free(hS), free(hy);
    cudaFree(dW), cudaFree(dS), cudaFree(dy), cudaFree(dx8), cudaFree(dx16), cudaFree(dcp);
    return 0;
}
