/* kt_bench.c - test_kernels' timings (CUDA events): the copy rate of this run, mHC, the GEMV / GEMM / multi-token
 * GEMM / grouped linears against it, and the routed experts (moebench). */
#include "kt.h"

/* ---- GEMV / GEMM timing: NR copies of one weight (> 256 MiB in all), a different copy per call ---- */

static double g_copy_gbs; /* device-to-device cudaMemcpy, read + write, measured in this run */

static int cmp_float(const void *a, const void *b) {
    float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

/* Median of 20 copies of 1 GiB, counted as bytes read + bytes written (as bench/RESULTS.md does). */
void bench_copy(void) {
    const size_t n = (size_t)1 << 30;
    void *a = dsv4_cuda_alloc(n), *b = dsv4_cuda_alloc(n);
    if (!a || !b) {
        fprintf(stderr, "copy bench: %s\n", dsv4_cuda_last_error());
        exit(2);
    }
    dsv4_cuda_memset(a, 1, n, NULL);
    float ms[20];
    cudaEvent_t e0, e1;
    cudaEventCreate(&e0), cudaEventCreate(&e1);
    cudaMemcpy(b, a, n, cudaMemcpyDeviceToDevice);
    for (int i = 0; i < 20; i++) {
        cudaEventRecord(e0, 0);
        cudaMemcpy(b, a, n, cudaMemcpyDeviceToDevice);
        cudaEventRecord(e1, 0);
        sync_ok();
        cudaEventElapsedTime(&ms[i], e0, e1);
    }
    qsort(ms, 20, sizeof(float), cmp_float);
    g_copy_gbs = 2.0 * n / (ms[10] * 1e-3) / 1e9;
    printf("time copy d2d 1 GiB: %.1f us, %.1f GB/s (read + write, median of 20)\n", ms[10] * 1e3, g_copy_gbs);
    cudaEventDestroy(e0), cudaEventDestroy(e1);
    dsv4_cuda_free(a), dsv4_cuda_free(b);
}

/* mHC pre / head at Flash shapes (M 4, D 4096, fn [24, 16384] F32, 20 Sinkhorn rounds): `it` calls captured in a
 * CUDA graph (as in a decode step), GPU time per call. At T <= 16 the fn is rotated through 128 copies (192 MiB),
 * so that L2 does not serve it. Variants: pre + fused RMSNorm; pre then dsv4_cuda_rmsnorm; pre without Sinkhorn
 * rounds (iters 0); the reference Sinkhorn on one thread (test flag 1); no programmatic dependent launch (2); the
 * mixing kernel alone (4) and the finishing kernel alone (8); head + fused RMSNorm. */
void bench_hc(int T) {
    const int M = 4, D = 4096, nr = 24, K = M * D, NR = T <= 16 ? 128 : 1, it = T <= 16 ? 200 : 10;
    hweight fn = make_weight(DSV4_WF_F32, nr, K, 0, 0), fh = make_weight(DSV4_WF_F32, M, K, 0, 0);
    uint8_t *dfn = dsv4_cuda_alloc((size_t)NR * nr * K * 4), *dfh = dsv4_cuda_alloc((size_t)NR * M * K * 4);
    if (!dfn || !dfh) op_ok(-1, "hc bench alloc");
    for (int k = 0; k < NR; k++) {
        dsv4_cuda_upload(dfn + (size_t)k * nr * K * 4, fn.data, (size_t)nr * K * 4);
        dsv4_cuda_upload(dfh + (size_t)k * M * K * 4, fh.data, (size_t)M * K * 4);
    }
    float *X = randn((size_t)T * K, 1.0f), *scale = randn(3, 0.5f), *base = randn(nr, 0.5f), *nw = randn(D, 1.0f);
    float *dX = dup_to_dev(X, sizeof(float) * (size_t)T * K), *ds = dup_to_dev(scale, 12), *db = dup_to_dev(base, 4 * nr),
          *dnw = dup_to_dev(nw, 4 * D);
    float *dx = dsv4_cuda_alloc(sizeof(float) * (size_t)T * D), *dp = dsv4_cuda_alloc(sizeof(float) * (size_t)T * M),
          *dc = dsv4_cuda_alloc(sizeof(float) * (size_t)T * M * M);
    void *scr = dsv4_cuda_alloc(dsv4_cuda_hc_scratch_bytes(T, M, D));
    cudaStream_t st;
    cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking);
    static const char *vn[8] = {"pre + norm", "pre, then rmsnorm", "pre + norm (iters 0)", "pre + norm, serial Sinkhorn",
                                "pre + norm, no PDL", "pre: mixing kernel alone", "pre: finishing kernel alone", "head + norm"};
    static const int vf[8] = {0, 0, 0, 1, 2, 4, 8, 0};
    for (int v = 0; v < 8; v++) {
        double us = 0;
        for (int pass = 0; pass < 2; pass++) { /* pass 0: warm up outside capture; pass 1: the graph */
            cudaGraph_t gr = NULL;
            cudaGraphExec_t ge = NULL;
            dsv4_cuda_hc_test_flags = vf[v];
            if (pass && cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal) != cudaSuccess) op_ok(-1, "capture");
            for (int k = 0; k < (pass ? it : 2); k++) {
                dsv4_cuda_weight w = {DSV4_WF_F32, nr, K, 0, dfn + (size_t)(k % NR) * nr * K * 4, NULL, 0, 0, 0, 0, 0, 0, 0};
                dsv4_cuda_weight wh = {DSV4_WF_F32, M, K, 0, dfh + (size_t)(k % NR) * M * K * 4, NULL, 0, 0, 0, 0, 0, 0, 0};
                if (v == 7) op_ok(dsv4_cuda_hc_head(dX, T, M, D, &wh, ds, db, 1e-6f, 1e-6f, dnw, dx, scr, st), "hc_head");
                else op_ok(dsv4_cuda_hc_pre(dX, T, M, D, &w, ds, db, v == 2 ? 0 : 20, 1e-6f, 1e-6f, v == 1 ? NULL : dnw, dx, dp,
                                            dc, scr, st), "hc_pre");
                if (v == 1) op_ok(dsv4_cuda_rmsnorm(dx, T, D, D, dnw, 1e-6f, st), "rmsnorm");
            }
            dsv4_cuda_hc_test_flags = 0;
            if (!pass) {
                op_ok(cudaStreamSynchronize(st) != cudaSuccess, "hc bench warm-up");
                continue;
            }
            if (cudaStreamEndCapture(st, &gr) != cudaSuccess || cudaGraphInstantiate(&ge, gr, 0) != cudaSuccess) op_ok(-1, "graph");
            cudaGraphLaunch(ge, st); /* warm */
            cudaEvent_t e0, e1;
            cudaEventCreate(&e0), cudaEventCreate(&e1);
            float ms[5];
            for (int r = 0; r < 5; r++) {
                cudaEventRecord(e0, st);
                cudaGraphLaunch(ge, st);
                cudaEventRecord(e1, st);
                op_ok(cudaStreamSynchronize(st) != cudaSuccess, "hc bench");
                cudaEventElapsedTime(&ms[r], e0, e1);
            }
            qsort(ms, 5, sizeof(float), cmp_float);
            us = 1000.0 * ms[2] / it;
            cudaEventDestroy(e0), cudaEventDestroy(e1);
            cudaGraphExecDestroy(ge), cudaGraphDestroy(gr);
        }
        printf("time hc %-28s M=%d D=%d T=%-4d: %8.2f us / call (graph of %d calls, median of 5)\n", vn[v], M, D, T, us, it);
    }
    cudaStreamDestroy(st);
    dsv4_cuda_free(dfn), dsv4_cuda_free(dfh), dsv4_cuda_free(dX), dsv4_cuda_free(ds), dsv4_cuda_free(db), dsv4_cuda_free(dnw),
        dsv4_cuda_free(dx), dsv4_cuda_free(dp), dsv4_cuda_free(dc), dsv4_cuda_free(scr);
    free_hweight(&fn), free_hweight(&fh), free(X), free(scale), free(base), free(nw);
}

