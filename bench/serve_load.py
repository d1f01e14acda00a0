#!/usr/bin/env python3
"""serve_load.py - load for an OpenAI-compatible server (`dsv4 serve`, vLLM, SGLang alike): N clients at once, each
sending streamed /v1/completions requests of a fixed prompt length (token ids, so every server sees the same tokens)
and output length (ignore_eos), until R requests have completed. Prints output and total tokens/s, time to first token
and inter-token latency (median, p90, p99) to stdout; a JSON line with --json. Python standard library only.

  python3 bench/serve_load.py --url http://127.0.0.1:8000 --concurrency 64 --requests 256 \\
      --prompt-tokens 1024 --max-tokens 256 [--model NAME] [--vocab 128000] [--seed 1] [--json]

Prompt token ids are drawn at random below --vocab (seeded per request), so requests share no prefix. TTFT and ITL are
timed per streamed event that carries text (a token whose text is held back, e.g. part of a UTF-8 character, shows as a
longer gap); output tokens are the server's usage counts. Only http:// URLs; the path part is ignored."""
import argparse
import http.client
import json
import random
import sys
import threading
import time
import urllib.parse


def pct(v, q):
    if not v:
        return float("nan")
    v = sorted(v)
    return v[min(len(v) - 1, int(q * (len(v) - 1) + 0.5))]


def one_request(u, a, k, out):
    rng = random.Random(a.seed * 1000003 + k)
    body = {"prompt": [rng.randrange(1000, a.vocab) for _ in range(a.prompt_tokens)], "max_tokens": a.max_tokens,
            "ignore_eos": True, "stream": True, "temperature": a.temperature, "seed": k,
            "stream_options": {"include_usage": True}}
    if a.model:
        body["model"] = a.model
    c = http.client.HTTPConnection(u.hostname, u.port or 80, timeout=a.timeout)
    t0 = time.perf_counter()
    stamps, usage, err = [], None, None
    try:
        c.request("POST", "/v1/completions", json.dumps(body), {"content-type": "application/json"})
        r = c.getresponse()
        if r.status != 200:
            err = "HTTP %d: %s" % (r.status, r.read(300).decode(errors="replace"))
        else:
            while True:
                line = r.readline()
                if not line:
                    break
                line = line.strip()
                if not line.startswith(b"data:"):
                    continue
                d = line[5:].strip()
                if d == b"[DONE]":
                    break
                j = json.loads(d)
                if j.get("usage"):
                    usage = j["usage"]
                if any(ch.get("text") for ch in j.get("choices", [])):
                    stamps.append(time.perf_counter())
    except Exception as e:  # a failed request is counted and reported, not fatal to the run
        err = repr(e)
    finally:
        c.close()
    out.append({"t0": t0, "t1": time.perf_counter(), "stamps": stamps, "usage": usage, "err": err})


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--url", default="http://127.0.0.1:8000")
    p.add_argument("--model", default="")
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--requests", type=int, default=64)
    p.add_argument("--prompt-tokens", type=int, default=1024)
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--vocab", type=int, default=128000)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--timeout", type=float, default=600)
    p.add_argument("--json", action="store_true")
    a = p.parse_args()
    u = urllib.parse.urlparse(a.url)
    res, lock, nxt = [], threading.Lock(), [0]

    def client():
        while True:
            with lock:
                k = nxt[0]
                nxt[0] += 1
            if k >= a.requests:
                return
            one_request(u, a, k, res)

    t0 = time.perf_counter()
    th = [threading.Thread(target=client) for _ in range(a.concurrency)]
    for t in th:
        t.start()
    for t in th:
        t.join()
    wall = time.perf_counter() - t0
    ok = [r for r in res if not r["err"]]
    bad = [r for r in res if r["err"]]
    out_tok = sum((r["usage"] or {}).get("completion_tokens", len(r["stamps"])) for r in ok)
    in_tok = sum((r["usage"] or {}).get("prompt_tokens", a.prompt_tokens) for r in ok)
    ttft = [(r["stamps"][0] - r["t0"]) * 1e3 for r in ok if r["stamps"]]
    itl = [(b - c) * 1e3 for r in ok for c, b in zip(r["stamps"], r["stamps"][1:])]
    s = {"concurrency": a.concurrency, "requests": len(res), "failed": len(bad), "prompt_tokens": a.prompt_tokens,
         "max_tokens": a.max_tokens, "wall_s": round(wall, 3), "output_tok_s": round(out_tok / wall, 1),
         "total_tok_s": round((out_tok + in_tok) / wall, 1),
         "ttft_ms": [round(pct(ttft, q), 1) for q in (0.5, 0.9, 0.99)],
         "itl_ms": [round(pct(itl, q), 2) for q in (0.5, 0.9, 0.99)]}
    if a.json:
        print(json.dumps(s))
    else:
        print("%d requests (%d failed) of %d prompt + %d output tokens, %d at once: %.1f s" %
              (s["requests"], s["failed"], a.prompt_tokens, a.max_tokens, a.concurrency, wall))
        print("output %.1f tok/s, total %.1f tok/s; TTFT ms p50 / p90 / p99 %s; ITL ms %s" %
              (s["output_tok_s"], s["total_tok_s"], " / ".join(map(str, s["ttft_ms"])),
               " / ".join(map(str, s["itl_ms"]))))
    for r in bad[:3]:
        print("failed: %s" % r["err"], file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
