/* test_engine.c - sequences: chunked prefill equals one-shot prefill; a batch equals its sequences
 * run alone (bitwise); mixed lengths and positions in one forward; bad requests rejected. */
#include <criterion/criterion.h>

#include "model_util.h"

static int32_t *random_tokens(int n, int V, unsigned seed) {
    int32_t *t = malloc(sizeof(int32_t) * (size_t)n);
    for (int i = 0; i < n; i++) {
        seed = seed * 1103515245u + 12345u;
        t[i] = (int32_t)((seed >> 8) % (unsigned)V);
    }
    return t;
}

/* Chunk sizes that divide neither the window (8 / 16) nor the compress ratios (4, 16, 32). */
static void check_chunking(const char *fx, int L, int prefill) {
    dsv4_model *m = load_fixture(fx);
    cr_assert(m);
    int V = dsv4_model_info(m).vocab_size;
    int32_t *tok = random_tokens(L, V, 7);
    float *ref = malloc(sizeof(float) * (size_t)L * V), *got = malloc(sizeof(float) * (size_t)L * V);
    cr_assert(!run_schedule(m, tok, 1, L, prefill, 0, ref));
    int chunks[] = {1, 3, 5, 7, 13, 33};
    for (size_t i = 0; i < sizeof chunks / sizeof chunks[0]; i++) {
        cr_assert(!run_schedule(m, tok, 1, L, prefill, chunks[i], got));
        double rel = dsv4_rel_l2(got, ref, (size_t)L * V);
        cr_expect(rel < 1e-6, "%s: chunk %d vs one-shot prefill: relative L2 %.3e", fx, chunks[i], rel);
    }
    free(tok), free(ref), free(got);
    dsv4_free(m);
}

Test(engine, chunked_prefill_tiny_bf16, .timeout = 300) { check_chunking("tiny-bf16", 70, 61); }
Test(engine, chunked_prefill_small_fp8, .timeout = 300) { check_chunking("small-fp8-fp4", 80, 71); }

/* Several sequences of different lengths at different positions, fed in random chunks together,
 * must give bitwise the logits of each sequence run alone with the same chunks. */
Test(engine, batch_invariance_mixed_positions, .timeout = 300) {
    const char *fxs[] = {"tiny-bf16", "small-fp8-fp4"};
    for (int f = 0; f < 2; f++) {
        dsv4_model *m = load_fixture(fxs[f]);
        cr_assert(m);
        int V = dsv4_model_info(m).vocab_size;
        enum { NS = 3, STEPS = 12 };
        int len[NS] = {0}, sched[STEPS][NS];
        unsigned seed = 99;
        for (int st = 0; st < STEPS; st++)
            for (int s = 0; s < NS; s++) {
                seed = seed * 1103515245u + 12345u;
                int n = (int)((seed >> 10) % 6); /* 0..5 tokens, 0 = sits out */
                if (st == 0 && s == 1) n = 0;     /* sequence 1 starts late */
                sched[st][s] = n;
                len[s] += n;
            }
        int32_t *tok[NS];
        float *alone[NS], *batched[NS];
        for (int s = 0; s < NS; s++) {
            tok[s] = random_tokens(len[s] + 1, V, 1000 + s);
            alone[s] = calloc((size_t)(len[s] + 1) * V, sizeof(float));
            batched[s] = calloc((size_t)(len[s] + 1) * V, sizeof(float));
        }
        char err[1024];
        float *lg = malloc(sizeof(float) * (size_t)NS * 6 * V);
        /* alone */
        for (int s = 0; s < NS; s++) {
            dsv4_seq *q = dsv4_seq_new(m);
            int p = 0;
            for (int st = 0; st < STEPS; st++) {
                int n = sched[st][s];
                if (!n) continue;
                const int32_t *tp = tok[s] + p;
                cr_assert(!dsv4_forward(m, 1, &q, &tp, &n, lg, DSV4_LOGITS_ALL, err, sizeof err), "%s", err);
                memcpy(alone[s] + (size_t)p * V, lg, sizeof(float) * (size_t)n * V);
                p += n;
            }
            dsv4_seq_free(q);
        }
        /* together */
        dsv4_seq *q[NS];
        int pos[NS] = {0};
        for (int s = 0; s < NS; s++) q[s] = dsv4_seq_new(m);
        for (int st = 0; st < STEPS; st++) {
            dsv4_seq *bs[NS];
            const int32_t *tp[NS];
            int nt[NS], who[NS], nb = 0;
            for (int s = 0; s < NS; s++)
                if (sched[st][s] || st % 3 == 0) { /* zero-token members are allowed too */
                    bs[nb] = q[s], tp[nb] = tok[s] + pos[s], nt[nb] = sched[st][s], who[nb++] = s;
                }
            cr_assert(!dsv4_forward(m, nb, bs, tp, nt, lg, DSV4_LOGITS_ALL, err, sizeof err), "%s", err);
            size_t off = 0;
            for (int i = 0; i < nb; i++) {
                int s = who[i];
                memcpy(batched[s] + (size_t)pos[s] * V, lg + off, sizeof(float) * (size_t)nt[i] * V);
                off += (size_t)nt[i] * V;
                pos[s] += nt[i];
            }
        }
        for (int s = 0; s < NS; s++) {
            cr_expect(dsv4_seq_pos(q[s]) == len[s]);
            cr_expect(!memcmp(alone[s], batched[s], sizeof(float) * (size_t)len[s] * V),
                      "%s: sequence %d differs when batched", fxs[f], s);
            dsv4_seq_free(q[s]);
            free(tok[s]), free(alone[s]), free(batched[s]);
        }
        free(lg);
        dsv4_free(m);
    }
}

