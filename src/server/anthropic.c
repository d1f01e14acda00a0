/* anthropic.c - the Anthropic Messages API wire format: POST /v1/messages request parsing (system,
 * content blocks, tools / tool_use / tool_result, thinking) into the OpenAI-style message list the chat
 * encoding reads, the response body, the streaming events and the error object. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "server.h"

static const cJSON *get(const cJSON *o, const char *k) { return cJSON_GetObjectItemCaseSensitive(o, k); }
static int absent(const cJSON *v) { return !v || cJSON_IsNull(v); }

/* A text-only content (string or array of text blocks) -> a string (malloc'd), blocks joined by "\n\n". */
static char *text_of(const cJSON *c, const char *where, srv_error *e) {
    if (cJSON_IsString(c)) return strdup(c->valuestring);
    if (!cJSON_IsArray(c)) {
        srv_fail(e, 400, "%s: expected a string or an array of text blocks", where);
        return NULL;
    }
    dsv4_sb b = {0};
    int n = 0;
    const cJSON *blk;
    cJSON_ArrayForEach(blk, c) {
        const cJSON *t = get(blk, "type"), *tx = get(blk, "text");
        if (!cJSON_IsString(t) || strcmp(t->valuestring, "text") || !cJSON_IsString(tx)) {
            dsv4_sb_free(&b);
            srv_fail(e, 400, "%s: only text blocks are supported here (got %s)", where,
                     cJSON_IsString(t) ? t->valuestring : "a block without a type");
            return NULL;
        }
        if (n++) dsv4_sb_puts(&b, "\n\n");
        dsv4_sb_puts(&b, tx->valuestring);
    }
    return dsv4_sb_take(&b, NULL);
}

static cJSON *message(const char *role, const char *content) {
    cJSON *m = cJSON_CreateObject();
    cJSON_AddStringToObject(m, "role", role);
    if (content) cJSON_AddStringToObject(m, "content", content);
    return m;
}

/* One Anthropic message -> one or more OpenAI-style messages appended to out. */
static int convert_message(const cJSON *m, int idx, cJSON *out, srv_error *e) {
    char where[64];
    snprintf(where, sizeof where, "messages[%d]", idx);
    const cJSON *role = get(m, "role"), *content = get(m, "content");
    if (!cJSON_IsObject(m) || !cJSON_IsString(role)) return srv_fail(e, 400, "%s: expected {\"role\", \"content\"}", where);
    int user = !strcmp(role->valuestring, "user");
    if (!user && strcmp(role->valuestring, "assistant"))
        return srv_fail(e, 400, "%s.role: expected user or assistant, got '%s'", where, role->valuestring);
    if (cJSON_IsString(content)) {
        cJSON_AddItemToArray(out, message(role->valuestring, content->valuestring));
        return 0;
    }
    if (!cJSON_IsArray(content)) return srv_fail(e, 400, "%s.content: expected a string or an array of blocks", where);
    dsv4_sb text = {0}, think = {0};
    int ntext = 0;
    cJSON *calls = NULL;
    const cJSON *blk;
    int bi = 0;
    cJSON_ArrayForEach(blk, content) {
        const cJSON *t = get(blk, "type");
        char bw[96];
        snprintf(bw, sizeof bw, "%s.content[%d]", where, bi++);
        if (!cJSON_IsObject(blk) || !cJSON_IsString(t)) {
            srv_fail(e, 400, "%s: expected a content block with a type", bw);
            goto fail;
        }
        const char *ty = t->valuestring;
        if (!strcmp(ty, "text")) {
            const cJSON *tx = get(blk, "text");
            if (!cJSON_IsString(tx)) {
                srv_fail(e, 400, "%s.text: expected a string", bw);
                goto fail;
            }
            if (ntext++) dsv4_sb_puts(&text, "\n\n");
            dsv4_sb_puts(&text, tx->valuestring);
        } else if (!strcmp(ty, "thinking") && !user) {
            const cJSON *tx = get(blk, "thinking");
            if (!cJSON_IsString(tx)) {
                srv_fail(e, 400, "%s.thinking: expected a string", bw);
                goto fail;
            }
            dsv4_sb_puts(&think, tx->valuestring);
        } else if (!strcmp(ty, "redacted_thinking") && !user) {
            /* nothing to render */
        } else if (!strcmp(ty, "tool_use") && !user) {
            const cJSON *id = get(blk, "id"), *name = get(blk, "name"), *input = get(blk, "input");
            if (!cJSON_IsString(id) || !cJSON_IsString(name)) {
                srv_fail(e, 400, "%s: tool_use needs id and name", bw);
                goto fail;
            }
            if (!calls) calls = cJSON_CreateArray();
            cJSON *c = cJSON_CreateObject(), *f = cJSON_CreateObject();
            cJSON_AddStringToObject(c, "id", id->valuestring);
            cJSON_AddStringToObject(c, "type", "function");
            cJSON_AddStringToObject(f, "name", name->valuestring);
            cJSON_AddItemToObject(f, "arguments", cJSON_IsObject(input) ? cJSON_Duplicate(input, 1) : cJSON_CreateObject());
            cJSON_AddItemToObject(c, "function", f);
            cJSON_AddItemToArray(calls, c);
        } else if (!strcmp(ty, "tool_result") && user) {
            const cJSON *id = get(blk, "tool_use_id"), *c = get(blk, "content");
            if (!cJSON_IsString(id)) {
                srv_fail(e, 400, "%s: tool_result needs tool_use_id", bw);
                goto fail;
            }
            char *s = absent(c) ? strdup("") : text_of(c, bw, e);
            if (!s) goto fail;
            cJSON *tm = message("tool", s);
            free(s);
            cJSON_AddStringToObject(tm, "tool_call_id", id->valuestring);
            cJSON_AddItemToArray(out, tm);
        } else {
            srv_fail(e, 400, "%s: content block type '%s' is not supported in a%s message", bw, ty,
                     user ? " user" : "n assistant");
            goto fail;
        }
    }
    if (user) {
        if (ntext) cJSON_AddItemToArray(out, message("user", text.p ? text.p : ""));
    } else {
        cJSON *am = message("assistant", text.p ? text.p : "");
        if (think.p) cJSON_AddStringToObject(am, "reasoning_content", think.p);
        if (calls) cJSON_AddItemToObject(am, "tool_calls", calls);
        calls = NULL;
        cJSON_AddItemToArray(out, am);
    }
    dsv4_sb_free(&text);
    dsv4_sb_free(&think);
    return 0;
fail:
    cJSON_Delete(calls);
    dsv4_sb_free(&text);
    dsv4_sb_free(&think);
    return -1;
}

