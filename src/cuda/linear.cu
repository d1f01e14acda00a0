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
#include <string.h>

#include "common.cuh"
#include "linear_gemv.cuh"
#include "moe_group.cuh"

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
/* ---- chains (dsv4_cuda_linear_chain): GEMV stages in one launch ----
 * A decode step's linears often come in a row: wq_a + wkv, the RMSNorm of qr, wq_b. Each launch boundary drains the
 * weight stream (a GEMV block fills its SM, so the next kernel's blocks cannot start and load ahead until it exits;
 * bench/NOTES.md "Session 35"). A chain runs the stages in the same resident blocks: a block that ends stage s arrives
 * at a grid-wide barrier, issues its first two weight steps of stage s + 1 (which depend on nothing) and only then
 * waits; the last block to arrive runs the RMSNorm between the stages, if any, and opens the barrier. Each stage is
 * what its own launch would compute (its jobs, slices, summation order), so every row is bitwise the separate calls'.
 * The barrier: a count that the last arrival wraps to 0 (atomicInc) and a generation it advances, per slot (a call
 * site: two chains never share one at once); the grid is never larger than the resident blocks (so every block runs
 * at once: the blocks that wait hold their SMs). The stages run as straight-line code, each with its values at fixed
 * places in the parameters: a stage loop (a runtime index into them) made ptxas spill inside the GEMV's steps. */
#define TC_MAXST 3
#define TC_CHAIN_SLOTS 8
/* A chain's job table: stage 0's jobs from 0 (up to TC_MAXJ: Pro's 16 wo_a groups), stage 1's from TC_MAXJ, stage 2's
 * from TC_MAXJ + TC_CJS (up to TC_CJS each): every stage's first job at a fixed place (its act quant, bf16 rounding, FP8
 * scale kind and row length are read from it, as a launch's job 0). */
#define TC_CJS 4
#define TC_CJ (TC_MAXJ + 2 * TC_CJS)
__host__ __device__ constexpr int tc_cj0(int s) { return s == 0 ? 0 : TC_MAXJ + (s - 1) * TC_CJS; }
struct tc_chain {
    int nst, slot;
    int sync[TC_MAXST];  /* before stage s > 0: wait for the stages before (it reads what they write) */
    float *nx[TC_MAXST]; /* with sync: the RMSNorm (dsv4_cuda_rmsnorm's bits) of rows t0 .. t0+nt-1 of nx first */
    const float *nw[TC_MAXST];
    int nn[TC_MAXST], nld[TC_MAXST];
    float eps[TC_MAXST];
};
/* p[s]: stage s's launch parameters (its jobs tc_cj0(s) .. + nj - 1 of the table, slicing, staging layout), as its own
 * launch's. The stages run as straight-line code (gemv_tc_chain), so each stage's values sit at fixed offsets (a
 * runtime index into the parameters in the GEMV's loop costs registers it does not have: ptxas spilled in the steps). */
/* The routing tail (gemv_tc_route, dsv4_cuda_linear_route): moe_route_group_block's arguments */
struct tc_route {
    const float *logits, *bias;
    const int *tid2eid, *tokens, *sid;
    int *sel;
    float *weight;
    dsv4_cuda_moe_plan p;
    int E, K, T;
    float scale;
    size_t goff;
};
struct tc_cargs {
    tc_params p[TC_MAXST];
    tc_job j[TC_CJ];
    tc_chain c;
    tc_route r;
};
static_assert(sizeof(tc_cargs) <= 4096, "a chain's parameters fit the classic 4 KB kernel-parameter space");
template <int NJ> __device__ __forceinline__ const tc_params &tc_pp(const tc_args<NJ> &a, int) { return a.p; }
__device__ __forceinline__ const tc_params &tc_pp(const tc_cargs &a, int s) { return a.p[s]; }

__device__ unsigned tc_chain_bar[2 * TC_CHAIN_SLOTS]; /* per slot: arrivals, generation */
__device__ __forceinline__ unsigned tc_ld_acquire(const unsigned *p) {
    unsigned v;
    asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}
