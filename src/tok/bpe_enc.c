/* bpe_enc.c - encoding: added tokens, pre-tokenization (Split / ByteLevel), BPE merges, word cache.
 * See bpe.h. The steps follow tokenizers' TokenizerImpl::encode:
 *   1. AddedVocabulary::extract_and_normalize: leftmost-longest added tokens with normalized=false on the
 *      raw text, then (normalizer = identity) the normalized=true ones on the pieces in between;
 *   2. the pre-tokenizers, each on every piece the previous one produced (depth first here, which
 *      gives the same pieces in the same order);
 *   3. BPE on each piece: initial symbols = the byte-level characters, then repeatedly the pair with
 *      the lowest merge rank (leftmost on ties) is merged. */
#include <stdlib.h>
#include <string.h>

#include "bpe_int.h"

#ifndef TOK_SMALL_MAX
#define TOK_SMALL_MAX 48 /* pieces up to this many symbols use the quadratic scan, longer ones a heap */
#endif

/* ------------------------------------------------------------------------------------------------ */
/* word cache: piece bytes -> ids */

#define CACHE_SLOTS (1u << 16)
#define CACHE_MAX_ENTRIES (CACHE_SLOTS / 2)
#define CACHE_KEY_BYTES (2u << 20)
#define CACHE_IDS (1u << 19)
#define CACHE_MAX_KEY 255

#define PAIR_SLOTS (1u << 13)

/* A small direct-mapped cache in front of the merge table: pair -> rank (UINT32_MAX: no merge) and
 * merged id. Pair frequencies are very skewed, so most lookups hit here instead of missing the cache
 * on the 2 MB table. */
typedef struct pair_ent {
    uint64_t key; /* (a << 32 | b) + 1; 0 = empty */
    uint32_t rank;
    int32_t nid;
} pair_ent;

typedef struct cache_slot {
    uint64_t hash; /* 0 = empty */
    uint32_t koff, ioff;
    uint16_t klen, nids;
} cache_slot;

struct tok_cache {
    pair_ent *pairs;
    cache_slot *slot;
    uint32_t count;
    uint8_t *keys;
    size_t kn;
    int32_t *ids;
    size_t in;
};

void tok_cache_free(tok_cache *c) {
    if (!c) return;
    free(c->pairs);
    free(c->slot);
    free(c->keys);
    free(c->ids);
    free(c);
}

tok_cache *tok_cache_new(void) {
#ifdef TOK_NO_CACHE
    return NULL;
#endif
    tok_cache *c = calloc(1, sizeof *c);
    if (!c) return NULL;
    c->pairs = calloc(PAIR_SLOTS, sizeof *c->pairs);
    c->slot = calloc(CACHE_SLOTS, sizeof *c->slot);
    c->keys = malloc(CACHE_KEY_BYTES);
    c->ids = malloc(CACHE_IDS * sizeof *c->ids);
    if (!c->pairs || !c->slot || !c->keys || !c->ids) {
        tok_cache_free(c);
        return NULL;
    }
    return c;
}

static const cache_slot *cache_get(const tok_cache *c, const uint8_t *s, size_t n, uint64_t h) {
    for (uint32_t i = (uint32_t)h & (CACHE_SLOTS - 1);; i = (i + 1) & (CACHE_SLOTS - 1)) {
        const cache_slot *e = &c->slot[i];
        if (!e->hash) return NULL;
        if (e->hash == h && e->klen == n && !memcmp(c->keys + e->koff, s, n)) return e;
    }
}

static void cache_put(tok_cache *c, const uint8_t *s, size_t n, uint64_t h, const int32_t *ids, size_t nids) {
    if (c->count >= CACHE_MAX_ENTRIES || c->kn + n > CACHE_KEY_BYTES || c->in + nids > CACHE_IDS) {
        memset(c->slot, 0, CACHE_SLOTS * sizeof *c->slot);
        c->count = 0;
        c->kn = c->in = 0;
    }
    uint32_t i = (uint32_t)h & (CACHE_SLOTS - 1);
    while (c->slot[i].hash) i = (i + 1) & (CACHE_SLOTS - 1);
    cache_slot *e = &c->slot[i];
    e->hash = h;
    e->koff = (uint32_t)c->kn;
    e->klen = (uint16_t)n;
    e->ioff = (uint32_t)c->in;
    e->nids = (uint16_t)nids;
    memcpy(c->keys + c->kn, s, n);
    memcpy(c->ids + c->in, ids, nids * sizeof *ids);
    c->kn += n;
    c->in += nids;
    c->count++;
}

