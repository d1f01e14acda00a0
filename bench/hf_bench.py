#!/usr/bin/env python3
"""hf_bench.py - time Hugging Face transformers' DeepSeek-V4 on the same synthetic layers as `dsv4 bench`.

The reference users can install: transformers' `DeepseekV4ForCausalLM` (model_type "deepseek_v4",
transformers >= 5.x; written against 5.17.0), built from the config `dsv4 bench --synthetic NAME --layers N`
writes (released Flash / Pro shapes, first N layers, compress ratios and hash-routed layers as released),
random weights from a fixed seed, bf16, on one GPU. It times what `dsv4 bench` times:

  decode   for each context C and batch B: B sequences are filled to C tokens (chunked prefill into one
           DynamicCache), then 4 warm-up steps and 2 x --steps single-token steps alternating
           "step" (whole model, logits of the last token) and "layers" (the decoder without lm_head);
           each is the median over --steps, timed with CUDA events. head = step - layers.
  prefill  one prompt of --prompt tokens, batch 1, fresh cache, logits of the last token; median of 3
           after one warm-up.
  whole    the same projection as dsv4 bench: (layers ms / N) x 43 (Flash) or 61 (Pro) + head ms;
  model    prefill tokens/s x N / 43 (or 61).

--compare DSV4.json reads `dsv4 bench ... --json-file DSV4.json` (or --json > DSV4.json) and prints, per
measurement, HF time / dsv4 time (> 1: dsv4 is faster), per layer and projected to the whole model.

What it can not run, and says so in its output:
  * FP8 / FP4 weights: transformers 5.17.0 runs the release format (FP8 e4m3 with ue8m0 128x128 block scales,
    MXFP4 experts) only through Hub kernels (the `kernels` package fetching kernels-community/finegrained-fp8
    or deep-gemm at run time); the GPU machine has neither the package nor a network, so weights are bf16
    (experts too: 2 bytes a weight where dsv4 reads ~0.53, MXFP4).
  * CUDA graphs / torch.compile: DeepseekV4 sets _can_compile_fullgraph = False and has no StaticCache
    support (the compressors keep growing state in DeepseekV4HCACache / DeepseekV4CSACache), so eager only.
  * Attention is transformers' eager path (the only one DeepseekV4 supports: head_dim 512 and sinks rule out
    SDPA / flash); routed experts use transformers' default for the model (grouped_mm; --experts-impl).
  * Every parameter is bf16, norms and mHC too: built with DeepseekV4ForCausalLM._from_config(dtype=bfloat16).
    from_pretrained(dtype=bfloat16) would upcast the norm / mHC / sink / ape parameters to fp32
    (_keep_in_fp32_modules_strict), and then the bf16 forward of 5.17.0 stops at the first q_a_proj ("expected
    m1 and m2 to have the same dtype": the fp32 RMSNorm weight promotes its output); those tensors are small.
  * GPU memory: bf16 needs ~13 GB a Flash layer and ~51 GB a Pro layer (experts), so Pro fits 2 layers on
    one H200, not 3. The script checks before building.

How to run (GPU machine: Python 3.12, torch 2.11.0+cu130, transformers 5.17.0 already installed):

    python3 bench/hf_bench.py --synthetic flash --layers 2 --batch 1,8 --context 4096 --prompt 2048 --steps 20
    # next to the engine, in one call:
    build-bench-cuda/dsv4 bench --synthetic flash --layers 2 --batch 1,8 --context 4096 --prompt 2048 \
        --steps 20 --json-file flash.json
    python3 bench/hf_bench.py --synthetic flash --layers 2 --batch 1,8 --context 4096 --prompt 2048 \
        --steps 20 --compare flash.json --json-file hf-flash.json
    # re-print a comparison later without a GPU:
    python3 bench/hf_bench.py --from-json hf-flash.json --compare flash.json

A CPU smoke test (toy widths, seconds):
    python3 bench/hf_bench.py --synthetic tiny --layers 4 --device cpu --batch 1,2 --context 300 --prompt 64 --steps 3

Exit status: 0 ok, 2 bad arguments or something missing (no CUDA, no transformers / no deepseek_v4), 3 out of
memory, 1 anything else. Errors are one line on stderr, starting "hf_bench: ".
"""

import argparse
import json
import math
import os
import platform
import re
import statistics
import sys
import time

PROG = "hf_bench"

