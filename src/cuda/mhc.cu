/* mhc.cu - manifold-constrained hyper-connections (spec 4): pre (mix, sigmoid gates, Sinkhorn-
 * normalized combination, weighted sum of the M streams), post (recombination), head. Twins:
 * dsv4_cpu_hc_pre / _post / _head.
 *
 * pre / head run in two kernels over a caller's scratch (dsv4_cuda_hc_scratch_bytes):
 *  1. the mixes: each token's K = M*D stream values are cut in super-chunks of HC_SC = HC_G chunks of
 *     HC_CH columns; per (token, row, super-chunk) a partial dot product (and per (token, super-chunk)
 *     a partial sum of squares, in double) goes to the scratch. The arithmetic of a partial is fixed:
 *     per chunk one fmaf chain over its columns in order from 0 (the squares: fmaf(x, x, a), float), the
 *     chunk sums added in order from 0 (the squares' in double).
 *     Few tokens (hc_mix_small): a block per (super-chunk, token), a thread per (row, chunk), the fn
 *     slice read straight from memory; pre with 2 .. 31 tokens (hc_mix_tok, F32 fn): the same with a block
 *     per (super-chunk, 4 tokens), each fn slice loaded once for the 4. Many tokens (hc_mix_big): a block per
 *     (super-chunk, 128 tokens), fn and token chunks staged in shared memory (cp.async, two stages), each
 *     lane 2 tokens x RPL rows with the same chains. All give the same bits, so a token's result does not
 *     depend on T.
 *  2. hc_finish_kernel, a block per token: every load issued at once after the wait (the partials, and for
 *     M = 4 and up to a wave of tokens the token's X into registers; base, scale and the norm weight before
 *     it; more tokens: x through shared memory, more blocks per SM, the same bits), the super-chunk
 *     partials summed in order, r, the mixes; a ninth warp runs the M x M Sinkhorn while eight warps form
 *     x = sum_j pre[j] X[j] and, with a norm weight, the RMSNorm that follows it in the same steps as
 *     dsv4_cuda_rmsnorm (bitwise the same as running it after). The Sinkhorn (M <= 5): a lane per entry
 *     of C, each entry through the same float operations in the same order as dsv4_hc_post_comb
 *     (src/cpu/hc_split.h, the twin's code), row and column sums gathered by shuffles and added in index
 *     order, so the bits equal that code's on one thread (checked in test_kernels with
 *     dsv4_cuda_hc_test_flags). Likewise pre, a thread per stream.
 * Launches carry the programmatic-dependent-launch attribute: each kernel lets the next one launch at once,
 * loads what does not depend on earlier kernels (the fn chunk), then waits in griddepcontrol.wait. */
#include "common.cuh"
#include "cuda_model.h"
#include "../cpu/hc_split.h"

#define HC_MAXM 16
#define HC_MAXR ((2 + HC_MAXM) * HC_MAXM)
#define HC_CH 64              /* columns per chunk (one fmaf chain) */
#define HC_G 4                /* chunks per super-chunk */
#define HC_SC (HC_CH * HC_G)  /* columns per super-chunk (one scratch partial) */
#define HC_BIG_T 32           /* from this many tokens on, hc_mix_big (when the shapes allow it) */
#define HC_TT 128             /* hc_mix_big: tokens per block */
#define HC_LD (HC_CH + 4)     /* hc_mix_big: shared row stride (floats) */
#define HC_BR 24              /* hc_mix_big: rows staged (4 row groups x RPL <= 24) */
#define HC_STAGE ((HC_TT + HC_BR) * HC_LD)
#define HC_TGROUP 32768       /* tokens per launch pair */

static inline int hc_nsc(int K) { return (K + HC_SC - 1) / HC_SC; }

extern "C" {
int dsv4_cuda_hc_test_flags; /* cuda_backend.h: test hooks */
}

extern "C" size_t dsv4_cuda_hc_scratch_bytes(int T, int M, int D) {
    if (T <= 0 || M <= 0 || D <= 0) return 0;
    const size_t n = (size_t)T * hc_nsc(M * D), nr = (size_t)(2 + M) * M;
    return ((n * nr * sizeof(float) + 15) & ~(size_t)15) + n * sizeof(double);
}

/* ---- 1. partial mixes ---- */

/* one chunk's chain: fmaf(w[k], x[k], a) for k = 0 .. HC_CH - 1, from a = 0 */
__device__ __forceinline__ float hc_chain(const float4 *wv, const float *x) {
    float a = 0;
#pragma unroll
    for (int q = 0; q < HC_CH / 4; q++) {
        a = fmaf(wv[q].x, x[4 * q + 0], a);
        a = fmaf(wv[q].y, x[4 * q + 1], a);
        a = fmaf(wv[q].z, x[4 * q + 2], a);
        a = fmaf(wv[q].w, x[4 * q + 3], a);
    }
    return a;
}

/* grid (nsc, T), 128 threads: task (chunk g, row r) for r < nr, (g, nr) the chunk's sum of squares. Fast path
 * (F32 fn, a full super-chunk, (nr + 1) * HC_G <= 128): a task per thread, its fn chunk loaded before the token's. */
__global__ void __launch_bounds__(128) hc_mix_small(const float *__restrict__ X, int K, dsv4_cuda_weight fn, int nr,
                                                    int nsc, float *__restrict__ part, double *__restrict__ ssp) {
    __shared__ __align__(16) float xs[HC_SC];
    __shared__ float ps[HC_G][HC_MAXR];
    __shared__ float pss[HC_G];
    const int sc = blockIdx.x, t = blockIdx.y, c0 = sc * HC_SC, n = K - c0 < HC_SC ? K - c0 : HC_SC, tid = threadIdx.x;
    const float *Xt = X + (int64_t)t * K;
    const int fast = fn.fmt == DSV4_WF_F32 && (fn.cols & 3) == 0 && ((uintptr_t)fn.data & 15) == 0 && n == HC_SC &&
                     (nr + 1) * HC_G <= 128 && ((uintptr_t)Xt & 15) == 0;
    dev_pdl_trigger();
    if (fast) {
        const int g = tid / (nr + 1), r = tid % (nr + 1), cb = g * HC_CH;
        float4 wv[HC_CH / 4];
        if (g < HC_G && r < nr) {
            const float4 *w4 = (const float4 *)((const float *)fn.data + ((int64_t)fn.row0 + r) * fn.cols + c0 + cb);
#pragma unroll
            for (int q = 0; q < HC_CH / 4; q++) wv[q] = w4[q];
        }
        dev_pdl_wait(); /* X is the previous kernel's */
        if (tid < HC_SC / 4) ((float4 *)xs)[tid] = ((const float4 *)(Xt + c0))[tid];
        __syncthreads();
        if (g < HC_G && r < nr) ps[g][r] = hc_chain(wv, xs + cb);
        else if (g < HC_G) {
            float a = 0;
#pragma unroll 16
            for (int k = 0; k < HC_CH; k++) a = fmaf(xs[cb + k], xs[cb + k], a);
            pss[g] = a;
        }
    } else {
        dev_pdl_wait();
        for (int i = tid; i < HC_SC; i += 128) xs[i] = i < n ? Xt[c0 + i] : 0.0f;
        __syncthreads();
        for (int task = tid; task < (nr + 1) * HC_G; task += 128) {
            const int g = task / (nr + 1), r = task % (nr + 1), cb = g * HC_CH;
            const int len = n - cb < 0 ? 0 : n - cb < HC_CH ? n - cb : HC_CH;
            if (r == nr) {
                float a = 0;
                for (int k = 0; k < len; k++) a = fmaf(xs[cb + k], xs[cb + k], a);
                pss[g] = a;
                continue;
            }
            float a = 0;
            for (int k = 0; k < len; k++) a = fmaf(dev_weight_at(fn, r, c0 + cb + k), xs[cb + k], a);
            ps[g][r] = a;
        }
    }
    __syncthreads();
    for (int r = tid; r <= nr; r += 128) {
        if (r < nr) {
            float s = 0;
            for (int g = 0; g < HC_G; g++) s += ps[g][r];
            part[((int64_t)t * nsc + sc) * nr + r] = s;
        } else {
            double s = 0;
            for (int g = 0; g < HC_G; g++) s += (double)pss[g];
            ssp[(int64_t)t * nsc + sc] = s;
        }
    }
}

