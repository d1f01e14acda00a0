/* sample.c - see sample.h for the specification. */
#include "sample.h"
#include "sample_minp.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---- RNG ---------------------------------------------------------------------------------- */

void dsv4_philox4x32_10(const uint32_t ctr[4], const uint32_t key[2], uint32_t out[4]) {
    uint32_t c0 = ctr[0], c1 = ctr[1], c2 = ctr[2], c3 = ctr[3];
    uint32_t k0 = key[0], k1 = key[1];
    for (int r = 0; r < 10; r++) {
        if (r > 0) {
            k0 += 0x9E3779B9u;
            k1 += 0xBB67AE85u;
        }
        uint64_t p0 = (uint64_t)0xD2511F53u * c0;
        uint64_t p1 = (uint64_t)0xCD9E8D57u * c2;
        uint32_t hi0 = (uint32_t)(p0 >> 32), lo0 = (uint32_t)p0;
        uint32_t hi1 = (uint32_t)(p1 >> 32), lo1 = (uint32_t)p1;
        c0 = hi1 ^ c1 ^ k0;
        c1 = lo1;
        c2 = hi0 ^ c3 ^ k1;
        c3 = lo0;
    }
    out[0] = c0;
    out[1] = c1;
    out[2] = c2;
    out[3] = c3;
}

double dsv4_rng_uniform(uint64_t seed, uint64_t step) {
    const uint32_t key[2] = {(uint32_t)seed, (uint32_t)(seed >> 32)};
    const uint32_t ctr[4] = {0, 0, (uint32_t)step, (uint32_t)(step >> 32)};
    uint32_t x[4];
    dsv4_philox4x32_10(ctr, key, x);
    return ((double)(x[0] >> 5) * 67108864.0 + (double)(x[1] >> 6)) / 9007199254740992.0;
}

/* ---- Parameters --------------------------------------------------------------------------- */

void dsv4_sampling_defaults(dsv4_sampling *p) {
    memset(p, 0, sizeof *p);
    p->temperature = 1.0f;
    p->top_k = 0;
    p->top_p = 1.0f;
    p->min_p = 0.0f;
    p->repetition_penalty = 1.0f;
    p->presence_penalty = 0.0f;
    p->frequency_penalty = 0.0f;
    p->seed = 0;
    p->max_tokens = 0;
    p->stop = NULL;
    p->n_stop = 0;
    p->ignore_eos = false;
}

