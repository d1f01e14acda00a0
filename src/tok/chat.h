/* chat.h - DeepSeek-V4 chat encoding: an OpenAI-style message list -> the prompt text.
 *
 * Byte-identical to DeepSeek's encoding/encoding_dsv4.py encode_messages() (spec section 16; the four
 * vectors in tests/fixtures/encoding). The pipeline, as there:
 *   1. tool messages become <tool_result> blocks of a user message; a plain user message directly after
 *      a user message (merged or not, unless that one has a task) joins it; blocks are joined by "\n\n";
 *   2. tool results inside one user message are ordered like the preceding assistant's tool_calls (ids);
 *   3. drop_thinking (thinking mode; switched off when any message has tools): assistant turns before
 *      the last user/developer message lose their reasoning, developer messages there are dropped;
 *   4. each message is rendered (system text, <｜User｜>, <｜latest_reminder｜>, assistant
 *      {reasoning</think>}{content}{DSML tool calls}<｜end▁of▁sentence｜>), a user/developer message
 *      that ends the list or precedes an assistant/latest_reminder gets <｜Assistant｜> + <think> or
 *      </think>; task tokens as in the spec.
 *
 * Message fields read: role; content (a string, or an array of {"type":"text", "text":...} parts joined by
 * "\n\n" as the reference joins merged blocks; a tool result's non-text parts render "[Unsupported T]");
 * reasoning_content; tool_calls [{id, function: {name, arguments}}]
 * (arguments a JSON string as OpenAI sends it, or an already-decoded object); tool_call_id; tools
 * (OpenAI tool list) and response_format on system / developer messages; task; wo_eos.
 *
 * Where this is stricter than the Python (which asserts, prints "None" or raises a TypeError), the
 * message list is refused with an error naming the message: an unknown role, a missing content on user /
 * tool / latest_reminder / developer (developer content must also be non-empty), a content that is
 * neither a string nor an array of text parts (images are not supported), a tool message not preceded
 * by an assistant message with tool_calls (only other tool messages may sit in between), a tool call
 * without function.name or arguments, a tool without "function", an unknown task.
 * Where it is more lenient: tool-call arguments given as a JSON object are used as the decoded
 * arguments (the Python would wrap them as {"arguments": ...}); arguments that decode to something
 * other than an object are treated like undecodable ones: one parameter "arguments" holding the raw
 * string. "tools" on a user message is ignored, as in the Python (its merge step drops it). */
#ifndef DSV4_TOK_CHAT_H
#define DSV4_TOK_CHAT_H

#include <stddef.h>

#include <cjson/cJSON.h>

#include "../util/err.h"

#define DSV4_BOS_TEXT "<\xEF\xBD\x9C" "begin\xE2\x96\x81of\xE2\x96\x81sentence\xEF\xBD\x9C>"
#define DSV4_EOS_TEXT "<\xEF\xBD\x9C" "end\xE2\x96\x81of\xE2\x96\x81sentence\xEF\xBD\x9C>"

typedef enum dsv4_chat_mode {
    DSV4_CHAT_THINKING = 0, /* "thinking": the model reasons inside <think>...</think> first */
    DSV4_CHAT_CHAT = 1,     /* "chat": the prompt ends in </think>, no reasoning */
} dsv4_chat_mode;

typedef enum dsv4_chat_effort {
    DSV4_EFFORT_NONE = 0, /* no prefix */
    DSV4_EFFORT_HIGH = 1, /* the reference's "high": no prefix either (Think High = thinking mode) */
    DSV4_EFFORT_MAX = 2,  /* the "Reasoning Effort: Absolute maximum ..." prefix (thinking mode only) */
} dsv4_chat_effort;

typedef struct dsv4_chat_opts {
    dsv4_chat_mode mode;
    int drop_thinking;      /* drop earlier turns' reasoning (reference default: on) */
    dsv4_chat_effort effort;
    int add_bos;            /* start with <｜begin▁of▁sentence｜> (default: on) */
} dsv4_chat_opts;

/* Defaults of the reference: thinking mode, drop_thinking on, no effort prefix, BOS on. */
dsv4_chat_opts dsv4_chat_opts_default(void);

/* Renders `messages` (a JSON array of message objects) to the prompt text. `tools` (may be NULL) is an
 * OpenAI tool list given separately, as in {"messages": [...], "tools": [...]}: it goes on messages[0]
 * when that is a system or developer message (after any tools it already has), else on a new empty
 * system message put first. Returns a malloc'd NUL-terminated string (*len its length if len is not
 * NULL), or NULL with err set ("messages[3] (tool): ..."). */
char *dsv4_chat_render(const cJSON *messages, const cJSON *tools, const dsv4_chat_opts *opts, size_t *len,
                       dsv4_err *err);

/* The same for a JSON text: either a message list or an object {"messages": [...], "tools": [...]}.
 * JSON is read like Python's json.loads (numbers keep their source form: 1.0 stays 1.0). */
char *dsv4_chat_render_json(const char *json, size_t json_len, const dsv4_chat_opts *opts, size_t *len,
                            dsv4_err *err);

#endif
