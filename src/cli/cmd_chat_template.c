/* cmd_chat_template.c - `dsv4 chat-template` (message list JSON -> DeepSeek-V4 prompt text) and
 * `dsv4 parse-completion` (generated text -> assistant message JSON). Both read stdin, write stdout. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../tok/chat.h"
#include "../tok/chat_json.h"
#include "../tok/chat_parse.h"
#include "../util/strbuf.h"
#include "cmds.h"

static int parse_mode(const char *cmd, const char *s, dsv4_chat_mode *mode) {
    if (!strcmp(s, "thinking")) *mode = DSV4_CHAT_THINKING;
    else if (!strcmp(s, "chat")) *mode = DSV4_CHAT_CHAT;
    else {
        fprintf(stderr, "dsv4 %s: --mode must be thinking or chat, not '%s'\n", cmd, s);
        return -1;
    }
    return 0;
}

/* ---------------------------------------------------------------------------------------------
 * chat-template
 * --------------------------------------------------------------------------------------------- */

static void chat_template_usage(FILE *f) {
    fprintf(f,
            "usage: dsv4 chat-template [--mode thinking|chat] [--effort none|high|max] [--no-drop-thinking]\n"
            "                          [--no-bos] < messages.json\n"
            "\n"
            "Reads an OpenAI-style message list (a JSON array, or {\"messages\": [...], \"tools\": [...]}) on\n"
            "stdin and writes the DeepSeek-V4 prompt text on stdout, byte for byte as DeepSeek's\n"
            "encoding_dsv4.py renders it (no newline added).\n"
            "\n"
            "  --mode M            thinking (default; the prompt ends in <think>) or chat (ends in </think>)\n"
            "  --effort E          none (default), high (same prompt as none) or max (adds the\n"
            "                      \"Reasoning Effort: Absolute maximum...\" prefix; thinking mode only)\n"
            "  --no-drop-thinking  keep the reasoning of assistant turns before the last user message\n"
            "                      (dropping is also off whenever a message has tools)\n"
            "  --no-bos            leave out <\xEF\xBD\x9C" "begin\xE2\x96\x81of\xE2\x96\x81sentence\xEF\xBD\x9C>\n"
            "\n"
            "Roles: system, user, assistant (content, reasoning_content, tool_calls), tool (tool_call_id,\n"
            "content), developer, latest_reminder. \"tools\" given next to \"messages\" go on the first\n"
            "message when it is a system or developer message, else on a new empty system message.\n");
}

int dsv4_cmd_chat_template(int argc, char **argv) {
    dsv4_chat_opts o = dsv4_chat_opts_default();
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            chat_template_usage(stdout);
            return 0;
        } else if (!strcmp(a, "--mode") && i + 1 < argc) {
            if (parse_mode(argv[0], argv[++i], &o.mode)) return 2;
        } else if (!strcmp(a, "--effort") && i + 1 < argc) {
            const char *e = argv[++i];
            if (!strcmp(e, "none")) o.effort = DSV4_EFFORT_NONE;
            else if (!strcmp(e, "high")) o.effort = DSV4_EFFORT_HIGH;
            else if (!strcmp(e, "max")) o.effort = DSV4_EFFORT_MAX;
            else {
                fprintf(stderr, "dsv4 %s: --effort must be none, high or max, not '%s'\n", argv[0], e);
                return 2;
            }
        } else if (!strcmp(a, "--no-drop-thinking")) {
            o.drop_thinking = 0;
        } else if (!strcmp(a, "--no-bos")) {
            o.add_bos = 0;
        } else {
            fprintf(stderr, "dsv4 %s: unknown or incomplete option '%s'\n", argv[0], a);
            chat_template_usage(stderr);
            return 2;
        }
    }
    dsv4_err err = {{0}};
    size_t n;
    char *in = dsv4_read_stream(stdin, "stdin", 0, &n, &err);
    if (!in) {
        fprintf(stderr, "dsv4 %s: %s\n", argv[0], err.msg);
        return 1;
    }
    size_t len;
    char *prompt = dsv4_chat_render_json(in, n, &o, &len, &err);
    free(in);
    if (!prompt) {
        fprintf(stderr, "dsv4 %s: %s\n", argv[0], err.msg);
        return 1;
    }
    int rc = fwrite(prompt, 1, len, stdout) == len && fflush(stdout) == 0 ? 0 : 1;
    if (rc) fprintf(stderr, "dsv4 %s: cannot write stdout\n", argv[0]);
    free(prompt);
    return rc;
}

