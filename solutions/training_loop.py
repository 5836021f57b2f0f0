"""Lesson 06 given code: the pieces of a training loop that the lesson measures.

``model_logits`` is ``TinyTransformer.forward`` with the option to run every block under
``torch.utils.checkpoint``; ``train_step`` is one step as the lesson defines it; ``get_batch``
cuts random windows out of a token file and moves them to the device; ``MixedPrecisionAdamW``
keeps fp32 master weights for bf16 parameters (and, with ``state_bits=8``, its moments in
8 bits), so that each recipe of lesson 05's ``training_memory`` exists as real tensors;
``run_recipe`` sets a model up for a recipe and trains it for a few steps.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from jaxtyping import Float, Int
from torch import Tensor
from torch.utils.checkpoint import checkpoint

from solutions.memory import dequantize_blockwise, quantize_blockwise
from solutions.tiny_transformer import TinyTransformer, rms_norm


def model_logits(model: TinyTransformer, tokens: Int[Tensor, "b s"],
                 checkpoint_blocks: bool = False) -> Float[Tensor, "b s vocab"]:
    """``model(tokens)``, with every block under non-reentrant ``torch.utils.checkpoint`` when
    ``checkpoint_blocks``: the forward pass then keeps only each block's input, and the backward
    pass runs the block's forward again to get the rest."""
    x = model.embedding(tokens)
    for block in model.blocks:
        x = checkpoint(block, x, use_reentrant=False) if checkpoint_blocks else block(x)
    x = rms_norm(x)
    if model.unembedding is None:
        return F.linear(x, model.embedding.weight)
    return model.unembedding(x)


def step_loss(model: TinyTransformer, tokens: Int[Tensor, "b s"], targets: Int[Tensor, "b s"],
              checkpoint_blocks: bool = False) -> Float[Tensor, ""]:
    """The mean cross-entropy of predicting ``targets`` (the next token at each position)."""
    logits = model_logits(model, tokens, checkpoint_blocks)
    return F.cross_entropy(logits.flatten(0, 1), targets.flatten())


def train_step(model: TinyTransformer, optimizer: torch.optim.Optimizer,
               tokens: Int[Tensor, "b s"], targets: Int[Tensor, "b s"],
               checkpoint_blocks: bool = False) -> float:
    """One training step: forward, loss, backward, optimizer step. Returns the loss."""
    optimizer.zero_grad(set_to_none=True)
    loss = step_loss(model, tokens, targets, checkpoint_blocks)
    loss.backward()
    optimizer.step()
    return loss.item()


def get_batch(token_ids: np.ndarray, batch_size: int, seq_len: int, rng: np.random.Generator,
              device: torch.device) -> tuple[Int[Tensor, "b s"], Int[Tensor, "b s"]]:
    """``batch_size`` random windows of ``seq_len`` tokens and, shifted by one, their targets.

    Reads only the windows' tokens from ``token_ids`` (a ``np.memmap`` reads just the pages it
    touches), widens them to int64 (``nn.Embedding`` takes int32 too, but ``F.cross_entropy``
    takes targets only as int64 or uint8) and moves them to ``device``. The copy to a GPU is a
    plain ``.to(device)`` from pageable memory: pinning a fresh tensor first would copy it once
    more, on this thread (section 4 measures the ways). On a CPU ``.to(device)`` returns the
    tensors themselves: no copy at all.

    Returns:
        ``(tokens, targets)``, two separate contiguous int64 tensors of shape (B, T).
    """
    starts = rng.integers(0, len(token_ids) - seq_len, size=batch_size)
    windows = np.stack([np.asarray(token_ids[s : s + seq_len + 1]) for s in starts])
    tokens = torch.from_numpy(windows[:, :-1].astype(np.int64))  # astype copies: contiguous
    targets = torch.from_numpy(windows[:, 1:].astype(np.int64))
    return tokens.to(device), targets.to(device)


