/* test_io.c - safetensors reader/writer and config.json parser (src/io). */
#include <criterion/criterion.h>
#include <dirent.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "check.h"
#include "io/config.h"
#include "io/safetensors.h"

static const char *fixture_models[] = {"tiny-bf16", "small-fp8-fp4", "small-fp8-nvfp4", "tiny-nvfp4-hf",
                                       "tiny-stable"};
#define N_FIXTURES (sizeof fixture_models / sizeof fixture_models[0])

/* ---------------------------------------------------------------------------------------------- */
/* helpers */

static char *fixture_path(const char *model, const char *file) {
    static char buf[4][512];
    static int k;
    char *p = buf[k++ & 3];
    snprintf(p, 512, "%s/%s%s%s", dsv4_test_fixtures(), model, file ? "/" : "", file ? file : "");
    return p;
}

static uint8_t *slurp(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    cr_assert(f, "cannot open %s", path);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *b = malloc(n > 0 ? (size_t)n : 1);
    cr_assert(b);
    cr_assert_eq(fread(b, 1, (size_t)n, f), (size_t)n);
    fclose(f);
    *len = (size_t)n;
    return b;
}

static void spit(const char *path, const void *data, size_t len) {
    FILE *f = fopen(path, "wb");
    cr_assert(f, "cannot create %s", path);
    cr_assert_eq(fwrite(data, 1, len, f), len);
    cr_assert_eq(fclose(f), 0);
}

static char *tmpdir_new(void) {
    char *d = strdup("/tmp/dsv4_test_io_XXXXXX");
    cr_assert(mkdtemp(d), "mkdtemp failed");
    return d;
}

static void tmpdir_free(char *d) {
    dsv4_test_rm_tree(d);
    free(d);
}

static char *join(const char *a, const char *b) {
    size_t n = strlen(a) + strlen(b) + 2;
    char *p = malloc(n);
    snprintf(p, n, "%s/%s", a, b);
    return p;
}

/* A safetensors image: 8-byte length + header text + data_len zero bytes. */
static uint8_t *image(const char *header, size_t data_len, size_t *len) {
    size_t h = strlen(header);
    *len = 8 + h + data_len;
    uint8_t *b = calloc(1, *len);
    for (int i = 0; i < 8; i++) b[i] = (uint8_t)((uint64_t)h >> (8 * i));
    memcpy(b + 8, header, h);
    return b;
}

/* Parses a header in memory and asserts failure with every given substring in the message. */
static void expect_parse_fail(const char *header, size_t data_len, const char *s1, const char *s2) {
    size_t len;
    uint8_t *b = image(header, data_len, &len);
    dsv4_st *st = (dsv4_st *)0x1;
    dsv4_err e = {{0}};
    int rc = dsv4_st_parse(b, len, "mem.safetensors", &st, &e);
    cr_assert_eq(rc, -1, "parse unexpectedly succeeded: %s", header);
    cr_assert_null(st);
    cr_assert(strstr(e.msg, "mem.safetensors"), "message does not name the file: %s", e.msg);
    if (s1) cr_assert(strstr(e.msg, s1), "message lacks '%s': %s", s1, e.msg);
    if (s2) cr_assert(strstr(e.msg, s2), "message lacks '%s': %s", s2, e.msg);
    free(b);
}

static void expect_parse_ok(const char *header, size_t data_len, size_t want_count) {
    size_t len;
    uint8_t *b = image(header, data_len, &len);
    dsv4_st *st = NULL;
    dsv4_err e = {{0}};
    cr_assert_eq(dsv4_st_parse(b, len, "mem.safetensors", &st, &e), 0, "%s: %s", header, e.msg);
    cr_assert_eq(dsv4_st_count(st), want_count);
    dsv4_st_close(st);
    free(b);
}

static void check_shape(const dsv4_st_tensor *t, dsv4_dtype dt, int ndim, const int64_t *shape) {
    cr_assert(t);
    cr_assert_eq(t->dtype, dt, "%s: dtype %s", t->name, dsv4_dtype_name(t->dtype));
    cr_assert_eq(t->ndim, ndim, "%s: ndim %d", t->name, t->ndim);
    int64_t n = 1;
    for (int i = 0; i < ndim; i++) {
        cr_assert_eq(t->shape[i], shape[i], "%s: dim %d", t->name, i);
        n *= shape[i];
    }
    cr_assert_eq(t->numel, n);
    cr_assert_eq(t->nbytes, (uint64_t)n * dsv4_dtype_size(dt));
}

/* Every tensor is found by name, lies inside its file, and the order is by file then offset. */
static void check_set_consistent(const dsv4_st *st) {
    uint64_t total = 0;
    const dsv4_st_tensor *prev = NULL;
    for (size_t i = 0; i < dsv4_st_count(st); i++) {
        const dsv4_st_tensor *t = dsv4_st_at(st, i);
        cr_assert(t && t->name);
        cr_assert_eq(dsv4_st_find(st, t->name), t, "find(%s)", t->name);
        cr_assert(t->file >= 0 && t->file < dsv4_st_file_count(st));
        if (prev) {
            cr_assert(prev->file < t->file || (prev->file == t->file && prev->data <= t->data), "order at %zu", i);
            if (prev->file == t->file && prev->nbytes && t->nbytes) cr_assert(prev->data + prev->nbytes <= t->data);
        }
        total += t->nbytes;
        prev = t;
    }
    cr_assert_eq(dsv4_st_total_bytes(st), total);
    cr_assert_null(dsv4_st_at(st, dsv4_st_count(st)));
    cr_assert_null(dsv4_st_find(st, "no.such.tensor"));
    cr_assert_null(dsv4_st_find(st, ""));
}

/* ---------------------------------------------------------------------------------------------- */
/* dtypes */

Test(io_dtype, names_sizes_parse) {
    for (int i = 0; i < DSV4_DT_COUNT; i++) {
        dsv4_dtype d;
        cr_assert_eq(dsv4_dtype_parse(dsv4_dtype_name((dsv4_dtype)i), &d), 0);
        cr_assert_eq(d, (dsv4_dtype)i);
        cr_assert(dsv4_dtype_size((dsv4_dtype)i) > 0);
    }
    dsv4_dtype d;
    cr_assert_eq(dsv4_dtype_parse("F8_E8M0FNU", &d), 0);
    cr_assert_eq(d, DSV4_DT_F8_E8M0);
    cr_assert_eq(dsv4_dtype_parse("F17", &d), -1);
    cr_assert_eq(dsv4_dtype_parse("", &d), -1);
    cr_assert_eq(dsv4_dtype_parse("f32", &d), -1);
    cr_assert_eq(dsv4_dtype_size(DSV4_DT_BF16), 2);
    cr_assert_eq(dsv4_dtype_size(DSV4_DT_F8_E4M3), 1);
    cr_assert_eq(dsv4_dtype_size(DSV4_DT_I64), 8);
    cr_assert_str_eq(dsv4_dtype_name(DSV4_DT_F8_E8M0), "F8_E8M0");
    cr_assert_eq(dsv4_dtype_size(DSV4_DT_COUNT), 0);
}

/* ---------------------------------------------------------------------------------------------- */
/* fixtures */

Test(io_st, fixtures_load) {
    for (size_t i = 0; i < N_FIXTURES; i++) {
        const char *names[] = {"model.safetensors", "expected.safetensors"};
        for (int k = 0; k < 2; k++) {
            dsv4_st *st = NULL;
            dsv4_err e = {{0}};
            const char *p = fixture_path(fixture_models[i], names[k]);
            if (access(p, R_OK) != 0) continue;
            cr_assert_eq(dsv4_st_open_file(p, &st, &e), 0, "%s: %s", p, e.msg);
            cr_assert(dsv4_st_count(st) > 0);
            cr_assert_eq(dsv4_st_file_count(st), 1);
            cr_assert_str_eq(dsv4_st_file_path(st, 0), p);
            cr_assert_null(dsv4_st_file_path(st, 1));
            check_set_consistent(st);
            dsv4_st_close(st);
        }
        /* the directory form picks model.safetensors */
        dsv4_st *st = NULL;
        dsv4_err e = {{0}};
        cr_assert_eq(dsv4_st_open_dir(fixture_path(fixture_models[i], NULL), &st, &e), 0, "%s", e.msg);
        cr_assert(strstr(dsv4_st_file_path(st, 0), "model.safetensors"));
        check_set_consistent(st);
        dsv4_st_close(st);
    }
}

