/* ckpt_tensors.c - the tensors of a DeepSeek-V4 checkpoint from a config. See ckpt_tensors.h. */
#include "ckpt_tensors.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

typedef struct {
    dsv4_ckpt_fn fn;
    void *ctx;
    int layer;
} walk;

static void emit(walk *w, dsv4_ckpt_tensor t) {
    t.layer = w->layer;
    w->fn(w->ctx, &t);
}

static void f32(walk *w, const char *name, int64_t d0, int64_t d1, float off, float amp) {
    emit(w, (dsv4_ckpt_tensor){.name = name, .kind = DSV4_CKPT_F32, .ndim = d1 ? 2 : 1, .shape = {d0, d1},
                               .off = off, .amp = amp});
}

static void mat(walk *w, dsv4_ckpt_kind kind, const char *name, int64_t rows, int64_t cols, float std) {
    emit(w, (dsv4_ckpt_tensor){.name = name, .kind = kind, .ndim = 2, .shape = {rows, cols}, .std = std});
}

static float fan_in(int64_t cols) { return 1.0f / sqrtf((float)cols); }

/* a quantized linear (FP8 or FP4), std 1/sqrt(cols) */
static void lin(walk *w, dsv4_ckpt_kind kind, const char *name, int64_t rows, int64_t cols) {
    mat(w, kind, name, rows, cols, fan_in(cols));
}

static void compressor(walk *w, const char *pre, int64_t D, int ratio, int64_t d) {
    char n[DSV4_CKPT_NAME];
    int64_t cd = (ratio == 4 ? 2 : 1) * d;
    snprintf(n, sizeof n, "%s.wkv.weight", pre);
    mat(w, DSV4_CKPT_BF16, n, cd, D, fan_in(D));
    snprintf(n, sizeof n, "%s.wgate.weight", pre);
    mat(w, DSV4_CKPT_BF16, n, cd, D, fan_in(D));
    snprintf(n, sizeof n, "%s.ape", pre);
    f32(w, n, ratio, cd, 0.0f, 0.85f);
    snprintf(n, sizeof n, "%s.norm.weight", pre);
    f32(w, n, d, 0, 1.0f, 0.3f);
}

void dsv4_ckpt_global_tensors(const dsv4_config *c, dsv4_ckpt_fn fn, void *ctx) {
    walk w = {fn, ctx, -1};
    const int64_t V = c->vocab_size, D = c->dim, M = c->hc_mult;
    mat(&w, DSV4_CKPT_BF16, "embed.weight", V, D, 1.0f);
    mat(&w, DSV4_CKPT_BF16, "head.weight", V, D, fan_in(D));
    f32(&w, "norm.weight", D, 0, 1.0f, 0.3f);
    f32(&w, "hc_head_fn", M, M * D, 0.0f, sqrtf(3.0f / (float)(M * D)));
    f32(&w, "hc_head_base", M, 0, 0.0f, 0.7f);
    f32(&w, "hc_head_scale", 1, 0, 0.95f, 0.3f);
}

