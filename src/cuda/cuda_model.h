/* cuda_model.h - the whole DeepSeek-V4 forward on the GPU, for `--device cuda`.
 *
 * Plain C. A dsv4_cuda_model is a loaded CPU model (dsv4_model, still owned by the caller and kept
 * alive while the GPU model exists) whose weights were copied to the device once (gpu_model.c); a
 * dsv4_cuda_seq is one sequence's state on the device, allocated for the whole context capacity when
 * the sequence is created (gpu_seq.c): per layer the window ring, the compressed entries, the indexer
 * keys and the compressors' pending rows (fp32 for now). dsv4_cuda_forward (forward_cuda.c) has the
 * semantics of dsv4_forward (include/dsv4.h), which validates the request before calling it.
 *
 * Everything runs on the model's own stream and is decided on the device: compressor emission from the
 * positions, indexer top-k, attention index lists, MoE expert grouping. A decode step (at most one
 * token per sequence, up to 1024 sequences) is one CUDA graph per batch bucket 1, 2, 4, .. 1024, captured
 * on first use and replayed (decode_graph.c); per step the host uploads one small block (tokens,
 * positions, sequence pointers) and downloads the logits. Longer chunks run as ordinary launches in
 * passes of at most `tmax` tokens. */
#ifndef DSV4_CUDA_MODEL_H
#define DSV4_CUDA_MODEL_H

#include <stddef.h>
#include <stdio.h>
#include <stdint.h>

#include "cuda_backend.h"
#include "sample_cuda.h"
#include "dsv4.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct dsv4_cuda_model dsv4_cuda_model;
typedef struct dsv4_cuda_seq dsv4_cuda_seq;

/* Selects device `dev`, uploads every weight of m (progress line on stderr when verbose) and sets up
 * the workspace for sequences of up to `capacity` positions. 0, or -1 with a message in err. */
int dsv4_cuda_model_new(dsv4_model *m, int dev, int verbose, int capacity, dsv4_cuda_model **out, char *err,
                        size_t errcap);
void dsv4_cuda_model_free(dsv4_cuda_model *g);
/* Decode steps through CUDA graphs (1, the default unless DSV4_CUDA_GRAPHS=0) or the same launches
 * one by one (0; the results are bitwise the same). */
void dsv4_cuda_set_graphs(dsv4_cuda_model *g, int on);
/* Tests: attention's parallel branches of small decode steps on (1) or off (0: serial; DSV4_CUDA_ATTN_FORK=0) for the
 * launches that follow; graphs captured before keep what they captured. Returns the previous setting. */
int dsv4_cuda_set_attn_fork(dsv4_cuda_model *g, int on);
/* How many decode-step graphs (layers or head of a bucket) have been captured so far. */
int dsv4_cuda_graphs_captured(const dsv4_cuda_model *g);

dsv4_cuda_seq *dsv4_cuda_seq_new(dsv4_cuda_model *g); /* NULL when out of device memory */
/* Device bytes of one sequence's state (its whole context capacity). */
size_t dsv4_cuda_seq_bytes(const dsv4_cuda_model *g);
/* As dsv4_device_limits (include/dsv4.h). 0, or -1 when the device cannot say. */
int dsv4_cuda_limits(const dsv4_cuda_model *g, int *pass_rows, long *seqs);
/* A new sequence holding a copy of src's state (enqueued on the model's stream, after src's steps). */
dsv4_cuda_seq *dsv4_cuda_seq_fork(const dsv4_cuda_seq *src);
void dsv4_cuda_seq_free(dsv4_cuda_seq *s);
int dsv4_cuda_seq_pos(const dsv4_cuda_seq *s);
/* As dsv4_seq_set_prefill (the indexer's top-k ranks the list the one-shot prefill would). */
void dsv4_cuda_seq_set_prefill(dsv4_cuda_seq *s, int end);
/* The sequence's length as the device has it (a synchronous read; for tests). */
int dsv4_cuda_seq_device_len(const dsv4_cuda_seq *s);

