/* indexer_tc.cu - the indexer's scores on tensor cores (indexer_tc.h), bit for bit the CPU's chains.
 *
 * score[t, w] = sum_h wt[t,h] * relu(qi[t,h] . k_w): the CPU (indexer_topk() of forward_attn.c) runs each dot as a
 * sequential fp32 chain of separately rounded products over the Di columns. Here both operands are FP4: the keys are
 * stored e2m1 codes x an e8m0 scale per 32 columns, and the queries come out of act_quant_fp4 (e2m1 x a power of two
 * per 32). Per (head, 32-column block) q is written as q / 2^a with 2^a the largest |q|'s power of two: the values are
 * multiples of 2^-4 below 2 (checked), exact in f16; key codes are doubled to integers (-12..12), exact too. An
 * mma.sync m16n8k16 (f16 in, fp32 accumulate; heads the M, entries the N) sums a block's 32 products: |sum| < 768 in
 * steps of 2^-4, so the sum is exact whatever the order. The dot is then sum_b S_b * 2^(a_b + k_b), added in block
 * order. When every partial sum of the CPU's chain is representable (all products are multiples of 2^(emin - 4) and
 * sum_b 768 * 2^(e_b) < 2^(emin - 4) * 2^24, no underflow or overflow), the chain never rounds and equals the exact
 * dot, which the block sums give too; any element that fails the test (q not FP4-shaped, a NaN scale, scales far
 * apart) runs the CPU's chain itself. The chain over the heads is the CPU's, a thread per entry. So the scores are
 * the same bits as forward_ops.cu's kernels, whichever runs.
 * Grid (chunk blocks, query groups of QB, the longest lists first): a block stages its queries' q once, then strides
 * over chunks of IXT_EB entries, staging each chunk's keys once for all its queries (when they share the key array); a
 * warp owns 16 heads of a query x the chunk's entries, its fragments read by ldmatrix. */
#include <cuda_fp16.h>
#include <stdlib.h>
#include <string.h>

#include "common.cuh"
#include "cuda_model.h"
#include "indexer.cuh"
#include "indexer_tc.h"
#include "kv_cache.cuh"
#include "linear_tc.cuh"

#define IXT_EB 64     /* entries per chunk: 8 mma n-tiles */
#define IXT_SKIP 1000 /* exponent of an all-zero block: adds nothing */
#define IXT_BAD 2000  /* a block the exact path cannot take: the element runs the chain */

__device__ __forceinline__ float ixt_pow2(int e) { /* 2^e for e in [-149, 127] (clamped: callers discard the others) */
    e = e < -149 ? -149 : e > 127 ? 127 : e;
    return e >= -126 ? __uint_as_float((uint32_t)(e + 127) << 23) : __uint_as_float(1u << (e + 149));
}

/* the smallest and largest exponent of n blocks (skipping all-zero blocks); IXT_SKIP, IXT_SKIP when all are zero;
 * the largest IXT_BAD when a block is bad */
__device__ __forceinline__ void ixt_range(const int *ex, int n, int *r) {
    int lo = IXT_SKIP, hi = -IXT_SKIP, bad = 0;
    for (int b = 0; b < n; b++) {
        if (ex[b] == IXT_BAD) bad = 1;
        else if (ex[b] < IXT_SKIP) lo = min(lo, ex[b]), hi = max(hi, ex[b]);
    }
    r[0] = lo, r[1] = bad ? IXT_BAD : lo == IXT_SKIP ? IXT_SKIP : hi;
}

/* QB queries a block of QB Hi / 16 warps, sharing each chunk's staged keys when their key lists are the same array
 * (warp w on query w / (Hi / 16)); else one query after another, all the warps on it (see the passes below) */