Test(io_st, fixture_counts_and_shapes) {
    dsv4_st *st = NULL;
    dsv4_err e = {{0}};
    cr_assert_eq(dsv4_st_open_dir(fixture_path("tiny-bf16", NULL), &st, &e), 0, "%s", e.msg);
    cr_assert_eq(dsv4_st_count(st), 255);
    check_shape(dsv4_st_find(st, "layers.0.attn.wq_a.weight"), DSV4_DT_BF16, 2, (int64_t[]){32, 64});
    check_shape(dsv4_st_find(st, "layers.0.attn.attn_sink"), DSV4_DT_F32, 1, (int64_t[]){4});
    check_shape(dsv4_st_find(st, "layers.0.ffn.gate.tid2eid"), DSV4_DT_I32, 2, (int64_t[]){512, 2});
    check_shape(dsv4_st_find(st, "embed.weight"), DSV4_DT_F32, 2, (int64_t[]){512, 64});
    /* values straight from the file (python struct.unpack) */
    float v;
    memcpy(&v, dsv4_st_find(st, "layers.0.attn.attn_sink")->data, 4);
    cr_assert_float_eq(v, 0.007188840303570032f, 1e-9);
    memcpy(&v, dsv4_st_find(st, "embed.weight")->data, 4);
    cr_assert_float_eq(v, 1.2739968299865723f, 1e-7);
    memcpy(&v, dsv4_st_find(st, "hc_head_scale")->data, 4);
    cr_assert_float_eq(v, 1.4421311616897583f, 1e-7);
    dsv4_st_close(st);

    cr_assert_eq(dsv4_st_open_dir(fixture_path("small-fp8-fp4", NULL), &st, &e), 0, "%s", e.msg);
    cr_assert_eq(dsv4_st_count(st), 336);
    check_shape(dsv4_st_find(st, "layers.0.attn.wq_a.weight"), DSV4_DT_F8_E4M3, 2, (int64_t[]){128, 256});
    check_shape(dsv4_st_find(st, "layers.0.attn.wq_a.scale"), DSV4_DT_F8_E8M0, 2, (int64_t[]){1, 2});
    check_shape(dsv4_st_find(st, "layers.0.ffn.experts.0.w1.weight"), DSV4_DT_I8, 2, (int64_t[]){128, 128});
    check_shape(dsv4_st_find(st, "layers.0.ffn.experts.0.w1.scale"), DSV4_DT_F8_E8M0, 2, (int64_t[]){128, 8});
    dsv4_st_close(st);

    cr_assert_eq(dsv4_st_open_dir(fixture_path("small-fp8-nvfp4", NULL), &st, &e), 0, "%s", e.msg);
    cr_assert_eq(dsv4_st_count(st), 528);
    check_shape(dsv4_st_find(st, "layers.0.ffn.experts.0.w1.weight"), DSV4_DT_U8, 2, (int64_t[]){128, 128});
    check_shape(dsv4_st_find(st, "layers.0.ffn.experts.0.w1.weight_scale"), DSV4_DT_F8_E4M3, 2, (int64_t[]){128, 16});
    const dsv4_st_tensor *s2 = dsv4_st_find(st, "layers.0.ffn.experts.0.w1.weight_scale_2");
    check_shape(s2, DSV4_DT_F32, 0, NULL);
    memcpy(&v, s2->data, 4);
    cr_assert_float_eq(v, 0.125f, 0);
    dsv4_st_close(st);

    cr_assert_eq(dsv4_st_open_dir(fixture_path("tiny-nvfp4-hf", NULL), &st, &e), 0, "%s", e.msg);
    cr_assert_eq(dsv4_st_count(st), 792);
    check_shape(dsv4_st_find(st, "model.layers.0.self_attn.q_a_proj.weight"), DSV4_DT_U8, 2, (int64_t[]){32, 32});
    check_shape(dsv4_st_find(st, "lm_head.weight"), DSV4_DT_BF16, 2, (int64_t[]){512, 64});
    dsv4_st_close(st);

    cr_assert_eq(dsv4_st_open_file(fixture_path("tiny-bf16", "expected.safetensors"), &st, &e), 0, "%s", e.msg);
    cr_assert_eq(dsv4_st_count(st), 9);
    check_shape(dsv4_st_find(st, "hidden_A"), DSV4_DT_F32, 5, (int64_t[]){5, 1, 37, 4, 64});
    check_shape(dsv4_st_find(st, "tokens_C"), DSV4_DT_I32, 2, (int64_t[]){2, 30});
    /* stable order = by offset: hidden_A is at 0 */
    cr_assert_str_eq(dsv4_st_at(st, 0)->name, "hidden_A");
    cr_assert_str_eq(dsv4_st_at(st, 8)->name, "tokens_D");
    dsv4_st_close(st);
}

/* The in-memory parser sees the same tensors as the file loader, with pointers into the buffer. */
Test(io_st, parse_matches_file) {
    const char *p = fixture_path("small-fp8-fp4", "model.safetensors");
    size_t len;
    uint8_t *buf = slurp(p, &len);
    dsv4_st *a = NULL, *b = NULL;
    dsv4_err e = {{0}};
    cr_assert_eq(dsv4_st_parse(buf, len, p, &a, &e), 0, "%s", e.msg);
    cr_assert_eq(dsv4_st_open_file(p, &b, &e), 0, "%s", e.msg);
    cr_assert_eq(dsv4_st_count(a), dsv4_st_count(b));
    for (size_t i = 0; i < dsv4_st_count(a); i++) {
        const dsv4_st_tensor *x = dsv4_st_at(a, i), *y = dsv4_st_at(b, i);
        cr_assert_str_eq(x->name, y->name);
        cr_assert(x->data >= buf && x->data + x->nbytes <= buf + len);
        cr_assert_eq(x->nbytes, y->nbytes);
        cr_assert_eq(memcmp(x->data, y->data, x->nbytes), 0, "%s", x->name);
    }
    dsv4_st_close(a);
    dsv4_st_close(b);
    free(buf);
}

/* ---------------------------------------------------------------------------------------------- */
/* writing */

Test(io_st, write_read_round_trip) {
    char *dir = tmpdir_new();
    char *path = join(dir, "out.safetensors");
    float f[6] = {1, -2, 3.5f, 0, 1e-30f, 7};
    int32_t ids[3] = {5, -1, 1 << 30};
    float scalar = 42;
    uint16_t bf[3] = {0x3f80, 0x4000, 0xbf80};
    dsv4_st_tensor t[5] = {
        {.name = "logits", .dtype = DSV4_DT_F32, .ndim = 2, .shape = {2, 3}, .data = (const uint8_t *)f, .nbytes = 24},
        {.name = "tokens", .dtype = DSV4_DT_I32, .ndim = 1, .shape = {3}, .data = (const uint8_t *)ids, .nbytes = 12},
        {.name = "a \"quoted\\name\"\n", .dtype = DSV4_DT_F32, .ndim = 0, .data = (const uint8_t *)&scalar, .nbytes = 4},
        {.name = "empty", .dtype = DSV4_DT_F32, .ndim = 2, .shape = {0, 5}, .data = NULL, .nbytes = 0},
        {.name = "b16", .dtype = DSV4_DT_BF16, .ndim = 1, .shape = {3}, .data = (const uint8_t *)bf, .nbytes = 6},
    };
    dsv4_err e = {{0}};
    cr_assert_eq(dsv4_st_write(path, t, 5, &e), 0, "%s", e.msg);

    size_t len;
    uint8_t *raw = slurp(path, &len);
    uint64_t hl = 0;
    for (int i = 7; i >= 0; i--) hl = hl << 8 | raw[i];
    cr_assert_eq((8 + hl) % 8, 0, "data section not 8-byte aligned");
    cr_assert_eq(raw[8], '{');
    cr_assert_eq(len, 8 + hl + 24 + 12 + 4 + 6);
    /* keys sorted in the header */
    char *h = strndup((const char *)raw + 8, hl);
    cr_assert(strstr(h, "\"a \\\"quoted") < strstr(h, "\"b16\""));
    cr_assert(strstr(h, "\"b16\"") < strstr(h, "\"empty\""));
    cr_assert(strstr(h, "\"logits\"") < strstr(h, "\"tokens\""));
    free(h);
    free(raw);

    dsv4_st *st = NULL;
    cr_assert_eq(dsv4_st_open_file(path, &st, &e), 0, "%s", e.msg);
    cr_assert_eq(dsv4_st_count(st), 5);
    check_set_consistent(st);
    for (int i = 0; i < 5; i++) {
        const dsv4_st_tensor *r = dsv4_st_find(st, t[i].name);
        cr_assert(r, "%s missing", t[i].name);
        check_shape(r, t[i].dtype, t[i].ndim, t[i].shape);
        if (t[i].nbytes) cr_assert_eq(memcmp(r->data, t[i].data, t[i].nbytes), 0);
        if (t[i].nbytes) cr_assert_eq((uintptr_t)r->data % dsv4_dtype_size(r->dtype), 0);
    }
    dsv4_st_close(st);

    /* zero tensors is a valid file too */
    cr_assert_eq(dsv4_st_write(path, NULL, 0, &e), 0, "%s", e.msg);
    cr_assert_eq(dsv4_st_open_file(path, &st, &e), 0, "%s", e.msg);
    cr_assert_eq(dsv4_st_count(st), 0);
    dsv4_st_close(st);

    /* bad requests */
    dsv4_st_tensor bad = t[0];
    bad.nbytes = 20;
    cr_assert_eq(dsv4_st_write(path, &bad, 1, &e), -1);
    cr_assert(strstr(e.msg, "logits"), "%s", e.msg);
    dsv4_st_tensor dup[2] = {t[0], t[0]};
    cr_assert_eq(dsv4_st_write(path, dup, 2, &e), -1);
    cr_assert(strstr(e.msg, "duplicate"), "%s", e.msg);
    char *nodir = join(dir, "no/such/dir.safetensors");
    cr_assert_eq(dsv4_st_write(nodir, t, 1, &e), -1);
    cr_assert(strstr(e.msg, "no/such/dir"), "%s", e.msg);
    free(nodir);
    free(path);
    tmpdir_free(dir);
}