# ---- shapes: the same table as src/bench/bench_model.c (dsv4_bench_shape_get), spec section 1.1 ----------------


def shape(name):
    s = dict(vocab=129280, head_dim=512, rope_dim=64, n_active=6, n_hash_layers=3, window=128, idx_heads=64,
             idx_dim=128)
    if name == "flash":
        s.update(name="flash", n_layers_full=43, dim=4096, n_heads=64, q_lora=1024, o_groups=8, o_lora=1024,
                 moe_inter=2048, n_experts=256, idx_topk=512, route_scale=1.5)
        s["ratio"] = [0 if i < 2 else (4 if i % 2 == 0 else 128) for i in range(43)]
    elif name == "pro":
        s.update(name="pro", n_layers_full=61, dim=7168, n_heads=128, q_lora=1536, o_groups=16, o_lora=1024,
                 moe_inter=3072, n_experts=384, idx_topk=1024, route_scale=2.5)
        s["ratio"] = [128 if i < 2 else (4 if i % 2 == 0 else 128) for i in range(61)]
    elif name == "tiny":  # Flash's layout at toy widths, as dsv4 bench --synthetic tiny
        s.update(name="tiny", n_layers_full=6, dim=256, n_heads=4, head_dim=128, q_lora=128, o_groups=2, o_lora=64,
                 moe_inter=128, n_experts=16, idx_heads=4, idx_dim=64, idx_topk=32, route_scale=1.5)
        s["ratio"] = [0 if i < 2 else (4 if i % 2 == 0 else 128) for i in range(6)]
    else:
        return None
    return s


class Fail(Exception):
    def __init__(self, msg, code=1):
        super().__init__(msg)
        self.code = code


def die(msg, code):
    print(f"{PROG}: {msg}", file=sys.stderr)
    sys.exit(code)


def log(msg):
    print(f"{PROG}: {msg}", file=sys.stderr, flush=True)


def parse_list(s, flag):
    try:
        v = [int(x) for x in s.split(",")]
    except ValueError:
        v = []
    if not v or any(x < 1 for x in v) or len(v) > 16:
        raise Fail(f"{flag} wants a comma-separated list of positive integers (at most 16)", 2)
    return v


# ---- model ------------------------------------------------------------------------------------------------------


def import_hf():
    try:
        import torch  # noqa: F401
    except ImportError as e:
        raise Fail(f"PyTorch is not installed ({e})", 2)
    try:
        import transformers
    except ImportError as e:
        raise Fail(f"transformers is not installed ({e}); pip install transformers==5.17.0", 2)
    try:
        from transformers import DeepseekV4Config, DeepseekV4ForCausalLM
        from transformers.cache_utils import DynamicCache
    except ImportError:
        raise Fail(f"transformers {transformers.__version__} has no DeepSeek-V4 model (model_type deepseek_v4); "
                   "it needs transformers >= 5.x (written against 5.17.0)", 2)
    return transformers, DeepseekV4Config, DeepseekV4ForCausalLM, DynamicCache


def hf_config(Config, s, n_layers):
    """The config.json dsv4 bench writes (src/bench/bench_model.c write_config), through transformers' own
    legacy-key handling (compress_ratios, num_hash_layers, qk_rope_head_dim, rope_scaling)."""
    return Config(
        vocab_size=s["vocab"], hidden_size=s["dim"], moe_intermediate_size=s["moe_inter"], num_hidden_layers=n_layers,
        num_attention_heads=s["n_heads"], num_key_value_heads=1, head_dim=s["head_dim"], q_lora_rank=s["q_lora"],
        qk_rope_head_dim=s["rope_dim"], o_groups=s["o_groups"], o_lora_rank=s["o_lora"],
        n_routed_experts=s["n_experts"], n_shared_experts=1, num_experts_per_tok=s["n_active"],
        num_hash_layers=min(s["n_hash_layers"], n_layers), compress_ratios=s["ratio"][:n_layers],
        index_n_heads=s["idx_heads"], index_head_dim=s["idx_dim"], index_topk=s["idx_topk"],
        sliding_window=s["window"], routed_scaling_factor=s["route_scale"], scoring_func="sqrtsoftplus",
        norm_topk_prob=True, swiglu_limit=10.0, rope_theta=10000.0, compress_rope_theta=160000.0,
        rope_scaling={"beta_fast": 32, "beta_slow": 1, "factor": 16, "original_max_position_embeddings": 65536,
                      "type": "yarn"},
        hc_mult=4, hc_sinkhorn_iters=20, hc_eps=1e-6, rms_norm_eps=1e-6, max_position_embeddings=1048576,
        num_nextn_predict_layers=0, tie_word_embeddings=False, bos_token_id=0, eos_token_id=1, hidden_act="silu",
    )


