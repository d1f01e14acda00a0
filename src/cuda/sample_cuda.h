/* sample_cuda.h - token sampling on the GPU: the twin of dsv4_sampler_sample (src/engine/sample.h),
 * one thread block per sequence, for use inside the captured decode step (no host sync, no
 * allocation: the host reads back only the sampled ids).
 *
 * Same algorithm and order as the CPU sampler (greedy below temperature 1e-5, else z = l / T,
 * weights exp(z - max) in double, min_p, top_k with ties kept, top_p over the (z desc, id asc)
 * order, then the inverse CDF walked in id order with the Philox-4x32-10 uniform of (seed, step)).
 * Penalties are not applied here (a sequence that uses them is sampled on the host). Sums are
 * deterministic (fixed reduction trees) but not sequential, so a draw that lands within rounding
 * of a cumulative boundary may pick the neighbouring token; tests/gpu/test_sample.c counts those. */
#ifndef DSV4_CUDA_SAMPLE_H
#define DSV4_CUDA_SAMPLE_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Per-sequence parameters, in device memory (one per row of logits). Values as validated by
 * dsv4_sampling_validate; step = tokens accepted so far (the RNG counter). */
typedef struct dsv4_cuda_sample_params {
    float temperature, top_p, min_p;
    int32_t top_k;
    uint64_t seed, step;
} dsv4_cuda_sample_params;

/* For each row b < B of logits (row stride ld floats, V entries): out[b] = the sampled token id,
 * -1 if a logit is NaN or +inf, -2 if every logit is -inf. With advance != 0, params[b].step is
 * incremented after a successful draw (so a replayed graph moves every sequence's RNG on).
 * Device pointers; enqueue only. Returns 0, or -1 when the arguments are out of range or the launch failed. */
int dsv4_cuda_sample(const float *logits, int64_t ld, int B, int V, dsv4_cuda_sample_params *params, int advance,
                     int32_t *out, void *stream);

#ifdef __cplusplus
}
#endif
#endif
