/* bench_model.c - real-shape synthetic checkpoints for `dsv4 bench`, and the decode byte model.
 * See bench_model.h. */
#include "bench_model.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "../cuda/kv_cache.h"
#include "../io/safetensors.h"
#include "../model/ckpt_tensors.h"

/* ---- shapes (spec 1.1) ------------------------------------------------------------------------ */

int dsv4_bench_shape_get(const char *name, dsv4_bench_shape *o) {
    memset(o, 0, sizeof *o);
    o->vocab = 129280;
    o->head_dim = 512;
    o->rope_dim = 64;
    o->n_active = 6;
    o->n_hash_layers = 3;
    o->window = 128;
    o->idx_heads = 64;
    o->idx_dim = 128;
    if (!strcmp(name, "flash")) {
        o->name = "flash";
        o->n_layers_full = 43;
        o->dim = 4096, o->n_heads = 64, o->q_lora = 1024, o->o_groups = 8, o->o_lora = 1024;
        o->moe_inter = 2048, o->n_experts = 256, o->idx_topk = 512, o->route_scale = 1.5f;
        /* [0, 0, (4, 128) x 20, 4] */
        for (int i = 0; i < o->n_layers_full; i++) o->ratio[i] = i < 2 ? 0 : (i % 2 == 0 ? 4 : 128);
    } else if (!strcmp(name, "pro")) {
        o->name = "pro";
        o->n_layers_full = 61;
        o->dim = 7168, o->n_heads = 128, o->q_lora = 1536, o->o_groups = 16, o->o_lora = 1024;
        o->moe_inter = 3072, o->n_experts = 384, o->idx_topk = 1024, o->route_scale = 2.5f;
        /* [128, 128, (4, 128) x 29, 4] */
        for (int i = 0; i < o->n_layers_full; i++) o->ratio[i] = i < 2 ? 128 : (i % 2 == 0 ? 4 : 128);
    } else if (!strcmp(name, "tiny")) { /* Flash's layout at toy widths: for testing the command */
        o->name = "tiny";
        o->n_layers_full = 6;
        o->dim = 256, o->n_heads = 4, o->head_dim = 128, o->q_lora = 128, o->o_groups = 2, o->o_lora = 64;
        o->moe_inter = 128, o->n_experts = 16, o->idx_heads = 4, o->idx_dim = 64, o->idx_topk = 32;
        o->route_scale = 1.5f;
        for (int i = 0; i < o->n_layers_full; i++) o->ratio[i] = i < 2 ? 0 : (i % 2 == 0 ? 4 : 128);
    } else {
        return -1;
    }
    return 0;
}

/* ---- tensor specs: the stored tensors of model/ckpt_tensors.h, each with how to fill it ---------- */

enum { K_F32, K_BF16, K_FP8W, K_CONST8, K_FP4, K_F32C, K_TID };

typedef struct {
    char name[DSV4_CKPT_NAME];
    dsv4_dtype dt;
    int ndim;
    int64_t shape[2];
    int kind;
    float a, b;   /* K_F32: off, amp; K_BF16: std; K_FP8W: std of the weight; K_F32C: value */
    int code;     /* K_CONST8: the byte; K_TID: experts */
    uint64_t nbytes, off, rs;
} tspec;

typedef struct {
    tspec *t;
    size_t n, cap;
    int nvfp4;
    int oom;
} slist;

static tspec *add(slist *L, const dsv4_ckpt_part *p, int kind) {
    if (L->oom) return NULL;
    if (L->n == L->cap) {
        size_t cap = L->cap ? 2 * L->cap : 1024;
        tspec *nt = realloc(L->t, cap * sizeof *nt);
        if (!nt) {
            L->oom = 1;
            return NULL;
        }
        L->t = nt, L->cap = cap;
    }
    tspec *t = &L->t[L->n++];
    memset(t, 0, sizeof *t);
    memcpy(t->name, p->name, sizeof t->name);
    t->dt = p->dtype;
    t->ndim = p->ndim;
    t->shape[0] = p->shape[0], t->shape[1] = p->ndim == 2 ? p->shape[1] : 0;
    t->nbytes = (uint64_t)t->shape[0] * (uint64_t)(t->ndim == 2 ? t->shape[1] : 1) * dsv4_dtype_size(t->dt);
    t->kind = kind;
    return t;
}

