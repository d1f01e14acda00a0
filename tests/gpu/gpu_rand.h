/* gpu_rand.h - the GPU tests' random inputs: xorshift64 uniforms and Box-Muller normals (each test file
 * seeds its own state). */
#ifndef DSV4_TESTS_GPU_RAND_H
#define DSV4_TESTS_GPU_RAND_H

#include <math.h>
#include <stdint.h>

static uint64_t rs;
static double urand(void) {
    rs ^= rs << 13, rs ^= rs >> 7, rs ^= rs << 17;
    return (double)(rs >> 11) / 9007199254740992.0;
}
static float nrand(void) {
    double a = urand(), b = urand();
    return (float)(sqrt(-2 * log(a + 1e-300)) * cos(6.283185307179586 * b));
}

#endif
