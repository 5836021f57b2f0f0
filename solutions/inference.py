"""Lesson 08: inference, prefill and decode, and the KV cache.

A model generates text one token at a time. Given a prompt of P tokens, the *prefill* is one
forward pass over the whole prompt: lesson 04's count, L·(8·P·d² + 4·P·d·d_ff + 4·P²·d) + 2·P·d·V
FLOPs, the full P x P square of attention scores included. Its logits at the last position give
the first new token. Every further token is a *decode* step: the model is fed the token it has
just produced and returns the logits of the next one. So a generation of n new tokens is one
prefill and n - 1 decode steps, and the last new token is never fed to the model.

A decode step needs, in every layer, the keys and values of every earlier token, and those do not
change once computed (the mask is causal: no token sees a later one). The *KV cache* keeps them:
per token and layer, n_kv_heads x head_dim keys and as many values, so the cache of T tokens of
B sequences holds 2·L·n_kv_heads·head_dim·T·B numbers. With the cache, the decode step at
context c (c tokens cached) runs one token through the weights, 8·d² + 4·d·d_ff FLOPs per layer,
and one query against c + 1 keys (the c cached and its own), 4·(c + 1)·d FLOPs per layer, then
its logits, 2·d·V. Without the cache, every further token runs the whole forward pass over the
sequence so far again: the work of step k grows with P + k, and attention's with its square.

One decode step does about 2 FLOPs per parameter and reads every parameter once: in bf16 that is
one FLOP per byte, some 300 times below an H100's ridge point (lesson 03). Decode is memory bound.
Sequences decoded together (a batch of B) share the reads of the weights but each reads its own
cache, so the intensity of a step is 2·N·B / (N·bytes_per_param + B·context·kv_bytes_per_token),
and the roofline bounds the step's time by max(FLOPs / peak, bytes / bandwidth). Grouped-query
attention (n_kv_heads < n_heads, as in Llama 3) shrinks the cache, and so lets more sequences
fit beside the weights and each step read fewer bytes.
"""

from __future__ import annotations

import math
import numbers
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

    The prefill is one forward pass over the prompt, as lesson 04 counts it (logits at every
    prompt position, the full P x P score square); its last logits give the first new token.
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

    The step does 2·N FLOPs per sequence (every weight once, a multiply and an add) and reads
    the weights once for the whole batch and each sequence's cache: N·bytes_per_param +
    B·context·kv_bytes_per_token bytes. Attention's own FLOPs, 4·L·(c + 1)·d per sequence, are
    left out, as are the activations' bytes.

    Args:
        n_params: N, the model's parameters (> 0).
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

    Activations and the framework's own memory are left out: this is an upper bound.

    Args:
        gpu_bytes: memory to fill, in bytes (> 0), e.g. 80e9 for an H100.
        n_params: N, the model's parameters (> 0).
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


# ------------------------------------------------------------------ predictions
# The answers to the lesson's "predict first" questions. The notebook holds each one sealed
# (grader.notebook_checks.seal); tests/test_inference.py checks each against its oracle.

# Graded: the bytes of the float32 KV cache of lesson 04's TinyTransformer (vocab 256, d_model
# 64, 2 layers, 4 heads) after a batch of 8 sequences generates 32 new tokens after a prompt of
# 16: the cache holds the prompt and every new token but the last, 47 tokens.
predicted_cache_bytes_after_generation = kv_cache_bytes(2, 4, 64 // 4, 16 + 32 - 1, 8, 4)
