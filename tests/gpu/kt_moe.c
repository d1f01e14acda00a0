/* kt_moe.c - test_kernels: the router, SwiGLU, the MoE grouping (exact), the grouped experts and combine in every
 * format, and the experts' batch invariance. */
#include "kt.h"
#include "fp8_mma_model.h"

/* ---- router, SwiGLU: twins copied from src/model/forward_moe.c (static there) ---- */

static float softplusf_ref(float z) { return z > 20.0f ? z : log1pf(expf(z)); }

/* the exponent of dsv4_act_quant_fp8's scale for a block whose largest |value| is amax: the power of two >= max(amax,
 * 1e-4) / 448 */
static int aq_exp(float amax) {
    int ex;
    const float m = frexpf(fmaxf(amax, 1e-4f) * (1.0f / 448.0f), &ex);
    return m == 0.5f ? ex - 1 : ex;
}

static void swiglu_ref(float *g, const float *u, int n, float lim, float weight) {
    for (int i = 0; i < n; i++) {
        float gi = g[i], ui = u[i];
        if (lim > 0) {
            gi = fminf(gi, lim);
            ui = fminf(fmaxf(ui, -lim), lim);
        }
        g[i] = gi / (1.0f + expf(-gi)) * ui * weight;
    }
}

static int cmp_pair(const void *a, const void *b) {
    const float *x = a, *y = b;
    return (x[0] > y[0]) - (x[0] < y[0]);
}

void test_router(int T, int E, int K, int hash) {
    const int V = 1000;
    float *lg = randn((size_t)T * E, 2.0f), *bias = randn(E, 0.1f);
    int *tok = malloc(sizeof(int) * T), *tid2eid = malloc(sizeof(int) * (size_t)V * K);
    for (int t = 0; t < T; t++) tok[t] = (int)(rnd_u32() % V);
    for (int i = 0; i < V * K; i++) tid2eid[i] = (int)(rnd_u32() % E);
    const float rsc = 1.5f;
    /* reference: (expert, weight) pairs sorted by expert, per token */
    float *ref = malloc(sizeof(float) * (size_t)T * K * 2), *got = malloc(sizeof(float) * (size_t)T * K * 2);
    float *st = malloc(sizeof(float) * E), *bs = malloc(sizeof(float) * E);
    int *sel = malloc(sizeof(int) * K);
    for (int t = 0; t < T; t++) {
        for (int e = 0; e < E; e++) st[e] = sqrtf(softplusf_ref(lg[(size_t)t * E + e]));
        if (hash) memcpy(sel, tid2eid + (size_t)tok[t] * K, sizeof(int) * K);
        else {
            for (int e = 0; e < E; e++) bs[e] = st[e] + bias[e];
            dsv4_topk_torch(bs, E, K, sel);
        }
        float sum = 0;
        for (int k = 0; k < K; k++) sum += st[sel[k]];
        for (int k = 0; k < K; k++) {
            ref[((size_t)t * K + k) * 2] = (float)sel[k];
            ref[((size_t)t * K + k) * 2 + 1] = st[sel[k]] / sum * rsc;
        }
        if (!hash) qsort(ref + (size_t)t * K * 2, K, 2 * sizeof(float), cmp_pair);
    }
    float *dlg = dup_to_dev(lg, sizeof(float) * (size_t)T * E), *db = dup_to_dev(bias, sizeof(float) * E),
          *dw = dsv4_cuda_alloc(sizeof(float) * (size_t)T * K);
    int *dtok = dup_to_dev(tok, sizeof(int) * T), *dt2e = dup_to_dev(tid2eid, sizeof(int) * (size_t)V * K),
        *dsel = dsv4_cuda_alloc(sizeof(int) * (size_t)T * K);
    op_ok(dsv4_cuda_router(dlg, T, E, K, db, hash ? dt2e : NULL, dtok, rsc, dsel, dw, NULL), "router");
    sync_ok();
    int *gsel = malloc(sizeof(int) * (size_t)T * K);
    float *gw = malloc(sizeof(float) * (size_t)T * K);
    from_dev(gsel, dsel, sizeof(int) * (size_t)T * K);
    from_dev(gw, dw, sizeof(float) * (size_t)T * K);
    for (int t = 0; t < T; t++) {
        for (int k = 0; k < K; k++) {
            got[((size_t)t * K + k) * 2] = (float)gsel[(size_t)t * K + k];
            got[((size_t)t * K + k) * 2 + 1] = gw[(size_t)t * K + k];
        }
        if (!hash) qsort(got + (size_t)t * K * 2, K, 2 * sizeof(float), cmp_pair);
    }
    char name[128];
    snprintf(name, sizeof name, "router%s T=%d E=%d K=%d (expert, weight)", hash ? " hash" : " bias-topk", T, E, K);
    check(name, got, ref, (size_t)T * K * 2, 1e-7, 1e-5);
    dsv4_cuda_free(dlg), dsv4_cuda_free(db), dsv4_cuda_free(dw), dsv4_cuda_free(dtok), dsv4_cuda_free(dt2e), dsv4_cuda_free(dsel);
    free(lg), free(bias), free(tok), free(tid2eid), free(ref), free(got), free(st), free(bs), free(sel), free(gsel), free(gw);
}

void test_swiglu(int T, int I, int ld, float lim, int weighted) {
    float *g = randn((size_t)T * ld, 6.0f), *u = randn((size_t)T * ld, 6.0f), *rw = weighted ? randn(T, 1.0f) : NULL;
    float *ref = malloc(sizeof(float) * (size_t)T * I), *got = malloc(sizeof(float) * (size_t)T * I);
    for (int t = 0; t < T; t++) {
        memcpy(ref + (size_t)t * I, g + (size_t)t * ld, sizeof(float) * I);
        swiglu_ref(ref + (size_t)t * I, u + (size_t)t * ld, I, lim, rw ? rw[t] : 1.0f);
    }
    float *dg = dup_to_dev(g, sizeof(float) * (size_t)T * ld), *du = dup_to_dev(u, sizeof(float) * (size_t)T * ld),
          *drw = rw ? dup_to_dev(rw, sizeof(float) * T) : NULL, *dout = dsv4_cuda_alloc(sizeof(float) * (size_t)T * I);
    op_ok(dsv4_cuda_swiglu(dg, du, ld, T, I, lim, drw, dout, NULL), "swiglu");
    sync_ok();
    from_dev(got, dout, sizeof(float) * (size_t)T * I);
    char name[128];
    snprintf(name, sizeof name, "swiglu T=%d I=%d ld=%d lim=%g%s", T, I, ld, lim, weighted ? " weighted" : "");
    check(name, got, ref, (size_t)T * I, 1e-6, 4e-6); /* expf: a few ulp apart */
    dsv4_cuda_free(dg), dsv4_cuda_free(du), dsv4_cuda_free(drw), dsv4_cuda_free(dout);
    free(g), free(u), free(rw), free(ref), free(got);
}

/* ---- MoE grouping (twin: the definition in cuda_model.h) ---- */

typedef struct {
    int nact, *act_e, *act_off, *act_cnt, *rows, *tslot;
    float *rw;
} hplan;

static int pick_used_ref(const int *sel, const int *sid, int t, int k, int K, int E) {
    if (sid[t] < 0) return -1;
    int e = sel[t * K + k];
    if (e < 0 || e >= E) return -1;
    for (int j = 0; j < k; j++)
        if (sel[t * K + j] == e) return -1;
    return e;
}

static void group_ref(const int *sel, const float *w, const int *sid, int T, int K, int E, hplan *p) {
    int *cnt = calloc((size_t)E, sizeof(int)), *base = calloc((size_t)E, sizeof(int)), *fill = calloc((size_t)E, sizeof(int));
    for (int t = 0; t < T; t++)
        for (int k = 0; k < K; k++) {
            int e = pick_used_ref(sel, sid, t, k, K, E);
            if (e >= 0) cnt[e]++;
        }
    p->nact = 0;
    for (int e = 0, o = 0; e < E; e++) {
        base[e] = o;
        if (cnt[e]) p->act_e[p->nact] = e, p->act_off[p->nact] = o, p->act_cnt[p->nact] = cnt[e], p->nact++;
        o += cnt[e];
    }
    for (int t = 0; t < T; t++) {
        int ns = 0, sl[64];
        for (int k = 0; k < K; k++) {
            int e = pick_used_ref(sel, sid, t, k, K, E);
            if (e < 0) continue;
            int slot = base[e] + fill[e]++;
            p->rows[slot] = t, p->rw[slot] = w[t * K + k];
            int i = ns++;
            while (i > 0 && sl[i - 1] > slot) sl[i] = sl[i - 1], i--;
            sl[i] = slot;
        }
        for (int k = 0; k < K; k++) p->tslot[t * K + k] = k < ns ? sl[k] : -1;
    }
    free(cnt), free(base), free(fill);
}

static hplan hplan_new(int T, int K, int E) {
    hplan p = {0, calloc(E, sizeof(int)), calloc(E, sizeof(int)), calloc(E, sizeof(int)), calloc((size_t)T * K, sizeof(int)),
               calloc((size_t)T * K, sizeof(int)), calloc((size_t)T * K, sizeof(float))};
    return p;
}
static void hplan_free(hplan *p) { free(p->act_e), free(p->act_off), free(p->act_cnt), free(p->rows), free(p->tslot), free(p->rw); }

dsv4_cuda_moe_plan dplan_new(int T, int K, int E) {
    dsv4_cuda_moe_plan p = {dsv4_cuda_alloc(sizeof(int)), dsv4_cuda_alloc(sizeof(int) * E), dsv4_cuda_alloc(sizeof(int) * E),
                            dsv4_cuda_alloc(sizeof(int) * E), dsv4_cuda_alloc(sizeof(int) * (size_t)T * K),
                            dsv4_cuda_alloc(sizeof(int) * (size_t)T * K), dsv4_cuda_alloc(sizeof(float) * (size_t)T * K), NULL};
    return p;
}
void dplan_free(dsv4_cuda_moe_plan *p) {
    dsv4_cuda_free(p->nact), dsv4_cuda_free(p->act_e), dsv4_cuda_free(p->act_off), dsv4_cuda_free(p->act_cnt);
    dsv4_cuda_free(p->rows), dsv4_cuda_free(p->tslot), dsv4_cuda_free(p->rw), dsv4_cuda_free(p->gcnt);
}

/* random picks: some repeated within a token, some out of range, some tokens idle */
static void rand_picks(int T, int K, int E, int *sel, float *w, int *sid) {
    for (int t = 0; t < T; t++) {
        sid[t] = rnd_uni() < 0.15f && T > 1 ? -1 : t;
        for (int k = 0; k < K; k++) {
            float u = rnd_uni();
            sel[t * K + k] = u < 0.05f ? -1 : u < 0.12f && k ? sel[t * K + k - 1] : (int)(rnd_u32() % (uint32_t)E);
            w[t * K + k] = 0.1f + rnd_uni();
        }
    }
}

/* the plan (and the picks) of dsv4_cuda_moe_route against dsv4_cuda_router then dsv4_cuda_moe_group, bitwise: nact,
 * the active lists, rows, weights, tslot, then sel and the router weights */
static float *plan_vec(const dsv4_cuda_moe_plan *dp, const int *dsel, const float *dw, int T, int K, int E, size_t *n) {
    hplan g = hplan_new(T, K, E);
    from_dev(&g.nact, dp->nact, sizeof(int));
    const int na = g.nact >= 0 && g.nact <= E ? g.nact : 0;
    from_dev(g.act_e, dp->act_e, sizeof(int) * na), from_dev(g.act_off, dp->act_off, sizeof(int) * na);
    from_dev(g.act_cnt, dp->act_cnt, sizeof(int) * na), from_dev(g.tslot, dp->tslot, sizeof(int) * (size_t)T * K);
    int ns = 0;
    for (int a = 0; a < na; a++) ns += g.act_cnt[a] > 0 && g.act_cnt[a] <= T ? g.act_cnt[a] : 0;
    if (ns > T * K) ns = T * K;
    from_dev(g.rows, dp->rows, sizeof(int) * ns), from_dev(g.rw, dp->rw, sizeof(float) * ns);
    int *sel = malloc(sizeof(int) * (size_t)T * K);
    float *w = malloc(sizeof(float) * (size_t)T * K);
    from_dev(sel, dsel, sizeof(int) * (size_t)T * K), from_dev(w, dw, sizeof(float) * (size_t)T * K);
    *n = 1 + 3 * (size_t)E + 2 * (size_t)T * K + 3 * (size_t)T * K;
    float *v = calloc(*n, sizeof(float));
    size_t o = 0;
    v[o++] = (float)g.nact;
    for (int a = 0; a < E; a++, o += 3)
        if (a < na) v[o] = (float)g.act_e[a], v[o + 1] = (float)g.act_off[a], v[o + 2] = (float)g.act_cnt[a];
    for (int i = 0; i < T * K; i++, o += 2)
        if (i < ns) v[o] = (float)g.rows[i], v[o + 1] = g.rw[i];
    for (int i = 0; i < T * K; i++) v[o++] = (float)g.tslot[i];
    for (int i = 0; i < T * K; i++) v[o++] = (float)sel[i], v[o++] = w[i];
    hplan_free(&g), free(sel), free(w);
    return v;
}

