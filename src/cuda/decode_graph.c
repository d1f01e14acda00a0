/* decode_graph.c - the decode step on the GPU: every sequence of the call gets at most one token, 1 ..
 * dsv4_cuda_decode_max tokens in all. The step is padded to its bucket B = 1, 2, 4, .. 1024 (idle rows and slots: no
 * sequence, no state touched) so that its launch shapes depend only on B; the layers (embedding through
 * the last block and the device lengths) and the head (HcHead, norm, logits of all B rows) are each
 * captured into a CUDA graph the first time a bucket is used and replayed afterwards. Per step the host
 * fills the pinned step input (tokens, positions, sequence pointers), uploads it in one copy, launches
 * the graphs and downloads the logits; it never reads device values in between. With graphs off
 * (DSV4_CUDA_GRAPHS=0, dsv4_cuda_set_graphs) the same launches run one by one: bitwise the same result.
 * If a capture fails, that step runs launch by launch and the next step of the bucket captures again; after
 * a second failure graphs stay off (stderr says why). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpu_internal.h"

#define FAIL_HERE(what) gpu_fail("decode_graph.c", __LINE__, (what))

static int bucket_of(int T) {
    int k = 0;
    while ((1 << k) < T) k++;
    return k;
}

/* the largest bucket: GB_MAX, or the largest power of two within the passes' rows (the step buffer and workspace
 * are sized for tmax rows; DSV4_CUDA_TMAX may be as low as 64) */
int dsv4_cuda_decode_max(const dsv4_cuda_model *g) {
    int b = GB_MAX;
    while (b > 1 && b > g->tmax) b >>= 1;
    return b;
}

enum { PART_LAYERS, PART_HEAD, PART_SAMPLE };

static int enqueue(dsv4_cuda_model *g, int part, const gws *w, const dsv4_cuda_batch *b, int nv) {
    if (part == PART_SAMPLE)
        return dsv4_cuda_sample(w->logits, g->m->cfg.vocab_size, b->T, nv, g->dsp, 0, g->dids, g->stream)
                   ? FAIL_HERE(dsv4_cuda_last_error())
                   : 0;
    return part == PART_HEAD ? gpu_run_head(g, w, b->T) : gpu_run_layers(g, w, b);
}

/* One part of a bucket's step (the layers, the head, or the sampler over the first nv logits): through its
 * graph (captured now if it does not exist yet), or launch by launch. */
static int run_part(dsv4_cuda_model *g, gbucket *bk, int part, const gws *w, const dsv4_cuda_batch *b, int nv) {
    void **ex = part == PART_SAMPLE ? &bk->samp : part == PART_HEAD ? &bk->head : &bk->layers;
    if (part == PART_SAMPLE && *ex && bk->samp_nv != nv) { /* n_vocab is an argument baked into the graph */
        dsv4_cuda_graph_free(*ex);
        *ex = NULL;
    }
    if (part == PART_SAMPLE) bk->samp_nv = nv;
    if (g->graphs && !*ex) {
        if (dsv4_cuda_capture_begin(g->stream)) return FAIL_HERE(dsv4_cuda_last_error());
        g->capturing = 1;
        int rc = enqueue(g, part, w, b, nv);
        g->capturing = 0;
        void *e = NULL;
        int rc2 = dsv4_cuda_capture_end(g->stream, &e);
        if (rc || rc2) {
            /* nothing ran: run this step launch by launch (which also loads any kernel not loaded yet) and
             * try to capture again next time; after a second failure, stay without graphs */
            bk->failed++;
            fprintf(stderr, "dsv4: CUDA graph capture of the decode step (bucket %d) failed: %s%s\n", b->T,
                    rc ? gpu_err() : dsv4_cuda_last_error(), bk->failed > 1 ? "; decode steps run without graphs" : "");
            dsv4_cuda_graph_free(e);
            gpu_err_clear();
            if (bk->failed > 1) g->graphs = 0;
            return enqueue(g, part, w, b, nv);
        }
        *ex = e;
    }
    if (g->graphs && *ex) return dsv4_cuda_graph_launch(*ex, g->stream) ? FAIL_HERE(dsv4_cuda_last_error()) : 0;
    return enqueue(g, part, w, b, nv);
}

/* Fills and uploads the step input of a decode step (tokens in call order, then idle rows / slots up to the
 * bucket), carves the bucket's workspace; *T = the call's tokens, *k = the bucket. */