__device__ __forceinline__ unsigned tc_ld_relaxed(const unsigned *p) {
    unsigned v;
    asm volatile("ld.relaxed.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}
__device__ __forceinline__ void tc_st_release(unsigned *p, unsigned v) {
    asm volatile("st.release.gpu.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}
/* The chain's own shared memory: TC_CHAIN_SMEM bytes at the end of the dynamic region (past every stage's staging;
 * a kernel with static shared memory could not raise its dynamic limit to the opt-in maximum): [0] the generation the
 * block arrived in, [1] whether it arrived last; from byte 128 the RMSNorm's 16 warp sums. */
#define TC_CHAIN_SMEM 256
__device__ __forceinline__ unsigned *tc_chain_sh() {
    extern __shared__ __align__(16) unsigned char tc_sm[];
    unsigned dyn;
    asm("mov.u32 %0, %%dynamic_smem_size;" : "=r"(dyn));
    return (unsigned *)(tc_sm + dyn - TC_CHAIN_SMEM);
}
/* RMSNorm of rows t0 .. t0+nt-1 of x (n <= 8 RMS_NT values, rows ld apart) in place, two rows at once (threads 256 h ..
 * 256 h + 255 take row t0 + 2 i + h): thread j of a half plays rmsnorm_kernel's thread j (RMS_NT = 256), its quads j,
 * j + 256 (at most two: held in registers, one read of the row) in order, warp_sum_d, rms_sum8 over the half's 8
 * warps; then x r times the weight, element by element, as both of rmsnorm_kernel's forms. Reads x at L2 (the other
 * blocks wrote it). part: 16 doubles of shared memory. */
__device__ __noinline__ void tc_chain_norm(float *x, int ld, int n, const float *w, float eps, int t0, int nt, double *part) {
    const int h = threadIdx.x >> 8, j = threadIdx.x & (RMS_NT - 1);
    for (int i = 0; 2 * i < nt; i++) {
        const int t = 2 * i + h;
        float *row = x + (int64_t)(t0 + (t < nt ? t : 0)) * ld;
        float v[2][4];
#pragma unroll
        for (int k = 0; k < 2; k++)
#pragma unroll
            for (int u = 0; u < 4; u++) {
                const int e = 4 * (j + k * RMS_NT) + u;
                v[k][u] = t < nt && e < n ? __ldcg(row + e) : 0.0f;
            }
        double ss = 0;
#pragma unroll
        for (int k = 0; k < 2; k++)
#pragma unroll
            for (int u = 0; u < 4; u++)
                if (t < nt && 4 * (j + k * RMS_NT) + u < n) ss += (double)v[k][u] * v[k][u];
        ss = warp_sum_d(ss);
        if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = ss;
        __syncthreads();
        ss = rms_sum8(part + h * (RMS_NT / 32));
        const float r = 1.0f / sqrtf((float)(ss / n) + eps);
#pragma unroll
        for (int k = 0; k < 2; k++)
#pragma unroll
            for (int u = 0; u < 4; u++) {
                const int e = 4 * (j + k * RMS_NT) + u;
                if (t < nt && e < n) row[e] = w ? __fmul_rn(w[e], __fmul_rn(v[k][u], r)) : __fmul_rn(v[k][u], r);
            }
        __syncthreads(); /* part is reused */
    }
}
/* Before stage stg (with sync): the block has ended the stage before (the barrier inside also keeps its staged x until
 * every warp is done with it). As cooperative groups' grid sync: the block's barrier, then its thread 0 fences (its
 * block's stores, ordered before the fence by the barrier, go before the count) and counts the block in; the generation
 * is read before the count moves (it cannot advance before this block arrives). The last block to arrive fences again
 * (the grid's stores before its reads), runs the stage's RMSNorm at once (before its weight loads: nothing else is
 * live) and opens the barrier with a release store; the others issue their first weight steps, then wait in
 * tc_chain_wait. */
__device__ __forceinline__ void tc_chain_count(unsigned *sh, unsigned *bar) {
    __syncthreads();
    if (threadIdx.x == 0) {
        const unsigned g0 = tc_ld_acquire(bar + 1);
        __threadfence();
        const unsigned old = atomicInc(bar, gridDim.x - 1);
        if (old == gridDim.x - 1) __threadfence();
        sh[0] = g0, sh[1] = old == gridDim.x - 1;
    }
    __syncthreads();
}
__device__ __forceinline__ void tc_chain_arrive(const tc_chain &c, int stg, int t0, int nt) {
    unsigned *sh = tc_chain_sh(), *bar = tc_chain_bar + 2 * c.slot;
    tc_chain_count(sh, bar);
    if (sh[1]) {
        if (c.nx[stg]) tc_chain_norm(c.nx[stg], c.nld[stg], c.nn[stg], c.nw[stg], c.eps[stg], t0, nt, (double *)(sh + 32));
        __syncthreads();
        if (threadIdx.x == 0) tc_st_release(bar + 1, sh[0] + 1);
    }
}
/* the blocks but the last: wait until the last one opens the barrier */
__device__ __forceinline__ void tc_chain_wait(int slot) {
    const unsigned *sh = tc_chain_sh(), *bar = tc_chain_bar + 2 * slot;
    if (!sh[1] && threadIdx.x == 0) {
        /* polled relaxed, not with ld.acquire: an acquire invalidates the SM's L1 (CCTL.IVALL) at every poll, beside the
         * weight loads in flight (session 36's first device run: the chains 9-11 us slower than the separate calls) */
        while (tc_ld_relaxed(bar + 1) == sh[0]) __nanosleep(32);
        __threadfence(); /* as cooperative groups' grid sync: the block's reads after the barrier see the grid's writes */
    }
    __syncthreads();
}

/* One stage of the GEMV: a launch's whole work, or stage stg of a chain (CHAIN) */
template <int FMT, int XT, int NT, int NJ, int CHAIN, class KA>
__device__ __forceinline__ void gemv_tc_stage(const KA &ka, const int stg) {
    using F = tc_fmt<FMT>;
    constexpr int V = F::V, E = F::E, WT = F::WT, BF = F::BF;
    extern __shared__ __align__(16) unsigned char tc_sm[];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, c = lane & 3;
    const tc_params &p = tc_pp(ka, stg);
    if constexpr (CHAIN) { /* every block, idle ones too, ends the stage before: the next waits for the whole grid */
        if (stg > 0 && ka.c.sync[stg]) tc_chain_arrive(ka.c, stg, p.t0, p.nt);
        else if (stg > 0) __syncthreads(); /* the block's warps are done with the staged x before it is restaged */
    }
    const int KW = p.KW, KG = p.KG, RW = TC_WARPS / KW, S = p.S, NU = p.NU, nt = p.nt, jb = CHAIN ? tc_cj0(stg) : 0;
    const int kw = warp % KW, rw = warp / KW;
    int ji = 0, cid = blockIdx.x / KG, ncl = gridDim.x / KG;
    if (NJ > 1) {
        for (int i = 1; i < p.nj; i++) ji = cid >= ka.j[jb + i].c0 ? i : ji;
        cid -= ka.j[jb + ji].c0, ncl = ka.j[jb + ji].ncl;
    }
    const tc_job &J0 = ka.j[jb], &J = ka.j[jb + ji];
    const bool idle = CHAIN && cid >= ncl; /* a chain's grid is its largest stage's: the other stages leave blocks idle */
    const int kg = KG > 1 ? (int)cg::this_cluster().block_rank() : 0;
    const int s = kg * KW + kw;
    const int ub0 = kg * KW * NU / S, nub = (kg + 1) * KW * NU / S - ub0; /* the block's units */
    const int ch0 = (s * NU / S) * V, ch1 = ((s + 1) * NU / S) * V;       /* the warp's chunks */
    constexpr int CH = NT == 2 ? TC_CH / 2 : TC_CH; /* 16 tokens: fewer chunks in flight per lane (registers) */
    /* steps per tile: the same for every warp (from the largest slice), so that all warps of the grid reach the
     * per-tile barrier in the same iteration of the unrolled loop below */
    const int nsteps = (((NU + S - 1) / S) * V + CH - 1) / CH;
    const int iters = (J.NRG + ncl - 1) / ncl;
    const int total = idle ? 0 : iters * nsteps;

    uint16_t *xs = (uint16_t *)tc_sm;
    float *sx = (float *)(tc_sm + (size_t)XT * nt * p.tok * 2);
    float4 *part = (float4 *)(tc_sm + (((size_t)XT * nt * p.tok * 2 + (size_t)nt * p.nub * 4 + 15) & ~(size_t)15));

    auto tile_of = [&](int it) { return (cid + it * ncl) * RW + rw; };
#ifdef DSV4_TC_TRACE
    if (p.trace && lane == 0) p.trace[((size_t)blockIdx.x * TC_WARPS + warp) * 10 + 8] = tc_gtime();
    TC_TR(0);
#endif
    /* Programmatic dependent launch: let the next kernel of the stream start its launch now (it waits for this
     * grid in its own griddepcontrol.wait), load this warp's first two weight steps into registers, then wait for
     * the previous kernel's results (x; a chain's later stage: for the stages before it, tc_chain_wait). The weights
     * are the model's, which no kernel of a forward writes, so they may be read before the wait: a block launched
     * while the previous kernel still runs has them when x is ready (session 23: batch 1 0.985-0.994x against
     * loading them after x), and a chain's stage has them in flight while the stage before it ends. The PDL calls
     * are no-ops without the launch attribute. Then x's loads and staging (tc_stage8); the weights requested before
     * the wait delay them (bench/NOTES.md "Decode GEMV fixed cost"). */
    if (stg == 0) dev_pdl_trigger();
    auto load = [&](tc_buf<CH> &b, int gs) { /* step gs into registers */
        if (gs < total) tc_load<FMT, CH>(J0, J, b, tile_of(gs / nsteps), ch0 + (gs % nsteps) * CH, ch1, g, c);
    };
    tc_buf<CH> b0, b1; /* two steps in flight */
    load(b0, 0), load(b1, 1);
    if (stg == 0) dev_pdl_wait();
    else if constexpr (CHAIN) {
        if (ka.c.sync[stg]) tc_chain_wait(ka.c.slot);
    }
    if (idle) return;
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
template <int FMT, int XT, int NT, int NJ>
__global__ void __launch_bounds__(TC_THREADS, 1) gemv_tc(const __grid_constant__ tc_args<NJ> ka) {
    gemv_tc_stage<FMT, XT, NT, NJ, 0>(ka, 0);
}
/* The gate and the routing (dsv4_cuda_linear_route): the GEMV as a one-stage chain, then every block counts itself in
 * at the chain's barrier (tc_chain_count: the same fences) and the last one routes and groups the tokens from the
 * logits the grid wrote (moe_route_group_block, as moe_route_group_kernel; its shared memory from the start of the
 * dynamic region, past the GEMV's use). No block waits for another: any grid size, anything beside it. */
template <int FMT, int XT>
__global__ void __launch_bounds__(TC_THREADS, 1) gemv_tc_route(const __grid_constant__ tc_cargs ka) {
    extern __shared__ __align__(16) unsigned char tc_sm[];
    gemv_tc_stage<FMT, XT, 1, TC_MAXJ, 1>(ka, 0);
    unsigned *sh = tc_chain_sh(), *bar = tc_chain_bar + 2 * ka.c.slot;
    tc_chain_count(sh, bar);
    if (!sh[1]) return;
    const tc_route &r = ka.r;
    moe_route_group_block(r.logits, r.E, r.K, r.bias, r.tid2eid, r.tokens, r.scale, r.sid, r.T, r.goff, r.sel, r.weight, r.p,
                          (uint32_t *)tc_sm);
    __syncthreads();
    if (threadIdx.x == 0) tc_st_release(bar + 1, sh[0] + 1);
}
/* A chain (dsv4_cuda_linear_chain) of 2 or 3 stages: stage 0 with XT0 x terms, the others with XT */
template <int FMT, int XT0, int XT, int NT>
__global__ void __launch_bounds__(TC_THREADS, 1) gemv_tc_chain(const __grid_constant__ tc_cargs ka) {
    gemv_tc_stage<FMT, XT0, NT, TC_MAXJ, 1>(ka, 0);
    gemv_tc_stage<FMT, XT, NT, TC_MAXJ, 1>(ka, 1);
    if (ka.c.nst > 2) gemv_tc_stage<FMT, XT, NT, TC_MAXJ, 1>(ka, 2);
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
    cudaFuncAttributes fa; /* static shared memory (the routing tail's scan) comes out of the same opt-in maximum */
    const int st = cudaFuncGetAttributes(&fa, fn) == cudaSuccess ? (int)fa.sharedSizeBytes : 0;
    cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, dsv4_cuda_dev.smem_optin - st);
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

/* a job of a grouped call: its weight, x / y and row strides (`what`: the call, for the message) */
static int bad_job(const dsv4_cuda_linear_job *jb, int i, int T, const char *what) {
    if (bad_weight(&jb->w, T)) return -1;
    if ((jb->ldx && jb->ldx < jb->w.cols) || (jb->ldy && jb->ldy < jb->w.rows) || jb->ldx > 0x7fffffff || jb->ldy > 0x7fffffff ||
        (T > 0 && (!jb->x || !jb->y)))
        return dsv4_cuda_fail("%s: job %d: bad x / y (row strides %lld, %lld)", what, i, (long long)jb->ldx, (long long)jb->ldy);
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
    for (int i = 0; i < n; i++)
        if (bad_job(&jobs[i], i, T, "linear multi")) return -1;
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

/* ---- chains (the kernel side: "chains" above) ---- */

using tc_cfn = void (*)(const tc_cargs);
/* The forms a chain takes: stage 0's x terms xt0 and the later stages' xt, each one (x exact in 16 bits: act quant)
 * or the format's split of fp32 x (2 f16 / 3 bf16 terms), the later stages' not more than stage 0's. F32 weights: the
 * separate calls. ptxas -v: no spill but F16's two-term form's 4 bytes, once a stage (scripts/spill_budget.txt). */
template <int FMT> static tc_cfn pick_chain_fmt(int xt0, int xt) {
    constexpr int XN = tc_fmt<FMT>::BF ? 3 : 2;
    if (xt0 == 1 && xt == 1) return gemv_tc_chain<FMT, 1, 1, 1>;
    if (xt0 == XN && xt == 1) return gemv_tc_chain<FMT, XN, 1, 1>;
    if (xt0 == XN && xt == XN) { /* NVFP4's spilled 8-20 bytes inside the steps (ptxas, cuobjdump): the separate calls */
        if constexpr (FMT == DSV4_WF_NVFP4) return NULL;
        else return gemv_tc_chain<FMT, XN, XN, 1>;
    }
    return NULL;
}
static tc_cfn pick_chain(int fmt, int xt0, int xt) {
    switch (fmt) {
    case DSV4_WF_BF16: return pick_chain_fmt<DSV4_WF_BF16>(xt0, xt);
    case DSV4_WF_F16: return pick_chain_fmt<DSV4_WF_F16>(xt0, xt);
    case DSV4_WF_FP8: return pick_chain_fmt<DSV4_WF_FP8>(xt0, xt);
    case DSV4_WF_MXFP4: return pick_chain_fmt<DSV4_WF_MXFP4>(xt0, xt);
    case DSV4_WF_NVFP4: return pick_chain_fmt<DSV4_WF_NVFP4>(xt0, xt);
    default: return NULL;
    }
}

extern "C" int dsv4_cuda_linear_chain(const dsv4_cuda_linear_stage *st, int ns, int x_bf16, int T, int slot, void *stream) {
    if (ns < 0 || (ns > 0 && !st) || T < 0 || slot < 0 || slot >= TC_CHAIN_SLOTS)
        return dsv4_cuda_fail("linear chain: bad stage list (%d stages, T %d, slot %d)", ns, T, slot);
    int njt = 0;
    for (int s = 0; s < ns; s++) {
        if (st[s].n < 1 || !st[s].jobs) return dsv4_cuda_fail("linear chain: stage %d has no jobs", s);
        if (st[s].norm_x && (s == 0 || !st[s].sync))
            return dsv4_cuda_fail("linear chain: stage %d: an RMSNorm needs the barrier before the stage (sync)", s);
        if (st[s].norm_x && (st[s].norm_n <= 0 || st[s].norm_ld < st[s].norm_n))
            return dsv4_cuda_fail("linear chain: stage %d: bad RMSNorm shape (n %d, row stride %lld)", s, st[s].norm_n,
                                  (long long)st[s].norm_ld);
        for (int i = 0; i < st[s].n; i++)
            if (bad_job(&st[s].jobs[i], njt + i, T, "linear chain")) return -1;
        njt += st[s].n;
    }
    /* what one launch takes: 2 .. TC_MAXST stages, 1 .. 8 rows of fp32 x, up to TC_MAXJ jobs in stage 0 and TC_CJS in
     * each later one, every job on the tensor-core GEMV with one format and cluster size, the later stages with one
     * kind of x terms, each stage's jobs sharing their launch as dsv4_cuda_linear_multi's */
    if (ns < 2 || ns > TC_MAXST || T < 1 || T > 8 || x_bf16) return 1;
    for (int s = 0; s < ns; s++)
        if (st[s].norm_x && st[s].norm_n > 8 * RMS_NT) return 1; /* the norm holds two quads a thread */
    const int fmt = st[0].jobs[0].w.fmt;
    tc_cargs a;
    memset(&a, 0, sizeof a);
    tc_plan qs[TC_MAXST];
    for (int s = 0; s < ns; s++) {
        if (st[s].n > (s ? TC_CJS : TC_MAXJ)) return 1;
        const tc_plan q = qs[s] = tc_plan_of(&st[s].jobs[0].w, 0);
        if (!q.ok || q.KG != qs[0].KG || st[s].jobs[0].w.fmt != fmt || (s > 1 && q.xt != qs[1].xt)) return 1;
        for (int i = 1; i < st[s].n; i++)
            if (!tc_same(&st[s].jobs[0].w, q, &st[s].jobs[i].w, tc_plan_of(&st[s].jobs[i].w, 0))) return 1;
    }
    const int KG = qs[0].KG;
    size_t smem = 0;
    for (int s = 0; s < ns; s++) {
        const tc_plan &q = qs[s];
        tc_params &p = a.p[s]; /* as the stage's own launch: its slicing and staging layout */
        p.xbf16 = 0, p.t0 = 0, p.nt = T, p.KG = KG, p.S = q.S, p.KW = q.S / KG, p.NU = q.NU, p.nub = q.nub;
        p.tok = tc_tok(fmt, q.nub), p.nj = st[s].n;
        tc_chain &c = a.c;
        const int jn = tc_cj0(s);
        c.sync[s] = s > 0 && st[s].sync;
        if (c.sync[s] && st[s].norm_x) {
            if (st[s].norm_ld > 0x7fffffff) return 1;
            c.nx[s] = st[s].norm_x, c.nw[s] = st[s].norm_w, c.nn[s] = st[s].norm_n, c.nld[s] = (int)st[s].norm_ld;
            c.eps[s] = st[s].norm_eps;
        }
        for (int i = 0; i < st[s].n; i++) {
            const dsv4_cuda_linear_job *ji = &st[s].jobs[i];
            tc_job &t = a.j[jn + i];
            t.w = ji->w, t.x = ji->x, t.y = ji->y;
            t.ldx = ji->ldx ? (int)ji->ldx : ji->w.cols, t.ldy = ji->ldy ? (int)ji->ldy : ji->w.rows;
            t.xv = ((uintptr_t)ji->x & 15) == 0 && t.ldx % 4 == 0;
            t.NRT = (ji->w.rows + 15) / 16;
            t.NRG = (t.NRT + TC_WARPS / p.KW - 1) / (TC_WARPS / p.KW);
        }
        const size_t sm = tc_smem(fmt, q.xt, T, q.nub, q.S, 0);
        smem = sm > smem ? sm : smem;
    }
    smem += TC_CHAIN_SMEM; /* the barrier state and the RMSNorm's sums, past every stage's staging */
    if (smem > (size_t)dsv4_cuda_dev.smem_optin) return 1;
    const tc_cfn fn = pick_chain(fmt, qs[0].xt, qs[1].xt);
    if (!fn) return 1;
    a.c.nst = ns, a.c.slot = slot;
    /* each stage's clusters as tc_run gives its jobs (a job's rows do not depend on them); the grid is the largest
     * stage's, at most the resident clusters */
    const int N = tc_max_clusters((const void *)fn, KG, smem);
    int grid = 0;
    for (int s = 0; s < ns; s++) {
        tc_job *jj = a.j + tc_cj0(s);
        const int nj = a.p[s].nj;
        int nrg_max = 0, nrg_sum = 0, ncl = 0;
        for (int j = 0; j < nj; j++) nrg_max = jj[j].NRG > nrg_max ? jj[j].NRG : nrg_max, nrg_sum += jj[j].NRG;
        if (nj == 1) {
            ncl = N < nrg_sum ? N : nrg_sum;
            jj[0].c0 = 0, jj[0].ncl = ncl;
        } else {
            int k = (nrg_sum + N - 1) / N;
            for (k = k > 1 ? k : 1; k < nrg_max; k++) {
                int n = 0;
                for (int j = 0; j < nj; j++) n += (jj[j].NRG + k - 1) / k;
                if (n <= N) break;
            }
            for (int j = 0; j < nj; j++) jj[j].c0 = ncl, jj[j].ncl = (jj[j].NRG + k - 1) / k, ncl += jj[j].ncl;
        }
        grid = ncl > grid ? ncl : grid;
    }
    if (grid > N) return 1; /* every block must be resident at once */
    if (tc_no_pdl < 0) {
        tc_no_pdl = dsv4_env_int("DSV4_LINEAR_NO_PDL", 0) != 0;
        tc_half = dsv4_env_int("DSV4_LINEAR_HALF", tc_half) != 0;
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
    cfg.gridDim = dim3(grid * KG);
    cfg.blockDim = dim3(TC_THREADS);
    cfg.dynamicSmemBytes = smem;
    cfg.stream = DSV4_STREAM(stream);
    cfg.attrs = at;
    cfg.numAttrs = na;
    cudaError_t e = cudaLaunchKernelEx(&cfg, fn, a);
    if (e != cudaSuccess && !tc_no_pdl) { /* refused with the PDL attribute and taken without: no PDL (as tc_run) */
        cudaGetLastError();
        cfg.numAttrs = KG > 1 ? 1 : 0;
        e = cudaLaunchKernelEx(&cfg, fn, a);
        if (e == cudaSuccess) tc_no_pdl = 1;
    }
    if (e != cudaSuccess) {
        cudaGetLastError();
        return dsv4_cuda_fail("linear chain: launch (grid %d x %d, %zu bytes of shared memory): %s", grid, KG, smem,
                              cudaGetErrorString(e));
    }
    return dsv4_cuda_check_launch("linear chain");
}

/* ---- the gate and the routing in one launch (gemv_tc_route) ---- */

using tc_rfn = void (*)(const tc_cargs);
/* the gate's forms: BF16 (the releases') or F32 weights; others take the two calls. ptxas -v: no spill (the routing's
 * 128-byte stack is moe_group_block's slot list, as in moe_route_group_kernel). */
static tc_rfn pick_route(int fmt, int xt) {
    switch (fmt) {
    case DSV4_WF_BF16: return xt == 1 ? gemv_tc_route<DSV4_WF_BF16, 1> : gemv_tc_route<DSV4_WF_BF16, 3>;
    case DSV4_WF_F32: return xt == 3 ? gemv_tc_route<DSV4_WF_F32, 3> : NULL;
    default: return NULL;
    }
}

extern "C" int dsv4_cuda_linear_route(const dsv4_cuda_weight *gate, const float *x, int T, float *logits, int E, int K,
                                      const float *bias, const int *tid2eid, const int *tokens, float route_scale, const int *sid,
                                      int *sel, float *weight, const dsv4_cuda_moe_plan *p, int slot, void *stream) {
    if (bad_weight(gate, T)) return -1;
    if (!x || !logits || !sid || !sel || !weight || !p || T < 0 || slot < 0 || slot >= TC_CHAIN_SLOTS)
        return dsv4_cuda_fail("linear route: bad arguments (T %d, slot %d)", T, slot);
    /* what moe_route_group_block takes (dsv4_cuda_moe_route's one-block form) and one GEMV launch */
    static int rg = -1;
    if (rg < 0) rg = dsv4_env_int("DSV4_CUDA_ROUTE_GROUP", 1) != 0;
    if (T < 1 || T > ROUTE_GROUP_T || gate->rows != E || E > 32 * ROUTER_RPL || K < 1 || K > 32 || K > E ||
        T * K > GROUP_CACHE || (!tid2eid && !bias) || (tid2eid && !tokens) || !rg)
        return 1;
    const tc_plan q = tc_plan_of(gate, 0);
    if (!q.ok) return 1;
    const tc_rfn fn = pick_route(gate->fmt, q.xt);
    if (!fn) return 1;
    tc_cargs a;
    memset(&a, 0, sizeof a);
    tc_params &pp = a.p[0];
    pp.xbf16 = 0, pp.t0 = 0, pp.nt = T, pp.KG = q.KG, pp.S = q.S, pp.KW = q.S / q.KG, pp.NU = q.NU, pp.nub = q.nub;
    pp.tok = tc_tok(gate->fmt, q.nub), pp.nj = 1;
    tc_job &t = a.j[0];
    t.w = *gate, t.x = x, t.y = logits, t.ldx = gate->cols, t.ldy = E;
    t.xv = ((uintptr_t)x & 15) == 0 && t.ldx % 4 == 0;
    t.NRT = (E + 15) / 16;
    t.NRG = (t.NRT + TC_WARPS / pp.KW - 1) / (TC_WARPS / pp.KW);
    a.c.nst = 1, a.c.slot = slot;
    tc_route &r = a.r;
    r.logits = logits, r.bias = tid2eid ? NULL : bias, r.tid2eid = tid2eid, r.tokens = tokens, r.sid = sid, r.sel = sel;
    r.weight = weight, r.p = *p, r.E = E, r.K = K, r.T = T, r.scale = route_scale;
    const size_t rs = moe_route_smem(T, K, E, &r.goff), gs = tc_smem(gate->fmt, q.xt, T, q.nub, q.S, 0);
    static const void *rfn[4]; /* each form's static shared memory (the routing's scan), queried once */
    static size_t rst[4];
    int ri = 0;
    while (ri < 4 && rfn[ri] && rfn[ri] != (const void *)fn) ri++;
    if (ri == 4) return 1;
    if (!rfn[ri]) {
        cudaFuncAttributes fa;
        if (cudaFuncGetAttributes(&fa, (const void *)fn) != cudaSuccess) {
            cudaGetLastError();
            return 1;
        }
        rfn[ri] = (const void *)fn, rst[ri] = fa.sharedSizeBytes;
    }
    const size_t smem = (rs > gs ? rs : gs) + TC_CHAIN_SMEM;
    if (smem + rst[ri] > (size_t)dsv4_cuda_dev.smem_optin) return 1;
    const int KG = q.KG, N = tc_max_clusters((const void *)fn, KG, smem);
    const int ncl = N < t.NRG ? N : t.NRG;
    t.c0 = 0, t.ncl = ncl;
    if (tc_no_pdl < 0) {
        tc_no_pdl = dsv4_env_int("DSV4_LINEAR_NO_PDL", 0) != 0;
        tc_half = dsv4_env_int("DSV4_LINEAR_HALF", tc_half) != 0;
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
    cfg.stream = DSV4_STREAM(stream);
    cfg.attrs = at;
    cfg.numAttrs = na;
    cudaError_t e = cudaLaunchKernelEx(&cfg, fn, a);
    if (e != cudaSuccess && !tc_no_pdl) { /* refused with the PDL attribute and taken without: no PDL (as tc_run) */
        cudaGetLastError();
        cfg.numAttrs = KG > 1 ? 1 : 0;
        e = cudaLaunchKernelEx(&cfg, fn, a);
        if (e == cudaSuccess) tc_no_pdl = 1;
    }
    if (e != cudaSuccess) {
        cudaGetLastError();
        return dsv4_cuda_fail("linear route: launch (grid %d x %d, %zu bytes of shared memory): %s", ncl, KG, smem,
                              cudaGetErrorString(e));
    }
    return dsv4_cuda_check_launch("linear route");
}
