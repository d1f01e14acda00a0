/* test_names.c - every accepted spelling and layout of a checkpoint gives bitwise the same logits:
 * native names with a "model." prefix, Hugging Face names with fused 3-D experts and the older
 * indexer weights_proj spelling, sharded files with an index, FP8 scales as F32 weight_scale_inv,
 * wo_a as the release stores it (FP8) or as the official converter leaves it (its exact bf16 values). */
#include <criterion/criterion.h>
#include <stdint.h>
#include <sys/stat.h>

#include "io/names.h"
#include "model/synth.h"
#include "model_util.h"
#include "quant/formats.h"

Test(names, table) {
    static const char *cases[][2] = {
        {"embed.weight", "embed.weight"},
        {"model.embed_tokens.weight", "embed.weight"},
        {"lm_head.weight", "head.weight"},
        {"model.norm.weight", "norm.weight"},
        {"model.hc_head.hc_fn", "hc_head_fn"},
        {"model.layers.3.self_attn.q_a_proj.weight", "layers.3.attn.wq_a.weight"},
        {"model.layers.3.self_attn.q_a_norm.weight", "layers.3.attn.q_norm.weight"},
        {"model.layers.3.self_attn.sinks", "layers.3.attn.attn_sink"},
        {"model.layers.3.attn_hc.fn", "layers.3.hc_attn_fn"},
        {"model.layers.3.ffn_hc.scale", "layers.3.hc_ffn_scale"},
        {"model.layers.3.input_layernorm.weight", "layers.3.attn_norm.weight"},
        {"model.layers.3.post_attention_layernorm.weight", "layers.3.ffn_norm.weight"},
        {"model.layers.3.self_attn.compressor.position_bias", "layers.3.attn.compressor.ape"},
        {"model.layers.3.self_attn.compressor.kv_norm.weight", "layers.3.attn.compressor.norm.weight"},
        {"model.layers.3.self_attn.compressor.indexer.scorer.weights_proj.weight", "layers.3.attn.indexer.weights_proj.weight"},
        {"model.layers.3.self_attn.compressor.indexer.weights_proj.weight", "layers.3.attn.indexer.weights_proj.weight"},
        {"model.layers.3.self_attn.compressor.indexer.q_b_proj.weight", "layers.3.attn.indexer.wq_b.weight"},
        {"model.layers.3.self_attn.compressor.indexer.kv_proj.weight", "layers.3.attn.indexer.compressor.wkv.weight"},
        {"model.layers.3.mlp.gate.e_score_correction_bias", "layers.3.ffn.gate.bias"},
        {"model.layers.3.mlp.gate.tid2eid", "layers.3.ffn.gate.tid2eid"},
        {"model.layers.3.mlp.experts.12.gate_proj.weight_scale_2", "layers.3.ffn.experts.12.w1.weight_scale_2"},
        {"model.layers.3.mlp.experts.12.up_proj.weight", "layers.3.ffn.experts.12.w3.weight"},
        {"model.layers.3.mlp.experts.12.down_proj.weight", "layers.3.ffn.experts.12.w2.weight"},
        {"model.layers.3.mlp.experts.gate_up_proj", "layers.3.ffn.experts.gate_up_proj"},
        {"model.layers.3.mlp.experts.down_proj", "layers.3.ffn.experts.down_proj"},
        {"model.layers.3.mlp.shared_experts.down_proj.weight", "layers.3.ffn.shared_experts.w2.weight"},
        {"layers.3.attn.wq_b.weight_scale_inv", "layers.3.attn.wq_b.scale"},
        {"model.layers.3.self_attn.kv_proj.weight_scale_inv", "layers.3.attn.wkv.scale"},
        {"layers.3.ffn.experts.5.w1.weight_scale", "layers.3.ffn.experts.5.w1.weight_scale"},
    };
    char out[512];
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        cr_assert(!dsv4_name_to_internal(cases[i][0], out, sizeof out));
        cr_expect(!strcmp(out, cases[i][1]), "%s -> %s, expected %s", cases[i][0], out, cases[i][1]);
    }
}

