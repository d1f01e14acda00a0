"""End-to-end tests of `dsv4 serve` on the CPU backend with a small synthetic model: the official openai and
anthropic Python clients, curl, raw wire formats, errors, concurrency / batch invariance, cancellation,
admission control and the SIGTERM drain."""
import concurrent.futures as cf
import json
import os
import signal
import subprocess
import threading
import time

import httpx
import pytest

from conftest import API_KEY, Server

MODEL = "dsv4-test"
HDR = {"Authorization": f"Bearer {API_KEY}"}


def post(server, path, body, headers=HDR, **kw):
    return httpx.post(server.base + path, json=body, headers=headers, timeout=120, **kw)


def sse_events(text):
    """[(event, data)] of an SSE body."""
    out = []
    for block in text.split("\n\n"):
        if not block.strip():
            continue
        ev, data = None, []
        for line in block.split("\n"):
            if line.startswith("event: "):
                ev = line[7:]
            elif line.startswith("data: "):
                data.append(line[6:])
        out.append((ev, "\n".join(data)))
    return out


def openai_client(server):
    openai = pytest.importorskip("openai")
    return openai.OpenAI(base_url=server.base + "/v1", api_key=API_KEY, max_retries=0, timeout=120)


def chat_body(seed, content="Hello there", max_tokens=8, **kw):
    return {"model": MODEL, "messages": [{"role": "user", "content": content}], "max_tokens": max_tokens,
            "seed": seed, **kw}


def stream_chat_text(server, body):
    """Streams a chat completion with httpx; returns (reasoning, content, finish_reason, usage)."""
    reasoning, content, finish, usage = "", "", None, None
    with httpx.stream("POST", server.base + "/v1/chat/completions", json={**body, "stream": True,
                      "stream_options": {"include_usage": True}}, headers=HDR, timeout=300) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        done = False
        for line in r.iter_lines():
            if not line.startswith("data: "):
                continue
            if line == "data: [DONE]":
                done = True
                continue
            assert not done, "data after [DONE]"
            j = json.loads(line[6:])
            if j.get("usage"):
                usage = j["usage"]
            for ch in j["choices"]:
                d = ch["delta"]
                reasoning += d.get("reasoning_content") or ""
                content += d.get("content") or ""
                if ch.get("finish_reason"):
                    finish = ch["finish_reason"]
        assert done
    return reasoning, content, finish, usage


# ---- basics -------------------------------------------------------------------------------------------


def test_health_models_metrics(server):
    r = httpx.get(server.base + "/health", headers=HDR)
    assert r.status_code == 200 and r.json()["status"] == "ok"
    r = httpx.get(server.base + "/v1/models", headers=HDR)
    assert r.status_code == 200
    assert [m["id"] for m in r.json()["data"]] == [MODEL]
    assert httpx.get(server.base + "/v1/models/" + MODEL, headers=HDR).status_code == 200
    assert httpx.get(server.base + "/v1/models/nope", headers=HDR).status_code == 404
    r = httpx.get(server.base + "/metrics", headers=HDR)
    assert r.status_code == 200
    for name in ["dsv4_requests_total", "dsv4_time_to_first_token_seconds_bucket",
                 "dsv4_time_per_output_token_seconds_bucket", "dsv4_num_requests_running",
                 "dsv4_num_requests_waiting", "dsv4_kv_cache_usage_ratio", "dsv4_generation_tokens_total"]:
        assert name in r.text


def test_auth(server):
    assert httpx.get(server.base + "/v1/models").status_code == 401
    r = httpx.get(server.base + "/v1/models", headers={"Authorization": "Bearer wrong"})
    assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error"
    assert httpx.get(server.base + "/v1/models", headers={"x-api-key": API_KEY}).status_code == 200
    r = httpx.post(server.base + "/v1/messages", json={}, headers={"x-api-key": "bad"})
    assert r.status_code == 401 and r.json()["type"] == "error"
    r = httpx.post(server.base + "/v1/chat/completions", json=chat_body(1))
    assert r.status_code == 401


# ---- OpenAI chat --------------------------------------------------------------------------------------


def test_openai_chat_nonstream_and_stream(server):
    client = openai_client(server)
    r = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Hi"}], max_tokens=8,
                                       seed=7, temperature=0.8)
    assert r.object == "chat.completion"
    assert r.choices[0].finish_reason in ("length", "stop")
    assert r.usage.completion_tokens <= 8 and r.usage.prompt_tokens > 0
    text = r.choices[0].message.content
    # the same seeded request streamed gives the same text
    chunks = list(client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Hi"}],
                                                 max_tokens=8, seed=7, temperature=0.8, stream=True,
                                                 stream_options={"include_usage": True}))
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert streamed == text
    assert chunks[-1].usage.completion_tokens == r.usage.completion_tokens
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == r.choices[0].finish_reason


def test_reasoning_split(server):
    client = openai_client(server)
    r = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Think"}], max_tokens=6,
                                       seed=3, reasoning_effort="high")
    msg = r.choices[0].message
    reasoning = getattr(msg, "reasoning_content", None) or (msg.model_extra or {}).get("reasoning_content")
    assert reasoning  # a random model never closes </think>: everything is reasoning
    # streamed: reasoning_content deltas, same text
    rs, cs, fin, usage = stream_chat_text(server, chat_body(3, "Think", 6, reasoning_effort="high"))
    assert rs == reasoning and cs == (msg.content or "")
    # "max" and chat_template_kwargs work too; thinking off gives no reasoning
    for extra in [{"reasoning_effort": "max"}, {"chat_template_kwargs": {"thinking": True}}]:
        j = post(server, "/v1/chat/completions", chat_body(3, "Think", 3, **extra)).json()
        assert "reasoning_content" in j["choices"][0]["message"]
    j = post(server, "/v1/chat/completions", chat_body(3, "Think", 3, chat_template_kwargs={"thinking": False})).json()
    assert "reasoning_content" not in j["choices"][0]["message"]
    # max effort renders a longer prompt than high
    a = post(server, "/v1/chat/completions", chat_body(3, "Think", 1, reasoning_effort="max")).json()
    b = post(server, "/v1/chat/completions", chat_body(3, "Think", 1, reasoning_effort="high")).json()
    assert a["usage"]["prompt_tokens"] > b["usage"]["prompt_tokens"]


TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather of a city",
                                           "parameters": {"type": "object", "properties": {
                                               "city": {"type": "string"}}, "required": ["city"]}}}]


