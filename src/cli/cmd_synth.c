/* cmd_synth.c - `dsv4 synth`: writes a small synthetic DeepSeek-V4 checkpoint (random weights) in the
 * release layout, so the engine can run end to end without downloading a real model. */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli_util.h"
#include "cmds.h"
#include "model/synth.h"

static void usage(FILE *f) {
    dsv4_synth_opts d;
    dsv4_synth_defaults(&d);
    fprintf(f,
            "usage: dsv4 synth -o DIR [--seed N] [size options]\n"
            "\n"
            "  Writes a small DeepSeek-V4 checkpoint with RANDOM weights into DIR: config.json (release\n"
            "  style, marked \"dsv4_synthetic\": true), model.safetensors (FP8 e4m3 + E8M0 block scales,\n"
            "  MXFP4 routed experts, BF16 / F32 small tensors, native names), the tokenizer files and a\n"
            "  README. The output of such a model is meaningless; it exercises the whole engine.\n"
            "\n"
            "  -o, --output DIR     where to write (created if missing)\n"
            "  --seed N             weight seed (default %llu)\n"
            "  --tokenizer DIR      directory holding tokenizer.json (+ tokenizer_config.json) to copy\n"
            "                       (default: tests/fixtures/tokenizer, looked up from the current\n"
            "                       directory and next to the dsv4 binary)\n"
            "  --dim N              hidden size (default %d)\n"
            "  --layers N           layers (default %d; compress ratios 0, 4, R, 4, R, ...)\n"
            "  --hash-layers N      hash-routed MoE layers (default %d)\n"
            "  --heads N            attention heads (default %d)\n"
            "  --head-dim N         attention head dim (default %d)\n"
            "  --experts N          routed experts (default %d)\n"
            "  --active N           experts per token (default %d)\n"
            "  --moe-dim N          expert width (default %d)\n"
            "  --window N           sliding window (default %d)\n"
            "  --ratio R            the larger compress ratio R (default %d)\n"
            "  --index-topk N       indexer top-k (default %d)\n"
            "  --max-pos N          max_position_embeddings (default %d)\n"
            "  --expert-format F    routed experts in mxfp4 (default, DeepSeek's release) or nvfp4 (NVIDIA's\n"
            "                       ModelOpt layout: the lossless cast of the same draw, so the same model)\n",
            (unsigned long long)d.seed, d.dim, d.n_layers, d.n_hash_layers, d.n_heads, d.head_dim,
            d.n_routed_experts, d.n_activated_experts, d.moe_inter_dim, d.window, d.hca_ratio, d.index_topk,
            d.max_position_embeddings);
}

static int is_dir_with_tokenizer(const char *dir) {
    char p[PATH_MAX + 32];
    int n = snprintf(p, sizeof p, "%s/tokenizer.json", dir);
    if (n < 0 || (size_t)n >= sizeof p) return 0;
    struct stat st;
    return stat(p, &st) == 0 && S_ISREG(st.st_mode);
}

/* tests/fixtures/tokenizer under the current directory, else next to the binary (build/dsv4 ->
 * ../tests/fixtures/tokenizer). */
static const char *find_tokenizer(char *buf, size_t cap) {
    if (is_dir_with_tokenizer("tests/fixtures/tokenizer")) return "tests/fixtures/tokenizer";
    char exe[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n <= 0) return NULL;
    exe[n] = 0;
    for (int up = 0; up < 3; up++) {
        char *s = strrchr(exe, '/');
        if (!s) return NULL;
        *s = 0;
        int k = snprintf(buf, cap, "%s/tests/fixtures/tokenizer", exe);
        if (k > 0 && (size_t)k < cap && is_dir_with_tokenizer(buf)) return buf;
    }
    return NULL;
}

