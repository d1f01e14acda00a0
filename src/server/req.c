/* req.c - what the OpenAI and Anthropic front ends share: prompt rendering and tokenizing with the
 * context check, sampling finalization, parameter readers, and the consumer side of a request
 * (srv_out: engine output -> chat parser -> API deltas). */
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <fcntl.h>

#include "server.h"

int srv_fail(srv_error *e, int status, const char *fmt, ...) {
    e->status = status;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->msg, sizeof e->msg, fmt, ap);
    va_end(ap);
    return -1;
}

void srv_random_hex(char *out, int n) {
    static const char hx[] = "0123456789abcdef";
    unsigned char buf[64];
    int nb = (n + 1) / 2;
    if (nb > (int)sizeof buf) nb = sizeof buf;
    int fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC);
    ssize_t got = fd >= 0 ? read(fd, buf, (size_t)nb) : -1;
    if (fd >= 0) close(fd);
    if (got != nb) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        uint64_t x = (uint64_t)ts.tv_nsec * 6364136223846793005ULL ^ (uint64_t)ts.tv_sec ^ (uint64_t)getpid();
        for (int i = 0; i < nb; i++) {
            x = x * 6364136223846793005ULL + 1442695040888963407ULL;
            buf[i] = (unsigned char)(x >> 56);
        }
    }
    for (int i = 0; i < n && i / 2 < nb; i++) out[i] = hx[(buf[i / 2] >> (i % 2 ? 0 : 4)) & 15];
    out[n] = 0;
}

char *srv_json_print(cJSON *j, size_t *len) {
    if (!j) return NULL;
    dsv4_sb b = {0};
    dsv4_pyjson_dump(&b, j, DSV4_PYJSON_COMPACT | DSV4_PYJSON_FIX_UTF8);
    cJSON_Delete(j);
    return dsv4_sb_take(&b, len); /* NULL when out of memory */
}

void srv_sse(dsv4_sb *b, const char *event, cJSON *data) {
    if (event) {
        dsv4_sb_puts(b, "event: ");
        dsv4_sb_puts(b, event);
        dsv4_sb_putc(b, '\n');
    }
    dsv4_sb_puts(b, "data: ");
    if (data) dsv4_pyjson_dump(b, data, DSV4_PYJSON_COMPACT | DSV4_PYJSON_FIX_UTF8);
    else b->oom = 1;
    dsv4_sb_puts(b, "\n\n");
    cJSON_Delete(data);
}

const char *srv_stop_string(const srv_req *r, int idx) {
    return idx >= 0 && (size_t)idx < r->n_stop ? r->stops[idx] : NULL;
}

/* ---- prompt ---- */

int32_t *srv_encode_prompt(srv_ctx *S, const char *text, size_t len, int add_bos, size_t *n_out, srv_error *e) {
    dsv4_err de = {{0}};
    size_t n = 0;
    int32_t *ids = dsv4_tok_encode(S->tok, text, len, 0, &n, &de);
    if (!ids) return srv_fail(e, 500, "tokenizing the prompt: %s", de.msg), NULL;
    if (add_bos) {
        int32_t *p = realloc(ids, (n + 1) * sizeof *p);
        if (!p) {
            free(ids);
            return srv_fail(e, 500, "out of memory"), NULL;
        }
        ids = p;
        memmove(ids + 1, ids, n * sizeof *ids);
        ids[0] = S->info.bos_token_id;
        n++;
    }
    *n_out = n;
    return ids;
}

int srv_tokenize_prompt(srv_ctx *S, srv_req *r, const char *text, size_t len, int add_bos, srv_error *e) {
    size_t n = 0;
    int32_t *ids = srv_encode_prompt(S, text, len, add_bos, &n, e);
    if (!ids) return -1;
    free(r->prompt);
    r->prompt = ids;
    r->n_prompt = (int)n;
    return 0;
}

int srv_force_tool_call(srv_ctx *S, srv_req *r, const char *name, srv_error *e) {
    char text[512];
    int n = name ? snprintf(text, sizeof text, "\n\n<\xef\xbd\x9c" "DSML\xef\xbd\x9c" "tool_calls>\n<\xef\xbd\x9c" "DSML\xef\xbd\x9c" "invoke name=\"%s\">\n", name)
                 : snprintf(text, sizeof text, "\n\n<\xef\xbd\x9c" "DSML\xef\xbd\x9c" "tool_calls>\n<\xef\xbd\x9c" "DSML\xef\xbd\x9c" "invoke name=\"");
    if (n < 0 || (size_t)n >= sizeof text) return srv_fail(e, 400, "tool_choice: function name too long");
    dsv4_err de = {{0}};
    size_t cnt = 0;
    int32_t *ids = dsv4_tok_encode(S->tok, text, (size_t)n, 0, &cnt, &de);
    if (!ids) return srv_fail(e, 500, "tokenizing the tool-call opening: %s", de.msg);
    free(r->force);
    r->force = ids;
    r->n_force = (int)cnt;
    return 0;
}