/* Copy of every tensor of `src` whose index i satisfies i % 2 == part into a new file. */
static void write_part(const dsv4_st *src, const char *path, int part, int extra_dup) {
    size_t n = dsv4_st_count(src), k = 0;
    dsv4_st_tensor *t = calloc(n + 1, sizeof *t);
    for (size_t i = 0; i < n; i++)
        if ((int)(i % 2) == part || (extra_dup && i == 0)) t[k++] = *dsv4_st_at(src, i);
    dsv4_err e = {{0}};
    cr_assert_eq(dsv4_st_write(path, t, k, &e), 0, "%s", e.msg);
    free(t);
}

static void write_index(const dsv4_st *src, const char *dir, const char *drop, const char *misplace,
                        const char *extra_name, const char *extra_file) {
    cJSON *root = cJSON_CreateObject(), *wm = cJSON_CreateObject();
    cJSON_AddItemToObject(root, "metadata", cJSON_CreateObject());
    cJSON_AddNumberToObject(cJSON_GetObjectItem(root, "metadata"), "total_size", (double)dsv4_st_total_bytes(src));
    for (size_t i = 0; i < dsv4_st_count(src); i++) {
        const char *name = dsv4_st_at(src, i)->name;
        if (drop && strcmp(name, drop) == 0) continue;
        const char *file = i % 2 ? "model-00002-of-00002.safetensors" : "model-00001-of-00002.safetensors";
        if (misplace && strcmp(name, misplace) == 0)
            file = i % 2 ? "model-00001-of-00002.safetensors" : "model-00002-of-00002.safetensors";
        cJSON_AddStringToObject(wm, name, file);
    }
    if (extra_name) cJSON_AddStringToObject(wm, extra_name, extra_file);
    cJSON_AddItemToObject(root, "weight_map", wm);
    char *s = cJSON_Print(root);
    char *p = join(dir, "model.safetensors.index.json");
    spit(p, s, strlen(s));
    free(p);
    free(s);
    cJSON_Delete(root);
}

static void make_shards(const dsv4_st *src, const char *dir, int dup) {
    char *p1 = join(dir, "model-00001-of-00002.safetensors"), *p2 = join(dir, "model-00002-of-00002.safetensors");
    write_part(src, p1, 0, 0);
    write_part(src, p2, 1, dup);
    free(p1);
    free(p2);
}

Test(io_st, sharded_directory) {
    dsv4_st *src = NULL, *st = NULL;
    dsv4_err e = {{0}};
    cr_assert_eq(dsv4_st_open_dir(fixture_path("tiny-bf16", NULL), &src, &e), 0, "%s", e.msg);
    char *dir = tmpdir_new();
    make_shards(src, dir, 0);
    write_index(src, dir, NULL, NULL, NULL, NULL);
    cr_assert_eq(dsv4_st_open_dir(dir, &st, &e), 0, "%s", e.msg);
    cr_assert_eq(dsv4_st_file_count(st), 2);
    cr_assert_eq(dsv4_st_count(st), dsv4_st_count(src));
    cr_assert_eq(dsv4_st_total_bytes(st), dsv4_st_total_bytes(src));
    check_set_consistent(st);
    for (size_t i = 0; i < dsv4_st_count(src); i++) {
        const dsv4_st_tensor *a = dsv4_st_at(src, i), *b = dsv4_st_find(st, a->name);
        cr_assert(b, "%s missing from the sharded set", a->name);
        check_shape(b, a->dtype, a->ndim, a->shape);
        cr_assert_eq(memcmp(a->data, b->data, a->nbytes), 0, "%s", a->name);
        cr_assert(strstr(dsv4_st_file_path(st, b->file), i % 2 ? "00002-of" : "00001-of"));
    }
    dsv4_st_close(st);

    /* without the index, every *.safetensors in sorted order gives the same set */
    char *ip = join(dir, "model.safetensors.index.json");
    cr_assert_eq(unlink(ip), 0);
    cr_assert_eq(dsv4_st_open_dir(dir, &st, &e), 0, "%s", e.msg);
    cr_assert_eq(dsv4_st_count(st), dsv4_st_count(src));
    cr_assert(strstr(dsv4_st_file_path(st, 0), "00001-of"));
    cr_assert(strstr(dsv4_st_file_path(st, 1), "00002-of"));
    dsv4_st_close(st);
    free(ip);
    tmpdir_free(dir);
    dsv4_st_close(src);
}