def init_weights(model, s, seed, torch):
    """Random values shaped like dsv4 bench's checkpoint (bench_model.c): matrices uniform with std 1/sqrt(fan_in)
    (embedding std 1), norms 1 +- 0.3, mHC base +- 0.7 and scale 0.95 +- 0.3, sinks 0.5 +- 1, compressor ape
    +- 0.85, gate bias -0.1 +- 0.3, hash tables with 6 distinct uniform experts per token. Not HF's own init:
    its zero tid2eid would send every token of the hash layers to expert 0."""
    dev = next(model.parameters()).device
    g = torch.Generator(device=dev)
    g.manual_seed(seed)

    def uni(t, off, amp):
        t.uniform_(-1.0, 1.0, generator=g)
        t.mul_(amp).add_(off)

    with torch.no_grad():
        tensors = list(model.named_parameters()) + [(n, b) for n, b in model.named_buffers()
                                                    if b.is_floating_point() and "inv_freq" not in n]
        for name, t in tensors:
            if name.endswith("position_bias"):
                uni(t, 0.0, 0.85)
            elif name.endswith("embed_tokens.weight"):
                uni(t, 0.0, math.sqrt(3.0))
            elif t.dim() >= 2:
                uni(t, 0.0, math.sqrt(3.0 / t.shape[-1]))
            elif name.endswith("sinks"):
                uni(t, 0.5, 1.0)
            elif name.endswith(".base") or name.endswith("hc_base"):
                uni(t, 0.0, 0.7)
            elif name.endswith(".scale") or name.endswith("hc_scale"):
                uni(t, 0.95, 0.3)
            elif name.endswith("e_score_correction_bias"):
                uni(t, -0.1, 0.3)
            else:  # RMSNorm weights
                uni(t, 1.0, 0.3)
        for name, b in model.named_buffers():
            if name.endswith("tid2eid"):
                V, K = b.shape
                b.copy_(torch.rand(V, s["n_experts"], generator=g, device=dev).argsort(dim=1)[:, :K])


def build(args, s, torch, Config, Model):
    cfg = hf_config(Config, s, args.layers)
    dtype = torch.bfloat16
    # exact size first, on the meta device
    with torch.device("meta"):
        meta = Model._from_config(cfg, dtype=dtype)
    nbytes = sum(p.numel() * p.element_size() for p in meta.parameters())
    nbytes += sum(b.numel() * b.element_size() for b in meta.buffers())
    del meta
    if args.device == "cuda":
        free, total = torch.cuda.mem_get_info()
        if nbytes > free - (2 << 30):
            raise Fail(f"{s['name']} with {args.layers} layers needs {nbytes / 1e9:.1f} GB of bf16 weights, the GPU has "
                       f"{free / 1e9:.1f} GB free of {total / 1e9:.1f}: use fewer --layers (bf16: ~13 GB a Flash "
                       "layer, ~51 GB a Pro layer)", 3)
    torch.manual_seed(args.seed)
    cfg = hf_config(Config, s, args.layers)
    kw = {"dtype": dtype}
    if args.experts_impl:
        kw["experts_implementation"] = args.experts_impl
    with torch.device(args.device):
        model = Model._from_config(cfg, **kw)
    if any(p.device.type != args.device for p in model.parameters()):
        model.to(args.device)  # in case a transformers version builds outside the device context
    model.eval()
    init_weights(model, s, args.seed, torch)
    return model, nbytes


# ---- timing -----------------------------------------------------------------------------------------------------


class Timer:
    def __init__(self, torch, device):
        self.torch, self.cuda = torch, device == "cuda"

    def sync(self):
        if self.cuda:
            self.torch.cuda.synchronize()

    def __call__(self, fn):
        """Seconds fn() takes: CUDA events around it on the GPU (after draining the queue), wall clock on the CPU."""
        torch = self.torch
        if self.cuda:
            torch.cuda.synchronize()
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            out = fn()
            b.record()
            b.synchronize()
            return a.elapsed_time(b) / 1e3, out
        t = time.perf_counter()
        out = fn()
        return time.perf_counter() - t, out


