/* chat_parse.c - completion text -> assistant message, one-shot or streaming (see chat_parse.h).
 *
 * One state machine serves both: the one-shot parse feeds everything at once, so streaming and
 * one-shot results cannot drift apart. Each state has a few markers; text before the earliest complete
 * marker belongs to the state, and while no marker is complete the longest tail that could still grow
 * into one is held back. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* memmem, strndup */
#endif
#include "chat_parse.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "chat_json.h"

#define BAR "\xEF\xBD\x9C" /* ｜ U+FF5C */
#define DSML BAR "DSML" BAR

static const char M_THINK_START[] = "<think>";
static const char M_THINK_END[] = "</think>";
static const char M_TOOLS_NL[] = "\n\n<" DSML "tool_calls";
static const char M_TOOLS[] = "<" DSML "tool_calls";
static const char M_TOOLS_END[] = "</" DSML "tool_calls>";
static const char M_EOS[] = DSV4_EOS_TEXT;
static const char T_INVOKE[] = "<" DSML "invoke";
static const char T_INVOKE_END[] = "</" DSML "invoke";
static const char T_PARAM[] = "<" DSML "parameter";
static const char T_PARAM_END[] = "</" DSML "parameter";

typedef enum { S_START, S_REASONING, S_CONTENT, S_TOOLS, S_DONE } pstate;

/* the markers each state looks for (S_START and S_DONE have none) */
static const char *const state_markers[][4] = {
    [S_START] = {NULL},
    [S_REASONING] = {M_THINK_END, M_TOOLS_NL, M_EOS, NULL},
    [S_CONTENT] = {M_TOOLS_NL, M_TOOLS, M_EOS, NULL},
    [S_TOOLS] = {M_TOOLS_END, M_EOS, NULL},
    [S_DONE] = {NULL},
};

struct dsv4_chat_parser {
    dsv4_chat_mode mode;
    dsv4_chat_delta_fn fn;
    void *user;
    pstate st;
    dsv4_sb pend;       /* text of the current state not yet emitted */
    size_t scan;        /* no marker can start in pend before this offset */
    dsv4_sb opener;     /* S_TOOLS: the marker text that opened the block */
    int after_tools;    /* a tool-call block was parsed */
    dsv4_sb reasoning, content, after_eos;
    dsv4_chat_tool_call *calls;
    int n_calls, cap_calls;
    unsigned flags;
    int oom;
    dsv4_chat_parsed res; /* view handed out by dsv4_chat_parser_result */
};

/* ---------------------------------------------------------------------------------------------
 * Emitting
 * --------------------------------------------------------------------------------------------- */

static void emit_text(dsv4_chat_parser *p, dsv4_chat_delta_kind kind, const char *s, size_t n) {
    if (!n) return;
    if (kind == DSV4_DELTA_CONTENT && p->after_tools) p->flags |= DSV4_PARSE_TEXT_AFTER_TOOLS;
    dsv4_sb *acc = kind == DSV4_DELTA_REASONING ? &p->reasoning : &p->content;
    dsv4_sb_put(acc, s, n);
    if (acc->oom) p->oom = 1;
    if (p->fn && !p->oom) {
        dsv4_chat_delta d = {.kind = kind, .text = s, .len = n, .index = -1};
        p->fn(p->user, &d);
    }
}

static void consume(dsv4_chat_parser *p, size_t n) {
    memmove(p->pend.p, p->pend.p + n, p->pend.n - n);
    p->pend.n -= n;
    p->pend.p[p->pend.n] = 0;
    p->scan = 0;
}

static void free_call(dsv4_chat_tool_call *c) {
    free(c->id);
    free(c->name);
    free(c->arguments);
}

/* ---------------------------------------------------------------------------------------------
 * The DSML tool-call block
 * --------------------------------------------------------------------------------------------- */

typedef struct {
    const char *s;
    size_t n, i;
} cur;