void test_moe_route(int T, int E, int K, int hash) {
    const int V = 1000;
    float *lg = randn((size_t)T * E, 2.0f), *bias = randn(E, 0.1f);
    int *tok = malloc(sizeof(int) * T), *tid2eid = malloc(sizeof(int) * (size_t)V * K), *sid = malloc(sizeof(int) * T);
    for (int t = 0; t < T; t++) tok[t] = (int)(rnd_u32() % V), sid[t] = rnd_uni() < 0.2f && T > 1 ? -1 : t;
    for (int i = 0; i < V * K; i++) tid2eid[i] = (int)(rnd_u32() % E);
    const float rsc = 2.5f;
    float *dlg = dup_to_dev(lg, sizeof(float) * (size_t)T * E), *db = dup_to_dev(bias, sizeof(float) * E);
    int *dtok = dup_to_dev(tok, sizeof(int) * T), *dt2e = dup_to_dev(tid2eid, sizeof(int) * (size_t)V * K),
        *dsid = dup_to_dev(sid, sizeof(int) * T);
    int *ds[2];
    float *dw[2];
    dsv4_cuda_moe_plan dp[2];
    for (int i = 0; i < 2; i++) {
        ds[i] = dsv4_cuda_alloc(sizeof(int) * (size_t)T * K), dw[i] = dsv4_cuda_alloc(sizeof(float) * (size_t)T * K);
        dp[i] = dplan_new(T, K, E);
    }
    op_ok(dsv4_cuda_router(dlg, T, E, K, hash ? NULL : db, hash ? dt2e : NULL, dtok, rsc, ds[0], dw[0], NULL), "router");
    op_ok(dsv4_cuda_moe_group(ds[0], dw[0], dsid, T, K, E, &dp[0], NULL), "moe_group");
    op_ok(dsv4_cuda_moe_route(dlg, T, E, K, hash ? NULL : db, hash ? dt2e : NULL, dtok, rsc, dsid, ds[1], dw[1], &dp[1], NULL),
          "moe_route");
    sync_ok();
    size_t n;
    float *vr = plan_vec(&dp[0], ds[0], dw[0], T, K, E, &n), *vg = plan_vec(&dp[1], ds[1], dw[1], T, K, E, &n);
    char name[128];
    snprintf(name, sizeof name, "moe_route%s T=%d E=%d K=%d = router + moe_group (bitwise)", hash ? " hash" : "", T, E, K);
    check(name, vg, vr, n, 0, 0);
    for (int i = 0; i < 2; i++) dsv4_cuda_free(ds[i]), dsv4_cuda_free(dw[i]), dplan_free(&dp[i]);
    dsv4_cuda_free(dlg), dsv4_cuda_free(db), dsv4_cuda_free(dtok), dsv4_cuda_free(dt2e), dsv4_cuda_free(dsid);
    free(lg), free(bias), free(tok), free(tid2eid), free(sid), free(vr), free(vg);
}

/* blocks: the plan with its gcnt scratch, so that groups of more than 2048 picks take the many-block kernels */
void test_moe_group(int T, int K, int E, int blocks) {
    int *sel = malloc(sizeof(int) * (size_t)T * K), *sid = malloc(sizeof(int) * T);
    float *w = malloc(sizeof(float) * (size_t)T * K);
    rand_picks(T, K, E, sel, w, sid);
    hplan r = hplan_new(T, K, E), g = hplan_new(T, K, E);
    group_ref(sel, w, sid, T, K, E, &r);
    int *dsel = dup_to_dev(sel, sizeof(int) * (size_t)T * K), *dsid = dup_to_dev(sid, sizeof(int) * T);
    float *dw = dup_to_dev(w, sizeof(float) * (size_t)T * K);
    dsv4_cuda_moe_plan dp = dplan_new(T, K, E);
    if (blocks) dp.gcnt = dsv4_cuda_alloc(sizeof(int) * DSV4_MOE_GROUP_GCNT(T, E));
    op_ok(dsv4_cuda_moe_group(dsel, dw, dsid, T, K, E, &dp, NULL), "moe_group");
    sync_ok();
    from_dev(&g.nact, dp.nact, sizeof(int));
    int na = g.nact >= 0 && g.nact <= E ? g.nact : 0, ns = 0;
    from_dev(g.act_e, dp.act_e, sizeof(int) * na), from_dev(g.act_off, dp.act_off, sizeof(int) * na);
    from_dev(g.act_cnt, dp.act_cnt, sizeof(int) * na), from_dev(g.tslot, dp.tslot, sizeof(int) * (size_t)T * K);
    for (int a = 0; a < r.nact; a++) ns += r.act_cnt[a];
    from_dev(g.rows, dp.rows, sizeof(int) * ns), from_dev(g.rw, dp.rw, sizeof(float) * ns);
    /* everything as one float vector: nact, the active lists, rows, weights, tslot */
    size_t n = 1 + 3 * (size_t)E + 2 * (size_t)ns + (size_t)T * K, o = 0;
    float *vr = calloc(n, sizeof(float)), *vg = calloc(n, sizeof(float));
    vr[o] = (float)r.nact, vg[o++] = (float)g.nact;
    for (int a = 0; a < E; a++, o += 3) {
        if (a < r.nact) vr[o] = (float)r.act_e[a], vr[o + 1] = (float)r.act_off[a], vr[o + 2] = (float)r.act_cnt[a];
        if (a < na) vg[o] = (float)g.act_e[a], vg[o + 1] = (float)g.act_off[a], vg[o + 2] = (float)g.act_cnt[a];
    }
    for (int i = 0; i < ns; i++, o += 2) vr[o] = (float)r.rows[i], vr[o + 1] = r.rw[i], vg[o] = (float)g.rows[i], vg[o + 1] = g.rw[i];
    for (int i = 0; i < T * K; i++, o++) vr[o] = (float)r.tslot[i], vg[o] = (float)g.tslot[i];
    char name[128];
    snprintf(name, sizeof name, "moe_group T=%d K=%d E=%d (%d active, exact)%s", T, K, E, r.nact,
             blocks && T * K > 2048 ? " many blocks" : "");
    check(name, vg, vr, n, 0, 0);
    dsv4_cuda_free(dsel), dsv4_cuda_free(dsid), dsv4_cuda_free(dw), dplan_free(&dp);
    hplan_free(&r), hplan_free(&g), free(sel), free(sid), free(w), free(vr), free(vg);
}

/* moe_combine, one column a thread and four, against the CPU's order (each token's slots in order up to the first -1,
 * fp32 additions, then + shared): bitwise. Slots: a random number of distinct ascending ones a token, -1 after. */
void test_moe_combine(int T, int K, int D, int with_shared) {
    const int S = T * K;
    float *y = randn((size_t)S * D, 1.0f), *sh = randn((size_t)T * D, 0.5f), *ref = malloc(sizeof(float) * (size_t)T * D),
          *got = malloc(sizeof(float) * (size_t)T * D);
    int *ts = malloc(sizeof(int) * (size_t)S);
    for (int t = 0; t < T; t++) {
        const int n = (int)(rnd_u32() % (uint32_t)(K + 1));
        int last = -1;
        for (int k = 0; k < K; k++) {
            if (k < n) last += 1 + (int)(rnd_u32() % (uint32_t)((S - 1 - last) / (n - k) > 1 ? (S - 1 - last) / (n - k) : 1));
            ts[t * K + k] = k < n ? last : -1;
        }
        for (int d = 0; d < D; d++) {
            float a = 0.0f;
            for (int k = 0; k < K && ts[t * K + k] >= 0; k++) a += y[(size_t)ts[t * K + k] * D + d];
            ref[(size_t)t * D + d] = with_shared ? a + sh[(size_t)t * D + d] : a;
        }
    }
    float *dy = dup_to_dev(y, sizeof(float) * (size_t)S * D), *dsh = dup_to_dev(sh, sizeof(float) * (size_t)T * D),
          *dout = dsv4_cuda_alloc(sizeof(float) * (size_t)T * D);
    int *dts = dup_to_dev(ts, sizeof(int) * (size_t)S);
    for (int vec = 0; vec < 2; vec++) {
        dsv4_cuda_moe_combine_vec(vec);
        op_ok(dsv4_cuda_moe_combine(dy, dts, T, K, D, with_shared ? dsh : NULL, dout, NULL), "moe_combine");
        sync_ok();
        from_dev(got, dout, sizeof(float) * (size_t)T * D);
        char name[128];
        snprintf(name, sizeof name, "moe_combine T=%d K=%d D=%d%s, %s", T, K, D, with_shared ? " + shared" : "",
                 vec && D % 4 == 0 ? "four columns a thread" : "a column a thread");
        check_same(name, got, ref, (size_t)T * D);
    }
    dsv4_cuda_moe_combine_vec(-1);
    dsv4_cuda_free(dy), dsv4_cuda_free(dsh), dsv4_cuda_free(dout), dsv4_cuda_free(dts);
    free(y), free(sh), free(ref), free(got), free(ts);
}

/* Flash's 256 and Pro's 384 experts take a whole 4096-token group (the token bitmaps and one prefix count per 4 bitmap
 * words fit in shared memory), exact at Pro's 4096; 640 experts: the largest group that fits (forward_cuda.c splits a
 * pass into groups of at most that many tokens), exact there, and a clean error one group size past it. */
void test_moe_group_limit(void) {
    const int gmax = dsv4_cuda_moe_group_maxt(6, 640), gpro = dsv4_cuda_moe_group_maxt(6, 384),
              gflash = dsv4_cuda_moe_group_maxt(6, 256);
    const int ok = gmax >= 2048 && gmax < DSV4_MOE_GROUP_MAXT && gmax % 32 == 0 && gpro == DSV4_MOE_GROUP_MAXT &&
                   gflash == DSV4_MOE_GROUP_MAXT;
    g_checks++, g_fail += !ok;
    printf("%-4s moe_group_maxt: %d tokens for 640 experts, %d for 384, %d for 256%s\n", ok ? "ok" : "FAIL", gmax, gpro, gflash,
           ok ? "" : " <<<");
    if (!ok || gmax + 32 > DSV4_MOE_GROUP_MAXT) return;
    test_moe_group(DSV4_MOE_GROUP_MAXT, 6, 384, 0);
    test_moe_group(gmax, 6, 640, 0);
    const int T = gmax + 32, K = 6, E = 640;
    int *sel = malloc(sizeof(int) * (size_t)T * K), *sid = malloc(sizeof(int) * T);
    float *w = malloc(sizeof(float) * (size_t)T * K);
    rand_picks(T, K, E, sel, w, sid);
    int *dsel = dup_to_dev(sel, sizeof(int) * (size_t)T * K), *dsid = dup_to_dev(sid, sizeof(int) * T);
    float *dw = dup_to_dev(w, sizeof(float) * (size_t)T * K);
    dsv4_cuda_moe_plan dp = dplan_new(T, K, E);
    const int rc = dsv4_cuda_moe_group(dsel, dw, dsid, T, K, E, &dp, NULL);
    const char *msg = dsv4_cuda_last_error();
    const int clean = rc != 0 && msg && strstr(msg, "do not fit");
    sync_ok();
    g_checks++, g_fail += !clean;
    printf("%-4s moe_group T=%d E=%d refused: %s%s\n", clean ? "ok" : "FAIL", T, E, msg ? msg : "(no message)", clean ? "" : " <<<");
    dsv4_cuda_free(dsel), dsv4_cuda_free(dsid), dsv4_cuda_free(dw), dplan_free(&dp), free(sel), free(sid), free(w);
}

/* ---- grouped experts + combine (twin: per token, its distinct experts in increasing id:
 * SwiGLU(x w1, x w3) * weight, then w2, summed; then + shared) ---- */

