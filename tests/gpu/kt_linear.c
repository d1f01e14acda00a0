/* kt_linear.c - test_kernels: the decode GEMV (dsv4_cuda_linear) in every format against the CPU twin, its batch
 * invariance, the multi-token GEMM (bitwise the GEMV), the grouped linears, and the prefill GEMMs (FP8 on cuBLASLt, the
 * split bf16 one) with the cases they decline. */
#include "kt.h"

/* ---- linear ---- */

/* x rounded to bf16 in place (round to nearest even, as the device's act_bf16 staging and torch's .to(bfloat16)) */
void round_bf16(float *x, size_t n) {
    for (size_t i = 0; i < n; i++) x[i] = dsv4_bf16_to_f32(dsv4_f32_to_bf16(x[i]));
}

/* row0 > 0: a view of rows row0 .. row0+R-1 of a stored [row0 + R, C] weight (slices of fused tensors).
 * ab: the device weight has act_bf16 (BF16 activations); the twin is dsv4_cpu_linear on x rounded to bf16 (unless
 * aq: the act quant wins), while the device gets the fp32 x: the rounding is the kernel's. */
void test_linear_ab(const char *tag, dsv4_wfmt fmt, int R, int C, int T, int scale_f32, int aq, int xbf16, int row0,
                           int ab) {
    hweight h = make_weight(fmt, R + row0, C, scale_f32, aq);
    h.w.row0 = row0, h.w.rows = R;
    dsv4_cuda_weight dw;
    op_ok(dsv4_cuda_weight_upload(&h.w, &dw), "weight upload");
    dw.act_bf16 = ab;
    float *x = rand_wide((size_t)T * C), *xr = malloc(sizeof(float) * (size_t)T * C);
    uint16_t *xb = NULL;
    if (xbf16) { /* the reference sees the bf16 values */
        xb = malloc(sizeof(uint16_t) * (size_t)T * C);
        for (size_t i = 0; i < (size_t)T * C; i++) x[i] = dsv4_bf16_to_f32(xb[i] = dsv4_f32_to_bf16(x[i]));
    }
    memcpy(xr, x, sizeof(float) * (size_t)T * C);
    if (ab && !aq) round_bf16(xr, (size_t)T * C);
    float *ref = malloc(sizeof(float) * (size_t)T * R), *got = malloc(sizeof(float) * (size_t)T * R);
    dsv4_cpu_linear(&h.w, xr, T, ref);
    void *dx = xbf16 ? dup_to_dev(xb, sizeof(uint16_t) * (size_t)T * C) : dup_to_dev(x, sizeof(float) * (size_t)T * C);
    float *dy = dsv4_cuda_alloc(sizeof(float) * (size_t)T * R);
    op_ok(dsv4_cuda_linear(&dw, dx, xbf16, T, dy, NULL), "linear");
    sync_ok();
    from_dev(got, dy, sizeof(float) * (size_t)T * R);
    char name[128];
    snprintf(name, sizeof name, "linear %s %s%s %dx%d%s T=%d%s%s%s", tag, dsv4_wfmt_name(fmt), scale_f32 ? "(f32 s)" : "", R, C,
             row0 ? "+view" : "", T, aq ? " aq" : "", xbf16 ? " x:bf16" : "", ab ? " act:bf16" : "");
    /* fp32 vs double accumulation: errors ~ eps * sqrt(C) * |terms|, far below 1e-4 * rms (with act_bf16 the twin
     * rounds x as the kernel does, so the same bound holds; a kernel that skipped the rounding would be ~2^-9 off) */
    check(name, got, ref, (size_t)T * R, 1e-4 * rms(ref, (size_t)T * R), 1e-4);
    dsv4_cuda_free(dx), dsv4_cuda_free(dy), dsv4_cuda_weight_free(&dw);
    free(x), free(xr), free(xb), free(ref), free(got), free_hweight(&h);
}
void test_linear_v(const char *tag, dsv4_wfmt fmt, int R, int C, int T, int scale_f32, int aq, int xbf16, int row0) {
    test_linear_ab(tag, fmt, R, C, T, scale_f32, aq, xbf16, row0, 0);
}
void test_linear(const char *tag, dsv4_wfmt fmt, int R, int C, int T, int scale_f32, int aq, int xbf16) {
    test_linear_v(tag, fmt, R, C, T, scale_f32, aq, xbf16, 0);
}
/* BF16 activations (act_bf16) at T = 1, 5, 16 (the tensor-core GEMV, one and two 8-token tiles) and 40 (16 rows per
 * launch; the tiled GEMM for odd sizes) */
void test_linear_bf16act(const char *tag, dsv4_wfmt fmt, int R, int C, int row0) {
    static const int Ts[4] = {1, 5, 16, 40};
    for (int i = 0; i < 4; i++) test_linear_ab(tag, fmt, R, C, Ts[i], 0, 0, 0, row0, 1);
}

