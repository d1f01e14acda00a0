/* test_chat.c - DeepSeek-V4 chat encoding (src/tok/chat.c), the completion parser
 * (src/tok/chat_parse.c) and the Python-compatible JSON underneath (src/tok/chat_json.c). */
#include <criterion/criterion.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "check.h"
#include "tok/chat.h"
#include "tok/chat_json.h"
#include "tok/chat_parse.h"

#define BOS "<｜begin▁of▁sentence｜>"
#define EOS "<｜end▁of▁sentence｜>"
#define USR "<｜User｜>"
#define AST "<｜Assistant｜>"
#define DS "｜DSML｜"

/* ---------------------------------------------------------------------------------------------- */
/* helpers */

static char *slurp(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    cr_assert(f, "cannot open %s", path);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *b = malloc((size_t)n + 1);
    cr_assert(b);
    cr_assert_eq(fread(b, 1, (size_t)n, f), (size_t)n);
    fclose(f);
    b[n] = 0;
    *len = (size_t)n;
    return b;
}

static dsv4_chat_opts opts(dsv4_chat_mode mode) {
    dsv4_chat_opts o = dsv4_chat_opts_default();
    o.mode = mode;
    return o;
}

/* renders a JSON message list; fails the test on error */
static char *render(const char *json, dsv4_chat_opts o) {
    dsv4_err err = {{0}};
    size_t len;
    char *s = dsv4_chat_render_json(json, strlen(json), &o, &len, &err);
    cr_assert(s, "render failed: %s\ninput: %s", err.msg, json);
    cr_assert_eq(strlen(s), len);
    return s;
}

static void expect_render(const char *json, dsv4_chat_opts o, const char *want) {
    char *s = render(json, o);
    cr_assert_str_eq(s, want, "input: %s", json);
    free(s);
}

/* renders and expects an error whose message contains `needle` */
static void expect_error(const char *json, const char *needle) {
    dsv4_err err = {{0}};
    dsv4_chat_opts o = dsv4_chat_opts_default();
    char *s = dsv4_chat_render_json(json, strlen(json), &o, NULL, &err);
    cr_assert_null(s, "expected an error for %s, got \"%s\"", json, s ? s : "");
    cr_assert(strstr(err.msg, needle), "error \"%s\" does not mention \"%s\"", err.msg, needle);
}

static int ends_with(const char *s, const char *suffix) {
    size_t a = strlen(s), b = strlen(suffix);
    return a >= b && !memcmp(s + a - b, suffix, b);
}

static void check_vector(int k, dsv4_chat_mode mode) {
    char in[512], out[512];
    snprintf(in, sizeof in, "%s/encoding/test_input_%d.json", dsv4_test_fixtures(), k);
    snprintf(out, sizeof out, "%s/encoding/test_output_%d.txt", dsv4_test_fixtures(), k);
    size_t nin, nout, len;
    char *json = slurp(in, &nin), *want = slurp(out, &nout);
    dsv4_chat_opts o = opts(mode);
    dsv4_err err = {{0}};
    char *got = dsv4_chat_render_json(json, nin, &o, &len, &err);
    cr_assert(got, "vector %d: %s", k, err.msg);
    cr_assert_eq(len, nout, "vector %d: length %zu, want %zu", k, len, nout);
    size_t i = 0;
    while (i < len && got[i] == want[i]) i++;
    cr_assert_eq(i, len, "vector %d: first difference at byte %zu: got \"%.60s\" want \"%.60s\"", k, i, got + i,
                 want + i);
    free(got);
    free(json);
    free(want);
}

/* the assistant text of vector k: after the n-th "<｜Assistant｜><think>" (n < 0: the last) up to and
 * including the next EOS */
static char *assistant_text(int k, int nth) {
    char path[512];
    snprintf(path, sizeof path, "%s/encoding/test_output_%d.txt", dsv4_test_fixtures(), k);
    size_t n;
    char *s = slurp(path, &n);
    const char *tag = AST "<think>", *p = s, *hit = NULL;
    for (int i = 0; (p = strstr(p, tag)); p++, i++) {
        hit = p;
        if (i == nth) break;
    }
    cr_assert(hit);
    hit += strlen(tag);
    const char *e = strstr(hit, EOS);
    cr_assert(e);
    char *r = strndup(hit, (size_t)(e - hit) + strlen(EOS));
    free(s);
    return r;
}

/* ---- streaming collection ---- */

typedef struct {
    dsv4_sb reasoning, content;
    char *names[16], *args[16], *ids[16];
    int n_calls;
    int bad_delta; /* a delta that split a UTF-8 character */
} collected;

static void on_delta(void *user, const dsv4_chat_delta *d) {
    collected *c = user;
    if (d->kind == DSV4_DELTA_TOOL_CALL) {
        cr_assert_lt(c->n_calls, 16);
        cr_assert_eq(d->index, c->n_calls);
        c->names[c->n_calls] = strdup(d->call->name);
        c->args[c->n_calls] = strdup(d->call->arguments);
        c->ids[c->n_calls] = strdup(d->call->id);
        c->n_calls++;
        return;
    }
    cr_assert_gt(d->len, 0);
    if (dsv4_utf8_complete_prefix(d->text, d->len) != d->len) c->bad_delta = 1;
    dsv4_sb_put(d->kind == DSV4_DELTA_REASONING ? &c->reasoning : &c->content, d->text, d->len);
}

static void collected_free(collected *c) {
    dsv4_sb_free(&c->reasoning);
    dsv4_sb_free(&c->content);
    for (int i = 0; i < c->n_calls; i++) {
        free(c->names[i]);
        free(c->args[i]);
        free(c->ids[i]);
    }
}

static const char *sbs(const dsv4_sb *b) { return b->p ? b->p : ""; }

