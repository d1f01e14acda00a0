/* forward_cuda.c - the whole DeepSeek-V4 forward on the GPU (cuda_model.h): weight upload, per-sequence
 * device state, and a forward over a batch of sequence chunks with the semantics of dsv4_forward
 * (src/model/forward.c, forward_attn.c, forward_moe.c), op for op through the kernels of
 * cuda_backend.h and cuda_model.h.
 *
 * Host decisions that need device data (first version, synchronous):
 *   - indexer top-k: scores are computed on the GPU (bit-identical to the CPU's), copied back, and
 *     selected with dsv4_topk_torch, so exact ties resolve as torch / the CPU engine do;
 *   - MoE: the router runs on the GPU; the expert picks are copied back to build per-expert row
 *     lists (the CPU's grouping and summation order), then each active expert runs on its rows.
 * Attention index lists are built on the host from positions and entry counts the host mirrors.
 * Everything runs on the legacy default stream; uploads / downloads order themselves after it. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../cpu/topk.h"
#include "../model/model.h"
#include "cuda_model.h"

#define S0 NULL /* the stream */

typedef struct gcomp {
    dsv4_cuda_weight wkv, wgate;
    float *ape, *norm;
} gcomp;

typedef struct glayer {
    float *rope_freq;
    dsv4_cuda_weight hc_attn_fn, hc_ffn_fn;
    float *hc_attn_base, *hc_attn_scale, *hc_ffn_base, *hc_ffn_scale, *attn_norm, *ffn_norm;
    dsv4_cuda_weight wq_a, wq_b, wkv, wo_a, wo_b;
    float *q_norm, *kv_norm, *attn_sink;
    gcomp cmp, idx_cmp;
    dsv4_cuda_weight idx_wq_b, idx_wproj;
    dsv4_cuda_weight gate;
    float *gate_bias;
    int *tid2eid;
    dsv4_cuda_weight *w1, *w2, *w3;
    dsv4_cuda_weight sw1, sw2, sw3;
    int *ramp; /* [max_pos / ratio + 2]: w * ratio, the RoPE positions of compressed entries */
} glayer;

/* one uploaded stored tensor (views of fused tensors share it) */
typedef struct urec {
    const uint8_t *hdata, *hscale;
    uint8_t *ddata, *dscale;
    size_t dbytes, sbytes;
} urec;

struct dsv4_cuda_model {
    dsv4_model *m;
    glayer *L;
    dsv4_cuda_weight embed, head, hc_head_fn;
    float *norm, *hc_head_base, *hc_head_scale;
    void **bufs; /* every device allocation of the model */
    int nbufs, capbufs;
    urec *ur;    /* hash table of uploaded tensors */
    size_t nur;
    /* workspace (device arena carved per call), staging for per-layer index lists */
    float *ws;
    size_t ws_cap;
    void *dstage, *hstage;
    size_t stage_cap;
    float *dscores, *hscores;
    size_t scores_cap;
    /* host scratch */
    int *hsel, *hcnt;
    float *hew;
    size_t hsel_cap;
};

typedef struct gcst {
    float *skv, *ssc; /* pending rows [c*m, c*d] */
    int n, cap;       /* entries emitted, capacity */
} gcst;

typedef struct gls {
    float *abuf; /* [W + cmp.cap, head_dim]: window ring, then the compressed entries */
    float *ibuf; /* [idx.cap, index_head_dim]: indexer keys */
    gcst cmp, idx;
} gls;

struct dsv4_cuda_seq {
    dsv4_cuda_model *g;
    int pos, prefill_end;
    gls *ls;
};

/* ---- allocation helpers ---- */

static int track(dsv4_cuda_model *g, void *p) {
    if (g->nbufs == g->capbufs) {
        int cap = g->capbufs ? g->capbufs * 2 : 256;
        void **nb = realloc(g->bufs, sizeof(void *) * (size_t)cap);
        if (!nb) return -1;
        g->bufs = nb;
        g->capbufs = cap;
    }
    g->bufs[g->nbufs++] = p;
    return 0;
}

static void *dalloc(dsv4_cuda_model *g, size_t bytes) {
    void *p = dsv4_cuda_alloc(bytes);
    if (p && track(g, p)) {
        dsv4_cuda_free(p);
        return NULL;
    }
    return p;
}

static float *upf(dsv4_cuda_model *g, const float *h, size_t n, int *rc) {
    if (*rc || !h) return NULL;
    float *d = dalloc(g, n * sizeof(float));
    if (!d || dsv4_cuda_upload(d, h, n * sizeof(float))) {
        *rc = -1;
        return NULL;
    }
    return d;
}

static int *upi(dsv4_cuda_model *g, const int32_t *h, size_t n, int *rc) {
    if (*rc || !h) return NULL;
    int *d = dalloc(g, n * sizeof(int));
    if (!d || dsv4_cuda_upload(d, h, n * sizeof(int))) {
        *rc = -1;
        return NULL;
    }
    return d;
}

/* ---- weight upload (each stored tensor once, with the largest row extent any view needs) ---- */

static void extent(const dsv4_weight *w, size_t *db, size_t *sb) {
    int64_t R = (int64_t)w->row0 + w->rows, C = w->cols;
    *sb = 0;
    switch (w->fmt) {
    case DSV4_WF_F32: *db = (size_t)(R * C * 4); break;
    case DSV4_WF_BF16:
    case DSV4_WF_F16: *db = (size_t)(R * C * 2); break;
    case DSV4_WF_FP8:
        *db = (size_t)(R * C);
        *sb = (size_t)(((R + 127) / 128) * w->scale_stride * (w->scale_f32 ? 4 : 1));
        break;
    case DSV4_WF_MXFP4:
    case DSV4_WF_NVFP4:
        *db = (size_t)(R * (C / 2));
        *sb = (size_t)(R * w->scale_stride);
        break;
    default: *db = 0;
    }
}

