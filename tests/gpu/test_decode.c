/* test_decode.c - the GPU decode step (src/cuda/decode_graph.c) on real model directories, through the
 * public API (built and run by scripts/gpu_test.sh; no Criterion, so it builds on the GPU machine):
 *   1. CUDA graph replay is bitwise the same as the same steps launched one by one (DSV4_CUDA_GRAPHS
 *      off through dsv4_cuda_set_graphs), for batches of 1, 3, 5, 8, 40 and 300 sequences;
 *   2. batch invariance: a sequence's logits are bitwise the same alone (bucket 1), in a batch of 3
 *      (bucket 4, one idle slot), of 5 (bucket 8, three idle slots), of 8, of 40 (bucket 64: the linears'
 *      multi-token GEMM) and of 300 (bucket 512, past the multi-token GEMM's 256-row passes), with the other
 *      sequences at other positions;
 *   3. attention's parallel branches on stream2 (DSV4_CUDA_ATTN_FORK) bitwise the serial launches (batches 1 and 5);
 *   4. the device's sequence lengths equal the host's; a request past the context capacity
 *      (dsv4_set_max_context) is refused and leaves the sequence untouched;
 *   5. sampling inside the step (dsv4_decode_sample): the ids equal the CPU sampler (src/engine/sample.c)
 *      on the logits of the same step of an identical sequence, greedy and seeded temperature / top-k /
 *      top-p / min-p, with the last ids of the vocabulary masked, with graphs and without;
 *   6. sampling after a step of prompt chunks and decode tokens together (dsv4_forward_sample, a server's mixed
 *      step): each sequence's id equals the CPU sampler on dsv4_forward's logits of the same call on identical
 *      sequences (the same passes: the same bits), for a chunk that ends its prompt, one that does not, and a decode.
 * usage: test_decode MODEL_DIR...   exit 1 on any failure */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda/cuda_model.h"
#include "dsv4.h"
#include "engine/sample.h"
#include "model/state.h"

static int g_fail, g_checks;

/* token of sequence `seed` at position p: the same whatever the batch */
static int32_t tok_at(uint64_t seed, int p, int V) {
    uint64_t z = seed * 0x9E3779B97F4A7C15ull + (uint64_t)p * 0xBF58476D1CE4E5B9ull + 1;
    z ^= z >> 31, z *= 0x94D049BB133111EBull, z ^= z >> 29;
    return (int32_t)(2 + z % (uint64_t)(V - 2));
}

static void report(int ok, const char *what) {
    g_checks++;
    if (!ok) g_fail++;
    printf("%-4s %s\n", ok ? "ok" : "FAIL", what);
}

/* nb sequences, sequence i prefilled alone with len[i] tokens, then `steps` decode steps of all of them
 * together (logits of the last token); out [steps, V] = the logits of sequence `watch`. */
static int run(dsv4_model *m, int graphs, int nb, const int *len, const uint64_t *seed, int steps, int watch, float *out) {
    const dsv4_info info = dsv4_model_info(m);
    const int V = info.vocab_size;
    char err[1024];
    dsv4_cuda_set_graphs(m->gpu, graphs);
    dsv4_seq **sq = calloc((size_t)nb, sizeof *sq);
    int32_t *tok = malloc(sizeof(int32_t) * (size_t)(info.max_context + nb));
    const int32_t **tp = malloc(sizeof *tp * (size_t)nb);
    int *nt = malloc(sizeof(int) * (size_t)nb), rc = 0;
    float *lg = malloc(sizeof(float) * (size_t)V * nb);
    for (int i = 0; i < nb && !rc; i++) {
        sq[i] = dsv4_seq_new(m);
        for (int p = 0; p < len[i]; p++) tok[p] = tok_at(seed[i], p, V);
        const int32_t *t0 = tok;
        dsv4_seq_set_prefill(sq[i], len[i]);
        if (!sq[i] || dsv4_forward(m, 1, &sq[i], &t0, &len[i], NULL, DSV4_LOGITS_NONE, err, sizeof err))
            fprintf(stderr, "prefill: %s\n", err), rc = -1;
    }
    for (int k = 0; k < steps && !rc; k++) {
        for (int i = 0; i < nb; i++) {
            tok[info.max_context + i] = tok_at(seed[i], dsv4_seq_pos(sq[i]), V);
            tp[i] = &tok[info.max_context + i];
            nt[i] = 1;
        }
        if (dsv4_forward(m, nb, sq, tp, nt, lg, DSV4_LOGITS_LAST, err, sizeof err)) {
            fprintf(stderr, "decode: %s\n", err);
            rc = -1;
        } else {
            memcpy(out + (size_t)k * V, lg + (size_t)watch * V, sizeof(float) * (size_t)V);
        }
    }
    for (int i = 0; i < nb && !rc; i++) {
        dsv4_cuda_seq *gs = sq[i]->gpu;
        int dl = dsv4_cuda_seq_device_len(gs);
        if (dl != dsv4_seq_pos(sq[i])) {
            fprintf(stderr, "sequence %d: device length %d, host %d\n", i, dl, dsv4_seq_pos(sq[i]));
            rc = -1;
        }
    }
    for (int i = 0; i < nb; i++) dsv4_seq_free(sq[i]);
    free(sq), free(tok), free(tp), free(nt), free(lg);
    return rc;
}