/* power-of-two exponent k with amax / 2^k <= qmax */
static int pow2_exp(double amax, double qmax) {
    int k = (int)ceil(log2(amax / qmax));
    while (ldexp(qmax, k) < amax) k++;
    return k;
}

/* rms of a uniformly random e2m1 code: sqrt(mean of {0, .5, 1, 1.5, 2, 3, 4, 6}^2) */
#define FP4_RMS 2.9262f

static void add_tensor(void *ctx, const dsv4_ckpt_tensor *c) {
    slist *L = ctx;
    dsv4_ckpt_part p[3];
    dsv4_ckpt_parts(c, L->nvfp4, p);
    tspec *t;
    switch (c->kind) {
    case DSV4_CKPT_F32:
        if ((t = add(L, &p[0], K_F32))) t->a = c->off, t->b = c->amp;
        break;
    case DSV4_CKPT_BF16:
        if ((t = add(L, &p[0], K_BF16))) t->a = c->std;
        break;
    case DSV4_CKPT_TID2EID:
        if ((t = add(L, &p[0], K_TID))) t->code = c->n_experts;
        break;
    case DSV4_CKPT_FP8: /* scale: the block scale of U[-a, a), a = std * sqrt(3) */
        if ((t = add(L, &p[0], K_FP8W))) t->a = c->std;
        if ((t = add(L, &p[1], K_CONST8))) t->code = 127 + pow2_exp(c->std * sqrt(3.0), 448.0);
        break;
    case DSV4_CKPT_FP4: { /* random codes; scales making the std 1/sqrt(cols) */
        double sc = 1.0 / sqrt((double)c->shape[1]) / FP4_RMS;
        add(L, &p[0], K_FP4);
        if (!L->nvfp4) {
            if ((t = add(L, &p[1], K_CONST8))) t->code = 127 + (int)lround(log2(sc));
        } else {
            if ((t = add(L, &p[1], K_CONST8))) t->code = 0x38; /* 1.0 */
            if ((t = add(L, &p[2], K_F32C))) t->a = (float)sc;
        }
        break;
    }
    }
}

/* the config fields dsv4_ckpt_tensors reads, for the first n_layers layers of s */
static void ckpt_config(const dsv4_bench_shape *s, int n_layers, int n_hash_layers, dsv4_config *c) {
    memset(c, 0, sizeof *c);
    c->vocab_size = s->vocab, c->dim = s->dim, c->moe_inter_dim = s->moe_inter, c->n_layers = n_layers;
    c->n_hash_layers = n_hash_layers, c->n_heads = s->n_heads, c->head_dim = s->head_dim;
    c->q_lora_rank = s->q_lora, c->o_groups = s->o_groups, c->o_lora_rank = s->o_lora;
    c->n_routed_experts = s->n_experts, c->n_shared_experts = 1, c->n_activated_experts = s->n_active;
    c->hc_mult = 4, c->index_n_heads = s->idx_heads, c->index_head_dim = s->idx_dim;
    for (int l = 0; l < s->n_layers_full; l++) c->compress_ratios[l] = s->ratio[l];
}

