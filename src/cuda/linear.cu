/* linear.cu - y = x . W^T for every weight format (spec 14), the twin of dsv4_cpu_linear.
 *
 * Decode (T <= 16 rows of x): gemv_tc, a tensor-core GEMV (mma.sync m16n8k16, fp32 accumulate). A warp
 * owns a tile of 16 weight rows (the mma's M) and a slice of the columns; the tokens are the mma's N (8 or
 * 16), so the weight is read once for all T <= 16. Each lane streams 16-byte chunks of rows g and g+8 of
 * its tile (a quad of lanes reads 64 contiguous bytes of a row) and decodes them exactly into f16 / bf16
 * A fragments in registers (linear_tc.cuh); the K order inside a 128-column unit is permuted so that a
 * lane's own bytes are its fragment, and x is staged in shared memory in the same permuted order, once per
 * block, as 16-bit terms with one power-of-two scale per (token, 128 columns):
 *   FP8 + act quant: the act-quant code (e4m3, exact in f16) and its scale; the other f16 formats
 *   (FP8, MXFP4, NVFP4, F16): x / 2^e split into two f16 terms (22 bits); bf16 formats (BF16, F32 weight
 *   split into three bf16 terms): x split into three bf16 terms. x already bf16 (x_bf16) or rounded to bf16
 *   at staging (w.act_bf16: BF16 activations): one term, bf16 as it is, or for the f16 formats the bf16 value
 *   times the same 2^-e (the unit's largest |x| lands in [2^14, 2^15): no overflow). A bf16 value has 8
 *   significant bits, so v * 2^-e is exact in f16 (normal or subnormal, lsb 2^-24) unless it is more than 2^31
 *   below the unit's largest |x|; such a value rounds to the f16 grid, an error under 2^-39 of the unit's
 *   largest |x| (the same limit as the two-term split).
 * Each 128-column unit is accumulated in fresh mma accumulators, then scaled by (weight scale x x scale)
 * and added in fp32. The columns are cut into S slices (S fixed by the shape and format, never by T), a
 * slice per warp; partial sums of the slices of a tile are added in slice order 0..S-1, in shared memory
 * within a block and through distributed shared memory within a thread-block cluster (slices spread over
 * up to 8 blocks). So a row's result is deterministic and independent of T and of the other rows of x.
 * More than 16 rows of x: the same kernel, 16 rows per launch (so prefill equals decode bitwise). Launches carry
 * the programmatic-dependent-launch attribute (the kernel waits in griddepcontrol.wait before reading x).
 * Each warp issues its first two register steps of weights before the wait (they are the model's weights, which no
 * kernel of a forward writes), so that a block launched while the previous kernel still runs has them when x is
 * ready; after the wait its x loads (8 lanes per (token, unit), 16-byte loads: tc_stage8), then x quantized / split
 * into shared memory (bench/NOTES.md, "Decode GEMV fixed cost", session 23; session 34 removed the variants measured
 * slower: bulk / per-lane L2 prefetch, other weight-load orders, the older staging, whose runtime branches made ptxas
 * spill up to 800 bytes in 36 of the 48 instances).
 * Grouped (dsv4_cuda_linear_multi): up to TC_MAXJ jobs (weight, x and y with row strides) of the same format, columns
 * and slicing in one launch, a job table in the kernel parameters; each cluster belongs to one job and runs exactly what
 * that job's own launch would (same S, warps, order), so every row is bitwise the single call's.
 * Odd sizes (columns not a multiple of 128, unaligned views): gemv_any (T <= 1024: every decode batch, so batch
 * invariant), one element at a time, 8 tokens a pass, and gemm_tiled (longer passes), 64 rows x 64 tokens x 128 columns
 * per tile, weights dequantized into shared memory, fp32 FMA.
 * With a workspace (dsv4_cuda_linear_ws, _multi_ws) and T >= DSV4_CUDA_LINEAR_WS_MIN_T the shapes the tensor-core GEMV
 * takes go through the multi-token GEMM of linear_bi.cu instead, bitwise the GEMV (DSV4_LINEAR_MT=0: the GEMV). */
#include <cooperative_groups.h>
#include <stdlib.h>

#include "common.cuh"
#include "linear_gemv.cuh"

namespace cg = cooperative_groups;

#define GEMV_WARPS 16
#define DSV4_LINEAR_ELEM_MAXT DSV4_CUDA_DECODE_MAX /* odd shapes: the element GEMV up to this many rows (every decode bucket), then gemm_tiled */

/* x element i as the linear takes it: rnd (act_bf16 without act quant) rounds an fp32 x to bf16 */
__device__ __forceinline__ float load_xr(const void *x, int bf16, int rnd, int64_t i) {
    const float v = load_x(x, bf16, i);
    return rnd ? dev_round_bf16(v) : v;
}

/* FP8 act_quant of one 128-block held by a warp, 4 values per lane (same result as
 * dsv4_act_quant_fp8 on the block; padding zeros do not change the block's amax). Returns the
 * block's scale; v becomes the e4m3 codes (the quantized values are v * scale). */
__device__ __forceinline__ float warp_act_quant_fp8_codes(float v[4]) {
    float a = 1e-4f;
#pragma unroll
    for (int q = 0; q < 4; q++) a = fmaxf(a, fabsf(v[q]));
    a = warp_max(a);
    float s = dev_pow2_ceil(a * (1.0f / 448.0f));
#pragma unroll
    for (int q = 0; q < 4; q++) v[q] = dev_round_e4m3(fminf(fmaxf(__fdiv_rn(v[q], s), -448.0f), 448.0f));
    return s;
}
__device__ __forceinline__ void warp_act_quant_fp8(float v[4]) {
    float s = warp_act_quant_fp8_codes(v);
#pragma unroll
    for (int q = 0; q < 4; q++) v[q] *= s;
}

/* Stages rows t0 .. t0+nt-1 of x [*, C] (row stride ldx) into xs [TB][Cpad] (zeros beyond), act-quantized when aq,
 * rounded to bf16 when rnd. */
__device__ void stage_x(float *xs, const void *x, int64_t ldx, int xbf16, int rnd, int t0, int nt, int TB, int C, int Cpad,
                        int aq) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarp = blockDim.x >> 5;
    const int ng = Cpad / 128;
    for (int g = warp; g < TB * ng; g += nwarp) {
        int t = g / ng, j0 = (g - t * ng) * 128;
        float v[4];
#pragma unroll
        for (int q = 0; q < 4; q++) {
            int j = j0 + q * 32 + lane;
            v[q] = (t < nt && j < C) ? load_xr(x, xbf16, rnd, (int64_t)(t0 + t) * ldx + j) : 0.0f;
        }
        if (aq) warp_act_quant_fp8(v);
#pragma unroll
        for (int q = 0; q < 4; q++) xs[(size_t)t * Cpad + j0 + q * 32 + lane] = v[q];
    }
}

