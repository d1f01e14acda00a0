/* tma_x_probe.cu - can the experts' x stage come through TMA? One 128-byte box a token and half-unit
 * (cp.async.bulk.tensor.2d, 128B swizzle, gathered rows: the gate/up rows are a token list), completion on an
 * mbarrier, then wgmma m64n64k16 (A from registers, B = the swizzled K-major tile through an SW128 descriptor) over
 * two units (16 k-steps); the same products as a chain of mma.sync m16n8k16 with B read from global memory. Prints how
 * many outputs differ (0 expected: the same k-steps, so the same bits, as bench/wgmma_eq.cu showed for the
 * unswizzled layout). NOTES "Session 9" says why: the x stage's cp.async copies are 30 % of moe_pf2_kernel's stall
 * samples. `make -f bench/Makefile tma-x-probe` (sm_90a; written in session 9, not yet run). */
#include <cstdio>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <cuda.h>
#include <cuda_runtime.h>

#include "probe_ops.cuh"

#define NT 64   /* tokens (wgmma N) */
#define KU 2    /* units of 128 k */
#define XK 512  /* halves a row of x (a unit: 128) */
#define XR 1000 /* rows of x */

/* K-major, 128-byte swizzle: start address, SBO = 1024 (8 rows of 128 bytes), layout type 1 (bits 62-63) */
__device__ static inline uint64_t desc_sw128(unsigned sa) {
    return (uint64_t)((sa & 0x3FFFF) >> 4) | ((uint64_t)1 << 16) | ((uint64_t)(1024 >> 4) << 32) | ((uint64_t)1 << 62);
}
#define D8(i) "+f"(d[i][0]), "+f"(d[i][1]), "+f"(d[i][2]), "+f"(d[i][3])
__device__ static inline void wgmma_rs64(float (&d)[8][4], const uint32_t (&a)[4], uint64_t db) {
    asm volatile("{ .reg .pred p; setp.ne.b32 p, 1, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,"
                 "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31}, {%32,%33,%34,%35}, %36, p, 1, 1, 0; }"
                 : D8(0), D8(1), D8(2), D8(3), D8(4), D8(5), D8(6), D8(7)
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db) : "memory");
}

/* block b: tokens rows[b][0..NT); smem: [unit][half][token][128 bytes] (8 tokens = one 1024-byte swizzle atom), then the
 * mbarrier. out: [blk][2][64][NT] (mma.sync, wgmma) */
__global__ void __launch_bounds__(128) probe_kernel(const __grid_constant__ CUtensorMap tm, const uint16_t *x, const int *rows,
                                                    float *out) {
    extern __shared__ __align__(1024) unsigned char sm[];
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, c = lane & 3, blk = blockIdx.x;
    const int *rw = rows + blk * NT;
    const unsigned sb = (unsigned)__cvta_generic_to_shared(sm), bar = sb + KU * 2 * NT * 128;
    if (sb & 1023) { /* the swizzle atoms assume 1024-byte alignment */
        if (tid == 0) printf("block %d: shared memory at %u, not 1024-byte aligned\n", blk, sb);
        return;
    }
    if (tid == 0) {
        asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(bar) : "memory");
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();
    if (tid == 0) asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(KU * 2 * NT * 128) : "memory");
    __syncthreads(); /* the expected bytes before any completion */
    if (tid < NT)
        for (int u = 0; u < KU; u++)
            for (int h = 0; h < 2; h++) {
                const unsigned dst = sb + (unsigned)(((u * 2 + h) * NT + tid) * 128);
                const int c0 = u * 128 + h * 64, c1 = rw[tid];
                asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];"
                             ::"r"(dst), "l"((uint64_t)&tm), "r"(c0), "r"(c1), "r"(bar) : "memory");
            }
    for (uint32_t done = 0; !done;)
        asm volatile("{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], 0; selp.u32 %0, 1, 0, p; }"
                     : "=r"(done) : "r"(bar) : "memory");

    float d0[NT / 8][4], d1[8][4];
    for (int n = 0; n < NT / 8; n++)
        for (int q = 0; q < 4; q++) d0[n][q] = d1[n][q] = 0.0f;
    for (int ks = 0; ks < KU * 8; ks++) {
        uint32_t a[4];
        a_frag(a, blk, ks, warp, g, c, 8);
        for (int n = 0; n < NT / 8; n++) { /* B from global: column n = token rw[8 n + g], k = 16 ks + ... */
            const uint16_t *xp = x + (size_t)rw[8 * n + g] * XK + 16 * ks;
            mma16816(d0[n], a, pk(xp[2 * c], xp[2 * c + 1]), pk(xp[2 * c + 8], xp[2 * c + 9]));
        }
        const int u = ks >> 3, h = (ks >> 2) & 1, kq = ks & 3; /* unit, half, k-step within the 128-byte row */
        const uint64_t db = desc_sw128(sb + (unsigned)((u * 2 + h) * NT * 128 + kq * 32));
        asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
        wgmma_rs64(d1, a, db);
        asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
        asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory");
    }
    for (int n = 0; n < NT / 8; n++)
        for (int q = 0; q < 4; q++) {
            const int row = frag_row(warp, g, q), col = frag_col(n, c, q);
            out[((size_t)blk * 2 + 0) * 64 * NT + row * NT + col] = d0[n][q];
            out[((size_t)blk * 2 + 1) * 64 * NT + row * NT + col] = d1[n][q];
        }
}

