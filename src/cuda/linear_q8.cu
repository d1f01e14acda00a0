/* linear_q8.cu - a prototype, off by default (dsv4_cuda_linear_q8(1) or DSV4_LINEAR_Q8=1; bench/NOTES.md session 37):
 * the decode GEMV for FP8 weights with the FP8 act quant on Hopper's FP8 tensor cores, wgmma m64n8k32 e4m3 (QGMMA),
 * instead of gemv_tc's e4m3 -> f16 decode and f16 mma.sync (which is also what ptxas makes of mma.sync e4m3 on
 * sm_90a). Its question: can a QGMMA GEMV stream the weights at gemv_tc's rate at 1-8 tokens? If it can, a wgmma GEMM
 * for 64+ tokens with the same per-unit sequence gives the batch-invariant decode FP8 tensor-core speed at batch
 * 64-1024 (the multi-token GEMM, gemm_bi, must reproduce the f16 GEMV and runs ~150 TFLOP/s).
 *
 * Not the bits of gemv_tc: a QGMMA k32 step aligns its products (~13 fraction bits, moe_f8.cuh), as DeepSeek's own
 * FP8 GEMM does; per 128-column unit 4 chained k32 steps, then the unit's sum times (block scale x act-quant scale)
 * added in fp32.
 *
 * A block: Q8_KW warpgroups on one 64-row tile at a time, warpgroup w on column slice kg * Q8_KW + w of S = Q8_KW x KG
 * (KG blocks a thread-block cluster), the slices' sums added in the order of s by rank 0's warpgroup 0. Warp w of a
 * warpgroup streams rows 16 (w & 3) .. + 15 of the tile, lane (g, c) the 16-byte chunks c and 4 + c of rows g and
 * g + 8 of each unit (gemv_tc's loads), whose words are wgmma's A registers as they are: k32 step 2 v + j of a unit
 * takes words 2 j (a0 / a1: k = 4c .. 4c + 3) and 2 j + 1 (a2 / a3: k = 16 + 4c ..) of chunk v of rows g / g + 8, so
 * that step's k positions hold columns 64 v + 16 c + 8 j + 4 h + b (h: the k half). x is staged once per block as e4m3
 * codes in that order, B of each k32 step as two K-major core matrices [k half][8 tokens][16 bytes], and one
 * power-of-two scale per (token, unit) (dsv4_act_quant_fp8's). Two steps of two units each are in flight per lane. */
#include <cooperative_groups.h>
#include <cuda_fp8.h>

#include "common.cuh"
#include "linear_tc.cuh"
#include "wgmma.cuh"

namespace cg = cooperative_groups;

#define Q8_KW 4 /* warpgroups a block */

struct q8_params {
    const uint8_t *w, *scale;
    int scale_f32;
    int64_t scale_stride;
    int row0, R, C, NU, ntile, nt, nub; /* nub: staged units a block (the most of any rank) */
    const float *x;
    float *y;
};

struct q8_buf {
    uint4 q[2][2][2]; /* [unit j of the step][chunk v][row g / g + 8] */
    float sw[2];      /* the units' block scales */
};

__device__ __forceinline__ void q8_mma(float (&d)[4], const uint32_t (&a)[4], uint64_t desc, int acc) {
    asm volatile("{ .reg .pred p; setp.ne.b32 p, %9, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n8k32.f32.e4m3.e4m3 {%0,%1,%2,%3}, {%4,%5,%6,%7}, %8, p, 1, 1; }"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(acc)
                 : "memory");
}

