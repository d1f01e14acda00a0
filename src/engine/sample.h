/* sample.h - token sampling: request parameters, per-sequence sampler state, seeded RNG,
 * log-probabilities and streaming stop-string matching.
 *
 * Owns: the exact sampling algorithm of the engine. A GPU twin must reproduce it, so every step
 * is specified below; the RNG is bit-exact by construction, the rest is exact up to the rounding
 * of exp/log (all probability arithmetic is done in double).
 *
 * ---------------------------------------------------------------------------------------------
 * RNG: Philox-4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC'11;
 * identical to Random123 philox4x32_R(10, ...) and to CUDA's curandStatePhilox4_32_10_t).
 *
 *   state: counter c[4], key k[2], all uint32.
 *   one round:  (hi0, lo0) = 0xD2511F53 * c[0]   (64-bit product, high and low 32 bits)
 *               (hi1, lo1) = 0xCD9E8D57 * c[2]
 *               c = { hi1 ^ c[1] ^ k[0], lo1, hi0 ^ c[3] ^ k[1], lo0 }
 *   10 rounds; between two rounds (9 times) the key is bumped:
 *               k[0] += 0x9E3779B9, k[1] += 0xBB67AE85   (mod 2^32)
 *   output x[4] = c after the 10th round.
 *   Known answers (Random123 kat_vectors): ctr 0,0,0,0 key 0,0 -> 6627e8d5 e169c58d bc57ac4c 9b00dbd8.
 *
 * The random number of a sequence for generation step `step` (0 for the first generated token,
 * i.e. the number of tokens accepted with dsv4_sampler_accept so far) depends only on (seed, step):
 *   key     = { (uint32)seed, (uint32)(seed >> 32) }
 *   counter = { 0, 0, (uint32)step, (uint32)(step >> 32) }
 *   x       = philox4x32_10(counter, key)
 *   u       = ((x[0] >> 5) * 67108864.0 + (x[1] >> 6)) / 9007199254740992.0   (53 bits, [0, 1))
 * On CUDA, curand_init(seed, step, 0, &st); x0 = curand(&st); x1 = curand(&st); gives the same
 * x[0], x[1] (the subsequence lives in counter words 2..3) - checked bit for bit on an H200, see
 * the known answers in tests/test_sample.c. Words x[2], x[3] and counter words 0..1 are
 * reserved for future per-step draws (e.g. speculative-decoding acceptance).
 *
 * ---------------------------------------------------------------------------------------------
 * Sampling one token from logits l[0..V) (the order is vLLM's):
 *  0. logit_bias: l_t = l_t + bias_t (float) for each listed token, in list order (OpenAI's logit_bias;
 *     vLLM applies it before the penalties too). -inf stays -inf.
 *  1. Penalties (only tokens in the sampler's history are touched):
 *       repetition_penalty r, for every token seen in prompt or output:
 *           l = l > 0 ? l / r : l * r                                        (float)
 *       then for every token generated count times (count > 0), output tokens only:
 *           l = l - frequency_penalty * (float)count;  l = l - presence_penalty  (float)
 *  2. Greedy if temperature < 1e-5 (vLLM's epsilon; 0 is the documented way to ask for it):
 *       the token with the largest penalized logit, ties -> the lowest id. Filters are ignored.
 *  3. Temperature: z_i = l_i / temperature (float division). m = max_i z_i.
 *       w_i = exp((double)z_i - (double)m)   (so the argmax has w = 1; l = -inf gives w = 0)
 *     The candidate set K starts as all tokens with z_i > -inf.
 *  4. min_p (if > 0): keep i iff w_i >= min_p (i.e. p_i >= min_p * p_max).
 *  5. top_k (if > 0): let t be the k-th largest z over K, counted with multiplicity; keep i iff
 *     z_i >= t (ties at the boundary are all kept, as in vLLM and Hugging Face). min_p and top_k
 *     both keep a prefix of the z order, so their order does not matter.
 *  6. top_p (if < 1): order K by (z descending, id ascending); W = sum_{K} w_i; keep i iff
 *     the sum of w_j over the tokens before i in that order is < top_p * W (the smallest prefix
 *     whose mass reaches top_p; the most likely token is always kept).
 *  7. Draw: u = the step's uniform (above). Walk K in increasing id order accumulating
 *     c += w_i (double, sequential); S = the final sum; pick the first i with c > u * S.
 *     If rounding leaves none, pick the largest id in K with w_i > 0.
 * Logits equal to NaN or +inf are an error; -inf is a valid mask value.
 *
 * Cost (V = 129280, one core): greedy ~0.3 ms, full softmax draw ~1.5 ms (one exp per token),
 * top_k <= 1024 via a k-heap, top_p via a log-space mass histogram plus a mass-weighted
 * quickselect inside one bucket - no full sort, even for flat distributions or all-equal logits.
 *
 * Memory: a sampler holds V floats of processed logits, an open-addressing hash of the tokens
 * seen (prompt + output, ~16 bytes per distinct token) and, from its first non-greedy draw, a
 * V-entry scratch array of doubles plus a 48 KiB histogram. */
