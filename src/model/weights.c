/* weights.c - binds a checkpoint's tensors to the model (spec 15), checking every tensor's dtype and
 * shape against the config, recognising each weight's format from its dtype and companion tensors
 * (spec 14): nothing is dequantized here. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../io/names.h"
#include "../quant/formats.h"
#include "model.h"

typedef struct {
    char *name; /* internal */
    const dsv4_st_tensor *t;
    int used;
} entry;

typedef struct {
    dsv4_model *m;
    const dsv4_config *c;
    entry *e;
    size_t n;
    dsv4_err *err;
} binder;

static int entry_cmp(const void *a, const void *b) {
    return strcmp(((const entry *)a)->name, ((const entry *)b)->name);
}

static entry *lookup(binder *b, const char *name) {
    entry key = {.name = (char *)name};
    entry *e = bsearch(&key, b->e, b->n, sizeof *b->e, entry_cmp);
    if (e) e->used = 1;
    return e;
}

static const char *fpath(binder *b, const dsv4_st_tensor *t) { return dsv4_st_file_path(b->m->st, t->file); }

static void shape_str(const dsv4_st_tensor *t, char *s, size_t cap) {
    size_t o = 0;
    o += (size_t)snprintf(s + o, cap - o, "[");
    for (int i = 0; i < t->ndim && o < cap; i++)
        o += (size_t)snprintf(s + o, cap - o, "%s%lld", i ? ", " : "", (long long)t->shape[i]);
    if (o < cap) snprintf(s + o, cap - o, "]");
}

static int bad_shape(binder *b, const dsv4_st_tensor *t, const char *want) {
    char got[128];
    shape_str(t, got, sizeof got);
    return dsv4_errf(b->err, "%s: tensor '%s' (%s): shape %s, but the config implies %s", fpath(b, t), t->name,
                     dsv4_dtype_name(t->dtype), got, want);
}

static int is2d(const dsv4_st_tensor *t, int64_t r, int64_t c) {
    return t->ndim == 2 && t->shape[0] == r && t->shape[1] == c;
}

static int missing(binder *b, const char *name) {
    return dsv4_errf(b->err, "%s: missing tensor '%s' (internal name; also looked for its Hugging Face spelling)",
                     b->m->dir, name);
}

