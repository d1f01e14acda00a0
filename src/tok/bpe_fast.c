/* bpe_fast.c - hand-written matchers for the three Split regexes of the DeepSeek-V3/V4 tokenizer.json,
 * used on ASCII text only. Each answers exactly what PCRE2 (and Oniguruma) would answer for the
 * pattern as long as every byte it has to look at is ASCII; on the first non-ASCII byte whose class
 * matters it gives up (-1) and the caller runs PCRE2 instead. tests/test_tok.c checks them against
 * PCRE2 on random text. Matching the main pattern with PCRE2 costs ~90 ns per word, this ~10. */
#include <string.h>

#include "bpe_int.h"

/* The patterns, exactly as tokenizer.json has them (after JSON unescaping). */
static const char pat_digits[] = "\\p{N}{1,3}";
static const char pat_cjk[] = "[\xE4\xB8\x80-\xE9\xBE\xA5\xE3\x81\x80-\xE3\x82\x9F\xE3\x82\xA0-\xE3\x83\xBF]+";
static const char pat_main[] = "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?"
                               "[\\p{L}\\p{M}]+| ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+";

int tok_fast_kind(const char *pat, size_t len) {
    if (len == sizeof pat_digits - 1 && !memcmp(pat, pat_digits, len)) return TOK_FAST_DIGITS;
    if (len == sizeof pat_cjk - 1 && !memcmp(pat, pat_cjk, len)) return TOK_FAST_CJK;
    if (len == sizeof pat_main - 1 && !memcmp(pat, pat_main, len)) return TOK_FAST_MAIN;
    return TOK_FAST_NONE;
}

/* ASCII classes: L = letters, P = punctuation or symbol (all 32 ASCII ones are \p{P} or \p{S}),
 * W = \s, NL = [\r\n]. */
#define IS_L(c) ((uint8_t)(((c) | 0x20) - 'a') < 26)
#define IS_P(c) (((c) >= 0x21 && (c) <= 0x2F) || ((c) >= 0x3A && (c) <= 0x40) || ((c) >= 0x5B && (c) <= 0x60) || \
                 ((c) >= 0x7B && (c) <= 0x7E))
#define IS_W(c) ((c) == ' ' || ((c) >= 9 && (c) <= 13))
#define IS_NL(c) ((c) == '\r' || (c) == '\n')

/* [\p{L}\p{M}]+ from k on: end of the run, or 0 when a non-ASCII byte could continue it. */
static inline size_t letters(const uint8_t *s, size_t n, size_t k) {
    while (k < n && IS_L(s[k])) k++;
    if (k < n && s[k] >= 0x80) return 0;
    return k;
}

/* The main pattern at position i (s[i] ASCII): 1 match ending at *me, 0 no match at i, -1 give up. */
static int main_at(const uint8_t *s, size_t n, size_t i, size_t *me) {
    uint8_t c = s[i];
    uint8_t c1 = i + 1 < n ? s[i + 1] : 0; /* 0: end (or NUL, which no class here needs) */
    int has1 = i + 1 < n;
    /* 1: [punct][A-Za-z]+ ([A-Za-z] is ASCII only: a non-ASCII byte just ends the run) */
    if (IS_P(c) && has1 && IS_L(c1)) {
        size_t k = i + 2;
        while (k < n && IS_L(s[k])) k++;
        *me = k;
        return 1;
    }
    /* 2: [^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+ */
    if (IS_L(c)) {
        size_t k = letters(s, n, i + 1);
        if (!k) return -1;
        *me = k;
        return 1;
    }
    if (!IS_NL(c) && !IS_P(c)) { /* c can be the optional character */
        if (has1 && c1 >= 0x80) return -1;
        if (has1 && IS_L(c1)) {
            size_t k = letters(s, n, i + 2);
            if (!k) return -1;
            *me = k;
            return 1;
        }
    }
    /* 3: ' '?[\p{P}\p{S}]+[\r\n]* */
    size_t k = (size_t)-1;
    if (c == ' ') {
        if (has1 && c1 >= 0x80) return -1;
        if (has1 && IS_P(c1)) k = i + 1;
    } else if (IS_P(c)) {
        k = i;
    }
    if (k != (size_t)-1) {
        while (k < n && IS_P(s[k])) k++;
        if (k < n && s[k] >= 0x80) return -1;
        while (k < n && IS_NL(s[k])) k++;
        *me = k;
        return 1;
    }
    /* 4-6: \s*[\r\n]+ | \s+(?!\S) | \s+ */
    if (IS_W(c)) {
        size_t j = i, last_nl = (size_t)-1;
        while (j < n && IS_W(s[j])) {
            if (IS_NL(s[j])) last_nl = j;
            j++;
        }
        if (j < n && s[j] >= 0x80) return -1; /* might be more (Unicode) whitespace */
        if (last_nl != (size_t)-1) *me = last_nl + 1;
        else if (j == n) *me = n;
        else if (j - i >= 2) *me = j - 1;
        else *me = j;
        return 1;
    }
    return 0;
}

int tok_fast_find(int kind, const uint8_t *s, size_t n, size_t off, size_t *ms, size_t *me) {
    /* On -1, *ms = where PCRE2 has to start: no match starts before it (none of the patterns looks
     * behind, and every earlier start was decided as "no match"). */
    switch (kind) {
    case TOK_FAST_DIGITS: /* \p{N}{1,3} */
        for (size_t i = off; i < n; i++) {
            uint8_t c = s[i];
            if (c >= 0x80) {
                *ms = i;
                return -1;
            }
            if (c >= '0' && c <= '9') {
                size_t k = i + 1;
                while (k < n && k - i < 3) {
                    if (s[k] >= 0x80) {
                        *ms = i;
                        return -1;
                    }
                    if (s[k] < '0' || s[k] > '9') break;
                    k++;
                }
                *ms = i;
                *me = k;
                return 1;
            }
        }
        return 0;
    case TOK_FAST_CJK: /* only non-ASCII characters can match */
        for (size_t i = off; i < n; i++)
            if (s[i] >= 0x80) {
                *ms = i;
                return -1;
            }
        return 0;
    case TOK_FAST_MAIN:
        for (size_t i = off; i < n; i++) {
            int r = s[i] >= 0x80 ? -1 : main_at(s, n, i, me);
            if (r) {
                *ms = i;
                return r;
            }
        }
        return 0;
    }
    *ms = off;
    return -1;
}