Test(io_st, sharded_errors) {
    dsv4_st *src = NULL, *st = NULL;
    dsv4_err e = {{0}};
    cr_assert_eq(dsv4_st_open_dir(fixture_path("tiny-bf16", NULL), &src, &e), 0, "%s", e.msg);
    const char *t0 = dsv4_st_at(src, 0)->name;

    /* a shard named by the index is missing */
    char *dir = tmpdir_new();
    make_shards(src, dir, 0);
    write_index(src, dir, NULL, NULL, "extra.weight", "model-00003-of-00003.safetensors");
    cr_assert_eq(dsv4_st_open_dir(dir, &st, &e), -1);
    cr_assert_null(st);
    cr_assert(strstr(e.msg, "model-00003-of-00003.safetensors") && strstr(e.msg, "missing"), "%s", e.msg);

    /* the index names a tensor absent from its shard */
    write_index(src, dir, NULL, NULL, "ghost.weight", "model-00001-of-00002.safetensors");
    cr_assert_eq(dsv4_st_open_dir(dir, &st, &e), -1);
    cr_assert(strstr(e.msg, "ghost.weight") && strstr(e.msg, "model-00001-of-00002.safetensors"), "%s", e.msg);

    /* the index puts a tensor in the wrong shard */
    write_index(src, dir, NULL, t0, NULL, NULL);
    cr_assert_eq(dsv4_st_open_dir(dir, &st, &e), -1);
    cr_assert(strstr(e.msg, t0), "%s", e.msg);

    /* index not JSON / no weight_map / bad shard names */
    char *ip = join(dir, "model.safetensors.index.json");
    spit(ip, "{\"weight_map\": ", 15);
    cr_assert_eq(dsv4_st_open_dir(dir, &st, &e), -1);
    cr_assert(strstr(e.msg, "model.safetensors.index.json"), "%s", e.msg);
    spit(ip, "{\"metadata\": {}}", 16);
    cr_assert_eq(dsv4_st_open_dir(dir, &st, &e), -1);
    cr_assert(strstr(e.msg, "weight_map"), "%s", e.msg);
    const char *bad = "{\"weight_map\": {\"x\": \"../../etc/passwd\"}}";
    spit(ip, bad, strlen(bad));
    cr_assert_eq(dsv4_st_open_dir(dir, &st, &e), -1);
    cr_assert(strstr(e.msg, "'x'"), "%s", e.msg);
    bad = "{\"weight_map\": {\"x\": 3}}";
    spit(ip, bad, strlen(bad));
    cr_assert_eq(dsv4_st_open_dir(dir, &st, &e), -1);
    cr_assert(strstr(e.msg, "'x'"), "%s", e.msg);
    free(ip);
    tmpdir_free(dir);

    /* a tensor in two shards (index lists it once) */
    dir = tmpdir_new();
    make_shards(src, dir, 1);
    write_index(src, dir, NULL, NULL, NULL, NULL);
    cr_assert_eq(dsv4_st_open_dir(dir, &st, &e), -1);
    cr_assert(strstr(e.msg, t0) && strstr(e.msg, "also present"), "%s", e.msg);
    cr_assert(strstr(e.msg, "00001-of") && strstr(e.msg, "00002-of"), "%s", e.msg);
    /* and without an index */
    ip = join(dir, "model.safetensors.index.json");
    unlink(ip);
    free(ip);
    cr_assert_eq(dsv4_st_open_dir(dir, &st, &e), -1);
    cr_assert(strstr(e.msg, t0) && strstr(e.msg, "also present"), "%s", e.msg);
    tmpdir_free(dir);

    /* an empty directory, a missing directory */
    dir = tmpdir_new();
    cr_assert_eq(dsv4_st_open_dir(dir, &st, &e), -1);
    cr_assert(strstr(e.msg, dir), "%s", e.msg);
    tmpdir_free(dir);
    cr_assert_eq(dsv4_st_open_dir("/nonexistent/dsv4/model", &st, &e), -1);
    cr_assert(strstr(e.msg, "/nonexistent/dsv4/model"), "%s", e.msg);
    cr_assert_eq(dsv4_st_open_file("/nonexistent/x.safetensors", &st, &e), -1);
    cr_assert(strstr(e.msg, "/nonexistent/x.safetensors"), "%s", e.msg);
    dsv4_st_close(src);
}

/* A release-sized header (70,000 tensors, like a real checkpoint's shard set): opens fast, finds by hash. */
Test(io_st, many_tensors, .timeout = 60) {
    enum { N = 70000 };
    dsv4_st_tensor *t = calloc(N, sizeof *t);
    char (*names)[48] = calloc(N, sizeof *names);
    uint8_t *bytes = malloc(N * 2);
    for (int i = 0; i < N; i++) {
        snprintf(names[i], sizeof names[i], "layers.%d.ffn.experts.%d.w%d.scale", i / 1536, (i / 3) % 512, i % 3 + 1);
        bytes[2 * i] = (uint8_t)i;
        bytes[2 * i + 1] = (uint8_t)(i >> 8);
        t[i] = (dsv4_st_tensor){.name = names[i], .dtype = DSV4_DT_U16, .ndim = 1, .shape = {1},
                                .data = bytes + 2 * i, .nbytes = 2};
    }
    char *dir = tmpdir_new();
    char *p = join(dir, "model.safetensors");
    dsv4_err e = {{0}};
    cr_assert_eq(dsv4_st_write(p, t, N, &e), 0, "%s", e.msg);
    dsv4_st *st = NULL;
    cr_assert_eq(dsv4_st_open_dir(dir, &st, &e), 0, "%s", e.msg);
    cr_assert_eq(dsv4_st_count(st), N);
    for (int i = 0; i < N; i++) {
        const dsv4_st_tensor *r = dsv4_st_find(st, names[i]);
        cr_assert(r, "%s", names[i]);
        uint16_t v;
        memcpy(&v, r->data, 2);
        cr_assert_eq(v, (uint16_t)i);
    }
    check_set_consistent(st);
    dsv4_st_close(st);
    free(p);
    tmpdir_free(dir);
    free(t);
    free(names);
    free(bytes);
}

/* ---------------------------------------------------------------------------------------------- */
/* bad headers */

#define F32E(name, shape, a, b) "\"" name "\":{\"dtype\":\"F32\",\"shape\":" shape ",\"data_offsets\":[" #a "," #b "]}"

Test(io_st, good_edge_cases) {
    expect_parse_ok("{}", 0, 0);
    expect_parse_ok("{}      ", 0, 0);
    expect_parse_ok("{\"__metadata__\":{\"format\":\"pt\"}," F32E("w", "[2]", 0, 8) "}", 8, 1);
    expect_parse_ok("{" F32E("s", "[]", 0, 4) "}", 4, 1);
    expect_parse_ok("{" F32E("z", "[0,1000000]", 0, 0) "," F32E("w", "[1]", 0, 4) "}", 4, 2);
    expect_parse_ok("{" F32E("z", "[0,4294967296,4294967296,4294967296]", 4, 4) "}", 4, 1);
    expect_parse_ok("{" F32E("w", "[2.0]", 0, 8) "}", 8, 1);           /* integral floats are integers */
    expect_parse_ok("{" F32E("a", "[1]", 4, 8) "," F32E("b", "[1]", 0, 4) "}", 16, 2); /* unsorted, trailing data */
    expect_parse_ok("{\"w\":{\"dtype\":\"F8_E8M0FNU\",\"shape\":[3],\"data_offsets\":[0,3]}}", 3, 1);
}

Test(io_st, bad_headers) {
    expect_parse_fail("{this is not json}", 0, "not valid JSON", NULL);
    expect_parse_fail("[1,2]", 0, "not a JSON object", NULL);
    expect_parse_fail("\"str\"", 0, "not a JSON object", NULL);
    expect_parse_fail("{} x", 0, "trailing", NULL);
    expect_parse_fail("{\"w\":1}", 0, "'w'", "object");
    expect_parse_fail("{\"w\":{\"shape\":[1],\"data_offsets\":[0,4]}}", 4, "'w'", "dtype");
    expect_parse_fail("{\"w\":{\"dtype\":\"F32\",\"data_offsets\":[0,4]}}", 4, "'w'", "shape");
    expect_parse_fail("{\"w\":{\"dtype\":\"F32\",\"shape\":[1]}}", 4, "'w'", "data_offsets");
    expect_parse_fail("{\"w\":{\"dtype\":\"F42\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4, "'w'", "unknown dtype 'F42'");
    expect_parse_fail("{\"w\":{\"dtype\":null,\"shape\":[1],\"data_offsets\":[0,4]}}", 4, "'w'", "dtype");
    expect_parse_fail("{" F32E("w", "[-1]", 0, 4) "}", 4, "'w'", "negative");
    expect_parse_fail("{" F32E("w", "[1.5]", 0, 4) "}", 4, "'w'", "integer");
    expect_parse_fail("{" F32E("w", "[true]", 0, 4) "}", 4, "'w'", "integer");
    expect_parse_fail("{" F32E("w", "[1e300]", 0, 4) "}", 4, "'w'", "integer");
    expect_parse_fail("{" F32E("w", "[1,1,1,1,1,1,1,1,1]", 0, 4) "}", 4, "'w'", "dimensions");
    expect_parse_fail("{" F32E("w", "[4294967296,4294967296,4294967296]", 0, 4) "}", 4, "'w'", "overflow");
    expect_parse_fail("{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4,8]}}", 8, "'w'", "data_offsets");
    expect_parse_fail("{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0]}}", 8, "'w'", "data_offsets");
    expect_parse_fail("{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":{}}}", 8, "'w'", "data_offsets");
    expect_parse_fail("{" F32E("w", "[1]", -4, 0) "}", 4, "'w'", "data_offsets");
    expect_parse_fail("{" F32E("w", "[1]", 8, 4) "}", 8, "'w'", "ascending");
    expect_parse_fail("{" F32E("w", "[4]", 0, 16) "}", 8, "'w'", "past the end");
    expect_parse_fail("{" F32E("w", "[1]", 4503599627370496, 4503599627370500) "}", 8, "'w'", "past the end");
    expect_parse_fail("{" F32E("w", "[2,3]", 0, 20) "}", 24, "'w'", "byte length 20 != 6");
    expect_parse_fail("{" F32E("a", "[4]", 0, 16) "," F32E("b", "[4]", 8, 24) "}", 24, "'a'", "'b'");
    expect_parse_fail("{" F32E("a", "[8]", 0, 32) "," F32E("b", "[1]", 8, 12) "}", 32, "overlap", "'b'");
    expect_parse_fail("{" F32E("w", "[1]", 0, 4) "," F32E("w", "[1]", 4, 8) "}", 8, "'w'", "duplicate");
    expect_parse_fail("{\"__metadata__\":{\"k\":1}}", 0, "__metadata__", "'k'");
    expect_parse_fail("{\"__metadata__\":[]}", 0, "__metadata__", NULL);
}

