"""Lesson 08's serving half (solutions/inference.py's prefill_seconds and simulate_serving,
solutions/serving.py's given code) against independent oracles: lesson 03's roofline,
FlopCounterMode around the lesson's model, timelines worked by hand, a second implementation of
the scheduler in exact fractions, and properties the two policies must share."""

from __future__ import annotations

import itertools
import json
import math
import operator
from collections import deque
from fractions import Fraction
from pathlib import Path

import pytest
import torch
from einops import einsum, rearrange
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils.flop_counter import FlopCounterMode

from solutions import inference
from solutions.backprop import model_params
from solutions.flops import ridge_point, roofline
from solutions.inference import (
    decode_tokens_per_second,
    kv_cache_bytes,
    max_batch_size,
    prefill_seconds,
    simulate_serving,
)
from solutions.kv_cache import KVCache, cached_forward
from solutions.serving import (
    decode_params,
    prefill_flops_as_served,
    request_stream,
    serving_budget,
    serving_timeline,
    summary,
)
from solutions.tiny_transformer import TinyTransformer, rms_norm

DATA = Path(__file__).resolve().parent.parent / "data"
MODELS = json.loads((DATA / "models.json").read_text())["models"]
H100 = json.loads((DATA / "hardware.json").read_text())["accelerators"]["H100 SXM"]
KEYS = ["tokens_per_second", "mean_time_to_first_token", "mean_time_per_output_token",
        "mean_latency"]


def tiny(n_layers: int = 2, d_model: int = 16, n_heads: int = 4, vocab_size: int = 50,
         tied: bool = False) -> TinyTransformer:
    torch.manual_seed(0)
    return TinyTransformer(vocab_size, d_model, n_layers, n_heads, tied_embeddings=tied)


def counted(fn) -> int:
    with FlopCounterMode(display=False) as counter:
        fn()
    return counter.get_total_flops()


# ---------------------------------------------------------------- the N of a forward pass


@pytest.mark.parametrize("tied", [False, True], ids=["untied", "tied"])
def test_a_decode_step_multiplies_every_parameter_but_the_input_embedding(tied) -> None:
    """FlopCounterMode around one decode step of the lesson's model: the step's FLOPs less its
    attention's are 2 x (parameters - the input embedding) per sequence when the embeddings are
    untied; tied, the one matrix is multiplied as the unembedding, so all of them."""
    model = tiny(tied=tied)
    n_layers, d, vocab, batch, context = 2, 16, 50, 3, 7
    cache = KVCache(model, batch, context + 1)
    cache.length = context
    with torch.no_grad():
        flops = counted(lambda: cached_forward(model, torch.zeros(batch, 1, dtype=torch.long),
                                               cache))
    attention = batch * n_layers * 4 * (context + 1) * d  # one query against context + 1 keys
    params = sum(p.numel() for p in model.parameters())
    embedding = 0 if tied else vocab * d
    assert flops - attention == 2 * (params - embedding) * batch
    shape = {"n_layers": n_layers, "d_model": d, "n_heads": 4, "n_kv_heads": 4, "d_ff": 4 * d,
             "mlp_matrices": 2, "vocab_size": vocab, "tied_embeddings": tied}
    assert decode_params(shape) == params - embedding and model_params(shape) == params


@settings(deadline=None, max_examples=15)
@given(st.integers(1, 6), st.integers(1, 40))  # two keys or more: see test_inference.py
def test_attentions_decode_intensity_is_the_group_size_whatever_the_batch(batch, context):
    """FlopCounterMode's attention FLOPs of a decode step over the cache bytes it reads: 2g/b,
    here g = 1 (multi-head) and b = 4 (float32): 0.5 at every batch and context."""
    model = tiny()
    cache = KVCache(model, batch, context + 1)
    cache.length = context
    with torch.no_grad():
        flops = counted(lambda: cached_forward(model, torch.zeros(batch, 1, dtype=torch.long),
                                               cache))
    weights = 2 * (sum(p.numel() for p in model.parameters()) - 50 * 16) * batch
    read = kv_cache_bytes(2, 4, 4, context + 1, batch, 4)  # the keys it attends to
    assert Fraction(flops - weights, read) == Fraction(2 * 1, 4)
    assert MODELS["Llama 3 70B"]["n_heads"] // MODELS["Llama 3 70B"]["n_kv_heads"] == 8


