/* gpu_seq.c - one sequence's state on the GPU (cuda_model.h), allocated for the model's whole context
 * capacity when the sequence is created, in one device allocation: the dsv4_cuda_seqdev (the device
 * length), its per-layer dsv4_cuda_lstate array, then per layer the window ring + compressed entries
 * (abuf), the indexer keys (ibuf) and the compressors' pending rows. Nothing grows later; a forward call
 * past the capacity is rejected by dsv4_forward before it gets here. A freed sequence's allocation goes to the
 * model's pool (all have one size) and the next sequence takes it, reset on the stream: no cudaMalloc / cudaFree
 * (which synchronizes the device) while a server admits and retires requests. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../model/state.h"
#include "gpu_internal.h"
#include "kv_cache.h"

static size_t al256(size_t b) { return (b + 255) & ~(size_t)255; }

/* bytes of the seqdev header and the layer table, ahead of the caches */
static size_t head_bytes(int nlayers) { return al256(sizeof(dsv4_cuda_seqdev)) + al256(sizeof(dsv4_cuda_lstate) * (size_t)nlayers); }

/* Lays the state out from offset 0 (base NULL: only measures); returns the bytes. With a base, fills the
 * host image of the seqdev + layer states (hdr) and the list of score regions to set to -inf. */
static size_t layout(const dsv4_cuda_model *g, uint8_t *base, dsv4_cuda_seqdev *hdr, dsv4_cuda_lstate *ls,
                     float **neg, size_t *nneg, int *nnegs) {
    const dsv4_model *m = g->m;
    const dsv4_config *c = &m->cfg;
    const int NL = c->n_layers, W = c->window_size, cap = g->cap;
    size_t o = head_bytes(NL);
#define TAKE(ptr, nfloats) do { size_t nb_ = sizeof(float) * (size_t)(nfloats); if (base) (ptr) = (float *)(base + o); o += al256(nb_); } while (0)
#define TAKEB(ptr, nbytes) do { size_t nb_ = (size_t)(nbytes); if (base) (ptr) = base + o; o += al256(nb_); } while (0)
    int k = 0;
    for (int L = 0; L < NL; L++) {
        const dsv4_layer *ly = &m->layers[L];
        dsv4_cuda_lstate st = {0};
        size_t rows = (size_t)W + (ly->ratio > 0 ? (size_t)cap / ly->ratio : 0);
        TAKEB(st.abuf, rows * (size_t)dsv4_kv_row_bytes(c->head_dim, c->rope_head_dim));
        if (ly->ratio == 4) TAKEB(st.ibuf, (size_t)(cap / 4 > 0 ? cap / 4 : 1) * (size_t)dsv4_ikey_row_bytes(c->index_head_dim));
        if (ly->ratio > 0) {
            TAKE(st.ckv, dsv4_cmp_pending_floats(&ly->cmp));
            TAKE(st.csc, dsv4_cmp_pending_floats(&ly->cmp));
            if (base) neg[k] = st.csc, nneg[k++] = dsv4_cmp_pending_floats(&ly->cmp);
        }
        if (ly->ratio == 4) {
            TAKE(st.ikv, dsv4_cmp_pending_floats(&ly->idx_cmp));
            TAKE(st.isc, dsv4_cmp_pending_floats(&ly->idx_cmp));
            if (base) neg[k] = st.isc, nneg[k++] = dsv4_cmp_pending_floats(&ly->idx_cmp);
        }
        if (base) ls[L] = st;
    }
#undef TAKE
#undef TAKEB
    if (base) {
        hdr->len = 0;
        hdr->capacity = cap;
        hdr->L = (dsv4_cuda_lstate *)(base + al256(sizeof(dsv4_cuda_seqdev)));
        *nnegs = k;
    }
    return o;
}

size_t dsv4_cuda_seq_bytes(const dsv4_cuda_model *g) { return layout(g, NULL, NULL, NULL, NULL, NULL, NULL); }