/* ------------------------------------------------------------------------------------------------ */
/* encoder state */

typedef struct segv {
    size_t *a;
    size_t n, cap; /* in size_t units */
} segv;

typedef struct hent {
    uint32_t rank, pos;
    int32_t nid;
} hent;

typedef struct enc {
    const dsv4_tok *t;
    int flags;
    int32_t *ids;
    size_t n, cap;
    pcre2_match_data *md;
    pcre2_match_context *mctx;
    pcre2_jit_stack *js;
    int raised_limits;
    segv seg[TOK_MAX_STAGES + 1], out[TOK_MAX_STAGES + 1];
    tok_cache *cache;
    int32_t *sym, *nid, *prv, *nxt;
    uint32_t *rk;
    size_t scap;
    hent *heap;
    size_t hcap;
    uint8_t *map; /* ignore_merges: the byte-level string of a piece */
    size_t mapcap;
    void (*fn)(void *, const char *, size_t, int32_t);
    void *fctx;
    dsv4_err *err;
} enc;

static int oom(enc *e) { return dsv4_errf(e->err, "encode: out of memory"); }

static int push_ids(enc *e, const int32_t *ids, size_t n) {
    if (e->n + n > e->cap) {
        size_t c = e->cap ? e->cap : 256;
        while (c < e->n + n) c *= 2;
        int32_t *p = realloc(e->ids, c * sizeof *p);
        if (!p) return oom(e);
        e->ids = p;
        e->cap = c;
    }
    memcpy(e->ids + e->n, ids, n * sizeof *ids);
    e->n += n;
    return 0;
}

static int seg_push(enc *e, segv *v, size_t a, size_t b, size_t c) {
    if (v->n + 3 > v->cap) {
        size_t cap = v->cap ? v->cap * 2 : 96;
        size_t *p = realloc(v->a, cap * sizeof *p);
        if (!p) return oom(e);
        v->a = p;
        v->cap = cap;
    }
    v->a[v->n++] = a;
    v->a[v->n++] = b;
    v->a[v->n++] = c;
    return 0;
}

static int scratch(enc *e, size_t n) {
    if (n <= e->scap) return 0;
    size_t c = e->scap ? e->scap : 64;
    while (c < n) c *= 2;
    int32_t *a = realloc(e->sym, c * sizeof *a);
    if (!a) return oom(e);
    e->sym = a;
    int32_t *b = realloc(e->nid, c * sizeof *b);
    if (!b) return oom(e);
    e->nid = b;
    uint32_t *r = realloc(e->rk, c * sizeof *r);
    if (!r) return oom(e);
    e->rk = r;
    int32_t *p = realloc(e->prv, c * sizeof *p);
    if (!p) return oom(e);
    e->prv = p;
    int32_t *q = realloc(e->nxt, c * sizeof *q);
    if (!q) return oom(e);
    e->nxt = q;
    e->scap = c;
    return 0;
}

/* ------------------------------------------------------------------------------------------------ */
/* BPE */

static inline int merge_get(const dsv4_tok *t, int32_t a, int32_t b, uint32_t *rank, int32_t *nid) {
    uint64_t key = (uint64_t)a << t->merge_idb | (uint64_t)b;
    for (uint64_t i = tok_merge_slot(key, t->merge_mask);; i = (i + 1) & t->merge_mask) {
        uint64_t v = t->merge_tab[i];
        if ((v >> t->merge_rb) == key) {
            *rank = (uint32_t)(v & (((uint64_t)1 << t->merge_rb) - 1));
            *nid = t->merge_new[*rank];
            return 1;
        }
        if (v == UINT64_MAX) return 0;
    }
}

