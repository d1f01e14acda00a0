/* test_tok.c - the BPE tokenizer (src/tok/bpe.h) against Hugging Face tokenizers' output.
 *
 * tests/fixtures/tokenizer/cases.json holds texts with the ids tokenizers gives them
 * (encode(add_special_tokens=False)) and their decoding. The other expected ids below were produced
 * with tokenizers 0.23 (Python) on the same tokenizer.json or on the small tokenizers built here. */
#include <criterion/criterion.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "check.h"
#include "tok/bpe.h"
#include "tok/bpe_int.h"

static char tok_path[512];
static dsv4_tok *T;

static const char *fixture(const char *name) {
    static char p[512];
    snprintf(p, sizeof p, "%s/tokenizer/%s", dsv4_test_fixtures(), name);
    return p;
}

static void setup(void) {
    snprintf(tok_path, sizeof tok_path, "%s", fixture("tokenizer.json"));
    dsv4_err err = {{0}};
    T = dsv4_tok_load(tok_path, &err);
    cr_assert(T, "loading %s: %s", tok_path, err.msg);
}

static void teardown(void) {
    dsv4_tok_free(T);
    T = NULL;
}

static char *read_all(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *b = malloc((size_t)n + 1);
    size_t r = b ? fread(b, 1, (size_t)n, f) : 0;
    fclose(f);
    if (b) b[r] = 0;
    if (len) *len = r;
    return b;
}

/* strict UTF-8 check */
static int utf8_ok(const char *p, size_t n) {
    const uint8_t *s = (const uint8_t *)p;
    for (size_t i = 0; i < n;) {
        int bad = 0, w = tok_utf8_seq(s + i, n - i, &bad);
        if (w <= 0) return 0;
        i += (size_t)w;
    }
    return 1;
}

static int32_t *enc(const char *s, size_t len, int flags, size_t *n) {
    dsv4_err err = {{0}};
    int32_t *ids = dsv4_tok_encode(T, s, len, flags, n, &err);
    cr_assert(ids, "encode: %s", err.msg);
    return ids;
}

static void expect_ids(const char *s, size_t len, int flags, const int32_t *want, size_t nwant) {
    size_t n;
    int32_t *ids = enc(s, len, flags, &n);
    int same = n == nwant;
    for (size_t i = 0; same && i < n; i++) same = ids[i] == want[i];
    if (!same) {
        char buf[2048];
        size_t o = 0;
        for (size_t i = 0; i < n && o < sizeof buf - 16; i++) o += (size_t)snprintf(buf + o, sizeof buf - o, "%d,", ids[i]);
        buf[o] = 0;
        cr_assert(0, "ids of \"%.60s\" (%zu bytes): got [%s] (%zu ids), want %zu ids", s, len, buf, n, nwant);
    }
    free(ids);
}
#define EXPECT(s, flags, ...)                                                                                  \
    do {                                                                                                       \
        static const int32_t w_[] = {__VA_ARGS__};                                                             \
        expect_ids(s, sizeof(s) - 1, flags, w_, sizeof w_ / sizeof w_[0]);                                     \
    } while (0)

static char *dec(const int32_t *ids, size_t n, int flags, size_t *len) {
    dsv4_err err = {{0}};
    char *s = dsv4_tok_decode(T, ids, n, flags, len, &err);
    cr_assert(s, "decode: %s", err.msg);
    return s;
}

static void roundtrip(const char *s, size_t len) {
    size_t n, dl;
    int32_t *ids = enc(s, len, 0, &n);
    char *d = dec(ids, n, 0, &dl);
    cr_assert(dl == len && !memcmp(d, s, len), "round trip of \"%.60s\" (%zu bytes) gives %zu bytes", s, len, dl);
    free(ids);
    free(d);
}

/* ------------------------------------------------------------------------------------------------ */

TestSuite(tok, .init = setup, .fini = teardown, .timeout = 120);

Test(tok, cases_json) {
    size_t len;
    char *js = read_all(fixture("cases.json"), &len);
    cr_assert(js, "cannot read %s", fixture("cases.json"));
    cJSON *root = cJSON_Parse(js);
    cr_assert(root);
    const cJSON *cases = cJSON_GetObjectItem(root, "cases"), *c;
    int count = 0;
    cJSON_ArrayForEach(c, cases) {
        const char *text = cJSON_GetObjectItem(c, "text")->valuestring;
        const char *want = cJSON_GetObjectItem(c, "decoded")->valuestring;
        const cJSON *ids = cJSON_GetObjectItem(c, "ids");
        size_t nw = (size_t)cJSON_GetArraySize(ids), n;
        int32_t *w = malloc((nw + 1) * sizeof *w);
        for (size_t i = 0; i < nw; i++) w[i] = cJSON_GetArrayItem(ids, (int)i)->valueint;
        expect_ids(text, strlen(text), 0, w, nw);
        size_t dl;
        char *d = dec(w, nw, 0, &dl);
        cr_assert(dl == strlen(want) && !memcmp(d, want, dl), "decode of case %d (\"%.40s\")", count, text);
        free(d);
        /* the same text through the streaming detokenizer */
        dsv4_tok_stream *st = dsv4_tok_stream_new(T, 0);
        char *acc = malloc(dl + 16);
        size_t al = 0;
        for (size_t i = 0; i < nw; i++) {
            size_t l;
            dsv4_err err = {{0}};
            const char *p = dsv4_tok_stream_feed(st, w[i], &l, &err);
            cr_assert(p, "%s", err.msg);
            memcpy(acc + al, p, l);
            al += l;
        }
        size_t l;
        const char *p = dsv4_tok_stream_flush(st, &l);
        memcpy(acc + al, p, l);
        al += l;
        cr_assert(al == dl && !memcmp(acc, want, dl));
        free(acc);
        dsv4_tok_stream_free(st);
        (void)n;
        free(w);
        count++;
    }
    cr_assert(count >= 30, "only %d cases", count);
    cJSON_Delete(root);
    free(js);
}

