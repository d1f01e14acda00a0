/* common.cuh - what the CUDA translation units share (C++, included only by the .cu files of src/cuda): the
 * backend's error slot and cached device properties, launch checks, warp reductions, and the
 * in-register decoders of the weight formats (spec 14), which equal src/quant/formats.c bit for bit. */
#ifndef DSV4_CUDA_COMMON_CUH
#define DSV4_CUDA_COMMON_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#include "cuda_backend.h"

/* ---- errors and device properties (backend.cu) ---- */

/* Records a printf-style message for dsv4_cuda_last_error(); returns -1. */
int dsv4_cuda_fail(const char *fmt, ...);
/* -1 with the op's name when the last launch failed, else 0. */
int dsv4_cuda_check_launch(const char *op);

struct dsv4_cuda_props {
    int sm_count;
    int smem_optin;
};
extern dsv4_cuda_props dsv4_cuda_dev;

#define DSV4_STREAM(s) ((cudaStream_t)(s))

/* an integer tuning switch from the environment (the callers read each once): dflt when unset or empty */
static inline int dsv4_env_int(const char *name, int dflt) {
    const char *e = getenv(name);
    return e && *e ? atoi(e) : dflt;
}

/* ---- programmatic dependent launch of the small kernels ----
 * The GEMV, mHC pre and the experts' kernels set it up themselves (they load what does not depend on the previous
 * kernel before their wait). The other kernels of the decode chain are launched through dev_launch: with the
 * programmatic-stream-serialization attribute (DSV4_CUDA_PDL_SMALL=0: plain launches), so that the next kernel's
 * launch overlaps this one's tail; each begins with dev_pdl_enter: it waits for the previous grid (all of it,
 * memory included) before touching any memory, then lets its own dependents launch. The same values either way. */
/* wait for the previous grid (complete, its memory visible); let the next kernel of the stream start launching */
__device__ __forceinline__ void dev_pdl_wait() { asm volatile("griddepcontrol.wait;" ::: "memory"); }
__device__ __forceinline__ void dev_pdl_trigger() { asm volatile("griddepcontrol.launch_dependents;" ::: "memory"); }
__device__ __forceinline__ void dev_pdl_enter() {
    dev_pdl_wait();
    dev_pdl_trigger();
}
/* 1 when the small kernels are launched with the attribute (backend.cu; DSV4_CUDA_PDL_SMALL, default on; a launch
 * refused with it turns it off for the process) */
int dsv4_cuda_pdl_small(void);
void dsv4_cuda_pdl_small_refused(void);
template <typename... KA, typename... A>
inline cudaError_t dev_launch(void (*kern)(KA...), dim3 grid, dim3 block, size_t smem, cudaStream_t st, A &&...args) {
    cudaLaunchAttribute at[1];
    at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    at[0].val.programmaticStreamSerializationAllowed = 1;
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid, cfg.blockDim = block, cfg.dynamicSmemBytes = smem, cfg.stream = st;
    cfg.attrs = at, cfg.numAttrs = dsv4_cuda_pdl_small() ? 1 : 0;
    cudaError_t e = cudaLaunchKernelEx(&cfg, kern, args...);
    if (e != cudaSuccess && cfg.numAttrs) { /* no programmatic dependent launch here: plain stream order */
        (void)cudaGetLastError();
        dsv4_cuda_pdl_small_refused();
        cfg.numAttrs = 0;
        e = cudaLaunchKernelEx(&cfg, kern, args...);
    }
    return e;
}