static void same(const char *fx, const char *what, const float *a, const float *b, size_t n) {
    char line[640];
    size_t i = 0;
    while (i < n && !memcmp(a + i, b + i, sizeof(float))) i++;
    if (i == n) snprintf(line, sizeof line, "%s: %s (bitwise, %zu values)", fx, what, n);
    else snprintf(line, sizeof line, "%s: %s: first difference at %zu: %.9g vs %.9g", fx, what, i, a[i], b[i]);
    report(i == n, line);
}

/* Two identical sequences fed the same prompt; per step one goes through dsv4_forward + the CPU sampler,
 * the other through dsv4_decode_sample; both then take the CPU's token. */
static void test_sampling(dsv4_model *m, const char *fx, int graphs, const dsv4_sampling *sp, const char *what) {
    char err[1024], line[1600];
    const dsv4_info info = dsv4_model_info(m);
    const int V = info.vocab_size, nv = V - 3, P = info.max_context / 4, steps = 10;
    dsv4_cuda_set_graphs(m->gpu, graphs);
    dsv4_seq *a = dsv4_seq_new(m), *b = dsv4_seq_new(m);
    int32_t *prompt = malloc(sizeof(int32_t) * (size_t)P);
    float *lg = malloc(sizeof(float) * (size_t)V);
    dsv4_sampler *smp = NULL;
    dsv4_err e = {{0}};
    int ok = a && b && prompt && lg && !dsv4_sampler_init(&smp, sp, V, &e), diff = 0;
    for (int i = 0; ok && i < P; i++) prompt[i] = tok_at(99, i, V);
    const int32_t *tp = prompt;
    int nt = P - 1;
    ok = ok && !dsv4_forward(m, 1, &a, &tp, &nt, NULL, DSV4_LOGITS_NONE, err, sizeof err) &&
         !dsv4_forward(m, 1, &b, &tp, &nt, NULL, DSV4_LOGITS_NONE, err, sizeof err);
    int32_t t = prompt[P - 1];
    for (int k = 0; ok && k < steps; k++) {
        const int32_t *t1 = &t;
        int one = 1;
        dsv4_device_sampling ds = {sp->temperature, sp->top_p, sp->min_p, sp->top_k, sp->seed, dsv4_sampler_step(smp)};
        int32_t gid = -1;
        ok = !dsv4_forward(m, 1, &a, &t1, &one, lg, DSV4_LOGITS_LAST, err, sizeof err) &&
             !dsv4_decode_sample(m, 1, &b, &t, &ds, nv, &gid, err, sizeof err);
        if (!ok) break;
        for (int i = nv; i < V; i++) lg[i] = -INFINITY;
        int32_t cid = dsv4_sampler_sample(smp, lg, &e);
        ok = cid >= 0 && !dsv4_sampler_accept(smp, cid, &e);
        diff += gid != cid;
        t = cid;
    }
    ok = ok && dsv4_seq_pos(a) == dsv4_seq_pos(b) && dsv4_cuda_seq_device_len(b->gpu) == dsv4_seq_pos(b);
    snprintf(line, sizeof line, "%s: device sampling (%s, graphs %s): %d steps, %d ids differ from the CPU sampler%s%s", fx,
             what, graphs ? "on" : "off", steps, diff, ok ? "" : ": ", ok ? "" : err[0] ? err : e.msg);
    report(ok && diff == 0, line);
    dsv4_sampler_free(smp);
    dsv4_seq_free(a), dsv4_seq_free(b);
    free(prompt), free(lg);
}

