/* strbuf.h - the growable byte / string buffer every layer writes into, and whole-file reads.
 *
 * A dsv4_sb starts zeroed (`dsv4_sb b = {0};` or dsv4_sb_init) and grows geometrically. Once anything
 * was written, p is NUL-terminated (p[n] == 0), so it is a C string when the bytes hold no NUL.
 * Allocation failure is sticky: the function that hit it returns -1, sets oom, and every later write
 * is a no-op returning -1, so a caller may write a run of pieces and check once (b.oom, or
 * dsv4_sb_take returning NULL). Nothing here aborts. */
#ifndef DSV4_UTIL_STRBUF_H
#define DSV4_UTIL_STRBUF_H

#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>

#include "err.h"

typedef struct dsv4_sb {
    char *p;      /* NUL-terminated once anything was written (NULL before) */
    size_t n, cap;
    int oom;      /* set when an allocation failed; every later write is a no-op */
} dsv4_sb;

void dsv4_sb_init(dsv4_sb *b);
/* Room for extra more bytes (and the NUL) without another allocation. 0, or -1 out of memory. */
int dsv4_sb_reserve(dsv4_sb *b, size_t extra);
/* Appends n bytes of s (s may be NULL when n is 0). 0, or -1 out of memory. */
int dsv4_sb_put(dsv4_sb *b, const void *s, size_t n);
int dsv4_sb_puts(dsv4_sb *b, const char *s);
int dsv4_sb_putc(dsv4_sb *b, char c);
/* Appends printf output. 0, or -1 (out of memory, or an encoding error: then b is unchanged and
 * oom is not set). */
int dsv4_sb_printf(dsv4_sb *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
int dsv4_sb_vprintf(dsv4_sb *b, const char *fmt, va_list ap) __attribute__((format(printf, 2, 0)));
/* Empties b and keeps its memory (an oom stays set). */
void dsv4_sb_clear(dsv4_sb *b);
/* Detaches the bytes: returns them (free() them; "" when nothing was written, NULL only when out of
 * memory), their length in *len (may be NULL), and resets b to empty. */
char *dsv4_sb_take(dsv4_sb *b, size_t *len);
/* Frees the bytes and resets b to empty (b itself is not freed). */
void dsv4_sb_free(dsv4_sb *b);

/* ---- whole-file reads ---- */

/* Reads f to its end into a new NUL-terminated buffer (free() it), its length in *len (may be NULL).
 * limit: the most bytes accepted (0: no limit). name only names f in messages. NULL on failure with
 * err set: "NAME: out of memory", "NAME: file too large (over LIMIT bytes)", "NAME: read error".
 * f is not closed. */
char *dsv4_read_stream(FILE *f, const char *name, size_t limit, size_t *len, dsv4_err *err);
/* Opens path and reads it like dsv4_read_stream; also "PATH: cannot open: REASON". */
char *dsv4_read_file(const char *path, size_t limit, size_t *len, dsv4_err *err);

#endif