def run_bench(args, s, torch, transformers, Config, Model, DynamicCache):
    dev = args.device
    if dev == "cuda":
        if not torch.cuda.is_available():
            raise Fail("CUDA is not available to PyTorch (torch %s); --device cpu runs the toy shapes" % torch.__version__, 2)
        gpu = torch.cuda.get_device_name(0)
        props = torch.cuda.get_device_properties(0)
        gpu = f"{gpu} ({props.multi_processor_count} SMs, {props.total_memory / 2**30:.1f} GiB)"
    else:
        gpu = "cpu"
    t0 = time.perf_counter()
    model, nbytes = build(args, s, torch, Config, Model)
    t_build = time.perf_counter() - t0
    cfg = model.config
    experts_impl = getattr(cfg, "_experts_implementation", None)
    attn_impl = getattr(cfg, "_attn_implementation", None)
    log(f"built {s['name']} x {args.layers} layers ({nbytes / 1e9:.2f} GB bf16, experts {experts_impl}, attention "
        f"{attn_impl}) on {gpu} in {t_build:.1f} s")
    N, V, T = args.layers, s["vocab"], Timer(torch, dev)
    gen = torch.Generator(device="cpu")
    gen.manual_seed(0x1234567 + args.seed)

    def toks(b, n):
        return torch.randint(2, V, (b, n), generator=gen).to(dev)

    def new_cache():
        return DynamicCache(config=cfg)

    # prefill: one prompt, batch 1, fresh cache, logits of the last token; 1 warm-up + reps
    pf = {"tokens": args.prompt, "ms": 0.0, "tokens_per_s": 0.0, "proj_tokens_per_s": 0.0}
    if args.prompt > 0:
        ts = []
        for r in range(args.reps + 1):
            ids = toks(1, args.prompt)
            pos = torch.arange(args.prompt, device=dev).unsqueeze(0)
            cache = new_cache()
            t, out = T(lambda: model(input_ids=ids, position_ids=pos, past_key_values=cache, use_cache=True,
                                     logits_to_keep=1))
            check_finite(out.logits, "prefill")
            del out, cache
            if r:
                ts.append(t)
        t = statistics.median(ts)
        pf.update(ms=t * 1e3, tokens_per_s=args.prompt / t, proj_tokens_per_s=args.prompt / (t / N * s["n_layers_full"]))
        log(f"prefill {args.prompt} tokens: {t * 1e3:.1f} ms")

    # decode
    dec = []
    for C in args.context:
        for B in args.batch:
            cache = new_cache()
            a = time.perf_counter()
            done = 0
            while done < C:  # fill the context in chunks (the B sequences together)
                k = min(args.chunk, C - done)
                pos = torch.arange(done, done + k, device=dev).unsqueeze(0).expand(B, -1)
                model.model(input_ids=toks(B, k), position_ids=pos, past_key_values=cache, use_cache=True)
                done += k
            T.sync()
            log(f"batch {B} context {C}: filled in {time.perf_counter() - a:.1f} s")
            tl, tn = [], []
            p = C
            for i in range(-4, 2 * args.steps):  # 4 warm-up steps, then step (logits) / layers alternating
                ids = toks(B, 1)
                pos = torch.full((B, 1), p, dtype=torch.long, device=dev)
                if i % 2 == 0:
                    t, out = T(lambda: model(input_ids=ids, position_ids=pos, past_key_values=cache, use_cache=True,
                                             logits_to_keep=1))
                    check_finite(out.logits, "decode")
                else:
                    t, out = T(lambda: model.model(input_ids=ids, position_ids=pos, past_key_values=cache,
                                                   use_cache=True))
                del out
                p += 1
                if i >= 0:
                    (tl if i % 2 == 0 else tn).append(t)
            del cache
            st, ly = statistics.median(tl), statistics.median(tn)
            proj = ly / N * s["n_layers_full"] + (st - ly)
            dec.append({"batch": B, "context": C, "step_ms": st * 1e3, "layers_ms": ly * 1e3, "head_ms": (st - ly) * 1e3,
                        "layer_ms": ly / N * 1e3, "proj_step_ms": proj * 1e3, "proj_tokens_per_s": B / proj})
            log(f"batch {B} context {C}: step {st * 1e3:.3f} ms, layers {ly * 1e3:.3f} ms")
    peak = torch.cuda.max_memory_allocated() if dev == "cuda" else 0
    kernels = False
    try:
        from transformers.utils.import_utils import is_kernels_available
        kernels = bool(is_kernels_available())
    except Exception:
        pass
    graphs = bool(getattr(Model, "_can_compile_fullgraph", False))
    notes = [
        "weights bf16: transformers runs the release FP8 (e4m3, ue8m0 128x128 blocks) / FP4-expert format only through "
        "Hub kernels (package `kernels` + kernels-community/finegrained-fp8 or deep-gemm, fetched at run time); "
        f"`kernels` {'is' if kernels else 'is not'} installed here",
        "eager only: DeepseekV4 has no StaticCache support (_can_compile_fullgraph = %s), so no CUDA graph / "
        "torch.compile run" % graphs,
        f"attention {attn_impl} (the only one DeepseekV4 supports), routed experts {experts_impl}",
        "all parameters bf16 (norms / mHC too): from_pretrained's fp32 upcast of those makes the bf16 forward fail "
        "in transformers 5.17.0 (fp32 RMSNorm output into a bf16 Linear)",
    ]
    return {
        "engine": "hf-transformers", "model": s["name"], "layers": N, "layers_full": s["n_layers_full"],
        "experts": "bf16", "dsv4_experts_flag": args.experts, "dtype": "bfloat16", "seed": args.seed, "device": dev,
        "gpu": gpu, "torch": torch.__version__, "transformers": transformers.__version__,
        "python": platform.python_version(), "experts_implementation": experts_impl, "attn_implementation": attn_impl,
        "weight_bytes": nbytes, "build_s": round(t_build, 2), "peak_mem_bytes": peak, "chunk": args.chunk,
        "steps": args.steps, "graphs": "not supported", "notes": notes,
        "prefill": pf, "decode": dec,
    }