static int at(const cur *c, const char *tag) {
    size_t k = strlen(tag);
    return c->n - c->i >= k && !memcmp(c->s + c->i, tag, k);
}

static void skip_ws(cur *c) {
    while (c->i < c->n && (c->s[c->i] == ' ' || c->s[c->i] == '\n' || c->s[c->i] == '\t' || c->s[c->i] == '\r')) c->i++;
}

static int is_ws(char ch) { return ch == ' ' || ch == '\n' || ch == '\t' || ch == '\r'; }

/* offset of the first occurrence of tag in c->s at or after from, or -1 */
static long find_from(const cur *c, size_t from, const char *tag) {
    if (from > c->n) return -1;
    const char *q = memmem(c->s + from, c->n - from, tag, strlen(tag));
    return q ? (long)(q - c->s) : -1;
}

typedef struct {
    dsv4_chat_tool_call *v;
    int n, cap;
} call_list;

/* Parses the block text between "<｜DSML｜tool_calls" and "</｜DSML｜tool_calls>". 0 on success (calls
 * appended to *out), 1 when malformed, -1 when out of memory. */
static int parse_block(const char *s, size_t n, call_list *out, unsigned *flags) {
    cur c = {s, n, 0};
    dsv4_sb args = {0}, names = {0}; /* names: the parameter names of one invoke, each NUL-terminated */
    int rc = 1;
    if (!at(&c, ">")) goto done;
    c.i++;
    skip_ws(&c);
    while (c.i < c.n) {
        if (!at(&c, T_INVOKE)) goto done;
        c.i += strlen(T_INVOKE);
        /* header: name="NAME"> up to the first parameter or the invoke's end */
        long jp = find_from(&c, c.i, T_PARAM), je = find_from(&c, c.i, T_INVOKE_END);
        long j = jp < 0 ? je : je < 0 ? jp : jp < je ? jp : je;
        if (j < 0) goto done;
        size_t h0 = c.i, h1 = (size_t)j;
        while (h0 < h1 && is_ws(s[h0])) h0++;
        while (h1 > h0 && is_ws(s[h1 - 1])) h1--;
        if (h1 - h0 < 8 || memcmp(s + h0, "name=\"", 6) || memcmp(s + h1 - 2, "\">", 2)) goto done;
        size_t name0 = h0 + 6, name1 = h1 - 2;
        c.i = (size_t)j;

        args.n = 0;
        names.n = 0;
        dsv4_sb_putc(&args, '{');
        int np = 0;
        while (at(&c, T_PARAM)) {
            c.i += strlen(T_PARAM);
            long k = find_from(&c, c.i, T_PARAM_END);
            if (k < 0) goto done;
            size_t p0 = c.i, p1 = (size_t)k;
            while (p0 < p1 && is_ws(s[p0])) p0++;
            if (p1 - p0 < 6 || memcmp(s + p0, "name=\"", 6)) goto done;
            p0 += 6;
            /* the name runs to the first `" string="true">` or `" string="false">` */
            static const char st[] = "\" string=\"true\">", sf[] = "\" string=\"false\">";
            const char *qt = memmem(s + p0, p1 - p0, st, sizeof st - 1);
            const char *qf = memmem(s + p0, p1 - p0, sf, sizeof sf - 1);
            int is_str = qt && (!qf || qt < qf);
            const char *q = is_str ? qt : qf;
            if (!q) goto done;
            size_t kn = (size_t)(q - (s + p0));
            const char *val = q + (is_str ? sizeof st - 1 : sizeof sf - 1);
            size_t vn = (size_t)(s + p1 - val);
            /* duplicate parameter names are malformed (a JSON object cannot hold both) */
            for (size_t o = 0; o < names.n;) {
                size_t l = strlen(names.p + o);
                if (l == kn && !memcmp(names.p + o, s + p0, kn)) goto done;
                o += l + 1;
            }
            if (memchr(s + p0, 0, kn)) goto done;
            dsv4_sb_put(&names, s + p0, kn);
            dsv4_sb_putc(&names, 0);

            if (np++) dsv4_sb_puts(&args, ", ");
            dsv4_pyjson_dump_string(&args, s + p0, kn, 0);
            dsv4_sb_puts(&args, ": ");
            cJSON *v = is_str ? NULL : dsv4_pyjson_parse(val, vn, NULL);
            if (v) {
                dsv4_pyjson_dump(&args, v, 0);
                cJSON_Delete(v);
            } else {
                if (!is_str) *flags |= DSV4_PARSE_BAD_PARAM_JSON;
                dsv4_pyjson_dump_string(&args, val, vn, 0);
            }
            c.i = (size_t)k + strlen(T_PARAM_END);
            if (!at(&c, ">")) goto done;
            c.i++;
            skip_ws(&c);
        }
        if (!at(&c, T_INVOKE_END)) goto done;
        c.i += strlen(T_INVOKE_END);
        if (!at(&c, ">")) goto done;
        c.i++;
        skip_ws(&c);
        dsv4_sb_putc(&args, '}');
        if (args.oom || names.oom) {
            rc = -1;
            goto done;
        }

        if (out->n == out->cap) {
            int cap = out->cap ? out->cap * 2 : 4;
            dsv4_chat_tool_call *v = realloc(out->v, (size_t)cap * sizeof *v);
            if (!v) {
                rc = -1;
                goto done;
            }
            out->v = v;
            out->cap = cap;
        }
        dsv4_chat_tool_call *tc = &out->v[out->n];
        tc->id = NULL;
        tc->name = strndup(s + name0, name1 - name0);
        tc->arguments = strndup(args.p, args.n);
        if (!tc->name || !tc->arguments) {
            free_call(tc);
            rc = -1;
            goto done;
        }
        out->n++;
    }
    rc = 0;
done:
    dsv4_sb_free(&args);
    dsv4_sb_free(&names);
    return rc;
}