static int step_begin(dsv4_cuda_model *g, int nseq, dsv4_cuda_seq *const *seqs, const int32_t *const *tokens,
                      const int *ntok, int *Tout, int *kout, gws *w, dsv4_cuda_batch *b) {
    int T = 0;
    for (int s = 0; s < nseq; s++) T += ntok[s] > 0;
    const int k = bucket_of(T), B = 1 << k;
    gstepl l;
    gpu_step_layout(B, B, &l);
    uint8_t *h = g->hstep;
    int *tok = (int *)(h + l.tok), *pos = (int *)(h + l.pos), *sid = (int *)(h + l.sid);
    int *p0 = (int *)(h + l.p0), *n = (int *)(h + l.n), *off = (int *)(h + l.off);
    int *cend = (int *)(h + l.cend), *pe = (int *)(h + l.pe);
    dsv4_cuda_seqdev **sq = (dsv4_cuda_seqdev **)(h + l.sq);
    int t = 0;
    for (int s = 0; s < nseq; s++) {
        if (ntok[s] <= 0) continue;
        tok[t] = tokens[s][0], pos[t] = p0[t] = seqs[s]->pos, sid[t] = t, n[t] = 1, off[t] = t, sq[t] = seqs[s]->dev;
        cend[t] = seqs[s]->pos + 1, pe[t] = seqs[s]->prefill_end;
        t++;
    }
    for (; t < B; t++) tok[t] = pos[t] = p0[t] = n[t] = cend[t] = pe[t] = 0, sid[t] = -1, off[t] = t, sq[t] = NULL;
    g->last_bucket = -1;
    if (dsv4_cuda_upload_async(g->dstep, h, l.bytes, g->stream)) return FAIL_HERE(dsv4_cuda_last_error());
    *b = gpu_batch_at(g, B, B);
    gpu_ws_carve(g, B, w);
    gpu_ws_decode_mode(w);
    *Tout = T;
    *kout = k;
    return 0;
}

int gpu_decode(dsv4_cuda_model *g, int nseq, dsv4_cuda_seq *const *seqs, const int32_t *const *tokens, const int *ntok,
               float *logits, int mode) {
    const int V = g->m->cfg.vocab_size;
    int T, k;
    gws w;
    dsv4_cuda_batch b;
    if (step_begin(g, nseq, seqs, tokens, ntok, &T, &k, &w, &b)) return -1;
    gbucket *bk = &g->bk[k];
    if (run_part(g, bk, PART_LAYERS, &w, &b, 0)) return -1;
    if (mode != DSV4_LOGITS_NONE && logits) {
        if (run_part(g, bk, PART_HEAD, &w, &b, 0)) return -1;
        /* the rows of the call's tokens come first: [T, V] is the answer for both ALL and LAST */
        if (dsv4_cuda_download_async(logits, w.logits, sizeof(float) * (size_t)T * V, g->stream))
            return FAIL_HERE(dsv4_cuda_last_error());
    }
    if (dsv4_cuda_stream_sync(g->stream)) return FAIL_HERE(dsv4_cuda_last_error());
    g->last_bucket = k;
    return 0;
}

int dsv4_cuda_decode_sample(dsv4_cuda_model *g, int nseq, dsv4_cuda_seq *const *seqs, const int32_t *tokens,
                            const dsv4_cuda_sample_params *sp, int n_vocab, int32_t *next, char *err, size_t errcap) {
    const int V = g->m->cfg.vocab_size;
#define SFAIL(...) do { if (err && errcap) snprintf(err, errcap, __VA_ARGS__); return -1; } while (0)
    if (nseq < 1 || nseq > dsv4_cuda_decode_max(g)) SFAIL("decode_sample: %d sequences (1 .. %d)", nseq, dsv4_cuda_decode_max(g));
    if (n_vocab < 1 || n_vocab > V) SFAIL("decode_sample: n_vocab %d outside 1 .. %d", n_vocab, V);
    const int32_t *tp[GB_MAX];
    int nt[GB_MAX];
    for (int s = 0; s < nseq; s++) tp[s] = &tokens[s], nt[s] = 1;
    gpu_err_clear();
    int T, k;
    gws w;
    dsv4_cuda_batch b;
    if (step_begin(g, nseq, seqs, tp, nt, &T, &k, &w, &b)) SFAIL("decode_sample (GPU): %s", gpu_err());
    /* the parameters of the call's rows, then greedy idle rows (their ids are not read) */
    const int B = 1 << k;
    for (int t = 0; t < B; t++) g->hsp[t] = t < T ? sp[t] : (dsv4_cuda_sample_params){0.0f, 1.0f, 0.0f, 0, 0, 0};
    gbucket *bk = &g->bk[k];
    if (dsv4_cuda_upload_async(g->dsp, g->hsp, sizeof *g->hsp * (size_t)B, g->stream) ||
        run_part(g, bk, PART_LAYERS, &w, &b, 0) || run_part(g, bk, PART_HEAD, &w, &b, 0) ||
        run_part(g, bk, PART_SAMPLE, &w, &b, n_vocab) ||
        dsv4_cuda_download_async(g->hids, g->dids, sizeof(int32_t) * (size_t)T, g->stream) ||
        dsv4_cuda_stream_sync(g->stream))
        SFAIL("decode_sample (GPU): %s", gpu_err()[0] ? gpu_err() : dsv4_cuda_last_error());
    g->last_bucket = k;
    for (int s = 0; s < nseq; s++) seqs[s]->pos += 1;
    for (int t = 0; t < T; t++) next[t] = g->hids[t];
    return gpu_ids_ok(next, T, "decode_sample", err, errcap); /* (-2: the step itself ran, the tokens are consumed) */
#undef SFAIL
}

