/* bench_cuda.cu - the device copy bandwidth and a cuBLASLt FP8 GEMM for `dsv4 bench`
 * (bench_cuda.h). cuBLASLt is opened with dlopen, so that binaries linking every CUDA object without
 * -lcublasLt (tests/gpu/test_kernels) still link. */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>

#include <cublasLt.h>
#include <cuda_runtime.h>

#include "bench_cuda.h"

#define CK(x)                                                                                              \
    do {                                                                                                   \
        cudaError_t e_ = (x);                                                                              \
        if (e_ != cudaSuccess) {                                                                           \
            if (err && errcap) snprintf(err, errcap, "%s: %s", #x, cudaGetErrorString(e_));                \
            goto out;                                                                                      \
        }                                                                                                  \
    } while (0)
#define CKL(x)                                                                                             \
    do {                                                                                                   \
        cublasStatus_t s_ = (x);                                                                           \
        if (s_ != CUBLAS_STATUS_SUCCESS) {                                                                 \
            if (err && errcap) snprintf(err, errcap, "%s: cuBLASLt status %d", #x, (int)s_);               \
            goto out;                                                                                      \
        }                                                                                                  \
    } while (0)

static decltype(&cublasLtCreate) p_cublasLtCreate;
static decltype(&cublasLtDestroy) p_cublasLtDestroy;
static decltype(&cublasLtMatmulDescCreate) p_cublasLtMatmulDescCreate;
static decltype(&cublasLtMatmulDescDestroy) p_cublasLtMatmulDescDestroy;
static decltype(&cublasLtMatmulDescSetAttribute) p_cublasLtMatmulDescSetAttribute;
static decltype(&cublasLtMatrixLayoutCreate) p_cublasLtMatrixLayoutCreate;
static decltype(&cublasLtMatrixLayoutDestroy) p_cublasLtMatrixLayoutDestroy;
static decltype(&cublasLtMatmulPreferenceCreate) p_cublasLtMatmulPreferenceCreate;
static decltype(&cublasLtMatmulPreferenceDestroy) p_cublasLtMatmulPreferenceDestroy;
static decltype(&cublasLtMatmulPreferenceSetAttribute) p_cublasLtMatmulPreferenceSetAttribute;
static decltype(&cublasLtMatmulAlgoGetHeuristic) p_cublasLtMatmulAlgoGetHeuristic;
static decltype(&cublasLtMatmul) p_cublasLtMatmul;

static int lt_open(char *err, size_t errcap) {
    static int state; /* 0 untried, 1 ok, -1 failed */
    if (state) return state > 0 ? 0 : -1;
    const char *names[] = {"libcublasLt.so", "libcublasLt.so.13", "libcublasLt.so.12"};
    void *h = NULL;
    for (int i = 0; i < 3 && !h; i++) h = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
    state = -1;
    if (!h) {
        if (err && errcap) snprintf(err, errcap, "cannot open libcublasLt: %s", dlerror());
        return -1;
    }
#define LT(f_)                                                                                             \
    if (!(p_##f_ = (decltype(p_##f_))dlsym(h, #f_))) {                                                     \
        if (err && errcap) snprintf(err, errcap, "libcublasLt has no %s", #f_);                           \
        return -1;                                                                                         \
    }
    LT(cublasLtCreate)
    LT(cublasLtDestroy)
    LT(cublasLtMatmulDescCreate)
    LT(cublasLtMatmulDescDestroy)
    LT(cublasLtMatmulDescSetAttribute)
    LT(cublasLtMatrixLayoutCreate)
    LT(cublasLtMatrixLayoutDestroy)
    LT(cublasLtMatmulPreferenceCreate)
    LT(cublasLtMatmulPreferenceDestroy)
    LT(cublasLtMatmulPreferenceSetAttribute)
    LT(cublasLtMatmulAlgoGetHeuristic)
    LT(cublasLtMatmul)
#undef LT
    state = 1;
    return 0;
}

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_d);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

extern "C" int dsv4_cuda_bench_d2d(size_t bytes, int reps, double *gbs, char *err, size_t errcap) {
    int rc = -1;
    void *a = NULL, *b = NULL;
    cudaEvent_t e0 = NULL, e1 = NULL;
    double *t = (double *)calloc((size_t)(reps > 0 ? reps : 1), sizeof(double));
    if (!t || reps < 1) {
        if (err && errcap) snprintf(err, errcap, "d2d: bad repetition count or out of memory");
        free(t);
        return -1;
    }
    CK(cudaMalloc(&a, bytes));
    CK(cudaMalloc(&b, bytes));
    CK(cudaMemset(a, 1, bytes));
    CK(cudaMemset(b, 2, bytes));
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    CK(cudaMemcpy(b, a, bytes, cudaMemcpyDeviceToDevice));
    for (int r = 0; r < reps; r++) {
        CK(cudaEventRecord(e0, 0));
        CK(cudaMemcpyAsync(r % 2 ? a : b, r % 2 ? b : a, bytes, cudaMemcpyDeviceToDevice, 0));
        CK(cudaEventRecord(e1, 0));
        CK(cudaEventSynchronize(e1));
        float ms = 0;
        CK(cudaEventElapsedTime(&ms, e0, e1));
        t[r] = 2.0 * (double)bytes / (ms * 1e-3) / 1e9;
    }
    *gbs = median(t, reps);
    rc = 0;
out:
    if (e0) cudaEventDestroy(e0);
    if (e1) cudaEventDestroy(e1);
    cudaFree(a);
    cudaFree(b);
    free(t);
    return rc;
}

extern "C" int dsv4_cuda_bench_fp8_gemm(int m, int n, int k, int reps, double *us, char *err, size_t errcap) {
    int rc = -1;
    void *A = NULL, *B = NULL, *D = NULL, *ws = NULL;
    const size_t wsz = 64u << 20;
    cudaEvent_t e0 = NULL, e1 = NULL;
    cublasLtHandle_t h = NULL;
    cublasLtMatmulDesc_t op = NULL;
    cublasLtMatrixLayout_t la = NULL, lb = NULL, ld = NULL;
    cublasLtMatmulPreference_t pref = NULL;
    cublasLtMatmulHeuristicResult_t res;
    int nres = 0;
    cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
    float alpha = 1.0f, beta = 0.0f;
    double *t = (double *)calloc((size_t)(reps > 0 ? reps : 1), sizeof(double));
    if (!t || reps < 1 || m < 16 || n < 16 || k < 16) {
        if (err && errcap) snprintf(err, errcap, "fp8 gemm: bad arguments or out of memory");
        free(t);
        return -1;
    }
    if (lt_open(err, errcap)) {
        free(t);
        return -1;
    }
    CK(cudaMalloc(&A, (size_t)m * k));
    CK(cudaMalloc(&B, (size_t)n * k));
    CK(cudaMalloc(&D, (size_t)m * n * 2));
    CK(cudaMalloc(&ws, wsz));
    CK(cudaMemset(A, 0x30, (size_t)m * k)); /* e4m3 0.5 */
    CK(cudaMemset(B, 0x30, (size_t)n * k));
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    CKL(p_cublasLtCreate(&h));
    CKL(p_cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    CKL(p_cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
    CKL(p_cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
    /* column-major: A is k x m (op T), B is k x n (op N), D is m x n */
    CKL(p_cublasLtMatrixLayoutCreate(&la, CUDA_R_8F_E4M3, (uint64_t)k, (uint64_t)m, k));
    CKL(p_cublasLtMatrixLayoutCreate(&lb, CUDA_R_8F_E4M3, (uint64_t)k, (uint64_t)n, k));
    CKL(p_cublasLtMatrixLayoutCreate(&ld, CUDA_R_16BF, (uint64_t)m, (uint64_t)n, m));
    CKL(p_cublasLtMatmulPreferenceCreate(&pref));
    CKL(p_cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &wsz, sizeof wsz));
    CKL(p_cublasLtMatmulAlgoGetHeuristic(h, op, la, lb, ld, ld, pref, 1, &res, &nres));
    if (nres < 1) {
        if (err && errcap) snprintf(err, errcap, "fp8 gemm: cuBLASLt found no algorithm for %d x %d x %d", m, n, k);
        goto out;
    }
    for (int r = -1; r < reps; r++) {
        CK(cudaEventRecord(e0, 0));
        CKL(p_cublasLtMatmul(h, op, &alpha, A, la, B, lb, &beta, D, ld, D, ld, &res.algo, ws, wsz, 0));
        CK(cudaEventRecord(e1, 0));
        CK(cudaEventSynchronize(e1));
        float ms = 0;
        CK(cudaEventElapsedTime(&ms, e0, e1));
        if (r >= 0) t[r] = ms * 1e3;
    }
    *us = median(t, reps);
    rc = 0;
out:
    if (pref) p_cublasLtMatmulPreferenceDestroy(pref);
    if (la) p_cublasLtMatrixLayoutDestroy(la);
    if (lb) p_cublasLtMatrixLayoutDestroy(lb);
    if (ld) p_cublasLtMatrixLayoutDestroy(ld);
    if (op) p_cublasLtMatmulDescDestroy(op);
    if (h) p_cublasLtDestroy(h);
    if (e0) cudaEventDestroy(e0);
    if (e1) cudaEventDestroy(e1);
    cudaFree(A);
    cudaFree(B);
    cudaFree(D);
    cudaFree(ws);
    free(t);
    return rc;
}
