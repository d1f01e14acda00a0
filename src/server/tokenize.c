/* tokenize.c - vLLM's /tokenize and /detokenize endpoints: the server's own tokenizer and chat encoding, so that a
 * client can count a prompt's tokens (or turn ids back into text) exactly as a generation request would.
 *
 *   POST /tokenize   {"prompt": "text", "add_special_tokens": true}
 *                 or {"messages": [...], plus the chat options of /v1/chat/completions (thinking, reasoning_effort,
 *                     tools, tool_choice, response_format)}
 *                 [, "return_token_strs": true]
 *                 -> {"count": N, "max_model_len": L, "tokens": [ids], "token_strs": [strings] | null}
 *   POST /detokenize {"tokens": [ids]} -> {"prompt": "text"}
 *   POST /v1/messages/count_tokens (Anthropic's) {a Messages body; max_tokens not needed} -> {"input_tokens": N}
 * A prompt longer than the context is counted, not refused (max_model_len says whether it fits). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "server.h"

static const cJSON *get(const cJSON *o, const char *k) { return cJSON_GetObjectItemCaseSensitive(o, k); }

/* a request to carry the body's prompt: the body an object naming this server's model (if any); NULL with e set */
static srv_req *body_req(srv_ctx *S, const cJSON *b, srv_api api, srv_error *e) {
    if (!cJSON_IsObject(b)) return srv_fail(e, 400, "the request body must be a JSON object"), NULL;
    srv_req *r = srv_req_new(api);
    if (!r) return srv_fail(e, 500, "out of memory"), NULL;
    if (srv_check_model(S, b, r, 0, e)) {
        srv_req_release(r);
        return NULL;
    }
    return r;
}

char *srv_tokenize_body(srv_ctx *S, const cJSON *b, size_t *len, srv_error *e) {
    srv_req *r = body_req(S, b, SRV_API_CHAT, e);
    if (!r) return NULL;
    char *out = NULL;
    int strs = 0;
    if (srv_get_bool(b, "return_token_strs", &strs, e) < 0) goto done;
    const cJSON *p = get(b, "prompt"), *m = get(b, "messages");
    if (p && m) {
        srv_fail(e, 400, "give either prompt or messages, not both");
        goto done;
    }
    if (m) {
        if (srv_openai_chat_prompt(S, b, r, e)) goto done;
    } else if (cJSON_IsString(p)) {
        int add_special = 1;
        if (srv_get_bool(b, "add_special_tokens", &add_special, e) < 0 ||
            srv_tokenize_prompt(S, r, p->valuestring, strlen(p->valuestring), add_special, e))
            goto done;
    } else {
        srv_fail(e, 400, "prompt: expected a string (or messages: an array of message objects)");
        goto done;
    }
    cJSON *j = cJSON_CreateObject(), *ids = cJSON_CreateArray(), *ts = strs ? cJSON_CreateArray() : NULL;
    if (!j || !ids || (strs && !ts)) {
        cJSON_Delete(j), cJSON_Delete(ids), cJSON_Delete(ts);
        srv_fail(e, 500, "out of memory");
        goto done;
    }
    for (int i = 0; i < r->n_prompt; i++) {
        cJSON_AddItemToArray(ids, cJSON_CreateNumber(r->prompt[i]));
        if (!ts) continue;
        const char *t = dsv4_tok_token(S->tok, r->prompt[i]);
        cJSON_AddItemToArray(ts, cJSON_CreateString(t ? t : ""));
    }
    cJSON_AddNumberToObject(j, "count", r->n_prompt);
    cJSON_AddNumberToObject(j, "max_model_len", S->cfg.max_context);
    cJSON_AddItemToObject(j, "tokens", ids);
    if (ts) cJSON_AddItemToObject(j, "token_strs", ts);
    else cJSON_AddNullToObject(j, "token_strs");
    if (!(out = srv_json_print(j, len))) srv_fail(e, 500, "out of memory");
done:
    srv_req_release(r);
    return out;
}

char *srv_detokenize_body(srv_ctx *S, const cJSON *b, size_t *len, srv_error *e) {
    srv_req *r = body_req(S, b, SRV_API_CHAT, e);
    if (!r) return NULL;
    char *out = NULL, *text = NULL;
    int32_t *ids = NULL;
    const cJSON *t = get(b, "tokens");
    if (!cJSON_IsArray(t)) {
        srv_fail(e, 400, "tokens: expected an array of token ids");
        goto done;
    }
    const int n = cJSON_GetArraySize(t);
    if (!(ids = malloc(sizeof(int32_t) * (size_t)(n ? n : 1)))) {
        srv_fail(e, 500, "out of memory");
        goto done;
    }
    for (int i = 0; i < n; i++) {
        const long id = srv_token_id(cJSON_GetArrayItem(t, i), S->tok_vocab);
        if (id < 0) {
            srv_fail(e, 400, "tokens[%d]: expected a token id in [0, %d)", i, S->tok_vocab);
            goto done;
        }
        ids[i] = (int32_t)id;
    }
    dsv4_err de = {{0}};
    size_t tl = 0;
    if (!(text = dsv4_tok_decode(S->tok, ids, (size_t)n, 0, &tl, &de))) {
        srv_fail(e, 400, "tokens: %s", de.msg);
        goto done;
    }
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "prompt", text);
    if (!(out = srv_json_print(j, len))) srv_fail(e, 500, "out of memory");
done:
    free(text);
    free(ids);
    srv_req_release(r);
    return out;
}

char *srv_count_tokens_body(srv_ctx *S, const cJSON *b, size_t *len, srv_error *e) {
    srv_req *r = body_req(S, b, SRV_API_ANTHROPIC, e);
    if (!r) return NULL;
    char *out = NULL;
    if (!srv_anthropic_prompt(S, b, r, e)) {
        cJSON *j = cJSON_CreateObject();
        cJSON_AddNumberToObject(j, "input_tokens", r->n_prompt);
        if (!(out = srv_json_print(j, len))) srv_fail(e, 500, "out of memory");
    }
    srv_req_release(r);
    return out;
}
