/* linear.cu - y = x . W^T for every weight format (spec 14), the twin of dsv4_cpu_linear.
 *
 * Decode (T <= 16 rows of x): gemv_vec, one warp per two weight rows, each lane loading 16 bytes of
 * each row per step (a warp reads 512 contiguous bytes), decoding them in registers and multiplying with
 * up to 8 token rows of x staged in shared memory. The staged x is laid out so that the 4..32
 * values a lane needs for its 16 weight bytes sit where the warp's float4 reads of one step are
 * consecutive (no bank conflicts); the FP8 act_quant simulation is applied while staging, once per
 * block. Scaled formats accumulate a chunk (one scale group) unscaled, then add scale * partial.
 * gemv_any serves views whose rows are not 16-byte multiples (odd sizes), one element at a time.
 * Prefill (T > 16): gemm_tiled, 64 rows x 64 tokens x 128 columns per tile, weights dequantized
 * into shared memory, fp32 FMA; the 128-column tile is exactly one act_quant block. */
#include "common.cuh"

#define GEMV_WARPS 16
#define GEMV_UNROLL 4
#define GEMV_ROWS 2

/* elements per 16 stored bytes */
template <int FMT> struct fmt_elems { static constexpr int E = 4; };
template <> struct fmt_elems<DSV4_WF_BF16> { static constexpr int E = 8; };
template <> struct fmt_elems<DSV4_WF_F16> { static constexpr int E = 8; };
template <> struct fmt_elems<DSV4_WF_FP8> { static constexpr int E = 16; };
template <> struct fmt_elems<DSV4_WF_MXFP4> { static constexpr int E = 32; };
template <> struct fmt_elems<DSV4_WF_NVFP4> { static constexpr int E = 32; };

__device__ __forceinline__ uint4 ld_stream(const uint4 *p) {
    uint4 v;
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p));
    return v;
}

__device__ __forceinline__ float load_x(const void *x, int bf16, int64_t i) {
    return bf16 ? dev_bf16(((const uint16_t *)x)[i]) : ((const float *)x)[i];
}

/* FP8 act_quant of one 128-block held by a warp, 4 values per lane (same result as
 * dsv4_act_quant_fp8 on the block; padding zeros do not change the block's amax). */
__device__ __forceinline__ void warp_act_quant_fp8(float v[4]) {
    float a = 1e-4f;
#pragma unroll
    for (int q = 0; q < 4; q++) a = fmaxf(a, fabsf(v[q]));
    a = warp_max(a);
    float s = dev_pow2_ceil(a * (1.0f / 448.0f));
#pragma unroll
    for (int q = 0; q < 4; q++) v[q] = dev_round_e4m3(fminf(fmaxf(__fdiv_rn(v[q], s), -448.0f), 448.0f)) * s;
}

/* Stages rows t0 .. t0+nt-1 of x [*, C] into xs [TB][Cpad] (zeros beyond), act-quantized when aq.
 * E > 0: the permuted layout of gemv_vec (element j of chunk ch = j / E sits in float4
 * ((ch / 32) * (E / 4) + (j % E) / 4) * 32 + ch % 32, lane (j % 4)); E == 0: natural order. */
template <int E>
__device__ void stage_x(float *xs, const void *x, int xbf16, int t0, int nt, int TB, int C, int Cpad, int aq) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarp = blockDim.x >> 5;
    const int ng = Cpad / 128;
    for (int g = warp; g < TB * ng; g += nwarp) {
        int t = g / ng, j0 = (g - t * ng) * 128;
        float v[4];
#pragma unroll
        for (int q = 0; q < 4; q++) {
            int j = j0 + q * 32 + lane;
            v[q] = (t < nt && j < C) ? load_x(x, xbf16, (int64_t)(t0 + t) * C + j) : 0.0f;
        }
        if (aq) warp_act_quant_fp8(v);
#pragma unroll
        for (int q = 0; q < 4; q++) {
            int j = j0 + q * 32 + lane, pos = j;
            if (E > 0) {
                constexpr int EE = E > 0 ? E : 4; /* (E == 0 never gets here) */
                int i = j / (32 * EE), r = j - i * 32 * EE, l = r / EE, e = r - l * EE;
                pos = ((i * (EE / 4) + (e >> 2)) * 32 + l) * 4 + (e & 3);
            }
            xs[(size_t)t * Cpad + pos] = v[q];
        }
    }
}

