/* small_kernels.c - per-call time of the decode step's small kernels (mHC pre / head, RMSNorm, router, MoE grouping and
 * combine, window ring store, attention with its span combine, indexer top-k, attention index lists) at Flash shapes,
 * T = 1 and 8, through the public CUDA API (src/cuda/cuda_backend.h, cuda_model.h):
 *   small_kernels            CUDA-graph replays of 64 calls (the mHC fn rotating through 64 copies), median of 10: us
 *                            per call, as inside a decode step's graph (programmatic dependent launch included)
 *   small_kernels once       every case once, for Nsight Compute:  ncu --clock-control none --metrics
 *                            gpu__time_duration.sum --kernel-name regex:'hc_|rmsnorm|router|moe_|ring_store|attn_|topk'
 *   small_kernels variants   hc_pre / hc_head with each few-token mixing kernel (dsv4_cuda_hc_test_flags bits 4-6):
 *                            timings, and the outputs bitwise against the default's
 * Build (after make CUDA=1 BUILD=build-cuda): make -f bench/Makefile small-kernels. Linking an older build's objects
 * gives its numbers (before / after comparisons in one device call). bench/NOTES.md, "Decode-step small kernels". */
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda/cuda_backend.h"
#include "cuda/cuda_model.h"
#include "cuda/kv_cache.h"

static uint64_t rng = 0x1234567ull;
static uint32_t ru(void) { rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17; return (uint32_t)(rng >> 11); }
static float rf(void) { return ((ru() >> 8) * (1.0f / 16777216.0f)) * 2.0f - 1.0f; }
static void *dev_rand(size_t n, float sc) {
    float *h = malloc(sizeof(float) * n);
    for (size_t i = 0; i < n; i++) h[i] = rf() * sc;
    void *d = dsv4_cuda_alloc(sizeof(float) * n);
    dsv4_cuda_upload(d, h, sizeof(float) * n);
    free(h);
    return d;
}
static void *dev_ints(const int *h, size_t n) {
    void *d = dsv4_cuda_alloc(sizeof(int) * n);
    dsv4_cuda_upload(d, h, sizeof(int) * n);
    return d;
}
#define CK(x) do { if (x) { fprintf(stderr, "%s: %s\n", #x, dsv4_cuda_last_error()); exit(1); } } while (0)

typedef struct {
    int T;
    float *X, *nw, *scale, *base, *x, *post, *comb, *rows, *lg, *bias, *ew, *y, *sh, *out, *kv, *q, *sink, *ascr, *o, *sc;
    void *hscr;
    dsv4_cuda_weight fn[64], fh[64];
    int *sel, *sid, *rsel, *idx, *aidx, *nl, *nc, *tsel, *tnsel;
    float *rw;
    dsv4_cuda_moe_plan plan;
    dsv4_cuda_batch b;
    const uint8_t **qbase;
    void *qb2;
    void *tkscr;
} ctx;

static dsv4_cuda_weight f32w(int rows, int cols) {
    dsv4_cuda_weight w;
    memset(&w, 0, sizeof w);
    w.fmt = DSV4_WF_F32, w.rows = rows, w.cols = cols, w.data = dev_rand((size_t)rows * cols, 0.01f);
    return w;
}

