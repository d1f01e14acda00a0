/* openai.c - the OpenAI wire format: POST /v1/chat/completions and POST /v1/completions request parsing
 * and validation (-> srv_req), response bodies, SSE chunks, error objects. Also the parameter readers
 * the Anthropic front end shares. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "server.h"

/* ---- parameter readers: 1 present and valid, 0 absent or null, -1 invalid (e set) ---- */

static const cJSON *get(const cJSON *o, const char *k) { return cJSON_GetObjectItemCaseSensitive(o, k); }
static int absent(const cJSON *v) { return !v || cJSON_IsNull(v); }

int srv_get_num(const cJSON *o, const char *k, double lo, double hi, double *out, srv_error *e) {
    const cJSON *v = get(o, k);
    if (absent(v)) return 0;
    if (!cJSON_IsNumber(v) || !isfinite(v->valuedouble)) return srv_fail(e, 400, "%s: expected a number", k);
    if (v->valuedouble < lo || v->valuedouble > hi)
        return srv_fail(e, 400, "%s must be in [%g, %g], got %g", k, lo, hi, v->valuedouble);
    *out = v->valuedouble;
    return 1;
}

int srv_get_int(const cJSON *o, const char *k, long lo, long hi, long *out, srv_error *e) {
    const cJSON *v = get(o, k);
    if (absent(v)) return 0;
    if (!cJSON_IsNumber(v) || !isfinite(v->valuedouble) || v->valuedouble != floor(v->valuedouble))
        return srv_fail(e, 400, "%s: expected an integer", k);
    if (v->valuedouble < (double)lo || v->valuedouble > (double)hi)
        return srv_fail(e, 400, "%s must be in [%ld, %ld], got %.17g", k, lo, hi, v->valuedouble);
    *out = (long)v->valuedouble;
    return 1;
}

int srv_get_bool(const cJSON *o, const char *k, int *out, srv_error *e) {
    const cJSON *v = get(o, k);
    if (absent(v)) return 0;
    if (!cJSON_IsBool(v)) return srv_fail(e, 400, "%s: expected true or false", k);
    *out = cJSON_IsTrue(v) ? 1 : 0;
    return 1;
}

int srv_get_stops(const cJSON *o, const char *k, srv_req *r, srv_error *e) {
    const cJSON *v = get(o, k);
    if (absent(v)) return 0;
    const cJSON *single = cJSON_IsString(v) ? v : NULL;
    if (!single && !cJSON_IsArray(v)) return srv_fail(e, 400, "%s: expected a string or an array of strings", k);
    int n = single ? 1 : cJSON_GetArraySize(v);
    if (n > SRV_MAX_STOPS) return srv_fail(e, 400, "%s: at most %d stop strings", k, SRV_MAX_STOPS);
    for (int i = 0; i < n; i++) {
        const cJSON *s = single ? single : cJSON_GetArrayItem(v, i);
        if (!cJSON_IsString(s)) return srv_fail(e, 400, "%s[%d]: expected a string", k, i);
        size_t l = strlen(s->valuestring);
        if (!l) continue; /* empty stop strings never match */
        if (l > DSV4_STOP_MAX_LEN) return srv_fail(e, 400, "%s[%d]: longer than %d bytes", k, i, DSV4_STOP_MAX_LEN);
        if (!(r->stops[r->n_stop] = strdup(s->valuestring))) return srv_fail(e, 500, "out of memory");
        r->n_stop++;
    }
    return 1;
}

static int get_seed(const cJSON *o, srv_req *r, srv_error *e) {
    const cJSON *v = get(o, "seed");
    if (absent(v)) {
        char hx[17];
        srv_random_hex(hx, 16);
        r->sp.seed = strtoull(hx, NULL, 16);
        return 0;
    }
    if (!cJSON_IsNumber(v) || !isfinite(v->valuedouble) || v->valuedouble != floor(v->valuedouble))
        return srv_fail(e, 400, "seed: expected an integer");
    const char *src = v->valuestring; /* the source text (dsv4_pyjson_parse keeps it) */
    if (src && strspn(src, "-0123456789") == strlen(src)) {
        if (src[0] == '-') r->sp.seed = (uint64_t)strtoll(src, NULL, 10);
        else r->sp.seed = strtoull(src, NULL, 10);
    } else {
        r->sp.seed = (uint64_t)(int64_t)v->valuedouble;
    }
    return 1;
}

/* OpenAI's logit_bias: {"token id": bias in [-100, 100], ...}; the ids are checked against the vocabulary in
 * srv_finalize_sampling. */