/* feeds text in chunks of `chunk` bytes; checks the deltas against the one-shot parse */
static void check_stream(const char *text, size_t n, dsv4_chat_mode mode, size_t chunk, int valid_utf8) {
    dsv4_chat_parsed one;
    dsv4_err err = {{0}};
    cr_assert_eq(dsv4_chat_parse(text, n, mode, &one, &err), 0, "%s", err.msg);

    collected c = {0};
    dsv4_chat_parser *p = dsv4_chat_parser_new(mode, on_delta, &c);
    cr_assert(p);
    for (size_t i = 0; i < n; i += chunk)
        cr_assert_eq(dsv4_chat_parser_feed(p, text + i, n - i < chunk ? n - i : chunk, &err), 0);
    cr_assert_eq(dsv4_chat_parser_finish(p, &err), 0);
    const dsv4_chat_parsed *r = dsv4_chat_parser_result(p);

    const char *what = mode == DSV4_CHAT_THINKING ? "thinking" : "chat";
    cr_assert_str_eq(sbs(&c.reasoning), one.reasoning_content, "%s chunk %zu reasoning, input: %s", what, chunk, text);
    cr_assert_str_eq(sbs(&c.content), one.content, "%s chunk %zu content, input: %s", what, chunk, text);
    cr_assert_str_eq(r->reasoning_content, one.reasoning_content);
    cr_assert_str_eq(r->content, one.content);
    cr_assert_str_eq(r->after_eos, one.after_eos);
    cr_assert_eq(r->flags, one.flags, "%s chunk %zu flags %u vs %u, input: %s", what, chunk, r->flags, one.flags, text);
    cr_assert_eq(c.n_calls, one.n_tool_calls, "input: %s", text);
    for (int i = 0; i < c.n_calls; i++) {
        cr_assert_str_eq(c.names[i], one.tool_calls[i].name);
        cr_assert_str_eq(c.args[i], one.tool_calls[i].arguments);
        cr_assert_str_eq(c.ids[i], one.tool_calls[i].id);
    }
    if (valid_utf8) cr_assert_not(c.bad_delta, "a delta split a UTF-8 character (chunk %zu), input: %s", chunk, text);

    /* nothing lost: without a tool-call block the parts put back together give the input again */
    if (!(one.flags & DSV4_PARSE_TOOL_CALLS)) {
        dsv4_sb b = {0};
        if (mode == DSV4_CHAT_THINKING && !strncmp(text, "<think>", 7)) dsv4_sb_puts(&b, "<think>");
        dsv4_sb_puts(&b, one.reasoning_content);
        if (mode == DSV4_CHAT_THINKING && !(one.flags & DSV4_PARSE_NO_THINK_END)) dsv4_sb_puts(&b, "</think>");
        dsv4_sb_puts(&b, one.content);
        if (one.flags & DSV4_PARSE_EOS) dsv4_sb_puts(&b, EOS);
        dsv4_sb_puts(&b, one.after_eos);
        cr_assert_eq(b.n, n, "lossless: %zu bytes back of %zu, input: %s", b.n, n, text);
        cr_assert_eq(memcmp(b.p ? b.p : "", text, n), 0, "lossless, input: %s", text);
        dsv4_sb_free(&b);
    }
    dsv4_chat_parser_free(p);
    collected_free(&c);
    dsv4_chat_parsed_free(&one);
}

static void check_stream_all(const char *text, int valid_utf8) {
    static const size_t chunks[] = {1, 2, 3, 5, 7, 13, 64, 1 << 20};
    for (int m = 0; m < 2; m++)
        for (size_t k = 0; k < sizeof chunks / sizeof chunks[0]; k++)
            check_stream(text, strlen(text), m ? DSV4_CHAT_CHAT : DSV4_CHAT_THINKING, chunks[k], valid_utf8);
}

static dsv4_chat_parsed parse(const char *text, dsv4_chat_mode mode) {
    dsv4_chat_parsed m;
    dsv4_err err = {{0}};
    cr_assert_eq(dsv4_chat_parse(text, strlen(text), mode, &m, &err), 0, "%s", err.msg);
    return m;
}

/* ---------------------------------------------------------------------------------------------- */
/* the four official vectors */

Test(chat_vectors, case1_tools_thinking) { check_vector(1, DSV4_CHAT_THINKING); }
Test(chat_vectors, case2_drop_thinking) { check_vector(2, DSV4_CHAT_THINKING); }
Test(chat_vectors, case3_developer_tools_reminder) { check_vector(3, DSV4_CHAT_THINKING); }
Test(chat_vectors, case4_chat_action_task) { check_vector(4, DSV4_CHAT_CHAT); }

Test(chat_vectors, case1_tools_passed_separately) {
    /* case 1 through the API's separate tools argument gives the same bytes */
    char in[512], out[512];
    snprintf(in, sizeof in, "%s/encoding/test_input_1.json", dsv4_test_fixtures());
    snprintf(out, sizeof out, "%s/encoding/test_output_1.txt", dsv4_test_fixtures());
    size_t nin, nout, len;
    char *json = slurp(in, &nin), *want = slurp(out, &nout);
    cJSON *root = dsv4_pyjson_parse(json, nin, NULL);
    cr_assert(root);
    dsv4_chat_opts o = opts(DSV4_CHAT_THINKING);
    dsv4_err err = {{0}};
    char *got = dsv4_chat_render(cJSON_GetObjectItem(root, "messages"), cJSON_GetObjectItem(root, "tools"), &o, &len,
                                 &err);
    cr_assert(got, "%s", err.msg);
    cr_assert_eq(len, nout);
    cr_assert_eq(memcmp(got, want, len), 0);
    free(got);
    cJSON_Delete(root);
    free(json);
    free(want);
}

/* ---------------------------------------------------------------------------------------------- */
/* the spec's examples (section 16) and the rules around them */

static const char sys_user[] = "[{\"role\":\"system\",\"content\":\"You are a helpful assistant.\"},"
                               "{\"role\":\"user\",\"content\":\"What is 2+2?\"}]";

Test(chat_encode, spec_chat_mode) {
    expect_render(sys_user, opts(DSV4_CHAT_CHAT), BOS "You are a helpful assistant." USR "What is 2+2?" AST "</think>");
}

Test(chat_encode, spec_thinking_mode) {
    expect_render(sys_user, opts(DSV4_CHAT_THINKING), BOS "You are a helpful assistant." USR "What is 2+2?" AST "<think>");
}

static const char two_turns[] =
    "[{\"role\":\"system\",\"content\":\"SYS\"},{\"role\":\"user\",\"content\":\"Hello\"},"
    "{\"role\":\"assistant\",\"reasoning_content\":\"R1\",\"content\":\"Hi there! How can I help you?\"},"
    "{\"role\":\"user\",\"content\":\"What is the capital of France?\"}]";

Test(chat_encode, spec_two_turns_drop) {
    expect_render(two_turns, opts(DSV4_CHAT_THINKING),
                  BOS "SYS" USR "Hello" AST "</think>Hi there! How can I help you?" EOS USR
                      "What is the capital of France?" AST "<think>");
}

Test(chat_encode, two_turns_no_drop) {
    dsv4_chat_opts o = opts(DSV4_CHAT_THINKING);
    o.drop_thinking = 0;
    expect_render(two_turns, o,
                  BOS "SYS" USR "Hello" AST "<think>R1</think>Hi there! How can I help you?" EOS USR
                      "What is the capital of France?" AST "<think>");
}