/* Bitwise the same rows whatever T (1 .. 16, and 40: prefill) and the other rows of x are, and from run to run. */
void test_linear_invariant(const char *tag, dsv4_wfmt fmt, int R, int C, int aq, int ab) {
    hweight h = make_weight(fmt, R, C, 0, aq);
    dsv4_cuda_weight dw;
    op_ok(dsv4_cuda_weight_upload(&h.w, &dw), "weight upload");
    dw.act_bf16 = ab;
    const int T = 16, Ts[7] = {1, 2, 3, 5, 8, 9, 13}, TL = 40;
    float *x = rand_wide((size_t)TL * C);
    float *dx = dup_to_dev(x, sizeof(float) * (size_t)TL * C), *dy = dsv4_cuda_alloc(sizeof(float) * (size_t)T * R),
          *dy1 = dsv4_cuda_alloc(sizeof(float) * (size_t)TL * R);
    float *y16 = malloc(sizeof(float) * (size_t)T * R), *y1 = malloc(sizeof(float) * (size_t)TL * R);
    op_ok(dsv4_cuda_linear(&dw, dx, 0, T, dy, NULL), "linear");
    sync_ok();
    from_dev(y16, dy, sizeof(float) * (size_t)T * R);
    int bad = 0, runs = 0;
    for (int k = 0; k < 7; k++)
        for (int side = 0; side < 2; side++) {
            int Tk = Ts[k], t0 = side ? T - Tk : 0;
            op_ok(dsv4_cuda_linear(&dw, dx + (size_t)t0 * C, 0, Tk, dy1, NULL), "linear");
            sync_ok();
            from_dev(y1, dy1, sizeof(float) * (size_t)Tk * R);
            bad += memcmp(y1, y16 + (size_t)t0 * R, sizeof(float) * (size_t)Tk * R) != 0, runs++;
        }
    op_ok(dsv4_cuda_linear(&dw, dx, 0, T, dy1, NULL), "linear");
    sync_ok();
    from_dev(y1, dy1, sizeof(float) * (size_t)T * R);
    bad += memcmp(y1, y16, sizeof(float) * (size_t)T * R) != 0, runs++;
    op_ok(dsv4_cuda_linear(&dw, dx, 0, TL, dy1, NULL), "linear"); /* prefill: rows 0..15 again, row 37 below */
    sync_ok();
    from_dev(y1, dy1, sizeof(float) * (size_t)TL * R);
    bad += memcmp(y1, y16, sizeof(float) * (size_t)T * R) != 0, runs++;
    float *y37 = malloc(sizeof(float) * (size_t)R);
    op_ok(dsv4_cuda_linear(&dw, dx + (size_t)37 * C, 0, 1, dy, NULL), "linear");
    sync_ok();
    from_dev(y37, dy, sizeof(float) * (size_t)R);
    bad += memcmp(y37, y1 + (size_t)37 * R, sizeof(float) * (size_t)R) != 0, runs++;
    free(y37);
    g_checks++;
    if (bad) g_fail++;
    printf("%-4s linear %s %s %dx%d%s%s: rows bitwise equal for T = 1..16, 40 and a rerun (%d of %d calls differ)%s\n",
           bad ? "FAIL" : "ok", tag, dsv4_wfmt_name(fmt), R, C, aq ? " aq" : "", ab ? " act:bf16" : "", bad, runs, bad ? " <<<" : "");
    dsv4_cuda_free(dx), dsv4_cuda_free(dy), dsv4_cuda_free(dy1), dsv4_cuda_weight_free(&dw);
    free(x), free(y16), free(y1), free_hweight(&h);
}

/* ---- the multi-token GEMM (dsv4_cuda_linear_ws / _multi_ws, linear_bi.cu): every row bitwise the GEMV's ---- */

void *g_lws; /* set: test_linear_multi's grouped call gets this workspace (its references stay the GEMV) */
size_t g_lwsb;

/* dsv4_cuda_linear_ws (the multi-token GEMM from DSV4_CUDA_LINEAR_WS_MIN_T rows; more than 256: passes) against
 * dsv4_cuda_linear (the GEMV, 16 rows a launch), bitwise, and a rerun; plus the CPU twin's tolerance on a sample of rows */
void test_linear_mt(const char *tag, dsv4_wfmt fmt, int R, int C, int T, int sf32, int aq, int ab, int xbf16, int row0) {
    hweight h = make_weight(fmt, R + row0, C, sf32, aq);
    h.w.row0 = row0, h.w.rows = R;
    dsv4_cuda_weight dw;
    op_ok(dsv4_cuda_weight_upload(&h.w, &dw), "weight upload");
    dw.act_bf16 = ab;
    const size_t xn = (size_t)T * C, yn = (size_t)T * R;
    float *x = rand_wide(xn);
    uint16_t *xb = malloc(2 * xn);
    for (size_t i = 0; i < xn; i++) x[i] = xbf16 ? dsv4_bf16_to_f32(xb[i] = dsv4_f32_to_bf16(x[i])) : x[i];
    void *dx = xbf16 ? dup_to_dev(xb, 2 * xn) : dup_to_dev(x, 4 * xn);
    float *dy0 = dsv4_cuda_alloc(4 * yn), *dy1 = dsv4_cuda_alloc(4 * yn);
    const size_t wsb = dsv4_cuda_linear_ws_bytes(T, C, 1);
    void *ws = dsv4_cuda_alloc(wsb);
    op_ok(dsv4_cuda_memset(dy1, 0xff, 4 * yn, NULL), "memset");
    op_ok(dsv4_cuda_linear(&dw, dx, xbf16, T, dy0, NULL), "linear");
    op_ok(dsv4_cuda_linear_ws(&dw, dx, xbf16, T, dy1, ws, wsb, NULL), "linear ws");
    sync_ok();
    float *y0 = malloc(4 * yn), *y1 = malloc(4 * yn);
    from_dev(y0, dy0, 4 * yn);
    from_dev(y1, dy1, 4 * yn);
    size_t nd = 0;
    for (size_t i = 0; i < yn; i++) nd += memcmp(&y0[i], &y1[i], 4) != 0;
    op_ok(dsv4_cuda_linear_ws(&dw, dx, xbf16, T, dy1, ws, wsb, NULL), "linear ws");
    sync_ok();
    from_dev(y0, dy1, 4 * yn);
    const int rerun = memcmp(y0, y1, 4 * yn) != 0;
    g_checks++;
    if (nd || rerun) g_fail++;
    printf("%-4s linear mt %s %s %dx%d%s T=%d%s%s%s: bitwise the GEMV (%zu of %zu values differ), rerun %s%s\n",
           nd || rerun ? "FAIL" : "ok", tag, dsv4_wfmt_name(fmt), R, C, row0 ? "+view" : "", T, aq ? " aq" : "",
           ab ? " act:bf16" : "", xbf16 ? " x:bf16" : "", nd, yn, rerun ? "differs" : "the same", nd || rerun ? " <<<" : "");
    /* the twin on the first and last 3 rows (the GEMV's own accuracy, checked at 1e-4 elsewhere) */
    const int ts[6] = {0, 1, 2, T - 3, T - 2, T - 1};
    float *xr = malloc(4 * (size_t)C * 6), *ref = malloc(4 * (size_t)R * 6), *got = malloc(4 * (size_t)R * 6);
    for (int i = 0; i < 6; i++) {
        memcpy(xr + (size_t)i * C, x + (size_t)ts[i] * C, 4 * (size_t)C);
        memcpy(got + (size_t)i * R, y1 + (size_t)ts[i] * R, 4 * (size_t)R);
    }
    if (ab && !aq) round_bf16(xr, (size_t)C * 6);
    dsv4_cpu_linear(&h.w, xr, 6, ref);
    char name[128];
    snprintf(name, sizeof name, "linear mt %s %s %dx%d T=%d (6 rows)", tag, dsv4_wfmt_name(fmt), R, C, T);
    check(name, got, ref, (size_t)R * 6, 1e-4 * rms(ref, (size_t)R * 6), 1e-4);
    dsv4_cuda_free(dx), dsv4_cuda_free(dy0), dsv4_cuda_free(dy1), dsv4_cuda_free(ws), dsv4_cuda_weight_free(&dw);
    free(x), free(xb), free(y0), free(y1), free(xr), free(ref), free(got), free_hweight(&h);
}

