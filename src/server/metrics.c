/* metrics.c - server counters and histograms, exposed at GET /metrics in the Prometheus text format.
 * Process-wide (one server per process); every update takes one mutex, which is cheap next to a
 * forward step. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "server.h"

#define NB 14
static const double ttft_b[NB] = {0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 40, 80, 160};
static const double tpot_b[NB] = {0.005, 0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 1, 2.5, 5};
static const double e2e_b[NB] = {0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 40, 60, 120, 300, 600, 1200};

typedef struct {
    const double *b;
    unsigned long n[NB + 1];
    double sum;
    unsigned long count;
} hist;

static const int codes[] = {200, 400, 401, 404, 405, 413, 500, 503};
#define NCODES ((int)(sizeof codes / sizeof codes[0]))
static const char *ep_names[SRV_EP_COUNT] = {"/v1/chat/completions", "/v1/completions", "/v1/messages", "/v1/models",
                                             "/health", "/metrics", "/tokenize", "/detokenize", "/v1/responses", "/v1/messages/count_tokens", "other"};
static const char *fin_names[] = {"none", "eos", "stop", "length", "abort", "error"};

static struct {
    pthread_mutex_t mu;
    unsigned long req[SRV_EP_COUNT][NCODES + 1];
    unsigned long prompt_tokens, gen_tokens, steps, step_tokens, prefix_hits, prefix_tokens;
    unsigned long fin[6];
    hist ttft, tpot, e2e;
} M = {.mu = PTHREAD_MUTEX_INITIALIZER};

void srv_metrics_init(void) {
    pthread_mutex_lock(&M.mu);
    memset(M.req, 0, sizeof M.req);
    M.prompt_tokens = M.gen_tokens = M.steps = M.step_tokens = 0;
    memset(M.fin, 0, sizeof M.fin);
    memset(&M.ttft, 0, sizeof M.ttft);
    memset(&M.tpot, 0, sizeof M.tpot);
    memset(&M.e2e, 0, sizeof M.e2e);
    M.ttft.b = ttft_b;
    M.tpot.b = tpot_b;
    M.e2e.b = e2e_b;
    pthread_mutex_unlock(&M.mu);
}

void srv_metrics_request(srv_ep ep, int status) {
    if ((int)ep < 0 || ep >= SRV_EP_COUNT) ep = SRV_EP_OTHER;
    int k = NCODES;
    for (int i = 0; i < NCODES; i++)
        if (codes[i] == status) k = i;
    pthread_mutex_lock(&M.mu);
    M.req[ep][k]++;
    pthread_mutex_unlock(&M.mu);
}

void srv_metrics_tokens(long prompt, long generated) {
    pthread_mutex_lock(&M.mu);
    M.prompt_tokens += (unsigned long)prompt;
    M.gen_tokens += (unsigned long)generated;
    pthread_mutex_unlock(&M.mu);
}

void srv_metrics_prefix(long tokens) {
    pthread_mutex_lock(&M.mu);
    M.prefix_hits++;
    M.prefix_tokens += (unsigned long)tokens;
    pthread_mutex_unlock(&M.mu);
}

static void observe(hist *h, double v) {
    pthread_mutex_lock(&M.mu);
    int i = 0;
    while (i < NB && v > h->b[i]) i++;
    h->n[i]++;
    h->sum += v;
    h->count++;
    pthread_mutex_unlock(&M.mu);
}

void srv_metrics_ttft(double s) { observe(&M.ttft, s); }
void srv_metrics_tpot(double s) { observe(&M.tpot, s); }
void srv_metrics_e2e(double s) { observe(&M.e2e, s); }

void srv_metrics_finish(srv_finish f) {
    if ((int)f < 0 || f > SRV_FIN_ERROR) return;
    pthread_mutex_lock(&M.mu);
    M.fin[f]++;
    pthread_mutex_unlock(&M.mu);
}

void srv_metrics_step(int ntok) {
    pthread_mutex_lock(&M.mu);
    M.steps++;
    M.step_tokens += (unsigned long)ntok;
    pthread_mutex_unlock(&M.mu);
}

static void put_hist(dsv4_sb *b, const char *name, const char *help, const hist *h) {
    dsv4_sb_printf(b, "# HELP %s %s\n# TYPE %s histogram\n", name, help, name);
    unsigned long cum = 0;
    for (int i = 0; i < NB; i++) {
        cum += h->n[i];
        dsv4_sb_printf(b, "%s_bucket{le=\"%g\"} %lu\n", name, h->b[i], cum);
    }
    cum += h->n[NB];
    dsv4_sb_printf(b, "%s_bucket{le=\"+Inf\"} %lu\n%s_sum %.6f\n%s_count %lu\n", name, cum, name, h->sum, name,
                   h->count);
}

static void put_metric(dsv4_sb *b, const char *name, const char *type, const char *help, double v) {
    dsv4_sb_printf(b, "# HELP %s %s\n# TYPE %s %s\n%s %.17g\n", name, help, name, type, name, v);
}

char *srv_metrics_render(srv_sched *S, size_t *len) {
    int running = 0, waiting = 0;
    long kv_used = 0, kv_res = 0, kv_cap = 1;
    if (S) srv_sched_stats(S, &running, &waiting, &kv_used, &kv_res, &kv_cap);
    dsv4_sb b = {0};
    pthread_mutex_lock(&M.mu);
    dsv4_sb_puts(&b, "# HELP dsv4_requests_total HTTP requests answered, by endpoint and status.\n"
                     "# TYPE dsv4_requests_total counter\n");
    for (int e = 0; e < SRV_EP_COUNT; e++)
        for (int k = 0; k <= NCODES; k++) {
            if (!M.req[e][k]) continue;
            char code[16] = "other";
            if (k < NCODES) snprintf(code, sizeof code, "%d", codes[k]);
            dsv4_sb_printf(&b, "dsv4_requests_total{endpoint=\"%s\",status=\"%s\"} %lu\n", ep_names[e], code,
                           M.req[e][k]);
        }
    dsv4_sb_puts(&b, "# HELP dsv4_request_finish_total Generation requests finished, by reason.\n"
                     "# TYPE dsv4_request_finish_total counter\n");
    for (int f = 1; f <= SRV_FIN_ERROR; f++)
        dsv4_sb_printf(&b, "dsv4_request_finish_total{reason=\"%s\"} %lu\n", fin_names[f], M.fin[f]);
    put_metric(&b, "dsv4_prompt_tokens_total", "counter", "Prompt tokens processed.", (double)M.prompt_tokens);
    put_metric(&b, "dsv4_generation_tokens_total", "counter", "Tokens generated.", (double)M.gen_tokens);
    put_metric(&b, "dsv4_prefix_cache_hits_total", "counter", "Requests that started from a cached prompt's state.",
               (double)M.prefix_hits);
    put_metric(&b, "dsv4_prefix_cache_tokens_total", "counter", "Prompt tokens taken from the prefix cache (not computed).",
               (double)M.prefix_tokens);
    put_metric(&b, "dsv4_engine_steps_total", "counter", "Engine steps (forward calls).", (double)M.steps);
    put_metric(&b, "dsv4_engine_step_tokens_total", "counter", "Tokens fed over all engine steps.",
               (double)M.step_tokens);
    put_hist(&b, "dsv4_time_to_first_token_seconds", "Time from submission to the first generated token.", &M.ttft);
    put_hist(&b, "dsv4_time_per_output_token_seconds", "Time between two generated tokens of a request.", &M.tpot);
    put_hist(&b, "dsv4_e2e_request_latency_seconds", "Time from submission to the end of generation.", &M.e2e);
    pthread_mutex_unlock(&M.mu);
    put_metric(&b, "dsv4_num_requests_running", "gauge", "Sequences in the running batch.", running);
    put_metric(&b, "dsv4_num_requests_waiting", "gauge", "Requests waiting for admission.", waiting);
    put_metric(&b, "dsv4_kv_cache_tokens_used", "gauge", "Tokens held by running sequences.", (double)kv_used);
    put_metric(&b, "dsv4_kv_cache_tokens_reserved", "gauge", "Tokens reserved (prompt + max_tokens) by running sequences.",
               (double)kv_res);
    put_metric(&b, "dsv4_kv_cache_tokens_capacity", "gauge", "KV budget in tokens.", (double)kv_cap);
    put_metric(&b, "dsv4_kv_cache_usage_ratio", "gauge", "Reserved KV tokens / capacity.",
               kv_cap > 0 ? (double)kv_res / (double)kv_cap : 0);
    return dsv4_sb_take(&b, len);
}
