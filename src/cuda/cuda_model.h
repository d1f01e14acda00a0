/* cuda_model.h - the whole DeepSeek-V4 forward on the GPU (forward_cuda.c), for `--device cuda`.
 *
 * Plain C. A dsv4_cuda_model is a loaded CPU model (dsv4_model, still owned by the caller and kept
 * alive while the GPU model exists) whose weights were copied to the device once; a dsv4_cuda_seq
 * is one sequence's state on the device, mirroring src/model/state.h (window ring, compressor
 * pending rows, compressed entries, indexer keys; all fp32 for now). dsv4_cuda_forward has the
 * semantics of dsv4_forward (include/dsv4.h), prefill hint included: the same batch of chunks in,
 * the same logits out (within fp32 reduction-order noise).
 *
 * First version: synchronous (the host waits once per indexer layer for the top-k and once per MoE
 * layer for the expert lists), one stream, no CUDA graph; workspaces grow only when a call needs
 * more than any earlier one. */
#ifndef DSV4_CUDA_MODEL_H
#define DSV4_CUDA_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "cuda_backend.h"
#include "dsv4.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct dsv4_cuda_model dsv4_cuda_model;
typedef struct dsv4_cuda_seq dsv4_cuda_seq;

/* Selects device `dev`, uploads every weight of m (progress line on stderr when verbose). 0, or -1
 * with a message in err. */
int dsv4_cuda_model_new(dsv4_model *m, int dev, int verbose, dsv4_cuda_model **out, char *err, size_t errcap);
void dsv4_cuda_model_free(dsv4_cuda_model *g);

dsv4_cuda_seq *dsv4_cuda_seq_new(dsv4_cuda_model *g); /* NULL when out of device memory */
void dsv4_cuda_seq_free(dsv4_cuda_seq *s);
int dsv4_cuda_seq_pos(const dsv4_cuda_seq *s);
void dsv4_cuda_seq_set_prefill(dsv4_cuda_seq *s, int end); /* as dsv4_seq_set_prefill */

/* As dsv4_forward: logits (host memory) [sum(ntok), vocab] for DSV4_LOGITS_ALL, [nseq, vocab] for
 * DSV4_LOGITS_LAST. */
int dsv4_cuda_forward(dsv4_cuda_model *g, int nseq, dsv4_cuda_seq *const *seqs, const int32_t *const *tokens,
                      const int *ntok, float *logits, int mode, char *err, size_t errcap);

/* ---- device helpers used by the forward (forward_ops.cu, attn.cu); device pointers, enqueue only ---- */

/* X[t, j, :] = embedding row tok[t] (any weight format) for the M streams. */
int dsv4_cuda_embed(const dsv4_cuda_weight *w, const int *tok, int T, int M, float *X, void *stream);
int dsv4_cuda_fill(float *x, int64_t n, float v, void *stream);
int dsv4_cuda_scale(float *x, int64_t n, float s, void *stream);   /* x *= s */
int dsv4_cuda_add(float *out, const float *a, int64_t n, void *stream); /* out += a */
int dsv4_cuda_copy(void *dst, const void *src, size_t bytes, void *stream);
/* rows x n floats from src (row stride sld) to dst (row stride dld) */
int dsv4_cuda_copy2d(float *dst, int64_t dld, const float *src, int64_t sld, int rows, int n, void *stream);
/* Feeds n tokens (projections kvp / scp [n, c*d]) at positions pos0.. through a compressor's
 * pending rows skv / ssc [c*m, c*d]; writes the raw emitted entries to ent[0..) (rows of d).
 * Twin: compress_tokens() of forward_attn.c up to (not including) the RMSNorm. */
int dsv4_cuda_cmp_tokens(float *skv, float *ssc, float *ent, const float *kvp, const float *scp, const float *ape,
                         int pos0, int n, int mr, int d, int overlap, void *stream);
/* Indexer scores for T queries: qi [T, Hi, Di], wt [T, Hi]; keys[t] (device array of device
 * pointers) = the query's sequence's indexer keys [*, Di]; ncausal / nlist [T]. out [T, ld]:
 * entries w < nlist[t] are written (-inf from ncausal[t] on). Bit-identical to the CPU's loop. */
int dsv4_cuda_indexer_scores(const float *qi, const float *wt, int T, int Hi, int Di, const float *const *keys,
                             const int *ncausal, const int *nlist, int maxlist, int ld, float *out, void *stream);
/* Window ring write: rows i in [max(0, n-W), n) of kv [n, Dh] go to ring slot (pos0 + i) mod W. */
int dsv4_cuda_ring_write(float *ring, const float *kv, int pos0, int n, int W, int Dh, void *stream);
int dsv4_cuda_gather_rows(float *dst, const float *src, const int *rows, int n, int D, void *stream);
int dsv4_cuda_scatter_add_rows(float *dst, const float *src, const int *rows, int n, int D, void *stream);
/* dsv4_cuda_sparse_attn with rows from two places: an index id >= 0 is row id of qbase[t] (a
 * device array of T device pointers: the query's sequence's state), id <= -2 is row -id-2 of kv2
 * (the chunk's own keys), -1 is no entry. */
int dsv4_cuda_sparse_attn2(const float *q, int T, int H, int Dh, const float *const *qbase, const float *kv2,
                           int64_t kv_ld, const int *idx, int nidx, const float *sink, float scale, float *out,
                           void *stream);

#ifdef __cplusplus
}
#endif
#endif
