/* wvec.cuh - weight rows streamed 16 bytes per lane and decoded in registers, for GEMV-style kernels
 * (C++, included by .cu files of src/cuda): elements per 16-byte chunk of each format, a chunk's scale(s),
 * the chunk's values as float4 groups, the staged-x layout that makes a warp's shared-memory reads of one
 * step consecutive, and the FP8 act-quant simulation of a 128-block held by a warp.
 *
 * The same scheme as the decode GEMV of linear.cu, whose helpers are private to that file (being
 * optimized separately); once they move here, linear.cu can include this header instead. Values are
 * exact: FP4 chunks decode to twice the e2m1 value, the 1/2 is folded into the scale. */
#ifndef DSV4_CUDA_WVEC_CUH
#define DSV4_CUDA_WVEC_CUH

#include "common.cuh"

/* elements per 16 stored bytes */
template <int FMT> struct wv_elems { static constexpr int E = 4; }; /* F32 */
template <> struct wv_elems<DSV4_WF_BF16> { static constexpr int E = 8; };
template <> struct wv_elems<DSV4_WF_F16> { static constexpr int E = 8; };
template <> struct wv_elems<DSV4_WF_FP8> { static constexpr int E = 16; };
template <> struct wv_elems<DSV4_WF_MXFP4> { static constexpr int E = 32; };
template <> struct wv_elems<DSV4_WF_NVFP4> { static constexpr int E = 32; };

static inline int wv_elems_of(int fmt) {
    switch (fmt) {
    case DSV4_WF_F32: return 4;
    case DSV4_WF_BF16:
    case DSV4_WF_F16: return 8;
    case DSV4_WF_FP8: return 16;
    default: return 32;
    }
}

/* 16 bytes that are read once: bypass L1. */
__device__ __forceinline__ uint4 wv_load(const uint4 *p) {
    uint4 v;
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
    return v;
}

/* Values 4g .. 4g+3 of a chunk. */
template <int FMT>
__device__ __forceinline__ float4 wv_group(const uint4 &q, int g) {
    const uint32_t word[4] = {q.x, q.y, q.z, q.w};
    if (FMT == DSV4_WF_F32) {
        return make_float4(__uint_as_float(q.x), __uint_as_float(q.y), __uint_as_float(q.z), __uint_as_float(q.w));
    } else if (FMT == DSV4_WF_BF16 || FMT == DSV4_WF_F16) {
        const uint32_t lo = word[2 * g], hi = word[2 * g + 1];
        if (FMT == DSV4_WF_BF16)
            return make_float4(dev_bf16((uint16_t)lo), dev_bf16((uint16_t)(lo >> 16)), dev_bf16((uint16_t)hi),
                               dev_bf16((uint16_t)(hi >> 16)));
        return make_float4(dev_f16((uint16_t)lo), dev_f16((uint16_t)(lo >> 16)), dev_f16((uint16_t)hi),
                           dev_f16((uint16_t)(hi >> 16)));
    } else if (FMT == DSV4_WF_FP8) {
        const uint32_t w = word[g];
        const float2 a = dev_e4m3x2((uint16_t)w), b = dev_e4m3x2((uint16_t)(w >> 16));
        return make_float4(a.x, a.y, b.x, b.y);
    } else { /* FP4: group g = bytes 2g, 2g+1 (low nibble first) */
        const uint32_t h = word[g >> 1] >> ((g & 1) * 16);
        return make_float4(dev_e2m1_x2(h), dev_e2m1_x2(h >> 4), dev_e2m1_x2(h >> 8), dev_e2m1_x2(h >> 12));
    }
}

/* Scale of chunk ch (values ch*E ..) of stored row R: s0 for every group, except NVFP4 whose groups
 * 4..7 (the second 16 values) take s1. F32 / BF16 / F16: 1. */
template <int FMT>
__device__ __forceinline__ void wv_scale(const dsv4_cuda_weight &w, int64_t R, int ch, float &s0, float &s1) {
    s0 = s1 = 1.0f;
    if (FMT == DSV4_WF_FP8) {
        const int64_t i = (R >> 7) * w.scale_stride + ((int64_t)ch * 16 >> 7);
        s0 = w.scale_f32 ? __ldg((const float *)w.scale + i) : dev_e8m0(__ldg(w.scale + i));
    } else if (FMT == DSV4_WF_MXFP4) {
        s0 = 0.5f * dev_e8m0(__ldg(w.scale + R * w.scale_stride + ch));
    } else if (FMT == DSV4_WF_NVFP4) {
        const float2 f = dev_e4m3x2(__ldg((const uint16_t *)(w.scale + R * w.scale_stride) + ch));
        s0 = 0.5f * (f.x * w.scale2);
        s1 = 0.5f * (f.y * w.scale2);
    }
}

/* Where value j of a staged x row goes (in floats) so that, for chunks of E values, the float4 group g
 * of the chunk a lane handles sits at float4 index ((j / (32 E)) * (E / 4) + g) * 32 + lane: one step of
 * a warp reads 32 consecutive float4. */
template <int E>
__device__ __forceinline__ int wv_stage_pos(int j) {
    const int blk = j / (32 * E), r = j - blk * 32 * E, lane = r / E, e = r - lane * E;
    return ((blk * (E / 4) + (e >> 2)) * 32 + lane) * 4 + (e & 3);
}

/* The FP8 act quant (dsv4_act_quant_fp8, block 128) of one block held by a warp, 4 values per lane
 * (zeros past the end of a row do not change the block's amax, whose floor is 1e-4). */
__device__ __forceinline__ void wv_act_quant_fp8(float v[4]) {
    float amax = 1e-4f;
#pragma unroll
    for (int i = 0; i < 4; i++) amax = fmaxf(amax, fabsf(v[i]));
    amax = warp_max(amax);
    const float s = dev_pow2_ceil(amax * (1.0f / 448.0f));
#pragma unroll
    for (int i = 0; i < 4; i++) v[i] = dev_round_e4m3(fminf(fmaxf(__fdiv_rn(v[i], s), -448.0f), 448.0f)) * s;
}

#endif
