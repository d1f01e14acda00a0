/* gpu_model.c - the model on the GPU (cuda_model.h): every weight uploaded once (each stored tensor
 * once: views of fused tensors share it), per-layer device descriptors (the routed experts' arrays for
 * the grouped kernels, the attention list length), the model's stream, the workspace arena and the
 * step-input buffers, all sized at set-up for the context capacity. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "gpu_internal.h"
#include "linear_gemm.h"

/* ---- allocation helpers ---- */

/* A switch from the environment: unset or empty gives dflt, "0" off, anything else on */
static int env_on(const char *name, int dflt) {
    const char *v = getenv(name);
    return v && *v ? strcmp(v, "0") != 0 : dflt;
}

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
    dsv4_cuda_weight_f16_fit(w, &d);
    return d;
}

/* A linear's weight: as bindw, with BF16 activations (act_bf16: x rounded to bf16 before the product) where the
 * official run of a model without the FP8 recipe (BF16 / F16 / NVFP4-only checkpoints) feeds bf16 rows to a bf16
 * linear: the attention projections, the indexer's, the shared and routed experts. The router gate, the compressors
 * and the head are fp32 matmuls from float(x) in the reference (spec 8, 10, 12) and keep fp32 x; so does every
 * linear of an FP8-recipe model without act quant. Opt-in (DSV4_ACT_BF16=1): with it on, the fixtures' GPU logits
 * are further from the float32 reference than the official bf16 run on some scenarios (bench/NOTES.md), so the
 * default keeps fp32 x, which is more precise than bf16. */
static int g_act_bf16 = -1;
static dsv4_cuda_weight bindl(dsv4_cuda_model *g, const dsv4_weight *w) {
    dsv4_cuda_weight d = bindw(g, w);
    if (g_act_bf16 < 0) {
        const char *e = getenv("DSV4_ACT_BF16");
        g_act_bf16 = e && *e && *e != '0';
    }
    d.act_bf16 = g_act_bf16 && g->m->cfg.recipe != DSV4_RECIPE_FP8 && !w->act_quant;
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

static int bind_layer(dsv4_cuda_model *g, int L) {
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
    d->wq_a = bindl(g, &l->wq_a);
    d->wq_b = bindl(g, &l->wq_b);
    d->wkv = bindl(g, &l->wkv);
    d->wo_a = bindl(g, &l->wo_a);
    d->wo_b = bindl(g, &l->wo_b);
    d->q_norm = upf(g, l->q_norm, (size_t)c->q_lora_rank, &rc);
    d->kv_norm = upf(g, l->kv_norm, (size_t)c->head_dim, &rc);
    d->attn_sink = upf(g, l->attn_sink, (size_t)c->n_heads, &rc);
    if (d->wo_a.f16_ok) { /* the f16 term's scales from the norms of the rows the attention reads (linear_gemm.h) */
        const float *nw[2] = {l->kv_norm, l->ratio > 0 ? l->cmp.norm : NULL};
        const int nn[2] = {c->head_dim, l->ratio > 0 ? l->cmp.d : 0};
        float sc[3];
        if (!dsv4_cuda_wo_a_f16_scale(nw, nn, 2, c->head_dim, d->wo_a.f16_shift, sc)) d->wo_a_f16s = upf(g, sc, 3, &rc);
    }
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
        d->idx_wq_b = bindl(g, &l->idx_wq_b);
        d->idx_wproj = bindl(g, &l->idx_wproj);
    }
    const int W = c->window_size;
    d->nidx = W;
    if (l->ratio == 4) d->nidx += c->index_topk < g->cap / 4 ? c->index_topk : g->cap / 4;
    else if (l->ratio > 0) d->nidx += g->cap / l->ratio;
    d->gate = bindw(g, &l->gate);
    const int E = c->n_routed_experts, K = c->n_activated_experts;
    if (l->hash) d->tid2eid = upi(g, l->tid2eid, (size_t)c->vocab_size * K, &rc);
    else d->gate_bias = upf(g, l->gate_bias, (size_t)E, &rc);
    if (rc) return rc;
    dsv4_cuda_weight *w = calloc((size_t)E * 3, sizeof(dsv4_cuda_weight));
    if (!w) return -1;
    for (int e = 0; e < E; e++) {
        w[e] = bindl(g, &l->w1[e]);
        w[E + e] = bindl(g, &l->w3[e]);
        w[2 * E + e] = bindl(g, &l->w2[e]);
    }
    rc = dsv4_cuda_experts_init(&d->ex, w, w + E, w + 2 * E, E);
    free(w);
    if (rc) return -1;
    if (l->has_shared) {
        d->sw1 = bindl(g, &l->sw1);
        d->sw2 = bindl(g, &l->sw2);
        d->sw3 = bindl(g, &l->sw3);
    }
    return 0;
}