/* ab: the weights have act_bf16 (BF16 activations): the twin rounds x and h to bf16 before their products */
void test_moe_experts(const char *tag, dsv4_wfmt f13, dsv4_wfmt f2, int aq, int ab, int T, int K, int E, int D, int I) {
    const float lim = 10.0f;
    hweight *h1 = malloc(sizeof(hweight) * E), *h3 = malloc(sizeof(hweight) * E), *h2 = malloc(sizeof(hweight) * E);
    dsv4_cuda_weight *d1 = malloc(sizeof(dsv4_cuda_weight) * E), *d3 = malloc(sizeof(dsv4_cuda_weight) * E),
                     *d2 = malloc(sizeof(dsv4_cuda_weight) * E);
    for (int e = 0; e < E; e++) {
        h1[e] = make_weight(f13, I, D, 0, aq), h3[e] = make_weight(f13, I, D, 0, aq), h2[e] = make_weight(f2, D, I, 0, aq);
        op_ok(dsv4_cuda_weight_upload(&h1[e].w, &d1[e]), "upload");
        op_ok(dsv4_cuda_weight_upload(&h3[e].w, &d3[e]), "upload");
        op_ok(dsv4_cuda_weight_upload(&h2[e].w, &d2[e]), "upload");
        d1[e].act_bf16 = d3[e].act_bf16 = d2[e].act_bf16 = ab;
    }
    dsv4_cuda_experts ex;
    op_ok(dsv4_cuda_experts_init(&ex, d1, d3, d2, E), "experts_init");
    int *sel = malloc(sizeof(int) * (size_t)T * K), *sid = malloc(sizeof(int) * T);
    float *w = malloc(sizeof(float) * (size_t)T * K), *x = randn((size_t)T * D, 1.0f), *sh = randn((size_t)T * D, 0.5f);
    rand_picks(T, K, E, sel, w, sid);
    int *dsel = dup_to_dev(sel, sizeof(int) * (size_t)T * K), *dsid = dup_to_dev(sid, sizeof(int) * T);
    float *dw = dup_to_dev(w, sizeof(float) * (size_t)T * K), *dx = dup_to_dev(x, sizeof(float) * (size_t)T * D),
          *dsh = dup_to_dev(sh, sizeof(float) * (size_t)T * D), *dh = dsv4_cuda_alloc(sizeof(float) * (size_t)T * K * I),
          *dy = dsv4_cuda_alloc(sizeof(float) * (size_t)T * K * D), *dout = dsv4_cuda_alloc(sizeof(float) * (size_t)T * D);
    dsv4_cuda_moe_plan dp = dplan_new(T, K, E);
    op_ok(dsv4_cuda_moe_group(dsel, dw, dsid, T, K, E, &dp, NULL), "moe_group");
    op_ok(dsv4_cuda_moe_experts(&ex, dx, T, K, &dp, lim, dh, dy, NULL), "moe_experts");
    op_ok(dsv4_cuda_moe_combine(dy, dp.tslot, T, K, D, dsh, dout, NULL), "moe_combine");
    sync_ok();
    float *ref = malloc(sizeof(float) * (size_t)T * D), *got = malloc(sizeof(float) * (size_t)T * D);
    from_dev(got, dout, sizeof(float) * (size_t)T * D);
    char name[160];
    snprintf(name, sizeof name, "moe_experts %s %s/%s%s%s T=%d K=%d E=%d D=%d I=%d (%s path)", tag, dsv4_wfmt_name(f13),
             dsv4_wfmt_name(f2), aq ? " aq" : "", ab ? " act:bf16" : "", T, K, E, D, I, ex.vec13 && ex.vec2 ? "vector" : "element");
    /* reference */
    float *g = malloc(sizeof(float) * I), *u = malloc(sizeof(float) * I), *y = malloc(sizeof(float) * D);
    if (!ab && !aq) { /* nothing rounded between the two projections: the twin's own h */
        for (int t = 0; t < T; t++) {
            float *o = ref + (size_t)t * D;
            memset(o, 0, sizeof(float) * D);
            for (int e = 0; e < E; e++) {
                int k = 0;
                for (; k < K; k++)
                    if (pick_used_ref(sel, sid, t, k, K, E) == e) break;
                if (k == K) continue;
                dsv4_cpu_linear(&h1[e].w, x + (size_t)t * D, 1, g);
                dsv4_cpu_linear(&h3[e].w, x + (size_t)t * D, 1, u);
                swiglu_ref(g, u, I, lim, w[t * K + k]);
                dsv4_cpu_linear(&h2[e].w, g, 1, y);
                for (int d = 0; d < D; d++) o[d] += y[d];
            }
            for (int d = 0; d < D; d++) o[d] += sh[(size_t)t * D + d];
        }
    } else if (aq) {
        /* FP8 act quant (x and h quantized in blocks of 128 before their products): the down projection's twin
         * quantizes the device's h, not its own, which may sit on the other side of an e4m3 rounding boundary (a whole
         * step on one term: 3.5 on an output of 1215, 1.3x the bar, once the inputs changed in session 4). With 16 or
         * more rows per expert the device replaces h by its codes in place, so h comes from each token run alone (T = 1:
         * h stays fp32; the experts are batch invariant, so it is the batch's h bit for bit) and is checked against the
         * twin's own h. Each token's experts in increasing id, as the combine sums them. */
        hplan r = hplan_new(1, K, E);
        dsv4_cuda_moe_plan p1 = dplan_new(1, K, E);
        int *ds1 = dsv4_cuda_alloc(sizeof(int) * K), *di1 = dsv4_cuda_alloc(sizeof(int));
        float *dw1 = dsv4_cuda_alloc(sizeof(float) * K), *dh1 = dsv4_cuda_alloc(sizeof(float) * (size_t)K * I),
              *dy1 = dsv4_cuda_alloc(sizeof(float) * (size_t)K * D);
        float *h1g = malloc(sizeof(float) * (size_t)K * I), *hg = malloc(sizeof(float) * ((size_t)T * K * I + 1)),
              *hr = malloc(sizeof(float) * ((size_t)T * K * I + 1));
        size_t nh = 0;
        for (int t = 0; t < T; t++) {
            float *o = ref + (size_t)t * D;
            memset(o, 0, sizeof(float) * D);
            group_ref(sel + (size_t)t * K, w + (size_t)t * K, sid + t, 1, K, E, &r);
            if (r.nact) {
                op_ok(dsv4_cuda_upload(ds1, sel + (size_t)t * K, sizeof(int) * K) || dsv4_cuda_upload(di1, sid + t, sizeof(int)) ||
                          dsv4_cuda_upload(dw1, w + (size_t)t * K, sizeof(float) * K),
                      "upload");
                op_ok(dsv4_cuda_moe_group(ds1, dw1, di1, 1, K, E, &p1, NULL), "moe_group");
                op_ok(dsv4_cuda_moe_experts(&ex, dx + (size_t)t * D, 1, K, &p1, lim, dh1, dy1, NULL), "moe_experts");
                sync_ok();
                from_dev(h1g, dh1, sizeof(float) * (size_t)r.nact * I);
            }
            for (int a = 0; a < r.nact; a++) {
                const int e = r.act_e[a], i = r.act_off[a];
                float *hi = hr + nh * I;
                dsv4_cpu_linear(&h1[e].w, x + (size_t)t * D, 1, hi);
                dsv4_cpu_linear(&h3[e].w, x + (size_t)t * D, 1, u);
                swiglu_ref(hi, u, I, lim, r.rw[i]);
                memcpy(hg + nh * I, h1g + (size_t)i * I, sizeof(float) * I);
                dsv4_cpu_linear(&h2[e].w, h1g + (size_t)i * I, 1, y);
                for (int d = 0; d < D; d++) o[d] += y[d];
                nh++;
            }
            for (int d = 0; d < D; d++) o[d] += sh[(size_t)t * D + d];
        }
        if (nh) {
            char hname[176];
            snprintf(hname, sizeof hname, "%s h", name);
            check(hname, hg, hr, nh * I, 2e-4 * rms(hr, nh * I), 2e-4);
        }
        hplan_free(&r), dplan_free(&p1), free(h1g), free(hg), free(hr);
        dsv4_cuda_free(ds1), dsv4_cuda_free(di1), dsv4_cuda_free(dw1), dsv4_cuda_free(dh1), dsv4_cuda_free(dy1);
    } else {
        /* BF16 activations: x and h rounded to bf16 before their products. h is checked on its own, and the down
         * projection's twin rounds the device's h (the twin's own h may sit on the other side of a bf16 rounding
         * boundary: a whole bf16 step on one term). Slots from group_ref (test_moe_group: equal to the device's);
         * each token's experts in increasing id, as the combine sums them. */
        hplan r = hplan_new(T, K, E);
        group_ref(sel, w, sid, T, K, E, &r);
        int ns = 0;
        for (int a = 0; a < r.nact; a++) ns += r.act_cnt[a];
        float *xr = malloc(sizeof(float) * (size_t)T * D), *hg = malloc(sizeof(float) * ((size_t)ns * I + 1)),
              *hr = malloc(sizeof(float) * ((size_t)ns * I + 1));
        memcpy(xr, x, sizeof(float) * (size_t)T * D);
        if (!aq) round_bf16(xr, (size_t)T * D);
        from_dev(hg, dh, sizeof(float) * (size_t)ns * I);
        memset(ref, 0, sizeof(float) * (size_t)T * D);
        for (int a = 0; a < r.nact; a++)
            for (int i = r.act_off[a]; i < r.act_off[a] + r.act_cnt[a]; i++) {
                const int e = r.act_e[a], t = r.rows[i];
                float *hi = hr + (size_t)i * I;
                dsv4_cpu_linear(&h1[e].w, xr + (size_t)t * D, 1, hi);
                dsv4_cpu_linear(&h3[e].w, xr + (size_t)t * D, 1, u);
                swiglu_ref(hi, u, I, lim, r.rw[i]);
                memcpy(g, hg + (size_t)i * I, sizeof(float) * I);
                if (!aq) round_bf16(g, (size_t)I);
                dsv4_cpu_linear(&h2[e].w, g, 1, y);
                for (int d = 0; d < D; d++) ref[(size_t)t * D + d] += y[d];
            }
        for (size_t i = 0; i < (size_t)T * D; i++) ref[i] += sh[i];
        char hname[176];
        snprintf(hname, sizeof hname, "%s h", name);
        check(hname, hg, hr, (size_t)ns * I, 2e-4 * rms(hr, (size_t)ns * I), 2e-4);
        hplan_free(&r), free(xr), free(hg), free(hr);
    }
    check(name, got, ref, (size_t)T * D, 2e-4 * rms(ref, (size_t)T * D), 2e-4);
    dsv4_cuda_experts_free(&ex);
    for (int e = 0; e < E; e++) {
        dsv4_cuda_weight_free(&d1[e]), dsv4_cuda_weight_free(&d3[e]), dsv4_cuda_weight_free(&d2[e]);
        free_hweight(&h1[e]), free_hweight(&h3[e]), free_hweight(&h2[e]);
    }
    dsv4_cuda_free(dsel), dsv4_cuda_free(dsid), dsv4_cuda_free(dw), dsv4_cuda_free(dx), dsv4_cuda_free(dsh);
    dsv4_cuda_free(dh), dsv4_cuda_free(dy), dsv4_cuda_free(dout), dplan_free(&dp);
    free(h1), free(h3), free(h2), free(d1), free(d3), free(d2), free(sel), free(sid), free(w), free(x), free(sh);
    free(ref), free(got), free(g), free(u), free(y);
}

/* up to `most` busy tokens, spread over the batch of T, each through group, experts and combine alone (T = 1): how many
 * give bitwise the row `batch` holds for them; *tried: how many were run */
static int tokens_alone(dsv4_cuda_experts *ex, const int *sid, const int *dsel, const float *dw, const float *dx, int T, int K, int E,
                        int D, float lim, int most, dsv4_cuda_moe_plan *dp, float *dh, float *dy, float *dout, const float *batch,
                        int *tried) {
    float *one = malloc(sizeof(float) * D);
    int nt = 0, same = 0;
    for (int t = 0; t < T && nt < most; t += T / most > 0 ? T / most : 1) {
        if (sid[t] < 0) continue;
        int s0 = 0, *dsid1 = dup_to_dev(&s0, sizeof(int));
        op_ok(dsv4_cuda_moe_group(dsel + (size_t)t * K, dw + (size_t)t * K, dsid1, 1, K, E, dp, NULL), "moe_group");
        op_ok(dsv4_cuda_moe_experts(ex, dx + (size_t)t * D, 1, K, dp, lim, dh, dy, NULL), "moe_experts");
        op_ok(dsv4_cuda_moe_combine(dy, dp->tslot, 1, K, D, NULL, dout, NULL), "moe_combine");
        sync_ok();
        from_dev(one, dout, sizeof(float) * D);
        same += memcmp(one, batch + (size_t)t * D, sizeof(float) * D) == 0;
        dsv4_cuda_free(dsid1);
        nt++;
    }
    free(one);
    *tried = nt;
    return same;
}

/* Batch invariance of the grouped experts: token t's output row is bitwise the same in the batch of T tokens
 * (other tokens, other experts active, the 64-token pre-quantized path when T*K >= 16*E with act quant) as
 * alone (T = 1), and on a rerun of the batch. */
