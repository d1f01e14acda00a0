/* sched.c - the engine thread: continuous batching over every running request.
 *
 * One loop, one thread, owning every dsv4_seq, sampler and detokenizer:
 *   1. admission: waiting requests (FIFO) become running while fewer than max_seqs run and the KV budget
 *      (prompt + max_tokens tokens reserved per request) has room;
 *   2. cancelled requests (client gone, shutdown) are finished and their sequence freed;
 *   3. the batch: one token for every decoding request, then prompt chunks of prefilling requests in
 *      admission order while the step's token budget lasts (at least one chunk per step, so a prompt
 *      always progresses). A chunk is always min(prefill_chunk, rest of the prompt or up to the prefix
 *      cache's cut), whatever else is in the batch, so a request is computed the same way under any load;
 *   4. one dsv4_forward call (LOGITS_LAST), then each request that finished its prompt or decoded a
 *      token samples with its own sampler (seeded Philox: depends on seed + step only), detokenizes,
 *      scans stop strings and appends the text it may emit to its output queue. On the GPU, a step of at
 *      most dsv4_decode_sample_max sequences none of whose requests needs the host's logits (logprobs),
 *      token history (penalties) or a forced tool-call opening samples on the device instead (the same algorithm and draw; only the ids come
 *      back): a step of decodes with dsv4_decode_sample (inside the step's CUDA graphs), a step with
 *      prompt chunks with dsv4_forward_sample.
 * A request of n > 1 choices (OpenAI's n) queues as n requests admitted together: the leader (choice 0) feeds its
 * prompt up to its last token, the other choices start from copies of that state (dsv4_seq_fork), and each then feeds
 * the last prompt token itself and samples with its own seed (the leader's + its index), so choice i is what the same
 * request alone with that seed gives on the CPU.
 * Completions with several prompts queue a choice set per prompt, in order. A request whose prompt must be scored
 * (echo with logprobs) feeds its prompt rows in a forward of their own with every row's logits (step_all_logits) and
 * records each prompt token's logprob; with max_tokens 0 it ends there. min_tokens masks the end-of-sequence token and
 * stop_token_ids in the host's draws until that many tokens are out.
 * With a prefix cache (srv_config.prefix_cache), a prompt's state is kept right after its last token, and a
 * later prompt that extends a kept one (a chat's next turn) starts from a copy of it and feeds the rest; a
 * prompt that shares a longer prefix with a kept one (a system prompt) ends a chunk there and keeps that
 * state too, for the conversations after it. A kept state's tokens were computed as a prompt that ended
 * there (dsv4_seq_set_prefill): the indexer's top-k ranked shorter lists than a one-shot prefill of the
 * longer prompt would, which changes the order of exactly tied scores only (a score is 0 where every
 * indexer head's ReLU is: ~1/16 of the entries with the synthetic models' 4 heads, rare with the real
 * models' 64); the attention then sums those keys in another order.
 * On the CPU a sequence's logits do not depend on the rest of the batch, so a seeded request returns the
 * same text whatever runs beside it; with the prefix cache (off by default there) it may depend on what
 * ran before it, through those ties. On the GPU that holds for steps of decodes only (decode steps are
 * batch invariant); a decode row inside a step with prompt chunks runs on the prompt pass's kernels, and
 * those passes' FP8 GEMMs take cuBLASLt algorithms by the pass's size, so under load a seeded request's
 * text may differ from the same request alone (bench/NOTES.md "Session 31"). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "server.h"

typedef struct slot {
    srv_req *r;
    dsv4_seq *seq;
    dsv4_sampler *smp;
    dsv4_tok_stream *ts;
    int n_fed;            /* prompt tokens fed */
    int32_t last;         /* the token to feed next (decoding) */
    int n_gen;
    dsv4_sb text;         /* generated text (for the stop-string scan) */
    size_t safe, prev;    /* text.p[0..safe) was pushed to the request; prev: text.n at the last scan */
    double t_last;
    long reserve;
    int chunk;            /* tokens in the current batch */
    int n_forced;         /* forced tokens (srv_req.force) fed so far */
    int forcing;          /* feeding forced tokens instead of sampling */
    int n_cached;         /* prompt tokens taken from the prefix cache */
    int cut;              /* > n_fed: a chunk ends there and the state is kept (a prefix shared with a kept prompt) */
    int fork_at;          /* the leader of n > 1 choices: a chunk ends there (n_prompt - 1) and the others fork */
    int n_forked;         /* another choice: prompt tokens taken from the leader's state */
    int orphan;           /* another choice whose fork failed: starts on its own (slot_adopt) */
    int echo_lp;          /* echo with logprobs: the prompt's rows go through step_all_logits (every row's logits) */
} slot;

/* A prompt's state kept for later prompts that extend it (a chat's next turn): the prompt's tokens and a copy of its
 * sequence right after them (dsv4_seq_fork; never fed). */
typedef struct pc_ent {
    int32_t *tok;
    int n;
    dsv4_seq *seq;
    unsigned long used; /* last use (least recently used goes first) */
} pc_ent;

struct srv_sched {
    dsv4_model *m;
    const dsv4_tok *tok;
    srv_config cfg;
    int V, tok_vocab, eos;
    pthread_t th;
    int started;
    pthread_mutex_t mu;
    pthread_cond_t cv;      /* engine wakeup */
    pthread_cond_t idle_cv; /* drain waits on it */
    srv_req **wait;         /* ring of waiting requests */
    int wait_head, wait_n, wait_cap;
    int stop, draining, cancel_all;
    /* engine-owned (read under mu for stats) */
    slot *slots;
    int n_slots;
    long kv_reserved, kv_used;
    float *logits;
    dsv4_seq **bseq;
    const int32_t **btok;
    int *bn, *bslot;
    int32_t *dtok, *dids;      /* device-sampled steps: the tokens fed, the ids drawn */
    dsv4_device_sampling *dsp; /* and the parameters of each sequence */
    int mixed_dev;             /* steps with prompt chunks sample on the device too (dsv4_forward_sample) */
    float *alogits;            /* step_all_logits' rows (ALL_ROWS x V, allocated on first use) */
    pc_ent *pc;                /* the prefix cache: cfg.prefix_cache entries at most */
    int n_pc;
    unsigned long pc_clock;
};

