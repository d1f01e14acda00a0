/* cmd_chat_template.c - placeholder until implemented. */
#include <stdio.h>
#include "cmds.h"
int dsv4_cmd_chat_template(int argc, char **argv) { (void)argc; fprintf(stderr, "dsv4 %s: not implemented yet\n", argv[0]); return 2; }
int dsv4_cmd_parse_completion(int argc, char **argv) { (void)argc; fprintf(stderr, "dsv4 %s: not implemented yet\n", argv[0]); return 2; }
