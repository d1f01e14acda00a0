#!/usr/bin/env python3
"""Regenerates the corrupt-input corpus in this directory (st_*.safetensors, cfg_*.json, expect.tsv).

Run from anywhere: python3 tests/corrupt/make_corpus.py. Files are small and committed; the test
tests/test_io.c (corrupt_corpus) replays every file here and checks each fails cleanly with an error
naming the file and containing the expected text from expect.tsv. Fuzzer regressions (fuzz_*) are
added by hand and listed in expect.tsv too."""
import json, os, struct

HERE = os.path.dirname(os.path.abspath(__file__))
expect = {}


def raw(name, data, want):
    with open(os.path.join(HERE, name), "wb") as f:
        f.write(data)
    expect[name] = want


def st(name, header, data_len, want, hlen=None):
    """A safetensors image with header text `header` (str or dict) and data_len zero bytes of data."""
    h = header if isinstance(header, (str, bytes)) else json.dumps(header, separators=(",", ":"))
    if isinstance(h, str):
        h = h.encode()
    n = len(h) if hlen is None else hlen
    raw(name, struct.pack("<Q", n) + h + b"\0" * data_len, want)


T = lambda dt, shape, a, b: {"dtype": dt, "shape": shape, "data_offsets": [a, b]}

raw("st_empty.safetensors", b"", "too short")
raw("st_short.safetensors", b"\x10\0\0\0\0", "too short")
st("st_hlen_past_end.safetensors", '{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}', 4, "past the end of the file", hlen=4096)
st("st_hlen_huge.safetensors", "{}", 0, "past the end of the file", hlen=0xFFFFFFFFFFFFFFF0)
st("st_hlen_zero.safetensors", "", 8, "too small")
st("st_not_json.safetensors", "{this is not json}", 0, "not valid JSON")
st("st_not_object.safetensors", "[1,2,3]", 0, "not a JSON object")
st("st_truncated_json.safetensors", '{"a":{"dtype":"F32","shape":[1],"data_', 0, "not valid JSON")
st("st_trailing_garbage.safetensors", '{}   xyz', 0, "trailing bytes")
st("st_nul_in_header.safetensors", b'{"a\0b":{}}', 0, "NUL")
st("st_entry_not_object.safetensors", {"w": [1, 2]}, 0, "'w'")
st("st_missing_dtype.safetensors", {"w": {"shape": [1], "data_offsets": [0, 4]}}, 4, "'dtype'")
st("st_missing_shape.safetensors", {"w": {"dtype": "F32", "data_offsets": [0, 4]}}, 4, "'shape'")
st("st_missing_offsets.safetensors", {"w": {"dtype": "F32", "shape": [1]}}, 4, "'data_offsets'")
st("st_dtype_number.safetensors", {"w": {"dtype": 7, "shape": [1], "data_offsets": [0, 4]}}, 4, "'dtype' must be a string")
st("st_shape_string.safetensors", {"w": {"dtype": "F32", "shape": "1", "data_offsets": [0, 4]}}, 4, "'shape' must be an array")
st("st_unknown_dtype.safetensors", {"w": T("F17", [1], 0, 4)}, 4, "unknown dtype 'F17'")
st("st_negative_dim.safetensors", {"w": T("F32", [-1], 0, 4)}, 4, "negative dimension")
st("st_float_dim.safetensors", {"w": T("F32", [1.5], 0, 4)}, 4, "not an integer")
st("st_string_dim.safetensors", {"w": T("F32", ["1"], 0, 4)}, 4, "must be an integer")
st("st_too_many_dims.safetensors", {"w": T("F32", [1] * 9, 0, 4)}, 4, "dimensions")
st("st_shape_overflow.safetensors", {"w": T("F32", [2**32, 2**32, 2**32], 0, 4)}, 4, "overflow")
st("st_nbytes_overflow.safetensors", {"w": T("F64", [2**31, 2**30], 0, 4)}, 4, "overflow")
st("st_offsets_one.safetensors", {"w": {"dtype": "F32", "shape": [1], "data_offsets": [0]}}, 4, "two non-negative integers")
st("st_offsets_three.safetensors", {"w": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4, 8]}}, 8, "two non-negative integers")
st("st_offsets_negative.safetensors", {"w": T("F32", [1], -4, 0)}, 4, "two non-negative integers")
st("st_offsets_float.safetensors", {"w": T("F32", [1], 0.5, 4.5)}, 8, "two non-negative integers")
st("st_offsets_descending.safetensors", {"w": T("F32", [1], 4, 0)}, 4, "not ascending")
st("st_offsets_past_end.safetensors", {"w": T("F32", [4], 0, 16)}, 8, "past the end of the data section")
st("st_offsets_huge.safetensors", {"w": T("U8", [16], 2**52, 2**52 + 16)}, 8, "past the end of the data section")
st("st_nbytes_mismatch.safetensors", {"w": T("F32", [2, 3], 0, 20)}, 24, "byte length 20 != 6 elements")
st("st_overlap.safetensors", {"a": T("F32", [4], 0, 16), "b": T("F32", [4], 8, 24)}, 24, "overlap")
st("st_overlap_contained.safetensors", {"a": T("U8", [32], 0, 32), "b": T("U8", [4], 8, 12)}, 32, "overlap")
st("st_duplicate_name.safetensors",
   '{"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"w":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}',
   8, "duplicate name")