int dsv4_sampling_validate(const dsv4_sampling *p, dsv4_err *err) {
    if (!p) return dsv4_errf(err, "sampling parameters missing");
    /* Comparisons are written so that NaN fails them. */
    if (!(p->temperature >= 0.0f && p->temperature <= 100.0f))
        return dsv4_errf(err, "temperature must be in [0, 100], got %g", (double)p->temperature);
    if (p->top_k < 0) return dsv4_errf(err, "top_k must be >= 0 (0 = off), got %d", p->top_k);
    if (!(p->top_p > 0.0f && p->top_p <= 1.0f))
        return dsv4_errf(err, "top_p must be in (0, 1], got %g", (double)p->top_p);
    if (!(p->min_p >= 0.0f && p->min_p <= 1.0f))
        return dsv4_errf(err, "min_p must be in [0, 1], got %g", (double)p->min_p);
    if (!(p->repetition_penalty > 0.0f && isfinite(p->repetition_penalty)))
        return dsv4_errf(err, "repetition_penalty must be > 0 and finite (1 = off), got %g",
                         (double)p->repetition_penalty);
    if (!(p->presence_penalty >= -2.0f && p->presence_penalty <= 2.0f))
        return dsv4_errf(err, "presence_penalty must be in [-2, 2], got %g", (double)p->presence_penalty);
    if (!(p->frequency_penalty >= -2.0f && p->frequency_penalty <= 2.0f))
        return dsv4_errf(err, "frequency_penalty must be in [-2, 2], got %g",
                         (double)p->frequency_penalty);
    if (p->max_tokens < 0)
        return dsv4_errf(err, "max_tokens must be >= 0 (0 = no limit), got %d", p->max_tokens);
    if (p->n_bias > DSV4_LOGIT_BIAS_MAX)
        return dsv4_errf(err, "logit_bias has %zu entries; at most %d", p->n_bias, DSV4_LOGIT_BIAS_MAX);
    if (p->n_bias > 0 && (!p->bias_tok || !p->bias_val))
        return dsv4_errf(err, "logit_bias: %zu entries but no arrays", p->n_bias);
    for (size_t i = 0; i < p->n_bias; i++) {
        if (p->bias_tok[i] < 0) return dsv4_errf(err, "logit_bias: token %d is negative", (int)p->bias_tok[i]);
        if (!(p->bias_val[i] >= -100.0f && p->bias_val[i] <= 100.0f))
            return dsv4_errf(err, "logit_bias of token %d must be in [-100, 100], got %g", (int)p->bias_tok[i],
                             (double)p->bias_val[i]);
    }
    if (p->n_stop > 0 && !p->stop) return dsv4_errf(err, "stop: %zu strings but no array", p->n_stop);
    for (size_t i = 0; i < p->n_stop; i++) {
        if (!p->stop[i]) return dsv4_errf(err, "stop[%zu] is NULL", i);
        size_t n = strnlen(p->stop[i], DSV4_STOP_MAX_LEN + 1);
        if (n == 0) return dsv4_errf(err, "stop[%zu] is an empty string", i);
        if (n > DSV4_STOP_MAX_LEN)
            return dsv4_errf(err, "stop[%zu] is longer than %d bytes", i, DSV4_STOP_MAX_LEN);
    }
    return 0;
}

/* ---- Candidates and selection ------------------------------------------------------------- */

typedef struct cand {
    float z;
    int32_t id;
} cand;

/* Strict total order: larger z first, then lower id. */
static inline int better(cand a, cand b) { return a.z > b.z || (a.z == b.z && a.id < b.id); }

static int cmp_better(const void *pa, const void *pb) {
    const cand *a = pa, *b = pb;
    return better(*a, *b) ? -1 : better(*b, *a) ? 1 : 0;
}

static inline void cswap(cand *a, cand *b) {
    cand t = *a;
    *a = *b;
    *b = t;
}

static void insertion_sort(cand *a, size_t n) {
    for (size_t i = 1; i < n; i++) {
        cand x = a[i];
        size_t j = i;
        while (j > 0 && better(x, a[j - 1])) {
            a[j] = a[j - 1];
            j--;
        }
        a[j] = x;
    }
}

/* Partitions a[lo, hi) (hi - lo >= 3) around a median-of-three pivot; returns its final
 * position p: a[lo, p) beat a[p], which beats a[p + 1, hi). */
static size_t partition(cand *a, size_t lo, size_t hi) {
    size_t mid = lo + (hi - lo) / 2, last = hi - 1;
    if (better(a[mid], a[lo])) cswap(&a[mid], &a[lo]);
    if (better(a[last], a[lo])) cswap(&a[last], &a[lo]);
    if (better(a[mid], a[last])) cswap(&a[mid], &a[last]); /* median -> a[last] */
    cand p = a[last];
    size_t store = lo;
    for (size_t i = lo; i < last; i++)
        if (better(a[i], p)) cswap(&a[i], &a[store++]);
    cswap(&a[store], &a[last]);
    return store;
}

/* Rounds of quickselect before falling back to sorting the rest: O(n log n) worst case. */
static int select_budget(size_t n) {
    int budget = 16;
    for (; n > 1; n >>= 1) budget += 2;
    return budget;
}

/* Rearranges a[0, n) so that a[0, k) holds the k best elements (any order), 0 < k < n. */
static void select_best(cand *a, size_t n, size_t k) {
    size_t lo = 0, hi = n; /* a[0, lo) beats a[lo, n); a[0, hi) beats a[hi, n) */
    int budget = select_budget(n);
    while (lo < k && k < hi) {
        if (hi - lo <= 16) {
            insertion_sort(a + lo, hi - lo);
            return;
        }
        if (budget-- == 0) {
            qsort(a + lo, hi - lo, sizeof *a, cmp_better);
            return;
        }
        size_t p = partition(a, lo, hi);
        if (p == k) return;
        if (k < p) hi = p;
        else lo = p + 1;
    }
}