/* A fork continues exactly as its source would: the source and its fork, fed different continuations after a
 * shared prompt (longer than the window, past several compressor emissions), give bitwise the logits of fresh
 * sequences fed prompt + continuation with the same chunks; the source is freed before the fork finishes. */
static void check_fork(const char *fx) {
    dsv4_model *m = load_fixture(fx);
    cr_assert(m);
    const int V = dsv4_model_info(m).vocab_size, P = 37, N = 21;
    int32_t *a = random_tokens(P + N, V, 5), *b = random_tokens(P + N, V, 6);
    memcpy(b, a, sizeof(int32_t) * P); /* b: the same prompt, another continuation */
    float *ref_a = malloc(sizeof(float) * (size_t)(P + N) * V), *ref_b = malloc(sizeof(float) * (size_t)(P + N) * V);
    float *lg = malloc(sizeof(float) * (size_t)P * V), *got_a = malloc(sizeof(float) * (size_t)N * V),
          *got_b = malloc(sizeof(float) * (size_t)N * V);
    cr_assert(!run_schedule(m, a, 1, P + N, P, 10, ref_a));
    cr_assert(!run_schedule(m, b, 1, P + N, P, 10, ref_b));
    char err[1024];
    dsv4_seq *s = dsv4_seq_new(m);
    dsv4_seq_set_prefill(s, P);
    for (int p = 0; p < P; p += 10) {
        const int32_t *tp = a + p;
        int n = P - p < 10 ? P - p : 10;
        cr_assert(!dsv4_forward(m, 1, &s, &tp, &n, lg, DSV4_LOGITS_ALL, err, sizeof err), "%s", err);
    }
    dsv4_seq *f = dsv4_seq_fork(s);
    cr_assert(f);
    cr_expect(dsv4_seq_pos(f) == P);
    for (int i = 0; i < N; i++) {
        dsv4_seq *both[2] = {s, f};
        const int32_t *tp[2] = {a + P + i, b + P + i};
        int nt[2] = {1, 1};
        cr_assert(!dsv4_forward(m, 2, both, tp, nt, lg, DSV4_LOGITS_ALL, err, sizeof err), "%s", err);
        memcpy(got_a + (size_t)i * V, lg, sizeof(float) * (size_t)V);
        memcpy(got_b + (size_t)i * V, lg + V, sizeof(float) * (size_t)V);
        if (i == N / 2) { /* the source goes; the fork must not notice */
            cr_expect(!memcmp(got_a, ref_a + (size_t)P * V, sizeof(float) * (size_t)(N / 2 + 1) * V),
                      "%s: the source differs after the fork", fx);
            dsv4_seq_free(s);
            s = dsv4_seq_fork(f); /* and a fork of the fork carries on the source's role with b's tokens */
            cr_assert(s);
            memcpy(a, b, sizeof(int32_t) * (size_t)(P + N));
            memcpy(ref_a, ref_b, sizeof(float) * (size_t)(P + N) * V);
        }
    }
    cr_expect(!memcmp(got_b, ref_b + (size_t)P * V, sizeof(float) * (size_t)N * V), "%s: the fork differs", fx);
    cr_expect(!memcmp(got_a + (size_t)(N / 2 + 1) * V, ref_a + (size_t)(P + N / 2 + 1) * V,
                      sizeof(float) * (size_t)(N - N / 2 - 1) * V), "%s: the fork of the fork differs", fx);
    dsv4_seq_free(s), dsv4_seq_free(f);
    free(a), free(b), free(ref_a), free(ref_b), free(lg), free(got_a), free(got_b);
    dsv4_free(m);
}