st("st_metadata_not_object.safetensors", {"__metadata__": [1], "w": T("F32", [1], 0, 4)}, 4, "__metadata__")
st("st_metadata_not_strings.safetensors", {"__metadata__": {"format": 1}, "w": T("F32", [1], 0, 4)}, 4, "__metadata__")

# configs: start from a valid config and break one thing each
base = {
    "model_type": "deepseek_v4", "vocab_size": 512, "hidden_size": 64, "moe_intermediate_size": 32,
    "num_hidden_layers": 5, "num_hash_layers": 2, "num_nextn_predict_layers": 0, "num_attention_heads": 4,
    "num_key_value_heads": 1, "head_dim": 80, "qk_rope_head_dim": 16, "q_lora_rank": 32, "o_groups": 2,
    "o_lora_rank": 16, "n_routed_experts": 8, "n_shared_experts": 1, "num_experts_per_tok": 2,
    "routed_scaling_factor": 2.5, "swiglu_limit": 1.5, "sliding_window": 8, "rms_norm_eps": 1e-6,
    "hc_eps": 1e-6, "hc_mult": 4, "hc_sinkhorn_iters": 20, "index_n_heads": 4, "index_head_dim": 32,
    "index_topk": 4, "rope_theta": 10000.0, "compress_rope_theta": 160000.0,
    "rope_scaling": {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32,
                     "beta_fast": 32, "beta_slow": 1},
    "compress_ratios": [0, 4, 16, 4, 0], "scoring_func": "sqrtsoftplus", "topk_method": "noaux_tc",
    "tie_word_embeddings": False, "bos_token_id": 0, "eos_token_id": 1,
}


def cfg(name, want, text=None, **changes):
    if text is None:
        d = json.loads(json.dumps(base))
        for k, v in changes.items():
            k = k.replace("__", ".")
            obj = d
            *path, last = k.split(".")
            for p in path:
                obj = obj[p]
            if v is DELETE:
                del obj[last]
            else:
                obj[last] = v
        text = json.dumps(d, indent=1)
    with open(os.path.join(HERE, name), "w") as f:
        f.write(text)
    expect[name] = want


