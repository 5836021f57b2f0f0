"""Hidden checks of lesson 08 (the KV cache's bytes, the FLOPs of a generation, the intensity,
batch size and tokens per second of decode steps, the time of a prefill, and a server's
averages over a stream of requests). See grader/content/cases/__init__.py.

Every input stays inside what its exercise states (its text and docstring): sizes at or above
their stated minimum, numbers finite and above 0 where it asks so, and each error case one that
the text names."""

import random

from grader.content.cases import Case, raises
from grader.content.variants import Variants

# Bytes, FLOPs and batch sizes are integers: exact (max_batch_size floors an exact quotient).
# The intensity, tokens per second and a prefill's seconds are a few products, a sum and a
# quotient of floats: a correct formula written in another order (2 / (p / B + c k / N), say)
# may differ in the last bit, so they get 1e-12.
_REL = 1e-12
# The lesson's one N of each model (data/models.json's shapes, solutions.serving): the
# parameters a forward pass multiplies (decode_params: every weight matrix but the untied input
# embedding), for FLOPs and the bytes a step reads; and the parameters stored (model_params:
# every weight matrix, the norms' gains left out), for memory. Llama 2 7B has 32 layers of 32
# KV heads of 128; Llama 3 70B 80 layers of 8 KV heads (grouped-query, 64 query heads) of 128.
_7B_STEP, _7B = 6_607_077_376, 6_738_149_376
_70B_STEP, _70B = 69_501_714_432, 70_552_387_584
_KV_7B, _KV_70B = 2 * 32 * 32 * 128 * 2, 2 * 80 * 8 * 128 * 2  # bf16 bytes per token
_H100 = "989.4e12, 3.35e12"  # dense bf16 FLOP/s and bytes/s, data/hardware.json
_BUDGET = "72e9"  # an H100's 80e9 bytes less the lesson's 10% reserve

# simulate_serving: times that are sums of powers of two (0.25 s per prompt token, 1 s per
# step) are exact in floats, so the timelines are those worked by hand in
# tests/test_serving.py; the averages are quotients, rounded: 1e-12. The one stream on an
# H100's numbers adds hundreds of rounded times; 1e-9 leaves room for another order of
# addition, and its arrivals are far (> 1e-5 s) from every event time, so no admission turns
# on a last bit.
_SERVE = "0.25, 1.0"
_FOUR = "[(0, 4, 3), (0, 2, 1), (0.5, 4, 2), (0.5, 2, 4)]"
_STREAM = ("[(0.0, 512, 40), (0.0, 96, 12), (0.0137, 2048, 5), (0.0291, 300, 64), "
           "(0.0433, 30, 1), (0.0502, 800, 20), (0.1219, 1200, 33), (0.1603, 64, 9)]")
_LLAMA_SERVE = "1.3355725441681827e-05, 0.004425303727761195"  # 2N / peak; a step of 3