/* N sequences in two identical sets; per call one set goes through dsv4_forward (LOGITS_LAST) + the CPU sampler, the
 * other through dsv4_forward_sample. Sequence i: i % 3 == 0 a prompt chunk that ends its prompt, 1 a chunk of a longer
 * prompt (its draw is compared too), 2 a decode token after its prompt; then the rest of the prompts with decodes, then
 * a decode step of all (graphs on). N 300 with P 8: a pass of 1,300 rows, whose 300 last rows go through the head (and
 * the sampler) in chunks of 256. */
static void test_forward_sample(dsv4_model *m, const char *fx, const dsv4_sampling *sp, const char *what, int N, int P) {
    char err[1024], line[1600];
    const dsv4_info info = dsv4_model_info(m);
    const int V = info.vocab_size, nv = V - 3;
    dsv4_cuda_set_graphs(m->gpu, 1);
    dsv4_seq **a = calloc((size_t)N, sizeof *a), **b = calloc((size_t)N, sizeof *b);
    dsv4_sampler **smp = calloc((size_t)N, sizeof *smp);
    int32_t *prompt = malloc(sizeof(int32_t) * (size_t)P * N), *last = calloc((size_t)N, sizeof(int32_t));
    int32_t *gid = malloc(sizeof(int32_t) * (size_t)N);
    int *fed = calloc((size_t)N, sizeof(int)), *nt = malloc(sizeof(int) * (size_t)N);
    const int32_t **tp = malloc(sizeof *tp * (size_t)N);
    dsv4_device_sampling *ds = malloc(sizeof *ds * (size_t)N);
    float *lg = malloc(sizeof(float) * (size_t)V * N);
    dsv4_err e = {{0}};
    int ok = a && b && smp && prompt && last && gid && fed && nt && tp && ds && lg, diff = 0, ncmp = 0;
    for (int i = 0; i < N && ok; i++) {
        a[i] = dsv4_seq_new(m), b[i] = dsv4_seq_new(m);
        dsv4_sampling si = *sp;
        si.seed = sp->seed + (uint64_t)i;
        ok = a[i] && b[i] && !dsv4_sampler_init(&smp[i], &si, V, &e);
    }
    for (int i = 0; ok && i < N * P; i++) prompt[i] = tok_at(55 + i / P, i % P, V);
    /* the decoding ones (i % 3 == 2) have their prompts in but the last token */
    for (int i = 2; ok && i < N; i += 3) {
        const int32_t *t0 = prompt + (size_t)i * P;
        int n0 = P - 1;
        fed[i] = P - 1;
        ok = !dsv4_forward(m, 1, &a[i], &t0, &n0, NULL, DSV4_LOGITS_NONE, err, sizeof err) &&
             !dsv4_forward(m, 1, &b[i], &t0, &n0, NULL, DSV4_LOGITS_NONE, err, sizeof err);
    }
    for (int call = 0; ok && call < 3; call++) {
        for (int i = 0; i < N; i++) {
            const int prompting = fed[i] < P;
            nt[i] = call == 0 ? (i % 3 == 0 ? P : i % 3 == 1 ? P / 2 : 1) : prompting ? P - fed[i] : 1;
            tp[i] = prompting ? prompt + (size_t)i * P + fed[i] : &last[i];
            ds[i] = (dsv4_device_sampling){sp->temperature, sp->top_p, sp->min_p, sp->top_k, sp->seed + (uint64_t)i,
                                           dsv4_sampler_step(smp[i])};
            gid[i] = -1;
        }
        ok = !dsv4_forward(m, N, a, tp, nt, lg, DSV4_LOGITS_LAST, err, sizeof err) &&
             !dsv4_forward_sample(m, N, b, tp, nt, ds, nv, gid, err, sizeof err);
        for (int i = 0; ok && i < N; i++) {
            float *row = lg + (size_t)i * V;
            for (int v = nv; v < V; v++) row[v] = -INFINITY;
            const int32_t cid = dsv4_sampler_sample(smp[i], row, &e);
            ok = cid >= 0;
            diff += gid[i] != cid, ncmp++;
            fed[i] += nt[i];
            if (ok && fed[i] >= P) { /* the prompt has ended (or the row decoded): the token is taken */
                ok = !dsv4_sampler_accept(smp[i], cid, &e);
                last[i] = cid;
            }
        }
    }
    for (int i = 0; ok && i < N; i++)
        ok = dsv4_seq_pos(a[i]) == dsv4_seq_pos(b[i]) && dsv4_cuda_seq_device_len(b[i]->gpu) == dsv4_seq_pos(b[i]);
    snprintf(line, sizeof line, "%s: forward_sample, %d sequences' prompt chunks with decodes (%s): %d draws, %d ids differ from the CPU sampler%s%s",
             fx, N, what, ncmp, diff, ok ? "" : ": ", ok ? "" : err[0] ? err : e.msg);
    report(ok && diff == 0 && ncmp == 3 * N, line);
    for (int i = 0; i < N; i++) {
        if (smp) dsv4_sampler_free(smp[i]);
        if (a) dsv4_seq_free(a[i]);
        if (b) dsv4_seq_free(b[i]);
    }
    free(a), free(b), free(smp), free(prompt), free(last), free(gid), free(fed), free(nt), free(tp), free(ds), free(lg);
}