/* hc_tok_mix's fn chunk of thread (chunk g, row r) = (tid / (nr + 1), tid % (nr + 1)): row r's HC_CH columns at
 * c0 + g * HC_CH (threads past the rows load nothing), before the grid dependency wait (fn is a weight) */
__device__ __forceinline__ void hc_tok_fn(const float *__restrict__ W, int K, int c0, int g, int r, int nr,
                                          float4 (&wv)[HC_CH / 4]) {
    if (g < HC_G && r < nr) {
        const float4 *w4 = (const float4 *)(W + (int64_t)r * K + c0 + g * HC_CH);
#pragma unroll
        for (int q = 0; q < HC_CH / 4; q++) wv[q] = w4[q];
    }
}

/* hc_mix_tok's second half, for the TB tokens staged in xs (after the barrier that ends the staging): thread (chunk g,
 * row r) its fmaf chain over the chunk against each token (wv: its fn chunk; r == nr: the chunk's sum of squares), then
 * per (token, row) the chunk sums added in order into the super-chunk's partial (the squares' in double) */
template <int TB>
__device__ __forceinline__ void hc_tok_mix(const float (*xs)[HC_SC], const float4 (&wv)[HC_CH / 4], int nr, int nsc, int sc,
                                           int t0, int nt, float *__restrict__ part, double *__restrict__ ssp) {
    __shared__ float ps[TB][HC_G][32];
    __shared__ float pss[TB][HC_G];
    const int tid = threadIdx.x, g = tid / (nr + 1), r = tid % (nr + 1), cb = g * HC_CH;
    if (g < HC_G && r < nr) {
        float a[TB];
#pragma unroll
        for (int tk = 0; tk < TB; tk++) a[tk] = 0;
#pragma unroll
        for (int q = 0; q < HC_CH / 4; q++)
#pragma unroll
            for (int tk = 0; tk < TB; tk++) {
                const float4 xv = *(const float4 *)(xs[tk] + cb + 4 * q);
                a[tk] = fmaf(wv[q].x, xv.x, a[tk]);
                a[tk] = fmaf(wv[q].y, xv.y, a[tk]);
                a[tk] = fmaf(wv[q].z, xv.z, a[tk]);
                a[tk] = fmaf(wv[q].w, xv.w, a[tk]);
            }
#pragma unroll
        for (int tk = 0; tk < TB; tk++) ps[tk][g][r] = a[tk];
    } else if (g < HC_G) {
        float a[TB];
#pragma unroll
        for (int tk = 0; tk < TB; tk++) a[tk] = 0;
#pragma unroll 4
        for (int k = 0; k < HC_CH; k++)
#pragma unroll
            for (int tk = 0; tk < TB; tk++) a[tk] = fmaf(xs[tk][cb + k], xs[tk][cb + k], a[tk]);
#pragma unroll
        for (int tk = 0; tk < TB; tk++) pss[tk][g] = a[tk];
    }
    __syncthreads();
    for (int i = tid; i < nt * (nr + 1); i += 128) {
        const int tk = i / (nr + 1), rr = i % (nr + 1);
        if (rr < nr) {
            float s = 0;
            for (int gg = 0; gg < HC_G; gg++) s += ps[tk][gg][rr];
            part[((int64_t)(t0 + tk) * nsc + sc) * nr + rr] = s;
        } else {
            double s = 0;
            for (int gg = 0; gg < HC_G; gg++) s += (double)pss[tk][gg];
            ssp[(int64_t)(t0 + tk) * nsc + sc] = s;
        }
    }
}

/* grid (nsc, ceil(T / TB)), 128 threads; F32 fn, K % HC_SC == 0, (nr + 1) * HC_G <= 128, 16-byte aligned X and fn:
 * hc_mix_small's fast path for up to TB tokens per block, each thread's fn chunk loaded once for all of them (the
 * same chains per token, so the same bits) */
template <int TB>
__global__ void __launch_bounds__(128) hc_mix_tok(const float *__restrict__ X, int T, int K, const float *__restrict__ W,
                                                  int nr, int nsc, float *__restrict__ part, double *__restrict__ ssp) {
    __shared__ __align__(16) float xs[TB][HC_SC];
    const int sc = blockIdx.x, t0 = blockIdx.y * TB, c0 = sc * HC_SC, tid = threadIdx.x;
    const int nt = T - t0 < TB ? T - t0 : TB;
    float4 wv[HC_CH / 4];
    dev_pdl_trigger();
    hc_tok_fn(W, K, c0, tid / (nr + 1), tid % (nr + 1), nr, wv);
    dev_pdl_wait(); /* X is the previous kernel's */
#pragma unroll
    for (int u = 0; u < TB * HC_SC / 4 / 128; u++) {
        const int i = tid + 128 * u, tk = i / (HC_SC / 4), q = i % (HC_SC / 4);
        ((float4 *)xs[tk])[q] = tk < nt ? ((const float4 *)(X + (int64_t)(t0 + tk) * K + c0))[q] : make_float4(0, 0, 0, 0);
    }
    __syncthreads();
    hc_tok_mix<TB>(xs, wv, nr, nsc, sc, t0, nt, part, ssp);
}

/* The previous sub-block's post and this one's mixes in one kernel (decode chain: one launch less a sub-block):
 * hc_mix_tok<TB> (TB 1: hc_mix_small's fast path) on the streams the post writes. Same grid and conditions as
 * hc_mix_tok, and D % HC_SC == 0 (a super-chunk in one stream j). Out of place: the block reads the old values of
 * every stream from Xin at its columns and writes stream j's new ones to Xout (Xin != Xout: other blocks still read
 * the old ones), X(j, d) = hc_post4_kernel's value (the same fmul / fmaf chain), kept in shared memory for the mixes.
 * So Xout, the partials and the squares' partials are bitwise hc_post's X then the mixing kernel's. */
/* values d .. d+3 of token t's post input: f, or the routed experts' rows ys by the token's slots (in order, to the
 * first empty one) then the shared expert's, moe_combine_kernel's additions on each value */
__device__ __forceinline__ float4 hc_fq(const dsv4_cuda_hc_f &src, int t, int D, int d) {
    if (!src.ys) return *(const float4 *)(src.f + (int64_t)t * D + d);
    float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    const float4 sh = src.shared ? *(const float4 *)(src.shared + (int64_t)t * D + d) : acc;
    const int *ts = src.tslot + (int64_t)t * src.K;
    for (int k0 = 0; k0 < src.K; k0 += 8) { /* as moe_combine_kernel: 8 slots, then their rows, all in flight */
        int s[8];
        float4 v[8];
        bool live = true;
#pragma unroll
        for (int u = 0; u < 8; u++) s[u] = k0 + u < src.K ? ts[k0 + u] : -1;
#pragma unroll
        for (int u = 0; u < 8; u++) {
            live = live && s[u] >= 0;
            v[u] = live ? *(const float4 *)(src.ys + (int64_t)s[u] * D + d) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        }
        bool add = true;
#pragma unroll
        for (int u = 0; u < 8; u++) {
            add = add && s[u] >= 0;
            if (add)
                acc.x = __fadd_rn(acc.x, v[u].x), acc.y = __fadd_rn(acc.y, v[u].y), acc.z = __fadd_rn(acc.z, v[u].z),
                acc.w = __fadd_rn(acc.w, v[u].w);
        }
        if (!live) break;
    }
    if (src.shared) acc.x = __fadd_rn(acc.x, sh.x), acc.y = __fadd_rn(acc.y, sh.y), acc.z = __fadd_rn(acc.z, sh.z), acc.w = __fadd_rn(acc.w, sh.w);
    return acc;
}