dsv4_cuda_seq *dsv4_cuda_seq_new(dsv4_cuda_model *g) {
    const int NL = g->m->cfg.n_layers;
    dsv4_cuda_seq *s = calloc(1, sizeof *s);
    dsv4_cuda_lstate *ls = calloc((size_t)NL, sizeof *ls);
    float **neg = calloc((size_t)NL * 2 + 1, sizeof *neg);
    size_t *nneg = calloc((size_t)NL * 2 + 1, sizeof *nneg);
    int pooled = 0;
    if (!s || !ls || !neg || !nneg) goto fail;
    s->g = g;
    size_t bytes = layout(g, NULL, NULL, NULL, NULL, NULL, NULL);
    /* a freed sequence's state when there is one: the same layout at the same address, so its header and layer table
     * already hold what this sequence's would; everything after them is reset on the stream, after every step that
     * used it (each forward ends with its side streams joined to the main stream; seq_free waits for side-stream work
     * a failed forward may have left) */
    pooled = g->nspool > 0;
    if (pooled) s->mem = g->spool[--g->nspool];
    else if (!(s->mem = dsv4_cuda_alloc(bytes))) goto fail;
    dsv4_cuda_seqdev hdr;
    int nn = 0;
    layout(g, s->mem, &hdr, ls, neg, nneg, &nn);
    s->dev = (dsv4_cuda_seqdev *)s->mem;
    /* zeros everywhere (pending kv, caches), -inf in the pending scores, then the header and layer table (a pooled
     * state: its length only) */
    const size_t head = pooled ? head_bytes(NL) : 0;
    if (dsv4_cuda_memset((uint8_t *)s->mem + head, 0, bytes - head, g->stream)) goto fail;
    for (int i = 0; i < nn; i++)
        if (dsv4_cuda_fill(neg[i], (int64_t)nneg[i], -INFINITY, g->stream)) goto fail;
    if (pooled) {
        if (dsv4_cuda_memset(&s->dev->len, 0, sizeof s->dev->len, g->stream)) goto fail;
    } else if (dsv4_cuda_upload_async(hdr.L, ls, sizeof *ls * (size_t)NL, g->stream) ||
               dsv4_cuda_upload_async(s->dev, &hdr, sizeof hdr, g->stream) || dsv4_cuda_stream_sync(g->stream))
        goto fail;
    free(ls), free(neg), free(nneg);
    return s;
fail:
    free(ls), free(neg), free(nneg);
    if (s && s->mem && !pooled) { /* a fresh allocation whose header may not be on the device: not for the pool */
        dsv4_cuda_stream_sync(g->stream);
        dsv4_cuda_free(s->mem);
        s->mem = NULL;
    }
    dsv4_cuda_seq_free(s);
    return NULL;
}

dsv4_cuda_seq *dsv4_cuda_seq_fork(const dsv4_cuda_seq *src) {
    dsv4_cuda_seq *s = dsv4_cuda_seq_new(src->g);
    if (!s) return NULL;
    /* the same layout at another address: the header and layer table stay the new sequence's own (they hold
     * its pointers), every cache and pending row after them is copied, then the device length */
    const size_t head = head_bytes(src->g->m->cfg.n_layers);
    const size_t bytes = layout(src->g, NULL, NULL, NULL, NULL, NULL, NULL);
    if (dsv4_cuda_copy((uint8_t *)s->mem + head, (const uint8_t *)src->mem + head, bytes - head, src->g->stream) ||
        dsv4_cuda_copy(&s->dev->len, &src->dev->len, sizeof s->dev->len, src->g->stream)) {
        dsv4_cuda_seq_free(s);
        return NULL;
    }
    s->pos = src->pos, s->prefill_end = src->prefill_end;
    return s;
}

void dsv4_cuda_seq_free(dsv4_cuda_seq *s) {
    if (!s) return;
    dsv4_cuda_model *g = s->g;
    if (s->mem && g->nspool == g->capspool) { /* room for one more in the pool */
        const int cap = g->capspool ? 2 * g->capspool : 16;
        void **p = realloc(g->spool, sizeof *p * (size_t)cap);
        if (p) g->spool = p, g->capspool = cap;
    }
    if (s->mem && g->nspool < g->capspool) {
        /* kept: the next sequence's reset (on the main stream) is ordered after this one's steps, which end joined to
         * it; a forward that failed part-way may have left work on the side streams (the window ring's store, the
         * compressors' rows) that writes this state, so those are waited for here (idle otherwise: microseconds) */
        if (g->stream2) dsv4_cuda_stream_sync(g->stream2);
        if (g->stream3) dsv4_cuda_stream_sync(g->stream3);
        g->spool[g->nspool++] = s->mem;
    } else if (s->mem) {
        dsv4_cuda_stream_sync(g->stream); /* a step in flight may still use the state */
        dsv4_cuda_free(s->mem);
    }
    free(s);
}

/* the pool's device memory, at the model's end */
void gpu_seq_pool_free(dsv4_cuda_model *g) {
    for (int i = 0; i < g->nspool; i++) dsv4_cuda_free(g->spool[i]);
    free(g->spool);
    g->spool = NULL, g->nspool = g->capspool = 0;
}

int dsv4_cuda_seq_pos(const dsv4_cuda_seq *s) { return s->pos; }
void dsv4_cuda_seq_set_prefill(dsv4_cuda_seq *s, int end) { s->prefill_end = end; }

int dsv4_cuda_seq_device_len(const dsv4_cuda_seq *s) {
    int len = -1;
    if (dsv4_cuda_stream_sync(s->g->stream) || dsv4_cuda_download(&len, &s->dev->len, sizeof len)) return -1;
    return len;
}