double srv_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* ---- requests ---- */

srv_req *srv_req_new(srv_api api) {
    srv_req *r = calloc(1, sizeof *r);
    if (!r) return NULL;
    r->api = api;
    r->n_choices = 1;
    r->refs = 1;
    r->stop_index = -1;
    pthread_mutex_init(&r->mu, NULL);
    pthread_cond_init(&r->cv, NULL);
    atomic_init(&r->cancel, 0);
    dsv4_sampling_defaults(&r->sp);
    return r;
}

void srv_req_release(srv_req *r) {
    if (!r) return;
    pthread_mutex_lock(&r->mu);
    int left = --r->refs;
    pthread_mutex_unlock(&r->mu);
    if (left > 0) return;
    pthread_mutex_destroy(&r->mu);
    pthread_cond_destroy(&r->cv);
    srv_req_release(r->lead);
    srv_req_release(r->root);
    free(r->model);
    free(r->prompt);
    free(r->force);
    free(r->bias_tok);
    free(r->bias_val);
    free(r->stop_ids);
    free(r->plps);
    for (int k = 0; k < r->n_more_prompts; k++) free(r->more[k]);
    free(r->more);
    free(r->n_more);
    free(r->more_max);
    cJSON_Delete(r->echo_fields);
    for (size_t i = 0; i < r->n_stop; i++) free(r->stops[i]);
    dsv4_sb_free(&r->text);
    free(r->lps);
    free(r);
}

static char *dup_or(const char *s, int *fail) {
    char *d = s ? strdup(s) : NULL;
    if (s && !d) *fail = 1;
    return d;
}

/* a copy of n items of `size` bytes (NULL for none); *fail set when out of memory */
static void *dup_arr(const void *src, size_t n, size_t size, int *fail) {
    if (!n) return NULL;
    void *d = malloc(n * size);
    if (d) memcpy(d, src, n * size);
    else *fail = 1;
    return d;
}

/* c's reference to r's root (r itself when r is one) */
static void req_set_root(srv_req *c, srv_req *r) {
    srv_req *root = r->root ? r->root : r;
    pthread_mutex_lock(&root->mu);
    root->refs++;
    pthread_mutex_unlock(&root->mu);
    c->root = root;
}

/* A copy of what the HTTP side set on r for another prompt (r's own or one of its extra prompts): no leader link, no
 * extra prompts, the engine's fields fresh. NULL: out of memory. */
static srv_req *req_copy(const srv_req *r, const int32_t *prompt, int n_prompt) {
    srv_req *c = srv_req_new(r->api);
    if (!c) return NULL;
    int fail = 0;
    c->stream = r->stream, c->include_usage = r->include_usage;
    memcpy(c->id, r->id, sizeof c->id);
    c->created = r->created;
    c->model = dup_or(r->model, &fail);
    c->prompt = dup_arr(prompt, (size_t)n_prompt, sizeof(int32_t), &fail);
    c->n_prompt = n_prompt;
    c->max_tokens = r->max_tokens;
    c->sp = r->sp;
    for (size_t i = 0; i < r->n_stop; i++) c->stops[i] = dup_or(r->stops[i], &fail);
    c->n_stop = r->n_stop;
    c->sp.stop = (const char *const *)c->stops;
    c->bias_tok = dup_arr(r->bias_tok, r->n_bias, sizeof(int32_t), &fail);
    c->bias_val = dup_arr(r->bias_val, r->n_bias, sizeof(float), &fail);
    c->n_bias = r->n_bias;
    c->stop_ids = dup_arr(r->stop_ids, (size_t)r->n_stop_ids, sizeof(int32_t), &fail);
    c->n_stop_ids = r->n_stop_ids;
    c->min_tokens = r->min_tokens;
    c->echo = r->echo;
    c->sp.bias_tok = c->bias_tok, c->sp.bias_val = c->bias_val, c->sp.n_bias = c->n_bias;
    c->chat = r->chat, c->mode = r->mode;
    c->logprobs = r->logprobs, c->top_logprobs = r->top_logprobs, c->want_tools = r->want_tools;
    c->force = dup_arr(r->force, (size_t)r->n_force, sizeof(int32_t), &fail);
    c->n_force = r->n_force;
    if (fail) {
        srv_req_release(c);
        return NULL;
    }
    return c;
}

srv_req *srv_req_clone(srv_req *r, int j) {
    srv_req *c = req_copy(r, r->prompt, r->n_prompt);
    if (!c) return NULL;
    c->sp.seed = r->sp.seed + (uint64_t)j;
    c->index = r->index + j;
    pthread_mutex_lock(&r->mu);
    r->refs++;
    pthread_mutex_unlock(&r->mu);
    c->lead = r;
    req_set_root(c, r);
    return c;
}

srv_req *srv_req_for_prompt(srv_req *r, int k) {
    srv_req *c = req_copy(r, r->more[k], r->n_more[k]);
    if (!c) return NULL;
    c->n_choices = r->n_choices;
    c->index = (k + 1) * r->n_choices;
    c->sp.seed = r->sp.seed + (uint64_t)c->index; /* every choice of the request: its seed + the choice's index */
    c->max_tokens = c->sp.max_tokens = r->more_max[k];
    req_set_root(c, r);
    return c;
}

/* A push or finish of r: wakes its waiters, and its root's (which a stream of several choices waits on). Called with
 * r->mu held; takes the root's mu after r's (the only nesting: a root's own mu is never held while taking another's). */
static void req_wake(srv_req *r) {
    r->gen++;
    pthread_cond_broadcast(&r->cv);
    if (r->root) {
        pthread_mutex_lock(&r->root->mu);
        r->root->gen++;
        pthread_cond_broadcast(&r->root->cv);
        pthread_mutex_unlock(&r->root->mu);
    }
}


