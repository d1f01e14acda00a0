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
 * Grid (chunk blocks, queries; the longest lists first): a block stages its query's q once (a warp a 32-column block,
 * coalesced), then strides over chunks of IXT_EB entries: the chunk's key codes into shared memory as f16, each
 * block's exponent from the code words in registers (4 lanes a block); then a warp owns MT x 16 heads x 64 / MT
 * entries (32 x 32 where the heads come in 32s: each fragment read by two warps, not four), its fragments read by
 * ldmatrix (q's once a block into registers, the keys' once a chunk; 3 blocks an SM at up to 168 registers); the dots
 * go through shared memory to the chains over the heads. */
#include <cuda_fp16.h>
#include <stdlib.h>
#include <string.h>

#include "common.cuh"
#include "indexer.cuh"
#include "indexer_tc.h"
#include "kv_cache.cuh"
#include "linear_tc.cuh"

#define IXT_EB 64     /* entries per chunk: 8 mma n-tiles */
#define IXT_SKIP 1000 /* exponent of an all-zero block: adds nothing */
#define IXT_BAD 2000  /* a block the exact path cannot take: the element runs the chain */
#define IXT_SW(h) (8 * ((h) & 3)) /* the dots' swizzle: head h's entry e at h IXT_EB + (e ^ IXT_SW(h)) */

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

