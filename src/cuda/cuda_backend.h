/* cuda_backend.h - the CUDA backend's C interface (Hopper, sm_90a): device, buffers, stream, and one
 * function per fused DeepSeek-V4 op, named for what it computes.
 *
 * Owns: the boundary between C host code and the CUDA kernels in the .cu files of src/cuda (which define these
 * functions extern "C"). Plain C: no CUDA or C++ types leak out; a stream is a cudaStream_t passed
 * as void * (NULL = the legacy default stream). Every pointer argument of an op is a DEVICE pointer
 * unless its comment says host. Ops only enqueue work: they neither allocate nor synchronize, so a
 * sequence of them can be captured into a CUDA graph. They return 0, or -1 when an argument is out
 * of range or a launch failed; dsv4_cuda_last_error() then says why (per thread).
 *
 * Each op computes what its CPU twin in src/cpu/ops.c or src/quant/formats.c computes (named in
 * its comment), in fp32 with fp32 accumulation; the rounding simulations (FP8/FP4 act quant,
 * Hadamard) are bit-exact given the same input. tests/gpu/test_kernels.c checks every op against
 * its twin. */
#ifndef DSV4_CUDA_BACKEND_H
#define DSV4_CUDA_BACKEND_H

#include <stddef.h>
#include <stdint.h>

#include "../quant/weight.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- device, errors, buffers, streams ---- */

typedef struct dsv4_cuda_info {
    char name[256];
    int cc_major, cc_minor;
    int sm_count;
    size_t mem_total, mem_free;
    int l2_bytes;
    int smem_optin;   /* max dynamic shared memory per block after opt-in */
} dsv4_cuda_info;

/* Selects device `dev` and fills info (may be NULL). 0, or -1 with a message in err. */
int dsv4_cuda_init(int dev, dsv4_cuda_info *info, char *err, size_t errcap);
const char *dsv4_cuda_last_error(void);

void *dsv4_cuda_alloc(size_t bytes);   /* NULL on failure (message in dsv4_cuda_last_error) */
int dsv4_cuda_mem_info(size_t *free_bytes, size_t *total_bytes); /* the current device's memory; -1 on failure */
void dsv4_cuda_free(void *p);
/* Synchronous copies (host memory need not be pinned). */
int dsv4_cuda_upload(void *dst, const void *src, size_t bytes);
int dsv4_cuda_download(void *dst, const void *src, size_t bytes);
int dsv4_cuda_memset(void *dst, int byte, size_t bytes, void *stream);

void *dsv4_cuda_stream_new(void);      /* NULL on failure (a non-blocking stream: no implicit order with the legacy one) */
void dsv4_cuda_stream_free(void *stream);
int dsv4_cuda_stream_sync(void *stream);

/* Pinned (page-locked) host memory, for copies that must really run asynchronously. */
void *dsv4_cuda_host_alloc(size_t bytes);  /* NULL on failure */
void dsv4_cuda_host_free(void *p);
/* Copies ordered on `stream` (host memory pinned, or the copy waits for itself). */
int dsv4_cuda_upload_async(void *dst, const void *src, size_t bytes, void *stream);
int dsv4_cuda_download_async(void *dst, const void *src, size_t bytes, void *stream);

/* ---- CUDA graphs and events ---- */

/* Starts recording what is enqueued on `stream` (relaxed capture mode, so that ops may still set kernel
 * attributes and query occupancy); capture_end stops it and instantiates the recording: *exec is an
 * executable graph. On any error capture_end ends the capture, frees what it made and returns -1. */
int dsv4_cuda_capture_begin(void *stream);
int dsv4_cuda_capture_end(void *stream, void **exec);
int dsv4_cuda_graph_launch(void *exec, void *stream);
void dsv4_cuda_graph_free(void *exec);
void *dsv4_cuda_event_new(void); /* NULL on failure */
void dsv4_cuda_event_free(void *ev);
int dsv4_cuda_event_record(void *ev, void *stream);
/* What is enqueued on `stream` after this waits for the work recorded in `ev` (on another stream): a fork or a join,
 * also inside a capture (the other stream's work joins the graph as a parallel branch). */
int dsv4_cuda_stream_wait(void *stream, void *ev);
/* Opens / closes the range an external profiler records (Nsight Compute's --profile-from-start off):
 * bench/ncu_profile.sh profiles exactly the runs of `dsv4 bench --profile`. */
void dsv4_cuda_profiler_range(int on);
/* Milliseconds between two recorded events (waits for the second); negative on error. */
double dsv4_cuda_event_ms(void *e0, void *e1);