/* merge_get through the pair cache (when this call holds the shared cache). */
static inline int merge_lookup(const enc *e, int32_t a, int32_t b, uint32_t *rank, int32_t *nid) {
    if (!e->cache) return merge_get(e->t, a, b, rank, nid);
    uint64_t key = ((uint64_t)(uint32_t)a << 32 | (uint32_t)b) + 1;
    pair_ent *p = &e->cache->pairs[((key * 0x9E3779B97F4A7C15ull) >> 40) & (PAIR_SLOTS - 1)];
    if (p->key != key) {
        p->key = key;
        if (!merge_get(e->t, a, b, &p->rank, &p->nid)) p->rank = UINT32_MAX;
    }
    *rank = p->rank;
    *nid = p->nid;
    return p->rank != UINT32_MAX;
}

/* Short words: scan for the lowest-ranked pair (leftmost on ties), merge, repeat. The live symbols
 * form a linked list (nx), so a merge moves nothing. */
static size_t bpe_small(const enc *e, int32_t *sym, size_t n, uint32_t *rk, int32_t *nid, int32_t *nx) {
    if (n < 2) return n;
    for (size_t i = 0; i < n; i++) {
        nx[i] = i + 1 < n ? (int32_t)i + 1 : -1;
        if (i + 1 < n && !merge_lookup(e, sym[i], sym[i + 1], &rk[i], &nid[i])) rk[i] = UINT32_MAX;
    }
    rk[n - 1] = UINT32_MAX;
    size_t live = n;
    while (live > 1) {
        uint32_t best = UINT32_MAX;
        int32_t bi = -1, bp = -1;
        for (int32_t i = 0, p = -1; i >= 0; p = i, i = nx[i])
            if (rk[i] < best) {
                best = rk[i];
                bi = i;
                bp = p;
            }
        if (bi < 0) break;
        int32_t j = nx[bi];
        sym[bi] = nid[bi];
        nx[bi] = nx[j];
        live--;
        if (nx[bi] < 0 || !merge_lookup(e, sym[bi], sym[nx[bi]], &rk[bi], &nid[bi])) rk[bi] = UINT32_MAX;
        if (bp >= 0 && !merge_lookup(e, sym[bp], sym[bi], &rk[bp], &nid[bp])) rk[bp] = UINT32_MAX;
    }
    size_t m = 0;
    for (int32_t i = 0; i >= 0; i = nx[i]) sym[m++] = sym[i];
    return m;
}

static inline int hless(const hent *a, const hent *b) {
    return a->rank < b->rank || (a->rank == b->rank && a->pos < b->pos);
}

static int heap_push(enc *e, size_t *hn, hent x) {
    if (*hn == e->hcap) {
        size_t c = e->hcap ? e->hcap * 2 : 256;
        hent *p = realloc(e->heap, c * sizeof *p);
        if (!p) return oom(e);
        e->heap = p;
        e->hcap = c;
    }
    hent *h = e->heap;
    size_t i = (*hn)++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!hless(&x, &h[p])) break;
        h[i] = h[p];
        i = p;
    }
    h[i] = x;
    return 0;
}

static hent heap_pop(enc *e, size_t *hn) {
    hent *h = e->heap;
    hent top = h[0], x = h[--*hn];
    size_t n = *hn, i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= n) break;
        if (c + 1 < n && hless(&h[c + 1], &h[c])) c++;
        if (!hless(&h[c], &x)) break;
        h[i] = h[c];
        i = c;
    }
    if (n) h[i] = x;
    return top;
}