Test(io_st, bad_lengths) {
    dsv4_st *st = NULL;
    dsv4_err e = {{0}};
    uint8_t small[7] = {0};
    for (size_t n = 0; n < sizeof small; n++) {
        cr_assert_eq(dsv4_st_parse(small, n, "short.safetensors", &st, &e), -1);
        cr_assert(strstr(e.msg, "short.safetensors") && strstr(e.msg, "too short"), "%s", e.msg);
    }
    cr_assert_eq(dsv4_st_parse(NULL, 0, "null.safetensors", &st, &e), -1);

    size_t len;
    uint8_t *b = image("{" F32E("w", "[1]", 0, 4) "}", 4, &len);
    /* header length past the end, and every truncation of a valid file */
    b[0] = 0xff, b[1] = 0x7f;
    cr_assert_eq(dsv4_st_parse(b, len, "x.safetensors", &st, &e), -1);
    cr_assert(strstr(e.msg, "x.safetensors") && strstr(e.msg, "past the end"), "%s", e.msg);
    memset(b, 0xff, 8);
    cr_assert_eq(dsv4_st_parse(b, len, "x.safetensors", &st, &e), -1);
    cr_assert(strstr(e.msg, "past the end"), "%s", e.msg);
    free(b);
    b = image("{" F32E("w", "[1]", 0, 4) "}", 4, &len);
    for (size_t n = 0; n < len; n++) {
        cr_assert_eq(dsv4_st_parse(b, n, "trunc.safetensors", &st, &e), -1, "truncated to %zu parsed", n);
        cr_assert(strstr(e.msg, "trunc.safetensors"), "%s", e.msg);
    }
    cr_assert_eq(dsv4_st_parse(b, len, "trunc.safetensors", &st, &e), 0, "%s", e.msg);
    dsv4_st_close(st);
    /* a NUL inside the header */
    b[10] = 0;
    cr_assert_eq(dsv4_st_parse(b, len, "nul.safetensors", &st, &e), -1);
    cr_assert(strstr(e.msg, "nul.safetensors"), "%s", e.msg);
    free(b);
}

/* A header length over the sanity limit, in a (sparse) file big enough to hold it. */
Test(io_st, absurd_header_length) {
    char *dir = tmpdir_new();
    char *p = join(dir, "huge.safetensors");
    int fd = open(p, O_CREAT | O_WRONLY | O_TRUNC, 0644);
    cr_assert(fd >= 0);
    uint64_t hl = (uint64_t)150 << 20;
    uint8_t le[8];
    for (int i = 0; i < 8; i++) le[i] = (uint8_t)(hl >> (8 * i));
    cr_assert_eq(write(fd, le, 8), 8);
    cr_assert_eq(ftruncate(fd, (off_t)(hl + 64)), 0);
    close(fd);
    dsv4_st *st = NULL;
    dsv4_err e = {{0}};
    cr_assert_eq(dsv4_st_open_file(p, &st, &e), -1);
    cr_assert(strstr(e.msg, p) && strstr(e.msg, "absurd"), "%s", e.msg);
    free(p);
    tmpdir_free(dir);
}

/* Every committed corrupt input fails cleanly (never crashes), with a message naming the file and
 * containing the text expect.tsv gives. */
Test(io_corpus, corrupt_corpus, .timeout = 120) {
    FILE *f = fopen("tests/corrupt/expect.tsv", "r");
    cr_assert(f, "tests/corrupt/expect.tsv missing (run from the repository root)");
    char line[256];
    int n_st = 0, n_cfg = 0;
    while (fgets(line, sizeof line, f)) {
        if (line[0] == '#' || line[0] == '\n') continue;
        line[strcspn(line, "\r\n")] = 0;
        char *tab = strchr(line, '\t');
        cr_assert(tab, "bad expect.tsv line: %s", line);
        *tab = 0;
        const char *name = line, *want = tab + 1;
        char path[512];
        snprintf(path, sizeof path, "tests/corrupt/%s", name);
        cr_assert_eq(access(path, R_OK), 0, "%s listed in expect.tsv but missing", path);
        int ok = strcmp(want, "OK") == 0;
        dsv4_err e = {{0}};
        size_t l = strlen(name);
        if (l > 12 && strcmp(name + l - 12, ".safetensors") == 0) {
            dsv4_st *st = NULL;
            int rc = dsv4_st_open_file(path, &st, &e);
            if (ok) {
                cr_assert_eq(rc, 0, "%s: %s", path, e.msg);
                dsv4_st_close(st);
            } else {
                cr_assert_eq(rc, -1, "%s loaded", path);
                cr_assert_null(st);
            }
            /* and in memory (the fuzzer's entry point) */
            size_t len;
            uint8_t *buf = slurp(path, &len);
            dsv4_err e2 = {{0}};
            rc = dsv4_st_parse(buf, len, path, &st, &e2);
            cr_assert_eq(rc, ok ? 0 : -1, "%s: parse rc %d: %s", path, rc, e2.msg);
            if (!ok) cr_assert(strstr(e2.msg, want), "%s: message lacks '%s': %s", path, want, e2.msg);
            dsv4_st_close(st);
            free(buf);
            n_st++;
        } else {
            dsv4_config cfg;
            int rc = dsv4_config_load(path, &cfg, &e);
            cr_assert_eq(rc, ok ? 0 : -1, "%s: rc %d: %s", path, rc, e.msg);
            n_cfg++;
        }
        if (!ok) {
            cr_assert(e.msg[0], "%s: empty error message", path);
            cr_assert(strstr(e.msg, path), "%s: message does not name the file: %s", path, e.msg);
            cr_assert(strstr(e.msg, want), "%s: message lacks '%s': %s", path, want, e.msg);
        }
    }
    fclose(f);
    cr_assert(n_st >= 30 && n_cfg >= 30, "corpus too small: %d safetensors, %d configs", n_st, n_cfg);

    /* every file in the directory is listed */
    DIR *d = opendir("tests/corrupt");
    cr_assert(d);
    struct dirent *de;
    char *tsv = (char *)slurp("tests/corrupt/expect.tsv", &(size_t){0});
    while ((de = readdir(d))) {
        const char *nm = de->d_name;
        size_t l = strlen(nm);
        int is_input = (l > 12 && !strcmp(nm + l - 12, ".safetensors")) || (l > 5 && !strcmp(nm + l - 5, ".json")) ||
                       !strncmp(nm, "fuzz_", 5);
        if (!is_input) continue;
        char key[300];
        snprintf(key, sizeof key, "\n%s\t", nm);
        cr_assert(strstr(tsv, key), "tests/corrupt/%s is not listed in expect.tsv", nm);
    }
    free(tsv);
    closedir(d);
}

/* ---------------------------------------------------------------------------------------------- */
/* config */

Test(io_config, fixtures_load) {
    for (size_t i = 0; i < N_FIXTURES; i++) {
        dsv4_config c;
        dsv4_err e = {{0}};
        cr_assert_eq(dsv4_config_load(fixture_path(fixture_models[i], NULL), &c, &e), 0, "%s: %s",
                     fixture_models[i], e.msg);
        dsv4_config c2;
        cr_assert_eq(dsv4_config_load(fixture_path(fixture_models[i], "config.json"), &c2, &e), 0, "%s", e.msg);
        cr_assert_eq(memcmp(&c, &c2, sizeof c), 0);
        cr_assert_eq(c.n_kv_heads, 1);
        cr_assert_eq(c.hc_mult, 4);
        cr_assert_eq(c.n_compress_ratios, c.n_layers);
        cr_assert_eq(c.tie_word_embeddings, 0);
    }
}

