/* server.h - `dsv4 serve`: an OpenAI- and Anthropic-compatible HTTP server with continuous batching.
 *
 * Threads and ownership:
 *   - one engine thread (sched.c) owns the model's forward pass and every dsv4_seq / sampler /
 *     detokenizer; it admits queued requests at step boundaries, builds one batch per step (prompt
 *     chunks of new requests + one token per decoding request, under a per-step token budget), samples,
 *     and appends the generated text to each request's output (srv_req.text, under srv_req.mu);
 *   - libmicrohttpd threads (http.c, one per connection) parse and validate requests (openai.c,
 *     anthropic.c), render + tokenize the prompt, submit the request, then drain its output: the chat
 *     parser splits reasoning / content / tool calls and the API module turns the deltas into JSON
 *     (one body, or SSE events);
 *   - metrics.c: counters and histograms, updated from both sides, rendered as Prometheus text.
 * A srv_req is reference counted: the HTTP side holds one reference, the engine one while it runs. */
#ifndef DSV4_SERVER_H
#define DSV4_SERVER_H

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include <cjson/cJSON.h>

#include "dsv4.h"
#include "engine/sample.h"
#include "tok/bpe.h"
#include "tok/chat.h"
#include "tok/chat_json.h"
#include "tok/chat_parse.h"

#define SRV_MAX_STOPS 16
#define SRV_MAX_TOP_LOGPROBS 20
#define SRV_MAX_CHOICES 128 /* OpenAI's limit on n */
#define SRV_MAX_STOP_IDS 1024
#define SRV_MAX_PROMPTS 2048 /* prompts in one completions request (OpenAI's limit) */

typedef struct srv_config {
    const char *model_dir, *model_name, *host, *api_key;
    int port;
    int max_seqs;       /* sequences decoding at once */
    int max_context;    /* tokens per sequence (prompt + generation) */
    int max_queue;      /* requests waiting for admission before 503 */
    int step_tokens;    /* tokens per engine step (prefill chunks + decode tokens) */
    int prefill_chunk;  /* prompt tokens per chunk (fixed, so results do not depend on the load) */
    long kv_tokens;     /* KV budget in tokens over all running sequences (reserved: prompt + max_tokens) */
    size_t max_body;    /* request body limit in bytes (413 beyond) */
    int timeout_s;      /* idle / slow-client connection timeout */
    int drain_s;        /* SIGTERM: how long in-flight requests may run before they are cancelled */
    int max_conns;
    int prefix_cache;   /* cached prompt states (sched.c: a prompt that extends a cached one starts from it); 0: none */
    int default_thinking; /* thinking mode when a request does not say */
    int verbose;
} srv_config;

typedef enum srv_api { SRV_API_CHAT = 0, SRV_API_COMPLETION = 1, SRV_API_ANTHROPIC = 2, SRV_API_RESPONSES = 3 } srv_api;

/* One generated token's log-probabilities (raw model distribution). */
typedef struct srv_lp {
    int32_t token;
    float logprob;
    int n_top;
    dsv4_logprob top[SRV_MAX_TOP_LOGPROBS];
} srv_lp;

typedef enum srv_finish {
    SRV_FIN_NONE = 0,
    SRV_FIN_EOS,    /* end-of-sequence token */
    SRV_FIN_STOP,   /* a stop string (stop_index) */
    SRV_FIN_LENGTH, /* max_tokens or the context */
    SRV_FIN_ABORT,  /* cancelled: client gone or server shutting down */
    SRV_FIN_ERROR,  /* engine error (errmsg) */
} srv_finish;