/* MT: m-tiles (16 heads) a warp, 2 when Hi is a multiple of 32, else 1; its n-tiles (8 entries) NT = 8 / MT */
template <int DI, int MT>
__global__ void __launch_bounds__(128, 3) ixt_kernel(const float *qi, const float *wt, int Hi, const uint8_t *const *keys,
                                                  const int *ncausal, const int *nlist, int ld, float *out) {
    dev_pdl_enter();
    constexpr int NB = DI / 32, LDH = DI + 8; /* halves a staged row: 16-byte pad, conflict-free fragment reads */
    constexpr int NT = 8 / MT, WPE = DI / 8;  /* n-tiles a warp; code words an entry */
    extern __shared__ __align__(16) unsigned char ixt_sm[];
    __half *qh = (__half *)ixt_sm;                     /* [Hi][LDH] q / 2^a */
    __half *kh = qh + (size_t)Hi * LDH;                /* [IXT_EB][LDH] key codes x 2 */
    int *qa = (int *)(kh + (size_t)IXT_EB * LDH);      /* [Hi][NB] a */
    int *kb = qa + Hi * NB;                            /* [IXT_EB][NB] key block exponents (scale / 2) */
    int *qr2 = kb + IXT_EB * NB;                       /* [Hi][2] smallest, largest a of the head (IXT_BAD: a bad block) */
    float *ws = (float *)(qr2 + 2 * Hi);               /* [Hi] */
    float *qf = ws + Hi;                               /* [Hi][NB] 2^a (0 for a block that adds nothing here) */
    float *kf = qf + Hi * NB;                          /* [NB][IXT_EB] 2^(key block exponent), likewise */
    float *ds = kf + IXT_EB * NB;                      /* [Hi][IXT_EB] dots, swizzled (IXT_SW) */
    /* the longest lists first (a prefill pass's later queries): the last wave holds the short ones */
    const int t = gridDim.y - 1 - blockIdx.y, n = nlist[t], ncs = ncausal[t], nch = (n + IXT_EB - 1) / IXT_EB;
    if ((int)blockIdx.x >= nch) return;
    const int tid = threadIdx.x, nth = blockDim.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, c = lane & 3;
    const float *qt = qi + (int64_t)t * Hi * DI;
    const uint8_t *kt = keys[t];
    const int64_t rbytes = dsv4_ikey_row_bytes(DI);
    /* q / 2^a: a warp instruction a head row (DI / 4 lanes of 4 values; two rows at DI 64), several rows' loads in
     * flight; a (head, block)'s largest |q| (NaN aside, as fmaxf has it) over its 8 lanes */
    {
        constexpr int LPH = DI / 4, HPI = 32 / LPH; /* lanes a head row, rows a warp instruction */
        const int col = lane % LPH, b = col / 8;
#pragma unroll 4
        for (int h0w = warp * HPI; h0w < Hi; h0w += (nth >> 5) * HPI) {
            const int h = h0w + lane / LPH;
            const float4 x = *(const float4 *)(qt + (int64_t)h * DI + 4 * col);
            const uint32_t inf = 0x7f800000u; /* |x| bits above it: NaN, left out */
            uint32_t ab = 0, u;
            u = __float_as_uint(x.x) & 0x7fffffffu, ab = max(ab, u > inf ? 0u : u);
            u = __float_as_uint(x.y) & 0x7fffffffu, ab = max(ab, u > inf ? 0u : u);
            u = __float_as_uint(x.z) & 0x7fffffffu, ab = max(ab, u > inf ? 0u : u);
            u = __float_as_uint(x.w) & 0x7fffffffu, ab = max(ab, u > inf ? 0u : u);
#pragma unroll
            for (int o = 1; o < 8; o <<= 1) ab = max(ab, __shfl_xor_sync(0xffffffffu, ab, o));
            const float mx = __uint_as_float(ab);
            int a = IXT_SKIP;
            const int ex = (int)((ab >> 23) & 0xff);
            if (!(mx <= 3.0e38f) || (mx > 0 && ex == 0)) a = IXT_BAD; /* huge or subnormal: the chain */
            else if (mx > 0) a = ex - 127;
            const float inv = a < IXT_SKIP ? ixt_pow2(-a) : 0.0f;
            const float m0 = x.x * inv, m1 = x.y * inv, m2 = x.z * inv, m3 = x.w * inv; /* exact: a power of two, |m| < 2 */
            int off = a < IXT_SKIP && (m0 * 16.0f != rintf(m0 * 16.0f) || m1 * 16.0f != rintf(m1 * 16.0f) ||
                                       m2 * 16.0f != rintf(m2 * 16.0f) || m3 * 16.0f != rintf(m3 * 16.0f));
#pragma unroll
            for (int o = 1; o < 8; o <<= 1) off |= __shfl_xor_sync(0xffffffffu, off, o);
            if (off) a = IXT_BAD;
            const __half2 p0 = __floats2half2_rn(m0, m1), p1 = __floats2half2_rn(m2, m3);
            *(uint2 *)(qh + h * LDH + 4 * col) = make_uint2(*(const uint32_t *)&p0, *(const uint32_t *)&p1);
            if ((col & 7) == 0) qa[h * NB + b] = a, qf[h * NB + b] = a < IXT_SKIP ? ixt_pow2(a) : 0.0f;
        }
    }
    for (int i = tid; i < Hi; i += nth) ws[i] = wt[(int64_t)t * Hi + i];
    __syncthreads();
    for (int h = tid; h < Hi; h += nth) ixt_range(qa + h * NB, NB, qr2 + 2 * h);
    /* this warp's tile: heads h0 .. h0 + 16 MT - 1, entries e0 .. e0 + 8 NT - 1 of a chunk */
    const int hg = Hi / (16 * MT), h0 = (warp % hg) * 16 * MT, e0 = (warp / hg) * 8 * NT;
    /* ldmatrix rows of this lane (shared addresses; 2 bytes a half): q (A: heads h0 + (lane & 7) + 8 x bit 3, columns
     * + 8 x bit 4), keys (B: entries e0 + (lane & 7) + 8 x bit 4 of an n-tile pair, columns + 8 x bit 3) */
    const unsigned qrow = (unsigned)__cvta_generic_to_shared(qh + (h0 + (lane & 7) + 8 * ((lane >> 3) & 1)) * LDH + 8 * (lane >> 4));
    const unsigned krow = (unsigned)__cvta_generic_to_shared(kh + (e0 + (lane & 7) + 8 * (lane >> 4)) * LDH + 8 * ((lane >> 3) & 1));
    /* q's A fragments of the warp's heads, all k-steps, in registers for every chunk (16 MT NB x 2 words: 64 at DI 128,
     * MT 2): read from shared memory once, not once a chunk (the chunk loop is bound by shared memory's bandwidth,
     * session 50's L1/TEX 74-76 %, of which q's fragments were ~30 %) */
    uint32_t Aq[NB][2][MT][4];
#pragma unroll
    for (int b = 0; b < NB; b++)
#pragma unroll
        for (int kk = 0; kk < 2; kk++)
#pragma unroll
            for (int m = 0; m < MT; m++) tc_ldsm4(Aq[b][kk][m], qrow + 2 * (16 * m * LDH + b * 32 + kk * 16));
    for (int ch = blockIdx.x; ch < nch; ch += gridDim.x) {
        const int w0 = ch * IXT_EB;
        if (w0 >= ncs) { /* past the query's causal entries (the condition is the block's: no barrier skipped unevenly) */
            for (int w = w0 + tid; w < n && w < w0 + IXT_EB; w += nth) out[(int64_t)t * ld + w] = -INFINITY;
            continue;
        }
        /* the chunk's keys (zeros past the query's causal entries: their scores are -inf or not written): word it (entry
         * it / WPE, word it % WPE) by thread it % nth; nth is a multiple of 32 and so is the words' count, so a warp's
         * words are all in range or none, a block's 4 words in 4 neighbouring lanes, an entry's in WPE. With 128
         * threads (64 heads) a thread's code words and scale bytes are all loaded before any is used: a loop of
         * load / store would order each load after the previous stores into shared memory (one latency a word). */
        auto code_ld = [&](int it) {
            const int e = it / WPE, p = it - e * WPE, w = w0 + e;
            return w < n && w < ncs ? __ldg((const uint32_t *)(kt + (int64_t)w * rbytes + 4 * p)) : 0u;
        };
        auto sc_ld = [&](int it) { /* the scale byte of word it's block (its first lane's; 0 on the others and past the entries) */
            const int e = it / WPE, p = it - e * WPE, w = w0 + e;
            return (p & 3) == 0 && w < n && w < ncs ? (uint32_t)__ldg(kt + (int64_t)w * rbytes + DI / 2 + p / 4) : 0u;
        };
        /* a word's 8 codes as f16 code x 2 (exact), in order: byte k's two nibbles into the halves of z = byte x 0x1001,
         * each nibble s|e1 e0|m to the f16 s|000 e1 e0|m|0.. (= e2m1 x 2^-14, its subnormal included), x 2^15; then the
         * block's exponent kb (IXT_SKIP when all its codes are zeros, IXT_BAD for a NaN scale: even zero codes give NaN
         * products) from the 4 lanes of the block (an entry's range, where a test needs it, from its kb) */
        auto codes = [&](int it, uint32_t cw, uint32_t sb) { /* sb: the block's scale byte */
            const int e = it / WPE, p = it - e * WPE, s = w0 + e < n && w0 + e < ncs ? (int)sb : -1;
            uint32_t v[4];
#pragma unroll
            for (int k = 0; k < 4; k++) {
                const uint32_t z = __byte_perm(cw, 0u, 0x4440u + k) * 0x1001u;
                const uint32_t f = ((z << 9) & 0x0E000E00u) | ((z << 12) & 0x80008000u);
                const __half2 h = __hmul2(*(const __half2 *)&f, __halves2half2(__ushort_as_half(0x7800), __ushort_as_half(0x7800)));
                v[k] = *(const uint32_t *)&h;
            }
            *(uint4 *)(kh + e * LDH + 8 * p) = make_uint4(v[0], v[1], v[2], v[3]);
            uint32_t any = cw & 0x77777777u; /* a nonzero magnitude among the block's 32 codes */
            any |= __shfl_xor_sync(0xffffffffu, any, 1);
            any |= __shfl_xor_sync(0xffffffffu, any, 2);
            int v0 = IXT_SKIP;
            if (s >= 0) v0 = s == 0xff ? IXT_BAD : any ? s - 127 - 1 : IXT_SKIP;
            const int bl = p / 4; /* the block's 4 lanes store the same values */
            kb[e * NB + bl] = v0, kf[bl * IXT_EB + e] = v0 < IXT_SKIP ? ixt_pow2(v0) : 0.0f;
        };
        constexpr int KW = IXT_EB * WPE; /* code words a chunk */
        if (nth == 128) {
            uint32_t cw[KW / 128], sc[(KW / 128 + 3) / 4] = {}; /* the scale bytes four a register */
#pragma unroll
            for (int k = 0; k < KW / 128; k++) cw[k] = code_ld(tid + 128 * k);
#pragma unroll
            for (int k = 0; k < KW / 128; k++) sc[k / 4] |= sc_ld(tid + 128 * k) << (8 * (k % 4));
#pragma unroll
            for (int k = 0; k < KW / 128; k++)
                codes(tid + 128 * k, cw[k], __shfl_sync(0xffffffffu, sc[k / 4] >> (8 * (k % 4)), lane & ~3) & 0xffu);
        } else {
            for (int it = tid; it < KW; it += nth) codes(it, code_ld(it), __shfl_sync(0xffffffffu, sc_ld(it), lane & ~3));
        }
        __syncthreads();
        /* the warp's tile: a block's sums S by two k16 steps, then dot += S 2^(a + e): the factor 2^a 2^e is exact (the
         * elements this sum serves have -145 <= a + e <= 100, the others run the chain below) and so is S 2^(a + e) (S a
         * multiple of 2^-4 below 768 in magnitude), so one fmaf is the product then the addition. A block of zeros or a
         * bad one has factor 0: its S is +-0 (the bad ones' elements run the chain), and dot (never -0) + +-0 is dot. */
        float dot[MT][NT][4];
#pragma unroll
        for (int m = 0; m < MT; m++)
#pragma unroll
            for (int j = 0; j < NT; j++)
#pragma unroll
                for (int i = 0; i < 4; i++) dot[m][j][i] = 0.0f;
#pragma unroll
        for (int b = 0; b < NB; b++) {
            float S[MT][NT][4];
#pragma unroll
            for (int m = 0; m < MT; m++)
#pragma unroll
                for (int j = 0; j < NT; j++)
#pragma unroll
                    for (int i = 0; i < 4; i++) S[m][j][i] = 0.0f;
#pragma unroll
            for (int kk = 0; kk < 2; kk++) {
                const int k0 = b * 32 + kk * 16;
                uint32_t B[NT / 2][4];
#pragma unroll
                for (int jp = 0; jp < NT / 2; jp++) tc_ldsm4(B[jp], krow + 2 * (16 * jp * LDH + k0));
#pragma unroll
                for (int m = 0; m < MT; m++)
#pragma unroll
                    for (int j = 0; j < NT; j++)
                        tc_mma(S[m][j], Aq[b][kk][m], B[j / 2][2 * (j & 1)], B[j / 2][2 * (j & 1) + 1]);
            }
#pragma unroll
            for (int m = 0; m < MT; m++) {
                const float f0 = qf[(h0 + 16 * m + g) * NB + b], f1 = qf[(h0 + 16 * m + g + 8) * NB + b]; /* 2^a of its heads */
#pragma unroll
                for (int j = 0; j < NT; j++) {
                    const float2 fe = *(const float2 *)(kf + b * IXT_EB + e0 + 8 * j + 2 * c);
                    dot[m][j][0] = __fmaf_rn(S[m][j][0], __fmul_rn(f0, fe.x), dot[m][j][0]);
                    dot[m][j][1] = __fmaf_rn(S[m][j][1], __fmul_rn(f0, fe.y), dot[m][j][1]);
                    dot[m][j][2] = __fmaf_rn(S[m][j][2], __fmul_rn(f1, fe.x), dot[m][j][2]);
                    dot[m][j][3] = __fmaf_rn(S[m][j][3], __fmul_rn(f1, fe.y), dot[m][j][3]);
                }
            }
        }
        /* heads-major, a float2 of two neighbouring entries a store, entries XORed with 8 (h & 3): a warp's 32 stores (heads
         * g, entries 2 c) fill the 16 8-byte bank pairs twice each, where entry-major scalar stores were 4-way bank
         * conflicts; the chains over the heads read a head's entries as a permutation of one row, conflict-free */
#pragma unroll
        for (int m = 0; m < MT; m++)
#pragma unroll
            for (int j = 0; j < NT; j++)
#pragma unroll
                for (int hb = 0; hb < 2; hb++) {
                    const int h = h0 + 16 * m + g + 8 * hb;
                    *(float2 *)(ds + h * IXT_EB + ((e0 + 8 * j + 2 * c) ^ IXT_SW(h))) = make_float2(dot[m][j][2 * hb], dot[m][j][2 * hb + 1]);
                }
        /* the exactness test per element; the CPU's chain where it fails. First the warp at once: when its heads' and
         * entries' block exponents (zero blocks aside) lie within 8 binades of each other and in range, every element
         * passes. Else the quick test of the lane's elements from the heads' and entries' exponent ranges, then the rest
         * one by one. Element x = (m NT + j) 4 + i of the lane: head h0 + 16 m + g (+ 8 for i >= 2), entry e0 + 8 j + 2 c
         * + (i & 1). */
        uint32_t slow = 0;
        {
            int qlo = IXT_SKIP, qhi = -IXT_SKIP, klo = IXT_SKIP, khi = -IXT_SKIP, wbad = 0;
            if (lane < 16 * MT) { /* the warp's heads, a lane each */
                const int hl = qr2[2 * (h0 + lane)], hh = qr2[2 * (h0 + lane) + 1];
                wbad |= hh == IXT_BAD;
                if (hl != IXT_SKIP) qlo = hl, qhi = hh;
            }
            for (int e = lane; e < 8 * NT; e += 32) { /* its entries */
                int r[2];
                ixt_range(kb + (e0 + e) * NB, NB, r);
                const int el = r[0], eh = r[1];
                wbad |= eh == IXT_BAD;
                if (el != IXT_SKIP) klo = min(klo, el), khi = max(khi, eh);
            }
            wbad = __reduce_or_sync(0xffffffffu, wbad);
            if (!wbad) {
                qlo = __reduce_min_sync(0xffffffffu, qlo), qhi = __reduce_max_sync(0xffffffffu, qhi);
                klo = __reduce_min_sync(0xffffffffu, klo), khi = __reduce_max_sync(0xffffffffu, khi);
                wbad = !(qlo == IXT_SKIP || klo == IXT_SKIP ||
                         (qhi + khi - (qlo + klo) <= 8 && qlo + klo >= -145 && qhi + khi <= 100));
            }
            if (wbad) { /* (rare: not unrolled) */
#pragma unroll 1
                for (int m = 0; m < MT; m++) {
                    const int qlA = qr2[2 * (h0 + 16 * m + g)], qhA = qr2[2 * (h0 + 16 * m + g) + 1];
                    const int qlB = qr2[2 * (h0 + 16 * m + g + 8)], qhB = qr2[2 * (h0 + 16 * m + g + 8) + 1];
#pragma unroll 1
                    for (int j = 0; j < NT; j++)
#pragma unroll
                        for (int i1 = 0; i1 < 2; i1++) {
                            const int el = e0 + 8 * j + 2 * c + i1, w = w0 + el;
                            int r[2];
                            ixt_range(kb + el * NB, NB, r);
                            const int kl = r[0], kh2 = r[1];
#pragma unroll
                            for (int hb = 0; hb < 2; hb++) {
                                const int ql = hb ? qlB : qlA, qh2 = hb ? qhB : qhA;
                                bool ok = w >= n || w >= ncs; /* not written by this test */
                                if (qh2 != IXT_BAD && kh2 != IXT_BAD)
                                    ok |= ql == IXT_SKIP || kl == IXT_SKIP || /* q or the key all zeros: the dot is +0 */
                                          ((qh2 + kh2) - (ql + kl) <= 8 && ql + kl >= -145 && qh2 + kh2 <= 100);
                                /* (every e_b within 8 of the smallest: sum_b 2^(e_b - emin) <= NB * 2^8 <= 1365) */
                                if (!ok) slow |= 1u << (4 * (m * NT + j) + 2 * hb + i1);
                            }
                        }
                }
            }
        }
        while (slow) {
            const int x = __ffs(slow) - 1;
            slow &= slow - 1;
            const int m = x / (4 * NT), j = (x >> 2) % NT, i = x & 3;
            const int h = h0 + 16 * m + g + (i < 2 ? 0 : 8), el = e0 + 8 * j + 2 * c + (i & 1), w = w0 + el;
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
                ds[h * IXT_EB + (el ^ IXT_SW(h))] = d;
            }
        }
        __syncthreads();
        ix_head_sums(ds, 1, IXT_EB, 8, ws, Hi, w0, IXT_EB, n, ncs, out + (int64_t)t * ld, tid, nth);
        __syncthreads();
    }
}