/* Long words: tokenizers' Word::merge_all (priority queue of (rank, position), stale entries skipped). */
static int bpe_heap(enc *e, int32_t *sym, size_t *np) {
    size_t n = *np, hn = 0;
    int32_t *prv = e->prv, *nxt = e->nxt;
    uint8_t *dead = (uint8_t *)e->rk; /* reuse: rk has n entries of 4 bytes */
    memset(dead, 0, n);
    for (size_t i = 0; i < n; i++) {
        prv[i] = (int32_t)i - 1;
        nxt[i] = i + 1 < n ? (int32_t)i + 1 : -1;
    }
    for (size_t i = 0; i + 1 < n; i++) {
        hent x;
        if (merge_lookup(e, sym[i], sym[i + 1], &x.rank, &x.nid)) {
            x.pos = (uint32_t)i;
            if (heap_push(e, &hn, x)) return -1;
        }
    }
    while (hn) {
        hent top = heap_pop(e, &hn);
        size_t p = top.pos;
        if (dead[p] || nxt[p] < 0) continue;
        size_t q = (size_t)nxt[p];
        uint32_t r;
        int32_t id;
        if (!merge_lookup(e, sym[p], sym[q], &r, &id) || id != top.nid) continue;
        sym[p] = top.nid;
        dead[q] = 1;
        nxt[p] = nxt[q];
        if (nxt[q] >= 0) prv[nxt[q]] = (int32_t)p;
        hent x;
        if (prv[p] >= 0 && merge_lookup(e, sym[prv[p]], sym[p], &x.rank, &x.nid)) {
            x.pos = (uint32_t)prv[p];
            if (heap_push(e, &hn, x)) return -1;
        }
        if (nxt[p] >= 0 && merge_lookup(e, sym[p], sym[nxt[p]], &x.rank, &x.nid)) {
            x.pos = (uint32_t)p;
            if (heap_push(e, &hn, x)) return -1;
        }
    }
    size_t m = 0;
    for (int32_t i = 0; i >= 0; i = nxt[i]) sym[m++] = sym[i];
    *np = m;
    return 0;
}

/* One pre-token -> ids. */
static int model_piece(enc *e, const uint8_t *s, size_t n) {
    const dsv4_tok *t = e->t;
    if (e->fn) {
        e->fn(e->fctx, (const char *)s, n, -1);
        return 0;
    }
    uint64_t h = 0;
    if (e->cache && n <= CACHE_MAX_KEY) {
        h = tok_hash(s, n) | 1;
        const cache_slot *c = cache_get(e->cache, s, n, h);
        if (c) return push_ids(e, e->cache->ids + c->ioff, c->nids);
    }
    if (scratch(e, n + 1)) return -1;
    int32_t *sym = e->sym;
    size_t ns = 0;
    if (t->ignore_merges) { /* the whole piece in the vocab: one token */
        if (e->mapcap < 2 * n) {
            uint8_t *p = realloc(e->map, 2 * n);
            if (!p) return oom(e);
            e->map = p;
            e->mapcap = 2 * n;
        }
        size_t m = 0;
        if (t->byte_level) {
            for (size_t i = 0; i < n; i++) {
                uint32_t cp = tok_byte_to_cp(s[i]);
                if (cp < 0x80) e->map[m++] = (uint8_t)cp;
                else {
                    e->map[m++] = (uint8_t)(0xC0 | (cp >> 6));
                    e->map[m++] = (uint8_t)(0x80 | (cp & 0x3F));
                }
            }
        } else {
            memcpy(e->map, s, n);
            m = n;
        }
        int32_t id = tok_strmap_get(&t->vocab, (const char *)e->map, m);
        if (id >= 0) return push_ids(e, &id, 1);
    }
    int unk = 0; /* a pending unknown token (tokenizers' `unk`) */
    for (size_t i = 0; i < n;) {
        uint8_t u[4];
        size_t ul;
        int32_t id;
        if (t->byte_level) {
            id = t->byte_sym[s[i]];
            if (id >= 0 && !unk) { /* the usual case */
                sym[ns++] = id;
                i++;
                continue;
            }
            uint32_t cp = tok_byte_to_cp(s[i]);
            if (cp < 0x80) {
                u[0] = (uint8_t)cp;
                ul = 1;
            } else {
                u[0] = (uint8_t)(0xC0 | (cp >> 6));
                u[1] = (uint8_t)(0x80 | (cp & 0x3F));
                ul = 2;
            }
            i++;
        } else {
            int bad = 0, w = tok_utf8_seq(s + i, n - i, &bad);
            ul = w > 0 ? (size_t)w : 1;
            memcpy(u, s + i, ul);
            id = tok_strmap_get(&t->vocab, (const char *)u, ul);
            i += ul;
        }
        if (id >= 0) {
            if (unk) {
                sym[ns++] = t->unk_id;
                unk = 0;
            }
            sym[ns++] = id;
            continue;
        }
        if (t->byte_fallback) {
            int ok = 1;
            for (size_t k = 0; k < ul; k++) ok &= t->byte_fb[u[k]] >= 0;
            if (ok) {
                for (size_t k = 0; k < ul; k++) sym[ns++] = t->byte_fb[u[k]];
                continue;
            }
        }
        if (t->unk_id >= 0) {
            if (unk && !t->fuse_unk) sym[ns++] = t->unk_id;
            unk = 1;
        }
    }
    if (unk) sym[ns++] = t->unk_id;
    if (ns <= TOK_SMALL_MAX) {
        ns = bpe_small(e, sym, ns, e->rk, e->nid, e->nxt);
    } else if (bpe_heap(e, sym, &ns)) {
        return -1;
    }
    if (e->cache && n <= CACHE_MAX_KEY) cache_put(e->cache, s, n, h, sym, ns);
    return push_ids(e, sym, ns);
}