int dsv4_cmd_synth(int argc, char **argv) {
    dsv4_synth_opts o;
    dsv4_synth_defaults(&o);
    const char *out = NULL, *tok = NULL;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            return 0;
        }
        if (i + 1 >= argc) {
            fprintf(stderr, "dsv4 synth: option %s needs a value\n", a);
            return 2;
        }
        const char *v = argv[++i];
        long x = 0;
        int *dst = NULL;
        long lo = 1, hi = 1L << 20;
        if (!strcmp(a, "-o") || !strcmp(a, "--output")) {
            out = v;
            continue;
        }
        if (!strcmp(a, "--tokenizer")) {
            tok = v;
            continue;
        }
        if (!strcmp(a, "--expert-format")) {
            if (strcmp(v, "mxfp4") && strcmp(v, "nvfp4")) {
                fprintf(stderr, "dsv4 synth: --expert-format must be mxfp4 or nvfp4 (got '%s')\n", v);
                return 2;
            }
            o.nvfp4 = !strcmp(v, "nvfp4");
            continue;
        }
        if (!strcmp(a, "--seed")) {
            char *end;
            unsigned long long s = strtoull(v, &end, 10);
            if (!*v || *end || *v == '-') {
                fprintf(stderr, "dsv4 synth: --seed: bad value '%s'\n", v);
                return 2;
            }
            o.seed = s;
            continue;
        }
        if (!strcmp(a, "--dim")) dst = &o.dim;
        else if (!strcmp(a, "--layers")) dst = &o.n_layers;
        else if (!strcmp(a, "--hash-layers")) dst = &o.n_hash_layers, lo = 0;
        else if (!strcmp(a, "--heads")) dst = &o.n_heads;
        else if (!strcmp(a, "--head-dim")) dst = &o.head_dim;
        else if (!strcmp(a, "--experts")) dst = &o.n_routed_experts;
        else if (!strcmp(a, "--active")) dst = &o.n_activated_experts;
        else if (!strcmp(a, "--moe-dim")) dst = &o.moe_inter_dim;
        else if (!strcmp(a, "--window")) dst = &o.window;
        else if (!strcmp(a, "--ratio")) dst = &o.hca_ratio;
        else if (!strcmp(a, "--index-topk")) dst = &o.index_topk;
        else if (!strcmp(a, "--max-pos")) dst = &o.max_position_embeddings, hi = 1L << 30;
        else {
            fprintf(stderr, "dsv4 synth: unknown option '%s'\n", a);
            usage(stderr);
            return 2;
        }
        if (dsv4_cli_parse_long(v, lo, hi, &x)) {
            fprintf(stderr, "dsv4 synth: %s: bad value '%s'\n", a, v);
            return 2;
        }
        *dst = (int)x;
    }
    if (!out) {
        fprintf(stderr, "dsv4 synth: -o DIR is required\n");
        usage(stderr);
        return 2;
    }
    char tbuf[PATH_MAX + 64];
    if (!tok) tok = find_tokenizer(tbuf, sizeof tbuf);
    if (!tok) {
        fprintf(stderr, "dsv4 synth: cannot find tests/fixtures/tokenizer/tokenizer.json (run from the source tree "
                        "or pass --tokenizer DIR)\n");
        return 1;
    }
    if (!is_dir_with_tokenizer(tok)) {
        fprintf(stderr, "dsv4 synth: --tokenizer %s: no tokenizer.json there\n", tok);
        return 1;
    }
    o.tokenizer_dir = tok;
    fprintf(stderr,
            "dsv4 synth: NOTE: writing a SYNTHETIC model with RANDOM weights (seed %llu); it has never been trained "
            "and its output is meaningless gibberish.\n",
            (unsigned long long)o.seed);
    double t0 = dsv4_cli_now();
    dsv4_err e = {{0}};
    uint64_t bytes = 0;
    if (dsv4_synth_write(out, &o, &bytes, &e)) {
        fprintf(stderr, "dsv4 synth: %s\n", e.msg);
        return 1;
    }
    fprintf(stderr, "dsv4 synth: wrote %s (model.safetensors %.1f MB, %d layers, dim %d) in %.2f s\n", out,
            bytes / 1e6, o.n_layers, o.dim, dsv4_cli_now() - t0);
    return 0;
}
