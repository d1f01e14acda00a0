/* kt_attn.c - test_kernels: the decode attention (dsv4_cuda_attn), the indexer's top-k, the attention index lists,
 * the compressor's state machine and the window ring store, against twins written from their definitions. */
#include "kt.h"

/* ---- sparse attention ---- */

/* nvalid[t] entries per token (distinct rows of a pool of N), the rest of nidx padded with -1 */
void test_attn(int T, int H, int Dh, int N, int nidx, const int *nvalid, int bench) {
    float *q = randn((size_t)T * H * Dh, 1.0f), *kv = randn((size_t)N * Dh, 1.0f), *sink = randn(H, 1.0f);
    int *idx = malloc(sizeof(int) * (size_t)T * nidx);
    int *perm = malloc(sizeof(int) * N);
    for (int t = 0; t < T; t++) {
        for (int i = 0; i < N; i++) perm[i] = i;
        for (int i = 0; i < nidx; i++) {
            int j = i + (int)(rnd_u32() % (uint32_t)(N - i));
            int tmp = perm[i];
            perm[i] = perm[j], perm[j] = tmp;
        }
        /* valid entries scattered among the padding */
        int nv = nvalid[t];
        for (int i = 0; i < nidx; i++) idx[(size_t)t * nidx + i] = -1;
        for (int v = 0; v < nv; v++) idx[(size_t)t * nidx + (nv == nidx ? v : (int)((int64_t)v * nidx / nv))] = perm[v];
    }
    const float scale = 1.0f / sqrtf((float)Dh);
    float *ref = malloc(sizeof(float) * (size_t)T * H * Dh), *got = malloc(sizeof(float) * (size_t)T * H * Dh);
    const float **keys = malloc(sizeof(float *) * (nidx ? nidx : 1));
    for (int t = 0; t < T; t++) {
        int n = 0;
        for (int i = 0; i < nidx; i++)
            if (idx[(size_t)t * nidx + i] >= 0) keys[n++] = kv + (size_t)idx[(size_t)t * nidx + i] * Dh;
        dsv4_cpu_sparse_attn(q + (size_t)t * H * Dh, H, Dh, keys, n, sink, scale, ref + (size_t)t * H * Dh);
    }
    float *dq = dup_to_dev(q, sizeof(float) * (size_t)T * H * Dh), *dkv = dup_to_dev(kv, sizeof(float) * (size_t)N * Dh),
          *dsk = dup_to_dev(sink, sizeof(float) * H), *dout = dsv4_cuda_alloc(sizeof(float) * (size_t)T * H * Dh);
    int *didx = dup_to_dev(idx, sizeof(int) * (size_t)T * nidx);
    op_ok(dsv4_cuda_sparse_attn(dq, T, H, Dh, dkv, Dh, didx, nidx, dsk, scale, dout, NULL), "sparse_attn");
    sync_ok();
    from_dev(got, dout, sizeof(float) * (size_t)T * H * Dh);
    char name[128];
    snprintf(name, sizeof name, "sparse_attn T=%d H=%d Dh=%d nidx=%d", T, H, Dh, nidx);
    check(name, got, ref, (size_t)T * H * Dh, 1e-5 * rms(ref, (size_t)T * H * Dh), 1e-4);
    if (bench) {
        cudaEvent_t e0, e1;
        cudaEventCreate(&e0), cudaEventCreate(&e1);
        const int it = 50;
        cudaEventRecord(e0, 0);
        for (int i = 0; i < it; i++) dsv4_cuda_sparse_attn(dq, T, H, Dh, dkv, Dh, didx, nidx, dsk, scale, dout, NULL);
        cudaEventRecord(e1, 0);
        sync_ok();
        float ms;
        cudaEventElapsedTime(&ms, e0, e1);
        printf("time sparse_attn T=%d H=%d Dh=%d nidx=%d: %.1f us per call\n", T, H, Dh, nidx, 1000.0 * ms / it);
        cudaEventDestroy(e0), cudaEventDestroy(e1);
    }
    dsv4_cuda_free(dq), dsv4_cuda_free(dkv), dsv4_cuda_free(dsk), dsv4_cuda_free(dout), dsv4_cuda_free(didx);
    free(q), free(kv), free(sink), free(idx), free(perm), free(ref), free(got), free(keys);
}