void dsv4_bench_layer_bytes(const dsv4_bench_shape *s, int l, int nvfp4, dsv4_bench_bytes *out) {
    memset(out, 0, sizeof *out);
    slist L = {.nvfp4 = nvfp4};
    dsv4_config c;
    ckpt_config(s, s->n_layers_full, s->n_hash_layers, &c);
    dsv4_ckpt_layer_tensors(&c, l, add_tensor, &L);
    dsv4_ckpt_global_tensors(&c, add_tensor, &L);
    double experts = 0, emacs = 0;
    for (size_t i = 0; i < L.n; i++) {
        const tspec *t = &L.t[i];
        /* matrices: 2-D weights other than ape (an additive table) */
        int n = (int)strlen(t->name);
        double macs = t->ndim == 2 && t->kind != K_TID && t->kind != K_CONST8 && t->kind != K_F32C &&
                              !(n >= 4 && !strcmp(t->name + n - 4, ".ape"))
                          ? (double)t->shape[0] * (double)t->shape[1] * (t->kind == K_FP4 ? 2 : 1)
                          : 0;
        if (!strncmp(t->name, "layers.", 7)) {
            if (strstr(t->name, ".ffn.experts.")) experts += (double)t->nbytes, emacs += macs;
            else if (t->kind != K_TID) out->dense += (double)t->nbytes, out->dense_macs += macs;
        } else if (strcmp(t->name, "embed.weight")) {
            out->head += (double)t->nbytes, out->head_macs += macs;
        }
    }
    out->expert = experts / s->n_experts;
    out->expert_macs = emacs / s->n_experts;
    free(L.t);
}

double dsv4_bench_kv_bytes(const dsv4_bench_shape *s, int l, long ctx, double *engine_bytes) {
    const double entry = (s->head_dim - s->rope_dim) + 2.0 * s->rope_dim + s->head_dim / 64.0;
    const double ikey = s->idx_dim / 2.0 + s->idx_dim / 32.0;
    double ne = ctx < s->window ? (double)ctx : (double)s->window, nk = 0;
    int r = s->ratio[l];
    if (r == 4) {
        nk = (double)(ctx / 4);
        ne += nk < s->idx_topk ? nk : s->idx_topk;
    } else if (r > 0) {
        ne += (double)(ctx / r);
    }
    /* the engine's caches: attention entries and indexer keys in the stored formats of kv_cache.h (padded rows) */
    if (engine_bytes)
        *engine_bytes = ne * (double)dsv4_kv_row_bytes(s->head_dim, s->rope_dim) + nk * (double)dsv4_ikey_row_bytes(s->idx_dim);
    return ne * entry + nk * ikey;
}

/* ---- values --------------------------------------------------------------------------------------- */

static inline uint64_t mix64(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* the i-th value of a tensor's stream */
static inline uint64_t hv(uint64_t rs, uint64_t i) { return mix64(rs + (i + 1) * 0x9E3779B97F4A7C15ull); }

static inline float sym(uint64_t h) { return (float)((double)(h >> 40) * (1.0 / 8388608.0) - 1.0); }

static uint16_t to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    u += 0x7FFF + ((u >> 16) & 1);
    return (uint16_t)(u >> 16);
}

static uint8_t e4m3_encode(float x) { /* nearest, |x| clamped to 448 */
    uint8_t sign = x < 0 ? 0x80 : 0;
    float a = fabsf(x), best = INFINITY;
    int bc = 0;
    for (int c = 0; c < 127; c++) {
        int e = (c >> 3) & 15, m = c & 7;
        float v = e == 0 ? ldexpf((float)m / 8.0f, -6) : ldexpf(1.0f + (float)m / 8.0f, e - 7);
        if (fabsf(v - a) < best) best = fabsf(v - a), bc = c;
    }
    return sign | (uint8_t)bc;
}

