/* probe_ops.cuh - what the tensor-core probes (wgmma_eq.cu, tma_x_probe.cu) share: random f16 operands from a hash
 * (exponents spread over +-spread binades, some zeros), the A fragment of mma.sync m16n8k16 for a warp of a warpgroup
 * (the rows wgmma's A registers hold too), the mma.sync reference, and where accumulator q of n-tile n sits. */
#pragma once
#include <cstdint>

__host__ __device__ static inline uint32_t hsh(uint32_t x) {
    x ^= x >> 16; x *= 0x7feb352du; x ^= x >> 15; x *= 0x846ca68bu; x ^= x >> 16; return x;
}
__host__ __device__ static inline uint16_t rh(uint32_t h, int spread) {
    int e = 15 + (int)(h % (2 * spread + 1)) - spread;
    e = e < 1 ? 1 : e > 30 ? 30 : e;
    const uint32_t m = (h >> 8) & 0x3ff, s = (h >> 20) & 1;
    if (((h >> 24) & 15) == 0) return 0; /* some zeros */
    return (uint16_t)(s << 15 | e << 10 | m);
}
__device__ static inline uint32_t pk(uint16_t a, uint16_t b) { return a | (uint32_t)b << 16; }
/* A[row][k] of k-step ks in block blk */
__device__ static inline uint16_t Av(int blk, int ks, int r, int k, int spread) {
    return rh(hsh(0x85ebca6bu ^ (blk * 104729 + ks * 524287 + r * 8191 + k * 31 + 777)), spread);
}
/* the A fragment of lane (g, c) of warp `warp` (rows 16 warp + g, + 8; k 2c, 2c + 1, + 8) */
__device__ static inline void a_frag(uint32_t (&a)[4], int blk, int ks, int warp, int g, int c, int spread) {
    const int r0 = 16 * warp + g;
    a[0] = pk(Av(blk, ks, r0, 2 * c, spread), Av(blk, ks, r0, 2 * c + 1, spread));
    a[1] = pk(Av(blk, ks, r0 + 8, 2 * c, spread), Av(blk, ks, r0 + 8, 2 * c + 1, spread));
    a[2] = pk(Av(blk, ks, r0, 2 * c + 8, spread), Av(blk, ks, r0, 2 * c + 9, spread));
    a[3] = pk(Av(blk, ks, r0 + 8, 2 * c + 8, spread), Av(blk, ks, r0 + 8, 2 * c + 9, spread));
}
__device__ static inline void mma16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]) : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
/* output element (row, col) of accumulator q of n-tile n, for lane (g, c) of warp `warp` (mma.sync and wgmma alike) */
__device__ static inline int frag_row(int warp, int g, int q) { return 16 * warp + g + 8 * (q >> 1); }
__device__ static inline int frag_col(int n, int c, int q) { return 8 * n + 2 * c + (q & 1); }