static int get_logit_bias(const cJSON *b, srv_req *r, srv_error *e) {
    const cJSON *o = get(b, "logit_bias");
    if (absent(o)) return 0;
    if (!cJSON_IsObject(o)) return srv_fail(e, 400, "logit_bias: expected an object of token id -> bias");
    const int n = cJSON_GetArraySize(o);
    if (n > DSV4_LOGIT_BIAS_MAX) return srv_fail(e, 400, "logit_bias: %d entries; at most %d", n, DSV4_LOGIT_BIAS_MAX);
    if (!n) return 0;
    if (!(r->bias_tok = malloc(sizeof(int32_t) * (size_t)n)) || !(r->bias_val = malloc(sizeof(float) * (size_t)n)))
        return srv_fail(e, 500, "out of memory");
    const cJSON *it;
    cJSON_ArrayForEach(it, o) {
        const char *k = it->string;
        char *end = NULL;
        errno = 0;
        const long id = k && *k && strspn(k, "0123456789") == strlen(k) ? strtol(k, &end, 10) : -1;
        if (id < 0 || errno || id > INT32_MAX) return srv_fail(e, 400, "logit_bias: key '%.64s' is not a token id", k ? k : "");
        if (!cJSON_IsNumber(it) || !(it->valuedouble >= -100 && it->valuedouble <= 100))
            return srv_fail(e, 400, "logit_bias['%s']: expected a number in [-100, 100]", k);
        r->bias_tok[r->n_bias] = (int32_t)id;
        r->bias_val[r->n_bias++] = (float)it->valuedouble;
    }
    r->sp.bias_tok = r->bias_tok, r->sp.bias_val = r->bias_val, r->sp.n_bias = r->n_bias;
    return 0;
}

long srv_token_id(const cJSON *v, long lim) {
    if (!cJSON_IsNumber(v) || v->valuedouble != floor(v->valuedouble) || v->valuedouble < 0 || v->valuedouble >= lim)
        return -1;
    return (long)v->valuedouble;
}

/* vLLM's stop_token_ids: [id, ...]; checked against the vocabulary in srv_finalize_sampling. */
static int get_stop_ids(const cJSON *b, srv_req *r, srv_error *e) {
    const cJSON *a = get(b, "stop_token_ids");
    if (absent(a)) return 0;
    if (!cJSON_IsArray(a)) return srv_fail(e, 400, "stop_token_ids: expected an array of token ids");
    const int n = cJSON_GetArraySize(a);
    if (n > SRV_MAX_STOP_IDS) return srv_fail(e, 400, "stop_token_ids: %d entries; at most %d", n, SRV_MAX_STOP_IDS);
    if (!n) return 0;
    if (!(r->stop_ids = malloc(sizeof(int32_t) * (size_t)n))) return srv_fail(e, 500, "out of memory");
    for (int i = 0; i < n; i++) {
        const long id = srv_token_id(cJSON_GetArrayItem(a, i), (long)INT32_MAX + 1);
        if (id < 0) return srv_fail(e, 400, "stop_token_ids[%d]: expected a token id", i);
        r->stop_ids[r->n_stop_ids++] = (int32_t)id;
    }
    return 0;
}

/* temperature, top_p, top_k, min_p, penalties, seed, stop, ignore_eos, logit_bias, stop_token_ids, min_tokens. */
int srv_parse_sampling(const cJSON *b, srv_req *r, double max_temp, const char *stop_key, srv_error *e) {
    double d;
    long l;
    int x, rc;
    if ((rc = srv_get_num(b, "temperature", 0, max_temp, &d, e)) < 0) return -1;
    if (rc) r->sp.temperature = (float)d;
    if ((rc = srv_get_num(b, "top_p", 0, 1, &d, e)) < 0) return -1;
    if (rc) {
        if (d <= 0) return srv_fail(e, 400, "top_p must be in (0, 1], got %g", d);
        r->sp.top_p = (float)d;
    }
    if ((rc = srv_get_int(b, "top_k", -1, 1L << 30, &l, e)) < 0) return -1;
    if (rc) r->sp.top_k = l < 0 ? 0 : (int)l;
    if ((rc = srv_get_num(b, "min_p", 0, 1, &d, e)) < 0) return -1;
    if (rc) r->sp.min_p = (float)d;
    if ((rc = srv_get_num(b, "presence_penalty", -2, 2, &d, e)) < 0) return -1;
    if (rc) r->sp.presence_penalty = (float)d;
    if ((rc = srv_get_num(b, "frequency_penalty", -2, 2, &d, e)) < 0) return -1;
    if (rc) r->sp.frequency_penalty = (float)d;
    if ((rc = srv_get_num(b, "repetition_penalty", 1e-6, 1e6, &d, e)) < 0) return -1;
    if (rc) r->sp.repetition_penalty = (float)d;
    if (srv_get_bool(b, "ignore_eos", &x, e) < 0) return -1;
    if (x == 1) r->sp.ignore_eos = true;
    if (get_seed(b, r, e) < 0) return -1;
    if (srv_get_stops(b, stop_key, r, e) < 0) return -1;
    if ((rc = srv_get_int(b, "min_tokens", 0, 1L << 30, &l, e)) < 0) return -1;
    if (rc) r->min_tokens = (int)l;
    if (get_stop_ids(b, r, e)) return -1;
    return get_logit_bias(b, r, e);
}

int srv_check_model(srv_ctx *S, const cJSON *b, srv_req *r, int required, srv_error *e) {
    const cJSON *m = get(b, "model");
    if (absent(m)) {
        if (required) return srv_fail(e, 400, "model: required");
    } else if (!cJSON_IsString(m)) {
        return srv_fail(e, 400, "model: expected a string");
    } else if (strcmp(m->valuestring, S->cfg.model_name)) {
        e->type = "model_not_found";
        return srv_fail(e, 404, "The model '%s' does not exist (this server serves '%s')", m->valuestring,
                        S->cfg.model_name);
    }
    if (!(r->model = strdup(S->cfg.model_name))) return srv_fail(e, 500, "out of memory");
    return 0;
}