def test_tools_round_trip(server):
    client = openai_client(server)
    msgs = [{"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": "call_1", "type": "function", "function": {"name": "get_weather",
                                                                  "arguments": "{\"city\": \"Paris\"}"}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": "{\"temp\": 21}"}]
    r = client.chat.completions.create(model=MODEL, messages=msgs, tools=TOOLS, tool_choice="auto", max_tokens=4,
                                       seed=5)
    assert r.choices[0].finish_reason in ("length", "stop", "tool_calls")
    with_tools = r.usage.prompt_tokens
    r = client.chat.completions.create(model=MODEL, messages=msgs, tools=TOOLS, tool_choice="none", max_tokens=1,
                                       seed=5)
    assert r.usage.prompt_tokens < with_tools  # tool_choice none leaves the tool list out
    chunks = list(client.chat.completions.create(model=MODEL, messages=msgs, tools=TOOLS, max_tokens=4, seed=5,
                                                 stream=True))
    assert chunks[-1].choices[0].finish_reason is not None
    # a tool message without a preceding tool call is a 400
    r = post(server, "/v1/chat/completions", {"model": MODEL, "max_tokens": 1,
                                              "messages": [{"role": "tool", "tool_call_id": "x", "content": "1"}]})
    assert r.status_code == 400


def _tool_call_or_dsml(msg, name):
    """The answer opens a call of `name`: parsed (a trained model completes it) or, with random weights,
    the raw DSML opening kept in the content by the parser's fallback."""
    calls = msg.get("tool_calls") or []
    if calls:
        return calls[0]["function"]["name"] == name
    return f'<\uff5cDSML\uff5cinvoke name="{name}">' in (msg.get("content") or "")


def test_tool_choice_forces_a_call(server):
    named = {"type": "function", "function": {"name": "get_weather"}}
    r = post(server, "/v1/chat/completions", chat_body(9, "Weather?", 40, tools=TOOLS, tool_choice=named))
    assert r.status_code == 200
    assert _tool_call_or_dsml(r.json()["choices"][0]["message"], "get_weather")
    r = post(server, "/v1/chat/completions", chat_body(9, "Weather?", 40, tools=TOOLS, tool_choice="required"))
    assert r.status_code == 200
    m = r.json()["choices"][0]["message"]
    assert m.get("tool_calls") or '<\uff5cDSML\uff5cinvoke name="' in (m.get("content") or "")
    # a function that is not offered, or required without tools: 400
    bad = {"type": "function", "function": {"name": "nope"}}
    assert post(server, "/v1/chat/completions", chat_body(9, "x", 4, tools=TOOLS, tool_choice=bad)).status_code == 400
    assert post(server, "/v1/chat/completions", chat_body(9, "x", 4, tool_choice="required")).status_code == 400
    # Anthropic: tool_choice {"type": "tool", "name": ...}
    r = post(server, "/v1/messages", {"model": MODEL, "max_tokens": 40,
                                      "messages": [{"role": "user", "content": "Weather?"}],
                                      "tools": [{"name": "get_weather", "input_schema": {"type": "object"}}],
                                      "tool_choice": {"type": "tool", "name": "get_weather"}},
             headers={**HDR, "anthropic-version": "2023-06-01"})
    assert r.status_code == 200
    blocks = r.json()["content"]
    assert any(b["type"] == "tool_use" and b["name"] == "get_weather" for b in blocks) or \
        any(b["type"] == "text" and 'invoke name="get_weather"' in b["text"] for b in blocks)


def test_stop_string_and_response_format(server):
    full = post(server, "/v1/chat/completions", chat_body(11, "Stop test", 12, temperature=0.7)).json()
    text = full["choices"][0]["message"]["content"]
    if len(text) >= 6:
        stop = text[len(text) // 2:len(text) // 2 + 3]
        cut = text[:text.index(stop)]
        r = post(server, "/v1/chat/completions", chat_body(11, "Stop test", 12, temperature=0.7, stop=[stop])).json()
        assert r["choices"][0]["message"]["content"] == cut
        assert r["choices"][0]["finish_reason"] == "stop"
    r = post(server, "/v1/chat/completions", chat_body(1, "json", 2, response_format={"type": "json_object"}))
    assert r.status_code == 200
    r = post(server, "/v1/chat/completions", chat_body(1, "json", 2, response_format={"type": "yaml"}))
    assert r.status_code == 400


def test_logprobs(server):
    client = openai_client(server)
    r = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "lp"}], max_tokens=4,
                                       seed=2, logprobs=True, top_logprobs=3)
    lps = r.choices[0].logprobs.content
    assert len(lps) == r.usage.completion_tokens
    for t in lps:
        assert t.logprob <= 0 and len(t.top_logprobs) == 3
        assert t.top_logprobs[0].logprob >= t.top_logprobs[1].logprob >= t.top_logprobs[2].logprob
    r = client.completions.create(model=MODEL, prompt="Hello", max_tokens=3, seed=2, logprobs=2)
    assert len(r.choices[0].logprobs.tokens) == 3


def test_completions(server):
    client = openai_client(server)
    r = client.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=8, seed=9)
    assert r.object == "text_completion" and r.usage.completion_tokens <= 8
    s = list(client.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=8, seed=9, stream=True))
    assert "".join(c.choices[0].text for c in s) == r.choices[0].text
    # token-id prompts
    r2 = post(server, "/v1/completions", {"model": MODEL, "prompt": [0, 100, 200], "max_tokens": 2, "seed": 1})
    assert r2.status_code == 200 and r2.json()["usage"]["prompt_tokens"] == 3


# ---- Anthropic -------------------------------------------------------------------------------------------


def anth_body(seed=4, max_tokens=6, **kw):
    return {"model": MODEL, "max_tokens": max_tokens, "seed": seed, "system": "You are terse.",
            "messages": [{"role": "user", "content": [{"type": "text", "text": "Hello"}]}], **kw}


def test_anthropic_wire(server):
    r = post(server, "/v1/messages", anth_body(), headers={"x-api-key": API_KEY, "anthropic-version": "2023-06-01"})
    assert r.status_code == 200
    j = r.json()
    assert j["type"] == "message" and j["role"] == "assistant"
    assert j["stop_reason"] in ("max_tokens", "end_turn")
    assert j["usage"]["output_tokens"] <= 6
    text = "".join(b["text"] for b in j["content"] if b["type"] == "text")
    r = post(server, "/v1/messages", {**anth_body(), "stream": True}, headers={"x-api-key": API_KEY})
    ev = sse_events(r.text)
    names = [e for e, _ in ev]
    assert names[0] == "message_start" and names[-1] == "message_stop" and names[-2] == "message_delta"
    for e, d in ev:
        assert json.loads(d)["type"] == e
    streamed = "".join(json.loads(d)["delta"].get("text", "") for e, d in ev if e == "content_block_delta")
    assert streamed == text
    # thinking blocks
    j = post(server, "/v1/messages", anth_body(thinking={"type": "enabled", "budget_tokens": 1024})).json()
    assert j["content"][0]["type"] == "thinking" and j["content"][0]["thinking"]
    r = post(server, "/v1/messages", {**anth_body(thinking={"type": "enabled", "budget_tokens": 1024}),
                                      "stream": True})
    ev = sse_events(r.text)
    starts = [json.loads(d)["content_block"]["type"] for e, d in ev if e == "content_block_start"]
    assert starts[0] == "thinking"
    # tools / tool_use / tool_result round trip
    body = anth_body(tools=[{"name": "get_weather", "description": "w", "input_schema": {
        "type": "object", "properties": {"city": {"type": "string"}}}}])
    body["messages"] = [{"role": "user", "content": "Weather?"},
                        {"role": "assistant", "content": [{"type": "text", "text": "Checking."},
                                                          {"type": "tool_use", "id": "toolu_1", "name": "get_weather",
                                                           "input": {"city": "Paris"}}]},
                        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1",
                                                      "content": "21C"}]}]
    r = post(server, "/v1/messages", body)
    assert r.status_code == 200, r.text
    # errors in Anthropic form
    r = post(server, "/v1/messages", {"model": MODEL, "messages": [{"role": "user", "content": "x"}]})
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"
    r = post(server, "/v1/messages", {**anth_body(), "model": "claude-nope"})
    assert r.status_code == 404 and r.json()["error"]["type"] == "not_found_error"


