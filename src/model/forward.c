/* forward.c - the top-level forward of spec section 3 over a batch of sequence chunks: embedding,
 * mHC residual streams, every block (attention + MoE), HcHead, final norm and head; and the public
 * API of include/dsv4.h around it. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../cpu/ops.h"
#include "dsv4.h"
#include "state.h"

#ifdef DSV4_CUDA
#include "../cuda/cuda_model.h"
#endif

#define ALLOC(n) malloc(sizeof(float) * (size_t)(n))

int dsv4_load(const char *dir, dsv4_model **out, char *err, size_t errcap) {
    dsv4_err e = {{0}};
    int rc = dsv4_model_load_dir(dir, out, &e);
    if (rc && err && errcap) snprintf(err, errcap, "%s", e.msg);
    return rc;
}

void dsv4_free(dsv4_model *m) {
#ifdef DSV4_CUDA
    if (m && m->gpu) dsv4_cuda_model_free(m->gpu);
#endif
    dsv4_model_destroy(m);
}

int dsv4_set_device(dsv4_model *m, const char *device, char *err, size_t errcap) {
    if (!strcmp(device, "cpu")) return 0;
    if (strcmp(device, "cuda")) {
        if (err && errcap) snprintf(err, errcap, "unknown device '%s' (cpu or cuda)", device);
        return -1;
    }
#ifdef DSV4_CUDA
    if (m->gpu) return 0;
    dsv4_cuda_model *g = NULL;
    int cap = dsv4_model_gpu_capacity(m);
    if (dsv4_cuda_model_new(m, 0, 1, cap, &g, err, errcap)) return -1;
    m->gpu = g;
    m->max_context = cap;
    return 0;
#else
    if (err && errcap) snprintf(err, errcap, "device 'cuda': this build has only the cpu backend (build with make CUDA=1)");
    return -1;
#endif
}

dsv4_info dsv4_model_info(const dsv4_model *m) {
    dsv4_info i = {m->cfg.vocab_size, m->cfg.dim, m->cfg.n_layers, dsv4_model_capacity(m),
                   m->cfg.bos_token_id, m->cfg.eos_token_id, m->n_mtp_skipped};
    return i;
}

dsv4_seq *dsv4_seq_new(dsv4_model *m) { return dsv4_seq_state_new(m); }
dsv4_seq *dsv4_seq_fork(const dsv4_seq *src) { return src ? dsv4_seq_state_fork(src) : NULL; }
void dsv4_seq_free(dsv4_seq *s) { dsv4_seq_state_free(s); }
int dsv4_seq_pos(const dsv4_seq *s) {
#ifdef DSV4_CUDA
    if (s->gpu) return dsv4_cuda_seq_pos(s->gpu);
#endif
    return s->pos;
}

void dsv4_seq_set_prefill(dsv4_seq *s, int end) {
    s->prefill_end = end;
#ifdef DSV4_CUDA
    if (s->gpu) dsv4_cuda_seq_set_prefill(s->gpu, end);
#endif
}

static int sub_block(const dsv4_model *m, int L, int ffn, const dsv4_batch *b, float *X, float *x, float *y,
                     float *post, float *comb) {
    const dsv4_config *c = &m->cfg;
    const dsv4_layer *ly = &m->layers[L];
    const int T = b->T, M = c->hc_mult, D = c->dim;
    const dsv4_weight *fn = ffn ? &ly->hc_ffn_fn : &ly->hc_attn_fn;
    const float *scale = ffn ? ly->hc_ffn_scale : ly->hc_attn_scale, *base = ffn ? ly->hc_ffn_base : ly->hc_attn_base;
    const float *nw = ffn ? ly->ffn_norm : ly->attn_norm;
#pragma omp parallel for schedule(static) if (T > 1)
    for (int t = 0; t < T; t++) {
        dsv4_cpu_hc_pre(X + (size_t)t * M * D, M, D, fn, scale, base, c->hc_sinkhorn_iters, c->norm_eps, c->hc_eps,
                        x + (size_t)t * D, post + (size_t)t * M, comb + (size_t)t * M * M);
        dsv4_cpu_rmsnorm(x + (size_t)t * D, D, nw, c->norm_eps);
    }
    int rc = ffn ? dsv4_moe_fwd(m, L, b, x, y) : dsv4_attention_fwd(m, L, b, x, y);
    if (rc) return rc;
#pragma omp parallel for schedule(static) if (T > 1)
    for (int t = 0; t < T; t++)
        dsv4_cpu_hc_post(y + (size_t)t * D, X + (size_t)t * M * D, M, D, post + (size_t)t * M, comb + (size_t)t * M * M);
    return 0;
}

int dsv4_forward(dsv4_model *m, int nseq, dsv4_seq *const *seqs, const int32_t *const *tokens, const int *ntok,
                 float *logits, int mode, char *err, size_t errcap) {
    const long nt = dsv4_check_request(m, nseq, seqs, tokens, ntok, err, errcap); /* request.c */
    if (nt < 0) return -1;
