/* bpe.c - loading tokenizer.json, token lookups, decoding and the streaming detokenizer. Encoding is
 * in bpe_enc.c, regex translation and UTF-8 helpers in bpe_re.c. See bpe.h. */
#include "bpe.h"

#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "bpe_int.h"
#include "../util/json.h"
#include "../util/strbuf.h"

/* ------------------------------------------------------------------------------------------------ */
/* hashing, string map */

uint64_t tok_hash(const void *p, size_t n) {
    const uint8_t *s = p;
    uint64_t h = 0x9E3779B97F4A7C15ull ^ (n * 0xC2B2AE3D27D4EB4Full);
    while (n >= 8) {
        uint64_t v;
        memcpy(&v, s, 8);
        h = (h ^ v) * 0xFF51AFD7ED558CCDull;
        h ^= h >> 32;
        s += 8;
        n -= 8;
    }
    uint64_t v = 0;
    memcpy(&v, s, n);
    h = (h ^ v) * 0xC4CEB9FE1A85EC53ull;
    h ^= h >> 29;
    h *= 0xFF51AFD7ED558CCDull;
    h ^= h >> 32;
    return h;
}

static int strmap_init(tok_strmap *m, size_t n) {
    size_t cap = 16;
    while (cap < 2 * n + 2) cap *= 2;
    m->e = calloc(cap, sizeof *m->e);
    if (!m->e) return -1;
    m->mask = cap - 1;
    m->n = 0;
    return 0;
}

/* Inserts or overwrites. s must outlive the map. */
static void strmap_put(tok_strmap *m, const char *s, size_t len, int32_t id) {
    uint64_t h = tok_hash(s, len);
    for (uint64_t i = h & m->mask;; i = (i + 1) & m->mask) {
        tok_strmap_ent *e = &m->e[i];
        if (!e->s) {
            e->s = s;
            e->len = (uint32_t)len;
            e->id = id;
            e->hash = h;
            m->n++;
            return;
        }
        if (e->hash == h && e->len == len && !memcmp(e->s, s, len)) {
            e->id = id;
            return;
        }
    }
}

int32_t tok_strmap_get(const tok_strmap *m, const char *s, size_t len) {
    if (!m->e) return -1;
    uint64_t h = tok_hash(s, len);
    for (uint64_t i = h & m->mask;; i = (i + 1) & m->mask) {
        const tok_strmap_ent *e = &m->e[i];
        if (!e->s) return -1;
        if (e->hash == h && e->len == len && !memcmp(e->s, s, len)) return e->id;
    }
}

/* ------------------------------------------------------------------------------------------------ */
/* added-token trie */

static int trie_init(tok_trie *tr, size_t total_bytes) {
    memset(tr, 0, sizeof *tr);
    size_t cap = 16;
    while (cap < 2 * total_bytes + 2) cap *= 2;
    tr->keys = malloc(cap * sizeof *tr->keys);
    tr->child = malloc(cap * sizeof *tr->child);
    tr->cap_nodes = (uint32_t)total_bytes + 1;
    tr->term = malloc(tr->cap_nodes * sizeof *tr->term);
    if (!tr->keys || !tr->child || !tr->term) return -1;
    memset(tr->keys, 0xFF, cap * sizeof *tr->keys);
    tr->mask = cap - 1;
    tr->n_nodes = 1;
    tr->term[0] = -1;
    return 0;
}

static void trie_free(tok_trie *tr) {
    free(tr->keys);
    free(tr->child);
    free(tr->term);
}

static inline uint64_t trie_slot(uint64_t key, uint64_t mask) { return ((key * 0x9E3779B97F4A7C15ull) >> 17) & mask; }

/* Adds content as pattern `idx` (the first one wins for equal contents, as aho-corasick reports the
 * lowest pattern id; they map to the same id anyway). */
static void trie_add(tok_trie *tr, const char *s, size_t n, int32_t idx) {
    uint32_t node = 0;
    for (size_t i = 0; i < n; i++) {
        uint64_t key = (uint64_t)node << 8 | (uint8_t)s[i];
        uint64_t j = trie_slot(key, tr->mask);
        while (tr->keys[j] != UINT64_MAX && tr->keys[j] != key) j = (j + 1) & tr->mask;
        if (tr->keys[j] == UINT64_MAX) {
            tr->keys[j] = key;
            tr->child[j] = tr->n_nodes;
            tr->term[tr->n_nodes] = -1;
            tr->n_nodes++;
        }
        node = tr->child[j];
    }
    if (tr->term[node] < 0) tr->term[node] = idx;
    uint8_t f = (uint8_t)s[0];
    if (!tr->first[f]) {
        tr->first[f] = 1;
        tr->n_first++;
        tr->first_byte = f;
    }
}

/* ------------------------------------------------------------------------------------------------ */
/* loading */

