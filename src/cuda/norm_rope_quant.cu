/* norm_rope_quant.cu - RMSNorm (spec 5), interleaved partial RoPE (spec 6) and the activation
 * rounding simulations of spec 9 and 14.3 (FP8 / FP4 act quant, Hadamard rotation). Twins:
 * dsv4_cpu_rmsnorm, dsv4_cpu_rope, dsv4_act_quant_fp8, dsv4_act_quant_fp4, dsv4_hadamard; the fused norm + rope + FP8
 * quant (the decode step's kv row, query heads and compressor entries): those three in order.
 * Products that the twin rounds separately are written with __fmul_rn / __fadd_rn so that nvcc does
 * not contract them into FMAs; the quant and Hadamard kernels are bit-exact. */
#include "common.cuh"

/* ---- RMSNorm: one block of RMS_NT threads per row; sum of squares in double (common.cuh's order), as the twin.
 * RQ > 0: 16-byte rows of at most RMS_NT * RQ quads, each thread's quads (and their weights) loaded at once into
 * registers; RQ 0: any row, read twice. ---- */

/* The row's 1 / rms from its quads in registers (thread j holds quads j, j + RMS_NT, .. of the nq): the sums in
 * common.cuh's order; a block barrier (every thread calls it) */
template <int RQ>
__device__ __forceinline__ float rms_inv(const float4 (&v)[RQ], int nq, int n, float eps, double *part) {
    const int tid = threadIdx.x;
    double ss = 0;
#pragma unroll
    for (int k = 0; k < RQ; k++)
        if (tid + k * RMS_NT < nq) ss = rms_sq4(ss, v[k]);
    ss = warp_sum_d(ss);
    if ((tid & 31) == 0) part[tid >> 5] = ss;
    __syncthreads();
    ss = rms_sum8(part);
    return 1.0f / sqrtf((float)(ss / n) + eps);
}
/* a normalized quad: x r, times its weights wv unless NULL */
__device__ __forceinline__ float4 rms_apply4(float4 v, const float4 *wv, float r) {
    if (wv) return make_float4(__fmul_rn(wv->x, __fmul_rn(v.x, r)), __fmul_rn(wv->y, __fmul_rn(v.y, r)),
                               __fmul_rn(wv->z, __fmul_rn(v.z, r)), __fmul_rn(wv->w, __fmul_rn(v.w, r)));
    return make_float4(__fmul_rn(v.x, r), __fmul_rn(v.y, r), __fmul_rn(v.z, r), __fmul_rn(v.w, r));
}
/* one interleaved RoPE pair (a, b) at angle p x f, backwards with inverse */
__device__ __forceinline__ void rope_pair(float &a, float &b, float p, float f, int inverse) {
    const float ang = __fmul_rn(p, f);
    const float c = cosf(ang);
    float s = sinf(ang);
    if (inverse) s = -s;
    const float x = a, y = b;
    a = __fsub_rn(__fmul_rn(x, c), __fmul_rn(y, s));
    b = __fadd_rn(__fmul_rn(x, s), __fmul_rn(y, c));
}
/* the act quant simulation of a block (spec 9): its scale from the block's |max| (floored at amax0), one value */
template <int FP4> __device__ __forceinline__ float act_amax0() { return FP4 ? 6.0f * 0x1p-126f : 1e-4f; }
template <int FP4> __device__ __forceinline__ float act_scale(float amax) {
    return FP4 ? dev_pow2_ceil(__fdiv_rn(amax, 6.0f)) : dev_pow2_ceil(__fmul_rn(amax, 1.0f / 448.0f));
}
template <int FP4> __device__ __forceinline__ float act_q(float x, float s) {
    const float lim = FP4 ? 6.0f : 448.0f, v = fminf(fmaxf(__fdiv_rn(x, s), -lim), lim);
    return (FP4 ? dev_round_e2m1(v) : dev_round_e4m3(v)) * s;
}
/* Hadamard butterflies (double; a the lower element, b the upper: a + b, a - b; stages h = 1, 2, ..):
 * of a row of n in shared memory by nt threads (a barrier after each stage), */