/* Appends emitted text (and a logprob record) to the request's output. Engine thread. */
static int req_push(srv_req *r, const char *t, size_t n, const srv_lp *lp) {
    int rc = 0;
    pthread_mutex_lock(&r->mu);
    if (n && dsv4_sb_put(&r->text, t, n)) rc = -1;
    if (lp && !rc) {
        if (r->n_lp == r->cap_lp) {
            size_t cap = r->cap_lp ? r->cap_lp * 2 : 16;
            srv_lp *p = realloc(r->lps, cap * sizeof *p);
            if (!p) rc = -1;
            else {
                r->lps = p;
                r->cap_lp = cap;
            }
        }
        if (!rc) r->lps[r->n_lp++] = *lp;
    }
    req_wake(r);
    pthread_mutex_unlock(&r->mu);
    return rc;
}

static void req_finish(srv_req *r, srv_finish f, int stop_index, int n_gen, const char *err) {
    pthread_mutex_lock(&r->mu);
    if (!r->done) {
        r->done = 1;
        r->finish = f;
        r->stop_index = stop_index;
        r->n_gen = n_gen;
        if (err) snprintf(r->errmsg, sizeof r->errmsg, "%.255s", err);
    }
    req_wake(r);
    pthread_mutex_unlock(&r->mu);
}

/* ---- slots ---- */

static void slot_release(srv_sched *S, int i, srv_finish f, int stop_index, const char *err) {
    slot *s = &S->slots[i];
    srv_req *r = s->r;
    double now = srv_now();
    if (f != SRV_FIN_ERROR && f != SRV_FIN_ABORT) srv_metrics_e2e(now - r->t_submit);
    srv_metrics_finish(f);
    srv_metrics_tokens(0, s->n_gen);
    req_finish(r, f, stop_index, s->n_gen, err);
    dsv4_seq_free(s->seq);
    dsv4_sampler_free(s->smp);
    dsv4_tok_stream_free(s->ts);
    dsv4_sb_free(&s->text);
    pthread_mutex_lock(&S->mu);
    S->kv_reserved -= s->reserve;
    S->slots[i] = S->slots[--S->n_slots];
    if (!S->n_slots && !S->wait_n) pthread_cond_broadcast(&S->idle_cv);
    pthread_mutex_unlock(&S->mu);
    srv_req_release(r);
}

/* ---- the prefix cache ---- */

#define PC_MIN_TOKENS 16  /* shorter prompts are not kept: their prefill is a fraction of a step */
#define PC_MIN_SHARED 32  /* a prefix shared with a kept prompt (a system prompt) is kept from this many tokens */

/* the longest prefix prompt[0..n) shares with a kept prompt that is not the whole kept prompt (those are pc_find's) */
static int pc_shared(const srv_sched *S, const int32_t *prompt, int n) {
    int best = 0;
    for (int i = 0; i < S->n_pc; i++) {
        const pc_ent *e = &S->pc[i];
        int l = 0;
        while (l < e->n && l < n && e->tok[l] == prompt[l]) l++;
        if (l < e->n && l > best) best = l;
    }
    return best;
}

/* the entry whose prompt is the longest proper prefix of prompt[0..n) (a token at least is left to feed: its logits
 * are the first draw's), or -1 */
static int pc_find(const srv_sched *S, const int32_t *prompt, int n) {
    int best = -1;
    for (int i = 0; i < S->n_pc; i++) {
        const pc_ent *e = &S->pc[i];
        if (e->n < n && (best < 0 || e->n > S->pc[best].n) && !memcmp(e->tok, prompt, sizeof(int32_t) * (size_t)e->n))
            best = i;
    }
    return best;
}

/* Keeps a copy of seq, which has just been fed prompt[0..n): an entry of the same prompt is only marked used; else a
 * free entry, else the least recently used one's place (freed first: on the GPU its device state is then the one the
 * copy takes). Out of memory: nothing is kept. */
static void pc_put(srv_sched *S, const int32_t *prompt, int n, const dsv4_seq *seq) {
    if (S->cfg.prefix_cache <= 0 || n < PC_MIN_TOKENS) return;
    for (int i = 0; i < S->n_pc; i++)
        if (S->pc[i].n == n && !memcmp(S->pc[i].tok, prompt, sizeof(int32_t) * (size_t)n)) {
            S->pc[i].used = ++S->pc_clock;
            return;
        }
    int at = S->n_pc;
    if (at == S->cfg.prefix_cache) {
        at = 0;
        for (int i = 1; i < S->n_pc; i++)
            if (S->pc[i].used < S->pc[at].used) at = i;
        free(S->pc[at].tok);
        dsv4_seq_free(S->pc[at].seq);
        S->pc[at] = S->pc[--S->n_pc];
        at = S->n_pc;
    }
    int32_t *tok = malloc(sizeof(int32_t) * (size_t)n);
    dsv4_seq *c = tok ? dsv4_seq_fork(seq) : NULL;
    if (!c) {
        free(tok);
        return;
    }
    memcpy(tok, prompt, sizeof(int32_t) * (size_t)n);
    S->pc[S->n_pc++] = (pc_ent){tok, n, c, ++S->pc_clock};
}

/* the slot of choice r's leader, or -1 */
static int slot_of_lead(const srv_sched *S, const srv_req *r) {
    for (int k = 0; r->lead && k < S->n_slots; k++)
        if (S->slots[k].r == r->lead) return k;
    return -1;
}

/* A choice forked from its leader at fork_at = n_prompt - 1: the leader's prompt records are complete; they are the
 * choice's too. */
static void choice_echo(const slot *L, slot *c) {
    if (!c->echo_lp || !L->r->plps || !c->r->plps) return;
    memcpy(c->r->plps, L->r->plps, sizeof(srv_lp) * (size_t)c->r->n_prompt);
    pthread_mutex_lock(&c->r->mu);
    c->r->plp_done = 1;
    req_wake(c->r);
    pthread_mutex_unlock(&c->r->mu);
}

/* The leader in slot li has fed its prompt up to fork_at: its other choices waiting for it start from a copy of its
 * state (a failed copy: an orphan, which slot_adopt starts on its own). Slots do not move. */
static void fork_choices(srv_sched *S, int li) {
    const slot *L = &S->slots[li];
    for (int k = 0; k < S->n_slots; k++) {
        slot *c = &S->slots[k];
        if (c->seq || c->orphan || c->r->lead != L->r) continue;
        if ((c->seq = dsv4_seq_fork(L->seq))) {
            dsv4_seq_set_prefill(c->seq, c->r->n_prompt);
            c->n_fed = c->n_forked = L->n_fed;
            choice_echo(L, c);
        } else {
            c->orphan = 1;
        }
    }
}

