/* request.c - what every forward call is checked against before it reaches a backend (CPU or GPU), and
 * the context capacity (dsv4_set_max_context, include/dsv4.h). */
#include <stdio.h>

#include "dsv4.h"
#include "state.h"

int dsv4_model_capacity(const dsv4_model *m) {
    return m->max_context > 0 ? m->max_context : m->cfg.max_position_embeddings;
}

int dsv4_model_gpu_capacity(const dsv4_model *m) {
    if (m->max_context > 0) return m->max_context;
    int cap = m->cfg.max_position_embeddings;
    return cap > DSV4_GPU_DEFAULT_CONTEXT ? DSV4_GPU_DEFAULT_CONTEXT : cap;
}

int dsv4_set_max_context(dsv4_model *m, int n, char *err, size_t errcap) {
    if (n < 1 || n > m->cfg.max_position_embeddings) {
        if (err && errcap)
            snprintf(err, errcap, "context capacity %d: must be in 1 .. max_position_embeddings (%d)", n,
                     m->cfg.max_position_embeddings);
        return -1;
    }
    if (m->gpu && n != m->max_context) {
        if (err && errcap)
            snprintf(err, errcap, "context capacity %d: the GPU model was set up for %d; call dsv4_set_max_context "
                                  "before dsv4_set_device(\"cuda\")", n, m->max_context);
        return -1;
    }
    m->max_context = n;
    return 0;
}

long dsv4_check_request(const dsv4_model *m, int nseq, dsv4_seq_state *const *seqs, const int32_t *const *tokens,
                        const int *ntok, char *err, size_t errcap) {
    const dsv4_config *c = &m->cfg;
    const int V = c->vocab_size, cap = dsv4_model_capacity(m);
    long T = 0;
#define REJECT(...) do { if (err && errcap) snprintf(err, errcap, __VA_ARGS__); return -1; } while (0)
    if (nseq < 0) REJECT("forward: negative batch size");
    for (int s = 0; s < nseq; s++) {
        if (!seqs[s]) REJECT("forward: sequence %d is NULL", s);
        if (seqs[s]->m != m) REJECT("forward: sequence %d belongs to another model", s);
        if (ntok[s] < 0) REJECT("forward: sequence %d: negative token count", s);
        if (ntok[s] > 0 && !tokens[s]) REJECT("forward: sequence %d: no tokens", s);
        for (int r = 0; r < s; r++)
            if (seqs[r] == seqs[s]) REJECT("forward: sequence %d appears twice in one batch", s);
        for (int i = 0; i < ntok[s]; i++)
            if (tokens[s][i] < 0 || tokens[s][i] >= V)
                REJECT("forward: sequence %d, token %d: id %d is outside the vocabulary (0..%d)", s, i, tokens[s][i], V - 1);
        long long end = (long long)dsv4_seq_pos(seqs[s]) + ntok[s];
        if (end > (long long)cap) {
            if (cap == c->max_position_embeddings)
                REJECT("forward: sequence %d would reach position %lld, past max_position_embeddings %d", s, end, cap);
            REJECT("forward: sequence %d would reach position %lld, past the context capacity %d (dsv4_set_max_context; "
                   "max_position_embeddings %d)", s, end, cap, c->max_position_embeddings);
        }
        T += ntok[s];
    }
    return T;
#undef REJECT
}
