/* fp8_mma_fit.c - which model of Hopper's FP8 MMA (wgmma e4m3 -> f32) the device's gate / up sums follow: reads the
 * records test_moe_pf8 writes with DSV4_PF8_DUMP=FILE (the D 1024 case: every h value beyond one e4m3 step of the CPU's,
 * 1,500 other differing ones, 1,000 controls, each with its act-quantized x, gate and up rows, scale, routing weight and
 * the device's value) and prints, for each model, how many of them it reproduces exactly / within a step / not.
 *   cc -O2 -Wall -Isrc -o /tmp/fp8_mma_fit bench/fp8_mma_fit.c src/quant/formats.c -lm && /tmp/fp8_mma_fit FILE
 *   (--selftest: a model's own values must come out exact)
 * The models are tests/gpu/fp8_mma_model.h's (the variants are described there): blocks of 32 or 16, p 12 and 13, g 0,
 * 3 and 40 (40: the block summed exactly, then one truncation: the "multi-term summation, single final rounding (RZ)",
 * 13 bits wide, that public probes of H100's FP8 wgmma report), 216 in all. Session 47: test_moe_pf8's own printout
 * (nb 32 p 13 best of seven, 87 % of the differing values exact) is NOTES 47's; this program on a dump must reproduce
 * that line first. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../tests/gpu/fp8_mma_model.h"
#include "quant/formats.h"

static float swiglu(float g, float u, float lim, float w) {
    g = fminf(g, lim);
    u = fminf(fmaxf(u, -lim), lim);
    return g / (1.0f + expf(-g)) * u * w;
}

/* --selftest: random e4m3-like x and e2m1-like weights, h from model nb 32 p 13 var 0; that model must match all */
static unsigned rnd_state = 1;
static unsigned rnd(void) { return rnd_state = rnd_state * 1103515245u + 12345u, rnd_state >> 8; }

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: fp8_mma_fit DUMP | --selftest   (DUMP: test_kernels --only pf8 with DSV4_PF8_DUMP=DUMP)\n");
        return 2;
    }
    int D, nr, ns, v2 = 0; /* v2 (magic 0x50463845, session 48): the codes' exponents too (variant bit 4) */
    size_t rs, ro = 8; /* a record's bytes, the offset of its floats */
    unsigned char *rec;
    float *xs;
    int32_t *xo = NULL;
    if (!strcmp(argv[1], "--selftest")) {
        D = 512, nr = 200, ns = 4, rs = 8 + 20 + 8 * (size_t)D;
        rec = calloc(nr, rs), xs = malloc(sizeof(float) * (size_t)ns * D);
        static const float e2m1[8] = {0, 0.5f, 1, 1.5f, 2, 3, 4, 6};
        for (int i = 0; i < ns * D; i++) xs[i] = dsv4_round_e4m3(ldexpf((float)(rnd() % 1000) / 100.0f - 5.0f, -(int)(rnd() % 6)));
        for (int r = 0; r < nr; r++) {
            unsigned char *p = rec + rs * r;
            float *wg = (float *)(p + 28), *wu = wg + D;
            for (int i = 0; i < 2 * D; i++) wg[i] = e2m1[rnd() % 8] * (rnd() & 1 ? -1.0f : 1.0f) * ldexpf(1.0f, -(int)(rnd() % 3) - 4);
            const int32_t slot = r % ns, set = r % 3;
            const mma_model m0 = {32, 13, 0, 0, 0};
            const float hv = swiglu(mma_dot_off(xs + (size_t)slot * D, wg, D, m0, NULL, 0), mma_dot_off(xs + (size_t)slot * D, wu, D, m0, NULL, 0), 10.0f, 0.5f);
            const float sc = 1.0f / 64, rf[5] = {0.5f, sc, sc / 512, dsv4_round_e4m3(fminf(fmaxf(hv / sc, -448.0f), 448.0f)) * sc, 0};
            memcpy(p, &slot, 4), memcpy(p + 4, &set, 4), memcpy(p + 8, rf, 20);
        }
    } else {
        FILE *f = fopen(argv[1], "rb");
        int32_t h[4];
        if (!f || fread(h, sizeof h, 1, f) != 1 || (h[0] != 0x50463844 && h[0] != 0x50463845) || h[1] <= 0 || h[1] % 128 || h[2] < 0 ||
            h[3] < 0) {
            fprintf(stderr, "fp8_mma_fit: %s: not a DSV4_PF8_DUMP file\n", argv[1]);
            return 1;
        }
        v2 = h[0] == 0x50463845, ro = v2 ? 16 : 8;
        D = h[1], nr = h[2], ns = h[3], rs = ro + 20 + 8 * (size_t)D;
        rec = malloc(rs * nr), xs = malloc(sizeof(float) * (size_t)ns * D);
        if (v2) xo = malloc(sizeof(int32_t) * (size_t)ns * (D / 128));
        if (!rec || !xs || (v2 && !xo) || fread(rec, rs, nr, f) != (size_t)nr || fread(xs, sizeof(float), (size_t)ns * D, f) != (size_t)ns * D ||
            (v2 && fread(xo, sizeof(int32_t), (size_t)ns * (D / 128), f) != (size_t)ns * (D / 128))) {
            fprintf(stderr, "fp8_mma_fit: %s: truncated\n", argv[1]);
            return 1;
        }
        fclose(f);
    }
    printf("D %d records %d slots %d%s\n", D, nr, ns, v2 ? " (with the codes' exponents)" : "");
    /* p 12 or 13 (is the reported 13-bit width with the hidden bit?); g 0, 3 or 40 (40: the block's terms summed
     * exactly, then one truncation: "multi-term summation, single final rounding (RZ)") */
    mma_model ms[512];
    int nm = 0;
    static const int nbs[] = {32, 16}, ps[] = {13, 12}, gs[] = {0, 3, 40};
    for (int pi = 0; pi < 2; pi++)
        for (int bi = 0; bi < 2; bi++)
            for (int qi = 0; qi < 2; qi++)
                for (int var = 0; var < 16; var++)
                    for (int gi = 0; gi < 3; gi++) {
                        if ((var & 4) && (var & 1)) continue;
                        if (pi && nbs[bi] == 32) continue; /* perm only matters for blocks < 32 */
                        ms[nm++] = (mma_model){nbs[bi], ps[qi], var, gs[gi], pi};
                        if (v2 && (var & 8)) ms[nm++] = (mma_model){nbs[bi], ps[qi], var | 16, gs[gi], pi}; /* subnormal factors by field */
                    }
    for (int mi = 0; mi < nm; mi++) {
        int cnt[3][3] = {{0}}, tot[3] = {0};
        for (int r = 0; r < nr; r++) {
            const unsigned char *p = rec + rs * r;
            int32_t slot, set, og = 0, ou = 0;
            float rf[5];
            memcpy(&slot, p, 4), memcpy(&set, p + 4, 4), memcpy(rf, p + ro, 20);
            if (v2) memcpy(&og, p + 8, 4), memcpy(&ou, p + 12, 4);
            if (slot < 0 || slot >= ns || set < 0 || set > 2) {
                fprintf(stderr, "fp8_mma_fit: %s: record %d: slot %d / set %d out of range\n", argv[1], r, slot, set);
                return 1;
            }
            const float *wg = (const float *)(p + ro + 20), *wu = wg + D, *xq = xs + (size_t)slot * D;
            const int *xof = v2 ? xo + (size_t)slot * (D / 128) : NULL;
            float gv = mma_dot_off(xq, wg, D, ms[mi], xof, og), uv = mma_dot_off(xq, wu, D, ms[mi], xof, ou);
            float hv = swiglu(gv, uv, 10.0f, rf[0]);
            float em = dsv4_round_e4m3(fminf(fmaxf(hv / rf[1], -448.0f), 448.0f)) * rf[1], de = fabsf(em - rf[3]);
            int k = em == rf[3] ? 0 : (de <= 0.13f * fabsf(rf[3]) || de <= 1.0001f * rf[2]) ? 1 : 2;
            cnt[set][k]++, tot[set]++;
        }
        printf("nb %2d p %d var %d g %d perm %d: diff %d/%d/%d of %d  far %d/%d/%d of %d  ctrl %d/%d/%d of %d\n", ms[mi].nb, ms[mi].p,
               ms[mi].var, ms[mi].g, ms[mi].perm, cnt[0][0], cnt[0][1], cnt[0][2], tot[0], cnt[1][0], cnt[1][1], cnt[1][2], tot[1],
               cnt[2][0], cnt[2][1], cnt[2][2], tot[2]);
    }
    return 0;
}