#ifndef DSV4_ENGINE_SAMPLE_H
#define DSV4_ENGINE_SAMPLE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "../util/err.h"

/* ---- RNG ---------------------------------------------------------------------------------- */

/* Philox-4x32-10 block function, exactly as specified above. */
void dsv4_philox4x32_10(const uint32_t ctr[4], const uint32_t key[2], uint32_t out[4]);

/* The uniform in [0, 1) used for the draw at (seed, step), as specified above. */
double dsv4_rng_uniform(uint64_t seed, uint64_t step);

/* ---- Parameters --------------------------------------------------------------------------- */

typedef struct dsv4_sampling {
    float temperature;        /* [0, 100]; < 1e-5 (0) = greedy. Default 1. */
    int top_k;                /* >= 0; 0 = off. Values >= the vocabulary are off too. Default 0. */
    float top_p;              /* (0, 1]; 1 = off. Default 1. */
    float min_p;              /* [0, 1]; 0 = off. Default 0. */
    float repetition_penalty; /* > 0, finite; 1 = off. Prompt + output tokens. Default 1. */
    float presence_penalty;   /* [-2, 2]; 0 = off. Output tokens. Default 0. */
    float frequency_penalty;  /* [-2, 2]; 0 = off. Output tokens. Default 0. */
    uint64_t seed;            /* RNG seed. The server picks a random one when the request has none. */
    int max_tokens;           /* >= 0; 0 = no explicit limit (the engine caps at the context). */
    const char *const *stop;  /* n_stop stop strings (borrowed; non-empty, at most 1024 bytes). */
    size_t n_stop;
    bool ignore_eos;          /* keep generating past the end-of-sequence token */
    const int32_t *bias_tok;  /* logit_bias: n_bias token ids in [0, vocab) (borrowed), */
    const float *bias_val;    /* and what to add to their logits, in [-100, 100] (borrowed) */
    size_t n_bias;
} dsv4_sampling;

#define DSV4_LOGIT_BIAS_MAX 1024 /* entries */

#define DSV4_STOP_MAX_LEN 1024

/* Fills p with the defaults above (OpenAI defaults: temperature 1, everything else off). */
void dsv4_sampling_defaults(dsv4_sampling *p);

/* 0 if every field is in range, else -1 with an error naming the field and its value
 * (e.g. "top_p must be in (0, 1], got 1.5"). NaN is out of range everywhere. */
int dsv4_sampling_validate(const dsv4_sampling *p, dsv4_err *err);

/* ---- Sampler (one per sequence; not thread-safe, different samplers are independent) ------- */

typedef struct dsv4_sampler dsv4_sampler;

/* Validates params, allocates a sampler for a vocabulary of `vocab` tokens (> 0). The params
 * are copied (the stop strings and the logit_bias arrays stay borrowed); a bias token outside [0, vocab) is an
 * error. Returns 0, or -1 with *out = NULL. */