static void setup(ctx *c, int T) {
    memset(c, 0, sizeof *c);
    c->T = T;
    const int M = 4, D = 4096, E = 256, K = 6, H = 64, Dh = 512, R = 64, W = 128, NIDX = 640, NL = 1024;
    c->X = dev_rand((size_t)T * M * D, 1.0f), c->nw = dev_rand(D, 1.0f), c->scale = dev_rand(3, 0.5f), c->base = dev_rand(24, 0.5f);
    c->x = dsv4_cuda_alloc(sizeof(float) * T * D), c->post = dsv4_cuda_alloc(sizeof(float) * T * M), c->comb = dsv4_cuda_alloc(sizeof(float) * T * 16);
    c->hscr = dsv4_cuda_alloc(dsv4_cuda_hc_scratch_bytes(T, M, D));
    for (int i = 0; i < 64; i++) c->fn[i] = f32w(24, M * D), c->fh[i] = f32w(4, M * D);
    c->rows = dev_rand((size_t)64 * T * 4096, 1.0f);
    c->lg = dev_rand((size_t)T * E, 2.0f), c->bias = dev_rand(E, 0.1f);
    c->rsel = dsv4_cuda_alloc(sizeof(int) * T * K), c->ew = dsv4_cuda_alloc(sizeof(float) * T * K);
    int *hs = malloc(sizeof(int) * T * K), *sid = malloc(sizeof(int) * T);
    for (int t = 0; t < T; t++) {
        sid[t] = t;
        for (int k = 0; k < K; k++) hs[t * K + k] = (t * 37 + k * 41) % E;
    }
    c->sel = dev_ints(hs, (size_t)T * K), c->sid = dev_ints(sid, T);
    c->rw = dev_rand((size_t)T * K, 1.0f);
    c->plan.nact = dsv4_cuda_alloc(sizeof(int)), c->plan.act_e = dsv4_cuda_alloc(sizeof(int) * E), c->plan.act_off = dsv4_cuda_alloc(sizeof(int) * E);
    c->plan.act_cnt = dsv4_cuda_alloc(sizeof(int) * E), c->plan.rows = dsv4_cuda_alloc(sizeof(int) * T * K);
    c->plan.tslot = dsv4_cuda_alloc(sizeof(int) * T * K), c->plan.rw = dsv4_cuda_alloc(sizeof(float) * T * K);
    CK(dsv4_cuda_moe_group(c->sel, c->rw, c->sid, T, K, E, &c->plan, NULL));
    c->y = dev_rand((size_t)T * K * D, 1.0f), c->sh = dev_rand((size_t)T * D, 1.0f), c->out = dsv4_cuda_alloc(sizeof(float) * T * D);
    /* batch: slot t = row t at position 1000 + t, one layer; abuf W + 1024 rows */
    int *pos = malloc(sizeof(int) * T), *p0 = malloc(sizeof(int) * T), *n1 = malloc(sizeof(int) * T), *off = malloc(sizeof(int) * T);
    void **sq = malloc(sizeof(void *) * T);
    const uint8_t **qb = malloc(sizeof(void *) * T);
    const int64_t rb = dsv4_kv_row_bytes(Dh, R);
    for (int t = 0; t < T; t++) {
        pos[t] = 1000 + t, p0[t] = pos[t], n1[t] = 1, off[t] = t;
        dsv4_cuda_seqdev hd = {0, 1 << 20, NULL};
        dsv4_cuda_lstate ls;
        memset(&ls, 0, sizeof ls);
        uint8_t *d = dsv4_cuda_alloc(256 + sizeof ls);
        ls.abuf = dsv4_cuda_alloc((size_t)(W + 1024) * rb);
        cudaMemset(ls.abuf, 0x11, (size_t)(W + 1024) * rb);
        hd.L = (dsv4_cuda_lstate *)(d + 256);
        dsv4_cuda_upload(d, &hd, sizeof hd), dsv4_cuda_upload(d + 256, &ls, sizeof ls);
        sq[t] = d, qb[t] = ls.abuf;
    }
    c->b.T = T, c->b.S = T, c->b.tok = dev_ints(pos, T), c->b.pos = dev_ints(pos, T), c->b.sid = c->sid;
    c->b.p0 = dev_ints(p0, T), c->b.n = dev_ints(n1, T), c->b.off = dev_ints(off, T), c->b.cend = c->b.pos, c->b.pe = c->b.pos;
    void *dsq = dsv4_cuda_alloc(sizeof(void *) * T);
    dsv4_cuda_upload(dsq, sq, sizeof(void *) * T);
    c->b.sq = dsq;
    c->qbase = dsv4_cuda_alloc(sizeof(void *) * T);
    dsv4_cuda_upload((void *)c->qbase, qb, sizeof(void *) * T);
    c->qb2 = dsv4_cuda_alloc(sizeof(void *) * T);
    c->kv = dev_rand((size_t)T * Dh, 1.0f);
    CK(dsv4_cuda_act_quant_fp8(c->kv, T, Dh - R, Dh, 64, NULL));
    c->q = dev_rand((size_t)T * H * Dh, 1.0f), c->sink = dev_rand(H, 1.0f), c->o = dsv4_cuda_alloc(sizeof(float) * T * H * Dh);
    c->ascr = dsv4_cuda_alloc(dsv4_cuda_attn_kv8_scratch(T, H, Dh, NIDX) * sizeof(float) + 256);
    int *hidx = malloc(sizeof(int) * T * NIDX);
    for (int t = 0; t < T; t++)
        for (int i = 0; i < NIDX; i++) hidx[t * NIDX + i] = (i * 7 + t) % (W + 1024);
    c->idx = dev_ints(hidx, (size_t)T * NIDX);
    c->aidx = dsv4_cuda_alloc(sizeof(int) * T * NIDX);
    c->sc = dev_rand((size_t)T * NL, 1.0f);
    int *hnl = malloc(sizeof(int) * T);
    for (int t = 0; t < T; t++) hnl[t] = NL;
    c->nl = dev_ints(hnl, T), c->nc = dev_ints(hnl, T);
    c->tsel = dsv4_cuda_alloc(sizeof(int) * T * 512), c->tnsel = dsv4_cuda_alloc(sizeof(int) * T);
    c->tkscr = dsv4_cuda_alloc((size_t)8 * T * NL);
    cudaDeviceSynchronize();
    free(hs), free(sid), free(pos), free(p0), free(n1), free(off), free(sq), free(qb), free(hidx), free(hnl);
}