Test(engine, fork_continues_exactly, .timeout = 300) {
    check_fork("tiny-bf16");
    check_fork("small-fp8-fp4");
}

Test(engine, bad_requests) {
    dsv4_model *m = load_fixture("tiny-bf16");
    cr_assert(m);
    dsv4_seq *s = dsv4_seq_new(m);
    char err[1024] = "";
    int32_t bad[2] = {5, 512};
    const int32_t *tp = bad;
    int n = 2;
    float lg[2 * 512];
    cr_expect(dsv4_forward(m, 1, &s, &tp, &n, lg, DSV4_LOGITS_ALL, err, sizeof err));
    cr_expect(strstr(err, "outside the vocabulary"), "%s", err);
    cr_expect(dsv4_seq_pos(s) == 0, "a rejected request leaves the sequence untouched");
    bad[1] = -1;
    cr_expect(dsv4_forward(m, 1, &s, &tp, &n, lg, DSV4_LOGITS_ALL, err, sizeof err));
    dsv4_seq *two[2] = {s, s};
    const int32_t *tps[2] = {bad, bad};
    int ns[2] = {1, 1};
    bad[0] = 3;
    cr_expect(dsv4_forward(m, 2, two, tps, ns, lg, DSV4_LOGITS_ALL, err, sizeof err));
    cr_expect(strstr(err, "twice"), "%s", err);
    /* past max_position_embeddings (128) */
    int32_t *many = calloc(200, sizeof(int32_t));
    const int32_t *mp = many;
    n = 200;
    cr_expect(dsv4_forward(m, 1, &s, &mp, &n, NULL, DSV4_LOGITS_NONE, err, sizeof err));
    cr_expect(strstr(err, "max_position_embeddings"), "%s", err);
    free(many);
    /* the CPU backend does not sample on a device: no decode_sample batch at all, and a call says why */
    cr_expect(!dsv4_can_decode_sample(m) && dsv4_decode_sample_max(m) == 0);
    dsv4_device_sampling ds = {0};
    int32_t next = 0;
    bad[0] = 3;
    cr_expect(dsv4_decode_sample(m, 1, &s, bad, &ds, 512, &next, err, sizeof err));
    cr_expect(strstr(err, "decode_sample"), "%s", err);
    /* nor after chunks (dsv4_forward_sample), and the sequence is left as it was */
    const int32_t *bp = bad;
    const int pos0 = dsv4_seq_pos(s);
    n = 1;
    cr_expect(dsv4_forward_sample(m, 1, &s, &bp, &n, &ds, 512, &next, err, sizeof err));
    cr_expect(strstr(err, "forward_sample") && strstr(err, "dsv4_forward"), "%s", err);
    cr_expect(dsv4_seq_pos(s) == pos0);
    /* the CPU has no pass size or sequence limit to size a server by */
    int rows = 7;
    long seqs = 7;
    cr_expect(dsv4_device_limits(m, &rows, &seqs) == 0 && rows == 0 && seqs == -1, "rows %d seqs %ld", rows, seqs);
    dsv4_seq_free(s);
    dsv4_free(m);
}
