/* fuzz_config.c - libFuzzer target for dsv4_config_parse (config.json -> dsv4_config).
 *
 * Any input must either parse into a config that satisfies the documented invariants, or fail
 * with a non-empty message naming the source. Anything else aborts (= a finding). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "io/config.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    dsv4_config c;
    dsv4_err err;
    err.msg[0] = 0;
    if (dsv4_config_parse((const char *)data, size, "fuzz.json", &c, &err) != 0) {
        if (!err.msg[0] || !strstr(err.msg, "fuzz.json")) abort();
        return 0;
    }
    if (c.n_layers < 1 || c.n_layers > DSV4_MAX_LAYERS || c.n_mtp_layers < 0 ||
        c.n_layers + c.n_mtp_layers > DSV4_MAX_LAYERS)
        abort();
    if (c.n_compress_ratios != c.n_layers && c.n_compress_ratios != c.n_layers + c.n_mtp_layers) abort();
    for (int i = 0; i < c.n_compress_ratios; i++)
        if (c.compress_ratios[i] < 0 || c.compress_ratios[i] == 1) abort();
    if (c.head_dim <= c.rope_head_dim || c.rope_head_dim % 2 || c.index_head_dim < c.rope_head_dim) abort();
    if (c.o_groups < 1 || c.n_heads % c.o_groups || c.n_activated_experts > c.n_routed_experts) abort();
    if (c.n_hash_layers > c.n_layers || c.n_kv_heads != 1 || c.n_shared_experts < 0 || c.n_shared_experts > 1) abort();
    if (!(c.norm_eps > 0 && c.norm_eps < 1) || c.window_size < 1 || c.index_topk < 1 || c.hc_mult < 1) abort();
    if (c.bos_token_id < 0 || c.bos_token_id >= c.vocab_size || c.eos_token_id < 0 || c.eos_token_id >= c.vocab_size)
        abort();
    if (c.recipe != DSV4_RECIPE_NONE && !c.quant_method[0]) abort();
    if (memchr(c.quant_method, 0, sizeof c.quant_method) == NULL) abort();
    return 0;
}