__device__ __forceinline__ void hadamard_smem(double *hs, int n, int tid, int nt) {
    for (int h = 1; h < n; h *= 2) {
        for (int q = tid; q < n / 2; q += nt) {
            const int j = (q / h) * 2 * h + (q % h);
            const double a = hs[j], b = hs[j + h];
            hs[j] = a + b;
            hs[j + h] = a - b;
        }
        __syncthreads();
    }
}
/* or of a row of 32 E held by a warp, lane l elements l E .. l E + E - 1: h < E inside a lane, then by shuffles */
template <int E>
__device__ __forceinline__ void hadamard_warp(double (&v)[E], int lane) {
#pragma unroll
    for (int h = 1; h < E; h *= 2)
#pragma unroll
        for (int e = 0; e < E; e++)
            if (!(e & h)) {
                const double a = v[e], b = v[e + h];
                v[e] = a + b;
                v[e + h] = a - b;
            }
#pragma unroll
    for (int m = 1; m < 32; m *= 2) {
        const bool up = lane & m;
#pragma unroll
        for (int e = 0; e < E; e++) {
            const double o = __shfl_xor_sync(0xffffffffu, v[e], m);
            v[e] = up ? o - v[e] : v[e] + o;
        }
    }
}

template <int RQ>
__global__ void __launch_bounds__(RMS_NT) rmsnorm_kernel(float *x, int n, int64_t ld, const float *w, float eps) {
    dev_pdl_enter();
    __shared__ double part[RMS_NT / 32];
    float *row = x + (int64_t)blockIdx.x * ld;
    const int tid = threadIdx.x, nq = (n + 3) >> 2;
    double ss = 0;
    if constexpr (RQ > 0) {
        float4 v[RQ], wv[RQ];
        float4 *r4 = (float4 *)row;
#pragma unroll
        for (int k = 0; k < RQ; k++) {
            const int q = tid + k * RMS_NT;
            if (q < nq) {
                v[k] = r4[q];
                if (w) wv[k] = ((const float4 *)w)[q];
            }
        }
        const float r = rms_inv<RQ>(v, nq, n, eps, part);
#pragma unroll
        for (int k = 0; k < RQ; k++) {
            const int q = tid + k * RMS_NT;
            if (q < nq) r4[q] = rms_apply4(v[k], w ? &wv[k] : NULL, r);
        }
    } else {
        for (int g = tid; g < nq; g += RMS_NT)
#pragma unroll
            for (int u = 0; u < 4; u++)
                if (4 * g + u < n) ss += (double)row[4 * g + u] * row[4 * g + u];
        ss = warp_sum_d(ss);
        if ((tid & 31) == 0) part[tid >> 5] = ss;
        __syncthreads();
        ss = rms_sum8(part);
        const float r = 1.0f / sqrtf((float)(ss / n) + eps);
        for (int i = tid; i < n; i += RMS_NT) row[i] = w ? __fmul_rn(w[i], __fmul_rn(row[i], r)) : __fmul_rn(row[i], r);
    }
}

extern "C" int dsv4_cuda_rmsnorm(float *x, int rows, int n, int64_t ld, const float *w, float eps, void *stream) {
    if (rows < 0 || n <= 0 || ld < n) return dsv4_cuda_fail("rmsnorm: bad shape (rows %d n %d ld %lld)", rows, n, (long long)ld);
    if (!rows) return 0;
    cudaStream_t st = DSV4_STREAM(stream);
    const int vec = n % 4 == 0 && ld % 4 == 0 && !((uintptr_t)x & 15) && !((uintptr_t)w & 15), nq = n / 4;
    if (vec && nq <= RMS_NT) dev_launch(rmsnorm_kernel<1>, rows, RMS_NT, 0, st, x, n, ld, w, eps);
    else if (vec && nq <= 4 * RMS_NT) dev_launch(rmsnorm_kernel<4>, rows, RMS_NT, 0, st, x, n, ld, w, eps);
    else if (vec && nq <= 8 * RMS_NT) dev_launch(rmsnorm_kernel<8>, rows, RMS_NT, 0, st, x, n, ld, w, eps);
    else dev_launch(rmsnorm_kernel<0>, rows, RMS_NT, 0, st, x, n, ld, w, eps);
    return dsv4_cuda_check_launch("rmsnorm");
}

/* ---- RoPE: one thread per (token, head, pair) ---- */

__global__ void rope_kernel(float *x, int T, int H, int n, int npairs, const float *freq, const int *pos, int inverse) {
    dev_pdl_enter();
    int64_t g = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (g >= (int64_t)T * H * npairs) return;
    int i = (int)(g % npairs);
    int64_t th = g / npairs;
    int t = (int)(th / H);
    float *p = x + th * n + n - 2 * npairs;
    rope_pair(p[2 * i], p[2 * i + 1], (float)pos[t], freq[i], inverse);
}

extern "C" int dsv4_cuda_rope(float *x, int T, int H, int n, int npairs, const float *freq, const int *pos, int inverse,
                              void *stream) {
    if (T < 0 || H <= 0 || npairs < 0 || 2 * npairs > n) return dsv4_cuda_fail("rope: bad shape (n %d npairs %d)", n, npairs);
    int64_t total = (int64_t)T * H * npairs;
    if (!total) return 0;
    dev_launch(rope_kernel, (unsigned)((total + 255) / 256), 256, 0, DSV4_STREAM(stream), x, T, H, n, npairs, freq, pos, inverse);
    return dsv4_cuda_check_launch("rope");
}

