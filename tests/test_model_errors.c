/* test_model_errors.c - checkpoints that disagree with their config, and bad requests, through the
 * library and through the dsv4 binary: each must fail with a message naming the tensor / field /
 * request, a non-zero exit, and no crash. */
#include <criterion/criterion.h>
#include <stdint.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "model_util.h"

typedef struct {
    const char *drop;          /* tensor to leave out */
    const char *reshape;       /* tensor whose first dim is halved (data truncated) */
    const char *retype;        /* tensor re-labelled with another dtype of the same size */
    dsv4_dtype retype_to;
    const char *poke;          /* I32 tensor whose first value is set to poke_value */
    int32_t poke_value;
} mutation;

/* (the temporary directories below, removed after each test) */
TestSuite(model_errors, .fini = dsv4_test_tmp_clean);
TestSuite(cli_errors, .fini = dsv4_test_tmp_clean);

/* Copies fixture fx into a fresh directory with one mutation and an optional config edit
 * (cfg_from -> cfg_to textual replacement). Returns the directory (removed after the test). */
static const char *make_bad(const char *fx, mutation mu, const char *cfg_from, const char *cfg_to) {
    const char *dir = dsv4_test_mkdtemp("/tmp/dsv4-badmodel-XXXXXX");
    cr_assert(dir);
    char path[512];
    snprintf(path, sizeof path, "%s/%s/model.safetensors", dsv4_test_fixtures(), fx);
    dsv4_st *st;
    dsv4_err e = {{0}};
    cr_assert(!dsv4_st_open_file(path, &st, &e), "%s", e.msg);
    size_t n = dsv4_st_count(st), k = 0;
    dsv4_st_tensor *ts = calloc(n, sizeof *ts);
    uint8_t *poked = NULL;
    for (size_t i = 0; i < n; i++) {
        dsv4_st_tensor t = *dsv4_st_at(st, i);
        if (mu.drop && !strcmp(t.name, mu.drop)) continue;
        if (mu.reshape && !strcmp(t.name, mu.reshape)) {
            t.shape[0] /= 2;
            t.numel /= 2;
            t.nbytes /= 2;
        }
        if (mu.retype && !strcmp(t.name, mu.retype)) t.dtype = mu.retype_to;
        if (mu.poke && !strcmp(t.name, mu.poke)) {
            poked = malloc(t.nbytes);
            memcpy(poked, t.data, t.nbytes);
            memcpy(poked, &mu.poke_value, 4);
            t.data = poked;
        }
        ts[k++] = t;
    }
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    cr_assert(!dsv4_st_write(path, ts, k, &e), "%s", e.msg);
    free(ts);
    free(poked);
    dsv4_st_close(st);
    /* config */
    snprintf(path, sizeof path, "%s/%s/config.json", dsv4_test_fixtures(), fx);
    FILE *f = fopen(path, "rb");
    static char cfg[1 << 16];
    size_t len = fread(cfg, 1, sizeof cfg - 1, f);
    fclose(f);
    cfg[len] = 0;
    snprintf(path, sizeof path, "%s/config.json", dir);
    f = fopen(path, "wb");
    char *at = cfg_from ? strstr(cfg, cfg_from) : NULL;
    if (cfg_from) cr_assert(at, "config edit '%s' not found", cfg_from);
    if (at) {
        fwrite(cfg, 1, (size_t)(at - cfg), f);
        fputs(cfg_to, f);
        fputs(at + strlen(cfg_from), f);
    } else fputs(cfg, f);
    fclose(f);
    return dir;
}

static void expect_load_error(const char *dir, const char *needle1, const char *needle2) {
    dsv4_model *m = NULL;
    char err[1024] = "";
    cr_expect(dsv4_load(dir, &m, err, sizeof err) != 0, "loading %s should fail", dir);
    cr_expect(!m);
    cr_expect(strstr(err, needle1), "error '%s' should mention '%s'", err, needle1);
    if (needle2) cr_expect(strstr(err, needle2), "error '%s' should mention '%s'", err, needle2);
}

Test(model_errors, missing_tensor) {
    const char *d = make_bad("tiny-bf16", (mutation){.drop = "layers.2.attn.wkv.weight"}, NULL, NULL);
    expect_load_error(d, "missing tensor", "layers.2.attn.wkv.weight");
}

Test(model_errors, shape_disagrees_with_config) {
    const char *d = make_bad("tiny-bf16", (mutation){.reshape = "layers.0.attn.wq_a.weight"}, NULL, NULL);
    expect_load_error(d, "layers.0.attn.wq_a.weight", "shape");
}

Test(model_errors, config_disagrees_with_tensors) {
    const char *d = make_bad("tiny-bf16", (mutation){0}, "\"q_lora_rank\": 32", "\"q_lora_rank\": 48");
    expect_load_error(d, "attn.wq_a.weight", "[48, 64]");
    d = make_bad("tiny-bf16", (mutation){0}, "\"num_hidden_layers\": 5", "\"num_hidden_layers\": 6");
    expect_load_error(d, "config.json", "compress_ratios");
}

Test(model_errors, dtype_not_a_weight_format) {
    const char *d = make_bad("tiny-bf16", (mutation){.retype = "layers.1.attn.wq_b.weight", .retype_to = DSV4_DT_I16}, NULL, NULL);
    expect_load_error(d, "layers.1.attn.wq_b.weight", "I16");
    d = make_bad("tiny-bf16", (mutation){.retype = "layers.1.attn_norm.weight", .retype_to = DSV4_DT_I32}, NULL, NULL);
    expect_load_error(d, "layers.1.attn_norm.weight", "I32");
}