Test(tok, lookups) {
    cr_assert_eq(dsv4_tok_vocab_size(T), 128815);
    cr_assert_str_eq(dsv4_tok_token(T, 19923), "Hello");
    cr_assert_str_eq(dsv4_tok_token(T, 223), "\xC4\xA0"); /* "Ġ" */
    size_t l;
    const char *b = dsv4_tok_token_bytes(T, 223, &l);
    cr_assert(b && l == 1 && b[0] == ' ');
    b = dsv4_tok_token_bytes(T, 128803, &l);
    cr_assert(b && l == strlen("<\xEF\xBD\x9CUser\xEF\xBD\x9C>") && !memcmp(b, "<\xEF\xBD\x9CUser\xEF\xBD\x9C>", l));
    cr_assert_null(dsv4_tok_token(T, -1));
    cr_assert_null(dsv4_tok_token(T, 128815));
    cr_assert_null(dsv4_tok_token_bytes(T, 1 << 30, &l));
    cr_assert_eq(dsv4_tok_id(T, "Hello"), 19923);
    cr_assert_eq(dsv4_tok_id(T, "no such token, surely"), -1);
    /* special tokens (spec section 16) */
    cr_assert_eq(dsv4_tok_id(T, "<\xEF\xBD\x9C" "begin\xE2\x96\x81of\xE2\x96\x81sentence\xEF\xBD\x9C>"), 0);
    cr_assert_eq(dsv4_tok_id(T, "<\xEF\xBD\x9C" "end\xE2\x96\x81of\xE2\x96\x81sentence\xEF\xBD\x9C>"), 1);
    cr_assert_eq(dsv4_tok_id(T, "<\xEF\xBD\x9CUser\xEF\xBD\x9C>"), 128803);
    cr_assert_eq(dsv4_tok_id(T, "<\xEF\xBD\x9C" "Assistant\xEF\xBD\x9C>"), 128804);
    cr_assert_eq(dsv4_tok_id(T, "<|EOT|>"), 128805);
    cr_assert_eq(dsv4_tok_id(T, "<think>"), -1); /* not in this (V3) tokenizer.json */
    cr_assert(dsv4_tok_is_special(T, 0) && dsv4_tok_is_special(T, 1) && dsv4_tok_is_special(T, 128805));
    cr_assert(!dsv4_tok_is_special(T, 128803) && !dsv4_tok_is_special(T, 19923) && !dsv4_tok_is_special(T, -5));
    /* every id decodes to something */
    for (int32_t i = 0; i < dsv4_tok_vocab_size(T); i++) cr_assert(dsv4_tok_token_bytes(T, i, &l) && l > 0, "id %d", i);
}

#define BOS "<\xEF\xBD\x9C" "begin\xE2\x96\x81of\xE2\x96\x81sentence\xEF\xBD\x9C>"
#define EOS "<\xEF\xBD\x9C" "end\xE2\x96\x81of\xE2\x96\x81sentence\xEF\xBD\x9C>"
#define USER "<\xEF\xBD\x9CUser\xEF\xBD\x9C>"
#define ASSISTANT "<\xEF\xBD\x9C" "Assistant\xEF\xBD\x9C>"

Test(tok, special_tokens_in_text) {
    EXPECT(BOS "Hi" USER, 0, 0, 23166, 128803);
    EXPECT("x" USER USER "y", 0, 90, 128803, 128803, 91);
    EXPECT("<" ASSISTANT ">", 0, 30, 128804, 32);
    EXPECT(EOS "<|EOT|>", 0, 1, 128805);
    EXPECT("<\xEF\xBD\x9CUser", 0, 30, 28217, 6756); /* incomplete: plain text */
    /* DSV4_TOK_NO_SPECIAL: special tokens are text, the non-special <｜User｜> still matches */
    EXPECT(BOS "Hi" USER, DSV4_TOK_NO_SPECIAL, 30, 28217, 8277, 5487, 226, 2154, 5487, 226, 85, 51015, 28217, 32,
           23166, 128803);
    EXPECT(EOS "<|EOT|>", DSV4_TOK_NO_SPECIAL, 30, 28217, 523, 5487, 226, 2154, 5487, 226, 85, 51015, 28217, 5451, 94,
           39, 4894, 94, 32);
    /* decoding, with and without the special tokens */
    static const int32_t ids[] = {0, 19923, 1, 128803};
    size_t l;
    char *d = dec(ids, 4, 0, &l);
    cr_assert_str_eq(d, BOS "Hello" EOS USER);
    free(d);
    d = dec(ids, 4, DSV4_TOK_SKIP_SPECIAL, &l);
    cr_assert_str_eq(d, "Hello" USER);
    free(d);
    /* a chat prompt round trips */
    const char *chat = BOS "You are a helpful assistant." USER "What is 2+2?" ASSISTANT "</think>4" EOS;
    roundtrip(chat, strlen(chat));
}

