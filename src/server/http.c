/* http.c - the HTTP layer of `dsv4 serve` over libmicrohttpd (a thread per connection, so handlers may
 * block): routing, API-key check, body size limit, error objects, non-streaming waits and SSE streams
 * (MHD_create_response_from_callback), client-gone detection, idle / slow-client timeouts and the
 * SIGTERM drain. */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <microhttpd.h>

#include "server.h"

typedef struct conn {
    dsv4_sb body;
    int too_large, responded;
    srv_ep ep;
} conn;

/* A request's choices (OpenAI's n for each of its prompts; 1 for most requests) and their consumers. The engine bumps
 * r[0]'s gen (under its mu) on every push or finish of any of them (their root), so one wait covers them all. */
typedef struct reply {
    int n;
    srv_req **r;  /* r[0]: the leader; a reference each */
    srv_out *out; /* out[i] drains r[i] */
} reply;

typedef struct stream {
    srv_ctx *S;
    reply rp;
    int fd;
    int ended;          /* every choice ended and the tail (n > 1) was appended */
    unsigned long seen; /* the leader's gen at the last pump */
    double last_sent;   /* when the reader last handed bytes to MHD */
} stream;

/* A stream that waits (queued behind other requests, or a long prefill) sends an SSE comment this
 * often: MHD's idle timeout counts from the last byte sent, and clients ignore comments. */
static double keepalive_s(const srv_ctx *S) {
    double t = S->cfg.timeout_s / 3.0;
    return t < 15 ? t : 15;
}

/* ---- helpers ---- */

static int client_gone(int fd) {
    if (fd < 0) return 0;
    char ch;
    ssize_t n = recv(fd, &ch, 1, MSG_PEEK | MSG_DONTWAIT);
    if (n == 0) return 1;
    if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) return 1;
    return 0;
}

static int conn_fd(struct MHD_Connection *c) {
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    return ci ? (int)ci->connect_fd : -1;
}

static srv_ep endpoint_of(const char *url) {
    if (!strcmp(url, "/v1/chat/completions")) return SRV_EP_CHAT;
    if (!strcmp(url, "/v1/completions")) return SRV_EP_COMPLETIONS;
    if (!strcmp(url, "/v1/messages")) return SRV_EP_MESSAGES;
    if (!strcmp(url, "/v1/messages/count_tokens")) return SRV_EP_COUNT_TOKENS;
    if (!strcmp(url, "/v1/models") || !strncmp(url, "/v1/models/", 11)) return SRV_EP_MODELS;
    if (!strcmp(url, "/health")) return SRV_EP_HEALTH;
    if (!strcmp(url, "/metrics")) return SRV_EP_METRICS;
    if (!strcmp(url, "/tokenize")) return SRV_EP_TOKENIZE;
    if (!strcmp(url, "/v1/responses") || !strncmp(url, "/v1/responses/", 14)) return SRV_EP_RESPONSES;
    if (!strcmp(url, "/detokenize")) return SRV_EP_DETOKENIZE;
    return SRV_EP_OTHER;
}

static enum MHD_Result queue(struct MHD_Connection *c, conn *k, int status, char *body, size_t len,
                             const char *ctype, int retry_after) {
    if (!body) {
        static const char oom[] = "{\"error\":{\"message\":\"out of memory\",\"type\":\"server_error\"}}";
        status = 500;
        body = strdup(oom);
        if (!body) return MHD_NO;
        len = strlen(body);
        ctype = "application/json";
    }
    struct MHD_Response *resp = MHD_create_response_from_buffer(len, body, MHD_RESPMEM_MUST_FREE);
    if (!resp) {
        free(body);
        return MHD_NO;
    }
    MHD_add_response_header(resp, "Content-Type", ctype);
    if (retry_after) {
        char ra[16];
        snprintf(ra, sizeof ra, "%d", retry_after);
        MHD_add_response_header(resp, "Retry-After", ra);
    }
    if (status == 401) MHD_add_response_header(resp, "WWW-Authenticate", "Bearer");
    enum MHD_Result rc = MHD_queue_response(c, (unsigned)status, resp);
    MHD_destroy_response(resp);
    if (k) {
        k->responded = 1;
        srv_metrics_request(k->ep, status);
    }
    return rc;
}