int srv_anthropic_parse(srv_ctx *S, const cJSON *b, srv_req *r, srv_error *e) {
    if (!cJSON_IsObject(b)) return srv_fail(e, 400, "the request body must be a JSON object");
    snprintf(r->id, sizeof r->id, "msg_");
    if (srv_check_model(S, b, r, 0, e)) return -1;
    long mt = 0;
    int rc = srv_get_int(b, "max_tokens", 1, 1L << 30, &mt, e);
    if (rc < 0) return -1;
    if (!rc) return srv_fail(e, 400, "max_tokens: Field required");
    if (srv_anthropic_prompt(S, b, r, e)) return -1;
    return srv_finalize_sampling(S, r, (int)mt, e);
}

int srv_anthropic_prompt(srv_ctx *S, const cJSON *b, srv_req *r, srv_error *e) {
    const cJSON *msgs = get(b, "messages");
    if (!cJSON_IsArray(msgs) || !cJSON_GetArraySize(msgs))
        return srv_fail(e, 400, "messages: expected a non-empty array of messages");
    int x = 0;
    if (srv_get_bool(b, "stream", &x, e) < 0) return -1;
    r->stream = x;

    int think = S->cfg.default_thinking;
    const cJSON *th = get(b, "thinking");
    if (!absent(th)) {
        const cJSON *t = cJSON_IsObject(th) ? get(th, "type") : NULL;
        if (cJSON_IsString(t) && (!strcmp(t->valuestring, "enabled") || !strcmp(t->valuestring, "adaptive"))) think = 1;
        else if (cJSON_IsString(t) && !strcmp(t->valuestring, "disabled")) think = 0;
        else return srv_fail(e, 400, "thinking: expected {\"type\": \"enabled\" | \"disabled\"}");
    }
    dsv4_chat_effort effort = DSV4_EFFORT_NONE;
    const cJSON *oc = get(b, "output_config");
    if (cJSON_IsObject(oc) && cJSON_IsString(get(oc, "effort")) && !strcmp(get(oc, "effort")->valuestring, "max"))
        effort = DSV4_EFFORT_MAX;
    r->mode = think ? DSV4_CHAT_THINKING : DSV4_CHAT_CHAT;

    cJSON *list = cJSON_CreateArray(), *tools = NULL;
    if (!list) return srv_fail(e, 500, "out of memory");
    const cJSON *sys = get(b, "system");
    if (!absent(sys)) {
        char *s = text_of(sys, "system", e);
        if (!s) goto fail;
        cJSON_AddItemToArray(list, message("system", s));
        free(s);
    }
    for (int i = 0; i < cJSON_GetArraySize(msgs); i++)
        if (convert_message(cJSON_GetArrayItem(msgs, i), i, list, e)) goto fail;

    const cJSON *tl = get(b, "tools");
    if (!absent(tl)) {
        if (!cJSON_IsArray(tl)) {
            srv_fail(e, 400, "tools: expected an array");
            goto fail;
        }
        tools = cJSON_CreateArray();
        for (int i = 0; i < cJSON_GetArraySize(tl); i++) {
            const cJSON *t = cJSON_GetArrayItem(tl, i), *name = get(t, "name"), *schema = get(t, "input_schema");
            if (!cJSON_IsString(name) || !cJSON_IsObject(schema)) {
                srv_fail(e, 400, "tools[%d]: expected {\"name\", \"description\", \"input_schema\"} (server tools are "
                                 "not supported)", i);
                goto fail;
            }
            cJSON *ot = cJSON_CreateObject(), *f = cJSON_CreateObject();
            cJSON_AddStringToObject(ot, "type", "function");
            cJSON_AddStringToObject(f, "name", name->valuestring);
            if (cJSON_IsString(get(t, "description"))) cJSON_AddStringToObject(f, "description", get(t, "description")->valuestring);
            cJSON_AddItemToObject(f, "parameters", cJSON_Duplicate(schema, 1));
            cJSON_AddItemToObject(ot, "function", f);
            cJSON_AddItemToArray(tools, ot);
        }
        if (!cJSON_GetArraySize(tools)) {
            cJSON_Delete(tools);
            tools = NULL;
        }
    }
    const cJSON *tc = get(b, "tool_choice");
    const char *force_name = NULL;
    int force = 0;
    if (!absent(tc)) {
        const cJSON *t = cJSON_IsObject(tc) ? get(tc, "type") : NULL;
        if (!cJSON_IsString(t) || (strcmp(t->valuestring, "auto") && strcmp(t->valuestring, "any") &&
                                   strcmp(t->valuestring, "tool") && strcmp(t->valuestring, "none"))) {
            srv_fail(e, 400, "tool_choice: expected {\"type\": \"auto\" | \"any\" | \"tool\" | \"none\"}");
            goto fail;
        }
        if (!strcmp(t->valuestring, "none")) {
            cJSON_Delete(tools);
            tools = NULL;
        } else if (!strcmp(t->valuestring, "any") || !strcmp(t->valuestring, "tool")) {
            if (!tools) {
                srv_fail(e, 400, "tool_choice '%s' needs tools", t->valuestring);
                goto fail;
            }
            force = 1;
            if (!strcmp(t->valuestring, "tool")) {
                const cJSON *n = get(tc, "name");
                if (!cJSON_IsString(n)) {
                    srv_fail(e, 400, "tool_choice: type 'tool' needs a name");
                    goto fail;
                }
                force_name = n->valuestring;
            }
        }
    }
    r->want_tools = tools != NULL;
    if (srv_parse_sampling(b, r, 2, "stop_sequences", e)) goto fail;
    if (srv_render_chat(S, r, list, tools, effort, e)) goto fail;
    if (force && srv_force_tool_call(S, r, force_name, e)) goto fail;
    cJSON_Delete(list);
    cJSON_Delete(tools);
    return 0;
fail:
    cJSON_Delete(list);
    cJSON_Delete(tools);
    return -1;
}

