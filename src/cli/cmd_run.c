/* cmd_run.c - `dsv4 run` (one prompt -> streamed completion) and `dsv4 chat` (interactive, streaming).
 *
 * Both tokenize with the model directory's tokenizer.json, optionally render the prompt through the
 * DeepSeek-V4 chat encoding, prefill in one forward call, then decode one token at a time with the
 * sampler, streaming text through the incremental detokenizer (never a broken UTF-8 sequence) and the
 * stop-string matcher; in chat mode the streaming completion parser splits reasoning (stderr, in a
 * [thinking] block) from the answer (stdout). */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cli_util.h"
#include "cmds.h"
#include "dsv4.h"
#include "engine/sample.h"
#include "tok/bpe.h"
#include "tok/chat.h"
#include "tok/chat_parse.h"
#include "util/strbuf.h"

#define MAX_STOPS 32

typedef struct {
    const char *cmd; /* "run" / "chat" */
    const char *model, *prompt, *tokenizer, *system;
    int chat, think, no_bos, threads, quiet;
    int seed_set;
    long max_tokens;
    dsv4_sampling sp;
    const char *stops[MAX_STOPS];
    size_t n_stop;
} run_opts;

static const char *run_device = "cpu"; /* --device, applied once the model is loaded */

static void usage(FILE *f, const char *cmd) {
    if (!strcmp(cmd, "chat"))
        fprintf(f,
                "usage: dsv4 chat -m MODEL_DIR [options]\n"
                "\n"
                "  Interactive chat: reads one user message per line from stdin (a terminal or a pipe),\n"
                "  streams the answer to stdout (reasoning, with --think, to stderr in a [thinking]\n"
                "  block). The conversation is kept and re-rendered each turn. Ends on EOF or /exit;\n"
                "  /reset starts a new conversation.\n"
                "\n"
                "  --system TEXT            a system message first\n");
    else
        fprintf(f,
                "usage: dsv4 run -m MODEL_DIR -p PROMPT [options]\n"
                "\n"
                "  Generates a completion of PROMPT and streams it to stdout. With --chat the prompt is\n"
                "  one user message rendered through the DeepSeek-V4 chat encoding, and the reasoning\n"
                "  (with --think) goes to stderr in a [thinking] block. Timing goes to stderr.\n"
                "\n"
                "  -p, --prompt TEXT        the prompt (\"-\": read it from stdin)\n"
                "  --chat                   render PROMPT as a user message (chat mode)\n"
                "  --no-bos                 raw mode: do not start with the BOS token\n");
    fprintf(f,
            "  --think                  thinking mode (the model reasons first; implies --chat)\n"
            "  --max-tokens N           stop after N generated tokens (default 256; 0 = up to the context)\n"
            "  --temperature T          default 1.0; 0 = greedy\n"
            "  --top-p P                default 1.0 (off)\n"
            "  --top-k K                default 0 (off)\n"
            "  --min-p P                default 0 (off)\n"
            "  --repetition-penalty R   default 1.0 (off)\n"
            "  --presence-penalty P     default 0\n"
            "  --frequency-penalty F    default 0\n"
            "  --seed S                 sampling seed (default: random)\n"
            "  --stop STR               stop when STR is generated (repeatable, up to %d)\n"
            "  --ignore-eos             keep going past the end-of-sequence token\n"
            "  --tokenizer PATH         tokenizer.json (default: MODEL_DIR/tokenizer.json)\n"
            "  --threads N              CPU threads (default: all cores)\n"
            "  --device cpu|cuda        backend (cuda: builds made with make CUDA=1)\n"
            "  -q, --quiet              no timing / notice lines on stderr\n",
            MAX_STOPS);
}

static int bad_value(const run_opts *o, const char *opt, const char *v) {
    fprintf(stderr, "dsv4 %s: %s: bad value '%s'\n", o->cmd, opt, v);
    return 2;
}