/* Decodes float4 group k (elements 4k..4k+3) of a 16-byte chunk. For FP4 the values are twice
 * the e2m1 values (the 1/2 is in the scale). */
template <int FMT>
__device__ __forceinline__ float4 decode4(const uint4 &q, int k) {
    const uint32_t wd[4] = {q.x, q.y, q.z, q.w};
    if (FMT == DSV4_WF_F32) {
        return make_float4(__uint_as_float(q.x), __uint_as_float(q.y), __uint_as_float(q.z), __uint_as_float(q.w));
    } else if (FMT == DSV4_WF_BF16) {
        uint32_t a = wd[2 * k], b = wd[2 * k + 1];
        return make_float4(__uint_as_float(a << 16), __uint_as_float(a & 0xffff0000u), __uint_as_float(b << 16),
                           __uint_as_float(b & 0xffff0000u));
    } else if (FMT == DSV4_WF_F16) {
        uint32_t a = wd[2 * k], b = wd[2 * k + 1];
        float2 fa = __half22float2(*(const __half2 *)&a), fb = __half22float2(*(const __half2 *)&b);
        return make_float4(fa.x, fa.y, fb.x, fb.y);
    } else if (FMT == DSV4_WF_FP8) {
        uint32_t a = wd[k];
        float2 lo = dev_e4m3x2((uint16_t)(a & 0xffff)), hi = dev_e4m3x2((uint16_t)(a >> 16));
        return make_float4(lo.x, lo.y, hi.x, hi.y);
    } else { /* MXFP4 / NVFP4: group k = bytes 2k, 2k+1 */
        uint32_t h = (wd[k >> 1] >> ((k & 1) * 16)) & 0xffff;
        return make_float4(dev_e2m1_x2(h), dev_e2m1_x2(h >> 4), dev_e2m1_x2(h >> 8), dev_e2m1_x2(h >> 12));
    }
}

/* Scale of chunk ch (E elements from column ch*E) of stored row R; NVFP4 has two (s0: groups
 * 0..3, s1: groups 4..7). */
template <int FMT>
__device__ __forceinline__ void chunk_scale(const dsv4_cuda_weight &w, int64_t R, int ch, float &s0, float &s1) {
    constexpr int E = fmt_elems<FMT>::E;
    s0 = s1 = 1.0f;
    if (FMT == DSV4_WF_FP8) {
        int64_t si = (R / 128) * w.scale_stride + (ch * E) / 128;
        s0 = w.scale_f32 ? __ldg((const float *)w.scale + si) : dev_e8m0(__ldg(w.scale + si));
    } else if (FMT == DSV4_WF_MXFP4) {
        s0 = 0.5f * dev_e8m0(__ldg(w.scale + R * w.scale_stride + ch));
    } else if (FMT == DSV4_WF_NVFP4) {
        uint16_t b2 = __ldg((const uint16_t *)(w.scale + R * w.scale_stride + 2 * ch));
        float2 f = dev_e4m3x2(b2);
        s0 = 0.5f * (f.x * w.scale2);
        s1 = 0.5f * (f.y * w.scale2);
    }
}