/* Before a batch: a choice that waits for a leader that is gone (released before it fed its prompt), or whose copy
 * failed, starts a sequence of its own; released when that fails. Returns 1 when slot i was released. */
static int slot_adopt(srv_sched *S, int i) {
    slot *s = &S->slots[i];
    if (s->seq) return 0;
    const int li = slot_of_lead(S, s->r);
    if (!s->orphan && li >= 0 && S->slots[li].fork_at > S->slots[li].n_fed) return 0; /* still coming */
    if (!(s->seq = dsv4_seq_new(S->m))) {
        slot_release(S, i, SRV_FIN_ERROR, -1, "out of memory");
        return 1;
    }
    dsv4_seq_set_prefill(s->seq, s->r->n_prompt);
    s->n_fed = s->n_forked = 0;
    s->orphan = 0;
    return 0;
}

/* Called with S->mu held. Returns 0, or -1 (the request was finished with an error). Another choice of n (r->lead set)
 * opens without a sequence when its leader (opened just before it) has a prompt left to feed: it forks the leader's state
 * at fork_at (fork_choices); its own last prompt token is then fed like the leader's, so each choice draws its first
 * token from its own row. */
static int slot_open(srv_sched *S, srv_req *r) {
    slot *s = &S->slots[S->n_slots];
    memset(s, 0, sizeof *s);
    s->r = r;
    s->reserve = (long)r->n_prompt + r->max_tokens;
    dsv4_err e = {{0}};
    const char *why = "out of memory";
    /* echo with logprobs: every prompt row's logits (no prefix cache: its rows' logits are not kept) */
    s->echo_lp = r->echo && r->logprobs;
    if (s->echo_lp) {
        if (!(r->plps = calloc((size_t)r->n_prompt, sizeof *r->plps))) goto fail;
        r->plps[0].token = r->prompt[0];
        r->plps[0].logprob = NAN;
    }
    if (!s->echo_lp || r->n_prompt == 1) {
        pthread_mutex_lock(&r->mu);
        r->plp_done = 1;
        pthread_mutex_unlock(&r->mu);
    }
    const int li = slot_of_lead(S, r);
    if (r->lead && li >= 0 && S->slots[li].fork_at > 0) {
        slot *L = &S->slots[li];
        if (L->n_fed == L->fork_at && !(s->seq = dsv4_seq_fork(L->seq))) s->orphan = 1;
        if (s->seq) s->n_fed = s->n_forked = L->n_fed, choice_echo(L, s);
    } else if (r->n_choices > 1) {
        s->fork_at = r->n_prompt - 1;
    }
    /* a prompt that extends a cached one starts from its state (the rest of the prompt is fed as usual) */
    const int hit = r->lead || s->echo_lp ? -1 : pc_find(S, r->prompt, r->n_prompt);
    if (hit >= 0 && (s->seq = dsv4_seq_fork(S->pc[hit].seq))) {
        s->n_fed = s->n_cached = S->pc[hit].n;
        S->pc[hit].used = ++S->pc_clock;
    }
    /* a longer prefix shared with a kept prompt (another conversation with the same system prompt): a chunk ends
     * there and that state is kept too, for the next one (not for a few tokens past a hit: a near copy of it) */
    if (S->cfg.prefix_cache > 0 && !r->lead && !s->echo_lp) {
        const int sh = pc_shared(S, r->prompt, r->n_prompt);
        if (sh >= PC_MIN_SHARED && sh >= s->n_fed + PC_MIN_SHARED && sh < r->n_prompt) s->cut = sh;
    }
    const int waits = r->lead && li >= 0 && !s->seq && S->slots[li].fork_at > 0; /* forks later */
    if ((!s->seq && !waits && !(s->seq = dsv4_seq_new(S->m))) || !(s->ts = dsv4_tok_stream_new(S->tok, 0))) goto fail;
    if (dsv4_sampler_init(&s->smp, &r->sp, S->V, &e) || dsv4_sampler_add_prompt(s->smp, r->prompt, r->n_prompt, &e)) {
        why = e.msg;
        goto fail;
    }
    if (s->seq) dsv4_seq_set_prefill(s->seq, r->n_prompt);
    if (s->n_cached) srv_metrics_prefix(s->n_cached);
    r->n_cached = s->n_cached; /* (the usage objects read it after req_finish, under r->mu) */
    S->kv_reserved += s->reserve;
    S->n_slots++;
    return 0;
fail:
    dsv4_seq_free(s->seq);
    dsv4_sampler_free(s->smp);
    dsv4_tok_stream_free(s->ts);
    req_finish(r, SRV_FIN_ERROR, -1, 0, why);
    srv_metrics_finish(SRV_FIN_ERROR);
    srv_req_release(r);
    return -1;
}

/* Flushes the detokenizer and the stop matcher's hold-back; finishes the request. */
static void slot_end(srv_sched *S, int i, srv_finish f) {
    slot *s = &S->slots[i];
    srv_req *r = s->r;
    size_t len = 0;
    const char *tail = dsv4_tok_stream_flush(s->ts, &len);
    if (tail && len && dsv4_sb_put(&s->text, tail, len)) {
        slot_release(S, i, SRV_FIN_ERROR, -1, "out of memory");
        return;
    }
    dsv4_stop_result sr;
    dsv4_stop_scan(s->text.p ? s->text.p : "", s->text.n, s->prev, r->sp.stop, r->sp.n_stop, &sr);
    size_t end = s->text.n;
    int stop_index = -1;
    if (sr.stop >= 0) {
        end = sr.cut;
        f = SRV_FIN_STOP;
        stop_index = sr.stop;
    }
    if (end > s->safe) req_push(r, s->text.p + s->safe, end - s->safe, NULL);
    slot_release(S, i, f, stop_index, NULL);
}

static int is_stop_id(const srv_req *r, int32_t t) {
    for (int k = 0; k < r->n_stop_ids; k++)
        if (r->stop_ids[k] == t) return 1;
    return 0;
}

/* min_tokens: the slot's next draw may not end the answer (the end-of-sequence token and stop_token_ids masked; on the
 * host, so such a step samples there) */