static int parse_stream(const cJSON *b, srv_req *r, srv_error *e) {
    int x = 0;
    if (srv_get_bool(b, "stream", &x, e) < 0) return -1;
    r->stream = x;
    const cJSON *so = get(b, "stream_options");
    if (!absent(so)) {
        if (!cJSON_IsObject(so)) return srv_fail(e, 400, "stream_options: expected an object");
        x = 0;
        if (srv_get_bool(so, "include_usage", &x, e) < 0) return -1;
        r->include_usage = x;
    }
    long n = 1;
    if (srv_get_int(b, "n", 1, SRV_MAX_CHOICES, &n, e) < 0) return -1;
    r->n_choices = (int)n;
    return 0;
}

static int parse_max_tokens(const cJSON *b, long *mt, srv_error *e) {
    int rc = srv_get_int(b, "max_completion_tokens", 1, 1L << 30, mt, e);
    if (rc < 0) return -1;
    if (rc == 0 && srv_get_int(b, "max_tokens", 1, 1L << 30, mt, e) < 0) return -1;
    return 0;
}

/* ---- chat completions ---- */

int srv_openai_parse_chat(srv_ctx *S, const cJSON *b, srv_req *r, srv_error *e) {
    if (!cJSON_IsObject(b)) return srv_fail(e, 400, "the request body must be a JSON object");
    snprintf(r->id, sizeof r->id, "chatcmpl-");
    if (srv_check_model(S, b, r, 0, e)) return -1;
    const cJSON *msgs = get(b, "messages");
    if (!cJSON_IsArray(msgs) || !cJSON_GetArraySize(msgs))
        return srv_fail(e, 400, "messages: expected a non-empty array of message objects");
    if (parse_stream(b, r, e)) return -1;

    /* logprobs, max_tokens, sampling: checked before the prompt is rendered and tokenized */
    int lp = 0;
    long top = 0;
    if (srv_get_bool(b, "logprobs", &lp, e) < 0) return -1;
    if (srv_get_int(b, "top_logprobs", 0, SRV_MAX_TOP_LOGPROBS, &top, e) < 0) return -1;
    if (top && !lp) return srv_fail(e, 400, "top_logprobs requires logprobs: true");
    r->logprobs = lp;
    r->top_logprobs = (int)top;
    long mt = 0;
    if (parse_max_tokens(b, &mt, e)) return -1;
    if (srv_parse_sampling(b, r, 2, "stop", e)) return -1;

    if (srv_openai_chat_prompt(S, b, r, e)) return -1;
    return srv_finalize_sampling(S, r, (int)mt, e);
}