/* A linear weight "BASE.weight" [rows, cols] in any supported format. */
static int bind_weight(binder *b, const char *base, int rows, int cols, int linear_qat, dsv4_weight *w) {
    char name[320], want[64];
    snprintf(name, sizeof name, "%s.weight", base);
    entry *e = lookup(b, name);
    if (!e) return missing(b, name);
    const dsv4_st_tensor *t = e->t;
    memset(w, 0, sizeof *w);
    w->rows = rows;
    w->cols = cols;
    w->data = t->data;
    w->name = t->name;
    snprintf(want, sizeof want, "[%d, %d]", rows, cols);
    switch (t->dtype) {
    case DSV4_DT_F32:
    case DSV4_DT_BF16:
    case DSV4_DT_F16:
        if (!is2d(t, rows, cols)) return bad_shape(b, t, want);
        w->fmt = t->dtype == DSV4_DT_F32 ? DSV4_WF_F32 : t->dtype == DSV4_DT_BF16 ? DSV4_WF_BF16 : DSV4_WF_F16;
        break;
    case DSV4_DT_F8_E4M3: {
        if (!is2d(t, rows, cols)) return bad_shape(b, t, want);
        snprintf(name, sizeof name, "%s.scale", base);
        entry *s = lookup(b, name);
        if (!s)
            return dsv4_errf(b->err, "%s: FP8 tensor '%s' has no block scale ('%s' or '%s.weight_scale_inv')",
                             fpath(b, t), t->name, name, base);
        int64_t sr = (rows + 127) / 128, sc = (cols + 127) / 128;
        snprintf(want, sizeof want, "[%lld, %lld]", (long long)sr, (long long)sc);
        if (s->t->dtype != DSV4_DT_F8_E8M0 && s->t->dtype != DSV4_DT_F32)
            return dsv4_errf(b->err, "%s: FP8 scale '%s' has dtype %s, expected F8_E8M0 or F32", fpath(b, s->t),
                             s->t->name, dsv4_dtype_name(s->t->dtype));
        if (!is2d(s->t, sr, sc)) return bad_shape(b, s->t, want);
        w->fmt = DSV4_WF_FP8;
        w->scale = s->t->data;
        w->scale_f32 = s->t->dtype == DSV4_DT_F32;
        w->scale_stride = sc;
        break;
    }
    case DSV4_DT_I8:
    case DSV4_DT_U8: {
        if (cols % 2) return dsv4_errf(b->err, "%s: FP4 tensor '%s': odd input width %d", fpath(b, t), t->name, cols);
        snprintf(want, sizeof want, "[%d, %d] (packed FP4)", rows, cols / 2);
        if (!is2d(t, rows, cols / 2)) return bad_shape(b, t, want);
        char n1[320], n2[320];
        snprintf(n1, sizeof n1, "%s.weight_scale", base);
        snprintf(n2, sizeof n2, "%s.weight_scale_2", base);
        entry *ws = lookup(b, n1);
        if (ws) { /* NVFP4 */
            entry *ws2 = lookup(b, n2);
            char n3[320];
            snprintf(n3, sizeof n3, "%s.input_scale", base);
            lookup(b, n3); /* read, unused (W4A16 on Hopper) */
            if (cols % 16) return dsv4_errf(b->err, "%s: NVFP4 tensor '%s': width %d not a multiple of 16", fpath(b, t), t->name, cols);
            if (ws->t->dtype != DSV4_DT_F8_E4M3)
                return dsv4_errf(b->err, "%s: NVFP4 scale '%s' has dtype %s, expected F8_E4M3", fpath(b, ws->t),
                                 ws->t->name, dsv4_dtype_name(ws->t->dtype));
            snprintf(want, sizeof want, "[%d, %d]", rows, cols / 16);
            if (!is2d(ws->t, rows, cols / 16)) return bad_shape(b, ws->t, want);
            if (!ws2) return dsv4_errf(b->err, "%s: NVFP4 tensor '%s' has no '%s'", fpath(b, t), t->name, n2);
            if (ws2->t->dtype != DSV4_DT_F32 || ws2->t->numel != 1)
                return dsv4_errf(b->err, "%s: '%s' must be one F32 value", fpath(b, ws2->t), ws2->t->name);
            memcpy(&w->scale2, ws2->t->data, 4);
            if (!isfinite(w->scale2))
                return dsv4_errf(b->err, "%s: '%s' is not finite", fpath(b, ws2->t), ws2->t->name);
            w->fmt = DSV4_WF_NVFP4;
            w->scale = ws->t->data;
            w->scale_stride = cols / 16;
        } else {
            snprintf(n1, sizeof n1, "%s.scale", base);
            entry *s = lookup(b, n1);
            if (!s)
                return dsv4_errf(b->err, "%s: packed FP4 tensor '%s' has neither an MXFP4 '%s' nor NVFP4 '%s.weight_scale'",
                                 fpath(b, t), t->name, n1, base);
            if (cols % 32) return dsv4_errf(b->err, "%s: MXFP4 tensor '%s': width %d not a multiple of 32", fpath(b, t), t->name, cols);
            if (s->t->dtype != DSV4_DT_F8_E8M0)
                return dsv4_errf(b->err, "%s: MXFP4 scale '%s' has dtype %s, expected F8_E8M0", fpath(b, s->t),
                                 s->t->name, dsv4_dtype_name(s->t->dtype));
            snprintf(want, sizeof want, "[%d, %d]", rows, cols / 32);
            if (!is2d(s->t, rows, cols / 32)) return bad_shape(b, s->t, want);
            w->fmt = DSV4_WF_MXFP4;
            w->scale = s->t->data;
            w->scale_stride = cols / 32;
        }
        break;
    }
    default:
        return dsv4_errf(b->err, "%s: tensor '%s' has dtype %s, which is not a weight format dsv4 reads", fpath(b, t),
                         t->name, dsv4_dtype_name(t->dtype));
    }
    w->act_quant = linear_qat && b->c->recipe == DSV4_RECIPE_FP8 &&
                   (w->fmt == DSV4_WF_FP8 || w->fmt == DSV4_WF_MXFP4 || w->fmt == DSV4_WF_NVFP4);
    return 0;
}