/* top_p cut inside a[0, n) (n >= 1), the tokens of one histogram bucket, the mass before all
 * of which is cum < P: returns the element j of the (better-first) order with
 * mass_before(j) < P <= mass_before(j) + w_j (the last kept), or the worst one if the mass never
 * reaches P. Mass-weighted quickselect: O(n) expected, no full sort even if all z are equal. */
static cand find_cut(cand *a, size_t n, double cum, double P, double m) {
    size_t lo = 0, hi = n; /* the cut is in a[lo, hi); cum = mass of the elements before lo */
    int budget = select_budget(n);
    while (hi - lo > 16 && budget-- > 0) {
        size_t p = partition(a, lo, hi);
        double mb = 0;
        for (size_t i = lo; i < p; i++) mb += exp((double)a[i].z - m);
        if (cum + mb >= P) {
            hi = p; /* p > lo here, since cum < P */
            continue;
        }
        cum += mb;
        double wp = exp((double)a[p].z - m);
        if (cum + wp >= P || p + 1 == hi) return a[p];
        cum += wp;
        lo = p + 1;
    }
    if (hi - lo > 16) qsort(a + lo, hi - lo, sizeof *a, cmp_better);
    else insertion_sort(a + lo, hi - lo);
    size_t j = lo;
    cum += exp((double)a[j].z - m);
    while (j + 1 < hi && cum < P) cum += exp((double)a[++j].z - m);
    return a[j];
}

/* ---- Sampler ------------------------------------------------------------------------------ */

#define PROMPT_BIT 0x80000000u
#define COUNT_MASK 0x7fffffffu

struct dsv4_sampler {
    dsv4_sampling p;
    int vocab;
    uint64_t step;
    float *work;    /* processed logits */
    bool have_work; /* work holds the last sample's processed logits */
    void *scratch;  /* vocab * 8 bytes: cand[] or double[], allocated on first random draw */
    double *hist;   /* top_p: HIST_BUCKETS masses then HIST_BUCKETS uint32 counts */
    /* open addressing: token -> (PROMPT_BIT | generated count); key -1 = empty */
    int32_t *hkeys;
    uint32_t *hvals;
    size_t hcap, hn;
};

static inline size_t hslot(int32_t key, size_t cap) {
    return (size_t)(((uint32_t)key * 0x9E3779B1u) ^ ((uint32_t)key >> 15)) & (cap - 1);
}

static int hgrow(dsv4_sampler *s, dsv4_err *err) {
    size_t ncap = s->hcap ? s->hcap * 2 : 64;
    int32_t *nk = malloc(ncap * sizeof *nk);
    uint32_t *nv = malloc(ncap * sizeof *nv);
    if (!nk || !nv) {
        free(nk);
        free(nv);
        return dsv4_errf(err, "sampler: out of memory growing the token-count table to %zu", ncap);
    }
    for (size_t i = 0; i < ncap; i++) nk[i] = -1;
    for (size_t i = 0; i < s->hcap; i++) {
        if (s->hkeys[i] < 0) continue;
        size_t j = hslot(s->hkeys[i], ncap);
        while (nk[j] >= 0) j = (j + 1) & (ncap - 1);
        nk[j] = s->hkeys[i];
        nv[j] = s->hvals[i];
    }
    free(s->hkeys);
    free(s->hvals);
    s->hkeys = nk;
    s->hvals = nv;
    s->hcap = ncap;
    return 0;
}

/* Slot of token, inserting it (value 0) if absent; -1 on allocation failure. */
static long hget(dsv4_sampler *s, int32_t token, dsv4_err *err) {
    if ((s->hn + 1) * 2 > s->hcap && hgrow(s, err)) return -1;
    size_t j = hslot(token, s->hcap);
    while (s->hkeys[j] >= 0) {
        if (s->hkeys[j] == token) return (long)j;
        j = (j + 1) & (s->hcap - 1);
    }
    s->hkeys[j] = token;
    s->hvals[j] = 0;
    s->hn++;
    return (long)j;
}

