/* config.h - config.json (Hugging Face / release style) -> dsv4_config.
 *
 * Owns: reading every field the model uses, defaults only where the release format allows them,
 * and validation (missing, wrong type, out of range, inconsistent). Every error names the field.
 * Spec: ../shared/spec/dsv4-architecture.md section 1. */
#ifndef DSV4_IO_CONFIG_H
#define DSV4_IO_CONFIG_H

#include <stddef.h>

#include "../util/err.h"

#define DSV4_MAX_LAYERS 256

typedef enum dsv4_quant_recipe {
    DSV4_RECIPE_NONE = 0,  /* bf16 / f32 weights: no activation quantization */
    DSV4_RECIPE_FP8,       /* quantization_config.quant_method == "fp8": FP8 act-quant before FP8/FP4 GEMMs */
    DSV4_RECIPE_MODELOPT,  /* quant_method == "modelopt" (NVFP4-only, W4A16 here) */
} dsv4_quant_recipe;

typedef struct dsv4_config {
    int vocab_size;          /* vocab_size */
    int dim;                 /* hidden_size */
    int moe_inter_dim;       /* moe_intermediate_size */
    int n_layers;            /* num_hidden_layers */
    int n_hash_layers;       /* num_hash_layers (default 0) */
    int n_mtp_layers;        /* num_nextn_predict_layers (default 0) */
    int n_heads;             /* num_attention_heads */
    int n_kv_heads;          /* num_key_value_heads (must be 1) */
    int head_dim;            /* head_dim */
    int rope_head_dim;       /* qk_rope_head_dim */
    int q_lora_rank;         /* q_lora_rank */
    int o_groups;            /* o_groups */
    int o_lora_rank;         /* o_lora_rank */
    int n_routed_experts;    /* n_routed_experts */
    int n_shared_experts;    /* n_shared_experts (0 or 1) */
    int n_activated_experts; /* num_experts_per_tok */
    float route_scale;       /* routed_scaling_factor */
    float swiglu_limit;      /* swiglu_limit (0 = no clamp) */
    int window_size;         /* sliding_window */
    float norm_eps;          /* rms_norm_eps */
    float hc_eps;            /* hc_eps */
    int hc_mult;             /* hc_mult */
    int hc_sinkhorn_iters;   /* hc_sinkhorn_iters */
    int index_n_heads;       /* index_n_heads */
    int index_head_dim;      /* index_head_dim */
    int index_topk;          /* index_topk */
    float rope_theta;        /* rope_theta */
    float compress_rope_theta; /* compress_rope_theta */
    /* rope_scaling (type "yarn"); original_seq_len 0 when absent -> no YaRN */
    float rope_factor;       /* rope_scaling.factor */
    int original_seq_len;    /* rope_scaling.original_max_position_embeddings */
    float beta_fast, beta_slow;
    int max_position_embeddings;
    int bos_token_id, eos_token_id;
    /* compress_ratios: n_layers entries, plus one per MTP layer when present in the file
     * (n_compress_ratios says how many the file had). Values 0, 4 (overlap+indexer) or any m > 1. */
    int n_compress_ratios;
    int compress_ratios[DSV4_MAX_LAYERS];
    dsv4_quant_recipe recipe;
    char quant_method[32];   /* "" when no quantization_config */
    int expert_fp4;          /* expert_dtype == "fp4" */
    int scale_ue8m0;         /* quantization_config.scale_fmt == "ue8m0" (default for fp8) */
    int tie_word_embeddings; /* must be false */
} dsv4_config;

/* Parses and validates; `what` names the source in errors (a path). */
int dsv4_config_parse(const char *json, size_t len, const char *what, dsv4_config *cfg, dsv4_err *err);
/* Reads DIR/config.json (or the file itself if path is a file). */
int dsv4_config_load(const char *path, dsv4_config *cfg, dsv4_err *err);

#endif
