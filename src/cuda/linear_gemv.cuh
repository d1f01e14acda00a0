/* linear_gemv.cuh - the tensor-core GEMV's per-format constants, job and launch parameters, x staging (x as 16-bit
 * terms in the permuted slot order of a 128-column unit, one power-of-two scale per (token, unit)), the weight-scale
 * factors of a unit and the exact decode of weight chunks into mma A fragments (C++, included by linear.cu, which has
 * the GEMV, and linear_bi.cu, the batch-invariant multi-token GEMM that must reproduce the GEMV's rows bit for bit). */
#ifndef DSV4_CUDA_LINEAR_GEMV_CUH
#define DSV4_CUDA_LINEAR_GEMV_CUH

#include "common.cuh"
#include "linear_tc.cuh"

__device__ __forceinline__ float load_x(const void *x, int bf16, int64_t i) {
    return bf16 ? dev_bf16(((const uint16_t *)x)[i]) : ((const float *)x)[i];
}
/* act_bf16 applies: BF16 activations, not overridden by the act quant */
__host__ __device__ __forceinline__ int x_round_bf16(const dsv4_cuda_weight &w) { return w.act_bf16 && !w.act_quant; }

/* ---- tensor-core GEMV ---- */

#define TC_WARPS 16
#define TC_THREADS (TC_WARPS * 32)
#define TC_CH 4 /* 16-byte chunks per row per pipeline step: 2 rows x 4 x 16 B = 128 B per lane in flight */

/* Per format: V chunks of a lane per row per 128-column unit, E elements per 16-byte chunk, BF (bf16 mma, else
 * f16), WT weight terms, PADB bytes of padding per staged token row (conflict-free fragment reads). */
template <int FMT> struct tc_fmt {
    static constexpr int V = 8, E = 4, BF = 1, WT = 3, PADB = 32; /* F32 */
};
template <> struct tc_fmt<DSV4_WF_BF16> { static constexpr int V = 4, E = 8, BF = 1, WT = 1, PADB = 64; };
template <> struct tc_fmt<DSV4_WF_F16> { static constexpr int V = 4, E = 8, BF = 0, WT = 1, PADB = 64; };
template <> struct tc_fmt<DSV4_WF_FP8> { static constexpr int V = 2, E = 16, BF = 0, WT = 1, PADB = 16; };
template <> struct tc_fmt<DSV4_WF_MXFP4> { static constexpr int V = 1, E = 32, BF = 0, WT = 1, PADB = 32; };
template <> struct tc_fmt<DSV4_WF_NVFP4> { static constexpr int V = 1, E = 32, BF = 0, WT = 1, PADB = 32; };

/* One linear of a launch: its weight, x and y with their row strides (elements), and its share of the grid. The jobs
 * of a launch (dsv4_cuda_linear_multi) share the format, the columns, act_quant / act_bf16 / scale_f32 (read from
 * job 0) and the slicing (S, KG); a block works for one job only (clusters c0 .. c0+ncl-1 of the grid). */
struct tc_job {
    dsv4_cuda_weight w;
    const void *x;
    float *y;
    int ldx, ldy; /* row strides (elements) */
    int NRT, NRG; /* 16-row tiles, row groups (16 / KW tiles per block step) */
    int c0, ncl;  /* multi-job launches: the job's clusters */
    int xv;       /* x rows 16-byte (fp32) / 8-byte (bf16) aligned: tc_stage8 loads 4 elements at a time */
};
struct tc_params {
    int xbf16, t0, nt; /* this launch's tokens t0 .. t0+nt-1 (nt <= 8 * NT) */
    int S, KW, KG;     /* column slices (S = KW warps of a block x KG blocks of a cluster) */
    int NU, nub, tok;  /* 128-column units, staged units per block (max over blocks), 16-bit slots per staged token row */
    int nj;            /* jobs */
#ifdef DSV4_TC_TRACE
    unsigned long long *trace; /* experiments: per warp clock64 at 8 points + globaltimer at entry / exit */
#endif
};
#define TC_MAXJ 16 /* jobs per launch */
template <int NJ> struct tc_args {
    tc_params p;
    tc_job j[NJ];
};