int srv_openai_chat_prompt(srv_ctx *S, const cJSON *b, srv_req *r, srv_error *e) {
    const cJSON *msgs = get(b, "messages");
    if (!cJSON_IsArray(msgs) || !cJSON_GetArraySize(msgs))
        return srv_fail(e, 400, "messages: expected a non-empty array of message objects");

    /* thinking on or off */
    int think = S->cfg.default_thinking;
    dsv4_chat_effort effort = DSV4_EFFORT_NONE;
    const cJSON *kw = get(b, "chat_template_kwargs");
    const cJSON *efforts[2] = {get(b, "reasoning_effort"), NULL};
    if (!absent(kw)) {
        if (!cJSON_IsObject(kw)) return srv_fail(e, 400, "chat_template_kwargs: expected an object");
        int x;
        if (srv_get_bool(kw, "thinking", &x, e) < 0) return -1;
        else if (get(kw, "thinking") && cJSON_IsBool(get(kw, "thinking"))) think = x;
        if (srv_get_bool(kw, "enable_thinking", &x, e) < 0) return -1;
        else if (get(kw, "enable_thinking") && cJSON_IsBool(get(kw, "enable_thinking"))) think = x;
        efforts[1] = get(kw, "reasoning_effort");
    }
    const cJSON *th = get(b, "thinking");
    if (!absent(th)) {
        const cJSON *t = cJSON_IsObject(th) ? get(th, "type") : NULL;
        if (cJSON_IsBool(th)) think = cJSON_IsTrue(th);
        else if (cJSON_IsString(t) && !strcmp(t->valuestring, "enabled")) think = 1;
        else if (cJSON_IsString(t) && !strcmp(t->valuestring, "disabled")) think = 0;
        else return srv_fail(e, 400, "thinking: expected {\"type\": \"enabled\" | \"disabled\"}");
    }
    for (int i = 0; i < 2; i++) {
        const cJSON *v = efforts[i];
        if (absent(v)) continue;
        if (!cJSON_IsString(v)) return srv_fail(e, 400, "reasoning_effort: expected a string");
        const char *s = v->valuestring;
        if (!strcmp(s, "none") || !strcmp(s, "minimal")) think = 0;
        else if (!strcmp(s, "low") || !strcmp(s, "medium") || !strcmp(s, "high")) think = 1, effort = DSV4_EFFORT_HIGH;
        else if (!strcmp(s, "max") || !strcmp(s, "xhigh")) think = 1, effort = DSV4_EFFORT_MAX;
        else
            return srv_fail(e, 400, "reasoning_effort: expected none, minimal, low, medium, high or max, got '%s'", s);
    }
    r->mode = think ? DSV4_CHAT_THINKING : DSV4_CHAT_CHAT;

    /* tools */
    const cJSON *tools = get(b, "tools");
    if (!absent(tools) && !cJSON_IsArray(tools)) return srv_fail(e, 400, "tools: expected an array");
    if (absent(tools) || !cJSON_GetArraySize(tools)) tools = NULL;
    for (int i = 0; tools && i < cJSON_GetArraySize(tools); i++) {
        const cJSON *t = cJSON_GetArrayItem(tools, i), *f = get(t, "function");
        if (!cJSON_IsObject(t) || !cJSON_IsObject(f) || !cJSON_IsString(get(f, "name")))
            return srv_fail(e, 400, "tools[%d]: expected {\"type\": \"function\", \"function\": {\"name\": ...}}", i);
    }
    const cJSON *tc = get(b, "tool_choice");
    const char *force_name = NULL;
    int force = 0;
    if (!absent(tc)) {
        if (cJSON_IsString(tc)) {
            if (!strcmp(tc->valuestring, "required")) force = 1;
            if (!strcmp(tc->valuestring, "none")) tools = NULL;
            else if (strcmp(tc->valuestring, "auto") && strcmp(tc->valuestring, "required"))
                return srv_fail(e, 400, "tool_choice: expected none, auto, required or a function");
        } else if (!cJSON_IsObject(tc) || !cJSON_IsObject(get(tc, "function")) ||
                   !cJSON_IsString(get(get(tc, "function"), "name"))) {
            return srv_fail(e, 400, "tool_choice: expected none, auto, required or {\"type\": \"function\", "
                                    "\"function\": {\"name\": ...}}");
        } else if (!tools) {
            return srv_fail(e, 400, "tool_choice names a function but no tools were given");
        } else {
            force = 1;
            force_name = get(get(tc, "function"), "name")->valuestring;
            int found = 0;
            for (int i = 0; i < cJSON_GetArraySize(tools); i++) {
                const cJSON *n = get(get(cJSON_GetArrayItem(tools, i), "function"), "name");
                found |= cJSON_IsString(n) && !strcmp(n->valuestring, force_name);
            }
            if (!found) return srv_fail(e, 400, "tool_choice names function '%s', which is not in tools", force_name);
        }
    }
    if (force && !tools) return srv_fail(e, 400, "tool_choice 'required' needs tools");
    r->want_tools = tools != NULL;

    /* response_format: goes on the system message, where the chat encoding reads it */
    const cJSON *rf = get(b, "response_format");
    cJSON *copy = NULL;
    if (!absent(rf)) {
        const cJSON *t = cJSON_IsObject(rf) ? get(rf, "type") : NULL;
        if (!cJSON_IsString(t) || (strcmp(t->valuestring, "text") && strcmp(t->valuestring, "json_object") &&
                                   strcmp(t->valuestring, "json_schema")))
            return srv_fail(e, 400, "response_format: expected {\"type\": \"text\" | \"json_object\" | \"json_schema\"}");
        if (!strcmp(t->valuestring, "json_schema") && !cJSON_IsObject(get(rf, "json_schema")))
            return srv_fail(e, 400, "response_format.json_schema: expected an object");
        if (strcmp(t->valuestring, "text")) {
            if (!(copy = cJSON_Duplicate(msgs, 1))) return srv_fail(e, 500, "out of memory");
            cJSON *m0 = cJSON_GetArrayItem(copy, 0);
            const cJSON *role = get(m0, "role");
            int sys = cJSON_IsString(role) && (!strcmp(role->valuestring, "system") || !strcmp(role->valuestring, "developer"));
            if (!sys) {
                m0 = cJSON_CreateObject();
                cJSON_AddStringToObject(m0, "role", "system");
                cJSON_AddStringToObject(m0, "content", "");
                cJSON_InsertItemInArray(copy, 0, m0);
            }
            cJSON_DeleteItemFromObjectCaseSensitive(m0, "response_format");
            cJSON_AddItemToObject(m0, "response_format", cJSON_Duplicate(rf, 1));
        }
    }

    int rc = srv_render_chat(S, r, copy ? copy : msgs, tools, effort, e) || (force && srv_force_tool_call(S, r, force_name, e));
    cJSON_Delete(copy);
    return rc ? -1 : 0;
}

/* ---- completions ---- */