DELETE = object()
cfg("cfg_empty.json", "empty", text="")
cfg("cfg_not_json.json", "not valid JSON", text='{"vocab_size": 12,')
cfg("cfg_not_object.json", "not a JSON object", text="[1, 2]")
cfg("cfg_trailing.json", "trailing", text='{"vocab_size": 1} {}')
cfg("cfg_missing_vocab.json", "'vocab_size': required", vocab_size=DELETE)
cfg("cfg_missing_compress_ratios.json", "'compress_ratios': required", compress_ratios=DELETE)
cfg("cfg_missing_compress_rope_theta.json", "'compress_rope_theta': required", compress_rope_theta=DELETE)
cfg("cfg_string_dim.json", "'hidden_size': must be an integer (got a string)", hidden_size="64")
cfg("cfg_float_layers.json", "'num_hidden_layers': must be an integer (got 4.5)", num_hidden_layers=4.5)
cfg("cfg_negative_heads.json", "'num_attention_heads': must be in", num_attention_heads=-4)
cfg("cfg_zero_vocab.json", "'vocab_size': must be in", vocab_size=0)
cfg("cfg_huge_dim.json", "'hidden_size': must be in", hidden_size=1 << 30)
cfg("cfg_too_many_layers.json", "'num_hidden_layers': must be in", num_hidden_layers=1000)
cfg("cfg_head_dim_le_rope.json", "'head_dim': must be > qk_rope_head_dim (got 16 <= 16)", head_dim=16)
cfg("cfg_odd_rope.json", "'qk_rope_head_dim': must be even", qk_rope_head_dim=15)
cfg("cfg_index_head_dim_small.json", "'index_head_dim': must be >= qk_rope_head_dim", index_head_dim=8)
cfg("cfg_heads_o_groups.json", "'o_groups': must divide num_attention_heads", o_groups=3)
cfg("cfg_topk_gt_experts.json", "'num_experts_per_tok': must be <= n_routed_experts", num_experts_per_tok=9)
cfg("cfg_hash_gt_layers.json", "'num_hash_layers': must be <= num_hidden_layers", num_hash_layers=6)
cfg("cfg_kv_heads.json", "'num_key_value_heads'", num_key_value_heads=2)
cfg("cfg_shared_experts.json", "'n_shared_experts'", n_shared_experts=2)
cfg("cfg_ratios_short.json", "'compress_ratios': must have", compress_ratios=[0, 4, 4])
cfg("cfg_ratios_long.json", "'compress_ratios': must have", compress_ratios=[0, 4, 16, 4, 0, 0, 0])
cfg("cfg_ratios_one.json", "'compress_ratios[2]': must be 0 or in", compress_ratios=[0, 4, 1, 4, 0])
cfg("cfg_ratios_negative.json", "'compress_ratios[1]': must be 0 or in", compress_ratios=[0, -4, 16, 4, 0])
cfg("cfg_ratios_string.json", "'compress_ratios[0]': must be an integer", compress_ratios=["0", 4, 16, 4, 0])
cfg("cfg_ratios_not_array.json", "'compress_ratios': must be an array", compress_ratios=4)
cfg("cfg_eps_zero.json", "'rms_norm_eps'", rms_norm_eps=0)
cfg("cfg_eps_one.json", "'rms_norm_eps'", rms_norm_eps=1.0)
cfg("cfg_window_zero.json", "'sliding_window'", sliding_window=0)
cfg("cfg_hc_mult_zero.json", "'hc_mult'", hc_mult=0)
cfg("cfg_index_topk_zero.json", "'index_topk'", index_topk=0)
cfg("cfg_theta_string.json", "'rope_theta': must be a number (got a string)", rope_theta="10000")
cfg("cfg_scoring_softmax.json", "'scoring_func'", scoring_func="softmax")
cfg("cfg_topk_method.json", "'topk_method'", topk_method="greedy")
cfg("cfg_model_type.json", "'model_type'", model_type="deepseek_v3")
cfg("cfg_tied.json", "'tie_word_embeddings'", tie_word_embeddings=True)
cfg("cfg_rope_type.json", "'rope_scaling.type'", rope_scaling__type="linear")
cfg("cfg_rope_factor_small.json", "'rope_scaling.factor'", rope_scaling__factor=0.5)
cfg("cfg_rope_orig_missing.json", "'rope_scaling.original_max_position_embeddings'",
    rope_scaling__original_max_position_embeddings=DELETE)
cfg("cfg_rope_not_object.json", "'rope_scaling'", rope_scaling="yarn")
cfg("cfg_quant_unknown.json", "'quantization_config.quant_method'", quantization_config={"quant_method": "gptq"})
cfg("cfg_quant_no_method.json", "'quantization_config.quant_method'", quantization_config={"fmt": "e4m3"})
cfg("cfg_quant_block.json", "'quantization_config.weight_block_size'",
    quantization_config={"quant_method": "fp8", "weight_block_size": [64, 64]})
cfg("cfg_quant_fmt.json", "'quantization_config.fmt'", quantization_config={"quant_method": "fp8", "fmt": "e5m2"})
cfg("cfg_expert_dtype.json", "'expert_dtype'", expert_dtype="int4")
cfg("cfg_bos_out_of_range.json", "'bos_token_id'", bos_token_id=512)
cfg("cfg_norm_topk_string.json", "'norm_topk_prob'", norm_topk_prob="true")
cfg("cfg_duplicate_key.json", "'hidden_size': given more than once",
    text=json.dumps(base)[:-1] + ', "hidden_size": 128}')

kept = []  # hand-added fuzzer regressions survive regeneration
if os.path.exists(os.path.join(HERE, "expect.tsv")):
    with open(os.path.join(HERE, "expect.tsv")) as f:
        kept = [l for l in f if l.startswith("fuzz_")]
with open(os.path.join(HERE, "expect.tsv"), "w") as f:
    f.write("# file<TAB>text the error message must contain (\"OK\": the file must load). Generated by make_corpus.py;\n")
    f.write("# fuzzer regressions (fuzz_*) are appended by hand at the end.\n")
    for k in sorted(expect):
        f.write(f"{k}\t{expect[k]}\n")
    f.writelines(kept)