/* The batch-invariant multi-token GEMM (linear_bi.cu) for the jobs of one GEMV launch (same format, columns, x terms xt
 * and column slices S): every y row bitwise the GEMV's. 0: done; 1: not taken (F32 weights, too many columns, ws NULL
 * or smaller than the jobs need; nothing enqueued); -1: launch error. */
int dsv4_linear_bi_run(const tc_job *jobs, int nj, int xt, int S, int x_bf16, int T, void *ws, size_t wsb, cudaStream_t st);
/* The QGMMA GEMV prototype (linear_q8.cu): 0 done, 1 not taken (off, or not its format / shape / T), -1 error */
extern "C" int dsv4_linear_q8_run(const dsv4_cuda_weight *w, const float *x, int T, float *y, cudaStream_t st);
/* Fewest rows of x that take it (fewer: one or two GEMV launches are as fast) */
#define DSV4_LINEAR_BI_MIN_T DSV4_CUDA_LINEAR_WS_MIN_T

/* Slot of column i (0..127) of a unit in the staged x: chunk i / E is read by lane c = (i / E) % 4, and inside
 * it the elements sit in the order the lane's decoded fragment holds them (FP4: tc_e2m1_perm, with the 16-byte
 * halves of odd lane pairs swapped so that a quarter warp's reads hit distinct banks). */
template <int FMT> __device__ __forceinline__ int tc_slot(int i) {
    constexpr int E = tc_fmt<FMT>::E;
    if (FMT == DSV4_WF_MXFP4 || FMT == DSV4_WF_NVFP4) {
        const int ch = i / E, e = i - ch * E;
        const int q = (e & ~7) + tc_e2m1_slot(e & 7);
        return ch * E + (((q >> 3) ^ ((ch >> 1) & 1)) << 3) + (q & 7);
    }
    return i;
}

/* Stages the block's x (tokens t0 .. t0+nt-1, units ub0 .. ub0+nub-1) as XT 16-bit terms at tc_slot order, term
 * xt of token t at xs + (xt * nt + t) * tok, and one scale per (token, unit): x = scale * (sum of the terms).
 * A warp takes (token, unit) items TC_SB at a time, their loads in flight together. The act-quant codes come from
 * the hardware e4m3 conversion (round to nearest even, after the same clamp to +-448 and the same power-of-two
 * scale as dsv4_act_quant_fp8; v * (1/s) == v / s exactly for s a power of two), bit-identical to dev_round_e4m3. */