/* x element loads of tc_stage8 (volatile: issued in program order, before the weight loads that follow them) */
__device__ __forceinline__ float4 tc_ldx4(const float *p) {
    float4 v;
    asm volatile("ld.global.v4.f32 {%0,%1,%2,%3}, [%4];" : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w) : "l"(p));
    return v;
}
__device__ __forceinline__ uint2 tc_ldx2(const uint16_t *p) {
    uint2 v;
    asm volatile("ld.global.v2.u32 {%0,%1}, [%2];" : "=r"(v.x), "=r"(v.y) : "l"(p));
    return v;
}
__device__ __forceinline__ float tc_ldx1(const float *p) {
    float v;
    asm volatile("ld.global.f32 %0, [%1];" : "=f"(v) : "l"(p));
    return v;
}
__device__ __forceinline__ uint32_t tc_ldx1h(const uint16_t *p) {
    unsigned short v;
    asm volatile("ld.global.u16 %0, [%1];" : "=h"(v) : "l"(p));
    return v;
}

/* tc_stage (linear_gemv.cuh; the multi-token GEMM stages with it) with 8 lanes per (token, unit) item, 4 items per warp
 * at a time and SB such passes' loads in flight: lane l8 = lane % 8 of a group holds the item's elements qq * 32 + l8 *
 * 4 + e (qq, e < 4), loaded 16 (fp32) or 8 (bf16) bytes at a time when J.xv, and stores 4 terms at once (the formats but
 * FP4 keep x in column order). Same values, scales and slots as tc_stage (the largest |x| of an item does not depend
 * on the order of the max). */
template <int FMT, int XT, int SB>
__device__ __forceinline__ void tc_stage8(const tc_params &p, const tc_job &J0, const tc_job &J, uint16_t *xs, float *sx, int ub0,
                                          int nub) {
    constexpr int BF = tc_fmt<FMT>::BF;
    constexpr bool FP4 = FMT == DSV4_WF_MXFP4 || FMT == DSV4_WF_NVFP4;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, l8 = lane & 7, sub = lane >> 3, n = p.nt * nub;
    const int aq = J0.w.act_quant, ab = J0.w.act_bf16, xv = J.xv;
    const size_t tstride = (size_t)p.nt * p.tok;
    float v[SB][4][4];
    auto ldpass = [&](int base) { /* the loads of SB passes: items base + b * TC_WARPS * 4 + sub */
#pragma unroll
        for (int b = 0; b < SB; b++) {
            const int it = base + b * TC_WARPS * 4 + sub, t = it / nub, ul = it - t * nub;
            const int64_t e0 = (int64_t)(p.t0 + t) * J.ldx + (int64_t)(ub0 + ul) * 128 + l8 * 4;
#pragma unroll
            for (int qq = 0; qq < 4; qq++) {
                if (it >= n) {
                    v[b][qq][0] = v[b][qq][1] = v[b][qq][2] = v[b][qq][3] = 0.0f;
                } else if (p.xbf16) {
                    const uint16_t *xp = (const uint16_t *)J.x + e0 + qq * 32;
                    uint2 w;
                    if (xv) w = tc_ldx2(xp);
                    else w.x = tc_ldx1h(xp) | tc_ldx1h(xp + 1) << 16, w.y = tc_ldx1h(xp + 2) | tc_ldx1h(xp + 3) << 16;
                    v[b][qq][0] = __uint_as_float(w.x << 16), v[b][qq][1] = __uint_as_float(w.x & 0xffff0000u);
                    v[b][qq][2] = __uint_as_float(w.y << 16), v[b][qq][3] = __uint_as_float(w.y & 0xffff0000u);
                } else {
                    const float *xp = (const float *)J.x + e0 + qq * 32;
                    if (xv) {
                        const float4 f = tc_ldx4(xp);
                        v[b][qq][0] = f.x, v[b][qq][1] = f.y, v[b][qq][2] = f.z, v[b][qq][3] = f.w;
                    } else {
#pragma unroll
                        for (int e = 0; e < 4; e++) v[b][qq][e] = tc_ldx1(xp + e);
                    }
                }
            }
        }
    };
    auto stpass = [&](int base) { /* their scales and terms */
#pragma unroll
        for (int b = 0; b < SB; b++) {
            const int it = base + b * TC_WARPS * 4 + sub, t = it / nub, ul = it - t * nub;
            float s = 1.0f, a = aq ? 1e-4f : 0.0f;
            uint32_t term[3][4][2]; /* term, qq, pair: bf16x2 / f16x2 of elements (0, 1) and (2, 3) */
            if (aq || !BF) {
#pragma unroll
                for (int qq = 0; qq < 4; qq++)
#pragma unroll
                    for (int e = 0; e < 4; e++) a = fmaxf(a, fabsf(v[b][qq][e]));
                a = fmaxf(a, __shfl_xor_sync(0xffffffffu, a, 1));
                a = fmaxf(a, __shfl_xor_sync(0xffffffffu, a, 2));
                a = fmaxf(a, __shfl_xor_sync(0xffffffffu, a, 4));
            }
            if (aq) {
                /* s = dev_pow2_ceil(a / 448) and inv = 1 / s from the bits (a >= 1e-4 and not NaN: e <= 128; e == 128
                 * is s = inf, inv = 0, as the library calls give) */
                const uint32_t u = __float_as_uint(a * (1.0f / 448.0f));
                const int e = (int)((u >> 23) & 0xff) - 127 + ((u & 0x7fffffu) != 0);
                s = e <= 127 ? __uint_as_float((uint32_t)(e + 127) << 23) : __int_as_float(0x7f800000);
                const float inv = e <= 126 ? __uint_as_float((uint32_t)(127 - e) << 23) : e == 127 ? __uint_as_float(0x00400000u) : 0.0f;
#pragma unroll
                for (int qq = 0; qq < 4; qq++)
#pragma unroll
                    for (int h = 0; h < 2; h++) {
                        const float y0 = fminf(fmaxf(v[b][qq][2 * h] * inv, -448.0f), 448.0f);
                        const float y1 = fminf(fmaxf(v[b][qq][2 * h + 1] * inv, -448.0f), 448.0f);
                        const __half2_raw hr =
                            __nv_cvt_fp8x2_to_halfraw2(__nv_cvt_float2_to_fp8x2(make_float2(y0, y1), __NV_SATFINITE, __NV_E4M3), __NV_E4M3);
                        if (BF) {
                            const __nv_bfloat162 bb = __floats2bfloat162_rn(__half2float(__half(__half_raw{hr.x})),
                                                                           __half2float(__half(__half_raw{hr.y})));
                            term[0][qq][h] = *(const uint32_t *)&bb;
                        } else {
                            term[0][qq][h] = (uint32_t)hr.x | (uint32_t)hr.y << 16;
                        }
                        term[1][qq][h] = term[2][qq][h] = 0;
                    }
            } else {
                float inv = 1.0f;
                if (!BF) { /* a power of two that puts the unit's largest |x| in [2^14, 2^15) */
                    int e = (int)((__float_as_uint(a) >> 23) & 0xff) - 14;
                    e = e < 1 ? 1 : e;
                    s = __uint_as_float((uint32_t)e << 23);
                    inv = __uint_as_float((uint32_t)(254 - e) << 23);
                }
#pragma unroll
                for (int qq = 0; qq < 4; qq++)
#pragma unroll
                    for (int h = 0; h < 2; h++) {
                        float y0 = v[b][qq][2 * h], y1 = v[b][qq][2 * h + 1];
                        if (!BF) {
                            if (XT == 1 && ab) y0 = dev_round_bf16(y0), y1 = dev_round_bf16(y1);
                            y0 *= inv, y1 *= inv;
                            const __half2 hh = __floats2half2_rn(y0, y1);
                            const float2 hf = __half22float2(hh);
                            const __half2 ll = __floats2half2_rn(y0 - hf.x, y1 - hf.y);
                            term[0][qq][h] = *(const uint32_t *)&hh, term[1][qq][h] = *(const uint32_t *)&ll, term[2][qq][h] = 0;
                        } else {
                            tc_f32x2_bf16x3(y0, y1, term[0][qq][h], term[1][qq][h], term[2][qq][h]);
                        }
                    }
            }
            if (it < n) {
                uint16_t *dst = xs + (size_t)t * p.tok + ul * 128;
#pragma unroll
                for (int xt = 0; xt < XT; xt++)
#pragma unroll
                    for (int qq = 0; qq < 4; qq++) {
                        if (!FP4) {
                            *(uint2 *)(dst + xt * tstride + qq * 32 + l8 * 4) = make_uint2(term[xt][qq][0], term[xt][qq][1]);
                        } else {
#pragma unroll
                            for (int e = 0; e < 4; e++)
                                dst[xt * tstride + tc_slot<FMT>(qq * 32 + l8 * 4 + e)] = (uint16_t)(term[xt][qq][e >> 1] >> (16 * (e & 1)));
                        }
                    }
                if (l8 == 0) sx[t * p.nub + ul] = s;
            }
        }
    };
    ldpass(warp * 4);
    stpass(warp * 4);
    for (int base = warp * 4 + TC_WARPS * 4 * SB; base < n; base += TC_WARPS * 4 * SB) ldpass(base), stpass(base);
}

