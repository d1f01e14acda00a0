/* bpe_re.c - regex translation (Oniguruma as used by tokenizers -> PCRE2), UTF-8 helpers and the
 * byte-level alphabet. See bpe.h. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bpe_int.h"
#include "../util/strbuf.h"

/* Unicode White_Space: what Oniguruma's \s and Rust's char::is_whitespace match. */
#define WS_CLASS "\\x{9}-\\x{d}\\x{20}\\x{85}\\x{a0}\\x{1680}\\x{2000}-\\x{200a}\\x{2028}\\x{2029}\\x{202f}\\x{205f}\\x{3000}"
#define WS_COMPLEMENT                                                                                        \
    "\\x{0}-\\x{8}\\x{e}-\\x{1f}\\x{21}-\\x{84}\\x{86}-\\x{9f}\\x{a1}-\\x{167f}\\x{1681}-\\x{1fff}"          \
    "\\x{200b}-\\x{2027}\\x{202a}-\\x{202e}\\x{2030}-\\x{205e}\\x{2060}-\\x{2fff}\\x{3001}-\\x{10ffff}"

/* Code points that tokenizers' Oniguruma (Unicode 16) puts in \p{L} \p{M} \p{N} \p{P} \p{S} and that
 * PCRE2 10.42 (Unicode 14) leaves unassigned. No code point is in a class for PCRE2 but not for
 * Oniguruma (checked over all of U+0000..U+10FFFF), so adding these makes the classes equal. With a
 * newer PCRE2 these are already included and adding them changes nothing. */
static const struct {
    const char *name;
    const char *extra;
} uni_extra[] = {
    {"L", "\\x{1c89}-\\x{1c8a}\\x{a7cb}-\\x{a7cd}\\x{a7da}-\\x{a7dc}\\x{105c0}-\\x{105f3}"
          "\\x{10d4a}-\\x{10d65}\\x{10d6f}-\\x{10d85}\\x{10ec2}-\\x{10ec4}\\x{1123f}-\\x{11240}"
          "\\x{11380}-\\x{11389}\\x{1138b}\\x{1138e}\\x{11390}-\\x{113b5}\\x{113b7}\\x{113d1}"
          "\\x{113d3}\\x{11bc0}-\\x{11be0}\\x{11f02}\\x{11f04}-\\x{11f10}\\x{11f12}-\\x{11f33}"
          "\\x{1342f}\\x{13441}-\\x{13446}\\x{13460}-\\x{143fa}\\x{16100}-\\x{1611d}"
          "\\x{16d40}-\\x{16d6c}\\x{18cff}\\x{1b132}\\x{1b155}\\x{1df25}-\\x{1df2a}"
          "\\x{1e030}-\\x{1e06d}\\x{1e4d0}-\\x{1e4eb}\\x{1e5d0}-\\x{1e5ed}\\x{1e5f0}\\x{2b739}"
          "\\x{2ebf0}-\\x{2ee5d}\\x{31350}-\\x{323af}"},
    {"M", "\\x{897}\\x{cf3}\\x{ece}\\x{10d69}-\\x{10d6d}\\x{10efc}-\\x{10eff}\\x{11241}"
          "\\x{113b8}-\\x{113c0}\\x{113c2}\\x{113c5}\\x{113c7}-\\x{113ca}\\x{113cc}-\\x{113d0}"
          "\\x{113d2}\\x{113e1}-\\x{113e2}\\x{11f00}-\\x{11f01}\\x{11f03}\\x{11f34}-\\x{11f3a}"
          "\\x{11f3e}-\\x{11f42}\\x{11f5a}\\x{13440}\\x{13447}-\\x{13455}\\x{1611e}-\\x{1612f}"
          "\\x{1e08f}\\x{1e4ec}-\\x{1e4ef}\\x{1e5ee}-\\x{1e5ef}"},
    {"N", "\\x{10d40}-\\x{10d49}\\x{116d0}-\\x{116e3}\\x{11bf0}-\\x{11bf9}\\x{11f50}-\\x{11f59}"
          "\\x{16130}-\\x{16139}\\x{16d70}-\\x{16d79}\\x{1ccf0}-\\x{1ccf9}\\x{1d2c0}-\\x{1d2d3}"
          "\\x{1e4f0}-\\x{1e4f9}\\x{1e5f1}-\\x{1e5fa}"},
    {"P", "\\x{1b4e}-\\x{1b4f}\\x{1b7f}\\x{10d6e}\\x{113d4}-\\x{113d5}\\x{113d7}-\\x{113d8}"
          "\\x{11b00}-\\x{11b09}\\x{11be1}\\x{11f43}-\\x{11f4f}\\x{16d6d}-\\x{16d6f}\\x{1e5ff}"},
    {"S", "\\x{2427}-\\x{2429}\\x{2ffc}-\\x{2fff}\\x{31e4}-\\x{31e5}\\x{31ef}\\x{10d8e}-\\x{10d8f}"
          "\\x{1cc00}-\\x{1ccef}\\x{1cd00}-\\x{1ceb3}\\x{1f6dc}\\x{1f774}-\\x{1f776}"
          "\\x{1f77b}-\\x{1f77f}\\x{1f7d9}\\x{1f8b2}-\\x{1f8bb}\\x{1f8c0}-\\x{1f8c1}"
          "\\x{1fa75}-\\x{1fa77}\\x{1fa87}-\\x{1fa89}\\x{1fa8f}\\x{1faad}-\\x{1faaf}"
          "\\x{1fabb}-\\x{1fabf}\\x{1fac6}\\x{1face}-\\x{1facf}\\x{1fada}-\\x{1fadc}\\x{1fadf}"
          "\\x{1fae8}-\\x{1fae9}\\x{1faf7}-\\x{1faf8}\\x{1fbcb}-\\x{1fbef}"},
};