def test_anthropic_count_tokens(server):
    """POST /v1/messages/count_tokens: the input_tokens a Messages request with the same body reports (no max_tokens
    needed, not refused past the context), Anthropic-style errors."""
    body = {"model": MODEL, "system": "Be brief.", "messages": [{"role": "user", "content": "Count me, please."}],
            "tools": [{"name": "f", "description": "d", "input_schema": {"type": "object"}}]}
    c = post(server, "/v1/messages/count_tokens", body)
    assert c.status_code == 200, c.text
    m = post(server, "/v1/messages", {**body, "max_tokens": 1}).json()
    assert c.json() == {"input_tokens": m["usage"]["input_tokens"]}
    anthropic = pytest.importorskip("anthropic")
    client = anthropic.Anthropic(base_url=server.base, api_key=API_KEY, max_retries=0)
    assert client.messages.count_tokens(**body).input_tokens == c.json()["input_tokens"]
    long = post(server, "/v1/messages/count_tokens", {"model": MODEL, "messages": [
        {"role": "user", "content": "word " * 1500}]}).json()
    assert long["input_tokens"] > 1024
    r = post(server, "/v1/messages/count_tokens", {"model": MODEL, "messages": "x"})
    assert r.status_code == 400 and r.json()["type"] == "error"


def test_anthropic_client(server):
    anthropic = pytest.importorskip("anthropic")
    client = anthropic.Anthropic(base_url=server.base, api_key=API_KEY, max_retries=0, timeout=120)
    m = client.messages.create(model=MODEL, max_tokens=5, messages=[{"role": "user", "content": "Hi"}],
                               extra_body={"seed": 8})
    assert m.role == "assistant" and m.usage.output_tokens <= 5
    text = "".join(b.text for b in m.content if b.type == "text")
    with client.messages.stream(model=MODEL, max_tokens=5, messages=[{"role": "user", "content": "Hi"}],
                                extra_body={"seed": 8}) as s:
        streamed = "".join(s.text_stream)
        final = s.get_final_message()
    assert streamed == text and final.stop_reason == m.stop_reason


# ---- curl ------------------------------------------------------------------------------------------------


def curl(server, path, body=None, stream=False):
    cmd = ["curl", "-sS", "-H", f"Authorization: Bearer {API_KEY}", "-w", "\n%{http_code}"]
    if stream:
        cmd.append("-N")
    if body is not None:
        cmd += ["-H", "Content-Type: application/json", "-d", json.dumps(body)]
    out = subprocess.run(cmd + [server.base + path], capture_output=True, text=True, timeout=120).stdout
    text, code = out.rsplit("\n", 1)
    return int(code), text


def test_curl_every_endpoint(server):
    for path in ["/health", "/v1/models", "/metrics"]:
        code, _ = curl(server, path)
        assert code == 200
    code, t = curl(server, "/v1/chat/completions", chat_body(1, max_tokens=3))
    assert code == 200 and json.loads(t)["object"] == "chat.completion"
    code, t = curl(server, "/v1/chat/completions", chat_body(1, max_tokens=3, stream=True), stream=True)
    assert code == 200 and t.rstrip().endswith("data: [DONE]")
    code, t = curl(server, "/v1/completions", {"model": MODEL, "prompt": "a", "max_tokens": 3})
    assert code == 200 and json.loads(t)["object"] == "text_completion"
    code, t = curl(server, "/v1/completions", {"model": MODEL, "prompt": "a", "max_tokens": 3, "stream": True}, True)
    assert code == 200 and t.rstrip().endswith("data: [DONE]")
    code, t = curl(server, "/v1/messages", anth_body(max_tokens=3))
    assert code == 200 and json.loads(t)["type"] == "message"
    code, t = curl(server, "/v1/messages", {**anth_body(max_tokens=3), "stream": True}, True)
    assert code == 200 and "event: message_stop" in t


# ---- errors ------------------------------------------------------------------------------------------------


def test_errors(server):
    def err(path, content, status, headers=HDR):
        r = httpx.post(server.base + path, content=content, headers={**headers, "Content-Type": "application/json"},
                       timeout=60)
        assert r.status_code == status, r.text
        j = r.json()
        assert ("error" in j and "message" in j["error"]) or j.get("type") == "error"
        return j

    err("/v1/chat/completions", b"{not json", 400)
    err("/v1/chat/completions", b"[]", 400)
    err("/v1/chat/completions", json.dumps({"messages": "hi"}).encode(), 400)
    for bad in [{"temperature": -1}, {"temperature": "hot"}, {"top_p": 0}, {"n": 0}, {"n": 129}, {"n": 17}, {"max_tokens": 0},
                {"max_tokens": 1.5}, {"top_logprobs": 3}, {"stop": [1]}, {"reasoning_effort": "extreme"},
                {"tools": "x"}, {"tool_choice": "sometimes"}, {"stream": "yes"}]:
        err("/v1/chat/completions", json.dumps(chat_body(1, **bad)).encode(), 400)
    err("/v1/chat/completions", json.dumps({**chat_body(1), "messages": [{"role": "robot", "content": "x"}]}).encode(),
        400)
    err("/v1/chat/completions", json.dumps(chat_body(1, model="gpt-4")).encode(), 404)
    err("/v1/completions", json.dumps({"prompt": 5}).encode(), 400)
    err("/v1/completions", json.dumps({"prompt": "hi", "n": 2, "best_of": 3}).encode(), 400)
    err("/v1/completions", json.dumps({"prompt": [1, -2]}).encode(), 400)
    err("/v1/messages", b"{", 400)
    # body limit (server runs with --max-body 65536)
    err("/v1/chat/completions", json.dumps(chat_body(1, content="x" * 100000)).encode(), 413)
    # prompt beyond the context (--max-context 1024)
    j = err("/v1/chat/completions", json.dumps(chat_body(1, content=" hello" * 1500)).encode(), 400)
    assert "context" in j["error"]["message"]
    r = httpx.get(server.base + "/nope", headers=HDR)
    assert r.status_code == 404
    r = httpx.get(server.base + "/v1/chat/completions", headers=HDR)
    assert r.status_code == 405
    # the server is still fine
    assert post(server, "/v1/chat/completions", chat_body(1, max_tokens=1)).status_code == 200