static int parse_float(const char *s, float *out) {
    char *end;
    double d = strtod(s, &end);
    if (end == s || *end || !isfinite(d)) return -1;
    *out = (float)d;
    return 0;
}

/* 0: parsed; 1: --help printed; 2: usage error (printed) */
static int parse_args(int argc, char **argv, run_opts *o) {
    memset(o, 0, sizeof *o);
    o->cmd = argv[0];
    o->max_tokens = 256;
    dsv4_sampling_defaults(&o->sp);
    int is_chat_cmd = !strcmp(o->cmd, "chat");
    const char *device = "cpu";
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout, o->cmd);
            return 1;
        }
        /* flags without a value */
        if (!strcmp(a, "--chat")) { o->chat = 1; continue; }
        if (!strcmp(a, "--think")) { o->think = o->chat = 1; continue; }
        if (!strcmp(a, "--ignore-eos")) { o->sp.ignore_eos = true; continue; }
        if (!strcmp(a, "--no-bos")) { o->no_bos = 1; continue; }
        if (!strcmp(a, "-q") || !strcmp(a, "--quiet")) { o->quiet = 1; continue; }
        if (i + 1 >= argc) {
            fprintf(stderr, "dsv4 %s: option %s needs a value (or unknown option)\n", o->cmd, a);
            return 2;
        }
        const char *v = argv[++i];
        long x;
        float fv;
        if (!strcmp(a, "-m") || !strcmp(a, "--model")) o->model = v;
        else if ((!strcmp(a, "-p") || !strcmp(a, "--prompt")) && !is_chat_cmd) o->prompt = v;
        else if (!strcmp(a, "--system") && is_chat_cmd) o->system = v;
        else if (!strcmp(a, "--tokenizer")) o->tokenizer = v;
        else if (!strcmp(a, "--device")) device = v;
        else if (!strcmp(a, "--max-tokens")) {
            if (dsv4_cli_parse_long(v, 0, 1L << 30, &x)) return bad_value(o, a, v);
            o->max_tokens = x;
        } else if (!strcmp(a, "--threads")) {
            if (dsv4_cli_parse_long(v, 1, 4096, &x)) return bad_value(o, a, v);
            o->threads = (int)x;
        } else if (!strcmp(a, "--top-k")) {
            if (dsv4_cli_parse_long(v, 0, 1L << 30, &x)) return bad_value(o, a, v);
            o->sp.top_k = (int)x;
        } else if (!strcmp(a, "--seed")) {
            char *end;
            unsigned long long s = strtoull(v, &end, 10);
            if (!*v || *end || *v == '-') return bad_value(o, a, v);
            o->sp.seed = s;
            o->seed_set = 1;
        } else if (!strcmp(a, "--stop")) {
            if (!*v) return bad_value(o, a, v);
            if (o->n_stop == MAX_STOPS) {
                fprintf(stderr, "dsv4 %s: at most %d --stop strings\n", o->cmd, MAX_STOPS);
                return 2;
            }
            o->stops[o->n_stop++] = v;
        } else if (!strcmp(a, "--temperature") || !strcmp(a, "--temp")) {
            if (parse_float(v, &fv)) return bad_value(o, a, v);
            o->sp.temperature = fv;
        } else if (!strcmp(a, "--top-p")) {
            if (parse_float(v, &fv)) return bad_value(o, a, v);
            o->sp.top_p = fv;
        } else if (!strcmp(a, "--min-p")) {
            if (parse_float(v, &fv)) return bad_value(o, a, v);
            o->sp.min_p = fv;
        } else if (!strcmp(a, "--repetition-penalty")) {
            if (parse_float(v, &fv)) return bad_value(o, a, v);
            o->sp.repetition_penalty = fv;
        } else if (!strcmp(a, "--presence-penalty")) {
            if (parse_float(v, &fv)) return bad_value(o, a, v);
            o->sp.presence_penalty = fv;
        } else if (!strcmp(a, "--frequency-penalty")) {
            if (parse_float(v, &fv)) return bad_value(o, a, v);
            o->sp.frequency_penalty = fv;
        } else {
            fprintf(stderr, "dsv4 %s: unknown option '%s'\n", o->cmd, a);
            usage(stderr, o->cmd);
            return 2;
        }
    }
    if (!o->model) {
        fprintf(stderr, "dsv4 %s: -m MODEL_DIR is required\n", o->cmd);
        usage(stderr, o->cmd);
        return 2;
    }
    if (!is_chat_cmd && !o->prompt) {
        fprintf(stderr, "dsv4 %s: -p PROMPT is required\n", o->cmd);
        usage(stderr, o->cmd);
        return 2;
    }
    if (strcmp(device, "cpu") && strcmp(device, "cuda")) {
        fprintf(stderr, "dsv4 %s: --device %s: expected cpu or cuda\n", o->cmd, device);
        return 2;
    }
    run_device = device;
    if (!o->seed_set) o->sp.seed = ((uint64_t)time(NULL) << 20) ^ (uint64_t)getpid() ^ (uint64_t)clock();
    o->sp.stop = o->stops;
    o->sp.n_stop = o->n_stop;
    o->sp.max_tokens = (int)o->max_tokens;
    dsv4_err e = {{0}};
    if (dsv4_sampling_validate(&o->sp, &e)) {
        fprintf(stderr, "dsv4 %s: %s\n", o->cmd, e.msg);
        return 2;
    }
    if (is_chat_cmd) o->chat = 1;
    return 0;
}