template <int DI, int QB>
__global__ void __launch_bounds__(128 * QB, 4 / QB) ixt_kernel(const float *qi, const float *wt, int T, int Hi,
                                                            const uint8_t *const *keys, const int *ncausal, const int *nlist,
                                                            int ld, float *out) {
    dev_pdl_enter();
    constexpr int NB = DI / 32, LDH = DI + 8; /* halves a staged row: 16-byte pad, conflict-free fragment reads */
    extern __shared__ __align__(16) unsigned char ixt_sm[];
    const int QH = QB * Hi;                            /* the block's (query, head) rows */
    __half *qhs = (__half *)ixt_sm;                    /* [QB][Hi][LDH] q / 2^a */
    __half *kh = qhs + (size_t)QH * LDH;               /* [IXT_EB][LDH] key codes x 2 */
    int *qas = (int *)(kh + (size_t)IXT_EB * LDH);     /* [QB][Hi][NB] a */
    int *kb = qas + QH * NB;                           /* [IXT_EB][NB] key block exponents (scale / 2) */
    int *qr2s = kb + IXT_EB * NB;                      /* [QB][Hi][2] smallest, largest a of the head (IXT_BAD: a bad block) */
    int *kr2 = qr2s + 2 * QH;                          /* [IXT_EB][2] the same for the entries' key exponents */
    float *wss = (float *)(kr2 + 2 * IXT_EB);          /* [QB][Hi] */
    float *qfs = wss + QH;                             /* [QB][Hi][NB] 2^a (0 for a block that adds nothing here) */
    float *kf = qfs + QH * NB;                         /* [NB][IXT_EB] 2^(key block exponent), likewise */
    float *dss = kf + IXT_EB * NB;                     /* [QB][IXT_EB][Hi + 1] dots */
    __shared__ int qn[QB], qncs[QB];
    __shared__ const uint8_t *qkt[QB];
    /* the longest lists first (a prefill pass's later queries): the last wave holds the short ones */
    const int tb = (gridDim.y - 1 - blockIdx.y) * QB, nq = T - tb < QB ? T - tb : QB;
    const int tid = threadIdx.x, nth = blockDim.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, c = lane & 3;
    const int wq = tid / (2 * Hi); /* this thread's query (its warp's) when the queries share their keys */
    if (tid < nq) qn[tid] = nlist[tb + tid], qncs[tid] = ncausal[tb + tid], qkt[tid] = keys[tb + tid];
    __syncthreads();
    int nmax = 0, same = 1;
    for (int q = 0; q < nq; q++) nmax = max(nmax, qn[q]), same &= qkt[q] == qkt[0];
    if ((int)blockIdx.x * IXT_EB >= nmax) return;
    const int64_t rbytes = dsv4_ikey_row_bytes(DI);
    for (int it = tid; it < nq * Hi * NB; it += nth) {
        const int qh_ = it / NB, b = it - qh_ * NB, q = qh_ / Hi, h = qh_ - q * Hi;
        __half *qh = qhs + (size_t)q * Hi * LDH;
        int *qa = qas + q * Hi * NB;
        float *qf = qfs + q * Hi * NB;
        const float *src = qi + ((int64_t)(tb + q) * Hi + h) * DI + b * 32;
        float mx = 0;
        for (int j = 0; j < 32; j++) mx = fmaxf(mx, fabsf(src[j]));
        int a = IXT_SKIP;
        const int ex = (int)((__float_as_uint(mx) >> 23) & 0xff);
        if (!(mx <= 3.0e38f) || (mx > 0 && ex == 0)) a = IXT_BAD; /* NaN, huge or subnormal: the chain */
        else if (mx > 0) a = ex - 127;
        const float inv = a < IXT_SKIP ? ixt_pow2(-a) : 0.0f;
        for (int j = 0; j < 32; j++) {
            const float m = src[j] * inv; /* exact: a power of two, |m| < 2 */
            if (a < IXT_SKIP && m * 16.0f != rintf(m * 16.0f)) a = IXT_BAD;
            qh[h * LDH + b * 32 + j] = __float2half_rn(m);
        }
        qa[h * NB + b] = a;
        qf[h * NB + b] = a < IXT_SKIP ? ixt_pow2(a) : 0.0f;
    }
    for (int i = tid; i < nq * Hi; i += nth) wss[i] = wt[(int64_t)tb * Hi + i];
    __syncthreads();
    for (int h = tid; h < nq * Hi; h += nth) ixt_range(qas + h * NB, NB, qr2s + 2 * h);
    const int h0 = (warp % (Hi / 16)) * 16; /* this warp's heads h0 .. h0 + 15 */
    /* passes: all the queries at once when they share the key array (warp w on query w / (Hi / 16), every n-tile of a
     * chunk); else one query a pass, the block's warps on its heads and the chunk's n-tiles split QB ways */
    for (int pass = 0; pass < (same ? 1 : nq); pass++) {
    const int pq = same ? wq : pass, act = pq < nq, pqc = act ? pq : 0; /* this warp's query, in the pass or not */
    const int jp0 = same ? 0 : 2 * (warp / (Hi / 16)), jps = same ? 2 : 2 * QB; /* its n-tile pairs: jp0, + jps .. */
    const int stid = same ? tid - wq * 2 * Hi : tid, snth = same ? 2 * Hi : nth; /* its thread among the query's */
    const __half *qh = qhs + (size_t)pqc * Hi * LDH;
    const int *qa = qas + pqc * Hi * NB, *qr2 = qr2s + 2 * pqc * Hi;
    const float *qf = qfs + pqc * Hi * NB, *ws = wss + pqc * Hi;
    float *ds = dss + (size_t)pqc * IXT_EB * (Hi + 1);
    const int t = tb + pqc, n = qn[pqc], ncs = qncs[pqc];
    const float *qt = qi + (int64_t)t * Hi * DI;
    /* ldmatrix rows of this lane: q (A: heads h0 + (lane & 7) + 8 x bit 3, columns + 8 x bit 4), keys (B: entries
     * (lane & 7) + 8 x bit 4 of an n-tile pair, columns + 8 x bit 3) */
    const __half *qrow = qh + (h0 + (lane & 7) + 8 * ((lane >> 3) & 1)) * LDH + 8 * (lane >> 4);
    const __half *krow = kh + ((lane & 7) + 8 * (lane >> 4)) * LDH + 8 * ((lane >> 3) & 1);
    const uint8_t *kt = qkt[same ? 0 : pass];
    int nch = 0, kend = 0; /* the pass's chunks; its keys staged below min(n, ncs) of some query */
    for (int q = same ? 0 : pass; q < (same ? nq : pass + 1); q++)
        nch = max(nch, (qn[q] + IXT_EB - 1) / IXT_EB), kend = max(kend, min(qn[q], qncs[q]));
    for (int ch = blockIdx.x; ch < nch; ch += gridDim.x) {
        const int w0 = ch * IXT_EB;
        if (w0 >= kend) { /* past every query's causal entries (the condition is the block's: no barrier skipped unevenly) */
            if (act)
                for (int w = w0 + stid; w < n && w < w0 + IXT_EB; w += snth) out[(int64_t)t * ld + w] = -INFINITY;
            continue;
        }
        /* the chunk's keys (zeros past the query's causal entries: their scores are -inf or not written). With 128
         * threads (64 heads) a thread's code words and scale bytes are all loaded before any is used: a loop of
         * load / store would order each load after the previous stores into shared memory (one latency a word). */
        /* a word's 8 codes as f16 code x 2 (exact), in order: byte k's two nibbles into the halves of z = byte x
         * 0x1001, each nibble s|e1 e0|m to the f16 s|000 e1 e0|m|0.. (= e2m1 x 2^-14, its subnormal included), x 2^15 */
        auto codes = [&](int it, uint32_t cw) {
            const int e = it / (DI / 8), p = it - e * (DI / 8);
            uint32_t v[4];
#pragma unroll
            for (int k = 0; k < 4; k++) {
                const uint32_t z = __byte_perm(cw, 0u, 0x4440u + k) * 0x1001u;
                const uint32_t f = ((z << 9) & 0x0E000E00u) | ((z << 12) & 0x80008000u);
                const __half2 h = __hmul2(*(const __half2 *)&f, __halves2half2(__ushort_as_half(0x7800), __ushort_as_half(0x7800)));
                v[k] = *(const uint32_t *)&h;
            }
            *(uint4 *)(kh + e * LDH + 8 * p) = make_uint4(v[0], v[1], v[2], v[3]);
        };
        auto code_ld = [&](int it) {
            const int e = it / (DI / 8), p = it - e * (DI / 8), w = w0 + e;
            return w < kend ? __ldg((const uint32_t *)(kt + (int64_t)w * rbytes + 4 * p)) : 0u;
        };
        auto sc_ld = [&](int it) {
            const int e = it / NB, b = it - e * NB, w = w0 + e;
            return w < kend ? (int)__ldg(kt + (int64_t)w * rbytes + DI / 2 + b) : -1;
        };
        /* kb: the block's exponent; IXT_SKIP when all its codes are zeros (read back from kh: the halves of +-0) */
        auto block = [&](int it, int s) {
            const int e = it / NB, b = it - e * NB;
            int v = IXT_SKIP;
            if (s >= 0) {
                const uint4 *z = (const uint4 *)(kh + e * LDH + 32 * b);
                uint32_t any = 0;
#pragma unroll
                for (int k = 0; k < 4; k++) any |= z[k].x | z[k].y | z[k].z | z[k].w;
                if (s == 0xff) v = IXT_BAD; /* NaN scale: even zero codes give NaN products */
                else if (any & 0x7fff7fffu) v = s - 127 - 1;
            }
            kb[e * NB + b] = v;
            kf[b * IXT_EB + e] = v < IXT_SKIP ? ixt_pow2(v) : 0.0f;
        };
        constexpr int KW = IXT_EB * (DI / 8), KB = IXT_EB * NB; /* code words, (entry, block) scale bytes */
        constexpr int NT = 128 * QB; /* the threads of 64 heads */
        if (nth == NT) {
            uint32_t cw[KW / NT];
            int sc[(KB + NT - 1) / NT];
#pragma unroll
            for (int k = 0; k < KW / NT; k++) cw[k] = code_ld(tid + NT * k);
#pragma unroll
            for (int k = 0; k < (KB + NT - 1) / NT; k++) sc[k] = tid + NT * k < KB ? sc_ld(tid + NT * k) : -1;
#pragma unroll
            for (int k = 0; k < KW / NT; k++) codes(tid + NT * k, cw[k]);
            __syncthreads();
#pragma unroll
            for (int k = 0; k < (KB + NT - 1) / NT; k++)
                if (tid + NT * k < KB) block(tid + NT * k, sc[k]);
        } else {
            for (int it = tid; it < KW; it += nth) codes(it, code_ld(it));
            __syncthreads();
            for (int it = tid; it < KB; it += nth) block(it, sc_ld(it));
        }
        __syncthreads();
        for (int e = tid; e < IXT_EB; e += nth) ixt_range(kb + e * NB, NB, kr2 + 2 * e);
        __syncthreads();
        if (act) { /* this warp's heads: the dots, the exactness test, the chains where it fails */
        /* the chunk's 8 n-tiles in pairs (registers); a block's sums S by two k16 steps, then scaled into dot */
#pragma unroll 1
        for (int jp = jp0; jp < 8; jp += jps) {
            float dot[2][4];
#pragma unroll
            for (int j = 0; j < 2; j++)
#pragma unroll
                for (int i = 0; i < 4; i++) dot[j][i] = 0.0f;
#pragma unroll
            for (int b = 0; b < NB; b++) {
                float S[2][4];
#pragma unroll
                for (int j = 0; j < 2; j++)
#pragma unroll
                    for (int i = 0; i < 4; i++) S[j][i] = 0.0f;
#pragma unroll
                for (int kk = 0; kk < 2; kk++) {
                    const int k0 = b * 32 + kk * 16;
                    uint32_t A[4], B[4];
                    tc_ldsm4(A, qrow + k0);
                    tc_ldsm4(B, krow + 8 * jp * LDH + k0);
                    tc_mma<0>(S[0], A[0], A[1], A[2], A[3], B[0], B[1]);
                    tc_mma<0>(S[1], A[0], A[1], A[2], A[3], B[2], B[3]);
                }
                /* dot += S 2^(a + e), the factor 2^a 2^e (exact: the elements this sum serves have -145 <= a + e <= 100,
                 * the others run the chain below) and S 2^(a + e) exact too (S a multiple of 2^-4 below 768 in
                 * magnitude), so one fmaf is the product then the addition. A block of zeros or a bad one has factor 0:
                 * its S is +-0 (the bad ones' elements run the chain), and dot (never -0) + +-0 is dot, as no add. */
                const float f0 = qf[(h0 + g) * NB + b], f1 = qf[(h0 + g + 8) * NB + b]; /* 2^a of the lane's heads */
#pragma unroll
                for (int j = 0; j < 2; j++) {
                    const float2 fe = *(const float2 *)(kf + b * IXT_EB + 8 * (jp + j) + 2 * c);
                    dot[j][0] = __fmaf_rn(S[j][0], __fmul_rn(f0, fe.x), dot[j][0]);
                    dot[j][1] = __fmaf_rn(S[j][1], __fmul_rn(f0, fe.y), dot[j][1]);
                    dot[j][2] = __fmaf_rn(S[j][2], __fmul_rn(f1, fe.x), dot[j][2]);
                    dot[j][3] = __fmaf_rn(S[j][3], __fmul_rn(f1, fe.y), dot[j][3]);
                }
            }
#pragma unroll
            for (int j = 0; j < 2; j++)
#pragma unroll
                for (int i = 0; i < 4; i++) ds[(8 * (jp + j) + 2 * c + (i & 1)) * (Hi + 1) + h0 + g + (i < 2 ? 0 : 8)] = dot[j][i];
        }
        /* the exactness test per element; the CPU's chain where it fails. First the warp at once: when its heads' and
         * the chunk's entries' block exponents (zero blocks aside) lie within 8 binades of each other and in range,
         * every element passes. Else the quick test of the lane's 32 elements from the heads' and entries' exponent
         * ranges (registers), then the rest one by one. */
        uint32_t slow = 0;
        int qlo = IXT_SKIP, qhi = -IXT_SKIP, klo = IXT_SKIP, khi = -IXT_SKIP, wbad = 0;
#pragma unroll
        for (int u = 0; u < 2; u++) {
            const int h = h0 + g + 8 * u, e = lane + 32 * u, hl = qr2[2 * h], hh = qr2[2 * h + 1];
            const int el = kr2[2 * e], eh = kr2[2 * e + 1];
            wbad |= hh == IXT_BAD || eh == IXT_BAD;
            if (hl != IXT_SKIP) qlo = min(qlo, hl), qhi = max(qhi, hh);
            if (el != IXT_SKIP) klo = min(klo, el), khi = max(khi, eh);
        }
        wbad = __reduce_or_sync(0xffffffffu, wbad);
        if (!wbad) {
            qlo = __reduce_min_sync(0xffffffffu, qlo), qhi = __reduce_max_sync(0xffffffffu, qhi);
            klo = __reduce_min_sync(0xffffffffu, klo), khi = __reduce_max_sync(0xffffffffu, khi);
            wbad = !(qlo == IXT_SKIP || klo == IXT_SKIP || (qhi + khi - (qlo + klo) <= 8 && qlo + klo >= -145 && qhi + khi <= 100));
        }
        if (wbad) {
            const int qlA = qr2[2 * (h0 + g)], qhA = qr2[2 * (h0 + g) + 1];
            const int qlB = qr2[2 * (h0 + g + 8)], qhB = qr2[2 * (h0 + g + 8) + 1];
#pragma unroll
            for (int j = 0; j < 8; j++)
#pragma unroll
                for (int i1 = 0; i1 < 2; i1++) {
                    const int el = 8 * j + 2 * c + i1, w = w0 + el, kl = kr2[2 * el], kh2 = kr2[2 * el + 1];
#pragma unroll
                    for (int hb = 0; hb < 2; hb++) {
                        const int ql = hb ? qlB : qlA, qh2 = hb ? qhB : qhA;
                        bool ok = w >= n || w >= ncs || (j & ~1) < jp0 || ((j & ~1) - jp0) % jps; /* not written here */
                        if (qh2 != IXT_BAD && kh2 != IXT_BAD)
                            ok |= ql == IXT_SKIP || kl == IXT_SKIP || /* q or the key all zeros: the dot is +0 */
                                  ((qh2 + kh2) - (ql + kl) <= 8 && ql + kl >= -145 && qh2 + kh2 <= 100);
                        /* (every e_b within 8 of the smallest: sum_b 2^(e_b - emin) <= NB * 2^8 <= 1365) */
                        if (!ok) slow |= 1u << (4 * j + 2 * hb + i1);
                    }
                }
        }
        while (slow) {
            const int x = __ffs(slow) - 1;
            slow &= slow - 1;
            const int j = x >> 2, i = x & 3;
            const int h = h0 + g + (i < 2 ? 0 : 8), el = 8 * j + 2 * c + (i & 1), w = w0 + el;
            int emin = IXT_SKIP, emax = -IXT_SKIP, bad = 0;
            for (int b = 0; b < NB; b++) {
                const int a = qa[h * NB + b], e = kb[el * NB + b];
                if (a == IXT_BAD || e == IXT_BAD) bad = 1;
                else if (a < IXT_SKIP && e < IXT_SKIP) emin = min(emin, a + e), emax = max(emax, a + e);
            }
            if (!bad && emin < IXT_SKIP) {
                if (emin < -145 || emax > 100 || emax - emin > 11) {
                    bad = 1;
                } else {
                    int sum = 0;
                    for (int b = 0; b < NB; b++) {
                        const int a = qa[h * NB + b], e = kb[el * NB + b];
                        if (a < IXT_SKIP && e < IXT_SKIP) sum += 1 << (a + e - emin);
                    }
                    bad = sum > 1365;
                }
            }
            if (bad) {
                const float *qr = qt + (int64_t)h * DI;
                const uint8_t *kr = kt + (int64_t)w * rbytes;
                float d = 0.0f;
                for (int jj = 0; jj < DI; jj++) d = __fadd_rn(d, __fmul_rn(qr[jj], dev_ikey_at(kr, DI, jj)));
                ds[el * (Hi + 1) + h] = d;
            }
        }
        } /* act */
        __syncthreads();
        if (act) ix_head_sums(ds, Hi + 1, ws, Hi, w0, IXT_EB, n, ncs, out + (int64_t)t * ld, stid, snth);
        __syncthreads();
    }
    } /* pass */
}