int srv_openai_parse_completion(srv_ctx *S, const cJSON *b, srv_req *r, srv_error *e) {
    if (!cJSON_IsObject(b)) return srv_fail(e, 400, "the request body must be a JSON object");
    snprintf(r->id, sizeof r->id, "cmpl-");
    if (srv_check_model(S, b, r, 0, e)) return -1;
    if (parse_stream(b, r, e)) return -1;
    int x = 0;
    if (srv_get_bool(b, "echo", &x, e) < 0) return -1;
    r->echo = x;
    if (!absent(get(b, "suffix"))) return srv_fail(e, 400, "suffix: not supported");
    long bo = 1;
    if (srv_get_int(b, "best_of", 1, SRV_MAX_CHOICES, &bo, e) < 0) return -1;
    if (get(b, "best_of") && !cJSON_IsNull(get(b, "best_of")) && bo != r->n_choices)
        return srv_fail(e, 400, "best_of: only best_of = n is supported (got best_of %ld, n %d)", bo, r->n_choices);
    long lp = -1;
    int rc = srv_get_int(b, "logprobs", 0, SRV_MAX_TOP_LOGPROBS, &lp, e);
    if (rc < 0) return -1;
    if (rc) {
        r->logprobs = 1;
        r->top_logprobs = (int)lp;
    }
    int add_special = 1;
    if (srv_get_bool(b, "add_special_tokens", &add_special, e) < 0) return -1;
    /* the prompt: a string or an array of token ids; or a list of those (a choice set each, in order) */
    const cJSON *p = get(b, "prompt");
    const int list = cJSON_IsArray(p) && cJSON_GetArraySize(p) > 0 && !cJSON_IsNumber(cJSON_GetArrayItem(p, 0));
    const int np = list ? cJSON_GetArraySize(p) : 1;
    if (np > SRV_MAX_PROMPTS) return srv_fail(e, 400, "prompt: a list of %d prompts; at most %d", np, SRV_MAX_PROMPTS);
    if ((long)np * r->n_choices > S->cfg.max_queue) /* (before any of them is tokenized or copied) */
        return srv_fail(e, 400, "%d prompts x n = %d: %ld sequences; the server queues at most %d requests (--max-queue)",
                        np, r->n_choices, (long)np * r->n_choices, S->cfg.max_queue);
    if (np > 1 && (!(r->more = calloc((size_t)np - 1, sizeof *r->more)) || !(r->n_more = calloc((size_t)np - 1, sizeof(int))) ||
                   !(r->more_max = calloc((size_t)np - 1, sizeof(int)))))
        return srv_fail(e, 500, "out of memory");
    for (int k = 0; k < np; k++) {
        const cJSON *q = list ? cJSON_GetArrayItem(p, k) : p;
        char at[24] = ""; /* a prompt's place in messages (a list of one is the prompt) */
        if (np > 1) snprintf(at, sizeof at, "[%d]", k);
        int32_t *ids = NULL;
        int n = 0;
        if (cJSON_IsString(q)) {
            size_t cnt = 0;
            if (!(ids = srv_encode_prompt(S, q->valuestring, strlen(q->valuestring), add_special, &cnt, e))) return -1;
            n = (int)cnt;
        } else if (cJSON_IsArray(q) && cJSON_GetArraySize(q) > 0) {
            n = cJSON_GetArraySize(q);
            if (!(ids = malloc(sizeof(int32_t) * (size_t)n))) return srv_fail(e, 500, "out of memory");
            for (int i = 0; i < n; i++) {
                const long id = srv_token_id(cJSON_GetArrayItem(q, i), S->tok_vocab);
                if (id < 0) {
                    free(ids);
                    return srv_fail(e, 400, "prompt%s[%d]: expected a token id in [0, %d)", at, i, S->tok_vocab);
                }
                ids[i] = (int32_t)id;
            }
        } else {
            return srv_fail(e, 400, "prompt%s: expected a string or an array of token ids%s", at,
                            list ? "" : " (or a list of those)");
        }
        if (k == 0) {
            r->prompt = ids, r->n_prompt = n;
        } else {
            r->more[k - 1] = ids, r->n_more[k - 1] = n;
            r->n_more_prompts = k;
        }
        if (k == 0) continue; /* (its emptiness and length: srv_finalize_sampling's messages) */
        if (n == 0) return srv_fail(e, 400, "prompt%s is empty", at);
        if (n >= S->cfg.max_context)
            return srv_fail(e, 400, "This model's maximum context length is %d tokens. However, your prompt%s has %d tokens.",
                            S->cfg.max_context, at, n);
    }
    long mt = 16; /* the OpenAI default for completions */
    if (srv_get_int(b, "max_tokens", 0, 1L << 30, &mt, e) < 0) return -1;
    if (mt == 0 && !r->echo) return srv_fail(e, 400, "max_tokens must be at least 1 (0 only with echo: the prompt scored)");
    if (srv_parse_sampling(b, r, 2, "stop", e)) return -1;
    r->chat = 0;
    if (srv_finalize_sampling(S, r, (int)mt, e)) return -1;
    if (mt == 0) { /* echo only: the prompt's text (and logprobs), nothing generated */
        if (r->min_tokens) return srv_fail(e, 400, "min_tokens (%d) must be at most max_tokens (0)", r->min_tokens);
        r->max_tokens = r->sp.max_tokens = 0;
    }
    for (int k = 0; k < r->n_more_prompts; k++) { /* the other prompts' max_tokens: each its own room */
        const int room = S->cfg.max_context - r->n_more[k];
        r->more_max[k] = mt == 0 ? 0 : mt < room ? (int)mt : room;
        if (r->min_tokens > r->more_max[k])
            return srv_fail(e, 400, "min_tokens (%d) must be at most max_tokens (%d, prompt[%d]'s room)", r->min_tokens,
                            r->more_max[k], k + 1);
    }
    return 0;
}