/* One pipeline step of a lane: CH chunks of rows g and g+8, and what their scales need, packed per row: FP8 the
 * raw block scale of each unit ending in the step (slot (i + 1) / V - 1), MXFP4 the E8M0 byte of chunk i in byte
 * i, NVFP4 the two e4m3 bytes of chunk i in half i % 2 of slot i / 2. */
template <int CH> struct tc_buf {
    uint4 q[CH][2];
    uint32_t a[2][2];
};

template <int FMT, int CH>
__device__ __forceinline__ void tc_load(const tc_job &J0, const tc_job &J, tc_buf<CH> &b, int tile, int chs, int ch1, int g,
                                        int c) {
    constexpr int E = tc_fmt<FMT>::E, V = tc_fmt<FMT>::V;
    const bool act = tile < J.NRT;
    const int R = J.w.rows;
    int r0 = tile * 16 + g, r1 = r0 + 8;
    r0 = r0 < R ? r0 : R - 1; /* rows past the end: re-read the last one, never stored */
    r1 = r1 < R ? r1 : R - 1;
    const int64_t Rs[2] = {(int64_t)J.w.row0 + r0, (int64_t)J.w.row0 + r1};
    const int64_t rowq = J0.w.cols / E; /* 16-byte chunks per stored row */
#pragma unroll
    for (int m = 0; m < 2; m++) b.a[m][0] = b.a[m][1] = 0;
#pragma unroll
    for (int i = 0; i < CH; i++) {
        const int ch = chs + i;
        const bool ok = act && ch < ch1;
#pragma unroll
        for (int m = 0; m < 2; m++) {
            b.q[i][m] = ok ? tc_ld_stream((const uint4 *)J.w.data + Rs[m] * rowq + ch * 4 + c) : make_uint4(0, 0, 0, 0);
            if (!ok) continue;
            if (FMT == DSV4_WF_FP8 && (i % V) == V - 1) {
                const int64_t si = (Rs[m] / 128) * J.w.scale_stride + ch / V;
                b.a[m][(i + 1) / V - 1] = J0.w.scale_f32 ? __ldg((const uint32_t *)J.w.scale + si) : (uint32_t)__ldg(J.w.scale + si);
            } else if (FMT == DSV4_WF_MXFP4) {
                b.a[m][0] |= (uint32_t)__ldg(J.w.scale + Rs[m] * J.w.scale_stride + ch * 4 + c) << (8 * i);
            } else if (FMT == DSV4_WF_NVFP4) {
                b.a[m][i >> 1] |= (uint32_t)__ldg((const uint16_t *)(J.w.scale + Rs[m] * J.w.scale_stride + 2 * (ch * 4 + c)))
                                  << (16 * (i & 1));
            }
        }
    }
}

/* NJ: room for the jobs of a launch (1: dsv4_cuda_linear; TC_MAXJ: dsv4_cuda_linear_multi, where each cluster finds
 * its job in the table: the job's rows get exactly the warps, slices and summation order of a launch of its own).
 * DSV4_TC_TRACE (experiments, off): p.trace gets each warp's clock64 at 7 points and its globaltimer at entry / exit. */
#ifdef DSV4_TC_TRACE
#define TC_TR(k)                                                                                                        \
    do {                                                                                                               \
        if (p.trace && lane == 0) p.trace[((size_t)blockIdx.x * TC_WARPS + warp) * 10 + (k)] = clock64();               \
    } while (0)
