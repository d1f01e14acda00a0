/* model_util.h - test helpers: load fixture expectations, run token schedules through the engine. */
#ifndef DSV4_TESTS_MODEL_UTIL_H
#define DSV4_TESTS_MODEL_UTIL_H

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "dsv4.h"
#include "io/safetensors.h"

typedef struct {
    char id[8];
    int prefill;
} scenario;

/* Scenarios of a fixture's manifest.json (both manifest styles). Returns the count. */
static inline int load_scenarios(const char *fx, scenario *out, int cap) {
    char path[512];
    snprintf(path, sizeof path, "%s/%s/manifest.json", dsv4_test_fixtures(), fx);
    FILE *f = fopen(path, "rb");
    if (!f) return -1;
    static char buf[1 << 16];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    cJSON *j = cJSON_Parse(buf);
    int k = 0;
    cJSON *sc = cJSON_GetObjectItem(j, "scenarios"), *e;
    if (sc) {
        cJSON_ArrayForEach(e, sc) if (k < cap) {
            snprintf(out[k].id, sizeof out[k].id, "%s", cJSON_GetObjectItem(e, "id")->valuestring);
            out[k++].prefill = cJSON_GetObjectItem(e, "prefill")->valueint;
        }
    } else {
        cJSON_ArrayForEach(e, cJSON_GetObjectItem(j, "prefill")) if (k < cap) {
            snprintf(out[k].id, sizeof out[k].id, "%s", e->string);
            out[k++].prefill = e->valueint;
        }
    }
    cJSON_Delete(j);
    return k;
}

static inline dsv4_model *load_fixture(const char *fx) {
    char path[512], err[1024];
    snprintf(path, sizeof path, "%s/%s", dsv4_test_fixtures(), fx);
    dsv4_model *m = NULL;
    if (dsv4_load(path, &m, err, sizeof err)) {
        fprintf(stderr, "load %s: %s\n", path, err);
        return NULL;
    }
    return m;
}

/* Runs B sequences of L tokens (tok [B, L]) as one batch: positions < prefill in chunks of `chunk`,
 * then one at a time. Writes logits [B, L, V]. Returns 0 on success. */
static inline int run_schedule(dsv4_model *m, const int32_t *tok, int B, int L, int prefill, int chunk, float *out) {
    int V = dsv4_model_info(m).vocab_size, rc = 0;
    if (chunk <= 0) chunk = prefill > 0 ? prefill : 1;
    dsv4_seq **s = calloc((size_t)B, sizeof *s);
    const int32_t **tp = calloc((size_t)B, sizeof *tp);
    int *nt = calloc((size_t)B, sizeof *nt);
    float *lg = malloc(sizeof(float) * (size_t)B * chunk * V);
    char err[1024];
    for (int b = 0; b < B; b++) {
        s[b] = dsv4_seq_new(m);
        dsv4_seq_set_prefill(s[b], prefill);
    }
    for (int p = 0; p < L && !rc;) {
        int n = p < prefill ? (prefill - p < chunk ? prefill - p : chunk) : 1;
        for (int b = 0; b < B; b++) tp[b] = tok + (size_t)b * L + p, nt[b] = n;
        rc = dsv4_forward(m, B, s, tp, nt, lg, DSV4_LOGITS_ALL, err, sizeof err);
        if (rc) fprintf(stderr, "forward: %s\n", err);
        for (int b = 0; b < B && !rc; b++)
            memcpy(out + ((size_t)b * L + p) * V, lg + (size_t)b * n * V, sizeof(float) * (size_t)n * V);
        p += n;
    }
    for (int b = 0; b < B; b++) dsv4_seq_free(s[b]);
    free(s), free(tp), free(nt), free(lg);
    return rc;
}

static inline double top1_agree(const float *got, const float *ref, size_t rows, int V) {
    size_t same = 0;
    for (size_t r = 0; r < rows; r++) {
        int a = 0, b = 0;
        for (int v = 1; v < V; v++) {
            if (got[r * V + v] > got[r * V + a]) a = v;
            if (ref[r * V + v] > ref[r * V + b]) b = v;
        }
        same += a == b;
    }
    return rows ? (double)same / rows : 1;
}

#endif