/* ---- engine: model + tokenizer + one sequence (reused when a new prompt extends the old one) ----- */

typedef struct {
    const run_opts *o;
    dsv4_model *m;
    dsv4_info info;
    dsv4_tok *tok;
    int tok_vocab;
    int synthetic;
    dsv4_seq *seq;
    int32_t *fed; /* tokens the sequence has processed */
    size_t nfed, capfed;
    float *logits;
} engine;

static int model_is_synthetic(const char *dir) {
    char path[4096];
    int n = snprintf(path, sizeof path, "%s/config.json", dir);
    if (n < 0 || (size_t)n >= sizeof path) return 0;
    FILE *f = fopen(path, "rb");
    if (!f) return 0;
    fclose(f);
    size_t len;
    char *txt = dsv4_cli_read_file(path, &len);
    if (!txt) return 0;
    cJSON *j = cJSON_ParseWithLength(txt, len);
    free(txt);
    int syn = j && cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(j, "dsv4_synthetic"));
    cJSON_Delete(j);
    return syn;
}

static int engine_open(engine *E, const run_opts *o) {
    memset(E, 0, sizeof *E);
    E->o = o;
    dsv4_cli_set_threads(o->threads);
    char err[1024];
    double t0 = dsv4_cli_now();
    if (dsv4_load(o->model, &E->m, err, sizeof err)) {
        fprintf(stderr, "dsv4 %s: %s\n", o->cmd, err);
        return -1;
    }
    if (dsv4_set_device(E->m, run_device, err, sizeof err)) {
        fprintf(stderr, "dsv4 %s: --device %s: %s\n", o->cmd, run_device, err);
        dsv4_free(E->m);
        E->m = NULL;
        return -1;
    }
    E->info = dsv4_model_info(E->m);
    char tpath[4096];
    const char *tp = o->tokenizer;
    if (!tp) {
        int n = snprintf(tpath, sizeof tpath, "%s/tokenizer.json", o->model);
        if (n < 0 || (size_t)n >= sizeof tpath) {
            fprintf(stderr, "dsv4 %s: model path too long\n", o->cmd);
            return -1;
        }
        tp = tpath;
    }
    if (access(tp, R_OK)) {
        fprintf(stderr, "dsv4 %s: %s: no tokenizer (pass --tokenizer PATH to tokenizer.json)\n", o->cmd, tp);
        return -1;
    }
    dsv4_err e = {{0}};
    if (!(E->tok = dsv4_tok_load(tp, &e))) {
        fprintf(stderr, "dsv4 %s: %s\n", o->cmd, e.msg);
        return -1;
    }
    E->tok_vocab = dsv4_tok_vocab_size(E->tok);
    E->synthetic = model_is_synthetic(o->model);
    E->logits = malloc(sizeof(float) * (size_t)E->info.vocab_size);
    if (!E->logits) {
        fprintf(stderr, "dsv4 %s: out of memory\n", o->cmd);
        return -1;
    }
    if (!o->quiet)
        fprintf(stderr, "dsv4 %s: loaded %s in %.2f s (%d layers, dim %d, vocab %d, context %d), seed %llu\n",
                o->cmd, o->model, dsv4_cli_now() - t0, E->info.n_layers, E->info.dim, E->info.vocab_size,
                E->info.max_context, (unsigned long long)o->sp.seed);
    if (E->synthetic)
        fprintf(stderr, "dsv4 %s: NOTE: %s is a synthetic model with random weights (dsv4 synth): its output is "
                        "meaningless gibberish.\n",
                o->cmd, o->model);
    return 0;
}

