/* linear_gemm.cu - prefill linears on the FP8 tensor cores through cuBLASLt (linear_gemm.h).
 *
 * Operands in cuBLASLt's column-major terms ("TN", the layout FP8 needs on Hopper), m = N (weight rows),
 * n = T4 (tokens, a multiple of 4), k = K:
 *   A = the weight as stored, K x N with lda = K, op T; scales CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F:
 *       K-major, L4 x ceil(N/128) (L = K/128 rounded up to a multiple of 4, zeros beyond L), element (p, b) at
 *       p * L4 + b, from the stored E8M0 (or F32) block scales of the view's rows;
 *   B = the act-quant codes, K x T4 with ldb = K (x's rows, one e4m3 byte per value); scales
 *       CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F: N-major, T4 x L, element (t, b) at b * T4 + t;
 *   D = C = y, N x T4 fp32 with ldd = N (y[t, n] row-major), beta = 0.
 * (cuBLAS documentation, "128-element 1D and 128x128 2D Block Scaling For FP8 Data Types" and its "Scaling
 * factors layouts": scale tensors 16-byte aligned, M and N multiples of 4.) */
#include <dlfcn.h>
#include <float.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cublasLt.h>

#include "common.cuh"
#include "linear_gemm.h"

/* the forward's default (DSV4_LINEAR_GEMM=0 / 1 overrides): on. Measured 2026-12-01 on an H200 (bench/NOTES.md,
 * "Prefill on FP8 tensor cores"): 15-63x the GEMV path; relative L2 ~1.9e-4 against the double-accumulating twin,
 * the FP8 tensor cores' in-block accumulation (DeepSeek's own FP8 GEMMs promote at the same 128-column interval),
 * well inside the bf16 rounding DeepSeek's FP8 GEMMs apply to their output (test_kernels' gemm checks hold it to
 * that). Prefill passes of >= DSV4_LINEAR_GEMM_MIN_T rows then differ in the last bits from the GEMV (chunked vs
 * one-shot prefill is not bitwise equal on the GPU); decode steps never take it. */
#ifndef DSV4_LINEAR_GEMM_DEFAULT
#define DSV4_LINEAR_GEMM_DEFAULT 1
#endif

#define LG_LT_WS ((size_t)32 << 20) /* cuBLASLt workspace */
#define LG_PLANS 128
#define LG_ALGOS 8

/* ---- act quant of x into codes + scales, weight block scales to fp32 ---- */

/* Warp (t, b) of the first T4 * L: the 128 values of token t, block b -> e4m3 codes (4 contiguous per lane) and
 * the block's power-of-two scale, as dsv4_act_quant_fp8 (amax from 1e-4, s = 2^ceil(log2(amax / 448)), codes =
 * round-to-nearest-even e4m3 of clamp(x / s, +-448); x * (1/s) == x / s exactly, s being a power of two). Thread i
 * of the first NB * L4: fp32 weight scale (p, b) = i / L4, i % L4 (zero beyond L). */
__global__ void __launch_bounds__(256) lg_prep(const float *__restrict__ x, int T4, int K, int L, uint8_t *__restrict__ q,
                                               float *__restrict__ xs, const uint8_t *__restrict__ wscale, int scale_f32,
                                               int64_t sstride, int rb0, int NB, int L4, float *__restrict__ wsc) {
    const int64_t gid = (int64_t)blockIdx.x * blockDim.x + threadIdx.x, gw = gid >> 5;
    const int lane = threadIdx.x & 31;
    if (gid < (int64_t)NB * L4) {
        const int p = (int)(gid / L4), b = (int)(gid - (int64_t)p * L4);
        float v = 0.0f;
        if (b < L) {
            const int64_t si = (int64_t)(rb0 + p) * sstride + b;
            v = scale_f32 ? __ldg((const float *)wscale + si) : dev_e8m0(__ldg(wscale + si));
        }
        wsc[gid] = v;
    }
    if (gw < (int64_t)T4 * L) { /* warp-uniform */
        const int t = (int)(gw / L), b = (int)(gw - (int64_t)t * L);
        const int64_t o = (int64_t)t * K + (int64_t)b * 128 + lane * 4;
        const float4 v = __ldg((const float4 *)(x + o));
        float a = fmaxf(fmaxf(fabsf(v.x), fabsf(v.y)), fmaxf(fabsf(v.z), fabsf(v.w)));
        a = warp_max(fmaxf(a, 1e-4f));
        const float s = dev_pow2_ceil(a * (1.0f / 448.0f)), inv = 1.0f / s;
        const float e[4] = {v.x, v.y, v.z, v.w};
        uint32_t c = 0;
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const float y = fminf(fmaxf(e[i] * inv, -448.0f), 448.0f);
            c |= (uint32_t)__nv_cvt_float_to_fp8(y, __NV_SATFINITE, __NV_E4M3) << (8 * i);
        }
        *(uint32_t *)(q + o) = c;
        if (lane == 0) xs[(int64_t)b * T4 + t] = s;
    }
}

/* Split path: x (row stride ldx) -> nt bf16 planes [nt][T][K] (plane stride ps elements): hi = bf16(x), then
 * mid = bf16(x - hi), lo = bf16(x - hi - mid) (each difference exact in fp32), so hi + mid + lo holds x to ~2^-24;
 * nt = 1 (BF16 activations): hi alone, x rounded to nearest even as dsv4_cuda_linear's act_bf16. */
__global__ void __launch_bounds__(256) lg_split(const float *__restrict__ x, int64_t ldx, int T, int K, int nt, int64_t ps,
                                                __nv_bfloat16 *__restrict__ out) {
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (int64_t)T * K) return;
    const int t = (int)(i / K), k = (int)(i - (int64_t)t * K);
    const float v = __ldg(x + (int64_t)t * ldx + k);
    const __nv_bfloat16 h = __float2bfloat16_rn(v);
    out[i] = h;
    if (nt > 1) {
        const float r = v - __bfloat162float(h);
        const __nv_bfloat16 m = __float2bfloat16_rn(r);
        out[ps + i] = m;
        if (nt > 2) out[2 * ps + i] = __float2bfloat16_rn(r - __bfloat162float(m));
    }
}

/* lg_split for rows whose K and ldx are multiples of 4 and x 16-byte aligned: block (quad slice, row t), 4 values a thread
 * (one 16-byte load, an 8-byte store a plane), the same per-value operations (so the same bits), no 64-bit division */
