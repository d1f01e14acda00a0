/* linear_gemm.h - prefill linears on the FP8 tensor cores (linear_gemm.cu), plain C.
 *
 * y[T, N] (fp32) = act_quant(x)[T, K] . W^T for an FP8 e4m3 weight with 128x128 block scales and the FP8
 * act-quant recipe (the release's dense linears), as one cuBLASLt matmul with DeepSeek's scaling modes on
 * Hopper: the weight is A (op T, CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F), the act-quant codes are B
 * (op N, CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F: one fp32 scale per (token, 128 columns)), D is fp32.
 * A kernel first writes the e4m3 codes and power-of-two scales of x exactly as dsv4_act_quant_fp8 (block 128)
 * computes them, and the weight's block scales as fp32 in the layout cuBLASLt wants (a few KB; converted per
 * call in the same launch, so no cache can go stale). Rows beyond the largest multiple of 4 (cuBLASLt's
 * scale layouts need N % 4 == 0) go through dsv4_cuda_linear. The result is dsv4_cpu_linear's up to the
 * tensor cores' accumulation of each 128-column block (on Hopper FP8 products are summed with ~14 significant
 * bits before the block's scales are applied in fp32): relative L2 ~1.9e-4 from the twin, every element within
 * 2^-8 (|ref| + rms(ref)), the bf16 output rounding of DeepSeek's FP8 GEMMs (tests/gpu/test_kernels.c). It is
 * deterministic (a rerun gives the same bits) but NOT bitwise the decode GEMV's, so the forward uses it only for
 * passes that are not decode steps.
 *
 * cuBLASLt is opened with dlopen (libcublasLt.so.13 / .so.12) on first use; when it is missing, or finds no
 * algorithm for a shape, the call answers "not applicable" (and says why once on stderr). No device memory
 * is allocated: the caller passes a workspace of dsv4_cuda_linear_gemm_ws_bytes(). Host-side plans
 * (descriptors, chosen algorithm) are cached per shape; calls from several threads are serialized. */
#ifndef DSV4_CUDA_LINEAR_GEMM_H
#define DSV4_CUDA_LINEAR_GEMM_H

#include <stddef.h>
#include <stdint.h>

#include "cuda_backend.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Fewest rows of x that take the GEMM (fewer: the GEMV is as fast and stays T-invariant). */
#define DSV4_LINEAR_GEMM_MIN_T 64

/* Whether the forward routes prefill linears here: DSV4_LINEAR_GEMM=0 / 1 in the environment, else the
 * built-in default (on: the result is ~1.9e-4 relative L2 from the twin, inside bf16 output rounding; see
 * linear_gemm.cu). Set it before the model goes to the GPU (the workspace is sized then). */
int dsv4_cuda_linear_gemm_enabled(void);

/* Workspace bytes for up to T rows, K columns (input features) and N rows of the weight (output features):
 * codes, scales and cuBLASLt's own workspace. */
size_t dsv4_cuda_linear_gemm_ws_bytes(int T, int K, int N);

/* 1 when the GEMM path takes this weight and T (FP8 + act quant, T >= DSV4_LINEAR_GEMM_MIN_T, K % 128 == 0,
 * N % 128 == 0, a view starting at a multiple of 128 rows, 16-byte aligned data); 0 otherwise. */
int dsv4_cuda_linear_gemm_fits(const dsv4_cuda_weight *w, int T);

/* y = x . W^T (x fp32 [T, K], y fp32 [T, N], device). Returns 0 when done, 1 when not applicable (the caller
 * runs dsv4_cuda_linear instead; nothing was enqueued), -1 on error (dsv4_cuda_last_error says why).
 * ws: device workspace of ws_bytes >= dsv4_cuda_linear_gemm_ws_bytes(T, K, N), 256-byte aligned. */
int dsv4_cuda_linear_gemm(const dsv4_cuda_weight *w, const float *x, int T, float *y, void *ws, size_t ws_bytes,
                          void *stream);