/* Prompt (seed 77, P tokens), then steps decode tokens of seed cs; sequences: one fresh (fork 0), or the prompt
 * prefilled once and forked twice (fork 1: three sequences decoding together, the watched one a fork, the others
 * fed other continuations). out [steps, V]: the logits of the watched one. */
static int run_fork(dsv4_model *m, int fork, int P, int steps, float *out) {
    const int V = dsv4_model_info(m).vocab_size;
    char err[1024];
    int32_t *tok = malloc(sizeof(int32_t) * (size_t)P), nx[3];
    for (int p = 0; p < P; p++) tok[p] = tok_at(77, p, V);
    dsv4_seq *sq[3] = {dsv4_seq_new(m), NULL, NULL};
    const int32_t *tp[3] = {tok, nx + 1, nx + 2};
    int nt[3] = {P, 1, 1}, rc = !sq[0];
    float *lg = malloc(sizeof(float) * (size_t)V * 3);
    if (!rc) dsv4_seq_set_prefill(sq[0], P);
    if (!rc && dsv4_forward(m, 1, sq, tp, nt, NULL, DSV4_LOGITS_NONE, err, sizeof err)) fprintf(stderr, "prefill: %s\n", err), rc = -1;
    const int nb = fork ? 3 : 1, w = fork ? 1 : 0;
    for (int i = 1; i < nb && !rc; i++)
        if (!(sq[i] = dsv4_seq_fork(sq[0]))) rc = -1;
    for (int k = 0; k < steps && !rc; k++) {
        for (int i = 0; i < nb; i++) nx[i] = tok_at(i == w ? 1000 : 2000 + i, P + k, V), tp[i] = nx + i, nt[i] = 1;
        if (dsv4_forward(m, nb, sq, tp, nt, lg, DSV4_LOGITS_LAST, err, sizeof err)) fprintf(stderr, "decode: %s\n", err), rc = -1;
        else memcpy(out + (size_t)k * V, lg + (size_t)w * V, sizeof(float) * (size_t)V);
        if (k == 0 && fork) dsv4_seq_free(sq[0]), sq[0] = NULL; /* the source goes; its forks carry on */
        if (k == 0 && fork) sq[0] = dsv4_seq_fork(sq[2]), rc = !sq[0];
    }
    for (int i = 0; i < 3; i++) dsv4_seq_free(sq[i]);
    free(tok), free(lg);
    return rc;
}