static void engine_close(engine *E) {
    dsv4_seq_free(E->seq);
    dsv4_free(E->m);
    dsv4_tok_free(E->tok);
    free(E->fed);
    free(E->logits);
}

static int fed_push(engine *E, const int32_t *t, size_t n) {
    if (E->nfed + n > E->capfed) {
        size_t cap = E->capfed ? E->capfed : 256;
        while (cap < E->nfed + n) cap *= 2;
        int32_t *p = realloc(E->fed, cap * sizeof *p);
        if (!p) return -1;
        E->fed = p;
        E->capfed = cap;
    }
    memcpy(E->fed + E->nfed, t, n * sizeof *t);
    E->nfed += n;
    return 0;
}

/* Feeds tokens t[0..n) to the sequence; logits of the last one into E->logits. */
static int engine_feed(engine *E, const int32_t *t, size_t n) {
    char err[1024];
    const int32_t *tp[1] = {t};
    int nt[1] = {(int)n};
    if (dsv4_forward(E->m, 1, &E->seq, tp, nt, E->logits, DSV4_LOGITS_LAST, err, sizeof err)) {
        fprintf(stderr, "dsv4 %s: %s\n", E->o->cmd, err);
        return -1;
    }
    if (fed_push(E, t, n)) {
        fprintf(stderr, "dsv4 %s: out of memory\n", E->o->cmd);
        return -1;
    }
    return 0;
}

/* Feeds the one token t and samples the next one on the device (dsv4_decode_sample: the step's CUDA graphs
 * sample too, only the id comes back); the host sampler's step numbers the draw. */
static int engine_step_sample(engine *E, int32_t t, const dsv4_sampling *sp, const dsv4_sampler *smp, int32_t *next) {
    char err[1024];
    const int V = E->info.vocab_size, nv = E->tok_vocab > 0 && E->tok_vocab < V ? E->tok_vocab : V;
    dsv4_device_sampling ds = {sp->temperature, sp->top_p, sp->min_p, sp->top_k, sp->seed, dsv4_sampler_step(smp)};
    if (dsv4_decode_sample(E->m, 1, &E->seq, &t, &ds, nv, next, err, sizeof err)) {
        fprintf(stderr, "dsv4 %s: %s\n", E->o->cmd, err);
        return -1;
    }
    if (fed_push(E, &t, 1)) {
        fprintf(stderr, "dsv4 %s: out of memory\n", E->o->cmd);
        return -1;
    }
    return 0;
}

/* ---- output: raw text to stdout, or through the chat parser ----------------------------------- */

typedef struct {
    dsv4_chat_parser *parser; /* NULL: raw mode */
    int think_open, think_closed, color;
    size_t n_out;             /* bytes written to stdout */
    int oom;
} sink;

static void close_think(sink *s) {
    if (s->think_open && !s->think_closed) {
        fputs(s->color ? "\n[/thinking]\033[0m\n" : "\n[/thinking]\n", stderr);
        fflush(stderr);
        s->think_closed = 1;
    }
}

