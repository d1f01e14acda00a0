/* cmd_serve.c - `dsv4 serve`: loads the model and tokenizer, starts the engine thread and the HTTP server
 * (src/server/), then waits for SIGTERM / SIGINT and drains in-flight requests before exiting. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli_util.h"
#include "cmds.h"
#include "server/server.h"

static void usage(FILE *f) {
    fprintf(f,
            "usage: dsv4 serve -m MODEL_DIR [options]\n"
            "\n"
            "  OpenAI- and Anthropic-compatible HTTP server with continuous batching:\n"
            "  POST /v1/chat/completions, POST /v1/completions, POST /v1/responses (stateless), POST /v1/messages,\n"
            "  POST /v1/messages/count_tokens, GET /v1/models, POST /tokenize, POST /detokenize, GET /health,\n"
            "  GET /metrics (Prometheus).\n"
            "  SIGTERM drains in-flight requests and exits.\n"
            "\n"
            "  --host ADDR             numeric address to bind (default 127.0.0.1)\n"
            "  --port N                TCP port (default 8000; 0 = any free port, printed at startup)\n"
            "  --api-key KEY           require Authorization: Bearer KEY (or x-api-key: KEY)\n"
            "                          (default: $DSV4_API_KEY if set)\n"
            "  --served-model-name S   the model id clients use (default: the model directory's name)\n"
            "  --device cpu|cuda       backend (cuda: builds made with make CUDA=1)\n"
            "  --max-seqs N            sequences decoding at once (default: cpu 16; cuda 256); on the GPU never\n"
            "                          more than its memory holds at --max-context\n"
            "  --max-context T         tokens per sequence, prompt + output (default: the model's)\n"
            "  --max-queue N           requests waiting for a slot before 503 (default 256)\n"
            "  --kv-tokens N           KV budget over running sequences, in tokens (default max-seqs * context)\n"
            "  --step-tokens N         tokens per engine step (default: cpu 512; cuda 8192, or the rows of one\n"
            "                          GPU pass if fewer)\n"
            "  --prefill-chunk N       prompt tokens per chunk (default: cpu 256; cuda --step-tokens)\n"
            "  --prefix-cache N        keep the states of the last N prompts (of 16+ tokens); a prompt that extends one\n"
            "                          (a chat's next turn) starts from it (default: cpu 0; cuda 32, fewer if the GPU's\n"
            "                          memory is short; each is one sequence's state)\n"
            "  --max-body BYTES        request body limit (default 8388608)\n"
            "  --timeout S             idle / slow-client timeout in seconds (default 60)\n"
            "  --drain-timeout S       SIGTERM: seconds in-flight requests may still run (default 30)\n"
            "  --max-connections N     (default 512)\n"
            "  --thinking              thinking mode for requests that do not choose (default: chat mode)\n"
            "  --threads N             CPU threads for the forward pass (default: all cores)\n"
            "  -v, --verbose           log every request\n");
}

/* The batch sizes a device runs well unless the command line chose: the CPU engine's step is a few hundred tokens;
 * a GPU's (vLLM's and SGLang's defaults on Hopper) up to 8192 tokens in one pass, 256 sequences, a prompt chunk the
 * whole step, and no more sequences than its memory holds at the context capacity. */
static void serve_sizes(const dsv4_model *m, srv_config *c, int set_seqs, int set_step, int set_chunk, int set_pc) {
    int rows = 0;
    long fit = -1;
    if (dsv4_device_limits(m, &rows, &fit)) rows = 0, fit = -1;
    if (rows > 0) { /* a GPU */
        if (!set_step) c->step_tokens = rows < 8192 ? rows : 8192;
        if (!set_chunk) c->prefill_chunk = c->step_tokens;
        if (!set_seqs) c->max_seqs = 256;
        if (!set_pc) c->prefix_cache = 32;
    }
    if (fit >= 0 && !set_pc && set_seqs && c->prefix_cache > fit - c->max_seqs) /* the given --max-seqs first */
        c->prefix_cache = fit > c->max_seqs ? (int)(fit - c->max_seqs) : 0;
    if (fit >= 0 && c->prefix_cache > fit / 4) { /* cached prompts: at most a quarter of the room */
        if (set_pc)
            fprintf(stderr, "dsv4 serve: --prefix-cache %d: the device's memory holds %ld sequence(s): %ld cached prompts\n",
                    c->prefix_cache, fit, fit / 4);
        c->prefix_cache = (int)(fit / 4);
    }
    if (fit >= 0) fit -= c->prefix_cache;
    if (fit >= 0 && c->max_seqs > fit) {
        const int n = fit > 0 ? (int)fit : 1;
        fprintf(stderr, "dsv4 serve: the device's memory holds %ld more sequence(s) of %d positions%s: max %d sequences\n", fit,
                dsv4_model_info(m).max_context, set_seqs ? " (fewer than --max-seqs)" : "", n);
        c->max_seqs = n;
    }
    if (c->prefill_chunk > c->step_tokens) c->prefill_chunk = c->step_tokens;
}