static int test_model(const char *dir) {
    char err[1024];
    const char *fx = strrchr(dir, '/') ? strrchr(dir, '/') + 1 : dir;
    dsv4_model *m = NULL;
    if (dsv4_load(dir, &m, err, sizeof err) || dsv4_set_device(m, "cuda", err, sizeof err)) {
        fprintf(stderr, "%s: %s\n", dir, err);
        dsv4_free(m);
        return -1;
    }
    const dsv4_info info = dsv4_model_info(m);
    const int V = info.vocab_size, cap = info.max_context;
    int steps = cap / 8 < 12 ? cap / 8 : 12;
    const int P = cap / 2; /* the watched sequence: past the window, several compressed entries */
    const uint64_t S0 = 77;
    int len1[1] = {P}, len3[3] = {P, cap / 4 + 3, 5}, len5[5] = {9, cap / 3, P, 1, cap / 2 + 7};
    int len8[8] = {3, cap / 3, 17, cap / 4, 40 < cap / 2 ? 40 : cap / 2, P, 2, cap / 2 + 5};
    uint64_t s1[1] = {S0}, s3[3] = {S0, 5, 6}, s5[5] = {9, 10, S0, 11, 12}, s8[8] = {21, 22, 23, 24, 25, S0, 26, 27};
    int len40[40], len300[300];
    uint64_t s40[40], s300[300];
    for (int i = 0; i < 40; i++) len40[i] = i == 20 ? P : 1 + (i * 7) % (cap / 2), s40[i] = i == 20 ? S0 : 100 + (uint64_t)i;
    for (int i = 0; i < 300; i++) len300[i] = i == 150 ? P : 1 + (i * 11) % (cap / 2), s300[i] = i == 150 ? S0 : 1000 + (uint64_t)i;
    const size_t n = (size_t)steps * V;
    float *a[2], *b3[2], *b5[2], *b8[2], *b40[2], *b300[2];
    int rc = 0;
    for (int gr = 1; gr >= 0 && !rc; gr--) {
        a[gr] = malloc(sizeof(float) * n), b3[gr] = malloc(sizeof(float) * n);
        b5[gr] = malloc(sizeof(float) * n), b8[gr] = malloc(sizeof(float) * n), b40[gr] = malloc(sizeof(float) * n);
        b300[gr] = malloc(sizeof(float) * n);
        rc = run(m, gr, 1, len1, s1, steps, 0, a[gr]) || run(m, gr, 3, len3, s3, steps, 0, b3[gr]) ||
             run(m, gr, 5, len5, s5, steps, 2, b5[gr]) || run(m, gr, 8, len8, s8, steps, 5, b8[gr]) ||
             run(m, gr, 40, len40, s40, steps, 20, b40[gr]) || run(m, gr, 300, len300, s300, steps, 150, b300[gr]);
    }
    report(!rc, "decode runs (device lengths == host positions)");
    {
        char line[256];
        int ng = dsv4_cuda_graphs_captured(m->gpu);
        snprintf(line, sizeof line, "%s: %d decode graphs captured (buckets 1, 4, 8, 64, 512: layers + head)", fx, ng);
        report(ng == 10, line);
    }
    {
        dsv4_sampling sp;
        dsv4_sampling_defaults(&sp);
        sp.temperature = 0;
        test_sampling(m, fx, 1, &sp, "greedy");
        sp.temperature = 0.8f, sp.top_p = 0.9f, sp.seed = 7;
        test_sampling(m, fx, 1, &sp, "T 0.8 top_p 0.9");
        sp.temperature = 1.0f, sp.top_p = 1.0f, sp.top_k = 20, sp.min_p = 0.05f, sp.seed = 12345;
        test_sampling(m, fx, 1, &sp, "top_k 20 min_p 0.05");
        test_sampling(m, fx, 0, &sp, "top_k 20 min_p 0.05");
        {
            const int Pf = info.max_context / 8 > 8 ? info.max_context / 8 : 8;
            test_forward_sample(m, fx, &sp, "top_k 20 min_p 0.05", 3, Pf);
            sp.temperature = 0;
            test_forward_sample(m, fx, &sp, "greedy", 3, Pf);
            test_forward_sample(m, fx, &sp, "greedy", 300, 8);
        }
    }
    if (!rc) {
        char w[128];
        snprintf(w, sizeof w, "%d steps from position %d: graph == no graph, batch 1", steps, P);
        same(fx, w, a[1], a[0], n);
        same(fx, "graph == no graph, batch 3", b3[1], b3[0], n);
        same(fx, "graph == no graph, batch 5 (bucket 8)", b5[1], b5[0], n);
        same(fx, "graph == no graph, batch 8", b8[1], b8[0], n);
        same(fx, "batch invariance: alone == in a batch of 3", a[1], b3[1], n);
        same(fx, "batch invariance: alone == in a batch of 5", a[1], b5[1], n);
        same(fx, "graph == no graph, batch 40 (bucket 64)", b40[1], b40[0], n);
        same(fx, "batch invariance: alone == in a batch of 8", a[1], b8[1], n);
        same(fx, "batch invariance: alone == in a batch of 40", a[1], b40[1], n);
        same(fx, "graph == no graph, batch 300 (bucket 512)", b300[1], b300[0], n);
        same(fx, "batch invariance: alone == in a batch of 300", a[1], b300[1], n);
        /* attention's second stream (the indexer, compressors, query heads, tail work) off: the serial order of an op
         * profile, the same kernels on the same data, so the same bits (prefill chunks below 64 rows included) */
        float *s1o = malloc(sizeof(float) * n), *s5o = malloc(sizeof(float) * n);
        const int was = dsv4_cuda_set_attn_fork(m->gpu, 0);
        const int src = run(m, 0, 1, len1, s1, steps, 0, s1o) || run(m, 0, 5, len5, s5, steps, 2, s5o);
        dsv4_cuda_set_attn_fork(m->gpu, was);
        report(!src, "serial decode runs");
        if (!src && was) {
            same(fx, "second stream == serial, batch 1", a[0], s1o, n);
            same(fx, "second stream == serial, batch 5", b5[0], s5o, n);
        }
        free(s1o), free(s5o);
        for (int gr = 0; gr < 2; gr++) free(a[gr]), free(b3[gr]), free(b5[gr]), free(b8[gr]), free(b40[gr]), free(b300[gr]);
    }
    { /* freed sequences' states stay in the model's pool: every run above after the first took them (so "graph == no
       * graph, batch 1" compared a fresh allocation with a reused state); a sequence made and freed leaves the room
       * dsv4_device_limits reports as it was */
        int rows = 0, rows2 = 0;
        long fit = 0, fit2 = 0;
        dsv4_seq *t0 = dsv4_seq_new(m); /* (the pool then holds a state whatever ran before) */
        dsv4_seq_free(t0);
        int lrc = !t0 || dsv4_device_limits(m, &rows, &fit);
        dsv4_seq *t = dsv4_seq_new(m);
        dsv4_seq_free(t);
        lrc = lrc || !t || dsv4_device_limits(m, &rows2, &fit2);
        char line[256];
        snprintf(line, sizeof line, "%s: device limits: passes of %d rows, room for %ld sequences (%ld after one made and freed)",
                 fx, rows, fit, fit2);
        report(!lrc && rows > 0 && fit > 0 && fit2 == fit && rows2 == rows, line);
    }
    { /* dsv4_seq_fork: a forked prompt continues as a fresh sequence fed the same tokens (graphs on) */
        float *fr = malloc(sizeof(float) * n), *fk = malloc(sizeof(float) * n);
        dsv4_cuda_set_graphs(m->gpu, 1);
        int frc = run_fork(m, 0, P, steps, fr) || run_fork(m, 1, P, steps, fk);
        report(!frc, "fork runs");
        if (!frc) same(fx, "a fork (in a batch of 3 forks of one prompt) == a fresh sequence", fr, fk, n);
        free(fr), free(fk);
    }
    dsv4_free(m);

    /* the context capacity */
    m = NULL;
    if (dsv4_load(dir, &m, err, sizeof err)) return -1;
    int c = cap / 2;
    int ok = !dsv4_set_max_context(m, c, err, sizeof err) && !dsv4_set_device(m, "cuda", err, sizeof err) &&
             dsv4_model_info(m).max_context == c;
    dsv4_seq *s = ok ? dsv4_seq_new(m) : NULL;
    int32_t *tok = calloc((size_t)c + 8, sizeof(int32_t));
    const int32_t *tp = tok;
    int nt = c - 4;
    ok = ok && s && !dsv4_forward(m, 1, &s, &tp, &nt, NULL, DSV4_LOGITS_NONE, err, sizeof err);
    nt = 5;
    ok = ok && dsv4_forward(m, 1, &s, &tp, &nt, NULL, DSV4_LOGITS_NONE, err, sizeof err) && strstr(err, "capacity") &&
         dsv4_seq_pos(s) == c - 4 && dsv4_cuda_seq_device_len(s->gpu) == c - 4;
    nt = 4;
    ok = ok && !dsv4_forward(m, 1, &s, &tp, &nt, NULL, DSV4_LOGITS_NONE, err, sizeof err) && dsv4_seq_pos(s) == c;
    ok = ok && dsv4_set_max_context(m, c + 1, err, sizeof err) && strstr(err, "before dsv4_set_device");
    char line[1400];
    snprintf(line, sizeof line, "%s: context capacity %d: filled to it, a request past it refused (%s)", fx, c, ok ? "ok" : err);
    report(ok, line);
    free(tok);
    dsv4_seq_free(s);
    dsv4_free(m);
    return rc;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: test_decode MODEL_DIR...\n");
        return 2;
    }
    for (int i = 1; i < argc; i++)
        if (test_model(argv[i])) g_fail++;
    printf("decode tests: %d checks, %d failed\n", g_checks, g_fail);
    return g_fail ? 1 : 0;
}