Test(tok, long_words) { /* longer than the quadratic BPE's limit: the heap version */
    char buf[512];
    memset(buf, 'a', 100);
    {
        static const int32_t w[] = {89086, 89086, 89086, 89086, 89086, 89086, 89086,
                                    89086, 89086, 89086, 89086, 89086, 39535};
        expect_ids(buf, 100, 0, w, 13);
    }
    memset(buf, ' ', 100);
    buf[100] = 'x';
    {
        static const int32_t w[] = {16932, 15970, 1527};
        expect_ids(buf, 101, 0, w, 3);
    }
    for (int i = 0; i < 40; i++) memcpy(buf + 2 * i, "ab", 2);
    buf[80] = '!';
    {
        int32_t w[41];
        for (int i = 0; i < 40; i++) w[i] = 425;
        w[40] = 3;
        expect_ids(buf, 81, 0, w, 41);
    }
    size_t o = 0;
    buf[o++] = 'x';
    for (int i = 0; i < 50; i++) {
        memcpy(buf + o, "\xE3\x80\x80", 3); /* U+3000 */
        o += 3;
    }
    buf[o++] = 'y';
    {
        int32_t w[28];
        w[0] = 90;
        for (int i = 1; i <= 24; i++) w[i] = 36759;
        w[25] = w[26] = 18524;
        w[27] = 91;
        expect_ids(buf, o, 0, w, 28);
    }
}

static uint64_t rng_state = 88172645463325252ull;
static uint32_t rnd(uint32_t n) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (uint32_t)(rng_state % n);
}

static const char *const frags[] = {
    "Hello", " world", "\n", "\n\n", "\r\n", "\r", " ", "  ", "\t", "123", "4567", "3.14", "1,000",
    "\xE4\xB8\xAD\xE6\x96\x87", "\xE3\x81\xAE", "\xE3\x82\xAB", "\xED\x95\x9C", "\xD1\x80\xD1\x83", "\xD8\xB9",
    "e\xCC\x81", "\xF0\x9F\x98\x80", "\xF0\x9F\x91\x8D\xF0\x9F\x8F\xBD", "\xF0\x9F\x91\xA8\xE2\x80\x8D\xF0\x9F\x91\xA9",
    "\xF0\x9F\xA9\xB7", "\xE2\x82\xAC", "...", "!!", "?", ",", "'s", "don't", "(", ")", "{", "}", "<", ">", "/",
    "_", "-", "#", "@", "&", "*", "=", "snake_case", "CamelCase", "https://x.org/a?b=1", "def f(x):",
    "    return x", BOS, EOS, USER, ASSISTANT, "<|EOT|>", "<\xEF\xBD\x9C", "\xEF\xBD\x9C>", "\xC2\xA0",
    "\xE3\x80\x80", "\xE2\x80\xA8", "\xC2\x85", "\xE2\x80\x8B", "\xE1\xA0\x8E", "\x00", "\x01", "\x7F",
    "\xF0\x9F\x84\xB0", "\xEF\xBF\xBD", "\xF4\x8F\xBF\xBF", "\xCC\x80"};

static size_t random_text(char *buf, size_t cap) {
    size_t n = 0, k = 1 + rnd(40);
    for (size_t i = 0; i < k; i++) {
        const char *f = frags[rnd(sizeof frags / sizeof frags[0])];
        size_t l = (f[0] == 0) ? 1 : strlen(f); /* "\x00" is one NUL byte */
        if (n + l > cap) break;
        memcpy(buf + n, f, l);
        n += l;
    }
    return n;
}

