/* chat.c - DeepSeek-V4 chat encoding (see chat.h). Mirrors encoding_dsv4.py step by step:
 * validate -> merge_tool_messages -> sort_tool_results_by_call_order -> _drop_thinking_messages ->
 * render_message for each message. */
#include "chat.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "chat_json.h"

/* ---------------------------------------------------------------------------------------------
 * Fixed text
 * --------------------------------------------------------------------------------------------- */

#define BAR "\xEF\xBD\x9C" /* ｜ U+FF5C */
#define USER_TOK "<" BAR "User" BAR ">"
#define ASSISTANT_TOK "<" BAR "Assistant" BAR ">"
#define REMINDER_TOK "<" BAR "latest_reminder" BAR ">"
#define DSML BAR "DSML" BAR
#define THINK_START "<think>"
#define THINK_END "</think>"

static const char effort_max_prefix[] =
    "Reasoning Effort: Absolute maximum with no shortcuts permitted.\n"
    "You MUST be very thorough in your thinking and comprehensively decompose the problem to resolve the root "
    "cause, rigorously stress-testing your logic against all potential paths, edge cases, and adversarial "
    "scenarios.\n"
    "Explicitly write out your entire deliberation process, documenting every intermediate step, considered "
    "alternative, and rejected hypothesis to ensure absolutely no assumption is left unchecked.\n\n";

static const char tools_head[] =
    "## Tools\n\n"
    "You have access to a set of tools to help answer the user's question. You can invoke tools by writing a "
    "\"<" DSML "tool_calls>\" block like the following:\n\n"
    "<" DSML "tool_calls>\n"
    "<" DSML "invoke name=\"$TOOL_NAME\">\n"
    "<" DSML "parameter name=\"$PARAMETER_NAME\" string=\"true|false\">$PARAMETER_VALUE</" DSML "parameter>\n"
    "...\n"
    "</" DSML "invoke>\n"
    "<" DSML "invoke name=\"$TOOL_NAME2\">\n"
    "...\n"
    "</" DSML "invoke>\n"
    "</" DSML "tool_calls>\n\n"
    "String parameters should be specified as is and set `string=\"true\"`. For all other types (numbers, "
    "booleans, arrays, objects), pass the value in JSON format and set `string=\"false\"`.\n\n"
    "If thinking_mode is enabled (triggered by " THINK_START "), you MUST output your complete reasoning inside "
    THINK_START "..." THINK_END " BEFORE any tool calls or final response.\n\n"
    "Otherwise, output directly after " THINK_END " with tool calls or final response.\n\n"
    "### Available Tool Schemas\n\n";

static const char tools_tail[] =
    "\n\nYou MUST strictly follow the above defined tool name and parameter schemas to invoke tool calls.\n";

static const char response_format_head[] =
    "## Response Format:\n\nYou MUST strictly adhere to the following schema to reply:\n";

static const struct {
    const char *name, *token;
} tasks[] = {
    {"action", "<" BAR "action" BAR ">"}, {"query", "<" BAR "query" BAR ">"},
    {"authority", "<" BAR "authority" BAR ">"}, {"domain", "<" BAR "domain" BAR ">"},
    {"title", "<" BAR "title" BAR ">"}, {"read_url", "<" BAR "read_url" BAR ">"},
};

dsv4_chat_opts dsv4_chat_opts_default(void) {
    dsv4_chat_opts o = {.mode = DSV4_CHAT_THINKING, .drop_thinking = 1, .effort = DSV4_EFFORT_NONE, .add_bos = 1};
    return o;
}

/* ---------------------------------------------------------------------------------------------
 * Internal message list
 * --------------------------------------------------------------------------------------------- */

typedef enum { R_SYSTEM, R_USER, R_ASSISTANT, R_TOOL, R_DEVELOPER, R_REMINDER } role_t;

static const char *const role_names[] = {"system", "user", "assistant", "tool", "developer", "latest_reminder"};

typedef struct {
    int is_tool;          /* 0: text block (a user message's content), 1: tool result */
    const char *id;       /* tool_call_id ("" if none) */
    const cJSON *content; /* string or array of parts */
} block;