int gpu_ids_ok(const int32_t *next, int n, const char *what, char *err, size_t errcap) {
    for (int s = 0; s < n; s++)
        if (next[s] < 0) {
            if (err && errcap)
                snprintf(err, errcap, "%s: sequence %d: the logits are %s", what, s, next[s] == -1 ? "NaN or +inf" : "all -inf");
            return -2;
        }
    return 0;
}

int dsv4_cuda_graphs_captured(const dsv4_cuda_model *g) {
    int n = 0;
    for (int i = 0; i < GB_N; i++) n += (g->bk[i].layers != NULL) + (g->bk[i].head != NULL) + (g->bk[i].samp != NULL);
    return n;
}

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int dsv4_cuda_decode_replay_ms(dsv4_cuda_model *g, int batch, int iters, double *layers_ms, double *step_ms) {
    if (batch < 1 || batch > dsv4_cuda_decode_max(g) || iters < 1) return -1;
    const int k = bucket_of(batch);
    gbucket *bk = &g->bk[k];
    if (!g->graphs || g->last_bucket != k || !bk->layers || !bk->head) return -1;
    void *e0 = dsv4_cuda_event_new(), *e1 = dsv4_cuda_event_new(), *e2 = dsv4_cuda_event_new();
    double *a = malloc(sizeof(double) * (size_t)iters), *s = malloc(sizeof(double) * (size_t)iters);
    int rc = e0 && e1 && e2 && a && s ? 0 : -1;
    for (int i = 0; i < iters && !rc; i++) {
        rc = dsv4_cuda_event_record(e0, g->stream) || dsv4_cuda_graph_launch(bk->layers, g->stream) ||
             dsv4_cuda_event_record(e1, g->stream) || dsv4_cuda_graph_launch(bk->head, g->stream) ||
             dsv4_cuda_event_record(e2, g->stream);
        if (!rc) {
            a[i] = dsv4_cuda_event_ms(e0, e1);
            s[i] = dsv4_cuda_event_ms(e0, e2);
            rc = a[i] < 0 || s[i] < 0;
        }
    }
    if (!rc) {
        qsort(a, (size_t)iters, sizeof *a, cmp_d);
        qsort(s, (size_t)iters, sizeof *s, cmp_d);
        *layers_ms = iters % 2 ? a[iters / 2] : 0.5 * (a[iters / 2 - 1] + a[iters / 2]);
        *step_ms = iters % 2 ? s[iters / 2] : 0.5 * (s[iters / 2 - 1] + s[iters / 2]);
    }
    dsv4_cuda_event_free(e0), dsv4_cuda_event_free(e1), dsv4_cuda_event_free(e2);
    free(a), free(s);
    return rc ? -1 : 0;
}

int dsv4_cuda_decode_profile(dsv4_cuda_model *g, int batch, int iters, FILE *out, dsv4_cuda_prof_split *sp) {
    if (batch < 1 || batch > dsv4_cuda_decode_max(g) || iters < 1) return -1;
    const int k = bucket_of(batch), B = 1 << k;
    if (g->last_bucket != k || gprof_open(g, "decode")) return -1;
    gws w;
    gpu_ws_carve(g, B, &w);
    gpu_ws_decode_mode(&w);
    dsv4_cuda_batch b = gpu_batch_at(g, B, B);
    int rc = 0;
    for (int i = 0; i < iters && !rc; i++) { /* the step's state is rewritten the same way by every run */
        gprof_run_begin(g);
        rc = gpu_run_layers(g, &w, &b);
        gprof_layer(g, -2);
        rc = rc || gpu_run_head(g, &w, B);
    }
    char title[64];
    snprintf(title, sizeof title, "decode step, batch bucket %d", B);
    gprof_close(g, out, title, sp);
    return rc ? -1 : 0;
}

int dsv4_cuda_profile_open(dsv4_cuda_model *g) { return gprof_open(g, "prefill"); }
void dsv4_cuda_profile_close(dsv4_cuda_model *g, FILE *out, const char *title, dsv4_cuda_prof_split *sp) {
    gprof_close(g, out, title, sp);
}