@torch.no_grad()
def served_prefill(model: TinyTransformer, prompt: torch.Tensor) -> torch.Tensor:
    """A prefill as a serving engine runs it: query i multiplied by keys 0..i only (the causal
    half, nothing masked), logits at the last position only."""
    x = model.embedding(prompt)
    for block in model.blocks:
        attn, h = block.attn, rms_norm(x)
        q, k, v = (rearrange(p(h), "b s (n d) -> b n s d", n=attn.n_heads)
                   for p in (attn.q, attn.k, attn.v))
        rows = []
        for i in range(prompt.shape[1]):
            scores = einsum(q[:, :, i:i + 1], k[:, :, :i + 1],
                            "b n q d, b n k d -> b n q k") / math.sqrt(q.shape[-1])
            rows.append(einsum(scores.softmax(-1), v[:, :, :i + 1], "b n q k, b n k d -> b n q d"))
        x = x + attn.o(rearrange(torch.cat(rows, dim=2), "b n s d -> b s (n d)"))
        x = x + block.mlp(rms_norm(x))
    return model.unembedding(rms_norm(x[:, -1:]))


def test_a_prefill_as_served_is_what_an_engine_like_prefill_counts() -> None:
    """prefill_flops_as_served against FlopCounterMode around ``served_prefill``; and the two
    ways give the same last logits (float64)."""
    model = tiny().to(torch.float64)
    # The first query's weighted sum runs over one key: torch.einsum makes that an elementwise
    # product, which FlopCounterMode does not count: 2·d FLOPs per layer and sequence.
    missed = 2 * 2 * (2 * 16)  # 2 sequences, 2 layers
    for prompt_len in (3, 6, 11):
        prompt = torch.randint(0, 50, (2, prompt_len), generator=torch.Generator().manual_seed(1))
        got = counted(lambda prompt=prompt: served_prefill(model, prompt))
        assert got + missed == 2 * prefill_flops_as_served(2, 16, 50, prompt_len)
        assert torch.allclose(served_prefill(model, prompt)[:, 0], model(prompt)[:, -1],
                              rtol=1e-12, atol=1e-12)


def test_a_prefills_weights_cost_2n_per_token() -> None:
    """FlopCounterMode around the lesson's prefill of B prompts of P tokens: less its attention,
    2 x decode_params x P x B, the FLOPs ``prefill_seconds`` divides by the peak."""
    model = tiny()
    batch, prompt_len = 3, 5
    prompt = torch.zeros(batch, prompt_len, dtype=torch.long)
    with torch.no_grad():
        flops = counted(lambda: cached_forward(model, prompt, KVCache(model, batch, prompt_len)))
    attention = batch * 2 * 4 * prompt_len * prompt_len * 16
    n_step = sum(p.numel() for p in model.parameters()) - 50 * 16
    assert flops - attention == 2 * n_step * prompt_len * batch


# ---------------------------------------------------------------- prefill_seconds


def prefill_seconds_by_roofline(n_params, prompt_len, batch_size, peak_flops, bandwidth,
                                bytes_per_param=2):
    """Lesson 03's roofline at the prefill's intensity, 2·P·B / bytes_per_param."""
    flops = 2 * n_params * prompt_len * batch_size
    return flops / roofline(flops / (n_params * bytes_per_param), peak_flops, bandwidth)


def prefill_seconds_as_tokens(n_params, prompt_len, batch_size, peak_flops, bandwidth,
                              bytes_per_param=2):
    """Its tokens over the slower of two rates: the peak's tokens per second, and all of them
    in one read of the weights."""
    tokens = prompt_len * batch_size
    rate = min(peak_flops / (2 * n_params), tokens * bandwidth / (n_params * bytes_per_param))
    return tokens / rate