Test(chat_encode, two_turns_chat_mode_has_no_reasoning) {
    expect_render(two_turns, opts(DSV4_CHAT_CHAT),
                  BOS "SYS" USR "Hello" AST "</think>Hi there! How can I help you?" EOS USR
                      "What is the capital of France?" AST "</think>");
}

static const char weather_tool[] =
    "{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"description\":\"Get weather\","
    "\"parameters\":{\"type\":\"object\",\"properties\":{\"location\":{\"type\":\"string\"}}}}}";

Test(chat_encode, spec_tool_round_trip) {
    char json[2048];
    snprintf(json, sizeof json,
             "[{\"role\":\"system\",\"content\":\"SYS\",\"tools\":[%s]},"
             "{\"role\":\"user\",\"content\":\"What's the weather in Beijing?\"},"
             "{\"role\":\"assistant\",\"reasoning_content\":\"REASONING\",\"tool_calls\":[{\"id\":\"c1\",\"type\":"
             "\"function\",\"function\":{\"name\":\"get_weather\",\"arguments\":\"{\\\"location\\\": \\\"Beijing\\\", "
             "\\\"unit\\\": \\\"celsius\\\"}\"}}]},"
             "{\"role\":\"tool\",\"tool_call_id\":\"c1\",\"content\":\"{\\\"temperature\\\": 22, \\\"condition\\\": "
             "\\\"sunny\\\", \\\"humidity\\\": 45}\"}]",
             weather_tool);
    char *s = render(json, opts(DSV4_CHAT_THINKING));
    const char *want =
        USR "What's the weather in Beijing?" AST "<think>REASONING</think>\n\n<" DS "tool_calls>\n<" DS
            "invoke name=\"get_weather\">\n<" DS "parameter name=\"location\" string=\"true\">Beijing</" DS
            "parameter>\n<" DS "parameter name=\"unit\" string=\"true\">celsius</" DS "parameter>\n</" DS
            "invoke>\n</" DS "tool_calls>" EOS USR
            "<tool_result>{\"temperature\": 22, \"condition\": \"sunny\", \"humidity\": 45}</tool_result>" AST "<think>";
    cr_assert(ends_with(s, want), "got: %s", s);
    cr_assert(!strncmp(s, BOS "SYS\n\n## Tools\n\nYou have access", strlen(BOS "SYS\n\n## Tools\n\nYou have access")));
    cr_assert(strstr(s, "### Available Tool Schemas\n\n{\"name\": \"get_weather\", \"description\": \"Get weather\", "
                        "\"parameters\": {\"type\": \"object\", \"properties\": {\"location\": {\"type\": "
                        "\"string\"}}}}\n\nYou MUST strictly follow the above defined tool name and parameter schemas "
                        "to invoke tool calls.\n" USR));
    free(s);
}

Test(chat_encode, spec_latest_reminder) {
    expect_render("[{\"role\":\"system\",\"content\":\"SYS\"},{\"role\":\"latest_reminder\",\"content\":"
                  "\"2024-11-15,上海市,App,中文\"},{\"role\":\"user\",\"content\":\"hi\"}]",
                  opts(DSV4_CHAT_THINKING), BOS "SYS<｜latest_reminder｜>2024-11-15,上海市,App,中文" USR "hi" AST "<think>");
}

Test(chat_encode, latest_reminder_after_user_gets_the_assistant_turn_first) {
    expect_render("[{\"role\":\"user\",\"content\":\"u\"},{\"role\":\"latest_reminder\",\"content\":\"r\"}]",
                  opts(DSV4_CHAT_THINKING), BOS USR "u" AST "<think><｜latest_reminder｜>r");
}

static const char max_prefix[] =
    "Reasoning Effort: Absolute maximum with no shortcuts permitted.\nYou MUST be very thorough in your thinking and "
    "comprehensively decompose the problem to resolve the root cause, rigorously stress-testing your logic against "
    "all potential paths, edge cases, and adversarial scenarios.\nExplicitly write out your entire deliberation "
    "process, documenting every intermediate step, considered alternative, and rejected hypothesis to ensure "
    "absolutely no assumption is left unchecked.\n\n";

Test(chat_encode, spec_max_effort) {
    dsv4_chat_opts o = opts(DSV4_CHAT_THINKING);
    o.effort = DSV4_EFFORT_MAX;
    char want[2048];
    snprintf(want, sizeof want, BOS "%sYou are a helpful assistant." USR "What is 2+2?" AST "<think>", max_prefix);
    expect_render(sys_user, o, want);
    /* chat mode: no prefix; "high" adds nothing either */
    o.mode = DSV4_CHAT_CHAT;
    expect_render(sys_user, o, BOS "You are a helpful assistant." USR "What is 2+2?" AST "</think>");
    o.mode = DSV4_CHAT_THINKING;
    o.effort = DSV4_EFFORT_HIGH;
    expect_render(sys_user, o, BOS "You are a helpful assistant." USR "What is 2+2?" AST "<think>");
}

Test(chat_encode, no_bos_and_empty_list) {
    dsv4_chat_opts o = opts(DSV4_CHAT_THINKING);
    o.add_bos = 0;
    expect_render("[{\"role\":\"user\",\"content\":\"x\"}]", o, USR "x" AST "<think>");
    expect_render("[]", opts(DSV4_CHAT_THINKING), BOS);
}

Test(chat_encode, tools_disable_drop) {
    char json[2048];
    snprintf(json, sizeof json,
             "[{\"role\":\"system\",\"content\":\"S\",\"tools\":[%s]},{\"role\":\"user\",\"content\":\"a\"},"
             "{\"role\":\"assistant\",\"reasoning_content\":\"r\",\"content\":\"b\"},{\"role\":\"user\",\"content\":"
             "\"c\"}]",
             weather_tool);
    char *s = render(json, opts(DSV4_CHAT_THINKING));
    cr_assert(ends_with(s, USR "a" AST "<think>r</think>b" EOS USR "c" AST "<think>"), "got: %s", s);
    free(s);
}

Test(chat_encode, developer_dropped_before_last_user) {
    const char *json = "[{\"role\":\"developer\",\"content\":\"D\"},{\"role\":\"assistant\",\"content\":\"a\"},"
                       "{\"role\":\"user\",\"content\":\"u\"}]";
    expect_render(json, opts(DSV4_CHAT_THINKING), BOS "a" EOS USR "u" AST "<think>");
    dsv4_chat_opts o = opts(DSV4_CHAT_THINKING);
    o.drop_thinking = 0;
    expect_render(json, o, BOS USR "D" AST "<think></think>a" EOS USR "u" AST "<think>");
}

