"""Lesson 08's given serving code: the conventions behind its numbers, and a server's timeline.

- ``decode_params``: the parameters a forward pass multiplies, the N of every decode and prefill
  count of the lesson (the input embedding is a lookup, lesson 04; a tied one is multiplied
  once, as the unembedding).
- ``MEMORY_RESERVE``: the share of a GPU's memory that the lesson keeps back from the weights
  and the caches, and ``serving_budget``, what is left of the label's bytes.
- ``prefill_flops_as_served``: a prefill counted as serving engines run it (the last position's
  logits only, the causal half of the score square), beside ``generate_flops``' convention.
- ``attention_decode_intensity`` and ``mla_cache_bytes``: attention's own FLOPs per byte in a
  decode step, and the cache of multi-head latent attention (DeepSeek-V2), beside
  ``kv_cache_bytes`` for MHA, GQA and MQA.
- ``serving_timeline``: the scheduler of ``solutions.inference.simulate_serving``, request by
  request and span by span, with a third policy, continuous batching with chunked prefill, for
  the lesson's timeline; ``summary`` turns a timeline into ``simulate_serving``'s averages.
- ``request_stream``: a seeded stream of requests whose lengths are drawn from a distribution.
"""

from __future__ import annotations

import math

import numpy as np

from solutions.backprop import model_params

# The share of a GPU's memory (the label's bytes: 80 GB = 80e9) kept back for what a server
# holds beside weights and caches: the CUDA context, NCCL's buffers, the caching allocator's
# partly used blocks and the activations of a step. vLLM keeps the same share back by default
# (gpu_memory_utilization = 0.9 of the total that CUDA reports).
MEMORY_RESERVE = 0.10

# DeepSeek-V2's attention (DeepSeek-AI 2024, "DeepSeek-V2", sections 2.1 and 3.1.2): 60 layers
# of 128 heads of 128; multi-head latent attention caches, per layer and token, one latent of
# 512 numbers and one decoupled rotary key of 64 shared by every head.
DEEPSEEK_V2 = {"n_layers": 60, "n_heads": 128, "head_dim": 128, "kv_latent_dim": 512,
               "rope_head_dim": 64}


def decode_params(shape: dict) -> int:
    """The parameters a forward pass multiplies: ``model_params`` less an untied input
    embedding (V·d), which is a lookup of one row per token, not a matmul."""
    untied = 0 if shape["tied_embeddings"] else shape["vocab_size"] * shape["d_model"]
    return model_params(shape) - untied


def serving_budget(memory_bytes: float, reserve: float = MEMORY_RESERVE) -> float:
    """Bytes left for weights and caches: the label's bytes less the reserve."""
    if not 0 <= reserve < 1:
        raise ValueError(f"reserve must be in [0, 1), got {reserve!r}")
    return memory_bytes * (1 - reserve)


def prefill_flops_as_served(n_layers: int, d_model: int, vocab_size: int, prompt_len: int,
                            d_ff: int | None = None) -> int:
    """Matmul FLOPs of a prefill as serving engines run it: logits at the last position only
    (2·d·V), and a causal kernel that computes, for query i, the i + 1 scores it keeps:
    L·(8·P·d² + 4·P·d·d_ff + 2·P·(P + 1)·d) + 2·d·V."""
    d_ff = 4 * d_model if d_ff is None else d_ff
    weights = 8 * prompt_len * d_model**2 + 4 * prompt_len * d_model * d_ff
    attention = 2 * prompt_len * (prompt_len + 1) * d_model  # 4·d FLOPs per kept score
    return n_layers * (weights + attention) + 2 * d_model * vocab_size


def attention_decode_intensity(n_heads: int, n_kv_heads: int,
                               bytes_per_element: float = 2) -> float:
    """FLOPs per byte of attention in a decode step: per sequence, layer and cached token, the
    query heads do 4·n_heads·head_dim FLOPs (scores and weighted sum) over 2·n_kv_heads·head_dim
    cached numbers. The batch and the context cancel: each sequence reads its own cache."""
    return 4 * n_heads / (2 * n_kv_heads * bytes_per_element)


def mla_cache_bytes(n_layers: int, kv_latent_dim: int, rope_head_dim: int, seq_len: int,
                    batch_size: int, bytes_per_element: int = 2) -> int:
    """Bytes of a multi-head latent attention cache: per layer and token, the latent and the
    shared rotary key, (kv_latent_dim + rope_head_dim) numbers."""
    return n_layers * (kv_latent_dim + rope_head_dim) * seq_len * batch_size * bytes_per_element