@given(st.floats(1e6, 1e12), st.integers(1, 10**5), st.integers(1, 512), st.floats(1e12, 1e16),
       st.floats(1e9, 1e13), st.sampled_from([0.5, 1, 2, 4]))
def test_prefill_seconds_is_the_roofline_of_a_step_of_p_times_b_tokens(n, p, b, peak, bw, per):
    seconds = prefill_seconds(n, p, b, peak, bw, per)
    assert type(seconds) is float
    for other in (prefill_seconds_by_roofline, prefill_seconds_as_tokens):
        assert math.isclose(other(n, p, b, peak, bw, per), seconds, rel_tol=1e-13)
    # a prefill of P·B tokens is a decode step of P·B sequences with nothing cached
    assert math.isclose(seconds, p * b / decode_tokens_per_second(n, p * b, 0, 1, peak, bw, per),
                        rel_tol=1e-12)
    # compute-bound exactly when its intensity, 2·P·B / bytes_per_param, reaches the ridge
    compute = 2 * n * p * b / peak
    if not math.isclose(2 * p * b / per, ridge_point(peak, bw), rel_tol=1e-9):
        assert (seconds == compute) == (2 * p * b / per > ridge_point(peak, bw))


def test_prefill_seconds_of_llama_2_7b_on_an_h100() -> None:
    """Section 9: a prompt of a few hundred tokens passes the ridge (295); the exercise's
    example, 14 ms, and the 4 ms of reading 14 GB."""
    n7 = decode_params(MODELS["Llama 2 7B"])
    peak, bw = H100["peak_flops"]["bf16"], H100["memory_bandwidth"]
    assert prefill_seconds(n7, 294, 1, peak, bw) == 2 * n7 / bw  # one read of the weights
    assert prefill_seconds(n7, 296, 1, peak, bw) == 2 * n7 * 296 / peak
    assert prefill_seconds(7e9, 1000, 1, 989.4e12, 3.35e12) == 0.014149989892864362
    assert round(14e9 / 3.35e12 * 1e3) == 4


@pytest.mark.parametrize(("call", "error", "words"), [
    (lambda: prefill_seconds(7e9, 0, 1, 1e15, 1e12), ValueError, "prompt_len must be >= 1"),
    (lambda: prefill_seconds(7e9, 10, 0, 1e15, 1e12), ValueError, "batch_size must be >= 1"),
    (lambda: prefill_seconds(7e9, 10, 1, math.nan, 1e12), ValueError, "peak_flops must be"),
    (lambda: prefill_seconds(7e9, 10.0, 1, 1e15, 1e12), TypeError, "prompt_len must be an int"),
    (lambda: prefill_seconds(7e9, 10, 1, 1e15, "1e12"), TypeError, "bandwidth must be a number"),
    (lambda: simulate_serving([], 2, 0.5, 1.0, "static"), ValueError, "non-empty list"),
    (lambda: simulate_serving(((0, 1, 1),), 2, 0.5, 1.0, "fifo"), ValueError, "policy"),
    (lambda: simulate_serving([(0, 1)], 2, 0.5, 1.0, "static"), ValueError, "a request is"),
    (lambda: simulate_serving([(math.inf, 1, 1)], 2, 0.5, 1.0, "static"), ValueError,
     "arrival_seconds must be a finite number >= 0"),
    (lambda: simulate_serving([(0, 1, 0)], 2, 0.5, 1.0, "static"), ValueError,
     "new_tokens must be an integer >= 1"),
    (lambda: simulate_serving([(0, False, 1)], 2, 0.5, 1.0, "static"), ValueError,
     "prompt_len must be an integer >= 1"),
    (lambda: simulate_serving([(0, 1, 1)], 0, 0.5, 1.0, "static"), ValueError,
     "max_batch must be >= 1"),
    (lambda: simulate_serving([(0, 1, 1)], 1, 0.5, 0.0, "static"), ValueError,
     "decode_seconds_per_step must be a finite number > 0"),
    (lambda: simulate_serving([(0, 1, 1)], 1.5, 0.5, 1.0, "static"), TypeError,
     "max_batch must be an integer"),
])
def test_bad_input_is_named(call, error, words) -> None:
    with pytest.raises(error, match=words):
        call()