/* A closed (or, with close == NULL, unterminated) tool-call block: tool calls if it parses, else the raw
 * text as content. */
static void finish_block(dsv4_chat_parser *p, const char *block, size_t n, const char *close) {
    call_list calls = {0};
    unsigned fl = 0;
    int rc = close ? parse_block(block, n, &calls, &fl) : 1;
    if (rc < 0) p->oom = 1;
    if (rc == 0) {
        p->flags |= fl | DSV4_PARSE_TOOL_CALLS;
        if (p->n_calls + calls.n > p->cap_calls) {
            int cap = p->cap_calls ? p->cap_calls : 4;
            while (cap < p->n_calls + calls.n) cap *= 2;
            dsv4_chat_tool_call *v = realloc(p->calls, (size_t)cap * sizeof *v);
            if (!v) {
                p->oom = 1;
                rc = -1;
            } else {
                p->calls = v;
                p->cap_calls = cap;
            }
        }
        for (int k = 0; k < calls.n; k++) {
            if (rc) {
                free_call(&calls.v[k]);
                continue;
            }
            char id[32];
            snprintf(id, sizeof id, "call_%d", p->n_calls);
            calls.v[k].id = strdup(id);
            if (!calls.v[k].id) p->oom = 1;
            p->calls[p->n_calls] = calls.v[k];
            if (p->fn && !p->oom) {
                dsv4_chat_delta d = {.kind = DSV4_DELTA_TOOL_CALL, .index = p->n_calls, .call = &p->calls[p->n_calls]};
                p->fn(p->user, &d);
            }
            p->n_calls++;
        }
        free(calls.v);
        p->after_tools = 1;
        return;
    }
    for (int k = 0; k < calls.n; k++) free_call(&calls.v[k]);
    free(calls.v);
    if (rc < 0) return;
    /* malformed or unterminated: everything, opener included, is content */
    p->flags |= DSV4_PARSE_BAD_TOOL_CALLS;
    dsv4_sb raw = {0};
    dsv4_sb_put(&raw, p->opener.p ? p->opener.p : "", p->opener.n);
    dsv4_sb_put(&raw, block, n);
    if (close) dsv4_sb_puts(&raw, close);
    if (raw.oom) p->oom = 1;
    else emit_text(p, DSV4_DELTA_CONTENT, raw.p, raw.n);
    dsv4_sb_free(&raw);
}