/* ---- weights ---- */

/* A linear layer's weight on the device: the fields of dsv4_weight with data / scale pointing to
 * device memory. A view (row0, rows) of a fused tensor is expressed by row0, as on the CPU.
 * act_bf16 (GPU only, no dsv4_weight field): the linear takes BF16 activations: each x value is rounded to
 * bf16 (round to nearest even, torch's .to(torch.bfloat16)) before the product. Set by gpu_model.c on every
 * linear of a model without the FP8 recipe (BF16 / F16 / NVFP4-only checkpoints: no act quant), whose
 * official runs feed bf16 rows to every linear; ignored when act_quant is set (the FP8 act quant takes the
 * fp32 row). dsv4_cuda_weight_upload sets it 0. */
typedef struct dsv4_cuda_weight {
    dsv4_wfmt fmt;
    int rows, cols, row0;
    const uint8_t *data, *scale;  /* device; stored row 0 */
    int scale_f32;
    int64_t scale_stride;
    float scale2;
    int act_quant;
    int act_bf16;
    /* FP8 with E8M0 block scales: f16_ok when every value code x 2^(k - f16_shift) of the view (k: its block's scale
     * exponent) is exact in f16, which lets the prefill split GEMM run on f16 (linear_gemm.h); set by
     * dsv4_cuda_weight_f16_fit (dsv4_cuda_weight_upload and the model's upload call it). 0: the bf16 route. */
    int f16_ok, f16_shift;
} dsv4_cuda_weight;

/* Sets d->f16_ok / f16_shift from the host weight w (d's view of it): FP8 with E8M0 scales whose view's block exponents
 * span at most 22 binades (e4m3 codes 2^-9 .. 448 times 2^(k - shift) within f16's 2^-24 .. 65504). */
void dsv4_cuda_weight_f16_fit(const dsv4_weight *w, dsv4_cuda_weight *d);

/* Copies the stored rows [0, row0 + rows) of a host weight (and its scales) to new device buffers;
 * dsv4_cuda_weight_free releases them. */
int dsv4_cuda_weight_upload(const dsv4_weight *w, dsv4_cuda_weight *out);
void dsv4_cuda_weight_free(dsv4_cuda_weight *w);

/* ---- ops ---- */

/* y[T, w.rows] (fp32) = x[T, w.cols] . w^T, x fp32 (x_bf16 = 0) or bf16 (x_bf16 = 1, uint16 bits).
 * With w->act_quant each x row is first rounded by the FP8 act_quant simulation (block 128); else with
 * w->act_bf16 each x value is rounded to bf16. Twin: dsv4_cpu_linear (on x rounded to bf16 for act_bf16).
 * A tensor-core GEMV (linear.cu, mma.sync m16n8k16: a warp per 16 weight rows, the tokens as the mma
 * columns) reads the weight once per 16 rows of x, dequantized exactly in registers; a row's result is
 * bitwise the same for any T (batch invariant). Odd sizes take an element-wise path. */
int dsv4_cuda_linear(const dsv4_cuda_weight *w, const void *x, int x_bf16, int T, float *y, void *stream);
/* A prototype (linear_q8.cu; tests, A/B): 1 routes dsv4_cuda_linear's FP8 act-quant weights at 1-8 rows of fp32 x (64-row
 * multiples, 128-column multiples) to a GEMV on FP8 tensor cores (wgmma e4m3): other bits than the GEMV's (FP8 sums), and
 * not batch invariant against the multi-token GEMM. 0 off; -1 DSV4_LINEAR_Q8 from the environment (default off). */
void dsv4_cuda_linear_q8(int on);

/* One linear of dsv4_cuda_linear_multi: y[T, w.rows] = x[T, w.cols] . w^T with x rows ldx values apart and y rows
 * ldy values apart (0: w.cols / w.rows, contiguous), e.g. a slice of a wider activation (the groups of wo_a). */
typedef struct dsv4_cuda_linear_job {
    dsv4_cuda_weight w;
    const void *x;
    int64_t ldx;
    float *y;
    int64_t ldy;
} dsv4_cuda_linear_job;

/* n linears of T rows (x fp32, or bf16 with x_bf16 for all), fewer launches: the jobs the tensor-core GEMV takes with
 * the same format, columns, act quant / bf16 rounding, FP8 scale kind and column slicing (the rows' summation order)
 * share one launch (up to 16 jobs, per 16 rows of x); any others run one by one. Each job's y rows are bitwise what
 * dsv4_cuda_linear(&w, x, x_bf16, T, y) gives on contiguous rows, whatever the other jobs are. The launch shapes
 * depend only on the job list and T (CUDA-graph capture). No job's y may overlap another job's x or y. */