static const uint32_t *hfind(const dsv4_sampler *s, int32_t token) {
    if (!s->hcap) return NULL;
    size_t j = hslot(token, s->hcap);
    while (s->hkeys[j] >= 0) {
        if (s->hkeys[j] == token) return &s->hvals[j];
        j = (j + 1) & (s->hcap - 1);
    }
    return NULL;
}

int dsv4_sampler_init(dsv4_sampler **out, const dsv4_sampling *params, int vocab, dsv4_err *err) {
    if (!out) return dsv4_errf(err, "sampler: no output pointer");
    *out = NULL;
    if (dsv4_sampling_validate(params, err)) return -1;
    if (vocab <= 0) return dsv4_errf(err, "sampler: vocab must be > 0, got %d", vocab);
    for (size_t i = 0; i < params->n_bias; i++)
        if (params->bias_tok[i] >= vocab)
            return dsv4_errf(err, "logit_bias: token %d is outside the vocabulary [0, %d)", (int)params->bias_tok[i],
                             vocab);
    dsv4_sampler *s = calloc(1, sizeof *s);
    if (!s) return dsv4_errf(err, "sampler: out of memory");
    s->p = *params;
    s->vocab = vocab;
    s->work = malloc((size_t)vocab * sizeof *s->work);
    if (!s->work) {
        free(s);
        return dsv4_errf(err, "sampler: out of memory for %d logits", vocab);
    }
    if (hgrow(s, err)) {
        dsv4_sampler_free(s);
        return -1;
    }
    *out = s;
    return 0;
}

void dsv4_sampler_free(dsv4_sampler *s) {
    if (!s) return;
    free(s->work);
    free(s->scratch);
    free(s->hist);
    free(s->hkeys);
    free(s->hvals);
    free(s);
}

int dsv4_sampler_add_prompt(dsv4_sampler *s, const int32_t *tokens, size_t n, dsv4_err *err) {
    if (n && !tokens) return dsv4_errf(err, "sampler: %zu prompt tokens but no array", n);
    for (size_t i = 0; i < n; i++) {
        if (tokens[i] < 0 || tokens[i] >= s->vocab)
            return dsv4_errf(err, "sampler: prompt token %zu is %d, outside [0, %d)", i, tokens[i],
                             s->vocab);
        long j = hget(s, tokens[i], err);
        if (j < 0) return -1;
        s->hvals[j] |= PROMPT_BIT;
    }
    return 0;
}

int dsv4_sampler_accept(dsv4_sampler *s, int32_t token, dsv4_err *err) {
    if (token < 0 || token >= s->vocab)
        return dsv4_errf(err, "sampler: accepted token %d outside [0, %d)", token, s->vocab);
    long j = hget(s, token, err);
    if (j < 0) return -1;
    if ((s->hvals[j] & COUNT_MASK) != COUNT_MASK) s->hvals[j]++;
    s->step++;
    return 0;
}

uint64_t dsv4_sampler_step(const dsv4_sampler *s) { return s->step; }

uint32_t dsv4_sampler_count(const dsv4_sampler *s, int32_t token) {
    const uint32_t *v = hfind(s, token);
    return v ? (*v & COUNT_MASK) : 0;
}

const float *dsv4_sampler_processed_logits(const dsv4_sampler *s) {
    return s->have_work ? s->work : NULL;
}

static void apply_penalties(dsv4_sampler *s) {
    const float rep = s->p.repetition_penalty, pres = s->p.presence_penalty,
                freq = s->p.frequency_penalty;
    if (rep == 1.0f && pres == 0.0f && freq == 0.0f) return;
    for (size_t i = 0; i < s->hcap; i++) {
        int32_t t = s->hkeys[i];
        if (t < 0) continue;
        uint32_t cnt = s->hvals[i] & COUNT_MASK;
        float l = s->work[t];
        if (rep != 1.0f) l = l > 0.0f ? l / rep : l * rep;
        if (cnt > 0) {
            l -= freq * (float)cnt;
            l -= pres;
        }
        s->work[t] = l;
    }
}