/* The table entry for a general category given by its short or long name (Oniguruma takes both,
 * PCRE2 10.42 only the short one); -1 for any other property. */
static int extra_for(const char *name, size_t n) {
    static const char *const longname[] = {"Letter", "Mark", "Number", "Punctuation", "Symbol"};
    for (size_t i = 0; i < sizeof uni_extra / sizeof uni_extra[0]; i++)
        if ((n == 1 && name[0] == uni_extra[i].name[0]) ||
            (n == strlen(longname[i]) && !memcmp(name, longname[i], n)))
            return (int)i;
    return -1;
}

char *tok_translate_regex(const char *pat, size_t len) {
    dsv4_sb b = {0};
    int in_class = 0;
    size_t i = 0;
    while (i < len) {
        char c = pat[i];
        if (c == '\\' && i + 1 < len) {
            char d = pat[i + 1];
            if (d == 'p' || d == 'P') {
                size_t ns, ne, end;
                if (i + 2 < len && pat[i + 2] == '{') {
                    ns = i + 3;
                    ne = ns;
                    while (ne < len && pat[ne] != '}') ne++;
                    end = ne < len ? ne + 1 : len;
                } else {
                    ns = i + 2;
                    ne = ns < len ? ns + 1 : len;
                    end = ne;
                }
                int neg = d == 'P';
                size_t nst = ns;
                if (nst < ne && pat[nst] == '^') {
                    neg = !neg;
                    nst++;
                }
                int x = extra_for(pat + nst, ne - nst);
                if (x < 0) {
                    dsv4_sb_put(&b, pat + i, end - i); /* as written */
                } else if (in_class && neg) { /* (the extra code points cannot be taken out here) */
                    dsv4_sb_puts(&b, "\\P{");
                    dsv4_sb_puts(&b, uni_extra[x].name);
                    dsv4_sb_puts(&b, "}");
                } else {
                    if (!in_class) dsv4_sb_puts(&b, neg ? "[^" : "[");
                    dsv4_sb_puts(&b, "\\p{");
                    dsv4_sb_puts(&b, uni_extra[x].name);
                    dsv4_sb_puts(&b, "}");
                    dsv4_sb_puts(&b, uni_extra[x].extra);
                    if (!in_class) dsv4_sb_puts(&b, "]");
                }
                i = end;
                continue;
            }
            if (d == 's' || d == 'S') {
                if (!in_class) {
                    dsv4_sb_puts(&b, d == 's' ? "[" WS_CLASS "]" : "[^" WS_CLASS "]");
                } else {
                    dsv4_sb_puts(&b, d == 's' ? WS_CLASS : WS_COMPLEMENT);
                }
                i += 2;
                continue;
            }
            if (d == 'h' || d == 'H') { /* Oniguruma: hexadecimal digit */
                if (!in_class)
                    dsv4_sb_puts(&b, d == 'h' ? "[0-9a-fA-F]" : "[^0-9a-fA-F]");
                else
                    dsv4_sb_puts(&b, d == 'h' ? "0-9a-fA-F" : "\\x{0}-/:-@G-`g-\\x{10ffff}");
                i += 2;
                continue;
            }
            if (d == 'w' || (d == 'W' && !in_class)) { /* ~Oniguruma: Letter, Mark, Nd, Pc */
                if (!in_class) dsv4_sb_puts(&b, d == 'w' ? "[" : "[^");
                dsv4_sb_puts(&b, "\\p{L}");
                dsv4_sb_puts(&b, uni_extra[0].extra);
                dsv4_sb_puts(&b, "\\p{M}");
                dsv4_sb_puts(&b, uni_extra[1].extra);
                dsv4_sb_puts(&b, "\\p{Nd}\\p{Pc}");
                if (!in_class) dsv4_sb_puts(&b, "]");
                i += 2;
                continue;
            }
            if (d == 'Q') { /* quoted up to \E: copy as it is */
                size_t j = i + 2;
                while (j + 1 < len && !(pat[j] == '\\' && pat[j + 1] == 'E')) j++;
                j = j + 1 < len ? j + 2 : len;
                dsv4_sb_put(&b, pat + i, j - i);
                i = j;
                continue;
            }
            dsv4_sb_put(&b, pat + i, 2);
            i += 2;
            continue;
        }
        if (c == '[') {
            if (in_class && i + 1 < len && pat[i + 1] == ':') { /* POSIX bracket [:name:] */
                size_t j = i + 2;
                while (j + 1 < len && !(pat[j] == ':' && pat[j + 1] == ']')) j++;
                j = j + 1 < len ? j + 2 : len;
                dsv4_sb_put(&b, pat + i, j - i);
                i = j;
                continue;
            }
            if (!in_class) {
                in_class = 1;
                dsv4_sb_put(&b, "[", 1);
                i++;
                if (i < len && pat[i] == '^') {
                    dsv4_sb_put(&b, "^", 1);
                    i++;
                }
                if (i < len && pat[i] == ']') { /* a leading ] is a literal */
                    dsv4_sb_put(&b, "\\]", 2);
                    i++;
                }
                continue;
            }
            in_class++; /* Oniguruma nested class; PCRE2 has none (kept as written) */
            dsv4_sb_put(&b, "[", 1);
            i++;
            continue;
        }
        if (c == ']' && in_class) in_class--;
        dsv4_sb_putc(&b, c);
        i++;
    }
    return dsv4_sb_take(&b, NULL); /* NULL when out of memory */
}

