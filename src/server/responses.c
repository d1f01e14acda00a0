/* responses.c - OpenAI's Responses API (POST /v1/responses), stateless: the request (instructions, input items:
 * messages, function calls and their outputs, reasoning; function tools, tool_choice, reasoning.effort, text.format,
 * max_output_tokens, sampling) becomes a Chat Completions body that srv_openai_parse_chat reads; the answer goes out as
 * a response object (output items: reasoning, message, function_call) or its streaming events (response.created ...
 * response.completed, each with its sequence_number). No response is stored: previous_response_id is refused (the
 * conversation goes in input, as with store: false). OpenAI's developer role is instructions: leading system / developer
 * items join `instructions` in one system message, later ones are system messages (this model's own developer role
 * means something else). Hosted tools (web_search, file_search, ...) are left out: only function tools reach the
 * model. A stream's final response lists the items as they were streamed. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "server.h"

static const cJSON *get(const cJSON *o, const char *k) { return cJSON_GetObjectItemCaseSensitive(o, k); }
static int absent(const cJSON *v) { return !v || cJSON_IsNull(v); }

/* ---- the request ---- */

/* The text of a message's content: a string, or an array of text parts (input_text, output_text, text, refusal)
 * joined by newlines. malloc'd, or NULL with e set. */
static char *content_text(const cJSON *c, const char *where, srv_error *e) {
    if (cJSON_IsString(c)) return strdup(c->valuestring);
    if (!cJSON_IsArray(c)) return srv_fail(e, 400, "%s: expected a string or an array of content parts", where), NULL;
    dsv4_sb b = {0};
    int n = 0, i = 0;
    const cJSON *p;
    cJSON_ArrayForEach(p, c) {
        const cJSON *t = get(p, "type"), *tx = get(p, "text");
        const char *ty = cJSON_IsString(t) ? t->valuestring : "";
        if (!strcmp(ty, "refusal")) tx = get(p, "refusal");
        if ((strcmp(ty, "input_text") && strcmp(ty, "output_text") && strcmp(ty, "text") && strcmp(ty, "refusal")) ||
            !cJSON_IsString(tx)) {
            dsv4_sb_free(&b);
            return srv_fail(e, 400, "%s[%d]: content part type '%s' is not supported (text parts only)", where, i,
                            *ty ? ty : "(none)"),
                   NULL;
        }
        if (n++) dsv4_sb_puts(&b, "\n");
        dsv4_sb_puts(&b, tx->valuestring);
        i++;
    }
    char *s = dsv4_sb_take(&b, NULL);
    return s ? s : strdup("");
}

static cJSON *chat_message(cJSON *list, const char *role, const char *content) {
    cJSON *m = cJSON_CreateObject();
    cJSON_AddStringToObject(m, "role", role);
    cJSON_AddStringToObject(m, "content", content ? content : "");
    cJSON_AddItemToArray(list, m);
    return m;
}

/* input (a string or an array of items) -> Chat Completions messages appended to list; sys (instructions so far)
 * gets the leading system / developer items' text, and the caller puts it first. Reasoning items go on the next
 * assistant message (reasoning_content); function calls join the assistant message right before them, else start
 * one. */