/* 1/0 for true/false, dflt when missing or null, -1 (error set) for another type. */
static int json_flag(const cJSON *o, const char *key, int dflt, const char *name, const char *where,
                     dsv4_err *err) {
    const cJSON *j = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!j || cJSON_IsNull(j)) return dflt;
    if (!cJSON_IsBool(j))
        return dsv4_errf(err, "%s: %s.%s: expected a boolean, got %s", name, where, key, dsv4_json_kind(j));
    return cJSON_IsTrue(j) ? 1 : 0;
}

/* A JSON number that is an integer in [0, INT32_MAX). */
static int json_id(const cJSON *j, int32_t *out) {
    if (!cJSON_IsNumber(j)) return -1;
    double d = j->valuedouble;
    if (!(d >= 0 && d < 2147483647.0) || d != floor(d)) return -1;
    *out = (int32_t)d;
    return 0;
}

static int check_normalizer(const cJSON *n, const char *name, const char *where, dsv4_err *err) {
    if (!n || cJSON_IsNull(n)) return 0;
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(n, "type");
    if (!cJSON_IsString(type))
        return dsv4_errf(err, "%s: %s.type: expected a string, got %s", name, where, dsv4_json_kind(type));
    if (!strcmp(type->valuestring, "Sequence")) {
        const cJSON *list = cJSON_GetObjectItemCaseSensitive(n, "normalizers");
        if (!cJSON_IsArray(list))
            return dsv4_errf(err, "%s: %s.normalizers: expected an array, got %s", name, where, dsv4_json_kind(list));
        int i = 0;
        const cJSON *x;
        cJSON_ArrayForEach(x, list) {
            char sub[160];
            snprintf(sub, sizeof sub, "%s.normalizers[%d]", where, i++);
            if (check_normalizer(x, name, sub, err)) return -1;
        }
        return 0;
    }
    return dsv4_errf(err, "%s: %s: normalizer type '%s' is not supported (only null or an empty Sequence)", name,
                     where, type->valuestring);
}

static int check_decoder(const cJSON *d, const char *name, const char *where, dsv4_err *err) {
    if (!d || cJSON_IsNull(d))
        return dsv4_errf(err, "%s: %s: missing (a ByteLevel decoder is required)", name, where);
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(d, "type");
    if (!cJSON_IsString(type))
        return dsv4_errf(err, "%s: %s.type: expected a string, got %s", name, where, dsv4_json_kind(type));
    if (!strcmp(type->valuestring, "ByteLevel")) return 0;
    if (!strcmp(type->valuestring, "Sequence")) {
        const cJSON *list = cJSON_GetObjectItemCaseSensitive(d, "decoders");
        if (!cJSON_IsArray(list) || cJSON_GetArraySize(list) != 1)
            return dsv4_errf(err, "%s: %s.decoders: expected an array holding one ByteLevel decoder", name, where);
        char sub[160];
        snprintf(sub, sizeof sub, "%s.decoders[0]", where);
        return check_decoder(cJSON_GetArrayItem(list, 0), name, sub, err);
    }
    return dsv4_errf(err, "%s: %s: decoder type '%s' is not supported (ByteLevel only)", name, where, type->valuestring);
}

static const struct {
    const char *name;
    int b;
} behaviors[] = {{"Removed", BH_REMOVED},
                 {"Isolated", BH_ISOLATED},
                 {"MergedWithPrevious", BH_MERGED_PREV},
                 {"MergedWithNext", BH_MERGED_NEXT},
                 {"Contiguous", BH_CONTIGUOUS}};

#define GPT2_REGEX "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+"