#define TC_SB 4
template <int FMT, int XT>
__device__ void tc_stage(const tc_params &p, const tc_job &J0, const tc_job &J, uint16_t *xs, float *sx, int ub0, int nub) {
    constexpr int BF = tc_fmt<FMT>::BF;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, n = p.nt * nub;
    const int aq = J0.w.act_quant, ab = J0.w.act_bf16;
    const size_t tstride = (size_t)p.nt * p.tok;
    for (int it0 = warp; it0 < n; it0 += TC_WARPS * TC_SB) {
        float v[TC_SB][4];
#pragma unroll
        for (int b = 0; b < TC_SB; b++) {
            const int it = it0 + b * TC_WARPS, t = it / nub, ul = it - t * nub;
            const int64_t base = (int64_t)(p.t0 + t) * J.ldx + (int64_t)(ub0 + ul) * 128;
#pragma unroll
            for (int q = 0; q < 4; q++) v[b][q] = it < n ? load_x(J.x, p.xbf16, base + q * 32 + lane) : 0.0f;
        }
#pragma unroll
        for (int b = 0; b < TC_SB; b++) {
            const int it = it0 + b * TC_WARPS, t = it / nub, ul = it - t * nub;
            if (it >= n) break;
            float s = 1.0f, a = aq ? 1e-4f : 0.0f;
            uint16_t term[4][3];
            if (aq || !BF) {
#pragma unroll
                for (int q = 0; q < 4; q++) a = fmaxf(a, fabsf(v[b][q]));
                a = warp_max(a);
            }
            if (aq) {
                s = dev_pow2_ceil(a * (1.0f / 448.0f));
                const float inv = 1.0f / s; /* exact: s is a power of two */
#pragma unroll
                for (int q = 0; q < 4; q++) {
                    const float y = fminf(fmaxf(v[b][q] * inv, -448.0f), 448.0f);
                    const __half_raw h = __nv_cvt_fp8_to_halfraw(__nv_cvt_float_to_fp8(y, __NV_SATFINITE, __NV_E4M3), __NV_E4M3);
                    if (BF) term[q][0] = __bfloat16_as_ushort(__float2bfloat16_rn(__half2float(__half(h))));
                    else term[q][0] = h.x;
                    term[q][1] = term[q][2] = 0;
                }
            } else {
                if (!BF) { /* a power of two that puts the unit's largest |x| in [2^14, 2^15) */
                    int e = (int)((__float_as_uint(a) >> 23) & 0xff) - 14;
                    e = e < 1 ? 1 : e;
                    s = __uint_as_float((uint32_t)e << 23);
                    const float inv = __uint_as_float((uint32_t)(254 - e) << 23);
                    /* act_bf16 (one x term; a no-op on bf16 input): bf16(x) * 2^-e, the scale from the unrounded
                     * largest |x| (if that rounds up a binade it lands on 2^15, still exact in f16) */
#pragma unroll
                    for (int q = 0; q < 4; q++) v[b][q] = (XT == 1 && ab ? dev_round_bf16(v[b][q]) : v[b][q]) * inv;
                }
                /* bf16 formats with one x term (x_bf16 or act_bf16): the first term, bf16_rn(x), is the rounding */
#pragma unroll
                for (int q = 0; q < 4; q++) {
                    if (BF) {
                        __nv_bfloat16 h = __float2bfloat16_rn(v[b][q]);
                        float r = v[b][q] - __bfloat162float(h);
                        __nv_bfloat16 m = __float2bfloat16_rn(r);
                        __nv_bfloat16 l = __float2bfloat16_rn(r - __bfloat162float(m));
                        term[q][0] = __bfloat16_as_ushort(h), term[q][1] = __bfloat16_as_ushort(m), term[q][2] = __bfloat16_as_ushort(l);
                    } else {
                        __half h = __float2half_rn(v[b][q]);
                        __half l = __float2half_rn(v[b][q] - __half2float(h));
                        term[q][0] = __half_as_ushort(h), term[q][1] = __half_as_ushort(l), term[q][2] = 0;
                    }
                }
            }
            uint16_t *dst = xs + (size_t)t * p.tok + ul * 128;
#pragma unroll
            for (int q = 0; q < 4; q++) {
                const int pos = tc_slot<FMT>(q * 32 + lane);
#pragma unroll
                for (int xt = 0; xt < XT; xt++) dst[xt * tstride + pos] = term[q][xt];
            }
            if (lane == 0) sx[t * p.nub + ul] = s;
        }
    }
}

/* A fragments of sub-step j (elements 8j .. 8j+7, or 0..3 for F32) of one chunk of one row, WT terms x 4 registers:
 * registers 2i / 2i+1 feed k-step i's columns 2c, 2c+1 / 2c+8, 2c+9. f: FP4's f16x2 factor (MXFP4: 2^(e - emax + 6),
 * NVFP4: its group's e4m3 scale times 2^6; the decoded e2m1 values carry 2^-6). */