static int convert_input(const cJSON *in, cJSON *list, dsv4_sb *sys, srv_error *e) {
    if (cJSON_IsString(in)) {
        chat_message(list, "user", in->valuestring);
        return 0;
    }
    if (!cJSON_IsArray(in) || !cJSON_GetArraySize(in))
        return srv_fail(e, 400, "input: expected a string or a non-empty array of input items");
    dsv4_sb think = {0};
    cJSON *last_asst = NULL; /* the assistant message function calls may join */
    int i = 0, rc = -1;
    const cJSON *it;
    cJSON_ArrayForEach(it, in) {
        char where[48];
        snprintf(where, sizeof where, "input[%d]", i++);
        if (!cJSON_IsObject(it)) {
            srv_fail(e, 400, "%s: expected an object", where);
            goto done;
        }
        const cJSON *t = get(it, "type");
        const char *ty = cJSON_IsString(t) ? t->valuestring : absent(t) ? "message" : "";
        if (!strcmp(ty, "message")) {
            const cJSON *role = get(it, "role");
            const char *ro = cJSON_IsString(role) ? role->valuestring : "";
            if (strcmp(ro, "user") && strcmp(ro, "assistant") && strcmp(ro, "system") && strcmp(ro, "developer")) {
                srv_fail(e, 400, "%s.role: expected user, assistant, system or developer, got '%s'", where, ro);
                goto done;
            }
            char w2[64];
            snprintf(w2, sizeof w2, "%s.content", where);
            char *text = content_text(get(it, "content"), w2, e);
            if (!text) goto done;
            const int sysrole = !strcmp(ro, "system") || !strcmp(ro, "developer");
            if (sysrole && !cJSON_GetArraySize(list)) { /* leading: with the instructions */
                if (sys->n) dsv4_sb_puts(sys, "\n\n");
                dsv4_sb_puts(sys, text);
                free(text);
                continue;
            }
            cJSON *m = chat_message(list, sysrole ? "system" : ro, text);
            free(text);
            last_asst = NULL;
            if (!strcmp(ro, "assistant")) {
                if (think.n) cJSON_AddStringToObject(m, "reasoning_content", think.p), think.n = 0;
                last_asst = m;
            }
        } else if (!strcmp(ty, "function_call")) {
            const cJSON *id = get(it, "call_id"), *name = get(it, "name"), *args = get(it, "arguments");
            if (!cJSON_IsString(id) || !cJSON_IsString(name) || (!absent(args) && !cJSON_IsString(args))) {
                srv_fail(e, 400, "%s: a function_call needs call_id, name and arguments (a string)", where);
                goto done;
            }
            if (!last_asst) {
                last_asst = chat_message(list, "assistant", "");
                if (think.n) cJSON_AddStringToObject(last_asst, "reasoning_content", think.p), think.n = 0;
            }
            cJSON *calls = cJSON_GetObjectItemCaseSensitive(last_asst, "tool_calls");
            if (!calls) cJSON_AddItemToObject(last_asst, "tool_calls", calls = cJSON_CreateArray());
            cJSON *c = cJSON_CreateObject(), *f = cJSON_CreateObject();
            cJSON_AddStringToObject(c, "id", id->valuestring);
            cJSON_AddStringToObject(c, "type", "function");
            cJSON_AddStringToObject(f, "name", name->valuestring);
            cJSON_AddStringToObject(f, "arguments", cJSON_IsString(args) ? args->valuestring : "{}");
            cJSON_AddItemToObject(c, "function", f);
            cJSON_AddItemToArray(calls, c);
        } else if (!strcmp(ty, "function_call_output")) {
            const cJSON *id = get(it, "call_id"), *out = get(it, "output");
            if (!cJSON_IsString(id) || absent(out)) {
                srv_fail(e, 400, "%s: a function_call_output needs call_id and output", where);
                goto done;
            }
            char w2[64];
            snprintf(w2, sizeof w2, "%s.output", where);
            char *text = content_text(out, w2, e);
            if (!text) goto done;
            cJSON *m = chat_message(list, "tool", text);
            free(text);
            cJSON_AddStringToObject(m, "tool_call_id", id->valuestring);
            last_asst = NULL;
        } else if (!strcmp(ty, "reasoning")) {
            /* its reasoning text (content), else its summary: the next assistant turn's reasoning_content */
            const cJSON *parts = get(it, "content");
            if (absent(parts) || !cJSON_GetArraySize(parts)) parts = get(it, "summary");
            const cJSON *p;
            cJSON_ArrayForEach(p, parts) {
                const cJSON *tx = get(p, "text");
                if (!cJSON_IsString(tx)) continue;
                if (think.n) dsv4_sb_puts(&think, "\n");
                dsv4_sb_puts(&think, tx->valuestring);
            }
            last_asst = NULL; /* what follows is the turn this reasoning belongs to */
        } else {
            srv_fail(e, 400, "%s: input item type '%s' is not supported (message, function_call, function_call_output, "
                             "reasoning)", where, *ty ? ty : "(not a string)");
            goto done;
        }
    }
    rc = 0;
done:
    dsv4_sb_free(&think);
    return rc;
}