/* native -> HF spelling for the test conversions (inverse of the table above) */
static void to_hf(const char *n, char *o, size_t cap, int old_wproj) {
    static const char *r[][2] = {
        {"attn.indexer.compressor.wkv.", "self_attn.compressor.indexer.kv_proj."},
        {"attn.indexer.compressor.wgate.", "self_attn.compressor.indexer.gate_proj."},
        {"attn.indexer.compressor.ape", "self_attn.compressor.indexer.position_bias"},
        {"attn.indexer.compressor.norm.", "self_attn.compressor.indexer.kv_norm."},
        {"attn.indexer.weights_proj.", "self_attn.compressor.indexer.scorer.weights_proj."},
        {"attn.indexer.wq_b.", "self_attn.compressor.indexer.q_b_proj."},
        {"attn.compressor.wkv.", "self_attn.compressor.kv_proj."},
        {"attn.compressor.wgate.", "self_attn.compressor.gate_proj."},
        {"attn.compressor.ape", "self_attn.compressor.position_bias"},
        {"attn.compressor.norm.", "self_attn.compressor.kv_norm."},
        {"attn.wq_a.", "self_attn.q_a_proj."}, {"attn.q_norm.", "self_attn.q_a_norm."},
        {"attn.wq_b.", "self_attn.q_b_proj."}, {"attn.wkv.", "self_attn.kv_proj."},
        {"attn.kv_norm.", "self_attn.kv_norm."}, {"attn.wo_a.", "self_attn.o_a_proj."},
        {"attn.wo_b.", "self_attn.o_b_proj."}, {"attn.attn_sink", "self_attn.sinks"},
        {"attn_norm.", "input_layernorm."}, {"ffn_norm.", "post_attention_layernorm."},
        {"hc_attn_fn", "attn_hc.fn"}, {"hc_attn_base", "attn_hc.base"}, {"hc_attn_scale", "attn_hc.scale"},
        {"hc_ffn_fn", "ffn_hc.fn"}, {"hc_ffn_base", "ffn_hc.base"}, {"hc_ffn_scale", "ffn_hc.scale"},
        {"ffn.gate.bias", "mlp.gate.e_score_correction_bias"}, {"ffn.gate.", "mlp.gate."},
        {"ffn.shared_experts.w1.", "mlp.shared_experts.gate_proj."},
        {"ffn.shared_experts.w3.", "mlp.shared_experts.up_proj."},
        {"ffn.shared_experts.w2.", "mlp.shared_experts.down_proj."},
    };
    if (!strcmp(n, "embed.weight")) { snprintf(o, cap, "model.embed_tokens.weight"); return; }
    if (!strcmp(n, "head.weight")) { snprintf(o, cap, "lm_head.weight"); return; }
    if (!strncmp(n, "hc_head_", 8)) { snprintf(o, cap, "model.hc_head.hc_%s", n + 8); return; }
    if (strncmp(n, "layers.", 7)) { snprintf(o, cap, "model.%s", n); return; }
    const char *rest = strchr(n + 7, '.') + 1;
    int pre = (int)(rest - n);
    for (size_t i = 0; i < sizeof r / sizeof r[0]; i++)
        if (!strncmp(rest, r[i][0], strlen(r[i][0]))) {
            const char *to = r[i][1];
            if (old_wproj && strstr(to, "scorer.")) to = "self_attn.compressor.indexer.weights_proj.";
            snprintf(o, cap, "model.%.*s%s%s", pre, n, to, rest + strlen(r[i][0]));
            return;
        }
    snprintf(o, cap, "model.%s", n);
}

/* (removed after each test) */
TestSuite(names, .fini = dsv4_test_tmp_clean);
static char *tmpdir(void) {
    const char *d = dsv4_test_mkdtemp("/tmp/dsv4-names-XXXXXX");
    cr_assert(d);
    return (char *)d;
}

static void copy_config(const char *fx, const char *dir) {
    char cmd[1200];
    snprintf(cmd, sizeof cmd, "cp %s/%s/config.json %s/", dsv4_test_fixtures(), fx, dir);
    cr_assert(system(cmd) == 0);
}