template <int TB>
__global__ void __launch_bounds__(128) hc_post_mix(const __grid_constant__ dsv4_cuda_hc_f src, const float *__restrict__ Xin,
                                                   float *__restrict__ Xout, int T, int M, int D, const float *__restrict__ post,
                                                   const float *__restrict__ comb, const float *__restrict__ W, int nr,
                                                   int nsc, float *__restrict__ part, double *__restrict__ ssp) {
    __shared__ __align__(16) float xs[TB][HC_SC];
    const int K = M * D, sc = blockIdx.x, t0 = blockIdx.y * TB, c0 = sc * HC_SC, tid = threadIdx.x;
    const int j = c0 / D, d0 = c0 - j * D;
    const int nt = T - t0 < TB ? T - t0 : TB;
    float4 wv[HC_CH / 4];
    dev_pdl_trigger();
    hc_tok_fn(W, K, c0, tid / (nr + 1), tid % (nr + 1), nr, wv);
    dev_pdl_wait(); /* f, Xin, post and comb are earlier kernels' */
    /* the post of stream j at the block's columns: item (token, quad) */
    for (int i = tid; i < nt * (HC_SC / 4); i += 128) {
        const int tk = i / (HC_SC / 4), q = i % (HC_SC / 4), t = t0 + tk, d = d0 + 4 * q;
        const float *Xt = Xin + (int64_t)t * K, *C = comb + (int64_t)t * M * M;
        const float p = post[(int64_t)t * M + j];
        const float4 fd = hc_fq(src, t, D, d);
        float4 acc = make_float4(__fmul_rn(p, fd.x), __fmul_rn(p, fd.y), __fmul_rn(p, fd.z), __fmul_rn(p, fd.w));
        for (int i2 = 0; i2 < M; i2++) {
            const float4 o = *(const float4 *)(Xt + (int64_t)i2 * D + d);
            const float c = C[i2 * M + j];
            acc.x = fmaf(c, o.x, acc.x), acc.y = fmaf(c, o.y, acc.y), acc.z = fmaf(c, o.z, acc.z), acc.w = fmaf(c, o.w, acc.w);
        }
        *(float4 *)(xs[tk] + 4 * q) = acc;
        *(float4 *)(Xout + (int64_t)t * K + c0 + 4 * q) = acc;
    }
    for (int i = nt * (HC_SC / 4) + tid; i < TB * (HC_SC / 4); i += 128) /* tokens past T: zeros, as hc_mix_tok */
        *(float4 *)(xs[i / (HC_SC / 4)] + 4 * (i % (HC_SC / 4))) = make_float4(0, 0, 0, 0);
    __syncthreads();
    hc_tok_mix<TB>(xs, wv, nr, nsc, sc, t0, nt, part, ssp);
}

__device__ __forceinline__ void cp_async16(void *smem, const void *gmem) {
    unsigned s = (unsigned)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(s), "l"(gmem));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N> __device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N)); }

/* One staged chunk's mixes for NTOK tokens (token u's HC_CH columns at xa + 8 u HC_LD) x RPL rows (row i at
 * wr + i HC_LD): per (token, row) one fmaf chain over the chunk's columns in order, added into s; the squares' chain of
 * token min(rg, NTOK - 1) added into sss in double. hc_mix_big's and hc_post_mix_big's arithmetic (QU: the column
 * loop's unrolling). */
template <int NTOK, int RPL, int QU>
__device__ __forceinline__ void hc_chunk_mix(const float *xa, const float *wr, int rg, float (&s)[NTOK][RPL], double &sss) {
    float acc[NTOK][RPL];
#pragma unroll
    for (int u = 0; u < NTOK; u++)
#pragma unroll
        for (int i = 0; i < RPL; i++) acc[u][i] = 0;
    float ssa = 0;
#pragma unroll QU
    for (int q = 0; q < HC_CH / 4; q++) {
        float4 x[NTOK], wv[RPL];
#pragma unroll
        for (int u = 0; u < NTOK; u++) x[u] = *(const float4 *)(xa + 8 * u * HC_LD + 4 * q);
#pragma unroll
        for (int i = 0; i < RPL; i++) wv[i] = *(const float4 *)(wr + i * HC_LD + 4 * q);
#pragma unroll
        for (int i = 0; i < RPL; i++) {
#pragma unroll
            for (int u = 0; u < NTOK; u++) acc[u][i] = fmaf(wv[i].x, x[u].x, acc[u][i]);
#pragma unroll
            for (int u = 0; u < NTOK; u++) acc[u][i] = fmaf(wv[i].y, x[u].y, acc[u][i]);
#pragma unroll
            for (int u = 0; u < NTOK; u++) acc[u][i] = fmaf(wv[i].z, x[u].z, acc[u][i]);
#pragma unroll
            for (int u = 0; u < NTOK; u++) acc[u][i] = fmaf(wv[i].w, x[u].w, acc[u][i]);
        }
        float4 v = x[NTOK - 1]; /* (selected without a dynamic index: registers) */
#pragma unroll
        for (int u = 0; u < NTOK - 1; u++)
            if (rg == u) v = x[u];
        ssa = fmaf(v.x, v.x, ssa);
        ssa = fmaf(v.y, v.y, ssa);
        ssa = fmaf(v.z, v.z, ssa);
        ssa = fmaf(v.w, v.w, ssa);
    }
#pragma unroll
    for (int u = 0; u < NTOK; u++)
#pragma unroll
        for (int i = 0; i < RPL; i++) s[u][i] += acc[u][i];
    sss += (double)ssa;
}

/* grid (nsc, ceil(T / HC_TT)), 256 threads; F32 fn, K % HC_SC == 0, nr <= 4 * RPL, 16-byte aligned rows.
 * Warp w: tokens 16w .. 16w + 15 of the block; lane (tg = lane / 4, rg = lane % 4): tokens tg, tg + 8 (of the
 * warp's), rows rg * RPL .. + RPL - 1; the sums of squares on rg 0 (token tg) and rg 1 (token tg + 8). */
template <int RPL>
__global__ void __launch_bounds__(256, 2) hc_mix_big(const float *__restrict__ X, int T, int K, const float *__restrict__ W,
                                                     int nr, int nsc, float *__restrict__ part, double *__restrict__ ssp) {
    extern __shared__ float4 hc_sm4[];
    float *sm = (float *)hc_sm4;
    const int sc = blockIdx.x, t0 = blockIdx.y * HC_TT, tid = threadIdx.x;
    const int warp = tid >> 5, lane = tid & 31, tg = lane >> 2, rg = lane & 3;
    dev_pdl_trigger();
    dev_pdl_wait();
    auto load = [&](int g, int st) {
        float *xs = sm + st * HC_STAGE, *ws = xs + HC_TT * HC_LD;
        const int64_t c = (int64_t)sc * HC_SC + g * HC_CH;
        for (int f = tid; f < HC_TT * (HC_CH / 4); f += 256) {
            const int tk = f / (HC_CH / 4), q = f % (HC_CH / 4);
            float *dst = xs + tk * HC_LD + 4 * q;
            if (t0 + tk < T) cp_async16(dst, X + (int64_t)(t0 + tk) * K + c + 4 * q);
            else *(float4 *)dst = make_float4(0, 0, 0, 0);
        }
        for (int f = tid; f < HC_BR * (HC_CH / 4); f += 256) {
            const int r = f / (HC_CH / 4), q = f % (HC_CH / 4);
            float *dst = ws + r * HC_LD + 4 * q;
            if (r < nr) cp_async16(dst, W + (int64_t)r * K + c + 4 * q);
            else *(float4 *)dst = make_float4(0, 0, 0, 0);
        }
        cp_async_commit();
    };
    float s[2][RPL];
#pragma unroll
    for (int j = 0; j < 2; j++)
#pragma unroll
        for (int i = 0; i < RPL; i++) s[j][i] = 0;
    double sss = 0;
    load(0, 0);
    for (int g = 0; g < HC_G; g++) {
        if (g + 1 < HC_G) {
            load(g + 1, (g + 1) & 1);
            cp_async_wait<1>();
        } else {
            cp_async_wait<0>();
        }
        __syncthreads();
        const float *xs = sm + (g & 1) * HC_STAGE, *ws = xs + HC_TT * HC_LD;
        /* tokens tg and tg + 8 of the warp's 16; the squares: rg 0 token tg, rg 1 token tg + 8 (rg 2, 3 unused) */
        hc_chunk_mix<2, RPL, 4>(xs + (warp * 16 + tg) * HC_LD, ws + rg * RPL * HC_LD, rg, s, sss);
        __syncthreads();
    }
#pragma unroll
    for (int j = 0; j < 2; j++) {
        const int t = t0 + warp * 16 + tg + 8 * j;
        if (t >= T) continue;
#pragma unroll
        for (int i = 0; i < RPL; i++)
            if (rg * RPL + i < nr) part[((int64_t)t * nsc + sc) * nr + rg * RPL + i] = s[j][i];
        if (rg == j) ssp[(int64_t)t * nsc + sc] = sss;
    }
}

