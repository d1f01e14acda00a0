/* bench_tok.c - tokenizer throughput: encodes several MB of English prose built in code (no downloads)
 * on one thread and prints MB/s; also times decoding.
 *   bench_tok [tokenizer.json] [megabytes | @textfile | words:megabytes]
 * (default tests/fixtures/tokenizer/tokenizer.json 8). MEGABYTES of prose are built from a few hundred
 * phrases (the word cache hits almost always, as on real prose); @textfile reads the text from a file;
 * words:MEGABYTES makes English-looking text of random-syllable words that mostly miss the word cache. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "tok/bpe.h"

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static double cpu_now(void) { /* this thread's CPU time: not inflated when the machine is busy */
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static uint64_t rng = 0x2545F4914F6CDD1Dull;
static unsigned rnd(unsigned n) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (unsigned)(rng % n);
}

static const char *const subj[] = {
    "The committee", "Our small team", "A curious engineer", "The old lighthouse keeper", "Most researchers",
    "Every student in the class", "The river", "Her grandmother", "The new government", "This approach",
    "The quarterly report", "Nobody in the village", "The orchestra", "A well-known author", "The city council"};
static const char *const verb[] = {
    "carefully examined", "quietly ignored", "never understood", "strongly recommended", "briefly described",
    "eventually rejected", "openly celebrated", "repeatedly questioned", "patiently rebuilt", "finally approved",
    "could not explain", "has always admired", "will soon publish", "was asked to review", "tried to measure"};
static const char *const obj[] = {
    "the results of the experiment", "an unusual pattern in the data", "the history of the region",
    "their plans for the following year", "a letter from an unknown sender", "the cost of the new bridge",
    "the quality of the drinking water", "several thousand pages of notes", "the simplest possible solution",
    "a map of the northern coast", "the behaviour of the market", "every detail of the proposal",
    "the sound of distant thunder", "the rules of the competition", "what had happened that night"};
static const char *const tail[] = {
    "before the meeting ended", "despite the heavy rain", "in less than an hour", "without saying a word",
    "because nobody else would", "as the sun went down", "after a long discussion", "with remarkable patience",
    "for reasons that remain unclear", "while everyone was watching", "during the winter of 1987",
    "at a cost of $4.5 million", "in about 30 minutes", "on the 12th of March", "to everyone's surprise"};
static const char *const conn[] = {"However, ", "Meanwhile, ", "In fact, ", "As a result, ", "Later, ", "", "", "",
                                   "Still, ", "Of course, ", "Nevertheless, ", "For example, "};

static char *make_prose(size_t target, size_t *len) {
    char *buf = malloc(target + 4096);
    if (!buf) return NULL;
    size_t n = 0;
    int sent = 0;
    while (n < target) {
        const char *c = conn[rnd(sizeof conn / sizeof conn[0])];
        const char *s = subj[rnd(sizeof subj / sizeof subj[0])];
        char first[64];
        snprintf(first, sizeof first, "%s", s);
        if (*c) first[0] = (char)(first[0] == 'T' || first[0] == 'A' || first[0] == 'E' || first[0] == 'N' ||
                                          first[0] == 'M' || first[0] == 'H' || first[0] == 'O'
                                      ? first[0] + ('a' - 'A')
                                      : first[0]);
        int k = snprintf(buf + n, 1024, "%s%s %s %s %s%s", c, first, verb[rnd(sizeof verb / sizeof verb[0])],
                         obj[rnd(sizeof obj / sizeof obj[0])], tail[rnd(sizeof tail / sizeof tail[0])],
                         rnd(7) == 0 ? "?" : rnd(9) == 0 ? "!" : ".");
        n += (size_t)k;
        sent++;
        if (rnd(6) == 0) {
            memcpy(buf + n, "\n\n", 2);
            n += 2;
        } else {
            buf[n++] = ' ';
        }
    }
    buf[n] = 0;
    *len = n;
    return buf;
}

/* English-looking text whose words are mostly new (random syllables): nearly every word misses the
 * word cache, so this times the BPE merges themselves. */