typedef struct {
    role_t role;
    const cJSON *src;     /* the original message (NULL for the system message made for separate tools) */
    block *blocks;        /* user messages (after merging) */
    int nblocks, capblocks;
    const char *task;     /* NULL when none */
    int wo_eos;
    int drop_reasoning;   /* set by the drop_thinking step */
    const cJSON *tools[2];/* the message's own tools, then the separately given ones */
} imsg;

typedef struct {
    imsg *m;
    int n, cap;
} imsg_list;

static const cJSON *field(const cJSON *msg, const char *key) {
    return msg ? cJSON_GetObjectItemCaseSensitive(msg, key) : NULL;
}

static int is_absent(const cJSON *v) { return !v || cJSON_IsNull(v); }

static const char *str_or_null(const cJSON *v) { return cJSON_IsString(v) ? v->valuestring : NULL; }

static int list_push(imsg_list *l, const imsg *m) {
    if (l->n == l->cap) {
        int cap = l->cap ? l->cap * 2 : 16;
        imsg *p = realloc(l->m, (size_t)cap * sizeof *p);
        if (!p) return -1;
        l->m = p;
        l->cap = cap;
    }
    l->m[l->n++] = *m;
    return 0;
}

static int block_push(imsg *m, const block *b) {
    if (m->nblocks == m->capblocks) {
        int cap = m->capblocks ? m->capblocks * 2 : 4;
        block *p = realloc(m->blocks, (size_t)cap * sizeof *p);
        if (!p) return -1;
        m->blocks = p;
        m->capblocks = cap;
    }
    m->blocks[m->nblocks++] = *b;
    return 0;
}

static void list_free(imsg_list *l) {
    for (int i = 0; i < l->n; i++) free(l->m[i].blocks);
    free(l->m);
    l->m = NULL;
    l->n = l->cap = 0;
}

/* ---------------------------------------------------------------------------------------------
 * Validation (one message at a time, in input order)
 * --------------------------------------------------------------------------------------------- */

static int parse_role(const char *s, role_t *r) {
    for (int i = 0; i < (int)(sizeof role_names / sizeof role_names[0]); i++)
        if (!strcmp(s, role_names[i])) {
            *r = (role_t)i;
            return 0;
        }
    return -1;
}

/* an array of {"type": "text", "text": "..."} parts (allow_other: other part types too) */
static int check_parts(const cJSON *c, int allow_other, dsv4_err *err, const char *where) {
    int k = 0;
    for (const cJSON *p = c->child; p; p = p->next, k++) {
        const cJSON *type = field(p, "type");
        if (!cJSON_IsObject(p) || !cJSON_IsString(type))
            return dsv4_errf(err, "%s: content[%d] is not a {\"type\": ..., ...} part", where, k);
        if (!strcmp(type->valuestring, "text")) {
            const cJSON *t = field(p, "text");
            if (!is_absent(t) && !cJSON_IsString(t))
                return dsv4_errf(err, "%s: content[%d].text is not a string", where, k);
        } else if (!allow_other) {
            return dsv4_errf(err, "%s: content part type \"%s\" is not supported (text only)", where, type->valuestring);
        }
    }
    return 0;
}

static int check_tools(const cJSON *tools, dsv4_err *err, const char *where) {
    if (is_absent(tools)) return 0;
    if (!cJSON_IsArray(tools)) return dsv4_errf(err, "%s: tools is not an array", where);
    int k = 0;
    for (const cJSON *t = tools->child; t; t = t->next, k++)
        if (!cJSON_IsObject(field(t, "function")))
            return dsv4_errf(err, "%s: tools[%d] has no \"function\" object", where, k);
    return 0;
}