typedef struct srv_req {
    /* ---- set by the HTTP side before submit; read-only afterwards ---- */
    srv_api api;
    int n_choices;           /* OpenAI's n: this request is choice 0 (the leader) of n; 1 otherwise */
    int index;               /* the choice's index: choices 1..n-1 are srv_req_clone copies of the leader */
    struct srv_req *lead;    /* choices 1..n-1: the leader (a reference held until this one is freed); else NULL */
    struct srv_req *root;    /* a request's other requests (choices, prompts): its first one, which their pushes wake
                              * too (a reference); NULL for the first */
    int stream, include_usage;
    char id[64];
    long created;
    char *model;             /* the model name echoed back */
    int32_t *prompt;
    int n_prompt;
    int max_tokens;          /* > 0, prompt + max_tokens <= context */
    dsv4_sampling sp;        /* sp.stop points at stops */
    char *stops[SRV_MAX_STOPS];
    size_t n_stop;
    int32_t *bias_tok;       /* logit_bias (sp.bias_tok / bias_val point here) */
    float *bias_val;
    size_t n_bias;
    int32_t *stop_ids;       /* stop_token_ids (vLLM's): a drawn one ends the answer like the end-of-sequence token */
    int n_stop_ids;
    int min_tokens;          /* vLLM's: neither the end-of-sequence token nor stop_token_ids before this many tokens */
    int echo;                /* completions: the prompt's text first, with logprobs its tokens' too; max_tokens may be 0 */
    int32_t **more;          /* completions with a list of prompts: prompts 1.. (r has prompt 0), their lengths and */
    int *n_more, *more_max;  /* max_tokens (each capped by its own room in the context) */
    int n_more_prompts;
    cJSON *echo_fields;      /* Responses API: the request's settings a response object repeats (owned) */
    int chat;                /* parse the completion with the chat parser */
    dsv4_chat_mode mode;
    int logprobs, top_logprobs; /* logprobs: record srv_lp per token */
    int want_tools;          /* tools were offered */
    int32_t *force;          /* tool_choice required / named: tokens of the DSML tool-call opening the */
    int n_force;             /* answer is forced to start with (after </think> in thinking mode) */
    double t_submit;

    /* ---- shared: guarded by mu ---- */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    dsv4_sb text;            /* text emitted so far (after stop-string handling) */
    srv_lp *lps;
    size_t n_lp, cap_lp;
    int n_gen;               /* tokens generated */
    int n_cached;            /* prompt tokens taken from the prefix cache (set at admission, read once done) */
    srv_lp *plps;            /* echo with logprobs: the prompt's records (token 0's logprob NAN: none), n_prompt of them, */
    int plp_done;            /* complete once this is set (the engine writes them before; read-only after) */
    int done;
    srv_finish finish;
    int stop_index;
    char errmsg[256];
    int refs;
    unsigned long gen;       /* bumped on every push / finish; a root's also on those of its other requests */

    atomic_int cancel;       /* set by the HTTP side: client gone */
} srv_req;

srv_req *srv_req_new(srv_api api); /* refs = 1 (the caller's) */
/* Choice j > 0 of the leader r (n > 1): a copy of everything the HTTP side set, index r's + j, seed r's + j (so a
 * seeded choice j draws what the request with seed + j alone would), lead = r (referenced). NULL: out of memory. */
srv_req *srv_req_clone(srv_req *r, int j);
/* The leader of r's extra prompt k (completions with a list of prompts): r's settings with that prompt, its choices'
 * indices from (k + 1) n. NULL: out of memory. */
srv_req *srv_req_for_prompt(srv_req *r, int k);
void srv_req_release(srv_req *r);  /* drops one reference; frees on the last */

/* ---- metrics (metrics.c) ---- */

typedef enum srv_ep {
    SRV_EP_CHAT = 0, SRV_EP_COMPLETIONS, SRV_EP_MESSAGES, SRV_EP_MODELS, SRV_EP_HEALTH, SRV_EP_METRICS,
    SRV_EP_TOKENIZE, SRV_EP_DETOKENIZE, SRV_EP_RESPONSES, SRV_EP_COUNT_TOKENS, SRV_EP_OTHER, SRV_EP_COUNT
} srv_ep;

void srv_metrics_init(void);
void srv_metrics_request(srv_ep ep, int status);
void srv_metrics_tokens(long prompt, long generated);
void srv_metrics_ttft(double s);
void srv_metrics_tpot(double s);
void srv_metrics_e2e(double s);
void srv_metrics_finish(srv_finish f);
void srv_metrics_step(int ntok);
void srv_metrics_prefix(long tokens); /* a request started from the prefix cache, skipping this many prompt tokens */
/* Prometheus text exposition (malloc'd). */
struct srv_sched;
char *srv_metrics_render(struct srv_sched *S, size_t *len);

/* ---- scheduler (sched.c) ---- */

typedef struct srv_sched srv_sched;

srv_sched *srv_sched_new(dsv4_model *m, const dsv4_tok *tok, const srv_config *cfg, char *err, size_t errcap);
/* Queues r[0..n) for the engine (a reference each): one request, or a leader and its other choices (srv_req_clone),
 * admitted together; the prompt is fed once and the others start from a copy of its state. 0, or an HTTP status (503
 * queue full / shutting down, 400 too large for the KV budget or the sequences) with a message in err. */
int srv_sched_submit(srv_sched *S, srv_req **r, int n, char *err, size_t errcap);
/* Stops taking requests; waits up to timeout_s for running / queued requests to finish, then cancels
 * what is left. Returns the number cancelled. */