/* Times the FP8 prefill GEMM (act quant + cuBLASLt block-scaled matmul, fp32 out) next to the plain cuBLASLt FP8
 * GEMM of the same size (bench_cuda.c: one tensor-wide scale, bf16 out) and the GEMV path, all measured here. */
void bench_linear_gemm(const char *tag, int R, int C, int T) {
    hweight h = make_weight(DSV4_WF_FP8, R, C, 0, 1);
    dsv4_cuda_weight w;
    op_ok(dsv4_cuda_weight_upload(&h.w, &w), "weight upload");
    float *x = randn((size_t)T * C, 1.0f);
    float *dx = dup_to_dev(x, sizeof(float) * (size_t)T * C), *dy = dsv4_cuda_alloc(sizeof(float) * (size_t)T * R);
    const size_t wsb = dsv4_cuda_linear_gemm_ws_bytes(T, C, R);
    void *ws = dsv4_cuda_alloc(wsb);
    if (!dy || !ws) op_ok(-1, "gemm bench buffers");
    double us[2] = {0, 0};
    const int rc = dsv4_cuda_linear_gemm(&w, dx, T, dy, ws, wsb, NULL);
    for (int path = rc ? 2 : 0; path < 2; path++) { /* 0: the GEMM, 1: the GEMV (dsv4_cuda_linear) */
        const int it = path ? 3 : 20;
        for (int k = 0; k < 2; k++)
            op_ok(path ? dsv4_cuda_linear(&w, dx, 0, T, dy, NULL) : dsv4_cuda_linear_gemm(&w, dx, T, dy, ws, wsb, NULL), "linear");
        cudaEvent_t e0, e1;
        cudaEventCreate(&e0), cudaEventCreate(&e1);
        cudaEventRecord(e0, 0);
        for (int k = 0; k < it; k++) path ? dsv4_cuda_linear(&w, dx, 0, T, dy, NULL) : dsv4_cuda_linear_gemm(&w, dx, T, dy, ws, wsb, NULL);
        cudaEventRecord(e1, 0);
        sync_ok();
        float ms;
        cudaEventElapsedTime(&ms, e0, e1);
        us[path] = 1000.0 * ms / it;
        cudaEventDestroy(e0), cudaEventDestroy(e1);
    }
    if (rc) printf("time linear gemm %-14s FP8 %6dx%-5d T=%-4d aq: declined (%d)\n", tag, R, C, T, rc);
    double ref_us = 0;
    char err[256] = "";
    const int rr = dsv4_cuda_bench_fp8_gemm(R, T, C, 20, &ref_us, err, sizeof err);
    const double fl = 2.0 * R * C * T / 1e6, tf = fl / us[0], tref = rr ? 0 : fl / ref_us;
    if (!rc) printf("time linear gemm %-14s FP8 %6dx%-5d T=%-4d aq: %8.1f us %7.1f TFLOP/s  (%5.1f%% of cuBLASLt FP8 %.1f us %.1f TFLOP/s%s%s; "
           "GEMV path %.1f us %.1f TFLOP/s, %.1fx)\n",
           tag, R, C, T, us[0], tf, rr ? 0.0 : 100.0 * tf / tref, ref_us, tref, rr ? ": " : "", rr ? err : "", us[1], fl / us[1],
           us[1] / us[0]);
    dsv4_cuda_free(dx), dsv4_cuda_free(dy), dsv4_cuda_free(ws), dsv4_cuda_weight_free(&w);
    free(x), free_hweight(&h);
}

