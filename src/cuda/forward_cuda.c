/* forward_cuda.c - the DeepSeek-V4 forward on the GPU (cuda_model.h) with the semantics of dsv4_forward
 * (src/model/forward.c, forward_attn.c, forward_moe.c), op for op through the kernels of cuda_backend.h and
 * cuda_model.h, all on the model's stream and all decided on the device:
 *   - a pass's tokens, positions and sequences are one small upload (dsv4_cuda_batch); every kernel that
 *     touches sequence state reads it from there, so the launch shapes depend only on the row count;
 *   - compressors emit when (pos + 1) % ratio == 0, into caches allocated for the whole capacity;
 *   - the indexer's top-k (dsv4_cuda_topk: ties to the lower index), the attention index lists and the
 *     MoE expert grouping run on the device; nothing is copied back until the logits.
 * A call with at most one token per sequence is a decode step (decode_graph.c: CUDA graphs); anything
 * else runs here in passes of at most tmax rows (long chunks are split; per-token results do not depend
 * on the split). Passes of >= 64 rows take the tensor-core paths (FP8 GEMM, attention: dsv4_cuda_attn_kv8_wg, or
 * dsv4_cuda_attn_kv8_tc for hi + lo terms and shapes outside it); decode
 * steps take the tensor-core attention (dsv4_cuda_attn_tc_decode_takes: every layer by default, else by the list
 * length alone, never by T, so a sequence's logits stay the same in any batch). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpu_internal.h"
#include "kv_cache.h"
#include "linear_gemm.h"

/* ---- errors: they name the file and line; DSV4_CUDA_DEBUG=1 synchronizes after every op (outside
 * graph capture) so that an asynchronous fault is reported where it happened ---- */

static char g_ferr[768];
static int g_debug = -1;

int gpu_fail(const char *file, int line, const char *what) {
    if (!g_ferr[0]) /* the first (innermost) failure names the op; callers up the chain keep it */
        snprintf(g_ferr, sizeof g_ferr, "%s:%d: %s", file, line, what && what[0] ? what : "out of memory");
    return -1;
}
const char *gpu_err(void) { return g_ferr[0] ? g_ferr : dsv4_cuda_last_error(); }
void gpu_err_clear(void) { g_ferr[0] = 0; }

static int ck_debug(const dsv4_cuda_model *g, int line) {
    if (g_debug < 0) g_debug = getenv("DSV4_CUDA_DEBUG") && atoi(getenv("DSV4_CUDA_DEBUG")) > 0;
    if (!g_debug || g->capturing || !dsv4_cuda_stream_sync(g->stream)) return 0;
    return gpu_fail("forward_cuda.c", line, dsv4_cuda_last_error());
}