/* ---- fused row preparation: [RMSNorm] + RoPE + (FP8 act quant of the first qn values in blocks of qb | Hadamard
 * rotation + FP4 act quant in blocks of 32 | nothing): one block a contiguous row of n, the separate kernels'
 * operations in their order (the norm's sums as rmsnorm_kernel<RQ>, the rotation as rope_kernel, the FP8 quant as
 * act_quant_kernel<0>, the Hadamard butterflies as hadamard_kernel, the FP4 quant as act_quant_kernel<1>), so their
 * bits in one launch; the row staged in shared memory between the steps (then n doubles for the butterflies). Row r is
 * token r / H's head r % H. POST: 0 none, 1 FP8 (qn, qb), 2 Hadamard + FP4. ---- */

/* a staged row's first qn values, FP8-quantized in blocks of qb as act_quant_kernel<0> does: block bk by warp bk mod nw
 * (its maximum by warp_max: any order) */
__device__ __forceinline__ void row_q8(float *sx, int qn, int qb, int warp, int lane, int nw) {
    const int nblk = (qn + qb - 1) / qb;
    for (int bk = warp; bk < nblk; bk += nw) {
        const int b0 = bk * qb, b1 = b0 + qb < qn ? b0 + qb : qn;
        float amax = act_amax0<0>();
        for (int i = b0 + lane; i < b1; i += 32) amax = fmaxf(amax, fabsf(sx[i]));
        const float s = act_scale<0>(warp_max(amax));
        for (int i = b0 + lane; i < b1; i += 32) sx[i] = act_q<0>(sx[i], s);
    }
}

/* the staged row back to x; POST 3: as f16 (round to nearest even) into the first half of its own bytes (the block's
 * reads of the row are done: it is staged) */
template <int POST> __device__ __forceinline__ void row_out(float4 *r4, const float4 *sx4, int u, int nq, int step) {
    for (int q = u; q < nq; q += step) {
        if (POST == 3) {
            const float4 v = sx4[q];
            const __half2 a = __floats2half2_rn(v.x, v.y), b = __floats2half2_rn(v.z, v.w);
            ((uint2 *)r4)[q] = make_uint2(*(const uint32_t *)&a, *(const uint32_t *)&b);
        } else {
            r4[q] = sx4[q];
        }
    }
}

template <int RQ, int NORM, int POST>
__global__ void __launch_bounds__(RMS_NT) row_prep_kernel(float *x, int n, int H, const float *w, float eps, int npairs,
                                                          const float *freq, const int *pos, int qn, int qb) {
    dev_pdl_enter();
    extern __shared__ float4 sx4[];
    __shared__ double part[RMS_NT / 32];
    float *sx = (float *)sx4;
    float4 *r4 = (float4 *)(x + (int64_t)blockIdx.x * n);
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, nq = n >> 2, t = blockIdx.x / H;
    float4 v[RQ], wv[RQ];
#pragma unroll
    for (int k = 0; k < RQ; k++) {
        const int q = tid + k * RMS_NT;
        if (q < nq) {
            v[k] = r4[q];
            if (NORM && w) wv[k] = ((const float4 *)w)[q];
        }
    }
    const float r = NORM ? rms_inv<RQ>(v, nq, n, eps, part) : 1.0f;
#pragma unroll
    for (int k = 0; k < RQ; k++) {
        const int q = tid + k * RMS_NT;
        if (q < nq) sx4[q] = NORM ? rms_apply4(v[k], w ? &wv[k] : NULL, r) : v[k];
    }
    __syncthreads();
    float *p = sx + n - 2 * npairs;
    for (int i = tid; i < npairs; i += RMS_NT) rope_pair(p[2 * i], p[2 * i + 1], (float)pos[t], freq[i], 0);
    __syncthreads();
    if (POST == 1 && qb > 0) {
        row_q8(sx, qn, qb, warp, lane, RMS_NT / 32);
        __syncthreads();
    }
    if (POST == 2) { /* hadamard_kernel's butterflies in double, then act_quant_kernel<1> in blocks of 32 */
        double *hs = (double *)(sx + ((n + 3) & ~3));
        for (int i = tid; i < n; i += RMS_NT) hs[i] = sx[i];
        __syncthreads();
        hadamard_smem(hs, n, tid, RMS_NT);
        const double sc = 1.0 / sqrt((double)n);
        for (int i = tid; i < n; i += RMS_NT) sx[i] = (float)__dmul_rn(hs[i], sc);
        __syncthreads();
        for (int bk = warp; bk < (n + 31) / 32; bk += RMS_NT / 32) { /* one lane a value: blocks of 32 */
            const int i = bk * 32 + lane;
            float amax = act_amax0<1>();
            if (i < n) amax = fmaxf(amax, fabsf(sx[i]));
            const float s = act_scale<1>(warp_max(amax));
            if (i < n) sx[i] = act_q<1>(sx[i], s);
        }
        __syncthreads();
    }
    row_out<POST>(r4, sx4, tid, nq, RMS_NT);
}