/* A float tensor with `n` values in any of the shapes `rows x cols` (cols = 0: 1-D [rows]). */
static float *load_floats(binder *b, const char *name, int64_t rows, int64_t cols) {
    entry *e = lookup(b, name);
    if (!e) {
        missing(b, name);
        return NULL;
    }
    const dsv4_st_tensor *t = e->t;
    char want[64];
    int ok;
    if (cols) {
        snprintf(want, sizeof want, "[%lld, %lld]", (long long)rows, (long long)cols);
        ok = is2d(t, rows, cols);
    } else {
        snprintf(want, sizeof want, "[%lld]", (long long)rows);
        ok = t->ndim == 1 && t->shape[0] == rows;
    }
    if (!ok) {
        bad_shape(b, t, want);
        return NULL;
    }
    if (t->dtype != DSV4_DT_F32 && t->dtype != DSV4_DT_BF16 && t->dtype != DSV4_DT_F16) {
        dsv4_errf(b->err, "%s: tensor '%s' has dtype %s, expected F32, BF16 or F16", fpath(b, t), t->name,
                  dsv4_dtype_name(t->dtype));
        return NULL;
    }
    size_t n = (size_t)t->numel;
    float *v = malloc((n ? n : 1) * sizeof *v);
    if (!v) {
        dsv4_errf(b->err, "out of memory loading '%s'", t->name);
        return NULL;
    }
    for (size_t i = 0; i < n; i++) {
        if (t->dtype == DSV4_DT_F32) memcpy(&v[i], t->data + 4 * i, 4);
        else {
            uint16_t h;
            memcpy(&h, t->data + 2 * i, 2);
            v[i] = t->dtype == DSV4_DT_BF16 ? dsv4_bf16_to_f32(h) : dsv4_f16_to_f32(h);
        }
    }
    return v;
}

static int bind_compressor(binder *b, const char *pre, int ratio, int d, dsv4_compressor *cm) {
    const dsv4_config *c = b->c;
    char name[320];
    cm->ratio = ratio;
    cm->overlap = ratio == 4;
    cm->d = d;
    int cd = (cm->overlap ? 2 : 1) * d;
    snprintf(name, sizeof name, "%s.wkv", pre);
    if (bind_weight(b, name, cd, c->dim, 0, &cm->wkv)) return -1;
    snprintf(name, sizeof name, "%s.wgate", pre);
    if (bind_weight(b, name, cd, c->dim, 0, &cm->wgate)) return -1;
    snprintf(name, sizeof name, "%s.ape", pre);
    if (!(cm->ape = load_floats(b, name, ratio, cd))) return -1;
    snprintf(name, sizeof name, "%s.norm.weight", pre);
    if (!(cm->norm = load_floats(b, name, d, 0))) return -1;
    return 0;
}