/* ------------------------------------------------------------------------------------------------ */
/* pre-tokenization */

static int process(enc *e, int k, const uint8_t *s, size_t n);

static int re_find(enc *e, const pcre2_code *re, int jit, int fast, const uint8_t *s, size_t n, size_t off,
                   size_t *ms, size_t *me) {
    if (fast) {
        int r = tok_fast_find(fast, s, n, off, ms, me);
        if (r >= 0) return r;
        off = *ms;
    }
    for (;;) {
        int rc = jit ? pcre2_jit_match(re, s, n, off, 0, e->md, e->mctx)
                     : pcre2_match(re, s, n, off, PCRE2_NO_UTF_CHECK, e->md, e->mctx);
        if (rc >= 0) {
            PCRE2_SIZE *ov = pcre2_get_ovector_pointer(e->md);
            *ms = ov[0];
            *me = ov[1] < ov[0] ? ov[0] : ov[1];
            return 1;
        }
        if (rc == PCRE2_ERROR_NOMATCH) return 0;
        if (!e->raised_limits && (rc == PCRE2_ERROR_JIT_STACKLIMIT || rc == PCRE2_ERROR_HEAPLIMIT ||
                                  rc == PCRE2_ERROR_MATCHLIMIT || rc == PCRE2_ERROR_DEPTHLIMIT)) {
            e->raised_limits = 1;
            if (!e->mctx) e->mctx = pcre2_match_context_create(NULL);
            if (!e->mctx) return oom(e);
            e->js = pcre2_jit_stack_create(64 * 1024, 256u * 1024 * 1024, NULL);
            if (e->js) pcre2_jit_stack_assign(e->mctx, NULL, e->js);
            pcre2_set_heap_limit(e->mctx, 4u * 1024 * 1024); /* KiB: 4 GiB */
            pcre2_set_match_limit(e->mctx, UINT32_MAX);
            pcre2_set_depth_limit(e->mctx, UINT32_MAX);
            continue;
        }
        PCRE2_UCHAR msg[160];
        pcre2_get_error_message(rc, msg, sizeof msg);
        return dsv4_errf(e->err, "encode: regex match failed: %s", (const char *)msg);
    }
}

static size_t utf8_len_at(const uint8_t *s, size_t n) {
    uint8_t c = s[0];
    size_t l = c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
    return l < n ? l : n;
}

/* tokenizers' NormalizedString::split with a regex (Oniguruma find_iter) and a behavior; every kept
 * non-empty piece goes on to stage k+1. */
