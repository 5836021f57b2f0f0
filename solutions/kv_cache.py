"""Lesson 08 given code: a KV cache for lesson 04's TinyTransformer, and greedy generation.

The cache holds, for every layer, the keys and values of every token the model has been fed, in
tensors of shape (batch, n_heads, max_len, head_dim) allocated once and filled as tokens come.
``cached_forward`` runs the model's own weights over new tokens that follow the cached ones: it
writes their keys and values into the cache and lets each new token attend to the filled part
only (never to the empty tail), so a decode step at context c multiplies its query by exactly
c + 1 keys. Like ``TinyTransformer``, attention is two explicit matmuls, so FlopCounterMode
counts every matmul: the counts are ``solutions.inference.generate_flops`` exactly, for heads of
two numbers or more and prompts of two tokens or more (an einsum that sums over a dimension of
size 1 is an elementwise product to torch, and FlopCounterMode counts only matmuls).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from einops import einsum, rearrange
from jaxtyping import Float, Int
from torch import Tensor

from solutions.tiny_transformer import Attention, TinyTransformer, rms_norm


class KVCache:
    """Keys and values of every token fed so far, per layer, preallocated for ``max_len`` tokens.

    Args:
        model: the TinyTransformer whose keys and values it keeps (its dtype and device).
        batch_size: sequences generated together.
        max_len: tokens it has room for.

    Attributes:
        keys, values: one tensor per layer, shape (batch_size, n_heads, max_len, head_dim).
        length: tokens filled so far (positions 0 .. length - 1 of every sequence).
    """

    def __init__(self, model: TinyTransformer, batch_size: int, max_len: int) -> None:
        embedding = model.embedding.weight
        n_heads = model.blocks[0].attn.n_heads
        shape = (batch_size, n_heads, max_len, embedding.shape[1] // n_heads)
        like = {"dtype": embedding.dtype, "device": embedding.device}
        self.keys = [torch.zeros(shape, **like) for _ in model.blocks]
        self.values = [torch.zeros(shape, **like) for _ in model.blocks]
        self.length = 0

    @property
    def nbytes(self) -> int:
        """Bytes of every key and value tensor, filled or not."""
        return sum(t.nbytes for t in self.keys + self.values)


def cached_attention(attn: Attention, x: Float[Tensor, "b s d"],
                     keys: Float[Tensor, "b h max_len hd"],
                     values: Float[Tensor, "b h max_len hd"], start: int) -> Float[Tensor, "b s d"]:
    """``attn`` over s new tokens at positions start .. start + s - 1, each attending to itself
    and every token before it; their keys and values are written into the cache first."""
    q, k, v = (rearrange(proj(x), "b s (h d) -> b h s d", h=attn.n_heads)
               for proj in (attn.q, attn.k, attn.v))
    end = start + x.shape[1]
    keys[:, :, start:end], values[:, :, start:end] = k, v
    k, v = keys[:, :, :end], values[:, :, :end]  # the filled part: end keys, not max_len
    scores = einsum(q, k, "b h s_q d, b h s_k d -> b h s_q s_k") / math.sqrt(q.shape[-1])
    # New token i is at position start + i and sees keys 0 .. start + i: in a decode step
    # (one new token) nothing is masked; in the prefill (start 0) this is the causal mask.
    future = torch.ones(x.shape[1], end, dtype=torch.bool, device=x.device).triu(start + 1)
    weights = scores.masked_fill(future, float("-inf")).softmax(dim=-1)
    out = einsum(weights, v, "b h s_q s_k, b h s_k d -> b h s_q d")
    return attn.o(rearrange(out, "b h s d -> b s (h d)"))


def cached_forward(model: TinyTransformer, tokens: Int[Tensor, "b s"],
                   cache: KVCache) -> Float[Tensor, "b s vocab"]:
    """The model's forward pass over new tokens that follow the ``cache.length`` cached ones.

    Args:
        model: the TinyTransformer (its weights are used as they are).
        tokens: the new tokens: the whole prompt (the prefill) or one token per sequence.
        cache: the cache of the tokens before them; their keys and values are appended.

    Returns:
        Next-token logits at every new position, as ``model`` gives for the whole sequence.
    """
    if cache.length + tokens.shape[1] > cache.keys[0].shape[2]:
        raise ValueError(f"the cache has room for {cache.keys[0].shape[2]} tokens, holds "
                         f"{cache.length} and was given {tokens.shape[1]} more")
    x = model.embedding(tokens)
    for block, keys, values in zip(model.blocks, cache.keys, cache.values, strict=True):
        x = x + cached_attention(block.attn, rms_norm(x), keys, values, cache.length)
        x = x + block.mlp(rms_norm(x))
    cache.length += tokens.shape[1]
    x = rms_norm(x)
    if model.unembedding is None:
        return F.linear(x, model.embedding.weight)
    return model.unembedding(x)


@torch.no_grad()
def generate_with_cache(model: TinyTransformer, prompt: Int[Tensor, "b p"],
                        new_tokens: int) -> tuple[Int[Tensor, "b new"], KVCache]:
    """Greedy generation with a KV cache: the prefill, then one decode step per further token.

    Returns:
        The new tokens, and the cache, full: it has room for (and holds) the prompt and every
        new token but the last, which is never fed to the model.
    """
    cache = KVCache(model, prompt.shape[0], prompt.shape[1] + new_tokens - 1)
    logits = cached_forward(model, prompt, cache)  # logits at every prompt position
    tokens = [logits[:, -1].argmax(dim=-1, keepdim=True)]
    for _ in range(new_tokens - 1):
        logits = cached_forward(model, tokens[-1], cache)  # one token, attending to the cache
        tokens.append(logits[:, -1].argmax(dim=-1, keepdim=True))
    return torch.cat(tokens, dim=1), cache


@torch.no_grad()
def generate(model: TinyTransformer, prompt: Int[Tensor, "b p"], new_tokens: int,
             kv_cache: bool = True) -> Int[Tensor, "b new"]:
    """Greedy generation: each new token is the argmax of the logits after the one before.

    Args:
        model: the TinyTransformer.
        prompt: token ids, at least one per sequence.
        new_tokens: tokens to generate (>= 1).
        kv_cache: True: prefill the prompt, then feed one token per step, with the cache.
            False: run the whole sequence so far through ``model`` for every new token.

    Returns:
        The new tokens, shape (b, new_tokens).
    """
    if prompt.dim() != 2 or prompt.shape[1] < 1 or prompt.is_floating_point():
        raise ValueError(f"prompt must be (batch, prompt_len >= 1) token ids, got "
                         f"{prompt.dtype} of shape {tuple(prompt.shape)}")
    if isinstance(new_tokens, bool) or not isinstance(new_tokens, int) or new_tokens < 1:
        raise ValueError(f"new_tokens must be an integer >= 1, got {new_tokens!r}")
    if kv_cache:
        return generate_with_cache(model, prompt, new_tokens)[0]
    sequence = prompt
    for _ in range(new_tokens):
        next_token = model(sequence)[:, -1].argmax(dim=-1, keepdim=True)
        sequence = torch.cat([sequence, next_token], dim=1)
    return sequence[:, prompt.shape[1]:]