static int bind_experts(binder *b, int L, dsv4_layer *ly) {
    const dsv4_config *c = b->c;
    int E = c->n_routed_experts, I = c->moe_inter_dim, D = c->dim;
    char name[320];
    ly->w1 = calloc((size_t)E, sizeof *ly->w1);
    ly->w2 = calloc((size_t)E, sizeof *ly->w2);
    ly->w3 = calloc((size_t)E, sizeof *ly->w3);
    if (!ly->w1 || !ly->w2 || !ly->w3) return dsv4_errf(b->err, "out of memory");
    /* Hugging Face fused 3-D tensors */
    snprintf(name, sizeof name, "layers.%d.ffn.experts.gate_up_proj", L);
    entry *gu = lookup(b, name);
    if (!gu) {
        snprintf(name, sizeof name, "layers.%d.ffn.experts.gate_up_proj.weight", L);
        gu = lookup(b, name);
    }
    if (gu) {
        snprintf(name, sizeof name, "layers.%d.ffn.experts.down_proj", L);
        entry *dn = lookup(b, name);
        if (!dn) {
            snprintf(name, sizeof name, "layers.%d.ffn.experts.down_proj.weight", L);
            dn = lookup(b, name);
        }
        if (!dn) return missing(b, name);
        const dsv4_st_tensor *tg = gu->t, *td = dn->t;
        char want[96];
        dsv4_wfmt f;
        if (tg->dtype == DSV4_DT_F32) f = DSV4_WF_F32;
        else if (tg->dtype == DSV4_DT_BF16) f = DSV4_WF_BF16;
        else if (tg->dtype == DSV4_DT_F16) f = DSV4_WF_F16;
        else
            return dsv4_errf(b->err, "%s: fused expert tensor '%s' has dtype %s; fused experts are read in F32/BF16/F16",
                             fpath(b, tg), tg->name, dsv4_dtype_name(tg->dtype));
        if (td->dtype != tg->dtype)
            return dsv4_errf(b->err, "%s: '%s' dtype %s differs from gate_up_proj's", fpath(b, td), td->name,
                             dsv4_dtype_name(td->dtype));
        snprintf(want, sizeof want, "[%d, %d, %d]", E, 2 * I, D);
        if (tg->ndim != 3 || tg->shape[0] != E || tg->shape[1] != 2 * I || tg->shape[2] != D) return bad_shape(b, tg, want);
        snprintf(want, sizeof want, "[%d, %d, %d]", E, D, I);
        if (td->ndim != 3 || td->shape[0] != E || td->shape[1] != D || td->shape[2] != I) return bad_shape(b, td, want);
        size_t es = dsv4_dtype_size(tg->dtype);
        for (int e = 0; e < E; e++) {
            dsv4_weight base = {.fmt = f, .name = tg->name};
            ly->w1[e] = base;
            ly->w1[e].rows = I;
            ly->w1[e].cols = D;
            ly->w1[e].data = tg->data + (size_t)e * 2 * I * D * es;
            ly->w3[e] = ly->w1[e];
            ly->w3[e].row0 = I;
            ly->w2[e] = base;
            ly->w2[e].name = td->name;
            ly->w2[e].rows = D;
            ly->w2[e].cols = I;
            ly->w2[e].data = td->data + (size_t)e * D * I * es;
        }
        return 0;
    }
    for (int e = 0; e < E; e++) {
        snprintf(name, sizeof name, "layers.%d.ffn.experts.%d.w1", L, e);
        if (bind_weight(b, name, I, D, 1, &ly->w1[e])) return -1;
        snprintf(name, sizeof name, "layers.%d.ffn.experts.%d.w3", L, e);
        if (bind_weight(b, name, I, D, 1, &ly->w3[e])) return -1;
        snprintf(name, sizeof name, "layers.%d.ffn.experts.%d.w2", L, e);
        if (bind_weight(b, name, D, I, 1, &ly->w2[e])) return -1;
    }
    return 0;
}

