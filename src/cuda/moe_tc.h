/* moe_tc.h - the routed experts' grouped GEMM on tensor cores (moe_tc.cu), called by dsv4_cuda_moe_experts
 * (moe_group.cu) for the matrices it takes; the CUDA-core kernel of moe_group.cu does the others. */
#ifndef DSV4_CUDA_MOE_TC_H
#define DSV4_CUDA_MOE_TC_H

#include <cuda_runtime.h>

#include "cuda_model.h"

/* 1 when one expert matrix can go through the tensor-core kernel: FP8 with E8M0 block scales, MXFP4 or NVFP4,
 * columns a multiple of 128, 16-byte aligned rows (scale rows: MXFP4 4-byte, NVFP4 8-byte aligned), not BF16 activations
 * (act_bf16 without act_quant: left to the CUDA-core kernel, which rounds x / h to bf16). */
int dsv4_moe_tc_fits(const dsv4_cuda_weight *w);

/* One grouped launch (plus, on the pre-quantized path, the act-quant pass before it): gateup 1: h [slots, R] =
 * SwiGLU(x[rows] . WA^T, x[rows] . WB^T) * rw, x [T, C] (y [T*K, D] is the scratch of the pre-quantized codes);
 * gateup 0: y [slots, R] = h . WA^T, x = h [slots, C] (quantized in place on the pre-quantized path). E experts,
 * maxslots = min(E, T*K) expert slots in the grid. aq: the weights' act_quant. 0, or -1 on a launch error. */
/* Once, before the first launch (dsv4_cuda_experts_init): checks on the device that the integer MXFP4 decode equals
 * the e4m3-convert one bit for bit; the kernels use it only then. 0, or -1 when the test could not run. */
int dsv4_moe_tc_selftest(void);
/* Once (dsv4_cuda_experts_init, MXFP4 experts): whether every row of every expert's w1, w3 and w2 can go through
 * moe_f8p.cuh exactly (groups more than 14 binades below the row's largest scale hold zeros only; the largest at least
 * 2^-120, no NaN scale). 1 yes, 0 no, -1 on an error. Synchronizes the device. */
int dsv4_moe_pf8_check(const dsv4_cuda_experts *ex);

/* For comparisons (dsv4_cuda_moe_experts_path): bits of what to change (results are bitwise the same; ALU and PF
 * run on the register-buffer kernel, as LEGACY) */
#define DSV4_MOE_TC_ALU 2    /* the integer MXFP4 decode instead of the e4m3 convert (measured 1-3 % slower) */
#define DSV4_MOE_TC_PF 4     /* L2 prefetch of weights two units ahead of the register loads (measured 10-25 % slower) */
#define DSV4_MOE_TC_NO_PDL 8 /* no programmatic dependent launch (measured 3 us slower at batch 1) */
#define DSV4_MOE_TC_LEGACY 16 /* decode with the weights of two units in registers and 8-warp blocks (before the ring);
                               * MXFP4 prefill on that register kernel (before moe_pf2_kernel) */
#define DSV4_MOE_TC_PF2 32   /* FP4 prefill on moe_pf2_kernel's mma.sync (before its wgmma version) */
#define DSV4_MOE_TC_F8 64    /* MXFP4 with act quant on wgmma e4m3 (moe_f8.cuh), the default unless DSV4_MOE_F8=0 (the modes
                              * above turn it off): NOT the f16 kernels' bits (FP8 tensor-core sums) */
void dsv4_moe_tc_mode(int mode);
/* TFLOP/s of mma.sync m16n8k16 (f16 in, f32 accumulate) alone: na (8 or 16) independent accumulators a warp, 8-warp
 * blocks, blocks_per_sm of them an SM (a ceiling for these kernels); -1 on an error. */
#ifdef __cplusplus
extern "C"
#endif
double dsv4_moe_tc_mma_rate(int na, int blocks_per_sm);

/* one of the two launches (gate / up with the SwiGLU, then down) of the grouped experts on tensor cores: -1 on an error,
 * else 1 when gate / up ran on the FP8 kernel (moe_f8.cuh), whose grid lets the next one start only at its end; pass
 * that as pre to the down projection's call (its first weight copies then go before its grid wait) */
int dsv4_moe_tc_run(int gateup, int fmt, int aq, const dsv4_cuda_weight *WA, const dsv4_cuda_weight *WB, int R, int C, int E,
                    const float *x, int T, int K, int maxslots, const dsv4_cuda_moe_plan *p, float lim, float *out,
                    float *scratch, int pre, cudaStream_t st);

/* The routed experts of a prefill pass on BF16 tensor cores (moe_bf16.cuh: exact products, fp32 sums over all the
 * columns; not the decode kernels' bits, so never for a decode step): MXFP4 experts with the FP8 act quant, D and I
 * multiples of 256, and on average DSV4_MOE_PFB_AVG (default 32) or more tokens an expert (the x image lives in y, h's
 * in h). 1 when it ran (h and y as dsv4_cuda_moe_experts leaves them for the combine: y [slots, D]), 0 when the pass
 * does not qualify (DSV4_MOE_PFB=0: never), -1 on a launch error. */
int dsv4_moe_pfb_run(const dsv4_cuda_experts *ex, const float *x, int T, int K, int maxslots, const dsv4_cuda_moe_plan *p, float lim,
                     float *h, float *y, cudaStream_t st);

#endif