/* ---- device top-k (twin: the CPU engine's indexer selection: dsv4_topk_torch of the first nlist
 * scores, k' = min(k, nlist), picks >= ncausal dropped; by default, where the k-th value ties no unselected
 * one, the same set ordered by decreasing value, equal values by increasing index: dsv4_cuda_topk_set_exact_order) ---- */

static const float *tk_row_vals;
static int tk_cmp_order(const void *a, const void *b) {
    const int i = *(const int *)a, j = *(const int *)b;
    const float x = tk_row_vals[i], y = tk_row_vals[j];
    if (x != y) return x > y ? -1 : 1;
    return i < j ? -1 : i > j;
}

/* T rows of ld scores; row t ranks nlist[t] entries of which ncausal[t] are real (the rest -inf, as the
 * masked prefill list); levels > 0: scores from that many values (many exact ties); -1: continuous with a fifth of the
 * odd entries equal to the one before (ties mostly among the selected: the fast path's order); 0: continuous; -2:
 * continuous, every row a prefill pass's (the pass's whole list, ld entries, its causal ones rising from ld / 2) */
static void test_topk_rule(int T, int ld, int k, int levels, int exact, int fast, int threads) {
    float *sc = malloc(sizeof(float) * (size_t)T * ld);
    int *nl = malloc(sizeof(int) * T), *nc = malloc(sizeof(int) * T), *tmp = malloc(sizeof(int) * (size_t)(k + ld));
    for (int t = 0; t < T; t++) {
        nl[t] = t == 0 ? ld : t == 1 ? 0 : t == 2 ? (k > 1 && k - 1 < ld ? k - 1 : ld) : 1 + (int)(rnd_u32() % (uint32_t)ld);
        nc[t] = t % 3 == 2 ? (int)(rnd_u32() % (uint32_t)(nl[t] + 1)) : nl[t]; /* some rows with masked entries */
        if (levels == -2) nl[t] = ld, nc[t] = ld / 2 + (int)((int64_t)t * (ld - ld / 2) / T) + 1;
        float prev = 0.0f;
        for (int i = 0; i < ld; i++) {
            float v = levels > 0 ? (float)(int)(rnd_uni() * levels) - levels / 2 : rnd_n();
            if (levels > 0 && rnd_uni() < 0.3f) v = 0.0f;
            if (levels == -1 && (i & 1) && rnd_uni() < 0.2f) v = prev; /* pairs of equal values (repeated entries) */
            prev = v;
            sc[(size_t)t * ld + i] = i < nc[t] ? v : -INFINITY;
        }
    }
    size_t nout = (size_t)T * (k + 1);
    float *ref = calloc(nout, sizeof(float)), *got = calloc(nout, sizeof(float));
    for (int t = 0; t < T; t++) {
        int kk = k < nl[t] ? k : nl[t], kept = 0;
        const float *r = sc + (size_t)t * ld;
        if (kk > 0) dsv4_topk_torch(r, nl[t], kk, tmp);
        if (kk > 0 && !exact) { /* no boundary tie: the set, by value then index */
            const float vk = r[tmp[kk - 1]];
            int neq = 0, nsel_eq = 0;
            for (int i = 0; i < nl[t] && vk != -INFINITY; i++) neq += r[i] == vk;
            for (int i = 0; i < kk; i++) nsel_eq += r[tmp[i]] == vk;
            if (vk == -INFINITY || neq == nsel_eq) tk_row_vals = r, qsort(tmp, (size_t)kk, sizeof(int), tk_cmp_order);
        }
        for (int i = 0; i < kk; i++)
            if (tmp[i] < nc[t]) ref[(size_t)t * (k + 1) + 1 + kept++] = (float)tmp[i];
        ref[(size_t)t * (k + 1)] = (float)kept;
    }
    float *dsc = dup_to_dev(sc, sizeof(float) * (size_t)T * ld);
    int *dnl = dup_to_dev(nl, sizeof(int) * T), *dnc = dup_to_dev(nc, sizeof(int) * T);
    int *dsel = dsv4_cuda_alloc(sizeof(int) * (size_t)T * k), *dnsel = dsv4_cuda_alloc(sizeof(int) * T);
    void *scratch = dsv4_cuda_alloc((size_t)8 * T * ld);
    dsv4_cuda_topk_set_exact_order(exact);
    dsv4_cuda_topk_set_fast(fast);
    dsv4_cuda_topk_set_threads(threads ? threads : -1);
    unsigned long long cnt[3];
    op_ok(dsv4_cuda_topk_counts(cnt, 1), "topk counters");
    op_ok(dsv4_cuda_topk(dsc, T, ld, dnl, dnc, k, dsel, dnsel, scratch, NULL), "topk");
    sync_ok();
    int *sel = malloc(sizeof(int) * (size_t)T * k), *nsel = malloc(sizeof(int) * T);
    from_dev(sel, dsel, sizeof(int) * (size_t)T * k);
    from_dev(nsel, dnsel, sizeof(int) * T);
    for (int t = 0; t < T; t++) {
        got[(size_t)t * (k + 1)] = (float)nsel[t];
        for (int i = 0; i < nsel[t] && i < k; i++) got[(size_t)t * (k + 1) + 1 + i] = (float)sel[(size_t)t * k + i];
    }
    op_ok(dsv4_cuda_topk_counts(cnt, 1), "topk counters");
    char name[160];
    char thr[32] = "";
    if (threads) snprintf(thr, sizeof thr, ", %d threads a row", threads);
    snprintf(name, sizeof name, "topk T=%d n<=%d k=%d %s (exact, %s%s%s; rows %llu, order ties %llu, boundary ties %llu)", T, ld, k,
             levels > 0 ? "ties" : levels == -1 ? "pairs" : levels ? "prefill rows" : "distinct",
             exact ? "torch order" : "equal values by index", fast ? ", fast form" : "", thr, cnt[0], cnt[1], cnt[2]);
    check(name, got, ref, nout, 0, 0);
    { /* the time of a launch (ties: the one-thread path in shared memory up to 8192 entries a row, else in the scratch) */
        cudaEvent_t e0, e1;
        cudaEventCreate(&e0), cudaEventCreate(&e1);
        cudaEventRecord(e0, 0);
        for (int i = 0; i < 5; i++) dsv4_cuda_topk(dsc, T, ld, dnl, dnc, k, dsel, dnsel, scratch, NULL);
        cudaEventRecord(e1, 0);
        sync_ok();
        float ms = 0;
        cudaEventElapsedTime(&ms, e0, e1);
        printf("time topk T=%d n<=%d k=%d %s%s%s%s: %.1f us\n", T, ld, k,
               levels > 0 ? "ties" : levels == -1 ? "pairs" : levels ? "prefill rows" : "distinct",
               exact ? " (torch order)" : "", fast ? " fast form" : "", thr, 1000.0 * ms / 5);
        cudaEventDestroy(e0), cudaEventDestroy(e1);
    }
    dsv4_cuda_free(dsc), dsv4_cuda_free(dnl), dsv4_cuda_free(dnc), dsv4_cuda_free(dsel), dsv4_cuda_free(dnsel),
        dsv4_cuda_free(scratch);
    free(sc), free(nl), free(nc), free(tmp), free(ref), free(got), free(sel), free(nsel);
    dsv4_cuda_topk_set_exact_order(-1);
    dsv4_cuda_topk_set_fast(-1);
    dsv4_cuda_topk_set_threads(-1);
}