static int bind_layer(binder *b, int L) {
    const dsv4_config *c = b->c;
    dsv4_layer *ly = &b->m->layers[L];
    int D = c->dim, M = c->hc_mult, H = c->n_heads, Dh = c->head_dim, G = c->o_groups;
    int hcr = (2 + M) * M;
    char name[320];
    ly->ratio = c->compress_ratios[L];
    ly->hash = L < c->n_hash_layers;
    ly->rope_freq = malloc(sizeof(float) * (size_t)(c->rope_head_dim / 2));
    if (!ly->rope_freq) return dsv4_errf(b->err, "out of memory");
    dsv4_rope_freqs(c, ly->ratio > 0, ly->rope_freq);

#define P(fmt_) (snprintf(name, sizeof name, "layers.%d." fmt_, L), name)
    { /* hc_*_fn have no ".weight" leaf */
        entry *e = lookup(b, P("hc_attn_fn"));
        entry *f = lookup(b, P("hc_ffn_fn"));
        if (!e) return missing(b, P("hc_attn_fn"));
        if (!f) return missing(b, P("hc_ffn_fn"));
        const entry *ef[2] = {e, f};
        dsv4_weight *wf[2] = {&ly->hc_attn_fn, &ly->hc_ffn_fn};
        for (int i = 0; i < 2; i++) {
            const dsv4_st_tensor *t = ef[i]->t;
            char want[64];
            snprintf(want, sizeof want, "[%d, %d]", hcr, M * D);
            if (!is2d(t, hcr, M * D)) return bad_shape(b, t, want);
            if (t->dtype != DSV4_DT_F32 && t->dtype != DSV4_DT_BF16 && t->dtype != DSV4_DT_F16)
                return dsv4_errf(b->err, "%s: tensor '%s' has dtype %s, expected F32 or BF16", fpath(b, t), t->name,
                                 dsv4_dtype_name(t->dtype));
            memset(wf[i], 0, sizeof *wf[i]);
            wf[i]->fmt = t->dtype == DSV4_DT_F32 ? DSV4_WF_F32 : t->dtype == DSV4_DT_BF16 ? DSV4_WF_BF16 : DSV4_WF_F16;
            wf[i]->rows = hcr;
            wf[i]->cols = M * D;
            wf[i]->data = t->data;
            wf[i]->name = t->name;
        }
    }
    if (!(ly->hc_attn_base = load_floats(b, P("hc_attn_base"), hcr, 0))) return -1;
    if (!(ly->hc_attn_scale = load_floats(b, P("hc_attn_scale"), 3, 0))) return -1;
    if (!(ly->hc_ffn_base = load_floats(b, P("hc_ffn_base"), hcr, 0))) return -1;
    if (!(ly->hc_ffn_scale = load_floats(b, P("hc_ffn_scale"), 3, 0))) return -1;
    if (!(ly->attn_norm = load_floats(b, P("attn_norm.weight"), D, 0))) return -1;
    if (!(ly->ffn_norm = load_floats(b, P("ffn_norm.weight"), D, 0))) return -1;

    if (bind_weight(b, P("attn.wq_a"), c->q_lora_rank, D, 1, &ly->wq_a)) return -1;
    if (bind_weight(b, P("attn.wq_b"), H * Dh, c->q_lora_rank, 1, &ly->wq_b)) return -1;
    if (bind_weight(b, P("attn.wkv"), Dh, D, 1, &ly->wkv)) return -1;
    /* wo_a: the official converter runs it as a bf16 grouped GEMM, no activation quantization */
    if (bind_weight(b, P("attn.wo_a"), G * c->o_lora_rank, H / G * Dh, 0, &ly->wo_a)) return -1;
    if (bind_weight(b, P("attn.wo_b"), D, G * c->o_lora_rank, 1, &ly->wo_b)) return -1;
    if (!(ly->q_norm = load_floats(b, P("attn.q_norm.weight"), c->q_lora_rank, 0))) return -1;
    if (!(ly->kv_norm = load_floats(b, P("attn.kv_norm.weight"), Dh, 0))) return -1;
    if (!(ly->attn_sink = load_floats(b, P("attn.attn_sink"), H, 0))) return -1;
    if (ly->ratio > 0) {
        if (bind_compressor(b, P("attn.compressor"), ly->ratio, Dh, &ly->cmp)) return -1;
        if (ly->ratio == 4) {
            int Hi = c->index_n_heads, Di = c->index_head_dim;
            if (bind_weight(b, P("attn.indexer.wq_b"), Hi * Di, c->q_lora_rank, 1, &ly->idx_wq_b)) return -1;
            if (bind_weight(b, P("attn.indexer.weights_proj"), Hi, D, 0, &ly->idx_wproj)) return -1;
            if (bind_compressor(b, P("attn.indexer.compressor"), 4, Di, &ly->idx_cmp)) return -1;
        }
    }
    /* MoE */
    int E = c->n_routed_experts, K = c->n_activated_experts;
    if (bind_weight(b, P("ffn.gate"), E, D, 0, &ly->gate)) return -1;
    if (ly->hash) {
        entry *e = lookup(b, P("ffn.gate.tid2eid"));
        if (!e) return missing(b, name);
        const dsv4_st_tensor *t = e->t;
        char want[64];
        snprintf(want, sizeof want, "[%d, %d]", c->vocab_size, K);
        if (!is2d(t, c->vocab_size, K)) return bad_shape(b, t, want);
        if (t->dtype != DSV4_DT_I32 && t->dtype != DSV4_DT_I64)
            return dsv4_errf(b->err, "%s: tensor '%s' has dtype %s, expected I32 or I64", fpath(b, t), t->name,
                             dsv4_dtype_name(t->dtype));
        size_t n = (size_t)t->numel;
        ly->tid2eid = malloc(n * sizeof *ly->tid2eid);
        if (!ly->tid2eid) return dsv4_errf(b->err, "out of memory");
        for (size_t i = 0; i < n; i++) {
            int64_t v;
            if (t->dtype == DSV4_DT_I32) {
                int32_t v32;
                memcpy(&v32, t->data + 4 * i, 4);
                v = v32;
            } else memcpy(&v, t->data + 8 * i, 8);
            if (v < 0 || v >= E)
                return dsv4_errf(b->err, "%s: tensor '%s': entry %zu (token %zu) is expert %lld, outside 0..%d",
                                 fpath(b, t), t->name, i, i / (size_t)K, (long long)v, E - 1);
            ly->tid2eid[i] = (int32_t)v;
        }
    } else {
        if (!(ly->gate_bias = load_floats(b, P("ffn.gate.bias"), E, 0))) return -1;
    }
    if (bind_experts(b, L, ly)) return -1;
    ly->has_shared = c->n_shared_experts > 0;
    if (ly->has_shared) {
        int I = c->moe_inter_dim;
        if (bind_weight(b, P("ffn.shared_experts.w1"), I, D, 1, &ly->sw1)) return -1;
        if (bind_weight(b, P("ffn.shared_experts.w3"), I, D, 1, &ly->sw3)) return -1;
        if (bind_weight(b, P("ffn.shared_experts.w2"), D, I, 1, &ly->sw2)) return -1;
    }
#undef P
    return 0;
}