/* stream k's new values at 4 columns of a token: post[k] f + sum_j comb[j][k] old_j, the post's chain (the product,
 * then one fmaf a stream j in order; Ck = comb + k, rows M apart); old[j] for j < M */
template <int MAXM>
__device__ __forceinline__ float4 hc_post_q(float p, float4 fd, const float *Ck, int M, const float4 (&old)[MAXM]) {
    float4 acc = make_float4(__fmul_rn(p, fd.x), __fmul_rn(p, fd.y), __fmul_rn(p, fd.z), __fmul_rn(p, fd.w));
#pragma unroll
    for (int j = 0; j < MAXM; j++)
        if (j < M) {
            const float c = Ck[j * M];
            acc.x = fmaf(c, old[j].x, acc.x), acc.y = fmaf(c, old[j].y, acc.y);
            acc.z = fmaf(c, old[j].z, acc.z), acc.w = fmaf(c, old[j].w, acc.w);
        }
    return acc;
}

/* The previous sub-block's post and this one's mixes for many tokens (prefill passes; DSV4_HC_POST_MIX_BIG=0: the post,
 * with the experts' combine before it, then hc_mix_big): M = 4 streams, D % HC_SC == 0, nr <= HC_BR, F32 fn. Block
 * (column super-chunk b of a stream, HC_PT tokens) covers columns d0 = b HC_SC .. + HC_SC of all four streams, i.e.
 * super-chunks sc_j = j D / HC_SC + b, one chunk of HC_CH columns at a time: (1) each (token, quad) item's post for the
 * four streams (hc_post4_kernel's fmul / fmaf chain on hc_fq's input: the combine's additions when it takes the experts'
 * rows), written to Xout and staged; (2) warp w the mixes of stream w / 2 for tokens 32 (w & 1) .., lane (tg, rg) tokens
 * tg + 8 u (u < 4) x rows rg HC_RPL ..: hc_mix_big's chains (a chunk's fmaf chain over its columns in order, the chunk
 * sums added in order; the squares' chain by rg = u, in double across chunks). So Xout, the partials and the squares are
 * bitwise the post's X then hc_mix_big's, with X read once instead of twice (and f neither written nor read).
 * In place (Xin == Xout) too: an item's thread reads its four old values before it writes the new ones. */
#define HC_PT 64  /* tokens a block */
#define HC_RPL 6  /* rows a lane (4 row groups) */
#define HC_PM_SMEM ((4 * HC_PT + 4 * HC_BR) * HC_LD * 4)
__global__ void __launch_bounds__(256, 2) hc_post_mix_big(const __grid_constant__ dsv4_cuda_hc_f src, const float *Xin,
                                                          float *Xout, int tg0, int T, int D, const float *__restrict__ post,
                                                          const float *__restrict__ comb, const float *__restrict__ W, int nr,
                                                          int nsc, float *__restrict__ part, double *__restrict__ ssp) {
    extern __shared__ float4 hc_sm4[];
    float *xs = (float *)hc_sm4, *ws = xs + 4 * HC_PT * HC_LD; /* [stream][token][HC_LD], [stream][row][HC_LD] */
    const int K = 4 * D, b = blockIdx.x, t0 = blockIdx.y * HC_PT, tid = threadIdx.x, d0 = b * HC_SC;
    const int warp = tid >> 5, lane = tid & 31, tg = lane >> 2, rg = lane & 3, sj = warp >> 1, tb = (warp & 1) * 32;
    dev_pdl_trigger();
    dev_pdl_wait();
    float s[4][HC_RPL];
#pragma unroll
    for (int u = 0; u < 4; u++)
#pragma unroll
        for (int i = 0; i < HC_RPL; i++) s[u][i] = 0;
    double sss = 0;
    for (int g = 0; g < HC_G; g++) {
        const int dc = d0 + g * HC_CH;
        if (g) __syncthreads(); /* the previous chunk's mixes read the stage */
        for (int f = tid; f < 4 * HC_BR * (HC_CH / 4); f += 256) { /* fn's columns of the four super-chunks */
            const int j = f / (HC_BR * (HC_CH / 4)), r = (f / (HC_CH / 4)) % HC_BR, q = f % (HC_CH / 4);
            *(float4 *)(ws + (j * HC_BR + r) * HC_LD + 4 * q) =
                r < nr ? *(const float4 *)(W + (int64_t)r * K + (int64_t)j * D + dc + 4 * q) : make_float4(0, 0, 0, 0);
        }
        for (int i = tid; i < HC_PT * (HC_CH / 4); i += 256) { /* the post: item (token, quad) */
            const int tk = i / (HC_CH / 4), q = i % (HC_CH / 4), t = t0 + tk, d = dc + 4 * q;
            const int64_t tt = (int64_t)tg0 + t; /* the pass's token (the group's t: its partials) */
            if (t >= T) {
#pragma unroll
                for (int j = 0; j < 4; j++) *(float4 *)(xs + (j * HC_PT + tk) * HC_LD + 4 * q) = make_float4(0, 0, 0, 0);
                continue;
            }
            const float *Xt = Xin + tt * K, *C = comb + tt * 16;
            float4 old[4];
#pragma unroll
            for (int j = 0; j < 4; j++) old[j] = *(const float4 *)(Xt + (int64_t)j * D + d);
            const float4 fd = hc_fq(src, (int)tt, D, d);
#pragma unroll
            for (int k = 0; k < 4; k++) {
                const float4 acc = hc_post_q(post[tt * 4 + k], fd, C + k, 4, old);
                *(float4 *)(Xout + tt * K + (int64_t)k * D + d) = acc;
                *(float4 *)(xs + (k * HC_PT + tk) * HC_LD + 4 * q) = acc;
            }
        }
        __syncthreads();
        /* tokens tg + 8 u of the warp's 32; the squares: rg u, token tg + 8 u */
        hc_chunk_mix<4, HC_RPL, 2>(xs + (sj * HC_PT + tb + tg) * HC_LD, ws + (sj * HC_BR + rg * HC_RPL) * HC_LD, rg, s, sss);
    }
    const int sc = sj * (D / HC_SC) + b;
#pragma unroll
    for (int u = 0; u < 4; u++) {
        const int t = t0 + tb + tg + 8 * u;
        if (t >= T) continue;
#pragma unroll
        for (int i = 0; i < HC_RPL; i++)
            if (rg * HC_RPL + i < nr) part[((int64_t)t * nsc + sc) * nr + rg * HC_RPL + i] = s[u][i];
        if (rg == u) ssp[(int64_t)t * nsc + sc] = sss;
    }
}

/* ---- 2. finish: a block per token, warps 0-3 the weighted sum (+ RMSNorm), warp 4 the Sinkhorn ---- */

__device__ __forceinline__ void bar_x() { asm volatile("bar.sync 1, 256;\n" ::: "memory"); } /* the HC_XT threads */

