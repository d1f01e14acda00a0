/* bench_cuda.h - reference measurements for `dsv4 bench` (bench_cuda.cu), plain C: the device's
 * copy bandwidth and a cuBLASLt FP8 GEMM, timed with CUDA events on the current device. */
#ifndef DSV4_CUDA_BENCH_CUDA_H
#define DSV4_CUDA_BENCH_CUDA_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* cudaMemcpy device to device of `bytes`, `reps` times after one warm-up; *gbs = median of
 * 2 * bytes / time (bytes read + bytes written per copy), in GB/s (1e9). 0, or -1 with err. */
int dsv4_cuda_bench_d2d(size_t bytes, int reps, double *gbs, char *err, size_t errcap);

/* cuBLASLt D[m, n] (bf16) = A[m, k] . B[n, k]^T with A, B FP8 e4m3 (the "TN" layout of an
 * FP8 linear: m = output features, n = tokens), fp32 accumulation, best heuristic algorithm;
 * `reps` timed runs after a warm-up; *us = median time in microseconds. 0, or -1 with err. */
int dsv4_cuda_bench_fp8_gemm(int m, int n, int k, int reps, double *us, char *err, size_t errcap);

#ifdef __cplusplus
}
#endif
#endif