/* As dsv4_forward, for a request dsv4_forward has validated: logits (host memory) [sum(ntok), vocab]
 * for DSV4_LOGITS_ALL, [nseq with ntok > 0, vocab] for DSV4_LOGITS_LAST. */
int dsv4_cuda_forward(dsv4_cuda_model *g, int nseq, dsv4_cuda_seq *const *seqs, const int32_t *const *tokens,
                      const int *ntok, float *logits, int mode, char *err, size_t errcap);
/* The most sequences of a decode step (dsv4_cuda_decode_sample, and dsv4_cuda_forward's graph path): buckets 1, 2,
 * 4, .. DSV4_CUDA_DECODE_MAX (cuda_backend.h), none larger than the passes' rows (DSV4_CUDA_TMAX). Larger steps run
 * as a pass. */
int dsv4_cuda_decode_max(const dsv4_cuda_model *g);
/* As dsv4_decode_sample (include/dsv4.h): one token per sequence (1 .. dsv4_cuda_decode_max sequences), the step's
 * logits sampled on the device (src/cuda/sample.cu) inside the bucket's graphs; next [nseq] (host). */
int dsv4_cuda_decode_sample(dsv4_cuda_model *g, int nseq, dsv4_cuda_seq *const *seqs, const int32_t *tokens,
                            const dsv4_cuda_sample_params *sp, int n_vocab, int32_t *next, char *err, size_t errcap);
/* (returns 0; -2 when the step ran but a row's logits could not be sampled (the tokens are consumed); -1 when
 * it failed) */
/* As dsv4_forward_sample (include/dsv4.h) for chunks of any sizes (ntok[s] >= 1, 1 .. DSV4_CUDA_DECODE_MAX
 * sequences): the call runs as passes (dsv4_cuda_forward's prefill path, not a decode step's graphs), each sequence's
 * last row sampled on the device with sp[s]; next [nseq] (host); returns as dsv4_cuda_decode_sample. */
int dsv4_cuda_forward_sample(dsv4_cuda_model *g, int nseq, dsv4_cuda_seq *const *seqs, const int32_t *const *tokens,
                             const int *ntok, const dsv4_cuda_sample_params *sp, int n_vocab, int32_t *next, char *err,
                             size_t errcap);

/* Benchmark: replays the graphs of the last decode step of `batch` sequences `iters` times (which
 * rewrites that step's state: only for benchmarks) and gives the median milliseconds of the layers graph
 * alone and of layers + head. -1 when graphs are off or no such step ran yet. */
int dsv4_cuda_decode_replay_ms(dsv4_cuda_model *g, int batch, int iters, double *layers_ms, double *step_ms);
/* A profile's time per run split by layer type (compress ratio; 0 = sliding window only), the rest of the layers
 * part (embedding, step bookkeeping) and the head, in ms. */
#define DSV4_PROF_MAXTYPES 8
typedef struct dsv4_cuda_prof_split {
    int n, ratio[DSV4_PROF_MAXTYPES];
    double ms[DSV4_PROF_MAXTYPES], other_ms, head_ms;
} dsv4_cuda_prof_split;
/* Benchmark: where the time of the last decode step of `batch` sequences goes: its launches run `iters` times
 * without graphs with an event after every op (op_profile.c); a table per op to `out` (NULL: none), the split by
 * layer type to `sp` (NULL: none). -1 when no such step ran last. */
int dsv4_cuda_decode_profile(dsv4_cuda_model *g, int batch, int iters, FILE *out, dsv4_cuda_prof_split *sp);
/* The same for passes that are not decode steps (prefill): forwards between open and close are profiled. */
int dsv4_cuda_profile_open(dsv4_cuda_model *g);
void dsv4_cuda_profile_close(dsv4_cuda_model *g, FILE *out, const char *title, dsv4_cuda_prof_split *sp);

/* ---- device-side sequence state and batches (shared by the host code and the kernels) ---- */

/* One layer of one sequence (device pointers; NULL where the layer has no such part). The attention cache
 * holds rows in the stored format of kv_cache.h (FP8 non-rope dims + e8m0 scales, bf16 rope dims); the
 * indexer keys are rows of dsv4_ikey_row_bytes(index_head_dim) bytes (FP4 e2m1 + e8m0 per 32, kv_cache.h). */