int srv_sched_drain(srv_sched *S, double timeout_s);
void srv_sched_free(srv_sched *S); /* cancels everything, joins the engine thread */
void srv_sched_stats(srv_sched *S, int *running, int *waiting, long *kv_used, long *kv_reserved, long *kv_cap);

/* ---- the server (http.c) ---- */

typedef struct srv_ctx {
    srv_config cfg;
    dsv4_model *model;
    dsv4_info info;
    dsv4_tok *tok;
    int tok_vocab;
    srv_sched *sched;
    struct MHD_Daemon *daemon;
    atomic_int draining;
    atomic_int active; /* requests being handled */
    atomic_ulong next_id;
} srv_ctx;

/* Starts listening; 0 or -1 (message printed). */
int srv_http_start(srv_ctx *S);
/* SIGTERM path: stop accepting, drain, stop. */
void srv_http_stop(srv_ctx *S);

double srv_now(void);

/* ---- request parsing / response formatting (openai.c, anthropic.c) ---- */

/* Error result of a parser: HTTP status + message. */
typedef struct srv_error {
    int status;
    const char *type; /* NULL: derived from status */
    char msg[1024];
} srv_error;

int srv_fail(srv_error *e, int status, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* Builds r (prompt tokens, sampling, mode...) from an OpenAI chat / completions or Anthropic messages
 * body. 0, or -1 with e set. */
int srv_openai_parse_chat(srv_ctx *S, const cJSON *body, srv_req *r, srv_error *e);
/* A chat body's prompt only (messages, thinking mode, tools, tool_choice, response_format): r->prompt, mode, force. */
int srv_openai_chat_prompt(srv_ctx *S, const cJSON *body, srv_req *r, srv_error *e);
int srv_openai_parse_completion(srv_ctx *S, const cJSON *body, srv_req *r, srv_error *e);
int srv_anthropic_parse(srv_ctx *S, const cJSON *body, srv_req *r, srv_error *e);
/* A Messages body's prompt only (system, messages, thinking, tools, tool_choice, sampling): no max_tokens, no
 * context check (count_tokens). */
int srv_anthropic_prompt(srv_ctx *S, const cJSON *body, srv_req *r, srv_error *e);
/* Shared by both: prompt text -> tokens; the context check and sampling validation (srv_finalize_sampling). */
int srv_tokenize_prompt(srv_ctx *S, srv_req *r, const char *text, size_t len, int add_bos, srv_error *e);
/* the tokens of a prompt text (malloc'd, *n_out of them), or NULL with e set */
int32_t *srv_encode_prompt(srv_ctx *S, const char *text, size_t len, int add_bos, size_t *n_out, srv_error *e);
int srv_finalize_sampling(srv_ctx *S, srv_req *r, int max_tokens, srv_error *e);
/* A chat prompt: renders messages (+ tools) in the given mode and tokenizes. */
/* tool_choice "required" (name NULL) or a named function: the answer is made to open a DSML tool
 * call (for a name, up to the invoke tag) by feeding those tokens instead of sampled ones. */
int srv_force_tool_call(srv_ctx *S, srv_req *r, const char *name, srv_error *e);
int srv_render_chat(srv_ctx *S, srv_req *r, const cJSON *messages, const cJSON *tools, dsv4_chat_effort effort,
                    srv_error *e);

/* Parameter readers (openai.c): 1 present and valid (*out set), 0 absent or null, -1 invalid (e set). */
int srv_get_num(const cJSON *o, const char *k, double lo, double hi, double *out, srv_error *e);
int srv_get_int(const cJSON *o, const char *k, long lo, long hi, long *out, srv_error *e);
int srv_get_bool(const cJSON *o, const char *k, int *out, srv_error *e);
int srv_get_stops(const cJSON *o, const char *k, srv_req *r, srv_error *e);
/* v as a token id in [0, lim): the id, or -1 (not an integer number in that range) */
long srv_token_id(const cJSON *v, long lim);
/* temperature (<= max_temp), top_p, top_k, min_p, penalties, seed, stop strings (key stop_key). */
int srv_parse_sampling(const cJSON *b, srv_req *r, double max_temp, const char *stop_key, srv_error *e);
/* "model": must be the served name (404 otherwise); sets r->model. */
int srv_check_model(srv_ctx *S, const cJSON *b, srv_req *r, int required, srv_error *e);

/* vLLM's /tokenize and /detokenize (tokenize.c): the response body, or NULL with e set. */
char *srv_tokenize_body(srv_ctx *S, const cJSON *body, size_t *len, srv_error *e);
char *srv_detokenize_body(srv_ctx *S, const cJSON *body, size_t *len, srv_error *e);
/* Anthropic's POST /v1/messages/count_tokens: {"input_tokens": N} of a Messages body (max_tokens not needed). */
char *srv_count_tokens_body(srv_ctx *S, const cJSON *body, size_t *len, srv_error *e);

/* OpenAI's Responses API (responses.c): the request as a chat request (r->api SRV_API_RESPONSES); its output functions
 * are with the other formatters below. */
int srv_responses_parse(srv_ctx *S, const cJSON *body, srv_req *r, srv_error *e);

/* Error bodies. */
char *srv_openai_error_body(const srv_error *e);
char *srv_anthropic_error_body(const srv_error *e);

/* The consumer side of a request: drains srv_req output into JSON / SSE bytes. */
typedef struct srv_out {
    srv_ctx *S;
    srv_req *r;
    dsv4_chat_parser *parser;
    dsv4_sb sse;            /* SSE bytes not yet sent */
    size_t sse_off;
    size_t text_off, lp_off; /* consumed from r->text / r->lps */
    dsv4_sb raw;            /* completions: the whole text */
    srv_lp *lps;            /* copies of the records consumed (non-stream) or pending (stream) */
    size_t n_lps, cap_lps;
    int n_gen;
    srv_finish finish;
    int stop_index;
    char errmsg[256];
    int started, ended;
    int echoed;             /* completions with echo: the prompt's text went out (first) */
    const srv_lp *pl;       /* echo: the prompt's records, put before o->lps by the next completions logprobs object */
    int n_pl;
    size_t text_total;      /* bytes of text streamed so far (the next chunk's text_offset) */
    int multi;              /* one of n > 1 choices: the stream's usage and [DONE] come after all (srv_openai_stream_tail) */
    int n_tools;
    int oom;
    /* Anthropic streaming: the open content block */
    int blk_index, blk_open; /* blk_open: 0 none, 1 thinking, 2 text (Responses: the output item's index and kind) */
    int seq, n_msg;          /* Responses streaming: the next sequence_number; a message item was opened; */
    dsv4_sb item_text;       /* the open item's text so far; */
    cJSON *items;            /* the items done so far (the final response's output) */
    char tool_prefix[32];
} srv_out;

int srv_out_init(srv_out *o, srv_ctx *S, srv_req *r);
void srv_out_free(srv_out *o);
/* Moves everything the engine produced into o (parser deltas -> SSE when streaming). Returns 1 when the
 * request is finished (and, streaming, the final events were appended). */
int srv_out_pump(srv_out *o);

/* API formatters, called from srv_out_pump. */
void srv_openai_stream_start(srv_out *o);
void srv_openai_stream_delta(srv_out *o, const dsv4_chat_delta *d);
void srv_openai_stream_text(srv_out *o, const char *t, size_t n); /* completions */
void srv_openai_stream_end(srv_out *o);
/* n > 1 choices o[0..n), all ended: the usage chunk (when asked) and [DONE], appended to o[n - 1].sse (a reader sends
 * the buffers in index order, each whole: so after every choice's last events) */
void srv_openai_stream_tail(srv_out *o, int n);
/* the response of n >= 1 choices (o[i] of choice i) */
char *srv_openai_body(srv_out *o, int n, size_t *len);
void srv_anthropic_stream_start(srv_out *o);
void srv_anthropic_stream_delta(srv_out *o, const dsv4_chat_delta *d);
void srv_anthropic_stream_end(srv_out *o);
char *srv_anthropic_body(srv_out *o, size_t *len);
char *srv_responses_body(srv_out *o, size_t *len);
void srv_responses_stream_start(srv_out *o);
void srv_responses_stream_delta(srv_out *o, const dsv4_chat_delta *d);
void srv_responses_stream_end(srv_out *o);

/* Helpers. */
void srv_sse(dsv4_sb *b, const char *event, cJSON *data); /* deletes data */
void srv_random_hex(char *out, int n);                    /* n hex digits + NUL */
const char *srv_stop_string(const srv_req *r, int idx);
char *srv_json_print(cJSON *j, size_t *len);              /* deletes j; NULL when out of memory */
cJSON *srv_tool_calls_json(srv_out *o, const dsv4_chat_parsed *m);
/* {"content": [...]} style logprob entries for the tokens in o->lps (OpenAI chat format). */
cJSON *srv_openai_lp_content(srv_out *o);

#endif