/* row_prep_kernel<1, NORM, POST> for rows of at most RMS_NT / 2 quads (POST 0 or 1), two rows a block: half h of the
 * block (RMS_NT / 2 threads, warps 4 h ..) takes row 2 blockIdx.x + h as the one-row kernel's first half takes its row
 * (its other half holds no quad), so the same bits: thread u its quad u, the norm's sum ((p0 + p1) + (p2 + p3)) + 0 of
 * the half's four warps (rms_sum8 with the idle warps' zeros), the rotation and the quant blocks by the same code. Twice
 * the quads a block in flight: the 64 query heads of a prefill pass were 262,144 one-row blocks of 128 busy threads
 * (~680 us a 4096-row pass, 40 % of the copy rate; bench/NOTES.md "Session 24"). */
template <int NORM, int POST>
__global__ void __launch_bounds__(RMS_NT) row_prep2_kernel(float *x, int rows, int n, int H, const float *w, float eps,
                                                           int npairs, const float *freq, const int *pos, int qn, int qb) {
    static_assert(POST == 0 || POST == 1 || POST == 3, "no Hadamard form here");
    constexpr int HT = RMS_NT / 2;
    dev_pdl_enter();
    extern __shared__ float4 sx4x[];
    __shared__ double part[RMS_NT / 32];
    const int tid = threadIdx.x, h = tid / HT, u = tid - h * HT, lane = tid & 31, warp = u >> 5, nq = n >> 2;
    const int64_t r = (int64_t)blockIdx.x * 2 + h;
    const bool ok = r < rows;
    const int t = ok ? (int)(r / H) : 0;
    float4 *sx4 = sx4x + h * nq, *r4 = (float4 *)(x + (ok ? r : 0) * n);
    float *sx = (float *)sx4;
    float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f), wv = v;
    if (ok && u < nq) {
        v = r4[u];
        if (NORM && w) wv = ((const float4 *)w)[u];
    }
    float rr = 1.0f;
    if (NORM) {
        double ss = 0;
        if (ok && u < nq) ss = rms_sq4(ss, v);
        ss = warp_sum_d(ss);
        if (lane == 0) part[tid >> 5] = ss;
        __syncthreads();
        const double *p = part + 4 * h;
        ss = ((p[0] + p[1]) + (p[2] + p[3])) + 0.0;
        rr = 1.0f / sqrtf((float)(ss / n) + eps);
    }
    if (u < nq) sx4[u] = NORM ? rms_apply4(v, w ? &wv : NULL, rr) : v;
    __syncthreads();
    float *p = sx + n - 2 * npairs;
    if (ok)
        for (int i = u; i < npairs; i += HT) rope_pair(p[2 * i], p[2 * i + 1], (float)pos[t], freq[i], 0);
    __syncthreads();
    if (POST == 1 && qb > 0) {
        row_q8(sx, qn, qb, warp, lane, HT / 32);
        __syncthreads();
    }
    if (ok) row_out<POST>(r4, sx4, u, nq, HT);
}

/* The f16 form (POST 3: the prefill attention's q) for rows of at most 128 quads, a warp a row, 8 rows a block. Lane l
 * holds quads l, l + 32, l + 64, l + 96: quad 32 k + l is what warp k of the one-row kernel held, so the four warp sums
 * are its four, added as rms_sum8 adds them (((s0 + s1) + (s2 + s3)) + 0: its other warps hold no quad), the same
 * bits; a RoPE pair lies inside a quad (pairs start at n - 2 npairs, even), and every element takes the same
 * operations as there. The f16 values go to the first half of the row's bytes after the warp barrier (every lane's
 * loads ordered before them). No shared memory and no block barrier: the row kernels' short blocks (two barriers and a
 * shared-memory round trip for 3 KB of traffic) kept too few bytes in flight: 786 us a 8192-row layer pass for 1.6 GB,
 * ~2 TB/s (RESULTS "Session 31"). */
