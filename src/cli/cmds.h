/* cmds.h - the dsv4 subcommands. Each lives in its own src/cli/cmd_*.c file, takes the arguments
 * after the subcommand name (argv[0] = the subcommand), prints results to stdout and logs/errors to
 * stderr, answers --help, and returns the process exit status. */
#ifndef DSV4_CLI_CMDS_H
#define DSV4_CLI_CMDS_H

int dsv4_cmd_logits(int argc, char **argv);          /* cmd_logits.c */
int dsv4_cmd_inspect(int argc, char **argv);         /* cmd_inspect.c */
int dsv4_cmd_tokenize(int argc, char **argv);        /* cmd_tokenize.c */
int dsv4_cmd_detokenize(int argc, char **argv);      /* cmd_tokenize.c */
int dsv4_cmd_chat_template(int argc, char **argv);   /* cmd_chat_template.c */
int dsv4_cmd_parse_completion(int argc, char **argv);/* cmd_chat_template.c */
int dsv4_cmd_run(int argc, char **argv);             /* cmd_run.c */
int dsv4_cmd_chat(int argc, char **argv);            /* cmd_run.c */
int dsv4_cmd_synth(int argc, char **argv);           /* cmd_synth.c */
int dsv4_cmd_serve(int argc, char **argv);           /* cmd_serve.c */
int dsv4_cmd_bench(int argc, char **argv);           /* cmd_bench.c */

#endif
