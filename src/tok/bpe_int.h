/* bpe_int.h - internals shared by bpe.c (loading, lookup, decoding), bpe_enc.c (encoding) and
 * bpe_re.c (regex translation, UTF-8 helpers). Not part of the API. */
#ifndef DSV4_TOK_BPE_INT_H
#define DSV4_TOK_BPE_INT_H

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <pthread.h>
#include <stdint.h>

#include "bpe.h"

#define TOK_MAX_STAGES 16

/* string -> id map (open addressing) */
typedef struct tok_strmap_ent {
    const char *s;
    uint32_t len;
    int32_t id;
    uint64_t hash;
} tok_strmap_ent;

typedef struct tok_strmap {
    tok_strmap_ent *e;
    uint64_t mask;
    size_t n;
} tok_strmap;

/* trie of added-token contents: (node, byte) -> child via a hash table; node 0 = root */
typedef struct tok_trie {
    uint64_t *keys; /* node << 8 | byte, UINT64_MAX = empty */
    uint32_t *child;
    uint64_t mask;
    int32_t *term;  /* per node: index into tok->added (-1 none) */
    uint32_t n_nodes, cap_nodes;
    uint8_t first[256]; /* bytes that start some token */
    int n_first, first_byte; /* when n_first == 1, that byte (memchr) */
} tok_trie;

typedef struct tok_added {
    int32_t id;
    const char *content;
    uint32_t len;
    uint8_t special, lstrip, rstrip, single_word, normalized;
} tok_added;

enum { ST_SPLIT = 1, ST_BYTELEVEL = 2 };
enum { BH_REMOVED = 0, BH_ISOLATED, BH_MERGED_PREV, BH_MERGED_NEXT, BH_CONTIGUOUS };

typedef struct tok_stage {
    int type;
    pcre2_code *re;       /* Split pattern, or the ByteLevel GPT-2 regex when use_regex */
    int jit;              /* re is JIT compiled */
    int behavior, invert; /* Split */
    int add_prefix_space, use_regex; /* ByteLevel */
    int empty_literal;    /* Split with an empty String pattern: never matches */
    int fast;             /* TOK_FAST_*: a hand-written matcher for ASCII text (bpe_fast.c) */
    int noop;             /* ByteLevel without prefix space and regex: nothing to do */
} tok_stage;

typedef struct tok_cache tok_cache;

struct dsv4_tok {
    int32_t n_ids;        /* 1 + largest id */
    char **str;           /* per id: token string (NUL-terminated) or NULL */
    uint32_t *str_len;
    char *str_arena;
    uint8_t *dec;         /* decoded bytes of every id, back to back */
    uint32_t *dec_off, *dec_len;
    uint8_t *special;     /* per id: special added token */
    tok_strmap vocab;     /* model vocab */
    tok_strmap added_map; /* added tokens content -> id */
    tok_added *added;
    int n_added;
    tok_trie trie_raw, trie_norm; /* normalized=false / normalized=true added tokens */
    int any_single_word;
    pcre2_code *re_alnum; /* a word character, for single_word */

    /* BPE model */
    /* merges: open addressing, one 8-byte slot per pair = a << (idb + rb) | b << rb | rank (UINT64_MAX
     * empty); the merged token is merge_new[rank]. Small enough (2 MB here) to mostly stay in cache. */
    uint64_t *merge_tab;
    int32_t *merge_new;
    uint64_t merge_mask;
    int merge_idb, merge_rb;
    int32_t byte_sym[256]; /* byte-level: initial symbol of each byte (-1: not in vocab) */
    int byte_level;        /* a ByteLevel pre-tokenizer is present */
    int32_t unk_id;        /* -1 none */
    int fuse_unk, byte_fallback, ignore_merges;
    int32_t byte_fb[256];  /* "<0xXX>" ids for byte_fallback (-1 absent) */

    tok_stage stage[TOK_MAX_STAGES];
    int n_stages;

    pthread_mutex_t cache_mu;
    tok_cache *cache;
};

/* bpe_re.c */
/* Translates an Oniguruma (tokenizers) pattern to PCRE2 with the same meaning; malloc'd. */
char *tok_translate_regex(const char *pat, size_t len);
/* Compiles pattern (translated unless literal) with UTF|UCP (+ JIT). NULL with err set. */
pcre2_code *tok_compile(const char *pat, size_t len, int literal, int *jit, const char *what, dsv4_err *err);
/* Length of the valid UTF-8 sequence at s[0..n): 1-4; 0 when invalid with *bad = bytes to replace
 * (1-3) by one U+FFFD; -1 when s is a valid but incomplete prefix running to the end. */
int tok_utf8_seq(const uint8_t *s, size_t n, int *bad);
/* Appends to out the lossy UTF-8 of in[0..n) and returns the bytes consumed: all of them when final,
 * else all but an incomplete trailing sequence. out must have room for 3 * n bytes. */
size_t tok_utf8_lossy(const uint8_t *in, size_t n, int final, uint8_t *out, size_t *out_len);
/* Decodes the code point at s (valid UTF-8 assumed), *len its byte length. */
uint32_t tok_utf8_cp(const uint8_t *s, size_t n, int *len);
int tok_is_white_space(uint32_t cp);
/* Byte-level alphabet: byte -> code point, and code point -> byte (-1 if not in the alphabet). */
uint32_t tok_byte_to_cp(uint8_t b);
int tok_cp_to_byte(uint32_t cp);

/* bpe_fast.c */
enum { TOK_FAST_NONE = 0, TOK_FAST_DIGITS, TOK_FAST_CJK, TOK_FAST_MAIN };
int tok_fast_kind(const char *pat, size_t len);
/* Next match in s[off..n): 1 (*ms, *me set), 0 none, -1 undecided (non-ASCII text): PCRE2 must search
 * from *ms on (no match starts in s[off..*ms)). */
int tok_fast_find(int kind, const uint8_t *s, size_t n, size_t off, size_t *ms, size_t *me);

/* bpe.c */
uint64_t tok_hash(const void *p, size_t n);
int32_t tok_strmap_get(const tok_strmap *m, const char *s, size_t len);
static inline uint64_t tok_merge_slot(uint64_t key, uint64_t mask) {
    return ((key * 0x9E3779B97F4A7C15ull) >> 32) & mask;
}

/* bpe_enc.c */
tok_cache *tok_cache_new(void);
void tok_cache_free(tok_cache *c);

#endif