/* The split path, for the prefill linears the FP8 GEMM does not take: weights without the FP8 act quant (BF16 as
 * stored; FP8 with E8M0 128x128 block scales, dequantized exactly into bf16 in the workspace per call) and fp32 x,
 * which is split into three bf16 terms (hi = bf16(x), mid = bf16(x - hi), lo = bf16(x - hi - mid): ~24 bits, fp32's
 * precision) or, for act_bf16 weights, rounded to bf16 (one term). y = W hi, += W mid, += W lo: three cuBLASLt bf16
 * GEMMs accumulating in fp32 (products of bf16 values are exact in fp32), deterministic; x rows ldx values apart, y
 * rows ldy (0: contiguous). Not bitwise the GEMV's, so, like the FP8 GEMM, only for passes that are not decode steps.
 * With three terms (dsv4_cuda_linear_gemm_split_fp8_terms below; the default is two),
 * FP8 weights whose block exponents fit f16 (w->f16_ok; the release's wo_a) take two f16 terms instead: x / 2^e (the
 * slice's largest |x| in [2^14, 2^15)) as hi + lo (22 bits, the decode GEMV's split for FP8), the weight as f16 values
 * x 2^-f16_shift (exact), y = 2^(e + shift) (W hi) + 2^(e + shift) (W lo): two GEMMs, alpha and beta read by cuBLASLt
 * from device memory. Opt-in, DSV4_LINEAR_GEMM_F16=1 (more precise, not faster: bench/NOTES.md "Session 15").
 * Returns 0 done, 1 not applicable (nothing enqueued that matters; run dsv4_cuda_linear), -1 error.
 * Workspace: dsv4_cuda_linear_gemm_split_ws_bytes(T, K, Nd), Nd = the most rows of an FP8 weight (view) it takes. */
size_t dsv4_cuda_linear_gemm_split_ws_bytes(int T, int K, int Nd);
/* x terms for FP8 weights in the split path (DSV4_LINEAR_GEMM_FP8_TERMS): 2 (default) hi + mid, x to ~2^-16; 3 the three
 * bf16 terms above (and the f16 form where it applies); 1 x rounded to bf16, the official model's wo_a input; 0 back to
 * the environment's choice. Tests and measurements. (The forward's wo_a takes one f16 term instead where it can,
 * dsv4_cuda_linear_gemm_terms_f16 below, since session 44; DSV4_WO_A_F16=0 sends it back to these terms.) */
void dsv4_cuda_linear_gemm_split_fp8_terms(int n);
/* the same for BF16 weights without act_bf16 (DSV4_LINEAR_GEMM_BF16_TERMS): 3 (default), 2 or 1; 0 back to the
 * environment's choice */
void dsv4_cuda_linear_gemm_split_bf16_terms(int n);
/* Whether the forward takes the split path in prefill (DSV4_LINEAR_GEMM_SPLIT=1 / 0, else the default: off until its
 * end-to-end GPU checks have run). The functions below work either way (the kernel tests call them directly). */
int dsv4_cuda_linear_gemm_split_enabled(void);
int dsv4_cuda_linear_gemm_split_fits(const dsv4_cuda_weight *w, int T);
int dsv4_cuda_linear_gemm_split(const dsv4_cuda_weight *w, const float *x, int64_t ldx, int T, float *y, int64_t ldy,
                                void *ws, size_t ws_bytes, void *stream);
/* the split's bf16 terms four values a thread (lg_split4: the same bits): 1 on, 0 off, -1 the default
 * (DSV4_LINEAR_SPLIT4, 1 unless set to 0 since session 30) */
void dsv4_cuda_linear_gemm_split4(int on);
/* 1 when the last dsv4_cuda_linear_gemm_split call that ran took the f16 form (tests) */
int dsv4_cuda_linear_gemm_split_last_f16(void);
/* 1 when the last dsv4_cuda_linear_gemm_split call made its terms with lg_split4 (tests) */
int dsv4_cuda_linear_gemm_split_last_s4(void);

