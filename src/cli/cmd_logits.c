/* cmd_logits.c - `dsv4 logits`: token ids in, every position's next-token logits out. */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli_util.h"
#include "cmds.h"
#include "dsv4.h"
#include "io/safetensors.h"

static void usage(FILE *f) {
    fprintf(f,
            "usage: dsv4 logits -m MODEL_DIR --tokens TOKENS.json [--prefill P] [--chunk C] -o OUT.safetensors\n"
            "\n"
            "  TOKENS.json is a list of equal-length lists of token ids, one list per sequence.\n"
            "  Positions below P (default: all) go in as prefill, in chunks of C tokens when given;\n"
            "  every later position goes in one token at a time. All sequences run as one batch.\n"
            "  Writes one F32 tensor `logits` [sequences, length, vocab]: row t is the next-token\n"
            "  logits after token t.\n"
            "\n"
#ifdef DSV4_CUDA
            "  --device cpu|cuda  backend (cuda: the whole forward on GPU 0)\n"
#else
            "  --device cpu       backend (only cpu in this build; cuda needs make CUDA=1)\n"
#endif
            "  --threads N        CPU threads (default: all cores)\n");
}

/* Reads TOKENS.json into a [B][L] array. */
static int read_tokens(const char *path, int32_t **out, int *B, int *L) {
    size_t len;
    char *txt = dsv4_cli_read_file(path, &len);
    if (!txt) return -1;
    cJSON *j = cJSON_ParseWithLength(txt, len);
    free(txt);
    int rc = -1;
    if (!j || !cJSON_IsArray(j) || cJSON_GetArraySize(j) == 0) {
        fprintf(stderr, "dsv4 logits: %s: expected a non-empty JSON list of lists of token ids\n", path);
        goto done;
    }
    *B = cJSON_GetArraySize(j);
    *L = -1;
    int b = 0;
    cJSON *row;
    cJSON_ArrayForEach(row, j) {
        if (!cJSON_IsArray(row)) {
            fprintf(stderr, "dsv4 logits: %s: sequence %d is not a list\n", path, b);
            goto done;
        }
        int n = cJSON_GetArraySize(row);
        if (*L < 0) {
            *L = n;
            if (n == 0) {
                fprintf(stderr, "dsv4 logits: %s: sequences are empty\n", path);
                goto done;
            }
            *out = malloc(sizeof(int32_t) * (size_t)*B * n);
        } else if (n != *L) {
            fprintf(stderr, "dsv4 logits: %s: sequence %d has %d tokens, sequence 0 has %d (all must be equal)\n", path, b, n, *L);
            goto done;
        }
        int i = 0;
        cJSON *v;
        cJSON_ArrayForEach(v, row) {
            double d = cJSON_IsNumber(v) ? v->valuedouble : -1.5;
            if (!cJSON_IsNumber(v) || d != (double)(int32_t)d) {
                fprintf(stderr, "dsv4 logits: %s: sequence %d, position %d: not an integer token id\n", path, b, i);
                goto done;
            }
            (*out)[(size_t)b * *L + i++] = (int32_t)d;
        }
        b++;
    }
    rc = 0;
done:
    if (rc) {
        free(*out);
        *out = NULL;
    }
    cJSON_Delete(j);
    return rc;
}

int dsv4_cmd_logits(int argc, char **argv) {
    const char *model = NULL, *tokpath = NULL, *outpath = NULL, *device = "cpu";
    long prefill = -1, chunk = 0, threads = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            return 0;
        }
        if (i + 1 >= argc) {
            fprintf(stderr, "dsv4 logits: option %s needs a value\n", a);
            return 2;
        }
        const char *v = argv[++i];
        if (!strcmp(a, "-m") || !strcmp(a, "--model")) model = v;
        else if (!strcmp(a, "--tokens")) tokpath = v;
        else if (!strcmp(a, "-o") || !strcmp(a, "--output")) outpath = v;
        else if (!strcmp(a, "--device")) device = v;
        else if (!strcmp(a, "--prefill")) { if (dsv4_cli_parse_long(v, 0, 1L << 30, &prefill)) { fprintf(stderr, "dsv4 logits: --prefill: bad value '%s'\n", v); return 2; } }
        else if (!strcmp(a, "--chunk")) { if (dsv4_cli_parse_long(v, 1, 1L << 30, &chunk)) { fprintf(stderr, "dsv4 logits: --chunk: bad value '%s'\n", v); return 2; } }
        else if (!strcmp(a, "--threads")) { if (dsv4_cli_parse_long(v, 1, 4096, &threads)) { fprintf(stderr, "dsv4 logits: --threads: bad value '%s'\n", v); return 2; } }
        else {
            fprintf(stderr, "dsv4 logits: unknown option '%s'\n", a);
            usage(stderr);
            return 2;
        }
    }
    if (!model || !tokpath || !outpath) {
        fprintf(stderr, "dsv4 logits: -m, --tokens and -o are required\n");
        usage(stderr);
        return 2;
    }
    int use_cuda = 0;