/* ---- grouped linears (dsv4_cuda_linear_multi) ---- */



/* n wo_a groups (views of one FP8 act-quant weight, 1024 rows x 4096 each) */
void ms_wo_a(mspec *w, int n) {
    for (int i = 0; i < n; i++) w[i] = (mspec){DSV4_WF_FP8, 1024, 4096, 1, 0, 0};
}
/* the same without act quant: wo_a as the model runs it (FP8 in the release, fp32 x: two f16 terms) */
void ms_wo_a_x32(mspec *w, int n) {
    for (int i = 0; i < n; i++) w[i] = (mspec){DSV4_WF_FP8, 1024, 4096, 0, 0, 0};
}
/* 20 small BF16 jobs of three row counts (more jobs than one launch holds) */
void ms_b20(mspec *b) {
    for (int i = 0; i < 20; i++) b[i] = (mspec){DSV4_WF_BF16, 128 + 16 * (i % 3), 1024, 0, 0, 0};
}


void mweights_make(mweights *m, const mspec *s, int n, int views) {
    memset(m, 0, sizeof *m);
    m->nh = views ? 1 : n;
    for (int i = 0; i < m->nh; i++) {
        m->h[i] = make_weight(s[i].fmt, views ? n * s[0].R : s[i].R, s[i].C, s[i].sf32, s[i].aq);
        op_ok(dsv4_cuda_weight_upload(&m->h[i].w, &m->d[i]), "weight upload");
        m->d[i].act_bf16 = s[i].ab;
    }
    for (int i = 0; i < n; i++) {
        m->w[i] = m->d[views ? 0 : i];
        if (views) m->w[i].row0 = i * s[0].R, m->w[i].rows = s[0].R;
    }
}
void mweights_free(mweights *m) {
    for (int i = 0; i < m->nh; i++) dsv4_cuda_weight_free(&m->d[i]), free_hweight(&m->h[i]);
}

/* x of the jobs: xs = 0: one x [T, C] for all (ldx left 0: contiguous); xs = 1: job i reads its C_i columns of a
 * [T, sum C] x at their offset. y: ys = 0: a contiguous y per job (ldy 0); ys = 1: job i writes its R_i columns of one
 * y whose rows are sum R + 3 n wide (3 columns between jobs, which must stay untouched). Sets xo / yo (element offsets),
 * *ldx, *ldy. */
void multi_layout(const mspec *s, int n, int xs, int ys, int64_t *xo, int64_t *yo, int64_t *ldx, int64_t *ldy) {
    int64_t cx = 0, cy = 0;
    for (int i = 0; i < n; i++) {
        xo[i] = xs ? cx : 0, cx += s[i].C;
        yo[i] = ys ? cy : 0, cy += s[i].R + 3;
    }
    *ldx = xs ? cx : s[0].C;
    *ldy = cy;
}

/* dsv4_cuda_linear_multi gives each job's rows bitwise as dsv4_cuda_linear on contiguous rows does (whatever the other
 * jobs, their formats and row counts are; strided x / y; jobs the tensor-core GEMV cannot take; more jobs than one
 * launch holds), and leaves y between the jobs' columns alone. */