#ifdef DSV4_CUDA
    if (m->gpu) { /* the same call on the GPU (src/cuda/forward_cuda.c) */
        dsv4_cuda_seq **gs = calloc((size_t)(nseq > 0 ? nseq : 1), sizeof *gs);
        if (!gs) {
            if (err && errcap) snprintf(err, errcap, "forward: out of memory");
            return -1;
        }
        for (int s = 0; s < nseq; s++) gs[s] = seqs[s]->gpu;
        int grc = dsv4_cuda_forward(m->gpu, nseq, gs, tokens, ntok, logits, mode, err, errcap);
        if (!grc)
            for (int s = 0; s < nseq; s++) seqs[s]->pos += ntok[s];
        free(gs);
        return grc;
    }
#endif
    const dsv4_config *c = &m->cfg;
    const int M = c->hc_mult, D = c->dim;
    dsv4_batch b = {0};
    int rc = -1, T = (int)nt;
    b.T = T;
    b.nseq = nseq;
    b.seq = (dsv4_seq_state **)seqs;
    b.off = calloc((size_t)nseq + 1, sizeof(int));
    b.n = calloc((size_t)nseq + 1, sizeof(int));
    b.pos0 = calloc((size_t)nseq + 1, sizeof(int));
    b.tok = calloc((size_t)T + 1, sizeof(int));
    b.pos = calloc((size_t)T + 1, sizeof(int));
    b.sid = calloc((size_t)T + 1, sizeof(int));
    for (int s = 0, t = 0; s < nseq; s++) {
        b.off[s] = t;
        b.n[s] = ntok[s];
        b.pos0[s] = seqs[s]->pos;
        for (int i = 0; i < ntok[s]; i++, t++) {
            b.tok[t] = tokens[s][i];
            b.pos[t] = seqs[s]->pos + i;
            b.sid[t] = s;
        }
    }
    if (T == 0) {
        rc = 0;
        goto out;
    }
    float *X = ALLOC((size_t)T * M * D), *x = ALLOC((size_t)T * D), *y = ALLOC((size_t)T * D);
    float *post = ALLOC((size_t)T * M), *comb = ALLOC((size_t)T * M * M);
    for (int t = 0; t < T; t++) {
        dsv4_weight_row(&m->embed, b.tok[t], x);
        for (int j = 0; j < M; j++) memcpy(X + ((size_t)t * M + j) * D, x, sizeof(float) * (size_t)D);
    }
    rc = 0;
    for (int L = 0; L < c->n_layers && !rc; L++) {
        rc = sub_block(m, L, 0, &b, X, x, y, post, comb);
        if (!rc) rc = sub_block(m, L, 1, &b, X, x, y, post, comb);
        if (!rc && m->block_hook) m->block_hook(m->block_hook_ctx, L, X, T);
    }
    if (rc) {
        if (err && errcap) snprintf(err, errcap, "forward: out of memory");
    } else if (mode != DSV4_LOGITS_NONE && logits) {
        /* HcHead + final norm + head, for every token or the last of each sequence */
        int nout = 0;
        for (int t = 0; t < T; t++) {
            int s = b.sid[t];
            if (mode == DSV4_LOGITS_LAST && t != b.off[s] + b.n[s] - 1) continue;
            dsv4_cpu_hc_head(X + (size_t)t * M * D, M, D, &m->hc_head_fn, m->hc_head_scale, m->hc_head_base,
                             c->norm_eps, c->hc_eps, y + (size_t)nout * D);
            dsv4_cpu_rmsnorm(y + (size_t)nout * D, D, m->norm, c->norm_eps);
            nout++;
        }
        dsv4_cpu_linear(&m->head, y, nout, logits);
    }
    if (!rc)
        for (int s = 0; s < nseq; s++) seqs[s]->pos += ntok[s];
    free(X), free(x), free(y), free(post), free(comb);
out:
    free(b.off), free(b.n), free(b.pos0), free(b.tok), free(b.pos), free(b.sid);
    return rc;
}

int dsv4_can_decode_sample(const dsv4_model *m) {
#ifdef DSV4_CUDA
    return m && m->gpu != NULL;
#else
    (void)m;
    return 0;
#endif
}

int dsv4_decode_sample_max(const dsv4_model *m) {
#ifdef DSV4_CUDA
    return m && m->gpu ? dsv4_cuda_decode_max(m->gpu) : 0;
#else
    (void)m;
    return 0;
#endif
}

int dsv4_device_limits(const dsv4_model *m, int *pass_rows, long *seqs) {
    if (pass_rows) *pass_rows = 0;
    if (seqs) *seqs = -1;
#ifdef DSV4_CUDA
    if (m && m->gpu) return dsv4_cuda_limits(m->gpu, pass_rows, seqs);
#else
    (void)m;
#endif
    return 0;
}