static int split_run(enc *e, int k, const pcre2_code *re, int jit, int fast, int behavior, int invert,
                     const uint8_t *s, size_t n) {
    if (re && behavior == BH_ISOLATED && !invert) { /* the common case: every piece in order, no list */
        size_t last_end = 0, prev = 0, last_match_end = 0;
        int have_last = 0;
        while (last_end <= n) {
            size_t ms = 0, me = 0;
            int r = re_find(e, re, jit, fast, s, n, last_end, &ms, &me);
            if (r < 0) return -1;
            if (!r) break;
            if (ms == me && have_last && last_match_end == me) {
                if (last_end >= n) break;
                last_end += utf8_len_at(s + last_end, n - last_end);
                continue;
            }
            last_end = me;
            last_match_end = me;
            have_last = 1;
            if (prev != ms && process(e, k + 1, s + prev, ms - prev)) return -1;
            if (me > ms && process(e, k + 1, s + ms, me - ms)) return -1;
            prev = me;
        }
        return prev != n ? process(e, k + 1, s + prev, n - prev) : 0;
    }
    segv *v = &e->seg[k];
    v->n = 0;
    if (re) {
        size_t last_end = 0, prev = 0, last_match_end = 0;
        int have_last = 0;
        while (last_end <= n) {
            size_t ms = 0, me = 0;
            int r = re_find(e, re, jit, fast, s, n, last_end, &ms, &me);
            if (r < 0) return -1;
            if (!r) break;
            if (ms == me && have_last && last_match_end == me) { /* no empty match right after a match */
                if (last_end >= n) break;
                last_end += utf8_len_at(s + last_end, n - last_end);
                continue;
            }
            last_end = me;
            last_match_end = me;
            have_last = 1;
            if (prev != ms && seg_push(e, v, prev, ms, 0)) return -1;
            if (seg_push(e, v, ms, me, 1)) return -1;
            prev = me;
        }
        if (prev != n && seg_push(e, v, prev, n, 0)) return -1;
    } else if (seg_push(e, v, 0, n, 0)) {
        return -1;
    }
    size_t m = v->n / 3;
    size_t *a = v->a;
    if (invert)
        for (size_t i = 0; i < m; i++) a[3 * i + 2] ^= 1;
    if (behavior == BH_ISOLATED || behavior == BH_REMOVED) {
        for (size_t i = 0; i < m; i++) {
            if (behavior == BH_REMOVED && a[3 * i + 2]) continue;
            if (a[3 * i + 1] > a[3 * i] && process(e, k + 1, s + a[3 * i], a[3 * i + 1] - a[3 * i])) return -1;
            a = v->a; /* (not reallocated by deeper stages: they use their own vectors) */
        }
        return 0;
    }
    segv *o = &e->out[k];
    o->n = 0;
    int prev_match = 0;
    if (behavior == BH_MERGED_NEXT) { /* fold from the end, extending the last piece's start */
        for (size_t i = m; i-- > 0;) {
            int im = (int)a[3 * i + 2];
            if (im && !prev_match && o->n) o->a[o->n - 3] = a[3 * i];
            else if (seg_push(e, o, a[3 * i], a[3 * i + 1], 0)) return -1;
            prev_match = im;
        }
        for (size_t i = o->n / 3; i-- > 0;)
            if (o->a[3 * i + 1] > o->a[3 * i] && process(e, k + 1, s + o->a[3 * i], o->a[3 * i + 1] - o->a[3 * i]))
                return -1;
        return 0;
    }
    for (size_t i = 0; i < m; i++) {
        int im = (int)a[3 * i + 2];
        int merge = behavior == BH_CONTIGUOUS ? im == prev_match : (im && !prev_match);
        if (merge && o->n) o->a[o->n - 2] = a[3 * i + 1];
        else if (seg_push(e, o, a[3 * i], a[3 * i + 1], 0)) return -1;
        prev_match = im;
    }
    for (size_t i = 0; i < o->n / 3; i++)
        if (o->a[3 * i + 1] > o->a[3 * i] && process(e, k + 1, s + o->a[3 * i], o->a[3 * i + 1] - o->a[3 * i]))
            return -1;
    return 0;
}