static float *run_dir(const char *dir, int *n_out) {
    char err[1024];
    dsv4_model *m = NULL;
    cr_assert(!dsv4_load(dir, &m, err, sizeof err), "%s: %s", dir, err);
    int V = dsv4_model_info(m).vocab_size, L = 40;
    int32_t tok[40];
    for (int i = 0; i < L; i++) tok[i] = (i * 37 + 11) % V;
    float *out = malloc(sizeof(float) * (size_t)L * V);
    cr_assert(!run_schedule(m, tok, 1, L, 23, 0, out));
    dsv4_free(m);
    *n_out = L * V;
    return out;
}

static float *run_fixture(const char *fx, int *n) {
    char dir[512];
    snprintf(dir, sizeof dir, "%s/%s", dsv4_test_fixtures(), fx);
    return run_dir(dir, n);
}

typedef enum { PREFIX, HF_FUSED, HF_FUSED_OLD, SHARDS, SCALE_INV, WITH_MTP, WO_A_BF16 } variant;

/* fx: a fixture's name, or (starting with '/') a model directory */
static void write_variant(const char *fx, variant v, const char *dir) {
    char path[600];
    if (fx[0] == '/') snprintf(path, sizeof path, "%s/model.safetensors", fx);
    else snprintf(path, sizeof path, "%s/%s/model.safetensors", dsv4_test_fixtures(), fx);
    dsv4_st *st;
    dsv4_err e = {{0}};
    cr_assert(!dsv4_st_open_file(path, &st, &e), "%s", e.msg);
    size_t n = dsv4_st_count(st), k = 0;
    dsv4_st_tensor *ts = calloc(n + 64, sizeof *ts);
    char (*names)[256] = calloc(n + 64, sizeof *names);
    void *bufs[256];
    int nb = 0;
    int E = 8;
    for (size_t i = 0; i < n; i++) {
        dsv4_st_tensor t = *dsv4_st_at(st, i);
        const char *nm = t.name;
        if (v == HF_FUSED || v == HF_FUSED_OLD) {
            const char *ex = strstr(nm, ".ffn.experts.");
            if (ex) {
                /* fuse per layer once, at expert 0's w1 */
                if (!strstr(nm, ".experts.0.w1.weight")) continue;
                int L = atoi(nm + 7);
                char nn[256];
                snprintf(nn, sizeof nn, "layers.%d.ffn.experts.0.w2.weight", L);
                const dsv4_st_tensor *w2 = dsv4_st_find(st, nn);
                int I = (int)t.shape[0], D = (int)t.shape[1];
                size_t es = dsv4_dtype_size(t.dtype);
                uint8_t *gu = malloc((size_t)E * 2 * I * D * es), *dn = malloc((size_t)E * D * I * es);
                for (int x = 0; x < E; x++) {
                    const char *p[3] = {"w1", "w3", "w2"};
                    for (int j = 0; j < 3; j++) {
                        snprintf(nn, sizeof nn, "layers.%d.ffn.experts.%d.%s.weight", L, x, p[j]);
                        const dsv4_st_tensor *s = dsv4_st_find(st, nn);
                        cr_assert(s && s->nbytes == (size_t)I * D * es);
                        uint8_t *dst = j == 2 ? dn + (size_t)x * D * I * es : gu + ((size_t)x * 2 * I + (size_t)j * I) * D * es;
                        memcpy(dst, s->data, s->nbytes);
                    }
                }
                bufs[nb++] = gu, bufs[nb++] = dn;
                snprintf(names[k], 256, "model.layers.%d.mlp.experts.gate_up_proj", L);
                ts[k] = (dsv4_st_tensor){.name = names[k], .dtype = t.dtype, .ndim = 3, .shape = {E, 2 * I, D},
                                         .numel = (int64_t)E * 2 * I * D, .data = gu, .nbytes = (uint64_t)E * 2 * I * D * es};
                k++;
                snprintf(names[k], 256, "model.layers.%d.mlp.experts.down_proj", L);
                ts[k] = (dsv4_st_tensor){.name = names[k], .dtype = w2->dtype, .ndim = 3, .shape = {E, D, I},
                                         .numel = (int64_t)E * D * I, .data = dn, .nbytes = (uint64_t)E * D * I * es};
                k++;
                continue;
            }
            to_hf(nm, names[k], 256, v == HF_FUSED_OLD);
        } else if (v == PREFIX) {
            snprintf(names[k], 256, "model.%s", nm);
        } else if (v == SCALE_INV && t.dtype == DSV4_DT_F8_E8M0 && strstr(nm, ".scale") &&
                   !strstr(nm, ".experts.")) {
            /* FP8 block scale as F32 weight_scale_inv */
            float *f = malloc(sizeof(float) * (size_t)t.numel);
            for (int64_t x = 0; x < t.numel; x++) f[x] = dsv4_e8m0_to_f32(t.data[x]);
            bufs[nb++] = f;
            snprintf(names[k], 256, "%.*s.weight_scale_inv", (int)(strlen(nm) - 6), nm);
            t.dtype = DSV4_DT_F32;
            t.data = (const uint8_t *)f;
            t.nbytes = sizeof(float) * (uint64_t)t.numel;
        } else if (v == WO_A_BF16 && strstr(nm, ".attn.wo_a.")) {
            /* the official converter's wo_a: each FP8 value times its 128x128 block's E8M0 scale, exactly in bf16 */
            if (strstr(nm, ".attn.wo_a.scale")) continue;
            cr_assert(t.dtype == DSV4_DT_F8_E4M3 && t.ndim == 2, "%s: expected FP8", nm);
            char sn[256];
            snprintf(sn, sizeof sn, "%.*s.scale", (int)(strlen(nm) - 7), nm);
            const dsv4_st_tensor *sc = dsv4_st_find(st, sn);
            cr_assert(sc && sc->dtype == DSV4_DT_F8_E8M0, "%s: no E8M0 scale", sn);
            const int64_t R = t.shape[0], C = t.shape[1], SC = sc->shape[1];
            uint16_t *b = malloc(sizeof(uint16_t) * (size_t)(R * C));
            for (int64_t r = 0; r < R; r++)
                for (int64_t c = 0; c < C; c++) {
                    const float x = dsv4_e4m3_to_f32(t.data[r * C + c]) * dsv4_e8m0_to_f32(sc->data[(r / 128) * SC + c / 128]);
                    b[r * C + c] = dsv4_f32_to_bf16(x);
                    cr_assert(dsv4_bf16_to_f32(b[r * C + c]) == x, "%s: %g is not a bf16 value", nm, (double)x);
                }
            bufs[nb++] = b;
            snprintf(names[k], 256, "%s", nm);
            t.dtype = DSV4_DT_BF16;
            t.data = (const uint8_t *)b;
            t.nbytes = sizeof(uint16_t) * (uint64_t)(R * C);
        } else {
            snprintf(names[k], 256, "%s", nm);
        }
        t.name = names[k];
        ts[k++] = t;
    }
    if (v == WITH_MTP) { /* an MTP block's tensor: skipped at load with a notice */
        static uint16_t zeros[64 * 64];
        snprintf(names[k], 256, "mtp.0.e_proj.weight");
        ts[k] = (dsv4_st_tensor){.name = names[k], .dtype = DSV4_DT_BF16, .ndim = 2, .shape = {64, 64},
                                 .numel = 64 * 64, .data = (const uint8_t *)zeros, .nbytes = sizeof zeros};
        k++;
        /* config: one MTP layer, compress_ratios with its extra entry */
        char cp[600];
        snprintf(cp, sizeof cp, "%s/config.json", dir);
        FILE *f = fopen(cp, "rb");
        static char txt[1 << 16];
        size_t len = fread(txt, 1, sizeof txt - 1, f);
        fclose(f);
        txt[len] = 0;
        cJSON *j = cJSON_Parse(txt);
        cJSON_ReplaceItemInObject(j, "num_nextn_predict_layers", cJSON_CreateNumber(1));
        cJSON_AddItemToArray(cJSON_GetObjectItem(j, "compress_ratios"), cJSON_CreateNumber(0));
        char *out = cJSON_Print(j);
        f = fopen(cp, "wb");
        fputs(out, f);
        fclose(f);
        free(out);
        cJSON_Delete(j);
    }
    if (v == SHARDS) {
        /* three shards + index */
        char idx[1 << 16];
        size_t o = (size_t)snprintf(idx, sizeof idx, "{\"metadata\": {}, \"weight_map\": {");
        size_t per = (k + 2) / 3;
        for (size_t s = 0; s < 3; s++) {
            size_t a = s * per, b = a + per < k ? a + per : k;
            snprintf(path, sizeof path, "%s/model-%05zu-of-00003.safetensors", dir, s + 1);
            cr_assert(!dsv4_st_write(path, ts + a, b - a, &e), "%s", e.msg);
            for (size_t i = a; i < b; i++)
                o += (size_t)snprintf(idx + o, sizeof idx - o, "%s\"%s\": \"model-%05zu-of-00003.safetensors\"",
                                      i ? ", " : "", ts[i].name, s + 1);
        }
        snprintf(idx + o, sizeof idx - o, "}}");
        snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
        FILE *f = fopen(path, "wb");
        fputs(idx, f);
        fclose(f);
    } else {
        snprintf(path, sizeof path, "%s/model.safetensors", dir);
        cr_assert(!dsv4_st_write(path, ts, k, &e), "%s", e.msg);
    }
    for (int i = 0; i < nb; i++) free(bufs[i]);
    free(ts);
    free(names);
    dsv4_st_close(st);
}

