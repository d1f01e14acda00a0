/* cmd_inspect.c - `dsv4 inspect`: what a checkpoint holds and how dsv4 reads it. */
#include <stdint.h>
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
    int spread;                                    /* --scale-spread */
    uint64_t hist[DSV4_SPREAD_BINS], blocks;       /* the routed experts' MXFP4 scale spreads (128-column blocks) */
    long spread_mats;
} tally;

static void count(void *ctx, int layer, const dsv4_weight *w) {
    tally *t = ctx;
    t->count[w->fmt]++;
    t->bytes[w->fmt] += dsv4_weight_bytes(w);
    t->qat[w->fmt] += w->act_quant;
    const int routed = strstr(w->name, "experts.") && !strstr(w->name, "shared");
    if (routed) t->expert_bytes += dsv4_weight_bytes(w);
    if (routed && t->spread && w->fmt == DSV4_WF_MXFP4) {
        const uint64_t n = dsv4_weight_scale_spread(w, 128, t->hist);
        t->blocks += n, t->spread_mats += n > 0;
    }
}

/* the spread's quantile q (0..1) in binades; the last bin reads as ">= 15" */
static int spread_quantile(const tally *t, double q) {
    uint64_t acc = 0;
    for (int b = 0; b < DSV4_SPREAD_BINS; b++)
        if ((acc += t->hist[b]) >= q * (double)t->blocks) return b;
    return DSV4_SPREAD_BINS - 1;
}

static void print_spread(const tally *t) {
    if (!t->blocks) {
        printf("scales       no MXFP4 routed-expert weights: no scale spread to report\n");
        return;
    }
    uint64_t exact = 0;
    int mx = 0;
    for (int b = 0; b < DSV4_SPREAD_BINS; b++) {
        if (b <= 14) exact += t->hist[b];
        if (t->hist[b]) mx = b;
    }
    const int q50 = spread_quantile(t, 0.5), q99 = spread_quantile(t, 0.99);
    printf("scales       routed experts' MXFP4: %llu blocks of 128 columns in %ld matrices; the spread of a block's four group\n"
           "             exponents (binades): median %d%s, p99 %d%s, max %d%s; %.4f %% within 14 (exact as e4m3 codes with one\n"
           "             power-of-two scale a block)\n",
           (unsigned long long)t->blocks, t->spread_mats, q50, q50 == DSV4_SPREAD_BINS - 1 ? "+" : "", q99,
           q99 == DSV4_SPREAD_BINS - 1 ? "+" : "", mx, mx == DSV4_SPREAD_BINS - 1 ? "+" : "", 100.0 * (double)exact / (double)t->blocks);
    printf("             histogram:");
    for (int b = 0; b < DSV4_SPREAD_BINS; b++) printf(" %d%s:%llu", b, b == DSV4_SPREAD_BINS - 1 ? "+" : "", (unsigned long long)t->hist[b]);
    printf("\n");
}

static void usage(FILE *f) {
    fprintf(f, "usage: dsv4 inspect -m MODEL_DIR [--scale-spread]\n\n"
               "  Loads the checkpoint (config.json + safetensors), checks every tensor against the config\n"
               "  and prints the configuration, weight formats with their sizes, and anything unusual.\n\n"
               "  --scale-spread  also read every routed expert's MXFP4 scales and report how far apart the four\n"
               "                  group exponents of each 128-column block lie (whether an FP8 GEMM with one scale\n"
               "                  per block could read the weights exactly); reads ~1/16 of the experts' bytes\n");
}

int dsv4_cmd_inspect(int argc, char **argv) {
    const char *dir = NULL;
    int spread = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            usage(stdout);
            return 0;
        } else if ((!strcmp(argv[i], "-m") || !strcmp(argv[i], "--model")) && i + 1 < argc) dir = argv[++i];
        else if (!strcmp(argv[i], "--scale-spread")) spread = 1;
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
    t.spread = spread;
    dsv4_model_foreach_weight(m, count, &t);
    printf("weights      format   matrices        GB   act-quant\n");
    for (int f = 0; f < DSV4_WF_COUNT; f++)
        if (t.count[f])
            printf("             %-7s %9ld %9.3f %11ld\n", dsv4_wfmt_name((dsv4_wfmt)f), t.count[f], t.bytes[f] / 1e9, t.qat[f]);
    printf("experts      %.3f GB routed expert weights\n", t.expert_bytes / 1e9);
    if (spread) print_spread(&t);
    if (m->n_mtp_skipped) printf("note         %d mtp.* tensors (multi-token prediction) present, not used yet\n", m->n_mtp_skipped);
    if (m->n_unused) printf("note         %d tensors not used by the model\n", m->n_unused);
    if (c->n_compress_ratios > c->n_layers)
        printf("note         compress_ratios has %d extra entr%s for the MTP block\n", c->n_compress_ratios - c->n_layers,
               c->n_compress_ratios - c->n_layers == 1 ? "y" : "ies");
    dsv4_free(m);
    return 0;
}