/* ---- errors ---- */

char *srv_openai_error_body(const srv_error *e) {
    const char *type = e->status == 401   ? "authentication_error"
                       : e->status == 404 ? "not_found_error"
                       : e->status == 503 ? "server_overloaded"
                       : e->status >= 500 ? "server_error"
                                          : "invalid_request_error";
    cJSON *j = cJSON_CreateObject(), *er = cJSON_CreateObject();
    cJSON_AddStringToObject(er, "message", e->msg);
    cJSON_AddStringToObject(er, "type", type);
    cJSON_AddNullToObject(er, "param");
    if (e->type) cJSON_AddStringToObject(er, "code", e->type);
    else cJSON_AddNullToObject(er, "code");
    cJSON_AddItemToObject(j, "error", er);
    return srv_json_print(j, NULL);
}

/* ---- logprobs ---- */

static cJSON *token_json(srv_ctx *S, int32_t tok, float lp, int with_bytes) {
    cJSON *j = cJSON_CreateObject();
    size_t n = 0;
    const char *s = dsv4_tok_token_bytes(S->tok, tok, &n);
    if (!s) s = "", n = 0;
    char *str = strndup(s, n);
    cJSON_AddStringToObject(j, "token", str ? str : "");
    free(str);
    cJSON_AddNumberToObject(j, "logprob", isfinite(lp) ? lp : -9999.0);
    if (with_bytes) {
        cJSON *by = cJSON_CreateArray();
        for (size_t i = 0; i < n; i++) cJSON_AddItemToArray(by, cJSON_CreateNumber((unsigned char)s[i]));
        cJSON_AddItemToObject(j, "bytes", by);
    }
    return j;
}

cJSON *srv_openai_lp_content(srv_out *o) {
    cJSON *a = cJSON_CreateArray();
    for (size_t i = 0; a && i < o->n_lps; i++) {
        const srv_lp *l = &o->lps[i];
        cJSON *t = token_json(o->S, l->token, l->logprob, 1), *top = cJSON_CreateArray();
        for (int k = 0; k < l->n_top && k < o->r->top_logprobs; k++)
            cJSON_AddItemToArray(top, token_json(o->S, l->top[k].token, l->top[k].logprob, 1));
        cJSON_AddItemToObject(t, "top_logprobs", top);
        cJSON_AddItemToArray(a, t);
    }
    o->n_lps = 0;
    return a;
}

/* Completions format: {"tokens", "token_logprobs", "top_logprobs", "text_offset"}: the echoed prompt's records first
 * (o->pl; the first token's logprob and top_logprobs null: nothing precedes it), then the generated ones. */
static cJSON *lp_completion(srv_out *o, size_t base_offset) {
    cJSON *j = cJSON_CreateObject(), *toks = cJSON_CreateArray(), *lps = cJSON_CreateArray(),
          *tops = cJSON_CreateArray(), *offs = cJSON_CreateArray();
    size_t off = base_offset;
    for (size_t i = 0; i < (size_t)o->n_pl + o->n_lps; i++) {
        const srv_lp *l = i < (size_t)o->n_pl ? &o->pl[i] : &o->lps[i - (size_t)o->n_pl];
        size_t n = 0;
        const char *s = dsv4_tok_token_bytes(o->S->tok, l->token, &n);
        char *str = s ? strndup(s, n) : NULL;
        cJSON_AddItemToArray(toks, cJSON_CreateString(str ? str : ""));
        free(str);
        cJSON_AddItemToArray(offs, cJSON_CreateNumber((double)off));
        if (!(i == 0 && o->n_pl && l->token == o->S->info.bos_token_id)) off += n; /* (the echo leaves a leading BOS out) */
        if (isnan(l->logprob)) {
            cJSON_AddItemToArray(lps, cJSON_CreateNull());
            cJSON_AddItemToArray(tops, cJSON_CreateNull());
            continue;
        }
        cJSON_AddItemToArray(lps, cJSON_CreateNumber(isfinite(l->logprob) ? l->logprob : -9999.0));
        cJSON *top = cJSON_CreateObject();
        for (int k = 0; k < l->n_top && k < o->r->top_logprobs; k++) {
            size_t m = 0;
            const char *ts = dsv4_tok_token_bytes(o->S->tok, l->top[k].token, &m);
            char *tstr = ts ? strndup(ts, m) : NULL;
            if (tstr && !cJSON_GetObjectItemCaseSensitive(top, tstr))
                cJSON_AddNumberToObject(top, tstr, isfinite(l->top[k].logprob) ? l->top[k].logprob : -9999.0);
            free(tstr);
        }
        cJSON_AddItemToArray(tops, top);
    }
    cJSON_AddItemToObject(j, "tokens", toks);
    cJSON_AddItemToObject(j, "token_logprobs", lps);
    cJSON_AddItemToObject(j, "top_logprobs", tops);
    cJSON_AddItemToObject(j, "text_offset", offs);
    o->n_lps = 0;
    o->n_pl = 0;
    return j;
}