template <int MM>
__device__ __forceinline__ void hc_post_comb_out(const float *mix, int M, const float *scale, const float *base, int iters,
                                                 float hc_eps, float *post, float *comb) {
    float p[MM], C[MM * MM];
    dsv4_hc_post_comb(mix, M, scale, base, iters, hc_eps, p, C);
    for (int j = 0; j < M; j++) post[j] = p[j];
    for (int j = 0; j < M * M; j++) comb[j] = C[j];
}

/* dsv4_hc_post_comb for M = MM <= 5 on one warp, lane e = j * MM + k holding C[j][k]: the same operations per
 * entry, sums in index order (lanes past MM * MM shadow entry 0) */
template <int MM>
__device__ __forceinline__ void hc_post_comb_warp(const float *mix, const float *scale, const float *base, int iters,
                                                  float hc_eps, float *post, float *comb, int lane) {
    const int e = lane < MM * MM ? lane : 0, j = e / MM, k = e % MM;
    if (lane < MM) post[lane] = 2.0f * dsv4_hc_sigmoid(mix[MM + lane] * scale[1] + base[MM + lane]);
    float c = mix[2 * MM + e] * scale[2] + base[2 * MM + e];
    float v[MM];
#pragma unroll
    for (int q = 0; q < MM; q++) v[q] = __shfl_sync(0xffffffffu, c, j * MM + q);
    float mx = -INFINITY, s = 0;
#pragma unroll
    for (int q = 0; q < MM; q++) mx = fmaxf(mx, v[q]);
#pragma unroll
    for (int q = 0; q < MM; q++) s += (v[q] = expf(v[q] - mx));
    c = expf(c - mx) / s + hc_eps;
    for (int it = 0; it < iters; it++) {
        if (it > 0) {
#pragma unroll
            for (int q = 0; q < MM; q++) v[q] = __shfl_sync(0xffffffffu, c, j * MM + q);
            s = 0;
#pragma unroll
            for (int q = 0; q < MM; q++) s += v[q];
            c /= (s + hc_eps);
        }
#pragma unroll
        for (int q = 0; q < MM; q++) v[q] = __shfl_sync(0xffffffffu, c, q * MM + k);
        s = 0;
#pragma unroll
        for (int q = 0; q < MM; q++) s += v[q];
        c /= (s + hc_eps);
    }
    if (lane < MM * MM) comb[lane] = c;
}

/* the finishing kernel: HC_XT threads form x (and the norm: RMS_NT, common.cuh's order), a warp more runs the
 * Sinkhorn (pre only). MM > 0 (M = MM, 16-byte rows of at most HC_XT * XQ quads): each thread's X quads of every
 * stream and its norm weights come into registers at once; else x goes through memory as in any shape. */
#define HC_XT RMS_NT

template <int HEAD, int MM, int XQ>
__global__ void __launch_bounds__(HEAD ? HC_XT : HC_XT + 32, MM > 0 ? 1 : 4)
    hc_finish_kernel(const float *__restrict__ X, int M, int D, int nr, int nsc, const float *__restrict__ part,
                     const double *__restrict__ ssp, const float *scale, const float *base, int iters, float norm_eps,
                     float hc_eps, const float *__restrict__ nw, int stage, int serial, int vec, float *__restrict__ x,
                     float *post, float *comb, float *__restrict__ mixo) {
    constexpr int NT = HEAD ? HC_XT : HC_XT + 32;
    extern __shared__ float4 hc_xs4[]; /* [nsc] double, [nsc * nr] float (when staged), then x [D] (MM 0 with nw) */
    __shared__ float mix[HC_MAXR], bs[HC_MAXR], sc[3];
    __shared__ float pre[HC_MAXM];
    __shared__ double red[HC_XT / 32];
    const int t = blockIdx.x, tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, MD = M * D, np = nsc * nr, D4 = D >> 2;
    const float *pt = part + (int64_t)t * np;
    const double *st = ssp + (int64_t)t * nsc;
    double *sd = (double *)hc_xs4;
    float *sp = (float *)(sd + nsc), *xs = (float *)hc_xs4 + (stage ? ((nsc * (2 + nr) + 3) & ~3) : 0);
    const float4 *X4 = (const float4 *)(X + (int64_t)t * MD);
    dev_pdl_trigger();
    /* before the wait, what no earlier kernel writes: base, scale, the norm weights */
    for (int i = tid; i < nr; i += NT) bs[i] = base[i];
    if (tid < (HEAD ? 1 : 3)) sc[tid] = scale[tid];
    float4 wr[MM > 0 ? XQ : 1], xr[MM > 0 ? XQ * MM : 1];
    if (MM > 0 && nw && tid < HC_XT) {
#pragma unroll
        for (int k = 0; k < XQ; k++)
            if (tid + k * HC_XT < D4) wr[k] = ((const float4 *)nw)[tid + k * HC_XT];
    }
    dev_pdl_wait(); /* the partials are the previous kernel's */
    if (MM > 0 && tid < HC_XT) { /* the token's X, all loads in flight with the partials' */
#pragma unroll
        for (int k = 0; k < XQ; k++)
#pragma unroll
            for (int j = 0; j < MM; j++)
                if (tid + k * HC_XT < D4) xr[k * MM + j] = X4[(int64_t)j * D4 + tid + k * HC_XT];
    }
    if (stage) { /* every load in flight at once, then the fixed-order sums from shared memory */
        for (int i0 = tid; i0 < np; i0 += NT * 8) {
            float v[8];
#pragma unroll
            for (int u = 0; u < 8; u++) v[u] = i0 + NT * u < np ? pt[i0 + NT * u] : 0.0f;
#pragma unroll
            for (int u = 0; u < 8; u++)
                if (i0 + NT * u < np) sp[i0 + NT * u] = v[u];
        }
        for (int i = tid; i < nsc; i += NT) sd[i] = st[i];
        pt = sp, st = sd;
    }
    __syncthreads();
    /* row r's mix: its partials summed in order, times r = 1 / rms (every such thread sums the squares' partials) */
    for (int r = tid; r < nr; r += NT) {
        float s = 0;
        double q = 0;
#pragma unroll 8
        for (int k = 0; k < nsc; k++) s += pt[k * nr + r], q += st[k];
        const float rs = 1.0f / sqrtf((float)(q / MD) + norm_eps), m = s * rs;
        mix[r] = m;
        if (mixo) mixo[(int64_t)t * nr + r] = m; /* post / comb later, by hc_comb_kernel */
        if (!serial && r < M) pre[r] = dsv4_hc_sigmoid(m * sc[0] + bs[r]) + hc_eps; /* dsv4_hc_pre_weights, a thread per stream */
    }
    __syncthreads();
    if (!HEAD && warp == HC_XT / 32) {
        if (mixo) return;
        float *pt_ = post + (int64_t)t * M, *ct = comb + (int64_t)t * M * M;
        if (!serial && M == 4) hc_post_comb_warp<4>(mix, sc, bs, iters, hc_eps, pt_, ct, lane);
        else if (!serial && M == 3) hc_post_comb_warp<3>(mix, sc, bs, iters, hc_eps, pt_, ct, lane);
        else if (!serial && M == 2) hc_post_comb_warp<2>(mix, sc, bs, iters, hc_eps, pt_, ct, lane);
        else if (lane == 0 && M == 4) hc_post_comb_out<4>(mix, 4, sc, bs, iters, hc_eps, pt_, ct);
        else if (lane == 0) hc_post_comb_out<HC_MAXM>(mix, M, sc, bs, iters, hc_eps, pt_, ct);
        return;
    }
    if (serial) {
        if (tid == 0) dsv4_hc_pre_weights(mix, M, sc[0], bs, hc_eps, pre);
        bar_x();
    }
    float *xt = x + (int64_t)t * D;
    double ss = 0;
    if constexpr (MM > 0) {
        float p[MM];
#pragma unroll
        for (int j = 0; j < MM; j++) p[j] = pre[j];
        float4 a[XQ];
#pragma unroll
        for (int k = 0; k < XQ; k++) {
            a[k] = make_float4(0, 0, 0, 0);
#pragma unroll
            for (int j = 0; j < MM; j++) {
                const float4 v = xr[k * MM + j];
                a[k].x = fmaf(p[j], v.x, a[k].x), a[k].y = fmaf(p[j], v.y, a[k].y);
                a[k].z = fmaf(p[j], v.z, a[k].z), a[k].w = fmaf(p[j], v.w, a[k].w);
            }
        }
        if (!nw) {
#pragma unroll
            for (int k = 0; k < XQ; k++)
                if (tid + k * HC_XT < D4) ((float4 *)xt)[tid + k * HC_XT] = a[k];
            return;
        }
        /* RMSNorm: rmsnorm_kernel's steps (norm_rope_quant.cu) */
#pragma unroll
        for (int k = 0; k < XQ; k++)
            if (tid + k * HC_XT < D4) ss = rms_sq4(ss, a[k]);
        ss = warp_sum_d(ss);
        if (lane == 0) red[warp] = ss;
        bar_x();
        ss = rms_sum8(red);
        const float rn = 1.0f / sqrtf((float)(ss / D) + norm_eps);
#pragma unroll
        for (int k = 0; k < XQ; k++) {
            if (tid + k * HC_XT >= D4) continue;
            const float4 v = a[k], w = wr[k];
            float4 o;
            o.x = __fmul_rn(w.x, __fmul_rn(v.x, rn)), o.y = __fmul_rn(w.y, __fmul_rn(v.y, rn));
            o.z = __fmul_rn(w.z, __fmul_rn(v.z, rn)), o.w = __fmul_rn(w.w, __fmul_rn(v.w, rn));
            ((float4 *)xt)[tid + k * HC_XT] = o;
        }
    } else {
        float *dst = nw ? xs : xt;
        if (vec) {
#pragma unroll 4
            for (int q = tid; q < D4; q += HC_XT) {
                float4 a = make_float4(0, 0, 0, 0);
                for (int j = 0; j < M; j++) {
                    const float4 v = X4[(int64_t)j * D4 + q];
                    const float p = pre[j];
                    a.x = fmaf(p, v.x, a.x), a.y = fmaf(p, v.y, a.y), a.z = fmaf(p, v.z, a.z), a.w = fmaf(p, v.w, a.w);
                }
                ((float4 *)dst)[q] = a;
            }
        } else {
            const float *Xt = X + (int64_t)t * MD;
            for (int d = tid; d < D; d += HC_XT) {
                float a = 0;
                for (int j = 0; j < M; j++) a = fmaf(pre[j], Xt[(int64_t)j * D + d], a);
                dst[d] = a;
            }
        }
        if (!nw) return;
        /* RMSNorm: rmsnorm_kernel's steps (norm_rope_quant.cu) */
        bar_x();
        for (int g = tid; 4 * g < D; g += HC_XT)
#pragma unroll
            for (int u = 0; u < 4; u++)
                if (4 * g + u < D) ss += (double)xs[4 * g + u] * xs[4 * g + u];
        ss = warp_sum_d(ss);
        if (lane == 0) red[warp] = ss;
        bar_x();
        ss = rms_sum8(red);
        const float rn = 1.0f / sqrtf((float)(ss / D) + norm_eps);
        if (vec) {
            for (int q = tid; q < D4; q += HC_XT) {
                const float4 v = ((const float4 *)xs)[q], w = ((const float4 *)nw)[q];
                float4 o;
                o.x = __fmul_rn(w.x, __fmul_rn(v.x, rn)), o.y = __fmul_rn(w.y, __fmul_rn(v.y, rn));
                o.z = __fmul_rn(w.z, __fmul_rn(v.z, rn)), o.w = __fmul_rn(w.w, __fmul_rn(v.w, rn));
                ((float4 *)xt)[q] = o;
            }
        } else {
            for (int i = tid; i < D; i += HC_XT) xt[i] = __fmul_rn(nw[i], __fmul_rn(xs[i], rn));
        }
    }
}