__device__ __forceinline__ unsigned long long tc_gtime() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}
#else
#define TC_TR(k) ((void)0)
#endif
template <int FMT, int XT, int NT, int NJ>
__global__ void __launch_bounds__(TC_THREADS, 1) gemv_tc(const __grid_constant__ tc_args<NJ> ka) {
    using F = tc_fmt<FMT>;
    constexpr int V = F::V, E = F::E, WT = F::WT, BF = F::BF;
    extern __shared__ __align__(16) unsigned char tc_sm[];
    const tc_params &p = ka.p;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, c = lane & 3;
    const int KW = p.KW, KG = p.KG, RW = TC_WARPS / KW, S = p.S, NU = p.NU, nt = p.nt;
    const int kw = warp % KW, rw = warp / KW;
    int ji = 0, cid = blockIdx.x / KG, ncl = gridDim.x / KG;
    if (NJ > 1) {
        for (int i = 1; i < p.nj; i++) ji = cid >= ka.j[i].c0 ? i : ji;
        cid -= ka.j[ji].c0, ncl = ka.j[ji].ncl;
    }
    const tc_job &J0 = ka.j[0], &J = ka.j[ji];
    const int kg = KG > 1 ? (int)cg::this_cluster().block_rank() : 0;
    const int s = kg * KW + kw;
    const int ub0 = kg * KW * NU / S, nub = (kg + 1) * KW * NU / S - ub0; /* the block's units */
    const int ch0 = (s * NU / S) * V, ch1 = ((s + 1) * NU / S) * V;       /* the warp's chunks */
    constexpr int CH = NT == 2 ? TC_CH / 2 : TC_CH; /* 16 tokens: fewer chunks in flight per lane (registers) */
    /* steps per tile: the same for every warp (from the largest slice), so that all warps of the grid reach the
     * per-tile barrier in the same iteration of the unrolled loop below */
    const int nsteps = (((NU + S - 1) / S) * V + CH - 1) / CH;
    const int iters = (J.NRG + ncl - 1) / ncl;
    const int total = iters * nsteps;

    uint16_t *xs = (uint16_t *)tc_sm;
    float *sx = (float *)(tc_sm + (size_t)XT * nt * p.tok * 2);
    float4 *part = (float4 *)(tc_sm + (((size_t)XT * nt * p.tok * 2 + (size_t)nt * p.nub * 4 + 15) & ~(size_t)15));

    auto tile_of = [&](int it) { return (cid + it * ncl) * RW + rw; };
#ifdef DSV4_TC_TRACE
    if (p.trace && lane == 0) p.trace[((size_t)blockIdx.x * TC_WARPS + warp) * 10 + 8] = tc_gtime();
    TC_TR(0);
#endif
    /* Programmatic dependent launch: let the next kernel of the stream start its launch now (it waits for this grid in
     * its own griddepcontrol.wait), load this warp's first two weight steps into registers, then wait for the previous
     * kernel's results (x). The weights are the model's, which no kernel of a forward writes, so they may be read before
     * the wait: a block launched while the previous kernel still runs has them when x is ready (session 23: batch 1
     * 0.985-0.994x against loading them after x). Both are no-ops without the launch attribute. Then x's loads and
     * staging (tc_stage8); the weights requested before the wait delay them (bench/NOTES.md "Decode GEMV fixed cost"). */
    dev_pdl_trigger();
    auto load = [&](tc_buf<CH> &b, int gs) { /* step gs into registers */
        if (gs < total) tc_load<FMT, CH>(J0, J, b, tile_of(gs / nsteps), ch0 + (gs % nsteps) * CH, ch1, g, c);
    };
    tc_buf<CH> b0, b1; /* two steps in flight */
    load(b0, 0), load(b1, 1);
    dev_pdl_wait();
    TC_TR(1);
    tc_stage8<FMT, XT, 1>(p, J0, J, xs, sx, ub0, nub);
    TC_TR(2);
    __syncthreads();
    TC_TR(3);

    float acc[NT][4], cu[NT][4];
#pragma unroll
    for (int n = 0; n < NT; n++)
#pragma unroll
        for (int i = 0; i < 4; i++) acc[n][i] = cu[n][i] = 0.0f;

    auto step = [&](const tc_buf<CH> &b, int gs) {
        const int it = gs / nsteps, st = gs - it * nsteps, tile = tile_of(it);
        const bool act = tile < J.NRT;
        if (act) {
#pragma unroll
            for (int i = 0; i < CH; i++) {
                const int ch = ch0 + st * CH + i;
                if (ch >= ch1) break;
                const int u = ch / V, v = V <= CH ? i % V : ch - u * V, ul = u - ub0;
                uint32_t fq[2][2]; /* FP4 factors per row, per half chunk */
                float sw[2];
                tc_scales<FMT>(b.a, i, J0.w.scale_f32, J.w.scale2, fq, sw);
                constexpr int NSUB = E >= 8 ? E / 8 : 1, KS = E >= 8 ? 2 : 1;
#pragma unroll
                for (int j = 0; j < NSUB; j++) {
                    uint32_t A[2][WT][4];
                    tc_decode<FMT>(b.q[i][0], j, fq[0][j >> 1], A[0]);
                    tc_decode<FMT>(b.q[i][1], j, fq[1][j >> 1], A[1]);
                    uint32_t B[XT][NT][4];
#pragma unroll
                    for (int xt = 0; xt < XT; xt++)
#pragma unroll
                        for (int n = 0; n < NT; n++) {
                            const int tok = g + 8 * n;
                            const uint16_t *bp = xs + (size_t)(xt * nt + tok) * p.tok + ul * 128 + (v * 4 + c) * E;
                            if (E >= 8) {
                                const int js = (FMT == DSV4_WF_MXFP4 || FMT == DSV4_WF_NVFP4) ? (j ^ ((c >> 1) & 1)) : j;
                                const uint4 t = tok < nt ? *(const uint4 *)(bp + js * 8) : make_uint4(0, 0, 0, 0);
                                B[xt][n][0] = t.x, B[xt][n][1] = t.y, B[xt][n][2] = t.z, B[xt][n][3] = t.w;
                            } else {
                                const uint2 t = tok < nt ? *(const uint2 *)bp : make_uint2(0, 0);
                                B[xt][n][0] = t.x, B[xt][n][1] = t.y;
                            }
                        }
#pragma unroll
                    for (int k = 0; k < KS; k++)
#pragma unroll
                        for (int n = 0; n < NT; n++)
#pragma unroll
                            for (int wt = 0; wt < WT; wt++)
#pragma unroll
                                for (int xt = 0; xt < XT; xt++)
                                    if (wt + xt <= 2)
                                        tc_mma<BF>(cu[n], A[0][wt][2 * k], A[1][wt][2 * k], A[0][wt][2 * k + 1], A[1][wt][2 * k + 1],
                                                   B[xt][n][2 * k], B[xt][n][2 * k + 1]);
                }
                if (v == V - 1) { /* end of a unit: scale and add */
#pragma unroll
                    for (int n = 0; n < NT; n++) {
                        const int t0 = 2 * c + 8 * n;
                        const float xa = t0 < nt ? sx[t0 * p.nub + ul] : 0.0f, xb = t0 + 1 < nt ? sx[(t0 + 1) * p.nub + ul] : 0.0f;
                        acc[n][0] = fmaf(cu[n][0], sw[0] * xa, acc[n][0]);
                        acc[n][1] = fmaf(cu[n][1], sw[0] * xb, acc[n][1]);
                        acc[n][2] = fmaf(cu[n][2], sw[1] * xa, acc[n][2]);
                        acc[n][3] = fmaf(cu[n][3], sw[1] * xb, acc[n][3]);
#pragma unroll
                        for (int k = 0; k < 4; k++) cu[n][k] = 0.0f;
                    }
                }
            }
        }
        if (st != nsteps - 1) return;
        /* end of the tile's slice: store (S == 1) or add the S slices in order */
        const int R = J.w.rows, r = tile * 16 + g;
        auto store = [&](const float (&v)[NT][4]) {
#pragma unroll
            for (int n = 0; n < NT; n++) {
                const int t = 2 * c + 8 * n;
                float *y0 = J.y + (int64_t)(p.t0 + t) * J.ldy, *y1 = y0 + J.ldy;
                if (r < R) {
                    if (t < nt) y0[r] = v[n][0];
                    if (t + 1 < nt) y1[r] = v[n][1];
                }
                if (r + 8 < R) {
                    if (t < nt) y0[r + 8] = v[n][2];
                    if (t + 1 < nt) y1[r + 8] = v[n][3];
                }
            }
        };
        if (S == 1) {
            if (act) store(acc);
        } else {
            const int buf = it & 1;
#pragma unroll
            for (int n = 0; n < NT; n++)
                part[((buf * TC_WARPS + warp) * NT + n) * 32 + lane] = make_float4(acc[n][0], acc[n][1], acc[n][2], acc[n][3]);
            if (KG > 1) cg::this_cluster().sync();
            else __syncthreads();
            if (kg == 0 && kw == 0 && act) {
                float sum[NT][4];
#pragma unroll 4
                for (int s2 = 0; s2 < S; s2++) {
                    const int kg2 = s2 / KW, kw2 = s2 - kg2 * KW;
#pragma unroll
                    for (int n = 0; n < NT; n++) {
                        const float4 *src = part + ((buf * TC_WARPS + rw * KW + kw2) * NT + n) * 32 + lane;
                        if (kg2 > 0) src = cg::this_cluster().map_shared_rank(src, kg2);
                        const float4 vv = *src;
                        if (s2 == 0) sum[n][0] = vv.x, sum[n][1] = vv.y, sum[n][2] = vv.z, sum[n][3] = vv.w;
                        else sum[n][0] += vv.x, sum[n][1] += vv.y, sum[n][2] += vv.z, sum[n][3] += vv.w;
                    }
                }
                store(sum);
            }
        }
#pragma unroll
        for (int n = 0; n < NT; n++)
#pragma unroll
            for (int k = 0; k < 4; k++) acc[n][k] = 0.0f;
    };

    /* step gs computes one buffer while the other (step gs + 1) is in flight, then refills it with step gs + 2 */
    for (int gs = 0; gs < total; gs += 2) {
        step(b0, gs);
#ifdef DSV4_TC_TRACE
        if (gs == 0) TC_TR(4);
#endif
        load(b0, gs + 2);
        if (gs + 1 >= total) break;
        step(b1, gs + 1);
        load(b1, gs + 3);
    }
    TC_TR(5);
    if (S > 1 && KG > 1) cg::this_cluster().sync(); /* peers' partials stay until the leader has read them */
#ifdef DSV4_TC_TRACE
    TC_TR(6);
    if (p.trace && lane == 0) p.trace[((size_t)blockIdx.x * TC_WARPS + warp) * 10 + 9] = tc_gtime();
#endif
}