void dsv4_rope_freqs(const dsv4_config *c, int compressed, float *freq) {
    int R = c->rope_head_dim;
    double base = compressed ? c->compress_rope_theta : c->rope_theta;
    for (int i = 0; i < R / 2; i++) freq[i] = (float)(1.0 / pow(base, (2.0 * i) / R));
    if (!compressed || c->original_seq_len <= 0) return;
    double lo = floor(R * log(c->original_seq_len / (c->beta_fast * 2 * M_PI)) / (2 * log(base)));
    double hi = ceil(R * log(c->original_seq_len / (c->beta_slow * 2 * M_PI)) / (2 * log(base)));
    if (lo < 0) lo = 0;
    if (hi > R - 1) hi = R - 1;
    if (lo == hi) hi += 0.001;
    for (int i = 0; i < R / 2; i++) {
        double ramp = (i - lo) / (hi - lo);
        if (ramp < 0) ramp = 0;
        if (ramp > 1) ramp = 1;
        freq[i] = (float)(freq[i] * (1 - ramp) + freq[i] / c->rope_factor * ramp);
    }
}

static int check_model_config(const dsv4_config *c, const char *dir, dsv4_err *err) {
    int Di = c->index_head_dim;
    if (c->hc_mult > 16)
        return dsv4_errf(err, "%s/config.json: field 'hc_mult': at most 16 residual streams are supported (got %d)", dir, c->hc_mult);
    for (int L = 0; L < c->n_layers; L++)
        if (c->compress_ratios[L] == 4 && (Di & (Di - 1)))
            return dsv4_errf(err, "%s/config.json: field 'index_head_dim': must be a power of two for the indexer's Hadamard rotation (got %d)", dir, Di);
    return 0;
}

int dsv4_model_load_dir(const char *dir, dsv4_model **out, dsv4_err *err) {
    *out = NULL;
    dsv4_model *m = calloc(1, sizeof *m);
    if (!m) return dsv4_errf(err, "out of memory");
    m->dir = strdup(dir);
    binder b = {.m = m, .c = &m->cfg, .err = err};
    if (dsv4_config_load(dir, &m->cfg, err)) goto fail;
    if (check_model_config(&m->cfg, dir, err)) goto fail;
    if (dsv4_st_open_dir(dir, &m->st, err)) goto fail;
    const dsv4_config *c = &m->cfg;

    size_t n = dsv4_st_count(m->st);
    b.e = calloc(n ? n : 1, sizeof *b.e);
    if (!b.e) {
        dsv4_errf(err, "out of memory");
        goto fail;
    }
    for (size_t i = 0; i < n; i++) {
        const dsv4_st_tensor *t = dsv4_st_at(m->st, i);
        char in[512];
        if (!strncmp(t->name, "mtp.", 4) || !strncmp(t->name, "model.mtp.", 10)) {
            m->n_mtp_skipped++;
            continue;
        }
        if (dsv4_name_to_internal(t->name, in, sizeof in)) {
            dsv4_errf(err, "%s: tensor name too long: '%.200s'", dsv4_st_file_path(m->st, t->file), t->name);
            goto fail;
        }
        b.e[b.n].name = strdup(in);
        b.e[b.n].t = t;
        b.n++;
    }
    qsort(b.e, b.n, sizeof *b.e, entry_cmp);
    for (size_t i = 1; i < b.n; i++)
        if (!strcmp(b.e[i].name, b.e[i - 1].name)) {
            dsv4_errf(err, "%s: tensors '%s' and '%s' are two spellings of the same weight '%s'", dir,
                      b.e[i - 1].t->name, b.e[i].t->name, b.e[i].name);
            goto fail;
        }

    int D = c->dim, M = c->hc_mult, V = c->vocab_size;
    if (bind_weight(&b, "embed", V, D, 0, &m->embed)) goto fail;
    if (bind_weight(&b, "head", V, D, 0, &m->head)) goto fail;
    if (!(m->norm = load_floats(&b, "norm.weight", D, 0))) goto fail;
    {
        entry *e = lookup(&b, "hc_head_fn");
        if (!e) {
            missing(&b, "hc_head_fn");
            goto fail;
        }
        char want[64];
        snprintf(want, sizeof want, "[%d, %d]", M, M * D);
        if (!is2d(e->t, M, M * D) || (e->t->dtype != DSV4_DT_F32 && e->t->dtype != DSV4_DT_BF16)) {
            bad_shape(&b, e->t, want);
            goto fail;
        }
        m->hc_head_fn = (dsv4_weight){.fmt = e->t->dtype == DSV4_DT_F32 ? DSV4_WF_F32 : DSV4_WF_BF16,
                                      .rows = M, .cols = M * D, .data = e->t->data, .name = e->t->name};
    }
    if (!(m->hc_head_base = load_floats(&b, "hc_head_base", M, 0))) goto fail;
    if (!(m->hc_head_scale = load_floats(&b, "hc_head_scale", 1, 0))) goto fail;
    m->layers = calloc((size_t)c->n_layers, sizeof *m->layers);
    if (!m->layers) {
        dsv4_errf(err, "out of memory");
        goto fail;
    }
    for (int L = 0; L < c->n_layers; L++)
        if (bind_layer(&b, L)) goto fail;
    for (size_t i = 0; i < b.n; i++) {
        if (!b.e[i].used) m->n_unused++;
    }
    for (size_t i = 0; i < b.n; i++) free(b.e[i].name);
    free(b.e);
    *out = m;
    return 0;
fail:
    if (b.e) {
        for (size_t i = 0; i < b.n; i++) free(b.e[i].name);
        free(b.e);
    }
    dsv4_model_destroy(m);
    return -1;
}

