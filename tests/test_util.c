/* test_util.c - src/util: the growable byte buffer (dsv4_sb), whole-file reads, dsv4_json_kind. */
#include <criterion/criterion.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "util/json.h"
#include "util/strbuf.h"

Test(strbuf, append_and_take) {
    dsv4_sb b;
    dsv4_sb_init(&b);
    cr_assert_null(b.p);
    cr_assert_eq(dsv4_sb_puts(&b, "ab"), 0);
    cr_assert_eq(dsv4_sb_putc(&b, 'c'), 0);
    cr_assert_eq(dsv4_sb_put(&b, "d\0e", 3), 0); /* bytes, NUL included */
    cr_assert_eq(dsv4_sb_put(&b, NULL, 0), 0);
    cr_assert_eq(b.n, 6);
    cr_assert_eq(memcmp(b.p, "abcd\0e", 7), 0, "NUL-terminated after the bytes");
    size_t len = 0;
    char *p = dsv4_sb_take(&b, &len);
    cr_assert_eq(len, 6);
    cr_assert_eq(memcmp(p, "abcd\0e", 7), 0);
    cr_assert(b.p == NULL && b.n == 0 && b.cap == 0 && !b.oom, "take resets the buffer");
    free(p);
}

Test(strbuf, take_empty_is_empty_string) {
    dsv4_sb b = {0};
    size_t len = 7;
    char *p = dsv4_sb_take(&b, &len);
    cr_assert_not_null(p);
    cr_assert_str_eq(p, "");
    cr_assert_eq(len, 0);
    free(p);
    dsv4_sb_free(&b); /* freeing an empty buffer is fine */
}

Test(strbuf, grows_and_keeps_content) {
    dsv4_sb b = {0};
    for (int i = 0; i < 100000; i++) cr_assert_eq(dsv4_sb_putc(&b, (char)('a' + i % 26)), 0);
    cr_assert_eq(b.n, 100000);
    cr_assert_geq(b.cap, b.n + 1);
    for (int i = 0; i < 100000; i++) cr_assert_eq(b.p[i], (char)('a' + i % 26));
    cr_assert_eq(b.p[b.n], 0);
    dsv4_sb_free(&b);
    cr_assert(b.p == NULL && b.n == 0 && b.cap == 0);
}

Test(strbuf, reserve) {
    dsv4_sb b = {0};
    cr_assert_eq(dsv4_sb_reserve(&b, 1000), 0);
    cr_assert_geq(b.cap, 1001);
    char *before = b.p;
    for (int i = 0; i < 1000; i++) dsv4_sb_putc(&b, 'x');
    cr_assert_eq(b.p, before, "no reallocation within the reserved room");
    cr_assert_eq(b.n, 1000);
    dsv4_sb_free(&b);
}

Test(strbuf, printf) {
    dsv4_sb b = {0};
    cr_assert_eq(dsv4_sb_printf(&b, "%d-%s", 42, "x"), 0);
    cr_assert_str_eq(b.p, "42-x");
    /* longer than the room left: grows and formats again */
    char big[3000];
    memset(big, 'q', sizeof big - 1);
    big[sizeof big - 1] = 0;
    cr_assert_eq(dsv4_sb_printf(&b, "[%s]%llu", big, (unsigned long long)UINT64_MAX), 0);
    cr_assert_eq(b.n, 4 + 1 + 2999 + 1 + 20);
    cr_assert_eq(strncmp(b.p, "42-x[qqq", 8), 0);
    cr_assert_str_eq(b.p + b.n - 21, "]18446744073709551615");
    cr_assert_eq(dsv4_sb_printf(&b, "%s", ""), 0);
    cr_assert_eq(b.n, 4 + 1 + 2999 + 1 + 20);
    dsv4_sb_free(&b);
}

Test(strbuf, clear_keeps_memory) {
    dsv4_sb b = {0};
    dsv4_sb_puts(&b, "hello");
    char *p = b.p;
    dsv4_sb_clear(&b);
    cr_assert_eq(b.n, 0);
    cr_assert_str_eq(b.p, "");
    dsv4_sb_puts(&b, "hi");
    cr_assert_eq(b.p, p);
    cr_assert_str_eq(b.p, "hi");
    dsv4_sb_free(&b);
}