/* top_p histogram: bucket b holds the tokens with (m - z) * HIST_SCALE in [b, b + 1) (the last
 * one everything further down), so bucket order is z order and only one bucket needs sorting. */
#define HIST_BUCKETS 4096
#define HIST_SCALE 64.0

static inline int bucket_of(float z, double m) {
    double d = (m - (double)z) * HIST_SCALE;
    return d >= HIST_BUCKETS - 1 ? HIST_BUCKETS - 1 : (int)d;
}

/* The k-th largest finite z, counted with multiplicity (-inf when there are at most k finite
 * logits). Small k: a min-heap of the k largest values in one pass; large k: quickselect. */
#define TOPK_HEAP_MAX 1024

static float topk_threshold(const float *z, int V, size_t k, void *scratch) {
    if (k <= TOPK_HEAP_MAX) {
        float *h = scratch; /* h[0] = the smallest of the k largest seen so far */
        for (size_t i = 0; i < k; i++) h[i] = -INFINITY;
        for (int i = 0; i < V; i++) {
            float x = z[i];
            if (!(x > h[0])) continue;
            size_t j = 0; /* replace the root, sift down */
            for (;;) {
                size_t c = 2 * j + 1;
                if (c >= k) break;
                if (c + 1 < k && h[c + 1] < h[c]) c++;
                if (!(h[c] < x)) break;
                h[j] = h[c];
                j = c;
            }
            h[j] = x;
        }
        return h[0];
    }
    cand *K = scratch;
    size_t n = 0;
    for (int i = 0; i < V; i++)
        if (z[i] != -INFINITY) K[n++] = (cand){z[i], i};
    if (k >= n) return -INFINITY;
    select_best(K, n, k);
    float t = K[0].z;
    for (size_t i = 1; i < k; i++)
        if (K[i].z < t) t = K[i].z;
    return t;
}