static int load_pretok(dsv4_tok *t, const cJSON *p, const char *name, const char *where, dsv4_err *err) {
    if (!p || cJSON_IsNull(p)) return 0;
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(p, "type");
    if (!cJSON_IsString(type))
        return dsv4_errf(err, "%s: %s.type: expected a string, got %s", name, where, dsv4_json_kind(type));
    const char *ty = type->valuestring;
    char sub[200];
    if (!strcmp(ty, "Sequence")) {
        const cJSON *list = cJSON_GetObjectItemCaseSensitive(p, "pretokenizers");
        if (!cJSON_IsArray(list))
            return dsv4_errf(err, "%s: %s.pretokenizers: expected an array, got %s", name, where, dsv4_json_kind(list));
        int i = 0;
        const cJSON *x;
        cJSON_ArrayForEach(x, list) {
            snprintf(sub, sizeof sub, "%s.pretokenizers[%d]", where, i++);
            if (load_pretok(t, x, name, sub, err)) return -1;
        }
        return 0;
    }
    if (t->n_stages >= TOK_MAX_STAGES) return dsv4_errf(err, "%s: %s: more than %d pre-tokenizers", name, where, TOK_MAX_STAGES);
    tok_stage *st = &t->stage[t->n_stages];
    memset(st, 0, sizeof *st);
    if (!strcmp(ty, "Split")) {
        if (t->byte_level)
            return dsv4_errf(err, "%s: %s: a Split after a ByteLevel pre-tokenizer is not supported", name, where);
        const cJSON *pat = cJSON_GetObjectItemCaseSensitive(p, "pattern");
        const cJSON *rx = cJSON_GetObjectItemCaseSensitive(pat, "Regex");
        const cJSON *lit = cJSON_GetObjectItemCaseSensitive(pat, "String");
        const cJSON *src = cJSON_IsString(rx) ? rx : cJSON_IsString(lit) ? lit : NULL;
        if (!src)
            return dsv4_errf(err, "%s: %s.pattern: expected {\"Regex\": string} or {\"String\": string}", name, where);
        const cJSON *bh = cJSON_GetObjectItemCaseSensitive(p, "behavior");
        if (!cJSON_IsString(bh))
            return dsv4_errf(err, "%s: %s.behavior: expected a string, got %s", name, where, dsv4_json_kind(bh));
        st->behavior = -1;
        for (size_t i = 0; i < sizeof behaviors / sizeof behaviors[0]; i++)
            if (!strcmp(bh->valuestring, behaviors[i].name)) st->behavior = behaviors[i].b;
        if (st->behavior < 0) return dsv4_errf(err, "%s: %s.behavior: unknown value '%s'", name, where, bh->valuestring);
        int inv = json_flag(p, "invert", 0, name, where, err);
        if (inv < 0) return -1;
        st->invert = inv;
        st->type = ST_SPLIT;
        size_t plen = strlen(src->valuestring);
        if (src == lit && plen == 0) {
            st->empty_literal = 1;
        } else {
            snprintf(sub, sizeof sub, "%s: %s.pattern", name, where);
            st->re = tok_compile(src->valuestring, plen, src == lit, &st->jit, sub, err);
            if (!st->re) return -1;
            if (src == rx) st->fast = tok_fast_kind(src->valuestring, plen);
        }
        t->n_stages++;
        return 0;
    }
    if (!strcmp(ty, "ByteLevel")) {
        int aps = json_flag(p, "add_prefix_space", 1, name, where, err);
        int ur = aps < 0 ? -1 : json_flag(p, "use_regex", 1, name, where, err);
        if (ur < 0) return -1;
        if (t->byte_level) return dsv4_errf(err, "%s: %s: more than one ByteLevel pre-tokenizer", name, where);
        st->type = ST_BYTELEVEL;
        st->add_prefix_space = aps;
        st->use_regex = ur;
        st->noop = !aps && !ur;
        if (ur) {
            snprintf(sub, sizeof sub, "%s: %s (GPT-2 regex)", name, where);
            st->re = tok_compile(GPT2_REGEX, strlen(GPT2_REGEX), 0, &st->jit, sub, err);
            if (!st->re) return -1;
        }
        t->byte_level = 1;
        t->n_stages++;
        return 0;
    }
    return dsv4_errf(err, "%s: %s: pre-tokenizer type '%s' is not supported (Sequence, Split, ByteLevel)", name, where, ty);
}

/* Model vocab size as tokenizers counts it (number of entries) and the added tokens' ids. */
static int load_added(dsv4_tok *t, const cJSON *list, int32_t model_len, const char *name, dsv4_err *err) {
    if (!list || cJSON_IsNull(list)) return 0;
    if (!cJSON_IsArray(list))
        return dsv4_errf(err, "%s: added_tokens: expected an array, got %s", name, dsv4_json_kind(list));
    int n = cJSON_GetArraySize(list);
    t->added = calloc((size_t)n + 1, sizeof *t->added);
    if (!t->added) return dsv4_errf(err, "%s: out of memory", name);
    int i = 0;
    const cJSON *a;
    int32_t max_added = -1;
    cJSON_ArrayForEach(a, list) {
        char where[64];
        snprintf(where, sizeof where, "added_tokens[%d]", i);
        if (!cJSON_IsObject(a))
            return dsv4_errf(err, "%s: %s: expected an object, got %s", name, where, dsv4_json_kind(a));
        const cJSON *c = cJSON_GetObjectItemCaseSensitive(a, "content");
        if (!cJSON_IsString(c))
            return dsv4_errf(err, "%s: %s.content: expected a string, got %s", name, where, dsv4_json_kind(c));
        const cJSON *idj = cJSON_GetObjectItemCaseSensitive(a, "id");
        int32_t fid;
        if (idj && json_id(idj, &fid)) return dsv4_errf(err, "%s: %s.id: expected a non-negative integer", name, where);
        tok_added *x = &t->added[t->n_added];
        int sp = json_flag(a, "special", 0, name, where, err);
        int ls = sp < 0 ? -1 : json_flag(a, "lstrip", 0, name, where, err);
        int rs = ls < 0 ? -1 : json_flag(a, "rstrip", 0, name, where, err);
        int sw = rs < 0 ? -1 : json_flag(a, "single_word", 0, name, where, err);
        int nm = sw < 0 ? -1 : json_flag(a, "normalized", !sp, name, where, err);
        if (nm < 0) return -1;
        x->content = c->valuestring;
        x->len = (uint32_t)strlen(c->valuestring);
        x->special = (uint8_t)sp;
        x->lstrip = (uint8_t)ls;
        x->rstrip = (uint8_t)rs;
        x->single_word = (uint8_t)sw;
        x->normalized = (uint8_t)nm;
        /* tokenizers' AddedVocabulary::add_tokens: an existing token keeps its id, a new one gets the
         * next id after the model vocab / the largest added id. */
        int32_t id = tok_strmap_get(&t->added_map, x->content, x->len);
        if (id < 0) id = tok_strmap_get(&t->vocab, x->content, x->len);
        if (id < 0) {
            id = max_added < 0 ? model_len : (max_added >= model_len || model_len == 0 ? max_added + 1 : model_len);
        }
        if (id > max_added) max_added = id;
        x->id = id;
        strmap_put(&t->added_map, x->content, x->len, id);
        t->n_added++;
        i++;
    }
    return 0;
}

