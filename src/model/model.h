/* model.h - a loaded DeepSeek-V4 model: config + every tensor bound per layer, checked against the
 * shapes the config implies (spec sections 3-15). Quantized weights stay mapped in their stored
 * format (dsv4_weight); small vectors (norms, mHC params, sinks, ape, gate bias, tid2eid) are copied
 * to float/int32 at load. */
#ifndef DSV4_MODEL_MODEL_H
#define DSV4_MODEL_MODEL_H

#include <stdint.h>

#include "../io/config.h"
#include "../io/safetensors.h"
#include "../quant/weight.h"

/* One compressor (spec 8): attention's (d = head_dim) or the indexer's (d = index_head_dim). */
typedef struct dsv4_compressor {
    int ratio;         /* m */
    int overlap;       /* m == 4: two halves per token (c = 2) */
    int d;             /* output width */
    dsv4_weight wkv;   /* [c*d, D] */
    dsv4_weight wgate; /* [c*d, D] */
    float *ape;        /* [m, c*d] */
    float *norm;       /* [d] */
} dsv4_compressor;

typedef struct dsv4_layer {
    int ratio;                 /* compress ratio: 0 = sliding window only */
    int hash;                  /* hash-routed MoE (layer < n_hash_layers) */
    float *rope_freq;          /* [R/2] frequencies for this layer (shared by q, kv, compressors) */
    /* mHC */
    dsv4_weight hc_attn_fn, hc_ffn_fn; /* [(2+M)*M, M*D] */
    float *hc_attn_base, *hc_attn_scale, *hc_ffn_base, *hc_ffn_scale;
    float *attn_norm, *ffn_norm;
    /* attention */
    dsv4_weight wq_a, wq_b, wkv, wo_a, wo_b;
    float *q_norm, *kv_norm, *attn_sink;
    dsv4_compressor cmp;       /* ratio > 0 */
    /* indexer (ratio == 4) */
    dsv4_weight idx_wq_b, idx_wproj;
    dsv4_compressor idx_cmp;
    /* MoE */
    dsv4_weight gate;          /* [E, D] */
    float *gate_bias;          /* [E] (non-hash) */
    int32_t *tid2eid;          /* [vocab, K] (hash) */
    dsv4_weight *w1, *w2, *w3; /* [E] routed experts */
    int has_shared;
    dsv4_weight sw1, sw2, sw3; /* shared expert */
} dsv4_layer;

typedef struct dsv4_model {
    dsv4_config cfg;
    char *dir;
    dsv4_st *st;
    dsv4_weight embed, head;  /* [V, D] */
    float *norm;              /* [D] */
    dsv4_weight hc_head_fn;   /* [M, M*D] */
    float *hc_head_base, *hc_head_scale;
    dsv4_layer *layers;       /* [n_layers] */
    int n_mtp_skipped;        /* mtp.* tensors seen and not used */
    int n_unused;             /* other tensors not used by the model */
    /* Development hook: called after every block with the residual streams X [T, M, D] of the
     * tokens of the call (tests compare them with the reference's per-block hidden states). */
    void (*block_hook)(void *ctx, int layer, const float *X, int T);
    void *block_hook_ctx;
    void *gpu;                /* dsv4_cuda_model when the model runs on the GPU (dsv4_set_device) */
    int max_context;          /* context capacity set by dsv4_set_max_context (0: the device's default) */
} dsv4_model;

/* Loads DIR (config.json + safetensors). Every error names the file, tensor or field. */
int dsv4_model_load_dir(const char *dir, dsv4_model **out, dsv4_err *err);
void dsv4_model_destroy(dsv4_model *m);

/* Calls fn for every matrix weight of the model (embed, head, mHC, attention, compressors, indexer,
 * gate, experts), with the layer (-1 for global ones). */
void dsv4_model_foreach_weight(const dsv4_model *m, void (*fn)(void *ctx, int layer, const dsv4_weight *w),
                               void *ctx);

/* The context capacity in effect (dsv4_set_max_context; default per device). */
int dsv4_model_capacity(const dsv4_model *m);

/* YaRN / plain RoPE frequency table of spec section 6 for dim R (R/2 entries). */
void dsv4_rope_freqs(const dsv4_config *c, int compressed, float *freq);

#endif