Test(chat_encode, consecutive_users_merge) {
    expect_render("[{\"role\":\"user\",\"content\":\"a\"},{\"role\":\"user\",\"content\":\"b\"}]",
                  opts(DSV4_CHAT_CHAT), BOS USR "a\n\nb" AST "</think>");
    /* text parts of one message are joined like merged messages */
    expect_render("[{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"a\"},{\"type\":\"text\",\"text\":\"b\"}]}]",
                  opts(DSV4_CHAT_CHAT), BOS USR "a\n\nb" AST "</think>");
}

static const char two_calls[] =
    "{\"role\":\"assistant\",\"content\":\"\",\"tool_calls\":["
    "{\"id\":\"A\",\"type\":\"function\",\"function\":{\"name\":\"f\",\"arguments\":\"{}\"}},"
    "{\"id\":\"B\",\"type\":\"function\",\"function\":{\"name\":\"g\",\"arguments\":\"{\\\"n\\\": 1.0, \\\"l\\\": [1, "
    "true, null], \\\"o\\\": {\\\"k\\\": \\\"ü\\\"}}\"}}]}";

Test(chat_encode, tool_results_follow_call_order) {
    char json[2048];
    snprintf(json, sizeof json,
             "[{\"role\":\"user\",\"content\":\"q\"},%s,{\"role\":\"tool\",\"tool_call_id\":\"B\",\"content\":\"rb\"},"
             "{\"role\":\"tool\",\"tool_call_id\":\"A\",\"content\":\"ra\"},{\"role\":\"user\",\"content\":\"more\"}]",
             two_calls);
    char *s = render(json, opts(DSV4_CHAT_CHAT));
    const char *want = "\n\n<" DS "tool_calls>\n<" DS "invoke name=\"f\">\n\n</" DS "invoke>\n<" DS
                       "invoke name=\"g\">\n<" DS "parameter name=\"n\" string=\"false\">1.0</" DS "parameter>\n<" DS
                       "parameter name=\"l\" string=\"false\">[1, true, null]</" DS "parameter>\n<" DS
                       "parameter name=\"o\" string=\"false\">{\"k\": \"ü\"}</" DS "parameter>\n</" DS
                       "invoke>\n</" DS "tool_calls>" EOS USR
                       "<tool_result>ra</tool_result>\n\n<tool_result>rb</tool_result>\n\nmore" AST "</think>";
    cr_assert(ends_with(s, want), "got: %s", s);
    free(s);
}

Test(chat_encode, arguments_as_object_and_undecodable) {
    const char *obj = "[{\"role\":\"user\",\"content\":\"q\"},{\"role\":\"assistant\",\"tool_calls\":[{\"function\":"
                      "{\"name\":\"f\",\"arguments\":{\"x\":\"s\",\"y\":2}}}]}]";
    expect_render(obj, opts(DSV4_CHAT_CHAT),
                  BOS USR "q" AST "</think>\n\n<" DS "tool_calls>\n<" DS "invoke name=\"f\">\n<" DS
                          "parameter name=\"x\" string=\"true\">s</" DS "parameter>\n<" DS
                          "parameter name=\"y\" string=\"false\">2</" DS "parameter>\n</" DS "invoke>\n</" DS
                          "tool_calls>" EOS);
    const char *bad = "[{\"role\":\"user\",\"content\":\"q\"},{\"role\":\"assistant\",\"tool_calls\":[{\"function\":"
                      "{\"name\":\"f\",\"arguments\":\"not json\"}}]}]";
    char *s = render(bad, opts(DSV4_CHAT_CHAT));
    cr_assert(strstr(s, "<" DS "parameter name=\"arguments\" string=\"true\">not json</" DS "parameter>"), "%s", s);
    free(s);
}

Test(chat_encode, task_tokens) {
    expect_render("[{\"role\":\"user\",\"content\":\"u\",\"task\":\"title\"}]", opts(DSV4_CHAT_THINKING),
                  BOS USR "u<｜title｜>");
    expect_render("[{\"role\":\"user\",\"content\":\"u\",\"task\":\"action\"}]", opts(DSV4_CHAT_THINKING),
                  BOS USR "u" AST "<think><｜action｜>");
    /* the assistant answering a task has no thinking part, even in thinking mode */
    expect_render("[{\"role\":\"user\",\"content\":\"u\",\"task\":\"query\"},{\"role\":\"assistant\",\"content\":\"q\"}]",
                  opts(DSV4_CHAT_THINKING), BOS USR "u<｜query｜>q" EOS);
}

Test(chat_encode, response_format_and_wo_eos) {
    expect_render("[{\"role\":\"system\",\"content\":\"S\",\"response_format\":{\"type\":\"json_schema\",\"n\":1e-05}},"
                  "{\"role\":\"user\",\"content\":\"u\"},{\"role\":\"assistant\",\"content\":\"par\",\"wo_eos\":true}]",
                  opts(DSV4_CHAT_CHAT),
                  BOS "S\n\n## Response Format:\n\nYou MUST strictly adhere to the following schema to reply:\n"
                      "{\"type\": \"json_schema\", \"n\": 1e-05}" USR "u" AST "</think>par");
}

Test(chat_encode, separate_tools_without_system_message) {
    char json[2048];
    snprintf(json, sizeof json, "{\"messages\":[{\"role\":\"user\",\"content\":\"u\"}],\"tools\":[%s]}", weather_tool);
    char *s = render(json, opts(DSV4_CHAT_THINKING));
    cr_assert(!strncmp(s, BOS "\n\n## Tools\n\n", strlen(BOS "\n\n## Tools\n\n")), "%s", s);
    cr_assert(ends_with(s, "tool calls.\n" USR "u" AST "<think>"), "%s", s);
    free(s);
}

/* ---------------------------------------------------------------------------------------------- */
/* bad message lists */