/* Times y = x . W^T for each T of Ts. The host generates at most ~32 MiB of rows (a multiple of 128) and tiles
 * them over the device copies; bytes = weight + scales + x + y, against the measured copy rate. */
void bench_linear(const char *tag, dsv4_wfmt fmt, int R, int C, const int *Ts, int nT, int aq) {
    size_t rowb = fmt == DSV4_WF_F32 ? 4 * (size_t)C : fmt == DSV4_WF_BF16 || fmt == DSV4_WF_F16 ? 2 * (size_t)C
                  : fmt == DSV4_WF_FP8 ? (size_t)C : (size_t)C / 2;
    int Rg = (int)(((size_t)32 << 20) / rowb) / 128 * 128;
    if (Rg < 128) Rg = 128;
    if (Rg > R) Rg = R;
    hweight h = make_weight(fmt, Rg, C, 0, aq);
    dsv4_weight full = h.w;
    full.rows = R;
    const int fp8 = fmt == DSV4_WF_FP8;
    const size_t srow = fp8 ? h.scale_b / ((Rg + 127) / 128) : h.scale_b / Rg; /* per 128 rows (FP8) or per row */
    const size_t DB = rowb * R, SB = fp8 ? srow * ((R + 127) / 128) : srow * R, per = DB + SB;
    int NR = (int)((256u << 20) / per) + 1;
    if (NR > 64) NR = 64;
    uint8_t *dd = dsv4_cuda_alloc(DB * NR), *ds = SB ? dsv4_cuda_alloc(SB * NR) : NULL;
    if (!dd || (SB && !ds)) {
        fprintf(stderr, "bench alloc: %s\n", dsv4_cuda_last_error());
        exit(2);
    }
    for (int k = 0; k < NR; k++)
        for (int r = 0; r < R; r += Rg) {
            int n = R - r < Rg ? R - r : Rg;
            dsv4_cuda_upload(dd + DB * k + rowb * r, h.data, rowb * n);
            if (ds && fp8) dsv4_cuda_upload(ds + SB * k + srow * (r / 128), h.scale, srow * ((n + 127) / 128));
            else if (ds) dsv4_cuda_upload(ds + SB * k + srow * r, h.scale, srow * n);
        }
    int Tmax = 0;
    for (int i = 0; i < nT; i++) Tmax = Ts[i] > Tmax ? Ts[i] : Tmax;
    float *x = randn((size_t)Tmax * C, 1.0f);
    float *dx = dup_to_dev(x, sizeof(float) * (size_t)Tmax * C), *dy = dsv4_cuda_alloc(sizeof(float) * (size_t)Tmax * R);
    dsv4_cuda_weight w = {fmt, R, C, 0, dd, ds, 0, h.w.scale_stride, h.w.scale2, aq, 0, 0, 0};
    for (int i = 0; i < nT; i++) {
        const int T = Ts[i], it = T > 16 ? 10 : 100;
        for (int k = 0; k < 3; k++) op_ok(dsv4_cuda_linear(&w, dx, 0, T, dy, NULL), "linear");
        cudaEvent_t e0, e1;
        cudaEventCreate(&e0), cudaEventCreate(&e1);
        struct timespec h0, h1;
        cudaEventRecord(e0, 0);
        clock_gettime(CLOCK_MONOTONIC, &h0);
        for (int k = 0; k < it; k++) {
            w.data = dd + DB * (k % NR);
            w.scale = ds ? ds + SB * (k % NR) : NULL;
            dsv4_cuda_linear(&w, dx, 0, T, dy, NULL);
        }
        clock_gettime(CLOCK_MONOTONIC, &h1);
        cudaEventRecord(e1, 0);
        sync_ok();
        const double host_us = ((h1.tv_sec - h0.tv_sec) * 1e6 + (h1.tv_nsec - h0.tv_nsec) * 1e-3) / it;
        float ms;
        cudaEventElapsedTime(&ms, e0, e1);
        double us = 1000.0 * ms / it, bytes = (double)dsv4_weight_bytes(&full) + 4.0 * T * ((double)C + R);
        if (T <= 16)
            printf("time linear %-24s %s %6dx%-5d T=%-3d%s: %8.2f us  %7.1f GB/s  %5.1f%% of copy  (host %.1f us/call)\n", tag,
                   dsv4_wfmt_name(fmt), R, C, T, aq ? " aq" : "   ", us, bytes / us / 1e3, 100.0 * bytes / us / 1e3 / g_copy_gbs, host_us);
        else
            printf("time linear %-24s %s %6dx%-5d T=%-4d%s: %8.1f us  %7.2f TFLOP/s\n", tag, dsv4_wfmt_name(fmt), R, C, T,
                   aq ? " aq" : "   ", us, 2.0 * R * C * T / us / 1e6);
        cudaEventDestroy(e0), cudaEventDestroy(e1);
    }
    dsv4_cuda_free(dd), dsv4_cuda_free(ds), dsv4_cuda_free(dx), dsv4_cuda_free(dy), free(x), free_hweight(&h);
}

/* Times y = x . W^T at T rows through the GEMV (dsv4_cuda_linear: 16 rows a launch, 8 for wide BF16 x) and through the
 * multi-token GEMM (dsv4_cuda_linear_ws); n > 1: n jobs as the wo_a groups (views of one weight, strided x and y) through
 * dsv4_cuda_linear_multi / _multi_ws. The weights stay where they are (the large ones do not fit L2). */