void test_linear_multi(const char *tag, const mspec *s, int n, int views, int xs, int ys, int xbf16, int T) {
    mweights m;
    mweights_make(&m, s, n, views);
    int64_t xo[MJ_MAX], yo[MJ_MAX], ldx, ldy;
    multi_layout(s, n, xs, ys, xo, yo, &ldx, &ldy);
    const size_t xn = (size_t)T * ldx, es = xbf16 ? 2 : 4;
    float *x = rand_wide(xn);
    uint16_t *xb = malloc(2 * (xn ? xn : 1));
    for (size_t i = 0; i < xn; i++) xb[i] = dsv4_f32_to_bf16(x[i]);
    const void *xh = xbf16 ? (const void *)xb : (const void *)x;
    uint8_t *dx = dup_to_dev(xh, es * xn);
    float *dy[MJ_MAX], *dyc = NULL;
    const size_t yall = ys ? (size_t)T * ldy : 0;
    if (ys) {
        dyc = dsv4_cuda_alloc(4 * yall);
        op_ok(dsv4_cuda_memset(dyc, 0xff, 4 * yall, NULL), "memset");
    }
    dsv4_cuda_linear_job jb[MJ_MAX];
    for (int i = 0; i < n; i++) {
        dy[i] = ys ? dyc + yo[i] : dsv4_cuda_alloc(4 * (size_t)T * s[i].R);
        if (!ys) op_ok(dsv4_cuda_memset(dy[i], 0xff, 4 * (size_t)T * s[i].R, NULL), "memset");
        jb[i].w = m.w[i];
        jb[i].x = dx + es * (size_t)xo[i];
        jb[i].ldx = xs ? ldx : 0;
        jb[i].y = dy[i];
        jb[i].ldy = ys ? ldy : 0;
    }
    op_ok(g_lws ? dsv4_cuda_linear_multi_ws(jb, n, xbf16, T, g_lws, g_lwsb, NULL) : dsv4_cuda_linear_multi(jb, n, xbf16, T, NULL),
          "linear multi");
    sync_ok();
    int bad = 0, gap = 0;
    float *yc = ys ? malloc(4 * yall) : NULL;
    if (ys) {
        from_dev(yc, dyc, 4 * yall);
        for (int t = 0; t < T; t++)
            for (int i = 0; i < n; i++)
                for (int k = 0; k < 3; k++) {
                    uint32_t u;
                    memcpy(&u, yc + (size_t)t * ldy + yo[i] + s[i].R + k, 4);
                    gap += u != 0xffffffffu;
                }
    }
    for (int i = 0; i < n; i++) { /* the reference: the job alone, on a contiguous copy of its x */
        const int C = s[i].C, R = s[i].R;
        uint8_t *xi = malloc(es * (size_t)T * C);
        for (int t = 0; t < T; t++) memcpy(xi + es * (size_t)t * C, (const uint8_t *)xh + es * ((size_t)t * ldx + xo[i]), es * C);
        void *dxi = dup_to_dev(xi, es * (size_t)T * C);
        float *dr = dsv4_cuda_alloc(4 * (size_t)T * R), *ref = malloc(4 * (size_t)T * R), *got = malloc(4 * (size_t)T * R);
        op_ok(dsv4_cuda_linear(&m.w[i], dxi, xbf16, T, dr, NULL), "linear");
        sync_ok();
        from_dev(ref, dr, 4 * (size_t)T * R);
        if (ys)
            for (int t = 0; t < T; t++) memcpy(got + (size_t)t * R, yc + (size_t)t * ldy + yo[i], 4 * R);
        else
            from_dev(got, dy[i], 4 * (size_t)T * R);
        bad += memcmp(got, ref, 4 * (size_t)T * R) != 0;
        dsv4_cuda_free(dxi), dsv4_cuda_free(dr), free(xi), free(ref), free(got);
        if (!ys) dsv4_cuda_free(dy[i]);
    }
    g_checks++;
    if (bad || gap) g_fail++;
    char fm[96] = "";
    for (int i = 0, k = 0; i < n && k < 80; i++)
        if (!i || s[i].fmt != s[i - 1].fmt || s[i].R != s[i - 1].R || s[i].C != s[i - 1].C)
            k += snprintf(fm + k, sizeof fm - k, "%s%s %dx%d", k ? ", " : "", dsv4_wfmt_name(s[i].fmt), s[i].R, s[i].C);
    printf("%-4s linear multi%s %s (%d jobs: %s%s%s%s%s) T=%d: rows bitwise equal to dsv4_cuda_linear (%d of %d jobs differ, %d gap "
           "values written)%s\n",
           bad || gap ? "FAIL" : "ok", g_lws ? " mt" : "", tag, n, fm, views ? "; views" : "", xs ? "; x strided" : "", ys ? "; y strided" : "",
           xbf16 ? "; x:bf16" : "", T, bad, n, gap, bad || gap ? " <<<" : "");
    dsv4_cuda_free(dx), dsv4_cuda_free(dyc), free(x), free(xb), free(yc);
    mweights_free(&m);
}

void test_linear_multi_T(const char *tag, const mspec *s, int n, int views, int xs, int ys, int xbf16) {
    static const int Ts[4] = {1, 3, 16, 40};
    for (int i = 0; i < 4; i++) test_linear_multi(tag, s, n, views, xs, ys, xbf16, Ts[i]);
}

/* FP8 act-quant prefill GEMM (linear_gemm.h, cuBLASLt block-scaled FP8) against dsv4_cpu_linear; big shapes on a sample
 * of rows (every row's act quant is its own, so a subset of x is exact), the last T % 4 rows (GEMV) always.
 * Its tolerance is bf16's, not the GEMV checks' (1e-4): Hopper's FP8 tensor cores sum the e4m3 products of each
 * 128-column block with ~14 significant bits before the block scales apply in fp32 (DeepSeek's own FP8 GEMMs promote
 * at the same interval), measured on the H200 (2026-12-01) as relative L2 1.8-2.0e-4 whatever K, worst element
 * 1.8e-3 (|ref| + rms(ref)). DeepSeek's FP8 GEMMs round their output to bf16 (spec 14.4), an error of up to 2^-8 |y|
 * per element (half a bf16 ulp at the bottom of a binade) and ~1.6e-3 relative L2 over a random output. So:
 *   every element within 2^-8 (|ref| + rms(ref)): no further than the reference recipe's own output rounding, with
 *     rms(ref) standing for the summands' size where cancellation makes |ref| small;
 *   relative L2 <= 1e-3: below the output rounding's 1.6e-3 (5x the measured error);
 *   a rerun gives the same bits. */
