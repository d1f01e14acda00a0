/* synth.h - writes a small synthetic DeepSeek-V4 checkpoint in the release layout (spec 1, 14, 15):
 * config.json (Hugging Face release style, quantization_config fp8 / ue8m0 / [128, 128], expert_dtype
 * fp4, plus "dsv4_synthetic": true), model.safetensors with native names and the release formats
 * (FP8 e4m3 linears, wo_a included, + F8_E8M0 128x128 block scales, MXFP4 routed experts packed in I8 +
 * F8_E8M0 per-32 scales, BF16 embed / head / gate / compressors / indexer weights_proj, F32 norms / mHC /
 * ape / sinks / gate bias, I64 tid2eid), the tokenizer files copied from a tokenizer directory, and a README
 * saying the weights are random. The tensor list is ckpt_tensors.h's.
 *
 * The weights are deterministic pseudo-random numbers from the seed (each tensor has its own stream,
 * derived from the seed and the tensor's name), scaled like a freshly initialized model (linears
 * uniform with std 1/sqrt(fan_in), norms near 1) so activations stay in range. The model generates
 * gibberish: it exists to run the whole engine end to end on any machine. */
#ifndef DSV4_MODEL_SYNTH_H
#define DSV4_MODEL_SYNTH_H

#include <stdint.h>

#include "../util/err.h"

typedef struct dsv4_synth_opts {
    uint64_t seed;
    int vocab_size;            /* 129280 (the DeepSeek tokenizer's) */
    int dim;                   /* hidden_size */
    int n_layers;
    int n_hash_layers;         /* >= 1 exercises hash routing */
    int n_heads;
    int head_dim, rope_head_dim;
    int q_lora_rank, o_groups, o_lora_rank;
    int moe_inter_dim;
    int n_routed_experts, n_activated_experts;
    int window;                /* sliding_window */
    int index_n_heads, index_head_dim, index_topk;
    int hca_ratio;             /* the larger compress ratio; layers go 0, 4, hca, 4, hca, ... */
    int max_position_embeddings;
    int nvfp4;                 /* routed experts in NVIDIA's ModelOpt NVFP4 (spec 14.5's lossless cast of the MXFP4
                                * draw: the same values, so the same model) instead of MXFP4 */
    const char *tokenizer_dir; /* holds tokenizer.json (+ tokenizer_config.json); NULL: none copied */
} dsv4_synth_opts;

void dsv4_synth_defaults(dsv4_synth_opts *o);

/* Creates dir (and its parents) if needed and writes the checkpoint into it. 0, or -1 with err set.
 * *bytes_out (if not NULL) gets the size of model.safetensors. */
int dsv4_synth_write(const char *dir, const dsv4_synth_opts *o, uint64_t *bytes_out, dsv4_err *err);

#endif