# ---------------------------------------------------------------- simulate_serving by hand

EXAMPLE = [(0, 2, 3), (0, 1, 2), (1, 2, 1)]  # A, B, C: the exercise's example
FOUR = [(0, 4, 3), (0, 2, 1), (0.5, 4, 2), (0.5, 2, 4)]  # R0..R3: grader/content/cases/inference.py


def averages(requests, first, finish) -> dict[str, float]:
    """The four averages from times worked by hand."""
    new = [n for _, _, n in requests]
    arrivals = [a for a, _, _ in requests]
    per_output = [(f - t) / (n - 1) for t, f, n in zip(first, finish, new, strict=True) if n > 1]
    return {"tokens_per_second": sum(new) / (max(finish) - min(arrivals)),
            "mean_time_to_first_token": sum(map(operator.sub, first, arrivals)) / len(new),
            "mean_time_per_output_token": sum(per_output) / len(per_output) if per_output
            else math.nan,
            "mean_latency": sum(map(operator.sub, finish, arrivals)) / len(new)}


def assert_same(got: dict, expected: dict, rel_tol: float = 1e-12) -> None:
    assert list(got) == KEYS and all(type(v) is float for v in got.values())
    for key in KEYS:
        if math.isnan(expected[key]):
            assert math.isnan(got[key]), key
        else:
            assert math.isclose(got[key], expected[key], rel_tol=rel_tol), (key, got, expected)


@pytest.mark.parametrize(("requests", "max_batch", "policy", "first", "finish"), [
    # The example, 0.5 s per prompt token, 1 s per step, 2 slots. Static: at 0 A and B have
    # arrived: A's prefill 0-1 (first token 1), B's 1-1.5 (1.5); steps 1.5-2.5 (A 1 left, B
    # done at 2.5), 2.5-3.5 (A done at 3.5); nothing runs: C (arrived at 1) 3.5-4.5, done.
    (EXAMPLE, 2, "static", [1.0, 1.5, 4.5], [3.5, 2.5, 4.5]),
    # Continuous: the same until B leaves at 2.5; then C takes its slot: prefill 2.5-3.5 (one
    # token: done); A's second step 3.5-4.5.
    (EXAMPLE, 2, "continuous", [1.0, 1.5, 3.5], [4.5, 2.5, 3.5]),
    # FOUR, 0.25 s per prompt token, 1 s per step, 2 slots. Static: at 0 R0 and R1 have arrived
    # (R2 and R3 come at 0.5): R0 0-1, R1 1-1.5 (one token: done); steps 1.5-2.5 and 2.5-3.5
    # (R0 done); then R2 3.5-4.5, R3 4.5-5; steps 5-6 (R2 done), 6-7, 7-8 (R3 done).
    (FOUR, 2, "static", [1.0, 1.5, 4.5, 5.0], [3.5, 1.5, 6.0, 8.0]),
    # Continuous: R0 0-1, R1 1-1.5; R2 and R3 arrived during those prefills, so they wait for
    # the next admission, before the second step: step 1.5-2.5; R2 2.5-3.5; step 3.5-4.5 (R0
    # and R2 done); R3 4.5-5; steps 5-6, 6-7, 7-8.
    (FOUR, 2, "continuous", [1.0, 1.5, 3.5, 5.0], [4.5, 1.5, 4.5, 8.0]),
    # One slot: one request at a time in arrival order, either policy: R0 0-1, steps to 3;
    # R1 3-3.5; R2 3.5-4.5, step to 5.5; R3 5.5-6, three steps to 9.
    (FOUR, 1, "static", [1.0, 3.5, 4.5, 6.0], [3.0, 3.5, 5.5, 9.0]),
    (FOUR, 1, "continuous", [1.0, 3.5, 4.5, 6.0], [3.0, 3.5, 5.5, 9.0]),
    # Listed out of order: the request arriving at 0 goes first. 0.25 s per prompt token.
    ([(2, 1, 2), (0, 1, 2)], 1, "static", [2.25, 0.25], [3.25, 1.25]),
    # An idle server waits: 0-0.5 prefill, 0.5-1.5 step; idle to 10; 10-10.5, 10.5-11.5.
    ([(0, 2, 2), (10, 2, 2)], 2, "continuous", [0.5, 10.5], [1.5, 11.5]),
    # One-token requests only: no step at all, and no time per output token.
    ([(0, 4, 1), (0, 2, 1), (3, 1, 1)], 2, "static", [1.0, 1.5, 3.25], [1.0, 1.5, 3.25]),
])
def test_simulate_serving_gives_the_timelines_worked_by_hand(requests, max_batch, policy, first,
                                                              finish) -> None:
    per_token = 0.5 if requests is EXAMPLE else 0.25
    expected = averages(requests, first, finish)
    assert_same(simulate_serving(requests, max_batch, per_token, 1.0, policy), expected)
    timeline = serving_timeline(requests, max_batch, per_token, 1.0, policy)
    assert [r["first_token"] for r in timeline] == first
    assert [r["finish"] for r in timeline] == finish


