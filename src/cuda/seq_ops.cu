/* seq_ops.cu - the ops that read or write the sequences' device state for a batch (cuda_model.h,
 * "sequence-state ops"): per-pass tables, the compressor's token state machine (spec 8.2) with emission
 * decided from the positions, storing finished entries and window rows into the caches, attention index
 * lists (spec 10) and the device lengths. Everything a kernel needs comes from the dsv4_cuda_batch in
 * device memory, so one launch shape serves every step of a decode bucket (CUDA graphs). */
#include "common.cuh"
#include "cuda_model.h"
#include "kv_cache.cuh"

/* the layer state of row t, or NULL for an idle row */
__device__ __forceinline__ const dsv4_cuda_lstate *row_state(const dsv4_cuda_batch &b, int t, int L) {
    int s = b.sid[t];
    if (s < 0 || !b.sq[s]) return NULL;
    return &b.sq[s]->L[L];
}

/* ---- per-pass tables ---- */

__global__ void step_meta_kernel(dsv4_cuda_batch b, int nlayers, int maxlist, const uint8_t **keys, int *nc4, int *nl4) {
    dev_pdl_enter();
    int64_t g = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (g >= (int64_t)nlayers * b.T) return;
    int L = (int)(g / b.T), t = (int)(g - (int64_t)L * b.T);
    const dsv4_cuda_lstate *ls = row_state(b, t, L);
    keys[g] = ls ? ls->ibuf : NULL;
    if (L == 0) {
        const int s = b.sid[t], p = b.pos[t];
        int nc = 0, nl = 0;
        if (ls) {
            nc = (p + 1) / 4;
            nl = b.cend[s] / 4;
            if (p < b.pe[s] && b.pe[s] / 4 > nl) nl = b.pe[s] / 4;
            if (nl > maxlist) nl = maxlist;
            if (nc > nl) nc = nl;
        }
        nc4[t] = nc;
        nl4[t] = nl;
    }
}

extern "C" int dsv4_cuda_step_meta(const dsv4_cuda_batch *b, int nlayers, int maxlist, const uint8_t **keys, int *ncausal4,
                                   int *nlist4, void *stream) {
    int64_t n = (int64_t)nlayers * b->T;
    if (n <= 0) return 0;
    dev_launch(step_meta_kernel, (unsigned)((n + 255) / 256), 256, 0, DSV4_STREAM(stream), *b, nlayers, maxlist, keys, ncausal4,
               nlist4);
    return dsv4_cuda_check_launch("step_meta");
}

/* ---- compressor state machine (twin: compress_tokens() of src/model/forward_attn.c) ----
 * The state is separable by channel: channel ch only ever touches columns ch (and d+ch for the overlap's B half) of
 * the pending rows. A window's entry depends only on its own rows (and, with overlap, the previous window's), so every
 * emission of a pass is computed at once from the chunk's rows and the state as it was before the pass
 * (cmp_emit_kernel: a block of channels per row), then the state is advanced to the pass's end (cmp_state_kernel: a
 * thread per (pending row, column) of a slot). The sums run over the same values in the same order as the token loop
 * of the twin, so the results do not depend on how the tokens were cut into passes. */

/* Pending row k's value for column col as emission at position p reads it: the pass's own row (kvp / scp + ape) when
 * the position is in the pass, else the state before the pass (rows of a window that straddles the pass start, or the
 * previous window's copy in rows 0..m-1 when that window closed before the pass). */
__device__ __forceinline__ void cmp_value(const float *kvp, const float *scp, const float *ape, const float *skv,
                                          const float *ssc, int64_t off, int pos0, int p, int k, int mr, int cd, int col,
                                          int overlap, float &kv, float &sc) {
    const int q = overlap ? p + 1 - 2 * mr + k : p + 1 - mr + k; /* the position row k holds */
    if (q >= pos0) {
        const int64_t ti = off + (q - pos0);
        kv = kvp[ti * cd + col];
        sc = __fadd_rn(scp[ti * cd + col], ape[(int64_t)(q % mr) * cd + col]);
        return;
    }
    int row = k; /* the window of p (or, without overlap, the only one): rows as they were at the pass start */
    if (overlap && (k >= mr || p - mr >= pos0)) row = mr + (k % mr); /* straddling the pass start: not yet copied */
    kv = skv[(int64_t)row * cd + col];
    sc = ssc[(int64_t)row * cd + col];
}