static int check_message(int i, const cJSON *msg, int prev_called_tools, role_t *role_out, dsv4_err *err) {
    char where[96];
    snprintf(where, sizeof where, "messages[%d]", i);
    if (!cJSON_IsObject(msg)) return dsv4_errf(err, "%s: not a JSON object", where);
    const cJSON *role = field(msg, "role");
    if (is_absent(role)) return dsv4_errf(err, "%s: missing \"role\"", where);
    if (!cJSON_IsString(role)) return dsv4_errf(err, "%s: \"role\" is not a string", where);
    role_t r;
    if (parse_role(role->valuestring, &r))
        return dsv4_errf(err,
                         "%s: unknown role \"%.100s\" (expected system, user, assistant, tool, developer or "
                         "latest_reminder)",
                         where, role->valuestring);
    snprintf(where, sizeof where, "messages[%d] (%s)", i, role_names[r]);
    *role_out = r;

    /* content: a string or an array of text parts (tool results may also hold other part types, which
     * render as "[Unsupported TYPE]" like the reference does); required except for system / assistant */
    const cJSON *content = field(msg, "content");
    if (is_absent(content)) {
        if (r != R_SYSTEM && r != R_ASSISTANT) return dsv4_errf(err, "%s: missing \"content\"", where);
    } else if (cJSON_IsArray(content)) {
        if (check_parts(content, r == R_TOOL, err, where)) return -1;
    } else if (!cJSON_IsString(content)) {
        return dsv4_errf(err, "%s: \"content\" is not a string or an array of text parts", where);
    }
    if (r == R_DEVELOPER && !dsv4_pyjson_truthy(content)) return dsv4_errf(err, "%s: \"content\" is empty", where);

    if (r != R_USER && check_tools(field(msg, "tools"), err, where)) return -1;

    const cJSON *task = field(msg, "task");
    if (!is_absent(task)) {
        int ok = 0;
        if (cJSON_IsString(task))
            for (size_t k = 0; k < sizeof tasks / sizeof tasks[0]; k++) ok |= !strcmp(task->valuestring, tasks[k].name);
        if (!ok)
            return dsv4_errf(err, "%s: invalid task (expected action, query, authority, domain, title or read_url)",
                             where);
    }

    if (r == R_ASSISTANT) {
        const cJSON *rc = field(msg, "reasoning_content");
        if (!is_absent(rc) && !cJSON_IsString(rc))
            return dsv4_errf(err, "%s: \"reasoning_content\" is not a string", where);
        const cJSON *tcs = field(msg, "tool_calls");
        if (!is_absent(tcs)) {
            if (!cJSON_IsArray(tcs)) return dsv4_errf(err, "%s: \"tool_calls\" is not an array", where);
            int k = 0;
            for (const cJSON *tc = tcs->child; tc; tc = tc->next, k++) {
                const cJSON *fn = field(tc, "function");
                if (!cJSON_IsObject(fn)) return dsv4_errf(err, "%s: tool_calls[%d] has no \"function\" object", where, k);
                if (!cJSON_IsString(field(fn, "name")))
                    return dsv4_errf(err, "%s: tool_calls[%d].function.name is missing or not a string", where, k);
                const cJSON *args = field(fn, "arguments");
                if (!cJSON_IsString(args) && !cJSON_IsObject(args))
                    return dsv4_errf(err, "%s: tool_calls[%d].function.arguments is missing or not a JSON string / object",
                                     where, k);
            }
        }
    }

    if (r == R_TOOL) {
        const cJSON *id = field(msg, "tool_call_id");
        if (!is_absent(id) && !cJSON_IsString(id)) return dsv4_errf(err, "%s: \"tool_call_id\" is not a string", where);
        /* the message before (other tool results aside) must be an assistant turn that called tools */
        if (!prev_called_tools)
            return dsv4_errf(err, "%s: a tool result must follow an assistant message with tool_calls", where);
    }
    return 0;
}

/* ---------------------------------------------------------------------------------------------
 * Preprocessing: merge_tool_messages, sort_tool_results_by_call_order, _drop_thinking_messages
 * --------------------------------------------------------------------------------------------- */