/* both rules on the same rows (the random stream restarted for the second) */
void test_topk(int T, int ld, int k, int levels) {
    const uint64_t st = rnd_state_get();
    for (int fast = 0; fast <= 1; fast++) { /* DSV4_TOPK_FAST off and on: the same picks */
        rnd_state_set(st);
        test_topk_rule(T, ld, k, levels, 1, fast, 0);
        rnd_state_set(st);
        test_topk_rule(T, ld, k, levels, 0, fast, 0);
    }
    if (k <= 512) /* the default's 256 threads a row against the 512- and 1024-thread forms (DSV4_TOPK_THREADS) */
        for (int nt = 512; nt <= 1024; nt *= 2)
            for (int exact = 1; exact >= 0; exact--) {
                rnd_state_set(st);
                test_topk_rule(T, ld, k, levels, exact, 1, nt);
            }
}

/* ---- attention index lists (twin: the list loop of dsv4_attention_fwd) ---- */

/* S slots (the last one idle) with chunks of n[s] tokens at p0[s]; one layer of ratio `ratio`. */
void test_attn_index(int S, int W, int ratio, int ksel, const int *p0, const int *n) {
    const int L = 1; /* layer 1 of 2 */
    int T = 0;
    for (int s = 0; s < S; s++) T += n[s];
    T += 2; /* two idle rows at the end */
    int *tok = calloc(T, sizeof(int)), *pos = calloc(T, sizeof(int)), *sid = calloc(T, sizeof(int)), *off = calloc(S, sizeof(int));
    int *sel = malloc(sizeof(int) * (size_t)T * ksel), *nsel = calloc(T, sizeof(int));
    void **sq = calloc(S, sizeof(void *));
    float *fake = dsv4_cuda_alloc(16); /* abuf values only travel into qbase */
    for (int s = 0, t = 0; s < S; s++) {
        off[s] = t;
        for (int i = 0; i < n[s]; i++, t++) pos[t] = p0[s] + i, sid[t] = s;
        if (n[s]) { /* a device seqdev with NL layer states */
            dsv4_cuda_seqdev hd = {0, 1 << 20, NULL};
            dsv4_cuda_lstate ls[2] = {{0}};
            uint8_t *d = dsv4_cuda_alloc(256 + sizeof ls);
            hd.L = (dsv4_cuda_lstate *)(d + 256);
            ls[L].abuf = (uint8_t *)(fake + s); /* distinct per slot */
            dsv4_cuda_upload(d, &hd, sizeof hd), dsv4_cuda_upload(d + 256, ls, sizeof ls);
            sq[s] = d;
        }
    }
    for (int t = T - 2; t < T; t++) sid[t] = -1;
    for (int t = 0; t < T; t++) {
        int nc = (pos[t] + 1) / 4;
        nsel[t] = nc < ksel ? nc : ksel;
        for (int i = 0; i < ksel; i++) sel[(size_t)t * ksel + i] = nc ? (int)(rnd_u32() % (uint32_t)nc) : 0;
    }
    int maxc = 0;
    for (int s = 0; s < S; s++) if (n[s] && (p0[s] + n[s]) / (ratio ? ratio : 1) > maxc) maxc = (p0[s] + n[s]) / (ratio ? ratio : 1);
    const int nidx = W + (ratio == 4 ? ksel : ratio ? maxc : 0);
    /* reference */
    float *ref = malloc(sizeof(float) * ((size_t)T * nidx + T)), *got = malloc(sizeof(float) * ((size_t)T * nidx + T));
    for (int t = 0; t < T; t++) {
        float *it = ref + (size_t)t * nidx;
        int k = 0;
        ref[(size_t)T * nidx + t] = sid[t] < 0 ? -1.0f : (float)sid[t]; /* which slot's abuf qbase holds */
        if (sid[t] >= 0) {
            int s = sid[t], p = pos[t];
            for (int pp = p - W + 1 < 0 ? 0 : p - W + 1; pp <= p; pp++) it[k++] = (float)(pp >= p0[s] ? -(off[s] + pp - p0[s]) - 2 : pp % W);
            if (ratio == 4)
                for (int i = 0; i < nsel[t]; i++) it[k++] = (float)(W + sel[(size_t)t * ksel + i]);
            else if (ratio > 0)
                for (int w = 0; w < (p + 1) / ratio; w++) it[k++] = (float)(W + w);
        }
        while (k < nidx) it[k++] = -1.0f;
    }
    int *dtok = dup_to_dev(tok, sizeof(int) * T), *dpos = dup_to_dev(pos, sizeof(int) * T), *dsid = dup_to_dev(sid, sizeof(int) * T);
    int *dp0 = dup_to_dev(p0, sizeof(int) * S), *dn = dup_to_dev(n, sizeof(int) * S), *doff = dup_to_dev(off, sizeof(int) * S);
    void *dsq = dup_to_dev(sq, sizeof(void *) * S);
    int *dsel = dup_to_dev(sel, sizeof(int) * (size_t)T * ksel), *dnsel = dup_to_dev(nsel, sizeof(int) * T);
    int *didx = dsv4_cuda_alloc(sizeof(int) * (size_t)T * nidx);
    const uint8_t **dqb = dsv4_cuda_alloc(sizeof(void *) * T);
    dsv4_cuda_batch b = {.T = T, .S = S, .tok = dtok, .pos = dpos, .sid = dsid, .p0 = dp0, .n = dn, .off = doff, .sq = dsq};
    op_ok(dsv4_cuda_attn_index(&b, L, W, ratio, ratio == 4 ? dsel : NULL, dnsel, ksel, nidx, didx, dqb, NULL), "attn_index");
    sync_ok();
    int *gi = malloc(sizeof(int) * (size_t)T * nidx);
    const uint8_t **qb = malloc(sizeof(void *) * T);
    from_dev(gi, didx, sizeof(int) * (size_t)T * nidx);
    from_dev(qb, dqb, sizeof(void *) * T);
    for (size_t i = 0; i < (size_t)T * nidx; i++) got[i] = (float)gi[i];
    for (int t = 0; t < T; t++) got[(size_t)T * nidx + t] = qb[t] ? (float)((const float *)(const void *)qb[t] - fake) : -1.0f;
    char name[128];
    snprintf(name, sizeof name, "attn_index S=%d T=%d W=%d ratio=%d nidx=%d (exact)", S, T, W, ratio, nidx);
    check(name, got, ref, (size_t)T * nidx + T, 0, 0);
    for (int s = 0; s < S; s++) dsv4_cuda_free(sq[s]);
    dsv4_cuda_free(fake), dsv4_cuda_free(dtok), dsv4_cuda_free(dpos), dsv4_cuda_free(dsid), dsv4_cuda_free(dp0), dsv4_cuda_free(dn);
    dsv4_cuda_free(doff), dsv4_cuda_free(dsq), dsv4_cuda_free(dsel), dsv4_cuda_free(dnsel), dsv4_cuda_free(didx), dsv4_cuda_free((void *)dqb);
    free(tok), free(pos), free(sid), free(off), free(sel), free(nsel), free(sq), free(ref), free(got), free(gi), free(qb);
}