/* The keys a Chat Completions body takes as they are (sampling, and this server's extensions) */
static const char *const passthrough[] = {
    "model", "stream", "temperature", "top_p", "top_k", "min_p", "presence_penalty", "frequency_penalty",
    "repetition_penalty", "seed", "stop", "ignore_eos", "logit_bias", "min_tokens", "stop_token_ids",
    "chat_template_kwargs", "thinking", "parallel_tool_calls",
};

/* The fields of the request a response object repeats */
static const char *const echoed[] = {
    "instructions", "max_output_tokens", "metadata", "parallel_tool_calls", "reasoning", "temperature", "text",
    "tool_choice", "tools", "top_p", "truncation", "user",
};

int srv_responses_parse(srv_ctx *S, const cJSON *b, srv_req *r, srv_error *e) {
    if (!cJSON_IsObject(b)) return srv_fail(e, 400, "the request body must be a JSON object");
    if (!absent(get(b, "previous_response_id")))
        return srv_fail(e, 400, "previous_response_id: this server stores no responses; send the conversation in input");
    if (!absent(get(b, "conversation")))
        return srv_fail(e, 400, "conversation: this server stores no conversations; send the conversation in input");
    if (!absent(get(b, "n"))) return srv_fail(e, 400, "n: not a Responses API parameter");
    if (cJSON_IsTrue(get(b, "background")))
        return srv_fail(e, 400, "background: this server stores no responses; send the request without it");
    cJSON *cb = cJSON_CreateObject(), *list = cJSON_CreateArray();
    if (!cb || !list) {
        cJSON_Delete(cb), cJSON_Delete(list);
        return srv_fail(e, 500, "out of memory");
    }
    cJSON_AddItemToObject(cb, "messages", list);
    int rc = -1;
    for (size_t i = 0; i < sizeof passthrough / sizeof *passthrough; i++) {
        const cJSON *v = get(b, passthrough[i]);
        if (v) cJSON_AddItemToObject(cb, passthrough[i], cJSON_Duplicate(v, 1));
    }
    dsv4_sb sys = {0};
    const cJSON *ins = get(b, "instructions");
    if (!absent(ins)) {
        if (!cJSON_IsString(ins)) {
            srv_fail(e, 400, "instructions: expected a string");
            goto done;
        }
        dsv4_sb_puts(&sys, ins->valuestring);
    }
    const int cv = convert_input(get(b, "input"), list, &sys, e);
    if (!cv && sys.n) { /* instructions and the leading system / developer items: one system message, first */
        cJSON *m = cJSON_CreateObject();
        cJSON_AddStringToObject(m, "role", "system");
        cJSON_AddStringToObject(m, "content", sys.p);
        cJSON_InsertItemInArray(list, 0, m);
    }
    dsv4_sb_free(&sys);
    if (cv) goto done;
    /* tools: function tools ({"type": "function", "name", "description", "parameters"}) */
    const cJSON *tl = get(b, "tools");
    if (!absent(tl)) {
        if (!cJSON_IsArray(tl)) {
            srv_fail(e, 400, "tools: expected an array");
            goto done;
        }
        cJSON *tools = cJSON_CreateArray();
        cJSON_AddItemToObject(cb, "tools", tools);
        int i = 0;
        const cJSON *t;
        cJSON_ArrayForEach(t, tl) {
            const cJSON *ty = get(t, "type"), *name = get(t, "name");
            if (!cJSON_IsString(ty)) {
                srv_fail(e, 400, "tools[%d]: expected {\"type\": \"function\", \"name\", \"parameters\"}", i);
                goto done;
            }
            if (strcmp(ty->valuestring, "function")) { /* a hosted tool: nothing here runs it */
                i++;
                continue;
            }
            if (!cJSON_IsString(name)) {
                srv_fail(e, 400, "tools[%d]: a function tool needs a name", i);
                goto done;
            }
            cJSON *ot = cJSON_CreateObject(), *f = cJSON_CreateObject();
            cJSON_AddStringToObject(ot, "type", "function");
            cJSON_AddStringToObject(f, "name", name->valuestring);
            if (cJSON_IsString(get(t, "description")))
                cJSON_AddStringToObject(f, "description", get(t, "description")->valuestring);
            if (cJSON_IsObject(get(t, "parameters"))) cJSON_AddItemToObject(f, "parameters", cJSON_Duplicate(get(t, "parameters"), 1));
            cJSON_AddItemToObject(ot, "function", f);
            cJSON_AddItemToArray(tools, ot);
            i++;
        }
    }
    const cJSON *tc = get(b, "tool_choice");
    if (!absent(tc)) {
        if (cJSON_IsString(tc)) {
            cJSON_AddItemToObject(cb, "tool_choice", cJSON_Duplicate(tc, 1));
        } else if (cJSON_IsObject(tc) && cJSON_IsString(get(tc, "type")) && !strcmp(get(tc, "type")->valuestring, "function") &&
                   cJSON_IsString(get(tc, "name"))) {
            cJSON *o = cJSON_CreateObject(), *f = cJSON_CreateObject();
            cJSON_AddStringToObject(o, "type", "function");
            cJSON_AddStringToObject(f, "name", get(tc, "name")->valuestring);
            cJSON_AddItemToObject(o, "function", f);
            cJSON_AddItemToObject(cb, "tool_choice", o);
        } else {
            srv_fail(e, 400, "tool_choice: expected none, auto, required or {\"type\": \"function\", \"name\": ...}");
            goto done;
        }
    }
    /* reasoning.effort -> the chat body's reasoning_effort (none / minimal: thinking off) */
    const cJSON *rs = get(b, "reasoning");
    if (!absent(rs)) {
        if (!cJSON_IsObject(rs)) {
            srv_fail(e, 400, "reasoning: expected an object");
            goto done;
        }
        const cJSON *ef = get(rs, "effort");
        if (!absent(ef)) cJSON_AddItemToObject(cb, "reasoning_effort", cJSON_Duplicate(ef, 1));
    }
    /* text.format -> response_format */
    const cJSON *tx = get(b, "text");
    const cJSON *fm = cJSON_IsObject(tx) ? get(tx, "format") : NULL;
    if (!absent(tx) && !cJSON_IsObject(tx)) {
        srv_fail(e, 400, "text: expected an object");
        goto done;
    }
    if (!absent(fm)) {
        const cJSON *ft = cJSON_IsObject(fm) ? get(fm, "type") : NULL;
        if (!cJSON_IsString(ft)) {
            srv_fail(e, 400, "text.format: expected {\"type\": \"text\" | \"json_object\" | \"json_schema\", ...}");
            goto done;
        }
        cJSON *rf = cJSON_CreateObject();
        cJSON_AddStringToObject(rf, "type", ft->valuestring);
        if (!strcmp(ft->valuestring, "json_schema")) { /* flattened here, nested in Chat Completions */
            cJSON *js = cJSON_CreateObject();
            const char *keys[] = {"name", "description", "schema", "strict"};
            for (int k = 0; k < 4; k++)
                if (get(fm, keys[k])) cJSON_AddItemToObject(js, keys[k], cJSON_Duplicate(get(fm, keys[k]), 1));
            cJSON_AddItemToObject(rf, "json_schema", js);
        }
        cJSON_AddItemToObject(cb, "response_format", rf);
    }
    const cJSON *mt = get(b, "max_output_tokens");
    if (!absent(mt)) cJSON_AddItemToObject(cb, "max_completion_tokens", cJSON_Duplicate(mt, 1));
    if (srv_openai_parse_chat(S, cb, r, e)) {
        /* a message naming a chat body's field names this API's */
        static const char *const names[][2] = {{"max_completion_tokens", "max_output_tokens"},
                                               {"reasoning_effort", "reasoning.effort"},
                                               {"response_format", "text.format"}};
        for (size_t i = 0; i < sizeof names / sizeof *names; i++) {
            const size_t l = strlen(names[i][0]);
            if (strncmp(e->msg, names[i][0], l)) continue;
            char m[sizeof e->msg];
            snprintf(m, sizeof m, "%s%s", names[i][1], e->msg + l);
            snprintf(e->msg, sizeof e->msg, "%s", m);
        }
        goto done;
    }
    r->api = SRV_API_RESPONSES;
    /* resp_ + the chat id's unique part */
    char id[sizeof r->id];
    snprintf(id, sizeof id, "resp_%s", r->id + strlen("chatcmpl-"));
    memcpy(r->id, id, sizeof r->id);
    if (!(r->echo_fields = cJSON_CreateObject())) {
        srv_fail(e, 500, "out of memory");
        goto done;
    }
    for (size_t i = 0; i < sizeof echoed / sizeof *echoed; i++) {
        const cJSON *v = get(b, echoed[i]);
        if (v) cJSON_AddItemToObject(r->echo_fields, echoed[i], cJSON_Duplicate(v, 1));
    }
    rc = 0;
done:
    cJSON_Delete(cb);
    return rc;
}

