/* strbuf.c - see strbuf.h. */
#include "strbuf.h"

#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

void dsv4_sb_init(dsv4_sb *b) {
    b->p = NULL;
    b->n = b->cap = 0;
    b->oom = 0;
}

int dsv4_sb_reserve(dsv4_sb *b, size_t extra) {
    if (b->oom) return -1;
    if (extra >= SIZE_MAX - b->n) {
        b->oom = 1;
        return -1;
    }
    size_t need = b->n + extra + 1;
    if (need <= b->cap) return 0;
    size_t cap = b->cap ? b->cap : 64;
    while (cap < need) cap = cap > SIZE_MAX / 2 ? need : cap * 2;
    char *p = realloc(b->p, cap);
    if (!p) {
        b->oom = 1;
        return -1;
    }
    b->p = p;
    b->cap = cap;
    return 0;
}

int dsv4_sb_put(dsv4_sb *b, const void *s, size_t n) {
    if (dsv4_sb_reserve(b, n)) return -1;
    if (n) memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
    return 0;
}

int dsv4_sb_puts(dsv4_sb *b, const char *s) { return dsv4_sb_put(b, s, strlen(s)); }

int dsv4_sb_putc(dsv4_sb *b, char c) { return dsv4_sb_put(b, &c, 1); }

int dsv4_sb_vprintf(dsv4_sb *b, const char *fmt, va_list ap) {
    if (b->oom) return -1;
    size_t room = b->cap > b->n ? b->cap - b->n : 0; /* including the NUL */
    va_list aq;
    va_copy(aq, ap);
    int k = vsnprintf(room ? b->p + b->n : NULL, room, fmt, aq);
    va_end(aq);
    if (k >= 0 && (size_t)k >= room) { /* did not fit: grow, then format again */
        if (dsv4_sb_reserve(b, (size_t)k)) {
            if (b->p) b->p[b->n] = 0;
            return -1;
        }
        k = vsnprintf(b->p + b->n, (size_t)k + 1, fmt, ap);
    }
    if (k < 0) {
        if (b->p) b->p[b->n] = 0;
        return -1;
    }
    b->n += (size_t)k;
    return 0;
}

int dsv4_sb_printf(dsv4_sb *b, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int rc = dsv4_sb_vprintf(b, fmt, ap);
    va_end(ap);
    return rc;
}

void dsv4_sb_clear(dsv4_sb *b) {
    b->n = 0;
    if (b->p) b->p[0] = 0;
}

char *dsv4_sb_take(dsv4_sb *b, size_t *len) {
    if (!b->oom && !b->p) dsv4_sb_put(b, "", 0);
    char *p = b->oom ? NULL : b->p;
    if (b->oom) free(b->p);
    if (len) *len = p ? b->n : 0;
    dsv4_sb_init(b);
    return p;
}

void dsv4_sb_free(dsv4_sb *b) {
    free(b->p);
    dsv4_sb_init(b);
}

/* ---- whole-file reads ---- */

char *dsv4_read_stream(FILE *f, const char *name, size_t limit, size_t *len, dsv4_err *err) {
    dsv4_sb b = {0};
    for (;;) {
        if (dsv4_sb_reserve(&b, 1 << 16)) {
            dsv4_sb_free(&b);
            dsv4_errf(err, "%s: out of memory", name);
            return NULL;
        }
        size_t want = b.cap - b.n - 1;
        if (limit && want > limit - b.n + 1) want = limit - b.n + 1; /* one byte past the limit tells */
        size_t r = fread(b.p + b.n, 1, want, f);
        b.n += r;
        b.p[b.n] = 0;
        if (limit && b.n > limit) {
            dsv4_sb_free(&b);
            dsv4_errf(err, "%s: file too large (over %zu bytes)", name, limit);
            return NULL;
        }
        if (r < want) break;
    }
    if (ferror(f)) {
        dsv4_sb_free(&b);
        dsv4_errf(err, "%s: read error", name);
        return NULL;
    }
    return dsv4_sb_take(&b, len);
}

char *dsv4_read_file(const char *path, size_t limit, size_t *len, dsv4_err *err) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        dsv4_errf(err, "%s: cannot open: %s", path, strerror(errno));
        return NULL;
    }
    char *p = dsv4_read_stream(f, path, limit, len, err);
    fclose(f);
    return p;
}