int dsv4_cmd_serve(int argc, char **argv) {
    srv_ctx S;
    memset(&S, 0, sizeof S);
    srv_config *c = &S.cfg;
    c->host = "127.0.0.1";
    c->port = 8000;
    c->max_seqs = 16;
    c->max_queue = 256;
    c->step_tokens = 512;
    c->prefill_chunk = 256;
    c->max_body = 8u << 20;
    c->timeout_s = 60;
    c->drain_s = 30;
    c->max_conns = 512;
    c->api_key = getenv("DSV4_API_KEY");
    if (c->api_key && !*c->api_key) c->api_key = NULL;
    long max_ctx = 0, kv = 0, threads = 0;
    int set_seqs = 0, set_step = 0, set_chunk = 0, set_pc = 0; /* given on the command line (else the device's defaults) */
    const char *device = "cpu";
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            return 0;
        }
        if (!strcmp(a, "--thinking")) { c->default_thinking = 1; continue; }
        if (!strcmp(a, "-v") || !strcmp(a, "--verbose")) { c->verbose = 1; continue; }
        if (i + 1 >= argc) {
            fprintf(stderr, "dsv4 serve: option %s needs a value (or unknown option)\n", a);
            return 2;
        }
        const char *v = argv[++i];
        long x = 0;
        int bad = 0;
#define NUM(lo, hi) (bad = dsv4_cli_parse_long(v, lo, hi, &x), x)
        if (!strcmp(a, "-m") || !strcmp(a, "--model")) c->model_dir = v;
        else if (!strcmp(a, "--host")) c->host = v;
        else if (!strcmp(a, "--api-key")) c->api_key = *v ? v : NULL;
        else if (!strcmp(a, "--served-model-name")) c->model_name = v;
        else if (!strcmp(a, "--device")) device = v;
        else if (!strcmp(a, "--port")) c->port = (int)NUM(0, 65535);
        else if (!strcmp(a, "--max-seqs")) c->max_seqs = (int)NUM(1, 4096), set_seqs = 1;
        else if (!strcmp(a, "--max-context")) max_ctx = NUM(2, 1L << 30);
        else if (!strcmp(a, "--max-queue")) c->max_queue = (int)NUM(1, 1 << 20);
        else if (!strcmp(a, "--kv-tokens")) kv = NUM(2, 1L << 40);
        else if (!strcmp(a, "--step-tokens")) c->step_tokens = (int)NUM(1, 1 << 20), set_step = 1;
        else if (!strcmp(a, "--prefill-chunk")) c->prefill_chunk = (int)NUM(1, 1 << 20), set_chunk = 1;
        else if (!strcmp(a, "--prefix-cache")) c->prefix_cache = (int)NUM(0, 1 << 16), set_pc = 1;
        else if (!strcmp(a, "--max-body")) c->max_body = (size_t)NUM(1024, 1L << 32);
        else if (!strcmp(a, "--timeout")) c->timeout_s = (int)NUM(1, 86400);
        else if (!strcmp(a, "--drain-timeout")) c->drain_s = (int)NUM(0, 86400);
        else if (!strcmp(a, "--max-connections")) c->max_conns = (int)NUM(1, 1 << 16);
        else if (!strcmp(a, "--threads")) threads = NUM(1, 4096);
        else {
            fprintf(stderr, "dsv4 serve: unknown option '%s'\n", a);
            usage(stderr);
            return 2;
        }