char *srv_anthropic_error_body(const srv_error *e) {
    const char *type = e->status == 401   ? "authentication_error"
                       : e->status == 403 ? "permission_error"
                       : e->status == 404 ? "not_found_error"
                       : e->status == 413 ? "request_too_large"
                       : e->status == 429 ? "rate_limit_error"
                       : e->status == 503 ? "overloaded_error"
                       : e->status >= 500 ? "api_error"
                                          : "invalid_request_error";
    cJSON *j = cJSON_CreateObject(), *er = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "type", "error");
    cJSON_AddStringToObject(er, "type", type);
    cJSON_AddStringToObject(er, "message", e->msg);
    cJSON_AddItemToObject(j, "error", er);
    return srv_json_print(j, NULL);
}

/* ---- responses ---- */

static const char *stop_reason(const srv_out *o, int tools) {
    if (tools) return "tool_use";
    switch (o->finish) {
    case SRV_FIN_STOP: return "stop_sequence";
    case SRV_FIN_LENGTH: return "max_tokens";
    default: return "end_turn";
    }
}

static void add_stop_sequence(cJSON *j, const srv_out *o) {
    const char *s = o->finish == SRV_FIN_STOP ? srv_stop_string(o->r, o->stop_index) : NULL;
    if (s) cJSON_AddStringToObject(j, "stop_sequence", s);
    else cJSON_AddNullToObject(j, "stop_sequence");
}