static int load_merges(dsv4_tok *t, const cJSON *merges, const char *name, dsv4_err *err) {
    int n = cJSON_GetArraySize(merges);
    size_t cap = 16;
    while (cap < 2 * (size_t)n + 2) cap *= 2;
    int idb = 1;
    while (((int64_t)1 << idb) - 1 <= (int64_t)t->n_ids) idb++; /* all-ones is never an id */
    int rb = 64 - 2 * idb;
    if (rb < 1 || ((uint64_t)1 << rb) - 1 <= (uint64_t)n)
        return dsv4_errf(err, "%s: model: %ld ids and %d merges do not fit the merge table", name, (long)t->n_ids, n);
    t->merge_idb = idb;
    t->merge_rb = rb;
    t->merge_tab = malloc(cap * sizeof *t->merge_tab);
    t->merge_new = malloc(((size_t)n + 1) * sizeof *t->merge_new);
    if (!t->merge_tab || !t->merge_new) return dsv4_errf(err, "%s: out of memory", name);
    memset(t->merge_tab, 0xFF, cap * sizeof *t->merge_tab);
    t->merge_mask = cap - 1;
    dsv4_sb buf = {0}; /* the merged token a+b */
    int i = 0, rank = 0;
    const cJSON *m;
    cJSON_ArrayForEach(m, merges) {
        const char *a, *b;
        size_t al, bl;
        if (cJSON_IsString(m)) {
            const char *s = m->valuestring;
            if (!strncmp(s, "#version", 8)) {
                i++;
                continue;
            }
            const char *sp = strchr(s, ' ');
            if (!sp || strchr(sp + 1, ' ')) {
                dsv4_sb_free(&buf);
                return dsv4_errf(err, "%s: model.merges[%d]: expected two tokens separated by one space, got \"%.80s\"",
                                 name, i, s);
            }
            a = s;
            al = (size_t)(sp - s);
            b = sp + 1;
            bl = strlen(b);
        } else if (cJSON_IsArray(m) && cJSON_GetArraySize(m) == 2 && cJSON_IsString(cJSON_GetArrayItem(m, 0)) &&
                   cJSON_IsString(cJSON_GetArrayItem(m, 1))) {
            a = cJSON_GetArrayItem(m, 0)->valuestring;
            b = cJSON_GetArrayItem(m, 1)->valuestring;
            al = strlen(a);
            bl = strlen(b);
        } else {
            dsv4_sb_free(&buf);
            return dsv4_errf(err, "%s: model.merges[%d]: expected a \"a b\" string or a pair of strings", name, i);
        }
        int32_t ia = tok_strmap_get(&t->vocab, a, al), ib = tok_strmap_get(&t->vocab, b, bl);
        if (ia < 0 || ib < 0) {
            dsv4_sb_free(&buf);
            return dsv4_errf(err, "%s: model.merges[%d]: token \"%.*s\" is not in model.vocab", name, i,
                             (int)(ia < 0 ? al : bl), ia < 0 ? a : b);
        }
        dsv4_sb_clear(&buf);
        if (dsv4_sb_put(&buf, a, al) || dsv4_sb_put(&buf, b, bl)) {
            dsv4_sb_free(&buf);
            return dsv4_errf(err, "%s: out of memory", name);
        }
        int32_t nid = tok_strmap_get(&t->vocab, buf.p, buf.n);
        if (nid < 0) {
            dsv4_errf(err, "%s: model.merges[%d]: merged token \"%.*s\" is not in model.vocab", name, i,
                      (int)buf.n, buf.p);
            dsv4_sb_free(&buf);
            return -1;
        }
        uint64_t key = (uint64_t)ia << idb | (uint64_t)ib;
        uint64_t j = tok_merge_slot(key, t->merge_mask);
        while (t->merge_tab[j] != UINT64_MAX && (t->merge_tab[j] >> rb) != key) j = (j + 1) & t->merge_mask;
        t->merge_tab[j] = key << rb | (uint64_t)rank; /* a later duplicate overrides, like a HashMap */
        t->merge_new[rank] = nid;
        rank++;
        i++;
    }
    dsv4_sb_free(&buf);
    return 0;
}