typedef struct dsv4_cuda_lstate {
    uint8_t *abuf;    /* [W + capacity / ratio] rows of dsv4_kv_row_bytes(head_dim, rope_head_dim) bytes: window
                       * ring (position p in slot p mod W), then the compressed entries (entry w in row W + w) */
    uint8_t *ibuf;    /* [capacity / 4] indexer-key rows (ratio 4 layers) */
    float *ckv, *csc; /* attention compressor's pending rows [c*m, c*d] (score -inf = empty) */
    float *ikv, *isc; /* the indexer compressor's */
} dsv4_cuda_lstate;

/* One sequence on the device. */
typedef struct dsv4_cuda_seqdev {
    int len;              /* positions processed: the device's copy of the sequence length */
    int capacity;
    dsv4_cuda_lstate *L;  /* [n_layers] */
} dsv4_cuda_seqdev;

/* One pass of a forward call on the device: T token rows in slot order (slot s owns rows
 * off[s] .. off[s] + n[s] - 1 at positions p0[s] ..), S slots. Idle rows (sid < 0) and idle slots
 * (sq NULL, n 0) pad a decode step to its bucket: they compute nothing that is kept and touch no state. */
typedef struct dsv4_cuda_batch {
    int T, S;
    const int *tok, *pos, *sid;       /* [T] token id, position, slot (-1: idle) */
    const int *p0, *n, *off;          /* [S] */
    const int *cend, *pe;             /* [S] end position of the sequence's tokens in this forward call, and its
                                       * prefill hint (dsv4_seq_set_prefill): the indexer list length */
    dsv4_cuda_seqdev *const *sq;      /* [S] */
} dsv4_cuda_batch;

/* ---- device helpers used by the forward; device pointers, enqueue only ---- */

/* X[t, j, :] = embedding row tok[t] (any weight format) for the M streams. */
int dsv4_cuda_embed(const dsv4_cuda_weight *w, const int *tok, int T, int M, float *X, void *stream);
int dsv4_cuda_fill(float *x, int64_t n, float v, void *stream);
int dsv4_cuda_scale(float *x, int64_t n, float s, void *stream);   /* x *= s */
int dsv4_cuda_add(float *out, const float *a, int64_t n, void *stream); /* out += a */
int dsv4_cuda_copy(void *dst, const void *src, size_t bytes, void *stream);
/* rows x n floats from src (row stride sld) to dst (row stride dld) */
int dsv4_cuda_copy2d(float *dst, int64_t dld, const float *src, int64_t sld, int rows, int n, void *stream);
/* Indexer scores for T queries: qi [T, Hi, Di], wt [T, Hi]; keys[t] (device array of device
 * pointers) = the query's sequence's indexer keys: rows in the stored FP4 format (fp4 = 1,
 * dsv4_ikey_row_bytes) or fp32 rows of Di (fp4 = 0); ncausal / nlist [T]. out [T, ld]:
 * entries w < nlist[t] are written (-inf from ncausal[t] on); nothing past nlist[t] is touched.
 * Bit-identical to the CPU's loop (whatever T). Parallel over (entry, head) dots for Di 64 / 128, Hi <= 128 and
 * 16-byte aligned rows (fp32 key rows included); a thread per entry otherwise. */
int dsv4_cuda_indexer_scores(const float *qi, const float *wt, int T, int Hi, int Di, const uint8_t *const *keys, int fp4,
                             const int *ncausal, const int *nlist, int maxlist, int ld, float *out, void *stream);
/* dsv4_cuda_sparse_attn with rows from two places: an index id >= 0 is row id of qbase[t] (a
 * device array of T device pointers: the query's sequence's state), id <= -2 is row -id-2 of kv2
 * (the chunk's own keys), -1 is no entry. */
