/* names.c - see names.h. Table-driven: ordered substring rewrites, most specific first. */
#include "names.h"

#include <stdio.h>
#include <string.h>

typedef struct {
    const char *from, *to;
} rule;

/* Whole-name rules (after stripping "model."). */
static const rule global_rules[] = {
    {"embed_tokens.", "embed."},
    {"lm_head.", "head."},
    {"hc_head.hc_fn", "hc_head_fn"},
    {"hc_head.hc_base", "hc_head_base"},
    {"hc_head.hc_scale", "hc_head_scale"},
};

/* Rules on the part after "layers.N." (first match of each rule's `from` at the start). */
static const rule layer_rules[] = {
    {"self_attn.compressor.indexer.scorer.weights_proj.", "attn.indexer.weights_proj."},
    {"self_attn.compressor.indexer.weights_proj.", "attn.indexer.weights_proj."},
    {"self_attn.compressor.indexer.q_b_proj.", "attn.indexer.wq_b."},
    {"self_attn.compressor.indexer.kv_proj.", "attn.indexer.compressor.wkv."},
    {"self_attn.compressor.indexer.gate_proj.", "attn.indexer.compressor.wgate."},
    {"self_attn.compressor.indexer.position_bias", "attn.indexer.compressor.ape"},
    {"self_attn.compressor.indexer.kv_norm.", "attn.indexer.compressor.norm."},
    {"self_attn.compressor.kv_proj.", "attn.compressor.wkv."},
    {"self_attn.compressor.gate_proj.", "attn.compressor.wgate."},
    {"self_attn.compressor.position_bias", "attn.compressor.ape"},
    {"self_attn.compressor.kv_norm.", "attn.compressor.norm."},
    {"self_attn.q_a_proj.", "attn.wq_a."},
    {"self_attn.q_a_norm.", "attn.q_norm."},
    {"self_attn.q_a_layernorm.", "attn.q_norm."},
    {"self_attn.q_b_proj.", "attn.wq_b."},
    {"self_attn.kv_proj.", "attn.wkv."},
    {"self_attn.o_a_proj.", "attn.wo_a."},
    {"self_attn.o_b_proj.", "attn.wo_b."},
    {"self_attn.sinks", "attn.attn_sink"},
    {"self_attn.", "attn."},
    {"input_layernorm.", "attn_norm."},
    {"post_attention_layernorm.", "ffn_norm."},
    {"attn_hc.fn", "hc_attn_fn"},
    {"attn_hc.base", "hc_attn_base"},
    {"attn_hc.scale", "hc_attn_scale"},
    {"ffn_hc.fn", "hc_ffn_fn"},
    {"ffn_hc.base", "hc_ffn_base"},
    {"ffn_hc.scale", "hc_ffn_scale"},
    {"mlp.gate.e_score_correction_bias", "ffn.gate.bias"},
    {"mlp.", "ffn."},
};

/* Leaf / projection renames inside ffn.experts.E. and ffn.shared_experts. */
static const rule proj_rules[] = {
    {"gate_proj", "w1"},
    {"up_proj", "w3"},
    {"down_proj", "w2"},
};

static int starts(const char *s, const char *p) { return strncmp(s, p, strlen(p)) == 0; }

int dsv4_name_to_internal(const char *stored, char *out, size_t cap) {
    char buf[512], tmp[512];
    const char *s = stored;
    if (starts(s, "model.")) s += 6;
    if (strlen(s) >= sizeof buf) return -1;
    strcpy(buf, s);

    for (size_t i = 0; i < sizeof global_rules / sizeof global_rules[0]; i++)
        if (starts(buf, global_rules[i].from)) {
            snprintf(tmp, sizeof tmp, "%s%s", global_rules[i].to, buf + strlen(global_rules[i].from));
            strcpy(buf, tmp);
            break;
        }

    if (starts(buf, "layers.") || starts(buf, "mtp.")) {
        /* prefix "layers.N." */
        char *p = strchr(buf, '.') + 1;
        char *q = strchr(p, '.');
        if (q) {
            q++;
            size_t pre = (size_t)(q - buf);
            for (size_t i = 0; i < sizeof layer_rules / sizeof layer_rules[0]; i++)
                if (starts(q, layer_rules[i].from)) {
                    int n = snprintf(tmp, sizeof tmp, "%.*s%s%s", (int)pre, buf, layer_rules[i].to,
                                     q + strlen(layer_rules[i].from));
                    if (n < 0 || (size_t)n >= sizeof tmp) return -1;
                    strcpy(buf, tmp);
                    break;
                }
            /* expert projections */
            char *e = NULL;
            if (starts(q, "ffn.shared_experts.")) e = q + strlen("ffn.shared_experts.");
            else if (starts(q, "ffn.experts.")) {
                e = q + strlen("ffn.experts.");
                if (*e >= '0' && *e <= '9') {
                    while (*e >= '0' && *e <= '9') e++;
                    if (*e == '.') e++;
                } else e = NULL; /* fused HF tensors keep their names */
            }
            if (e)
                for (size_t i = 0; i < sizeof proj_rules / sizeof proj_rules[0]; i++)
                    if (starts(e, proj_rules[i].from)) {
                        size_t pre2 = (size_t)(e - buf);
                        snprintf(tmp, sizeof tmp, "%.*s%s%s", (int)pre2, buf, proj_rules[i].to,
                                 e + strlen(proj_rules[i].from));
                        strcpy(buf, tmp);
                        break;
                    }
        }
    }
    /* FP8 scales, V3 spelling */
    size_t n = strlen(buf);
    const char *inv = ".weight_scale_inv";
    if (n > strlen(inv) && !strcmp(buf + n - strlen(inv), inv)) strcpy(buf + n - strlen(inv), ".scale");
    if (strlen(buf) >= cap) return -1;
    strcpy(out, buf);
    return 0;
}