static enum MHD_Result send_json(struct MHD_Connection *c, conn *k, int status, char *body, size_t len) {
    return queue(c, k, status, body, body ? (len ? len : strlen(body)) : 0, "application/json", 0);
}

static enum MHD_Result send_error(struct MHD_Connection *c, conn *k, const srv_error *e) {
    char *body = k && (k->ep == SRV_EP_MESSAGES || k->ep == SRV_EP_COUNT_TOKENS) ? srv_anthropic_error_body(e)
                                                                                : srv_openai_error_body(e);
    return queue(c, k, e->status, body, body ? strlen(body) : 0, "application/json", e->status == 503 ? 1 : 0);
}

static enum MHD_Result fail(struct MHD_Connection *c, conn *k, int status, const char *msg) {
    srv_error e = {.status = status};
    snprintf(e.msg, sizeof e.msg, "%s", msg);
    return send_error(c, k, &e);
}

static int ct_eq(const char *a, const char *b) { /* constant time in the length of b */
    size_t la = strlen(a), lb = strlen(b);
    unsigned char d = la != lb;
    for (size_t i = 0; i < lb; i++) d |= (unsigned char)(a[i < la ? i : 0] ^ b[i]);
    return d == 0;
}

static int authorized(struct MHD_Connection *c, const char *key) {
    const char *h = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Authorization");
    if (h && !strncasecmp(h, "Bearer ", 7)) {
        h += 7;
        while (*h == ' ') h++;
        if (ct_eq(h, key)) return 1;
    }
    h = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "x-api-key");
    return h && ct_eq(h, key);
}

/* ---- simple endpoints ---- */

static enum MHD_Result models(srv_ctx *S, struct MHD_Connection *c, conn *k, const char *url) {
    cJSON *m = cJSON_CreateObject();
    cJSON_AddStringToObject(m, "id", S->cfg.model_name);
    cJSON_AddStringToObject(m, "object", "model");
    cJSON_AddNumberToObject(m, "created", 0);
    cJSON_AddStringToObject(m, "owned_by", "dsv4");
    cJSON_AddNumberToObject(m, "max_model_len", S->cfg.max_context);
    if (!strncmp(url, "/v1/models/", 11)) {
        if (strcmp(url + 11, S->cfg.model_name)) {
            cJSON_Delete(m);
            srv_error e = {.status = 404, .type = "model_not_found"};
            snprintf(e.msg, sizeof e.msg, "The model '%s' does not exist", url + 11);
            return send_error(c, k, &e);
        }
        return send_json(c, k, 200, srv_json_print(m, NULL), 0);
    }
    cJSON *j = cJSON_CreateObject(), *a = cJSON_CreateArray();
    cJSON_AddStringToObject(j, "object", "list");
    cJSON_AddItemToArray(a, m);
    cJSON_AddItemToObject(j, "data", a);
    return send_json(c, k, 200, srv_json_print(j, NULL), 0);
}

/* ---- generation ---- */

static void reply_cancel(reply *rp) {
    for (int i = 0; i < rp->n; i++) atomic_store(&rp->r[i]->cancel, 1);
}

static void reply_free(reply *rp) {
    for (int i = 0; rp->out && i < rp->n; i++) srv_out_free(&rp->out[i]);
    for (int i = 0; rp->r && i < rp->n; i++) srv_req_release(rp->r[i]);
    free(rp->out);
    free(rp->r);
    rp->out = NULL;
    rp->r = NULL;
}

/* The requests of a parsed r (which the reply takes over): for each of its prompts (completions may have a list) a
 * leader and its choices 1..n-1, in the order of their indices. 0, or -1: out of memory (r released with the rest). */
static int reply_init(reply *rp, srv_req *r) {
    const int n = r->n_choices, total = n * (1 + r->n_more_prompts);
    rp->n = 0;
    rp->r = calloc((size_t)total, sizeof *rp->r);
    rp->out = calloc((size_t)total, sizeof *rp->out);
    if (!rp->r || !rp->out) {
        free(rp->r), free(rp->out);
        rp->r = NULL, rp->out = NULL;
        srv_req_release(r);
        return -1;
    }
    rp->r[rp->n++] = r;
    for (int k = -1; k < r->n_more_prompts; k++) {
        srv_req *lead = k < 0 ? r : srv_req_for_prompt(r, k);
        if (!lead) goto oom;
        if (k >= 0) rp->r[rp->n++] = lead;
        for (int j = 1; j < n; j++) {
            if (!(rp->r[rp->n] = srv_req_clone(lead, j))) goto oom;
            rp->n++;
        }
    }
    return 0;
oom:
    reply_free(rp);
    return -1;
}