/* ---------------------------------------------------------------------------------------------
 * The state machine
 * --------------------------------------------------------------------------------------------- */

static size_t max_marker_len(pstate st) {
    size_t m = 0;
    for (int k = 0; state_markers[st][k]; k++)
        if (strlen(state_markers[st][k]) > m) m = strlen(state_markers[st][k]);
    return m;
}

/* earliest complete marker in pend at or after p->scan (ties: the longest); returns its index or -1 */
static int find_marker(const dsv4_chat_parser *p, size_t *pos) {
    int best = -1;
    size_t bpos = 0, blen = 0;
    for (int k = 0; state_markers[p->st][k]; k++) {
        const char *m = state_markers[p->st][k];
        size_t ml = strlen(m);
        if (p->pend.n < p->scan) continue;
        const char *q = memmem(p->pend.p + p->scan, p->pend.n - p->scan, m, ml);
        if (!q) continue;
        size_t at_ = (size_t)(q - p->pend.p);
        if (best < 0 || at_ < bpos || (at_ == bpos && ml > blen)) {
            best = k;
            bpos = at_;
            blen = ml;
        }
    }
    *pos = bpos;
    return best;
}

/* length of the longest tail of pend that is a proper prefix of one of the state's markers */
static size_t holdback(const dsv4_chat_parser *p) {
    size_t maxk = max_marker_len(p->st);
    if (maxk) maxk--;
    if (maxk > p->pend.n) maxk = p->pend.n;
    for (size_t k = maxk; k > 0; k--) {
        const char *tail = p->pend.p + p->pend.n - k;
        for (int j = 0; state_markers[p->st][j]; j++) {
            const char *m = state_markers[p->st][j];
            if (strlen(m) > k && !memcmp(tail, m, k)) return k;
        }
    }
    return 0;
}

static int process(dsv4_chat_parser *p, int final) {
    while (!p->oom) {
        if (p->st == S_START) {
            size_t l = sizeof M_THINK_START - 1, k = p->pend.n < l ? p->pend.n : l;
            if (memcmp(p->pend.p ? p->pend.p : "", M_THINK_START, k)) {
                p->st = S_REASONING; /* does not start with <think> */
            } else if (p->pend.n >= l) {
                consume(p, l);
                p->st = S_REASONING;
            } else if (!final) {
                return 0; /* a prefix of <think>: wait */
            } else {
                p->st = S_REASONING;
            }
            continue;
        }
        if (p->st == S_DONE) {
            if (p->pend.n) {
                p->flags |= DSV4_PARSE_TEXT_AFTER_EOS;
                dsv4_sb_put(&p->after_eos, p->pend.p, p->pend.n);
                if (p->after_eos.oom) p->oom = 1;
                consume(p, p->pend.n);
            }
            return p->oom ? -1 : 0;
        }
        dsv4_chat_delta_kind kind = p->st == S_REASONING ? DSV4_DELTA_REASONING : DSV4_DELTA_CONTENT;
        size_t pos;
        int k = p->pend.n ? find_marker(p, &pos) : -1;
        if (k >= 0) {
            const char *m = state_markers[p->st][k];
            size_t ml = strlen(m);
            if (p->st == S_TOOLS) {
                finish_block(p, p->pend.p, pos, m == M_TOOLS_END ? m : NULL);
                if (m == M_EOS) p->flags |= DSV4_PARSE_EOS;
                p->st = m == M_EOS ? S_DONE : S_CONTENT;
            } else {
                emit_text(p, kind, p->pend.p, pos);
                if (m == M_EOS) {
                    p->flags |= DSV4_PARSE_EOS;
                    if (p->st == S_REASONING) p->flags |= DSV4_PARSE_NO_THINK_END;
                    p->st = S_DONE;
                } else if (m == M_THINK_END) {
                    p->st = S_CONTENT;
                } else { /* a tool-call block opens */
                    if (p->st == S_REASONING) p->flags |= DSV4_PARSE_NO_THINK_END;
                    p->opener.n = 0;
                    dsv4_sb_put(&p->opener, m, ml);
                    if (p->opener.oom) p->oom = 1;
                    p->st = S_TOOLS;
                }
            }
            consume(p, pos + ml);
            continue;
        }
        if (final) {
            if (p->st == S_TOOLS) {
                finish_block(p, p->pend.p ? p->pend.p : "", p->pend.n, NULL);
                p->st = S_CONTENT;
            } else {
                if (p->st == S_REASONING) p->flags |= DSV4_PARSE_NO_THINK_END;
                emit_text(p, kind, p->pend.p, p->pend.n);
            }
            if (p->pend.n) consume(p, p->pend.n);
            return p->oom ? -1 : 0;
        }
        size_t ml = max_marker_len(p->st);
        if (p->st == S_TOOLS) { /* the block is taken whole: keep buffering */
            p->scan = p->pend.n >= ml ? p->pend.n - ml + 1 : 0;
            return 0;
        }
        size_t h = holdback(p), n = p->pend.n - h;
        if (!h) n = dsv4_utf8_complete_prefix(p->pend.p, p->pend.n);
        if (n) {
            emit_text(p, kind, p->pend.p, n);
            consume(p, n);
        }
        p->scan = p->pend.n >= ml ? p->pend.n - ml + 1 : 0;
        return p->oom ? -1 : 0;
    }
    return -1;
}