/* ---- window ring store (twin: kv_cache.h's row format written out here: e4m3 codes of the 64-blocks over their
 * recomputed power-of-two scale, e8m0 scales, bf16 rope dims) ---- */

static void kv_pack_ref(const float *x, int Dh, int R, uint8_t *row) {
    const int nope = Dh - R;
    for (int b = 0; b < nope / 64; b++) {
        float a = 0;
        for (int j = 0; j < 64; j++) a = fmaxf(a, fabsf(x[b * 64 + j]));
        union { float f; uint32_t u; } sc = {fmaxf(a, 1e-4f) * (1.0f / 448.0f)};
        const int e = (int)((sc.u >> 23) & 0xff) - 127 + ((sc.u & 0x7fffffu) != 0);
        const float s = ldexpf(1.0f, e);
        row[nope + b] = (uint8_t)(e + 127);
        for (int j = 0; j < 64; j++) { /* the code whose value is x / s exactly (the row is FP8-simulated) */
            const float v = x[b * 64 + j] / s;
            int c = 0;
            while (c < 256 && memcmp(&(float){dsv4_e4m3_to_f32((uint8_t)c)}, &v, sizeof v)) c++;
            row[b * 64 + j] = (uint8_t)(c < 256 ? c : 0x7f);
        }
    }
    uint16_t *rp = (uint16_t *)(row + dsv4_kv_rope_off(Dh, R));
    for (int j = 0; j < R; j++) rp[j] = dsv4_f32_to_bf16(x[nope + j]);
}

