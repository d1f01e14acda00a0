/* test_cli_run.c - `dsv4 synth` + `dsv4 run` end to end: a synthetic checkpoint loads and runs, greedy
 * decoding is deterministic, seeded sampling is reproducible, a bad model directory fails cleanly; `dsv4 inspect
 * --scale-spread` and `dsv4 bench` on the CPU (its JSON report). */
#include <cjson/cJSON.h>
#include <criterion/criterion.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check.h"
#include "dsv4.h"
#include "engine/sample.h"
#include "io/config.h"
#include "io/safetensors.h"
#include "model/synth.h"


/* A small synthetic model in a fresh temp dir; with_tok: the real vocabulary + tokenizer files; nvfp4: its routed experts
 * in NVFP4 (the lossless cast of the same draw). */
static char *synth_tmp_fmt(int with_tok, uint64_t seed, int nvfp4) {
    char *dir = strdup("/tmp/dsv4-test-run-XXXXXX");
    cr_assert(mkdtemp(dir));
    dsv4_synth_opts o;
    dsv4_synth_defaults(&o);
    o.seed = seed;
    o.dim = 64;
    o.n_layers = 4; /* ratios 0, 4, R, 4 */
    o.hca_ratio = 8;
    o.window = 8;    /* small window: the compressed paths matter within a few tokens */
    o.index_topk = 2;
    o.max_position_embeddings = 256;
    o.nvfp4 = nvfp4;
    char tok[PATH_MAX];
    if (with_tok) {
        snprintf(tok, sizeof tok, "%s/tokenizer", dsv4_test_fixtures());
        o.tokenizer_dir = tok;
    } else {
        o.vocab_size = 512;
    }
    dsv4_err e = {{0}};
    int rc = dsv4_synth_write(dir, &o, NULL, &e);
    cr_assert_eq(rc, 0, "synth: %s", e.msg);
    return dir;
}
static char *synth_tmp(int with_tok, uint64_t seed) { return synth_tmp_fmt(with_tok, seed, 0); }

/* Greedy decoding through the public API: n tokens after a fixed prompt. */
static void greedy(dsv4_model *m, int n, int32_t *out) {
    dsv4_info info = dsv4_model_info(m);
    int V = info.vocab_size;
    float *lg = malloc(sizeof(float) * (size_t)V);
    dsv4_seq *s = dsv4_seq_new(m);
    cr_assert(lg && s);
    int32_t prompt[12];
    for (int i = 0; i < 12; i++) prompt[i] = (int32_t)((i * 37 + 5) % V);
    const int32_t *tp[1] = {prompt};
    int nt[1] = {12};
    char err[1024];
    cr_assert_eq(dsv4_forward(m, 1, &s, tp, nt, lg, DSV4_LOGITS_LAST, err, sizeof err), 0, "%s", err);
    for (int k = 0; k < n; k++) {
        int best = 0;
        for (int i = 0; i < V; i++) {
            cr_assert(isfinite(lg[i]), "logit %d is not finite at step %d", i, k);
            if (lg[i] > lg[best]) best = i;
        }
        out[k] = best;
        tp[0] = &out[k];
        nt[0] = 1;
        cr_assert_eq(dsv4_forward(m, 1, &s, tp, nt, lg, DSV4_LOGITS_LAST, err, sizeof err), 0, "%s", err);
    }
    dsv4_seq_free(s);
    free(lg);
}