int dsv4_cuda_sparse_attn2(const float *q, int T, int H, int Dh, const float *const *qbase, const float *kv2,
                           int64_t kv_ld, const int *idx, int nidx, const float *sink, float scale, float *out,
                           void *stream);

/* ---- sequence-state ops of a batch (seq_ops.cu) ---- */

/* Per pass: keys[L * T + t] = the indexer keys (ibuf) of row t's sequence in layer L (NULL for idle rows
 * and layers without an indexer); ncausal4[t] = (pos + 1) / 4 entries the query sees; nlist4[t] = the
 * length of the list the reference's top-k ranks (as the CPU engine: max(cend / 4, pe / 4 if pos < pe),
 * at most maxlist); both 0 for idle rows. */
int dsv4_cuda_step_meta(const dsv4_cuda_batch *b, int nlayers, int maxlist, const uint8_t **keys, int *ncausal4,
                        int *nlist4, void *stream);
/* Compressor of layer L (which 0: attention's, 1: the indexer's): feeds every slot's tokens (projections
 * kvp / scp [T, c*d], ape [m, c*d]) through its pending rows. A token whose position closes a window
 * ((pos + 1) % m == 0) writes its raw entry (before RMSNorm) to ent row t ([T, d]) and rpos[t] = its RoPE
 * position pos + 1 - m; other rows of ent keep whatever they held, their rpos is 0.
 * Twin: compress_tokens() of src/model/forward_attn.c up to the RMSNorm. */
int dsv4_cuda_cmp_batch(const dsv4_cuda_batch *b, int L, int which, const float *kvp, const float *scp,
                        const float *ape, int mr, int d, int overlap, float *ent, int *rpos, void *stream);
/* Its two halves, in this order (the state kernel overwrites pending rows the entries read): the entries (ent, rpos),
 * then the pending rows of each slot's state at the pass end, which only later passes read. */
int dsv4_cuda_cmp_emit(const dsv4_cuda_batch *b, int L, int which, const float *kvp, const float *scp,
                       const float *ape, int mr, int d, int overlap, float *ent, int *rpos, void *stream);
int dsv4_cuda_cmp_state(const dsv4_cuda_batch *b, int L, int which, const float *kvp, const float *scp,
                        const float *ape, int mr, int d, int overlap, void *stream);
/* The finished entries of the tokens that closed a window go to their sequence's cache: entry
 * w = (pos + 1) / m - 1 to abuf row W + w, packed (which 0; R = the rope dims), or ibuf row w (which 1). */
int dsv4_cuda_cmp_store(const dsv4_cuda_batch *b, int L, int which, const float *ent, int mr, int d, int R, int W,
                        void *stream);
/* Window ring: kv row t (FP8-simulated non-rope dims) is packed into slot pos mod W of its sequence's ring
 * when pos is among the last W positions of the slot's chunk. */
int dsv4_cuda_ring_store(const dsv4_cuda_batch *b, int L, const float *kv, int W, int Dh, int R, void *stream);
/* Attention index lists of layer L, idx [T, nidx]: the window (positions max(0, p-W+1) .. p in order:
 * ring slot pp mod W for positions before the slot's chunk, -(row of the chunk's own kv) - 2 for the
 * chunk's), then the compressed entries W + w: ratio 4: w = sel[t, i] for i < nsel[t] (sel [T, ksel]);
 * other ratios > 0: every w < (pos + 1) / ratio; then -1 up to nidx. qbase[t] = the sequence's abuf
 * (NULL for idle rows, whose lists are all -1). Twin: the list loop of dsv4_attention_fwd. */
int dsv4_cuda_attn_index(const dsv4_cuda_batch *b, int L, int W, int ratio, const int *sel, const int *nsel, int ksel,
                         int nidx, int *idx, const uint8_t **qbase, void *stream);
/* The device lengths: len = p0 + n of every slot with tokens (idempotent, so a graph replay of the same
 * step leaves the same length). */
int dsv4_cuda_seq_advance(const dsv4_cuda_batch *b, void *stream);

/* ---- indexer top-k (topk.cu) ---- */