/* ---- the response ---- */

/* item ids: the response's unique part and the item's output index */
static void item_id(const srv_out *o, const char *prefix, int index, char *out, size_t cap) {
    snprintf(out, cap, "%s_%s_%d", prefix, o->r->id + strlen("resp_"), index);
}

static cJSON *reasoning_item(const srv_out *o, int index, const char *text, int done) {
    char id[96];
    item_id(o, "rs", index, id, sizeof id);
    cJSON *it = cJSON_CreateObject(), *content = cJSON_CreateArray(), *summary = cJSON_CreateArray();
    cJSON_AddStringToObject(it, "id", id);
    cJSON_AddStringToObject(it, "type", "reasoning");
    if (done) { /* the text as content and as summary (clients such as Codex send only the summary back) */
        cJSON *p = cJSON_CreateObject(), *q = cJSON_CreateObject();
        cJSON_AddStringToObject(p, "type", "reasoning_text");
        cJSON_AddStringToObject(p, "text", text ? text : "");
        cJSON_AddItemToArray(content, p);
        cJSON_AddStringToObject(q, "type", "summary_text");
        cJSON_AddStringToObject(q, "text", text ? text : "");
        cJSON_AddItemToArray(summary, q);
    }
    cJSON_AddItemToObject(it, "summary", summary);
    cJSON_AddItemToObject(it, "content", content);
    if (!done) cJSON_AddStringToObject(it, "status", "in_progress");
    return it;
}

