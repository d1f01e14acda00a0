/* forward_moe.c - the MoE sub-layer (spec 11): sqrt-softplus router with bias or hash selection,
 * routed SwiGLU experts grouped by expert (each expert's weights decoded once per call), shared
 * expert. Token results are accumulated in a fixed order (experts by id, then the shared expert),
 * so a token's output does not depend on the rest of the batch. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../cpu/ops.h"
#include "../cpu/topk.h"
#include "state.h"

#define ALLOC(n) malloc(sizeof(float) * (size_t)(n))

static float softplusf(float z) { return z > 20.0f ? z : log1pf(expf(z)); }

/* h = silu(min(g, lim)) * clamp(u, -lim, lim) * weight (spec 11 step 4); lim 0 = no clamp. */
static void swiglu(float *g, const float *u, int n, float lim, float weight) {
    for (int i = 0; i < n; i++) {
        float gi = g[i], ui = u[i];
        if (lim > 0) {
            gi = fminf(gi, lim);
            ui = fminf(fmaxf(ui, -lim), lim);
        }
        g[i] = gi / (1.0f + expf(-gi)) * ui * weight;
    }
}

int dsv4_moe_fwd(const dsv4_model *m, int L, const dsv4_batch *b, const float *x, float *out) {
    const dsv4_config *c = &m->cfg;
    const dsv4_layer *ly = &m->layers[L];
    const int T = b->T, D = c->dim, E = c->n_routed_experts, K = c->n_activated_experts, I = c->moe_inter_dim;
    float *s = ALLOC((size_t)T * E);
    int *eidx = malloc(sizeof(int) * (size_t)T * K);
    float *ew = ALLOC((size_t)T * K);
    float *bias_s = ALLOC(E);
    dsv4_cpu_linear(&ly->gate, x, T, s);
    for (int t = 0; t < T; t++) {
        float *st = s + (size_t)t * E;
        int *sel = eidx + (size_t)t * K;
        for (int e = 0; e < E; e++) st[e] = sqrtf(softplusf(st[e]));
        if (ly->hash) {
            memcpy(sel, ly->tid2eid + (size_t)b->tok[t] * K, sizeof(int) * (size_t)K);
        } else {
            for (int e = 0; e < E; e++) bias_s[e] = st[e] + ly->gate_bias[e];
            dsv4_topk_torch(bias_s, E, K, sel);
        }
        float sum = 0;
        for (int k = 0; k < K; k++) sum += st[sel[k]];
        for (int k = 0; k < K; k++) ew[(size_t)t * K + k] = st[sel[k]] / sum * c->route_scale;
    }

    memset(out, 0, sizeof(float) * (size_t)T * D);
    int *rows = malloc(sizeof(int) * (size_t)T);
    float *rw = ALLOC(T), *xe = ALLOC((size_t)T * D), *g = ALLOC((size_t)T * I), *u = ALLOC((size_t)T * I);
    float *ye = ALLOC((size_t)T * D);
    for (int e = 0; e < E; e++) {
        int ne = 0;
        for (int t = 0; t < T; t++)
            for (int k = 0; k < K; k++)
                if (eidx[(size_t)t * K + k] == e) {
                    rows[ne] = t;
                    rw[ne] = ew[(size_t)t * K + k];
                    memcpy(xe + (size_t)ne * D, x + (size_t)t * D, sizeof(float) * (size_t)D);
                    ne++;
                    break; /* an expert counts once per token (spec: duplicates summed once) */
                }
        if (!ne) continue;
        dsv4_cpu_linear(&ly->w1[e], xe, ne, g);
        dsv4_cpu_linear(&ly->w3[e], xe, ne, u);
        for (int i = 0; i < ne; i++) swiglu(g + (size_t)i * I, u + (size_t)i * I, I, c->swiglu_limit, rw[i]);
        dsv4_cpu_linear(&ly->w2[e], g, ne, ye);
        for (int i = 0; i < ne; i++) {
            float *o = out + (size_t)rows[i] * D;
            for (int d = 0; d < D; d++) o[d] += ye[(size_t)i * D + d];
        }
    }
    if (ly->has_shared) {
        dsv4_cpu_linear(&ly->sw1, x, T, g);
        dsv4_cpu_linear(&ly->sw3, x, T, u);
        for (int t = 0; t < T; t++) swiglu(g + (size_t)t * I, u + (size_t)t * I, I, c->swiglu_limit, 1.0f);
        dsv4_cpu_linear(&ly->sw2, g, T, ye);
        for (size_t i = 0; i < (size_t)T * D; i++) out[i] += ye[i];
    }
    free(bias_s), free(s), free(eidx), free(ew), free(rows), free(rw), free(xe), free(g), free(u), free(ye);
    return 0;
}