void test_linear_gemm(const char *tag, int R, int C, int T, int scale_f32, int row0) {
    hweight h = make_weight(DSV4_WF_FP8, R + row0, C, scale_f32, 1);
    h.w.row0 = row0, h.w.rows = R;
    dsv4_cuda_weight dw;
    op_ok(dsv4_cuda_weight_upload(&h.w, &dw), "weight upload");
    float *x = rand_wide((size_t)T * C);
    float *dx = dup_to_dev(x, sizeof(float) * (size_t)T * C), *dy = dsv4_cuda_alloc(sizeof(float) * (size_t)T * R);
    const size_t wsb = dsv4_cuda_linear_gemm_ws_bytes(T, C, R);
    void *ws = dsv4_cuda_alloc(wsb);
    if (!dy || !ws) op_ok(-1, "gemm buffers");
    char name[128];
    snprintf(name, sizeof name, "linear gemm %s FP8%s %dx%d%s T=%d aq", tag, scale_f32 ? "(f32 s)" : "", R, C, row0 ? "+view" : "", T);
    int rc = dsv4_cuda_linear_gemm(&dw, dx, T, dy, ws, wsb, NULL);
    if (rc < 0) op_ok(rc, name);
    if (rc == 1) { /* declined (no cuBLASLt, no algorithm): a failure here, the shape was meant to take it */
        g_checks++, g_fail++;
        printf("FAIL %s: declined (not applicable) <<<\n", name);
    } else {
        sync_ok();
        float *got = malloc(sizeof(float) * (size_t)T * R);
        from_dev(got, dy, sizeof(float) * (size_t)T * R);
        /* rows checked: all when the CPU twin is cheap, else 0..3, ~32 spread rows and the last 4 */
        int *rows = malloc(sizeof(int) * (size_t)T), nr = 0;
        const int full = (double)T * R * C <= 2147483648.0, step = T / 32 > 0 ? T / 32 : 1;
        for (int t = 0; t < T; t++)
            if (full || t < 4 || t >= T - 4 || t % step == (t / step * 7) % step) rows[nr++] = t;
        float *xs = malloc(sizeof(float) * (size_t)nr * C), *ref = malloc(sizeof(float) * (size_t)nr * R),
              *gs = malloc(sizeof(float) * (size_t)nr * R);
        for (int i = 0; i < nr; i++) {
            memcpy(xs + (size_t)i * C, x + (size_t)rows[i] * C, sizeof(float) * (size_t)C);
            memcpy(gs + (size_t)i * R, got + (size_t)rows[i] * R, sizeof(float) * (size_t)R);
        }
        dsv4_cpu_linear(&h.w, xs, nr, ref);
        double e2 = 0, r2 = 0;
        for (size_t i = 0; i < (size_t)nr * R; i++) e2 += ((double)gs[i] - ref[i]) * ((double)gs[i] - ref[i]), r2 += (double)ref[i] * ref[i];
        const double rl2 = r2 > 0 ? sqrt(e2 / r2) : 0.0, bf = 1.0 / 256; /* 2^-8 */
        char cname[192];
        snprintf(cname, sizeof cname, "%s (%d of %d rows; bf16 tol)", name, nr, T);
        check(cname, gs, ref, (size_t)nr * R, bf * rms(ref, (size_t)nr * R), bf);
        const int lok = rl2 <= 1e-3;
        g_checks++, g_fail += !lok;
        printf("%-4s %s: relative L2 %.2e vs the twin (<= 1e-3)%s\n", lok ? "ok" : "FAIL", name, rl2, lok ? "" : " <<<");
        op_ok(dsv4_cuda_linear_gemm(&dw, dx, T, dy, ws, wsb, NULL) < 0, "linear gemm rerun");
        sync_ok();
        float *got2 = malloc(sizeof(float) * (size_t)T * R);
        from_dev(got2, dy, sizeof(float) * (size_t)T * R);
        const int same = !memcmp(got, got2, sizeof(float) * (size_t)T * R);
        g_checks++, g_fail += !same;
        printf("%-4s %s: rerun bitwise equal%s\n", same ? "ok" : "FAIL", name, same ? "" : " <<<");
        free(got), free(got2), free(rows), free(xs), free(ref), free(gs);
    }
    dsv4_cuda_free(dx), dsv4_cuda_free(dy), dsv4_cuda_free(ws), dsv4_cuda_weight_free(&dw);
    free(x), free_hweight(&h);
}

/* The split GEMM (linear_gemm.h: weights without act quant, x as three bf16 terms, or one for act_bf16) against
 * dsv4_cpu_linear at the GEMV checks' tolerance (1e-4: the three terms hold x to ~2^-24, the products are exact in
 * fp32, the tensor cores accumulate in fp32); x and y as slices of wider rows (ldx, ldy: the wo_a groups) with the gaps
 * of y untouched; a rerun bitwise equal. FP8 weights without act_bf16: the three-term forms first, then the default
 * two terms, then one term against the twin on x rounded to bf16 (the same tolerance: only x's rounding differs). */
/* y's rows (T of ldy floats) gathered into gs (T x R); the values written in the gaps past R (which hold NaN) counted */
static long gather_rows(const float *host, int T, int R, int64_t ldy, float *gs) {
    long gap = 0;
    for (int t = 0; t < T; t++) {
        memcpy(gs + (size_t)t * R, host + (size_t)t * ldy, sizeof(float) * (size_t)R);
        for (int64_t i = R; i < ldy; i++) gap += !isnan(host[(size_t)t * ldy + i]);
    }
    return gap;
}

/* one more form of the split GEMM on the same x (as the switches now select it) against ref at the GEMV checks'
 * tolerance, y's gaps untouched; host: T x ldy floats, gs: T x R */
static void split_variant(const char *name, const char *form, const dsv4_cuda_weight *dw, const float *dxs, int64_t ldx,
                          int T, int R, float *dy, int64_t ldy, void *ws, size_t wsb, float *host, float *gs, const float *ref) {
    char n2[200];
    snprintf(n2, sizeof n2, "%s (%s)", name, form);
    op_ok(dsv4_cuda_fill(dy, (int64_t)T * ldy, NAN, NULL), "fill");
    op_ok(dsv4_cuda_linear_gemm_split(dw, dxs, ldx, T, dy, ldy, ws, wsb, NULL), n2);
    sync_ok();
    from_dev(host, dy, sizeof(float) * (size_t)T * ldy);
    const long gap = gather_rows(host, T, R, ldy, gs);
    check(n2, gs, ref, (size_t)T * R, 1e-4 * rms(ref, (size_t)T * R), 1e-4);
    g_checks++, g_fail += gap != 0;
    printf("%-4s %s: %ld gap values written%s\n", gap ? "FAIL" : "ok", n2, gap, gap ? " <<<" : "");
}

/* dsv4_cuda_linear_gemm_terms on x's terms made here as the split makes them (hi = bf16(x), mid = bf16(x - hi), lo =
 * bf16(x - hi - mid); row t's term j at t * ldt + j * C, ldt = nt C + 8) against the split's own result (host: T x ldy,
 * the split with the same switches), y's gaps untouched */