/* The consumers (after the submit: the chat parsers' tool-call ids are drawn here). 0, or -1: out of memory. */
static int reply_outs(reply *rp, srv_ctx *S) {
    for (int i = 0; i < rp->n; i++) {
        if (srv_out_init(&rp->out[i], S, rp->r[i])) return -1;
        rp->out[i].multi = rp->n > 1;
    }
    return 0;
}

static ssize_t sse_reader(void *cls, uint64_t pos, char *buf, size_t max) {
    stream *st = cls;
    reply *rp = &st->rp;
    srv_req *lead = rp->r[0]; /* the root */
    for (;;) {
        /* a choice's events go out whole before another's: new ones are only made once every buffer is empty */
        for (int i = 0; i < rp->n; i++) {
            srv_out *o = &rp->out[i];
            if (o->sse_off >= o->sse.n) continue;
            size_t n = o->sse.n - o->sse_off;
            if (n > max) n = max;
            memcpy(buf, o->sse.p + o->sse_off, n);
            o->sse_off += n;
            if (o->sse_off == o->sse.n) o->sse_off = o->sse.n = 0;
            st->last_sent = srv_now();
            return (ssize_t)n;
        }
        if (srv_now() - st->last_sent >= keepalive_s(st->S) && max >= 14) {
            static const char ka[] = ": keep-alive\n\n";
            memcpy(buf, ka, sizeof ka - 1);
            st->last_sent = srv_now();
            return (ssize_t)(sizeof ka - 1);
        }
        if (st->ended) return MHD_CONTENT_READER_END_OF_STREAM;
        for (int i = 0; i < rp->n; i++)
            if (rp->out[i].oom) {
                reply_cancel(rp);
                return MHD_CONTENT_READER_END_WITH_ERROR;
            }
        pthread_mutex_lock(&lead->mu);
        if (lead->gen == st->seen) {
            struct timespec dl;
            clock_gettime(CLOCK_REALTIME, &dl);
            dl.tv_nsec += 200 * 1000000L;
            if (dl.tv_nsec >= 1000000000L) dl.tv_sec++, dl.tv_nsec -= 1000000000L;
            pthread_cond_timedwait(&lead->cv, &lead->mu, &dl);
        }
        st->seen = lead->gen; /* before the pumps: a push after this read wakes the next wait at once */
        pthread_mutex_unlock(&lead->mu);
        if (client_gone(st->fd)) {
            reply_cancel(rp);
            return MHD_CONTENT_READER_END_WITH_ERROR;
        }
        int ended = 0;
        for (int i = 0; i < rp->n; i++) ended += srv_out_pump(&rp->out[i]);
        if (ended == rp->n) {
            if (rp->n > 1) srv_openai_stream_tail(&rp->out[0], rp->n);
            st->ended = 1;
        }
    }
}

static void sse_free(void *cls) {
    stream *st = cls;
    if (!st->ended) reply_cancel(&st->rp);
    reply_free(&st->rp);
    atomic_fetch_sub(&st->S->active, 1);
    free(st);
}

/* Waits until r is done; 0, or -1 when the client went away (r cancelled). */
static int wait_done(srv_req *r, int fd) {
    double last = srv_now();
    pthread_mutex_lock(&r->mu);
    while (!r->done) {
        struct timespec dl;
        clock_gettime(CLOCK_REALTIME, &dl);
        dl.tv_nsec += 250 * 1000000L;
        if (dl.tv_nsec >= 1000000000L) dl.tv_sec++, dl.tv_nsec -= 1000000000L;
        pthread_cond_timedwait(&r->cv, &r->mu, &dl); /* woken by every token, or the timeout */
        double now = srv_now();
        if (r->done || now - last < 0.2) continue;
        last = now;
        pthread_mutex_unlock(&r->mu);
        if (client_gone(fd)) {
            atomic_store(&r->cancel, 1);
            return -1;
        }
        pthread_mutex_lock(&r->mu);
    }
    pthread_mutex_unlock(&r->mu);
    return 0;
}