Test(io_config, fixture_values) {
    dsv4_config c;
    dsv4_err e = {{0}};
    cr_assert_eq(dsv4_config_load(fixture_path("tiny-bf16", NULL), &c, &e), 0, "%s", e.msg);
    cr_assert_eq(c.vocab_size, 512);
    cr_assert_eq(c.dim, 64);
    cr_assert_eq(c.moe_inter_dim, 32);
    cr_assert_eq(c.n_layers, 5);
    cr_assert_eq(c.n_hash_layers, 2);
    cr_assert_eq(c.n_mtp_layers, 0);
    cr_assert_eq(c.n_heads, 4);
    cr_assert_eq(c.head_dim, 80);
    cr_assert_eq(c.rope_head_dim, 16);
    cr_assert_eq(c.q_lora_rank, 32);
    cr_assert_eq(c.o_groups, 2);
    cr_assert_eq(c.o_lora_rank, 16);
    cr_assert_eq(c.n_routed_experts, 8);
    cr_assert_eq(c.n_shared_experts, 1);
    cr_assert_eq(c.n_activated_experts, 2);
    cr_assert_float_eq(c.route_scale, 2.5f, 0);
    cr_assert_float_eq(c.swiglu_limit, 1.5f, 0);
    cr_assert_eq(c.window_size, 8);
    cr_assert_float_eq(c.norm_eps, 1e-6f, 0);
    cr_assert_float_eq(c.hc_eps, 1e-6f, 0);
    cr_assert_eq(c.hc_sinkhorn_iters, 20);
    cr_assert_eq(c.index_n_heads, 4);
    cr_assert_eq(c.index_head_dim, 32);
    cr_assert_eq(c.index_topk, 4);
    cr_assert_float_eq(c.rope_theta, 10000.0f, 0);
    cr_assert_float_eq(c.compress_rope_theta, 160000.0f, 0);
    cr_assert_float_eq(c.rope_factor, 4.0f, 0);
    cr_assert_eq(c.original_seq_len, 32);
    cr_assert_float_eq(c.beta_fast, 32.0f, 0);
    cr_assert_float_eq(c.beta_slow, 1.0f, 0);
    cr_assert_eq(c.max_position_embeddings, 128);
    cr_assert_eq(c.bos_token_id, 0);
    cr_assert_eq(c.eos_token_id, 1);
    cr_assert_eq(c.n_compress_ratios, 5);
    int want[5] = {0, 4, 16, 4, 0};
    for (int i = 0; i < 5; i++) cr_assert_eq(c.compress_ratios[i], want[i]);
    cr_assert_eq(c.recipe, DSV4_RECIPE_NONE);
    cr_assert_str_eq(c.quant_method, "");
    cr_assert_eq(c.expert_fp4, 0);
    cr_assert_eq(c.scale_ue8m0, 0);

    cr_assert_eq(dsv4_config_load(fixture_path("small-fp8-fp4", "config.json"), &c, &e), 0, "%s", e.msg);
    cr_assert_eq(c.recipe, DSV4_RECIPE_FP8);
    cr_assert_str_eq(c.quant_method, "fp8");
    cr_assert_eq(c.expert_fp4, 1);
    cr_assert_eq(c.scale_ue8m0, 1);
    cr_assert_eq(c.n_layers, 4);
    cr_assert_eq(c.compress_ratios[1], 32);
    cr_assert_eq(c.head_dim, 128);
    cr_assert_eq(c.original_seq_len, 64);
    cr_assert_float_eq(c.swiglu_limit, 2.0f, 0);

    cr_assert_eq(dsv4_config_load(fixture_path("small-fp8-nvfp4", NULL), &c, &e), 0, "%s", e.msg);
    cr_assert_eq(c.recipe, DSV4_RECIPE_FP8);
    cr_assert_eq(c.expert_fp4, 1);

    cr_assert_eq(dsv4_config_load(fixture_path("tiny-nvfp4-hf", NULL), &c, &e), 0, "%s", e.msg);
    cr_assert_eq(c.recipe, DSV4_RECIPE_MODELOPT);
    cr_assert_str_eq(c.quant_method, "modelopt");
    cr_assert_eq(c.scale_ue8m0, 0);
    cr_assert_eq(c.expert_fp4, 0);
    cr_assert_eq(c.hc_sinkhorn_iters, 20);

    cr_assert_eq(dsv4_config_load(fixture_path("tiny-stable", NULL), &c, &e), 0, "%s", e.msg);
    cr_assert_eq(c.index_topk, 64);
    cr_assert_eq(c.n_hash_layers, 1);

    cr_assert_eq(dsv4_config_load("/nonexistent/config.json", &c, &e), -1);
    cr_assert(strstr(e.msg, "/nonexistent/config.json"), "%s", e.msg);
}

/* Config mutation tests start from tiny-bf16's config.json. */
static cJSON *base_cfg(void) {
    size_t len;
    char *s = (char *)slurp(fixture_path("tiny-bf16", "config.json"), &len);
    cJSON *j = cJSON_ParseWithLength(s, len);
    free(s);
    cr_assert(j);
    return j;
}

static int parse_cfg(cJSON *j, dsv4_config *c, dsv4_err *e) {
    char *s = cJSON_PrintUnformatted(j);
    int rc = dsv4_config_parse(s, strlen(s), "cfg.json", c, e);
    free(s);
    cJSON_Delete(j);
    return rc;
}

/* Replaces (or, with val NULL, deletes) key in obj, then expects an error containing `want`. */
static void cfg_fail(const char *key, cJSON *val, const char *want) {
    cJSON *j = base_cfg();
    if (val)
        cJSON_ReplaceItemInObjectCaseSensitive(j, key, val);
    else
        cJSON_DeleteItemFromObjectCaseSensitive(j, key);
    if (val && !cJSON_GetObjectItemCaseSensitive(j, key)) cJSON_AddItemToObject(j, key, val);
    dsv4_config c;
    dsv4_err e = {{0}};
    cr_assert_eq(parse_cfg(j, &c, &e), -1, "config with %s changed parsed", key);
    cr_assert(strstr(e.msg, "cfg.json"), "no file in: %s", e.msg);
    cr_assert(strstr(e.msg, want), "'%s' not in: %s", want, e.msg);
}

static void cfg_ok(const char *key, cJSON *val, dsv4_config *c) {
    cJSON *j = base_cfg();
    if (val) {
        if (cJSON_GetObjectItemCaseSensitive(j, key))
            cJSON_ReplaceItemInObjectCaseSensitive(j, key, val);
        else
            cJSON_AddItemToObject(j, key, val);
    } else {
        cJSON_DeleteItemFromObjectCaseSensitive(j, key);
    }
    dsv4_err e = {{0}};
    cr_assert_eq(parse_cfg(j, c, &e), 0, "%s: %s", key, e.msg);
}

Test(io_config, missing_required) {
    const char *req[] = {"vocab_size", "hidden_size", "moe_intermediate_size", "num_hidden_layers",
                         "num_attention_heads", "head_dim", "qk_rope_head_dim", "q_lora_rank", "o_groups",
                         "o_lora_rank", "n_routed_experts", "num_experts_per_tok", "sliding_window", "index_n_heads",
                         "index_head_dim", "index_topk", "hc_mult", "compress_ratios", "rope_theta",
                         "compress_rope_theta", "routed_scaling_factor", "rms_norm_eps"};
    for (size_t i = 0; i < sizeof req / sizeof *req; i++) {
        char want[128];
        snprintf(want, sizeof want, "field '%s': required field is missing", req[i]);
        cfg_fail(req[i], NULL, want);
        /* null counts as missing for a required field */
        snprintf(want, sizeof want, "field '%s'", req[i]);
        cfg_fail(req[i], cJSON_CreateNull(), want);
    }
}

