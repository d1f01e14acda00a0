/* weight.c - see weight.h. */
#include "weight.h"

#include <string.h>

#include "formats.h"

/* Decode tables: one entry per code, built on first use (thread-safe: every thread writes the same
 * values, and a table is published by its flag only after it is complete). */
static float lut_e4m3[256], lut_e8m0[256];
static volatile int lut_ready;

static void lut_init(void) {
    if (lut_ready) return;
    for (int i = 0; i < 256; i++) {
        lut_e4m3[i] = dsv4_e4m3_to_f32((uint8_t)i);
        lut_e8m0[i] = dsv4_e8m0_to_f32((uint8_t)i);
    }
    __atomic_store_n(&lut_ready, 1, __ATOMIC_RELEASE);
}

const char *dsv4_wfmt_name(dsv4_wfmt f) {
    static const char *names[DSV4_WF_COUNT] = {"F32", "BF16", "F16", "FP8", "MXFP4", "NVFP4"};
    return (unsigned)f < DSV4_WF_COUNT ? names[f] : "?";
}

void dsv4_weight_row(const dsv4_weight *w, int r, float *out) {
    lut_init();
    int64_t R = (int64_t)w->row0 + r, C = w->cols;
    switch (w->fmt) {
    case DSV4_WF_F32:
        memcpy(out, w->data + R * C * 4, (size_t)C * 4);
        break;
    case DSV4_WF_BF16: {
        /* widen 16 -> 32 bits in blocks (the copy keeps the loads aligned and the loop vectorizable) */
        const uint8_t *p = w->data + R * C * 2;
        uint16_t h[256];
        uint32_t u[256];
        for (int64_t j0 = 0; j0 < C; j0 += 256) {
            int64_t n = C - j0 < 256 ? C - j0 : 256;
            memcpy(h, p + 2 * j0, (size_t)n * 2);
            for (int64_t j = 0; j < n; j++) u[j] = (uint32_t)h[j] << 16;
            memcpy(out + j0, u, (size_t)n * 4);
        }
        break;
    }
    case DSV4_WF_F16: {
        const uint8_t *p = w->data + R * C * 2;
        for (int64_t j = 0; j < C; j++) {
            uint16_t h;
            memcpy(&h, p + 2 * j, 2);
            out[j] = dsv4_f16_to_f32(h);
        }
        break;
    }
    case DSV4_WF_FP8: {
        const uint8_t *p = w->data + R * C;
        int64_t srow = R / 128;
        for (int64_t j0 = 0; j0 < C; j0 += 128) {
            float s;
            if (w->scale_f32) memcpy(&s, w->scale + 4 * (srow * w->scale_stride + j0 / 128), 4);
            else s = lut_e8m0[w->scale[srow * w->scale_stride + j0 / 128]];
            int64_t j1 = j0 + 128 < C ? j0 + 128 : C;
            for (int64_t j = j0; j < j1; j++) out[j] = lut_e4m3[p[j]] * s;
        }
        break;
    }
    case DSV4_WF_MXFP4:
    case DSV4_WF_NVFP4: {
        const uint8_t *p = w->data + R * (C / 2);
        int g = w->fmt == DSV4_WF_MXFP4 ? 32 : 16;
        const uint8_t *sr = w->scale + R * w->scale_stride;
        for (int64_t j0 = 0; j0 < C; j0 += g) {
            float s = w->fmt == DSV4_WF_MXFP4 ? lut_e8m0[sr[j0 / g]] : lut_e4m3[sr[j0 / g]] * w->scale2;
            for (int64_t j = j0; j < j0 + g && j < C; j += 2) {
                uint8_t b = p[j / 2];
                out[j] = dsv4_e2m1_to_f32(b & 15) * s;
                out[j + 1] = dsv4_e2m1_to_f32(b >> 4) * s;
            }
        }
        break;
    }
    default:
        memset(out, 0, (size_t)C * 4);
    }
}

uint64_t dsv4_weight_bytes(const dsv4_weight *w) {
    uint64_t R = (uint64_t)w->rows, C = (uint64_t)w->cols;
    switch (w->fmt) {
    case DSV4_WF_F32: return R * C * 4;
    case DSV4_WF_BF16:
    case DSV4_WF_F16: return R * C * 2;
    case DSV4_WF_FP8: return R * C + ((R + 127) / 128) * ((C + 127) / 128) * (w->scale_f32 ? 4 : 1);
    case DSV4_WF_MXFP4: return R * C / 2 + R * C / 32;
    case DSV4_WF_NVFP4: return R * C / 2 + R * C / 16 + 4;
    default: return 0;
    }
}

uint64_t dsv4_weight_scale_spread(const dsv4_weight *w, int block, uint64_t hist[DSV4_SPREAD_BINS]) {
    if (w->fmt != DSV4_WF_MXFP4 || !w->scale || block <= 0 || block % 32 || w->cols <= 0) return 0;
    const int ng = (w->cols + 31) / 32, gb = block / 32;
    uint64_t n = 0;
    for (int r = 0; r < w->rows; r++) {
        const uint8_t *sr = w->scale + (int64_t)(w->row0 + r) * w->scale_stride;
        for (int g0 = 0; g0 < ng; g0 += gb) {
            int lo = 255, hi = 0, nan = 0;
            for (int g = g0; g < g0 + gb && g < ng; g++) {
                nan |= sr[g] == 0xFF;
                lo = sr[g] < lo ? sr[g] : lo;
                hi = sr[g] > hi ? sr[g] : hi;
            }
            const int sp = nan ? DSV4_SPREAD_BINS - 1 : hi - lo;
            hist[sp < DSV4_SPREAD_BINS - 1 ? sp : DSV4_SPREAD_BINS - 1]++;
            n++;
        }
    }
    return n;
}