static dsv4_tok *load_root(const cJSON *root, const char *name, dsv4_err *err) {
    if (!cJSON_IsObject(root)) {
        dsv4_errf(err, "%s: expected a JSON object at the top level", name);
        return NULL;
    }
    dsv4_tok *t = calloc(1, sizeof *t);
    if (!t) {
        dsv4_errf(err, "%s: out of memory", name);
        return NULL;
    }
    t->unk_id = -1;
    pthread_mutex_init(&t->cache_mu, NULL);
    const cJSON *model = cJSON_GetObjectItemCaseSensitive(root, "model");
    const cJSON *vocab = cJSON_GetObjectItemCaseSensitive(model, "vocab");
    const cJSON *merges = cJSON_GetObjectItemCaseSensitive(model, "merges");
    const cJSON *mtype = cJSON_GetObjectItemCaseSensitive(model, "type");
    const cJSON *x;
    if (!cJSON_IsObject(model)) {
        dsv4_errf(err, "%s: model: expected an object, got %s", name, dsv4_json_kind(model));
        goto fail;
    }
    if (mtype && !(cJSON_IsString(mtype) && !strcmp(mtype->valuestring, "BPE"))) {
        dsv4_errf(err, "%s: model.type: only \"BPE\" is supported, got %s%s%s", name,
                  cJSON_IsString(mtype) ? "\"" : "", cJSON_IsString(mtype) ? mtype->valuestring : dsv4_json_kind(mtype),
                  cJSON_IsString(mtype) ? "\"" : "");
        goto fail;
    }
    if (!cJSON_IsObject(vocab)) {
        dsv4_errf(err, "%s: model.vocab: expected an object, got %s", name, dsv4_json_kind(vocab));
        goto fail;
    }
    if (!cJSON_IsArray(merges)) {
        dsv4_errf(err, "%s: model.merges: expected an array, got %s", name, dsv4_json_kind(merges));
        goto fail;
    }
    x = cJSON_GetObjectItemCaseSensitive(model, "dropout");
    if (x && !cJSON_IsNull(x) && !(cJSON_IsNumber(x) && x->valuedouble == 0)) {
        dsv4_errf(err, "%s: model.dropout: BPE dropout is not supported (expected null)", name);
        goto fail;
    }
    static const char *const unsupported[] = {"continuing_subword_prefix", "end_of_word_suffix"};
    for (int k = 0; k < 2; k++) {
        x = cJSON_GetObjectItemCaseSensitive(model, unsupported[k]);
        if (x && !cJSON_IsNull(x) && !(cJSON_IsString(x) && !x->valuestring[0])) {
            dsv4_errf(err, "%s: model.%s: not supported (expected null)", name, unsupported[k]);
            goto fail;
        }
    }
    if ((t->fuse_unk = json_flag(model, "fuse_unk", 0, name, "model", err)) < 0) goto fail;
    if ((t->byte_fallback = json_flag(model, "byte_fallback", 0, name, "model", err)) < 0) goto fail;
    if ((t->ignore_merges = json_flag(model, "ignore_merges", 0, name, "model", err)) < 0) goto fail;

    /* vocab: strings into one arena */
    int nv = cJSON_GetArraySize(vocab);
    size_t total = 0;
    int32_t max_id = -1;
    cJSON_ArrayForEach(x, vocab) {
        int32_t id;
        if (json_id(x, &id)) {
            dsv4_errf(err, "%s: model.vocab[\"%.80s\"]: expected a non-negative integer id, got %s", name,
                      x->string ? x->string : "", dsv4_json_kind(x));
            goto fail;
        }
        if (id > max_id) max_id = id;
        total += strlen(x->string) + 1;
    }
    const cJSON *added = cJSON_GetObjectItemCaseSensitive(root, "added_tokens");
    if (cJSON_IsArray(added)) cJSON_ArrayForEach(x, added) {
            const cJSON *c = cJSON_GetObjectItemCaseSensitive(x, "content");
            if (cJSON_IsString(c)) total += strlen(c->valuestring) + 1;
        }
    t->str_arena = malloc(total + 1);
    if (!t->str_arena || strmap_init(&t->vocab, (size_t)nv) ||
        strmap_init(&t->added_map, (size_t)(cJSON_IsArray(added) ? cJSON_GetArraySize(added) : 0))) {
        dsv4_errf(err, "%s: out of memory", name);
        goto fail;
    }
    char *ap = t->str_arena;
    cJSON_ArrayForEach(x, vocab) {
        size_t l = strlen(x->string);
        memcpy(ap, x->string, l + 1);
        strmap_put(&t->vocab, ap, l, (int32_t)x->valuedouble);
        ap += l + 1;
    }
    /* added tokens: contents into the arena too (load_added points at cJSON strings; repoint) */
    if (load_added(t, added, (int32_t)t->vocab.n, name, err)) goto fail;
    for (int i = 0; i < t->n_added; i++) {
        tok_added *a = &t->added[i];
        memcpy(ap, a->content, a->len + 1);
        a->content = ap;
        ap += a->len + 1;
        if (a->id > max_id) max_id = a->id;
    }
    /* the added map's keys pointed at cJSON strings: rebuild it on the arena copies */
    free(t->added_map.e);
    if (strmap_init(&t->added_map, (size_t)t->n_added)) {
        dsv4_errf(err, "%s: out of memory", name);
        goto fail;
    }
    for (int i = 0; i < t->n_added; i++) strmap_put(&t->added_map, t->added[i].content, t->added[i].len, t->added[i].id);
    if (max_id < 0) {
        dsv4_errf(err, "%s: model.vocab: empty", name);
        goto fail;
    }
    t->n_ids = max_id + 1;
    t->str = calloc((size_t)t->n_ids, sizeof *t->str);
    t->str_len = calloc((size_t)t->n_ids, sizeof *t->str_len);
    t->special = calloc((size_t)t->n_ids, 1);
    if (!t->str || !t->str_len || !t->special) {
        dsv4_errf(err, "%s: out of memory", name);
        goto fail;
    }
    for (uint64_t i = 0; i <= t->vocab.mask; i++) {
        tok_strmap_ent *e = &t->vocab.e[i];
        if (!e->s) continue;
        t->str[e->id] = (char *)e->s;
        t->str_len[e->id] = e->len;
    }
    for (int i = 0; i < t->n_added; i++) { /* id -> token: the added vocabulary first */
        tok_added *a = &t->added[i];
        t->str[a->id] = (char *)a->content;
        t->str_len[a->id] = a->len;
        if (a->special) t->special[a->id] = 1;
        if (a->single_word) t->any_single_word = 1;
    }

    x = cJSON_GetObjectItemCaseSensitive(model, "unk_token");
    if (x && !cJSON_IsNull(x)) {
        if (!cJSON_IsString(x)) {
            dsv4_errf(err, "%s: model.unk_token: expected a string or null, got %s", name, dsv4_json_kind(x));
            goto fail;
        }
        t->unk_id = tok_strmap_get(&t->vocab, x->valuestring, strlen(x->valuestring));
        if (t->unk_id < 0) {
            dsv4_errf(err, "%s: model.unk_token: \"%.80s\" is not in model.vocab", name, x->valuestring);
            goto fail;
        }
    }
    if (load_merges(t, merges, name, err)) goto fail;
    if (check_normalizer(cJSON_GetObjectItemCaseSensitive(root, "normalizer"), name, "normalizer", err)) goto fail;
    if (load_pretok(t, cJSON_GetObjectItemCaseSensitive(root, "pre_tokenizer"), name, "pre_tokenizer", err)) goto fail;
    if (check_decoder(cJSON_GetObjectItemCaseSensitive(root, "decoder"), name, "decoder", err)) goto fail;

    for (int b = 0; b < 256; b++) {
        char u[4];
        uint32_t cp = tok_byte_to_cp((uint8_t)b);
        size_t l = cp < 0x80 ? 1 : 2;
        if (l == 1)
            u[0] = (char)cp;
        else {
            u[0] = (char)(0xC0 | (cp >> 6));
            u[1] = (char)(0x80 | (cp & 0x3F));
        }
        t->byte_sym[b] = tok_strmap_get(&t->vocab, u, l);
        char fb[8];
        snprintf(fb, sizeof fb, "<0x%02X>", b);
        t->byte_fb[b] = tok_strmap_get(&t->vocab, fb, strlen(fb));
    }

    /* decoded bytes of every id (ByteLevel decoder) */
    size_t dtotal = 0;
    for (int32_t i = 0; i < t->n_ids; i++) dtotal += t->str_len[i];
    t->dec = malloc(dtotal + 1);
    t->dec_off = malloc((size_t)t->n_ids * sizeof *t->dec_off);
    t->dec_len = malloc((size_t)t->n_ids * sizeof *t->dec_len);
    if (!t->dec || !t->dec_off || !t->dec_len) {
        dsv4_errf(err, "%s: out of memory", name);
        goto fail;
    }
    size_t dp = 0;
    for (int32_t i = 0; i < t->n_ids; i++) {
        t->dec_off[i] = (uint32_t)dp;
        const uint8_t *s = (const uint8_t *)t->str[i];
        size_t n = t->str_len[i], o = dp;
        int ok = 1;
        for (size_t k = 0; k < n && ok;) {
            int bad = 0, w = tok_utf8_seq(s + k, n - k, &bad), cl;
            if (w <= 0) {
                ok = 0;
                break;
            }
            int byte = tok_cp_to_byte(tok_utf8_cp(s + k, n - k, &cl));
            if (byte < 0) ok = 0;
            else t->dec[o++] = (uint8_t)byte;
            k += (size_t)w;
        }
        if (!ok) { /* not all in the byte alphabet: the token's own bytes */
            memcpy(t->dec + dp, s, n);
            o = dp + n;
        }
        t->dec_len[i] = (uint32_t)(o - dp);
        dp = o;
    }

    /* added-token tries */
    size_t raw_bytes = 0, norm_bytes = 0;
    for (int i = 0; i < t->n_added; i++) *(t->added[i].normalized ? &norm_bytes : &raw_bytes) += t->added[i].len;
    if (trie_init(&t->trie_raw, raw_bytes) || trie_init(&t->trie_norm, norm_bytes)) {
        dsv4_errf(err, "%s: out of memory", name);
        goto fail;
    }
    for (int i = 0; i < t->n_added; i++) {
        tok_added *a = &t->added[i];
        if (a->len) trie_add(a->normalized ? &t->trie_norm : &t->trie_raw, a->content, a->len, i);
    }
    if (t->any_single_word) {
        int jit;
        /* tokenizers tests single_word with the Rust regex \w: Alphabetic, M, Nd, Pc, Join_Control */
        const char *alnum = "[\\p{Alphabetic}\\p{M}\\p{Nd}\\p{Pc}\\x{200c}\\x{200d}]";
        t->re_alnum = tok_compile(alnum, strlen(alnum), 0, &jit, "word class", NULL);
        if (!t->re_alnum) { /* a PCRE2 without Boolean properties */
            alnum = "[\\p{L}\\p{Nl}\\p{M}\\p{Nd}\\p{Pc}\\x{200c}\\x{200d}]";
            t->re_alnum = tok_compile(alnum, strlen(alnum), 0, &jit, "word class", err);
            if (!t->re_alnum) goto fail;
        }
    }
    t->cache = tok_cache_new(); /* optional: NULL just means no cache */
    return t;
fail:
    dsv4_tok_free(t);
    return NULL;
}