Test(tok, roundtrip) {
    static const char *const fixed[] = {
        "", " ", "\n", "a", "The quick brown fox jumps over the lazy dog.",
        "    indented\n\tcode();\r\n",
        "\xE6\xB7\xB1\xE5\xBA\xA6\xE6\xB1\x82\xE7\xB4\xA2 DeepSeek-V4 \xF0\x9F\x9A\x80",
        "mixed\xE4\xB8\xAD" "English\xE6\x96\x87" "123",
        "\xE0\xA4\xB9\xE0\xA4\xBF\xE0\xA4\xA8\xE0\xA5\x8D\xE0\xA4\xA6\xE0\xA5\x80",
        "  \n  \n\n\t \t",
        "1234567890123456789",
    };
    for (size_t i = 0; i < sizeof fixed / sizeof fixed[0]; i++) roundtrip(fixed[i], strlen(fixed[i]));
    roundtrip("a\0b\0\0c", 6);
    char buf[4096];
    for (int i = 0; i < 400; i++) roundtrip(buf, random_text(buf, sizeof buf));
    /* all 2-byte and 3-byte sequences of a few leading bytes, and every single byte < 0x80 */
    for (int c = 0; c < 0x80; c++) {
        char s[3] = {'x', (char)c, 'y'};
        roundtrip(s, 3);
    }
    for (uint32_t cp = 0x80; cp < 0x10000; cp += 37) {
        if (cp >= 0xD800 && cp < 0xE000) continue;
        char s[4];
        size_t l;
        if (cp < 0x800) {
            s[0] = (char)(0xC0 | (cp >> 6));
            s[1] = (char)(0x80 | (cp & 0x3F));
            l = 2;
        } else {
            s[0] = (char)(0xE0 | (cp >> 12));
            s[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
            s[2] = (char)(0x80 | (cp & 0x3F));
            l = 3;
        }
        roundtrip(s, l);
    }
}

/* Invalid UTF-8 is replaced like bytes.decode("utf-8", "replace"), then encoded. */
Test(tok, invalid_utf8) {
    static const struct {
        const char *in, *fixed;
        size_t inlen;
    } cases[] = {
        {"\xFF" "abc", "\xEF\xBF\xBD" "abc", 4},
        {"a\xC0\x80z", "a\xEF\xBF\xBD\xEF\xBF\xBDz", 4},             /* overlong: two replacements */
        {"x\xE4\xB8", "x\xEF\xBF\xBD", 3},                           /* truncated at the end: one */
        {"\xF0\x9F\x98" "A", "\xEF\xBF\xBD" "A", 4},                 /* truncated 4-byte sequence: one */
        {"\xED\xA0\x80", "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD", 3}, /* surrogate: three */
        {"\x80\x80 ok", "\xEF\xBF\xBD\xEF\xBF\xBD ok", 5},
        {"\xF5\x80" "b", "\xEF\xBF\xBD\xEF\xBF\xBD" "b", 3},
        {"\xE0\x80\xAF", "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD", 3},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        size_t n1, n2, dl;
        int32_t *a = enc(cases[i].in, cases[i].inlen, 0, &n1);
        int32_t *b = enc(cases[i].fixed, strlen(cases[i].fixed), 0, &n2);
        cr_assert(n1 == n2 && !memcmp(a, b, n1 * sizeof *a), "case %zu", i);
        char *d = dec(a, n1, 0, &dl);
        cr_assert_str_eq(d, cases[i].fixed, "case %zu", i);
        free(a);
        free(b);
        free(d);
    }
    /* random bytes never crash and always decode to valid UTF-8 */
    char buf[300];
    for (int i = 0; i < 300; i++) {
        size_t n = rnd(sizeof buf), m, dl;
        for (size_t k = 0; k < n; k++) buf[k] = (char)rnd(256);
        int32_t *ids = enc(buf, n, 0, &m);
        char *d = dec(ids, m, 0, &dl);
        cr_assert(utf8_ok(d, dl));
        free(ids);
        free(d);
    }
}

/* id of the token that is the single byte b */
static int32_t byte_id(uint8_t b) {
    uint32_t cp = tok_byte_to_cp(b);
    char u[3] = {0};
    if (cp < 0x80) u[0] = (char)cp;
    else {
        u[0] = (char)(0xC0 | (cp >> 6));
        u[1] = (char)(0x80 | (cp & 0x3F));
    }
    return dsv4_tok_id(T, u);
}

static void check_stream(const int32_t *ids, size_t n, int flags) {
    size_t dl;
    char *want = dec(ids, n, flags, &dl);
    dsv4_tok_stream *st = dsv4_tok_stream_new(T, flags);
    cr_assert(st);
    char *acc = malloc(dl + 64);
    size_t al = 0;
    for (size_t i = 0; i < n; i++) {
        size_t l;
        dsv4_err err = {{0}};
        const char *p = dsv4_tok_stream_feed(st, ids[i], &l, &err);
        cr_assert(p, "feed: %s", err.msg);
        cr_assert(utf8_ok(p, l), "piece %zu is not valid UTF-8", i);
        cr_assert(al + l <= dl);
        memcpy(acc + al, p, l);
        al += l;
    }
    size_t l;
    const char *p = dsv4_tok_stream_flush(st, &l);
    cr_assert(utf8_ok(p, l));
    memcpy(acc + al, p, l);
    al += l;
    cr_assert(al == dl && !memcmp(acc, want, dl), "stream %zu bytes vs decode %zu", al, dl);
    free(acc);
    free(want);
    dsv4_tok_stream_free(st);
}

Test(tok, streaming) {
    char buf[4096];
    for (int i = 0; i < 200; i++) {
        size_t n = random_text(buf, sizeof buf), m;
        int32_t *ids = enc(buf, n, 0, &m);
        check_stream(ids, m, 0);
        check_stream(ids, m, DSV4_TOK_SKIP_SPECIAL);
        free(ids);
    }
    /* single-byte tokens in random order: incomplete and invalid sequences everywhere */
    int32_t ids[64];
    static const uint8_t interesting[] = {'a', ' ', 0xC3, 0xA9, 0xE4, 0xB8, 0xAD, 0xF0, 0x9F, 0x98, 0x80, 0xFF, 0xC0, 0xED, 0xA0};
    for (int i = 0; i < 500; i++) {
        size_t n = 1 + rnd(64);
        for (size_t k = 0; k < n; k++) {
            ids[k] = byte_id(interesting[rnd(sizeof interesting)]);
            cr_assert(ids[k] >= 0);
            if (rnd(10) == 0) ids[k] = (int32_t)rnd(3); /* BOS / EOS / pad */
        }
        check_stream(ids, n, 0);
        check_stream(ids, n, DSV4_TOK_SKIP_SPECIAL);
    }
    /* "中" split into its three bytes is held back until complete */
    dsv4_tok_stream *st = dsv4_tok_stream_new(T, 0);
    size_t l;
    dsv4_err err = {{0}};
    cr_assert(dsv4_tok_stream_feed(st, byte_id(0xE4), &l, &err) && l == 0);
    cr_assert(dsv4_tok_stream_feed(st, byte_id(0xB8), &l, &err) && l == 0);
    cr_assert_null(dsv4_tok_stream_feed(st, 1 << 28, &l, &err)); /* bad id: error, state kept */
    cr_assert(strstr(err.msg, "not in the vocabulary"), "%s", err.msg);
    const char *p = dsv4_tok_stream_feed(st, byte_id(0xAD), &l, &err);
    cr_assert(p && l == 3 && !memcmp(p, "\xE4\xB8\xAD", 3));
    cr_assert(dsv4_tok_stream_feed(st, byte_id(0xF0), &l, &err) && l == 0);
    p = dsv4_tok_stream_flush(st, &l);
    cr_assert(l == 3 && !memcmp(p, "\xEF\xBF\xBD", 3));
    dsv4_tok_stream_free(st);
}

Test(tok, decode_errors) {
    static const int32_t bad[] = {19923, 128815};
    dsv4_err err = {{0}};
    size_t l;
    cr_assert_null(dsv4_tok_decode(T, bad, 2, 0, &l, &err));
    cr_assert(strstr(err.msg, "128815"), "%s", err.msg);
    static const int32_t neg[] = {-1};
    cr_assert_null(dsv4_tok_decode(T, neg, 1, 0, &l, &err));
    char *d = dsv4_tok_decode(T, NULL, 0, 0, &l, &err);
    cr_assert(d && l == 0 && d[0] == 0);
    free(d);
    static const int32_t half[] = {19923, 0};
    int32_t ids[3] = {half[0], byte_id(0xE4), half[1]};
    d = dsv4_tok_decode(T, ids, 3, 0, &l, &err);
    cr_assert_str_eq(d, "Hello\xEF\xBF\xBD" BOS);
    free(d);
}

struct pieces {
    char buf[1024];
    size_t n;
};

static void collect(void *ctx, const char *piece, size_t n, int32_t id) {
    struct pieces *p = ctx;
    if (id >= 0) p->n += (size_t)snprintf(p->buf + p->n, sizeof p->buf - p->n, "#%d|", id);
    else p->n += (size_t)snprintf(p->buf + p->n, sizeof p->buf - p->n, "%.*s|", (int)n, piece);
}

Test(tok, pretokenize) { /* the pieces tokenizers' pre_tokenize_str gives (plus the added tokens) */
    struct pieces p = {{0}, 0};
    const char *s = "Hello world 12345 \xE4\xB8\xAD\xE6\x96\x87" "abc\n\n  x" USER "y";
    dsv4_err err = {{0}};
    cr_assert_eq(dsv4_tok_pretokenize(T, s, strlen(s), 0, collect, &p, &err), 0, "%s", err.msg);
    cr_assert_str_eq(p.buf, "Hello| world| |123|45| |\xE4\xB8\xAD\xE6\x96\x87|abc|\n\n| | x|#128803|y|");
}

struct thr {
    const char *text;
    size_t len, n;
    int32_t *ids;
};

static void *thr_main(void *p) {
    struct thr *a = p;
    for (int r = 0; r < 20; r++) {
        free(a->ids);
        a->ids = dsv4_tok_encode(T, a->text, a->len, 0, &a->n, NULL);
    }
    return NULL;
}

Test(tok, threads) {
    char *text = malloc(200000);
    size_t len = 0;
    while (len < 190000) len += random_text(text + len, 200000 - len);
    size_t n;
    int32_t *want = enc(text, len, 0, &n);
    struct thr a[3];
    pthread_t th[3];
    for (int i = 0; i < 3; i++) {
        a[i] = (struct thr){text, len, 0, NULL};
        pthread_create(&th[i], NULL, thr_main, &a[i]);
    }
    for (int i = 0; i < 3; i++) {
        pthread_join(th[i], NULL);
        cr_assert(a[i].ids && a[i].n == n && !memcmp(a[i].ids, want, n * sizeof *want));
        free(a[i].ids);
    }
    free(want);
    free(text);
}

Test(tok, large_input) {
    size_t len = 300000;
    char *s = malloc(len);
    memset(s, ' ', len);
    roundtrip(s, len); /* one 300 KB piece */
    for (size_t i = 0; i < len; i++) s[i] = "ab\xC3\xA9 \n1."[i % 8];
    roundtrip(s, len);
    free(s);
}

/* The ASCII matchers of bpe_fast.c against PCRE2 on the same patterns, over random text. */
Test(tok, fast_matchers_agree_with_pcre2) {
    static const char *const pats[] = {
        "\\p{N}{1,3}",
        "[\xE4\xB8\x80-\xE9\xBE\xA5\xE3\x81\x80-\xE3\x82\x9F\xE3\x82\xA0-\xE3\x83\xBF]+",
        "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+| "
        "?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+",
    };
    static const char *const alpha[] = {" ", "  ", "\n", "\r", "\t", "\x0B", "\x0C", "a", "Z", "q", "'", "!",
                                        ".", "-", "_", "$", "`", "~", "0", "7", "\x01", "\x7F", "\xC3\xA9",
                                        "\xC2\xA0", "\xE4\xB8\xAD", "\xE3\x80\x80", "\xCC\x81", "\xD9\xA3",
                                        "\xE2\x80\x94", "\xF0\x9F\x98\x80", "\xC2\x85"};
    pcre2_match_data *md = pcre2_match_data_create(1, NULL);
    for (int k = 0; k < 3; k++) {
        int kind = tok_fast_kind(pats[k], strlen(pats[k]));
        cr_assert_eq(kind, k + 1);
        int jit;
        dsv4_err err = {{0}};
        pcre2_code *re = tok_compile(pats[k], strlen(pats[k]), 0, &jit, "test", &err);
        cr_assert(re, "%s", err.msg);
        char s[256];
        long decided = 0;
        for (int it = 0; it < 20000; it++) {
            size_t n = 0, parts = 1 + rnd(24);
            int ascii = rnd(3) != 0;
            for (size_t i = 0; i < parts; i++) {
                const char *a = alpha[rnd(ascii ? 22 : sizeof alpha / sizeof alpha[0])];
                size_t l = strlen(a);
                memcpy(s + n, a, l);
                n += l;
            }
            for (size_t off = 0; off <= n; off++) {
                size_t ms, me;
                int r = tok_fast_find(kind, (const uint8_t *)s, n, off, &ms, &me);
                if (r < 0) { /* undecided: PCRE2 from ms must give what PCRE2 from off gives */
                    cr_assert(ms >= off && ms <= n);
                    int r1 = pcre2_match(re, (PCRE2_SPTR)s, n, off, 0, md, NULL);
                    PCRE2_SIZE a = r1 >= 0 ? pcre2_get_ovector_pointer(md)[0] : 0;
                    PCRE2_SIZE b = r1 >= 0 ? pcre2_get_ovector_pointer(md)[1] : 0;
                    int r2 = pcre2_match(re, (PCRE2_SPTR)s, n, ms, 0, md, NULL);
                    cr_assert(r1 == r2 && (r1 < 0 || (a == pcre2_get_ovector_pointer(md)[0] &&
                                                      b == pcre2_get_ovector_pointer(md)[1])),
                              "pattern %d on \"%.*s\": restart at %zu instead of %zu changes the match", k, (int)n,
                              s, ms, off);
                    continue;
                }
                decided++;
                int rc = pcre2_match(re, (PCRE2_SPTR)s, n, off, 0, md, NULL);
                cr_assert(rc >= 0 || rc == PCRE2_ERROR_NOMATCH);
                if (rc == PCRE2_ERROR_NOMATCH) {
                    cr_assert_eq(r, 0, "pattern %d on \"%.*s\" from %zu: fast found a match", k, (int)n, s, off);
                } else {
                    PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
                    cr_assert(r == 1 && ms == ov[0] && me == ov[1],
                              "pattern %d on \"%.*s\" from %zu: fast %d [%zu,%zu) vs pcre2 [%zu,%zu)", k, (int)n, s,
                              off, r, ms, me, (size_t)ov[0], (size_t)ov[1]);
                }
            }
        }
        cr_assert(decided > 10000);
        pcre2_code_free(re);
    }
    pcre2_match_data_free(md);
}

/* ------------------------------------------------------------------------------------------------ */
/* Small tokenizers built here: every pre-tokenizer option and added-token flag. The vocab is the 256
 * byte-level characters (ids = byte values) plus "ab" 256, "abc" 257, "Ġa" 258, "--" 259, "<unk>" 260;
 * merges "a b", "ab c", "Ġ a", "- -". Expected ids from tokenizers 0.23 on the same JSON. */

static char *mini_json(const char *pre, const char *added, int drop_q, const char *unk, int fuse) {
    cJSON *root = cJSON_CreateObject();
    cJSON_AddStringToObject(root, "version", "1.0");
    cJSON_AddItemToObject(root, "added_tokens", cJSON_Parse(added ? added : "[]"));
    cJSON_AddNullToObject(root, "normalizer");
    cJSON_AddItemToObject(root, "pre_tokenizer", cJSON_Parse(pre));
    cJSON_AddItemToObject(root, "decoder",
                          cJSON_Parse("{\"type\":\"ByteLevel\",\"add_prefix_space\":true,\"trim_offsets\":true}"));
    cJSON *model = cJSON_AddObjectToObject(root, "model");
    cJSON_AddStringToObject(model, "type", "BPE");
    if (unk) cJSON_AddStringToObject(model, "unk_token", unk);
    else cJSON_AddNullToObject(model, "unk_token");
    cJSON_AddBoolToObject(model, "fuse_unk", fuse);
    cJSON *vocab = cJSON_AddObjectToObject(model, "vocab");
    for (int b = 0; b < 256; b++) {
        if (drop_q && b == 'q') continue;
        uint32_t cp = tok_byte_to_cp((uint8_t)b);
        char u[3] = {0};
        if (cp < 0x80) u[0] = (char)cp;
        else {
            u[0] = (char)(0xC0 | (cp >> 6));
            u[1] = (char)(0x80 | (cp & 0x3F));
        }
        cJSON_AddNumberToObject(vocab, u, b);
    }
    static const char *const extra[] = {"ab", "abc", "\xC4\xA0" "a", "--", "<unk>"};
    for (int i = 0; i < 5; i++) cJSON_AddNumberToObject(vocab, extra[i], 256 + i);
    cJSON_AddItemToObject(model, "merges", cJSON_Parse("[\"a b\", [\"ab\", \"c\"], \"\xC4\xA0 a\", \"- -\"]"));
    char *s = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    return s;
}

static void mini_expect(const char *name, const char *pre, const char *added, int drop_q, const char *unk, int fuse,
                        const char *text, int flags, const int32_t *want, size_t nwant) {
    char *js = mini_json(pre, added, drop_q, unk, fuse);
    dsv4_err err = {{0}};
    dsv4_tok *t = dsv4_tok_load_json(js, strlen(js), name, &err);
    cr_assert(t, "%s: %s", name, err.msg);
    size_t n;
    int32_t *ids = dsv4_tok_encode(t, text, strlen(text), flags, &n, &err);
    cr_assert(ids, "%s: %s", name, err.msg);
    int same = n == nwant;
    for (size_t i = 0; same && i < n; i++) same = ids[i] == want[i];
    char got[1024];
    size_t o = 0;
    for (size_t i = 0; i < n && o < 1000; i++) o += (size_t)snprintf(got + o, sizeof got - o, "%d,", ids[i]);
    got[o] = 0;
    cr_assert(same, "%s: got [%s]", name, got);
    free(ids);
    dsv4_tok_free(t);
    free(js);
}
#define MINI(name, pre, added, dq, unk, fuse, text, flags, ...)                                                \
    do {                                                                                                       \
        static const int32_t w_[] = {__VA_ARGS__};                                                             \
        mini_expect(name, pre, added, dq, unk, fuse, text, flags, w_, sizeof w_ / sizeof w_[0]);               \
    } while (0)

#define BL "{\"type\":\"ByteLevel\",\"add_prefix_space\":false,\"trim_offsets\":true,\"use_regex\":false}"
#define SPLIT(kind, pat, beh, inv)                                                                             \
    "{\"type\":\"Sequence\",\"pretokenizers\":[{\"type\":\"Split\",\"pattern\":{\"" kind "\":\"" pat            \
    "\"},\"behavior\":\"" beh "\",\"invert\":" inv "}," BL "]}"

Test(tok_mini, split_behaviors) {
    MINI("removed", SPLIT("String", " ", "Removed", "false"), NULL, 0, NULL, 0, "ab c  abc -- a", 0, 256, 99, 257,
         259, 97);
    MINI("mprev", SPLIT("Regex", "-", "MergedWithPrevious", "false"), NULL, 0, NULL, 0, "a-b--c-", 0, 97, 45, 98,
         45, 45, 99, 45);
    MINI("mnext", SPLIT("Regex", "-", "MergedWithNext", "false"), NULL, 0, NULL, 0, "a-b--c-", 0, 97, 45, 98, 45, 45,
         99, 45);
    MINI("contig", SPLIT("Regex", "-", "Contiguous", "false"), NULL, 0, NULL, 0, "a-b--c-", 0, 97, 45, 98, 259, 99,
         45);
    MINI("invert", SPLIT("Regex", "\\\\d+", "Isolated", "true"), NULL, 0, NULL, 0, "ab12abc 3a", 0, 256, 49, 50,
         257, 32, 51, 97);
    MINI("invrem", SPLIT("Regex", "\\\\d+", "Removed", "true"), NULL, 0, NULL, 0, "ab12abc 3a", 0, 49, 50, 51);
    MINI("empty", SPLIT("Regex", "x*", "Isolated", "false"), NULL, 0, NULL, 0, "abxxcab", 0, 97, 98, 120, 120, 99,
         97, 98);
    MINI("hex", SPLIT("Regex", "\\\\h+", "Removed", "false"), NULL, 0, NULL, 0, "xyzabc09 fG", 0, 120, 121, 122, 32,
         71);
    MINI("gpt2", "{\"type\":\"ByteLevel\",\"add_prefix_space\":true,\"trim_offsets\":true,\"use_regex\":true}", NULL,
         0, NULL, 0, "abc a's  --ab\n", 0, 32, 257, 258, 39, 115, 32, 32, 259, 256, 10);
    MINI("unk", BL, NULL, 1, "<unk>", 0, "abqqcq", 0, 256, 260, 260, 99, 260);
    MINI("unkfuse", BL, NULL, 1, "<unk>", 1, "abqqcq", 0, 256, 260, 99, 260);
}

#define ADDED(c, flags) "{\"id\":0,\"content\":\"" c "\"," flags "}"
Test(tok_mini, added_token_flags) {
    const char *added = "[" ADDED("<m>", "\"special\":true,\"lstrip\":true,\"rstrip\":true,\"normalized\":false") ","
                        ADDED("ab!", "\"special\":false,\"single_word\":true,\"normalized\":false") ","
                        ADDED("<n>", "\"special\":true,\"normalized\":true") "]";
    const char *pre = SPLIT("String", " ", "Isolated", "false");
    /* added ids: 261 <m>, 262 ab!, 263 <n> (after the 261 vocab entries, whatever the file's "id" says) */
    MINI("added", pre, added, 0, NULL, 0, "x  <m>  ab!c ab! <n>ab<m>", 0, 120, 261, 256, 33, 99, 32, 262, 32, 263,
         256, 261);
    MINI("added_nospecial", pre, added, 0, NULL, 0, "x  <m>  ab!c ab! <n>ab<m>", DSV4_TOK_NO_SPECIAL, 120, 32, 32,
         60, 109, 62, 32, 32, 256, 33, 99, 32, 262, 32, 60, 110, 62, 256, 60, 109, 62);
    const char *sw = "[" ADDED("ab!", "\"single_word\":true,\"normalized\":false") "]";
    MINI("single_word", pre, sw, 0, NULL, 0,
         "_ab! ab!_ \xC3\xA9" "ab! ab!\xC3\xA9 1ab! ab!\xCC\x81 ab!\xE2\x85\xA0 ab!\xC2\xB2 -ab!- \xE2\x92\xB6" "ab!", 0,
         95, 256, 33, 32, 256, 33, 95, 32, 195, 169, 256, 33, 32, 256, 33, 195, 169, 32, 49, 256, 33, 32, 256, 33,
         204, 129, 32, 256, 33, 226, 133, 160, 32, 261, 194, 178, 32, 45, 261, 45, 32, 226, 146, 182, 256, 33);
    const char *ls = "[" ADDED(" <m>", "\"lstrip\":true,\"rstrip\":true,\"normalized\":false") ","
                     ADDED("<m>", "\"lstrip\":true,\"normalized\":false") "]";
    MINI("strip", pre, ls, 0, NULL, 0, "a \xE3\x80\x80 <m>\xC2\xA0 <m>  <m>\t", 0, 97, 261, 261, 261);
}

/* ------------------------------------------------------------------------------------------------ */
/* bad tokenizer files: NULL and an error naming the file and the field */

static void expect_load_error(const char *json, const char *want1, const char *want2) {
    dsv4_err err = {{0}};
    dsv4_tok *t = dsv4_tok_load_json(json, strlen(json), "bad.json", &err);
    cr_assert_null(t, "loaded: %s", json);
    cr_assert(strstr(err.msg, "bad.json"), "no file name in: %s", err.msg);
    cr_assert(strstr(err.msg, want1), "'%s' not in: %s", want1, err.msg);
    if (want2) cr_assert(strstr(err.msg, want2), "'%s' not in: %s", want2, err.msg);
}

Test(tok_mini, bad_files) {
    dsv4_err err = {{0}};
    dsv4_tok *t;
    cr_assert_null(dsv4_tok_load("tests/fixtures/tokenizer/no-such-file.json", &err));
    cr_assert(strstr(err.msg, "no-such-file.json"), "%s", err.msg);

    char dir[600];
    snprintf(dir, sizeof dir, "%s/tokenizer/", dsv4_test_fixtures());
    t = dsv4_tok_load_dir(dir, &err);
    cr_assert(t, "%s", err.msg);
    dsv4_tok_free(t);
    cr_assert_null(dsv4_tok_load_dir("tests/no-such-dir", &err));
    cr_assert(strstr(err.msg, "tests/no-such-dir/tokenizer.json"), "%s", err.msg);

    /* truncated real file */
    size_t len;
    char *real = read_all(fixture("tokenizer.json"), &len);
    cr_assert(real);
    t = dsv4_tok_load_json(real, 5000, "bad.json", &err);
    cr_assert_null(t);
    cr_assert(strstr(err.msg, "bad.json") && strstr(err.msg, "invalid JSON"), "%s", err.msg);
    free(real);

    expect_load_error("", "invalid JSON", NULL);
    expect_load_error("[1, 2]", "top level", NULL);
    expect_load_error("{}", "model", NULL);
    expect_load_error("{\"model\": {\"type\": \"WordPiece\", \"vocab\": {}}}", "model.type", "WordPiece");
    expect_load_error("{\"model\": {\"type\": \"BPE\", \"vocab\": [], \"merges\": []}}", "model.vocab", NULL);
    expect_load_error("{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": \"x\"}, \"merges\": []}}", "model.vocab", NULL);
    expect_load_error("{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}}}", "model.merges", NULL);
    expect_load_error("{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 1}, \"merges\": [\"a c\"]}}",
                      "model.merges[0]", "\"c\"");
    expect_load_error("{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 1}, \"merges\": [\"a b\"]}}",
                      "model.merges[0]", "\"ab\"");
    expect_load_error("{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": [\"a\"]}}", "model.merges[0]",
                      NULL);
    expect_load_error("{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": [], \"dropout\": 0.1}}",
                      "model.dropout", NULL);
    expect_load_error("{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": [], \"unk_token\": \"x\"}}",
                      "model.unk_token", NULL);
#define OKMODEL "\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": []}"
#define OKDEC "\"decoder\": {\"type\": \"ByteLevel\"}"
    expect_load_error("{" OKMODEL ", " OKDEC ", \"normalizer\": {\"type\": \"NFKC\"}}", "normalizer", "NFKC");
    expect_load_error("{" OKMODEL ", " OKDEC ", \"pre_tokenizer\": {\"type\": \"Whitespace\"}}", "pre_tokenizer",
                      "Whitespace");
    expect_load_error("{" OKMODEL ", " OKDEC ", \"pre_tokenizer\": {\"type\": \"Sequence\", \"pretokenizers\": "
                      "[{\"type\": \"Split\", \"pattern\": {\"Regex\": \"(ab\"}, \"behavior\": \"Isolated\"}]}}",
                      "pre_tokenizer.pretokenizers[0].pattern", "does not compile");
    expect_load_error("{" OKMODEL ", " OKDEC ", \"pre_tokenizer\": {\"type\": \"Split\", \"pattern\": {\"Regex\": "
                      "\"a\"}, \"behavior\": \"Sideways\"}}",
                      "pre_tokenizer.behavior", "Sideways");
    expect_load_error("{" OKMODEL ", " OKDEC ", \"pre_tokenizer\": {\"type\": \"Split\", \"pattern\": 3, "
                      "\"behavior\": \"Isolated\"}}",
                      "pre_tokenizer.pattern", NULL);
    expect_load_error("{" OKMODEL "}", "decoder", NULL);
    expect_load_error("{" OKMODEL ", \"decoder\": {\"type\": \"WordPiece\"}}", "decoder", "WordPiece");
    expect_load_error("{" OKMODEL ", " OKDEC ", \"added_tokens\": [{\"id\": 1, \"content\": 5}]}",
                      "added_tokens[0].content", NULL);
    expect_load_error("{" OKMODEL ", " OKDEC ", \"added_tokens\": [{\"id\": 1, \"content\": \"x\", \"special\": 1}]}",
                      "added_tokens[0].special", NULL);
    /* and a minimal valid one loads */
    const char *ok = "{" OKMODEL ", " OKDEC "}";
    t = dsv4_tok_load_json(ok, strlen(ok), "ok.json", &err);
    cr_assert(t, "%s", err.msg);
    dsv4_tok_free(t);
}