def check_finite(x, what):
    if not bool(x.float().isfinite().all()):
        log(f"warning: non-finite logits in {what} (random weights); timings still taken")


# ---- report -----------------------------------------------------------------------------------------------------


def print_tables(r):
    print(f"HF transformers {r['transformers']} DeepSeek-V4, {r['model']} shapes, {r['layers']} of {r['layers_full']} "
          f"layers, bf16 weights, seed {r['seed']}, device {r['device']}: {r['gpu']} (torch {r['torch']})")
    print(f"weights {r['weight_bytes'] / 1e9:.2f} GB, experts {r['experts_implementation']}, attention "
          f"{r['attn_implementation']}, peak GPU memory {r['peak_mem_bytes'] / 1e9:.1f} GB")
    pf = r["prefill"]
    if pf["tokens"] > 0:
        print(f"prefill {pf['tokens']} tokens: {pf['ms']:.1f} ms = {pf['tokens_per_s']:.0f} tokens/s; whole model "
              f"(x {r['layers_full']}/{r['layers']}): {pf['proj_tokens_per_s']:.0f} tokens/s")
    clock = "CUDA events" if r["device"] == "cuda" else "wall clock"
    print(f"\ndecode (median of {r['steps']} steps each, {clock}; full: (layers ms / {r['layers']}) x "
          f"{r['layers_full']} + head ms)")
    print(f"{'batch':>6} {'context':>7} | {'step ms':>9} {'layers ms':>9} {'head ms':>8} {'ms/layer':>9} | "
          f"{'full: ms':>10} {'tok/s':>8}")
    for d in r["decode"]:
        print(f"{d['batch']:>6} {d['context']:>7} | {d['step_ms']:>9.3f} {d['layers_ms']:>9.3f} {d['head_ms']:>8.3f} "
              f"{d['layer_ms']:>9.3f} | {d['proj_step_ms']:>10.2f} {d['proj_tokens_per_s']:>8.1f}")
    for n in r["notes"]:
        print(f"note: {n}")