template <int FMT, int TB>
__global__ void __launch_bounds__(GEMV_WARPS * 32) gemv_vec(dsv4_cuda_weight w, const void *x, int xbf16, int t0, int nt,
                                                            int Cpad, float *y) {
    constexpr int E = fmt_elems<FMT>::E, NK = E / 4;
    extern __shared__ float4 xs4[];
    float *xs = (float *)xs4;
    const int C = w.cols, lane = threadIdx.x & 31;
    stage_x<E>(xs, x, xbf16, t0, nt, TB, C, Cpad, w.act_quant);
    __syncthreads();
    const int nch = C / E;
    const int64_t rowbytes = (int64_t)C * 16 / E; /* C is a multiple of E */
    /* a warp takes GEMV_ROWS adjacent rows at once: each staged x value read from shared memory
     * serves all of them, and twice the loads are in flight */
    for (int r0 = (blockIdx.x * GEMV_WARPS + (threadIdx.x >> 5)) * GEMV_ROWS; r0 < w.rows; r0 += gridDim.x * GEMV_WARPS * GEMV_ROWS) {
        const uint4 *wrow[GEMV_ROWS];
        int64_t R[GEMV_ROWS];
#pragma unroll
        for (int m = 0; m < GEMV_ROWS; m++) {
            R[m] = (int64_t)w.row0 + (r0 + m < w.rows ? r0 + m : r0); /* past the end: recompute row r0 */
            wrow[m] = (const uint4 *)(w.data + R[m] * rowbytes);
        }
        float acc[GEMV_ROWS][TB];
#pragma unroll
        for (int m = 0; m < GEMV_ROWS; m++)
#pragma unroll
            for (int t = 0; t < TB; t++) acc[m][t] = 0.0f;
        for (int base = 0; base < nch; base += 32 * GEMV_UNROLL) {
            uint4 q[GEMV_ROWS][GEMV_UNROLL];
#pragma unroll
            for (int u = 0; u < GEMV_UNROLL; u++) {
                int ch = base + u * 32 + lane;
#pragma unroll
                for (int m = 0; m < GEMV_ROWS; m++) q[m][u] = ch < nch ? ld_stream(wrow[m] + ch) : make_uint4(0, 0, 0, 0);
            }
#pragma unroll
            for (int u = 0; u < GEMV_UNROLL; u++) {
                int ch = base + u * 32 + lane;
                if (ch >= nch) break;
                float s0[GEMV_ROWS], s1[GEMV_ROWS];
#pragma unroll
                for (int m = 0; m < GEMV_ROWS; m++) chunk_scale<FMT>(w, R[m], ch, s0[m], s1[m]);
                const float4 *xc = xs4 + (size_t)(ch >> 5) * NK * 32 + lane;
                float p0[GEMV_ROWS][TB], p1[GEMV_ROWS][TB];
#pragma unroll
                for (int m = 0; m < GEMV_ROWS; m++)
#pragma unroll
                    for (int t = 0; t < TB; t++) p0[m][t] = p1[m][t] = 0.0f;
#pragma unroll
                for (int k = 0; k < NK; k++) {
                    float4 wv[GEMV_ROWS];
#pragma unroll
                    for (int m = 0; m < GEMV_ROWS; m++) wv[m] = decode4<FMT>(q[m][u], k);
#pragma unroll
                    for (int t = 0; t < TB; t++) {
                        float4 xv = xc[(size_t)t * (Cpad / 4) + k * 32];
#pragma unroll
                        for (int m = 0; m < GEMV_ROWS; m++) {
                            float &p = (FMT == DSV4_WF_NVFP4 && k >= NK / 2) ? p1[m][t] : p0[m][t];
                            p = fmaf(wv[m].x, xv.x, p);
                            p = fmaf(wv[m].y, xv.y, p);
                            p = fmaf(wv[m].z, xv.z, p);
                            p = fmaf(wv[m].w, xv.w, p);
                        }
                    }
                }
#pragma unroll
                for (int m = 0; m < GEMV_ROWS; m++)
#pragma unroll
                    for (int t = 0; t < TB; t++) {
                        if (FMT == DSV4_WF_NVFP4) acc[m][t] = fmaf(s1[m], p1[m][t], fmaf(s0[m], p0[m][t], acc[m][t]));
                        else if (FMT == DSV4_WF_FP8 || FMT == DSV4_WF_MXFP4) acc[m][t] = fmaf(s0[m], p0[m][t], acc[m][t]);
                        else acc[m][t] += p0[m][t];
                    }
            }
        }
#pragma unroll
        for (int m = 0; m < GEMV_ROWS; m++)
#pragma unroll
            for (int t = 0; t < TB; t++) {
                float v = warp_sum(acc[m][t]);
                if (lane == 0 && t < nt && r0 + m < w.rows) y[(int64_t)(t0 + t) * w.rows + r0 + m] = v;
            }
    }
}