static char *make_words(size_t target, size_t *len) {
    static const char *const syl[] = {"con", "ter", "ing", "tion", "al", "re", "pro", "ment", "ly", "ex", "per",
                                      "de", "com", "ous", "ble", "ver", "un", "an", "est", "ist", "or", "im",
                                      "ca", "mo", "la", "ri", "to", "ne", "sp", "str", "th", "wh", "qu", "ph"};
    char *buf = malloc(target + 256);
    if (!buf) return NULL;
    size_t n = 0;
    while (n < target) {
        int k = 1 + (int)rnd(4);
        if (rnd(8) == 0) buf[n++] = (char)('A' + rnd(26));
        for (int i = 0; i < k; i++) {
            const char *s = syl[rnd(sizeof syl / sizeof syl[0])];
            size_t l = strlen(s);
            memcpy(buf + n, s, l);
            n += l;
        }
        unsigned r = rnd(20);
        buf[n++] = r == 0 ? '.' : r == 1 ? ',' : ' ';
        if (r < 2) buf[n++] = ' ';
    }
    buf[n] = 0;
    *len = n;
    return buf;
}

int main(int argc, char **argv) {
    const char *path = argc > 1 ? argv[1] : "tests/fixtures/tokenizer/tokenizer.json";
    const char *arg = argc > 2 ? argv[2] : "8";
    dsv4_err err = {{0}};
    double t0 = now();
    dsv4_tok *t = dsv4_tok_load(path, &err);
    if (!t) {
        fprintf(stderr, "bench_tok: %s\n", err.msg);
        return 1;
    }
    printf("load: %.3f s (%d ids)\n", now() - t0, (int)dsv4_tok_vocab_size(t));
    size_t len;
    char *text = NULL;
    if (arg[0] == '@') {
        FILE *f = fopen(arg + 1, "rb");
        if (!f) {
            fprintf(stderr, "bench_tok: cannot open %s\n", arg + 1);
            return 1;
        }
        fseek(f, 0, SEEK_END);
        long fl = ftell(f);
        fseek(f, 0, SEEK_SET);
        text = malloc((size_t)fl + 1);
        len = text ? fread(text, 1, (size_t)fl, f) : 0;
        fclose(f);
    } else if (!strncmp(arg, "words:", 6)) {
        text = make_words((size_t)(atof(arg + 6) * 1e6), &len);
    } else {
        text = make_prose((size_t)(atof(arg) * 1e6), &len);
    }
    if (!text) return 1;
    double best = 1e30, best_cpu = 1e30;
    size_t n = 0;
    int32_t *ids = NULL;
    for (int rep = 0; rep < 5; rep++) {
        free(ids);
        t0 = now();
        double c0 = cpu_now();
        ids = dsv4_tok_encode(t, text, len, 0, &n, &err);
        double dt = now() - t0, dc = cpu_now() - c0;
        if (!ids) {
            fprintf(stderr, "bench_tok: %s\n", err.msg);
            return 1;
        }
        if (dt < best) best = dt;
        if (dc < best_cpu) best_cpu = dc;
        printf("encode run %d: %.1f MB/s wall, %.1f MB/s of CPU time\n", rep + 1, (double)len / 1e6 / dt,
               (double)len / 1e6 / dc);
    }
    printf("encode: %.2f MB -> %zu tokens (%.2f bytes/token): best %.1f MB/s wall (%.2f M tokens/s), "
           "%.1f MB/s of CPU time, one thread\n",
           (double)len / 1e6, n, (double)len / (double)n, (double)len / 1e6 / best, (double)n / 1e6 / best,
           (double)len / 1e6 / best_cpu);
    /* a cold cache on short texts: 2000 sentences encoded one call each */
    t0 = now();
    size_t done = 0, off = 0;
    for (int i = 0; i < 2000 && off < len; i++) {
        size_t l = 0;
        while (off + l < len && text[off + l] != '.' && l < 400) l++;
        l++;
        size_t m;
        int32_t *x = dsv4_tok_encode(t, text + off, off + l <= len ? l : len - off, 0, &m, &err);
        free(x);
        done += l;
        off += l;
    }
    printf("encode, one call per sentence: %.1f MB/s\n", (double)done / 1e6 / (now() - t0));
    t0 = now();
    size_t dl;
    char *dec = dsv4_tok_decode(t, ids, n, 0, &dl, &err);
    double dt = now() - t0;
    printf("decode: %.1f MB/s, round trip %s\n", (double)dl / 1e6 / dt,
           dec && dl == len && !memcmp(dec, text, len) ? "exact" : "DIFFERS");
    free(dec);
    free(ids);
    free(text);
    dsv4_tok_free(t);
    return 0;
}
