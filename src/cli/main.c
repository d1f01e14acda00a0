/* main.c - the dsv4 command line: dispatches to one src/cli/cmd_*.c per subcommand. */
#include <stdio.h>
#include <string.h>

#include "cmds.h"

typedef struct {
    const char *name;
    int (*fn)(int, char **);
    const char *help;
} dsv4_cmd;

static const dsv4_cmd cmds[] = {
    {"logits", dsv4_cmd_logits, "run token ids through the model, write every position's logits"},
    {"inspect", dsv4_cmd_inspect, "summarize a checkpoint: config, tensors by format, bytes"},
    {"tokenize", dsv4_cmd_tokenize, "text on stdin -> JSON token ids on stdout"},
    {"detokenize", dsv4_cmd_detokenize, "JSON token ids on stdin -> text on stdout"},
    {"chat-template", dsv4_cmd_chat_template, "JSON message list on stdin -> DeepSeek-V4 prompt text"},
    {"parse-completion", dsv4_cmd_parse_completion, "completion text on stdin -> JSON message"},
    {"run", dsv4_cmd_run, "generate text from a prompt"},
    {"chat", dsv4_cmd_chat, "interactive chat, streaming"},
    {"synth", dsv4_cmd_synth, "write a small synthetic DeepSeek-V4 checkpoint (random weights)"},
    {"serve", dsv4_cmd_serve, "OpenAI- and Anthropic-compatible HTTP server with continuous batching"},
    {"bench", dsv4_cmd_bench, "decode / prefill speed at the real Flash / Pro shapes vs the memory roofline"},
};

static void usage(FILE *f) {
    fprintf(f, "usage: dsv4 COMMAND [options]   (dsv4 COMMAND --help for its options)\n\ncommands:\n");
    for (size_t i = 0; i < sizeof cmds / sizeof cmds[0]; i++)
        fprintf(f, "  %-17s %s\n", cmds[i].name, cmds[i].help);
}

int main(int argc, char **argv) {
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help")) {
        usage(stdout);
        return 0;
    }
    for (size_t i = 0; i < sizeof cmds / sizeof cmds[0]; i++)
        if (!strcmp(argv[1], cmds[i].name)) return cmds[i].fn(argc - 1, argv + 1);
    fprintf(stderr, "dsv4: unknown command '%s'\n", argv[1]);
    usage(stderr);
    return 2;
}