static int slot_masks_end(const srv_sched *S, const slot *s) {
    return s->n_gen < s->r->min_tokens && (!s->r->sp.ignore_eos || s->r->n_stop_ids);
}

/* Samples the next token of slot i from logits row (its padding ids already -inf: host_draws) or takes dev_id >= 0,
 * drawn on the device or by host_draws; returns 1 when the slot was released. */
static int slot_sample(srv_sched *S, int i, float *row, int32_t dev_id) {
    slot *s = &S->slots[i];
    srv_req *r = s->r;
    dsv4_err e = {{0}};
    /* tool_choice: the answer opens a tool call; chat mode from the first token, thinking mode once
     * the reasoning has closed */
    if (r->n_force && !s->forcing && s->n_forced == 0 &&
        (r->mode != DSV4_CHAT_THINKING || (s->text.p && memmem(s->text.p, s->text.n, "</think>", 8))))
        s->forcing = 1;
    int32_t t = s->forcing ? r->force[s->n_forced++] : dev_id >= 0 ? dev_id : dsv4_sampler_sample(s->smp, row, &e);
    if (s->forcing && s->n_forced == r->n_force) s->forcing = 0;
    if (t < 0 || dsv4_sampler_accept(s->smp, t, &e)) {
        slot_release(S, i, SRV_FIN_ERROR, -1, e.msg);
        return 1;
    }
    double now = srv_now();
    if (s->n_gen == 0) srv_metrics_ttft(now - r->t_submit);
    else srv_metrics_tpot(now - s->t_last);
    s->t_last = now;
    s->n_gen++;
    srv_lp lp, *lpp = NULL;
    if (r->logprobs) {
        memset(&lp, 0, sizeof lp);
        lp.token = t;
        int nt = dsv4_logprobs(row, S->V, t, r->top_logprobs, &lp.logprob, lp.top, &e);
        lp.n_top = nt < 0 ? 0 : nt;
        lpp = &lp;
    }
    if ((t == S->eos && !r->sp.ignore_eos) || is_stop_id(r, t)) {
        if (lpp) req_push(r, NULL, 0, lpp);
        slot_end(S, i, SRV_FIN_EOS);
        return 1;
    }
    size_t len = 0;
    const char *piece = dsv4_tok_stream_feed(s->ts, t, &len, &e);
    if (!piece || dsv4_sb_put(&s->text, piece, len)) {
        slot_release(S, i, SRV_FIN_ERROR, -1, piece ? "out of memory" : e.msg);
        return 1;
    }
    dsv4_stop_result sr;
    dsv4_stop_scan(s->text.p ? s->text.p : "", s->text.n, s->prev, r->sp.stop, r->sp.n_stop, &sr);
    s->prev = s->text.n;
    if (sr.stop >= 0) {
        req_push(r, s->text.p + s->safe, sr.cut - s->safe, lpp);
        s->safe = sr.cut;
        slot_release(S, i, SRV_FIN_STOP, sr.stop, NULL);
        return 1;
    }
    if (req_push(r, s->text.p + s->safe, sr.safe - s->safe, lpp)) {
        slot_release(S, i, SRV_FIN_ERROR, -1, "out of memory");
        return 1;
    }
    s->safe = sr.safe;
    if (s->n_gen >= r->max_tokens) {
        slot_end(S, i, SRV_FIN_LENGTH);
        return 1;
    }
    s->last = t;
    return 0;
}

/* ---- every row's logits: echo with logprobs ---- */

#define ALL_ROWS 256 /* prompt rows a step of step_all_logits (its logits: ALL_ROWS x V floats) */

/* the slot's next prompt chunk needs every row's logits: the records of prompt tokens 1 .. n_prompt - 1 */
static int needs_all(const slot *s) { return s->seq && s->echo_lp && s->n_fed < s->r->n_prompt - 1; }

/* Feeds the prompt chunks of slots that need every row's logits (needs_all) in a forward of their own (LOGITS_ALL, at
 * most ALL_ROWS rows) and records each prompt token's logprob from the row before it. A chunk ends at n_prompt - 1 (the
 * last prompt token then goes with the main batch, whose row is the first draw's) and at fork_at. Returns 1 when the
 * forward failed (its slots were released with the error). */
static int step_all_logits(srv_sched *S, char *err, size_t errcap) {
    int nb = 0, rows = 0;
    for (int i = 0; i < S->n_slots; i++) {
        slot *s = &S->slots[i];
        if (!needs_all(s)) continue;
        int c = s->r->n_prompt - 1 - s->n_fed;
        if (s->fork_at > s->n_fed && s->fork_at - s->n_fed < c) c = s->fork_at - s->n_fed;
        if (c > S->cfg.prefill_chunk) c = S->cfg.prefill_chunk;
        if (c > ALL_ROWS) c = ALL_ROWS;
        if (rows + c > ALL_ROWS) continue;
        s->chunk = c;
        S->bseq[nb] = s->seq;
        S->btok[nb] = s->r->prompt + s->n_fed;
        S->bn[nb] = c;
        S->bslot[nb++] = i;
        rows += c;
    }
    if (!nb) return 0;
    if (!S->alogits && !(S->alogits = malloc(sizeof(float) * ALL_ROWS * (size_t)S->V))) snprintf(err, errcap, "out of memory");
    if (!S->alogits || dsv4_forward(S->m, nb, S->bseq, S->btok, S->bn, S->alogits, DSV4_LOGITS_ALL, err, errcap)) {
        fprintf(stderr, "dsv4 serve: forward failed: %s\n", err);
        for (int i = 0; i < S->n_slots; i++) S->slots[i].chunk = 0;
        for (int b = 0; b < nb; b++) S->slots[S->bslot[b]].chunk = -1;
        for (int i = S->n_slots - 1; i >= 0; i--)
            if (S->slots[i].chunk == -1) slot_release(S, i, SRV_FIN_ERROR, -1, err);
        return 1;
    }
    srv_metrics_step(rows);
    float *row = S->alogits;
    for (int b = 0; b < nb; b++) { /* (no slot moves in this loop) */
        slot *s = &S->slots[S->bslot[b]];
        srv_req *r = s->r;
        /* each row's log-softmax over the vocabulary in parallel (a row a record) */
#pragma omp parallel for schedule(dynamic, 4) if (s->chunk > 1)
        for (int j = 0; j < s->chunk; j++) {
            float *lr = row + (size_t)j * S->V;
            for (int v = S->tok_vocab; v < S->V; v++) lr[v] = -INFINITY; /* padding ids */
            srv_lp *l = &r->plps[s->n_fed + j + 1];
            dsv4_err e = {{0}};
            l->token = r->prompt[s->n_fed + j + 1];
            const int nt = dsv4_logprobs(lr, S->V, l->token, r->top_logprobs, &l->logprob, l->top, &e);
            l->n_top = nt < 0 ? 0 : nt;
        }
        row += (size_t)s->chunk * S->V;
        s->n_fed += s->chunk;
        s->chunk = 0;
        if (s->n_fed == r->n_prompt - 1) {
            pthread_mutex_lock(&r->mu);
            r->plp_done = 1;
            req_wake(r);
            pthread_mutex_unlock(&r->mu);
        }
        if (s->n_fed == s->fork_at && s->fork_at > 0) fork_choices(S, S->bslot[b]);
    }
    return 0;
}