template <int DI> static size_t ixt_smem(int Hi) {
    return sizeof(__half) * (size_t)(Hi + IXT_EB) * (DI + 8) + sizeof(int) * ((size_t)Hi * (DI / 32 + 2) + (size_t)IXT_EB * DI / 32) +
           sizeof(float) * ((size_t)Hi + (size_t)(Hi + IXT_EB) * (DI / 32) + (size_t)Hi * IXT_EB);
}

template <int DI, int MT>
static int ixt_launch(const float *qi, const float *wt, int T, int Hi, const uint8_t *const *keys, const int *ncausal,
                      const int *nlist, int maxlist, int ld, float *out, cudaStream_t st) {
    const size_t smem = ixt_smem<DI>(Hi);
    if (smem > (size_t)dsv4_cuda_dev.smem_optin) return 1;
    if (smem > 48 * 1024 &&
        cudaFuncSetAttribute((const void *)ixt_kernel<DI, MT>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem) != cudaSuccess)
        return dsv4_cuda_fail("indexer scores (tensor cores): %zu bytes of shared memory", smem);
    int per_sm = 0;
    cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, (const void *)ixt_kernel<DI, MT>, Hi * 2, smem);
    per_sm = per_sm > 0 ? per_sm : 1;
    const long nch = (maxlist + IXT_EB - 1) / IXT_EB, want = ((long)per_sm * dsv4_cuda_dev.sm_count + T - 1) / T;
    dim3 grid((unsigned)(nch < want ? nch : want), (unsigned)T);
    dev_launch(ixt_kernel<DI, MT>, grid, Hi * 2, smem, st, qi, wt, Hi, keys, ncausal, nlist, ld, out);
    return dsv4_cuda_check_launch("indexer scores (tensor cores)");
}

int dsv4_ixt_scores(const float *qi, const float *wt, int T, int Hi, int Di, const uint8_t *const *keys,
                               const int *ncausal, const int *nlist, int maxlist, int ld, float *out, cudaStream_t st) {
    static int off = -1;
    if (off < 0) off = getenv("DSV4_INDEXER_TC") && !strcmp(getenv("DSV4_INDEXER_TC"), "0");
    if (off || Hi % 16 || Hi > 64 || T > 65535 || ((uintptr_t)qi & 15)) return 1;
    const int m2 = Hi % 32 == 0;
    if (Di == 128) return m2 ? ixt_launch<128, 2>(qi, wt, T, Hi, keys, ncausal, nlist, maxlist, ld, out, st)
                             : ixt_launch<128, 1>(qi, wt, T, Hi, keys, ncausal, nlist, maxlist, ld, out, st);
    if (Di == 64) return m2 ? ixt_launch<64, 2>(qi, wt, T, Hi, keys, ncausal, nlist, maxlist, ld, out, st)
                            : ixt_launch<64, 1>(qi, wt, T, Hi, keys, ncausal, nlist, maxlist, ld, out, st);
    return 1;
}