void dsv4_model_foreach_weight(const dsv4_model *m, void (*fn)(void *ctx, int layer, const dsv4_weight *w),
                               void *ctx) {
    fn(ctx, -1, &m->embed);
    fn(ctx, -1, &m->head);
    fn(ctx, -1, &m->hc_head_fn);
    for (int L = 0; L < m->cfg.n_layers; L++) {
        const dsv4_layer *l = &m->layers[L];
        const dsv4_weight *ws[] = {&l->hc_attn_fn, &l->hc_ffn_fn, &l->wq_a, &l->wq_b, &l->wkv, &l->wo_a, &l->wo_b, &l->gate};
        for (size_t i = 0; i < sizeof ws / sizeof ws[0]; i++) fn(ctx, L, ws[i]);
        if (l->ratio > 0) fn(ctx, L, &l->cmp.wkv), fn(ctx, L, &l->cmp.wgate);
        if (l->ratio == 4) {
            fn(ctx, L, &l->idx_wq_b), fn(ctx, L, &l->idx_wproj);
            fn(ctx, L, &l->idx_cmp.wkv), fn(ctx, L, &l->idx_cmp.wgate);
        }
        for (int e = 0; e < m->cfg.n_routed_experts; e++) fn(ctx, L, &l->w1[e]), fn(ctx, L, &l->w2[e]), fn(ctx, L, &l->w3[e]);
        if (l->has_shared) fn(ctx, L, &l->sw1), fn(ctx, L, &l->sw2), fn(ctx, L, &l->sw3);
    }
}

static void free_cmp(dsv4_compressor *c) {
    free(c->ape);
    free(c->norm);
}

void dsv4_model_destroy(dsv4_model *m) {
    if (!m) return;
    if (m->layers)
        for (int L = 0; L < m->cfg.n_layers; L++) {
            dsv4_layer *l = &m->layers[L];
            free(l->rope_freq);
            free(l->hc_attn_base), free(l->hc_attn_scale), free(l->hc_ffn_base), free(l->hc_ffn_scale);
            free(l->attn_norm), free(l->ffn_norm), free(l->q_norm), free(l->kv_norm), free(l->attn_sink);
            free_cmp(&l->cmp);
            free_cmp(&l->idx_cmp);
            free(l->gate_bias), free(l->tid2eid);
            free(l->w1), free(l->w2), free(l->w3);
        }
    free(m->layers);
    free(m->norm), free(m->hc_head_base), free(m->hc_head_scale);
    dsv4_st_close(m->st);
    free(m->dir);
    free(m);
}