/* ---------------------------------------------------------------------------------------------
 * parse-completion
 * --------------------------------------------------------------------------------------------- */

static void parse_usage(FILE *f) {
    fprintf(f,
            "usage: dsv4 parse-completion [--mode thinking|chat] [--stream] < completion.txt\n"
            "\n"
            "Reads the text a DeepSeek-V4 model generated after the prompt on stdin and writes the assistant\n"
            "message as one line of JSON:\n"
            "  {\"role\":\"assistant\",\"content\":...,\"reasoning_content\":...,\"tool_calls\":[{\"id\":...,\n"
            "   \"type\":\"function\",\"function\":{\"name\":...,\"arguments\":\"{...}\"}}]}\n"
            "\n"
            "  --mode M   thinking (default: the text starts inside <think>) or chat\n"
            "  --stream   parse stdin as it arrives and write one JSON line per delta first:\n"
            "             {\"reasoning_content\":\"...\"}, {\"content\":\"...\"} or {\"tool_call\":{...}}\n"
            "\n"
            "A trailing <\xEF\xBD\x9C" "end\xE2\x96\x81of\xE2\x96\x81sentence\xEF\xBD\x9C> is dropped. Nothing is lost on odd input: a missing </think>\n"
            "leaves everything as reasoning, a malformed or unterminated tool-call block is kept as content\n"
            "(notes about such fallbacks go to stderr).\n");
}

static void put_line(dsv4_sb *b) {
    dsv4_sb_putc(b, '\n');
    if (!b->oom) fwrite(b->p, 1, b->n, stdout);
    fflush(stdout);
    dsv4_sb_free(b);
}

static void put_tool_call_json(dsv4_sb *b, const dsv4_chat_tool_call *tc, int index) {
    const int fl = DSV4_PYJSON_COMPACT | DSV4_PYJSON_FIX_UTF8;
    if (index >= 0) dsv4_sb_printf(b, "{\"index\":%d,\"id\":", index);
    else dsv4_sb_puts(b, "{\"id\":");
    dsv4_pyjson_dump_string(b, tc->id, strlen(tc->id), fl);
    dsv4_sb_puts(b, ",\"type\":\"function\",\"function\":{\"name\":");
    dsv4_pyjson_dump_string(b, tc->name, strlen(tc->name), fl);
    dsv4_sb_puts(b, ",\"arguments\":");
    dsv4_pyjson_dump_string(b, tc->arguments, strlen(tc->arguments), fl);
    dsv4_sb_puts(b, "}}");
}

static void on_delta(void *user, const dsv4_chat_delta *d) {
    (void)user;
    const int fl = DSV4_PYJSON_COMPACT | DSV4_PYJSON_FIX_UTF8;
    dsv4_sb b = {0};
    if (d->kind == DSV4_DELTA_TOOL_CALL) {
        dsv4_sb_puts(&b, "{\"tool_call\":");
        put_tool_call_json(&b, d->call, d->index);
        dsv4_sb_putc(&b, '}');
    } else {
        dsv4_sb_puts(&b, d->kind == DSV4_DELTA_REASONING ? "{\"reasoning_content\":" : "{\"content\":");
        dsv4_pyjson_dump_string(&b, d->text, d->len, fl);
        dsv4_sb_putc(&b, '}');
    }
    put_line(&b);
}