typedef CUresult (*encode_fn)(CUtensorMap *, CUtensorMapDataType, cuuint32_t, void *, const cuuint64_t *, const cuuint64_t *,
                              const cuuint32_t *, const cuuint32_t *, CUtensorMapInterleave, CUtensorMapSwizzle,
                              CUtensorMapL2promotion, CUtensorMapFloatOOBfill);

int main() {
    const int nb = 132;
    uint16_t *hx = (uint16_t *)malloc(sizeof(uint16_t) * XR * XK);
    for (int i = 0; i < XR * XK; i++) hx[i] = rh(hsh(0x9e3779b9u ^ (uint32_t)(i * 2654435761u + 12345)), 8);
    int *hr = (int *)malloc(sizeof(int) * nb * NT);
    for (int i = 0; i < nb * NT; i++) hr[i] = (int)(hsh((uint32_t)i * 7919u + 3u) % XR); /* gathered, repeats allowed */
    uint16_t *dx;
    int *dr;
    float *dout;
    cudaMalloc(&dx, sizeof(uint16_t) * XR * XK), cudaMalloc(&dr, sizeof(int) * nb * NT), cudaMalloc(&dout, sizeof(float) * nb * 2 * 64 * NT);
    cudaMemcpy(dx, hx, sizeof(uint16_t) * XR * XK, cudaMemcpyHostToDevice);
    cudaMemcpy(dr, hr, sizeof(int) * nb * NT, cudaMemcpyHostToDevice);

    encode_fn enc = NULL;
    cudaDriverEntryPointQueryResult q;
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", (void **)&enc, 12000, cudaEnableDefault, &q) != cudaSuccess ||
        q != cudaDriverEntryPointSuccess || !enc) {
        printf("error: cuTensorMapEncodeTiled not found\n");
        return 1;
    }
    CUtensorMap tm;
    const cuuint64_t dims[2] = {XK, XR}, strides[1] = {XK * sizeof(uint16_t)};
    const cuuint32_t box[2] = {64, 1}, estr[2] = {1, 1};
    CUresult r = enc(&tm, CU_TENSOR_MAP_DATA_TYPE_FLOAT16, 2, dx, dims, strides, box, estr, CU_TENSOR_MAP_INTERLEAVE_NONE,
                     CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_128B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    if (r != CUDA_SUCCESS) {
        printf("error: cuTensorMapEncodeTiled: %d\n", (int)r);
        return 1;
    }
    const int smem = KU * 2 * NT * 128 + 64;
    cudaFuncSetAttribute(probe_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    probe_kernel<<<nb, 128, smem>>>(tm, dx, dr, dout);
    cudaError_t e = cudaDeviceSynchronize();
    if (e) {
        printf("error: %s\n", cudaGetErrorString(e));
        return 1;
    }
    const size_t n = (size_t)nb * 2 * 64 * NT;
    float *h = (float *)malloc(sizeof(float) * n);
    cudaMemcpy(h, dout, sizeof(float) * n, cudaMemcpyDeviceToHost);
    long diff = 0, tot = 0, zero = 0;
    for (int b = 0; b < nb; b++)
        for (int i = 0; i < 64 * NT; i++) {
            const float x0 = h[((size_t)b * 2) * 64 * NT + i], x1 = h[((size_t)b * 2 + 1) * 64 * NT + i];
            tot++, zero += x0 == 0.0f;
            if (memcmp(&x0, &x1, 4)) diff++;
        }
    printf("tma x (gathered rows, 128B swizzle) + wgmma: %ld of %ld outputs differ from mma.sync on global x (%ld zeros)\n", diff,
           tot, zero);
    return diff != 0;
}