def compare(r, path):
    try:
        with open(path) as f:
            d = json.load(f)
    except (OSError, ValueError) as e:
        raise Fail(f"--compare {path}: {e}", 2)
    if not isinstance(d, dict) or "decode" not in d or "layers" not in d:
        raise Fail(f"--compare {path}: not the JSON of `dsv4 bench --json`", 2)
    warn = []
    if d.get("model") != r["model"]:
        warn.append(f"models differ (dsv4 {d.get('model')}, HF {r['model']})")
    if d.get("layers") != r["layers"]:
        warn.append(f"measured layers differ (dsv4 {d.get('layers')}, HF {r['layers']}): per-layer and projected "
                    "figures still compare, with different layer mixes")
    Nd, Nh = d["layers"], r["layers"]
    rows = []
    hf = {(x["batch"], x["context"]): x for x in r["decode"]}
    for x in d["decode"]:
        h = hf.get((x["batch"], x["context"]))
        if not h:
            warn.append(f"no HF measurement for batch {x['batch']} context {x['context']}")
            continue
        dl = x["layers_ms"] / Nd
        rows.append({
            "batch": x["batch"], "context": x["context"],
            "dsv4_step_ms": x["step_ms"], "hf_step_ms": h["step_ms"], "step_ratio": h["step_ms"] / x["step_ms"],
            "dsv4_layer_ms": dl, "hf_layer_ms": h["layer_ms"], "layer_ratio": h["layer_ms"] / dl,
            "dsv4_head_ms": x["head_ms"], "hf_head_ms": h["head_ms"],
            "dsv4_proj_step_ms": x["proj_step_ms"], "hf_proj_step_ms": h["proj_step_ms"],
            "proj_ratio": h["proj_step_ms"] / x["proj_step_ms"],
        })
    out = {"dsv4_json": path, "ratio": "HF time / dsv4 time (> 1: dsv4 faster)", "decode": rows, "warnings": warn}
    pd, ph = d.get("prefill") or {}, r["prefill"]
    if pd.get("tokens") and ph["tokens"] and pd.get("ms"):
        if pd["tokens"] != ph["tokens"]:
            warn.append(f"prompt lengths differ (dsv4 {pd['tokens']}, HF {ph['tokens']})")
        out["prefill"] = {
            "tokens": pd["tokens"], "dsv4_tokens_per_s": pd["tokens_per_s"], "hf_tokens_per_s": ph["tokens_per_s"],
            "dsv4_layer_ms": pd["ms"] / Nd, "hf_layer_ms": ph["ms"] / Nh,
            "layer_ratio": (ph["ms"] / Nh) / (pd["ms"] / Nd),
            "dsv4_proj_tokens_per_s": pd["proj_tokens_per_s"], "hf_proj_tokens_per_s": ph["proj_tokens_per_s"],
            "proj_ratio": pd["proj_tokens_per_s"] / ph["proj_tokens_per_s"],
        }
    out["dsv4"] = {k: d.get(k) for k in ("model", "layers", "experts", "gpu", "d2d_GBps")}
    return out


def print_compare(c):
    print(f"\ndsv4 ({c['dsv4']['model']}, {c['dsv4']['layers']} layers, {c['dsv4']['experts']} experts, "
          f"{c['dsv4']['gpu']}) vs HF transformers (bf16); ratio = HF time / dsv4 time, > 1: dsv4 faster")
    print(f"{'batch':>6} {'context':>7} | {'dsv4 step':>9} {'HF step':>9} {'ratio':>6} | {'dsv4 /layer':>11} "
          f"{'HF /layer':>9} {'ratio':>6} | {'dsv4 full':>9} {'HF full':>9} {'ratio':>6}")
    for x in c["decode"]:
        print(f"{x['batch']:>6} {x['context']:>7} | {x['dsv4_step_ms']:>9.3f} {x['hf_step_ms']:>9.3f} "
              f"{x['step_ratio']:>6.2f} | {x['dsv4_layer_ms']:>11.3f} {x['hf_layer_ms']:>9.3f} {x['layer_ratio']:>6.2f} | "
              f"{x['dsv4_proj_step_ms']:>9.2f} {x['hf_proj_step_ms']:>9.2f} {x['proj_ratio']:>6.2f}")
    print("(ms; /layer = layers ms / measured layers; full = the whole-model projection of each)")
    p = c.get("prefill")
    if p:
        print(f"prefill {p['tokens']} tokens: ms/layer dsv4 {p['dsv4_layer_ms']:.2f}, HF {p['hf_layer_ms']:.2f} "
              f"(ratio {p['layer_ratio']:.2f}); whole model tokens/s dsv4 {p['dsv4_proj_tokens_per_s']:.0f}, HF "
              f"{p['hf_proj_tokens_per_s']:.0f} (ratio {p['proj_ratio']:.2f})")
    for w in c["warnings"]:
        print(f"warning: {w}")


# ---- main -------------------------------------------------------------------------------------------------------