static void terms_variant(const char *name, const dsv4_cuda_weight *dw, const float *x, int64_t ldx, int xoff, int T, int R,
                          int C, float *dy, int64_t ldy, void *ws, size_t wsb, const float *split, float *host) {
    const int nt = dsv4_cuda_linear_gemm_terms_nt(dw);
    char n2[200];
    snprintf(n2, sizeof n2, "%s (terms given, %d)", name, nt);
    const int64_t ldt = (int64_t)nt * C + 8;
    uint16_t *tt = calloc((size_t)T * ldt, sizeof(uint16_t));
    for (int t = 0; t < T; t++)
        for (int k = 0; k < C; k++) {
            float v = x[(size_t)t * ldx + xoff + k];
            for (int j = 0; j < nt; j++) {
                const uint16_t b = dsv4_f32_to_bf16(v);
                tt[(size_t)t * ldt + (size_t)j * C + k] = b;
                v -= dsv4_bf16_to_f32(b);
            }
        }
    uint16_t *dt = dup_to_dev(tt, sizeof(uint16_t) * (size_t)T * ldt);
    const int ready = dsv4_cuda_linear_gemm_terms_ready(dw, dt, ldt, C, nt, T, dy, ldy);
    /* cat 1: FP8 with two terms, hi and mid side by side: one GEMM on [W | W] (dsv4_cuda_linear_gemm_terms_cat), with
     * a workspace that holds [W | W] (the split's for these few rows may not) */
    const size_t wcat = dsv4_cuda_linear_gemm_split_ws_bytes(0, 2 * C, R);
    void *wsc = wsb >= wcat ? ws : dsv4_cuda_alloc(wcat);
    for (int cat = 0; cat <= (dw->fmt == DSV4_WF_FP8 && nt == 2); cat++) {
        dsv4_cuda_linear_gemm_terms_cat(cat);
        op_ok(dsv4_cuda_fill(dy, (int64_t)T * ldy, NAN, NULL), "fill");
        const int rc = dsv4_cuda_linear_gemm_terms(dw, dt, ldt, C, nt, T, dy, ldy, cat ? wsc : ws, cat && wsc != ws ? wcat : wsb, NULL);
        const int took = dsv4_cuda_linear_gemm_terms_last_cat();
        dsv4_cuda_linear_gemm_terms_cat(-1);
        if (rc < 0) op_ok(rc, n2);
        sync_ok();
        from_dev(host, dy, sizeof(float) * (size_t)T * ldy);
        long diff = 0, gap = 0;
        double md = 0, sc = 0;
        for (int t = 0; t < T; t++) {
            for (int r = 0; r < R; r++) {
                const float a = host[(size_t)t * ldy + r], b = split[(size_t)t * ldy + r];
                diff += memcmp(&a, &b, 4) != 0, md = fmax(md, fabs((double)a - b)), sc = fmax(sc, fabs((double)b));
            }
            for (int64_t i = R; i < ldy; i++) gap += !isnan(host[(size_t)t * ldy + i]);
        }
        /* cuBLASLt may pick another algorithm for the wider B rows (another summation order), and cat sums both terms'
         * products in one: 1e-5 of y's largest; cat must have run (its workspace holds [W | W]) */
        const int ok = nt > 0 && ready && rc == 0 && !gap && md <= 1e-5 * sc && took == cat;
        g_checks++, g_fail += !ok;
        printf("%-4s %s%s: ready %d, %ld of %ld values differ from the split's (largest %.3g of %.3g), %ld gap values written%s\n",
               ok ? "ok" : "FAIL", n2, !cat ? "" : took ? " one GEMM on [W | W]" : " [W | W] NOT taken", ready, diff, (long)T * R, md, sc,
               gap, ok ? "" : " <<<");
    }
    if (wsc != ws) dsv4_cuda_free(wsc);
    dsv4_cuda_free(dt);
    free(tt);
}

/* dsv4_cuda_linear_gemm_terms_f16 on one f16 term t = f16(x 2^-s) made here (row t at t * ldt, ldt = C + 8; s from
 * dsv4_cuda_wo_a_f16_scale on x's own values, the bound it puts on attention outputs), alpha / beta read from the
 * device: against the CPU linear on x rounded the same way (f16(x 2^-s) 2^s: exact in fp32; the products of f16 values
 * are exact in fp32, so only the summation order differs), and the rounding's distance from fp32 x bounded by f16's
 * 2^-11; y's gaps untouched */
