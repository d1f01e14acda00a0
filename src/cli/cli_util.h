/* cli_util.h - small helpers shared by the subcommands. */
#ifndef DSV4_CLI_UTIL_H
#define DSV4_CLI_UTIL_H

#include <stddef.h>

/* Reads a whole file (or stdin for "-"), NUL-terminated; prints an error naming the path on failure. */
char *dsv4_cli_read_file(const char *path, size_t *len);
/* Strict integer parse in [lo, hi]; 0 ok. */
int dsv4_cli_parse_long(const char *s, long lo, long hi, long *out);
double dsv4_cli_now(void);
/* n > 0: use n CPU threads; 0: leave the default. */
void dsv4_cli_set_threads(int n);

#endif