template <int NORM>
__global__ void __launch_bounds__(256) row_h16_warp_kernel(float *x, int rows, int n, int H, const float *w, float eps,
                                                           int npairs, const float *freq, const int *pos) {
    dev_pdl_enter();
    const int lane = threadIdx.x & 31, nq = n >> 2;
    const int64_t r = (int64_t)blockIdx.x * 8 + (threadIdx.x >> 5);
    if (r >= rows) return; /* (the whole warp) */
    const int t = (int)(r / H), r0 = n - 2 * npairs;
    float4 *r4 = (float4 *)(x + r * n);
    float4 v[4], wv[4];
#pragma unroll
    for (int k = 0; k < 4; k++) {
        const int q = lane + 32 * k;
        v[k] = wv[k] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        if (q < nq) {
            v[k] = r4[q];
            if (NORM && w) wv[k] = ((const float4 *)w)[q];
        }
    }
    float rr = 1.0f;
    if (NORM) {
        double sk[4];
#pragma unroll
        for (int k = 0; k < 4; k++) sk[k] = warp_sum_d(lane + 32 * k < nq ? rms_sq4(0.0, v[k]) : 0.0);
        const double ss = ((sk[0] + sk[1]) + (sk[2] + sk[3])) + 0.0;
        rr = 1.0f / sqrtf((float)(ss / n) + eps);
    }
    const float pp = (float)pos[t];
#pragma unroll
    for (int k = 0; k < 4; k++) {
        const int j = 4 * (lane + 32 * k);
        float4 a = NORM ? rms_apply4(v[k], w ? &wv[k] : NULL, rr) : v[k];
        if (j < n) {
            if (j >= r0) rope_pair(a.x, a.y, pp, freq[(j - r0) >> 1], 0);
            if (j + 2 >= r0) rope_pair(a.z, a.w, pp, freq[(j + 2 - r0) >> 1], 0);
        }
        v[k] = a;
    }
    __syncwarp();
#pragma unroll
    for (int k = 0; k < 4; k++) {
        const int q = lane + 32 * k;
        if (q < nq) {
            const __half2 a = __floats2half2_rn(v[k].x, v[k].y), b = __floats2half2_rn(v[k].z, v[k].w);
            ((uint2 *)r4)[q] = make_uint2(*(const uint32_t *)&a, *(const uint32_t *)&b);
        }
    }
}

/* The Hadamard form for short rows, n = 32 E (E = 4, 8, 16; RMSNorm only at E = 4): a warp a row, lane l holding
 * elements l E .. l E + E - 1 (hadamard_warp_kernel's layout, so its butterflies), 8 rows a block. The same bits as
 * row_prep_kernel<., NORM, 2>: the norm's sum is lane l's quad through warp_sum_d, which is rmsnorm_kernel's for
 * n <= 128 (the other warps' sums are zeros); RoPE pairs lie inside a lane (E even, n - 2 npairs even); each FP4 block
 * of 32 is 32 / E lanes, its maximum by shuffles (fmaxf: any order). Row r is token r / H's head r % H. */
template <int E, int NORM>
__global__ void __launch_bounds__(256) rope_hq4_warp_kernel(float *x, int rows, int H, const float *w, float eps, int npairs,
                                                            const float *freq, const int *pos) {
    dev_pdl_enter();
    const int lane = threadIdx.x & 31, n = 32 * E;
    const int64_t r = (int64_t)blockIdx.x * 8 + (threadIdx.x >> 5);
    if (r >= rows) return;
    const int t = (int)(r / H);
    float4 *row = (float4 *)(x + r * n + lane * E);
    float v[E];
#pragma unroll
    for (int e = 0; e < E; e += 4) *(float4 *)&v[e] = row[e / 4];
    if (NORM) {
        static_assert(!NORM || E == 4, "the norm's order is rmsnorm_kernel's only for n <= 128");
        const float4 q = make_float4(v[0], v[1], v[2], v[3]);
        const double ss = warp_sum_d(rms_sq4(0.0, q));
        const float rr = 1.0f / sqrtf((float)(ss / n) + eps);
        *(float4 *)&v[0] = rms_apply4(q, w ? (const float4 *)w + lane : NULL, rr);
    }
    const int r0 = n - 2 * npairs;
#pragma unroll
    for (int e = 0; e < E; e += 2) {
        const int j = lane * E + e;
        if (j >= r0) rope_pair(v[e], v[e + 1], (float)pos[t], freq[(j - r0) >> 1], 0);
    }
    double d[E];
#pragma unroll
    for (int e = 0; e < E; e++) d[e] = v[e];
    hadamard_warp<E>(d, lane);
    const double sc = 1.0 / sqrt((double)n);
    float amax = act_amax0<1>();
#pragma unroll
    for (int e = 0; e < E; e++) {
        v[e] = (float)__dmul_rn(d[e], sc);
        amax = fmaxf(amax, fabsf(v[e]));
    }
#pragma unroll
    for (int m = 1; m < 32 / E; m *= 2) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, m));
    const float s = act_scale<1>(amax);