void test_moe_invariant(const char *tag, dsv4_wfmt f, int aq, int T, int K, int E, int D, int I) {
    const float lim = 10.0f;
    dsv4_cuda_weight *d1 = malloc(sizeof(dsv4_cuda_weight) * E), *d3 = malloc(sizeof(dsv4_cuda_weight) * E),
                     *d2 = malloc(sizeof(dsv4_cuda_weight) * E);
    for (int e = 0; e < E; e++) {
        hweight a = make_weight(f, I, D, 0, aq), b = make_weight(f, I, D, 0, aq), c = make_weight(f, D, I, 0, aq);
        op_ok(dsv4_cuda_weight_upload(&a.w, &d1[e]), "upload");
        op_ok(dsv4_cuda_weight_upload(&b.w, &d3[e]), "upload");
        op_ok(dsv4_cuda_weight_upload(&c.w, &d2[e]), "upload");
        free_hweight(&a), free_hweight(&b), free_hweight(&c);
    }
    dsv4_cuda_experts ex;
    op_ok(dsv4_cuda_experts_init(&ex, d1, d3, d2, E), "experts_init");
    int *sel = malloc(sizeof(int) * (size_t)T * K), *sid = malloc(sizeof(int) * T);
    float *w = malloc(sizeof(float) * (size_t)T * K), *x = rand_wide((size_t)T * D);
    rand_picks(T, K, E, sel, w, sid);
    int *dsel = dup_to_dev(sel, sizeof(int) * (size_t)T * K), *dsid = dup_to_dev(sid, sizeof(int) * T);
    float *dw = dup_to_dev(w, sizeof(float) * (size_t)T * K), *dx = dup_to_dev(x, sizeof(float) * (size_t)T * D),
          *dh = dsv4_cuda_alloc(sizeof(float) * (size_t)T * K * I), *dy = dsv4_cuda_alloc(sizeof(float) * (size_t)T * K * D),
          *dout = dsv4_cuda_alloc(sizeof(float) * (size_t)T * D);
    float *b1 = malloc(sizeof(float) * (size_t)T * D), *b2 = malloc(sizeof(float) * (size_t)T * D);
    dsv4_cuda_moe_plan dp = dplan_new(T, K, E);
    for (int rep = 0; rep < 2; rep++) {
        op_ok(dsv4_cuda_moe_group(dsel, dw, dsid, T, K, E, &dp, NULL), "moe_group");
        op_ok(dsv4_cuda_moe_experts(&ex, dx, T, K, &dp, lim, dh, dy, NULL), "moe_experts");
        op_ok(dsv4_cuda_moe_combine(dy, dp.tslot, T, K, D, NULL, dout, NULL), "moe_combine");
        sync_ok();
        from_dev(rep ? b2 : b1, dout, sizeof(float) * (size_t)T * D);
    }
    char name[160];
    snprintf(name, sizeof name, "moe_experts %s %s%s T=%d K=%d E=%d rerun (bitwise)", tag, dsv4_wfmt_name(f), aq ? " aq" : "", T, K, E);
    check(name, b2, b1, (size_t)T * D, 0, 0);
    /* the register-buffer kernels (also the prefill before moe_pf2_kernel) give the same bits */
    dsv4_cuda_moe_experts_path(DSV4_MOE_TC_LEGACY);
    op_ok(dsv4_cuda_moe_group(dsel, dw, dsid, T, K, E, &dp, NULL), "moe_group");
    op_ok(dsv4_cuda_moe_experts(&ex, dx, T, K, &dp, lim, dh, dy, NULL), "moe_experts");
    op_ok(dsv4_cuda_moe_combine(dy, dp.tslot, T, K, D, NULL, dout, NULL), "moe_combine");
    sync_ok();
    dsv4_cuda_moe_experts_path(0);
    from_dev(b2, dout, sizeof(float) * (size_t)T * D);
    snprintf(name, sizeof name, "moe_experts %s %s%s T=%d K=%d E=%d register kernels == default (bitwise)", tag, dsv4_wfmt_name(f),
             aq ? " aq" : "", T, K, E);
    check(name, b2, b1, (size_t)T * D, 0, 0);
    /* up to 8 busy tokens spread over the batch, each alone */
    int nt = 0;
    const int same = tokens_alone(&ex, sid, dsel, dw, dx, T, K, E, D, lim, 8, &dp, dh, dy, dout, b1, &nt), bad = nt - same;
    g_checks++;
    if (bad) g_fail++;
    printf("%-4s moe_experts %s %s%s T=%d K=%d E=%d D=%d I=%d: %d tokens alone == in the batch (bitwise)%s\n", bad ? "FAIL" : "ok",
           tag, dsv4_wfmt_name(f), aq ? " aq" : "", T, K, E, D, I, nt - bad, bad ? " <<<" : "");
    dsv4_cuda_experts_free(&ex);
    for (int e = 0; e < E; e++) dsv4_cuda_weight_free(&d1[e]), dsv4_cuda_weight_free(&d3[e]), dsv4_cuda_weight_free(&d2[e]);
    dsv4_cuda_free(dsel), dsv4_cuda_free(dsid), dsv4_cuda_free(dw), dsv4_cuda_free(dx), dsv4_cuda_free(dh), dsv4_cuda_free(dy);
    dsv4_cuda_free(dout), dplan_free(&dp);
    free(d1), free(d3), free(d2), free(sel), free(sid), free(w), free(x), free(b1), free(b2);
}

/* E random MXFP4 (or NVFP4: fmt) experts with act quant (w1, w3 [I, D], w2 [D, I]; each expert's three drawn in that
 * order), kept on the host for the CPU twin and uploaded as one set; big: some scales of expert 0 above 2^1 (MXFP4), or
 * at E4M3's ends (NVFP4: 448, the subnormal 2^-9, 0, the smallest normal 2^-6); big 2 (NVFP4): every scale of expert
 * 0's w1 an E4M3 subnormal (2^-9 x 1, 3, 5, 7) and of its w2 near 448, scale2 compensating so that the outputs depend
 * on those decodes alone at ordinary magnitudes (test_moe_pfb) */
typedef struct {
    hweight *h1, *h3, *h2;
    dsv4_cuda_weight *d1, *d3, *d2;
    dsv4_cuda_experts ex;
    int E;
} mx_set;
static mx_set mx_set_new(dsv4_wfmt fmt, int E, int D, int I, int big) {
    mx_set m = {malloc(sizeof(hweight) * E), malloc(sizeof(hweight) * E), malloc(sizeof(hweight) * E), malloc(sizeof(dsv4_cuda_weight) * E),
                malloc(sizeof(dsv4_cuda_weight) * E), malloc(sizeof(dsv4_cuda_weight) * E), {0}, E};
    for (int e = 0; e < E; e++) {
        m.h1[e] = make_weight(fmt, I, D, 0, 1), m.h3[e] = make_weight(fmt, I, D, 0, 1);
        m.h2[e] = make_weight(fmt, D, I, 0, 1);
        if (big == 2 && e == 0 && fmt == DSV4_WF_NVFP4) {
            static const uint8_t sub[4] = {0x01, 0x03, 0x05, 0x07}, top[4] = {0x7E, 0x7D, 0x7C, 0x7B};
            for (size_t i = 0; i < m.h1[e].scale_b; i++) m.h1[e].scale[i] = sub[i % 4];
            for (size_t i = 0; i < m.h2[e].scale_b; i++) m.h2[e].scale[i] = top[(i / 3) % 4];
            m.h1[e].w.scale2 *= 1024.0f, m.h2[e].w.scale2 /= 512.0f;
        } else if (big && e == 0 && fmt == DSV4_WF_NVFP4) {
            static const uint8_t ends[5] = {0x7E, 0x01, 0x00, 0x08, 0x30};
            for (size_t i = 0; i < m.h1[e].scale_b; i += 3) m.h1[e].scale[i] = ends[i % 5];
            for (size_t i = 1; i < m.h2[e].scale_b; i += 3) m.h2[e].scale[i] = ends[i % 5];
        } else if (big && e == 0)
            for (size_t i = 0; i < m.h1[e].scale_b; i += 3) m.h1[e].scale[i] = (uint8_t)(126 + i % 9), m.h2[e].scale[i % m.h2[e].scale_b] = 131;
        op_ok(dsv4_cuda_weight_upload(&m.h1[e].w, &m.d1[e]), "upload");
        op_ok(dsv4_cuda_weight_upload(&m.h3[e].w, &m.d3[e]), "upload");
        op_ok(dsv4_cuda_weight_upload(&m.h2[e].w, &m.d2[e]), "upload");
    }
    op_ok(dsv4_cuda_experts_init(&m.ex, m.d1, m.d3, m.d2, E), "experts_init");
    return m;
}
static void mx_set_free(mx_set *m) {
    dsv4_cuda_experts_free(&m->ex);
    for (int e = 0; e < m->E; e++) {
        dsv4_cuda_weight_free(&m->d1[e]), dsv4_cuda_weight_free(&m->d3[e]), dsv4_cuda_weight_free(&m->d2[e]);
        free_hweight(&m->h1[e]), free_hweight(&m->h3[e]), free_hweight(&m->h2[e]);
    }
    free(m->h1), free(m->h3), free(m->h2), free(m->d1), free(m->d3), free(m->d2);
}

/* A random routed batch of T tokens for E experts of width D, I: x (drawn first) and the picks, their weights and the
 * idle marks (rand_picks), on the host and the device, with the device's h [T K, I], y [T K, D] and out [T, D] */
typedef struct {
    int *sel, *sid, *dsel, *dsid;
    float *w, *x, *dw, *dx, *dh, *dy, *dout;
} mx_batch;
static mx_batch mx_batch_new(int T, int K, int E, int D, int I) {
    mx_batch b;
    b.sel = malloc(sizeof(int) * (size_t)T * K), b.sid = malloc(sizeof(int) * T);
    b.w = malloc(sizeof(float) * (size_t)T * K), b.x = randn((size_t)T * D, 1.0f);
    rand_picks(T, K, E, b.sel, b.w, b.sid);
    b.dsel = dup_to_dev(b.sel, sizeof(int) * (size_t)T * K), b.dsid = dup_to_dev(b.sid, sizeof(int) * T);
    b.dw = dup_to_dev(b.w, sizeof(float) * (size_t)T * K), b.dx = dup_to_dev(b.x, sizeof(float) * (size_t)T * D);
    b.dh = dsv4_cuda_alloc(sizeof(float) * (size_t)T * K * I), b.dy = dsv4_cuda_alloc(sizeof(float) * (size_t)T * K * D);
    b.dout = dsv4_cuda_alloc(sizeof(float) * (size_t)T * D);
    return b;
}
static void mx_batch_free(mx_batch *b) {
    dsv4_cuda_free(b->dsel), dsv4_cuda_free(b->dsid), dsv4_cuda_free(b->dw), dsv4_cuda_free(b->dx), dsv4_cuda_free(b->dh);
    dsv4_cuda_free(b->dy), dsv4_cuda_free(b->dout);
    free(b->sel), free(b->sid), free(b->w), free(b->x);
}

/* The decode FP8 experts' (moe_f8.cuh) gate or up sum of one row, emulated: per 32-column group a fresh k32 block of
 * the FP8 MMA model (fp8_mma_model.h's {32, 13, 8, 0, 0}, fitted to the prefill kernel's sums in session 48) on the x
 * codes and the weights' codes as the kernel re-packs them (e2m1 x 2^-6), ua = fmaf(D, 2^(e - 121), ua); per 128-column
 * unit acc_s = fmaf(ua, s_x, acc_s); the column slices of mf8_slices(R, NU) added in order. xc: the act-quant codes,
 * sx: their unit scales. Information only (NOTES 48: e2m1's 0.5 is an e4m3 subnormal here, which the fit hardly saw). */
static float mf8_model_dot(const float *xc, const float *sx, const hweight *hw, int row, int C, int R, float *wrow, int var) {
    const mma_model mm = {32, 13, var, 0, 0};
    const int NU = C / 128;
    int SL = 1;
    while (SL < 4 && NU % (2 * SL) == 0 && (R / 64) * 4 * SL < 256) SL *= 2;
    dsv4_weight_row(&hw->w, row, wrow);
    float tot = 0;
    for (int s = 0; s < SL; s++) {
        float acc = 0;
        for (int u = s * NU / SL; u < (s + 1) * NU / SL; u++) {
            float ua = 0;
            for (int G = 0; G < 4; G++) {
                const int c0 = 128 * u + 32 * G, e = hw->scale[(size_t)row * hw->w.scale_stride + c0 / 32];
                float pr[32];
                int pe[32];
                for (int j = 0; j < 32; j++) {
                    const float a = ldexpf(wrow[c0 + j], 127 - e - 6); /* e2m1 x 2^-6, exact */
                    pr[j] = xc[c0 + j] * a;
                    pe[j] = pr[j] != 0 ? mma_fexp(xc[c0 + j], 0, var) + mma_fexp(a, 0, var) - 1 : 0; /* (both are codes) */
                }
                const float d = mma_block(0.0f, pr, pe, 32, mm);
                ua = fmaf(d, ldexpf(1.0f, e - 121), ua);
            }
            acc = fmaf(ua, sx[u], acc);
        }
        tot = s ? tot + acc : acc;
    }
    return tot;
}

/* The FP8 decode path (DSV4_MOE_TC_F8, moe_f8.cuh: wgmma e4m3, not the f16 kernels' bits) against the CPU backend, one
 * matrix at a time: h (gate / up, SwiGLU, routing weight) against dsv4_cpu_linear of the same x, and each slot's down
 * projection y against dsv4_cpu_linear of the FP8 path's own h (both act-quantize the same fp32 values to the same codes,
 * so only the accumulation differs). The bar is the FP8 tensor core's accumulation: the probe measured at worst 2.6e-5
 * of a row's sum |w x| (bench/NOTES.md, session 18), ~0.8 sqrt(C) rms for these random rows; 8x that as a share of the
 * reference's rms. Then batch invariance: up to 4 busy tokens alone == in the batch, bitwise. */