static cJSON *tool_use_block(srv_out *o, int index, const dsv4_chat_tool_call *c, int with_input) {
    cJSON *b = cJSON_CreateObject();
    char id[64];
    snprintf(id, sizeof id, "toolu_%s%d", o->tool_prefix, index);
    cJSON_AddStringToObject(b, "type", "tool_use");
    cJSON_AddStringToObject(b, "id", id);
    cJSON_AddStringToObject(b, "name", c->name ? c->name : "");
    cJSON *in = with_input && c->arguments ? cJSON_Parse(c->arguments) : NULL;
    if (!cJSON_IsObject(in)) {
        cJSON_Delete(in);
        in = cJSON_CreateObject();
    }
    cJSON_AddItemToObject(b, "input", in);
    return b;
}

static cJSON *message_head(srv_out *o, int final) {
    cJSON *m = cJSON_CreateObject();
    cJSON_AddStringToObject(m, "id", o->r->id);
    cJSON_AddStringToObject(m, "type", "message");
    cJSON_AddStringToObject(m, "role", "assistant");
    cJSON_AddStringToObject(m, "model", o->r->model);
    return m;
}

static cJSON *usage(const srv_out *o) {
    cJSON *u = cJSON_CreateObject();
    /* Anthropic's split: input_tokens are the ones computed, cache_read_input_tokens the ones read from a cache */
    cJSON_AddNumberToObject(u, "input_tokens", o->r->n_prompt - o->r->n_cached);
    if (o->r->n_cached > 0) cJSON_AddNumberToObject(u, "cache_read_input_tokens", o->r->n_cached);
    cJSON_AddNumberToObject(u, "output_tokens", o->n_gen);
    return u;
}

char *srv_anthropic_body(srv_out *o, size_t *len) {
    const dsv4_chat_parsed *m = dsv4_chat_parser_result(o->parser);
    cJSON *j = message_head(o, 1), *content = cJSON_CreateArray();
    int thinking = o->r->mode == DSV4_CHAT_THINKING && m->reasoning_len;
    if (thinking) {
        cJSON *b = cJSON_CreateObject();
        cJSON_AddStringToObject(b, "type", "thinking");
        cJSON_AddStringToObject(b, "thinking", m->reasoning_content);
        cJSON_AddStringToObject(b, "signature", "");
        cJSON_AddItemToArray(content, b);
    }
    if (m->content_len || (!m->n_tool_calls && !thinking)) {
        cJSON *b = cJSON_CreateObject();
        cJSON_AddStringToObject(b, "type", "text");
        cJSON_AddStringToObject(b, "text", m->content ? m->content : "");
        cJSON_AddItemToArray(content, b);
    }
    for (int i = 0; i < m->n_tool_calls; i++) cJSON_AddItemToArray(content, tool_use_block(o, i, &m->tool_calls[i], 1));
    cJSON_AddItemToObject(j, "content", content);
    cJSON_AddStringToObject(j, "stop_reason", stop_reason(o, m->n_tool_calls > 0));
    add_stop_sequence(j, o);
    cJSON_AddItemToObject(j, "usage", usage(o));
    return srv_json_print(j, len);
}

/* One SSE event; the data object gets "type" first, as Anthropic writes it. */
static void event(srv_out *o, const char *type, cJSON *data) {
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "type", type);
    while (data && data->child) {
        cJSON *it = cJSON_DetachItemViaPointer(data, data->child);
        cJSON_AddItemToObject(j, it->string, it);
    }
    cJSON_Delete(data);
    srv_sse(&o->sse, type, j);
}

static void close_block(srv_out *o) {
    if (!o->blk_open) return;
    cJSON *d;
    if (o->blk_open == 1) {
        d = cJSON_CreateObject();
        cJSON_AddNumberToObject(d, "index", o->blk_index);
        cJSON *dl = cJSON_CreateObject();
        cJSON_AddStringToObject(dl, "type", "signature_delta");
        cJSON_AddStringToObject(dl, "signature", "");
        cJSON_AddItemToObject(d, "delta", dl);
        event(o, "content_block_delta", d);
    }
    d = cJSON_CreateObject();
    cJSON_AddNumberToObject(d, "index", o->blk_index);
    event(o, "content_block_stop", d);
    o->blk_open = 0;
    o->blk_index++;
}