static int build_list(const cJSON *msgs, const cJSON *extra_tools, imsg_list *out, dsv4_err *err) {
    int i = 0;
    int tools_given = dsv4_pyjson_truthy(extra_tools);
    if (tools_given && check_tools(extra_tools, err, "tools")) return -1;
    const cJSON *first = cJSON_GetArrayItem(msgs, 0);
    const char *first_role = str_or_null(field(first, "role"));
    int tools_on_first = tools_given && first_role && (!strcmp(first_role, "system") || !strcmp(first_role, "developer"));
    if (tools_given && !tools_on_first) {
        imsg sys = {.role = R_SYSTEM};
        sys.tools[1] = extra_tools;
        if (list_push(out, &sys)) return dsv4_errf(err, "out of memory");
    }
    int prev_called_tools = 0; /* the last message other than a tool result: an assistant with tool_calls */
    for (const cJSON *msg = msgs->child; msg; msg = msg->next, i++) {
        role_t r = R_SYSTEM;
        if (check_message(i, msg, prev_called_tools, &r, err)) return -1;
        if (r != R_TOOL) prev_called_tools = r == R_ASSISTANT && dsv4_pyjson_truthy(field(msg, "tool_calls"));
        const cJSON *task = field(msg, "task");
        imsg m = {.role = r, .src = msg, .task = str_or_null(task), .wo_eos = dsv4_pyjson_truthy(field(msg, "wo_eos"))};
        imsg *last = out->n ? &out->m[out->n - 1] : NULL;
        if (r == R_TOOL) {
            const char *id = str_or_null(field(msg, "tool_call_id"));
            block b = {.is_tool = 1, .id = id ? id : "", .content = field(msg, "content")};
            if (!last || last->role != R_USER) {
                imsg u = {.role = R_USER}; /* a user message made of tool results: no task, no src */
                if (list_push(out, &u)) return dsv4_errf(err, "out of memory");
                last = &out->m[out->n - 1];
            }
            if (block_push(last, &b)) return dsv4_errf(err, "out of memory");
        } else if (r == R_USER) {
            block b = {.is_tool = 0, .id = "", .content = field(msg, "content")};
            if (!last || last->role != R_USER || last->task) {
                m.tools[0] = NULL; /* the reference's merge keeps only role, content, task, wo_eos, mask */
                if (list_push(out, &m)) return dsv4_errf(err, "out of memory");
                last = &out->m[out->n - 1];
            }
            if (block_push(last, &b)) return dsv4_errf(err, "out of memory");
        } else {
            m.tools[0] = field(msg, "tools");
            if (i == 0 && tools_on_first) m.tools[1] = extra_tools;
            if (list_push(out, &m)) return dsv4_errf(err, "out of memory");
        }
    }
    return 0;
}

/* the position of tool-call id `id` in the last assistant's tool_calls (the last one with that id, as a
 * dict built from them would keep), or -1 */
static int call_order(const cJSON *tool_calls, const char *id) {
    int found = -1, k = 0;
    for (const cJSON *tc = tool_calls->child; tc; tc = tc->next, k++) {
        const char *tid = str_or_null(field(tc, "id"));
        if (!tid || !*tid) tid = str_or_null(field(field(tc, "function"), "id"));
        if (tid && *tid && !strcmp(tid, id)) found = k;
    }
    return found;
}

static int has_any_id(const cJSON *tool_calls) {
    for (const cJSON *tc = tool_calls->child; tc; tc = tc->next) {
        const char *tid = str_or_null(field(tc, "id"));
        if (!tid || !*tid) tid = str_or_null(field(field(tc, "function"), "id"));
        if (tid && *tid) return 1;
    }
    return 0;
}

