"""Stress run of `dsv4 serve`, meant for an AddressSanitizer build: N requests (default 5000) of every kind
- chat / completions / messages, streaming or not, invalid ones, unknown paths, clients that hang up -
from a few concurrent workers; then checks the server's RSS stopped growing, SIGTERMs it and requires
exit status 0 (LeakSanitizer makes a leaking process exit non-zero).

usage: python3 tests/server/stress.py [--bin build-asan/dsv4] [--model DIR] [-n 5000] [--workers 8]
"""
import argparse
import json
import os
import random
import socket
import subprocess
import sys
import tempfile
import threading
import time

import httpx

sys.path.insert(0, os.path.dirname(__file__))
from conftest import REPO, Server  # noqa: E402

MODEL = "dsv4-stress"


def rss_kb(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def rand_json(rng, depth):
    """A random JSON value: scalars of the kinds parsers trip on, and nested arrays / objects."""
    k = rng.randrange(10 if depth > 0 else 7)
    if k == 0:
        return None
    if k == 1:
        return rng.choice([True, False])
    if k == 2:
        return rng.choice([0, -1, 1, 2, 7, 2 ** 31, -2 ** 63, 2 ** 64, 10 ** 30])
    if k == 3:
        return rng.choice([0.5, -1e300, 1e-300, 3.0, -0.0])
    if k == 4:
        return rng.choice(["", "x", "user", "function", "input_text", "message", "auto", "none", "\u0000",
                           "<｜DSML｜tool_calls>", "a" * 3000])
    if k in (5, 6):
        return rng.randrange(0, 200)
    if k in (7, 8):
        return [rand_json(rng, depth - 1) for _ in range(rng.randrange(4))]
    return {rng.choice(["type", "role", "content", "text", "name", "call_id", "output", "arguments", "format",
                        "effort", "function", "x"]): rand_json(rng, depth - 1) for _ in range(rng.randrange(4))}


def valid_bodies(i):
    msgs = [{"role": "user", "content": f"fuzz {i}"}]
    return [
        ("/v1/chat/completions", {"model": MODEL, "messages": msgs, "max_tokens": 2, "tools": [
            {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}], "tool_choice": "auto"}),
        ("/v1/completions", {"model": MODEL, "prompt": [f"a {i}", [1, 2, 3]], "max_tokens": 1, "echo": True,
                             "logprobs": 1, "n": 2}),
        ("/v1/messages", {"model": MODEL, "max_tokens": 2, "messages": msgs, "system": "s"}),
        ("/v1/responses", {"model": MODEL, "input": [{"role": "developer", "content": "d"}, msgs[0],
                                                     {"type": "function_call", "call_id": "c", "name": "f",
                                                      "arguments": "{}"},
                                                     {"type": "function_call_output", "call_id": "c", "output": "o"}],
                           "max_output_tokens": 2, "reasoning": {"effort": "low"},
                           "text": {"format": {"type": "json_object"}}}),
        ("/tokenize", {"model": MODEL, "messages": msgs}),
        ("/detokenize", {"model": MODEL, "tokens": [1, 2, 3]}),
    ]


def one(base, rng, i):
    kind = rng.randrange(10)
    seed = rng.randrange(1 << 30)
    n = rng.choice([1, 1, 2, 3])  # OpenAI's n: choices forked from one prompt
    chat = {"model": MODEL, "messages": [{"role": "user", "content": f"req {i}"}], "max_tokens": rng.randint(1, 3),
            "seed": seed}
    with httpx.Client(base_url=base, timeout=120) as c:
        if kind == 0:
            if rng.random() < 0.3:  # the Responses API, body or stream
                st = rng.random() < 0.5
                r = c.post("/v1/responses", json={"model": MODEL, "input": chat["messages"], "stream": st,
                                                  "max_output_tokens": chat["max_tokens"], "temperature": 0.7})
                assert r.status_code == 200, r.text
                assert ("response.completed" in r.text or "response.incomplete" in r.text) if st else r.json()["output"]
            else:
                r = c.post("/v1/chat/completions", json={**chat, "n": n})
                assert r.status_code == 200, r.text
                assert len(r.json()["choices"]) == n
        elif kind == 1:
            with c.stream("POST", "/v1/chat/completions", json={**chat, "stream": True, "n": n,
                                                                "reasoning_effort": "high"}) as r:
                assert r.status_code == 200
                body = "".join(r.iter_text())
                assert body.rstrip().endswith("data: [DONE]")
        elif kind == 2:
            mt = rng.randint(0, 2)  # 0: echo only (a prompt scored)
            prompt = f"p{i} and more words" if rng.random() < 0.7 else [f"p{i} one", [0, 5 + i % 100, 7]]
            r = c.post("/v1/completions", json={"model": MODEL, "prompt": prompt, "max_tokens": mt,
                                                "seed": seed, "logprobs": 2, "n": n, "echo": mt == 0 or rng.random() < 0.3,
                                                "logit_bias": {str(rng.randrange(1000)): rng.uniform(-100, 100)},
                                                "stop_token_ids": [rng.randrange(1000)], "min_tokens": rng.randint(0, mt)})
            assert r.status_code == 200, r.text
        elif kind == 3:
            r = c.post("/v1/messages", json={"model": MODEL, "max_tokens": 2, "messages": chat["messages"],
                                             "stream": bool(i % 2), "seed": seed})
            assert r.status_code == 200, r.text
        elif kind == 4:
            r = c.post("/v1/chat/completions", content=b"{bad json" + bytes([rng.randrange(256)]))
            assert r.status_code == 400
        elif kind == 5:
            if rng.random() < 0.5:
                r = c.post("/v1/chat/completions", json={**chat, "temperature": -3})
                assert r.status_code == 400
            else:  # a valid body of any endpoint with one field replaced by random JSON: an answer or a clean error
                path, body = rng.choice(valid_bodies(i))
                key = rng.choice(list(body) + ["extra"])
                body[key] = rand_json(rng, 3)
                if key in ("max_tokens", "max_output_tokens"):  # not a whole context of tokens (null: the default)
                    body[key] = rng.choice([-1, 0, 1, 2, 1.5, "x", [], 2 ** 40])
                r = c.post(path, json=body)
                assert r.status_code in (200, 400, 404, 413), (path, body, r.status_code, r.text)
                assert r.status_code != 200 or r.json(), r.text
        elif kind == 6:
            r = c.get(rng.choice(["/health", "/v1/models", "/metrics", "/nope"]))
            assert r.status_code in (200, 404)
            t = c.post("/tokenize", json={"prompt": f"p{i}"})
            assert t.status_code == 200, t.text
            d = c.post("/detokenize", json={"tokens": t.json()["tokens"] + [rng.randrange(-1, 2)]})
            assert d.status_code in (200, 400), d.text
        elif kind == 7:
            r = c.post("/v1/messages", json={"model": MODEL, "messages": [{"role": "user", "content": [
                {"type": "image", "source": {}}]}], "max_tokens": 1})
            assert r.status_code == 400
        elif kind == 8:  # a client that hangs up mid-stream
            with c.stream("POST", "/v1/chat/completions", json={**chat, "max_tokens": 50, "ignore_eos": True,
                                                                "stream": True, "n": n}) as r:
                for k, _ in enumerate(r.iter_lines()):
                    if k >= 2:
                        break
        else:  # a raw socket that sends half a request and leaves
            host, port = base[len("http://"):].split(":")
            s = socket.create_connection((host, int(port)))
            s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{\"mo")
            s.close()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default=os.path.join(REPO, "build-asan", "dsv4"))
    ap.add_argument("--model")
    ap.add_argument("-n", type=int, default=5000)
    ap.add_argument("--workers", type=int, default=8)
    a = ap.parse_args()
    os.environ["DSV4_BIN"] = os.path.abspath(a.bin)
    tmp = None
    model = a.model
    if not model:
        tmp = tempfile.TemporaryDirectory(prefix="dsv4-stress-")
        model = os.path.join(tmp.name, "tiny")
        subprocess.run([a.bin, "synth", "-o", model], cwd=REPO, check=True, capture_output=True)
    s = Server(model, "--served-model-name", MODEL, "--max-seqs", "8", "--max-context", "512", "--timeout", "5",
               env={"ASAN_OPTIONS": "detect_leaks=1", "LSAN_OPTIONS": "suppressions=" +
                    os.path.join(REPO, "scripts", "lsan.supp")})
    failures = []
    counter = iter(range(a.n))
    lock = threading.Lock()
    rss = []
    done = [0]

    def worker(w):
        rng = random.Random(w)
        while True:
            with lock:
                i = next(counter, None)
            if i is None:
                return
            try:
                one(s.base, rng, i)
            except Exception as e:  # noqa: BLE001
                failures.append(f"request {i}: {type(e).__name__}: {e}")
            with lock:
                done[0] += 1
                if done[0] % max(1, a.n // 10) == 0:
                    rss.append(rss_kb(s.proc.pid))
                    print(f"stress: {done[0]}/{a.n} requests, server RSS {rss[-1]} kB", flush=True)

    t0 = time.time()
    ts = [threading.Thread(target=worker, args=(w,)) for w in range(a.workers)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    print(f"stress: {a.n} requests in {time.time() - t0:.1f} s, {len(failures)} failures", flush=True)
    ok = not failures
    for f in failures[:20]:
        print("  " + f)
    # growth: the second half of the run must not keep growing (allow 25% slack for allocator noise)
    if len(rss) >= 4:
        half = rss[len(rss) // 2]
        if rss[-1] > half * 1.25 + 8192:
            print(f"stress: RSS keeps growing: {rss}")
            ok = False
    time.sleep(0.5)
    m = httpx.get(s.base + "/metrics").text
    if "dsv4_num_requests_running 0" not in m or "dsv4_num_requests_waiting 0" not in m:
        print("stress: requests still running after the run")
        ok = False
    rc = s.stop(timeout=120)
    if rc != 0:
        print(f"stress: server exit status {rc} (LeakSanitizer / ASan report below)")
        print("".join(s.log[-80:]))
        ok = False
    print("stress: " + ("PASS" if ok else "FAIL"))
    if tmp:
        tmp.cleanup()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