static void open_block(srv_out *o, int kind) {
    if (o->blk_open == kind) return;
    close_block(o);
    cJSON *d = cJSON_CreateObject(), *b = cJSON_CreateObject();
    cJSON_AddNumberToObject(d, "index", o->blk_index);
    cJSON_AddStringToObject(b, "type", kind == 1 ? "thinking" : "text");
    cJSON_AddStringToObject(b, kind == 1 ? "thinking" : "text", "");
    cJSON_AddItemToObject(d, "content_block", b);
    event(o, "content_block_start", d);
    o->blk_open = kind;
}

void srv_anthropic_stream_start(srv_out *o) {
    cJSON *m = message_head(o, 0), *d = cJSON_CreateObject();
    cJSON_AddItemToObject(m, "content", cJSON_CreateArray());
    cJSON_AddNullToObject(m, "stop_reason");
    cJSON_AddNullToObject(m, "stop_sequence");
    cJSON *u = cJSON_CreateObject();
    cJSON_AddNumberToObject(u, "input_tokens", o->r->n_prompt);
    cJSON_AddNumberToObject(u, "output_tokens", 0);
    cJSON_AddItemToObject(m, "usage", u);
    cJSON_AddItemToObject(d, "message", m);
    event(o, "message_start", d);
}

void srv_anthropic_stream_delta(srv_out *o, const dsv4_chat_delta *dl) {
    if (dl->kind == DSV4_DELTA_TOOL_CALL) {
        close_block(o);
        cJSON *d = cJSON_CreateObject();
        cJSON_AddNumberToObject(d, "index", o->blk_index);
        cJSON_AddItemToObject(d, "content_block", tool_use_block(o, dl->index, dl->call, 0));
        event(o, "content_block_start", d);
        d = cJSON_CreateObject();
        cJSON_AddNumberToObject(d, "index", o->blk_index);
        cJSON *x = cJSON_CreateObject();
        cJSON_AddStringToObject(x, "type", "input_json_delta");
        cJSON_AddStringToObject(x, "partial_json", dl->call->arguments ? dl->call->arguments : "{}");
        cJSON_AddItemToObject(d, "delta", x);
        event(o, "content_block_delta", d);
        d = cJSON_CreateObject();
        cJSON_AddNumberToObject(d, "index", o->blk_index);
        event(o, "content_block_stop", d);
        o->blk_index++;
        o->n_tools++;
        return;
    }
    int kind = dl->kind == DSV4_DELTA_REASONING ? 1 : 2;
    open_block(o, kind);
    cJSON *d = cJSON_CreateObject(), *x = cJSON_CreateObject();
    cJSON_AddNumberToObject(d, "index", o->blk_index);
    cJSON_AddStringToObject(x, "type", kind == 1 ? "thinking_delta" : "text_delta");
    char *t = strndup(dl->text, dl->len);
    cJSON_AddStringToObject(x, kind == 1 ? "thinking" : "text", t ? t : "");
    free(t);
    cJSON_AddItemToObject(d, "delta", x);
    event(o, "content_block_delta", d);
}

void srv_anthropic_stream_end(srv_out *o) {
    close_block(o);
    if (o->finish == SRV_FIN_ERROR || o->finish == SRV_FIN_ABORT) {
        srv_error e = {.status = o->finish == SRV_FIN_ABORT ? 503 : 500};
        snprintf(e.msg, sizeof e.msg, "%s", o->finish == SRV_FIN_ABORT ? "the request was cancelled (server shutting down)"
                                                                       : o->errmsg);
        char *body = srv_anthropic_error_body(&e);
        if (body) {
            dsv4_sb_printf(&o->sse, "event: error\ndata: %s\n\n", body);
            free(body);
        }
        return;
    }
    cJSON *d = cJSON_CreateObject(), *dl = cJSON_CreateObject(), *u = cJSON_CreateObject();
    cJSON_AddStringToObject(dl, "stop_reason", stop_reason(o, o->n_tools > 0));
    add_stop_sequence(dl, o);
    cJSON_AddItemToObject(d, "delta", dl);
    cJSON_AddNumberToObject(u, "output_tokens", o->n_gen);
    cJSON_AddItemToObject(d, "usage", u);
    event(o, "message_delta", d);
    event(o, "message_stop", cJSON_CreateObject());
}
