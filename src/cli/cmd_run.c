/* cmd_run.c - placeholder until implemented. */
#include <stdio.h>
#include "cmds.h"
int dsv4_cmd_run(int argc, char **argv) { (void)argc; fprintf(stderr, "dsv4 %s: not implemented yet\n", argv[0]); return 2; }
int dsv4_cmd_chat(int argc, char **argv) { (void)argc; fprintf(stderr, "dsv4 %s: not implemented yet\n", argv[0]); return 2; }