class MixedPrecisionAdamW(torch.optim.Optimizer):
    """AdamW on fp32 master copies of low-precision (e.g. bf16) parameters.

    The model computes with its bf16 parameters and gets bf16 gradients; each step casts the
    gradient to fp32, updates the fp32 master weights as lesson 05's ``AdamW`` does (the same
    update rule and order of operations) and copies the result, rounded, into the parameter.
    State per parameter: ``master`` (fp32), ``step`` (a Python int) and the two moments: fp32
    ``exp_avg`` and ``exp_avg_sq`` with ``state_bits=32``; with ``state_bits=8`` lesson 05's
    blockwise int8 codes and fp32 scales of m (``exp_avg_codes``, ``exp_avg_scales``) and of
    sqrt(v) (``exp_avg_sq_codes``, ``exp_avg_sq_scales``). A linear 8-bit code of v itself
    would round its small values to 0 and divide by eps; its square root spans half the range
    (8-bit Adam uses a non-linear code instead, with the same bytes).
    """

    def __init__(self, params: Iterable[Tensor] | Iterable[dict[str, Any]], lr: float = 1e-3,
                 betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 1e-2, state_bits: int = 32) -> None:
        if state_bits not in (8, 32):
            raise ValueError(f"state_bits must be 8 or 32, got {state_bits!r}")
        self.state_bits = state_bits
        super().__init__(params, {"lr": lr, "betas": tuple(betas), "eps": eps,
                                  "weight_decay": weight_decay})

    def _moments(self, state: dict[str, Any], shape: torch.Size) -> tuple[Tensor, Tensor]:
        if self.state_bits == 32:
            return state["exp_avg"], state["exp_avg_sq"]
        m = dequantize_blockwise(state["exp_avg_codes"], state["exp_avg_scales"], shape)
        root_v = dequantize_blockwise(state["exp_avg_sq_codes"], state["exp_avg_sq_scales"],
                                      shape)
        return m, root_v.square()

    def _store(self, state: dict[str, Any], m: Tensor, v: Tensor) -> None:
        if self.state_bits == 32:
            return  # updated in place
        state["exp_avg_codes"], state["exp_avg_scales"] = quantize_blockwise(m)
        state["exp_avg_sq_codes"], state["exp_avg_sq_scales"] = quantize_blockwise(v.sqrt())

    @torch.no_grad()
    def step(self, closure: None = None) -> None:
        """Update every parameter that has a gradient, once (no closure)."""
        for group in self.param_groups:
            lr, eps, weight_decay = group["lr"], group["eps"], group["weight_decay"]
            beta1, beta2 = group["betas"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if not state:
                    state["step"] = 0
                    state["master"] = p.detach().to(torch.float32, copy=True)
                    zeros = torch.zeros_like(state["master"])
                    if self.state_bits == 32:
                        state["exp_avg"], state["exp_avg_sq"] = zeros, zeros.clone()
                    else:
                        self._store(state, zeros, zeros)
                state["step"] += 1
                t, master, grad = state["step"], state["master"], p.grad.to(torch.float32)
                m, v = self._moments(state, p.shape)
                master.mul_(1 - lr * weight_decay)
                m.lerp_(grad, 1 - beta1)
                v.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
                denom = (v.sqrt() / (1 - beta2**t) ** 0.5).add_(eps)  # as torch, and lesson 05
                master.addcdiv_(m, denom, value=-lr / (1 - beta1**t))
                self._store(state, m, v)
                p.copy_(master)  # rounded to the parameter's dtype


RECIPES = ("fp32", "mixed_bf16", "adam8bit")


def run_recipe(model: TinyTransformer, recipe: str, n_steps: int = 1, batch_size: int = 2,
               seq_len: int = 8, seed: int = 0) -> tuple[TinyTransformer, torch.optim.Optimizer]:
    """Set ``model`` up for one of lesson 05's recipes and train it ``n_steps`` steps on random
    tokens: "fp32" (fp32 parameters, ``torch.optim.AdamW``), "mixed_bf16" (bf16 parameters,
    fp32 master weights and moments) or "adam8bit" (bf16 parameters, fp32 master weights,
    8-bit moments).

    Returns:
        ``(model, optimizer)``, the model converted in place.
    """
    if recipe == "fp32":
        optimizer: torch.optim.Optimizer = torch.optim.AdamW(model.float().parameters())
    elif recipe in RECIPES:
        optimizer = MixedPrecisionAdamW(model.to(torch.bfloat16).parameters(),
                                        state_bits=32 if recipe == "mixed_bf16" else 8)
    else:
        raise ValueError(f"unknown recipe {recipe!r}; the recipes are {', '.join(RECIPES)}")
    generator = torch.Generator().manual_seed(seed)
    vocab_size = model.embedding.num_embeddings
    for _ in range(n_steps):
        tokens = torch.randint(0, vocab_size, (batch_size, seq_len), generator=generator)
        targets = torch.randint(0, vocab_size, (batch_size, seq_len), generator=generator)
        train_step(model, optimizer, tokens, targets)
    return model, optimizer


def tokens_per_step(micro_batch: int, seq_len: int, accumulation_steps: int = 1,
                    data_parallel: int = 1) -> int:
    """The global batch in tokens: each of ``data_parallel`` replicas runs
    ``accumulation_steps`` micro-batches of ``micro_batch`` sequences of ``seq_len`` tokens
    before one optimizer step."""
    return micro_batch * seq_len * accumulation_steps * data_parallel


def lr_at(step: int, max_lr: float, min_lr: float, warmup_steps: int, total_steps: int) -> float:
    """The learning rate at ``step`` (from 0) of a linear warmup from 0 to ``max_lr`` over
    ``warmup_steps``, then a cosine decay to ``min_lr`` at ``total_steps``, and ``min_lr``
    after: the schedule of GPT-3, Llama and CS336's assignment 1."""
    if step < warmup_steps:
        return max_lr * step / warmup_steps
    if step >= total_steps:
        return min_lr
    progress = (step - warmup_steps) / (total_steps - warmup_steps)
    return min_lr + 0.5 * (1 + math.cos(math.pi * progress)) * (max_lr - min_lr)


def clip_by_global_norm(parameters: Iterable[torch.nn.Parameter], max_norm: float) -> float:
    """Scale every gradient by ``max_norm / (norm + 1e-6)`` where the norm of all of them
    together exceeds ``max_norm``, in place, as ``torch.nn.utils.clip_grad_norm_`` does; return
    the norm before clipping. One norm over all parameters: the update keeps its direction."""
    grads = [p.grad for p in parameters if p.grad is not None]
    norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads]))
    factor = torch.clamp(max_norm / (norm + 1e-6), max=1.0)
    for g in grads:
        g.mul_(factor)
    return norm.item()