/* The default rows of a pass once the weights are on the device: DSV4_CUDA_TMAX_BIG where that workspace is at most
 * 1/8 of the device's memory and 1/4 of what is free (the KV caches come after: Flash's shapes 6.3 GB, Pro's 10.8; an
 * H100's 85.5 GB / 8 = 10.7, an H200's 150 / 8 = 18.8), else DSV4_CUDA_TMAX_DEFAULT. The 8K prefill in 8192-row passes
 * against 4096: H200 Flash 1.8-2.6 % faster (bench/NOTES.md "Session 30"), H100 Flash 6 %, H100 Pro 9 % ("Session 49";
 * the rule was 1/16 until then, which left both on 4096 on an H100 and Pro on 4096 everywhere). Per-token results do
 * not depend on the passes' rows (forward_cuda.c). */
static void tmax_default(dsv4_cuda_model *g) {
    size_t fr = 0, tot = 0;
    if (dsv4_cuda_mem_info(&fr, &tot)) return;
    const int was = g->tmax;
    g->tmax = DSV4_CUDA_TMAX_BIG; /* (gpu_ws_bytes reads tmax: the decode buckets it bounds) */
    const size_t ws = gpu_ws_bytes(g, DSV4_CUDA_TMAX_BIG);
    if (ws > tot / 8 || ws > fr / 4) g->tmax = was;
}