def test_the_exercises_example_as_the_text_gives_it() -> None:
    static = simulate_serving(EXAMPLE, 2, 0.5, 1.0, "static")
    continuous = simulate_serving(EXAMPLE, 2, 0.5, 1.0, "continuous")
    assert static == {"tokens_per_second": 1.3333333333333333, "mean_time_to_first_token": 2.0,
                      "mean_time_per_output_token": 1.125, "mean_latency": 3.1666666666666665}
    assert continuous == {"tokens_per_second": 1.3333333333333333,
                          "mean_time_to_first_token": 1.6666666666666667,
                          "mean_time_per_output_token": 1.375,
                          "mean_latency": 3.1666666666666665}
    # "C's first token comes 1 s sooner" (A's and B's come when they did)
    assert math.isclose(3 * (static["mean_time_to_first_token"]
                             - continuous["mean_time_to_first_token"]), 1, rel_tol=1e-12)


# ---------------------------------------------------------------- a second implementation


def simulate_in_fractions(requests, max_batch, prefill_seconds_per_token,
                          decode_seconds_per_step, policy):
    """The exercise's rules written again, apart from the reference: a row of slots, a queue in
    arrival order, every time an exact fraction (rounded once, at the end)."""
    per_token, per_step = Fraction(prefill_seconds_per_token), Fraction(decode_seconds_per_step)
    queue = deque(sorted(range(len(requests)), key=lambda i: (requests[i][0], i)))
    slots: list[list[int] | None] = [None] * max_batch
    first, finish = [Fraction(0)] * len(requests), [Fraction(0)] * len(requests)
    now = Fraction(0)
    while queue or any(slots):
        if not any(slots) and Fraction(requests[queue[0]][0]) > now:
            now = Fraction(requests[queue[0]][0])
        if policy == "continuous" or not any(slots):
            opened = now
            for k in range(max_batch):
                if slots[k] is None and queue and Fraction(requests[queue[0]][0]) <= opened:
                    i = queue.popleft()
                    now += requests[i][1] * per_token
                    first[i] = finish[i] = now
                    slots[k] = [i, requests[i][2] - 1] if requests[i][2] > 1 else None
        if any(slots):
            now += per_step
            for k, slot in enumerate(slots):
                if slot is not None:
                    slot[1] -= 1
                    finish[slot[0]] = now
                    slots[k] = slot if slot[1] else None
    new = [n for _, _, n in requests]
    arrivals = [Fraction(a) for a, _, _ in requests]
    start = min(arrivals)
    per_output = [(f - t) / (n - 1) for t, f, n in zip(first, finish, new, strict=True) if n > 1]
    return {"tokens_per_second": float(sum(new) / (max(finish) - start)),
            "mean_time_to_first_token": float(sum(map(operator.sub, first, arrivals)) / len(new)),
            "mean_time_per_output_token": float(sum(per_output) / len(per_output))
            if per_output else math.nan,
            "mean_latency": float(sum(map(operator.sub, finish, arrivals)) / len(new))}