/* ---- responses ---- */

static const char *finish_reason(const srv_out *o, int tools) {
    switch (o->finish) {
    case SRV_FIN_LENGTH: return "length";
    case SRV_FIN_ABORT: return "abort";
    case SRV_FIN_ERROR: return "error";
    default: return tools ? "tool_calls" : "stop";
    }
}

/* the usage of the choices o[0..n): each prompt once (its choices share it: counted at its leader), every choice's
 * completion */
static cJSON *usage_json(const srv_out *o, int n) {
    cJSON *u = cJSON_CreateObject();
    long gen = 0, prompt = 0, cached = 0;
    for (int i = 0; i < n; i++) {
        gen += o[i].n_gen;
        if (o[i].r->lead) continue;
        prompt += o[i].r->n_prompt;
        cached += o[i].r->n_cached;
    }
    cJSON_AddNumberToObject(u, "prompt_tokens", (double)prompt);
    cJSON_AddNumberToObject(u, "completion_tokens", (double)gen);
    cJSON_AddNumberToObject(u, "total_tokens", (double)(prompt + gen));
    if (cached > 0) { /* vLLM's and OpenAI's field for prompt tokens served from a cache */
        cJSON *d = cJSON_CreateObject();
        cJSON_AddNumberToObject(d, "cached_tokens", (double)cached);
        cJSON_AddItemToObject(u, "prompt_tokens_details", d);
    }
    return u;
}

static cJSON *chunk_head(srv_out *o) {
    cJSON *c = cJSON_CreateObject();
    cJSON_AddStringToObject(c, "id", o->r->id);
    cJSON_AddStringToObject(c, "object", o->r->api == SRV_API_CHAT ? "chat.completion.chunk" : "text_completion");
    cJSON_AddNumberToObject(c, "created", (double)o->r->created);
    cJSON_AddStringToObject(c, "model", o->r->model);
    cJSON_AddStringToObject(c, "system_fingerprint", "dsv4");
    return c;
}

static void chat_chunk(srv_out *o, cJSON *delta, const char *finish, cJSON *logprobs) {
    cJSON *c = chunk_head(o), *ch = cJSON_CreateArray(), *c0 = cJSON_CreateObject();
    cJSON_AddNumberToObject(c0, "index", o->r->index);
    cJSON_AddItemToObject(c0, "delta", delta);
    if (logprobs) {
        cJSON *l = cJSON_CreateObject();
        cJSON_AddItemToObject(l, "content", logprobs);
        cJSON_AddItemToObject(c0, "logprobs", l);
    } else {
        cJSON_AddNullToObject(c0, "logprobs");
    }
    if (finish) cJSON_AddStringToObject(c0, "finish_reason", finish);
    else cJSON_AddNullToObject(c0, "finish_reason");
    cJSON_AddItemToArray(ch, c0);
    cJSON_AddItemToObject(c, "choices", ch);
    if (o->r->include_usage) cJSON_AddNullToObject(c, "usage");
    srv_sse(&o->sse, NULL, c);
}

void srv_openai_stream_start(srv_out *o) {
    if (o->r->api != SRV_API_CHAT) return;
    cJSON *d = cJSON_CreateObject();
    cJSON_AddStringToObject(d, "role", "assistant");
    cJSON_AddStringToObject(d, "content", "");
    chat_chunk(o, d, NULL, NULL);
}

void srv_openai_stream_delta(srv_out *o, const dsv4_chat_delta *dl) {
    cJSON *d = cJSON_CreateObject();
    if (dl->kind == DSV4_DELTA_TOOL_CALL) {
        cJSON *a = cJSON_CreateArray(), *c = cJSON_CreateObject(), *f = cJSON_CreateObject();
        char id[64];
        snprintf(id, sizeof id, "call_%s%d", o->tool_prefix, dl->index);
        cJSON_AddNumberToObject(c, "index", dl->index);
        cJSON_AddStringToObject(c, "id", id);
        cJSON_AddStringToObject(c, "type", "function");
        cJSON_AddStringToObject(f, "name", dl->call->name ? dl->call->name : "");
        cJSON_AddStringToObject(f, "arguments", dl->call->arguments ? dl->call->arguments : "{}");
        cJSON_AddItemToObject(c, "function", f);
        cJSON_AddItemToArray(a, c);
        cJSON_AddItemToObject(d, "tool_calls", a);
        o->n_tools++;
    } else {
        char *t = strndup(dl->text, dl->len);
        cJSON_AddStringToObject(d, dl->kind == DSV4_DELTA_REASONING ? "reasoning_content" : "content", t ? t : "");
        free(t);
    }
    chat_chunk(o, d, NULL, o->r->logprobs && o->n_lps ? srv_openai_lp_content(o) : NULL);
}