dsv4_tok *dsv4_tok_load_json(const char *json, size_t len, const char *name, dsv4_err *err) {
    if (!name) name = "tokenizer.json";
    cJSON *root = cJSON_ParseWithLength(json, len);
    if (!root) {
        const char *ep = cJSON_GetErrorPtr();
        long off = ep && ep >= json && ep <= json + len ? (long)(ep - json) : -1;
        dsv4_errf(err, "%s: invalid JSON (near byte %ld)", name, off);
        return NULL;
    }
    dsv4_tok *t = load_root(root, name, err);
    cJSON_Delete(root);
    return t;
}

dsv4_tok *dsv4_tok_load(const char *path, dsv4_err *err) {
    size_t n = 0;
    char *buf = dsv4_read_file(path, 0, &n, err);
    if (!buf) return NULL;
    dsv4_tok *t = dsv4_tok_load_json(buf, n, path, err);
    free(buf);
    return t;
}

dsv4_tok *dsv4_tok_load_dir(const char *dir, dsv4_err *err) {
    size_t n = strlen(dir);
    char *path = malloc(n + 32);
    if (!path) {
        dsv4_errf(err, "%s: out of memory", dir);
        return NULL;
    }
    snprintf(path, n + 32, "%s%stokenizer.json", dir, n && dir[n - 1] == '/' ? "" : "/");
    dsv4_tok *t = dsv4_tok_load(path, err);
    free(path);
    return t;
}