#pragma unroll
    for (int e = 0; e < E; e++) v[e] = act_q<1>(v[e], s);
#pragma unroll
    for (int e = 0; e < E; e += 4) row[e / 4] = *(float4 *)&v[e];
}

/* two rows a block where they fit (row_prep2_kernel: the same bits) for passes of >= 4096 rows (session 24: 8K prefill
 * 0.985x; at batch 1 the one-row kernel measured 0.995x of it); DSV4_ROW_PREP2=0 / 1 (read once) or
 * dsv4_cuda_row_prep2: never / always */
static int row_prep2_mode = -2;
extern "C" void dsv4_cuda_row_prep2(int mode) { row_prep2_mode = mode == 0 || mode == 1 ? mode : -2; }
static int row_prep2_on(int rows) {
    if (row_prep2_mode == -2) {
        const int e = dsv4_env_int("DSV4_ROW_PREP2", -1);
        row_prep2_mode = e == 0 || e == 1 ? e : -1;
    }
    return row_prep2_mode == 1 || (row_prep2_mode == -1 && rows >= 4096);
}

/* the f16 form a warp a row (row_h16_warp_kernel: the same bits) wherever the two-row kernel would run: the default
 * (session 32 on an H100: the Flash 8K prefill 0.997x; the tests run every form); DSV4_ROW_H16_WARP=0 (read once) or
 * dsv4_cuda_row_h16_warp(0): the two-row kernel */
static int row_h16_warp_mode = -2;
extern "C" void dsv4_cuda_row_h16_warp(int mode) { row_h16_warp_mode = mode == 0 || mode == 1 ? mode : -2; }
static int row_h16_warp_on(void) {
    if (row_h16_warp_mode == -2) row_h16_warp_mode = dsv4_env_int("DSV4_ROW_H16_WARP", 1) != 0;
    return row_h16_warp_mode;
}

template <int NORM, int POST>
static int row_prep(const char *op, float *x, int T, int H, int n, const float *w, float eps, int npairs, const float *freq,
                    const int *pos, int qn, int qb, void *stream) {
    const int rows = T * H, nq = n / 4;
    const size_t smem = (size_t)((n + 3) & ~3) * 4 + (POST == 2 ? (size_t)n * 8 : 0);
    const int vec = n % 4 == 0 && !((uintptr_t)x & 15) && !((uintptr_t)w & 15) && smem <= 48 * 1024 - 256 /* + part[] */ &&
                    (POST != 2 || (n & (n - 1)) == 0);
    cudaStream_t st = DSV4_STREAM(stream);
    if (POST == 3 && vec && nq <= RMS_NT / 2 && row_prep2_on(rows) && row_h16_warp_on())
        dev_launch(row_h16_warp_kernel<NORM>, (rows + 7) / 8, 256, 0, st, x, rows, n, H, w, eps, npairs, freq, pos);
    else if (vec && nq <= RMS_NT / 2 && POST != 2 && row_prep2_on(rows))
        dev_launch(row_prep2_kernel<NORM, POST == 2 ? 0 : POST>, (rows + 1) / 2, RMS_NT, 2 * smem, st, x, rows, n, H, w, eps,
                   npairs, freq, pos, qn, qb);
    else if (POST == 3 && !(vec && nq <= 4 * RMS_NT)) /* no f16 form of the separate kernels (dsv4_cuda_norm_rope_h16_fits) */
        return dsv4_cuda_fail("%s: row of %d outside the fused kernels", op, n);
    else if (vec && nq <= RMS_NT) dev_launch(row_prep_kernel<1, NORM, POST>, rows, RMS_NT, smem, st, x, n, H, w, eps, npairs, freq, pos, qn, qb);
    else if (vec && nq <= 4 * RMS_NT) dev_launch(row_prep_kernel<4, NORM, POST>, rows, RMS_NT, smem, st, x, n, H, w, eps, npairs, freq, pos, qn, qb);
    else { /* the separate kernels */
        int rc = NORM ? dsv4_cuda_rmsnorm(x, rows, n, n, w, eps, stream) : 0;
        if (!rc) rc = dsv4_cuda_rope(x, T, H, n, npairs, freq, pos, 0, stream);
        if (!rc && POST == 1 && qb > 0) rc = dsv4_cuda_act_quant_fp8(x, rows, qn, n, qb, stream);
        if (!rc && POST == 2) rc = dsv4_cuda_hadamard(x, rows, n, n, stream);
        if (!rc && POST == 2) rc = dsv4_cuda_act_quant_fp4(x, rows, n, n, 32, stream);
        return rc;
    }
    return dsv4_cuda_check_launch(op);
}