static cJSON *text_part(const char *text) {
    cJSON *p = cJSON_CreateObject();
    cJSON_AddStringToObject(p, "type", "output_text");
    cJSON_AddStringToObject(p, "text", text ? text : "");
    cJSON_AddItemToObject(p, "annotations", cJSON_CreateArray());
    cJSON_AddItemToObject(p, "logprobs", cJSON_CreateArray());
    return p;
}

/* status: "in_progress" while streamed (no content yet), "completed", or "incomplete" (cut by max_output_tokens) */
static cJSON *message_item(const srv_out *o, int index, const char *text, const char *status) {
    char id[96];
    item_id(o, "msg", index, id, sizeof id);
    cJSON *it = cJSON_CreateObject(), *content = cJSON_CreateArray();
    cJSON_AddStringToObject(it, "id", id);
    cJSON_AddStringToObject(it, "type", "message");
    cJSON_AddStringToObject(it, "status", status);
    cJSON_AddStringToObject(it, "role", "assistant");
    if (strcmp(status, "in_progress")) cJSON_AddItemToArray(content, text_part(text));
    cJSON_AddItemToObject(it, "content", content);
    return it;
}

static cJSON *call_item(const srv_out *o, int index, int call, const dsv4_chat_tool_call *c, int done) {
    char id[96], cid[96];
    item_id(o, "fc", index, id, sizeof id);
    snprintf(cid, sizeof cid, "call_%s%d", o->tool_prefix, call);
    cJSON *it = cJSON_CreateObject();
    cJSON_AddStringToObject(it, "id", id);
    cJSON_AddStringToObject(it, "type", "function_call");
    cJSON_AddStringToObject(it, "status", done ? "completed" : "in_progress");
    cJSON_AddStringToObject(it, "call_id", cid);
    cJSON_AddStringToObject(it, "name", c->name ? c->name : "");
    cJSON_AddStringToObject(it, "arguments", done ? (c->arguments ? c->arguments : "{}") : "");
    return it;
}

static const char *msg_status(const srv_out *o) { return o->finish == SRV_FIN_LENGTH ? "incomplete" : "completed"; }

/* the output items of a whole answer (the body): reasoning, the message (when it has text, or when there is nothing
 * else), the function calls */