/* ---------------------------------------------------------------------------------------------
 * API
 * --------------------------------------------------------------------------------------------- */

dsv4_chat_parser *dsv4_chat_parser_new(dsv4_chat_mode mode, dsv4_chat_delta_fn fn, void *user) {
    dsv4_chat_parser *p = calloc(1, sizeof *p);
    if (!p) return NULL;
    p->mode = mode;
    p->fn = fn;
    p->user = user;
    p->st = mode == DSV4_CHAT_THINKING ? S_START : S_CONTENT;
    return p;
}

int dsv4_chat_parser_feed(dsv4_chat_parser *p, const char *text, size_t n, dsv4_err *err) {
    if (p->oom) return dsv4_errf(err, "completion parser: out of memory");
    if (!n) return 0;
    dsv4_sb_put(&p->pend, text, n);
    if (p->pend.oom) p->oom = 1;
    if (p->oom || process(p, 0)) return dsv4_errf(err, "completion parser: out of memory");
    return 0;
}

int dsv4_chat_parser_finish(dsv4_chat_parser *p, dsv4_err *err) {
    if (p->oom || process(p, 1)) return dsv4_errf(err, "completion parser: out of memory");
    return 0;
}

const dsv4_chat_parsed *dsv4_chat_parser_result(dsv4_chat_parser *p) {
    dsv4_chat_parsed *r = &p->res;
    r->reasoning_content = p->reasoning.p ? p->reasoning.p : "";
    r->reasoning_len = p->reasoning.n;
    r->content = p->content.p ? p->content.p : "";
    r->content_len = p->content.n;
    r->tool_calls = p->calls;
    r->n_tool_calls = p->n_calls;
    r->after_eos = p->after_eos.p ? p->after_eos.p : "";
    r->after_eos_len = p->after_eos.n;
    r->flags = p->flags;
    return r;
}