/* post and comb of each token from the mixes the finishing kernel stored (mixo): its Sinkhorn warp's code, a warp a
 * token, on the same values, so the same bits; off the critical chain (forward_cuda.c runs it on a side stream) */
__global__ void __launch_bounds__(32) hc_comb_kernel(const float *__restrict__ mix, int M, int nr, const float *scale,
                                                     const float *base, int iters, float hc_eps, int serial, float *post,
                                                     float *comb) {
    dev_pdl_enter();
    const int t = blockIdx.x, lane = threadIdx.x;
    const float *mt = mix + (int64_t)t * nr;
    float *pt_ = post + (int64_t)t * M, *ct = comb + (int64_t)t * M * M;
    if (!serial && M == 4) hc_post_comb_warp<4>(mt, scale, base, iters, hc_eps, pt_, ct, lane);
    else if (!serial && M == 3) hc_post_comb_warp<3>(mt, scale, base, iters, hc_eps, pt_, ct, lane);
    else if (!serial && M == 2) hc_post_comb_warp<2>(mt, scale, base, iters, hc_eps, pt_, ct, lane);
    else if (lane == 0 && M == 4) hc_post_comb_out<4>(mt, 4, scale, base, iters, hc_eps, pt_, ct);
    else if (lane == 0) hc_post_comb_out<HC_MAXM>(mt, M, scale, base, iters, hc_eps, pt_, ct);
}

extern "C" int dsv4_cuda_hc_comb(const float *mix, int T, int M, const float *scale, const float *base, int iters, float hc_eps,
                                 float *post, float *comb, void *stream) {
    if (T < 0 || M <= 0 || M > HC_MAXM) return dsv4_cuda_fail("hc_comb: bad shape (T %d M %d)", T, M);
    if (!T) return 0;
    dev_launch(hc_comb_kernel, dim3(T), 32, 0, DSV4_STREAM(stream), mix, M, (2 + M) * M, scale, base, iters, hc_eps,
               dsv4_cuda_hc_test_flags & 1, post, comb);
    return dsv4_cuda_check_launch("hc_comb");
}

static int hc_check(const char *op, int T, int M, int D, const dsv4_cuda_weight *fn, int nr, const void *scratch) {
    if (T < 0 || M <= 0 || M > HC_MAXM || D <= 0 || !fn || fn->rows != nr || fn->cols != M * D)
        return dsv4_cuda_fail("%s: bad shape (T %d M %d D %d, fn %dx%d)", op, T, M, D, fn ? fn->rows : 0, fn ? fn->cols : 0);
    if (T && !scratch) return dsv4_cuda_fail("%s: no scratch", op);
    return 0;
}

/* 1: launch without the programmatic-dependent-launch attribute (refused once); flags & 2 (test hook) likewise */
static int hc_no_pdl;