static cJSON *output_items(const srv_out *o, const dsv4_chat_parsed *m) {
    cJSON *a = cJSON_CreateArray();
    int k = 0;
    if (m->reasoning_len) cJSON_AddItemToArray(a, reasoning_item(o, k++, m->reasoning_content, 1));
    if (m->content_len || !m->n_tool_calls) cJSON_AddItemToArray(a, message_item(o, k++, m->content, msg_status(o)));
    for (int i = 0; i < m->n_tool_calls; i++) cJSON_AddItemToArray(a, call_item(o, k++, i, &m->tool_calls[i], 1));
    return a;
}

static cJSON *usage(const srv_out *o, const dsv4_chat_parsed *m) {
    cJSON *u = cJSON_CreateObject(), *in = cJSON_CreateObject(), *out = cJSON_CreateObject();
    /* the reasoning's tokens, counted again from its text (the engine keeps one count for the answer) */
    long rt = 0;
    if (m && m->reasoning_len) {
        size_t n = 0;
        dsv4_err de = {{0}};
        int32_t *ids = dsv4_tok_encode(o->S->tok, m->reasoning_content, m->reasoning_len, 0, &n, &de);
        rt = ids ? (long)n : 0;
        free(ids);
        if (rt > o->n_gen) rt = o->n_gen;
    }
    cJSON_AddNumberToObject(u, "input_tokens", o->r->n_prompt);
    cJSON_AddNumberToObject(in, "cached_tokens", o->r->n_cached);
    cJSON_AddItemToObject(u, "input_tokens_details", in);
    cJSON_AddNumberToObject(u, "output_tokens", o->n_gen);
    cJSON_AddNumberToObject(out, "reasoning_tokens", (double)rt);
    cJSON_AddItemToObject(u, "output_tokens_details", out);
    cJSON_AddNumberToObject(u, "total_tokens", o->r->n_prompt + o->n_gen);
    return u;
}

/* The response object: status in_progress (m NULL: no output yet), completed, incomplete (max_output_tokens or the
 * context) or failed. */
static cJSON *response_obj(const srv_out *o, const dsv4_chat_parsed *m, int final) {
    const srv_req *r = o->r;
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "id", r->id);
    cJSON_AddStringToObject(j, "object", "response");
    cJSON_AddNumberToObject(j, "created_at", (double)r->created);
    const char *status = !final ? "in_progress"
                         : o->finish == SRV_FIN_ERROR || o->finish == SRV_FIN_ABORT ? "failed"
                         : o->finish == SRV_FIN_LENGTH ? "incomplete"
                                                       : "completed";
    cJSON_AddStringToObject(j, "status", status);
    if (final && (o->finish == SRV_FIN_ERROR || o->finish == SRV_FIN_ABORT)) {
        cJSON *er = cJSON_CreateObject();
        cJSON_AddStringToObject(er, "code", "server_error");
        cJSON_AddStringToObject(er, "message", o->finish == SRV_FIN_ABORT ? "the request was cancelled" : o->errmsg);
        cJSON_AddItemToObject(j, "error", er);
    } else {
        cJSON_AddNullToObject(j, "error");
    }
    if (final && o->finish == SRV_FIN_LENGTH) {
        cJSON *d = cJSON_CreateObject();
        cJSON_AddStringToObject(d, "reason", "max_output_tokens");
        cJSON_AddItemToObject(j, "incomplete_details", d);
    } else {
        cJSON_AddNullToObject(j, "incomplete_details");
    }
    cJSON_AddStringToObject(j, "model", r->model);
    /* a stream's: the items as streamed; a body's: from the whole answer */
    cJSON_AddItemToObject(j, "output", !final || !m ? cJSON_CreateArray()
                                       : r->stream ? (o->items ? cJSON_Duplicate(o->items, 1) : cJSON_CreateArray())
                                                   : output_items(o, m));
    /* the request's settings, as given (defaults where it gave none) */
    const cJSON *ef = r->echo_fields;
    for (const cJSON *v = ef ? ef->child : NULL; v; v = v->next) cJSON_AddItemToObject(j, v->string, cJSON_Duplicate(v, 1));
    if (!get(j, "instructions")) cJSON_AddNullToObject(j, "instructions");
    if (!get(j, "max_output_tokens")) cJSON_AddNullToObject(j, "max_output_tokens");
    if (!get(j, "metadata")) cJSON_AddItemToObject(j, "metadata", cJSON_CreateObject());
    if (!get(j, "parallel_tool_calls")) cJSON_AddTrueToObject(j, "parallel_tool_calls");
    if (!get(j, "temperature")) cJSON_AddNumberToObject(j, "temperature", r->sp.temperature);
    if (!get(j, "top_p")) cJSON_AddNumberToObject(j, "top_p", r->sp.top_p);
    if (!get(j, "tool_choice")) cJSON_AddStringToObject(j, "tool_choice", "auto");
    if (!get(j, "tools")) cJSON_AddItemToObject(j, "tools", cJSON_CreateArray());
    if (!get(j, "truncation")) cJSON_AddStringToObject(j, "truncation", "disabled");
    if (!get(j, "text")) {
        cJSON *t = cJSON_CreateObject(), *f = cJSON_CreateObject();
        cJSON_AddStringToObject(f, "type", "text");
        cJSON_AddItemToObject(t, "format", f);
        cJSON_AddItemToObject(j, "text", t);
    }
    cJSON_AddNullToObject(j, "previous_response_id");
    cJSON_AddFalseToObject(j, "store");
    if (final) cJSON_AddItemToObject(j, "usage", usage(o, m));
    else cJSON_AddNullToObject(j, "usage");
    return j;
}

