/* wgmma_eq_e4m3.cu - does wgmma m64nNk32 e4m3 -> f32 (A from registers, B in shared memory) give the bits of
 * mma.sync m16n8k32 e4m3 on the same operands? If it does, a decode GEMV on mma.sync and a multi-token GEMM on wgmma can
 * both run the FP8 tensor cores on FP8 weights and act-quant codes and keep one set of bits (batch invariance) without
 * decoding the weights to f16 (what gemm_bi spends its issue slots on: bench/NOTES.md session 22).
 * 264 warpgroups, each 64 k32 steps of random e4m3 operands (every finite code, some zeros), N = 8 and 32, in three
 * accumulation forms: chain (the 64 steps into one accumulator from random fp32 values, +-cspread binades), unit (fresh
 * accumulators every 4 steps = one 128-column unit, each unit's result added in fp32 in the same order by both), step
 * (fresh every step, the experts' form in moe_f8.cuh). Prints per form how many outputs differ from mma.sync (bits and
 * value), and the largest error of each against a double reference (relative to sum |terms|; a wrong fragment layout
 * shows as O(1)). `make -f bench/Makefile wgmma-eq-e4m3` (sm_90a; H100 2026-12-06: 99.97-99.99 % of the outputs
 * differ in every form; wgmma error 8.3e-4 chain, 1.2-1.4e-4 unit, 5.5-6.1e-5 step, mma.sync ~1e-7: bench/RESULTS.md
 * session 37). */
#include <cstdio>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <cmath>

#include "probe_ops.cuh"

#define KS 64

__host__ __device__ static inline uint8_t e4(uint32_t h) {
    uint8_t b = (uint8_t)(h & 0xff);
    if ((b & 0x7f) == 0x7f) b &= 0xfe;     /* no NaN */
    if (((h >> 8) & 15) == 0) b = 0;       /* some zeros */
    return b;
}
__host__ __device__ static inline uint8_t Ab(int blk, int ks, int r, int k) { return e4(hsh(0x85ebca6bu ^ (blk * 104729 + ks * 524287 + r * 8191 + k * 31 + 777))); }
__host__ __device__ static inline uint8_t Bb(int blk, int ks, int k, int n) { return e4(hsh(0x9e3779b9u ^ (blk * 7919 + ks * 131071 + k * 257 + n * 65537 + 12345))); }
__host__ __device__ static inline float acc0(int blk, int row, int col, int cspread) {
    uint32_t h = hsh(blk * 1000003u + row * 977u + col * 13u + 5u);
    int e = (int)(h % (2 * cspread + 1)) - cspread;
    return ldexpf((float)((h >> 8) & 0xffffff) / 16777216.0f * ((h & 1) ? -1.f : 1.f), e);
}
static double e4v(uint8_t b) {
    const int s = b >> 7, e = (b >> 3) & 15, m = b & 7;
    const double v = e ? ldexp(1.0 + m / 8.0, e - 7) : ldexp(m / 8.0, -6);
    return s ? -v : v;
}

__device__ static inline uint32_t pk4(uint8_t a, uint8_t b, uint8_t c, uint8_t d) {
    return a | (uint32_t)b << 8 | (uint32_t)c << 16 | (uint32_t)d << 24;
}

template <int N> __device__ __forceinline__ void wg_e4(float (&d)[N / 2], const uint32_t (&a)[4], uint64_t db, int sd) {
    if (N == 8)
        asm volatile("{ .reg .pred p; setp.ne.b32 p, %9, 0;\n"
                     "wgmma.mma_async.sync.aligned.m64n8k32.f32.e4m3.e4m3 {%0,%1,%2,%3}, {%4,%5,%6,%7}, %8, p, 1, 1; }"
                     : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(sd)
                     : "memory");
    else
        asm volatile("{ .reg .pred p; setp.ne.b32 p, %21, 0;\n"
                     "wgmma.mma_async.sync.aligned.m64n32k32.f32.e4m3.e4m3 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15}, "
                     "{%16,%17,%18,%19}, %20, p, 1, 1; }"
                     : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
                       "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(sd)
                     : "memory");
}
__device__ static inline void mma_e4(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]) : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/* FORM 0 chain, 1 unit (fresh every 4 steps), 2 step (fresh every step). Block = 1 warpgroup; shared memory B
 * [KS][N / 8][2 k halves][8 rows n][16 bytes]; out [blk][2][64][N] (mma.sync, wgmma) */
