/* bench_model.h - synthetic checkpoints with the real DeepSeek-V4 Flash / Pro layer shapes for
 * `dsv4 bench`, and the byte model of a decode step.
 *
 * dsv4_bench_write writes config.json + model.safetensors (release formats: FP8 e4m3 linears, wo_a
 * included, with F8_E8M0 128x128 block scales, MXFP4 (I8 + F8_E8M0 per 32) or NVFP4 (I8 + F8_E4M3 per
 * 16 + F32 weight_scale_2) routed experts, BF16 embed / head / gate / compressors / indexer
 * weights_proj, F32 norms / mHC / ape / sinks / gate bias, I64 tid2eid) for the first n_layers layers of the
 * real config (compress ratios and hash layers as released). The file is sized first and filled
 * through a shared mapping by all OpenMP threads; every value comes from a counter-based hash of
 * (seed, tensor name, element index), so the result is the same for any thread count. Values are
 * random codes scaled like a freshly initialized model (std ~ 1/sqrt(fan_in)); routing is whatever
 * the random gate gives. The tensor list is model/ckpt_tensors.h's, as for `dsv4 synth`; only the
 * values differ (src/model/synth.c encodes every value from floats, single-threaded, in memory: too
 * slow for 3-12 GiB of experts per layer). */
#ifndef DSV4_BENCH_MODEL_H
#define DSV4_BENCH_MODEL_H

#include <stdint.h>

#include "../util/err.h"

typedef struct dsv4_bench_shape {
    const char *name;     /* "flash", "pro", "tiny" */
    int n_layers_full;    /* layers of the released model (43 / 61) */
    int vocab, dim, n_heads, head_dim, rope_dim, q_lora, o_groups, o_lora;
    int moe_inter, n_experts, n_active, n_hash_layers;
    int window, idx_heads, idx_dim, idx_topk;
    float route_scale;
    int ratio[64];        /* compress ratio of layer i (released config) */
} dsv4_bench_shape;

/* 0, or -1 for an unknown name. */
int dsv4_bench_shape_get(const char *name, dsv4_bench_shape *out);

/* Bytes of the stored weights that one decode step reads, by part (formats as stored). */
typedef struct dsv4_bench_bytes {
    double dense;         /* every tensor of the layer except routed experts and tid2eid */
    double expert;        /* one routed expert: w1 + w2 + w3 and their scales */
    double head;          /* head.weight + final norm + hc_head */
    /* multiply-adds per token of the matrices above (embedding and tid2eid excluded) */
    double dense_macs, expert_macs, head_macs;
} dsv4_bench_bytes;

/* Bytes of layer L (any L < n_layers_full) and of the head, for experts MXFP4 (nvfp4 = 0) or NVFP4. */
void dsv4_bench_layer_bytes(const dsv4_bench_shape *s, int L, int nvfp4, dsv4_bench_bytes *out);

/* Minimum KV bytes one sequence's decode step at context ctx reads in layer L, in the reference's
 * cache formats: an attention entry = 448 FP8 nope values + 64 BF16 rope values (576 B) + one scale
 * per 64 (7 B); an indexer key = 128 FP4 values + one scale per 32 (68 B). Window: min(ctx, W)
 * entries; CSA: every indexer key (the scores) + min(top-k, ctx/4) entries; HCA: ctx/128 entries.
 * *engine_bytes gets the same count in the engine's present fp32 caches. */
double dsv4_bench_kv_bytes(const dsv4_bench_shape *s, int L, long ctx, double *engine_bytes);

/* Writes dir/config.json and dir/model.safetensors (dir must exist). *bytes_out: file size. */
int dsv4_bench_write(const char *dir, const dsv4_bench_shape *s, int n_layers, int nvfp4, uint64_t seed,
                     uint64_t *bytes_out, dsv4_err *err);

#endif