static void f16_term_variant(const char *name, const hweight *h, const dsv4_cuda_weight *dw, const float *x, int64_t ldx, int xoff,
                             int T, int R, int C, float *dy, int64_t ldy, void *ws, size_t wsb, const float *ref, float *host) {
    char n2[200];
    snprintf(n2, sizeof n2, "%s (one f16 term given)", name);
    float *xs = malloc(sizeof(float) * (size_t)T * C), *xq = malloc(sizeof(float) * (size_t)T * C),
          *rq = malloc(sizeof(float) * (size_t)T * R), *gs = malloc(sizeof(float) * (size_t)T * R);
    for (int t = 0; t < T; t++) memcpy(xs + (size_t)t * C, x + (size_t)t * ldx + xoff, sizeof(float) * (size_t)C);
    const float *nw[1] = {xs};
    const int nn[1] = {T * C};
    float sc[3];
    const int bad = dsv4_cuda_wo_a_f16_scale(nw, nn, 1, 1, dw->f16_shift, sc);
    const int64_t ldt = (int64_t)C + 8;
    uint16_t *tt = calloc((size_t)T * ldt, sizeof(uint16_t));
    long over = 0;
    for (int t = 0; t < T; t++)
        for (int k = 0; k < C; k++) {
            const uint16_t b = dsv4_f32_to_f16(xs[(size_t)t * C + k] * sc[0]);
            tt[(size_t)t * ldt + k] = b;
            xq[(size_t)t * C + k] = dsv4_f16_to_f32(b) / sc[0];
            over += !(fabsf(dsv4_f16_to_f32(b)) < 32768.0f);
        }
    dsv4_cpu_linear(&h->w, xq, T, rq);
    uint16_t *dt = dup_to_dev(tt, sizeof(uint16_t) * (size_t)T * ldt);
    float *dab = dup_to_dev(sc, sizeof sc);
    const int ready = !bad && dsv4_cuda_linear_gemm_terms_f16_ready(dw, dt, ldt, T, dy, ldy);
    op_ok(dsv4_cuda_fill(dy, (int64_t)T * ldy, NAN, NULL), "fill");
    const int rc = bad ? 1 : dsv4_cuda_linear_gemm_terms_f16(dw, dt, ldt, T, dy, ldy, dab + 1, ws, wsb, NULL);
    if (rc < 0) op_ok(rc, n2);
    sync_ok();
    from_dev(host, dy, sizeof(float) * (size_t)T * ldy);
    const long gap = gather_rows(host, T, R, ldy, gs);
    check(n2, gs, rq, (size_t)T * R, 1e-4 * rms(rq, (size_t)T * R), 1e-4);
    /* f16 against fp32 x: each term within 2^-12 of its value (relative; round to nearest), independent roundings, so
     * y's relative L2 distance ~2^-12 / sqrt(3); the bar 2^-10 (one bf16 term's is ~2^-9 / sqrt(3)) */
    double dd = 0, rr = 0;
    for (size_t i = 0; i < (size_t)T * R; i++) dd += ((double)gs[i] - ref[i]) * ((double)gs[i] - ref[i]), rr += (double)ref[i] * ref[i];
    const double md = sqrt(dd / (rr > 0 ? rr : 1)), bar = 1.0 / 1024;
    const int ok = !bad && ready && rc == 0 && !gap && !over && md <= bar;
    g_checks++, g_fail += !ok;
    printf("%-4s %s: scale 2^%d, alpha %g, ready %d, %ld gap values written, %ld terms at or past 2^15, relative L2 from "
           "fp32 x %.3g (bar %.3g)%s\n",
           ok ? "ok" : "FAIL", n2, bad ? 0 : -(int)log2f(sc[0]), bad ? 0.0 : (double)sc[1], ready, gap, over, md, bar, ok ? "" : " <<<");
    dsv4_cuda_free(dt), dsv4_cuda_free(dab);
    free(tt), free(xs), free(xq), free(rq), free(gs);
}

/* the split with its terms four values a thread (lg_split4) against the same call's result with the default (split: the
 * host copy of it, T x ldy), bitwise on the R columns of every row */
static void split4_same(const char *name, const dsv4_cuda_weight *dw, const float *dxs, int64_t ldx, int T, int R, float *dy,
                        int64_t ldy, void *ws, size_t wsb, const float *split, float *host) {
    dsv4_cuda_linear_gemm_split4(1);
    op_ok(dsv4_cuda_fill(dy, (int64_t)T * ldy, NAN, NULL), "fill");
    op_ok(dsv4_cuda_linear_gemm_split(dw, dxs, ldx, T, dy, ldy, ws, wsb, NULL) != 0, "split (split4)");
    sync_ok();
    const int took = dsv4_cuda_linear_gemm_split_last_s4();
    dsv4_cuda_linear_gemm_split4(0); /* (the callers' baselines: one value a thread, whatever DSV4_LINEAR_SPLIT4 says) */
    from_dev(host, dy, sizeof(float) * (size_t)T * ldy);
    long nd = 0;
    for (int t = 0; t < T; t++) nd += memcmp(host + (size_t)t * ldy, split + (size_t)t * ldy, sizeof(float) * (size_t)R) != 0;
    g_checks++, g_fail += nd != 0 || !took;
    printf("%-4s %s (x terms four a thread%s): %ld of %d rows differ from the one-a-thread split's%s\n", nd || !took ? "FAIL" : "ok", name,
           took ? "" : ", NOT taken", nd, T, nd || !took ? " <<<" : "");
}