/* The compressor's token loop (compress_tokens() of src/model/forward_attn.c up to the RMSNorm, the loop
 * dsv4_cuda_cmp_batch computes in parallel) on one slot's state: n rows at positions p0 .. of kvp / scp [n, cd]. */
static void cmp_ref(float *skv, float *ssc, const float *kvp, const float *scp, const float *ape, int p0, int n, int mr,
                    int d, int overlap, float *ent, int *rpos) {
    const int cd = (overlap ? 2 : 1) * d, nslot = overlap ? 2 * mr : mr;
    for (int i = 0; i < n; i++) {
        const int p = p0 + i, r = p % mr, row = overlap ? mr + r : r;
        rpos[i] = (p + 1) % mr ? 0 : p + 1 - mr;
        for (int col = 0; col < cd; col++) {
            skv[(size_t)row * cd + col] = kvp[(size_t)i * cd + col];
            ssc[(size_t)row * cd + col] = scp[(size_t)i * cd + col] + ape[(size_t)r * cd + col];
        }
        if ((p + 1) % mr) continue;
        for (int ch = 0; ch < d; ch++) {
            float mx = -INFINITY, den = 0;
            for (int k = 0; k < nslot; k++) mx = fmaxf(mx, ssc[(size_t)k * cd + (overlap && k >= mr ? d + ch : ch)]);
            for (int k = 0; k < nslot; k++) {
                const float v = ssc[(size_t)k * cd + (overlap && k >= mr ? d + ch : ch)];
                den += v == -INFINITY ? 0.0f : expf(v - mx);
            }
            double acc = 0;
            for (int k = 0; k < nslot; k++) {
                const int col = overlap && k >= mr ? d + ch : ch;
                const float v = ssc[(size_t)k * cd + col], w = v == -INFINITY ? 0.0f : expf(v - mx);
                acc += (double)(w / den) * skv[(size_t)k * cd + col];
            }
            ent[(size_t)i * d + ch] = (float)acc;
        }
        if (overlap) memcpy(skv, skv + (size_t)mr * cd, sizeof(float) * mr * cd), memcpy(ssc, ssc + (size_t)mr * cd, sizeof(float) * mr * cd);
    }
}