int srv_render_chat(srv_ctx *S, srv_req *r, const cJSON *messages, const cJSON *tools, dsv4_chat_effort effort,
                    srv_error *e) {
    dsv4_chat_opts co = dsv4_chat_opts_default();
    co.mode = r->mode;
    co.effort = r->mode == DSV4_CHAT_THINKING ? effort : DSV4_EFFORT_NONE;
    dsv4_err de = {{0}};
    size_t len = 0;
    char *text = dsv4_chat_render(messages, tools, &co, &len, &de);
    if (!text) return srv_fail(e, 400, "%s", de.msg);
    r->chat = 1;
    int rc = srv_tokenize_prompt(S, r, text, len, 0, e);
    free(text);
    return rc;
}

int srv_finalize_sampling(srv_ctx *S, srv_req *r, int max_tokens, srv_error *e) {
    if (r->n_prompt == 0) return srv_fail(e, 400, "the prompt is empty");
    if (r->n_prompt >= S->cfg.max_context)
        return srv_fail(e, 400,
                        "This model's maximum context length is %d tokens. However, your prompt has %d tokens "
                        "(no room left to generate). Please reduce the length of the messages or prompt.",
                        S->cfg.max_context, r->n_prompt);
    int room = S->cfg.max_context - r->n_prompt;
    r->max_tokens = max_tokens > 0 && max_tokens < room ? max_tokens : room;
    r->sp.max_tokens = r->max_tokens;
    r->sp.stop = (const char *const *)r->stops;
    r->sp.n_stop = r->n_stop;
    if (r->min_tokens > r->max_tokens)
        return srv_fail(e, 400, "min_tokens (%d) must be at most max_tokens (%d)", r->min_tokens, r->max_tokens);
    for (int i = 0; i < r->n_stop_ids; i++)
        if (r->stop_ids[i] >= S->tok_vocab)
            return srv_fail(e, 400, "stop_token_ids: token %d is outside the vocabulary [0, %d)", (int)r->stop_ids[i],
                            S->tok_vocab);
    for (size_t i = 0; i < r->n_bias; i++)
        if (r->bias_tok[i] >= S->tok_vocab)
            return srv_fail(e, 400, "logit_bias: token %d is outside the vocabulary [0, %d)", (int)r->bias_tok[i],
                            S->tok_vocab);
    dsv4_err de = {{0}};
    if (dsv4_sampling_validate(&r->sp, &de)) return srv_fail(e, 400, "%s", de.msg);
    snprintf(r->id + strlen(r->id), sizeof r->id - strlen(r->id), "%lx", (unsigned long)atomic_fetch_add(&S->next_id, 1));
    size_t l = strlen(r->id);
    if (l + 17 < sizeof r->id) srv_random_hex(r->id + l, 16);
    r->created = (long)time(NULL);
    return 0;
}

/* ---- the consumer ---- */

static void on_delta(void *user, const dsv4_chat_delta *d) {
    srv_out *o = user;
    if (!o->r->stream) return; /* non-stream: the parser accumulates the message */
    if (o->r->api == SRV_API_ANTHROPIC) srv_anthropic_stream_delta(o, d);
    else if (o->r->api == SRV_API_RESPONSES) srv_responses_stream_delta(o, d);
    else srv_openai_stream_delta(o, d);
}

int srv_out_init(srv_out *o, srv_ctx *S, srv_req *r) {
    memset(o, 0, sizeof *o);
    o->S = S;
    o->r = r;
    o->finish = SRV_FIN_NONE;
    o->stop_index = -1;
    srv_random_hex(o->tool_prefix, 24);
    if (r->chat && !(o->parser = dsv4_chat_parser_new(r->mode, on_delta, o))) return -1;
    return 0;
}

void srv_out_free(srv_out *o) {
    dsv4_chat_parser_free(o->parser);
    dsv4_sb_free(&o->item_text);
    cJSON_Delete(o->items);
    o->items = NULL;
    dsv4_sb_free(&o->sse);
    dsv4_sb_free(&o->raw);
    free(o->lps);
    o->parser = NULL;
    o->lps = NULL;
}