/* ---- element path and prefill GEMM ---- */

template <int TB>
__global__ void __launch_bounds__(GEMV_WARPS * 32) gemv_any(dsv4_cuda_weight w, const void *x, int64_t ldx, int xbf16, int t0,
                                                            int nt, int Cpad, float *y, int64_t ldy) {
    extern __shared__ float4 xs4[];
    float *xs = (float *)xs4;
    const int C = w.cols, lane = threadIdx.x & 31;
    stage_x(xs, x, ldx, xbf16, x_round_bf16(w), t0, nt, TB, C, Cpad, w.act_quant);
    __syncthreads();
    for (int r = blockIdx.x * GEMV_WARPS + (threadIdx.x >> 5); r < w.rows; r += gridDim.x * GEMV_WARPS) {
        float acc[TB];
#pragma unroll
        for (int t = 0; t < TB; t++) acc[t] = 0.0f;
        for (int j = lane; j < C; j += 32) {
            float wv = dev_weight_at(w, r, j);
#pragma unroll
            for (int t = 0; t < TB; t++) acc[t] = fmaf(wv, xs[(size_t)t * Cpad + j], acc[t]);
        }
#pragma unroll
        for (int t = 0; t < TB; t++) {
            float v = warp_sum(acc[t]);
            if (lane == 0 && t < nt) y[(int64_t)(t0 + t) * ldy + r] = v;
        }
    }
}

#define GM_BM 64
#define GM_BN 64
#define GM_BK 128
#define GM_LD (GM_BK + 1)

/* 256 threads: tx = tid % 16 owns rows m0 + tx + 16 i, ty = tid / 16 tokens n0 + ty + 16 j. */
__global__ void __launch_bounds__(256) gemm_tiled(dsv4_cuda_weight w, const void *x, int64_t ldx, int xbf16, int T, float *y,
                                                  int64_t ldy) {
    extern __shared__ float gsm[];
    float *Ws = gsm, *Xs = gsm + GM_BM * GM_LD;
    const int tid = threadIdx.x, tx = tid & 15, ty = tid >> 4, lane = tid & 31, warp = tid >> 5;
    const int m0 = blockIdx.x * GM_BM, n0 = blockIdx.y * GM_BN, R = w.rows, C = w.cols, rnd = x_round_bf16(w);
    float acc[4][4] = {};
    for (int k0 = 0; k0 < C; k0 += GM_BK) {
        for (int e = tid; e < GM_BM * GM_BK; e += 256) {
            int m = e >> 7, k = e & 127;
            Ws[m * GM_LD + k] = (m0 + m < R && k0 + k < C) ? dev_weight_at(w, m0 + m, k0 + k) : 0.0f;
            Xs[m * GM_LD + k] = (n0 + m < T && k0 + k < C) ? load_xr(x, xbf16, rnd, (int64_t)(n0 + m) * ldx + k0 + k) : 0.0f;
        }
        __syncthreads();
        if (w.act_quant) {
            for (int n = warp; n < GM_BN; n += 8) {
                float v[4];
#pragma unroll
                for (int q = 0; q < 4; q++) v[q] = Xs[n * GM_LD + q * 32 + lane];
                warp_act_quant_fp8(v);
#pragma unroll
                for (int q = 0; q < 4; q++) Xs[n * GM_LD + q * 32 + lane] = v[q];
            }
            __syncthreads();
        }
#pragma unroll 4
        for (int k = 0; k < GM_BK; k++) {
            float a[4], b[4];
#pragma unroll
            for (int i = 0; i < 4; i++) a[i] = Ws[(tx + 16 * i) * GM_LD + k];
#pragma unroll
            for (int j = 0; j < 4; j++) b[j] = Xs[(ty + 16 * j) * GM_LD + k];
#pragma unroll
            for (int i = 0; i < 4; i++)
#pragma unroll
                for (int j = 0; j < 4; j++) acc[i][j] = fmaf(a[i], b[j], acc[i][j]);
        }
        __syncthreads();
    }
#pragma unroll
    for (int j = 0; j < 4; j++) {
        int n = n0 + ty + 16 * j;
        if (n >= T) continue;
#pragma unroll
        for (int i = 0; i < 4; i++) {
            int m = m0 + tx + 16 * i;
            if (m < R) y[(int64_t)n * ldy + m] = acc[i][j];
        }
    }
}

/* ---- launchers ---- */

typedef void (*gemv_fn)(dsv4_cuda_weight, const void *, int64_t, int, int, int, int, float *, int64_t);

static gemv_fn pick_any(int tb) {
    switch (tb) {
    case 1: return gemv_any<1>;
    case 2: return gemv_any<2>;
    case 4: return gemv_any<4>;
    default: return gemv_any<8>;
    }
}

template <int NJ> using tc_fn = void (*)(const tc_args<NJ>);

template <int NJ, int FMT> static tc_fn<NJ> pick_tc_fmt(int xt, int nt2) {
    if (xt == 1) return nt2 ? gemv_tc<FMT, 1, 2, NJ> : gemv_tc<FMT, 1, 1, NJ>;
    if constexpr (tc_fmt<FMT>::BF) return nt2 ? gemv_tc<FMT, 3, 2, NJ> : gemv_tc<FMT, 3, 1, NJ>;
    else return nt2 ? gemv_tc<FMT, 2, 2, NJ> : gemv_tc<FMT, 2, 1, NJ>;
}
template <int NJ> static tc_fn<NJ> pick_tc(int fmt, int xt, int nt2) {
    switch (fmt) {
    case DSV4_WF_F32: return pick_tc_fmt<NJ, DSV4_WF_F32>(xt, nt2);
    case DSV4_WF_BF16: return pick_tc_fmt<NJ, DSV4_WF_BF16>(xt, nt2);
    case DSV4_WF_F16: return pick_tc_fmt<NJ, DSV4_WF_F16>(xt, nt2);
    case DSV4_WF_FP8: return pick_tc_fmt<NJ, DSV4_WF_FP8>(xt, nt2);
    case DSV4_WF_MXFP4: return pick_tc_fmt<NJ, DSV4_WF_MXFP4>(xt, nt2);
    default: return pick_tc_fmt<NJ, DSV4_WF_NVFP4>(xt, nt2);
    }
}