void test_moe_f8(int T, int K, int E, int D, int I) {
    const float lim = 10.0f;
    mx_set ms = mx_set_new(DSV4_WF_MXFP4, E, D, I, 0);
    const hweight *h1w = ms.h1, *h3w = ms.h3, *h2w = ms.h2;
    mx_batch mb = mx_batch_new(T, K, E, D, I);
    const int *sel = mb.sel, *sid = mb.sid, *dsel = mb.dsel, *dsid = mb.dsid;
    const float *w = mb.w, *x = mb.x, *dw = mb.dw, *dx = mb.dx;
    float *dh = mb.dh, *dy = mb.dy, *dout = mb.dout;
    float *hg = malloc(sizeof(float) * (size_t)T * K * I), *hr = malloc(sizeof(float) * (size_t)T * K * I);
    float *yg = malloc(sizeof(float) * (size_t)T * K * D), *yr = malloc(sizeof(float) * (size_t)T * K * D);
    float *o1 = malloc(sizeof(float) * (size_t)T * D), *u = malloc(sizeof(float) * I);
    dsv4_cuda_moe_plan dp = dplan_new(T, K, E);
    hplan r = hplan_new(T, K, E);
    group_ref(sel, w, sid, T, K, E, &r);
    int ns = 0;
    for (int a = 0; a < r.nact; a++) ns += r.act_cnt[a];
    dsv4_cuda_moe_experts_path(DSV4_MOE_TC_F8);
    op_ok(dsv4_cuda_moe_group(dsel, dw, dsid, T, K, E, &dp, NULL), "moe_group");
    op_ok(dsv4_cuda_moe_experts(&ms.ex, dx, T, K, &dp, lim, dh, dy, NULL), "moe_experts");
    sync_ok();
    from_dev(hg, dh, sizeof(float) * (size_t)ns * I);
    from_dev(yg, dy, sizeof(float) * (size_t)ns * D);
    op_ok(dsv4_cuda_moe_combine(dy, dp.tslot, T, K, D, NULL, dout, NULL), "moe_combine");
    sync_ok();
    from_dev(o1, dout, sizeof(float) * (size_t)T * D);
    /* from 16 tokens on (MF8_RQ_T) h was act-quantized in place for the down projection: its e4m3 codes (moe_f8's order
     * within each 32-column group) then the unit scales; the down projection's input is their values */
    const int hq = T >= 16;
    if (hq)
        for (int sl = 0; sl < ns; sl++) {
            const uint8_t *row = (const uint8_t *)(hg + (size_t)sl * I);
            const float *sc = (const float *)(row + I);
            float *v = u;
            for (int j = 0; j < I; j++) {
                const int l = j & 31, pos = (j & ~31) + (l & 1) * 16 + (l >> 3) * 4 + ((l & 7) >> 1);
                v[j] = dsv4_e4m3_to_f32(row[pos]) * sc[j / 128];
            }
            memcpy(hg + (size_t)sl * I, v, sizeof(float) * I);
        }
    for (int a = 0; a < r.nact; a++)
        for (int j = 0; j < r.act_cnt[a]; j++) {
            const int e = r.act_e[a], sl = r.act_off[a] + j;
            float *h = hr + (size_t)sl * I;
            dsv4_cpu_linear(&h1w[e].w, x + (size_t)r.rows[sl] * D, 1, h);
            dsv4_cpu_linear(&h3w[e].w, x + (size_t)r.rows[sl] * D, 1, u);
            swiglu_ref(h, u, I, lim, r.rw[sl]);
            dsv4_cpu_linear(&h2w[e].w, hg + (size_t)sl * I, 1, yr + (size_t)sl * D);
        }
    if (!hq) { /* the gate / up sums under the emulated FP8 MMA (mf8_model_dot) on a sample of slots and columns (h in
                * fp32: fewer than 16 tokens): how many h values are the model's exactly, within 2 ulp (the device's expf in
                * the SwiGLU against the CPU's), further. Information only, no check yet (NOTES 48). */
        float *xc = malloc(sizeof(float) * D), *sxu = malloc(sizeof(float) * (D / 128)), *wr = malloc(sizeof(float) * D);
        size_t nex = 0, n0[2] = {0, 0}, n2[2] = {0, 0};
        const int sstep = ns > 48 ? ns / 48 : 1;
        for (int a = 0; a < r.nact; a++)
            for (int j = 0; j < r.act_cnt[a]; j += sstep) {
                const int e = r.act_e[a], sl = r.act_off[a] + j;
                memcpy(xc, x + (size_t)r.rows[sl] * D, sizeof(float) * D);
                dsv4_act_quant_fp8(xc, D, 128);
                for (int b = 0; b < D / 128; b++) { /* the act-quant scale (dsv4_act_quant_fp8's rule), the codes */
                    float amax = 1e-4f;
                    for (int k = 128 * b; k < 128 * b + 128; k++) amax = fmaxf(amax, fabsf(x[(size_t)r.rows[sl] * D + k]));
                    sxu[b] = ldexpf(1.0f, aq_exp(amax));
                    for (int k = 128 * b; k < 128 * b + 128; k++) xc[k] /= sxu[b];
                }
                for (int col = j % 7; col < I; col += 7, nex++)
                    for (int v = 0; v < 2; v++) { /* variant 8, then 8 | 16 (subnormal factors by their exponent field) */
                        float gv = mf8_model_dot(xc, sxu, &h1w[e], col, D, I, wr, v ? 24 : 8);
                        const float uv = mf8_model_dot(xc, sxu, &h3w[e], col, D, I, wr, v ? 24 : 8);
                        swiglu_ref(&gv, &uv, 1, lim, r.rw[sl]);
                        const float dv = hg[(size_t)sl * I + col];
                        int32_t ia, ib;
                        memcpy(&ia, &gv, 4), memcpy(&ib, &dv, 4);
                        const int64_t ulp = (int64_t)ia - ib;
                        n0[v] += gv == dv, n2[v] += gv != dv && (ulp >= -2 && ulp <= 2);
                    }
            }
        printf("     moe_experts fp8 MXFP4 aq T=%d K=%d E=%d D=%d I=%d: of %zu sampled h the emulated FP8 MMA's exactly %zu, within 2 ulp %zu, "
               "further %zu; with subnormal factors by their exponent field %zu / %zu / %zu (information)\n", T, K, E, D, I, nex, n0[0], n2[0],
               nex - n0[0] - n2[0], n0[1], n2[1], nex - n0[1] - n2[1]);
        free(xc), free(sxu), free(wr);
    }
    char name[160];
    const double bh = 8 * 2.6e-5 * 0.8 * sqrt((double)D), by = 8 * 2.6e-5 * 0.8 * sqrt((double)I);
    snprintf(name, sizeof name, "moe_experts fp8 MXFP4 aq T=%d K=%d E=%d D=%d I=%d h vs CPU", T, K, E, D, I);
    if (!hq) check(name, hg, hr, (size_t)ns * I, bh * rms(hr, (size_t)ns * I), 0);
    snprintf(name, sizeof name, "moe_experts fp8 MXFP4 aq T=%d K=%d E=%d D=%d I=%d y (own h) vs CPU", T, K, E, D, I);
    check(name, yg, yr, (size_t)ns * D, by * rms(yr, (size_t)ns * D), 0);
    /* the forms with x quantized per row (16+ tokens): ring depths, chunk splits and the scale words a unit at a time give
     * the default's y, bitwise */
    if (hq) {
        static const int form[3][4] = {{4, 4, 1, 0}, {5, 6, 3, 1}, {6, 8, 4, 0}};
        float *y2 = malloc(sizeof(float) * (size_t)ns * D);
        dsv4_cuda_moe_f8_d2(0); /* (the down projection's ring depths: its one-tile form) */
        for (int f = 0; f < 3; f++) {
            dsv4_cuda_moe_f8_force(form[f][0], form[f][1], form[f][2], form[f][3]);
            op_ok(dsv4_cuda_fill(dy, (int64_t)ns * D, 0.0f, NULL), "fill");
            op_ok(dsv4_cuda_moe_experts(&ms.ex, dx, T, K, &dp, lim, dh, dy, NULL), "moe_experts (form)");
            sync_ok();
            from_dev(y2, dy, sizeof(float) * (size_t)ns * D);
            const int nd = memcmp(y2, yg, sizeof(float) * (size_t)ns * D) != 0;
            g_checks++, g_fail += nd;
            printf("%-4s moe_experts fp8 MXFP4 aq T=%d K=%d E=%d: gate/up ring %d, down ring %d, chunks over %d blocks, scale "
                   "words %s: y %s%s\n",
                   nd ? "FAIL" : "ok", T, K, E, form[f][0], form[f][1], form[f][2], form[f][3] ? "4 units at a time" : "a unit at a time",
                   nd ? "differs" : "bitwise the default's", nd ? " <<<" : "");
        }
        dsv4_cuda_moe_f8_force(-2, 0, 0, 0);
        dsv4_cuda_moe_f8_d2(-1);
        /* the down projection on two row tiles a warpgroup (the default) against one, chunks split or not, scale words
         * either way: y bitwise the one-tile form's and the default's, taken where the shape allows it (8-token chunks) */
        static const int dform[3][2] = {{-1, 1}, {1, 0}, {3, 1}};
        for (int f = 0; f < 3; f++) {
            dsv4_cuda_moe_f8_force(-1, -1, dform[f][0], dform[f][1]);
            dsv4_cuda_moe_f8_d2(0);
            op_ok(dsv4_cuda_fill(dy, (int64_t)ns * D, 0.0f, NULL), "fill");
            op_ok(dsv4_cuda_moe_experts(&ms.ex, dx, T, K, &dp, lim, dh, dy, NULL), "moe_experts (one row tile)");
            sync_ok();
            from_dev(y2, dy, sizeof(float) * (size_t)ns * D);
            int nd = memcmp(y2, yg, sizeof(float) * (size_t)ns * D) != 0;
            dsv4_cuda_moe_f8_d2(1);
            const int n0 = dsv4_cuda_moe_f8_d2_count();
            op_ok(dsv4_cuda_fill(dy, (int64_t)ns * D, 0.0f, NULL), "fill");
            op_ok(dsv4_cuda_moe_experts(&ms.ex, dx, T, K, &dp, lim, dh, dy, NULL), "moe_experts (two row tiles)");
            sync_ok();
            const int nx = dsv4_cuda_moe_f8_d2_count() - n0, want = T * K * 8 / E > 64 || D % 128 ? 0 : 1;
            dsv4_cuda_moe_f8_d2(-1);
            from_dev(y2, dy, sizeof(float) * (size_t)ns * D);
            nd |= memcmp(y2, yg, sizeof(float) * (size_t)ns * D) != 0;
            g_checks++, g_fail += nd || nx != want;
            printf("%-4s moe_experts fp8 MXFP4 aq T=%d K=%d E=%d: down on one and on two row tiles (two: %d launch, %d expected), "
                   "chunks over %s blocks, scale words %s: y %s%s\n",
                   nd || nx != want ? "FAIL" : "ok", T, K, E, nx, want, dform[f][0] < 0 ? "the default's" : dform[f][0] == 1 ? "1" : "3",
                   dform[f][1] ? "4 units at a time" : "a unit at a time", nd ? "differs" : "bitwise the same (and the default's)",
                   nd || nx != want ? " <<<" : "");
        }
        dsv4_cuda_moe_f8_force(-2, 0, 0, 0);
        free(y2);
    }
    /* batch invariance on the FP8 path */
    int nt = 0;
    const int same = tokens_alone(&ms.ex, sid, dsel, dw, dx, T, K, E, D, lim, 4, &dp, dh, dy, dout, o1, &nt), bad = nt - same;
    dsv4_cuda_moe_experts_path(0);
    g_checks++;
    if (bad) g_fail++;
    printf("%-4s moe_experts fp8 MXFP4 aq T=%d K=%d E=%d: %d tokens alone == in the batch (bitwise)%s\n", bad ? "FAIL" : "ok", T, K, E,
           nt - bad, bad ? " <<<" : "");
    mx_set_free(&ms), mx_batch_free(&mb);
    dplan_free(&dp), hplan_free(&r);
    free(hg), free(hr);
    free(yg), free(yr), free(o1), free(u);
}

/* moe_bf16.cuh's image order (its mb_logical / mb_off): where column col of slot j (of an active expert with cnt slots,
 * image rows from base) lies in an image of rows of C bf16 */
static size_t pfb_pos(size_t base, int j, int cnt, int col, int C) {
    const int ch = j >> 7, t = j & 127, rest = cnt - 128 * ch, ng = ((rest < 128 ? rest : 128) + 7) >> 3, u = col / 128, p = col % 128;
    const int c = p >> 5, n = p & 31, L = 16 * (2 * (n >> 3) + ((n >> 1) & 1)) + 8 * (n & 1) + 2 * c + ((n >> 2) & 1);
    const size_t off = ((size_t)((L >> 4) * ng + (t >> 3)) * 2 + ((L >> 3) & 1)) * 128 + (size_t)(t & 7) * 16 + (size_t)(L & 7) * 2;
    return (base + (size_t)128 * ch) * C * 2 + (size_t)u * ng * 2048 + off;
}