static int sort_tool_results(imsg_list *l) {
    const cJSON *order = NULL; /* tool_calls of the last assistant that had some */
    for (int i = 0; i < l->n; i++) {
        imsg *m = &l->m[i];
        if (m->role == R_ASSISTANT && dsv4_pyjson_truthy(field(m->src, "tool_calls"))) {
            order = field(m->src, "tool_calls");
        } else if (m->role == R_USER && order && has_any_id(order)) {
            int nt = 0;
            for (int k = 0; k < m->nblocks; k++) nt += m->blocks[k].is_tool;
            if (nt < 2) continue;
            block *tb = malloc((size_t)nt * sizeof *tb);
            int *key = malloc((size_t)nt * sizeof *key);
            if (!tb || !key) {
                free(tb);
                free(key);
                return -1;
            }
            int t = 0;
            for (int k = 0; k < m->nblocks; k++)
                if (m->blocks[k].is_tool) {
                    tb[t] = m->blocks[k];
                    int o = call_order(order, tb[t].id);
                    key[t++] = o < 0 ? 0 : o; /* unknown ids sort as 0, like .get(id, 0) */
                }
            for (int a = 1; a < nt; a++) { /* stable insertion sort, like Python's sorted */
                block bv = tb[a];
                int kv = key[a], b = a - 1;
                while (b >= 0 && key[b] > kv) {
                    tb[b + 1] = tb[b];
                    key[b + 1] = key[b];
                    b--;
                }
                tb[b + 1] = bv;
                key[b + 1] = kv;
            }
            t = 0;
            for (int k = 0; k < m->nblocks; k++)
                if (m->blocks[k].is_tool) m->blocks[k] = tb[t++];
            free(tb);
            free(key);
        }
    }
    return 0;
}

static int last_user_index(const imsg_list *l) {
    for (int i = l->n - 1; i >= 0; i--)
        if (l->m[i].role == R_USER || l->m[i].role == R_DEVELOPER) return i;
    return -1;
}

static int msg_has_tools(const imsg *m) { return dsv4_pyjson_truthy(m->tools[0]) || dsv4_pyjson_truthy(m->tools[1]); }

static void drop_thinking(imsg_list *l) {
    int last = last_user_index(l), w = 0;
    for (int i = 0; i < l->n; i++) {
        imsg *m = &l->m[i];
        role_t r = m->role;
        if (r == R_USER || r == R_SYSTEM || r == R_TOOL || r == R_REMINDER || i >= last) {
            l->m[w++] = *m;
        } else if (r == R_ASSISTANT) {
            m->drop_reasoning = 1;
            l->m[w++] = *m;
        } else {
            free(m->blocks); /* a developer message before the last user message: dropped */
        }
    }
    l->n = w;
}

/* ---------------------------------------------------------------------------------------------
 * Rendering
 * --------------------------------------------------------------------------------------------- */

/* a content node (string or array of parts) as text; parts joined by "\n\n" */
static void put_content(dsv4_sb *b, const cJSON *c) {
    if (cJSON_IsString(c)) {
        dsv4_sb_puts(b, c->valuestring);
        return;
    }
    if (!cJSON_IsArray(c)) return;
    for (const cJSON *p = c->child; p; p = p->next) {
        if (p != c->child) dsv4_sb_puts(b, "\n\n");
        const char *type = str_or_null(field(p, "type"));
        if (type && !strcmp(type, "text")) {
            const char *t = str_or_null(field(p, "text"));
            dsv4_sb_puts(b, t ? t : "");
        } else {
            dsv4_sb_puts(b, "[Unsupported ");
            dsv4_sb_puts(b, type ? type : "None");
            dsv4_sb_puts(b, "]");
        }
    }
}

static void put_tools(dsv4_sb *b, const imsg *m) {
    dsv4_sb_puts(b, tools_head);
    int first = 1;
    for (int k = 0; k < 2; k++) {
        if (!dsv4_pyjson_truthy(m->tools[k])) continue;
        for (const cJSON *t = m->tools[k]->child; t; t = t->next) {
            if (!first) dsv4_sb_putc(b, '\n');
            first = 0;
            dsv4_pyjson_dump(b, field(t, "function"), 0);
        }
    }
    dsv4_sb_puts(b, tools_tail);
}

static void put_tools_and_format(dsv4_sb *b, const imsg *m) {
    if (msg_has_tools(m)) {
        dsv4_sb_puts(b, "\n\n");
        put_tools(b, m);
    }
    const cJSON *rf = field(m->src, "response_format");
    if (dsv4_pyjson_truthy(rf)) {
        dsv4_sb_puts(b, "\n\n");
        dsv4_sb_puts(b, response_format_head);
        dsv4_pyjson_dump(b, rf, 0);
    }
}

