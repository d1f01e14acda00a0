/* err.h - error reporting shared by every layer below the CLI.
 *
 * Nothing below src/cli prints or exits on bad input: a function that can fail takes a dsv4_err *,
 * fills it with one line naming the file, tensor, field or request at fault, and returns -1. */
#ifndef DSV4_UTIL_ERR_H
#define DSV4_UTIL_ERR_H

#include <stddef.h>

typedef struct dsv4_err {
    char msg[1024];
} dsv4_err;

/* Formats the message into e (if e is not NULL) and returns -1, so callers can write
 * `return dsv4_errf(err, "...", ...);`. */
int dsv4_errf(dsv4_err *e, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Prefixes an existing message with context ("loading X: "), returns -1. */
int dsv4_err_prefix(dsv4_err *e, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#endif
