/* indexer_tc.h - the indexer's scores on tensor cores (indexer_tc.cu), the same bits as dsv4_cuda_indexer_scores'
 * other kernels (cuda_backend.h), for FP4 keys. */
#ifndef DSV4_CUDA_INDEXER_TC_H
#define DSV4_CUDA_INDEXER_TC_H

#include <cuda_runtime.h>
#include <stdint.h>

/* Arguments as dsv4_cuda_indexer_scores (fp4 keys). 0, -1 on a launch error, 1 when the shape is not this kernel's
 * (Hi a multiple of 16 up to 64, Di 64 or 128, q 16-byte aligned) or DSV4_INDEXER_TC=0. */
int dsv4_ixt_scores(const float *qi, const float *wt, int T, int Hi, int Di, const uint8_t *const *keys,
                    const int *ncausal, const int *nlist, int maxlist, int ld, float *out, cudaStream_t st);

#endif