enum { C_HCPRE, C_HCPRE0, C_HCHEAD, C_RMS4096, C_RMS1024, C_RMS512, C_RMSQ, C_ROUTER, C_GROUP, C_COMBINE, C_RING, C_ATTN, C_TOPK, C_AIDX, NCASE };
static const char *cname[NCASE] = {"hc_pre+norm (mix+finish)", "hc_pre+norm 0 Sinkhorn iters", "hc_head+norm (mix+finish)", "rmsnorm n=4096 w", "rmsnorm n=1024 w",
                                   "rmsnorm n=512 w", "rmsnorm 64T rows n=512", "router E=256 K=6", "moe_group K=6 E=256",
                                   "moe_combine K=6 D=4096 +shared", "ring_store Dh=512", "attn_kv8 640 entries (+combine)",
                                   "topk n=1024 k=512", "attn_index c4 W=128 k=512"};

static void run_case(ctx *c, int cs, int it, cudaStream_t st) {
    const int T = c->T;
    switch (cs) {
    case C_HCPRE:
        CK(dsv4_cuda_hc_pre(c->X, T, 4, 4096, &c->fn[it & 63], c->scale, c->base, 20, 1e-6f, 1e-6f, c->nw, c->x, c->post, c->comb,
                            c->hscr, st));
        break;
    case C_HCPRE0:
        CK(dsv4_cuda_hc_pre(c->X, T, 4, 4096, &c->fn[it & 63], c->scale, c->base, 0, 1e-6f, 1e-6f, c->nw, c->x, c->post, c->comb,
                            c->hscr, st));
        break;
    case C_HCHEAD:
        CK(dsv4_cuda_hc_head(c->X, T, 4, 4096, &c->fh[it & 63], c->scale, c->base, 1e-6f, 1e-6f, c->nw, c->x, c->hscr, st));
        break;
    case C_RMS4096: CK(dsv4_cuda_rmsnorm(c->rows, T, 4096, 4096, c->nw, 1e-6f, st)); break;
    case C_RMS1024: CK(dsv4_cuda_rmsnorm(c->rows, T, 1024, 1024, c->nw, 1e-6f, st)); break;
    case C_RMS512: CK(dsv4_cuda_rmsnorm(c->rows, T, 512, 512, c->nw, 1e-6f, st)); break;
    case C_RMSQ: CK(dsv4_cuda_rmsnorm(c->rows, 64 * T, 512, 512, NULL, 1e-6f, st)); break;
    case C_ROUTER: CK(dsv4_cuda_router(c->lg, T, 256, 6, c->bias, NULL, NULL, 1.5f, c->rsel, c->ew, st)); break;
    case C_GROUP: CK(dsv4_cuda_moe_group(c->sel, c->rw, c->sid, T, 6, 256, &c->plan, st)); break;
    case C_COMBINE: CK(dsv4_cuda_moe_combine(c->y, c->plan.tslot, T, 6, 4096, c->sh, c->out, st)); break;
    case C_RING: CK(dsv4_cuda_ring_store(&c->b, 0, c->kv, 128, 512, 64, st)); break;
    case C_ATTN:
        CK(dsv4_cuda_attn_kv8(c->q, T, 64, 512, 64, c->qbase, NULL, c->idx, 640, c->sink, 0.04f, c->o, c->ascr, st));
        break;
    case C_TOPK: CK(dsv4_cuda_topk(c->sc, T, 1024, c->nl, c->nc, 512, c->tsel, c->tnsel, c->tkscr, st)); break;
    case C_AIDX: CK(dsv4_cuda_attn_index(&c->b, 0, 128, 4, c->tsel, c->tnsel, 512, 640, c->aidx, (const uint8_t **)c->qb2, st)); break;
    }
}