/* Fills bytes [b0, b1) of tensor t at dst (= the tensor's byte b0). b0, b1 multiples of 8 or the end. */
static void fill(const tspec *t, uint8_t *dst, uint64_t b0, uint64_t b1) {
    switch (t->kind) {
    case K_F32: {
        float *p = (float *)dst;
        for (uint64_t i = b0 / 4; i < b1 / 4; i++) p[i - b0 / 4] = t->a + t->b * sym(hv(t->rs, i));
        break;
    }
    case K_F32C: {
        float *p = (float *)dst;
        for (uint64_t i = b0 / 4; i < b1 / 4; i++) p[i - b0 / 4] = t->a;
        break;
    }
    case K_BF16: {
        uint16_t *p = (uint16_t *)dst;
        float a = t->a * sqrtf(3.0f);
        for (uint64_t i = b0 / 2; i < b1 / 2; i++) p[i - b0 / 2] = to_bf16(a * sym(hv(t->rs, i)));
        break;
    }
    case K_FP8W: { /* 256 levels of U[-a, a) at the block scale 2^k */
        uint8_t lut[256];
        double a = t->a * sqrt(3.0);
        int k = pow2_exp(a, 448.0);
        for (int j = 0; j < 256; j++) lut[j] = e4m3_encode((float)(((j + 0.5) / 128.0 - 1.0) * ldexp(a, -k)));
        for (uint64_t i = b0; i < b1; i += 8) {
            uint64_t h = hv(t->rs, i / 8);
            for (int j = 0; j < 8 && i + j < b1; j++) dst[i - b0 + j] = lut[(h >> (8 * j)) & 255];
        }
        break;
    }
    case K_FP4: /* every e2m1 code equally likely */
        for (uint64_t i = b0; i < b1; i += 8) {
            uint64_t h = hv(t->rs, i / 8);
            if (i + 8 <= b1) memcpy(dst + (i - b0), &h, 8);
            else memcpy(dst + (i - b0), &h, (size_t)(b1 - i));
        }
        break;
    case K_CONST8:
        memset(dst, t->code, (size_t)(b1 - b0));
        break;
    case K_TID: { /* K distinct experts per token */
        int64_t *p = (int64_t *)dst;
        int K = (int)t->shape[1], E = t->code;
        for (int64_t v = 0; v < t->shape[0]; v++) {
            uint64_t c = 0;
            for (int k = 0; k < K; k++) {
                int e, dup;
                do {
                    e = (int)(hv(t->rs, (uint64_t)v * 64 + c++) % (uint64_t)E);
                    dup = 0;
                    for (int j = 0; j < k; j++) dup |= p[v * K + j] == e;
                } while (dup);
                p[v * K + k] = e;
            }
        }
        break;
    }
    }
}

/* ---- files ------------------------------------------------------------------------------------ */