#ifdef DSV4_CUDA
static dsv4_cuda_sample_params cuda_params(const dsv4_device_sampling *d) {
    return (dsv4_cuda_sample_params){d->temperature, d->top_p, d->min_p, d->top_k, d->seed, d->step};
}
#endif

int dsv4_decode_sample(dsv4_model *m, int nseq, dsv4_seq *const *seqs, const int32_t *tokens,
                       const dsv4_device_sampling *sp, int n_vocab, int32_t *next, char *err, size_t errcap) {
#ifdef DSV4_CUDA
    if (!m || !m->gpu) {
        if (err && errcap) snprintf(err, errcap, "decode_sample: the model does not sample on a device (use dsv4_forward)");
        return -1;
    }
    const int nmax = dsv4_cuda_decode_max(m->gpu);
    if (nseq < 1 || nseq > nmax || !tokens || !sp || !next) {
        if (err && errcap) snprintf(err, errcap, "decode_sample: %d sequences (1 .. %d) with tokens, parameters and output", nseq, nmax);
        return -1;
    }
    const int32_t *tp[DSV4_CUDA_DECODE_MAX];
    int nt[DSV4_CUDA_DECODE_MAX];
    dsv4_cuda_seq *gs[DSV4_CUDA_DECODE_MAX];
    dsv4_cuda_sample_params p[DSV4_CUDA_DECODE_MAX];
    for (int s = 0; s < nseq; s++) tp[s] = &tokens[s], nt[s] = 1;
    if (dsv4_check_request(m, nseq, seqs, tp, nt, err, errcap) < 0) return -1;
    for (int s = 0; s < nseq; s++) gs[s] = seqs[s]->gpu, p[s] = cuda_params(&sp[s]);
    int rc = dsv4_cuda_decode_sample(m->gpu, nseq, gs, tokens, p, n_vocab, next, err, errcap);
    if (rc == 0 || rc == -2)
        for (int s = 0; s < nseq; s++) seqs[s]->pos += 1;
    return rc == 0 ? 0 : -1;
#else
    (void)m, (void)nseq, (void)seqs, (void)tokens, (void)sp, (void)n_vocab, (void)next;
    if (err && errcap) snprintf(err, errcap, "decode_sample: this build has only the cpu backend (use dsv4_forward)");
    return -1;
#endif
}

int dsv4_forward_sample(dsv4_model *m, int nseq, dsv4_seq *const *seqs, const int32_t *const *tokens, const int *ntok,
                        const dsv4_device_sampling *sp, int n_vocab, int32_t *next, char *err, size_t errcap) {
#ifdef DSV4_CUDA
    if (!m || !m->gpu) {
        if (err && errcap) snprintf(err, errcap, "forward_sample: the model does not sample on a device (use dsv4_forward)");
        return -1;
    }
    if (nseq < 1 || nseq > DSV4_CUDA_DECODE_MAX || !seqs || !tokens || !ntok || !sp || !next) {
        if (err && errcap)
            snprintf(err, errcap, "forward_sample: %d sequences (1 .. %d) with tokens, counts, parameters and output", nseq,
                     DSV4_CUDA_DECODE_MAX);
        return -1;
    }
    int step = 1;
    for (int s = 0; s < nseq; s++) step &= ntok[s] == 1 && tokens[s] != NULL;
    if (step && nseq <= dsv4_cuda_decode_max(m->gpu)) { /* a decode step: its graphs */
        int32_t t1[DSV4_CUDA_DECODE_MAX];
        for (int s = 0; s < nseq; s++) t1[s] = tokens[s][0];
        return dsv4_decode_sample(m, nseq, seqs, t1, sp, n_vocab, next, err, errcap);
    }
    if (dsv4_check_request(m, nseq, seqs, tokens, ntok, err, errcap) < 0) return -1;
    dsv4_cuda_seq *gs[DSV4_CUDA_DECODE_MAX];
    dsv4_cuda_sample_params p[DSV4_CUDA_DECODE_MAX];
    for (int s = 0; s < nseq; s++) gs[s] = seqs[s]->gpu, p[s] = cuda_params(&sp[s]);
    int rc = dsv4_cuda_forward_sample(m->gpu, nseq, gs, tokens, ntok, p, n_vocab, next, err, errcap);
    if (rc == 0 || rc == -2)
        for (int s = 0; s < nseq; s++) seqs[s]->pos += ntok[s];
    return rc == 0 ? 0 : -1;
#else
    (void)m, (void)nseq, (void)seqs, (void)tokens, (void)ntok, (void)sp, (void)n_vocab, (void)next;
    if (err && errcap) snprintf(err, errcap, "forward_sample: this build has only the cpu backend (use dsv4_forward)");
    return -1;
#endif
}
