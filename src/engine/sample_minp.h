/* sample_minp.h - the min_p threshold of the sampler (sample.h, step 4), shared by the CPU sampler
 * (sample.c) and its GPU twin (src/cuda/sample.cu), so both compare logits against the same float. */
#ifndef DSV4_ENGINE_SAMPLE_MINP_H
#define DSV4_ENGINE_SAMPLE_MINP_H

#include <math.h>

#ifdef __CUDACC__
#define DSV4_SAMPLE_HD __host__ __device__
#else
#define DSV4_SAMPLE_HD
#endif

/* The smallest float z with exp((double)z - (double)mz) >= min_p (-inf when min_p is off), so that
 * the min_p test is a comparison of logits. */
static inline DSV4_SAMPLE_HD float dsv4_minp_threshold(float mz, float min_p) {
    if (!(min_p > 0.0f)) return -INFINITY;
    const double m = mz, p = min_p;
    float z = (float)(m + log(p));
    if (!(z <= mz)) z = mz;
    while (z < mz && exp((double)z - m) < p) z = nextafterf(z, INFINITY);
    for (;;) {
        float d = nextafterf(z, -INFINITY);
        if (d == -INFINITY || exp((double)d - m) < p) break;
        z = d;
    }
    return z;
}

#endif
