/* cmd_tokenize.c - `dsv4 tokenize` (text on stdin -> JSON ids) and `dsv4 detokenize` (JSON ids on stdin
 * -> text). The tokenizer is src/tok/bpe.h. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "cli_util.h"
#include "cmds.h"
#include "../tok/bpe.h"

static void usage_tokenize(FILE *f) {
    fprintf(f,
            "usage: dsv4 tokenize (--tokenizer FILE | -m MODEL_DIR) [--no-special]\n"
            "\n"
            "Reads text on stdin (all of it, as bytes) and prints its token ids as a JSON array on stdout,\n"
            "like Hugging Face tokenizers' encode(text, add_special_tokens=False): no BOS is added.\n"
            "Invalid UTF-8 is replaced by U+FFFD first (as bytes.decode('utf-8', 'replace') would).\n"
            "\n"
            "  --tokenizer FILE   the tokenizer.json to use\n"
            "  -m, --model DIR    a model directory: uses DIR/tokenizer.json\n"
            "  --no-special       special tokens written in the text (e.g. <\xEF\xBD\x9C" "begin\xE2\x96\x81of"
            "\xE2\x96\x81sentence\xEF\xBD\x9C>) are not\n"
            "                     recognized; their text is tokenized like any other\n"
            "  -h, --help         this help\n");
}

static void usage_detokenize(FILE *f) {
    fprintf(f,
            "usage: dsv4 detokenize (--tokenizer FILE | -m MODEL_DIR) [--skip-special]\n"
            "\n"
            "Reads a JSON array of token ids on stdin and prints the text they decode to on stdout (nothing\n"
            "added: no newline). Byte sequences that are not valid UTF-8 come out as U+FFFD, as in Hugging\n"
            "Face tokenizers' decode.\n"
            "\n"
            "  --tokenizer FILE   the tokenizer.json to use\n"
            "  -m, --model DIR    a model directory: uses DIR/tokenizer.json\n"
            "  --skip-special     leave special tokens out of the text\n"
            "  -h, --help         this help\n");
}

typedef struct tok_args {
    const char *tokenizer, *model;
    int flag; /* --no-special / --skip-special */
} tok_args;

/* 0 ok, 1 help printed, 2 usage error (printed). */
static int parse_args(int argc, char **argv, const char *flag_name, void (*usage)(FILE *), tok_args *a) {
    memset(a, 0, sizeof *a);
    for (int i = 1; i < argc; i++) {
        const char *s = argv[i];
        if (!strcmp(s, "-h") || !strcmp(s, "--help")) {
            usage(stdout);
            return 1;
        } else if (!strcmp(s, "--tokenizer") || !strcmp(s, "-m") || !strcmp(s, "--model")) {
            if (i + 1 >= argc) {
                fprintf(stderr, "dsv4 %s: %s needs a value\n", argv[0], s);
                return 2;
            }
            if (!strcmp(s, "--tokenizer")) a->tokenizer = argv[++i];
            else a->model = argv[++i];
        } else if (!strncmp(s, "--tokenizer=", 12)) {
            a->tokenizer = s + 12;
        } else if (!strncmp(s, "--model=", 8)) {
            a->model = s + 8;
        } else if (!strcmp(s, flag_name)) {
            a->flag = 1;
        } else {
            fprintf(stderr, "dsv4 %s: unknown argument '%s'\n", argv[0], s);
            usage(stderr);
            return 2;
        }
    }
    if (!a->tokenizer && !a->model) {
        fprintf(stderr, "dsv4 %s: no tokenizer: give --tokenizer FILE or -m MODEL_DIR\n", argv[0]);
        usage(stderr);
        return 2;
    }
    if (a->tokenizer && a->model) {
        fprintf(stderr, "dsv4 %s: give either --tokenizer or -m, not both\n", argv[0]);
        return 2;
    }
    return 0;
}

static dsv4_tok *load(const char *cmd, const tok_args *a) {
    dsv4_err err = {{0}};
    dsv4_tok *t = a->tokenizer ? dsv4_tok_load(a->tokenizer, &err) : dsv4_tok_load_dir(a->model, &err);
    if (!t) fprintf(stderr, "dsv4 %s: %s\n", cmd, err.msg);
    return t;
}

