/* forward_attn.c - one attention sub-layer for a batch of sequence chunks (spec 7-10):
 * q/kv projections, the compressor (CSA with overlap, HCA), the lightning indexer, sparse attention
 * with sinks over window + compressed entries, inverse RoPE and the grouped output projection.
 *
 * Chunks of any length at any position are handled by running the compressors token by token
 * through the decode state machine of spec 8.2 (which emits exactly the entries the one-shot
 * prefill of 8.1 does), and by reading window keys older than the chunk from the sequence's ring. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../cpu/ops.h"
#include "../cpu/topk.h"
#include "../quant/formats.h"
#include "state.h"

#define ALLOC(n) malloc(sizeof(float) * (size_t)(n))

/* Feeds n tokens (projections kvp/scp [n, c*d], positions pos0..) through a compressor state,
 * appending every completed entry (normalized, RoPE'd at the window's first position, and rounded
 * as spec 8 step 3 says). */
static int compress_tokens(const dsv4_model *m, const dsv4_compressor *cm, const float *freq, int rotate,
                           dsv4_cmp_state *st, const float *kvp, const float *scp, int pos0, int n) {
    const int mr = cm->ratio, d = cm->d, cd = (cm->overlap ? 2 : 1) * d, R = m->cfg.rope_head_dim;
    const int nslot = cm->overlap ? 2 * mr : mr;
    if (dsv4_cmp_state_reserve(st, d, (pos0 % mr + n) / mr + 1)) return -1;
    float *w = ALLOC(nslot);
    for (int i = 0; i < n; i++) {
        int p = pos0 + i, r = p % mr, row = cm->overlap ? mr + r : r;
        memcpy(st->kv + (size_t)row * cd, kvp + (size_t)i * cd, sizeof(float) * (size_t)cd);
        for (int j = 0; j < cd; j++) st->sc[(size_t)row * cd + j] = scp[(size_t)i * cd + j] + cm->ape[(size_t)r * cd + j];
        if ((p + 1) % mr) continue;
        float *e = st->ent + (size_t)st->n * d;
        for (int ch = 0; ch < d; ch++) {
            /* slot s: overlap -> rows 0..m-1 A half (col ch), rows m..2m-1 B half (col d+ch) */
            float mx = -INFINITY;
            for (int s = 0; s < nslot; s++) {
                int col = cm->overlap && s >= mr ? d + ch : ch;
                w[s] = st->sc[(size_t)s * cd + col];
                mx = fmaxf(mx, w[s]);
            }
            /* as torch: probabilities normalized first, then the weighted sum */
            float den = 0;
            for (int s = 0; s < nslot; s++) den += (w[s] = w[s] == -INFINITY ? 0.0f : expf(w[s] - mx));
            double acc = 0;
            for (int s = 0; s < nslot; s++) {
                int col = cm->overlap && s >= mr ? d + ch : ch;
                acc += (double)(w[s] / den) * st->kv[(size_t)s * cd + col];
            }
            e[ch] = (float)acc;
        }
        dsv4_cpu_rmsnorm(e, d, cm->norm, m->cfg.norm_eps);
        dsv4_cpu_rope(e, d, R / 2, freq, p + 1 - mr, 0);
        if (rotate) {
            dsv4_hadamard(e, (size_t)d);
            dsv4_act_quant_fp4(e, (size_t)d, 32);
        } else {
            dsv4_act_quant_fp8(e, (size_t)(d - R), 64);
        }
        st->n++;
        if (cm->overlap) {
            memcpy(st->kv, st->kv + (size_t)mr * cd, sizeof(float) * (size_t)mr * cd);
            memcpy(st->sc, st->sc + (size_t)mr * cd, sizeof(float) * (size_t)mr * cd);
        }
    }
    free(w);
    return 0;
}

/* Projects x through a compressor and feeds every sequence's tokens to its state. */
static int run_compressor(const dsv4_model *m, const dsv4_batch *b, const dsv4_compressor *cm, const float *freq,
                          int rotate, int L, int which, const float *x) {
    int cd = (cm->overlap ? 2 : 1) * cm->d;
    float *kvp = ALLOC((size_t)b->T * cd), *scp = ALLOC((size_t)b->T * cd);
    int rc = 0;
    dsv4_cpu_linear(&cm->wkv, x, b->T, kvp);
    dsv4_cpu_linear(&cm->wgate, x, b->T, scp);
    for (int s = 0; s < b->nseq && !rc; s++) {
        dsv4_layer_state *ls = &b->seq[s]->ls[L];
        dsv4_cmp_state *st = which ? &ls->idx : &ls->cmp;
        rc = compress_tokens(m, cm, freq, rotate, st, kvp + (size_t)b->off[s] * cd, scp + (size_t)b->off[s] * cd,
                             b->pos0[s], b->n[s]);
    }
    free(kvp);
    free(scp);
    return rc;
}