static int process(enc *e, int k, const uint8_t *s, size_t n) {
    const dsv4_tok *t = e->t;
    if (n == 0) return 0;
    while (k < t->n_stages && t->stage[k].noop) k++;
    if (k == t->n_stages) return model_piece(e, s, n);
    const tok_stage *st = &t->stage[k];
    if (st->type == ST_SPLIT) return split_run(e, k, st->re, st->jit, st->fast, st->behavior, st->invert, s, n);
    /* ByteLevel: optional prefix space, optional GPT-2 split; the byte mapping itself is implicit */
    uint8_t *tmp = NULL;
    if (st->add_prefix_space && s[0] != ' ') {
        tmp = malloc(n + 1);
        if (!tmp) return oom(e);
        tmp[0] = ' ';
        memcpy(tmp + 1, s, n);
        s = tmp;
        n++;
    }
    int rc = st->use_regex ? split_run(e, k, st->re, st->jit, 0, BH_ISOLATED, 0, s, n) : process(e, k + 1, s, n);
    free(tmp);
    return rc;
}

/* ------------------------------------------------------------------------------------------------ */
/* added tokens */

static int is_alnum_at(const dsv4_tok *t, pcre2_match_data *md, const uint8_t *s, size_t n) {
    return pcre2_match(t->re_alnum, s, n, 0, PCRE2_ANCHORED | PCRE2_NO_UTF_CHECK, md, NULL) >= 0;
}

static int emit_added(enc *e, const tok_added *a) {
    if (e->fn) {
        e->fn(e->fctx, a->content, a->len, a->id);
        return 0;
    }
    return push_ids(e, &a->id, 1);
}

/* tokenizers' AddedVocabulary::find_matches + split_with_indices on s[0..n); pass 0 = normalized=false
 * tokens (gaps go to pass 1), pass 1 = normalized=true tokens (gaps go to the pre-tokenizers). */
static int added_pass(enc *e, int pass, const uint8_t *s, size_t n) {
    const dsv4_tok *t = e->t;
    const tok_trie *tr = pass == 0 ? &t->trie_raw : &t->trie_norm;
    if (n == 0) return 0;
    if (tr->n_first == 0) return pass == 0 ? added_pass(e, 1, s, n) : process(e, 0, s, n);
    size_t start_offset = 0, pos = 0;
    while (pos < n) {
        size_t i;
        if (tr->n_first == 1) {
            const uint8_t *q = memchr(s + pos, tr->first_byte, n - pos);
            if (!q) break;
            i = (size_t)(q - s);
        } else {
            i = pos;
            while (i < n && !tr->first[s[i]]) i++;
            if (i >= n) break;
        }
        uint32_t node = 0;
        int32_t best = -1;
        size_t bend = 0;
        for (size_t j = i; j < n; j++) {
            uint64_t key = (uint64_t)node << 8 | s[j];
            uint64_t sl = ((key * 0x9E3779B97F4A7C15ull) >> 17) & tr->mask;
            while (tr->keys[sl] != UINT64_MAX && tr->keys[sl] != key) sl = (sl + 1) & tr->mask;
            if (tr->keys[sl] == UINT64_MAX) break;
            node = tr->child[sl];
            if (tr->term[node] >= 0) {
                best = tr->term[node];
                bend = j + 1;
            }
        }
        if (best < 0) {
            pos = i + 1;
            continue;
        }
        pos = bend; /* the search goes on after this match, used or not */
        const tok_added *a = &t->added[best];
        if ((e->flags & DSV4_TOK_NO_SPECIAL) && a->special) continue;
        size_t start = i, stop = bend;
        if (a->single_word) {
            int before = 0, after = 0;
            if (start > 0) {
                size_t b = start - 1;
                while (b > 0 && (s[b] & 0xC0) == 0x80) b--;
                before = is_alnum_at(t, e->md, s + b, start - b);
            }
            if (stop < n) after = is_alnum_at(t, e->md, s + stop, utf8_len_at(s + stop, n - stop));
            if (before || after) continue;
        }
        if (a->lstrip) { /* take in the whitespace before it (not what an earlier match took) */
            size_t b = start;
            while (b > 0) {
                size_t c = b - 1;
                while (c > 0 && (s[c] & 0xC0) == 0x80) c--;
                int l;
                if (!tok_is_white_space(tok_utf8_cp(s + c, b - c, &l))) break;
                b = c;
            }
            start = b > start_offset ? b : start_offset;
        }
        if (a->rstrip) {
            while (stop < n) {
                int l;
                uint32_t cp = tok_utf8_cp(s + stop, n - stop, &l);
                if (!tok_is_white_space(cp)) break;
                stop += (size_t)l;
            }
        }
        if (start > start_offset) {
            int rc = pass == 0 ? added_pass(e, 1, s + start_offset, start - start_offset)
                               : process(e, 0, s + start_offset, start - start_offset);
            if (rc) return -1;
        }
        if (emit_added(e, a)) return -1;
        start_offset = stop;
    }
    if (start_offset < n)
        return pass == 0 ? added_pass(e, 1, s + start_offset, n - start_offset)
                         : process(e, 0, s + start_offset, n - start_offset);
    return 0;
}