void dsv4_ckpt_layer_tensors(const dsv4_config *c, int l, dsv4_ckpt_fn fn, void *ctx) {
    walk w = {fn, ctx, l};
    const int64_t D = c->dim, M = c->hc_mult, H = c->n_heads, Dh = c->head_dim, G = c->o_groups;
    const int64_t Lq = c->q_lora_rank, Ro = c->o_lora_rank, I = c->moe_inter_dim, E = c->n_routed_experts;
    const int64_t hcr = (2 + M) * M;
    const int ratio = c->compress_ratios[l];
    char n[DSV4_CKPT_NAME];
#define N(fmt_) (snprintf(n, sizeof n, "layers.%d." fmt_, l), n)
    f32(&w, N("attn_norm.weight"), D, 0, 1.0f, 0.3f);
    f32(&w, N("ffn_norm.weight"), D, 0, 1.0f, 0.3f);
    f32(&w, N("hc_attn_fn"), hcr, M * D, 0.0f, sqrtf(3.0f / (float)(M * D)));
    f32(&w, N("hc_attn_base"), hcr, 0, 0.0f, 0.7f);
    f32(&w, N("hc_attn_scale"), 3, 0, 0.95f, 0.3f);
    f32(&w, N("hc_ffn_fn"), hcr, M * D, 0.0f, sqrtf(3.0f / (float)(M * D)));
    f32(&w, N("hc_ffn_base"), hcr, 0, 0.0f, 0.7f);
    f32(&w, N("hc_ffn_scale"), 3, 0, 0.95f, 0.3f);
    f32(&w, N("attn.attn_sink"), H, 0, 0.5f, 1.0f);
    f32(&w, N("attn.q_norm.weight"), Lq, 0, 1.0f, 0.3f);
    f32(&w, N("attn.kv_norm.weight"), Dh, 0, 1.0f, 0.3f);
    lin(&w, DSV4_CKPT_FP8, N("attn.wq_a"), Lq, D);
    lin(&w, DSV4_CKPT_FP8, N("attn.wq_b"), H * Dh, Lq);
    lin(&w, DSV4_CKPT_FP8, N("attn.wkv"), Dh, D);
    lin(&w, DSV4_CKPT_FP8, N("attn.wo_a"), G * Ro, H / G * Dh); /* FP8 in the release (spec 14.1, 15.1) */
    lin(&w, DSV4_CKPT_FP8, N("attn.wo_b"), D, G * Ro);
    if (ratio > 0) {
        compressor(&w, N("attn.compressor"), D, ratio, Dh);
        if (ratio == 4) {
            const int64_t ih = c->index_n_heads, id = c->index_head_dim;
            lin(&w, DSV4_CKPT_FP8, N("attn.indexer.wq_b"), ih * id, Lq);
            mat(&w, DSV4_CKPT_BF16, N("attn.indexer.weights_proj.weight"), ih, D, fan_in(D));
            compressor(&w, N("attn.indexer.compressor"), D, 4, id);
        }
    }
    mat(&w, DSV4_CKPT_BF16, N("ffn.gate.weight"), E, D, fan_in(D));
    if (l < c->n_hash_layers)
        emit(&w, (dsv4_ckpt_tensor){.name = N("ffn.gate.tid2eid"), .kind = DSV4_CKPT_TID2EID, .ndim = 2,
                                    .shape = {c->vocab_size, c->n_activated_experts}, .n_experts = (int)E});
    else
        f32(&w, N("ffn.gate.bias"), E, 0, -0.1f, 0.3f);
    for (int e = 0; e < E; e++) {
        snprintf(n, sizeof n, "layers.%d.ffn.experts.%d.w1", l, e);
        lin(&w, DSV4_CKPT_FP4, n, I, D);
        snprintf(n, sizeof n, "layers.%d.ffn.experts.%d.w2", l, e);
        lin(&w, DSV4_CKPT_FP4, n, D, I);
        snprintf(n, sizeof n, "layers.%d.ffn.experts.%d.w3", l, e);
        lin(&w, DSV4_CKPT_FP4, n, I, D);
    }
    if (c->n_shared_experts > 0) {
        lin(&w, DSV4_CKPT_FP8, N("ffn.shared_experts.w1"), I, D);
        lin(&w, DSV4_CKPT_FP8, N("ffn.shared_experts.w2"), D, I);
        lin(&w, DSV4_CKPT_FP8, N("ffn.shared_experts.w3"), I, D);
    }
#undef N
}

void dsv4_ckpt_tensors(const dsv4_config *c, dsv4_ckpt_fn fn, void *ctx) {
    dsv4_ckpt_global_tensors(c, fn, ctx);
    for (int l = 0; l < c->n_layers; l++) dsv4_ckpt_layer_tensors(c, l, fn, ctx);
}

static void part(dsv4_ckpt_part *p, const char *name, const char *suffix, dsv4_dtype dt, int ndim, int64_t d0,
                 int64_t d1) {
    snprintf(p->name, sizeof p->name, "%s%s", name, suffix);
    p->dtype = dt;
    p->ndim = ndim;
    p->shape[0] = d0;
    p->shape[1] = d1;
}

int dsv4_ckpt_parts(const dsv4_ckpt_tensor *t, int nvfp4, dsv4_ckpt_part out[3]) {
    const int64_t r = t->shape[0], c = t->shape[1];
    switch (t->kind) {
    case DSV4_CKPT_F32:
    case DSV4_CKPT_BF16:
    case DSV4_CKPT_TID2EID:
        part(&out[0], t->name, "",
             t->kind == DSV4_CKPT_F32 ? DSV4_DT_F32 : t->kind == DSV4_CKPT_BF16 ? DSV4_DT_BF16 : DSV4_DT_I64, t->ndim,
             r, t->ndim == 2 ? c : 0);
        return 1;
    case DSV4_CKPT_FP8:
        part(&out[0], t->name, ".weight", DSV4_DT_F8_E4M3, 2, r, c);
        part(&out[1], t->name, ".scale", DSV4_DT_F8_E8M0, 2, (r + 127) / 128, (c + 127) / 128);
        return 2;
    case DSV4_CKPT_FP4:
        part(&out[0], t->name, ".weight", DSV4_DT_I8, 2, r, c / 2);
        if (!nvfp4) {
            part(&out[1], t->name, ".scale", DSV4_DT_F8_E8M0, 2, r, c / 32);
            return 2;
        }
        part(&out[1], t->name, ".weight_scale", DSV4_DT_F8_E4M3, 2, r, c / 16);
        part(&out[2], t->name, ".weight_scale_2", DSV4_DT_F32, 1, 1, 0);
        return 3;
    }
    return 0;
}