template <int FMT>
__device__ __forceinline__ void tc_decode(const uint4 &q, int j, uint32_t f, uint32_t (&A)[tc_fmt<FMT>::WT][4]) {
    const uint32_t wd[4] = {q.x, q.y, q.z, q.w};
    if (FMT == DSV4_WF_FP8) {
        A[0][0] = tc_e4m3x2_f16x2(wd[2 * j]), A[0][1] = tc_e4m3x2_f16x2(wd[2 * j] >> 16);
        A[0][2] = tc_e4m3x2_f16x2(wd[2 * j + 1]), A[0][3] = tc_e4m3x2_f16x2(wd[2 * j + 1] >> 16);
    } else if (FMT == DSV4_WF_MXFP4 || FMT == DSV4_WF_NVFP4) {
        uint32_t r[4];
        tc_e2m1x8_f16x2(wd[j], r);
#pragma unroll
        for (int i = 0; i < 4; i++) A[0][i] = tc_hmul2(r[i], f);
    } else if (FMT == DSV4_WF_BF16 || FMT == DSV4_WF_F16) {
#pragma unroll
        for (int k = 0; k < 4; k++) A[0][k] = wd[k];
    } else { /* F32: three bf16 terms of the chunk's 4 values (one k-step) */
        tc_f32x2_bf16x3(__uint_as_float(wd[0]), __uint_as_float(wd[1]), A[0][0], A[1][0], A[2][0]);
        tc_f32x2_bf16x3(__uint_as_float(wd[2]), __uint_as_float(wd[3]), A[0][1], A[1][1], A[2][1]);
    }
}

/* The weight-scale factors of chunk i of a lane's pipeline step, rows g (m = 0) and g + 8 (m = 1), from the packed
 * scale words a (tc_buf::a; FP8: the raw block scale of each unit ending in the step at slot (i + 1) / V - 1, MXFP4: the
 * E8M0 byte of chunk i in byte i, NVFP4: the two e4m3 bytes of chunk i in half i % 2 of slot i / 2): fq, FP4's f16x2
 * factor per half chunk (MXFP4: 2^(e - emax + 6), emax the largest exponent of the unit's four chunks, held by a quad
 * of lanes: every lane of the warp must call it; NVFP4: the group's e4m3 scale times 2^6), and sw, the fp32 factor
 * applied when the unit ends (MXFP4: 2^emax, NVFP4: scale_2, FP8: the block scale when chunk i ends a unit, else 1). */
template <int FMT>
__device__ __forceinline__ void tc_scales(const uint32_t (&a)[2][2], int i, int scale_f32, float scale2, uint32_t (&fq)[2][2],
                                          float (&sw)[2]) {
    constexpr int V = tc_fmt<FMT>::V;
#pragma unroll
    for (int m = 0; m < 2; m++) {
        fq[m][0] = fq[m][1] = 0;
        sw[m] = 1.0f;
        if (FMT == DSV4_WF_MXFP4) {
            int e = (int)((a[m][0] >> (8 * i)) & 0xffu), em = e;
            em = max(em, __shfl_xor_sync(0xffffffffu, em, 1));
            em = max(em, __shfl_xor_sync(0xffffffffu, em, 2));
            fq[m][0] = fq[m][1] = tc_f16x2_pow2(e - em + 6);
            sw[m] = dev_e8m0((uint8_t)em);
        } else if (FMT == DSV4_WF_NVFP4) {
            const uint32_t f = tc_hmul2(tc_e4m3x2_f16x2(a[m][i >> 1] >> (16 * (i & 1))), 0x54005400u); /* x 64, exact */
            fq[m][0] = (f & 0xffffu) * 0x10001u;
            fq[m][1] = (f >> 16) * 0x10001u;
            sw[m] = scale2;
        } else if (FMT == DSV4_WF_FP8) {
            if ((i % V) == V - 1) {
                const uint32_t w = a[m][(i + 1) / V - 1];
                sw[m] = scale_f32 ? __uint_as_float(w) : dev_e8m0((uint8_t)w);
            }
        }
    }
}

#endif