static int write_config(const char *path, const dsv4_bench_shape *s, int n_layers, int nvfp4, uint64_t seed,
                        dsv4_err *err) {
    FILE *f = fopen(path, "w");
    if (!f) return dsv4_errf(err, "%s: cannot create: %s", path, strerror(errno));
    fprintf(f,
            "{\n  \"architectures\": [\"DeepseekV4ForCausalLM\"],\n  \"model_type\": \"deepseek_v4\",\n"
            "  \"dsv4_synthetic\": true,\n"
            "  \"dsv4_synthetic_note\": \"random weights (dsv4 bench --synthetic %s --layers %d --experts %s, seed %llu)\",\n"
            "  \"attention_bias\": false, \"attention_dropout\": 0.0, \"bos_token_id\": 0, \"eos_token_id\": 1,\n"
            "  \"hc_eps\": 1e-06, \"hc_mult\": 4, \"hc_sinkhorn_iters\": 20, \"head_dim\": %d, \"hidden_act\": \"silu\",\n"
            "  \"hidden_size\": %d, \"index_head_dim\": %d, \"index_n_heads\": %d, \"index_topk\": %d,\n"
            "  \"initializer_range\": 0.02, \"max_position_embeddings\": 1048576, \"moe_intermediate_size\": %d,\n"
            "  \"n_routed_experts\": %d, \"n_shared_experts\": 1, \"norm_topk_prob\": true, \"num_attention_heads\": %d,\n"
            "  \"num_experts_per_tok\": %d, \"num_hidden_layers\": %d, \"num_hash_layers\": %d,\n"
            "  \"num_key_value_heads\": 1, \"num_nextn_predict_layers\": 0, \"o_groups\": %d, \"o_lora_rank\": %d,\n"
            "  \"q_lora_rank\": %d, \"qk_rope_head_dim\": %d, \"rms_norm_eps\": 1e-06,\n"
            "  \"rope_scaling\": {\"beta_fast\": 32, \"beta_slow\": 1, \"factor\": 16, "
            "\"original_max_position_embeddings\": 65536, \"type\": \"yarn\"},\n"
            "  \"rope_theta\": 10000.0, \"routed_scaling_factor\": %g, \"scoring_func\": \"sqrtsoftplus\",\n"
            "  \"sliding_window\": %d, \"swiglu_limit\": 10.0, \"tie_word_embeddings\": false, \"topk_method\": \"noaux_tc\",\n"
            "  \"torch_dtype\": \"bfloat16\", \"use_cache\": true, \"vocab_size\": %d, \"compress_rope_theta\": 160000.0,\n"
            "  \"compress_ratios\": [",
            s->name, n_layers, nvfp4 ? "nvfp4" : "mxfp4", (unsigned long long)seed, s->head_dim, s->dim, s->idx_dim,
            s->idx_heads, s->idx_topk, s->moe_inter, s->n_experts, s->n_heads, s->n_active, n_layers,
            s->n_hash_layers < n_layers ? s->n_hash_layers : n_layers, s->o_groups, s->o_lora, s->q_lora, s->rope_dim,
            (double)s->route_scale, s->window, s->vocab);
    for (int l = 0; l < n_layers; l++) fprintf(f, "%s%d", l ? ", " : "", s->ratio[l]);
    fprintf(f,
            "],\n  \"quantization_config\": {\"activation_scheme\": \"dynamic\", \"fmt\": \"e4m3\", \"quant_method\": \"fp8\",\n"
            "    \"scale_fmt\": \"ue8m0\", \"weight_block_size\": [128, 128]},\n  \"expert_dtype\": \"fp4\"\n}\n");
    if (ferror(f) | fclose(f)) return dsv4_errf(err, "%s: write failed", path);
    return 0;
}

typedef struct {
    char *p;
    size_t n, cap;
} sbuf;

static int sb_add(sbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int sb_add(sbuf *b, const char *fmt, ...) {
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int k = vsnprintf(b->p ? b->p + b->n : NULL, b->p ? b->cap - b->n : 0, fmt, ap);
        va_end(ap);
        if (k < 0) return -1;
        if (b->p && b->n + (size_t)k < b->cap) {
            b->n += (size_t)k;
            return 0;
        }
        size_t cap = b->cap ? b->cap * 2 : 1 << 16;
        while (cap < b->n + (size_t)k + 1) cap *= 2;
        char *np = realloc(b->p, cap);
        if (!np) return -1;
        b->p = np, b->cap = cap;
    }
}

static uint64_t name_hash(uint64_t seed, const char *name) {
    uint64_t h = 0xCBF29CE484222325ull; /* FNV-1a */
    for (const unsigned char *p = (const unsigned char *)name; *p; p++) h = (h ^ *p) * 0x100000001B3ull;
    return mix64(seed ^ h);
}

