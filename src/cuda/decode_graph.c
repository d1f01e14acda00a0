/* decode_graph.c - the decode step on the GPU: every sequence of the call gets at most one token, 1 ..
 * 256 tokens in all. The step is padded to its bucket B = 1, 2, 4, .. 256 (idle rows and slots: no
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

static int enqueue(dsv4_cuda_model *g, int head, const gws *w, const dsv4_cuda_batch *b) {
    return head ? gpu_run_head(g, w, b->T) : gpu_run_layers(g, w, b);
}

/* The layers (head 0) or the head (head 1) of a bucket's step: through its graph (captured now if it
 * does not exist yet), or launch by launch. */
static int run_part(dsv4_cuda_model *g, gbucket *bk, int head, const gws *w, const dsv4_cuda_batch *b) {
    void **ex = head ? &bk->head : &bk->layers;
    if (g->graphs && !*ex) {
        if (dsv4_cuda_capture_begin(g->stream)) return FAIL_HERE(dsv4_cuda_last_error());
        g->capturing = 1;
        int rc = enqueue(g, head, w, b);
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
            return enqueue(g, head, w, b);
        }
        *ex = e;
    }
    if (g->graphs && *ex) return dsv4_cuda_graph_launch(*ex, g->stream) ? FAIL_HERE(dsv4_cuda_last_error()) : 0;
    return enqueue(g, head, w, b);
}

int gpu_decode(dsv4_cuda_model *g, int nseq, dsv4_cuda_seq *const *seqs, const int32_t *const *tokens, const int *ntok,
               float *logits, int mode) {
    const int V = g->m->cfg.vocab_size;
    int T = 0;
    for (int s = 0; s < nseq; s++) T += ntok[s] > 0;
    const int k = bucket_of(T), B = 1 << k;
    /* the step input: the tokens in call order, then idle rows / slots */
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
    const dsv4_cuda_batch b = gpu_batch_at(g, B, B);
    gws w;
    gpu_ws_carve(g, B, &w);
    gbucket *bk = &g->bk[k];
    if (run_part(g, bk, 0, &w, &b)) return -1;
    if (mode != DSV4_LOGITS_NONE && logits) {
        if (run_part(g, bk, 1, &w, &b)) return -1;
        /* the rows of the call's tokens come first: [T, V] is the answer for both ALL and LAST */
        if (dsv4_cuda_download_async(logits, w.logits, sizeof(float) * (size_t)T * V, g->stream))
            return FAIL_HERE(dsv4_cuda_last_error());
    }
    if (dsv4_cuda_stream_sync(g->stream)) return FAIL_HERE(dsv4_cuda_last_error());
    g->last_bucket = k;
    return 0;
}

int dsv4_cuda_graphs_captured(const dsv4_cuda_model *g) {
    int n = 0;
    for (int i = 0; i < GB_N; i++) n += (g->bk[i].layers != NULL) + (g->bk[i].head != NULL);
    return n;
}

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int dsv4_cuda_decode_replay_ms(dsv4_cuda_model *g, int batch, int iters, double *layers_ms, double *step_ms) {
    if (batch < 1 || batch > GB_MAX || iters < 1) return -1;
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
