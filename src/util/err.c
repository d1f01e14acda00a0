/* err.c - see err.h. */
#include "err.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

int dsv4_errf(dsv4_err *e, const char *fmt, ...) {
    if (!e) return -1;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->msg, sizeof e->msg, fmt, ap);
    va_end(ap);
    return -1;
}

int dsv4_err_prefix(dsv4_err *e, const char *fmt, ...) {
    if (!e) return -1;
    char pre[512], old[sizeof e->msg];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(pre, sizeof pre, fmt, ap);
    va_end(ap);
    memcpy(old, e->msg, sizeof old);
    size_t n = strlen(pre);
    if (n >= sizeof e->msg) n = sizeof e->msg - 1;
    memcpy(e->msg, pre, n);
    size_t m = strnlen(old, sizeof old - 1);
    if (m > sizeof e->msg - 1 - n) m = sizeof e->msg - 1 - n;
    memcpy(e->msg + n, old, m);
    e->msg[n + m] = 0;
    return -1;
}