Test(chat_errors, bad_lists) {
    expect_error("[{\"role\":\"bot\",\"content\":\"x\"}]", "unknown role \"bot\"");
    expect_error("[{\"content\":\"x\"}]", "missing \"role\"");
    expect_error("[{\"role\":\"user\"}]", "messages[0] (user): missing \"content\"");
    expect_error("[{\"role\":\"user\",\"content\":null}]", "missing \"content\"");
    expect_error("[{\"role\":\"user\",\"content\":5}]", "not a string");
    expect_error("[{\"role\":\"user\",\"content\":\"q\"},{\"role\":\"tool\",\"content\":\"r\"}]",
                 "messages[1] (tool): a tool result must follow an assistant message with tool_calls");
    expect_error("[{\"role\":\"user\",\"content\":\"q\"},{\"role\":\"assistant\",\"content\":\"a\"},{\"role\":\"tool\","
                 "\"content\":\"r\"}]",
                 "must follow an assistant message with tool_calls");
    expect_error("[{\"role\":\"developer\",\"content\":\"\"}]", "(developer): \"content\" is empty");
    expect_error("[{\"role\":\"user\",\"content\":\"u\",\"task\":\"nope\"}]", "invalid task");
    expect_error("[{\"role\":\"assistant\",\"tool_calls\":[{\"function\":{\"arguments\":\"{}\"}}]}]",
                 "function.name");
    expect_error("[{\"role\":\"system\",\"content\":\"s\",\"tools\":[{\"type\":\"function\"}]}]",
                 "tools[0] has no \"function\"");
    expect_error("[{\"role\":\"user\",\"content\":[{\"type\":\"image_url\"}]}]", "not supported");
    expect_error("[1]", "messages[0]: not a JSON object");
    expect_error("{\"role\":\"user\"}", "\"messages\"");
    expect_error("\"hello\"", "expected a JSON array");
}

Test(chat_errors, bad_json) {
    expect_error("[{\"role\":\"user\",\"content\":\"x\"", "message list JSON: line 1");
    expect_error("[{\"role\":\"user\",\"content\":\"x\"}] trailing", "extra data");
    expect_error("", "expecting value");
    expect_error("[{\"role\":'user'}]", "line 1 column 10");
    expect_error("[\"a\tb\"]", "control character");
}

/* ---------------------------------------------------------------------------------------------- */
/* Python-compatible JSON */

static char *dumps(const char *json) {
    dsv4_err err = {{0}};
    cJSON *v = dsv4_pyjson_parse(json, strlen(json), &err);
    cr_assert(v, "%s: %s", json, err.msg);
    dsv4_sb b = {0};
    dsv4_pyjson_dump(&b, v, 0);
    cJSON_Delete(v);
    return dsv4_sb_take(&b, NULL);
}

static void expect_dumps(const char *json, const char *want) {
    char *s = dumps(json);
    cr_assert_str_eq(s, want, "json.dumps(json.loads(%s))", json);
    free(s);
}

Test(chat_json, python_dumps) {
    expect_dumps("{\"a\":1,\"b\":[1.0,-0,-0.0,1e5,1E-7,0.0001,12345678901234567890,1e16,1.5e300],\"c\":{}}",
                 "{\"a\": 1, \"b\": [1.0, 0, -0.0, 100000.0, 1e-07, 0.0001, 12345678901234567890, 1e+16, 1.5e+300], "
                 "\"c\": {}}");
    expect_dumps("[0.1, 2.5, 100.0, 123456789.125, 1e15, 9007199254740993, 1e400, NaN, -Infinity]",
                 "[0.1, 2.5, 100.0, 123456789.125, 1000000000000000.0, 9007199254740993, Infinity, NaN, -Infinity]");
    expect_dumps("\"\\u00e9\\ud83d\\ude00 \\\" \\\\ \\/ \\n\\r\\t\\b\\f \\u0001 \\u007f 中\"",
                 "\"é😀 \\\" \\\\ / \\n\\r\\t\\b\\f \\u0001 \x7f 中\"");
    expect_dumps("{\"k\": 1, \"j\": 2, \"k\": 3}", "{\"k\": 3, \"j\": 2}"); /* dict semantics */
    expect_dumps(" [ ] ", "[]");
    expect_dumps("[true,false,null]", "[true, false, null]");
}

Test(chat_json, float_repr) {
    static const struct {
        double d;
        const char *s;
    } cases[] = {{1.0, "1.0"},     {0.1, "0.1"},         {1e-5, "1e-05"},      {1e16, "1e+16"},
                 {1e15, "1000000000000000.0"},            {0.30000000000000004, "0.30000000000000004"},
                 {5e-324, "5e-324"}, {1.7976931348623157e308, "1.7976931348623157e+308"},
                 {-2.5, "-2.5"},   {123.456, "123.456"}, {0.0001, "0.0001"},   {0.00012, "0.00012"}};
    char buf[32];
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        dsv4_pyjson_float_repr(cases[i].d, buf);
        cr_assert_str_eq(buf, cases[i].s);
    }
}

Test(chat_json, truthy_and_utf8) {
    const char *src = "[0, 0.0, \"\", [], {}, null, false, 1, \"x\", [0], {\"a\":0}, true]";
    cJSON *v = dsv4_pyjson_parse(src, strlen(src), NULL);
    cr_assert(v);
    int i = 0;
    for (const cJSON *c = v->child; c; c = c->next, i++) cr_assert_eq(dsv4_pyjson_truthy(c), i >= 7, "item %d", i);
    cJSON_Delete(v);
    cr_assert_eq(dsv4_utf8_complete_prefix("ab\xE4\xB8", 4), 2);
    cr_assert_eq(dsv4_utf8_complete_prefix("ab\xE4\xB8\xAD", 5), 5);
    cr_assert_eq(dsv4_utf8_complete_prefix("\xF0\x9F\x98", 3), 0);
    dsv4_sb b = {0};
    dsv4_pyjson_dump_string(&b, "a\xFF" "b", 3, DSV4_PYJSON_FIX_UTF8);
    cr_assert_str_eq(b.p, "\"a\xEF\xBF\xBD" "b\"");
    dsv4_sb_free(&b);
}

/* ---------------------------------------------------------------------------------------------- */
/* parsing completions */

Test(chat_parse, readme_case1_tool_call) {
    char *text = assistant_text(1, 0);
    dsv4_chat_parsed m = parse(text, DSV4_CHAT_THINKING);
    cr_assert_str_eq(m.reasoning_content, "The user wants to know the weather in Beijing. I should use the get_weather tool.");
    cr_assert_str_eq(m.content, "");
    cr_assert_eq(m.n_tool_calls, 1);
    cr_assert_str_eq(m.tool_calls[0].name, "get_weather");
    cr_assert_str_eq(m.tool_calls[0].arguments, "{\"location\": \"Beijing\", \"unit\": \"celsius\"}");
    cr_assert_str_eq(m.tool_calls[0].id, "call_0");
    cr_assert_eq(m.flags, DSV4_PARSE_EOS | DSV4_PARSE_TOOL_CALLS);
    check_stream_all(text, 1);

    cJSON *j = dsv4_chat_parsed_to_json(&m);
    cr_assert(j);
    char *s = cJSON_PrintUnformatted(j);
    cr_assert_str_eq(s, "{\"role\":\"assistant\",\"content\":\"\",\"reasoning_content\":\"The user wants to know the "
                        "weather in Beijing. I should use the get_weather tool.\",\"tool_calls\":[{\"id\":\"call_0\","
                        "\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"arguments\":\"{\\\"location\\\": "
                        "\\\"Beijing\\\", \\\"unit\\\": \\\"celsius\\\"}\"}}]}");
    free(s);
    cJSON_Delete(j);
    dsv4_chat_parsed_free(&m);
    free(text);
}