int srv_out_pump(srv_out *o) {
    srv_req *r = o->r;
    if (o->ended) return 1;
    if (!o->started && r->stream) {
        o->started = 1;
        if (r->api == SRV_API_ANTHROPIC) srv_anthropic_stream_start(o);
        else if (r->api == SRV_API_RESPONSES) srv_responses_stream_start(o);
        else srv_openai_stream_start(o);
    }
    /* completions' echo: the prompt's text (with its records once the engine has them) before anything generated */
    if (r->echo && !o->echoed) {
        pthread_mutex_lock(&r->mu);
        const int ready = !r->logprobs || r->plp_done || r->done, have = r->plp_done && r->plps;
        pthread_mutex_unlock(&r->mu);
        if (!ready) return 0; /* (nothing generated can come before it: the records are complete first) */
        {
            /* the prompt's text without a leading BOS (the one a string prompt gets), as the client sent it */
            const int skip = r->n_prompt > 0 && r->prompt[0] == o->S->info.bos_token_id;
            dsv4_err de = {{0}};
            size_t el = 0;
            char *et = dsv4_tok_decode(o->S->tok, r->prompt + skip, (size_t)(r->n_prompt - skip), 0, &el, &de);
            if (!et) {
                o->oom = 1;
            } else {
                o->echoed = 1;
                if (r->logprobs && have) o->pl = r->plps, o->n_pl = r->n_prompt;
                if (r->stream) srv_openai_stream_text(o, et, el);
                else if (dsv4_sb_put(&o->raw, et, el)) o->oom = 1;
                free(et);
            }
        }
    }
    pthread_mutex_lock(&r->mu);
    size_t tn = r->text.n - o->text_off;
    char *text = NULL;
    if (tn && (text = malloc(tn))) memcpy(text, r->text.p + o->text_off, tn);
    else if (tn) o->oom = 1;
    o->text_off = r->text.n;
    size_t ln = r->n_lp - o->lp_off;
    if (ln) {
        if (o->n_lps + ln > o->cap_lps) {
            size_t cap = o->cap_lps ? o->cap_lps : 16;
            while (cap < o->n_lps + ln) cap *= 2;
            srv_lp *p = realloc(o->lps, cap * sizeof *p);
            if (p) {
                o->lps = p;
                o->cap_lps = cap;
            } else {
                o->oom = 1;
                ln = 0;
            }
        }
        if (ln) memcpy(o->lps + o->n_lps, r->lps + o->lp_off, ln * sizeof *o->lps);
        o->n_lps += ln;
        o->lp_off = r->n_lp;
    }
    int done = r->done;
    if (done) {
        o->finish = r->finish;
        o->stop_index = r->stop_index;
        o->n_gen = r->n_gen;
        snprintf(o->errmsg, sizeof o->errmsg, "%s", r->errmsg);
    } else {
        o->n_gen = (int)r->n_lp; /* only meaningful with logprobs; the final count comes with done */
    }
    pthread_mutex_unlock(&r->mu);

    dsv4_err de = {{0}};
    if (text) {
        if (o->parser) {
            if (dsv4_chat_parser_feed(o->parser, text, tn, &de)) o->oom = 1;
        } else if (r->stream) {
            srv_openai_stream_text(o, text, tn);
        } else {
            dsv4_sb_put(&o->raw, text, tn);
        }
        free(text);
    }
    if (!done) return 0;
    if (o->parser && dsv4_chat_parser_finish(o->parser, &de)) o->oom = 1;
    if (r->stream) {
        if (r->api == SRV_API_ANTHROPIC) srv_anthropic_stream_end(o);
        else if (r->api == SRV_API_RESPONSES) srv_responses_stream_end(o);
        else srv_openai_stream_end(o);
    }
    o->ended = 1;
    return 1;
}

cJSON *srv_tool_calls_json(srv_out *o, const dsv4_chat_parsed *m) {
    cJSON *a = cJSON_CreateArray();
    for (int i = 0; a && i < m->n_tool_calls; i++) {
        cJSON *c = cJSON_CreateObject(), *f = cJSON_CreateObject();
        char id[64];
        snprintf(id, sizeof id, "call_%s%d", o->tool_prefix, i);
        cJSON_AddStringToObject(c, "id", id);
        cJSON_AddStringToObject(c, "type", "function");
        cJSON_AddStringToObject(f, "name", m->tool_calls[i].name ? m->tool_calls[i].name : "");
        cJSON_AddStringToObject(f, "arguments", m->tool_calls[i].arguments ? m->tool_calls[i].arguments : "{}");
        cJSON_AddItemToObject(c, "function", f);
        cJSON_AddItemToArray(a, c);
    }
    return a;
}