/* moe_f8p.cuh's image order (its mq_logical / mq_off): where column col of slot j (of an active expert with cnt slots,
 * image rows from base) lies in an FP8 image of rows of C + C / 32 bytes, and where its act-quant scale lies (*sc) */
static size_t pf8_pos(size_t base, int j, int cnt, int col, int C, size_t *sc) {
    const int ch = j >> 7, t = j & 127, rest = cnt - 128 * ch, ng = ((rest < 128 ? rest : 128) + 7) >> 3, u = col / 128, p = col % 128;
    const int c = p >> 5, s = (p >> 3) & 3, i = p & 7, L = 32 * s + 16 * (i >> 2) + 4 * c + (i & 3);
    const size_t ub = (base + (size_t)128 * ch) * ((size_t)C + C / 32) + (size_t)u * ng * 1056;
    *sc = ub + (size_t)ng * 1024 + 4 * (size_t)t;
    return ub + ((size_t)((L >> 5) * ng + (t >> 3)) * 2 + ((L >> 4) & 1)) * 128 + (size_t)(t & 7) * 16 + (size_t)(L & 15);
}

/* Hopper's FP8 MMA as the device computes it (fp8_mma_model.h; fitted in session 48 to 2,972 of test_moe_pf8's values
 * on an H100, every one reproduced bit for bit, bench/fp8_mma_fit.c): a k32 block's 32 exact products and the
 * accumulator aligned to the largest of their exponent sums (each product's exponent taken as ex + ew - 1, as if both
 * significands were 1), truncated toward zero to 13 fraction bits below it, summed, the sum truncated to 13 bits */
static const mma_model pf8_mma = {32, 13, 8, 0, 0};

/* h of one (slot, column) under the model m (pf8_mma, or it with variant bit 4: then xoff are the x codes' scale
 * exponents per unit and og / ou the A codes' for the gate / up rows, value = code x 2^(E_r - 133), E_r the row's
 * largest group scale byte; moe_f8p.cuh): the gate and up dots, SwiGLU, act-quantized with scale sc; *pre: before the
 * quantization */
static float pf8_model_h(mma_model m, const float *xq, const float *wg, const float *wu, int D, float lim, float rw, float sc,
                         const int *xoff, int og, int ou, float *pre) {
    float gv = mma_dot_off(xq, wg, D, m, xoff, og);
    const float uv = mma_dot_off(xq, wu, D, m, xoff, ou);
    swiglu_ref(&gv, &uv, 1, lim, rw);
    if (pre) *pre = gv;
    return dsv4_round_e4m3(fminf(fmaxf(gv / sc, -448.0f), 448.0f)) * sc;
}

/* Whether q (a value before its e4m3 rounding, in units of its scale) lies within 8 fp32 ulp of the midpoint between
 * got (the device's e4m3 value, same units) and its other neighbour: the device's SwiGLU rounds as the CPU's step by step
 * but its expf is CUDA's (within 2 ulp, CUDA C Programming Guide, not correctly rounded), so a value that close to a
 * rounding midpoint may land on either side (session 49: 1 of 8,436 in test_moe_pf8's D=4096 case) */
static int pf8_at_midpoint(float q, float got) {
    const float m = dsv4_round_e4m3(fminf(fmaxf(q, -448.0f), 448.0f)), mid = 0.5f * (m + got), rm = dsv4_round_e4m3(mid);
    /* got a neighbour of m: their midpoint rounds to one of them (with a value between, to one between) */
    return got != m && dsv4_round_e4m3(got) == got && (rm == m || rm == got) && fabsf(q - mid) <= ldexpf(fabsf(mid), -20);
}

/* The prefill pass's experts on FP8 tensor cores (moe_f8p.cuh, dsv4_cuda_moe_pfb_f8(1)) against the CPU backend, every
 * stride-th slot: h from its FP8 image (codes x the token's unit scale) against the CPU's SwiGLU of dsv4_cpu_linear,
 * act-quantized: equal, or where not (the FP8 tensor core's 13-bit block sums move values across rounding boundaries, far
 * ones where a value is small against its row's products; at most 5 %) equal to pf8_mma's emulation of the tensor core, bit
 * for bit, and so are the unit scales; y against dsv4_cpu_linear of the device's own h at the FP8 bar of test_moe_f8 (8x the
 * probe's 2.6e-5 of sum |w x|, ~0.8 sqrt(C) rms). The combined output against the BF16 kernels' (relative L2, printed;
 * under 2^-5, a gross error's catch). Then the first T2 tokens alone in a pass, bitwise. big: expert 0's scales spread over 14 binades (the
 * reach's end, with some groups at 15 whose codes are zeroed: still exact); big 2: one group of expert 1 15 binades
 * down with a nonzero code: the experts' pf8 must be 0 and the pass the BF16 kernels'. */