#undef NUM
        if (bad) {
            fprintf(stderr, "dsv4 serve: %s: bad value '%s'\n", a, v);
            return 2;
        }
    }
    if (!c->model_dir) {
        fprintf(stderr, "dsv4 serve: -m MODEL_DIR is required\n");
        usage(stderr);
        return 2;
    }
    if (strcmp(device, "cpu") && strcmp(device, "cuda")) {
        fprintf(stderr, "dsv4 serve: --device %s: expected cpu or cuda\n", device);
        return 2;
    }
    /* signals: every thread started below inherits this mask; the main thread takes them with sigwait */
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGINT);
    pthread_sigmask(SIG_BLOCK, &set, NULL);
    signal(SIGPIPE, SIG_IGN);
    dsv4_cli_set_threads((int)threads);

    char err[1024];
    char name[256];
    int rc = 1;
    double t0 = dsv4_cli_now();
    if (dsv4_load(c->model_dir, &S.model, err, sizeof err)) {
        fprintf(stderr, "dsv4 serve: %s\n", err);
        return 1;
    }
    /* --max-context is also the per-sequence capacity the GPU allocates (it defaults to 16384 there) */
    const long maxpos = dsv4_model_info(S.model).max_context;
    if (max_ctx > 0 && dsv4_set_max_context(S.model, (int)(max_ctx < maxpos ? max_ctx : maxpos), err, sizeof err)) {
        fprintf(stderr, "dsv4 serve: --max-context: %s\n", err);
        dsv4_free(S.model);
        return 1;
    }
    if (dsv4_set_device(S.model, device, err, sizeof err)) {
        fprintf(stderr, "dsv4 serve: --device %s: %s\n", device, err);
        dsv4_free(S.model);
        return 1;
    }
    S.info = dsv4_model_info(S.model);
    serve_sizes(S.model, c, set_seqs, set_step, set_chunk, set_pc);
    char tpath[4096];
    snprintf(tpath, sizeof tpath, "%s/tokenizer.json", c->model_dir);
    dsv4_err e = {{0}};
    if (!(S.tok = dsv4_tok_load(tpath, &e))) {
        fprintf(stderr, "dsv4 serve: %s\n", e.msg);
        goto done;
    }
    S.tok_vocab = dsv4_tok_vocab_size(S.tok);
    if (S.tok_vocab > S.info.vocab_size) S.tok_vocab = S.info.vocab_size;
    c->max_context = max_ctx > 0 && max_ctx < S.info.max_context ? (int)max_ctx : S.info.max_context;
    c->kv_tokens = kv > 0 ? kv : (long)c->max_seqs * c->max_context;
    if (!c->model_name) {
        size_t l = strlen(c->model_dir);
        while (l > 1 && c->model_dir[l - 1] == '/') l--;
        size_t s = l;
        while (s > 0 && c->model_dir[s - 1] != '/') s--;
        snprintf(name, sizeof name, "%.*s", (int)(l - s), c->model_dir + s);
        c->model_name = name;
    }
    srv_metrics_init();
    if (!(S.sched = srv_sched_new(S.model, S.tok, c, err, sizeof err))) {
        fprintf(stderr, "dsv4 serve: %s\n", err);
        goto done;
    }
    if (srv_http_start(&S)) goto done;
    fprintf(stderr,
            "dsv4 serve: model '%s' loaded in %.2f s (%d layers, dim %d, context %d); max %d sequences, KV budget %ld "
            "tokens, %d tokens a step, prompt chunks of %d, %d cached prompts%s\n",
            c->model_name, dsv4_cli_now() - t0, S.info.n_layers, S.info.dim, c->max_context, c->max_seqs, c->kv_tokens,
            c->step_tokens, c->prefill_chunk, c->prefix_cache, c->api_key ? ", API key required" : "");
    fprintf(stderr, "dsv4 serve: listening on http://%s%s%s:%d\n", strchr(c->host, ':') ? "[" : "", c->host,
            strchr(c->host, ':') ? "]" : "", c->port);
    fflush(stderr);
    int sig = 0;
    while (sigwait(&set, &sig) != 0) {
    }
    fprintf(stderr, "dsv4 serve: %s: draining in-flight requests (up to %d s)\n", sig == SIGTERM ? "SIGTERM" : "SIGINT",
            c->drain_s);
    srv_http_stop(&S);
    fprintf(stderr, "dsv4 serve: stopped\n");
    rc = 0;
done:
    srv_sched_free(S.sched);
    dsv4_tok_free(S.tok);
    dsv4_free(S.model);
    return rc;
}