template <int KG>
__global__ void __launch_bounds__(Q8_KW * 128, 1) q8_gemv(const __grid_constant__ q8_params p) {
    extern __shared__ __align__(128) unsigned char q8_sm[];
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, c = lane & 3, wg = warp >> 2, tw = tid & 127;
    const int kg = KG > 1 ? (int)cg::this_cluster().block_rank() : 0;
    const int cid = blockIdx.x / KG, ncl = gridDim.x / KG;
    constexpr int S = Q8_KW * KG;
    const int NU = p.NU, s = kg * Q8_KW + wg;
    const int ub0 = kg * Q8_KW * NU / S, nub = (kg + 1) * Q8_KW * NU / S - ub0; /* this block's units */
    const int u0 = s * NU / S, u1 = (s + 1) * NU / S;                           /* this warpgroup's */
    const int nsteps = ((NU + S - 1) / S + 1) / 2;                             /* the same for every warpgroup */
    const int iters = (p.ntile + ncl - 1) / ncl, total = iters * nsteps;
    unsigned char *xs = q8_sm;                                   /* [nub][4 k32 steps][2 k halves][8 tokens][16] */
    float *sx = (float *)(q8_sm + (size_t)p.nub * 1024);         /* [8 tokens][nub] */
    float4 *part = (float4 *)(q8_sm + (size_t)p.nub * 1024 + (((size_t)p.nub * 32 + 15) & ~(size_t)15)); /* [Q8_KW][128] */
    const unsigned xsa = (unsigned)__cvta_generic_to_shared(xs);
    const int64_t rowq = p.C / 16;
    const int rw = (warp & 3) * 16 + g; /* the lane's first row in a tile */

    auto load = [&](q8_buf &b, int gs) {
        const int it = gs / nsteps, st = gs - it * nsteps, tile = cid + it * ncl;
        const bool act = gs < total && tile < p.ntile;
#pragma unroll
        for (int j = 0; j < 2; j++) {
            const int u = u0 + 2 * st + j;
            const bool ok = act && u < u1;
#pragma unroll
            for (int m = 0; m < 2; m++) {
                const int64_t row = (int64_t)p.row0 + tile * 64 + rw + 8 * m;
#pragma unroll
                for (int v = 0; v < 2; v++)
                    b.q[j][v][m] = ok ? tc_ld_stream((const uint4 *)p.w + row * rowq + u * 8 + v * 4 + c) : make_uint4(0, 0, 0, 0);
            }
            const int64_t si = ((int64_t)(p.row0 + tile * 64) / 128) * p.scale_stride + u;
            b.sw[j] = !ok ? 0.0f : p.scale_f32 ? __ldg((const float *)p.scale + si) : dev_e8m0(__ldg(p.scale + si));
        }
    };

    dev_pdl_trigger();
    q8_buf b0, b1;
    load(b0, 0), load(b1, 1);
    dev_pdl_wait();
    /* x: item (token, unit) a warp, act-quantized, codes into the k32 steps' B order, zeros past nt */
    for (int it = warp; it < 8 * nub; it += Q8_KW * 4) {
        const int t = it / nub, ul = it - t * nub;
        float v[4];
#pragma unroll
        for (int q = 0; q < 4; q++) v[q] = t < p.nt ? p.x[(int64_t)t * p.C + (int64_t)(ub0 + ul) * 128 + q * 32 + lane] : 0.0f;
        float a = 1e-4f;
#pragma unroll
        for (int q = 0; q < 4; q++) a = fmaxf(a, fabsf(v[q]));
        a = warp_max(a);
        const float sc = dev_pow2_ceil(a * (1.0f / 448.0f)), inv = 1.0f / sc; /* exact: sc is a power of two */
#pragma unroll
        for (int q = 0; q < 4; q++) {
            const int i = q * 32 + lane; /* column 64 v + 16 c + 8 j + 4 h + b -> step 2 v + j, half h, byte 4 c + b */
            const int vv = i >> 6, cc = (i >> 4) & 3, jj = (i >> 3) & 1, hh = (i >> 2) & 1, bb = i & 3;
            const float yq = fminf(fmaxf(v[q] * inv, -448.0f), 448.0f);
            const uint8_t code = t < p.nt ? (uint8_t)__nv_cvt_float_to_fp8(yq, __NV_SATFINITE, __NV_E4M3) : 0;
            xs[((ul * 4 + 2 * vv + jj) * 2 + hh) * 128 + t * 16 + 4 * cc + bb] = code;
        }
        if (lane == 0) sx[t * nub + ul] = t < p.nt ? sc : 0.0f;
    }
    wg_fence_proxy();
    __syncthreads();

    float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    auto step = [&](q8_buf &b, int gs) {
        const int it = gs / nsteps, st = gs - it * nsteps, tile = cid + it * ncl;
        const bool act = tile < p.ntile;
        /* no branch around the wgmmas (ptxas would serialize them): units past the slice, or tiles past the end, have
         * zero weights and scales (load), and their descriptors stay inside the staged units */
        float d[2][4];
#pragma unroll
        for (int j = 0; j < 2; j++)
#pragma unroll
            for (int k = 0; k < 4; k++) d[j][k] = 0.0f;
        wg_fence();
#pragma unroll
        for (int j = 0; j < 2; j++) {
            int ul = u0 + 2 * st + j - ub0;
            ul = ul < nub ? ul : nub - 1;
#pragma unroll
            for (int k = 0; k < 4; k++) {
                const int v = k >> 1, jj = k & 1;
                const uint32_t a[4] = {(&b.q[j][v][0].x)[2 * jj], (&b.q[j][v][1].x)[2 * jj], (&b.q[j][v][0].x)[2 * jj + 1],
                                       (&b.q[j][v][1].x)[2 * jj + 1]};
                q8_mma(d[j], a, wg_desc(xsa + (unsigned)((ul * 4 + k) * 256), 128, 256), k);
            }
        }
        wg_commit();
        wg_wait<0>();
#pragma unroll
        for (int j = 0; j < 2; j++) {
#pragma unroll
            for (int k = 0; k < 4; k++) wg_keep(d[j][k]);
#pragma unroll
            for (int v = 0; v < 2; v++)
#pragma unroll
                for (int m = 0; m < 2; m++) wg_keep(b.q[j][v][m].x), wg_keep(b.q[j][v][m].y), wg_keep(b.q[j][v][m].z), wg_keep(b.q[j][v][m].w);
            int ul = u0 + 2 * st + j - ub0;
            ul = ul < nub ? ul : nub - 1;
            const int t0 = 2 * c;
            const float xa = sx[t0 * nub + ul], xb = sx[(t0 + 1) * nub + ul];
            acc[0] = fmaf(d[j][0], b.sw[j] * xa, acc[0]);
            acc[1] = fmaf(d[j][1], b.sw[j] * xb, acc[1]);
            acc[2] = fmaf(d[j][2], b.sw[j] * xa, acc[2]);
            acc[3] = fmaf(d[j][3], b.sw[j] * xb, acc[3]);
        }
        if (st != nsteps - 1) return;
        /* the tile's slices, added in the order of s by rank 0's warpgroup 0 */
        part[wg * 128 + tw] = make_float4(acc[0], acc[1], acc[2], acc[3]);
        if (KG > 1) cg::this_cluster().sync();
        else __syncthreads();
        if (kg == 0 && wg == 0 && act) {
            float sum[4];
#pragma unroll 4
            for (int s2 = 0; s2 < S; s2++) {
                const float4 *src = part + (s2 % Q8_KW) * 128 + tw;
                if (KG > 1 && s2 >= Q8_KW) src = cg::this_cluster().map_shared_rank(src, s2 / Q8_KW);
                const float4 vv = *src;
                if (s2 == 0) sum[0] = vv.x, sum[1] = vv.y, sum[2] = vv.z, sum[3] = vv.w;
                else sum[0] += vv.x, sum[1] += vv.y, sum[2] += vv.z, sum[3] += vv.w;
            }
            const int r = tile * 64 + rw, t0 = 2 * c;
            if (t0 < p.nt) p.y[(int64_t)t0 * p.R + r] = sum[0], p.y[(int64_t)t0 * p.R + r + 8] = sum[2];
            if (t0 + 1 < p.nt) p.y[(int64_t)(t0 + 1) * p.R + r] = sum[1], p.y[(int64_t)(t0 + 1) * p.R + r + 8] = sum[3];
        }
        if (KG > 1) cg::this_cluster().sync(); /* the parts stay until read */
        else __syncthreads();
#pragma unroll
        for (int k = 0; k < 4; k++) acc[k] = 0.0f;
    };

    for (int gs = 0; gs < total; gs += 2) {
        step(b0, gs);
        load(b0, gs + 2);
        if (gs + 1 >= total) break;
        step(b1, gs + 1);
        load(b1, gs + 3);
    }
}