template <typename... KArgs, typename... Args>
static int hc_launch(const char *op, void (*kern)(KArgs...), dim3 grid, int threads, size_t smem, cudaStream_t st,
                     int flags, Args... args) {
    cudaLaunchConfig_t cfg = {};
    cudaLaunchAttribute at[1];
    at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    at[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.gridDim = grid, cfg.blockDim = dim3(threads), cfg.dynamicSmemBytes = smem, cfg.stream = st;
    cfg.attrs = at, cfg.numAttrs = hc_no_pdl || (flags & 2) ? 0 : 1;
    cudaError_t e = cudaLaunchKernelEx(&cfg, kern, ((KArgs)args)...);
    if (e != cudaSuccess && cfg.numAttrs) { /* no programmatic dependent launch here: plain stream order */
        cudaGetLastError();
        hc_no_pdl = 1;
        cfg.numAttrs = 0;
        e = cudaLaunchKernelEx(&cfg, kern, ((KArgs)args)...);
    }
    if (e != cudaSuccess) {
        cudaGetLastError();
        return dsv4_cuda_fail("%s: launch: %s", op, cudaGetErrorString(e));
    }
    return dsv4_cuda_check_launch(op);
}

static int hc_post_run(const float *f, const float *Xin, float *X, int T, int M, int D, const float *post, const float *comb,
                       cudaStream_t st);

/* hc_post_mix_big where it applies (DSV4_HC_POST_MIX_BIG=0: the post then hc_mix_big; read once) */
static int hc_pmb = -1; /* dsv4_cuda_hc_post_mix_big */
#ifndef DSV4_HC_POST_MIX_BIG_DEFAULT
#define DSV4_HC_POST_MIX_BIG_DEFAULT 1 /* on since session 30 (bench/NOTES.md "Session 30") */
#endif
static int hc_pmb_on(void) {
    static int on = -1;
    if (hc_pmb >= 0) return hc_pmb;
    if (on < 0) on = dsv4_env_int("DSV4_HC_POST_MIX_BIG", DSV4_HC_POST_MIX_BIG_DEFAULT) != 0;
    return on;
}
extern "C" void dsv4_cuda_hc_post_mix_big(int on) { hc_pmb = on == 0 || on == 1 ? on : -1; }
static int hc_pmb_last; /* whether the last hc_post_pre took hc_post_mix_big (tests) */
extern "C" int dsv4_cuda_hc_post_mix_big_last(void) { return hc_pmb_last; }

/* the two kernels for tokens [0, T) of X; nrs: the scratch's row count ((2 + M) * M) */
template <int HEAD>
static int hc_run(const char *op, const float *X, int T, int M, int D, const dsv4_cuda_weight *fn, int nrs,
                  const float *scale, const float *base, int iters, float norm_eps, float hc_eps, const float *nw,
                  float *x, float *post, float *comb, void *scratch, cudaStream_t st, const dsv4_cuda_hc_f *pf = NULL,
                  const float *pXin = NULL, float *mixo = NULL) {
    const int K = M * D, nr = HEAD ? M : (2 + M) * M, nsc = hc_nsc(K);
    const size_t pbytes = ((size_t)T * nsc * nrs * sizeof(float) + 15) & ~(size_t)15;
    float *part = (float *)scratch;
    double *ssp = (double *)((char *)scratch + pbytes);
    const float *W = (const float *)fn->data + (int64_t)fn->row0 * fn->cols;
    const int big_ok = fn->fmt == DSV4_WF_F32 && K % HC_SC == 0 && nr <= HC_BR && ((uintptr_t)X & 15) == 0 &&
                       ((uintptr_t)W & 15) == 0;
    /* the finish kernel: MM 4 (registers, a block per SM) where it applies and the tokens fit the GPU in one wave (pre;
     * the head has no Sinkhorn to hide), else the general one (4 blocks per SM; the same bits); its shared memory: the
     * token's partials (when they fit), x (general kernel with nw, when it fits) */
    const int vec = (D & 3) == 0 && ((uintptr_t)X & 15) == 0 && ((uintptr_t)x & 15) == 0 && (!nw || ((uintptr_t)nw & 15) == 0);
    const int xq = !vec || M != 4 || (!HEAD && T > dsv4_cuda_dev.sm_count) ? 0
                   : D / 4 <= 4 * HC_XT                                    ? 4
                   : D / 4 <= 8 * HC_XT                                    ? 8
                                                                           : 0;
    const size_t psm = (size_t)nsc * (sizeof(double) + (size_t)nr * sizeof(float)), xsm = xq ? 0 : (size_t)D * sizeof(float);
    const int stage = psm <= 24 * 1024;
    const size_t psa = stage ? (psm + 15) & ~(size_t)15 : 0;
    const int fuse = nw && psa + xsm <= 48 * 1024;
    const size_t fsm = psa + (fuse ? xsm : 0);
    void (*fin)(const float *, int, int, int, int, const float *, const double *, const float *, const float *, int, float,
                float, const float *, int, int, int, float *, float *, float *, float *) =
        xq == 4 ? hc_finish_kernel<HEAD, 4, 4> : xq == 8 ? hc_finish_kernel<HEAD, 4, 8> : hc_finish_kernel<HEAD, 0, 1>;
    static int big_attr[2];
    const int flags = dsv4_cuda_hc_test_flags;
    /* few tokens: tokens per mixing block (1: hc_mix_small); the test hook's bits 4-6 pick another for timings */
    static const int tb_hook[5] = {0, 1, 2, 4, 8};
    const int th = (flags >> 4) & 7, tb = th && th < 5 ? tb_hook[th] : nr > 8 ? 4 : 1;
    /* pf: the previous sub-block's post first (f pf, the old streams pXin, the post and comb in post / comb), into X: in
     * the mixing kernel when it fits (few tokens, out of place, whole super-chunks per stream), else as its own launch */
    const int pm = pf && !HEAD && pXin != X && big_ok && T < HC_BIG_T && (nr + 1) * HC_G <= 128 && D % HC_SC == 0 &&
                   !((uintptr_t)pf->f & 15) && !((uintptr_t)pf->ys & 15) && !((uintptr_t)pf->shared & 15) &&
                   !((uintptr_t)pXin & 15) && !(flags & 8);
    /* many tokens: the post inside the mixing kernel (hc_post_mix_big), group by group */
    const int pmb = pf && !pm && !HEAD && M == 4 && big_ok && nr <= HC_BR && D % HC_SC == 0 && T >= HC_BIG_T && hc_pmb_on() &&
                    !((uintptr_t)pf->f & 15) && !((uintptr_t)pf->ys & 15) && !((uintptr_t)pf->shared & 15) &&
                    !((uintptr_t)pXin & 15) && !(flags & 8);
    hc_pmb_last = pmb;
    if (pmb) {
        static int pmb_attr;
        if (!pmb_attr) {
            if (cudaFuncSetAttribute((const void *)hc_post_mix_big, cudaFuncAttributeMaxDynamicSharedMemorySize, HC_PM_SMEM) !=
                cudaSuccess)
                return dsv4_cuda_fail("%s: shared memory attribute", op);
            pmb_attr = 1;
        }
    }
    if (pf && !pm && !pmb) { /* the experts' rows combined into f first, then the post on its own */
        if (pf->ys && dsv4_cuda_moe_combine(pf->ys, pf->tslot, T, pf->K, D, pf->shared, (float *)pf->f, st)) return -1;
        if (hc_post_run(pf->f, pXin, (float *)X, T, M, D, post, comb, st)) return -1;
    }
    for (int t0 = 0; t0 < T; t0 += HC_TGROUP) {
        const int n = T - t0 < HC_TGROUP ? T - t0 : HC_TGROUP;
        const float *Xg = X + (int64_t)t0 * K;
        if (pmb) {
            if (hc_launch(op, hc_post_mix_big, dim3(D / HC_SC, (n + HC_PT - 1) / HC_PT), 256, (size_t)HC_PM_SMEM, st, flags, *pf,
                          pXin, (float *)X, t0, n, D, (const float *)post, (const float *)comb, W, nr, nsc, part, ssp))
                return -1;
        } else if (pm) { /* n == T here */
            const int pb = n == 1 ? 1 : tb;
            void (*k)(const dsv4_cuda_hc_f, const float *, float *, int, int, int, const float *, const float *, const float *,
                      int, int, float *, double *) = pb == 1   ? hc_post_mix<1>
                                           : pb == 2 ? hc_post_mix<2>
                                           : pb == 4 ? hc_post_mix<4>
                                                     : hc_post_mix<8>;
            if (hc_launch(op, k, dim3(nsc, (n + pb - 1) / pb), 128, 0, st, flags, *pf, pXin, (float *)X, n, M, D,
                          (const float *)post, (const float *)comb, W, nr, nsc, part, ssp))
                return -1;
        } else if (big_ok && n >= HC_BIG_T) {
            const size_t smem = 2 * HC_STAGE * sizeof(float);
            const int k = nr <= 4 ? 0 : 1;
            const void *fnp = k ? (const void *)hc_mix_big<6> : (const void *)hc_mix_big<1>;
            if (!big_attr[k]) {
                if (cudaFuncSetAttribute(fnp, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem) != cudaSuccess)
                    return dsv4_cuda_fail("%s: shared memory attribute", op);
                big_attr[k] = 1;
            }
            dim3 grid(nsc, (n + HC_TT - 1) / HC_TT);
            if (!(flags & 8) && hc_launch(op, k ? hc_mix_big<6> : hc_mix_big<1>, grid, 256, smem, st, flags, Xg, n, K, W, nr,
                                          nsc, part, ssp))
                return -1;
        } else if (big_ok && n > 1 && (nr + 1) * HC_G <= 128 && tb > 1) {
            void (*mix)(const float *, int, int, const float *, int, int, float *, double *) =
                tb == 2 ? hc_mix_tok<2> : tb == 4 ? hc_mix_tok<4> : hc_mix_tok<8>;
            if (!(flags & 8) && hc_launch(op, mix, dim3(nsc, (n + tb - 1) / tb), 128, 0, st, flags, Xg, n, K, W, nr, nsc, part, ssp))
                return -1;
        } else if (!(flags & 8) && hc_launch(op, hc_mix_small, dim3(nsc, n), 128, 0, st, flags, Xg, K, *fn, nr, nsc, part, ssp)) {
            return -1;
        }
        if (!(flags & 4) &&
            hc_launch(op, fin, dim3(n), HEAD ? HC_XT : HC_XT + 32, fsm, st, flags, Xg, M, D, nr, nsc, (const float *)part,
                      (const double *)ssp, scale, base, iters, norm_eps, hc_eps, fuse ? nw : (const float *)NULL, stage,
                      flags & 1, vec, x + (int64_t)t0 * D, HEAD ? (float *)NULL : post + (int64_t)t0 * M,
                      HEAD ? (float *)NULL : comb + (int64_t)t0 * M * M, HEAD || !mixo ? (float *)NULL : mixo + (int64_t)t0 * nr))
            return -1;
    }
    if (nw && !fuse) return dsv4_cuda_rmsnorm(x, T, D, D, nw, norm_eps, st);
    return 0;
}

extern "C" int dsv4_cuda_hc_pre(const float *X, int T, int M, int D, const dsv4_cuda_weight *fn, const float *scale,
                                const float *base, int iters, float norm_eps, float hc_eps, const float *norm_w, float *x,
                                float *post, float *comb, void *scratch, void *stream) {
    if (hc_check("hc_pre", T, M, D, fn, (2 + M) * M, scratch)) return -1;
    if (!T) return 0;
    return hc_run<0>("hc_pre", X, T, M, D, fn, (2 + M) * M, scale, base, iters, norm_eps, hc_eps, norm_w, x, post, comb,
                     scratch, DSV4_STREAM(stream));
}

extern "C" int dsv4_cuda_hc_post_pre(const dsv4_cuda_hc_f *f, const float *Xin, float *X, int T, int M, int D,
                                     const dsv4_cuda_weight *fn, const float *scale, const float *base, int iters,
                                     float norm_eps, float hc_eps, const float *norm_w, float *x, float *post, float *comb,
                                     float *mix, void *scratch, void *stream) {
    if (hc_check("hc_post_pre", T, M, D, fn, (2 + M) * M, scratch)) return -1;
    if (!T) return 0;
    return hc_run<0>("hc_post_pre", X, T, M, D, fn, (2 + M) * M, scale, base, iters, norm_eps, hc_eps, norm_w, x, post, comb,
                     scratch, DSV4_STREAM(stream), f, Xin, mix);
}

extern "C" int dsv4_cuda_hc_head(const float *X, int T, int M, int D, const dsv4_cuda_weight *fn, const float *scale,
                                 const float *base, float norm_eps, float hc_eps, const float *norm_w, float *y,
                                 void *scratch, void *stream) {
    if (hc_check("hc_head", T, M, D, fn, M, scratch)) return -1;
    if (!T) return 0;
    return hc_run<1>("hc_head", X, T, M, D, fn, (2 + M) * M, scale, base, 0, norm_eps, hc_eps, norm_w, y, NULL, NULL,
                     scratch, DSV4_STREAM(stream));
}

/* post: thread per (token, d), from Xin into Xout (the same in place: the M old stream values are read before any is
 * written). */
__global__ void hc_post_kernel(const float *f, const float *Xin, float *Xout, int M, int D, const float *post,
                               const float *comb) {
    dev_pdl_enter();
    int t = blockIdx.y, d = blockIdx.x * blockDim.x + threadIdx.x;
    if (d >= D) return;
    const float *Xt = Xin + (int64_t)t * M * D;
    float *Xo = Xout + (int64_t)t * M * D;
    const float *pt = post + (int64_t)t * M, *C = comb + (int64_t)t * M * M;
    float old[HC_MAXM];
#pragma unroll
    for (int j = 0; j < HC_MAXM; j++) old[j] = j < M ? Xt[(int64_t)j * D + d] : 0.0f;
    float fd = f[(int64_t)t * D + d];
    for (int k = 0; k < M; k++) {
        float acc = __fmul_rn(pt[k], fd);
#pragma unroll
        for (int j = 0; j < HC_MAXM; j++)
            if (j < M) acc = fmaf(C[j * M + k], old[j], acc);
        Xo[(int64_t)k * D + d] = acc;
    }
}

/* the same with 4 consecutive d per thread (16-byte loads and stores; post and comb read once for 4 values) */
__global__ void hc_post4_kernel(const float *f, const float *Xin, float *Xout, int M, int D, const float *post,
                                const float *comb) {
    dev_pdl_enter();
    const int t = blockIdx.y, d = 4 * (blockIdx.x * blockDim.x + threadIdx.x);
    if (d >= D) return;
    const float *Xt = Xin + (int64_t)t * M * D;
    float *Xo = Xout + (int64_t)t * M * D;
    const float *pt = post + (int64_t)t * M, *C = comb + (int64_t)t * M * M;
    float4 old[HC_MAXM];
#pragma unroll
    for (int j = 0; j < HC_MAXM; j++) old[j] = j < M ? *(const float4 *)(Xt + (int64_t)j * D + d) : make_float4(0, 0, 0, 0);
    const float4 fd = *(const float4 *)(f + (int64_t)t * D + d);
    for (int k = 0; k < M; k++) *(float4 *)(Xo + (int64_t)k * D + d) = hc_post_q(pt[k], fd, C + k, M, old);
}

static int hc_post_run(const float *f, const float *Xin, float *X, int T, int M, int D, const float *post, const float *comb,
                       cudaStream_t st) {
    if (T < 0 || M <= 0 || M > HC_MAXM || D <= 0) return dsv4_cuda_fail("hc_post: bad shape (T %d M %d D %d)", T, M, D);
    if (!T) return 0;
    if (D % 4 == 0 && !((uintptr_t)f & 15) && !((uintptr_t)X & 15) && !((uintptr_t)Xin & 15)) {
        dim3 grid((D / 4 + 255) / 256, T);
        dev_launch(hc_post4_kernel, grid, 256, 0, st, f, Xin, X, M, D, post, comb);
    } else {
        dim3 grid((D + 255) / 256, T);
        dev_launch(hc_post_kernel, grid, 256, 0, st, f, Xin, X, M, D, post, comb);
    }
    return dsv4_cuda_check_launch("hc_post");
}

extern "C" int dsv4_cuda_hc_post(const float *f, float *X, int T, int M, int D, const float *post, const float *comb,
                                 void *stream) {
    return hc_post_run(f, X, X, T, M, D, post, comb, DSV4_STREAM(stream));
}

extern "C" int dsv4_cuda_hc_post_to(const float *f, const float *Xin, float *X, int T, int M, int D, const float *post,
                                    const float *comb, void *stream) {
    return hc_post_run(f, Xin, X, T, M, D, post, comb, DSV4_STREAM(stream));
}