char *srv_responses_body(srv_out *o, size_t *len) {
    return srv_json_print(response_obj(o, dsv4_chat_parser_result(o->parser), 1), len);
}

/* ---- streaming: events typed and numbered ---- */

static void event(srv_out *o, const char *type, cJSON *data) {
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "type", type);
    cJSON_AddNumberToObject(j, "sequence_number", o->seq++);
    while (data && data->child) {
        cJSON *it = cJSON_DetachItemViaPointer(data, data->child);
        cJSON_AddItemToObject(j, it->string, it);
    }
    cJSON_Delete(data);
    srv_sse(&o->sse, type, j);
}

static cJSON *at(const srv_out *o, const char *prefix, int content_index) {
    char id[96];
    item_id(o, prefix, o->blk_index, id, sizeof id);
    cJSON *d = cJSON_CreateObject();
    cJSON_AddStringToObject(d, "item_id", id);
    cJSON_AddNumberToObject(d, "output_index", o->blk_index);
    if (content_index >= 0) cJSON_AddNumberToObject(d, "content_index", content_index);
    return d;
}

static void item_event(srv_out *o, const char *type, cJSON *item) {
    cJSON *d = cJSON_CreateObject();
    cJSON_AddNumberToObject(d, "output_index", o->blk_index);
    if (!strcmp(type, "response.output_item.done")) { /* kept for the final response */
        if (!o->items) o->items = cJSON_CreateArray();
        cJSON_AddItemToArray(o->items, cJSON_Duplicate(item, 1));
    }
    cJSON_AddItemToObject(d, "item", item);
    event(o, type, d);
}

static cJSON *reasoning_part(const char *text) {
    cJSON *p = cJSON_CreateObject();
    cJSON_AddStringToObject(p, "type", "reasoning_text");
    cJSON_AddStringToObject(p, "text", text ? text : "");
    return p;
}

/* closes the open reasoning (1) or message (2) item with its done events; its text is what its deltas carried */
static void close_item(srv_out *o) {
    if (!o->blk_open) return;
    const char *text = o->item_text.p ? o->item_text.p : "";
    if (o->blk_open == 1) {
        cJSON *d = at(o, "rs", 0);
        cJSON_AddStringToObject(d, "text", text);
        event(o, "response.reasoning_text.done", d);
        d = at(o, "rs", 0);
        cJSON_AddItemToObject(d, "part", reasoning_part(text));
        event(o, "response.content_part.done", d);
        item_event(o, "response.output_item.done", reasoning_item(o, o->blk_index, text, 1));
    } else {
        cJSON *d = at(o, "msg", 0);
        cJSON_AddStringToObject(d, "text", text);
        cJSON_AddItemToObject(d, "logprobs", cJSON_CreateArray());
        event(o, "response.output_text.done", d);
        d = at(o, "msg", 0);
        cJSON_AddItemToObject(d, "part", text_part(text));
        event(o, "response.content_part.done", d);
        item_event(o, "response.output_item.done", message_item(o, o->blk_index, text, msg_status(o)));
    }
    o->item_text.n = 0;
    o->blk_open = 0;
    o->blk_index++;
}