static void check_variant(const char *fx, variant v) {
    int n1, n2;
    float *ref = run_fixture(fx, &n1);
    char *dir = tmpdir();
    copy_config(fx, dir);
    write_variant(fx, v, dir);
    float *got = run_dir(dir, &n2);
    cr_assert(n1 == n2);
    cr_expect(!memcmp(ref, got, sizeof(float) * (size_t)n1), "%s variant %d: logits differ (rel %.3e)", fx, (int)v,
              dsv4_rel_l2(got, ref, (size_t)n1));
    free(ref), free(got);
}

Test(names, model_prefix, .timeout = 120) { check_variant("tiny-bf16", PREFIX); }
Test(names, hf_fused_experts, .timeout = 120) { check_variant("tiny-bf16", HF_FUSED); }
Test(names, hf_fused_experts_old_weights_proj, .timeout = 120) { check_variant("tiny-bf16", HF_FUSED_OLD); }
Test(names, sharded_with_index, .timeout = 120) { check_variant("small-fp8-fp4", SHARDS); }
Test(names, mtp_block_skipped, .timeout = 120) {
    check_variant("tiny-bf16", WITH_MTP);
}
Test(names, fp8_scale_inv_f32, .timeout = 120) { check_variant("small-fp8-fp4", SCALE_INV); }