void test_moe_pf8(int T, int K, int E, int D, int I, int stride, int big, int T2) {
    const float lim = 10.0f;
    mx_set ms = mx_set_new(DSV4_WF_MXFP4, E, D, I, 0);
    if (big) { /* rewrite the host copies, then upload again */
        hweight *hw = &ms.h1[0];
        const int ng = D / 32;
        for (int r = 0; r < I; r++)
            for (int gi = 0; gi < ng; gi++) {
                uint8_t *sc = hw->scale + (size_t)r * hw->w.scale_stride + gi;
                if (big == 1) {
                    *sc = (uint8_t)(r % 3 == 0 && gi % 7 == 0 ? 130 : gi % 5 == 1 ? 116 : *sc);
                    if (r % 3 == 0 && gi % 11 == 3) { /* 15 binades below 130: zeros only */
                        *sc = 115;
                        memset(hw->data + (size_t)r * (D / 2) + (size_t)gi * 16, (gi & 1) ? 0x88 : 0x00, 16);
                    }
                }
            }
        if (big == 2) {
            hweight *h2 = &ms.h2[1];
            h2->scale[0] = 135, h2->scale[1] = 120; /* row 0: group 1 15 binades below group 0 */
            h2->data[16] = 0x01;                     /* a nonzero code in group 1 */
        }
        dsv4_cuda_experts_free(&ms.ex);
        for (int e = 0; e < 2; e++) {
            dsv4_cuda_weight_free(&ms.d1[e]), dsv4_cuda_weight_free(&ms.d2[e]);
            op_ok(dsv4_cuda_weight_upload(&ms.h1[e].w, &ms.d1[e]) || dsv4_cuda_weight_upload(&ms.h2[e].w, &ms.d2[e]), "upload");
        }
        op_ok(dsv4_cuda_experts_init(&ms.ex, ms.d1, ms.d3, ms.d2, E), "experts_init");
    }
    char name[160];
    snprintf(name, sizeof name, "moe_experts fp8 prefill MXFP4 T=%d K=%d E=%d D=%d I=%d%s", T, K, E, D, I,
             big == 2 ? " one group out of reach" : big ? " scales over 14 binades" : "");
    const int want = big != 2;
    g_checks++, g_fail += ms.ex.pf8 != want;
    printf("%-4s %s: experts' pf8 %d (expected %d)%s\n", ms.ex.pf8 == want ? "ok" : "FAIL", name, ms.ex.pf8, want, ms.ex.pf8 == want ? "" : " <<<");
    const hweight *h1w = ms.h1, *h3w = ms.h3, *h2w = ms.h2;
    mx_batch mb = mx_batch_new(T, K, E, D, I);
    const int *sel = mb.sel, *sid = mb.sid, *dsel = mb.dsel, *dsid = mb.dsid;
    const float *w = mb.w, *x = mb.x, *dw = mb.dw, *dx = mb.dx;
    float *dh = mb.dh, *dy = mb.dy, *dout = mb.dout;
    uint8_t *himg = malloc(sizeof(float) * (size_t)T * K * I);
    float *yg = malloc(sizeof(float) * (size_t)T * K * D), *o1 = malloc(sizeof(float) * (size_t)T * D),
          *o2 = malloc(sizeof(float) * (size_t)T * D), *ob = malloc(sizeof(float) * (size_t)T * D);
    dsv4_cuda_moe_plan dp = dplan_new(T, K, E);
    hplan r = hplan_new(T, K, E);
    group_ref(sel, w, sid, T, K, E, &r);
    op_ok(dsv4_cuda_moe_group(dsel, dw, dsid, T, K, E, &dp, NULL), "moe_group");
    /* the BF16 kernels' output first */
    dsv4_cuda_moe_pfb_f8(0);
    op_ok(dsv4_cuda_moe_experts_pass(&ms.ex, dx, T, K, &dp, lim, dh, dy, NULL) != 1, "moe_experts_pass (bf16)");
    op_ok(dsv4_cuda_moe_combine(dy, dp.tslot, T, K, D, NULL, dout, NULL), "moe_combine");
    sync_ok();
    from_dev(ob, dout, sizeof(float) * (size_t)T * D);
    dsv4_cuda_moe_pfb_f8(1);
    const int took = dsv4_cuda_moe_experts_pass(&ms.ex, dx, T, K, &dp, lim, dh, dy, NULL);
    op_ok(took < 0, "moe_experts_pass");
    const int f8 = dsv4_cuda_moe_pfb_f8_last();
    sync_ok();
    from_dev(himg, dh, sizeof(float) * (size_t)T * K * I);
    from_dev(yg, dy, sizeof(float) * (size_t)T * K * D);
    op_ok(dsv4_cuda_moe_combine(dy, dp.tslot, T, K, D, NULL, dout, NULL), "moe_combine");
    sync_ok();
    from_dev(o1, dout, sizeof(float) * (size_t)T * D);
    g_checks++, g_fail += took != 1 || f8 != want;
    printf("%-4s %s: the prefill kernels ran (%d), the FP8 form %d (expected %d)%s\n", took == 1 && f8 == want ? "ok" : "FAIL", name, took, f8,
           want, took == 1 && f8 == want ? "" : " <<<");
    if (f8 && took == 1) {
        size_t nmax = (size_t)T * K / stride + E + 1, nh = 0;
        float *hq = malloc(sizeof(float) * nmax * I), *hr = malloc(sizeof(float) * nmax * I), *u = malloc(sizeof(float) * I);
        float *ys = malloc(sizeof(float) * nmax * D), *yr = malloc(sizeof(float) * nmax * D);
        const int nb = I / 128;
        float *hst = malloc(sizeof(float) * nmax * nb);
        /* the values that differ from the CPU's (set 0 within a step, 1 beyond) and every 61st column of the others (2, a
         * control) against pf8_mma: [set] examined, not the model's value */
        size_t mset[3] = {0, 0, 0}, mbad[3] = {0, 0, 0}, ibad = 0, nbad = 0, nsc = 0, nscd = 0, nscbad = 0, n16 = 0, nmid = 0;
        int *xoff = malloc(sizeof(int) * (D / 128));
        float bad_got = 0, bad_model = 0, bad_q = 0;
        float *xq = malloc(sizeof(float) * D), *wg = malloc(sizeof(float) * D), *wu = malloc(sizeof(float) * D);
        /* DSV4_PF8_DUMP=FILE (the D 1024 case into FILE, the big-scales case into FILE.big): the examined values' inputs
         * for fitting the model off the device (bench/fp8_mma_fit.c; header int32 magic 0x50463845, D, records, slots;
         * records: int32 slot, set, og, ou (the gate / up rows' code exponents: value = code x 2^o), float rw, scale,
         * step, device h, CPU h, gate row [D], up row [D]; then slots x D act-quantized x and slots x D / 128 int32 x code
         * exponents); all beyond a step, 1500 other differing, 1000 controls */
        static char dbuf[4096];
        const char *denv = getenv("DSV4_PF8_DUMP"), *dpath = NULL;
        if (denv && D == 1024 && !big) dpath = denv;
        if (denv && big == 1 && snprintf(dbuf, sizeof dbuf, "%s.big", denv) < (int)sizeof dbuf) dpath = dbuf;
        FILE *df = dpath ? fopen(dpath, "wb") : NULL;
        int32_t dhdr[4] = {0x50463845, D, 0, 0}, dcap[3] = {1500, 1 << 30, 1000}, dcnt[3] = {0, 0, 0};
        if (df) fwrite(dhdr, sizeof dhdr, 1, df);
        long dslot_pos = -1;
        float *dxs = df ? malloc(sizeof(float) * nmax * D) : NULL;
        int32_t *dxo = df ? malloc(sizeof(int32_t) * nmax * (D / 128)) : NULL;
        for (int a = 0; a < r.nact; a++)
            for (int j = 0; j < r.act_cnt[a]; j += stride) {
                const int e = r.act_e[a], sl = r.act_off[a] + j;
                float *hc = hr + nh * I, *hg = hq + nh * I;
                dsv4_cpu_linear(&h1w[e].w, x + (size_t)r.rows[sl] * D, 1, hc);
                dsv4_cpu_linear(&h3w[e].w, x + (size_t)r.rows[sl] * D, 1, u);
                swiglu_ref(hc, u, I, lim, r.rw[sl]);
                for (int b = 0; b < nb; b++) {
                    float amax = 1e-4f;
                    for (int cc = 128 * b; cc < 128 * b + 128; cc++) amax = fmaxf(amax, fabsf(hc[cc]));
                    hst[nh * nb + b] = ldexpf(1.0f, aq_exp(amax) - 9);
                }
                dsv4_act_quant_fp8(hc, I, 128);
                for (int col = 0; col < I; col++) {
                    size_t so;
                    const size_t pos = pf8_pos((size_t)r.act_off[a] + 8 * (size_t)a, j, r.act_cnt[a], col, I, &so);
                    float scv;
                    memcpy(&scv, himg + so, 4);
                    hg[col] = dsv4_e4m3_to_f32(himg[pos]) * scv;
                }
                memcpy(xq, x + (size_t)r.rows[sl] * D, sizeof(float) * D);
                dsv4_act_quant_fp8(xq, D, 128);
                if (df) memcpy(dxs + nh * D, xq, sizeof(float) * D);
                for (int b = 0; b < D / 128; b++) { /* the x codes' scale exponents (dsv4_act_quant_fp8's power of two) */
                    float amax = 1e-4f;
                    for (int k = 128 * b; k < 128 * b + 128; k++) amax = fmaxf(amax, fabsf(x[(size_t)r.rows[sl] * D + k]));
                    xoff[b] = aq_exp(amax);
                    if (df) dxo[nh * (D / 128) + b] = xoff[b];
                }
                for (int col = 0; col < I; col++) {
                    const float step = hst[nh * nb + col / 128], dd = fabsf(hg[col] - hc[col]);
                    const int far = hg[col] != hc[col] && !(dd <= 0.13f * fabsf(hc[col]) || dd <= 1.0001f * step);
                    if (hg[col] == hc[col] && col % 61) continue;
                    const int set = hg[col] != hc[col] ? far : 2;
                    size_t so;
                    (void)pf8_pos((size_t)r.act_off[a] + 8 * (size_t)a, j, r.act_cnt[a], col, I, &so);
                    float scv;
                    memcpy(&scv, himg + so, 4);
                    dsv4_weight_row(&h1w[e].w, col, wg);
                    dsv4_weight_row(&h3w[e].w, col, wu);
                    mset[set]++;
                    int eg = 0, eu = 0; /* the rows' largest group scale bytes (the A codes are the values x 2^(133 - E_r)) */
                    for (int gi = 0; gi < D / 32; gi++) {
                        const int bg = h1w[e].scale[(size_t)col * h1w[e].w.scale_stride + gi], bu = h3w[e].scale[(size_t)col * h3w[e].w.scale_stride + gi];
                        eg = bg > eg ? bg : eg, eu = bu > eu ? bu : eu;
                    }
                    if (df && dcnt[set]++ < dcap[set]) {
                        const int32_t ri[4] = {(int32_t)nh, set, eg - 133, eu - 133};
                        const float rf[5] = {r.rw[sl], scv, step, hg[col], hc[col]};
                        fwrite(ri, sizeof ri, 1, df), fwrite(rf, sizeof rf, 1, df);
                        fwrite(wg, sizeof(float), D, df), fwrite(wu, sizeof(float), D, df);
                        dhdr[2]++;
                    }
                    const mma_model m16 = {pf8_mma.nb, pf8_mma.p, pf8_mma.var | 16, pf8_mma.g, pf8_mma.perm};
                    float pre;
                    const float em = pf8_model_h(pf8_mma, xq, wg, wu, D, lim, r.rw[sl], scv, NULL, 0, 0, &pre);
                    n16 += pf8_model_h(m16, xq, wg, wu, D, lim, r.rw[sl], scv, xoff, eg - 133, eu - 133, NULL) != hg[col];
                    if (em != hg[col] && pf8_at_midpoint(pre / scv, hg[col] / scv)) {
                        nmid++;
                    } else if (em != hg[col]) {
                        mbad[set]++;
                        if (!nbad++) ibad = nh * I + col, bad_got = hg[col], bad_model = em, bad_q = pre / scv;
                    }
                }
                /* each 128-column block's act-quant scale: the CPU's, or where it is not, the one of pf8_mma's block
                 * amax (every column of the block under the model) */
                for (int b = 0; b < nb; b++) {
                    size_t so;
                    (void)pf8_pos((size_t)r.act_off[a] + 8 * (size_t)a, j, r.act_cnt[a], 128 * b, I, &so);
                    float scv;
                    memcpy(&scv, himg + so, 4);
                    nsc++;
                    if (scv == hst[nh * nb + b] * 512.0f) continue;
                    nscd++;
                    float amax = 1e-4f, pre;
                    for (int cc = 128 * b; cc < 128 * b + 128; cc++) {
                        dsv4_weight_row(&h1w[e].w, cc, wg);
                        dsv4_weight_row(&h3w[e].w, cc, wu);
                        (void)pf8_model_h(pf8_mma, xq, wg, wu, D, lim, r.rw[sl], 1.0f, NULL, 0, 0, &pre);
                        amax = fmaxf(amax, fabsf(pre));
                    }
                    nscbad += scv != ldexpf(1.0f, aq_exp(amax));
                }
                dsv4_cpu_linear(&h2w[e].w, hg, 1, yr + nh * D);
                memcpy(ys + nh * D, yg + (size_t)sl * D, sizeof(float) * D);
                nh++;
            }
        size_t ndiff = 0, nfar = 0;
        for (size_t i = 0; i < nh * I; i++)
            if (hq[i] != hr[i]) {
                const float dd = fabsf(hq[i] - hr[i]), sub = hst[i / I * nb + i % I / 128];
                ndiff++, nfar += !(dd <= 0.13f * fabsf(hr[i]) || dd <= 1.0001f * sub);
            }
        /* every h value is the CPU's fp32 sums' or, where it is not (at most 5 %), the FP8 tensor core's as pf8_mma computes
         * it, bit for bit (a decode, layout or scale bug gives neither); the act-quant scales likewise */
        const int hok = nbad == 0 && nscbad == 0 && ndiff <= 2 + nh * I / 20;
        g_checks++, g_fail += !hok;
        printf("%-4s %s h (act-quantized): %zu of %zu differ from the CPU's fp32 sums (%.2f %%, %zu beyond one e4m3 step); of them and %zu "
               "controls %zu are not the FP8 MMA model's values (k32 blocks aligned to the largest exponent sum, 13 bits, truncated), "
               "%zu more its other neighbour at a rounding midpoint (SwiGLU's expf); unit scales %zu of %zu not the CPU's, %zu of "
               "those not the model's%s\n",
               hok ? "ok" : "FAIL", name, ndiff, nh * I, 100.0 * (double)ndiff / (double)(nh * I), nfar, mset[2], nbad, nmid, nscd, nsc,
               nscbad, hok ? "" : " <<<");
        if (nbad)
            printf("     the first not the model's: [%zu] got %.9g model %.9g (before the quantization %.9g of the scale) CPU %.9g "
                   "(differing within a step %zu, beyond %zu, controls %zu)\n",
                   ibad, bad_got, bad_model, bad_q, hr[ibad], mbad[0], mbad[1], mbad[2]);
        printf("     (information) the model with subnormal factors aligned by their e4m3 exponent field (variant bit 4): %zu of the %zu "
               "examined values not the device's\n", n16, mset[0] + mset[1] + mset[2]);
        free(xoff);
        if (df) { /* the slots' x after the records; the header's counts */
            dslot_pos = ftell(df);
            fwrite(dxs, sizeof(float), nh * (size_t)D, df);
            fwrite(dxo, sizeof(int32_t), nh * (size_t)(D / 128), df);
            dhdr[3] = (int32_t)nh;
            fseek(df, 0, SEEK_SET), fwrite(dhdr, sizeof dhdr, 1, df), fclose(df);
            printf("     dumped %d records and %d slots to %s (slots at byte %ld)\n", dhdr[2], dhdr[3], dpath, dslot_pos);
        }
        free(dxs), free(dxo);
        free(xq), free(wg), free(wu);
        snprintf(name, sizeof name, "moe fp8 prefill T=%d E=%d D=%d I=%d%s y (own h) vs CPU", T, E, D, I, big ? " big" : "");
        check(name, ys, yr, nh * D, 8 * 2.6e-5 * 0.8 * sqrt((double)I) * rms(yr, nh * D), 0);
        double dd2 = 0, rr2 = 0;
        for (size_t i = 0; i < (size_t)T * D; i++) dd2 += ((double)o1[i] - ob[i]) * ((double)o1[i] - ob[i]), rr2 += (double)ob[i] * ob[i];
        const double rel = sqrt(dd2 / (rr2 > 0 ? rr2 : 1));
        /* (h's rounding flips, one e4m3 step each, dominate: a few % of the values by ~6 % give ~1e-2; a wrong scale or
         * column order gives O(1)) */
        g_checks++, g_fail += !(rel <= 1.0 / 32);
        printf("%-4s moe fp8 prefill T=%d E=%d D=%d I=%d: output vs the BF16 kernels' relative L2 %.3g (bar %.3g)%s\n",
               rel <= 1.0 / 32 ? "ok" : "FAIL", T, E, D, I, rel, 1.0 / 32, rel <= 1.0 / 32 ? "" : " <<<");
        free(hq), free(hr), free(u), free(ys), free(yr), free(hst);
        /* PIPE (DSV4_MOE_PFB_F8=2: a unit's two halves of tokens in flight together): the same operations in the same
         * order, so the same h image and y, bitwise */
        float *yg2 = malloc(sizeof(float) * (size_t)T * K * D);
        uint8_t *himg2 = malloc(sizeof(float) * (size_t)T * K * I);
        for (int form = 2; form <= 5; form++) { /* 3: passes of 64 tokens (mqh_kernel), the same wgmmas and promotions; 4: the
                                                  * producer warps decode the weights (PDEC): the same A fragments; 5: the
                                                  * down projection over 256-token super chunks (SC) */
        dsv4_cuda_moe_pfb_f8(form);
        op_ok(dsv4_cuda_fill(dh, (int64_t)T * K * I, 0.0f, NULL) || dsv4_cuda_fill(dy, (int64_t)T * K * D, 0.0f, NULL), "fill");
        op_ok(dsv4_cuda_moe_experts_pass(&ms.ex, dx, T, K, &dp, lim, dh, dy, NULL) != 1, "moe_experts_pass (pipe)");
        sync_ok();
        from_dev(himg2, dh, sizeof(float) * (size_t)T * K * I);
        from_dev(yg2, dy, sizeof(float) * (size_t)T * K * D);
        size_t nd = 0;
        for (int a = 0; a < r.nact; a++)
            for (int j = 0; j < r.act_cnt[a]; j++) {
                for (int col = 0; col < I; col++) {
                    size_t so;
                    const size_t pos = pf8_pos((size_t)r.act_off[a] + 8 * (size_t)a, j, r.act_cnt[a], col, I, &so);
                    nd += himg2[pos] != himg[pos] || memcmp(himg2 + so, himg + so, 4) != 0;
                }
                nd += memcmp(yg2 + (size_t)(r.act_off[a] + j) * D, yg + (size_t)(r.act_off[a] + j) * D, sizeof(float) * D) != 0;
            }
        g_checks++, g_fail += nd != 0 || dsv4_cuda_moe_pfb_f8_last() != 1;
        printf("%-4s moe fp8 prefill T=%d E=%d D=%d I=%d: %s: h image and y %s%s\n", nd ? "FAIL" : "ok", T, E, D, I,
               form == 2 ? "both halves in flight (PIPE)" : form == 3 ? "passes of 64 tokens" : form == 4 ? "decoded by the producer warps (PDEC)"
                                                                                        : "the down projection over 256-token chunks (SC)",
               nd ? "differ" : "bitwise the default's", nd ? " <<<" : "");
        }
        dsv4_cuda_moe_pfb_f8(1);
        free(yg2), free(himg2);
    }
    /* the first T2 tokens alone in a pass */
    int *dsid2 = dup_to_dev(sid, sizeof(int) * T2);
    op_ok(dsv4_cuda_moe_group(dsel, dw, dsid2, T2, K, E, &dp, NULL), "moe_group");
    const int took2 = dsv4_cuda_moe_experts_pass(&ms.ex, dx, T2, K, &dp, lim, dh, dy, NULL);
    op_ok(took2 < 0, "moe_experts_pass");
    op_ok(dsv4_cuda_moe_combine(dy, dp.tslot, T2, K, D, NULL, dout, NULL), "moe_combine");
    sync_ok();
    from_dev(o2, dout, sizeof(float) * (size_t)T2 * D);
    snprintf(name, sizeof name, "moe fp8 prefill first %d of %d tokens alone%s", T2, T, took2 == 1 && dsv4_cuda_moe_pfb_f8_last() == want ? "" : " (NOT that path)");
    check_same(name, o2, o1, (size_t)T2 * D);
    dsv4_cuda_moe_pfb_f8(-1);
    dsv4_cuda_free(dsid2);
    mx_set_free(&ms), mx_batch_free(&mb);
    dplan_free(&dp), hplan_free(&r);
    free(himg), free(yg), free(o1), free(o2), free(ob);
}