int dsv4_cuda_model_new(dsv4_model *m, int dev, int verbose, int capacity, dsv4_cuda_model **out, char *err,
                        size_t errcap) {
    *out = NULL;
    const dsv4_config *c = &m->cfg;
    if (capacity < 1 || capacity > c->max_position_embeddings) {
        snprintf(err, errcap, "GPU model: context capacity %d outside 1 .. max_position_embeddings %d", capacity,
                 c->max_position_embeddings);
        return -1;
    }
    if ((c->head_dim - c->rope_head_dim) % 64 || c->index_head_dim % 32) {
        snprintf(err, errcap, "GPU model: the cache formats need head_dim - qk_rope_head_dim a multiple of 64 (got %d) and "
                 "index_head_dim a multiple of 32 (got %d)", c->head_dim - c->rope_head_dim, c->index_head_dim);
        return -1;
    }
    if (c->n_activated_experts > 32 || c->index_topk > 2048) {
        snprintf(err, errcap, "GPU model: %d experts per token (at most 32) or index top-k %d (at most 2048) not supported",
                 c->n_activated_experts, c->index_topk);
        return -1;
    }
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
    g->cap = capacity;
    g->last_bucket = -1;
    g->graphs = env_on("DSV4_CUDA_GRAPHS", 1);
    g->attn_fork = env_on("DSV4_CUDA_ATTN_FORK", 1);
    /* decode steps' branch structure (forward_cuda.c; bench/NOTES.md "Session 33": the kernel timeline showed the
     * indexer's branch and the shared expert's on the critical chain) */
    g->sh_early = env_on("DSV4_CUDA_SHARED_EARLY", 1); /* session 34: batch 1 0.984x, batch 8 0.979x, 64 / 256 unchanged */
    g->idxq_main = env_on("DSV4_CUDA_IDXQ_MAIN", 1); /* session 34: batch 1 0.995x, 8 0.999x, 64 / 256 unchanged */
    g->hc_defer = env_on("DSV4_CUDA_HC_DEFER", 1);
    /* prefill passes' wo_a on one f16 term (linear_gemm.h; session 44: 8K prefill 0.942x on an H100, the unseen study
     * as two bf16 terms: relative L2 0.1254 / 0.1227, top-1 0.772 / 0.769, every list >= 0.708); =0: two bf16 terms */
    g->wo_a_f16 = env_on("DSV4_WO_A_F16", 1);
    /* the routed experts' combine inside the next post kernel for passes of at most this many tokens (measured: 0.7-0.9 %
     * faster steps at batch 1-4, 0.3 % slower at 8, where the post blocks' four copies of the additions cost more than
     * the launch; DSV4_CUDA_COMBINE_DEFER=N sets it, 0: never) */
    g->combine_defer = 4;
    const char *ce = getenv("DSV4_CUDA_COMBINE_DEFER");
    if (ce && *ce) g->combine_defer = atoi(ce) < 0 ? 0 : atoi(ce);
    /* passes of at most tmax rows (DSV4_CUDA_TMAX, 64 .. 16384: the workspace grows ~1 MB a row at Flash's shapes;
     * longer passes read the routed experts' weights fewer times); the indexer scores at most ~64 MB at a time. Unset:
     * tmax_default once the weights are on the device. */
    g->tmax = DSV4_CUDA_TMAX_DEFAULT;
    const char *te = getenv("DSV4_CUDA_TMAX");
    const int tmax_env = te && *te;
    if (tmax_env) {
        const int v = atoi(te);
        g->tmax = v < 64 ? 64 : v > 16384 ? 16384 : v;
    }
    const int nl = capacity / 4 > 0 ? capacity / 4 : 1;
    g->qgmax = (16 << 20) / nl;
    if (g->qgmax < 1) g->qgmax = 1;
    int rc = 0;
    g->stream = dsv4_cuda_stream_new();
    g->stream2 = dsv4_cuda_stream_new();
    if (!g->stream || !g->stream2 || !(g->ev_fork = dsv4_cuda_event_new()) || !(g->ev_join = dsv4_cuda_event_new()) ||
        !(g->ev_tail = dsv4_cuda_event_new()) || !(g->stream3 = dsv4_cuda_stream_new()) || !(g->ev_hc = dsv4_cuda_event_new()) ||
        !(g->ev_hcd = dsv4_cuda_event_new()))
        rc = -1;
    if (!rc) rc = upload_weights(g, verbose);
    if (!rc && !(g->L = calloc((size_t)c->n_layers, sizeof(glayer)))) rc = -1;
    for (int L = 0; L < c->n_layers && !rc; L++) {
        rc = bind_layer(g, L);
        if (!rc && g->L[L].nidx > 4096) {
            snprintf(err, errcap, "GPU model: layer %d needs %d attention entries per query at context capacity %d (at "
                     "most 4096 supported; lower it with dsv4_set_max_context)", L, g->L[L].nidx, capacity);
            dsv4_cuda_model_free(g);
            return -1;
        }
    }
    if (!rc) {
        g->embed = bindw(g, &m->embed);
        g->head = bindw(g, &m->head);
        g->hc_head_fn = bindw(g, &m->hc_head_fn);
        g->norm = upf(g, m->norm, (size_t)c->dim, &rc);
        g->hc_head_base = upf(g, m->hc_head_base, (size_t)c->hc_mult, &rc);
        g->hc_head_scale = upf(g, m->hc_head_scale, 1, &rc);
    }
    if (!rc && !tmax_env) tmax_default(g);
    if (!rc) {
        gstepl l;
        gpu_step_layout(g->tmax, g->tmax, &l);
        g->step_bytes = l.bytes;
        if (!(g->arena = dalloc(g, gpu_ws_bytes(g, g->tmax))) || !(g->dstep = dalloc(g, g->step_bytes)) ||
            !(g->hstep = dsv4_cuda_host_alloc(g->step_bytes)) ||
            !(g->dsp = dalloc(g, sizeof(dsv4_cuda_sample_params) * GB_MAX)) ||
            !(g->hsp = dsv4_cuda_host_alloc(sizeof(dsv4_cuda_sample_params) * GB_MAX)) ||
            !(g->dids = dalloc(g, sizeof(int32_t) * GB_MAX)) || !(g->hids = dsv4_cuda_host_alloc(sizeof(int32_t) * GB_MAX)))
            rc = -1;
    }
    if (rc) {
        snprintf(err, errcap, "GPU model set-up: %s", dsv4_cuda_last_error()[0] ? dsv4_cuda_last_error() : "out of memory");
        dsv4_cuda_model_free(g);
        return -1;
    }
    if (verbose)
        fprintf(stderr, "dsv4: GPU context capacity %d per sequence; workspace %.1f MB for %d rows; decode graphs %s\n",
                capacity, gpu_ws_bytes(g, g->tmax) / 1e6, g->tmax, g->graphs ? "on" : "off (DSV4_CUDA_GRAPHS=0)");
    *out = g;
    return 0;
}