def serving_timeline(requests: list[tuple[float, int, int]], max_batch: int,
                     prefill_seconds_per_token: float, decode_seconds_per_step: float,
                     policy: str, chunk_tokens: int = 512) -> list[dict]:
    """Each request's spans of work on one server, as ``simulate_serving`` schedules them.

    ``"static"`` and ``"continuous"`` are ``simulate_serving``'s policies (a prefill runs alone,
    a decode step takes decode_seconds_per_step). ``"chunked"`` admits as ``"continuous"`` does,
    but a prefill does not run alone: each step carries one token of every decoding request and
    up to chunk_tokens - (their number) prompt tokens of the admitted requests still being
    prefilled, first come first served, and takes max(decode_seconds_per_step, its tokens x
    prefill_seconds_per_token), the roofline of a step that reads the weights once. A request
    whose last prompt token is in a step gets its first token at the step's end.

    Returns:
        One dict per request, in the list's order: arrival, first_token, finish (seconds),
        new_tokens, and spans, a list of (start, end, "prefill" or "decode").
    """
    if policy not in ("static", "continuous", "chunked"):
        raise ValueError(f"unknown policy {policy!r}")
    out = [{"arrival": a, "first_token": 0.0, "finish": 0.0, "new_tokens": n, "spans": []}
           for a, _, n in requests]
    waiting = sorted(range(len(requests)), key=lambda i: requests[i][0])  # stable
    prompt_left = {i: requests[i][1] for i in waiting}
    waiting.reverse()  # the next to arrive last: popped first
    decode_left: dict[int, int] = {}  # requests past their prefill -> decode steps to run
    prefilling: list[int] = []  # admitted, prompt not finished ("chunked" only)
    now = 0.0

    def admit(free: int) -> list[int]:
        admitted = []
        while free > len(admitted) and waiting and requests[waiting[-1]][0] <= now:
            admitted.append(waiting.pop())
        return admitted

    def first_token(i: int) -> None:
        out[i]["first_token"] = out[i]["finish"] = now
        if requests[i][2] > 1:
            decode_left[i] = requests[i][2] - 1

    while waiting or decode_left or prefilling:
        if not (decode_left or prefilling) and requests[waiting[-1]][0] > now:
            now = requests[waiting[-1]][0]  # idle until the next arrival
        if policy == "chunked":
            prefilling += admit(max_batch - len(decode_left) - len(prefilling))
            budget, step = chunk_tokens - len(decode_left), []
            for i in prefilling:
                take = min(budget, prompt_left[i])
                if take:
                    step.append((i, take))
                    budget -= take
            tokens = len(decode_left) + sum(take for _, take in step)
            end = now + max(decode_seconds_per_step, tokens * prefill_seconds_per_token)
            for i, take in step:
                out[i]["spans"].append((now, end, "prefill"))
                prompt_left[i] -= take
        else:
            if policy == "continuous" or not decode_left:
                for i in admit(max_batch - len(decode_left)):
                    start, now = now, now + requests[i][1] * prefill_seconds_per_token
                    out[i]["spans"].append((start, now, "prefill"))
                    first_token(i)
            if not decode_left:
                continue
            step, end = [], now + decode_seconds_per_step
        for i in list(decode_left):  # one more token for every decoding request
            out[i]["spans"].append((now, end, "decode"))
            decode_left[i] -= 1
            out[i]["finish"] = end
            if decode_left[i] == 0:
                del decode_left[i]
        now = end
        for i, _ in step:
            if prompt_left[i] == 0:
                prefilling.remove(i)
                first_token(i)
    return out


def summary(timeline: list[dict]) -> dict[str, float]:
    """A timeline's averages, as ``simulate_serving`` returns them."""
    start = min(r["arrival"] for r in timeline)
    per_output = [(r["finish"] - r["first_token"]) / (r["new_tokens"] - 1) for r in timeline
                  if r["new_tokens"] > 1]
    return {"tokens_per_second": sum(r["new_tokens"] for r in timeline)
            / (max(r["finish"] for r in timeline) - start),
            "mean_time_to_first_token": float(np.mean([r["first_token"] - r["arrival"]
                                                       for r in timeline])),
            "mean_time_per_output_token": float(np.mean(per_output)) if per_output else math.nan,
            "mean_latency": float(np.mean([r["finish"] - r["arrival"] for r in timeline]))}


def request_stream(n_requests: int, requests_per_second: float, mean_prompt: int,
                   mean_new_tokens: int, seed: int = 0) -> list[tuple[float, int, int]]:
    """``n_requests`` requests arriving at random (a Poisson stream: exponential gaps), with
    prompt and output lengths drawn from exponential distributions of the given means, rounded
    and cut to between 1 token and four times the mean: a few long requests among many short
    ones, as in a chat service."""
    rng = np.random.default_rng(seed)
    arrivals = np.cumsum(rng.exponential(1 / requests_per_second, n_requests))

    def lengths(mean: int) -> np.ndarray:
        return np.clip(np.round(rng.exponential(mean, n_requests)), 1, 4 * mean).astype(int)

    prompts, news = lengths(mean_prompt), lengths(mean_new_tokens)
    return [(float(a), int(p), int(n)) for a, p, n in zip(arrivals, prompts, news, strict=True)]
