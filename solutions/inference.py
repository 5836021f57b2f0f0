"""Lesson 08: inference, prefill and decode, the KV cache, and serving many requests at once.

A generation of n new tokens after a prompt of P is one *prefill* (a forward pass over the prompt,
counted as lesson 04 counts it: logits at every prompt position, the whole P x P square of
scores) and n - 1 *decode* steps of one token each; the last new token is never fed back, so the
*KV cache* ends holding P + n - 1 tokens, 2·L·n_kv_heads·head_dim numbers each.

A decode step multiplies every weight matrix once per sequence, 2 FLOPs per parameter, and reads
it once for the whole batch; the input embedding is a lookup (lesson 04), not a matmul, so the
``n_params`` of the decode functions are the parameters a step multiplies: every matrix but an
untied input embedding. A batch of B shares the weights' bytes, each sequence reads its own
cache: 2·N·B FLOPs over N·bytes_per_param + B·context·kv_bytes_per_token bytes, and the roofline
bounds the step by max(FLOPs / peak, bytes / bandwidth). A prefill of B prompts does 2·N·P·B
FLOPs for the same weights' bytes: compute-bound, its time is the time to first token.
``simulate_serving`` runs one server over a stream of requests, with static batching or with
continuous batching (a request joins as soon as a slot is free), and averages what users wait.
"""

from __future__ import annotations

import math
import numbers
import operator
from fractions import Fraction

from solutions.backprop import transformer_forward_flops


def _integer(name: str, value: object, minimum: int) -> int:
    """``value`` as an int at least ``minimum``: TypeError naming ``name`` for a value that is
    not an integer (a bool is not a count, though Python lets it pass for one), ValueError for
    one below ``minimum``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an integer, got {value!r}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value!r}")
    return int(value)


def _positive_number(name: str, value: object) -> float | int:
    """``value`` as a finite number > 0 (an int stays an int, so that byte counts stay exact):
    TypeError for a value that is not a real number, ValueError for one that is not positive or
    not finite."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a number, got {value!r}")
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"{name} must be a finite number > 0, got {value!r}")
    return int(value) if isinstance(value, numbers.Integral) else float(value)


def kv_cache_bytes(n_layers: int, n_kv_heads: int, head_dim: int, seq_len: int, batch_size: int,
                   bytes_per_element: int = 2) -> int:
    """Bytes of the KV cache of ``batch_size`` sequences of ``seq_len`` tokens each.

    Every layer keeps, for every token, one key and one value per KV head, each ``head_dim``
    numbers: 2·L·n_kv_heads·head_dim·T·B elements. Multi-head attention has as many KV heads as
    query heads; grouped-query attention shares each KV head among several query heads.

    Args:
        n_layers: L, number of blocks (>= 1).
        n_kv_heads: key and value heads per layer (>= 1).
        head_dim: numbers per head, d_model / n_heads (>= 1).
        seq_len: T, tokens cached per sequence (>= 0).
        batch_size: B, sequences (>= 1).
        bytes_per_element: bytes of one cached number (>= 1; 2 for bf16, 4 for float32).

    Returns:
        The bytes, an int.
    """
    layers = _integer("n_layers", n_layers, 1)
    heads = _integer("n_kv_heads", n_kv_heads, 1)
    width = _integer("head_dim", head_dim, 1)
    tokens = _integer("seq_len", seq_len, 0)
    sequences = _integer("batch_size", batch_size, 1)
    element = _integer("bytes_per_element", bytes_per_element, 1)
    return 2 * layers * heads * width * tokens * sequences * element  # 2: keys and values