__global__ void cmp_emit_kernel(dsv4_cuda_batch b, int L, int which, const float *kvp, const float *scp, const float *ape,
                                int mr, int d, int overlap, float *ent, int *rpos) {
    dev_pdl_enter();
    const int t = blockIdx.y, ch = blockIdx.x * blockDim.x + threadIdx.x;
    const int s = b.sid[t];
    if (s < 0 || !b.sq[s] || b.n[s] <= 0) return;
    const int pos0 = b.p0[s], p = b.pos[t];
    if (blockIdx.x == 0 && threadIdx.x == 0) rpos[t] = (p + 1) % mr ? 0 : p + 1 - mr;
    if (ch >= d || (p + 1) % mr) return;
    const dsv4_cuda_lstate *ls = &b.sq[s]->L[L];
    const float *skv = which ? ls->ikv : ls->ckv, *ssc = which ? ls->isc : ls->csc;
    const int64_t off = b.off[s];
    const int cd = (overlap ? 2 : 1) * d, nslot = overlap ? 2 * mr : mr;
    float kv, sc;
    float mx = -INFINITY;
    for (int k = 0; k < nslot; k++) {
        cmp_value(kvp, scp, ape, skv, ssc, off, pos0, p, k, mr, cd, overlap && k >= mr ? d + ch : ch, overlap, kv, sc);
        mx = fmaxf(mx, sc);
    }
    float den = 0;
    for (int k = 0; k < nslot; k++) {
        cmp_value(kvp, scp, ape, skv, ssc, off, pos0, p, k, mr, cd, overlap && k >= mr ? d + ch : ch, overlap, kv, sc);
        den = __fadd_rn(den, sc == -INFINITY ? 0.0f : expf(__fsub_rn(sc, mx)));
    }
    double acc = 0;
    for (int k = 0; k < nslot; k++) {
        cmp_value(kvp, scp, ape, skv, ssc, off, pos0, p, k, mr, cd, overlap && k >= mr ? d + ch : ch, overlap, kv, sc);
        const float w = sc == -INFINITY ? 0.0f : expf(__fsub_rn(sc, mx));
        acc += (double)__fdiv_rn(w, den) * kv;
    }
    ent[(int64_t)t * d + ch] = (float)acc;
}

/* The state at the end of the pass: pending row (mr +) r holds the pass's last position r mod m (if any); with overlap,
 * rows 0..m-1 the window of the pass's last emission (if any), copied as the token loop copies it. */
__global__ void cmp_state_kernel(dsv4_cuda_batch b, int L, int which, const float *kvp, const float *scp, const float *ape,
                                 int mr, int d, int overlap) {
    dev_pdl_enter();
    const int s = blockIdx.y;
    if (!b.sq[s] || b.n[s] <= 0) return;
    const int cd = (overlap ? 2 : 1) * d;
    const int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (e >= (int64_t)mr * cd) return;
    const int k = (int)(e / cd), col = (int)(e - (int64_t)k * cd);
    const dsv4_cuda_lstate *ls = &b.sq[s]->L[L];
    float *skv = which ? ls->ikv : ls->ckv, *ssc = which ? ls->isc : ls->csc;
    const int pos0 = b.p0[s], last = pos0 + b.n[s] - 1;
    const int64_t off = b.off[s], cur = (int64_t)(overlap ? mr + k : k) * cd + col;
    auto chunk = [&](int q, float &kv, float &sc) {
        const int64_t ti = off + (q - pos0);
        kv = kvp[ti * cd + col];
        sc = __fadd_rn(scp[ti * cd + col], ape[(int64_t)(q % mr) * cd + col]);
    };
    const float okv = skv[cur], osc = ssc[cur];
    const int ql = last - (((last - k) % mr) + mr) % mr; /* the last position p <= last with p mod m == k */
    float nkv = okv, nsc = osc;
    if (ql >= pos0) chunk(ql, nkv, nsc);
    if (overlap) {
        const int pe = last - (last + 1) % mr; /* the last emission of the pass */
        if (pe >= pos0) {
            const int q = pe + 1 - mr + k;
            float ckv = okv, csc = osc;
            if (q >= pos0) chunk(q, ckv, csc);
            skv[(int64_t)k * cd + col] = ckv;
            ssc[(int64_t)k * cd + col] = csc;
        }
    }
    skv[cur] = nkv;
    ssc[cur] = nsc;
}

static int cmp_args(const dsv4_cuda_batch *b, int mr, int d, const char *op) {
    if (mr <= 0 || d <= 0 || b->S < 0 || b->T < 0 || b->T > 65535)
        return dsv4_cuda_fail("%s: bad arguments (m %d d %d T %d)", op, mr, d, b->T);
    return 0;
}

