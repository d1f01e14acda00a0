/* wgmma_eq.cu - does wgmma m64nNk16 f16 -> f32 (A from registers, B in shared memory) give the bits of the same chain
 * of mma.sync m16n8k16? (src/cuda/wgmma.cuh relies on it: the experts' prefill on wgmma keeps the decode kernels'
 * bits.) 264 warpgroups, each a 64-step chain of k16 products from random f16 operands (exponents spread over
 * +-spread binades, some zeros) into fp32 accumulators (+-cspread binades), N = 8 and 32; prints how many of the
 * outputs differ. `make -f bench/Makefile wgmma-eq` (sm_90a; H200 2026-12-01: 0 of 6.5 M differ). */
#include <cstdio>
#include <cstdint>
#include <cstdlib>
#include <cuda_fp16.h>

__device__ __forceinline__ uint32_t hsh(uint32_t x) {
    x ^= x >> 16; x *= 0x7feb352du; x ^= x >> 15; x *= 0x846ca68bu; x ^= x >> 16; return x;
}
__device__ __forceinline__ uint16_t rh(uint32_t h, int spread) {
    int e = 15 + (int)(h % (2 * spread + 1)) - spread;
    e = e < 1 ? 1 : e > 30 ? 30 : e;
    uint32_t m = (h >> 8) & 0x3ff, s = (h >> 20) & 1;
    if (((h >> 24) & 15) == 0) return 0; // some zeros
    return (uint16_t)(s << 15 | e << 10 | m);
}
__device__ __forceinline__ uint32_t pk(uint16_t a, uint16_t b) { return a | (uint32_t)b << 16; }

#define KS 64
template <int N>
__device__ uint16_t Bv(int blk, int ks, int k, int n, int spread) { return rh(hsh(0x9e3779b9u ^ (blk * 7919 + ks * 131071 + k * 257 + n * 65537 + 12345)), spread); }
__device__ uint16_t Av(int blk, int ks, int r, int k, int spread) { return rh(hsh(0x85ebca6bu ^ (blk * 104729 + ks * 524287 + r * 8191 + k * 31 + 777)), spread); }