/* The CPU engine's indexer selection (indexer_topk of src/model/forward_attn.c) for each of T rows of
 * scores (row stride ld): dsv4_topk_torch of the first nlist[t] values with k' = min(k, nlist[t]), then
 * the picks >= ncausal[t] dropped, the order kept: sel [T, k] (the rest unwritten), nsel [T] = picks
 * kept. A radix select where the values involved are distinct; rows where the k-th value ties an unselected
 * one are redone by one thread with the CPU's algorithm on scratch (ld tk_elem = 8 bytes each per row); equal
 * values all selected: by increasing index (see dsv4_cuda_topk_set_exact_order). The result depends only on the
 * row. k <= 2048, nlist[t] <= ld. The values from ncausal[t] on must be -inf (the masked entries, as the indexer writes
 * them) and none before it a negative NaN (which ranks below -inf; the GPU's arithmetic makes positive NaNs only): with
 * k' causal entries or more the fast form ranks those alone. */
int dsv4_cuda_topk(const float *scores, int T, int64_t ld, const int *nlist, const int *ncausal, int k, int *sel, int *nsel,
                   void *scratch, void *stream);
/* Equal values that are all selected keep the order by increasing index (default) or, on = 1, torch's order by the
 * one-thread path (DSV4_TOPK_EXACT_ORDER=1); on = -1: from the environment again. */
void dsv4_cuda_topk_set_exact_order(int on);
/* 1: rows with at least k' causal entries rank those alone, a thread's keys of rows up to 2048 entries read once into
 * registers, the shared atomics of the histograms and the gather once a warp and bin, the sort's exchanges within a
 * warp by shuffles, masked picks dropped by a block-wide compaction instead of one thread's loop (the same picks in the
 * same order; DSV4_TOPK_FAST=1); 0: as before; -1: from the environment again (1 unless set to 0: on since session 30). */
void dsv4_cuda_topk_set_fast(int on);
/* Threads a row: 256 (where k <= 512: four rows an SM), 512 (where k <= 512: two rows an SM; sessions 51-53) or 1024
 * (every k: the form before session 51); -1: from DSV4_TOPK_THREADS again (256 unless set). The same picks in the same
 * order. */
void dsv4_cuda_topk_set_threads(int nt);
/* c = rows ranked, rows with order ties only, rows with boundary ties (the one-thread path) since the last reset. */
int dsv4_cuda_topk_counts(unsigned long long c[3], int reset);

/* ---- MoE on the device (moe_group.cu) ---- */

/* A layer's routed experts for the grouped kernels: device arrays of the per-expert weights; formats
 * uniform over the experts (checked by dsv4_cuda_experts_init). */
typedef struct dsv4_cuda_experts {
    dsv4_cuda_weight *w1, *w3, *w2; /* device [E] */
    int E, D, I;                    /* experts, model dim (w1 / w3 columns, w2 rows), inter dim */
    int fmt13, fmt2;                /* formats of w1 / w3 and of w2 */
    int vec13, vec2;                /* 16-byte rows everywhere: the vector path; else element by element */
    int tc13, tc2;                  /* the tensor-core kernel takes them (moe_tc.cu: FP8 / MXFP4 / NVFP4, columns % 128) */
    int aq13, aq2;                  /* their act_quant (uniform over the experts when tc13 / tc2) */
} dsv4_cuda_experts;

/* From host arrays [E] of device weights (dsv4_cuda_weight of each expert). 0, or -1 (message in
 * dsv4_cuda_last_error) when the formats differ between experts or w1 / w3 disagree. */
int dsv4_cuda_experts_init(dsv4_cuda_experts *x, const dsv4_cuda_weight *w1, const dsv4_cuda_weight *w3,
                           const dsv4_cuda_weight *w2, int E);
void dsv4_cuda_experts_free(dsv4_cuda_experts *x);

/* Routing plan of up to T*K picks (device arrays). Active experts in increasing id: act_e / act_off /
 * act_cnt [*nact]; their rows in slot order: rows[i] = token, rw[i] = routing weight (for each expert
 * its tokens in increasing order, each token once: a repeated pick counts once, with its first weight);
 * tslot [T, K] = each token's slots in increasing expert id, -1 after the last. */