extern "C" int dsv4_cuda_norm_rope_q8(float *x, int T, int H, int n, const float *w, float eps, int npairs, const float *freq,
                                      const int *pos, int qn, int qb, void *stream) {
    if (T < 0 || H <= 0 || n <= 0 || npairs < 0 || 2 * npairs > n || qn < 0 || qn > n || qb < 0 || qb > 1024)
        return dsv4_cuda_fail("norm_rope_q8: bad shape (T %d H %d n %d pairs %d qn %d qb %d)", T, H, n, npairs, qn, qb);
    if (!T) return 0;
    return row_prep<1, 1>("norm_rope_q8", x, T, H, n, w, eps, npairs, freq, pos, qn, qb, stream);
}

extern "C" int dsv4_cuda_norm_rope_h16_enabled(void) {
    static int on = -1;
    if (on < 0) on = dsv4_env_int("DSV4_CUDA_Q16", 1) != 0;
    return on;
}

extern "C" int dsv4_cuda_norm_rope_h16_fits(const float *x, int n, const float *w) {
    return n > 0 && n % 8 == 0 && n / 4 <= 4 * RMS_NT && !((uintptr_t)x & 15) && !((uintptr_t)w & 15) &&
           (size_t)n * 4 <= 48 * 1024 - 256;
}

extern "C" int dsv4_cuda_norm_rope_h16(float *x, int T, int H, int n, const float *w, float eps, int npairs, const float *freq,
                                       const int *pos, void *stream) {
    if (T < 0 || H <= 0 || npairs < 0 || 2 * npairs > n || !dsv4_cuda_norm_rope_h16_fits(x, n, w))
        return dsv4_cuda_fail("norm_rope_h16: bad shape (T %d H %d n %d pairs %d)", T, H, n, npairs);
    if (!T) return 0;
    return row_prep<1, 3>("norm_rope_h16", x, T, H, n, w, eps, npairs, freq, pos, 0, 0, stream);
}

extern "C" int dsv4_cuda_rope_hq4(float *x, int T, int H, int n, int norm, const float *w, float eps, int npairs,
                                  const float *freq, const int *pos, void *stream) {
    if (T < 0 || H <= 0 || n <= 0 || n > 4096 || (n & (n - 1)) || npairs < 0 || 2 * npairs > n)
        return dsv4_cuda_fail("rope_hq4: bad shape (T %d H %d n %d pairs %d; n a power of two <= 4096)", T, H, n, npairs);
    if (!T) return 0;
    const int rows = T * H;
    const unsigned nb = (unsigned)((rows + 7) / 8);
    cudaStream_t st = DSV4_STREAM(stream);
    const int wv = !((uintptr_t)x & 15) && !((uintptr_t)w & 15); /* the warp form: short rows, 16-byte aligned */
    if (wv && n == 128 && norm) dev_launch(rope_hq4_warp_kernel<4, 1>, nb, 256, 0, st, x, rows, H, w, eps, npairs, freq, pos);
    else if (wv && n == 128) dev_launch(rope_hq4_warp_kernel<4, 0>, nb, 256, 0, st, x, rows, H, nullptr, eps, npairs, freq, pos);
    else if (wv && n == 256 && !norm) dev_launch(rope_hq4_warp_kernel<8, 0>, nb, 256, 0, st, x, rows, H, nullptr, eps, npairs, freq, pos);
    else if (wv && n == 512 && !norm) dev_launch(rope_hq4_warp_kernel<16, 0>, nb, 256, 0, st, x, rows, H, nullptr, eps, npairs, freq, pos);
    else
        return norm ? row_prep<1, 2>("rope_hq4", x, T, H, n, w, eps, npairs, freq, pos, 0, 0, stream)
                    : row_prep<0, 2>("rope_hq4", x, T, H, n, NULL, eps, npairs, freq, pos, 0, 0, stream);
    return dsv4_cuda_check_launch("rope_hq4");
}

/* ---- act quant: one warp per (row, block) ---- */

template <int FP4>
__global__ void act_quant_kernel(float *x, int rows, int n, int64_t ld, int block, int nblk) {
    dev_pdl_enter();
    int64_t g = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    int lane = threadIdx.x & 31;
    if (g >= (int64_t)rows * nblk) return;
    int r = (int)(g / nblk), b0 = (int)(g % nblk) * block;
    int b1 = b0 + block < n ? b0 + block : n;
    float *p = x + (int64_t)r * ld;
    float amax = act_amax0<FP4>();
    for (int i = b0 + lane; i < b1; i += 32) amax = fmaxf(amax, fabsf(p[i]));
    const float s = act_scale<FP4>(warp_max(amax));
    for (int i = b0 + lane; i < b1; i += 32) p[i] = act_q<FP4>(p[i], s);
}