int dsv4_cuda_linear_multi(const dsv4_cuda_linear_job *jobs, int n, int x_bf16, int T, void *stream);

/* The same two with a device workspace (256-byte aligned) for x staged once per call: from 24 rows of x the jobs of a
 * launch then go through a multi-token GEMM that reads each weight once per 64 rows (the GEMV: once per 8-16), every
 * y row still bitwise what the GEMV gives it (from DSV4_CUDA_LINEAR_WS_MIN_T rows; a workspace too small, or NULL,
 * just keeps the GEMV). Bytes for T rows
 * and n jobs of `cols` input columns in all (the sum over the jobs): dsv4_cuda_linear_ws_bytes(T, cols, n); it stops
 * growing at 256 rows (more rows go in passes of 256). */
#define DSV4_CUDA_LINEAR_WS_MIN_T 64
/* The largest decode step (batch bucket) of the model layer (cuda_model.h): kernels whose summation order could
 * depend on the row count keep one order up to this many rows, so that decode steps are batch invariant. */
#define DSV4_CUDA_DECODE_MAX 1024
size_t dsv4_cuda_linear_ws_bytes(int T, int64_t cols, int njobs);
int dsv4_cuda_linear_ws(const dsv4_cuda_weight *w, const void *x, int x_bf16, int T, float *y, void *ws, size_t ws_bytes,
                        void *stream);
int dsv4_cuda_linear_multi_ws(const dsv4_cuda_linear_job *jobs, int n, int x_bf16, int T, void *ws, size_t ws_bytes,
                              void *stream);

/* In place, for each of `rows` rows of n values (row stride ld): x = w * x / sqrt(mean(x^2) + eps);
 * w [n] or NULL (unweighted; per-head norms are rows = T*H, n = ld = head dim).
 * Twin: dsv4_cpu_rmsnorm. */
int dsv4_cuda_rmsnorm(float *x, int rows, int n, int64_t ld, const float *w, float eps, void *stream);

/* Interleaved RoPE on the last 2*npairs values of each head vector: x [T, H, n] (contiguous),
 * pos [T] (device ints), freq [npairs]; inverse = rotate by -angle. Twin: dsv4_cpu_rope. */
int dsv4_cuda_rope(float *x, int T, int H, int n, int npairs, const float *freq, const int *pos, int inverse,
                   void *stream);

/* dsv4_cuda_rmsnorm(x, T * H, n, n, w, eps), dsv4_cuda_rope(x, T, H, n, npairs, freq, pos, 0) and, with qb > 0,
 * dsv4_cuda_act_quant_fp8(x, T * H, qn, n, qb) in one launch, the same bits (rows contiguous; n a multiple of 4 up to
 * 4096 fused, else the three kernels). The decode step's kv row, query heads and compressor entries. */
int dsv4_cuda_norm_rope_q8(float *x, int T, int H, int n, const float *w, float eps, int npairs, const float *freq,
                           const int *pos, int qn, int qb, void *stream);
/* dsv4_cuda_norm_rope_q8(x, T, H, n, w, eps, npairs, freq, pos, 0, 0) with each row written as f16 (round to nearest
 * even) into the first half of its own bytes (row r's value d at ((const __half *)x)[2 n r + d]): the prefill
 * attention's q (dsv4_cuda_attn_kv8_wg_terms with qh), half the bytes both ways. Needs dsv4_cuda_norm_rope_h16_fits
 * (the fused kernels: n a multiple of 8 up to 4096, x and w 16-byte aligned). */
int dsv4_cuda_norm_rope_h16(float *x, int T, int H, int n, const float *w, float eps, int npairs, const float *freq,
                            const int *pos, void *stream);
int dsv4_cuda_norm_rope_h16_fits(const float *x, int n, const float *w);
/* whether the forward takes it for the terms form's q (where that form runs; DSV4_CUDA_Q16=0: fp32 q; read once) */
int dsv4_cuda_norm_rope_h16_enabled(void);
/* Tests: how the fused row kernels lay rows on blocks (the same bits either way): 1 two rows a block wherever a row
 * has at most 128 quads, 0 one a block, -1 the default (two for passes of >= 4096 rows: prefill 8K 0.985x; one below,
 * where it measured 1.005x at batch 1; DSV4_ROW_PREP2=0 / 1 overrides). */