requests_strategy = st.lists(
    st.tuples(st.integers(0, 20).map(lambda k: k / 2), st.integers(1, 6), st.integers(1, 6)),
    min_size=1, max_size=12)
times = st.sampled_from([0.125, 0.25, 0.5, 1.0, 2.0])


@given(requests_strategy, st.integers(1, 5), times, times, st.sampled_from(["static",
                                                                            "continuous"]))
def test_simulate_serving_agrees_with_a_second_implementation(requests, max_batch, per_token,
                                                              per_step, policy) -> None:
    expected = simulate_in_fractions(requests, max_batch, per_token, per_step, policy)
    assert_same(simulate_serving(requests, max_batch, per_token, per_step, policy), expected)
    # the given timeline schedules the same way
    assert_same(summary(serving_timeline(requests, max_batch, per_token, per_step, policy)),
                expected)


@given(requests_strategy, times, times)
def test_with_one_slot_static_and_continuous_batching_agree(requests, per_token, per_step):
    assert_same(simulate_serving(requests, 1, per_token, per_step, "static"),
                simulate_serving(requests, 1, per_token, per_step, "continuous"))


@given(st.integers(1, 6), st.integers(1, 6), st.integers(1, 20), st.integers(1, 6),
       st.floats(0, 100), times, times)
def test_equal_requests_arriving_together_are_served_alike_by_both(prompt, new, n, max_batch,
                                                                   arrival, per_token, per_step):
    requests = [(arrival, prompt, new)] * n
    static = simulate_serving(requests, max_batch, per_token, per_step, "static")
    assert_same(simulate_serving(requests, max_batch, per_token, per_step, "continuous"), static)
    # batches of max_batch, each prefilled one by one, then new - 1 steps
    batches = [min(max_batch, n - k) for k in range(0, n, max_batch)]
    assert math.isclose(static["tokens_per_second"] * sum(b * prompt * per_token + (new - 1)
                                                          * per_step for b in batches),
                        n * new, rel_tol=1e-12)


@given(requests_strategy, st.integers(1, 5), times, times, st.sampled_from(["static",
                                                                            "continuous"]))
def test_no_request_is_served_faster_than_alone(requests, max_batch, per_token, per_step, policy):
    """Each request's latency is at least its own prefill and its own steps; the tokens per
    second never exceed max_batch tokens per step."""
    timeline = serving_timeline(requests, max_batch, per_token, per_step, policy)
    for (arrival, prompt, new), r in zip(requests, timeline, strict=True):
        assert r["first_token"] - arrival >= prompt * per_token
        assert r["finish"] - r["first_token"] >= (new - 1) * per_step
        assert sum(kind == "decode" for _, _, kind in r["spans"]) == new - 1
    # prefills run alone, one after another, after the first arrival
    served = simulate_serving(requests, max_batch, per_token, per_step, policy)
    assert served["tokens_per_second"] <= sum(n for *_, n in requests) / (
        sum(p for _, p, _ in requests) * per_token)


# ---------------------------------------------------------------- chunked prefill


@given(requests_strategy, st.integers(1, 5), times, times, st.integers(1, 12))
def test_a_chunked_timeline_steps_at_the_roofline_and_prefills_every_prompt(requests, max_batch,
                                                                            per_token, per_step,
                                                                            chunk) -> None:
    timeline = serving_timeline(requests, max_batch, per_token, per_step, "chunked", chunk)
    steps = sorted({(start, end) for r in timeline for start, end, _ in r["spans"]})
    for (_, end), (next_start, _) in itertools.pairwise(steps):
        assert end <= next_start  # one step at a time
    for (arrival, prompt, new), r in zip(requests, timeline, strict=True):
        prefills = [s for s in r["spans"] if s[2] == "prefill"]
        decodes = [s for s in r["spans"] if s[2] == "decode"]
        assert prefills[0][0] >= arrival and r["first_token"] == prefills[-1][1]
        assert len(prefills) >= math.ceil(prompt / chunk) and len(decodes) == new - 1
        assert r["finish"] == (decodes[-1][1] if decodes else r["first_token"])
        for start, end, _ in r["spans"]:  # a step takes at least a decode step
            assert end - start >= per_step