int dsv4_sampler_init(dsv4_sampler **out, const dsv4_sampling *params, int vocab, dsv4_err *err);
void dsv4_sampler_free(dsv4_sampler *s); /* NULL is fine */

/* Records prompt tokens (they count for repetition_penalty only). May be called several times
 * (e.g. chunked prefill). -1 if a token is outside [0, vocab). */
int dsv4_sampler_add_prompt(dsv4_sampler *s, const int32_t *tokens, size_t n, dsv4_err *err);

/* Records a generated token (whether it came from dsv4_sampler_sample or was forced): updates
 * the penalty counts and advances the step (the RNG counter) by one. */
int dsv4_sampler_accept(dsv4_sampler *s, int32_t token, dsv4_err *err);

/* Samples the next token from logits[0..vocab) as specified above, for the current step.
 * Does not accept it (call dsv4_sampler_accept). Calling it twice without accept gives the same
 * token. Returns the token id, or -1 with an error (NaN/+inf logit, every logit -inf). */
int32_t dsv4_sampler_sample(dsv4_sampler *s, const float *logits, dsv4_err *err);

/* Number of tokens accepted so far (= the step of the next draw). */
uint64_t dsv4_sampler_step(const dsv4_sampler *s);

/* Generated-token count of `token` (0 if never generated or out of range). */
uint32_t dsv4_sampler_count(const dsv4_sampler *s, int32_t token);

/* The processed logits of the last dsv4_sampler_sample call (vocab floats: after penalties,
 * divided by the temperature unless greedy; before the min_p/top_k/top_p filters), or NULL if
 * sample was not called yet. Valid until the next sample call or free. Pass them to
 * dsv4_logprobs for "processed" log-probabilities; pass the raw logits for raw ones. */
const float *dsv4_sampler_processed_logits(const dsv4_sampler *s);

/* ---- Log-probabilities -------------------------------------------------------------------- */

typedef struct dsv4_logprob {
    int32_t token;
    float logprob;
} dsv4_logprob;

/* Log-softmax of logits[0..vocab) (computed in double): *token_logprob (if not NULL) gets the
 * log-probability of `token` (when token >= 0), and top[0..n_top) the n_top most likely tokens,
 * most likely first, ties by lowest id (n_top may be 0; n_top > vocab is clamped, the rest of
 * top is left untouched). -inf logits give -inf. -1 on NaN/+inf logits, all -inf, or a token
 * out of range. Returns the number of entries written to top. */
int dsv4_logprobs(const float *logits, int vocab, int32_t token, int n_top, float *token_logprob,
                  dsv4_logprob *top, dsv4_err *err);

/* ---- Stop strings (streaming) ------------------------------------------------------------- */

typedef struct dsv4_stop_result {
    int stop;    /* index of the stop string found, or -1 */
    size_t cut;  /* stop >= 0: the final text is text[0, cut) (the stop string starts at cut) */
    size_t safe; /* stop < 0: text[0, safe) can be emitted; text[safe, len) must be held back */
    size_t hold; /* stop < 0: len - safe, the bytes that could start a stop string */
} dsv4_stop_result;

/* text[0, len) is all the text generated so far (append-only); prev_len is its length at the
 * previous call (0 the first time); matches completely inside text[0, prev_len) are assumed to
 * have been reported already, so only matches ending after prev_len are searched.
 * When a stop string occurs, the one starting earliest wins (ties: lowest index), and the caller
 * emits text[previously safe, cut) and finishes. Otherwise hold is the length of the longest
 * suffix of the text that is a proper prefix of some stop string. `safe` never decreases
 * between calls and a later cut is never below an earlier safe, so emitting text[old safe,
 * new safe) on each call never emits part of a stop string. Empty/NULL stop strings are
 * ignored. (Holding back incomplete UTF-8 sequences is the detokenizer's job.) */
void dsv4_stop_scan(const char *text, size_t len, size_t prev_len, const char *const *stops,
                    size_t n_stops, dsv4_stop_result *r);

#endif