void dsv4_cuda_row_prep2(int mode);
/* Tests: the f16 form (dsv4_cuda_norm_rope_h16) where two rows a block would run: 1 a warp a row, 0 the two-row kernel,
 * -1 the default (a warp a row; DSV4_ROW_H16_WARP=0: the two-row kernel). The same bits either way. */
void dsv4_cuda_row_h16_warp(int mode);
/* [dsv4_cuda_rmsnorm(x, T * H, n, n, w, eps) when norm], dsv4_cuda_rope(x, T, H, n, npairs, freq, pos, 0),
 * dsv4_cuda_hadamard(x, T * H, n, n) and dsv4_cuda_act_quant_fp4(x, T * H, n, n, 32) in one launch, the same bits
 * (n a power of two up to 4096; rows contiguous). The indexer's queries and compressor entries. */
int dsv4_cuda_rope_hq4(float *x, int T, int H, int n, int norm, const float *w, float eps, int npairs, const float *freq,
                       const int *pos, void *stream);

/* In place, for each of `rows` rows (stride ld), on its first n values: the FP8 act_quant
 * simulation with blocks of `block` (64 or 128; any block <= 1024 works). Twin: dsv4_act_quant_fp8. */
int dsv4_cuda_act_quant_fp8(float *x, int rows, int n, int64_t ld, int block, void *stream);
/* Same for the FP4 (e2m1) act quant, blocks of `block` (32). Twin: dsv4_act_quant_fp4. */
int dsv4_cuda_act_quant_fp4(float *x, int rows, int n, int64_t ld, int block, void *stream);
/* In place (x . H_n) / sqrt(n) on the first n values of each row; n a power of two <= 4096,
 * summed in double like the twin (bit-exact). Twin: dsv4_hadamard. */
int dsv4_cuda_hadamard(float *x, int rows, int n, int64_t ld, void *stream);

/* mHC pre (spec 4) for T tokens: X [T, M, D]; fn: weight [(2+M)*M, M*D]; scale [3], base [(2+M)*M]
 * (device). Out: x [T, D], post [T, M], comb [T, M, M]. Twin: dsv4_cpu_hc_pre. M <= 16.
 * norm_w [D] or NULL: with it, x = RMSNorm_w(x) (eps norm_eps) follows in the same call, bitwise the same as
 * dsv4_cuda_rmsnorm(x, T, D, D, norm_w, norm_eps) after. scratch: dsv4_cuda_hc_scratch_bytes(T, M, D) bytes of
 * device memory (16-byte aligned). A token's results do not depend on T. */
size_t dsv4_cuda_hc_scratch_bytes(int T, int M, int D);
/* Test hooks of hc_pre / hc_head (0 in normal use): 1 the reference Sinkhorn and pre weights (dsv4_hc_post_comb,
 * dsv4_hc_pre_weights on one thread; same bits), 2 no programmatic dependent launch, 4 skip the finishing kernel,
 * 8 skip the mixing kernel (4 and 8 for timings only); 16 * v (v 1 .. 4) mixes few tokens (T < 32, F32 fn) 1, 2, 4 or
 * 8 tokens per block instead of the default (same bits). */
extern int dsv4_cuda_hc_test_flags;
/* hc_post_pre with many tokens: 1 the post inside the mixing kernel (hc_post_mix_big: X read once less, the same bits),
 * 0 the post then the mixing kernel, -1 the default (DSV4_HC_POST_MIX_BIG, 1 unless set to 0 since session 30) */
void dsv4_cuda_hc_post_mix_big(int on);
/* 1 when the last dsv4_cuda_hc_post_pre call took hc_post_mix_big (tests) */
int dsv4_cuda_hc_post_mix_big_last(void);
int dsv4_cuda_hc_pre(const float *X, int T, int M, int D, const dsv4_cuda_weight *fn, const float *scale,
                     const float *base, int iters, float norm_eps, float hc_eps, const float *norm_w, float *x,
                     float *post, float *comb, void *scratch, void *stream);
/* mHC post, in place: X[t] (k, d) = post[t,k] * f[t,d] + sum_j comb[t,j,k] * X[t](j, d).
 * f [T, D]. Twin: dsv4_cpu_hc_post. */
int dsv4_cuda_hc_post(const float *f, float *X, int T, int M, int D, const float *post, const float *comb,
                      void *stream);