static int tc_bf(int fmt) { return fmt == DSV4_WF_BF16 || fmt == DSV4_WF_F32; }
static int tc_padb(int fmt) {
    switch (fmt) {
    case DSV4_WF_FP8: return 16;
    case DSV4_WF_BF16:
    case DSV4_WF_F16: return 64;
    default: return 32;
    }
}
/* x terms: one when x is exact in 16 bits (act-quant codes, bf16 input or x rounded to bf16), else 2 (f16) / 3 (bf16). */
static int tc_xt(int fmt, int aq, int xbf16) { return aq || xbf16 ? 1 : tc_bf(fmt) ? 3 : 2; }
static int tc_tok(int fmt, int nub) { return nub * 128 + tc_padb(fmt) / 2; }
/* Units staged by the block with the most (slices s = kg * KW + kw cover units [s*NU/S, (s+1)*NU/S)). */
static int tc_nub(int NU, int S, int KG) {
    int KW = S / KG, m = 0;
    for (int kg = 0; kg < KG; kg++) {
        int n = (kg + 1) * KW * NU / S - kg * KW * NU / S;
        m = n > m ? n : m;
    }
    return m;
}
/* nt2: the 16-token kernel (its slice partials hold two n-tiles); < 0: as nt says */
static size_t tc_smem(int fmt, int xt, int nt, int nub, int S, int nt2 = -1) {
    size_t b = (size_t)xt * nt * tc_tok(fmt, nub) * 2 + (size_t)nt * nub * 4;
    b = (b + 15) & ~(size_t)15;
    if (nt2 < 0) nt2 = nt > 8;
    if (S > 1) b += (size_t)2 * TC_WARPS * (nt2 ? 2 : 1) * 32 * 16;
    return b;
}
/* Column slices S: from the shape and format only (so a row's summation order never depends on T): enough
 * (tile, slice) warps to cover the GPU (~1900 for 132 SMs x 16 warps), at most 16 (the warps of a block), or 64 for
 * matrices of at most 16 tiles (tc_small_tiles; clusters of up to 4 blocks); more when a block's staged x for one token would
 * not fit in shared memory (up to 8 blocks of 16 warps per cluster). At least one 128-column unit per slice. More
 * tokens than fit go in several launches (the weight is read once per launch); clusters are avoided otherwise
 * because their barrier (with its GPU-scope fence) drains the loads in flight at every tile. */
static int tc_kg(int S) { return S > 16 ? S / 16 : 1; }
/* Matrices of fewer than tc_small_tiles 16-row tiles take clusters (S up to 64). The bound is 17 (session 35: the
 * 256-row gate and indexer-compressor projections take 2-block clusters at S = 32, 32 blocks instead of 16 at S = 16,
 * where the weights projection is, so the three share a launch; batch 1 0.994x, batch 8 0.996x on an H100);
 * DSV4_LINEAR_SMALL_TILES=N moves it, for measurements (16: session 34's slicing). It sets those rows' summation order
 * (in every pass alike: decode and prefill stay bitwise equal); read once. */
static int tc_small_tiles = -1;
static int tc_slices(int fmt, int xt, int R, int C) {
    if (tc_small_tiles < 0) {
        tc_small_tiles = dsv4_env_int("DSV4_LINEAR_SMALL_TILES", 17);
        tc_small_tiles = tc_small_tiles < 1 ? 1 : tc_small_tiles > 4096 ? 4096 : tc_small_tiles;
    }
    const int NU = C / 128, NRT = (R + 15) / 16, cap = dsv4_cuda_dev.smem_optin, smax = NRT < tc_small_tiles ? 64 : 16;
    int S = 1;
    while (S < smax && 2 * S <= NU && (int64_t)NRT * S < 1900) S *= 2;
    while (S < 128 && 2 * S <= NU && tc_smem(fmt, xt, 1, tc_nub(NU, S, tc_kg(S)), S) > (size_t)cap) S *= 2;
    return S;
}

/* Resident clusters of KG blocks for a kernel and its shared memory (cached; the queries cost host time). */
struct tc_occ {
    const void *fn;
    int kg;
    size_t smem;
    int n;
};
static tc_occ tc_occ_cache[256];
static int tc_occ_n;
static int tc_max_clusters(const void *fn, int KG, size_t smem) {
    for (int i = 0; i < tc_occ_n; i++)
        if (tc_occ_cache[i].fn == fn && tc_occ_cache[i].kg == KG && tc_occ_cache[i].smem == smem) return tc_occ_cache[i].n;
    cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, dsv4_cuda_dev.smem_optin);
    int n = 0;
    if (KG == 1) {
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, fn, TC_THREADS, smem);
        n *= dsv4_cuda_dev.sm_count;
    } else {
        cudaLaunchConfig_t cfg = {};
        cudaLaunchAttribute at;
        at.id = cudaLaunchAttributeClusterDimension;
        at.val.clusterDim.x = KG, at.val.clusterDim.y = 1, at.val.clusterDim.z = 1;
        cfg.gridDim = dim3(KG);
        cfg.blockDim = dim3(TC_THREADS);
        cfg.dynamicSmemBytes = smem;
        cfg.attrs = &at;
        cfg.numAttrs = 1;
        cudaOccupancyMaxActiveClusters(&n, fn, &cfg);
    }
    cudaGetLastError();
    if (n < 1) n = 1;
    if (tc_occ_n < 256) tc_occ_cache[tc_occ_n++] = tc_occ{fn, KG, smem, n};
    return n;
}

/* 1: launch without the programmatic-dependent-launch attribute (refused once, or DSV4_LINEAR_NO_PDL=1); -1: not
 * decided yet */
static int tc_no_pdl = -1;
/* tc_half: DSV4_LINEAR_HALF=1 runs every T on the 16-token kernel, whose steps are half as long (TC_CH / 2 chunks a
 * lane: half the weight bytes requested ahead of x's loads; the same bits, as T = 9..16 shows) */
static int tc_half = 0;
#ifdef DSV4_TC_TRACE
static unsigned long long *tc_trace; /* experiments: the next launch records its timeline here */
extern "C" void dsv4_cuda_linear_trace(void *buf) { tc_trace = (unsigned long long *)buf; }
#endif

/* How the tensor-core GEMV cuts a weight (from its shape, format and x kind only): x terms, column slices, blocks
 * per cluster, 128-column units, staged units per block. ok = 0: the shape or alignment does not fit it (element path). */
struct tc_plan {
    int ok, xt, S, KG, NU, nub;
};
static tc_plan tc_plan_of(const dsv4_cuda_weight *w, int x_bf16) {
    tc_plan q = {};
    const int fmt = w->fmt, C = w->cols;
    if (C % 128 || ((uintptr_t)w->data & 15)) return q;
    if (fmt == DSV4_WF_FP8 && w->scale_f32 && ((uintptr_t)w->scale & 3)) return q;
    if (fmt == DSV4_WF_NVFP4 && (((uintptr_t)w->scale & 1) || (w->scale_stride & 1))) return q;
    q.xt = tc_xt(fmt, w->act_quant, x_bf16 || x_round_bf16(*w));
    q.S = tc_slices(fmt, q.xt, w->rows, C);
    q.NU = C / 128, q.KG = tc_kg(q.S), q.nub = tc_nub(q.NU, q.S, q.KG);
    q.ok = tc_smem(fmt, q.xt, 1, q.nub, q.S) <= (size_t)dsv4_cuda_dev.smem_optin;
    return q;
}
/* Two weights the same launch can take: what the jobs of a launch share (tc_job) */
static int tc_same(const dsv4_cuda_weight *a, const tc_plan &qa, const dsv4_cuda_weight *b, const tc_plan &qb) {
    return a->fmt == b->fmt && a->cols == b->cols && a->act_quant == b->act_quant && x_round_bf16(*a) == x_round_bf16(*b) &&
           (a->fmt != DSV4_WF_FP8 || a->scale_f32 == b->scale_f32) && qa.xt == qb.xt && qa.S == qb.S && qa.KG == qb.KG;
}

