/* test_sample.c - the GPU sampler (src/cuda/sample.cu) against the CPU sampler (src/engine/sample.c):
 * the same token for every (logits, parameters, seed, step) case, over vocabularies of 1000, 50257
 * and 129280 tokens, peaked / flat / tied / masked logits, greedy, temperature, min_p, top_k, top_p
 * and their combinations; error codes for NaN / +inf / all -inf rows; `advance` moves the step.
 * A draw within rounding of a cumulative boundary may differ (the GPU's sums are tree-ordered):
 * such cases are counted and must stay below 1 in 1000. Needs a GPU.
 *   build-cuda/tests/gpu/test_sample        (scripts/gpu_test.sh runs it) */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../src/cuda/cuda_backend.h"
#include "../../src/cuda/sample_cuda.h"
#include "../../src/engine/sample.h"

#include "gpu_rand.h"

/* one of several logit shapes */
static void make_logits(float *l, int V, int kind) {
    for (int i = 0; i < V; i++) {
        switch (kind) {
        case 0: l[i] = nrand(); break;                             /* N(0,1) */
        case 1: l[i] = 5 * nrand(); break;                         /* peaked */
        case 2: l[i] = 0.05f * nrand(); break;                     /* flat */
        case 3: l[i] = roundf(4 * nrand()) / 4; break;             /* many exact ties */
        case 4: l[i] = urand() < 0.5 ? -INFINITY : 3 * nrand(); break; /* masked half */
        case 5: l[i] = 1.5f; break;                                /* all equal */
        default: l[i] = i == V / 3 ? 2.0f : -INFINITY; break;      /* one finite */
        }
    }
}

int main(void) {
    rs = 88172645463325252ull;
    char err[256];
    if (dsv4_cuda_init(0, NULL, err, sizeof err)) {
        fprintf(stderr, "test_sample: %s\n", err);
        return 1;
    }
    const int Vs[] = {1000, 50257, 129280};
    const int B = 16;
    int cases = 0, diff = 0, fail = 0;
    for (int vi = 0; vi < 3; vi++) {
        const int V = Vs[vi];
        float *h = malloc(sizeof(float) * (size_t)B * V);
        float *d = dsv4_cuda_alloc(sizeof(float) * (size_t)B * V);
        dsv4_cuda_sample_params hp[16], *dp = dsv4_cuda_alloc(sizeof hp);
        int32_t hout[16], *dout = dsv4_cuda_alloc(sizeof hout);
        const int rounds = V > 100000 ? 12 : 30;
        for (int round = 0; round < rounds; round++) {
            dsv4_sampling sp[16];
            for (int b = 0; b < B; b++) {
                make_logits(h + (size_t)b * V, V, (round + b) % 7);
                dsv4_sampling_defaults(&sp[b]);
                const float temps[] = {0, 0.7f, 1, 1.3f};
                const int topks[] = {0, 1, 5, 50, 2000};
                const float topps[] = {1, 0.9f, 0.5f, 0.01f};
                sp[b].temperature = temps[(b + round) % 4];
                sp[b].top_k = topks[(b / 2 + round) % 5];
                sp[b].top_p = topps[(b / 3 + round) % 4];
                sp[b].min_p = (b + round) % 5 == 0 ? 0.05f : 0;
                sp[b].seed = (uint64_t)(urand() * 1e15);
                hp[b] = (dsv4_cuda_sample_params){sp[b].temperature, sp[b].top_p, sp[b].min_p, sp[b].top_k, sp[b].seed,
                                                  (uint64_t)(urand() * 50)};
            }
            if (dsv4_cuda_upload(d, h, sizeof(float) * (size_t)B * V) || dsv4_cuda_upload(dp, hp, sizeof hp) ||
                dsv4_cuda_sample(d, V, B, V, dp, round & 1, dout, NULL) || dsv4_cuda_download(hout, dout, sizeof hout)) {
                fprintf(stderr, "test_sample: GPU: %s\n", dsv4_cuda_last_error());
                return 1;
            }
            for (int b = 0; b < B; b++) {
                dsv4_sampler *s = NULL;
                dsv4_err e = {0};
                if (dsv4_sampler_init(&s, &sp[b], V, &e)) {
                    fprintf(stderr, "sampler init: %s\n", e.msg);
                    return 1;
                }
                for (uint64_t k = 0; k < hp[b].step; k++) dsv4_sampler_accept(s, 0, &e);
                int32_t want = dsv4_sampler_sample(s, h + (size_t)b * V, &e);
                if (want < 0) want = strstr(e.msg, "-inf") ? -2 : -1;
                cases++;
                if (want != hout[b]) {
                    diff++;
                    printf("V %d round %d row %d (kind %d, T %.2f top_k %d top_p %.2f min_p %.2f step %llu): cpu %d gpu %d\n",
                           V, round, b, (round + b) % 7, sp[b].temperature, sp[b].top_k, sp[b].top_p, sp[b].min_p,
                           (unsigned long long)hp[b].step, want, hout[b]);
                }
                dsv4_sampler_free(s);
            }
            if (round & 1) { /* advance: every step moved on by one */
                dsv4_cuda_sample_params after[16];
                dsv4_cuda_download(after, dp, sizeof after);
                for (int b = 0; b < B; b++)
                    if (hout[b] >= 0 && after[b].step != hp[b].step + 1) {
                        printf("advance: row %d step %llu -> %llu\n", b, (unsigned long long)hp[b].step,
                               (unsigned long long)after[b].step);
                        fail++;
                    }
            }
        }
        /* error rows: NaN, +inf, all -inf */
        for (int b = 0; b < 3; b++) {
            for (int i = 0; i < V; i++) h[(size_t)b * V + i] = b == 2 ? -INFINITY : 0.0f;
            if (b < 2) h[(size_t)b * V + V / 2] = b == 0 ? NAN : INFINITY;
            hp[b] = (dsv4_cuda_sample_params){1.0f, 1.0f, 0.0f, 0, 1, 0};
        }
        dsv4_cuda_upload(d, h, sizeof(float) * 3 * (size_t)V);
        dsv4_cuda_upload(dp, hp, sizeof(hp[0]) * 3);
        dsv4_cuda_sample(d, V, 3, V, dp, 0, dout, NULL);
        dsv4_cuda_download(hout, dout, sizeof(int32_t) * 3);
        if (hout[0] != -1 || hout[1] != -1 || hout[2] != -2) {
            printf("V %d error rows: got %d %d %d, want -1 -1 -2\n", V, hout[0], hout[1], hout[2]);
            fail++;
        }
        free(h);
        dsv4_cuda_free(d), dsv4_cuda_free(dp), dsv4_cuda_free(dout);
    }
    printf("test_sample: %d cases, %d differ from the CPU sampler (allowed: < 1 in 1000 at rounding boundaries), "
           "%d other failures\n", cases, diff, fail);
    return fail || diff * 1000 >= cases ? 1 : 0;
}