Test(chat_parse, readme_case2_final_turn) {
    char *text = assistant_text(2, -1);
    dsv4_chat_parsed m = parse(text, DSV4_CHAT_THINKING);
    cr_assert_str_eq(m.reasoning_content, "The user asks about the capital of France. It is Paris.");
    cr_assert_str_eq(m.content, "The capital of France is Paris.");
    cr_assert_eq(m.n_tool_calls, 0);
    cr_assert_eq(m.flags, DSV4_PARSE_EOS);
    check_stream_all(text, 1);
    dsv4_chat_parsed_free(&m);
    free(text);
}

Test(chat_parse, vectors_assistant_turns) {
    /* every thinking-mode assistant turn of vectors 1-3 parses and streams consistently */
    for (int k = 1; k <= 3; k++)
        for (int t = 0; t < 3; t++) {
            char path[512];
            snprintf(path, sizeof path, "%s/encoding/test_output_%d.txt", dsv4_test_fixtures(), k);
            size_t n;
            char *s = slurp(path, &n);
            const char *p = s;
            int found = 0;
            for (int i = 0; (p = strstr(p, AST "<think>")); p++, i++)
                if (i == t) {
                    found = 1;
                    break;
                }
            free(s);
            if (!found) continue;
            char *text = assistant_text(k, t);
            check_stream_all(text, 1);
            free(text);
        }
    /* vector 3's tool call with Chinese text */
    char *text = assistant_text(3, 0);
    dsv4_chat_parsed m = parse(text, DSV4_CHAT_THINKING);
    cr_assert_eq(m.n_tool_calls, 1);
    cr_assert_str_eq(m.tool_calls[0].name, "search");
    cr_assert_str_eq(m.tool_calls[0].arguments, "{\"queries\": \"小柴胡冲剂 布洛芬 相互作用 一起吃\"}");
    dsv4_chat_parsed_free(&m);
    free(text);
}

Test(chat_parse, chat_mode) {
    dsv4_chat_parsed m = parse("Hello there." EOS, DSV4_CHAT_CHAT);
    cr_assert_str_eq(m.content, "Hello there.");
    cr_assert_str_eq(m.reasoning_content, "");
    cr_assert_eq(m.flags, DSV4_PARSE_EOS);
    dsv4_chat_parsed_free(&m);
    m = parse("no eos", DSV4_CHAT_CHAT);
    cr_assert_str_eq(m.content, "no eos");
    cr_assert_eq(m.flags, 0);
    dsv4_chat_parsed_free(&m);
}

Test(chat_parse, leading_think_tag_is_skipped) {
    dsv4_chat_parsed m = parse("<think>r</think>c", DSV4_CHAT_THINKING);
    cr_assert_str_eq(m.reasoning_content, "r");
    cr_assert_str_eq(m.content, "c");
    dsv4_chat_parsed_free(&m);
}

Test(chat_parse, params_string_and_json) {
    const char *text = "r</think>Let me check.\n\n<" DS "tool_calls>\n<" DS "invoke name=\"f\">\n<" DS
                       "parameter name=\"s\" string=\"true\">multi\nline \"q\"</" DS "parameter>\n<" DS
                       "parameter name=\"n\" string=\"false\">  [1,2.50, {\"a\" :true}] </" DS "parameter>\n</" DS
                       "invoke>\n<" DS "invoke name=\"g\">\n</" DS "invoke>\n</" DS "tool_calls>" EOS;
    dsv4_chat_parsed m = parse(text, DSV4_CHAT_THINKING);
    cr_assert_str_eq(m.content, "Let me check.");
    cr_assert_eq(m.n_tool_calls, 2);
    cr_assert_str_eq(m.tool_calls[0].arguments, "{\"s\": \"multi\\nline \\\"q\\\"\", \"n\": [1, 2.5, {\"a\": true}]}");
    cr_assert_str_eq(m.tool_calls[1].name, "g");
    cr_assert_str_eq(m.tool_calls[1].arguments, "{}");
    cr_assert_str_eq(m.tool_calls[1].id, "call_1");
    cr_assert_eq(m.flags, DSV4_PARSE_EOS | DSV4_PARSE_TOOL_CALLS);
    check_stream_all(text, 1);
    dsv4_chat_parsed_free(&m);
}

Test(chat_parse, never_emits_partial_markers) {
    collected c = {0};
    dsv4_err err = {{0}};
    dsv4_chat_parser *p = dsv4_chat_parser_new(DSV4_CHAT_THINKING, on_delta, &c);
    const char *steps[] = {"Hello</thi", "nk>Answer\n\n<｜DS", "ML｜tool", "_calls>\n<" DS "invoke name=\"f\">\n",
                           "</" DS "invoke>\n</" DS "tool_calls><｜end▁of", "▁sentence｜>"};
    const char *want_r[] = {"Hello", "Hello", "Hello", "Hello", "Hello", "Hello"};
    const char *want_c[] = {"", "Answer", "Answer", "Answer", "Answer", "Answer"};
    int want_calls[] = {0, 0, 0, 0, 1, 1};
    for (int i = 0; i < 6; i++) {
        cr_assert_eq(dsv4_chat_parser_feed(p, steps[i], strlen(steps[i]), &err), 0);
        cr_assert_str_eq(sbs(&c.reasoning), want_r[i], "step %d", i);
        cr_assert_str_eq(sbs(&c.content), want_c[i], "step %d", i);
        cr_assert_eq(c.n_calls, want_calls[i], "step %d", i);
    }
    cr_assert_eq(dsv4_chat_parser_finish(p, &err), 0);
    cr_assert_str_eq(sbs(&c.content), "Answer");
    cr_assert_eq(dsv4_chat_parser_result(p)->flags, DSV4_PARSE_EOS | DSV4_PARSE_TOOL_CALLS);
    dsv4_chat_parser_free(p);
    collected_free(&c);

    /* a multi-byte character split across feeds is emitted whole */
    collected d = {0};
    p = dsv4_chat_parser_new(DSV4_CHAT_CHAT, on_delta, &d);
    cr_assert_eq(dsv4_chat_parser_feed(p, "a\xE4\xB8", 3, &err), 0);
    cr_assert_str_eq(sbs(&d.content), "a");
    cr_assert_eq(dsv4_chat_parser_feed(p, "\xAD", 1, &err), 0);
    cr_assert_str_eq(sbs(&d.content), "a中");
    cr_assert_eq(dsv4_chat_parser_finish(p, &err), 0);
    dsv4_chat_parser_free(p);
    collected_free(&d);
}