@given(requests_strategy, times)
def test_chunked_prefill_with_room_for_every_prompt_and_one_slot_is_continuous(requests, step):
    """One slot, and every prompt in one chunk that takes longer than a decode step: each
    prefill step is that prompt alone, at its prompt's time, as in simulate_serving."""
    per_token = step  # every prompt of >= 1 token takes >= one step
    chunked = summary(serving_timeline(requests, 1, per_token, step, "chunked", 6))
    assert_same(chunked, simulate_serving(requests, 1, per_token, step, "continuous"))


# ---------------------------------------------------------------- other correct answers
# Implementations a student may write that must score full marks within the hidden checks'
# tolerances (tests/test_portability.py's ALTERNATIVES["08_inference"] should name them).

ALTERNATIVES = {
    "prefill_seconds": [prefill_seconds_by_roofline, prefill_seconds_as_tokens],
    "simulate_serving": [simulate_in_fractions],
}


def test_the_other_correct_answers_pass_every_hidden_check() -> None:
    from grader.content.cases.inference import CASES
    from tests.grading_helpers import assert_alternatives_pass_hidden_checks

    assert_alternatives_pass_hidden_checks(ALTERNATIVES, inference, CASES)


# ---------------------------------------------------------------- the lesson's figures


def test_request_streams_are_seeded_and_cut_to_four_times_their_mean() -> None:
    stream = request_stream(500, 8.0, 500, 200, seed=0)
    assert stream == request_stream(500, 8.0, 500, 200, seed=0)
    assert all(type(a) is float and type(p) is int and type(n) is int for a, p, n in stream)
    assert all(1 <= p <= 2000 and 1 <= n <= 800 for _, p, n in stream)
    assert [a for a, _, _ in stream] == sorted(a for a, _, _ in stream)
    assert 400 < sum(p for _, p, _ in stream) / 500 < 600  # a mean near 500


