/* dsv4.h - the public API of the dsv4 engine.
 *
 * A dsv4_model is a loaded checkpoint (read-only once loaded). A dsv4_seq is one sequence's mutable
 * timeline: its position and every cache the model keeps for it (window KV, compressor states,
 * compressed entries, indexer keys); it is freed with dsv4_seq_free. dsv4_forward feeds each of a
 * batch of sequences a chunk of tokens (any length, at the sequence's current position) and returns
 * next-token logits. Errors come back as text naming the file, tensor, field or request. */
#ifndef DSV4_H
#define DSV4_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct dsv4_model dsv4_model;
typedef struct dsv4_seq_state dsv4_seq;

typedef struct dsv4_info {
    int vocab_size, dim, n_layers, max_context;
    int bos_token_id, eos_token_id;
    int n_mtp_tensors;    /* mtp.* (multi-token prediction) tensors present in the checkpoint, not used yet */
} dsv4_info;

/* Loads a model directory (config.json + safetensors). 0 on success; on failure -1 with a message
 * in err (errcap bytes). */
int dsv4_load(const char *dir, dsv4_model **out, char *err, size_t errcap);
void dsv4_free(dsv4_model *m);
/* Chooses where the model runs: "cpu" (the default, float32 reference) or "cuda" (GPU 0; builds made
 * with `make CUDA=1`). Call before creating sequences; "cuda" uploads every weight (progress on
 * stderr) and fixes the context capacity (below). 0, or -1 with a message in err. */
int dsv4_set_device(dsv4_model *m, const char *device, char *err, size_t errcap);
/* The context capacity: the most positions (prompt + generated tokens) one sequence may reach,
 * 1 .. max_position_embeddings. A GPU sequence allocates its caches for the whole capacity when it is
 * created, so the GPU fixes it in dsv4_set_device("cuda"): call this before that (afterwards only the
 * same value is accepted). Default: max_position_embeddings on the CPU, min(max_position_embeddings,
 * DSV4_GPU_DEFAULT_CONTEXT) on the GPU. A forward call past the capacity is an error. dsv4_model_info
 * reports it as max_context. 0, or -1 with a message in err. */
#define DSV4_GPU_DEFAULT_CONTEXT 16384
int dsv4_set_max_context(dsv4_model *m, int n, char *err, size_t errcap);
dsv4_info dsv4_model_info(const dsv4_model *m);

dsv4_seq *dsv4_seq_new(dsv4_model *m); /* NULL when out of memory */
/* A new sequence that holds a copy of src's state (every cache of the tokens src has processed): fed the same
 * tokens, it gives bitwise what src gives; fed others, what a new sequence given src's tokens and then those would
 * (a shared prompt forked into several continuations). NULL when out of memory. */
dsv4_seq *dsv4_seq_fork(const dsv4_seq *src);
void dsv4_seq_free(dsv4_seq *s);
int dsv4_seq_pos(const dsv4_seq *s);    /* tokens processed so far */
/* Declares that positions below `end` form one prompt, even when it is fed in several chunks. The
 * only effect: the indexer's top-k sees the score list the official one-shot prefill would (entries
 * of the whole prompt, later ones masked), so exact score ties resolve as they do there. */
void dsv4_seq_set_prefill(dsv4_seq *s, int end);

enum {
    DSV4_LOGITS_ALL = 0,  /* logits for every token: [sum(ntok), vocab] */
    DSV4_LOGITS_LAST = 1, /* logits for the last token of each sequence: [nseq, vocab] */
    DSV4_LOGITS_NONE = 2, /* no logits (logits may be NULL) */
};

/* One forward call: sequence seqs[i] takes ntok[i] tokens tokens[i][0..] at its current position.
 * A sequence may appear only once per call; ntok[i] may be 0. On the GPU a call that gives every
 * sequence at most one token (a decode step) replays one captured CUDA graph per batch bucket
 * (1, 2, 4, .. 1024 sequences: dsv4_decode_sample_max); longer chunks (prefill) and larger steps run as ordinary
 * launches. */
int dsv4_forward(dsv4_model *m, int nseq, dsv4_seq *const *seqs, const int32_t *const *tokens, const int *ntok,
                 float *logits, int mode, char *err, size_t errcap);

/* Sampling parameters of one sequence for dsv4_decode_sample: the engine's sampler without penalties
 * (src/engine/sample.h: greedy below temperature 1e-5, else temperature, min_p, top_k, top_p and the
 * Philox-4x32-10 draw of (seed, step), step = tokens generated so far). */
typedef struct dsv4_device_sampling {
    float temperature, top_p, min_p;
    int top_k;
    uint64_t seed, step;
} dsv4_device_sampling;

/* 1 when the model's backend samples on the device (set_device "cuda"), else 0. */
int dsv4_can_decode_sample(const dsv4_model *m);
/* The most sequences one dsv4_decode_sample call takes (CUDA: 1024, fewer when DSV4_CUDA_TMAX is lower), 0 when the
 * backend cannot sample. */
int dsv4_decode_sample_max(const dsv4_model *m);

/* What the model's device can run at once, for sizing a server: *pass_rows, the token rows one forward pass takes (a
 * GPU's workspace; larger calls run as several passes); *seqs, how many more sequences of the context capacity fit
 * in its memory now (freed sequences' states included: a GPU keeps them for the next ones). The CPU has neither
 * limit: 0 rows and -1 sequences. 0, or -1 when the device cannot say. */
int dsv4_device_limits(const dsv4_model *m, int *pass_rows, long *seqs);

/* A decode step that also samples on the device: sequence seqs[i] takes the one token tokens[i]; next[i]
 * gets the token drawn with sp[i] from the first n_vocab logits of its row (ids >= n_vocab, e.g. padding
 * rows past the tokenizer's vocabulary, are never drawn). The whole step, sampling included, replays the
 * batch bucket's CUDA graphs; only the ids come back. -1 with a message when the backend cannot sample
 * (CPU: use dsv4_forward and the host sampler), or a row's logits are NaN, +inf or all -inf. */
int dsv4_decode_sample(dsv4_model *m, int nseq, dsv4_seq *const *seqs, const int32_t *tokens,
                       const dsv4_device_sampling *sp, int n_vocab, int32_t *next, char *err, size_t errcap);

/* dsv4_forward of any chunk sizes (a server's step of prompt chunks and decode tokens together) that samples on the
 * device: sequence seqs[i] takes ntok[i] >= 1 tokens tokens[i][0..], and next[i] gets the token drawn with sp[i] from
 * the first n_vocab logits of its last row (a chunk that does not end its prompt draws one the caller ignores). Only
 * the ids come back. One token per sequence is a decode step (dsv4_decode_sample); anything else runs as passes.
 * 1 .. 1024 sequences (more than dsv4_decode_sample_max of one token each run as passes too). -1 with a message as dsv4_decode_sample (the backend cannot
 * sample: use dsv4_forward and the host sampler; or a row's logits are NaN, +inf or all -inf: the tokens are then
 * consumed). */
int dsv4_forward_sample(dsv4_model *m, int nseq, dsv4_seq *const *seqs, const int32_t *const *tokens, const int *ntok,
                        const dsv4_device_sampling *sp, int n_vocab, int32_t *next, char *err, size_t errcap);

#ifdef __cplusplus
}
#endif
#endif
