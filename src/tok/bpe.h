/* bpe.h - byte-level BPE tokenizer compatible with Hugging Face `tokenizers` (tokenizer.json).
 *
 * What is read from tokenizer.json:
 *   - model: type "BPE" (vocab object + merges as "a b" strings or [a, b] pairs; ranks = order, "#version"
 *     lines skipped, a later duplicate pair overrides an earlier one, as tokenizers does), unk_token,
 *     fuse_unk, byte_fallback, ignore_merges. continuing_subword_prefix / end_of_word_suffix / dropout are
 *     refused (error naming the field).
 *   - added_tokens: ids assigned exactly as tokenizers assigns them (a content already in the vocab keeps
 *     its vocab id, the others get consecutive ids from the model's vocab size on, in file order - for a
 *     well-formed file these are the ids the file lists). They are matched BEFORE pre-tokenization with
 *     leftmost-longest matching: first the tokens with normalized=false on the raw text, then the
 *     normalized=true ones on the pieces in between (the normalizer must be null or an empty Sequence,
 *     so "normalized" text is the raw text). lstrip, rstrip and single_word behave as in tokenizers
 *     (whitespace = Unicode White_Space; a word character = the Rust regex \w that tokenizers uses:
 *     Alphabetic, marks, Nd, Pc, Join_Control).
 *   - pre_tokenizer: null, Split, ByteLevel or a Sequence of them. Split patterns ({"Regex": ...} or
 *     {"String": ...}) are compiled with PCRE2 (UTF + UCP, JIT); every behavior (Removed, Isolated,
 *     MergedWithPrevious, MergedWithNext, Contiguous) and invert. tokenizers compiles these regexes with
 *     Oniguruma; the pattern is translated so PCRE2 agrees with it: \s / \S are Unicode White_Space
 *     (PCRE2 alone would add U+180E), \h is a hex digit, and \p{L} \p{M} \p{N} \p{P} \p{S} (short or
 *     long names) also cover the characters Unicode 15-16 added that the system PCRE2's tables may lack
 *     (checked code point by code point against tokenizers 0.23). Other escapes (\w, \d, \p{Lu}, scripts,
 *     POSIX classes) keep PCRE2's definitions, which differ from Oniguruma's on rare code points.
 *     The three Split patterns of the DeepSeek tokenizer also have hand-written matchers for ASCII text
 *     (bpe_fast.c, same results, ~10x faster); PCRE2 takes over wherever the text is not ASCII.
 *     ByteLevel: add_prefix_space and use_regex (the GPT-2 regex) as in the file.
 *   - decoder: ByteLevel (token strings mapped back to bytes; a token with a character outside the
 *     byte alphabet, e.g. "<｜User｜>", gives its UTF-8 bytes as they are).
 *   - normalizer: null or {"type": "Sequence", "normalizers": []}; anything else is refused.
 *   - post_processor: ignored (it only adds special tokens, which encode here never does).
 *
 * Invalid UTF-8 input: encode first replaces every invalid sequence by U+FFFD exactly like Rust's
 * String::from_utf8_lossy / Python's bytes.decode("utf-8", "replace") (one U+FFFD per maximal invalid
 * subpart), then encodes that text. So encode(bytes) == HF encode(bytes.decode("utf-8", "replace")).
 * Decoding does the same on the output bytes (tokenizers' ByteLevel decoder uses from_utf8_lossy).
 *
 * Thread safety: a loaded dsv4_tok is read-only except for a word cache guarded by a mutex (a thread
 * that finds it busy encodes without it), so encode/decode may be called from several threads. */
#ifndef DSV4_TOK_BPE_H
#define DSV4_TOK_BPE_H

#include <stddef.h>
#include <stdint.h>

#include "../util/err.h"

typedef struct dsv4_tok dsv4_tok;
typedef struct dsv4_tok_stream dsv4_tok_stream;

enum {
    /* encode: do not recognize special added tokens in the text (tokenizers' encode_special_tokens=True:
     * their text is tokenized like any other; non-special added tokens are still matched). */
    DSV4_TOK_NO_SPECIAL = 1,
    /* decode / stream: leave special added tokens out of the text (skip_special_tokens=True). */
    DSV4_TOK_SKIP_SPECIAL = 2,
};