void test_linear_gemm_split(const char *tag, dsv4_wfmt fmt, int R, int C, int T, int row0, int ab, int strided) {
    hweight h = make_weight(fmt, R + row0, C, 0, 0);
    h.w.row0 = row0, h.w.rows = R;
    dsv4_cuda_weight dw;
    op_ok(dsv4_cuda_weight_upload(&h.w, &dw), "weight upload");
    dw.act_bf16 = ab;
    dsv4_cuda_linear_gemm_split4(0); /* the split's terms one value a thread (split4_same forces the other form) */
    const int64_t ldx = strided ? 3 * C : C, ldy = strided ? 2 * R + 4 : R;
    float *x = rand_wide((size_t)T * ldx), *xr = malloc(sizeof(float) * (size_t)T * C);
    for (int t = 0; t < T; t++) memcpy(xr + (size_t)t * C, x + (size_t)t * ldx + (strided ? C : 0), sizeof(float) * (size_t)C);
    if (ab) round_bf16(xr, (size_t)T * C);
    float *ref = malloc(sizeof(float) * (size_t)T * R), *got = malloc(sizeof(float) * (size_t)T * ldy),
          *got2 = malloc(sizeof(float) * (size_t)T * ldy);
    dsv4_cpu_linear(&h.w, xr, T, ref);
    float *dx = dup_to_dev(x, sizeof(float) * (size_t)T * ldx), *dy = dsv4_cuda_alloc(sizeof(float) * (size_t)T * ldy);
    const size_t wsb = dsv4_cuda_linear_gemm_split_ws_bytes(T, C, fmt == DSV4_WF_FP8 ? R : 0);
    void *ws = dsv4_cuda_alloc(wsb);
    if (!dy || !ws) op_ok(-1, "gemm buffers");
    op_ok(dsv4_cuda_fill(dy, (int64_t)T * ldy, NAN, NULL), "fill"); /* NaN: y must not be read (beta 0), gaps untouched */
    char name[160];
    snprintf(name, sizeof name, "linear gemm split %s %s %dx%d%s T=%d%s%s", tag, dsv4_wfmt_name(fmt), R, C, row0 ? "+view" : "", T,
             ab ? " act:bf16" : "", strided ? " strided" : "");
    const float *dxs = dx + (strided ? C : 0);
    const int fp8x = fmt == DSV4_WF_FP8 && !ab; /* the x-terms switch applies */
    if (fp8x) dsv4_cuda_linear_gemm_split_fp8_terms(3);
    int rc = dsv4_cuda_linear_gemm_split(&dw, dxs, ldx, T, dy, ldy, ws, wsb, NULL);
    if (rc < 0) op_ok(rc, name);
    if (rc == 1) {
        g_checks++, g_fail++;
        printf("FAIL %s: declined (not applicable) <<<\n", name);
    } else {
        sync_ok();
        from_dev(got, dy, sizeof(float) * (size_t)T * ldy);
        float *gs = malloc(sizeof(float) * (size_t)T * R);
        const long gap = gather_rows(got, T, R, ldy, gs);
        check(name, gs, ref, (size_t)T * R, 1e-4 * rms(ref, (size_t)T * R), 1e-4);
        op_ok(dsv4_cuda_linear_gemm_split(&dw, dxs, ldx, T, dy, ldy, ws, wsb, NULL) != 0, "split rerun");
        sync_ok();
        from_dev(got2, dy, sizeof(float) * (size_t)T * ldy);
        const int same = !memcmp(got, got2, sizeof(float) * (size_t)T * ldy);
        g_checks++, g_fail += !same || gap;
        printf("%-4s %s: rerun bitwise equal, %ld gap values written%s\n", same && !gap ? "ok" : "FAIL", name, gap,
               same && !gap ? "" : " <<<");
        if (fmt == DSV4_WF_FP8 && !ab) { /* FP8 weights: the f16 form (2 terms) ran; the bf16 form (3 terms) as well */
            const int f16 = dsv4_cuda_linear_gemm_split_last_f16();
            g_checks++, g_fail += !f16;
            printf("%-4s %s: the f16 form ran (f16_ok %d, shift %d)%s\n", f16 ? "ok" : "FAIL", name, dw.f16_ok, dw.f16_shift,
                   f16 ? "" : " <<<");
            dsv4_cuda_weight d2 = dw;
            d2.f16_ok = 0;
            split_variant(name, "bf16 form", &d2, dxs, ldx, T, R, dy, ldy, ws, wsb, got2, gs, ref);
            dsv4_cuda_linear_gemm_split_fp8_terms(2); /* two bf16 terms (the default for FP8): x to ~2^-16 */
            split_variant(name, "two bf16 terms, the default", &dw, dxs, ldx, T, R, dy, ldy, ws, wsb, got2, gs, ref);
            terms_variant(name, &dw, x, ldx, strided ? C : 0, T, R, C, dy, ldy, ws, wsb, got2, got);
            split4_same(name, &dw, dxs, ldx, T, R, dy, ldy, ws, wsb, got2, got);
            if (dw.f16_ok) f16_term_variant(name, &h, &dw, x, ldx, strided ? C : 0, T, R, C, dy, ldy, ws, wsb, ref, got2);
            dsv4_cuda_linear_gemm_split_fp8_terms(1); /* one bf16 term: the twin on x rounded to bf16 */
            round_bf16(xr, (size_t)T * C);
            dsv4_cpu_linear(&h.w, xr, T, ref);
            split_variant(name, "one bf16 term", &dw, dxs, ldx, T, R, dy, ldy, ws, wsb, got2, gs, ref);
        }
        if (!(fmt == DSV4_WF_FP8 && !ab)) { /* the split's default terms, given (got2: its rerun) */
            from_dev(got2, dy, sizeof(float) * (size_t)T * ldy);
            terms_variant(name, &dw, x, ldx, strided ? C : 0, T, R, C, dy, ldy, ws, wsb, got2, got);
            split4_same(name, &dw, dxs, ldx, T, R, dy, ldy, ws, wsb, got2, got);
        }
        if (fmt == DSV4_WF_BF16 && !ab) { /* BF16 weights in two bf16 terms (opt-in): x to ~2^-16 */
            dsv4_cuda_linear_gemm_split_bf16_terms(2);
            split_variant(name, "two bf16 terms", &dw, dxs, ldx, T, R, dy, ldy, ws, wsb, got2, gs, ref);
            dsv4_cuda_linear_gemm_split_bf16_terms(0);
        }
        free(gs);
    }
    if (fp8x) dsv4_cuda_linear_gemm_split_fp8_terms(0);
    dsv4_cuda_linear_gemm_split4(-1);
    dsv4_cuda_free(dx), dsv4_cuda_free(dy), dsv4_cuda_free(ws), dsv4_cuda_weight_free(&dw);
    free(x), free(xr), free(ref), free(got), free(got2), free_hweight(&h);
}

/* What the GEMM must decline (so that the caller takes the GEMV): too few rows, no act quant, FP4. */
void test_linear_gemm_declines(void) {
    hweight a = make_weight(DSV4_WF_FP8, 256, 1024, 0, 1), b = make_weight(DSV4_WF_FP8, 256, 1024, 0, 0),
            c = make_weight(DSV4_WF_MXFP4, 256, 1024, 0, 0);
    dsv4_cuda_weight da, db, dc;
    op_ok(dsv4_cuda_weight_upload(&a.w, &da) || dsv4_cuda_weight_upload(&b.w, &db) || dsv4_cuda_weight_upload(&c.w, &dc), "upload");
    const int ok = dsv4_cuda_linear_gemm_fits(&da, 64) && !dsv4_cuda_linear_gemm_fits(&da, 63) &&
                   !dsv4_cuda_linear_gemm_fits(&db, 512) && !dsv4_cuda_linear_gemm_fits(&dc, 512) &&
                   dsv4_cuda_linear_gemm(&da, NULL, 16, NULL, NULL, 0, NULL) == 1;
    g_checks++, g_fail += !ok;
    printf("%-4s linear gemm: applies to FP8 aq T >= %d only%s\n", ok ? "ok" : "FAIL", DSV4_LINEAR_GEMM_MIN_T, ok ? "" : " <<<");
    dsv4_cuda_weight_free(&da), dsv4_cuda_weight_free(&db), dsv4_cuda_weight_free(&dc);
    free_hweight(&a), free_hweight(&b), free_hweight(&c);
}