static int finish_output(const char *cmd) {
    if (fflush(stdout) || ferror(stdout)) {
        fprintf(stderr, "dsv4 %s: error writing the output\n", cmd);
        return 1;
    }
    return 0;
}

int dsv4_cmd_tokenize(int argc, char **argv) {
    tok_args a;
    int r = parse_args(argc, argv, "--no-special", usage_tokenize, &a);
    if (r) return r == 1 ? 0 : 2;
    dsv4_tok *t = load(argv[0], &a);
    if (!t) return 1;
    size_t len;
    char *text = dsv4_cli_read_file("-", &len);
    if (!text) {
        dsv4_tok_free(t);
        return 1;
    }
    dsv4_err err = {{0}};
    size_t n;
    int32_t *ids = dsv4_tok_encode(t, text, len, a.flag ? DSV4_TOK_NO_SPECIAL : 0, &n, &err);
    free(text);
    dsv4_tok_free(t);
    if (!ids) {
        fprintf(stderr, "dsv4 %s: %s\n", argv[0], err.msg);
        return 1;
    }
    putchar('[');
    for (size_t i = 0; i < n; i++) printf(i ? ", %ld" : "%ld", (long)ids[i]);
    fputs("]\n", stdout);
    free(ids);
    return finish_output(argv[0]);
}

int dsv4_cmd_detokenize(int argc, char **argv) {
    tok_args a;
    int r = parse_args(argc, argv, "--skip-special", usage_detokenize, &a);
    if (r) return r == 1 ? 0 : 2;
    size_t len;
    char *in = dsv4_cli_read_file("-", &len);
    if (!in) return 1;
    cJSON *root = cJSON_ParseWithLength(in, len);
    if (!root || !cJSON_IsArray(root)) {
        if (!root) {
            const char *ep = cJSON_GetErrorPtr();
            long off = ep && ep >= in && ep <= in + len ? (long)(ep - in) : -1;
            fprintf(stderr, "dsv4 %s: stdin: invalid JSON (near byte %ld); expected an array of token ids\n",
                    argv[0], off);
        } else {
            fprintf(stderr, "dsv4 %s: stdin: expected a JSON array of token ids\n", argv[0]);
        }
        cJSON_Delete(root);
        free(in);
        return 1;
    }
    free(in);
    dsv4_tok *t = load(argv[0], &a);
    if (!t) {
        cJSON_Delete(root);
        return 1;
    }
    int n = cJSON_GetArraySize(root), i = 0, rc = 0;
    int32_t *ids = malloc(((size_t)n + 1) * sizeof *ids);
    const cJSON *x;
    if (!ids) rc = 1;
    int32_t vs = dsv4_tok_vocab_size(t);
    if (ids) cJSON_ArrayForEach(x, root) {
            double d = cJSON_IsNumber(x) ? x->valuedouble : NAN;
            if (!cJSON_IsNumber(x) || d != floor(d)) {
                fprintf(stderr, "dsv4 %s: stdin: element %d is not an integer token id\n", argv[0], i);
                rc = 1;
                break;
            }
            if (d < 0 || d >= vs || !dsv4_tok_token(t, (int32_t)d)) {
                fprintf(stderr, "dsv4 %s: stdin: token id %.0f (element %d) is out of range (vocabulary: 0..%ld)\n",
                        argv[0], d, i, (long)vs - 1);
                rc = 1;
                break;
            }
            ids[i++] = (int32_t)d;
        }
    cJSON_Delete(root);
    if (!rc) {
        dsv4_err err = {{0}};
        size_t tl;
        char *text = dsv4_tok_decode(t, ids, (size_t)n, a.flag ? DSV4_TOK_SKIP_SPECIAL : 0, &tl, &err);
        if (!text) {
            fprintf(stderr, "dsv4 %s: %s\n", argv[0], err.msg);
            rc = 1;
        } else {
            fwrite(text, 1, tl, stdout);
            free(text);
            rc = finish_output(argv[0]);
        }
    }
    free(ids);
    dsv4_tok_free(t);
    return rc;
}