/* The split path's GEMMs on terms its producer wrote (wo_a after dsv4_cuda_attn_kv8_wg_terms, which saves the split's
 * read of fp32 x and its write of the planes): terms[j * ps + t * ldt + k] (bf16, j < nt) are the terms of x[t][k] as
 * dsv4_cuda_linear_gemm_split makes them; y = W t0 (+= W t1 (+= W t2)) as there. ldt and ps multiples of 8, terms
 * 16-byte aligned. dsv4_cuda_linear_gemm_terms_nt: the terms the split takes for w (1 act_bf16, else
 * DSV4_LINEAR_GEMM_FP8_TERMS / _BF16_TERMS), 0 where it takes another form (the f16 one); _ready: 1 when cuBLASLt has a
 * plan for the call (ask before the producer writes terms: x's fp32 form is gone then); the call returns 0, 1 not
 * applicable (nothing enqueued), -1 error. Workspace: the split's for the same K and rows (it uses less). */
int dsv4_cuda_linear_gemm_terms_nt(const dsv4_cuda_weight *w);
/* FP8 weights, two terms side by side (ps == K): one GEMM with K 2K on the weight twice ([W | W]) instead of two (another
 * fp32 summation order): 1 on, 0 off, -1 the default (DSV4_LINEAR_TERMS_CAT, 0 unless set: no faster on an H200, NOTES "Session 30"); where the
 * workspace or cuBLASLt cannot, the two GEMMs run. _last_cat: 1 when the last dsv4_cuda_linear_gemm_terms call took it. */
void dsv4_cuda_linear_gemm_terms_cat(int on);
int dsv4_cuda_linear_gemm_terms_last_cat(void);
int dsv4_cuda_linear_gemm_terms_ready(const dsv4_cuda_weight *w, const void *terms, int64_t ldt, int64_t ps, int nt, int T, float *y,
                                      int64_t ldy);
int dsv4_cuda_linear_gemm_terms(const dsv4_cuda_weight *w, const void *terms, int64_t ldt, int64_t ps, int nt, int T, float *y,
                                int64_t ldy, void *ws, size_t ws_bytes, void *stream);

/* wo_a on one f16 term (dsv4_cuda_attn_kv8_wg_terms with f16s: t = f16(o x 2^-s) at terms[t * ldt + k], ldt a multiple
 * of 8, 16-byte aligned): y = 2^(s + shift) (W' t), W' the FP8 weight's values x 2^-shift as f16 (exact: w->f16_ok), one
 * cuBLASLt f16 GEMM accumulating in fp32 with alpha and beta read from device memory (ab = {2^(s + shift), 0}). About
 * 11 bits of o, against the two bf16 terms' ~16 and the official model's bf16 o (8), at one term's cost. _ready: 1 when
 * it takes w and cuBLASLt has a plan (ask before the producer writes). Returns 0, 1 not applicable (nothing enqueued),
 * -1 error. Workspace: the split's for the same K and rows. */
int dsv4_cuda_linear_gemm_terms_f16_ready(const dsv4_cuda_weight *w, const void *terms, int64_t ldt, int T, float *y, int64_t ldy);
int dsv4_cuda_linear_gemm_terms_f16(const dsv4_cuda_weight *w, const void *terms, int64_t ldt, int T, float *y, int64_t ldy,
                                    const float *ab, void *ws, size_t ws_bytes, void *stream);
/* The scales of that form for a layer (host): out = {2^-s, 2^(s + f16_shift), 0} with the smallest s that keeps every
 * attention output below 2^15 after x 2^-s: |o| <= max |v| over the attended rows (the softmax weights and the sink sum
 * to at most 1), and the rows are RMS-normed over Dh by the k norm weights (kv_norm, the compressor's norm: spec 5-6),
 * so |v| <= sqrt(Dh) x the largest |weight| (rope pairs are rotations; x 1.0625 for the FP8 cache's rounding).
 * 0 done; 1 when the weights are zero or not finite or the scales leave fp32 (the caller keeps the bf16 terms). */
int dsv4_cuda_wo_a_f16_scale(const float *const *norms, const int *n, int k, int Dh, int f16_shift, float out[3]);

#ifdef __cplusplus
}
#endif
#endif