int dsv4_bench_write(const char *dir, const dsv4_bench_shape *s, int n_layers, int nvfp4, uint64_t seed,
                     uint64_t *bytes_out, dsv4_err *err) {
    if (n_layers < 1 || n_layers > s->n_layers_full)
        return dsv4_errf(err, "bench: --layers must be in [1, %d] for %s (got %d)", s->n_layers_full, s->name, n_layers);
    char path[4096];
    snprintf(path, sizeof path, "%s/config.json", dir);
    if (write_config(path, s, n_layers, nvfp4, seed, err)) return -1;
    dsv4_config c;
    ckpt_config(s, n_layers, s->n_hash_layers < n_layers ? s->n_hash_layers : n_layers, &c);
    slist L = {.nvfp4 = nvfp4};
    dsv4_ckpt_tensors(&c, add_tensor, &L);
    sbuf h = {0};
    int rc = -1, fd = -1;
    uint8_t *map = MAP_FAILED;
    uint64_t total = 0, data0 = 0;
    if (L.oom) {
        dsv4_errf(err, "bench: out of memory");
        goto out;
    }
    uint64_t off = 0;
    for (size_t i = 0; i < L.n; i++) {
        L.t[i].off = off;
        L.t[i].rs = name_hash(seed, L.t[i].name);
        off = (off + L.t[i].nbytes + 63) & ~(uint64_t)63;
    }
    if (sb_add(&h, "{\"__metadata__\":{\"format\":\"pt\"}")) goto oom;
    for (size_t i = 0; i < L.n; i++) {
        const tspec *t = &L.t[i];
        if (sb_add(&h, ",\"%s\":{\"dtype\":\"%s\",\"shape\":[%lld", t->name, dsv4_dtype_name(t->dt), (long long)t->shape[0]))
            goto oom;
        if (t->ndim == 2 && sb_add(&h, ",%lld", (long long)t->shape[1])) goto oom;
        if (sb_add(&h, "],\"data_offsets\":[%llu,%llu]}", (unsigned long long)t->off,
                   (unsigned long long)(t->off + t->nbytes)))
            goto oom;
    }
    if (sb_add(&h, "}")) goto oom;
    while ((8 + h.n) % 64)
        if (sb_add(&h, " ")) goto oom;
    data0 = 8 + h.n;
    total = data0 + off;
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    unlink(path);
    fd = open(path, O_RDWR | O_CREAT | O_TRUNC, 0644);
    if (fd < 0) {
        dsv4_errf(err, "%s: cannot create: %s", path, strerror(errno));
        goto out;
    }
    if (ftruncate(fd, (off_t)total)) {
        dsv4_errf(err, "%s: cannot size to %llu bytes: %s", path, (unsigned long long)total, strerror(errno));
        goto out;
    }
    map = mmap(NULL, total, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (map == MAP_FAILED) {
        dsv4_errf(err, "%s: mmap failed: %s", path, strerror(errno));
        goto out;
    }
    uint64_t hl = h.n;
    for (int i = 0; i < 8; i++) map[i] = (uint8_t)(hl >> (8 * i));
    memcpy(map + 8, h.p, h.n);
    /* work items: 4 MiB pieces of every tensor (tid2eid whole) */
    const uint64_t piece = 1u << 22;
    size_t nitems = 0;
    for (size_t i = 0; i < L.n; i++)
        nitems += L.t[i].kind == K_TID ? 1 : (size_t)((L.t[i].nbytes + piece - 1) / piece);
    uint64_t(*items)[2] = malloc(sizeof *items * (nitems ? nitems : 1));
    if (!items) goto oom;
    size_t k = 0;
    for (size_t i = 0; i < L.n; i++)
        for (uint64_t b = 0; b < L.t[i].nbytes; b += L.t[i].kind == K_TID ? L.t[i].nbytes : piece)
            items[k][0] = i, items[k][1] = b, k++;
    nitems = k;
#pragma omp parallel for schedule(dynamic, 1)
    for (size_t it = 0; it < nitems; it++) {
        const tspec *t = &L.t[items[it][0]];
        uint64_t b0 = items[it][1], b1 = t->kind == K_TID || b0 + piece > t->nbytes ? t->nbytes : b0 + piece;
        fill(t, map + data0 + t->off + b0, b0, b1);
    }
    free(items);
    if (bytes_out) *bytes_out = total;
    rc = 0;
    goto out;
oom:
    dsv4_errf(err, "bench: out of memory");
out:
    if (map != MAP_FAILED) munmap(map, total);
    if (fd >= 0) close(fd);
    free(h.p);
    free(L.t);
    return rc;
}