template <int N, int FORM> __global__ void __launch_bounds__(128) eq_kernel(float *out, int cspread) {
    extern __shared__ __align__(128) uint8_t sm[];
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, c = lane & 3, blk = blockIdx.x;
    for (int i = tid; i < KS * N * 32; i += 128) {
        const int ks = i / (N * 32), r = i % (N * 32), n = r / 32, k = r % 32;
        sm[ks * N * 32 + (n / 8) * 256 + (k / 16) * 128 + (n % 8) * 16 + (k % 16)] = Bb(blk, ks, k, n);
    }
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
    __syncthreads();
    float d0[N / 8][4], d1[N / 2], t0[N / 8][4], t1[N / 2];
    for (int n = 0; n < N / 8; n++)
        for (int q = 0; q < 4; q++) {
            const float v = FORM == 0 ? acc0(blk, frag_row(warp, g, q), frag_col(n, c, q), cspread) : 0.f;
            d0[n][q] = v, d1[n * 4 + q] = v, t0[n][q] = 0.f, t1[n * 4 + q] = 0.f;
        }
    const unsigned sb = (unsigned)__cvta_generic_to_shared(sm);
    const int r0 = 16 * warp + g;
    for (int ks = 0; ks < KS; ks++) {
        const int fresh = FORM == 2 || (FORM == 1 && ks % 4 == 0);
        uint32_t a[4];
        a[0] = pk4(Ab(blk, ks, r0, 4 * c), Ab(blk, ks, r0, 4 * c + 1), Ab(blk, ks, r0, 4 * c + 2), Ab(blk, ks, r0, 4 * c + 3));
        a[1] = pk4(Ab(blk, ks, r0 + 8, 4 * c), Ab(blk, ks, r0 + 8, 4 * c + 1), Ab(blk, ks, r0 + 8, 4 * c + 2), Ab(blk, ks, r0 + 8, 4 * c + 3));
        a[2] = pk4(Ab(blk, ks, r0, 16 + 4 * c), Ab(blk, ks, r0, 17 + 4 * c), Ab(blk, ks, r0, 18 + 4 * c), Ab(blk, ks, r0, 19 + 4 * c));
        a[3] = pk4(Ab(blk, ks, r0 + 8, 16 + 4 * c), Ab(blk, ks, r0 + 8, 17 + 4 * c), Ab(blk, ks, r0 + 8, 18 + 4 * c), Ab(blk, ks, r0 + 8, 19 + 4 * c));
        if (fresh)
            for (int n = 0; n < N / 8; n++)
                for (int q = 0; q < 4; q++) d0[n][q] = 0.f;
        for (int n = 0; n < N / 8; n++) {
            const uint8_t *bp = sm + ks * N * 32 + n * 256 + g * 16 + 4 * c;
            mma_e4(d0[n], a, *(const uint32_t *)bp, *(const uint32_t *)(bp + 128));
        }
        const uint64_t db = (uint64_t)((sb + ks * N * 32) >> 4) | ((uint64_t)(128 >> 4) << 16) | ((uint64_t)(256 >> 4) << 32);
        asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
        wg_e4<N>(d1, a, db, !fresh);
        asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
        asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory");
        const int last = FORM == 2 || (FORM == 1 && ks % 4 == 3);
        if (FORM && last)
            for (int n = 0; n < N / 8; n++)
                for (int q = 0; q < 4; q++) t0[n][q] += d0[n][q], t1[n * 4 + q] += d1[n * 4 + q];
    }
    for (int n = 0; n < N / 8; n++)
        for (int q = 0; q < 4; q++) {
            const int row = frag_row(warp, g, q), col = frag_col(n, c, q);
            out[((size_t)blk * 2 + 0) * 64 * N + row * N + col] = FORM ? t0[n][q] : d0[n][q];
            out[((size_t)blk * 2 + 1) * 64 * N + row * N + col] = FORM ? t1[n * 4 + q] : d1[n * 4 + q];
        }
}

template <int N, int FORM> static void run(int nb, int cspread) {
    float *d;
    const size_t n = (size_t)nb * 2 * 64 * N, smem = (size_t)KS * N * 32;
    cudaMalloc(&d, n * 4);
    cudaFuncSetAttribute(eq_kernel<N, FORM>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    eq_kernel<N, FORM><<<nb, 128, smem>>>(d, cspread);
    cudaError_t e = cudaDeviceSynchronize();
    if (e) { printf("error: %s\n", cudaGetErrorString(e)); exit(1); }
    float *h = (float *)malloc(n * 4);
    cudaMemcpy(h, d, n * 4, cudaMemcpyDeviceToHost);
    long bits = 0, vals = 0, tot = 0;
    double err[2] = {0, 0};
    for (int b = 0; b < nb; b++)
        for (int row = 0; row < 64; row++)
            for (int col = 0; col < N; col++) {
                const float x = h[((size_t)b * 2) * 64 * N + row * N + col], y = h[((size_t)b * 2 + 1) * 64 * N + row * N + col];
                uint32_t xb, yb;
                memcpy(&xb, &x, 4), memcpy(&yb, &y, 4);
                tot++, bits += xb != yb, vals += x != y;
                if (b < 16) { /* the double reference for the first blocks */
                    double ref = FORM == 0 ? acc0(b, row, col, cspread) : 0.0, mag = fabs(ref);
                    for (int ks = 0; ks < KS; ks++)
                        for (int k = 0; k < 32; k++) {
                            const double p = e4v(Ab(b, ks, row, k)) * e4v(Bb(b, ks, k, col));
                            ref += p, mag += fabs(p);
                        }
                    const double ex = fabs(x - ref) / (mag + 1e-30), ey = fabs(y - ref) / (mag + 1e-30);
                    if (ex > err[0]) err[0] = ex;
                    if (ey > err[1]) err[1] = ey;
                }
            }
    static const char *fn[3] = {"chain", "unit ", "step "};
    printf("%s N=%-2d cspread=%-2d: %ld of %ld differ in bits (%ld in value) from mma.sync; max err / sum|terms|: mma.sync "
           "%.3g, wgmma %.3g\n", fn[FORM], N, cspread, bits, tot, vals, err[0], err[1]);
    cudaFree(d), free(h);
}

int main() {
    run<8, 0>(264, 0), run<32, 0>(264, 0), run<32, 0>(264, 20);
    run<8, 1>(264, 0), run<32, 1>(264, 0);
    run<8, 2>(264, 0), run<32, 2>(264, 0);
    return 0;
}