def generate_flops(n_layers: int, d_model: int, vocab_size: int, prompt_len: int,
                   new_tokens: int, d_ff: int | None = None,
                   kv_cache: bool = True) -> dict[str, int]:
    """Matmul FLOPs of generating ``new_tokens`` tokens after a prompt, for one sequence.

    The prefill is one forward pass over the prompt, as lesson 04 counts it and as
    FlopCounterMode measures the lesson's model: logits at every prompt position and the whole
    P x P score square (a serving engine computes the last position's logits only, and a causal
    kernel skips the masked half of the square). Its last logits give the first new token.
    Each of the other new_tokens - 1 tokens is one decode step that feeds the token before it.
    The step that attends to T keys (T = P + 1, ..., P + new_tokens - 1):

        with the cache      L·(8·d² + 4·d·d_ff + 4·T·d) + 2·d·V        (one token, T keys)
        without the cache   L·(8·T·d² + 4·T·d·d_ff + 4·T²·d) + 2·T·d·V  (all T tokens again)

    Args:
        n_layers: L, number of blocks (>= 1).
        d_model: d, width of the residual stream (>= 1).
        vocab_size: V, tokens in the vocabulary (>= 1).
        prompt_len: P, tokens in the prompt (>= 1: the first new token needs logits).
        new_tokens: tokens generated (>= 1).
        d_ff: width of the MLP; None means 4 * d_model.
        kv_cache: whether decode steps reuse the cached keys and values.

    Returns:
        ``{"prefill", "decode", "total"}`` -> FLOPs (ints), total = prefill + decode.
    """
    layers = _integer("n_layers", n_layers, 1)
    d = _integer("d_model", d_model, 1)
    vocab = _integer("vocab_size", vocab_size, 1)
    prompt = _integer("prompt_len", prompt_len, 1)
    steps = _integer("new_tokens", new_tokens, 1) - 1  # the first comes from the prefill
    d_ff = 4 * d if d_ff is None else _integer("d_ff", d_ff, 1)
    if type(kv_cache) is not bool:
        raise TypeError(f"kv_cache must be True or False, got {kv_cache!r}")
    prefill = transformer_forward_flops(layers, d, prompt, vocab, d_ff)
    per_token = layers * (8 * d * d + 4 * d * d_ff) + 2 * d * vocab  # weights and logits
    n_keys = range(prompt + 1, prompt + 1 + steps)  # T of each decode step
    if kv_cache:  # one token through the weights, one query against T keys
        decode = steps * per_token + layers * 4 * d * sum(n_keys)
    else:  # T tokens through the weights, T queries against T keys
        decode = sum(n_keys) * per_token + layers * 4 * d * sum(t * t for t in n_keys)
    return {"prefill": prefill, "decode": decode, "total": prefill + decode}


def decode_intensity(n_params: float, batch_size: int, context_len: int,
                     kv_bytes_per_token: float, bytes_per_param: float = 2) -> float:
    """Arithmetic intensity of one decode step of a batch: FLOPs per byte read.

    The step does 2·N FLOPs per sequence (every weight it multiplies, a multiply and an add)
    and reads those weights once for the whole batch and each sequence's cache:
    N·bytes_per_param + B·context·kv_bytes_per_token bytes. Attention's own FLOPs, 4·L·(c + 1)·d
    per sequence, are left out, as are the activations' bytes.

    Args:
        n_params: N, the parameters a step multiplies (> 0): every weight matrix but an untied
            input embedding, which is a lookup of B rows.
        batch_size: B, sequences decoded together (>= 1).
        context_len: tokens in each sequence's cache (>= 0).
        kv_bytes_per_token: bytes of one token's keys and values in every layer (> 0), e.g.
            ``kv_cache_bytes(L, n_kv_heads, head_dim, 1, 1)``.
        bytes_per_param: bytes of one weight (> 0; 2 for bf16).

    Returns:
        2·N·B / (N·bytes_per_param + B·context_len·kv_bytes_per_token), FLOPs per byte.
    """
    n = _positive_number("n_params", n_params)
    batch = _integer("batch_size", batch_size, 1)
    context = _integer("context_len", context_len, 0)
    per_token = _positive_number("kv_bytes_per_token", kv_bytes_per_token)
    per_param = _positive_number("bytes_per_param", bytes_per_param)
    return 2 * n * batch / (n * per_param + batch * context * per_token)


def max_batch_size(gpu_bytes: float, n_params: float, context_len: int,
                   kv_bytes_per_token: float, bytes_per_param: float = 2) -> int:
    """The most sequences whose KV caches of ``context_len`` tokens fit beside the weights.

    ``gpu_bytes`` is the budget for the weights and the caches alone: whatever else the GPU must
    hold (the CUDA context, NCCL's buffers, the allocator's slack, activations) is kept back
    from it first.

    Args:
        gpu_bytes: bytes for weights and caches (> 0), e.g. 72e9: 90% of an H100's 80e9.
        n_params: N, the parameters stored (> 0), the input embedding included.
        context_len: tokens each sequence's cache holds (>= 1).
        kv_bytes_per_token: bytes of one token's keys and values in every layer (> 0).
        bytes_per_param: bytes of one weight (> 0; 2 for bf16).

    Returns:
        floor((gpu_bytes - N·bytes_per_param) / (context_len·kv_bytes_per_token)), an int
        computed exactly (0 when the weights fit but no whole cache does). ValueError when the
        weights alone do not fit.
    """
    memory = _positive_number("gpu_bytes", gpu_bytes)
    n = _positive_number("n_params", n_params)
    context = _integer("context_len", context_len, 1)
    per_token = _positive_number("kv_bytes_per_token", kv_bytes_per_token)
    per_param = _positive_number("bytes_per_param", bytes_per_param)
    # Fractions hold ints and floats exactly, so the floor is that of the true quotient.
    weights = Fraction(n) * Fraction(per_param)
    free = Fraction(memory) - weights
    if free < 0:
        raise ValueError(f"the weights alone take {float(weights):,.0f} bytes, more than "
                         f"gpu_bytes={memory:,.0f}: shard them over more GPUs or store fewer "
                         "bytes per parameter")
    return math.floor(free / (context * Fraction(per_token)))