Test(io_config, wrong_types) {
    cfg_fail("hidden_size", cJSON_CreateString("64"), "field 'hidden_size': must be an integer (got a string)");
    cfg_fail("num_hidden_layers", cJSON_CreateNumber(4.5), "field 'num_hidden_layers': must be an integer (got 4.5)");
    cfg_fail("vocab_size", cJSON_CreateTrue(), "field 'vocab_size': must be an integer (got a boolean)");
    cfg_fail("head_dim", cJSON_CreateArray(), "field 'head_dim'");
    cfg_fail("rope_theta", cJSON_CreateString("1e4"), "field 'rope_theta': must be a number");
    cfg_fail("rms_norm_eps", cJSON_CreateObject(), "field 'rms_norm_eps'");
    cfg_fail("compress_ratios", cJSON_CreateNumber(4), "field 'compress_ratios': must be an array");
    cfg_fail("compress_ratios", cJSON_Parse("[0, 4, 16.5, 4, 0]"),
             "field 'compress_ratios[2]'");
    cfg_fail("compress_ratios", cJSON_Parse("[0, \"4\", 16, 4, 0]"), "field 'compress_ratios[1]'");
    cfg_fail("rope_scaling", cJSON_CreateString("yarn"), "field 'rope_scaling'");
    cfg_fail("quantization_config", cJSON_CreateString("fp8"), "field 'quantization_config'");
    cfg_fail("tie_word_embeddings", cJSON_CreateString("false"), "field 'tie_word_embeddings'");
    cfg_fail("norm_topk_prob", cJSON_CreateNumber(1), "field 'norm_topk_prob'");
    cfg_fail("scoring_func", cJSON_CreateNumber(1), "field 'scoring_func': must be a string");
    cfg_fail("expert_dtype", cJSON_CreateNumber(4), "field 'expert_dtype'");
    cfg_fail("bos_token_id", cJSON_CreateString("0"), "field 'bos_token_id'");
    /* integral floats are integers */
    dsv4_config c;
    cfg_ok("num_hidden_layers", cJSON_CreateNumber(5.0), &c);
    cr_assert_eq(c.n_layers, 5);
}

Test(io_config, out_of_range) {
    cfg_fail("vocab_size", cJSON_CreateNumber(0), "field 'vocab_size': must be in");
    cfg_fail("hidden_size", cJSON_CreateNumber(-64), "field 'hidden_size': must be in");
    cfg_fail("hidden_size", cJSON_CreateNumber(1 << 24), "field 'hidden_size': must be in");
    cfg_fail("hidden_size", cJSON_CreateNumber(1e300), "field 'hidden_size': must be in");
    cfg_fail("num_hidden_layers", cJSON_CreateNumber(DSV4_MAX_LAYERS + 1), "field 'num_hidden_layers'");
    cfg_fail("num_key_value_heads", cJSON_CreateNumber(2), "field 'num_key_value_heads'");
    cfg_fail("n_shared_experts", cJSON_CreateNumber(2), "field 'n_shared_experts'");
    cfg_fail("sliding_window", cJSON_CreateNumber(0), "field 'sliding_window'");
    cfg_fail("index_topk", cJSON_CreateNumber(0), "field 'index_topk'");
    cfg_fail("hc_mult", cJSON_CreateNumber(0), "field 'hc_mult'");
    cfg_fail("rms_norm_eps", cJSON_CreateNumber(0), "field 'rms_norm_eps'");
    cfg_fail("rms_norm_eps", cJSON_CreateNumber(1), "field 'rms_norm_eps'");
    cfg_fail("rms_norm_eps", cJSON_CreateNumber(-1e-6), "field 'rms_norm_eps'");
    cfg_fail("rms_norm_eps", cJSON_CreateNumber(1e-206), "field 'rms_norm_eps'"); /* > 0 but 0 as a float */
    cfg_fail("rms_norm_eps", cJSON_CreateNumber(0.99999999999), "field 'rms_norm_eps'"); /* 1 as a float */
    cfg_fail("swiglu_limit", cJSON_CreateNumber(1e-60), "field 'swiglu_limit'");
    cfg_fail("rope_theta", cJSON_CreateNumber(0), "field 'rope_theta'");
    cfg_fail("rope_theta", cJSON_CreateNumber(1e300), "field 'rope_theta'");
    cfg_fail("routed_scaling_factor", cJSON_CreateNumber(-1), "field 'routed_scaling_factor'");
    cfg_fail("swiglu_limit", cJSON_CreateNumber(-1), "field 'swiglu_limit'");
    cfg_fail("hc_eps", cJSON_CreateNumber(0), "field 'hc_eps'");
    cfg_fail("bos_token_id", cJSON_CreateNumber(512), "field 'bos_token_id'");
    cfg_fail("eos_token_id", cJSON_CreateNumber(-1), "field 'eos_token_id'");
    cfg_fail("compress_ratios", cJSON_Parse("[0, 4, 1, 4, 0]"), "field 'compress_ratios[2]': must be 0 or in");
    cfg_fail("compress_ratios", cJSON_Parse("[0, -4, 16, 4, 0]"), "field 'compress_ratios[1]': must be 0 or in");
    cfg_fail("tie_word_embeddings", cJSON_CreateTrue(), "field 'tie_word_embeddings': must be false");
    cfg_fail("model_type", cJSON_CreateString("deepseek_v3"), "field 'model_type'");
    cfg_fail("scoring_func", cJSON_CreateString("softmax"), "field 'scoring_func'");
    cfg_fail("topk_method", cJSON_CreateString("group_limited_greedy"), "field 'topk_method'");
    cfg_fail("expert_dtype", cJSON_CreateString("int4"), "field 'expert_dtype'");
}

Test(io_config, inconsistent) {
    cfg_fail("o_groups", cJSON_CreateNumber(3), "field 'o_groups': must divide num_attention_heads");
    cfg_fail("head_dim", cJSON_CreateNumber(16), "field 'head_dim': must be > qk_rope_head_dim (got 16 <= 16)");
    cfg_fail("qk_rope_head_dim", cJSON_CreateNumber(15), "field 'qk_rope_head_dim': must be even");
    cfg_fail("index_head_dim", cJSON_CreateNumber(8), "field 'index_head_dim': must be >= qk_rope_head_dim");
    cfg_fail("index_head_dim", cJSON_CreateNumber(33), "field 'index_head_dim': must be even");
    cfg_fail("num_experts_per_tok", cJSON_CreateNumber(9), "field 'num_experts_per_tok': must be <= n_routed_experts");
    cfg_fail("num_hash_layers", cJSON_CreateNumber(6), "field 'num_hash_layers': must be <= num_hidden_layers");
    cfg_fail("compress_ratios", cJSON_Parse("[0, 4, 16, 4]"), "field 'compress_ratios': must have");
    cfg_fail("compress_ratios", cJSON_Parse("[0, 4, 16, 4, 0, 0]"), "field 'compress_ratios': must have");
    cfg_fail("compress_ratios", cJSON_Parse("[]"), "field 'compress_ratios': must have");
    cfg_fail("num_hidden_layers", cJSON_CreateNumber(3), "field 'compress_ratios': must have num_hidden_layers = 3");
    cJSON *j = base_cfg();
    cJSON_ReplaceItemInObjectCaseSensitive(j, "num_hidden_layers", cJSON_CreateNumber(DSV4_MAX_LAYERS));
    cJSON_ReplaceItemInObjectCaseSensitive(j, "num_nextn_predict_layers", cJSON_CreateNumber(1));
    dsv4_config c;
    dsv4_err e = {{0}};
    cr_assert_eq(parse_cfg(j, &c, &e), -1);
    cr_assert(strstr(e.msg, "'num_nextn_predict_layers'"), "%s", e.msg);
}

Test(io_config, compress_ratios_with_mtp) {
    dsv4_config c;
    cJSON *j = base_cfg();
    cJSON_ReplaceItemInObjectCaseSensitive(j, "num_nextn_predict_layers", cJSON_CreateNumber(1));
    cJSON_ReplaceItemInObjectCaseSensitive(j, "compress_ratios", cJSON_Parse("[0, 4, 128, 4, 0, 0]"));
    dsv4_err e = {{0}};
    cr_assert_eq(parse_cfg(j, &c, &e), 0, "%s", e.msg);
    cr_assert_eq(c.n_mtp_layers, 1);
    cr_assert_eq(c.n_compress_ratios, 6);
    cr_assert_eq(c.compress_ratios[2], 128);
    /* n_layers entries also accepted with an MTP layer */
    j = base_cfg();
    cJSON_ReplaceItemInObjectCaseSensitive(j, "num_nextn_predict_layers", cJSON_CreateNumber(1));
    cr_assert_eq(parse_cfg(j, &c, &e), 0, "%s", e.msg);
    cr_assert_eq(c.n_compress_ratios, 5);
    j = base_cfg();
    cJSON_ReplaceItemInObjectCaseSensitive(j, "num_nextn_predict_layers", cJSON_CreateNumber(1));
    cJSON_ReplaceItemInObjectCaseSensitive(j, "compress_ratios", cJSON_Parse("[0, 4, 128, 4, 0, 0, 0]"));
    cr_assert_eq(parse_cfg(j, &c, &e), -1);
    cr_assert(strstr(e.msg, "'compress_ratios'") && strstr(e.msg, "num_nextn_predict_layers"), "%s", e.msg);
}