static void open_item(srv_out *o, int kind) {
    if (o->blk_open == kind) return;
    close_item(o);
    cJSON *d;
    if (kind == 1) {
        item_event(o, "response.output_item.added", reasoning_item(o, o->blk_index, NULL, 0));
        d = at(o, "rs", 0);
        cJSON_AddItemToObject(d, "part", reasoning_part(""));
    } else {
        item_event(o, "response.output_item.added", message_item(o, o->blk_index, NULL, "in_progress"));
        d = at(o, "msg", 0);
        cJSON_AddItemToObject(d, "part", text_part(""));
        o->n_msg = 1;
    }
    event(o, "response.content_part.added", d);
    o->item_text.n = 0;
    if (o->item_text.p) o->item_text.p[0] = 0;
    o->blk_open = kind;
}

void srv_responses_stream_start(srv_out *o) {
    cJSON *d = cJSON_CreateObject();
    cJSON_AddItemToObject(d, "response", response_obj(o, NULL, 0));
    event(o, "response.created", d);
    d = cJSON_CreateObject();
    cJSON_AddItemToObject(d, "response", response_obj(o, NULL, 0));
    event(o, "response.in_progress", d);
}

void srv_responses_stream_delta(srv_out *o, const dsv4_chat_delta *dl) {
    if (dl->kind == DSV4_DELTA_TOOL_CALL) {
        close_item(o);
        item_event(o, "response.output_item.added", call_item(o, o->blk_index, dl->index, dl->call, 0));
        char id[96];
        item_id(o, "fc", o->blk_index, id, sizeof id);
        cJSON *d = cJSON_CreateObject();
        cJSON_AddStringToObject(d, "item_id", id);
        cJSON_AddNumberToObject(d, "output_index", o->blk_index);
        cJSON_AddStringToObject(d, "delta", dl->call->arguments ? dl->call->arguments : "{}");
        event(o, "response.function_call_arguments.delta", d);
        d = cJSON_CreateObject();
        cJSON_AddStringToObject(d, "item_id", id);
        cJSON_AddNumberToObject(d, "output_index", o->blk_index);
        cJSON_AddStringToObject(d, "arguments", dl->call->arguments ? dl->call->arguments : "{}");
        event(o, "response.function_call_arguments.done", d);
        item_event(o, "response.output_item.done", call_item(o, o->blk_index, dl->index, dl->call, 1));
        o->blk_index++;
        o->n_tools++;
        return;
    }
    const int kind = dl->kind == DSV4_DELTA_REASONING ? 1 : 2;
    open_item(o, kind);
    dsv4_sb_put(&o->item_text, dl->text, dl->len);
    cJSON *d = at(o, kind == 1 ? "rs" : "msg", 0);
    char *t = strndup(dl->text, dl->len);
    cJSON_AddStringToObject(d, "delta", t ? t : "");
    free(t);
    if (kind == 2) cJSON_AddItemToObject(d, "logprobs", cJSON_CreateArray());
    event(o, kind == 1 ? "response.reasoning_text.delta" : "response.output_text.delta", d);
}

void srv_responses_stream_end(srv_out *o) {
    close_item(o);
    /* an answer with nothing else has an (empty) message, as the body does */
    if (!o->n_msg && !o->n_tools && o->finish != SRV_FIN_ERROR && o->finish != SRV_FIN_ABORT) {
        open_item(o, 2);
        close_item(o);
    }
    const char *type = o->finish == SRV_FIN_ERROR || o->finish == SRV_FIN_ABORT ? "response.failed"
                       : o->finish == SRV_FIN_LENGTH                           ? "response.incomplete"
                                                                               : "response.completed";
    cJSON *d = cJSON_CreateObject();
    cJSON_AddItemToObject(d, "response", response_obj(o, dsv4_chat_parser_result(o->parser), 1));
    event(o, type, d);
}