void srv_openai_stream_text(srv_out *o, const char *t, size_t n) {
    cJSON *c = chunk_head(o), *ch = cJSON_CreateArray(), *c0 = cJSON_CreateObject();
    char *s = strndup(t, n);
    cJSON_AddStringToObject(c0, "text", s ? s : "");
    free(s);
    cJSON_AddNumberToObject(c0, "index", o->r->index);
    if (o->r->logprobs) cJSON_AddItemToObject(c0, "logprobs", lp_completion(o, o->text_total));
    else cJSON_AddNullToObject(c0, "logprobs");
    o->text_total += n;
    cJSON_AddNullToObject(c0, "finish_reason");
    cJSON_AddItemToArray(ch, c0);
    cJSON_AddItemToObject(c, "choices", ch);
    srv_sse(&o->sse, NULL, c);
}

void srv_openai_stream_end(srv_out *o) {
    srv_req *r = o->r;
    if (o->finish == SRV_FIN_ERROR) {
        srv_error e = {.status = 500};
        snprintf(e.msg, sizeof e.msg, "generation failed: %s", o->errmsg);
        char *body = srv_openai_error_body(&e);
        if (body) {
            dsv4_sb_printf(&o->sse, "data: %s\n\n", body);
            free(body);
        }
    }
    if (r->api == SRV_API_CHAT) {
        chat_chunk(o, cJSON_CreateObject(), finish_reason(o, o->n_tools > 0),
                   r->logprobs && o->n_lps ? srv_openai_lp_content(o) : NULL);
    } else {
        cJSON *c = chunk_head(o), *ch = cJSON_CreateArray(), *c0 = cJSON_CreateObject();
        cJSON_AddStringToObject(c0, "text", "");
        cJSON_AddNumberToObject(c0, "index", r->index);
        if (r->logprobs && o->n_lps) cJSON_AddItemToObject(c0, "logprobs", lp_completion(o, o->text_total));
        else cJSON_AddNullToObject(c0, "logprobs");
        cJSON_AddStringToObject(c0, "finish_reason", finish_reason(o, 0));
        cJSON_AddItemToArray(ch, c0);
        cJSON_AddItemToObject(c, "choices", ch);
        srv_sse(&o->sse, NULL, c);
    }
    if (!o->multi) srv_openai_stream_tail(o, 1);
}

void srv_openai_stream_tail(srv_out *o, int n) {
    dsv4_sb *to = &o[n - 1].sse; /* the last one a reader drains */
    if (o->r->include_usage) {
        cJSON *c = chunk_head(o);
        cJSON_AddItemToObject(c, "choices", cJSON_CreateArray());
        cJSON_AddItemToObject(c, "usage", usage_json(o, n));
        srv_sse(to, NULL, c);
    }
    dsv4_sb_puts(to, "data: [DONE]\n\n");
}

/* one choice of a response */
static cJSON *choice_json(srv_out *o) {
    srv_req *r = o->r;
    cJSON *c0 = cJSON_CreateObject();
    cJSON_AddNumberToObject(c0, "index", r->index);
    int tools = 0;
    if (r->api == SRV_API_CHAT) {
        const dsv4_chat_parsed *m = dsv4_chat_parser_result(o->parser);
        cJSON *msg = cJSON_CreateObject();
        tools = m->n_tool_calls > 0;
        cJSON_AddStringToObject(msg, "role", "assistant");
        if (tools && !m->content_len) cJSON_AddNullToObject(msg, "content");
        else cJSON_AddStringToObject(msg, "content", m->content ? m->content : "");
        if (r->mode == DSV4_CHAT_THINKING)
            cJSON_AddStringToObject(msg, "reasoning_content", m->reasoning_content ? m->reasoning_content : "");
        if (tools) cJSON_AddItemToObject(msg, "tool_calls", srv_tool_calls_json(o, m));
        cJSON_AddItemToObject(c0, "message", msg);
        if (r->logprobs) {
            cJSON *l = cJSON_CreateObject();
            cJSON_AddItemToObject(l, "content", srv_openai_lp_content(o));
            cJSON_AddItemToObject(c0, "logprobs", l);
        } else {
            cJSON_AddNullToObject(c0, "logprobs");
        }
    } else {
        cJSON_AddStringToObject(c0, "text", o->raw.p ? o->raw.p : "");
        if (r->logprobs) cJSON_AddItemToObject(c0, "logprobs", lp_completion(o, 0));
        else cJSON_AddNullToObject(c0, "logprobs");
    }
    cJSON_AddStringToObject(c0, "finish_reason", finish_reason(o, tools));
    return c0;
}

char *srv_openai_body(srv_out *o, int n, size_t *len) {
    const srv_req *r = o->r;
    cJSON *c = cJSON_CreateObject(), *ch = cJSON_CreateArray();
    cJSON_AddStringToObject(c, "id", r->id);
    cJSON_AddStringToObject(c, "object", r->api == SRV_API_CHAT ? "chat.completion" : "text_completion");
    cJSON_AddNumberToObject(c, "created", (double)r->created);
    cJSON_AddStringToObject(c, "model", r->model);
    cJSON_AddStringToObject(c, "system_fingerprint", "dsv4");
    for (int i = 0; i < n; i++) cJSON_AddItemToArray(ch, choice_json(&o[i]));
    cJSON_AddItemToObject(c, "choices", ch);
    cJSON_AddItemToObject(c, "usage", usage_json(o, n));
    return srv_json_print(c, len);
}