Test(chat_parse, missing_think_end) {
    dsv4_chat_parsed m = parse("I was thinking and got cut o", DSV4_CHAT_THINKING);
    cr_assert_str_eq(m.reasoning_content, "I was thinking and got cut o");
    cr_assert_str_eq(m.content, "");
    cr_assert_eq(m.flags, DSV4_PARSE_NO_THINK_END);
    dsv4_chat_parsed_free(&m);
    m = parse("thinking" EOS, DSV4_CHAT_THINKING);
    cr_assert_str_eq(m.reasoning_content, "thinking");
    cr_assert_eq(m.flags, DSV4_PARSE_NO_THINK_END | DSV4_PARSE_EOS);
    dsv4_chat_parsed_free(&m);
    m = parse("partial </thi", DSV4_CHAT_THINKING); /* a held-back tail is flushed at the end */
    cr_assert_str_eq(m.reasoning_content, "partial </thi");
    dsv4_chat_parsed_free(&m);
    /* a tool block straight out of the reasoning (the reference's stop) */
    m = parse("r\n\n<" DS "tool_calls>\n<" DS "invoke name=\"f\">\n</" DS "invoke>\n</" DS "tool_calls>",
              DSV4_CHAT_THINKING);
    cr_assert_str_eq(m.reasoning_content, "r");
    cr_assert_eq(m.n_tool_calls, 1);
    cr_assert_eq(m.flags, DSV4_PARSE_NO_THINK_END | DSV4_PARSE_TOOL_CALLS);
    dsv4_chat_parsed_free(&m);
}

Test(chat_parse, unterminated_and_malformed_dsml) {
    const char *unterminated = "</think>Sure.\n\n<" DS "tool_calls>\n<" DS "invoke name=\"f\">\n<" DS
                               "parameter name=\"a\" string=\"true\">x";
    dsv4_chat_parsed m = parse(unterminated, DSV4_CHAT_THINKING);
    cr_assert_str_eq(m.content, unterminated + strlen("</think>"));
    cr_assert_eq(m.n_tool_calls, 0);
    cr_assert_eq(m.flags, DSV4_PARSE_BAD_TOOL_CALLS);
    dsv4_chat_parsed_free(&m);

    const char *with_eos = "</think>\n\n<" DS "tool_calls>\n<" DS "invoke" EOS;
    m = parse(with_eos, DSV4_CHAT_THINKING);
    cr_assert_str_eq(m.content, "\n\n<" DS "tool_calls>\n<" DS "invoke");
    cr_assert_eq(m.flags, DSV4_PARSE_BAD_TOOL_CALLS | DSV4_PARSE_EOS);
    dsv4_chat_parsed_free(&m);

    static const char *malformed[] = {
        "\n\n<" DS "tool_calls>\n<" DS "invoke nom=\"f\">\n</" DS "invoke>\n</" DS "tool_calls>",
        "\n\n<" DS "tool_calls>\n<" DS "invoke name=\"f\">\n<" DS "parameter name=\"a\" string=\"maybe\">1</" DS
        "parameter>\n</" DS "invoke>\n</" DS "tool_calls>",
        "\n\n<" DS "tool_calls>\n<" DS "invoke name=\"f\">\n<" DS "parameter name=\"a\" string=\"true\">1</" DS
        "parameter>\n<" DS "parameter name=\"a\" string=\"true\">2</" DS "parameter>\n</" DS "invoke>\n</" DS
        "tool_calls>",
        "\n\n<" DS "tool_calls>junk</" DS "tool_calls>",
        "\n\n<" DS "tool_calls>\n<" DS "invoke name=\"f\">\n</" DS "tool_calls>",
    };
    for (size_t i = 0; i < sizeof malformed / sizeof malformed[0]; i++) {
        char buf[1024];
        snprintf(buf, sizeof buf, "Answer.%s tail", malformed[i]);
        m = parse(buf, DSV4_CHAT_CHAT);
        cr_assert_str_eq(m.content, buf, "case %zu", i);
        cr_assert_eq(m.n_tool_calls, 0);
        cr_assert_eq(m.flags, DSV4_PARSE_BAD_TOOL_CALLS, "case %zu", i);
        dsv4_chat_parsed_free(&m);
        check_stream_all(buf, 1);
    }
}

Test(chat_parse, bad_param_json_kept_as_string) {
    const char *text = "\n\n<" DS "tool_calls>\n<" DS "invoke name=\"f\">\n<" DS
                       "parameter name=\"n\" string=\"false\">{oops</" DS "parameter>\n</" DS "invoke>\n</" DS
                       "tool_calls>";
    dsv4_chat_parsed m = parse(text, DSV4_CHAT_CHAT);
    cr_assert_eq(m.n_tool_calls, 1);
    cr_assert_str_eq(m.tool_calls[0].arguments, "{\"n\": \"{oops\"}");
    cr_assert_eq(m.flags, DSV4_PARSE_BAD_PARAM_JSON | DSV4_PARSE_TOOL_CALLS);
    dsv4_chat_parsed_free(&m);
}

Test(chat_parse, text_after_tool_calls_and_eos) {
    const char *text = "</think>A\n\n<" DS "tool_calls>\n<" DS "invoke name=\"f\">\n</" DS "invoke>\n</" DS
                       "tool_calls>B" EOS "junk";
    dsv4_chat_parsed m = parse(text, DSV4_CHAT_THINKING);
    cr_assert_str_eq(m.content, "AB");
    cr_assert_eq(m.n_tool_calls, 1);
    cr_assert_str_eq(m.after_eos, "junk");
    cr_assert_eq(m.flags,
                 DSV4_PARSE_EOS | DSV4_PARSE_TOOL_CALLS | DSV4_PARSE_TEXT_AFTER_TOOLS | DSV4_PARSE_TEXT_AFTER_EOS);
    dsv4_chat_parsed_free(&m);
    check_stream_all(text, 1);
    /* a bare <｜DSML｜tool_calls (no blank line before) also opens a block */
    m = parse("A<" DS "tool_calls>\n<" DS "invoke name=\"f\">\n</" DS "invoke>\n</" DS "tool_calls>", DSV4_CHAT_CHAT);
    cr_assert_str_eq(m.content, "A");
    cr_assert_eq(m.n_tool_calls, 1);
    dsv4_chat_parsed_free(&m);
}