void dsv4_tok_free(dsv4_tok *t) {
    if (!t) return;
    free(t->str);
    free(t->str_len);
    free(t->str_arena);
    free(t->dec);
    free(t->dec_off);
    free(t->dec_len);
    free(t->special);
    free(t->vocab.e);
    free(t->added_map.e);
    free(t->added);
    trie_free(&t->trie_raw);
    trie_free(&t->trie_norm);
    if (t->re_alnum) pcre2_code_free(t->re_alnum);
    free(t->merge_tab);
    free(t->merge_new);
    for (int i = 0; i < t->n_stages; i++)
        if (t->stage[i].re) pcre2_code_free(t->stage[i].re);
    tok_cache_free(t->cache);
    pthread_mutex_destroy(&t->cache_mu);
    free(t);
}

/* ------------------------------------------------------------------------------------------------ */
/* lookups */

int32_t dsv4_tok_vocab_size(const dsv4_tok *t) { return t->n_ids; }

const char *dsv4_tok_token(const dsv4_tok *t, int32_t id) {
    if (id < 0 || id >= t->n_ids) return NULL;
    return t->str[id];
}

const char *dsv4_tok_token_bytes(const dsv4_tok *t, int32_t id, size_t *len) {
    if (id < 0 || id >= t->n_ids || !t->str[id]) return NULL;
    if (len) *len = t->dec_len[id];
    return (const char *)t->dec + t->dec_off[id];
}

