/* state.h - everything one sequence carries between forward calls (spec 8.2, 10): per layer the
 * window ring of raw kv, the compressor states (pending window rows, and the A-half of the last
 * full window for overlap compressors), the compressed entries and the indexer keys. All of it
 * belongs to the sequence and is freed with it; nothing is shared between sequences. */
#ifndef DSV4_MODEL_STATE_H
#define DSV4_MODEL_STATE_H

#include "model.h"

typedef struct dsv4_cmp_state {
    float *kv, *sc; /* [c*m, c*d] pending rows (score -inf = empty) */
    float *ent;     /* [cap, d] emitted entries, entry w at row w */
    int n, cap;
} dsv4_cmp_state;

typedef struct dsv4_layer_state {
    float *win; /* [W, head_dim] ring: position p in slot p mod W */
    dsv4_cmp_state cmp, idx;
} dsv4_layer_state;

typedef struct dsv4_seq_state {
    const dsv4_model *m;
    int pos;                /* tokens processed so far = position of the next token */
    int prefill_end;        /* positions below this belong to one logical prefill (see dsv4_seq_set_prefill) */
    dsv4_layer_state *ls;   /* [n_layers]; NULL when the model runs on the GPU */
    void *gpu;              /* dsv4_cuda_seq when the model runs on the GPU */
} dsv4_seq_state;

dsv4_seq_state *dsv4_seq_state_new(const dsv4_model *m);
void dsv4_seq_state_free(dsv4_seq_state *s);
/* A new state holding a copy of src's (dsv4_seq_fork); NULL when out of memory. */
dsv4_seq_state *dsv4_seq_state_fork(const dsv4_seq_state *src);
/* Makes room for `n` more entries in a compressor state; -1 when out of memory. */
int dsv4_cmp_state_reserve(dsv4_cmp_state *c, int d, int n);
/* Floats of a compressor's pending rows, kv or scores ([c*m, c*d], c = 2 with overlap): the CPU state's and the GPU
 * sequence's (src/cuda/gpu_seq.c) size. */
size_t dsv4_cmp_pending_floats(const dsv4_compressor *cm);

/* Every forward call passes this before it reaches a backend (request.c): the sequences (distinct, of
 * this model), token ids, positions within the context capacity. The call's token count, or -1 with a
 * message in err. */
long dsv4_check_request(const dsv4_model *m, int nseq, dsv4_seq_state *const *seqs, const int32_t *const *tokens,
                        const int *ntok, char *err, size_t errcap);
/* The capacity a GPU model is set up for: the one set, else min(max_position_embeddings, 16384). */
int dsv4_model_gpu_capacity(const dsv4_model *m);

/* The tokens of one forward call: sequence s contributes tokens off[s] .. off[s]+n[s]-1 at
 * positions pos0[s] ... */
typedef struct dsv4_batch {
    int T, nseq;
    dsv4_seq_state **seq;
    int *off, *n, *pos0;  /* [nseq] */
    int *tok, *pos, *sid; /* [T] token id, position, sequence index */
} dsv4_batch;

/* Layer pieces of the forward (forward_attn.c, forward_moe.c): out[T, D] from x[T, D]. */
int dsv4_attention_fwd(const dsv4_model *m, int L, const dsv4_batch *b, const float *x, float *out);
int dsv4_moe_fwd(const dsv4_model *m, int L, const dsv4_batch *b, const float *x, float *out);

#endif
