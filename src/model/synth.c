/* synth.c - a small synthetic DeepSeek-V4 checkpoint in the release layout. See synth.h. */
#include "synth.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>

#include "../io/safetensors.h"
#include "ckpt_tensors.h"

void dsv4_synth_defaults(dsv4_synth_opts *o) {
    memset(o, 0, sizeof *o);
    o->seed = 0;
    o->vocab_size = 129280;
    o->dim = 128;
    o->n_layers = 4;
    o->n_hash_layers = 1;
    o->n_heads = 4;
    o->head_dim = 128;
    o->rope_head_dim = 64;
    o->q_lora_rank = 128;
    o->o_groups = 2;
    o->o_lora_rank = 128;
    o->moe_inter_dim = 128;
    o->n_routed_experts = 8;
    o->n_activated_experts = 2;
    o->window = 64;
    o->index_n_heads = 4;
    o->index_head_dim = 64;
    o->index_topk = 16;
    o->hca_ratio = 16;
    o->max_position_embeddings = 4096;
    o->tokenizer_dir = NULL;
}

/* ---- PRNG: splitmix64, one stream per tensor (seed x name) ------------------------------------ */

typedef struct {
    uint64_t s;
} rng;

static uint64_t rng_next(rng *r) {
    uint64_t z = (r->s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* uniform in [-1, 1) */
static float rng_sym(rng *r) { return (float)((double)(rng_next(r) >> 40) * (1.0 / 8388608.0) - 1.0); }

static rng rng_for(uint64_t seed, const char *name) {
    uint64_t h = 0xCBF29CE484222325ull; /* FNV-1a */
    for (const unsigned char *p = (const unsigned char *)name; *p; p++) h = (h ^ *p) * 0x100000001B3ull;
    rng r = {seed ^ h};
    rng_next(&r);
    return r;
}

/* ---- number formats (encoders) ------------------------------------------------------------- */

static uint16_t f32_to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    u += 0x7FFF + ((u >> 16) & 1);
    return (uint16_t)(u >> 16);
}

static float e4m3_value(int code) { /* code 0..126, positive */
    int e = (code >> 3) & 15, m = code & 7;
    return e == 0 ? ldexpf((float)m / 8.0f, -6) : ldexpf(1.0f + (float)m / 8.0f, e - 7);
}

/* nearest e4m3fn code for |x| <= 448 (ties to the even code) */
static uint8_t e4m3_encode(float x) {
    static float tab[127];
    static int init;
    if (!init) { /* benign: every thread writes the same values */
        for (int i = 0; i < 127; i++) tab[i] = e4m3_value(i);
        init = 1;
    }
    uint8_t sign = x < 0 ? 0x80 : 0;
    float a = fabsf(x);
    if (a >= 448.0f) return sign | 126;
    int lo = 0, hi = 126;
    while (hi - lo > 1) {
        int mid = (lo + hi) / 2;
        if (tab[mid] <= a) lo = mid;
        else hi = mid;
    }
    float dl = a - tab[lo], dh = tab[hi] - a;
    int c = dl < dh ? lo : dh < dl ? hi : ((lo & 1) ? hi : lo);
    return sign | (uint8_t)c;
}

static const float e2m1_tab[8] = {0, 0.5f, 1, 1.5f, 2, 3, 4, 6};

static uint8_t e2m1_encode(float x) {
    uint8_t sign = x < 0 ? 8 : 0;
    float a = fabsf(x);
    int best = 0;
    for (int i = 1; i < 8; i++)
        if (fabsf(e2m1_tab[i] - a) < fabsf(e2m1_tab[best] - a)) best = i;
    return sign | (uint8_t)best;
}

/* power-of-two scale exponent k with amax / 2^k <= qmax (ue8m0 style) */
static int pow2_exp(float amax, float qmax) {
    if (!(amax > 0)) return -127 + 1;
    int k = (int)ceilf(log2f(amax / qmax));
    while (ldexpf(qmax, k) < amax) k++;
    if (k < -126) k = -126;
    if (k > 127) k = 127;
    return k;
}

/* ---- tensor list ---------------------------------------------------------------------------- */

typedef struct {
    dsv4_st_tensor *t;
    size_t n, cap;
    uint64_t seed;
    dsv4_err *err;
    int oom;
    int nvfp4; /* the routed experts as NVFP4 */
} tlist;

static void *tl_add(tlist *L, const char *name, dsv4_dtype dt, int ndim, const int64_t *shape) {
    if (L->oom) return NULL;
    if (L->n == L->cap) {
        size_t cap = L->cap ? L->cap * 2 : 256;
        dsv4_st_tensor *nt = realloc(L->t, cap * sizeof *nt);
        if (!nt) {
            L->oom = 1;
            return NULL;
        }
        L->t = nt;
        L->cap = cap;
    }
    dsv4_st_tensor *t = &L->t[L->n];
    memset(t, 0, sizeof *t);
    t->dtype = dt;
    t->ndim = ndim;
    t->numel = 1;
    for (int i = 0; i < ndim; i++) {
        t->shape[i] = shape[i];
        t->numel *= shape[i];
    }
    t->nbytes = (uint64_t)t->numel * dsv4_dtype_size(dt);
    char *nm = strdup(name);
    uint8_t *d = malloc(t->nbytes ? t->nbytes : 1);
    if (!nm || !d) {
        free(nm);
        free(d);
        L->oom = 1;
        return NULL;
    }
    t->name = nm;
    t->data = d;
    L->n++;
    return d;
}

static void tl_free(tlist *L) {
    for (size_t i = 0; i < L->n; i++) {
        free((void *)L->t[i].name);
        free((void *)L->t[i].data);
    }
    free(L->t);
}

/* F32 tensor, values off + a * U[-1, 1) */
static void add_f32(tlist *L, const char *name, int ndim, int64_t d0, int64_t d1, float off, float a) {
    int64_t sh[2] = {d0, d1};
    float *p = tl_add(L, name, DSV4_DT_F32, ndim, sh);
    if (!p) return;
    rng r = rng_for(L->seed, name);
    int64_t n = ndim == 1 ? d0 : d0 * d1;
    for (int64_t i = 0; i < n; i++) p[i] = off + a * rng_sym(&r);
}

/* BF16 [rows, cols], uniform with standard deviation std */
static void add_bf16(tlist *L, const char *name, int64_t rows, int64_t cols, float std) {
    int64_t sh[2] = {rows, cols};
    uint16_t *p = tl_add(L, name, DSV4_DT_BF16, 2, sh);
    if (!p) return;
    rng r = rng_for(L->seed, name);
    float a = std * sqrtf(3.0f);
    for (int64_t i = 0; i < rows * cols; i++) p[i] = f32_to_bf16(a * rng_sym(&r));
}

/* FP8 e4m3 linear: weight [rows, cols] uniform with std 1/sqrt(cols), quantized per 128x128 block
 * with power-of-two F8_E8M0 scales */
static void add_fp8(tlist *L, const dsv4_ckpt_tensor *t) {
    dsv4_ckpt_part p[3];
    dsv4_ckpt_parts(t, 0, p);
    const int64_t rows = t->shape[0], cols = t->shape[1];
    float *w = malloc(sizeof(float) * (size_t)(rows * cols));
    if (!w) {
        L->oom = 1;
        return;
    }
    rng r = rng_for(L->seed, p[0].name);
    float a = sqrtf(3.0f / (float)cols);
    for (int64_t i = 0; i < rows * cols; i++) w[i] = a * rng_sym(&r);
    int64_t sr = p[1].shape[0], sc = p[1].shape[1];
    uint8_t *q = tl_add(L, p[0].name, p[0].dtype, 2, p[0].shape);
    uint8_t *s = tl_add(L, p[1].name, p[1].dtype, 2, p[1].shape);
    if (q && s)
        for (int64_t bi = 0; bi < sr; bi++)
            for (int64_t bj = 0; bj < sc; bj++) {
                int64_t i1 = bi * 128 + 128 < rows ? bi * 128 + 128 : rows, j1 = bj * 128 + 128 < cols ? bj * 128 + 128 : cols;
                float amax = 0;
                for (int64_t i = bi * 128; i < i1; i++)
                    for (int64_t j = bj * 128; j < j1; j++) amax = fmaxf(amax, fabsf(w[i * cols + j]));
                int k = pow2_exp(amax, 448.0f);
                s[bi * sc + bj] = (uint8_t)(k + 127);
                for (int64_t i = bi * 128; i < i1; i++)
                    for (int64_t j = bj * 128; j < j1; j++) q[i * cols + j] = e4m3_encode(ldexpf(w[i * cols + j], -k));
            }
    free(w);
}

/* MXFP4 expert: weight uniform with std 1/sqrt(cols), e2m1 codes with a power-of-two scale 2^k per 32. NVFP4 (L->nvfp4):
 * the same codes, spec 14.5's lossless cast: weight_scale_2 = 2^b with b = kmax - 8 (kmax: the largest k any block of
 * this width can have, pow2_exp(a, 6), so the same b for w1 and w3) and E4M3 2^(k - b) for both 16-column halves of a
 * block (k - b in [-9, 8]: E4M3's powers of two, subnormals from 2^-7 down) */
static void add_fp4(tlist *L, const dsv4_ckpt_tensor *t) {
    dsv4_ckpt_part p[3];
    const int np = dsv4_ckpt_parts(t, L->nvfp4, p);
    const int64_t rows = t->shape[0], cols = t->shape[1];
    rng r = rng_for(L->seed, p[0].name);
    uint8_t *q = tl_add(L, p[0].name, p[0].dtype, 2, p[0].shape);
    uint8_t *s = tl_add(L, p[1].name, p[1].dtype, 2, p[1].shape);
    float *s2 = np > 2 ? tl_add(L, p[2].name, p[2].dtype, p[2].ndim, p[2].shape) : NULL;
    if (!q || !s || (np > 2 && !s2)) return;
    float a = sqrtf(3.0f / (float)cols), blk[32];
    const int b2 = pow2_exp(a, 6.0f) - 8;
    if (s2) s2[0] = ldexpf(1.0f, b2);
    for (int64_t i = 0; i < rows; i++)
        for (int64_t b = 0; b < cols / 32; b++) {
            float amax = 0;
            for (int j = 0; j < 32; j++) {
                blk[j] = a * rng_sym(&r);
                amax = fmaxf(amax, fabsf(blk[j]));
            }
            int k = pow2_exp(amax, 6.0f);
            if (!s2) s[i * (cols / 32) + b] = (uint8_t)(k + 127);
            else { /* (k - b2 < -9 would need amax below a 2^-17: not a uniform draw's) */
                const uint8_t e = e4m3_encode(ldexpf(1.0f, k - b2 < -9 ? -9 : k - b2)); /* (exact: a power of two) */
                s[i * (cols / 16) + 2 * b] = e, s[i * (cols / 16) + 2 * b + 1] = e;
            }
            for (int j = 0; j < 32; j += 2) {
                uint8_t lo = e2m1_encode(ldexpf(blk[j], -k)), hi = e2m1_encode(ldexpf(blk[j + 1], -k));
                q[i * (cols / 2) + b * 16 + j / 2] = (uint8_t)(lo | (hi << 4));
            }
        }
}

/* tid2eid I64 [V, K]: K distinct experts per token */
static void add_tid2eid(tlist *L, const dsv4_ckpt_tensor *t) {
    const int64_t V = t->shape[0];
    const int K = (int)t->shape[1], E = t->n_experts;
    int64_t *p = tl_add(L, t->name, DSV4_DT_I64, 2, t->shape);
    if (!p) return;
    rng r = rng_for(L->seed, t->name);
    int perm[1024];
    for (int64_t v = 0; v < V; v++) {
        for (int e = 0; e < E; e++) perm[e] = e;
        for (int k = 0; k < K; k++) { /* partial Fisher-Yates */
            int j = k + (int)(rng_next(&r) % (uint64_t)(E - k));
            int tmp = perm[k];
            perm[k] = perm[j];
            perm[j] = tmp;
            p[v * K + k] = perm[k];
        }
    }
}

static void add_tensor(void *ctx, const dsv4_ckpt_tensor *t) {
    tlist *L = ctx;
    if (L->oom) return;
    switch (t->kind) {
    case DSV4_CKPT_F32: add_f32(L, t->name, t->ndim, t->shape[0], t->shape[1], t->off, t->amp); break;
    case DSV4_CKPT_BF16: add_bf16(L, t->name, t->shape[0], t->shape[1], t->std); break;
    case DSV4_CKPT_FP8: add_fp8(L, t); break;
    case DSV4_CKPT_FP4: add_fp4(L, t); break;
    case DSV4_CKPT_TID2EID: add_tid2eid(L, t); break;
    }
}

static int ratio_of(const dsv4_synth_opts *o, int L) { return L == 0 ? 0 : (L % 2 ? 4 : o->hca_ratio); }

static void build(tlist *L, const dsv4_synth_opts *o) {
    dsv4_config c = {
        .vocab_size = o->vocab_size, .dim = o->dim, .moe_inter_dim = o->moe_inter_dim, .n_layers = o->n_layers,
        .n_hash_layers = o->n_hash_layers, .n_heads = o->n_heads, .head_dim = o->head_dim,
        .q_lora_rank = o->q_lora_rank, .o_groups = o->o_groups, .o_lora_rank = o->o_lora_rank,
        .n_routed_experts = o->n_routed_experts, .n_shared_experts = 1, .n_activated_experts = o->n_activated_experts,
        .hc_mult = 4, .index_n_heads = o->index_n_heads, .index_head_dim = o->index_head_dim,
    };
    for (int l = 0; l < o->n_layers; l++) c.compress_ratios[l] = ratio_of(o, l);
    dsv4_ckpt_tensors(&c, add_tensor, L);
}

/* ---- files ----------------------------------------------------------------------------------- */

static int mkdir_p(const char *dir, dsv4_err *err) {
    char *p = strdup(dir);
    if (!p) return dsv4_errf(err, "out of memory");
    size_t n = strlen(p);
    for (size_t i = 1; i <= n; i++) {
        if (p[i] != '/' && p[i] != 0) continue;
        char c = p[i];
        p[i] = 0;
        if (mkdir(p, 0777) && errno != EEXIST) {
            int e = errno;
            dsv4_errf(err, "%s: cannot create directory: %s", p, strerror(e));
            free(p);
            return -1;
        }
        p[i] = c;
    }
    free(p);
    struct stat st;
    if (stat(dir, &st) || !S_ISDIR(st.st_mode)) return dsv4_errf(err, "%s: not a directory", dir);
    return 0;
}

static char *join(const char *dir, const char *name) {
    size_t n = strlen(dir) + strlen(name) + 2;
    char *s = malloc(n);
    if (s) snprintf(s, n, "%s/%s", dir, name);
    return s;
}

static int copy_file(const char *src, const char *dst, int optional, dsv4_err *err) {
    FILE *in = fopen(src, "rb");
    if (!in) {
        if (optional && errno == ENOENT) return 0;
        return dsv4_errf(err, "%s: cannot open: %s", src, strerror(errno));
    }
    FILE *out = fopen(dst, "wb");
    if (!out) {
        int e = errno;
        fclose(in);
        return dsv4_errf(err, "%s: cannot create: %s", dst, strerror(e));
    }
    char buf[1 << 16];
    size_t r;
    int bad = 0;
    while ((r = fread(buf, 1, sizeof buf, in)) > 0)
        if (fwrite(buf, 1, r, out) != r) {
            bad = 1;
            break;
        }
    if (ferror(in)) bad = 1;
    fclose(in);
    if (fclose(out)) bad = 1;
    if (bad) return dsv4_errf(err, "%s: copying from %s failed", dst, src);
    return 0;
}

static int write_config(const char *path, const dsv4_synth_opts *o, dsv4_err *err) {
    FILE *f = fopen(path, "w");
    if (!f) return dsv4_errf(err, "%s: cannot create: %s", path, strerror(errno));
    fprintf(f,
            "{\n"
            "  \"architectures\": [\"DeepseekV4ForCausalLM\"],\n"
            "  \"model_type\": \"deepseek_v4\",\n"
            "  \"dsv4_synthetic\": true,\n"
            "  \"dsv4_synthetic_note\": \"random weights written by `dsv4 synth --seed %llu`; output is meaningless\",\n"
            "  \"attention_bias\": false,\n"
            "  \"attention_dropout\": 0.0,\n"
            "  \"bos_token_id\": 0,\n"
            "  \"eos_token_id\": 1,\n"
            "  \"hc_eps\": 1e-06,\n"
            "  \"hc_mult\": 4,\n"
            "  \"hc_sinkhorn_iters\": 20,\n"
            "  \"head_dim\": %d,\n"
            "  \"hidden_act\": \"silu\",\n"
            "  \"hidden_size\": %d,\n"
            "  \"index_head_dim\": %d,\n"
            "  \"index_n_heads\": %d,\n"
            "  \"index_topk\": %d,\n"
            "  \"initializer_range\": 0.02,\n"
            "  \"max_position_embeddings\": %d,\n"
            "  \"moe_intermediate_size\": %d,\n"
            "  \"n_routed_experts\": %d,\n"
            "  \"n_shared_experts\": 1,\n"
            "  \"norm_topk_prob\": true,\n"
            "  \"num_attention_heads\": %d,\n"
            "  \"num_experts_per_tok\": %d,\n"
            "  \"num_hidden_layers\": %d,\n"
            "  \"num_hash_layers\": %d,\n"
            "  \"num_key_value_heads\": 1,\n"
            "  \"num_nextn_predict_layers\": 0,\n"
            "  \"o_groups\": %d,\n"
            "  \"o_lora_rank\": %d,\n"
            "  \"q_lora_rank\": %d,\n"
            "  \"qk_rope_head_dim\": %d,\n"
            "  \"rms_norm_eps\": 1e-06,\n"
            "  \"rope_scaling\": {\n"
            "    \"beta_fast\": 32,\n"
            "    \"beta_slow\": 1,\n"
            "    \"factor\": 4.0,\n"
            "    \"original_max_position_embeddings\": %d,\n"
            "    \"type\": \"yarn\"\n"
            "  },\n"
            "  \"rope_theta\": 10000.0,\n"
            "  \"routed_scaling_factor\": 1.5,\n"
            "  \"scoring_func\": \"sqrtsoftplus\",\n"
            "  \"sliding_window\": %d,\n"
            "  \"swiglu_limit\": 10.0,\n"
            "  \"tie_word_embeddings\": false,\n"
            "  \"topk_method\": \"noaux_tc\",\n"
            "  \"torch_dtype\": \"bfloat16\",\n"
            "  \"use_cache\": true,\n"
            "  \"vocab_size\": %d,\n"
            "  \"compress_rope_theta\": 160000.0,\n"
            "  \"compress_ratios\": [",
            (unsigned long long)o->seed, o->head_dim, o->dim, o->index_head_dim, o->index_n_heads, o->index_topk,
            o->max_position_embeddings, o->moe_inter_dim, o->n_routed_experts, o->n_heads, o->n_activated_experts,
            o->n_layers, o->n_hash_layers, o->o_groups, o->o_lora_rank, o->q_lora_rank, o->rope_head_dim,
            o->max_position_embeddings / 4 > 0 ? o->max_position_embeddings / 4 : 1, o->window, o->vocab_size);
    for (int l = 0; l < o->n_layers; l++) fprintf(f, "%s%d", l ? ", " : "", ratio_of(o, l));
    fprintf(f,
            "],\n"
            "  \"quantization_config\": {\n"
            "    \"activation_scheme\": \"dynamic\",\n"
            "    \"fmt\": \"e4m3\",\n"
            "    \"quant_method\": \"fp8\",\n"
            "    \"scale_fmt\": \"ue8m0\",\n"
            "    \"weight_block_size\": [128, 128]\n"
            "  },\n"
            "  \"expert_dtype\": \"fp4\"\n"
            "}\n");
    if (ferror(f) | fclose(f)) return dsv4_errf(err, "%s: write failed", path);
    return 0;
}

static int write_readme(const char *path, const dsv4_synth_opts *o, dsv4_err *err) {
    FILE *f = fopen(path, "w");
    if (!f) return dsv4_errf(err, "%s: cannot create: %s", path, strerror(errno));
    fprintf(f,
            "# Synthetic DeepSeek-V4 checkpoint - RANDOM WEIGHTS\n"
            "\n"
            "Written by `dsv4 synth --seed %llu`. Every weight is a deterministic pseudo-random number:\n"
            "this model was never trained and its output is meaningless gibberish.\n"
            "\n"
            "It exists so the whole engine (loading, FP8 / MXFP4 weights, sliding-window, compressed and\n"
            "indexed attention, hash and learned MoE routing, tokenizer, chat template, sampler) can run\n"
            "end to end on any machine. The layout is the DeepSeek-V4 release layout: config.json in the\n"
            "Hugging Face release style, model.safetensors with native tensor names, FP8 e4m3 linears (wo_a\n"
            "included) with F8_E8M0 128x128 block scales, %s,\n"
            "BF16 embed / head / gate / compressors / indexer weights_proj, F32 norms / mHC / ape / sinks /\n"
            "gate bias, I64 tid2eid. The tokenizer is the real DeepSeek one (vocabulary 129280).\n"
            "\n"
            "Shape: hidden %d, %d layers (compress ratios 0, 4, %d, ...), %d heads of %d, %d routed experts\n"
            "(%d active) of width %d + 1 shared, sliding window %d.\n",
            (unsigned long long)o->seed,
            o->nvfp4 ? "NVFP4 routed experts (NVIDIA ModelOpt: I8 packed, F8_E4M3 weight_scale per 16, F32 weight_scale_2; "
                       "the lossless cast of the MXFP4 draw)"
                     : "MXFP4 routed experts (I8 packed, F8_E8M0 per 32)",
            o->dim, o->n_layers, o->hca_ratio, o->n_heads, o->head_dim,
            o->n_routed_experts, o->n_activated_experts, o->moe_inter_dim, o->window);
    if (ferror(f) | fclose(f)) return dsv4_errf(err, "%s: write failed", path);
    return 0;
}

static int check_opts(const dsv4_synth_opts *o, dsv4_err *err) {
#define REQ(c, ...) \
    if (!(c)) return dsv4_errf(err, "synth: " __VA_ARGS__)
    REQ(o->vocab_size >= 3, "vocab size must be >= 3 (got %d)", o->vocab_size);
    REQ(o->dim >= 16 && o->dim <= 8192, "dim must be in [16, 8192] (got %d)", o->dim);
    REQ(o->n_layers >= 1 && o->n_layers <= 64, "layers must be in [1, 64] (got %d)", o->n_layers);
    REQ(o->n_hash_layers >= 0 && o->n_hash_layers <= o->n_layers, "hash layers must be in [0, layers] (got %d)",
        o->n_hash_layers);
    REQ(o->n_heads >= 1 && o->o_groups >= 1 && o->n_heads % o->o_groups == 0,
        "heads (%d) must be a multiple of o_groups (%d)", o->n_heads, o->o_groups);
    REQ(o->rope_head_dim >= 2 && o->rope_head_dim % 2 == 0, "rope head dim must be even (got %d)", o->rope_head_dim);
    REQ(o->head_dim > o->rope_head_dim && o->head_dim <= 4096, "head dim must be in (rope dim, 4096] (got %d)",
        o->head_dim);
    REQ(o->index_head_dim >= o->rope_head_dim && (o->index_head_dim & (o->index_head_dim - 1)) == 0,
        "index head dim must be a power of two >= the rope dim (got %d)", o->index_head_dim);
    REQ(o->index_n_heads >= 1 && o->index_topk >= 1, "index heads and top-k must be >= 1");
    REQ(o->q_lora_rank >= 1 && o->o_lora_rank >= 1, "lora ranks must be >= 1");
    REQ(o->moe_inter_dim >= 32 && o->moe_inter_dim % 32 == 0, "moe width must be a multiple of 32 (got %d)",
        o->moe_inter_dim);
    REQ(o->dim % 32 == 0, "dim must be a multiple of 32 (MXFP4 experts; got %d)", o->dim);
    REQ(o->n_routed_experts >= 1 && o->n_routed_experts <= 1024, "experts must be in [1, 1024] (got %d)",
        o->n_routed_experts);
    REQ(o->n_activated_experts >= 1 && o->n_activated_experts <= o->n_routed_experts,
        "active experts must be in [1, experts] (got %d)", o->n_activated_experts);
    REQ(o->window >= 1, "window must be >= 1 (got %d)", o->window);
    REQ(o->hca_ratio >= 2 && o->hca_ratio != 4, "hca ratio must be >= 2 and not 4 (got %d)", o->hca_ratio);
    REQ(o->max_position_embeddings >= 16, "max positions must be >= 16 (got %d)", o->max_position_embeddings);
#undef REQ
    return 0;
}

int dsv4_synth_write(const char *dir, const dsv4_synth_opts *o, uint64_t *bytes_out, dsv4_err *err) {
    if (check_opts(o, err)) return -1;
    if (mkdir_p(dir, err)) return -1;
    tlist L = {.seed = o->seed, .err = err, .nvfp4 = o->nvfp4};
    int rc = -1;
    char *p = NULL;
    build(&L, o);
    if (L.oom) {
        dsv4_errf(err, "synth: out of memory");
        goto done;
    }
    if (!(p = join(dir, "model.safetensors"))) goto oom;
    if (dsv4_st_write(p, L.t, L.n, err)) goto done;
    if (bytes_out) {
        struct stat st;
        *bytes_out = stat(p, &st) ? 0 : (uint64_t)st.st_size;
    }
    free(p);
    if (!(p = join(dir, "config.json"))) goto oom;
    if (write_config(p, o, err)) goto done;
    free(p);
    if (!(p = join(dir, "README.md"))) goto oom;
    if (write_readme(p, o, err)) goto done;
    if (o->tokenizer_dir) {
        static const char *files[] = {"tokenizer.json", "tokenizer_config.json"};
        for (int i = 0; i < 2; i++) {
            char *src = join(o->tokenizer_dir, files[i]);
            free(p);
            p = join(dir, files[i]);
            if (!src || !p) {
                free(src);
                goto oom;
            }
            int r = copy_file(src, p, i == 1, err);
            free(src);
            if (r) goto done;
        }
    }
    rc = 0;
    goto done;
oom:
    dsv4_errf(err, "synth: out of memory");
done:
    free(p);
    tl_free(&L);
    return rc;
}