static void on_delta(void *user, const dsv4_chat_delta *d) {
    sink *s = user;
    switch (d->kind) {
    case DSV4_DELTA_REASONING:
        if (!s->think_open) {
            fputs(s->color ? "\033[2m[thinking]\n" : "[thinking]\n", stderr);
            s->think_open = 1;
        }
        fwrite(d->text, 1, d->len, stderr);
        fflush(stderr);
        break;
    case DSV4_DELTA_CONTENT:
        close_think(s);
        fwrite(d->text, 1, d->len, stdout);
        fflush(stdout);
        s->n_out += d->len;
        break;
    case DSV4_DELTA_TOOL_CALL:
        close_think(s);
        printf("[tool call %s: %s(%s)]\n", d->call->id, d->call->name, d->call->arguments);
        fflush(stdout);
        break;
    }
}

static void sink_emit(sink *s, const char *t, size_t n) {
    if (!n) return;
    if (s->parser) {
        dsv4_err e = {{0}};
        if (dsv4_chat_parser_feed(s->parser, t, n, &e)) s->oom = 1;
    } else {
        fwrite(t, 1, n, stdout);
        fflush(stdout);
        s->n_out += n;
    }
}

/* ---- generation ---------------------------------------------------------------------------------- */

typedef struct {
    size_t n_prompt, n_reused, n_gen;
    double t_first, t_total; /* seconds from the start of the call */
    const char *finish;
} gen_stats;

