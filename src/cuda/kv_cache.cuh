/* kv_cache.cuh - device helpers for cache rows in the format of kv_cache.h (included by .cu files). */
#ifndef DSV4_CUDA_KV_CACHE_CUH
#define DSV4_CUDA_KV_CACHE_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "common.cuh"
#include "kv_cache.h"

/* e8m0 code of a power of two (or 0 for values below 2^-127, which the simulation never makes) */
__device__ __forceinline__ uint8_t dev_e8m0_code(float pow2) {
    return (uint8_t)((__float_as_uint(pow2) >> 23) & 0xff);
}

/* One warp packs one fp32 row (Dh floats) into a cache row. The scale of each 64-block is recomputed
 * from its (already rounded) values as the simulation computes it: max(amax, 1e-4) / 448 rounded up to
 * a power of two; every rounded value is then an e4m3 code times that scale exactly (the rounded amax
 * lies in [scale/2 * 448 .. scale * 448] of the original scale, both of which hold the codes). rope_f16: the rope
 * dims as f16 instead of bf16 (not the cache's format: attn_kv8_wg.cu's copy of a pass's own rows). */
__device__ __forceinline__ void dev_kv_pack_row_warp(const float *src, int Dh, int R, uint8_t *dst, bool rope_f16 = false) {
    const int lane = threadIdx.x & 31, nope = Dh - R, nb = nope / 64, ro = dsv4_kv_rope_off(Dh, R);
    for (int blk = 0; blk < nb; blk++) {
        float a = fmaxf(fabsf(src[blk * 64 + lane]), fabsf(src[blk * 64 + 32 + lane]));
        a = warp_max(a);
        float s = dev_pow2_ceil(fmaxf(a, 1e-4f) * (1.0f / 448.0f));
        for (int j = lane; j < 64; j += 32) {
            float v = src[blk * 64 + j] / s; /* exact: s is a power of two */
            dst[blk * 64 + j] = (uint8_t)__nv_cvt_float_to_fp8(v, __NV_SATFINITE, __NV_E4M3);
        }
        if (lane == 0) dst[nope + blk] = dev_e8m0_code(s);
    }
    uint16_t *rp = (uint16_t *)(dst + ro);
    for (int j = lane; j < R; j += 32)
        rp[j] = rope_f16 ? __half_as_ushort(__float2half_rn(src[nope + j])) : __bfloat16_as_ushort(__float2bfloat16_rn(src[nope + j]));
}

/* e2m1 code of a value that is exactly an e2m1 value (magnitude 0, .5, 1, 1.5, 2, 3, 4 or 6) */
__device__ __forceinline__ uint32_t dev_e2m1_code(float x) {
    int m2 = (int)(fabsf(x) * 2.0f); /* 0 1 2 3 4 6 8 12 */
    uint32_t c = m2 <= 4 ? (uint32_t)m2 : m2 == 6 ? 5u : m2 == 8 ? 6u : 7u;
    return x < 0 ? c | 8u : c;
}

/* One warp packs one FP4-simulated fp32 row of Di values into an indexer-key row. The scale of each block
 * of 32 is recomputed from the rounded values as the simulation computes it (max(amax, 6 * 2^-126) / 6 up
 * to a power of two); every rounded value is a code times it exactly (a rounded block maximum of 3 halves
 * the scale, and twice every e2m1 value up to 3 is an e2m1 value). */
__device__ __forceinline__ void dev_ikey_pack_row_warp(const float *src, int Di, uint8_t *dst) {
    const int lane = threadIdx.x & 31;
    for (int blk = 0; blk < Di / 32; blk++) {
        float v = src[blk * 32 + lane];
        float a = warp_max(fabsf(v));
        float s = dev_pow2_ceil(fmaxf(a, 6.0f * 1.1754943508222875e-38f) * (1.0f / 6.0f));
        uint32_t c = dev_e2m1_code(v / s), hi = __shfl_down_sync(0xffffffffu, c, 1);
        if (!(lane & 1)) dst[(blk * 32 + lane) / 2] = (uint8_t)(c | (hi << 4));
        if (lane == 0) dst[Di / 2 + blk] = dev_e8m0_code(s);
    }
}

/* Element j of an indexer-key row, as float (exact). */
__device__ __forceinline__ float dev_ikey_at(const uint8_t *row, int Di, int j) {
    uint32_t code = (row[j >> 1] >> ((j & 1) * 4)) & 15u;
    return dev_e2m1_x2(code) * 0.5f * dev_e8m0(row[Di / 2 + j / 32]);
}

/* Element d of a cache row, as float. */
__device__ __forceinline__ float dev_kv_at(const uint8_t *row, int Dh, int R, int d) {
    const int nope = Dh - R;
    if (d < nope) return dev_e4m3(row[d]) * dev_e8m0(row[nope + d / 64]);
    return dev_bf16(((const uint16_t *)(row + dsv4_kv_rope_off(Dh, R)))[d - nope]);
}

#endif