static void put_param(dsv4_sb *b, const char *key, const cJSON *v) {
    int is_str = cJSON_IsString(v);
    dsv4_sb_puts(b, "<" DSML "parameter name=\"");
    dsv4_sb_puts(b, key);
    dsv4_sb_puts(b, is_str ? "\" string=\"true\">" : "\" string=\"false\">");
    if (is_str) dsv4_sb_puts(b, v->valuestring);
    else dsv4_pyjson_dump(b, v, 0);
    dsv4_sb_puts(b, "</" DSML "parameter>");
}

/* encode_arguments_to_dsml: the arguments object's entries as DSML parameters joined by "\n" */
static int put_arguments(dsv4_sb *b, const cJSON *args) {
    cJSON *parsed = NULL;
    const cJSON *obj = args;
    if (cJSON_IsString(args)) {
        parsed = dsv4_pyjson_parse(args->valuestring, strlen(args->valuestring), NULL);
        obj = parsed;
    }
    if (!cJSON_IsObject(obj)) { /* undecodable: the reference's {"arguments": raw} */
        cJSON_Delete(parsed);
        put_param(b, "arguments", args);
        return 0;
    }
    int first = 1;
    for (const cJSON *c = obj->child; c; c = c->next) {
        const cJSON *val;
        if (!dsv4_pyjson_first_of_key(obj, c, &val)) continue;
        if (!first) dsv4_sb_putc(b, '\n');
        first = 0;
        put_param(b, c->string ? c->string : "", val);
    }
    cJSON_Delete(parsed);
    return 0;
}

static void put_tool_calls(dsv4_sb *b, const cJSON *tcs) {
    dsv4_sb_puts(b, "\n\n<" DSML "tool_calls>\n");
    for (const cJSON *tc = tcs->child; tc; tc = tc->next) {
        if (tc != tcs->child) dsv4_sb_putc(b, '\n');
        const cJSON *fn = field(tc, "function");
        dsv4_sb_puts(b, "<" DSML "invoke name=\"");
        dsv4_sb_puts(b, field(fn, "name")->valuestring);
        dsv4_sb_puts(b, "\">\n");
        put_arguments(b, field(fn, "arguments"));
        dsv4_sb_puts(b, "\n</" DSML "invoke>");
    }
    dsv4_sb_puts(b, "\n</" DSML "tool_calls>");
}

static void render_message(dsv4_sb *b, const imsg_list *l, int index, const dsv4_chat_opts *o, int drop) {
    const imsg *m = &l->m[index];
    int thinking = o->mode == DSV4_CHAT_THINKING;
    int last_user = last_user_index(l);

    if (index == 0 && thinking && o->effort == DSV4_EFFORT_MAX) dsv4_sb_puts(b, effort_max_prefix);

    switch (m->role) {
    case R_SYSTEM:
        put_content(b, field(m->src, "content"));
        put_tools_and_format(b, m);
        break;
    case R_DEVELOPER:
        dsv4_sb_puts(b, USER_TOK);
        put_content(b, field(m->src, "content"));
        put_tools_and_format(b, m);
        break;
    case R_USER:
        dsv4_sb_puts(b, USER_TOK);
        for (int k = 0; k < m->nblocks; k++) {
            if (k) dsv4_sb_puts(b, "\n\n");
            if (m->blocks[k].is_tool) dsv4_sb_puts(b, "<tool_result>");
            put_content(b, m->blocks[k].content);
            if (m->blocks[k].is_tool) dsv4_sb_puts(b, "</tool_result>");
        }
        break;
    case R_REMINDER:
        dsv4_sb_puts(b, REMINDER_TOK);
        put_content(b, field(m->src, "content"));
        break;
    case R_ASSISTANT: {
        int prev_has_task = index > 0 && l->m[index - 1].task;
        if (thinking && !prev_has_task && (!drop || index > last_user)) {
            const char *rc = m->drop_reasoning ? NULL : str_or_null(field(m->src, "reasoning_content"));
            dsv4_sb_puts(b, rc ? rc : "");
            dsv4_sb_puts(b, THINK_END);
        }
        put_content(b, field(m->src, "content"));
        const cJSON *tcs = field(m->src, "tool_calls");
        if (dsv4_pyjson_truthy(tcs)) put_tool_calls(b, tcs);
        if (!m->wo_eos) dsv4_sb_puts(b, DSV4_EOS_TEXT);
        break;
    }
    case R_TOOL: break; /* merged into user messages before rendering */
    }

    /* the transition: only when this message ends the list or an assistant / reminder comes next */
    if (index + 1 < l->n && l->m[index + 1].role != R_ASSISTANT && l->m[index + 1].role != R_REMINDER) return;
    if (m->task) {
        const char *tok = "";
        for (size_t k = 0; k < sizeof tasks / sizeof tasks[0]; k++)
            if (!strcmp(m->task, tasks[k].name)) tok = tasks[k].token;
        if (strcmp(m->task, "action")) {
            dsv4_sb_puts(b, tok);
        } else {
            dsv4_sb_puts(b, ASSISTANT_TOK);
            dsv4_sb_puts(b, thinking ? THINK_START : THINK_END);
            dsv4_sb_puts(b, tok);
        }
    } else if (m->role == R_USER || m->role == R_DEVELOPER) {
        dsv4_sb_puts(b, ASSISTANT_TOK);
        if (thinking && (!drop || index >= last_user)) dsv4_sb_puts(b, THINK_START);
        else dsv4_sb_puts(b, THINK_END);
    }
}