#define CK(call) do { if ((call)) return gpu_fail("forward_cuda.c", __LINE__, dsv4_cuda_last_error()); if (ck_debug(g, __LINE__)) return -1; \
                         if (g->prof) gprof_mark(g, #call, __LINE__); } while (0)

/* CK inside a parallel branch: the branch's status in rc (the caller restores the stream whatever it is), and the op
 * marked for the profile like CK's */
#define BR(call) do { if (!rc) { rc = (call); if (!rc && g->prof) gprof_mark(g, #call, __LINE__); } } while (0)

/* ---- the workspace of a pass and the step input ---- */

static void *take(uint8_t *base, size_t *o, size_t bytes) {
    void *p = base ? base + *o : NULL;
    *o += (bytes + 255) & ~(size_t)255;
    return p;
}

/* The forward's use of the split bf16 GEMM (linear_gemm.h): switched on, and the weight's shape and T fit it */
static int split_takes(const dsv4_cuda_weight *wt, int T) {
    return dsv4_cuda_linear_gemm_split_enabled() && dsv4_cuda_linear_gemm_split_fits(wt, T);
}

/* The prefill GEMMs' workspace: the FP8 act-quant weights' largest K and N, and the split path's (weights without act
 * quant that it takes) largest K and FP8 view rows (wo_a: one group's) */
static size_t gemm_ws_need(const dsv4_cuda_model *g, int T) {
    int kq = 0, nq = 0, ks = 0, nd = 0;
    for (int L = 0; L < g->m->cfg.n_layers; L++) {
        const glayer *gl = &g->L[L];
        const dsv4_cuda_weight *ws[15] = {&gl->wq_a, &gl->wq_b, &gl->wkv, &gl->wo_a, &gl->wo_b, &gl->cmp.wkv, &gl->cmp.wgate,
                                          &gl->idx_cmp.wkv, &gl->idx_cmp.wgate, &gl->idx_wq_b, &gl->idx_wproj, &gl->gate,
                                          &gl->sw1, &gl->sw2, &gl->sw3};
        for (int i = 0; i < 15; i++) {
            const dsv4_cuda_weight *wt = ws[i];
            if (!wt->data) continue;
            if (wt->fmt == DSV4_WF_FP8 && wt->act_quant) {
                if (wt->cols > kq) kq = wt->cols;
                if (wt->rows > nq) nq = wt->rows;
            } else if (split_takes(wt, T)) {
                const int rows = wt == &gl->wo_a && g->m->cfg.o_groups > 1 ? g->m->cfg.o_lora_rank : wt->rows;
                if (wt->cols > ks) ks = wt->cols;
                if (wt->fmt == DSV4_WF_FP8 && rows > nd) nd = rows;
            }
        }
    }
    const size_t a = kq > 0 ? dsv4_cuda_linear_gemm_ws_bytes(T, kq, nq) : 0;
    const size_t b = ks > 0 ? dsv4_cuda_linear_gemm_split_ws_bytes(T, ks, nd) : 0;
    return a > b ? a : b;
}

static size_t ws_layout(const dsv4_cuda_model *g, int T, uint8_t *base, gws *w) {
    const dsv4_config *c = &g->m->cfg;
    const size_t t = (size_t)T, M = c->hc_mult, D = c->dim, H = c->n_heads, Dh = c->head_dim;
    const size_t Di = c->index_head_dim, Hi = c->index_n_heads, G = c->o_groups, Ro = c->o_lora_rank;
    const size_t E = c->n_routed_experts, K = c->n_activated_experts, I = c->moe_inter_dim, V = c->vocab_size;
    const size_t NL = c->n_layers, gin = H / (G ? G : 1) * Dh, topk = c->index_topk > 0 ? c->index_topk : 1;
    size_t cdm = 1, icdm = 1, dmax = Dh > Di ? Dh : Di, idm = 1, nidx = 1, nl = 1;
    int has_idx = 0;
    for (int L = 0; L < c->n_layers; L++) {
        const dsv4_layer *ly = &g->m->layers[L];
        if (ly->ratio > 0 && (size_t)(ly->cmp.overlap ? 2 : 1) * ly->cmp.d > cdm) cdm = (size_t)(ly->cmp.overlap ? 2 : 1) * ly->cmp.d;
        if (ly->ratio == 4 && (size_t)(ly->idx_cmp.overlap ? 2 : 1) * ly->idx_cmp.d > icdm)
            icdm = (size_t)(ly->idx_cmp.overlap ? 2 : 1) * ly->idx_cmp.d;
        if (ly->ratio == 4 && (size_t)ly->idx_cmp.d > idm) idm = (size_t)ly->idx_cmp.d;
        if (ly->ratio == 4) has_idx = 1;
        if ((size_t)g->L[L].nidx > nidx) nidx = (size_t)g->L[L].nidx;
    }
    if (has_idx) nl = (size_t)(g->cap / 4 > 0 ? g->cap / 4 : 1);
    gws tmp;
    if (!w) w = &tmp;
    memset(w, 0, sizeof *w);
    w->T = T;
    w->qg = T < g->qgmax ? T : g->qgmax;
    {   /* routed experts' token groups (weights read once a group): the whole pass with the many-block grouping (the
         * plan's gcnt below), else what one block's bitmaps hold (4096 tokens for Flash's and Pro's experts) */
        const int gmax = dsv4_cuda_moe_group_maxt_plan(K, E);
        w->tg = T < gmax ? T : gmax;
    }
    w->hr = T <= GB_MAX ? T : 256; /* a decode step's head: all of its bucket's rows in one call */
    const size_t qg = (size_t)w->qg, tgk = (size_t)w->tg * K, hr = (size_t)w->hr;
    size_t o = 0;
#define TF(field, n) w->field = take(base, &o, sizeof(float) * (n))
#define TI(field, n) w->field = take(base, &o, sizeof(int) * (n))
    TF(X, t * M * D); TF(X2, T < DSV4_CUDA_HC_PP_T ? t * M * D : 1); TF(hmix, t * (2 + M) * M);
    TF(x, t * D); TF(y, t * D); TF(post, t * M); TF(comb, t * M * M);
    TF(qr, t * c->q_lora_rank); TF(q, t * H * Dh); TF(kv, t * Dh); TF(o, t * H * Dh);
    TF(kvp, t * cdm); TF(scp, t * cdm); TF(ikvp, t * icdm); TF(iscp, t * icdm); TF(ent, t * dmax); TF(ient, t * idm);
    TF(qi, t * Hi * Di); TF(wt, t * Hi);
    TF(scores, has_idx ? qg * nl : 1);
    TF(og, t * gin); TF(zg, t * Ro); TF(z, t * G * Ro);
    TF(lgE, t * E); TF(ew, t * K); TF(gg, t * I); TF(uu, t * I); TF(ye, t * D);
    TF(hs, tgk * I); TF(ys, tgk * D); TF(hy, t * D); TF(hrow, hr * D); TF(logits, hr * V);
    TI(rpos, t); TI(irpos, t); TI(sel, t * topk); TI(nsel, t); TI(idx, t * nidx); TI(rsel, t * K); TI(nc4, t); TI(nl4, t);
    w->tkscratch = take(base, &o, 8 * (has_idx ? qg * nl : 1));
    w->keys = take(base, &o, sizeof(void *) * NL * t);
    w->qbase = take(base, &o, sizeof(void *) * t);
    {
        size_t na = dsv4_cuda_attn_kv8_scratch(t < GW_ATTN ? (int)t : GW_ATTN, H, Dh, (int)nidx);
        const size_t nt = dsv4_cuda_attn_kv8_tc_scratch((int)t, H, Dh, (int)nidx);
        if (nt > na) na = nt;
        if (T >= GW_ATTN_TC_MIN) { /* the prefill form's copy of the pass's rows (attn_kv8_wg) */
            const size_t nw = (dsv4_cuda_attn_kv8_wg_scratch(T, Dh, c->rope_head_dim) + sizeof(float) - 1) / sizeof(float);
            if (nw > na) na = nw;
        }
        w->ascr = take(base, &o, sizeof(float) * (na ? na : 1));
    }
    w->hcs = take(base, &o, dsv4_cuda_hc_scratch_bytes(T, (int)M, (int)D));
    w->plan.nact = take(base, &o, sizeof(int));
    w->plan.act_e = take(base, &o, sizeof(int) * E);
    w->plan.act_off = take(base, &o, sizeof(int) * E);
    w->plan.act_cnt = take(base, &o, sizeof(int) * E);
    w->plan.rows = take(base, &o, sizeof(int) * tgk);
    w->plan.tslot = take(base, &o, sizeof(int) * tgk);
    w->plan.rw = take(base, &o, sizeof(float) * tgk);
    w->plan.gcnt = take(base, &o, sizeof(int) * DSV4_MOE_GROUP_GCNT(w->tg, E));
    if (T >= DSV4_CUDA_LINEAR_WS_MIN_T) { /* the widest call: wo_a's groups (16 a call), or up to 5 linears of x */
        const int64_t gcols = (int64_t)(G > 16 ? 16 : (G ? G : 1)) * gin, xcols = (int64_t)5 * D;
        w->lwsb = dsv4_cuda_linear_ws_bytes(T, gcols > xcols ? gcols : xcols, 16);
        w->lws = take(base, &o, w->lwsb);
    }
    if (T >= DSV4_LINEAR_GEMM_MIN_T && dsv4_cuda_linear_gemm_enabled()) {
        const size_t need = gemm_ws_need(g, T);
        if (need > 0) {
            w->gemm_wsb = need;
            w->gemm_ws = take(base, &o, w->gemm_wsb);
        }
    }
#undef TF
#undef TI
    if (T >= DSV4_CUDA_HC_PP_T) w->X2 = NULL;
    return o;
}

/* the arena for passes of up to T rows (those below DSV4_CUDA_HC_PP_T carry w->X2; decode buckets up to
 * dsv4_cuda_decode_max hold all their rows' logits) */
size_t gpu_ws_bytes(const dsv4_cuda_model *g, int T) {
    const size_t a = ws_layout(g, T, NULL, NULL);
    const size_t b = T >= DSV4_CUDA_HC_PP_T ? ws_layout(g, DSV4_CUDA_HC_PP_T - 1, NULL, NULL) : 0;
    const int dm = dsv4_cuda_decode_max(g);
    const size_t d = dm > 1 ? ws_layout(g, dm, NULL, NULL) : 0, ab = a > b ? a : b;
    return ab > d ? ab : d;
}
void gpu_ws_carve(const dsv4_cuda_model *g, int T, gws *w) { ws_layout(g, T, g->arena, w); }

void gpu_step_layout(int T, int S, gstepl *l) {
    size_t o = 0, t = (size_t)T, s = (size_t)S;
    l->tok = o, o += 4 * t;
    l->pos = o, o += 4 * t;
    l->sid = o, o += 4 * t;
    l->p0 = o, o += 4 * s;
    l->n = o, o += 4 * s;
    l->off = o, o += 4 * s;
    l->cend = o, o += 4 * s;
    l->pe = o, o += 4 * s;
    o = (o + 15) & ~(size_t)15;
    l->sq = o, o += sizeof(void *) * s;
    l->bytes = o;
}

dsv4_cuda_batch gpu_batch_at(const dsv4_cuda_model *g, int T, int S) {
    gstepl l;
    gpu_step_layout(T, S, &l);
    dsv4_cuda_batch b;
    b.T = T, b.S = S;
    b.tok = (const int *)(g->dstep + l.tok);
    b.pos = (const int *)(g->dstep + l.pos);
    b.sid = (const int *)(g->dstep + l.sid);
    b.p0 = (const int *)(g->dstep + l.p0);
    b.n = (const int *)(g->dstep + l.n);
    b.off = (const int *)(g->dstep + l.off);
    b.cend = (const int *)(g->dstep + l.cend);
    b.pe = (const int *)(g->dstep + l.pe);
    b.sq = (dsv4_cuda_seqdev *const *)(g->dstep + l.sq);
    return b;
}

/* ---- the layers ---- */

/* Whether a linear of the pass goes to a tensor-core GEMM (w->gemm: not a decode step, T large enough): the FP8 one
 * for FP8 act-quant weights (contiguous rows only), the split bf16 one for BF16 / FP8 weights without act quant. */
static int gemm_takes(const gws *w, const dsv4_cuda_weight *wt, int T, int strided) {
    return w->gemm && w->gemm_ws && ((!strided && dsv4_cuda_linear_gemm_fits(wt, T)) || split_takes(wt, T));
}

/* A linear of the pass (x rows ldx apart, y rows ldy; 0: contiguous): a GEMM where gemm_takes, everything else (and
 * whatever a GEMM declines) through the GEMV. */
static int lin_ld(dsv4_cuda_model *g, const gws *w, const dsv4_cuda_weight *wt, const float *x, int64_t ldx, int T, float *y,
                  int64_t ldy) {
    if (w->gemm && w->gemm_ws) {
        int r = 1;
        if (!ldx && !ldy) r = dsv4_cuda_linear_gemm(wt, x, T, y, w->gemm_ws, w->gemm_wsb, g->stream);
        if (r > 0 && split_takes(wt, T))
            r = dsv4_cuda_linear_gemm_split(wt, x, ldx, T, y, ldy, w->gemm_ws, w->gemm_wsb, g->stream);
        if (r <= 0) return r;
    }
    if (!ldx && !ldy) return dsv4_cuda_linear_ws(wt, x, 0, T, y, w->lws, w->lwsb, g->stream);
    dsv4_cuda_linear_job j = {*wt, x, ldx, y, ldy};
    return dsv4_cuda_linear_multi_ws(&j, 1, 0, T, w->lws, w->lwsb, g->stream);
}

/* A parallel branch of a layer (attention's indexer, compressor or query heads, the shared expert): with fork, the ops
 * enqueued between branch_begin and branch_end go on g->stream2 after what g->stream holds so far (lin / lin_multi
 * enqueue on g->stream, so it is switched); branch_end switches back to st and records ev_join, which the main stream
 * waits for where it needs the branch's result. Without fork both are no-ops and the branch runs in line. rc: the
 * branch's status (the stream is restored either way). */
static int branch_begin(dsv4_cuda_model *g, int fork) {
    if (!fork) return 0;
    if (dsv4_cuda_event_record(g->ev_fork, g->stream) || dsv4_cuda_stream_wait(g->stream2, g->ev_fork)) return -1;
    g->stream = g->stream2;
    return 0;
}

static int branch_end(dsv4_cuda_model *g, void *st, int fork, int rc) {
    g->stream = st;
    if (rc) return rc;
    return fork ? dsv4_cuda_event_record(g->ev_join, g->stream2) : 0;
}

/* Tail work on stream2: ops that only later passes read (a compressor's pending rows), or whose input main rewrites
 * only much later (the window ring store reads w->kv). Enqueued between tail_begin and tail_end after what the main
 * stream holds so far (after_main; else after stream2's own work), and not waited for at once: tail_join makes the
 * main stream wait for all of it, before the next layer's q / kv projections rewrite w->kv and at the end of the
 * layers (a graph capture needs every stream joined). Without fork the ops run in line. */
static int tail_begin(dsv4_cuda_model *g, int fork, int after_main) {
    if (fork && !after_main) { /* stream2 is already after what the tail needs */
        g->stream = g->stream2;
        return 0;
    }
    return branch_begin(g, fork);
}

static int tail_end(dsv4_cuda_model *g, void *st, int fork, int rc) {
    g->stream = st;
    if (rc || !fork) return rc;
    g->tail = 1;
    return dsv4_cuda_event_record(g->ev_tail, g->stream2);
}

static int tail_join(dsv4_cuda_model *g) {
    if (!g->tail) return 0;
    g->tail = 0;
    return dsv4_cuda_stream_wait(g->stream, g->ev_tail);
}

/* the main stream waits for the last sub-block's post / comb (stream3) */
static int hc_join(dsv4_cuda_model *g) {
    if (!g->hc_pend) return 0;
    g->hc_pend = 0;
    return dsv4_cuda_stream_wait(g->stream, g->ev_hcd);
}

static int lin(dsv4_cuda_model *g, const gws *w, const dsv4_cuda_weight *wt, const float *x, int T, float *y) {
    return lin_ld(g, w, wt, x, 0, T, y, 0);
}

/* A job of a grouped linear: x, y contiguous rows (fp32) */
static dsv4_cuda_linear_job ljob(const dsv4_cuda_weight *wt, const float *x, float *y) {
    dsv4_cuda_linear_job j = {*wt, x, 0, y, 0};
    return j;
}

/* Linears of the pass that read the same kind of x, in as few launches as dsv4_cuda_linear_multi makes (each job's rows
 * bitwise what lin's GEMV gives them); in passes that may take the FP8 GEMM, the jobs it takes go through lin. */
static int lin_multi(dsv4_cuda_model *g, const gws *w, dsv4_cuda_linear_job *jb, int n, int T) {
    int k = 0;
    for (int i = 0; i < n; i++) {
        if (gemm_takes(w, &jb[i].w, T, jb[i].ldx || jb[i].ldy)) {
            if (lin_ld(g, w, &jb[i].w, jb[i].x, jb[i].ldx, T, jb[i].y, jb[i].ldy)) return -1;
        } else {
            jb[k++] = jb[i];
        }
    }
    return dsv4_cuda_linear_multi_ws(jb, k, 0, T, w->lws, w->lwsb, g->stream);
}

/* The rest of a compressor, after its projections of x (kvp: wkv, scp: wgate; attention() groups the linears); the
 * indexer's (which = 1) in its own entry rows (w->ient, w->irpos): the two may run at once. Without state the caller
 * updates the pending rows later (cmp_state, after these kernels). */
static int cmp_state(dsv4_cuda_model *g, const dsv4_cuda_batch *b, int L, int which, float *kvp, float *scp) {
    const dsv4_layer *ly = &g->m->layers[L];
    const dsv4_compressor *cm = which ? &ly->idx_cmp : &ly->cmp;
    const gcomp *gc = which ? &g->L[L].idx_cmp : &g->L[L].cmp;
    return dsv4_cuda_cmp_state(b, L, which, kvp, scp, gc->ape, cm->ratio, cm->d, cm->overlap, g->stream);
}

static int run_compressor(dsv4_cuda_model *g, const gws *w, const dsv4_cuda_batch *b, int L, int which, float *kvp,
                          float *scp, int state) {
    const dsv4_config *c = &g->m->cfg;
    const dsv4_layer *ly = &g->m->layers[L];
    const glayer *gl = &g->L[L];
    const dsv4_compressor *cm = which ? &ly->idx_cmp : &ly->cmp;
    const gcomp *gc = which ? &gl->idx_cmp : &gl->cmp;
    const int T = b->T, mr = cm->ratio, d = cm->d, R = c->rope_head_dim;
    float *ent = which ? w->ient : w->ent;
    int *rpos = which ? w->irpos : w->rpos;
    CK(dsv4_cuda_cmp_emit(b, L, which, kvp, scp, gc->ape, mr, d, cm->overlap, ent, rpos, g->stream));
    if (state) CK(cmp_state(g, b, L, which, kvp, scp));
    /* every row is finished (cheap); only the rows that closed a window are stored */
    if (which) { /* norm, rope, Hadamard, FP4 quant: one launch */
        CK(dsv4_cuda_rope_hq4(ent, T, 1, d, 1, gc->norm, c->norm_eps, R / 2, gl->rope_freq, rpos, g->stream));
    } else { /* norm, rope, FP8 quant of the non-rope part: one launch */
        CK(dsv4_cuda_norm_rope_q8(ent, T, 1, d, gc->norm, c->norm_eps, R / 2, gl->rope_freq, rpos, d - R, 64, g->stream));
    }
    CK(dsv4_cuda_cmp_store(b, L, which, ent, mr, d, R, c->window_size, g->stream));
    return 0;
}

/* The indexer of a ratio-4 layer after its compressor: its queries from qr (wq_b, RoPE, Hadamard, FP4), the scores over
 * the compressed keys, the top-k of each query's list into w->sel / w->nsel; on g->stream */
static int run_indexer(dsv4_cuda_model *g, const gws *w, const dsv4_cuda_batch *b, int L, int proj) {
    const dsv4_config *c = &g->m->cfg;
    const glayer *gl = &g->L[L];
    const int T = b->T, R = c->rope_head_dim, Hi = c->index_n_heads, Di = c->index_head_dim, topk = c->index_topk;
    void *st = g->stream;
    if (proj) CK(lin(g, w, &gl->idx_wq_b, w->qr, T, w->qi)); /* else the caller ran it (DSV4_CUDA_IDXQ_MAIN) */
    CK(dsv4_cuda_rope_hq4(w->qi, T, Hi, Di, 0, NULL, 0.0f, R / 2, gl->rope_freq, b->pos, st)); /* rope, Hadamard, FP4 */
    CK(dsv4_cuda_scale(w->wt, (int64_t)T * Hi, 1.0f / sqrtf((float)Di) / sqrtf((float)Hi), st));
    /* scores over the whole capacity's list (blocks past a query's list return), then the top-k of the list the
     * reference ranks (entries past the query's own are -inf, picks of them dropped) */
    const int nl = g->cap / 4 > 0 ? g->cap / 4 : 1;
    for (int t0 = 0; t0 < T; t0 += w->qg) {
        int qn = T - t0 < w->qg ? T - t0 : w->qg;
        CK(dsv4_cuda_indexer_scores(w->qi + (size_t)t0 * Hi * Di, w->wt + (size_t)t0 * Hi, qn, Hi, Di, w->keys + (size_t)L * T + t0,
                                    1, w->nc4 + t0, w->nl4 + t0, nl, nl, w->scores, st));
        CK(dsv4_cuda_topk(w->scores, qn, nl, w->nl4 + t0, w->nc4 + t0, topk, w->sel + (size_t)t0 * topk, w->nsel + t0,
                          w->tkscratch, st));
    }
    return 0;
}

/* The attention's index lists (window, then compressed entries: the indexer's picks in ratio-4 layers, every closed
 * window otherwise, which depends on the positions only), on g->stream */
static int attn_index(dsv4_cuda_model *g, const gws *w, const dsv4_cuda_batch *b, int L) {
    const dsv4_config *c = &g->m->cfg;
    const int ratio = g->m->layers[L].ratio;
    return dsv4_cuda_attn_index(b, L, c->window_size, ratio, ratio == 4 ? w->sel : NULL, w->nsel, c->index_topk, g->L[L].nidx,
                                w->idx, w->qbase, g->stream);
}

/* wo_a's group gi on the terms the attention wrote into o's rows (row = 2 HD bf16: group gi's nt terms from gi * 2 gin,
 * gin apart; f16s: its one f16 term there) into z's columns gi * Ro .. */
static int wo_a_terms(dsv4_cuda_model *g, const gws *w, const dsv4_cuda_weight *wv, int gi, int nt, const float *f16s, int T, int HD,
                      int gin, int Ro, int G) {
    dsv4_cuda_weight v = *wv;
    v.row0 += gi * Ro;
    const uint16_t *t = (const uint16_t *)w->o + (size_t)gi * 2 * gin;
    float *y = w->z + (size_t)gi * Ro;
    const int r = f16s ? dsv4_cuda_linear_gemm_terms_f16(&v, t, 2 * (int64_t)HD, T, y, (int64_t)G * Ro, f16s + 1, w->gemm_ws,
                                                         w->gemm_wsb, g->stream)
                       : dsv4_cuda_linear_gemm_terms(&v, t, 2 * (int64_t)HD, gin, nt, T, y, (int64_t)G * Ro, w->gemm_ws, w->gemm_wsb,
                                                     g->stream);
    if (r > 0) return gpu_fail("forward_cuda.c", __LINE__, "wo_a: the terms GEMM declined after the attention wrote its terms");
    return r;
}

static int attention(dsv4_cuda_model *g, const gws *w, const dsv4_cuda_batch *b, int L, const float *x, float *out) {
    const dsv4_config *c = &g->m->cfg;
    const dsv4_layer *ly = &g->m->layers[L];
    const glayer *gl = &g->L[L];
    const int T = b->T, H = c->n_heads, Dh = c->head_dim, R = c->rope_head_dim, Lq = c->q_lora_rank;
    const int W = c->window_size, G = c->o_groups, Ro = c->o_lora_rank;
    const float eps = c->norm_eps;
    void *st = g->stream;

    /* Small decode steps run two chains at once (a parallel branch of the step's graph: the same kernels on the same
     * data, so the same bits), where no linear of either stages x in the shared workspaces (below
     * DSV4_CUDA_LINEAR_WS_MIN_T rows, no GEMM); serial under an op profile or with DSV4_CUDA_ATTN_FORK=0:
     * - ratio 4: on stream2 the indexer's projections of x (its compressor's wkv, wgate and weights_proj, one grouped
     *   linear), its compressor, then after its query projection (on the main stream right after qr) their RoPE,
     *   scores, top-k and the index lists (its compressor's pending rows after that, as tail work); the main stream
     *   meanwhile the q / kv projections, the query heads, the kv row, then the attention compressor's projections and
     *   the compressor;
     * - ratio 128: on stream2 the compressor's projections, the compressor and the index lists, beside the same main
     *   chain;
     * - sliding-window layers: the query heads (wq_b, norm, RoPE) on stream2 beside the kv row and the index lists.
     * Joined (ev_join) before the attention. Serial passes group all the compressors' projections in one linear. */
    const int fork = g->attn_fork && g->stream2 && !g->prof && !w->lws && !(w->gemm && w->gemm_ws);
    const int idx = ly->ratio == 4;
    /* forked ratio-4 layers: the indexer's query projection on the main stream right after qr, before wq_b, whose
     * blocks otherwise fill the SMs first (the kernel timeline, bench/NOTES.md "Session 34"; DSV4_CUDA_IDXQ_MAIN=0: on
     * stream2), the rest of the indexer on stream2 after it */
    const int iqm = fork && idx && g->idxq_main;
    dsv4_cuda_linear_job cj[5] = {ljob(&gl->cmp.wkv, x, w->kvp), ljob(&gl->cmp.wgate, x, w->scp)};
    int nc = 2;
    if (idx) {
        cj[nc++] = ljob(&gl->idx_cmp.wkv, x, w->ikvp);
        cj[nc++] = ljob(&gl->idx_cmp.wgate, x, w->iscp);
        cj[nc++] = ljob(&gl->idx_wproj, x, w->wt);
    }
    if (ly->ratio > 0) { /* forked ratio 4: the indexer's jobs only (cj + 2), the attention compressor's come later */
        CK(branch_begin(g, fork));
        int rc = 0;
        if (fork && idx)
            BR(lin_multi(g, w, cj + 2, 3, T));
        else
            BR(lin_multi(g, w, cj, nc, T));
        BR(run_compressor(g, w, b, L, idx, idx ? w->ikvp : w->kvp, idx ? w->iscp : w->scp, !(fork && idx)));
        if (fork && !idx) BR(attn_index(g, w, b, L)); /* ratio 128: the index lists at the branch's end */
        CK(branch_end(g, st, fork && !idx, rc));
    }
    CK(tail_join(g)); /* the previous layer's ring store read w->kv */
    dsv4_cuda_linear_job qkv[2] = {ljob(&gl->wq_a, x, w->qr), ljob(&gl->wkv, x, w->kv)};
    CK(lin_multi(g, w, qkv, 2, T));
    CK(dsv4_cuda_rmsnorm(w->qr, T, Lq, Lq, gl->q_norm, eps, st));
    if (idx) { /* the indexer after qr; its compressor's pending rows after the join */
        if (iqm) CK(lin(g, w, &gl->idx_wq_b, w->qr, T, w->qi));
        CK(branch_begin(g, fork));
        int rc = 0;
        BR(run_indexer(g, w, b, L, !iqm));
        if (fork) BR(attn_index(g, w, b, L)); /* the index lists after the top-k, on the indexer's stream */
        CK(branch_end(g, st, fork, rc));
        if (fork) {
            CK(tail_begin(g, fork, 0));
            CK(tail_end(g, st, fork, cmp_state(g, b, L, 1, w->ikvp, w->iscp)));
        }
    }
    const int wgp = w->attn_tc && !dsv4_cuda_attn_kv8_tc_hilo(0, -2) && dsv4_cuda_attn_kv8_wg_enabled() &&
                    dsv4_cuda_attn_kv8_wg_fits(H, Dh, R);
    const int tc = w->attn_tc && (wgp || dsv4_cuda_attn_kv8_tc_fits(H, Dh, R));
    /* wo_a's input as the split GEMM's terms, written by the attention with the inverse RoPE (the split's read of o and
     * write of the planes, and the RoPE's pass, saved): where the split GEMM takes wo_a and has a plan for the terms */
    const int gin = H / G * Dh;
    dsv4_cuda_weight wv = gl->wo_a; /* group 0's rows */
    if (G > 1) wv.rows = Ro;
    int tnt = 0;
    const float *f16s = NULL; /* wo_a on one f16 term (DSV4_WO_A_F16; linear_gemm.h): the layer's scales */
    const int terms_ok = wgp && dsv4_cuda_attn_kv8_wg_terms_enabled() && gemm_takes(w, &wv, T, 1) &&
                         !dsv4_cuda_linear_gemm_fits(&wv, T) && dsv4_cuda_attn_kv8_wg_terms_fits(H, Dh, R, G);
    if (terms_ok && g->wo_a_f16 && gl->wo_a_f16s) {
        f16s = gl->wo_a_f16s;
        for (int gi = 0; gi < G && f16s; gi++) {
            dsv4_cuda_weight v = wv;
            v.row0 += gi * Ro;
            if (!dsv4_cuda_linear_gemm_terms_f16_ready(&v, (const uint16_t *)w->o + (size_t)gi * 2 * gin, 2 * (int64_t)H * Dh, T,
                                                       w->z + (size_t)gi * Ro, (int64_t)G * Ro))
                f16s = NULL;
        }
        tnt = f16s != NULL;
    }
    if (!tnt && terms_ok) {
        tnt = dsv4_cuda_linear_gemm_terms_nt(&wv);
        if (tnt > 2) tnt = 0;
        for (int gi = 0; gi < G && tnt; gi++) { /* every group's plan (their pointers' alignments may differ) */
            dsv4_cuda_weight v = wv;
            v.row0 += gi * Ro;
            if (!dsv4_cuda_linear_gemm_terms_ready(&v, (const uint16_t *)w->o + (size_t)gi * 2 * gin, 2 * (int64_t)H * Dh, gin, tnt, T,
                                                   w->z + (size_t)gi * Ro, (int64_t)G * Ro))
                tnt = 0;
        }
    }
    /* q as f16 for the terms form's attention (dsv4_cuda_norm_rope_h16: half the bytes written and read) */
    const int qh = tnt && dsv4_cuda_norm_rope_h16_enabled() && dsv4_cuda_norm_rope_h16_fits(w->q, Dh, NULL);
    {   /* the query heads: on stream2 in sliding-window layers */
        const int qf = fork && ly->ratio == 0;
        CK(branch_begin(g, qf));
        int rc = 0;
        BR(lin(g, w, &gl->wq_b, w->qr, T, w->q));
        if (qh) BR(dsv4_cuda_norm_rope_h16(w->q, T, H, Dh, NULL, eps, R / 2, gl->rope_freq, b->pos, g->stream)); /* head norm + RoPE */
        else BR(dsv4_cuda_norm_rope_q8(w->q, T, H, Dh, NULL, eps, R / 2, gl->rope_freq, b->pos, 0, 0, g->stream));
        CK(branch_end(g, st, qf, rc));
    }
    CK(dsv4_cuda_norm_rope_q8(w->kv, T, 1, Dh, gl->kv_norm, eps, R / 2, gl->rope_freq, b->pos, Dh - R, 64, st)); /* norm, RoPE, FP8 */
    if (idx) { /* the attention compressor (its projections here when forked) */
        if (fork) CK(lin_multi(g, w, cj, 2, T));
        CK(run_compressor(g, w, b, L, 0, w->kvp, w->scp, 1));
    }
    if (!fork || ly->ratio == 0) CK(attn_index(g, w, b, L)); /* the index lists (positions only, without the indexer) */
    if (fork) CK(dsv4_cuda_stream_wait(st, g->ev_join)); /* the other chain */

    /* attention and its output's inverse RoPE over the cache rows (kv_cache.h) and the pass's own kv; GW_ATTN rows per
     * call bound the split partials (a row's result does not depend on the rows beside it), the inverse RoPE in the
     * same kernels. Prefill passes: tensor cores, the whole pass at once, then the inverse RoPE. */
    if (tnt) {
        CK(dsv4_cuda_attn_kv8_wg_terms(w->q, T, H, Dh, R, w->qbase, w->kv, T, w->idx, gl->nidx, gl->attn_sink,
                                       1.0f / sqrtf((float)Dh), gl->rope_freq, b->pos, G, tnt, qh, f16s, w->o, w->ascr, st));
    } else if (wgp) {
        CK(dsv4_cuda_attn_kv8_wg(w->q, T, H, Dh, R, w->qbase, w->kv, T, w->idx, gl->nidx, gl->attn_sink, 1.0f / sqrtf((float)Dh),
                                 w->o, w->ascr, st));
    } else if (tc) {
        CK(dsv4_cuda_attn_kv8_tc(w->q, T, H, Dh, R, w->qbase, w->kv, w->idx, gl->nidx, gl->attn_sink, 1.0f / sqrtf((float)Dh),
                                 w->o, st));
    } else if (!w->attn_tc && dsv4_cuda_attn_tc_decode_takes(H, Dh, R, gl->nidx)) {
        CK(dsv4_cuda_attn_kv8_tc_dec(w->q, T, H, Dh, R, w->qbase, w->kv, w->idx, gl->nidx, gl->attn_sink,
                                     1.0f / sqrtf((float)Dh), gl->rope_freq, b->pos, w->o, w->ascr, st));
    } else {
        for (int t0 = 0; t0 < T; t0 += GW_ATTN) {
            int tn = T - t0 < GW_ATTN ? T - t0 : GW_ATTN;
            CK(dsv4_cuda_attn_kv8_rope(w->q + (size_t)t0 * H * Dh, tn, H, Dh, R, w->qbase + t0, w->kv,
                                       w->idx + (size_t)t0 * gl->nidx, gl->nidx, gl->attn_sink, 1.0f / sqrtf((float)Dh),
                                       gl->rope_freq, b->pos + t0, w->o + (size_t)t0 * H * Dh, w->ascr, st));
        }
    }
    /* the pass's raw kv into each sequence's window ring (after attention read the older rows): tail work */
    CK(tail_begin(g, fork, 1));
    CK(tail_end(g, st, fork, dsv4_cuda_ring_store(b, L, w->kv, W, Dh, R, g->stream)));
    if (tc && !tnt) CK(dsv4_cuda_rope(w->o, T, H, Dh, R / 2, gl->rope_freq, b->pos, 1, st));

    /* grouped output projection: group gi's heads (gin columns of o from gi * gin) through rows gi * Ro .. of wo_a
     * into z's columns gi * Ro ..: strided jobs of grouped linears; passes that take the FP8 GEMM (contiguous rows)
     * copy each group's slices in and out instead */
    if (tnt) { /* the terms in o's rows: group gi's at bf16 element gi * 2 gin of each row (dsv4_cuda_attn_kv8_wg_terms) */
        for (int gi = 0; gi < G; gi++) CK(wo_a_terms(g, w, &wv, gi, tnt, f16s, T, H * Dh, gin, Ro, G));
    } else if (G == 1) {
        CK(lin(g, w, &gl->wo_a, w->o, T, w->z));
    } else {
        for (int g0 = 0; g0 < G; g0 += 16) {
            dsv4_cuda_linear_job jb[16];
            const int ng = G - g0 < 16 ? G - g0 : 16;
            for (int i = 0; i < ng; i++) {
                jb[i] = ljob(&gl->wo_a, w->o + (size_t)(g0 + i) * gin, w->z + (size_t)(g0 + i) * Ro);
                jb[i].w.row0 += (g0 + i) * Ro, jb[i].w.rows = Ro;
                jb[i].ldx = (int64_t)H * Dh, jb[i].ldy = (int64_t)G * Ro;
            }
            if (gemm_takes(w, &jb[0].w, T, 1)) { /* the split GEMM reads o and writes z in place */
                for (int i = 0; i < ng; i++) CK(lin_ld(g, w, &jb[i].w, jb[i].x, jb[i].ldx, T, jb[i].y, jb[i].ldy));
                continue;
            }
            if (!(w->gemm && w->gemm_ws && dsv4_cuda_linear_gemm_fits(&jb[0].w, T))) {
                CK(dsv4_cuda_linear_multi_ws(jb, ng, 0, T, w->lws, w->lwsb, st));
                continue;
            }
            for (int i = 0; i < ng; i++) {
                CK(dsv4_cuda_copy2d(w->og, gin, jb[i].x, jb[i].ldx, T, gin, st));
                CK(lin(g, w, &jb[i].w, w->og, T, w->zg));
                CK(dsv4_cuda_copy2d(jb[i].y, jb[i].ldy, w->zg, Ro, T, Ro, st));
            }
        }
    }
    CK(lin(g, w, &gl->wo_b, w->z, T, out));
    return 0;
}

/* The shared expert of x into w->ye, on stream2 with fork (its join: ev_join) */
static int shared_expert(dsv4_cuda_model *g, const gws *w, const glayer *gl, const float *x, int T, int I, int fork) {
    void *st = g->stream;
    CK(branch_begin(g, fork));
    dsv4_cuda_linear_job sj[2] = {ljob(&gl->sw1, x, w->gg), ljob(&gl->sw3, x, w->uu)};
    int rc = 0;
    BR(lin_multi(g, w, sj, 2, T));
    BR(dsv4_cuda_swiglu(w->gg, w->uu, I, T, I, g->m->cfg.swiglu_limit, NULL, w->gg, g->stream));
    BR(lin(g, w, &gl->sw2, w->gg, T, w->ye));
    CK(branch_end(g, st, fork, rc));
    return 0;
}

/* The MoE block of x into out; po: the input of its mHC post, out itself, or (defer, one token group) the experts'
 * rows and slots for the next sub-block's post kernel to combine (dsv4_cuda_hc_post_pre: the same additions) */
static int moe(dsv4_cuda_model *g, const gws *w, const dsv4_cuda_batch *b, int L, const float *x, float *out, int defer,
               dsv4_cuda_hc_f *po) {
    const dsv4_config *c = &g->m->cfg;
    const dsv4_layer *ly = &g->m->layers[L];
    const glayer *gl = &g->L[L];
    const int T = b->T, D = c->dim, E = c->n_routed_experts, K = c->n_activated_experts, I = c->moe_inter_dim;
    void *st = g->stream;
    /* the shared expert on the second stream, beside the routed experts (a parallel branch of the step's graph; the
     * same kernels on the same data, so the same bits): at small batches each leaves most of the GPU idle. Serial
     * while an op profile times the ops one by one. Forked before the gate in small decode steps (the
     * kernel timeline had the branch ending ~7 us after the routed experts in every layer at batch 1 when it forked after
     * the router; session 34: batch 1 0.984x, batch 8 0.979x), else (or DSV4_CUDA_SHARED_EARLY=0) after the router. */
    const int fork = ly->has_shared && g->stream2 && !g->prof;
    /* early only where neither the gate's linear nor the shared expert's stage x in the shared workspaces (small decode
     * steps: no multi-token staging, no GEMM), as attention()'s forks */
    const int early = fork && g->sh_early && !w->lws && !(w->gemm && w->gemm_ws);
    if (early) CK(shared_expert(g, w, gl, x, T, I, fork));
    CK(lin(g, w, &gl->gate, x, T, w->lgE));
    if (w->tg < 1) return gpu_fail("forward_cuda.c", __LINE__, "moe: no token group of the routed experts fits moe_group's shared memory");
    const int ng = (T + w->tg - 1) / w->tg, even = ((T + ng - 1) / ng + 31) / 32 * 32;
    const int gsz = even < w->tg ? even : w->tg;
    /* one token group: the router and the grouping together (one kernel with few tokens) */
    const float *gbias = ly->hash ? NULL : gl->gate_bias;
    const int *t2e = ly->hash ? gl->tid2eid : NULL;
    if (ng == 1) CK(dsv4_cuda_moe_route(w->lgE, T, E, K, gbias, t2e, b->tok, c->route_scale, b->sid, w->rsel, w->ew, &w->plan, st));
    else CK(dsv4_cuda_router(w->lgE, T, E, K, gbias, t2e, b->tok, c->route_scale, w->rsel, w->ew, st));
    if (ly->has_shared && !early) CK(shared_expert(g, w, gl, x, T, I, fork));
    /* routed experts, in equal groups of at most w->tg tokens (each token's result does not depend on its group) */
    *po = (dsv4_cuda_hc_f){out, NULL, NULL, 0, NULL};
    if (ng > 1) defer = 0;
    for (int g0 = 0; g0 < T; g0 += gsz) {
        int tg = T - g0 < gsz ? T - g0 : gsz;
        if (ng > 1) CK(dsv4_cuda_moe_group(w->rsel + (size_t)g0 * K, w->ew + (size_t)g0 * K, b->sid + g0, tg, K, E, &w->plan, st));
        if (w->gemm) /* a pass: the prefill kernels where they take it */
            CK(dsv4_cuda_moe_experts_pass(&gl->ex, x + (size_t)g0 * D, tg, K, &w->plan, c->swiglu_limit, w->hs, w->ys, st) < 0);
        else
            CK(dsv4_cuda_moe_experts(&gl->ex, x + (size_t)g0 * D, tg, K, &w->plan, c->swiglu_limit, w->hs, w->ys, st));
        if (fork && g0 == 0) CK(dsv4_cuda_stream_wait(st, g->ev_join)); /* the shared expert's y, for the combine */
        if (defer) {
            *po = (dsv4_cuda_hc_f){out, w->ys, w->plan.tslot, K, ly->has_shared ? w->ye : NULL};
            continue;
        }
        CK(dsv4_cuda_moe_combine(w->ys, w->plan.tslot, tg, K, D, ly->has_shared ? w->ye + (size_t)g0 * D : NULL,
                                 out + (size_t)g0 * D, st));
    }
    return 0;
}

/* One sub-block up to its output w->y, on the streams X. Its mHC post is left to the next sub-block's pre (one kernel
 * for both with few tokens: dsv4_cuda_hc_post_pre) or to gpu_run_layers after the last. Xin: the previous sub-block's
 * streams, its post pending (NULL: none; X itself: in place). */
static int sub_block(dsv4_cuda_model *g, const gws *w, const dsv4_cuda_batch *b, int L, int ffn, const float *Xin, float *X,
                     const dsv4_cuda_hc_f *pi, dsv4_cuda_hc_f *po, int last) {
    const dsv4_config *c = &g->m->cfg;
    const glayer *gl = &g->L[L];
    const int T = b->T, M = c->hc_mult, D = c->dim;
    const dsv4_cuda_weight *fn = ffn ? &gl->hc_ffn_fn : &gl->hc_attn_fn;
    const float *scale = ffn ? gl->hc_ffn_scale : gl->hc_attn_scale, *base = ffn ? gl->hc_ffn_base : gl->hc_attn_base;
    const float *nw = ffn ? gl->ffn_norm : gl->attn_norm;
    gprof_layer(g, g->m->layers[L].ratio);
    if (Xin) { /* the previous sub-block's post, then this one's pre + RMSNorm; with few tokens this one's post / comb
                * (the Sinkhorn) on stream3 beside the sub-block's work, from the mixes the pre stores (the same bits) */
        const int defer = Xin != X && g->hc_defer && g->stream3 && !g->prof;
        CK(hc_join(g));
        CK(dsv4_cuda_hc_post_pre(pi, Xin, X, T, M, D, fn, scale, base, c->hc_sinkhorn_iters, c->norm_eps, c->hc_eps, nw, w->x,
                                 w->post, w->comb, defer ? w->hmix : NULL, w->hcs, g->stream));
        if (defer) {
            CK(dsv4_cuda_event_record(g->ev_hc, g->stream));
            CK(dsv4_cuda_stream_wait(g->stream3, g->ev_hc));
            CK(dsv4_cuda_hc_comb(w->hmix, T, M, scale, base, c->hc_sinkhorn_iters, c->hc_eps, w->post, w->comb, g->stream3));
            CK(dsv4_cuda_event_record(g->ev_hcd, g->stream3));
            g->hc_pend = 1;
        }
    } else
        CK(dsv4_cuda_hc_pre(X, T, M, D, fn, scale, base, c->hc_sinkhorn_iters, c->norm_eps, c->hc_eps, nw, w->x, w->post,
                            w->comb, w->hcs, g->stream));
    /* a routed-experts combine that a post kernel can take over (out of place: few tokens) is left to it */
    *po = (dsv4_cuda_hc_f){w->y, NULL, NULL, 0, NULL};
    CK(ffn ? moe(g, w, b, L, w->x, w->y, !last && w->X2 && T <= g->combine_defer, po) : attention(g, w, b, L, w->x, w->y));
    return 0;
}

int gpu_run_layers(dsv4_cuda_model *g, const gws *w, const dsv4_cuda_batch *b) {
    const dsv4_config *c = &g->m->cfg;
    g->tail = 0, g->hc_pend = 0;
    CK(dsv4_cuda_step_meta(b, c->n_layers, g->cap / 4 > 0 ? g->cap / 4 : 1, w->keys, w->nc4, w->nl4, g->stream));
    CK(dsv4_cuda_embed(&g->embed, b->tok, b->T, c->hc_mult, w->X, g->stream));
    /* the streams alternate between w->X and w->X2 (few-token passes: each post writes the other buffer, inside the next
     * pre's mixing kernel), else stay in w->X (posts in place); the last post writes w->X for the head */
    float *Xb[2] = {w->X, w->X2 ? w->X2 : w->X};
    int cur = 0;
    dsv4_cuda_hc_f pf[2]; /* the post inputs of the previous sub-block and this one */
    for (int L = 0; L < c->n_layers; L++)
        for (int ffn = 0; ffn < 2; ffn++) {
            const int first = L == 0 && !ffn, nxt = first ? cur : cur ^ 1, k = (2 * L + ffn) & 1;
            CK(sub_block(g, w, b, L, ffn, first ? NULL : Xb[cur], Xb[nxt], &pf[k ^ 1], &pf[k], ffn && L == c->n_layers - 1));
            cur = nxt;
        }
    CK(hc_join(g));
    if (c->n_layers > 0) /* the last sub-block's post (its layer's op in a profile) */
        CK(dsv4_cuda_hc_post_to(w->y, Xb[cur], w->X, b->T, c->hc_mult, c->dim, w->post, w->comb, g->stream));
    gprof_layer(g, -1);
    CK(tail_join(g));
    CK(dsv4_cuda_seq_advance(b, g->stream));
    return 0;
}

int gpu_run_head(dsv4_cuda_model *g, const gws *w, int T) {
    const dsv4_config *c = &g->m->cfg;
    const int M = c->hc_mult, D = c->dim;
    CK(dsv4_cuda_hc_head(w->X, T, M, D, &g->hc_head_fn, g->hc_head_scale, g->hc_head_base, c->norm_eps, c->hc_eps, g->norm,
                         w->hy, w->hcs, g->stream)); /* + the final RMSNorm */
    CK(dsv4_cuda_linear_ws(&g->head, w->hy, 0, T, w->logits, w->lws, w->lwsb, g->stream));
    return 0;
}

/* ---- passes (prefill and any call that is not a decode step) ---- */

typedef struct gslot {
    dsv4_cuda_seq *seq;
    const int32_t *tok;
    int p0, n, last; /* last: the slot's chunk ends the sequence's tokens of this call */
    int cend;        /* where the sequence's tokens of this call end */
    int si;          /* the call's sequence index */
} gslot;

/* Sampling on the device instead of logits to the host (dsv4_cuda_forward_sample): each sequence's last row drawn
 * with sp[si] from its first n_vocab logits, the id into next[si]. */
typedef struct gsamp {
    const dsv4_cuda_sample_params *sp;
    int n_vocab;
    int32_t *next;
} gsamp;

/* One pass of S slots, T rows. Logits rows (all rows, or the last row of each slot with `last`) go to
 * logits + *row * V; *row advances. With smp (mode DSV4_LOGITS_LAST, logits unused): the last rows are sampled on the
 * device instead and only their ids come back (smp->next). */
static int run_pass(dsv4_cuda_model *g, const gslot *sl, int S, int T, int mode, float *logits, size_t *row,
                    const gsamp *smp) {
    const dsv4_config *c = &g->m->cfg;
    const int D = c->dim, V = c->vocab_size, M = c->hc_mult;
    gstepl l;
    gpu_step_layout(T, S, &l);
    g->last_bucket = -1; /* the step buffer no longer holds a decode step */
    uint8_t *h = g->hstep;
    int *tok = (int *)(h + l.tok), *pos = (int *)(h + l.pos), *sid = (int *)(h + l.sid);
    int *p0 = (int *)(h + l.p0), *n = (int *)(h + l.n), *off = (int *)(h + l.off);
    int *cend = (int *)(h + l.cend), *pe = (int *)(h + l.pe);
    dsv4_cuda_seqdev **sq = (dsv4_cuda_seqdev **)(h + l.sq);
    for (int s = 0, t = 0; s < S; s++) {
        p0[s] = sl[s].p0, n[s] = sl[s].n, off[s] = t, sq[s] = sl[s].seq->dev;
        cend[s] = sl[s].cend, pe[s] = sl[s].seq->prefill_end;
        for (int i = 0; i < sl[s].n; i++, t++) tok[t] = sl[s].tok[i], pos[t] = sl[s].p0 + i, sid[t] = s;
    }
    CK(dsv4_cuda_upload_async(g->dstep, h, l.bytes, g->stream));
    gprof_run_begin(g);
    dsv4_cuda_batch b = gpu_batch_at(g, T, S);
    gws w;
    gpu_ws_carve(g, T, &w);
    w.gemm = w.gemm_ws != NULL; /* not a decode step: the FP8 linears may take the tensor-core GEMM */
    w.attn_tc = T >= GW_ATTN_TC_MIN && dsv4_cuda_attn_tc_enabled(); /* not a decode step: attention on tensor cores */
    CK(gpu_run_layers(g, &w, &b));
    int nout = 0;
    if (mode != DSV4_LOGITS_NONE && (logits || smp)) {
        CK(dsv4_cuda_hc_head(w.X, T, M, D, &g->hc_head_fn, g->hc_head_scale, g->hc_head_base, c->norm_eps, c->hc_eps, g->norm,
                             w.hy, w.hcs, g->stream)); /* + the final RMSNorm, per row */
        for (int s = 0; s < S; s++) nout += mode == DSV4_LOGITS_ALL ? sl[s].n : sl[s].last;
        /* (with smp: mode LAST and nout <= the call's sequences <= GB_MAX, dsv4_cuda_forward_sample's checks) */
        for (int r0 = 0, s = 0, t = 0; r0 < nout; r0 += w.hr) {
            int k = nout - r0 < w.hr ? nout - r0 : w.hr;
            float *rows = w.hy + (size_t)r0 * D;
            if (mode == DSV4_LOGITS_LAST) { /* gather the last rows of the slots that end here */
                rows = w.hrow;
                for (int i = 0; i < k; s++) {
                    t += sl[s].n;
                    if (!sl[s].last) continue;
                    if (smp) g->hsp[r0 + i] = smp->sp[sl[s].si];
                    CK(dsv4_cuda_copy(w.hrow + (size_t)i++ * D, w.hy + (size_t)(t - 1) * D, sizeof(float) * D, g->stream));
                }
            }
            CK(dsv4_cuda_linear_ws(&g->head, rows, 0, k, w.logits, w.lws, w.lwsb, g->stream));
            if (smp) { /* the rows' parameters (pinned, each chunk its own part), the draws, the ids back */
                CK(dsv4_cuda_upload_async(g->dsp + r0, g->hsp + r0, sizeof *g->hsp * (size_t)k, g->stream));
                CK(dsv4_cuda_sample(w.logits, V, k, smp->n_vocab, g->dsp + r0, 0, g->dids + r0, g->stream));
                CK(dsv4_cuda_download_async(g->hids + r0, g->dids + r0, sizeof(int32_t) * (size_t)k, g->stream));
            } else
                CK(dsv4_cuda_download_async(logits + (*row + (size_t)r0) * V, w.logits, sizeof(float) * (size_t)k * V, g->stream));
        }
        if (!smp) *row += (size_t)nout;
    }
    CK(dsv4_cuda_stream_sync(g->stream)); /* the pinned step buffer is reused by the next pass */
    if (smp)
        for (int s = 0, i = 0; s < S; s++)
            if (sl[s].last) smp->next[sl[s].si] = g->hids[i++];
    return 0;
}

static int gpu_prefill(dsv4_cuda_model *g, int nseq, dsv4_cuda_seq *const *seqs, const int32_t *const *tokens,
                       const int *ntok, float *logits, int mode, const gsamp *smp) {
    gslot *sl = malloc(sizeof *sl * (size_t)g->tmax);
    if (!sl) return gpu_fail("forward_cuda.c", __LINE__, "out of memory");
    size_t row = 0;
    int s = 0, i = 0, rc = 0;
    while (s < nseq && !rc) {
        int S = 0, T = 0;
        while (s < nseq && T < g->tmax) {
            if (i >= ntok[s]) {
                s++, i = 0;
                continue;
            }
            int take = ntok[s] - i < g->tmax - T ? ntok[s] - i : g->tmax - T;
            sl[S].seq = seqs[s];
            sl[S].tok = tokens[s] + i;
            sl[S].p0 = seqs[s]->pos + i;
            sl[S].n = take;
            sl[S].last = i + take == ntok[s];
            sl[S].cend = seqs[s]->pos + ntok[s];
            sl[S].si = s;
            S++, T += take, i += take;
        }
        if (T) rc = run_pass(g, sl, S, T, mode, logits, &row, smp);
    }
    free(sl);
    return rc;
}

int dsv4_cuda_forward(dsv4_cuda_model *g, int nseq, dsv4_cuda_seq *const *seqs, const int32_t *const *tokens,
                      const int *ntok, float *logits, int mode, char *err, size_t errcap) {
    int T = 0, step = 1;
    for (int s = 0; s < nseq; s++) {
        T += ntok[s];
        if (ntok[s] > 1) step = 0;
    }
    if (T == 0) return 0;
    gpu_err_clear();
    int rc = step && T <= dsv4_cuda_decode_max(g) ? gpu_decode(g, nseq, seqs, tokens, ntok, logits, mode)
                                 : gpu_prefill(g, nseq, seqs, tokens, ntok, logits, mode, NULL);
    if (rc) {
        if (err && errcap) snprintf(err, errcap, "forward (GPU): %s", gpu_err());
        return -1;
    }
    for (int s = 0; s < nseq; s++) seqs[s]->pos += ntok[s];
    return 0;
}

int dsv4_cuda_forward_sample(dsv4_cuda_model *g, int nseq, dsv4_cuda_seq *const *seqs, const int32_t *const *tokens,
                             const int *ntok, const dsv4_cuda_sample_params *sp, int n_vocab, int32_t *next, char *err,
                             size_t errcap) {
    const int V = g->m->cfg.vocab_size;
    if (nseq < 1 || nseq > GB_MAX || n_vocab < 1 || n_vocab > V) {
        if (err && errcap) snprintf(err, errcap, "forward_sample: %d sequences (1 .. %d), n_vocab %d (1 .. %d)", nseq, GB_MAX, n_vocab, V);
        return -1;
    }
    for (int s = 0; s < nseq; s++)
        if (ntok[s] < 1) {
            if (err && errcap) snprintf(err, errcap, "forward_sample: sequence %d has no tokens (each needs one to sample after)", s);
            return -1;
        }
    gpu_err_clear();
    const gsamp smp = {sp, n_vocab, next};
    if (gpu_prefill(g, nseq, seqs, tokens, ntok, NULL, DSV4_LOGITS_LAST, &smp)) {
        if (err && errcap) snprintf(err, errcap, "forward_sample (GPU): %s", gpu_err());
        return -1;
    }
    for (int s = 0; s < nseq; s++) seqs[s]->pos += ntok[s];
    return gpu_ids_ok(next, nseq, "forward_sample", err, errcap); /* (-2: the passes ran, the tokens are consumed) */
}