template <int DI> static size_t ixt_smem(int Hi, int QB) {
    const size_t QH = (size_t)QB * Hi;
    return sizeof(__half) * (QH + IXT_EB) * (DI + 8) + sizeof(int) * (QH + IXT_EB) * (DI / 32 + 2) +
           sizeof(float) * (QH + (QH + IXT_EB) * (DI / 32) + (size_t)QB * IXT_EB * (Hi + 1));
}

template <int DI, int QB>
static int ixt_launch(const float *qi, const float *wt, int T, int Hi, const uint8_t *const *keys, const int *ncausal,
                      const int *nlist, int maxlist, int ld, float *out, cudaStream_t st) {
    const size_t smem = ixt_smem<DI>(Hi, QB);
    if (smem > (size_t)dsv4_cuda_dev.smem_optin) return 1;
    if (smem > 48 * 1024 &&
        cudaFuncSetAttribute((const void *)ixt_kernel<DI, QB>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem) != cudaSuccess)
        return dsv4_cuda_fail("indexer scores (tensor cores): %zu bytes of shared memory", smem);
    int per_sm = 0;
    cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, (const void *)ixt_kernel<DI, QB>, QB * Hi * 2, smem);
    per_sm = per_sm > 0 ? per_sm : 1;
    const long nqb = (T + QB - 1) / QB, nch = (maxlist + IXT_EB - 1) / IXT_EB;
    const long want = ((long)per_sm * dsv4_cuda_dev.sm_count + nqb - 1) / nqb;
    dim3 grid((unsigned)(nch < want ? nch : want), (unsigned)nqb);
    dev_launch(ixt_kernel<DI, QB>, grid, QB * Hi * 2, smem, st, qi, wt, T, Hi, keys, ncausal, nlist, ld, out);
    return dsv4_cuda_check_launch("indexer scores (tensor cores)");
}

