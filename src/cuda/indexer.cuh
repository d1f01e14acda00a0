/* indexer.cuh - device pieces shared by the indexer-score kernels (forward_ops.cu, indexer_tc.cu). */
#ifndef DSV4_CUDA_INDEXER_CUH
#define DSV4_CUDA_INDEXER_CUH

#include <math.h>
#include <stdint.h>

/* The scores of a chunk's entries w0 .. w0 + ne - 1 from their per-head dots (dots[(e ^ sw (h & 3)) * lde + h * ldh]),
 * a thread per entry (thread tid of nth): sum_h ws[h] * relu(dot) as the CPU's chain (separately rounded, h in order)
 * for w < ncs, -inf for ncs <= w < n, nothing written from n on. */
__device__ __forceinline__ void ix_head_sums(const float *dots, int lde, int ldh, int sw, const float *ws, int Hi, int w0, int ne,
                                             int n, int ncs, float *out, int tid, int nth) {
    for (int e = tid; e < ne; e += nth) {
        const int w = w0 + e;
        if (w >= n) break;
        float s = -INFINITY;
        if (w < ncs) {
            s = 0.0f;
            for (int hh = 0; hh < Hi; hh++) {
                const float d = dots[(int64_t)(e ^ (sw * (hh & 3))) * lde + (int64_t)hh * ldh];
                s = __fadd_rn(s, __fmul_rn(ws[hh], d > 0 ? d : 0));
            }
        }
        out[w] = s;
    }
}

#endif
