/* gpu_internal.h - what the host files of the GPU forward share (plain C): the uploaded model
 * (gpu_model.c), sequences (gpu_seq.c), the workspace of one pass and the layer forward
 * (forward_cuda.c), the decode-step graphs (decode_graph.c). */
#ifndef DSV4_CUDA_GPU_INTERNAL_H
#define DSV4_CUDA_GPU_INTERNAL_H

#include <stdio.h>

#include "../model/model.h"
#include "cuda_model.h"

typedef struct gcomp {
    dsv4_cuda_weight wkv, wgate;
    float *ape, *norm;
} gcomp;

typedef struct glayer {
    float *rope_freq;
    dsv4_cuda_weight hc_attn_fn, hc_ffn_fn;
    float *hc_attn_base, *hc_attn_scale, *hc_ffn_base, *hc_ffn_scale, *attn_norm, *ffn_norm;
    dsv4_cuda_weight wq_a, wq_b, wkv, wo_a, wo_b;
    float *q_norm, *kv_norm, *attn_sink;
    float *wo_a_f16s; /* prefill's wo_a on one f16 term: {2^-s, 2^(s + shift), 0} (dsv4_cuda_wo_a_f16_scale); NULL: none */
    gcomp cmp, idx_cmp;
    dsv4_cuda_weight idx_wq_b, idx_wproj;
    dsv4_cuda_weight gate;
    float *gate_bias;
    int *tid2eid;
    dsv4_cuda_experts ex; /* routed experts (device descriptor arrays) */
    dsv4_cuda_weight sw1, sw2, sw3;
    int nidx;             /* attention list length: W + min(top-k, capacity/4) | W + capacity/ratio | W */
} glayer;

/* one uploaded stored tensor (views of fused tensors share it) */
typedef struct urec {
    const uint8_t *hdata, *hscale;
    uint8_t *ddata, *dscale;
    size_t dbytes, sbytes;
} urec;

/* The device workspace of one pass of T token rows, carved from the model's arena (the same offsets
 * for the same T, so a captured graph keeps pointing at the right places). */
typedef struct gws {
    int T, qg, tg, hr; /* rows; indexer query group, MoE token group, head rows per pass of the head */
    float *X, *X2, *hmix, *x, *y, *post, *comb, *qr, *q, *kv, *o, *kvp, *scp, *ent, *qi, *wt, *scores, *og, *zg, *z;
    float *ikvp, *iscp; /* the indexer compressor's projections (its linears run with the attention compressor's) */
    float *ient;        /* the indexer compressor's entries (ent: the attention compressor's; both may run at once) */
    float *lgE, *ew, *gg, *uu, *ye, *hs, *ys, *hy, *hrow, *logits;
    int *rpos, *irpos, *sel, *nsel, *idx, *rsel, *nc4, *nl4;
    void *tkscratch; /* the top-k's tie path: qg rows of capacity / 4 (value, index) pairs */
    const uint8_t **keys;
    const uint8_t **qbase; /* [T] the attention cache (abuf) of each row's sequence */
    float *ascr;           /* attention split partials (dsv4_cuda_attn_kv8) for up to GW_ATTN rows */
    void *hcs;             /* mHC pre / head partials (dsv4_cuda_hc_scratch_bytes) */
    dsv4_cuda_moe_plan plan;
    void *lws;       /* multi-token linears' x staging (dsv4_cuda_linear_ws; NULL below DSV4_CUDA_LINEAR_WS_MIN_T rows) */
    size_t lwsb;
    void *gemm_ws;   /* FP8 prefill GEMM workspace (linear_gemm.h; NULL when off or T < its minimum) */
    size_t gemm_wsb;
    int gemm;        /* route FP8 act-quant linears through the GEMM: set only for passes that are not decode steps */
    int attn_tc;     /* attention on tensor cores (dsv4_cuda_attn_kv8_tc): set only for passes that are not decode steps */
} gws;

/* Where the arrays of a pass's step input (dsv4_cuda_batch) sit in the step buffer. */
typedef struct gstepl {
    size_t tok, pos, sid, p0, n, off, cend, pe, sq, bytes;
} gstepl;

#define DSV4_CUDA_TMAX_DEFAULT 4096 /* rows of a prefill pass (DSV4_CUDA_TMAX overrides) */
#define DSV4_CUDA_TMAX_BIG 8192     /* ... or this many where the workspace fits easily (gpu_model.c: tmax_default) */
#define GW_ATTN 64 /* attention rows per call (bounds ascr) */
#define DSV4_CUDA_HC_PP_T 32 /* passes of fewer rows keep a second copy of the mHC streams (w->X2): posts out of place, fused into the next pre */
#define GW_ATTN_TC_MIN 64 /* rows from which a pass (not a decode step) runs its attention on tensor cores */

#define GB_N 11 /* decode buckets 1, 2, 4, .. 1024 */
#define GB_MAX DSV4_CUDA_DECODE_MAX

typedef struct gbucket {
    void *layers, *head; /* executable graphs (NULL until first use) */
    void *samp;          /* the device sampler over the head's logits (n_vocab is baked in: samp_nv) */
    int samp_nv;
    int failed;          /* captures of this bucket that failed */
} gbucket;