/* Launches the tensor-core GEMV for nj <= NJ jobs (jobs[i].w, x, y, ldx, ldy set; all with plan q and tc_same), 16
 * rows of x per launch. One job: min(resident clusters, row groups) clusters loop over its row groups. Several: each
 * job gets ceil(NRG / k) clusters of its own, k the fewest row groups per cluster with which all jobs' clusters are
 * resident at once. Returns 0, or -1 on a launch error. */
template <int NJ> static int tc_run(const tc_job *jobs, int nj, const tc_plan &q, int x_bf16, int T, cudaStream_t st) {
    if (tc_no_pdl < 0) {
        tc_no_pdl = dsv4_env_int("DSV4_LINEAR_NO_PDL", 0) != 0;
        tc_half = dsv4_env_int("DSV4_LINEAR_HALF", tc_half) != 0;
    }
    const int fmt = jobs[0].w.fmt, S = q.S, KG = q.KG, KW = S / KG, RW = TC_WARPS / KW;
    const size_t cap = (size_t)dsv4_cuda_dev.smem_optin;
    int TB = T < 16 ? T : 16; /* more rows: 16 per launch (the weight is read once per 16 rows) */
    while (TB > 1 && tc_smem(fmt, q.xt, TB, q.nub, S) > cap) TB = (TB + 1) / 2;
    tc_args<NJ> a; /* kernel parameters (NJ = TC_MAXJ: ~1.9 KB) */
    a.p.xbf16 = x_bf16;
    a.p.S = S, a.p.KW = KW, a.p.KG = KG;
    a.p.NU = q.NU, a.p.nub = q.nub, a.p.tok = tc_tok(fmt, q.nub), a.p.nj = nj;
#ifdef DSV4_TC_TRACE
    a.p.trace = tc_trace;
    tc_trace = NULL;
#endif
    int nrg_max = 0, nrg_sum = 0;
    for (int j = 0; j < nj; j++) {
        a.j[j] = jobs[j];
        a.j[j].xv = ((uintptr_t)jobs[j].x & (x_bf16 ? 7 : 15)) == 0 && jobs[j].ldx % 4 == 0;
        a.j[j].NRT = (jobs[j].w.rows + 15) / 16;
        a.j[j].NRG = (a.j[j].NRT + RW - 1) / RW;
        nrg_max = a.j[j].NRG > nrg_max ? a.j[j].NRG : nrg_max;
        nrg_sum += a.j[j].NRG;
    }
    for (int t0 = 0; t0 < T; t0 += TB) {
        a.p.t0 = t0, a.p.nt = T - t0 < TB ? T - t0 : TB;
        const int nt2 = a.p.nt > 8 || (tc_half && tc_smem(fmt, q.xt, a.p.nt, q.nub, S, 1) <= cap);
        tc_fn<NJ> fn = pick_tc<NJ>(fmt, q.xt, nt2);
        const size_t smem = tc_smem(fmt, q.xt, a.p.nt, q.nub, S, nt2);
        const int N = tc_max_clusters((const void *)fn, KG, smem);
        int ncl = 0;
        if (nj == 1) {
            ncl = N < nrg_sum ? N : nrg_sum;
            a.j[0].c0 = 0, a.j[0].ncl = ncl;
        } else {
            int k = (nrg_sum + N - 1) / N;
            for (k = k > 1 ? k : 1; k < nrg_max; k++) {
                int n = 0;
                for (int j = 0; j < nj; j++) n += (a.j[j].NRG + k - 1) / k;
                if (n <= N) break;
            }
            for (int j = 0; j < nj; j++) a.j[j].c0 = ncl, a.j[j].ncl = (a.j[j].NRG + k - 1) / k, ncl += a.j[j].ncl;
        }
        cudaLaunchConfig_t cfg = {};
        cudaLaunchAttribute at[2];
        int na = 0;
        if (KG > 1) {
            at[na].id = cudaLaunchAttributeClusterDimension;
            at[na].val.clusterDim.x = KG, at[na].val.clusterDim.y = 1, at[na].val.clusterDim.z = 1;
            na++;
        }
        if (!tc_no_pdl) {
            at[na].id = cudaLaunchAttributeProgrammaticStreamSerialization;
            at[na].val.programmaticStreamSerializationAllowed = 1;
            na++;
        }
        cfg.gridDim = dim3(ncl * KG);
        cfg.blockDim = dim3(TC_THREADS);
        cfg.dynamicSmemBytes = smem;
        cfg.stream = st;
        cfg.attrs = at;
        cfg.numAttrs = na;
        cudaError_t e = cudaLaunchKernelEx(&cfg, fn, a);
        if (e != cudaSuccess && !tc_no_pdl) { /* no programmatic dependent launch here: plain stream order */
            cudaGetLastError();
            tc_no_pdl = 1;
            cfg.numAttrs = KG > 1 ? 1 : 0;
            e = cudaLaunchKernelEx(&cfg, fn, a);
        }
        if (e != cudaSuccess) {
            cudaGetLastError();
            return dsv4_cuda_fail("linear: tensor-core gemv launch: %s", cudaGetErrorString(e));
        }
    }
    return dsv4_cuda_check_launch("linear (tensor-core gemv)");
}

/* The jobs of one GEMV launch: the multi-token GEMM when T and the workspace allow, else the GEMV. */
static int tc_mt = -1; /* DSV4_LINEAR_MT=0: the GEMV for every T (measurements) */
template <int NJ>
static int tc_any(const tc_job *jobs, int nj, const tc_plan &q, int x_bf16, int T, void *ws, size_t wsb, cudaStream_t st) {
    if (tc_mt < 0) tc_mt = dsv4_env_int("DSV4_LINEAR_MT", 1) != 0;
    if (T >= DSV4_LINEAR_BI_MIN_T && ws && tc_mt) {
        const int r = dsv4_linear_bi_run(jobs, nj, q.xt, q.S, x_bf16, T, ws, wsb, st);
        if (r <= 0) return r;
    }
    return tc_run<NJ>(jobs, nj, q, x_bf16, T, st);
}

static int bad_weight(const dsv4_cuda_weight *w, int T) {
    if (!w || !w->data || w->rows <= 0 || w->cols <= 0 || T < 0 || (unsigned)w->fmt >= DSV4_WF_COUNT)
        return dsv4_cuda_fail("linear: bad weight or shape (rows %d cols %d T %d)", w ? w->rows : 0, w ? w->cols : 0, T);
    if ((w->fmt == DSV4_WF_MXFP4 || w->fmt == DSV4_WF_NVFP4) && (w->cols & 1))
        return dsv4_cuda_fail("linear: FP4 weight with odd column count %d", w->cols);
    return 0;
}