void bench_mt(const char *tag, dsv4_wfmt fmt, int R, int C, int aq, int n, const int *Ts, int nT) {
    mspec sp[MJ_MAX];
    for (int i = 0; i < n; i++) sp[i] = (mspec){fmt, R, C, aq, 0, 0};
    mweights m;
    mweights_make(&m, sp, n, n > 1);
    int Tmax = 0;
    for (int i = 0; i < nT; i++) Tmax = Ts[i] > Tmax ? Ts[i] : Tmax;
    float *x = randn((size_t)Tmax * C * n, 1.0f);
    float *dx = dup_to_dev(x, sizeof(float) * (size_t)Tmax * C * n), *dy = dsv4_cuda_alloc(sizeof(float) * (size_t)Tmax * R * n);
    const size_t wsb = dsv4_cuda_linear_ws_bytes(Tmax, (int64_t)C * n, n);
    void *ws = dsv4_cuda_alloc(wsb);
    dsv4_cuda_linear_job jb[MJ_MAX];
    for (int i = 0; i < n; i++) jb[i] = (dsv4_cuda_linear_job){m.w[i], dx + (size_t)i * C, (int64_t)C * n, dy + (size_t)i * R, (int64_t)R * n};
    for (int i = 0; i < nT; i++) {
        const int T = Ts[i];
        double us[2];
        for (int path = 0; path < 2; path++) {
            void *w = path ? ws : NULL;
            const size_t wb = path ? wsb : 0;
            const int it = 5;
            cudaEvent_t e0, e1;
            cudaEventCreate(&e0), cudaEventCreate(&e1);
            for (int k = 0; k < it + 2; k++) {
                if (k == 2) cudaEventRecord(e0, 0);
                op_ok(n > 1 ? dsv4_cuda_linear_multi_ws(jb, n, 0, T, w, wb, NULL) : dsv4_cuda_linear_ws(&m.w[0], dx, 0, T, dy, w, wb, NULL),
                      "linear");
            }
            cudaEventRecord(e1, 0);
            sync_ok();
            float ms;
            cudaEventElapsedTime(&ms, e0, e1);
            us[path] = 1000.0 * ms / it;
            cudaEventDestroy(e0), cudaEventDestroy(e1);
        }
        const double wbytes = (double)dsv4_weight_bytes(&m.h[0].w);
        printf("time linear mt %-22s %s %dx %6dx%-5d T=%-4d%s: GEMV %9.1f us, multi-token GEMM %8.1f us (%.1fx; %6.1f TFLOP/s, "
               "weight %6.0f GB/s)\n",
               tag, dsv4_wfmt_name(fmt), n, R, C, T, aq ? " aq" : "   ", us[0], us[1], us[0] / us[1], 2.0 * n * R * C * T / us[1] / 1e6,
               wbytes / us[1] / 1e3);
    }
    dsv4_cuda_free(dx), dsv4_cuda_free(dy), dsv4_cuda_free(ws), free(x);
    mweights_free(&m);
}

/* Times a group of linears at T rows as separate dsv4_cuda_linear calls and as one dsv4_cuda_linear_multi call, the
 * weights rotated through > 256 MiB of copies. views + xs (the wo_a groups): also the forward's former path, each group
 * through copy2d of its slice of x, the linear, copy2d into its slice of y. */
void bench_linear_multi(const char *tag, const mspec *s, int n, int views, int xs, int T) {
    mweights m;
    mweights_make(&m, s, n, views);
    size_t DB[MJ_MAX], SB[MJ_MAX], per = 0;
    for (int i = 0; i < m.nh; i++) DB[i] = m.h[i].data_b, SB[i] = m.h[i].scale_b, per += DB[i] + SB[i];
    int NR = (int)((256u << 20) / per) + 1;
    if (NR > 64) NR = 64;
    uint8_t *dd[MJ_MAX], *ds[MJ_MAX];
    for (int i = 0; i < m.nh; i++) {
        dd[i] = dsv4_cuda_alloc(DB[i] * NR), ds[i] = SB[i] ? dsv4_cuda_alloc(SB[i] * NR) : NULL;
        if (!dd[i] || (SB[i] && !ds[i])) op_ok(-1, "bench alloc");
        for (int k = 0; k < NR; k++) {
            dsv4_cuda_upload(dd[i] + DB[i] * k, m.h[i].data, DB[i]);
            if (SB[i]) dsv4_cuda_upload(ds[i] + SB[i] * k, m.h[i].scale, SB[i]);
        }
    }
    int64_t xo[MJ_MAX], yo[MJ_MAX], ldx, ldy;
    multi_layout(s, n, xs, 1, xo, yo, &ldx, &ldy);
    float *x = randn((size_t)T * ldx, 1.0f);
    float *dx = dup_to_dev(x, 4 * (size_t)T * ldx), *dy = dsv4_cuda_alloc(4 * (size_t)T * ldy);
    int Cm = 0, Rm = 0;
    for (int i = 0; i < n; i++) Cm = s[i].C > Cm ? s[i].C : Cm, Rm = s[i].R > Rm ? s[i].R : Rm;
    float *dxg = dsv4_cuda_alloc(4 * (size_t)T * Cm), *dyg = dsv4_cuda_alloc(4 * (size_t)T * Rm);
    op_ok(dsv4_cuda_memset(dxg, 0, 4 * (size_t)T * Cm, NULL), "memset");
    dsv4_cuda_linear_job jb[MJ_MAX];
    double us[3] = {0, 0, 0}, bytes = 0;
    for (int i = 0; i < n; i++) bytes += (double)dsv4_weight_bytes(&m.h[views ? 0 : i].w) / (views ? n : 1) + 4.0 * T * (s[i].C + s[i].R);
    const int it = 50;
    for (int path = 0; path < 3; path++) { /* 0: separate linears, 1: grouped, 2: separate with the slice copies */
        if (path == 2 && !(views && xs)) break;
        cudaEvent_t e0, e1;
        cudaEventCreate(&e0), cudaEventCreate(&e1);
        for (int k = -3; k < it; k++) {
            if (k == 0) cudaEventRecord(e0, 0);
            const int c = (k + 3) % NR;
            for (int i = 0; i < n; i++) {
                const int hi = views ? 0 : i;
                jb[i].w = m.w[i];
                jb[i].w.data = dd[hi] + DB[hi] * c;
                jb[i].w.scale = SB[hi] ? ds[hi] + SB[hi] * c : NULL;
                jb[i].x = dx + xo[i], jb[i].ldx = ldx;
                jb[i].y = dy + yo[i], jb[i].ldy = ldy;
            }
            if (path == 1) {
                op_ok(dsv4_cuda_linear_multi(jb, n, 0, T, NULL), "linear multi");
                continue;
            }
            for (int i = 0; i < n; i++) {
                if (path == 2) op_ok(dsv4_cuda_copy2d(dxg, s[i].C, dx + xo[i], ldx, T, s[i].C, NULL), "copy2d");
                op_ok(dsv4_cuda_linear(&jb[i].w, path == 2 || xs ? dxg : dx, 0, T, dyg, NULL), "linear");
                if (path == 2) op_ok(dsv4_cuda_copy2d(dy + yo[i], ldy, dyg, s[i].R, T, s[i].R, NULL), "copy2d");
            }
        }
        cudaEventRecord(e1, 0);
        sync_ok();
        float ms;
        cudaEventElapsedTime(&ms, e0, e1);
        us[path] = 1000.0 * ms / it;
        cudaEventDestroy(e0), cudaEventDestroy(e1);
    }
    printf("time linear multi %-28s T=%-2d: separate %7.2f us (%2d launches)", tag, T, us[0], n);
    if (us[2] > 0) printf(", with slice copies %7.2f us (%2d launches)", us[2], 3 * n);
    printf(", grouped %7.2f us  %7.1f GB/s  %5.1f%% of copy  (%.2fx%s)\n", us[1], bytes / us[1] / 1e3,
           100.0 * bytes / us[1] / 1e3 / g_copy_gbs, (us[2] > 0 ? us[2] : us[0]) / us[1], us[2] > 0 ? " vs with copies" : "");
    for (int i = 0; i < m.nh; i++) dsv4_cuda_free(dd[i]), dsv4_cuda_free(ds[i]);
    dsv4_cuda_free(dx), dsv4_cuda_free(dy), dsv4_cuda_free(dxg), dsv4_cuda_free(dyg), free(x);
    mweights_free(&m);
}