template <int TB>
__global__ void __launch_bounds__(GEMV_WARPS * 32) gemv_any(dsv4_cuda_weight w, const void *x, int xbf16, int t0, int nt,
                                                            int Cpad, float *y) {
    extern __shared__ float4 xs4[];
    float *xs = (float *)xs4;
    const int C = w.cols, lane = threadIdx.x & 31;
    stage_x<0>(xs, x, xbf16, t0, nt, TB, C, Cpad, w.act_quant);
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
            if (lane == 0 && t < nt) y[(int64_t)(t0 + t) * w.rows + r] = v;
        }
    }
}

#define GM_BM 64
#define GM_BN 64
#define GM_BK 128
#define GM_LD (GM_BK + 1)

/* 256 threads: tx = tid % 16 owns rows m0 + tx + 16 i, ty = tid / 16 tokens n0 + ty + 16 j. */
__global__ void __launch_bounds__(256) gemm_tiled(dsv4_cuda_weight w, const void *x, int xbf16, int T, float *y) {
    extern __shared__ float gsm[];
    float *Ws = gsm, *Xs = gsm + GM_BM * GM_LD;
    const int tid = threadIdx.x, tx = tid & 15, ty = tid >> 4, lane = tid & 31, warp = tid >> 5;
    const int m0 = blockIdx.x * GM_BM, n0 = blockIdx.y * GM_BN, R = w.rows, C = w.cols;
    float acc[4][4] = {};
    for (int k0 = 0; k0 < C; k0 += GM_BK) {
        for (int e = tid; e < GM_BM * GM_BK; e += 256) {
            int m = e >> 7, k = e & 127;
            Ws[m * GM_LD + k] = (m0 + m < R && k0 + k < C) ? dev_weight_at(w, m0 + m, k0 + k) : 0.0f;
            Xs[m * GM_LD + k] = (n0 + m < T && k0 + k < C) ? load_x(x, xbf16, (int64_t)(n0 + m) * C + k0 + k) : 0.0f;
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
            if (m < R) y[(int64_t)n * R + m] = acc[i][j];
        }
    }
}

/* ---- launchers ---- */

typedef void (*gemv_fn)(dsv4_cuda_weight, const void *, int, int, int, int, float *);

template <int FMT> static gemv_fn pick_vec(int tb) {
    switch (tb) {
    case 1: return gemv_vec<FMT, 1>;
    case 2: return gemv_vec<FMT, 2>;
    case 4: return gemv_vec<FMT, 4>;
    default: return gemv_vec<FMT, 8>;
    }
}

static gemv_fn pick_gemv(int fmt, int vec, int tb) {
    if (!vec) {
        switch (tb) {
        case 1: return gemv_any<1>;
        case 2: return gemv_any<2>;
        case 4: return gemv_any<4>;
        default: return gemv_any<8>;
        }
    }
    switch (fmt) {
    case DSV4_WF_F32: return pick_vec<DSV4_WF_F32>(tb);
    case DSV4_WF_BF16: return pick_vec<DSV4_WF_BF16>(tb);
    case DSV4_WF_F16: return pick_vec<DSV4_WF_F16>(tb);
    case DSV4_WF_FP8: return pick_vec<DSV4_WF_FP8>(tb);
    case DSV4_WF_MXFP4: return pick_vec<DSV4_WF_MXFP4>(tb);
    default: return pick_vec<DSV4_WF_NVFP4>(tb);
    }
}