def decode_tokens_per_second(n_params: float, batch_size: int, context_len: int,
                             kv_bytes_per_token: float, peak_flops: float, bandwidth: float,
                             bytes_per_param: float = 2) -> float:
    """The roofline's bound on tokens generated per second by decode steps of a batch.

    A step does 2·N·B FLOPs and reads N·bytes_per_param + B·context·kv_bytes_per_token bytes (as
    ``decode_intensity`` counts them); it takes at least as long as the slower of the two,
    max(FLOPs / peak, bytes / bandwidth), and yields B tokens. However large the batch, no more
    than peak / (2·N) tokens per second.

    Args:
        n_params, batch_size, context_len, kv_bytes_per_token, bytes_per_param: as in
            ``decode_intensity``.
        peak_flops: FLOP/s of the accelerator (> 0).
        bandwidth: its memory bandwidth, bytes/s (> 0).

    Returns:
        Tokens per second, a float.
    """
    n = _positive_number("n_params", n_params)
    batch = _integer("batch_size", batch_size, 1)
    context = _integer("context_len", context_len, 0)
    per_token = _positive_number("kv_bytes_per_token", kv_bytes_per_token)
    peak = _positive_number("peak_flops", peak_flops)
    beta = _positive_number("bandwidth", bandwidth)
    per_param = _positive_number("bytes_per_param", bytes_per_param)
    compute_seconds = 2 * n * batch / peak
    memory_seconds = (n * per_param + batch * context * per_token) / beta
    return batch / max(compute_seconds, memory_seconds)


def prefill_seconds(n_params: float, prompt_len: int, batch_size: int, peak_flops: float,
                    bandwidth: float, bytes_per_param: float = 2) -> float:
    """The roofline's bound on the time of one prefill of ``batch_size`` prompts.

    The prefill runs P·B tokens through the weights in one pass: 2·N·P·B FLOPs, for one read of
    the weights, N·bytes_per_param bytes; it takes at least max(FLOPs / peak, bytes / bandwidth).
    Its end is the time to first token. Attention's FLOPs, the cache it writes and the
    activations are left out, as in ``decode_intensity``.

    Args:
        n_params: N, the parameters a forward pass multiplies (> 0), as in ``decode_intensity``.
        prompt_len: P, tokens in each prompt (>= 1).
        batch_size: B, prompts prefilled together (>= 1).
        peak_flops: FLOP/s of the accelerator (> 0).
        bandwidth: its memory bandwidth, bytes/s (> 0).
        bytes_per_param: bytes of one weight (> 0; 2 for bf16).

    Returns:
        max(2·N·P·B / peak_flops, N·bytes_per_param / bandwidth), seconds, a float.
    """
    n = _positive_number("n_params", n_params)
    prompt = _integer("prompt_len", prompt_len, 1)
    batch = _integer("batch_size", batch_size, 1)
    peak = _positive_number("peak_flops", peak_flops)
    beta = _positive_number("bandwidth", bandwidth)
    per_param = _positive_number("bytes_per_param", bytes_per_param)
    return float(max(2 * n * prompt * batch / peak, n * per_param / beta))


def _request(request: object) -> tuple[float, int, int]:
    """``(arrival_seconds, prompt_len, new_tokens)`` checked: ValueError for anything else."""
    if not isinstance(request, (tuple, list)) or len(request) != 3:
        raise ValueError(f"a request is (arrival_seconds, prompt_len, new_tokens), got {request!r}")
    arrival, prompt, new = request
    if (isinstance(arrival, bool) or not isinstance(arrival, numbers.Real)
            or not math.isfinite(arrival) or arrival < 0):
        raise ValueError(f"arrival_seconds must be a finite number >= 0, got {arrival!r}")
    for name, value in (("prompt_len", prompt), ("new_tokens", new)):
        if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
            raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
    return arrival, int(prompt), int(new)