Test(chat_parse, empty) {
    dsv4_chat_parsed m = parse("", DSV4_CHAT_THINKING);
    cr_assert_str_eq(m.reasoning_content, "");
    cr_assert_str_eq(m.content, "");
    cr_assert_eq(m.n_tool_calls, 0);
    cr_assert_eq(m.flags, DSV4_PARSE_NO_THINK_END);
    dsv4_chat_parsed_free(&m);
    m = parse("", DSV4_CHAT_CHAT);
    cr_assert_eq(m.flags, 0);
    cr_assert_str_eq(m.content, "");
    dsv4_chat_parsed_free(&m);
    m = parse(EOS, DSV4_CHAT_CHAT);
    cr_assert_eq(m.flags, DSV4_PARSE_EOS);
    dsv4_chat_parsed_free(&m);
}

/* the encoder's assistant turns parse back to what was rendered */
Test(chat_parse, round_trip_through_encoder) {
    static const char *turns[] = {
        "{\"role\":\"assistant\",\"reasoning_content\":\"think 中\",\"content\":\"answer\"}",
        "{\"role\":\"assistant\",\"reasoning_content\":\"\",\"content\":\"\"}",
        "{\"role\":\"assistant\",\"reasoning_content\":\"r\",\"content\":\"c\",\"tool_calls\":[{\"id\":\"1\","
        "\"function\":{\"name\":\"f\",\"arguments\":\"{\\\"a\\\": \\\"x\\\\ny\\\", \\\"b\\\": 2, \\\"c\\\": [1.5, "
        "{\\\"d\\\": null}], \\\"e\\\": false, \\\"s\\\": \\\"<tag> & ｜\\\"}\"}},{\"id\":\"2\",\"function\":{\"name\":"
        "\"g\",\"arguments\":\"{}\"}}]}",
        "{\"role\":\"assistant\",\"content\":\"\",\"tool_calls\":[{\"function\":{\"name\":\"h\",\"arguments\":"
        "\"{\\\"q\\\": \\\"1e5\\\", \\\"n\\\": 1e5}\"}}]}",
    };
    for (size_t i = 0; i < sizeof turns / sizeof turns[0]; i++) {
        char json[2048];
        /* tools on the system message keep the reasoning (drop off) */
        snprintf(json, sizeof json, "[{\"role\":\"system\",\"content\":\"s\",\"tools\":[%s]},{\"role\":\"user\","
                                    "\"content\":\"u\"},%s]",
                 weather_tool, turns[i]);
        char *prompt = render(json, opts(DSV4_CHAT_THINKING));
        const char *start = strstr(prompt, AST "<think>");
        cr_assert(start);
        start += strlen(AST "<think>");
        dsv4_chat_parsed m = parse(start, DSV4_CHAT_THINKING);
        cr_assert_eq(m.flags & ~(unsigned)DSV4_PARSE_TOOL_CALLS, DSV4_PARSE_EOS, "turn %zu flags %u", i, m.flags);
        cr_assert_str_eq(m.after_eos, "");

        cJSON *root = dsv4_pyjson_parse(json, strlen(json), NULL);
        const cJSON *msg = cJSON_GetArrayItem(root, 2);
        const cJSON *rc = cJSON_GetObjectItem(msg, "reasoning_content"), *c = cJSON_GetObjectItem(msg, "content");
        cr_assert_str_eq(m.reasoning_content, rc ? rc->valuestring : "");
        cr_assert_str_eq(m.content, c ? c->valuestring : "");
        const cJSON *tcs = cJSON_GetObjectItem(msg, "tool_calls");
        cr_assert_eq(m.n_tool_calls, cJSON_GetArraySize(tcs));
        for (int k = 0; k < m.n_tool_calls; k++) {
            const cJSON *fn = cJSON_GetObjectItem(cJSON_GetArrayItem(tcs, k), "function");
            cr_assert_str_eq(m.tool_calls[k].name, cJSON_GetObjectItem(fn, "name")->valuestring);
            /* the arguments come back in json.dumps form */
            const char *a = cJSON_GetObjectItem(fn, "arguments")->valuestring;
            char *canon = dumps(a);
            cr_assert_str_eq(m.tool_calls[k].arguments, canon);
            free(canon);
        }
        check_stream_all(start, 1);
        cJSON_Delete(root);
        dsv4_chat_parsed_free(&m);
        free(prompt);
    }
}

/* random mixtures of markers, marker fragments, text and split UTF-8: streaming == one-shot, lossless */
Test(chat_parse, stream_equals_oneshot_random) {
    static const char *atoms[] = {
        "a", "Hello ", "中文", "😀", "\n", "\n\n", "<", "</", "<think>", "</think>", "</thi", "nk>", "<｜", "｜",
        "<" DS "tool_calls>", "\n\n<" DS "tool_calls>\n", "<" DS "invoke name=\"f\">\n", "</" DS "invoke>\n",
        "<" DS "parameter name=\"k\" string=\"true\">", "<" DS "parameter name=\"n\" string=\"false\">",
        "</" DS "parameter>\n", "</" DS "tool_calls>", "</" DS "tool_calls", EOS, "<｜end▁of", "▁sentence｜>", "<" DS,
        "[1, 2]", "{bad", " ",
    };
    const int n_atoms = (int)(sizeof atoms / sizeof atoms[0]);
    uint64_t s = 0x9E3779B97F4A7C15ull;
    for (int t = 0; t < 400; t++) {
        char buf[4096];
        size_t n = 0;
        int len = 1 + (int)((s >> 33) % 24);
        for (int i = 0; i < len; i++) {
            s = s * 6364136223846793005ull + 1442695040888963407ull;
            const char *a = atoms[(s >> 33) % (uint64_t)n_atoms];
            size_t l = strlen(a);
            if (n + l >= sizeof buf) break;
            memcpy(buf + n, a, l);
            n += l;
        }
        buf[n] = 0;
        for (int m = 0; m < 2; m++)
            for (size_t chunk = 1; chunk <= 4; chunk += 3)
                check_stream(buf, n, m ? DSV4_CHAT_CHAT : DSV4_CHAT_THINKING, chunk, 1);
        s = s * 6364136223846793005ull + 1442695040888963407ull;
    }
}

Test(chat_parse, invalid_utf8_passes_through) {
    const char text[] = "r\xFF</think>c\xE4\xB8"; /* ends in half a character */
    dsv4_chat_parsed m = parse(text, DSV4_CHAT_THINKING);
    cr_assert_str_eq(m.reasoning_content, "r\xFF");
    cr_assert_str_eq(m.content, "c\xE4\xB8");
    dsv4_chat_parsed_free(&m);
    check_stream_all(text, 0);
}