static enum MHD_Result generate(srv_ctx *S, struct MHD_Connection *c, conn *k, srv_api api) {
    srv_error e = {0};
    if (k->too_large) return fail(c, k, 413, "the request body is too large");
    if (atomic_load(&S->draining)) return fail(c, k, 503, "the server is shutting down");
    dsv4_err je = {{0}};
    cJSON *body = dsv4_pyjson_parse(k->body.p ? k->body.p : "", k->body.n, &je);
    if (!body) {
        srv_fail(&e, 400, "the request body is not valid JSON: %s", je.msg);
        return send_error(c, k, &e);
    }
    srv_req *r = srv_req_new(api);
    if (!r) {
        cJSON_Delete(body);
        return fail(c, k, 500, "out of memory");
    }
    int rc = api == SRV_API_CHAT         ? srv_openai_parse_chat(S, body, r, &e)
             : api == SRV_API_COMPLETION ? srv_openai_parse_completion(S, body, r, &e)
             : api == SRV_API_RESPONSES  ? srv_responses_parse(S, body, r, &e)
                                         : srv_anthropic_parse(S, body, r, &e);
    cJSON_Delete(body);
    if (rc) {
        srv_req_release(r);
        return send_error(c, k, &e);
    }
    reply rp;
    if (reply_init(&rp, r)) return fail(c, k, 500, "out of memory");
    int st = srv_sched_submit(S->sched, rp.r, rp.n, e.msg, sizeof e.msg);
    if (st) {
        e.status = st;
        reply_free(&rp);
        return send_error(c, k, &e);
    }
    if (S->cfg.verbose)
        fprintf(stderr, "dsv4 serve: %s: prompt %d tokens, max_tokens %d, n %d, %s\n", r->id, r->n_prompt,
                r->max_tokens, rp.n, r->stream ? "stream" : "no stream");
    atomic_fetch_add(&S->active, 1);
    int fd = conn_fd(c);
    if (r->stream) {
        stream *sm = calloc(1, sizeof *sm);
        if (!sm || reply_outs(&rp, S)) {
            free(sm);
            reply_cancel(&rp);
            reply_free(&rp);
            atomic_fetch_sub(&S->active, 1);
            return fail(c, k, 500, "out of memory");
        }
        sm->S = S;
        sm->rp = rp;
        sm->fd = fd;
        sm->last_sent = srv_now();
        struct MHD_Response *resp = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16384, sse_reader, sm, sse_free);
        if (!resp) {
            sse_free(sm);
            return MHD_NO;
        }
        MHD_add_response_header(resp, "Content-Type", "text/event-stream; charset=utf-8");
        MHD_add_response_header(resp, "Cache-Control", "no-cache");
        MHD_add_response_header(resp, "X-Accel-Buffering", "no");
        enum MHD_Result q = MHD_queue_response(c, 200, resp);
        MHD_destroy_response(resp);
        k->responded = 1;
        srv_metrics_request(k->ep, 200);
        return q;
    }
    if (reply_outs(&rp, S)) {
        reply_cancel(&rp);
        reply_free(&rp);
        atomic_fetch_sub(&S->active, 1);
        return fail(c, k, 500, "out of memory");
    }
    enum MHD_Result q = MHD_YES;
    int gone = 0;
    /* the last choice first (the leader's cv wakes for every choice); a choice that failed or was cancelled ends the
     * others (the response is an error then) */
    for (int i = rp.n - 1; i >= 0 && !gone; i--) {
        gone = wait_done(rp.r[i], fd) != 0;
        pthread_mutex_lock(&rp.r[i]->mu);
        const int bad = rp.r[i]->finish == SRV_FIN_ERROR || rp.r[i]->finish == SRV_FIN_ABORT;
        pthread_mutex_unlock(&rp.r[i]->mu);
        if (bad && rp.n > 1) reply_cancel(&rp);
    }
    if (gone) {
        reply_cancel(&rp);
        q = MHD_NO; /* the client is gone */
        srv_metrics_request(k->ep, 499);
    } else {
        int err = -1, aborted = 0, oom = 0;
        for (int i = 0; i < rp.n; i++) {
            srv_out *o = &rp.out[i];
            srv_out_pump(o);
            if (o->finish == SRV_FIN_ERROR && err < 0) err = i;
            aborted |= o->finish == SRV_FIN_ABORT;
            oom |= o->oom;
        }
        if (err >= 0) {
            srv_fail(&e, 500, "generation failed: %s", rp.out[err].errmsg);
            q = send_error(c, k, &e);
        } else if (aborted) {
            q = fail(c, k, 503, "the request was cancelled: the server is shutting down");
        } else if (oom) {
            q = fail(c, k, 500, "out of memory");
        } else {
            size_t len = 0;
            char *out = api == SRV_API_ANTHROPIC   ? srv_anthropic_body(&rp.out[0], &len)
                        : api == SRV_API_RESPONSES ? srv_responses_body(&rp.out[0], &len)
                                                   : srv_openai_body(rp.out, rp.n, &len);
            q = send_json(c, k, 200, out, len);
        }
    }
    reply_free(&rp);
    atomic_fetch_sub(&S->active, 1);
    return q;
}