struct dsv4_cuda_model {
    dsv4_model *m;
    glayer *L;
    dsv4_cuda_weight embed, head, hc_head_fn;
    float *norm, *hc_head_base, *hc_head_scale;
    void **bufs; /* every device allocation of the weights */
    int nbufs, capbufs;
    urec *ur;    /* hash table of uploaded tensors */
    size_t nur;
    void *stream;
    void *stream2, *ev_fork, *ev_join, *ev_tail; /* the parallel branches of a layer (forward_cuda.c: the indexer
                                                  * or compressor or query heads in attention, the shared expert in
                                                  * moe): their stream, fork / join events; ev_tail: the end of the
                                                  * tail work (window ring store, pending rows) enqueued on stream2 */
    int tail;    /* tail work on stream2 not yet waited for by the main stream */
    void *stream3, *ev_hc, *ev_hcd; /* small decode passes: each sub-block's mHC post / comb (the Sinkhorn) beside its
                                     * work (forward_cuda.c, sub_block): the stream, its fork and done events */
    int hc_pend; /* that work not yet waited for by the main stream */
    int sh_early; /* the shared expert's branch forked before the gate (DSV4_CUDA_SHARED_EARLY=0: after the router) */
    int idxq_main;  /* ratio-4 layers' indexer query projection on the main stream (DSV4_CUDA_IDXQ_MAIN=0: stream2) */
    int wo_a_f16;   /* prefill passes' wo_a on one f16 term where a layer has its scales (DSV4_WO_A_F16=0: off) */
    int hc_defer; /* DSV4_CUDA_HC_DEFER=0: the Sinkhorn in line, in the finishing kernel */
    int combine_defer; /* most tokens of a pass whose routed experts' combine the next post kernel does (0: never) */
    int cap;     /* context capacity of every sequence */
    int tmax;    /* most token rows of one pass */
    int qgmax;   /* most queries per indexer score block */
    uint8_t *arena;        /* workspace, sized for tmax rows */
    uint8_t *dstep, *hstep; /* step input: device, pinned host mirror (tmax rows and slots) */
    size_t step_bytes;
    int graphs;            /* decode steps through CUDA graphs */
    int attn_fork;         /* attention's branches on stream2 in small decode steps (DSV4_CUDA_ATTN_FORK=0: serial) */
    int capturing;
    gbucket bk[GB_N];
    int last_bucket;       /* bucket of the last decode step (-1: none) */
    dsv4_cuda_sample_params *dsp, *hsp; /* [GB_MAX] sampling parameters of a step: device, pinned host */
    int32_t *dids, *hids;               /* [GB_MAX] sampled ids: device, pinned host */
    struct gprof *prof;                 /* an open op profile (op_profile.c), else NULL */
    void **spool;       /* freed sequences' device states, kept for the next sequences (gpu_seq.c): a server's
                         * admissions and completions then allocate and free nothing on the device */
    int nspool, capspool;
};

struct dsv4_cuda_seq {
    dsv4_cuda_model *g;
    int pos, prefill_end;
    void *mem;             /* one device allocation: the seqdev, its layer states, every cache */
    dsv4_cuda_seqdev *dev; /* at the start of mem */
};

/* gpu_seq.c: frees the pool of freed sequences' states (the model's end) */
void gpu_seq_pool_free(dsv4_cuda_model *g);

/* forward_cuda.c */
size_t gpu_ws_bytes(const dsv4_cuda_model *g, int T);
void gpu_ws_carve(const dsv4_cuda_model *g, int T, gws *w);
void gpu_step_layout(int T, int S, gstepl *l);
dsv4_cuda_batch gpu_batch_at(const dsv4_cuda_model *g, int T, int S);
/* embedding, every layer, device lengths: pure enqueue (capturable) */
int gpu_run_layers(dsv4_cuda_model *g, const gws *w, const dsv4_cuda_batch *b);
/* decode head: HcHead, final norm and head of all T rows of a pass -> w->logits (capturable) */
int gpu_run_head(dsv4_cuda_model *g, const gws *w, int T);
/* -1, with a message naming file and line (gpu_err); DSV4_CUDA_DEBUG=1 synchronizes after every op */
int gpu_fail(const char *file, int line, const char *what);
const char *gpu_err(void);
void gpu_err_clear(void);
/* 0 when every id of next [n] is a token; else -2 with "<what>: sequence s: the logits are NaN or +inf | all -inf" for
 * the first that is not (dsv4_cuda_sample's -1 / -2) */
int gpu_ids_ok(const int32_t *next, int n, const char *what, char *err, size_t errcap);

/* decode_graph.c: a step of nseq sequences with one token each at most (count of tokens 1 .. GB_MAX) */
int gpu_decode(dsv4_cuda_model *g, int nseq, dsv4_cuda_seq *const *seqs, const int32_t *const *tokens, const int *ntok,
               float *logits, int mode);

/* op_profile.c: per-op times of forwards run without graphs while a profile is open */
/* what: "decode" or "prefill"; an external profiler's range (dsv4_cuda_profiler_range) is opened for it unless
 * DSV4_PROFILER_RANGE names the other one (bench/ncu_profile.sh) */
int gprof_open(dsv4_cuda_model *g, const char *what);
void gprof_run_begin(dsv4_cuda_model *g);            /* a new run (forward) starts */
void gprof_layer(dsv4_cuda_model *g, int ltype);     /* the ops that follow belong to a layer of this ratio (-1: none, -2: head) */
void gprof_mark(dsv4_cuda_model *g, const char *call, int line); /* after each op */
/* the table to out (if not NULL), the per-run split to sp (if not NULL); frees */
void gprof_close(dsv4_cuda_model *g, FILE *out, const char *title, dsv4_cuda_prof_split *sp);

#endif