static int q8_on = -1;
extern "C" void dsv4_cuda_linear_q8(int on) { q8_on = on; }

/* 0 done, 1 not taken (switched off, or a shape / format / T it does not take), -1 launch error */
extern "C" int dsv4_linear_q8_run(const dsv4_cuda_weight *w, const float *x, int T, float *y, cudaStream_t st) {
    if (q8_on < 0) q8_on = dsv4_env_int("DSV4_LINEAR_Q8", 0) != 0;
    if (!q8_on || w->fmt != DSV4_WF_FP8 || !w->act_quant || T < 1 || T > 8 || w->cols % 128 || w->rows % 64 || w->row0 % 64 ||
        ((uintptr_t)w->data & 15))
        return 1;
    const int NU = w->cols / 128, ntile = w->rows / 64, nsm = dsv4_cuda_dev.sm_count > 0 ? dsv4_cuda_dev.sm_count : 132;
    int KG = 1;
    while (KG < 8 && ntile * KG < nsm && Q8_KW * KG * 2 <= NU) KG *= 2;
    const int S = Q8_KW * KG;
    int nub = 0;
    for (int k = 0; k < KG; k++) {
        const int n = (k + 1) * Q8_KW * NU / S - k * Q8_KW * NU / S;
        nub = n > nub ? n : nub;
    }
    int ncl = nsm / KG;
    if (ncl > ntile) ncl = ntile;
    const size_t smem = (size_t)nub * 1024 + (((size_t)nub * 32 + 15) & ~(size_t)15) + (size_t)Q8_KW * 128 * 16;
    q8_params p;
    p.w = w->data, p.scale = w->scale, p.scale_f32 = w->scale_f32, p.scale_stride = w->scale_stride;
    p.row0 = w->row0, p.R = w->rows, p.C = w->cols, p.NU = NU, p.ntile = ntile, p.nt = T, p.nub = nub, p.x = x, p.y = y;
    void (*fn)(q8_params) = KG == 8 ? q8_gemv<8> : KG == 4 ? q8_gemv<4> : KG == 2 ? q8_gemv<2> : q8_gemv<1>;
    if (smem > 48 * 1024 && cudaFuncSetAttribute((const void *)fn, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem) != cudaSuccess) {
        cudaGetLastError();
        return 1;
    }
    cudaLaunchConfig_t cfg = {};
    cudaLaunchAttribute at[2];
    int na = 0;
    if (KG > 1) {
        at[na].id = cudaLaunchAttributeClusterDimension;
        at[na].val.clusterDim.x = KG, at[na].val.clusterDim.y = 1, at[na].val.clusterDim.z = 1;
        na++;
    }
    at[na].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    at[na].val.programmaticStreamSerializationAllowed = 1;
    na++;
    cfg.gridDim = dim3(ncl * KG);
    cfg.blockDim = dim3(Q8_KW * 128);
    cfg.dynamicSmemBytes = smem;
    cfg.stream = st;
    cfg.attrs = at;
    cfg.numAttrs = na;
    const cudaError_t e = cudaLaunchKernelEx(&cfg, fn, p);
    if (e != cudaSuccess) {
        cudaGetLastError();
        return dsv4_cuda_fail("linear q8: launch: %s", cudaGetErrorString(e));
    }
    return dsv4_cuda_check_launch("linear q8");
}