/* The prefill pass's experts on BF16 tensor cores (dsv4_cuda_moe_experts_pass, moe_bf16.cuh; exact products, fp32 sums)
 * against the CPU backend, every `stride`-th slot: h (its image: the act-quantized values) against the CPU's SwiGLU of
 * dsv4_cpu_linear, act-quantized (dsv4_act_quant_fp8): equal but for values whose fp32 sums straddle an e4m3 rounding
 * boundary (one step, a few in a thousand at most); y against dsv4_cpu_linear of the device's own h (the same exact
 * products in another fp32 order: 3e-5 of the rms). big: some scales of expert 0 above 2^1 (MXFP4's second factor) or
 * at E4M3's ends (NVFP4). fmt: MXFP4 or NVFP4 (the CPU applies NVFP4's scale2 to each weight, the kernel to the sums: a
 * rounding apart). Then a token's rows do not depend on the others in the pass: the first T2 tokens alone, bitwise. */
void test_moe_pfb(dsv4_wfmt fmt, int T, int K, int E, int D, int I, int stride, int big, int T2) {
    const float lim = 10.0f;
    dsv4_cuda_moe_pfb_nvfp4(fmt == DSV4_WF_NVFP4);
    mx_set ms = mx_set_new(fmt, E, D, I, big);
    const hweight *h1w = ms.h1, *h3w = ms.h3, *h2w = ms.h2;
    mx_batch mb = mx_batch_new(T, K, E, D, I);
    const int *sel = mb.sel, *sid = mb.sid, *dsel = mb.dsel, *dsid = mb.dsid;
    const float *w = mb.w, *x = mb.x, *dw = mb.dw, *dx = mb.dx;
    float *dh = mb.dh, *dy = mb.dy, *dout = mb.dout;
    uint16_t *himg = malloc(sizeof(float) * (size_t)T * K * I);
    float *yg = malloc(sizeof(float) * (size_t)T * K * D), *o1 = malloc(sizeof(float) * (size_t)T * D),
          *o2 = malloc(sizeof(float) * (size_t)T * D);
    dsv4_cuda_moe_plan dp = dplan_new(T, K, E);
    hplan r = hplan_new(T, K, E);
    group_ref(sel, w, sid, T, K, E, &r);
    op_ok(dsv4_cuda_moe_group(dsel, dw, dsid, T, K, E, &dp, NULL), "moe_group");
    const int took = dsv4_cuda_moe_experts_pass(&ms.ex, dx, T, K, &dp, lim, dh, dy, NULL);
    op_ok(took < 0, "moe_experts_pass");
    sync_ok();
    from_dev(himg, dh, sizeof(float) * (size_t)T * K * I);
    from_dev(yg, dy, sizeof(float) * (size_t)T * K * D);
    op_ok(dsv4_cuda_moe_combine(dy, dp.tslot, T, K, D, NULL, dout, NULL), "moe_combine");
    sync_ok();
    from_dev(o1, dout, sizeof(float) * (size_t)T * D);
    char name[160];
    snprintf(name, sizeof name, "moe_experts bf16 prefill %s T=%d K=%d E=%d D=%d I=%d%s", dsv4_wfmt_name(fmt), T, K, E, D, I,
             big == 2 ? " end scales" : big ? " big scales" : "");
    g_checks++;
    if (took != 1) g_fail++;
    printf("%-4s %s: the BF16 prefill kernels ran%s\n", took == 1 ? "ok" : "FAIL", name, took == 1 ? "" : " <<<");
    if (took == 1) { /* a digest of h's image (where the slots' values lie) and y, to compare the bits across builds */
        uint64_t hsh = 1469598103934665603ull;
        for (int a = 0; a < r.nact; a++)
            for (int j = 0; j < r.act_cnt[a]; j++) {
                for (int col = 0; col < I; col++) {
                    const uint16_t v = himg[pfb_pos((size_t)r.act_off[a] + 8 * (size_t)a, j, r.act_cnt[a], col, I) / 2];
                    hsh = (hsh ^ v) * 1099511628211ull;
                }
                const uint32_t *yr32 = (const uint32_t *)(yg + (size_t)(r.act_off[a] + j) * D);
                for (int d = 0; d < D; d++) hsh = (hsh ^ yr32[d]) * 1099511628211ull;
            }
        printf("     %s: digest of h image and y %016llx (the same in every build that keeps the bits)\n", name, (unsigned long long)hsh);
    }
    /* every stride-th slot of each expert against the CPU */
    size_t nmax = (size_t)T * K / stride + E + 1, nh = 0;
    float *hq = malloc(sizeof(float) * nmax * I), *hr = malloc(sizeof(float) * nmax * I), *u = malloc(sizeof(float) * I);
    float *ys = malloc(sizeof(float) * nmax * D), *yr = malloc(sizeof(float) * nmax * D);
    const int nb = (I + 127) / 128;
    float *hst = malloc(sizeof(float) * nmax * nb); /* each 128-column block's e4m3 step below 2^-6: its scale 2^-9 */
    for (int a = 0; a < r.nact; a++)
        for (int j = 0; j < r.act_cnt[a]; j += stride) {
            const int e = r.act_e[a], sl = r.act_off[a] + j;
            float *hc = hr + nh * I, *hg = hq + nh * I;
            dsv4_cpu_linear(&h1w[e].w, x + (size_t)r.rows[sl] * D, 1, hc);
            dsv4_cpu_linear(&h3w[e].w, x + (size_t)r.rows[sl] * D, 1, u);
            swiglu_ref(hc, u, I, lim, r.rw[sl]);
            for (int b = 0; b < nb; b++) { /* dsv4_act_quant_fp8's scale: the power of two >= max(amax, 1e-4) / 448 */
                float amax = 1e-4f;
                for (int c = 128 * b; c < I && c < 128 * b + 128; c++) amax = fmaxf(amax, fabsf(hc[c]));
                hst[nh * nb + b] = ldexpf(1.0f, aq_exp(amax) - 9);
            }
            dsv4_act_quant_fp8(hc, I, 128);
            for (int col = 0; col < I; col++) {
                const size_t pos = pfb_pos((size_t)r.act_off[a] + 8 * (size_t)a, j, r.act_cnt[a], col, I);
                const uint32_t b = (uint32_t)himg[pos / 2] << 16;
                memcpy(hg + col, &b, 4);
            }
            dsv4_cpu_linear(&h2w[e].w, hg, 1, yr + nh * D);
            memcpy(ys + nh * D, yg + (size_t)sl * D, sizeof(float) * D);
            nh++;
        }
    /* one e4m3 step: 1/8 of the value (0.13 of the smaller) among normals, the block's subnormal step below 2^-6 (where
     * a flip from 0 to the smallest subnormal is one step too) */
    size_t ndiff = 0, nfar = 0, ifar = 0;
    for (size_t i = 0; i < nh * I; i++)
        if (hq[i] != hr[i]) {
            const float d = fabsf(hq[i] - hr[i]), sub = hst[i / I * nb + i % I / 128];
            ndiff++;
            if (!(d <= 0.13f * fabsf(hr[i]) || d <= 1.0001f * sub)) ifar = nfar++ ? ifar : i;
        }
    g_checks++;
    const int hok = nfar == 0 && ndiff <= 2 + nh * I / 1000;
    if (!hok) g_fail++;
    printf("%-4s %s h (act-quantized) vs CPU: %zu of %zu differ by one e4m3 step, %zu by more%s\n", hok ? "ok" : "FAIL", name, ndiff - nfar,
           nh * I, nfar, hok ? "" : " <<<");
    if (nfar)
        printf("     the first by more: [%zu] got %.9g ref %.9g (its block's subnormal step %.3g)\n", ifar, hq[ifar], hr[ifar],
               hst[ifar / I * nb + ifar % I / 128]);
    snprintf(name, sizeof name, "moe bf16 prefill %s T=%d E=%d D=%d I=%d%s y (own h) vs CPU", dsv4_wfmt_name(fmt), T, E, D, I, big ? " big" : "");
    /* the bar: 3e-5 of the rms plus 1e-5 of the value itself. Two fp32 sums of the same products in other orders (and,
     * NVFP4, scale2 applied to each weight or to the sum) differ by rounding that grows with the terms' size, so the
     * few values many times the rms need the relative part: session 31 saw 3.9e-3 on a value of 1,029 (8x the rms,
     * 3.8e-6 of it) in an NVFP4 case after other tests' draws had moved its random data; a wrong product or scale
     * is off by far more than 1e-5 of most values. */
    check(name, ys, yr, nh * D, 3e-5 * rms(yr, nh * D), 1e-5);
    /* every form (warp 0 or a producer warpgroup refilling the x ring, the x image a slot or a token at a time) against
     * the default's h image and y, bitwise */
    if (took == 1) {
        uint16_t *himg2 = malloc(sizeof(float) * (size_t)T * K * I);
        float *yg2 = malloc(sizeof(float) * (size_t)T * K * D);
        const int noprod = getenv("DSV4_TEST_PFB_NOPROD") != NULL; /* (bench/device_run.sh: the producer form hung) */
        for (int f = 0; f < 6; f++) { /* 4, 5: the wgmmas as wide as a chunk's tokens, without and with the producer */
            const int prod = f & 1, xtok = f < 4 ? f >> 1 : -1, nsz = f >= 4 ? 3 : 0;
            if (prod && noprod) {
                printf("skip %s: producer %d, x image a token at a time %d (DSV4_TEST_PFB_NOPROD)\n", name, prod, xtok);
                continue;
            }
            dsv4_cuda_moe_pfb_force(prod, xtok);
            dsv4_cuda_moe_pfb_nsz(nsz);
            op_ok(dsv4_cuda_fill(dh, (int64_t)T * K * I, 0.0f, NULL) || dsv4_cuda_fill(dy, (int64_t)T * K * D, 0.0f, NULL), "fill");
            op_ok(dsv4_cuda_moe_experts_pass(&ms.ex, dx, T, K, &dp, lim, dh, dy, NULL) != 1, "moe_experts_pass (form)");
            sync_ok();
            from_dev(himg2, dh, sizeof(float) * (size_t)T * K * I);
            from_dev(yg2, dy, sizeof(float) * (size_t)T * K * D);
            size_t nd = 0; /* h's image where a slot's values lie (the rest is scratch) and y's slots */
            for (int a = 0; a < r.nact; a++)
                for (int j = 0; j < r.act_cnt[a]; j++) {
                    for (int col = 0; col < I; col++) {
                        const size_t pos = pfb_pos((size_t)r.act_off[a] + 8 * (size_t)a, j, r.act_cnt[a], col, I) / 2;
                        nd += himg2[pos] != himg[pos];
                    }
                    nd += memcmp(yg2 + (size_t)(r.act_off[a] + j) * D, yg + (size_t)(r.act_off[a] + j) * D, sizeof(float) * D) != 0;
                }
            g_checks++, g_fail += nd != 0;
            printf("%-4s %s: producer %d, x image a token at a time %d, N as wide as the chunk %d: h image and y %s%s\n",
                   nd ? "FAIL" : "ok", name, prod, xtok, nsz, nd ? "differ" : "bitwise the default's", nd ? " <<<" : "");
        }
        dsv4_cuda_moe_pfb_force(-1, -1);
        dsv4_cuda_moe_pfb_nsz(-1);
        free(himg2), free(yg2);
    }
    /* the first T2 tokens alone in a pass */
    int *dsid2 = dup_to_dev(sid, sizeof(int) * T2);
    op_ok(dsv4_cuda_moe_group(dsel, dw, dsid2, T2, K, E, &dp, NULL), "moe_group");
    const int took2 = dsv4_cuda_moe_experts_pass(&ms.ex, dx, T2, K, &dp, lim, dh, dy, NULL);
    op_ok(took2 < 0, "moe_experts_pass");
    op_ok(dsv4_cuda_moe_combine(dy, dp.tslot, T2, K, D, NULL, dout, NULL), "moe_combine");
    sync_ok();
    from_dev(o2, dout, sizeof(float) * (size_t)T2 * D);
    snprintf(name, sizeof name, "moe bf16 prefill %s first %d of %d tokens alone%s", dsv4_wfmt_name(fmt), T2, T, took2 == 1 ? "" : " (NOT the bf16 path)");
    check_same(name, o2, o1, (size_t)T2 * D);
    dsv4_cuda_free(dsid2);
    dsv4_cuda_moe_pfb_nvfp4(-1);
    mx_set_free(&ms), mx_batch_free(&mb);
    dplan_free(&dp), hplan_free(&r);
    free(himg), free(yg);
    free(o1), free(o2), free(hq), free(hr), free(hst), free(u), free(ys), free(yr);
}