int32_t dsv4_sampler_sample(dsv4_sampler *s, const float *logits, dsv4_err *err) {
    const int V = s->vocab;
    if (!logits) return dsv4_errf(err, "sampler: no logits");
    s->have_work = false;
    int bad = 0;
    for (int i = 0; i < V; i++) bad |= !(logits[i] < INFINITY); /* NaN or +inf */
    if (bad)
        for (int i = 0; i < V; i++)
            if (!(logits[i] < INFINITY))
                return dsv4_errf(err, "sampler: logit of token %d is %s", i,
                                 isnan(logits[i]) ? "NaN" : "+inf");
    memcpy(s->work, logits, (size_t)V * sizeof *s->work);
    for (size_t i = 0; i < s->p.n_bias; i++) s->work[s->p.bias_tok[i]] += s->p.bias_val[i];
    apply_penalties(s);
    float *z = s->work;

    if (s->p.temperature < 1e-5f) { /* greedy: first maximum = lowest id on ties */
        s->have_work = true;
        int best = 0;
        for (int i = 1; i < V; i++)
            if (z[i] > z[best]) best = i;
        if (z[best] == -INFINITY) return dsv4_errf(err, "sampler: every logit is -inf");
        return best;
    }

    const float T = s->p.temperature;
    if (T != 1.0f)
        for (int i = 0; i < V; i++) z[i] = z[i] / T;
    float mz = -INFINITY;
    for (int i = 0; i < V; i++) mz = z[i] > mz ? z[i] : mz;
    s->have_work = true;
    if (mz == -INFINITY) return dsv4_errf(err, "sampler: every logit is -inf");
    if (!isfinite(mz)) return dsv4_errf(err, "sampler: logits overflow after temperature");
    if (!s->scratch) s->scratch = malloc((size_t)V * sizeof(double));
    if (!s->hist) s->hist = malloc(HIST_BUCKETS * (sizeof *s->hist + sizeof(uint32_t)));
    if (!s->scratch || !s->hist) return dsv4_errf(err, "sampler: out of memory for %d candidates", V);
    const double m = mz;
    const double u = dsv4_rng_uniform(s->p.seed, s->step);

    /* The filters as thresholds on (z, id): keep i iff z_i > -inf, z_i >= zlo and
     * (z_i, i) is not worse than (zc, idc). */
    float zlo = dsv4_minp_threshold(mz, s->p.min_p); /* min_p: w_i >= min_p <=> z_i >= zlo */
    if (s->p.top_k > 0 && s->p.top_k < V) {
        /* min_p and top_k both keep a prefix of the (z desc) order, so they commute: the k-th
         * largest z over all finite tokens is the top_k threshold. */
        float tk = topk_threshold(z, V, (size_t)s->p.top_k, s->scratch);
        if (tk > zlo) zlo = tk;
    }
    float zc = INFINITY; /* top_p cut: the last kept token in (z desc, id asc) order */
    int32_t idc = -1;
    double *w = s->scratch; /* weights, indexed by token id */
    const bool use_p = s->p.top_p < 1.0f;
    if (use_p) {
        /* Mass per log-space bucket (bucket order = z order); find the bucket where the
         * cumulative mass reaches top_p * W and search the cut only inside it. */
        double *hist = s->hist, W = 0;
        uint32_t *cnt = (uint32_t *)(s->hist + HIST_BUCKETS);
        memset(hist, 0, HIST_BUCKETS * sizeof *hist);
        memset(cnt, 0, HIST_BUCKETS * sizeof *cnt);
        for (int i = 0; i < V; i++) {
            w[i] = 0;
            if (!(z[i] >= zlo) || z[i] == -INFINITY) continue;
            int b = bucket_of(z[i], m);
            w[i] = exp((double)z[i] - m);
            hist[b] += w[i];
            cnt[b]++;
            W += w[i];
        }
        const double P = (double)s->p.top_p * W;
        double cum = 0;
        int bc = -1;
        for (int b = 0; b < HIST_BUCKETS; b++) {
            if (cum + hist[b] >= P) {
                bc = b;
                break;
            }
            cum += hist[b];
        }
        /* (bc < 0 or an empty bucket only if rounding defeated P < W: keep everything) */
        if (bc >= 0 && cnt[bc] > 0) {
            cand *K = malloc(cnt[bc] * sizeof *K);
            if (!K) return dsv4_errf(err, "sampler: out of memory for %u top_p candidates", cnt[bc]);
            size_t nc = 0;
            for (int i = 0; i < V && nc < cnt[bc]; i++)
                if (w[i] > 0 && bucket_of(z[i], m) == bc) K[nc++] = (cand){z[i], i};
            /* w[i] > 0 misses tokens whose weight underflowed; they cannot be in a bucket that
             * reaches P before the last one, and the walk below stops at the first of them. */
            if (nc > 0) {
                cand cut = find_cut(K, nc, cum, P, m);
                zc = cut.z;
                idc = cut.id;
            }
            free(K);
        }
    }

    /* Draw: weights of the kept tokens in id order, then the inverse CDF. */
    double S = 0;
    int32_t last = -1;
    for (int i = 0; i < V; i++) {
        const float zi = z[i];
        const bool keep = zi >= zlo && zi != -INFINITY &&
                          (idc < 0 || zi > zc || (zi == zc && i <= idc));
        const double wi = !keep ? 0.0 : use_p ? w[i] : exp((double)zi - m);
        w[i] = wi;
        S += wi;
        if (wi > 0) last = i;
    }
    const double t = u * S;
    double c = 0;
    for (int i = 0; i < V; i++) {
        c += w[i];
        if (c > t) return i;
    }
    return last;
}

/* ---- Log-probabilities -------------------------------------------------------------------- */

