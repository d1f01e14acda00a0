/* ckpt_tensors.h - the tensors of a DeepSeek-V4 checkpoint in the release layout, from a config:
 * native names, shapes and stored formats (spec 1, 14, 15), and the scale of a freshly initialized
 * model. The one list behind both synthetic checkpoint writers (`dsv4 synth`, src/model/synth.c, and
 * `dsv4 bench --synthetic`, src/bench/bench_model.c); each fills the values its own way.
 *
 * The walk calls back once per logical tensor, in file order: embed, head, norm, hc_head_*, then per
 * layer the norms, mHC, attention, compressor (ratio > 0), indexer (ratio 4), gate, routed experts,
 * shared expert. A quantized linear is one entry; dsv4_ckpt_parts gives its stored tensors. */
#ifndef DSV4_MODEL_CKPT_TENSORS_H
#define DSV4_MODEL_CKPT_TENSORS_H

#include <stdint.h>

#include "../io/config.h"
#include "../io/safetensors.h"

#define DSV4_CKPT_NAME 96 /* room for any name with < 1000 layers and experts */

typedef enum dsv4_ckpt_kind {
    DSV4_CKPT_F32,     /* F32 [rows] or [rows, cols]; init off + amp * U[-1, 1) */
    DSV4_CKPT_BF16,    /* BF16 [rows, cols]; init uniform with standard deviation std */
    DSV4_CKPT_FP8,     /* FP8 e4m3 linear [rows, cols] + F8_E8M0 128x128 block scales; std 1/sqrt(cols) */
    DSV4_CKPT_FP4,     /* routed expert linear [rows, cols], MXFP4 or NVFP4; std 1/sqrt(cols) */
    DSV4_CKPT_TID2EID, /* I64 [vocab, n_activated_experts]: distinct experts in [0, n_experts) per token */
} dsv4_ckpt_kind;

typedef struct dsv4_ckpt_tensor {
    const char *name;  /* the tensor's name; for FP8 / FP4 the linear's (parts add .weight, .scale) */
    dsv4_ckpt_kind kind;
    int layer;         /* -1: global */
    int ndim;          /* 1 or 2 (logical shape; FP4 rows x cols of values) */
    int64_t shape[2];
    float off, amp;    /* F32 */
    float std;         /* BF16, FP8, FP4 */
    int n_experts;     /* TID2EID */
} dsv4_ckpt_tensor;

/* One stored tensor of a logical one. */
typedef struct dsv4_ckpt_part {
    char name[DSV4_CKPT_NAME];
    dsv4_dtype dtype;
    int ndim;
    int64_t shape[2];
} dsv4_ckpt_part;

typedef void (*dsv4_ckpt_fn)(void *ctx, const dsv4_ckpt_tensor *t);

/* Uses of c: vocab_size, dim, n_layers, n_hash_layers, n_heads, head_dim, q_lora_rank, o_groups,
 * o_lora_rank, moe_inter_dim, n_routed_experts, n_activated_experts, n_shared_experts, hc_mult,
 * index_n_heads, index_head_dim, compress_ratios. */
void dsv4_ckpt_global_tensors(const dsv4_config *c, dsv4_ckpt_fn fn, void *ctx);
void dsv4_ckpt_layer_tensors(const dsv4_config *c, int layer, dsv4_ckpt_fn fn, void *ctx);
/* global, then layers 0 .. n_layers - 1 */
void dsv4_ckpt_tensors(const dsv4_config *c, dsv4_ckpt_fn fn, void *ctx);

/* The stored tensors of t into out; returns how many: 1 (F32, BF16, TID2EID), 2 (FP8: NAME.weight
 * F8_E4M3 + NAME.scale F8_E8M0 [ceil(rows/128), ceil(cols/128)]; MXFP4: NAME.weight I8 [rows, cols/2],
 * low nibble = even element, + NAME.scale F8_E8M0 [rows, cols/32]) or 3 (NVFP4: NAME.weight I8 +
 * NAME.weight_scale F8_E4M3 [rows, cols/16] + NAME.weight_scale_2 F32 [1]). */
int dsv4_ckpt_parts(const dsv4_ckpt_tensor *t, int nvfp4, dsv4_ckpt_part out[3]);

#endif