Test(io_config, defaults) {
    const char *opt[] = {"num_hash_layers", "num_nextn_predict_layers", "num_key_value_heads", "n_shared_experts",
                         "swiglu_limit", "hc_eps", "hc_sinkhorn_iters", "scoring_func", "norm_topk_prob",
                         "topk_method", "max_position_embeddings", "bos_token_id", "eos_token_id",
                         "tie_word_embeddings", "model_type", "rope_scaling"};
    cJSON *j = base_cfg();
    for (size_t i = 0; i < sizeof opt / sizeof *opt; i++) cJSON_DeleteItemFromObjectCaseSensitive(j, opt[i]);
    dsv4_config c;
    dsv4_err e = {{0}};
    cr_assert_eq(parse_cfg(j, &c, &e), 0, "%s", e.msg);
    cr_assert_eq(c.n_hash_layers, 0);
    cr_assert_eq(c.n_mtp_layers, 0);
    cr_assert_eq(c.n_kv_heads, 1);
    cr_assert_eq(c.n_shared_experts, 1);
    cr_assert_float_eq(c.swiglu_limit, 0.0f, 0);
    cr_assert_float_eq(c.hc_eps, 1e-6f, 0);
    cr_assert_eq(c.hc_sinkhorn_iters, 20);
    cr_assert_eq(c.max_position_embeddings, 1048576);
    cr_assert_eq(c.bos_token_id, 0);
    cr_assert_eq(c.eos_token_id, 1);
    cr_assert_eq(c.original_seq_len, 0);
    cr_assert_float_eq(c.rope_factor, 1.0f, 0);
    cr_assert_eq(c.recipe, DSV4_RECIPE_NONE);

    cfg_ok("rope_scaling", cJSON_CreateNull(), &c);
    cr_assert_eq(c.original_seq_len, 0);
    cfg_ok("n_shared_experts", cJSON_CreateNumber(0), &c);
    cr_assert_eq(c.n_shared_experts, 0);
    cfg_ok("eos_token_id", cJSON_Parse("[1, 2]"), &c);
    cr_assert_eq(c.eos_token_id, 1);
    cfg_ok("expert_dtype", cJSON_CreateString("fp8"), &c);
    cr_assert_eq(c.expert_fp4, 0);
    cfg_ok("expert_dtype", cJSON_CreateString("bf16"), &c);
    cfg_ok("expert_dtype", cJSON_CreateNull(), &c);
    cfg_ok("expert_dtype", cJSON_CreateString("fp4"), &c);
    cr_assert_eq(c.expert_fp4, 1);
}

Test(io_config, rope_scaling) {
    dsv4_config c;
    cfg_ok("rope_scaling", cJSON_Parse("{\"rope_type\": \"yarn\", \"factor\": 16, \"original_max_position_embeddings\": 65536}"), &c);
    cr_assert_float_eq(c.rope_factor, 16.0f, 0);
    cr_assert_eq(c.original_seq_len, 65536);
    cr_assert_float_eq(c.beta_fast, 32.0f, 0);
    cr_assert_float_eq(c.beta_slow, 1.0f, 0);
    cfg_fail("rope_scaling", cJSON_Parse("{\"type\": \"linear\", \"factor\": 4, \"original_max_position_embeddings\": 32}"),
             "field 'rope_scaling.type'");
    cfg_fail("rope_scaling", cJSON_Parse("{\"factor\": 4, \"original_max_position_embeddings\": 32}"),
             "field 'rope_scaling.type'");
    cfg_fail("rope_scaling", cJSON_Parse("{\"type\": \"yarn\", \"factor\": 0.5, \"original_max_position_embeddings\": 32}"),
             "field 'rope_scaling.factor'");
    cfg_fail("rope_scaling", cJSON_Parse("{\"type\": \"yarn\", \"original_max_position_embeddings\": 32}"),
             "field 'rope_scaling.factor'");
    cfg_fail("rope_scaling", cJSON_Parse("{\"type\": \"yarn\", \"factor\": 4}"),
             "field 'rope_scaling.original_max_position_embeddings'");
    cfg_fail("rope_scaling", cJSON_Parse("{\"type\": \"yarn\", \"factor\": 4, \"original_max_position_embeddings\": 0}"),
             "field 'rope_scaling.original_max_position_embeddings'");
    cfg_fail("rope_scaling", cJSON_Parse("{\"type\": \"yarn\", \"factor\": 4, \"original_max_position_embeddings\": 32, \"beta_fast\": \"x\"}"),
             "field 'rope_scaling.beta_fast'");
}

Test(io_config, quantization_config) {
    dsv4_config c;
    cfg_ok("quantization_config", cJSON_Parse("{\"quant_method\": \"fp8\"}"), &c);
    cr_assert_eq(c.recipe, DSV4_RECIPE_FP8);
    cr_assert_eq(c.scale_ue8m0, 1);
    cfg_ok("quantization_config", cJSON_Parse("{\"quant_method\": \"fp8\", \"weight_block_size\": [128, 128], \"fmt\": \"e4m3\", \"scale_fmt\": \"ue8m0\"}"), &c);
    cr_assert_eq(c.recipe, DSV4_RECIPE_FP8);
    cfg_ok("quantization_config", cJSON_Parse("{\"quant_method\": \"modelopt\", \"quant_algo\": \"NVFP4\"}"), &c);
    cr_assert_eq(c.recipe, DSV4_RECIPE_MODELOPT);
    cfg_ok("quantization_config", cJSON_CreateNull(), &c);
    cr_assert_eq(c.recipe, DSV4_RECIPE_NONE);
    cfg_fail("quantization_config", cJSON_Parse("{\"quant_method\": \"gptq\"}"), "field 'quantization_config.quant_method'");
    cfg_fail("quantization_config", cJSON_Parse("{\"quant_method\": 8}"), "field 'quantization_config.quant_method'");
    cfg_fail("quantization_config", cJSON_Parse("{\"fmt\": \"e4m3\"}"), "field 'quantization_config.quant_method'");
    cfg_fail("quantization_config", cJSON_Parse("{\"quant_method\": \"fp8\", \"weight_block_size\": [64, 64]}"),
             "field 'quantization_config.weight_block_size'");
    cfg_fail("quantization_config", cJSON_Parse("{\"quant_method\": \"fp8\", \"weight_block_size\": [128]}"),
             "field 'quantization_config.weight_block_size'");
    cfg_fail("quantization_config", cJSON_Parse("{\"quant_method\": \"fp8\", \"fmt\": \"e5m2\"}"),
             "field 'quantization_config.fmt'");
    cfg_fail("quantization_config", cJSON_Parse("{\"quant_method\": \"fp8\", \"scale_fmt\": \"fp32\"}"),
             "field 'quantization_config.scale_fmt'");
}

Test(io_config, malformed_json) {
    dsv4_config c;
    dsv4_err e = {{0}};
    const char *bad[] = {"", "{", "[1]", "null", "{\"a\":1} x", "{\"vocab_size\": 1", "\"str\""};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        e.msg[0] = 0;
        cr_assert_eq(dsv4_config_parse(bad[i], strlen(bad[i]), "m.json", &c, &e), -1, "parsed: %s", bad[i]);
        cr_assert(strstr(e.msg, "m.json"), "%s", e.msg);
    }
    /* a key given twice */
    cJSON *j = base_cfg();
    char *s = cJSON_PrintUnformatted(j);
    cJSON_Delete(j);
    size_t n = strlen(s);
    char *s2 = malloc(n + 32);
    memcpy(s2, s, n - 1);
    strcpy(s2 + n - 1, ",\"head_dim\":96}");
    cr_assert_eq(dsv4_config_parse(s2, strlen(s2), "m.json", &c, &e), -1);
    cr_assert(strstr(e.msg, "'head_dim'"), "%s", e.msg);
    /* every truncation of a valid config fails cleanly */
    for (size_t k = 0; k + 1 < n; k++) {
        cr_assert_eq(dsv4_config_parse(s, k, "m.json", &c, &e), -1, "truncated at %zu parsed", k);
        cr_assert(strstr(e.msg, "m.json"));
    }
    cr_assert_eq(dsv4_config_parse(s, n, "m.json", &c, &e), 0, "%s", e.msg);
    free(s);
    free(s2);
}