int dsv4_chat_parser_take(dsv4_chat_parser *p, dsv4_chat_parsed *out, dsv4_err *err) {
    memset(out, 0, sizeof *out);
    if (p->oom) return dsv4_errf(err, "completion parser: out of memory");
    out->reasoning_content = dsv4_sb_take(&p->reasoning, &out->reasoning_len);
    out->content = dsv4_sb_take(&p->content, &out->content_len);
    out->after_eos = dsv4_sb_take(&p->after_eos, &out->after_eos_len);
    out->tool_calls = p->calls;
    out->n_tool_calls = p->n_calls;
    out->flags = p->flags;
    p->calls = NULL;
    p->n_calls = p->cap_calls = 0;
    if (!out->reasoning_content || !out->content || !out->after_eos) {
        dsv4_chat_parsed_free(out);
        return dsv4_errf(err, "completion parser: out of memory");
    }
    return 0;
}

void dsv4_chat_parser_free(dsv4_chat_parser *p) {
    if (!p) return;
    dsv4_sb_free(&p->pend);
    dsv4_sb_free(&p->opener);
    dsv4_sb_free(&p->reasoning);
    dsv4_sb_free(&p->content);
    dsv4_sb_free(&p->after_eos);
    for (int k = 0; k < p->n_calls; k++) free_call(&p->calls[k]);
    free(p->calls);
    free(p);
}

int dsv4_chat_parse(const char *text, size_t n, dsv4_chat_mode mode, dsv4_chat_parsed *out, dsv4_err *err) {
    memset(out, 0, sizeof *out);
    dsv4_chat_parser *p = dsv4_chat_parser_new(mode, NULL, NULL);
    if (!p) return dsv4_errf(err, "completion parser: out of memory");
    int rc = dsv4_chat_parser_feed(p, text, n, err);
    if (!rc) rc = dsv4_chat_parser_finish(p, err);
    if (!rc) rc = dsv4_chat_parser_take(p, out, err);
    dsv4_chat_parser_free(p);
    return rc;
}

void dsv4_chat_parsed_free(dsv4_chat_parsed *m) {
    if (!m) return;
    free(m->reasoning_content);
    free(m->content);
    free(m->after_eos);
    for (int k = 0; k < m->n_tool_calls; k++) free_call(&m->tool_calls[k]);
    free(m->tool_calls);
    memset(m, 0, sizeof *m);
}

cJSON *dsv4_chat_parsed_to_json(const dsv4_chat_parsed *m) {
    cJSON *o = cJSON_CreateObject(), *calls = cJSON_CreateArray();
    if (!o || !calls) goto oom;
    if (!cJSON_AddStringToObject(o, "role", "assistant") ||
        !cJSON_AddStringToObject(o, "content", m->content ? m->content : "") ||
        !cJSON_AddStringToObject(o, "reasoning_content", m->reasoning_content ? m->reasoning_content : ""))
        goto oom;
    cJSON_AddItemToObject(o, "tool_calls", calls);
    calls = NULL;
    cJSON *arr = cJSON_GetObjectItemCaseSensitive(o, "tool_calls");
    for (int k = 0; k < m->n_tool_calls; k++) {
        const dsv4_chat_tool_call *tc = &m->tool_calls[k];
        cJSON *c = cJSON_CreateObject(), *fn = cJSON_CreateObject();
        if (!c || !fn) {
            cJSON_Delete(c);
            cJSON_Delete(fn);
            goto oom;
        }
        cJSON_AddItemToArray(arr, c);
        cJSON_AddItemToObject(c, "id", cJSON_CreateString(tc->id ? tc->id : ""));
        cJSON_AddItemToObject(c, "type", cJSON_CreateString("function"));
        cJSON_AddItemToObject(c, "function", fn);
        cJSON_AddItemToObject(fn, "name", cJSON_CreateString(tc->name ? tc->name : ""));
        cJSON_AddItemToObject(fn, "arguments", cJSON_CreateString(tc->arguments ? tc->arguments : "{}"));
        if (cJSON_GetArraySize(fn) != 2 || cJSON_GetArraySize(c) != 3) goto oom;
    }
    return o;
oom:
    cJSON_Delete(o);
    cJSON_Delete(calls);
    return NULL;
}
