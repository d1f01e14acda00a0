/* chat_json.h - JSON exactly as Python's json module reads and writes it, over cJSON values.
 *
 * DeepSeek's chat encoder (encoding_dsv4.py) embeds json.dumps(value, ensure_ascii=False) output in
 * the prompt: separators ", " and ": ", object keys in their original order, non-ASCII characters
 * raw, floats printed with Python's repr (1.0, 1e-05, 1e+16), integers as written. cJSON keeps
 * every number as a double, so 1 and 1.0 would come out the same; dsv4_pyjson_parse() therefore
 * keeps each number's source text in the cJSON_Number node's valuestring (allocated with
 * cJSON_malloc, freed by cJSON_Delete like any valuestring), and dsv4_pyjson_dump() uses it. Nodes
 * made any other way (cJSON_Parse, cJSON_CreateNumber) print like Python would print the number's
 * most likely source: an integral value below 1e16 as an integer, anything else as a float.
 *
 * Output goes into a dsv4_sb (util/strbuf.h), which this header brings in. */
#ifndef DSV4_TOK_CHAT_JSON_H
#define DSV4_TOK_CHAT_JSON_H

#include <stddef.h>

#include <cjson/cJSON.h>

#include "../util/err.h"
#include "../util/strbuf.h"

/* ---- Python json.loads ---- */

/* Parses exactly what Python's json.loads accepts (NaN / Infinity / -Infinity literals too; a
 * duplicate key keeps its first position and takes the last value, like a dict), with surrounding
 * whitespace allowed. Differences: "\u0000" is refused (cJSON strings are C strings), a lone UTF-16
 * surrogate escape becomes U+FFFD, nesting deeper than 512 is refused. Returns NULL with err set
 * ("line L column C: what"). */
cJSON *dsv4_pyjson_parse(const char *text, size_t len, dsv4_err *err);

/* ---- Python json.dumps ---- */

enum {
    DSV4_PYJSON_COMPACT = 1,  /* separators "," and ":" instead of ", " and ": " */
    DSV4_PYJSON_FIX_UTF8 = 2, /* replace invalid UTF-8 in strings with U+FFFD (for output that must be
                                 valid JSON); without it bytes pass through as they are */
};

/* Appends json.dumps(v, ensure_ascii=False) of v to b. Object keys keep their order; a key that occurs
 * twice in one object is written once, at its first position, with the last value. */
void dsv4_pyjson_dump(dsv4_sb *b, const cJSON *v, int flags);
/* Appends a JSON string literal of s[0..n). */
void dsv4_pyjson_dump_string(dsv4_sb *b, const char *s, size_t n, int flags);
/* Python repr() of a float as json.dumps writes it (NaN, Infinity, -Infinity for the non-finite). */
void dsv4_pyjson_float_repr(double d, char out[32]);

/* Python truthiness of a value: false for NULL (absent), null, false, 0, "", [] and {}. */
int dsv4_pyjson_truthy(const cJSON *v);

/* For an object with duplicate keys: 1 if item is the first of its key (dumps writes it there),
 * and *value gets the last item with that key (the value that wins). */
int dsv4_pyjson_first_of_key(const cJSON *object, const cJSON *item, const cJSON **value);

/* n, less an incomplete multi-byte UTF-8 character at the very end of s[0..n) (invalid bytes elsewhere
 * are not looked at). Keeps streamed deltas from splitting a character. */
size_t dsv4_utf8_complete_prefix(const char *s, size_t n);

#endif