/* The same post from Xin into X (Xin == X: in place) */
int dsv4_cuda_hc_post_to(const float *f, const float *Xin, float *X, int T, int M, int D, const float *post,
                         const float *comb, void *stream);
/* The input of a post (dsv4_cuda_hc_post_pre): f [T, D]; or, with ys, the routed experts' rows ys combined by the
 * token slots tslot [T, K] and the shared expert's rows (shared [T, D] or NULL) exactly as dsv4_cuda_moe_combine
 * does, inside the post's kernel (f: where the combine goes when the call cannot fuse them). */
typedef struct dsv4_cuda_hc_f {
    const float *f;
    const float *ys;
    const int *tslot;
    int K;
    const float *shared;
} dsv4_cuda_hc_f;
/* dsv4_cuda_hc_post_to(f, Xin, X, T, M, D, post, comb) then dsv4_cuda_hc_pre(X, T, M, D, fn, ...): the same X and
 * outputs bit for bit; post and comb are read (the previous sub-block's), then overwritten with this one's. Few
 * tokens out of place (Xin != X; T < 32, F32 fn, D % 256 == 0): the post runs inside the mixing kernel (one launch
 * less). mix [T, (2+M)*M] or NULL: with it, post and comb are left to dsv4_cuda_hc_comb (the Sinkhorn off the call's
 * critical path) and the call stores the mixes there instead. */
int dsv4_cuda_hc_post_pre(const dsv4_cuda_hc_f *f, const float *Xin, float *X, int T, int M, int D, const dsv4_cuda_weight *fn,
                          const float *scale, const float *base, int iters, float norm_eps, float hc_eps, const float *norm_w,
                          float *x, float *post, float *comb, float *mix, void *scratch, void *stream);
/* post [T, M] and comb [T, M, M] from the mixes dsv4_cuda_hc_post_pre stored: bitwise what it computes without mix */
int dsv4_cuda_hc_comb(const float *mix, int T, int M, const float *scale, const float *base, int iters, float hc_eps,
                      float *post, float *comb, void *stream);
/* mHC head: y [T, D] from X [T, M, D]; fn [M, M*D], scale [1+], base [M]. Twin: dsv4_cpu_hc_head.
 * norm_w and scratch as for dsv4_cuda_hc_pre. */
int dsv4_cuda_hc_head(const float *X, int T, int M, int D, const dsv4_cuda_weight *fn, const float *scale,
                      const float *base, float norm_eps, float hc_eps, const float *norm_w, float *y, void *scratch,
                      void *stream);

/* Sparse attention with a sink (spec 7.1) for T queries: q [T, H, Dh]; keys = values are rows of
 * kv (row stride kv_ld floats) chosen by idx [T, nidx] (entries < 0 are skipped, so lists of
 * different lengths share one array); sink [H]; out [T, H, Dh]. A query with no valid entry gets
 * zeros. Twin: dsv4_cpu_sparse_attn (keys[i] = kv + idx[t][i] * kv_ld). nidx <= 4096. */
int dsv4_cuda_sparse_attn(const float *q, int T, int H, int Dh, const float *kv, int64_t kv_ld, const int *idx,
                          int nidx, const float *sink, float scale, float *out, void *stream);

/* MoE router (spec 11 steps 1-3) for T tokens: logits [T, E] -> s = sqrt(softplus(logits));
 * selection: top-k of s + bias [E], or, when tid2eid is not NULL, the row tid2eid[tokens[t]] [K];
 * weights = s[sel] / sum(s[sel]) * route_scale. Out: sel [T, K] (int, decreasing biased score;
 * ties to the lower expert id), weight [T, K]. E <= 4096, K <= 32. Twin: the router of
 * src/model/forward_moe.c (top-k picks the same set unless scores tie exactly). */
int dsv4_cuda_router(const float *logits, int T, int E, int K, const float *bias, const int *tid2eid,
                     const int *tokens, float route_scale, int *sel, float *weight, void *stream);

/* SwiGLU with clamps (spec 11 step 4): out[t, i] = silu(min(g, lim)) * clamp(u, -lim, lim) * rw[t];
 * lim 0 = no clamp; rw [T] or NULL (= 1). g, u rows of stride ld; out [T, I] (may alias g when
 * ld == I). Twin: swiglu() of src/model/forward_moe.c. */
int dsv4_cuda_swiglu(const float *g, const float *u, int64_t ld, int T, int I, float lim, const float *rw, float *out,
                     void *stream);

#ifdef __cplusplus
}
#endif
#endif