pcre2_code *tok_compile(const char *pat, size_t len, int literal, int *jit, const char *what, dsv4_err *err) {
    char *tr = NULL;
    const char *src = pat;
    size_t srclen = len;
    if (!literal) {
        tr = tok_translate_regex(pat, len);
        if (!tr) {
            dsv4_errf(err, "%s: out of memory", what);
            return NULL;
        }
        src = tr;
        srclen = strlen(tr);
    }
    int ec;
    PCRE2_SIZE eo;
    uint32_t opt = PCRE2_UTF | (literal ? PCRE2_LITERAL : PCRE2_UCP);
    pcre2_code *re = pcre2_compile((PCRE2_SPTR)src, srclen, opt, &ec, &eo, NULL);
    if (!re) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(ec, msg, sizeof msg);
        dsv4_errf(err, "%s: regex does not compile (%s at offset %zu of the translated pattern)", what,
                  (const char *)msg, (size_t)eo);
        free(tr);
        return NULL;
    }
    free(tr);
    *jit = pcre2_jit_compile(re, PCRE2_JIT_COMPLETE) == 0;
    return re;
}

int tok_utf8_seq(const uint8_t *s, size_t n, int *bad) {
    uint8_t c = s[0];
    if (c < 0x80) return 1;
    int w;
    uint8_t lo = 0x80, hi = 0xBF;
    if (c >= 0xC2 && c <= 0xDF)
        w = 2;
    else if (c >= 0xE0 && c <= 0xEF) {
        w = 3;
        if (c == 0xE0) lo = 0xA0;
        if (c == 0xED) hi = 0x9F;
    } else if (c >= 0xF0 && c <= 0xF4) {
        w = 4;
        if (c == 0xF0) lo = 0x90;
        if (c == 0xF4) hi = 0x8F;
    } else {
        *bad = 1;
        return 0;
    }
    for (int k = 1; k < w; k++) {
        if ((size_t)k >= n) return -1;
        uint8_t x = s[k];
        if (k == 1 ? (x < lo || x > hi) : (x < 0x80 || x > 0xBF)) {
            *bad = k;
            return 0;
        }
    }
    return w;
}