extern "C" int dsv4_cuda_cmp_emit(const dsv4_cuda_batch *b, int L, int which, const float *kvp, const float *scp,
                                  const float *ape, int mr, int d, int overlap, float *ent, int *rpos, void *stream) {
    if (cmp_args(b, mr, d, "cmp_emit")) return -1;
    if (!b->S || !b->T) return 0;
    dev_launch(cmp_emit_kernel, dim3((d + 127) / 128, b->T), 128, 0, DSV4_STREAM(stream), *b, L, which, kvp, scp, ape, mr, d, overlap,
               ent, rpos);
    return dsv4_cuda_check_launch("cmp_emit");
}

extern "C" int dsv4_cuda_cmp_state(const dsv4_cuda_batch *b, int L, int which, const float *kvp, const float *scp,
                                   const float *ape, int mr, int d, int overlap, void *stream) {
    if (cmp_args(b, mr, d, "cmp_state")) return -1;
    if (!b->S || !b->T) return 0;
    const int64_t ne = (int64_t)mr * (overlap ? 2 : 1) * d;
    dev_launch(cmp_state_kernel, dim3((unsigned)((ne + 255) / 256), b->S), 256, 0, DSV4_STREAM(stream), *b, L, which, kvp, scp, ape,
               mr, d, overlap);
    return dsv4_cuda_check_launch("cmp_state");
}

extern "C" int dsv4_cuda_cmp_batch(const dsv4_cuda_batch *b, int L, int which, const float *kvp, const float *scp,
                                   const float *ape, int mr, int d, int overlap, float *ent, int *rpos, void *stream) {
    if (dsv4_cuda_cmp_emit(b, L, which, kvp, scp, ape, mr, d, overlap, ent, rpos, stream)) return -1;
    return dsv4_cuda_cmp_state(b, L, which, kvp, scp, ape, mr, d, overlap, stream);
}

/* ---- row copies into the caches: one block per row ---- */

__global__ void cmp_store_kernel(dsv4_cuda_batch b, int L, int which, const float *ent, int mr, int d, int R, int W) {
    dev_pdl_enter();
    const int t = blockIdx.x;
    const dsv4_cuda_lstate *ls = row_state(b, t, L);
    const int p = b.pos[t];
    if (!ls || (p + 1) % mr) return;
    const int w = (p + 1) / mr - 1;
    if (threadIdx.x >= 32) return;
    if (which) {
        dev_ikey_pack_row_warp(ent + (int64_t)t * d, d, ls->ibuf + (int64_t)w * dsv4_ikey_row_bytes(d));
    } else {
        dev_kv_pack_row_warp(ent + (int64_t)t * d, d, R, ls->abuf + (int64_t)(W + w) * dsv4_kv_row_bytes(d, R));
    }
}

extern "C" int dsv4_cuda_cmp_store(const dsv4_cuda_batch *b, int L, int which, const float *ent, int mr, int d, int R,
                                   int W, void *stream) {
    if (mr <= 0 || d <= 0 || (which ? d % 32 : d <= R || (d - R) % 64))
        return dsv4_cuda_fail("cmp_store: bad arguments (m %d d %d R %d)", mr, d, R);
    if (b->T <= 0) return 0;
    dev_launch(cmp_store_kernel, b->T, 32, 0, DSV4_STREAM(stream), *b, L, which, ent, mr, d, R, W);
    return dsv4_cuda_check_launch("cmp_store");
}

/* a block of RS_THREADS per row: warp w packs the 64-blocks w, w + RS_THREADS / 32, .. of dev_kv_pack_row_warp (the
 * same operations per byte), the rope dims over all threads; the row's values are loaded before the slot is found */
#define RS_THREADS 256
__global__ void __launch_bounds__(RS_THREADS) ring_store_kernel(dsv4_cuda_batch b, int L, const float *kv, int W, int Dh, int R) {
    dev_pdl_enter();
    const int t = blockIdx.x, tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, nope = Dh - R, nb = nope / 64;
    const float *src = kv + (int64_t)t * Dh;
    const float v0 = warp < nb ? src[warp * 64 + lane] : 0.0f, v1 = warp < nb ? src[warp * 64 + 32 + lane] : 0.0f;
    const float vr = tid < R ? src[nope + tid] : 0.0f;
    const dsv4_cuda_lstate *ls = row_state(b, t, L);
    if (!ls) return;
    const int s = b.sid[t], p = b.pos[t];
    if (p < b.p0[s] + b.n[s] - W) return; /* a later row of the chunk takes this slot */
    uint8_t *dst = ls->abuf + (int64_t)(p % W) * dsv4_kv_row_bytes(Dh, R);
    for (int blk = warp; blk < nb; blk += RS_THREADS / 32) {
        const float a0 = blk == warp ? v0 : src[blk * 64 + lane], a1 = blk == warp ? v1 : src[blk * 64 + 32 + lane];
        const float a = warp_max(fmaxf(fabsf(a0), fabsf(a1)));
        const float sc = dev_pow2_ceil(fmaxf(a, 1e-4f) * (1.0f / 448.0f));
        dst[blk * 64 + lane] = (uint8_t)__nv_cvt_float_to_fp8(a0 / sc, __NV_SATFINITE, __NV_E4M3); /* exact: a power of two */
        dst[blk * 64 + 32 + lane] = (uint8_t)__nv_cvt_float_to_fp8(a1 / sc, __NV_SATFINITE, __NV_E4M3);
        if (lane == 0) dst[nope + blk] = dev_e8m0_code(sc);
    }
    uint16_t *rp = (uint16_t *)(dst + dsv4_kv_rope_off(Dh, R));
    for (int j = tid; j < R; j += RS_THREADS) rp[j] = __bfloat16_as_ushort(__float2bfloat16_rn(j == tid ? vr : src[nope + j]));
}