static urec *ur_find(dsv4_cuda_model *g, const uint8_t *data, const uint8_t *scale, int insert) {
    size_t h = ((uintptr_t)data >> 4) * 0x9E3779B97F4A7C15ull ^ ((uintptr_t)scale >> 4);
    for (size_t i = h % g->nur;; i = (i + 1) % g->nur) {
        urec *r = &g->ur[i];
        if (!r->hdata) {
            if (!insert) return NULL;
            r->hdata = data;
            r->hscale = scale;
            return r;
        }
        if (r->hdata == data && r->hscale == scale) return r;
    }
}

typedef struct upctx {
    dsv4_cuda_model *g;
    size_t nweights;
    double total;
} upctx;

static void count_w(void *ctx, int layer, const dsv4_weight *w) {
    upctx *u = ctx;
    u->nweights++;
}

static void collect_w(void *ctx, int layer, const dsv4_weight *w) {
    upctx *u = ctx;
    urec *r = ur_find(u->g, w->data, w->scale, 1);
    size_t db, sb;
    extent(w, &db, &sb);
    if (db > r->dbytes) r->dbytes = db;
    if (sb > r->sbytes) r->sbytes = sb;
}

static dsv4_cuda_weight bindw(dsv4_cuda_model *g, const dsv4_weight *w) {
    dsv4_cuda_weight d = {0};
    urec *r = ur_find(g, w->data, w->scale, 0);
    if (!r) return d;
    d.fmt = w->fmt;
    d.rows = w->rows;
    d.cols = w->cols;
    d.row0 = w->row0;
    d.data = r->ddata;
    d.scale = r->dscale;
    d.scale_f32 = w->scale_f32;
    d.scale_stride = w->scale_stride;
    d.scale2 = w->scale2;
    d.act_quant = w->act_quant;
    return d;
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int upload_weights(dsv4_cuda_model *g, int verbose) {
    upctx u = {g, 0, 0};
    dsv4_model_foreach_weight(g->m, count_w, &u);
    g->nur = u.nweights * 2 + 16;
    g->ur = calloc(g->nur, sizeof(urec));
    if (!g->ur) return -1;
    dsv4_model_foreach_weight(g->m, collect_w, &u);
    for (size_t i = 0; i < g->nur; i++) u.total += (double)g->ur[i].dbytes + g->ur[i].sbytes;
    double t0 = now_s(), last = t0, done = 0;
    for (size_t i = 0; i < g->nur; i++) {
        urec *r = &g->ur[i];
        if (!r->hdata) continue;
        r->ddata = dalloc(g, r->dbytes);
        if (!r->ddata || dsv4_cuda_upload(r->ddata, r->hdata, r->dbytes)) return -1;
        if (r->sbytes) {
            r->dscale = dalloc(g, r->sbytes);
            if (!r->dscale || dsv4_cuda_upload(r->dscale, r->hscale, r->sbytes)) return -1;
        }
        done += (double)r->dbytes + r->sbytes;
        double t = now_s();
        if (verbose && (t - last > 0.5 || done == u.total)) {
            fprintf(stderr, "\rdsv4: uploading weights to the GPU: %.2f / %.2f GB (%.2f GB/s)", done / 1e9, u.total / 1e9,
                    done / 1e9 / (t - t0 > 1e-9 ? t - t0 : 1e-9));
            last = t;
        }
    }
    if (verbose) {
        double t = now_s();
        fprintf(stderr, "\rdsv4: uploaded weights to the GPU: %.2f GB in %.2f s (%.2f GB/s)\n", u.total / 1e9, t - t0,
                u.total / 1e9 / (t - t0 > 1e-9 ? t - t0 : 1e-9));
    }
    return 0;
}

static int bind_layer(dsv4_cuda_model *g, int L, int **ramps) {
    const dsv4_model *m = g->m;
    const dsv4_config *c = &m->cfg;
    const dsv4_layer *l = &m->layers[L];
    glayer *d = &g->L[L];
    const int M = c->hc_mult, D = c->dim, hcr = (2 + M) * M;
    int rc = 0;
    d->rope_freq = upf(g, l->rope_freq, (size_t)c->rope_head_dim / 2, &rc);
    d->hc_attn_fn = bindw(g, &l->hc_attn_fn);
    d->hc_ffn_fn = bindw(g, &l->hc_ffn_fn);
    d->hc_attn_base = upf(g, l->hc_attn_base, (size_t)hcr, &rc);
    d->hc_attn_scale = upf(g, l->hc_attn_scale, 3, &rc);
    d->hc_ffn_base = upf(g, l->hc_ffn_base, (size_t)hcr, &rc);
    d->hc_ffn_scale = upf(g, l->hc_ffn_scale, 3, &rc);
    d->attn_norm = upf(g, l->attn_norm, (size_t)D, &rc);
    d->ffn_norm = upf(g, l->ffn_norm, (size_t)D, &rc);
    d->wq_a = bindw(g, &l->wq_a);
    d->wq_b = bindw(g, &l->wq_b);
    d->wkv = bindw(g, &l->wkv);
    d->wo_a = bindw(g, &l->wo_a);
    d->wo_b = bindw(g, &l->wo_b);
    d->q_norm = upf(g, l->q_norm, (size_t)c->q_lora_rank, &rc);
    d->kv_norm = upf(g, l->kv_norm, (size_t)c->head_dim, &rc);
    d->attn_sink = upf(g, l->attn_sink, (size_t)c->n_heads, &rc);
    const dsv4_compressor *cms[2] = {&l->cmp, &l->idx_cmp};
    gcomp *dcs[2] = {&d->cmp, &d->idx_cmp};
    for (int k = 0; k < 2; k++) {
        if (k == 0 ? l->ratio <= 0 : l->ratio != 4) continue;
        const dsv4_compressor *cm = cms[k];
        int cd = (cm->overlap ? 2 : 1) * cm->d;
        dcs[k]->wkv = bindw(g, &cm->wkv);
        dcs[k]->wgate = bindw(g, &cm->wgate);
        dcs[k]->ape = upf(g, cm->ape, (size_t)cm->ratio * cd, &rc);
        dcs[k]->norm = upf(g, cm->norm, (size_t)cm->d, &rc);
    }
    if (l->ratio == 4) {
        d->idx_wq_b = bindw(g, &l->idx_wq_b);
        d->idx_wproj = bindw(g, &l->idx_wproj);
    }
    if (l->ratio > 0) {
        int r = l->ratio;
        if (r < 4096 && ramps[r]) {
            d->ramp = ramps[r];
        } else {
            size_t n = (size_t)c->max_position_embeddings / (size_t)r + 2;
            int32_t *h = malloc(sizeof(int32_t) * n);
            if (!h) return -1;
            for (size_t i = 0; i < n; i++) h[i] = (int32_t)(i * (size_t)r);
            d->ramp = upi(g, h, n, &rc);
            free(h);
            if (r < 4096) ramps[r] = d->ramp;
        }
    }
    d->gate = bindw(g, &l->gate);
    const int E = c->n_routed_experts, K = c->n_activated_experts;
    if (l->hash) d->tid2eid = upi(g, l->tid2eid, (size_t)c->vocab_size * K, &rc);
    else d->gate_bias = upf(g, l->gate_bias, (size_t)E, &rc);
    d->w1 = calloc((size_t)E, sizeof(dsv4_cuda_weight));
    d->w2 = calloc((size_t)E, sizeof(dsv4_cuda_weight));
    d->w3 = calloc((size_t)E, sizeof(dsv4_cuda_weight));
    if (!d->w1 || !d->w2 || !d->w3) return -1;
    for (int e = 0; e < E; e++) {
        d->w1[e] = bindw(g, &l->w1[e]);
        d->w2[e] = bindw(g, &l->w2[e]);
        d->w3[e] = bindw(g, &l->w3[e]);
    }
    if (l->has_shared) {
        d->sw1 = bindw(g, &l->sw1);
        d->sw2 = bindw(g, &l->sw2);
        d->sw3 = bindw(g, &l->sw3);
    }
    return rc;
}

int dsv4_cuda_model_new(dsv4_model *m, int dev, int verbose, dsv4_cuda_model **out, char *err, size_t errcap) {
    *out = NULL;
    dsv4_cuda_info info;
    if (dsv4_cuda_init(dev, &info, err, errcap)) return -1;
    if (verbose)
        fprintf(stderr, "dsv4: GPU %d: %s (sm_%d%d, %d SMs, %.1f GiB)\n", dev, info.name, info.cc_major, info.cc_minor,
                info.sm_count, info.mem_total / 1073741824.0);
    dsv4_cuda_model *g = calloc(1, sizeof *g);
    if (!g) {
        snprintf(err, errcap, "out of memory");
        return -1;
    }
    g->m = m;
    const dsv4_config *c = &m->cfg;
    int rc = upload_weights(g, verbose);
    int *ramps[4096] = {0};
    if (!rc && !(g->L = calloc((size_t)c->n_layers, sizeof(glayer)))) rc = -1;
    for (int L = 0; L < c->n_layers && !rc; L++) rc = bind_layer(g, L, ramps);
    if (!rc) {
        g->embed = bindw(g, &m->embed);
        g->head = bindw(g, &m->head);
        g->hc_head_fn = bindw(g, &m->hc_head_fn);
        g->norm = upf(g, m->norm, (size_t)c->dim, &rc);
        g->hc_head_base = upf(g, m->hc_head_base, (size_t)c->hc_mult, &rc);
        g->hc_head_scale = upf(g, m->hc_head_scale, 1, &rc);
    }
    if (rc) {
        snprintf(err, errcap, "GPU model upload: %s", dsv4_cuda_last_error()[0] ? dsv4_cuda_last_error() : "out of memory");
        dsv4_cuda_model_free(g);
        return -1;
    }
    *out = g;
    return 0;
}

void dsv4_cuda_model_free(dsv4_cuda_model *g) {
    if (!g) return;
    for (int i = 0; i < g->nbufs; i++) dsv4_cuda_free(g->bufs[i]);
    if (g->L)
        for (int L = 0; L < g->m->cfg.n_layers; L++) free(g->L[L].w1), free(g->L[L].w2), free(g->L[L].w3);
    free(g->L);
    free(g->bufs);
    free(g->ur);
    dsv4_cuda_free(g->ws);
    dsv4_cuda_free(g->dstage);
    dsv4_cuda_free(g->dscores);
    free(g->hstage);
    free(g->hscores);
    free(g->hsel), free(g->hcnt), free(g->hew);
    free(g);
}

/* ---- sequences ---- */

static int cst_init(gcst *s, const dsv4_compressor *cm) {
    int cc = cm->overlap ? 2 : 1;
    size_t n = (size_t)cc * cm->ratio * cc * cm->d;
    s->skv = dsv4_cuda_alloc(n * sizeof(float));
    s->ssc = dsv4_cuda_alloc(n * sizeof(float));
    if (!s->skv || !s->ssc) return -1;
    if (dsv4_cuda_memset(s->skv, 0, n * sizeof(float), S0) || dsv4_cuda_fill(s->ssc, (int64_t)n, -INFINITY, S0)) return -1;
    return 0;
}

dsv4_cuda_seq *dsv4_cuda_seq_new(dsv4_cuda_model *g) {
    const dsv4_model *m = g->m;
    const dsv4_config *c = &m->cfg;
    dsv4_cuda_seq *s = calloc(1, sizeof *s);
    if (!s) return NULL;
    s->g = g;
    if (!(s->ls = calloc((size_t)c->n_layers, sizeof(gls)))) goto fail;
    for (int L = 0; L < c->n_layers; L++) {
        const dsv4_layer *ly = &m->layers[L];
        gls *st = &s->ls[L];
        size_t rows = (size_t)c->window_size;
        st->abuf = dsv4_cuda_alloc(rows * c->head_dim * sizeof(float));
        if (!st->abuf || dsv4_cuda_memset(st->abuf, 0, rows * c->head_dim * sizeof(float), S0)) goto fail;
        if (ly->ratio > 0 && cst_init(&st->cmp, &ly->cmp)) goto fail;
        if (ly->ratio == 4 && cst_init(&st->idx, &ly->idx_cmp)) goto fail;
    }
    return s;
fail:
    dsv4_cuda_seq_free(s);
    return NULL;
}

void dsv4_cuda_seq_free(dsv4_cuda_seq *s) {
    if (!s) return;
    if (s->ls)
        for (int L = 0; L < s->g->m->cfg.n_layers; L++) {
            gls *st = &s->ls[L];
            dsv4_cuda_free(st->abuf), dsv4_cuda_free(st->ibuf);
            dsv4_cuda_free(st->cmp.skv), dsv4_cuda_free(st->cmp.ssc);
            dsv4_cuda_free(st->idx.skv), dsv4_cuda_free(st->idx.ssc);
        }
    free(s->ls);
    free(s);
}

int dsv4_cuda_seq_pos(const dsv4_cuda_seq *s) { return s->pos; }
void dsv4_cuda_seq_set_prefill(dsv4_cuda_seq *s, int end) { s->prefill_end = end; }

/* Room for `add` more entries after `prefix` rows of d floats (the ring for attention entries). */
static int reserve(float **buf, int prefix, int d, gcst *c, int add) {
    if (c->n + add <= c->cap) return 0;
    int cap = c->cap ? c->cap : 16;
    while (cap < c->n + add) cap *= 2;
    float *nb = dsv4_cuda_alloc(sizeof(float) * ((size_t)prefix + cap) * d);
    if (!nb) return -1;
    size_t keep = sizeof(float) * ((size_t)prefix + c->n) * d;
    if (*buf && keep && dsv4_cuda_copy(nb, *buf, keep, S0)) {
        dsv4_cuda_free(nb);
        return -1;
    }
    dsv4_cuda_free(*buf);
    *buf = nb;
    c->cap = cap;
    return 0;
}

/* ---- the forward ---- */

typedef struct gbatch {
    int T, nseq;
    dsv4_cuda_seq **seq;
    int *off, *n, *pos0; /* [nseq] */
    int *tok, *pos, *sid; /* [T] (host) */
    int *dtok, *dpos;     /* [T] (device) */
    /* workspace (device) */
    float *X, *x, *y, *post, *comb, *qr, *q, *kv, *o, *kvp, *scp, *qi, *wt, *og, *zg, *z;
    float *lgE, *ew, *xe, *gg, *uu, *ye, *hy, *logits;
    int *sel;
} gbatch;

/* Errors name the line of this file; DSV4_CUDA_DEBUG=1 synchronizes after every op so that an
 * asynchronous kernel fault is reported where it happened. */
static char g_ferr[768];
static int g_debug = -1;

static int ck_fail(int line, const char *what) {
    snprintf(g_ferr, sizeof g_ferr, "forward_cuda.c:%d: %s", line, what && what[0] ? what : "out of memory");
    return -1;
}

static int ck_debug(int line) {
    if (g_debug < 0) g_debug = getenv("DSV4_CUDA_DEBUG") && atoi(getenv("DSV4_CUDA_DEBUG")) > 0;
    if (!g_debug || !dsv4_cuda_stream_sync(S0)) return 0;
    return ck_fail(line, dsv4_cuda_last_error());
}

#define CK(call) do { if ((call)) return ck_fail(__LINE__, dsv4_cuda_last_error()); if (ck_debug(__LINE__)) return -1; } while (0)

/* Device staging for a per-layer upload of `bytes`; returns the host mirror. */
static void *stage(dsv4_cuda_model *g, size_t bytes) {
    if (bytes > g->stage_cap) {
        size_t cap = bytes * 2 > 4096 ? bytes * 2 : 4096;
        void *h = malloc(cap), *d = dsv4_cuda_alloc(cap);
        if (!h || !d) {
            free(h);
            dsv4_cuda_free(d);
            return NULL;
        }
        free(g->hstage);
        dsv4_cuda_free(g->dstage);
        g->hstage = h;
        g->dstage = d;
        g->stage_cap = cap;
    }
    return g->hstage;
}

static size_t al16(size_t b) { return (b + 15) & ~(size_t)15; }

static int run_compressor(dsv4_cuda_model *g, const gbatch *b, int L, int which, const float *x) {
    const dsv4_model *m = g->m;
    const dsv4_config *c = &m->cfg;
    const dsv4_layer *ly = &m->layers[L];
    const glayer *gl = &g->L[L];
    const dsv4_compressor *cm = which ? &ly->idx_cmp : &ly->cmp;
    const gcomp *gc = which ? &gl->idx_cmp : &gl->cmp;
    const int mr = cm->ratio, d = cm->d, cd = (cm->overlap ? 2 : 1) * d, R = c->rope_head_dim, W = c->window_size;
    CK(dsv4_cuda_linear(&gc->wkv, x, 0, b->T, b->kvp, S0));
    CK(dsv4_cuda_linear(&gc->wgate, x, 0, b->T, b->scp, S0));
    for (int s = 0; s < b->nseq; s++) {
        if (!b->n[s]) continue;
        gls *ls = &b->seq[s]->ls[L];
        gcst *st = which ? &ls->idx : &ls->cmp;
        float **buf = which ? &ls->ibuf : &ls->abuf;
        const int prefix = which ? 0 : W;
        const int add = (b->pos0[s] + b->n[s]) / mr - b->pos0[s] / mr;
        CK(reserve(buf, prefix, d, st, add));
        float *ent = *buf + ((size_t)prefix + st->n) * d;
        CK(dsv4_cuda_cmp_tokens(st->skv, st->ssc, ent, b->kvp + (size_t)b->off[s] * cd, b->scp + (size_t)b->off[s] * cd,
                                gc->ape, b->pos0[s], b->n[s], mr, d, cm->overlap, S0));
        if (add > 0) {
            CK(dsv4_cuda_rmsnorm(ent, add, d, d, gc->norm, c->norm_eps, S0));
            CK(dsv4_cuda_rope(ent, add, 1, d, R / 2, gl->rope_freq, gl->ramp + st->n, 0, S0));
            if (which) {
                CK(dsv4_cuda_hadamard(ent, add, d, d, S0));
                CK(dsv4_cuda_act_quant_fp4(ent, add, d, d, 32, S0));
            } else {
                CK(dsv4_cuda_act_quant_fp8(ent, add, d - R, d, 64, S0));
            }
        }
        st->n += add;
    }
    return 0;
}

static int attention(dsv4_cuda_model *g, const gbatch *b, int L, const float *x, float *out) {
    const dsv4_model *m = g->m;
    const dsv4_config *c = &m->cfg;
    const dsv4_layer *ly = &m->layers[L];
    const glayer *gl = &g->L[L];
    const int T = b->T, H = c->n_heads, Dh = c->head_dim, R = c->rope_head_dim, Lq = c->q_lora_rank;
    const int W = c->window_size, G = c->o_groups, Ro = c->o_lora_rank, Hi = c->index_n_heads, Di = c->index_head_dim;
    const float eps = c->norm_eps;

    CK(dsv4_cuda_linear(&gl->wq_a, x, 0, T, b->qr, S0));
    CK(dsv4_cuda_rmsnorm(b->qr, T, Lq, Lq, gl->q_norm, eps, S0));
    CK(dsv4_cuda_linear(&gl->wq_b, b->qr, 0, T, b->q, S0));
    CK(dsv4_cuda_linear(&gl->wkv, x, 0, T, b->kv, S0));
    CK(dsv4_cuda_rmsnorm(b->q, T * H, Dh, Dh, NULL, eps, S0));
    CK(dsv4_cuda_rope(b->q, T, H, Dh, R / 2, gl->rope_freq, b->dpos, 0, S0));
    CK(dsv4_cuda_rmsnorm(b->kv, T, Dh, Dh, gl->kv_norm, eps, S0));
    CK(dsv4_cuda_rope(b->kv, T, 1, Dh, R / 2, gl->rope_freq, b->dpos, 0, S0));
    CK(dsv4_cuda_act_quant_fp8(b->kv, T, Dh - R, Dh, 64, S0));

    if (ly->ratio > 0) CK(run_compressor(g, b, L, 0, x));
    int *sel = NULL, *nsel = NULL, topk = c->index_topk;
    if (ly->ratio == 4) {
        CK(run_compressor(g, b, L, 1, x));
        CK(dsv4_cuda_linear(&gl->idx_wq_b, b->qr, 0, T, b->qi, S0));
        CK(dsv4_cuda_linear(&gl->idx_wproj, x, 0, T, b->wt, S0));
        CK(dsv4_cuda_rope(b->qi, T, Hi, Di, R / 2, gl->rope_freq, b->dpos, 0, S0));
        CK(dsv4_cuda_hadamard(b->qi, T * Hi, Di, Di, S0));
        CK(dsv4_cuda_act_quant_fp4(b->qi, T * Hi, Di, Di, 32, S0));
        const float wscale = 1.0f / sqrtf((float)Di) / sqrtf((float)Hi);
        CK(dsv4_cuda_scale(b->wt, (int64_t)T * Hi, wscale, S0));
        /* per query: keys, ncausal, nlist (as indexer_topk's caller in forward_attn.c) */
        size_t pb = al16(sizeof(void *) * T), ib = al16(sizeof(int) * T);
        uint8_t *h = stage(g, pb + 2 * ib);
        if (!h) return -1;
        const float **kp = (const float **)h;
        int *nc = (int *)(h + pb), *nl = (int *)(h + pb + ib), maxlist = 0;
        for (int t = 0; t < T; t++) {
            int s = b->sid[t], p = b->pos[t];
            const gls *ls = &b->seq[s]->ls[L];
            int ncausal = (p + 1) / 4;
            if (ncausal > ls->cmp.n) ncausal = ls->cmp.n;
            int nlist = ls->idx.n, pe = b->seq[s]->prefill_end;
            if (p < pe && pe / 4 > nlist) nlist = pe / 4;
            kp[t] = ls->ibuf;
            nc[t] = ncausal;
            nl[t] = nlist;
            if (nlist > maxlist) maxlist = nlist;
        }
        CK(dsv4_cuda_upload(g->dstage, h, pb + 2 * ib));
        size_t need = (size_t)T * (maxlist ? maxlist : 1);
        if (need > g->scores_cap) {
            size_t cap = need * 2;
            dsv4_cuda_free(g->dscores);
            free(g->hscores);
            g->dscores = dsv4_cuda_alloc(cap * sizeof(float));
            g->hscores = malloc(cap * sizeof(float));
            g->scores_cap = g->dscores && g->hscores ? cap : 0;
            if (!g->scores_cap) return -1;
        }
        uint8_t *d = g->dstage;
        CK(dsv4_cuda_indexer_scores(b->qi, b->wt, T, Hi, Di, (const float *const *)d, (const int *)(d + pb),
                                    (const int *)(d + pb + ib), maxlist, maxlist, g->dscores, S0));
        CK(dsv4_cuda_download(g->hscores, g->dscores, sizeof(float) * (size_t)T * maxlist));
        sel = malloc(sizeof(int) * ((size_t)T * (topk > 0 ? topk : 1) + (size_t)maxlist + 1));
        nsel = malloc(sizeof(int) * (size_t)T);
        if (!sel || !nsel) {
            free(sel), free(nsel);
            return -1;
        }
        int *tmp = sel + (size_t)T * (topk > 0 ? topk : 1);
        for (int t = 0; t < T; t++) {
            int n = nl[t], k = topk < n ? topk : n, kept = 0;
            int *st = sel + (size_t)t * (topk > 0 ? topk : 1);
            if (k > 0) dsv4_topk_torch(g->hscores + (size_t)t * maxlist, n, k, tmp);
            for (int i = 0; i < k; i++)
                if (tmp[i] < nc[t]) st[kept++] = tmp[i];
            nsel[t] = kept;
        }
    }

    /* index lists: window (older positions from the ring, the chunk's own from kv), then entries */
    int nidx = 0;
    for (int t = 0; t < T; t++) {
        int s = b->sid[t], p = b->pos[t];
        int n = p + 1 < W ? p + 1 : W;
        if (ly->ratio == 4) n += nsel[t];
        else if (ly->ratio > 0) {
            int ncausal = (p + 1) / ly->ratio, cn = b->seq[s]->ls[L].cmp.n;
            n += ncausal < cn ? ncausal : cn;
        }
        if (n > nidx) nidx = n;
    }
    if (nidx > 4096) {
        free(sel), free(nsel);
        fprintf(stderr, "dsv4: GPU attention: %d entries per query, more than 4096 (not supported yet)\n", nidx);
        return -1;
    }
    size_t pb = al16(sizeof(void *) * T);
    uint8_t *h = stage(g, pb + sizeof(int) * (size_t)T * (nidx ? nidx : 1));
    if (!h) {
        free(sel), free(nsel);
        return -1;
    }
    const float **base = (const float **)h;
    int *idx = (int *)(h + pb);
    for (int t = 0; t < T; t++) {
        int s = b->sid[t], p = b->pos[t], p0 = b->pos0[s], k = 0;
        const gls *ls = &b->seq[s]->ls[L];
        int *it = idx + (size_t)t * nidx;
        base[t] = ls->abuf;
        for (int pp = p - W + 1 < 0 ? 0 : p - W + 1; pp <= p; pp++)
            it[k++] = pp >= p0 ? -(b->off[s] + pp - p0) - 2 : pp % W;
        if (ly->ratio == 4) {
            const int *st = sel + (size_t)t * (topk > 0 ? topk : 1);
            for (int i = 0; i < nsel[t]; i++) it[k++] = W + st[i];
        } else if (ly->ratio > 0) {
            int ncausal = (p + 1) / ly->ratio;
            if (ncausal > ls->cmp.n) ncausal = ls->cmp.n;
            for (int w = 0; w < ncausal; w++) it[k++] = W + w;
        }
        while (k < nidx) it[k++] = -1;
    }
    free(sel), free(nsel);
    CK(dsv4_cuda_upload(g->dstage, h, pb + sizeof(int) * (size_t)T * nidx));
    const uint8_t *d = g->dstage;
    CK(dsv4_cuda_sparse_attn2(b->q, T, H, Dh, (const float *const *)d, b->kv, Dh, (const int *)(d + pb), nidx,
                              gl->attn_sink, 1.0f / sqrtf((float)Dh), b->o, S0));
    CK(dsv4_cuda_rope(b->o, T, H, Dh, R / 2, gl->rope_freq, b->dpos, 1, S0));

    /* the chunk's raw kv into each sequence's window ring */
    for (int s = 0; s < b->nseq; s++)
        CK(dsv4_cuda_ring_write(b->seq[s]->ls[L].abuf, b->kv + (size_t)b->off[s] * Dh, b->pos0[s], b->n[s], W, Dh, S0));

    /* grouped output projection */
    const int gin = H / G * Dh;
    if (G == 1) {
        CK(dsv4_cuda_linear(&gl->wo_a, b->o, 0, T, b->z, S0));
    } else {
        for (int gi = 0; gi < G; gi++) {
            dsv4_cuda_weight wg = gl->wo_a;
            wg.row0 += gi * Ro;
            wg.rows = Ro;
            CK(dsv4_cuda_copy2d(b->og, gin, b->o + (size_t)gi * gin, (int64_t)H * Dh, T, gin, S0));
            CK(dsv4_cuda_linear(&wg, b->og, 0, T, b->zg, S0));
            CK(dsv4_cuda_copy2d(b->z + (size_t)gi * Ro, (int64_t)G * Ro, b->zg, Ro, T, Ro, S0));
        }
    }
    CK(dsv4_cuda_linear(&gl->wo_b, b->z, 0, T, out, S0));
    return 0;
}

static int moe(dsv4_cuda_model *g, const gbatch *b, int L, const float *x, float *out) {
    const dsv4_model *m = g->m;
    const dsv4_config *c = &m->cfg;
    const dsv4_layer *ly = &m->layers[L];
    const glayer *gl = &g->L[L];
    const int T = b->T, D = c->dim, E = c->n_routed_experts, K = c->n_activated_experts, I = c->moe_inter_dim;
    CK(dsv4_cuda_linear(&gl->gate, x, 0, T, b->lgE, S0));
    CK(dsv4_cuda_router(b->lgE, T, E, K, ly->hash ? NULL : gl->gate_bias, ly->hash ? gl->tid2eid : NULL, b->dtok,
                        c->route_scale, b->sel, b->ew, S0));
    size_t tk = (size_t)T * K;
    if (tk > g->hsel_cap || !g->hcnt) {
        free(g->hsel), free(g->hew), free(g->hcnt);
        g->hsel = malloc(sizeof(int) * tk * 2);
        g->hew = malloc(sizeof(float) * tk);
        g->hcnt = malloc(sizeof(int) * ((size_t)E + 1));
        g->hsel_cap = g->hsel && g->hew && g->hcnt ? tk : 0;
        if (!g->hsel_cap) return -1;
    }
    CK(dsv4_cuda_download(g->hsel, b->sel, sizeof(int) * tk));
    CK(dsv4_cuda_download(g->hew, b->ew, sizeof(float) * tk));
    /* per expert, its tokens in order (an expert counts once per token, its first pick) */
    int *cnt = g->hcnt, *keep = g->hsel + tk;
    memset(cnt, 0, sizeof(int) * ((size_t)E + 1));
    for (int t = 0; t < T; t++)
        for (int k = 0; k < K; k++) {
            int e = g->hsel[(size_t)t * K + k], dup = 0;
            for (int j = 0; j < k; j++) dup |= g->hsel[(size_t)t * K + j] == e;
            keep[(size_t)t * K + k] = !dup && e >= 0 && e < E;
            if (keep[(size_t)t * K + k]) cnt[e + 1]++;
        }
    for (int e = 0; e < E; e++) cnt[e + 1] += cnt[e];
    int total = cnt[E];
    size_t rb = al16(sizeof(int) * (size_t)(total ? total : 1));
    uint8_t *h = stage(g, rb + sizeof(float) * (size_t)(total ? total : 1));
    if (!h) return -1;
    int *rows = (int *)h;
    float *rw = (float *)(h + rb);
    {
        int *fill = malloc(sizeof(int) * (size_t)E);
        if (!fill) return -1;
        memcpy(fill, cnt, sizeof(int) * (size_t)E);
        for (int t = 0; t < T; t++)
            for (int k = 0; k < K; k++)
                if (keep[(size_t)t * K + k]) {
                    int e = g->hsel[(size_t)t * K + k], i = fill[e]++;
                    rows[i] = t;
                    rw[i] = g->hew[(size_t)t * K + k];
                }
        free(fill);
    }
    CK(dsv4_cuda_upload(g->dstage, h, rb + sizeof(float) * (size_t)(total ? total : 1)));
    const int *drows = (const int *)g->dstage;
    const float *drw = (const float *)((const uint8_t *)g->dstage + rb);
    CK(dsv4_cuda_memset(out, 0, sizeof(float) * (size_t)T * D, S0));
    for (int e = 0; e < E; e++) {
        int i0 = cnt[e], ne = cnt[e + 1] - cnt[e];
        if (!ne) continue;
        CK(dsv4_cuda_gather_rows(b->xe, x, drows + i0, ne, D, S0));
        CK(dsv4_cuda_linear(&gl->w1[e], b->xe, 0, ne, b->gg, S0));
        CK(dsv4_cuda_linear(&gl->w3[e], b->xe, 0, ne, b->uu, S0));
        CK(dsv4_cuda_swiglu(b->gg, b->uu, I, ne, I, c->swiglu_limit, drw + i0, b->gg, S0));
        CK(dsv4_cuda_linear(&gl->w2[e], b->gg, 0, ne, b->ye, S0));
        CK(dsv4_cuda_scatter_add_rows(out, b->ye, drows + i0, ne, D, S0));
    }
    if (ly->has_shared) {
        CK(dsv4_cuda_linear(&gl->sw1, x, 0, T, b->gg, S0));
        CK(dsv4_cuda_linear(&gl->sw3, x, 0, T, b->uu, S0));
        CK(dsv4_cuda_swiglu(b->gg, b->uu, I, T, I, c->swiglu_limit, NULL, b->gg, S0));
        CK(dsv4_cuda_linear(&gl->sw2, b->gg, 0, T, b->ye, S0));
        CK(dsv4_cuda_add(out, b->ye, (int64_t)T * D, S0));
    }
    return 0;
}

static int sub_block(dsv4_cuda_model *g, const gbatch *b, int L, int ffn) {
    const dsv4_config *c = &g->m->cfg;
    const glayer *gl = &g->L[L];
    const int T = b->T, M = c->hc_mult, D = c->dim;
    CK(dsv4_cuda_hc_pre(b->X, T, M, D, ffn ? &gl->hc_ffn_fn : &gl->hc_attn_fn, ffn ? gl->hc_ffn_scale : gl->hc_attn_scale,
                        ffn ? gl->hc_ffn_base : gl->hc_attn_base, c->hc_sinkhorn_iters, c->norm_eps, c->hc_eps, b->x,
                        b->post, b->comb, S0));
    CK(dsv4_cuda_rmsnorm(b->x, T, D, D, ffn ? gl->ffn_norm : gl->attn_norm, c->norm_eps, S0));
    CK(ffn ? moe(g, b, L, b->x, b->y) : attention(g, b, L, b->x, b->y));
    CK(dsv4_cuda_hc_post(b->y, b->X, T, M, D, b->post, b->comb, S0));
    return 0;
}

/* Carves the workspace for T tokens (grows the arena when needed). */
static int carve(dsv4_cuda_model *g, gbatch *b) {
    const dsv4_config *c = &g->m->cfg;
    const size_t T = (size_t)b->T, M = c->hc_mult, D = c->dim, H = c->n_heads, Dh = c->head_dim;
    const size_t Di = c->index_head_dim, Hi = c->index_n_heads, G = c->o_groups, Ro = c->o_lora_rank;
    const size_t E = c->n_routed_experts, K = c->n_activated_experts, I = c->moe_inter_dim, V = c->vocab_size;
    const size_t cdm = 2 * (Dh > Di ? Dh : Di), gin = H / (G ? G : 1) * Dh;
    size_t sizes[] = {T * M * D, T * D, T * D, T * M, T * M * M, T * c->q_lora_rank, T * H * Dh, T * Dh, T * H * Dh,
                      T * cdm, T * cdm, T * Hi * Di, T * Hi, T * gin, T * Ro, T * G * Ro,
                      T * E, T * K, T * D, T * I, T * I, T * D, T * D, T * V, T * K /* sel */, 2 * T /* tok, pos */};
    float **ptrs[] = {&b->X, &b->x, &b->y, &b->post, &b->comb, &b->qr, &b->q, &b->kv, &b->o, &b->kvp, &b->scp, &b->qi,
                      &b->wt, &b->og, &b->zg, &b->z, &b->lgE, &b->ew, &b->xe, &b->gg, &b->uu, &b->ye, &b->hy, &b->logits,
                      NULL /* sel */, NULL /* tok, pos */};
    const int n = (int)(sizeof sizes / sizeof sizes[0]);
    size_t total = 0;
    for (int i = 0; i < n; i++) total += (sizes[i] + 63) / 64 * 64;
    if (total > g->ws_cap) {
        dsv4_cuda_free(g->ws);
        g->ws = dsv4_cuda_alloc(total * sizeof(float));
        g->ws_cap = g->ws ? total : 0;
        if (!g->ws) return -1;
    }
    size_t o = 0;
    float *last[2] = {NULL, NULL}; /* the int arrays (not written through a float ** : aliasing) */
    for (int i = 0; i < n; i++) {
        if (ptrs[i]) *ptrs[i] = g->ws + o;
        else last[i - (n - 2)] = g->ws + o;
        o += (sizes[i] + 63) / 64 * 64;
    }
    b->sel = (int *)(void *)last[0];
    b->dtok = (int *)(void *)last[1];
    b->dpos = b->dtok + T;
    return 0;
}

int dsv4_cuda_forward(dsv4_cuda_model *g, int nseq, dsv4_cuda_seq *const *seqs, const int32_t *const *tokens,
                      const int *ntok, float *logits, int mode, char *err, size_t errcap) {
    const dsv4_config *c = &g->m->cfg;
    const int M = c->hc_mult, D = c->dim, V = c->vocab_size;
    gbatch b = {0};
    int rc = -1, T = 0;
#define FAIL(...) do { if (err && errcap) snprintf(err, errcap, __VA_ARGS__); goto out; } while (0)
    if (nseq < 0) FAIL("forward: negative batch size");
    for (int s = 0; s < nseq; s++) {
        if (!seqs[s]) FAIL("forward: sequence %d is NULL", s);
        if (seqs[s]->g != g) FAIL("forward: sequence %d belongs to another model", s);
        if (ntok[s] < 0) FAIL("forward: sequence %d: negative token count", s);
        for (int r = 0; r < s; r++)
            if (seqs[r] == seqs[s]) FAIL("forward: sequence %d appears twice in one batch", s);
        for (int i = 0; i < ntok[s]; i++)
            if (tokens[s][i] < 0 || tokens[s][i] >= V)
                FAIL("forward: sequence %d, token %d: id %d is outside the vocabulary (0..%d)", s, i, tokens[s][i], V - 1);
        if ((long long)seqs[s]->pos + ntok[s] > (long long)c->max_position_embeddings)
            FAIL("forward: sequence %d would reach position %lld, past max_position_embeddings %d", s,
                 (long long)seqs[s]->pos + ntok[s], c->max_position_embeddings);
        T += ntok[s];
    }
    b.T = T;
    b.nseq = nseq;
    b.seq = (dsv4_cuda_seq **)seqs;
    b.off = calloc((size_t)nseq + 1, sizeof(int));
    b.n = calloc((size_t)nseq + 1, sizeof(int));
    b.pos0 = calloc((size_t)nseq + 1, sizeof(int));
    b.tok = calloc(2 * (size_t)T + 1, sizeof(int)); /* tok then pos: one upload */
    b.sid = calloc((size_t)T + 1, sizeof(int));
    if (!b.off || !b.n || !b.pos0 || !b.tok || !b.sid) FAIL("forward: out of memory");
    b.pos = b.tok + T;
    for (int s = 0, t = 0; s < nseq; s++) {
        b.off[s] = t;
        b.n[s] = ntok[s];
        b.pos0[s] = seqs[s]->pos;
        for (int i = 0; i < ntok[s]; i++, t++) {
            b.tok[t] = tokens[s][i];
            b.pos[t] = seqs[s]->pos + i;
            b.sid[t] = s;
        }
    }
    if (T == 0) {
        rc = 0;
        goto out;
    }
    g_ferr[0] = 0;
    if (carve(g, &b)) {
        ck_fail(__LINE__, dsv4_cuda_last_error());
        goto gpu_fail;
    }
    if (dsv4_cuda_upload(b.dtok, b.tok, sizeof(int) * 2 * (size_t)T)) {
        ck_fail(__LINE__, dsv4_cuda_last_error());
        goto gpu_fail;
    }
    if (dsv4_cuda_embed(&g->embed, b.dtok, T, M, b.X, S0) || ck_debug(__LINE__)) goto gpu_fail;
    for (int L = 0; L < c->n_layers; L++)
        if (sub_block(g, &b, L, 0) || sub_block(g, &b, L, 1)) goto gpu_fail;
    if (mode != DSV4_LOGITS_NONE && logits) {
        if (dsv4_cuda_hc_head(b.X, T, M, D, &g->hc_head_fn, g->hc_head_scale, g->hc_head_base, c->norm_eps, c->hc_eps, b.hy, S0))
            goto gpu_fail;
        float *rows = b.hy;
        int nout = T;
        if (mode == DSV4_LOGITS_LAST) {
            nout = 0;
            for (int s = 0; s < nseq; s++)
                if (b.n[s] && dsv4_cuda_copy(b.y + (size_t)nout++ * D, b.hy + (size_t)(b.off[s] + b.n[s] - 1) * D,
                                             sizeof(float) * (size_t)D, S0))
                    goto gpu_fail;
            rows = b.y;
        }
        if (dsv4_cuda_rmsnorm(rows, nout, D, D, g->norm, c->norm_eps, S0) ||
            dsv4_cuda_linear(&g->head, rows, 0, nout, b.logits, S0) ||
            dsv4_cuda_download(logits, b.logits, sizeof(float) * (size_t)nout * V))
            goto gpu_fail;
    } else if (dsv4_cuda_stream_sync(S0)) {
        goto gpu_fail;
    }
    for (int s = 0; s < nseq; s++) seqs[s]->pos += ntok[s];
    rc = 0;
    goto out;
gpu_fail:
    if (err && errcap) snprintf(err, errcap, "forward (GPU): %s", g_ferr[0] ? g_ferr : dsv4_cuda_last_error());
out:
    free(b.off), free(b.n), free(b.pos0), free(b.tok), free(b.sid);
    return rc;
#undef FAIL
}