size_t tok_utf8_lossy(const uint8_t *in, size_t n, int final, uint8_t *out, size_t *out_len) {
    size_t i = 0, o = *out_len;
    while (i < n) {
        if (in[i] < 0x80) { /* ASCII run */
            out[o++] = in[i++];
            continue;
        }
        int bad = 0;
        int w = tok_utf8_seq(in + i, n - i, &bad);
        if (w > 0) {
            memcpy(out + o, in + i, (size_t)w);
            o += (size_t)w;
            i += (size_t)w;
        } else if (w == 0) {
            memcpy(out + o, "\xEF\xBF\xBD", 3);
            o += 3;
            i += (size_t)bad;
        } else { /* incomplete at the end */
            if (!final) break;
            memcpy(out + o, "\xEF\xBF\xBD", 3);
            o += 3;
            i = n;
        }
    }
    *out_len = o;
    return i;
}

uint32_t tok_utf8_cp(const uint8_t *s, size_t n, int *len) {
    uint8_t c = s[0];
    if (c < 0x80 || n < 2) {
        *len = 1;
        return c;
    }
    if (c < 0xE0) {
        *len = 2;
        return ((uint32_t)(c & 0x1F) << 6) | (s[1] & 0x3F);
    }
    if (c < 0xF0 || n < 4) {
        *len = n < 3 ? (int)n : 3;
        if (n < 3) return 0xFFFD;
        return ((uint32_t)(c & 0x0F) << 12) | ((uint32_t)(s[1] & 0x3F) << 6) | (s[2] & 0x3F);
    }
    *len = 4;
    return ((uint32_t)(c & 0x07) << 18) | ((uint32_t)(s[1] & 0x3F) << 12) | ((uint32_t)(s[2] & 0x3F) << 6) |
           (s[3] & 0x3F);
}

int tok_is_white_space(uint32_t cp) {
    return (cp >= 9 && cp <= 13) || cp == 0x20 || cp == 0x85 || cp == 0xA0 || cp == 0x1680 ||
           (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F || cp == 0x205F ||
           cp == 0x3000;
}

/* GPT-2's bytes_to_unicode: printable bytes map to themselves, the other 68 to U+0100.. in order. */
uint32_t tok_byte_to_cp(uint8_t b) {
    if ((b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE) return b;
    if (b <= 0x20) return 256u + b;
    if (b >= 0x7F && b <= 0xA0) return 256u + 33u + (uint32_t)(b - 0x7F);
    return 256u + 67u; /* 0xAD */
}

int tok_cp_to_byte(uint32_t cp) {
    if ((cp >= 0x21 && cp <= 0x7E) || (cp >= 0xA1 && cp <= 0xAC) || (cp >= 0xAE && cp <= 0xFF)) return (int)cp;
    if (cp >= 256 && cp <= 288) return (int)(cp - 256);
    if (cp >= 289 && cp <= 322) return (int)(cp - 289 + 0x7F);
    if (cp == 323) return 0xAD;
    return -1;
}
