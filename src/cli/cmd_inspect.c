/* cmd_inspect.c - `dsv4 inspect`: what a checkpoint holds and how dsv4 reads it. */
#include <stdio.h>
#include <string.h>

#include "cli_util.h"
#include "cmds.h"
#include "dsv4.h"
#include "model/model.h"

typedef struct {
    long count[DSV4_WF_COUNT], qat[DSV4_WF_COUNT];
    unsigned long long bytes[DSV4_WF_COUNT];
    unsigned long long expert_bytes;
} tally;

static void count(void *ctx, int layer, const dsv4_weight *w) {
    tally *t = ctx;
    t->count[w->fmt]++;
    t->bytes[w->fmt] += dsv4_weight_bytes(w);
    t->qat[w->fmt] += w->act_quant;
    if (strstr(w->name, "experts.") && !strstr(w->name, "shared")) t->expert_bytes += dsv4_weight_bytes(w);
}

static void usage(FILE *f) {
    fprintf(f, "usage: dsv4 inspect -m MODEL_DIR\n\n"
               "  Loads the checkpoint (config.json + safetensors), checks every tensor against the config\n"
               "  and prints the configuration, weight formats with their sizes, and anything unusual.\n");
}

int dsv4_cmd_inspect(int argc, char **argv) {
    const char *dir = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            usage(stdout);
            return 0;
        } else if ((!strcmp(argv[i], "-m") || !strcmp(argv[i], "--model")) && i + 1 < argc) dir = argv[++i];
        else {
            fprintf(stderr, "dsv4 inspect: unknown option '%s'\n", argv[i]);
            usage(stderr);
            return 2;
        }
    }
    if (!dir) {
        usage(stderr);
        return 2;
    }
    char err[1024];
    dsv4_model *m;
    double t0 = dsv4_cli_now();
    if (dsv4_load(dir, &m, err, sizeof err)) {
        fprintf(stderr, "dsv4 inspect: %s\n", err);
        return 1;
    }
    const dsv4_config *c = &m->cfg;
    printf("model        %s (loaded and checked in %.2f s)\n", dir, dsv4_cli_now() - t0);
    printf("files        %d safetensors file(s), %zu tensors, %.2f GB\n", dsv4_st_file_count(m->st), dsv4_st_count(m->st),
           dsv4_st_total_bytes(m->st) / 1e9);
    printf("shape        dim %d, %d layers, vocab %d, %d heads x %d (rope %d), q_lora %d, o_groups %d x %d\n", c->dim,
           c->n_layers, c->vocab_size, c->n_heads, c->head_dim, c->rope_head_dim, c->q_lora_rank, c->o_groups, c->o_lora_rank);
    printf("moe          %d routed experts (top %d, inter %d, route scale %g), %d shared, %d hash layers, swiglu limit %g\n",
           c->n_routed_experts, c->n_activated_experts, c->moe_inter_dim, c->route_scale, c->n_shared_experts,
           c->n_hash_layers, c->swiglu_limit);
    printf("attention    window %d, indexer %d heads x %d top-%d, mHC x%d (%d Sinkhorn iters)\n", c->window_size,
           c->index_n_heads, c->index_head_dim, c->index_topk, c->hc_mult, c->hc_sinkhorn_iters);
    printf("rope         theta %g; compressed layers theta %g", c->rope_theta, c->compress_rope_theta);
    if (c->original_seq_len > 0)
        printf(" + YaRN (factor %g, original %d, beta %g/%g)", c->rope_factor, c->original_seq_len, c->beta_fast, c->beta_slow);
    printf("; max positions %d\n", c->max_position_embeddings);
    int nswa = 0, ncsa = 0, nhca = 0;
    printf("layers       ");
    for (int L = 0; L < c->n_layers; L++) {
        int r = c->compress_ratios[L];
        nswa += r == 0, ncsa += r == 4, nhca += r > 4;
        printf("%s%s", r == 0 ? "S" : r == 4 ? "C" : "H", L + 1 < c->n_layers ? "" : "");
    }
    printf("  (S sliding %d, C CSA %d, H HCA %d)\n", nswa, ncsa, nhca);
    printf("recipe       %s%s\n",
           c->recipe == DSV4_RECIPE_FP8 ? "DeepSeek FP8: activations quantized to FP8 (block 128) before FP8/FP4 GEMMs"
           : c->recipe == DSV4_RECIPE_MODELOPT ? "ModelOpt: weight-only (W4A16), no activation quantization"
                                               : "none: weights used as stored, no activation quantization",
           c->expert_fp4 ? "; expert_dtype fp4" : "");
    tally t;
    memset(&t, 0, sizeof t);
    dsv4_model_foreach_weight(m, count, &t);
    printf("weights      format   matrices        GB   act-quant\n");
    for (int f = 0; f < DSV4_WF_COUNT; f++)
        if (t.count[f])
            printf("             %-7s %9ld %9.3f %11ld\n", dsv4_wfmt_name((dsv4_wfmt)f), t.count[f], t.bytes[f] / 1e9, t.qat[f]);
    printf("experts      %.3f GB routed expert weights\n", t.expert_bytes / 1e9);
    if (m->n_mtp_skipped) printf("note         %d mtp.* tensors (multi-token prediction) present, not used yet\n", m->n_mtp_skipped);
    if (m->n_unused) printf("note         %d tensors not used by the model\n", m->n_unused);
    if (c->n_compress_ratios > c->n_layers)
        printf("note         compress_ratios has %d extra entr%s for the MTP block\n", c->n_compress_ratios - c->n_layers,
               c->n_compress_ratios - c->n_layers == 1 ? "y" : "ies");
    dsv4_free(m);
    return 0;
}