typedef struct dsv4_cuda_moe_plan {
    int *nact, *act_e, *act_off, *act_cnt, *rows, *tslot;
    float *rw;
    int *gcnt; /* NULL, or scratch of DSV4_MOE_GROUP_GCNT(T, E) ints: large groups (more than 2048 picks) are then
                * planned by many blocks instead of one (the same plan) */
} dsv4_cuda_moe_plan;
#define DSV4_MOE_GROUP_GCNT(T, E) ((size_t)(((T) + 255) / 256) * (size_t)(E))

/* Builds the plan from the router's picks sel [T, K] (expert ids) and weights w [T, K]; rows t with
 * sid[t] < 0 (idle) pick nothing. T <= dsv4_cuda_moe_group_maxt(K, E) <= DSV4_MOE_GROUP_MAXT, or with p->gcnt,
 * T <= dsv4_cuda_moe_group_maxt_plan(K, E). */
#define DSV4_MOE_GROUP_MAXT 4096
int dsv4_cuda_moe_group(const int *sel, const float *w, const int *sid, int T, int K, int E,
                        const dsv4_cuda_moe_plan *p, void *stream);
/* The most tokens one moe_group call takes for E experts (a multiple of 32; its token bitmaps live in shared memory:
 * 4096 for Flash's 256 experts and Pro's 384, 2528 for 640); 0 when none fit. */
int dsv4_cuda_moe_group_maxt(int K, int E);
/* The most tokens one moe_group call takes for a plan with its gcnt scratch: any number with the many-block grouping
 * (DSV4_MOE_GROUP_BLOCKS=0 turns it off; DSV4_MOE_GROUP_T=N caps it), else dsv4_cuda_moe_group_maxt. */
int dsv4_cuda_moe_group_maxt_plan(int K, int E);
/* dsv4_cuda_router (cuda_backend.h) into sel / weight, then dsv4_cuda_moe_group of those picks into p: the same values.
 * Few tokens (T <= 8, E <= 256) in one kernel (one launch fewer on the decode chain; DSV4_CUDA_ROUTE_GROUP=0: two). */
int dsv4_cuda_moe_route(const float *logits, int T, int E, int K, const float *bias, const int *tid2eid, const int *tokens,
                        float route_scale, const int *sid, int *sel, float *weight, const dsv4_cuda_moe_plan *p, void *stream);
/* The routed experts of a plan: h[i] = SwiGLU(x[rows[i]] . w1^T, x[rows[i]] . w3^T) * rw[i] ([T*K, I]),
 * y[i] = h[i] . w2^T ([T*K, D]). One launch each over (active expert, block of output rows) with a fixed
 * shape for maxslots = min(E, T*K) experts; blocks past *nact return. FP8 / MXFP4 / NVFP4 experts with
 * columns a multiple of 128 run on tensor cores (moe_tc.cu; a warp per 32 weight rows and a column slice,
 * the expert's tokens as the mma's N); the rest through a CUDA-core kernel (a warp per weight row). Either
 * way each output value goes through the same operations in the same order whatever else shares the expert
 * (batch invariant). x [T, D]. The inputs of each product (x, h) are act-quantized as the weights'
 * act_quant asks. h and y are also scratch: with act quant and at least 16 rows per expert on average, y
 * first holds x's FP8 codes and h is replaced by its codes in place before the down projection. */
int dsv4_cuda_moe_experts(const dsv4_cuda_experts *ex, const float *x, int T, int K, const dsv4_cuda_moe_plan *p,
                          float lim, float *h, float *y, void *stream);
/* The same for a pass that is not a decode step (a prefill pass): MXFP4 experts with the FP8 act quant and enough
 * tokens an expert on the BF16 tensor-core kernels of moe_tc.h's dsv4_moe_pfb_run (exact products, other bits than a
 * decode step's, each token's outputs still independent of the others in the pass), else dsv4_cuda_moe_experts.
 * 1 when the BF16 kernels ran, 0 when the others did, -1 on an error. */