# ---- batching ------------------------------------------------------------------------------------------------


def test_concurrent_streams_match_solo(server):
    n = int(os.environ.get("DSV4_SERVER_CONC", "16"))
    toks = int(os.environ.get("DSV4_SERVER_TOKENS", "24"))
    bodies = [chat_body(1000 + i, f"Client {i} says hello" + " again" * (i % 5), toks, temperature=0.9,
                        ignore_eos=True) for i in range(n)]
    # a few of them alone first (all of them when the set is small)
    solo_idx = list(range(n)) if n <= 16 else list(range(0, n, max(1, n // 16)))
    solo = {i: stream_chat_text(server, bodies[i]) for i in solo_idx}
    with cf.ThreadPoolExecutor(n) as ex:
        results = list(ex.map(lambda b: stream_chat_text(server, b), bodies))
    for i, (rs, cs, fin, usage) in enumerate(results):
        assert usage["completion_tokens"] == toks, i
        assert fin == "length"
        if i in solo:
            assert (rs, cs) == solo[i][:2], f"client {i}: concurrent stream differs from the same request alone"
    m = httpx.get(server.base + "/metrics", headers=HDR).text
    assert "dsv4_num_requests_running 0" in m


def test_n_choices(server):
    """n > 1: the prompt fed once, each choice a copy of its state with seed + index; choice i is the text of the
    same request alone with seed + i (OpenAI's and vLLM's n), in bodies, streams (index per chunk, one usage, one
    [DONE]) and completions with logprobs."""
    body = chat_body(21, "Tell me three things about the sea", 10, temperature=1.0, ignore_eos=True)
    r = post(server, "/v1/chat/completions", {**body, "n": 3})
    assert r.status_code == 200, r.text
    j = r.json()
    assert [c["index"] for c in j["choices"]] == [0, 1, 2]
    texts = [c["message"]["content"] for c in j["choices"]]
    alone = [post(server, "/v1/chat/completions", {**body, "seed": 21 + i}).json() for i in range(3)]
    assert texts == [a["choices"][0]["message"]["content"] for a in alone]
    assert len(set(texts)) > 1
    assert j["usage"]["prompt_tokens"] == alone[0]["usage"]["prompt_tokens"]
    assert j["usage"]["completion_tokens"] == 30
    # streamed: every chunk names its choice; one usage chunk and one [DONE] after all of them
    acc, usage, dones, finishes = {}, [], 0, {}
    with httpx.stream("POST", server.base + "/v1/chat/completions", json={**body, "n": 3, "stream": True,
                      "stream_options": {"include_usage": True}}, headers=HDR, timeout=300) as s:
        assert s.status_code == 200
        for line in s.iter_lines():
            if not line.startswith("data: "):
                continue
            if line == "data: [DONE]":
                dones += 1
                continue
            assert dones == 0, "data after [DONE]"
            c = json.loads(line[6:])
            if c.get("usage"):
                assert not c["choices"]
                usage.append(c["usage"])
            for ch in c["choices"]:
                acc[ch["index"]] = acc.get(ch["index"], "") + (ch["delta"].get("content") or "")
                if ch.get("finish_reason"):
                    finishes[ch["index"]] = ch["finish_reason"]
    assert dones == 1 and len(usage) == 1 and usage[0]["completion_tokens"] == 30
    assert [acc[i] for i in range(3)] == texts
    assert finishes == {0: "length", 1: "length", 2: "length"}
    # completions (a one-token prompt: nothing to share), best_of = n, logprobs per choice
    cb = {"model": MODEL, "prompt": [7], "max_tokens": 5, "seed": 5, "temperature": 1.0, "ignore_eos": True}
    c = post(server, "/v1/completions", {**cb, "n": 2, "best_of": 2, "logprobs": 1}).json()
    assert [x["index"] for x in c["choices"]] == [0, 1]
    for i in range(2):
        a = post(server, "/v1/completions", {**cb, "seed": 5 + i}).json()
        assert c["choices"][i]["text"] == a["choices"][0]["text"]
        assert len(c["choices"][i]["logprobs"]["tokens"]) == 5
    # the official client
    client = openai_client(server)
    out = client.chat.completions.create(model=MODEL, messages=body["messages"], max_tokens=10, seed=21, n=2,
                                         temperature=1.0, extra_body={"ignore_eos": True})
    assert [ch.message.content for ch in out.choices] == texts[:2]
    m = httpx.get(server.base + "/metrics", headers=HDR).text
    assert "dsv4_num_requests_running 0" in m


def test_logit_bias(server):
    """OpenAI's logit_bias: +100 on a token makes greedy decoding repeat it; -100 takes a token out."""
    cb = {"model": MODEL, "prompt": [11, 12, 13], "max_tokens": 3, "temperature": 0, "ignore_eos": True, "logprobs": 0}
    forced = post(server, "/v1/completions", {**cb, "logit_bias": {"42": 100}}).json()["choices"][0]
    toks = forced["logprobs"]["tokens"]
    assert len(toks) == 3 and len(set(toks)) == 1 and forced["text"] == toks[0] * 3
    r = post(server, "/v1/completions", {**cb, "max_tokens": 1, "logit_bias": {"42": 100}, "n": 2, "temperature": 1.0})
    assert [c["text"] for c in r.json()["choices"]] == [toks[0]] * 2
    # -100 against +100: the other token wins either way round
    one = {**cb, "max_tokens": 1}
    b77 = post(server, "/v1/completions", {**one, "logit_bias": {"77": 100}}).json()["choices"][0]["text"]
    assert b77 != toks[0]
    assert post(server, "/v1/completions", {**one, "logit_bias": {"42": 100, "77": -100}}).json()["choices"][0]["text"] == toks[0]
    assert post(server, "/v1/completions", {**one, "logit_bias": {"42": -100, "77": 100}}).json()["choices"][0]["text"] == b77
    c = post(server, "/v1/chat/completions", chat_body(1, max_tokens=2, temperature=0, logit_bias={"42": 100}))
    assert c.status_code == 200, c.text
    for bad in [{"logit_bias": [1]}, {"logit_bias": {"x": 1}}, {"logit_bias": {"5": 101}}, {"logit_bias": {"5": "a"}},
                {"logit_bias": {"-3": 1}}, {"logit_bias": {"99999999": 1}}]:
        r = post(server, "/v1/completions", {**cb, **bad})
        assert r.status_code == 400 and "logit_bias" in r.json()["error"]["message"], (bad, r.text)


def test_min_tokens_and_stop_token_ids(server, model_dir):
    """vLLM's stop_token_ids end the answer like the end-of-sequence token; min_tokens holds both off."""
    eos = json.load(open(os.path.join(model_dir, "config.json")))["eos_token_id"]
    cb = {"model": MODEL, "prompt": [11, 12, 13], "max_tokens": 8, "temperature": 0}

    def comp(**kw):
        r = post(server, "/v1/completions", {**cb, **kw})
        assert r.status_code == 200, r.text
        return r.json()["choices"][0], r.json()["usage"]["completion_tokens"]

    c, n = comp(logit_bias={"42": 100}, stop_token_ids=[42])
    assert (c["text"], c["finish_reason"], n) == ("", "stop", 1)
    c, n = comp(logit_bias={"42": 100}, stop_token_ids=[42], min_tokens=3)
    assert (c["finish_reason"], n) == ("stop", 4) and c["text"]
    c, n = comp(logit_bias={str(eos): 100})
    assert (c["finish_reason"], n) == ("stop", 1)
    c, n = comp(logit_bias={str(eos): 100}, min_tokens=2, temperature=1.0, seed=3, n=2)
    assert (c["finish_reason"], n) == ("stop", 6)  # 2 choices x (2 + the end)
    # streamed chat: the same rule
    _, content, fin, usage = stream_chat_text(server, chat_body(2, max_tokens=8, temperature=0, min_tokens=5,
                                                                logit_bias={"42": 100}, stop_token_ids=[42]))
    assert (fin, usage["completion_tokens"]) == ("stop", 6)
    for bad in [{"min_tokens": -1}, {"min_tokens": 9}, {"stop_token_ids": 5}, {"stop_token_ids": [1.5]},
                {"stop_token_ids": [99999999]}]:
        r = post(server, "/v1/completions", {**cb, **bad})
        assert r.status_code == 400, (bad, r.text)


def test_tokenize_detokenize(server):
    """vLLM's /tokenize and /detokenize: the counts a generation request reports, and the text back."""
    text = "Hello there, tokenizer: ünïcödé and 数字 123"
    t = post(server, "/tokenize", {"model": MODEL, "prompt": text}).json()
    u = post(server, "/v1/completions", {"model": MODEL, "prompt": text, "max_tokens": 1}).json()["usage"]
    assert t["count"] == len(t["tokens"]) == u["prompt_tokens"] and t["max_model_len"] == 1024
    bare = post(server, "/tokenize", {"prompt": text, "add_special_tokens": False, "return_token_strs": True}).json()
    assert bare["tokens"] == t["tokens"][1:] and len(bare["token_strs"]) == bare["count"]
    assert post(server, "/detokenize", {"tokens": bare["tokens"]}).json() == {"prompt": text}
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi!"}]
    for kw in [{}, {"reasoning_effort": "high"}]:
        c = post(server, "/tokenize", {"messages": msgs, **kw}).json()
        g = post(server, "/v1/chat/completions", {"messages": msgs, "max_tokens": 1, **kw}).json()["usage"]
        assert c["count"] == g["prompt_tokens"], kw
    long = post(server, "/tokenize", {"prompt": "word " * 1500}).json()  # counted, not refused
    assert long["count"] > long["max_model_len"]
    for path, body in [("/tokenize", {}), ("/tokenize", {"prompt": 5}), ("/tokenize", {"prompt": "a", "messages": msgs}),
                       ("/tokenize", {"prompt": "a", "model": "other"}), ("/detokenize", {"tokens": [-1]}),
                       ("/detokenize", {"tokens": "x"}), ("/detokenize", {"tokens": [1.5]})]:
        r = post(server, path, body)
        assert r.status_code in (400, 404) and r.json()["error"]["message"], (path, body, r.text)
    assert httpx.get(server.base + "/tokenize", headers=HDR).status_code == 405
    assert httpx.post(server.base + "/tokenize", json={"prompt": "x"}).status_code == 401  # the API key holds here too


def test_echo_prompt_logprobs(server):
    """Completions' echo (lm-eval-harness's loglikelihood requests): the prompt's text first and, with logprobs, every
    prompt token's logprob (the first null), equal to what a request ending just before that token reports for it;
    max_tokens 0 scores the prompt only."""
    prompt = [0, 19923, 2058, 11, 441, 344, 260, 1198, 6541]
    e = post(server, "/v1/completions", {"model": MODEL, "prompt": prompt, "max_tokens": 0, "echo": True,
                                         "logprobs": 3}).json()
    ch = e["choices"][0]
    lp = ch["logprobs"]
    assert e["usage"] == {"prompt_tokens": len(prompt), "completion_tokens": 0, "total_tokens": len(prompt)}
    assert ch["finish_reason"] == "length"
    assert ch["text"] == post(server, "/detokenize", {"tokens": prompt[1:]}).json()["prompt"]  # a leading BOS left out
    assert lp["text_offset"][:3] == [0, 0, len(lp["tokens"][1].encode())]
    assert len(lp["tokens"]) == len(prompt) and lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None
    assert lp["text_offset"][0] == 0 and all(len(t) == 3 for t in lp["top_logprobs"][1:])
    for k in (1, 4, len(prompt) - 1):
        # the raw logprob of prompt[k] after prompt[:k]: a one-token answer forced to it (logit_bias does not move raw
        # logprobs)
        g = post(server, "/v1/completions", {"model": MODEL, "prompt": prompt[:k], "max_tokens": 1, "logprobs": 0,
                                             "temperature": 0, "logit_bias": {str(prompt[k]): 100}}).json()
        gl = g["choices"][0]["logprobs"]
        assert gl["tokens"][0] == lp["tokens"][k] and gl["token_logprobs"][0] == lp["token_logprobs"][k], k
    # with generation after it, n choices, and streamed: the same prompt records first
    body = {"model": MODEL, "prompt": prompt, "max_tokens": 3, "echo": True, "logprobs": 1, "temperature": 0,
            "ignore_eos": True}
    g = post(server, "/v1/completions", {**body, "n": 2}).json()
    for c in g["choices"]:
        assert c["logprobs"]["token_logprobs"][:len(prompt)] == lp["token_logprobs"]
        assert len(c["logprobs"]["tokens"]) == len(prompt) + 3 and c["text"].startswith(ch["text"])
    text, lps = "", []
    with httpx.stream("POST", server.base + "/v1/completions", json={**body, "stream": True}, headers=HDR,
                      timeout=120) as r:
        for line in r.iter_lines():
            if line.startswith("data: {"):
                c = json.loads(line[6:])["choices"][0]
                text += c["text"]
                lps += (c["logprobs"] or {}).get("token_logprobs", [])
    assert text == g["choices"][0]["text"] and lps == g["choices"][0]["logprobs"]["token_logprobs"]
    # echo without logprobs, and the refusals
    t = post(server, "/v1/completions", {"model": MODEL, "prompt": "Hi there", "max_tokens": 0, "echo": True}).json()
    assert t["choices"][0]["text"] == "Hi there" and t["choices"][0]["logprobs"] is None  # as sent
    assert post(server, "/v1/completions", {"model": MODEL, "prompt": "Hi", "max_tokens": 0}).status_code == 400
    assert post(server, "/v1/completions", {"model": MODEL, "prompt": "Hi", "max_tokens": 0, "echo": True,
                                            "min_tokens": 1}).status_code == 400


def test_completions_prompt_list(server):
    """A list of prompts (strings or token lists): a choice set each, indices prompt x n + choice, each choice drawing
    with the request's seed + its index (what its prompt alone gives with that seed); usage counts each prompt once."""
    prompts = ["The sea is", [0, 441, 344, 260], "Once upon a time there"]
    body = {"model": MODEL, "max_tokens": 4, "seed": 8, "temperature": 1.0, "ignore_eos": True, "logprobs": 0}
    j = post(server, "/v1/completions", {**body, "prompt": prompts, "n": 2}).json()
    assert [c["index"] for c in j["choices"]] == list(range(6))
    total_prompt = 0
    for k, p in enumerate(prompts):
        a = post(server, "/v1/completions", {**body, "prompt": p, "n": 2, "seed": 8 + 2 * k}).json()
        total_prompt += a["usage"]["prompt_tokens"]
        assert [c["text"] for c in a["choices"]] == [c["text"] for c in j["choices"][2 * k:2 * k + 2]], k
    assert j["usage"] == {"prompt_tokens": total_prompt, "completion_tokens": 24, "total_tokens": total_prompt + 24}
    # streamed, with echo and a scored-only batch (lm-eval-harness's batched loglikelihood requests)
    got = {}
    with httpx.stream("POST", server.base + "/v1/completions", json={**body, "prompt": prompts, "stream": True,
                      "echo": True, "max_tokens": 0, "logprobs": 1}, headers=HDR, timeout=120) as r:
        for line in r.iter_lines():
            if line.startswith("data: {"):
                c = json.loads(line[6:])["choices"][0]
                got.setdefault(c["index"], []).extend((c["logprobs"] or {}).get("token_logprobs", []))
    for k, p in enumerate(prompts):
        a = post(server, "/v1/completions", {"model": MODEL, "prompt": p, "echo": True, "max_tokens": 0,
                                             "logprobs": 1}).json()
        assert got[k] == a["choices"][0]["logprobs"]["token_logprobs"], k
    for bad in [[], ["a", 5], ["a", []], ["a", [1, -1]], ["a", "word " * 1500]]:
        r = post(server, "/v1/completions", {**body, "prompt": bad})
        assert r.status_code == 400 and "prompt" in r.json()["error"]["message"], (bad, r.text)
    r = post(server, "/v1/completions", {**body, "prompt": ["a"] * 300})  # more sequences than the queue takes
    assert r.status_code == 400 and "queue" in r.json()["error"]["message"]
    twice = post(server, "/v1/completions", {**body, "prompt": ["Once upon", "Once upon"]}).json()["choices"]
    assert twice[0]["text"] != twice[1]["text"]  # the same prompt twice: two samples (seeds differ by the index)
    r = post(server, "/v1/completions", {**body, "prompt": ["a"] * 130, "n": 2})
    assert r.status_code == 400 and "queue" in r.json()["error"]["message"]


def test_responses_api(server, model_dir):
    """OpenAI's Responses API (stateless): input items become the chat prompt (the same tokens as the equivalent chat
    request), the official client reads the response and its stream, and what it cannot do is a clear 400 / 404."""
    eos = json.load(open(os.path.join(model_dir, "config.json")))["eos_token_id"]
    client = openai_client(server)
    tools = [{"type": "function", "name": "get_weather", "description": "Weather of a city",
              "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}]
    chat_tools = [{"type": "function", "function": {k: v for k, v in t.items() if k != "type"}} for t in tools]
    items = [{"role": "user", "content": [{"type": "input_text", "text": "Weather in Paris?"}]},
             {"type": "reasoning", "id": "rs_1", "summary": [], "content": [{"type": "reasoning_text", "text": "Ask."}]},
             {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": "{\"city\": \"Paris\"}"},
             {"type": "function_call_output", "call_id": "call_1", "output": "{\"temp\": 21}"},
             {"role": "assistant", "content": [{"type": "output_text", "text": "It is 21."}]},
             {"role": "user", "content": "And tomorrow?"}]
    msgs = [{"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": "", "reasoning_content": "Ask.", "tool_calls": [
                {"id": "call_1", "type": "function", "function": {"name": "get_weather",
                                                                  "arguments": "{\"city\": \"Paris\"}"}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": "{\"temp\": 21}"},
            {"role": "assistant", "content": "It is 21."},
            {"role": "user", "content": "And tomorrow?"}]
    stop_early = {"logit_bias": {str(eos): 100}, "min_tokens": 3}  # a completed answer from the random model
    for effort in ["none", "high"]:
        r = client.responses.create(model=MODEL, instructions="Be brief.", input=items, tools=tools, max_output_tokens=8,
                                    temperature=0, reasoning={"effort": effort}, extra_body=stop_early)
        c = post(server, "/v1/chat/completions", {"model": MODEL, "messages": msgs, "tools": chat_tools, "max_tokens": 8,
                                                  "temperature": 0, "reasoning_effort": effort, **stop_early}).json()
        assert r.usage.input_tokens == c["usage"]["prompt_tokens"], effort
        assert r.status == "completed" and r.usage.output_tokens == c["usage"]["completion_tokens"] == 4
        assert r.output_text == c["choices"][0]["message"]["content"]
        assert [o.type for o in r.output] == (["message"] if effort == "none" else ["reasoning", "message"])
        assert r.id.startswith("resp_") and r.object == "response" and r.tools[0].name == "get_weather"
    # streamed: numbered events, the final response the same as the body
    body = dict(model=MODEL, input="Tell me a joke", max_output_tokens=12, temperature=0, extra_body=stop_early)
    whole = client.responses.create(**body)
    with client.responses.stream(**body) as s:
        events = list(s)
        final = s.get_final_response()
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert events[0].type == "response.created" and events[-1].type == "response.completed"
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == whole.output_text
    assert final.output_text == whole.output_text and final.output[0].id == events[2].item.id
    # max_output_tokens reached: incomplete
    r = client.responses.create(model=MODEL, input="hi", max_output_tokens=2, temperature=0.5,
                                extra_body={"ignore_eos": True})
    assert r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens"
    assert r.output[-1].status == "incomplete"
    evs = list(client.responses.create(model=MODEL, input="hi", max_output_tokens=2, temperature=0.5, stream=True,
                                       extra_body={"ignore_eos": True}))
    assert evs[-1].type == "response.incomplete" and evs[-1].response.output[-1].status == "incomplete"
    assert [e.type for e in evs].count("response.output_item.done") == len(evs[-1].response.output)
    # text.format and tool_choice are taken; what is not supported is refused
    r = post(server, "/v1/responses", {"model": MODEL, "input": "hi", "max_output_tokens": 2, "text": {"format": {
        "type": "json_schema", "name": "x", "schema": {"type": "object"}}}, "tools": tools, "tool_choice": "required"})
    assert r.status_code == 200 and r.json()["text"]["format"]["type"] == "json_schema", r.text
    for bad, word in [({"previous_response_id": "resp_1"}, "previous_response_id"),
                      ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]}, "input_image"),
                      ({"input": [{"type": "item_reference", "id": "x"}]}, "item_reference"),
                      ({"tools": [{"name": "x"}]}, "tools[0]"), ({"max_output_tokens": 0}, "max_output_tokens"),
                      ({"background": True}, "background"),
                      ({"reasoning": {"effort": "huge"}}, "reasoning.effort"), ({"input": []}, "input")]:
        r = post(server, "/v1/responses", {"model": MODEL, "input": "hi", **bad})
        assert r.status_code == 400 and word in r.json()["error"]["message"], (bad, r.text)
    assert httpx.get(server.base + "/v1/responses/resp_1", headers=HDR).status_code == 404
    # OpenAI's developer role is instructions: leading developer / system items join them in the system message
    # (the same prompt as one system message); hosted tools are left out (the same prompt as without them)
    one = post(server, "/v1/responses", {"model": MODEL, "max_output_tokens": 1, "instructions": "A.\n\nB.",
                                          "input": [{"role": "user", "content": "hi"}]}).json()
    two = post(server, "/v1/responses", {"model": MODEL, "max_output_tokens": 1, "instructions": "A.", "input": [
        {"role": "developer", "content": "B."}, {"role": "user", "content": "hi"}],
        "tools": [{"type": "web_search"}]}).json()
    assert one["usage"]["input_tokens"] == two["usage"]["input_tokens"]
    r = client.responses.create(model=MODEL, input="hi", max_output_tokens=6, reasoning={"effort": "high"},
                                extra_body=stop_early)
    rs = r.output[0]
    assert rs.type == "reasoning" and rs.summary[0].text == rs.content[0].text and rs.content[0].text


def test_n_choices_cancel(server):
    """A client that leaves a stream of n choices cancels all of them."""
    import socket
    body = json.dumps(chat_body(3, "x", 600, n=4, stream=True, ignore_eos=True)).encode()
    s = socket.create_connection(("127.0.0.1", server.port))
    s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + API_KEY.encode() +
              b"\r\nContent-Type: application/json\r\nContent-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
    assert s.recv(64).startswith(b"HTTP/1.1 200")
    s.close()
    deadline = time.time() + 30
    while time.time() < deadline:
        if "dsv4_num_requests_running 0" in httpx.get(server.base + "/metrics", headers=HDR).text:
            break
        time.sleep(0.2)
    else:
        pytest.fail("the choices of a dropped stream kept running")


def test_cancel_on_disconnect(server):
    def metric(name):
        for line in httpx.get(server.base + "/metrics", headers=HDR).text.splitlines():
            if line.startswith(name):
                return float(line.split()[-1])
        return 0.0

    before = metric('dsv4_request_finish_total{reason="abort"}')
    with httpx.stream("POST", server.base + "/v1/chat/completions",
                      json=chat_body(1, max_tokens=900, ignore_eos=True, stream=True), headers=HDR, timeout=60) as r:
        for i, _ in enumerate(r.iter_lines()):
            if i > 6:
                break
    deadline = time.time() + 20
    while time.time() < deadline and metric('dsv4_request_finish_total{reason="abort"}') == before:
        time.sleep(0.2)
    assert metric('dsv4_request_finish_total{reason="abort"}') == before + 1
    # non-streaming too
    c = httpx.Client(timeout=1.0)
    with pytest.raises(httpx.TimeoutException):
        c.post(server.base + "/v1/chat/completions", json=chat_body(2, max_tokens=900, ignore_eos=True), headers=HDR)
    c.close()
    deadline = time.time() + 20
    while time.time() < deadline and metric('dsv4_request_finish_total{reason="abort"}') < before + 2:
        time.sleep(0.2)
    assert metric('dsv4_request_finish_total{reason="abort"}') == before + 2


# ---- admission control and shutdown (their own servers) ----------------------------------------------------


def test_queue_full_503_then_sigterm_drain(model_dir):
    s = Server(model_dir, "--served-model-name", MODEL, "--max-seqs", "1", "--max-queue", "1", "--max-context", "1024", "--drain-timeout", "60")
    try:
        # one request running and one queued (long enough to still be there however fast the build is: a fixed pause
        # between the requests let a fast machine answer each before the next arrived), then two more: refused
        long_body, short_body = chat_body(1, max_tokens=600, ignore_eos=True), chat_body(2, max_tokens=8, ignore_eos=True)
        results = []

        def run(b):
            results.append(httpx.post(s.base + "/v1/chat/completions", json=b, timeout=300))

        def wait_metric(line):
            deadline = time.time() + 60
            while time.time() < deadline and line not in httpx.get(s.base + "/metrics", timeout=5).text:
                time.sleep(0.02)

        ts = [threading.Thread(target=run, args=(long_body,)) for _ in range(2)]
        ts += [threading.Thread(target=run, args=(short_body,)) for _ in range(2)]
        ts[0].start()
        wait_metric("dsv4_num_requests_running 1")
        ts[1].start()
        wait_metric("dsv4_num_requests_waiting 1")
        for t in ts[2:]:
            t.start()
        for t in ts:
            t.join()
        codes = sorted(r.status_code for r in results)
        assert 503 in codes and 200 in codes, codes
        r503 = [r for r in results if r.status_code == 503][0]
        assert r503.headers.get("retry-after") and r503.json()["error"]["message"]

        # the answered requests' slots are released just after their responses: wait until the server is
        # idle, so the two streams below fit (1 running + 1 queued) whatever the build's speed
        deadline = time.time() + 30
        while time.time() < deadline:
            m = httpx.get(s.base + "/metrics", timeout=5).text
            if "dsv4_num_requests_running 0" in m and "dsv4_num_requests_waiting 0" in m:
                break
            time.sleep(0.1)

        # SIGTERM under load: in-flight streams finish completely, the process exits 0, nobody hangs
        outs = []

        def streamer(i):
            outs.append(stream_chat_text(s, chat_body(50 + i, max_tokens=20, ignore_eos=True)))

        # no API key on this server: stream_chat_text's header is ignored
        ts = [threading.Thread(target=streamer, args=(i,)) for i in range(2)]
        ts[0].start()
        deadline = time.time() + 30  # the first one running, so the second can wait in the queue of 1
        while time.time() < deadline and "dsv4_num_requests_running 1" not in httpx.get(s.base + "/metrics",
                                                                                        timeout=5).text:
            time.sleep(0.05)
        ts[1].start()
        time.sleep(1.0)
        s.proc.send_signal(signal.SIGTERM)
        for t in ts:
            t.join(timeout=90)
            assert not t.is_alive(), "a client hangs after SIGTERM"
        assert len(outs) == 2 and all(o[3]["completion_tokens"] == 20 for o in outs)
        assert s.proc.wait(timeout=60) == 0
        with pytest.raises(httpx.TransportError):
            httpx.get(s.base + "/health", timeout=5)
    finally:
        if s.proc.poll() is None:
            s.proc.kill()


def test_sigterm_drain_timeout_cancels(model_dir):
    s = Server(model_dir, "--served-model-name", MODEL, "--max-seqs", "4", "--drain-timeout", "1", "--max-context", "2048")
    try:
        outs, errs = [], []

        def streamer(i):
            try:
                outs.append(stream_chat_text(s, chat_body(i, max_tokens=1500, ignore_eos=True)))
            except Exception as e:  # noqa: BLE001 - any end is fine as long as it ends
                errs.append(e)

        ts = [threading.Thread(target=streamer, args=(i,)) for i in range(3)]
        for t in ts:
            t.start()
        time.sleep(1.5)
        s.proc.send_signal(signal.SIGTERM)
        for t in ts:
            t.join(timeout=60)
            assert not t.is_alive(), "a client hangs after SIGTERM"
        assert s.proc.wait(timeout=60) == 0
        assert all(o[2] == "abort" for o in outs)
    finally:
        if s.proc.poll() is None:
            s.proc.kill()


# ---- prefix cache --------------------------------------------------------------------------------------------


def _metric(srv, name):
    for line in httpx.get(srv.base + "/metrics").text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise AssertionError(name + " not in /metrics")


def test_prefix_cache(model_dir):
    """--prefix-cache: a prompt that extends a kept one (a chat's next turn) starts from its state: counted in /metrics,
    and greedy text equal to a server without the cache (these prompts are short enough that the indexer's top-k takes
    every entry; sched.c says when a hit can differ: exact ties of the indexer's scores); an exact repeat or a prompt
    under 16 tokens is not served from it; the least recently used entry goes first."""
    p1 = list(range(1000, 1040))
    p2 = p1 + list(range(2000, 2012))
    p3 = p1 + list(range(3000, 3005))
    short = list(range(500, 510))
    body = lambda p: {"prompt": p, "max_tokens": 8, "temperature": 0, "ignore_eos": True}
    ref = Server(model_dir, "--max-context", "1024")
    try:
        want2 = httpx.post(ref.base + "/v1/completions", json=body(p2), timeout=120).json()["choices"][0]["text"]
        want3 = httpx.post(ref.base + "/v1/completions", json=body(p3), timeout=120).json()["choices"][0]["text"]
        assert _metric(ref, "dsv4_prefix_cache_hits_total") == 0
    finally:
        assert ref.stop() == 0
    s = Server(model_dir, "--max-context", "1024", "--prefix-cache", "2")
    try:
        assert "2 cached prompts" in "".join(s.log)
        post1 = lambda p: httpx.post(s.base + "/v1/completions", json=body(p), timeout=120)
        assert post1(p1).status_code == 200
        assert post1(p1).status_code == 200  # an exact repeat: a token must be fed, so not from the cache
        assert _metric(s, "dsv4_prefix_cache_hits_total") == 0
        r = post1(p2)
        assert r.status_code == 200 and r.json()["usage"]["prompt_tokens"] == len(p2)
        assert r.json()["usage"]["prompt_tokens_details"]["cached_tokens"] == len(p1)
        assert r.json()["choices"][0]["text"] == want2
        assert _metric(s, "dsv4_prefix_cache_hits_total") == 1
        assert _metric(s, "dsv4_prefix_cache_tokens_total") == len(p1)
        assert post1(short).status_code == 200 and post1(short + [7]).status_code == 200  # under 16 tokens: not kept
        assert _metric(s, "dsv4_prefix_cache_hits_total") == 1
        # kept now: p1 and p2 (two entries); p3 extends p1 (the longest kept prefix of it)
        r = post1(p3)
        assert r.json()["choices"][0]["text"] == want3
        assert _metric(s, "dsv4_prefix_cache_hits_total") == 2
        assert _metric(s, "dsv4_prefix_cache_tokens_total") == 2 * len(p1)
        # p3 replaced the least recently used entry (p2); p2 + more now finds p1 only
        r = post1(p2 + [42])
        assert r.status_code == 200
        assert _metric(s, "dsv4_prefix_cache_tokens_total") == 3 * len(p1)
        # echo with logprobs scores every prompt token, so it never starts from a kept state
        e = httpx.post(s.base + "/v1/completions", json={"prompt": p1 + [5, 6], "max_tokens": 0, "echo": True,
                                                         "logprobs": 1}, timeout=120).json()
        lp = e["choices"][0]["logprobs"]["token_logprobs"]
        assert len(lp) == len(p1) + 2 and lp[0] is None and all(x is not None for x in lp[1:])
        assert "prompt_tokens_details" not in e["usage"]
    finally:
        assert s.stop() == 0, "".join(s.log)


def test_prefix_cache_shared_system_prompt(model_dir):
    """Conversations that share a system prompt but not a turn: the second ends a chunk at the shared prefix and keeps
    that state, the third starts from it; greedy text equal to a server without the cache (short prompts, as above)."""
    a = list(range(1000, 1040))
    q1, q2, q3 = a + list(range(2000, 2010)), a + list(range(3000, 3010)), a + list(range(4000, 4010))
    body = lambda p: {"prompt": p, "max_tokens": 8, "temperature": 0, "ignore_eos": True}
    ref = Server(model_dir, "--max-context", "1024")
    try:
        want = [httpx.post(ref.base + "/v1/completions", json=body(q), timeout=120).json()["choices"][0]["text"]
                for q in (q2, q3)]
    finally:
        assert ref.stop() == 0
    s = Server(model_dir, "--max-context", "1024", "--prefix-cache", "4")
    try:
        post1 = lambda p: httpx.post(s.base + "/v1/completions", json=body(p), timeout=120).json()["choices"][0]["text"]
        post1(q1)
        assert post1(q2) == want[0]
        assert _metric(s, "dsv4_prefix_cache_hits_total") == 0
        assert post1(q3) == want[1]
        assert _metric(s, "dsv4_prefix_cache_hits_total") == 1
        assert _metric(s, "dsv4_prefix_cache_tokens_total") == len(a)
    finally:
        assert s.stop() == 0, "".join(s.log)


def test_prefix_cache_usage_anthropic(model_dir):
    """A chat's next turn through /v1/messages: the cached tokens reported as Anthropic does (cache_read_input_tokens,
    input_tokens the rest)."""
    s = Server(model_dir, "--max-context", "1024", "--prefix-cache", "2")
    try:
        msgs = [{"role": "user", "content": "Tell me a long story about a lighthouse keeper and the sea, please."}]
        name = httpx.get(s.base + "/v1/models").json()["data"][0]["id"]
        b = {"model": name, "max_tokens": 4, "temperature": 0, "system": "You are a careful storyteller who writes calm prose."}
        u1 = httpx.post(s.base + "/v1/messages", json={**b, "messages": msgs}, timeout=120).json()["usage"]
        assert "cache_read_input_tokens" not in u1 and u1["input_tokens"] >= 16
        msgs += [{"role": "assistant", "content": "Once upon a time."}, {"role": "user", "content": "Go on."}]
        u2 = httpx.post(s.base + "/v1/messages", json={**b, "messages": msgs}, timeout=120).json()["usage"]
        assert u2["cache_read_input_tokens"] == u1["input_tokens"] and u2["input_tokens"] > 0
    finally:
        assert s.stop() == 0, "".join(s.log)