int dsv4_cmd_parse_completion(int argc, char **argv) {
    dsv4_chat_mode mode = DSV4_CHAT_THINKING;
    int stream = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            parse_usage(stdout);
            return 0;
        } else if (!strcmp(a, "--mode") && i + 1 < argc) {
            if (parse_mode(argv[0], argv[++i], &mode)) return 2;
        } else if (!strcmp(a, "--stream")) {
            stream = 1;
        } else {
            fprintf(stderr, "dsv4 %s: unknown or incomplete option '%s'\n", argv[0], a);
            parse_usage(stderr);
            return 2;
        }
    }
    dsv4_err err = {{0}};
    dsv4_chat_parser *p = dsv4_chat_parser_new(mode, stream ? on_delta : NULL, NULL);
    if (!p) {
        fprintf(stderr, "dsv4 %s: out of memory\n", argv[0]);
        return 1;
    }
    int rc = 0;
    if (stream) { /* read() returns what has arrived, so deltas come out while the input streams */
        char buf[4096];
        for (;;) {
            ssize_t r = read(0, buf, sizeof buf);
            if (r < 0) {
                fprintf(stderr, "dsv4 %s: cannot read stdin\n", argv[0]);
                rc = 1;
                break;
            }
            if (r == 0) break;
            if (dsv4_chat_parser_feed(p, buf, (size_t)r, &err)) {
                rc = 1;
                break;
            }
        }
    } else {
        size_t n;
        char *in = dsv4_read_stream(stdin, "stdin", 0, &n, &err);
        if (!in) {
            rc = 1; /* err says why; printed below */
        } else {
            rc = dsv4_chat_parser_feed(p, in, n, &err) ? 1 : 0;
            free(in);
        }
    }
    if (!rc && dsv4_chat_parser_finish(p, &err)) rc = 1;
    if (rc) {
        if (err.msg[0]) fprintf(stderr, "dsv4 %s: %s\n", argv[0], err.msg);
        dsv4_chat_parser_free(p);
        return 1;
    }
    const dsv4_chat_parsed *m = dsv4_chat_parser_result(p);
    if (m->flags & DSV4_PARSE_NO_THINK_END)
        fprintf(stderr, "dsv4 %s: note: no </think>; all the text went to reasoning_content\n", argv[0]);
    if (m->flags & DSV4_PARSE_BAD_TOOL_CALLS)
        fprintf(stderr, "dsv4 %s: note: a malformed or unterminated tool-call block was kept as content\n", argv[0]);
    if (m->flags & DSV4_PARSE_BAD_PARAM_JSON)
        fprintf(stderr, "dsv4 %s: note: a string=\"false\" parameter was not JSON; kept as a string\n", argv[0]);
    if (m->flags & DSV4_PARSE_TEXT_AFTER_TOOLS)
        fprintf(stderr, "dsv4 %s: note: text after the tool calls was added to content\n", argv[0]);
    if (m->flags & DSV4_PARSE_TEXT_AFTER_EOS)
        fprintf(stderr, "dsv4 %s: note: %zu bytes after the end-of-sentence token were ignored\n", argv[0],
                m->after_eos_len);

    const int fl = DSV4_PYJSON_COMPACT | DSV4_PYJSON_FIX_UTF8;
    dsv4_sb b = {0};
    dsv4_sb_puts(&b, "{\"role\":\"assistant\",\"content\":");
    dsv4_pyjson_dump_string(&b, m->content, m->content_len, fl);
    dsv4_sb_puts(&b, ",\"reasoning_content\":");
    dsv4_pyjson_dump_string(&b, m->reasoning_content, m->reasoning_len, fl);
    dsv4_sb_puts(&b, ",\"tool_calls\":[");
    for (int k = 0; k < m->n_tool_calls; k++) {
        if (k) dsv4_sb_putc(&b, ',');
        put_tool_call_json(&b, &m->tool_calls[k], -1);
    }
    dsv4_sb_puts(&b, "]}");
    if (b.oom) {
        fprintf(stderr, "dsv4 %s: out of memory\n", argv[0]);
        rc = 1;
    }
    put_line(&b);
    dsv4_chat_parser_free(p);
    if (fflush(stdout)) {
        fprintf(stderr, "dsv4 %s: cannot write stdout\n", argv[0]);
        rc = 1;
    }
    return rc;
}