int dsv4_logprobs(const float *logits, int vocab, int32_t token, int n_top, float *token_logprob,
                  dsv4_logprob *top, dsv4_err *err) {
    if (!logits || vocab <= 0) return dsv4_errf(err, "logprobs: no logits");
    if (token >= vocab) return dsv4_errf(err, "logprobs: token %d outside [0, %d)", token, vocab);
    if (n_top < 0) return dsv4_errf(err, "logprobs: top_logprobs must be >= 0, got %d", n_top);
    if (n_top > vocab) n_top = vocab;
    if (n_top > 0 && !top) return dsv4_errf(err, "logprobs: no output array for %d entries", n_top);
    float mz = -INFINITY;
    for (int i = 0; i < vocab; i++) {
        float l = logits[i];
        if (isnan(l) || l == INFINITY)
            return dsv4_errf(err, "logprobs: logit of token %d is %s", i, isnan(l) ? "NaN" : "+inf");
        if (l > mz) mz = l;
    }
    if (mz == -INFINITY) return dsv4_errf(err, "logprobs: every logit is -inf");
    const double m = mz;
    double S = 0;
    for (int i = 0; i < vocab; i++) S += exp((double)logits[i] - m);
    const double lse = m + log(S);
    if (token_logprob && token >= 0) *token_logprob = (float)((double)logits[token] - lse);
    if (n_top == 0) return 0;

    if (n_top <= 64) { /* bounded insertion list, best first */
        int cnt = 0;
        for (int i = 0; i < vocab; i++) {
            cand x = {logits[i], i};
            if (cnt == n_top && !better(x, (cand){top[cnt - 1].logprob, top[cnt - 1].token}))
                continue;
            int j = cnt < n_top ? cnt++ : cnt - 1;
            while (j > 0 && better(x, (cand){top[j - 1].logprob, top[j - 1].token})) {
                top[j] = top[j - 1];
                j--;
            }
            top[j].token = x.id;
            top[j].logprob = x.z;
        }
    } else {
        cand *a = malloc((size_t)vocab * sizeof *a);
        if (!a) return dsv4_errf(err, "logprobs: out of memory");
        for (int i = 0; i < vocab; i++) a[i] = (cand){logits[i], i};
        if (n_top < vocab) select_best(a, (size_t)vocab, (size_t)n_top);
        qsort(a, (size_t)n_top, sizeof *a, cmp_better);
        for (int i = 0; i < n_top; i++) top[i] = (dsv4_logprob){a[i].id, a[i].z};
        free(a);
    }
    for (int i = 0; i < n_top; i++) top[i].logprob = (float)((double)top[i].logprob - lse);
    return n_top;
}

/* ---- Stop strings ------------------------------------------------------------------------- */

void dsv4_stop_scan(const char *text, size_t len, size_t prev_len, const char *const *stops,
                    size_t n_stops, dsv4_stop_result *r) {
    r->stop = -1;
    r->cut = len;
    r->safe = len;
    r->hold = 0;
    if (!stops || !text) return;
    if (prev_len > len) prev_len = 0; /* not append-only: rescan everything */
    size_t best = (size_t)-1;
    for (size_t k = 0; k < n_stops; k++) {
        const char *st = stops[k];
        if (!st || !*st) continue;
        size_t L = strlen(st);
        if (L > len) continue;
        /* a new match ends after prev_len: it starts at >= prev_len + 1 - L */
        size_t from = prev_len + 1 > L ? prev_len + 1 - L : 0;
        for (size_t i = from; i + L <= len && i < best; i++) {
            if (text[i] == st[0] && memcmp(text + i, st, L) == 0) {
                best = i;
                r->stop = (int)k;
                break;
            }
        }
    }
    if (r->stop >= 0) {
        r->cut = best;
        r->safe = best;
        r->hold = len - best;
        return;
    }
    size_t hold = 0;
    for (size_t k = 0; k < n_stops; k++) {
        const char *st = stops[k];
        if (!st || !*st) continue;
        size_t L = strlen(st);
        size_t h = L - 1 < len ? L - 1 : len;
        for (; h > hold; h--)
            if (memcmp(text + len - h, st, h) == 0) break;
        if (h > hold) hold = h;
    }
    r->hold = hold;
    r->safe = len - hold;
}