/* The routed experts of one Flash layer (dim 4096, inter 2048, 256 MXFP4 experts with FP8 act quant, 6 a token) at
 * batch 1, 8, 256 and 2048- / 4096-token prefills, random routing (distinct experts a token; plans rotated so that L2 does not
 * serve the weights), the CUDA-core kernel ("old") against the tensor-core one ("new"). GB/s: the active experts'
 * weight bytes over the time. The two paths' y are also compared (the checks' tolerance). */
/* us a call of the grouped experts (pass: dsv4_cuda_moe_experts_pass, the prefill's entry), it calls over the np plans
 * after two warm-up calls */
static double moe_us(int pass, const dsv4_cuda_experts *ex, const float *dx, int T, int K, const dsv4_cuda_moe_plan *dp, int np,
                     float *dh, float *dy, int it) {
    int (*const run)(const dsv4_cuda_experts *, const float *, int, int, const dsv4_cuda_moe_plan *, float, float *, float *, void *) =
        pass ? dsv4_cuda_moe_experts_pass : dsv4_cuda_moe_experts;
    for (int k = 0; k < 2; k++) op_ok(run(ex, dx, T, K, &dp[(k + 1) % np], 10.0f, dh, dy, NULL) < 0, "moe_experts");
    cudaEvent_t e0, e1;
    cudaEventCreate(&e0), cudaEventCreate(&e1);
    cudaEventRecord(e0, 0);
    for (int k = 0; k < it; k++) run(ex, dx, T, K, &dp[k % np], 10.0f, dh, dy, NULL);
    cudaEventRecord(e1, 0);
    sync_ok();
    float ms;
    cudaEventElapsedTime(&ms, e0, e1);
    cudaEventDestroy(e0), cudaEventDestroy(e1);
    return 1000.0 * ms / it;
}

/* ---- the FP8 experts' clock trace (builds with -DDSV4_MF8_TRACE: moe_f8.cuh; dsv4_cuda_moe_f8_trace) ---- */

static int cmp_dbl(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}
/* "p50 / p90 / max" of v[0..n) (sorted here) */
static void tr_pct(const char *name, double *v, int n) {
    if (!n) {
        printf("  %-34s -\n", name);
        return;
    }
    qsort(v, (size_t)n, sizeof(double), cmp_dbl);
    printf("  %-34s %8.2f %8.2f %8.2f   (%d)\n", name, v[n / 2], v[(int)(0.9 * (n - 1))], v[n - 1], n);
}

/* One launch's rows (DSV4_MF8_TR_BLOCKS blocks x 16 warps): when blocks start and end against the launch (globaltimer),
 * how many share an SM, and per warp the phases (clock64, at the SM clock): the grid wait, the plan read and first
 * copies, x staged, the first unit landed, the period between units, the tail after the last. */
