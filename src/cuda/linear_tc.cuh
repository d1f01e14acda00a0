/* linear_tc.cuh - tensor-core building blocks for kernels that stream weights (C++, included by .cu files of
 * src/cuda): a streaming 16-byte load, the mma.sync m16n8k16 (f16 / bf16 in, fp32 accumulate) wrapper, and exact
 * in-register decoders of the weight formats into 16-bit fragments.
 *
 * Every decoder is exact: e4m3 -> f16 (hardware convert), e2m1 -> f16 by re-packing each nibble into an e4m3
 * byte (sign, 2 exponent bits, 1 mantissa bit: the e4m3 value is the e2m1 value times 2^-6) and converting
 * that, bf16 / f16 words as stored, f32 split into three bf16 terms (hi + mid + lo == the f32 value unless it
 * is tiny). Products of two such 16-bit values are exact in fp32, so an mma of them sums exact products. */
#ifndef DSV4_CUDA_LINEAR_TC_CUH
#define DSV4_CUDA_LINEAR_TC_CUH

#include <cuda_bf16.h>

#include "common.cuh"

/* 16 bytes that are read once: no L1 allocation, 256-byte L2 fetch (the next 16 bytes of a row are wanted soon). */
__device__ __forceinline__ uint4 tc_ld_stream(const void *p) {
    uint4 v;
    asm volatile("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0,%1,%2,%3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p));
    return v;
}

/* d += A . B for one m16n8k16 tile; BF selects bf16 operands (else f16). Fragments as in the PTX ISA:
 * lane l = 4 g + c holds A rows g / g+8, columns 2c, 2c+1 (a0: row g, a1: row g+8) and 2c+8, 2c+9 (a2, a3);
 * B column g, rows 2c, 2c+1 (b0) and 2c+8, 2c+9 (b1); D rows g (d0, d1) / g+8 (d2, d3), columns 2c, 2c+1. */
template <int BF>
__device__ __forceinline__ void tc_mma(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                                       uint32_t b1) {
    if (BF)
        asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
            : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
            : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
    else
        asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
            : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
            : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

/* the f16 form with A as one fragment array (a[0 .. 3] = a0 .. a3) */
__device__ __forceinline__ void tc_mma(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    tc_mma<0>(d, a[0], a[1], a[2], a[3], b0, b1);
}

/* ldmatrix .x4 of 16-bit elements from shared memory: lanes 8 m .. 8 m + 7 give the row addresses (16 bytes each) of
 * matrix m, and lane l = 4 g + c receives r[m] = row g, elements 2c, 2c + 1 of matrix m (tc_ldsm4t: transposed, column g) */
__device__ __forceinline__ void tc_ldsm4(uint32_t (&r)[4], unsigned a) { /* a: a shared-memory address */
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a));
}
__device__ __forceinline__ void tc_ldsm4(uint32_t (&r)[4], const void *p) { tc_ldsm4(r, (unsigned)__cvta_generic_to_shared(p)); }
__device__ __forceinline__ void tc_ldsm4t(uint32_t (&r)[4], const void *p) {
    const unsigned a = (unsigned)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a));
}

/* Two e4m3 (low byte -> low half) to f16x2, exact. */
__device__ __forceinline__ uint32_t tc_e4m3x2_f16x2(uint32_t v) {
    __half2_raw h = __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)(v & 0xffffu), __NV_E4M3);
    return (uint32_t)h.x | ((uint32_t)h.y << 16);
}

/* Eight e2m1 codes of a word (nibble i = element i) to four f16x2 holding the values times 2^-6, in the order
 * r0 = {e0, e2}, r1 = {e4, e6}, r2 = {e1, e3}, r3 = {e5, e7}: each nibble s|e1 e0|m becomes the e4m3 byte
 * s|0 0 e1 e0|m 0 0 (exponent bias 7 instead of 1, so the subnormal code 0.5 lands on 2^-7 too). */
__device__ __forceinline__ void tc_e2m1x8_f16x2(uint32_t w, uint32_t (&r)[4]) {
    const uint32_t lo = ((w & 0x07070707u) << 2) | ((w & 0x08080808u) << 4);
    const uint32_t hi = ((w >> 2) & 0x1C1C1C1Cu) | (w & 0x80808080u);
    r[0] = tc_e4m3x2_f16x2(lo);
    r[1] = tc_e4m3x2_f16x2(lo >> 16);
    r[2] = tc_e4m3x2_f16x2(hi);
    r[3] = tc_e4m3x2_f16x2(hi >> 16);
}
/* Element order of tc_e2m1x8_f16x2: half q (0..7) of r[] holds element tc_e2m1_perm(q); tc_e2m1_slot inverts it. */
__host__ __device__ __forceinline__ int tc_e2m1_perm(int q) { return 2 * (q & 3) + (q >> 2); }
__host__ __device__ __forceinline__ int tc_e2m1_slot(int e) { return (e >> 1) + 4 * (e & 1); }

/* f16 bits of 2^k for -24 <= k <= 15 (subnormal below -14), 0 below -24; in both halves. */
__device__ __forceinline__ uint32_t tc_f16x2_pow2(int k) {
    uint32_t b = k >= -14 ? (uint32_t)(k + 15) << 10 : k >= -24 ? 1u << (k + 24) : 0u;
    return b | (b << 16);
}
__device__ __forceinline__ uint32_t tc_hmul2(uint32_t a, uint32_t b) {
    __half2 r = __hmul2(*(const __half2 *)&a, *(const __half2 *)&b);
    return *(const uint32_t *)&r;
}

/* f32 pair -> bf16x2 terms t0 + t1 + t2 (round to nearest each; t0 + t1 + t2 equals the pair to ~2^-24 relative). */
__device__ __forceinline__ void tc_f32x2_bf16x3(float a, float b, uint32_t &t0, uint32_t &t1, uint32_t &t2) {
    __nv_bfloat162 h = __floats2bfloat162_rn(a, b);
    float2 hf = __bfloat1622float2(h);
    float ra = a - hf.x, rb = b - hf.y;
    __nv_bfloat162 m = __floats2bfloat162_rn(ra, rb);
    float2 mf = __bfloat1622float2(m);
    __nv_bfloat162 l = __floats2bfloat162_rn(ra - mf.x, rb - mf.y);
    t0 = *(const uint32_t *)&h;
    t1 = *(const uint32_t *)&m;
    t2 = *(const uint32_t *)&l;
}

#endif