def test_the_numbers_the_serving_sections_state() -> None:
    """notebooks/08_inference, sections 9-12, computed as the notebook computes them."""
    llama2 = MODELS["Llama 2 7B"]
    n7, n7_stored, k7 = decode_params(llama2), model_params(llama2), 524_288
    peak, bw = H100["peak_flops"]["bf16"], H100["memory_bandwidth"]
    # section 9: batch 1: TTFT 6.8 ms, TPOT 4.1 ms; batch 64: 18 x the tokens, TPOT 14 ms, TTFT
    # 438 ms (prompts of 512, decode at 1024)
    ttft = {b: prefill_seconds(n7, 512, b, peak, bw) for b in (1, 64)}
    tokens = {b: decode_tokens_per_second(n7, b, 1024, k7, peak, bw) for b in (1, 64)}
    assert round(ttft[1] * 1e3, 1) == 6.8 and round(1 / tokens[1] * 1e3, 1) == 4.1
    assert round(tokens[64] / tokens[1]) == 18 and round(64 / tokens[64] * 1e3) == 14
    assert round(ttft[64] * 1e3) == 438
    assert max_batch_size(72e9, n7_stored, 1024, k7) >= 64  # the batches of the plot fit
    # section 10: 512 prompt tokens a step is the lesson's choice, vLLM's V0 default, not V1's
    # (issue 44)
    import nbformat

    from grader.content.lessons import load_lesson
    nb = nbformat.read(load_lesson("08_inference").notebook, as_version=4)
    text = " ".join(" ".join(c.source.split()) for c in nb.cells if c.cell_type == "markdown")
    assert "here is 512 tokens a step, the lesson's choice" in text
    assert "its V0 engine defaulted to 512" in text and "8192 for the OpenAI-compatible" in text
    assert "16384 for the offline `LLM` class" in text
    assert "512 a step, vLLM's `max_num_batched_tokens`" not in text
    assert serving_timeline.__defaults__ == (512,)
    # section 10: 13.4 µs per prompt token, a step of 3 at 1024: 4.4 ms; about 300 prompt
    # tokens fit in a decode step's time
    per_token = prefill_seconds(n7, 4096, 1, peak, bw) / 4096
    assert math.isclose(per_token, 2 * n7 / peak, rel_tol=1e-12)
    step_3 = 3 / decode_tokens_per_second(n7, 3, 1024, k7, peak, bw)
    assert round(per_token * 1e6, 1) == 13.4 and round(step_3 * 1e3, 1) == 4.4
    assert round(step_3 / per_token, -2) == 300 and round(ridge_point(peak, bw), -2) == 300
    few = [(0.0, 600, 6), (0.0, 300, 3), (0.004, 1800, 4), (0.006, 200, 7), (0.015, 700, 3),
           (0.020, 400, 4)]
    lines = {p: serving_timeline(few, 3, per_token, step_3, p, 512)
             for p in ("static", "continuous", "chunked")}
    means = {p: summary(line) for p, line in lines.items()}
    static, continuous = lines["static"], lines["continuous"]
    # static: B is done after 2 steps, C (waiting since 4 ms) starts when A is done
    assert sum(kind == "decode" for *_, kind in static[1]["spans"]) == 2
    assert static[2]["spans"][0][0] == static[0]["finish"] > static[1]["finish"]
    # continuous: while C's 1800 tokens are prefilled (24 ms), A and B get no token
    c_start, c_end, _ = continuous[2]["spans"][0]
    assert round((c_end - c_start) * 1e3) == 24
    for r in continuous[:2]:
        assert not any(c_start < end and start < c_end for start, end, _ in r["spans"])
        assert r["spans"][0][1] <= c_start and r["spans"][-1][0] >= c_end  # waiting across
    # mean latency hardly improves; chunked is the lowest in latency and time per token
    assert abs(means["continuous"]["mean_latency"] / means["static"]["mean_latency"] - 1) < 0.01
    for key in ("mean_latency", "mean_time_per_output_token"):
        assert means["chunked"][key] == min(m[key] for m in means.values())
    # the stream: 16 slots, a step at a context of 600 (5.4 ms); 2800 tokens at most, 39 fit
    step_16 = 16 / decode_tokens_per_second(n7, 16, 600, k7, peak, bw)
    assert round(step_16 * 1e3, 1) == 5.4 and 4 * 500 + 4 * 200 == 2800
    assert max_batch_size(serving_budget(80e9), n7_stored, 2800, k7) == 39
    served = {}
    for rate in (2, 4, 8, 12, 16):
        stream = request_stream(150, rate, 500, 200, seed=0)
        served[rate] = {p: simulate_serving(stream, 16, per_token, step_16, p)
                        for p in ("static", "continuous")}
    static_most = max(s["static"]["tokens_per_second"] for s in served.values())
    assert 850 < static_most < 950  # "at most about 900 tokens per second"
    assert served[16]["continuous"]["tokens_per_second"] > 2 * served[16]["static"][
        "tokens_per_second"]
    assert served[8]["static"]["mean_time_to_first_token"] > 1  # seconds
    assert served[8]["continuous"]["mean_time_to_first_token"] < 0.1  # milliseconds
    # section 11's things to try
    h100 = H100
    from solutions.inference_explorer import serving_plan
    assert serving_plan(llama2, h100, 1, 1, 4096)["max_batch"] == 27
    assert serving_plan(llama2, h100, 1, 1, 4096, cache_dtype="fp8")["max_batch"] == 54
    assert round(2 * n7 / (128 * k7)) == 197
    w8a8 = serving_plan(llama2, h100, 1, 1, 4096, "fp8 (W8A8)")
    weights_only = serving_plan(llama2, h100, 1, 1, 4096, "fp8, weights only")
    assert math.isclose(w8a8["ridge"], 2 * weights_only["ridge"], rel_tol=1e-3)
    assert w8a8["tokens_per_second"] == weights_only["tokens_per_second"]
    # the prefill's weights at twice the peak, its attention (8% more FLOPs) at bf16's
    assert round(weights_only["time_to_first_token"] / w8a8["time_to_first_token"], 1) == 1.9
