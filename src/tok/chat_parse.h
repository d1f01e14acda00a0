/* chat_parse.h - the way back: a DeepSeek-V4 completion (the text generated after the prompt) ->
 * reasoning_content, content and tool_calls, in one go or incrementally while it streams.
 *
 * Format (encoding_dsv4.py parse_message_from_completion_text): in thinking mode the text starts inside
 * <think> and the reasoning runs up to </think>; then content up to <｜end▁of▁sentence｜> or up to
 * "\n\n<｜DSML｜tool_calls", which opens a block of DSML invokes:
 *   <｜DSML｜tool_calls>\n<｜DSML｜invoke name="N">\n<｜DSML｜parameter name="K" string="true|false">V</｜DSML｜parameter>\n
 *   ...</｜DSML｜invoke>\n</｜DSML｜tool_calls>
 * A tool call's arguments become one JSON object text, keys in order: a string="true" value as a JSON
 * string, a string="false" value parsed as JSON (and written back the way Python's json.dumps would).
 *
 * Where the reference asserts, this parser never drops or moves text; it falls back like this:
 *  - thinking mode, no </think> (generation stopped early, or a tool-call block starts first): all text
 *    up to the end / EOS / the tool-call block is reasoning_content; flag DSV4_PARSE_NO_THINK_END.
 *    A leading "<think>" (if the caller included it) is skipped.
 *  - a tool-call block is taken as a whole, when its </｜DSML｜tool_calls> arrives. If it does not parse
 *    (unknown tag, missing name, string= not true/false, duplicate parameter, ...) or never closes (EOS or
 *    end of text first), its raw text, the opening "\n\n<｜DSML｜tool_calls" included, is appended to
 *    content instead; flag DSV4_PARSE_BAD_TOOL_CALLS. Between tags any whitespace is accepted (the
 *    reference wants exactly "\n").
 *  - a string="false" value that is not valid JSON becomes a JSON string of the raw text; flag
 *    DSV4_PARSE_BAD_PARAM_JSON.
 *  - text after a tool-call block (the reference wants EOS right there) is content, appended after any
 *    content before the block; flag DSV4_PARSE_TEXT_AFTER_TOOLS. A later block adds more tool calls.
 *  - "<｜DSML｜tool_calls" in content without the "\n\n" before it also opens a block.
 *  - the first <｜end▁of▁sentence｜> ends the message and is dropped; any text after it is kept apart in
 *    after_eos (flag DSV4_PARSE_TEXT_AFTER_EOS), not in the message.
 *  - other special tokens inside content or reasoning stay there as text.
 *
 * Streaming: a parser fed chunks of any size (one byte at a time included) emits deltas whose
 * concatenation per kind equals the one-shot result; it holds back any tail that could still become a
 * marker ("</thi", "\n\n<｜DS", a partial EOS) and any incomplete UTF-8 character, so a delta never
 * contains part of a marker or half a character (at finish, leftover invalid bytes are emitted as
 * they are). Tool calls are emitted whole, in order, when their block closes. */
#ifndef DSV4_TOK_CHAT_PARSE_H
#define DSV4_TOK_CHAT_PARSE_H

#include <stddef.h>

#include <cjson/cJSON.h>

#include "../util/err.h"
#include "chat.h"

enum {
    DSV4_PARSE_EOS = 1,              /* the text had an <｜end▁of▁sentence｜> */
    DSV4_PARSE_NO_THINK_END = 2,     /* thinking mode without </think> */
    DSV4_PARSE_BAD_TOOL_CALLS = 4,   /* a malformed or unterminated tool-call block went to content */
    DSV4_PARSE_BAD_PARAM_JSON = 8,   /* a string="false" value was not JSON (kept as a string) */
    DSV4_PARSE_TEXT_AFTER_TOOLS = 16,/* content after a tool-call block */
    DSV4_PARSE_TEXT_AFTER_EOS = 32,  /* text after the EOS (in after_eos) */
    DSV4_PARSE_TOOL_CALLS = 64,      /* a tool-call block was parsed (it may hold no invoke at all) */
};

typedef struct dsv4_chat_tool_call {
    char *id;        /* "call_0", "call_1", ... by position in the message; a server may replace them */
    char *name;
    char *arguments; /* a JSON object text, e.g. {"location": "Beijing", "unit": "celsius"} */
} dsv4_chat_tool_call;

typedef struct dsv4_chat_parsed {
    char *reasoning_content; /* NUL-terminated, never NULL after a successful parse ("" in chat mode) */
    size_t reasoning_len;
    char *content;
    size_t content_len;
    dsv4_chat_tool_call *tool_calls;
    int n_tool_calls;
    char *after_eos;         /* text after the first EOS ("" if none) */
    size_t after_eos_len;
    unsigned flags;          /* DSV4_PARSE_* */
} dsv4_chat_parsed;

typedef enum dsv4_chat_delta_kind {
    DSV4_DELTA_REASONING = 0,
    DSV4_DELTA_CONTENT = 1,
    DSV4_DELTA_TOOL_CALL = 2,
} dsv4_chat_delta_kind;

typedef struct dsv4_chat_delta {
    dsv4_chat_delta_kind kind;
    const char *text;                  /* REASONING / CONTENT: the new text (not NUL-terminated), len > 0 */
    size_t len;
    int index;                         /* TOOL_CALL: its position among the message's tool calls */
    const dsv4_chat_tool_call *call;   /* TOOL_CALL: valid during the callback */
} dsv4_chat_delta;

/* Called for every delta, in order, from inside feed / finish. */
typedef void (*dsv4_chat_delta_fn)(void *user, const dsv4_chat_delta *d);

typedef struct dsv4_chat_parser dsv4_chat_parser;

/* fn may be NULL (then only the accumulated result is kept). NULL when out of memory. */
dsv4_chat_parser *dsv4_chat_parser_new(dsv4_chat_mode mode, dsv4_chat_delta_fn fn, void *user);
/* Feeds the next n bytes. -1 (err set) only when out of memory. */
int dsv4_chat_parser_feed(dsv4_chat_parser *p, const char *text, size_t n, dsv4_err *err);
/* End of the completion: emits what was held back, applies the fallbacks. -1 only when out of memory. */
int dsv4_chat_parser_finish(dsv4_chat_parser *p, dsv4_err *err);
/* The message so far (complete after finish). Owned by the parser. */
const dsv4_chat_parsed *dsv4_chat_parser_result(dsv4_chat_parser *p);
/* Moves the accumulated message out into *out (the caller frees it with dsv4_chat_parsed_free). */
int dsv4_chat_parser_take(dsv4_chat_parser *p, dsv4_chat_parsed *out, dsv4_err *err);
void dsv4_chat_parser_free(dsv4_chat_parser *p);

/* One-shot: the same parser fed all of text at once. */
int dsv4_chat_parse(const char *text, size_t n, dsv4_chat_mode mode, dsv4_chat_parsed *out, dsv4_err *err);
void dsv4_chat_parsed_free(dsv4_chat_parsed *m);

/* {"role": "assistant", "content": ..., "reasoning_content": ..., "tool_calls": [{"id", "type":
 * "function", "function": {"name", "arguments"}}]} (tool_calls always present, possibly empty). NULL when
 * out of memory. */
cJSON *dsv4_chat_parsed_to_json(const dsv4_chat_parsed *m);

#endif
