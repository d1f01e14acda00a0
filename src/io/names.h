/* names.h - checkpoint tensor names -> dsv4's internal naming (spec section 15).
 *
 * The internal naming is DeepSeek's native release naming without any prefix
 * ("layers.3.attn.wq_a.weight", "layers.3.ffn.experts.7.w1.scale", "embed.weight", ...).
 * Accepted spellings: native (with or without "model."), Hugging Face transformers
 * (model.layers.N.self_attn.q_a_proj.weight ..., fused mlp.experts.gate_up_proj / down_proj,
 * per-expert mlp.experts.E.gate_proj|up_proj|down_proj, both indexer weights_proj spellings), the
 * legacy V3 spellings the official converter accepts, and FP8 `weight_scale_inv` (-> `scale`).
 * NVFP4 companions (`weight_scale`, `weight_scale_2`, `input_scale`) keep their leaf names.
 * Fused HF experts map to "layers.N.ffn.experts.gate_up_proj" / "layers.N.ffn.experts.down_proj". */
#ifndef DSV4_IO_NAMES_H
#define DSV4_IO_NAMES_H

#include <stddef.h>

/* Writes the internal name of `stored` into out (size cap). Returns 0, or -1 if it does not fit. */
int dsv4_name_to_internal(const char *stored, char *out, size_t cap);

#endif