CASES: dict[str, list[Case | str]] = {
    "kv_cache_bytes": [
        "kv_cache_bytes(32, 32, 128, 1, 1)",  # Llama 2 7B: 512 KiB per token
        "kv_cache_bytes(32, 32, 128, 4096, 1)",  # its whole context: 2 GiB
        "kv_cache_bytes(80, 8, 128, 8192, 1)",  # Llama 3 70B, grouped-query
        "kv_cache_bytes(80, 64, 128, 8192, 1)",  # the same without grouping: 8 x as much
        "kv_cache_bytes(80, 1, 128, 8192, 1)",  # multi-query: one KV head
        "kv_cache_bytes(126, 8, 128, 131072, 4)",  # Llama 3.1 405B, 128K context
        "kv_cache_bytes(2, 4, 16, 47, 8, bytes_per_element=4)",  # the lesson's model, float32
        "kv_cache_bytes(3, 1, 5, 7, 2, bytes_per_element=1)",
        "kv_cache_bytes(1, 1, 1, 0, 3)",  # nothing cached yet
        raises("kv_cache_bytes(32, 32, 128, -1, 1)", "ValueError"),
        raises("kv_cache_bytes(32, 0, 128, 16, 1)", "ValueError"),
        raises("kv_cache_bytes(32, 32, 128, 16, 0)", "ValueError"),
        raises("kv_cache_bytes(32, 32, 128, 16, 1, 0)", "ValueError"),
        raises("kv_cache_bytes(32, 32, 128.0, 16, 1)", "TypeError"),
        raises("kv_cache_bytes(32, 32, 128, 16, False)", "TypeError"),
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
        raises("generate_flops(2, 64, 256, 16, 8, d_ff=0)", "ValueError"),
        raises("generate_flops(2, 64.0, 256, 16, 8)", "TypeError"),
        raises("generate_flops(2, 64, 256, 16, 8, kv_cache=None)", "TypeError"),
    ],
    "decode_intensity": [
        "decode_intensity(7e9, 1, 0, 524288)",  # nothing cached: 2N / 2N, 1.0 in any order
        Case(f"decode_intensity({_7B_STEP}, 1, 4096, {_KV_7B})", rel_tol=_REL),
        Case(f"decode_intensity({_7B_STEP}, 64, 4096, {_KV_7B})", rel_tol=_REL),
        Case(f"decode_intensity({_70B_STEP}, 64, 8192, {_KV_70B})", rel_tol=_REL),
        Case(f"decode_intensity({_70B_STEP}, 64, 8192, {_KV_70B}, bytes_per_param=1)",
             rel_tol=_REL),
        Case("decode_intensity(1e6, 3, 10, 4.5, 4)", rel_tol=_REL),
        raises("decode_intensity(7e9, 0, 4096, 524288)", "ValueError"),
        raises("decode_intensity(-7e9, 1, 4096, 524288)", "ValueError"),
        raises("decode_intensity(7e9, 1, -1, 524288)", "ValueError"),
        raises("decode_intensity(7e9, 1, 4096, 524288, bytes_per_param=0)", "ValueError"),
        raises("decode_intensity(7e9, 1, 4096.0, 524288)", "TypeError"),
        raises("decode_intensity(7e9, 1, 4096, None)", "TypeError"),
        raises("decode_intensity(math.inf, 1, 4096, 524288)", "ValueError"),
        raises("decode_intensity(7e9, 1, 4096, 0)", "ValueError"),
    ],
    "max_batch_size": [
        f"max_batch_size({_BUDGET}, {_7B}, 4096, {_KV_7B})",  # Llama 2 7B on one H100
        f"max_batch_size(80e9, {_7B}, 4096, {_KV_7B})",  # with no reserve kept back
        f"max_batch_size({_BUDGET}, {_7B}, 1024, {_KV_7B})",
        f"max_batch_size(8 * {_BUDGET}, {_70B}, 8192, {_KV_70B})",  # Llama 3 70B on 8 H100s
        f"max_batch_size(0.9 * 141e9, {_70B}, 8192, {_KV_70B}, bytes_per_param=1)",  # one H200
        f"max_batch_size(0.9 * 141e9, {_7B}, 4096, {_KV_7B}, bytes_per_param=0.5)",  # 4-bit
        "max_batch_size(1000, 100, 10, 9, bytes_per_param=1)",  # exactly 10 caches fit
        "max_batch_size(1000, 100, 10, 9, bytes_per_param=1.5)",  # 9 fit
        f"max_batch_size(15e9, {_7B}, 4096, {_KV_7B})",  # the weights fit, no whole cache
        raises(f"max_batch_size(141e9, {_70B}, 8192, {_KV_70B})", "ValueError"),  # 141.1 GB
        raises("max_batch_size(80e9, 70e9, 4096, 327680)", "ValueError"),
        raises("max_batch_size(80e9, 7e9, 0, 524288)", "ValueError"),
        raises("max_batch_size(0, 7e9, 4096, 524288)", "ValueError"),
        raises("max_batch_size(80e9, 7e9, 4096, 524288, bytes_per_param=-2)", "ValueError"),
        raises("max_batch_size(80e9, 7e9, 4096.0, 524288)", "TypeError"),
        raises("max_batch_size('80e9', 7e9, 4096, 524288)", "TypeError"),
        raises("max_batch_size(80e9, 7e9, 4096, 0)", "ValueError"),
        raises("max_batch_size(math.inf, 7e9, 4096, 524288)", "ValueError"),
    ],
    "decode_tokens_per_second": [
        Case(f"decode_tokens_per_second({_7B_STEP}, 1, 4096, {_KV_7B}, {_H100})", rel_tol=_REL),
        Case(f"decode_tokens_per_second({_7B_STEP}, 64, 4096, {_KV_7B}, {_H100})", rel_tol=_REL),
        Case(f"decode_tokens_per_second({_7B_STEP}, 1024, 16, {_KV_7B}, {_H100})",  # compute
             rel_tol=_REL),
        Case(f"decode_tokens_per_second({_70B_STEP}, 32, 8192, {_KV_70B}, 8 * 989.4e12, "
             "8 * 3.35e12)", rel_tol=_REL),
        Case("decode_tokens_per_second(1e9, 4, 100, 1000, 1e12, 1e11, bytes_per_param=4)",
             rel_tol=_REL),
        Case("decode_tokens_per_second(1e9, 1, 0, 1000, 2e14, 1e12)", rel_tol=_REL),
        raises(f"decode_tokens_per_second({_7B_STEP}, 0, 4096, {_KV_7B}, {_H100})",
               "ValueError"),
        raises(f"decode_tokens_per_second({_7B_STEP}, 1, 4096, {_KV_7B}, 0, 3.35e12)",
               "ValueError"),
        raises(f"decode_tokens_per_second({_7B_STEP}, 1, 4096, {_KV_7B}, 989.4e12, -1.0)",
               "ValueError"),
        raises(f"decode_tokens_per_second({_7B_STEP}, 1, -1, {_KV_7B}, {_H100})", "ValueError"),
        raises(f"decode_tokens_per_second({_7B_STEP}, 1, 4096, {_KV_7B}, '989.4e12', 3.35e12)",
               "TypeError"),
        raises(f"decode_tokens_per_second({_7B_STEP}, 1, 4096, {_KV_7B}, math.inf, 3.35e12)",
               "ValueError"),
        # the arguments shared with decode_intensity, of the wrong kind
        raises("decode_tokens_per_second(7e9, 1.5, 4096, 524288, 989.4e12, 3.35e12)", "TypeError"),
        raises("decode_tokens_per_second(7e9, 1, 4096, None, 989.4e12, 3.35e12)", "TypeError"),
    ],
    "prefill_seconds": [
        Case(f"prefill_seconds({_7B_STEP}, 1000, 1, {_H100})", rel_tol=_REL),  # compute-bound
        Case(f"prefill_seconds({_7B_STEP}, 100, 1, {_H100})", rel_tol=_REL),  # reading weights
        Case(f"prefill_seconds({_7B_STEP}, 512, 64, {_H100})", rel_tol=_REL),
        Case(f"prefill_seconds({_7B_STEP}, 4096, 8, {_H100})", rel_tol=_REL),
        Case(f"prefill_seconds({_70B_STEP}, 2000, 4, 8 * 989.4e12, 8 * 3.35e12)", rel_tol=_REL),
        Case(f"prefill_seconds({_70B_STEP}, 2000, 4, 1978.9e12, 4.8e12, bytes_per_param=1)",
             rel_tol=_REL),  # one H200, W8A8 fp8
        Case(f"prefill_seconds({_7B_STEP}, 1, 1, {_H100}, bytes_per_param=0.5)", rel_tol=_REL),
        Case("prefill_seconds(1e6, 3, 4, 2e12, 1e9, bytes_per_param=4)", rel_tol=_REL),
        Case("prefill_seconds(1000, 5, 2, 1000, 100)", rel_tol=_REL),  # both bounds: 20 s each
        raises("prefill_seconds(7e9, 0, 1, 989.4e12, 3.35e12)", "ValueError"),
        raises("prefill_seconds(7e9, 1000, 0, 989.4e12, 3.35e12)", "ValueError"),
        raises("prefill_seconds(0, 1000, 1, 989.4e12, 3.35e12)", "ValueError"),
        raises("prefill_seconds(7e9, 1000, 1, 989.4e12, -3.35e12)", "ValueError"),
        raises("prefill_seconds(7e9, 1000, 1, math.inf, 3.35e12)", "ValueError"),
        raises("prefill_seconds(7e9, 1000, 1, 989.4e12, 3.35e12, bytes_per_param=0)",
               "ValueError"),
        raises("prefill_seconds(7e9, 1000.0, 1, 989.4e12, 3.35e12)", "TypeError"),
        raises("prefill_seconds(7e9, 1000, True, 989.4e12, 3.35e12)", "TypeError"),
        raises("prefill_seconds(7e9, 1000, 1, '989.4e12', 3.35e12)", "TypeError"),
    ],
    "simulate_serving": [
        Case("simulate_serving([(0, 2, 3), (0, 1, 2), (1, 2, 1)], 2, 0.5, 1.0, 'static')",
             rel_tol=_REL),  # the exercise's example
        Case("simulate_serving([(0, 2, 3), (0, 1, 2), (1, 2, 1)], 2, 0.5, 1.0, 'continuous')",
             rel_tol=_REL),
        Case(f"simulate_serving({_FOUR}, 2, {_SERVE}, 'static')", rel_tol=_REL),
        Case(f"simulate_serving({_FOUR}, 2, {_SERVE}, 'continuous')", rel_tol=_REL),
        Case(f"simulate_serving({_FOUR}, 1, {_SERVE}, 'static')", rel_tol=_REL),
        Case(f"simulate_serving({_FOUR}, 1, {_SERVE}, 'continuous')", rel_tol=_REL),
        Case(f"simulate_serving({_FOUR}, 8, {_SERVE}, 'continuous')", rel_tol=_REL),
        # listed out of order: admission goes by arrival
        Case(f"simulate_serving([(2, 1, 2), (0, 1, 2)], 1, {_SERVE}, 'static')", rel_tol=_REL),
        # an idle server waits for the next arrival
        Case(f"simulate_serving([(0, 2, 2), (10, 2, 2)], 2, {_SERVE}, 'continuous')",
             rel_tol=_REL),
        # equal requests all at once: both policies run the same batches
        Case(f"simulate_serving([(0, 3, 4)] * 5, 2, {_SERVE}, 'static')", rel_tol=_REL),
        Case(f"simulate_serving([(0, 3, 4)] * 5, 2, {_SERVE}, 'continuous')", rel_tol=_REL),
        # one-token requests only: no decode step, no time per output token (nan)
        Case(f"simulate_serving([(0, 4, 1), (0, 2, 1), (3, 1, 1)], 2, {_SERVE}, 'static')",
             rel_tol=_REL),
        Case(f"simulate_serving({_STREAM}, 3, {_LLAMA_SERVE}, 'static')", rel_tol=1e-9),
        Case(f"simulate_serving({_STREAM}, 3, {_LLAMA_SERVE}, 'continuous')", rel_tol=1e-9),
        raises(f"simulate_serving([], 2, {_SERVE}, 'static')", "ValueError"),
        raises(f"simulate_serving([(0, 2)], 2, {_SERVE}, 'static')", "ValueError"),
        raises(f"simulate_serving([(-1, 2, 2)], 2, {_SERVE}, 'static')", "ValueError"),
        raises(f"simulate_serving([(math.nan, 2, 2)], 2, {_SERVE}, 'continuous')", "ValueError"),
        raises(f"simulate_serving([(0, 2, 2), (1, 0, 2)], 2, {_SERVE}, 'static')",
               "ValueError"),
        raises(f"simulate_serving([(0, 2, 0)], 2, {_SERVE}, 'continuous')", "ValueError"),
        raises(f"simulate_serving([(0, 2.5, 2)], 2, {_SERVE}, 'static')", "ValueError"),
        raises(f"simulate_serving([(0, 2, True)], 2, {_SERVE}, 'static')", "ValueError"),
        raises(f"simulate_serving([(0, 2, 2)], 2, {_SERVE}, 'first come')", "ValueError"),
        raises(f"simulate_serving([(0, 2, 2)], 0, {_SERVE}, 'static')", "ValueError"),
        raises("simulate_serving([(0, 2, 2)], 2, 0, 1.0, 'static')", "ValueError"),
        raises("simulate_serving([(0, 2, 2)], 2, 0.25, math.inf, 'continuous')", "ValueError"),
        raises(f"simulate_serving([(0, 2, 2)], 2.0, {_SERVE}, 'static')", "TypeError"),
        raises("simulate_serving([(0, 2, 2)], 2, None, 1.0, 'static')", "TypeError"),
    ],
    # the graded prediction, within 1%: the lesson's point is that the cache holds P + n - 1
    # tokens (section 1's rule, restated with the question), so counting the last new token
    # too (1 / (P + n - 1) more: 2.1% for the default's 47 tokens, 1.8% to 2.6% for the others,
    # VARIANTS below) misses, as do forgetting the values (half), the batch (B of 4 to 8) or
    # float32 (bf16: half)
    "predicted_cache_bytes_after_generation": [
        Case("float(predicted_cache_bytes_after_generation)", rel_tol=0.01)],
}