/* ---- the loop ---- */

/* Finishes every waiting request as aborted and drops it from the queue. Called with S->mu held. */
static void abort_waiting(srv_sched *S) {
    while (S->wait_n) {
        srv_req *r = S->wait[S->wait_head];
        S->wait_head = (S->wait_head + 1) % S->wait_cap;
        S->wait_n--;
        req_finish(r, SRV_FIN_ABORT, -1, 0, NULL);
        srv_req_release(r);
    }
}

/* A host step's draws (dsv4_forward's logits, not the device's sampler) into S->dids in batch order, in parallel: each
 * slot has its own sampler and a draw reads its row only. ~0.3-1.5 ms a row at a real vocabulary on one core
 * (src/engine/sample.h), so a GPU step that mixes prompt chunks with many decodes would otherwise wait on the host.
 * -1: no draw (a prompt chunk that does not end its prompt) or a failed one (slot_sample draws again for the message).
 * The same tokens as drawing in slot_sample: a draw depends on (seed, step) and the row alone. */
static void host_draws(srv_sched *S, int nb) {
#pragma omp parallel for schedule(dynamic, 1) if (nb > 1)
    for (int b = 0; b < nb; b++) {
        const slot *s = &S->slots[S->bslot[b]];
        S->dids[b] = -1;
        if (s->n_fed + s->chunk < s->r->n_prompt) continue;
        float *row = S->logits + (size_t)b * S->V;
        for (int v = S->tok_vocab; v < S->V; v++) row[v] = -INFINITY; /* padding rows: never sampled */
        /* min_tokens: the answer's end masked for this draw, the row restored after it (logprobs read it raw) */
        const int mask = slot_masks_end(S, s), me = mask && !s->r->sp.ignore_eos && S->eos >= 0 && S->eos < S->V;
        const int ns = mask ? s->r->n_stop_ids : 0;
        const float eos_l = me ? row[S->eos] : 0.0f;
        float keep[SRV_MAX_STOP_IDS];
        if (me) row[S->eos] = -INFINITY;
        for (int k = 0; k < ns; k++) keep[k] = row[s->r->stop_ids[k]], row[s->r->stop_ids[k]] = -INFINITY;
        dsv4_err e = {{0}};
        const int32_t t = dsv4_sampler_sample(s->smp, row, &e);
        for (int k = ns - 1; k >= 0; k--) row[s->r->stop_ids[k]] = keep[k]; /* (reverse: a repeated id gets its value) */
        if (me) row[S->eos] = eos_l;
        S->dids[b] = t >= 0 ? t : -1;
    }
}