int dsv4_cuda_moe_experts_pass(const dsv4_cuda_experts *ex, const float *x, int T, int K, const dsv4_cuda_moe_plan *p,
                               float lim, float *h, float *y, void *stream);
/* For comparisons in tests and benchmarks; 0 (default): the tensor-core kernel wherever the format allows. Bits:
 * 1 every expert product through the CUDA-core kernel (the one before the tensor-core kernel); tensor-core
 * kernel with 2 an integer MXFP4 decode instead of the e4m3 convert, 4 an L2 prefetch of the weights, 8 without
 * programmatic dependent launch (all three measured slower), 32 the FP4 prefill on moe_pf2_kernel's mma.sync. Results are
 * bitwise the same with 2, 4, 8 and 32. */
void dsv4_cuda_moe_experts_path(int mode);
/* The BF16 prefill kernels' forms (tests, A/B; -1: the environment's default, read once; both 0 unless set, until
 * measured): prod 1 a producer warpgroup streams the x ring, 0 warp 0 refills it (DSV4_MOE_PFB_PRODUCER); xtok 1 the x
 * image a token at a time, 0 a slot at a time (DSV4_MOE_PFB_XTOK). Every form gives the same bits. */
void dsv4_cuda_moe_pfb_force(int prod, int xtok);
/* The BF16 prefill kernels' wgmmas as wide as a chunk's tokens (N 32 / 64 / 96 / 128: a chunk of at most 96 tokens, an
 * expert's last or only one, computes no n-tiles past them; the down projection N 64 / 128): bit 0 gate / up, bit 1 the
 * down projection, 0 off (N 128 always), -1 the environment's (DSV4_MOE_PFB_NSZ, 3 unless set: on since session 45,
 * 8K prefill 0.988x on an H100). The same bits (test_kernels --only pfb: forms 4 and 5). */
void dsv4_cuda_moe_pfb_nsz(int on);
/* The FP8 experts' (moe_f8.cuh) forms with x quantized per row (tests, A/B): the weight ring's depth of gate / up (4, 5,
 * 6) and down (4, 6, 8), the blocks a row tile's 8-token chunks are split over (1-4), the scale words 4 units at a time
 * (sg 1) or a unit at a time (0); -1: the default of each; st_gu -2: back to the environment's (DSV4_MOE_F8_ST_GU,
 * _ST_DN, _CSPLIT, _SG). Every form gives the same bits. */
void dsv4_cuda_moe_f8_force(int st_gu, int st_dn, int csplit, int sg);
/* The same experts' down projection on two 64-row tiles a warpgroup (moe_f8.cuh's GATEUP 2) where it applies (x quantized
 * per row, 8-token chunks, rows a multiple of 128): 1 on, 0 off, -1 the environment's (DSV4_MOE_F8_D2, 1 unless set to 0:
 * the default since session 43); _count: the launches that took it so far (tests). The same bits. */
void dsv4_cuda_moe_f8_d2(int on);
int dsv4_cuda_moe_f8_d2_count(void);
/* NVFP4 experts with the FP8 act quant (NVIDIA's checkpoints of the DeepSeek recipe) on the BF16 prefill kernels too: 1 on,
 * 0 off (the f16 kernels), -1 the default (DSV4_MOE_PFB_NVFP4, 0 unless set until its tests have run on a GPU). */
void dsv4_cuda_moe_pfb_nvfp4(int on);
/* out[t] = sum of y[tslot[t, j]] in increasing expert id, then + shared[t] (shared may be NULL): the
 * CPU's summation order. */
int dsv4_cuda_moe_combine(const float *y, const int *tslot, int T, int K, int D, const float *shared, float *out,
                          void *stream);
/* Tests: 1 the four-column combine (the same bits; D % 4 == 0, 16-byte aligned rows), 0 one column a thread, -1 the
 * default (four columns where the rows allow it; DSV4_MOE_COMBINE_VEC=0: one). */
void dsv4_cuda_moe_combine_vec(int mode);

#ifdef __cplusplus
}
#endif
#endif