def simulate_serving(requests: list[tuple[float, int, int]], max_batch: int,
                     prefill_seconds_per_token: float, decode_seconds_per_step: float,
                     policy: str) -> dict[str, float]:
    """One server over a stream of requests: tokens per second, and what users wait.

    Time runs in seconds from 0. A request's prefill takes prompt_len·prefill_seconds_per_token,
    runs alone and yields its first token. A decode step takes decode_seconds_per_step whatever
    the batch (memory-bound) and gives every running request one more token; a request is done
    after new_tokens - 1 steps and leaves its slot at once. Admission is first come first served
    (by arrival, ties in list order) among the requests arrived when it starts; each admitted
    request is prefilled in turn, and one arriving meanwhile waits for the next admission.
    ``"static"`` admits up to max_batch requests when nothing is running, then decodes until all
    are done; ``"continuous"`` admits into free slots before every decode step. A server with
    nothing running and nothing arrived waits for the next arrival.

    Args:
        requests: ``(arrival_seconds, prompt_len, new_tokens)`` triples (at least one):
            arrival a finite number >= 0, prompt_len and new_tokens integers >= 1.
        max_batch: the most requests running at once (>= 1).
        prefill_seconds_per_token, decode_seconds_per_step: seconds (> 0).
        policy: ``"static"`` or ``"continuous"``.

    Returns:
        ``{"tokens_per_second", "mean_time_to_first_token", "mean_time_per_output_token",
        "mean_latency"}`` -> floats: all new tokens / (last finish - first arrival); the means
        over requests of first token - arrival, of (finish - first token) / (new_tokens - 1)
        (over requests with new_tokens > 1; nan when there are none), and of finish - arrival.
    """
    if not isinstance(requests, (tuple, list)) or not requests:
        raise ValueError(f"requests must be a non-empty list of requests, got {requests!r}")
    if policy not in ("static", "continuous"):
        raise ValueError(f"policy must be 'static' or 'continuous', got {policy!r}")
    slots = _integer("max_batch", max_batch, 1)
    per_token = _positive_number("prefill_seconds_per_token", prefill_seconds_per_token)
    per_step = _positive_number("decode_seconds_per_step", decode_seconds_per_step)
    checked = [_request(r) for r in requests]
    order = sorted(range(len(checked)), key=lambda i: checked[i][0])  # stable: list order
    first, done = [0.0] * len(checked), [0.0] * len(checked)  # seconds, by request
    running: dict[int, int] = {}  # request -> decode steps still to run
    now, admitted = 0.0, 0  # order[admitted:] are still waiting
    while admitted < len(order) or running:
        if not running and checked[order[admitted]][0] > now:  # idle: wait for an arrival
            now = checked[order[admitted]][0]
        if policy == "continuous" or not running:
            opened, free = now, slots - len(running)  # who has arrived when admission opens
            while free and admitted < len(order) and checked[order[admitted]][0] <= opened:
                i, admitted, free = order[admitted], admitted + 1, free - 1
                now += checked[i][1] * per_token  # its prefill, alone: its first token
                first[i] = done[i] = now
                if checked[i][2] > 1:
                    running[i] = checked[i][2] - 1
        if running:
            now += per_step  # one decode step: one more token for every running request
            for i in list(running):
                running[i] -= 1
                if running[i] == 0:
                    done[i] = now
                    del running[i]
    arrivals = [arrival for arrival, _, _ in checked]
    per_output = [(done[i] - first[i]) / (new - 1) for i, (_, _, new) in enumerate(checked)
                  if new > 1]
    return {"tokens_per_second": sum(new for _, _, new in checked) / (max(done) - min(arrivals)),
            "mean_time_to_first_token": sum(map(operator.sub, first, arrivals)) / len(checked),
            "mean_time_per_output_token": (sum(per_output) / len(per_output) if per_output
                                           else math.nan),
            "mean_latency": sum(map(operator.sub, done, arrivals)) / len(checked)}


# ------------------------------------------------------------------ predictions
# The answer to the lesson's graded "predict first" question, which grading compares with each
# student's number (for their own numbers); tests/test_inference.py checks it against its oracle.

# Graded: the bytes of the float32 KV cache of lesson 04's TinyTransformer (vocab 256, d_model
# 64, 2 layers, 4 heads) after a batch of n_sequences sequences generates n_new new tokens after
# a prompt of n_prompt: the cache holds the prompt and every new token but the last. Each student
# answers for numbers of their own (grader/content/cases/inference.py); these are the default's,
# which the notebook's text describes: 8 sequences, 32 new tokens after 16, 47 tokens cached.
n_prompt, n_new, n_sequences = 16, 32, 8
predicted_cache_bytes_after_generation = kv_cache_bytes(
    2, 4, 64 // 4, n_prompt + n_new - 1, n_sequences, 4)  # the last new token is never fed