extern "C" int dsv4_cuda_ring_store(const dsv4_cuda_batch *b, int L, const float *kv, int W, int Dh, int R,
                                    void *stream) {
    if (W <= 0 || Dh <= R || (Dh - R) % 64) return dsv4_cuda_fail("ring_store: bad arguments (W %d Dh %d R %d)", W, Dh, R);
    if (b->T <= 0) return 0;
    dev_launch(ring_store_kernel, b->T, RS_THREADS, 0, DSV4_STREAM(stream), *b, L, kv, W, Dh, R);
    return dsv4_cuda_check_launch("ring_store");
}

/* ---- attention index lists: one block of 256 threads per query row, a thread per list position ---- */

__global__ void attn_index_kernel(dsv4_cuda_batch b, int L, int W, int ratio, const int *sel, const int *nsel, int ksel,
                                  int nidx, int *idx, const uint8_t **qbase) {
    dev_pdl_enter();
    const int t = blockIdx.x, p = b.pos[t], ns = ratio == 4 && sel ? nsel[t] : 0; /* loaded beside the state's chain */
    const dsv4_cuda_lstate *ls = row_state(b, t, L);
    int *it = idx + (int64_t)t * nidx;
    if (!ls) {
        for (int i = threadIdx.x; i < nidx; i += blockDim.x) it[i] = -1;
        if (threadIdx.x == 0) qbase[t] = NULL;
        return;
    }
    const int s = b.sid[t], p0 = b.p0[s], row0 = b.off[s];
    const int nw = p + 1 < W ? p + 1 : W, first = p - nw + 1;
    int ne = 0;
    if (ratio == 4 && sel) ne = ns;
    else if (ratio > 0) ne = (p + 1) / ratio;
    if (nw + ne > nidx) ne = nidx - nw; /* the caller sizes nidx for the longest list; never taken */
#pragma unroll 4
    for (int i = threadIdx.x; i < nidx; i += blockDim.x) { /* unrolled: the sel loads of 4 positions in flight at once */
        int id = -1;
        if (i < nw) {
            int pp = first + i;
            id = pp >= p0 ? -(row0 + pp - p0) - 2 : pp % W;
        } else if (i < nw + ne) {
            int w = i - nw;
            id = W + (ratio == 4 && sel ? sel[(int64_t)t * ksel + w] : w);
        }
        it[i] = id;
    }
    if (threadIdx.x == 0) qbase[t] = ls->abuf;
}

extern "C" int dsv4_cuda_attn_index(const dsv4_cuda_batch *b, int L, int W, int ratio, const int *sel, const int *nsel,
                                    int ksel, int nidx, int *idx, const uint8_t **qbase, void *stream) {
    if (W <= 0 || nidx < W || ratio < 0) return dsv4_cuda_fail("attn_index: bad arguments (W %d nidx %d)", W, nidx);
    if (b->T <= 0) return 0;
    dev_launch(attn_index_kernel, b->T, 256, 0, DSV4_STREAM(stream), *b, L, W, ratio, sel, nsel, ksel, nidx, idx, qbase);
    return dsv4_cuda_check_launch("attn_index");
}

/* ---- device lengths ---- */

__global__ void seq_advance_kernel(dsv4_cuda_batch b) {
    dev_pdl_enter();
    int s = blockIdx.x * blockDim.x + threadIdx.x;
    if (s < b.S && b.sq[s] && b.n[s] > 0) b.sq[s]->len = b.p0[s] + b.n[s];
}

extern "C" int dsv4_cuda_seq_advance(const dsv4_cuda_batch *b, void *stream) {
    if (b->S <= 0) return 0;
    dev_launch(seq_advance_kernel, (b->S + 127) / 128, 128, 0, DSV4_STREAM(stream), *b);
    return dsv4_cuda_check_launch("seq_advance");
}