#ifdef DSV4_CUDA
    use_cuda = !strcmp(device, "cuda");
#endif
    if (strcmp(device, "cpu") && !use_cuda) {
#ifdef DSV4_CUDA
        fprintf(stderr, "dsv4 logits: --device %s: unknown backend (cpu or cuda)\n", device);
#else
        fprintf(stderr, "dsv4 logits: --device %s: this build has only the cpu backend (build with make CUDA=1 for cuda)\n", device);
#endif
        return 2;
    }
    dsv4_cli_set_threads((int)threads);
    int32_t *tok = NULL;
    int B, L;
    if (read_tokens(tokpath, &tok, &B, &L)) return 1;
    if (prefill < 0 || prefill > L) prefill = L;
    if (chunk <= 0) chunk = prefill > 0 ? prefill : 1;

    char err[1024];
    dsv4_model *m = NULL;
    double t0 = dsv4_cli_now();
    if (dsv4_load(model, &m, err, sizeof err)) {
        fprintf(stderr, "dsv4 logits: %s\n", err);
        free(tok);
        return 1;
    }
    dsv4_info info = dsv4_model_info(m);
    fprintf(stderr, "dsv4 logits: loaded %s in %.2f s (%d layers, vocab %d)\n", model, dsv4_cli_now() - t0, info.n_layers, info.vocab_size);
    if (info.n_mtp_tensors)
        fprintf(stderr, "dsv4 logits: note: skipping %d mtp.* tensors (multi-token prediction is not used yet)\n", info.n_mtp_tensors);
    int V = info.vocab_size, rc = 1;
    if (use_cuda && dsv4_set_device(m, "cuda", err, sizeof err)) {
        fprintf(stderr, "dsv4 logits: --device cuda: %s\n", err);
        dsv4_free(m);
        free(tok);
        return 1;
    }
    float *out = calloc((size_t)B * L * V, sizeof(float));
    float *lg = malloc(sizeof(float) * (size_t)B * (chunk > 1 ? chunk : 1) * V);
    dsv4_seq **seqs = calloc((size_t)B, sizeof *seqs);
    const int32_t **tp = calloc((size_t)B, sizeof *tp);
    int *nt = calloc((size_t)B, sizeof *nt);
    if (!out || !lg || !seqs || !tp || !nt) {
        fprintf(stderr, "dsv4 logits: out of memory\n");
        goto done;
    }
    for (int b = 0; b < B; b++)
        if (!(seqs[b] = dsv4_seq_new(m))) {
            fprintf(stderr, "dsv4 logits: out of memory\n");
            goto done;
        } else
            dsv4_seq_set_prefill(seqs[b], (int)prefill); /* chunks resolve indexer ties like one-shot */
    t0 = dsv4_cli_now();
    for (int p = 0; p < L;) {
        int n = p < prefill ? (int)(prefill - p < chunk ? prefill - p : chunk) : 1;
        for (int b = 0; b < B; b++) {
            tp[b] = tok + (size_t)b * L + p;
            nt[b] = n;
        }
        if (dsv4_forward(m, B, seqs, tp, nt, lg, DSV4_LOGITS_ALL, err, sizeof err)) {
            fprintf(stderr, "dsv4 logits: %s: %s\n", tokpath, err);
            goto done;
        }
        for (int b = 0; b < B; b++)
            memcpy(out + ((size_t)b * L + p) * V, lg + (size_t)b * n * V, sizeof(float) * (size_t)n * V);
        p += n;
    }
    double dt = dsv4_cli_now() - t0;
    fprintf(stderr, "dsv4 logits: %d x %d tokens in %.2f s (%.1f tokens/s) on %s\n", B, L, dt, B * L / (dt > 0 ? dt : 1e-9),
            use_cuda ? "cuda" : "cpu");
    dsv4_st_tensor t = {.name = "logits", .dtype = DSV4_DT_F32, .ndim = 3, .shape = {B, L, V},
                        .numel = (int64_t)B * L * V, .data = (const uint8_t *)out,
                        .nbytes = sizeof(float) * (uint64_t)B * L * V};
    dsv4_err e = {{0}};
    if (dsv4_st_write(outpath, &t, 1, &e)) {
        fprintf(stderr, "dsv4 logits: %s\n", e.msg);
        goto done;
    }
    rc = 0;
done:
    if (seqs)
        for (int b = 0; b < B; b++) dsv4_seq_free(seqs[b]);
    free(seqs), free(tp), free(nt), free(out), free(lg), free(tok);
    dsv4_free(m);
    return rc;
}