char *dsv4_chat_render(const cJSON *messages, const cJSON *tools, const dsv4_chat_opts *opts, size_t *len,
                       dsv4_err *err) {
    dsv4_chat_opts o = opts ? *opts : dsv4_chat_opts_default();
    if (len) *len = 0;
    if (!cJSON_IsArray(messages)) {
        dsv4_errf(err, "messages: expected a JSON array of message objects");
        return NULL;
    }
    if (o.mode != DSV4_CHAT_THINKING && o.mode != DSV4_CHAT_CHAT) {
        dsv4_errf(err, "chat encoding: invalid mode %d", (int)o.mode);
        return NULL;
    }
    if (o.effort < DSV4_EFFORT_NONE || o.effort > DSV4_EFFORT_MAX) {
        dsv4_errf(err, "chat encoding: invalid reasoning effort %d", (int)o.effort);
        return NULL;
    }
    if (!is_absent(tools) && !cJSON_IsArray(tools)) {
        dsv4_errf(err, "tools: expected a JSON array");
        return NULL;
    }
    imsg_list l = {0};
    if (build_list(messages, is_absent(tools) ? NULL : tools, &l, err)) {
        list_free(&l);
        return NULL;
    }
    if (sort_tool_results(&l)) {
        list_free(&l);
        dsv4_errf(err, "out of memory");
        return NULL;
    }
    int drop = o.drop_thinking;
    for (int i = 0; i < l.n && drop; i++)
        if (msg_has_tools(&l.m[i])) drop = 0;
    if (o.mode == DSV4_CHAT_THINKING && drop) drop_thinking(&l);

    dsv4_sb b = {0};
    if (o.add_bos) dsv4_sb_puts(&b, DSV4_BOS_TEXT);
    for (int i = 0; i < l.n; i++) render_message(&b, &l, i, &o, drop);
    list_free(&l);
    char *s = dsv4_sb_take(&b, len);
    if (!s) dsv4_errf(err, "out of memory");
    return s;
}

char *dsv4_chat_render_json(const char *json, size_t json_len, const dsv4_chat_opts *opts, size_t *len,
                            dsv4_err *err) {
    cJSON *root = dsv4_pyjson_parse(json, json_len, err);
    if (!root) {
        dsv4_err_prefix(err, "message list JSON: ");
        return NULL;
    }
    const cJSON *msgs = root, *tools = NULL;
    if (cJSON_IsObject(root)) {
        msgs = cJSON_GetObjectItemCaseSensitive(root, "messages");
        tools = cJSON_GetObjectItemCaseSensitive(root, "tools");
        if (!msgs) {
            cJSON_Delete(root);
            dsv4_errf(err, "message list JSON: an object needs a \"messages\" array");
            return NULL;
        }
    }
    char *s = dsv4_chat_render(msgs, tools, opts, len, err);
    cJSON_Delete(root);
    return s;
}