template <int FP4>
static int act_quant(const char *op, float *x, int rows, int n, int64_t ld, int block, void *stream) {
    if (rows < 0 || n < 0 || ld < n || block <= 0 || block > 1024)
        return dsv4_cuda_fail("%s: bad shape (rows %d n %d block %d)", op, rows, n, block);
    int nblk = (n + block - 1) / block;
    int64_t warps = (int64_t)rows * nblk;
    if (!warps) return 0;
    dev_launch(act_quant_kernel<FP4>, (unsigned)((warps + 7) / 8), 256, 0, DSV4_STREAM(stream), x, rows, n, ld, block, nblk);
    return dsv4_cuda_check_launch(op);
}

extern "C" int dsv4_cuda_act_quant_fp8(float *x, int rows, int n, int64_t ld, int block, void *stream) {
    return act_quant<0>("act_quant_fp8", x, rows, n, ld, block, stream);
}

extern "C" int dsv4_cuda_act_quant_fp4(float *x, int rows, int n, int64_t ld, int block, void *stream) {
    return act_quant<1>("act_quant_fp4", x, rows, n, ld, block, stream);
}

/* ---- Hadamard: butterflies in double (same additions in the same order as the twin, so the same bits): a warp per
 * row in registers for n = 32 .. 512, else one block per row in shared memory ---- */

__global__ void __launch_bounds__(256) hadamard_kernel(float *x, int n, int64_t ld) {
    dev_pdl_enter();
    extern __shared__ double hs[];
    float *row = x + (int64_t)blockIdx.x * ld;
    for (int i = threadIdx.x; i < n; i += 256) hs[i] = row[i];
    __syncthreads();
    hadamard_smem(hs, n, threadIdx.x, 256);
    double s = 1.0 / sqrt((double)n);
    for (int i = threadIdx.x; i < n; i += 256) row[i] = (float)__dmul_rn(hs[i], s);
}

/* n = 32 E (E a power of two up to 32): a warp per row, lane l holding elements l E .. l E + E - 1; the butterflies
 * with h < E inside a lane, then h = E, 2E, .. between lanes l and l ^ (h / E) by shuffles: the same additions (a the
 * lower element, b the upper: a + b, a - b) in the same stage order as hadamard_kernel, so the same bits. */
template <int E>
__global__ void __launch_bounds__(256) hadamard_warp_kernel(float *x, int rows, int64_t ld) {
    dev_pdl_enter();
    const int lane = threadIdx.x & 31;
    const int64_t r = (int64_t)blockIdx.x * 8 + (threadIdx.x >> 5);
    if (r >= rows) return;
    float *row = x + r * ld + lane * E;
    double v[E];
#pragma unroll
    for (int e = 0; e < E; e++) v[e] = row[e];
    hadamard_warp<E>(v, lane);
    const double s = 1.0 / sqrt((double)(32 * E));
#pragma unroll
    for (int e = 0; e < E; e++) row[e] = (float)__dmul_rn(v[e], s);
}

extern "C" int dsv4_cuda_hadamard(float *x, int rows, int n, int64_t ld, void *stream) {
    if (rows < 0 || n <= 0 || n > 4096 || (n & (n - 1)) || ld < n)
        return dsv4_cuda_fail("hadamard: n %d must be a power of two <= 4096 (rows %d)", n, rows);
    if (!rows) return 0;
    cudaStream_t st = DSV4_STREAM(stream);
    const unsigned wg = (unsigned)(((int64_t)rows + 7) / 8);
    switch (n) {
    case 32: dev_launch(hadamard_warp_kernel<1>, wg, 256, 0, st, x, rows, ld); break;
    case 64: dev_launch(hadamard_warp_kernel<2>, wg, 256, 0, st, x, rows, ld); break;
    case 128: dev_launch(hadamard_warp_kernel<4>, wg, 256, 0, st, x, rows, ld); break;
    case 256: dev_launch(hadamard_warp_kernel<8>, wg, 256, 0, st, x, rows, ld); break;
    case 512: dev_launch(hadamard_warp_kernel<16>, wg, 256, 0, st, x, rows, ld); break;
    default: dev_launch(hadamard_kernel, rows, 256, (size_t)n * sizeof(double), st, x, n, ld);
    }
    return dsv4_cuda_check_launch("hadamard");
}