/* ---- reductions ---- */

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
__device__ __forceinline__ double warp_sum_d(double v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

/* ---- RMSNorm's sum of squares (rmsnorm_kernel of norm_rope_quant.cu and the fused norm of mhc.cu, bitwise the same):
 * RMS_NT threads; thread j adds, in double, the squares of the quads (4 consecutive values) j, j + RMS_NT, .. in
 * order, the 4 values of a quad in order; warp_sum_d per warp, then the warps' sums by rms_sum8. ---- */

#define RMS_NT 256
__device__ __forceinline__ double rms_sum8(const double *p) {
    return ((p[0] + p[1]) + (p[2] + p[3])) + ((p[4] + p[5]) + (p[6] + p[7]));
}
__device__ __forceinline__ double rms_sq4(double ss, float4 v) {
    ss += (double)v.x * v.x;
    ss += (double)v.y * v.y;
    ss += (double)v.z * v.z;
    ss += (double)v.w * v.w;
    return ss;
}

/* ---- asynchronous copies global -> shared (cp.async, L2 only) ---- */

__device__ __forceinline__ void dev_cp16(void *sdst, const void *gsrc) {
    const unsigned sa = (unsigned)__cvta_generic_to_shared(sdst);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(sa), "l"(gsrc) : "memory");
}
__device__ __forceinline__ void dev_cp_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
/* waits until at most N of this thread's committed groups are still in flight */
template <int N> __device__ __forceinline__ void dev_cp_wait() { asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory"); }

/* ---- scalar formats (twins of src/quant/formats.c) ---- */

__device__ __forceinline__ float dev_bf16(uint16_t h) { return __uint_as_float((uint32_t)h << 16); }
__device__ __forceinline__ float dev_f16(uint16_t h) { return __half2float(__ushort_as_half(h)); }
/* x rounded to bf16 (round to nearest even: dsv4_f32_to_bf16, torch's .to(torch.bfloat16)), as a float */
__device__ __forceinline__ float dev_round_bf16(float x) { return __bfloat162float(__float2bfloat16_rn(x)); }
__device__ __forceinline__ float dev_e8m0(uint8_t b) {
    if (b == 0xff) return __int_as_float(0x7fc00000);
    if (b == 0) return __uint_as_float(0x00400000u);
    return __uint_as_float((uint32_t)b << 23);
}
/* e4m3fn through the hardware converter (sm_89+); every e4m3 value is exact in half. */
__device__ __forceinline__ float dev_e4m3(uint8_t b) {
    __half_raw h = __nv_cvt_fp8_to_halfraw((__nv_fp8_storage_t)b, __NV_E4M3);
    return __half2float(__half(h));
}
__device__ __forceinline__ float2 dev_e4m3x2(uint16_t b2) {
    __half2_raw h = __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)b2, __NV_E4M3);
    return __half22float2(__half2(h));
}
/* e2m1: twice the magnitudes 0,1,2,3,4,6,8,12 fit a nibble each, so one shift of a constant word
 * decodes a code; the factor 1/2 is folded into the caller's scale. */
__device__ __forceinline__ float dev_e2m1_x2(uint32_t code) {
    float v = (float)((0xC8643210u >> ((code & 7) * 4)) & 15);
    return (code & 8) ? -v : v;
}

/* 2^ceil(log2(y)) from the bits, as pow2_ceil() of formats.c. */
__device__ __forceinline__ float dev_pow2_ceil(float y) {
    uint32_t u = __float_as_uint(y);
    int e = (int)((u >> 23) & 0xff) - 127 + ((u & 0x7fffffu) != 0);
    return ldexpf(1.0f, e);
}
__device__ __forceinline__ float dev_round_e4m3(float x) {
    float a = fabsf(x);
    if (a == 0 || isnan(x)) return x;
    int e;
    frexpf(a, &e);
    int ex = e - 1;
    if (ex < -6) ex = -6;
    float step = ldexpf(1.0f, ex - 3);
    return copysignf(rintf(__fdiv_rn(a, step)) * step, x);
}
__device__ __forceinline__ float dev_round_e2m1(float x) {
    float a = fabsf(x), step = a < 2 ? 0.5f : a < 4 ? 1.0f : 2.0f;
    return copysignf(rintf(__fdiv_rn(a, step)) * step, x);
}

/* SwiGLU with clamps of one value (spec 11 step 4): silu(min(g, lim)) * clamp(u, -lim, lim) * w, lim 0 = no
 * clamp; rounded step by step like the twin swiglu() of src/model/forward_moe.c. */
__device__ __forceinline__ float dev_swiglu(float g, float u, float lim, float w) {
    if (lim > 0) {
        g = fminf(g, lim);
        u = fminf(fmaxf(u, -lim), lim);
    }
    return __fmul_rn(__fmul_rn(__fdiv_rn(g, 1.0f + expf(-g)), u), w);
}

/* ---- one weight element (generic paths) ---- */

/* Decodes element (r, c) of the view (r relative to the view, like dsv4_weight_row). */
__device__ __forceinline__ float dev_weight_at(const dsv4_cuda_weight &w, int r, int c) {
    int64_t R = (int64_t)w.row0 + r, C = w.cols;
    switch (w.fmt) {
    case DSV4_WF_F32: return ((const float *)w.data)[R * C + c];
    case DSV4_WF_BF16: return dev_bf16(((const uint16_t *)w.data)[R * C + c]);
    case DSV4_WF_F16: return dev_f16(((const uint16_t *)w.data)[R * C + c]);
    case DSV4_WF_FP8: {
        int64_t si = (R / 128) * w.scale_stride + c / 128;
        float s = w.scale_f32 ? ((const float *)w.scale)[si] : dev_e8m0(w.scale[si]);
        return dev_e4m3(w.data[R * C + c]) * s;
    }
    case DSV4_WF_MXFP4:
    case DSV4_WF_NVFP4: {
        uint8_t b = w.data[R * (C / 2) + c / 2];
        uint32_t code = (c & 1) ? (b >> 4) : (b & 15);
        const uint8_t *sr = w.scale + R * w.scale_stride;
        float s = w.fmt == DSV4_WF_MXFP4 ? dev_e8m0(sr[c / 32]) : dev_e4m3(sr[c / 16]) * w.scale2;
        return dev_e2m1_x2(code) * 0.5f * s;
    }
    default: return 0.0f;
    }
}

#endif
