/* state.c - per-sequence state: allocation and growth. See state.h. */
#include "state.h"

#ifdef DSV4_CUDA
#include "../cuda/cuda_model.h"
#endif

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* floats of a compressor's pending rows (kv or scores): [c*m, c*d], c = 2 with overlap */
size_t dsv4_cmp_pending_floats(const dsv4_compressor *cm) {
    const size_t cc = cm->overlap ? 2 : 1;
    return cc * (size_t)cm->ratio * cc * (size_t)cm->d;
}

static int cmp_init(dsv4_cmp_state *c, const dsv4_compressor *cm) {
    const size_t n = dsv4_cmp_pending_floats(cm);
    c->kv = calloc(n, sizeof(float));
    c->sc = malloc(n * sizeof(float));
    if (!c->kv || !c->sc) return -1;
    for (size_t i = 0; i < n; i++) c->sc[i] = -INFINITY;
    return 0;
}

int dsv4_cmp_state_reserve(dsv4_cmp_state *c, int d, int n) {
    if (c->n + n <= c->cap) return 0;
    int cap = c->cap ? c->cap : 16;
    while (cap < c->n + n) cap *= 2;
    float *e = realloc(c->ent, sizeof(float) * (size_t)cap * d);
    if (!e) return -1;
    c->ent = e;
    c->cap = cap;
    return 0;
}

dsv4_seq_state *dsv4_seq_state_new(const dsv4_model *m) {
    dsv4_seq_state *s = calloc(1, sizeof *s);
    if (!s) return NULL;
    s->m = m;
#ifdef DSV4_CUDA
    if (m->gpu) { /* the state lives on the device */
        if (!(s->gpu = dsv4_cuda_seq_new(m->gpu))) {
            free(s);
            return NULL;
        }
        return s;
    }
#endif
    s->ls = calloc((size_t)m->cfg.n_layers, sizeof *s->ls);
    if (!s->ls) goto fail;
    for (int L = 0; L < m->cfg.n_layers; L++) {
        const dsv4_layer *ly = &m->layers[L];
        dsv4_layer_state *st = &s->ls[L];
        st->win = calloc((size_t)m->cfg.window_size * m->cfg.head_dim, sizeof(float));
        if (!st->win) goto fail;
        if (ly->ratio > 0 && cmp_init(&st->cmp, &ly->cmp)) goto fail;
        if (ly->ratio == 4 && cmp_init(&st->idx, &ly->idx_cmp)) goto fail;
    }
    return s;
fail:
    dsv4_seq_state_free(s);
    return NULL;
}

static int cmp_copy(dsv4_cmp_state *d, const dsv4_cmp_state *c, const dsv4_compressor *cm) {
    const size_t n = dsv4_cmp_pending_floats(cm);
    memcpy(d->kv, c->kv, n * sizeof(float));
    memcpy(d->sc, c->sc, n * sizeof(float));
    if (c->n > 0) {
        if (dsv4_cmp_state_reserve(d, cm->d, c->n)) return -1;
        memcpy(d->ent, c->ent, sizeof(float) * (size_t)c->n * cm->d);
    }
    d->n = c->n;
    return 0;
}

dsv4_seq_state *dsv4_seq_state_fork(const dsv4_seq_state *src) {
    const dsv4_model *m = src->m;
    dsv4_seq_state *s;
#ifdef DSV4_CUDA
    if (src->gpu) { /* the device state: one copy of its caches */
        if (!(s = calloc(1, sizeof *s))) return NULL;
        s->m = m;
        if (!(s->gpu = dsv4_cuda_seq_fork(src->gpu))) {
            free(s);
            return NULL;
        }
        s->pos = src->pos, s->prefill_end = src->prefill_end;
        return s;
    }
#endif
    if (!(s = dsv4_seq_state_new(m))) return NULL;
    for (int L = 0; L < m->cfg.n_layers; L++) {
        const dsv4_layer *ly = &m->layers[L];
        memcpy(s->ls[L].win, src->ls[L].win, sizeof(float) * (size_t)m->cfg.window_size * m->cfg.head_dim);
        if ((ly->ratio > 0 && cmp_copy(&s->ls[L].cmp, &src->ls[L].cmp, &ly->cmp)) ||
            (ly->ratio == 4 && cmp_copy(&s->ls[L].idx, &src->ls[L].idx, &ly->idx_cmp))) {
            dsv4_seq_state_free(s);
            return NULL;
        }
    }
    s->pos = src->pos, s->prefill_end = src->prefill_end;
    return s;
}

static void cmp_free(dsv4_cmp_state *c) {
    free(c->kv);
    free(c->sc);
    free(c->ent);
}

void dsv4_seq_state_free(dsv4_seq_state *s) {
    if (!s) return;
#ifdef DSV4_CUDA
    if (s->gpu) dsv4_cuda_seq_free(s->gpu);
#endif
    if (s->ls)
        for (int L = 0; L < s->m->cfg.n_layers; L++) {
            free(s->ls[L].win);
            cmp_free(&s->ls[L].cmp);
            cmp_free(&s->ls[L].idx);
        }
    free(s->ls);
    free(s);
}
