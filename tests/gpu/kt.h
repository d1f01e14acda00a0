/* kt.h - what the files of test_kernels share (tests/gpu/test_kernels.c: the per-kernel checks of src/cuda against
 * their CPU twins, and the timings): the random inputs, the device copies, the one closeness rule (check) and the
 * bitwise one (check_same), random weights in every format, the grouped-linear job specs, and each file's entry
 * points. kt_util.c: helpers and weights; kt_linear.c: linears, the multi-token GEMM, grouped linears, the prefill
 * GEMMs; kt_rows.c: norm, RoPE, quant and the fused row kernels; kt_mhc.c: mHC; kt_attn.c: sparse attention, top-k,
 * index lists, the compressor, the window ring store; kt_moe.c: router, SwiGLU, MoE grouping, experts, combine;
 * kt_bench.c: the timings. */
#ifndef DSV4_TESTS_GPU_KT_H
#define DSV4_TESTS_GPU_KT_H

#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cpu/ops.h"
#include "cpu/topk.h"
#include "cuda/cuda_backend.h"
#include "cuda/cuda_model.h"
#include "cuda/kv_cache.h"
#include "cuda/bench_cuda.h"
#include "cuda/linear_gemm.h"
#include "cuda/moe_tc.h"
#include "quant/formats.h"
#include "quant/weight.h"

extern int g_fail, g_checks; /* checks failed / run (every check counts itself) */
extern void *g_lws;          /* test_linear_multi: the grouped call's multi-token workspace when set */
extern size_t g_lwsb;

typedef struct hweight {
    dsv4_weight w;
    uint8_t *data, *scale;
    size_t data_b, scale_b;
} hweight;

typedef struct mspec {
    dsv4_wfmt fmt;
    int R, C, aq, sf32, ab; /* rows, columns, act quant, FP8 fp32 scales, BF16 activations (act_bf16) */
} mspec;

#define MJ_MAX 24

/* Flash's grouped linears, the job lists of the checks and timings below: wq_a + wkv; the compressors' wkv / wgate,
 * the indexer compressor's and weights_proj; the gate + shared w1 / w3; NVFP4 with BF16 activations; mixed formats
 * (one odd shape: the element path) */
static const mspec qkv[2] = {{DSV4_WF_FP8, 1024, 4096, 1, 0, 0}, {DSV4_WF_FP8, 512, 4096, 1, 0, 0}};
static const mspec cmp[5] = {{DSV4_WF_BF16, 1024, 4096, 0, 0, 0}, {DSV4_WF_BF16, 1024, 4096, 0, 0, 0},
                             {DSV4_WF_BF16, 256, 4096, 0, 0, 0},  {DSV4_WF_BF16, 256, 4096, 0, 0, 0},
                             {DSV4_WF_BF16, 64, 4096, 0, 0, 0}};
static const mspec moe3[3] = {{DSV4_WF_BF16, 256, 4096, 0, 0, 0}, {DSV4_WF_FP8, 2048, 4096, 1, 0, 0},
                              {DSV4_WF_FP8, 2048, 4096, 1, 0, 0}};
static const mspec nvab[2] = {{DSV4_WF_NVFP4, 1024, 4096, 0, 0, 1}, {DSV4_WF_NVFP4, 512, 4096, 0, 0, 1}};
static const mspec mix[4] = {{DSV4_WF_FP8, 1024, 4096, 1, 0, 0}, {DSV4_WF_BF16, 77, 1003, 0, 0, 0},
                             {DSV4_WF_FP8, 512, 4096, 1, 0, 0},  {DSV4_WF_MXFP4, 256, 2048, 0, 0, 0}};

/* The weights of n jobs: views (the wo_a groups): rows i * R .. of one stored weight of spec 0 with n * R rows; else a
 * weight per job. Host copies in h[0 .. nh-1], the stored device weights in d, each job's in w. */
typedef struct mweights {
    int nh;
    hweight h[MJ_MAX];
    dsv4_cuda_weight d[MJ_MAX], w[MJ_MAX];
} mweights;

/* kt_util.c: helpers, random weights */
uint32_t rnd_u32(void);
uint64_t rnd_state_get(void); /* the random stream's state, to replay it */
void rnd_state_set(uint64_t s);
float rnd_uni(void);
float rnd_n(void);
float *randn(size_t n, float sd);
float *rand_wide(size_t n);
void *dup_to_dev(const void *h, size_t bytes);
void from_dev(void *h, const void *d, size_t bytes);
void op_ok(int rc, const char *what);
void sync_ok(void);
double rms(const float *v, size_t n);
int check(const char *name, const float *got, const float *ref, size_t n, double atol, double rtol);
hweight make_weight(dsv4_wfmt fmt, int R, int C, int scale_f32, int act_quant);
void free_hweight(hweight *h);
void check_same(const char *name, const float *got, const float *ref, size_t n);