/* How much a server can run: the rows of one pass, and how many more sequences fit: the pool's states plus the free
 * memory, less a reserve for what later calls allocate (cuBLASLt's plans, decode graphs, the sampler's workspace: the
 * larger of 2 GB and 4 % of the device), in states of dsv4_cuda_seq_bytes. */
int dsv4_cuda_limits(const dsv4_cuda_model *g, int *pass_rows, long *seqs) {
    size_t fr = 0, tot = 0;
    if (dsv4_cuda_mem_info(&fr, &tot)) return -1;
    size_t reserve = tot / 25;
    if (reserve < ((size_t)2 << 30)) reserve = (size_t)2 << 30;
    const size_t sb = dsv4_cuda_seq_bytes(g);
    if (pass_rows) *pass_rows = g->tmax;
    if (seqs) *seqs = g->nspool + (long)(fr > reserve && sb ? (fr - reserve) / sb : 0);
    return 0;
}

void dsv4_cuda_set_graphs(dsv4_cuda_model *g, int on) { g->graphs = on != 0; }
int dsv4_cuda_set_attn_fork(dsv4_cuda_model *g, int on) {
    const int was = g->attn_fork;
    g->attn_fork = on != 0;
    return was;
}

void dsv4_cuda_model_free(dsv4_cuda_model *g) {
    if (!g) return;
    if (g->stream) dsv4_cuda_stream_sync(g->stream);
    if (g->prof) gprof_close(g, NULL, NULL, NULL); /* a profile left open: freed */
    gpu_seq_pool_free(g);
    for (int i = 0; i < GB_N; i++)
        dsv4_cuda_graph_free(g->bk[i].layers), dsv4_cuda_graph_free(g->bk[i].head), dsv4_cuda_graph_free(g->bk[i].samp);
    if (g->L)
        for (int L = 0; L < g->m->cfg.n_layers; L++) dsv4_cuda_experts_free(&g->L[L].ex);
    for (int i = 0; i < g->nbufs; i++) dsv4_cuda_free(g->bufs[i]);
    dsv4_cuda_host_free(g->hstep);
    dsv4_cuda_host_free(g->hsp);
    dsv4_cuda_host_free(g->hids);
    if (g->stream2) dsv4_cuda_stream_sync(g->stream2);
    if (g->stream3) dsv4_cuda_stream_sync(g->stream3);
    dsv4_cuda_stream_free(g->stream);
    dsv4_cuda_stream_free(g->stream2);
    dsv4_cuda_stream_free(g->stream3);
    dsv4_cuda_event_free(g->ev_hc);
    dsv4_cuda_event_free(g->ev_hcd);
    dsv4_cuda_event_free(g->ev_fork);
    dsv4_cuda_event_free(g->ev_join);
    dsv4_cuda_event_free(g->ev_tail);
    free(g->L);
    free(g->bufs);
    free(g->ur);
    free(g);
}