/* Loads a tokenizer.json. NULL on failure with err naming the file and the field at fault. */
dsv4_tok *dsv4_tok_load(const char *path, dsv4_err *err);
/* Loads DIR/tokenizer.json (a model directory). */
dsv4_tok *dsv4_tok_load_dir(const char *dir, dsv4_err *err);
/* The same from a JSON text in memory; `name` is used in error messages. */
dsv4_tok *dsv4_tok_load_json(const char *json, size_t len, const char *name, dsv4_err *err);
void dsv4_tok_free(dsv4_tok *t);

/* Token ids of text[0..len) (any bytes; see invalid UTF-8 above). flags: 0 (special tokens in the text
 * are recognized, the default) or DSV4_TOK_NO_SPECIAL. Returns a malloc'd array (non-NULL also when
 * *n_out == 0) or NULL with err set (out of memory, regex engine failure). */
int32_t *dsv4_tok_encode(const dsv4_tok *t, const char *text, size_t len, int flags, size_t *n_out,
                         dsv4_err *err);

/* Text of ids (flags: 0 or DSV4_TOK_SKIP_SPECIAL): malloc'd, NUL-terminated, valid UTF-8, *len_out
 * (may be NULL) its length without the NUL. NULL with err set for an id outside the vocabulary. */
char *dsv4_tok_decode(const dsv4_tok *t, const int32_t *ids, size_t n, int flags, size_t *len_out,
                      dsv4_err *err);

/* Number of ids: 1 + the largest id of the vocabulary and the added tokens. */
int32_t dsv4_tok_vocab_size(const dsv4_tok *t);
/* The token string of id as written in tokenizer.json (e.g. "Ġthe", "<｜User｜>"), NUL-terminated;
 * NULL when id is not in the vocabulary. */
const char *dsv4_tok_token(const dsv4_tok *t, int32_t id);
/* The bytes id decodes to (not NUL-terminated, may be a partial UTF-8 sequence); NULL if no such id. */
const char *dsv4_tok_token_bytes(const dsv4_tok *t, int32_t id, size_t *len);
/* Id of a token string (added tokens first, then the model vocab, as tokenizers' token_to_id);
 * -1 if absent. */
int32_t dsv4_tok_id(const dsv4_tok *t, const char *token);
/* 1 if id is an added token flagged special, else 0. */
int dsv4_tok_is_special(const dsv4_tok *t, int32_t id);

/* Incremental detokenizer for streaming: feed ids one at a time; each call returns the text completed
 * by that id. Output never contains a broken UTF-8 sequence: an incomplete trailing sequence is held
 * back until the next id completes it (or flush replaces it by U+FFFD). The concatenation of every
 * feed plus the flush equals dsv4_tok_decode of the same ids with the same flags. */
dsv4_tok_stream *dsv4_tok_stream_new(const dsv4_tok *t, int flags); /* NULL when out of memory */
/* Returned text is NUL-terminated, owned by the stream, valid until the next call. NULL with err set
 * for an id outside the vocabulary (the stream is unchanged). */
const char *dsv4_tok_stream_feed(dsv4_tok_stream *s, int32_t id, size_t *len, dsv4_err *err);
/* Ends the stream: returns what was held back (as U+FFFD replacements) and resets the stream. */
const char *dsv4_tok_stream_flush(dsv4_tok_stream *s, size_t *len);
void dsv4_tok_stream_free(dsv4_tok_stream *s);

/* Debugging / testing aid: calls fn for every piece that reaches the BPE model (after added-token
 * matching and pre-tokenization), in order; added tokens come with their id, text pieces with id -1.
 * Returns 0, or -1 with err set. */
int dsv4_tok_pretokenize(const dsv4_tok *t, const char *text, size_t len, int flags,
                         void (*fn)(void *ctx, const char *piece, size_t n, int32_t id), void *ctx,
                         dsv4_err *err);

#endif