static int generate(engine *E, const int32_t *ids, size_t n, const dsv4_sampling *sp, sink *out, gen_stats *st) {
    const run_opts *o = E->o;
    const int V = E->info.vocab_size;
    memset(st, 0, sizeof *st);
    st->n_prompt = n;
    st->finish = "length";
    if (n == 0) {
        fprintf(stderr, "dsv4 %s: empty prompt\n", o->cmd);
        return -1;
    }
    for (size_t i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= V) {
            fprintf(stderr, "dsv4 %s: prompt token %d is outside the model's vocabulary (%d)\n", o->cmd, ids[i], V);
            return -1;
        }
    if ((long)n >= E->info.max_context) {
        fprintf(stderr, "dsv4 %s: the prompt has %zu tokens; the model's context is %d\n", o->cmd, n,
                E->info.max_context);
        return -1;
    }
    long budget = E->info.max_context - (long)n;
    if (o->max_tokens > 0 && o->max_tokens < budget) budget = o->max_tokens;

    int rc = -1;
    dsv4_sampler *smp = NULL;
    dsv4_tok_stream *ts = NULL;
    dsv4_sb text = {0};
    dsv4_err e = {{0}};
    double t0 = dsv4_cli_now();

    /* reuse the sequence when the new prompt extends what it has processed */
    size_t skip = 0;
    if (E->seq && E->nfed < n && !memcmp(E->fed, ids, E->nfed * sizeof *ids)) skip = E->nfed;
    else {
        dsv4_seq_free(E->seq);
        E->nfed = 0;
        if (!(E->seq = dsv4_seq_new(E->m))) {
            fprintf(stderr, "dsv4 %s: out of memory\n", o->cmd);
            return -1;
        }
    }
    st->n_reused = skip;
    if (dsv4_sampler_init(&smp, sp, V, &e) || dsv4_sampler_add_prompt(smp, ids, n, &e)) {
        fprintf(stderr, "dsv4 %s: %s\n", o->cmd, e.msg);
        goto done;
    }
    if (!(ts = dsv4_tok_stream_new(E->tok, 0))) {
        fprintf(stderr, "dsv4 %s: out of memory\n", o->cmd);
        goto done;
    }
    if (engine_feed(E, ids + skip, n - skip)) goto done;

    size_t safe = 0, prev = 0;
    int stopped = 0;
    /* on the GPU, decode steps sample on the device when no penalty needs the host's token history */
    const int on_device = dsv4_can_decode_sample(E->m) && sp->repetition_penalty == 1.0f &&
                          sp->presence_penalty == 0.0f && sp->frequency_penalty == 0.0f;
    int32_t next = -1; /* the token the device sampled in the last step */
    for (long step = 0; step < budget; step++) {
        int32_t t = next;
        if (t < 0) {
            if (E->tok_vocab < V) /* rows past the tokenizer's vocabulary are padding: never sample them */
                for (int i = E->tok_vocab; i < V; i++) E->logits[i] = -INFINITY;
            t = dsv4_sampler_sample(smp, E->logits, &e);
        }
        if (t < 0 || dsv4_sampler_accept(smp, t, &e)) {
            fprintf(stderr, "dsv4 %s: sampling: %s\n", o->cmd, e.msg);
            goto done;
        }
        if (step == 0) st->t_first = dsv4_cli_now() - t0;
        st->n_gen++;
        if (t == E->info.eos_token_id && !sp->ignore_eos) {
            st->finish = "eos";
            break;
        }
        size_t len;
        const char *piece = dsv4_tok_stream_feed(ts, t, &len, &e);
        if (!piece) {
            fprintf(stderr, "dsv4 %s: detokenizing: %s\n", o->cmd, e.msg);
            goto done;
        }
        if (dsv4_sb_put(&text, piece, len)) {
            fprintf(stderr, "dsv4 %s: out of memory\n", o->cmd);
            goto done;
        }
        dsv4_stop_result r;
        dsv4_stop_scan(text.p, text.n, prev, sp->stop, sp->n_stop, &r);
        prev = text.n;
        if (r.stop >= 0) {
            sink_emit(out, text.p + safe, r.cut - safe);
            safe = r.cut;
            st->finish = "stop";
            stopped = 1;
            break;
        }
        sink_emit(out, text.p + safe, r.safe - safe);
        safe = r.safe;
        if (step + 1 >= budget) break;
        if (on_device ? engine_step_sample(E, t, sp, smp, &next) : engine_feed(E, &t, 1)) goto done;
    }
    if (!stopped) { /* what the detokenizer and the stop matcher held back */
        size_t len;
        const char *tail = dsv4_tok_stream_flush(ts, &len);
        if (tail && len && dsv4_sb_put(&text, tail, len)) {
            fprintf(stderr, "dsv4 %s: out of memory\n", o->cmd);
            goto done;
        }
        dsv4_stop_result r;
        dsv4_stop_scan(text.p ? text.p : "", text.n, prev, sp->stop, sp->n_stop, &r);
        size_t end = text.n;
        if (r.stop >= 0) {
            end = r.cut;
            st->finish = "stop";
        }
        if (end > safe) sink_emit(out, text.p + safe, end - safe);
    }
    if (out->parser && dsv4_chat_parser_finish(out->parser, &e)) out->oom = 1;
    close_think(out);
    if (out->oom) {
        fprintf(stderr, "dsv4 %s: out of memory\n", o->cmd);
        goto done;
    }
    st->t_total = dsv4_cli_now() - t0;
    rc = 0;
done:
    dsv4_sampler_free(smp);
    dsv4_tok_stream_free(ts);
    dsv4_sb_free(&text);
    return rc;
}

static void print_stats(const run_opts *o, const gen_stats *st) {
    if (o->quiet) return;
    double dec = st->t_total - st->t_first;
    fprintf(stderr, "\ndsv4 %s: prompt %zu tokens", o->cmd, st->n_prompt);
    if (st->n_reused) fprintf(stderr, " (%zu reused)", st->n_reused);
    fprintf(stderr, ", time to first token %.2f s (%.1f prompt tokens/s), %zu tokens generated", st->t_first,
            (st->n_prompt - st->n_reused) / (st->t_first > 0 ? st->t_first : 1e-9), st->n_gen);
    if (st->n_gen > 1) fprintf(stderr, ", %.2f tokens/s", (st->n_gen - 1) / (dec > 0 ? dec : 1e-9));
    fprintf(stderr, ", stop: %s\n", st->finish);
}