static double time_case(ctx *c, int cs, cudaStream_t st) {
    const int NC = 64, NR = 10;
    for (int i = 0; i < 2; i++) run_case(c, cs, i, st);
    cudaGraph_t g;
    cudaGraphExec_t ge;
    cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal);
    for (int i = 0; i < NC; i++) run_case(c, cs, i, st);
    if (cudaStreamEndCapture(st, &g) != cudaSuccess || cudaGraphInstantiate(&ge, g, 0) != cudaSuccess) {
        fprintf(stderr, "graph failed for %s\n", cname[cs]);
        exit(1);
    }
    cudaEvent_t e0, e1;
    cudaEventCreate(&e0), cudaEventCreate(&e1);
    float ms[16];
    cudaGraphLaunch(ge, st);
    for (int r = 0; r < NR; r++) {
        cudaEventRecord(e0, st);
        cudaGraphLaunch(ge, st);
        cudaEventRecord(e1, st);
        cudaEventSynchronize(e1);
        cudaEventElapsedTime(&ms[r], e0, e1);
    }
    for (int a = 0; a < NR; a++)
        for (int b2 = a + 1; b2 < NR; b2++)
            if (ms[b2] < ms[a]) { float tmp = ms[a]; ms[a] = ms[b2]; ms[b2] = tmp; }
    cudaGraphExecDestroy(ge), cudaGraphDestroy(g);
    return ms[NR / 2] * 1000.0 / NC;
}

/* hc_pre / hc_head few-token mixing variants (test hook bits 4-6): timings, and their outputs bitwise against the default */
static void grab(ctx *c, float *r) {
    const int T = c->T;
    cudaMemcpy(r, c->x, sizeof(float) * T * 4096, cudaMemcpyDeviceToHost);
    cudaMemcpy(r + T * 4096, c->post, sizeof(float) * T * 4, cudaMemcpyDeviceToHost);
    cudaMemcpy(r + T * 4100, c->comb, sizeof(float) * T * 16, cudaMemcpyDeviceToHost);
}
static void variants(ctx *cx, cudaStream_t st) {
    static const char *vn[5] = {"default", "hc_mix_small", "2 tokens/block", "4 tokens/block", "8 tokens/block"};
    for (int ci = 0; ci < 2; ci++) {
        ctx *c = &cx[ci];
        const int T = c->T;
        float *r0 = malloc(sizeof(float) * T * 4116), *r1 = malloc(sizeof(float) * T * 4116);
        for (int cs = C_HCPRE; cs <= C_HCHEAD; cs += C_HCHEAD - C_HCPRE) {
            cudaMemset(c->post, 0, sizeof(float) * T * 4), cudaMemset(c->comb, 0, sizeof(float) * T * 16);
            dsv4_cuda_hc_test_flags = 0;
            run_case(c, cs, 0, st);
            cudaStreamSynchronize(st);
            grab(c, r0);
            for (int v = 0; v < 5; v++) {
                dsv4_cuda_hc_test_flags = v << 4;
                cudaMemset(c->x, 0, sizeof(float) * T * 4096);
                run_case(c, cs, 0, st);
                cudaStreamSynchronize(st);
                grab(c, r1);
                const int same = !memcmp(r0, r1, sizeof(float) * T * 4116);
                const double us = time_case(c, cs, st);
                printf("variant T=%d %-16s %-28s %8.2f us, outputs %s\n", T, vn[v], cname[cs], us,
                       same ? "bitwise the default's" : "DIFFER from the default's");
            }
            dsv4_cuda_hc_test_flags = 0;
        }
        free(r0), free(r1);
    }
}

int main(int argc, char **argv) {
    const int once = argc > 1 && !strcmp(argv[1], "once"), var = argc > 1 && !strcmp(argv[1], "variants");
    dsv4_cuda_info info;
    char err[256];
    if (dsv4_cuda_init(0, &info, err, sizeof err)) {
        fprintf(stderr, "init: %s\n", err);
        return 2;
    }
    cudaStream_t st;
    cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking);
    static ctx cx[2];
    setup(&cx[0], 1), setup(&cx[1], 8);
    if (once) {
        for (int ci = 0; ci < 2; ci++)
            for (int cs = 0; cs < NCASE; cs++) run_case(&cx[ci], cs, 0, st);
        cudaStreamSynchronize(st);
        printf("once: done (%s)\n", cudaGetErrorString(cudaGetLastError()));
        return 0;
    }
    if (var) {
        variants(cx, st);
        return 0;
    }
    const int NC = 64, NR = 10;
    printf("%-36s %10s %10s   (us per call: CUDA graph of %d calls, median of %d replays)\n", "case", "T=1", "T=8", NC, NR);
    for (int cs = 0; cs < NCASE; cs++) {
        double us[2];
        for (int ci = 0; ci < 2; ci++) us[ci] = time_case(&cx[ci], cs, st);
        printf("%-36s %10.2f %10.2f\n", cname[cs], us[0], us[1]);
    }
    printf("errors: %s\n", cudaGetErrorString(cudaGetLastError()));
    return 0;
}