/* Indexer top-k (spec 9 steps 5-7) for one query that sees `ncausal` entries, in a list of `n`
 * (n >= ncausal): as in the official prefill, later entries score -inf, k = min(index_topk, n), and
 * picks of masked entries are dropped. n only matters for exact ties (see topk.h). Writes entry numbers to sel, returns how
 * many. qi [Hi, Di] rotated and FP4-rounded, wt [Hi] scaled weights, sc [n] scratch. */
static int indexer_topk(const dsv4_model *m, const dsv4_cmp_state *keys, int n, int ncausal, const float *qi,
                        const float *wt, int *sel, float *sc) {
    const int Hi = m->cfg.index_n_heads, Di = m->cfg.index_head_dim;
    for (int w = 0; w < n; w++) {
        if (w >= ncausal) {
            sc[w] = -INFINITY;
            continue;
        }
        const float *k = keys->ent + (size_t)w * Di;
        float s = 0;
        for (int h = 0; h < Hi; h++) {
            float dot = 0;
            for (int j = 0; j < Di; j++) dot += qi[(size_t)h * Di + j] * k[j];
            s += wt[h] * (dot > 0 ? dot : 0);
        }
        sc[w] = s;
    }
    int k = m->cfg.index_topk < n ? m->cfg.index_topk : n, kept = 0;
    dsv4_topk_torch(sc, n, k, sel);
    for (int i = 0; i < k; i++)
        if (sel[i] < ncausal) sel[kept++] = sel[i];
    return kept;
}