def main(argv):
    ap = argparse.ArgumentParser(
        prog="hf_bench.py", description="Time Hugging Face transformers' DeepSeek-V4 on dsv4 bench's synthetic "
        "layers (random bf16 weights) and compare with `dsv4 bench --json`. See the top of this file.")
    ap.add_argument("--synthetic", help="flash, pro (released shapes) or tiny (toy widths, for testing)")
    ap.add_argument("--layers", type=int, default=4, help="first N layers of the released config (default 4)")
    ap.add_argument("--experts", default="mxfp4", choices=["mxfp4", "nvfp4"],
                    help="accepted to mirror dsv4 bench; HF runs bf16 experts either way")
    ap.add_argument("--batch", default="1", help="decode batch sizes, comma-separated (default 1)")
    ap.add_argument("--context", default="4096", help="context lengths for decode, comma-separated (default 4096)")
    ap.add_argument("--prompt", type=int, default=2048, help="prefill: one prompt of LEN tokens (default 2048; 0 = skip)")
    ap.add_argument("--steps", type=int, default=20, help="timed decode steps of each kind (default 20)")
    ap.add_argument("--chunk", type=int, default=512, help="prefill chunk when filling the context (default 512)")
    ap.add_argument("--reps", type=int, default=3, help="timed prefill repetitions after one warm-up (default 3)")
    ap.add_argument("--seed", type=int, default=0, help="weight seed (default 0)")
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"], help="cuda (default) or cpu (tiny only)")
    ap.add_argument("--experts-impl", default=None, choices=["grouped_mm", "batched_mm", "eager"],
                    help="transformers' routed-expert implementation (default: its own default, grouped_mm)")
    ap.add_argument("--json", action="store_true", help="one JSON object on stdout instead of the tables")
    ap.add_argument("--json-file", help="the tables on stdout and the JSON object into FILE")
    ap.add_argument("--compare", metavar="DSV4.json", help="output of `dsv4 bench ... --json`: print HF / dsv4 ratios")
    ap.add_argument("--from-json", metavar="HF.json", help="reuse an earlier --json-file of this script, no run")
    args = ap.parse_args(argv)

    if args.from_json:
        try:
            with open(args.from_json) as f:
                r = json.load(f)
            r.pop("compare", None)
        except (OSError, ValueError) as e:
            raise Fail(f"--from-json {args.from_json}: {e}", 2)
    else:
        s = shape(args.synthetic or "")
        if s is None:
            raise Fail("--synthetic flash|pro|tiny is required", 2)
        if not 1 <= args.layers <= s["n_layers_full"] or args.prompt < 0 or args.steps < 1 or args.chunk < 1 \
                or args.reps < 1:
            raise Fail(f"--layers must be in [1, {s['n_layers_full']}], --steps, --chunk and --reps >= 1, --prompt >= 0", 2)
        args.batch = parse_list(args.batch, "--batch")
        args.context = parse_list(args.context, "--context")
        transformers, Config, Model, DynamicCache = import_hf()
        import torch
        try:
            with torch.inference_mode():
                r = run_bench(args, s, torch, transformers, Config, Model, DynamicCache)
        except torch.OutOfMemoryError as e:
            first = str(e).strip().splitlines()[0] if str(e).strip() else "out of memory"
            raise Fail(f"out of GPU memory ({first[:200]}); try fewer --layers, a smaller --batch / --chunk", 3)
    if args.compare:
        r["compare"] = compare(r, args.compare)
    if args.json_file:
        try:
            with open(args.json_file, "w") as f:
                json.dump(r, f, indent=1)
                f.write("\n")
        except OSError as e:
            raise Fail(f"--json-file {args.json_file}: {e}", 1)
    if args.json:
        json.dump(r, sys.stdout)
        sys.stdout.write("\n")
    else:
        print_tables(r)
        if "compare" in r:
            print_compare(r["compare"])
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]))
    except Fail as e:
        die(str(e), e.code)
    except KeyboardInterrupt:
        die("interrupted", 130)
    except Exception as e:  # noqa: BLE001 - one line, not a traceback
        msg = " ".join(str(e).split())[:300]
        if os.environ.get("HF_BENCH_TRACE"):
            raise
        if "out of memory" in msg.lower():
            die(f"out of memory ({msg[:200]}); try fewer --layers, a smaller --batch / --chunk", 3)
        die(f"{type(e).__name__}: {msg} (HF_BENCH_TRACE=1 for the traceback)", 1)
