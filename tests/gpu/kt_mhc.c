/* kt_mhc.c - test_kernels: mHC pre / post / head against the CPU twins (dsv4_cpu_hc_*). */
#include "kt.h"
#include "cpu/hc_split.h"

/* ---- mHC ---- */

/* The reference of hc_pre / hc_head: the twins' steps (dsv4_cpu_hc_pre / _head) with the mixes' M*D products summed in
 * double (exact products, one rounding). The twin sums them in float in sequence (it matches the official reference's
 * rounding on the fixtures' small models), which at Flash's 16,384 products strays ~10x further from the exact dot
 * product than the GPU's fp32 chains of 64 (1.6e-6 against 1.6e-7 of the products' rms on random rows, bench/NOTES.md
 * session 17): with 300 tokens the twin's own error took hc_pre's x check to 1.4x its bar. */
static void ref_hc(const float *X, int M, int D, const dsv4_weight *fn, const float *scale, const float *base, int iters,
                   float *x, float *post, float *comb) {
    const int MD = M * D, nr = fn->rows;
    float mix[(2 + 16) * 16], pre[16], *row = malloc(sizeof(float) * (size_t)MD);
    double ss = 0;
    for (int i = 0; i < MD; i++) ss += (double)X[i] * X[i];
    const float r = 1.0f / sqrtf((float)(ss / MD) + 1e-6f);
    for (int t = 0; t < nr; t++) {
        dsv4_weight_row(fn, t, row);
        double acc = 0;
        for (int c = 0; c < MD; c++) acc += (double)row[c] * X[c];
        mix[t] = (float)acc * r;
    }
    free(row);
    dsv4_hc_pre_weights(mix, M, scale[0], base, 1e-6f, pre);
    if (post) dsv4_hc_post_comb(mix, M, scale, base, iters, 1e-6f, post, comb);
    for (int d = 0; d < D; d++) {
        float acc = 0;
        for (int j = 0; j < M; j++) acc += pre[j] * X[j * D + d];
        x[d] = acc;
    }
}


