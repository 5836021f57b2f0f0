"""Lesson 04 given code: a small decoder-only transformer whose matmuls are the lesson's formulas.

Every weight is a matrix (no biases, norms without parameters, no position embeddings), so
``sum(p.numel())`` is ``transformer_params`` exactly, and every matmul is one FlopCounterMode
sees, so its forward count is ``transformer_forward_flops`` exactly. Attention is written with
two explicit matmuls rather than ``F.scaled_dot_product_attention``: on a CPU FlopCounterMode
counts nothing for that fused kernel (it has no formula for the CPU kernel), and on a GPU it
counts the full T x T square, so the same model would be counted differently on two machines.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from einops import einsum, rearrange
from jaxtyping import Float, Int
from torch import Tensor, nn


def rms_norm(x: Float[Tensor, "... d"], eps: float = 1e-6) -> Float[Tensor, "... d"]:
    """Scale each vector to root-mean-square 1; no learned gain (elementwise: 0 FLOPs counted)."""
    return x * torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + eps)


class Attention(nn.Module):
    """Causal multi-head self-attention: four (d, d) projections and two matmuls per head."""

    def __init__(self, d_model: int, n_heads: int) -> None:
        super().__init__()
        if d_model % n_heads:
            raise ValueError(f"d_model={d_model} does not split into n_heads={n_heads} heads")
        self.n_heads = n_heads
        self.q, self.k, self.v, self.o = (nn.Linear(d_model, d_model, bias=False) for _ in "qkvo")

    def forward(self, x: Float[Tensor, "b s d"]) -> Float[Tensor, "b s d"]:
        q, k, v = (rearrange(proj(x), "b s (h d) -> b h s d", h=self.n_heads)
                   for proj in (self.q, self.k, self.v))
        # Splitting d into h heads of d/h does not change the FLOPs: h matmuls of 2·T²·(d/h).
        scores = einsum(q, k, "b h s_q d, b h s_k d -> b h s_q s_k") / math.sqrt(q.shape[-1])
        # The whole T x T square is computed, then the future half is masked: its FLOPs count.
        seq_len = x.shape[1]
        future = torch.ones(seq_len, seq_len, dtype=torch.bool, device=x.device).triu(1)
        weights = scores.masked_fill(future, float("-inf")).softmax(dim=-1)
        out = einsum(weights, v, "b h s_q s_k, b h s_k d -> b h s_q d")
        return self.o(rearrange(out, "b h s d -> b s (h d)"))


class MLP(nn.Module):
    """Up-projection to d_ff, GELU, down-projection back to d_model."""

    def __init__(self, d_model: int, d_ff: int) -> None:
        super().__init__()
        self.up = nn.Linear(d_model, d_ff, bias=False)
        self.down = nn.Linear(d_ff, d_model, bias=False)

    def forward(self, x: Float[Tensor, "b s d"]) -> Float[Tensor, "b s d"]:
        return self.down(F.gelu(self.up(x)))


class Block(nn.Module):
    """Pre-norm residual block: x + attention(norm(x)), then x + mlp(norm(x))."""

    def __init__(self, d_model: int, n_heads: int, d_ff: int) -> None:
        super().__init__()
        self.attn = Attention(d_model, n_heads)
        self.mlp = MLP(d_model, d_ff)

    def forward(self, x: Float[Tensor, "b s d"]) -> Float[Tensor, "b s d"]:
        x = x + self.attn(rms_norm(x))
        return x + self.mlp(rms_norm(x))


class TinyTransformer(nn.Module):
    """A decoder-only language model: token ids in, next-token logits out.

    Args:
        vocab_size: V, rows of the embedding (and of the unembedding).
        d_model: d, width of the residual stream.
        n_layers: L, number of blocks.
        n_heads: attention heads; must divide d_model.
        d_ff: width of the MLP; defaults to 4 * d_model.
        tied_embeddings: when True the unembedding reuses the embedding's (V, d) matrix.
    """

    def __init__(self, vocab_size: int, d_model: int, n_layers: int, n_heads: int,
                 d_ff: int | None = None, tied_embeddings: bool = False) -> None:
        super().__init__()
        self.embedding = nn.Embedding(vocab_size, d_model)  # a lookup: no matmul, 0 FLOPs
        self.blocks = nn.ModuleList(Block(d_model, n_heads, 4 * d_model if d_ff is None else d_ff)
                                    for _ in range(n_layers))
        self.unembedding = None if tied_embeddings else nn.Linear(d_model, vocab_size, bias=False)

    def forward(self, tokens: Int[Tensor, "b s"]) -> Float[Tensor, "b s vocab"]:
        x = self.embedding(tokens)
        for block in self.blocks:
            x = block(x)
        x = rms_norm(x)
        if self.unembedding is None:
            return F.linear(x, self.embedding.weight)  # x @ E^T with the embedding matrix E
        return self.unembedding(x)