Test(cli_run, synth_loads_and_greedy_is_deterministic, .timeout = 120) {
    char *dir = synth_tmp(0, 11);
    char err[1024];
    dsv4_model *m = NULL;
    cr_assert_eq(dsv4_load(dir, &m, err, sizeof err), 0, "dsv4_load: %s", err);
    dsv4_info info = dsv4_model_info(m);
    cr_expect_eq(info.vocab_size, 512);
    cr_expect_eq(info.n_layers, 4);
    cr_expect_eq(info.dim, 64);
    int32_t a[8], b[8];
    greedy(m, 8, a);
    greedy(m, 8, b);
    for (int i = 0; i < 8; i++) cr_expect_eq(a[i], b[i], "greedy token %d differs: %d vs %d", i, a[i], b[i]);
    dsv4_free(m);

    /* the release layout: formats as the release has them, and the synthetic marker in config.json */
    dsv4_st *st = NULL;
    dsv4_err e = {{0}};
    cr_assert_eq(dsv4_st_open_dir(dir, &st, &e), 0, "%s", e.msg);
    const struct {
        const char *name;
        dsv4_dtype dt;
    } want[] = {
        {"embed.weight", DSV4_DT_BF16},
        {"head.weight", DSV4_DT_BF16},
        {"norm.weight", DSV4_DT_F32},
        {"layers.0.attn.wq_a.weight", DSV4_DT_F8_E4M3},
        {"layers.0.attn.wq_a.scale", DSV4_DT_F8_E8M0},
        {"layers.0.attn.wo_a.weight", DSV4_DT_F8_E4M3}, /* FP8 in the release; the official converter makes it bf16 */
        {"layers.0.attn.wo_a.scale", DSV4_DT_F8_E8M0},
        {"layers.0.ffn.gate.tid2eid", DSV4_DT_I64},
        {"layers.1.ffn.gate.bias", DSV4_DT_F32},
        {"layers.1.attn.indexer.weights_proj.weight", DSV4_DT_BF16},
        {"layers.1.attn.compressor.wkv.weight", DSV4_DT_BF16},
        {"layers.2.attn.compressor.ape", DSV4_DT_F32},
        {"layers.2.ffn.experts.3.w2.weight", DSV4_DT_I8},
        {"layers.2.ffn.experts.3.w2.scale", DSV4_DT_F8_E8M0},
        {"layers.3.ffn.shared_experts.w1.weight", DSV4_DT_F8_E4M3},
    };
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        const dsv4_st_tensor *t = dsv4_st_find(st, want[i].name);
        cr_assert(t, "missing %s", want[i].name);
        cr_expect_eq(t->dtype, want[i].dt, "%s: dtype %s", want[i].name, dsv4_dtype_name(t->dtype));
    }
    /* hash routing: distinct experts per token */
    const dsv4_st_tensor *t = dsv4_st_find(st, "layers.0.ffn.gate.tid2eid");
    const int64_t *ids = (const int64_t *)t->data;
    for (int64_t v = 0; v < t->shape[0]; v++)
        for (int i = 0; i < t->shape[1]; i++)
            for (int j = 0; j < i; j++) cr_assert_neq(ids[v * t->shape[1] + i], ids[v * t->shape[1] + j]);
    dsv4_st_close(st);
    dsv4_config c;
    cr_assert_eq(dsv4_config_load(dir, &c, &e), 0, "%s", e.msg);
    cr_expect_eq(c.compress_ratios[0], 0);
    cr_expect_eq(c.compress_ratios[1], 4);
    cr_expect_eq(c.compress_ratios[2], 8);
    cr_expect_eq(c.recipe, DSV4_RECIPE_FP8);
    cr_expect(c.expert_fp4);
    char p[PATH_MAX + 32];
    snprintf(p, sizeof p, "%s/config.json", dir);
    FILE *f = fopen(p, "rb");
    cr_assert(f);
    char buf[8192];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    buf[n] = 0;
    fclose(f);
    cr_expect(strstr(buf, "\"dsv4_synthetic\": true"));
    dsv4_test_rm_tree(dir);
    free(dir);
}

Test(cli_run, synth_is_deterministic_per_seed, .timeout = 120) {
    char *d1 = synth_tmp(0, 5), *d2 = synth_tmp(0, 5), *d3 = synth_tmp(0, 6);
    char p1[PATH_MAX + 32], p2[PATH_MAX + 32], p3[PATH_MAX + 32];
    snprintf(p1, sizeof p1, "%s/model.safetensors", d1);
    snprintf(p2, sizeof p2, "%s/model.safetensors", d2);
    snprintf(p3, sizeof p3, "%s/model.safetensors", d3);
    FILE *f1 = fopen(p1, "rb"), *f2 = fopen(p2, "rb"), *f3 = fopen(p3, "rb");
    cr_assert(f1 && f2 && f3);
    int same12 = 1, same13 = 1, c1, c2, c3;
    do {
        c1 = fgetc(f1), c2 = fgetc(f2), c3 = fgetc(f3);
        if (c1 != c2) same12 = 0;
        if (c1 != c3) same13 = 0;
    } while (c1 != EOF || c2 != EOF);
    fclose(f1), fclose(f2), fclose(f3);
    cr_expect(same12, "the same seed must write the same file");
    cr_expect(!same13, "different seeds must write different weights");
    dsv4_test_rm_tree(d1), dsv4_test_rm_tree(d2), dsv4_test_rm_tree(d3);
    free(d1), free(d2), free(d3);
}