/* kt_linear.c */
void round_bf16(float *x, size_t n);
void test_linear_ab(const char *tag, dsv4_wfmt fmt, int R, int C, int T, int scale_f32, int aq, int xbf16, int row0, int ab);
void test_linear_v(const char *tag, dsv4_wfmt fmt, int R, int C, int T, int scale_f32, int aq, int xbf16, int row0);
void test_linear(const char *tag, dsv4_wfmt fmt, int R, int C, int T, int scale_f32, int aq, int xbf16);
void test_linear_bf16act(const char *tag, dsv4_wfmt fmt, int R, int C, int row0);
void test_linear_invariant(const char *tag, dsv4_wfmt fmt, int R, int C, int aq, int ab);
void test_linear_mt(const char *tag, dsv4_wfmt fmt, int R, int C, int T, int sf32, int aq, int ab, int xbf16, int row0);
void ms_wo_a(mspec *w, int n);
void ms_wo_a_x32(mspec *w, int n);
void ms_b20(mspec *b);
void mweights_make(mweights *m, const mspec *s, int n, int views);
void mweights_free(mweights *m);
void multi_layout(const mspec *s, int n, int xs, int ys, int64_t *xo, int64_t *yo, int64_t *ldx, int64_t *ldy);
void test_linear_multi(const char *tag, const mspec *s, int n, int views, int xs, int ys, int xbf16, int T);
void test_linear_multi_T(const char *tag, const mspec *s, int n, int views, int xs, int ys, int xbf16);
void test_linear_gemm(const char *tag, int R, int C, int T, int scale_f32, int row0);
void test_linear_gemm_split(const char *tag, dsv4_wfmt fmt, int R, int C, int T, int row0, int ab, int strided);
void test_linear_gemm_declines(void);

/* kt_rows.c */
void test_rmsnorm(int rows, int n, int ld, int weighted);
void test_rope(int T, int H, int n, int npairs, int inverse);
void test_rope_hq4(int T, int H, int n, int npairs, int norm, int weighted);
void test_norm_rope_q8(int T, int H, int n, int npairs, int weighted, int qn, int qb);
void test_norm_rope_h16(int T, int H, int n, int npairs, int weighted);
void test_quant(int kind, int rows, int n, int ld, int block);

/* kt_mhc.c */
void test_hc(int T, int M, int D, dsv4_wfmt fmt, int iters);

/* kt_attn.c */
void test_attn(int T, int H, int Dh, int N, int nidx, const int *nvalid, int bench);
void test_topk(int T, int ld, int k, int levels);
void test_attn_index(int S, int W, int ratio, int ksel, const int *p0, const int *n);
void test_cmp_batch(int mr, int d, int overlap, const int *cuts, int nc);
void test_ring_store(int S, int W, int Dh, int R, const int *p0, const int *n);

/* kt_moe.c */
void test_router(int T, int E, int K, int hash);
void test_swiglu(int T, int I, int ld, float lim, int weighted);
dsv4_cuda_moe_plan dplan_new(int T, int K, int E);
void dplan_free(dsv4_cuda_moe_plan *p);
void test_moe_group(int T, int K, int E, int blocks);
void test_moe_combine(int T, int K, int D, int with_shared);
void test_moe_route(int T, int E, int K, int hash);
void test_moe_f8(int T, int K, int E, int D, int I);
void test_moe_pfb(dsv4_wfmt fmt, int T, int K, int E, int D, int I, int stride, int big, int T2);
void test_moe_pf8(int T, int K, int E, int D, int I, int stride, int big, int T2);
void test_moe_group_limit(void);
void test_moe_experts(const char *tag, dsv4_wfmt f13, dsv4_wfmt f2, int aq, int ab, int T, int K, int E, int D, int I);
void test_moe_invariant(const char *tag, dsv4_wfmt f, int aq, int T, int K, int E, int D, int I);

/* kt_bench.c */
void bench_copy(void);
void bench_hc(int T);
void bench_linear_gemm(const char *tag, int R, int C, int T);
void bench_linear(const char *tag, dsv4_wfmt fmt, int R, int C, const int *Ts, int nT, int aq);
void bench_mt(const char *tag, dsv4_wfmt fmt, int R, int C, int aq, int n, const int *Ts, int nT);
void bench_linear_multi(const char *tag, const mspec *s, int n, int views, int xs, int T);
void bench_moe(void);

#endif