/* ---- /tokenize, /detokenize, /v1/messages/count_tokens ---- */

static enum MHD_Result tokenize(srv_ctx *S, struct MHD_Connection *c, conn *k) {
    srv_error e = {0};
    if (k->too_large) return fail(c, k, 413, "the request body is too large");
    dsv4_err je = {{0}};
    cJSON *body = dsv4_pyjson_parse(k->body.p ? k->body.p : "", k->body.n, &je);
    if (!body) {
        srv_fail(&e, 400, "the request body is not valid JSON: %s", je.msg);
        return send_error(c, k, &e);
    }
    size_t len = 0;
    char *out = k->ep == SRV_EP_TOKENIZE     ? srv_tokenize_body(S, body, &len, &e)
                : k->ep == SRV_EP_DETOKENIZE ? srv_detokenize_body(S, body, &len, &e)
                                             : srv_count_tokens_body(S, body, &len, &e);
    cJSON_Delete(body);
    return out ? send_json(c, k, 200, out, len) : send_error(c, k, &e);
}

/* ---- the access handler ---- */

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                                  const char *version, const char *upload, size_t *upload_size, void **con_cls) {
    srv_ctx *S = cls;
    conn *k = *con_cls;
    if (!k) {
        if (!(k = calloc(1, sizeof *k))) return MHD_NO;
        *con_cls = k;
        k->ep = endpoint_of(url);
        if (S->cfg.api_key && !authorized(c, S->cfg.api_key))
            return fail(c, k, 401, "Incorrect or missing API key (send Authorization: Bearer KEY or x-api-key: KEY)");
        const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Content-Length");
        if (cl) {
            char *end;
            errno = 0;
            unsigned long long n = strtoull(cl, &end, 10);
            if (errno || end == cl || n > S->cfg.max_body)
                return fail(c, k, 413, "the request body is too large");
        }
        return MHD_YES;
    }
    if (k->responded) {
        *upload_size = 0;
        return MHD_YES;
    }
    if (*upload_size) {
        if (!k->too_large) {
            if (k->body.n + *upload_size > S->cfg.max_body) {
                k->too_large = 1;
                dsv4_sb_free(&k->body);
            } else {
                dsv4_sb_put(&k->body, upload, *upload_size);
                if (k->body.oom) k->too_large = 1;
            }
        }
        *upload_size = 0;
        return MHD_YES;
    }
    int get = !strcmp(method, MHD_HTTP_METHOD_GET) || !strcmp(method, MHD_HTTP_METHOD_HEAD);
    int post = !strcmp(method, MHD_HTTP_METHOD_POST);
    switch (k->ep) {
    case SRV_EP_HEALTH:
        if (!get) break;
        if (atomic_load(&S->draining)) return fail(c, k, 503, "the server is shutting down");
        return send_json(c, k, 200, strdup("{\"status\":\"ok\"}"), 0);
    case SRV_EP_METRICS: {
        if (!get) break;
        size_t len = 0;
        char *txt = srv_metrics_render(S->sched, &len);
        return queue(c, k, 200, txt, len, "text/plain; version=0.0.4; charset=utf-8", 0);
    }
    case SRV_EP_MODELS:
        if (!get) break;
        return models(S, c, k, url);
    case SRV_EP_CHAT:
        if (!post) break;
        return generate(S, c, k, SRV_API_CHAT);
    case SRV_EP_COMPLETIONS:
        if (!post) break;
        return generate(S, c, k, SRV_API_COMPLETION);
    case SRV_EP_MESSAGES:
        if (!post) break;
        return generate(S, c, k, SRV_API_ANTHROPIC);
    case SRV_EP_RESPONSES:
        if (strcmp(url, "/v1/responses")) { /* /v1/responses/{id}: nothing is stored */
            char msg[512];
            snprintf(msg, sizeof msg, "No response with id '%.300s' (this server stores no responses)", url + 14);
            return fail(c, k, 404, msg);
        }
        if (!post) break;
        return generate(S, c, k, SRV_API_RESPONSES);
    case SRV_EP_TOKENIZE:
    case SRV_EP_DETOKENIZE:
    case SRV_EP_COUNT_TOKENS:
        if (!post) break;
        return tokenize(S, c, k);
    default: {
        char msg[512];
        snprintf(msg, sizeof msg, "no such endpoint: %s %.300s", method, url);
        return fail(c, k, 404, msg);
    }
    }
    char msg[512];
    snprintf(msg, sizeof msg, "method %s is not allowed on %.300s", method, url);
    return fail(c, k, 405, msg);
}