/* dsv4_cuda_cmp_batch over several passes of two slots (slot 0 cut by cuts[], slot 1 by the same cuts reversed, two
 * idle rows per pass) against cmp_ref: entries at a tight tolerance (expf of the device vs the host's), RoPE positions
 * and the pending rows after every pass exactly. */
void test_cmp_batch(int mr, int d, int overlap, const int *cuts, int nc) {
    const int S = 2, L = 0, cd = (overlap ? 2 : 1) * d, nslot = overlap ? 2 * mr : mr;
    float *hkv[2], *hsc[2], *dkv[2], *dsc[2];
    void *sq[2];
    float *ape = randn((size_t)mr * cd, 1.0f);
    float *dape = dup_to_dev(ape, sizeof(float) * (size_t)mr * cd);
    for (int s = 0; s < S; s++) {
        hkv[s] = calloc((size_t)nslot * cd, sizeof(float));
        hsc[s] = malloc(sizeof(float) * (size_t)nslot * cd);
        for (size_t i = 0; i < (size_t)nslot * cd; i++) hsc[s][i] = -INFINITY;
        dkv[s] = dup_to_dev(hkv[s], sizeof(float) * (size_t)nslot * cd);
        dsc[s] = dup_to_dev(hsc[s], sizeof(float) * (size_t)nslot * cd);
        dsv4_cuda_seqdev hd = {0, 1 << 20, NULL};
        dsv4_cuda_lstate ls[1] = {{0}};
        uint8_t *dv = dsv4_cuda_alloc(256 + sizeof ls);
        hd.L = (dsv4_cuda_lstate *)(dv + 256);
        ls[L].ckv = dkv[s], ls[L].csc = dsc[s];
        dsv4_cuda_upload(dv, &hd, sizeof hd), dsv4_cuda_upload(dv + 256, ls, sizeof ls);
        sq[s] = dv;
    }
    void *dsq = dup_to_dev(sq, sizeof sq);
    int pos[2] = {0, 0}, ok = 1;
    double worst = 0;
    for (int c = 0; c < nc; c++) {
        const int n[2] = {cuts[c], cuts[nc - 1 - c]}, T = n[0] + n[1] + 2;
        int p0[2] = {pos[0], pos[1]}, off[2] = {0, n[0]};
        int *tp = calloc(T, sizeof(int)), *sid = calloc(T, sizeof(int)), *rpos = calloc(T, sizeof(int)), *rref = calloc(T, sizeof(int));
        float *kvp = randn((size_t)T * cd, 1.0f), *scp = randn((size_t)T * cd, 2.0f);
        float *ent = calloc((size_t)T * d, sizeof(float)), *eref = calloc((size_t)T * d, sizeof(float));
        for (int s = 0, t = 0; s < S; s++)
            for (int i = 0; i < n[s]; i++, t++) tp[t] = p0[s] + i, sid[t] = s;
        sid[T - 2] = sid[T - 1] = -1;
        int *dtp = dup_to_dev(tp, sizeof(int) * T), *dsid = dup_to_dev(sid, sizeof(int) * T), *drp = dup_to_dev(rpos, sizeof(int) * T);
        int *dp0 = dup_to_dev(p0, sizeof p0), *dn = dup_to_dev(n, sizeof n), *doff = dup_to_dev(off, sizeof off);
        float *dkvp = dup_to_dev(kvp, sizeof(float) * (size_t)T * cd), *dscp = dup_to_dev(scp, sizeof(float) * (size_t)T * cd);
        float *dent = dup_to_dev(ent, sizeof(float) * (size_t)T * d);
        dsv4_cuda_batch b = {.T = T, .S = S, .tok = dtp, .pos = dtp, .sid = dsid, .p0 = dp0, .n = dn, .off = doff, .sq = dsq};
        op_ok(dsv4_cuda_cmp_batch(&b, L, 0, dkvp, dscp, dape, mr, d, overlap, dent, drp, NULL), "cmp_batch");
        sync_ok();
        from_dev(ent, dent, sizeof(float) * (size_t)T * d);
        from_dev(rpos, drp, sizeof(int) * T);
        for (int s = 0; s < S; s++) {
            cmp_ref(hkv[s], hsc[s], kvp + (size_t)off[s] * cd, scp + (size_t)off[s] * cd, ape, p0[s], n[s], mr, d, overlap,
                    eref + (size_t)off[s] * d, rref + off[s]);
            pos[s] += n[s];
            float *gkv = malloc(sizeof(float) * (size_t)nslot * cd), *gsc = malloc(sizeof(float) * (size_t)nslot * cd);
            from_dev(gkv, dkv[s], sizeof(float) * (size_t)nslot * cd);
            from_dev(gsc, dsc[s], sizeof(float) * (size_t)nslot * cd);
            ok &= !memcmp(gkv, hkv[s], sizeof(float) * (size_t)nslot * cd) && !memcmp(gsc, hsc[s], sizeof(float) * (size_t)nslot * cd);
            free(gkv), free(gsc);
        }
        for (int t = 0; t < T - 2; t++) {
            ok &= rpos[t] == rref[t];
            if (!((tp[t] + 1) % mr))
                for (int ch = 0; ch < d; ch++) {
                    const double e = fabs((double)ent[(size_t)t * d + ch] - eref[(size_t)t * d + ch]) / (1e-6 + 1e-5 * fabs(eref[(size_t)t * d + ch]));
                    worst = e > worst ? e : worst;
                }
        }
        dsv4_cuda_free(dtp), dsv4_cuda_free(dsid), dsv4_cuda_free(drp), dsv4_cuda_free(dp0), dsv4_cuda_free(dn), dsv4_cuda_free(doff);
        dsv4_cuda_free(dkvp), dsv4_cuda_free(dscp), dsv4_cuda_free(dent);
        free(tp), free(sid), free(rpos), free(rref), free(kvp), free(scp), free(ent), free(eref);
    }
    ok &= worst <= 1;
    g_checks++, g_fail += !ok;
    printf("%-4s cmp_batch m=%d d=%d overlap=%d, %d passes: entries %.3f of tol (atol 1e-6 rtol 1e-5), positions and pending rows %s%s\n",
           ok ? "ok" : "FAIL", mr, d, overlap, nc, worst, ok ? "exact" : "checked", ok ? "" : " <<<");
    for (int s = 0; s < S; s++) free(hkv[s]), free(hsc[s]), dsv4_cuda_free(dkv[s]), dsv4_cuda_free(dsc[s]), dsv4_cuda_free(sq[s]);
    dsv4_cuda_free(dsq), dsv4_cuda_free(dape), free(ape);
}