int dsv4_attention_fwd(const dsv4_model *m, int L, const dsv4_batch *b, const float *x, float *out) {
    const dsv4_config *c = &m->cfg;
    const dsv4_layer *ly = &m->layers[L];
    const int T = b->T, H = c->n_heads, Dh = c->head_dim, R = c->rope_head_dim, Lq = c->q_lora_rank;
    const int W = c->window_size, G = c->o_groups, Ro = c->o_lora_rank;
    const int Hi = c->index_n_heads, Di = c->index_head_dim;
    int rc = 0;

    /* q and kv (spec 7 steps 1-4) */
    float *qr = ALLOC((size_t)T * Lq), *q = ALLOC((size_t)T * H * Dh), *kv = ALLOC((size_t)T * Dh);
    dsv4_cpu_linear(&ly->wq_a, x, T, qr);
    for (int t = 0; t < T; t++) dsv4_cpu_rmsnorm(qr + (size_t)t * Lq, Lq, ly->q_norm, c->norm_eps);
    dsv4_cpu_linear(&ly->wq_b, qr, T, q);
    dsv4_cpu_linear(&ly->wkv, x, T, kv);
#pragma omp parallel for schedule(static) if (T > 1)
    for (int t = 0; t < T; t++) {
        for (int h = 0; h < H; h++) {
            float *qh = q + ((size_t)t * H + h) * Dh;
            dsv4_cpu_rmsnorm(qh, Dh, NULL, c->norm_eps);
            dsv4_cpu_rope(qh, Dh, R / 2, ly->rope_freq, b->pos[t], 0);
        }
        float *k = kv + (size_t)t * Dh;
        dsv4_cpu_rmsnorm(k, Dh, ly->kv_norm, c->norm_eps);
        dsv4_cpu_rope(k, Dh, R / 2, ly->rope_freq, b->pos[t], 0);
        dsv4_act_quant_fp8(k, (size_t)(Dh - R), 64);
    }

    /* compressor and indexer keys: run before attention, entries become visible by causality */
    float *qi = NULL, *wt = NULL;
    if (ly->ratio > 0) rc = run_compressor(m, b, &ly->cmp, ly->rope_freq, 0, L, 0, x);
    if (!rc && ly->ratio == 4) {
        rc = run_compressor(m, b, &ly->idx_cmp, ly->rope_freq, 1, L, 1, x);
        qi = ALLOC((size_t)T * Hi * Di);
        wt = ALLOC((size_t)T * Hi);
        dsv4_cpu_linear(&ly->idx_wq_b, qr, T, qi);
        dsv4_cpu_linear(&ly->idx_wproj, x, T, wt);
        const float wscale = 1.0f / sqrtf((float)Di) / sqrtf((float)Hi);
        for (int t = 0; t < T; t++) {
            for (int h = 0; h < Hi; h++) {
                float *v = qi + ((size_t)t * Hi + h) * Di;
                dsv4_cpu_rope(v, Di, R / 2, ly->rope_freq, b->pos[t], 0);
                dsv4_hadamard(v, (size_t)Di);
                dsv4_act_quant_fp4(v, (size_t)Di, 32);
                wt[(size_t)t * Hi + h] *= wscale;
            }
        }
    }
    if (rc) goto done;

    /* sparse attention per query (spec 7.1, 10) */
    float *o = ALLOC((size_t)T * H * Dh);
    const float scale = 1.0f / sqrtf((float)Dh);
#pragma omp parallel if (T > 1)
    {
        int maxc = 0;
        for (int s = 0; s < b->nseq; s++) {
            const dsv4_layer_state *ls = &b->seq[s]->ls[L];
            if (ls->cmp.n > maxc) maxc = ls->cmp.n;
        }
        const float **keys = malloc(sizeof(float *) * (size_t)(W + maxc + 1));
        int *sel = malloc(sizeof(int) * (size_t)(maxc + 1 + m->cfg.index_topk));
        int maxn = maxc;
        for (int s = 0; s < b->nseq; s++) {
            int pe = b->seq[s]->prefill_end / (ly->ratio ? ly->ratio : 1);
            if (pe > maxn) maxn = pe;
        }
        float *buf = malloc(sizeof(float) * (size_t)(maxn + 1));
#pragma omp for schedule(dynamic, 1)
        for (int t = 0; t < T; t++) {
            int s = b->sid[t], p = b->pos[t], p0 = b->pos0[s];
            const dsv4_layer_state *ls = &b->seq[s]->ls[L];
            int n = 0;
            for (int pp = p - W + 1 < 0 ? 0 : p - W + 1; pp <= p; pp++)
                keys[n++] = pp >= p0 ? kv + (size_t)(b->off[s] + pp - p0) * Dh : ls->win + (size_t)(pp % W) * Dh;
            if (ly->ratio > 0) {
                int ncausal = (p + 1) / ly->ratio;
                if (ncausal > ls->cmp.n) ncausal = ls->cmp.n;
                if (ly->ratio == 4) {
                    /* the list the reference's top-k sees: all entries of this call, or of the
                     * whole prompt when this chunk is part of a longer one */
                    int nlist = ls->idx.n;
                    if (p < b->seq[s]->prefill_end && b->seq[s]->prefill_end / 4 > nlist) nlist = b->seq[s]->prefill_end / 4;
                    int k = indexer_topk(m, &ls->idx, nlist, ncausal, qi + (size_t)t * Hi * Di, wt + (size_t)t * Hi, sel, buf);
                    for (int i = 0; i < k; i++) keys[n++] = ls->cmp.ent + (size_t)sel[i] * Dh;
                } else {
                    for (int w = 0; w < ncausal; w++) keys[n++] = ls->cmp.ent + (size_t)w * Dh;
                }
            }
            float *ot = o + (size_t)t * H * Dh;
            dsv4_cpu_sparse_attn(q + (size_t)t * H * Dh, H, Dh, keys, n, ly->attn_sink, scale, ot);
            for (int h = 0; h < H; h++) dsv4_cpu_rope(ot + (size_t)h * Dh, Dh, R / 2, ly->rope_freq, p, 1);
        }
        free(keys);
        free(sel);
        free(buf);
    }

    /* the chunk's raw kv goes into each sequence's window ring */
    for (int s = 0; s < b->nseq; s++) {
        dsv4_layer_state *ls = &b->seq[s]->ls[L];
        for (int i = b->n[s] > W ? b->n[s] - W : 0; i < b->n[s]; i++)
            memcpy(ls->win + (size_t)((b->pos0[s] + i) % W) * Dh, kv + (size_t)(b->off[s] + i) * Dh,
                   sizeof(float) * (size_t)Dh);
    }

    /* grouped output projection (spec 7 step 9) */
    {
        const int gin = H / G * Dh;
        float *og = ALLOC((size_t)T * gin), *zg = ALLOC((size_t)T * Ro), *z = ALLOC((size_t)T * G * Ro);
        for (int g = 0; g < G; g++) {
            dsv4_weight wg = ly->wo_a;
            wg.row0 += g * Ro;
            wg.rows = Ro;
            for (int t = 0; t < T; t++) memcpy(og + (size_t)t * gin, o + (size_t)t * H * Dh + (size_t)g * gin, sizeof(float) * (size_t)gin);
            dsv4_cpu_linear(&wg, og, T, zg);
            for (int t = 0; t < T; t++) memcpy(z + (size_t)t * G * Ro + (size_t)g * Ro, zg + (size_t)t * Ro, sizeof(float) * (size_t)Ro);
        }
        dsv4_cpu_linear(&ly->wo_b, z, T, out);
        free(og);
        free(zg);
        free(z);
    }
    free(o);
done:
    free(qr);
    free(q);
    free(kv);
    free(qi);
    free(wt);
    return rc;
}