static void *engine_main(void *arg) {
    srv_sched *S = arg;
    char err[1024];
    for (;;) {
        pthread_mutex_lock(&S->mu);
        for (;;) {
            while (S->wait_n && S->n_slots < S->cfg.max_seqs) {
                srv_req *r = S->wait[S->wait_head];
                const int g = r->n_choices; /* a request's choices are admitted together (queued one after another) */
                long need = ((long)r->n_prompt + r->max_tokens) * g;
                if (S->n_slots + g > S->cfg.max_seqs || (S->kv_reserved + need > S->cfg.kv_tokens && S->n_slots)) break;
                for (int j = 0; j < g; j++) {
                    r = S->wait[S->wait_head];
                    S->wait_head = (S->wait_head + 1) % S->wait_cap;
                    S->wait_n--;
                    slot_open(S, r);
                }
            }
            if (S->n_slots || S->stop) break;
            pthread_cond_broadcast(&S->idle_cv);
            pthread_cond_wait(&S->cv, &S->mu);
        }
        int cancel_all = S->cancel_all, stop = S->stop;
        pthread_mutex_unlock(&S->mu);
        if (stop && !S->n_slots) break;

        /* cancellations */
        for (int i = S->n_slots - 1; i >= 0; i--) {
            const srv_req *r = S->slots[i].r; /* a request's choices go with it (its leader is cancelled first) */
            if (cancel_all || atomic_load(&r->cancel) || (r->lead && atomic_load(&r->lead->cancel)))
                slot_release(S, i, SRV_FIN_ABORT, -1, NULL);
        }
        for (int i = S->n_slots - 1; i >= 0; i--) slot_adopt(S, i);
        if (step_all_logits(S, err, sizeof err)) continue;
        for (int i = S->n_slots - 1; i >= 0; i--) { /* max_tokens 0 (echo): done once the prompt's records are */
            const slot *s = &S->slots[i];
            if (s->seq && !s->r->max_tokens && !needs_all(s)) {
                srv_metrics_tokens(s->n_fed - s->n_cached - s->n_forked, 0); /* the prompt tokens computed */
                slot_end(S, i, SRV_FIN_LENGTH);
            }
        }
        if (!S->n_slots) continue;

        /* the batch: decoding requests first, then prompt chunks */
        int nb = 0, budget = S->cfg.step_tokens, ntok = 0;
        for (int i = 0; i < S->n_slots; i++) {
            slot *s = &S->slots[i];
            s->chunk = 0;
            if (!s->seq || s->n_fed < s->r->n_prompt) continue;
            s->chunk = 1;
            S->bseq[nb] = s->seq;
            S->btok[nb] = &s->last;
            S->bn[nb] = 1;
            S->bslot[nb++] = i;
            budget--;
        }
        int prefills = 0;
        for (int i = 0; i < S->n_slots; i++) {
            slot *s = &S->slots[i];
            if (!s->seq || s->n_fed >= s->r->n_prompt || needs_all(s)) continue;
            int end = s->r->n_prompt;
            if (s->cut > s->n_fed && s->cut < end) end = s->cut;
            if (s->fork_at > s->n_fed && s->fork_at < end) end = s->fork_at;
            int c = end - s->n_fed;
            if (c > S->cfg.prefill_chunk) c = S->cfg.prefill_chunk;
            if (c > budget && prefills) continue;
            s->chunk = c;
            S->bseq[nb] = s->seq;
            S->btok[nb] = s->r->prompt + s->n_fed;
            S->bn[nb] = c;
            S->bslot[nb++] = i;
            budget -= c;
            prefills++;
        }
        if (!nb) continue; /* (every prompt in step_all_logits) */
        for (int b = 0; b < nb; b++) ntok += S->bn[b];
        /* sampling on the device: no request needing the host's logits or history; decoding requests only, or prompt
         * chunks too with mixed_dev (a chunk that does not end its prompt draws a token nobody reads) */
        int on_dev = (!prefills || S->mixed_dev) && nb > 0 && nb <= dsv4_decode_sample_max(S->m);
        for (int b = 0; b < nb && on_dev; b++) {
            const slot *s = &S->slots[S->bslot[b]];
            const dsv4_sampling *p = &s->r->sp;
            on_dev = !s->r->logprobs && !s->r->n_force && p->repetition_penalty == 1.0f && p->presence_penalty == 0.0f &&
                     p->frequency_penalty == 0.0f && !p->n_bias && !slot_masks_end(S, s);
            S->dtok[b] = s->last;
            S->dsp[b] = (dsv4_device_sampling){p->temperature, p->top_p, p->min_p, p->top_k, p->seed, dsv4_sampler_step(s->smp)};
        }
        if (on_dev ? prefills ? dsv4_forward_sample(S->m, nb, S->bseq, S->btok, S->bn, S->dsp, S->tok_vocab, S->dids, err, sizeof err)
                              : dsv4_decode_sample(S->m, nb, S->bseq, S->dtok, S->dsp, S->tok_vocab, S->dids, err, sizeof err)
                   : dsv4_forward(S->m, nb, S->bseq, S->btok, S->bn, S->logits, DSV4_LOGITS_LAST, err, sizeof err)) {
            fprintf(stderr, "dsv4 serve: forward failed: %s\n", err);
            for (int b = nb - 1; b >= 0; b--) S->slots[S->bslot[b]].chunk = -1;
            for (int i = S->n_slots - 1; i >= 0; i--)
                if (S->slots[i].chunk == -1) slot_release(S, i, SRV_FIN_ERROR, -1, err);
            continue;
        }
        srv_metrics_step(ntok);
        if (!on_dev) host_draws(S, nb);
        /* results: walk the batch; releasing slot i moves the last slot into i, so remember by request */
        srv_req *brq[nb > 0 ? nb : 1];
        for (int b = 0; b < nb; b++) brq[b] = S->slots[S->bslot[b]].r;
        long used = 0;
        for (int b = 0; b < nb; b++) {
            int i = -1;
            for (int k = 0; k < S->n_slots; k++)
                if (S->slots[k].r == brq[b]) {
                    i = k;
                    break;
                }
            if (i < 0) continue;
            slot *s = &S->slots[i];
            if (s->n_fed < s->r->n_prompt) {
                s->n_fed += s->chunk;
                if (s->n_fed == s->cut) pc_put(S, s->r->prompt, s->cut, s->seq); /* the shared prefix's state */
                if (s->n_fed == s->fork_at && s->fork_at > 0) fork_choices(S, i); /* the other choices start here */
                if (s->n_fed < s->r->n_prompt) continue;
                srv_metrics_tokens(s->r->n_prompt - s->n_cached - s->n_forked, 0);
                pc_put(S, s->r->prompt, s->r->n_prompt, s->seq); /* the state right after the prompt */
            }
            slot_sample(S, i, on_dev ? NULL : S->logits + (size_t)b * S->V, S->dids[b]);
        }
        for (int i = 0; i < S->n_slots; i++) used += S->slots[i].seq ? dsv4_seq_pos(S->slots[i].seq) : 0;
        pthread_mutex_lock(&S->mu);
        S->kv_used = used;
        pthread_mutex_unlock(&S->mu);
    }
    /* leftovers (shutdown) */
    pthread_mutex_lock(&S->mu);
    abort_waiting(S);
    pthread_cond_broadcast(&S->idle_cv);
    pthread_mutex_unlock(&S->mu);
    return NULL;
}

