/* cli_util.c - see cli_util.h. */
#include "cli_util.h"

#include <errno.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "util/strbuf.h"

char *dsv4_cli_read_file(const char *path, size_t *len) {
    dsv4_err e = {{0}};
    char *buf = strcmp(path, "-") ? dsv4_read_file(path, 0, len, &e) : dsv4_read_stream(stdin, "stdin", 0, len, &e);
    if (!buf) fprintf(stderr, "dsv4: %s\n", e.msg);
    return buf;
}

int dsv4_cli_parse_long(const char *s, long lo, long hi, long *out) {
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi) return -1;
    *out = v;
    return 0;
}

double dsv4_cli_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

void dsv4_cli_set_threads(int n) {
    if (n > 0) omp_set_num_threads(n);
}