/* `dsv4 synth --expert-format nvfp4` writes NVIDIA's layout (F8_E4M3 weight_scale per 16, F32 weight_scale_2), the
 * lossless cast of the MXFP4 draw: the same model, so the same logits (the NVFP4 dequantization's products are exact
 * powers of two times the codes, as MXFP4's) at every position of a prefill and the decode steps after it. */
Test(cli_run, synth_nvfp4_is_the_mxfp4_model, .timeout = 120) {
    char *dm = synth_tmp_fmt(0, 21, 0), *dn = synth_tmp_fmt(0, 21, 1);
    dsv4_st *st = NULL;
    dsv4_err e = {{0}};
    cr_assert_eq(dsv4_st_open_dir(dn, &st, &e), 0, "%s", e.msg);
    const dsv4_st_tensor *ws = dsv4_st_find(st, "layers.1.ffn.experts.0.w1.weight_scale"),
                         *w2 = dsv4_st_find(st, "layers.1.ffn.experts.0.w1.weight_scale_2");
    cr_assert(ws && w2, "the NVFP4 experts' scales are missing");
    cr_expect_eq(ws->dtype, DSV4_DT_F8_E4M3);
    cr_expect_eq(w2->dtype, DSV4_DT_F32);
    cr_expect_null(dsv4_st_find(st, "layers.1.ffn.experts.0.w1.scale"));
    dsv4_st_close(st);
    dsv4_model *mm = NULL, *mn = NULL;
    char err[1024];
    cr_assert_eq(dsv4_load(dm, &mm, err, sizeof err), 0, "dsv4_load: %s", err);
    cr_assert_eq(dsv4_load(dn, &mn, err, sizeof err), 0, "dsv4_load: %s", err);
    const int V = dsv4_model_info(mm).vocab_size;
    float *la = malloc(sizeof(float) * (size_t)V * 20), *lb = malloc(sizeof(float) * (size_t)V * 20);
    dsv4_seq *sa = dsv4_seq_new(mm), *sb = dsv4_seq_new(mn);
    cr_assert(la && lb && sa && sb);
    int32_t toks[20];
    for (int i = 0; i < 20; i++) toks[i] = (int32_t)((i * 53 + 7) % V);
    const int32_t *ta[1] = {toks}, *tb[1] = {toks};
    int nt[1] = {16};
    cr_assert_eq(dsv4_forward(mm, 1, &sa, ta, nt, la, DSV4_LOGITS_ALL, err, sizeof err), 0, "%s", err);
    cr_assert_eq(dsv4_forward(mn, 1, &sb, tb, nt, lb, DSV4_LOGITS_ALL, err, sizeof err), 0, "%s", err);
    for (int k = 16; k < 20; k++) { /* decode steps */
        ta[0] = tb[0] = &toks[k], nt[0] = 1;
        cr_assert_eq(dsv4_forward(mm, 1, &sa, ta, nt, la + (size_t)V * k, DSV4_LOGITS_LAST, err, sizeof err), 0, "%s", err);
        cr_assert_eq(dsv4_forward(mn, 1, &sb, tb, nt, lb + (size_t)V * k, DSV4_LOGITS_LAST, err, sizeof err), 0, "%s", err);
    }
    double md = 0, mx = 0;
    for (size_t i = 0; i < (size_t)V * 20; i++) md = fmax(md, fabs((double)la[i] - lb[i])), mx = fmax(mx, fabs((double)la[i]));
    cr_expect(md <= 1e-6 * mx, "NVFP4 logits differ from MXFP4's by %g (largest logit %g)", md, mx);
    dsv4_seq_free(sa), dsv4_seq_free(sb);
    dsv4_free(mm), dsv4_free(mn);
    free(la), free(lb);
    dsv4_test_rm_tree(dm), dsv4_test_rm_tree(dn);
    free(dm), free(dn);
}