srv_sched *srv_sched_new(dsv4_model *m, const dsv4_tok *tok, const srv_config *cfg, char *err, size_t errcap) {
    srv_sched *S = calloc(1, sizeof *S);
    if (!S) {
        snprintf(err, errcap, "out of memory");
        return NULL;
    }
    S->m = m;
    S->tok = tok;
    S->cfg = *cfg;
    dsv4_info info = dsv4_model_info(m);
    S->V = info.vocab_size;
    S->eos = info.eos_token_id;
    S->tok_vocab = dsv4_tok_vocab_size(tok);
    if (S->tok_vocab > S->V) S->tok_vocab = S->V;
    /* steps that mix prompt chunks with decodes sample on the device as well (dsv4_forward_sample; the GPU suite
     * checks its draws against the host sampler's); DSV4_SERVE_MIXED_DEVICE=0: on the host (every row's logits back) */
    const char *md = getenv("DSV4_SERVE_MIXED_DEVICE");
    S->mixed_dev = !(md && !strcmp(md, "0"));
    pthread_mutex_init(&S->mu, NULL);
    pthread_cond_init(&S->cv, NULL);
    pthread_cond_init(&S->idle_cv, NULL);
    int n = cfg->max_seqs;
    S->wait_cap = cfg->max_queue > 0 ? cfg->max_queue : 1;
    S->wait = calloc((size_t)S->wait_cap, sizeof *S->wait);
    S->slots = calloc((size_t)n, sizeof *S->slots);
    S->logits = malloc((size_t)n * (size_t)S->V * sizeof(float));
    S->bseq = calloc((size_t)n, sizeof *S->bseq);
    S->btok = calloc((size_t)n, sizeof *S->btok);
    S->bn = calloc((size_t)n, sizeof *S->bn);
    S->bslot = calloc((size_t)n, sizeof *S->bslot);
    S->dtok = calloc((size_t)n, sizeof *S->dtok);
    S->dids = calloc((size_t)n, sizeof *S->dids);
    S->dsp = calloc((size_t)n, sizeof *S->dsp);
    S->pc = calloc((size_t)(cfg->prefix_cache > 0 ? cfg->prefix_cache : 1), sizeof *S->pc);
    if (!S->wait || !S->slots || !S->logits || !S->bseq || !S->btok || !S->bn || !S->bslot || !S->dtok || !S->dids ||
        !S->dsp || !S->pc) {
        snprintf(err, errcap, "out of memory");
        srv_sched_free(S);
        return NULL;
    }
    if (pthread_create(&S->th, NULL, engine_main, S)) {
        snprintf(err, errcap, "cannot start the engine thread");
        srv_sched_free(S);
        return NULL;
    }
    S->started = 1;
    return S;
}

int srv_sched_submit(srv_sched *S, srv_req **rs, int n, char *err, size_t errcap) {
    /* groups: a leader (r->n_choices of them from it are admitted together by the engine) and its choices */
    for (int i = 0; i < n;) {
        const srv_req *r = rs[i];
        const int g = r->n_choices;
        int ok = !r->lead && g >= 1 && i + g <= n;
        for (int j = 1; ok && j < g; j++) ok = rs[i + j]->lead == r;
        if (!ok) {
            snprintf(err, errcap, "internal error: request %d of %d is not a group of its choices", i, n);
            return 500;
        }
        if (g > S->cfg.max_seqs) {
            snprintf(err, errcap, "n = %d: the server runs at most %d sequences at once (--max-seqs)", g, S->cfg.max_seqs);
            return 400;
        }
        const long need = (long)r->n_prompt + r->max_tokens;
        if (need * g > S->cfg.kv_tokens) {
            snprintf(err, errcap, "the request needs %ld tokens of KV cache (%sprompt %d + max_tokens %d%s); the server's budget is %ld",
                     need * g, g > 1 ? "n x (" : "", r->n_prompt, r->max_tokens, g > 1 ? ")" : "", S->cfg.kv_tokens);
            return 400;
        }
        i += g;
    }
    if (n > S->wait_cap) {
        snprintf(err, errcap, "%d sequences (prompts x n): the server queues at most %d requests (--max-queue)", n, S->wait_cap);
        return 400;
    }
    pthread_mutex_lock(&S->mu);
    int rc = 0;
    if (S->draining || S->stop) {
        snprintf(err, errcap, "the server is shutting down");
        rc = 503;
    } else if (S->wait_n + n > S->wait_cap) {
        snprintf(err, errcap, "the server is overloaded (%d requests waiting); retry later", S->wait_n);
        rc = 503;
    } else {
        const double now = srv_now();
        for (int i = 0; i < n; i++) {
            pthread_mutex_lock(&rs[i]->mu);
            rs[i]->refs++;
            pthread_mutex_unlock(&rs[i]->mu);
            rs[i]->t_submit = now;
            S->wait[(S->wait_head + S->wait_n) % S->wait_cap] = rs[i];
            S->wait_n++;
        }
        pthread_cond_signal(&S->cv);
    }
    pthread_mutex_unlock(&S->mu);
    return rc;
}

int srv_sched_drain(srv_sched *S, double timeout_s) {
    pthread_mutex_lock(&S->mu);
    S->draining = 1;
    struct timespec dl;
    clock_gettime(CLOCK_REALTIME, &dl);
    double end = dl.tv_sec + dl.tv_nsec * 1e-9 + timeout_s;
    dl.tv_sec = (time_t)end;
    dl.tv_nsec = (long)((end - (double)dl.tv_sec) * 1e9);
    while ((S->n_slots || S->wait_n) && pthread_cond_timedwait(&S->idle_cv, &S->mu, &dl) == 0) {
    }
    int left = S->n_slots + S->wait_n;
    if (left) {
        S->cancel_all = 1;
        pthread_cond_signal(&S->cv);
        while (S->n_slots || S->wait_n) {
            /* the engine cancels at its next step boundary; queued ones are dropped below */
            abort_waiting(S);
            if (S->n_slots) pthread_cond_wait(&S->idle_cv, &S->mu);
        }
    }
    pthread_mutex_unlock(&S->mu);
    return left;
}

void srv_sched_free(srv_sched *S) {
    if (!S) return;
    if (S->started) {
        pthread_mutex_lock(&S->mu);
        S->stop = 1;
        S->cancel_all = 1;
        pthread_cond_signal(&S->cv);
        pthread_mutex_unlock(&S->mu);
        pthread_join(S->th, NULL);
    }
    pthread_mutex_destroy(&S->mu);
    pthread_cond_destroy(&S->cv);
    pthread_cond_destroy(&S->idle_cv);
    free(S->wait);
    free(S->slots);
    free(S->logits);
    free(S->bseq);
    free(S->btok);
    free(S->bn);
    free(S->bslot);
    free(S->dtok);
    free(S->dids);
    free(S->dsp);
    free(S->alogits);
    for (int i = 0; S->pc && i < S->n_pc; i++) free(S->pc[i].tok), dsv4_seq_free(S->pc[i].seq);
    free(S->pc);
    free(S);
}

void srv_sched_stats(srv_sched *S, int *running, int *waiting, long *kv_used, long *kv_reserved, long *kv_cap) {
    pthread_mutex_lock(&S->mu);
    *running = S->n_slots;
    *waiting = S->wait_n;
    *kv_used = S->kv_used;
    *kv_reserved = S->kv_reserved;
    *kv_cap = S->cfg.kv_tokens;
    pthread_mutex_unlock(&S->mu);
}