/* ------------------------------------------------------------------------------------------------ */

static int utf8_valid(const uint8_t *s, size_t n) {
    size_t i = 0;
    while (i < n) {
        if (i + 8 <= n) {
            uint64_t v;
            memcpy(&v, s + i, 8);
            if (!(v & 0x8080808080808080ull)) {
                i += 8;
                continue;
            }
        }
        if (s[i] < 0x80) {
            i++;
            continue;
        }
        int bad, w = tok_utf8_seq(s + i, n - i, &bad);
        if (w <= 0) return 0;
        i += (size_t)w;
    }
    return 1;
}

static int run(const dsv4_tok *t, const char *text, size_t len, int flags, enc *e) {
    const uint8_t *s = (const uint8_t *)text;
    uint8_t *fixed = NULL;
    int rc = -1;
    if (!s) len = 0;
    if (len && !utf8_valid(s, len)) { /* like bytes.decode("utf-8", "replace") */
        fixed = malloc(3 * len + 1);
        if (!fixed) return oom(e);
        size_t o = 0;
        tok_utf8_lossy(s, len, 1, fixed, &o);
        s = fixed;
        len = o;
    }
    e->t = t;
    e->flags = flags;
    e->md = pcre2_match_data_create(1, NULL);
    if (!e->md) {
        free(fixed);
        return oom(e);
    }
    pthread_mutex_t *mu = (pthread_mutex_t *)&t->cache_mu; /* the cache is the one mutable part */
    if (t->cache && !e->fn && pthread_mutex_trylock(mu) == 0) e->cache = t->cache;
    rc = len ? added_pass(e, 0, s, len) : 0;
    if (e->cache) pthread_mutex_unlock(mu);
    free(fixed);
    pcre2_match_data_free(e->md);
    if (e->mctx) pcre2_match_context_free(e->mctx);
    if (e->js) pcre2_jit_stack_free(e->js);
    for (int k = 0; k <= TOK_MAX_STAGES; k++) {
        free(e->seg[k].a);
        free(e->out[k].a);
    }
    free(e->sym);
    free(e->nid);
    free(e->rk);
    free(e->prv);
    free(e->nxt);
    free(e->heap);
    free(e->map);
    return rc;
}

int32_t *dsv4_tok_encode(const dsv4_tok *t, const char *text, size_t len, int flags, size_t *n_out, dsv4_err *err) {
    enc e;
    memset(&e, 0, sizeof e);
    e.err = err;
    if (run(t, text, len, flags, &e)) {
        free(e.ids);
        if (n_out) *n_out = 0;
        return NULL;
    }
    if (!e.ids) {
        e.ids = malloc(sizeof *e.ids);
        if (!e.ids) {
            dsv4_errf(err, "encode: out of memory");
            return NULL;
        }
    }
    if (n_out) *n_out = e.n;
    return e.ids;
}

int dsv4_tok_pretokenize(const dsv4_tok *t, const char *text, size_t len, int flags,
                         void (*fn)(void *ctx, const char *piece, size_t n, int32_t id), void *ctx, dsv4_err *err) {
    enc e;
    memset(&e, 0, sizeof e);
    e.err = err;
    e.fn = fn;
    e.fctx = ctx;
    int rc = run(t, text, len, flags, &e);
    free(e.ids);
    return rc;
}