void test_hc(int T, int M, int D, dsv4_wfmt fmt, int iters) {
    int nr = (2 + M) * M;
    hweight fn = make_weight(fmt, nr, M * D, 0, 0), fh = make_weight(fmt, M, M * D, 0, 0);
    float *X = randn((size_t)T * M * D, 1.0f), *scale = randn(3, 0.5f), *base = randn(nr, 0.5f), *nw = randn(D, 1.0f);
    float *rx = malloc(sizeof(float) * (size_t)T * D), *rp = malloc(sizeof(float) * (size_t)T * M),
          *rc = malloc(sizeof(float) * (size_t)T * M * M);
    float *gx = malloc(sizeof(float) * (size_t)T * D), *gp = malloc(sizeof(float) * (size_t)T * M),
          *gc = malloc(sizeof(float) * (size_t)T * M * M);
    float *g2 = malloc(sizeof(float) * (size_t)T * D), *g3 = malloc(sizeof(float) * (size_t)T * M * M);
    for (int t = 0; t < T; t++)
        ref_hc(X + (size_t)t * M * D, M, D, &fn.w, scale, base, iters, rx + (size_t)t * D, rp + (size_t)t * M,
               rc + (size_t)t * M * M);
    dsv4_cuda_weight dfn, dfh;
    op_ok(dsv4_cuda_weight_upload(&fn.w, &dfn), "upload");
    op_ok(dsv4_cuda_weight_upload(&fh.w, &dfh), "upload");
    float *dX = dup_to_dev(X, sizeof(float) * (size_t)T * M * D), *ds = dup_to_dev(scale, 12), *db = dup_to_dev(base, sizeof(float) * nr);
    float *dnw = dup_to_dev(nw, sizeof(float) * D), *dx2 = dsv4_cuda_alloc(sizeof(float) * (size_t)T * D);
    float *dx = dsv4_cuda_alloc(sizeof(float) * (size_t)T * D), *dp = dsv4_cuda_alloc(sizeof(float) * (size_t)T * M),
          *dc = dsv4_cuda_alloc(sizeof(float) * (size_t)T * M * M);
    void *scr = dsv4_cuda_alloc(dsv4_cuda_hc_scratch_bytes(T, M, D));
    op_ok(dsv4_cuda_hc_pre(dX, T, M, D, &dfn, ds, db, iters, 1e-6f, 1e-6f, NULL, dx, dp, dc, scr, NULL), "hc_pre");
    sync_ok();
    from_dev(gx, dx, sizeof(float) * (size_t)T * D);
    from_dev(gp, dp, sizeof(float) * (size_t)T * M);
    from_dev(gc, dc, sizeof(float) * (size_t)T * M * M);
    char name[128];
    snprintf(name, sizeof name, "hc_pre x    T=%d M=%d D=%d %s it=%d", T, M, D, dsv4_wfmt_name(fmt), iters);
    check(name, gx, rx, (size_t)T * D, 1e-5 * rms(rx, (size_t)T * D), 1e-4);
    snprintf(name, sizeof name, "hc_pre post T=%d M=%d D=%d", T, M, D);
    check(name, gp, rp, (size_t)T * M, 1e-6, 1e-4);
    snprintf(name, sizeof name, "hc_pre comb T=%d M=%d D=%d", T, M, D);
    check(name, gc, rc, (size_t)T * M * M, 1e-6, 1e-4);

    /* the reference Sinkhorn / pre weights on one thread (flag 1) and plain launches (flag 2): the same bits */
    for (int fl = 1; fl <= 2; fl++) {
        dsv4_cuda_hc_test_flags = fl;
        op_ok(dsv4_cuda_hc_pre(dX, T, M, D, &dfn, ds, db, iters, 1e-6f, 1e-6f, NULL, dx2, dp, dc, scr, NULL), "hc_pre");
        sync_ok();
        dsv4_cuda_hc_test_flags = 0;
        from_dev(g2, dx2, sizeof(float) * (size_t)T * D);
        from_dev(g3, dc, sizeof(float) * (size_t)T * M * M);
        snprintf(name, sizeof name, "hc_pre x    T=%d M=%d %s", T, M, fl == 1 ? "serial Sinkhorn" : "no PDL");
        check_same(name, g2, gx, (size_t)T * D);
        snprintf(name, sizeof name, "hc_pre comb T=%d M=%d %s", T, M, fl == 1 ? "serial Sinkhorn" : "no PDL");
        check_same(name, g3, gc, (size_t)T * M * M);
        from_dev(g3, dp, sizeof(float) * (size_t)T * M);
        snprintf(name, sizeof name, "hc_pre post T=%d M=%d %s", T, M, fl == 1 ? "serial Sinkhorn" : "no PDL");
        check_same(name, g3, gp, (size_t)T * M);
    }

    /* batch invariance: tokens alone (T = 1) and in slices of 8 give the bits of the whole batch */
    {
        int bad = 0, runs = 0;
        const int tl[3] = {0, T / 2, T - 1};
        for (int k = 0; k < 3 + (T >= 8) * 2; k++) {
            int t0 = k < 3 ? tl[k] : k == 3 ? 0 : T - 8, n = k < 3 ? 1 : 8;
            op_ok(dsv4_cuda_hc_pre(dX + (size_t)t0 * M * D, n, M, D, &dfn, ds, db, iters, 1e-6f, 1e-6f, NULL, dx2, dp, dc, scr, NULL),
                  "hc_pre");
            sync_ok();
            from_dev(g2, dx2, sizeof(float) * (size_t)n * D);
            from_dev(g3, dc, sizeof(float) * (size_t)n * M * M);
            bad += memcmp(g2, gx + (size_t)t0 * D, sizeof(float) * (size_t)n * D) != 0;
            bad += memcmp(g3, gc + (size_t)t0 * M * M, sizeof(float) * (size_t)n * M * M) != 0;
            from_dev(g3, dp, sizeof(float) * (size_t)n * M);
            bad += memcmp(g3, gp + (size_t)t0 * M, sizeof(float) * (size_t)n * M) != 0, runs += 3;
        }
        g_checks++;
        if (bad) g_fail++;
        printf("%-4s hc_pre batch invariance T=%d M=%d D=%d: %d of %d slices differ%s\n", bad ? "FAIL" : "ok", T, M, D, bad, runs,
               bad ? " <<<" : "");
    }
    /* the fused RMSNorm: bitwise the unfused x then dsv4_cuda_rmsnorm; near the twins in sequence */
    op_ok(dsv4_cuda_rmsnorm(dx, T, D, D, dnw, 1e-6f, NULL), "rmsnorm");
    op_ok(dsv4_cuda_hc_pre(dX, T, M, D, &dfn, ds, db, iters, 1e-6f, 1e-6f, dnw, dx2, dp, dc, scr, NULL), "hc_pre");
    sync_ok();
    from_dev(gx, dx, sizeof(float) * (size_t)T * D);
    from_dev(g2, dx2, sizeof(float) * (size_t)T * D);
    snprintf(name, sizeof name, "hc_pre+norm = hc_pre, rmsnorm T=%d D=%d", T, D);
    check_same(name, g2, gx, (size_t)T * D);
    /* the norm scales column d of token t by rn_t * nw[d] (|nw| reaches ~4x its rms): both sides are divided by the CPU's
     * rn_t * nw[d] and held to the pre-norm x check's tolerance (1e-5 rms + 1e-4 |ref|): that error carried through the
     * norm (without the division, a column with a large weight turned the absolute part into ~1.5x the bar) */
    const double xrms = rms(rx, (size_t)T * D);
    for (int t = 0; t < T; t++) {
        float *r = rx + (size_t)t * D, *gg = g2 + (size_t)t * D;
        double ss = 0;
        for (int d = 0; d < D; d++) ss += (double)r[d] * r[d];
        const double rn = 1.0 / sqrt(ss / D + 1e-6);
        dsv4_cpu_rmsnorm(r, D, nw, 1e-6f);
        for (int d = 0; d < D; d++) {
            const double k = rn * nw[d];
            if (fabs(k) > 1e-30) r[d] = (float)(r[d] / k), gg[d] = (float)(gg[d] / k);
        }
    }
    snprintf(name, sizeof name, "hc_pre+norm x T=%d M=%d D=%d (/ rn nw)", T, M, D);
    check(name, g2, rx, (size_t)T * D, 1e-5 * xrms, 1e-4);

    /* post: f = the layer output, with the post / comb just computed (CPU ones, on both sides) */
    float *f = randn((size_t)T * D, 1.0f), *rX = malloc(sizeof(float) * (size_t)T * M * D), *gX = malloc(sizeof(float) * (size_t)T * M * D);
    memcpy(rX, X, sizeof(float) * (size_t)T * M * D);
    for (int t = 0; t < T; t++) dsv4_cpu_hc_post(f + (size_t)t * D, rX + (size_t)t * M * D, M, D, rp + (size_t)t * M, rc + (size_t)t * M * M);
    float *df = dup_to_dev(f, sizeof(float) * (size_t)T * D);
    dsv4_cuda_upload(dp, rp, sizeof(float) * (size_t)T * M);
    dsv4_cuda_upload(dc, rc, sizeof(float) * (size_t)T * M * M);
    op_ok(dsv4_cuda_hc_post(df, dX, T, M, D, dp, dc, NULL), "hc_post");
    sync_ok();
    from_dev(gX, dX, sizeof(float) * (size_t)T * M * D);
    snprintf(name, sizeof name, "hc_post T=%d M=%d D=%d", T, M, D);
    check(name, gX, rX, (size_t)T * M * D, 1e-6, 1e-5);

    /* post then the next pre in one call (dsv4_cuda_hc_post_pre; with few tokens out of place one kernel for both):
     * bitwise the two calls (X, x with the norm, post, comb), out of place (v < 6: every few-token blocking, no PDL;
     * the old streams untouched), in place (v 6), and with post / comb left to dsv4_cuda_hc_comb (v 7: the mixes
     * stored, then the Sinkhorn in its own kernel; v 8 the same with the reference Sinkhorn on one thread), and with the
     * post's input the routed experts' rows combined in the call (v 9 out of place: in the post kernel; v 10 in place:
     * dsv4_cuda_moe_combine first) against moe_combine then the two calls: 3 slots a token, some empty (the combine
     * stops at the first), the shared expert's rows added last */
    const int KC = 3;
    int *tsl = malloc(sizeof(int) * (size_t)T * KC);
    for (int t = 0; t < T; t++)
        for (int k = 0; k < KC; k++) tsl[t * KC + k] = (t % 4 == 3 && k == 1) || (t % 5 == 2 && k == 2) ? -1 : (t * KC + k * 7) % (T * KC);
    float *ys = randn((size_t)T * KC * D, 1.0f), *shv = randn((size_t)T * D, 0.5f);
    float *dys = dup_to_dev(ys, sizeof(float) * (size_t)T * KC * D), *dsh = dup_to_dev(shv, sizeof(float) * (size_t)T * D);
    int *dts = dsv4_cuda_alloc(sizeof(int) * (size_t)T * KC);
    dsv4_cuda_upload(dts, tsl, sizeof(int) * (size_t)T * KC);
    float *dfc = dsv4_cuda_alloc(sizeof(float) * (size_t)T * D), *dfb = dsv4_cuda_alloc(sizeof(float) * (size_t)T * D);
    for (int vv = 0; vv <= 14; vv++) { /* 11-14: v 0, 6, 9, 10 with the post inside the mixing kernel (many tokens) */
        static const int vmap[4] = {0, 6, 9, 10};
        const int v = vv > 10 ? vmap[vv - 11] : vv;
        dsv4_cuda_hc_post_mix_big(vv > 10 ? 1 : 0);
        const int fl = v == 5 ? 2 : v == 6 || v == 7 || v >= 9 ? 0 : v == 8 ? 1 : 16 * v;
        const dsv4_cuda_hc_f src = v >= 9 ? (dsv4_cuda_hc_f){dfb, dys, dts, KC, dsh} : (dsv4_cuda_hc_f){df, NULL, NULL, 0, NULL};
        float *dmix = v == 7 || v == 8 ? dsv4_cuda_alloc(sizeof(float) * (size_t)T * nr) : NULL;
        const size_t nX = (size_t)T * M * D;
        float *dXa = dup_to_dev(X, sizeof(float) * nX), *dXb = dup_to_dev(X, sizeof(float) * nX);
        float *dXo = v == 6 || v == 10 ? dXb : dsv4_cuda_alloc(sizeof(float) * nX);
        float *dpa = dup_to_dev(rp, sizeof(float) * (size_t)T * M), *dca = dup_to_dev(rc, sizeof(float) * (size_t)T * M * M);
        float *dpb = dup_to_dev(rp, sizeof(float) * (size_t)T * M), *dcb = dup_to_dev(rc, sizeof(float) * (size_t)T * M * M);
        float *ha = malloc(sizeof(float) * nX), *hb = malloc(sizeof(float) * nX);
        dsv4_cuda_hc_test_flags = fl;
        if (v >= 9) op_ok(dsv4_cuda_moe_combine(dys, dts, T, KC, D, dsh, dfc, NULL), "moe_combine");
        op_ok(dsv4_cuda_hc_post(v >= 9 ? dfc : df, dXa, T, M, D, dpa, dca, NULL), "hc_post");
        op_ok(dsv4_cuda_hc_pre(dXa, T, M, D, &dfn, ds, db, iters, 1e-6f, 1e-6f, dnw, dx, dpa, dca, scr, NULL), "hc_pre");
        sync_ok();
        from_dev(gx, dx, sizeof(float) * (size_t)T * D);
        op_ok(dsv4_cuda_hc_post_pre(&src, dXb, dXo, T, M, D, &dfn, ds, db, iters, 1e-6f, 1e-6f, dnw, dx2, dpb, dcb, dmix, scr, NULL),
              "hc_post_pre");
        const int pmb_took = dsv4_cuda_hc_post_mix_big_last();
        if (dmix) op_ok(dsv4_cuda_hc_comb(dmix, T, M, ds, db, iters, 1e-6f, dpb, dcb, NULL), "hc_comb");
        sync_ok();
        dsv4_cuda_hc_test_flags = 0;
        dsv4_cuda_hc_post_mix_big(-1);
        from_dev(g2, dx2, sizeof(float) * (size_t)T * D);
        int bad = memcmp(g2, gx, sizeof(float) * (size_t)T * D) != 0;
        from_dev(ha, dXa, sizeof(float) * nX), from_dev(hb, dXo, sizeof(float) * nX);
        bad += 2 * (memcmp(ha, hb, sizeof(float) * nX) != 0);
        from_dev(ha, dpa, sizeof(float) * (size_t)T * M), from_dev(hb, dpb, sizeof(float) * (size_t)T * M);
        bad += 4 * (memcmp(ha, hb, sizeof(float) * (size_t)T * M) != 0);
        from_dev(ha, dca, sizeof(float) * (size_t)T * M * M), from_dev(hb, dcb, sizeof(float) * (size_t)T * M * M);
        bad += 4 * (memcmp(ha, hb, sizeof(float) * (size_t)T * M * M) != 0);
        if (v != 6 && v != 10) {
            from_dev(hb, dXb, sizeof(float) * nX);
            bad += 8 * (memcmp(X, hb, sizeof(float) * nX) != 0);
        }
        /* the post inside the mixing kernel must have run where its conditions hold (M 4, many tokens, F32 fn, D % 256) */
        if (vv > 10 && M == 4 && T >= 32 && fmt == DSV4_WF_F32 && D % 256 == 0 && !pmb_took) bad |= 16;
        g_checks++;
        if (bad) g_fail++;
        printf("%-4s hc_post_pre = hc_post, hc_pre T=%d M=%d D=%d %s%s flags %d (bitwise x, X, post, comb)%s%s\n",
               bad ? "FAIL" : "ok", T, M, D, vv <= 10 ? "" : pmb_took ? "post in the mixing kernel, " : "post in the mixing kernel NOT taken, ",
               v == 10  ? "in place, experts' rows"
               : v == 9 ? "out of place, experts' rows"
               : v == 6 ? "in place"
               : v >= 7 ? "out of place, hc_comb"
                        : "out of place",
               fl, bad ? ": differ " : "",
               !bad ? "" : bad & 1 ? "x <<<" : bad & 2 ? "X <<<" : bad & 4 ? "post/comb <<<" : bad & 8 ? "old X written <<<" : "path <<<");
        dsv4_cuda_free(dXa), dsv4_cuda_free(dXb), dsv4_cuda_free(dpa), dsv4_cuda_free(dca), dsv4_cuda_free(dpb), dsv4_cuda_free(dcb);
        if (v != 6 && v != 10) dsv4_cuda_free(dXo);
        if (dmix) dsv4_cuda_free(dmix);
        free(ha), free(hb);
    }
    dsv4_cuda_free(dys), dsv4_cuda_free(dsh), dsv4_cuda_free(dts), dsv4_cuda_free(dfc), dsv4_cuda_free(dfb);
    free(tsl), free(ys), free(shv);

    /* head, on the updated streams */
    for (int t = 0; t < T; t++) ref_hc(rX + (size_t)t * M * D, M, D, &fh.w, scale, base, 0, rx + (size_t)t * D, NULL, NULL);
    dsv4_cuda_upload(dX, rX, sizeof(float) * (size_t)T * M * D);
    op_ok(dsv4_cuda_hc_head(dX, T, M, D, &dfh, ds, db, 1e-6f, 1e-6f, NULL, dx, scr, NULL), "hc_head");
    sync_ok();
    from_dev(gx, dx, sizeof(float) * (size_t)T * D);
    snprintf(name, sizeof name, "hc_head T=%d M=%d D=%d %s", T, M, D, dsv4_wfmt_name(fmt));
    check(name, gx, rx, (size_t)T * D, 1e-5 * rms(rx, (size_t)T * D), 1e-4);
    {
        int bad = 0;
        const int t0 = T / 2;
        op_ok(dsv4_cuda_hc_head(dX + (size_t)t0 * M * D, 1, M, D, &dfh, ds, db, 1e-6f, 1e-6f, NULL, dx2, scr, NULL), "hc_head");
        sync_ok();
        from_dev(g2, dx2, sizeof(float) * D);
        bad = memcmp(g2, gx + (size_t)t0 * D, sizeof(float) * D) != 0;
        g_checks++;
        if (bad) g_fail++;
        printf("%-4s hc_head batch invariance T=%d (token %d alone)%s\n", bad ? "FAIL" : "ok", T, t0, bad ? " <<<" : "");
    }
    op_ok(dsv4_cuda_rmsnorm(dx, T, D, D, dnw, 1e-6f, NULL), "rmsnorm");
    op_ok(dsv4_cuda_hc_head(dX, T, M, D, &dfh, ds, db, 1e-6f, 1e-6f, dnw, dx2, scr, NULL), "hc_head");
    sync_ok();
    from_dev(gx, dx, sizeof(float) * (size_t)T * D);
    from_dev(g2, dx2, sizeof(float) * (size_t)T * D);
    snprintf(name, sizeof name, "hc_head+norm = hc_head, rmsnorm T=%d D=%d", T, D);
    check_same(name, g2, gx, (size_t)T * D);

    dsv4_cuda_free(dX), dsv4_cuda_free(ds), dsv4_cuda_free(db), dsv4_cuda_free(dx), dsv4_cuda_free(dp), dsv4_cuda_free(dc),
        dsv4_cuda_free(df), dsv4_cuda_free(dnw), dsv4_cuda_free(dx2), dsv4_cuda_free(scr);
    dsv4_cuda_weight_free(&dfn), dsv4_cuda_weight_free(&dfh), free_hweight(&fn), free_hweight(&fh);
    free(X), free(scale), free(base), free(nw), free(rx), free(rp), free(rc), free(gx), free(gp), free(gc), free(g2), free(g3),
        free(f), free(rX), free(gX);
}