/* The dsv4 binary next to the test binary's directory: BUILD/tests/test_x -> BUILD/dsv4. */
static const char *dsv4_bin(void) {
    static char path[PATH_MAX];
    char exe[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    cr_assert(n > 0);
    exe[n] = 0;
    char *s = strrchr(exe, '/');
    cr_assert(s);
    *s = 0;
    s = strrchr(exe, '/');
    cr_assert(s);
    *s = 0;
    snprintf(path, sizeof path, "%.*s/dsv4", (int)(sizeof path - 8), exe);
    cr_assert_eq(access(path, X_OK), 0, "%s is missing (make builds it with the tests)", path);
    return path;
}

/* Runs a shell command, returns its exit status and (if out) stdout, malloc'd. */
static int run_cmd(const char *cmd, char **out) {
    FILE *p = popen(cmd, "r");
    cr_assert(p, "popen %s", cmd);
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap);
    size_t r;
    while ((r = fread(buf + n, 1, cap - n - 1, p)) > 0) {
        n += r;
        if (cap - n - 1 == 0) buf = realloc(buf, cap *= 2);
    }
    buf[n] = 0;
    int st = pclose(p);
    if (out) *out = buf;
    else free(buf);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

Test(cli_run, run_is_reproducible_and_bad_dir_fails, .timeout = 300) {
    const char *bin = dsv4_bin();
    char *dir = synth_tmp(1, 3);
    char cmd[3 * PATH_MAX];
    char *g1, *g2, *s1, *s2, *s3, *c1;
    const char *env = "OMP_WAIT_POLICY=passive OMP_NUM_THREADS=1";
    snprintf(cmd, sizeof cmd, "%s '%s' run -m '%s' -p 'Hello there' --max-tokens 5 --temperature 0 -q 2>/dev/null", env, bin, dir);
    cr_assert_eq(run_cmd(cmd, &g1), 0, "%s", cmd);
    cr_assert_eq(run_cmd(cmd, &g2), 0);
    cr_expect(strlen(g1) > 0, "no output");
    cr_expect_str_eq(g1, g2, "greedy runs differ");

    snprintf(cmd, sizeof cmd, "%s '%s' run -m '%s' -p 'Hello there' --max-tokens 5 --seed 42 --top-k 50 -q 2>/dev/null", env, bin, dir);
    cr_assert_eq(run_cmd(cmd, &s1), 0, "%s", cmd);
    cr_assert_eq(run_cmd(cmd, &s2), 0);
    cr_expect_str_eq(s1, s2, "seeded sampling differs between runs");
    snprintf(cmd, sizeof cmd, "%s '%s' run -m '%s' -p 'Hello there' --max-tokens 5 --seed 43 --top-k 50 -q 2>/dev/null", env, bin, dir);
    cr_assert_eq(run_cmd(cmd, &s3), 0, "%s", cmd);
    cr_expect_str_neq(s1, s3, "seeds 42 and 43 gave the same sample (very unlikely)");

    /* chat mode + the synthetic notice on stderr */
    snprintf(cmd, sizeof cmd, "%s '%s' run -m '%s' -p 'Hi' --chat --max-tokens 3 --seed 1 2>&1 >/dev/null", env, bin, dir);
    cr_assert_eq(run_cmd(cmd, &c1), 0, "%s", cmd);
    cr_expect(strstr(c1, "synthetic") && strstr(c1, "meaningless"), "no synthetic-weights notice: %s", c1);
    cr_expect(strstr(c1, "time to first token"), "no timing line: %s", c1);

    /* chat reads stdin to EOF and exits */
    snprintf(cmd, sizeof cmd, "printf 'one\\ntwo\\n' | %s '%s' chat -m '%s' --max-tokens 2 --seed 1 -q >/dev/null 2>&1", env, bin, dir);
    cr_expect_eq(run_cmd(cmd, NULL), 0, "%s", cmd);

    /* a bad model directory: a clean error, exit status 1 */
    char *b1;
    snprintf(cmd, sizeof cmd, "'%s' run -m '%s/no-such-model' -p hi 2>&1", bin, dir);
    cr_expect_eq(run_cmd(cmd, &b1), 1, "%s", cmd);
    cr_expect(strstr(b1, "no-such-model"), "the error should name the directory: %s", b1);
    free(b1);
    /* a directory with a model but no tokenizer */
    snprintf(cmd, sizeof cmd, "rm '%s/tokenizer.json' && '%s' run -m '%s' -p hi 2>&1", dir, bin, dir);
    cr_expect_eq(run_cmd(cmd, &b1), 1, "%s", cmd);
    cr_expect(strstr(b1, "tokenizer"), "the error should name the tokenizer: %s", b1);
    free(b1);
    snprintf(cmd, sizeof cmd, "'%s' run -m '%s' 2>/dev/null", bin, dir);
    cr_expect_eq(run_cmd(cmd, NULL), 2, "missing -p must be a usage error");

    free(g1), free(g2), free(s1), free(s2), free(s3), free(c1);
    dsv4_test_rm_tree(dir);
    free(dir);
}

Test(cli_run, dsv4_load_bad_dir, .timeout = 30) {
    char err[1024] = {0};
    dsv4_model *m = NULL;
    cr_expect_eq(dsv4_load("/nonexistent/dsv4-model", &m, err, sizeof err), -1);
    cr_expect_null(m);
    cr_expect(strlen(err) > 0, "no error message");
}

/* `dsv4 inspect --scale-spread`: the routed experts' MXFP4 scale spreads of a fixture (the official quantizer's, spreads
 * 0-2: every block exact as e4m3 codes with one scale), and a model without MXFP4 experts says so */
Test(cli_run, inspect_scale_spread, .timeout = 60) {
    const char *bin = dsv4_bin();
    char cmd[3 * PATH_MAX], *o1, *o2;
    snprintf(cmd, sizeof cmd, "'%s' inspect -m '%s/small-fp8-fp4' --scale-spread 2>/dev/null", bin, dsv4_test_fixtures());
    cr_assert_eq(run_cmd(cmd, &o1), 0, "%s", cmd);
    cr_expect(strstr(o1, "24576 blocks of 128 columns in 96 matrices"), "%s", o1);
    cr_expect(strstr(o1, "max 2;") && strstr(o1, "100.0000 % within 14"), "%s", o1);
    cr_expect(strstr(o1, "histogram: 0:12911 1:11506 2:159 3:0"), "%s", o1);
    snprintf(cmd, sizeof cmd, "'%s' inspect -m '%s/tiny-bf16' --scale-spread 2>/dev/null", bin, dsv4_test_fixtures());
    cr_assert_eq(run_cmd(cmd, &o2), 0, "%s", cmd);
    cr_expect(strstr(o2, "no MXFP4 routed-expert weights"), "%s", o2);
    free(o1), free(o2);
}

/* `dsv4 bench` on the CPU with the tiny shapes: the JSON report (--json) parses and carries the tables' figures, the
 * prefill's pass rows among them (0: the CPU takes a prompt in one call), and the table form's prefill line says so */
Test(cli_run, bench_tiny_cpu_json, .timeout = 300) {
    const char *bin = dsv4_bin();
    char *dir = strdup("/tmp/dsv4-test-bench-XXXXXX");
    cr_assert(mkdtemp(dir));
    char cmd[3 * PATH_MAX], *js, *tab;
    const char *env = "OMP_WAIT_POLICY=passive OMP_NUM_THREADS=2";
    const char *args = "bench --synthetic tiny --device cpu --layers 2 --prompt 32 --steps 1 --batch 1,2 --context 64";
    snprintf(cmd, sizeof cmd, "%s '%s' %s --dir '%s/ck' --json 2>/dev/null", env, bin, args, dir);
    cr_assert_eq(run_cmd(cmd, &js), 0, "%s", cmd);
    cJSON *j = cJSON_Parse(js);
    cr_assert(j, "not JSON: %s", js);
    const cJSON *pf = cJSON_GetObjectItemCaseSensitive(j, "prefill"), *dec = cJSON_GetObjectItemCaseSensitive(j, "decode");
    cr_expect_str_eq(cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(j, "model")), "tiny");
    cr_expect_eq(cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(j, "layers")), 2);
    cr_expect_eq(cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(pf, "tokens")), 32);
    cr_expect(cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(pf, "ms")) > 0, "%s", js);
    cr_expect_eq(cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(pf, "pass_rows")), 0, "%s", js);
    cr_assert(cJSON_IsArray(dec) && cJSON_GetArraySize(dec) == 2, "%s", js);
    for (int i = 0; i < 2; i++) {
        const cJSON *d = cJSON_GetArrayItem(dec, i);
        cr_expect_eq(cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(d, "batch")), i + 1);
        cr_expect_eq(cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(d, "context")), 64);
        cr_expect(cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(d, "step_ms")) > 0, "%s", js);
        cr_expect(cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(d, "bytes")) > 0, "%s", js);
        cr_expect(cJSON_IsObject(cJSON_GetObjectItemCaseSensitive(d, "layer_ms_by_ratio")), "%s", js);
    }
    cJSON_Delete(j);
    /* the tables, on the same checkpoint (reused) */
    snprintf(cmd, sizeof cmd, "%s '%s' %s --dir '%s/ck' 2>/dev/null", env, bin, args, dir);
    cr_assert_eq(run_cmd(cmd, &tab), 0, "%s", cmd);
    cr_expect(strstr(tab, "prefill 32 tokens: ") && strstr(tab, "; one call\n"), "%s", tab);
    cr_expect(strstr(tab, "generated in 0.0 s, reused"), "%s", tab);
    free(js), free(tab);
    dsv4_test_rm_tree(dir);
    free(dir);
}