Test(model_errors, fp8_without_scale) {
    const char *d = make_bad("small-fp8-fp4", (mutation){.drop = "layers.0.attn.wq_a.scale"}, NULL, NULL);
    expect_load_error(d, "layers.0.attn.wq_a.weight", "block scale");
}

Test(model_errors, fp4_without_scale) {
    const char *d = make_bad("small-fp8-fp4", (mutation){.drop = "layers.2.ffn.experts.3.w2.scale"}, NULL, NULL);
    expect_load_error(d, "layers.2.ffn.experts.3.w2.weight", "scale");
    d = make_bad("small-fp8-nvfp4", (mutation){.drop = "layers.1.ffn.experts.0.w1.weight_scale_2"}, NULL, NULL);
    expect_load_error(d, "layers.1.ffn.experts.0.w1", "weight_scale_2");
}

Test(model_errors, scale_shape_wrong) {
    const char *d = make_bad("small-fp8-fp4", (mutation){.reshape = "layers.0.attn.wq_b.scale"}, NULL, NULL);
    expect_load_error(d, "layers.0.attn.wq_b.scale", "shape");
}

Test(model_errors, hash_table_names_missing_expert) {
    const char *d = make_bad("tiny-bf16", (mutation){.poke = "layers.0.ffn.gate.tid2eid", .poke_value = 8}, NULL, NULL);
    expect_load_error(d, "layers.0.ffn.gate.tid2eid", "expert 8");
}

/* ---- through the binary ---- */

static const char *dsv4_bin(void) {
    static char path[600];
    char self[512];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    cr_assert(n > 0);
    self[n] = 0;
    *strrchr(self, '/') = 0; /* .../BUILD/tests */
    *strrchr(self, '/') = 0; /* .../BUILD */
    snprintf(path, sizeof path, "%s/dsv4", self);
    return path;
}

/* Runs a shell command; returns its exit status (or 128+signal), stderr text in err. */
static int run_cmd(const char *cmd, char *err, size_t cap) {
    char full[2048], ef[64];
    snprintf(ef, sizeof ef, "/tmp/dsv4-cli-err-%d.txt", (int)getpid());
    snprintf(full, sizeof full, "%s 2>%s >/dev/null", cmd, ef);
    int st = system(full);
    FILE *f = fopen(ef, "rb");
    size_t n = f ? fread(err, 1, cap - 1, f) : 0;
    if (f) fclose(f);
    remove(ef);
    err[n] = 0;
    if (WIFSIGNALED(st)) return 128 + WTERMSIG(st);
    return WEXITSTATUS(st);
}

Test(cli_errors, logits_bad_inputs) {
    char cmd[2048], err[4096], tok[128], out[128];
    const char *bin = dsv4_bin(), *td = dsv4_test_mkdtemp("/tmp/dsv4-clierr-XXXXXX");
    cr_assert(td);
    snprintf(tok, sizeof tok, "%s/dsv4-tok-bad.json", td);
    snprintf(out, sizeof out, "%s/o.safetensors", td);
    FILE *f = fopen(tok, "wb");
    fputs("[[1, 2, 600]]", f);
    fclose(f);
    snprintf(cmd, sizeof cmd, "%s logits -m %s/tiny-bf16 --tokens %s -o %s", bin, dsv4_test_fixtures(), tok, out);
    int rc = run_cmd(cmd, err, sizeof err);
    cr_expect(rc == 1, "exit %d: %s", rc, err);
    cr_expect(strstr(err, "600") && strstr(err, "vocabulary"), "%s", err);

    f = fopen(tok, "wb");
    fputs("[[1, 2, 3], [4, 5]]", f);
    fclose(f);
    rc = run_cmd(cmd, err, sizeof err);
    cr_expect(rc == 1 && strstr(err, "sequence 1"), "exit %d: %s", rc, err);

    f = fopen(tok, "wb");
    fputs("[[1, 2", f);
    fclose(f);
    rc = run_cmd(cmd, err, sizeof err);
    cr_expect(rc == 1 && strstr(err, "dsv4-tok-bad.json"), "exit %d: %s", rc, err);

    /* truncated checkpoint */
    const char *d = make_bad("tiny-bf16", (mutation){0}, NULL, NULL);
    snprintf(cmd, sizeof cmd, "truncate -s 100000 %s/model.safetensors", d);
    cr_assert(system(cmd) == 0);
    f = fopen(tok, "wb");
    fputs("[[1, 2, 3]]", f);
    fclose(f);
    snprintf(cmd, sizeof cmd, "%s logits -m %s --tokens %s -o %s", bin, d, tok, out);
    rc = run_cmd(cmd, err, sizeof err);
    cr_expect(rc == 1 && strstr(err, "model.safetensors"), "exit %d: %s", rc, err);

    snprintf(cmd, sizeof cmd, "%s logits -m /nonexistent --tokens %s -o %s", bin, tok, out);
    rc = run_cmd(cmd, err, sizeof err);
    cr_expect(rc == 1 && strstr(err, "/nonexistent"), "exit %d: %s", rc, err);

    snprintf(cmd, sizeof cmd, "%s logits --chunk 0 -m x --tokens y -o z", bin);
    rc = run_cmd(cmd, err, sizeof err);
    cr_expect(rc == 2 && strstr(err, "--chunk"), "exit %d: %s", rc, err);
}

Test(cli_errors, every_command_has_help) {
    const char *cmds[] = {"logits", "inspect", "tokenize", "detokenize", "chat-template", "parse-completion", "run", "chat", "synth"};
    char cmd[1024], err[4096];
    for (size_t i = 0; i < sizeof cmds / sizeof cmds[0]; i++) {
        snprintf(cmd, sizeof cmd, "%s %s --help", dsv4_bin(), cmds[i]);
        cr_expect(run_cmd(cmd, err, sizeof err) == 0, "%s --help", cmds[i]);
    }
}
