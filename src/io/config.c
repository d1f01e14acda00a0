/* config.c - see config.h. */
#include "config.h"

#include <cjson/cJSON.h>
#include <float.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "../util/json.h"
#include "../util/strbuf.h"

#define CFG_MAX_DIM (1 << 24)          /* sane upper bound of every size */
#define CFG_MAX_FILE ((size_t)64 << 20) /* a config.json is a few KB */

typedef struct {
    const cJSON *root;
    const char *what;
    dsv4_err *err;
} ctx;

static int ferr(const ctx *c, const char *field, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int ferr(const ctx *c, const char *field, const char *fmt, ...) {
    char msg[768];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return dsv4_errf(c->err, "%s: field '%s': %s", c->what, field, msg);
}

/* The member `key` of object `obj` (NULL if absent); a key given twice is an error (*dup set). */
static const cJSON *member(const cJSON *obj, const char *key, int *dup) {
    const cJSON *found = NULL;
    *dup = 0;
    for (const cJSON *e = obj ? obj->child : NULL; e; e = e->next) {
        if (e->string && strcmp(e->string, key) == 0) {
            if (found) {
                *dup = 1;
                return found;
            }
            found = e;
        }
    }
    return found;
}

/* Looks up `key` in `obj`; name = full field name for messages. Returns 1 present, 0 absent or null,
 * -1 error (duplicate). */
static int lookup(const ctx *c, const cJSON *obj, const char *key, const char *name, const cJSON **out) {
    int dup;
    const cJSON *j = member(obj, key, &dup);
    *out = NULL;
    if (dup) return ferr(c, name, "given more than once");
    if (!j || cJSON_IsNull(j)) return 0;
    *out = j;
    return 1;
}

/* An integer in [lo, hi]; 4.0 is accepted as 4, 4.5 is not. */
static int as_int(const ctx *c, const cJSON *j, const char *name, long long lo, long long hi, int *out) {
    if (!cJSON_IsNumber(j)) return ferr(c, name, "must be an integer (got %s)", dsv4_json_kind(j));
    double v = j->valuedouble;
    if (!isfinite(v) || floor(v) != v) return ferr(c, name, "must be an integer (got %g)", v);
    if (v < (double)lo || v > (double)hi)
        return ferr(c, name, "must be in [%lld, %lld] (got %.17g)", lo, hi, v);
    *out = (int)v;
    return 0;
}

static int get_int(const ctx *c, const cJSON *obj, const char *key, const char *name, int required, int def,
                   long long lo, long long hi, int *out) {
    const cJSON *j;
    int r = lookup(c, obj, key, name, &j);
    if (r < 0) return -1;
    if (r == 0) {
        if (required) return ferr(c, name, "required field is missing");
        *out = def;
        return 0;
    }
    return as_int(c, j, name, lo, hi, out);
}

/* A finite number in the open/closed range described by lo/hi (lo_open: lo excluded). */
static int get_float(const ctx *c, const cJSON *obj, const char *key, const char *name, int required, double def,
                     double lo, int lo_open, double hi, int hi_open, float *out) {
    const cJSON *j;
    int r = lookup(c, obj, key, name, &j);
    if (r < 0) return -1;
    if (r == 0) {
        if (required) return ferr(c, name, "required field is missing");
        *out = (float)def;
        return 0;
    }
    if (!cJSON_IsNumber(j)) return ferr(c, name, "must be a number (got %s)", dsv4_json_kind(j));
    double v = j->valuedouble;
    if (!isfinite(v) || fabs(v) > FLT_MAX) return ferr(c, name, "must be a finite number (got %g)", v);
    /* The range must hold for the value as stored (a float): 1e-200 is > 0 but rounds to 0. */
    float f = (float)v;
    double fv = f;
    if (v != 0 && f == 0) return ferr(c, name, "underflows a float (got %.9g)", v);
    if ((lo_open ? !(v > lo && fv > lo) : !(v >= lo && fv >= lo)) ||
        (hi_open ? !(v < hi && fv < hi) : !(v <= hi && fv <= hi)))
        return ferr(c, name, "must be in %c%g, %g%c as a float (got %.9g)", lo_open ? '(' : '[', lo, hi,
                    hi_open ? ')' : ']', v);
    *out = f;
    return 0;
}

/* Optional string; *out NULL when absent/null. */
static int get_str(const ctx *c, const cJSON *obj, const char *key, const char *name, const char **out) {
    const cJSON *j;
    int r = lookup(c, obj, key, name, &j);
    *out = NULL;
    if (r <= 0) return r;
    if (!cJSON_IsString(j) || !j->valuestring) return ferr(c, name, "must be a string (got %s)", dsv4_json_kind(j));
    *out = j->valuestring;
    return 0;
}

/* Optional boolean; *out = -1 when absent/null. */
static int get_bool(const ctx *c, const cJSON *obj, const char *key, const char *name, int *out) {
    const cJSON *j;
    int r = lookup(c, obj, key, name, &j);
    *out = -1;
    if (r <= 0) return r;
    if (!cJSON_IsBool(j)) return ferr(c, name, "must be true or false (got %s)", dsv4_json_kind(j));
    *out = cJSON_IsTrue(j) ? 1 : 0;
    return 0;
}

/* A token id: an integer, or a non-empty array of integers (the first is used). */
static int get_token_id(const ctx *c, const char *key, int def, int vocab, int *out) {
    const cJSON *j;
    int r = lookup(c, c->root, key, key, &j);
    if (r < 0) return -1;
    if (r == 0) {
        *out = def;
    } else if (cJSON_IsArray(j)) {
        if (!j->child) return ferr(c, key, "must not be an empty array");
        int first = 0;
        for (const cJSON *e = j->child; e; e = e->next) {
            int v;
            if (as_int(c, e, key, 0, (long long)vocab - 1, &v) != 0) return -1;
            if (e == j->child) first = v;
        }
        *out = first;
    } else if (as_int(c, j, key, 0, (long long)vocab - 1, out) != 0) {
        return -1;
    }
    if (*out < 0 || *out >= vocab) return ferr(c, key, "must be in [0, vocab_size) (got %d)", *out);
    return 0;
}

static int parse_rope_scaling(const ctx *c, dsv4_config *cfg) {
    const cJSON *rs;
    int r = lookup(c, c->root, "rope_scaling", "rope_scaling", &rs);
    cfg->rope_factor = 1.0f;
    cfg->original_seq_len = 0;
    cfg->beta_fast = 32.0f;
    cfg->beta_slow = 1.0f;
    if (r < 0) return -1;
    if (r == 0) return 0;
    if (!cJSON_IsObject(rs)) return ferr(c, "rope_scaling", "must be an object or null (got %s)", dsv4_json_kind(rs));
    const char *type, *rtype;
    if (get_str(c, rs, "type", "rope_scaling.type", &type) < 0) return -1;
    if (get_str(c, rs, "rope_type", "rope_scaling.rope_type", &rtype) < 0) return -1;
    if (!type && !rtype) return ferr(c, "rope_scaling.type", "required field is missing");
    if (type && strcmp(type, "yarn") != 0)
        return ferr(c, "rope_scaling.type", "must be \"yarn\" (got \"%.64s\")", type);
    if (rtype && strcmp(rtype, "yarn") != 0)
        return ferr(c, "rope_scaling.rope_type", "must be \"yarn\" (got \"%.64s\")", rtype);
    if (get_float(c, rs, "factor", "rope_scaling.factor", 1, 1, 1, 0, 1e9, 0, &cfg->rope_factor) < 0) return -1;
    if (get_int(c, rs, "original_max_position_embeddings", "rope_scaling.original_max_position_embeddings", 1, 0,
                1, INT32_MAX, &cfg->original_seq_len) < 0)
        return -1;
    if (get_float(c, rs, "beta_fast", "rope_scaling.beta_fast", 0, 32, 0, 1, 1e9, 0, &cfg->beta_fast) < 0) return -1;
    if (get_float(c, rs, "beta_slow", "rope_scaling.beta_slow", 0, 1, 0, 1, 1e9, 0, &cfg->beta_slow) < 0) return -1;
    return 0;
}

static int parse_quant(const ctx *c, dsv4_config *cfg) {
    const cJSON *q;
    int r = lookup(c, c->root, "quantization_config", "quantization_config", &q);
    cfg->recipe = DSV4_RECIPE_NONE;
    cfg->quant_method[0] = 0;
    cfg->scale_ue8m0 = 0;
    if (r < 0) return -1;
    if (r == 0) return 0;
    if (!cJSON_IsObject(q))
        return ferr(c, "quantization_config", "must be an object or null (got %s)", dsv4_json_kind(q));
    const char *m;
    if (get_str(c, q, "quant_method", "quantization_config.quant_method", &m) < 0) return -1;
    if (!m) return ferr(c, "quantization_config.quant_method", "required field is missing");
    if (strcmp(m, "fp8") == 0) {
        cfg->recipe = DSV4_RECIPE_FP8;
        const cJSON *bs;
        if ((r = lookup(c, q, "weight_block_size", "quantization_config.weight_block_size", &bs)) < 0) return -1;
        if (r > 0) {
            const cJSON *a = cJSON_IsArray(bs) ? bs->child : NULL, *b = a ? a->next : NULL;
            if (!a || !b || b->next || !cJSON_IsNumber(a) || !cJSON_IsNumber(b) || a->valuedouble != 128 ||
                b->valuedouble != 128)
                return ferr(c, "quantization_config.weight_block_size", "must be [128, 128]");
        }
        const char *fmt, *sf;
        if (get_str(c, q, "fmt", "quantization_config.fmt", &fmt) < 0) return -1;
        if (fmt && strcmp(fmt, "e4m3") != 0)
            return ferr(c, "quantization_config.fmt", "must be \"e4m3\" (got \"%.64s\")", fmt);
        if (get_str(c, q, "scale_fmt", "quantization_config.scale_fmt", &sf) < 0) return -1;
        if (sf && strcmp(sf, "ue8m0") != 0)
            return ferr(c, "quantization_config.scale_fmt", "must be \"ue8m0\" (got \"%.64s\")", sf);
        cfg->scale_ue8m0 = 1;
    } else if (strcmp(m, "modelopt") == 0) {
        cfg->recipe = DSV4_RECIPE_MODELOPT;
    } else {
        return ferr(c, "quantization_config.quant_method", "unsupported \"%.64s\" (want \"fp8\" or \"modelopt\")", m);
    }
    snprintf(cfg->quant_method, sizeof cfg->quant_method, "%s", m);
    return 0;
}

static int parse_compress_ratios(const ctx *c, dsv4_config *cfg) {
    const cJSON *a;
    int r = lookup(c, c->root, "compress_ratios", "compress_ratios", &a);
    if (r < 0) return -1;
    if (r == 0) return ferr(c, "compress_ratios", "required field is missing");
    if (!cJSON_IsArray(a))
        return ferr(c, "compress_ratios", "must be an array of integers (got %s)", dsv4_json_kind(a));
    int n = 0, want1 = cfg->n_layers, want2 = cfg->n_layers + cfg->n_mtp_layers;
    for (const cJSON *e = a->child; e; e = e->next) {
        if (n >= want2) {
            n++;
            continue;
        }
        char name[48];
        snprintf(name, sizeof name, "compress_ratios[%d]", n);
        int v;
        if (as_int(c, e, name, INT32_MIN, INT32_MAX, &v) < 0) return -1;
        if (v < 0 || v == 1 || v >= CFG_MAX_DIM)
            return ferr(c, name, "must be 0 or in [2, %d) (got %d)", CFG_MAX_DIM, v);
        cfg->compress_ratios[n++] = v;
    }
    if (n != want1 && n != want2) {
        if (want1 == want2)
            return ferr(c, "compress_ratios", "must have num_hidden_layers = %d entries (got %d)", want1, n);
        return ferr(c, "compress_ratios",
                    "must have num_hidden_layers = %d or num_hidden_layers + num_nextn_predict_layers = %d entries (got %d)",
                    want1, want2, n);
    }
    cfg->n_compress_ratios = n;
    return 0;
}

/* Keys must be unique in the top-level object for the fields we read; unknown keys are ignored. */
static int parse_root(const ctx *c, dsv4_config *cfg) {
    const cJSON *R = c->root;
    const long long M = CFG_MAX_DIM - 1;
#define REQ_INT(key, dst, lo, hi) \
    if (get_int(c, R, key, key, 1, 0, lo, hi, &cfg->dst) < 0) return -1
#define OPT_INT(key, dst, def, lo, hi) \
    if (get_int(c, R, key, key, 0, def, lo, hi, &cfg->dst) < 0) return -1
    const char *s;
    if (get_str(c, R, "model_type", "model_type", &s) < 0) return -1;
    if (s && strcmp(s, "deepseek_v4") != 0)
        return ferr(c, "model_type", "must be \"deepseek_v4\" (got \"%.64s\")", s);

    REQ_INT("vocab_size", vocab_size, 1, M);
    REQ_INT("hidden_size", dim, 1, M);
    REQ_INT("moe_intermediate_size", moe_inter_dim, 1, M);
    REQ_INT("num_hidden_layers", n_layers, 1, DSV4_MAX_LAYERS);
    OPT_INT("num_hash_layers", n_hash_layers, 0, 0, DSV4_MAX_LAYERS);
    OPT_INT("num_nextn_predict_layers", n_mtp_layers, 0, 0, DSV4_MAX_LAYERS);
    REQ_INT("num_attention_heads", n_heads, 1, M);
    OPT_INT("num_key_value_heads", n_kv_heads, 1, 1, 1);
    REQ_INT("head_dim", head_dim, 1, M);
    REQ_INT("qk_rope_head_dim", rope_head_dim, 1, M);
    REQ_INT("q_lora_rank", q_lora_rank, 1, M);
    REQ_INT("o_groups", o_groups, 1, M);
    REQ_INT("o_lora_rank", o_lora_rank, 1, M);
    REQ_INT("n_routed_experts", n_routed_experts, 1, M);
    OPT_INT("n_shared_experts", n_shared_experts, 1, 0, 1);
    REQ_INT("num_experts_per_tok", n_activated_experts, 1, M);
    REQ_INT("sliding_window", window_size, 1, M);
    REQ_INT("index_n_heads", index_n_heads, 1, M);
    REQ_INT("index_head_dim", index_head_dim, 1, M);
    REQ_INT("index_topk", index_topk, 1, M);
    REQ_INT("hc_mult", hc_mult, 1, 1024);
    OPT_INT("hc_sinkhorn_iters", hc_sinkhorn_iters, 20, 1, 1000);
    OPT_INT("max_position_embeddings", max_position_embeddings, 1048576, 1, INT32_MAX);
#undef REQ_INT
#undef OPT_INT

    if (get_float(c, R, "rope_theta", "rope_theta", 1, 0, 0, 1, FLT_MAX, 0, &cfg->rope_theta) < 0) return -1;
    if (get_float(c, R, "compress_rope_theta", "compress_rope_theta", 1, 0, 0, 1, FLT_MAX, 0,
                  &cfg->compress_rope_theta) < 0)
        return -1;
    if (get_float(c, R, "routed_scaling_factor", "routed_scaling_factor", 1, 0, 0, 1, FLT_MAX, 0, &cfg->route_scale) < 0)
        return -1;
    if (get_float(c, R, "rms_norm_eps", "rms_norm_eps", 1, 0, 0, 1, 1, 1, &cfg->norm_eps) < 0) return -1;
    if (get_float(c, R, "swiglu_limit", "swiglu_limit", 0, 0, 0, 0, FLT_MAX, 0, &cfg->swiglu_limit) < 0) return -1;
    if (get_float(c, R, "hc_eps", "hc_eps", 0, 1e-6, 0, 1, 1, 1, &cfg->hc_eps) < 0) return -1;

    if (get_str(c, R, "scoring_func", "scoring_func", &s) < 0) return -1;
    if (s && strcmp(s, "sqrtsoftplus") != 0)
        return ferr(c, "scoring_func", "must be \"sqrtsoftplus\" (got \"%.64s\")", s);
    if (get_str(c, R, "topk_method", "topk_method", &s) < 0) return -1;
    if (s && strcmp(s, "noaux_tc") != 0) return ferr(c, "topk_method", "must be \"noaux_tc\" (got \"%.64s\")", s);
    int b;
    if (get_bool(c, R, "norm_topk_prob", "norm_topk_prob", &b) < 0) return -1;
    if (get_bool(c, R, "tie_word_embeddings", "tie_word_embeddings", &b) < 0) return -1;
    if (b == 1) return ferr(c, "tie_word_embeddings", "must be false (DeepSeek-V4 has a separate head)");
    cfg->tie_word_embeddings = 0;

    if (get_token_id(c, "bos_token_id", 0, cfg->vocab_size, &cfg->bos_token_id) < 0) return -1;
    if (get_token_id(c, "eos_token_id", 1, cfg->vocab_size, &cfg->eos_token_id) < 0) return -1;

    if (get_str(c, R, "expert_dtype", "expert_dtype", &s) < 0) return -1;
    cfg->expert_fp4 = 0;
    if (s) {
        if (strcmp(s, "fp4") == 0)
            cfg->expert_fp4 = 1;
        else if (strcmp(s, "fp8") != 0 && strcmp(s, "bf16") != 0)
            return ferr(c, "expert_dtype", "must be \"fp4\", \"fp8\" or \"bf16\" (got \"%.64s\")", s);
    }

    if (parse_rope_scaling(c, cfg) < 0) return -1;
    if (parse_quant(c, cfg) < 0) return -1;

    /* Consistency. */
    if (cfg->head_dim <= cfg->rope_head_dim)
        return ferr(c, "head_dim", "must be > qk_rope_head_dim (got %d <= %d)", cfg->head_dim, cfg->rope_head_dim);
    if (cfg->rope_head_dim % 2)
        return ferr(c, "qk_rope_head_dim", "must be even (got %d)", cfg->rope_head_dim);
    if (cfg->index_head_dim < cfg->rope_head_dim)
        return ferr(c, "index_head_dim", "must be >= qk_rope_head_dim (got %d < %d)", cfg->index_head_dim,
                    cfg->rope_head_dim);
    if (cfg->index_head_dim % 2)
        return ferr(c, "index_head_dim", "must be even (got %d)", cfg->index_head_dim);
    if (cfg->n_heads % cfg->o_groups)
        return ferr(c, "o_groups", "must divide num_attention_heads (got %d %% %d != 0)", cfg->n_heads, cfg->o_groups);
    if (cfg->n_activated_experts > cfg->n_routed_experts)
        return ferr(c, "num_experts_per_tok", "must be <= n_routed_experts (got %d > %d)", cfg->n_activated_experts,
                    cfg->n_routed_experts);
    if (cfg->n_hash_layers > cfg->n_layers)
        return ferr(c, "num_hash_layers", "must be <= num_hidden_layers (got %d > %d)", cfg->n_hash_layers,
                    cfg->n_layers);
    if (cfg->n_layers + cfg->n_mtp_layers > DSV4_MAX_LAYERS)
        return ferr(c, "num_nextn_predict_layers", "num_hidden_layers + num_nextn_predict_layers must be <= %d (got %d)",
                    DSV4_MAX_LAYERS, cfg->n_layers + cfg->n_mtp_layers);
    return parse_compress_ratios(c, cfg);
}

int dsv4_config_parse(const char *json, size_t len, const char *what, dsv4_config *cfg, dsv4_err *err) {
    if (!what) what = "config.json";
    if (!cfg) return dsv4_errf(err, "%s: no output", what);
    if (!json && len) return dsv4_errf(err, "%s: no data", what);
    if (len == 0) return dsv4_errf(err, "%s: empty file", what);
    if (len > CFG_MAX_FILE) return dsv4_errf(err, "%s: too large (%zu bytes)", what, len);
    if (memchr(json, 0, len)) return dsv4_errf(err, "%s: contains a NUL byte", what);
    /* cJSON gets a NUL-terminated copy, so that no parser slip can read past the input. */
    char *copy = malloc(len + 1);
    if (!copy) return dsv4_errf(err, "%s: out of memory", what);
    memcpy(copy, json, len);
    copy[len] = 0;
    json = copy;
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(json, len, &end, 0);
    if (!root) {
        size_t at = end && end >= json && end <= json + len ? (size_t)(end - json) : 0;
        free(copy);
        return dsv4_errf(err, "%s: not valid JSON (near byte %zu)", what, at);
    }
    int rc = -1;
    for (const char *p = end; p && p < json + len; p++)
        if (*p != ' ' && *p != '\t' && *p != '\n' && *p != '\r') {
            dsv4_errf(err, "%s: trailing characters after the JSON object (at byte %zu)", what, (size_t)(p - json));
            goto out;
        }
    if (!cJSON_IsObject(root)) {
        dsv4_errf(err, "%s: not a JSON object", what);
        goto out;
    }
    dsv4_config tmp;
    memset(&tmp, 0, sizeof tmp);
    ctx c = {root, what, err};
    if (parse_root(&c, &tmp) == 0) {
        *cfg = tmp;
        rc = 0;
    }
out:
    cJSON_Delete(root);
    free(copy);
    return rc;
}

int dsv4_config_load(const char *path, dsv4_config *cfg, dsv4_err *err) {
    if (!path) return dsv4_errf(err, "dsv4_config_load: no path");
    struct stat sb;
    char *file = NULL;
    if (stat(path, &sb) == 0 && S_ISDIR(sb.st_mode)) {
        size_t n = strlen(path);
        file = malloc(n + 16);
        if (!file) return dsv4_errf(err, "%s: out of memory", path);
        snprintf(file, n + 16, "%s%sconfig.json", path, n && path[n - 1] == '/' ? "" : "/");
    } else {
        file = strdup(path);
        if (!file) return dsv4_errf(err, "%s: out of memory", path);
    }
    size_t n = 0;
    char *buf = dsv4_read_file(file, CFG_MAX_FILE, &n, err);
    int rc = buf ? dsv4_config_parse(buf, n, file, cfg, err) : -1;
    free(buf);
    free(file);
    return rc;
}