/* A size that cannot be allocated: the buffer turns out-of-memory for good, nothing aborts. */
Test(strbuf, out_of_memory_is_sticky) {
    dsv4_sb b = {0};
    cr_assert_eq(dsv4_sb_puts(&b, "keep"), 0);
    cr_assert_eq(dsv4_sb_reserve(&b, SIZE_MAX - 2), -1);
    cr_assert(b.oom);
    cr_assert_str_eq(b.p, "keep", "the bytes written before stay as they were");
    cr_assert_eq(dsv4_sb_puts(&b, "more"), -1);
    cr_assert_eq(dsv4_sb_putc(&b, 'c'), -1);
    cr_assert_eq(dsv4_sb_printf(&b, "%d", 1), -1);
    cr_assert_eq(dsv4_sb_reserve(&b, 1), -1);
    cr_assert_eq(b.n, 4);
    size_t len = 9;
    cr_assert_null(dsv4_sb_take(&b, &len));
    cr_assert_eq(len, 0);
    cr_assert(!b.oom && b.p == NULL, "take frees and resets");
    cr_assert_eq(dsv4_sb_puts(&b, "again"), 0, "usable again after take");
    dsv4_sb_free(&b);
}

/* ---- whole-file reads ---- */

static char *tmp_file(const void *data, size_t n) {
    char *path = strdup("/tmp/dsv4_test_util_XXXXXX");
    int fd = mkstemp(path);
    cr_assert_geq(fd, 0);
    cr_assert_eq(write(fd, data, n), (ssize_t)n);
    close(fd);
    return path;
}

Test(read_file, whole_file) {
    size_t n = 300000; /* several growth steps */
    char *data = malloc(n);
    for (size_t i = 0; i < n; i++) data[i] = (char)(i * 7 + 1);
    char *path = tmp_file(data, n);
    dsv4_err e = {{0}};
    size_t len = 0;
    char *got = dsv4_read_file(path, 0, &len, &e);
    cr_assert_not_null(got, "%s", e.msg);
    cr_assert_eq(len, n);
    cr_assert_eq(memcmp(got, data, n), 0);
    cr_assert_eq(got[n], 0);
    free(got);
    got = dsv4_read_file(path, n, &len, &e); /* exactly at the limit */
    cr_assert_not_null(got, "%s", e.msg);
    cr_assert_eq(len, n);
    free(got);
    cr_assert_null(dsv4_read_file(path, n - 1, &len, &e));
    cr_assert(strstr(e.msg, "file too large") && strstr(e.msg, path), "%s", e.msg);
    unlink(path);
    free(path);
    free(data);
}

Test(read_file, empty_and_missing) {
    char *path = tmp_file("", 0);
    dsv4_err e = {{0}};
    size_t len = 5;
    char *got = dsv4_read_file(path, 16, &len, &e);
    cr_assert_not_null(got, "%s", e.msg);
    cr_assert_str_eq(got, "");
    cr_assert_eq(len, 0);
    free(got);
    unlink(path);
    cr_assert_null(dsv4_read_file(path, 0, &len, &e));
    cr_assert(strstr(e.msg, "cannot open") && strstr(e.msg, path), "%s", e.msg);
    free(path);
}

Test(read_file, stream) {
    FILE *f = tmpfile();
    cr_assert_not_null(f);
    fputs("{\"a\": 1}", f);
    rewind(f);
    dsv4_err e = {{0}};
    size_t len = 0;
    char *got = dsv4_read_stream(f, "stdin", 0, &len, &e);
    cr_assert_not_null(got, "%s", e.msg);
    cr_assert_str_eq(got, "{\"a\": 1}");
    cr_assert_eq(len, 8);
    free(got);
    rewind(f);
    cr_assert_null(dsv4_read_stream(f, "stdin", 4, &len, &e));
    cr_assert_str_eq(e.msg, "stdin: file too large (over 4 bytes)");
    fclose(f);
}

/* ---- json ---- */

Test(json, kind) {
    cJSON *o = cJSON_Parse("{\"n\":null,\"t\":true,\"f\":false,\"x\":1.5,\"s\":\"v\",\"a\":[],\"o\":{}}");
    cr_assert_not_null(o);
    cr_assert_str_eq(dsv4_json_kind(NULL), "missing");
    cr_assert_str_eq(dsv4_json_kind(cJSON_GetObjectItem(o, "n")), "null");
    cr_assert_str_eq(dsv4_json_kind(cJSON_GetObjectItem(o, "t")), "a boolean");
    cr_assert_str_eq(dsv4_json_kind(cJSON_GetObjectItem(o, "f")), "a boolean");
    cr_assert_str_eq(dsv4_json_kind(cJSON_GetObjectItem(o, "x")), "a number");
    cr_assert_str_eq(dsv4_json_kind(cJSON_GetObjectItem(o, "s")), "a string");
    cr_assert_str_eq(dsv4_json_kind(cJSON_GetObjectItem(o, "a")), "an array");
    cr_assert_str_eq(dsv4_json_kind(cJSON_GetObjectItem(o, "o")), "an object");
    cJSON_Delete(o);
}