static void on_completed(void *cls, struct MHD_Connection *c, void **con_cls, enum MHD_RequestTerminationCode toe) {
    conn *k = *con_cls;
    if (!k) return;
    dsv4_sb_free(&k->body);
    free(k);
    *con_cls = NULL;
}

static void on_log(void *cls, const char *fmt, va_list ap) {
    srv_ctx *S = cls;
    if (!S->cfg.verbose) return;
    fprintf(stderr, "dsv4 serve: libmicrohttpd: ");
    vfprintf(stderr, fmt, ap);
}

int srv_http_start(srv_ctx *S) {
    unsigned flags = MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_ITC | MHD_USE_ERROR_LOG;
    struct sockaddr_in a4;
    struct sockaddr_in6 a6;
    struct sockaddr *sa;
    memset(&a4, 0, sizeof a4);
    memset(&a6, 0, sizeof a6);
    if (inet_pton(AF_INET, S->cfg.host, &a4.sin_addr) == 1) {
        a4.sin_family = AF_INET;
        a4.sin_port = htons((uint16_t)S->cfg.port);
        sa = (struct sockaddr *)&a4;
    } else if (inet_pton(AF_INET6, S->cfg.host, &a6.sin6_addr) == 1) {
        a6.sin6_family = AF_INET6;
        a6.sin6_port = htons((uint16_t)S->cfg.port);
        sa = (struct sockaddr *)&a6;
        flags |= MHD_USE_IPv6;
    } else {
        fprintf(stderr, "dsv4 serve: --host %s: expected a numeric IPv4 or IPv6 address\n", S->cfg.host);
        return -1;
    }
    S->daemon = MHD_start_daemon(flags, (uint16_t)S->cfg.port, NULL, NULL, on_request, S, MHD_OPTION_EXTERNAL_LOGGER, on_log, S,
                                 MHD_OPTION_SOCK_ADDR, sa,
                                 MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)S->cfg.timeout_s,
                                 MHD_OPTION_CONNECTION_LIMIT, (unsigned)S->cfg.max_conns,
                                 MHD_OPTION_NOTIFY_COMPLETED, on_completed, S,
                                 MHD_OPTION_LISTENING_ADDRESS_REUSE, (unsigned)1,
                                 MHD_OPTION_END);
    if (!S->daemon) {
        fprintf(stderr, "dsv4 serve: cannot listen on %s port %d: %s\n", S->cfg.host, S->cfg.port,
                errno ? strerror(errno) : "libmicrohttpd failed to start");
        return -1;
    }
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(S->daemon, MHD_DAEMON_INFO_BIND_PORT);
    if (di && di->port) S->cfg.port = di->port;
    return 0;
}

void srv_http_stop(srv_ctx *S) {
    if (!S->daemon) return;
    atomic_store(&S->draining, 1);
    MHD_socket ls = MHD_quiesce_daemon(S->daemon); /* no new connections; pending ones are refused */
    if (ls != MHD_INVALID_SOCKET) close(ls);
    int left = srv_sched_drain(S->sched, S->cfg.drain_s);
    if (left) fprintf(stderr, "dsv4 serve: drain timeout: cancelled %d request(s)\n", left);
    /* let the handlers deliver their final bytes */
    double t0 = srv_now();
    while (atomic_load(&S->active) > 0 && srv_now() - t0 < 10) usleep(10000);
    MHD_stop_daemon(S->daemon);
    S->daemon = NULL;
}
