"""Hidden checks of lesson 08 (the KV cache's bytes, the FLOPs of a generation, the intensity,
batch size and tokens per second of decode steps). See grader/cases/__init__.py."""

from grader.cases import Case, raises

# Bytes, FLOPs and batch sizes are integers: exact (max_batch_size floors an exact quotient).
# The intensity and tokens per second are a few products, a sum and a quotient of floats: a
# correct formula written in another order (2 / (p / B + c k / N), say) may differ in the last
# bit, so they get 1e-12.
_REL = 1e-12
# The shapes of data/models.json: Llama 2 7B has 32 layers of 32 KV heads of 128; Llama 3 70B
# 80 layers of 8 KV heads (grouped-query, 64 query heads) of 128; their parameters as released.
_7B, _70B = 6_738_415_616, 70_553_706_496
_KV_7B, _KV_70B = 2 * 32 * 32 * 128 * 2, 2 * 80 * 8 * 128 * 2  # bf16 bytes per token
_H100 = "989.4e12, 3.35e12"  # dense bf16 FLOP/s and bytes/s, data/hardware.json

CASES: dict[str, list[Case | str]] = {
    "kv_cache_bytes": [
        "kv_cache_bytes(32, 32, 128, 1, 1)",  # Llama 2 7B: 512 KiB per token
        "kv_cache_bytes(32, 32, 128, 4096, 1)",  # its whole context: 2 GiB
        "kv_cache_bytes(80, 8, 128, 8192, 1)",  # Llama 3 70B, grouped-query
        "kv_cache_bytes(80, 64, 128, 8192, 1)",  # the same without grouping: 8 x as much
        "kv_cache_bytes(126, 8, 128, 131072, 4)",  # Llama 3.1 405B, 128K context
        "kv_cache_bytes(2, 4, 16, 47, 8, bytes_per_element=4)",  # the lesson's model, float32
        "kv_cache_bytes(3, 1, 5, 7, 2, bytes_per_element=1)",
        "kv_cache_bytes(1, 1, 1, 0, 3)",  # nothing cached yet
        raises("kv_cache_bytes(32, 32, 128, -1, 1)", "ValueError"),
        raises("kv_cache_bytes(32, 0, 128, 16, 1)", "ValueError"),
        raises("kv_cache_bytes(32, 32, 128, 16, 0)", "ValueError"),
    ],
    "generate_flops": [
        "generate_flops(2, 64, 256, 16, 32)",  # the lesson's model
        "generate_flops(2, 64, 256, 16, 32, kv_cache=False)",
        "generate_flops(1, 8, 11, 5, 1)",  # one new token: the prefill alone
        "generate_flops(1, 8, 11, 5, 1, kv_cache=False)",
        "generate_flops(3, 12, 20, 7, 4, d_ff=20)",
        "generate_flops(3, 12, 20, 7, 4, 20, False)",
        "generate_flops(1, 4, 3, 1, 2)",  # a prompt of one token
        # Llama 2 7B (SwiGLU as a two-matrix MLP of width 1.5 x 11008), 1000 tokens in, 200 out
        "generate_flops(32, 4096, 32000, 1000, 200, d_ff=16512)",
        "generate_flops(32, 4096, 32000, 1000, 200, d_ff=16512, kv_cache=False)",
        "generate_flops(12, 768, 50257, 1, 1024)",  # GPT-2 small, its whole context
        raises("generate_flops(2, 64, 256, 16, 0)", "ValueError"),
        raises("generate_flops(2, 64, 256, 0, 8)", "ValueError"),
        raises("generate_flops(0, 64, 256, 16, 8)", "ValueError"),
    ],
    "decode_intensity": [
        "decode_intensity(7e9, 1, 0, 524288)",  # nothing cached: 2N / 2N, 1.0 in any order
        Case(f"decode_intensity({_7B}, 1, 4096, {_KV_7B})", rel_tol=_REL),
        Case(f"decode_intensity({_7B}, 64, 4096, {_KV_7B})", rel_tol=_REL),
        Case(f"decode_intensity({_70B}, 64, 8192, {_KV_70B})", rel_tol=_REL),
        Case(f"decode_intensity({_70B}, 64, 8192, {_KV_70B}, bytes_per_param=1)", rel_tol=_REL),
        Case("decode_intensity(1e6, 3, 10, 4.5, 4)", rel_tol=_REL),
        raises("decode_intensity(7e9, 0, 4096, 524288)", "ValueError"),
        raises("decode_intensity(-7e9, 1, 4096, 524288)", "ValueError"),
        raises("decode_intensity(7e9, 1, -1, 524288)", "ValueError"),
    ],
    "max_batch_size": [
        f"max_batch_size(80e9, {_7B}, 4096, {_KV_7B})",  # Llama 2 7B on one H100
        f"max_batch_size(80e9, {_7B}, 1024, {_KV_7B})",
        f"max_batch_size(8 * 80e9, {_70B}, 8192, {_KV_70B})",  # Llama 3 70B on 8 H100s
        f"max_batch_size(141e9, {_7B}, 4096, {_KV_7B}, bytes_per_param=0.5)",  # 4-bit weights
        "max_batch_size(1000, 100, 10, 9, bytes_per_param=1)",  # exactly 10 caches fit
        "max_batch_size(1000, 100, 10, 9, bytes_per_param=1.5)",  # 9 fit
        f"max_batch_size(15e9, {_7B}, 4096, {_KV_7B})",  # the weights fit, no whole cache
        raises(f"max_batch_size(141e9, {_70B}, 8192, {_KV_70B})", "ValueError"),  # 141.1 GB
        raises("max_batch_size(80e9, 70e9, 4096, 327680)", "ValueError"),
        raises("max_batch_size(80e9, 7e9, 0, 524288)", "ValueError"),
    ],
    "decode_tokens_per_second": [
        Case(f"decode_tokens_per_second({_7B}, 1, 4096, {_KV_7B}, {_H100})", rel_tol=_REL),
        Case(f"decode_tokens_per_second({_7B}, 64, 4096, {_KV_7B}, {_H100})", rel_tol=_REL),
        Case(f"decode_tokens_per_second({_7B}, 1024, 16, {_KV_7B}, {_H100})",  # compute bound
             rel_tol=_REL),
        Case(f"decode_tokens_per_second({_70B}, 32, 8192, {_KV_70B}, 8 * 989.4e12, 8 * 3.35e12)",
             rel_tol=_REL),
        Case("decode_tokens_per_second(1e9, 4, 100, 1000, 1e12, 1e11, bytes_per_param=4)",
             rel_tol=_REL),
        Case("decode_tokens_per_second(1e9, 1, 0, 1000, 2e14, 1e12)", rel_tol=_REL),
        raises(f"decode_tokens_per_second({_7B}, 0, 4096, {_KV_7B}, {_H100})", "ValueError"),
        raises(f"decode_tokens_per_second({_7B}, 1, 4096, {_KV_7B}, 0, 3.35e12)", "ValueError"),
        raises(f"decode_tokens_per_second({_7B}, 1, 4096, {_KV_7B}, 989.4e12, -1.0)",
               "ValueError"),
    ],
    # the graded prediction, within 1%: the lesson's point is that the cache holds P + n - 1
    # tokens, so counting the last new token too (48 tokens, 2.1% more) misses, as do
    # forgetting the values (half) or the batch
    "predicted_cache_bytes_after_generation": [
        Case("float(predicted_cache_bytes_after_generation)", rel_tol=0.01)],
}