/* y = x . W^T for x rows at stride ldx and y rows at stride ldy (elements); T > 0, the weight checked. */
static int linear_one(const dsv4_cuda_weight *w, const void *x, int64_t ldx, int x_bf16, int T, float *y, int64_t ldy,
                      void *ws, size_t wsb, cudaStream_t st) {
    const int C = w->cols;
    /* tensor-core GEMV for every T (16 rows of x per launch), or from DSV4_LINEAR_BI_MIN_T rows with a workspace the
     * multi-token GEMM: a row's result is the same whatever T is */
    const tc_plan q = tc_plan_of(w, x_bf16);
    if (q.ok) {
        tc_job j = {};
        j.w = *w, j.x = x, j.y = y, j.ldx = (int)ldx, j.ldy = (int)ldy;
        return tc_any<1>(&j, 1, q, x_bf16, T, ws, wsb, st);
    }
    if (T <= DSV4_LINEAR_ELEM_MAXT) {
        /* element path: x rows staged in shared memory, 8 tokens per pass (a row's result does not depend on T: decode
         * batches of any bucket; only longer passes take the tiled GEMM, whose summation order differs) */
        int cpad = (C + 127) / 128 * 128;
        int tb = T == 1 ? 1 : T == 2 ? 2 : T <= 4 ? 4 : 8;
        while (tb > 1 && (size_t)tb * cpad * sizeof(float) > (size_t)dsv4_cuda_dev.smem_optin) tb >>= 1;
        size_t smem = (size_t)tb * cpad * sizeof(float);
        if (smem <= (size_t)dsv4_cuda_dev.smem_optin) {
            gemv_fn fn = pick_any(tb);
            if (smem > 48 * 1024 && cudaFuncSetAttribute((const void *)fn, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem) != cudaSuccess)
                return dsv4_cuda_fail("linear: cannot raise shared memory to %zu bytes", smem);
            int per_sm = 0;
            cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, (const void *)fn, GEMV_WARPS * 32, smem);
            if (per_sm < 1) per_sm = 1;
            int grid = (w->rows + GEMV_WARPS - 1) / GEMV_WARPS;
            if (grid > per_sm * dsv4_cuda_dev.sm_count) grid = per_sm * dsv4_cuda_dev.sm_count;
            for (int t0 = 0; t0 < T; t0 += tb) {
                int nt = T - t0 < tb ? T - t0 : tb;
                fn<<<grid, GEMV_WARPS * 32, smem, st>>>(*w, x, ldx, x_bf16, t0, nt, cpad, y, ldy);
            }
            return dsv4_cuda_check_launch("linear (gemv)");
        }
    }
    size_t smem = (size_t)(GM_BM + GM_BN) * GM_LD * sizeof(float);
    static int gemm_attr;
    if (!gemm_attr) {
        if (cudaFuncSetAttribute((const void *)gemm_tiled, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem) != cudaSuccess)
            return dsv4_cuda_fail("linear: cannot raise shared memory to %zu bytes", smem);
        gemm_attr = 1;
    }
    dim3 grid((w->rows + GM_BM - 1) / GM_BM, (T + GM_BN - 1) / GM_BN);
    if (grid.y > 65535) return dsv4_cuda_fail("linear: T %d too large", T);
    gemm_tiled<<<grid, 256, smem, st>>>(*w, x, ldx, x_bf16, T, y, ldy);
    return dsv4_cuda_check_launch("linear (gemm)");
}

extern "C" int dsv4_cuda_linear_ws(const dsv4_cuda_weight *w, const void *x, int x_bf16, int T, float *y, void *ws, size_t wsb,
                                   void *stream) {
    if (bad_weight(w, T)) return -1;
    if (T == 0) return 0;
    if (!x_bf16) { /* the QGMMA prototype (linear_q8.cu), when switched on and the shape fits it */
        const int r = dsv4_linear_q8_run(w, (const float *)x, T, y, DSV4_STREAM(stream));
        if (r <= 0) return r;
    }
    return linear_one(w, x, w->cols, x_bf16, T, y, w->rows, ws, wsb, DSV4_STREAM(stream));
}
extern "C" int dsv4_cuda_linear(const dsv4_cuda_weight *w, const void *x, int x_bf16, int T, float *y, void *stream) {
    return dsv4_cuda_linear_ws(w, x, x_bf16, T, y, NULL, 0, stream);
}

extern "C" int dsv4_cuda_linear_multi(const dsv4_cuda_linear_job *jobs, int n, int x_bf16, int T, void *stream) {
    return dsv4_cuda_linear_multi_ws(jobs, n, x_bf16, T, NULL, 0, stream);
}

extern "C" int dsv4_cuda_linear_multi_ws(const dsv4_cuda_linear_job *jobs, int n, int x_bf16, int T, void *ws, size_t wsb,
                                         void *stream) {
    if (n < 0 || (n > 0 && !jobs) || T < 0) return dsv4_cuda_fail("linear multi: bad job list (n %d T %d)", n, T);
    for (int i = 0; i < n; i++) {
        const dsv4_cuda_linear_job *jb = &jobs[i];
        if (bad_weight(&jb->w, T)) return -1;
        if ((jb->ldx && jb->ldx < jb->w.cols) || (jb->ldy && jb->ldy < jb->w.rows) || jb->ldx > 0x7fffffff || jb->ldy > 0x7fffffff ||
            (T > 0 && (!jb->x || !jb->y)))
            return dsv4_cuda_fail("linear multi: job %d: bad x / y (row strides %lld, %lld)", i, (long long)jb->ldx,
                                  (long long)jb->ldy);
    }
    if (T == 0 || n == 0) return 0;
    if (n > 64) /* grouped 64 jobs at a time */
        return dsv4_cuda_linear_multi_ws(jobs, 64, x_bf16, T, ws, wsb, stream) ||
                       dsv4_cuda_linear_multi_ws(jobs + 64, n - 64, x_bf16, T, ws, wsb, stream)
                   ? -1
                   : 0;
    cudaStream_t st = DSV4_STREAM(stream);
    uint64_t done = 0; /* jobs already launched */
    for (int i = 0; i < n; i++) {
        if (done >> i & 1) continue;
        const dsv4_cuda_linear_job *ji = &jobs[i];
        const tc_plan q = tc_plan_of(&ji->w, x_bf16);
        if (!q.ok) { /* the element path, on its own */
            if (linear_one(&ji->w, ji->x, ji->ldx ? ji->ldx : ji->w.cols, x_bf16, T, ji->y, ji->ldy ? ji->ldy : ji->w.rows, ws, wsb,
                           st))
                return -1;
            continue;
        }
        tc_job tj[TC_MAXJ]; /* job i and the next ones that can share its launch */
        int nj = 0;
        for (int k = i; k < n && nj < TC_MAXJ; k++) {
            const dsv4_cuda_linear_job *jk = &jobs[k];
            if ((done >> k & 1) || (k > i && !tc_same(&ji->w, q, &jk->w, tc_plan_of(&jk->w, x_bf16)))) continue;
            tc_job &t = tj[nj++];
            t = tc_job{};
            t.w = jk->w, t.x = jk->x, t.y = jk->y;
            t.ldx = jk->ldx ? (int)jk->ldx : jk->w.cols, t.ldy = jk->ldy ? (int)jk->ldy : jk->w.rows;
            done |= 1ull << k;
        }
        if (nj == 1 ? tc_any<1>(tj, 1, q, x_bf16, T, ws, wsb, st) : tc_any<TC_MAXJ>(tj, nj, q, x_bf16, T, ws, wsb, st)) return -1;
    }
    return 0;
}