__device__ __forceinline__ void mma16816(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0, uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]) : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}
__device__ __forceinline__ uint64_t desc(unsigned sa) {
    return (uint64_t)((sa & 0x3FFFF) >> 4) | ((uint64_t)(128 >> 4) << 16) | ((uint64_t)(256 >> 4) << 32);
}
__device__ __forceinline__ void wg8(float (&d)[4], const uint32_t (&a)[4], uint64_t ds) {
    asm volatile("{ .reg .pred p; setp.ne.b32 p, 1, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n8k16.f32.f16.f16 {%0,%1,%2,%3}, {%4,%5,%6,%7}, %8, p, 1, 1, 0; }"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]) : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(ds) : "memory");
}
__device__ __forceinline__ void wg32(float (&d)[16], const uint32_t (&a)[4], uint64_t ds) {
    asm volatile("{ .reg .pred p; setp.ne.b32 p, 1, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n32k16.f32.f16.f16 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15}, {%16,%17,%18,%19}, %20, p, 1, 1, 0; }"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
                   "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(ds) : "memory");
}

// N tokens; block = 1 warpgroup; out: [blk][2][64][N]
template <int N>
__global__ void __launch_bounds__(128) eq_kernel(float *out, int spread, int cspread) {
    __shared__ __align__(128) uint16_t Bs[KS * N * 16];
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, c = lane & 3, blk = blockIdx.x;
    for (int i = tid; i < KS * N * 16; i += 128) {
        const int ks = i / (N * 16), r = i % (N * 16), n = r / 16, k = r % 16;
        // layout per ks: [n8][kh][8 rows][8 halves]
        Bs[ks * N * 16 + (n / 8) * 128 + (k / 8) * 64 + (n % 8) * 8 + (k % 8)] = Bv<N>(blk, ks, k, n, spread);
    }
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
    __syncthreads();
    float d0[N / 8][4], d1[N / 2];
    for (int n = 0; n < N / 8; n++)
        for (int q = 0; q < 4; q++) {
            const int row = 16 * warp + g + 8 * (q >> 1), col = 8 * n + 2 * c + (q & 1);
            uint32_t h = hsh(blk * 1000003u + row * 977u + col * 13u + 5u);
            int e = (int)(h % (2 * cspread + 1)) - cspread;
            float v = ldexpf((float)((h >> 8) & 0xffffff) / 16777216.0f * ((h & 1) ? -1.f : 1.f), e);
            d0[n][q] = v, d1[n * 4 + q] = v;
        }
    const unsigned sa = (unsigned)__cvta_generic_to_shared(Bs);
    for (int ks = 0; ks < KS; ks++) {
        uint32_t a[4];
        const int r0 = 16 * warp + g;
        a[0] = pk(Av(blk, ks, r0, 2 * c, spread), Av(blk, ks, r0, 2 * c + 1, spread));
        a[1] = pk(Av(blk, ks, r0 + 8, 2 * c, spread), Av(blk, ks, r0 + 8, 2 * c + 1, spread));
        a[2] = pk(Av(blk, ks, r0, 2 * c + 8, spread), Av(blk, ks, r0, 2 * c + 9, spread));
        a[3] = pk(Av(blk, ks, r0 + 8, 2 * c + 8, spread), Av(blk, ks, r0 + 8, 2 * c + 9, spread));
        for (int n = 0; n < N / 8; n++) {
            const uint16_t *bp = Bs + ks * N * 16 + n * 128 + g * 8;
            const uint32_t b0 = pk(bp[2 * c], bp[2 * c + 1]), b1 = pk(bp[64 + 2 * c], bp[64 + 2 * c + 1]);
            mma16816(d0[n], a[0], a[1], a[2], a[3], b0, b1);
        }
        asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
        if (N == 8) wg8(*(float(*)[4])d1, a, desc(sa + ks * N * 32));
        else wg32(*(float(*)[16])d1, a, desc(sa + ks * N * 32));
        asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
        asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory");
    }
    for (int n = 0; n < N / 8; n++)
        for (int q = 0; q < 4; q++) {
            const int row = 16 * warp + g + 8 * (q >> 1), col = 8 * n + 2 * c + (q & 1);
            out[((size_t)blk * 2 + 0) * 64 * N + row * N + col] = d0[n][q];
            out[((size_t)blk * 2 + 1) * 64 * N + row * N + col] = d1[n * 4 + q];
        }
}

template <int N> static void run(int nb, int spread, int cspread) {
    float *d;
    size_t n = (size_t)nb * 2 * 64 * N;
    cudaMalloc(&d, n * 4);
    eq_kernel<N><<<nb, 128>>>(d, spread, cspread);
    cudaError_t e = cudaDeviceSynchronize();
    if (e) { printf("err %s\n", cudaGetErrorString(e)); exit(1); }
    float *h = (float *)malloc(n * 4);
    cudaMemcpy(h, d, n * 4, cudaMemcpyDeviceToHost);
    long diff = 0, tot = 0; double maxrel = 0;
    for (int b = 0; b < nb; b++)
        for (int i = 0; i < 64 * N; i++) {
            float x = h[((size_t)b * 2) * 64 * N + i], y = h[((size_t)b * 2 + 1) * 64 * N + i];
            tot++;
            if (*(uint32_t *)&x != *(uint32_t *)&y) { diff++; double r = fabs(x - y) / (fabs(x) + 1e-30); if (r > maxrel) maxrel = r; }
        }
    printf("N=%d spread=%d cspread=%d: %ld of %ld differ (max rel %.3g)\n", N, spread, cspread, diff, tot, maxrel);
    cudaFree(d); free(h);
}
int main() {
    int sp[] = {0, 3, 8, 14};
    for (int i = 0; i < 4; i++) { run<8>(264, sp[i], 0); run<32>(264, sp[i], 0); run<32>(264, sp[i], 20); }
    return 0;
}