/* S slots with n[s] rows at positions p0[s] ..; two idle rows at the end. Each slot's ring (W rows, prefilled) after
 * dsv4_cuda_ring_store, bytewise. */
void test_ring_store(int S, int W, int Dh, int R, const int *p0, const int *n) {
    const int L = 1; /* layer 1 of 2 */
    int T = 0;
    for (int s = 0; s < S; s++) T += n[s];
    T += 2;
    const int64_t rb = dsv4_kv_row_bytes(Dh, R), nope = Dh - R;
    int *pos = calloc(T, sizeof(int)), *sid = calloc(T, sizeof(int)), *off = calloc(S, sizeof(int));
    void **sq = calloc(S, sizeof(void *));
    uint8_t **ring = calloc(S, sizeof(uint8_t *)), *ref = malloc((size_t)S * W * rb), *got = malloc((size_t)S * W * rb);
    memset(ref, 0xa5, (size_t)S * W * rb);
    float *kv = randn((size_t)T * Dh, 1.0f);
    for (int t = 0; t < T; t++) dsv4_act_quant_fp8(kv + (size_t)t * Dh, (size_t)nope, 64);
    for (int s = 0, t = 0; s < S; s++) {
        off[s] = t;
        for (int i = 0; i < n[s]; i++, t++) pos[t] = p0[s] + i, sid[t] = s;
        ring[s] = dup_to_dev(ref + (size_t)s * W * rb, (size_t)W * rb);
        if (n[s]) {
            dsv4_cuda_seqdev hd = {0, 1 << 20, NULL};
            dsv4_cuda_lstate ls[2] = {{0}};
            uint8_t *d = dsv4_cuda_alloc(256 + sizeof ls);
            hd.L = (dsv4_cuda_lstate *)(d + 256);
            ls[L].abuf = ring[s];
            dsv4_cuda_upload(d, &hd, sizeof hd), dsv4_cuda_upload(d + 256, ls, sizeof ls);
            sq[s] = d;
        }
    }
    for (int t = T - 2; t < T; t++) sid[t] = -1;
    for (int t = 0; t < T - 2; t++) {
        const int s = sid[t];
        if (pos[t] >= p0[s] + n[s] - W) kv_pack_ref(kv + (size_t)t * Dh, Dh, R, ref + ((size_t)s * W + pos[t] % W) * rb);
    }
    int *dpos = dup_to_dev(pos, sizeof(int) * T), *dsid = dup_to_dev(sid, sizeof(int) * T);
    int *dp0 = dup_to_dev(p0, sizeof(int) * S), *dn = dup_to_dev(n, sizeof(int) * S), *doff = dup_to_dev(off, sizeof(int) * S);
    void *dsq = dup_to_dev(sq, sizeof(void *) * S);
    float *dkv = dup_to_dev(kv, sizeof(float) * (size_t)T * Dh);
    dsv4_cuda_batch b = {.T = T, .S = S, .tok = dpos, .pos = dpos, .sid = dsid, .p0 = dp0, .n = dn, .off = doff, .sq = dsq};
    op_ok(dsv4_cuda_ring_store(&b, L, dkv, W, Dh, R, NULL), "ring_store");
    sync_ok();
    for (int s = 0; s < S; s++) from_dev(got + (size_t)s * W * rb, ring[s], (size_t)W * rb);
    size_t nb = (size_t)S * W * rb;
    float *fr = malloc(sizeof(float) * nb), *fg = malloc(sizeof(float) * nb);
    for (size_t i = 0; i < nb; i++) fr[i] = ref[i], fg[i] = got[i];
    char name[128];
    snprintf(name, sizeof name, "ring_store S=%d T=%d W=%d Dh=%d R=%d (bytes, exact)", S, T, W, Dh, R);
    check(name, fg, fr, nb, 0, 0);
    /* the twin against dsv4_cuda_kv_pack (attn_kv8.cu) on the same rows */
    {
        uint8_t *pk = malloc((size_t)T * rb), *hk = malloc((size_t)T * rb), *dpk = dsv4_cuda_alloc((size_t)T * rb);
        memset(hk, 0, (size_t)T * rb);
        op_ok(dsv4_cuda_memset(dpk, 0, (size_t)T * rb, NULL), "memset");
        op_ok(dsv4_cuda_kv_pack(dkv, Dh, T, Dh, R, dpk, NULL, NULL), "kv_pack");
        sync_ok();
        from_dev(pk, dpk, (size_t)T * rb);
        for (int t = 0; t < T; t++) kv_pack_ref(kv + (size_t)t * Dh, Dh, R, hk + (size_t)t * rb);
        size_t nd = 0;
        for (size_t i = 0; i < (size_t)T * rb; i++) nd += pk[i] != hk[i];
        g_checks++, g_fail += nd != 0;
        printf("%-4s kv_pack rows = the ring store's twin: %zu of %zu bytes differ%s\n", nd ? "FAIL" : "ok", nd, (size_t)T * rb,
               nd ? " <<<" : "");
        dsv4_cuda_free(dpk), free(pk), free(hk);
    }
    for (int s = 0; s < S; s++) dsv4_cuda_free(sq[s]), dsv4_cuda_free(ring[s]);
    dsv4_cuda_free(dpos), dsv4_cuda_free(dsid), dsv4_cuda_free(dp0), dsv4_cuda_free(dn), dsv4_cuda_free(doff), dsv4_cuda_free(dsq);
    dsv4_cuda_free(dkv);
    free(pos), free(sid), free(off), free(sq), free(ring), free(ref), free(got), free(kv), free(fr), free(fg);
}