int32_t dsv4_tok_id(const dsv4_tok *t, const char *token) {
    size_t n = strlen(token);
    int32_t id = tok_strmap_get(&t->added_map, token, n);
    return id >= 0 ? id : tok_strmap_get(&t->vocab, token, n);
}

int dsv4_tok_is_special(const dsv4_tok *t, int32_t id) { return id >= 0 && id < t->n_ids && t->special[id]; }

/* ------------------------------------------------------------------------------------------------ */
/* decoding */

static int check_id(const dsv4_tok *t, int32_t id, size_t pos, dsv4_err *err) {
    if (id < 0 || id >= t->n_ids || !t->str[id])
        return dsv4_errf(err, "token id %ld (at %zu) is not in the vocabulary (0..%ld)", (long)id, pos,
                         (long)t->n_ids - 1);
    return 0;
}

char *dsv4_tok_decode(const dsv4_tok *t, const int32_t *ids, size_t n, int flags, size_t *len_out, dsv4_err *err) {
    size_t total = 0;
    for (size_t i = 0; i < n; i++) {
        if (check_id(t, ids[i], i, err)) return NULL;
        if ((flags & DSV4_TOK_SKIP_SPECIAL) && t->special[ids[i]]) continue;
        total += t->dec_len[ids[i]];
    }
    uint8_t *raw = malloc(total + 1);
    uint8_t *out = malloc(3 * total + 1);
    if (!raw || !out) {
        free(raw);
        free(out);
        dsv4_errf(err, "decode: out of memory");
        return NULL;
    }
    size_t p = 0;
    for (size_t i = 0; i < n; i++) {
        if ((flags & DSV4_TOK_SKIP_SPECIAL) && t->special[ids[i]]) continue;
        memcpy(raw + p, t->dec + t->dec_off[ids[i]], t->dec_len[ids[i]]);
        p += t->dec_len[ids[i]];
    }
    size_t o = 0;
    tok_utf8_lossy(raw, p, 1, out, &o);
    free(raw);
    out[o] = 0;
    if (len_out) *len_out = o;
    return (char *)out;
}

struct dsv4_tok_stream {
    const dsv4_tok *t;
    int flags;
    uint8_t pend[8];
    size_t npend;
    uint8_t *tmp, *out;
    size_t cap; /* bytes of tmp; out has 3 * cap + 1 */
};

dsv4_tok_stream *dsv4_tok_stream_new(const dsv4_tok *t, int flags) {
    dsv4_tok_stream *s = calloc(1, sizeof *s);
    if (!s) return NULL;
    s->t = t;
    s->flags = flags;
    s->cap = 256;
    s->tmp = malloc(s->cap);
    s->out = malloc(3 * s->cap + 1);
    if (!s->tmp || !s->out) {
        dsv4_tok_stream_free(s);
        return NULL;
    }
    return s;
}

void dsv4_tok_stream_free(dsv4_tok_stream *s) {
    if (!s) return;
    free(s->tmp);
    free(s->out);
    free(s);
}

const char *dsv4_tok_stream_feed(dsv4_tok_stream *s, int32_t id, size_t *len, dsv4_err *err) {
    const dsv4_tok *t = s->t;
    if (check_id(t, id, 0, err)) return NULL;
    size_t tl = ((s->flags & DSV4_TOK_SKIP_SPECIAL) && t->special[id]) ? 0 : t->dec_len[id];
    size_t need = s->npend + tl;
    if (need > s->cap) {
        size_t c = s->cap;
        while (c < need) c *= 2;
        uint8_t *a = malloc(c), *b = malloc(3 * c + 1);
        if (!a || !b) {
            free(a);
            free(b);
            dsv4_errf(err, "detokenize: out of memory");
            return NULL;
        }
        free(s->tmp);
        free(s->out);
        s->tmp = a;
        s->out = b;
        s->cap = c;
    }
    memcpy(s->tmp, s->pend, s->npend);
    memcpy(s->tmp + s->npend, t->dec + t->dec_off[id], tl);
    size_t o = 0;
    size_t used = tok_utf8_lossy(s->tmp, need, 0, s->out, &o);
    s->npend = need - used; /* an incomplete sequence: at most 3 bytes */
    memcpy(s->pend, s->tmp + used, s->npend);
    s->out[o] = 0;
    if (len) *len = o;
    return (const char *)s->out;
}

const char *dsv4_tok_stream_flush(dsv4_tok_stream *s, size_t *len) {
    size_t o = 0;
    tok_utf8_lossy(s->pend, s->npend, 1, s->out, &o);
    s->npend = 0;
    s->out[o] = 0;
    if (len) *len = o;
    return (const char *)s->out;
}