/* wo_a: the release's FP8 (what `dsv4 synth` writes) and the official converter's exact bf16 give the same logits */
Test(names, wo_a_fp8_equals_converted_bf16, .timeout = 120) {
    char *src = tmpdir(), sdir[64];
    snprintf(sdir, sizeof sdir, "%s", src);
    dsv4_synth_opts o;
    dsv4_synth_defaults(&o);
    o.seed = 7;
    o.dim = 64;
    o.n_layers = 4;
    o.hca_ratio = 8;
    o.window = 8;
    o.index_topk = 2;
    o.vocab_size = 512;
    o.max_position_embeddings = 256;
    dsv4_err e = {{0}};
    cr_assert_eq(dsv4_synth_write(sdir, &o, NULL, &e), 0, "synth: %s", e.msg);
    char *dir = tmpdir(), cmd[256];
    snprintf(cmd, sizeof cmd, "cp %s/config.json %s/", sdir, dir);
    cr_assert(system(cmd) == 0);
    write_variant(sdir, WO_A_BF16, dir);
    int n1, n2;
    float *ref = run_dir(sdir, &n1), *got = run_dir(dir, &n2);
    cr_assert(n1 == n2);
    cr_expect(!memcmp(ref, got, sizeof(float) * (size_t)n1), "wo_a bf16: logits differ (rel %.3e)",
              dsv4_rel_l2(got, ref, (size_t)n1));
    free(ref), free(got);
}
