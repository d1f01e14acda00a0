/* cmd_inspect.c - placeholder until implemented. */
#include <stdio.h>
#include "cmds.h"
int dsv4_cmd_inspect(int argc, char **argv) { (void)argc; fprintf(stderr, "dsv4 %s: not implemented yet\n", argv[0]); return 2; }