static void moe_f8_trace_report(const unsigned long long *h, const char *what, int T, double mhz, double mb_expert) {
    const int R = DSV4_MF8_TR_ROW, U = DSV4_MF8_TR_UNITS, NB = DSV4_MF8_TR_BLOCKS;
    unsigned long long g0 = ~0ull, g1 = 0;
    int nw = 0, nblk = 0, nact = 0, sm_blocks[1024] = {0}, slot_on[DSV4_MF8_TR_BLOCKS];
    memset(slot_on, 0, sizeof slot_on);
    for (int b = 0; b < NB; b++)
        for (int w = 0; w < 16; w++) {
            const unsigned long long *r = h + ((size_t)b * 16 + w) * R;
            if (!r[0]) continue;
            nw++;
            if (r[1] < g0) g0 = r[1];
            if (r[2] > g1) g1 = r[2];
            if (w == 0) {
                const int sm = (int)(r[0] >> 48) - 1, slot = (int)((r[0] >> 32) & 0xffff);
                nblk++, nact += r[R - 2] > 0;
                if (r[R - 2] > 0 && slot < NB) slot_on[slot] = 1;
                if (sm >= 0 && sm < 1024) sm_blocks[sm]++;
            }
        }
    if (!nw) {
        printf("trace mf8 T=%-3d %s: no rows (a build without -DDSV4_MF8_TRACE, or not an FP8 launch)\n", T, what);
        return;
    }
    int experts = 0;
    for (int k = 0; k < NB; k++) experts += slot_on[k];
    const double span = (double)(g1 - g0) * 1e-3, mb = experts * mb_expert;
    printf("trace mf8 T=%-3d %s: %d blocks (%d with an expert), %d experts, %d warps traced; span %.2f us (globaltimer), "
           "%.1f MB -> %.0f GB/s%s\n", T, what, nblk, nact, experts, nw, span, mb, span > 0 ? mb * 1e3 / span : 0.0,
           h[((size_t)(NB - 1) * 16) * R] ? " (the buffer's last block traced: the launch may have more, untraced)" : "");
    int hist[9] = {0}, used = 0;
    for (int sm = 0; sm < 1024; sm++)
        if (sm_blocks[sm]) used++, hist[sm_blocks[sm] < 8 ? sm_blocks[sm] : 8]++;
    printf("  SMs used %d; SMs with 1..8+ blocks:", used);
    for (int k = 1; k <= 8; k++) printf(" %d", hist[k]);
    printf("\n  %-34s %8s %8s %8s\n", "us (p50 / p90 / max over warps)", "p50", "p90", "max");
    double *v[10];
    int n[10] = {0};
    for (int k = 0; k < 10; k++) v[k] = malloc(sizeof(double) * (size_t)nw);
    for (int b = 0; b < NB; b++)
        for (int w = 0; w < 16; w++) {
            const unsigned long long *r = h + ((size_t)b * 16 + w) * R;
            if (!r[0]) continue;
            const double c = 1.0 / mhz; /* us a cycle */
            v[0][n[0]++] = (double)(r[1] - g0) * 1e-3; /* entry, from the launch's first */
            v[1][n[1]++] = (double)(g1 - r[2]) * 1e-3; /* exit, before the launch's last */
            const int units = (int)r[R - 2], pre = r[R - 3] != 0; /* pre: the grid wait after the first copies */
            v[2][n[2]++] = (double)(long long)(pre ? r[R - 3] - r[5] : r[4] - r[3]) * c; /* the grid dependency wait */
            if (!units) continue;
            v[3][n[3]++] = (double)(long long)(r[5] - r[4]) * c; /* plan read, first copies issued */
            v[4][n[4]++] = (double)(long long)(r[6] - (pre ? r[R - 3] : r[5])) * c; /* x staged */
            v[5][n[5]++] = (double)(long long)(r[7] - r[6]) * c; /* first unit landed after that */
            const int last = (units < U ? units : U) - 1;
            if (last > 0) v[6][n[6]++] = (double)(long long)(r[7 + last] - r[7]) * c / last; /* per unit after the first */
            if (units <= U) v[7][n[7]++] = (double)(long long)(r[R - 1] - r[7 + last]) * c; /* tail after the last unit */
            v[8][n[8]++] = (double)(long long)(r[R - 1] - r[3]) * c; /* the warp, entry to exit */
            v[9][n[9]++] = units;
        }
    static const char *names[10] = {"block entry after the first", "exit before the last", "grid dependency wait",
                                    "plan + first copies issued", "x staged", "first unit landed", "per unit after it",
                                    "after the last unit", "warp entry to exit", "units a warp (count)"};
    for (int k = 0; k < 10; k++) tr_pct(names[k], v[k], n[k]), free(v[k]);
}

/* The 20th of 20 back-to-back experts calls, traced (both launches); nothing in other builds */
static void moe_f8_trace(const dsv4_cuda_experts *ex, const float *dx, int T, int K, const dsv4_cuda_moe_plan *dp, int np, float *dh,
                         float *dy, double mb_gu, double mb_dn) { /* mb_*: MB an expert */
    const size_t per = (size_t)DSV4_MF8_TR_BLOCKS * 16 * DSV4_MF8_TR_ROW, nb = 2 * per * sizeof(unsigned long long);
    if (dsv4_cuda_moe_f8_trace(NULL, 0) < 0) return;
    unsigned long long *d = dsv4_cuda_alloc(nb), *h = malloc(nb);
    if (!d || !h) {
        fprintf(stderr, "mf8 trace: no buffer\n");
        exit(2);
    }
    dsv4_cuda_memset(d, 0, nb, NULL);
    dsv4_cuda_moe_experts_path(DSV4_MOE_TC_F8);
    for (int k = 0; k < 20; k++) {
        if (k == 19) dsv4_cuda_moe_f8_trace(d, 2);
        op_ok(dsv4_cuda_moe_experts(ex, dx, T, K, &dp[k % np], 10.0f, dh, dy, NULL), "moe_experts");
    }
    dsv4_cuda_moe_f8_trace(NULL, 0);
    dsv4_cuda_moe_experts_path(0);
    sync_ok();
    from_dev(h, d, nb);
    int khz = 0, dev = 0;
    cudaGetDevice(&dev);
    cudaDeviceGetAttribute(&khz, cudaDevAttrClockRate, dev);
    const double mhz = khz > 0 ? khz * 1e-3 : 1980.0;
    printf("trace mf8 T=%d: clock64 at %.0f MHz (the device's maximum: an upper bound on the times)\n", T, mhz);
    moe_f8_trace_report(h, "gate/up", T, mhz, mb_gu);
    moe_f8_trace_report(h + per, "down", T, mhz, mb_dn);
    dsv4_cuda_free(d), free(h);
}