template <int DI>
static int ixt_launch_qb(int qb, const float *qi, const float *wt, int T, int Hi, const uint8_t *const *keys, const int *ncausal,
                         const int *nlist, int maxlist, int ld, float *out, cudaStream_t st) {
    if (qb == 4) return ixt_launch<DI, 4>(qi, wt, T, Hi, keys, ncausal, nlist, maxlist, ld, out, st);
    if (qb == 2) return ixt_launch<DI, 2>(qi, wt, T, Hi, keys, ncausal, nlist, maxlist, ld, out, st);
    return ixt_launch<DI, 1>(qi, wt, T, Hi, keys, ncausal, nlist, maxlist, ld, out, st);
}

static int ixt_qb = -1; /* dsv4_cuda_indexer_qb; -1: DSV4_INDEXER_QB not read yet */

extern "C" void dsv4_cuda_indexer_qb(int qb) { ixt_qb = qb == 1 || qb == 2 || qb == 4 ? qb : 0; }

int dsv4_ixt_scores(const float *qi, const float *wt, int T, int Hi, int Di, const uint8_t *const *keys,
                               const int *ncausal, const int *nlist, int maxlist, int ld, float *out, cudaStream_t st) {
    static int off = -1;
    if (off < 0) off = getenv("DSV4_INDEXER_TC") && !strcmp(getenv("DSV4_INDEXER_TC"), "0");
    if (ixt_qb < 0) dsv4_cuda_indexer_qb(getenv("DSV4_INDEXER_QB") ? atoi(getenv("DSV4_INDEXER_QB")) : 0);
    if (off || Hi % 16 || Hi > 64 || T > 65535 || ((uintptr_t)qi & 15)) return 1;
    /* queries a block: 2 where the pass has enough of them to fill the GPU twice over, else 1 */
    const int qb = ixt_qb ? ixt_qb : T >= 256 ? 2 : 1;
    if (Di == 128) return ixt_launch_qb<128>(qb, qi, wt, T, Hi, keys, ncausal, nlist, maxlist, ld, out, st);
    if (Di == 64) return ixt_launch_qb<64>(qb, qi, wt, T, Hi, keys, ncausal, nlist, maxlist, ld, out, st);
    return 1;
}