# Each student's generation for the graded prediction: prompt tokens, new tokens, sequences. In
# every one the cache holds 39 to 55 tokens, so one token more or less is 1.8% to 2.6% off,
# outside the band of 1%, and the batch is at least 4. The answers, 385,024 bytes for the
# default (which the lesson's cells after the prediction measure), 159,744, 313,344, 281,600
# and 336,896, are more than 1% apart. tests/test_inference.py runs each one's generation and
# measures its cache.
VARIANTS = {
    "predicted_cache_bytes_after_generation": Variants(
        ("n_prompt", "n_new", "n_sequences"),
        ((16, 32, 8), (24, 16, 4), (12, 40, 6), (32, 24, 5), (20, 28, 7)),
        "{n_sequences} sequences each generate {n_new} new tokens after a prompt of "
        "{n_prompt} tokens"),
}


# Hidden inputs of each student's own (grader/content/variants.py): these two exercises are
# integer products and sums, exact for any input, so shapes drawn anywhere in what the exercise
# accepts (tests/test_inference.py holds them to STATED) need no tolerance, and no answers
# copied from another student's checks, or written out for the fixed ones, pass them.
def _drawn_kv_cache_bytes(rng: random.Random) -> list[str]:
    """Three caches of a model of the size of today's: a dtype of 1, 2 or 4 bytes each."""
    calls = []
    for element in (", bytes_per_element=1", "", ", bytes_per_element=4"):
        calls.append(f"kv_cache_bytes({rng.randint(1, 128)}, {rng.choice((1, 2, 4, 8, 16, 32, 64))}"
                     f", {rng.choice((32, 64, 80, 96, 128, 256))}, {rng.randint(0, 131072)}, "
                     f"{rng.randint(1, 64)}{element})")
    return calls


def _drawn_generate_flops(rng: random.Random) -> list[str]:
    """Three generations: with the cache, without it, and with an MLP width of its own."""
    def shape() -> str:
        return (f"{rng.randint(1, 48)}, {64 * rng.randint(1, 64)}, {rng.randint(2, 128000)}, "
                f"{rng.randint(1, 4096)}, {rng.randint(1, 1024)}")

    return [f"generate_flops({shape()})", f"generate_flops({shape()}, kv_cache=False)",
            f"generate_flops({shape()}, d_ff={rng.randint(1, 30000)}, "
            f"kv_cache={rng.choice((True, False))})"]


DRAWN = {"kv_cache_bytes": _drawn_kv_cache_bytes, "generate_flops": _drawn_generate_flops}