void bench_moe(void) {
    const int E = 256, K = 6, D = 4096, I = 2048, NH = 4;
    hweight h1[NH], h3[NH], h2[NH];
    for (int i = 0; i < NH; i++)
        h1[i] = make_weight(DSV4_WF_MXFP4, I, D, 0, 1), h3[i] = make_weight(DSV4_WF_MXFP4, I, D, 0, 1),
        h2[i] = make_weight(DSV4_WF_MXFP4, D, I, 0, 1);
    dsv4_cuda_weight *d1 = malloc(sizeof(dsv4_cuda_weight) * E), *d3 = malloc(sizeof(dsv4_cuda_weight) * E),
                     *d2 = malloc(sizeof(dsv4_cuda_weight) * E);
    for (int e = 0; e < E; e++) {
        op_ok(dsv4_cuda_weight_upload(&h1[e % NH].w, &d1[e]), "upload");
        op_ok(dsv4_cuda_weight_upload(&h3[(e + 1) % NH].w, &d3[e]), "upload");
        op_ok(dsv4_cuda_weight_upload(&h2[(e + 2) % NH].w, &d2[e]), "upload");
    }
    dsv4_cuda_experts ex;
    op_ok(dsv4_cuda_experts_init(&ex, d1, d3, d2, E), "experts_init");
    const double eb = 2.0 * (double)dsv4_weight_bytes(&h1[0].w) + (double)dsv4_weight_bytes(&h2[0].w);
    static const int Ts[5] = {1, 8, 256, 2048, 4096};
    for (int ti = 0; ti < 5; ti++) {
        const int T = Ts[ti], NP = T <= 8 ? 16 : T <= 256 ? 4 : 2;
        float *x = randn((size_t)T * D, 1.0f);
        float *dx = dup_to_dev(x, sizeof(float) * (size_t)T * D), *dh = dsv4_cuda_alloc(sizeof(float) * (size_t)T * K * I),
              *dy = dsv4_cuda_alloc(sizeof(float) * (size_t)T * K * D);
        dsv4_cuda_moe_plan dp[16];
        double act = 0;
        int *sel = malloc(sizeof(int) * (size_t)T * K), *sid = malloc(sizeof(int) * T), *used = malloc(sizeof(int) * E);
        float *w = malloc(sizeof(float) * (size_t)T * K);
        for (int pi = 0; pi < NP; pi++) {
            memset(used, 0, sizeof(int) * E);
            for (int t = 0; t < T; t++) {
                sid[t] = t;
                for (int k = 0; k < K; k++) {
                    int e, dup;
                    do {
                        e = (int)(rnd_u32() % (uint32_t)E), dup = 0;
                        for (int j = 0; j < k; j++) dup |= sel[t * K + j] == e;
                    } while (dup);
                    sel[t * K + k] = e, w[t * K + k] = 0.1f + rnd_uni(), used[e] = 1;
                }
            }
            for (int e = 0; e < E; e++) act += used[e];
            int *dsel = dup_to_dev(sel, sizeof(int) * (size_t)T * K), *dsid = dup_to_dev(sid, sizeof(int) * T);
            float *dw = dup_to_dev(w, sizeof(float) * (size_t)T * K);
            dp[pi] = dplan_new(T, K, E);
            op_ok(dsv4_cuda_moe_group(dsel, dw, dsid, T, K, E, &dp[pi], NULL), "moe_group");
            sync_ok();
            dsv4_cuda_free(dsel), dsv4_cuda_free(dsid), dsv4_cuda_free(dw);
        }
        act /= NP;
        /* modes (dsv4_cuda_moe_experts_path): CUDA-core kernel, tensor cores, the tensor-core kernel before the ring
         * and before moe_pf2_kernel (weights in registers, 8-warp blocks), and that with the integer MXFP4 decode, with
         * the L2 prefetch; the default without programmatic dependent launch; moe_pf2_kernel on mma.sync rather than
         * wgmma (prefill sizes) */
        enum { NM = 8 };
        static const int modes[NM] = {1, 0, 16, 18, 20, 8, 32, DSV4_MOE_TC_F8};
        static const char *mname[NM] = {"old (CUDA cores)", "new",           "tc, registers (before)",
                                        "tc, regs + integer decode", "tc, regs + L2 prefetch", "new, no PDL",
                                        "prefill on mma.sync", "fp8 decode (wgmma e4m3)"};
        double us[NM];
        float *yr[NM];
        const size_t ny = (size_t)T * K * D;
        for (int mi = 0; mi < NM; mi++) {
            dsv4_cuda_moe_experts_path(modes[mi]);
            const int it = T > 8 ? (mi ? 5 : 2) : T == 8 ? 48 : 160;
            /* y of plan 0 for the comparisons (the profiler range of bench/ncu runs: this call of "new", and of "before"
             * at decode sizes, and of the FP8 kernels at T 1, 256, 2048) */
            if ((T <= 8 && (mi == 1 || mi == 2)) || ((T == 256 || T == 2048) && mi == 1) || (modes[mi] == DSV4_MOE_TC_F8 && (T == 1 || T == 256 || T == 2048))) dsv4_cuda_profiler_range(1);
            op_ok(dsv4_cuda_moe_experts(&ex, dx, T, K, &dp[0], 10.0f, dh, dy, NULL), "moe_experts");
            sync_ok();
            if ((T <= 8 && (mi == 1 || mi == 2)) || ((T == 256 || T == 2048) && mi == 1) || (modes[mi] == DSV4_MOE_TC_F8 && (T == 1 || T == 256 || T == 2048))) dsv4_cuda_profiler_range(0);
            yr[mi] = malloc(sizeof(float) * ny);
            from_dev(yr[mi], dy, sizeof(float) * ny);
            us[mi] = moe_us(0, &ex, dx, T, K, dp, NP, dh, dy, it);
        }
        dsv4_cuda_moe_experts_path(0);
        if (T <= 8 || T == 256) /* T 256: 8-token chunks from the act-quantized rows (XR 1), the batch-256 step's form */
            moe_f8_trace(&ex, dx, T, K, dp, NP, dh, dy, 2.0 * (double)dsv4_weight_bytes(&h1[0].w) / 1e6,
                         (double)dsv4_weight_bytes(&h2[0].w) / 1e6);
        const double gb = act * eb / 1e9, tf = 2.0 * T * K * 3.0 * D * I / 1e12;
        for (int mi = 0; mi < NM; mi++)
            printf("time moe_experts Flash MXFP4 aq T=%-4d (%5.1f experts, %6.1f MB) %-26s %8.1f us %6.0f GB/s (%5.1f%% of copy) %6.1f TFLOP/s%s\n",
                   T, act, gb * 1e3, mname[mi], us[mi], gb / us[mi] * 1e6, g_copy_gbs > 0 ? 100.0 * gb / us[mi] * 1e6 / g_copy_gbs : 0.0,
                   tf / us[mi] * 1e6, mi == 1 ? "  <<" : "");
        printf("time moe_experts Flash MXFP4 aq T=%-4d: old / new time = %.2fx, before / new = %.2fx\n", T, us[0] / us[1],
               us[2] / us[1]);
        if ((int64_t)T * K >= 32 * (int64_t)E) { /* a prefill pass: the BF16 kernels (moe_bf16.cuh) where they qualify */
            const int took = dsv4_cuda_moe_experts_pass(&ex, dx, T, K, &dp[0], 10.0f, dh, dy, NULL);
            op_ok(took < 0, "moe_experts_pass");
            const double ub = moe_us(1, &ex, dx, T, K, dp, NP, dh, dy, 5);
            printf("time moe_experts Flash MXFP4 aq T=%-4d (%5.1f experts, %6.1f MB) %-26s %8.1f us %6.0f GB/s (%5.1f%% of copy) %6.1f TFLOP/s%s\n",
                   T, act, gb * 1e3, took == 1 ? "bf16 prefill pass" : "pass (not the bf16 kernels)", ub, gb / ub * 1e6,
                   g_copy_gbs > 0 ? 100.0 * gb / ub * 1e6 / g_copy_gbs : 0.0, tf / ub * 1e6, "");
        }
        {
            /* new against old, for information: the checks' tolerance per element. A few token-expert rows differ
             * more at T=2048 (20 of 12288 on the H200): where an h value sits on an FP8 rounding boundary, the two
             * kernels' fp32 sums (other orders) can round it to neighbouring e4m3 codes, and the row of y moves by
             * that step times a column of w2 (worst |d| 6.0 = 4 x 1.5). The bitwise checks below are the test. */
            const double at = 2e-4 * rms(yr[0], ny);
            int rows_bad = 0;
            double worst = 0;
            for (size_t r = 0; r < (size_t)T * K; r++) {
                int bad = 0;
                for (int d = 0; d < D; d++) {
                    const double a = yr[1][r * D + d], b = yr[0][r * D + d], dd = fabs(a - b), lim = at + 2e-4 * fabs(b);
                    if (!(dd <= lim)) bad = 1;
                    if (dd / lim > worst || isnan(a)) worst = isnan(a) ? INFINITY : dd / lim;
                }
                rows_bad += bad;
            }
            printf("info moe_experts Flash T=%d: new y vs old y: %d of %d token-expert rows beyond the checks' tolerance (worst %.2f "
                   "of tol: FP8 rounding flips of h)\n", T, rows_bad, T * K, worst);
            char name[96];
            for (int mi = 2; mi < NM; mi++) {
                if (modes[mi] == DSV4_MOE_TC_F8) continue; /* other numerics: test_moe_f8 */
                snprintf(name, sizeof name, "moe_experts Flash T=%d: %s == new (bitwise)", T, mname[mi]);
                check(name, yr[mi], yr[1], ny, 0, 0);
            }
        }
        for (int mi = 0; mi < NM; mi++) free(yr[mi]);
        for (int pi = 0; pi < NP; pi++) dplan_free(&dp[pi]);
        dsv4_cuda_free(dx), dsv4_cuda_free(dh), dsv4_cuda_free(dy);
        free(x), free(sel), free(sid), free(used), free(w);
    }
    dsv4_cuda_experts_free(&ex);
    for (int e = 0; e < E; e++) dsv4_cuda_weight_free(&d1[e]), dsv4_cuda_weight_free(&d3[e]), dsv4_cuda_weight_free(&d2[e]);
    for (int i = 0; i < NH; i++) free_hweight(&h1[i]), free_hweight(&h3[i]), free_hweight(&h2[i]);
    /* the ceiling: mma.sync alone, as many accumulators a warp as the prefill kernels (16) or half, 8 / 16 warps an SM */
    for (int na = 8; na <= 16; na += 8)
        for (int b = 1; b <= 2; b++)
            printf("time mma.sync m16n8k16 f16->f32 alone: %2d accumulators a warp, %2d warps an SM: %6.1f TFLOP/s\n", na, 8 * b,
                   dsv4_moe_tc_mma_rate(na, b));
    free(d1), free(d3), free(d2);
}