static int32_t *tokenize_prompt(engine *E, const char *text, size_t len, int add_bos, size_t *n) {
    dsv4_err e = {{0}};
    size_t m = 0;
    int32_t *ids = dsv4_tok_encode(E->tok, text, len, 0, &m, &e);
    if (!ids) {
        fprintf(stderr, "dsv4 %s: tokenizing: %s\n", E->o->cmd, e.msg);
        return NULL;
    }
    if (add_bos) {
        int32_t *p = realloc(ids, (m + 1) * sizeof *p);
        if (!p) {
            free(ids);
            fprintf(stderr, "dsv4 %s: out of memory\n", E->o->cmd);
            return NULL;
        }
        ids = p;
        memmove(ids + 1, ids, m * sizeof *ids);
        ids[0] = E->info.bos_token_id;
        m++;
    }
    *n = m;
    return ids;
}

static dsv4_chat_opts chat_opts(const run_opts *o) {
    dsv4_chat_opts co = dsv4_chat_opts_default();
    co.mode = o->think ? DSV4_CHAT_THINKING : DSV4_CHAT_CHAT;
    return co;
}

/* Renders `messages`, generates, streams. On success, *parsed (if not NULL) gets the parsed reply. */
static int chat_turn(engine *E, const cJSON *messages, const dsv4_sampling *sp, dsv4_chat_parsed *parsed) {
    const run_opts *o = E->o;
    dsv4_chat_opts co = chat_opts(o);
    dsv4_err e = {{0}};
    size_t plen;
    char *prompt = dsv4_chat_render(messages, NULL, &co, &plen, &e);
    if (!prompt) {
        fprintf(stderr, "dsv4 %s: chat template: %s\n", o->cmd, e.msg);
        return -1;
    }
    size_t n;
    int32_t *ids = tokenize_prompt(E, prompt, plen, 0, &n);
    free(prompt);
    if (!ids) return -1;
    sink out = {.color = isatty(2)};
    out.parser = dsv4_chat_parser_new(co.mode, on_delta, &out);
    if (!out.parser) {
        free(ids);
        fprintf(stderr, "dsv4 %s: out of memory\n", o->cmd);
        return -1;
    }
    gen_stats st;
    int rc = generate(E, ids, n, sp, &out, &st);
    free(ids);
    if (!rc) {
        if (out.n_out) putchar('\n');
        fflush(stdout);
        print_stats(o, &st);
        if (parsed && dsv4_chat_parser_take(out.parser, parsed, &e)) {
            fprintf(stderr, "dsv4 %s: %s\n", o->cmd, e.msg);
            rc = -1;
        }
    }
    dsv4_chat_parser_free(out.parser);
    return rc;
}

int dsv4_cmd_run(int argc, char **argv) {
    run_opts o;
    int r = parse_args(argc, argv, &o);
    if (r) return r == 1 ? 0 : 2;
    char *stdin_prompt = NULL;
    const char *prompt = o.prompt;
    size_t plen = strlen(prompt);
    if (!strcmp(prompt, "-")) {
        if (!(stdin_prompt = dsv4_cli_read_file("-", &plen))) return 1;
        prompt = stdin_prompt;
    }
    engine E;
    int rc = 1;
    if (engine_open(&E, &o)) goto done;
    if (o.chat) {
        cJSON *msgs = cJSON_CreateArray(), *m = cJSON_CreateObject();
        if (!msgs || !m || !cJSON_AddStringToObject(m, "role", "user") ||
            !cJSON_AddStringToObject(m, "content", prompt)) {
            cJSON_Delete(msgs);
            cJSON_Delete(m);
            fprintf(stderr, "dsv4 run: out of memory\n");
            goto done;
        }
        cJSON_AddItemToArray(msgs, m);
        rc = chat_turn(&E, msgs, &o.sp, NULL) ? 1 : 0;
        cJSON_Delete(msgs);
    } else {
        size_t n;
        int32_t *ids = tokenize_prompt(&E, prompt, plen, !o.no_bos, &n);
        if (!ids) goto done;
        sink out = {0};
        gen_stats st;
        if (!generate(&E, ids, n, &o.sp, &out, &st)) {
            if (out.n_out) putchar('\n');
            fflush(stdout);
            print_stats(&o, &st);
            rc = 0;
        }
        free(ids);
    }
done:
    engine_close(&E);
    free(stdin_prompt);
    return rc;
}