__global__ void __launch_bounds__(256) lg_split4(const float *__restrict__ x, int64_t ldx, int K, int nt, int64_t ps,
                                                 __nv_bfloat16 *__restrict__ out) {
    const int t = blockIdx.y, k = 4 * (blockIdx.x * blockDim.x + threadIdx.x);
    if (k >= K) return;
    const float4 v = __ldg((const float4 *)(x + (int64_t)t * ldx + k));
    const float e[4] = {v.x, v.y, v.z, v.w};
    __align__(8) __nv_bfloat16 h[4], m[4], l[4]; /* (8-byte aligned: stored as one uint2 each) */
#pragma unroll
    for (int i = 0; i < 4; i++) {
        h[i] = __float2bfloat16_rn(e[i]);
        const float r = e[i] - __bfloat162float(h[i]);
        m[i] = __float2bfloat16_rn(r);
        l[i] = __float2bfloat16_rn(r - __bfloat162float(m[i]));
    }
    const int64_t o = (int64_t)t * K + k;
    *(uint2 *)(out + o) = *(const uint2 *)h;
    if (nt > 1) *(uint2 *)(out + ps + o) = *(const uint2 *)m;
    if (nt > 2) *(uint2 *)(out + 2 * ps + o) = *(const uint2 *)l;
}

/* Split path, FP8 weights (E8M0 block scales): the view's rows [N, K] -> bf16, each value code x 2^e exactly. CAT: rows
 * [N, 2K], the row twice ([W | W]: the terms GEMM with hi and mid as one K of 2K, dsv4_cuda_linear_gemm_terms) */
template <int CAT = 0>
__global__ void __launch_bounds__(256) lg_deq_fp8(const uint8_t *__restrict__ q, const uint8_t *__restrict__ sc, int64_t sstride,
                                                  int row0, int N, int K, __nv_bfloat16 *__restrict__ out) {
    const int64_t i = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) * 4;
    if (i >= (int64_t)N * K) return;
    const int n = (int)(i / K), k = (int)(i - (int64_t)n * K);
    const int r = row0 + n;
    const float s = dev_e8m0(__ldg(sc + (int64_t)(r / 128) * sstride + k / 128));
    const uint32_t c = __ldg((const uint32_t *)(q + (int64_t)r * K + k));
    if constexpr (CAT) {
        __nv_bfloat16 *o = out + (int64_t)n * 2 * K + k;
#pragma unroll
        for (int j = 0; j < 4; j++) o[j] = o[K + j] = __float2bfloat16_rn(dev_e4m3((uint8_t)(c >> (8 * j))) * s);
    } else {
#pragma unroll
        for (int j = 0; j < 4; j++) out[i + j] = __float2bfloat16_rn(dev_e4m3((uint8_t)(c >> (8 * j))) * s);
    }
}

/* Split path on f16 (FP8 weights whose block exponents fit f16, dsv4_cuda_weight.f16_ok): two f16 terms of x (22
 * bits, the decode GEMV's precision for FP8 weights) instead of three bf16 ones, so two GEMMs instead of three.
 * lg_amax: the largest |x| of the slice (ordered as unsigned bits: non-negative floats compare like their bits), into
 * *amax, which the caller zeroed. */
__global__ void __launch_bounds__(256) lg_amax(const float *__restrict__ x, int64_t ldx, int T, int K, unsigned *amax) {
    float a = 0.0f;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < (int64_t)T * K; i += (int64_t)gridDim.x * blockDim.x) {
        const int t = (int)(i / K), k = (int)(i - (int64_t)t * K);
        a = fmaxf(a, fabsf(__ldg(x + (int64_t)t * ldx + k)));
    }
    a = warp_max(a);
    if ((threadIdx.x & 31) == 0) atomicMax(amax, __float_as_uint(a));
}
/* x / 2^e (e: the slice's largest |x| lands in [2^14, 2^15)) -> hi = f16(.), lo = f16(. - hi) (the difference exact in
 * fp32), planes [2][T][K] (stride ps); ab = {alpha, 0, 1}: the GEMMs' alpha 2^(e + shift) (the weight's f16 values are
 * its values x 2^-shift) and betas. Both scalings are powers of two: exact. */
__global__ void __launch_bounds__(256) lg_split_f16(const float *__restrict__ x, int64_t ldx, int T, int K, int64_t ps,
                                                    const unsigned *amax, int shift, float *ab, __half *__restrict__ out) {
    const float am = __uint_as_float(*amax);
    int E = 0;
    if (am > 0.0f) frexpf(am, &E); /* am in [2^(E-1), 2^E) */
    const int e = am > 0.0f ? E - 15 : 0;
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i == 0) ab[0] = ldexpf(1.0f, e + shift), ab[1] = 0.0f, ab[2] = 1.0f;
    if (i >= (int64_t)T * K) return;
    const int t = (int)(i / K), k = (int)(i - (int64_t)t * K);
    const float v = ldexpf(__ldg(x + (int64_t)t * ldx + k), -e);
    const __half h = __float2half_rn(v);
    out[i] = h;
    out[ps + i] = __float2half_rn(v - __half2float(h));
}
/* FP8 weights (E8M0 block scales) -> f16: code x 2^(k - shift), exact (dsv4_cuda_weight_f16_fit checked the range) */
__global__ void __launch_bounds__(256) lg_deq_fp8_f16(const uint8_t *__restrict__ q, const uint8_t *__restrict__ sc, int64_t sstride,
                                                      int row0, int N, int K, int shift, __half *__restrict__ out) {
    const int64_t i = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) * 4;
    if (i >= (int64_t)N * K) return;
    const int n = (int)(i / K), k = (int)(i - (int64_t)n * K);
    const int r = row0 + n;
    const float s = ldexpf(1.0f, (int)__ldg(sc + (int64_t)(r / 128) * sstride + k / 128) - 127 - shift);
    const uint32_t c = __ldg((const uint32_t *)(q + (int64_t)r * K + k));
#pragma unroll
    for (int j = 0; j < 4; j++) out[i + j] = __float2half_rn(dev_e4m3((uint8_t)(c >> (8 * j))) * s);
}

/* ---- cuBLASLt, opened at run time ---- */

static decltype(&cublasLtCreate) f_create;
static decltype(&cublasLtMatmulDescCreate) f_desc_create;
static decltype(&cublasLtMatmulDescDestroy) f_desc_destroy;
static decltype(&cublasLtMatmulDescSetAttribute) f_desc_set;
static decltype(&cublasLtMatrixLayoutCreate) f_layout_create;
static decltype(&cublasLtMatrixLayoutDestroy) f_layout_destroy;
static decltype(&cublasLtMatmulPreferenceCreate) f_pref_create;
static decltype(&cublasLtMatmulPreferenceDestroy) f_pref_destroy;
static decltype(&cublasLtMatmulPreferenceSetAttribute) f_pref_set;
static decltype(&cublasLtMatmulAlgoGetHeuristic) f_heuristic;
static decltype(&cublasLtMatmul) f_matmul;

static pthread_mutex_t lg_mu = PTHREAD_MUTEX_INITIALIZER;
static int lg_state;             /* 0 untried, 1 ready, -1 unavailable */
static cublasLtHandle_t lg_handle;

