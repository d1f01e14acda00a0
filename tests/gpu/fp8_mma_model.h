/* fp8_mma_model.h - models of Hopper's FP8 MMA (wgmma e4m3 -> f32) on the FP8 prefill experts' sums (moe_f8p.cuh), for
 * test_moe_pf8 (which model the device's h follows) and bench/fp8_mma_fit.c (fitting them to test_moe_pf8's dump).
 * A model: the products of blocks of nb consecutive k (the kernel's logical order) and the accumulator are aligned to
 * the largest exponent, truncated to p (+ g guard) fraction bits and summed; the sum is truncated (var bit 1: rounded
 * to nearest) to p bits; a 128-column unit's four k32 steps from a fresh accumulator, the units' sums added in fp32 in
 * unit order (the kernel's promotions: exact scalings). Header-only, static functions. */
#pragma once
#include <math.h>
#include <stddef.h>

/* variant: bit 0: acc excluded from the alignment (products aligned among themselves, then added to acc by a second
 * aligned add); bit 1: final normalisation RNE instead of RZ; bit 2: acc between k-steps kept in fp32 (the block's sum
 * added with fp32 RN); bit 3: alignment by the factors' exponent sums; bit 4 (with bit 3): a factor's exponent as its
 * e4m3 code's exponent field gives it: an e4m3 subnormal (0.m x 2^-6) counts as 2^-6's binade, not its value's (the
 * callers of mma_dot_off say where the codes lie: value = code x 2^off); g: guard bits during the alignment; perm 1:
 * blocks of 16 taking k 0-3, 16-19, ... (the A registers' halves). Session 48's fit: {32, 13, 8, 0, 0} reproduces every
 * dumped value of the prefill kernel (normal factors only); bit 4 is the open question for subnormal ones. */
typedef struct { int nb, p, var, g, perm; } mma_model;

static int mma_expo(double v) { int e; frexp(v, &e); return e; }
__extension__ typedef __int128 i128; /* (the aligned terms with 40 guard bits pass 2^53) */

/* ea: each term's alignment exponent (NULL: its own, frexp's); the terms truncated in units of 2^q, summed exactly */
static double mma_add_aligned(const double *t, const int *ea, int n, int p, int g, int rne) {
    int emax = -100000;
    for (int i = 0; i < n; i++) if (t[i] != 0) { int e = ea ? ea[i] : mma_expo(t[i]); if (e > emax) emax = e; }
    if (emax == -100000) return 0;
    const int q = emax - 1 - p - g;
    i128 s = 0;
    for (int i = 0; i < n; i++) s += (i128)trunc(ldexp(t[i], -q)); /* (exact: t has at most 24 significant bits) */
    if (s == 0) return 0;
    const int neg = s < 0;
    unsigned __int128 m = neg ? -(unsigned __int128)s : (unsigned __int128)s;
    int len = 0;
    for (unsigned __int128 v = m; v; v >>= 1) len++;
    if (len > p + 1) { /* keep p + 1 significant bits */
        const int sh = len - p - 1;
        const unsigned __int128 rem = m & (((unsigned __int128)1 << sh) - 1), half = (unsigned __int128)1 << (sh - 1);
        m >>= sh;
        if (rne && (rem > half || (rem == half && (m & 1)))) m++;
        return ldexp(neg ? -(double)m : (double)m, q + sh);
    }
    return ldexp(neg ? -(double)m : (double)m, q);
}

/* pe: the products' exponent sums + 1 (bit 3 of the variant: alignment by those, as if each product's significand
 * were below 2) */
static float mma_block(float acc, const float *pr, const int *pe, int n, mma_model m) {
    double t[40];
    int ea[40], *eap = (m.var & 8) ? ea : NULL;
    int rne = (m.var >> 1) & 1;
    if (m.var & 4) { /* products' sum aligned, acc in fp32 */
        for (int i = 0; i < n; i++) t[i] = pr[i], ea[i] = pe[i];
        return acc + (float)mma_add_aligned(t, eap, n, m.p, m.g, rne);
    }
    if (m.var & 1) {
        for (int i = 0; i < n; i++) t[i] = pr[i], ea[i] = pe[i];
        double s = mma_add_aligned(t, eap, n, m.p, m.g, rne);
        double u[2] = {acc, s};
        return (float)mma_add_aligned(u, NULL, 2, m.p, m.g, rne);
    }
    t[0] = acc, ea[0] = acc != 0 ? mma_expo(acc) : 0;
    for (int i = 0; i < n; i++) t[i + 1] = pr[i], ea[i + 1] = pe[i];
    return (float)mma_add_aligned(t, eap, n + 1, m.p, m.g, rne);
}
/* a factor's exponent (frexp's) for the alignment: with variant bit 4 at least -5 in its code's terms (e4m3's smallest
 * normal binade, 2^-6 = 0.5 x 2^-5), the code being the value x 2^-off */
static int mma_fexp(float v, int off, int var) {
    const int e = mma_expo(v);
    return (var & 16) && e - off < -5 ? off - 5 : e;
}
/* xoff: per 128-column unit, the x codes' scale exponent (NULL: 0); woff: the weight row's */
static float mma_unit_off(const float *xq, const float *wr, int u, mma_model m, int xoff, int woff) {
    float pr[128];
    int pe[128];
    for (int L = 0; L < 128; L++) {
        const int s = L >> 5, kk = L & 31, c = (kk >> 2) & 3, ph = 128 * u + 32 * c + 8 * s + 4 * (kk >> 4) + (kk & 3);
        int Lp = L;
        if (m.perm == 1) { /* k16 halves interleaved: (kk & 3) | ((kk >> 4) << 2) | (((kk >> 2) & 3) << 3) */
            int k2 = (kk & 3) | ((kk >> 4) << 2) | (((kk >> 2) & 3) << 3);
            Lp = 32 * s + k2;
        }
        pr[Lp] = xq[ph] * wr[ph];
        /* (frexp's: |x| < 2^e; the product below 2^(ex + ew - 1) if both significands were 1) */
        pe[Lp] = pr[Lp] != 0 ? mma_fexp(xq[ph], xoff, m.var) + mma_fexp(wr[ph], woff, m.var) - 1 : 0;
    }
    float acc = 0;
    for (int b = 0; b < 128; b += m.nb) acc = mma_block(acc, pr + b, pe + b, m.nb, m);
    return acc;
}
static float mma_dot_off(const float *xq, const float *wr, int C, mma_model m, const int *xoff, int woff) {
    float d = 0;
    for (int u = 0; u < C / 128; u++) d += mma_unit_off(xq, wr, u, m, xoff ? xoff[u] : 0, woff);
    return d;
}