static int elems16(int fmt) {
    switch (fmt) {
    case DSV4_WF_F32: return 4;
    case DSV4_WF_BF16:
    case DSV4_WF_F16: return 8;
    case DSV4_WF_FP8: return 16;
    default: return 32;
    }
}

/* Shared memory of one GEMV block (the staged x rows). */
static size_t gemv_smem(int tb, int cpad) { return (size_t)tb * cpad * sizeof(float); }

extern "C" int dsv4_cuda_linear(const dsv4_cuda_weight *w, const void *x, int x_bf16, int T, float *y, void *stream) {
    if (!w || !w->data || w->rows <= 0 || w->cols <= 0 || T < 0 || (unsigned)w->fmt >= DSV4_WF_COUNT)
        return dsv4_cuda_fail("linear: bad weight or shape (rows %d cols %d T %d)", w ? w->rows : 0, w ? w->cols : 0, T);
    if ((w->fmt == DSV4_WF_MXFP4 || w->fmt == DSV4_WF_NVFP4) && (w->cols & 1))
        return dsv4_cuda_fail("linear: FP4 weight with odd column count %d", w->cols);
    if (T == 0) return 0;
    cudaStream_t st = DSV4_STREAM(stream);
    const int C = w->cols, E = elems16(w->fmt);
    /* 16-byte loads need every stored row to start on a 16-byte boundary: C a multiple of E
     * (cudaMalloc'd data is 256-byte aligned) */
    int vec = C % E == 0 && ((uintptr_t)w->data & 15) == 0 &&
              !(w->fmt == DSV4_WF_NVFP4 && ((w->scale_stride & 1) || ((uintptr_t)w->scale & 1)));
    int cpad = vec ? (C + 32 * E - 1) / (32 * E) * (32 * E) : (C + 127) / 128 * 128;
    int tb = T == 1 ? 1 : T == 2 ? 2 : T <= 4 ? 4 : 8;
    while (tb > 1 && gemv_smem(tb, cpad) > (size_t)dsv4_cuda_dev.smem_optin) tb >>= 1;
    int use_gemv = T <= 16 && gemv_smem(tb, cpad) <= (size_t)dsv4_cuda_dev.smem_optin;
    if (use_gemv) {
        gemv_fn fn = pick_gemv(w->fmt, vec, tb);
        size_t smem = gemv_smem(tb, cpad);
        if (smem > 48 * 1024 && cudaFuncSetAttribute((const void *)fn, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem) != cudaSuccess)
            return dsv4_cuda_fail("linear: cannot raise shared memory to %zu bytes", smem);
        int per_sm = 0;
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, (const void *)fn, GEMV_WARPS * 32, smem);
        if (per_sm < 1) per_sm = 1;
        int grid = (w->rows + GEMV_WARPS * GEMV_ROWS - 1) / (GEMV_WARPS * GEMV_ROWS);
        if (grid > per_sm * dsv4_cuda_dev.sm_count) grid = per_sm * dsv4_cuda_dev.sm_count;
        for (int t0 = 0; t0 < T; t0 += tb) {
            int nt = T - t0 < tb ? T - t0 : tb;
            fn<<<grid, GEMV_WARPS * 32, smem, st>>>(*w, x, x_bf16, t0, nt, cpad, y);
        }
        return dsv4_cuda_check_launch("linear (gemv)");
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
    gemm_tiled<<<grid, 256, smem, st>>>(*w, x, x_bf16, T, y);
    return dsv4_cuda_check_launch("linear (gemm)");
}