/* kind 2 (the split GEMM's f16 form) falls back to the bf16 split, the others to the GEMV: each says so once */
static void lg_warn_kind(int kind, const char *why) {
    static int said[2];
    if (said[kind == 2]) return;
    said[kind == 2] = 1;
    if (kind == 2) fprintf(stderr, "dsv4: f16 split GEMM unavailable (%s); the bf16 split runs\n", why);
    else fprintf(stderr, "dsv4: FP8 prefill GEMM unavailable (%s); prefill linears use the GEMV path\n", why);
}
static void lg_warn_once(const char *why) { lg_warn_kind(0, why); }

/* under lg_mu */
static int lg_open(void) {
    if (lg_state) return lg_state > 0 ? 0 : -1;
    lg_state = -1;
    const char *names[] = {"libcublasLt.so.13", "libcublasLt.so.12", "libcublasLt.so"};
    void *h = NULL;
    for (int i = 0; i < 3 && !h; i++) h = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
    char why[320];
    if (!h) {
        const char *e = dlerror();
        snprintf(why, sizeof why, "cannot open libcublasLt: %s", e ? e : "not found");
        lg_warn_once(why);
        return -1;
    }
#define LG_SYM(p_, f_)                                                                                     \
    if (!(p_ = (decltype(p_))dlsym(h, #f_))) {                                                             \
        snprintf(why, sizeof why, "libcublasLt has no %s", #f_);                                          \
        lg_warn_once(why);                                                                                 \
        return -1;                                                                                         \
    }
    LG_SYM(f_create, cublasLtCreate)
    LG_SYM(f_desc_create, cublasLtMatmulDescCreate)
    LG_SYM(f_desc_destroy, cublasLtMatmulDescDestroy)
    LG_SYM(f_desc_set, cublasLtMatmulDescSetAttribute)
    LG_SYM(f_layout_create, cublasLtMatrixLayoutCreate)
    LG_SYM(f_layout_destroy, cublasLtMatrixLayoutDestroy)
    LG_SYM(f_pref_create, cublasLtMatmulPreferenceCreate)
    LG_SYM(f_pref_destroy, cublasLtMatmulPreferenceDestroy)
    LG_SYM(f_pref_set, cublasLtMatmulPreferenceSetAttribute)
    LG_SYM(f_heuristic, cublasLtMatmulAlgoGetHeuristic)
    LG_SYM(f_matmul, cublasLtMatmul)
#undef LG_SYM
    cublasStatus_t s = f_create(&lg_handle);
    if (s != CUBLAS_STATUS_SUCCESS) {
        snprintf(why, sizeof why, "cublasLtCreate: status %d", (int)s);
        lg_warn_once(why);
        return -1;
    }
    lg_state = 1;
    return 0;
}

/* One shape's plan: descriptors and the heuristic's algorithms (the first that runs is kept). */
typedef struct lg_plan {
    int kind, N, K, T4, ldd, ala, ald, ldb, alb; /* key (kind 0: block-scaled FP8, 1: bf16 x bf16 -> fp32, 2: f16 x f16
                                                  * -> fp32 with alpha and beta in device memory; D rows ldd apart, B
                                                  * rows ldb (K but for dsv4_cuda_linear_gemm_terms); ala / ald / alb:
                                                  * alignment of A, D and B in bytes, <= 256) */
    int state;              /* 1 ready, -1 cuBLASLt has no algorithm for it */
    cublasLtMatmulDesc_t op;
    cublasLtMatrixLayout_t la, lb, ld;
    cublasLtMatmulHeuristicResult_t res[LG_ALGOS];
    int nres, pick; /* pick: index into res that ran (-1: not run yet) */
} lg_plan;

static lg_plan lg_plans[LG_PLANS];
static int lg_nplans, lg_next;

static void lg_plan_free(lg_plan *p) {
    if (p->op) f_desc_destroy(p->op);
    if (p->la) f_layout_destroy(p->la);
    if (p->lb) f_layout_destroy(p->lb);
    if (p->ld) f_layout_destroy(p->ld);
    memset(p, 0, sizeof *p);
}

static int lg_align(const void *p) {
    uintptr_t u = (uintptr_t)p;
    int a = 1;
    while (a < 256 && !(u & (uintptr_t)a)) a <<= 1;
    return a;
}

/* under lg_mu: the plan of a shape (made on first use); NULL when cuBLASLt cannot make one (p->state < 0 kept).
 * sa / sb: this call's scale tensors (the heuristic refuses block scaling modes without scale pointers, status 7;
 * each call sets its own before the matmul). */
static lg_plan *lg_plan_get(int kind, int N, int K, int T4, int ldd, int ala, int ald, const void *sa, const void *sb, int ldb,
                            int alb) {
    for (int i = 0; i < lg_nplans; i++) {
        lg_plan *p = &lg_plans[i];
        if (p->kind == kind && p->N == N && p->K == K && p->T4 == T4 && p->ldd == ldd && p->ala == ala && p->ald == ald &&
            p->ldb == ldb && p->alb == alb)
            return p->state > 0 ? p : NULL;
    }
    lg_plan *p;
    if (lg_nplans < LG_PLANS) p = &lg_plans[lg_nplans++];
    else {
        p = &lg_plans[lg_next];
        lg_next = (lg_next + 1) % LG_PLANS;
        lg_plan_free(p);
    }
    memset(p, 0, sizeof *p);
    p->kind = kind, p->N = N, p->K = K, p->T4 = T4, p->ldd = ldd, p->ala = ala, p->ald = ald, p->ldb = ldb, p->alb = alb;
    p->state = -1, p->pick = -1;
    const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
    const int32_t sma = CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F, smb = CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F;
    cublasLtMatmulPreference_t pref = NULL;
    const size_t wsz = LG_LT_WS;
    const uint32_t a_a = (uint32_t)ala, a_b = (uint32_t)alb, a_d = (uint32_t)ald;
    const cudaDataType_t ab = kind == 2 ? CUDA_R_16F : kind ? CUDA_R_16BF : CUDA_R_8F_E4M3;
    const int32_t pm = CUBLASLT_POINTER_MODE_DEVICE;
    int ok = f_desc_create(&p->op, CUBLAS_COMPUTE_32F, CUDA_R_32F) == CUBLAS_STATUS_SUCCESS &&
             (kind != 2 || f_desc_set(p->op, CUBLASLT_MATMUL_DESC_POINTER_MODE, &pm, sizeof pm) == CUBLAS_STATUS_SUCCESS) &&
             f_desc_set(p->op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta) == CUBLAS_STATUS_SUCCESS &&
             f_desc_set(p->op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb) == CUBLAS_STATUS_SUCCESS &&
             (kind || (f_desc_set(p->op, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &sma, sizeof sma) == CUBLAS_STATUS_SUCCESS &&
                       f_desc_set(p->op, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &smb, sizeof smb) == CUBLAS_STATUS_SUCCESS &&
                       f_desc_set(p->op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &sa, sizeof sa) == CUBLAS_STATUS_SUCCESS &&
                       f_desc_set(p->op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &sb, sizeof sb) == CUBLAS_STATUS_SUCCESS)) &&
             f_layout_create(&p->la, ab, (uint64_t)K, (uint64_t)N, (int64_t)K) == CUBLAS_STATUS_SUCCESS &&
             f_layout_create(&p->lb, ab, (uint64_t)K, (uint64_t)T4, (int64_t)ldb) == CUBLAS_STATUS_SUCCESS &&
             f_layout_create(&p->ld, CUDA_R_32F, (uint64_t)N, (uint64_t)T4, (int64_t)ldd) == CUBLAS_STATUS_SUCCESS &&
             f_pref_create(&pref) == CUBLAS_STATUS_SUCCESS &&
             f_pref_set(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &wsz, sizeof wsz) == CUBLAS_STATUS_SUCCESS &&
             f_pref_set(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &a_a, sizeof a_a) == CUBLAS_STATUS_SUCCESS &&
             f_pref_set(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &a_b, sizeof a_b) == CUBLAS_STATUS_SUCCESS &&
             f_pref_set(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &a_d, sizeof a_d) == CUBLAS_STATUS_SUCCESS &&
             f_pref_set(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &a_d, sizeof a_d) == CUBLAS_STATUS_SUCCESS;
    if (ok) {
        cublasStatus_t s = f_heuristic(lg_handle, p->op, p->la, p->lb, p->ld, p->ld, pref, LG_ALGOS, p->res, &p->nres);
        ok = s == CUBLAS_STATUS_SUCCESS && p->nres > 0;
        if (!ok) {
            char why[160];
            snprintf(why, sizeof why, "cuBLASLt has no %s algorithm for %d x %d x %d (status %d)",
                     kind == 2 ? "f16" : kind ? "bf16" : "block-scaled FP8",
                     N, T4, K, (int)s);
            lg_warn_kind(kind, why);
        }
    }
    if (pref) f_pref_destroy(pref);
    if (!ok) { /* keep the key with state -1 so that the shape is not retried */
        cublasLtMatmulDesc_t op = p->op;
        cublasLtMatrixLayout_t la = p->la, lb = p->lb, ld = p->ld;
        if (op) f_desc_destroy(op);
        if (la) f_layout_destroy(la);
        if (lb) f_layout_destroy(lb);
        if (ld) f_layout_destroy(ld);
        p->op = NULL, p->la = p->lb = p->ld = NULL;
        return NULL;
    }
    p->state = 1;
    return p;
}

/* under lg_mu: D = alpha A B + beta D with the plan's algorithm; on first use the heuristic's algorithms in order, the
 * first that runs is kept. 1 when none runs (the plan is marked unusable: the shape stays on the GEMV). */
static cublasStatus_t lg_status;
static int lg_matmul(lg_plan *p, const void *A, const void *B, float beta_h, float *D, void *ltws, cudaStream_t st,
                     const float *alpha_dev = NULL, const float *beta_dev = NULL) {
    const float one = 1.0f;
    /* kind 2: both scalars in device memory */
    const void *alpha = alpha_dev ? (const void *)alpha_dev : (const void *)&one, *beta = beta_dev ? (const void *)beta_dev : &beta_h;
    if (p->pick >= 0) {
        lg_status = f_matmul(lg_handle, p->op, alpha, A, p->la, B, p->lb, beta, D, p->ld, D, p->ld, &p->res[p->pick].algo,
                             ltws, LG_LT_WS, st);
        return lg_status == CUBLAS_STATUS_SUCCESS ? 0 : -1;
    }
    for (int i = 0; i < p->nres; i++) {
        lg_status = f_matmul(lg_handle, p->op, alpha, A, p->la, B, p->lb, beta, D, p->ld, D, p->ld, &p->res[i].algo, ltws,
                             LG_LT_WS, st);
        if (lg_status == CUBLAS_STATUS_SUCCESS) {
            p->pick = i;
            return 0;
        }
    }
    char why[160];
    snprintf(why, sizeof why, "no cuBLASLt algorithm ran for %d x %d x %d (status %d)", p->N, p->T4, p->K, (int)lg_status);
    lg_warn_kind(p->kind, why);
    p->state = -1;
    return 1;
}

/* ---- workspace ---- */

static size_t al256(size_t b) { return (b + 255) & ~(size_t)255; }

/* offsets of codes, x scales, weight scales, cuBLASLt workspace; returns the total */
static size_t lg_layout(int T4, int K, int N, size_t *o_q, size_t *o_xs, size_t *o_ws, size_t *o_lt) {
    const size_t L = ((size_t)K + 127) / 128, L4 = (L + 3) / 4 * 4, NB = ((size_t)N + 127) / 128;
    size_t o = 0;
    *o_q = o, o += al256((size_t)T4 * K);
    *o_xs = o, o += al256(4 * L * (size_t)T4);
    *o_ws = o, o += al256(4 * NB * L4);
    *o_lt = o, o += LG_LT_WS;
    return o;
}

/* ---- entry points ---- */

/* Read once per process: the forward sizes its workspace with it, so it must not change under a loaded model. */
extern "C" int dsv4_cuda_linear_gemm_enabled(void) {
    static int on = -1;
    if (on < 0) {
        const char *e = getenv("DSV4_LINEAR_GEMM");
        on = e && *e ? *e != '0' : DSV4_LINEAR_GEMM_DEFAULT;
    }
    return on;
}

extern "C" size_t dsv4_cuda_linear_gemm_ws_bytes(int T, int K, int N) {
    size_t a, b, c, d;
    if (T < 0 || K < 0 || N < 0) return 0;
    return lg_layout(T & ~3, K, N, &a, &b, &c, &d);
}

extern "C" int dsv4_cuda_linear_gemm_fits(const dsv4_cuda_weight *w, int T) {
    return w && w->data && w->scale && w->fmt == DSV4_WF_FP8 && w->act_quant && T >= DSV4_LINEAR_GEMM_MIN_T && w->cols > 0 &&
           w->rows > 0 && w->cols % 128 == 0 && w->rows % 128 == 0 && w->row0 % 128 == 0 &&
           !(((uintptr_t)w->data + (uintptr_t)w->row0 * (uintptr_t)w->cols) & 15) && !(w->scale_f32 && ((uintptr_t)w->scale & 3));
}

/* The plan of a shape with lg_mu held (the caller unlocks), or NULL with lg_mu released when cuBLASLt is missing or has no
 * plan for it (the shape stays on the GEMV). */
static lg_plan *lg_lock_plan(int kind, int N, int K, int T4, int ldd, int ala, int ald, const void *sa, const void *sb,
                             int ldb = 0, int alb = 256) {
    pthread_mutex_lock(&lg_mu);
    lg_plan *p = lg_open() ? NULL : lg_plan_get(kind, N, K, T4, ldd, ala, ald, sa, sb, ldb ? ldb : K, alb);
    if (!p) pthread_mutex_unlock(&lg_mu);
    return p;
}

extern "C" int dsv4_cuda_linear_gemm(const dsv4_cuda_weight *w, const float *x, int T, float *y, void *ws, size_t ws_bytes,
                                     void *stream) {
    if (!dsv4_cuda_linear_gemm_fits(w, T)) return 1;
    if (!x || !y || ((uintptr_t)x & 15) || ((uintptr_t)y & 15)) return 1;
    const int K = w->cols, N = w->rows, T4 = T & ~3, L = K / 128, L4 = (L + 3) / 4 * 4, NB = N / 128;
    size_t oq, oxs, ows, olt;
    const size_t need = lg_layout(T4, K, N, &oq, &oxs, &ows, &olt);
    if (!ws || ((uintptr_t)ws & 255) || ws_bytes < need)
        return dsv4_cuda_fail("linear gemm: workspace %zu bytes at %p, %zu needed (256-byte aligned) for T %d K %d N %d", ws_bytes,
                              ws, need, T, K, N);
    uint8_t *base = (uint8_t *)ws;
    uint8_t *q = base + oq;
    float *xs = (float *)(base + oxs), *wsc = (float *)(base + ows);
    const uint8_t *A = w->data + (size_t)w->row0 * K;
    cudaStream_t st = DSV4_STREAM(stream);

    const void *sa = wsc, *sb = xs;
    lg_plan *p = lg_lock_plan(0, N, K, T4, N, lg_align(A), lg_align(y), sa, sb);
    if (!p) return 1;
    const int64_t nthr = (int64_t)T4 * L * 32 > (int64_t)NB * L4 ? (int64_t)T4 * L * 32 : (int64_t)NB * L4;
    lg_prep<<<(unsigned)((nthr + 255) / 256), 256, 0, st>>>(x, T4, K, L, q, xs, w->scale, w->scale_f32, w->scale_stride,
                                                            w->row0 / 128, NB, L4, wsc);
    if (dsv4_cuda_check_launch("linear gemm (act quant)")) {
        pthread_mutex_unlock(&lg_mu);
        return -1;
    }
    cublasStatus_t s = f_desc_set(p->op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &sa, sizeof sa);
    if (s == CUBLAS_STATUS_SUCCESS) s = f_desc_set(p->op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &sb, sizeof sb);
    if (s == CUBLAS_STATUS_SUCCESS && lg_matmul(p, A, q, 0.0f, y, base + olt, st) > 0) { /* only codes were written */
        pthread_mutex_unlock(&lg_mu);
        return 1;
    }
    if (s == CUBLAS_STATUS_SUCCESS) s = lg_status;
    pthread_mutex_unlock(&lg_mu);
    if (s != CUBLAS_STATUS_SUCCESS)
        return dsv4_cuda_fail("linear gemm: cublasLtMatmul %d x %d x %d: status %d", N, T4, K, (int)s);
    if (dsv4_cuda_check_launch("linear gemm (cublasLtMatmul)")) return -1;
    /* the last T % 4 rows: the GEMV */
    if (T > T4 && dsv4_cuda_linear(w, x + (size_t)T4 * K, 0, T - T4, y + (size_t)T4 * N, stream)) return -1;
    return 0;
}

/* ---- split path: weights without the FP8 act quant (BF16; FP8 with E8M0 block scales), fp32 x ---- */

/* x planes (3 bf16 or 2 f16), the dequantized weight, the f16 path's amax, alpha and betas, cuBLASLt's */
static size_t lg_split_layout(int T, int K, int Nd, size_t *o_x, size_t *ps, size_t *o_w, size_t *o_sc, size_t *o_lt) {
    const size_t plane = al256((size_t)T * K * 2);
    size_t o = 0;
    *o_x = o, *ps = plane / 2, o += 3 * plane;
    *o_w = o, o += al256((size_t)Nd * K * 2);
    *o_sc = o, o += 256;
    *o_lt = o, o += LG_LT_WS;
    return o;
}

extern "C" size_t dsv4_cuda_linear_gemm_split_ws_bytes(int T, int K, int Nd) {
    size_t a, b, c, d, e;
    if (T < 0 || K < 0 || Nd < 0) return 0;
    return lg_split_layout(T, K, Nd, &a, &b, &c, &d, &e);
}

static int lg_last_f16, lg_last_s4;
extern "C" int dsv4_cuda_linear_gemm_split_last_f16(void) { return lg_last_f16; }
extern "C" int dsv4_cuda_linear_gemm_split_last_s4(void) { return lg_last_s4; }

/* The f16 form of the split path for FP8 weights that fit: opt-in (DSV4_LINEAR_GEMM_F16=1), read once. Measured in
 * session 15 (bench/NOTES.md): closer to the twin (0.08 of the tolerance against 0.25) but not faster end to end (8K
 * prefill 1.003x): the extra pass over x for its largest |x| costs what the third GEMM did. */
static int lg_f16_on(void) {
    static int on = -1;
    if (on < 0) on = dsv4_env_int("DSV4_LINEAR_GEMM_F16", 0) != 0;
    return on;
}

/* Whether the forward routes prefill linears through the split path: DSV4_LINEAR_GEMM_SPLIT=1 / 0, else the built-in
 * default: on (its kernel checks pass on the H200, test_kernels "linear gemm split", 0.02-0.14 of the GEMV tolerance; all
 * fixtures and unseen shapes pass with it, scripts/gpu_test.sh; Flash prefill 1,088 -> 1,606 tok/s projected).
 * Read once per process. */
#ifndef DSV4_LINEAR_GEMM_SPLIT_DEFAULT
#define DSV4_LINEAR_GEMM_SPLIT_DEFAULT 1
#endif
extern "C" int dsv4_cuda_linear_gemm_split_enabled(void) {
    static int on = -1;
    if (on < 0) {
        const char *e = getenv("DSV4_LINEAR_GEMM_SPLIT");
        on = e && *e ? *e != '0' : DSV4_LINEAR_GEMM_SPLIT_DEFAULT;
    }
    return on;
}

extern "C" int dsv4_cuda_linear_gemm_split_fits(const dsv4_cuda_weight *w, int T) {
    if (!w || !w->data || w->act_quant || T < DSV4_LINEAR_GEMM_MIN_T || w->rows <= 0 || w->cols <= 0 || w->cols % 8) return 0;
    if (w->fmt == DSV4_WF_BF16) return !(((uintptr_t)w->data + (uintptr_t)w->row0 * (uintptr_t)w->cols * 2) & 15);
    return w->fmt == DSV4_WF_FP8 && w->scale && !w->scale_f32 && !((uintptr_t)w->data & 3);
}

/* x terms of the split path for FP8 weights (V4: wo_a, the one FP8 linear without act quant), DSV4_LINEAR_GEMM_FP8_TERMS
 * (read once) or dsv4_cuda_linear_gemm_split_fp8_terms: 2 (the default since session 24) hi + mid, x to ~2^-16, two
 * thirds of the products (8K prefill ~0.97x); 3 x to ~2^-24 (and the f16 form where it is on); 1 x rounded to bf16 as
 * the official model has it (o is bf16 there, spec 6 step 9): a third of the products, 8K prefill 0.94x, but the GPU
 * moves measurably further from the CPU engine on the unseen models (bench/NOTES.md "Session 24"). BF16 weights keep
 * three terms by default (the router's gate and the compressors are fp32 matmuls in the reference; below). */
static int lg_terms[2]; /* [0] FP8, [1] BF16 weights; 0: not read yet */
static int lg_nt(int bf16) {
    if (!lg_terms[bf16]) {
        const int n = dsv4_env_int(bf16 ? "DSV4_LINEAR_GEMM_BF16_TERMS" : "DSV4_LINEAR_GEMM_FP8_TERMS", bf16 ? 3 : 2);
        lg_terms[bf16] = n >= 1 && n <= 3 ? n : bf16 ? 3 : 2;
    }
    return lg_terms[bf16];
}
extern "C" void dsv4_cuda_linear_gemm_split_fp8_terms(int n) { lg_terms[0] = n >= 1 && n <= 3 ? n : 0; }
/* the same for BF16 weights without act_bf16 (the compressors' and indexer's projections, the gate in prefill):
 * DSV4_LINEAR_GEMM_BF16_TERMS, default 3; 2 is an experiment (not yet measured: ~1 % of the 8K prefill is at stake,
 * bench/NOTES.md "Session 24") */
extern "C" void dsv4_cuda_linear_gemm_split_bf16_terms(int n) { lg_terms[1] = n >= 1 && n <= 3 ? n : 0; }

static int lg_run_terms(lg_plan *p, const void *A, const __nv_bfloat16 *t0, size_t ps, int nt, float *y, void *ltws, cudaStream_t st,
                        const char *what);

/* lg_split4 where it applies (DSV4_LINEAR_SPLIT4, on by default since session 30, or dsv4_cuda_linear_gemm_split4) */
static int lg_s4 = -1;
extern "C" void dsv4_cuda_linear_gemm_split4(int on) { lg_s4 = on == 0 || on == 1 ? on : -1; }
static int lg_split4_on(void) {
    static int env = -1;
    if (lg_s4 >= 0) return lg_s4;
    if (env < 0) env = dsv4_env_int("DSV4_LINEAR_SPLIT4", 1) != 0;
    return env;
}

extern "C" int dsv4_cuda_linear_gemm_split(const dsv4_cuda_weight *w, const float *x, int64_t ldx, int T, float *y, int64_t ldy,
                                           void *ws, size_t ws_bytes, void *stream) {
    if (!dsv4_cuda_linear_gemm_split_fits(w, T)) return 1;
    const int K = w->cols, N = w->rows, fp8 = w->fmt == DSV4_WF_FP8, nt = w->act_bf16 ? 1 : lg_nt(!fp8);
    if (!ldx) ldx = K;
    if (!ldy) ldy = N;
    if (!x || !y || ldx < K || ldy < N || (ldy & 3) || ((uintptr_t)y & 15)) return 1;
    size_t ox, ps, ow, osc, olt;
    const size_t need = lg_split_layout(T, K, fp8 ? N : 0, &ox, &ps, &ow, &osc, &olt);
    if (!ws || ((uintptr_t)ws & 255) || ws_bytes < need)
        return dsv4_cuda_fail("linear gemm (split): workspace %zu bytes at %p, %zu needed (256-byte aligned) for T %d K %d N %d",
                              ws_bytes, ws, need, T, K, N);
    uint8_t *base = (uint8_t *)ws;
    __nv_bfloat16 *xp = (__nv_bfloat16 *)(base + ox), *wd = (__nv_bfloat16 *)(base + ow);
    const void *A = fp8 ? (const void *)wd : (const void *)(w->data + (size_t)w->row0 * K * 2);
    cudaStream_t st = DSV4_STREAM(stream);
    const int64_t nx = (int64_t)T * K;
    if (fp8 && nt == 3 && w->f16_ok && lg_f16_on()) { /* two f16 terms; the bf16 route below if cuBLASLt has no plan */
        lg_plan *p = lg_lock_plan(2, N, K, T, (int)ldy, lg_align(A), lg_align(y), NULL, NULL);
        if (p) {
            unsigned *amax = (unsigned *)(base + osc);
            float *ab = (float *)(base + osc + 16);
            __half *xh = (__half *)(base + ox), *wh = (__half *)(base + ow);
            const int64_t nw = (int64_t)N * K / 4, ng = (nx + 255) / 256 > 1024 ? 1024 : (nx + 255) / 256;

            int r = cudaMemsetAsync(amax, 0, sizeof(unsigned), st) != cudaSuccess;
            if (!r) {
                lg_amax<<<(unsigned)ng, 256, 0, st>>>(x, ldx, T, K, amax);
                lg_split_f16<<<(unsigned)((nx + 255) / 256), 256, 0, st>>>(x, ldx, T, K, (int64_t)ps, amax, w->f16_shift, ab, xh);
                lg_deq_fp8_f16<<<(unsigned)((nw + 255) / 256), 256, 0, st>>>(w->data, w->scale, w->scale_stride, w->row0, N, K,
                                                                          w->f16_shift, wh);
                r = dsv4_cuda_check_launch("linear gemm (split, f16)") ? -1 : 0;
            }
            /* y = alpha (W hi), then += alpha (W lo) */
            for (int j = 0; j < 2 && !r; j++) r = lg_matmul(p, wh, xh + (size_t)j * ps, 0.0f, y, base + olt, st, ab, ab + 1 + j);
            const cublasStatus_t s = lg_status;
            pthread_mutex_unlock(&lg_mu);
            if (r < 0) return dsv4_cuda_fail("linear gemm (split, f16): %d x %d x %d: status %d", N, T, K, (int)s);
            if (r == 0) {
                lg_last_f16 = 1;
                return dsv4_cuda_check_launch("linear gemm (split, f16, cublasLtMatmul)");
            }
            /* r > 0: no algorithm ran (nothing written to y): the bf16 route */
        }
    }
    lg_plan *p = lg_lock_plan(1, N, K, T, (int)ldy, lg_align(A), lg_align(y), NULL, NULL);
    if (!p) return 1;
    lg_last_f16 = 0;
    lg_last_s4 = lg_split4_on() && K % 4 == 0 && ldx % 4 == 0 && !((uintptr_t)x & 15) && ps % 4 == 0 && T <= 65535;
    if (lg_last_s4)
        lg_split4<<<dim3((unsigned)((K / 4 + 255) / 256), (unsigned)T), 256, 0, st>>>(x, ldx, K, nt, (int64_t)ps, xp);
    else
        lg_split<<<(unsigned)((nx + 255) / 256), 256, 0, st>>>(x, ldx, T, K, nt, (int64_t)ps, xp);
    if (fp8) {
        const int64_t nw = (int64_t)N * K / 4;
        lg_deq_fp8<<<(unsigned)((nw + 255) / 256), 256, 0, st>>>(w->data, w->scale, w->scale_stride, w->row0, N, K, wd);
    }
    if (dsv4_cuda_check_launch("linear gemm (split x)")) {
        pthread_mutex_unlock(&lg_mu);
        return -1;
    }
    return lg_run_terms(p, A, xp, (size_t)ps, nt, y, base + olt, st, "split");
}

/* under lg_mu (released here): y = W t0, then += W t1, += W t2 (terms ps elements apart): a fixed order, so a rerun gives
 * the same bits. 1 when nothing ran (y untouched). */
static int lg_run_terms(lg_plan *p, const void *A, const __nv_bfloat16 *t0, size_t ps, int nt, float *y, void *ltws, cudaStream_t st,
                        const char *what) {
    int r = 0;
    for (int j = 0; j < nt && !r; j++) r = lg_matmul(p, A, t0 + (size_t)j * ps, j ? 1.0f : 0.0f, y, ltws, st);
    const cublasStatus_t s = lg_status;
    const int N = p->N, T = p->T4, K = p->K;
    pthread_mutex_unlock(&lg_mu);
    if (r > 0) return 1;
    if (r < 0) return dsv4_cuda_fail("linear gemm (%s): cublasLtMatmul %d x %d x %d: status %d", what, N, T, K, (int)s);
    return dsv4_cuda_check_launch("linear gemm (terms, cublasLtMatmul)");
}

/* ---- x given as bf16 terms by its producer (dsv4_cuda_attn_kv8_wg_terms for wo_a) ---- */

/* FP8 weights with two terms that lie side by side (ps == K: hi then mid in a row, as the attention writes them): one
 * GEMM with K 2K on [W | W] (the weight dequantized twice into the workspace) instead of two GEMMs and y read back once
 * (DSV4_LINEAR_TERMS_CAT=1 or dsv4_cuda_linear_gemm_terms_cat; off by default: no faster on an H200, NOTES "Session 30").
 * Another summation order than the two GEMMs' (hi's and mid's products in one fp32 sum). */
static int lg_cat = -1, lg_last_cat;
extern "C" void dsv4_cuda_linear_gemm_terms_cat(int on) { lg_cat = on == 0 || on == 1 ? on : -1; }
extern "C" int dsv4_cuda_linear_gemm_terms_last_cat(void) { return lg_last_cat; }
static int lg_cat_on(void) {
    static int env = -1;
    if (lg_cat >= 0) return lg_cat;
    if (env < 0) env = dsv4_env_int("DSV4_LINEAR_TERMS_CAT", 0) != 0;
    return env;
}

extern "C" int dsv4_cuda_linear_gemm_terms_nt(const dsv4_cuda_weight *w) {
    if (!w || !(w->fmt == DSV4_WF_FP8 || w->fmt == DSV4_WF_BF16)) return 0;
    const int fp8 = w->fmt == DSV4_WF_FP8, nt = w->act_bf16 ? 1 : lg_nt(!fp8);
    if (fp8 && nt == 3 && w->f16_ok && lg_f16_on()) return 0; /* the split takes its f16 form there */
    return nt;
}

/* the checks and the plan (lg_mu held on success; NULL: declined, unlocked). kind 1: bf16 terms on the bf16 (or FP8,
 * dequantized to bf16) weight; kind 2: one f16 term on the FP8 weight dequantized to f16 (f16_ok required) */
static lg_plan *lg_terms_plan(int kind, const dsv4_cuda_weight *w, const void *terms, int64_t ldt, int64_t ps, int nt, int T,
                              float *y, int64_t ldy, const void **A, size_t *o_w, size_t *o_lt) {
    if (!dsv4_cuda_linear_gemm_split_fits(w, T) || nt < 1 || nt > 3) return NULL;
    const int K = w->cols, N = w->rows, fp8 = w->fmt == DSV4_WF_FP8;
    if (kind == 2 && (!fp8 || !w->f16_ok || nt != 1)) return NULL;
    if (!ldy) ldy = N;
    if (!terms || !y || ldt < K || ldt > INT32_MAX || ldy < N || (ldy & 3) || ((uintptr_t)y & 15) || ((uintptr_t)terms & 15) ||
        (ldt & 7) || (nt > 1 && (ps & 7)))
        return NULL;
    size_t ox, xps, osc;
    lg_split_layout(0, K, fp8 ? N : 0, &ox, &xps, o_w, &osc, o_lt);
    *A = fp8 ? NULL : (const void *)(w->data + (size_t)w->row0 * K * 2);
    int alb = lg_align(terms);
    if (nt > 1 && lg_align((const __nv_bfloat16 *)terms + ps) < alb) alb = lg_align((const __nv_bfloat16 *)terms + ps);
    /* the dequantized weight sits at o_w of a 256-byte aligned workspace */
    return lg_lock_plan(kind, N, K, T, (int)ldy, fp8 ? 256 : lg_align(*A), lg_align(y), NULL, NULL, (int)ldt, alb);
}

/* lg_terms_plan with the workspace's checks (lg_mu held on success; 1: declined, -1: failed, both unlocked) */
static int lg_terms_begin(int kind, const dsv4_cuda_weight *w, const void *terms, int64_t ldt, int64_t ps, int nt, int T, float *y,
                          int64_t ldy, const void *ws, size_t ws_bytes, const char *what, lg_plan **p, const void **A, size_t *o_w,
                          size_t *o_lt) {
    if (!ws || ((uintptr_t)ws & 255)) return 1;
    *p = lg_terms_plan(kind, w, terms, ldt, ps, nt, T, y, ldy, A, o_w, o_lt);
    if (!*p) return 1;
    if (ws_bytes < *o_lt + LG_LT_WS) {
        pthread_mutex_unlock(&lg_mu);
        return dsv4_cuda_fail("linear gemm (%s): workspace %zu bytes, %zu needed for K %d N %d", what, ws_bytes, *o_lt + LG_LT_WS,
                              w->cols, w->rows);
    }
    return 0;
}

extern "C" int dsv4_cuda_linear_gemm_terms_ready(const dsv4_cuda_weight *w, const void *terms, int64_t ldt, int64_t ps, int nt,
                                                 int T, float *y, int64_t ldy) {
    const void *A;
    size_t ow, olt;
    lg_plan *p = lg_terms_plan(1, w, terms, ldt, ps, nt, T, y, ldy, &A, &ow, &olt);
    if (!p) return 0;
    pthread_mutex_unlock(&lg_mu);
    return 1;
}

extern "C" int dsv4_cuda_linear_gemm_terms(const dsv4_cuda_weight *w, const void *terms, int64_t ldt, int64_t ps, int nt, int T,
                                           float *y, int64_t ldy, void *ws, size_t ws_bytes, void *stream) {
    const void *A;
    size_t ow, olt;
    lg_plan *p;
    const int rb = lg_terms_begin(1, w, terms, ldt, ps, nt, T, y, ldy, ws, ws_bytes, "terms", &p, &A, &ow, &olt);
    if (rb) return rb;
    const int K = w->cols, N = w->rows;
    uint8_t *base = (uint8_t *)ws;
    cudaStream_t st = DSV4_STREAM(stream);
    lg_last_cat = 0;
    /* one GEMM on [W | W] where the workspace holds it and cuBLASLt has a plan */
    if (!A && nt == 2 && ps == K && ldt >= 2 * (int64_t)K && lg_cat_on()) {
        size_t ox, xps, ow2, osc, olt2;
        lg_split_layout(0, 2 * K, N, &ox, &xps, &ow2, &osc, &olt2);
        pthread_mutex_unlock(&lg_mu); /* (p's slot may be reused by the next plan: p is looked up again below) */
        lg_plan *p2 = ws_bytes >= olt2 + LG_LT_WS ? lg_lock_plan(1, N, 2 * K, T, (int)(ldy ? ldy : N), 256, lg_align(y), NULL, NULL,
                                                                  (int)ldt, lg_align(terms))
                                                   : NULL;
        if (p2) {
            __nv_bfloat16 *wd = (__nv_bfloat16 *)(base + ow2);
            const int64_t nw = (int64_t)N * K / 4;
            lg_deq_fp8<1><<<(unsigned)((nw + 255) / 256), 256, 0, st>>>(w->data, w->scale, w->scale_stride, w->row0, N, K, wd);
            if (dsv4_cuda_check_launch("linear gemm (terms, weight twice)")) {
                pthread_mutex_unlock(&lg_mu);
                return -1;
            }
            lg_last_cat = 1;
            const int rc = lg_run_terms(p2, wd, (const __nv_bfloat16 *)terms, 0, 1, y, base + olt2, st, "terms, K-concatenated");
            if (rc != 1) return rc;
            lg_last_cat = 0; /* no algorithm ran (y untouched): the two GEMMs */
        }
        p = lg_terms_plan(1, w, terms, ldt, ps, nt, T, y, ldy, &A, &ow, &olt);
        if (!p) return 1;
    }
    if (!A) { /* FP8: the view's rows as bf16 */
        __nv_bfloat16 *wd = (__nv_bfloat16 *)(base + ow);
        const int64_t nw = (int64_t)N * K / 4;
        lg_deq_fp8<<<(unsigned)((nw + 255) / 256), 256, 0, st>>>(w->data, w->scale, w->scale_stride, w->row0, N, K, wd);
        if (dsv4_cuda_check_launch("linear gemm (terms, weight)")) {
            pthread_mutex_unlock(&lg_mu);
            return -1;
        }
        A = wd;
    }
    return lg_run_terms(p, A, (const __nv_bfloat16 *)terms, (size_t)ps, nt, y, base + olt, st, "terms");
}

/* ---- wo_a on one f16 term its producer wrote (dsv4_cuda_attn_kv8_wg_terms with f16s) ---- */

extern "C" int dsv4_cuda_wo_a_f16_scale(const float *const *norms, const int *n, int k, int Dh, int f16_shift, float out[3]) {
    float mx = 0.0f;
    for (int j = 0; j < k; j++)
        for (int i = 0; norms[j] && i < n[j]; i++) {
            const float a = fabsf(norms[j][i]);
            if (!(a <= FLT_MAX)) return 1; /* NaN or inf */
            mx = a > mx ? a : mx;
        }
    if (!(mx > 0.0f) || Dh <= 0) return 1;
    /* |v| <= sqrt(Dh) x mx x 1.0625 (an RMS-normed row: |x_d| <= sqrt(Dh) rms; a rope pair's norm too, so either element
     * after a rotation; the FP8 cache rounds up by at most 2^-4); the softmax weights sum to at most 1 */
    const double B = sqrt((double)Dh) * (double)mx * 1.0625;
    int E;
    frexp(B, &E); /* B < 2^E */
    const int s = E - 15; /* B x 2^-s < 2^15, half of f16's largest */
    if (s + f16_shift < -126 || s + f16_shift > 127 || s < -126 || s > 127) return 1;
    out[0] = ldexpf(1.0f, -s), out[1] = ldexpf(1.0f, s + f16_shift), out[2] = 0.0f;
    return 0;
}

extern "C" int dsv4_cuda_linear_gemm_terms_f16_ready(const dsv4_cuda_weight *w, const void *terms, int64_t ldt, int T, float *y,
                                                     int64_t ldy) {
    const void *A;
    size_t ow, olt;
    lg_plan *p = lg_terms_plan(2, w, terms, ldt, 0, 1, T, y, ldy, &A, &ow, &olt);
    if (!p) return 0;
    pthread_mutex_unlock(&lg_mu);
    return 1;
}

extern "C" int dsv4_cuda_linear_gemm_terms_f16(const dsv4_cuda_weight *w, const void *terms, int64_t ldt, int T, float *y,
                                               int64_t ldy, const float *ab, void *ws, size_t ws_bytes, void *stream) {
    const void *A;
    size_t ow, olt;
    lg_plan *p;
    if (!ab) return 1;
    const int rb = lg_terms_begin(2, w, terms, ldt, 0, 1, T, y, ldy, ws, ws_bytes, "f16 term", &p, &A, &ow, &olt);
    if (rb) return rb;
    const int K = w->cols, N = w->rows;
    uint8_t *base = (uint8_t *)ws;
    cudaStream_t st = DSV4_STREAM(stream);
    __half *wh = (__half *)(base + ow);
    const int64_t nw = (int64_t)N * K / 4;
    lg_deq_fp8_f16<<<(unsigned)((nw + 255) / 256), 256, 0, st>>>(w->data, w->scale, w->scale_stride, w->row0, N, K, w->f16_shift, wh);
    if (dsv4_cuda_check_launch("linear gemm (f16 term, weight)")) {
        pthread_mutex_unlock(&lg_mu);
        return -1;
    }
    /* y = alpha (W t) + beta y, alpha = ab[0], beta = ab[1] (0) */
    const int r = lg_matmul(p, wh, terms, 0.0f, y, base + olt, st, ab, ab + 1);
    const cublasStatus_t s = lg_status;
    pthread_mutex_unlock(&lg_mu);
    if (r > 0) return 1;
    if (r < 0) return dsv4_cuda_fail("linear gemm (f16 term): cublasLtMatmul %d x %d x %d: status %d", N, T, K, (int)s);
    return dsv4_cuda_check_launch("linear gemm (f16 term, cublasLtMatmul)");
}