/* ---- chat ----------------------------------------------------------------------------------------- */

static cJSON *new_message(const char *role, const char *content) {
    cJSON *m = cJSON_CreateObject();
    if (!m) return NULL;
    if (!cJSON_AddStringToObject(m, "role", role) || !cJSON_AddStringToObject(m, "content", content)) {
        cJSON_Delete(m);
        return NULL;
    }
    return m;
}

static int reset_conversation(cJSON **msgs, const run_opts *o) {
    cJSON_Delete(*msgs);
    *msgs = cJSON_CreateArray();
    if (!*msgs) return -1;
    if (o->system) {
        cJSON *m = new_message("system", o->system);
        if (!m) return -1;
        cJSON_AddItemToArray(*msgs, m);
    }
    return 0;
}

int dsv4_cmd_chat(int argc, char **argv) {
    run_opts o;
    int r = parse_args(argc, argv, &o);
    if (r) return r == 1 ? 0 : 2;
    engine E;
    int rc = 1;
    cJSON *msgs = NULL;
    char *line = NULL;
    size_t cap = 0;
    if (engine_open(&E, &o)) goto done;
    if (reset_conversation(&msgs, &o)) goto oom;
    int tty = isatty(0);
    if (tty)
        fprintf(stderr, "dsv4 chat: type a message and press Enter; /reset starts over, /exit (or Ctrl-D) quits.%s\n",
                o.think ? " Reasoning is shown in [thinking] blocks on stderr." : "");
    for (int turn = 0;; turn++) {
        if (tty) {
            fputs("\n>>> ", stderr);
            fflush(stderr);
        }
        ssize_t n = getline(&line, &cap, stdin);
        if (n < 0) break;
        while (n > 0 && (line[n - 1] == '\n' || line[n - 1] == '\r')) line[--n] = 0;
        char *s = line;
        while (*s == ' ' || *s == '\t') s++;
        if (!*s) continue;
        if (!strcmp(s, "/exit") || !strcmp(s, "/quit") || !strcmp(s, "/bye")) break;
        if (!strcmp(s, "/reset")) {
            if (reset_conversation(&msgs, &o)) goto oom;
            fprintf(stderr, "dsv4 chat: new conversation\n");
            continue;
        }
        if (!tty && !o.quiet) fprintf(stderr, ">>> %s\n", line);
        cJSON *um = new_message("user", line);
        if (!um) goto oom;
        cJSON_AddItemToArray(msgs, um);
        dsv4_sampling sp = o.sp;
        sp.seed = o.sp.seed + (uint64_t)turn; /* a different draw each turn, reproducible per conversation */
        dsv4_chat_parsed reply;
        memset(&reply, 0, sizeof reply);
        if (chat_turn(&E, msgs, &sp, &reply)) goto done;
        cJSON *am = new_message("assistant", reply.content ? reply.content : "");
        if (am && o.think && !cJSON_AddStringToObject(am, "reasoning_content", reply.reasoning_content ? reply.reasoning_content : "")) {
            cJSON_Delete(am);
            am = NULL;
        }
        dsv4_chat_parsed_free(&reply);
        if (!am) goto oom;
        cJSON_AddItemToArray(msgs, am);
    }
    rc = 0;
    goto done;
oom:
    fprintf(stderr, "dsv4 chat: out of memory\n");
done:
    free(line);
    cJSON_Delete(msgs);
    engine_close(&E);
    return rc;
}
